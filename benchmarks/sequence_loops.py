"""Qwen3.5 and RWKV-7 backbones at a real width: exported with their loops, proved, timed.

    python benchmarks/sequence_loops.py            # ~6 min
    python benchmarks/sequence_loops.py --quick    # a smoke run: tiny widths, few rounds

keras-hub's Qwen3.5 gated delta net and RWKV-7 time mixing loop over the
sequence in Python; the export traces those loops as ONNX `Loop`s
(keras_layers/export/sequence_loops.py). Each backbone is built by keras-hub
at width 512 with its weights drawn at random (seed 0): Qwen3.5 with 4 layers
(3 gated delta net, 1 full attention; 8 query / 2 key-value heads of 64,
delta-net heads 4 key / 8 value of 64, intermediate 1024), RWKV-7 with 4
layers (heads of 64, intermediate 1024). Each is exported with the default
flags (its validation's worst difference is recorded) and by Keras' own
`model.export(format="onnx")`, then timed at (batch, sequence) (1, 128),
(1, 512) and (4, 128): our file in ONNX Runtime against the Keras model
itself (TensorFlow, eager: keras-hub's Python loop), rounds interleaved
(`benchmarks/timing.py`). Writes `benchmarks/results/sequence_loops.json`:
`rows` of `{"model", "batch", "length", "ours": {"ms"}, "keras": {"ms"}}`
and, per model, `exports` (ours: seconds, passed, worst difference, ONNX
`Loop`s; keras_export: the error it stops with, or its seconds).
"""

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import export_bench, results_io, timing

MODELS = {
    "Qwen3_5Backbone": dict(
        vocabulary_size=1000,
        num_layers=4,
        num_query_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        hidden_dim=512,
        intermediate_dim=1024,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
    ),
    "RWKV7Backbone": dict(
        hidden_size=512, head_size=64, num_layers=4, vocabulary_size=1000, intermediate_dim=1024
    ),
}
# The zoo's tiny configs (tests/zoo_models.py), as the zoo tier builds them.
QUICK = dict.fromkeys(MODELS)
SHAPES = [(1, 128), (1, 512), (4, 128)]
QUICK_SHAPES = [(1, 8), (2, 70)]


def build(name: str, config: dict | None):
    """keras-hub's `name` from `config`, or from the zoo's tiny config (None)."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    cls = getattr(keras_hub.models, name)
    if config is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
        import zoo_models

        config = zoo_models.tiny_arguments(cls)
    return cls(**config)


def feeds(batch: int, length: int, vocabulary: int) -> dict:
    rng = np.random.default_rng(batch * 1000 + length)
    return {
        "token_ids": rng.integers(1, vocabulary, (batch, length)).astype("int32"),
        "padding_mask": np.ones((batch, length), "int32"),
    }


def export(model, work: Path) -> dict:
    """Ours and Keras' own export of `model`: what each gave."""
    import onnx

    from keras_layers.export import ExportOptions, export_model

    start = time.perf_counter()
    report = export_model(model, work / "ours.onnx", ExportOptions())
    ours = {
        "seconds": round(time.perf_counter() - start, 1),
        "passed": report["passed"],
        "worst_abs_diff": report["worst"]["max_abs_diff"],
        "worst_at": report["worst"]["shape"],
        "loops": sum(n.op_type == "Loop" for n in onnx.load(work / "ours.onnx").graph.node),
        "file_mb": round((work / "ours.onnx").stat().st_size / 2**20, 1),
    }
    start = time.perf_counter()
    try:
        model.export(str(work / "keras.onnx"), format="onnx", verbose=False)
        keras_export = {"seconds": round(time.perf_counter() - start, 1)}
    except Exception as error:  # the peer's failure is the measurement
        reason = re.sub(r"\x1b\[[0-9;]*m", "", " ".join(str(error).split()))  # no colours
        reason = reason.replace("Exception encountered when calling ", "")
        keras_export = {"error": f"{type(error).__name__}: {reason[:300]}"}
    return {"ours": ours, "keras_export": keras_export}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny widths, few rounds")
    args = parser.parse_args(argv)
    configs, shapes = (QUICK, QUICK_SHAPES) if args.quick else (MODELS, SHAPES)
    rounds = 2 if args.quick else 7
    report = results_io.run_header("sequence_loops.py", args.quick)
    report |= {"configs": {name: configs[name] or "tests/zoo_models.py" for name in configs}}
    report |= {"exports": {}, "rows": []}
    for name, config in configs.items():
        model = build(name, config)
        vocabulary = model.token_embedding.input_dim
        with tempfile.TemporaryDirectory() as folder:
            work = Path(folder)
            report["exports"][name] = export(model, work)
            session = export_bench.session(work / "ours.onnx")
            for batch, length in shapes:
                values = feeds(batch, length, vocabulary)
                times = timing.time_side_by_side(
                    {
                        "ours": lambda s=session, v=values: s.run(None, v),
                        "keras": lambda m=model, v=values: m(v, training=False),
                    },
                    rounds=rounds,
                    calls=1,
                    warmup=1,
                )
                report["rows"].append(
                    {"model": name, "batch": batch, "length": length}
                    | {side: {"ms": round(times[side]["median_ms"], 2)} for side in times}
                )
    print_table(report)
    path = results_io.save_json(report, "sequence_loops", args.quick)
    print(f"wrote {path}.json")
    return report


def print_table(report: dict) -> None:
    for name, exports in report["exports"].items():
        ours, peer = exports["ours"], exports["keras_export"]
        keras_export = peer.get("error") or f"{peer['seconds']} s"
        print(
            f"{name}: ours passed={ours['passed']} worst {ours['worst_abs_diff']:.2e} "
            f"at {ours['worst_at']}, {ours['loops']} Loop(s), {ours['seconds']} s; "
            f"Keras' export: {keras_export}"
        )
    print(f"{'model':18} {'shape':>8} {'ours ms':>9} {'keras ms':>9} {'keras/ours':>10}")
    for row in report["rows"]:
        ours, keras = row["ours"]["ms"], row["keras"]["ms"]
        shape = f"{row['batch']}x{row['length']}"
        print(f"{row['model']:18} {shape:>8} {ours:9.2f} {keras:9.2f} {keras / ours:10.1f}")


if __name__ == "__main__":
    main()
