"""Drop-in Keras 3 layers for Transformer embeddings.

`ScaledEmbedding` (token embedding times a constant, with a matched
initialisation), `SinusoidalPositionEncoding` (the fixed sin/cos encoding, exact
in float32) and `TiedOutputDense` (logits that share an embedding's matrix and
stay tied through saving and loading).

Importing the package changes nothing in the process and imports nothing: the
layers (and with them Keras, and Keras' backend) are imported on first use of
a name (PEP 562), or at once when Keras is already imported. So
`keras_layers.export.generate`, which runs on ONNX Runtime and NumPy alone,
never pays for TensorFlow, and `python -m keras_layers.export` can take the
working folder off `sys.path` before any module is looked up there. Keras finds
the layers of a `.keras` file in its registry, which they join when imported:
import Keras first (as sorted imports do), or name a layer, before loading a
file that holds them. See docs/design.md.
"""

import sys as _sys

# `typing.TYPE_CHECKING` without importing `typing`: this file may run while
# `python -m` still has the working folder on sys.path (see the docstring).
TYPE_CHECKING = False

_LAYERS = {
    "ScaledEmbedding": "keras_layers.scaled_embedding",
    "SinusoidalPositionEncoding": "keras_layers.sinusoidal_position_encoding",
    "TiedOutputDense": "keras_layers.tied_output_dense",
    "clone_model_keeping_ties": "keras_layers.tied_output_dense",
}

__all__ = [
    "ScaledEmbedding",
    "SinusoidalPositionEncoding",
    "TiedOutputDense",
    "clone_model_keeping_ties",
]
__version__ = "0.1.0"

if TYPE_CHECKING:  # what type checkers and the API docs read
    from keras_layers.scaled_embedding import ScaledEmbedding
    from keras_layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
    from keras_layers.tied_output_dense import TiedOutputDense, clone_model_keeping_ties


def __getattr__(name: str):
    if name not in _LAYERS:
        raise AttributeError(f"module 'keras_layers' has no attribute {name!r}")
    # All of them at once, so that naming one registers every layer.
    for each, module in _LAYERS.items():
        globals()[each] = getattr(__import__(module, fromlist=[each]), each)
    return globals()[name]


def __dir__() -> list:
    return sorted([*globals(), *_LAYERS])


if "keras" in _sys.modules:  # registering the layers costs nothing more now
    __getattr__("ScaledEmbedding")
