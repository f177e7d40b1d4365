"""The validation's Keras outputs with each intermediate freed after its last
use (`keras_layers.export.lean_reference`): the same outputs as Keras' own
call, bit for bit, while a layer's output no longer lives to the call's end."""

import weakref

import keras
import numpy as np
import pytest

from keras_layers.export.lean_reference import intermediates_freed
from tests.models import tiny_resnet_classifier


def _masked_recurrent():
    """Masks flow between layers (Embedding's mask into an LSTM); one output is
    the input itself and one layer is called twice."""
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    embedded = keras.layers.Embedding(30, 8, mask_zero=True)(tokens)
    shared = keras.layers.Dense(8, activation="tanh")
    states = keras.layers.LSTM(8, return_sequences=True)(shared(embedded))
    pooled = keras.layers.GlobalAveragePooling1D()(shared(states))
    return keras.Model(tokens, [pooled, tokens])


def _inputs(model, rng):
    if len(model.inputs[0].shape) == 4:  # images
        return rng.standard_normal((2, 16, 16, 3)).astype("float32")
    tokens = rng.integers(1, 30, (3, 6)).astype("int32")
    tokens[0, 4:] = 0  # padding the mask hides
    return tokens


# A keras-hub task model runs its backbone, a functional model inside another.
@pytest.mark.parametrize("build", [_masked_recurrent, tiny_resnet_classifier])
def test_outputs_equal_keras_own_call_bit_for_bit(build):
    keras.utils.set_random_seed(0)
    model = build()
    inputs = _inputs(model, np.random.default_rng(0))
    expected = keras.tree.flatten(model(inputs, training=False))
    with intermediates_freed():
        got = keras.tree.flatten(model(inputs, training=False))
    assert len(got) == len(expected)
    for value, reference in zip(got, expected, strict=True):
        np.testing.assert_array_equal(
            keras.ops.convert_to_numpy(value), keras.ops.convert_to_numpy(reference)
        )


class _Remember(keras.layers.Layer):
    """Identity that keeps a weak reference to its input and records, when it
    runs, which earlier layers' inputs are still alive."""

    seen: list = []

    def call(self, x):
        alive = [reference() is not None for reference in _Remember.seen]
        _Remember.seen.append(weakref.ref(x))
        self.alive_at_call = alive
        return x * 2.0


def _chain():
    inputs = keras.Input((4,))
    x = inputs
    layers = [_Remember() for _ in range(4)]
    for layer in layers:
        x = layer(x)
    return keras.Model(inputs, x), layers


@pytest.mark.parametrize("freed", [True, False], ids=["intermediates_freed", "keras_own_call"])
def test_a_layer_output_dies_once_its_last_reader_has_run(freed):
    model, layers = _chain()
    _Remember.seen = []
    if freed:
        with intermediates_freed():
            model(np.ones((1, 4), "float32"))
    else:
        model(np.ones((1, 4), "float32"))
    # The last layer runs while the outputs of the first two layers (the
    # inputs of the second and third) are read by no layer still to run.
    second_input_alive, third_input_alive = layers[-1].alive_at_call[1:3]
    if freed:
        assert not second_input_alive and not third_input_alive
    else:  # the check can fail: Keras' own call keeps them to its end
        assert second_input_alive and third_input_alive
