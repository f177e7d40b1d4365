"""Property-based tests: the layers against the NumPy references on random
configurations, and random small encoders exported and validated."""

import math

import keras
import numpy as np
import pytest
import references as ref
from arrays import as_numpy
from hypothesis import given, settings
from hypothesis import strategies as st
from keras import ops

from keras_layers import ScaledEmbedding, SinusoidalPositionEncoding, TiedOutputDense

widths = st.integers(min_value=1, max_value=96)
lengths = st.integers(min_value=1, max_value=64)
batches = st.integers(min_value=1, max_value=4)


def numpy_encoding(length, depth, layout, spacing, wavelength, start):
    """Reference for every layout and spacing, from the formulas in the docs."""
    pairs = (depth + 1) // 2 if layout == "interleave" else depth // 2
    k = np.arange(pairs)
    if spacing == "paper":
        freqs = wavelength ** (-2.0 * k / depth)
    else:
        freqs = np.exp(-k * math.log(wavelength) / max(pairs - 1, 1))
    angles = np.arange(start, start + length, dtype=np.float64)[:, None] * freqs[None, :]
    if layout == "interleave":
        table = np.zeros((length, 2 * pairs))
        table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
        return table[:, :depth]
    table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    return np.pad(table, [(0, 0), (0, depth - 2 * pairs)])


@given(
    batch=batches,
    length=lengths,
    depth=widths,
    layout=st.sampled_from(["interleave", "concat"]),
    spacing=st.sampled_from(["paper", "tensor2tensor"]),
    wavelength=st.floats(min_value=10.0, max_value=1e5),
    start=st.integers(min_value=0, max_value=1_000_000),
)
def test_encoding_matches_reference(batch, length, depth, layout, spacing, wavelength, start):
    layer = SinusoidalPositionEncoding(max_wavelength=wavelength, layout=layout, spacing=spacing)
    inputs = np.random.default_rng(0).normal(size=(batch, length, depth)).astype("float32")
    out = as_numpy(layer(inputs, start_index=start), np.float64)
    expected = inputs + numpy_encoding(length, depth, layout, spacing, wavelength, start)
    np.testing.assert_allclose(out, expected, atol=1.5e-6)


@given(
    length=lengths,
    depth=st.integers(min_value=2, max_value=64),
    policy=st.sampled_from(["mixed_float16", "mixed_bfloat16"]),
    start=st.integers(min_value=0, max_value=100_000),
)
def test_mixed_precision_error_is_one_rounding(length, depth, policy, start):
    keras.mixed_precision.set_global_policy(policy)
    try:
        layer = SinusoidalPositionEncoding()
        out = layer(np.zeros((1, length, depth), "float32"), start_index=start)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    got = as_numpy(ops.cast(out, "float32"), np.float64)[0]
    exact = ref.paper_encoding(length, depth, start=start)
    mantissa = {"mixed_float16": 10, "mixed_bfloat16": 7}[policy]
    # Half an ulp of the output format, for values of magnitude up to 1.
    assert np.abs(got - exact).max() <= 2.0 ** -(mantissa + 1) + 1e-6


@given(
    vocabulary=st.integers(min_value=2, max_value=500),
    width=widths,
    batch=batches,
    length=lengths,
    scale=st.one_of(st.just("sqrt"), st.none(), st.floats(min_value=0.01, max_value=100.0)),
)
def test_scaled_embedding_is_lookup_times_factor(vocabulary, width, batch, length, scale):
    layer = ScaledEmbedding(vocabulary, width, scale=scale)
    ids = np.random.default_rng(1).integers(0, vocabulary, size=(batch, length))
    out = as_numpy(layer(ids), np.float64)
    factor = {"sqrt": math.sqrt(width), None: 1.0}.get(scale, scale)
    expected = factor * np.take(as_numpy(layer.embeddings, np.float64), ids, axis=0)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)


@given(
    vocabulary=st.integers(min_value=2, max_value=300),
    width=st.integers(min_value=1, max_value=48),
    batch=batches,
    length=lengths,
    use_bias=st.booleans(),
    logit_scale=st.one_of(st.none(), st.floats(min_value=0.01, max_value=10.0)),
    soft_cap=st.one_of(st.none(), st.floats(min_value=0.5, max_value=50.0)),
)
def test_tied_logits_match_reference(
    vocabulary, width, batch, length, use_bias, logit_scale, soft_cap
):
    embedding = keras.layers.Embedding(vocabulary, width, embeddings_initializer="normal")
    head = TiedOutputDense(
        embedding,
        use_bias=use_bias,
        logit_scale=logit_scale,
        logit_soft_cap=soft_cap,
        bias_initializer="normal",
    )
    hidden = np.random.default_rng(2).normal(size=(batch, length, width)).astype("float32")
    out = as_numpy(head(hidden), np.float64)
    bias = as_numpy(head.bias) if use_bias else None
    expected = ref.tied_logits(hidden, embedding.embeddings, bias, logit_scale, soft_cap)
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5)


@pytest.mark.tensorflow_only
@settings(max_examples=3)
@given(
    vocabulary=st.integers(min_value=20, max_value=400),
    heads=st.sampled_from([1, 2, 4]),
    head_width=st.sampled_from([4, 8]),
    layers=st.integers(min_value=1, max_value=2),
    layout=st.sampled_from(["interleave", "concat"]),
    use_bias=st.booleans(),
)
def test_random_encoders_export_and_validate(
    tmp_path_factory, vocabulary, heads, head_width, layers, layout, use_bias
):
    from keras_layers.demo import EncoderConfig, build_encoder
    from keras_layers.export import ExportOptions, export_model

    width = heads * head_width
    config = EncoderConfig(
        vocabulary, width, layers, heads, 2 * width, layout=layout, output_bias=use_bias
    )
    model = build_encoder(config)
    directory = tmp_path_factory.mktemp("random_encoder")
    model.save(directory / "m.keras")
    report = export_model(
        directory / "m.keras", directory / "m.onnx", ExportOptions(shapes=[(2, 9), "padded"])
    )
    assert report["passed"]
    assert report["graph"]["shared_weights"]
