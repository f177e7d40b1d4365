"""Typed errors of the export pipeline.

`UsageError` and its subclasses mean bad input: the command line turns them into
one line and exit code 2. `ValidationFailed` means the ONNX file was produced but
does not compute what Keras computes: exit code 1.
"""

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def one_line(text: str, limit: int = 600) -> str:
    """Collapse a message to one line without colour codes, at most `limit` chars."""
    flat = " ".join(_ANSI.sub("", text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class ExportError(Exception):
    """Base class: every error the pipeline raises on purpose."""

    exit_code = 2


class UsageError(ExportError):
    """Bad input or arguments: a missing file, a malformed option, ..."""


class ModelLoadError(UsageError):
    """The `.keras` file cannot be loaded (corrupt, unknown class, unsafe)."""


class ConversionError(ExportError):
    """tf2onnx could not convert the traced model."""


class OutputError(UsageError):
    """The output location cannot be written."""


class ValidationFailed(ExportError):
    """The ONNX model's outputs differ from Keras' beyond the tolerances."""

    exit_code = 1

    def __init__(self, message, report=None):
        super().__init__(message)
        self.report = report
