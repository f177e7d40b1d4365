"""Dense on a 3-D input: TensorFlow's `Tensordot` detour folded into one `MatMul`.

tf2onnx writes every `Dense` on a 3-D input as Shape, Reshape to 2-D, MatMul,
Gather, Concat, Cast and Reshape back. ONNX MatMul broadcasts over leading
axes, so the 2-D detour and the shape arithmetic that undoes it are not
needed. Where every axis but the batch is static (a ViT's 197 patches and
its class token), TensorFlow writes the way back as a constant,
`[-1, 197, n]`, and the rule reads x's inferred shape instead. Left as it
was, the detour keeps the `Dense` bias's `Add` a `Reshape` away from its
MatMul, and out of the GELU after it (`BiasGelu`).
"""

from onnx import helper

from keras_layers.export.passes.context import Context, PassResult
from keras_layers.export.passes.fusions.pattern import Rule, perm, run_rule

MAKES = ("MatMul",)


def _match_tensordot(g, reshape):
    """(x, weight, reshape) for one detour ending at `reshape`, None where
    `reshape` ends none, or why a constant way back was not proven to be x's
    leading axes."""
    matmul = g.node(reshape.input[0], "MatMul")
    if matmul is None or not g.only_used_by(matmul.output[0]):
        return None
    shape = _matrix_shape(g, matmul.input[1])
    flatten = g.node(matmul.input[0], "Reshape")
    if shape is None or flatten is None:
        return None
    target = g.const(flatten.input[1])
    if target is None or target.tolist() != [-1, shape[0]]:
        return None
    x, back = flatten.input[0], reshape.input[1]
    found = x, matmul.input[1], reshape
    if _is_leading_shape_plus(g, back, x, shape[1]):
        return found
    if g.const(back) is None:
        return None
    if g.shapes.get(x) is None:
        return "x's shape is not inferred: a constant way back cannot be read as its leading axes"
    # Any other constant is a reshape of its own (not a Dense's), and no candidate.
    return found if _is_static_leading_shape_plus(g, back, x, shape) else None


def _matrix_shape(g, name):
    """Shape of a constant matrix, of `Cast(matrix)` (a weight kept in half
    precision, `weight_views`), or of `Transpose(matrix)` (a tied weight)."""
    shape = g.const_shape(name)
    if shape is not None:
        return shape if len(shape) == 2 else None
    cast = g.node(name, "Cast")
    if cast is not None:
        return _matrix_shape(g, cast.input[0])
    transpose = g.node(name, "Transpose")
    if transpose is None:
        return None
    shape = g.const_shape(transpose.input[0])
    if shape is None or len(shape) != 2 or perm(transpose) not in (None, [1, 0]):
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


def _is_static_leading_shape_plus(g, name, x, matrix):
    """Whether `name` is a constant that equals `shape(x)[:-1] + [n]` for the
    (d, n) `matrix`, by x's inferred shape: x's last axis d, each axis
    between its first and last static and written as it is, and the first
    written as it is or as -1, which then takes the batch back (the
    product's rows over the other axes' sizes)."""
    target, dims = g.const(name), g.shapes.get(x, (None,))[0]
    if target is None or dims is None or len(dims) < 2 or target.size != len(dims):
        return False
    rows, columns = matrix
    first, *middle, last = target.reshape(-1).tolist()
    if dims[-1] != rows or last != columns:
        return False
    if not all(isinstance(dim, int) and dim > 0 for dim in dims[1:-1]):
        return False
    return middle == list(dims[1:-1]) and (first == -1 or first == dims[0])


def _rewrite(edit, match):
    x, weight, reshape = match
    edit.replace(reshape, [helper.make_node("MatMul", [x, weight], [])])


# Every Reshape is a candidate and most are none, so a failed match says
# nothing, except a Dense's detour whose x has no inferred shape.
RULE = Rule(
    makes="MatMul",
    anchor="Reshape",
    form="Reshape(MatMul(Reshape(x, [-1, d]), W), concat(shape(x)[:-1], [n]) or its constant)",
    match=_match_tensordot,
    rewrite=_rewrite,
)


def run(proto, context: Context) -> PassResult:
    """`Reshape(MatMul(Reshape(x, [-1, d]), W), shape(x)[:-1] + [n])` -> `MatMul(x, W)`.

    Args:
        proto: the ModelProto, rewritten in place.
        context: its `shapes`, where inferred: the static axes a constant
            way back is checked against (without them, only the computed
            way back is matched).

    Returns:
        How many were replaced, under "MatMul".
    """
    return run_rule(RULE, proto, context.shapes)
