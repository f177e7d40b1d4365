"""`--quantize int8` on a ResNet-50-sized keras-hub classifier: memory, time, gate, speed.

    python benchmarks/int8_cnn.py            # ResNet-50 at 224 x 224, 1000 classes (~4 min)
    python benchmarks/int8_cnn.py --quick    # a smoke run: the tiny ResNet of vision.py

The classifier of `benchmarks/vision.py` (random weights, seed 0) is
exported with `export_model(model, path, ExportOptions(quantize="int8"))`, as
`keras-layers-export model.keras -o model.onnx --quantize int8` exports it, in
this process. Recorded: the export's seconds and stage times, the process's
high-water RSS before and after it (VmHWM), the int8 gate (the grid points
that give it its 1,000 images, each output's statistic), both files' time on
the grid's largest point side by side (`int8.latency`: median of 7
interleaved runs) and whether the int8 file was kept (a CNN's is kept only
where it is faster). Writes `benchmarks/results/int8_cnn.json`
(`--quick`: `int8_cnn.quick.json`).
"""

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# As the export command runs TensorFlow (startup.prepare_process).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = "ResNet-50"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)

    from benchmarks.genai import _high_water_mb
    from benchmarks.results_io import run_header, save_json
    from benchmarks.vision import MODELS, QUICK_MODELS, build
    from keras_layers.export import ExportOptions, export_model

    config = (QUICK_MODELS if args.quick else MODELS)[MODEL]
    model = build(config)
    built = _high_water_mb()
    with tempfile.TemporaryDirectory(prefix="int8_cnn_") as folder:
        start = time.perf_counter()
        exported = export_model(model, Path(folder) / "model.onnx", ExportOptions(quantize="int8"))
        seconds = time.perf_counter() - start
    peak = _high_water_mb()
    int8 = exported["int8"]
    # The grid's points (the float file's checks, one per output and point).
    first = exported["checks"][0]["output"]
    points = Counter(check["shape"] for check in exported["checks"] if check["output"] == first)
    report = {
        **run_header("int8_cnn.py", args.quick),
        "model": MODEL,
        "config": config,
        "passed": exported["passed"],
        "seconds": round(seconds, 1),
        "stage_seconds": exported["stage_seconds"],
        "built_rss_bytes": int(built * 2**20),
        "peak_rss_bytes": int(peak * 2**20),
        "grid_points": dict(points),
        "int8": {key: int8[key] for key in ("passed", "kept", "float_convolutions", "latency")},
        "gates": int8["gates"],
    }
    print(json.dumps({k: report[k] for k in ("passed", "seconds", "peak_rss_bytes")}))
    print(json.dumps(report["int8"], indent=1))
    stem = save_json(report, "int8_cnn", args.quick)
    print(f"wrote {stem}.json")
    return report


if __name__ == "__main__":
    main()
