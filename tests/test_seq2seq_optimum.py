"""A seq2seq folder read by optimum and transformers (the `peers` extra).

`--task seq2seq-lm -o FOLDER/` writes optimum's `encoder_model.onnx` and
`decoder_model_merged.onnx`, and for BART and T5 transformers' `config.json`
and `generation_config.json`. optimum's `ORTModelForSeq2SeqLM` must load the
folder, compute keras-hub's logits and generate our tokens; transformers'
own BART and T5 built from the folder's `config.json`, keras-hub's weights
copied in (`benchmarks.transformers_weights`), must compute keras-hub's
logits too, and fail to with a wrong field."""

import json

import numpy as np
import pytest

from keras_layers.export import export_model, generate
from tests.test_seq2seq_folder import seq2seq_lm

pytestmark = [
    pytest.mark.peers,
    pytest.mark.tensorflow_only,
    pytest.mark.xdist_group("seq2seq_optimum"),
]

IDS = np.array([[5, 6, 7, 8, 9, 10, 11], [12, 13, 14, 0, 0, 0, 0]])
MASK = (np.arange(7) < np.array([[7], [3]])).astype("int64")
DECODER = np.array([[2, 0, 20, 21, 22], [2, 0, 23, 24, 25]])  # teacher-forced, start first
NEW_TOKENS = 8


@pytest.fixture(scope="module", params=["bart", "t5"])
def exported(request, tmp_path_factory):
    model = seq2seq_lm(request.param)
    folder = tmp_path_factory.mktemp(request.param) / "folder"
    report = export_model(model, f"{folder}/", task="seq2seq-lm")
    return model, folder, report


def _keras_logits(model, decoder):
    return np.asarray(
        model(
            {
                "encoder_token_ids": IDS.astype("int32"),
                "encoder_padding_mask": MASK.astype(bool),
                "decoder_token_ids": decoder.astype("int32"),
                "decoder_padding_mask": np.ones(decoder.shape, bool),
            }
        )
    )


def _decoder(folder):
    start = json.loads((folder / "seq2seq_config.json").read_text())["decoder_start_token_ids"]
    return np.concatenate([np.array([start] * 2), DECODER[:, 2:]], axis=1), start


def test_the_folder_holds_transformers_configs(exported):
    _, folder, report = exported
    assert report["transformers"]["files"] == ["config.json", "generation_config.json"]
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == report["transformers"]["model_type"]
    assert config["model_type"] == type(exported[0].backbone).__name__[: -len("Backbone")].lower()
    assert config["is_encoder_decoder"] and config["forced_eos_token_id"] is None


def test_optimum_computes_keras_hubs_logits_from_the_folder(exported):
    import torch
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    model, folder, _ = exported
    loaded = ORTModelForSeq2SeqLM.from_pretrained(folder)
    assert loaded.decoder.is_merged  # decoder_model_merged.onnx, its If
    decoder, _ = _decoder(folder)
    with torch.no_grad():
        out = loaded(
            input_ids=torch.tensor(IDS),
            attention_mask=torch.tensor(MASK),
            decoder_input_ids=torch.tensor(decoder),
        )
    np.testing.assert_allclose(out.logits.numpy(), _keras_logits(model, decoder), atol=1e-4)


def test_optimums_generation_gives_our_tokens(exported):
    import torch
    from optimum.onnxruntime import ORTModelForSeq2SeqLM

    _, folder, _ = exported
    loaded = ORTModelForSeq2SeqLM.from_pretrained(folder)
    _, start = _decoder(folder)
    theirs = loaded.generate(
        input_ids=torch.tensor(IDS),
        attention_mask=torch.tensor(MASK),
        max_new_tokens=NEW_TOKENS + 1 - len(start),
        do_sample=False,
        num_beams=1,
    ).numpy()
    feeds = {
        "encoder_token_ids": IDS,
        "encoder_padding_mask": MASK,
        "decoder_token_ids": np.array([start] * 2),
    }
    ours = generate(folder, feeds, NEW_TOKENS + 1 - len(start))
    assert theirs.shape[1] <= ours.shape[1]
    np.testing.assert_array_equal(theirs, ours[:, : theirs.shape[1]])


# A field that moves each architecture's logits when it is wrong.
WRONG = {"bart": {"activation_function": "relu"}, "t5": {"feed_forward_proj": "gated-gelu"}}


def test_transformers_from_the_folders_config_computes_keras_hubs_logits(exported):
    """transformers' own BART or T5, built from the folder's `config.json`
    with keras-hub's weights copied in, computes keras-hub's logits; with
    one wrong field it does not (the check can fail)."""
    import torch

    from benchmarks.transformers_weights import transformers_model

    model, folder, _ = exported
    config = json.loads((folder / "config.json").read_text())
    decoder, _ = _decoder(folder)
    expected = _keras_logits(model, decoder)

    def logits(config):
        with torch.no_grad():
            return transformers_model(model, config)(
                input_ids=torch.tensor(IDS),
                attention_mask=torch.tensor(MASK),
                decoder_input_ids=torch.tensor(decoder),
            ).logits.numpy()

    np.testing.assert_allclose(logits(config), expected, atol=1e-4)
    wrong = logits({**config, **WRONG[config["model_type"]]})
    assert np.abs(wrong - expected).max() > 1e-3
