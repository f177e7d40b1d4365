"""The encoder of TensorFlow's "Neural machine translation with a Transformer and Keras", adapted.

The tutorial's own layers: `positional_encoding` (a NumPy sine/cosine table of
2048 positions), `PositionalEmbedding` (`Embedding(mask_zero=True)` scaled by
sqrt(d_model) plus that table, delegating `compute_mask` to the embedding),
`BaseAttention` / `GlobalSelfAttention` (MultiHeadAttention with dropout, an
`Add` layer and `LayerNormalization`, which carry the padding mask from layer to
layer), `FeedForward`, `EncoderLayer` and `Encoder`. TensorFlow ops stay as
the tutorial writes them. `tf_transformer` builds the full encoder-decoder on
these classes.
"""

import keras
import numpy as np
import tensorflow as tf

from tests.conformance import synthetic

SOURCE = "https://www.tensorflow.org/text/tutorials/transformer"
NOTES = (
    "tf.keras.layers is keras.layers; every layer takes **kwargs, stores its arguments "
    "and gains get_config, and BaseAttention takes num_heads/key_dim/dropout by name "
    "instead of passing **kwargs on to MultiHeadAttention, so the model round-trips "
    "through a .keras file. The encoder alone is a functional model over token ids, "
    "trained 2 steps with Adam and MSE to random targets (the tutorial trains it "
    "only inside the full Transformer); 2 layers, d_model 32, 2 heads, vocabulary 400."
)

_PACKAGE = "conformance.tf_transformer"


def positional_encoding(length, depth):
    depth = depth / 2

    positions = np.arange(length)[:, np.newaxis]  # (seq, 1)
    depths = np.arange(depth)[np.newaxis, :] / depth  # (1, depth)

    angle_rates = 1 / (10000**depths)  # (1, depth)
    angle_rads = positions * angle_rates  # (pos, depth)

    pos_encoding = np.concatenate([np.sin(angle_rads), np.cos(angle_rads)], axis=-1)

    return tf.cast(pos_encoding, dtype=tf.float32)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class PositionalEmbedding(keras.layers.Layer):
    def __init__(self, vocab_size, d_model, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.embedding = keras.layers.Embedding(vocab_size, d_model, mask_zero=True)
        self.pos_encoding = positional_encoding(length=2048, depth=d_model)

    def compute_mask(self, *args, **kwargs):
        return self.embedding.compute_mask(*args, **kwargs)

    def call(self, x):
        length = tf.shape(x)[1]
        x = self.embedding(x)
        # The embedding is scaled up so that the position table does not drown it.
        x *= tf.math.sqrt(tf.cast(self.d_model, tf.float32))
        x = x + self.pos_encoding[tf.newaxis, :length, :]
        return x

    def get_config(self):
        config = super().get_config()
        config.update({"vocab_size": self.vocab_size, "d_model": self.d_model})
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class BaseAttention(keras.layers.Layer):
    def __init__(self, *, num_heads, key_dim, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.dropout = dropout
        self.mha = keras.layers.MultiHeadAttention(
            num_heads=num_heads, key_dim=key_dim, dropout=dropout
        )
        self.layernorm = keras.layers.LayerNormalization()
        self.add = keras.layers.Add()

    def get_config(self):
        config = super().get_config()
        config.update(
            {"num_heads": self.num_heads, "key_dim": self.key_dim, "dropout": self.dropout}
        )
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class GlobalSelfAttention(BaseAttention):
    def call(self, x):
        attn_output = self.mha(query=x, value=x, key=x)
        x = self.add([x, attn_output])
        x = self.layernorm(x)
        return x


@keras.saving.register_keras_serializable(package=_PACKAGE)
class FeedForward(keras.layers.Layer):
    def __init__(self, d_model, dff, dropout_rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.dff = dff
        self.dropout_rate = dropout_rate
        self.seq = keras.Sequential(
            [
                keras.layers.Dense(dff, activation="relu"),
                keras.layers.Dense(d_model),
                keras.layers.Dropout(dropout_rate),
            ]
        )
        self.add = keras.layers.Add()
        self.layer_norm = keras.layers.LayerNormalization()

    def call(self, x):
        x = self.add([x, self.seq(x)])
        x = self.layer_norm(x)
        return x

    def get_config(self):
        config = super().get_config()
        config.update({"d_model": self.d_model, "dff": self.dff, "dropout_rate": self.dropout_rate})
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class EncoderLayer(keras.layers.Layer):
    def __init__(self, *, d_model, num_heads, dff, dropout_rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.num_heads = num_heads
        self.dff = dff
        self.dropout_rate = dropout_rate
        self.self_attention = GlobalSelfAttention(
            num_heads=num_heads, key_dim=d_model, dropout=dropout_rate
        )
        self.ffn = FeedForward(d_model, dff)

    def call(self, x):
        x = self.self_attention(x)
        x = self.ffn(x)
        return x

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "d_model": self.d_model,
                "num_heads": self.num_heads,
                "dff": self.dff,
                "dropout_rate": self.dropout_rate,
            }
        )
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class Encoder(keras.layers.Layer):
    def __init__(
        self, *, num_layers, d_model, num_heads, dff, vocab_size, dropout_rate=0.1, **kwargs
    ):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.dff = dff
        self.vocab_size = vocab_size
        self.dropout_rate = dropout_rate

        self.pos_embedding = PositionalEmbedding(vocab_size=vocab_size, d_model=d_model)

        self.enc_layers = [
            EncoderLayer(d_model=d_model, num_heads=num_heads, dff=dff, dropout_rate=dropout_rate)
            for _ in range(num_layers)
        ]
        self.dropout = keras.layers.Dropout(dropout_rate)

    def call(self, x):
        # `x` is token-IDs shape: (batch, seq_len)
        x = self.pos_embedding(x)  # Shape `(batch_size, seq_len, d_model)`.

        # Add dropout.
        x = self.dropout(x)

        for i in range(self.num_layers):
            x = self.enc_layers[i](x)

        return x  # Shape `(batch_size, seq_len, d_model)`.

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_layers": self.num_layers,
                "d_model": self.d_model,
                "num_heads": self.num_heads,
                "dff": self.dff,
                "vocab_size": self.vocab_size,
                "dropout_rate": self.dropout_rate,
            }
        )
        return config


# Tiny sizes shared with tf_transformer.
NUM_LAYERS = 2
D_MODEL = 32
DFF = 64
NUM_HEADS = 2
DROPOUT_RATE = 0.1
INPUT_VOCAB_SIZE = 400


def training_data():
    """(x, y) of two batches: right-padded ids and random targets for the MSE."""
    data = synthetic.rng()
    return (
        synthetic.token_ids(data, 32, 64, INPUT_VOCAB_SIZE),
        synthetic.features(data, (32, 64, D_MODEL)),
    )


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    context = keras.Input(shape=(None,), dtype="int64", name="context")
    encoder = Encoder(
        num_layers=NUM_LAYERS,
        d_model=D_MODEL,
        num_heads=NUM_HEADS,
        dff=DFF,
        vocab_size=INPUT_VOCAB_SIZE,
        dropout_rate=DROPOUT_RATE,
    )
    model = keras.Model(context, encoder(context))
    model.compile(optimizer="adam", loss="mse")
    x_train, y_train = training_data()
    synthetic.train(model, x_train, y_train, batch_size=16)
    return model
