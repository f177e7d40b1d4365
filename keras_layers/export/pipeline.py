"""The export pipeline: load -> trace -> convert -> slim -> validate -> (int8) -> report.

Each stage is a function in its own module that takes and returns plain data;
this module checks the arguments, runs the stages in order, times them, and
hands the finished files to `placement`, which alone touches the user's paths.
"""

import math
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from keras_layers.export import (
    causal_lm,
    converting,
    loading,
    memory,
    placement,
    quantizing,
    reporting,
    slimming,
    tracing,
    validating,
)
from keras_layers.export.errors import OutputError, UsageError, ValidationFailed, argument

EXTERNAL_DATA_CHOICES = ("auto", "always", "never")
QUANTIZE_CHOICES = ("int8",)


@dataclass(frozen=True)
class StageEvent:
    """What `export_model` tells its `progress` callback.

    Attributes:
        stage: the stage's name (`load`, `trace`, `convert`, `slim`, `validate`,
            `quantize`, `report`).
        seconds: `None` when the stage starts; its duration when it has finished.
        done: for a stage that counts steps (`validate`, `quantize`), the steps done.
        total: the number of steps of that stage.
    """

    stage: str
    seconds: float | None = None
    done: int | None = None
    total: int | None = None


Progress = Callable[[StageEvent], None]


def _no_progress(event: StageEvent) -> None:
    del event


class _Interrupts:
    """Ctrl-C that cannot be lost.

    Python raises KeyboardInterrupt wherever the main thread happens to be; when
    that is inside a garbage-collector callback or a `__del__` (TensorFlow and
    tf2onnx run some), the exception is printed and dropped, and the export
    would go on to finish. While the export runs, SIGINT is also recorded here,
    and every stage boundary and the placement check the record.
    """

    def __init__(self):
        self.received = False

    def _handler(self, signum, frame) -> None:
        del signum, frame
        self.received = True
        raise KeyboardInterrupt

    @contextmanager
    def watching(self) -> Iterator["_Interrupts"]:
        try:
            previous = signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main thread: signals are not ours to take
            yield self
            return
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)

    def check(self) -> None:
        if self.received:
            raise KeyboardInterrupt


def _check_tolerance(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UsageError(f"{argument(name, value)}: must be a finite number >= 0")
    if value < 0:
        raise UsageError(f"{argument(name, value)}: must be >= 0")
    return float(value)


def _check_options(atol, rtol, opset, external_data, quantize, task, shapes) -> None:
    """Every argument that needs no model, checked before any work."""
    if task not in causal_lm.TASKS:
        raise UsageError(f"{argument('task', task)}: choose one of {causal_lm.TASKS}")
    if task == "causal-lm" and shapes is not None:
        raise UsageError(
            f"{argument('shapes', shapes)}: a grid of shapes checks the forward pass; "
            "--task causal-lm checks a prompt, decode steps and greedy generation instead "
            "(keras_layers.export.causal_lm): leave the shapes out"
        )
    if task == "causal-lm" and quantize is not None:
        raise UsageError(
            f"{argument('quantize', quantize)}: not checked with --task causal-lm yet; export "
            "without it and quantize the decoder with "
            "onnxruntime.quantization.quantize_dynamic (benchmarks/generate.py does)"
        )
    _check_tolerance("atol", atol)
    _check_tolerance("rtol", rtol)
    converting.check_opset(opset)
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise UsageError(
            f"{argument('quantize', quantize)}: unsupported; choose one of {QUANTIZE_CHOICES}"
        )
    if external_data not in EXTERNAL_DATA_CHOICES:
        raise UsageError(
            f"{argument('external_data', external_data)}: choose one of {EXTERNAL_DATA_CHOICES}"
        )


# The staged graph and the data file its weights were written to by `convert`
# (`data_name`: placement renames it by its content).
_STAGED_GRAPH = "model.onnx"
_STAGED_DATA = placement.data_name(_STAGED_GRAPH, "staged")


def _save(proto, path: Path, external: bool) -> Path | None:
    """Save the proto; with `external`, its weights are already in the data
    file beside it, written by `convert`. Returns the data file, if any."""
    import onnx

    onnx.save_model(proto, path)
    return path.with_name(_STAGED_DATA) if external else None


def _point_at_data(graph_path: Path, data_name: str) -> None:
    """Make the staged graph read `data_name` (the data file's final name)."""
    import onnx
    from onnx import TensorProto

    proto = onnx.load(str(graph_path), load_external_data=False)
    for tensor in proto.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = data_name
    onnx.save_model(proto, graph_path)


def _quantize(loaded, staged: "_Staged", shapes, evaluate, external: bool, references) -> dict:
    """Quantize the validated float file and judge it; returns its report entry."""
    int8_path, param_bytes = staged.int8, loaded.param_bytes
    quantizing.quantize_int8(staged.graph, int8_path)
    validation = validating.validate(
        loaded, int8_path, shapes, quantized=True, lean_memory=external, references=references
    )
    evaluation = evaluate(int8_path) if evaluate else None
    worst = min(
        (check for check in validation.checks if check.top1_agreement is not None),
        key=lambda check: check.top1_agreement,
        default=None,
    )
    size = int8_path.stat().st_size
    return {
        "passed": validation.passed and (evaluation is None or bool(evaluation["passed"])),
        "file_bytes": size,
        "size_ratio": round(size / param_bytes, 4) if param_bytes else None,
        "min_top1": validating.INT8_MIN_TOP1,
        "lowest_top1": (
            {"agreement": worst.top1_agreement, "shape": worst.shape} if worst else None
        ),
        "checks": [asdict(check) for check in validation.checks],
        "evaluation": evaluation,
    }


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while the files are renamed into place, so an
    interrupt lands before or after the placement, never in the middle."""
    held = {signal.SIGINT, signal.SIGTERM}
    try:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    except (ValueError, OSError):  # not the main thread: nothing to hold
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _failure_message(report: dict, validation, targets, final, atol, rtol) -> str:
    kept = f"The new file was kept as {final.onnx}; {targets.onnx} was left untouched."
    if validation.error is not None:
        return f"validation failed: {validation.error}. {kept} Report: {final.report}"
    if not validation.passed:
        worst = validation.worst()
        what = worst.problem or (
            f"max abs diff {worst.max_abs_diff:.3g} > atol {atol:g} + rtol {rtol:g} x |keras|"
        )
        return (
            f"validation failed: output {worst.output!r} at shape {worst.shape}: {what}. "
            f"{kept} Report: {final.report}"
        )
    int8 = report["int8"]
    lowest = int8["lowest_top1"]
    detail = (
        f"lowest top-1 agreement {lowest['agreement']:.2%} at {lowest['shape']} "
        f"(at least {int8['min_top1']:.0%} needed)"
        if lowest
        else "an output without top-1 moved beyond the int8 bound"
    )
    if int8["evaluation"] is not None and not int8["evaluation"]["passed"]:
        detail += f"; {int8['evaluation'].get('summary', 'the task-level check failed')}"
    return (
        f"int8 validation failed: {detail}. Nothing was placed at the output paths; "
        f"the files were kept as {final.onnx} and {final.int8}. Report: {final.report}"
    )


def export_model(
    model,
    output,
    *,
    report_path=None,
    shapes: list | None = None,
    atol: float = validating.DEFAULT_ATOL,
    rtol: float = validating.DEFAULT_RTOL,
    opset: int = converting.DEFAULT_OPSET,
    imports: tuple[str, ...] | list[str] = (),
    unsafe: bool = False,
    external_data: str = "auto",
    quantize: str | None = None,
    allow_nonfinite: bool = False,
    input_roles: dict[str, str] | None = None,
    memory_check: bool = True,
    evaluate: Callable[[Path], dict] | None = None,
    progress: Progress | None = None,
    extra_report: dict | None = None,
    task: str = "forward",
) -> dict:
    """Export a Keras model to ONNX and prove in ONNX Runtime that it matches.

    Args:
        model: a `keras.Model` in memory, or the path of a `.keras` file.
        output: the ONNX file to write (`.onnx`).
        report_path: where the JSON report goes (default `OUTPUT.report.json`
            beside the output, without `.onnx`).
        shapes: the validation grid: `(batch, sequence)` pairs and `"padded"`
            (a right-padded batch). Default: batch 1, 2, 8 x sequence 1, 7, 64,
            256 (or the model's fixed length), plus `"padded"` when the model
            masks padding.
        atol: absolute tolerance of every check.
        rtol: relative tolerance, times |Keras output|.
        opset: the ONNX opset to convert to (13 up to tf2onnx's newest).
        imports: modules to import first (they register custom layers); only
            for these is the working directory searched.
        unsafe: allow Lambda layers when loading a file (runs code stored in it).
        external_data: `"auto"` (weights in a data file beside the graph,
            `OUTPUT.<content hash>.data`, when over ~1.8 GB), `"always"` or
            `"never"`.
        quantize: `"int8"` also writes `OUTPUT.int8.onnx`, quantized dynamically
            and judged by top-1 agreement with Keras (`validating.INT8_MIN_TOP1`).
        allow_nonfinite: accept NaN or infinity in Keras' own outputs (the
            ONNX output must have the same ones); by default such a check fails,
            since a model that computes NaN is broken whatever the file does.
        input_roles: how to generate an input and name its sequence axis, when
            the role read from the model is not the one wanted: `{name:
            "ROLE"}` or `{name: "ROLE@AXIS"}`, ROLE one of `ids`,
            `padding_mask`, `token_positions`, `positions`, `features` (see
            `keras_layers.export.inputs`).
        memory_check: refuse, before any work, an export whose estimated peak
            memory exceeds what the machine has available (`memory.check_fits`).
        evaluate: `evaluate(int8_path) -> dict` with a `passed` key: a
            task-level check of the int8 file.
        progress: called with a `StageEvent` as each stage starts and ends,
            and for each validation step.
        extra_report: entries added to the report as they are.
        task: `"forward"` exports the model's call over whole sequences;
            `"causal-lm"` exports a decoder with its key/value cache, one call
            per prompt or new token, for `keras_layers.export.generate`
            (`keras_layers.export.causal_lm` says which models can), and
            validates a prompt, decode steps and greedy generation against
            Keras instead of the grid.

    Returns:
        The report (a JSON-ready dict, also written to the report path):
        `passed`, `onnx_path`, `checks`, `graph`, `stage_seconds`, ...

    Raises:
        UsageError: a bad argument or input (exit code 2 on the command line);
            `ModelLoadError` and `OutputError` are kinds of it.
        ConversionError: tf2onnx cannot convert the model.
        ValidationFailed: ONNX Runtime and Keras disagree beyond the
            tolerances, or the int8 file fails its checks. Nothing at the
            output paths was changed; the new files are kept under `.failed`
            names, and the report is attached as `error.report`.

    Example:

    >>> import keras
    >>> from keras_layers import ScaledEmbedding
    >>> ids = keras.Input((None,), dtype="int32", name="token_ids")
    >>> model = keras.Model(ids, ScaledEmbedding(20, 4)(ids))
    >>> report = export_model(model, tmp / "tiny.onnx", shapes=[(1, 3), (2, 5)])
    >>> report["passed"]
    True
    """
    progress = progress or _no_progress
    _check_options(atol, rtol, opset, external_data, quantize, task, shapes)
    output = Path(output)
    targets = placement.Targets(
        onnx=output,
        report=Path(report_path) if report_path else placement.default_report_path(output),
    )
    placement.check_targets(targets, Path(model) if isinstance(model, str | Path) else None)
    if shapes is not None:
        validating.check_shapes(shapes)
    if memory_check:
        weight_bytes = memory.estimated_param_bytes(model)
        memory.check_fits(weight_bytes, memory.uses_external_data(external_data, weight_bytes))
    with _Interrupts().watching() as interrupts, placement.staging_folder(output) as folder:
        run = _Run(progress, interrupts)
        loaded, decoder, weights_read, slimmed, external = _convert(
            model, run, imports, unsafe, opset, external_data, input_roles, folder, task
        )
        if decoder is None:
            if shapes is not None:
                validating.check_shapes_fit(loaded, shapes)
            shapes = shapes or validating.default_shapes(loaded)
        staged = _Staged.write(slimmed.proto, folder, output, external)
        with run.stage("validate"):
            references = None
            if decoder is not None:
                validation = _validate_decoder(loaded, decoder, staged, atol, rtol, run, external)
            else:
                validation, references = _validate_forward(
                    loaded, staged, shapes, atol, rtol, run, external, allow_nonfinite
                )
        int8 = None
        if quantize and validation.passed:
            with run.stage("quantize"):
                int8 = _quantize(loaded, staged, shapes, evaluate, external, references)
        passed = validation.passed and (int8 is None or int8["passed"])
        final = targets if passed else targets.failed()
        with run.stage("report"):
            moves = staged.moves(final, int8 is not None)
            report = reporting.build_report(
                loaded=loaded,
                onnx_path=final.onnx,
                opset=opset,
                file_bytes=staged.file_bytes,
                weights_read=weights_read,
                slimmed=slimmed,
                validation=validation,
                stages=run.seconds,
                external_data=external,
                extra=extra_report,
            )
            report["passed"] = passed
            report["data_files"] = [str(to) for _, to in moves if to.name.endswith(".data")]
            report["report_path"] = str(final.report)
            if int8 is not None:
                report["int8"] = {"onnx_path": str(final.int8), **int8}
        report["stage_seconds"]["report"] = round(run.seconds["report"], 3)
        placement.write_json(report, staged.report)
        with _signals_deferred():
            interrupts.check()
            placement.place([*moves, (staged.report, final.report)])
    if not passed:
        raise ValidationFailed(
            _failure_message(report, validation, targets, final, atol, rtol), report
        )
    return report


def _validate_forward(loaded, staged, shapes, atol, rtol, run, external, allow_nonfinite):
    """The grid's checks, and Keras' outputs when they were computed first
    (with external data: `quantize` reuses them)."""
    references = None
    if external:
        # Keras' outputs first, then its weights go before ONNX Runtime
        # maps its own: the two copies are never held at once.
        references = list(validating.keras_references(loaded, shapes))
        loaded.release_model()
    validation = validating.validate(
        loaded,
        staged.graph,
        shapes,
        atol,
        rtol,
        run.steps("validate"),
        allow_nonfinite=allow_nonfinite,
        lean_memory=external,
        references=references,
    )
    return validation, references


def _validate_decoder(loaded, decoder, staged, atol, rtol, run, external):
    """Keras' side first (and, with external data, the model released), then
    ONNX Runtime's: `causal_lm.references`, `causal_lm.validate`."""
    start = time.perf_counter()
    reference = causal_lm.references(loaded, decoder)
    if external:
        loaded.release_model()
    validation = causal_lm.validate(
        reference, staged.graph, atol, rtol, run.steps("validate"), lean_memory=external
    )
    validation.seconds = time.perf_counter() - start
    return validation


class _Run:
    """Times the stages and reports them to `progress`; checks for Ctrl-C
    between them."""

    def __init__(self, progress: Progress, interrupts: _Interrupts):
        self.progress = progress
        self.interrupts = interrupts
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self.interrupts.check()
        self.progress(StageEvent(name))
        start = time.perf_counter()
        yield
        self.seconds[name] = time.perf_counter() - start
        self.interrupts.check()
        self.progress(StageEvent(name, seconds=self.seconds[name]))

    def steps(self, name: str) -> Callable[[int, int], None]:
        """A `(done, total)` callback that reports the steps of stage `name`."""

        def step(done: int, total: int) -> None:
            self.progress(StageEvent(name, done=done, total=total))

        return step


def _convert(
    model,
    run: _Run,
    imports,
    unsafe: bool,
    opset: int,
    external_data: str,
    input_roles,
    folder,
    task: str,
):
    """Load, trace, convert and slim: (loaded model, its `causal_lm.Decoder`
    for `task="causal-lm"` else None, Keras paths of the weights the outputs
    read, slimmed proto, external data?). With external data, the weights are
    written to the staged data file in `folder` as they are converted, never
    held in the proto. For a decoder, `loaded.inputs` and `loaded.outputs`
    become the file's (ids and caches in, logits and caches out)."""
    with run.stage("load"):
        loaded = loading.load(model, imports=imports, unsafe=unsafe, input_roles=input_roles)
    external = memory.uses_external_data(external_data, loaded.param_bytes)
    decoder = None
    with run.stage("trace"):
        if task == "causal-lm":
            decoder = causal_lm.describe(loaded)
            traced = causal_lm.trace(loaded, decoder)
            loaded.inputs, loaded.outputs = decoder.inputs(), decoder.outputs()
        else:
            traced = tracing.trace(loaded)
    with run.stage("convert"):
        data_path = folder / _STAGED_DATA if external else None
        converted = converting.convert(traced, opset=opset, data_path=data_path)
    with run.stage("slim"):
        slimmed = slimming.slim(
            converted.proto,
            loaded.inputs,
            loaded.outputs,
            run_onnxslim=not external,
            model_name=loaded.name,
        )
    return loaded, decoder, converted.weights_read, slimmed, external


@dataclass(frozen=True)
class _Staged:
    """The files of one export in its staging folder."""

    graph: Path
    data: Path | None
    int8: Path
    report: Path

    @classmethod
    def write(cls, proto, folder: Path, output: Path, external: bool) -> "_Staged":
        # Fixed names inside the private folder: an output called `report.json`
        # or `int8.onnx` cannot collide with another staged file.
        graph = folder / _STAGED_GRAPH
        try:
            data = _save(proto, graph, external)
        except OSError as error:
            raise OutputError(
                f"{argument('output', output)}: cannot write the ONNX file "
                f"({error.strerror or error}); nothing at the output paths was changed"
            ) from error
        return cls(graph, data, folder / "model.int8.onnx", folder / "report.json")

    @property
    def file_bytes(self) -> int:
        return self.graph.stat().st_size + (self.data.stat().st_size if self.data else 0)

    def moves(self, final: placement.Targets, int8: bool) -> list[tuple[Path, Path]]:
        """(staged, final) pairs of the files to place; the graph is pointed at
        its data file's final name, which is named by its content."""
        moves = [(self.graph, final.onnx)]
        if self.data is not None:
            digest = placement.file_digest(self.data)
            data = final.onnx.with_name(placement.data_name(final.onnx.name, digest))
            _point_at_data(self.graph, data.name)
            moves.append((self.data, data))
        if int8:
            moves.append((self.int8, final.int8))
        return moves
