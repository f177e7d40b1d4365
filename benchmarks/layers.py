"""Each layer against its nearest peer, timed side by side in one run.

    python benchmarks/layers.py [--quick]

Prints a table and writes benchmarks/results/layers.json. Shapes: token ids
(8, 128), vocabulary 30522, width 256 (the reference encoder's). Peers:
`Embedding` followed by a multiply, keras-hub `SinePositionEncoding` plus the add
it leaves to the caller, `ReversibleEmbedding(reverse=True)`. Each is timed
eagerly and inside a `tf.function`.
"""

import argparse
import json
import math
import os
import platform
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results"


def cases(batch=8, length=128, vocabulary=30522, width=256):
    import keras
    import keras_hub
    import numpy as np
    import tensorflow as tf

    from keras_layers import ScaledEmbedding, SinusoidalPositionEncoding, TiedOutputDense

    rng = np.random.default_rng(0)
    ids = tf.constant(rng.integers(1, vocabulary, size=(batch, length)), tf.int32)
    hidden = tf.constant(rng.standard_normal((batch, length, width)), tf.float32)

    ours_embedding = ScaledEmbedding(vocabulary, width)
    plain_embedding = keras.layers.Embedding(vocabulary, width)
    factor = math.sqrt(width)
    ours_position = SinusoidalPositionEncoding()
    hub_position = keras_hub.layers.SinePositionEncoding()
    reversible = keras.layers.ReversibleEmbedding(vocabulary, width)
    reversible.build((None, None))
    tied = TiedOutputDense(keras.layers.Embedding(vocabulary, width))
    return {
        "embedding": {
            "ours": lambda: ours_embedding(ids),
            "peer": lambda: plain_embedding(ids) * factor,
            "peer_name": "Embedding + multiply",
        },
        "position encoding": {
            "ours": lambda: ours_position(hidden),
            "peer": lambda: hidden + hub_position(hidden),
            "peer_name": "keras-hub SinePositionEncoding + add",
        },
        "tied output": {
            "ours": lambda: tied(hidden),
            "peer": lambda: reversible(hidden, reverse=True),
            "peer_name": "ReversibleEmbedding(reverse=True)",
        },
    }


def main(argv=None):
    import tensorflow as tf

    from benchmarks.timing import time_side_by_side

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 rounds: a smoke test")
    quick = parser.parse_args(argv).quick
    rounds = 3 if quick else 21
    rows = []
    for layer, case in cases().items():
        for mode in ("eager", "tf.function"):
            ours, peer = case["ours"], case["peer"]
            if mode == "tf.function":
                ours, peer = tf.function(ours), tf.function(peer)
            timing = time_side_by_side(
                {"ours": ours, "peer": peer},
                rounds=rounds,
                calls=1 if quick else 5,
                warmup=1 if quick else 2,
            )
            rows.append(
                {
                    "layer": layer,
                    "peer": case["peer_name"],
                    "mode": mode,
                    "ours_ms": timing["ours"]["median_ms"],
                    "peer_ms": timing["peer"]["median_ms"],
                    "ours_p90_ms": timing["ours"]["p90_ms"],
                    "peer_p90_ms": timing["peer"]["p90_ms"],
                    "ratio": timing["ours"]["median_ms"] / timing["peer"]["median_ms"],
                }
            )
    print(f"{'layer':<18} {'mode':<12} {'ours ms':>9} {'peer ms':>9} {'ours/peer':>9}  peer")
    for row in rows:
        print(
            f"{row['layer']:<18} {row['mode']:<12} {row['ours_ms']:9.3f} "
            f"{row['peer_ms']:9.3f} {row['ratio']:9.2f}  {row['peer']}"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / ("layers.quick.json" if quick else "layers.json")
    meta = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count()}
    out.write_text(json.dumps({"rounds": rounds, "meta": meta, "rows": rows}, indent=2))
    print(f"wrote {out}")
    return rows


if __name__ == "__main__":
    main()
