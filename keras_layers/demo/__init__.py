"""The demo: one small tied encoder (`build_encoder`) and the counting task the
export command trains it on when given no model (`keras_layers.demo.task`), and
a small tied decoder (`TiedDecoder`) that exports with a key/value cache.

Needs keras-hub (the `export` extra). Neither the layers nor the export
pipeline's stages import this package; only the command line does.
"""

from keras_layers.demo.decoder import TiedDecoder
from keras_layers.demo.encoder import REFERENCE_ENCODER, EncoderConfig, build_encoder

__all__ = ["REFERENCE_ENCODER", "EncoderConfig", "TiedDecoder", "build_encoder"]
