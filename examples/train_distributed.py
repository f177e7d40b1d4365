"""Train the demo encoder with a tf.distribute strategy, then save it.

    python examples/train_distributed.py --strategy mirrored --steps 20 --out m.keras

`--strategy mirrored` splits every global batch over 2 logical CPU devices
(tf.distribute.MirroredStrategy); `--strategy single` trains on one device, for
comparison. Prints one JSON line: the loss after each step, the number of
distinct embedding variables, and where the model was saved. The tied matrix is
one (mirrored) variable, so the saved model exports like any other.
"""

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--strategy", choices=["mirrored", "single"], default="mirrored")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="global batch size")
    parser.add_argument("--out", type=Path, required=True, help="where to save the .keras file")
    args = parser.parse_args(argv)

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras

    from export.demo import DemoConfig, build_model, make_task

    config = DemoConfig()
    ids, labels, weights = make_task(config, args.steps * args.batch_size, seed=0)
    if args.strategy == "mirrored":
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    else:
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = build_model(config)
        model.compile(
            optimizer=keras.optimizers.SGD(0.05),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    history = []
    for step in range(args.steps):
        batch = slice(step * args.batch_size, (step + 1) * args.batch_size)
        loss = model.train_on_batch(ids[batch], labels[batch], sample_weight=weights[batch])
        history.append(float(loss))
    embedding = model.get_layer("token_embedding")
    head = model.get_layer("logits")
    tied = head.embedding is embedding and head.embedding.embeddings is embedding.embeddings
    args.out.parent.mkdir(parents=True, exist_ok=True)
    model.save(args.out)
    print(
        json.dumps(
            {
                "strategy": args.strategy,
                "losses": history,
                "tied": tied,
                "replicas": strategy.num_replicas_in_sync,
                "saved": str(args.out),
            }
        )
    )


if __name__ == "__main__":
    main()
