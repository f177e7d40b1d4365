"""keras.io "Video Classification with Transformers" (Sayak Paul), adapted.

Float frame features in, declared `keras.Input(shape=(None, None))`: neither
the number of frames nor the feature width is fixed in the model, though the
position table is 1024 wide (here 32). Its `PositionalEmbedding` computes a
mask of its own over all-zero (padding) frames (`compute_mask`), which the
`TransformerEncoder` passes to attention; the padding frames are zeros, as
the example's `prepare_all_videos` writes them.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

from tests.conformance import synthetic

SOURCE = "https://keras.io/examples/vision/video_transformers/"
NOTES = (
    "MAX_SEQ_LENGTH 8, NUM_FEATURES 32, 5 classes (the example: 20, 1024, 5); trained 2 "
    "steps on random frame features with zero padding frames instead of DenseNet "
    "features of UCF101. `compute_mask` in keras.ops (Keras 3 calls it on symbolic "
    "tensors, which tf.reduce_any cannot take), the same computation."
)

MAX_SEQ_LENGTH = 8
NUM_FEATURES = 32
CLASSES = 5


@keras.saving.register_keras_serializable("conformance.video_transformer")
class PositionalEmbedding(layers.Layer):
    def __init__(self, sequence_length, output_dim, **kwargs):
        super().__init__(**kwargs)
        self.position_embeddings = layers.Embedding(
            input_dim=sequence_length, output_dim=output_dim
        )
        self.sequence_length = sequence_length
        self.output_dim = output_dim

    def call(self, inputs):
        # The inputs are of shape: `(batch_size, frames, num_features)`
        length = tf.shape(inputs)[1]
        positions = tf.range(start=0, limit=length, delta=1)
        embedded_positions = self.position_embeddings(positions)
        return inputs + embedded_positions

    def compute_mask(self, inputs, mask=None):
        mask = keras.ops.any(keras.ops.cast(inputs, "bool"), axis=-1)
        return mask

    def get_config(self):
        return {
            **super().get_config(),
            "sequence_length": self.sequence_length,
            "output_dim": self.output_dim,
        }


@keras.saving.register_keras_serializable("conformance.video_transformer")
class TransformerEncoder(layers.Layer):
    def __init__(self, embed_dim, dense_dim, num_heads, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim = embed_dim
        self.dense_dim = dense_dim
        self.num_heads = num_heads
        self.attention = layers.MultiHeadAttention(
            num_heads=num_heads, key_dim=embed_dim, dropout=0.3
        )
        self.dense_proj = keras.Sequential(
            [layers.Dense(dense_dim, activation=tf.nn.gelu), layers.Dense(embed_dim)]
        )
        self.layernorm_1 = layers.LayerNormalization()
        self.layernorm_2 = layers.LayerNormalization()

    def call(self, inputs, mask=None):
        if mask is not None:
            mask = mask[:, tf.newaxis, :]

        attention_output = self.attention(inputs, inputs, attention_mask=mask)
        proj_input = self.layernorm_1(inputs + attention_output)
        proj_output = self.dense_proj(proj_input)
        return self.layernorm_2(proj_input + proj_output)

    def get_config(self):
        return {
            **super().get_config(),
            "embed_dim": self.embed_dim,
            "dense_dim": self.dense_dim,
            "num_heads": self.num_heads,
        }


def get_compiled_model():
    sequence_length = MAX_SEQ_LENGTH
    embed_dim = NUM_FEATURES
    dense_dim = 4
    num_heads = 1

    inputs = keras.Input(shape=(None, None))
    x = PositionalEmbedding(sequence_length, embed_dim, name="frame_position_embedding")(inputs)
    x = TransformerEncoder(embed_dim, dense_dim, num_heads, name="transformer_layer")(x)
    x = layers.GlobalMaxPooling1D()(x)
    x = layers.Dropout(0.5)(x)
    outputs = layers.Dense(CLASSES, activation="softmax")(x)
    model = keras.Model(inputs, outputs)

    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def training_data():
    """(x, y): 32 videos of random frame features, some frames zero (padding), and labels."""
    data = synthetic.rng()
    frames = synthetic.features(data, (32, MAX_SEQ_LENGTH, NUM_FEATURES))
    lengths = data.integers(1, MAX_SEQ_LENGTH + 1, size=32)
    frames[np.arange(MAX_SEQ_LENGTH)[None, :] >= lengths[:, None]] = 0.0
    return frames, synthetic.labels(data, 32, CLASSES)


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = get_compiled_model()
    x_train, y_train = training_data()
    synthetic.train(model, x_train, y_train, batch_size=16)
    return model
