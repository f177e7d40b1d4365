"""Big models: peak memory and time of a whole export, from 0.1 GB to 4 GB of weights.

    python benchmarks/big_model.py                 # the sweep: tiny, 0.1/0.5/1/2/4 GB, keras-hub 1B
    python benchmarks/big_model.py --sizes 0.5     # one size only
    python benchmarks/big_model.py --no-keras-hub  # only the models built from our layers
    python benchmarks/big_model.py --sizes "" --no-keras-hub --add  # rerun the tied matrix
    python benchmarks/big_model.py --sizes "" --no-keras-hub --no-tied --add --streamed llama-7b

Each model is built with random weights and saved in a child process of its
own, then exported by `python export/to_onnx.py` in another; the export's peak
RSS is that child's own `ru_maxrss` (`os.wait4`), so neither the build nor an
earlier export counts. The models are language models built from our layers
(ScaledEmbedding(32000, d) -> SinusoidalPositionEncoding -> N keras-hub
TransformerEncoder blocks -> TiedOutputDense), sized by N and d, and a
keras-hub LlamaCausalLM of 1.1B parameters (TinyLlama's shape: 22 layers,
hidden 2048, 32 query and 4 key/value heads, intermediate 5632, vocabulary
32000). Validation runs on a small grid (1x7, 2x16, padded): the weights, not
the activations, are what this measures. Writes benchmarks/results/big_model.json
and .png; docs/performance.md's table is rendered from the JSON.

`--streamed` measures the streamed int4 export of keras-hub Llamas built and
saved in bfloat16 (`llama-1b`: TinyLlama's shape; `llama-7b`: Llama 2 7B's,
32 layers, hidden 4096, 32 heads, intermediate 11008, 6.7B parameters, 13.5 GB
in bfloat16 and 27 GB in float32): `python export/to_onnx.py MODEL --task
causal-lm --quantize int4 -o FOLDER/` (for the 1B, whose float32 export fits,
with `--weights-dtype keep`), its peak RSS against the bfloat16 bytes, the
int4 folder's size and the gate's figures against Keras on the same weights.
Such a model is saved without Keras' `model.save`, which holds the whole
weights file in memory twice while it writes the archive: its weights are
written by `save_weights` to a file, and the archive is assembled from it.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import int4_grid, results_io  # noqa: E402

# (target GB, width, layers): 32000 x d embedding + layers x 12 d^2.
OUR_MODELS = {
    # Not a size of the sweep: the fixed cost (imports, threads, the
    # libraries' own memory) every export pays, taken off the others' figures.
    0.0: (64, 1),
    0.1: (512, 3),
    0.5: (1024, 7),
    1.0: (1024, 17),
    2.0: (2048, 9),
    4.0: (2048, 19),
}
LLAMA_1B = dict(
    vocabulary_size=32000,
    num_layers=22,
    num_query_heads=32,
    num_key_value_heads=4,
    hidden_dim=2048,
    intermediate_dim=5632,
)
LLAMA_7B = dict(
    vocabulary_size=32000,
    num_layers=32,
    num_query_heads=32,
    num_key_value_heads=32,
    hidden_dim=4096,
    intermediate_dim=11008,
)
STREAMED = {"llama-1b": LLAMA_1B, "llama-7b": LLAMA_7B}
VOCABULARY = 32000
# One tied matrix, 3.9 GB: Keras' transposed copy of a tied matrix and
# TensorFlow's transient copies of the largest variable are what it tests.
TIED_GIANT = (480_000, 2048)
SHAPES = "1x7,2x16,padded"


def build_ours(width: int, layers: int):
    import keras
    import keras_hub

    from keras_layers import ScaledEmbedding, SinusoidalPositionEncoding, TiedOutputDense

    ids = keras.Input((None,), dtype="int32", name="token_ids")
    embedding = ScaledEmbedding(VOCABULARY, width, mask_zero=True)
    hidden = SinusoidalPositionEncoding()(embedding(ids))
    for _ in range(layers):
        hidden = keras_hub.layers.TransformerEncoder(4 * width, width // 64)(hidden)
    return keras.Model(ids, TiedOutputDense(embedding, name="logits")(hidden))


def build_llama(config=None, dtype="float32", on_grid=False):
    """TinyLlama's shape (or `config`), every weight drawn anew: keras-hub
    draws a layer's key and value kernels from one seeded initializer, equal
    values a trained model never has (and the export would store once).
    `on_grid`: the matrices drawn on the int4 grid (`int4_grid`)."""
    import keras_hub
    import numpy as np

    backbone = keras_hub.models.LlamaBackbone(**(config or LLAMA_1B), dtype=dtype)
    rng = np.random.default_rng(0)
    if on_grid:
        int4_grid.redraw(backbone, rng)
        return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    for variable in backbone.weights:
        scale = 0.02 if len(variable.shape) > 1 else 1.0
        values = rng.standard_normal(variable.shape, dtype=np.float32) * scale
        variable.assign(values if len(variable.shape) > 1 else np.ones_like(values))
        del values
    return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)


def save_without_buffering(model, path: Path) -> None:
    """The `.keras` archive `model.save` writes (config, metadata, weights
    stored uncompressed), its weights file written to disk by `save_weights`
    and copied into the archive a piece at a time."""
    import zipfile

    import keras
    from keras.src.saving import saving_lib

    weights = path.with_suffix(".weights.h5")
    model.save_weights(weights)
    config = keras.saving.serialize_keras_object(model)
    metadata = {
        "keras_version": keras.__version__,
        "date_saved": time.strftime("%Y-%m-%d@%H:%M:%S"),
    }
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr(saving_lib._CONFIG_FILENAME, json.dumps(config))
        archive.writestr(saving_lib._METADATA_FILENAME, json.dumps(metadata))
        entry = zipfile.ZipInfo(saving_lib._VARS_FNAME_H5, time.localtime()[:6])
        entry.file_size = weights.stat().st_size
        with open(weights, "rb") as source, archive.open(entry, "w", force_zip64=True) as target:
            while piece := source.read(64 << 20):
                target.write(piece)
    weights.unlink()


def build_tied_giant():
    """ScaledEmbedding(480000, 2048) -> TiedOutputDense: one tied matrix."""
    import keras

    from keras_layers import ScaledEmbedding, TiedOutputDense

    ids = keras.Input((None,), dtype="int32", name="token_ids")
    embedding = ScaledEmbedding(*TIED_GIANT)
    return keras.Model(ids, TiedOutputDense(embedding, name="logits")(embedding(ids)))


def _build(name: str, path: str) -> None:
    """Child process: build model `name`, save it to `path`, print its size."""
    if name.endswith(("-bf16", "-bf16-grid")):
        on_grid = name.endswith("-grid")
        size = name.removesuffix("-grid").removesuffix("-bf16")
        model = build_llama(STREAMED[size], "bfloat16", on_grid)
        parameters = model.count_params()
        save_without_buffering(model, Path(path))
        print(json.dumps({"parameters": parameters}))
        return
    builders = {"llama-1b": build_llama, "tied": build_tied_giant}
    model = builders[name]() if name in builders else build_ours(*OUR_MODELS[float(name)])
    parameters = model.count_params()
    model.save(path)
    print(json.dumps({"parameters": parameters}))


def _run_measured(command: list) -> tuple[int, float, float, str]:
    """Run `command`; its exit code, seconds, own peak RSS in bytes, stderr tail."""
    start = time.perf_counter()
    child = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT
    )
    stderr = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, time.perf_counter() - start, usage.ru_maxrss * 1024, stderr[-800:]


def _label(name: str) -> str:
    if name == "llama-1b":
        return "keras-hub LlamaCausalLM 1.1B"
    if name == "tied":
        return "ours, one tied 480000 x 2048 matrix"
    return "ours, tiny (fixed cost)" if float(name) == 0 else f"ours {name} GB"


def _over_fixed_cost(rows: list) -> None:
    """Each row's peak and seconds less the tiny model's, per weight byte: what
    the weights themselves cost, which the fixed cost hides at small sizes."""
    tiny = next((row for row in rows if row["model"] == _label("0.0")), None)
    if tiny is None:
        return
    for row in rows:
        if row is not tiny and row["exit_code"] == 0:
            weights_gb = row["param_gb"] - tiny["param_gb"]
            row["added_peak_over_params"] = round(
                (row["peak_rss_gb"] - tiny["peak_rss_gb"]) / weights_gb, 2
            )
            row["added_seconds_per_gb"] = round((row["seconds"] - tiny["seconds"]) / weights_gb, 1)


def measure(name: str, work: Path) -> dict:
    model = work / "model.keras"
    built = subprocess.run(
        [sys.executable, __file__, "--build", name, str(model)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    parameters = json.loads(built.stdout.strip().splitlines()[-1])["parameters"]
    output = work / "model.onnx"
    code, seconds, peak, stderr = _run_measured(
        [sys.executable, "export/to_onnx.py", str(model), "-o", str(output), "--shapes", SHAPES]
    )
    report = json.loads((work / "model.report.json").read_text()) if code in (0, 1) else {}
    param_bytes = 4 * parameters
    row = {
        "model": _label(name),
        "parameters": parameters,
        "param_gb": round(param_bytes / 1e9, 3),
        "exit_code": code,
        "passed": report.get("passed"),
        "seconds": round(seconds, 1),
        "seconds_per_gb": round(seconds / (param_bytes / 1e9), 1),
        "peak_rss_gb": round(peak / 1e9, 2),
        "peak_over_params": round(peak / param_bytes, 2),
        "external_data": report.get("external_data"),
        "stage_seconds": report.get("stage_seconds"),
        "worst_abs_diff": (report.get("worst") or {}).get("max_abs_diff"),
        "file_over_params": report.get("size_ratio"),
        "fused": {op: n for op, n in ((report.get("graph") or {}).get("fused") or {}).items() if n},
    }
    if code not in (0, 1):
        row["stderr_tail"] = stderr
    for path in work.iterdir():
        path.unlink()
    return row


def measure_streamed(name: str, work: Path, on_grid: bool = False) -> dict:
    """The streamed int4 export of keras-hub Llama `name` saved in bfloat16;
    `on_grid`: its matrices on the int4 grid, the folder computing in float32
    (`--decoder-accuracy-level 1`) and judged by the default gate."""
    model = work / "model.keras"
    start = time.perf_counter()
    built = subprocess.run(
        [
            sys.executable,
            __file__,
            "--build",
            f"{name}-bf16{'-grid' if on_grid else ''}",
            str(model),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    build_seconds = time.perf_counter() - start
    parameters = json.loads(built.stdout.strip().splitlines()[-1])["parameters"]
    folder = work / "folder"
    command = [sys.executable, "export/to_onnx.py", str(model), "--task", "causal-lm"]
    command += ["--quantize", "int4", "-o", f"{folder}/"]
    # No preprocessor: the end id is any (0, as before one was asked for), and
    # the rotary positions take the context the folders had (2048).
    command += ["--end-token-id", "0", "--context-length", "2048"]
    command += ["--weights-dtype", "keep"] if name == "llama-1b" else []
    if on_grid:  # 4 bits hold these weights: the default gate judges
        command += ["--decoder-accuracy-level", "1"]
    else:
        # Random weights: near-flat distributions whose greedy tokens 4 bits
        # flip (the float32 path's int4 flips the same ones: the same bytes).
        # The gate is opened to measure the export; the table judges its
        # figures against the default thresholds.
        command += ["--decoder-min-agreement", "0", "--decoder-max-nll-change", "10"]
    code, seconds, peak, stderr = _run_measured(command)
    report = json.loads((folder / "report.json").read_text()) if code == 0 else {}
    gate = ((report.get("folder") or {}).get("quantized") or {}).get("int4") or {}
    stored = 2 * parameters
    weights = "on the int4 grid" if on_grid else "normal"
    row = {
        "model": f"keras-hub LlamaCausalLM {parameters / 1e9:.1f}B, bfloat16",
        "weights": weights,
        "accuracy_level": gate.get("accuracy_level", 1 if on_grid else 4),
        "gate_opened": not on_grid,
        "parameters": parameters,
        "bf16_gb": round(stored / 1e9, 2),
        "float32_gb": round(2 * stored / 1e9, 2),
        "archive_gb": round(model.stat().st_size / 1e9, 2),
        "build_seconds": round(build_seconds, 1),
        "exit_code": code,
        "passed": report.get("passed"),
        "streamed": "streamed" in report,
        "seconds": round(seconds, 1),
        "seconds_per_bf16_gb": round(seconds / (stored / 1e9), 1),
        "peak_rss_gb": round(peak / 1e9, 2),
        "peak_over_bf16": round(peak / stored, 2),
        "int4_folder_gb": round(gate.get("file_bytes", 0) / 1e9, 2),
        "quantized": gate.get("quantized"),
        "greedy_agreement": gate.get("greedy_agreement"),
        "genai_agreement": gate.get("genai_agreement"),
        "mean_abs_log_prob_change": gate.get("mean_abs_log_prob_change"),
        "fused": (report.get("graph") or {}).get("fused"),
        "stage_seconds": report.get("stage_seconds"),
    }
    if code != 0:
        row["stderr_tail"] = stderr
    subprocess.run(["rm", "-rf", str(folder), str(model)], check=True)
    return row


def print_streamed(report: dict) -> None:
    print(
        f"{'model':44} {'bf16 GB':>7} {'peak GB':>8} {'peak/bf16':>9} {'s':>7} {'int4 GB':>7}  ok"
    )
    for row in report.get("streamed", []):
        print(
            f"{row['model']:44} {row['bf16_gb']:7.2f} {row['peak_rss_gb']:8.2f} "
            f"{row['peak_over_bf16']:9.2f} {row['seconds']:7.1f} {row['int4_folder_gb']:7.2f}"
            f"  {row['passed']}"
        )


def print_table(report: dict) -> None:
    if report.get("streamed"):
        print_streamed(report)
    print(f"{'model':32} {'GB':>6} {'peak GB':>8} {'peak/params':>11} {'s':>7} {'s/GB':>6}  ok")
    for row in report["rows"]:
        print(
            f"{row['model']:32} {row['param_gb']:6.2f} {row['peak_rss_gb']:8.2f} "
            f"{row['peak_over_params']:11.2f} {row['seconds']:7.1f} {row['seconds_per_gb']:6.1f}"
            f"  {row['passed']}"
        )


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    sizes = [row["param_gb"] for row in rows]
    left.plot(sizes, [row["peak_over_params"] for row in rows], "o-")
    left.axhline(2.5, color="gray", linestyle="--", label="target 2.5x")
    left.set(xlabel="parameter GB", ylabel="peak RSS / parameter bytes")
    left.legend()
    right.plot(sizes, [row["seconds_per_gb"] for row in rows], "o-")
    right.set(xlabel="parameter GB", ylabel="export seconds per GB", ylim=(0, None))
    results_io.finish_figure(fig, report, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default=",".join(str(size) for size in OUR_MODELS))
    parser.add_argument("--no-keras-hub", action="store_true")
    parser.add_argument("--no-tied", action="store_true", help="leave out the tied matrix")
    parser.add_argument(
        "--add",
        action="store_true",
        help="keep the rows of the saved JSON, replacing those of the models run",
    )
    parser.add_argument("--work", default=None, help="the folder for the models (a big disk)")
    parser.add_argument(
        "--streamed",
        default="",
        help=f"comma-separated keras-hub Llamas in bfloat16 to export streamed: {list(STREAMED)}",
    )
    parser.add_argument(
        "--on-grid",
        action="store_true",
        help="--streamed models with matrices 4 bits hold exactly (benchmarks/int4_grid.py), "
        "exported at --decoder-accuracy-level 1 and judged by the default gate",
    )
    parser.add_argument("--build", nargs=2, metavar=("NAME", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.build:
        _build(*args.build)
        return None
    names = [str(float(size)) for size in args.sizes.split(",") if size]
    names += [] if args.no_keras_hub else ["llama-1b"]
    names += [] if args.no_tied else ["tied"]
    streamed = [name for name in args.streamed.split(",") if name]
    report = results_io.run_header("big_model.py", quick=False) | {"shapes": SHAPES, "rows": []}
    if args.add:
        saved = json.loads((results_io.RESULTS / "big_model.json").read_text())
        report["rows"], report["streamed"] = saved["rows"], saved.get("streamed", [])
    with tempfile.TemporaryDirectory(prefix="big_model_", dir=args.work) as work:
        for name in names:
            row = measure(name, Path(work))
            report["rows"] = [old for old in report["rows"] if old["model"] != row["model"]]
            report["rows"].append(row)
            print_table({"rows": [row]})
        for name in streamed:
            row = measure_streamed(name, Path(work), args.on_grid)
            kept = [
                old
                for old in report.get("streamed", [])
                if (old["model"], old.get("weights", "normal")) != (row["model"], row["weights"])
            ]
            report["streamed"] = [*kept, row]
            print_streamed({"streamed": [row]})
    # Models in the order of the sweep (ours by size, keras-hub's, the tied matrix).
    report["rows"].sort(
        key=lambda row: ("tied" in row["model"], "keras-hub" in row["model"], row["param_gb"])
    )
    _over_fixed_cost(report["rows"])
    return results_io.save(report, "big_model", False, print_table, plot)


if __name__ == "__main__":
    main()
