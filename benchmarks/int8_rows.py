"""Forward int8 files with one activation scale per row against one per tensor.

    python benchmarks/int8_rows.py           # results/int8_rows.json
    python benchmarks/int8_rows.py --quick   # a smoke run: one tiny encoder

`--quantize int8` quantizes each row (token) of a MatMul's activations with its
own scale (`quantizing.quantize_rows`); ONNX Runtime's `quantize_dynamic`
alone gives the whole tensor one (`DynamicQuantizeLinear`), so that every row
of a batch changes every other's result. Both files are made from the same
float32 export of the demo encoder at two widths (vocabulary 30522, 4 layers:
the reference encoder, 256 wide with 4 heads and 1024 in the MLP, and a
768-wide one with 12 heads and 3072, BERT-base's layer), then timed
side by side (interleaved rounds, medians; ONNX Runtime with 2 intra-op
threads, as `export_bench.session` sets it) at 1x128 and 8x128. For each file,
on 8 right-padded rows of 128 to 16 real tokens: how far a row's logits in the
batch are from the same row run alone (its real tokens), and the relative L2
error and top-1 agreement of the logits against the float32 file's.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (vocabulary, width, layers, intermediate, heads): results_io.CONFIG_KEYS' order.
MODELS = {"256 wide": (30522, 256, 4, 1024, 4), "768 wide": (30522, 768, 4, 3072, 12)}
QUICK_MODELS = {"64 wide": (2000, 64, 1, 128, 4)}
SHAPES = [(1, 128, 40), (8, 128, 20)]  # (batch, length, rounds)
QUICK_SHAPES = [(8, 32, 3)]
FILES = ("per tensor", "per row")


def padded_ids(batch: int, length: int, vocabulary: int):
    """Right-padded token ids, the rows' real lengths spread from `length`
    down to an eighth of it."""
    import numpy as np

    ids = np.random.default_rng(0).integers(1, vocabulary, size=(batch, length))
    real = np.linspace(length, max(1, length // 8), batch).round().astype(int)
    return np.where(np.arange(length) < real[:, None], ids, 0).astype("int32"), real


def agreement(sessions: dict, ids, real) -> dict:
    """Per int8 file: the largest change of a row's logits (at its real
    tokens) between the batch and the row alone, and the logits' relative L2
    error and top-1 agreement against the float32 file, at real tokens."""
    import numpy as np

    def run(name, feed):
        return sessions[name].run(None, {"token_ids": feed})[0]

    mask = np.arange(ids.shape[1]) < real[:, None]
    reference = run("float32", ids)[mask]
    found = {}
    for name in FILES:
        batch = run(name, ids)
        alone = max(
            float(np.abs(run(name, ids[row : row + 1, :count])[0] - batch[row, :count]).max())
            for row, count in enumerate(real)
        )
        logits = batch[mask]
        error = np.linalg.norm(logits - reference) / np.linalg.norm(reference)
        top1 = np.mean(logits.argmax(-1) == reference.argmax(-1))
        found[name] = {
            "max_row_change_in_batch": alone,
            "relative_l2_vs_float32": float(error),
            "top1_vs_float32": float(top1),
        }
    return found


def measure(config: tuple, shapes: list, work: Path) -> dict:
    """One encoder: exported once, quantized both ways, timed and compared."""
    import numpy as np

    from benchmarks.export_bench import child_export, session
    from benchmarks.results_io import CONFIG_KEYS
    from benchmarks.timing import time_side_by_side
    from keras_layers.demo import EncoderConfig, build_encoder
    from keras_layers.export.quantizing import quantize_int8

    vocabulary, width, layers, intermediate, heads = config
    model = build_encoder(EncoderConfig(vocabulary, width, layers, heads, intermediate), seed=0)
    model.save(work / "encoder.keras")
    paths = {name: work / f"{name.replace(' ', '_')}.onnx" for name in ("float32", *FILES)}
    child_export("ours", str(work / "encoder.keras"), str(paths["float32"]))
    quantize_int8(paths["float32"], paths["per tensor"], rows=False)
    quantize_int8(paths["float32"], paths["per row"])
    sessions = {name: session(path) for name, path in paths.items()}
    latency = {}
    for batch, length, rounds in shapes:
        ids = np.random.default_rng(1).integers(1, vocabulary, (batch, length)).astype("int32")
        candidates = {
            name: lambda name=name, ids=ids: sessions[name].run(None, {"token_ids": ids})
            for name in FILES
        }
        timing = time_side_by_side(candidates, rounds=rounds, calls=1, warmup=3)
        timing["per row / per tensor"] = (
            timing["per row"]["median_ms"] / timing["per tensor"]["median_ms"]
        )
        latency[f"{batch}x{length}"] = timing
    batch, length, _ = shapes[-1]
    ids, real = padded_ids(batch, length, vocabulary)
    return {
        "config": dict(zip(CONFIG_KEYS, config, strict=True)),
        "file_bytes": {name: path.stat().st_size for name, path in paths.items()},
        "latency_ms": latency,
        "rows": agreement(sessions, ids, real),
        "real_lengths": [int(count) for count in real],
    }


def print_table(report: dict) -> None:
    print(f"\n{'model':<9} {'shape':<7} {'per tensor ms':>13} {'per row ms':>10} {'ratio':>6}")
    for label, entry in report["models"].items():
        for shape, timing in entry["latency_ms"].items():
            print(
                f"{label:<9} {shape:<7} {timing['per tensor']['median_ms']:13.2f} "
                f"{timing['per row']['median_ms']:10.2f} {timing['per row / per tensor']:6.3f}"
            )
    print(
        f"\n{'model':<9} {'scales':<10} {'max row change in batch':>23} "
        f"{'rel. L2 vs float32':>18} {'top-1 vs float32':>16}"
    )
    for label, entry in report["models"].items():
        for name, row in entry["rows"].items():
            print(
                f"{label:<9} {name:<10} {row['max_row_change_in_batch']:23.3g} "
                f"{row['relative_l2_vs_float32']:18.4f} {row['top1_vs_float32']:16.2%}"
            )


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)

    from benchmarks.results_io import run_header, save_json

    models, shapes = (QUICK_MODELS, QUICK_SHAPES) if args.quick else (MODELS, SHAPES)
    report = {**run_header("int8_rows.py", args.quick), "models": {}}
    for label, config in models.items():
        with tempfile.TemporaryDirectory(prefix="int8_rows_") as work:
            report["models"][label] = measure(config, shapes, Path(work))
    print_table(report)
    stem = save_json(report, "int8_rows", args.quick)
    print(f"wrote {stem}.json")
    return report


if __name__ == "__main__":
    main()
