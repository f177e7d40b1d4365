"""keras-hub BERT and a Llama-style decoder in ONNX Runtime, four ways, side by side.

    python benchmarks/real_models.py            # ~15 min
    python benchmarks/real_models.py --quick    # a smoke run: tiny models, few rounds

Two models people train, built by keras-hub with their weights drawn at random
(seed 0): `BertBackbone` (vocabulary 30522, hidden 256, 4 layers, 4 heads,
intermediate 1024) and `LlamaBackbone` (vocabulary 32000, hidden 256, 4 layers,
4 query / 2 key-value heads, intermediate 688: grouped-query attention, rotary
positions, RMSNorm). Each is exported four ways:

- `ours`: `keras_layers.export.export_model`, default flags (validated);
- `keras export`: Keras' own `model.export(path, format="onnx")`;
- `plain tf2onnx`: `tf2onnx.convert.from_function` on a `tf.function` of the model;
- `pytorch + ort optimizer`: the same architecture in Hugging Face `transformers`
  (`BertModel`, `LlamaModel`) with the Keras weights copied in (outputs checked
  against Keras to 1e-4 before anything is timed), exported by
  `torch.onnx.export` (the TorchScript exporter optimum uses) and optimized by
  `onnxruntime.transformers.optimizer` (model type `bert`; `gpt2` for Llama, as
  the optimizer has no Llama type): the PyTorch user's path on CPU.

Latency is timed at (batch, sequence) (1, 128), (8, 128), (1, 512) and (1, 2048),
each shape's candidates interleaved round by round (`benchmarks/timing.py`), in
ONNX Runtime sessions that stop spin-waiting when a run returns
(`export_bench.session`). The matmul-only bound (each of the model's matmuls
alone in ONNX Runtime, run one after another as one more candidate in the same
rounds; `export_bench.matmul_chain`) and the cost per FLOP from
128 to 2048 tokens come from the same run, and so does our export without
`share_shapes.share_equal_shapes` (each decoder layer keeping its own copy of the
masks and rotary tables). Each file's fused ops are counted, and ONNX
Runtime's transformer optimizer is run over our file too: what it still finds
there is what we left on the table. Last, the one fusion it still finds (a
residual Add into the norm after it, `SkipLayerNormalization` and
`SkipSimplifiedLayerNormalization`) is timed alone against the two ops it
replaces, which is why our export leaves it out. Writes
`benchmarks/results/real_models.json` and `.png`; the tables of
`docs/performance.md` are rendered from the JSON (`benchmarks/docs_tables.py`).
"""

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = {
    "bert": {"vocabulary": 30522, "width": 256, "layers": 4, "heads": 4, "intermediate": 1024},
    "llama": {
        "vocabulary": 32000,
        "width": 256,
        "layers": 4,
        "heads": 4,
        "kv_heads": 2,
        "intermediate": 688,
    },
}
QUICK_MODELS = {
    "bert": {"vocabulary": 500, "width": 32, "layers": 1, "heads": 2, "intermediate": 64},
    "llama": {
        "vocabulary": 500,
        "width": 32,
        "layers": 1,
        "heads": 2,
        "kv_heads": 1,
        "intermediate": 64,
    },
}
# (batch, sequence, rounds): a round at (1, 128) is short, so more of them buy
# a steadier median on this shared machine.
SHAPES = [(1, 128, 30), (8, 128, 15), (1, 512, 15), (1, 2048, 7)]
QUICK_SHAPES = [(1, 16, 2), (2, 32, 2)]
CANDIDATES = ("ours", "keras export", "plain tf2onnx", "pytorch + ort optimizer")
# Ours without `share_shapes.share_equal_shapes`, timed beside the others.
UNSHARED = "ours, per-layer shapes"
FILE_STEMS = {
    "ours": "ours",
    UNSHARED: "ours_unshared",
    "keras export": "keras",
    "plain tf2onnx": "plain",
    "pytorch + ort optimizer": "pytorch",
}
# What ONNX Runtime's transformer optimizer is told each model is.
OPTIMIZER_TYPES = {"bert": "bert", "llama": "gpt2"}
# The bounds `export_bench.matmul_bounds` times that this comparison needs.
BOUNDS = {"matmul bound": "fed", "matmul bound, prepacked": "prepacked"}
# Op types that are one fused kernel standing for a decomposed subgraph.
FUSED_OPS = (
    "Attention",
    "MultiHeadAttention",
    "GroupQueryAttention",
    "RotaryEmbedding",
    "EmbedLayerNormalization",
    "LayerNormalization",
    "SkipLayerNormalization",
    "SimplifiedLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "BiasGelu",
    "FastGelu",
    "Gelu",
    "QuickGelu",
    "BiasAdd",
    "BiasSoftmax",
)
AGREEMENT_ATOL = 1e-4
CHECK_LENGTH = 16  # the agreement checks' sequence length (a padded batch of 2)


# --- the models ------------------------------------------------------------------


def keras_model(kind: str, config: dict, max_length: int):
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    if kind == "bert":
        return keras_hub.models.BertBackbone(
            vocabulary_size=config["vocabulary"],
            num_layers=config["layers"],
            num_heads=config["heads"],
            hidden_dim=config["width"],
            intermediate_dim=config["intermediate"],
            max_sequence_length=max_length,
        )
    return keras_hub.models.LlamaBackbone(
        vocabulary_size=config["vocabulary"],
        num_layers=config["layers"],
        num_query_heads=config["heads"],
        num_key_value_heads=config["kv_heads"],
        hidden_dim=config["width"],
        intermediate_dim=config["intermediate"],
    )


def _copy_weights(hf_model, state: dict) -> None:
    import numpy as np
    import torch

    tensors = {name: torch.tensor(np.ascontiguousarray(value)) for name, value in state.items()}
    result = hf_model.load_state_dict(tensors, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise RuntimeError(f"weights not copied one to one: {result}")


def _dense(weights, path, width):
    """A keras-hub EinsumDense kernel as a torch Linear weight (out, in)."""
    kernel = weights[path]
    return kernel.reshape(width, -1).T if kernel.shape[0] == width else kernel.reshape(-1, width).T


def _hf_sizes(config: dict, max_length: int) -> dict:
    """The sizes every transformers config here takes, from ours; eager
    attention, the plain ops the TorchScript exporter and ORT's optimizer know."""
    return {
        "vocab_size": config["vocabulary"],
        "hidden_size": config["width"],
        "num_hidden_layers": config["layers"],
        "num_attention_heads": config["heads"],
        "intermediate_size": config["intermediate"],
        "max_position_embeddings": max_length,
        "attn_implementation": "eager",
    }


def torch_bert(model, config, max_length):
    """transformers' BertModel with the keras-hub BertBackbone's weights."""
    import transformers

    hf = transformers.BertModel(
        transformers.BertConfig(
            **_hf_sizes(config, max_length),
            type_vocab_size=2,
            hidden_act="gelu_new",  # the tanh form keras-hub's BERT uses
            layer_norm_eps=1e-12,
        )
    ).eval()
    weights, width = {w.path: w.numpy() for w in model.weights}, config["width"]
    state = {
        "embeddings.word_embeddings.weight": weights["token_embedding/embeddings"],
        "embeddings.position_embeddings.weight": weights["position_embedding/embeddings"],
        "embeddings.token_type_embeddings.weight": weights["segment_embedding/embeddings"],
        "embeddings.LayerNorm.weight": weights["embeddings_layer_norm/gamma"],
        "embeddings.LayerNorm.bias": weights["embeddings_layer_norm/beta"],
        "pooler.dense.weight": weights["pooled_dense/kernel"].T,
        "pooler.dense.bias": weights["pooled_dense/bias"],
    }
    for i in range(config["layers"]):
        ours, theirs = f"transformer_layer_{i}/", f"encoder.layer.{i}."
        attention = ours + "self_attention_layer/"
        for name in ("query", "key", "value"):
            state[f"{theirs}attention.self.{name}.weight"] = _dense(
                weights, f"{attention}{name}/kernel", width
            )
            state[f"{theirs}attention.self.{name}.bias"] = weights[
                f"{attention}{name}/bias"
            ].ravel()
        state[theirs + "attention.output.dense.weight"] = _dense(
            weights, attention + "attention_output/kernel", width
        )
        pairs = {
            "attention.output.dense.bias": "self_attention_layer/attention_output/bias",
            "attention.output.LayerNorm.weight": "self_attention_layer_norm/gamma",
            "attention.output.LayerNorm.bias": "self_attention_layer_norm/beta",
            "intermediate.dense.bias": "feedforward_intermediate_dense/bias",
            "output.dense.bias": "feedforward_output_dense/bias",
            "output.LayerNorm.weight": "feedforward_layer_norm/gamma",
            "output.LayerNorm.bias": "feedforward_layer_norm/beta",
        }
        state |= {theirs + key: weights[ours + value] for key, value in pairs.items()}
        state[theirs + "intermediate.dense.weight"] = weights[
            ours + "feedforward_intermediate_dense/kernel"
        ].T
        state[theirs + "output.dense.weight"] = weights[ours + "feedforward_output_dense/kernel"].T
    _copy_weights(hf, state)
    return hf


def torch_llama(model, config, max_length):
    """transformers' LlamaModel with the keras-hub LlamaBackbone's weights."""
    import transformers

    hf = transformers.LlamaModel(
        transformers.LlamaConfig(
            **_hf_sizes(config, max_length),
            num_key_value_heads=config["kv_heads"],
            rms_norm_eps=1e-6,
        )
    ).eval()
    weights, width = {w.path: w.numpy() for w in model.weights}, config["width"]
    state = {
        "embed_tokens.weight": weights["token_embedding/embeddings"],
        "norm.weight": weights["sequence_output_layernorm/scale"],
    }
    for i in range(config["layers"]):
        ours, theirs = f"transformer_layer_{i}/", f"layers.{i}."
        for short, name in (("q", "query"), ("k", "key"), ("v", "value"), ("o", None)):
            path = f"{ours}self_attention/{name or 'attention_output'}/kernel"
            state[f"{theirs}self_attn.{short}_proj.weight"] = _dense(weights, path, width)
        pairs = {
            "mlp.gate_proj.weight": "feedforward_gate_dense/kernel",
            "mlp.up_proj.weight": "feedforward_intermediate_dense/kernel",
            "mlp.down_proj.weight": "feedforward_output_dense/kernel",
        }
        state |= {theirs + key: weights[ours + value].T for key, value in pairs.items()}
        state[theirs + "input_layernorm.weight"] = weights[ours + "self_attention_layernorm/scale"]
        state[theirs + "post_attention_layernorm.weight"] = weights[
            ours + "feedforward_layernorm/scale"
        ]
    _copy_weights(hf, state)
    return hf


TORCH_MODELS = {"bert": torch_bert, "llama": torch_llama}


# --- feeds and outputs -------------------------------------------------------------

# Every file's input names, by what they carry.
ROLES = {
    "token_ids": "ids",
    "input_ids": "ids",
    "padding_mask": "mask",
    "attention_mask": "mask",
    "segment_ids": "segments",
    "token_type_ids": "segments",
}
SEQUENCE_OUTPUTS = ("sequence_output", "last_hidden_state")
DTYPES = {"tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(bool)": "bool"}


def batch_values(batch: int, length: int, vocabulary: int) -> dict:
    """Token ids, an all-ones padding mask and zero segments, by role."""
    import numpy as np

    ids = np.random.default_rng(length + batch).integers(1, vocabulary, size=(batch, length))
    return {"ids": ids, "mask": np.ones_like(ids), "segments": np.zeros_like(ids)}


def feeds_for(session, values: dict) -> dict:
    """`values` under the session's own input names and dtypes."""
    return {
        value.name: values[ROLES[value.name]].astype(DTYPES[value.type])
        for value in session.get_inputs()
    }


def sequence_output_name(session) -> str:
    names = [value.name for value in session.get_outputs()]
    return next((name for name in names if name in SEQUENCE_OUTPUTS), names[0])


# --- the four exports ---------------------------------------------------------------


def export_ours(model, path: Path, share_shapes: bool = True) -> None:
    """Our export; `share_shapes=False` leaves each layer its own `Shape`s (and
    so its own copy of the masks and rotary tables), to measure what sharing them
    (`keras_layers.export.passes.share_shapes`) buys."""
    from unittest import mock

    from keras_layers.export import ExportOptions, export_model, slimming
    from keras_layers.export.passes import share_shapes as sharing

    unshared = mock.patch.object(slimming, "PASSES", slimming.without(sharing))
    with unshared if not share_shapes else contextlib.nullcontext():
        report = export_model(
            model, path, ExportOptions(report_path=path.with_suffix(".report.json"))
        )
    if not report["passed"]:
        raise RuntimeError(f"our export failed its own validation: {path}")


def export_keras(model, path: Path) -> None:
    model.export(str(path), format="onnx", verbose=False)


def export_plain(model, path: Path) -> None:
    import onnx
    import tensorflow as tf
    import tf2onnx

    names = [tensor.name.split(":")[0] for tensor in model.inputs]
    spec = [tf.TensorSpec((None, None), tf.int32, name=name) for name in names]
    function = tf.function(lambda *args: model(dict(zip(names, args, strict=True))))
    proto, _ = tf2onnx.convert.from_function(function, input_signature=spec, opset=18)
    onnx.save(proto, str(path))


@contextlib.contextmanager
def traceable_masks():
    """transformers >= 4.53 builds attention masks with `torch.vmap`, which the
    TorchScript exporter cannot trace (`RuntimeError: unordered_map::at` with
    torch 2.13 and transformers 4.57); swap in optimum's vectorised mask builders
    for the export, as optimum's own exporter does, and put the originals back."""
    try:
        from optimum.exporters.onnx import model_patcher
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask, sdpa_mask
    except ImportError:  # an older transformers: its masks trace as they are
        yield
        return
    ALL_MASK_ATTENTION_FUNCTIONS.register("sdpa", model_patcher.sdpa_mask_without_vmap)
    ALL_MASK_ATTENTION_FUNCTIONS.register("eager", model_patcher.eager_mask_without_vmap)
    try:
        yield
    finally:
        ALL_MASK_ATTENTION_FUNCTIONS.register("sdpa", sdpa_mask)
        ALL_MASK_ATTENTION_FUNCTIONS.register("eager", eager_mask)


def export_torch(hf_model, kind: str, config: dict, path: Path) -> None:
    import torch
    from onnxruntime.transformers import optimizer

    names = ["input_ids", "attention_mask"] + (["token_type_ids"] if kind == "bert" else [])

    class Forward(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, *args):
            inputs = dict(zip(names, args, strict=True))
            return self.model(**inputs, use_cache=False).last_hidden_state

    values = batch_values(2, 16, config["vocabulary"])
    args = tuple(torch.tensor(values[ROLES[name]]) for name in names)
    raw = path.with_name(path.stem + ".raw.onnx")
    axes = {name: {0: "batch", 1: "sequence"} for name in [*names, "last_hidden_state"]}
    with torch.no_grad(), traceable_masks():
        torch.onnx.export(
            Forward(hf_model),
            args,
            str(raw),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=18,
            dynamo=False,
        )
    optimized = optimizer.optimize_model(
        str(raw),
        model_type=OPTIMIZER_TYPES[kind],
        num_heads=config["heads"],
        hidden_size=config["width"],
    )
    optimized.save_model_to_file(str(path))


# --- what each file holds ------------------------------------------------------------


def op_counts(path: Path) -> Counter:
    import onnx

    return Counter(node.op_type for node in onnx.load(str(path)).graph.node)


def fused(counts: Counter) -> dict:
    return {op: counts[op] for op in FUSED_OPS if counts[op]}


def left_to_fuse(path: Path, kind: str, config: dict) -> dict:
    """The fused ops ONNX Runtime's transformer optimizer adds to the file at `path`."""
    from onnxruntime.transformers import optimizer

    before = op_counts(path)
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "reoptimized.onnx"
        optimizer.optimize_model(
            str(path),
            model_type=OPTIMIZER_TYPES[kind],
            num_heads=config["heads"],
            hidden_size=config["width"],
        ).save_model_to_file(str(target))
        after = op_counts(target)
    return {op: after[op] - before[op] for op in FUSED_OPS if after[op] > before[op]}


# --- the matmul bound and FLOPs --------------------------------------------------------


def matmul_shapes(kind: str, batch: int, length: int, config: dict) -> list:
    """Every matmul of one forward pass, as (A shape, B shape); no output projection."""
    width, heads = config["width"], config["heads"]
    head, rows = width // heads, batch * length
    kv_width = head * config.get("kv_heads", heads)
    shapes = []
    for _ in range(config["layers"]):
        shapes += [((rows, width), (width, width))] * 2  # query, attention output
        shapes += [((rows, width), (width, kv_width))] * 2  # key, value
        shapes += [((batch * heads, length, head), (batch * heads, head, length))]
        shapes += [((batch * heads, length, length), (batch * heads, length, head))]
        projections = 2 if kind == "bert" else 3  # Llama's gated feed-forward
        shapes += [((rows, width), (width, config["intermediate"]))] * (projections - 1)
        shapes += [((rows, config["intermediate"]), (config["intermediate"], width))]
    if kind == "bert":
        shapes.append(((batch, width), (width, width)))  # the pooler
    return shapes


def flops(shapes: list) -> int:
    return sum(2 * math.prod(a_shape) * b_shape[-1] for a_shape, b_shape in shapes)


# --- the skip-norm kernels ----------------------------------------------------------

# The residual Add and the norm after it, fused or not, as ORT's optimizer would.
SKIP_NORMS = {
    "LayerNormalization": "SkipLayerNormalization",
    "SimplifiedLayerNormalization": "SkipSimplifiedLayerNormalization",
}
SKIP_NORM_SHAPES = [(1, 128), (8, 128), (1, 2048)]


def _norm_chain(norm: str, fused: bool, width: int, count: int = 8):
    """`count` residual Adds each followed by `norm` (or their fused op), chained."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    initializers = [
        numpy_helper.from_array(np.ones(width, "float32"), "scale"),
        numpy_helper.from_array(np.zeros(width, "float32"), "bias"),
    ]
    params = ["scale"] if norm.startswith("Simplified") else ["scale", "bias"]
    nodes, x = [], "x"
    for i in range(count):
        if fused:
            op, inputs, domain = SKIP_NORMS[norm], [x, "skip", *params], "com.microsoft"
            nodes.append(helper.make_node(op, inputs, [f"n{i}"], domain=domain, epsilon=1e-6))
        else:
            nodes.append(helper.make_node("Add", [x, "skip"], [f"a{i}"]))
            nodes.append(
                helper.make_node(norm, [f"a{i}", *params], [f"n{i}"], epsilon=1e-6, axis=-1)
            )
        x = f"n{i}"
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x", "skip")]
    output = helper.make_tensor_value_info(x, TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "norms", inputs, [output], initializers)
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def skip_norm_kernels(width: int, shapes, rounds: int) -> dict:
    """Median ms of 8 x (Add + norm) against 8 x the fused skip norm, side by side.

    ONNX Runtime's optimizer fuses each residual Add into the norm after it;
    this measures whether that is faster on this CPU, which decides whether
    our export does it (`fusions.fuse_gelus`' `skip_norms`).
    """
    import numpy as np

    from benchmarks.export_bench import session
    from benchmarks.timing import time_side_by_side

    out = {}
    with tempfile.TemporaryDirectory() as folder:
        for batch, length in shapes:
            rng = np.random.default_rng(0)
            feeds = {
                name: rng.standard_normal((batch, length, width)).astype("float32")
                for name in ("x", "skip")
            }
            candidates = {}
            for norm, fused_op in SKIP_NORMS.items():
                for fused, label in ((False, f"Add + {norm}"), (True, fused_op)):
                    path = Path(folder) / f"{label.replace(' ', '')}.onnx"
                    path.write_bytes(_norm_chain(norm, fused, width).SerializeToString())
                    sess = session(path)
                    candidates[label] = lambda sess=sess, feeds=feeds: sess.run(None, feeds)
            timing = time_side_by_side(candidates, rounds=rounds, calls=10)
            out[f"{batch}x{length}"] = {name: row["median_ms"] for name, row in timing.items()}
    return out


# --- the run --------------------------------------------------------------------------


def build_files(kind, config, max_length, work: Path) -> tuple[dict, dict, float]:
    """The four files of one model, their export seconds, and Keras' agreement check."""
    import numpy as np
    import torch

    model = keras_model(kind, config, max_length)
    hf_model = TORCH_MODELS[kind](model, config, max_length)
    values = batch_values(2, CHECK_LENGTH, config["vocabulary"])
    values["mask"][1, CHECK_LENGTH // 2 :] = 0
    keras_inputs = {"token_ids": values["ids"], "padding_mask": values["mask"]}
    if kind == "bert":
        keras_inputs["segment_ids"] = values["segments"]
    reference = model(keras_inputs)
    reference = np.asarray(reference["sequence_output"] if kind == "bert" else reference)
    torch_inputs = {"input_ids": values["ids"], "attention_mask": values["mask"]}
    if kind == "bert":
        torch_inputs["token_type_ids"] = values["segments"]
    with torch.no_grad():
        torch_inputs = {name: torch.tensor(value) for name, value in torch_inputs.items()}
        theirs = hf_model(**torch_inputs).last_hidden_state.numpy()
    valid = values["mask"].astype(bool)
    difference = float(np.abs(theirs - reference)[valid].max())
    if difference > AGREEMENT_ATOL:
        raise RuntimeError(f"{kind}: the PyTorch copy differs from Keras by {difference:.2e}")

    files, seconds = {}, {}
    exporters = {
        "ours": lambda path: export_ours(model, path),
        UNSHARED: lambda path: export_ours(model, path, share_shapes=False),
        "keras export": lambda path: export_keras(model, path),
        "plain tf2onnx": lambda path: export_plain(model, path),
        "pytorch + ort optimizer": lambda path: export_torch(hf_model, kind, config, path),
    }
    for name, export in exporters.items():
        path = work / f"{kind}_{FILE_STEMS[name]}.onnx"
        start = time.perf_counter()
        export(path)
        seconds[name], files[name] = time.perf_counter() - start, path
    return files, seconds, difference


def agreement(sessions: dict, config: dict) -> dict:
    """Each file's largest difference from the PyTorch file at (2, CHECK_LENGTH), unpadded."""
    import numpy as np

    values = batch_values(2, CHECK_LENGTH, config["vocabulary"])
    outputs = {
        name: session.run([sequence_output_name(session)], feeds_for(session, values))[0]
        for name, session in sessions.items()
    }
    reference = outputs["pytorch + ort optimizer"]
    return {name: float(np.abs(output - reference).max()) for name, output in outputs.items()}


def time_model(kind, config, files, shapes) -> dict:
    from benchmarks.export_bench import matmul_chain, session
    from benchmarks.timing import time_side_by_side

    sessions = {name: session(path) for name, path in files.items()}
    latency = {}
    for batch, length, rounds in shapes:
        values = batch_values(batch, length, config["vocabulary"])
        candidates = {}
        for name, sess in sessions.items():
            feeds = feeds_for(sess, values)
            candidates[name] = lambda sess=sess, feeds=feeds: sess.run(None, feeds)
        # The bounds run in the same rounds as the files (export_bench.matmul_chain).
        shape_list = matmul_shapes(kind, batch, length, config)
        for name, mode in BOUNDS.items():
            candidates[name] = matmul_chain(shape_list, mode)
        timing = time_side_by_side(candidates, rounds=rounds, calls=1, warmup=2)
        latency[f"{batch}x{length}"] = {"gflops": flops(shape_list) / 1e9, "ms": timing}
    return latency, agreement(sessions, config)


# Where a run's time goes: ONNX Runtime's profiler, each node's kernel time
# summed by kind, at the shape where the targets are missed most.
PROFILE_SHAPE = (8, 128)
QUICK_PROFILE_SHAPE = (2, 32)
PROFILED = ("ours", "keras export", "pytorch + ort optimizer")
OP_KINDS = {
    "matmul": {"MatMul", "Gemm", "FusedMatMul"},
    "attention": {"MultiHeadAttention", "Attention", "Softmax"},
    "norms": {
        "LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization", "EmbedLayerNormalization",
    },
    "activations": {"FastGelu", "Gelu", "BiasGelu", "QuickGelu", "Erf", "Tanh", "Sigmoid"},
    "rotary": {"RotaryEmbedding", "Sin", "Cos"},
    "elementwise": {"Add", "Mul", "Sub", "Div", "Pow", "Sqrt", "Neg", "Where", "Reciprocal"},
}  # fmt: skip
PROFILE_RUNS = 20


def op_kind(op_type: str) -> str:
    return next((kind for kind, ops in OP_KINDS.items() if op_type in ops), "layout and other")


def profile_by_kind(path: Path, values: dict, runs: int) -> dict:
    """Milliseconds per run each kind of op takes (ONNX Runtime's profiler, the
    timing sessions' settings, after 3 unprofiled warm-up runs)."""
    import json

    import onnxruntime as ort

    from benchmarks.export_bench import THREADS

    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.force_spinning_stop", "1")
    with tempfile.TemporaryDirectory(prefix="real_models_profile_") as folder:
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(folder) / "profile")
        sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        feeds = feeds_for(sess, values)
        for _ in range(runs):
            sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
    totals = Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            totals[op_kind(event["args"]["op_name"])] += event["dur"] / 1000 / runs
    return {kind: totals[kind] for kind in [*OP_KINDS, "layout and other"]}


def profiles(kind, config, files, shape) -> dict:
    batch, length = shape
    values = batch_values(batch, length, config["vocabulary"])
    return {
        "shape": f"{batch}x{length}",
        "ms_by_kind": {
            name: profile_by_kind(files[name], values, PROFILE_RUNS) for name in PROFILED
        },
    }


def ratios(latency: dict) -> dict:
    out = {}
    for shape, entry in latency.items():
        timing = {name: row["median_ms"] for name, row in entry["ms"].items()}
        ours = timing["ours"]
        out[shape] = {
            "ours / pytorch + ort optimizer": ours / timing["pytorch + ort optimizer"],
            "ours / keras export": ours / timing["keras export"],
            "ours / plain tf2onnx": ours / timing["plain tf2onnx"],
            "ours / matmul bound": ours / timing["matmul bound"],
            "ours / prepacked matmul bound": ours / timing["matmul bound, prepacked"],
            "ours / ours with per-layer shapes": ours / timing[UNSHARED],
        }
    return out


def cost_per_flop(latency: dict) -> dict:
    """Each candidate's milliseconds per GFLOP at batch 1, over its figure at the shortest."""
    singles = [shape for shape in latency if shape.startswith("1x")]
    first = latency[singles[0]]
    out = {}
    for shape in singles:
        entry = latency[shape]
        out[shape] = {
            name: (entry["ms"][name]["median_ms"] / entry["gflops"])
            / (first["ms"][name]["median_ms"] / first["gflops"])
            for name in CANDIDATES
        }
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

    import onnxruntime
    import tensorflow as tf
    import tf2onnx
    import torch
    import transformers

    from benchmarks.results_io import run_header, save

    torch.set_num_threads(2)
    models = QUICK_MODELS if args.quick else MODELS
    shapes = QUICK_SHAPES if args.quick else SHAPES
    max_length = max(length for _, length, _ in shapes)
    report = {
        **run_header("real_models.py", args.quick),
        "versions": {
            "onnxruntime": onnxruntime.__version__,
            "tensorflow": tf.__version__,
            "tf2onnx": tf2onnx.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "models": {},
    }
    for kind, config in models.items():
        # The files (tens of MB each) go with the model's folder.
        with tempfile.TemporaryDirectory(prefix=f"real_models_{kind}_") as folder:
            files, seconds, keras_vs_torch = build_files(kind, config, max_length, Path(folder))
            latency, differences = time_model(kind, config, files, shapes)
            report["models"][kind] = {
                "config": config,
                "pytorch_vs_keras_max_abs": keras_vs_torch,
                "files": {
                    name: {
                        "nodes": sum(op_counts(path).values()),
                        "fused": fused(op_counts(path)),
                        "export_seconds": seconds[name],
                        "max_abs_vs_pytorch_file": differences[name],
                    }
                    for name, path in files.items()
                },
                "ort_optimizer_adds_to_ours": left_to_fuse(files["ours"], kind, config),
                "profile": profiles(
                    kind, config, files, QUICK_PROFILE_SHAPE if args.quick else PROFILE_SHAPE
                ),
                "latency": latency,
                "ratios": ratios(latency),
                "cost_per_flop_vs_shortest": cost_per_flop(latency),
            }
    width = models["bert"]["width"]
    skip_shapes = [(batch, length) for batch, length, _ in shapes]
    report["skip_norms"] = {
        "width": width,
        "ms": skip_norm_kernels(
            width, skip_shapes if args.quick else SKIP_NORM_SHAPES, 5 if args.quick else 21
        ),
    }
    return save(report, "real_models", args.quick, print_table, plot)


def print_table(report):
    for kind, entry in report["models"].items():
        print(
            f"\n{kind}: PyTorch copy vs Keras, max |diff| {entry['pytorch_vs_keras_max_abs']:.1e}"
        )
        for name, row in entry["files"].items():
            print(f"  {name:<24} {row['nodes']:5d} nodes  {row['fused']}")
        left = entry["ort_optimizer_adds_to_ours"] or "nothing"
        print(f"  ORT optimizer still adds to ours: {left}")
        for shape, timing in entry["latency"].items():
            cells = "  ".join(f"{n} {r['median_ms']:.2f}" for n, r in timing["ms"].items())
            print(f"  {shape}: {cells}")
            print("      " + "  ".join(f"{n} {v:.2f}" for n, v in entry["ratios"][shape].items()))
    print(f"\nresidual Add + norm, 8 in a chain, width {report['skip_norms']['width']} (median ms)")
    for shape, timing in report["skip_norms"]["ms"].items():
        print(f"  {shape}: " + "  ".join(f"{n} {v:.3f}" for n, v in timing.items()))


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.results_io import finish_figure

    kinds = list(report["models"])
    fig, axes = plt.subplots(1, len(kinds), figsize=(7 * len(kinds), 4), squeeze=False)
    for axis, kind in zip(axes[0], kinds, strict=True):
        latency = report["models"][kind]["latency"]
        shapes = list(latency)
        for offset, name in enumerate(CANDIDATES):
            ours = [latency[s]["ms"]["ours"]["median_ms"] for s in shapes]
            values = [latency[s]["ms"][name]["median_ms"] for s in shapes]
            positions = [i + (offset - 1.5) * 0.2 for i in range(len(shapes))]
            axis.bar(positions, [v / o for v, o in zip(values, ours, strict=True)], 0.2, label=name)
        axis.set_xticks(range(len(shapes)), shapes)
        axis.set_ylabel("latency / ours")
        axis.set_title(kind)
        axis.legend(fontsize=7)
    finish_figure(fig, report, path)


if __name__ == "__main__":
    main()
