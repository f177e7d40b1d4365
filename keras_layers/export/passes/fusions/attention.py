"""Scaled dot-product attention as Keras writes it, matched around its `Softmax`.

The pieces every attention form shares (the probabilities' reader, the
mask's selects, the scaled q.k^T product, a bias added to the logits) and the
match of the plain (batch, sequence, heads, head size) form; the grouped
form reuses the pieces (`grouped_attention`), and `multi_head_attention`
rewrites either into ONNX Runtime's `MultiHeadAttention`.
"""

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from keras_layers.export.passes.fusions import pattern

# Masked logits get this additive bias where Keras selects 0.7 x the float32
# maximum (-2.4e38) instead of the logit. Adding it to any logit below 1e31 in
# magnitude rounds to exactly this value, so a row with every position masked
# is uniform as in Keras, whatever its logits, and a masked position in any
# other row gets exp(-3e38 - max) = 0, as it does in Keras. A bias of the size
# attention masks usually get would not do: -1e9 + 40 rounds to -1e9 + 64, so
# in a fully masked row the largest logit would win.
MASKED = np.float32(-3e38)
HEADS_FIRST = [0, 2, 1, 3]
# Why a softmax whose probabilities no MatMul reads is left alone.
NOT_ATTENTION = "a softmax that no MatMul reads: not an attention"
RESHAPED = (
    "the probabilities reach their MatMul through a reshape: attention on inputs of rank above 3"
)


def transposed(g, name, perm):
    """The input of `Transpose(x, perm)` producing `name`. Other nodes may read
    the transpose too (DeBERTa's relative terms read the key's): the fused op
    reads `x`, and the transpose stays for them. A `Reshape` that computes
    that transpose counts too (see `_reshape_is_transpose`).

    Args:
        g: the `Graph`.
        name: the transposed tensor.
        perm: the transpose wanted.

    Returns:
        x's name, or None.
    """
    node = g.node(name, "Transpose")
    if node is None:
        reshape = g.node(name, "Reshape")
        if reshape is not None and _reshape_is_transpose(g, reshape, perm):
            return reshape.input[0]
        return None
    if pattern.perm(node) != perm:
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


def heads_first(g, name):
    """(x, G) when `name` is x (B, S, K, H) made heads-first, (B, K * G, S, H),
    each of its K heads repeated G times in a row; None otherwise.

    G is 1 for a plain `Transpose(x, [0, 2, 1, 3])`. keras-hub's Gemma 3n
    repeats key and value heads for grouped-query attention as Hugging Face's
    `repeat_kv` does: `Reshape(Tile(Unsqueeze(y, [2, 3]), [1, 1, 1, G, 1, 1]),
    (B, K * G, S, H))` of the heads-first y, so that head k * G + g reads head
    k, the order `MultiHeadAttention`'s rewrite repeats them in.

    Args:
        g: the `Graph`.
        name: the heads-first tensor.

    Returns:
        (x, G), or None.
    """
    x = transposed(g, name, HEADS_FIRST)
    if x is not None:
        return x, 1
    reshape = g.node(name, "Reshape")
    tile = reshape and g.node(reshape.input[0], "Tile")
    unsqueeze = tile and g.node(tile.input[0], "Unsqueeze")
    if not unsqueeze or len(unsqueeze.input) != 2:
        return None
    axes, repeats = g.const(unsqueeze.input[1]), g.const(tile.input[1])
    if axes is None or repeats is None or axes.reshape(-1).tolist() != [2, 3]:
        return None
    repeats = repeats.reshape(-1).tolist()
    if len(repeats) != 6 or repeats[:3] != [1, 1, 1] or repeats[4:] != [1, 1]:
        return None
    y = unsqueeze.input[0]
    x = transposed(g, y, HEADS_FIRST)
    dims = g.shapes.get(y, (None,))[0]
    if x is None or dims is None or len(dims) != 4:
        return None
    kv_heads, size, groups = dims[1], dims[3], repeats[3]
    if not (isinstance(kv_heads, int) and isinstance(size, int) and groups >= 1):
        return None
    if not _is_shape_of(g, reshape.input[1], [(y, 0), kv_heads * groups, (y, 2), size]):
        return None
    return x, groups


def _skip_casts(g, name):
    node = g.producer.get(name)
    while node is not None and node.op_type == "Cast":
        node = g.producer.get(node.input[0])
    return node


def _axis_of_shape(g, name):
    """(x, axis) when `name` is one dim of `Shape(x)` (through casts, a
    one-element Slice or a Gather of one index), else None."""
    node = _skip_casts(g, name)
    if node is None or node.op_type not in ("Slice", "Gather"):
        return None
    index = g.const(node.input[1])
    if index is None or index.size != 1:
        return None
    index = int(index.reshape(-1)[0])
    if node.op_type == "Slice":
        # ends [index + 1]; axes, if given, [0]; steps, if given, [1]
        for position, wanted in ((2, index + 1), (3, 0), (4, 1)):
            given = node.input[position] if len(node.input) > position else ""
            value = g.const(given) if given else np.array([wanted])
            if value is None or value.reshape(-1).tolist() != [wanted]:
                return None
    elif pattern.attribute(node, "axis", 0) != 0:
        return None
    source = _skip_casts(g, node.input[0])
    if source is None or source.op_type != "Shape" or index < 0:
        return None
    if pattern.attribute(source, "end", None) is not None:
        return None
    return source.input[0], pattern.attribute(source, "start", 0) + index


def _is_shape_of(g, target, wanted: list) -> bool:
    """Whether the reshape target `target` is, entry by entry, `wanted`: an
    int (a constant) or (x, axis), that dim of x, read off `Shape(x)`. In a
    constant target, 0 in first place stands for x's axis 0 (the reshaped
    tensor has x's batch there) and -1 for a dim of x (the one left, once
    the other entries, exact, are divided out)."""
    const = g.const(target)
    if const is not None:
        values = const.reshape(-1).tolist()
        if len(values) != len(wanted) or values.count(-1) > 1:
            return False
        return all(
            value == want
            if isinstance(want, int)
            else value == -1 or (value == 0 and want[1] == position == 0)
            for position, (value, want) in enumerate(zip(values, wanted, strict=True))
        )
    concat = _skip_casts(g, target)
    if concat is None or concat.op_type != "Concat":
        return False
    parts = []
    for part in concat.input:
        value = g.const(part)
        if value is not None:
            parts += value.reshape(-1).tolist()
        else:
            parts.append(_axis_of_shape(g, part))
    return parts == wanted


@dataclass
class Attention:
    """One matched attention: what `MultiHeadAttention` needs to replace it."""

    q: str
    k: str
    v: str
    mask: str | tuple | None  # a tuple: masked where any of them masks
    scale: float
    heads: int
    size: int
    out: object  # the Transpose node whose output the fused nodes take over
    zeroes_masked_rows: bool  # keras.layers.Softmax's path, see `probabilities_reader`
    bias: tuple | None = None  # terms added to the logits, times `bias_scale` if set
    bias_scale: float | None = None
    shape_readers: tuple = ()  # `Shape` nodes of the (B, N, T, S) logits
    groups: int = 1  # query heads per key/value head, see `heads_first`, `grouped_attention`
    five_d: bool = False  # q and the output (B, T, K, G, H), see `grouped_attention`
    sinks: np.ndarray | None = None  # (N,) logits whose probability weighs no value
    mask_rank: int = 0  # the mask's rank where shape inference tells it
    # The constant biases q, k and v were projected with (None for one without),
    # which the fused op adds: q, k and v are then the products before them.
    projection_biases: tuple = (None, None, None)


def probabilities_reader(g, softmax):
    """The `MatMul` that weighs the values by the softmax, and what lies between.

    Keras reaches the softmax two ways. `ops.dot_product_attention` (dropout 0)
    feeds it straight to the matmul. `MultiHeadAttention` with dropout, and
    layers such as keras-hub's `LlamaAttention`, call `keras.layers.Softmax`
    with the mask, which selects -1e9 at masked logits and then selects 0 at
    masked probabilities: `Where(mask, Softmax(...), 0)`. That second select
    only changes rows whose every key is masked (uniform -> 0), so the fused
    op gets the same and those rows are zeroed after it
    (`multi_head_attention._visible_rows`). GPT-OSS drops a sink's column
    from the probabilities first (`Slice(p, 0, -1)` on the last axis, see
    `_sink_column`). Without a mask, tf2onnx's transpose optimizer moves the
    einsum path's transposed product past the softmax (see `_swapped_softmax`).

    Args:
        g: the `Graph`.
        softmax: the Softmax node.

    Returns:
        (matmul, zeroing Where or None, whether a last column was dropped,
        the Transpose after a softmax over axis 2 or None), or a reason.
    """
    if not reaches_a_matmul(g, softmax.output[0]):
        return NOT_ATTENTION
    swapped = None
    if not _over_last_axis(g, softmax):
        swapped = _swapped_softmax(g, softmax)
        if isinstance(swapped, str):
            return swapped
    if not g.only_used_by(softmax.output[0]):
        return "the probabilities are a model output or read by more than one node"
    probabilities = (softmax if swapped is None else swapped).output[0]
    if swapped is not None and not g.only_used_by(probabilities):
        return "the transposed probabilities are a model output or read by more than one node"
    (reader,) = g.consumers[probabilities]
    zeroing = None
    if reader.op_type == "Where":
        zero = g.const(reader.input[2])
        if reader.input[1] != probabilities or zero is None or zero.size != 1 or zero.any():
            return "the select after the softmax does not set masked probabilities to 0"
        if not g.only_used_by(reader.output[0]):
            return "the selected probabilities are read by more than one node"
        zeroing, (reader,) = reader, g.consumers[reader.output[0]]
    source = zeroing.output[0] if zeroing is not None else probabilities
    plain = zeroing is None and swapped is None
    sliced = reader.op_type == "Slice" and plain and _drops_last_column(g, reader)
    if sliced:
        if not g.only_used_by(reader.output[0]):
            return "the probabilities without the sink are read by more than one node"
        source, (reader,) = reader.output[0], g.consumers[reader.output[0]]
    if reader.op_type in ("Reshape", "Squeeze", "Unsqueeze"):
        # Keras' einsums with more than one batch axis, which the trace
        # leaves to tf2onnx (MultiHeadAttention on inputs of rank above 3)
        return RESHAPED
    if reader.op_type != "MatMul" or reader.input[0] != source:
        return "the probabilities do not weigh the values in a MatMul"
    return reader, zeroing, sliced, swapped


def reaches_a_matmul(g, name, steps=3) -> bool:
    """Whether a `MatMul` reads `name`, directly or through up to `steps` of
    the nodes that stand between a softmax and its values in the forms we
    know (selects, transposes, slices) and in tf2onnx's einsums (reshapes,
    squeezes). A softmax that none reads (a classifier's output, a
    mixture-of-experts router's) is no attention.

    Args:
        g: the `Graph`.
        name: the tensor, a softmax's output.
        steps: how many nodes may stand between.

    Returns:
        True or False.
    """
    between = ("Where", "Transpose", "Slice", "Reshape", "Squeeze", "Unsqueeze")
    for reader in g.consumers[name]:
        if reader.op_type == "MatMul":
            return True
        if steps and reader.op_type in between and reaches_a_matmul(g, reader.output[0], steps - 1):
            return True
    return False


def _over_last_axis(g, softmax) -> bool:
    """Whether `softmax` normalises its input's last axis. Its axis is -1
    (the default) or, counted from the front, its input's rank less one:
    axis 3 of a 5-D grouped product would normalise the queries."""
    axis = pattern.attribute(softmax, "axis", -1)
    return axis == -1 or axis == g.ranks.get(softmax.input[0], 0) - 1


def _swapped_softmax(g, softmax):
    """The `Transpose(Softmax(x, axis=2), [0, 1, 3, 2])` after `softmax`, or why
    the softmax is not over the last axis.

    Keras' einsum path (`MultiHeadAttention` with dropout) writes the logits as
    `Transpose(MatMul(k^T, q^T), [0, 1, 3, 2])` (see `_product`). Where no
    select stands between them and the softmax, tf2onnx's transpose
    optimizer moves that transpose after the softmax and makes the softmax's
    axis 2, the axis the transpose will make the last (ONNX's `Softmax`
    normalises one axis since opset 13; the fused op needs 15). So
    `Transpose(Softmax(x, 2), [0, 1, 3, 2])` is `Softmax(Transpose(x, [0, 1, 3, 2]))`:
    the logits are x transposed, and `match_plain` reads x as the product
    the transpose was taken of.
    """
    axis, rank = pattern.attribute(softmax, "axis", -1), g.ranks.get(softmax.input[0])
    if rank is None:
        return f"the softmax is over axis {axis} of a tensor of unknown rank, not surely the last"
    readers = g.consumers[softmax.output[0]]
    swap = readers[0] if len(readers) == 1 and readers[0].op_type == "Transpose" else None
    if rank != 4 or axis not in (2, -2) or swap is None or pattern.perm(swap) != [0, 1, 3, 2]:
        return (
            f"the softmax is over axis {axis} of a rank-{rank} tensor, not the last, and no "
            "transpose of the last two axes follows it"
        )
    return swap


def _drops_last_column(g, node) -> bool:
    """Whether the Slice `node` is x[..., 0:-1] on the last axis (of 4)."""
    if len(node.input) < 4 or not node.input[3]:
        return False  # no axes: a slice of the first axis
    starts, ends, axes = (g.const(name) for name in node.input[1:4])
    steps = g.const(node.input[4]) if len(node.input) > 4 and node.input[4] else np.ones(1)
    if any(value is None for value in (starts, ends, axes, steps)):
        return False
    return (
        starts.reshape(-1).tolist() == [0]
        and ends.reshape(-1).tolist() == [-1]
        and axes.reshape(-1).tolist() in ([3], [-1])
        and steps.reshape(-1).tolist() == [1]
    )


def _sink_column(g, softmax, shape_readers: list):
    """(logits, sinks) when the softmax reads `Concat([logits, column], -1)`,
    less its row maximum or not (which changes no softmax), with the column
    one wide and a constant (1, N, 1, 1) broadcast: GPT-OSS's attention
    sinks, a learned logit per head whose probability weighs no value. The
    sinks are (N,) float32; `Shape` readers of the logits join
    `shape_readers`. Else a reason."""
    name = softmax.input[0]
    sub = g.node(name, "Sub")
    if sub is not None:
        top = g.node(sub.input[1], "ReduceMax")
        if top is None or top.input[0] != sub.input[0] or not g.only_used_by(name):
            return "the softmax reads a difference that is not its input less its maximum"
        if not g.only_used_by(sub.input[0], 2) or pattern.attribute(top, "keepdims", 1) != 1:
            return "the softmax reads a difference that is not its input less its maximum"
        axes = g.const(top.input[1]) if len(top.input) > 1 else None
        if axes is None or axes.reshape(-1).tolist() not in ([3], [-1]):
            return "the maximum subtracted is not over the last axis"
        name = sub.input[0]
    elif not g.only_used_by(name):
        return "the softmax's input is read by more than one node"
    concat = g.node(name, "Concat")
    if concat is None or pattern.attribute(concat, "axis", 0) not in (3, -1):
        return "a column is dropped from probabilities not computed with a sink"
    if len(concat.input) != 2:
        return "a column is dropped from probabilities not computed with a sink"
    logits, column = concat.input
    expand = g.node(column, "Expand")
    sinks = g.const(expand.input[0] if expand is not None else column)
    width = g.shapes.get(column, (None,))[0]
    if sinks is None or sinks.ndim != 4 or sinks.shape[0] != 1 or sinks.shape[2:] != (1, 1):
        return "the sink column is not a constant (1, heads, 1, 1)"
    if width is None or len(width) != 4 or width[-1] != 1 or sinks.dtype != np.float32:
        return "the sink column is not one float32 column"
    found = []
    if not _sole_reader(g, logits, found):
        return "the logits beside the sinks are read by more than one node"
    shape_readers += found
    return logits, sinks.reshape(-1)


def attention_mask(g, masked, zeroing, shape_readers=None):
    """The boolean mask selected into the logits `masked`, and the logits before it.

    A select value from -1e9 down masks completely: Keras selects -1e9
    (`keras.layers.Softmax`) or -2.4e38 (`ops.dot_product_attention`), and
    exp(-1e9 - max) is 0 for any logit above -9e8. GPT-OSS's sliding-window
    layers select twice, `Where(m1, Where(m2, x, -big), -big)` with one fill:
    masked where either is; the mask is then the tuple of both (not with a
    zeroing select).
    `Shape` readers of the masked logits join `shape_readers` when it is a
    list (see `_sole_reader`).

    Args:
        g: the `Graph`.
        masked: the masked logits the softmax reads.
        zeroing: the select after the softmax, or None.
        shape_readers: a list to add `Shape` readers to, or None.

    Returns:
        (mask, logits), the mask a name, a tuple of names or None; or a reason.
    """
    where = g.node(masked, "Where")
    if where is None:
        if zeroing is not None:
            return "the probabilities are zeroed where no mask selected the logits"
        return None, masked
    masks, fills = [], set()
    while where is not None:
        big = g.const(where.input[2])
        if not _sole_reader(g, where.output[0], shape_readers if not masks else None):
            return "the masked logits are read elsewhere or the select value is not a constant"
        if big is None or big.size != 1:
            return "the masked logits are read elsewhere or the select value is not a constant"
        if not np.isfinite(big).all() or big.max() > -1e9:
            return f"the select value {big.max()} does not mask completely"
        masks.append(where.input[0])
        fills.add(float(big.reshape(-1)[0]))
        logits = where.input[1]
        where = g.node(logits, "Where") if zeroing is None else None
    if len(fills) > 1:
        # A row every mask blanks is uniform over the columns holding the
        # larger fill in Keras; the fused op's one bias would spread it wider.
        return "the selects fill masked logits with different values"
    if zeroing is not None and zeroing.input[0] != masks[0]:
        return "the selects before and after the softmax read different masks"
    return (masks[0] if len(masks) == 1 else tuple(masks)), logits


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


def scaled(g, name, shape_readers=None):
    """x and the scalar for `Mul(x, scalar)` producing `name`.

    The scalar is a constant, or computed from static dims (`static_value`).

    Args:
        g: the `Graph`.
        name: the product.
        shape_readers: a list to add `Shape` readers of `name` to, or None
            (then `name` must have one reader, see `_sole_reader`).

    Returns:
        (x, scale), or (name, None) when `name` is no such product.
    """
    mul = g.node(name, "Mul")
    if mul is None:
        return name, None
    found = []
    if not _sole_reader(g, name, found if shape_readers is not None else None):
        return name, None
    for x in mul.input:
        other = g.other_input(mul, x)
        value = pattern.static_value(g, other)  # a constant, or one computed from static dims
        if other != x and value is not None and value.size == 1 and value.dtype.kind == "f":
            if shape_readers is not None:
                shape_readers += found
            return x, float(value.reshape(-1)[0])
    return name, None


def _product(g, name, shape_readers: list | None, swapped_after=False):
    """(q, k, scale factors, G) for a q.k^T product, scaled or not, producing
    `name`, q (B, T, N, H) and k (B, S, N / G, H), each head of k repeated G
    times in a row (see `heads_first`); or a reason. `Shape` nodes reading the (B, N, T, S)
    tensors on the way go to `shape_readers` (see `_sole_reader`).

    The trace of `ops.dot_product_attention` writes `MatMul(q^T, k^T)`;
    `MultiHeadAttention`'s einsum path scales the query first and tf2onnx
    lowers `einsum("aecd,abcd->acbe", key, query)` to
    `Transpose(MatMul(k^T, (q*scale)^T), [0, 1, 3, 2])`; keras-hub's GPT-NeoX
    scales the product inside that transpose. Each scalar `Mul` on the way is
    one of the factors. With `swapped_after`, `name` is that transpose's
    input, the transpose taken after the softmax (see `_swapped_softmax`).
    """
    name, outer = scaled(g, name, shape_readers)
    if not _sole_reader(g, name, shape_readers):
        return "the logits are read by more than one node"
    middle = None
    swapped = None if swapped_after else g.node(name, "Transpose")
    if swapped is not None or swapped_after:
        inside = name
        if swapped is not None:
            if pattern.perm(swapped) != [0, 1, 3, 2] or not g.only_used_by(swapped.input[0]):
                return "the logits are not a transposed product"
            inside = swapped.input[0]
        inside, middle = scaled(g, inside)
        product = g.node(inside, "MatMul")
        if product is None or not g.only_used_by(inside):
            return "the logits are not a transposed product"
        q_side, q_perm = product.input[1], [0, 2, 3, 1]
        found = heads_first(g, product.input[0])
    else:
        product = g.node(name, "MatMul")
        if product is None:
            return "the logits are not a MatMul"
        q_side, q_perm = product.input[0], HEADS_FIRST
        k = transposed(g, product.input[1], [0, 2, 3, 1])
        found = (k, 1) if k is not None else None
        last_two = g.node(product.input[1], "Transpose")  # k heads-first, then (H, S)
        if found is None and last_two is not None and pattern.perm(last_two) == [0, 1, 3, 2]:
            found = heads_first(g, last_two.input[0])
    q = transposed(g, q_side, q_perm)
    if q is None or found is None:
        return "the query and key do not reach the product through heads-first transposes"
    q, inner = scaled(g, q)
    k, groups = found
    return q, k, [outer, middle, inner], groups


def combined_scale(factors: list):
    """The product of the scalar factors found (None: no factor), or why the
    fused op cannot take it: `MultiHeadAttention` reads scale=0 as "not set"
    and uses 1/sqrt(H)."""
    found = [factor for factor in factors if factor is not None]
    scale = float(np.prod(np.float32(found))) if found else 1.0
    if not scale or not np.isfinite(scale):
        return "the logits are not scaled by a finite, nonzero constant"
    return scale


def _sum_terms(g, name) -> list:
    """The terms of the tree of `Add`s producing `name`: an inner `Add` is part
    of the tree where its parent alone reads it."""
    terms = []
    for side in g.producer[name].input:  # Add(b, b) is two terms: 2b
        if g.node(side, "Add") is not None and g.only_used_by(side):
            terms += _sum_terms(g, side)
        else:
            terms.append(side)
    return terms


def _attention_logits(g, logits, shapes):
    """(q, k, scale, bias terms, bias scale) for logits
    `scale * q.k^T + bias_scale * sum(bias terms)`, bias terms and bias scale
    None where there is none; or a reason.

    The logits are a `_product`, up to float rounding where the scale is
    applied, as `MultiHeadAttention` computes them; or such a product plus
    float32 tensors of rank up to 4 that broadcast to (B, N, T, S) (T5's
    relative position bias, Bloom's and Falcon's ALiBi, DeBERTa's
    disentangled terms, XLNet's position and segment terms, summed in a tree
    of `Add`s), added before or after the scale: keras-hub's Falcon writes
    `(q.k^T + alibi) * scale`, which `MultiHeadAttention` computes as
    `scale * q.k^T + (scale * alibi)`, its `attention_bias`.
    """
    readers = []  # `Shape` nodes reading the logits, see `_sole_reader`
    name, outer = scaled(g, logits, readers)
    add = g.node(name, "Add")
    bias = None
    if add is None:
        found = _product(g, logits, readers)
    else:
        if not g.only_used_by(name):
            return "the biased logits are read by more than one node"
        reasons = []
        terms = _sum_terms(g, name)
        for position, term in enumerate(terms):
            term_readers = []
            found = _product(g, term, term_readers)
            if not isinstance(found, str):
                bias = tuple(terms[:position] + terms[position + 1 :])
                readers += term_readers
                break
            reasons.append(found)
        else:  # the term that is a product of some kind says why it is not ours
            found = min(reasons, key=lambda reason: reason == "the logits are not a MatMul")
        for term in bias or ():
            dims, elem_type = shapes.get(term, (None, None))
            if dims is None or len(dims) > 4 or elem_type != TensorProto.FLOAT:
                return "the bias added to the logits is not float32 of known rank up to 4"
            if len(dims) == 4 and isinstance(dims[0], int) and dims[0] > 1:
                return "the bias added to the logits has a fixed batch"
    if isinstance(found, str):
        return found
    q, k, factors, groups = found
    if bias is not None:
        factors = [*factors, outer]
    scale = combined_scale(factors)
    if isinstance(scale, str):
        return scale
    return q, k, scale, bias, (outer if bias is not None else None), readers, groups


def _swapped_logits(g, logits):
    """As `_attention_logits` for the logits of a softmax over axis 2 that a
    transpose follows (see `_swapped_softmax`): `logits` is then
    `[s *] MatMul(k^T, q^T)`, (B, N, S, T), with no mask or bias. A select or
    a bias there would be transposed too; no Keras form writes one, so
    either is declined."""
    if g.node(logits, "Where") is not None:
        return "a mask selects logits that the softmax reads transposed"
    if g.node(scaled(g, logits)[0], "Add") is not None:
        return "a bias is added to logits that the softmax reads transposed"
    found = _product(g, logits, None, swapped_after=True)
    if isinstance(found, str):
        return found
    q, k, factors, groups = found
    scale = combined_scale(factors)
    if isinstance(scale, str):
        return scale
    return q, k, scale, None, None, [], groups


def _attention_heads(shapes, q, k, v, out, groups=1):
    """(heads, head size) when q, k, v and the output are float32 (B, T, N, H),
    k and v with N / `groups` heads; or a reason."""
    known = [shapes.get(name) for name in (q, k, v, out)]
    if any(info is None or len(info[0]) != 4 for info in known):
        return "q, k, v or the output has no known rank 4"
    if any(info[1] != 1 for info in known):
        return "not float32: ONNX Runtime's CPU MultiHeadAttention is float32"
    heads, size = known[0][0][2:]
    if not isinstance(heads, int) or not isinstance(size, int):
        return "the number of heads or the head size is not static"
    if heads % groups or [info[0][2:] for info in known[1:]] != [
        [heads // groups, size],
        [heads // groups, size],
        [heads, size],
    ]:
        return "q, k, v and the output differ in heads or head size"
    return heads, size


def match_plain(g, softmax, pv, zeroing, out, sliced=False, swapped=None):
    """Match the (B, T, N, H) form around `softmax`, whose probabilities `pv`
    weighs (after `zeroing`, or with a sink's column dropped when `sliced`,
    or transposed by `swapped`, see `probabilities_reader`) and `out`
    transposes: an `Attention`, or why not.

    `Transpose(MatMul([Where(mask, ] Softmax([Where(mask,] logits [, -big)])
    [, 0)], v^T))` with the logits of `_attention_logits` and q, k, v of shape
    (B, T, N, H) in float32; GPT-OSS's softmax reads its masked logits
    beside a column of sinks (`_sink_column`).

    Args:
        g: the `Graph`.
        softmax: the Softmax node.
        pv: the MatMul weighing the values.
        zeroing: the select after the softmax, or None.
        out: the node after `pv`.
        sliced: whether a sink's column was dropped before `pv`.
        swapped: the Transpose after a softmax over axis 2, or None.

    Returns:
        An `Attention`, or a reason.
    """
    shapes = g.shapes
    if out.op_type != "Transpose" or pattern.perm(out) != HEADS_FIRST:
        return "the attention output is not transposed back to (B, T, N, H)"
    found = heads_first(g, pv.input[1])
    if found is None:
        return "the values do not reach the product through a heads-first transpose"
    v, value_groups = found
    masked, sinks, sink_readers = softmax.input[0], None, []
    if sliced:
        found = _sink_column(g, softmax, sink_readers)
        if isinstance(found, str):
            return found
        masked, sinks = found
    if swapped is not None and zeroing is not None:
        return "the probabilities are zeroed where no mask selected the logits"
    if swapped is not None:
        mask, found = None, _swapped_logits(g, masked)
    else:
        found = attention_mask(g, masked, zeroing, sink_readers if sliced else None)
        if isinstance(found, str):
            return found
        mask, logits = found
        if isinstance(mask, tuple) and zeroing is not None:
            return "several masks and a select after the softmax"
        found = _attention_logits(g, logits, shapes)
    if isinstance(found, str):
        return found
    q, k, scale, bias, bias_scale, shape_readers, groups = found
    shape_readers += sink_readers
    if groups != value_groups:
        return "the key's and the value's heads are repeated differently"
    found = _attention_heads(shapes, q, k, v, out.output[0], groups)
    if isinstance(found, str):
        return found
    heads, size = found
    if zeroing is not None and not 1 <= len(shapes.get(mask, ((),))[0]) <= 4:
        return "the mask's rank is unknown or above 4"
    if sinks is not None and sinks.size != heads:
        return "the sinks are not one per head"
    zeroes = zeroing is not None
    readers = tuple({reader.output[0]: reader for reader in shape_readers}.values())
    return Attention(
        q,
        k,
        v,
        mask,
        scale,
        heads,
        size,
        out,
        zeroes,
        bias,
        bias_scale,
        readers,
        groups,
        sinks=sinks,
    )
