"""The attention of a decoder with a cache as ONNX Runtime's `GroupQueryAttention`.

`--task causal-lm` traces keras-hub's cached call, in which each layer
appends its new keys and values to the past (`Concat` on the sequence axis,
the past made (B, S, K, H) by a transpose and the result transposed back to
the `present.{i}.key/value` output), repeats each key/value head for its
query heads, and attends under the mask `causal_lm.padding_inputs` builds:
causal, and-ed with the `attention_mask` input. One contrib
`GroupQueryAttention` node computes all of it:

- the new keys and values (B, S, K * H) go in, the past (B, K, P, H)
  beside them, and the op writes the present itself, so that onnxruntime-genai
  may hand it one preallocated max-length buffer as both past and present
  (`past_present_share_buffer`): the graph then holds no node that reads the
  past's length;
- `total_sequence_length` is the `attention_mask`'s width and every row's
  `seqlens_k` that less one: each row's new tokens sit at the same cache slots
  as in Keras' cache, the last S of the total, and the op's causal mask is
  Keras' (query s sees slots up to total - S + s);
- the padding (right as onnxruntime-genai pads, or left) is the additive
  bias `attention.MASKED` where the `attention_mask` is 0.

So the graph computes what the traced one does at every position that some
slot is visible from; a query whose every visible slot is padding (a
left-padded prompt's first tokens) gets the mean of its visible values where
Keras gives 0, a difference confined to the logits of padding positions,
which nothing reads (their keys are masked for every other query).
Rotary angles stay in the `RotaryEmbedding` nodes of `fusions.rotary`
before the op (`do_rotary=0`): ONNX Runtime's CPU op takes head sizes
that are multiples of 8, and rotates inside only multiples of 16. Other head
sizes keep the traced attention, with the reason.

Declined, each with its reason in the report: decoders without an
`attention_mask` input (`causal_lm.Decoder.padded` False: sliding windows,
ALiBi, positions the cache index cannot give), attention with bias terms or
sinks, and any cache not read and written in exactly the form above.
"""

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper

from keras_layers.export.graph import Edit, Graph
from keras_layers.export.passes.context import Context, PassResult
from keras_layers.export.passes.fusions.attention import HEADS_FIRST, MASKED, Attention, transposed
from keras_layers.export.passes.fusions.multi_head_attention import _match as match_attention
from keras_layers.export.passes.fusions.pattern import Rule, attribute, run_rule

MAKES = ("GroupQueryAttention",)
MASK_INPUT = "attention_mask"  # as onnxruntime-genai and optimum name it
IDS_INPUT = "input_ids"
PAST_PREFIX = "past_key_values."
# ONNX Runtime 1.32's CPU kernel refuses other head sizes at run time.
HEAD_SIZE_MULTIPLE = 8
KV_AXIS = 1  # the sequence axis of the (B, S, K, H) caches the trace concatenates
NO_MASK = (
    "a decoder without an attention_mask input (lockstep only, see causal_lm.describe): "
    "its cache slots are not the mask's"
)


@dataclass
class CachedAttention:
    """One matched attention with the cache it appends to."""

    attention: Attention
    kv_heads: int
    new: dict  # "k"/"v": the new keys/values, (B, S, K, H)
    past: dict  # "k"/"v": the past's graph input, (B, K, P, H)
    present: dict  # "k"/"v": the Transpose (or Reshape) node making the present output


def _unrepeated(g, name):
    """(x, G) when `name` is x (B, S, K, H) with each head repeated G times in
    a row, (B, S, K * G, H): keras-hub's `Reshape(Tile(Unsqueeze(x, 3),
    [1, 1, 1, G, 1]), (B, S, K * G, H))`; (name, 1) where nothing repeats."""
    reshape = g.node(name, "Reshape")
    tile = reshape and g.node(reshape.input[0], "Tile")
    unsqueeze = tile and g.node(tile.input[0], "Unsqueeze")
    if not unsqueeze or len(unsqueeze.input) != 2:
        return name, 1
    axes, repeats = g.const(unsqueeze.input[1]), g.const(tile.input[1])
    if axes is None or repeats is None or axes.reshape(-1).tolist() not in ([3], [-2]):
        return None
    repeats = repeats.reshape(-1).tolist()
    x = unsqueeze.input[0]
    before, after = g.shapes.get(x, (None,))[0], g.shapes.get(name, (None,))[0]
    if len(repeats) != 5 or repeats[:3] != [1, 1, 1] or repeats[4] != 1 or not before or not after:
        return None
    groups = repeats[3]
    if len(before) != 4 or len(after) != 4 or not all(isinstance(d, int) for d in before[2:]):
        return None
    if after[2:] != [before[2] * groups, before[3]]:
        return None
    return x, groups


def _cache_side(g, name):
    """(new, past input, present Transpose, K, G) of the keys or values the
    attention reads as `name`, or a reason."""
    found = _unrepeated(g, name)
    if found is None:
        return "the key/value heads are repeated in a form other than Unsqueeze, Tile, Reshape"
    x, groups = found
    concat = g.node(x, "Concat")
    if concat is None or len(concat.input) != 2:
        return "the keys/values are not the past and the new ones concatenated"
    axis, rank = concat.attribute[0].i if concat.attribute else None, g.ranks.get(x)
    if rank != 4 or axis not in (KV_AXIS, KV_AXIS - rank):
        return "the keys/values are not concatenated on the sequence axis of (B, S, K, H)"
    past = transposed(g, concat.input[0], HEADS_FIRST)
    if past is None or past not in g.inputs:
        return "the past keys/values are not a graph input transposed to (B, S, K, H)"
    presents = [  # a Transpose, or a Reshape that is one (one key/value head)
        node
        for node in g.consumers[x]
        if node.output[0] in g.outputs and transposed(g, node.output[0], HEADS_FIRST) == x
    ]
    dims = g.shapes.get(x, (None,))[0]
    if len(presents) != 1 or not dims or not all(isinstance(d, int) for d in dims[2:]):
        return "the appended keys/values are not one present output of static heads and size"
    return concat.input[1], past, presents[0], dims[2], groups


def _match(g, softmax):
    """A `CachedAttention` around `softmax`, or why not (see the module)."""
    if MASK_INPUT not in g.inputs:
        return NO_MASK
    found = match_attention(g, softmax)
    if isinstance(found, str):
        return found
    if found.bias is not None:
        return "attention with terms added to its logits (ALiBi, relative positions)"
    if found.sinks is not None:
        return "attention with sinks"
    if not isinstance(found.mask, str) or MASK_INPUT not in _ancestors(g, found.mask):
        return "the attention's mask is not built from the attention_mask input"
    sides = {}
    for label, name in (("k", found.k), ("v", found.v)):
        sides[label] = _cache_side(g, name)
        if isinstance(sides[label], str):
            return sides[label]
    (_, _, _, kv_heads, groups), other = sides["k"], sides["v"]
    if found.five_d and groups == 1:  # (B, T, K, G, H) queries on unrepeated heads
        groups = found.groups
        other = (*other[:4], groups)
    if other[3:] != (kv_heads, groups) or kv_heads * groups != found.heads:
        return "the keys and values differ in heads, or the query heads are not K x G"
    if g.shapes.get(found.q, (None, 0))[1] != TensorProto.FLOAT:
        return "not float32"
    if found.size % HEAD_SIZE_MULTIPLE:
        return (
            f"head size {found.size}: ONNX Runtime's CPU GroupQueryAttention takes multiples "
            f"of {HEAD_SIZE_MULTIPLE}"
        )
    return CachedAttention(
        found,
        kv_heads,
        new={label: side[0] for label, side in sides.items()},
        past={label: side[1] for label, side in sides.items()},
        present={label: side[2] for label, side in sides.items()},
    )


def _ancestors(g, name, limit: int = 64) -> set:
    """The tensors `name` is computed from, up to `limit` nodes back."""
    seen, stack = set(), [name]
    while stack and len(seen) < limit:
        node = g.producer.get(stack.pop())
        if node is None:
            continue
        for source in node.input:
            if source and source not in seen:
                seen.add(source)
                stack.append(source)
    return seen


def _lengths(edit, first_query: str) -> tuple:
    """`seqlens_k`, `total_sequence_length` and the padding's additive bias
    (B, 1, S, T), from the `attention_mask` (B, T): made once, for every layer."""

    def make():
        made = {
            label: edit.fresh(f"gqa_{label}")
            for label in ("batch", "total", "total32", "total_scalar", "last", "seqlens")
        }
        made.update(
            {
                label: edit.fresh(f"gqa_{label}")
                for label in ("keep", "bias_2d", "bias_4d", "s", "bias_shape", "bias")
            }
        )
        one = edit.constant("gqa_one", np.array([1], np.int64))
        nodes = [
            helper.make_node("Shape", [MASK_INPUT], [made["batch"]], start=0, end=1),
            helper.make_node("Shape", [MASK_INPUT], [made["total"]], start=1, end=2),
            helper.make_node("Cast", [made["total"]], [made["total32"]], to=TensorProto.INT32),
            helper.make_node(
                "Squeeze",
                [made["total32"], edit.constant("gqa_axis_0", np.array([0], np.int64))],
                [made["total_scalar"]],
            ),
            helper.make_node(
                "Sub",
                [made["total32"], edit.constant("gqa_one_32", np.array([1], np.int32))],
                [made["last"]],
            ),
            helper.make_node("Expand", [made["last"], made["batch"]], [made["seqlens"]]),
            helper.make_node("Cast", [MASK_INPUT], [made["keep"]], to=TensorProto.BOOL),
            helper.make_node(
                "Where",
                [
                    made["keep"],
                    edit.constant("gqa_zero", np.float32(0)),
                    edit.constant("gqa_masked", MASKED),
                ],
                [made["bias_2d"]],
            ),
            helper.make_node(
                "Unsqueeze",
                [made["bias_2d"], edit.constant("gqa_axes_1_2", np.array([1, 2], np.int64))],
                [made["bias_4d"]],
            ),
            helper.make_node("Shape", [first_query], [made["s"]], start=1, end=2),
            helper.make_node(
                "Concat",
                [made["batch"], one, made["s"], made["total"]],
                [made["bias_shape"]],
                axis=0,
            ),
            helper.make_node("Expand", [made["bias_4d"], made["bias_shape"]], [made["bias"]]),
        ]
        edit.after(MASK_INPUT, nodes)
        return made["seqlens"], made["total_scalar"], made["bias"]

    return edit.once("gqa_lengths", make)


def _rewrite(edit, match: CachedAttention) -> None:
    """`match` as one `GroupQueryAttention` (see the module)."""
    found, kv_heads = match.attention, match.kv_heads
    heads, size = found.heads, found.size
    out = edit.fresh(f"{found.out.output[0]}_gqa")
    flat = {}
    nodes = []
    for label, source, count in (
        ("q", found.q, heads),
        ("k", match.new["k"], kv_heads),
        ("v", match.new["v"], kv_heads),
    ):
        flat[label] = edit.fresh(f"{out}_{label}")
        width = edit.constant(f"gqa_flat_{count * size}", np.array([0, 0, count * size], np.int64))
        nodes.append(helper.make_node("Reshape", [source, width], [flat[label]]))
    seqlens, total, bias = _lengths(edit, found.q)
    presents = [match.present[label].output[0] for label in ("k", "v")]
    nodes.append(
        helper.make_node(
            "GroupQueryAttention",
            [flat["q"], flat["k"], flat["v"], match.past["k"], match.past["v"], seqlens, total]
            + ["", "", "", bias],
            [out, *presents],
            domain="com.microsoft",
            num_heads=heads,
            kv_num_heads=kv_heads,
            scale=found.scale,
        )
    )
    back = [heads, size] if not found.five_d else [kv_heads, heads // kv_heads, size]
    split = edit.constant(
        f"gqa_split_{'_'.join(map(str, back))}", np.array([0, 0, *back], np.int64)
    )
    nodes.append(helper.make_node("Reshape", [out, split], []))
    edit.replace(found.out, nodes)
    for label in ("k", "v"):
        edit.remove(match.present[label])


RULE = Rule(
    makes="GroupQueryAttention",
    anchor="Softmax",
    form=(
        "attention (as multi_head_attention matches it) over Concat(past, new) keys and "
        "values, the present a graph output, the mask built from attention_mask"
    ),
    match=_match,
    rewrite=_rewrite,
)


def run(proto, context: Context) -> PassResult:
    """Replace each cached attention of a decoder by `GroupQueryAttention`.

    Runs only on a decoder exported with its cache (`context.cached_decoder`);
    `multi_head_attention` leaves those alone.

    Args:
        proto: the ModelProto, rewritten in place.
        context: its `shapes`, `opset` and `cached_decoder`.

    Returns:
        How many were replaced, under "GroupQueryAttention", and (softmax
        output, reason) for each softmax left alone.
    """
    if not context.cached_decoder:
        return PassResult(proto, {"GroupQueryAttention": 0})
    result = run_rule(RULE, proto, context.shapes)
    if result.fused["GroupQueryAttention"]:
        past_lengths_from_the_mask(proto, context.shapes)
    return result


def past_lengths_from_the_mask(proto, shapes=None) -> int:
    """Give each `Shape` of a past cache (or of its (B, P, K, H) view) the past
    length `attention_mask`'s width less the new tokens', instead of the
    cache's own length.

    The two are equal by the inputs' contract, except where onnxruntime-genai
    passes one preallocated max-length buffer as the past
    (`past_present_share_buffer`): then only the mask tells the length.
    What still reads the cache's shape once the attention is fused (Gemma
    zeroes the rows that see no key with a mask built from it) then computes
    the same in both modes.

    Args:
        proto: the ModelProto, rewritten in place.
        shapes: `graph.tensor_shapes` of the graph, which tell a `Reshape`
            that transposes (one key/value head) from one that does not.

    Returns:
        How many `Shape` nodes now read the mask.
    """
    g = Graph(proto.graph, shapes)
    if not {MASK_INPUT, IDS_INPUT} <= g.inputs:
        return 0
    edit = Edit(proto)
    for past in [name for name in g.inputs if name.startswith(PAST_PREFIX)]:
        for node in g.consumers[past]:
            if node.op_type == "Shape":
                _shape_from_the_mask(edit, node, past, None)
            elif transposed(g, node.output[0], HEADS_FIRST) == past:
                for reader in g.consumers[node.output[0]]:
                    if reader.op_type == "Shape":
                        _shape_from_the_mask(edit, reader, past, HEADS_FIRST)
    edit.commit()
    return edit.count


def _shape_from_the_mask(edit, shape, past: str, perm) -> None:
    """Nodes for `shape`, a `Shape` of `past` (B, K, P, H) or of its `perm`
    view, with P the mask's width less the new tokens'."""

    def length():
        made = {label: edit.fresh(f"gqa_{label}") for label in ("total_64", "new_64", "past")}
        edit.after(
            MASK_INPUT,
            [
                helper.make_node("Shape", [MASK_INPUT], [made["total_64"]], start=1, end=2),
                helper.make_node("Shape", [IDS_INPUT], [made["new_64"]], start=1, end=2),
                helper.make_node("Sub", [made["total_64"], made["new_64"]], [made["past"]]),
            ],
        )
        return made["past"]

    past_length = edit.once("gqa_past_length", length)
    out = shape.output[0]
    heads, size, dims = (edit.fresh(f"{out}_{label}") for label in ("bk", "h", "dims"))
    nodes = [
        helper.make_node("Shape", [past], [heads], start=0, end=2),
        helper.make_node("Shape", [past], [size], start=3, end=4),
        helper.make_node("Concat", [heads, past_length, size], [dims], axis=0),
    ]
    if perm is not None:
        order = edit.constant(f"gqa_perm_{'_'.join(map(str, perm))}", np.array(perm, np.int64))
        nodes.append(helper.make_node("Gather", [dims, order], [edit.fresh(f"{out}_perm")]))
    start = attribute(shape, "start", 0)
    end = attribute(shape, "end", 4)
    start, end = (max(0, min(4, axis + 4 if axis < 0 else axis)) for axis in (start, end))
    if (start, end) != (0, 4):
        bounds = [edit.constant(f"gqa_at_{at}", np.array([at], np.int64)) for at in (start, end)]
        nodes.append(helper.make_node("Slice", [nodes[-1].output[0], *bounds], ["sliced"]))
    edit.replace(shape, nodes)
    edit.count += 1
