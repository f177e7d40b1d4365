"""keras-hub models exported with default flags: input roles read from the model,
the grid bounded by its position tables, encoder and decoder lengths apart.

Weights are redrawn with a fixed seed (keras-hub's initialisation can make
kernels coincide, which would hide a swapped input), and every file is checked
again on feeds built here, independently of the validation grid.
"""

import keras
import numpy as np
import onnxruntime as ort
import pytest

from keras_layers.export import ExportOptions, UsageError, export_model
from keras_layers.export.cli import main
from keras_layers.export.validating import make_inputs

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

VOCAB = 60


def redrawn(model, seed=0):
    """Every weight drawn anew from N(0, 0.2), so no two kernels are equal."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        weight.assign(rng.normal(0, 0.2, size=weight.shape).astype(weight.dtype))
    return model


def bert(max_sequence_length=128):
    import keras_hub

    keras.utils.set_random_seed(0)
    return keras_hub.models.BertBackbone(
        vocabulary_size=VOCAB,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=max_sequence_length,
    )


def padded(lengths, total, rng):
    ids = rng.integers(1, VOCAB, size=(len(lengths), total)).astype("int32")
    mask = np.arange(total)[None, :] < np.array(lengths)[:, None]
    return np.where(mask, ids, 0).astype("int32"), mask.astype("int32")


def assert_matches_keras(model, path, feeds, atol=1e-4):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds), strict=True))
    expected = model(feeds, training=False)
    expected = expected if isinstance(expected, dict) else {next(iter(got)): expected}
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], keras.ops.convert_to_numpy(value), atol=atol)


def test_bert_with_a_short_position_table_exports_with_default_flags(tmp_path):
    """BertBackbone(max_sequence_length=128) once failed on the default 256."""
    model = redrawn(bert(128))
    report = export_model(model, tmp_path / "bert.onnx")
    assert report["passed"]
    lengths = {int(c["shape"].split("x")[1]) for c in report["checks"] if "x" in c["shape"]}
    assert max(lengths) == 128
    ids, mask = padded([9, 4, 1], 9, np.random.default_rng(1))
    feeds = {"token_ids": ids, "segment_ids": (ids % 2).astype("int32"), "padding_mask": mask}
    assert_matches_keras(model, tmp_path / "bert.onnx", feeds)


def test_asking_beyond_the_position_table_is_exit_2_naming_the_limit(tmp_path, capsys):
    path = tmp_path / "bert.keras"
    bert(16).save(path)
    code = main([str(path), "--shapes", "2x32"])
    err = capsys.readouterr().err
    assert code == 2 and "16 positions" in err and "position_embedding" in err
    with pytest.raises(UsageError, match="at most 16"):
        export_model(path, tmp_path / "b.onnx", ExportOptions(shapes=[(1, 17)]))


def test_mask_positions_are_positions_not_a_padding_mask(tmp_path):
    import keras_hub

    model = redrawn(keras_hub.models.BertMaskedLM(backbone=bert(32), preprocessor=None))
    report = export_model(model, tmp_path / "mlm.onnx")
    assert report["passed"]
    roles = {entry["name"]: entry["shape"] for entry in report["inputs"]}
    assert roles["mask_positions"] == ["batch", "mask_positions_count"]
    ids, mask = padded([12, 7], 12, np.random.default_rng(2))
    feeds = {
        "token_ids": ids,
        "segment_ids": np.zeros_like(ids),
        "padding_mask": mask,
        "mask_positions": np.array([[0, 5, 11], [6, 2, 3]], "int32"),  # beyond 1: read for real
    }
    assert_matches_keras(model, tmp_path / "mlm.onnx", feeds)


@pytest.mark.parametrize("kind", ["BartBackbone", "T5Backbone"])
def test_encoder_and_decoder_lengths_are_varied_apart(tmp_path, kind):
    import keras_hub

    keras.utils.set_random_seed(0)
    sizes = {"vocabulary_size": VOCAB, "num_layers": 1, "num_heads": 2, "hidden_dim": 8}
    extra = {"max_sequence_length": 32} if kind == "BartBackbone" else {}
    model = redrawn(getattr(keras_hub.models, kind)(intermediate_dim=16, **sizes, **extra))
    report = export_model(model, tmp_path / "s2s.onnx")
    assert report["passed"]
    axes = {entry["name"]: entry["shape"][1] for entry in report["inputs"]}
    assert axes["encoder_token_ids"] == "sequence"
    assert axes["decoder_token_ids"] == "decoder_sequence"
    from keras_layers.export.loading import load

    feeds = make_inputs(load(model), (2, 7), np.random.default_rng(0))
    assert feeds["encoder_token_ids"].shape[1] != feeds["decoder_token_ids"].shape[1]
    rng = np.random.default_rng(3)
    encoder, encoder_mask = padded([11, 6], 11, rng)
    decoder, decoder_mask = padded([4, 2], 4, rng)
    feeds = {
        "encoder_token_ids": encoder,
        "encoder_padding_mask": encoder_mask,
        "decoder_token_ids": decoder,
        "decoder_padding_mask": decoder_mask,
    }
    assert_matches_keras(model, tmp_path / "s2s.onnx", feeds)


def test_an_input_role_can_be_overridden(tmp_path, capsys):
    """A model read by plain ops says nothing about its input; the caller can."""
    ids = keras.Input((None,), dtype="int32", name="flags")
    hidden = keras.layers.Embedding(VOCAB, 4)(ids)
    model = keras.Model(ids, keras.layers.Dense(2)(hidden))
    path = tmp_path / "m.keras"
    model.save(path)
    report = export_model(
        path,
        tmp_path / "m.onnx",
        ExportOptions(shapes=[(2, 5)], input_roles={"flags": "ids@tokens"}),
    )
    assert report["inputs"][0]["shape"] == ["batch", "tokens"]
    assert main([str(path), "--input", "flags=ids@words", "--shapes", "2x5"]) == 0
    code = main([str(path), "--input", "nope=ids", "--shapes", "2x5"])
    assert code == 2 and "has no input 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(path), "--input", "flags=bogus"])


def test_weights_the_outputs_never_read_are_listed_not_counted(tmp_path):
    """LlamaBackbone holds an untied reverse_embeddings matrix for its causal LM
    that the backbone's outputs never read: the report once counted it and
    showed a 0.70x file."""
    import keras_hub

    keras.utils.set_random_seed(0)
    model = keras_hub.models.LlamaBackbone(
        vocabulary_size=VOCAB,
        num_layers=1,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=16,
        intermediate_dim=32,
    )
    report = export_model(redrawn(model), tmp_path / "llama.onnx", ExportOptions(shapes=[(2, 5)]))
    assert report["passed"]
    unused = {entry["name"]: entry["bytes"] for entry in report["unused_weights"]}
    assert list(unused) == ["token_embedding/reverse_embeddings"]
    assert unused["token_embedding/reverse_embeddings"] == VOCAB * 16 * 4
    all_bytes = 4 * sum(int(np.prod(w.shape)) for w in model.weights)
    assert report["param_bytes"] == all_bytes - VOCAB * 16 * 4
    # The file holds every weight it reads: never less than their bytes (the
    # 0.70x came from counting the unread matrix).
    assert report["size_ratio"] >= 1.0


def test_position_ids_are_one_per_token(tmp_path):
    """`position_ids` feeding a rotary embedding are 0..L-1 along the sequence,
    not positions picked among the tokens (Gemma 4 got 16 of them for 64 tokens)."""
    import keras_hub

    ids = keras.Input((None,), dtype="int32", name="token_ids")
    position_ids = keras.Input((None,), dtype="int32", name="position_ids")
    x = keras.layers.Reshape((-1, 1, 8))(keras.layers.Embedding(10, 8)(ids))
    y = keras_hub.layers.RotaryEmbedding()(x, positions=position_ids)
    model = keras.Model({"token_ids": ids, "position_ids": position_ids}, y)
    report = export_model(model, tmp_path / "p.onnx", ExportOptions(shapes=[(1, 64), (2, 7)]))
    assert report["passed"]
    axes = {entry["name"]: entry["shape"] for entry in report["inputs"]}
    assert axes["position_ids"] == ["batch", "sequence"]
