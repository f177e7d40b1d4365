"""Check an ONNX file that something else made against its Keras model.

`validate` runs the validate stage alone: the model is loaded as
`export_model` loads it, the task builds the same grid and Keras references,
and ONNX Runtime runs the given file (Keras' own `model.export(path,
format="onnx")`, plain tf2onnx, an earlier export). Nothing is converted and
no file is written, moved or touched, except the report when
`ExportOptions.report_path` names one (written by `placement`, in one step).
"""

import os
from pathlib import Path

import onnxruntime as ort

from keras_layers.export import loading, memory, placement, reporting, tasks, validating
from keras_layers.export.errors import UsageError, ValidationFailed, argument, one_line
from keras_layers.export.options import ExportOptions
from keras_layers.export.pipeline import (
    Interrupts,
    Progress,
    Run,
    checked_options,
    no_progress,
    validate_stage,
)
from keras_layers.export.tasks import Task

# The key/value cache inputs a `--task causal-lm` file takes (optimum's names).
CACHE_INPUT = "past_key_values."
# ONNX Runtime's names of the element types NumPy names otherwise.
ONNX_TYPE_NAMES = {"float32": "float", "float64": "double"}


def _readable_file(onnx_path) -> Path:
    """`onnx_path` as a `Path` to a regular file that can be read."""
    if not isinstance(onnx_path, str | os.PathLike):
        raise UsageError(
            f"{argument('onnx_path', onnx_path)}: expected the path of an ONNX file (str or Path)"
        )
    path = Path(onnx_path)
    if not path.is_file():  # a FIFO or device is never opened
        raise UsageError(
            f"{argument('onnx_path', path)}: no such file; give the path of an existing .onnx file"
        )
    try:
        with open(path, "rb"):
            pass
    except OSError as error:
        raise UsageError(
            f"{argument('onnx_path', path)}: cannot be read ({error.strerror}); "
            "check its permissions"
        ) from error
    return path


def _file_io(path: Path) -> tuple[list, list]:
    """The file's inputs (name, rank) and output names, as ONNX Runtime reads
    them (without pre-packing: the session is dropped at once)."""
    try:
        session = ort.InferenceSession(
            str(path), validating.session_options(True), providers=["CPUExecutionProvider"]
        )
    except Exception as error:  # noqa: BLE001 - ORT's reason is the message
        raise UsageError(
            f"{argument('onnx_path', path)}: ONNX Runtime cannot load the file "
            f"({one_line(str(error), 300)}); give a complete ONNX model, with any data "
            "files it reads beside it"
        ) from error
    inputs = [(value.name, value.type, list(value.shape or ())) for value in session.get_inputs()]
    return inputs, [value.name for value in session.get_outputs()]


def _mapping(kind: str, file_names: list, infos: list, path: Path) -> dict:
    """Model name -> file name for the `kind` ("inputs" or "outputs"): empty
    when the file has the model's names; one pair, positionally, when each
    has one; otherwise a `UsageError` naming both sides and the fix."""
    model_names = [info.name for info in infos]
    same = set(file_names) == set(model_names)
    if same or (kind == "outputs" and set(model_names) <= set(file_names)):
        return {}
    if len(file_names) == len(model_names) == 1:
        return {model_names[0]: file_names[0]}
    hint = ""
    if any(name.startswith(CACHE_INPUT) for name in set(file_names) - set(model_names)):
        # The model was described without its cache: the forward task's inputs.
        hint = f"; it looks like a causal-LM file: add {argument('task', 'causal-lm')}"
    raise UsageError(
        f"{argument('onnx_path', path)}: the file's {kind} are {file_names} and the model's "
        f"are {model_names}{hint}; check the file against the model it was made from, or "
        f"make it again with the model's {kind[:-1]} names"
    )


def _check_inputs(file_inputs: list, loaded, mapping: dict, path: Path) -> None:
    """Refuse a file whose inputs are not the model's: another rank, element
    type or fixed size (another model's file with the same input names)."""
    found = {name: (kind, shape) for name, kind, shape in file_inputs}
    for info in loaded.inputs:
        name = mapping.get(info.name, info.name)
        kind, shape = found[name]
        wanted = f"tensor({ONNX_TYPE_NAMES.get(info.dtype, info.dtype)})"
        sizes = [
            (axis, size, info.shape[axis])
            for axis, size in enumerate(shape[: len(info.shape)])
            if isinstance(size, int)
            and isinstance(info.shape[axis], int)
            and size != info.shape[axis]
        ]
        if shape and len(shape) != len(info.shape):
            problem = f"has {len(shape)} axes and the model's {info.name!r} has {len(info.shape)}"
        elif kind != wanted:
            problem = f"takes {kind} and the model's {info.name!r} takes {wanted}"
        elif sizes:
            axis, size, own = sizes[0]
            problem = f"has {size} on axis {axis} where the model's {info.name!r} has {own}"
        else:
            continue
        raise UsageError(
            f"{argument('onnx_path', path)}: the file's input {name!r} {problem}; check the "
            "file against the model it was made from"
        )


def _refused_inputs(validation, path: Path) -> None:
    """An ONNX Runtime failure on the model's own inputs: the file takes
    other inputs (another model's ids, shapes or types), a `UsageError`."""
    if validation.error and validation.error.startswith("ONNX Runtime fails on"):
        raise UsageError(
            f"{argument('onnx_path', path)}: {validation.error}. The file does not take this "
            "model's inputs (another model's file?); check it against the model it was made "
            "from"
        )


def _load(model, task: Task, options: ExportOptions, run: Run):
    """The model, loaded and described by the task (its inputs and outputs
    the file's); the memory check first, at the lean ratio."""
    weight_bytes = memory.estimated_param_bytes(model)
    lean = memory.validates_lean(
        memory.uses_external_data(options.external_data, weight_bytes), weight_bytes
    )
    if options.memory_check:
        memory.check_fits(weight_bytes, asset_bytes=memory.archive_asset_bytes(model))
    with run.stage("load"):
        loaded = loading.load(
            model,
            imports=options.imports,
            unsafe=options.unsafe,
            input_roles=options.input_roles,
            shapes=options.shapes,
        )
        loaded.inputs, loaded.outputs = task.describe(loaded)
    return loaded, lean


def _report(loaded, path: Path, validation, mappings: tuple, run: Run, options) -> dict:
    """The report: an export's entries on the checks, and how the file's names map."""
    report = {
        "passed": validation.passed,
        "validated_only": True,
        "onnx_path": str(path),
        "source_model": str(loaded.path) if loaded.path else f"in memory: {loaded.name}",
        "inputs": reporting.tensor_entries(loaded.inputs, roles=True),
        "warnings": reporting.role_warnings(loaded) + validation.warnings,
        "outputs": reporting.tensor_entries(loaded.outputs),
        "input_mapping": mappings[0],
        "output_mapping": mappings[1],
        **reporting.check_entries(validation),
        "stage_seconds": {name: round(seconds, 3) for name, seconds in run.seconds.items()},
        "versions": reporting.versions(),
    }
    if options.report_path is not None:
        report["report_path"] = str(options.report_path)
    report.update(options.extra_report or {})
    return report


def _check_file(path: Path, file_io: tuple, loaded, task: Task, options: ExportOptions, run, lean):
    """Map the file's names (`file_io`, from `_file_io`) onto the model's,
    then run the task's checks; returns the checks and the two mappings
    (model name -> file name)."""
    file_inputs, file_outputs = file_io
    inputs = _mapping("inputs", [name for name, _, _ in file_inputs], loaded.inputs, path)
    outputs = _mapping("outputs", file_outputs, loaded.outputs, path)
    _check_inputs(file_inputs, loaded, inputs, path)
    grid = task.grid(loaded, options.shapes)
    # The file is run under its own names: fed and read through the pairing,
    # never rewritten (a copy of a big file's weights, and protobuf's 2 GB).
    names = {**inputs, **outputs}
    validation, _ = validate_stage(task, loaded, path, grid, options, run, lean, names)
    _refused_inputs(validation, path)
    return validation, (inputs, outputs)


def validate(
    model,
    onnx_path,
    options: ExportOptions | None = None,
    *,
    task: str = "forward",
    progress: Progress | None = None,
) -> dict:
    """Check an existing ONNX file against its Keras model, writing nothing.

    The model is loaded as `export_model` loads it and checked by the same
    task, grid and tolerances; the file is only read. When the file's input
    (or output) names are not the model's and each has one, they are paired
    positionally, and the report says so (`input_mapping`, `output_mapping`:
    model name -> file name).

    Args:
        model: a `keras.Model` in memory, or the path of a `.keras` file.
        onnx_path: the ONNX file to check (any tool's).
        options: an `ExportOptions`: `shapes`, `atol`, `rtol`, `imports`,
            `unsafe`, `input_roles`, `allow_nonfinite` and `memory_check`
            apply as in an export; `report_path`, when set, is the one file
            written. Default: every default.
        task: a name of `keras_layers.export.tasks.TASKS`, as for `export_model`.
        progress: called with a `StageEvent` as `load` and `validate` start
            and end, and for each validation step.

    Returns:
        The report: `passed`, `validated_only` (`True`), `onnx_path`,
        `checks`, `worst`, `tolerances`, `input_mapping`, ...

    Raises:
        UsageError: bad options, a missing or unreadable file, a file ONNX
            Runtime cannot load, or one whose inputs are not the model's.
        ValidationFailed: the file and Keras disagree beyond the tolerances
            (the report is `error.report`).
    """
    options, exporter = checked_options(options), tasks.lookup(task)
    exporter.check(options)
    path = _readable_file(onnx_path)
    if options.report_path is not None:
        source = [Path(model)] if isinstance(model, str | os.PathLike) else []
        placement.check_report_path(Path(options.report_path), [path, *source])
    file_io = _file_io(path)
    with Interrupts().watching() as interrupts:
        run = Run(progress or no_progress, interrupts)
        loaded, lean = _load(model, exporter, options, run)
        validation, mappings = _check_file(path, file_io, loaded, exporter, options, run, lean)
    report = _report(loaded, path, validation, mappings, run, options)
    if options.report_path is not None:
        placement.write_report(report, Path(options.report_path))
    if not validation.passed:
        raise ValidationFailed(
            f"validation failed: {validation.failure()}. {path} was only read; "
            + (f"Report: {options.report_path}" if options.report_path else "no file was written"),
            report,
        )
    return report
