"""ONNX export for Keras 3 models: `keras_layers.export`, after `keras.export`.

`export_model` runs the stages (load, trace, convert, slim, validate, report)
and places the files; each stage is a module of its own. Needs the `export`
extra: `pip install "keras-layers[export]"`.
"""

from importlib.util import find_spec

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
from keras_layers.export.pipeline import export_model  # noqa: E402

__all__ = [
    "ConversionError",
    "ExportError",
    "ModelLoadError",
    "OutputError",
    "UsageError",
    "ValidationFailed",
    "export_model",
]
