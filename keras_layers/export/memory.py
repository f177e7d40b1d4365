"""Will the export fit in memory? Checked before the expensive work.

An export's peak RSS grows with the weights: the Keras model, the traced
function's inputs, the ONNX proto and ONNX Runtime each hold a copy at some
point. `benchmarks/big_model.py` measured 5.5x the parameter bytes at 2.47 GB
of weights and 7.2x at 1.98 GB (`benchmarks/results/big_model.json`, issue
figures); the estimate takes the worst ratio on top of what TensorFlow and the
libraries take by themselves, so it refuses only exports that would surely be
killed, never one that would fit.
"""

import os
import stat
import zipfile
from pathlib import Path

from keras_layers.export.errors import UsageError, fix
from keras_layers.export.loading import param_bytes

PEAK_PER_PARAM_BYTE = 7.2
BASELINE_BYTES = 1_200_000_000  # TensorFlow, Keras, onnxruntime loaded, no model


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


def check_fits(weight_bytes: int) -> None:
    """Refuse (exit 2) an export whose estimated peak exceeds the memory available."""
    available = available_bytes()
    need = BASELINE_BYTES + PEAK_PER_PARAM_BYTE * weight_bytes
    if available is not None and need > available:
        raise UsageError(
            f"exporting this model needs about {need / 1e9:.1f} GB of memory "
            f"({BASELINE_BYTES / 1e9:.1f} GB + {PEAK_PER_PARAM_BYTE}x its "
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
