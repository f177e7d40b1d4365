"""GELU, by a rule of ours and by ONNX Runtime's own fusions run inside our checks.

ONNX Runtime's transformer fusions match the tanh GELU Keras writes, so
`fuse_gelus` runs them, each wrapped by `_guarded` with our checks and
reasons, after a rule of ours for the erfc form TensorFlow writes for the
exact GELU (`ERFC_GELU`). On request the same pass fuses
`SkipLayerNormalization`, ONNX Runtime's fusion too.
"""

import contextlib
import importlib
import io

import numpy as np
from onnx import helper

from keras_layers.export.graph import remove_dead_nodes
from keras_layers.export.passes.context import Context, PassResult
from keras_layers.export.passes.fusions.pattern import (
    Rule,
    apply,
    attribute,
    sort_topologically,
    use_contrib_domain,
)

# What `fuse_gelus` adds by default, each counted in the report's `fused`.
GELU_FUSED = ("Gelu", "BiasGelu", "FastGelu", "QuickGelu")
MAKES = GELU_FUSED


def _skip_norm_declines(model, node):
    """Why a `LayerNormalization` may not become a `SkipLayerNormalization`, or None.

    The contrib op normalises the last axis of a 3-D input with a scale and a
    bias and has one output we use; ONNX Runtime's fusion reads `input[2]`
    without checking it is there and copies neither `axis` nor extra outputs.
    Its own checks (3-D inputs of one shape or a broadcast skip, no constant
    addend, no embedding lookup) come after these.
    """
    if node.op_type != "LayerNormalization":
        return None  # the bias step starts from a SkipLayerNormalization
    if attribute(node, "axis", -1) not in (-1, 2):
        return "normalises an axis other than the last"
    if len(node.input) < 3 or not node.input[2]:
        return "has no bias input"
    if len([name for name in node.output if name]) != 1:
        return "has more than one output"
    return None


def _bias_declines(model, node):
    """Why a fused node's bias input is not the 1-D bias the kernels add, or None.

    BiasGelu, FastGelu and SkipLayerNormalization add their bias along the last
    axis and need it as long as that axis; ONNX Runtime's fusions check only
    that it is 1-D, and an `Add` would also broadcast a single value.
    """
    position = {"BiasGelu": 1, "FastGelu": 1, "SkipLayerNormalization": 4}.get(node.op_type)
    if position is None or len(node.input) <= position or not node.input[position]:
        return None
    bias = model.get_initializer(node.input[position])
    if node.op_type == "SkipLayerNormalization":
        width = model.get_initializer(node.input[2])
        width = None if width is None else int(np.prod(width.dims))
    else:
        producer = model.output_name_to_node().get(node.input[0])
        weight = None if producer is None else model.get_initializer(producer.input[1])
        width = None if weight is None or len(weight.dims) != 2 else weight.dims[1]
    if bias is None or width is None or list(bias.dims) != [width]:
        return "its bias is not a 1-D constant as long as the last axis"
    return None


def _tanh_of_a_gelu(node, input_name_to_nodes) -> bool:
    """Whether an `Add` reads the tanh `node`: every tanh GELU ONNX Runtime's
    FusionFastGelu matches computes `1 + tanh(...)`. An LSTM's tanh goes to a
    `Mul` and is no candidate; saying it found no GELU there is noise."""
    readers = input_name_to_nodes.get(node.output[0], ())
    return any(reader.op_type == "Add" for reader in readers)


def _guarded(fusion_class, before=None, after=None, candidate=None):
    """`fusion_class` with our own checks around each match, and reasons kept.

    `candidate(node, input_name_to_nodes)` false leaves a node alone without
    a reason; `before(model, node)` may decline a node before ONNX Runtime's
    matcher sees it; `after(model, new_node)` may take back what the matcher
    made. A match is also taken back when a value it removes is a graph
    output (ONNX Runtime's safety check looks only at the nodes that read it).
    """

    class Guarded(fusion_class):
        def fuse(self, node, input_name_to_nodes, output_name_to_node):
            if candidate is not None and not candidate(node, input_name_to_nodes):
                return
            reason = before(self.model, node) if before else None
            if reason is None:
                removed, added = len(self.nodes_to_remove), len(self.nodes_to_add)
                try:
                    super().fuse(node, input_name_to_nodes, output_name_to_node)
                except Exception as error:  # noqa: BLE001 - its bug must not end the export
                    # FusionQuickGelu reads `x * sigmoid(1.702 x)`'s constant
                    # without checking it is one (None.item() on CLIP's graph).
                    del self.nodes_to_remove[removed:], self.nodes_to_add[added:]
                    if self.declined is not None:
                        self.declined.append(
                            (
                                node.output[0],
                                f"{node.op_type}: {fusion_class.__name__} "
                                f"failed ({type(error).__name__}: {error})",
                            )
                        )
                    return
                made = self.nodes_to_add[added:]
                kept = {name for new in made for name in new.output}
                gone = {name for old in self.nodes_to_remove[removed:] for name in old.output}
                if not made:
                    reason = f"onnxruntime's {fusion_class.__name__} found no match"
                elif (gone - kept) & self.graph_outputs:
                    reason = "a value it would remove is a graph output"
                elif after is not None:
                    reason = next(filter(None, (after(self.model, n) for n in made)), None)
                if reason is not None:
                    del self.nodes_to_remove[removed:], self.nodes_to_add[added:]
            if reason is not None and self.declined is not None:
                self.declined.append((node.output[0], f"{node.op_type}: {reason}"))

    Guarded.__name__ = fusion_class.__name__
    return Guarded


def _match_erfc_gelu(g, erf):
    """Match the exact GELU TensorFlow writes around `erf`: (x, output node) or a reason.

    `keras.activations.gelu(approximate=False)` calls `tf.nn.gelu`, which
    computes `0.5 * x * erfc(-x / sqrt(2))`; tf2onnx writes erfc as 1 - erf:
    `Mul(Mul(0.5, x), Sub(1, Erf(Mul(Neg(x), 0.7071))))`. That equals
    `0.5 * x * (1 + erf(x / sqrt(2)))`, what `com.microsoft.Gelu` computes, as
    erf is odd. ONNX Runtime's `FusionGelu` matches only the `1 + erf` forms
    (PyTorch's), and its session does not fuse this one either (measured,
    keras-hub RoBERTa, onnxruntime 1.32), so this rule is ours.
    """
    scaled = g.node(erf.input[0], "Mul")
    if scaled is None or not g.only_used_by(erf.input[0]):
        return "the erf's input is not a product read only by it"
    root = g.constant_input(scaled, -(0.5**0.5), 1e-6)
    if root is None:
        negated = g.constant_input(scaled, 0.5**0.5, 1e-6)
        neg = None if negated is None else g.node(negated, "Neg")
        if neg is None or not g.only_used_by(negated):
            return "the erf's input is not -x / sqrt(2)"
        root = neg.input[0]
    if not g.only_used_by(erf.output[0]):
        return "the erf is read by more than one node"
    (sub,) = g.consumers[erf.output[0]]
    if sub.op_type != "Sub" or sub.input[1] != erf.output[0] or not g.is_scalar(sub.input[0], 1):
        return "the erf is not subtracted from 1"
    if not g.only_used_by(sub.output[0]):
        return "1 - erf is read by more than one node"
    (product,) = g.consumers[sub.output[0]]
    half = product.op_type == "Mul" and g.node(g.other_input(product, sub.output[0]), "Mul")
    if not half or g.constant_input(half, 0.5) != root or not g.only_used_by(half.output[0]):
        return "the result is not 0.5 * x * (1 - erf)"
    return root, product


def _rewrite_erfc_gelu(edit, match):
    x, product = match
    # The other nodes of the pattern are left unread: dead-node removal drops them.
    edit.replace(product, [helper.make_node("Gelu", [x], [], domain="com.microsoft")])


ERFC_GELU = Rule(
    makes="Gelu",
    anchor="Erf",
    form="0.5 * x * (1 - erf(-x / sqrt(2)))",
    match=_match_erfc_gelu,
    rewrite=_rewrite_erfc_gelu,
    reason_prefix="Erf: ",
)


def fuse_erfc_gelus(proto, declined: list | None = None) -> int:
    """Replace TensorFlow's exact GELU (see `_match_erfc_gelu`) by `com.microsoft.Gelu`.

    Args:
        proto: the ModelProto, rewritten in place.
        declined: when given, gets (erf's output, reason) for each erf left alone.

    Returns:
        How many were replaced.
    """
    return apply(ERFC_GELU, proto, [] if declined is None else declined)


# The modules of `onnxruntime.transformers` the fusions come from.
_ORT_MODULES = (
    "fusion_biasgelu",
    "fusion_fastgelu",
    "fusion_gelu",
    "fusion_quickgelu",
    "fusion_skiplayernorm",
    "onnx_model",
)


def _onnxruntime_fusions():
    """{name: module} of `_ORT_MODULES`, or the ImportError that stops them.
    (onnxruntime.transformers appends its folder to sys.path: its modules
    import each other by bare name.)"""
    try:
        return {
            name: importlib.import_module(f"onnxruntime.transformers.{name}")
            for name in _ORT_MODULES
        }
    except ImportError as error:
        return error


def _steps(modules: dict, skip_norms: bool) -> list:
    """(fusion class, its arguments, an op the graph must hold for it to find
    anything), in the order ONNX Runtime's BERT optimizer runs them."""
    biasgelu, skip = modules["fusion_biasgelu"], modules["fusion_skiplayernorm"]
    steps = [
        (_guarded(modules["fusion_gelu"].FusionGelu), (), "Erf"),
        (
            _guarded(modules["fusion_fastgelu"].FusionFastGelu, candidate=_tanh_of_a_gelu),
            (),
            "Tanh",
        ),
        (_guarded(modules["fusion_quickgelu"].FusionQuickGelu), (), "Sigmoid"),
    ]
    if skip_norms:
        skip_norm = _guarded(skip.FusionSkipLayerNormalization, _skip_norm_declines)
        steps.append((skip_norm, (), "LayerNormalization"))
    steps += [
        (_guarded(biasgelu.FusionBiasGelu, after=_bias_declines), (True,), "FastGelu"),
        (_guarded(biasgelu.FusionBiasGelu, after=_bias_declines), (False,), "Gelu"),
    ]
    if skip_norms:
        bias_skip = _guarded(skip.FusionBiasSkipLayerNormalization, after=_bias_declines)
        steps.append((bias_skip, (), "SkipLayerNormalization"))
    return steps


def _run_steps(proto, model, steps: list, declined: list) -> None:
    """Run each fusion of `steps` over ONNX Runtime's `model` of `proto`."""
    outputs = {value.name for value in proto.graph.output}
    for fusion_class, arguments, needed in steps:
        # ONNX Runtime's constant lookups list every node each time, so a pass
        # costs time quadratic in the graph's size: none is run that cannot
        # match.
        if not model.get_nodes_by_op_type(needed):  # subgraphs' nodes too
            continue
        # Its shape inference prints, rather than logs, when it fails.
        with contextlib.redirect_stdout(io.StringIO()):
            fusion = fusion_class(model, *arguments)
        fusion.graph_outputs = outputs
        # A QuickGelu reason for every Mul would drown the others.
        fusion.declined = None if "QuickGelu" in fusion_class.__name__ else declined
        fusion.apply()


def fuse_gelus(proto, declined: list | None = None, skip_norms: bool = False) -> dict:
    """GELU (and, on request, skip-LayerNorm) fusions, mostly by ONNX Runtime's own classes.

    `onnxruntime.transformers` (shipped with onnxruntime, no torch needed) has
    these patterns, and they match our graphs: on keras-hub's BERT its
    optimizer (`optimize_model(..., opt_level=0)`) found, after our other
    fusions, the tanh GELU Keras' `gelu_approximate` writes (FastGelu, the
    `Dense` bias before it folded in) and `Add` + `LayerNormalization`
    (SkipLayerNormalization). So they run here, in the order its BERT
    optimizer runs them, each wrapped by `_guarded` with our checks. The exact
    GELU TensorFlow writes it does not match; `fuse_erfc_gelus` does, first,
    so that its bias fusion sees that `Gelu` too. At load time ONNX Runtime's
    CPU session fuses the tanh GELU itself, not the erfc one, and BiasGelu
    beats the nodes it replaces (docs/performance.md).

    `skip_norms` is off by default because ONNX Runtime's CPU
    SkipLayerNormalization kernel is slower than the `Add` and
    `LayerNormalization` it replaces, alone and end to end
    (benchmarks/results/real_models.json, `skip_norms`). Its CUDA kernel is
    another matter.

    Dead nodes are dropped first: the LayerNorm fusion leaves the old
    decomposition reading the residual sum, and ONNX Runtime's skip fusion
    would keep that sum as an extra output. The skip fusion needs symbolic
    shape inference (both addends 3-D of one shape); where that fails, it
    declines.

    Args:
        proto: the ModelProto, rewritten in place.
        declined: when given, gets (node output, reason) for each candidate
            left alone.
        skip_norms: fuse `SkipLayerNormalization` too.

    Returns:
        {op type: nodes of it added}, keys `GELU_FUSED` (and
        "SkipLayerNormalization" with `skip_norms`).
    """
    kinds = (*GELU_FUSED, "SkipLayerNormalization") if skip_norms else GELU_FUSED
    counts = dict.fromkeys(kinds, 0)
    declined = [] if declined is None else declined
    modules = _onnxruntime_fusions()
    if isinstance(modules, ImportError):
        declined.append(("", f"onnxruntime.transformers cannot be imported: {modules}"))
        return counts
    remove_dead_nodes(proto)
    before = {op: sum(n.op_type == op for n in proto.graph.node) for op in kinds}
    fuse_erfc_gelus(proto, declined)
    remove_dead_nodes(proto)
    model = modules["onnx_model"].OnnxModel(proto)
    _run_steps(proto, model, _steps(modules, skip_norms), declined)
    sort_topologically(proto.graph)
    for op in kinds:
        counts[op] = sum(n.op_type == op for n in proto.graph.node) - before[op]
    if any(counts.values()):
        use_contrib_domain(proto)
    return counts


def run(proto, context: Context) -> PassResult:
    """`fuse_gelus` as a pass (`context.skip_layer_norms` for `skip_norms`).

    Args:
        proto: the ModelProto, rewritten in place.
        context: its `skip_layer_norms`.

    Returns:
        The nodes of each op added, and (node output, reason) for each
        candidate left alone.
    """
    declined = []
    counts = fuse_gelus(proto, declined, skip_norms=context.skip_layer_norms)
    return PassResult(proto, counts, tuple(declined), sum(counts.values()))
