"""Attention, plain or grouped, rewritten into ONNX Runtime's `MultiHeadAttention`.

`attention` and `grouped_attention` match; this module's rule dispatches on
the transpose after the product with the values, and its rewrite builds the
fused op, the mask's additive bias (once per mask), the bias's broadcast,
and the zeroing of rows that see no key where Keras zeroes them.
"""

import numpy as np
from onnx import helper

from keras_layers.export.fusions import pattern
from keras_layers.export.fusions.attention import (
    HEADS_FIRST,
    MASKED,
    Attention,
    match_plain,
    probabilities_reader,
)
from keras_layers.export.fusions.grouped_attention import GROUPED_BACK, match_grouped
from keras_layers.export.fusions.pattern import Rule, apply, attribute, opset


def _match(g, softmax):
    """An `Attention` around `softmax`, or why not (see `attention`)."""
    found = probabilities_reader(g, softmax)
    if isinstance(found, str):
        return found
    pv, zeroing, sliced = found
    if not g.only_used_by(pv.output[0]):
        return "the attention output is read by more than one node"
    (out,) = g.consumers[pv.output[0]]
    if out.op_type == "Transpose" and pattern.perm(out) == GROUPED_BACK and not sliced:
        found = match_grouped(g, softmax, pv, zeroing, out)
    else:
        found = match_plain(g, softmax, pv, zeroing, out, sliced)
    if isinstance(found, str):
        return found
    if g.cached:
        return "attention in a decoder with a cache (measured slower fused, see fuse_attention)"
    if isinstance(found.mask, str):
        found.mask_rank = len(g.shapes.get(found.mask, ((),))[0])
    return found


def _visible_rows(edit, mask, rank):
    """Nodes computing, from a boolean mask broadcast to (B, N, T, S), a boolean
    (B|1, T|1, N|1, 1) that is true where a query sees some key and false where
    it sees none: the rows `keras.layers.Softmax` zeroes with its second select.

    A count (`ReduceSum`, axes an input since opset 13) rather than
    `ReduceMax`: ONNX Runtime's symbolic shape inference, which its fusions
    and tools run, cannot infer ReduceMax with axes as an input (opset 18).
    Returns (nodes, output name).
    """
    as_float, count, seen, wide, rows = (
        edit.fresh(f"{mask}_{label}") for label in ("f", "count", "any", "4d", "rows")
    )
    nodes = [
        helper.make_node("Cast", [mask], [as_float], to=1),
        helper.make_node(
            "ReduceSum",
            [as_float, edit.constant("mha_last_axis", np.array([-1], np.int64))],
            [count],
            keepdims=1,
        ),
        helper.make_node("Greater", [count, edit.constant("mha_zero", np.float32(0))], [seen]),
    ]
    if rank < 4:  # leading axes of size 1, as broadcasting against the logits adds them
        leading = edit.constant(f"mha_leading_{4 - rank}", np.arange(4 - rank, dtype=np.int64))
        nodes.append(helper.make_node("Unsqueeze", [seen, leading], [wide]))
        seen = wide
    nodes.append(helper.make_node("Transpose", [seen], [rows], perm=HEADS_FIRST))
    return nodes, rows


def _logits_shape(edit, q, k, heads, reader) -> None:
    """Nodes that compute, from q and k (B, T|S, N, H), what `reader`, a `Shape`
    of the (B, N, T, S) logits, gave, in place of `reader`.

    Keras' CLIP and Bloom layers build their masks from the logits' shape, so
    the logits have a reader besides the softmax; the fused op computes no
    logits, and their shape comes from the query and key instead.
    """
    start, end = attribute(reader, "start", 0), attribute(reader, "end", 4)
    start, end = (max(0, min(4, axis + 4 if axis < 0 else axis)) for axis in (start, end))
    parts, nodes = [], []
    for axis in range(start, end):
        if axis == 1:
            parts.append(edit.constant(f"mha_heads_{heads}", np.array([heads], np.int64)))
            continue
        source, at = {0: (q, 0), 2: (q, 1), 3: (k, 1)}[axis]
        parts.append(edit.fresh(f"{reader.output[0]}_{axis}"))
        nodes.append(helper.make_node("Shape", [source], [parts[-1]], start=at, end=at + 1))
    if not parts:  # an empty slice of the shape
        parts.append(edit.constant("mha_no_axes", np.zeros(0, np.int64)))
    nodes.append(helper.make_node("Concat", parts, [], axis=0))
    edit.replace(reader, nodes)


def _with_sinks(edit, match: Attention, name: dict, nodes: list, bias) -> list:
    """The fused op's inputs for attention with sinks (see `attention._sink_column`).

    One more key and value position, both 0: its logit is `scale * q.0`
    plus its bias, which is the head's sink, and its value adds nothing.
    So the fused op's softmax runs over the logits and the sink, as
    GPT-OSS's does, and weighs the values alone. The bias is the mask's (or
    0), expanded to (B, N, T, S), with the sinks as one more column.
    """
    heads, size = match.heads, match.size
    one = edit.constant("mha_one", np.array([1], np.int64))
    count = edit.constant(f"mha_heads_{heads}", np.array([heads], np.int64))
    width = edit.constant(f"mha_width_{heads * size}", np.array([heads * size], np.int64))
    zero = edit.constant("mha_zero", np.float32(0))
    sinks = edit.initializer(
        f"{match.out.output[0]}_sinks", match.sinks.reshape(1, heads, 1, 1).astype(np.float32)
    )
    b, t, s = (edit.fresh(f"{name['out']}_{label}") for label in ("sink_b", "sink_t", "sink_s"))
    made = {
        label: edit.fresh(f"{name['out']}_{label}")
        for label in ("zeros_shape", "zeros", "k", "v", "full", "column", "wide", "sinks", "bias")
    }
    nodes += [
        helper.make_node("Shape", [match.q], [b], start=0, end=1),
        helper.make_node("Shape", [match.q], [t], start=1, end=2),
        helper.make_node("Shape", [match.k], [s], start=1, end=2),
        helper.make_node("Concat", [b, one, width], [made["zeros_shape"]], axis=0),
        helper.make_node("Expand", [zero, made["zeros_shape"]], [made["zeros"]]),
        helper.make_node("Concat", [name["k"], made["zeros"]], [made["k"]], axis=1),
        helper.make_node("Concat", [name["v"], made["zeros"]], [made["v"]], axis=1),
        helper.make_node("Concat", [b, count, t, s], [made["full"]], axis=0),
        helper.make_node("Concat", [b, count, t, one], [made["column"]], axis=0),
        helper.make_node("Expand", [zero if bias is None else bias, made["full"]], [made["wide"]]),
        helper.make_node("Expand", [sinks, made["column"]], [made["sinks"]]),
        helper.make_node("Concat", [made["wide"], made["sinks"]], [made["bias"]], axis=3),
    ]
    return [name["q"], made["k"], made["v"], "", "", made["bias"]]


def _rewrite(edit, match: Attention) -> None:
    """`match` as a `MultiHeadAttention` and the nodes around it (see `fuse_attention`)."""
    q, k, v, mask, out = match.q, match.k, match.v, match.mask, match.out
    heads, size, groups = match.heads, match.size, match.groups
    labels = ("q", "k", "v", "b", "t", "s", "bias_shape", "bias", "out", "heads", "kept")
    name = {label: edit.fresh(f"{out.output[0]}_mha_{label}") for label in labels}
    # Not [0, 0, -1]: with 0 batch or sequence, -1 cannot be inferred.
    flat = edit.constant(f"mha_flat_{heads * size}", np.array([0, 0, heads * size], np.int64))
    nodes = []
    if groups > 1:  # each key and value head repeated for its G query heads
        repeat = edit.constant(f"mha_groups_{groups}", np.array([1, 1, 1, groups, 1], np.int64))
        axis = edit.constant("mha_group_axis", np.array([3], np.int64))
        repeated = []
        for label, source in (("k", k), ("v", v)):
            wide = edit.fresh(f"{name[label]}_groups")
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
    anchor = mask  # the mask's own nodes go just after it, made once for every layer

    def place(made: list) -> None:
        """Nodes computed from the mask alone: after it, or here if it is new."""
        if isinstance(anchor, str):
            edit.after(anchor, made)
        else:
            nodes.extend(made)

    if isinstance(mask, tuple):  # selected by each mask: kept where all keep it

        def combined():
            made = mask[0]
            for other in mask[1:]:
                nodes.append(helper.make_node("And", [made, other], [edit.fresh(f"{made}_and")]))
                made = nodes[-1].output[0]
            return made

        mask = edit.once(("and", mask), combined)

    if mask is not None and match.five_d and match.mask_rank == 5:

        def squeezed():  # (B or 1, 1, 1, T, S) to (B or 1, 1, T, S)
            made = edit.fresh(f"{anchor}_4d")
            axis = edit.constant("mha_head_axis", np.array([1], np.int64))
            edit.after(anchor, [helper.make_node("Squeeze", [anchor, axis], [made])])
            return made

        mask = edit.once(("squeezed", anchor), squeezed)

    def mask_bias():
        made = edit.fresh(f"{mask}_bias")
        zero, masked = edit.constant("mha_zero", np.float32(0)), edit.constant("mha_masked", MASKED)
        place([helper.make_node("Where", [mask, zero, masked], [made])])
        return made

    bias = None if mask is None else edit.once(("bias", mask), mask_bias)
    if match.bias is not None:
        # The added bias, scaled and summed with the mask's once for all the
        # layers that read them, before the first of those layers.
        def total_bias():
            total = match.bias[0]
            for term in match.bias[1:]:  # XLNet's position and segment terms
                nodes.append(helper.make_node("Add", [total, term], [edit.fresh(f"{term}_sum")]))
                total = nodes[-1].output[0]
            if match.bias_scale is not None:
                factor = edit.constant(
                    f"mha_bias_scale_{match.bias_scale}", np.float32(match.bias_scale)
                )
                nodes.append(
                    helper.make_node("Mul", [total, factor], [edit.fresh(f"{total}_scaled")])
                )
                total = nodes[-1].output[0]
            if mask is not None:
                nodes.append(
                    helper.make_node("Add", [bias, total], [edit.fresh(f"{total}_masked")])
                )
                total = nodes[-1].output[0]
            return total

        bias = edit.once(("bias", mask, match.bias, match.bias_scale), total_bias)
    if match.sinks is not None:
        inputs = _with_sinks(edit, match, name, nodes, bias)
    elif bias is not None:
        # The bias must be (B or 1, N or 1, T, S): expand what it lacks.
        # Expand broadcasts both ways, so a batch or head axis of the bias's
        # own stays as it is and a missing one becomes B or 1.
        one = edit.constant("mha_one", np.array([1], np.int64))
        batch = one
        if match.bias is None:  # the mask's bias alone: expanded to (B, 1, T, S)
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
        _logits_shape(edit, q, k, heads, reader)
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
    split = edit.constant(f"mha_split_{heads}_{size}", np.array([0, 0, heads, size], np.int64))
    back = split
    if match.five_d:
        kv_heads = heads // groups
        back = edit.constant(
            f"mha_split_{kv_heads}_{groups}_{size}",
            np.array([0, 0, kv_heads, groups, size], np.int64),
        )
    if match.zeroes_masked_rows:
        # The fused op gives a query that sees no key the mean of the values
        # (uniform weights); keras.layers.Softmax gives it 0.
        def rows():
            rank = 4 if mask != anchor else match.mask_rank
            computed, made = _visible_rows(edit, mask, rank)
            place(computed)
            return made

        visible = edit.once(("visible", mask), rows)
        zero = edit.constant("mha_zero", np.float32(0))
        nodes += [
            helper.make_node("Reshape", [name["out"], split], [name["heads"]]),
            helper.make_node("Where", [visible, name["heads"], zero], [name["kept"]]),
        ]
        if match.five_d:
            nodes.append(helper.make_node("Reshape", [name["kept"], back], []))
    else:
        nodes.append(helper.make_node("Reshape", [name["out"], back], []))
    edit.replace(out, nodes)


RULE = Rule(
    makes="MultiHeadAttention",
    anchor="Softmax",
    form="Transpose(MatMul(Softmax(Where(mask, scale * q.k^T [+ bias], -big)), v^T))",
    match=_match,
    rewrite=_rewrite,
)


def fuse_attention(proto, shapes: dict, declined: list | None = None, cached: bool = False) -> int:
    """Replace the traced attention by ONNX Runtime's `MultiHeadAttention`.

    The trace leaves each attention as 3 transposes in, a scaled `MatMul`, the
    mask's `Where`, `Softmax`, a `MatMul` and a transpose out; Keras' einsum
    path (`MultiHeadAttention` with dropout, keras-hub's Llama attention) the
    same with the product transposed and a second `Where` after the softmax
    (see `attention.probabilities_reader`). One contrib
    `MultiHeadAttention` node computes the same (the scale as its `scale`, the
    mask as an additive bias, see `attention.MASKED`) without writing the
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
    alone. `cached=True` (a decoder exported with its cache) leaves every
    attention alone, with that reason: each new token is one query against
    the whole cache, so the logits the fused op keeps out of memory are
    small, and what it adds (the cache reshaped, the mask's bias expanded,
    grouped key/value heads repeated) is paid at every token. Measured by
    `benchmarks/cached_attention.py` (keras-hub GPT-2 and Gemma, 4 layers
    256 wide, 32 new tokens): fused 1.02x to 1.22x the unfused time.
    """
    declined = [] if declined is None else declined
    if opset(proto) < 15:
        declined.append(("", "opset below 15"))
        return 0
    return apply(RULE, proto, declined, shapes, cached=cached)
