"""Stage 5, validate: run the ONNX file and the Keras model on the same inputs.

The grid crosses batch sizes with sequence lengths (ids drawn over the whole
vocabulary, fixed seed) and adds a right-padded batch of different true lengths
when the model takes or derives a padding mask. For every output and shape it
records the largest absolute and relative difference and, for logits, how often
the top-1 prediction agrees.

Default tolerances: atol 1e-4, rtol 1e-3: a wide margin over the differences
a correct export shows (a different summation order in MatMul and LayerNorm),
while any real error (a wrong op, a lost mask, a missing scale) moves logits far
more. The measurements behind them are in docs/export.md ("Tolerances").
"""

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from keras_layers.export.errors import UsageError, argument, fix, one_line
from keras_layers.export.loading import LoadedModel, flatten

# An int8 model is judged by its predictions, not by tolerances. The grid's random
# ids lie outside any training distribution, with many near-ties that
# quantization flips, so the grid only guards against a broken int8 model (this
# top-1 agreement at every grid point, valid positions only) and a task-level
# check (the demo's `evaluate`) holds the real bar. Outputs without a top-1
# (pooled vectors) must stay within a 5% relative L2 error.
INT8_MIN_TOP1 = 0.90
INT8_MAX_RELATIVE_ERROR = 0.05
DEFAULT_ATOL = 1e-4
DEFAULT_RTOL = 1e-3
DEFAULT_BATCHES = (1, 2, 8)
DEFAULT_LENGTHS = (1, 7, 64, 256)
PADDED = "padded"
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


@dataclass
class Validation:
    """The output of `validate`."""

    checks: list = field(default_factory=list)
    atol: float = DEFAULT_ATOL
    rtol: float = DEFAULT_RTOL
    seconds: float = 0.0
    # Set when ONNX Runtime could not load or run the file at all.
    error: str | None = None

    @property
    def passed(self) -> bool:
        return (
            self.error is None and bool(self.checks) and all(check.passed for check in self.checks)
        )

    def worst(self) -> Check | None:
        failed = [check for check in self.checks if not check.passed]
        pool = failed or self.checks
        return max(pool, key=lambda c: (c.problem is not None, c.max_abs_diff), default=None)

    def failure(self) -> str:
        """Why the checks failed, in a phrase: ONNX Runtime's error, or the
        worst check (its output, shape and difference or problem)."""
        if self.error is not None:
            return self.error
        worst = self.worst()
        what = worst.problem or (
            f"max abs diff {worst.max_abs_diff:.3g} > atol {self.atol:g} + rtol {self.rtol:g} "
            "x |keras|"
        )
        return f"output {worst.output!r} at shape {worst.shape}: {what}"


# The largest grid point: batch x sequence tokens. Keras' logits for it are
# (tokens x vocabulary) floats, so far beyond this the check would run out of
# memory after conversion instead of failing at once.
MAX_GRID_TOKENS = 1 << 20


def check_shapes(shapes: list) -> list:
    """Check a validation grid: `(batch, sequence)` pairs of positive integers
    with at most `MAX_GRID_TOKENS` tokens, or `"padded"`."""
    if not isinstance(shapes, list | tuple) or not shapes:
        raise UsageError(
            f"{argument('shapes', shapes)}: give a non-empty list such as [(1, 1), (2, 7), "
            '"padded"]'
        )
    for shape in shapes:
        if shape == PADDED:
            continue
        if not (
            isinstance(shape, list | tuple)
            and len(shape) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape)
        ):
            raise UsageError(
                f"{argument('shapes', shapes)}: {shape!r} is not a (batch, sequence) pair of "
                f'positive integers or "{PADDED}"'
            )
        if shape[0] * shape[1] > MAX_GRID_TOKENS:
            raise UsageError(
                f"{argument('shapes', shapes)}: {shape[0]}x{shape[1]} is "
                f"{shape[0] * shape[1]:,} tokens; at most {MAX_GRID_TOKENS:,} per grid point"
            )
    return list(shapes)


def default_shapes(loaded: LoadedModel) -> list:
    """Batch 1, 2, 8 x lengths 1, 7, 64, 256, within what the model allows (a
    fixed length, or the longest its position tables hold), plus `padded`."""
    fixed = [info.shape[1] for info in loaded.inputs if len(info.shape) > 1]
    fixed = [size for size in fixed if size is not None]
    if fixed:
        lengths = (fixed[0],)
    else:
        bound = loaded.max_length or max(DEFAULT_LENGTHS)
        lengths = tuple(sorted({min(length, bound) for length in DEFAULT_LENGTHS}))
    shapes = [(batch, length) for batch in DEFAULT_BATCHES for length in lengths]
    if takes_padding(loaded):
        shapes.append(PADDED)
    return shapes


def check_shapes_fit(loaded: LoadedModel, shapes: list) -> None:
    """Refuse grid points longer than the model's position tables allow.

    Args:
        loaded: the loaded model (`max_length`, read from its position tables).
        shapes: the grid, already checked by `check_shapes`.

    Raises:
        UsageError: a grid point is longer than `loaded.max_length`.
    """
    if loaded.max_length is None:
        return
    for shape in shapes:
        if shape != PADDED and shape[1] > loaded.max_length:
            raise UsageError(
                f"{argument('shapes', shapes)}: {shape_label(shape)} is longer than the "
                f"{loaded.max_length} positions the model holds (layer "
                f"{loaded.max_length_source!r}); ask for at most {loaded.max_length}"
            )


def takes_padding(loaded: LoadedModel) -> bool:
    return any(info.masks_zero or info.is_padding_mask for info in loaded.inputs)


def _fixed_length(loaded: LoadedModel, sequence: str) -> int | None:
    for info in loaded.inputs:
        if info.sequence == sequence and info.role != "positions" and len(info.shape) > 1:
            if info.shape[1] is not None:
                return info.shape[1]
    return None


def _sequence_lengths(loaded: LoadedModel, length: int) -> dict:
    """Each sequence axis's length at a grid point of `length`: the first gets
    it, each other one less (so that an encoder and a decoder are never fed
    equal lengths by accident), within the model's fixed lengths and bound."""
    lengths = {}
    for info in loaded.inputs:
        if info.sequence in lengths or info.role == "positions":
            continue
        own = length if not lengths else max(1, length - len(lengths) * max(1, length // 3))
        fixed = _fixed_length(loaded, info.sequence)
        lengths[info.sequence] = fixed or min(own, loaded.max_length or own)
    return lengths


def make_inputs(loaded: LoadedModel, shape, rng) -> dict:
    """Inputs for one grid point, keyed by input name.

    `padded` is a batch of 5 rows of true lengths (all, all - 3, 1, half, 0)
    of 64 tokens (or the model's bound), right-padded: the last row is padding
    only, so that every query in it sees no key. Positions are drawn among each
    row's real tokens (0 in the empty row).

    Args:
        loaded: the loaded model; each input's role says what to generate.
        shape: a `(batch, sequence)` pair or `"padded"`.
        rng: a `numpy.random.Generator`.

    Returns:
        One array per input, of the input's dtype.
    """
    if shape == PADDED:
        batch, length = 5, min(64, loaded.max_length or 64)
    else:
        batch, length = shape
    lengths = _sequence_lengths(loaded, length)
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
        mask = valid.get(info.sequence, next(iter(valid.values()), np.ones((batch, 1), bool)))
        full = mask.shape[1]
        if info.role == "positions":
            count = info.shape[1] if len(info.shape) > 1 and info.shape[1] else max(1, full // 4)
            true = mask.sum(axis=1, keepdims=True)
            value = (rng.random((batch, count)) * true).astype("int64")
        else:
            dims = [batch, full, *[d or 1 for d in info.shape[2:]]][: len(info.shape)]
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
        feeds[info.name] = np.asarray(value).astype(info.dtype)
    return feeds


def _is_integer(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def shape_label(shape) -> str:
    return shape if shape == PADDED else f"{shape[0]}x{shape[1]}"


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
        flat = flatten(loaded.model(args, training=False), output_names)
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


def compare(
    label, name, got, expected, atol, rtol, valid=None, allow_nonfinite: bool = False
) -> Check:
    """Compare one ONNX output with the Keras one; never raises.

    `valid` (batch, sequence) marks the real tokens; top-1 agreement counts only
    those. NaN or infinity in Keras' own output fails the check unless
    `allow_nonfinite`, or unless it is only in rows with no real token (a mean
    over no token is NaN in any correct model); either way the ONNX output
    must have the same ones.

    Args:
        label: the grid point (`shape_label`).
        name: the output's name.
        got: ONNX Runtime's output, or `None` when it is missing.
        expected: Keras' output.
        atol: absolute tolerance.
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
    # Compare in the outputs' own dtype (float64 copies of 8 x 256 x 30k logits
    # would cost a gigabyte); integers and booleans as float64.
    dtype = got.dtype if np.issubdtype(got.dtype, np.floating) else np.float64
    got_f, expected_f = got.astype(dtype, copy=False), expected.astype(dtype, copy=False)
    nonfinite = float(np.mean(~np.isfinite(expected_f))) if expected_f.size else 0.0
    allow_nonfinite = allow_nonfinite or _nonfinite_only_in_empty_rows(expected_f, valid)
    problem = None
    if not (np.isfinite(got_f).all() and nonfinite == 0.0):
        if not _same_nonfinite(got_f, expected_f):
            return failed("NaN or infinity differs", nonfinite)
        finite = np.isfinite(got_f) & np.isfinite(expected_f)
        got_f, expected_f = got_f[finite], expected_f[finite]
        if not allow_nonfinite:
            problem = (
                f"Keras' own output is {nonfinite:.1%} NaN or infinity; fix the model, "
                f"or allow it with {fix('allow_nonfinite')}"
            )
    diff = np.abs(got_f - expected_f)
    magnitude = np.abs(expected_f)
    max_abs = float(diff.max()) if diff.size else 0.0
    # Relative difference where it means something: away from zero.
    meaningful = magnitude > atol
    max_rel = float((diff[meaningful] / magnitude[meaningful]).max()) if meaningful.any() else 0.0
    passed = problem is None and bool(np.all(diff <= atol + rtol * magnitude))
    top1 = None
    if got.ndim >= 2 and got.shape[-1] > 1 and np.issubdtype(got.dtype, np.floating):
        same = got.argmax(-1) == expected.argmax(-1)
        if valid is not None and same.shape == valid.shape and valid.any():
            same = same[valid]
        top1 = float(np.mean(same))
    return Check(label, name, max_abs, max_rel, passed, top1, problem, nonfinite)


def _valid_positions(loaded: LoadedModel, feeds: dict):
    for info in loaded.inputs:
        if info.is_padding_mask:
            return feeds[info.name].astype(bool)
        if info.masks_zero:
            return feeds[info.name] != 0
    return None


def judge_by_predictions(check: Check, got, expected) -> Check:
    """Re-judge a check for a quantized model (see INT8_MIN_TOP1).

    Args:
        check: the check by tolerances (`compare`).
        got: the int8 file's output.
        expected: Keras' output.

    Returns:
        `check`, passed by top-1 agreement, or by relative L2 error for an
        output without a top-1.
    """
    if check.problem is not None:
        return check
    if check.top1_agreement is not None:
        check.passed = check.top1_agreement >= INT8_MIN_TOP1
    else:
        error = np.linalg.norm(got - expected) / max(np.linalg.norm(expected), 1e-12)
        check.passed = bool(error <= INT8_MAX_RELATIVE_ERROR)
    return check


@dataclass
class Reference:
    """Keras' outputs at one grid point, with the inputs that gave them."""

    shape: object
    feeds: dict
    outputs: dict


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
    for shape in shapes or default_shapes(loaded):
        feeds = make_inputs(loaded, shape, rng)
        yield Reference(shape, feeds, keras_outputs(loaded, feeds, shape_label(shape)))


def session_options(lean_memory: bool):
    """ONNX Runtime's session options for the checks: with `lean_memory`,
    without pre-packing the weights and without its memory arena (`validate`)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if lean_memory:
        options.add_session_config_entry("session.disable_prepacking", "1")
        options.enable_cpu_mem_arena = False
    return options


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
        quantized: judge an int8 file by top-1 agreement instead of tolerances.
        allow_nonfinite: accept NaN or infinity in Keras' own outputs.
        lean_memory: run ONNX Runtime without pre-packing the weights (a
            packed copy of every MatMul weight, made when the session starts)
            and without its memory arena (which keeps what constant folding
            allocated at start-up). With its weights in a data file, ONNX
            Runtime then maps the file and holds about one copy of them
            (the peaks are in benchmarks/results/big_model.json): for
            models whose weights pass `converting.LARGE_MODEL_BYTES`, where
            memory is the limit. The products are the same; only memory
            layout and reuse differ.
        references: Keras' outputs computed beforehand (`keras_references`
            over the same grid); the model is not run again.

    Returns:
        One `Check` per output and grid point; `passed` when all pass.

    Raises:
        UsageError: Keras itself fails on a grid point (`keras_outputs`);
            ONNX Runtime's failures are reported in `error`, not raised.
    """
    import onnxruntime as ort

    start = time.perf_counter()
    result = Validation(atol=atol, rtol=rtol)
    try:
        options = session_options(lean_memory)
        source = onnx_path if isinstance(onnx_path, bytes) else str(onnx_path)
        session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - the file's failure, reported as one
        result.error = f"ONNX Runtime cannot load the file: {one_line(str(error), 300)}"
        return result
    onnx_outputs = [o.name for o in session.get_outputs()]
    grid = shapes or default_shapes(loaded)
    if references is None:
        references = keras_references(loaded, grid)  # one point held at a time
    for done, reference in enumerate(references, start=1):
        shape, feeds, expected = reference.shape, reference.feeds, reference.outputs
        try:
            got = dict(zip(onnx_outputs, session.run(None, feeds), strict=True))
        except Exception as error:  # noqa: BLE001 - the file's failure, reported as one
            result.error = (
                f"ONNX Runtime fails on the {shape_label(shape)} input: {one_line(str(error), 300)}"
            )
            return result
        valid = _valid_positions(loaded, feeds)
        for name, value in expected.items():
            check = compare(
                shape_label(shape), name, got.get(name), value, atol, rtol, valid, allow_nonfinite
            )
            if quantized:
                check = judge_by_predictions(check, got.get(name), value)
            result.checks.append(check)
        if on_step:
            on_step(done, len(grid))
    result.seconds = time.perf_counter() - start
    return result
