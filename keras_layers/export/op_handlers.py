"""TensorFlow ops that tf2onnx 1.17 cannot convert, or converts wrongly.

Passed to tf2onnx for one conversion as `custom_op_handlers` (`HANDLERS`), so
nothing is registered in tf2onnx for anyone else. Each handler rewrites the TF
node in place, as tf2onnx's built-in handlers do; the signature is tf2onnx's
`(ctx, node, name, args)`.
"""

import numpy as np
from tf2onnx import utils


def erfc(ctx, node, name, args) -> None:
    """erfc(x) = 1 - erf(x).

    TensorFlow 2.16+ lowers Keras' exact `gelu` (`0.5 x erfc(-x / sqrt 2)`) to
    `Erfc`, which tf2onnx has no handler for. The subtraction loses erfc's
    relative precision for x > 3 (where erfc < 2e-5), an absolute error below
    float32's resolution of 1, which is all gelu needs.
    """
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
    """
    del ctx, name, args
    node.type = "Where"


HANDLERS = {"Erfc": (erfc, []), "SelectV2": (select_v2, [])}
