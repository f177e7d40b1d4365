"""Attention, plain or grouped, rewritten into ONNX Runtime's `MultiHeadAttention`.

`attention` and `grouped_attention` match; this module's rule dispatches on
the transpose after the product with the values, and its rewrite builds the
fused op, the mask's additive bias (once per mask), the bias's broadcast,
and the zeroing of rows that see no key where Keras zeroes them.
"""

from dataclasses import replace
from functools import partial

import numpy as np
from onnx import TensorProto, helper

from keras_layers.export.graph import weights
from keras_layers.export.passes.context import Context, PassResult
from keras_layers.export.passes.fusions import pattern
from keras_layers.export.passes.fusions.attention import (
    HEADS_FIRST,
    MASKED,
    Attention,
    match_plain,
    probabilities_reader,
    reaches_a_matmul,
)
from keras_layers.export.passes.fusions.grouped_attention import GROUPED_BACK, match_grouped
from keras_layers.export.passes.fusions.pattern import Rule, attribute, run_rule

MAKES = ("MultiHeadAttention",)


def _projection_bias(g, name, folder):
    """(x, the bias) when `name`, a q, k or v of (B, T, heads, H) or (B, T, K,
    G, H), is `Add(x, c)`: c a float32 initializer that adds one value per
    head and channel, the same at every batch row and position (the (N, H)
    bias Keras' `EinsumDense` adds after the product), and x of `name`'s
    own shape; else (name, None).

    The fused op adds such a bias itself (its `bias` input) as it lays q, k
    and v out by heads, where the `Add` is a pass of its own over each. Only
    where the sum goes to this attention alone (read by one node, whose
    output one node reads: the heads-first transpose and the product): an
    `Add` that other nodes keep alive would be computed twice. A bias in
    the staged data file (an (N, H) bias of 1 KiB or more, `weights.stage`)
    is read from `folder`; with none given it stays an `Add`.
    """
    add = g.node(name, "Add")
    if add is None or not g.only_used_by(name):
        return name, None
    (reader,) = g.consumers[name]
    if not all(g.only_used_by(output) for output in reader.output):
        return name, None
    dims = g.shapes.get(name, (None,))[0]
    if dims is None or not all(isinstance(size, int) for size in dims[2:]):
        return name, None
    first, second = add.input
    for x, c in ((first, second), (second, first)):
        tensor, x_dims = g.initializers.get(c), g.shapes.get(x, (None,))[0]
        if tensor is None or tensor.data_type != TensorProto.FLOAT or x_dims is None:
            continue
        if len(x_dims) != len(dims) or list(x_dims[2:]) != list(dims[2:]):
            continue
        if weights.is_external(tensor) and folder is None:
            continue
        # c's dims, aligned on the right: 1 on the batch and position axes,
        # 1 or x's own on the others, so the sum has x's shape
        aligned = [1] * (len(dims) - len(tensor.dims)) + list(tensor.dims)
        if len(aligned) != len(dims) or aligned[:2] != [1, 1]:
            continue
        if any(size not in (1, wanted) for size, wanted in zip(aligned[2:], dims[2:], strict=True)):
            continue
        values = np.asarray(weights.values(tensor, folder), np.float32).reshape(aligned[2:])
        return x, np.broadcast_to(values, dims[2:]).reshape(-1)
    return name, None


def _with_projection_biases(g, found: Attention, folder) -> None:
    """`found` reading q, k and v before their biases, which it then carries
    (see `_projection_bias`). Not with sinks: the fused op would add the
    key's and value's biases to the sinks' zero key and value too."""
    if found.sinks is not None:
        return
    sides = [_projection_bias(g, name, folder) for name in (found.q, found.k, found.v)]
    if all(bias is None for _, bias in sides):
        return
    (found.q, q_bias), (found.k, k_bias), (found.v, v_bias) = sides
    found.projection_biases = (q_bias, k_bias, v_bias)


def _match(g, softmax, folder=None, biases: bool = False):
    """An `Attention` around `softmax`, or why not (see `attention`); with
    `biases` (this rule's own rewrite), its q, k and v biases in the fused op
    where they are constants read from the proto or from `folder` (see
    `_projection_bias`). Other rules that reuse the match
    (`group_query_attention`) keep q, k and v as they are, biases added."""
    found = probabilities_reader(g, softmax)
    if isinstance(found, str):
        return found
    pv, zeroing, sliced, swapped = found
    if not g.only_used_by(pv.output[0]):
        return "the attention output is read by more than one node"
    (out,) = g.consumers[pv.output[0]]
    grouped = out.op_type == "Transpose" and pattern.perm(out) == GROUPED_BACK
    if grouped and not sliced and swapped is None:
        found = match_grouped(g, softmax, pv, zeroing, out)
    else:
        found = match_plain(g, softmax, pv, zeroing, out, sliced, swapped)
    if isinstance(found, str):
        return found
    if isinstance(found.mask, str):
        found.mask_rank = len(g.shapes.get(found.mask, ((),))[0])
    if biases:
        _with_projection_biases(g, found, folder)
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


class _Fused:
    """The nodes that replace one matched attention, built step by step by
    `_rewrite`. Nodes computed from a mask alone are made once for every
    layer that reads the mask, right after it (`place`)."""

    def __init__(self, edit, match: Attention):
        self.edit, self.match = edit, match
        labels = ("q", "k", "v", "b", "t", "s", "bias_shape", "bias", "out", "heads", "kept")
        self.name = {label: edit.fresh(f"{match.out.output[0]}_mha_{label}") for label in labels}
        self.nodes = []
        self.anchor = match.mask  # the mask's own nodes go just after it

    def place(self, made: list) -> None:
        """Nodes computed from the mask alone: after it, or here if it is new."""
        if isinstance(self.anchor, str):
            self.edit.after(self.anchor, made)
        else:
            self.nodes.extend(made)

    def repeated(self, k, v) -> tuple[str, str]:
        """k and v with each key and value head repeated for its G query heads."""
        edit, groups = self.edit, self.match.groups
        repeat = edit.constant(f"mha_groups_{groups}", np.array([1, 1, 1, groups, 1], np.int64))
        axis = edit.constant("mha_group_axis", np.array([3], np.int64))
        repeated = []
        for label, source in (("k", k), ("v", v)):
            wide = edit.fresh(f"{self.name[label]}_groups")
            self.nodes += [
                helper.make_node("Unsqueeze", [source, axis], [f"{wide}_1"]),
                helper.make_node("Expand", [f"{wide}_1", repeat], [wide]),
            ]
            repeated.append(wide)
        return repeated[0], repeated[1]

    def mask(self):
        """The boolean mask the fused op's bias is built from: several masks
        combined (kept where all keep it), a 5-D one squeezed to 4-D."""
        edit, match, mask, anchor = self.edit, self.match, self.match.mask, self.anchor
        if isinstance(mask, tuple):

            def combined():
                made = mask[0]
                for other in mask[1:]:
                    and_ = helper.make_node("And", [made, other], [edit.fresh(f"{made}_and")])
                    self.nodes.append(and_)
                    made = and_.output[0]
                return made

            mask = edit.once(("and", mask), combined)
        if mask is not None and match.five_d and match.mask_rank == 5:

            def squeezed():  # (B or 1, 1, 1, T, S) to (B or 1, 1, T, S)
                made = edit.fresh(f"{anchor}_4d")
                axis = edit.constant("mha_head_axis", np.array([1], np.int64))
                edit.after(anchor, [helper.make_node("Squeeze", [anchor, axis], [made])])
                return made

            mask = edit.once(("squeezed", anchor), squeezed)
        return mask

    def bias(self, mask):
        """The additive bias: the mask's (0 kept, `MASKED` masked), plus the
        terms added to the logits, scaled, summed once for all the layers that
        read them, before the first of those layers; None for neither."""
        edit, match = self.edit, self.match

        def mask_bias():
            made = edit.fresh(f"{mask}_bias")
            zero = edit.constant("mha_zero", np.float32(0))
            masked = edit.constant("mha_masked", MASKED)
            self.place([helper.make_node("Where", [mask, zero, masked], [made])])
            return made

        bias = None if mask is None else edit.once(("bias", mask), mask_bias)
        if match.bias is None:
            return bias

        def add(op, inputs, label):
            self.nodes.append(helper.make_node(op, inputs, [edit.fresh(label)]))
            return self.nodes[-1].output[0]

        def total_bias():
            total = match.bias[0]
            for term in match.bias[1:]:  # XLNet's position and segment terms
                total = add("Add", [total, term], f"{term}_sum")
            if match.bias_scale is not None:
                factor = edit.constant(
                    f"mha_bias_scale_{match.bias_scale}", np.float32(match.bias_scale)
                )
                total = add("Mul", [total, factor], f"{total}_scaled")
            if mask is not None:
                total = add("Add", [bias, total], f"{total}_masked")
            return total

        return edit.once(("bias", mask, match.bias, match.bias_scale), total_bias)

    def expanded(self, q, k, bias) -> list:
        """The bias expanded to (B or 1, N or 1, T, S), the fused op's last
        inputs. Expand broadcasts both ways, so a batch or head axis of the
        bias's own stays as it is and a missing one becomes B or 1."""
        name = self.name
        one = self.edit.constant("mha_one", np.array([1], np.int64))
        batch = one
        if self.match.bias is None:  # the mask's bias alone: expanded to (B, 1, T, S)
            self.nodes.append(helper.make_node("Shape", [q], [name["b"]], start=0, end=1))
            batch = name["b"]
        self.nodes += [
            helper.make_node("Shape", [q], [name["t"]], start=1, end=2),
            helper.make_node("Shape", [k], [name["s"]], start=1, end=2),
            helper.make_node(
                "Concat", [batch, one, name["t"], name["s"]], [name["bias_shape"]], axis=0
            ),
            helper.make_node("Expand", [bias, name["bias_shape"]], [name["bias"]]),
        ]
        return ["", "", name["bias"]]

    def output(self, mask) -> None:
        """The fused op's output back in the matched output's shape, its rows
        that see no key zeroed where Keras zeroes them."""
        edit, match, name = self.edit, self.match, self.name
        heads, size = match.heads, match.size
        split = edit.constant(f"mha_split_{heads}_{size}", np.array([0, 0, heads, size], np.int64))
        back = split
        if match.five_d:
            kv_heads = heads // match.groups
            back = edit.constant(
                f"mha_split_{kv_heads}_{match.groups}_{size}",
                np.array([0, 0, kv_heads, match.groups, size], np.int64),
            )
        if not match.zeroes_masked_rows:
            self.nodes.append(helper.make_node("Reshape", [name["out"], back], []))
            return

        # The fused op gives a query that sees no key the mean of the values
        # (uniform weights); keras.layers.Softmax gives it 0.
        def rows():
            rank = 4 if mask != self.anchor else match.mask_rank
            computed, made = _visible_rows(edit, mask, rank)
            self.place(computed)
            return made

        visible = edit.once(("visible", mask), rows)
        zero = edit.constant("mha_zero", np.float32(0))
        self.nodes += [
            helper.make_node("Reshape", [name["out"], split], [name["heads"]]),
            helper.make_node("Where", [visible, name["heads"], zero], [name["kept"]]),
        ]
        if match.five_d:
            self.nodes.append(helper.make_node("Reshape", [name["kept"], back], []))


def _qkv_bias(edit, match: Attention) -> str:
    """The fused op's `bias`: q's, k's and v's, each as the op reads its input
    (k's and v's repeated for each group of query heads, as `_Fused.repeated`
    repeats k and v), concatenated; zeros for one without."""
    widths = (match.heads * match.size, *[match.heads // match.groups * match.size] * 2)
    parts = []
    for position, (bias, width) in enumerate(zip(match.projection_biases, widths, strict=True)):
        bias = np.zeros(width, np.float32) if bias is None else bias
        if position and match.groups > 1:  # head k * G + g reads head k
            bias = np.repeat(bias.reshape(-1, match.size), match.groups, axis=0).reshape(-1)
        parts.append(bias)
    return edit.initializer(f"{match.out.output[0]}_qkv_bias", np.concatenate(parts))


def _rewrite(edit, match: Attention) -> None:
    """`match` as a `MultiHeadAttention` and the nodes around it (see `run`)."""
    fused = _Fused(edit, match)
    q, k, v, heads, size = match.q, match.k, match.v, match.heads, match.size
    # Not [0, 0, -1]: with 0 batch or sequence, -1 cannot be inferred.
    flat = edit.constant(f"mha_flat_{heads * size}", np.array([0, 0, heads * size], np.int64))
    if match.groups > 1:
        k, v = fused.repeated(k, v)
    fused.nodes += [
        helper.make_node("Reshape", [source, flat], [fused.name[label]])
        for source, label in ((q, "q"), (k, "k"), (v, "v"))
    ]
    inputs = [fused.name["q"], fused.name["k"], fused.name["v"]]
    mask = fused.mask()
    bias = fused.bias(mask)
    if match.sinks is not None:
        inputs = _with_sinks(edit, match, fused.name, fused.nodes, bias)
    elif bias is not None:
        inputs += fused.expanded(q, k, bias)
    if any(part is not None for part in match.projection_biases):
        inputs[3:4] = [_qkv_bias(edit, match)]
    for reader in match.shape_readers:
        _logits_shape(edit, q, k, heads, reader)
    fused.nodes.append(
        helper.make_node(
            "MultiHeadAttention",
            inputs,
            [fused.name["out"]],
            domain="com.microsoft",
            num_heads=heads,
            scale=match.scale,
        )
    )
    fused.output(mask)
    edit.replace(match.out, fused.nodes)


RULE = Rule(
    makes="MultiHeadAttention",
    anchor="Softmax",
    form="Transpose(MatMul(Softmax(Where(mask, scale * q.k^T [+ bias], -big)), v^T))",
    match=_match,
    rewrite=_rewrite,
)


def _softmax_over_axes(g, exp):
    """Why attention whose softmax normalises several axes is left alone, or
    None where `exp` is no such softmax.

    Keras' `Softmax` over a tuple of axes (`MultiHeadAttention(attention_axes=
    (1, 2))` on 4-D input normalises both key axes at once) computes
    `exp(x - logsumexp(x, axes))`, no `Softmax` node: `exp` is the last `Exp`,
    its `ReduceSum` names the axes. `MultiHeadAttention` attends over one
    sequence axis, so the rule would have to prove the flattened key axes
    one sequence; it leaves such attention alone and says so, where the
    probabilities reach a `MatMul` (`attention.reaches_a_matmul`).
    """
    sub = g.node(exp.input[0], "Sub")
    lse = sub and g.node(sub.input[1], "Add")
    log = lse and next((g.node(name, "Log") for name in lse.input if g.node(name, "Log")), None)
    total = log and g.node(log.input[0], "ReduceSum")
    if not total:
        return None
    axes = g.const(total.input[1]) if len(total.input) > 1 and total.input[1] else None
    if axes is None:
        axes = np.array(attribute(total, "axes", []))
    if axes.size < 2 or not reaches_a_matmul(g, exp.output[0]):
        return None
    return (
        f"a softmax over {axes.size} axes, exp(x - logsumexp(x)) as Keras writes it "
        "(MultiHeadAttention with attention_axes of several axes): the fused op "
        "attends over one"
    )


# Attention over several axes, found only to say why it is not fused.
SEVERAL_AXES = Rule(
    makes="MultiHeadAttention",
    anchor="Exp",
    form="exp(x - logsumexp(x, axes)), two axes or more",
    match=_softmax_over_axes,
    rewrite=None,
)


def run(proto, context: Context) -> PassResult:
    """Replace the traced attention by ONNX Runtime's `MultiHeadAttention`.

    The trace leaves each attention as 3 transposes in, a scaled `MatMul`, the
    mask's `Where`, `Softmax`, a `MatMul` and a transpose out; Keras' einsum
    path (`MultiHeadAttention` with dropout, keras-hub's Llama attention) the
    same with the product transposed and a second `Where` after the softmax
    (see `attention.probabilities_reader`). One contrib
    `MultiHeadAttention` node computes the same (the scale as its `scale`, the
    mask as an additive bias, see `attention.MASKED`) without writing the
    (B, N, T, S) logits to memory three times (fused against unfused:
    benchmarks/results/attention_forms.json). ONNX Runtime's own fusion
    (`onnxruntime.transformers`) matches BERT's PyTorch and TF1 graphs and
    fuses none of these (see the package docstring).

    One difference remains: a NaN or infinite logit at a masked position,
    which Keras' select discards, survives the additive bias. Finite inputs
    give finite logits, so only a model that already computes NaN at its
    padded positions sees it. Needs opset 15 (`Shape` with `start`/`end`).

    A decoder exported with its cache (`context.cached_decoder`) is left to
    `group_query_attention`: each new token is one query against the whole
    cache, so the logits this op keeps out of memory are small, and what it
    adds (the cache concatenated and reshaped, the mask's bias expanded,
    grouped key/value heads repeated) is paid at every token
    (benchmarks/results/cached_attention.json: slower than the traced
    attention at batch 8 and at 512 tokens, `GroupQueryAttention` faster
    everywhere).

    Args:
        proto: the ModelProto, rewritten in place.
        context: its `shapes` (`graph.tensor_shapes`), `opset` and
            `cached_decoder`.

    Returns:
        How many were replaced, under "MultiHeadAttention", and (softmax
        output, reason) for each softmax left alone, and for each softmax
        over several axes that weighs values (`SEVERAL_AXES`).
    """
    if context.opset < 15:
        return PassResult(proto, {"MultiHeadAttention": 0}, (("", "opset below 15"),))
    if context.cached_decoder:
        return PassResult(proto, {"MultiHeadAttention": 0})
    # The rule reading the q, k and v biases in the data file too.
    rule = replace(RULE, match=partial(_match, folder=context.data_folder, biases=True))
    result = run_rule(rule, proto, context.shapes)
    declined = list(result.declined)
    pattern.apply(SEVERAL_AXES, proto, declined, context.shapes)
    return PassResult(proto, result.fused, tuple(declined), result.changed)
