"""Stage 4, slim: make the converted graph lean, as an ordered list of passes.

`PASSES` is the order, each pass a module of `keras_layers.export.passes`
with one `run(proto, context) -> PassResult`, each with the condition it
runs under: a decoder's stacked caches folded first (`stacks`); onnxslim
(the weights in a data file hidden from it) and the views of the weights
folded; ONNX shape inference; the fusions (`passes.fusions`), the input
axes named among them; a convolutional model's Transposes moved to its edges
and its BatchNorms folded into its Convs (`conv_layout`); the shapes the axes
prove equal shared; repeated weights stored once (`initializers`); and, last,
the canonical form (`canonical`): the same model gives the same bytes on every
run. `slim` builds the `Context` from the
model's inputs, runs the list, and builds its report from the passes'
results.
"""

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from keras_layers.export.axes import PAST_AXIS
from keras_layers.export.passes import (
    axis_names,
    canonical,
    common_subexpressions,
    conv_layout,
    dead_nodes,
    initializers,
    onnxslim_pass,
    shape_inference,
    share_shapes,
    stacks,
    weight_views,
    weights_dtype,
)
from keras_layers.export.passes.canonical import canonicalize, compact_names
from keras_layers.export.passes.context import Context, Step, run_passes
from keras_layers.export.passes.fusions import (
    gelu,
    group_query_attention,
    layer_norm,
    matmul,
    multi_head_attention,
    rms_norm,
    rotary,
)
from keras_layers.export.passes.initializers import deduplicate_initializers, shared_weights

# Re-exported: the pipeline, the report and the int8 stage read them here.
__all__ = [
    "PASSES",
    "SlimmedModel",
    "canonicalize",
    "compact_names",
    "deduplicate_initializers",
    "shared_weights",
    "slim",
    "without",
]


@dataclass
class SlimmedModel:
    """The output of `slim`: the lean proto and what changed."""

    proto: object
    nodes_before: int
    nodes_after: int
    deduplicated: list = field(default_factory=list)  # (removed, kept, "same"|"T")
    fused: dict = field(default_factory=dict)  # op type -> subgraphs folded into it
    seconds: float = 0.0
    # Bytes of every initializer the final graph reads, by its name before
    # `canonicalize` renamed it: weights keep their Keras paths until then.
    initializer_bytes: dict = field(default_factory=dict)
    # Picks of one slice of a stacked tensor replaced by that slice (`stacks`).
    stack_picks_folded: int = 0
    shapes_shared: int = 0
    # Weights stored in half precision behind a Cast (`weights_dtype`).
    half_weights: int = 0
    # Candidates a fusion left alone: {fused op type: {reason: how many}}.
    declined: dict = field(default_factory=dict)
    # The model's inputs no output reads, declared again (`declare_unread_inputs`).
    unread_inputs: list = field(default_factory=list)


def _with_onnxslim(context: Context) -> bool:
    return context.run_onnxslim


def _in_half(context: Context) -> bool:
    return context.weights_dtype != "float32"


def _with_copies(context: Context) -> bool:
    return context.copies_to_merge


PASSES = (
    # First: a decoder's stacked caches, picked apart again, are most of its
    # nodes and of its time per token.
    Step(stacks),
    # Before onnxslim: given tf2onnx's `unk__N` dims, its shape inference
    # took a free text length for the fixed image tokens' beside it and
    # folded 16 + 16 into PaliGemma's Reshapes (a file for 16 tokens only).
    Step(axis_names),
    # onnxslim and shape inference cannot take a proto past 2 GB.
    Step(onnxslim_pass, _with_onnxslim),
    # What onnxslim folds in the proto, for the weights in the data file too.
    Step(weight_views),
    Step(shape_inference, _with_onnxslim),
    Step(layer_norm, _with_onnxslim),
    Step(matmul),
    Step(multi_head_attention, _with_onnxslim),
    # The nodes the fusions above replaced would be candidates too.
    Step(dead_nodes, _with_onnxslim),
    # After attention, whose match needs shape inference: ONNX knows no
    # SimplifiedLayerNormalization, so inference stops at one.
    Step(rms_norm, _with_onnxslim),
    # After the Dense fusion, which puts each bias Add right after a MatMul.
    Step(gelu),
    # Again: the symbolic dims of the passes below read the input axes'
    # names, and the passes above may have renamed an output's.
    Step(axis_names),
    # Before the sharing, which merges the layers' copies of the angle tables.
    Step(rotary, _with_onnxslim),
    # A decoder's cached attention, which multi_head_attention leaves alone:
    # after the rotary rule, whose symbolic dims stop at a contrib op.
    Step(group_query_attention, _with_onnxslim),
    # After every fusion, each matching the graph tf2onnx wrote (a ViT's patch
    # embedding is a Conv, a speech model's stem too): it moves Transposes.
    Step(conv_layout, _with_onnxslim),
    # Last of the rewrites: the fusions match `Shape`s of the very tensors they reshape.
    Step(share_shapes),
    Step(common_subexpressions, _with_copies),  # the copies the sharing made identical
    Step(dead_nodes),
    Step(initializers),
    # After the sharing, which compares the weights in float32.
    Step(weights_dtype, _in_half),
    # Last: every pass above may add, drop or reorder nodes.
    Step(canonical),
)


def without(*passes) -> tuple:
    """`PASSES` less the steps running `passes` (a benchmark measures what one buys).

    Args:
        *passes: the pass modules to leave out.

    Returns:
        The other steps, in order.
    """
    return tuple(step for step in PASSES if step.pass_ not in passes)


def _context(proto, inputs, outputs, run_onnxslim, model_name, data_folder, stored_dtype):
    """What the passes know of the model besides its graph."""
    # Every run has a batch and each sequence at least 1 long, a cached
    # decoder's new tokens too (every call feeds one or more); its past (its
    # cache inputs name their own axes) may be empty.
    positive = {"batch"} | {
        info.sequence for info in inputs if info.axes is None and info.role != "positions"
    }
    positive |= {info.axes[1] for info in inputs if info.axes and info.role == "ids"}
    return Context.of(
        proto,
        run_onnxslim=run_onnxslim,
        positive=frozenset(positive),
        axis_names={info.name: info.axis_names() for info in [*inputs, *outputs]},
        # A decoder with a cache (its cache inputs name a past axis) mostly
        # runs one query at a time: see `multi_head_attention.run`.
        cached_decoder=any(info.axes and PAST_AXIS in info.axes for info in inputs),
        model_name=model_name,
        data_folder=data_folder,
        weights_dtype=stored_dtype,
    )


def _fused_ops() -> list:
    """Every op a fusion of `PASSES` makes: those of our rules (a `RULE`) in
    pass order, then those of the other passes that report one (ONNX
    Runtime's fusions in `gelu`, the Convs `conv_layout` folds into)."""
    fusions = [step.pass_ for step in PASSES if hasattr(step.pass_, "MAKES")]
    ours = [fusion for fusion in fusions if hasattr(fusion, "RULE")]
    theirs = [fusion for fusion in fusions if not hasattr(fusion, "RULE")]
    return [op for fusion in ours + theirs for op in fusion.MAKES]


def _report(results: list) -> dict:
    """`SlimmedModel`'s fields from the passes' results: each fused op's count
    (0 for those no pass made), the reasons by fused op, and what else the
    passes reported."""
    fused = dict.fromkeys(_fused_ops(), 0)
    declined: dict[str, list] = {}
    fields = {}
    for step, result in results:
        for op, count in result.fused.items():
            fused[op] = fused.get(op, 0) + count
        if result.declined:
            declined.setdefault(step.pass_.MAKES[0], []).extend(result.declined)
        fields.update(result.report)
    fields["declined"] = {
        fusion: dict(Counter(reason for _, reason in reasons).most_common())
        for fusion, reasons in declined.items()
    }
    return {**fields, "fused": fused}


def slim(
    proto,
    inputs: list,
    outputs: list,
    run_onnxslim: bool = True,
    model_name: str = "model",
    data_folder: Path | None = None,
    stored_dtype: str = "float32",
) -> SlimmedModel:
    """Slim the graph: run `PASSES` over it.

    Args:
        proto: the converted ModelProto (changed in place, or replaced).
        inputs: the model's inputs (`loading.TensorInfo`: names, axis names,
            roles).
        outputs: its outputs, likewise.
        run_onnxslim: False for protos past 2 GB, which onnxslim and ONNX
            shape inference cannot serialise (the pipeline's never are: its
            weights are in a data file); the other passes still run.
        model_name: the name the graph gets.
        data_folder: the folder of the data files the weights are in, if any
            (`graph.weights`).
        stored_dtype: the dtype the matrix weights are stored in:
            `"float32"`, `"float16"` or `"bfloat16"` (`passes.weights_dtype`).

    Returns:
        The slimmed proto and what the passes did.
    """
    start = time.perf_counter()
    before = len(proto.graph.node)
    context = _context(proto, inputs, outputs, run_onnxslim, model_name, data_folder, stored_dtype)
    proto, results = run_passes(PASSES, proto, context)
    unread = declare_unread_inputs(proto, inputs)
    return SlimmedModel(
        proto=proto,
        unread_inputs=unread,
        nodes_before=before,
        nodes_after=len(proto.graph.node),
        seconds=time.perf_counter() - start,
        **_report(results),
    )


def declare_unread_inputs(proto, inputs: list) -> list:
    """Give back the graph inputs that no output reads, in the model's order.

    A model may take an input that none of its outputs reads (keras-hub's
    Stable Diffusion 3 text-to-image takes `images` and `latents` whatever
    the task); tf2onnx and onnxslim drop it, and a caller that feeds the
    model's own inputs is refused ("Invalid input name"). It is declared
    again, read by no node.

    Args:
        proto: the ModelProto, changed in place.
        inputs: the model's inputs (`loading.TensorInfo`), in its order.

    Returns:
        The names declared again.
    """
    from onnx import helper

    graph = proto.graph
    present = {value.name: value for value in graph.input}
    missing = [info for info in inputs if info.name not in present]
    for info in missing:
        element = helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype))
        present[info.name] = helper.make_tensor_value_info(info.name, element, info.axis_names())
    if missing:
        ordered = [present.pop(info.name) for info in inputs if info.name in present]
        ordered += list(present.values())  # (none: the graph's inputs are the model's)
        del graph.input[:]
        graph.input.extend(ordered)
    return [info.name for info in missing]
