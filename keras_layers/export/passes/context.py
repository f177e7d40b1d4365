"""What every pass reads (`Context`) and returns (`PassResult`), and the
runner of an ordered list of passes (`Step`, `run_passes`).

A pass is a module with one function, `run(proto, context) -> PassResult`:
it rewrites the ModelProto in place (or returns a new one, as onnxslim
does) and says what it did. It reads nothing but the proto and the context.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from keras_layers.export.graph import opset


@dataclass(frozen=True)
class Context:
    """What a pass may know besides the graph. The slim stage makes one per
    export; what a pass learns for the passes after it (`PassResult.learned`)
    goes into a copy."""

    # The model's default-domain opset (fusions whose ops need a newer one decline).
    opset: int = 0
    # onnxslim and ONNX shape inference may run: False for protos past 2 GB,
    # which they cannot serialise.
    run_onnxslim: bool = True
    # `graph.tensor_shapes` of the graph, once inferred (None before).
    shapes: Mapping | None = None
    # Input axis names that are at least 1 in every run (`graph.symbolic_dims`).
    positive: frozenset = frozenset()
    # The axis names of each graph input and output ({name: names, a str per
    # dynamic axis}), given to the graph by `axis_names`.
    axis_names: Mapping = field(default_factory=dict)
    # A decoder exported with its cache (its cache inputs name a past axis).
    cached_decoder: bool = False
    # A pass made nodes that compute the same as others (`share_shapes`):
    # they are to be merged (`common_subexpressions`).
    copies_to_merge: bool = False
    # Fuse ONNX Runtime's SkipLayerNormalization too (`fusions.gelu`).
    skip_layer_norms: bool = False
    # The name the canonical graph gets.
    model_name: str = "model"
    # The folder of the data files the weights are in (`graph.weights`), if any.
    data_folder: Path | None = None
    # The dtype the matrix weights are stored in (`weights_dtype`).
    weights_dtype: str = "float32"

    @classmethod
    def of(cls, proto, **fields) -> "Context":
        """A context for `proto`, its opset read from it.

        Args:
            proto: the ModelProto the passes will run on.
            **fields: the other fields, as the dataclass names them.

        Returns:
            The context.
        """
        return cls(opset=opset(proto), **fields)


@dataclass(frozen=True)
class PassResult:
    """What one pass did."""

    # The model after the pass: the one it was given unless it made a new one.
    proto: object
    # Nodes of each fused op type the pass added (fusions only).
    fused: Mapping[str, int] = field(default_factory=dict)
    # (candidate's output, why it was left alone), for each candidate declined.
    declined: tuple = ()
    # How many rewrites it made (nodes folded, merged, replaced).
    changed: int = 0
    # Entries of the slim report this pass fills (`slimming.SlimmedModel`'s fields).
    report: Mapping = field(default_factory=dict)
    # Context fields for the passes after it (`shapes`, once inferred).
    learned: Mapping = field(default_factory=dict)


def always(context: Context) -> bool:
    """Run the pass whatever the context."""
    del context
    return True


@dataclass(frozen=True)
class Step:
    """One pass of an ordered list, and when it runs."""

    # A module (or object) with `run(proto, context) -> PassResult`.
    pass_: object
    # Runs where this holds for the context at that point.
    when: Callable[[Context], bool] = always


def run_passes(steps, proto, context: Context) -> tuple[object, list]:
    """Run `steps` in order, each where its condition holds.

    Args:
        steps: the `Step`s, in order.
        proto: the ModelProto.
        context: what the first pass knows; each pass's `learned` is added
            for the passes after it.

    Returns:
        (the final proto, [(step, its PassResult)] for each step that ran).
    """
    results = []
    for step in steps:
        if not step.when(context):
            continue
        result = step.pass_.run(proto, context)
        proto = result.proto
        if result.learned:
            context = replace(context, **result.learned)
        results.append((step, result))
    return proto, results
