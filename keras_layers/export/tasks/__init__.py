"""The export tasks, by name: what `export_model(..., task=NAME)` exports.

Each task is one module of this package (`base.Task` says what it supplies)
and one entry of `TASKS`; the pipeline looks the name up and asks nothing
else of it.
"""

from collections.abc import Callable

from keras_layers.export.errors import UsageError, argument
from keras_layers.export.tasks.base import Checks, Task
from keras_layers.export.tasks.causal_lm import CausalLm
from keras_layers.export.tasks.forward import Forward
from keras_layers.export.tasks.seq2seq_decoder import Seq2SeqDecoder

# Name -> a maker of a fresh task (one per export: a task keeps what it
# learns of the model between the stages). The first is the default.
TASKS: dict[str, Callable[[], Task]] = {"forward": Forward, "causal-lm": CausalLm}
# Tasks of one file of a multi-file export, run by that export (never a
# choice on the command line): an encoder-decoder's decoder (`seq2seq`).
FILE_TASKS: dict[str, Callable[[], Task]] = {"seq2seq-decoder": Seq2SeqDecoder}
# Tasks of a folder export that runs the pipeline once per file:
# `seq2seq-lm`, an encoder-decoder (`keras_layers.export.seq2seq_folder`).
FOLDER_TASKS = ("seq2seq-lm",)

__all__ = [
    "FILE_TASKS",
    "FOLDER_TASKS",
    "TASKS",
    "CausalLm",
    "Checks",
    "Forward",
    "Seq2SeqDecoder",
    "Task",
    "lookup",
    "task_names",
]


def task_names() -> tuple:
    """Every task `export_model` and the command line take: `TASKS`' names,
    then `FOLDER_TASKS`."""
    return (*TASKS, *FOLDER_TASKS)


def lookup(name: str) -> Task:
    """A fresh task of that name.

    Args:
        name: a key of `TASKS`.

    Returns:
        The task.

    Raises:
        UsageError: no task has that name.
    """
    if isinstance(name, str) and name in FILE_TASKS:
        return FILE_TASKS[name]()
    if not isinstance(name, str) or name not in TASKS:
        raise UsageError(f"{argument('task', name)}: choose one of {task_names()}")
    return TASKS[name]()
