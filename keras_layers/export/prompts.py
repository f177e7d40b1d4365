"""Prompt inputs: the points, point labels and boxes a promptable segmenter reads.

keras-hub's SAM takes, beside its image, `points` `(batch, points, 2)` and
their `labels` `(batch, points)`: 1 a foreground point, 0 a background one,
-1 no point (padding); and `boxes` `(batch, boxes, 2, 2)`, two corners each.
All are float coordinates in the image's pixels. Drawn as other float inputs
are, N(0, 1), they would prove nothing: a label is never exactly 0 or -1, so
the background and padding branches (`where(labels == 0, ...)`) never run,
and a file that swapped them would pass. So these inputs have roles of their
own, told by their names and shapes (the model's own declaration: nothing in
the graph says "this is a label"), and are drawn as a user feeds them:

- points uniform over the image (`extent`: the model's image side where an
  input fixes it, else `DEFAULT_EXTENT` pixels);
- labels cycling through 1, 0 and -1 from a random start, so that every row
  of three points or more holds each;
- boxes as two corners, the top-left above and left of the bottom-right.

Points and their labels share the `points` axis (the model pairs them);
boxes have their own `boxes` axis.
"""

import numpy as np

POINTS, LABELS, BOXES = "points", "point_labels", "boxes"
ROLES = (POINTS, LABELS, BOXES)
# The names keras-hub (and segment-anything's own ONNX export) give them.
_NAMES = {
    POINTS: ("points", "point_coords", "input_points"),
    LABELS: ("labels", "point_labels", "input_labels"),
    BOXES: ("boxes", "input_boxes"),
}
# The coordinate range when no input fixes the image's side.
DEFAULT_EXTENT = 64
# The labels a point takes: foreground, background, no point.
LABEL_VALUES = (1.0, 0.0, -1.0)


def _role_by_shape(name: str, shape: tuple) -> str | None:
    """The prompt role the name and the shape agree on, or `None`."""
    rank = len(shape)
    if name in _NAMES[POINTS] and rank == 3 and shape[2] == 2:
        return POINTS
    if name in _NAMES[LABELS] and rank == 2:
        return LABELS
    if name in _NAMES[BOXES] and (
        (rank == 4 and tuple(shape[2:]) == (2, 2)) or (rank == 3 and shape[2] == 4)
    ):
        return BOXES
    return None


def extent(model) -> int:
    """The side of the image the coordinates are in, in pixels.

    Args:
        model: the Keras model.

    Returns:
        The largest side a layer of the model declares as its
        `input_image_size` (keras-hub's SAM prompt encoder), else the
        largest fixed side of an image input (4 axes, 1, 3 or 4 channels),
        else `DEFAULT_EXTENT`.
    """
    import keras

    for layer in model._flatten_layers(include_self=True):
        declared = getattr(layer, "input_image_size", None)
        if isinstance(declared, int | tuple | list) and declared:
            return int(max(np.atleast_1d(declared)))
    sides = [
        int(side)
        for tensor in keras.tree.flatten(model.inputs)
        if len(tensor.shape) == 4 and tensor.shape[3] in (1, 3, 4)
        for side in tensor.shape[1:3]
        if side
    ]
    return max(sides, default=DEFAULT_EXTENT)


def describe(model, name: str, shape: tuple, dtype: str) -> dict | None:
    """The prompt role of one input, or `None` when it is no prompt.

    Args:
        model: the Keras model.
        name: the input's name.
        shape: its declared shape.
        dtype: its dtype's name.

    Returns:
        The `loading.TensorInfo` fields of a prompt: `role`, `axes`,
        `sequence`, `role_source`, `role_reason` and `value_range` (the
        coordinates' range for points and boxes).
    """
    role = _role_by_shape(name, shape)
    if role is None or "float" not in dtype and "int" not in dtype:
        return None
    axis = BOXES if role == BOXES else POINTS
    axes = ("batch", shape[1] or axis, *shape[2:])
    side = extent(model)
    reason = {
        POINTS: f"named {name!r}, (x, y) pairs: pixel coordinates over 0..{side}",
        LABELS: f"named {name!r}, one per point: 1 foreground, 0 background, -1 no point",
        BOXES: f"named {name!r}, two (x, y) corners each: pixel coordinates over 0..{side}",
    }[role]
    return {
        "role": role,
        "axes": axes,
        "sequence": axis,
        "role_source": "name",
        "role_reason": reason,
        "value_range": None if role == LABELS else (0, side),
    }


def is_prompt(info) -> bool:
    """Whether an input is a prompt (points, their labels, boxes).

    Args:
        info: the input (`loading.TensorInfo`).

    Returns:
        Its role is one of `ROLES`.
    """
    return info.role in ROLES


def draw(info, batch: int, count: int, rng) -> np.ndarray:
    """Prompts for one grid point.

    Args:
        info: the prompt input.
        batch: how many rows.
        count: how many points (or boxes) a row.
        rng: a `numpy.random.Generator`.

    Returns:
        Values of the input's dtype and shape: coordinates uniform over the
        image, labels cycling through `LABEL_VALUES`, boxes with ordered corners.
    """
    if info.role == LABELS:
        start = rng.integers(0, len(LABEL_VALUES), size=(batch, 1))
        cycle = (start + np.arange(count)[None, :]) % len(LABEL_VALUES)
        return np.asarray(LABEL_VALUES)[cycle].astype(info.dtype)
    side = float(info.value_range[1])
    if info.role == POINTS:
        return rng.uniform(0.0, side, (batch, count, 2)).astype(info.dtype)
    corners = np.sort(rng.uniform(0.0, side, (batch, count, 2, 2)), axis=2)
    return corners.reshape((batch, count, *info.shape[2:])).astype(info.dtype)
