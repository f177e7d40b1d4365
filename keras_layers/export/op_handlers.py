"""TensorFlow ops that tf2onnx 1.17 cannot convert, or converts wrongly.

Passed to tf2onnx for one conversion as `custom_op_handlers` (`HANDLERS`), so
nothing is registered in tf2onnx for anyone else. Each handler rewrites the TF
node in place, as tf2onnx's built-in handlers do, as `rewrite(ctx, node)`;
`_handler` gives it tf2onnx's signature, `(ctx, node, name, args)`. tf2onnx
(and with it TensorFlow) is imported by the handlers when tf2onnx calls
them, not with this module: the convert stage imports it at its top.
"""

import numpy as np
from onnx import TensorProto


def erfc(ctx, node) -> None:
    """erfc(x) = 1 - erf(x).

    TensorFlow 2.16+ lowers Keras' exact `gelu` (`0.5 x erfc(-x / sqrt 2)`) to
    `Erfc`, which tf2onnx has no handler for. The subtraction loses erfc's
    relative precision for x > 3 (where erfc < 2e-5), an absolute error below
    float32's resolution of 1, which is all gelu needs.

    Args:
        ctx: tf2onnx's graph being built; node: the TensorFlow node, rewritten in place.
    """
    from tf2onnx import utils

    dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
    erf = ctx.make_node("Erf", [node.input[0]], op_name_scope=node.name)
    one = ctx.make_const(utils.make_name(f"{node.name}_one"), np.array(1, dtype))
    node.type = "Sub"
    ctx.replace_inputs(node, [one.output[0], erf.output[0]])


def select_v2(ctx, node) -> None:
    """`SelectV2(condition, x, y)` -> one ONNX `Where`.

    tf2onnx writes a float `SelectV2` as `x * cast(c) + y * cast(!c)`, and that
    arithmetic turns a selected-away infinity or NaN into NaN (`inf * 0`):
    `where(x > 0, log(x), 0)` came out NaN wherever x <= 0. `SelectV2`
    broadcasts like NumPy, as `Where` does. (Speed: docs/export.md.)

    Args:
        ctx: tf2onnx's graph being built; node: the TensorFlow node, rewritten in place.
    """
    del ctx
    node.type = "Where"


def xla_dynamic_update_slice(ctx, node) -> None:
    """`XlaDynamicUpdateSlice(operand, update, starts)` -> `Where(mask, padded, operand)`.

    Keras' `ops.slice_update` on TensorFlow is this XLA op (keras-hub's cached
    attention writes each step's keys and values with it), and tf2onnx has no
    handler for it. The update is padded out to the operand's shape, starting
    at `starts`, and selected where a mask padded the same way is true. As in
    XLA, each start is clamped to `[0, operand_dim - update_dim]`, so the
    update always lies wholly inside the operand. The work is one pass over
    the operand, as the copy TensorFlow makes.

    Args:
        ctx: tf2onnx's graph being built; node: the TensorFlow node, rewritten in place.
    """
    from tf2onnx import utils

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


# What may stand between an `RFFT` and the ops that read its result as
# floats (`_COMPLEX_READERS`): ops that slice or pass the complex values
# along the leading axes only.
_ALONG_COMPLEX = ("Identity", "StridedSlice", "Slice")
_COMPLEX_READERS = ("ComplexAbs", "Real", "Imag")


def _complex_path(ctx, output: str) -> list | None:
    """The `_ALONG_COMPLEX` nodes from an `RFFT`'s output to the
    `_COMPLEX_READERS` that read it; `None` if any other op reads it."""
    path, frontier = [], [output]
    while frontier:
        for consumer in ctx.find_output_consumers(frontier.pop()):
            if consumer.type in _ALONG_COMPLEX:
                path.append(consumer)
                frontier.append(consumer.output[0])
            elif consumer.type not in _COMPLEX_READERS:
                return None
    return path


def _dft_matrix(size: int, length: int) -> np.ndarray:
    """`(size, 2 * (length // 2 + 1))`: for each bin, the cosine and minus the
    sine of a `length`-point DFT, over the first `size` samples (the rest of a
    shorter frame is the zero padding, a longer one's is cropped), computed
    in float64 and rounded once."""
    bins = length // 2 + 1
    angle = 2 * np.pi * np.outer(np.arange(min(size, length)), np.arange(bins)) / length
    matrix = np.zeros((size, bins, 2))
    matrix[: min(size, length), :, 0] = np.cos(angle)
    matrix[: min(size, length), :, 1] = -np.sin(angle)
    return matrix.reshape(size, 2 * bins).astype(np.float32)


def rfft(ctx, node) -> None:
    """`RFFT(signal, fft_length)` -> one `MatMul` by the DFT's matrix, real
    and imaginary parts on a last axis of 2.

    `tf.signal.stft` (keras-hub's Whisper audio converter: the magnitudes of
    a 400-sample STFT) is `RFFT` then `ComplexAbs`, which tf2onnx 1.17 leaves
    unconverted, as it does `keras.ops.rfft` (`RFFT` then `Real` and `Imag`).
    ONNX has no complex type: the spectrum is a float tensor with a last axis
    (real, imaginary), and the slices between (Whisper drops the last frame)
    act on the leading axes, so they take it as it is.
    ONNX's own `DFT` was measured first: ONNX Runtime's is 1,000 times less
    accurate than TensorFlow's FFT against float64 (1.2e-4 against 1.6e-7 in
    Whisper's log-mel features), so the DFT is a product by its matrix,
    computed in float64 (`_dft_matrix`): as accurate as the FFT, and one
    MatMul ONNX Runtime runs fast. The frame length and `fft_length` must be
    fixed (an STFT's are); a spectrum read by anything but such slices,
    `ComplexAbs`, `Real` and `Imag` is refused, named.

    Args:
        ctx: tf2onnx's graph being built; node: the TensorFlow node, rewritten in place.

    Raises:
        ValueError: the spectrum is read by another op, or a length is not
            fixed (tf2onnx reports it as the op it cannot convert).
    """
    from tf2onnx import utils

    path = _complex_path(ctx, node.output[0])
    if path is None:
        raise ValueError(
            f"RFFT {node.name}: its complex spectrum is read by ops other than slices, "
            "ComplexAbs, Real and Imag, which an ONNX graph cannot hold without a complex type"
        )
    signal, length = node.input
    shape, producer = ctx.get_shape(signal), ctx.get_node_by_output(length)
    if not shape or shape[-1] in (None, -1) or not producer.is_const():
        raise ValueError(f"RFFT {node.name}: its frame length and fft_length must be fixed")
    length = int(producer.get_tensor_value(as_list=False).reshape(-1)[0])
    matrix = ctx.make_const(utils.make_name(f"{node.name}_dft"), _dft_matrix(shape[-1], length))
    scope = {"op_name_scope": node.name}
    spectrum = ctx.make_node("MatMul", [signal, matrix.output[0]], **scope).output[0]
    split = np.array([0] * (len(shape) - 1) + [length // 2 + 1, 2], np.int64)
    split = ctx.make_const(utils.make_name(f"{node.name}_bins"), split)
    node.type = "Reshape"
    ctx.replace_inputs(node, [spectrum, split.output[0]])
    for changed in (node, *path):  # the spectrum and its slices: float, (..., 2)
        ctx.set_dtype(changed.output[0], TensorProto.FLOAT)
        found = ctx.get_shape(changed.output[0])
        if found is not None:
            ctx.set_shape(changed.output[0], [*found, 2])


def complex_abs(ctx, node) -> None:
    """`ComplexAbs` of a spectrum `rfft` wrote as (..., 2): the square root
    of the sum of squares over that last axis.

    Args:
        ctx: tf2onnx's graph being built; node: the TensorFlow node, rewritten in place.
    """
    from tf2onnx import utils

    axes = ctx.make_const(utils.make_name(f"{node.name}_axes"), np.array([-1], np.int64))
    attr = {"keepdims": 0}
    squares = ctx.make_node(
        "ReduceSumSquare", [node.input[0], axes.output[0]], attr=attr, op_name_scope=node.name
    )
    node.type = "Sqrt"
    ctx.replace_inputs(node, [squares.output[0]])


def complex_part(ctx, node) -> None:
    """`Real` or `Imag` of a spectrum `rfft` wrote as (..., 2): index 0 or 1
    of that last axis.

    Args:
        ctx: tf2onnx's graph being built; node: the TensorFlow node, rewritten in place.
    """
    from tf2onnx import utils

    index = np.array(0 if node.type == "Real" else 1, np.int64)
    index = ctx.make_const(utils.make_name(f"{node.name}_part"), index)
    node.type = "Gather"
    ctx.replace_inputs(node, [node.input[0], index.output[0]])
    node.set_attr("axis", -1)


def _handler(rewrite):
    """`rewrite(ctx, node)` with tf2onnx's handler signature, `(ctx, node, name, args)`."""

    def handle(ctx, node, name, args) -> None:
        del name, args
        rewrite(ctx, node)

    return handle


HANDLERS = {
    "ComplexAbs": (_handler(complex_abs), []),
    "Real": (_handler(complex_part), []),
    "Imag": (_handler(complex_part), []),
    "RFFT": (_handler(rfft), []),
    "Erfc": (_handler(erfc), []),
    "SelectV2": (_handler(select_v2), []),
    "XlaDynamicUpdateSlice": (_handler(xla_dynamic_update_slice), []),
}
