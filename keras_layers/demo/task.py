"""The demo task: the small tied encoder (`build_encoder`) trained in a minute.

The task is generated in code, so nothing is downloaded. Each sequence counts up
from a random token (`a, a+1, a+2, ...`, wrapping around the vocabulary) and 15%
of its tokens are replaced by a `[MASK]` id. To fill a gap the model must read the
identity of the neighbouring tokens *and* know which neighbour comes before and
which after: a bag of tokens cannot say where each missing value goes, so the
position encoding is needed. Sequences have random lengths and are right-padded
with id 0, which exercises the padding mask.
"""

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from keras_layers.demo.encoder import EncoderConfig, build_encoder

PAD, MASK, FIRST_TOKEN = 0, 1, 2


@dataclass
class DemoConfig:
    vocabulary: int = 128
    width: int = 64
    layers: int = 2
    heads: int = 4
    intermediate: int = 128
    min_length: int = 8
    max_length: int = 32
    mask_rate: float = 0.15
    train_sequences: int = 16_000
    held_out_sequences: int = 2_000
    epochs: int = 5
    batch_size: int = 128
    learning_rate: float = 5e-3
    seed: int = 0

    def encoder(self) -> EncoderConfig:
        """The model part of the config, for `build_encoder`."""
        return EncoderConfig(
            vocabulary=self.vocabulary,
            width=self.width,
            layers=self.layers,
            heads=self.heads,
            intermediate=self.intermediate,
            normalize_first=True,
            final_norm=True,
            name="demo_encoder",
        )


def make_task(config: DemoConfig, count: int, seed: int):
    """Counting sequences with masked tokens.

    Args:
        config: the task's vocabulary, lengths and mask rate.
        count: how many sequences.
        seed: the generator's seed.

    Returns:
        `(ids, labels, weights)`: the masked input ids, the full sequences
        (padding `PAD`), and 1.0 at the masked tokens the loss counts.
    """
    rng = np.random.default_rng(seed)
    cycle = config.vocabulary - FIRST_TOKEN
    shape = (count, config.max_length)
    lengths = rng.integers(config.min_length, config.max_length + 1, size=count)
    starts = rng.integers(0, cycle, size=count)
    labels = FIRST_TOKEN + (starts[:, None] + np.arange(config.max_length)) % cycle
    valid = np.arange(config.max_length)[None, :] < lengths[:, None]
    masked = (rng.random(shape) < config.mask_rate) & valid
    # At least one masked token per sequence, so every row counts.
    first = rng.integers(0, lengths)
    masked[np.arange(count), first] = True
    labels = np.where(valid, labels, PAD).astype("int32")
    ids = np.where(masked, MASK, labels).astype("int32")
    return ids, labels, masked.astype("float32")


def build_model(config: DemoConfig):
    """The demo's encoder: pre-LayerNorm blocks and a final norm (see `build_encoder`)."""
    return build_encoder(config.encoder())


def compile_for_training(model, config: DemoConfig, steps: int, loss=None) -> None:
    """Adam with the demo's schedule, compiled with XLA.

    Warm up for a tenth of `steps`, then cosine decay to zero: a fixed budget of
    steps ends at a minimum.

    Args:
        model: the model to compile.
        config: the peak learning rate.
        steps: the optimizer steps of the whole training.
        loss: the loss (default sparse cross-entropy on logits).
    """
    import keras

    schedule = keras.optimizers.schedules.CosineDecay(
        0.0,
        decay_steps=steps - steps // 10,
        warmup_target=config.learning_rate,
        warmup_steps=steps // 10,
    )
    model.compile(
        optimizer=keras.optimizers.Adam(schedule),
        loss=loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )


def masked_accuracy(model, ids, labels, weights) -> float:
    """How often the model predicts the masked tokens.

    Args:
        model: the trained model (logits over the vocabulary).
        ids: the masked input ids (`make_task`).
        labels: the tokens to predict.
        weights: 1.0 at the masked tokens.

    Returns:
        The share of masked tokens whose top-1 prediction is the label.
    """
    predictions = np.asarray(model.predict(ids, batch_size=256, verbose=0)).argmax(-1)
    hits = (predictions == labels) & (weights > 0)
    return float(hits.sum() / weights.sum())


def train(
    path: Path,
    config: DemoConfig | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> dict:
    """Train the demo, save it to `path` and its metrics beside it; return them.

    Args:
        path: the `.keras` file to write (its folder is created).
        config: the task and model (default `DemoConfig()`).
        on_step: called as `on_step(done, total)` after each optimizer step.

    Returns:
        The metrics also written to `metrics_path(path)`: held-out masked-token
        accuracy, training seconds and the config.
    """
    import keras

    class StepCallback(keras.callbacks.Callback):
        done = 0

        def on_train_batch_end(self, batch, logs=None):
            self.done += 1
            on_step(self.done, steps)

    start = time.perf_counter()  # the whole of it, as the command's "train" stage shows it
    config = config or DemoConfig()
    keras.utils.set_random_seed(config.seed)
    ids, labels, weights = make_task(config, config.train_sequences, config.seed)
    held = make_task(config, config.held_out_sequences, config.seed + 1)
    model = build_model(config)
    steps = config.epochs * -(-config.train_sequences // config.batch_size)
    compile_for_training(model, config, steps)
    model.fit(
        ids,
        labels,
        sample_weight=weights,
        batch_size=config.batch_size,
        epochs=config.epochs,
        verbose=0,
        callbacks=[StepCallback()] if on_step else [],
    )
    accuracy = masked_accuracy(model, *held)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    metrics = {
        "masked_token_accuracy": accuracy,
        "held_out_sequences": config.held_out_sequences,
        # Data, model, fit, held-out accuracy and save: the span the command
        # prints for its "train" stage, which takes this figure.
        "train_seconds": round(time.perf_counter() - start, 1),
        "config": asdict(config),
    }
    metrics_path(path).write_text(json.dumps(metrics, indent=2))
    return metrics


def metrics_path(model_path: Path) -> Path:
    return model_path.with_suffix(".metrics.json")


def saved_metrics(model_path: Path) -> dict | None:
    path = metrics_path(model_path)
    if model_path.exists() and path.exists():
        return json.loads(path.read_text())
    return None


def int8_evaluation(
    model_path: Path, keras_accuracy: float, max_drop: float = 0.01, min_top1: float = 0.995
):
    """The quantized demo's task-level check, on the held-out sequences: top-1
    agreement with Keras at every real token at least `min_top1`, and
    masked-token accuracy within `max_drop` of the Keras model's.

    Args:
        model_path: the trained demo (its metrics file beside it).
        keras_accuracy: the Keras model's held-out masked-token accuracy.
        max_drop: how much lower the int8 file's accuracy may be.
        min_top1: the least top-1 agreement with Keras.

    Returns:
        `evaluate(onnx_path) -> dict` with `passed` and a `summary`, as
        `export_model(..., evaluate=...)` takes it.
    """

    def evaluate(onnx_path) -> dict:
        import keras
        import onnxruntime as ort

        config = DemoConfig(**json.loads(metrics_path(model_path).read_text())["config"])
        ids, labels, weights = make_task(config, config.held_out_sequences, config.seed + 1)
        session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
        predictions = session.run(None, {"token_ids": ids})[0].argmax(-1)
        model = keras.saving.load_model(model_path, compile=False)
        reference = np.asarray(model.predict(ids, batch_size=256, verbose=0)).argmax(-1)
        top1 = float((predictions == reference)[ids != PAD].mean())
        accuracy = float(((predictions == labels) & (weights > 0)).sum() / weights.sum())
        passed = top1 >= min_top1 and keras_accuracy - accuracy <= max_drop
        return {
            "passed": passed,
            "top1_agreement": top1,
            "min_top1": min_top1,
            "masked_token_accuracy": accuracy,
            "keras_masked_token_accuracy": keras_accuracy,
            "summary": (
                f"on held-out data top-1 agreement {top1:.2%} (>= {min_top1:.1%}), "
                f"masked-token accuracy {accuracy:.2%} vs Keras {keras_accuracy:.2%}"
            ),
        }

    return evaluate
