"""Prompt inputs: the points, point labels, boxes and masks a promptable segmenter reads.

keras-hub's SAM takes, beside its image, `points` `(batch, points, 2)` and
their `labels` `(batch, points)`: 1 a foreground point, 0 a background one,
-1 no point (padding); `boxes` `(batch, boxes, 2, 2)`, two corners each, all
float coordinates in the image's pixels; and `masks` `(batch, masks, H, W,
1)`, a mask of logits from an earlier prediction (one, or none), at four
times the side of its image embedding. SAM3 takes `boxes` `(batch, boxes,
5)`: each the index of its image in the batch, then its centre, width and
height as fractions of the image, and `box_labels` `(batch, boxes)`: 1
positive, 0 negative, -10 padding. Drawn as other inputs are, N(0, 1), they
would prove nothing: a label is never exactly 0 or -1, so the background
and padding branches (`where(labels == 0, ...)`) never run, and a file that
swapped them would pass; SAM3 would gather features of images that are not
in the batch. So these inputs have roles of their own, told by their names
and shapes (the model's own declaration: nothing in the graph says "this is
a label"), and are drawn as a user feeds them:

- points uniform over the image (`extent`: the model's image side where an
  input fixes it, else `DEFAULT_EXTENT` pixels);
- labels cycling through their values from a random start, so that every
  row of three points or more holds each; SAM3's box labels through 1 and 0
  only: keras-hub's SAM3 backbone hands its geometry encoder the labels as
  the boxes' mask and the mask as the labels (positional arguments in the
  other order), so a padding box (-10) makes the model fail in Keras itself;
- boxes as two corners, the top-left above and left of the bottom-right, or
  as SAM3's indexed boxes, inside the image;
- masks as N(0, 1) logits.

Points and their labels share the `points` axis (the model pairs them);
boxes (with SAM3's labels) have their own `boxes` axis, masks their `masks`.
Boxes and masks are optional prompts: a model branches on whether it got
any (SAM's `cond` on `shape(masks)[1] == 0`), so a model with one has the
grid point `UNPROMPTED` too: one image with none of them (`count`), and
both branches are proved.
"""

import numpy as np

POINTS, LABELS, BOXES = "points", "point_labels", "boxes"
BOX_LABELS, MASKS = "box_labels", "mask_prompts"
ROLES = (POINTS, LABELS, BOXES, BOX_LABELS, MASKS)
# The prompts a user may leave out, and the grid point that feeds none.
OPTIONAL = (BOXES, BOX_LABELS, MASKS)
UNPROMPTED = "unprompted"
# The names keras-hub (and segment-anything's own ONNX export) give them.
_NAMES = {
    POINTS: ("points", "point_coords", "input_points"),
    LABELS: ("labels", "point_labels", "input_labels"),
    BOXES: ("boxes", "input_boxes"),
    BOX_LABELS: ("box_labels", "input_boxes_labels"),
    MASKS: ("masks", "mask_inputs", "input_masks"),
}
# The axis each role's count lies on.
_AXES = {POINTS: POINTS, LABELS: POINTS, BOXES: BOXES, BOX_LABELS: BOXES, MASKS: "masks"}
# The coordinate range when no input fixes the image's side.
DEFAULT_EXTENT = 64
# The labels a point takes: foreground, background, no point.
LABEL_VALUES = (1.0, 0.0, -1.0)
# The labels a SAM3 box takes: positive, negative, padding.
BOX_LABEL_VALUES = (1, 0, -10)
# SAM's mask prompt is at this many times its image embedding's side.
MASK_SCALE = 4


def _role_by_shape(name: str, shape: tuple) -> str | None:
    """The prompt role the name and the shape agree on, or `None`."""
    rank = len(shape)
    if name in _NAMES[POINTS] and rank == 3 and shape[2] == 2:
        return POINTS
    if name in _NAMES[LABELS] and rank == 2:
        return LABELS
    if name in _NAMES[BOXES] and (
        (rank == 4 and tuple(shape[2:]) == (2, 2)) or (rank == 3 and shape[2] in (4, 5))
    ):
        return BOXES
    if name in _NAMES[BOX_LABELS] and rank == 2:
        return BOX_LABELS
    if name in _NAMES[MASKS] and rank == 5 and shape[4] == 1:
        return MASKS
    return None


def _mask_side(model) -> int:
    """The side of SAM's mask prompt: `MASK_SCALE` times the image
    embedding's that a layer declares (`image_embedding_size`), else the
    image's (`extent`)."""
    for layer in model._flatten_layers(include_self=True):
        declared = getattr(layer, "image_embedding_size", None)
        if isinstance(declared, int | tuple | list) and declared:
            return MASK_SCALE * int(max(np.atleast_1d(declared)))
    return extent(model)


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
        `sequence`, `role_source`, `role_reason`, `value_range` (the
        coordinates' range for points and boxes) and, for masks, `widths`
        (their side, twice, and 1).
    """
    role = _role_by_shape(name, shape)
    if role is None or "float" not in dtype and "int" not in dtype:
        return None
    axis = _AXES[role]
    side = extent(model)
    found = {
        "role": role,
        "axes": ("batch", shape[1] or axis, *shape[2:]),
        "sequence": axis,
        "role_source": "name",
        "value_range": None if role in (LABELS, BOX_LABELS, MASKS) else (0, side),
    }
    if role == BOXES and shape[-1] == 5:
        found["value_range"] = (0, 1)
        found["role_reason"] = (
            f"named {name!r}, five numbers each: the index of its image in the batch, then "
            "its centre, width and height as fractions of the image (SAM3)"
        )
    elif role == MASKS:
        mask = _mask_side(model)
        found["widths"] = (mask, mask, 1)
        found["axes"] = ("batch", shape[1] or axis, shape[2] or "mask_height")
        found["axes"] += (shape[3] or "mask_width", 1)
        found["role_reason"] = (
            f"named {name!r}, one mask of logits per image (or none), {mask} x {mask}: "
            f"{MASK_SCALE} times the image embedding's side"
        )
    else:
        found["role_reason"] = {
            POINTS: f"named {name!r}, (x, y) pairs: pixel coordinates over 0..{side}",
            LABELS: f"named {name!r}, one per point: 1 foreground, 0 background, -1 no point",
            BOXES: f"named {name!r}, two (x, y) corners each: pixel coordinates over 0..{side}",
            BOX_LABELS: f"named {name!r}, one per box: 1 positive, 0 negative, -10 padding",
        }[role]
    return found


def is_prompt(info) -> bool:
    """Whether an input is a prompt (points, boxes, their labels, masks).

    Args:
        info: the input (`loading.TensorInfo`).

    Returns:
        Its role is one of `ROLES`.
    """
    return info.role in ROLES


def has_optional(inputs) -> bool:
    """Whether the model takes a prompt a user may leave out (`OPTIONAL`)
    on an axis of its own: the grid gets its `UNPROMPTED` point."""
    return any(info.role in OPTIONAL and info.shape[1] is None for info in inputs)


def count(info, given: int, unprompted: bool) -> int:
    """How many prompts of this input a row holds at a grid point.

    Args:
        info: the prompt input.
        given: the count the grid point gives its axis.
        unprompted: the grid point is `UNPROMPTED`.

    Returns:
        The input's fixed count where it declares one; else 0 for an
        optional prompt at the `UNPROMPTED` point (the model's branch for
        "none"), at most 1 for masks (SAM embeds one per image), else `given`.
    """
    if info.shape[1] is not None:
        return info.shape[1]
    if info.role in OPTIONAL and unprompted:
        return 0
    return min(given, 1) if info.role == MASKS else given


def sizes(info, prompts: int) -> tuple:
    """Every size after the batch of `prompts` prompts of this input.

    Args:
        info: the prompt input.
        prompts: how many prompts a row (masks: at most 1).

    Returns:
        The sizes of axes 1.. (a mask's side from its `widths`).
    """
    if info.role == MASKS:
        return (min(prompts, 1), *info.widths)
    return (prompts, *info.shape[2:])


def draw(info, batch: int, count: int, rng) -> np.ndarray:
    """Prompts for one grid point.

    Args:
        info: the prompt input.
        batch: how many rows.
        count: how many prompts a row (`count`).
        rng: a `numpy.random.Generator`.

    Returns:
        Values of the input's dtype and shape: coordinates uniform over the
        image, labels as the module says, boxes with ordered
        corners (or SAM3's: each row's own image index, then a centre,
        width and height that stay inside the image), masks N(0, 1).
    """
    if info.role in (LABELS, BOX_LABELS):
        values = LABEL_VALUES if info.role == LABELS else BOX_LABEL_VALUES[:2]
        start = rng.integers(0, len(values), size=(batch, 1))
        cycle = (start + np.arange(count)[None, :]) % len(values)
        return np.asarray(values)[cycle].astype(info.dtype)
    if info.role == MASKS:
        return rng.standard_normal((batch, *sizes(info, count))).astype(info.dtype)
    side = float(info.value_range[1])
    if info.role == POINTS:
        return rng.uniform(0.0, side, (batch, count, 2)).astype(info.dtype)
    if info.shape[-1] == 5:
        extents = rng.uniform(0.05, 0.5, (batch, count, 2))
        centres = rng.uniform(extents / 2, 1.0 - extents / 2)
        index = np.broadcast_to(np.arange(batch, dtype=float)[:, None, None], (batch, count, 1))
        return np.concatenate([index, centres, extents], axis=-1).astype(info.dtype)
    corners = np.sort(rng.uniform(0.0, side, (batch, count, 2, 2)), axis=2)
    return corners.reshape((batch, count, *info.shape[2:])).astype(info.dtype)
