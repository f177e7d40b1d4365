"""Stage 6, report: gather every stage's figures into one JSON-ready dict.

Building only: `placement` writes it, the command line's `display` renders it.
"""

from dataclasses import asdict
from importlib import metadata

from keras_layers.export import slimming
from keras_layers.export.validating import Validation, shared_axes

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


def tensor_entries(infos, roles: bool = False) -> list:
    """The report's `inputs` or `outputs`.

    Args:
        infos: the tensors (`loading.TensorInfo`).
        roles: add each one's role, its source and what in the model said so.

    Returns:
        One JSON-ready dict per tensor.
    """
    entries = []
    for info in infos:
        entry = {"name": info.name, "shape": info.axis_names(), "dtype": info.dtype}
        if roles:
            entry.update(
                role=info.role,
                role_source=info.role_source,
                role_reason=info.role_reason,
                vocabulary=info.vocabulary,
                masks_zero=info.masks_zero,
            )
        entries.append(entry)
    return entries


def role_warnings(loaded) -> list[str]:
    """What the checks could only guess: each input whose role was defaulted
    (`inputs.default_role_warning`), and what reading the model assumed
    (`LoadedModel.notes`: a role probe that failed, a feature width read
    from the weights)."""
    from keras_layers.export.inputs import default_role_warning

    defaulted = [default_role_warning(i) for i in loaded.inputs if i.role_source == "default"]
    return defaulted + list(loaded.notes)


def _unread_warnings(slimmed) -> list[str]:
    """A warning for each input of the model that no output reads: the file
    declares it so that the model's own feed runs, and reads nothing of it."""
    return [
        f"input {name!r}: no output of the model reads it; the file takes it and ignores it"
        for name in getattr(slimmed, "unread_inputs", [])
    ]


def _weight_accounting(loaded, weights_read: set, slimmed) -> dict:
    """Which of the model's weights the outputs read, and what else the file
    stores.

    A weight counts when the converted graph's outputs depend on it (read
    right after conversion, while initializers still carry Keras paths); the
    rest are weights the exported outputs never read (an untied
    `reverse_embeddings` of a backbone). Whatever the final graph stores beyond
    the weights it reads (a fixed position table, shape constants) is
    `constant_bytes`.
    """
    read, unused = 0, []
    for path, size in loaded.variable_sizes:
        if path in weights_read:
            read += size
        else:
            unused.append({"name": path, "bytes": size})
    stored = sum(slimmed.initializer_bytes.values())
    return {
        "read_param_bytes": read,
        "unused_weights": unused,
        "constant_bytes": max(0, stored - read),
    }


def _graph_entry(slimmed) -> dict:
    """The report's `graph`: node counts, fusions, and the weights shared or
    stored once."""
    return {
        "nodes_converted": slimmed.nodes_before,
        "nodes_final": slimmed.nodes_after,
        "fused": slimmed.fused,
        "stack_picks_folded": slimmed.stack_picks_folded,
        "shapes_shared": slimmed.shapes_shared,
        "half_weights": slimmed.half_weights,
        "declined": slimmed.declined,
        "shared_weights": [
            {"name": name, "shape": shape, "read_by": read_by}
            for name, shape, read_by in slimming.shared_weights(slimmed.proto)
        ],
        "weights_stored_once": [
            {"removed": removed, "kept": kept, "as": "transpose" if how == "T" else "copy"}
            for removed, kept, how in slimmed.deduplicated
        ],
    }


def check_entries(validation: Validation) -> dict:
    """The report's entries on the checks: `tolerances`, `checks`,
    `validation_error` and `worst` (`docs/export.md`, "The report").

    Args:
        validation: the checks.

    Returns:
        The four entries, JSON-ready.
    """
    worst = validation.worst()
    return {
        "tolerances": {"atol": validation.atol, "rtol": validation.rtol},
        "checks": [asdict(check) for check in validation.checks],
        # Why validation could not run at all (ONNX Runtime refused the file).
        "validation_error": validation.error,
        "worst": asdict(worst) if worst else None,
    }


def build_report(
    *,
    loaded,
    onnx_path,
    opset,
    file_bytes,
    weights_read: set,
    slimmed,
    validation: Validation,
    stages: dict,
    external_data: bool,
    extra: dict | None = None,
) -> dict:
    """Every stage's figures as one JSON-ready dict (written by `placement`).

    Args:
        loaded: the loaded model and its inputs and outputs.
        onnx_path: where the ONNX file ends up.
        opset: the ONNX opset converted to.
        file_bytes: the size of the graph plus its data file.
        weights_read: Keras paths of the weights the outputs read
            (`converting.read_weights`).
        slimmed: the slim stage's result (node counts, fusions, shared weights).
        validation: the checks.
        stages: seconds per stage so far.
        external_data: whether the weights are in a data file.
        extra: entries added as they are (the demo's metrics).

    Returns:
        The report; `docs/export.md` ("The report") describes each field.
    """
    weights = _weight_accounting(loaded, weights_read, slimmed)
    report = {
        "passed": validation.passed,
        "onnx_path": str(onnx_path),
        "source_model": str(loaded.path) if loaded.path else f"in memory: {loaded.name}",
        "opset": opset,
        "file_bytes": file_bytes,
        "param_bytes": weights["read_param_bytes"],
        "size_ratio": (
            round(file_bytes / weights["read_param_bytes"], 4)
            if weights["read_param_bytes"]
            else None
        ),
        "unused_weights": weights["unused_weights"],
        "constant_bytes": weights["constant_bytes"],
        "external_data": external_data,
        "exported_from_policies": loaded.source_policies,
        "inputs": tensor_entries(loaded.inputs, roles=True),
        "shared_axes": shared_axes(loaded.inputs),
        "warnings": role_warnings(loaded) + _unread_warnings(slimmed) + validation.warnings,
        "outputs": tensor_entries(loaded.outputs),
        **check_entries(validation),
        "graph": _graph_entry(slimmed),
        "stage_seconds": {name: round(seconds, 3) for name, seconds in stages.items()},
        "versions": versions(),
    }
    report.update(extra or {})
    return report
