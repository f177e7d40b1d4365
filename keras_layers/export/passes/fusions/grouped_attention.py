"""Grouped-query attention (Llama, Mistral, Qwen, Gemma) in keras-hub's 5-D form.

Matched with the pieces of `attention`; `multi_head_attention` rewrites it,
repeating each key/value head for its query heads.
"""

from onnx import TensorProto

from keras_layers.export.einsums import GROUPED_LOGITS, GROUPED_OUTPUT, einsum_layout
from keras_layers.export.passes.fusions.attention import (
    Attention,
    attention_mask,
    combined_scale,
    scaled,
    transposed,
)

# Grouped-query attention as `tracing._einsums_for_onnx` writes
# keras-hub's einsums, read from the layout the trace itself follows: q
# (B, T, K, G, H) to (B, K, G, T, H); k and v (B, S, K, H) to (B, K, H, S)
# and (B, K, S, H), each with a size-1 group axis inserted; the output
# (B, K, G, T, H) back to (B, T, K, G, H).
GROUPED_Q, _, GROUPED_K, (GROUP_AXIS,), _ = einsum_layout(GROUPED_LOGITS)
_, _, GROUPED_V, _, GROUPED_BACK = einsum_layout(GROUPED_OUTPUT)


def _grouped_side(g, name, order):
    """x of `Unsqueeze(Transpose(x, order), [GROUP_AXIS])` producing `name`, or None."""
    unsqueeze = g.node(name, "Unsqueeze")
    if unsqueeze is None or len(unsqueeze.input) != 2 or not g.only_used_by(name):
        return None
    axes = g.const(unsqueeze.input[1])
    if axes is None or axes.reshape(-1).tolist() != [GROUP_AXIS]:
        return None
    return transposed(g, unsqueeze.input[0], order)


def match_grouped(g, softmax, pv, zeroing, out):
    """Match grouped-query attention (see `GROUPED_Q`): an `Attention` whose
    q is (B, T, K, G, H) and k, v (B, S, K, H), or why not.

    K key/value heads each serve G query heads, head k * G + g of the
    (B, T, K * G, H) query: `fuse_attention` repeats each key and value head G
    times for `MultiHeadAttention`, as keras-hub's Llama does in the graph
    itself. The mask must broadcast over the heads: (B or 1, 1, 1, T, S) or
    of rank up to 3.

    Args:
        g: the `Graph`.
        softmax: the Softmax node.
        pv: the MatMul weighing the values.
        zeroing: the select after the softmax, or None.
        out: the Transpose after `pv`.

    Returns:
        An `Attention`, or a reason.
    """
    shapes = g.shapes
    v = _grouped_side(g, pv.input[1], GROUPED_V)
    if v is None:
        return "the grouped values do not reach the product through a transpose and an Unsqueeze"
    found = attention_mask(g, softmax.input[0], zeroing)
    if isinstance(found, str):
        return found
    mask, logits = found
    if isinstance(mask, tuple):
        return "the grouped logits are selected by several masks"
    name, outer = scaled(g, logits)
    product = g.node(name, "MatMul")
    if product is None or not g.only_used_by(name):
        return "the grouped logits are not a MatMul read only by the softmax's select"
    q = transposed(g, product.input[0], GROUPED_Q)
    k = _grouped_side(g, product.input[1], GROUPED_K)
    if q is None or k is None:
        return "the grouped query and key do not reach the product through their transposes"
    q, inner = scaled(g, q)
    scale = combined_scale([outer, inner])
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
    return Attention(q, k, v, mask, scale, heads, size, out, zeroes, groups=groups, five_d=True)
