"""`generate` on a damaged or hostile folder, and the text mode's arguments.

A folder as `--task causal-lm -o FOLDER/` writes it, built by hand in a
fraction of a second: a decoder whose next token is always the last one plus
one (`(id + 1) % VOCAB`, so every answer can be read off), with a cache of two
heads of four, a character-level `tokenizer.json` (`<s>`, `</s>`, a-z, space)
and a `genai_config.json`. Each damaged case copies it and spoils one file;
`generate` must raise `DecoderFileError` (a `ValueError`) naming that file and
the problem, whatever the library underneath raised (ONNX Runtime's
`InvalidProtobuf`, the `json` module's `RecursionError`, a Rust panic of the
`tokenizers` library). Then the text mode's arguments: `end_token_id` is
honoured as the ids path honours it, `padding_mask` and `pad_token_id` are
refused by name, as are prompts that cannot be tokenized.
"""

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from keras_layers.export import generate
from keras_layers.export.errors import DecoderFileError, UsageError

TOKENS = ["[UNK]", "<s>", "</s>", *"abcdefghijklmnopqrstuvwxyz", " "]
VOCAB = len(TOKENS)
ID = {token: index for index, token in enumerate(TOKENS)}
HEADS, HEAD_SIZE = 2, 4


def _decoder(heads=HEADS) -> onnx.ModelProto:
    """logits: one-hot of `(id + 1) % VOCAB`; the new keys and values: the ids,
    broadcast over (heads, head size), appended to the past."""
    batch, new, past = "batch", "sequence", "past_sequence"
    nodes = [
        helper.make_node("Add", ["input_ids", "one"], ["next"]),
        helper.make_node("Mod", ["next", "vocab"], ["wrapped"]),
        helper.make_node("OneHot", ["wrapped", "vocab", "off_on"], ["logits"]),
        helper.make_node("Cast", ["input_ids"], ["as_float"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["as_float", "axes"], ["column"]),
        helper.make_node("Expand", ["column", "cache_shape"], ["new_entries"]),
    ]
    for kind in ("key", "value"):
        past_name = f"past_key_values.0.{kind}"
        nodes.append(
            helper.make_node("Concat", [past_name, "new_entries"], [f"present.0.{kind}"], axis=2)
        )
    caches = [
        helper.make_tensor_value_info(
            f"{prefix}.0.{kind}", TensorProto.FLOAT, [batch, heads, length, HEAD_SIZE]
        )
        for prefix, length in (("past_key_values", past), ("present", "total"))
        for kind in ("key", "value")
    ]
    graph = helper.make_graph(
        nodes,
        "next_token",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, new]), *caches[:2]],
        [
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, new, VOCAB]),
            *caches[2:],
        ],
        [
            helper.make_tensor("one", TensorProto.INT64, [], [1]),
            helper.make_tensor("vocab", TensorProto.INT64, [], [VOCAB]),
            helper.make_tensor("off_on", TensorProto.FLOAT, [2], [0.0, 1.0]),
            helper.make_tensor("axes", TensorProto.INT64, [2], [1, 3]),
            helper.make_tensor("cache_shape", TensorProto.INT64, [4], [1, HEADS, 1, HEAD_SIZE]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _tokenizer(start_token: bool = True) -> Tokenizer:
    """One token a character; `<s>` before each prompt unless not `start_token`."""
    tokenizer = Tokenizer(models.WordLevel(ID, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(["[UNK]", "<s>", "</s>"])
    if start_token:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", ID["<s>"])]
        )
    return tokenizer


def _config() -> dict:
    decoder = {"head_size": HEAD_SIZE, "num_attention_heads": HEADS, "num_hidden_layers": 1}
    return {
        "model": {
            "type": "decoder",
            "vocab_size": VOCAB,
            "bos_token_id": ID["<s>"],
            "eos_token_id": ID["</s>"],
            "pad_token_id": 0,
            "decoder": decoder,
        },
        "search": {"do_sample": False},
    }


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("good")
    onnx.save(_decoder(), folder / "model.onnx")
    _tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "genai_config.json").write_text(json.dumps(_config()))
    return folder


@pytest.fixture
def folder(good, tmp_path) -> Path:
    """A copy of the good folder, for one test to spoil."""
    return Path(shutil.copytree(good, tmp_path / "folder"))


def test_the_good_folder_generates_the_next_letters(good):
    assert generate(good, "ab", 4) == "cdef"
    # "x" goes on with "yz", space, [UNK], <s> and </s>, where it stops
    # (the special tokens are not text); "ab" goes on for all 8.
    assert generate(good, ["x", "ab"], 8) == ["yz ", "cdefghij"]
    ids = generate(good, [[ID["a"]]], 3)
    assert ids.tolist() == [[ID["a"], ID["b"], ID["c"], ID["d"]]]


# Item 19 of issue #45: each way of spoiling one file of the folder, and what
# the message must say. Before, each raised what the library underneath raised.
def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _replaced_by_link(path: Path, target: str) -> None:
    path.unlink()
    path.symlink_to(target)


def _symbolic_heads(path: Path) -> None:
    model = onnx.load(path)
    for value in model.graph.input:
        if value.name.startswith("past_key_values."):
            value.type.tensor_type.shape.dim[1].dim_param = "heads"
    onnx.save(model, path)


def _config_with(**model) -> Callable[[Path], None]:
    def spoil(path: Path) -> None:
        config = _config()
        config["model"].update(model)
        path.write_text(json.dumps(config))

    return spoil


def _crafted_regex(path: Path) -> None:
    """A pre-tokenizer pattern whose backtracking passes Oniguruma's retry
    limit on the prompt below: the tokenizers library panics (a
    `pyo3_runtime.PanicException`, which `except Exception` does not catch)."""
    config = json.loads(path.read_text())
    config["pre_tokenizer"]["pattern"] = {"Regex": "(.*a){25}"}
    path.write_text(json.dumps(config))


MODEL, CONFIG, TOKENIZER = "model.onnx", "genai_config.json", "tokenizer.json"
DAMAGED = {
    "model truncated": (MODEL, _truncated, "ONNX Runtime cannot load it"),
    "model of text": (
        MODEL,
        lambda path: path.write_text("not a model"),
        "ONNX Runtime cannot load it (InvalidProtobuf",
    ),
    "model a link to a system file": (
        MODEL,
        lambda path: _replaced_by_link(path, "/etc/passwd"),
        "ONNX Runtime cannot load it",
    ),
    "model with symbolic cache heads": (
        MODEL,
        _symbolic_heads,
        "'past_key_values.0.key' has shape ['batch', 'heads', 'past_sequence', 4]",
    ),
    "config without the end token": (
        CONFIG,
        lambda path: path.write_text(json.dumps({"model": {}})),
        '"model"."eos_token_id" is missing',
    ),
    "config of a list": (CONFIG, lambda path: path.write_text("[]"), 'no "model" object'),
    "config with a string end token": (
        CONFIG,
        _config_with(eos_token_id="2"),
        '"model"."eos_token_id" is \'2\': not an int token id',
    ),
    "config with an infinite end token": (
        CONFIG,
        lambda path: path.write_text(json.dumps(_config()).replace(": 2,", ": 1e999,")),
        '"model"."eos_token_id" is inf: not an int token id',
    ),
    "config with a huge end token": (
        CONFIG,
        _config_with(eos_token_id=10**30),
        f'"model"."eos_token_id" is {10**30}: outside the vocabulary [0, {VOCAB})',
    ),
    "config nested 100,000 deep": (
        CONFIG,
        lambda path: path.write_text("[" * 100_000 + "]" * 100_000),
        "cannot read it as JSON (RecursionError",
    ),
    "config of invalid UTF-8": (
        CONFIG,
        lambda path: path.write_bytes(b"\xff{}"),
        "cannot read it as JSON",
    ),
    "tokenizer truncated": (TOKENIZER, _truncated, "the tokenizers library cannot read it"),
    "tokenizer with a crafted regex": (
        TOKENIZER,
        _crafted_regex,
        "the tokenizers library fails on prompt 0 (PanicException: Onig: Regex search error",
    ),
    "tokenizer of another model": (
        TOKENIZER,
        lambda path: path.write_text(_other_tokenizer().to_str()),
        f"it encodes prompt 0 to id {VOCAB + 3}, outside the vocabulary [0, {VOCAB})",
    ),
}


def _other_tokenizer() -> Tokenizer:
    """A tokenizer whose ids start where the model's vocabulary ends."""
    tokenizer = Tokenizer(models.WordLevel({t: VOCAB + i for i, t in enumerate(TOKENS)}, "[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return tokenizer


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_folder_is_a_decoder_file_error_naming_the_file(folder, case):
    name, spoil, problem = DAMAGED[case]
    spoil(folder / name)
    with pytest.raises(DecoderFileError) as caught:
        generate(folder, "a" * 40, 2)
    message = str(caught.value)
    assert message.startswith(f"{folder / name}: "), message
    assert problem in message, message
    assert "\n" not in message
    assert caught.value.path == folder / name
    # What callers of `generate` caught before, and what the command line reports (exit 2).
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, UsageError)


@pytest.mark.parametrize("case", [case for case in DAMAGED if DAMAGED[case][0] == MODEL])
def test_token_ids_on_a_damaged_model_file_are_a_decoder_file_error(folder, case):
    _, spoil, problem = DAMAGED[case]
    spoil(folder / MODEL)
    with pytest.raises(DecoderFileError, match="ONNX Runtime|has shape"):
        generate(folder, [[ID["a"]]], 2)
    with pytest.raises(DecoderFileError, match="ONNX Runtime|has shape"):
        generate(folder / MODEL, [[ID["a"]]], 2)


# Prompts that cannot be tokenized: refused naming the argument.
def test_an_empty_prompt_without_a_start_token_is_refused_naming_it(folder):
    _tokenizer(start_token=False).save(str(folder / TOKENIZER))
    assert generate(folder, "ab", 2) == "cd"
    with pytest.raises(ValueError, match=r"token_ids='': this prompt encodes to no token"):
        generate(folder, "", 2)  # before: an IndexError
    with pytest.raises(ValueError, match=r"token_ids\[1\]='': this prompt encodes to no token"):
        generate(folder, ["ab", ""], 2)


def test_a_lone_surrogate_is_refused_naming_the_prompt(good):
    with pytest.raises(ValueError, match=r"token_ids\[1\]='a\\ud800': not valid text") as caught:
        generate(good, ["ab", "a\ud800"], 2)
    assert "lone surrogate U+D800 at character 1" in str(caught.value)
    assert not isinstance(caught.value, TypeError)


# Item 20 of issue #45: the text mode's `end_token_id`, `pad_token_id` and `padding_mask`.
def test_text_stops_at_the_end_token_id_given_as_ids_do(good):
    end = ID["e"]
    ids = generate(good, [[ID["<s>"], ID["a"], ID["b"]]], 6, end_token_id=end)
    assert ids.tolist() == [[ID["<s>"], ID["a"], ID["b"], ID["c"], ID["d"], ID["e"], 0, 0, 0]]
    assert generate(good, "ab", 6, end_token_id=end) == "cd"
    # The folder's end token no longer stops "x": it runs to its 8 new tokens.
    assert generate(good, ["ab", "x"], 8, end_token_id=end) == ["cd", "yz ab"]


def test_text_refuses_a_padding_mask_and_a_pad_token_id_naming_them(good):
    with pytest.raises(ValueError, match="padding_mask=.*text prompts are not padded"):
        generate(good, ["ab", "x"], 2, padding_mask=[[1, 1, 1], [1, 1, 0]])
    with pytest.raises(ValueError, match="pad_token_id=5: text prompts return"):
        generate(good, "ab", 2, pad_token_id=5)
    with pytest.raises(ValueError, match="end_token_id=99 is outside the vocabulary"):
        generate(good, "ab", 2, end_token_id=99)
    assert generate(good, "ab", 2, pad_token_id=0) == "cd"  # the default, which changes nothing


def test_text_and_its_errors_import_neither_tensorflow_nor_keras(good, tmp_path):
    """A server that only generates from a folder needs no TensorFlow, even to
    report a damaged file."""
    (tmp_path / "genai_config.json").write_text("[]")
    shutil.copy(good / TOKENIZER, tmp_path / TOKENIZER)
    code = f"""
import sys
from keras_layers.export import DecoderFileError, generate
assert generate({str(good)!r}, "ab", 4) == "cdef"
try:
    generate({str(tmp_path)!r}, "ab", 4)
except DecoderFileError:
    pass
print(sorted(m for m in ("tensorflow", "keras", "tf2onnx") if m in sys.modules))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
