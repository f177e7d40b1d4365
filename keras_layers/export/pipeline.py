"""The export pipeline: load -> trace -> convert -> slim -> validate -> (int8) -> report.

Each stage is a function in its own module that takes and returns plain data,
and what differs from one task to another (the file's inputs and outputs, the
trace, the checks) is the task's (`keras_layers.export.tasks`). This module
looks the task up, runs the stages in order, times them, and hands the
finished files to `placement`, which alone touches the user's paths.
"""

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from keras_layers.export import (
    converting,
    images,
    loading,
    memory,
    placement,
    quantizing,
    reporting,
    slimming,
    tasks,
    validating,
)
from keras_layers.export.errors import OutputError, UsageError, ValidationFailed, argument
from keras_layers.export.graph import weights
from keras_layers.export.loading import LoadedModel
from keras_layers.export.options import ACCURACY_LEVEL, ExportOptions
from keras_layers.export.passes import weights_dtype
from keras_layers.export.tasks import Checks, Task


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


def no_progress(event: StageEvent) -> None:
    del event


class Interrupts:
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
    def watching(self) -> Iterator["Interrupts"]:
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


# The staged graph and its data file (`data_name`: placement renames it by its
# content), and the data file `convert` writes the weights to as it converts
# them, which the passes read and write and `_Staged.write` leaves behind.
_STAGED_GRAPH = "model.onnx"
_STAGED_DATA = placement.data_name(_STAGED_GRAPH, "staged")
_CONVERTED_DATA = "converted.data"
# The graph with its weights in it, written from the two above.
_WHOLE_GRAPH = "whole.onnx"


@contextmanager
def _writing(output: Path) -> Iterator[None]:
    """An error writing a staged file is the disk's, said as such."""
    try:
        yield
    except OSError as error:
        raise OutputError(
            f"{argument('output', output)}: cannot write the ONNX file "
            f"({error.strerror or error}); nothing at the output paths was changed"
        ) from error


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


def _quantize(task: Task, converted: "_Converted", staged: "_Staged", checks: Checks, evaluate):
    """Quantize the validated float file and judge it; returns its report entry.

    The int8 file is judged by its predictions, at the default tolerances,
    on the float file's grid and Keras outputs (`checks`)."""
    int8_path, param_bytes = staged.int8, converted.loaded.param_bytes
    quantized = quantizing.quantize_int8(staged.graph, int8_path)
    int8_checks = replace(checks, quantized=True, on_step=None)
    validation = task.validate(converted.loaded, int8_path, int8_checks)
    evaluation = evaluate(int8_path) if evaluate else None
    size = int8_path.stat().st_size
    speed = quantizing.latency(staged.graph, int8_path, _largest_point(converted.loaded, checks))
    convolutions = quantized["float_convolutions"]
    return {
        "passed": validation.passed and (evaluation is None or bool(evaluation["passed"])),
        # A CNN's int8 file is kept only where it is faster, beyond the noise.
        "kept": not convolutions
        or bool(speed["speedup"] and speed["speedup"] >= quantizing.MIN_KEPT_SPEEDUP),
        "latency": speed,
        "file_bytes": size,
        "size_ratio": round(size / param_bytes, 4) if param_bytes else None,
        "min_top1": checks.min_top1,
        "gates": [asdict(gate) for gate in validation.gates],
        "failure": None if validation.passed else validation.failure(),
        "checks": [asdict(check) for check in validation.checks],
        "evaluation": evaluation,
        # Convolutions whose weights stay float32 (int8 quantizes MatMul and Gather).
        "float_convolutions": quantized["float_convolutions"],
    }


def _slower_int8(int8: dict, path: Path) -> str:
    """The warning for a CNN's int8 file left out for its speed."""
    speed = int8["latency"]
    return (
        f"the int8 file is not kept: accurate, but {speed['int8_ms']} ms against float32's "
        f"{speed['float32_ms']} ms (x{speed['speedup']} the speed, median of "
        f"{speed['rounds']} interleaved runs; kept from x{quantizing.MIN_KEPT_SPEEDUP}): "
        f"its {int8['float_convolutions']} convolutions keep float32 weights and its "
        f"activations are quantized at run time; {path} is not written (one from an earlier "
        "export is left as it was)"
    )


def _largest_point(loaded, checks: Checks) -> dict:
    """The input of the grid's largest `(batch, length)` point, for timing."""
    points = [shape for shape in checks.grid or [] if isinstance(shape, tuple | list)]
    shape = max(points, key=lambda point: point[0] * point[1], default=(1, 1))
    return validating.make_inputs(loaded, tuple(shape), np.random.default_rng(0))


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


def _failure(report: dict, validation, targets, final) -> ValidationFailed:
    kept = f"The new file was kept as {final.onnx}; {targets.onnx} was left untouched."
    if not validation.passed:
        reason = f"validation failed: {validation.failure()}"
        return ValidationFailed(f"{reason}. {kept} Report: {final.report}", report, reason)
    int8 = report["int8"]
    detail = int8["failure"] or "the int8 file passes its gates"
    if int8["evaluation"] is not None and not int8["evaluation"]["passed"]:
        detail += f"; {int8['evaluation'].get('summary', 'the task-level check failed')}"
    reason = f"int8 validation failed: {detail}"
    return ValidationFailed(
        f"{reason}. Nothing was placed at the output paths; the files were kept as "
        f"{final.onnx} and {final.int8}. Report: {final.report}",
        report,
        reason,
    )


def export_model(
    model,
    output,
    options: ExportOptions | None = None,
    *,
    task: str = "forward",
    progress: Progress | None = None,
    evaluate: Callable[[Path], dict] | None = None,
) -> dict:
    """Export a Keras model to ONNX and prove in ONNX Runtime that it matches.

    Args:
        model: a `keras.Model` in memory, or the path of a `.keras` file.
        output: the ONNX file to write (`.onnx`).
        options: the grid, tolerances, opset, report path, ...: an
            `ExportOptions` (default: every default).
        task: a name of `keras_layers.export.tasks.TASKS`: `"forward"`
            exports the model's call over whole sequences and checks it over
            a grid of shapes; `"causal-lm"` exports a decoder with its
            key/value cache, one call per prompt or new token, for
            `keras_layers.export.generate` (`keras_layers.export.causal_lm`
            says which models can), and validates a prompt, decode steps and
            greedy generation against Keras instead of the grid.
        progress: called with a `StageEvent` as each stage starts and ends, and per step.
        evaluate: `evaluate(int8_path) -> dict` with a `passed` key: a
            task-level check of the int8 file (`ExportOptions.quantize`).

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
    >>> report = export_model(model, tmp / "tiny.onnx", ExportOptions(shapes=[(1, 3), (2, 5)]))
    >>> report["passed"]
    True
    """
    output, options = Path(output), checked_options(options)
    exporter, targets = _before_any_work(model, output, options, task)
    staging = placement.staging_folder(output, (targets.report,))
    with Interrupts().watching() as interrupts, staging as folder:
        run = Run(progress or no_progress, interrupts)
        converted = _convert(model, exporter, options, run, folder)
        staged = _Staged.write(converted.slimmed.proto, folder, output)
        lean = memory.validates_lean(converted.external, converted.loaded.param_bytes)
        validation, checks = validate_stage(
            exporter, converted.loaded, staged.graph, converted.grid, options, run, lean
        )
        int8 = None
        if options.quantize and validation.passed:
            with run.stage("quantize"):
                int8 = _quantize(exporter, converted, staged, checks, evaluate)
        if not converted.external:
            staged = staged.in_one_file(output)
        passed = validation.passed and (int8 is None or int8["passed"])
        final = targets if passed else targets.failed()
        report, moves = _report(run, converted, staged, final, validation, int8, options)
        report["passed"] = passed
        placement.write_json(report, staged.report)
        with placement.output_lock(output), _signals_deferred():  # the lock's wait takes Ctrl-C
            interrupts.check()
            placement.place([*moves, (staged.report, final.report)])
            if passed:
                placement.remove_failed(targets)
    if not passed:
        raise _failure(report, validation, targets, final)
    return report


def checked_options(options) -> ExportOptions:
    """`options`, or the defaults for None; anything else is a `UsageError`."""
    if options is None:
        return ExportOptions()
    if not isinstance(options, ExportOptions):
        raise UsageError(
            f"{argument('options', options)}: expected an ExportOptions "
            "(from keras_layers.export.options import ExportOptions)"
        )
    return options


def _before_any_work(model, output: Path, options: ExportOptions, task: str):
    """The task (which refuses the options it cannot honour) and the output
    paths (`placement.check_targets`), and whether the export fits in memory
    (`memory.check_fits`): every check that needs no loaded model."""
    if options.preprocessor:
        raise UsageError(
            f"{argument('preprocessor', True)}: this stage exports token ids in; call "
            "keras_layers.export.export_model, which hands the export to export_text_model"
        )
    exporter = tasks.lookup(task)
    exporter.check(options)
    if options.quantize and options.weights_dtype == "keep":
        raise UsageError(
            f"{argument('weights_dtype', 'keep')} with {argument('quantize', options.quantize)}: "
            "streams a causal LM's stored weights into its quantized folder; give --task "
            "causal-lm and -o FOLDER/, or leave weights_dtype at float32"
        )
    if options.decoder_accuracy_level != ACCURACY_LEVEL:
        raise UsageError(
            f"{argument('decoder_accuracy_level', options.decoder_accuracy_level)}: sets how a "
            "causal LM folder's quantized decoder computes (MatMulNBits); a file's int8 copy is "
            "quantized dynamically; give --task causal-lm and -o FOLDER/, or leave it out"
        )
    targets = placement.Targets(
        onnx=output, report=options.report_path or placement.default_report_path(output)
    )
    placement.check_targets(targets, Path(model) if isinstance(model, str | Path) else None)
    if options.memory_check:
        memory.check_fits(
            memory.estimated_param_bytes(model), asset_bytes=memory.archive_asset_bytes(model)
        )
    return exporter, targets


class Run:
    """Times the stages and reports them to `progress`; checks for Ctrl-C
    between them."""

    def __init__(self, progress: Progress, interrupts: Interrupts):
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


@dataclass
class _Converted:
    """What load, trace, convert and slim made: the loaded model (its inputs
    and outputs the file's), the Keras paths of the weights the outputs read,
    the slimmed proto, and whether the weights go to a data file."""

    loaded: LoadedModel
    weights_read: set
    slimmed: object
    external: bool
    grid: list | None


def _convert(model, task: Task, options: ExportOptions, run: Run, folder: Path) -> _Converted:
    """Load, trace, convert and slim. Whatever the model's size, the weights
    are written to a data file in `folder` as they are converted and never
    held in the proto the passes rewrite (`graph.weights`)."""
    with run.stage("load"):
        loaded = loading.load(
            model,
            imports=options.imports,
            unsafe=options.unsafe,
            input_roles=options.input_roles,
            shapes=options.shapes,
        )
        if options.channels_first:  # the same weights, NCHW images in
            wrapper = loading.load(images.channels_first(loaded))
            loaded = replace(wrapper, path=loaded.path, source_policies=loaded.source_policies)
    return _convert_loaded(loaded, task, options, run, folder)


def convert_loaded(loaded, folder: Path, options: ExportOptions, task: str = "causal-lm"):
    """Trace, convert and slim a loaded model, and stop there: no check, no
    file written but the weights' data files in `folder`
    (`genai_folder`'s streamed export quantizes the graph next).

    Args:
        loaded: the `LoadedModel` (its inputs and outputs become the file's).
        folder: the staging folder the weights' data files go to.
        options: the export's options.
        task: the name of the task to trace.

    Returns:
        `(proto, report)`: the slimmed ModelProto, its weights in data files
        in `folder` (`graph.weights`), and what the report says of the
        graph (`graph`, `stage_seconds`).
    """
    run = Run(no_progress, Interrupts())
    exporter = tasks.lookup(task)
    converted = _convert_loaded(loaded, exporter, options, run, folder)
    slimmed = converted.slimmed
    graph = {
        "nodes_converted": slimmed.nodes_before,
        "nodes_slimmed": slimmed.nodes_after,
        "fused": {op: count for op, count in slimmed.fused.items() if count},
    }
    seconds = {name: round(value, 3) for name, value in run.seconds.items()}
    return slimmed.proto, {"graph": graph, "stage_seconds": seconds}


def _convert_loaded(loaded, task: Task, options: ExportOptions, run: Run, folder: Path):
    """Trace, convert and slim (`_convert` after its load)."""
    external = memory.uses_external_data(options.external_data, loaded.param_bytes)
    with run.stage("trace"):
        described = task.describe(loaded)
        traced = task.trace(loaded)
        loaded.inputs, loaded.outputs = described
        # The grid before converting: one the model cannot take fails at once.
        grid = task.grid(loaded, options.shapes)
    with run.stage("convert"):
        converted = converting.convert(
            traced, opset=options.opset, data_path=folder / _CONVERTED_DATA
        )
    with run.stage("slim"):
        slimmed = slimming.slim(
            converted.proto,
            loaded.inputs,
            loaded.outputs,
            model_name=loaded.name,
            data_folder=folder,
            stored_dtype=weights_dtype.stored_dtype(options.weights_dtype, loaded.source_policies),
        )
    return _Converted(loaded, converted.weights_read, slimmed, external, grid)


def validate_stage(
    task: Task, loaded, source, grid, options: ExportOptions, run: Run, lean: bool, file_names=None
):
    """The validate stage: the task's checks of the float file `source`.

    With `lean` (weights in a data file), Keras' side comes first and the
    model is released before ONNX Runtime maps its own weights: the two
    copies are never held at once. `checking.validate` runs this stage alone.

    Args:
        task: the export's task.
        loaded: the loaded model, described by the task.
        source: the ONNX file (a path, or a model as bytes).
        grid: the task's grid.
        options: the export's options (tolerances, non-finite outputs).
        run: the export's stage timer and progress.
        lean: whether the weights take the data-file path.
        file_names: the file's names of the model's inputs and outputs, where
            they differ (`Checks.file_names`).

    Returns:
        (the validation, the `Checks` it was made with, for the int8 file's).
    """
    with run.stage("validate"):
        references = task.references(loaded, grid, lean)
        if lean:
            loaded.release_model()
        atol, rtol = options.atol, options.rtol
        if weights_dtype.rounds(options.weights_dtype, loaded.source_policies):
            atol = max(atol, validating.HALF_WEIGHTS_ATOL)
            rtol = max(rtol, validating.HALF_WEIGHTS_RTOL)
        checks = Checks(
            grid=grid,
            references=references,
            atol=atol,
            rtol=rtol,
            allow_nonfinite=options.allow_nonfinite,
            lean_memory=lean,
            on_step=run.steps("validate"),
            min_top1=options.int8_min_top1,
            file_names=dict(file_names or {}),
        )
        validation = task.validate(loaded, source, checks)
    return validation, checks


def _report(run: Run, converted: _Converted, staged, final, validation, int8, options):
    """The report (`reporting.build_report`, then where the files go), timed
    as stage `report`, and the (staged, final) moves of the files."""
    with run.stage("report"):
        moves = staged.moves(final, int8 is not None and int8["kept"])
        report = reporting.build_report(
            loaded=converted.loaded,
            onnx_path=final.onnx,
            opset=options.opset,
            file_bytes=staged.file_bytes,
            weights_read=converted.weights_read,
            slimmed=converted.slimmed,
            validation=validation,
            stages=run.seconds,
            external_data=staged.data is not None,
            extra=options.extra_report,
        )
        report["data_files"] = [str(to) for _, to in moves if to.name.endswith(".data")]
        report["weights_dtype"] = weights_dtype.stored_dtype(
            options.weights_dtype, converted.loaded.source_policies
        )
        if converted.external and staged.data is None:
            report["warnings"].append(
                f"{argument('external_data', options.external_data)}: every weight is under "
                f"{weights.EXTERNAL_MIN_BYTES} bytes, so all are stored in the graph "
                "and no data file was written"
            )
        report["report_path"] = str(final.report)
        if int8 is not None:
            report["int8"] = {"onnx_path": str(final.int8) if int8["kept"] else None, **int8}
            if not int8["kept"] and int8["passed"]:
                report["warnings"].append(_slower_int8(int8, final.int8))
    report["stage_seconds"]["report"] = round(run.seconds["report"], 3)
    return report, moves


@dataclass(frozen=True)
class _Staged:
    """The files of one export in its staging folder."""

    graph: Path
    data: Path | None
    int8: Path
    report: Path
    digest: str | None = None  # the data file's content hash

    @classmethod
    def write(cls, proto, folder: Path, output: Path) -> "_Staged":
        """Write the graph and its data file from the proto and the weights
        `convert` wrote to `folder`, then drop those."""
        # Fixed names inside the private folder: an output called `report.json`
        # or `int8.onnx` cannot collide with another staged file.
        graph, data = folder / _STAGED_GRAPH, folder / _STAGED_DATA
        with _writing(output):
            digest = weights.save(proto, folder, graph, data)
        (folder / _CONVERTED_DATA).unlink(missing_ok=True)
        data = data if digest is not None else None
        return cls(graph, data, folder / "model.int8.onnx", folder / "report.json", digest)

    def in_one_file(self, output: Path) -> "_Staged":
        """The same graph and weights in one file, read from the staged ones
        (which are dropped) one tensor at a time.

        The checks ran on the graph and its data file: ONNX Runtime maps that
        file rather than parse and copy every weight, so the export never
        holds the weights twice. The one file holds the same graph and the
        same bytes of every tensor (`graph.weights.save`)."""
        if self.data is None:
            return self
        import onnx

        whole = self.graph.with_name(_WHOLE_GRAPH)
        with _writing(output):
            proto = onnx.load(str(self.graph), load_external_data=False)
            weights.save(proto, self.graph.parent, whole)
        self.graph.unlink()
        self.data.unlink()
        return replace(self, graph=whole, data=None, digest=None)

    @property
    def file_bytes(self) -> int:
        return self.graph.stat().st_size + (self.data.stat().st_size if self.data else 0)

    def moves(self, final: placement.Targets, int8: bool) -> list[tuple[Path, Path]]:
        """(staged, final) pairs of the files to place; the graph is pointed at
        its data file's final name, which is named by its content."""
        moves = [(self.graph, final.onnx)]
        if self.data is not None:
            data = final.onnx.with_name(placement.data_name(final.onnx.name, self.digest))
            with _writing(final.onnx):
                _point_at_data(self.graph, data.name)
            moves.append((self.data, data))
        if int8:
            moves.append((self.int8, final.int8))
        return moves
