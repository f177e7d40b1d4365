"""keras.io "Named Entity Recognition using Transformers" (Varun Singh), adapted.

A subclassed `keras.Model`, `NERModel`, tagging every token: the example's
own `TokenAndPositionEmbedding` (TensorFlow ops, no padding mask) and
`TransformerBlock` (dropout driven by a `training` argument), then
dropout, a ReLU `Dense` and a softmax over the tags, trained with
`CustomNonPaddingTokenLoss`, which averages over the tokens whose tag is not
the padding tag 0. The example feeds `padded_batch` rows of ids.
"""

import keras
import tensorflow as tf
from keras import layers

from tests.conformance import synthetic

SOURCE = "https://keras.io/examples/nlp/ner_transformers/"
NOTES = (
    "The layers, NERModel and the loss take **kwargs and gain get_config, and are "
    "registered (the originals have neither), so the subclassed model round-trips "
    "through a .keras file; keras.losses.Reduction.NONE, gone in Keras 3, is "
    "reduction=None; vocabulary 500, 10 tags, 2 heads, ff_dim 32; trained 2 steps on "
    "random right-padded ids whose padding is tagged 0."
)

_PACKAGE = "conformance.ner_transformer"


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.ff_dim = ff_dim
        self.rate = rate
        self.att = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = keras.Sequential(
            [keras.layers.Dense(ff_dim, activation="relu"), keras.layers.Dense(embed_dim)]
        )
        self.layernorm1 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = keras.layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = keras.layers.Dropout(rate)
        self.dropout2 = keras.layers.Dropout(rate)

    def call(self, inputs, training=False):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output, training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output, training=training)
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
        self.token_emb = keras.layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = keras.layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, inputs):
        maxlen = tf.shape(inputs)[-1]
        positions = tf.range(start=0, limit=maxlen, delta=1)
        position_embeddings = self.pos_emb(positions)
        token_embeddings = self.token_emb(inputs)
        return token_embeddings + position_embeddings

    def get_config(self):
        config = super().get_config()
        config.update(
            {"maxlen": self.maxlen, "vocab_size": self.vocab_size, "embed_dim": self.embed_dim}
        )
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class NERModel(keras.Model):
    def __init__(
        self, num_tags, vocab_size, maxlen=128, embed_dim=32, num_heads=2, ff_dim=32, **kwargs
    ):
        super().__init__(**kwargs)
        self.num_tags = num_tags
        self.vocab_size = vocab_size
        self.maxlen = maxlen
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.ff_dim = ff_dim
        self.embedding_layer = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)
        self.transformer_block = TransformerBlock(embed_dim, num_heads, ff_dim)
        self.dropout1 = layers.Dropout(0.1)
        self.ff = layers.Dense(ff_dim, activation="relu")
        self.dropout2 = layers.Dropout(0.1)
        self.ff_final = layers.Dense(num_tags, activation="softmax")

    def call(self, inputs, training=False):
        x = self.embedding_layer(inputs)
        x = self.transformer_block(x)
        x = self.dropout1(x, training=training)
        x = self.ff(x)
        x = self.dropout2(x, training=training)
        x = self.ff_final(x)
        return x

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_tags": self.num_tags,
                "vocab_size": self.vocab_size,
                "maxlen": self.maxlen,
                "embed_dim": self.embed_dim,
                "num_heads": self.num_heads,
                "ff_dim": self.ff_dim,
            }
        )
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class CustomNonPaddingTokenLoss(keras.losses.Loss):
    def __init__(self, name="custom_ner_loss", **kwargs):
        super().__init__(name=name, **kwargs)

    def call(self, y_true, y_pred):
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        loss = loss_fn(y_true, y_pred)
        mask = tf.cast((y_true > 0), dtype=tf.float32)
        loss = loss * mask
        return tf.reduce_sum(loss) / tf.reduce_sum(mask)


num_tags = 10  # "[PAD]", "O" and B-/I- of PER, ORG, LOC, MISC
vocab_size = 500


def training_data():
    """(ids, tags) of two batches; tags start at 1 as the example numbers them,
    and the padding keeps tag 0."""
    data = synthetic.rng()
    tokens = synthetic.token_ids(data, 32, 64, vocab_size)
    tags = synthetic.labels(data, tokens.shape, num_tags - 1) + 1
    tags[tokens == 0] = 0
    return tokens, tags


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    ner_model = NERModel(num_tags, vocab_size, embed_dim=32, num_heads=2, ff_dim=32)
    loss = CustomNonPaddingTokenLoss()
    ner_model.compile(optimizer="adam", loss=loss)

    tokens, tags = training_data()
    synthetic.train(ner_model, tokens, tags, batch_size=16)
    return ner_model
