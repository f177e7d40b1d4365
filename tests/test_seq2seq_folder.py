"""`--task seq2seq-lm -o FOLDER/` and `generate` on its folder.

keras-hub's BART (byte-level BPE) and T5 (SentencePiece unigram), built tiny
with their preprocessors and redrawn weights, exported once per module.
keras-hub's own `generate` (greedy sampler) is the oracle of the text, its
`generate_step` of the ids; the folder's proof is itself proved by a folder
whose files disagree."""

import json
import shutil
import subprocess
import sys

import keras
import numpy as np
import onnx
import onnx.numpy_helper
import pytest
import sentencepiece

from keras_layers.export import ExportOptions, export_model, generate, merged_decoder, seq2seq
from keras_layers.export import seq2seq_folder as folder_module
from keras_layers.export.errors import DecoderFileError, UsageError, ValidationFailed
from keras_layers.export.seq2seq_generation import CONFIG_FILE, DECODER_FILE, ENCODER_FILE
from tests import zoo_models
from tests.test_generate_arguments import tiny_gpt2
from tests.zoo_tokenizers import byte_pair_vocabulary

# Tests of the `exported` folders share one worker (tests/conftest.py groups
# the users of a module fixture); the others are handed out one by one.
pytestmark = pytest.mark.tensorflow_only

TRAINING = [
    "The quick brown fox jumps over the lazy dog.",
    "Machine learning turns text into token ids and back again.",
    "Привет мир, καλημέρα κόσμε, 你好世界.",
] * 20
TEXTS = ["the lazy fox", "Hi", "Machine learning turns text into ids again and again."]


def _bart_tokenizer():
    import keras_hub

    vocabulary, merges = byte_pair_vocabulary(("<s>", "<pad>", "</s>", "<unk>", "<mask>"))
    return keras_hub.models.BartTokenizer(vocabulary=vocabulary, merges=merges)


def _t5_tokenizer():
    import io

    import keras_hub

    proto = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAINING),
        model_writer=proto,
        model_type="unigram",
        vocab_size=120,
        hard_vocab_limit=False,
        minloglevel=2,
        **dict(pad_id=0, eos_id=1, unk_id=2, bos_id=-1),
    )
    return keras_hub.models.T5Tokenizer(proto=proto.getvalue())


def seq2seq_lm(kind: str, with_preprocessor: bool = True):
    """A tiny BART or T5 `Seq2SeqLM`, weights redrawn."""
    import keras_hub

    keras.utils.set_random_seed(0)
    preprocessor = None
    if kind == "bart":
        tokenizer = _bart_tokenizer() if with_preprocessor else None
        vocabulary = tokenizer.vocabulary_size() if tokenizer else 60
        backbone = keras_hub.models.BartBackbone(
            vocabulary_size=vocabulary, num_layers=2, num_heads=2, hidden_dim=8,
            intermediate_dim=16, max_sequence_length=32,
        )  # fmt: skip
        if tokenizer:
            preprocessor = keras_hub.models.BartSeq2SeqLMPreprocessor(
                tokenizer, encoder_sequence_length=16, decoder_sequence_length=16
            )
        model = keras_hub.models.BartSeq2SeqLM(backbone, preprocessor=preprocessor)
    else:
        tokenizer = _t5_tokenizer() if with_preprocessor else None
        vocabulary = tokenizer.vocabulary_size() if tokenizer else 60
        backbone = keras_hub.models.T5Backbone(
            vocabulary_size=vocabulary, num_layers=2, num_heads=2, hidden_dim=8,
            intermediate_dim=16,
        )  # fmt: skip
        if tokenizer:
            preprocessor = keras_hub.models.T5Seq2SeqLMPreprocessor(
                tokenizer, encoder_sequence_length=16, decoder_sequence_length=16
            )
        model = keras_hub.models.T5Seq2SeqLM(backbone, preprocessor=preprocessor)
    return zoo_models.redraw(model, 0)


@pytest.fixture(scope="module", params=["bart", "t5"])
def exported(request, tmp_path_factory):
    model = seq2seq_lm(request.param)
    folder = tmp_path_factory.mktemp(request.param) / "folder"
    report = export_model(model, f"{folder}/", task="seq2seq-lm")
    return model, folder, report


def _keras_generate(model, texts, max_length):
    from keras_hub.samplers import GreedySampler

    model.sampler, model.generate_function = GreedySampler(), None
    return [str(text) for text in model.generate(list(texts), max_length=max_length)]


def test_the_folder_holds_its_files_and_its_proof(exported):
    _, folder, report = exported
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    sentencepiece = ["spiece.model"] if "T5" in type(exported[0]).__name__ else []
    assert names == sorted(
        [ENCODER_FILE, DECODER_FILE, CONFIG_FILE, "report.json", "tokenizer.json",
         "tokenizer_config.json", "special_tokens_map.json", "config.json",
         "generation_config.json", *sentencepiece]
    )  # fmt: skip
    assert report["passed"] and report["encoder"]["passed"] and report["decoder"]["passed"]
    proof = report["generation"]
    assert proof["composed"]["equal"] and proof["ids"]["equal"] and proof["text"]["equal"]
    assert proof["ids"]["reference"] == "keras-hub's generate_step"
    assert json.loads((folder / "report.json").read_text())["passed"]


def test_the_cross_attention_keys_and_values_are_projected_in_the_first_step_alone(exported):
    """optimum's merged decoder: its `with_past` branch (every step after the
    first) reads nothing computed from the encoder's output; its first step
    projects it, two matrix products a layer at least; the encoder file
    returns its output alone."""
    _, folder, report = exported
    merged = onnx.load(str(folder / DECODER_FILE))
    census = merged_decoder.branch_census(merged)
    assert census == report["merged"]["branches"]
    layers = json.loads((folder / CONFIG_FILE).read_text())["layers"]
    assert census["with_past"]["read_encoder_output"] == 0
    assert census["first_step"]["read_encoder_output"] > 0
    products = census["first_step"]["weight_products"]
    assert products >= census["with_past"]["weight_products"] + 2 * layers
    encoder = onnx.load(str(folder / ENCODER_FILE))
    assert [output.name for output in encoder.graph.output] == ["last_hidden_state"]
    reads = [node for node in merged.graph.node if "encoder_hidden_states" in node.input]
    assert not reads  # the outer graph holds the If alone


def test_the_folders_tokenizer_is_keras_hubs_on_the_stress_corpus(exported):
    """What `generate` encodes text with (T5: the folder's `spiece.model`
    framed as `tokenizer.json` frames; BART: `tokenizer.json`) gives
    keras-hub's preprocessor's encoder ids on every text of the stress
    corpus, and keras-hub's text back from ids (start, end and pad ids
    removed first, as keras-hub's `generate_postprocess` removes them)."""
    from keras_layers.export import Seq2SeqFolder
    from keras_layers.export.tokenizer_files.corpus import STRESS_CORPUS

    model, folder, _ = exported
    tokenizer = Seq2SeqFolder(folder).tokenizer()
    texts = [text for text in STRESS_CORPUS if text]
    packed = model.preprocessor.generate_preprocess(texts)
    ids, mask = (np.asarray(packed[key]) for key in ("encoder_token_ids", "encoder_padding_mask"))
    expected = [ids[row][mask[row].astype(bool)].tolist() for row in range(len(texts))]
    assert [tokenizer.encode(text).ids for text in texts] == expected
    if (folder / "spiece.model").is_file():  # the check can fail: tokenizer.json's own gaps
        from keras_layers.export.decoding import _folder_tokenizer

        framed = _folder_tokenizer(folder / "tokenizer.json", truncate=True)
        assert [framed.encode(text).ids for text in texts] != expected
    special = model.preprocessor.tokenizer
    dropped = {special.start_token_id, special.end_token_id, special.pad_token_id} - {None}
    for text in texts:
        row = [t for t in np.asarray(special(text)).tolist() if t not in dropped]
        keras_text = special.detokenize(np.asarray([row], "int32"))[0]
        keras_text = keras_text.decode() if isinstance(keras_text, bytes) else str(keras_text)
        assert tokenizer.decode(row, skip_special_tokens=False) == keras_text, text


def test_generate_gives_keras_hubs_greedy_text(exported):
    """Texts of other lengths than the export's proof, batched and alone,
    against keras-hub's `generate` with a greedy sampler."""
    model, folder, _ = exported
    config = json.loads((folder / CONFIG_FILE).read_text())
    start = len(config["decoder_start_token_ids"])
    expected = _keras_generate(model, TEXTS, start + 9)
    assert generate(folder, TEXTS, 9) == expected
    assert generate(folder, TEXTS[1], 9) == expected[1]


def test_generate_gives_keras_hubs_greedy_ids_on_a_padded_batch(exported):
    model, folder, _ = exported
    rng = np.random.default_rng(3)
    vocabulary = json.loads((folder / CONFIG_FILE).read_text())["vocabulary"]
    lengths = np.array([[11], [6], [1]])
    mask = np.arange(11) < lengths
    ids = np.where(mask, rng.integers(3, vocabulary, mask.shape), 0).astype("int32")
    prompts = np.array([[5, 7], [9, 4], [6, 2]], "int32")
    expected = folder_module.keras_greedy(model, ids, mask, prompts, 10, None)
    feeds = {"encoder_token_ids": ids, "encoder_padding_mask": mask, "decoder_token_ids": prompts}
    tokens = generate(folder, feeds, 10, end_token_id=None)
    assert tokens.shape == (3, 12)
    np.testing.assert_array_equal(tokens[:, :2], prompts)
    assert tokens[:, 2:].tolist() == expected


def test_the_proof_fails_a_folder_whose_encoder_is_another_models(exported, tmp_path):
    """The composed check: each file passes alone, but an encoder file of
    another model's weights feeds the decoder keys and values that are not
    its own."""
    model, folder, _ = exported
    described = seq2seq.describe(model)
    staged = tmp_path / "staged"
    shutil.copytree(folder, staged, symlinks=False)
    assert folder_module.composed(model, staged, described, ExportOptions())["equal"]
    other = zoo_models.redraw(seq2seq_lm(type(model).__name__[: -len("Seq2SeqLM")].lower()), 7)
    export_model(seq2seq.encoder_model(other), staged / ENCODER_FILE)
    checked = folder_module.composed(model, staged, described, ExportOptions())
    assert not checked["equal"]


def test_the_proof_fails_a_merged_decoder_whose_first_step_projects_otherwise(exported, tmp_path):
    """The first step's projections (the `If`'s else branch) are proved by
    the composed check: layer 0's value projection x1.01 fails it, though
    every later step reads what the first returned."""
    model, folder, _ = exported
    staged = tmp_path / "staged"
    shutil.copytree(folder, staged, symlinks=False)
    merged = onnx.load(str(staged / DECODER_FILE))
    weights = {init.name: init for init in merged.graph.initializer}
    first = next(a.g for a in merged.graph.node[0].attribute if a.g.name == "first_step")
    producers = {name: node for node in first.node for name in node.output}
    node = producers["cross/present.0.encoder.value"]
    while not (node.op_type in ("MatMul", "Gemm") and node.input[1] in weights):
        node = producers[node.input[0]]  # back to layer 0's value projection
    projections = [node.input[1]]
    scaled = weights[projections[0]]
    value = onnx.numpy_helper.to_array(scaled) * np.float32(1.01)
    scaled.CopyFrom(onnx.numpy_helper.from_array(value, scaled.name))
    onnx.save(merged, str(staged / DECODER_FILE))
    checked = folder_module.composed(model, staged, seq2seq.describe(model), ExportOptions())
    assert not checked["equal"]


def test_a_failed_proof_places_nothing(monkeypatch, tmp_path):
    """A folder of the user's keeps its files when the proof fails."""
    model = seq2seq_lm("bart", with_preprocessor=False)
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    failing = {"passed": False, "composed": {"equal": True}, "ids": {"equal": False}}
    failing["ids"].update(keras=[[1, 2]], onnx=[[1, 3]])
    monkeypatch.setattr(folder_module, "prove_folder", lambda *args: failing)
    with pytest.raises(ValidationFailed, match="differs from keras-hub's on ids row 0"):
        export_model(model, f"{folder}/", task="seq2seq-lm")
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == ["notes.txt"]


def test_a_model_without_its_preprocessor_generates_from_ids(tmp_path):
    model = seq2seq_lm("t5", with_preprocessor=False)
    report = export_model(model, f"{tmp_path}/t5/", task="seq2seq-lm")
    assert report["passed"] and "tokenizer" not in report
    assert report["config"]["decoder_start_token_ids"] is None
    with pytest.raises(ValueError, match="names no decoder start tokens.*decoder_token_ids"):
        generate(tmp_path / "t5", [[4, 5, 6]], 3)
    with pytest.raises(ValueError, match="text needs a tokenizer"):
        generate(tmp_path / "t5", "some text", 3)
    feeds = {"encoder_token_ids": [[4, 5, 6]], "decoder_token_ids": [[0]]}
    assert generate(tmp_path / "t5", feeds, 3).shape == (1, 4)


# The slow tier: the default run's command-line test exports an int8 folder too.
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_quantized_folder_is_written_beside_the_float_one_and_gated(tmp_path, kind):
    """`quantize` adds FOLDER/<kind>/: both files' weights in `MatMulNBits`,
    the config and tokenizer copied, judged by greedy agreement and the log
    probability change against Keras; it generates like any folder."""
    import onnx

    model = seq2seq_lm("bart", with_preprocessor=True)
    report = export_model(model, f"{tmp_path}/bart/", ExportOptions(quantize=kind),
                          task="seq2seq-lm")  # fmt: skip
    gate = report["quantized"][kind]
    assert report["passed"] and gate["passed"] and gate["failure"] == ""
    assert gate["greedy_agreement"] >= 0.5 and gate["mean_abs_log_prob_change"] <= 0.25
    sub = tmp_path / "bart" / kind
    encoder = onnx.load(str(sub / ENCODER_FILE)).graph
    assert "MatMulNBits" in {node.op_type for node in encoder.node}
    merged = onnx.load(str(sub / DECODER_FILE))
    for branch in merged_decoder.branch_census(merged).values():  # both branches' products
        assert branch["weight_products"] > 0
        assert branch["weight_products"] == branch["matmul_nbits"]
    assert {CONFIG_FILE, "tokenizer.json"} <= {path.name for path in sub.iterdir()}
    assert isinstance(generate(sub, "a short text", 3), str)


# 14 s: CI runs it with the slow tier; the default suite keeps the float folder's
# failed proof placing nothing (`test_a_failed_proof_places_nothing`).
@pytest.mark.slow
def test_a_quantized_folder_that_fails_its_gate_places_nothing(tmp_path):
    """A gate no quantized file can pass (no log-probability change at all):
    ValidationFailed naming the measure, nothing placed, the refused folder
    kept beside FOLDER for a look."""
    model = seq2seq_lm("bart", with_preprocessor=False)
    options = ExportOptions(quantize="int8", decoder_max_nll_change=0.0)
    with pytest.raises(ValidationFailed, match=r"int8 folder fails its gate: mean \|log p"):
        export_model(model, f"{tmp_path}/bart/", options, task="seq2seq-lm")
    assert not (tmp_path / "bart").exists()
    assert (tmp_path / "bart.int8.failed" / CONFIG_FILE).is_file()


# --- bad input -------------------------------------------------------------------


def test_a_decoder_only_model_is_refused_naming_causal_lm(tmp_path):
    with pytest.raises(UsageError, match="has no `call_encoder`.*--task causal-lm"):
        export_model(tiny_gpt2(), f"{tmp_path}/gpt2/", task="seq2seq-lm")
    assert not (tmp_path / "gpt2").exists()


@pytest.mark.parametrize(
    ("output", "options", "message"),
    [
        ("bart.onnx", ExportOptions(), "writes a folder.*FOLDER/"),
        ("bart/", ExportOptions(shapes=[(1, 3)]), "shapes=.*not taken by --task seq2seq"),
        ("bart/", ExportOptions(sampler="top_k"), "only with task='causal-lm'"),
    ],
)
def test_options_a_seq2seq_folder_does_not_take_are_refused(tmp_path, output, options, message):
    model = seq2seq_lm("bart", with_preprocessor=False)
    with pytest.raises(UsageError, match=message):
        export_model(model, str(tmp_path / output) + ("/" if output.endswith("/") else ""),
                     options, task="seq2seq-lm")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_generate_refuses_what_the_folder_cannot_take(exported):
    model, folder, _ = exported
    config = json.loads((folder / CONFIG_FILE).read_text())
    vocabulary, limit = config["vocabulary"], config["max_encoder_length"]
    with pytest.raises(ValueError, match=rf"encoder_token_ids\[0, 1\]={vocabulary}: outside"):
        generate(folder, [[3, vocabulary]], 2)
    with pytest.raises(ValueError, match="a dict of keys.*give keras-hub's"):
        generate(folder, {"token_ids": [[3]]}, 2)
    with pytest.raises(ValueError, match="max_new_tokens=0: must be at least 1"):
        generate(folder, "text", 0)
    if limit is not None:  # BART's position table; T5's relative positions have none
        with pytest.raises(ValueError, match=f"{limit + 1} tokens, but the model's position"):
            generate(folder, [[3] * (limit + 1)], 2)
        with pytest.raises(ValueError, match="decoder's prompt and max_new_tokens=40: 42 tokens"):
            generate(folder, [[3, 4]], 40)


def test_a_damaged_config_is_named(exported, tmp_path):
    _, folder, _ = exported
    damaged = tmp_path / "damaged"
    shutil.copytree(folder, damaged)
    (damaged / CONFIG_FILE).unlink()  # a link into the store: replaced by a file
    (damaged / CONFIG_FILE).write_text('{"format": "keras-layers seq2seq-lm", "layers": "2"}')
    with pytest.raises(DecoderFileError, match=r'seq2seq_config.json: "layers" is \'2\''):
        generate(damaged, "text", 2)


def test_a_damaged_tokenizer_is_named_with_the_seq2seq_export_to_run_again(exported, tmp_path):
    _, folder, _ = exported
    damaged = tmp_path / "damaged"
    shutil.copytree(folder, damaged)
    (damaged / "tokenizer.json").unlink()
    (damaged / "tokenizer.json").write_text('{"model": 3}')
    with pytest.raises(DecoderFileError, match=r"tokenizer.json: .*--task seq2seq-lm -o FOLDER/"):
        generate(damaged, "text", 2)


def test_generating_imports_neither_tensorflow_nor_keras(exported):
    _, folder, _ = exported
    code = f"""
import sys
from keras_layers.export import generate
generate({str(folder)!r}, ["one text", "two"], 4)
print(sorted(m for m in ("tensorflow", "keras", "tf2onnx") if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_command_line_refuses_a_file_output_for_seq2seq(tmp_path):
    model = seq2seq_lm("bart", with_preprocessor=False)
    path = tmp_path / "bart.keras"
    model.save(path)
    command = [sys.executable, "export/to_onnx.py", str(path), "--task", "seq2seq-lm"]
    result = subprocess.run([*command, "-o", str(tmp_path / "bart.onnx")], capture_output=True,
                            text=True)  # fmt: skip
    assert result.returncode == 2
    assert "--task seq2seq-lm writes a folder" in result.stderr + result.stdout


def test_the_command_line_exports_a_quantized_folder_and_says_what_it_proved(tmp_path, capsys):
    """A seq2seq report is no file's: the command prints the files' checks,
    the folder's proof and the gate (it used to end in exit 3, a KeyError).
    `--decoder-accuracy-level 1` reaches the quantized files only (the float
    files are proved at the default)."""
    from keras_layers.export import cli

    model = seq2seq_lm("bart", with_preprocessor=False)
    path = tmp_path / "bart.keras"
    model.save(path)
    argv = [str(path), "--task", "seq2seq-lm", "--quantize", "int8", "-o", f"{tmp_path}/out/"]
    assert cli.main([*argv, "--decoder-accuracy-level", "1"]) == 0
    said = " ".join(capsys.readouterr().out.split())  # rich wraps at the terminal's width
    assert "greedy tokens = keras-hub's on 3 padded rows" in said
    assert "first step's cross-attention projections" in said and "optimum" not in said
    assert "int8" in said and "greedy agreement" in said and "passed" in said
    assert (tmp_path / "out" / "int8" / DECODER_FILE).is_file()


def test_special_ids_outside_the_vocabulary_are_refused_by_name():
    special = folder_module.Special((1,), 99, 0)
    with pytest.raises(UsageError, match="str's end_token_id holds 99: outside the vocabulary"):
        folder_module._check_special("model", special, 50)
    folder_module._check_special("model", folder_module.Special((1,), 49, 0), 50)


@pytest.mark.slow
def test_the_command_line_names_a_failed_quantized_gate_with_exit_1(tmp_path, capsys):
    """The folder's report is no file's: the command says why and exits 1
    (it used to fail rendering the report, a KeyError)."""
    from keras_layers.export import cli

    model = seq2seq_lm("bart", with_preprocessor=False)
    path = tmp_path / "bart.keras"
    model.save(path)
    argv = [str(path), "--task", "seq2seq-lm", "--quantize", "int8", "-o", f"{tmp_path}/out/"]
    argv += ["--decoder-max-nll-change", "0"]
    assert cli.main(argv) == 1
    said = capsys.readouterr()
    assert "the int8 folder fails its gate" in said.err + said.out
    assert "Traceback" not in said.err + said.out
    assert not (tmp_path / "out").exists()


def test_seq2seq_lm_is_a_task_of_the_command_line_and_its_decoder_is_not():
    """`seq2seq-decoder` is one file of the folder, never a choice of its own."""
    from keras_layers.export.tasks import TASKS, task_names

    assert "seq2seq-decoder" not in task_names() and "seq2seq-lm" in task_names()
    assert "seq2seq-lm" not in TASKS
