"""Typed errors of the export pipeline, worded for whoever called it.

`UsageError` and its subclasses mean bad input: the command line turns them into
one line and exit code 2. `ValidationFailed` means the ONNX file was produced but
does not compute what Keras computes: exit code 1.

Messages name the argument at fault the way the caller wrote it: `opset=99`
for a Python caller, `--opset 99` on the command line. A stage words an
argument with `argument("opset", 99)` (and a suggested fix with `fix("unsafe")`);
the command line switches the wording with `command_line_wording(...)`.
"""

import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

_ANSI = re.compile(r"\x1b\[[0-9;]*m")

# How a Python caller turns on what a message suggests (`export_model`'s options).
_API_FIXES = {
    "unsafe": "ExportOptions(unsafe=True)",
    "imports": "ExportOptions(imports=['MODULE'])",
    "allow_nonfinite": "ExportOptions(allow_nonfinite=True)",
    "shapes": "ExportOptions(shapes=[(batch, sequence), ...])",
    "memory_check": "ExportOptions(memory_check=False)",
}
_wording: ContextVar[tuple[Mapping, Mapping] | None] = ContextVar("wording", default=None)


@contextmanager
def command_line_wording(flags: Mapping[str, str], fixes: Mapping[str, str]) -> Iterator[None]:
    """Word errors raised inside the block with command-line flags.

    Args:
        flags: API argument name -> flag (`{"opset": "--opset"}`).
        fixes: API argument name -> what to type to apply a suggested fix
            (`{"unsafe": "--unsafe"}`).
    """
    token = _wording.set((flags, fixes))
    try:
        yield
    finally:
        _wording.reset(token)


def argument(name: str, value=None) -> str:
    """An argument as the caller spelled it.

    Args:
        name: the API's argument name (`"opset"`).
        value: its value, or `None` to name the argument alone.

    Returns:
        `name=value` for the API, `FLAG value` inside `command_line_wording`.
    """
    wording = _wording.get()
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if wording is not None:
        flag = wording[0].get(name, name)
        return flag if value is None else f"{flag} {value}"
    return name if value is None else f"{name}={value!r}"


def fix(name: str) -> str:
    """What the caller types to turn on `name` (`ExportOptions(unsafe=True)`
    or `--unsafe`)."""
    wording = _wording.get()
    fixes = wording[1] if wording is not None else _API_FIXES
    return fixes.get(name, name)


def one_line(text: str, limit: int = 600) -> str:
    """Collapse a message to one line without colour codes.

    Args:
        text: the message.
        limit: the most characters kept (the cut ends in `...`).

    Returns:
        The line.
    """
    flat = " ".join(_ANSI.sub("", text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class ExportError(Exception):
    """Base class: every error the pipeline raises on purpose."""

    exit_code = 2


class UsageError(ExportError):
    """Bad input or arguments: a missing file, a malformed option, ..."""


class ModelLoadError(UsageError):
    """The model cannot be loaded (corrupt, unknown class, unsafe)."""


class ConversionError(ExportError):
    """tf2onnx could not convert the traced model."""


class OutputError(UsageError):
    """The output location cannot be written."""


class DecoderFileError(UsageError, ValueError):
    """A file `generate` reads is damaged, or is not what `--task causal-lm`
    writes: the decoder's ONNX file, or a folder's `genai_config.json` or
    `tokenizer.json`. Whatever the library underneath raised (ONNX Runtime's
    `InvalidProtobuf`, a `RecursionError` of the `json` module, a Rust panic of
    the `tokenizers` library) is its `__cause__`. A `ValueError` too: `generate`
    raised one for a file that is no decoder before this class existed.

    Attributes:
        path: the file at fault; the message starts with it, then says the problem.
    """

    def __init__(self, path: os.PathLike | str, problem: str):
        super().__init__(f"{os.fspath(path)}: {problem}")
        self.path = path


class ValidationFailed(ExportError):
    """The ONNX model's outputs differ from Keras' beyond the tolerances.

    Attributes:
        report: the report dict of the failed export (also written to disk).
        reason: what failed, without where the files went (the message
            whole when it says no more).
    """

    exit_code = 1

    def __init__(self, message: str, report: dict | None = None, reason: str | None = None):
        super().__init__(message)
        self.report = report
        self.reason = reason or message
