"""The exported files' bytes, hashed: proof that a restructure changed no output.

    python benchmarks/output_hashes.py            # export, hash, write results/output_hashes.json
    python benchmarks/output_hashes.py --check    # export, hash, exit 1 if any hash differs

Each model is built from a fixed seed (the demo encoder and decoder of
`keras_layers.demo`, and tiny keras-hub models of the zoo with redrawn
weights), exported with `export_model`'s default options, and the ONNX
file's SHA-256 is recorded with its node count. `--check` exports them again
and compares: a refactoring that claims to change no output must leave
every hash as it was. The JSON names the commit it was recorded at.

The script runs itself under PYTHONHASHSEED=0: with another seed some files
come out with the same nodes in another order (MistralBackbone, measured at
0edfb08 with seeds 1, 2 and 3: two orders), which is a change of string
hashing, not of code.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # zoo_models lives with the tests that use it

from benchmarks.results_io import RESULTS, run_header, save_json  # noqa: E402

RESULT = RESULTS / "output_hashes.json"

# Ten zoo models that between them take every fusion and both tasks' shapes:
# encoders (BERT, RoBERTa, DeBERTa, ALBERT), decoders (GPT-2, Llama, Gemma,
# Qwen 3, Mistral) and an encoder-decoder (T5).
ZOO = (
    "BertBackbone",
    "RobertaTextClassifier",
    "DebertaV3Backbone",
    "AlbertMaskedLM",
    "GPT2Backbone",
    "LlamaBackbone",
    "GemmaCausalLM",
    "Qwen3Backbone",
    "MistralBackbone",
    "T5Backbone",
)


def _demo_models() -> dict:
    """The demo encoder (forward) and decoder (causal-lm), by name."""
    from keras_layers.demo.decoder import TiedDecoder
    from keras_layers.demo.encoder import EncoderConfig, build_encoder

    def encoder():
        return build_encoder(EncoderConfig(vocabulary=200, width=32, layers=2), seed=0), "forward"

    def decoder():
        import keras

        keras.utils.set_random_seed(0)
        return TiedDecoder(vocabulary=200, width=32, layers=2, heads=4), "causal-lm"

    return {"demo_encoder": encoder, "demo_decoder": decoder}


def _zoo_model(name: str):
    import zoo_models

    return lambda: (zoo_models.build(name), "forward")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def export_one(name: str) -> dict:
    """Export one model into a temporary folder: its file's hash and node count."""
    import onnx

    from keras_layers.export import export_model

    builders = {**_demo_models(), **{zoo: _zoo_model(zoo) for zoo in ZOO}}
    model, task = builders[name]()
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / f"{name}.onnx"
        start = time.perf_counter()
        export_model(model, output, task=task)
        return {
            "sha256": _digest(output),
            "nodes": len(onnx.load(output, load_external_data=False).graph.node),
            "seconds": round(time.perf_counter() - start, 1),
        }


def run(names: list | None = None) -> dict:
    """Each model exported in a process of its own; its row, by name.

    One process per model, because a file's node order depends on what ran
    before it in the same process (tf2onnx numbers the names it makes from a
    process-wide counter): measured, Llama and Mistral gave two hashes each
    depending on the models exported before them.
    """
    rows = {}
    for name in names or [*_demo_models(), *ZOO]:
        done = subprocess.run(
            [sys.executable, __file__, "--one", name], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise SystemExit(f"{name}: the export failed\n{done.stderr[-3000:]}")
        rows[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{name}: {rows[name]['sha256'][:16]} ({rows[name]['nodes']} nodes)", flush=True)
    return rows


def _commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "unknown"


def check(rows: dict, recorded: dict) -> list:
    """The names whose hash differs from the recorded one (or that were not recorded)."""
    return [
        name
        for name, row in rows.items()
        if recorded["models"].get(name, {}).get("sha256") != row["sha256"]
    ]


def main(argv=None) -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        argv = sys.argv[1:] if argv is None else argv
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        return subprocess.run([sys.executable, __file__, *argv], env=env, check=False).returncode
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the recorded hashes")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these models only")
    parser.add_argument("--one", metavar="NAME", help=argparse.SUPPRESS)  # the child's job
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(export_one(args.one)))
        return 0
    rows = run(args.only)
    if args.check:
        recorded = json.loads(RESULT.read_text())
        changed = check(rows, recorded)
        print(
            f"{len(rows) - len(changed)} of {len(rows)} hashes equal those recorded at "
            f"{recorded['commit'][:12]}" + (f"; changed: {', '.join(changed)}" if changed else "")
        )
        return 1 if changed else 0
    report = run_header("output_hashes.py", quick=False)
    save_json({**report, "commit": _commit(), "models": rows}, "output_hashes", quick=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
