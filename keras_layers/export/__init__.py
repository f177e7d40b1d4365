"""ONNX export for Keras 3 models: `keras_layers.export`, after `keras.export`.

`export_model` runs the stages (load, trace, convert, slim, validate, report)
and places the files; each stage is a module of its own. `validate` checks an
ONNX file another tool made against its model, writing nothing. `generate` runs a
decoder exported with `task="causal-lm"` on ONNX Runtime and NumPy alone:
`from keras_layers.export import generate` imports neither TensorFlow nor
Keras (every name is imported on first use). `export_tokenizer` writes a
keras-hub tokenizer as Hugging Face `tokenizer.json` files and `check_identity`
proves them token-identical (the `text` extra adds onnxruntime-extensions, one
of the readers checked). Needs the `export` extra:
`pip install "keras-layers[export]"`.
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

TYPE_CHECKING = False  # as in keras_layers/__init__.py: `typing` is not imported
if TYPE_CHECKING:  # what type checkers and the API docs read
    from keras_layers.export.api import export_model
    from keras_layers.export.checking import validate
    from keras_layers.export.errors import (
        ConversionError,
        DecoderFileError,
        ExportError,
        ModelLoadError,
        OutputError,
        UsageError,
        ValidationFailed,
    )
    from keras_layers.export.generation import CachedDecoder, generate
    from keras_layers.export.inputs import InputRole
    from keras_layers.export.options import ExportOptions
    from keras_layers.export.seq2seq_generation import Seq2SeqFolder
    from keras_layers.export.text_model import export_text_model
    from keras_layers.export.tokenizer_files import (
        IdentityReport,
        TokenizerFiles,
        check_identity,
        export_tokenizer,
    )

# Every name is imported on first use (PEP 562): importing this package runs
# nothing of the working folder under `python -m keras_layers.export` (see
# `startup.drop_working_folder`), and `generate` never imports TensorFlow.
_MODULES = {
    "CachedDecoder": "keras_layers.export.generation",
    "generate": "keras_layers.export.generation",
    "export_model": "keras_layers.export.api",
    "export_text_model": "keras_layers.export.text_model",
    "validate": "keras_layers.export.checking",
    "ExportOptions": "keras_layers.export.options",
    "InputRole": "keras_layers.export.inputs",
    "Seq2SeqFolder": "keras_layers.export.seq2seq_generation",
    **dict.fromkeys(
        ("IdentityReport", "TokenizerFiles", "check_identity", "export_tokenizer"),
        "keras_layers.export.tokenizer_files",
    ),
    **dict.fromkeys(
        (
            "ConversionError",
            "DecoderFileError",
            "ExportError",
            "ModelLoadError",
            "OutputError",
            "UsageError",
            "ValidationFailed",
        ),
        "keras_layers.export.errors",
    ),
}

__all__ = [
    "CachedDecoder",
    "ConversionError",
    "DecoderFileError",
    "ExportError",
    "ExportOptions",
    "IdentityReport",
    "InputRole",
    "ModelLoadError",
    "OutputError",
    "Seq2SeqFolder",
    "UsageError",
    "TokenizerFiles",
    "ValidationFailed",
    "check_identity",
    "export_model",
    "export_text_model",
    "export_tokenizer",
    "generate",
    "validate",
]


def __getattr__(name: str):
    if name not in _MODULES:
        raise AttributeError(f"module 'keras_layers.export' has no attribute {name!r}")
    value = getattr(__import__(_MODULES[name], fromlist=[name]), name)
    globals()[name] = value
    return value
