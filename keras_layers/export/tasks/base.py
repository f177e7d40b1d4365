"""`Task`: what one kind of export supplies to the pipeline.

`export_model` runs the same stages for every task (load, trace, convert,
slim, validate, quantize, report) and never asks which task it runs; a task
says what differs: which options it refuses, the file's inputs and outputs,
how the model is traced into them, the validation grid, Keras' side of the
checks and the checks themselves. A new task is one module of this package
and one entry in `keras_layers.export.tasks.TASKS`.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from keras_layers.export import validating
from keras_layers.export.loading import LoadedModel
from keras_layers.export.options import ExportOptions
from keras_layers.export.tracing import TracedModel
from keras_layers.export.validating import Validation


@dataclass(frozen=True)
class Checks:
    """How one file is checked against Keras (`Task.validate`).

    Attributes:
        grid: the task's grid (`Task.grid`); `None` for a task without one.
        references: Keras' side, from `Task.references`, or `None` to compute
            it while checking.
        atol: absolute tolerance.
        rtol: relative tolerance, times |Keras output|.
        allow_nonfinite: accept NaN or infinity in Keras' own outputs.
        quantized: an int8 file, judged by its pooled predictions instead.
        lean_memory: ONNX Runtime runs without pre-packing and its memory
            arena (`validating.validate`).
        on_step: called as `on_step(done, total)` after each step.
        min_top1: the int8 gate: pooled top-1 agreement with Keras.
        file_names: the file's names of the model's inputs and outputs,
            where they differ (a file another tool made).
    """

    grid: list | None = None
    references: object = None
    atol: float = validating.DEFAULT_ATOL
    rtol: float = validating.DEFAULT_RTOL
    allow_nonfinite: bool = False
    quantized: bool = False
    lean_memory: bool = False
    on_step: Callable[[int, int], None] | None = None
    min_top1: float = validating.INT8_MIN_TOP1
    file_names: dict = field(default_factory=dict)


class Task(Protocol):
    """One kind of export. `export_model` makes one per export (a task keeps
    what it learns of the model between the stages) and calls, in order:
    `check`, `describe` and `trace` (stage `trace`), `grid`, `references` and
    `validate` (stage `validate`; `validate` again for the int8 file)."""

    name: str

    def check(self, options: ExportOptions) -> None:
        """Refuse, before any work, an option this task cannot honour.

        Args:
            options: the export's options, already checked on their own.

        Raises:
            UsageError: an option does not fit the task.
        """

    def describe(self, loaded: LoadedModel) -> tuple[list, list]:
        """The exported file's inputs and outputs (`loading.TensorInfo`s).

        Args:
            loaded: the loaded model, whose inputs and outputs are its call's.

        Returns:
            `(inputs, outputs)`; the pipeline puts them on `loaded` after
            `trace`, for the stages that follow.

        Raises:
            UsageError: the model cannot be exported as this task.
        """

    def trace(self, loaded: LoadedModel) -> TracedModel:
        """The model traced into a `tf.function` from the file's inputs to its
        outputs (`describe` ran first)."""

    def grid(self, loaded: LoadedModel, shapes: list | None) -> list | None:
        """The validation grid.

        Args:
            loaded: the loaded model, with the file's inputs and outputs.
            shapes: the caller's grid (`ExportOptions.shapes`), or `None`.

        Returns:
            `shapes` checked against the model, or the task's default grid;
            `None` for a task that checks by other means.

        Raises:
            UsageError: a grid point does not fit the model.
        """

    def references(self, loaded: LoadedModel, grid: list | None, ahead: bool) -> object:
        """Keras' side of the checks.

        Args:
            loaded: the loaded model.
            grid: from `grid`.
            ahead: the model is released after this call, before ONNX Runtime
                maps the file: everything Keras computes must be computed now.

        Returns:
            What `validate` takes as `Checks.references` (`None`: computed
            there, one step at a time).
        """

    def validate(self, loaded: LoadedModel, onnx_path: Path, checks: Checks) -> Validation:
        """Run the file in ONNX Runtime and compare it with Keras.

        Args:
            loaded: the loaded model (released when `references` ran ahead).
            onnx_path: the file to check.
            checks: the grid, Keras' side and the tolerances.

        Returns:
            The checks; `passed` when all pass.
        """


class Stepwise:
    """A task checked by steps (a prompt and decode steps), not on a grid of
    shapes: the decoders with a cache (`CausalLm`, `Seq2SeqDecoder`)."""

    def grid(self, loaded: LoadedModel, shapes: list | None) -> None:
        """No grid: the checks are a prompt and decode steps.

        Args:
            loaded: the loaded model.
            shapes: `None` (the task's `check` refused a grid).
        """
        del loaded, shapes
