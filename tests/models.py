"""Small models the export tests build and save."""

import re

import keras
import numpy as np

from keras_layers import ScaledEmbedding, SinusoidalPositionEncoding, TiedOutputDense
from keras_layers.demo import EncoderConfig, build_encoder

VOCAB, WIDTH = 300, 32


def tied_encoder(layers=2, name="tied_encoder"):
    """keras-hub TransformerEncoder stack between our embedding layers."""
    return build_encoder(EncoderConfig(VOCAB, WIDTH, layers=layers, name=name), seed=7)


def dict_model():
    """Dict inputs (keras-hub backbone style) and dict outputs."""
    keras.utils.set_random_seed(8)
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    segment_ids = keras.Input((None,), dtype="int32", name="segment_ids")
    padding_mask = keras.Input((None,), dtype="int32", name="padding_mask")
    embedding = ScaledEmbedding(VOCAB, WIDTH, name="embedding")
    segments = keras.layers.Embedding(2, WIDTH, name="segment_embedding")
    x = embedding(token_ids) + segments(segment_ids)
    x = SinusoidalPositionEncoding()(x)
    mask = keras.ops.cast(padding_mask, "float32")[..., None]
    hidden = keras.layers.Dense(WIDTH, activation="gelu", name="mix")(x) * mask
    pooled = keras.layers.GlobalAveragePooling1D(name="pooled")(hidden)
    logits = TiedOutputDense(embedding, name="logits")(hidden)
    return keras.Model(
        {
            "token_ids": token_ids,
            "segment_ids": segment_ids,
            "padding_mask": padding_mask,
        },
        {"sequence_logits": logits, "pooled": pooled},
    )


def sequential_model():
    keras.utils.set_random_seed(9)
    return keras.Sequential(
        [
            keras.Input((None,), dtype="int32"),
            ScaledEmbedding(VOCAB, WIDTH),
            SinusoidalPositionEncoding(),
            keras.layers.Dense(3),
        ]
    )


def lambda_model():
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(10, 4)(ids)
    return keras.Model(ids, keras.layers.Lambda(lambda t: t * 2.0)(x))


def save(model, path):
    model.save(path)
    return path


def sample_ids(batch=2, length=5):
    return np.random.default_rng(0).integers(1, VOCAB, size=(batch, length)).astype("int32")


def _comparable_path(variable) -> str:
    """A variable's path without Keras' process-wide numbering (`dense_3`,
    `seed_generator_14`): two loads in one process number their layers apart."""
    return re.sub(r"_\d+(?=/|$)", "", variable.path)


def assert_same_variables(got, expected):
    """Same variables in the same order, dtypes and values; a dropout seed
    is not saved (every load draws its own), so its value is not compared."""
    assert [_comparable_path(v) for v in got.variables] == [
        _comparable_path(v) for v in expected.variables
    ]
    for mine, theirs in zip(got.variables, expected.variables, strict=True):
        assert mine.dtype == theirs.dtype, mine.path
        if "seed_generator" not in mine.path:
            np.testing.assert_array_equal(mine.numpy(), theirs.numpy(), err_msg=mine.path)


def redrawn(model, seed: int = 0):
    """Every weight drawn anew (keras-hub's initialisers make BatchNorm an
    identity, which hides a lost scale); variances kept positive."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        if "variance" in weight.path:
            weight.assign(rng.uniform(0.5, 1.5, weight.shape))
        else:
            weight.assign(rng.normal(0, 0.2, weight.shape))
    return model


def tiny_resnet_classifier(filters=(64, 16)):
    """A keras-hub ResNet classifier at free image sides, weights redrawn;
    `filters`: its two stacks' widths."""
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64],
        input_conv_kernel_sizes=[7],
        stackwise_num_filters=list(filters),
        stackwise_num_blocks=[1, 1],
        stackwise_num_strides=[1, 2],
        block_type="bottleneck_block",
        use_pre_activation=False,
        image_shape=(None, None, 3),
    )
    return redrawn(keras_hub.models.ResNetImageClassifier(backbone, num_classes=5))
