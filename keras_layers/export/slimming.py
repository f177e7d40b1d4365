"""Stage 4, slim: make the converted graph lean.

1. onnxslim folds constants and drops dead nodes and initializers (tf2onnx keeps
   copies of weights that only feed `Shape`).
2. Repeated weights are stored once. The trace stage already keeps a tied
   embedding from being folded into a second, transposed constant (see
   `keras_layers/export/tracing.py`); this pass catches what other graphs repeat (equal
   LayerNorm scales, a transposed copy a model computes itself). No maintained
   tool deduplicates a transposed copy (onnxslim and onnxoptimizer compare
   tensors only as they are), so this stage does it: an exact duplicate is
   replaced by the original, a transposed one by a `Transpose` node of the
   original, which ONNX Runtime folds once when the session loads.
3. Dynamic axes get names (`batch`, `sequence`) instead of tf2onnx's `unk__N`.
"""

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np

from keras_layers.export import fusions
from keras_layers.export.loading import TensorInfo

# Tensors smaller than this are not worth hashing.
_MIN_DEDUPE_ELEMENTS = 64


@dataclass
class SlimmedModel:
    """The output of `slim`: the lean proto and what changed."""

    proto: object
    nodes_before: int
    nodes_after: int
    deduplicated: list = field(default_factory=list)  # (removed, kept, "same"|"T")
    fused: dict = field(default_factory=dict)  # op type -> subgraphs folded into it
    seconds: float = 0.0


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(memoryview(np.ascontiguousarray(array))).hexdigest()


def deduplicate_initializers(proto) -> list:
    """Store every repeated or transposed weight once; returns what changed."""
    import onnx
    from onnx import numpy_helper

    graph = proto.graph
    seen = {}  # (dtype, shape, digest) -> name of the first tensor with that content
    shapes = set()  # (dtype, shape) of the tensors in `seen`
    changes = []
    renames = {}
    transposes = []
    removed = []  # positions in graph.initializer
    for position, init in enumerate(graph.initializer):
        size = int(np.prod(init.dims)) if init.dims else 1
        if size < _MIN_DEDUPE_ELEMENTS:
            continue
        array = numpy_helper.to_array(init)
        key = (array.dtype.str, array.shape, _digest(array))
        if key in seen:
            renames[init.name] = seen[key]
            changes.append((init.name, seen[key], "same"))
            removed.append(position)
            continue
        # Hash the transpose (a full copy) only if a tensor of that shape exists.
        if array.ndim == 2 and (array.dtype.str, array.shape[::-1]) in shapes:
            transposed_key = (array.dtype.str, array.shape[::-1], _digest(array.T))
            if transposed_key in seen:
                original = seen[transposed_key]
                transposes.append(
                    onnx.helper.make_node(
                        "Transpose",
                        [original],
                        [init.name],
                        perm=[1, 0],
                        name=f"{init.name}/tied_transpose",
                    )
                )
                changes.append((init.name, original, "T"))
                removed.append(position)
                continue
        seen[key] = init.name
        shapes.add(key[:2])
    if not changes:
        return changes
    for position in reversed(removed):  # in place: no copy of the kept weights
        del graph.initializer[position]
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name in renames:
                node.input[index] = renames[name]
    for output in graph.output:
        if output.name in renames:
            raise ValueError(f"graph output {output.name} is a duplicated weight")
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(transposes + nodes)
    return changes


def shared_weights(proto, min_elements: int = _MIN_DEDUPE_ELEMENTS) -> list:
    """Weights read by more than one node: `(name, shape, [reader op types])`.

    A tied embedding shows up here once, read by the lookup (`Gather`) and by
    the output projection (`Transpose`, or `MatMul` after quantization).
    """
    readers = {}
    for node in proto.graph.node:
        for name in set(node.input):
            readers.setdefault(name, []).append(node.op_type)
    shared = []
    for init in proto.graph.initializer:
        size = int(np.prod(init.dims)) if init.dims else 1
        if size >= min_elements and len(readers.get(init.name, [])) > 1:
            shared.append((init.name, list(init.dims), sorted(readers[init.name])))
    return shared


def compact_names(proto, name: str = "model") -> None:
    """Short, deterministic names for everything but the graph inputs and outputs.

    tf2onnx names nodes, tensors and constants after their full TensorFlow scope
    and its own counters and Python object ids
    (`einsum139870154093264_ba_left_set__935`), and shape inference stores a
    `value_info` per tensor. On a small model they weigh as much as half the
    weights, ONNX Runtime needs none of them, and the ids make two exports of the
    same model differ. So nodes become `n{i}`, intermediate tensors `t{i}` and
    initializers `w{i}`, numbered in graph order: the same model gives the same
    bytes.
    """
    graph = proto.graph
    graph.name = name
    graph.doc_string = ""
    proto.doc_string = ""
    keep = {v.name for v in [*graph.input, *graph.output]}
    initializers = {init.name for init in graph.initializer}
    renames = {}
    for index, node in enumerate(graph.node):
        node.name = f"n{index}"
        for value in node.input:
            if value in initializers and value not in renames:
                renames[value] = f"w{len(renames)}"
        for value in node.output:
            if value and value not in keep:
                renames[value] = renames.get(value) or f"t{len(renames)}"
    for node in graph.node:
        for values in (node.input, node.output):
            for position, value in enumerate(values):
                if value in renames:
                    values[position] = renames[value]
    for init in graph.initializer:
        init.name = renames.get(init.name, init.name)
    graph.initializer.sort(key=lambda init: (len(init.name), init.name))  # in place
    del graph.value_info[:]


def name_dynamic_axes(proto, inputs: list, outputs: list) -> None:
    """Give graph inputs and outputs the axis names of their Keras tensors."""
    by_name = {info.name: info for info in [*inputs, *outputs]}
    for value in [*proto.graph.input, *proto.graph.output]:
        info: TensorInfo | None = by_name.get(value.name)
        if info is None:
            continue
        dims = value.type.tensor_type.shape.dim
        for dim, axis_name in zip(dims, info.axis_names(), strict=False):
            if isinstance(axis_name, str):
                dim.ClearField("dim_value")
                dim.dim_param = axis_name


def remove_dead_nodes(proto) -> None:
    """Drop nodes whose outputs nothing reads, then unread initializers."""
    graph = proto.graph
    needed = {value.name for value in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    # In place: re-adding a kept initializer copies it through serialisation,
    # which fails for one over 2 GiB.
    for position in reversed(range(len(graph.initializer))):
        if graph.initializer[position].name not in needed:
            del graph.initializer[position]


def slim(
    proto, inputs: list, outputs: list, run_onnxslim: bool = True, model_name: str = "model"
) -> SlimmedModel:
    """Slim the graph. `run_onnxslim=False` for protos past 2 GB, which onnxslim
    and ONNX shape inference cannot serialise; the other passes still run."""
    start = time.perf_counter()
    before = len(proto.graph.node)
    fused = {"LayerNormalization": 0, "MatMul": 0, "MultiHeadAttention": 0}
    if run_onnxslim:
        import onnxslim

        proto = onnxslim.slim(proto)
        # Shape inference, like onnxslim, cannot take a proto past 2 GB. One
        # pass serves both fusions: each rewrite keeps its output's name and
        # shape, so the shapes stay true for every tensor the other reads.
        shapes = fusions.tensor_shapes(proto)
        fused["LayerNormalization"] = fusions.fuse_layer_norms(proto, fusions.tensor_ranks(shapes))
    fused["MatMul"] = fusions.fuse_tensordot_matmuls(proto)
    if run_onnxslim:
        fused["MultiHeadAttention"] = fusions.fuse_attention(proto, shapes)
    remove_dead_nodes(proto)
    changes = deduplicate_initializers(proto)
    compact_names(proto, name=model_name)
    name_dynamic_axes(proto, inputs, outputs)
    return SlimmedModel(
        proto=proto,
        nodes_before=before,
        nodes_after=len(proto.graph.node),
        deduplicated=changes,
        fused=fused,
        seconds=time.perf_counter() - start,
    )
