"""The validator's rules (issue #27): roles found through any depth and named
with their source, padded points wherever a mask exists, output axes read from
the data, tolerances at each output's own scale, and int8 gates on pooled
statistics. Each rule is shown failing the wrong thing it exists to catch."""

import keras
import numpy as np
import pytest
from keras import layers, ops

from keras_layers.export import (
    ExportOptions,
    UsageError,
    ValidationFailed,
    export_model,
    loading,
    validate,
    validating,
)
from keras_layers.export.inputs import InputRole
from keras_layers.export.tasks.forward import Forward

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow


class PositionalEmbedding(layers.Layer):
    """The TF tutorial's: an `Embedding(mask_zero=True)` inside a layer of its
    own, times sqrt(d_model), the mask passed on by `compute_mask`."""

    def __init__(self, vocabulary, width, **kwargs):
        super().__init__(**kwargs)
        self.width = width
        self.embedding = layers.Embedding(vocabulary, width, mask_zero=True)

    def compute_mask(self, inputs, mask=None):
        return self.embedding.compute_mask(inputs, mask)

    def call(self, ids):
        return self.embedding(ids) * ops.sqrt(ops.cast(self.width, "float32"))


class Casting(layers.Layer):
    """A second level, reading floats and casting them for the layer inside."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.inner = PositionalEmbedding(7765, 8)

    def compute_mask(self, inputs, mask=None):
        return ops.not_equal(inputs, 0)

    def call(self, values):
        return self.inner(ops.cast(values, "int32"))


class ZeroMask(layers.Layer):
    """A layer that masks zeros by its own `compute_mask`, with no embedding."""

    def compute_mask(self, inputs, mask=None):
        return ops.not_equal(inputs, 0)

    def call(self, values):
        return ops.expand_dims(ops.cast(values, "float32"), -1) * ops.ones((1, 1, 4))


def _loaded(model):
    loaded = loading.load(model)
    loaded.inputs, loaded.outputs = Forward().describe(loaded)
    return loaded


def test_an_embedding_two_layers_deep_behind_a_cast_reads_a_float_input():
    keras.utils.set_random_seed(1)
    values = keras.Input((None,), dtype="float32", name="values")
    pooled = layers.GlobalAveragePooling1D()(Casting()(values))
    (info,) = _loaded(keras.Model(values, layers.Dense(3)(pooled))).inputs

    assert (info.role, info.vocabulary, info.masks_zero) == ("ids", 7765, True)
    assert info.role_source == "wiring" and "vocabulary 7765" in info.role_reason
    feeds = validating.make_inputs(_loaded_like(info), (2, 300), np.random.default_rng(0))
    drawn = feeds["values"]
    # Integer ids over the whole vocabulary, in the input's float dtype.
    assert drawn.dtype == np.float32 and np.array_equal(drawn, np.round(drawn))
    assert drawn.max() > 2000 and drawn.min() >= 1


def _loaded_like(info):
    return loading.LoadedModel(None, None, [info], [], "single", "single")


def test_a_custom_compute_mask_gives_a_padded_point_and_a_defaulted_role_warns(tmp_path):
    keras.utils.set_random_seed(2)
    values = keras.Input((None,), dtype="int32", name="codes")
    pooled = layers.GlobalAveragePooling1D()(ZeroMask()(values))
    model = keras.Model(values, layers.Dense(2)(pooled))
    (info,) = _loaded(model).inputs
    assert info.masks_zero and info.role_source == "default"

    report = export_model(model, tmp_path / "m.onnx", ExportOptions(shapes=[(2, 5), "padded"]))

    assert report["passed"] and report["checks"][-1]["shape"] == "padded"
    (warning,) = report["warnings"]
    assert "'codes'" in warning and "--input codes=ROLE" in warning
    assert report["inputs"][0]["role_source"] == "default"


def test_roles_carry_their_source():
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    mask = keras.Input((None,), dtype="int32", name="padding_mask")
    weights = ops.expand_dims(ops.cast(mask, "float32"), -1)
    hidden = layers.Embedding(30, 4)(ids) * weights
    loaded = loading.load(
        keras.Model([ids, mask], hidden), input_roles={"token_ids": InputRole("features")}
    )
    sources = {info.name: (info.role, info.role_source) for info in loaded.inputs}
    assert sources == {
        "token_ids": ("features", "override"),
        "padding_mask": ("padding_mask", "name"),
    }


def test_an_encoder_decoders_output_follows_the_decoder_even_when_names_say_nothing():
    """The TF tutorial's `(context, x)`: no `decoder_` prefix to go by."""
    keras.utils.set_random_seed(3)
    context = keras.Input((None,), dtype="int32", name="context")
    target = keras.Input((None,), dtype="int32", name="x")
    encoded = layers.Embedding(40, 8, mask_zero=True)(context)
    decoded = layers.Embedding(50, 8, mask_zero=True)(target)
    attended = layers.MultiHeadAttention(2, 4)(decoded, encoded)
    loaded = _loaded(keras.Model([context, target], layers.Dense(50)(attended)))

    assert [info.sequence for info in loaded.inputs] == ["sequence", "x_sequence"]
    assert loaded.outputs[0].axis_names() == ["batch", "x_sequence", 50]
    feeds = validating.make_inputs(loaded, (2, 9), np.random.default_rng(0))
    assert feeds["context"].shape[1] != feeds["x"].shape[1]


def test_inputs_that_must_be_as_long_stay_on_one_axis():
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    segments = keras.Input((None,), dtype="int32", name="segment_ids")
    summed = layers.Embedding(30, 4)(ids) + layers.Embedding(2, 4)(segments)
    loaded = _loaded(keras.Model([ids, segments], summed))
    assert [info.sequence for info in loaded.inputs] == ["sequence", "sequence"]
    assert loaded.outputs[0].axis_names() == ["batch", "sequence", 4]


def test_a_model_that_does_not_mask_its_padding_is_told():
    """Mask-zero embeddings feeding a Conv1D, which drops the mask: the
    outputs at real tokens change with the padding."""
    keras.utils.set_random_seed(4)
    ids = keras.Input((None,), dtype="int32", name="ids")
    hidden = layers.Conv1D(4, 3, padding="same")(layers.Embedding(30, 4, mask_zero=True)(ids))
    loaded = _loaded(keras.Model(ids, hidden))
    (reference,) = validating.keras_references(loaded, ["padded"])
    assert "does not mask its padding" in reference.warning

    masked_ids = keras.Input((None,), dtype="int32", name="ids")
    recurrent = layers.LSTM(4, return_sequences=True)(
        layers.Embedding(30, 4, mask_zero=True)(masked_ids)
    )
    (reference,) = validating.keras_references(
        _loaded(keras.Model(masked_ids, recurrent)), ["padded"]
    )
    assert reference.warning is None


def softmax(logits):
    shifted = np.exp(logits - logits.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


def test_probabilities_over_many_classes_are_compared_as_log_probabilities():
    """The issue's case: 15,000 classes, every probability below 1.7e-4; a lost
    mask that moves them by ~2e-5 passed `atol 1e-4` and must fail now."""
    rng = np.random.default_rng(0)
    logits = (0.3 * rng.standard_normal((2, 5, 15000))).astype("float32")
    expected = softmax(logits).astype("float32")
    moved = softmax(logits + 0.05 * rng.standard_normal(logits.shape)).astype("float32")
    assert np.abs(moved - expected).max() < 1e-4  # what the old rule accepted

    check = validating.compare("2x5", "probabilities", moved, expected, 1e-4, 1e-3)
    assert not check.passed and check.space == "log-probabilities"

    rounding = (expected * (1 + 1e-6 * rng.standard_normal(expected.shape))).astype("float32")
    assert validating.compare("2x5", "probabilities", rounding, expected, 1e-4, 1e-3).passed


def test_an_output_at_an_offset_is_held_to_its_spread_not_its_offset():
    """keras.io's image classifier from scratch: one sigmoid unit of random
    weights, 0.5 +- 0.001. A weight 1% off moved it by 2.6e-5, which an atol
    scaled by the RMS (0.5) let through (bound 5.5e-5); scaled by the spread
    it fails, while rounding in proportion to the values still passes."""
    rng = np.random.default_rng(2)
    expected = (0.5 + 1e-3 * rng.standard_normal((8, 1))).astype("float32")
    moved = expected + np.float32(2.6e-5)
    check = validating.compare("8x1", "sigmoid", moved, expected, 1e-4, 1e-5)
    assert not check.passed and check.scale == pytest.approx(1e-3, rel=0.3)
    rounding = (expected * (1 + 1e-7 * rng.standard_normal(expected.shape))).astype("float32")
    assert validating.compare("8x1", "sigmoid", rounding, expected, 1e-4, 1e-5).passed
    constant = np.full((4, 3), 2.0, "float32")  # no spread: rtol still covers rounding
    assert validating.compare("4x3", "c", constant * (1 + 1e-6), constant, 1e-4, 1e-5).passed


def test_the_absolute_tolerance_follows_each_outputs_scale():
    rng = np.random.default_rng(1)
    small = (1e-3 * rng.standard_normal((2, 7, 16))).astype("float32")
    # 5% of the output's size: under a fixed atol of 1e-4, not at its scale.
    wrong = small + 5e-5 * np.sign(rng.standard_normal(small.shape)).astype("float32")
    check = validating.compare("2x7", "hidden", wrong, small, 1e-4, 1e-3)
    assert not check.passed and check.scale == pytest.approx(1e-3, rel=0.1)
    assert validating.compare("2x7", "hidden", small * (1 + 1e-6), small, 1e-4, 1e-3).passed


def test_top1_decides_where_keras_leads_clearly():
    expected = np.array([[[0.0, 5.0, 1.0]]], "float32")
    swapped = np.array([[[0.0, 1.0, 5.0]]], "float32")
    # Tolerances loosened until the values pass: the changed prediction does not.
    check = validating.compare("1x1", "logits", swapped, expected, 10.0, 0.0)
    assert not check.passed and "top-1 differs" in check.problem
    tied = np.array([[[0.0, 5.0, 5.0 - 1e-6]]], "float32")
    near = np.array([[[0.0, 5.0 - 1e-6, 5.0]]], "float32")
    assert validating.compare("1x1", "logits", near, tied, 1e-4, 1e-3).passed


def _numbers(check):
    return {name: value for name, value in vars(check).items() if isinstance(value, float)}


@pytest.mark.parametrize("kind", ["logits", "probabilities"])
def test_a_comparison_in_chunks_of_rows_measures_what_the_whole_does(monkeypatch, kind):
    """Outputs are compared a few rows at a time (`_row_chunks`): the same
    check in 3-row chunks as in one piece, and a difference in the last chunk
    alone still fails it."""
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((4, 6, 50)).astype("float32")
    expected = softmax(logits).astype("float32") if kind == "probabilities" else logits
    got = (expected * (1 + 1e-6 * rng.standard_normal(expected.shape))).astype("float32")
    got[1, 2] = expected[1, 2][::-1]  # one row picks another class
    valid = np.ones((4, 6), bool)
    valid[3, 4:] = False
    whole = validating.compare("4x6", kind, got, expected, 10.0, 1.0, valid)
    monkeypatch.setattr(validating, "_CHUNK_VALUES", 150)
    chunked = validating.compare("4x6", kind, got, expected, 10.0, 1.0, valid)
    assert _numbers(chunked) == pytest.approx(_numbers(whole), rel=1e-6)
    assert (chunked.passed, chunked.problem, chunked.space) == (
        whole.passed,
        whole.problem,
        whole.space,
    )
    assert chunked.top1_agreement == pytest.approx(1 - 1 / 22) and chunked.top1_tokens == 22
    wrong = got.copy()
    wrong[3, 5] += 1.0 if kind == "logits" else -wrong[3, 5] / 2  # in the last chunk only
    assert not validating.compare("4x6", kind, wrong, expected, 1e-4, 1e-3).passed


def test_comparing_large_outputs_holds_a_chunk_not_copies_of_them():
    """The comparison of two 64 MB outputs (logits over 32,000 classes)
    allocates less than one of them: compared whole, each temporary (the
    differences, the bound, |expected|, ...) was an output's size."""
    import tracemalloc

    rng = np.random.default_rng(3)
    expected = rng.standard_normal((2, 250, 32000), dtype=np.float32)
    got = expected + np.float32(1e-7)
    tracemalloc.start()
    try:
        check = validating.compare("2x250", "logits", got, expected, 1e-4, 1e-5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert check.passed and check.top1_agreement == 1.0
    assert peak < 0.5 * expected.nbytes, f"{peak / 1e6:.0f} MB for {expected.nbytes / 1e6:.0f} MB"


def test_the_int8_gate_pools_over_the_grid_and_refuses_too_few_tokens():
    pool = validating._Pool()
    for agreement in (0.5, 1.0, 1.0):  # one noisy point does not decide
        check = validating.Check("p", "logits", 0, 0, True, agreement, top1_tokens=400)
        pool.add(check, None, None)
    (gate,) = pool.gates(0.8, 1000)
    assert gate.passed and gate.value == pytest.approx(2.5 / 3) and gate.tokens == 1200
    (short,) = pool.gates(0.8, 2000)
    assert not short.passed and "only 1200 tokens" in short.problem


def test_validate_fails_a_file_that_ignores_the_padding(tmp_path):
    """End to end: the same model exported without its mask fails the padded point."""
    keras.utils.set_random_seed(5)
    ids = keras.Input((None,), dtype="int32", name="ids")
    pooled = layers.GlobalAveragePooling1D()(layers.Embedding(30, 4, mask_zero=True)(ids))
    masked = keras.Model(ids, layers.Dense(3, activation="softmax")(pooled))
    unmasked_ids = keras.Input((None,), dtype="int32", name="ids")
    unmasked = keras.Model(
        unmasked_ids,
        layers.Dense(3, activation="softmax")(
            layers.GlobalAveragePooling1D()(layers.Embedding(30, 4)(unmasked_ids))
        ),
    )
    unmasked.set_weights(masked.get_weights())
    wrong = tmp_path / "unmasked.onnx"
    export_model(unmasked, wrong, ExportOptions(shapes=[(2, 5)]))

    with pytest.raises(ValidationFailed) as failed:
        validate(masked, wrong, ExportOptions(shapes=[(2, 5), "padded"]))
    checks = failed.value.report["checks"]
    assert [c["shape"] for c in checks if not c["passed"]] == ["padded"]


def conv_text_model() -> keras.Model:
    """keras.io's "Text classification from scratch" stack: two Conv1D of
    kernel 7 and stride 3, so it takes at least 25 tokens."""
    keras.utils.set_random_seed(6)
    ids = keras.Input((None,), dtype="int64", name="ids")
    hidden = layers.Embedding(100, 8)(ids)
    hidden = layers.Conv1D(8, 7, padding="valid", activation="relu", strides=3)(hidden)
    hidden = layers.Conv1D(8, 7, padding="valid", activation="relu", strides=3)(hidden)
    pooled = layers.GlobalMaxPooling1D()(hidden)
    return keras.Model(ids, layers.Dense(1, activation="sigmoid")(pooled))


def test_the_grid_starts_at_the_shortest_length_the_model_takes():
    loaded = _loaded(conv_text_model())
    assert loaded.min_length == 25
    lengths = {shape[1] for shape in validating.default_shapes(loaded)}
    assert lengths == {25, 64, 256}


def test_a_grid_the_model_cannot_take_fails_before_converting(tmp_path):
    stages = []
    with pytest.raises(UsageError, match=r"1x7 is shorter than the 25 tokens"):
        export_model(
            conv_text_model(),
            tmp_path / "m.onnx",
            ExportOptions(shapes=[(1, 7)]),
            progress=lambda event: stages.append(event.stage),
        )
    assert "convert" not in stages


def test_default_lengths_keras_itself_fails_on_are_left_out_and_said(tmp_path):
    """keras-hub's SigLIP text encoder adds its whole position table: it runs
    at the table's 32 tokens (and at 1, by broadcasting) only. Before, the
    default grid's 1x7 failed in Keras itself (exit 2); now 7 is left out and
    the report says so."""
    import zoo_models

    report = export_model(zoo_models.build("SigLIPTextEncoder"), tmp_path / "siglip.onnx")
    assert report["passed"]
    assert {check["shape"].split("x")[1] for check in report["checks"]} == {"1", "32"}
    assert any("leaves out length 7: Keras itself fails there" in w for w in report["warnings"])
