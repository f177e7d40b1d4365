"""What the export commands do to their process before anything else runs.

Only the commands call this (`keras_layers/export/__main__.py`, `cli.run` for
the `keras-layers-export` console script, and the checkout's
`export/to_onnx.py`); importing `keras_layers` or `keras_layers.export` changes
nothing in the process. It uses nothing beyond `os` and `sys`, which every
Python process has loaded before it runs any code, so it can run while the
working folder is still first on `sys.path`.
"""

import os
import sys


def drop_working_folder() -> None:
    """Take the working folder off `sys.path` where `python -m` put it.

    `python -m keras_layers.export` puts the working folder first on
    `sys.path`, so a user's `typing.py`, `numpy.py` or `keras.py` there would
    stand in for the real module the moment the command imports it. The
    console script and `export/to_onnx.py` start with their own folder there
    instead, which holds no such module.
    """
    if sys.path[:1] in ([""], [os.getcwd()]):
        del sys.path[0]


def prepare_process(argv: list) -> None:
    """Set up the command's process, before TensorFlow is imported.

    Args:
        argv: the command's arguments; `--verbose` among them keeps the native
            libraries' start-up lines on the terminal.

    TensorFlow runs without its oneDNN kernels (`TF_ENABLE_ONEDNN_OPTS=0`,
    unless the environment already says otherwise): their allocator never
    returns memory, so the Keras model released before ONNX Runtime validates
    a big model would still hold its weights (`benchmarks/big_model.py`
    measures the peak). Unless `--verbose`, descriptor 2 goes to /dev/null so
    the lines TensorFlow's C++ runtime writes there on import stay off the
    terminal (no environment variable silences all of them), and
    `sys.stderr` keeps the real descriptor 2 for our own messages.
    """
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    if "--verbose" in argv:
        return
    real_stderr = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.stderr = os.fdopen(real_stderr, "w", buffering=1)
