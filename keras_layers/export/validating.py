"""Stage 5, validate: run the ONNX file and the Keras model on the same inputs.

The grid crosses batch sizes with sequence lengths (ids drawn over the whole
vocabulary, fixed seed) and adds a right-padded batch of different true lengths
when the model takes or derives a padding mask. For every output and shape it
records the largest absolute and relative difference and, for logits, how often
the top-1 prediction agrees.

Each output is compared at its own scale (`compare`), with atol 1e-4 times its
spread (standard deviation) and rtol 1e-5: a margin of tens over the
differences a correct export shows
(a different summation order in MatMul and LayerNorm), while real errors (a
wrong op, a lost mask, a missing scale) move outputs far more. The measurements
behind them are in docs/export.md ("Tolerances").
"""

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from keras_layers.export import audio, detections, images, prompts
from keras_layers.export.errors import UsageError, argument, fix, one_line
from keras_layers.export.lean_reference import intermediates_freed
from keras_layers.export.loading import LoadedModel, flatten

# An int8 model is judged by its predictions, not by tolerances: the share of
# real tokens whose top-1 class agrees with Keras', pooled over the whole grid
# (at least `INT8_MIN_TOKENS` of them, so that a few near-ties that
# quantization flips cannot decide), must reach `INT8_MIN_TOP1` (the
# `int8_min_top1` option). The grid's random ids lie outside any training
# distribution, with many near-ties, so this gate only guards against a broken
# int8 model; a task-level check (the demo's `evaluate`) holds the real bar.
# Outputs without a top-1 (pooled vectors) must stay within a 5% relative L2
# error, pooled the same way.
INT8_MIN_TOP1 = 0.90
INT8_MIN_TOKENS = 1000
INT8_MAX_RELATIVE_ERROR = 0.05
DEFAULT_ATOL = 1e-4
# 1e-5: the relative term is for outputs far above their RMS (outlier logits);
# at 1e-3 it let through mutants 100-2,000 times the rounding of a correct
# file (benchmarks/mutation.py; docs/export.md, "Tolerances").
DEFAULT_RTOL = 1e-5
# The least tolerances of a file whose weights were rounded to float16
# (`--weights-dtype float16`): that rounding, not the file, sets its distance
# from Keras (measured: docs/export.md, "Weights in half precision").
HALF_WEIGHTS_ATOL = 1e-2
HALF_WEIGHTS_RTOL = 1e-3
# Probabilities below this are compared as this: they are no prediction, and
# below float32's normal range their relative precision is lost.
PROBABILITY_FLOOR = 1e-30
# From this many bytes of weights the checks run lean
# (`memory.validates_lean`) and Keras runs as one graph (`_run_keras`).
LEAN_VALIDATION_BYTES = 256_000_000

DEFAULT_BATCHES = (1, 2, 8)
DEFAULT_LENGTHS = (1, 7, 64, 256)
# The largest image side searched for the smallest a model takes.
IMAGE_BOUND = 512
PADDED = "padded"
# The grid points named, not sized.
NAMED_POINTS = (PADDED, images.STRUCTURED, prompts.UNPROMPTED)
SEED = 1234


@dataclass
class Check:
    """One output compared at one input shape."""

    shape: str
    output: str
    max_abs_diff: float
    max_rel_diff: float
    passed: bool
    top1_agreement: float | None = None
    problem: str | None = None  # shape mismatch, missing output, non-finite
    # The share of Keras' own output that is NaN or infinite: a model that
    # computes NaN is broken whatever the ONNX file does, so it fails the check
    # unless the caller allows it.
    keras_nonfinite: float = 0.0
    # How many positions the top-1 agreement counts (the real tokens).
    top1_tokens: int = 0
    # The comparison (`comparison_space`): the space, the scale atol is
    # multiplied by, the largest difference there, and the tightest bound.
    scale: float | None = None
    space: str = "values"
    max_scaled_diff: float | None = None
    bound: float | None = None


@dataclass
class Validation:
    """The output of `validate`."""

    checks: list = field(default_factory=list)
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    seconds: float = 0.0
    # Set when ONNX Runtime could not load or run the file at all.
    error: str | None = None
    # An int8 file's pooled statistics (`Gate`); empty for a float file.
    gates: list = field(default_factory=list)
    # What the checks could not prove (`Reference.warning`).
    warnings: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return (
            self.error is None
            and bool(self.checks)
            and all(check.passed for check in self.checks)
            and all(gate.passed for gate in self.gates)
        )

    def worst(self) -> Check | None:
        failed = [check for check in self.checks if not check.passed]
        pool = failed or self.checks
        return max(pool, key=lambda c: (c.problem is not None, c.max_abs_diff), default=None)

    def failure(self) -> str:
        """Why the checks failed, in a phrase: ONNX Runtime's error, or the
        worst failed check (its output, shape and difference or problem) and
        every failed gate, each with its reasons."""
        if self.error is not None:
            return self.error
        reasons = [f"output {g.output!r}: {g.problem}" for g in self.gates if not g.passed]
        if reasons and all(check.passed for check in self.checks):
            return "; ".join(reasons)
        worst = self.worst()
        what = worst.problem or (
            f"max abs diff {worst.max_scaled_diff:.3g} in {worst.space} > atol {self.atol:g} x "
            f"scale {worst.scale:.3g} + rtol {self.rtol:g}"
            + (" x |keras|" if worst.space == "values" else "")
        )
        return "; ".join([f"output {worst.output!r} at shape {worst.shape}: {what}", *reasons])


# The largest grid point: batch x sequence tokens. Keras' logits for it are
# (tokens x vocabulary) floats, so far beyond this the check would run out of
# memory after conversion instead of failing at once.
MAX_GRID_TOKENS = 1 << 20


# The most pixels of one point of the int8 gate's images (`int8_rows`): 32
# images at 224 x 224. A ResNet-50 classifier's gate needs 1,000 images; in
# one point at 224 (3.2 GB in its first convolution's output alone, and
# Keras, ONNX Runtime and both files' sessions each held their peak) the
# export was killed at 24 GB. In 32 points of 32 its peaks are a point's.
MAX_GATE_PIXELS = 32 * 224 * 224


def check_shapes(shapes: list) -> list:
    """Check a validation grid: `(batch, sequence)` pairs of positive integers
    with at most `MAX_GRID_TOKENS` tokens, or `"padded"`."""
    if not isinstance(shapes, list | tuple) or not shapes:
        raise UsageError(
            f"{argument('shapes', shapes)}: give a non-empty list such as [(1, 1), (2, 7), "
            '"padded"]'
        )
    for shape in shapes:
        if shape in NAMED_POINTS:
            continue
        if not (
            isinstance(shape, list | tuple)
            and len(shape) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape)
        ):
            raise UsageError(
                f"{argument('shapes', shapes)}: {shape!r} is not a (batch, sequence) pair of "
                f"positive integers or one of {', '.join(map(repr, NAMED_POINTS))}"
            )
        if shape[0] * shape[1] > MAX_GRID_TOKENS:
            raise UsageError(
                f"{argument('shapes', shapes)}: {shape[0]}x{shape[1]} is "
                f"{shape[0] * shape[1]:,} tokens; at most {MAX_GRID_TOKENS:,} per grid point"
            )
    return list(shapes)


def default_shapes(loaded: LoadedModel, int8: bool = False) -> list:
    """Batch 1, 2, 8 x lengths 1, 7, 64, 256, within what the model allows (a
    fixed length, the shortest it accepts, the longest its position tables
    hold), plus `padded`; for an `int8` export, the rows its gate needs too
    (`int8_rows`).

    Args:
        loaded: the loaded model (its inputs' fixed lengths, `min_length`,
            `max_length`; its outputs' axes for `int8_rows`).
        int8: add the grid point the int8 gate needs.

    Returns:
        `(batch, length)` pairs, and `"padded"` where the model masks padding;
        for a model of images, `(batch, side)` pairs at the sides it accepts
        (`image_sides`) and `"structured"`.
    """
    if loaded.image_sides:  # images: the sides the model accepts, then structured ones
        shapes = [(batch, side) for batch in DEFAULT_BATCHES for side in loaded.image_sides]
        if int8:
            shapes += int8_rows(loaded, shapes, loaded.image_sides)
        # With text that masks its padding (PaliGemma, BLIP-2): a padded batch too.
        return [
            *shapes,
            images.STRUCTURED,
            *([PADDED] if takes_padding(loaded) else []),
            *([prompts.UNPROMPTED] if prompts.has_optional(loaded.inputs) else []),
        ]
    fixed = [
        info.shape[1]
        for info in loaded.inputs
        if len(info.shape) > 1 and not images.is_image(info) and not prompts.is_prompt(info)
    ]
    fixed = [size for size in fixed if size is not None]
    # A prompt's count is free beside fixed inputs (SAM's decoder beside its
    # image embeddings): the grid's lengths are the counts.
    if fixed and not any(prompts.is_prompt(info) for info in loaded.inputs):
        lengths = (fixed[0],)
    else:
        lengths = tuple(n for n in _default_lengths(loaded) if n not in loaded.refused_lengths)
    shapes = [(batch, length) for batch in DEFAULT_BATCHES for length in lengths]
    if int8:
        shapes += int8_rows(loaded, shapes, lengths)
    if takes_padding(loaded):
        shapes.append(PADDED)
    if prompts.has_optional(loaded.inputs):
        shapes.append(prompts.UNPROMPTED)
    return shapes


def _default_lengths(loaded: LoadedModel) -> tuple:
    """`DEFAULT_LENGTHS` within the model's bound, from its shortest."""
    bound = loaded.max_length or max(DEFAULT_LENGTHS)
    shortest = min(loaded.min_length, bound)
    return tuple(sorted({max(min(length, bound), shortest) for length in DEFAULT_LENGTHS}))


def _text_axes(loaded: LoadedModel) -> set:
    """The sequence axes of the inputs that are neither images, audio,
    prompts nor positions (an audio mask's `samples` axis left out)."""
    return {
        info.sequence
        for info in loaded.inputs
        if info.role != "positions"
        and not images.is_image(info)
        and not audio.is_audio(info)
        and not prompts.is_prompt(info)
    } - {audio.AXIS}


def refused_lengths(loaded: LoadedModel) -> tuple:
    """The default grid's lengths, past the shortest, that Keras itself
    fails on: keras-hub's SigLIP text encoder adds its whole position table,
    so it runs at its table's length (and at 1, by broadcasting) only.

    Args:
        loaded: the loaded model, `min_length` set.

    Returns:
        The lengths to leave out of the default grid (each said in the
        report's warnings by `refused_note`).
    """
    fixed = [i.shape[1] for i in loaded.inputs if len(i.shape) > 1 and not images.is_image(i)]
    if loaded.image_sides or any(size is not None for size in fixed):
        return ()
    axes = _text_axes(loaded)
    waves = {audio.AXIS: samples_at(loaded, 64)} if loaded.min_samples else {}
    return tuple(
        length
        for length in _default_lengths(loaded)[1:]
        if _output_shapes(loaded, {**dict.fromkeys(axes, length), **waves}) is None
    )


def refused_note(loaded: LoadedModel) -> str | None:
    """The report's warning for `refused_lengths`, or `None`."""
    if not loaded.refused_lengths:
        return None
    left = ", ".join(map(str, loaded.refused_lengths))
    kept = [n for n in _default_lengths(loaded) if n not in loaded.refused_lengths]
    return (
        f"the default grid leaves out length {left}: Keras itself fails there (the model "
        f"takes {', '.join(map(str, kept))} of the default lengths); give --shapes to check "
        "others"
    )


def int8_rows(loaded: LoadedModel, shapes: list, lengths: tuple) -> list:
    """The grid point that gives the int8 gate its `INT8_MIN_TOKENS`, when
    `shapes` give an output fewer: rows of the grid's second length (a few
    tokens; its only one if fixed), as many as that output needs, within
    `MAX_GRID_TOKENS`; for images, that many rows in points of at most
    `MAX_GATE_PIXELS` each.

    The gate counts an output's top-1 decisions (`_Measures.top1`): one per
    token of each axis that follows a sequence (a language model's logits:
    the default grid holds 3,608), else one per row: a classifier's default
    grid holds 44, and the point adds 1,000 rows.

    Args:
        loaded: the loaded model, its output axes named (`name_output_axes`).
        shapes: the grid so far.
        lengths: its sequence lengths, shortest first.

    Returns:
        `[(batch, length)]` (for images, `[(rows, side)] * points`), or `[]`
        when every output has enough.
    """
    sequences = {info.sequence for info in loaded.inputs}

    def decisions(info, batch: int, length: int) -> int:
        for name in info.axis_names()[1:-1]:
            batch *= length if name in sequences else name if isinstance(name, int) else 1
        return batch

    length = lengths[min(1, len(lengths) - 1)]
    batch = 0
    for info in loaded.outputs:
        if len(info.shape) < 2 or info.shape[-1] == 1:
            continue  # no top-1: the relative L2 gate, which counts no tokens
        if sum(decisions(info, *shape) for shape in shapes) < INT8_MIN_TOKENS:
            batch = max(batch, -(-INT8_MIN_TOKENS // decisions(info, 1, length)))
    batch = min(batch, MAX_GRID_TOKENS // length)
    if not batch:
        return []
    if not loaded.image_sides:
        return [(batch, length)]
    # Images: as many points as keep each within `MAX_GATE_PIXELS`.
    rows = max(1, min(batch, MAX_GATE_PIXELS // (length * length)))
    return [(rows, length)] * (-(-batch // rows))


def check_shapes_fit(loaded: LoadedModel, shapes: list) -> None:
    """Refuse grid points longer than the model's position tables allow.

    Args:
        loaded: the loaded model (`max_length`, read from its position tables).
        shapes: the grid, already checked by `check_shapes`.

    Raises:
        UsageError: a grid point is longer than `loaded.max_length`, or
            shorter than `loaded.min_length`.
    """
    if loaded.image_sides:
        _check_image_sides(loaded, shapes)
        return
    for shape in shapes:
        if shape not in NAMED_POINTS and shape[1] < loaded.min_length:
            raise UsageError(
                f"{argument('shapes', shapes)}: {shape_label(shape)} is shorter than the "
                f"{loaded.min_length} tokens the model accepts at least (Keras fails on "
                f"{loaded.min_length - 1}); ask for at least {loaded.min_length}"
            )
    if loaded.max_length is None:
        return
    for shape in shapes:
        if shape not in NAMED_POINTS and shape[1] > loaded.max_length:
            raise UsageError(
                f"{argument('shapes', shapes)}: {shape_label(shape)} is longer than the "
                f"{loaded.max_length} positions the model holds (layer "
                f"{loaded.max_length_source!r}); ask for at most {loaded.max_length}"
            )


def _check_image_sides(loaded: LoadedModel, shapes: list) -> None:
    """Refuse image sides the model does not take (`accepts_side`)."""
    for shape in shapes:
        if shape in NAMED_POINTS:
            continue
        side = shape[1]
        if accepts_side(loaded, side):
            continue
        near = images.accepted_near(lambda s: accepts_side(loaded, s), side, loaded.min_length)
        raise UsageError(
            f"{argument('shapes', shapes)}: the model does not take images of side {side} "
            f"({point_label(loaded, shape)}: Keras fails there, or gives an empty or "
            f"non-finite output); it takes {loaded.min_length} pixels a side at least"
            + (f", and {near} is the next side it takes" if near else "")
            + f"; ask for sides it takes, e.g. --shapes {shape[0]}x{near or loaded.min_length}"
        )


def takes_padding(loaded: LoadedModel) -> bool:
    return any(info.masks_zero or info.is_padding_mask for info in loaded.inputs)


def _fixed_length(loaded: LoadedModel, sequence: str) -> int | None:
    for info in loaded.inputs:
        if images.is_image(info):  # its sides: `image_sides`
            continue
        if info.sequence == sequence and info.role != "positions" and len(info.shape) > 1:
            if info.shape[1] is not None:
                return info.shape[1]
    return None


def _sequence_lengths(loaded: LoadedModel, length: int) -> dict:
    """Each sequence axis's length at a grid point of `length`: the first gets
    it, each other one less (so that an encoder and a decoder are never fed
    equal lengths by accident), within the model's fixed lengths and bound."""
    lengths, sides = {}, {}
    for info in loaded.inputs:
        if images.is_image(info):  # its free sides are the grid's size
            sides.update({axis: length for axis in images.free_axes(info)})
            continue
        if audio.is_audio(info):  # multiples of the fewest samples it takes
            sides[audio.AXIS] = samples_at(loaded, length)
            continue
        if info.sequence in lengths or info.role == "positions":
            continue
        own = length if not lengths else max(1, length - len(lengths) * max(1, length // 3))
        fixed = _fixed_length(loaded, info.sequence)
        lengths[info.sequence] = fixed or min(own, loaded.max_length or own)
    return {**lengths, **sides}


def make_inputs(loaded: LoadedModel, shape, rng, lengths: dict | None = None) -> dict:
    """Inputs for one grid point, keyed by input name.

    `padded` is a batch of 5 rows of true lengths (all, all - 3, 1, half, 0)
    of 64 tokens (or the model's bound), right-padded: the last row is padding
    only, so that every query in it sees no key. Positions are drawn among each
    row's real tokens (0 in the empty row).

    `structured` is three images (a gradient, edges, a constant one) at the
    grid's second side (`images.draw`); `unprompted` one row at the grid's
    first length (or side) with no optional prompt (`prompts.count`).

    Args:
        loaded: the loaded model; each input's role says what to generate.
        shape: a `(batch, sequence)` pair (a side, for images), `"padded"`,
            `"structured"` or `"unprompted"`.
        rng: a `numpy.random.Generator`.
        lengths: each sequence axis's length, instead of those the grid point
            gives them (`_sequence_lengths`).

    Returns:
        One array per input, of the input's dtype.
    """
    if shape == PADDED:
        batch, length = 5, max(min(64, loaded.max_length or 64), loaded.min_length)
    elif shape == images.STRUCTURED:
        batch, length = 3, _structured_side(loaded)
    elif shape == prompts.UNPROMPTED:
        batch, length = 1, (loaded.image_sides or _default_lengths(loaded))[0]
    else:
        batch, length = shape
    unprompted = shape == prompts.UNPROMPTED
    if lengths is None and shape == PADDED and loaded.image_sides:
        # The text at its padded length, the images at a side the model takes.
        side = _structured_side(loaded)
        lengths = {
            sequence: full if sequence not in ("height", "width") else side
            for sequence, full in _sequence_lengths(loaded, length).items()
        }
    lengths = lengths or _sequence_lengths(loaded, length)
    valid = {}
    for sequence, full in lengths.items():
        true = (
            np.array([full, max(full - 3, 1), 1, max(full // 2, 1), 0])
            if shape == PADDED
            else np.full(batch, full)
        )
        valid[sequence] = np.arange(full)[None, :] < true[:, None]
    feeds = {}
    for info in loaded.inputs:
        if images.is_image(info):
            size = (lengths.get("height", length), lengths.get("width", length))
            feeds[info.name] = images.draw(info, batch, size, rng, shape == images.STRUCTURED)
            continue
        if audio.is_audio(info):
            feeds[info.name] = audio.draw(info, batch, lengths[audio.AXIS], rng)
            continue
        if prompts.is_prompt(info):
            given = prompts.count(info, lengths.get(info.sequence, length), unprompted)
            feeds[info.name] = prompts.draw(info, batch, given, rng)
            continue
        mask = valid.get(info.sequence, next(iter(valid.values()), np.ones((batch, 1), bool)))
        feeds[info.name] = _draw_along(info, mask, rng)
    return feeds


def _draw_along(info, mask: np.ndarray, rng) -> np.ndarray:
    """One input of a text-like role along its sequence, whose valid
    positions are `mask` `(batch, length)`."""
    batch = mask.shape[0]
    fixed = info.shape[1] if len(info.shape) > 1 else None
    if info.role == "features" and fixed not in (None, mask.shape[1]):
        # Axis 1 of features fixed at another size than the sequence's (a
        # pooled embedding's width beside a sequence of them): no sequence.
        mask = np.ones((batch, fixed), bool)
    full = mask.shape[1]
    if info.role == "positions":
        count = info.shape[1] if len(info.shape) > 1 and info.shape[1] else max(1, full // 4)
        true = mask.sum(axis=1, keepdims=True)
        return (rng.random((batch, count)) * true).astype("int64").astype(info.dtype)
    trailing = info.widths or [d or 1 for d in info.shape[2:]]
    dims = [batch, full, *trailing][: len(info.shape)]
    if info.is_padding_mask:
        value = mask
    elif info.role == "token_positions":
        value = np.broadcast_to(np.arange(full), (batch, full))
    elif info.role == "ids" or _is_integer(info.dtype):
        vocabulary = info.vocabulary or 2
        low = 1 if info.masks_zero else 0
        value = rng.integers(low, max(vocabulary, low + 1), size=dims)
        if info.masks_zero:
            value = np.where(mask.reshape(mask.shape + (1,) * (len(dims) - 2)), value, 0)
    elif info.dtype == "bool":
        value = rng.random(dims) < 0.5
    else:
        value = rng.standard_normal(dims)
        if info.masks_zero:  # padding frames are all zeros
            value = np.where(mask.reshape(mask.shape + (1,) * (len(dims) - 2)), value, 0)
    return np.asarray(value).astype(info.dtype)


def samples_at(loaded: LoadedModel, length: int) -> int:
    """A waveform's samples at a grid point of `length`: the fewest the model
    takes, times 1 up to length 15, 8 at 64, 32 at 256 (`audio.MULTIPLES`).

    Args:
        loaded: the loaded model (`min_samples`).
        length: the grid point's length.

    Returns:
        The samples.
    """
    return max(loaded.min_samples, 1) * max(1, length // 8)


def _structured_side(loaded: LoadedModel) -> int:
    sides = loaded.image_sides or (loaded.min_length,)
    return sides[min(1, len(sides) - 1)]


def _is_integer(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def _output_shapes(loaded: LoadedModel, lengths: dict) -> list | None:
    """The shapes of Keras' outputs at batch 2 and these lengths, or `None`
    when Keras cannot run them."""
    feeds = make_inputs(loaded, (2, 1), np.random.default_rng(SEED), lengths)
    try:
        outputs = keras_outputs(loaded, feeds, "probe")
    except UsageError:
        return None
    return [outputs[info.name].shape for info in loaded.outputs]


def _keras_at(loaded: LoadedModel, lengths: dict) -> dict | None:
    """Keras' outputs at batch 2 and these lengths (sides), or `None` when
    Keras cannot run them."""
    feeds = make_inputs(loaded, (2, 1), np.random.default_rng(SEED), lengths)
    try:
        return keras_outputs(loaded, feeds, "probe")
    except UsageError:
        return None


def accepts_side(loaded: LoadedModel, side: int) -> bool:
    """Whether the model takes square images of a side.

    Args:
        loaded: the loaded model, its image inputs' roles read.
        side: the side.

    Returns:
        Keras runs the model on them, and every output is non-empty and
        finite (a DenseNet pools a 1x1 image's empty map into NaN); a
        detector's own decoding runs on them too (RetinaNet's anchors for a
        1x1 image are fewer than its outputs' rows).
    """
    axes = {axis for info in loaded.inputs if images.is_image(info) for axis in info.axes}
    lengths = dict.fromkeys(axes & {"height", "width"}, side)
    outputs = _keras_at(loaded, lengths)
    if outputs is None:
        return False
    if not all(value.size and np.isfinite(value).all() for value in outputs.values()):
        return False
    decode = detections.decoder(loaded.model) if loaded.model is not None else None
    if decode is None:
        return True
    feeds = make_inputs(loaded, (2, 1), np.random.default_rng(SEED), lengths)
    picture = next(info.name for info in loaded.inputs if images.is_image(info))
    try:
        decode(outputs, feeds[picture])
    except Exception:  # noqa: BLE001 - the model's own decoding refuses the size
        return False
    return True


def image_sides(loaded: LoadedModel) -> tuple:
    """The sides of the default grid's images: the smallest the model takes,
    and those it takes near `images.DEFAULT_SIDES`; its own sizes when it
    fixes them; `()` for a model without images.

    Args:
        loaded: the loaded model, its inputs' roles read.

    Returns:
        The sides, smallest first.

    Raises:
        UsageError: the model takes no square image up to 512 pixels a side.
    """
    pictures = [info for info in loaded.inputs if images.is_image(info)]
    if not pictures:
        return ()
    free = {axis for info in pictures for axis in images.free_axes(info)}
    if not free:
        fixed = images.spatial_size(pictures[0], 1)
        return (fixed[0],)

    def accepts(side: int) -> bool:
        return accepts_side(loaded, side)

    smallest = smallest_accepted(accepts, IMAGE_BOUND)
    if smallest is None:
        raise UsageError(
            f"the model takes no square image of {pictures[0].name!r} from 1 to {IMAGE_BOUND} "
            "pixels a side (Keras fails, or gives an empty or non-finite output, at every "
            "one); check that it runs in Keras on images"
        )
    sides = {smallest}
    for side in images.DEFAULT_SIDES:
        near = images.accepted_near(accepts, side, smallest)
        sides |= {near} if near else set()
    return tuple(sorted(sides))


def fewest_samples(loaded: LoadedModel) -> int:
    """The fewest samples the model's waveform input takes: Keras runs it
    (every other sequence at its shortest) and every output is non-empty and
    finite; 0 for a model without audio.

    Args:
        loaded: the loaded model, its inputs' roles read.

    Returns:
        The samples.

    Raises:
        UsageError: the model takes no waveform up to `audio.BOUND` samples.
    """
    waves = [info for info in loaded.inputs if audio.is_audio(info)]
    if not waves:
        return 0
    others = _sequence_lengths(replace(loaded, min_samples=1), loaded.min_length)

    def accepts(samples: int) -> bool:
        outputs = _keras_at(loaded, {**others, audio.AXIS: samples})
        return outputs is not None and all(
            value.size and np.isfinite(value).all() for value in outputs.values()
        )

    fewest = smallest_accepted(accepts, audio.BOUND)
    if fewest is None:
        raise UsageError(
            f"the model takes no waveform {waves[0].name!r} of 1 to {audio.BOUND} samples "
            "(Keras fails, or gives an empty or non-finite output, at every length); check "
            "that it runs in Keras on audio"
        )
    return fewest


def shortest_length(loaded: LoadedModel) -> int:
    """The shortest sequence Keras runs the model on, searched before any
    conversion (lengths 1, 2, 4, ..., then halving the last gap), so that a
    grid the model cannot take fails at once and the default grid starts
    there. A model with a fixed length, or that fails at every length, is 1:
    the grid's own checks then say why.

    Args:
        loaded: the loaded model.

    Returns:
        The length.
    """
    if loaded.image_sides:
        return loaded.image_sides[0]
    axes = _text_axes(loaded)
    if not axes or any(_fixed_length(loaded, axis) is not None for axis in axes):
        return 1
    bound = loaded.max_length or max(DEFAULT_LENGTHS)

    waves = {audio.AXIS: 1 << 14} if any(audio.is_audio(i) for i in loaded.inputs) else {}

    def runs(length: int) -> bool:
        return _output_shapes(loaded, {**dict.fromkeys(axes, length), **waves}) is not None

    return smallest_accepted(runs, bound) or 1


def text_bound(loaded: LoadedModel) -> tuple | None:
    """The longest text Keras runs a model of images and text on, by Keras
    itself: a position table found in the model may be the images' (PaliGemma's
    vision encoder holds one of its 16 patches, and its text takes any
    length), and a text table may go unfound (keras-hub's PARSeq reads one of
    `max_label_length + 1` positions inside its decoder). Searched by
    halving, each image at its smallest side.

    Args:
        loaded: the loaded model, `image_sides` set.

    Returns:
        `(max_length, its source, the report's note)` where Keras says
        otherwise than the table found (`max_length` None: no bound up to
        the default grid's longest); `None` where the model has no images,
        a text axis is fixed, or the table found is the text's bound.
    """
    if not loaded.image_sides:
        return None
    axes = _text_axes(loaded)
    if not axes or any(_fixed_length(loaded, axis) is not None for axis in axes):
        return None
    sides = {
        axis: loaded.image_sides[0]
        for info in loaded.inputs
        if images.is_image(info)
        for axis in images.free_axes(info)
    }

    def runs(length: int) -> bool:
        trial = replace(loaded, max_length=None)
        return _output_shapes(trial, {**dict.fromkeys(axes, length), **sides}) is not None

    known, source = loaded.max_length, loaded.max_length_source
    if known is not None and (known >= max(DEFAULT_LENGTHS) or runs(known) and not runs(known + 1)):
        return None  # the table found is the text's bound
    not_text = f" (the {known} positions of layer {source!r} are not the text's)" if known else ""
    accepted, refused = 1, max(DEFAULT_LENGTHS)
    if not runs(accepted):
        return None  # none at all, which the grid's own checks say
    if runs(refused):
        return (
            (None, None, "the text takes any length the grid tries" + not_text) if known else None
        )
    while refused - accepted > 1:
        middle = (accepted + refused) // 2
        accepted, refused = (middle, refused) if runs(middle) else (accepted, middle)
    note = f"the text takes at most {accepted} tokens: Keras itself fails on {refused}"
    return accepted, f"Keras fails on {refused} tokens", note + not_text


def smallest_accepted(accepts, bound: int) -> int | None:
    """The smallest size the model accepts: 1, 2, 4, ... then halving the
    last gap.

    Args:
        accepts: `size -> bool`.
        bound: the largest size tried.

    Returns:
        The size, or `None` when none up to `bound` is accepted.
    """
    if accepts(1):
        return 1
    good = 2
    while good <= bound and not accepts(good):
        good *= 2
    if good > bound:
        return None
    bad = good // 2
    while good - bad > 1:
        middle = (good + bad) // 2
        bad, good = (bad, middle) if accepts(middle) else (middle, good)
    return good


def split_sequence_axes(loaded: LoadedModel) -> list:
    """Give inputs that share a sequence axis by name alone their own axis
    when Keras runs them at different lengths, so that the grid never feeds
    an encoder and a decoder equal lengths by accident: token ids (the TF
    tutorial's `(context, x)`) and float sequences alike (keras.io's
    character-level seq2seq takes two one-hot inputs). Inputs that must be
    as long as each other (token and segment ids added together) fail that
    run and stay together; padding masks and positions follow their axis.

    Args:
        loaded: the loaded model.

    Returns:
        `loaded.inputs`, with the independent sequences' axes renamed
        `NAME_sequence`.
    """
    inputs = list(loaded.inputs)
    for axis in dict.fromkeys(info.sequence for info in loaded.inputs):
        members = [i for i in inputs if i.sequence == axis and _is_sequence(i)]
        if len(members) < 2 or _fixed_length(loaded, axis) is not None:
            continue
        for other in members[1:]:
            own = replace(other, sequence=f"{other.name}_sequence")
            trial = [own if info is other else info for info in inputs]
            bound, shortest = loaded.max_length or 64, loaded.min_length
            lengths = {axis: min(max(5, shortest), bound), own.sequence: min(shortest + 3, bound)}
            if _output_shapes(replace(loaded, inputs=trial), lengths) is not None:
                inputs = trial
    return inputs


def _is_sequence(info) -> bool:
    """Token ids, or float values with a free axis 1 (a sequence of frames)."""
    if info.role == "ids":
        return True
    return info.role == "features" and len(info.shape) > 1 and info.shape[1] is None


def shared_axes(inputs: list) -> dict:
    """The sequence axes that several inputs share, for the report: Keras
    refused them unequal lengths (`split_sequence_axes`), so the grid feeds
    them equal ones.

    Args:
        inputs: the described inputs (`loading.TensorInfo`).

    Returns:
        Axis name -> the names of the token-id or float inputs on it.
    """
    found: dict = {}
    for info in inputs:
        if _is_sequence(info):
            found.setdefault(info.sequence, []).append(info.name)
    return {axis: names for axis, names in found.items() if len(names) > 1}


def name_output_axes(loaded: LoadedModel) -> list:
    """Name each dynamic output axis after the input axis it follows, read
    from the data: Keras runs at one length per sequence axis, then with each
    axis longer in turn, and an output axis that grows with it takes its name
    (`decoder_sequence` on an encoder-decoder's logits), never a guess by
    position. Axes that follow no input keep their own names.

    Args:
        loaded: the loaded model.

    Returns:
        `loaded.outputs`, each with `axes` set where the data named an axis.
    """
    axes = [
        name
        for name in dict.fromkeys(
            i.sequence for i in loaded.inputs if i.role != "positions" and not images.is_image(i)
        )
    ]
    axes = [axis for axis in axes if _fixed_length(loaded, axis) is None]
    bound = loaded.max_length or 64
    shortest = loaded.min_length
    base = {axis: min(shortest + 4 + 2 * index, bound) for index, axis in enumerate(axes)}
    longer = {axis: min(base[axis] + 3, bound) for axis in axes}
    if audio.AXIS in base:  # multiples of the fewest samples, as the grid feeds them
        base[audio.AXIS], longer[audio.AXIS] = samples_at(loaded, 64), samples_at(loaded, 72)
    sides = loaded.image_sides
    spatial = [a for i in loaded.inputs if images.is_image(i) for a in images.free_axes(i)]
    for axis in dict.fromkeys(spatial):
        if len(sides) > 1:  # two sides the model takes: the first, then the next
            axes.append(axis)
            base[axis], longer[axis] = sides[0], sides[1]
    before = _output_shapes(loaded, base) if axes else None
    if before is None:
        return loaded.outputs
    follows: dict = {}
    for axis in axes:
        grown = _output_shapes(loaded, {**base, axis: longer[axis]})
        if grown is None or longer[axis] == base[axis]:
            continue
        step = longer[axis] - base[axis]
        for index, (old, new) in enumerate(zip(before, grown, strict=True)):
            for dim, (a, b) in enumerate(zip(old, new, strict=False)):
                # The same axis only when it grows as the input's does; an
                # axis strided or pooled from it is an axis of its own.
                if a != b and (index, dim) not in follows:
                    follows[(index, dim)] = axis if b - a == step else None
    outputs = []
    for index, info in enumerate(loaded.outputs):
        names = info.axis_names()
        for dim in range(1, len(names)):
            if info.shape[dim] is None:
                names[dim] = follows.get((index, dim)) or f"{info.name}_dim_{dim}"
        outputs.append(replace(info, axes=tuple(names)))
    return outputs


def shape_label(shape) -> str:
    return shape if isinstance(shape, str) else f"{shape[0]}x{shape[1]}"


def point_label(loaded: LoadedModel, shape) -> str:
    """A grid point as the model's own shape where it takes one image
    (`2x224x224x3`, `structured 3x96x96x3`), with its samples where it takes
    a waveform (`2x64, 3072 samples`), else `shape_label`'s `BxS`.

    Args:
        loaded: the loaded model.
        shape: the grid point.

    Returns:
        The label.
    """
    pictures = [info for info in loaded.inputs if images.is_image(info)]
    if any(audio.is_audio(info) for info in loaded.inputs) and not isinstance(shape, str):
        return f"{shape_label(shape)}, {samples_at(loaded, shape[1])} samples"
    if len(pictures) != 1:
        return shape_label(shape)
    if shape == images.STRUCTURED:
        return f"{shape} {images.label(pictures[0], 3, _structured_side(loaded))}"
    if shape == prompts.UNPROMPTED:
        return f"{shape} {images.label(pictures[0], 1, loaded.image_sides[0])}"
    if isinstance(shape, str):
        return shape
    return images.label(pictures[0], shape[0], shape[1])


def _run_keras(loaded: LoadedModel, args):
    """The model's outputs for `args`: run eagerly, or as one TensorFlow
    graph traced once for any batch and length (`LoadedModel.graph_call`)
    for a model with a recurrent layer, or of at least
    `LEAN_VALIDATION_BYTES` with a tied output projection; eagerly where it
    does not trace, or where the graph fails on these inputs.

    Run eagerly, a recurrent layer's loop over the time steps runs op by op:
    keras.io's bidirectional LSTM took 6.1 s over its grid's 12 points, and
    0.4 s traced (0.2 s of it the trace), within 1.2e-7 of the eager outputs
    (the grid's tolerances are 1e-4 of each output's spread).

    Run eagerly, a tied projection (`ops.matmul(hidden, ops.transpose(table))`,
    as `TiedOutputDense` and keras-hub's `ReversibleEmbedding` write it) makes
    a transposed copy of the whole table on every call: 3.9 GB more for a
    480,000 x 2,048 table (benchmarks/big_model.py); in a graph TensorFlow
    folds the transpose into the MatMul. Other models stay eager: a graph
    computes what depends on the weights alone (each kernel's reshapes and
    transposes) ahead of the activations, all layers at once, and the 1.1B
    Llama's export peaked 4.3 GB higher so. The outputs are Keras' own
    either way: the same layers' code, traced.
    """
    if loaded.graph_call is None:
        traced = _has_recurrent_layer(loaded.model) or (
            loaded.param_bytes >= LEAN_VALIDATION_BYTES and _has_tied_projection(loaded.model)
        )
        loaded.graph_call = _traced_call(loaded.model, args) if traced else _EAGER
    if loaded.graph_call is not _EAGER:
        try:
            return loaded.graph_call(args)
        except Exception:  # noqa: BLE001 - the eager call decides, and says why it fails
            pass
    return _eager(loaded.model, args)


def _eager(model, args):
    """`model`'s eager outputs for `args`, each layer's output freed once the
    layers that read it have run (`lean_reference`): Keras itself keeps them
    all to the end of the call, 1.27 GB for a ResNet-50 on eight 224x224 images."""
    with intermediates_freed():
        return model(args, training=False)


def _has_tied_projection(model) -> bool:
    """Whether a layer of `model` projects onto the transpose of an embedding
    table: our `TiedOutputDense`, or keras-hub's `ReversibleEmbedding` with
    `tie_weights` (or a subclass of either), found by class name, so that
    this module, which `generate` imports, never imports Keras."""

    def named(layer, name: str) -> bool:
        return any(cls.__name__ == name for cls in type(layer).__mro__)

    return any(
        named(layer, "TiedOutputDense")
        or (named(layer, "ReversibleEmbedding") and getattr(layer, "tie_weights", False))
        for layer in model._flatten_layers(include_self=False)
    )


def _has_recurrent_layer(model) -> bool:
    """Whether a layer of `model` loops over time steps: a Keras `RNN` (LSTM,
    GRU, SimpleRNN, ConvLSTM and custom cells) or a `Bidirectional`, found
    by class name, as `_has_tied_projection` finds its layers."""
    return any(
        cls.__name__ in ("RNN", "Bidirectional")
        for layer in model._flatten_layers(include_self=False)
        for cls in type(layer).__mro__
    )


# `LoadedModel.graph_call` of a model that does not trace.
_EAGER = "eager"


def _traced_call(model, args):
    """`model`'s call as a `tf.function` traced once, every axis of every
    input dynamic, or `_EAGER` when it does not trace."""
    import tensorflow as tf

    signature = tf.nest.map_structure(
        lambda value: tf.TensorSpec([None] * np.ndim(value), np.asarray(value).dtype), args
    )
    function = tf.function(
        lambda inputs: model(inputs, training=False), input_signature=[signature]
    )
    try:
        function.get_concrete_function()
    except Exception:  # noqa: BLE001 - tracing is an optimisation; the eager call is the reference
        return _EAGER
    return function


def keras_outputs(loaded: LoadedModel, feeds: dict, label: str) -> dict:
    """Keras' outputs for one grid point, keyed by output name.

    Args:
        loaded: the loaded model.
        feeds: its inputs by name (`make_inputs`).
        label: the grid point, for the message (`shape_label`).

    Returns:
        One array per output.

    Raises:
        UsageError: Keras itself fails on the input (`label` names its shape):
            the model, not the export, cannot run it.
    """
    names = [info.name for info in loaded.inputs]
    if loaded.input_structure == "dict":
        args = feeds
    elif loaded.input_structure == "list":
        args = [feeds[name] for name in names]
    else:
        args = feeds[names[0]]
    output_names = [info.name for info in loaded.outputs]
    try:
        flat = flatten(_run_keras(loaded, args), [info.keras_name for info in loaded.outputs])
    except Exception as error:  # noqa: BLE001 - the model's own failure, reported as such
        detail = one_line(f"{type(error).__name__}: {error}", 300)
        raise UsageError(
            f"the model fails in Keras itself on the generated {label} input ({detail}); "
            f"check that it runs in Keras, or give a grid it accepts with {fix('shapes')}"
        ) from error
    return {name: np.asarray(value) for name, value in zip(output_names, flat, strict=True)}


def _same_nonfinite(got: np.ndarray, expected: np.ndarray) -> bool:
    """NaN at the same places, and the same infinities at the same places."""
    return (
        np.array_equal(np.isnan(got), np.isnan(expected))
        and np.array_equal(np.isinf(got), np.isinf(expected))
        and np.array_equal(got[np.isinf(got)], expected[np.isinf(expected)])
    )


def _nonfinite_only_in_empty_rows(expected: np.ndarray, valid) -> bool:
    """Whether every NaN or infinity of a (batch, ...) output is in a row that
    `valid` (batch, sequence) gives no real token."""
    if valid is None or expected.ndim < 1 or expected.shape[0] != valid.shape[0]:
        return False
    empty = ~valid.any(axis=1)
    return bool(empty.any()) and bool(np.isfinite(expected[~empty]).all())


# Values compared at a time (`_row_chunks`): a comparison's temporaries are a
# few chunks, however large the outputs. A 5 x 64 batch of logits over 480,000
# classes is 614 MB an array, and compared whole it had a dozen temporaries of
# that size (tests/test_validation_rules.py: 400 MB for two 64 MB outputs).
_CHUNK_VALUES = 1 << 20


def _row_chunks(*arrays: np.ndarray) -> Iterator[list]:
    """Same-shaped arrays as (rows, last axis) views, a few whole rows at a
    time (a row's sum and argmax are computed in one piece); nothing for
    empty arrays."""
    if not arrays[0].size:
        return
    rows = [a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1) for a in arrays]
    step = max(1, _CHUNK_VALUES // rows[0].shape[1])
    for start in range(0, rows[0].shape[0], step):
        yield [part[start : start + step] for part in rows]


def _rms(values: np.ndarray) -> float:
    """Root mean square: each chunk's sum of squares, added up in float64."""
    squares = sum(float(np.dot(part.ravel(), part.ravel())) for (part,) in _row_chunks(values))
    return float(np.sqrt(squares / values.size)) if values.size else 0.0


# A spread below this share of the RMS counts as this share: an output that is
# one constant still gets room for the rounding of the ops before it.
SPREAD_FLOOR = 1e-3


def _spread(values: np.ndarray) -> float:
    """The values' standard deviation about their mean (chunked, in float64),
    at least `SPREAD_FLOOR` times their RMS."""
    if not values.size:
        return 0.0
    total = sum(float(part.sum(dtype=np.float64)) for (part,) in _row_chunks(values))
    mean = total / values.size
    squares = sum(
        float(np.square(part - mean, dtype=np.float64).sum()) for (part,) in _row_chunks(values)
    )
    return max(float(np.sqrt(squares / values.size)), SPREAD_FLOOR * _rms(values))


def is_distribution(expected: np.ndarray) -> bool:
    """Whether an output is a probability distribution over its last axis (a
    softmax's): float, non-negative, summing to 1 within 1e-3 at every finite
    position, over more than one class."""
    if (
        expected.ndim < 1
        or expected.shape[-1] < 2
        or not np.issubdtype(expected.dtype, np.floating)
    ):
        return False
    any_finite = False
    for (rows,) in _row_chunks(expected):
        sums = rows.sum(axis=-1, dtype=np.float64)
        finite = np.isfinite(sums)
        if (rows < 0).any() or (finite.any() and np.abs(sums[finite] - 1.0).max() > 1e-3):
            return False
        any_finite = any_finite or bool(finite.any())
    return any_finite


def _log(probabilities: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(probabilities, PROBABILITY_FLOOR))


def comparison_space(got: np.ndarray, expected: np.ndarray) -> tuple[str, float]:
    """The space finite, same-shaped outputs are compared in, and its scale.

    Values are compared as they are, with atol scaled by their spread
    (`_spread`: their standard deviation, not their RMS, so that an output
    of 0.5 +- 0.001, a sigmoid of random weights, gets room in proportion to
    the 0.001 it varies by; rtol covers rounding in proportion to each
    value). A
    probability distribution is compared as log-probabilities (floored at
    `PROBABILITY_FLOOR`), where a difference is a relative one; its scale is
    the RMS of the log-probabilities around each row's mean (the spread of the
    logits), and rtol applies as an absolute term (|log p - log q| <= rtol is
    a relative difference of rtol).

    Args:
        got: ONNX Runtime's finite values.
        expected: Keras' finite values, of the same shape.

    Returns:
        `("values" or "log-probabilities", scale)`.
    """
    if not (got.ndim and is_distribution(expected)):
        return "values", _spread(expected)
    squares = 0.0
    for (rows,) in _row_chunks(expected):
        logs = _log(rows)
        centered = logs - logs.mean(axis=-1, keepdims=True)
        squares += float(np.square(centered, dtype=np.float64).sum())
    return "log-probabilities", float(np.sqrt(squares / expected.size))


@dataclass
class _Measures:
    """What `_measured` finds, accumulated over the outputs' row chunks: the
    differences in the comparison space against the bound, the raw and
    relative differences, and each row's top-1 (ONNX's pick, Keras' pick and
    Keras' values at both) for outputs over classes."""

    space: str
    scale: float
    atol: float
    rtol: float
    classes: bool  # whether top-1 applies: floats of (..., classes > 1)
    within: bool = True
    max_scaled: float = 0.0
    bound: float = float("inf")
    max_abs: float = 0.0
    max_rel: float = 0.0
    rows: list = field(default_factory=list)

    def add(self, got: np.ndarray, expected: np.ndarray) -> None:
        logs = self.space == "log-probabilities"
        scaled_got, scaled_expected = (_log(got), _log(expected)) if logs else (got, expected)
        diff = np.abs(scaled_got - scaled_expected)
        bound = self.atol * self.scale + (self.rtol if logs else self.rtol * np.abs(expected))
        self.within = self.within and bool(np.all(diff <= bound))
        self.max_scaled = max(self.max_scaled, float(diff.max()))
        self.bound = min(self.bound, float(np.min(bound)))
        raw, magnitude = np.abs(got - expected), np.abs(expected)
        self.max_abs = max(self.max_abs, float(raw.max()))
        # Relative difference where it means something: away from zero.
        meaningful = magnitude > self.atol * max(self.scale, 1e-30)
        if meaningful.any():
            relative = raw[meaningful] / magnitude[meaningful]
            self.max_rel = max(self.max_rel, float(relative.max()))
        if self.classes:
            picked, wanted = got.argmax(-1), expected.argmax(-1)
            at = np.arange(len(expected))
            self.rows.append((picked, wanted, expected[at, wanted], expected[at, picked]))

    def top1(self, shape, valid, tolerance) -> tuple[float | None, int, int]:
        """Top-1 agreement over the real tokens, and how many of the positions
        where ONNX picks another class Keras' top-1 led by more than twice the
        tolerance (a difference no rounding explains)."""
        if not self.classes:
            return None, 0, 0
        picked, wanted, top, other = (
            np.concatenate([row[i] for row in self.rows]).reshape(shape[:-1]) for i in range(4)
        )
        same = picked == wanted
        rows = valid if (valid is not None and same.shape == valid.shape and valid.any()) else None
        counted = same[rows] if rows is not None else same.ravel()
        where = ~same if rows is None else ~same & rows
        decided = 0
        if where.any():
            decided = int(np.count_nonzero(top[where] - other[where] > 2 * tolerance(top[where])))
        return float(np.mean(counted)), int(counted.size), decided


def near_tie(top, expected_rms: float, atol: float, rtol: float):
    """How close Keras' top-1 and another class may be for ONNX Runtime to
    pick either.

    Args:
        top: Keras' top-1 values.
        expected_rms: the RMS of Keras' output (it scales `atol`).
        atol: the check's absolute tolerance.
        rtol: the check's relative tolerance.

    Returns:
        The tolerance at `top`, never looser than the default one, so that a
        loosened `atol` or `rtol` does not also excuse a changed prediction.
    """
    atol, rtol = min(atol, DEFAULT_ATOL), min(rtol, DEFAULT_RTOL)
    return atol * expected_rms + rtol * np.abs(top)


def compare(
    label, name, got, expected, atol, rtol, valid=None, allow_nonfinite: bool = False
) -> Check:
    """Compare one ONNX output with the Keras one; never raises.

    Each output is compared at its own scale (`comparison_space`): passes
    when `|onnx - keras| <= atol * scale + rtol * |keras|` everywhere, and,
    for outputs over classes (last axis > 1), when ONNX picks Keras' top-1
    wherever Keras' lead over the class ONNX picked exceeds twice that
    tolerance at its default values (`near_tie`), however loose the given
    ones. `valid` (batch, sequence) marks the real tokens; top-1
    agreement counts only those. NaN or infinity in Keras' own output fails
    the check unless `allow_nonfinite`, or unless it is only in rows with no
    real token (a mean over no token is NaN in any correct model); either way
    the ONNX output must have the same ones.

    Args:
        label: the grid point (`shape_label`).
        name: the output's name.
        got: ONNX Runtime's output, or `None` when it is missing.
        expected: Keras' output.
        atol: absolute tolerance, times the output's scale.
        rtol: relative tolerance, times |Keras output|.
        valid: (batch, sequence) booleans marking the real tokens, or `None`.
        allow_nonfinite: accept NaN or infinity in Keras' own output.

    Returns:
        The check.
    """

    def failed(problem: str, nonfinite: float = 0.0) -> Check:
        return Check(label, name, float("inf"), float("inf"), False, None, problem, nonfinite)

    if got is None:
        return failed("missing output")
    if got.shape != expected.shape:
        return failed(f"shape {got.shape} != Keras {expected.shape}")
    if not expected.size:  # no values (a prompt left out): the shapes agree, and that is all
        return Check(label, name, 0.0, 0.0, True, max_scaled_diff=0.0, bound=0.0)
    # Compare in the outputs' own dtype (float64 copies of 8 x 256 x 30k logits
    # would cost a gigabyte); integers and booleans as float64.
    dtype = got.dtype if np.issubdtype(got.dtype, np.floating) else np.float64
    got_f, expected_f = got.astype(dtype, copy=False), expected.astype(dtype, copy=False)
    nonfinite = float(np.mean(~np.isfinite(expected_f))) if expected_f.size else 0.0
    empty_rows = _nonfinite_only_in_empty_rows(expected_f, valid)
    allow_nonfinite = allow_nonfinite or empty_rows
    problem = None
    if not (np.isfinite(got_f).all() and nonfinite == 0.0):
        if not _same_nonfinite(got_f, expected_f):
            return failed("NaN or infinity differs", nonfinite)
        if empty_rows:  # dropped whole: the other rows keep their shape, and a top-1
            real = valid.any(axis=1)
            got_f, expected_f, valid = got_f[real], expected_f[real], valid[real]
        else:
            finite = np.isfinite(got_f) & np.isfinite(expected_f)
            got_f, expected_f = got_f[finite], expected_f[finite]
        if not allow_nonfinite:
            problem = (
                f"Keras' own output is {nonfinite:.1%} NaN or infinity; fix the model, "
                f"or allow it with {fix('allow_nonfinite')}"
            )
    return _measured(label, name, got_f, expected_f, (atol, rtol), valid, problem, nonfinite)


def _measured(label, name, got, expected, tolerances, valid, problem, nonfinite) -> Check:
    """`compare`'s measures of finite outputs (flattened where a NaN was
    dropped), a chunk of rows at a time (`_row_chunks`): the differences in
    their comparison space, within the bound, and the top-1 decision."""
    atol, rtol = tolerances
    space, scale = comparison_space(got, expected)
    classes = got.ndim >= 2 and got.shape[-1] > 1 and np.issubdtype(got.dtype, np.floating)
    measures = _Measures(space, scale, atol, rtol, classes)
    for got_rows, expected_rows in _row_chunks(got, expected):
        measures.add(got_rows, expected_rows)
    passed = problem is None and measures.within
    expected_rms = _rms(expected)
    top1, tokens, decided = measures.top1(
        got.shape, valid, lambda top: near_tie(top, expected_rms, atol, rtol)
    )
    if decided and passed:
        passed = False
        problem = (
            f"top-1 differs at {decided} position(s) where Keras' top-1 leads by more than "
            "twice the tolerance"
        )
    return Check(
        label,
        name,
        measures.max_abs,
        measures.max_rel,
        passed,
        top1,
        problem,
        nonfinite,
        top1_tokens=tokens,
        scale=scale,
        space=space,
        max_scaled_diff=measures.max_scaled,
        bound=measures.bound if got.size else 0.0,
    )


def _real_tokens(info, feeds: dict):
    """Which of an input's tokens are real: its padding mask, or its nonzero
    ids where 0 is masked; `None` when the input says neither."""
    if info.is_padding_mask:
        return feeds[info.name].astype(bool)
    if info.masks_zero:
        real = feeds[info.name] != 0
        # Float frames are real where any feature is not zero (`Masking`).
        return real.any(axis=tuple(range(2, real.ndim))) if info.role == "features" else real
    return None


def _valid_positions(loaded: LoadedModel, feeds: dict):
    return next(
        (real for info in loaded.inputs if (real := _real_tokens(info, feeds)) is not None),
        None,
    )


@dataclass
class Gate:
    """One statistic of an int8 file, pooled over the whole grid."""

    output: str
    statistic: str  # "top-1 agreement" or "relative L2 error"
    value: float
    threshold: float
    tokens: int
    passed: bool
    problem: str | None = None


class _Pool:
    """What the int8 gates pool, per output, over the grid's points."""

    def __init__(self) -> None:
        self.agreeing: dict[str, float] = {}
        self.tokens: dict[str, int] = {}
        self.error: dict[str, float] = {}
        self.reference: dict[str, float] = {}

    def add(self, check: Check, got, expected) -> None:
        name = check.output
        if check.top1_agreement is not None:
            agreeing = check.top1_agreement * check.top1_tokens
            self.agreeing[name] = self.agreeing.get(name, 0.0) + agreeing
            self.tokens[name] = self.tokens.get(name, 0) + check.top1_tokens
        elif got is not None and got.shape == expected.shape:
            # `compare` failed the check unless both are NaN or infinite at
            # the same places (an empty row's mean): those hold no error.
            same = np.isfinite(got) & np.isfinite(expected)
            difference = np.asarray(got, np.float64)[same] - expected[same]
            self.error[name] = self.error.get(name, 0.0) + float(np.sum(difference**2))
            self.reference[name] = self.reference.get(name, 0.0) + float(
                np.sum(expected[same] ** 2.0)
            )

    def gates(self, min_top1: float, min_tokens: int) -> list[Gate]:
        """Each output's gate; a failed one says every reason it fails."""
        found = []
        for name, tokens in self.tokens.items():
            value = self.agreeing[name] / max(tokens, 1)
            reasons = []
            if value < min_top1:
                reasons.append(
                    f"top-1 agreement {value:.2%} over {tokens} tokens, at least "
                    f"{min_top1:.0%} needed"
                )
            if tokens < min_tokens:
                reasons.append(
                    f"only {tokens} tokens in the grid; the gate needs {min_tokens} to be "
                    f"stable: give a larger grid with {fix('shapes')}, or leave it out (the "
                    "default grid of an int8 export holds enough)"
                )
            problem = "; ".join(reasons) or None
            passed = not reasons
            found.append(Gate(name, "top-1 agreement", value, min_top1, tokens, passed, problem))
        for name, error in self.error.items():
            value = float(np.sqrt(error / max(self.reference[name], 1e-300)))
            passed = value <= INT8_MAX_RELATIVE_ERROR
            problem = (
                None
                if passed
                else f"relative L2 error {value:.2%}, at most {INT8_MAX_RELATIVE_ERROR:.0%} needed"
            )
            found.append(
                Gate(name, "relative L2 error", value, INT8_MAX_RELATIVE_ERROR, 0, passed, problem)
            )
        return found


@dataclass
class Reference:
    """Keras' outputs at one grid point, with the inputs that gave them."""

    shape: object
    feeds: dict
    outputs: dict
    # At the padded point: why it cannot catch a lost mask, when Keras' own
    # outputs at real tokens change with the padding (`padding_ignored`).
    warning: str | None = None


def _true_lengths(loaded: LoadedModel, feeds: dict) -> dict | None:
    """Each row's real tokens per sequence axis, read from the padding mask or
    the zeros a masking layer drops; `None` when an axis has neither, or the
    model takes picked positions (whose count does not shrink with a row)."""
    lengths = {}
    for info in loaded.inputs:
        if info.role == "positions":
            return None
        valid = _real_tokens(info, feeds)
        if valid is not None:
            lengths.setdefault(info.sequence, valid.reshape(valid.shape[0], -1).sum(axis=1))
    axes = {info.sequence for info in loaded.inputs}
    return lengths if axes <= set(lengths) else None


def padding_ignored(loaded: LoadedModel, feeds: dict, outputs: dict) -> str | None:
    """Whether the padded point proves anything: Keras runs each padded row
    alone, cut to its real tokens, and its outputs there must be the padded
    batch's (within the default tolerances). A model whose outputs change
    with the padding does not mask it, so no lost mask would show.

    Args:
        loaded: the loaded model (its outputs' axes named by
            `name_output_axes`).
        feeds: the padded batch (`make_inputs(..., "padded", ...)`).
        outputs: Keras' outputs for it.

    Returns:
        `None` when every row agrees (or the rows cannot be cut), else a
        warning naming the output and the difference.
    """
    lengths = _true_lengths(loaded, feeds)
    if lengths is None:
        return None
    for row in range(next(iter(lengths.values())).shape[0]):
        cut = {axis: int(true[row]) for axis, true in lengths.items()}
        if min(cut.values()) < 1:
            continue  # an empty row: defined by no real token
        alone = {
            info.name: feeds[info.name][row : row + 1, : cut[info.sequence]]
            for info in loaded.inputs
        }
        try:
            got = keras_outputs(loaded, alone, "padded row")
        except UsageError:  # a row too short for the model: no claim either way
            return None
        for info in loaded.outputs:
            names = info.axis_names()
            index = (row, *[slice(cut[n]) if n in cut else slice(None) for n in names[1:]])
            expected = outputs[info.name][index][None]
            check = compare(
                "padded", info.name, got[info.name], expected, DEFAULT_ATOL, DEFAULT_RTOL
            )
            if not check.passed:
                return (
                    f"the padded check proves little for output {info.name!r}: Keras' own "
                    f"outputs at real tokens change with the padding (row {row}: "
                    f"{check.problem or f'{check.max_scaled_diff:.3g} in {check.space}'}), so "
                    "the model does not mask its padding and a lost mask would not show"
                )
    return None


def keras_references(loaded: LoadedModel, shapes=None) -> Iterator[Reference]:
    """Keras' outputs over the grid, one point at a time; `list()` them to
    run Keras ahead of ONNX Runtime, so the model can be released first.

    Args:
        loaded: the loaded model.
        shapes: the grid (default `default_shapes(loaded)`).

    Returns:
        An iterator of `Reference`s, in grid order, from the same seed as
        `validate`'s.

    Raises:
        UsageError: Keras itself fails on a grid point (`keras_outputs`).
    """
    rng = np.random.default_rng(SEED)
    alone = None  # a point of one row that ran
    for shape in shapes or default_shapes(loaded):
        feeds = make_inputs(loaded, shape, rng)
        label = point_label(loaded, shape)
        try:
            outputs = keras_outputs(loaded, feeds, label)
        except UsageError as error:
            rows = len(next(iter(feeds.values()), ()))
            if alone is None or rows == 1:
                raise
            size = shape[1] if isinstance(shape, tuple | list) else loaded.min_length
            raise UsageError(
                f"{error}. It ran on one row ({alone}) and fails on {rows}: the model may "
                f"take one row at a time (keras-hub's SAM3 does); give a grid of batch 1, "
                f"e.g. {fix('shapes')} with (1, {size}) and your other points at batch 1"
            ) from error.__cause__
        if len(next(iter(feeds.values()), ())) == 1:
            alone = alone or label
        warning = padding_ignored(loaded, feeds, outputs) if shape == PADDED else None
        yield Reference(shape, feeds, outputs, warning)


def session_options(lean_memory: bool):
    """ONNX Runtime's session options for the checks: with `lean_memory`,
    without pre-packing the weights and without its memory arena (`validate`)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if lean_memory:
        options.add_session_config_entry("session.disable_prepacking", "1")
        options.enable_cpu_mem_arena = False
    return options


def _session(onnx_path, lean_memory: bool):
    """An ONNX Runtime session on the CPU, or why the file cannot load.

    With `lean_memory`, ONNX Runtime's constant folding is off too: it would
    hold a second copy of every weight a constant node reads (a tied output
    projection's `Transpose` of the table, a kept half-precision weight's
    `Cast`) for the session's life. Measured on a 0.98 GB tied table in a data
    file: session start 1.93 GB with folding, 0.01 GB without, the runs 0.99 GB
    (the projection becomes `FusedMatMul` with `transB`). The values computed
    are the same: folding only moves when they are computed."""
    import onnxruntime as ort

    try:
        options = session_options(lean_memory)
        source = onnx_path if isinstance(onnx_path, bytes) else str(onnx_path)
        unfolded = {"disabled_optimizers": ["ConstantFolding"]} if lean_memory else {}
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"], **unfolded)
    except Exception as error:  # noqa: BLE001 - the file's failure, reported as one
        return f"ONNX Runtime cannot load the file: {one_line(str(error), 300)}"


def _file_outputs(session, feeds: dict, names: dict) -> dict:
    """ONNX Runtime's outputs for Keras' inputs, keyed by the model's names:
    fed and read through `names` (model name -> the file's) where they differ."""
    model_name = {file: model for model, file in names.items()}
    outputs = [model_name.get(o.name, o.name) for o in session.get_outputs()]
    fed = {names.get(name, name): value for name, value in feeds.items()}
    return dict(zip(outputs, session.run(None, fed), strict=True))


def _point_checks(loaded, label: str, feeds: dict, expected: dict, got: dict, tolerances, pool):
    """One check per output at one grid point; an int8 file's outputs also
    go to its `pool`, whose gates judge them (a check then fails on a
    problem alone)."""
    atol, rtol, allow_nonfinite = tolerances
    valid, checks = _valid_positions(loaded, feeds), []
    for name, value in expected.items():
        check = compare(label, name, got.get(name), value, atol, rtol, valid, allow_nonfinite)
        if pool is not None:
            pool.add(check, got.get(name), value)
            check.passed = check.problem is None
        checks.append(check)
    return checks


def validate(
    loaded: LoadedModel,
    onnx_path,
    shapes=None,
    atol=DEFAULT_ATOL,
    rtol=DEFAULT_RTOL,
    on_step: Callable[[int, int], None] | None = None,
    quantized: bool = False,
    allow_nonfinite: bool = False,
    lean_memory: bool = False,
    references: list[Reference] | None = None,
    min_top1: float = INT8_MIN_TOP1,
    file_names: dict | None = None,
    decode: Callable | None = None,
) -> Validation:
    """Run ONNX Runtime and Keras on the same inputs over the grid.

    Args:
        loaded: the Keras model (`loading.load`).
        onnx_path: the ONNX file to check (or a serialized model, as bytes).
        shapes: the grid (`(batch, sequence)` pairs and `"padded"`); default
            `default_shapes(loaded)`.
        atol: absolute tolerance.
        rtol: relative tolerance, times |Keras output|.
        on_step: called as `on_step(done, total)` after each grid point.
        quantized: judge an int8 file by its pooled statistics (`Gate`)
            instead of tolerances.
        allow_nonfinite: accept NaN or infinity in Keras' own outputs.
        lean_memory: run ONNX Runtime without pre-packing the weights and
            without its memory arena, so that it holds about one copy of
            weights kept in a data file (`session_options`; the peaks are in
            benchmarks/results/big_model.json). The products are the same.
        references: Keras' outputs computed beforehand (`keras_references`
            over the same grid); the model is not run again.
        min_top1: the int8 gate's pooled top-1 agreement (`INT8_MIN_TOP1`).
        file_names: the file's own names where they differ (`_file_outputs`).
        decode: `decode(label, feeds, keras_outputs, file_outputs)`, the
            fields of one more `Check` per grid point on what both sides
            decode to (a detector's detections: `detections.checker`).

    Returns:
        One `Check` per output and grid point; `passed` when all pass.

    Raises:
        UsageError: Keras itself fails on a grid point (`keras_outputs`);
            ONNX Runtime's failures are reported in `error`, not raised.
    """

    start = time.perf_counter()
    result = Validation(atol=atol, rtol=rtol)
    session = _session(onnx_path, lean_memory)
    if isinstance(session, str):
        result.error = session
        return result
    grid = shapes or default_shapes(loaded)
    pool = _Pool() if quantized else None
    if references is None:
        references = keras_references(loaded, grid)  # one point held at a time
    for done, reference in enumerate(references, start=1):
        shape, feeds, expected = reference.shape, reference.feeds, reference.outputs
        if reference.warning:
            result.warnings.append(reference.warning)
        try:
            got = _file_outputs(session, feeds, dict(file_names or {}))
        except Exception as error:  # noqa: BLE001 - the file's failure, reported as one
            where = point_label(loaded, shape)
            result.error = f"ONNX Runtime fails on the {where} input: {one_line(str(error), 300)}"
            return result
        label = point_label(loaded, shape)
        tolerances = (atol, rtol, allow_nonfinite)
        result.checks += _point_checks(loaded, label, feeds, expected, got, tolerances, pool)
        if decode is not None:  # what a user of the detector gets, both sides decoded
            result.checks.append(Check(**decode(label, feeds, expected, got)))
        if on_step:
            on_step(done, len(grid))
    if pool is not None:
        result.gates = pool.gates(min_top1, INT8_MIN_TOKENS)
    result.seconds = time.perf_counter() - start
    return result
