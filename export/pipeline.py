"""The export pipeline: load -> trace -> convert -> slim -> validate -> report.

Each stage is a function in its own module that takes and returns plain data;
this module only runs them in order, times them, and places the files. The ONNX
file is written next to the output path under a temporary name, validated there,
and only then renamed into place, so a failed export never replaces a good file:
a file that fails validation is kept beside it as `NAME.failed.onnx`.
"""

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from export import converting, loading, quantizing, reporting, slimming, tracing, validating
from export.errors import OutputError, ValidationFailed

EXTERNAL_DATA_CHOICES = ("auto", "always", "never")


def failed_path(output: Path) -> Path:
    return output.with_name(f"{output.stem}.failed{output.suffix or '.onnx'}")


def default_report_path(output: Path) -> Path:
    return output.with_name(f"{output.stem}.report.json")


def _remove_stale_workdirs(output: Path) -> None:
    """Remove work folders of earlier exports to `output` that were killed.

    Only folders named like ours (`.NAME.xxxx.tmp`) and idle for an hour, so a
    concurrent export to the same path keeps its own.
    """
    for stale in output.parent.glob(f".{output.name}.*.tmp"):
        if stale.is_dir() and time.time() - stale.stat().st_mtime > 3600:
            shutil.rmtree(stale, ignore_errors=True)


def check_output_location(output: Path) -> None:
    """Fail before any work if the output cannot be written."""
    if output.exists() and output.is_dir():
        raise OutputError(f"-o {output}: is a directory; give a file name such as model.onnx")
    parent = output.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputError(f"-o {output}: cannot create {parent} ({error.strerror})") from error
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as error:
        raise OutputError(f"-o {output}: {parent} is not writable ({error.strerror})") from error


@contextmanager
def _stage(name: str, stages: dict, progress: Callable | None):
    if progress:
        progress(name, None)
    start = time.perf_counter()
    yield
    stages[name] = time.perf_counter() - start
    if progress:
        progress(name, stages[name])


def _save(proto, path: Path, external: bool) -> list:
    """Save the proto; returns every file written (the model, its data file)."""
    import onnx

    if not external:
        onnx.save_model(proto, path)
        return [path]
    data_name = f"{path.name}.data"
    onnx.save_model(
        proto,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data_name,
        size_threshold=1024,
    )
    return [path, path.with_name(data_name)]


def _move_into_place(files: list, directory: Path, final: Path) -> list:
    """Rename the written files to `final` (and `final.data`), same directory."""
    moved = []
    for file in files:
        suffix = file.name[len(files[0].name) :]  # "" or ".data"
        target = directory / f"{final.name}{suffix}"
        os.replace(file, target)
        moved.append(target)
    return moved


def int8_path(output: Path) -> Path:
    return output.with_name(f"{output.stem}.int8{output.suffix or '.onnx'}")


def _quantized(loaded, output, workdir, shapes, evaluate, param_bytes) -> dict:
    """Quantize the validated float file, judge it, and place it."""
    from dataclasses import asdict

    staged = workdir / int8_path(output).name
    quantizing.quantize_int8(output, staged)
    validation = validating.validate(loaded, staged, shapes, quantized=True)
    evaluation = evaluate(staged) if evaluate else None
    passed = validation.passed and (evaluation is None or evaluation["passed"])
    final = int8_path(output) if passed else failed_path(int8_path(output))
    os.replace(staged, final)
    worst = min(
        (c for c in validation.checks if c.top1_agreement is not None),
        key=lambda c: c.top1_agreement,
        default=None,
    )
    verdict = (
        f"lowest top-1 agreement {worst.top1_agreement:.2%} at {worst.shape}"
        if worst
        else "no top-1 output"
    )
    if evaluation is not None:
        verdict += f"; {evaluation.get('summary', '')}"
    return {
        "passed": passed,
        "onnx_path": str(final),
        "file_bytes": final.stat().st_size,
        "size_ratio": round(final.stat().st_size / param_bytes, 4),
        "min_top1": validating.INT8_MIN_TOP1,
        "checks": [asdict(check) for check in validation.checks],
        "evaluation": evaluation,
        "verdict": verdict,
    }


def export_model(
    model_path,
    output,
    *,
    report_path=None,
    shapes=None,
    atol: float = validating.DEFAULT_ATOL,
    rtol: float = validating.DEFAULT_RTOL,
    opset: int = converting.DEFAULT_OPSET,
    imports=(),
    unsafe: bool = False,
    external_data: str = "auto",
    quantize: str | None = None,
    evaluate: Callable | None = None,
    progress: Callable | None = None,
    extra_report: dict | None = None,
) -> dict:
    """Export `model_path` (.keras) to `output` (.onnx); returns the report.

    Raises `ValidationFailed` (with the report attached) when ONNX Runtime and
    Keras disagree beyond `atol` + `rtol`, and other `ExportError`s for bad input.

    `quantize="int8"` also writes `OUT.int8.onnx`, quantized dynamically and
    judged by top-1 agreement with Keras (see `validating.INT8_MIN_TOP1`);
    `evaluate(path) -> dict` may add a task-level check of it (`passed` key).
    """
    output = Path(output)
    report_path = Path(report_path) if report_path else default_report_path(output)
    converting.check_opset(opset)
    if quantize not in (None, "int8"):
        raise OutputError(f"--quantize {quantize}: only int8 is supported")
    if external_data not in EXTERNAL_DATA_CHOICES:
        raise OutputError(f"external_data must be one of {EXTERNAL_DATA_CHOICES}")
    check_output_location(output)
    check_output_location(report_path)
    stages = {}

    with _stage("load", stages, progress):
        loaded = loading.load(model_path, imports=imports, unsafe=unsafe)
    shapes = shapes or validating.default_shapes(loaded)
    external = external_data == "always" or (
        external_data == "auto" and loaded.param_bytes > converting.LARGE_MODEL_BYTES
    )
    with _stage("trace", stages, progress):
        traced = tracing.trace(loaded)
    with _stage("convert", stages, progress):
        converted = converting.convert(traced, opset=opset)
    with _stage("slim", stages, progress):
        slimmed = slimming.slim(
            converted.proto,
            loaded.inputs,
            loaded.outputs,
            run_onnxslim=not external,
            model_name=loaded.model.name,
        )

    _remove_stale_workdirs(output)
    workdir = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.", suffix=".tmp"))
    try:
        try:
            written = _save(slimmed.proto, workdir / output.name, external)
        except OSError as error:
            raise OutputError(
                f"-o {output}: cannot write the ONNX file ({error.strerror or error}); "
                "nothing at the output path was changed"
            ) from error
        file_bytes = sum(file.stat().st_size for file in written)
        with _stage("validate", stages, progress):
            validation = validating.validate(loaded, written[0], shapes, atol, rtol)
        with _stage("report", stages, progress):
            final = output if validation.passed else failed_path(output)
            placed = _move_into_place(written, output.parent, final)
            report = reporting.build_report(
                loaded=loaded,
                onnx_path=placed[0],
                opset=opset,
                file_bytes=file_bytes,
                slimmed=slimmed,
                validation=validation,
                stages=stages,
                external_data=external,
                extra=extra_report,
            )
            report["data_files"] = [str(path) for path in placed[1:]]
        if quantize and validation.passed:
            with _stage("quantize", stages, progress):
                report["int8"] = _quantized(
                    loaded, output, workdir, shapes, evaluate, report["param_bytes"]
                )
            report["passed"] = report["int8"]["passed"]
            report["stage_seconds"]["quantize"] = round(stages["quantize"], 3)
        report["stage_seconds"]["report"] = round(stages["report"], 3)
        report["report_path"] = str(report_path)
        reporting.write_json_atomically(report, report_path)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    if validation.passed and not report["passed"]:
        raise ValidationFailed(
            "int8 validation failed: " + report["int8"]["verdict"] + f". Report: {report_path}",
            report,
        )
    if not validation.passed:
        worst = validation.worst()
        what = worst.problem or (
            f"max abs diff {worst.max_abs_diff:.3g} > atol {atol:g} + rtol {rtol:g} x |keras|"
        )
        raise ValidationFailed(
            f"validation failed: output {worst.output!r} at shape {worst.shape}: {what}. "
            f"The ONNX file was kept as {placed[0]}; {output} was left untouched. "
            f"Report: {report_path}",
            report,
        )
    return report
