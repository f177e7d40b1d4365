"""Stage 6, report: gather every stage's figures into one JSON-ready dict and
render it on the terminal."""

import json
import os
import tempfile
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from export import slimming
from export.validating import Validation

_PACKAGES = (
    "keras",
    "tensorflow",
    "tf2onnx",
    "onnx",
    "onnxruntime",
    "onnxslim",
    "numpy",
)


def versions() -> dict:
    found = {}
    for name in (*_PACKAGES, "keras-layers"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def tensor_entries(infos) -> list:
    return [{"name": info.name, "shape": info.axis_names(), "dtype": info.dtype} for info in infos]


def build_report(
    *,
    loaded,
    onnx_path,
    opset,
    file_bytes,
    slimmed,
    validation: Validation,
    stages: dict,
    external_data: bool,
    extra: dict | None = None,
) -> dict:
    worst = validation.worst()
    report = {
        "passed": validation.passed,
        "onnx_path": str(onnx_path),
        "source_model": str(loaded.path),
        "opset": opset,
        "file_bytes": file_bytes,
        "param_bytes": loaded.param_bytes,
        "size_ratio": round(file_bytes / loaded.param_bytes, 4) if loaded.param_bytes else None,
        "external_data": external_data,
        "exported_from_policies": loaded.source_policies,
        "inputs": tensor_entries(loaded.inputs),
        "outputs": tensor_entries(loaded.outputs),
        "tolerances": {"atol": validation.atol, "rtol": validation.rtol},
        "checks": [asdict(check) for check in validation.checks],
        "worst": asdict(worst) if worst else None,
        "graph": {
            "nodes_converted": slimmed.nodes_before,
            "nodes_final": slimmed.nodes_after,
            "fused": slimmed.fused,
            "shared_weights": [
                {"name": name, "shape": shape, "read_by": read_by}
                for name, shape, read_by in slimming.shared_weights(slimmed.proto)
            ],
            "weights_stored_once": [
                {
                    "removed": removed,
                    "kept": kept,
                    "as": "transpose" if how == "T" else "copy",
                }
                for removed, kept, how in slimmed.deduplicated
            ],
        },
        "stage_seconds": {name: round(seconds, 3) for name, seconds in stages.items()},
        "versions": versions(),
    }
    report.update(extra or {})
    return report


def write_json_atomically(data: dict, path: Path) -> None:
    """Write next to `path` first, then rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temporary, 0o666 & ~umask)  # mkstemp makes it private; a report is not
    try:
        with os.fdopen(handle, "w") as file:
            json.dump(data, file, indent=2, default=float)
            file.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _number(value: float) -> str:
    return "inf" if value == float("inf") else f"{value:.2e}"


def render(report: dict, console) -> None:
    """A table of the checks and a summary, on a rich console."""
    from rich.table import Table

    table = Table(title="ONNX Runtime vs Keras", show_lines=False)
    for column in (
        "shape",
        "output",
        "max abs diff",
        "max rel diff",
        "top-1",
        "result",
    ):
        table.add_column(column, justify="left" if column in ("shape", "output") else "right")
    for check in report["checks"]:
        top1 = "" if check["top1_agreement"] is None else f"{check['top1_agreement']:.1%}"
        verdict = "[green]pass[/]" if check["passed"] else f"[red]FAIL[/] {check['problem'] or ''}"
        table.add_row(
            check["shape"],
            check["output"],
            _number(check["max_abs_diff"]),
            _number(check["max_rel_diff"]),
            top1,
            verdict,
        )
    console.print(table)
    tolerance = report["tolerances"]
    console.print(
        f"file {report['file_bytes'] / 1e6:.2f} MB = {report['size_ratio']}x the "
        f"parameter bytes ({report['param_bytes'] / 1e6:.2f} MB); opset {report['opset']}; "
        f"{report['graph']['nodes_final']} nodes (tf2onnx: {report['graph']['nodes_converted']}); "
        f"atol {tolerance['atol']:g}, rtol {tolerance['rtol']:g}"
    )
