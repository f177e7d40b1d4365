"""Encoder-decoders (`keras_layers.export.seq2seq`): the protocol and the encoder's file.

keras-hub's BART and T5 built tiny with redrawn weights; the encoder's file
is held to keras-hub's own `_build_cache`, which computes the cross-attention
cache through the decoder's first step, not through our encoder model."""

from dataclasses import replace

import keras
import numpy as np
import onnxruntime as ort
import pytest

from keras_layers.export import export_model, pipeline, seq2seq
from keras_layers.export.errors import UsageError
from keras_layers.export.validating import DEFAULT_ATOL, DEFAULT_RTOL
from tests import zoo_models
from tests.test_generate_arguments import tiny_gpt2

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

VOCAB = 60


def _seq2seq(kind: str):
    import keras_hub

    keras.utils.set_random_seed(0)
    sizes = {"vocabulary_size": VOCAB, "num_layers": 2, "num_heads": 2, "hidden_dim": 8}
    if kind == "bart":
        backbone = keras_hub.models.BartBackbone(
            intermediate_dim=16, max_sequence_length=32, **sizes
        )
        return zoo_models.redraw(keras_hub.models.BartSeq2SeqLM(backbone), 0)
    backbone = keras_hub.models.T5Backbone(intermediate_dim=16, **sizes)
    return zoo_models.redraw(keras_hub.models.T5Seq2SeqLM(backbone), 0)


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_an_encoder_decoder_is_described_from_its_own_caches(kind):
    described = seq2seq.describe(_seq2seq(kind))
    assert (described.layers, described.heads, described.head_size) == (2, 2, 4)
    assert (described.hidden, described.vocabulary, described.dtype) == (8, VOCAB, "float32")


def test_a_decoder_only_model_is_refused_naming_the_protocol_and_its_task():
    with pytest.raises(UsageError, match="has no `call_encoder` method.*--task causal-lm"):
        seq2seq.describe(tiny_gpt2())


@pytest.mark.parametrize("kind", ["bart", "t5"])
def test_the_encoder_file_gives_keras_hubs_own_cross_attention_cache(tmp_path, kind):
    """The file, proved by the pipeline on its grid, then held to keras-hub's
    `_build_cache` on a padded batch: the encoder's output and every layer's
    cross-attention keys and values, in optimum's layout."""
    model = _seq2seq(kind)
    report = export_model(seq2seq.encoder_model(model), tmp_path / "encoder_model.onnx")
    assert report["passed"]
    assert [entry["name"] for entry in report["inputs"]] == list(seq2seq.ENCODER_INPUTS)
    names = [seq2seq.ENCODER_OUTPUT, *seq2seq.cross_names(2)]
    assert [entry["name"] for entry in report["outputs"]] == names

    rng = np.random.default_rng(1)
    ids = rng.integers(1, VOCAB, (2, 7)).astype("int32")
    mask = (np.arange(7) < np.array([[7], [4]])).astype("int32")
    ids[mask == 0] = 0
    session = ort.InferenceSession(str(tmp_path / "encoder_model.onnx"))
    outputs = session.run(names, {"input_ids": ids, "attention_mask": mask})
    got = dict(zip(names, outputs, strict=True))

    _, hidden, _, cross = model._build_cache(ids, mask.astype(bool), ids[:, :1])
    hidden, cross = np.asarray(hidden), np.asarray(cross)
    np.testing.assert_allclose(got[seq2seq.ENCODER_OUTPUT], hidden, atol=1e-5, rtol=1e-5)
    for layer in range(2):
        for kind_index, kind_name in enumerate(("key", "value")):
            expected = cross[:, layer, kind_index].transpose(0, 2, 1, 3)
            found = got[f"present.{layer}.encoder.{kind_name}"]
            np.testing.assert_allclose(found, expected, atol=1e-5, rtol=1e-5)


def test_the_encoder_file_projects_no_decoder_token(tmp_path):
    """The cross-attention keys and values come from the encoder's output
    alone: the probe token the model's cached call needs leaves no trace in
    the file (the decoder's positions and self-attention weights unread)."""
    model = _seq2seq("bart")
    report = export_model(seq2seq.encoder_model(model), tmp_path / "encoder_model.onnx")
    unused = {entry["name"] for entry in report["unused_weights"]}
    decoder = model.backbone.decoder_transformer_layers
    probe_only = [w.path for layer in decoder for w in layer._self_attention_layer.weights]
    probe_only += [w.path for w in model.backbone.decoder_position_embedding.weights]
    assert len(probe_only) == 17 and set(probe_only) <= unused
    cross = [w.path for layer in decoder for w in layer._cross_attention_layer._key_dense.weights]
    assert cross and not set(cross) & unused


@pytest.fixture(scope="module", params=["bart", "t5"])
def decoder_file(request, tmp_path_factory):
    """Each model's decoder file, exported and proved by the pipeline."""
    model = _seq2seq(request.param)
    path = tmp_path_factory.mktemp(request.param) / "decoder_model.onnx"
    report = pipeline.export_model(model, path, task="seq2seq-decoder")
    return model, path, report


def test_the_decoder_file_passes_keras_cached_steps_and_never_projects_the_encoder(decoder_file):
    """A prompt and 8 teacher-forced steps over a padded encoder batch, each
    within the default tolerances; the cross-attention keys' and values'
    projections are not in the file: it reads what the encoder's file gave."""
    model, path, report = decoder_file
    assert report["passed"]
    labels = [check["shape"] for check in report["checks"]]
    assert labels == ["decoder 3x3 after 0", "decode steps 1-8, encoder (9,5,2)"]
    names = [entry["name"] for entry in report["inputs"]]
    assert names == [*seq2seq.DECODER_INPUTS, *seq2seq.past_names(2)]
    unused = {entry["name"] for entry in report["unused_weights"]}
    encoder_side = [
        weight.path
        for layer in model.backbone.decoder_transformer_layers
        for weight in _cross_key_value_weights(layer)
    ]
    assert len(encoder_side) >= 4 and set(encoder_side) <= unused


def _cross_key_value_weights(layer):
    attention = getattr(layer, "_cross_attention_layer", None) or layer.cross_attention
    found = []
    for name in ("_key_dense", "_value_dense", "key_projector", "value_projector"):
        if hasattr(attention, name):
            found += getattr(attention, name).weights
    return found


def test_the_decoder_check_fails_a_file_that_ignores_the_encoder_mask(decoder_file):
    model, path, _ = decoder_file
    described = seq2seq.describe(model)
    reference = seq2seq.decoder_references(model, described)
    assert seq2seq.validate_decoder(reference, path, DEFAULT_ATOL, DEFAULT_RTOL).passed
    unmasked = replace(reference, encoder_mask=np.ones_like(reference.encoder_mask))
    assert not seq2seq.validate_decoder(unmasked, path, DEFAULT_ATOL, DEFAULT_RTOL).passed


def test_the_decoder_check_fails_a_cross_attention_weight_scaled_by_1_01(tmp_path):
    """The mutant's file passes its own model's check; Keras' references
    from the original model fail it. The last layer's cross-attention output
    projection x1.01 moves the logits by 5.7e-4 (of 0.39); its query x1.01
    moves them by 8e-8 only, at this size (near-uniform attention over the
    encoder), which no tolerance could tell from rounding."""
    model = _seq2seq("bart")
    reference = seq2seq.decoder_references(model, seq2seq.describe(model))
    output = model.backbone.decoder_transformer_layers[-1]._cross_attention_layer._output_dense
    output.kernel.assign(np.asarray(output.kernel) * 1.01)
    mutant = tmp_path / "mutant.onnx"
    assert pipeline.export_model(model, mutant, task="seq2seq-decoder")["passed"]
    assert not seq2seq.validate_decoder(reference, mutant, DEFAULT_ATOL, DEFAULT_RTOL).passed


def test_the_decoder_check_fails_a_relative_position_bias_one_bucket_off(tmp_path):
    """T5's decoder reads its self-attention bias by the bucket of each
    query-key distance, which the file computes from the past's length.
    Each bucket given its neighbour's bias (the table rolled by one row, as a
    file that counts positions one off would read it) must fail against the
    original model's cached calls; the unmutated file passes."""
    model = _seq2seq("t5")
    reference = seq2seq.decoder_references(model, seq2seq.describe(model))
    table = model.backbone.decoder_transformer_layers[0].self_attention.relative_attention_bias
    original = tmp_path / "original.onnx"
    assert pipeline.export_model(model, original, task="seq2seq-decoder")["passed"]
    assert seq2seq.validate_decoder(reference, original, DEFAULT_ATOL, DEFAULT_RTOL).passed
    table.assign(np.roll(np.asarray(table), -1, axis=0))
    mutant = tmp_path / "mutant.onnx"
    assert pipeline.export_model(model, mutant, task="seq2seq-decoder")["passed"]
    assert not seq2seq.validate_decoder(reference, mutant, DEFAULT_ATOL, DEFAULT_RTOL).passed
