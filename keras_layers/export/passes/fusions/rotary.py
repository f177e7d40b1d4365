"""Rotary position embeddings folded into ONNX Runtime's `RotaryEmbedding`.

keras-hub's `RotaryEmbedding` layer (Llama, Mistral, Qwen, Gemma, Phi-3, ...)
rotates each query and key head as RoFormer does, with the "rotate half"
pairing: feature i is paired with feature i + H/2. Traced, every rotation is

    x1, x2 = Split(x, 2, axis=-1)
    r = Reshape(Concat(Unsqueeze(-x2, -2), Unsqueeze(x1, -2), axis=-2), shape(x))
    y = x * cos(e) + r * sin(e)

nine nodes and five passes over the activations, twice in every layer, with
`e` the (1, sequence, 1, H) angles: the (sequence, H/2) angle table written
twice along the last axis (`stack((f, f), -2)` reshaped). ONNX Runtime's
`RotaryEmbedding` (com.microsoft) does the rotation in one pass from a
(positions, H/2) table of cosines and one of sines.

A match must prove every fact the op assumes, from the symbolic dims of
`keras_layers.export.graph` (each dim an int times a product of input-axis
names): x is (batch, sequence, heads, H) float32; the angles are
(1, sequence, 1, H) for the same `sequence`, so row s of the table is
position s (the op is given position offset 0; a decoder's cache offset is
already inside the angles); the two halves of the angles are one tensor
written twice; the rotated half is (-x2, x1) reshaped back to x's dims. The
table is taken from the angles' first half, once per layer; the layers'
copies are merged afterwards with the other shared shapes. A candidate (an
`Add` of two `Mul`s, one reading the rotated half) that fails a check is left
alone, and `declined` says why.
"""

import numpy as np
from onnx import TensorProto, helper

from keras_layers.export.graph import ONE, Dim, symbolic_dims
from keras_layers.export.passes.context import Context, PassResult
from keras_layers.export.passes.fusions.pattern import Rule, run_rule

MAKES = ("RotaryEmbedding",)

TWO = Dim.of(2)
# Views that keep the order of the values: they only insert or drop axes of
# size 1 when their input and output dims agree once the 1s are dropped.
_VIEWS = ("Unsqueeze", "Squeeze", "Reshape", "Identity")


def _axis(node) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 0)


def _without_ones(dims):
    """`dims` with every axis of size 1 dropped; None if a dim is unproven."""
    return None if dims is None or None in dims else tuple(d for d in dims if d != ONE)


def _is_whole_slice(g, dims, node) -> bool:
    """A Slice in steps of 1 whose output has its input's dims: all of it."""
    steps = g.const(node.input[4]) if len(node.input) > 4 and node.input[4] else np.ones(1)
    same = dims.get(node.input[0]) == dims.get(node.output[0])
    return steps is not None and bool(np.all(steps == 1)) and same


def _through_views(g, dims, name):
    """The first tensor up the chain of value-preserving views above `name`
    (size-1 axes put in or taken out, whole slices)."""
    while (node := g.producer.get(name)) is not None:
        kept = _without_ones(dims.get(node.input[0]))
        if node.op_type == "Slice" and kept is not None and _is_whole_slice(g, dims, node):
            name = node.input[0]
        elif node.op_type in _VIEWS and kept is not None and kept == _without_ones(dims.get(name)):
            name = node.input[0]
        else:
            break
    return name


def _halves_of(g, dims, first, second):
    """x when `first` and `second` are the two halves of
    `Split(x, 2, last axis)`, in that order; else None."""
    split = g.producer.get(first)
    if split is None or split.op_type != "Split" or list(split.output) != [first, second]:
        return None
    x, half = dims.get(split.input[0]), dims.get(first)
    if x is None or half is None or None in x + half or dims.get(second) != half:
        return None
    if _axis(split) % len(x) != len(x) - 1 or half != x[:-1] + (x[-1].divided_by(TWO),):
        return None
    return split.input[0]


def _rotated_half(g, dims, name):
    """x when `name` is x's features rotated by half, (-x2, x1): stacked on a
    new axis and reshaped back, as keras-hub writes it, or concatenated on the
    last axis; else None."""
    node = g.producer.get(name)
    stacked = node is not None and node.op_type == "Reshape"
    concat = g.node(node.input[0], "Concat") if stacked else g.node(name, "Concat")
    out = dims.get(concat.output[0]) if concat is not None else None
    if out is None or None in out or len(concat.input) != 2:
        return None
    parts = list(concat.input)
    if stacked:  # (..., 1, h) twice -> (..., 2, h), merged into (..., 2h) after
        unsqueezes = [g.node(part, "Unsqueeze") for part in parts]
        if _axis(concat) % len(out) != len(out) - 2 or out[-2] != TWO or None in unsqueezes:
            return None
        parts = [u.input[0] for u in unsqueezes]
    elif _axis(concat) % len(out) != len(out) - 1:
        return None
    negation = g.node(parts[0], "Neg")
    x = negation and _halves_of(g, dims, parts[1], negation.input[0])
    if x is None or dims.get(name) != dims.get(x):
        return None
    return x if out[-1] * (TWO if stacked else ONE) == dims[x][-1] else None


def _duplicated_half(g, dims, name):
    """f when the angles `name` are f written twice along their last axis
    (`stack((f, f), -2)` reshaped, or `concat((f, f), -1)`), through size-1
    views; else None."""
    name = _through_views(g, dims, name)
    node = g.producer.get(name)
    merged = dims.get(name)
    if node is None or merged is None or None in merged:
        return None
    if node.op_type == "Concat":  # on the last axis, or one only size-1 axes follow
        same = len(node.input) == 2 and node.input[0] == node.input[1]
        last = all(d == ONE for d in merged[_axis(node) % len(merged) + 1 :])
        return node.input[0] if same and last else None
    stack = g.node(node.input[0], "Concat") if node.op_type == "Reshape" else None
    stacked = dims.get(stack.output[0]) if stack is not None else None
    if stacked is None or None in stacked or list(stack.input) != [stack.input[0]] * 2:
        return None
    # (..., 2, h) -> (..., 2h): the stacked axis is the one merged.
    if _axis(stack) % len(stacked) != len(stacked) - 2 or stacked[-2] != TWO:
        return None
    if _without_ones(stacked[:-2]) != _without_ones(merged[:-1]) or stacked[-1] * TWO != merged[-1]:
        return None
    return stack.input[0]


def _match_rotary(g, add):
    """(x, angle table's half, heads, head size, add) for one rotation, why it
    is not one, or None when `add` is no candidate (no rotated half added)."""
    dims, shapes = g.dims, g.shapes
    products = [g.node(name, "Mul") for name in add.input]
    if None in products:
        return None
    found = next(
        (
            (rotated, plain, x, rotated.input[1 - position])
            for rotated, plain in (products, products[::-1])
            for position in (0, 1)
            if (x := _rotated_half(g, dims, rotated.input[position])) is not None
        ),
        None,
    )
    if found is None:
        return None
    rotated, plain, x, sine_side = found
    if x not in plain.input:
        return "the rotated half is not added to x times a cosine"
    cosine_side = plain.input[1] if plain.input[0] == x else plain.input[0]
    shape = dims[x]
    if len(shape) != 4 or shape[2].static is None or shape[3].static is None:
        return "x is not (batch, sequence, heads, head size) with constant heads and size"
    if shapes.get(x, (None, None))[1] != TensorProto.FLOAT:
        return "x is not float32"
    # ESM takes cos(e)[None, :, None, :][:, :sequence]: the cosine of a view
    # of the angles is that view of their cosine.
    cosine = g.node(_through_views(g, dims, cosine_side), "Cos")
    sine = g.node(_through_views(g, dims, sine_side), "Sin")
    if cosine is None or sine is None or cosine.input[0] != sine.input[0]:
        return "the factors are not the cosine and sine of one tensor of angles"
    angles, given = cosine.input[0], dims.get(cosine_side)
    shared, per_row = (ONE, shape[1], ONE, shape[3]), (shape[0], shape[1], ONE, shape[3])
    if given not in (shared, per_row) or dims.get(sine_side) != given:
        return "the angles are not (1 or batch, sequence, 1, head size) for x's sequence"
    if _without_ones(dims.get(angles)) != _without_ones(given):
        return "the angles are not (1 or batch, sequence, 1, head size) for x's sequence"
    if any(dims.get(out) != shape for out in (add.output[0], *plain.output, *rotated.output)):
        return "a product broadcasts past x's shape"
    half = _duplicated_half(g, dims, angles)
    if half is None:
        return "the angles' two halves are not one tensor written twice"
    if _without_ones(dims.get(half)) != _without_ones((*given[:2], shape[3].divided_by(TWO))):
        return (
            "the angle table is not (sequence, head size / 2) or (batch, sequence, head size / 2)"
        )
    positions = None
    if given == per_row and given != shared:
        positions = _positions_times_frequencies(g, dims, half, shape[3].static // 2)
        if positions is None:
            return "each row's angles are not its integer positions times constant frequencies"
    return x, half, shape[2].static, shape[3].static, add, positions


def _positions_times_frequencies(g, dims, half, count: int):
    """(positions, frequencies) when the angles `half` are
    `Cast(positions)[..., None] * frequencies`: integer positions (batch,
    sequence), a constant vector of `count` frequencies (keras-hub's
    `RotaryEmbedding` given `position_ids`); else None."""
    product = g.node(_through_views(g, dims, half), "Mul")
    if product is None:
        return None
    for side in (0, 1):
        values = g.const(product.input[side])
        if values is None or values.size != count or values.shape[-1] != count:
            continue
        cast = g.node(_through_views(g, dims, product.input[1 - side]), "Cast")
        if cast is None:
            continue
        integer = g.shapes.get(cast.input[0], (None, None))[1]
        if (
            integer in (TensorProto.INT64, TensorProto.INT32)
            and len(dims.get(cast.input[0]) or ()) == 2
        ):
            return cast.input[0], integer, values.reshape(-1).astype(np.float32)
    return None


def _constant(edit, values: list) -> str:
    name = "fused_rotary_" + "_".join(str(v).replace("-", "m") for v in values)
    return edit.constant(name, np.array(values, np.int64))


def _table_for_positions(edit, names: dict, positions) -> list:
    """Nodes of the table of angles `names["table"]` (positions up to the
    largest given, and at least as many as the sequence's, head size / 2),
    and the name of the positions as int64."""
    ids, integer, frequencies = positions
    scalar = {v: edit.constant(f"fused_rotary_scalar_{v}", np.array(v, np.int64)) for v in (0, 1)}
    frequencies = edit.constant(
        "fused_rotary_frequencies_" + "_".join(f"{v:.9g}" for v in frequencies[:2]),
        frequencies.reshape(1, -1),
    )
    step = ("top", "end", "shape", "length", "count", "rows", "row")
    step = {name: edit.fresh(f"{names['table']}_{name}") for name in step}
    nodes = []
    if integer != TensorProto.INT64:  # the op reads int64 positions
        nodes.append(helper.make_node("Cast", [ids], [names["ids"]], to=TensorProto.INT64))
        ids = names["ids"]
    return [
        *nodes,
        helper.make_node("ReduceMax", [ids], [step["top"]], keepdims=0),
        helper.make_node("Add", [step["top"], scalar[1]], [step["end"]]),
        # ONNX Runtime wants at least a row per position of the sequence.
        helper.make_node("Shape", [ids], [step["shape"]], start=1, end=2),
        helper.make_node("Squeeze", [step["shape"], _constant(edit, [0])], [step["length"]]),
        helper.make_node("Max", [step["end"], step["length"]], [step["count"]]),
        helper.make_node("Range", [scalar[0], step["count"], scalar[1]], [step["rows"]]),
        helper.make_node("Cast", [step["rows"]], [step["row"]], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", [step["row"], _constant(edit, [1])], [names["angles"]]),
        helper.make_node("Mul", [names["angles"], frequencies], [names["table"]]),
    ], ids


def _rewrite(edit, match) -> None:
    x, half, heads, size, add, positions = match
    out = add.output[0]
    steps = ("table", "cos", "sin", "in", "out", "ids", "angles")
    names = {step: edit.fresh(f"{out}_rotary_{step}") for step in steps}
    if positions is None:  # row s of the table is position s
        table = [
            helper.make_node("Reshape", [half, _constant(edit, [-1, size // 2])], [names["table"]])
        ]
        ids = _constant(edit, [0])
    else:  # each row's positions index a table up to the largest
        table, ids = _table_for_positions(edit, names, positions)
    edit.replace(
        add,
        [
            *table,
            helper.make_node("Cos", [names["table"]], [names["cos"]]),
            helper.make_node("Sin", [names["table"]], [names["sin"]]),
            helper.make_node("Reshape", [x, _constant(edit, [0, 0, heads * size])], [names["in"]]),
            helper.make_node(
                "RotaryEmbedding",
                [names["in"], ids, names["cos"], names["sin"]],
                [names["out"]],
                domain="com.microsoft",
                num_heads=heads,
                interleaved=0,
            ),
            helper.make_node("Reshape", [names["out"], _constant(edit, [0, 0, heads, size])], []),
        ],
    )


RULE = Rule(
    makes="RotaryEmbedding",
    anchor="Add",
    form="x * cos(e) + rotate_half(x) * sin(e),  e = concat(f, f)",
    match=_match_rotary,
    rewrite=_rewrite,
)


def run(proto, context: Context) -> PassResult:
    """Replace each rotate-half rotary embedding by `RotaryEmbedding` (com.microsoft).

    The graph's dynamic axes must be named (the `axis_names` pass): the
    match proves its facts from `graph.symbolic_dims`, which read them.

    Args:
        proto: the ModelProto, rewritten in place.
        context: its `shapes` (`graph.tensor_shapes`, for element types) and
            `positive` (the input axis names that are at least 1).

    Returns:
        How many rotations were fused, under "RotaryEmbedding", and
        (candidate's output, reason) for each candidate left alone.
    """
    dims = symbolic_dims(proto.graph, context.positive)
    return run_rule(RULE, proto, context.shapes, dims)
