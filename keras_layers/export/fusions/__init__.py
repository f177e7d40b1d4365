"""Graph rewrites that fold tf2onnx's decompositions back into single ops.

tf2onnx lowers Keras' `LayerNormalization` to 12-13 elementwise nodes, every
`Dense` on a 3-D input to TensorFlow's `Tensordot` dance (Shape, Reshape to 2-D,
MatMul, Gather, Concat, Cast, Reshape back), and dot-product attention to
transposes, two matmuls, the mask's select and a softmax. No maintained library
folds them: onnxslim has no LayerNorm or attention pattern, and ONNX Runtime's
transformer fusions (`FusionLayerNormalization`, `FusionLayerNormalizationTF`,
`FusionAttention`) match the PyTorch and TF1 decompositions of BERT, not these
(measured: 0 fusions on the reference encoder). So these three rewrites are
written here, each matched strictly: every intermediate tensor must have
exactly the consumers the pattern expects, and every constant must have the
expected value, or the subgraph is left alone. The pipeline's validation then
checks the rewritten graph like any other.

GELU is the exception: ONNX Runtime's own fusions match the tanh form Keras
writes, so `fuse_gelus` runs them, inside our checks, after a rule of ours for
the erfc form TensorFlow writes for the exact GELU. Each rule here that
declines a candidate says why (the `declined` lists).
"""

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def _body_reads(node) -> set[str]:
    """Names the subgraphs of `node` read from enclosing graphs."""
    from keras_layers.export.slimming import free_names, subgraphs

    found = set()
    for body in subgraphs(node):
        found |= free_names(body)
    return found


class _Graph:
    """Producer, consumer and constant lookups over a GraphProto."""

    def __init__(self, graph):
        self.graph = graph
        self.producer = {out: node for node in graph.node for out in node.output}
        self.consumers = defaultdict(list)
        for node in graph.node:
            for name in node.input:
                self.consumers[name].append(node)
            # A Loop/If/Scan body may read a value of this graph without
            # listing it as an input: that node reads it too, so no fusion
            # may take the value away from it.
            for name in _body_reads(node):
                self.consumers[name].append(node)
        self.outputs = {value.name for value in graph.output}
        self.initializers = {init.name: init for init in graph.initializer}
        self.shapes = {}  # `tensor_shapes`, for the rules that read them

    def const(self, name):
        """The values of initializer `name`; None if it is not one, or if its
        values are in a data file (a weight: no rule reads one's values)."""
        init = self.initializers.get(name)
        if init is None or init.data_location == TensorProto.EXTERNAL:
            return None
        return numpy_helper.to_array(init)

    def const_shape(self, name):
        """The shape of initializer `name` (wherever its values are), or None."""
        init = self.initializers.get(name)
        return None if init is None else tuple(init.dims)

    def node(self, name, op_type):
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def only_used_by(self, name, count=1):
        return name not in self.outputs and len(self.consumers[name]) == count

    def other_input(self, node, name):
        first, second = node.input
        return second if first == name else first if second == name else None


def use_contrib_domain(proto) -> None:
    """Import ONNX Runtime's `com.microsoft` domain, where its fused ops live."""
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def _perm(node):
    """A Transpose node's `perm`, or None when absent (reverse every axis)."""
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def _opset(proto) -> int:
    """The model's default-domain opset."""
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)


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
    if _opset(proto) < 17:
        return 0
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


def fuse_rms_norms(proto, shapes: dict, declined: list | None = None) -> int:
    """Replace decomposed RMS norms by ONNX Runtime's `SimplifiedLayerNormalization`.

    Keras-hub's Llama, Mistral, Gemma, Qwen, ... normalise with
    `x * rsqrt(mean(x^2) + eps) [* scale]`, which reaches ONNX as `Pow` (or
    `Mul(x, x)`), `ReduceMean` over the last axis, `Add(eps)`, `Sqrt`,
    `Reciprocal`, `Mul(x, .)` and, unless onnxslim folded a scale of ones
    away, `Mul(scale)`: 6-7 nodes, two full passes over the activations, at
    every norm. ONNX Runtime's own `FusionSimplifiedLayerNormalization` needs
    the scale `Mul`, so it finds none on a model whose scales are still their
    initial ones; this rule takes both forms, float32 only, and leaves alone
    any whose width shape inference cannot tell (`declined` says why).
    `SimplifiedLayerNormalization` is ONNX Runtime's (registered in the ONNX
    domain, opset 1): other runtimes do not know it.
    """
    declined = [] if declined is None else declined
    g = _Graph(proto.graph)
    fused = 0
    for mean in [n for n in proto.graph.node if n.op_type == "ReduceMean"]:
        match = _match_rms_norm(g, mean, shapes)
        if isinstance(match, str):
            declined.append((mean.output[0], match))
            continue
        x, epsilon, scale, last = match
        name = f"{last.output[0]}_rms_scale"
        proto.graph.initializer.append(numpy_helper.from_array(scale, name))
        last.CopyFrom(
            helper.make_node(
                "SimplifiedLayerNormalization",
                [x, name],
                list(last.output),
                axis=-1,
                epsilon=epsilon,
            )
        )
        fused += 1
    return fused


def _match_rms_norm(g, mean, shapes):
    """(x, epsilon, scale, node to replace) of one RMS norm, or why not."""
    square = g.producer.get(mean.input[0])
    if square is None or not g.only_used_by(square.output[0]):
        return "the mean is not of a square read only there"
    if square.op_type == "Mul" and square.input[0] == square.input[1]:
        x = square.input[0]
    elif square.op_type == "Pow" and _scalar_is(g, square.input[1], 2.0):
        x = square.input[0]
    else:
        return "the mean is not of x * x or x ** 2"
    dims, elem_type = shapes.get(x, (None, None))
    if dims is None or elem_type != TensorProto.FLOAT or not isinstance(dims[-1], int):
        return "x is not float32 with a known last axis"
    if not _last_axis_reduce(g, mean, len(dims)):
        return "the mean is not over the last axis alone"
    chain = []
    name = mean.output[0]
    for op in ("Add", "Sqrt", "Reciprocal"):
        consumers = g.consumers[name]
        if not g.only_used_by(name) or consumers[0].op_type != op:
            return f"the mean does not go on to {op} alone"
        chain.append(consumers[0])
        name = consumers[0].output[0]
    epsilon = g.const(g.other_input(chain[0], mean.output[0]))
    if epsilon is None or epsilon.size != 1:
        return "the added epsilon is not one constant"
    normalise = g.consumers[name]
    if not g.only_used_by(name) or normalise[0].op_type != "Mul":
        return "the inverse root does not go on to one Mul"
    if g.other_input(normalise[0], name) != x:
        return "the inverse root does not multiply x"
    last, width = normalise[0], dims[-1]
    scale = np.ones(width, np.float32)
    after = g.consumers[last.output[0]]
    if g.only_used_by(last.output[0]) and after[0].op_type == "Mul":
        gain = g.const(g.other_input(after[0], last.output[0]))
        if gain is not None and gain.size == width and gain.dtype == np.float32:
            scale, last = gain.reshape(width), after[0]
    return x, float(epsilon.reshape(-1)[0]), scale, last


def _scalar_is(g, name, value: float) -> bool:
    constant = g.const(name)
    return constant is not None and constant.size == 1 and float(constant.reshape(-1)[0]) == value


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
    shape = g.const_shape(name)
    if shape is not None:
        return shape if len(shape) == 2 else None
    transpose = g.node(name, "Transpose")
    if transpose is None:
        return None
    shape = g.const_shape(transpose.input[0])
    if shape is None or len(shape) != 2 or _perm(transpose) not in (None, [1, 0]):
        return None
    return shape[::-1]


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


def tensor_shapes(proto) -> dict:
    """Shape and element type of every tensor that ONNX shape inference can tell.

    {name: (dims, elem_type)}, each dim an int, a symbolic name, or None.
    """
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(proto, data_prop=True)
    shapes = {}
    for value in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            dims = [
                d.dim_value if d.HasField("dim_value") else d.dim_param or None
                for d in tensor.shape.dim
            ]
            shapes[value.name] = (dims, tensor.elem_type)
    return shapes


def tensor_ranks(shapes: dict) -> dict:
    """Rank of every tensor in `tensor_shapes`' answer."""
    return {name: len(dims) for name, (dims, _) in shapes.items()}


# Masked logits get this additive bias where Keras selects 0.7 x the float32
# maximum (-2.4e38) instead of the logit. Adding it to any logit below 1e31 in
# magnitude rounds to exactly this value, so a row with every position masked
# is uniform as in Keras, whatever its logits, and a masked position in any
# other row gets exp(-3e38 - max) = 0, as it does in Keras. A bias of the size
# attention masks usually get would not do: -1e9 + 40 rounds to -1e9 + 64, so
# in a fully masked row the largest logit would win.
_MASKED = np.float32(-3e38)
_HEADS_FIRST = [0, 2, 1, 3]


def _transposed(g, name, perm):
    """The input of `Transpose(x, perm)` producing `name`. Other nodes may read
    the transpose too (DeBERTa's relative terms read the key's): the fused op
    reads `x`, and the transpose stays for them. A `Reshape` that computes
    that transpose counts too (see `_reshape_is_transpose`)."""
    node = g.node(name, "Transpose")
    if node is None:
        reshape = g.node(name, "Reshape")
        if reshape is not None and _reshape_is_transpose(g, reshape, perm):
            return reshape.input[0]
        return None
    if _perm(node) != perm:
        return None
    return node.input[0]


def _reshape_is_transpose(g, reshape, perm) -> bool:
    """Whether `reshape` provably computes `Transpose(x, perm)` of its input x.

    onnxslim writes a transpose that only moves axes of size 1 as a reshape:
    keras-hub's Gemma has one key/value head, and (B, S, 1, H) to
    (B, 1, S, H) keeps the memory order. It does when the axes of x not
    known to be 1 keep their order under `perm`, and each entry of the
    reshape's constant target is the permuted dim (statically, or 0 where x
    has that very dim at that axis), with at most one -1, which then takes the
    one dim left.
    """
    dims = g.shapes.get(reshape.input[0], (None,))[0]
    target = g.const(reshape.input[1])
    if dims is None or target is None or len(dims) != len(perm) or target.size != len(perm):
        return False
    moved = [axis for axis in perm if dims[axis] != 1]
    if moved != sorted(moved):
        return False
    wanted = [dims[axis] for axis in perm]
    for axis, size in enumerate(target.reshape(-1).tolist()):
        if size == 0 and dims[axis] is not None and dims[axis] == wanted[axis]:
            continue
        if size != -1 and not (isinstance(wanted[axis], int) and size == wanted[axis]):
            return False
    return (target == -1).sum() <= 1


def _scalar(g, node, name):
    """The scalar constant multiplying `name` in the Mul `node`, or None."""
    value = g.const(g.other_input(node, name))
    return None if value is None or value.size != 1 else float(value.reshape(-1)[0])


@dataclass
class _Attention:
    """One matched attention: what `MultiHeadAttention` needs to replace it."""

    q: str
    k: str
    v: str
    mask: str | None
    scale: float
    heads: int
    size: int
    out: object  # the Transpose node whose output the fused nodes take over
    zeroes_masked_rows: bool  # keras.layers.Softmax's path, see `_probabilities_reader`
    bias: str | None = None  # added to the logits, times `bias_scale` if that is set
    bias_scale: float | None = None
    shape_readers: tuple = ()  # `Shape` nodes of the (B, N, T, S) logits
    groups: int = 1  # query heads per key/value head, see `_match_grouped`


def _probabilities_reader(g, softmax):
    """The `MatMul` that weighs the values by the softmax, and the select between.

    Keras reaches the softmax two ways. `ops.dot_product_attention` (dropout 0)
    feeds it straight to the matmul. `MultiHeadAttention` with dropout, and
    layers such as keras-hub's `LlamaAttention`, call `keras.layers.Softmax`
    with the mask, which selects -1e9 at masked logits and then selects 0 at
    masked probabilities: `Where(mask, Softmax(...), 0)`. That second select
    only changes rows whose every key is masked (uniform -> 0), so the fused
    op gets the same and those rows are zeroed after it (`_visible_rows`).
    Returns (matmul, zeroing Where or None) or a reason.
    """
    axis = next((a.i for a in softmax.attribute if a.name == "axis"), -1)
    if axis not in (-1, 3):
        return "the softmax is not over the last axis"
    if not g.only_used_by(softmax.output[0]):
        return "the probabilities are a model output or read by more than one node"
    (reader,) = g.consumers[softmax.output[0]]
    zeroing = None
    if reader.op_type == "Where":
        zero = g.const(reader.input[2])
        if reader.input[1] != softmax.output[0] or zero is None or zero.size != 1 or zero.any():
            return "the select after the softmax does not set masked probabilities to 0"
        if not g.only_used_by(reader.output[0]):
            return "the selected probabilities are read by more than one node"
        zeroing, (reader,) = reader, g.consumers[reader.output[0]]
    if reader.op_type != "MatMul" or reader.input[0] != (zeroing or softmax).output[0]:
        return "the probabilities do not weigh the values in a MatMul"
    return reader, zeroing


def _attention_mask(g, softmax, zeroing):
    """The boolean mask selected into the logits, and the logits before it.

    A select value from -1e9 down masks completely: Keras selects -1e9
    (`keras.layers.Softmax`) or -2.4e38 (`ops.dot_product_attention`), and
    exp(-1e9 - max) is 0 for any logit above -9e8. Returns (mask or None,
    logits) or a reason.
    """
    where = g.node(softmax.input[0], "Where")
    if where is None:
        if zeroing is not None:
            return "the probabilities are zeroed where no mask selected the logits"
        return None, softmax.input[0]
    big = g.const(where.input[2])
    if not g.only_used_by(where.output[0]) or big is None or big.size != 1:
        return "the masked logits are read elsewhere or the select value is not a constant"
    if not np.isfinite(big).all() or big.max() > -1e9:
        return f"the select value {big.max()} does not mask completely"
    if zeroing is not None and zeroing.input[0] != where.input[0]:
        return "the selects before and after the softmax read different masks"
    return where.input[0], where.input[1]


def _sole_reader(g, name, shape_readers=None) -> bool:
    """Whether one node reads `name`, not counting `Shape` nodes when
    `shape_readers` is a list: those are added to it."""
    readers = g.consumers[name]
    shapes = [n for n in readers if n.op_type == "Shape"] if shape_readers is not None else []
    if name in g.outputs or len(readers) - len(shapes) != 1:
        return False
    if shape_readers is not None:
        shape_readers += shapes
    return True


def _scaled(g, name, shape_readers=None):
    """(x, scale) for `Mul(x, scalar)` producing `name` (read only there, see
    `_sole_reader`), else (name, None)."""
    mul = g.node(name, "Mul")
    if mul is None:
        return name, None
    found = []
    if not _sole_reader(g, name, found if shape_readers is not None else None):
        return name, None
    for x in mul.input:
        scale = _scalar(g, mul, x)
        if scale is not None and g.other_input(mul, x) != x:
            if shape_readers is not None:
                shape_readers += found
            return x, scale
    return name, None


def _product(g, name, shape_readers: list):
    """(q, k, scale factors) for a q.k^T product, scaled or not, producing `name`,
    q and k (B, T|S, N, H); or a reason. `Shape` nodes reading the (B, N, T, S)
    tensors on the way go to `shape_readers` (see `_sole_reader`).

    The trace of `ops.dot_product_attention` writes `MatMul(q^T, k^T)`;
    `MultiHeadAttention`'s einsum path scales the query first and tf2onnx
    lowers `einsum("aecd,abcd->acbe", key, query)` to
    `Transpose(MatMul(k^T, (q*scale)^T), [0, 1, 3, 2])`; keras-hub's GPT-NeoX
    scales the product inside that transpose. Each scalar `Mul` on the way is
    one of the factors.
    """
    name, outer = _scaled(g, name, shape_readers)
    if not _sole_reader(g, name, shape_readers):
        return "the logits are read by more than one node"
    middle = None
    swapped = g.node(name, "Transpose")
    if swapped is not None:
        if _perm(swapped) != [0, 1, 3, 2] or not g.only_used_by(swapped.input[0]):
            return "the logits are not a transposed product"
        inside, middle = _scaled(g, swapped.input[0])
        product = g.node(inside, "MatMul")
        if product is None or not g.only_used_by(inside):
            return "the logits are not a transposed product"
        k_side, q_side, q_perm = product.input[0], product.input[1], [0, 2, 3, 1]
        k = _transposed(g, k_side, _HEADS_FIRST)
    else:
        product = g.node(name, "MatMul")
        if product is None:
            return "the logits are not a MatMul"
        q_side, q_perm = product.input[0], _HEADS_FIRST
        k = _transposed(g, product.input[1], [0, 2, 3, 1])
    q = _transposed(g, q_side, q_perm)
    if q is None or k is None:
        return "the query and key do not reach the product through heads-first transposes"
    q, inner = _scaled(g, q)
    return q, k, [outer, middle, inner]


def _combined_scale(factors: list):
    """The product of the scalar factors found (None: no factor), or why the
    fused op cannot take it: `MultiHeadAttention` reads scale=0 as "not set"
    and uses 1/sqrt(H)."""
    found = [factor for factor in factors if factor is not None]
    scale = float(np.prod(np.float32(found))) if found else 1.0
    if not scale or not np.isfinite(scale):
        return "the logits are not scaled by a finite, nonzero constant"
    return scale


def _attention_logits(g, logits, shapes):
    """(q, k, scale, bias, bias scale) for logits `scale * q.k^T + bias_scale * bias`,
    bias and bias scale None where there is none; or a reason.

    The logits are a `_product`, up to float rounding where the scale is
    applied, as `MultiHeadAttention` computes them; or such a product plus a
    float32 tensor of rank up to 4 that broadcasts to (B, N, T, S) (T5's
    relative position bias, Bloom's and Falcon's ALiBi, DeBERTa's
    disentangled terms), added before or after the scale: keras-hub's Falcon
    writes `(q.k^T + alibi) * scale`, which `MultiHeadAttention` computes as
    `scale * q.k^T + (scale * alibi)`, its `attention_bias`.
    """
    readers = []  # `Shape` nodes reading the logits, see `_sole_reader`
    name, outer = _scaled(g, logits, readers)
    add = g.node(name, "Add")
    bias = None
    if add is None:
        found = _product(g, logits, readers)
    else:
        if not g.only_used_by(name):
            return "the biased logits are read by more than one node"
        reasons = []
        for side in dict.fromkeys(add.input):
            side_readers = []
            found = _product(g, side, side_readers)
            if not isinstance(found, str):
                bias = g.other_input(add, side)
                readers += side_readers
                break
            reasons.append(found)
        else:  # the side that is a product of some kind says why it is not ours
            found = min(reasons, key=lambda reason: reason == "the logits are not a MatMul")
        if bias is not None:
            dims, elem_type = shapes.get(bias, (None, None))
            if dims is None or len(dims) > 4 or elem_type != TensorProto.FLOAT:
                return "the bias added to the logits is not float32 of known rank up to 4"
            if len(dims) == 4 and isinstance(dims[0], int) and dims[0] > 1:
                return "the bias added to the logits has a fixed batch"
    if isinstance(found, str):
        return found
    q, k, factors = found
    if bias is not None:
        factors = [*factors, outer]
    scale = _combined_scale(factors)
    if isinstance(scale, str):
        return scale
    return q, k, scale, bias, (outer if bias is not None else None), readers


def _attention_heads(shapes, q, k, v, out):
    """(heads, head size) when q, k, v and the output are float32 (B, T, N, H), or a reason."""
    known = [shapes.get(name) for name in (q, k, v, out)]
    if any(info is None or len(info[0]) != 4 for info in known):
        return "q, k, v or the output has no known rank 4"
    if any(info[1] != 1 for info in known):
        return "not float32: ONNX Runtime's CPU MultiHeadAttention is float32"
    heads, size = known[0][0][2:]
    if not isinstance(heads, int) or not isinstance(size, int):
        return "the number of heads or the head size is not static"
    if any(info[0][2:] != [heads, size] for info in known[1:]):
        return "q, k, v and the output differ in heads or head size"
    return heads, size


def _match_attention(g, softmax, shapes):
    """Match one attention around `softmax`: an `_Attention`, or why not.

    `Transpose(MatMul([Where(mask, ] Softmax([Where(mask,] logits [, -big)])
    [, 0)], v^T))` with the logits of `_attention_logits` and q, k, v of shape
    (B, T, N, H) in float32.
    """
    found = _probabilities_reader(g, softmax)
    if isinstance(found, str):
        return found
    pv, zeroing = found
    if not g.only_used_by(pv.output[0]):
        return "the attention output is read by more than one node"
    (out,) = g.consumers[pv.output[0]]
    if out.op_type == "Transpose" and _perm(out) == _GROUPED_BACK:
        return _match_grouped(g, softmax, shapes, pv, zeroing, out)
    if out.op_type != "Transpose" or _perm(out) != _HEADS_FIRST:
        return "the attention output is not transposed back to (B, T, N, H)"
    v = _transposed(g, pv.input[1], _HEADS_FIRST)
    if v is None:
        return "the values do not reach the product through a heads-first transpose"
    found = _attention_mask(g, softmax, zeroing)
    if isinstance(found, str):
        return found
    mask, logits = found
    found = _attention_logits(g, logits, shapes)
    if isinstance(found, str):
        return found
    q, k, scale, bias, bias_scale, shape_readers = found
    found = _attention_heads(shapes, q, k, v, out.output[0])
    if isinstance(found, str):
        return found
    heads, size = found
    if zeroing is not None and not 1 <= len(shapes.get(mask, ((),))[0]) <= 4:
        return "the mask's rank is unknown or above 4"
    zeroes = zeroing is not None
    readers = tuple(shape_readers)
    return _Attention(q, k, v, mask, scale, heads, size, out, zeroes, bias, bias_scale, readers)


# Grouped-query attention as `tracing._attention_einsums_as_matmuls` writes
# keras-hub's `einsum("btkgh,bskh->bkgts")` and `einsum("bkgts,bskh->btkgh")`:
# q (B, T, K, G, H) to (B, K, G, T, H); k and v (B, S, K, H) to (B, K, H, S)
# and (B, K, S, H), each with a size-1 group axis inserted at 2; the output
# (B, K, G, T, H) back to (B, T, K, G, H).
_GROUPED_Q = [0, 2, 3, 1, 4]
_GROUPED_BACK = [0, 3, 1, 2, 4]


def _grouped_side(g, name, perm):
    """x of `Unsqueeze(Transpose(x, perm), [2])` producing `name`, or None."""
    unsqueeze = g.node(name, "Unsqueeze")
    if unsqueeze is None or len(unsqueeze.input) != 2 or not g.only_used_by(name):
        return None
    axes = g.const(unsqueeze.input[1])
    if axes is None or axes.reshape(-1).tolist() != [2]:
        return None
    return _transposed(g, unsqueeze.input[0], perm)


def _match_grouped(g, softmax, shapes, pv, zeroing, out):
    """Match grouped-query attention (see `_GROUPED_Q`): an `_Attention` whose
    q is (B, T, K, G, H) and k, v (B, S, K, H), or why not.

    K key/value heads each serve G query heads, head k * G + g of the
    (B, T, K * G, H) query: `fuse_attention` repeats each key and value head G
    times for `MultiHeadAttention`, as keras-hub's Llama does in the graph
    itself. The mask must broadcast over the heads: (B or 1, 1, 1, T, S) or
    of rank up to 3.
    """
    v = _grouped_side(g, pv.input[1], _HEADS_FIRST)
    if v is None:
        return "the grouped values do not reach the product through a transpose and an Unsqueeze"
    found = _attention_mask(g, softmax, zeroing)
    if isinstance(found, str):
        return found
    mask, logits = found
    name, outer = _scaled(g, logits)
    product = g.node(name, "MatMul")
    if product is None or not g.only_used_by(name):
        return "the grouped logits are not a MatMul read only by the softmax's select"
    q = _transposed(g, product.input[0], _GROUPED_Q)
    k = _grouped_side(g, product.input[1], [0, 2, 3, 1])
    if q is None or k is None:
        return "the grouped query and key do not reach the product through their transposes"
    q, inner = _scaled(g, q)
    scale = _combined_scale([outer, inner])
    if isinstance(scale, str):
        return scale
    known = [shapes.get(name) for name in (q, k, v, out.output[0])]
    if any(info is None for info in known) or [len(i[0]) for i in known] != [5, 4, 4, 5]:
        return "the grouped q, k, v or output has no known rank 5, 4, 4, 5"
    if any(info[1] != TensorProto.FLOAT for info in known):
        return "not float32: ONNX Runtime's CPU MultiHeadAttention is float32"
    kv_heads, groups, size = known[0][0][2:]
    if not all(isinstance(d, int) for d in (kv_heads, groups, size)):
        return "the number of heads or the head size is not static"
    if known[1][0][2:] != [kv_heads, size] or known[2][0][2:] != [kv_heads, size]:
        return "the grouped key or value differs from the query in heads or head size"
    if known[3][0][2:] != [kv_heads, groups, size]:
        return "the grouped output differs from the query in heads or head size"
    if mask is not None:
        dims = shapes.get(mask, (None,))[0]
        if dims is None or not (len(dims) <= 3 or (len(dims) == 5 and dims[1:3] == [1, 1])):
            return "the grouped mask is not (B or 1, 1, 1, T, S) or of rank up to 3"
    heads, zeroes = kv_heads * groups, zeroing is not None
    return _Attention(q, k, v, mask, scale, heads, size, out, zeroes, groups=groups)


def _visible_rows(mask, rank, fresh, constant):
    """Nodes computing, from a boolean mask broadcast to (B, N, T, S), a boolean
    (B|1, T|1, N|1, 1) that is true where a query sees some key and false where
    it sees none: the rows `keras.layers.Softmax` zeroes with its second select.

    A count (`ReduceSum`, axes an input since opset 13) rather than
    `ReduceMax`: ONNX Runtime's symbolic shape inference, which its fusions
    and tools run, cannot infer ReduceMax with axes as an input (opset 18).
    Returns (nodes, output name).
    """
    as_float, count, seen, wide, rows = (
        fresh(f"{mask}_{label}") for label in ("f", "count", "any", "4d", "rows")
    )
    nodes = [
        helper.make_node("Cast", [mask], [as_float], to=1),
        helper.make_node(
            "ReduceSum",
            [as_float, constant("mha_last_axis", np.array([-1], np.int64))],
            [count],
            keepdims=1,
        ),
        helper.make_node("Greater", [count, constant("mha_zero", np.float32(0))], [seen]),
    ]
    if rank < 4:  # leading axes of size 1, as broadcasting against the logits adds them
        leading = constant(f"mha_leading_{4 - rank}", np.arange(4 - rank, dtype=np.int64))
        nodes.append(helper.make_node("Unsqueeze", [seen, leading], [wide]))
        seen = wide
    nodes.append(helper.make_node("Transpose", [seen], [rows], perm=_HEADS_FIRST))
    return nodes, rows


def _logits_shape(q, k, heads, reader, fresh, constant) -> list:
    """Nodes that compute, from q and k (B, T|S, N, H), what `reader`, a `Shape`
    of the (B, N, T, S) logits, gave; the last of them rewrites `reader` in place.

    Keras' CLIP and Bloom layers build their masks from the logits' shape, so
    the logits have a reader besides the softmax; the fused op computes no
    logits, and their shape comes from the query and key instead.
    """
    start, end = _attribute(reader, "start", 0), _attribute(reader, "end", 4)
    start, end = (max(0, min(4, axis + 4 if axis < 0 else axis)) for axis in (start, end))
    parts, nodes = [], []
    for axis in range(start, end):
        if axis == 1:
            parts.append(constant(f"mha_heads_{heads}", np.array([heads], np.int64)))
            continue
        source, at = {0: (q, 0), 2: (q, 1), 3: (k, 1)}[axis]
        parts.append(fresh(f"{reader.output[0]}_{axis}"))
        nodes.append(helper.make_node("Shape", [source], [parts[-1]], start=at, end=at + 1))
    if not parts:  # an empty slice of the shape
        parts.append(constant("mha_no_axes", np.zeros(0, np.int64)))
    reader.CopyFrom(helper.make_node("Concat", parts, list(reader.output), axis=0))
    return nodes


def fuse_attention(proto, shapes: dict, declined: list | None = None, grouped: bool = True) -> int:
    """Replace the traced attention by ONNX Runtime's `MultiHeadAttention`.

    The trace leaves each attention as 3 transposes in, a scaled `MatMul`, the
    mask's `Where`, `Softmax`, a `MatMul` and a transpose out; Keras' einsum
    path (`MultiHeadAttention` with dropout, keras-hub's Llama attention) the
    same with the product transposed and a second `Where` after the softmax
    (see `_probabilities_reader`). One contrib
    `MultiHeadAttention` node computes the same (the scale as its `scale`, the
    mask as an additive bias, see `_MASKED`) without writing the
    (B, N, T, S) logits to memory three times: measured side by side on the
    reference encoder at batch 1, 15% faster at 2048 tokens, 14% at 1024, 7%
    at 512, 1% at 128; 4% at (8, 128); on keras-hub's BERT with dropout
    (4 layers, 256 wide, 1 thread) 4-5% at (1, 128) and (8, 128). ONNX
    Runtime's own fusion (`onnxruntime.transformers`) matches BERT's PyTorch
    and TF1 graphs and fuses none of these (see the module docstring).

    One difference remains: a NaN or infinite logit at a masked position,
    which Keras' select discards, survives the additive bias. Finite inputs
    give finite logits, so only a model that already computes NaN at its
    padded positions sees it. Needs opset 15 (`Shape` with `start`/`end`).

    `declined`, when given, gets (softmax output, reason) for each softmax left
    alone. `grouped=False` leaves grouped-query attention (`_match_grouped`)
    alone: a decoder with a cache runs one query against the whole cache, and
    repeating the cache's key/value heads for the fused op costs more than the
    op saves (measured on a keras-hub Gemma, 4 query heads on 1 key/value
    head, generating 32 tokens: 1.13x to 1.30x slower fused).
    """
    declined = [] if declined is None else declined
    if _opset(proto) < 15:
        declined.append(("", "opset below 15"))
        return 0
    g = _Graph(proto.graph)
    g.shapes = shapes
    graph = proto.graph
    taken = {*g.producer, *g.initializers, *(value.name for value in graph.input)}

    def fresh(name):
        while name in taken:
            name += "_"
        taken.add(name)
        return name

    # New nodes go in just before the transpose they replace, except each
    # mask's bias and visible rows, computed once, just after the mask.
    before, after, fused, biases, visible = {}, defaultdict(list), 0, {}, {}
    squeezed = {}  # grouped attention's 5-D masks, made 4-D

    constants = {}

    def constant(key, value):
        if key not in constants:
            constants[key] = fresh(key)
            graph.initializer.append(numpy_helper.from_array(np.asarray(value), constants[key]))
        return constants[key]

    for softmax in [n for n in graph.node if n.op_type == "Softmax"]:
        match = _match_attention(g, softmax, shapes)
        if not grouped and isinstance(match, _Attention) and match.groups > 1:
            match = "grouped-query attention in a decoder with a cache (see fuse_attention)"
        if isinstance(match, str):
            declined.append((softmax.output[0], match))
            continue
        q, k, v, mask, out = match.q, match.k, match.v, match.mask, match.out
        heads, size, groups = match.heads, match.size, match.groups
        labels = ("q", "k", "v", "b", "t", "s", "bias_shape", "bias", "out", "heads", "kept")
        name = {label: fresh(f"{out.output[0]}_mha_{label}") for label in labels}
        # Not [0, 0, -1]: with 0 batch or sequence, -1 cannot be inferred.
        flat = constant(f"mha_flat_{heads * size}", np.array([0, 0, heads * size], np.int64))
        nodes = []
        if groups > 1:  # each key and value head repeated for its G query heads
            repeat = constant(f"mha_groups_{groups}", np.array([1, 1, 1, groups, 1], np.int64))
            axis = constant("mha_group_axis", np.array([3], np.int64))
            repeated = []
            for label, source in (("k", k), ("v", v)):
                wide = fresh(f"{name[label]}_groups")
                nodes += [
                    helper.make_node("Unsqueeze", [source, axis], [f"{wide}_1"]),
                    helper.make_node("Expand", [f"{wide}_1", repeat], [wide]),
                ]
                repeated.append(wide)
            k, v = repeated
        nodes += [
            helper.make_node("Reshape", [source, flat], [name[label]])
            for source, label in ((q, "q"), (k, "k"), (v, "v"))
        ]
        inputs = [name["q"], name["k"], name["v"]]
        anchor = mask  # the mask's own nodes go just after it
        if mask is not None and groups > 1 and len(shapes[mask][0]) == 5:
            # (B or 1, 1, 1, T, S) to (B or 1, 1, T, S), once.
            if mask not in squeezed:
                squeezed[mask] = fresh(f"{mask}_4d")
                axis = constant("mha_head_axis", np.array([1], np.int64))
                after[mask].append(helper.make_node("Squeeze", [mask, axis], [squeezed[mask]]))
            mask = squeezed[mask]
        if mask is not None and mask not in biases:
            biases[mask] = fresh(f"{mask}_bias")
            zero, masked = constant("mha_zero", np.float32(0)), constant("mha_masked", _MASKED)
            after[anchor].append(helper.make_node("Where", [mask, zero, masked], [biases[mask]]))
        bias = biases.get(mask)
        if match.bias is not None:
            # The added bias, scaled and summed with the mask's once for all
            # the layers that read them, before the first of those layers.
            key = (mask, match.bias, match.bias_scale)
            if key not in biases:
                total = match.bias
                if match.bias_scale is not None:
                    factor = constant(
                        f"mha_bias_scale_{match.bias_scale}", np.float32(match.bias_scale)
                    )
                    nodes.append(
                        helper.make_node("Mul", [total, factor], [fresh(f"{total}_scaled")])
                    )
                    total = nodes[-1].output[0]
                if mask is not None:
                    nodes.append(helper.make_node("Add", [bias, total], [fresh(f"{total}_masked")]))
                    total = nodes[-1].output[0]
                biases[key] = total
            bias = biases[key]
        if bias is not None:
            # The bias must be (B or 1, N or 1, T, S): expand what it lacks.
            # Expand broadcasts both ways, so a batch or head axis of the
            # bias's own stays as it is and a missing one becomes B or 1.
            one = constant("mha_one", np.array([1], np.int64))
            batch = one
            if match.bias is None:  # the mask's bias alone: (B, 1, T, S), as before
                nodes.append(helper.make_node("Shape", [q], [name["b"]], start=0, end=1))
                batch = name["b"]
            nodes += [
                helper.make_node("Shape", [q], [name["t"]], start=1, end=2),
                helper.make_node("Shape", [k], [name["s"]], start=1, end=2),
                helper.make_node(
                    "Concat", [batch, one, name["t"], name["s"]], [name["bias_shape"]], axis=0
                ),
                helper.make_node("Expand", [bias, name["bias_shape"]], [name["bias"]]),
            ]
            inputs += ["", "", name["bias"]]
        for reader in match.shape_readers:
            before[reader.output[0]] = _logits_shape(q, k, heads, reader, fresh, constant)
        nodes.append(
            helper.make_node(
                "MultiHeadAttention",
                inputs,
                [name["out"]],
                domain="com.microsoft",
                num_heads=heads,
                scale=match.scale,
            )
        )
        split = constant(f"mha_split_{heads}_{size}", np.array([0, 0, heads, size], np.int64))
        back = split
        if groups > 1:
            kv_heads = heads // groups
            back = constant(
                f"mha_split_{kv_heads}_{groups}_{size}",
                np.array([0, 0, kv_heads, groups, size], np.int64),
            )
        before[out.output[0]] = nodes
        last = helper.make_node("Reshape", [name["out"], back], [])
        if match.zeroes_masked_rows:
            # The fused op gives a query that sees no key the mean of the
            # values (uniform weights); keras.layers.Softmax gives it 0.
            if mask not in visible:
                rank = 4 if mask != anchor else len(shapes[mask][0])
                computed, visible[mask] = _visible_rows(mask, rank, fresh, constant)
                after[anchor] += computed
            nodes.append(helper.make_node("Reshape", [name["out"], split], [name["heads"]]))
            zero = constant("mha_zero", np.float32(0))
            last = helper.make_node("Where", [visible[mask], name["heads"], zero], [])
            if groups > 1:
                last.output.append(name["kept"])
                nodes.append(last)
                last = helper.make_node("Reshape", [name["kept"], back], [])
        last.output.extend(out.output)
        out.CopyFrom(last)
        fused += 1
    if fused:
        sources = {*g.initializers, *(value.name for value in graph.input)}
        nodes = [new for mask in after if mask in sources for new in after[mask]]
        for node in graph.node:
            nodes += [*before.get(node.output[0], []), node]
            nodes += [new for output in node.output for new in after.get(output, [])]
        del graph.node[:]
        graph.node.extend(nodes)
        use_contrib_domain(proto)
    return fused


# What `fuse_gelus` adds by default, each counted in the report's `fused`.
GELU_FUSED = ("Gelu", "BiasGelu", "FastGelu", "QuickGelu")


def _attribute(node, name, default):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


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
    if _attribute(node, "axis", -1) not in (-1, 2):
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


def _guarded(fusion_class, before=None, after=None):
    """`fusion_class` with our own checks around each match, and reasons kept.

    `before(model, node)` may decline a node before ONNX Runtime's matcher sees
    it; `after(model, new_node)` may take back what the matcher made. A match
    is also taken back when a value it removes is a graph output (ONNX
    Runtime's safety check looks only at the nodes that read it).
    """

    class Guarded(fusion_class):
        def fuse(self, node, input_name_to_nodes, output_name_to_node):
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


def _is_scalar(g, name, value, tolerance=0.0):
    """Whether `name` is a constant holding one value within `tolerance` of `value`."""
    constant = g.const(name)
    if constant is None or constant.size != 1:
        return False
    return abs(float(constant.reshape(-1)[0]) - value) <= tolerance


def _constant_input(g, node, value, tolerance=0.0):
    """The input of the binary `node` that is not the scalar constant `value`, or None."""
    name = next((i for i in node.input if _is_scalar(g, i, value, tolerance)), None)
    return None if name is None else g.other_input(node, name)


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
    root = _constant_input(g, scaled, -(0.5**0.5), 1e-6)
    if root is None:
        negated = _constant_input(g, scaled, 0.5**0.5, 1e-6)
        neg = None if negated is None else g.node(negated, "Neg")
        if neg is None or not g.only_used_by(negated):
            return "the erf's input is not -x / sqrt(2)"
        root = neg.input[0]
    if not g.only_used_by(erf.output[0]):
        return "the erf is read by more than one node"
    (sub,) = g.consumers[erf.output[0]]
    if sub.op_type != "Sub" or sub.input[1] != erf.output[0] or not _is_scalar(g, sub.input[0], 1):
        return "the erf is not subtracted from 1"
    if not g.only_used_by(sub.output[0]):
        return "1 - erf is read by more than one node"
    (product,) = g.consumers[sub.output[0]]
    half = product.op_type == "Mul" and g.node(g.other_input(product, sub.output[0]), "Mul")
    if not half or _constant_input(g, half, 0.5) != root or not g.only_used_by(half.output[0]):
        return "the result is not 0.5 * x * (1 - erf)"
    return root, product


def fuse_erfc_gelus(proto, declined: list | None = None) -> int:
    """Replace TensorFlow's exact GELU (see `_match_erfc_gelu`) by `com.microsoft.Gelu`."""
    declined = [] if declined is None else declined
    g = _Graph(proto.graph)
    fused = 0
    for erf in [n for n in proto.graph.node if n.op_type == "Erf"]:
        match = _match_erfc_gelu(g, erf)
        if isinstance(match, str):
            declined.append((erf.output[0], f"Erf: {match}"))
            continue
        x, product = match
        # The other nodes of the pattern are left unread: dead-node removal drops them.
        product.CopyFrom(
            helper.make_node("Gelu", [x], list(product.output), domain="com.microsoft")
        )
        fused += 1
    return fused


def _sort_topologically(graph) -> None:
    """Order `graph.node` so every value is made before it is read; among the
    ready nodes, the one listed first goes first (ONNX Runtime's fusions append
    the nodes they make at the end)."""
    import heapq

    nodes = list(graph.node)
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    readers, waiting = defaultdict(list), []
    for i, node in enumerate(nodes):
        needs = {producer[n] for n in [*node.input, *_body_reads(node)] if n in producer} - {i}
        waiting.append(len(needs))
        for j in needs:
            readers[j].append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for j in readers[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(nodes):
        raise ValueError("the graph has a cycle")
    del graph.node[:]
    graph.node.extend(order)


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
    CPU session fuses the tanh GELU itself, not the erfc one (measured, 1.32:
    BiasGelu 2x faster than the 7 nodes at (8, 128, 1024)).

    `skip_norms` is off by default because ONNX Runtime's CPU
    SkipLayerNormalization kernel is slower than the `Add` and
    `LayerNormalization` it replaces (measured, 1.32, float32, 1 thread:
    8 of them take 10.2 ms against 1.8 ms at (8, 128, 256), 28 ms against
    5 ms at (8, 128, 768); end to end, keras-hub BERT 4 layers 256 wide is
    15% slower with them: 7.0 ms against 5.9 ms at (1, 128), 57 ms against
    48 ms at (8, 128)). Its CUDA kernel is another matter.

    Dead nodes are dropped first: the LayerNorm fusion leaves the old
    decomposition reading the residual sum, and ONNX Runtime's skip fusion
    would keep that sum as an extra output. The skip fusion needs symbolic
    shape inference (both addends 3-D of one shape); where that fails, it
    declines. Returns {op type: nodes of it added}, keys `GELU_FUSED` (and
    "SkipLayerNormalization" with `skip_norms`); `declined`, when given, gets
    (node output, reason) for each candidate left alone.
    """
    import contextlib
    import io

    from keras_layers.export.slimming import remove_dead_nodes

    kinds = (*GELU_FUSED, "SkipLayerNormalization") if skip_norms else GELU_FUSED
    counts = dict.fromkeys(kinds, 0)
    declined = [] if declined is None else declined
    try:  # (it appends its folder to sys.path: its modules import each other by bare name)
        from onnxruntime.transformers import (
            fusion_biasgelu,
            fusion_fastgelu,
            fusion_gelu,
            fusion_quickgelu,
            fusion_skiplayernorm,
            onnx_model,
        )
    except ImportError as error:
        declined.append(("", f"onnxruntime.transformers cannot be imported: {error}"))
        return counts
    remove_dead_nodes(proto)
    before = {op: sum(n.op_type == op for n in proto.graph.node) for op in kinds}
    fuse_erfc_gelus(proto, declined)
    remove_dead_nodes(proto)
    model = onnx_model.OnnxModel(proto)
    skip = fusion_skiplayernorm
    # (fusion, its arguments, an op the graph must hold for it to find anything)
    steps = [
        (_guarded(fusion_gelu.FusionGelu), (), "Erf"),
        (_guarded(fusion_fastgelu.FusionFastGelu), (), "Tanh"),
        (_guarded(fusion_quickgelu.FusionQuickGelu), (), "Sigmoid"),
    ]
    if skip_norms:
        skip_norm = _guarded(skip.FusionSkipLayerNormalization, _skip_norm_declines)
        steps.append((skip_norm, (), "LayerNormalization"))
    steps += [
        (_guarded(fusion_biasgelu.FusionBiasGelu, after=_bias_declines), (True,), "FastGelu"),
        (_guarded(fusion_biasgelu.FusionBiasGelu, after=_bias_declines), (False,), "Gelu"),
    ]
    if skip_norms:
        bias_skip = _guarded(skip.FusionBiasSkipLayerNormalization, after=_bias_declines)
        steps.append((bias_skip, (), "SkipLayerNormalization"))
    outputs = {value.name for value in proto.graph.output}
    for fusion_class, arguments, needed in steps:
        # ONNX Runtime's constant lookups list every node each time, so a pass
        # costs time quadratic in the graph's size (12 s at 10,000 nodes):
        # none is run that cannot match.
        if not model.get_nodes_by_op_type(needed):  # subgraphs' nodes too
            continue
        # Its shape inference prints, rather than logs, when it fails.
        with contextlib.redirect_stdout(io.StringIO()):
            fusion = fusion_class(model, *arguments)
        fusion.graph_outputs = outputs
        # A QuickGelu reason for every Mul would drown the others.
        fusion.declined = None if "QuickGelu" in fusion_class.__name__ else declined
        fusion.apply()
    _sort_topologically(proto.graph)
    for op in kinds:
        counts[op] = sum(n.op_type == op for n in proto.graph.node) - before[op]
    if any(counts.values()):
        use_contrib_domain(proto)
    return counts
