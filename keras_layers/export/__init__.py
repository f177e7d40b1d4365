"""ONNX export for Keras 3 models: `keras_layers.export`, after `keras.export`.

`export_model` runs the stages (load, trace, convert, slim, validate, report)
and places the files; each stage is a module of its own. `generate` runs a
decoder exported with `task="causal-lm"` on ONNX Runtime and NumPy alone:
`from keras_layers.export import generate` imports neither TensorFlow nor
Keras (the pipeline is imported on first use of `export_model`). Needs the
`export` extra: `pip install "keras-layers[export]"`.
"""

from importlib.util import find_spec
from typing import TYPE_CHECKING

# Checked by name, not imported: importing TensorFlow here would cost seconds
# for `--help`, and the first missing one names the extra to install.
_REQUIRED = ("tensorflow", "tf2onnx", "onnx", "onnxruntime", "onnxslim", "keras_hub", "rich")
_missing = [name for name in _REQUIRED if find_spec(name) is None]
if _missing:
    raise ImportError(
        f"keras_layers.export needs {', '.join(_missing)}, which the layers alone do not "
        'install. Install the export extra: pip install "keras-layers[export]"'
    )

from keras_layers.export.errors import (  # noqa: E402
    ConversionError,
    ExportError,
    ModelLoadError,
    OutputError,
    UsageError,
    ValidationFailed,
)
from keras_layers.export.generation import CachedDecoder, generate  # noqa: E402

if TYPE_CHECKING:  # what type checkers and the API docs read
    from keras_layers.export.pipeline import export_model

__all__ = [
    "CachedDecoder",
    "ConversionError",
    "ExportError",
    "ModelLoadError",
    "OutputError",
    "UsageError",
    "ValidationFailed",
    "export_model",
    "generate",
]


def __getattr__(name: str):
    if name != "export_model":
        raise AttributeError(f"module 'keras_layers.export' has no attribute {name!r}")
    from keras_layers.export.pipeline import export_model

    globals()[name] = export_model
    return export_model
