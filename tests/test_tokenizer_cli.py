"""`--tokenizer-only`: a saved keras-hub task's tokenizer files, from the command line.

A tiny Gemma causal LM (SentencePiece, trained here by tests/zoo_tokenizers.py)
is saved with its preprocessor, as `task.save` keeps it. The command must
write the three files, proved on the stress corpus, and the files must frame
a text as the preprocessor does (checked here with the `tokenizers` library,
not with the export's own readers). Then the bad cases: a task saved without
a preprocessor and the flags that make no sense with it exit 2 before any
file is written; files that differ from keras-hub (broken on purpose) exit 1
with the differing text and both id lists, and the folder keeps what it had.
"""

import json

import keras_hub
import numpy as np
import pytest
import zoo_tokenizers
from tokenizers import Tokenizer

from keras_layers.export.cli import EXIT_INVALID, EXIT_OK, EXIT_USAGE, main
from keras_layers.export.tokenizer_files import STRESS_CORPUS, gate

pytestmark = pytest.mark.tensorflow_only  # the command loads the model on TensorFlow

FILES = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
TEXT = "The quick brown fox jumps over the lazy dog."


def _gemma(preprocessor: bool):
    tokenizer = zoo_tokenizers.build("GemmaTokenizer")
    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=1,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=16,
        intermediate_dim=32,
        head_dim=8,
    )
    attached = None
    if preprocessor:
        attached = keras_hub.models.GemmaCausalLMPreprocessor(tokenizer, sequence_length=24)
    return keras_hub.models.GemmaCausalLM(backbone, preprocessor=attached)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved")
    with_preprocessor, without = _gemma(True), _gemma(False)
    with_preprocessor.save(folder / "gemma.keras")
    without.save(folder / "bare.keras")
    return folder, with_preprocessor.preprocessor


def test_the_tokenizer_files_are_written_proved_and_frame_as_the_preprocessor(
    saved, tmp_path, capsys
):
    folder, preprocessor = saved
    out = tmp_path / "tokenizer"
    assert main([str(folder / "gemma.keras"), "--tokenizer-only", "-o", str(out)]) == EXIT_OK
    assert {path.name for path in out.iterdir()} == FILES
    printed = capsys.readouterr().out
    assert "passed" in printed and "tokenizers" in printed and "onnxruntime-extensions" in printed
    # The second oracle: the `tokenizers` library on the placed file, against
    # the preprocessor as generation frames a prompt (start token, padding).
    encoding = Tokenizer.from_file(str(out / "tokenizer.json")).encode(TEXT)
    keras = preprocessor.generate_preprocess([TEXT])
    assert encoding.ids == np.asarray(keras["token_ids"][0]).tolist()
    assert encoding.attention_mask == np.asarray(keras["padding_mask"][0]).astype(int).tolist()
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["model_max_length"] == 24 and config["add_bos_token"] is True


def test_the_folder_defaults_to_beside_the_model(saved, tmp_path):
    folder, _ = saved
    model = tmp_path / "my model.keras"
    model.write_bytes((folder / "gemma.keras").read_bytes())
    assert main([str(model), "--tokenizer-only", "-q"]) == EXIT_OK
    assert {path.name for path in (tmp_path / "my model_tokenizer").iterdir()} == FILES


def test_a_task_saved_without_its_preprocessor_exits_2_naming_it(saved, tmp_path, capsys):
    folder, _ = saved
    out = tmp_path / "tokenizer"
    assert main([str(folder / "bare.keras"), "--tokenizer-only", "-o", str(out)]) == EXIT_USAGE
    error = capsys.readouterr().err
    assert "GemmaCausalLM" in error and "without a keras-hub preprocessor" in error
    assert not out.exists()


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--check-only"], "--check-only"),
        (["--with-preprocessor"], "--with-preprocessor"),
        (["--quantize", "int8"], "--quantize int8"),
        (["--task", "causal-lm"], "--task causal-lm"),
        # Accepted and ignored before (--report wrote no report, exit 0):
        (["--report", "r.json"], "--report r.json"),
        (["--shapes", "1x3"], "--shapes"),
        (["--atol", "1e-3"], "--atol 0.001"),
        (["--opset", "17"], "--opset 17"),
        (["--external-data", "always"], "--external-data always"),
        (["--weights-dtype", "float16"], "--weights-dtype float16"),
        (["--allow-nonfinite"], "--allow-nonfinite"),
        (["--input", "token_ids=ids"], "--input"),
    ],
)
def test_flags_that_do_not_apply_exit_2_before_any_work(saved, tmp_path, capsys, flags, words):
    folder, _ = saved
    out = tmp_path / "tokenizer"
    argv = [str(folder / "gemma.keras"), "--tokenizer-only", "-o", str(out), *flags]
    assert main(argv) == EXIT_USAGE
    assert words in capsys.readouterr().err
    assert not out.exists()


def test_without_a_model_exits_2(tmp_path, capsys):
    assert main(["--tokenizer-only", "-o", str(tmp_path / "t")], demo_dir=tmp_path) == EXIT_USAGE
    assert "MODEL" in capsys.readouterr().err


def test_files_that_differ_from_keras_hub_exit_1_with_the_text_and_keep_the_folder(
    saved, tmp_path, capsys, monkeypatch
):
    folder, preprocessor = saved
    tokenizer = preprocessor.tokenizer
    ids = [int(i) for i in tokenizer.tokenize(STRESS_CORPUS[0])]
    first, second = ids[0], next(i for i in ids if i != ids[0])
    tokens = tokenizer.id_to_token(first), tokenizer.id_to_token(second)
    write = gate.write_tokenizer

    def write_broken(given, staging):  # two pieces' ids swapped in the written file
        written = write(given, staging)
        path = staging / "tokenizer.json"
        document = json.loads(path.read_text(encoding="utf-8"))
        vocabulary = document["model"]["vocab"]  # SentencePiece BPE: piece -> id
        vocabulary[tokens[0]], vocabulary[tokens[1]] = second, first
        path.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
        return written

    monkeypatch.setattr(gate, "write_tokenizer", write_broken)
    out = tmp_path / "tokenizer"
    out.mkdir()
    (out / "tokenizer.json").write_text("the user's older file")
    code = main([str(folder / "gemma.keras"), "--tokenizer-only", "-o", str(out)])
    captured = capsys.readouterr()
    assert code == EXIT_INVALID, captured.err
    assert repr(STRESS_CORPUS[0]) in captured.err and str(ids) in captured.err
    assert "FAIL" in captured.out and tokens[0] != tokens[1]
    assert [path.name for path in out.iterdir()] == ["tokenizer.json"]
    assert (out / "tokenizer.json").read_text() == "the user's older file"
