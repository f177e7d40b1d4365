"""Each form of attention keras-hub writes, and its rotary embeddings, fused and not,
side by side in ONNX Runtime.

    python benchmarks/attention_forms.py           # results/attention_forms.json and .png
    python benchmarks/attention_forms.py --quick   # a smoke run: two models, small

`fusions.fuse_attention` matches several forms besides Keras' own attention:
grouped-query attention (Gemma), a bias added to the logits (T5's relative
position bias, Falcon's ALiBi, DeBERTa's disentangled terms), the scale
inside the einsum's transpose (GPT-NeoX) and a mask built from the logits'
shape (CLIP). Each fused form computes extra work the unfused graph does not
(Gemma's key and value heads repeated for the query heads, T5's bias expanded
to every query), so each is measured against the same export with the
attention fusion switched off, every other pass unchanged: keras-hub models
of 4 layers, 256 wide, 4 heads of 64 (Gemma: 1 key/value head), 1024 in the
MLP, a vocabulary of 1000; latency medians at (1, 128), (8, 128) and
(1, 512), interleaved, sessions that stop spinning after a run (see
`export_bench.session`). Both files are checked to agree on each timing feed.
XLNet (position and segment terms in the bias), Gemma 3n (heads repeated as
`repeat_kv`), ESM (the scale computed at run time) and GPT-OSS (attention
sinks: the fused op gets one more key, value and bias column) are measured
the same way. Llama's row switches the rotary-embedding fusion
(`fusions.rotary`) instead, the attention fused in both files.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # zoo_models builds keras-hub models by class

# label: (keras-hub class, the form, the fusion switched): one of each form.
MODELS = {
    "Gemma": ("GemmaBackbone", "grouped queries: 4 query heads on 1 key/value head", "attention"),
    "T5": ("T5Backbone", "relative position bias added to unscaled logits", "attention"),
    "Falcon": ("FalconBackbone", "ALiBi bias, scaled after it is added", "attention"),
    "GPT-NeoX": ("GPTNeoXBackbone", "scale inside the einsum's transpose", "attention"),
    "DeBERTa-v3": ("DebertaV3Backbone", "disentangled position terms as a bias", "attention"),
    "CLIP text": ("CLIPTextEncoder", "causal mask built from the logits' shape", "attention"),
    "XLNet": ("XLNetBackbone", "position and segment terms summed into the bias", "attention"),
    "Gemma 3n": ("Gemma3nBackbone", "key/value heads repeated as repeat_kv", "attention"),
    "ESM": ("ESMBackbone", "scale computed from the head size", "attention"),
    "GPT-OSS": (
        "GptOssBackbone",
        "attention sinks: one more key, value and bias column",
        "attention",
    ),
    "Llama": ("LlamaBackbone", "rotary embeddings of queries and keys", "rotary"),
}
QUICK_MODELS = {name: MODELS[name] for name in ("Gemma", "T5", "Llama")}
# The fusion each row switches off: (its pass, the op it writes).
SWITCHES = {
    "attention": ("keras_layers.export.passes.fusions.multi_head_attention", "MultiHeadAttention"),
    "rotary": ("keras_layers.export.passes.fusions.rotary", "RotaryEmbedding"),
}
# Sizes by constructor argument name; each class takes those it has.
SIZES = {
    "vocabulary_size": 1000,
    "num_layers": 4,
    "hidden_dim": 256,
    "embedding_dim": 256,
    "intermediate_dim": 1024,
    "num_heads": 4,
    "num_query_heads": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "key_value_dim": 64,
    "max_sequence_length": 512,
}
QUICK_SIZES = SIZES | {"hidden_dim": 64, "embedding_dim": 64, "intermediate_dim": 128}
QUICK_SIZES |= {"num_layers": 2, "head_dim": 16, "key_value_dim": 16, "max_sequence_length": 64}
SHAPES = [(1, 128), (8, 128), (1, 512)]
QUICK_SHAPES = [(1, 32)]
# Gemma 3n names its sizes its own way (Hugging Face's): the same model size.
SIZES_BY_CLASS = {
    "Gemma3nBackbone": {
        "text_vocab_size": 1000,
        "vocab_size_per_layer_input": 1000,
        "text_hidden_size": 256,
        "num_hidden_layers": 4,
        "intermediate_size": [1024] * 4,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        "sliding_window": 512,
        "max_position_embeddings": 512,
    }
}
AGREEMENT_ATOL = 1e-4


def build(cls_name: str, sizes: dict):
    """The keras-hub model `cls_name` at `sizes`, weights redrawn (zoo_models')."""
    import keras
    import zoo_models

    cls = zoo_models.by_name(cls_name).cls
    taken = {parameter.name for parameter in zoo_models._parameters(cls)}
    keras.backend.clear_session()
    keras.utils.set_random_seed(zoo_models.SEED)
    given = {name: value for name, value in sizes.items() if name in taken}
    return zoo_models.redraw(cls(**zoo_models.tiny_arguments(cls, given)))


def feeds_for(model, batch: int, length: int, vocabulary: int) -> dict:
    """Full rows of random tokens for every input of `model`."""
    import numpy as np

    rng = np.random.default_rng(0)
    feeds = {}
    for tensor in model.inputs:
        name = tensor.name
        if name.endswith("padding_mask"):
            value = np.ones((batch, length))
        elif name.endswith("token_ids"):
            value = rng.integers(1, vocabulary, (batch, length))
        else:  # segment ids
            value = np.zeros((batch, length))
        feeds[name] = value.astype(str(tensor.dtype))
    return feeds


def export_both(model, folder: Path, switch: str = "attention") -> dict:
    """{"fused": path, "unfused": path}: the same export with and without the
    fusion `switch` (a key of SWITCHES), each validated on a small grid."""
    import importlib

    from keras_layers.export import ExportOptions, export_model, slimming

    module, _ = SWITCHES[switch]
    paths = {name: folder / f"{name}.onnx" for name in ("fused", "unfused")}
    shapes = [(2, 16), "padded"]
    export_model(model, paths["fused"], ExportOptions(shapes=shapes))
    unfused = slimming.without(importlib.import_module(module))
    with mock.patch.object(slimming, "PASSES", unfused):
        export_model(model, paths["unfused"], ExportOptions(shapes=shapes))
    return paths


def op_count(path: Path, op_type: str | None = None) -> int:
    import onnx

    nodes = onnx.load(str(path), load_external_data=False).graph.node
    return sum(op_type is None or node.op_type == op_type for node in nodes)


def time_model(paths: dict, model, shapes, vocabulary, rounds, calls) -> dict:
    import numpy as np

    from benchmarks.export_bench import session
    from benchmarks.timing import time_side_by_side

    sessions = {name: session(path) for name, path in paths.items()}
    latency = {}
    for batch, length in shapes:
        feeds = feeds_for(model, batch, length, vocabulary)
        outputs = {name: s.run(None, feeds) for name, s in sessions.items()}
        difference = max(
            float(np.abs(a - b).max())
            for a, b in zip(outputs["fused"], outputs["unfused"], strict=True)
        )
        if difference > AGREEMENT_ATOL:
            raise SystemExit(f"fused and unfused differ by {difference:.2e} at {batch}x{length}")
        timed = time_side_by_side(
            {name: (lambda s=s, f=feeds: s.run(None, f)) for name, s in sessions.items()},
            rounds=rounds,
            calls=calls,
        )
        latency[f"{batch}x{length}"] = {
            "ms": {name: entry["median_ms"] for name, entry in timed.items()},
            "fused_over_unfused": timed["fused"]["median_ms"] / timed["unfused"]["median_ms"],
            "max_abs_difference": difference,
        }
    return latency


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

    import onnxruntime

    from benchmarks.results_io import run_header, save

    models = QUICK_MODELS if args.quick else MODELS
    sizes = QUICK_SIZES if args.quick else SIZES
    shapes = QUICK_SHAPES if args.quick else SHAPES
    rounds, calls = (3, 1) if args.quick else (11, 3)
    report = {
        **run_header("attention_forms.py", args.quick),
        "versions": {"onnxruntime": onnxruntime.__version__},
        "sizes": sizes,
        "models": {},
    }
    for label, (cls_name, form, switch) in models.items():
        # Llama: 4 query heads on 2 key/value heads, as in real_models.py.
        extra = {"num_key_value_heads": 2} if switch == "rotary" else {}
        model = build(cls_name, sizes | extra | SIZES_BY_CLASS.get(cls_name, {}))
        with tempfile.TemporaryDirectory(prefix="attention_forms_") as folder:
            paths = export_both(model, Path(folder), switch)
            op = SWITCHES[switch][1]
            report["models"][label] = {
                "class": cls_name,
                "form": form,
                "op": op,
                "fused_ops": op_count(paths["fused"], op),
                "nodes": {name: op_count(path) for name, path in paths.items()},
                "latency": time_model(
                    paths, model, shapes, sizes["vocabulary_size"], rounds, calls
                ),
            }
        print(f"{label}: done", flush=True)
    return save(report, "attention_forms", args.quick, print_table, plot)


def print_table(report):
    for label, entry in report["models"].items():
        for shape, row in entry["latency"].items():
            ms = row["ms"]
            print(
                f"{label:12} {shape:>8}  fused {ms['fused']:8.2f} ms  unfused "
                f"{ms['unfused']:8.2f} ms  ratio {row['fused_over_unfused']:.3f}"
            )


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.results_io import finish_figure

    labels = list(report["models"])
    shapes = list(next(iter(report["models"].values()))["latency"])
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(shapes)
    for index, shape in enumerate(shapes):
        values = [
            report["models"][label]["latency"][shape]["fused_over_unfused"] for label in labels
        ]
        ax.bar([x + index * width for x in range(len(labels))], values, width, label=shape)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks([x + width * (len(shapes) - 1) / 2 for x in range(len(labels))], labels)
    ax.set_ylabel("fused / unfused latency")
    ax.legend()
    finish_figure(fig, report, path)


if __name__ == "__main__":
    main()
