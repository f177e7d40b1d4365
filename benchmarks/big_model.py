"""Export a model whose weights pass 2 GiB: external data, validated.

    python benchmarks/big_model.py [--vocabulary 300000] [--width 2048]

Builds ScaledEmbedding(vocabulary, width) -> SinusoidalPositionEncoding ->
Dense -> TiedOutputDense with random weights (300,000 x 2,048 floats = 2.46 GB
by default), saves it, exports it with `python export/to_onnx.py` (external data
chosen automatically past 1.8 GB) on a small validation grid, and prints the
time, the peak memory of the export process and the file layout. Writes
benchmarks/results/big_model.json.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vocabulary", type=int, default=300_000)
    parser.add_argument("--width", type=int, default=2048)
    args = parser.parse_args(argv)

    import keras

    from keras_layers import ScaledEmbedding, SinusoidalPositionEncoding, TiedOutputDense

    work = Path(tempfile.mkdtemp(prefix="big_model_"))
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    embedding = ScaledEmbedding(args.vocabulary, args.width, mask_zero=True)
    hidden = keras.layers.Dense(args.width)(SinusoidalPositionEncoding()(embedding(ids)))
    model = keras.Model(ids, TiedOutputDense(embedding, name="logits")(hidden))
    parameters = model.count_params()
    model.save(work / "big.keras")
    del model
    start = time.perf_counter()
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "export" / "to_onnx.py"),
            str(work / "big.keras"),
            "-o",
            str(work / "big.onnx"),
            "--shapes",
            "1x7,2x16,padded",
        ],
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    report = (
        json.loads((work / "big.report.json").read_text()) if result.returncode in (0, 1) else {}
    )
    layout = {p.name: p.stat().st_size for p in sorted(work.iterdir()) if p.is_file()}
    summary = {
        "parameters": parameters,
        "param_bytes": 4 * parameters,
        "exit_code": result.returncode,
        "export_seconds": round(seconds, 1),
        "export_peak_rss_mb": round(peak),
        "files": layout,
        "passed": report.get("passed"),
        "external_data": report.get("external_data"),
        "worst": report.get("worst"),
        "stage_seconds": report.get("stage_seconds"),
        "shared_weights": report.get("graph", {}).get("shared_weights"),
        "stderr_tail": result.stderr[-500:],
    }
    print(json.dumps(summary, indent=2))
    out = Path(__file__).resolve().parent / "results" / "big_model.json"
    out.write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
