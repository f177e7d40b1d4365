"""Greedy generation, BART- and T5-sized: our seq2seq folder vs keras-hub and optimum.

    python benchmarks/seq2seq.py            # 6+6 layers, d=512, 64-token inputs, 64 new tokens
    python benchmarks/seq2seq.py --quick    # a smoke run: a tiny BART and T5, 8 new tokens

A keras-hub `BartSeq2SeqLM` and a `T5Seq2SeqLM` of random weights (seed 0;
issue #44's size: 6 encoder and 6 decoder layers, hidden 512, 8 heads,
feed-forward 2048, T5's t5-small's ReLU, not gated; a vocabulary of 32,128,
T5's) are each exported with `--task seq2seq-lm -o FOLDER/`
(`export_model(model, folder, task="seq2seq-lm")`, which proves the folder
first). Then, for batch 1 and 8, inputs of 64 tokens and 64 new tokens,
interleaved rounds time:

- `ours`: `keras_layers.export.generate(Seq2SeqFolder(folder), ids, 64)`:
  the encoder's file once, the decoder's once per token, NumPy between; the
  folder's two sessions opened once before the rounds, as the compiled
  function below is built once (`ours_opening`: the same call given the
  folder's path, which opens both sessions each time, about half a second);
- `ours_int8`: the same on the folder's `int8/` (`quantize="int8"`: both
  files' weights in `MatMulNBits`, gated against Keras), with how many rows
  give keras-hub's tokens exactly;
- `keras_hub`: the model's own `generate_step` with a greedy sampler, compiled
  by `make_generate_function` (XLA, as `generate` runs it), after one warm-up
  call.

No end token is generated: every side is given none, so each runs every
step. Median of `--rounds` rounds (default 5).

- `optimum`: optimum's `ORTModelForSeq2SeqLM.generate` on the same weights
  (`_optimum_side`: copied into transformers' BART, exported by optimum),
  with `ours_over_optimum` (issue #44's target: <= 1.0) and whether its
  tokens are ours; `{"error"}` without the peers extra.

Writes `benchmarks/results/seq2seq.json` (`--quick`:
`seq2seq.quick.json`): `rows`, each `{"model", "batch", "ours": {"ms"},
"keras_hub": {"ms"}, "ours_opening": {"ms"}, "speedup", "optimum"}`, and
`models`, for each its export's seconds and proof, its int8 gate and
`floor`: at batch 1 each new token reads every weight
of the decoder once, so its bytes over this machine's memory read rate
(measured here: the median time NumPy sums 512 MB) bound any float32
step from below, and `best_speedup_batch_1` says how far past keras-hub
that bound lies.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SIZES = {
    "full": dict(
        vocabulary_size=32128, num_layers=6, num_heads=8, hidden_dim=512,
        intermediate_dim=2048,
    ),
    "quick": dict(
        vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
    ),
}  # fmt: skip
# Each architecture: its label, its decoder start (BART's `</s> <s>`, T5's
# `<pad>`), its end and pad ids (for transformers' config), its own arguments
# (T5's: t5-small's feed-forward, ReLU, not gated).
MODELS = {
    "bart": ("BART-sized", (2, 0), 2, 1, {"max_sequence_length": 1024}),
    "t5": ("T5-sized", (0,), 1, 0, {"activation": "relu", "use_gated_activation": False}),
}


def build(kind: str, quick: bool):
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    sizes = {**SIZES["quick" if quick else "full"], **MODELS[kind][4]}
    if kind == "bart":
        sizes["max_sequence_length"] = 64 if quick else sizes["max_sequence_length"]
        backbone = keras_hub.models.BartBackbone(**sizes)
        return keras_hub.models.BartSeq2SeqLM(backbone, preprocessor=None)
    backbone = keras_hub.models.T5Backbone(**sizes)
    return keras_hub.models.T5Seq2SeqLM(backbone, preprocessor=None)


def _keras_side(model, ids, mask, new: int, start: tuple):
    """A timed call of keras-hub's compiled greedy generation (warmed up)."""
    import numpy as np
    from keras_hub.samplers import GreedySampler

    model.sampler, model.generate_function = GreedySampler(), None
    generate = model.make_generate_function()
    batch = len(ids)
    decoder = np.zeros((batch, len(start) + new), "int32")
    decoder[:, : len(start)] = start
    decoder_mask = np.zeros(decoder.shape, bool)
    decoder_mask[:, : len(start)] = True
    inputs = {
        "encoder_token_ids": ids,
        "encoder_padding_mask": mask,
        "decoder_token_ids": decoder,
        "decoder_padding_mask": decoder_mask,
    }

    def run():
        output = generate(inputs)  # no stop ids: every step runs
        return np.asarray(output["decoder_token_ids"])

    run()
    return run


def _optimum_side(model, kind: str, ids, mask, new: int, workdir: Path):
    """A timed call of optimum's `ORTModelForSeq2SeqLM.generate` on the same
    weights: keras-hub's copied into transformers' BART or T5
    (`transformers_weights`), exported by optimum's own exporter (its
    default files, as `from_pretrained(export=True)` writes them), then
    greedy without an end id. transformers starts BART's decoder from `</s>`
    and forces `<s>` as its first new token, so it runs one step more than
    ours for the same tokens. Returns `run`, or `{"error"}` without optimum."""
    try:
        import torch
        from optimum.onnxruntime import ORTModelForSeq2SeqLM
    except ImportError as error:
        return {"error": f"optimum-onnx is not installed (the peers extra): {error}"}
    from benchmarks.transformers_weights import transformers_model
    from keras_layers.export import transformers_config

    _, start, end, pad, _ = MODELS[kind]
    # an end id for the exporter, which needs one; generation is given none
    config = transformers_config.configs(model, start, end, pad).config
    transformers_model(model, config).save_pretrained(workdir)
    loaded = ORTModelForSeq2SeqLM.from_pretrained(workdir, export=True)
    inputs = {"input_ids": torch.tensor(ids, dtype=torch.int64),
              "attention_mask": torch.tensor(mask, dtype=torch.int64)}  # fmt: skip

    def run():
        with torch.no_grad():
            output = loaded.generate(**inputs, max_new_tokens=new + len(start) - 1,
                                     do_sample=False, num_beams=1,
                                     eos_token_id=None)  # fmt: skip
        return output.numpy()

    run()
    return run


def read_bandwidth(megabytes: int = 512, repeats: int = 5) -> float:
    """This machine's memory read rate in GB/s: the median time NumPy takes
    to sum a float32 array far larger than any cache."""
    import numpy as np

    data = np.ones(megabytes * 2**20 // 4, np.float32)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - start)
    return data.nbytes / statistics.median(times) / 1e9


def weight_bytes(path: Path) -> int:
    """The bytes of every initializer of an ONNX file (its external data
    included) but a merged decoder's cross-attention projections, which its
    first step alone reads (`merged_decoder`)."""
    import onnx

    from keras_layers.export.merged_decoder import CROSS

    model = onnx.load(str(path), load_external_data=False)
    total = 0
    for tensor in model.graph.initializer:
        if tensor.name.startswith(CROSS):
            continue
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            total += int(next(e.value for e in tensor.external_data if e.key == "length"))
        else:
            total += len(onnx.numpy_helper.to_array(tensor).tobytes())
    return total


def floor(decoder: Path, new: int, keras_ms: float) -> dict:
    """The least time a batch-1 step can take: every weight of the decoder
    is read once per token, at the rate this machine reads memory. Nothing
    at batch 1 reuses a weight, so no kernel beats it (float32 weights)."""
    bandwidth = read_bandwidth()
    size = weight_bytes(decoder)
    step_ms = size / bandwidth / 1e6
    return {
        "decoder_weights_mb": round(size / 1e6, 1),
        "read_gb_per_s": round(bandwidth, 1),
        "step_ms": round(step_ms, 2),
        "new_tokens_ms": round(step_ms * new, 1),
        "best_speedup_batch_1": round(keras_ms / (step_ms * new), 2),
    }


def _measure(kind: str, quick: bool, rounds: int, folder: Path) -> dict:
    """Export one architecture's folder (and its int8 folder) and time every side."""
    import numpy as np

    from keras_layers.export import ExportOptions, Seq2SeqFolder, export_model, generate

    label, start_tokens, *_ = MODELS[kind]
    label = label if not quick else f"tiny {label.split('-')[0]}"
    model = build(kind, quick)
    length, new = (8, 8) if quick else (64, 64)
    rows = []
    start = time.perf_counter()
    settings = ExportOptions(quantize="int8")  # the float folder, and int8/ in it
    report = export_model(model, f"{folder}/{kind}/", settings, task="seq2seq-lm")
    seconds = time.perf_counter() - start
    path = folder / kind
    opened, int8 = Seq2SeqFolder(path), Seq2SeqFolder(path / "int8")
    rng = np.random.default_rng(0)
    for batch in (1, 8):
        ids = rng.integers(3, SIZES["quick" if quick else "full"]["vocabulary_size"],
                           (batch, length)).astype("int32")  # fmt: skip
        mask = np.ones(ids.shape, bool)
        feeds = {"encoder_token_ids": ids, "encoder_padding_mask": mask,
                 "decoder_token_ids": np.array([start_tokens] * batch)}  # fmt: skip
        keras_run = _keras_side(model, ids, mask, new, start_tokens)
        optimum_run = _optimum_side(model, kind, ids, mask, new, folder / f"hf_{kind}{batch}")
        ours_ms, keras_ms, opening_ms, int8_ms, optimum_ms = [], [], [], [], []
        same, optimum_same = None, None
        for _ in range(rounds):
            t = time.perf_counter()
            tokens = generate(opened, feeds, new, end_token_id=None)
            ours_ms.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            int8_tokens = generate(int8, feeds, new, end_token_id=None)
            int8_ms.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            generate(path, feeds, new, end_token_id=None)
            opening_ms.append((time.perf_counter() - t) * 1e3)
            t = time.perf_counter()
            expected = keras_run()
            keras_ms.append((time.perf_counter() - t) * 1e3)
            same = bool((tokens == expected).all())
            if callable(optimum_run):
                t = time.perf_counter()
                theirs = optimum_run()
                optimum_ms.append((time.perf_counter() - t) * 1e3)
                optimum_same = bool((theirs == tokens).all())
        ours, keras = statistics.median(ours_ms), statistics.median(keras_ms)
        rows.append({
            "model": label,
            "batch": batch,
            "input_tokens": length,
            "new_tokens": new,
            "ours": {"ms": round(ours, 1)},
            "keras_hub": {"ms": round(keras, 1)},
            "ours_opening": {"ms": round(statistics.median(opening_ms), 1)},
            "ours_int8": {
                "ms": round(statistics.median(int8_ms), 1),
                "speedup": round(keras / statistics.median(int8_ms), 2),
                "rows_equal_to_keras_hub": int((int8_tokens == expected).all(axis=1).sum()),
            },
            "speedup": round(keras / ours, 2),
            "same_tokens": same,
            "optimum": optimum_run if not callable(optimum_run) else {
                "ms": round(statistics.median(optimum_ms), 1),
                "ours_over_optimum": round(ours / statistics.median(optimum_ms), 2),
                "same_tokens": optimum_same,
            },
        })  # fmt: skip
    return {
        "label": label,
        "rows": rows,
        "floor": floor(path / "decoder_model_merged.onnx", new, rows[0]["keras_hub"]["ms"]),
        "export": {"passed": report["passed"], "seconds": round(seconds, 1)},
        "fused": {name: report[name]["graph"]["fused"] for name in ("encoder", "decoder")},
        "int8_gate": {
            key: report["quantized"]["int8"][key]
            for key in ("greedy_agreement", "mean_abs_log_prob_change", "file_bytes", "passed")
        },
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    from benchmarks.results_io import run_header, save_json

    measured = {}
    with tempfile.TemporaryDirectory(prefix="seq2seq_") as folder:
        for kind in MODELS:
            measured[kind] = _measure(kind, args.quick, args.rounds, Path(folder))
    rows = [row for part in measured.values() for row in part["rows"]]
    result = {
        **run_header("seq2seq.py", args.quick),
        "config": SIZES["quick" if args.quick else "full"],
        "rounds": args.rounds,
        "rows": rows,
        "models": {
            part["label"]: {key: part[key] for key in ("export", "fused", "int8_gate", "floor")}
            for part in measured.values()
        },
    }
    print(
        f"{'model':<12}{'batch':>6}{'ours ms':>10}{'int8 ms':>10}{'keras-hub ms':>14}"
        f"{'speedup':>9}{'int8':>7}{'same':>6}{'optimum ms':>12}{'ours/optimum':>14}"
    )
    for row in rows:
        peer = row["optimum"]
        print(
            f"{row['model']:<12}{row['batch']:>6}{row['ours']['ms']:>10}"
            f"{row['ours_int8']['ms']:>10}{row['keras_hub']['ms']:>14}{row['speedup']:>9}"
            f"{row['ours_int8']['speedup']:>7}{row['same_tokens']!s:>6}"
            f"{peer.get('ms', 'n/a')!s:>12}{peer.get('ours_over_optimum', 'n/a')!s:>14}"
        )
    for label, part in result["models"].items():
        bound = part["floor"]
        print(
            f"{label} batch-1 floor: {bound['decoder_weights_mb']} MB of decoder weights a token "
            f"at {bound['read_gb_per_s']} GB/s = {bound['step_ms']} ms a step; "
            f"at best {bound['best_speedup_batch_1']}x keras-hub at batch 1"
        )
    stem = save_json(result, "seq2seq", args.quick)
    print(f"wrote {stem}.json")
    return result


if __name__ == "__main__":
    main()
