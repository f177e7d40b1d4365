"""Drop-in Keras 3 layers for Transformer embeddings.

`ScaledEmbedding` (token embedding times a constant, with a matched
initialisation), `SinusoidalPositionEncoding` (the fixed sin/cos encoding, exact
in float32) and `TiedOutputDense` (logits that share an embedding's matrix and
stay tied through saving and loading).
"""

import os as _os
import sys as _sys

# `python -m keras_layers.export` puts the working directory first on sys.path
# before this package is imported; take it off before Keras and the export
# stack are, so a stray `keras.py` or `onnxruntime.py` there cannot stand in for
# them. Only for that command: as a library, sys.path is the caller's business.
_argv = _sys.orig_argv
_module = _argv[_argv.index("-m") + 1 : _argv.index("-m") + 2] if "-m" in _argv else []
if _module == ["keras_layers.export"] and _sys.path[:1] in ([""], [_os.getcwd()]):
    del _sys.path[0]

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
