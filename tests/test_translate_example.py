"""`examples/translate.py`: the seed's Transformer, a plain Keras encoder-decoder, in ONNX Runtime.

The example's `Translator` is no keras-hub `Seq2SeqLM`: it follows the
protocol `--task seq2seq-lm` reads (`call_encoder`, `call_decoder_with_cache`,
`_initialize_cache`, and its start, end and pad ids as attributes), and has no
`generate_step`, so the folder's proof runs `seq2seq_folder.protocol_greedy`.
These tests check that reference against the model's own uncached forward
pass (the tutorial's loop), that the proof fails a folder whose tokens differ
from it, and that the example as a user runs it translates in ONNX Runtime
with Keras' tokens.
"""

import json

import numpy as np
import pytest

from keras_layers.export import ValidationFailed, export_model, seq2seq_folder
from keras_layers.export.errors import UsageError
from tests.scripts import ROOT, load_script

pytestmark = pytest.mark.tensorflow_only

SCRIPT = ROOT / "examples" / "translate.py"


@pytest.fixture(scope="module")
def example():
    return load_script(SCRIPT.relative_to(ROOT), "translate_example")


def untrained(example, layers=1):
    import keras

    keras.utils.set_random_seed(3)
    model = example.Translator(
        len(example.SOURCE_WORDS), len(example.TARGET_WORDS), width=32, layers=layers, heads=2
    )
    inputs, _, _ = next(example.training_batches(example.sentence_pairs(4, 0), 2, 0))
    model(inputs)  # built on a batch, as training builds it
    return model


def test_protocol_greedy_gives_the_uncached_forward_passes_tokens(example):
    """The proof's Keras reference for a model without `generate_step` (the
    protocol's cached call from fresh caches at every step) against the
    model's `call` on the whole output so far, as the tutorial's loop runs it,
    on sentences of different lengths in one padded batch."""
    model = untrained(example, layers=2)
    sentences = ["o gato preto vê um rato pequeno", "um cão ama o peixe", "o rato come"]
    expected = example.keras_translate(model, sentences, 6)
    ids, mask = example.encode(sentences, example.SOURCE_WORDS, framed=False)
    prompts = np.full((len(sentences), 1), example.START, "int32")
    got = seq2seq_folder.protocol_greedy(model, ids, mask, prompts, 6, example.END)
    assert got == [example.until_end(row[1:]) for row in expected]
    assert ids.shape[1] > mask.sum(axis=1).min()  # the batch was padded


def test_the_proof_fails_a_folder_that_differs_from_the_protocols_tokens(
    example, tmp_path, monkeypatch
):
    """The folder's greedy tokens are compared with `protocol_greedy`'s: a
    reference one token off fails the export, and nothing is placed."""
    model = untrained(example)
    greedy = seq2seq_folder.protocol_greedy

    def one_off(*args):
        rows = greedy(*args)
        return [[(row[0] + 1) % len(example.TARGET_WORDS), *row[1:]] for row in rows]

    monkeypatch.setattr(seq2seq_folder, "protocol_greedy", one_off)
    with pytest.raises(ValidationFailed, match="differs from keras-hub's on ids row 0"):
        export_model(model, f"{tmp_path}/translator/", task="seq2seq-lm")
    assert not (tmp_path / "translator").exists()


class _Plain:
    """Only what `special_ids` reads of a model without a preprocessor."""

    def __init__(self, **ids):
        self.__dict__.update(ids)


@pytest.mark.parametrize(
    ("ids", "named"),
    [
        ({"decoder_start_token_ids": "1"}, r"_Plain.decoder_start_token_ids is '1': give a tuple"),
        ({"decoder_start_token_ids": ()}, r"decoder_start_token_ids is \(\): give a tuple"),
        ({"decoder_start_token_ids": (1, -2)}, r"decoder_start_token_ids is \(1, -2\)"),
        ({"end_token_id": 2.0}, r"_Plain.end_token_id is 2.0: give an int >= 0"),
        ({"pad_token_id": True}, r"_Plain.pad_token_id is True: give an int >= 0"),
    ],
)
def test_a_plain_models_bad_special_ids_are_named(ids, named):
    with pytest.raises(UsageError, match=named):
        seq2seq_folder.special_ids(_Plain(**ids))


def test_a_plain_models_special_ids_are_read_and_default_to_none():
    assert seq2seq_folder.special_ids(_Plain()) == seq2seq_folder.Special(None, None, 0)
    read = seq2seq_folder.special_ids(
        _Plain(decoder_start_token_ids=[np.int64(4), 1], end_token_id=3, pad_token_id=5)
    )
    assert read == seq2seq_folder.Special((4, 1), 3, 5)


@pytest.mark.slow  # half a minute: training, the export and its proof
def test_the_example_as_published_learns_to_translate(example, tmp_path, capsys):
    """The script as a user runs it: 400 steps translate nearly every unseen
    sentence exactly, and exit 0 says ONNX Runtime gave the tutorial loop's
    tokens on every one; the folder's config holds the model's own ids."""
    folder = tmp_path / "translator"
    assert example.main(["--out", str(folder)]) == 0
    said = capsys.readouterr().out
    correct = int(said.split("Keras translates ")[1].split(" of ")[0])
    assert correct >= 190, said
    assert "proof passed" in said
    assert "ONNX Runtime gives Keras' tokens on 200 of 200 sentences" in said
    config = json.loads((folder / "seq2seq_config.json").read_text())
    assert config["decoder_start_token_ids"] == [example.START]
    assert (config["end_token_id"], config["pad_token_id"]) == (example.END, example.PAD)
