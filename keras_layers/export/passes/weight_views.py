"""Views of a weight folded into the weight.

`Reshape`, `Unsqueeze`, `Squeeze`, `Flatten`, `Identity`, `Transpose` and
`Cast` of an initializer read by that node alone (constant shapes, axes and
perms) become the initializer itself. Keras' EinsumDense kernels reach the
graph as `Unsqueeze -> Transpose -> Reshape` of the weight; a bfloat16
weight as its `Cast`.

A weight in the data file is read and written there (`graph.weights`): a
reshape changes only its dims, a transpose rewrites its bytes in place, a
cast appends the new bytes (the old ones are left behind when the file is
written out), one weight at a time. onnxslim folds these too when the weight
is in the proto, but by copying it; it never reads the data file
(`onnxslim_pass`). Without this, ONNX Runtime folds them when the session
starts, copying each weight (a session's memory, with and without:
benchmarks/results/big_model.json).

A matrix weight kept in its stored half precision (a model loaded with
`loading.load(stored=True)`, exported with its weights in that dtype) reaches
the graph as `Cast` to float32, then the views, then the matrix product or
lookup: that `Cast` is kept, and the views after it are folded into the
half-precision weight, the `Cast` moved to their end (`kept_cast`): the
weight is never widened in the data file, and its readers see
`Cast(weight)`, the layout of `weights_dtype`.
"""

import numpy as np
from onnx import TensorProto, helper

from keras_layers.export.graph import attribute, body_reads, perm, rename_reads, weights
from keras_layers.export.passes.context import Context, PassResult

# Views that change a weight's dims only (its bytes stay where they are).
_RESHAPES = ("Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity")
_VIEWS = (*_RESHAPES, "Transpose", "Cast")
# Readers of a matrix weight (`weights_dtype`'s), and the input it must be.
_MATRIX_READERS = {"MatMul": 1, "Gemm": 1, "Gather": 0}


def _constant(initializers: dict, node, position: int):
    """The values of the node's input at `position` if it is a constant held
    in the proto; None where absent or not."""
    if len(node.input) <= position or not node.input[position]:
        return None
    tensor = initializers.get(node.input[position])
    if tensor is None or weights.is_external(tensor):
        return None
    return weights.values(tensor, None)


def _reshaped(dims: list, node, initializers: dict) -> list | None:
    """The dims a weight of `dims` gets through `node` (one of `_RESHAPES`),
    or None where its other inputs are not constants."""
    stand_in = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), dims, [0] * len(dims))
    if node.op_type == "Identity":
        return dims
    if node.op_type == "Flatten":
        axis = attribute(node, "axis", 1) % (len(dims) + 1) if dims else 0
        return [int(np.prod(dims[:axis])), int(np.prod(dims[axis:]))]
    if node.op_type == "Reshape":
        shape = _constant(initializers, node, 1)
        if shape is None or attribute(node, "allowzero", 0):
            return None
        shape = [dims[i] if size == 0 else size for i, size in enumerate(shape.tolist())]
        return list(stand_in.reshape(shape).shape)
    axes = _constant(initializers, node, 1)
    axes = attribute(node, "axes", None) if axes is None else axes.tolist()
    if node.op_type == "Unsqueeze":
        return None if axes is None else list(np.expand_dims(stand_in, tuple(axes)).shape)
    return list(np.squeeze(stand_in, None if axes is None else tuple(axes)).shape)


def _folded(node, weight, initializers: dict, folder) -> tuple | None:
    """(dims, new values or None where only the dims change) of `weight`
    through `node`, or None where it cannot be folded."""
    if node.op_type == "Transpose":
        return [], np.transpose(weights.values(weight, folder), perm(node))
    if node.op_type == "Cast":
        dtype = helper.tensor_dtype_to_np_dtype(attribute(node, "to", 0))
        return [], weights.values(weight, folder).astype(dtype)
    try:
        dims = _reshaped(list(weight.dims), node, initializers)
    except ValueError:  # dims the op would refuse: ONNX Runtime says so
        return None
    return None if dims is None else (dims, None)


def _readers(graph) -> dict:
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in {*node.input, *body_reads(node)}:
            readers[name] = readers.get(name, 0) + 1
    return readers


class _Index:
    """One pass's view of the graph: initializers, producers, and readers
    (how many nodes read each name, subgraphs included, and the main graph's
    (node, input position) of each)."""

    def __init__(self, graph):
        self.initializers = {init.name: init for init in graph.initializer}
        self.producers = {output: node for node in graph.node for output in node.output}
        self.counts = _readers(graph)
        self.reads: dict[str, list] = {}
        for node in graph.node:
            for position, name in enumerate(node.input):
                self.reads.setdefault(name, []).append((node, position))

    def reader_of(self, name: str):
        """The one node reading `name` and the input it reads it at, or None."""
        found = self.reads.get(name, [])
        return found[0] if len(found) == 1 and self.counts.get(name) == 1 else None


def kept_cast(index: _Index, node, keep: int | None) -> bool:
    """Whether `node` casts a weight stored in `keep` (an ONNX half type) to
    float32 on its way, through views only, to a matrix product or lookup:
    the `Cast` that stays (see the module docstring).

    Args:
        index: the graph's `_Index`.
        node: a node of the graph.
        keep: the half type kept, or None (every `Cast` of a weight folds).

    Returns:
        True where the cast stays.
    """
    weight = index.initializers.get(node.input[0]) if node.input else None
    if keep is None or node.op_type != "Cast" or weight is None or weight.data_type != keep:
        return False
    if attribute(node, "to", 0) != TensorProto.FLOAT:
        return False
    value, seen = node.output[0], set()
    while value not in seen:
        seen.add(value)
        reader = index.reader_of(value)
        if reader is None:
            return False
        after, position = reader
        if _MATRIX_READERS.get(after.op_type) == position:
            return True
        if after.op_type not in _RESHAPES + ("Transpose",) or position != 0:
            return False
        value = after.output[0]
    return False


def _weight_of(index: _Index, node, keep: int | None):
    """The weight `node` views (its first input, or the weight behind a kept
    `Cast` that is its first input), and that Cast or None."""
    if not node.input:
        return None, None
    weight = index.initializers.get(node.input[0])
    if weight is not None:
        return weight, None
    cast = index.producers.get(node.input[0])
    if cast is not None and node.op_type != "Cast" and kept_cast(index, cast, keep):
        return index.initializers[cast.input[0]], cast
    return None, None


def _fold_once(graph, folder, keep: int | None) -> int:
    """Fold each view read from a weight only it reads (through a kept
    `Cast`, which then moves after it, so that the next view of a chain
    folds in the same pass); returns how many."""
    index = _Index(graph)
    outputs = {value.name for value in graph.output}
    renames, folded = {}, []
    for position, node in enumerate(graph.node):
        if node.op_type not in _VIEWS or kept_cast(index, node, keep):
            continue
        weight, cast = _weight_of(index, node, keep)
        if weight is None or index.counts.get(weight.name) != 1 or node.output[0] in outputs:
            continue
        if cast is not None and index.counts.get(cast.output[0]) != 1:
            continue
        change = _folded(node, weight, index.initializers, folder)
        if change is None:
            continue
        dims, array = change
        if array is None:
            del weight.dims[:]
            weight.dims.extend(dims)
        else:
            weights.replace(weight, np.ascontiguousarray(array), folder)
        if cast is None:
            renames[node.output[0]] = weight.name
        else:
            cast.output[0] = node.output[0]
            index.producers[node.output[0]] = cast
        folded.append(position)
    for position in reversed(folded):
        del graph.node[position]
    rename_reads(graph, renames)
    return len(folded)


def fold_weight_views(proto, folder=None, keep: str | None = None) -> int:
    """Fold each view of a weight read by that view alone into the weight, a
    chain of views to its end (see the module docstring).

    Args:
        proto: the ModelProto, changed in place.
        folder: the folder of its data files, if any.
        keep: the half dtype (`"bfloat16"`, `"float16"`) whose matrix weights
            stay in it behind their `Cast`, or None.

    Returns:
        The number of nodes folded.
    """
    kept = {"bfloat16": TensorProto.BFLOAT16, "float16": TensorProto.FLOAT16}.get(keep)
    total = 0
    while count := _fold_once(proto.graph, folder, kept):
        total += count
    return total


def run(proto, context: Context) -> PassResult:
    """`fold_weight_views` as a pass.

    Args:
        proto: the ModelProto, changed in place.
        context: its `data_folder` is where the weights' data files are;
            matrix weights in its `weights_dtype` stay in it.

    Returns:
        How many nodes were folded.
    """
    keep = context.weights_dtype if context.weights_dtype != "float32" else None
    return PassResult(proto, changed=fold_weight_views(proto, context.data_folder, keep))
