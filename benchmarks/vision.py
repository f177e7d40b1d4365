"""keras-hub ResNet-50 and ViT-B/16 image classifiers: ONNX Runtime three ways, and XLA.

    python benchmarks/vision.py               # both models at 224 x 224, 11 rounds
    python benchmarks/vision.py --rounds 21   # more rounds, a steadier median
    python benchmarks/vision.py --quick       # a smoke run: tiny models, 1 round

Two image classifiers people train, built by keras-hub from their constructors
with random weights (seed 0; no preset is downloaded), 224 x 224 RGB in,
1000 logits out: `ResNetBackbone` in the ResNet-50 shape (bottleneck blocks
3-4-6-3, a 7 x 7 stem of 64 filters, post-activation) in a
`ResNetImageClassifier`, and `ViTBackbone` in the ViT-B/16 shape (patch 16,
12 layers, 12 heads, hidden 768, MLP 3072) in a `ViTImageClassifier`. Four
contenders run each:

- `ours`: `keras_layers.export.export_model(model, path)`, default options
  (it validates the file against Keras before it returns);
- `keras_export`: Keras' own `model.export(path, format="onnx")`;
- `tf2onnx`: `tf2onnx.convert.from_function` on a `tf.function` of the model,
  opset 18, tf2onnx's default optimizers and nothing else;
- `xla`: Keras itself, `tf.function(model, jit_compile=True)`, on the same
  images.

Each ONNX file runs in an ONNX Runtime session with every graph optimisation
(ORT_ENABLE_ALL) and `intra_op_num_threads` = the machine's cores
(`export_bench.session`, which also stops ONNX Runtime's threads spinning when
a run returns, so that they do not steal the cores from the next contender).
Latency is timed at batch 1 and 8: after a warm-up, every round runs every
contender once at each batch, in turn, and the median over rounds is
reported (`benchmarks/timing.py`). Our file is then profiled by ONNX Runtime
at each batch (`kernel_profile`): the share of a run spent in its Conv and
MatMul kernels, and with it, for each missed speed target, the ratio that
would be left if every other op took no time. Before anything is timed, each contender's
logits for a batch of 2 images are compared with Keras' own; a file that does
not export, load or run records its error instead of numbers (Keras' export
of the ViT writes its exact GELU with TensorFlow's `Erfc`, an op ONNX has no
kernel for, so that file does not load; the error is recorded as ONNX Runtime
words it).

Our export runs in a child process (`--child`), which builds the model from
the same constructor and seed, notes its own high-water RSS (VmHWM: the
imports and the built model), exports, and notes it again: the export's peak
is recorded both whole (`peak_rss_bytes`) and over what the process held
before the export started (`added_rss_bytes`), and as each stage of the
export ends (`peak_rss_bytes_after_stage`, through `export_model`'s
`progress` callback), which says whether the file's making or its
validation holds the peak. VmHWM rather than
`ru_maxrss`, which on Linux keeps the peak of the parent forked before `exec`.
TensorFlow runs without its oneDNN kernels (`TF_ENABLE_ONEDNN_OPTS=0` unless
set), as the export command runs it, in this process and its children.

The issue's targets are checked at every point and recorded, met or not:
ours at most 0.9x Keras' export and 0.9x XLA at each model and batch, our
file at most 1.02x the parameters' float32 bytes, our export's peak memory at
most 2.5x those bytes. Writes `benchmarks/results/vision.json` (`--quick`:
`vision.quick.json`); the tables of docs/vision.md are rendered from it
(`python benchmarks/docs_tables.py`).
"""

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The classifier, its backbone and the backbone's arguments, by model.
MODELS = {
    "ResNet-50": {
        "classifier": "ResNetImageClassifier",
        "backbone": "ResNetBackbone",
        "arguments": {
            "input_conv_filters": [64],
            "input_conv_kernel_sizes": [7],
            "stackwise_num_filters": [64, 128, 256, 512],
            "stackwise_num_blocks": [3, 4, 6, 3],
            "stackwise_num_strides": [1, 2, 2, 2],
            "block_type": "bottleneck_block",
            "use_pre_activation": False,
            "image_shape": (224, 224, 3),
        },
        "num_classes": 1000,
    },
    "ViT-B/16": {
        "classifier": "ViTImageClassifier",
        "backbone": "ViTBackbone",
        "arguments": {
            "image_shape": (224, 224, 3),
            "patch_size": 16,
            "num_layers": 12,
            "num_heads": 12,
            "hidden_dim": 768,
            "mlp_dim": 3072,
        },
        "num_classes": 1000,
    },
}
# The same two architectures, a few milliseconds each (ResNetBackbone wants 64
# filters in its first stack).
QUICK_MODELS = {
    "ResNet-50": MODELS["ResNet-50"]
    | {
        "arguments": MODELS["ResNet-50"]["arguments"]
        | {
            "input_conv_filters": [16],
            "input_conv_kernel_sizes": [3],
            "stackwise_num_filters": [64, 32],
            "stackwise_num_blocks": [1, 1],
            "stackwise_num_strides": [1, 2],
            "image_shape": (32, 32, 3),
        },
        "num_classes": 10,
    },
    "ViT-B/16": MODELS["ViT-B/16"]
    | {
        "arguments": MODELS["ViT-B/16"]["arguments"]
        | {
            "image_shape": (32, 32, 3),
            "patch_size": 8,
            "num_layers": 2,
            "num_heads": 2,
            "hidden_dim": 32,
            "mlp_dim": 64,
        },
        "num_classes": 10,
    },
}
BATCHES = (1, 8)
ROUNDS = 11
FILES = ("ours", "keras_export", "tf2onnx")
CONTENDERS = (*FILES, "xla")
TOP_OPS = 8
CHECK_BATCH = 2  # the agreement check's images
# The targets.
SPEED_TARGET = 0.9  # ours over keras_export and over xla, at most, at every point
FILE_TARGET = 1.02  # our file over the parameters' float32 bytes, at most
MEMORY_TARGET = 2.5  # our export's peak RSS over the same bytes, at most
MEMORY_NOTE = (
    "peak_rss_bytes: VmHWM of the child process that imports, builds the model and "
    "exports it; built_rss_bytes: its VmHWM after the build, before the export; "
    "added_rss_bytes: the difference (what the export itself adds); "
    "peak_rss_bytes_after_stage: its VmHWM as each stage of the export ends"
)


# --- the models -------------------------------------------------------------------


def build(config: dict):
    """The classifier of `config`, its weights drawn at random with seed 0."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = getattr(keras_hub.models, config["backbone"])(**config["arguments"])
    classifier = getattr(keras_hub.models, config["classifier"])
    return classifier(backbone=backbone, num_classes=config["num_classes"])


def images(config: dict, batch: int):
    import numpy as np

    shape = (batch, *config["arguments"]["image_shape"])
    return np.random.default_rng(batch).standard_normal(shape).astype("float32")


# --- the exports ------------------------------------------------------------------


def child_export(name: str, output: str, quick: bool) -> dict:
    """Build the model and export it our way, in this (fresh) process.

    Returns:
        The export's seconds, this process's high-water RSS before and after it
        (bytes), and the export report's verdict and stage times.
    """
    from benchmarks.genai import _high_water_mb
    from keras_layers.export import export_model

    model = build((QUICK_MODELS if quick else MODELS)[name])
    built = _high_water_mb()
    stage_peaks = {}

    def note_peak(event) -> None:  # the high-water mark as each stage ends
        if event.seconds is not None and event.done is None:
            stage_peaks[event.stage] = int(_high_water_mb() * 2**20)

    start = time.perf_counter()
    report = export_model(model, output, progress=note_peak)
    seconds = time.perf_counter() - start
    peak = _high_water_mb()
    return {
        "seconds": seconds,
        "peak_rss_bytes": int(peak * 2**20),
        "built_rss_bytes": int(built * 2**20),
        "added_rss_bytes": int((peak - built) * 2**20),
        "peak_rss_bytes_after_stage": stage_peaks,
        "passed": report["passed"],
        "stage_seconds": report.get("stage_seconds"),
    }


def export_ours(name: str, quick: bool, path: Path) -> dict:
    """`child_export` in a child process; its result, or the error it exited with."""
    command = [sys.executable, __file__, "--child", name, str(path)] + (["--quick"] * quick)
    child = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if child.returncode != 0:
        return {"error": f"exit {child.returncode}: {child.stderr.strip()[-1500:]}"}
    return json.loads(child.stdout.strip().splitlines()[-1])


def export_keras(model, path: Path) -> None:
    model.export(str(path), format="onnx", verbose=False)


def export_tf2onnx(model, path: Path) -> None:
    import onnx
    import tensorflow as tf
    import tf2onnx

    spec = [tf.TensorSpec((None, *model.inputs[0].shape[1:]), tf.float32, name="images")]
    function = tf.function(lambda images: model(images, training=False))
    proto, _ = tf2onnx.convert.from_function(function, input_signature=spec, opset=18)
    onnx.save(proto, str(path))


def file_facts(path: Path, parameters_bytes: int) -> dict:
    """Size, node count, the most common ops and the Transposes of an ONNX file."""
    import onnx

    counts = Counter(node.op_type for node in onnx.load(str(path)).graph.node)
    size = path.stat().st_size
    return {
        "bytes": size,
        "bytes_over_parameters": size / parameters_bytes,
        "nodes": sum(counts.values()),
        "op_counts": dict(counts.most_common(TOP_OPS)),
        "transposes": counts["Transpose"],
    }


def _error(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


# --- the run ----------------------------------------------------------------------


def runners(model, paths: dict) -> tuple[dict, dict]:
    """A callable per contender (images in, logits out), or why there is none."""
    import tensorflow as tf

    from benchmarks.export_bench import session

    found, errors = {}, {}
    for name, path in paths.items():
        if path is None:
            continue
        try:
            sess = session(path, threads=os.cpu_count())
        except Exception as error:  # noqa: BLE001 - the reason is the result
            errors[name] = f"ONNX Runtime does not load the file: {_error(error)}"
            continue
        feed = sess.get_inputs()[0].name
        found[name] = lambda x, sess=sess, feed=feed: sess.run(None, {feed: x})[0]
    xla = tf.function(lambda x: model(x, training=False), jit_compile=True)
    found["xla"] = lambda x: xla(tf.constant(x)).numpy()
    return found, errors, xla


def agreement(model, config: dict, found: dict, errors: dict) -> dict:
    """Each contender's largest difference from Keras' logits on `CHECK_BATCH`
    images; a contender that fails to run moves to `errors`."""
    import numpy as np

    x = images(config, CHECK_BATCH)
    reference = np.asarray(model(x, training=False))
    differences = {"keras_max_abs_logit": float(np.abs(reference).max())}
    for name in list(found):
        try:
            differences[name] = float(np.abs(found[name](x) - reference).max())
        except Exception as error:  # noqa: BLE001 - the reason is the result
            errors[name] = f"does not run: {_error(error)}"
            del found[name]
    return differences


# Op types whose kernels do the multiply-adds, as ONNX Runtime's profile names
# them after its own fusions (`FusedConv`, `NchwcConv`, `FusedMatMul`, ...).
MULTIPLY_ADD_OPS = ("Conv", "MatMul", "Gemm", "Attention")


def kernel_profile(path: Path, x, runs: int) -> dict:
    """Where a run of the file at `path` on `x` spends its time: ONNX
    Runtime's profile (the timed sessions' options, profiling on), the
    kernels' milliseconds per run summed by op type over `runs` runs after a
    warm-up run, and the share of the run in `MULTIPLY_ADD_OPS` kernels.

    The share says how fast the file could get if every other op took no
    time: `targets` multiplies it into the timed median to give each missed
    speed target its floor."""
    from benchmarks.export_bench import session as timed_session

    session = timed_session(path, threads=os.cpu_count(), profile_prefix=str(path.with_suffix("")))
    feed = {session.get_inputs()[0].name: x}
    for _ in range(runs + 1):
        session.run(None, feed)
    events = json.loads(Path(session.end_profiling()).read_text())
    runs_seen = sorted((e["ts"], e["dur"]) for e in events if e.get("name") == "model_run")
    first_end = runs_seen[0][0] + runs_seen[0][1]  # the first profiled run is dropped
    by_op: dict[str, float] = {}
    for event in events:
        kernel = event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time")
        if kernel and event["ts"] >= first_end:
            op = event["args"]["op_name"]
            by_op[op] = by_op.get(op, 0.0) + event["dur"] / 1e3
    run_ms = sorted(duration / 1e3 for _, duration in runs_seen[1:])
    ms_by_op = {op: ms / runs for op, ms in sorted(by_op.items(), key=lambda kv: -kv[1])}
    run = run_ms[len(run_ms) // 2]
    multiply_add = sum(ms for op, ms in ms_by_op.items() if any(k in op for k in MULTIPLY_ADD_OPS))
    return {
        "runs": runs,
        "run_ms": run,
        "ms_by_op": {op: round(ms, 3) for op, ms in ms_by_op.items()},
        "multiply_add_ms": multiply_add,
        "multiply_add_share": multiply_add / run,
    }


def measure(name: str, config: dict, quick: bool, rounds: int, folder: Path) -> dict:
    """One model: its three files exported, every contender checked and timed."""
    from benchmarks.timing import time_side_by_side

    paths = {name_: folder / f"{name_}.onnx" for name_ in FILES}
    export = export_ours(name, quick, paths["ours"])
    print(f"{name}: ours exported: {export}", flush=True)
    errors = {"ours": export["error"]} if "error" in export else {}
    model = build(config)
    # Keras' `export` refuses a model never called ("The model provided has
    # never called"); one trained or used has been.
    model(images(config, 1), training=False)
    parameters_bytes = 4 * model.count_params()
    seconds = {"ours": export.get("seconds")}
    for contender, exporter in (("keras_export", export_keras), ("tf2onnx", export_tf2onnx)):
        start = time.perf_counter()
        try:
            exporter(model, paths[contender])
        except Exception as error:  # noqa: BLE001 - the reason is the result
            errors[contender] = f"export failed: {_error(error)}"
        seconds[contender] = time.perf_counter() - start
        print(f"{name}: {contender} exported in {seconds[contender]:.1f} s", flush=True)
    files = {}
    for contender, path in paths.items():
        if path.exists():
            files[contender] = file_facts(path, parameters_bytes)
            files[contender]["export_seconds"] = seconds[contender]
        else:
            files[contender] = {"error": errors.get(contender, "no file written")}
            paths[contender] = None
    found, load_errors, xla = runners(model, {c: p for c, p in paths.items() if c not in errors})
    errors |= load_errors
    differences = agreement(model, config, found, errors)
    # The messages name the files by their temporary folder: by file name only.
    errors = {c: text.replace(f"{folder}/", "") for c, text in errors.items()}
    print(f"{name}: max |logits - Keras'|: {differences}", flush=True)
    candidates = {}
    for batch in BATCHES:
        x = images(config, batch)
        for contender, run in found.items():
            candidates[(contender, batch)] = lambda run=run, x=x: run(x)
    timing = time_side_by_side(candidates, rounds=rounds, calls=1, warmup=1 if quick else 2)
    rows = []
    for batch in BATCHES:
        row = {"model": name, "batch": batch}
        for contender in CONTENDERS:
            if contender in errors:
                row[contender] = {"error": errors[contender]}
            else:
                measured = timing[(contender, batch)]
                row[contender] = {"ms": measured["median_ms"], "p90_ms": measured["p90_ms"]}
        row["ratios"] = {
            f"ours / {peer}": row["ours"]["ms"] / row[peer]["ms"]
            if "ms" in row["ours"] and "ms" in row[peer]
            else None
            for peer in ("keras_export", "xla")
        }
        if "ms" in row["ours"]:
            profile = kernel_profile(paths["ours"], images(config, batch), runs=2 if quick else 5)
            row["ours"]["profile"] = profile
        rows.append(row)
        cells = ", ".join(f"{c} {row[c].get('ms', 'error')}" for c in CONTENDERS)
        print(f"{name} batch {batch} ms: {cells}", flush=True)
    del found, candidates, model
    gc.collect()
    return {
        "rows": rows,
        "files": files,
        "parameters_bytes": parameters_bytes,
        "export": export,
        "max_abs_diff_vs_keras": differences,
        # One trace per batch size (and the check's): more would mean XLA
        # compiled inside the timed rounds.
        "xla_traces": xla.experimental_get_tracing_count(),
    }


def targets(report: dict) -> dict:
    """Every target of the issue at every point it applies to, with the measured ratio.

    Returns:
        `checks` (one dict per target and point: the ratio, its bound and
        whether it is met, None where it could not be measured, with `why`;
        a speed check also has `multiply_add_floor`, the ratio if only our
        file's Conv/MatMul kernels took time: `kernel_profile`),
        `all_met` (False when any measured target is missed), and `missed`
        and `not_measured` as "model batch N: ratio" strings.
    """
    checks = []
    for row in report["rows"]:
        for peer in ("keras_export", "xla"):
            check = {
                "target": f"ours / {peer}",
                "model": row["model"],
                "batch": row["batch"],
                "at_most": SPEED_TARGET,
            }
            ratio = row["ratios"][f"ours / {peer}"]
            if ratio is None:
                why = row[peer].get("error") or row["ours"].get("error")
                checks.append(check | {"ratio": None, "met": None, "why": why})
            else:
                checks.append(check | {"ratio": ratio, "met": ratio <= SPEED_TARGET})
                if "profile" in row["ours"]:
                    # The ratio left if every op but the multiply-add kernels took no time.
                    share = row["ours"]["profile"]["multiply_add_share"]
                    checks[-1]["multiply_add_floor"] = ratio * min(share, 1.0)
    for model, facts in report["files"].items():
        weights = report["parameters_bytes"][model]
        ours, export = facts["ours"], report["export"][model]
        measured = {
            ("our file / parameter bytes", FILE_TARGET): ours.get("bytes"),
            ("our export's added peak RSS / parameter bytes", MEMORY_TARGET): export.get(
                "added_rss_bytes"
            ),
            ("our export's whole peak RSS / parameter bytes", MEMORY_TARGET): export.get(
                "peak_rss_bytes"
            ),
        }
        for (target, bound), value in measured.items():
            check = {"target": target, "model": model, "batch": None, "at_most": bound}
            if value is None:
                checks.append(check | {"ratio": None, "met": None, "why": export.get("error")})
            else:
                ratio = value / weights
                checks.append(check | {"ratio": ratio, "met": ratio <= bound})

    def where(check):
        batch = f" batch {check['batch']}" if check["batch"] is not None else ""
        return f"{check['model']}{batch}: {check['target']}"

    return {
        "all_met": all(check["met"] is not False for check in checks),
        "missed": [
            f"{where(check)} = {check['ratio']:.3f} (> {check['at_most']})"
            for check in checks
            if check["met"] is False
        ],
        "not_measured": [
            f"{where(check)} ({check['why']})" for check in checks if check["met"] is None
        ],
        "checks": checks,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--rounds", type=int, default=None, help=f"timing rounds (default {ROUNDS}; --quick: 1)"
    )
    parser.add_argument("--child", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # As the export command runs TensorFlow (startup.prepare_process); the
    # children inherit it.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    if args.child:
        print(json.dumps(child_export(*args.child, quick=args.quick)))
        return None

    import keras
    import keras_hub
    import numpy as np
    import onnx
    import onnxruntime
    import tensorflow as tf
    import tf2onnx

    from benchmarks.results_io import run_header, save_json

    started = time.perf_counter()
    rounds = args.rounds or (1 if args.quick else ROUNDS)
    models = QUICK_MODELS if args.quick else MODELS
    report = {
        **run_header("vision.py", args.quick),
        "versions": {
            "keras": keras.__version__,
            "keras_hub": keras_hub.__version__,
            "tensorflow": tf.__version__,
            "tf2onnx": tf2onnx.__version__,
            "onnx": onnx.__version__,
            "onnxruntime": onnxruntime.__version__,
            "numpy": np.__version__,
        },
        "sessions": {
            "graph_optimization_level": "ORT_ENABLE_ALL",
            "intra_op_num_threads": os.cpu_count(),
            "inter_op_num_threads": 1,
            "spinning": "stops when a run returns (session.force_spinning_stop)",
        },
        # Which pipeline `ours` measured: the checkout, and whether it had edits.
        "checkout": subprocess.run(
            ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip(),
        "tf_enable_onednn_opts": os.environ["TF_ENABLE_ONEDNN_OPTS"],
        "rounds": rounds,
        "batches": list(BATCHES),
        "contenders": list(CONTENDERS),
        "configs": models,
        "memory_note": MEMORY_NOTE,
        "rows": [],
        "files": {},
        "parameters_bytes": {},
        "export": {},
        "max_abs_diff_vs_keras": {},
        "xla_traces": {},
    }
    for name, config in models.items():
        # The files (up to 350 MB each) go with the model's folder.
        with tempfile.TemporaryDirectory(prefix="vision_") as folder:
            measured = measure(name, config, args.quick, rounds, Path(folder))
        report["rows"] += measured["rows"]
        for key in ("files", "parameters_bytes", "export", "max_abs_diff_vs_keras", "xla_traces"):
            report[key][name] = measured[key]
        keras.backend.clear_session()
    report["targets"] = targets(report)
    report["seconds"] = time.perf_counter() - started
    print_table(report)
    stem = save_json(report, "vision", args.quick)
    print(f"wrote {stem}.json")
    return report


def _cell(entry: dict) -> str:
    return f"{entry['ms']:9.1f}" if "ms" in entry else f"{'error':>9}"


def print_table(report: dict) -> None:
    print(f"\nmedian ms over {report['rounds']} rounds ({report['machine']['cores']} cores)")
    print(f"{'model':<10} {'batch':>5} " + " ".join(f"{c:>12}" for c in CONTENDERS))
    for row in report["rows"]:
        cells = " ".join(f"{_cell(row[c]):>12}" for c in CONTENDERS)
        ratios = "  ".join(f"{k} {v:.3f}" for k, v in row["ratios"].items() if v is not None)
        print(f"{row['model']:<10} {row['batch']:>5} {cells}   {ratios}")
    for model, facts in report["files"].items():
        print(f"\n{model}: parameters {report['parameters_bytes'][model] / 1e6:.1f} MB")
        for contender, entry in facts.items():
            if "error" in entry:
                print(f"  {contender:<13} {entry['error'][-300:]}")
                continue
            print(
                f"  {contender:<13} {entry['bytes'] / 1e6:8.1f} MB "
                f"({entry['bytes_over_parameters']:.3f}x) {entry['nodes']:5d} nodes "
                f"{entry['transposes']:4d} Transposes  {entry['op_counts']}"
            )
        export = report["export"][model]
        if "error" not in export:
            print(
                f"  our export: {export['seconds']:.1f} s, peak RSS "
                f"{export['peak_rss_bytes'] / 2**20:.0f} MB, added "
                f"{export['added_rss_bytes'] / 2**20:.0f} MB"
            )
    for row in report["rows"]:
        for contender in CONTENDERS:
            if row["batch"] == BATCHES[0] and "error" in row[contender]:
                print(f"{row['model']}, {contender}: {row[contender]['error'][-300:]}")
    targets_ = report["targets"]
    print(f"\ntargets all met: {targets_['all_met']}")
    for line in targets_["missed"]:
        print(f"  missed: {line}")
    for line in targets_["not_measured"]:
        print(f"  not measured: {line[:300]}")


if __name__ == "__main__":
    main()
