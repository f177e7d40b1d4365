"""keras.io "Text classification with Transformer" (Apoorv Nandan), adapted.

A `TransformerBlock` layer (self-attention without a mask, two
`LayerNormalization(epsilon=1e-6)`, a ReLU feed-forward `Sequential`) over a
`TokenAndPositionEmbedding` layer of two `Embedding`s, mean-pooled into a
two-class softmax. The input is `layers.Input(shape=(maxlen,))` as the example
writes it: fixed length, float32 by default, cast to ids by `Embedding`.
"""

import keras
from keras import layers, ops

from tests.conformance import synthetic

SOURCE = "https://keras.io/examples/nlp/text_classification_with_transformer/"
NOTES = (
    "Both layers take **kwargs, store their arguments and gain get_config, and are "
    "registered, so the model round-trips through a .keras file (the original has "
    "neither); vocabulary 500, maxlen 64, trained 2 steps on random ids."
)

_PACKAGE = "conformance.text_classification_transformer"


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.ff_dim = ff_dim
        self.rate = rate
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential(
            [layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)]
        )
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output)
        return self.layernorm2(out1 + ffn_output)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "embed_dim": self.embed_dim,
                "num_heads": self.num_heads,
                "ff_dim": self.ff_dim,
                "rate": self.rate,
            }
        )
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.maxlen = maxlen
        self.vocab_size = vocab_size
        self.embed_dim = embed_dim
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = ops.shape(x)[-1]
        positions = ops.arange(start=0, stop=maxlen, step=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions

    def get_config(self):
        config = super().get_config()
        config.update(
            {"maxlen": self.maxlen, "vocab_size": self.vocab_size, "embed_dim": self.embed_dim}
        )
        return config


vocab_size = 500
maxlen = 64
embed_dim = 32
num_heads = 2
ff_dim = 32


def training_data():
    """(x, y) of two batches: right-padded ids (the example pads at the front) and labels."""
    data = synthetic.rng()
    return synthetic.token_ids(data, 32, maxlen, vocab_size), synthetic.labels(data, 32, 2)


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = layers.Input(shape=(maxlen,))
    embedding_layer = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)
    x = embedding_layer(inputs)
    transformer_block = TransformerBlock(embed_dim, num_heads, ff_dim)
    x = transformer_block(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dropout(0.1)(x)
    x = layers.Dense(20, activation="relu")(x)
    x = layers.Dropout(0.1)(x)
    outputs = layers.Dense(2, activation="softmax")(x)
    model = keras.Model(inputs=inputs, outputs=outputs)

    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x_train, y_train = training_data()
    synthetic.train(model, x_train, y_train, batch_size=16)
    return model
