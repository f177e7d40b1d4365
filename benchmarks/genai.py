"""Generation speed in onnxruntime-genai: our folders against keras-hub and genai's own builder.

    python benchmarks/genai.py              # 128-token prompts + 128 new tokens, batch 1 and 8
    python benchmarks/genai.py --quick      # a smoke run: 16 + 8 tokens, tiny models, 2 rounds
    python benchmarks/genai.py --builder    # also onnxruntime-genai's model builder (torch)

The two keras-hub causal LMs of `benchmarks/generate.py` (GPT-2-style and
Llama-style, about 10M parameters, random weights, no preprocessor: token ids
in, token ids out), each exported by `--task causal-lm -o FOLDER/` (twice:
`--quantize int8` and `--quantize int4`, their gates opened, since a tiny random
model's quantized tokens say nothing; the gates' figures are recorded), then
generating greedily from the same random prompts:

- `genai_fp32`: the float folder in onnxruntime-genai (`og.Model`, a greedy
  `og.Generator` loop on ids); its `past_present_share_buffer` is recorded;
- `genai_fp32_all_cores`: the same with `intra_op_num_threads` set to the
  machine's cores: genai's default is half of them (one thread here), where
  ONNX Runtime and TensorFlow use them all;
- `genai_int8`, `genai_int4`: the quantized folders (`FOLDER/int8/`,
  `FOLDER/int4/`, weight-only `MatMulNBits`) in onnxruntime-genai;
- `ours_generate`: the float folder's `model.onnx` through
  `keras_layers.export.generate` (a `CachedDecoder`, our own loop);
- `keras_hub`: keras-hub's own `CausalLM.generate`, compiled, greedy sampler;
- `builder` (with `--builder`, when torch and transformers are installed): the
  folder onnxruntime-genai's model builder (`python -m
  onnxruntime_genai.models.builder -i HF -p fp32 -e cpu`) makes from the same
  weights, written as a Hugging Face checkpoint by keras-hub's
  `export_to_transformers` (a word-level tokenizer of the ids is written beside
  it: the builder loads one). Where the export or the builder fails for a
  family, the JSON holds the reason instead of numbers.

Every genai generator is given `min_length = max_length = prompt + new`, so no
row stops early at the end id (0 in our folders, `--end-token-id 0`: a model
without preprocessor has none); the length each candidate reached is recorded, and so is whether
keras-hub's new tokens hold that id (where genai must then differ).

Each candidate runs once per round, in turn (the whole generation, then one
new token alone: the time to the first token), and the medians over rounds are
compared (`benchmarks/timing.py`); ONNX Runtime, genai and TensorFlow keep
their default threads. Tokens per second count new tokens only (batch x 128)
and include the prompt. Peak RSS is each candidate's own: the high-water RSS
(VmHWM; `ru_maxrss` would keep the forked parent's) of a child process
(`--child`) that loads it and runs one generation at batch 8, imports included
(TensorFlow for keras_hub). Whether each candidate's tokens equal keras-hub's
is recorded at every point. The issue's targets (genai_fp32 >= 5x keras_hub at
batch 1, >= 3x at batch 8; builder / genai_fp32 <= 1.1 at every point) are
printed with the measured ratios and recorded, met or not.
Writes `benchmarks/results/genai.json` and `.png`.
"""

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.generate import BATCHES, NEW, PROMPT, QUICK_SIZES, ROUNDS, SIZES, build  # noqa: E402

CANDIDATES = (
    "genai_fp32",
    "genai_fp32_all_cores",
    "genai_int8",
    "genai_int4",
    "ours_generate",
    "keras_hub",
)
# genai runs a session on half the machine's cores by default (its
# `CreateSessionOptionsFromConfig`: one thread on a 2-core machine), ONNX
# Runtime and TensorFlow on all of them: this candidate is the fp32 folder
# with `intra_op_num_threads` set to the machine's cores (`og.Config.overlay`).
ALL_CORES = "genai_fp32_all_cores"
BUILDER = "builder"
# The targets: genai_fp32 over keras_hub's tokens per second, by batch;
# the builder's folder over ours, at most, at every point.
KERAS_HUB_TARGETS = {1: 5.0, 8: 3.0}
BUILDER_TARGET = 1.1
# Random weights make the quantized gates meaningless: open them, record the figures.
OPEN_GATES = ["--decoder-min-agreement", "0", "--decoder-max-nll-change", "1000"]
# No preprocessor: the end id is any (0, as before one was asked for), and the
# context holds the longest run (Llama's rotary positions have no table;
# GPT-2's holds 512).
ID_FOLDER = ["--end-token-id", "0", "--context-length", "512"]
# keras-hub's exporter writes no `architectures` for GPT-2; transformers' name for it.
HF_ARCHITECTURES = {"gpt2": ["GPT2LMHeadModel"]}
RSS_BATCH = max(BATCHES)
RSS_NOTE = (
    "peak RSS (VmHWM) of a child process that loads the candidate and runs one generation at "
    f"batch {RSS_BATCH} (imports included: TensorFlow for keras_hub), in MB"
)


def genai_tokens(model, ids, new: int):
    """Greedy tokens of an onnxruntime-genai model, never stopping early.

    Args:
        model: an `og.Model` (a folder of ids: no tokenizer is used).
        ids: int32 array (batch, prompt) of prompt ids.
        new: how many tokens each row gains.

    Returns:
        int64 array (batch, longest sequence): each row's prompt and new tokens,
        -1 after a row that ended short (none should: min_length = max_length).
    """
    import numpy as np
    import onnxruntime_genai as og

    batch, length = ids.shape[0], ids.shape[1] + new
    params = og.GeneratorParams(model)
    params.set_search_options(
        max_length=length, min_length=length, do_sample=False, batch_size=batch
    )
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    rows = [np.asarray(generator.get_sequence(row)) for row in range(batch)]
    tokens = np.full((batch, max(len(row) for row in rows)), -1, "int64")
    for index, row in enumerate(rows):
        tokens[index, : len(row)] = row
    return tokens


def keras_hub_tokens(model, ids, new: int):
    """keras-hub's compiled greedy `generate` on ids, as benchmarks/generate.py calls it.

    Args:
        model: a keras-hub `CausalLM` without preprocessor, compiled with the greedy sampler.
        ids: int32 array (batch, prompt) of prompt ids.
        new: how many tokens each row gains.

    Returns:
        array (batch, prompt + new) of token ids.
    """
    import numpy as np

    batch, prompt = ids.shape
    padded = np.concatenate([ids, np.zeros((batch, new), "int32")], axis=1)
    mask = np.repeat((np.arange(prompt + new) < prompt)[None], batch, 0)
    feed = {"token_ids": padded, "padding_mask": mask}
    return np.asarray(model.generate(feed, stop_token_ids=None)["token_ids"])


def _export(saved: Path, out: Path, quantize: str) -> dict:
    """`--task causal-lm -o OUT/ --quantize KIND`, the gate opened; the folder's report."""
    from keras_layers.export.cli import main as cli

    argv = [str(saved), "--task", "causal-lm", "-o", f"{out}/", "-q", "--quantize", quantize]
    code = cli(argv + OPEN_GATES + ID_FOLDER)
    if code != 0:
        raise RuntimeError(f"the export to {out}/ (--quantize {quantize}) exited {code}")
    return json.loads((out / "report.json").read_text())


def _gate(report: dict, kind: str) -> dict:
    """The quantized folder's gate figures, and whether the default gate would pass them."""
    from keras_layers.export.decoder_gate import MAX_NLL_CHANGE, MIN_AGREEMENT

    gate = report["folder"]["quantized"][kind]
    agreement, change = gate["greedy_agreement"], gate["mean_abs_log_prob_change"]
    return {
        "greedy_agreement": agreement,
        "mean_abs_log_prob_change": change,
        "genai_agreement": gate.get("genai_agreement"),
        "passes_default_gate": agreement >= MIN_AGREEMENT and change <= MAX_NLL_CHANGE,
    }


def folder_facts(folder: Path) -> dict:
    """Bytes of a genai folder's model files and its config's search option.

    Args:
        folder: a folder holding `genai_config.json` and the model's files.

    Returns:
        `model_bytes` (every file of the folder but the JSON ones: the model and
        its data files), `past_present_share_buffer` and the config's `eos_token_id`.
    """
    config = json.loads((folder / "genai_config.json").read_text())
    files = [path for path in folder.iterdir() if path.is_file() and path.suffix != ".json"]
    return {
        "model_bytes": sum(path.stat().st_size for path in files),
        "past_present_share_buffer": config["search"].get("past_present_share_buffer"),
        "eos_token_id": config["model"].get("eos_token_id"),
    }


def export_folders(model, kind: str, folder: Path) -> tuple:
    """Save the model, export its float, int8 and int4 genai folders.

    Args:
        model: the keras-hub causal LM (`benchmarks.generate.build`).
        kind: `"gpt2"` or `"llama"` (names the files).
        folder: where the saved model and the folders are written.

    Returns:
        (paths, files): each candidate's path (a genai folder, the float
        `model.onnx` for ours_generate, the `.keras` file for keras_hub), and
        each candidate's file facts (`folder_facts`, and the quantized gates).
    """
    saved = folder / f"{kind}.keras"
    model.save(saved)
    int8, int4 = folder / f"{kind}_int8", folder / f"{kind}_int4"
    reports = {"int8": _export(saved, int8, "int8"), "int4": _export(saved, int4, "int4")}
    paths = {
        "genai_fp32": int8,
        ALL_CORES: int8,
        "genai_int8": int8 / "int8",
        "genai_int4": int4 / "int4",
        "ours_generate": int8 / "model.onnx",
        "keras_hub": saved,
    }
    files = {name: folder_facts(paths[name]) for name in ("genai_fp32", "genai_int8", "genai_int4")}
    files["genai_fp32"]["export_passed"] = reports["int8"]["passed"]
    files[ALL_CORES] = files["genai_fp32"] | {"intra_op_num_threads": os.cpu_count()}
    for quantize in ("int8", "int4"):
        files[f"genai_{quantize}"]["gate"] = _gate(reports[quantize], quantize)
    files["ours_generate"] = {"model_bytes": paths["ours_generate"].stat().st_size}
    files["keras_hub"] = {"model_bytes": saved.stat().st_size, "note": "the .keras file"}
    return paths, files


def _word_level_tokenizer(hf: Path, vocabulary: int) -> None:
    """A tokenizer of the ids (`<0>`, `<1>`, ...): the builder loads one, genai uses none here."""
    from tokenizers import Tokenizer, models

    vocab = {f"<{index}>": index for index in range(vocabulary)}
    Tokenizer(models.WordLevel(vocab, unk_token="<0>")).save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})
    )


def hf_checkpoint(model, kind: str, hf: Path) -> list:
    """keras-hub's `export_to_transformers` of the model, made loadable by the builder.

    Args:
        model: the keras-hub causal LM.
        kind: `"gpt2"` or `"llama"`.
        hf: the folder to write the checkpoint in.

    Returns:
        What was changed on the way, in words (empty when nothing was).
    """
    import keras_hub

    notes = []
    if kind == "llama":  # keras-hub exports Llama3Backbone, not its parent LlamaBackbone
        twin = keras_hub.models.Llama3Backbone.from_config(model.backbone.get_config())
        twin.set_weights(model.backbone.get_weights())
        model = keras_hub.models.Llama3CausalLM(twin, preprocessor=None)
        notes.append("LlamaBackbone exported as a Llama3Backbone of the same config and weights")
    model.export_to_transformers(str(hf))
    config = json.loads((hf / "config.json").read_text())
    if not config.get("architectures") and config.get("model_type") in HF_ARCHITECTURES:
        config["architectures"] = HF_ARCHITECTURES[config["model_type"]]
        notes.append(f"config.json: architectures {config['architectures']} added")
    vocabulary = config["vocab_size"]
    for key in ("bos_token_id", "eos_token_id"):
        if isinstance(config.get(key), int) and not 0 <= config[key] < vocabulary:
            notes.append(f"config.json: {key} {config[key]} outside the vocabulary, set to 0")
            config[key] = 0
    (hf / "config.json").write_text(json.dumps(config, indent=2))
    _word_level_tokenizer(hf, vocabulary)
    return notes


def builder_folder(model, kind: str, folder: Path) -> dict:
    """The folder onnxruntime-genai's model builder makes from the model's weights.

    Args:
        model: the keras-hub causal LM.
        kind: `"gpt2"` or `"llama"`.
        folder: where the checkpoint and the builder's folder are written.

    Returns:
        `path` (the folder, or None) and `notes`; `error` (a string) where the
        checkpoint or the builder failed.
    """
    import importlib.util

    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        return {"path": None, "notes": [], "error": f"not installed: {', '.join(missing)}"}
    hf, out = folder / f"{kind}_hf", folder / f"{kind}_builder"
    try:
        notes = hf_checkpoint(model, kind, hf)
    except Exception as error:  # noqa: BLE001 - the reason is the result
        return {"path": None, "notes": [], "error": f"export_to_transformers: {error!r}"}
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf)]
    command += ["-o", str(out), "-p", "fp32", "-e", "cpu", "-c", str(folder / "builder_cache")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0 or not (out / "genai_config.json").is_file():
        lines = [line for line in done.stderr.splitlines() if line.strip()] or ["(no output)"]
        reason = lines[-1].replace(str(hf), f"keras-hub's {kind} checkpoint")
        error = f"builder exited {done.returncode}: {reason}"
        return {"path": None, "notes": notes, "error": error}
    return {"path": out, "notes": notes, "error": None}


def genai_model(name: str, folder):
    """The candidate's `og.Model` of `folder`: on every core for `ALL_CORES`.

    Args:
        name: the candidate.
        folder: its genai folder.

    Returns:
        The model.
    """
    import onnxruntime_genai as og

    if name != ALL_CORES:
        return og.Model(str(folder))
    config = og.Config(str(folder))
    threads = {"intra_op_num_threads": os.cpu_count()}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": threads}}}))
    return og.Model(config)


def runners(model, paths: dict) -> dict:
    """Each candidate as a function of (ids, new) returning its token ids.

    Args:
        model: the keras-hub causal LM (keras_hub runs it in this process).
        paths: each candidate's path, as `export_folders` returns them.

    Returns:
        Callables by candidate name, in the order they run each round.
    """
    import onnxruntime_genai as og

    from keras_layers.export import CachedDecoder, generate

    found = {
        name: functools.partial(genai_tokens, genai_model(name, paths[name]))
        for name in ("genai_fp32", ALL_CORES, "genai_int8", "genai_int4")
    }
    decoder = CachedDecoder(paths["ours_generate"])
    found["ours_generate"] = functools.partial(generate, decoder)
    found["keras_hub"] = functools.partial(keras_hub_tokens, model)
    if paths.get(BUILDER) is not None:
        found[BUILDER] = functools.partial(genai_tokens, og.Model(str(paths[BUILDER])))
    return found


def time_point(found: dict, batch: int, vocabulary: int, prompt: int, new: int, rounds: int):
    """One batch size: every candidate's whole generation and its first token, interleaved.

    Args:
        found: callables by candidate (`runners`).
        batch: rows generated at once.
        vocabulary: prompt ids are drawn from [1, vocabulary).
        prompt: prompt length.
        new: new tokens per row.
        rounds: rounds of the side-by-side timing.

    Returns:
        (row, outputs): per candidate its seconds, new tokens per second, first
        token milliseconds and whether its sequence reached prompt + new; and
        each candidate's tokens.
    """
    import numpy as np

    from benchmarks.timing import time_side_by_side

    ids = np.random.default_rng(batch).integers(1, vocabulary, (batch, prompt)).astype("int32")
    outputs = {}

    def whole(name, run):
        def call():
            outputs[name] = run(ids, new)

        return call

    calls = {}
    for name, run in found.items():
        calls[name] = whole(name, run)
        calls[f"{name} first"] = functools.partial(run, ids, 1)
    timings = time_side_by_side(calls, rounds=rounds, calls=1, warmup=1)
    row = {"batch": batch, "prompt": prompt, "new_tokens": new}
    for name in found:
        seconds = timings[name]["median_ms"] / 1000
        tokens = np.asarray(outputs[name])
        row[name] = {
            "seconds": seconds,
            "tokens_per_second": batch * new / seconds,
            "first_token_ms": timings[f"{name} first"]["median_ms"],
            "length_reached": bool(tokens.shape[1] == prompt + new and (tokens >= 0).all()),
        }
    return row, outputs


def _compare(row: dict, outputs: dict, eos: int, prompt: int) -> None:
    """Each candidate's tokens against keras-hub's, and whether keras-hub's hold the end id."""
    import numpy as np

    reference = np.asarray(outputs["keras_hub"])
    for name, tokens in outputs.items():
        if name != "keras_hub":
            row[name]["same_tokens_as_keras_hub"] = bool(np.array_equal(tokens, reference))
    # genai may not emit its end id before min_length: it would differ from keras-hub there.
    row["end_id_in_keras_hub_new_tokens"] = bool((reference[:, prompt:] == eos).any())


def targets(row: dict) -> list:
    """The issue's targets at one point, with the measured ratios.

    Args:
        row: a row of `time_point` (with the builder's entry where it ran).

    Returns:
        One dict per target: what it compares, the ratio, the bound and whether
        it is met (None where the builder did not run; `why` says so).
    """
    speed = {
        name: row[name]["tokens_per_second"]
        for name in (*CANDIDATES, BUILDER)
        if "tokens_per_second" in row.get(name, {})
    }
    bound = KERAS_HUB_TARGETS.get(row["batch"])
    found = []
    for name in ("genai_fp32", ALL_CORES) if bound is not None else ():
        ratio = speed[name] / speed["keras_hub"]
        found.append(
            {"ratio_of": f"{name} / keras_hub", "ratio": ratio, "at_least": bound}
            | {"met": ratio >= bound}
        )
    entry = {"ratio_of": "builder / genai_fp32", "at_most": BUILDER_TARGET}
    if BUILDER in speed:
        ratio = speed[BUILDER] / speed["genai_fp32"]
        found.append(entry | {"ratio": ratio, "met": ratio <= BUILDER_TARGET})
    else:
        why = row.get(BUILDER, {}).get("error", "the builder was not run (pass --builder)")
        found.append(entry | {"ratio": None, "met": None, "why": why})
    return found


def peak_rss(name: str, path: Path, prompt: int, new: int, vocabulary: int):
    """A candidate's peak RSS: a child process loads it and runs one generation.

    Args:
        name: the candidate.
        path: its folder or file (`export_folders`).
        prompt: prompt length.
        new: new tokens per row.
        vocabulary: prompt ids are drawn from [1, vocabulary).

    Returns:
        Megabytes (the child's peak RSS, VmHWM), or the reason the child failed.
    """
    command = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--path", str(path)]
    command += ["--batch", str(RSS_BATCH), "--prompt", str(prompt), "--new", str(new)]
    command += ["--vocabulary", str(vocabulary)]
    env = os.environ | {"TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        errors = [line for line in done.stderr.splitlines() if line.strip()] or ["(no output)"]
        return f"child exited {done.returncode}: {errors[-1]}"
    return json.loads(lines[-1])["peak_rss_mb"]


def run_child(name: str, path: str, batch: int, prompt: int, new: int, vocabulary: int) -> dict:
    """`--child`: load one candidate, run one generation, report the peak RSS.

    Args:
        name: the candidate.
        path: its folder or file.
        batch: rows generated at once.
        prompt: prompt length.
        new: new tokens per row.
        vocabulary: prompt ids are drawn from [1, vocabulary).

    Returns:
        `peak_rss_mb` (VmHWM of this process) and the tokens' shape.
    """
    import numpy as np

    ids = np.random.default_rng(batch).integers(1, vocabulary, (batch, prompt)).astype("int32")
    if name == "keras_hub":
        import keras
        import keras_hub  # noqa: F401 - registers the classes the file names

        model = keras.saving.load_model(path)
        model.compile(sampler="greedy")
        tokens = keras_hub_tokens(model, ids, new)
    elif name == "ours_generate":
        from keras_layers.export import CachedDecoder, generate

        tokens = generate(CachedDecoder(path), ids, new)
    else:
        tokens = genai_tokens(genai_model(name, path), ids, new)
    return {"peak_rss_mb": _high_water_mb(), "tokens_shape": list(np.shape(tokens))}


def _high_water_mb() -> float:
    """This process's peak RSS: VmHWM, not `ru_maxrss`, which on Linux keeps the
    peak of the parent's copy forked before `exec` (the whole benchmark's)."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux


def _ratios(row: dict) -> dict:
    """New tokens per second of genai_fp32 over the other candidates' (and int8, int4 over it)."""
    speed = {name: row[name]["tokens_per_second"] for name in CANDIDATES}
    first = {name: row[name]["first_token_ms"] for name in CANDIDATES}
    return {
        "genai_fp32 / keras_hub": speed["genai_fp32"] / speed["keras_hub"],
        "genai_fp32 / ours_generate": speed["genai_fp32"] / speed["ours_generate"],
        "genai_fp32_all_cores / genai_fp32": speed[ALL_CORES] / speed["genai_fp32"],
        "genai_int8 / genai_fp32": speed["genai_int8"] / speed["genai_fp32"],
        "genai_int4 / genai_fp32": speed["genai_int4"] / speed["genai_fp32"],
        "keras_hub / genai_fp32 first token ms": first["keras_hub"] / first["genai_fp32"],
    }


def _probe_builder(found: dict, paths: dict, files: dict, vocabulary: int) -> None:
    """One short generation of the builder's folder; where genai refuses it (its CPU
    GroupQueryAttention wants a head size a multiple of 16, which the quick models'
    8 is not), the reason replaces the candidate."""
    import numpy as np

    try:
        found[BUILDER](np.ones((1, 2), "int32"), 1)
    except Exception as error:  # noqa: BLE001 - the reason is the result
        del found[BUILDER]
        paths[BUILDER] = None
        files[BUILDER]["error"] = f"genai on the builder's folder: {error}"


def measure(kind: str, sizes: dict, prompt: int, new: int, rounds: int, folder: Path, builder):
    """One model: its folders exported, every candidate timed at each batch size.

    Args:
        kind: `"gpt2"` or `"llama"` (`benchmarks.generate.build`).
        sizes: the backbone's sizes.
        prompt: prompt length.
        new: new tokens per row.
        rounds: rounds of the side-by-side timing.
        folder: where the files are written.
        builder: whether to make and time the model builder's folder too.

    Returns:
        The model's entry of the report: files, peak RSS and one row per batch size.
    """
    model = build(kind, sizes)
    paths, files = export_folders(model, kind, folder)
    if builder:
        built = builder_folder(model, kind, folder)
        paths[BUILDER] = built["path"]
        files[BUILDER] = {"notes": built["notes"], "error": built["error"]}
        if built["path"] is not None:
            files[BUILDER] |= folder_facts(built["path"])
    found = runners(model, paths)
    vocabulary = sizes["vocabulary_size"]
    if BUILDER in found:
        _probe_builder(found, paths, files, vocabulary)
    rows = []
    for batch in BATCHES:
        row, outputs = time_point(found, batch, vocabulary, prompt, new, rounds)
        _compare(row, outputs, files["genai_fp32"]["eos_token_id"], prompt)
        if builder and paths[BUILDER] is None:
            row[BUILDER] = {"error": files[BUILDER]["error"]}
        row = {"model": kind} | row | {"ratios": _ratios(row)}
        row["targets"] = targets(row)
        rows.append(row)
        speeds = ", ".join(f"{n} {row[n]['tokens_per_second']:.0f}" for n in found)
        print(f"{kind} batch {batch} tok/s: {speeds}", flush=True)
    rss = {name: peak_rss(name, paths[name], prompt, new, vocabulary) for name in found}
    return {"model": kind, "parameters": int(model.count_params()), "files": files} | {
        "peak_rss_mb": rss,
        "rows": rows,
    }


def summary(models: list) -> dict:
    """Every target of every point: whether all measured ones are met, and which are not.

    Args:
        models: the report's model entries (`measure`).

    Returns:
        `all_met` (False when any measured target is missed), `missed` and
        `not_measured`, each a list of "model batch N: ratio" strings, and
        `short_of_prompt_plus_new`: candidates whose sequences stopped early.
    """
    missed, unmeasured, short = [], [], []
    for entry in models:
        for row in entry["rows"]:
            short += [
                f"{entry['model']} batch {row['batch']}: {name}"
                for name, result in row.items()
                if isinstance(result, dict) and result.get("length_reached") is False
            ]
            for target in row["targets"]:
                where = f"{entry['model']} batch {row['batch']}: {target['ratio_of']}"
                if target["met"] is None:
                    unmeasured.append(f"{where} ({target['why']})")
                elif not target["met"]:
                    missed.append(f"{where} = {target['ratio']:.2f}")
    return {
        "all_met": not missed,
        "missed": missed,
        "not_measured": unmeasured,
        "short_of_prompt_plus_new": short,
    }


def _cell(entry: dict, row: dict, name: str) -> str:
    """One candidate's line of the table."""
    result = row.get(name, {})
    if "tokens_per_second" not in result:
        return f"{name:<21} error: {str(result.get('error'))[:100]}"
    rss = entry["peak_rss_mb"].get(name)
    rss = f"{rss:>8.0f}" if isinstance(rss, float) else f"{'error':>8}"
    size = entry["files"].get(name, {}).get("model_bytes", 0) / 1e6
    same = "-" if name == "keras_hub" else "yes" if result["same_tokens_as_keras_hub"] else "no"
    ratio = result["tokens_per_second"] / row["keras_hub"]["tokens_per_second"]
    return (
        f"{name:<21} {result['tokens_per_second']:>9.0f} {ratio:>7.2f}x "
        f"{result['first_token_ms']:>9.1f} {rss} {size:>8.2f} {same:>6}"
    )


def print_table(report: dict) -> None:
    """The table of every point and candidate, then the issue's targets with the ratios.

    Args:
        report: the report `main` builds.
    """
    head = f"{'candidate':<21} {'tok/s':>9} {'x keras':>8} {'first ms':>9} {'RSS MB':>8}"
    print(f"{'model':<6} {'batch':>5} {head} {'file MB':>8} {'= keras':>6}")
    for entry in report["models"]:
        for row in entry["rows"]:
            for name in report["candidates"]:
                print(f"{entry['model']:<6} {row['batch']:>5} {_cell(entry, row, name)}")
    print(
        "targets (the issue): genai_fp32 / keras_hub >= 5x at batch 1, >= 3x at batch 8; "
        f"builder / genai_fp32 <= {BUILDER_TARGET} at every point"
    )
    for entry in report["models"]:
        for row in entry["rows"]:
            for target in row["targets"]:
                bound = (
                    f">= {target['at_least']}"
                    if "at_least" in target
                    else (f"<= {target['at_most']}")
                )
                where = f"  {entry['model']} batch {row['batch']}: {target['ratio_of']}"
                if target["met"] is None:
                    print(f"{where} not measured ({target['why'][:120]})")
                else:
                    verdict = "met" if target["met"] else "MISSED"
                    print(f"{where} = {target['ratio']:.2f} ({bound}): {verdict}")
    print(f"all measured targets met: {report['targets']['all_met']}")
    for where in report["targets"]["short_of_prompt_plus_new"]:
        print(f"  stopped short of prompt + new tokens: {where}")


def plot(report: dict, path: Path) -> None:
    """New tokens per second of each candidate, one panel per model.

    Args:
        report: the report `main` builds.
        path: the PNG to write.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.results_io import finish_figure

    entries, names = report["models"], report["candidates"]
    fig, axes = plt.subplots(1, len(entries), figsize=(6 * len(entries), 4), squeeze=False)
    width = 0.8 / len(names)
    for axis, entry in zip(axes[0], entries, strict=True):
        rows = entry["rows"]
        for index, name in enumerate(names):
            speeds = [row.get(name, {}).get("tokens_per_second", 0) for row in rows]
            positions = [b + (index - (len(names) - 1) / 2) * width for b in range(len(rows))]
            axis.bar(positions, speeds, width, label=name)
        axis.set_xticks(range(len(rows)), [f"batch {row['batch']}" for row in rows])
        axis.set_ylabel("new tokens per second")
        axis.set_title(f"{entry['model']} ({entry['parameters'] / 1e6:.1f}M parameters)")
        axis.legend(fontsize=7)
    finish_figure(fig, report, path)


def _arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny models, 16 + 8 tokens")
    parser.add_argument(
        "--builder", action="store_true", help="also onnxruntime-genai's model builder's folder"
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)  # peak_rss's child process
    parser.add_argument("--path", help=argparse.SUPPRESS)
    for name in ("--batch", "--prompt", "--new", "--vocabulary"):
        parser.add_argument(name, type=int, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = _arguments(argv)
    if args.child:
        sizes = (args.batch, args.prompt, args.new, args.vocabulary)
        result = run_child(args.child, args.path, *sizes)
        print(json.dumps(result), flush=True)
        return result
    import onnxruntime
    import onnxruntime_genai

    from benchmarks.results_io import run_header, save

    sizes, prompt, new, rounds = (
        (QUICK_SIZES, 16, 8, 2) if args.quick else (SIZES, PROMPT, NEW, ROUNDS)
    )
    report = run_header("genai.py", args.quick) | {"sizes": sizes, "rounds": rounds}
    report["command"] += " --builder" if args.builder else ""
    report |= {"prompt": prompt, "new_tokens": new, "batches": list(BATCHES)}
    report["candidates"] = [*CANDIDATES, *([BUILDER] if args.builder else [])]
    report["versions"] = {
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime_genai": onnxruntime_genai.__version__,
    }
    report["peak_rss_note"] = RSS_NOTE
    with tempfile.TemporaryDirectory(prefix="genai_bench_") as folder:
        report["models"] = [
            measure(kind, sizes, prompt, new, rounds, Path(folder), args.builder)
            for kind in ("gpt2", "llama")
        ]
    report["targets"] = summary(report["models"])
    return save(report, "genai", args.quick, print_table, plot)


if __name__ == "__main__":
    main()
