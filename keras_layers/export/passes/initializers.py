"""Repeated weights stored once.

The trace stage already keeps a tied embedding from being folded into a
second, transposed constant (see `keras_layers/export/tracing.py`); this pass
catches what other graphs repeat (equal LayerNorm scales, a transposed copy a
model computes itself). No maintained tool deduplicates a transposed copy
(onnxslim and onnxoptimizer compare tensors only as they are), so this pass
does it: an exact duplicate is replaced by the original, a transposed one by a
`Transpose` node of the original, which ONNX Runtime folds once when the
session loads.
"""

import hashlib

import numpy as np
import onnx

from keras_layers.export.graph import rename_reads, weights
from keras_layers.export.passes.context import Context, PassResult

# Tensors smaller than this are not worth hashing.
_MIN_DEDUPE_ELEMENTS = 64


def _digest(array: np.ndarray) -> bytes:
    return hashlib.sha256(weights.raw_bytes(array)).digest()


def _transpose_of(init, original: str) -> object:
    """A `Transpose` node making `init` from the tensor `original`."""
    return onnx.helper.make_node(
        "Transpose", [original], [init.name], perm=[1, 0], name=f"{init.name}/tied_transpose"
    )


def _candidates(graph) -> list:
    """(position, tensor) of the initializers another one may repeat: at least
    `_MIN_DEDUPE_ELEMENTS`, and of a type and shape (or, in 2-D, the
    transposed shape) some other one has, so that a weight of a shape of its
    own is never read."""
    shapes: dict[tuple, int] = {}
    sized = []
    for position, init in enumerate(graph.initializer):
        if (int(np.prod(init.dims)) if init.dims else 1) >= _MIN_DEDUPE_ELEMENTS:
            key = (
                init.data_type,
                tuple(sorted(init.dims)) if len(init.dims) == 2 else tuple(init.dims),
            )
            shapes[key] = shapes.get(key, 0) + 1
            sized.append((position, init, key))
    return [(position, init) for position, init, key in sized if shapes[key] > 1]


def deduplicate_initializers(proto, folder=None) -> list:
    """Store every repeated or transposed weight once.

    Args:
        proto: the ModelProto, changed in place.
        folder: the folder of its data files, if any: a weight there is read
            from it, one at a time, and only if another has its shape.

    Returns:
        (removed, kept, "same" or "T") for each weight removed.

    Raises:
        ValueError: a graph output is a duplicated weight.
    """
    graph = proto.graph
    seen = {}  # (dtype, shape, digest) -> name of the first tensor with that content
    shapes = set()  # (dtype, shape) of the tensors in `seen`
    changes, renames, transposes = [], {}, []
    removed = []  # positions in graph.initializer
    for position, init in _candidates(graph):
        dims = tuple(init.dims)
        key = (init.data_type, dims, weights.digest(init, folder))  # read, not mapped
        if key in seen:
            renames[init.name] = seen[key]
            changes.append((init.name, seen[key], "same"))
            removed.append(position)
            continue
        # Hash the transpose (a full copy) only if a tensor of that shape exists.
        if len(dims) == 2 and (init.data_type, dims[::-1]) in shapes:
            transposed = np.asarray(weights.values(init, folder)).T
            transposed_key = (init.data_type, dims[::-1], _digest(transposed))
            if transposed_key in seen:
                transposes.append(_transpose_of(init, seen[transposed_key]))
                changes.append((init.name, seen[transposed_key], "T"))
                removed.append(position)
                continue
        seen[key] = init.name
        shapes.add(key[:2])
    if not changes:
        return changes
    for position in reversed(removed):  # in place: no copy of the kept weights
        del graph.initializer[position]
    rename_reads(graph, renames)
    for output in graph.output:
        if output.name in renames:
            raise ValueError(f"graph output {output.name} is a duplicated weight")
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(transposes + nodes)
    return changes


def shared_weights(proto, min_elements: int = _MIN_DEDUPE_ELEMENTS) -> list:
    """Weights read by more than one node.

    A tied embedding shows up here once, read by the lookup (`Gather`) and by
    the output projection (`Transpose`, or `MatMul` after quantization).

    Args:
        proto: the ModelProto.
        min_elements: smaller weights are left out.

    Returns:
        `(name, shape, [reader op types])` for each.
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


def run(proto, context: Context) -> PassResult:
    """`deduplicate_initializers` as a pass.

    Args:
        proto: the ModelProto, changed in place.
        context: its `data_folder` is where the weights' data files are.

    Returns:
        The weights removed (the report's `deduplicated`).

    Raises:
        ValueError: a graph output is a duplicated weight.
    """
    changes = deduplicate_initializers(proto, context.data_folder)
    return PassResult(proto, changed=len(changes), report={"deduplicated": changes})
