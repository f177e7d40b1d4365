"""Graph rewrites that fold tf2onnx's decompositions back into single ops.

tf2onnx lowers Keras' `LayerNormalization` to 12-13 elementwise nodes and every
`Dense` on a 3-D input to TensorFlow's `Tensordot` dance (Shape, Reshape to 2-D,
MatMul, Gather, Concat, Cast, Reshape back). No maintained library folds them:
onnxslim has no LayerNorm pattern, and ONNX Runtime's transformer fusions
(`FusionLayerNormalization`, `FusionLayerNormalizationTF`) match the PyTorch and
TF1 decompositions, not this one (measured: 0 fusions on the reference encoder).
So these two rewrites are written here, each matched strictly: every
intermediate tensor must have exactly the consumers the pattern expects, and
every constant must have the expected value, or the subgraph is left alone.
The pipeline's validation then checks the rewritten graph like any other.
"""

from collections import defaultdict

import numpy as np
from onnx import helper, numpy_helper


class _Graph:
    """Producer, consumer and constant lookups over a GraphProto."""

    def __init__(self, graph):
        self.graph = graph
        self.producer = {out: node for node in graph.node for out in node.output}
        self.consumers = defaultdict(list)
        for node in graph.node:
            for name in node.input:
                self.consumers[name].append(node)
        self.outputs = {value.name for value in graph.output}
        self.initializers = {init.name: init for init in graph.initializer}

    def const(self, name):
        init = self.initializers.get(name)
        return None if init is None else numpy_helper.to_array(init)

    def node(self, name, op_type):
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def only_used_by(self, name, count=1):
        return name not in self.outputs and len(self.consumers[name]) == count

    def other_input(self, node, name):
        first, second = node.input
        return second if first == name else first if second == name else None


def _last_axis_reduce(g, node, rank):
    """Whether a ReduceMean node averages over the last axis only, keeping dims."""
    keepdims = next((a.i for a in node.attribute if a.name == "keepdims"), 1)
    if keepdims != 1:
        return False
    axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
    if axes is None and len(node.input) > 1:
        value = g.const(node.input[1])
        axes = None if value is None else value.reshape(-1).tolist()
    return axes is not None and len(axes) == 1 and axes[0] in (-1, rank - 1)


def _match_layer_norm(g, add, ranks):
    """Match y = x*G + (-mean*G [+ beta]) with G = gamma / sqrt(var + eps)."""
    for scaled_name in add.input:
        scaled = g.node(scaled_name, "Mul")
        shift_name = g.other_input(add, scaled_name)
        if scaled is None or shift_name is None or not g.only_used_by(scaled_name):
            continue
        for x in scaled.input:
            factor = g.other_input(scaled, x)
            gain = g.node(factor, "Mul")
            if gain is None or not g.only_used_by(factor, 2):
                continue
            recip_name = next((i for i in gain.input if g.node(i, "Reciprocal")), None)
            if recip_name is None:
                continue
            gamma = g.const(g.other_input(gain, recip_name))
            sqrt = g.node(g.producer[recip_name].input[0], "Sqrt")
            eps_add = sqrt and g.node(sqrt.input[0], "Add")
            if not eps_add:
                continue
            var_name = next((i for i in eps_add.input if g.node(i, "ReduceMean")), None)
            if var_name is None:
                continue
            epsilon = g.const(g.other_input(eps_add, var_name))
            variance = g.producer[var_name]
            square = g.node(variance.input[0], "Mul")
            if square is None or square.input[0] != square.input[1]:
                continue
            centred = g.node(square.input[0], "Sub")
            if centred is None or centred.input[0] != x:
                continue
            mean = g.node(centred.input[1], "ReduceMean")
            if mean is None or mean.input[0] != x:
                continue
            rank = ranks.get(x)
            if rank is None or not all(_last_axis_reduce(g, n, rank) for n in (mean, variance)):
                continue
            beta = _match_shift(g, shift_name, factor, mean.output[0])
            if beta is None or gamma is None or epsilon is None or epsilon.size != 1:
                continue
            return x, gamma, beta, float(epsilon.reshape(-1)[0])
    return None


def _match_shift(g, name, factor, mean):
    """The `-mean*G [+ beta]` branch; returns beta (zeros when absent) or None."""
    beta = None
    node = g.producer.get(name)
    if node is not None and node.op_type == "Add":
        for inner in node.input:
            constant = g.const(g.other_input(node, inner))
            if constant is not None and g.node(inner, "Mul") and g.only_used_by(inner):
                beta, node = constant, g.producer[inner]
                break
        else:
            return None
    if node is None or node.op_type != "Mul" or factor not in node.input:
        return None
    negated = g.node(g.other_input(node, factor), "Neg")
    if negated is None or negated.input[0] != mean:
        return None
    return np.zeros(1, np.float32) if beta is None else beta


def fuse_layer_norms(proto, ranks: dict) -> int:
    """Replace decomposed LayerNorms by `LayerNormalization` (opset 17+)."""
    g = _Graph(proto.graph)
    fused = 0
    for add in [n for n in proto.graph.node if n.op_type == "Add"]:
        match = _match_layer_norm(g, add, ranks)
        if match is None:
            continue
        x, gamma, beta, epsilon = match
        width = gamma.size
        if beta.size == 1:
            beta = np.full(width, beta.reshape(-1)[0], np.float32)
        if beta.size != width:
            continue
        prefix = f"{add.output[0]}_ln"
        proto.graph.initializer.extend(
            [
                numpy_helper.from_array(gamma.reshape(width).astype(np.float32), f"{prefix}_scale"),
                numpy_helper.from_array(beta.reshape(width).astype(np.float32), f"{prefix}_bias"),
            ]
        )
        node = helper.make_node(
            "LayerNormalization",
            [x, f"{prefix}_scale", f"{prefix}_bias"],
            list(add.output),
            axis=-1,
            epsilon=epsilon,
        )
        add.CopyFrom(node)
        fused += 1
    return fused


def fuse_tensordot_matmuls(proto) -> int:
    """`Reshape(MatMul(Reshape(x, [-1, d]), W), shape(x)[:-1] + [n])` -> `MatMul(x, W)`.

    ONNX MatMul broadcasts over leading axes, so the 2-D detour and the shape
    arithmetic that undoes it are not needed.
    """
    g = _Graph(proto.graph)
    fused = 0
    for reshape in [n for n in proto.graph.node if n.op_type == "Reshape"]:
        matmul = g.node(reshape.input[0], "MatMul")
        if matmul is None or not g.only_used_by(matmul.output[0]):
            continue
        shape = _matrix_shape(g, matmul.input[1])
        flatten = g.node(matmul.input[0], "Reshape")
        if shape is None or flatten is None:
            continue
        target = g.const(flatten.input[1])
        if target is None or target.tolist() != [-1, shape[0]]:
            continue
        x = flatten.input[0]
        if not _is_leading_shape_plus(g, reshape.input[1], x, shape[1]):
            continue
        reshape.CopyFrom(helper.make_node("MatMul", [x, matmul.input[1]], list(reshape.output)))
        fused += 1
    return fused


def _matrix_shape(g, name):
    """Shape of a constant matrix, or of `Transpose(matrix)` (a tied weight)."""
    weight = g.const(name)
    if weight is not None:
        return weight.shape if weight.ndim == 2 else None
    transpose = g.node(name, "Transpose")
    if transpose is None:
        return None
    weight = g.const(transpose.input[0])
    perm = [a.ints for a in transpose.attribute if a.name == "perm"]
    if weight is None or weight.ndim != 2 or (perm and list(perm[0]) != [1, 0]):
        return None
    return weight.shape[::-1]


def _skip_casts(g, name):
    node = g.producer.get(name)
    while node is not None and node.op_type == "Cast":
        name = node.input[0]
        node = g.producer.get(name)
    return name, node


def _is_leading_shape_plus(g, name, x, last):
    """Whether `name` computes `concat(shape(x)[:-1], [last])`."""
    _, concat = _skip_casts(g, name)
    if concat is None or concat.op_type != "Concat" or len(concat.input) != 2:
        return False
    tail = g.const(concat.input[1])
    if tail is None or tail.reshape(-1).tolist() != [last]:
        return False
    gather = g.producer.get(concat.input[0])
    if gather is None or gather.op_type != "Gather":
        return False
    indices = g.const(gather.input[1])
    _, shape = _skip_casts(g, gather.input[0])
    if indices is None or shape is None or shape.op_type != "Shape" or shape.input[0] != x:
        return False
    return indices.reshape(-1).tolist() == list(range(indices.size))


def tensor_ranks(proto) -> dict:
    """Rank of every tensor that ONNX shape inference can tell."""
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(proto, data_prop=True)
    ranks = {}
    for value in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        if value.type.tensor_type.HasField("shape"):
            ranks[value.name] = len(value.type.tensor_type.shape.dim)
    return ranks
