"""A decoder with its cache, its attention fused two ways and not, generating side by side.

    python benchmarks/cached_attention.py           # about 6 minutes
    python benchmarks/cached_attention.py --quick   # a smoke run: tiny models

`--task causal-lm` files run one new token at a time against the whole
cache, where the logits are (batch, heads, 1, past + 1): small, so what
`MultiHeadAttention` saves (writing them to memory) is small too, and what
it adds (reshapes of the cache, the mask's bias expanded) is paid at every
token; `GroupQueryAttention`, made for this, takes the new keys and values
and the past and writes the present itself. This measures the three on
keras-hub's GPT-2 (plain multi-head attention) and Gemma (4 query heads on 1
key/value head), 4 layers x 256 wide as in benchmarks/generate.py: the same
`--task causal-lm` export as the pipeline makes it (`gqa`), with
`MultiHeadAttention` instead (`mha`) and with the traced attention
(`traced`), each generating 32 tokens greedily from a 128- and a 512-token
prompt (batch 1 and 8 at 128), interleaved round by round
(`benchmarks/timing.py`). All must give the same tokens.
Writes results/cached_attention[.quick].json; docs/performance.md's table
`cached_attention.speed` is rendered from it.
"""

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.results_io import run_header, save_json  # noqa: E402
from benchmarks.timing import time_side_by_side  # noqa: E402

SIZES = {"vocabulary_size": 16384, "num_layers": 4, "hidden_dim": 256, "intermediate_dim": 1024}
QUICK_SIZES = {"vocabulary_size": 256, "num_layers": 2, "hidden_dim": 32, "intermediate_dim": 64}
SHAPES = [(1, 128), (8, 128), (1, 512)]
QUICK_SHAPES = [(1, 16)]
NEW = 32
CANDIDATES = ("traced", "mha", "gqa")
OPS = {"mha": "MultiHeadAttention", "gqa": "GroupQueryAttention"}  # the fused files' ops


def build(kind: str, sizes: dict):
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    if kind == "GPT-2":
        backbone = keras_hub.models.GPT2Backbone(num_heads=4, max_sequence_length=1024, **sizes)
        return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    backbone = keras_hub.models.GemmaBackbone(
        num_query_heads=4,
        num_key_value_heads=1,
        head_dim=sizes["hidden_dim"] // 4,
        **sizes,
    )
    return keras_hub.models.GemmaCausalLM(backbone, preprocessor=None)


def export_all(model, folder: Path) -> dict:
    """{candidate: path}: `--task causal-lm` as the pipeline makes it (`gqa`,
    each attention a `GroupQueryAttention`), with `MultiHeadAttention`
    forced on instead (`mha`: the rule runs as on a decoder without a cache),
    and with neither (`traced`)."""
    from keras_layers.export import export_model, slimming
    from keras_layers.export.passes.fusions import group_query_attention, multi_head_attention

    paths = {name: folder / f"{name}.onnx" for name in CANDIDATES}
    original = multi_head_attention.run

    def every_form(proto, context):
        return original(proto, dataclasses.replace(context, cached_decoder=False))

    export_model(model, paths["gqa"], task="causal-lm")
    with (
        mock.patch.object(multi_head_attention, "run", every_form),
        mock.patch.object(slimming, "PASSES", slimming.without(group_query_attention)),
    ):
        export_model(model, paths["mha"], task="causal-lm")
    neither = slimming.without(multi_head_attention, group_query_attention)
    with mock.patch.object(slimming, "PASSES", neither):
        export_model(model, paths["traced"], task="causal-lm")
    return paths


def measure(kind: str, sizes: dict, shapes: list, rounds: int) -> dict:
    import numpy as np
    import onnx

    from keras_layers.export import CachedDecoder, generate

    model = build(kind, sizes)
    with tempfile.TemporaryDirectory(prefix="cached_attention_") as folder:
        paths = export_all(model, Path(folder))
        fused_ops = {
            name: sum(n.op_type == OPS[name] for n in onnx.load(paths[name]).graph.node)
            for name in OPS
        }
        decoders = {name: CachedDecoder(path) for name, path in paths.items()}
        rows = {}
        for batch, prompt in shapes:
            ids = np.random.default_rng(prompt).integers(
                1, sizes["vocabulary_size"], (batch, prompt)
            )
            ids = ids.astype("int32")
            tokens = {}

            def run(name, ids=ids, tokens=tokens):
                def call():
                    tokens[name] = generate(decoders[name], ids, NEW)

                return call

            timed = time_side_by_side({name: run(name) for name in decoders}, rounds, 1, 1)
            for name in OPS:
                if not np.array_equal(tokens[name], tokens["traced"]):
                    raise SystemExit(f"{kind}: {name} generates other tokens at {batch}x{prompt}")
            ms = {name: entry["median_ms"] for name, entry in timed.items()}
            over = {name: ms[name] / ms["traced"] for name in OPS}
            rows[f"{batch}x{prompt}"] = {"ms": ms, "over_traced": over}
            print(
                f"{kind} {batch}x{prompt}: "
                + ", ".join(f"{name} / traced {value:.2f}" for name, value in over.items())
            )
    return {"fused_ops": fused_ops, "new_tokens": NEW, "latency": rows}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny models, one short prompt")
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    shapes = QUICK_SHAPES if args.quick else SHAPES
    report = run_header("cached_attention.py", args.quick) | {"sizes": sizes, "models": {}}
    for kind in ("GPT-2", "Gemma"):
        report["models"][kind] = measure(kind, sizes, shapes, rounds=3 if args.quick else 9)
    print(f"wrote {save_json(report, 'cached_attention', args.quick)}.json")
    return report


if __name__ == "__main__":
    main()
