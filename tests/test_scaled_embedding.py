import math

import keras
import numpy as np
import pytest
from arrays import as_numpy

from keras_layers import ScaledEmbedding


def test_is_a_drop_in_embedding():
    layer = ScaledEmbedding(50, 8)
    assert isinstance(layer, keras.layers.Embedding)
    layer.build()
    assert [w.path for w in layer.weights] == [f"{layer.name}/embeddings"]
    assert layer.count_params() == 50 * 8


def test_correctness_on_a_hand_checked_case():
    layer = ScaledEmbedding(3, 2, scale=2.0)
    layer.build()
    layer.embeddings.assign(np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]))
    out = layer(np.array([[2, 0]]))
    np.testing.assert_array_equal(as_numpy(out), [[[8.0, 10.0], [0.0, 2.0]]])


@pytest.mark.parametrize(("scale", "factor"), [("sqrt", 8.0), (3.5, 3.5), (None, 1.0), (2, 2.0)])
def test_output_is_lookup_times_factor(scale, factor):
    layer = ScaledEmbedding(20, 64, scale=scale)
    ids = np.array([[1, 5, 19], [0, 2, 2]])
    out = as_numpy(layer(ids))
    expected = factor * np.take(as_numpy(layer.embeddings), ids, axis=0)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert layer.scale == scale
    assert layer.factor == factor


def test_default_initializer_gives_unit_variance_scaled_components():
    # 4,000 x 256 = 1,024,000 samples: the sample variance of N(0, 1) has a
    # standard error of sqrt(2 / n) = 0.0014, so 0.01 is a 7-sigma bound.
    layer = ScaledEmbedding(4000, 256)
    out = as_numpy(layer(np.arange(4000)[None]), np.float64)
    assert abs(out.mean()) < 0.01
    assert abs(out.var() - 1.0) < 0.01
    # Gaussian, not uniform: excess kurtosis 0 (uniform gives -1.2).
    kurtosis = np.mean((out - out.mean()) ** 4) / out.var() ** 2 - 3.0
    assert abs(kurtosis) < 0.05
    # Keras' own default, multiplied by the same factor, is far from unit scale.
    plain = keras.layers.Embedding(4000, 256)
    plain_out = 16.0 * as_numpy(plain(np.arange(4000)[None]))
    assert plain_out.var() < 0.25


def test_matched_initializer_follows_a_custom_scale():
    layer = ScaledEmbedding(2000, 128, scale=4.0)
    out = as_numpy(layer(np.arange(2000)[None]), np.float64)
    assert abs(out.var() - 1.0) < 0.02


def test_explicit_initializer_is_respected():
    layer = ScaledEmbedding(10, 4, embeddings_initializer="ones")
    np.testing.assert_array_equal(as_numpy(layer(np.array([3]))), np.full((1, 4), 2.0))


def test_no_scale_keeps_keras_default_initializer():
    layer = ScaledEmbedding(10, 4, scale=None)
    assert isinstance(layer.embeddings_initializer, keras.initializers.RandomUniform)


def test_mask_is_computed_and_reaches_the_next_layer():
    ids = keras.Input((None,), dtype="int32")
    scaled = ScaledEmbedding(10, 4, mask_zero=True)(ids)
    pooled = keras.layers.GlobalAveragePooling1D()(scaled)
    model = keras.Model(ids, pooled)
    layer = model.layers[1]
    layer.embeddings.assign(np.arange(40, dtype="float32").reshape(10, 4))
    # Mean over the two unmasked tokens only (padding id 0 excluded).
    out = as_numpy(model(np.array([[1, 2, 0, 0]])))
    expected = 2.0 * (np.arange(4, 8) + np.arange(8, 12)) / 2
    np.testing.assert_allclose(out[0], expected, rtol=1e-6)
    mask = layer.compute_mask(np.array([[1, 0]]))
    np.testing.assert_array_equal(mask, [[True, False]])


def test_hand_written_multiply_drops_the_mask_but_the_layer_keeps_it():
    ids = keras.Input((None,), dtype="int32")
    plain = keras.layers.Embedding(10, 4, mask_zero=True)(ids)
    by_hand = plain * 2.0
    ours = ScaledEmbedding(10, 4, mask_zero=True)(ids)
    assert getattr(by_hand, "_keras_mask", None) is None
    assert getattr(ours, "_keras_mask", None) is not None


def test_int8_quantization_keeps_the_scale():
    layer = ScaledEmbedding(64, 32)
    ids = np.array([[3, 9, 60]])
    before = as_numpy(layer(ids))
    layer.quantize("int8")
    after = as_numpy(layer(ids))
    # int8 per-row quantization: relative error well under 1%, same scale.
    assert np.abs(after - before).max() < 0.01 * np.abs(before).max()


def test_mixed_precision_output_dtype(policy):
    policy("mixed_float16")
    layer = ScaledEmbedding(10, 16)
    out = layer(np.array([[1, 2]]))
    assert keras.backend.standardize_dtype(out.dtype) == "float16"
    assert keras.backend.standardize_dtype(layer.embeddings.dtype) == "float32"


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"scale": None},
        {"scale": 2.5, "mask_zero": True},
        {"embeddings_initializer": "glorot_uniform", "name": "tok"},
    ],
)
def test_config_round_trip(kwargs):
    layer = ScaledEmbedding(30, 6, **kwargs)
    config = layer.get_config()
    clone = ScaledEmbedding.from_config(config)
    assert clone.get_config() == config
    assert clone.scale == layer.scale and clone.factor == layer.factor
    if "embeddings_initializer" in kwargs:
        assert config["embeddings_initializer"]["class_name"] == "GlorotUniform"
    else:  # "matched to the scale" survives the round trip as intent, not a copy
        assert config["embeddings_initializer"] is None


def test_serialized_by_registered_name():
    layer = ScaledEmbedding(30, 6, scale=3.0)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is ScaledEmbedding and restored.factor == 3.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scale": "log"}, "`scale` must be"),
        ({"scale": 0}, "`scale` must be"),
        ({"scale": -2.0}, "`scale` must be"),
        ({"scale": float("nan")}, "`scale` must be"),
        ({"scale": True}, "`scale` must be"),
        ({"input_dim": 0}, "`input_dim` must be a positive integer"),
        ({"output_dim": -4}, "`output_dim` must be a positive integer"),
        ({"output_dim": 2.5}, "`output_dim` must be a positive integer"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, message):
    args = {"input_dim": 10, "output_dim": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        ScaledEmbedding(**args)


def test_factor_for_sqrt_is_exact():
    assert ScaledEmbedding(5, 512).factor == math.sqrt(512)


def test_out_of_range_ids_per_backend():
    """TensorFlow and torch raise; JAX cannot raise inside a compiled gather and
    Keras fills the row with NaN, which then poisons everything it touches."""
    layer = ScaledEmbedding(5, 2, scale=None, embeddings_initializer="ones")
    ids = np.array([[1, 7]])
    if keras.backend.backend() == "jax":
        out = as_numpy(layer(ids))
        assert np.isnan(out[0, 1]).all() and not np.isnan(out[0, 0]).any()
    else:
        with pytest.raises(Exception, match=r"(?i)index|indices|range|bound"):
            as_numpy(layer(ids))
