"""Drop-in Keras 3 layers for Transformer embeddings.

`ScaledEmbedding` (token embedding times a constant, with a matched
initialisation), `SinusoidalPositionEncoding` (the fixed sin/cos encoding, exact
in float32) and `TiedOutputDense` (logits that share an embedding's matrix and
stay tied through saving and loading).
"""

from keras_layers.scaled_embedding import ScaledEmbedding
from keras_layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_layers.tied_output_dense import TiedOutputDense, clone_model_keeping_ties

__all__ = [
    "ScaledEmbedding",
    "SinusoidalPositionEncoding",
    "TiedOutputDense",
    "clone_model_keeping_ties",
]
__version__ = "0.1.0"
