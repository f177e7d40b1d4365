import keras
import numpy as np
import pytest
import references as ref
from arrays import as_numpy
from keras import ops

from keras_layers import ScaledEmbedding, SinusoidalPositionEncoding

# A float32 result of a value in [-1, 1] cannot be closer than half an ulp at 1
# (6e-8); 1e-6 leaves room for one reduction and one sine, nothing more.
F32_EXACT = 1e-6


def encode(layer, length, depth, **call_kwargs):
    zeros = np.zeros((1, length, depth), "float32")
    return as_numpy(layer(zeros, **call_kwargs), np.float64)[0]


def test_correctness_on_a_hand_checked_case():
    out = encode(SinusoidalPositionEncoding(), 2, 4)
    # Position 1: sin(1), cos(1), sin(1/100), cos(1/100).
    expected = [[0, 1, 0, 1], [0.841470985, 0.540302306, 0.009999833, 0.99995]]
    np.testing.assert_allclose(out, expected, atol=1e-6)


def test_adds_to_the_inputs():
    inputs = np.random.default_rng(0).normal(size=(3, 5, 8)).astype("float32")
    out = as_numpy(SinusoidalPositionEncoding()(inputs))
    np.testing.assert_allclose(out, inputs + ref.paper_encoding(5, 8), atol=1e-6)


@pytest.mark.parametrize("depth", [2, 8, 64, 255, 256])
def test_interleave_paper_matches_the_paper(depth):
    out = encode(SinusoidalPositionEncoding(), 300, depth)
    np.testing.assert_allclose(out, ref.paper_encoding(300, depth), atol=F32_EXACT)


@pytest.mark.parametrize("depth", [4, 128, 512])
def test_concat_paper_matches_the_tensorflow_tutorial(depth):
    layer = SinusoidalPositionEncoding(layout="concat")
    out = encode(layer, 200, depth)
    np.testing.assert_allclose(out, ref.tf_tutorial_encoding(200, depth), atol=F32_EXACT)


@pytest.mark.parametrize("depth", [4, 7, 128, 513])
def test_concat_tensor2tensor_matches_get_timing_signal_1d(depth):
    layer = SinusoidalPositionEncoding(layout="concat", spacing="tensor2tensor")
    out = encode(layer, 200, depth)
    np.testing.assert_allclose(out, ref.tensor2tensor_encoding(200, depth), atol=F32_EXACT)


@pytest.mark.parametrize("depth", [16, 33])
def test_concat_tensor2tensor_matches_fairseq_without_its_offset(depth):
    layer = SinusoidalPositionEncoding(layout="concat", spacing="tensor2tensor")
    out = encode(layer, 100, depth)
    np.testing.assert_allclose(out, ref.fairseq_encoding(100, depth), atol=F32_EXACT)


def test_tensor2tensor_lowest_frequency_is_exactly_one_over_max_wavelength():
    layer = SinusoidalPositionEncoding(layout="concat", spacing="tensor2tensor")
    out = encode(layer, 5001, 8)
    # Channel 3 is sin(p / 10000): a quarter period at p = 2500 * pi.
    np.testing.assert_allclose(out[:, 3], np.sin(np.arange(5001) / 1e4), atol=F32_EXACT)


def test_matches_keras_hub_sine_position_encoding():
    keras_hub = pytest.importorskip("keras_hub")
    inputs = np.zeros((2, 64, 32), "float32")
    theirs = as_numpy(keras_hub.layers.SinePositionEncoding()(inputs))
    ours = as_numpy(SinusoidalPositionEncoding()(inputs))
    # keras-hub rounds each angle p * w to float32 first: its own error is up
    # to about p * 6e-8 (4e-6 at p = 63), which bounds the agreement.
    np.testing.assert_allclose(ours, theirs, atol=8e-6)


def test_odd_depth_interleave_ends_with_a_sine_channel():
    out = encode(SinusoidalPositionEncoding(), 10, 5)
    w = 10000.0 ** (-4 / 5)
    np.testing.assert_allclose(out[:, 4], np.sin(np.arange(10) * w), atol=F32_EXACT)


def test_odd_depth_concat_ends_with_a_zero_channel():
    out = encode(SinusoidalPositionEncoding(layout="concat"), 10, 5)
    np.testing.assert_array_equal(out[:, 4], np.zeros(10))
    assert out.shape == (10, 5)


def test_precision_at_every_position_up_to_16384():
    out = encode(SinusoidalPositionEncoding(), 16384, 512)
    error = np.abs(out - ref.paper_encoding(16384, 512))
    assert error.max() <= F32_EXACT, error.max()


def test_naive_float32_angles_would_fail_the_same_bound():
    # The precision test can fail: the textbook float32 computation does.
    p = np.arange(16384, dtype=np.float32)[:, None]
    i = np.arange(512)[None, :]
    w = (1.0 / 10000.0 ** (2 * (i // 2) / 512)).astype(np.float32)
    naive = np.where(i % 2 == 0, np.sin(p * w), np.cos(p * w))
    assert np.abs(naive - ref.paper_encoding(16384, 512)).max() > 1e-4


@pytest.mark.parametrize("start", [0, 7, 4095, 100_000, 3_000_000])
def test_start_index_python_int(start):
    out = encode(SinusoidalPositionEncoding(), 50, 64, start_index=start)
    np.testing.assert_allclose(out, ref.paper_encoding(50, 64, start=start), atol=F32_EXACT)


def test_start_index_tensor_for_cached_decoding():
    layer = SinusoidalPositionEncoding()
    step = ops.convert_to_tensor(np.int32(41))
    out = encode(layer, 1, 16, start_index=step)
    np.testing.assert_allclose(out, ref.paper_encoding(1, 16, start=41), atol=F32_EXACT)
    step64 = ops.convert_to_tensor(np.int64(41))
    np.testing.assert_allclose(encode(layer, 1, 16, start_index=step64), out)


def test_explicit_positions_for_left_padding():
    layer = SinusoidalPositionEncoding()
    positions = np.array([[0, 0, 0, 1], [0, 1, 2, 3]])
    out = as_numpy(layer(np.zeros((2, 4, 8), "float32"), positions=positions))
    table = ref.paper_encoding(4, 8)
    np.testing.assert_allclose(out[0], table[[0, 0, 0, 1]], atol=F32_EXACT)
    np.testing.assert_allclose(out[1], table, atol=F32_EXACT)


def test_any_length_without_a_maximum():
    layer = SinusoidalPositionEncoding()
    for length in (1, 3, 1000):
        assert encode(layer, length, 6).shape == (length, 6)


@pytest.mark.parametrize("name", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_rounds_only_the_result(policy, name):
    policy(name)
    layer = SinusoidalPositionEncoding()
    rng = np.random.default_rng(1)
    inputs = rng.normal(size=(1, 1024, 64)).astype("float32")
    out = layer(inputs)
    dtype = keras.backend.standardize_dtype(out.dtype)
    assert dtype == name.removeprefix("mixed_")
    # Inputs are cast to the compute dtype by Keras before the layer sees them.
    cast_inputs = as_numpy(ops.cast(ops.cast(inputs, dtype), "float32"), np.float64)
    exact = cast_inputs + ref.paper_encoding(1024, 64)
    got = as_numpy(ops.cast(out, "float32"), np.float64)
    # One rounding step of the output dtype: half an ulp of the exact value.
    mantissa_bits = {"float16": 10, "bfloat16": 7}[dtype]
    half_ulp = 2.0 ** (np.floor(np.log2(np.abs(exact) + 1e-30)) - mantissa_bits - 1)
    # Plus the float32 encoding's own error, which can move a tie across.
    excess = np.abs(got - exact) - half_ulp
    assert excess.max() <= F32_EXACT, excess.max()


def test_bfloat16_keeps_neighbouring_positions_apart(policy):
    policy("mixed_bfloat16")
    out = SinusoidalPositionEncoding()(np.zeros((1, 302, 256), "float32"))
    out = as_numpy(ops.cast(out, "float32"))[0]
    assert not np.array_equal(out[300], out[301])
    exact = ref.paper_encoding(302, 256)
    assert np.abs(out - exact).max() < 2.0**-8  # keras-hub: error 2.0


def test_float64_compute_dtype_is_exact_in_float64():
    layer = SinusoidalPositionEncoding(dtype="float64")
    out = as_numpy(layer(np.zeros((1, 5000, 32), "float64")))[0]
    if keras.backend.backend() == "jax" and out.dtype == np.float32:
        # JAX without JAX_ENABLE_X64 has no float64: Keras computes in float32,
        # and the layer falls back to its exact float32 path.
        np.testing.assert_allclose(out, ref.paper_encoding(5000, 32), atol=F32_EXACT)
        return
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, ref.paper_encoding(5000, 32), atol=1e-11)


def test_masks_pass_through_unchanged():
    ids = keras.Input((None,), dtype="int32")
    x = ScaledEmbedding(10, 8, mask_zero=True)(ids)
    y = SinusoidalPositionEncoding()(x)
    assert y._keras_mask is not None
    mask = np.array([[True, False]])
    layer = SinusoidalPositionEncoding()
    assert layer.compute_mask(np.zeros((1, 2, 8)), mask) is mask
    model = keras.Model(ids, keras.layers.GlobalAveragePooling1D()(y))
    emb = model.layers[1]
    emb.embeddings.assign(np.zeros((10, 8)))
    out = as_numpy(model(np.array([[3, 0, 0]])))
    # Only position 0 is unmasked, so the mean is the encoding at position 0.
    np.testing.assert_allclose(out[0], ref.paper_encoding(1, 8)[0], atol=1e-6)


@pytest.mark.tensorflow_only
def test_runs_inside_a_compiled_function():
    import tensorflow as tf

    layer = SinusoidalPositionEncoding()

    @tf.function(jit_compile=True)
    def f(x, start):
        return layer(x, start_index=start)

    out = as_numpy(f(tf.zeros((2, 9, 16)), tf.constant(5)))
    np.testing.assert_allclose(out[1], ref.paper_encoding(9, 16, start=5), atol=F32_EXACT)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"layout": "concat", "spacing": "tensor2tensor", "max_wavelength": 500}],
)
def test_config_round_trip(kwargs):
    layer = SinusoidalPositionEncoding(**kwargs)
    config = layer.get_config()
    clone = SinusoidalPositionEncoding.from_config(config)
    assert clone.get_config() == config
    x = np.zeros((1, 4, 6), "float32")
    np.testing.assert_array_equal(as_numpy(layer(x)), as_numpy(clone(x)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_wavelength": 0}, "`max_wavelength` must be a positive"),
        ({"max_wavelength": -5.0}, "`max_wavelength` must be a positive"),
        ({"max_wavelength": float("inf")}, "`max_wavelength` must be a positive"),
        ({"max_wavelength": "10000"}, "`max_wavelength` must be a positive"),
        ({"layout": "stacked"}, "`layout` must be one of"),
        ({"spacing": "linear"}, "`spacing` must be one of"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SinusoidalPositionEncoding(**kwargs)


def test_unknown_width_is_a_clear_error():
    layer = SinusoidalPositionEncoding()
    with pytest.raises(ValueError, match="known last dimension"):
        layer.build((None, None, None))
