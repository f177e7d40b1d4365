"""Will the export fit in memory? Checked before the expensive work.

An export's peak RSS grows with the weights, at a rate that depends on the
path the weights take; `benchmarks/big_model.py` measures both
(`benchmarks/results/big_model.json`), and the ratios below are set above the
highest it measured:

- On the data-file path (`uses_external_data`) the weights go to a data file
  as they are converted, and the Keras model is released before ONNX Runtime
  maps that file (`PEAK_PER_PARAM_BYTE_EXTERNAL`).
- Otherwise the weights are held in the proto that onnxslim and the fusions
  rewrite (`PEAK_PER_PARAM_BYTE`).

The estimate takes those ratios on top of what TensorFlow and the libraries take
by themselves, so it refuses only exports that would surely be killed.
"""

import os
import stat
import zipfile
from pathlib import Path

from keras_layers.export.converting import LARGE_MODEL_BYTES
from keras_layers.export.errors import UsageError, fix
from keras_layers.export.loading import param_bytes

PEAK_PER_PARAM_BYTE = 11.0  # weights held in the proto
PEAK_PER_PARAM_BYTE_EXTERNAL = 2.5  # weights streamed to a data file
BASELINE_BYTES = 1_200_000_000  # TensorFlow, Keras, onnxruntime loaded, no model


def uses_external_data(external_data: str, weight_bytes: int) -> bool:
    """Whether the export takes the data-file path.

    Args:
        external_data: `"always"`, `"never"` or `"auto"`.
        weight_bytes: the model's weights, in bytes.

    Returns:
        True for `"always"`, or `"auto"` with weights past `LARGE_MODEL_BYTES`.
    """
    return external_data == "always" or (
        external_data == "auto" and weight_bytes > LARGE_MODEL_BYTES
    )


def available_bytes() -> int | None:
    """`MemAvailable` from /proc/meminfo (Linux); None where it cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def archive_weight_bytes(path: Path) -> int:
    """The weights' size in a `.keras` archive, read from the zip's directory."""
    with zipfile.ZipFile(path) as archive:
        return sum(item.file_size for item in archive.infolist() if item.filename.endswith(".h5"))


def check_fits(weight_bytes: int, external: bool) -> None:
    """Refuse an export whose estimated peak exceeds the memory available.

    Args:
        weight_bytes: the model's weights, in bytes.
        external: whether the export takes the data-file path.

    Raises:
        UsageError: the estimate exceeds what is available (exit 2); the
            message gives both figures and the flag that skips the check.
    """
    available = available_bytes()
    ratio = PEAK_PER_PARAM_BYTE_EXTERNAL if external else PEAK_PER_PARAM_BYTE
    need = BASELINE_BYTES + ratio * weight_bytes
    if available is not None and need > available:
        raise UsageError(
            f"exporting this model needs about {need / 1e9:.1f} GB of memory "
            f"({BASELINE_BYTES / 1e9:.1f} GB + {ratio}x its "
            f"{weight_bytes / 1e9:.2f} GB of weights) and {available / 1e9:.1f} GB are "
            f"available; free memory, or try anyway with {fix('memory_check')}"
        )


def estimated_param_bytes(model) -> int:
    """The weights' bytes of a model in memory or of a `.keras` path."""
    if isinstance(model, str | os.PathLike):
        try:
            if not stat.S_ISREG(os.stat(model).st_mode):
                return 0  # a FIFO or device is never opened here: loading refuses it
            return archive_weight_bytes(Path(model))
        except (OSError, zipfile.BadZipFile):
            return 0  # not readable as an archive: loading will say why
    if not hasattr(model, "weights"):
        return 0  # not a model: loading will say so
    return param_bytes(model)
