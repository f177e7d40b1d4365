"""ONNX export pipeline for Keras 3 models: load, trace, convert, slim,
validate, report. `export_model` runs them all; each stage is importable."""

from export.errors import (
    ConversionError,
    ExportError,
    ModelLoadError,
    OutputError,
    UsageError,
    ValidationFailed,
)
from export.pipeline import export_model

__all__ = [
    "ConversionError",
    "ExportError",
    "ModelLoadError",
    "OutputError",
    "UsageError",
    "ValidationFailed",
    "export_model",
]
