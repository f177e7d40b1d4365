"""Image inputs: how to tell one from the model, name its axes, and draw it.

An input is an image when it is a float (or decoded `uint8`) tensor of four
axes that a 2-D spatial layer reads first (`Conv2D`, `DepthwiseConv2D`,
`ZeroPadding2D`, `MaxPooling2D`, ... : a Keras layer whose class name ends in
`2D`; or the `Resizing` of an image converter), directly,
through element-wise layers (`Rescaling`, `Normalization`, a cast), inside
the nested model that takes it (a keras-hub task's backbone), or inside the
custom layer that takes it (keras-hub's `ViTPatchingAndEmbedding` holds the
patching `Conv2D`). That layer's `data_format` gives the layout: NHWC
(`channels_last`, Keras' default) or NCHW. The axes are named `batch`,
`height`, `width` and the channel count; a free channel axis is fed the
channels the first convolution's kernel takes.

Images that the model reads as pixels, 0..255 (decoded `uint8`, or float
images that a `Rescaling(1/255)` or a `Normalization` fitted on pixels reads
first), are drawn over 0..255; others as N(0, 1). Images are drawn at square
sides: the smallest the model accepts (`validating.image_sides`: Keras runs
it and every output is finite and non-empty; a DenseNet's pooling of a 1x1
image is empty), then sizes near
`DEFAULT_SIDES` the model accepts (`accepted_near`: some only take
multiples of their patch or window). Random images are N(0, 1), as a
normalising image converter leaves them; the structured point
(`STRUCTURED`) is a batch of a horizontal gradient, a checkerboard of edges
and a constant image, on which a lost bias or a border handled differently
shows where noise averages it away.
"""

import numpy as np

from keras_layers.export.errors import UsageError, argument
from keras_layers.export.inputs import consumers

ROLE = "image"
# The grid point of structured images, beside the random ones.
STRUCTURED = "structured"
# Sides to draw near, after the smallest: an odd one (a "same" padding of odd
# sizes, strides that do not divide it) and a larger one.
DEFAULT_SIDES = (37, 96)
# How far past a side to look for one the model accepts (a patch or window
# multiple), and how far to look for the smallest.
_SEARCH = 64
# Keras layers that resize or crop images (an image converter's).
_RESIZING = ("Resizing", "CenterCrop", "RandomCrop")
_ELEMENT_WISE = ("Rescaling", "Normalization", "Activation", "Cast", "Identity", "Dropout")


def _layer_format(layer) -> str | None:
    """The `data_format` of a Keras 2-D spatial layer, or `None` for any other."""
    import keras

    name = type(layer).__name__
    spatial = name.endswith("2D") or name in _RESIZING
    if not spatial or not type(layer).__module__.startswith("keras."):
        return None
    if isinstance(layer, keras.Model):
        return None
    return getattr(layer, "data_format", None) or "channels_last"


def _inner_spatial(layer):
    """The first Keras 2-D layer among a custom layer's own sub-layers."""
    for sub in getattr(layer, "_flatten_layers", lambda **_: [])(include_self=False):
        if _layer_format(sub):
            return sub
    return None


def _outputs_of(layer, tensor) -> list:
    """The outputs of `layer`'s calls on `tensor`."""
    import keras

    found = []
    for node in getattr(layer, "_inbound_nodes", []):
        arguments = getattr(node, "arguments", None)
        if arguments is None:
            continue
        values = keras.tree.flatten((arguments.args, arguments.kwargs))
        if any(value is tensor for value in values):
            found += list(getattr(node, "output_tensors", []) or [])
    return found


def _operations_reading(model, tensor) -> list:
    """The plain operations of a functional model (`keras.ops.cast(images)`,
    which are no layers) that read `tensor`, as `consumers` gives layers."""
    import keras

    found = []
    for operation in getattr(model, "operations", []):
        if isinstance(operation, keras.layers.Layer):
            continue
        if _outputs_of(operation, tensor):
            found.append((operation, "x"))
    return found


def _is_to_channels_last(layer) -> bool:
    """A Keras `Permute((2, 3, 1))`: channels first to channels last."""
    return type(layer).__name__ == "Permute" and tuple(getattr(layer, "dims", ())) == (2, 3, 1)


def element_wise_readers(model, tensor, depth: int = 0) -> list:
    """The layers that read `tensor` first, through element-wise layers
    (`Rescaling`, a cast, ...), which are passed, not listed.

    Args:
        model: a functional Keras model.
        tensor: one of its symbolic tensors.
        depth: how many element-wise layers were passed.

    Returns:
        The layers, in the model's order.
    """
    found = []
    for layer, _argument in [*consumers(model, tensor), *_operations_reading(model, tensor)]:
        if depth < 6 and (
            type(layer).__name__ in _ELEMENT_WISE or "cast" in type(layer).__name__.lower()
        ):
            for output in _outputs_of(layer, tensor):
                found += element_wise_readers(model, output, depth + 1)
        else:
            found.append(layer)
    return found


def spatial_reader(model, tensor, depth: int = 0, passed=()):
    """The Keras 2-D layer that first reads `tensor`, at any depth.

    Args:
        model: a functional Keras model.
        tensor: one of its symbolic inputs (or a tensor inside it).
        depth: how many element-wise layers and nested models were passed.
        passed: the element-wise layers passed on the way.

    Returns:
        `(layer, data_format, passed)`, or `None` when no 2-D layer reads it
        first.
    """
    import keras

    if depth > 6:
        return None
    for layer, _argument in [*consumers(model, tensor), *_operations_reading(model, tensor)]:
        data_format = _layer_format(layer)
        if data_format:
            return layer, data_format, passed
        if _is_to_channels_last(layer):  # NCHW in, NHWC to the rest of the model
            for output in _outputs_of(layer, tensor):
                found = spatial_reader(model, output, depth + 1, passed)
                if found and found[1] == "channels_last":
                    return found[0], "channels_first", found[2]
            continue
        if isinstance(layer, keras.Model) and getattr(layer, "inputs", None):
            for inner in keras.tree.flatten(layer.inputs):
                if len(inner.shape) == 4:
                    found = spatial_reader(layer, inner, depth + 1, passed)
                    if found:
                        return found
            continue
        inner = _inner_spatial(layer)
        if inner is not None:
            return inner, _layer_format(inner), passed
        if type(layer).__name__ in _ELEMENT_WISE or "cast" in type(layer).__name__.lower():
            for output in _outputs_of(layer, tensor):
                if tuple(output.shape)[1:] == tuple(tensor.shape)[1:]:
                    found = spatial_reader(model, output, depth + 1, (*passed, layer))
                    if found:
                        return found
    return None


def _pixel_layer(passed) -> str | None:
    """The layer, among those passed before the first spatial one, that
    takes pixels of 0..255: a `Rescaling` by 1/64 or less (1/255, 1/127.5),
    or a `Normalization` whose means are pixel values (above 2)."""
    for layer in passed:
        kind = type(layer).__name__
        if kind == "Rescaling":
            scales = np.abs(np.atleast_1d(np.asarray(layer.scale, dtype=float)))
            if scales.size and scales.max() <= 1 / 64:
                return f"{kind} {layer.name!r} (scale {scales.max():.3g})"
        if kind == "Normalization" and getattr(layer, "mean", None) is not None:
            if float(np.max(np.abs(np.asarray(layer.mean)))) > 2:
                return f"{kind} {layer.name!r} (means of pixel values)"
    return None


def _in_channels(layer) -> int | None:
    kernel = getattr(layer, "kernel", None)
    if kernel is None or len(kernel.shape) != 4:
        return None
    return int(kernel.shape[2])


def describe(model, name: str, shape: tuple, dtype: str, tensor) -> dict | None:
    """The image role of one input, or `None` when it is no image.

    Args:
        model: the Keras model.
        name: the input's name.
        shape: its declared shape.
        dtype: its dtype's name.
        tensor: its symbolic tensor.

    Returns:
        The `loading.TensorInfo` fields of an image: `role`, `axes`,
        `sequence` (`height`, the axis the grid's size sets), `layout`,
        `role_source` and `role_reason`.
    """
    if len(shape) != 4 or not dtype.startswith(("float", "bfloat", "uint8")):
        return None
    found = spatial_reader(model, tensor)
    if found is None:
        return None
    layer, data_format, passed = found
    pixels = _pixel_layer(passed)
    last = data_format == "channels_last"
    channel_axis = 3 if last else 1
    channels = shape[channel_axis] or _in_channels(layer) or 3
    spatial = (1, 2) if last else (2, 3)
    axes = ["batch", None, None, None]
    axes[channel_axis] = channels
    for axis, axis_name in zip(spatial, ("height", "width"), strict=True):
        axes[axis] = shape[axis] if shape[axis] is not None else axis_name
    layout = "NHWC" if last else "NCHW"
    kind = type(layer).__name__
    reason = f"read by {kind} {layer.name!r}: {layout} images of {channels} channels"
    if pixels or dtype == "uint8":
        reason += f"; pixel values 0..255 ({pixels or 'uint8'})"
    return {
        "role": ROLE,
        "axes": tuple(axes),
        "sequence": "height",
        "layout": layout,
        "role_source": "wiring",
        "role_reason": reason,
        "value_range": (0, 255) if pixels or dtype == "uint8" else None,
    }


def is_image(info) -> bool:
    """Whether an input is an image.

    Args:
        info: the input (`loading.TensorInfo`).

    Returns:
        Its role is `image`.
    """
    return info.role == ROLE


def layout(info) -> str:
    """The image's layout.

    Args:
        info: the image input.

    Returns:
        `NHWC` or `NCHW`.
    """
    return info.layout or "NHWC"


def free_axes(info) -> list:
    """The image's spatial axes the model leaves free.

    Args:
        info: the image input.

    Returns:
        Those of `height` and `width` that are not fixed.
    """
    return [name for name in info.axes if name in ("height", "width")]


def dims(info, batch: int, size) -> list:
    """The image's shape at a size, its fixed sizes kept.

    Args:
        info: the image input.
        batch: the batch.
        size: a side, or `(height, width)`.

    Returns:
        The shape, in the image's layout.
    """
    height, width = (size, size) if isinstance(size, int) else size
    given = {"height": height, "width": width}
    return [batch if axis == 0 else given.get(name, name) for axis, name in enumerate(info.axes)]


def spatial_size(info, size) -> tuple:
    """The image's height and width at a size.

    Args:
        info: the image input.
        size: a side, or `(height, width)`.

    Returns:
        `(height, width)`, its fixed sizes kept.
    """
    shape = dims(info, 1, size)
    return (shape[1], shape[2]) if layout(info) == "NHWC" else (shape[2], shape[3])


def draw(info, batch: int, size, rng, structured: bool = False) -> np.ndarray:
    """Images for one grid point.

    Args:
        info: the image input (`loading.TensorInfo`).
        batch: how many.
        size: the side of its free spatial axes, or `(height, width)`.
        rng: a `numpy.random.Generator`.
        structured: a horizontal gradient, a checkerboard of 4-pixel squares
            of -1 and 1, and a constant 0.5 image, repeated to `batch`, each
            channel weighted apart (1 down to -0.5); otherwise N(0, 1)
            noise. Over 0..255 where the model takes pixels
            (`value_range`: a uint8 input, a `Rescaling` by 1/255 or a
            `Normalization` of pixel means first).

    Returns:
        The batch, of the input's dtype.
    """
    shape = dims(info, batch, size)
    pixels = info.value_range is not None  # 0..255, what the model's first layers expect
    if not structured:
        if pixels:
            return rng.integers(0, 256, shape).astype(info.dtype)
        return rng.standard_normal(shape).astype(info.dtype)
    nhwc = layout(info) == "NHWC"
    height, width = (shape[1], shape[2]) if nhwc else (shape[2], shape[3])
    rows, columns = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    planes = [
        np.broadcast_to(np.linspace(-1.0, 1.0, width), (height, width)),
        np.where((rows // 4 + columns // 4) % 2 == 0, -1.0, 1.0),
        np.full((height, width), 0.5),
    ]
    images = np.stack([planes[index % len(planes)] for index in range(batch)])
    channels = shape[3] if nhwc else shape[1]
    # Each channel its own share of the plane, so that a swap of channels shows.
    weights = np.linspace(1.0, -0.5, channels) if channels > 1 else np.ones(1)
    images = images[..., None] * weights
    if not nhwc:
        images = images.transpose(0, 3, 1, 2)
    if pixels:  # -1..1 onto 0..255
        images = np.rint((images + 1.0) * 127.5)
    return np.ascontiguousarray(images).astype(info.dtype)


def label(info, batch: int, size) -> str:
    """A grid point as the model's own shape.

    Args:
        info: the image input.
        batch: the batch.
        size: a side, or `(height, width)`.

    Returns:
        The shape as `2x224x224x3`.
    """
    return "x".join(str(d) for d in dims(info, batch, size))


def accepted_near(accepts, side: int, smallest: int) -> int | None:
    """The first side at or above `side` (and `smallest`) the model accepts.

    Args:
        accepts: `side -> bool`.
        side: the side wanted.
        smallest: the smallest side the model takes.

    Returns:
        The side, or `None` when none within `_SEARCH` sizes is accepted.
    """
    start = max(side, smallest)
    for candidate in range(start, start + _SEARCH):
        if accepts(candidate):
            return candidate
    return None


def with_names(model, inputs, outputs, name: str):
    """A Keras model of `inputs` to `outputs` whose outputs keep `model`'s
    output names (an `Identity` of each, named so), not those of the nested
    model that computes them.

    Args:
        model: the model whose output names to keep.
        inputs: the new model's inputs.
        outputs: `model` called on them.
        name: the new model's name.

    Returns:
        The model.
    """
    import keras

    flat = keras.tree.flatten(outputs)
    names = list(getattr(model, "output_names", None) or [])
    if len(names) == len(flat):
        flat = [keras.layers.Identity(name=n)(o) for n, o in zip(names, flat, strict=True)]
    return keras.Model(inputs, flat if len(flat) > 1 else flat[0], name=name)


def channels_first(loaded):
    """The loaded model taking its NHWC images as NCHW: a Keras model that
    permutes each to NHWC and calls the model (loaded again, its image's
    axes read `batch, channels, height, width`). tf2onnx writes the permute
    as one Transpose, which the slim stage cancels against the first Conv's.

    Args:
        loaded: the `loading.LoadedModel`.

    Returns:
        The new Keras model (its weights are the model's).

    Raises:
        UsageError: the model takes no NHWC image, or takes a dict of inputs.
    """
    import keras

    nhwc = [info for info in loaded.inputs if is_image(info) and layout(info) == "NHWC"]
    if not nhwc or loaded.input_structure == "dict":
        found = ", ".join(f"{i.name} ({i.role})" for i in loaded.inputs)
        raise UsageError(
            f"{argument('channels_first', True)}: the model takes no NHWC image to take as "
            f"NCHW (its inputs: {found}); leave it out"
            if not nhwc
            else f"{argument('channels_first', True)}: a model that takes a dict of inputs "
            "is not wrapped; permute its images in the model"
        )
    model, taken, called = loaded.model, [], []
    for info in loaded.inputs:
        if info in nhwc:
            height, width, channels = info.shape[1:]
            image = keras.Input(shape=(channels, height, width), name=info.name, dtype=info.dtype)
            taken.append(image)
            called.append(keras.layers.Permute((2, 3, 1))(image))
        else:
            tensor = keras.Input(shape=info.shape[1:], name=info.name, dtype=info.dtype)
            taken.append(tensor)
            called.append(tensor)
    args = called[0] if loaded.input_structure == "single" else called
    return with_names(model, taken[0] if len(taken) == 1 else taken, model(args), model.name)
