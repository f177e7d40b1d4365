"""Generation speed: tokens per second with and without the key/value cache.

    python benchmarks/generate.py            # ~10 min: 128-token prompts + 128 new tokens
    python benchmarks/generate.py --quick    # a smoke run: 16 + 8 tokens, tiny models

Two keras-hub causal LMs of about 10M parameters, GPT-2-style and Llama-style
(grouped-query attention, rotary positions, RMSNorm), weights drawn at random,
each generating greedily from the same prompts:

- `ort_cache`: the `--task causal-lm` file through `keras_layers.export.generate`;
- `ort_recompute`: the default (`--task forward`) file, the whole sequence run
  again for every new token (what the pipeline offered before);
- `keras_hub`: keras-hub's own `CausalLM.generate`, compiled, greedy sampler;
- `int8_cache`: the cache file quantized by ONNX Runtime's `quantize_dynamic`.

Each candidate runs once per round, in turn, and the medians over rounds are
compared (`benchmarks/timing.py`); ONNX Runtime and TensorFlow keep their
default threads (both cores). Tokens per second count new tokens only (batch x
128). Whether the float files' tokens equal keras-hub's is recorded too.
Writes `benchmarks/results/generate.json` and `.png`; the tables of
`docs/generation.md` are rendered from the JSON (`benchmarks/docs_tables.py`).
"""

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPT, NEW = 128, 128
BATCHES = (1, 8)
ROUNDS = 5
# About 10M parameters each (the JSON records the exact count).
SIZES = {"vocabulary_size": 16384, "num_layers": 4, "hidden_dim": 256, "intermediate_dim": 1024}
QUICK_SIZES = {"vocabulary_size": 256, "num_layers": 2, "hidden_dim": 32, "intermediate_dim": 64}
CANDIDATES = ("ort_cache", "ort_recompute", "keras_hub", "int8_cache")


def build(kind: str, sizes: dict):
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    if kind == "gpt2":
        backbone = keras_hub.models.GPT2Backbone(num_heads=4, max_sequence_length=512, **sizes)
        model = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    else:
        backbone = keras_hub.models.LlamaBackbone(num_query_heads=4, num_key_value_heads=2, **sizes)
        model = keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)
    model.compile(sampler="greedy")
    return model


def recompute(session, ids, new_tokens):
    """Greedy decoding without a cache: the full sequence every step."""
    import numpy as np

    names = [value.name for value in session.get_inputs()]
    tokens = ids
    for _ in range(new_tokens):
        feeds = {names[0]: tokens}
        if len(names) > 1:  # the padding mask
            feeds[names[1]] = np.ones_like(tokens)
        logits = session.run(None, feeds)[0]
        tokens = np.concatenate([tokens, logits[:, -1:].argmax(-1).astype(tokens.dtype)], axis=1)
    return tokens


def measure(kind: str, sizes: dict, prompt: int, new: int, rounds: int, folder: Path) -> dict:
    import onnxruntime as ort

    from keras_layers.export import CachedDecoder, ExportOptions, export_model
    from keras_layers.export.quantizing import quantize_int8

    model = build(kind, sizes)
    cache_file, forward_file = folder / f"{kind}.onnx", folder / f"{kind}.forward.onnx"
    export_model(model, cache_file, task="causal-lm")
    export_model(model, forward_file, ExportOptions(shapes=[(1, 7), (2, prompt + new)]))
    int8_file = folder / f"{kind}.int8.onnx"
    quantize_int8(cache_file, int8_file)
    decoders = {"ort_cache": CachedDecoder(cache_file), "int8_cache": CachedDecoder(int8_file)}
    forward = ort.InferenceSession(str(forward_file), providers=["CPUExecutionProvider"])
    rows = [
        _time_batch(kind, model, decoders, forward, batch, sizes, prompt, new, rounds)
        for batch in BATCHES
    ]
    return {"model": kind, "parameters": int(model.count_params()), "rows": rows}


def _time_batch(kind, model, decoders, forward, batch, sizes, prompt, new, rounds) -> dict:
    """One batch size: the four candidates interleaved, medians and ratios."""
    import numpy as np

    from benchmarks.timing import time_side_by_side
    from keras_layers.export import generate

    rng = np.random.default_rng(batch)
    ids = rng.integers(1, sizes["vocabulary_size"], (batch, prompt)).astype("int32")
    padded = np.concatenate([ids, np.zeros((batch, new), "int32")], axis=1)
    mask = np.arange(prompt + new) < prompt
    feed = {"token_ids": padded, "padding_mask": np.repeat(mask[None], batch, 0)}
    outputs = {}

    def run(name, fn):
        def call():
            outputs[name] = fn()

        return call

    candidates = {
        "ort_cache": run("ort_cache", lambda: generate(decoders["ort_cache"], ids, new)),
        "ort_recompute": run("ort_recompute", lambda: recompute(forward, ids, new)),
        "keras_hub": run(
            "keras_hub",
            lambda: np.asarray(model.generate(feed, stop_token_ids=None)["token_ids"]),
        ),
        "int8_cache": run("int8_cache", lambda: generate(decoders["int8_cache"], ids, new)),
    }
    timings = time_side_by_side(candidates, rounds=rounds, calls=1, warmup=1)
    row = {"model": kind, "batch": batch, "prompt": prompt, "new_tokens": new}
    for name in CANDIDATES:
        seconds = timings[name]["median_ms"] / 1000
        row[name] = {"seconds": seconds, "tokens_per_second": batch * new / seconds}
    speed = {name: row[name]["tokens_per_second"] for name in CANDIDATES}
    row["cache_over_recompute"] = speed["ort_cache"] / speed["ort_recompute"]
    row["cache_over_keras_hub"] = speed["ort_cache"] / speed["keras_hub"]
    row["int8_over_float"] = speed["int8_cache"] / speed["ort_cache"]
    row["same_tokens_as_keras_hub"] = {
        name: bool(np.array_equal(outputs[name], outputs["keras_hub"]))
        for name in ("ort_cache", "ort_recompute", "int8_cache")
    }
    print(
        f"{kind} batch {batch}: "
        + ", ".join(f"{name} {speed[name]:.0f} tok/s" for name in CANDIDATES),
        flush=True,
    )
    return row


def print_table(report: dict) -> None:
    print(f"{'model':<6} {'batch':>5} " + " ".join(f"{name:>14}" for name in CANDIDATES))
    for entry in report["models"]:
        for row in entry["rows"]:
            speeds = " ".join(f"{row[name]['tokens_per_second']:>14.0f}" for name in CANDIDATES)
            print(f"{row['model']:<6} {row['batch']:>5} {speeds}")


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.results_io import finish_figure

    entries = report["models"]
    fig, axes = plt.subplots(1, len(entries), figsize=(5 * len(entries), 4), squeeze=False)
    for axis, entry in zip(axes[0], entries, strict=True):
        width = 0.8 / len(CANDIDATES)
        for index, name in enumerate(CANDIDATES):
            speeds = [row[name]["tokens_per_second"] for row in entry["rows"]]
            positions = [b + (index - 1.5) * width for b in range(len(entry["rows"]))]
            axis.bar(positions, speeds, width, label=name)
        axis.set_xticks(range(len(entry["rows"])), [f"batch {r['batch']}" for r in entry["rows"]])
        axis.set_ylabel("new tokens per second")
        axis.set_title(f"{entry['model']} ({entry['parameters'] / 1e6:.1f}M parameters)")
        axis.legend(fontsize=7)
    finish_figure(fig, report, path)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny models, 16 + 8 tokens")
    args = parser.parse_args(argv)
    from benchmarks.results_io import run_header, save

    sizes, prompt, new, rounds = (
        (QUICK_SIZES, 16, 8, 2) if args.quick else (SIZES, PROMPT, NEW, ROUNDS)
    )
    report = run_header("generate.py", args.quick) | {"sizes": sizes, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="generate_bench_") as folder:
        report["models"] = [
            measure(kind, sizes, prompt, new, rounds, Path(folder)) for kind in ("gpt2", "llama")
        ]
    return save(report, "generate", args.quick, print_table, plot)


if __name__ == "__main__":
    main()
