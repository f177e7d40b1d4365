"""Encoder-decoders (`keras_layers.export.seq2seq`): the protocol and the encoder's file.

keras-hub's BART and T5 built tiny with redrawn weights; the encoder's file
is held to keras-hub's own `_build_cache`, which computes the cross-attention
cache through the decoder's first step, not through our encoder model."""

import keras
import numpy as np
import onnxruntime as ort
import pytest

from keras_layers.export import export_model, seq2seq
from keras_layers.export.errors import UsageError
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
