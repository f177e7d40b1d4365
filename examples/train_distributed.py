"""Train the demo encoder on one device or several, then save it.

    python examples/train_distributed.py --strategy mirrored --steps 8 --out m.keras

Strategies (every one trains on the same global batches from the same start):

| strategy             | backend    | how the global batch is split                    |
|----------------------|------------|--------------------------------------------------|
| `tf-single`          | TensorFlow | not split: one device, the reference             |
| `mirrored`           | TensorFlow | `MirroredStrategy`, 2 logical CPU devices        |
| `multi-worker`       | TensorFlow | `MultiWorkerMirroredStrategy`, 2 worker          |
|                      |            | processes on 127.0.0.1 (`TF_CONFIG`), started    |
|                      |            | and stopped by this script                       |
| `jax-single`         | JAX        | not split: one device, the reference             |
| `jax-data-parallel`  | JAX        | `keras.distribution.DataParallel`, 2 host devices|
| `jax-model-parallel` | JAX        | `keras.distribution.ModelParallel`: batch over   |
|                      |            | nothing, the embedding's vocabulary axis over 2  |
|                      |            | devices (`LayoutMap`)                            |

The script picks the backend itself (`KERAS_BACKEND`) and, for JAX, asks XLA for
2 host devices (`XLA_FLAGS=--xla_force_host_platform_device_count=2`). Each step
is one `fit` call on one global batch, so the strategy splits it the way it
splits any dataset. Prints one JSON line: the loss of each global batch before
its step (and of the first batch after the last step), whether the
tied matrix is still one variable, how it is placed, and where the model was
saved; `NAME.probe.npz` beside the model holds the logits of the first batch
before and after training. The saved model exports like any other
(`python export/to_onnx.py`).
"""

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BACKENDS = {
    "tf-single": "tensorflow",
    "mirrored": "tensorflow",
    "multi-worker": "tensorflow",
    "jax-single": "jax",
    "jax-data-parallel": "jax",
    "jax-model-parallel": "jax",
}
DEVICES = 2
WORKER_TIMEOUT_S = 600


def _parse(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--strategy", choices=sorted(BACKENDS), default="mirrored")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="global batch size")
    parser.add_argument("--out", type=Path, required=True, help="where to save the .keras file")
    parser.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: give at least 1")
    if args.batch_size < DEVICES or args.batch_size % DEVICES:
        parser.error(
            f"--batch-size {args.batch_size}: give a multiple of {DEVICES}, so every "
            "device gets an equal share of the global batch"
        )
    if args.out.suffix != ".keras":
        parser.error(f"--out {args.out}: give a path ending in .keras")
    return args


def _select_backend(strategy: str) -> None:
    """Set the backend (and JAX's host devices) before Keras is imported."""
    backend = BACKENDS[strategy]
    chosen = os.environ.get("KERAS_BACKEND", backend)
    if chosen != backend:
        sys.exit(
            f"error: --strategy {strategy} runs on {backend}, but KERAS_BACKEND={chosen}; "
            "unset KERAS_BACKEND or pick a strategy for that backend"
        )
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if backend == "jax":
        flag = f"--xla_force_host_platform_device_count={DEVICES}"
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()


def _tf_strategy(name: str):
    import tensorflow as tf

    if name == "multi-worker":
        # Reads TF_CONFIG; must exist before any other TensorFlow op runs.
        return tf.distribute.MultiWorkerMirroredStrategy()
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * DEVICES
    )
    if name == "mirrored":
        return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(DEVICES)])
    return tf.distribute.OneDeviceStrategy("/cpu:0")


def _jax_distribution(name: str):
    import keras

    if name == "jax-single":
        return None
    devices = keras.distribution.list_devices("cpu")
    if len(devices) < DEVICES:
        sys.exit(f"error: JAX sees {len(devices)} CPU device(s), needs {DEVICES}; check XLA_FLAGS")
    devices = devices[:DEVICES]
    if name == "jax-data-parallel":
        return keras.distribution.DataParallel(devices=devices)
    mesh = keras.distribution.DeviceMesh((1, DEVICES), ["batch", "model"], devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    # Rows of the tied matrix (the vocabulary axis) split over the devices; the
    # lookup and the output projection both read this one sharded variable.
    layout_map["token_embedding/embeddings"] = ("model", None)
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")


def _custom_loop_step(model, strategy, loss_fn, global_batch: int):
    """One training step on one global batch, split over the workers by hand.

    `model.fit` fails under `MultiWorkerMirroredStrategy` in Keras 3 (its
    symbolic build reduces the first distributed batch eagerly:
    keras-team/keras#20585), so this is the custom loop tf.distribute documents:
    worker `i` takes rows `[i*n, (i+1)*n)` of every global batch, computes its
    gradient, and the optimizer sums the workers' gradients.
    """
    import tensorflow as tf

    with strategy.scope():
        model.optimizer.build(model.trainable_variables)
    share = global_batch // strategy.num_replicas_in_sync

    @tf.function
    def replica_step(x, y, w):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True), sample_weight=w)
        gradients = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply(gradients, model.trainable_variables)

    def step(x, y, w):
        def shard(context):
            start = context.input_pipeline_id * share
            rows = [t[start : start + share] for t in (x, y, w)]
            return tf.data.Dataset.from_tensors(tuple(rows))

        batch = next(iter(strategy.distribute_datasets_from_function(shard)))
        strategy.run(replica_step, args=batch)

    return step


def _placement(variable) -> str:
    """How the variable's value is placed: a JAX sharding, or its TF type."""
    value = variable.value
    sharding = getattr(value, "sharding", None)  # JAX arrays
    if sharding is None:
        return type(value).__name__
    if hasattr(sharding, "spec"):
        return f"{type(sharding).__name__}{tuple(sharding.spec)}"
    return type(sharding).__name__


def token_loss():
    """Masked-token cross-entropy averaged over every token of the global batch.

    Keras' default reduction divides each replica's loss by that replica's
    count of unmasked (non-padding) tokens. Replicas hold different amounts of
    padding, so their tokens would be weighted unlike one device's (measured:
    losses 3e-4 apart after 8 steps). Dividing by the token count of the global
    batch instead makes the sum of the replicas' gradients the one-device
    gradient, up to summation order.
    """
    import keras

    class TokenLoss(keras.losses.Loss):
        def __init__(self):
            super().__init__(reduction="sum", name="token_loss")

        def call(self, y_true, y_pred):
            per_token = keras.losses.sparse_categorical_crossentropy(
                y_true, y_pred, from_logits=True
            )
            # Every replica's share has the same size, and tf.distribute sums
            # the replicas' gradients (Keras scales only its mean reductions).
            count = keras.ops.size(per_token) * _replicas_in_sync()
            return per_token / keras.ops.cast(count, per_token.dtype)

    return TokenLoss()


def _replicas_in_sync() -> int:
    """Replicas that each hold one share of the global batch (tf.distribute)."""
    import keras

    if keras.backend.backend() != "tensorflow":
        return 1  # JAX computes the loss of the whole (sharded) batch at once
    import tensorflow as tf

    return tf.distribute.get_strategy().num_replicas_in_sync


def probe_path(model_path: Path) -> Path:
    """Logits of the first global batch before and after training (.npz)."""
    return model_path.with_name(f"{model_path.stem}.probe.npz")


def train(args) -> dict:
    """Build, train `args.steps` steps and save; returns the JSON summary."""
    import contextlib

    import keras
    import numpy as np

    from keras_layers.demo.task import DemoConfig, build_model, make_task

    config = DemoConfig()
    ids, labels, weights = make_task(config, args.steps * args.batch_size, seed=0)
    strategy, scope = None, contextlib.nullcontext()
    if BACKENDS[args.strategy] == "tensorflow":
        strategy = _tf_strategy(args.strategy)
        scope = strategy.scope()
    else:
        distribution = _jax_distribution(args.strategy)
        if distribution is not None:
            keras.distribution.set_distribution(distribution)
    with scope:
        keras.utils.set_random_seed(0)
        model = build_model(config)
        model.compile(
            optimizer=keras.optimizers.SGD(0.05),
            loss=token_loss(),
        )
    probe = ids[: args.batch_size]
    initial_logits = keras.ops.convert_to_numpy(model(probe))
    loss_fn = token_loss()

    def global_loss(batch):
        # The loss of the whole global batch, computed the same way for every
        # strategy: the loss `fit` reports is the first replica's share only.
        return float(loss_fn(labels[batch], model(ids[batch]), sample_weight=weights[batch]))

    if args.strategy == "multi-worker":
        fit_step = _custom_loop_step(model, strategy, loss_fn, args.batch_size)
    else:

        def fit_step(x, y, w):
            model.fit(x, y, sample_weight=w, batch_size=len(x), epochs=1, shuffle=False, verbose=0)

    losses = []
    for step in range(args.steps):
        batch = slice(step * args.batch_size, (step + 1) * args.batch_size)
        losses.append(global_loss(batch))
        fit_step(ids[batch], labels[batch], weights[batch])
    losses.append(global_loss(slice(0, args.batch_size)))
    embedding = model.get_layer("token_embedding")
    head = model.get_layer("logits")
    matrices = [v for v in model.weights if v.path.endswith("embeddings")]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    model.save(args.out)
    final_logits = keras.ops.convert_to_numpy(model(probe))
    np.savez(probe_path(args.out), token_ids=probe, initial=initial_logits, final=final_logits)
    return {
        "strategy": args.strategy,
        "backend": keras.backend.backend(),
        "replicas": strategy.num_replicas_in_sync if strategy else _jax_replicas(),
        "losses": losses,
        "tied": head.embedding is embedding and len(matrices) == 1,
        "embedding_placement": _placement(embedding.embeddings),
        "saved": str(args.out),
    }


def _jax_replicas() -> int:
    import keras

    distribution = keras.distribution.distribution()
    if distribution is None:
        return 1
    return distribution.device_mesh.shape[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_workers(args) -> dict:
    """Start the multi-worker processes, wait for them, stop them on failure.

    Worker 0 (the chief) saves to `--out`; worker 1 saves to a scratch folder
    that is removed, as `MultiWorkerMirroredStrategy` needs every worker to save.
    """
    ports = [_free_port() for _ in range(DEVICES)]
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    scratch = Path(tempfile.mkdtemp(prefix="multi_worker_"))
    workers = []
    try:
        for index in range(DEVICES):
            out = args.out if index == 0 else scratch / f"worker{index}.keras"
            env = {
                **os.environ,
                "TF_CONFIG": json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": index}}
                ),
            }
            command = [
                sys.executable,
                __file__,
                "--strategy",
                "multi-worker",
                "--steps",
                str(args.steps),
                "--batch-size",
                str(args.batch_size),
                "--out",
                str(out),
                "--worker-index",
                str(index),
            ]
            workers.append(
                subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            )
        results = [worker.communicate(timeout=WORKER_TIMEOUT_S) for worker in workers]
    except subprocess.TimeoutExpired:
        sys.exit(f"error: the {DEVICES} workers did not finish in {WORKER_TIMEOUT_S} s; stopped")
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    for index, (worker, (_, stderr)) in enumerate(zip(workers, results, strict=True)):
        if worker.returncode != 0:
            tail = stderr.decode(errors="replace").strip().splitlines()[-5:]
            sys.exit(f"error: worker {index} exited {worker.returncode}: " + " | ".join(tail))
    chief = json.loads(results[0][0].decode().strip().splitlines()[-1])
    other = json.loads(results[1][0].decode().strip().splitlines()[-1])
    chief["workers_agree"] = chief["losses"] == other["losses"]
    return chief


def main(argv=None):
    args = _parse(argv)
    _select_backend(args.strategy)
    if args.strategy == "multi-worker" and args.worker_index is None:
        summary = launch_workers(args)
    else:
        summary = train(args)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
