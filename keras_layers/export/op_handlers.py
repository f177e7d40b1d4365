"""TensorFlow ops that tf2onnx 1.17 cannot convert, or converts wrongly.

Passed to tf2onnx for one conversion as `custom_op_handlers` (`HANDLERS`), so
nothing is registered in tf2onnx for anyone else. Each handler rewrites the TF
node in place, as tf2onnx's built-in handlers do; the signature is tf2onnx's
`(ctx, node, name, args)`. tf2onnx (and with it TensorFlow) is imported by
the handlers when tf2onnx calls them, not with this module: the convert
stage imports it at its top.
"""

import numpy as np
from onnx import TensorProto


def erfc(ctx, node, name, args) -> None:
    """erfc(x) = 1 - erf(x).

    TensorFlow 2.16+ lowers Keras' exact `gelu` (`0.5 x erfc(-x / sqrt 2)`) to
    `Erfc`, which tf2onnx has no handler for. The subtraction loses erfc's
    relative precision for x > 3 (where erfc < 2e-5), an absolute error below
    float32's resolution of 1, which is all gelu needs.

    Args:
        ctx: tf2onnx's graph being built.
        node: the TensorFlow node, rewritten in place.
        name: unused (tf2onnx's handler signature).
        args: unused (tf2onnx's handler signature).
    """
    from tf2onnx import utils

    del name, args
    dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
    erf = ctx.make_node("Erf", [node.input[0]], op_name_scope=node.name)
    one = ctx.make_const(utils.make_name(f"{node.name}_one"), np.array(1, dtype))
    node.type = "Sub"
    ctx.replace_inputs(node, [one.output[0], erf.output[0]])


def select_v2(ctx, node, name, args) -> None:
    """`SelectV2(condition, x, y)` -> one ONNX `Where`.

    tf2onnx writes a float `SelectV2` as `x * cast(c) + y * cast(!c)`, and that
    arithmetic turns a selected-away infinity or NaN into NaN (`inf * 0`):
    `where(x > 0, log(x), 0)` came out NaN wherever x <= 0. `SelectV2`
    broadcasts like NumPy, as `Where` does. (Speed: docs/export.md.)

    Args:
        ctx: tf2onnx's graph being built.
        node: the TensorFlow node, rewritten in place.
        name: unused (tf2onnx's handler signature).
        args: unused (tf2onnx's handler signature).
    """
    del ctx, name, args
    node.type = "Where"


def xla_dynamic_update_slice(ctx, node, name, args) -> None:
    """`XlaDynamicUpdateSlice(operand, update, starts)` -> `Where(mask, padded, operand)`.

    Keras' `ops.slice_update` on TensorFlow is this XLA op (keras-hub's cached
    attention writes each step's keys and values with it), and tf2onnx has no
    handler for it. The update is padded out to the operand's shape, starting
    at `starts`, and selected where a mask padded the same way is true. As in
    XLA, each start is clamped to `[0, operand_dim - update_dim]`, so the
    update always lies wholly inside the operand. The work is one pass over
    the operand, as the copy TensorFlow makes.

    Args:
        ctx: tf2onnx's graph being built.
        node: the TensorFlow node, rewritten in place.
        name: unused (tf2onnx's handler signature).
        args: unused (tf2onnx's handler signature).
    """
    from tf2onnx import utils

    del name, args
    operand, update, starts = node.input
    scope = {"op_name_scope": node.name}
    operand_shape = ctx.make_node("Shape", [operand], **scope).output[0]
    update_shape = ctx.make_node("Shape", [update], **scope).output[0]
    room = ctx.make_node("Sub", [operand_shape, update_shape], **scope).output[0]
    starts = ctx.make_node("Cast", [starts], attr={"to": TensorProto.INT64}, **scope).output[0]
    zero = ctx.make_const(utils.make_name(f"{node.name}_zero"), np.array(0, np.int64)).output[0]
    starts = ctx.make_node("Min", [starts, room], **scope).output[0]
    starts = ctx.make_node("Max", [starts, zero], **scope).output[0]
    after = ctx.make_node("Sub", [room, starts], **scope).output[0]
    pads = ctx.make_node("Concat", [starts, after], attr={"axis": 0}, **scope).output[0]
    true = ctx.make_const(utils.make_name(f"{node.name}_true"), np.array([True])).output[0]
    inside = ctx.make_node("Expand", [true, update_shape], **scope).output[0]
    mask = ctx.make_node("Pad", [inside, pads], **scope).output[0]
    padded = ctx.make_node("Pad", [update, pads], **scope).output[0]
    node.type = "Where"
    ctx.replace_inputs(node, [mask, padded, operand])


HANDLERS = {
    "Erfc": (erfc, []),
    "SelectV2": (select_v2, []),
    "XlaDynamicUpdateSlice": (xla_dynamic_update_slice, []),
}
