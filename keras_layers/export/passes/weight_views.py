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
"""

import numpy as np
from onnx import helper

from keras_layers.export.graph import attribute, body_reads, perm, rename_reads, weights
from keras_layers.export.passes.context import Context, PassResult

# Views that change a weight's dims only (its bytes stay where they are).
_RESHAPES = ("Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity")
_VIEWS = (*_RESHAPES, "Transpose", "Cast")


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


def _fold_once(graph, folder) -> int:
    """Fold each view read from a weight only it reads; returns how many."""
    initializers = {init.name: init for init in graph.initializer}
    readers = _readers(graph)
    outputs = {value.name for value in graph.output}
    renames, folded = {}, []
    for position, node in enumerate(graph.node):
        weight = initializers.get(node.input[0]) if node.input else None
        if node.op_type not in _VIEWS or weight is None:
            continue
        if readers.get(weight.name) != 1 or node.output[0] in outputs:
            continue
        change = _folded(node, weight, initializers, folder)
        if change is None:
            continue
        dims, array = change
        if array is None:
            del weight.dims[:]
            weight.dims.extend(dims)
        else:
            weights.replace(weight, np.ascontiguousarray(array), folder)
        renames[node.output[0]] = weight.name
        folded.append(position)
    for position in reversed(folded):
        del graph.node[position]
    rename_reads(graph, renames)
    return len(folded)


def fold_weight_views(proto, folder=None) -> int:
    """Fold each view of a weight read by that view alone into the weight, a
    chain of views to its end (see the module docstring).

    Args:
        proto: the ModelProto, changed in place.
        folder: the folder of its data files, if any.

    Returns:
        The number of nodes folded.
    """
    total = 0
    while count := _fold_once(proto.graph, folder):
        total += count
    return total


def run(proto, context: Context) -> PassResult:
    """`fold_weight_views` as a pass.

    Args:
        proto: the ModelProto, changed in place.
        context: its `data_folder` is where the weights' data files are.

    Returns:
        How many nodes were folded.
    """
    return PassResult(proto, changed=fold_weight_views(proto, context.data_folder))
