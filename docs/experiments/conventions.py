"""Regenerate the tables and figures of docs/conventions.md.

    python docs/experiments/conventions.py            # the full run, rewrites the page
    python docs/experiments/conventions.py --quick --out DIR  # 1 seed, 2 widths, 16 steps

The page asks which embedding-end convention a model should use. This script
measures two things:

1. what keras-hub's model families do at the embedding end (input scale, tie,
   logit scale, soft cap, normalisation after the embedding, position scheme):
   each family's row of the page is a tiny model built and measured here;
2. how each convention trains when expressed through our layers
   (`ScaledEmbedding`, `TiedOutputDense`, a separate `Dense`, a LayerNorm):
   the demo counting task (keras_layers/demo/task.py), shortened, for every
   convention at widths 64 to 512, five seeds each, the same step budget.

Every number goes to docs/figures/conventions.json, the figures to
docs/figures/conventions_*.png, and the page's tables, between
`<!-- table: NAME -->` and `<!-- /table -->`, are rewritten from that JSON.
`--quick` writes to a folder of its own (`--out`) and leaves the page alone.

Seeds are fixed. Each training process runs TensorFlow on one thread; the runs
are shared between two processes (`--workers`), one per core.
"""

import time

STARTED = time.perf_counter()  # the runtime reported includes importing TensorFlow

import os  # noqa: E402

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

try:
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
except RuntimeError:  # TensorFlow already started (imported from a test): keep its threads.
    pass

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import multiprocessing  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from dataclasses import asdict, dataclass, replace  # noqa: E402
from pathlib import Path  # noqa: E402

import keras  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing the package

from benchmarks.docs_tables import markdown_table, page_tables, rewrite  # noqa: E402
from keras_layers import (  # noqa: E402
    ScaledEmbedding,
    SinusoidalPositionEncoding,
    TiedOutputDense,
)
from keras_layers.demo.task import FIRST_TOKEN, DemoConfig, make_task  # noqa: E402
from keras_layers.demo.task import compile_for_training as compile_demo  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from why_scale import StepLosses, rms_norm, to_numpy  # noqa: E402  the sibling experiment

FIGURES = ROOT / "docs" / "figures"
RESULTS = FIGURES / "conventions.json"
PAGE = ROOT / "docs" / "conventions.md"


# --- 1. the conventions of keras-hub's model families ---------------------

KERAS_HUB_VERSION = "0.32.0"  # the version the citations' line numbers are for
FAMILY_VOCABULARY = 97  # a size no other dimension of the tiny models has
FAMILY_WIDTH = 16


@dataclass(frozen=True)
class Citation:
    """One line of an installed source file, and a piece of text it must contain."""

    path: str  # relative to site-packages
    line: int
    text: str

    def label(self) -> str:
        return f"`{self.path.removeprefix('keras_hub/src/models/')}:{self.line}`"


@dataclass(frozen=True)
class Family:
    """What one keras-hub family does at the embedding end, as its sources say.

    `input_scale` multiplies the looked-up rows ("1" or "sqrt(d)"); `logit_scale`
    multiplies the final hidden state before the projection ("1" or "d^-0.5");
    `soft_cap` is the cap its checkpoints use (None: none); `positions` is how the
    position enters (only "learned, added" is added to the embedding).
    """

    name: str
    backbone: str
    task: str
    arguments: dict
    input_scale: str
    tied: bool
    logit_scale: str
    soft_cap: float | None
    normalised: bool
    positions: str
    initialiser: str
    citations: tuple


HUB = "keras_hub/src/models/"
GEMMA_SQRT = "ops.sqrt(hidden_dim)"
DECODER_SIZES = {"num_query_heads": 2, "num_key_value_heads": 1, "intermediate_dim": 32}
FAMILIES = (
    Family(
        "GPT-2",
        "GPT2Backbone",
        "GPT2CausalLM",
        {"num_heads": 2, "intermediate_dim": 32, "max_sequence_length": 16},
        "1",
        True,
        "1",
        None,
        False,
        "learned, added",
        "normal(0, 0.01)",
        (
            Citation(HUB + "gpt2/gpt2_backbone.py", 89, "ReversibleEmbedding("),
            Citation(HUB + "gpt2/gpt2_backbone.py", 92, "stddev=0.01"),
            Citation(
                HUB + "gpt2/gpt2_backbone.py", 143, "self.embeddings_add((tokens, positions))"
            ),
            Citation(HUB + "gpt2/gpt2_causal_lm.py", 152, "reverse=True"),
        ),
    ),
    Family(
        "BERT",
        "BertBackbone",
        "BertMaskedLM",
        {"num_heads": 2, "intermediate_dim": 32, "max_sequence_length": 16},
        "1",
        True,
        "1",
        None,
        True,
        "learned, added",
        "truncated normal(0, 0.02)",
        (
            Citation(HUB + "bert/bert_backbone.py", 94, "bert_kernel_initializer()"),
            Citation(HUB + "bert/bert_backbone.py", 162, "self.embeddings_add((tokens, positions"),
            Citation(HUB + "bert/bert_backbone.py", 163, "self.embeddings_layer_norm(x)"),
            Citation("keras_hub/src/layers/modeling/masked_lm_head.py", 175, "reverse=True"),
        ),
    ),
    Family(
        "T5 (v1.0)",
        "T5Backbone",
        "T5Seq2SeqLM",
        {"num_heads": 2, "intermediate_dim": 32, "dropout": 0.0},
        "1",
        True,
        "d^-0.5",
        None,
        False,
        "relative bias in attention",
        "truncated normal(0, 1)",
        (
            Citation(HUB + "t5/t5_backbone.py", 82, "tie_weights=tie_embedding_weights"),
            Citation(HUB + "t5/t5_backbone.py", 83, "TruncatedNormal(1.0)"),
            Citation(HUB + "t5/t5_seq_2_seq_lm.py", 141, "hidden_dim**-0.5"),
            Citation(HUB + "t5/t5_transformer_layer.py", 86, "use_relative_attention_bias"),
        ),
    ),
    Family(
        "Gemma",
        "GemmaBackbone",
        "GemmaCausalLM",
        {**DECODER_SIZES, "head_dim": 8},
        "sqrt(d)",
        True,
        "1",
        None,
        False,
        "rotary, in attention",
        "normal(0, vocab^-0.5)",
        (
            Citation(HUB + "gemma/gemma_backbone.py", 110, "tie_weights=True"),
            Citation(HUB + "gemma/gemma_backbone.py", 111, "VarianceScaling("),
            Citation(
                HUB + "gemma/gemma_backbone.py", 154, "x * ops.cast(ops.sqrt(hidden_dim), x.dtype)"
            ),
            Citation(HUB + "gemma/gemma_attention.py", 96, "RotaryEmbedding("),
        ),
    ),
    Family(
        "Gemma 2",
        "GemmaBackbone",
        "GemmaCausalLM",
        {
            **DECODER_SIZES,
            "head_dim": 8,
            "final_logit_soft_cap": 30.0,
            "attention_logit_soft_cap": 50.0,
            "use_post_ffw_norm": True,
            "use_post_attention_norm": True,
        },
        "sqrt(d)",
        True,
        "1",
        30.0,
        False,
        "rotary, in attention",
        "normal(0, vocab^-0.5)",
        (
            Citation(HUB + "gemma/gemma_backbone.py", 117, "logit_soft_cap=final_logit_soft_cap"),
            Citation(
                HUB + "gemma/gemma_backbone.py", 154, "x * ops.cast(ops.sqrt(hidden_dim), x.dtype)"
            ),
            Citation(
                "keras/src/layers/core/reversible_embedding.py",
                142,
                "ops.tanh(ops.divide(logits, soft_cap))",
            ),
        ),
    ),
    Family(
        "Gemma 3",
        "Gemma3Backbone",
        "Gemma3CausalLM",
        {**DECODER_SIZES, "head_dim": 8, "image_size": 16, "vision_encoder": None},
        "sqrt(d)",
        True,
        "1",
        None,
        False,
        "rotary, in attention",
        "normal(0, vocab^-0.5)",
        (
            Citation(HUB + "gemma3/gemma3_backbone.py", 225, "tie_weights=True"),
            Citation(HUB + "gemma3/gemma3_backbone.py", 312, GEMMA_SQRT),
            Citation(HUB + "gemma3/gemma3_attention.py", 142, "RotaryEmbedding("),
        ),
    ),
    Family(
        "Llama",
        "LlamaBackbone",
        "LlamaCausalLM",
        DECODER_SIZES,
        "1",
        False,
        "1",
        None,
        False,
        "rotary, in attention",
        "normal(0, 0.01), both matrices",
        (
            Citation(HUB + "llama/llama_backbone.py", 104, "tie_word_embeddings=False"),
            Citation(HUB + "llama/llama_backbone.py", 112, "stddev=0.01"),
            Citation(HUB + "llama/llama_attention.py", 117, "LlamaRotaryEmbedding("),
            Citation(
                "keras/src/layers/core/reversible_embedding.py", 117, "self.embeddings_initializer"
            ),
        ),
    ),
    Family(
        "Mistral",
        "MistralBackbone",
        "MistralCausalLM",
        DECODER_SIZES,
        "1",
        False,
        "1",
        None,
        False,
        "rotary, in attention",
        "normal(0, 0.01), both matrices",
        (
            Citation(HUB + "mistral/mistral_backbone.py", 116, "tie_weights=False"),
            Citation(HUB + "mistral/mistral_backbone.py", 117, "stddev=0.01"),
            Citation(HUB + "mistral/mistral_attention.py", 122, "RotaryEmbedding("),
        ),
    ),
    Family(
        "Qwen 2",
        "QwenBackbone",
        "QwenCausalLM",
        DECODER_SIZES,
        "1",
        True,
        "1",
        None,
        False,
        "rotary, in attention",
        "normal(0, 0.01)",
        (
            Citation(HUB + "qwen/qwen_backbone.py", 105, "tie_word_embeddings=True"),
            Citation(HUB + "qwen/qwen_backbone.py", 115, "stddev=0.01"),
            Citation(HUB + "qwen/qwen_attention.py", 142, "RotaryEmbedding("),
        ),
    ),
)


def cited_line(citation: Citation) -> str:
    """The cited line of the installed file (keras and keras-hub live in site-packages)."""
    import keras_hub

    site_packages = Path(keras_hub.__file__).resolve().parents[1]
    lines = (site_packages / citation.path).read_text().splitlines()
    return lines[citation.line - 1] if citation.line <= len(lines) else ""


def family_inputs(backbone, rng) -> dict:
    """Token ids (never 0) and full masks for each integer input of the backbone."""
    shape = (2, 8)
    inputs = {}
    for name in backbone.input:
        if "token_ids" in name:
            inputs[name] = rng.integers(1, FAMILY_VOCABULARY, size=shape).astype("int32")
        elif "padding_mask" in name:
            inputs[name] = np.ones(shape, "int32")
        else:  # segment ids
            inputs[name] = np.zeros(shape, "int32")
    return inputs


def first_block(backbone):
    """The first transformer block: the layer whose input is the embedding end's output."""
    names = ("transformer_layer_0", "decoder_block_0", "transformer_encoder_layer_0")
    return next(layer for layer in backbone.layers if layer.name in names)


def first_hidden_state(backbone, inputs: dict) -> np.ndarray:
    """What the first block receives: the embedding end's output."""
    block = first_block(backbone)
    hidden = block._inbound_nodes[0].arguments.args[0]
    output = keras.Model(backbone.input, hidden)(inputs)
    return to_numpy(ops.cast(output, "float32")).astype(np.float64)


def projection(task, backbone, inputs: dict) -> tuple:
    """The hidden states the output projection starts from, its matrix (d, vocab) and the logits.

    The hidden state is the backbone's final output, except for BERT, whose
    masked-LM head transforms it (dense, LayerNorm) first: there it is that
    transform's output.
    """
    embedding = backbone.token_embedding
    matrix = to_numpy(
        embedding.reverse_embeddings
        if not embedding.tie_weights
        else ops.transpose(embedding.embeddings)
    )
    outputs = backbone({name: inputs[name] for name in backbone.input})
    if isinstance(outputs, dict):
        outputs = outputs.get("decoder_sequence_output", outputs.get("sequence_output"))
    if hasattr(task, "masked_lm_head"):
        head = task.masked_lm_head
        gathered = ops.take_along_axis(
            outputs, ops.expand_dims(inputs["mask_positions"], -1), axis=1
        )
        outputs = head._intermediate_layer_norm(head._intermediate_dense(gathered))
    logits = task(inputs)
    return (
        to_numpy(outputs).astype(np.float64),
        matrix.astype(np.float64),
        to_numpy(logits).astype(np.float64),
    )


def build_family(family: Family, seed: int = 0):
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = getattr(keras_hub.models, family.backbone)(
        vocabulary_size=FAMILY_VOCABULARY,
        num_layers=1,
        hidden_dim=FAMILY_WIDTH,
        **family.arguments,
    )
    task = getattr(keras_hub.models, family.task)(backbone=backbone, preprocessor=None)
    return backbone, task


def fitted_scale(x: np.ndarray, y: np.ndarray) -> tuple:
    """The least-squares factor s of y = s x, and the largest residual relative to |y|."""
    scale = float(np.sum(x * y) / np.sum(x * x))
    return scale, float(np.max(np.abs(y - scale * x)) / np.max(np.abs(y)))


def measure_family(family: Family) -> dict:
    """What a tiny model of the family computes at its embedding end.

    - positions added: the same token at every position gives different first
      hidden states;
    - normalised: with the added position (and segment) tables zeroed, every
      first hidden state has mean 0 and variance 1 over its channels;
    - input scale: otherwise, the factor between the first hidden state and the
      looked-up rows;
    - tied: the task holds one (vocab, d) matrix, not two;
    - logit scale: the factor between the logits and `hidden @ matrix`;
    - soft cap: with the matrix multiplied by 1000 the largest logit, where the
      logits stay far below what an uncapped projection gives.
    """
    rng = np.random.default_rng(0)
    backbone, task = build_family(family)
    embedding_std = float(to_numpy(backbone.token_embedding.embeddings).std())
    inputs = family_inputs(backbone, rng)
    if family.task == "BertMaskedLM":
        inputs["mask_positions"] = np.array([[1, 3], [2, 5]], "int32")
    token_key = next(name for name in inputs if "token_ids" in name)
    constant = {**inputs, token_key: np.full_like(inputs[token_key], 5)}
    first = first_hidden_state(backbone, {name: constant[name] for name in backbone.input})
    positions_added = bool(np.abs(first[:, 1:] - first[:, :1]).max() > 1e-6)
    for layer in backbone.layers:
        if layer.name in ("position_embedding", "segment_embedding"):
            layer.set_weights([np.zeros_like(weight) for weight in layer.get_weights()])
    first = first_hidden_state(backbone, {name: inputs[name] for name in backbone.input})
    rows = to_numpy(backbone.token_embedding.embeddings).astype(np.float64)[inputs[token_key]]
    normalised = bool(
        np.allclose(first.mean(-1), 0, atol=1e-5) and np.allclose(first.var(-1), 1, atol=1e-2)
    )
    input_scale, input_residual = fitted_scale(rows, first)
    matrices = [
        weight
        for weight in task.weights
        if len(weight.shape) == 2 and FAMILY_VOCABULARY in tuple(weight.shape)
    ]
    hidden, matrix, logits = projection(task, backbone, inputs)
    logit_scale, logit_residual = fitted_scale(hidden @ matrix, logits)
    for weight in matrices:
        weight.assign(weight * 1000.0)
    hidden, matrix, logits = projection(task, backbone, inputs)
    uncapped = np.abs(logit_scale * hidden @ matrix).max()
    largest = float(np.abs(logits).max())
    return {
        "family": family.name,
        "positions_added": positions_added,
        "normalised": normalised,
        "input_scale": None if normalised else input_scale,
        "input_residual": None if normalised else input_residual,
        "width": FAMILY_WIDTH,
        "tied": len(matrices) == 1,
        "logit_scale": logit_scale,
        "logit_residual": logit_residual,
        "soft_cap": largest if largest < 0.5 * uncapped else None,
        "embedding_std": embedding_std,
    }


# --- 2. the conventions, trained through our layers ------------------------


@dataclass(frozen=True)
class Convention:
    """One embedding-end convention, as the arguments of our layers.

    `scale` is `ScaledEmbedding`'s; `init_std` the standard deviation of its
    normal initialiser ("d^-0.5", "vocab^-0.5" or a number); `tied` picks
    `TiedOutputDense` over a separate `Dense` (initialised like the embedding,
    as `ReversibleEmbedding(tie_weights=False)` does); `logit_scale`,
    `logit_soft_cap` and `use_bias` are `TiedOutputDense`'s; `layer_norm` adds
    a LayerNorm after the embedding and the position encoding are summed.
    """

    families: str
    scale: str | None
    init_std: str | float
    tied: bool
    truncated: bool = False
    logit_scale: str | None = None
    logit_soft_cap: float | None = None
    use_bias: bool = False
    layer_norm: bool = False

    def stddev(self, width: int, vocabulary: int) -> float:
        if self.init_std == "d^-0.5":
            return width**-0.5
        if self.init_std == "vocab^-0.5":  # VarianceScaling(fan_in) on a (vocab, d) matrix
            return vocabulary**-0.5
        return float(self.init_std)

    def settings(self) -> str:
        """The arguments of our layers that express the convention."""
        initialiser = "TruncatedNormal" if self.truncated else "RandomNormal"
        std = {"d^-0.5": "d ** -0.5", "vocab^-0.5": "vocab ** -0.5"}.get(
            self.init_std, self.init_std
        )
        embedding = f"`ScaledEmbedding(scale={self.scale!r}"
        embedding += (
            "`" if self.init_std == "d^-0.5" and self.scale else f", {initialiser}({std}))`"
        )
        if self.tied:
            options = [
                f"logit_scale={'d ** -0.5' if self.logit_scale else None}"
                if self.logit_scale
                else "",
                f"logit_soft_cap={self.logit_soft_cap}" if self.logit_soft_cap else "",
                "use_bias=True" if self.use_bias else "",
            ]
            output = f"`TiedOutputDense(embedding{''.join(', ' + o for o in options if o)})`"
        else:
            output = f"`Dense(vocab, use_bias=False, {initialiser}({std}))`"
        norm = ", LayerNorm after the sum" if self.layer_norm else ""
        return f"{embedding}{norm}, {output}"


CONVENTIONS = {
    "2017 Transformer (our defaults)": Convention(
        "Transformer, tensor2tensor, fairseq", "sqrt", "d^-0.5", True
    ),
    "GPT-2": Convention("GPT-2, Qwen 2", None, 0.01, True),
    "BERT": Convention("BERT", None, 0.02, True, truncated=True, use_bias=True, layer_norm=True),
    "T5": Convention("T5 (v1.0)", None, 1.0, True, truncated=True, logit_scale="d^-0.5"),
    "Gemma": Convention("Gemma, Gemma 3", "sqrt", "vocab^-0.5", True),
    "Gemma 2": Convention("Gemma 2", "sqrt", "vocab^-0.5", True, logit_soft_cap=30.0),
    "Llama": Convention("Llama, Mistral", None, 0.01, False),
}
WIDTHS = (64, 128, 256, 512)
SEEDS = (0, 1, 2, 3, 4)
TRAIN_STEPS = 200
BATCH_SIZE = 16
LEARNING_RATE = 3e-3
CHECKPOINTS = 8  # points on each loss curve
HELD_OUT_SEQUENCES = 512  # two predict batches of 256
QUICK = {"widths": (64, 128), "seeds": (0,), "steps": 16}


def task_config(width: int, steps: int) -> DemoConfig:
    """The demo task, shortened to fit about 140 runs on two cores.

    Sequences of 6 to 12 tokens, a quarter of them masked (more signal per
    sequence than the demo's 15%), one encoder layer with a feed-forward width of
    d, batches of 16 and the demo's schedule at a peak of 0.003 at every width.
    """
    config = DemoConfig(
        width=width,
        layers=1,
        heads=4,
        intermediate=width,
        min_length=6,
        max_length=12,
        mask_rate=0.25,
        held_out_sequences=HELD_OUT_SEQUENCES,
        epochs=1,
        batch_size=BATCH_SIZE,
        learning_rate=LEARNING_RATE,
    )
    return replace(config, train_sequences=steps * config.batch_size)


def build_convention(config: DemoConfig, convention: Convention):
    """A one-layer pre-LayerNorm encoder whose embedding end follows `convention`."""
    import keras_hub

    width, vocabulary = config.width, config.vocabulary
    std = convention.stddev(width, vocabulary)
    initialiser = (
        keras.initializers.TruncatedNormal(stddev=std)
        if convention.truncated
        else keras.initializers.RandomNormal(stddev=std)
    )
    embedding = ScaledEmbedding(
        vocabulary,
        width,
        scale=convention.scale,
        embeddings_initializer=initialiser,
        mask_zero=True,
        name="token_embedding",
    )
    token_ids = keras.Input(shape=(None,), dtype="int32")
    hidden = SinusoidalPositionEncoding()(embedding(token_ids))
    if convention.layer_norm:
        hidden = keras.layers.LayerNormalization(name="embedding_norm")(hidden)
    for index in range(config.layers):
        hidden = keras_hub.layers.TransformerEncoder(
            intermediate_dim=config.intermediate,
            num_heads=config.heads,
            normalize_first=True,
            name=f"encoder_{index}",
        )(hidden)
    hidden = keras.layers.LayerNormalization(name="final_norm")(hidden)
    if convention.tied:
        head = TiedOutputDense(
            embedding,
            use_bias=convention.use_bias,
            logit_scale=width**-0.5 if convention.logit_scale else None,
            logit_soft_cap=convention.logit_soft_cap,
            name="logits",
        )
    else:
        head = keras.layers.Dense(
            vocabulary, use_bias=False, kernel_initializer=initialiser, name="logits"
        )
    return keras.Model(token_ids, head(hidden))


def held_out(model, ids, labels, weights) -> dict:
    """Masked-token accuracy and mean cross-entropy on the held-out sequences."""
    logits = np.asarray(model.predict(ids, batch_size=256, verbose=0), dtype=np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probabilities = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    picked = np.take_along_axis(log_probabilities, labels[..., None], -1)[..., 0]
    masked = weights > 0
    return {
        "accuracy": float(((logits.argmax(-1) == labels) & masked).sum() / masked.sum()),
        "loss": float(-picked[masked].mean()),
        "logit_std": float(logits[masked].std()),
    }


def embedding_over_encoding(model) -> float:
    """RMS norm of the embedding output (scale included) over the counting tokens,
    divided by the encoding's norm sqrt(d / 2)."""
    embedding = model.get_layer("token_embedding")
    rows = to_numpy(embedding.embeddings)[FIRST_TOKEN:]
    return embedding.factor * rms_norm(rows) / math.sqrt(embedding.output_dim / 2)


def train_convention(name: str, width: int, seeds: tuple, steps: int) -> dict:
    """Every seed of one convention at one width, in this process (one compile)."""
    config = task_config(width, steps)
    convention = CONVENTIONS[name]
    held = make_task(config, config.held_out_sequences, 999)
    runs, model = [], None
    started = time.perf_counter()
    for seed in seeds:
        keras.utils.set_random_seed(seed)
        fresh = build_convention(config, convention)
        if model is None:
            model = fresh
            loss = keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction="mean_with_sample_weight"
            )
            compile_demo(model, config, steps, loss=loss)
            # Without XLA: on a shared 2-core machine its compile took longer than
            # the training of a small width.
            model.compile(optimizer=model.optimizer, loss=loss, jit_compile=False)
        else:  # compiling takes longer than training: restart the compiled model
            model.set_weights(fresh.get_weights())
            for variable in model.optimizer.variables:
                variable.assign(keras.ops.zeros_like(variable))
        initial = held_out(model, *held)
        initial_ratio = embedding_over_encoding(model)
        ids, labels, weights = make_task(config, config.train_sequences, 100 + seed)
        recorder = StepLosses()
        model.fit(
            ids,
            labels,
            sample_weight=weights,
            batch_size=config.batch_size,
            shuffle=False,
            verbose=0,
            callbacks=[recorder],
        )
        trained = held_out(model, *held)
        runs.append(
            {
                "seed": seed,
                "losses": np.reshape(recorder.losses, (CHECKPOINTS, -1)).mean(axis=1).tolist(),
                "initial_loss": initial["loss"],
                "initial_logit_std": initial["logit_std"],
                "initial_embedding_over_encoding": initial_ratio,
                "held_out_accuracy": trained["accuracy"],
                "held_out_loss": trained["loss"],
                "embedding_over_encoding": embedding_over_encoding(model),
            }
        )
    return {
        "convention": name,
        "width": width,
        "runs": runs,
        "seconds": round(time.perf_counter() - started, 1),
    }


def summary(runs: list) -> dict:
    def stats(key):
        values = [run[key] for run in runs]
        return {
            "mean": float(np.mean(values)),
            "min": float(np.min(values)),
            "max": float(np.max(values)),
        }

    return {
        key: stats(key)
        for key in (
            "held_out_accuracy",
            "held_out_loss",
            "initial_logit_std",
            "initial_embedding_over_encoding",
            "embedding_over_encoding",
        )
    }


def measure_training(widths: tuple, seeds: tuple, steps: int, workers: int) -> dict:
    jobs = [(name, width) for width in reversed(widths) for name in CONVENTIONS]
    cells = {}

    def record(cell: dict) -> None:
        cell.update(summary(cell["runs"]))
        cells[f"{cell['convention']} @ {cell['width']}"] = cell
        accuracy = cell["held_out_accuracy"]["mean"]
        print(
            f"  {cell['convention']}, d={cell['width']}: "
            f"accuracy {accuracy:.3f}, {cell['seconds']} s",
            flush=True,
        )

    if workers == 1:  # in this process: no second TensorFlow to start
        for name, width in jobs:
            record(train_convention(name, width, seeds, steps))
    else:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=context) as pool:
            futures = [
                pool.submit(train_convention, name, width, seeds, steps) for name, width in jobs
            ]
            for future in futures:
                record(future.result())
    cells = {
        f"{name} @ {width}": cells[f"{name} @ {width}"] for width in widths for name in CONVENTIONS
    }
    config = task_config(widths[0], steps)
    return {
        "config": {
            **{
                key: value
                for key, value in asdict(config).items()
                if key not in ("seed", "width", "intermediate", "train_sequences")
            },
            "intermediate": "2 d",
            "train_steps": steps,
            "checkpoints": CHECKPOINTS,
            "widths": list(widths),
            "seeds": list(seeds),
        },
        "conventions": {
            name: {**asdict(convention), "settings": convention.settings()}
            for name, convention in CONVENTIONS.items()
        },
        "steps": [steps // CHECKPOINTS * (index + 1) for index in range(CHECKPOINTS)],
        "cells": cells,
    }


# --- figures ---------------------------------------------------------------


def save(figure, folder: Path, name: str) -> str:
    figure.savefig(folder / name, dpi=90, bbox_inches="tight")
    plt.close(figure)
    return f"figures/{name}"


def by_convention(training: dict, key: str) -> dict:
    """{convention: (widths, means, mins, maxs)} of one summarised measurement."""
    curves = {}
    for name in training["conventions"]:
        cells = [cell for cell in training["cells"].values() if cell["convention"] == name]
        cells.sort(key=lambda cell: cell["width"])
        curves[name] = tuple(
            np.array(values)
            for values in zip(
                *[
                    (cell["width"], cell[key]["mean"], cell[key]["min"], cell[key]["max"])
                    for cell in cells
                ],
                strict=True,
            )
        )
    return curves


def plot_accuracy(training: dict, folder: Path) -> str:
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for offset, (name, (widths, mean, low, high)) in enumerate(
        by_convention(training, "held_out_accuracy").items()
    ):
        shifted = widths * 1.03 ** (offset - 3)  # side by side, so the bars do not hide each other
        axes.errorbar(
            shifted, mean, yerr=[mean - low, high - mean], marker="o", capsize=3, label=name
        )
    widths = training["config"]["widths"]
    axes.set(
        xscale="log",
        xlabel="d_model",
        ylabel="held-out masked-token accuracy",
        title=f"Mean and min-max of {len(training['config']['seeds'])} seeds, "
        f"{training['config']['train_steps']} steps",
    )
    axes.set_xticks(widths, [str(width) for width in widths])
    axes.legend(fontsize=7)
    axes.grid(True, which="both", alpha=0.3)
    return save(figure, folder, "conventions_accuracy.png")


def plot_initial(training: dict, folder: Path) -> str:
    figure, (logits, ratio) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, (widths, mean, _, _) in by_convention(training, "initial_logit_std").items():
        logits.plot(widths, mean, "o-", label=name)
    for name, (widths, mean, _, _) in by_convention(
        training, "initial_embedding_over_encoding"
    ).items():
        ratio.plot(widths, mean, "o-", label=name)
    widths = training["config"]["widths"]
    logits.set(
        xscale="log", yscale="log", xlabel="d_model", ylabel="std of the logits at initialisation"
    )
    ratio.set(
        xscale="log",
        yscale="log",
        xlabel="d_model",
        ylabel="embedding norm / encoding norm at initialisation",
    )
    for axis in (logits, ratio):
        axis.set_xticks(widths, [str(width) for width in widths])
        axis.grid(True, which="both", alpha=0.3)
    ratio.legend(fontsize=7)
    return save(figure, folder, "conventions_initial.png")


def plot_training(training: dict, folder: Path) -> str:
    widths = (training["config"]["widths"][0], training["config"]["widths"][-1])
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for axis, width in zip(axes, widths, strict=True):
        for name in training["conventions"]:
            cell = training["cells"][f"{name} @ {width}"]
            curves = np.array([run["losses"] for run in cell["runs"]])
            (line,) = axis.plot(training["steps"], curves.mean(0), label=name)
            axis.fill_between(
                training["steps"], curves.min(0), curves.max(0), color=line.get_color(), alpha=0.15
            )
        axis.set(yscale="log", xlabel="training step", title=f"d_model = {width}")
        axis.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("loss per masked token (fresh data)")
    axes[1].legend(fontsize=7)
    return save(figure, folder, "conventions_training.png")


# --- tables ----------------------------------------------------------------


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def families_table(rows: list) -> str:
    cells = []
    for row in rows:
        if row["normalised"]:
            input_scale = "LayerNorm of the sum"
        else:
            input_scale = f"{row['input_scale']:.2f} ({row['declared_input_scale']})"
        cells.append(
            [
                row["family"],
                input_scale,
                _yes(row["tied"]),
                f"{row['logit_scale']:.2f} ({row['declared_logit_scale']})",
                "none" if row["soft_cap"] is None else f"{row['soft_cap']:.1f}",
                row["positions"],
                f"{row['embedding_std']:.3f}: {row['initialiser']}",
                ", ".join(row["citations"]),
            ]
        )
    return markdown_table(
        [
            "family",
            "input scale, d=16",
            "tied",
            "logit scale, d=16",
            "logit soft cap",
            "position",
            "embedding std at init, vocab 97",
            "where (keras-hub 0.32.0)",
        ],
        [False, True, False, True, True, False, False, False],
        cells,
    )


def settings_table(training: dict) -> str:
    return markdown_table(
        ["convention", "families", "our layers"],
        [False, False, False],
        [
            [name, convention["families"], convention["settings"]]
            for name, convention in training["conventions"].items()
        ],
    )


def _range(stats: dict, digits: int) -> str:
    return f"{stats['mean']:.{digits}f} ({stats['min']:.{digits}f}-{stats['max']:.{digits}f})"


def by_width_table(training: dict, render) -> str:
    widths = training["config"]["widths"]
    return markdown_table(
        ["convention", *[f"d={width}" for width in widths]],
        [False, *[True] * len(widths)],
        [
            [name, *[render(training["cells"][f"{name} @ {width}"]) for width in widths]]
            for name in training["conventions"]
        ],
    )


def markdown_tables(results: dict) -> dict:
    """The page's tables, rendered from the JSON the script wrote."""
    training = results["training"]
    return {
        "families": families_table(results["families"]),
        "settings": settings_table(training),
        "accuracy": by_width_table(training, lambda cell: _range(cell["held_out_accuracy"], 3)),
        "loss": by_width_table(training, lambda cell: _range(cell["held_out_loss"], 2)),
        "initial": by_width_table(
            training,
            lambda cell: (
                f"{cell['initial_logit_std']['mean']:.2f} / "
                f"{cell['initial_embedding_over_encoding']['mean']:.3g}"
            ),
        ),
        "ratio": by_width_table(
            training,
            lambda cell: (
                f"{cell['initial_embedding_over_encoding']['mean']:.3g} -> "
                f"{cell['embedding_over_encoding']['mean']:.3g}"
            ),
        ),
    }


# --- the command -------------------------------------------------------------


def measure_families() -> list:
    rows = []
    for family in FAMILIES:
        row = measure_family(family)
        row.update(
            {
                "declared_input_scale": family.input_scale,
                "declared_logit_scale": family.logit_scale,
                "positions": family.positions,
                "initialiser": family.initialiser,
                "citations": [citation.label() for citation in family.citations],
            }
        )
        rows.append(row)
    return rows


def write_page(tables: dict) -> None:
    """Rewrite the marked tables of the page; name any table it has no markers for."""
    text = PAGE.read_text()
    missing = [name for name in tables if name not in page_tables(text)]
    if missing:
        print(f"{PAGE.name} has no markers for {', '.join(missing)}", file=sys.stderr)
    PAGE.write_text(rewrite(text, tables))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 widths, 16 steps")
    parser.add_argument("--out", type=Path, help="folder for the JSON and figures (--quick)")
    parser.add_argument("--workers", type=int, default=2, help="training processes (default 2)")
    parser.add_argument(
        "--tables", action="store_true", help="measure nothing: rewrite the page from the JSON"
    )
    args = parser.parse_args(argv)
    if args.tables:
        results = json.loads(RESULTS.read_text())
        write_page(markdown_tables(results))
        return results
    if args.quick and args.out is None:
        parser.error("--quick needs --out: its numbers must not replace the page's")
    folder = args.out or FIGURES
    folder.mkdir(parents=True, exist_ok=True)
    widths, seeds, steps = (
        (QUICK["widths"], QUICK["seeds"], QUICK["steps"])
        if args.quick
        else (WIDTHS, SEEDS, TRAIN_STEPS)
    )
    import keras_hub

    seconds = {}
    began = time.perf_counter()
    families = measure_families()
    seconds["families"] = round(time.perf_counter() - began, 1)
    began = time.perf_counter()
    training = measure_training(widths, seeds, steps, args.workers)
    seconds["training"] = round(time.perf_counter() - began, 1)
    command = "python docs/experiments/conventions.py" + (" --quick" if args.quick else "")
    results = {
        "command": command,
        "threads": {"processes": args.workers, "intra_op": 1, "inter_op": 1},
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "keras_hub": keras_hub.__version__,
        },
        "families": families,
        "training": training,
    }
    results["figures"] = {
        "accuracy": plot_accuracy(training, folder),
        "initial": plot_initial(training, folder),
        "training": plot_training(training, folder),
    }
    seconds["total"] = round(time.perf_counter() - STARTED, 1)
    results["seconds"] = seconds
    path = folder / RESULTS.name
    path.write_text(json.dumps(results, indent=1) + "\n")
    tables = markdown_tables(results)
    if args.out is None:
        write_page(tables)
    for name, text in tables.items():
        print(f"\n<!-- table: {name} -->\n{text}\n<!-- /table -->")
    print(f"\nwrote {path} in {seconds['total']} s")
    return results


if __name__ == "__main__":
    main()
