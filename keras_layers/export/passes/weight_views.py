"""Views of a weight folded into the weight: `Reshape(W, constant)` and
`Identity(W)` of an initializer read by that node alone become the
initializer itself. A row-major reshape changes only its dims, never its
bytes, so a weight in the data file stays where it is. Without this, ONNX
Runtime folds them when the session starts, copying each weight it reshapes
(a session's memory, with and without: benchmarks/results/big_model.json).

onnxslim folds these too (copying), so this pass runs where it does not.
"""

import numpy as np
import onnx
from onnx import numpy_helper

from keras_layers.export.graph import body_reads, rename_reads
from keras_layers.export.passes.context import Context, PassResult


def _reshaped_dims(dims: list, shape: list) -> list | None:
    """ONNX Reshape's output dims (`allowzero` 0: a 0 copies the input's dim),
    or None where they do not hold the same number of elements."""
    out = [dims[i] if size == 0 and i < len(dims) else size for i, size in enumerate(shape)]
    total = int(np.prod(dims, dtype=np.int64))
    if out.count(-1) == 1:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        if known == 0 or total % known:
            return None
        out[out.index(-1)] = total // known
    if -1 in out or int(np.prod(out, dtype=np.int64)) != total:
        return None
    return out


def _folded_dims(node, weight, initializers: dict) -> list | None:
    """The dims `weight` takes when `node` (a Reshape or an Identity of it) is
    folded into it, or None where it cannot be."""
    if node.op_type == "Identity":
        return list(weight.dims)
    shape = initializers.get(node.input[1]) if len(node.input) > 1 else None
    allowzero = any(a.name == "allowzero" and a.i for a in node.attribute)
    if shape is None or allowzero or shape.data_location == onnx.TensorProto.EXTERNAL:
        return None
    return _reshaped_dims(list(weight.dims), numpy_helper.to_array(shape).tolist())


def fold_weight_views(proto) -> int:
    """Fold each view of a weight read by that view alone into the weight
    (see the module docstring). Returns the number of nodes folded."""
    graph = proto.graph
    initializers = {init.name: init for init in graph.initializer}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in {*node.input, *body_reads(node)}:
            readers[name] = readers.get(name, 0) + 1
    outputs = {value.name for value in graph.output}
    renames, folded = {}, []
    for position, node in enumerate(graph.node):
        if node.op_type not in ("Reshape", "Identity") or not node.input:
            continue
        weight = initializers.get(node.input[0])
        if weight is None or readers.get(weight.name) != 1 or node.output[0] in outputs:
            continue
        dims = _folded_dims(node, weight, initializers)
        if dims is None:
            continue
        if node.op_type == "Reshape":
            del weight.dims[:]
            weight.dims.extend(dims)
        renames[node.output[0]] = weight.name
        folded.append(position)
    for position in reversed(folded):
        del graph.node[position]
    rename_reads(graph, renames)
    return len(folded)


def run(proto, context: Context) -> PassResult:
    """`fold_weight_views` as a pass.

    Args:
        proto: the ModelProto, changed in place.
        context: not read.

    Returns:
        How many nodes were folded.
    """
    del context
    return PassResult(proto, changed=fold_weight_views(proto))
