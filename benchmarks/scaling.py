"""How latency and export cost grow with sequence length and vocabulary size.

    python benchmarks/scaling.py [--quick]

Two sweeps over the reference encoder (`keras_layers.demo.REFERENCE_ENCODER`), each
exported our way (`export/`) in its own process and run in ONNX Runtime with the
same session settings as `export_bench.py`:

- sequence length 32 ... 2048 at batch 1, vocabulary 30522 (one export: the
  graph does not depend on the length);
- vocabulary 8k ... 256k at (1, 128), each vocabulary exported anew (time, peak
  RSS and file size of each export).

Every row gives the model's matmul FLOPs at that point (the same shapes as the
matmul bound of `export_bench.py`, 2*M*K*N each) and the cost per GFLOP relative
to the first row: a value that stays near 1 means the cost grows with the FLOPs;
one that climbs is a knee. Writes benchmarks/results/scaling.json and .png.
`--quick` runs a tiny encoder on short sweeps (a CI smoke test; nothing timed is
asserted).
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.export_bench import matmul_shapes, run_child, session  # noqa: E402
from benchmarks.results_io import finish_figure, header, save  # noqa: E402
from benchmarks.timing import time_side_by_side  # noqa: E402
from keras_layers.demo import EncoderConfig, build_encoder  # noqa: E402

FULL = {
    "lengths": [32, 64, 128, 256, 512, 1024, 2048],
    "vocabularies": [8192, 32768, 65536, 131072, 262144],
    "config": (30522, 256, 4, 1024, 4),
    "rounds": 7,
}
QUICK = {
    "lengths": [8, 32],
    "vocabularies": [512, 2048],
    "config": (1000, 32, 1, 64, 4),
    "rounds": 2,
}


def gflops(batch, length, config) -> float:
    return (
        sum(
            2 * a[-2] * a[-1] * b[-1] * (a[0] if len(a) == 3 else 1)
            for a, b in matmul_shapes(batch, length, config)
        )
        / 1e9
    )


def export(config, work: Path) -> tuple:
    vocabulary, width, layers, intermediate, heads = config
    config = EncoderConfig(vocabulary, width, layers, heads, intermediate, name="reference_encoder")
    model = build_encoder(config, seed=0)
    model_path = work / f"encoder_{vocabulary}.keras"
    model.save(model_path)
    onnx_path = work / f"encoder_{vocabulary}.onnx"
    result = run_child("ours", model_path, onnx_path)
    result["file_bytes"] = onnx_path.stat().st_size
    result["param_bytes"] = 4 * model.count_params()
    return onnx_path, result


def latency(onnx_path, batch, length, vocabulary, rounds) -> dict:
    import numpy as np

    sess = session(onnx_path)
    ids = np.random.default_rng(0).integers(1, vocabulary, size=(batch, length)).astype("int32")
    timing = time_side_by_side(
        {"ours": lambda: sess.run(None, {"token_ids": ids})}, rounds=rounds, calls=1, warmup=2
    )
    return timing["ours"]


def relative_cost(rows):
    first = rows[0]["median_ms"] / rows[0]["gflops"]
    for row in rows:
        row["ms_per_gflop"] = row["median_ms"] / row["gflops"]
        row["cost_per_flop_vs_first"] = row["ms_per_gflop"] / first
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    config, rounds = plan["config"], plan["rounds"]
    work = Path(tempfile.mkdtemp(prefix="scaling_"))

    onnx_path, _ = export(config, work)
    by_length = []
    for length in plan["lengths"]:
        timing = latency(onnx_path, 1, length, config[0], rounds)
        by_length.append({"length": length, "gflops": gflops(1, length, config), **timing})
        print(f"length {length:5d}: {timing['median_ms']:9.2f} ms", flush=True)

    by_vocabulary = []
    for vocabulary in plan["vocabularies"]:
        swept = (vocabulary, *config[1:])
        path, exported = export(swept, work)
        timing = latency(path, 1, 128, vocabulary, rounds)
        by_vocabulary.append(
            {
                "vocabulary": vocabulary,
                "gflops": gflops(1, 128, swept),
                **timing,
                "export_seconds": exported["seconds"],
                "export_peak_rss_mb": exported["peak_rss_mb"],
                "file_bytes": exported["file_bytes"],
                "size_ratio": exported["file_bytes"] / exported["param_bytes"],
            }
        )
        path.unlink()
        print(
            f"vocabulary {vocabulary:7d}: {timing['median_ms']:8.2f} ms, "
            f"export {exported['seconds']:.1f} s, {exported['peak_rss_mb']:.0f} MB",
            flush=True,
        )

    report = {
        **header("scaling.py", args.quick, config),
        "by_length": relative_cost(by_length),
        "by_vocabulary": relative_cost(by_vocabulary),
    }
    return save(report, "scaling", args.quick, print_table, plot)


def print_table(report):
    print(f"\n{'length':>7} {'GFLOP':>8} {'median ms':>10} {'p90 ms':>8} {'cost/FLOP':>10}")
    for row in report["by_length"]:
        print(
            f"{row['length']:7d} {row['gflops']:8.2f} {row['median_ms']:10.2f} "
            f"{row['p90_ms']:8.2f} {row['cost_per_flop_vs_first']:10.2f}"
        )
    print(
        f"\n{'vocab':>7} {'GFLOP':>8} {'median ms':>10} {'cost/FLOP':>10} "
        f"{'export s':>9} {'peak MB':>8} {'x params':>9}"
    )
    for row in report["by_vocabulary"]:
        print(
            f"{row['vocabulary']:7d} {row['gflops']:8.2f} {row['median_ms']:10.2f} "
            f"{row['cost_per_flop_vs_first']:10.2f} {row['export_seconds']:9.1f} "
            f"{row['export_peak_rss_mb']:8.0f} {row['size_ratio']:9.3f}"
        )


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for axis, key, label in (
        (axes[0], "by_length", "length"),
        (axes[1], "by_vocabulary", "vocabulary"),
    ):
        rows = report[key]
        xs = [row[label] for row in rows]
        axis.loglog(xs, [row["median_ms"] for row in rows], "o-", label="ONNX Runtime, ours")
        scale = rows[0]["median_ms"] / rows[0]["gflops"]
        axis.loglog(xs, [row["gflops"] * scale for row in rows], "--", label="FLOPs (scaled)")
        axis.set_xlabel(f"{label} (batch 1" + (", seq 128)" if label == "vocabulary" else ")"))
        axis.set_ylabel("median latency, ms")
        axis.legend()
    finish_figure(fig, report, path)


if __name__ == "__main__":
    main()
