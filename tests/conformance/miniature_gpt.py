"""keras.io "Text generation with a miniature GPT" (Apoorv Nandan), adapted.

The Keras 3 version of the example: `causal_attention_mask` builds a lower
triangular mask tiled to the batch, `TransformerBlock` passes it to
`MultiHeadAttention(num_heads, embed_dim)` as `attention_mask`, over the
`TokenAndPositionEmbedding` of "Text classification with Transformer" (the
example's own copy is the same code, imported here). `create_model` returns
two outputs, the logits and the last hidden states, and compiles with a loss
on the logits only (`loss=[loss_fn, None]`). The input is fixed-length
int32 ids.
"""

import keras
from keras import layers, ops

from tests.conformance import synthetic
from tests.conformance.text_classification_transformer import TokenAndPositionEmbedding

SOURCE = "https://keras.io/examples/generative/text_generation_with_miniature_gpt/"
NOTES = (
    "TransformerBlock takes **kwargs, stores its arguments and gains get_config, and is "
    "registered (the original has neither); the causal mask's tile repeats are a list, "
    "not a concatenated tensor, which Keras 3.15's ops.tile cannot iterate in a graph; "
    "vocabulary 600, maxlen 64, embed_dim 32, trained 2 steps."
)

_PACKAGE = "conformance.miniature_gpt"


def causal_attention_mask(batch_size, n_dest, n_src, dtype):
    """True on and below the diagonal, counted from its lower right corner: no
    position attends to a later one."""
    i = ops.arange(n_dest)[:, None]
    j = ops.arange(n_src)
    m = i >= j - n_src + n_dest
    mask = ops.cast(m, dtype)
    mask = ops.reshape(mask, [1, n_dest, n_src])
    # The example concatenates the repeats into a tensor, which Keras 3.15's
    # `ops.tile` (TensorFlow) cannot iterate over in a graph: a list instead.
    mult = [batch_size, 1, 1]
    return ops.tile(mask, mult)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim, rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.ff_dim = ff_dim
        self.rate = rate
        self.att = layers.MultiHeadAttention(num_heads, embed_dim)
        self.ffn = keras.Sequential(
            [layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)]
        )
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(rate)
        self.dropout2 = layers.Dropout(rate)

    def call(self, inputs):
        input_shape = ops.shape(inputs)
        batch_size = input_shape[0]
        seq_len = input_shape[1]
        causal_mask = causal_attention_mask(batch_size, seq_len, seq_len, "bool")
        attention_output = self.att(inputs, inputs, attention_mask=causal_mask)
        attention_output = self.dropout1(attention_output)
        out1 = self.layernorm1(inputs + attention_output)
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


vocab_size = 600
maxlen = 64
embed_dim = 32
num_heads = 2
feed_forward_dim = 32


def create_model():
    inputs = layers.Input(shape=(maxlen,), dtype="int32")
    embedding_layer = TokenAndPositionEmbedding(maxlen, vocab_size, embed_dim)
    x = embedding_layer(inputs)
    transformer_block = TransformerBlock(embed_dim, num_heads, feed_forward_dim)
    x = transformer_block(x)
    outputs = layers.Dense(vocab_size)(x)
    model = keras.Model(inputs=inputs, outputs=[outputs, x])
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile("adam", loss=[loss_fn, None])  # the hidden states have no loss
    return model


def training_data():
    """(x, y) of two batches, shifted by one as in prepare_lm_inputs_labels."""
    tokenized_sentences = synthetic.token_ids(synthetic.rng(), 32, maxlen + 1, vocab_size)
    x = tokenized_sentences[:, :-1]
    y = tokenized_sentences[:, 1:]
    return x, y


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = create_model()
    x, y = training_data()
    synthetic.train(model, x, y, batch_size=16)
    return model
