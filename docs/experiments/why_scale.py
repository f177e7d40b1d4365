"""Regenerate every figure and table of docs/why-scale.md.

    python docs/experiments/why_scale.py

Why is the token embedding multiplied by sqrt(d_model) before the position
encoding is added? This script measures the three things the answer depends on:

1. magnitudes: the norm of an embedding vector, unscaled and scaled, beside the
   norm of the sinusoidal encoding, for several widths and initialisers;
2. the tied output: how large the logits `h E^T` are at initialisation, with and
   without sharing the embedding matrix;
3. training: the demo counting task (keras_layers/demo/task.py) with the scale and the tie
   switched on and off, three seeds each.

It also draws the encoding itself. Figures go to docs/figures/*.png and every
number to docs/figures/why_scale.json; the markdown tables of the page are
printed at the end, rendered from that JSON by `markdown_tables`.

Seeds are fixed. TensorFlow runs on one thread (the machine is shared, and one
thread makes the runtime comparable between machines), which budgets the whole
script at a few minutes.
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

import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
from dataclasses import asdict, replace  # noqa: E402
from pathlib import Path  # noqa: E402

import keras  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing the package

from keras_layers import (  # noqa: E402
    ScaledEmbedding,
    SinusoidalPositionEncoding,
    TiedOutputDense,
)
from keras_layers.demo.task import (  # noqa: E402
    FIRST_TOKEN,
    DemoConfig,
    build_model,
    make_task,
    masked_accuracy,
)
from keras_layers.demo.task import compile_for_training as compile_demo  # noqa: E402
from keras_layers.sinusoidal_position_encoding import channel_frequencies  # noqa: E402

FIGURES = ROOT / "docs" / "figures"
RESULTS = FIGURES / "why_scale.json"

WIDTHS = (64, 128, 256, 512, 1024)
VOCABULARY = 30522  # BERT's vocabulary: the size glorot_uniform's limit depends on
KERAS_UNIFORM_LIMIT = 0.05  # keras.layers.Embedding's default "uniform" initializer
INITIALISERS = ("uniform", "normal", "glorot_uniform")
INITIALISER_LABELS = {
    "uniform": "Keras default uniform(-0.05, 0.05)",
    "normal": "normal(0, d^-0.5)",
    "glorot_uniform": f"glorot_uniform (vocab {VOCABULARY})",
}
MEASURED_POSITIONS = 512
LOGIT_ROWS = 128  # hidden vectors per logit measurement: 128 x 30522 logits each

# --- analytic expectations -------------------------------------------------


def uniform_variance(limit: float) -> float:
    """Variance of uniform(-limit, limit): limit^2 / 3."""
    return limit**2 / 3.0


def glorot_uniform_variance(fan_in: int, fan_out: int) -> float:
    """Variance of glorot_uniform: limit sqrt(6 / (fan_in + fan_out)), so 2 / (fan_in + fan_out)."""
    return uniform_variance(math.sqrt(6.0 / (fan_in + fan_out)))


def initialiser_variance(name: str, width: int, vocabulary: int = VOCABULARY) -> float:
    """Variance of one component of a (vocabulary, width) embedding matrix at initialisation."""
    if name == "uniform":
        return uniform_variance(KERAS_UNIFORM_LIMIT)
    if name == "normal":
        return 1.0 / width
    if name == "glorot_uniform":
        return glorot_uniform_variance(vocabulary, width)
    raise ValueError(f"unknown initialiser {name!r}")


def expected_norm(width: int, variance: float, factor: float = 1.0) -> float:
    """Root-mean-square L2 norm of a width-d vector of i.i.d. components, times `factor`."""
    return factor * math.sqrt(width * variance)


def position_encoding_norm(width: int) -> float:
    """Norm of every sinusoidal encoding vector of even width: sqrt(d / 2).

    Each sine/cosine pair contributes sin^2 + cos^2 = 1, and there are d / 2 pairs.
    """
    return math.sqrt(width / 2.0)


def expected_logit_std(hidden_square_norm: float, weight_variance: float) -> float:
    """Std of `h . w` over random output rows w with i.i.d. components: sqrt(|h|^2 var(w))."""
    return math.sqrt(hidden_square_norm * weight_variance)


def to_numpy(tensor) -> np.ndarray:
    """A layer output or a weight as a NumPy array."""
    return keras.ops.convert_to_numpy(getattr(tensor, "value", tensor))


def rms_norm(vectors) -> float:
    """Root mean square of the L2 norms of the vectors along the last axis."""
    vectors = np.asarray(vectors, dtype=np.float64)
    return float(np.sqrt(np.mean(np.sum(vectors**2, axis=-1))))


# --- 1. magnitudes ---------------------------------------------------------


def keras_initializer(name: str, width: int):
    if name == "normal":
        return keras.initializers.RandomNormal(stddev=width**-0.5, seed=width)
    if name == "uniform":
        limit = KERAS_UNIFORM_LIMIT
        return keras.initializers.RandomUniform(-limit, limit, seed=width)
    return keras.initializers.GlorotUniform(seed=width)


def position_encoding(positions: int, width: int, **options) -> np.ndarray:
    """The encoding itself: SinusoidalPositionEncoding added to zeros, (positions, width)."""
    zeros = np.zeros((1, positions, width), "float32")
    return to_numpy(SinusoidalPositionEncoding(**options)(zeros))[0]


def measure_magnitudes() -> list:
    rows = []
    every_token = np.arange(VOCABULARY)
    for width in WIDTHS:
        encoding = position_encoding(MEASURED_POSITIONS, width)
        encoding_norms = np.linalg.norm(encoding.astype(np.float64), axis=-1)
        for name in INITIALISERS:
            embedding = ScaledEmbedding(
                VOCABULARY, width, embeddings_initializer=keras_initializer(name, width)
            )
            scaled = to_numpy(embedding(every_token))
            variance = initialiser_variance(name, width)
            rows.append(
                {
                    "width": width,
                    "initialiser": name,
                    "unscaled_measured": rms_norm(to_numpy(embedding.embeddings)),
                    "unscaled_expected": expected_norm(width, variance),
                    "scaled_measured": rms_norm(scaled),
                    "scaled_expected": expected_norm(width, variance, math.sqrt(width)),
                    "encoding_measured": rms_norm(encoding),
                    "encoding_min": float(encoding_norms.min()),
                    "encoding_max": float(encoding_norms.max()),
                    "encoding_expected": position_encoding_norm(width),
                }
            )
    return rows


# --- 2. logits of the tied output at initialisation ------------------------


def measure_logits() -> list:
    rows = []
    rng = np.random.default_rng(0)
    for width in WIDTHS:
        tokens = rng.integers(0, VOCABULARY, size=(1, LOGIT_ROWS))
        unit_hidden = rng.standard_normal((1, LOGIT_ROWS, width)).astype("float32")
        # What an untied output gets by default: Dense's glorot_uniform kernel.
        untied = keras.layers.Dense(
            VOCABULARY, kernel_initializer=keras.initializers.GlorotUniform(seed=width)
        )
        for name in INITIALISERS:
            embedding = ScaledEmbedding(
                VOCABULARY, width, embeddings_initializer=keras_initializer(name, width)
            )
            tied = TiedOutputDense(embedding)
            embedded = to_numpy(SinusoidalPositionEncoding()(embedding(tokens)))
            variance = initialiser_variance(name, width)
            # The embedding and the encoding are independent: their squared norms add.
            embedded_square_norm = (
                expected_norm(width, variance, math.sqrt(width)) ** 2
                + position_encoding_norm(width) ** 2
            )
            for hidden_name, hidden, square_norm in (
                ("embedded", embedded, embedded_square_norm),
                ("unit", unit_hidden, float(width)),
            ):
                for tie_name, head, weight_variance in (
                    ("tied", tied, variance),
                    ("untied", untied, glorot_uniform_variance(width, VOCABULARY)),
                ):
                    logits = to_numpy(head(hidden)).astype(np.float64)
                    rows.append(
                        {
                            "width": width,
                            "initialiser": name,
                            "hidden": hidden_name,
                            "output": tie_name,
                            "logit_std_measured": float(logits.std()),
                            "logit_std_expected": expected_logit_std(square_norm, weight_variance),
                        }
                    )
    return rows


# --- 3. training on the demo counting task ---------------------------------

# Each variant: whether the embedding is multiplied by sqrt(d), whether the output
# projection is the embedding matrix (tied) or a separate Dense (glorot_uniform,
# Keras' default), and the standard deviation of the embedding's normal
# initialiser: d^-0.5 (ScaledEmbedding's default, what suits a tied output) or 1.
VARIANTS = {
    "scaled+tied": {"scaled": True, "tied": True, "init_std": "d^-0.5"},
    "unscaled+tied": {"scaled": False, "tied": True, "init_std": "d^-0.5"},
    "scaled+untied": {"scaled": True, "tied": False, "init_std": "d^-0.5"},
    "unscaled+untied": {"scaled": False, "tied": False, "init_std": "d^-0.5"},
    "unscaled+tied, init N(0,1)": {"scaled": False, "tied": True, "init_std": "1"},
}
SEEDS = (0, 1, 2)
TRAIN_STEPS = 256
BATCH_SIZE = 64  # half the demo's 128: more steps for the same time
CHECKPOINTS = 16  # points on each loss curve
HELD_OUT_SEQUENCES = 1024  # four predict batches of 256: one compiled shape


def training_config():
    config = DemoConfig(held_out_sequences=HELD_OUT_SEQUENCES, epochs=1, batch_size=BATCH_SIZE)
    return replace(config, train_sequences=TRAIN_STEPS * config.batch_size)


def initial_scales(config, scaled: bool, tied: bool, init_std: str) -> dict:
    """What a variant starts from, analytically.

    The norm of its embedding output over the norm of the encoding, and the std
    of its logits for unit-variance hidden states (what the final LayerNorm
    hands the output layer).
    """
    width = config.width
    variance = {"d^-0.5": 1.0 / width, "1": 1.0}[init_std]
    factor = math.sqrt(width) if scaled else 1.0
    output_variance = variance if tied else glorot_uniform_variance(width, config.vocabulary)
    return {
        "embedding_over_encoding": expected_norm(width, variance, factor)
        / position_encoding_norm(width),
        "logit_std": expected_logit_std(width, output_variance),
    }


def build_variant(config, scaled: bool, tied: bool, init_std: str):
    """The demo model (keras_layers/demo/task.py) with the embedding end and the output swapped."""
    demo = build_model(config)  # only its encoder layers and final norm are reused
    body = [layer for layer in demo.layers if layer.name.startswith("encoder_")]
    body.append(demo.get_layer("final_norm"))
    stddev = {"d^-0.5": config.width**-0.5, "1": 1.0}[init_std]
    embedding = ScaledEmbedding(
        config.vocabulary,
        config.width,
        scale="sqrt" if scaled else None,
        embeddings_initializer=keras.initializers.RandomNormal(stddev=stddev),
        mask_zero=True,
    )
    token_ids = keras.Input(shape=(None,), dtype="int32")
    hidden = SinusoidalPositionEncoding()(embedding(token_ids))
    for layer in body:
        hidden = layer(hidden)
    head = TiedOutputDense(embedding) if tied else keras.layers.Dense(config.vocabulary)
    return keras.Model(token_ids, head(hidden))


def compile_for_training(model, config) -> None:
    # The demo's schedule and optimizer; the loss is the mean over the masked
    # tokens only, so the curve is a per-token loss.
    compile_demo(
        model,
        config,
        TRAIN_STEPS,
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="mean_with_sample_weight"
        ),
    )


def restart(model, fresh) -> None:
    """Give a compiled model the weights of `fresh` and a new optimizer state.

    Compiling takes longer than training here, so each variant is compiled once
    and every seed restarts the same compiled model.
    """
    model.set_weights(fresh.get_weights())
    for variable in model.optimizer.variables:
        variable.assign(keras.ops.zeros_like(variable))


class StepLosses(keras.callbacks.Callback):
    """Collects the loss of every training step.

    Keras reports a running mean over the epoch; with equal batches the loss of
    step k is k * mean_k - (k - 1) * mean_(k-1).
    """

    def on_train_begin(self, logs=None):
        self.losses, self.mean = [], 0.0

    def on_train_batch_end(self, batch, logs=None):
        mean = float(logs["loss"])
        self.losses.append((batch + 1) * mean - batch * self.mean)
        self.mean = mean


def trained_embedding_norm(model) -> float:
    """RMS norm of the embedding output (scale included) over the counting tokens."""
    embedding = next(layer for layer in model.layers if isinstance(layer, ScaledEmbedding))
    rows = to_numpy(embedding.embeddings)[FIRST_TOKEN:]
    return embedding.factor * rms_norm(rows)


def train_variant(config, options: dict, held_out) -> list:
    runs = []
    model = None
    for seed in SEEDS:
        keras.utils.set_random_seed(seed)
        fresh = build_variant(config, **options)
        if model is None:
            model = fresh
            compile_for_training(model, config)
        else:
            restart(model, fresh)
        ids, labels, weights = make_task(config, config.train_sequences, 100 + seed)
        start = time.perf_counter()
        recorder = StepLosses()
        # One pass over fresh sequences: every step's loss is measured on a batch
        # the model has not seen yet, so the curve is an out-of-sample loss.
        model.fit(
            ids,
            labels,
            sample_weight=weights,
            batch_size=config.batch_size,
            shuffle=False,
            verbose=0,
            callbacks=[recorder],
        )
        per_point = np.reshape(recorder.losses, (CHECKPOINTS, -1)).mean(axis=1)
        runs.append(
            {
                "seed": seed,
                "losses": per_point.tolist(),
                "held_out_accuracy": masked_accuracy(model, *held_out),
                "embedding_over_encoding": trained_embedding_norm(model)
                / position_encoding_norm(config.width),
                "seconds": time.perf_counter() - start,
            }
        )
    return runs


def measure_training() -> dict:
    config = training_config()
    held_out = make_task(config, config.held_out_sequences, 999)
    variants = {}
    for name, options in VARIANTS.items():
        start = time.perf_counter()
        runs = train_variant(config, options, held_out)
        accuracy = [run["held_out_accuracy"] for run in runs]
        variants[name] = {
            **options,
            **initial_scales(config, **options),
            "runs": runs,
            "accuracy_mean": float(np.mean(accuracy)),
            "accuracy_min": float(np.min(accuracy)),
            "accuracy_max": float(np.max(accuracy)),
            "final_loss_mean": float(np.mean([run["losses"][-1] for run in runs])),
            "trained_embedding_over_encoding_mean": float(
                np.mean([run["embedding_over_encoding"] for run in runs])
            ),
            "seconds": time.perf_counter() - start,
        }
        print(f"  {name}: accuracy {accuracy}, {variants[name]['seconds']:.0f} s", flush=True)
    steps_per_point = TRAIN_STEPS // CHECKPOINTS
    return {
        # The demo's own `seed` is unused: each run takes its seed from SEEDS.
        "config": {
            **{key: value for key, value in asdict(config).items() if key != "seed"},
            "train_steps": TRAIN_STEPS,
            "seeds": list(SEEDS),
        },
        "steps": [steps_per_point * (index + 1) for index in range(CHECKPOINTS)],
        "variants": variants,
    }


# --- figures ---------------------------------------------------------------


def save(figure, name: str) -> str:
    path = FIGURES / name
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    return f"figures/{name}"


def plot_magnitudes(rows: list) -> str:
    figure, axes = plt.subplots(figsize=(7, 4.5))
    colours = dict(zip(INITIALISERS, ("tab:blue", "tab:orange", "tab:green"), strict=True))
    for name in INITIALISERS:
        mine = [row for row in rows if row["initialiser"] == name]
        widths = [row["width"] for row in mine]
        for kind, style in (("scaled", "-"), ("unscaled", "--")):
            axes.plot(
                widths,
                [row[f"{kind}_expected"] for row in mine],
                style,
                color=colours[name],
                label=f"{INITIALISER_LABELS[name]}, {kind}",
            )
            axes.plot(widths, [row[f"{kind}_measured"] for row in mine], "o", color=colours[name])
    encoding = [row for row in rows if row["initialiser"] == INITIALISERS[0]]
    axes.plot(
        [row["width"] for row in encoding],
        [row["encoding_measured"] for row in encoding],
        "k-s",
        linewidth=2,
        label="sinusoidal encoding, sqrt(d/2)",
    )
    axes.set(
        xscale="log",
        yscale="log",
        xlabel="d_model",
        ylabel="RMS of the vector norm",
        title="Embedding vs position encoding: lines analytic, markers measured",
    )
    axes.set_xticks(WIDTHS, [str(width) for width in WIDTHS])
    axes.legend(fontsize=7, loc="upper left")
    axes.grid(True, which="both", alpha=0.3)
    return save(figure, "why_scale_magnitudes.png")


def plot_training(training: dict) -> str:
    figure, axes = plt.subplots(figsize=(7, 4.5))
    steps = training["steps"]
    for name, variant in training["variants"].items():
        curves = np.array([run["losses"] for run in variant["runs"]])
        (line,) = axes.plot(steps, curves.mean(0), label=name)
        axes.fill_between(steps, curves.min(0), curves.max(0), color=line.get_color(), alpha=0.2)
    axes.set(
        yscale="log",
        xlabel="training step",
        ylabel="loss per masked token (fresh data)",
        title=f"Demo counting task: mean and min-max of {len(SEEDS)} seeds",
    )
    axes.legend(fontsize=8)
    axes.grid(True, which="both", alpha=0.3)
    return save(figure, "why_scale_training.png")


def plot_layouts() -> str:
    figure, axes = plt.subplots(1, 2, figsize=(9, 4), sharey=True)
    for axis, layout in zip(axes, ("interleave", "concat"), strict=True):
        image = axis.imshow(
            position_encoding(128, 64, layout=layout),
            aspect="auto",
            cmap="RdBu",
            vmin=-1,
            vmax=1,
            interpolation="nearest",
        )
        axis.set(title=f'layout="{layout}"', xlabel="channel")
    axes[0].set_ylabel("position")
    figure.colorbar(image, ax=axes, shrink=0.8)
    return save(figure, "why_scale_layouts.png")


def spacing_wavelengths(width: int = 64) -> dict:
    """Wavelength (positions per cycle) of each sine/cosine pair, for both spacings."""
    wavelengths = {}
    for spacing in ("paper", "tensor2tensor"):
        omega, _ = channel_frequencies(width, 10000.0, "concat", spacing)
        wavelengths[spacing] = (2 * math.pi / omega[: width // 2]).tolist()
    return wavelengths


def plot_spacings(wavelengths: dict) -> str:
    figure, (axes, ratio) = plt.subplots(1, 2, figsize=(10, 4))
    for spacing, marker in (("paper", "o"), ("tensor2tensor", "x")):
        axes.plot(wavelengths[spacing], marker, label=f'spacing="{spacing}"')
    axes.axhline(2 * math.pi * 10000, color="grey", linestyle=":", label="2 pi x 10000")
    axes.set(
        yscale="log",
        xlabel="pair index k (d = 64)",
        ylabel="wavelength in positions",
        title="Wavelength of each sine/cosine pair",
    )
    axes.legend()
    ratio.plot(np.divide(wavelengths["tensor2tensor"], wavelengths["paper"]), "k.-")
    ratio.set(
        xlabel="pair index k (d = 64)",
        ylabel="tensor2tensor / paper",
        title="tensor2tensor's wavelengths are longer",
    )
    for axis in (axes, ratio):
        axis.grid(True, which="both", alpha=0.3)
    return save(figure, "why_scale_spacings.png")


# --- tables ----------------------------------------------------------------


def table(header: list, rows: list) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_tables(results: dict) -> dict:
    """The page's tables, rendered from the JSON the script wrote."""
    magnitudes = table(
        [
            "d_model",
            "initialiser",
            "unscaled: measured (expected)",
            "x sqrt(d): measured (expected)",
            "encoding: measured (sqrt(d/2))",
            "x sqrt(d) / encoding",
        ],
        [
            [
                row["width"],
                INITIALISER_LABELS[row["initialiser"]],
                f"{row['unscaled_measured']:.3f} ({row['unscaled_expected']:.3f})",
                f"{row['scaled_measured']:.2f} ({row['scaled_expected']:.2f})",
                f"{row['encoding_measured']:.3f} ({row['encoding_expected']:.3f})",
                f"{row['scaled_measured'] / row['encoding_measured']:.2f}",
            ]
            for row in results["magnitudes"]
        ],
    )
    logits = {}
    for row in results["logits"]:
        key = (row["initialiser"], row["hidden"])
        logits.setdefault(key, {})[(row["width"], row["output"])] = row
    hidden_labels = {"unit": "unit-variance h", "embedded": "h = x sqrt(d) embedding + PE"}
    logit_rows = []
    for (name, hidden), cells in logits.items():
        logit_rows.append(
            [INITIALISER_LABELS[name], hidden_labels[hidden]]
            + [
                f"{cells[(width, output)]['logit_std_measured']:.3f} "
                f"({cells[(width, output)]['logit_std_expected']:.3f})"
                for output in ("tied", "untied")
                for width in (64, 512)
            ]
        )
    logit_table = table(
        ["embedding init", "hidden states"]
        + [f"{output}, d={width}" for output in ("tied", "untied") for width in (64, 512)],
        logit_rows,
    )
    training = results["training"]["variants"]
    training_table = table(
        [
            "variant",
            "at init: embedding / encoding norm",
            "at init: logit std",
            "trained: embedding / encoding norm",
            "held-out masked accuracy: mean",
            "min",
            "max",
            "final loss (mean)",
        ],
        [
            [
                name,
                f"{variant['embedding_over_encoding']:.2f}",
                f"{variant['logit_std']:.2f}",
                f"{variant['trained_embedding_over_encoding_mean']:.2f}",
                f"{variant['accuracy_mean']:.3f}",
                f"{variant['accuracy_min']:.3f}",
                f"{variant['accuracy_max']:.3f}",
                f"{variant['final_loss_mean']:.3f}",
            ]
            for name, variant in training.items()
        ],
    )
    return {"magnitudes": magnitudes, "logits": logit_table, "training": training_table}


# --- the command -------------------------------------------------------------


def main() -> dict:
    FIGURES.mkdir(parents=True, exist_ok=True)
    seconds = {}

    def timed(name, function, *args):
        began = time.perf_counter()
        value = function(*args)
        seconds[name] = round(time.perf_counter() - began, 1)
        print(f"{name}: {seconds[name]} s", flush=True)
        return value

    results = {
        "command": "python docs/experiments/why_scale.py",
        "threads": {"intra_op": 1, "inter_op": 1},
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
        },
        "setup": {
            "widths": list(WIDTHS),
            "vocabulary": VOCABULARY,
            "encoding_positions": MEASURED_POSITIONS,
            "logit_rows": LOGIT_ROWS,
        },
        "magnitudes": timed("magnitudes", measure_magnitudes),
        "logits": timed("logits", measure_logits),
        "spacing_wavelengths_d64": spacing_wavelengths(),
        "training": timed("training", measure_training),
    }
    results["figures"] = {
        "magnitudes": plot_magnitudes(results["magnitudes"]),
        "training": plot_training(results["training"]),
        "layouts": plot_layouts(),
        "spacings": plot_spacings(results["spacing_wavelengths_d64"]),
    }
    seconds["total"] = round(time.perf_counter() - STARTED, 1)
    results["seconds"] = seconds
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    for name, text in markdown_tables(results).items():
        print(f"\n<!-- table: {name} -->\n{text}")
    print(f"\nwrote {RESULTS.relative_to(ROOT)} in {seconds['total']} s")
    return results


if __name__ == "__main__":
    main()
