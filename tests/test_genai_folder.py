"""`--task causal-lm -o FOLDER/`: the folder onnxruntime-genai runs, proved against keras-hub.

Tiny keras-hub causal LMs are saved with their preprocessors (tokenizers
trained here by tests/zoo_tokenizers.py): GPT-2 (byte-level BPE, learned
positions), Gemma (SentencePiece, one key/value head, scaled input, tied
output) and Llama 3 (grouped-query attention, rotary positions). Each is
exported as a folder; the test then runs the placed folder the way a user
does, in onnxruntime-genai (`og.Model`, `og.Tokenizer`, a greedy generator
loop), and compares with keras-hub's own compiled `generate` (the second
oracle; the export itself compared with Keras recomputing each sequence).
Then the bad cases: refused flags, a folder that fails its proof (nothing of
the existing folder changes), and a model without preprocessor (ids in, ids
out, no tokenizer files).
"""

import json
import shutil

import keras
import keras_hub
import mutants
import numpy as np
import onnx
import onnxruntime_genai as og
import pytest
import zoo_tokenizers

from keras_layers.export import (
    ExportOptions,
    causal_lm,
    decoder_gate,
    export_model,
    genai_folder,
    generate,
    loading,
)
from keras_layers.export.cli import EXIT_INVALID, EXIT_USAGE, main
from keras_layers.export.errors import UsageError, ValidationFailed

pytestmark = [
    pytest.mark.tensorflow_only,  # the export pipeline runs on TensorFlow
    pytest.mark.xdist_group("genai_folder"),  # module fixtures: one worker (loadgroup)
]

PROMPTS = ["The quick brown fox", "Привет мир, 123", "a"]
NEW = 10
FOLDER_FILES = {
    "model.onnx",
    "genai_config.json",
    "report.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
}


def _visible(folder) -> set:
    """The names a listing shows (the export's store and lock are hidden)."""
    return {path.name for path in folder.iterdir() if not path.name.startswith(".")}


def _lm(kind: str, seed: int = 1, sequence_length: int = 32, **changes):
    """A tiny keras-hub causal LM with its preprocessor (packing
    `sequence_length` tokens), weights drawn from a fixed seed; `changes`
    replace the backbone's sizes."""
    keras.utils.set_random_seed(seed)
    tokenizer_class, backbone_class, task_class, preprocessor_class, sizes = {
        "gpt2": (
            "GPT2Tokenizer",
            keras_hub.models.GPT2Backbone,
            keras_hub.models.GPT2CausalLM,
            keras_hub.models.GPT2CausalLMPreprocessor,
            {"num_heads": 2, "max_sequence_length": 64},
        ),
        "gemma": (
            "GemmaTokenizer",
            keras_hub.models.GemmaBackbone,
            keras_hub.models.GemmaCausalLM,
            keras_hub.models.GemmaCausalLMPreprocessor,
            {"num_query_heads": 2, "num_key_value_heads": 1, "head_dim": 8},
        ),
        "llama3": (
            "Llama3Tokenizer",
            keras_hub.models.Llama3Backbone,
            keras_hub.models.Llama3CausalLM,
            keras_hub.models.Llama3CausalLMPreprocessor,
            {"num_query_heads": 4, "num_key_value_heads": 2},
        ),
    }[kind]
    tokenizer = zoo_tokenizers.build(tokenizer_class)
    backbone = backbone_class(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=2,
        hidden_dim=16,
        intermediate_dim=32,
        **{**sizes, **changes},
    )
    preprocessor = preprocessor_class(tokenizer, sequence_length=sequence_length)
    return task_class(backbone, preprocessor=preprocessor)


def _keras_hub_greedy(lm, ids: list, new: int) -> list:
    """keras-hub's own compiled greedy `generate` on ids, never stopping early."""
    lm.compile(sampler="greedy")
    length = len(ids) + new
    packed = {
        "token_ids": np.array([ids + [0] * new], "int32"),
        "padding_mask": np.array([[True] * len(ids) + [False] * new]),
    }
    out = lm.generate_step(packed, stop_token_ids=None)
    return np.asarray(out["token_ids"])[0, :length].tolist()


def _genai(folder, prompt: str, new: int, as_configured: bool = False) -> tuple:
    """What a user gets from the folder: the prompt's ids and greedy tokens
    (or, `as_configured`, the tokens of the config's search, as the docs'
    snippet runs it, setting only `max_length`)."""
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    tokenizer.update_options(add_special_tokens="true")
    ids = [int(i) for i in tokenizer.encode(prompt)]
    params = og.GeneratorParams(model)
    search = {} if as_configured else {"do_sample": False}
    params.set_search_options(max_length=len(ids) + new, **search)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    return ids, [int(i) for i in generator.get_sequence(0)]


# Every export here takes half a minute or more: the slow tier, which CI runs.
@pytest.fixture(
    scope="module",
    params=[pytest.param(kind, marks=pytest.mark.slow) for kind in ("gpt2", "gemma")],
)
def exported(request, tmp_path_factory):
    lm = _lm(request.param)
    saved = tmp_path_factory.mktemp(request.param) / f"{request.param}.keras"
    lm.save(saved)
    folder = saved.parent / "folder"
    assert main([str(saved), "--task", "causal-lm", "-o", f"{folder}/", "-q"]) == 0
    return lm, folder


def test_the_folder_holds_the_model_its_config_and_tokenizer(exported):
    lm, folder = exported
    assert _visible(folder) == FOLDER_FILES
    config = json.loads((folder / "genai_config.json").read_text())
    tokenizer = lm.preprocessor.tokenizer
    assert config["model"]["eos_token_id"] == tokenizer.end_token_id
    assert config["model"]["vocab_size"] == tokenizer.vocabulary_size()
    report = json.loads((folder / "report.json").read_text())
    assert report["passed"] and report["folder"]["passed"]
    # Every attention is a GroupQueryAttention, which writes the cache in place.
    assert config["search"]["past_present_share_buffer"] is True
    # genai ran the folder with one shared buffer, and again without.
    unshared = report["folder"]["genai_unshared"]
    assert unshared["genai"] and all(row["tokens_equal"] for row in unshared["genai"])
    assert unshared["genai_batched"] and all(r["batched_equal"] for r in unshared["genai_batched"])
    assert report["onnx_path"] == str(folder / "model.onnx")
    assert report["tokenizer"]["identity"]["passed"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_genai_runs_the_folder_with_keras_hub_ids_and_tokens(exported, prompt):
    lm, folder = exported
    ids, tokens = _genai(folder, prompt, NEW)
    packed = lm.preprocessor.generate_preprocess([prompt])
    mask = np.asarray(packed["padding_mask"][0]).astype(bool)
    assert ids == np.asarray(packed["token_ids"][0])[mask].tolist()
    expected = _keras_hub_greedy(lm, ids, NEW)
    end = lm.preprocessor.tokenizer.end_token_id
    # genai stops at the end token; up to there, every token is keras-hub's.
    assert tokens == expected[: len(tokens)]
    assert len(tokens) == len(expected) or tokens[-1] == end


def _genai_batch(folder, prompts: list, new: int) -> list:
    """genai on the prompts in one batch, padded by its own tokenizer: each
    row's new tokens, read one step at a time (`get_next_tokens`), not from
    the sequences the export's own check slices."""
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    tokenizer.update_options(add_special_tokens="true")
    batch = tokenizer.encode_batch(prompts).as_numpy()
    params = og.GeneratorParams(model)
    params.set_search_options(
        max_length=batch.shape[1] + new, do_sample=False, batch_size=len(prompts)
    )
    generator = og.Generator(model, params)
    generator.append_tokens(batch)
    rows = [[] for _ in prompts]
    while not generator.is_done():
        generator.generate_next_token()
        for row, token in zip(rows, generator.get_next_tokens(), strict=True):
            row.append(int(token))
    return rows


def test_genai_runs_prompts_of_different_lengths_in_one_batch_as_each_alone(exported):
    """genai pads the batch and feeds `attention_mask` and `position_ids`:
    each row's new tokens must be keras-hub's compiled generate on that
    prompt alone."""
    lm, folder = exported
    config = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    assert {"attention_mask", "position_ids"} <= set(config["inputs"])
    end = lm.preprocessor.tokenizer.end_token_id
    for prompt, tokens in zip(PROMPTS, _genai_batch(folder, PROMPTS, NEW), strict=True):
        packed = lm.preprocessor.generate_preprocess([prompt])
        mask = np.asarray(packed["padding_mask"][0]).astype(bool)
        ids = np.asarray(packed["token_ids"][0])[mask].tolist()
        expected = _keras_hub_greedy(lm, ids, NEW)[len(ids) :]
        stop = tokens.index(end) + 1 if end in tokens else len(tokens)
        assert tokens[:stop] == expected[:stop], prompt


def test_a_decoder_that_ignores_its_mask_fails_the_batched_genai_check(exported, tmp_path):
    """Prove the proof: the folder with its decoder's attention_mask made
    neutral (tests/mutants.py) still runs one prompt at a time, and must
    fail the batch in genai."""
    lm, folder = exported
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    mutant = mutants.BY_NAME["mask_ignored"].apply(onnx.load(folder / "model.onnx"))
    mutants.save(mutant, broken / "model.onnx", folder / "model.onnx")
    loaded = loading.load(lm)
    decoder = causal_lm.describe(loaded)
    expected = genai_folder.expectations(loaded, decoder, PROMPTS, NEW, 32)

    result = genai_folder.prove_folder(broken, expected, lm.preprocessor.tokenizer.end_token_id)

    assert all(row["tokens_equal"] for row in result["genai"])
    assert not result["passed"]
    assert "in a batch of prompts" in genai_folder.failure(result)


def test_generate_takes_the_folder_and_text_and_returns_keras_hub_text(exported):
    lm, folder = exported
    tokenizer = lm.preprocessor.tokenizer
    texts = generate(folder, PROMPTS, NEW)  # a batch of text prompts of different lengths
    assert generate(folder, PROMPTS[1], NEW) == texts[1]
    for prompt, text in zip(PROMPTS, texts, strict=True):
        packed = lm.preprocessor.generate_preprocess([prompt])
        mask = np.asarray(packed["padding_mask"][0]).astype(bool)
        ids = np.asarray(packed["token_ids"][0])[mask].tolist()
        new = _keras_hub_greedy(lm, ids, NEW)[len(ids) :]
        new = new[: new.index(tokenizer.end_token_id)] if tokenizer.end_token_id in new else new
        expected = tokenizer.detokenize(new)
        expected = expected.numpy() if hasattr(expected, "numpy") else expected
        expected = expected.decode("utf-8", "replace") if isinstance(expected, bytes) else expected
        if "\ufffd" not in expected:
            assert text == expected, prompt
        else:  # random weights emit invalid UTF-8 byte pieces: decoders part ways there
            cut = expected.index("\ufffd")
            assert text[:cut] == expected[:cut] and text[cut] == "\ufffd", prompt


def test_genai_cuts_text_at_a_nul_and_the_proof_knows_no_other_cut(exported):
    """genai's decoder returns a C string: a NUL byte ends its text (CI met it
    on a random GPT-2 that emitted byte 0). The proof accepts keras-hub's text
    cut there or after the first U+FFFD, and nothing else."""
    lm, folder = exported
    tokenizer = lm.preprocessor.tokenizer
    nul = tokenizer.token_to_id("Ā" if "GPT2" in type(tokenizer).__name__ else "<0x00>")
    ids = [tokenizer.token_to_id("x"), nul, tokenizer.token_to_id("x")]
    expected = tokenizer.detokenize(ids)
    expected = expected.numpy() if hasattr(expected, "numpy") else expected
    expected = expected.decode("utf-8", "replace") if isinstance(expected, bytes) else expected
    text = og.Tokenizer(og.Model(str(folder))).decode(ids)
    assert "\x00" in expected and text == expected[: expected.index("\x00")]
    assert genai_folder._text_gap(text, expected)


@pytest.mark.parametrize(
    ("text", "expected", "gap"),
    [
        ("x", "x\x00\ufffdab", True),  # cut before the NUL
        ("x\ufffd", "x\ufffd\x00ab", True),  # after the first U+FFFD, before the NUL
        ("x\x00", "x\x00ab", False),  # genai never keeps the NUL
        ("x\ufffd", "x\ufffd\ufffdab", True),
        ("", "x\x00ab", False),  # cut earlier than either
        ("x", "xab", False),  # nothing to cut at: a text that differs
        ("x\ufffd\ufffd", "x\ufffd\ufffdab", False),
    ],
)
def test_the_text_gap_is_keras_hubs_text_cut_where_genai_cuts_it(text, expected, gap):
    assert genai_folder._text_gap(text, expected) is gap


def test_text_without_a_folder_is_refused_naming_what_is_needed(tmp_path):
    with pytest.raises(ValueError, match="text prompts need the folder"):
        generate(tmp_path / "model.onnx", "a prompt", 4)
    with pytest.raises(ValueError, match="text prompts need the folder"):
        generate(tmp_path, ["a prompt"], 4)  # a folder without tokenizer files


@pytest.mark.slow  # a third export: Llama 3's grouped-query attention and rotary positions
def test_a_llama3_folder_runs_in_genai_with_keras_hub_tokens(tmp_path):
    lm = _lm("llama3")
    report = genai_folder.export_folder(lm, tmp_path / "llama3")
    assert report["folder"]["genai"] and report["folder"]["passed"]
    batched = report["folder"]["genai_batched"]
    assert len(batched) >= 2 and all(row["batched_equal"] for row in batched)
    sizes = report["folder"]["config"]["model"]["decoder"]
    assert (sizes["num_attention_heads"], sizes["num_key_value_heads"]) == (4, 2)
    assert sizes["hidden_size"] == 16 and sizes["head_size"] == 4
    # A head size of 4: ONNX Runtime's CPU GroupQueryAttention refuses it, so
    # the traced attention stays, says why, and the folder shares no buffer.
    declined = report["graph"]["declined"]["GroupQueryAttention"]
    assert declined == {
        "head size 4: ONNX Runtime's CPU GroupQueryAttention takes multiples of 8": 2
    }
    assert report["folder"]["config"]["search"]["past_present_share_buffer"] is False
    assert "genai_unshared" not in report["folder"]
    ids, tokens = _genai(tmp_path / "llama3", PROMPTS[0], NEW)
    assert tokens[: len(tokens)] == _keras_hub_greedy(lm, ids, NEW)[: len(tokens)]


@pytest.mark.slow
def test_a_folder_that_fails_its_proof_places_nothing(tmp_path, monkeypatch):
    folder = tmp_path / "deploy"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"the user's older model")
    (folder / "notes.txt").write_text("mine")

    write = genai_folder.genai_config

    def swapped(*args):  # a config that feeds each layer's keys as values, and back
        config = write(*args)
        inputs = config["model"]["decoder"]["inputs"]
        inputs["past_key_names"], inputs["past_value_names"] = (
            inputs["past_value_names"],
            inputs["past_key_names"],
        )
        return config

    monkeypatch.setattr(genai_folder, "genai_config", swapped)
    with pytest.raises(ValidationFailed, match="onnxruntime-genai's tokens .* differ") as raised:
        genai_folder.export_folder(_lm("gpt2"), folder)
    assert "Nothing was placed" in str(raised.value)
    assert sorted(p.name for p in folder.iterdir()) == ["model.onnx", "notes.txt"]
    assert (folder / "model.onnx").read_bytes() == b"the user's older model"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_a_quantized_folder_is_written_beside_the_float_one_and_runs_in_genai(tmp_path, kind):
    """`quantize="int4"` / `"int8"` with a folder: FOLDER/<kind>/ holds the
    decoder with MatMulNBits weights, the same config and tokenizer, and the
    gate's figures; genai runs it on text."""
    lm = _lm("gpt2")
    folder = tmp_path / "deploy"
    events = []
    options = ExportOptions(quantize=kind)
    report = export_model(lm, f"{folder}/", options, task="causal-lm", progress=events.append)
    # Every stage that takes seconds is shown as it starts and ends (it was
    # silent for 30-45 s on a real model).
    finished = [event.stage for event in events if event.seconds is not None]
    for stage in ("keras", "load", "convert", "validate", "genai", kind):
        assert stage in finished, finished
    gate = report["folder"]["quantized"][kind]
    assert gate["passed"] and gate["bits"] == int(kind[3:]) and gate["block_size"] == 32
    assert gate["quantized"] == 13  # 2 layers x 6 projections, and the tied output
    assert 0.5 <= gate["greedy_agreement"] <= 1 and gate["genai_agreement"] is not None
    assert 0 < gate["mean_abs_log_prob_change"] <= 0.25
    sub = folder / kind
    assert {path.name for path in sub.iterdir()} == FOLDER_FILES - {"report.json"}
    proto = onnx.load(sub / "model.onnx")
    weights = {init.name for init in proto.graph.initializer}
    ops = [node.op_type for node in proto.graph.node]
    assert ops.count("MatMulNBits") == 13
    # What stays a MatMul multiplies activations (attention), never a weight.
    assert not any(n.op_type == "MatMul" and n.input[1] in weights for n in proto.graph.node)
    ids, tokens = _genai(sub, PROMPTS[0], NEW)
    assert len(tokens) == len(ids) + NEW or tokens[-1] == lm.preprocessor.tokenizer.end_token_id


@pytest.mark.slow
def test_a_quantized_folder_that_fails_its_gate_places_nothing_and_is_kept(tmp_path):
    folder = tmp_path / "deploy"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    options = ExportOptions(quantize="int4", decoder_min_agreement=1.0, decoder_max_nll_change=0)
    with pytest.raises(ValidationFailed, match="the int4 decoder fails its gate") as raised:
        export_model(_lm("gpt2"), f"{folder}/", options, task="causal-lm")
    assert "Nothing was placed" in str(raised.value)
    assert [path.name for path in folder.iterdir()] == ["notes.txt"]
    kept = tmp_path / "deploy.int4.failed"
    assert (kept / "model.onnx").is_file() and (kept / "genai_config.json").is_file()


@pytest.mark.slow
def test_the_decoder_gate_fails_the_file_of_another_model(tmp_path):
    """Prove the gate: Keras' side from one GPT-2, the file from another of the
    same shape (another seed) fails the default gate on its greedy agreement.
    Its log-likelihood change (0.039 nats a token, measured) stays under the
    default 0.25: a tiny random model's near-uniform distributions move
    little (docs/generation.md says so), so a stricter bound must fail it."""
    lm = _lm("gpt2")
    path = tmp_path / "gpt2.onnx"
    export_model(_lm("gpt2", seed=2), path, task="causal-lm")
    loaded = loading.load(lm)
    decoder = causal_lm.describe(loaded)
    expected = genai_folder.expectations(loaded, decoder, PROMPTS, NEW, 32)
    held_out = decoder_gate.held_out_ids(lm.preprocessor, decoder.vocabulary, 32, "int32")
    keras_side = decoder_gate.keras_side(
        lambda ids: causal_lm.forward_logits(loaded, decoder, ids), held_out
    )
    pairs = [(item.ids, item.tokens) for item in expected]

    gate = decoder_gate.judge(path, pairs, keras_side, 0.5, 0.25)

    assert not gate["passed"] and gate["greedy_agreement"] < 0.5
    assert gate["failure"].startswith("greedy agreement")
    strict = decoder_gate.judge(path, pairs, keras_side, 0.0, 0.01)
    assert not strict["passed"] and strict["failure"].startswith("mean |log p change|")


def _ids_lm():
    """A tiny GPT-2 without preprocessor (ids in, ids out), whose greedy
    tokens after the check prompts hold id 0 (seed 1)."""
    keras.utils.set_random_seed(1)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=64,
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=32,
    )
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)


def test_a_model_without_preprocessor_needs_the_end_id_it_is_given(tmp_path):
    """No tokenizer says which id ends a sequence, and genai stops at the
    config's end id (0 when none is written, as the folder had): the export
    is refused naming `end_token_id`, then writes the id given as the start,
    end and pad ids, and genai runs past token 0."""
    lm = _ids_lm()
    with pytest.raises(UsageError, match=r"end_token_id: the model has no preprocessor"):
        export_model(lm, f"{tmp_path}/refused/", task="causal-lm")
    assert not (tmp_path / "refused").exists()
    options = ExportOptions(end_token_id=63)
    report = export_model(lm, f"{tmp_path}/ids/", options, task="causal-lm")  # ends in /: a folder
    assert _visible(tmp_path / "ids") == {"model.onnx", "genai_config.json", "report.json"}
    config = json.loads((tmp_path / "ids" / "genai_config.json").read_text())["model"]
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (63, 63, 63)
    assert report["folder"]["chosen"]["end_token_id_from"] == "end_token_id, as given"
    rows = report["folder"]["genai"]
    assert rows and all(row["tokens_equal"] and row["prompt"] is None for row in rows)
    # Keras' greedy tokens hold a 0 that is not the end: genai goes past it.
    new = [row["keras"]["tokens"][len(row["keras"]["ids"]) :] for row in rows]
    past_zero = [row for row, tokens in zip(rows, new, strict=True) if 0 in tokens[:-1]]
    assert past_zero and all(
        len(row["genai"]["tokens"]) == len(row["keras"]["tokens"]) for row in past_zero
    )
    # A model in memory, compiled by keras-hub with top_k when made: greedy all the same.
    assert report["folder"]["config"]["search"]["do_sample"] is False


@pytest.fixture(scope="module")
def from_file(tmp_path_factory):
    """A GPT-2 of 128 positions with a preprocessor that packs 64 tokens,
    compiled with the greedy sampler: in memory, its `.keras` file, and the
    folder the command exports from the file with no other flag."""
    lm = _lm("gpt2", sequence_length=64, max_sequence_length=128)
    lm.compile(sampler="greedy")
    saved = tmp_path_factory.mktemp("from_file") / "gpt2.keras"
    lm.save(saved)
    folder = saved.parent / "folder"
    assert main([str(saved), "--task", "causal-lm", "-o", f"{folder}/", "-q"]) == 0
    return lm, saved, folder


def test_a_folder_exported_from_a_file_decodes_greedily(from_file):
    """A `.keras` file keeps no compiled sampler (keras-hub compiles every
    task with top_k, k=5, when it is made): the model compiled greedy, saved
    and exported from its file gets a greedy search, and genai run as the
    docs' snippet runs it (only `max_length` set) gives keras-hub's greedy
    tokens, the same on every run."""
    lm, _, folder = from_file
    search = json.loads((folder / "genai_config.json").read_text())["search"]
    assert search["do_sample"] is False and search["top_k"] == 1
    chosen = json.loads((folder / "report.json").read_text())["folder"]["chosen"]
    assert chosen["sampler"] == "greedy" and chosen["sampler_from"].startswith("the default")
    ids, tokens = _genai(folder, PROMPTS[0], NEW, as_configured=True)
    assert _genai(folder, PROMPTS[0], NEW, as_configured=True) == (ids, tokens)
    end = lm.preprocessor.tokenizer.end_token_id
    expected = _keras_hub_greedy(lm, ids, NEW)
    assert tokens == expected[: len(tokens)]
    assert len(tokens) == len(expected) or expected[len(tokens)] == end


def test_the_sampler_flag_writes_keras_hubs_top_k_into_the_folder(from_file, tmp_path):
    _, saved, _ = from_file
    folder = tmp_path / "top_k"
    argv = [str(saved), "--task", "causal-lm", "-o", f"{folder}/", "-q", "--sampler", "top_k"]
    assert main(argv) == 0
    search = json.loads((folder / "genai_config.json").read_text())["search"]
    assert (search["do_sample"], search["top_k"], search["top_p"]) == (True, 5, 1.0)
    assert search["temperature"] == 1.0
    chosen = json.loads((folder / "report.json").read_text())["folder"]["chosen"]
    assert (chosen["sampler"], chosen["sampler_from"]) == ("top_k", "sampler, as given")


GREEDY = {"do_sample": False, "top_k": 1, "top_p": 1.0, "temperature": 1.0}


@pytest.mark.parametrize(
    "given, expected",
    [
        ({}, GREEDY),
        ({"sampler": "greedy"}, GREEDY),
        ({"sampler": "top_k"}, {"do_sample": True, "top_k": 5, "top_p": 1.0, "temperature": 1.0}),
        (
            {"sampler": "top_k", "top_k": 40, "temperature": 0.7},
            {"do_sample": True, "top_k": 40, "top_p": 1.0, "temperature": 0.7},
        ),
        ({"sampler": "top_p"}, {"do_sample": True, "top_k": 0, "top_p": 0.1, "temperature": 1.0}),
        (
            {"sampler": "top_p", "top_p": 0.9, "temperature": 2},
            {"do_sample": True, "top_k": 0, "top_p": 0.9, "temperature": 2.0},
        ),
    ],
)
def test_the_search_is_greedy_unless_a_sampler_is_given(given, expected):
    """genai samples top-k where top_k > 1, top-p where top_k is 0; the
    numbers not given are keras-hub's samplers' defaults."""
    search = genai_folder.search_settings(ExportOptions(**given), 96, shared=False)
    assert {name: search[name] for name in expected} == expected
    assert search["max_length"] == 96 and search["num_beams"] == 1


def test_the_context_is_the_models_position_table_not_the_preprocessors_length(from_file):
    """The GPT-2 holds 128 positions and was saved with a preprocessor that
    packs 64 tokens: the folder's context is 128, and genai runs a sequence
    of 74 tokens, keras-hub's greedy ones up to its end token."""
    lm, _, folder = from_file
    config = json.loads((folder / "genai_config.json").read_text())
    assert config["model"]["context_length"] == 128 and config["search"]["max_length"] == 128
    chosen = json.loads((folder / "report.json").read_text())["folder"]["chosen"]
    assert chosen["context_length_from"] == "the position table of position_embedding"
    model = og.Model(str(folder))
    tokenizer = og.Tokenizer(model)
    tokenizer.update_options(add_special_tokens="true")
    ids = [int(i) for i in tokenizer.encode(PROMPTS[0])]
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=74, min_length=74, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    tokens = [int(i) for i in generator.get_sequence(0)]
    assert len(tokens) == 74
    expected = _keras_hub_greedy(lm, ids, 74 - len(ids))
    end = lm.preprocessor.tokenizer.end_token_id
    kept = expected.index(end, len(ids)) if end in expected[len(ids) :] else len(expected)
    assert tokens[:kept] == expected[:kept]  # min_length holds genai past the end token


def test_a_context_longer_than_the_position_table_exits_2_naming_it(from_file, tmp_path, capsys):
    _, saved, _ = from_file
    argv = [str(saved), "--task", "causal-lm", "-o", f"{tmp_path}/long/", "--context-length", "129"]
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--context-length 129: the model's position table (position_embedding) holds 128" in err
    assert not (tmp_path / "long").exists()


def test_rotary_positions_take_the_context_length_given(tmp_path, capsys):
    """Llama 3's rotary positions have no table, and without a preprocessor
    nothing gives a length: exit 2 naming --context-length, before any
    conversion; the length given is the config's, beside the grouped-query
    sizes (4 query heads over 2 key/value heads: hidden size 4 x 8)."""
    keras.utils.set_random_seed(2)
    backbone = keras_hub.models.Llama3Backbone(
        vocabulary_size=64,
        num_layers=1,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
    )
    saved = tmp_path / "llama.keras"
    keras_hub.models.Llama3CausalLM(backbone, preprocessor=None).save(saved)
    argv = [str(saved), "--task", "causal-lm", "-o", f"{tmp_path}/llama/", "--end-token-id", "63"]
    assert main(argv) == EXIT_USAGE
    assert "--context-length: the model's positions have no table" in capsys.readouterr().err
    assert not (tmp_path / "llama").exists()
    loaded = loading.load(saved)
    decoder = causal_lm.describe(loaded)
    assert genai_folder.position_limit(loaded) == (None, None)
    context, _ = genai_folder.context_of(loaded, None, 48)
    search = genai_folder.search_settings(ExportOptions(), context, shared=True)
    ids = genai_folder.special_ids(None, decoder.vocabulary, 63)
    heads = genai_folder.query_heads(loaded.model, decoder)
    config = genai_folder.genai_config(decoder, ids, context, search, heads)
    assert config["model"]["context_length"] == 48 and config["search"]["max_length"] == 48
    sizes = ("num_attention_heads", "num_key_value_heads", "hidden_size", "head_size")
    assert tuple(config["model"]["decoder"][name] for name in sizes) == (4, 2, 32, 8)


def test_the_folders_settings_are_refused_for_a_file(tmp_path):
    with pytest.raises(UsageError, match=r"context_length=64: sets the genai folder's"):
        export_model("never read.keras", tmp_path / "x.onnx", ExportOptions(context_length=64))
    with pytest.raises(UsageError, match=r"only with task='causal-lm' and a folder output"):
        options = ExportOptions(sampler="top_k")
        export_model("never read.keras", tmp_path / "x.onnx", options, task="causal-lm")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "flags, words",
    [
        (["-o", "{tmp}/out/"], "a folder is written only for --task causal-lm"),
        (["--task", "causal-lm", "-o", "{tmp}/out/", "--report", "{tmp}/r.json"], "--report"),
        (["--task", "causal-lm", "-o", "{tmp}/out/", "--external-data", "always"], "always"),
        (
            ["--task", "causal-lm", "-o", "{tmp}/out/", "--decoder-min-agreement", "1.5"],
            "--decoder-min-agreement",
        ),
        (["--sampler", "top_k"], "--sampler top_k: sets the genai folder's genai_config.json"),
        (
            ["--task", "causal-lm", "-o", "{tmp}/out.onnx", "--context-length", "64"],
            "only with --task causal-lm and a folder output (-o FOLDER/)",
        ),
        (
            ["--task", "causal-lm", "-o", "{tmp}/out/", "--top-k", "3"],
            "--top-k 3: a number of the top_k sampler; add --sampler top_k",
        ),
        (
            ["--sampler", "greedy", "--temperature", "2"],
            "--temperature 2.0: a number of the top_k or top_p sampler",
        ),
        (
            ["--task", "causal-lm", "-o", "{tmp}/out/", "--sampler", "top_p", "--top-p", "1.5"],
            "--top-p 1.5: give a number in (0, 1]",
        ),
        (
            ["--task", "causal-lm", "-o", "{tmp}/out/", "--end-token-id", "-1"],
            "--end-token-id -1: give a token id >= 0",
        ),
        (
            ["--task", "causal-lm", "-o", "{tmp}/out/", "--context-length", "1"],
            "--context-length 1: give a whole number >= 2",
        ),
        (["{tmp}/lm.onnx", "--check-only", "--sampler", "top_p"], "--sampler top_p: sets"),
    ],
    ids=[
        "forward task",
        "report elsewhere",
        "external data",
        "agreement over 1",
        "sampler for a file",
        "context for a file",
        "top-k without its sampler",
        "temperature of greedy",
        "top-p over 1",
        "negative end id",
        "context of 1",
        "sampler with check-only",
    ],
)
def test_what_a_folder_does_not_take_exits_2_before_any_work(tmp_path, capsys, flags, words):
    model = tmp_path / "lm.keras"
    model.write_bytes(b"not read: the flags are refused first")
    (tmp_path / "lm.onnx").write_bytes(b"not read either (--check-only)")
    argv = [str(model), *(flag.format(tmp=tmp_path) for flag in flags)]
    assert main(argv) == EXIT_USAGE
    assert words in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _preprocessor(start, end, pad):
    """A stand-in preprocessor whose tokenizer has these ids."""
    tokenizer = type("Tokenizer", (), {"start_token_id": start, "end_token_id": end})()
    tokenizer.pad_token_id = pad
    return type("Preprocessor", (), {"tokenizer": tokenizer})()


def test_special_ids_outside_the_vocabulary_are_refused():
    with pytest.raises(UsageError, match="eos id 99 lies outside the decoder's vocabulary of 50"):
        genai_folder.special_ids(_preprocessor(1, 99, 0), 50)
    with pytest.raises(UsageError, match="end_token_id=50: outside the decoder's vocabulary"):
        genai_folder.special_ids(None, 50, 50)


def test_the_end_id_given_is_the_tokenizers_or_fills_its_gap():
    ids = genai_folder.special_ids
    assert ids(_preprocessor(1, 2, 0), 50) == genai_folder.SpecialIds(1, 2, 0)
    assert ids(_preprocessor(1, 2, 0), 50, 2) == genai_folder.SpecialIds(1, 2, 0)
    with pytest.raises(UsageError, match="end_token_id=7: the preprocessor's Tokenizer ends at 2"):
        ids(_preprocessor(1, 2, 0), 50, 7)
    with pytest.raises(UsageError, match="Tokenizer has no end token"):
        ids(_preprocessor(1, None, 0), 50)
    assert ids(_preprocessor(None, None, None), 50, 7) == genai_folder.SpecialIds(7, 7, 7)
    assert ids(None, 50, 7) == genai_folder.SpecialIds(7, 7, 7)


def test_a_folder_path_is_told_by_its_slash_or_an_existing_folder(tmp_path):
    assert genai_folder.is_folder(f"{tmp_path}/new/")
    assert genai_folder.is_folder(tmp_path)
    assert not genai_folder.is_folder(tmp_path / "model.onnx")


def test_an_output_without_a_suffix_is_refused_naming_both_spellings(tmp_path, capsys):
    """Issue #45, item 4: `-o gpt2_nofolder` wrote an ONNX file without
    extension, which onnxruntime-genai cannot run (no genai_config.json).
    Neither a suffix nor a final separator: a folder or a file? Refused
    before any work, with both spellings."""
    model = tmp_path / "lm.keras"
    model.write_bytes(b"not read: the output is refused first")
    output = tmp_path / "gpt2_nofolder"
    assert main([str(model), "--task", "causal-lm", "-o", str(output)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"-o {output}: a folder or a file? Write -o {output}/ for the folder" in err
    assert f"or -o {output}.onnx for the decoder file alone" in err
    with pytest.raises(UsageError, match=r"output='.*gpt2_nofolder': a folder or a file"):
        export_model(model, output, task="causal-lm")
    assert [path.name for path in tmp_path.iterdir()] == ["lm.keras"]
    for taken in (f"{output}/", f"{output}.onnx", tmp_path):  # a slash, a suffix, a folder
        genai_folder.refuse_ambiguous_output("causal-lm", taken)
    genai_folder.refuse_ambiguous_output("forward", output)  # only a decoder has a folder


def test_another_model_exported_into_a_folder_leaves_none_of_its_files(from_file, tmp_path):
    """Issue #45, item 17: a model without preprocessor exported into the
    folder of a GPT-2 saved with its tokenizer. The GPT-2's tokenizer files
    go with its decoder (they were left beside the new one, and genai and
    `generate` ran them on it without an error); the user's file stays."""
    _, _, exported = from_file
    folder = tmp_path / "deploy"
    shutil.copytree(exported, folder, symlinks=True)
    (folder / "notes.txt").write_text("mine")
    options = ExportOptions(end_token_id=63)
    report = export_model(_ids_lm(), f"{folder}/", options, task="causal-lm")
    assert _visible(folder) == {"model.onnx", "genai_config.json", "report.json", "notes.txt"}
    assert json.loads((folder / "report.json").read_text())["onnx_path"] == report["onnx_path"]
    assert json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"] == 64
    assert (folder / "notes.txt").read_text() == "mine"
    with pytest.raises(ValueError, match="tokenizer.json"):
        generate(folder, "a prompt", 4)


def test_a_file_where_the_int4_folder_goes_exits_2_before_any_work(tmp_path, capsys):
    """Issue #45, item 18: a file at FOLDER/int4 was an internal error
    (exit 3) after the whole export; it is exit 2 naming it, before any."""
    saved = tmp_path / "lm.keras"
    _ids_lm().save(saved)
    folder = tmp_path / "deploy"
    folder.mkdir()
    (folder / "int4").write_text("mine")
    argv = [str(saved), "--task", "causal-lm", "-o", f"{folder}/", "--quantize", "int4"]
    assert main([*argv, "--end-token-id", "63"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{folder}/int4 is a file, where the export's int4 folder goes; remove" in err
    assert [path.name for path in folder.iterdir()] == ["int4"]
    assert (folder / "int4").read_text() == "mine"


def test_a_failed_int4_gate_in_the_working_folder_exits_1_and_keeps_it_beside(
    tmp_path, monkeypatch, capsys
):
    """Issue #45, item 18: `-o ./` with a quantized gate that fails was
    exit 3 ("PosixPath('.') has an empty name"): exit 1, the refused int4
    folder kept beside the working folder, which is as it was."""
    saved = tmp_path / "lm.keras"
    _ids_lm().save(saved)
    folder = tmp_path / "deploy"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    monkeypatch.chdir(folder)
    argv = [str(saved), "--task", "causal-lm", "-o", "./", "--quantize", "int4"]
    assert main([*argv, "--end-token-id", "63", "--decoder-max-nll-change", "0"]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert "the int4 decoder fails its gate" in err
    assert f"the int4 folder was kept as {tmp_path / 'deploy.int4.failed'}" in err
    assert [path.name for path in folder.iterdir()] == ["notes.txt"]
    assert (tmp_path / "deploy.int4.failed" / "model.onnx").is_file()


def test_a_refused_int4_folder_is_not_moved_onto_a_link_leading_nowhere(tmp_path):
    """Issue #45, item 18: a dangling link at FOLDER.int4.failed was an
    internal error (exit 3) when the gate failed: the gate's failure is
    raised (exit 1), saying the folder was not kept, and the link stays."""
    staging = tmp_path / "staging"
    (staging / "int4").mkdir(parents=True)
    kept = tmp_path / "deploy.int4.failed"
    kept.symlink_to(tmp_path / "nowhere")
    gate = {"passed": False, "failure": "greedy agreement 0.1 < 0.5"}
    options = ExportOptions(quantize="int4")
    with pytest.raises(ValidationFailed, match=r"int4 folder was not kept \(.*failed exists"):
        folder = tmp_path / "deploy"
        genai_folder._gate_quantized({"folder": {}}, staging, folder, options, (), gate)
    assert kept.is_symlink() and not kept.exists()


@pytest.fixture(scope="module")
def far_ids(tmp_path_factory):
    """A GPT-2 saved with a tokenizer one of whose ids (2,000,000,000) lies
    past the 501 rows of its embedding."""
    keras.utils.set_random_seed(1)
    base = zoo_tokenizers.build("GPT2Tokenizer")
    vocabulary = {**base.vocabulary, "zzzqqq": 2_000_000_000}
    tokenizer = keras_hub.models.GPT2Tokenizer(vocabulary=vocabulary, merges=list(base.merges))
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=tokenizer.vocabulary_size(),
        num_layers=1,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=32,
    )
    preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer, sequence_length=16)
    path = tmp_path_factory.mktemp("far_ids") / "far.keras"
    keras_hub.models.GPT2CausalLM(backbone, preprocessor=preprocessor).save(path)
    return path


@pytest.mark.parametrize(
    "flags",
    [["--task", "causal-lm", "-o", "{tmp}/deploy/"], ["--tokenizer-only", "-o", "{tmp}/tok"]],
    ids=["folder", "tokenizer only"],
)
def test_a_tokenizer_whose_ids_pass_the_embedding_exits_2_before_any_file(
    far_ids, tmp_path, capsys, flags
):
    """Issue #45, item 18: the ids were not checked against the model's rows:
    `std::bad_alloc` with --tokenizer-only (a reader's table as long as the
    largest id), an error deep in Keras' lookup in a folder export (exit 3)."""
    assert main([str(far_ids), *(flag.format(tmp=tmp_path) for flag in flags)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "GPT2Tokenizer's ids reach 2000000000, past the 501 rows of" in err
    assert list(tmp_path.iterdir()) == []
