"""Drop-in Keras 3 layers for Transformer embeddings.

`ScaledEmbedding` (token embedding times a constant, with a matched
initialisation), `SinusoidalPositionEncoding` (the fixed sin/cos encoding, exact
in float32) and `TiedOutputDense` (logits that share an embedding's matrix and
stay tied through saving and loading).
"""

import os as _os
import sys as _sys


def _export_command_startup() -> None:
    """Prepare the process when it is the export command, and only then.

    `python -m keras_layers.export` puts the working directory first on
    sys.path before this package is imported: it is taken off before Keras and
    the export stack are, so a stray `keras.py` or `onnxruntime.py` there cannot
    stand in for them. The commands (`-m`, `keras-layers-export` and the
    checkout's `export/to_onnx.py`) also keep the lines TensorFlow's C++ runtime
    writes to descriptor 2 on import off the terminal unless `--verbose` (no
    environment variable silences them in TensorFlow 2.21): descriptor 2 goes
    to /dev/null, and Python's `sys.stderr` keeps the real one. As a library,
    sys.path and the descriptors are the caller's business.

    The commands also run TensorFlow without its oneDNN kernels
    (`TF_ENABLE_ONEDNN_OPTS=0`, unless the environment says otherwise): their
    allocator never returns memory, so the Keras model released before
    ONNX Runtime validates a big model would still hold its weights (measured
    on 2.48 GB of weights: 3.41 GB resident after the release with oneDNN,
    1.62 GB without; see `keras_layers/export/pipeline.py`).
    """
    argv = _sys.orig_argv
    module = argv[argv.index("-m") + 1 : argv.index("-m") + 2] if "-m" in argv else []
    as_module = module == ["keras_layers.export"]
    script = _os.path.basename(_sys.argv[0]) in ("keras-layers-export", "to_onnx.py")
    if not (as_module or script):
        return
    _os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    if as_module and _sys.path[:1] in ([""], [_os.getcwd()]):
        del _sys.path[0]
    if "--verbose" not in argv:
        real_stderr = _os.dup(2)
        devnull = _os.open(_os.devnull, _os.O_WRONLY)
        _os.dup2(devnull, 2)
        _os.close(devnull)
        _sys.stderr = _os.fdopen(real_stderr, "w", buffering=1)


_export_command_startup()

from keras_layers.scaled_embedding import ScaledEmbedding  # noqa: E402
from keras_layers.sinusoidal_position_encoding import SinusoidalPositionEncoding  # noqa: E402
from keras_layers.tied_output_dense import (  # noqa: E402
    TiedOutputDense,
    clone_model_keeping_ties,
)

__all__ = [
    "ScaledEmbedding",
    "SinusoidalPositionEncoding",
    "TiedOutputDense",
    "clone_model_keeping_ties",
]
__version__ = "0.1.0"
