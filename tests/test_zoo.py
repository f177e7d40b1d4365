"""The zoo tier: every keras-hub text model, exported with the default flags.

The models are enumerated from `keras_hub.models` by tests/zoo_models.py (its
docstring states the rule that picks the text models) and built tiny, offline,
with redrawn weights. Each test exports one with no `shapes=`, as a user
would, asserts the report passed, then runs the file in ONNX Runtime on a feed
built here, independently of the validation grid: a right-padded batch of
rows of different lengths (encoder and decoder of different lengths), compared
with Keras on the valid positions.

Every model but `FAST` carries the `zoo` marker, which the default run
leaves out: `python -m pytest -m zoo tests/test_zoo.py` runs the rest (some
minutes). benchmarks/zoo.py runs the same models and renders the table of
docs/models.md, which the last test here checks against its JSON.
"""

import json

import keras
import pytest
import zoo_models

from keras_layers.export import ExportError, export_model, lean_loading
from tests import models

pytestmark = [
    pytest.mark.tensorflow_only,  # the export pipeline runs on TensorFlow
    # keras-hub's notes on its own tiny models (a softmax over one key-value
    # head, T5's attention dropping a mask it does not use), by the thousand.
    pytest.mark.filterwarnings("ignore::UserWarning:keras.*"),
]

# The default suite's share (about a minute): the families most users bring
# (an encoder, two decoders, two encoder-decoders), each through a task with
# its head where one exists (a task exports its backbone too), and FNet,
# whose Fourier mixing the trace rewrites as products with DFT tables.
FAST = (
    "LlamaBackbone",
    "BartBackbone",
    "BertMaskedLM",
    "BertTextClassifier",
    "GPT2CausalLM",
    "T5Seq2SeqLM",
    "FNetBackbone",
)
UNSUPPORTED = zoo_models.UNSUPPORTED
# The text models: the candidates of step 1 whose backbone, built, reads
# tokens alone (those that read images or audio are the vision zoo's,
# tests/test_zoo_vision.py).
MODELS = [
    model.name for model in zoo_models.candidates() if model.backbone not in zoo_models.READS_MEDIA
]


def _params(names):
    return [
        pytest.param(name, id=name, marks=() if name in FAST else pytest.mark.zoo) for name in names
    ]


def test_the_zoo_is_enumerated_from_keras_hub():
    """The lists here name classes keras-hub has, so none goes stale silently."""
    names = {model.name for model in zoo_models.enumerate_zoo()}
    assert set(FAST) <= set(MODELS)
    assert set(UNSUPPORTED) <= set(MODELS), set(UNSUPPORTED) - set(MODELS)
    assert len(names) > len(MODELS) > 40


# Models the export's lean loader hands to `keras.saving.load_model`
# (keras_layers/export/lean_loading.py): T5 computes with its weights while it
# is built; SigLIP's text encoder assigns to a variable's value directly.
LEAN_LOAD_FALLBACKS = ("SigLIPTextEncoder", "T5Backbone", "T5Seq2SeqLM")


@pytest.mark.parametrize("name", _params(MODELS))
def test_the_lean_load_gives_keras_own_model_or_leaves_it_to_keras(name, tmp_path):
    path = tmp_path / f"{name}.keras"
    zoo_models.build(name).save(path)

    lean = lean_loading.load(path)

    if name in LEAN_LOAD_FALLBACKS:
        assert lean is None
        return
    assert lean is not None
    models.assert_same_variables(lean, keras.saving.load_model(path, compile=False))


@pytest.mark.parametrize("name", _params([n for n in MODELS if n not in UNSUPPORTED]))
def test_exports_with_default_flags_and_matches_keras_on_a_padded_batch(name, tmp_path):
    model = zoo_models.build(name)
    output = tmp_path / f"{name}.onnx"
    report = export_model(model, output)
    assert report["passed"]
    feed = zoo_models.padded_feed(model, width=zoo_models.FEED_WIDTH.get(name))
    differences = zoo_models.parity(model, output, feed)
    assert max(differences.values()) <= zoo_models.FEED_ATOL, differences


@pytest.mark.parametrize("name", _params(sorted(UNSUPPORTED)))
def test_an_unsupported_model_fails_with_a_clear_export_error(name, tmp_path):
    """Not an internal error (exit 3): the user is told what is wrong, with the
    error and exit status the reason states. Once such an export passes (a
    pipeline bug fixed), this fails: move the model out of UNSUPPORTED."""
    model = zoo_models.build(name)
    with pytest.raises(ExportError) as caught:
        export_model(model, tmp_path / f"{name}.onnx")
    error = caught.value
    assert f"{type(error).__name__} (exit {error.exit_code})" in UNSUPPORTED[name], error


SEQ2SEQ = [name for name in MODELS if name.endswith("Seq2SeqLM")]
# The Seq2SeqLMs `--task seq2seq-lm` refuses, with the words the refusal must say.
SEQ2SEQ_REFUSED = {
    "EdRecSeq2SeqLM": "fails on 2 new tokens written into a cache of 3",
}


# keras-hub's Seq2SeqLMs whose encoder reads media: the vision and audio zoo
# (tests/zoo_vision.py) builds them, and these tests export their folders.
SEQ2SEQ_MEDIA = {
    "BLIP2Seq2SeqLM": "tests/test_seq2seq_image.py",
    "MoonshineAudioToText": "tests/test_seq2seq_speech.py",
}


def test_every_seq2seq_lm_of_keras_hub_is_in_the_seq2seq_column():
    """The column is enumerated like the rest of the zoo, not hand-picked:
    every `Seq2SeqLM` subclass keras-hub has is a text model of the column
    or one of the media models named above."""
    import keras_hub

    seq2seq_lms = {
        name
        for name in dir(keras_hub.models)
        if isinstance(getattr(keras_hub.models, name), type)
        and issubclass(getattr(keras_hub.models, name), keras_hub.models.Seq2SeqLM)
        and name != "Seq2SeqLM"
    }
    assert seq2seq_lms == set(SEQ2SEQ) | set(SEQ2SEQ_MEDIA)
    assert {"BartSeq2SeqLM", "T5Seq2SeqLM", "T5GemmaSeq2SeqLM"} <= set(SEQ2SEQ)


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.zoo) for n in SEQ2SEQ])
def test_a_seq2seq_lm_exports_as_a_folder_that_generates_or_is_refused_by_name(name, tmp_path):
    """`--task seq2seq-lm -o FOLDER/` with the default flags: the folder's
    proof passes (decoder steps, the files together, greedy tokens equal
    to keras-hub's), or the export is refused with exit 2 and the reason."""
    model = zoo_models.build(name)
    if name in SEQ2SEQ_REFUSED:
        with pytest.raises(ExportError, match=SEQ2SEQ_REFUSED[name]) as caught:
            export_model(model, f"{tmp_path}/folder/", task="seq2seq-lm")
        assert caught.value.exit_code == 2
        assert not (tmp_path / "folder").exists()
        return
    report = export_model(model, f"{tmp_path}/folder/", task="seq2seq-lm")
    assert report["passed"] and report["generation"]["ids"]["equal"]
    assert (tmp_path / "folder" / "decoder_model_merged.onnx").is_file()


def test_models_page_table_is_rendered_from_the_zoo_json():
    from benchmarks import zoo

    on_page = zoo.page_table()
    assert on_page is not None, f"no `<!-- table: {zoo.TABLE} -->` on {zoo.PAGE.name}"
    assert on_page == zoo.render(json.loads(zoo.RESULT.read_text())), (
        f"the zoo table of {zoo.PAGE.name} differs from {zoo.RESULT.name}; "
        "run `python benchmarks/zoo.py --table` (or the whole `python benchmarks/zoo.py`)"
    )
