"""Greedy generation with a BART-sized encoder-decoder: our folder in ONNX Runtime vs keras-hub.

    python benchmarks/seq2seq.py            # 6+6 layers, d=512, 64-token inputs, 64 new tokens
    python benchmarks/seq2seq.py --quick    # a smoke run: a tiny BART, 8 new tokens

A keras-hub `BartSeq2SeqLM` of random weights (seed 0; issue #44's size: 6
encoder and 6 decoder layers, hidden 512, 8 heads, feed-forward 2048; a
vocabulary of 32,128, T5's) is exported with `--task seq2seq-lm -o FOLDER/`
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

No end token is generated early: the end id is one the random model never
picks first (checked: both sides give 64 new tokens), so both run every
step. Median of `--rounds` rounds (default 5). HF optimum's
`ORTModelForSeq2SeqLM` on the same weights is not measured here yet (issue
#44). Writes `benchmarks/results/seq2seq.json` (`--quick`:
`seq2seq.quick.json`): `rows`, each `{"model", "batch", "ours": {"ms"},
"keras_hub": {"ms"}, "ours_opening": {"ms"}, "speedup"}`, the export's
seconds and proof, and `floor`: at batch 1 each new token reads every weight
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
        intermediate_dim=2048, max_sequence_length=1024,
    ),
    "quick": dict(
        vocabulary_size=64, num_layers=1, num_heads=2, hidden_dim=8, intermediate_dim=16,
        max_sequence_length=64,
    ),
}  # fmt: skip
START = (2, 0)  # BART's decoder start: </s> <s>


def build(quick: bool):
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.BartBackbone(**SIZES["quick" if quick else "full"])
    return keras_hub.models.BartSeq2SeqLM(backbone, preprocessor=None)


def _keras_side(model, ids, mask, new: int):
    """A timed call of keras-hub's compiled greedy generation (warmed up)."""
    import numpy as np
    from keras_hub.samplers import GreedySampler

    model.sampler, model.generate_function = GreedySampler(), None
    generate = model.make_generate_function()
    batch = len(ids)
    decoder = np.zeros((batch, len(START) + new), "int32")
    decoder[:, : len(START)] = START
    decoder_mask = np.zeros(decoder.shape, bool)
    decoder_mask[:, : len(START)] = True
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
    """The bytes of every initializer of an ONNX file (its external data included)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    total = 0
    for tensor in model.graph.initializer:
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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)

    import numpy as np

    from benchmarks.results_io import run_header, save_json
    from keras_layers.export import ExportOptions, Seq2SeqFolder, export_model, generate

    model = build(args.quick)
    length, new = (8, 8) if args.quick else (64, 64)
    rows = []
    with tempfile.TemporaryDirectory(prefix="seq2seq_") as folder:
        start = time.perf_counter()
        settings = ExportOptions(quantize="int8")  # the float folder, and int8/ in it
        report = export_model(model, f"{folder}/bart/", settings, task="seq2seq-lm")
        seconds = time.perf_counter() - start
        path = Path(folder) / "bart"
        opened, int8 = Seq2SeqFolder(path), Seq2SeqFolder(path / "int8")
        rng = np.random.default_rng(0)
        for batch in (1, 8):
            ids = rng.integers(3, SIZES["quick" if args.quick else "full"]["vocabulary_size"],
                               (batch, length)).astype("int32")  # fmt: skip
            mask = np.ones(ids.shape, bool)
            feeds = {"encoder_token_ids": ids, "encoder_padding_mask": mask,
                     "decoder_token_ids": np.array([START] * batch)}  # fmt: skip
            keras_run = _keras_side(model, ids, mask, new)
            ours_ms, keras_ms, opening_ms, int8_ms = [], [], [], []
            same = None
            for _ in range(args.rounds):
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
            ours, keras = statistics.median(ours_ms), statistics.median(keras_ms)
            rows.append({
                "model": "BART-sized" if not args.quick else "tiny BART",
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
            })  # fmt: skip
        bandwidth_floor = floor(path / "decoder_with_past_model.onnx", new,
                                rows[0]["keras_hub"]["ms"])  # fmt: skip
    result = {
        **run_header("seq2seq.py", args.quick),
        "config": SIZES["quick" if args.quick else "full"],
        "rounds": args.rounds,
        "export": {"passed": report["passed"], "seconds": round(seconds, 1)},
        "fused": {name: report[name]["graph"]["fused"] for name in ("encoder", "decoder")},
        "int8_gate": {
            key: report["quantized"]["int8"][key]
            for key in ("greedy_agreement", "mean_abs_log_prob_change", "file_bytes", "passed")
        },
        "rows": rows,
        "floor": bandwidth_floor,
    }
    print(
        f"{'model':<12}{'batch':>6}{'ours ms':>10}{'int8 ms':>10}{'keras-hub ms':>14}"
        f"{'speedup':>9}{'int8':>7}{'same':>6}"
    )
    for row in rows:
        print(
            f"{row['model']:<12}{row['batch']:>6}{row['ours']['ms']:>10}"
            f"{row['ours_int8']['ms']:>10}{row['keras_hub']['ms']:>14}{row['speedup']:>9}"
            f"{row['ours_int8']['speedup']:>7}{row['same_tokens']!s:>6}"
        )
    print(
        f"batch-1 floor: {bandwidth_floor['decoder_weights_mb']} MB of decoder weights a token "
        f"at {bandwidth_floor['read_gb_per_s']} GB/s = {bandwidth_floor['step_ms']} ms a step; "
        f"at best {bandwidth_floor['best_speedup_batch_1']}x keras-hub at batch 1"
    )
    stem = save_json(result, "seq2seq", args.quick)
    print(f"wrote {stem}.json")
    return result


if __name__ == "__main__":
    main()
