"""The three layers inside a keras-hub (keras-nlp) TransformerEncoder stack."""

import math

import keras
import numpy as np
import pytest
from arrays import as_numpy

from keras_layers.demo import EncoderConfig, build_encoder

keras_hub = pytest.importorskip("keras_hub")

VOCAB, WIDTH, LAYERS = 200, 32, 4


def ours():
    return build_encoder(EncoderConfig(VOCAB, WIDTH, layers=LAYERS))


def hand_written():
    """What people write today: the multiply and the position add as ops."""
    ids = keras.Input((None,), dtype="int32")
    embedding = keras.layers.ReversibleEmbedding(VOCAB, WIDTH, mask_zero=True)
    x = embedding(ids) * math.sqrt(WIDTH)
    x = x + keras_hub.layers.SinePositionEncoding()(x)
    for _ in range(LAYERS):
        x = keras_hub.layers.TransformerEncoder(intermediate_dim=64, num_heads=4)(x)
    return keras.Model(ids, embedding(x, reverse=True))


def padded_gap(model):
    """Largest change of a valid position's logits between padded and alone."""
    rng = np.random.default_rng(0)
    lengths = [9, 4, 1, 7]
    batch = np.zeros((len(lengths), max(lengths)), "int32")
    for row, length in enumerate(lengths):
        batch[row, :length] = rng.integers(1, VOCAB, size=length)
    padded = as_numpy(model(batch))
    gap = 0.0
    for row, length in enumerate(lengths):
        alone = as_numpy(model(batch[row : row + 1, :length]))[0]
        gap = max(gap, np.abs(padded[row, :length] - alone).max())
    return gap


def test_right_padded_batch_gives_each_rows_own_logits():
    keras.utils.set_random_seed(1)
    assert padded_gap(ours()) <= 1e-5


def test_the_hand_written_version_does_not():
    keras.utils.set_random_seed(1)
    assert padded_gap(hand_written()) > 1e-2
