"""Encoders that take strings: a keras-hub classifier with its preprocessor in one ONNX file.

Two tiny classifiers are built offline: a BERT one on a WordPiece vocabulary
computed by keras-hub, and a RoBERTa one on a byte-level BPE vocabulary
trained by `tokenizers`. Each is exported with `export_text_model`, which
validates against `predict` on strings (a padded batch of mixed lengths, a
text longer than the sequence length, one text alone, pairs); the placed file
is then run the way a user runs it (onnxruntime with onnxruntime-extensions'
library registered) on texts it was not validated on, against a second
oracle, the preprocessor and the task called directly. Then the proof is proved: tokenizer
graphs broken on purpose (lowercasing off, an off-by-one sequence length, a
wrong pad id) and a model with changed weights must fail validation, and an
export that fails places nothing.
"""

import json
from dataclasses import replace
from types import SimpleNamespace

import keras_hub
import numpy as np
import onnx
import onnxruntime
import pytest
import tensorflow as tf
from onnxruntime_extensions import get_library_path
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from keras_layers.export import export_model, text_model
from keras_layers.export.cli import main
from keras_layers.export.errors import UsageError, ValidationFailed
from keras_layers.export.options import ExportOptions
from keras_layers.export.text_model import (
    SAMPLE_TEXTS,
    check_text_model,
    compose,
    export_text_model,
    plan_text,
    text_graph,
    validation_texts,
)

pytestmark = [
    pytest.mark.tensorflow_only,  # the export pipeline runs on TensorFlow
    pytest.mark.xdist_group("text_model"),  # module fixtures: one worker (loadgroup)
]

LENGTH = 16
TRAINING = [
    *SAMPLE_TEXTS,
    "A tokenizer splits words into pieces; a classifier reads the pieces.",
    "Short one. Another rather longer sentence, with more words than the sequence holds.",
] * 8
# Not in the validation set: the placed file must hold on texts it was not checked on.
UNSEEN = [
    "the lazy dog",
    "Pieces of words, and words into pieces: " * 6,
    "",
    "A classifier reads THE PIECES",
]


def _bert_classifier(**tokenizer_options):
    vocabulary = keras_hub.tokenizers.compute_word_piece_vocabulary(
        tf.data.Dataset.from_tensor_slices(TRAINING),
        vocabulary_size=300,
        lowercase=True,
        reserved_tokens=["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"],
    )
    tokenizer = keras_hub.models.BertTokenizer(
        vocabulary=vocabulary, lowercase=True, **tokenizer_options
    )
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=len(vocabulary),
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=32,
    )
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        tokenizer, sequence_length=LENGTH
    )
    return keras_hub.models.BertTextClassifier(backbone, num_classes=3, preprocessor=preprocessor)


@pytest.fixture(scope="module")
def bert():
    return _bert_classifier()


@pytest.fixture(scope="module")
def roberta():
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    trained.train_from_iterator(TRAINING, trainer)
    model = json.loads(trained.to_str())["model"]
    merges = [" ".join(pair) for pair in model["merges"]]
    tokenizer = keras_hub.models.RobertaTokenizer(vocabulary=model["vocab"], merges=merges)
    backbone = keras_hub.models.RobertaBackbone(
        vocabulary_size=len(model["vocab"]),
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=32,
    )
    preprocessor = keras_hub.models.RobertaTextClassifierPreprocessor(
        tokenizer, sequence_length=LENGTH
    )
    return keras_hub.models.RobertaTextClassifier(
        backbone, num_classes=2, preprocessor=preprocessor
    )


def _run(path, texts, pairs=None):
    """The placed file, run as the docs tell a user to."""
    options = onnxruntime.SessionOptions()
    options.register_custom_ops_library(get_library_path())
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = {"text": np.array(texts, dtype=object)}
    if pairs is not None:
        feeds["text_pair"] = np.array(pairs, dtype=object)
    return session.run(None, feeds)[0]


def _keras_logits(task, texts, pairs=None):
    """A second oracle beside the export's `predict`: the preprocessor, then the task."""
    x = tf.constant(texts) if pairs is None else (tf.constant(texts), tf.constant(pairs))
    return np.asarray(task(task.preprocessor(x=x)))


def _export_with_the_command(task, folder) -> dict:
    """`MODEL.keras --with-preprocessor --text-pairs -o OUT.onnx`, as a user types it;
    returns the report it wrote."""
    task.save(folder / "bert.keras")  # a saved task keeps its preprocessor
    output = folder / "bert pairs.onnx"
    argv = [str(folder / "bert.keras"), "--with-preprocessor", "--text-pairs", "-o", str(output)]
    assert main([*argv, "-q"]) == 0
    return json.loads(output.with_name("bert pairs.report.json").read_text())


@pytest.fixture(scope="module")
def exported(bert, roberta, tmp_path_factory):
    """The API for two cases (`export_model` with `preprocessor=True`, and
    `export_text_model` itself), the command for the third."""
    folder = tmp_path_factory.mktemp("text_model")
    with_preprocessor = ExportOptions(preprocessor=True)
    return {
        "bert": (bert, False, export_model(bert, folder / "bert.onnx", with_preprocessor)),
        "bert pairs": (bert, True, _export_with_the_command(bert, folder)),
        "roberta": (roberta, False, export_text_model(roberta, folder / "roberta.onnx")),
    }


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--text-pairs"], "--text-pairs: only with --with-preprocessor"),
        (["--with-preprocessor"], "MODEL: not taken with --with-preprocessor; the demo has"),
        (["M.keras", "--with-preprocessor", "--task", "causal-lm"], "--task causal-lm: not taken"),
    ],
)
def test_the_command_refuses_what_strings_in_does_not_take(argv, message, tmp_path, capsys):
    # M.keras exists (a missing model is said first, before any flag is read).
    model = tmp_path.parent / f"{tmp_path.name}_M.keras"
    model.write_bytes(b"")
    argv = [str(model) if arg == "M.keras" else arg for arg in argv]
    assert main([*argv, "-o", str(tmp_path / "x.onnx")]) == 2
    err = capsys.readouterr().err
    assert message in " ".join(err.split()), err
    assert list(tmp_path.iterdir()) == []


# --- Strings in, the classifier's logits out -------------------------------------------


@pytest.mark.slow  # three exports (a minute); the default suite keeps one
@pytest.mark.parametrize("name", ["bert", "bert pairs", "roberta"])
def test_the_file_gives_predicts_logits_on_strings(exported, name):
    task, pairs, report = exported[name]
    assert report["passed"] and report["text"]["passed"]
    assert {check["shape"] for check in report["text"]["checks"]} == {
        f"{n} {'pairs' if pairs else 'texts'}" for n in (1, len(SAMPLE_TEXTS) + 1)
    }
    second = UNSEEN[::-1] if pairs else None
    got = _run(report["onnx_path"], UNSEEN, second)
    np.testing.assert_allclose(got, _keras_logits(task, UNSEEN, second), atol=1e-5, rtol=1e-4)


def test_the_validation_set_truncates_and_pads(bert):
    texts = validation_texts(plan_text(bert))
    lengths = [int(np.sum(row)) for row in bert.preprocessor(tf.constant(texts))["padding_mask"]]
    assert max(lengths) == LENGTH and min(lengths) < LENGTH
    assert len(bert.preprocessor.tokenizer.tokenize(texts[-1])) > LENGTH


@pytest.mark.slow  # three exports (a minute); the default suite keeps one
def test_each_family_has_its_operator(exported):
    assert exported["bert"][2]["text"]["operator"] == "BertTokenizer"
    assert exported["roberta"][2]["text"]["operator"] == "HfJsonTokenizer"
    assert exported["bert pairs"][2]["text"]["inputs"] == ["text", "text_pair"]


@pytest.mark.slow  # three exports (a minute); the default suite keeps one
def test_the_operators_gaps_on_the_stress_corpus(exported):
    # HfJsonTokenizer reads C strings; the rest of the corpus it tokenizes as keras-hub.
    assert all("\x00" in text for text in exported["roberta"][2]["text"]["operator_differences"])
    # BertTokenizer differs on accents, case folding, Unicode spaces and unknown pieces;
    # plain ASCII words of the vocabulary it tokenizes as keras-hub.
    differences = exported["bert"][2]["text"]["operator_differences"]
    assert differences and not set(differences) & set(SAMPLE_TEXTS)


def test_roberta_pairs_pack_as_the_preprocessor(roberta):
    plan = plan_text(roberta)
    inputs = {"token_ids": onnx.TensorProto.INT32, "padding_mask": onnx.TensorProto.BOOL}
    graph = text_graph(plan, inputs, pairs=True)
    options = onnxruntime.SessionOptions()
    options.register_custom_ops_library(get_library_path())
    session = onnxruntime.InferenceSession(graph.SerializeToString(), options)
    first, second = validation_texts(plan), validation_texts(plan)[::-1]
    ids, mask = session.run(None, {"text": np.array(first), "text_pair": np.array(second)})
    packed = roberta.preprocessor(x=(tf.constant(first), tf.constant(second)))
    np.testing.assert_array_equal(ids, packed["token_ids"])
    np.testing.assert_array_equal(mask, packed["padding_mask"])


# --- The proof, proved ------------------------------------------------------------------


@pytest.fixture(scope="module")
def bert_ids_model(bert, tmp_path_factory):
    path = tmp_path_factory.mktemp("ids") / "bert.onnx"
    export_model(bert, path, ExportOptions(shapes=[(1, LENGTH)]))
    return onnx.load(str(path))


def _attributes(plan, **changes):
    return replace(plan, attributes={**plan.attributes, **changes})


@pytest.mark.parametrize(
    "break_it",
    [
        lambda plan: _attributes(plan, do_lower_case=0),
        lambda plan: replace(plan, sequence_length=plan.sequence_length - 1),
        lambda plan: replace(plan, pad_id=plan.pad_id + 4),
        lambda plan: replace(plan, truncate="waterfall"),
    ],
    ids=["no lowercasing", "off-by-one length", "wrong pad id", "waterfall for round robin"],
)
def test_a_broken_tokenizer_graph_fails_with_the_text_and_both_ids(bert, bert_ids_model, break_it):
    plan = break_it(plan_text(bert))
    model = onnx.ModelProto.FromString(bert_ids_model.SerializeToString())
    inputs = {entry.name: entry.type.tensor_type.elem_type for entry in model.graph.input}
    text = text_graph(plan, inputs, pairs=True)
    validation = check_text_model(
        bert, plan, text, compose(text, model), validation_texts(plan), pairs=True, corpus=()
    )
    assert not validation.passed
    difference = validation.ids_difference
    assert difference["keras"] != difference["onnx"]
    assert repr(difference["text"]) in validation.failure()


def test_changed_weights_fail_on_the_logits(bert, bert_ids_model):
    plan = plan_text(bert)
    model = onnx.ModelProto.FromString(bert_ids_model.SerializeToString())
    # The head's kernel: the one float matrix from the hidden size to the 3 classes.
    (kernel,) = [t for t in model.graph.initializer if t.dims == [8, 3]]
    changed = onnx.numpy_helper.to_array(kernel) + np.float32([0.5, 0.0, -0.5])
    kernel.CopyFrom(onnx.numpy_helper.from_array(changed, kernel.name))
    inputs = {entry.name: entry.type.tensor_type.elem_type for entry in model.graph.input}
    text = text_graph(plan, inputs)
    composed = compose(text, model)
    validation = check_text_model(bert, plan, text, composed, validation_texts(plan), corpus=())
    assert validation.ids_difference is None
    assert not validation.passed and "differs from predict" in validation.failure()


def test_a_failed_export_places_nothing(bert, tmp_path, monkeypatch):
    real = text_model.plan_text
    monkeypatch.setattr(text_model, "plan_text", lambda task: replace(real(task), pad_id=4))
    bert.save(tmp_path / "bert.keras")  # a saved task keeps its preprocessor
    output = tmp_path / "broken.onnx"
    with pytest.raises(ValidationFailed, match="differ from the preprocessor's") as caught:
        export_text_model(tmp_path / "bert.keras", output)
    assert caught.value.exit_code == 1
    assert caught.value.report["text"]["ids_difference"]["onnx"][-1] == 4
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bert.keras"]


# --- Bad input --------------------------------------------------------------------------


def test_a_task_without_a_preprocessor_is_refused(bert):
    bare = SimpleNamespace(preprocessor=None)
    with pytest.raises(UsageError, match="no preprocessor with a tokenizer or an image converter"):
        export_text_model(bare, "never.onnx")


def test_a_tokenizer_without_an_operator_is_refused():
    task = SimpleNamespace(
        preprocessor=SimpleNamespace(tokenizer=keras_hub.tokenizers.ByteTokenizer())
    )
    with pytest.raises(UsageError, match="ByteTokenizer"):
        plan_text(task)


def test_special_tokens_in_strings_is_refused():
    task = _bert_classifier(special_tokens_in_strings=True)
    with pytest.raises(UsageError, match="special_tokens_in_strings"):
        plan_text(task)
