"""keras.io "English-to-Spanish translation with a sequence-to-sequence Transformer", adapted.

By fchollet; the Keras 3 version of the example: `PositionalEmbedding` (token and
position `Embedding`s, `compute_mask` = ids != 0), `TransformerEncoder`
(the mask as an int `attention_mask`), `TransformerDecoder` (a causal mask
built with `ops.tile` to the batch, the two padding masks as `query_mask` and
`key_mask`), assembled into the `transformer` over dict inputs
`encoder_inputs` / `decoder_inputs` (int64) with softmax probabilities over the
Spanish vocabulary as output, compiled with `ignore_class=0`.
"""

import keras
from keras import layers, ops

from tests.conformance import synthetic

SOURCE = "https://keras.io/examples/nlp/neural_machine_translation_with_transformer/"
NOTES = (
    "Registered for saving (the layers already have get_config); the causal mask's "
    "tile repeats are a list, not a concatenated tensor, which Keras 3.15's "
    "ops.tile cannot iterate in a graph; the unused encoder/decoder sub-models are not "
    "built (Keras 3.15 refuses the decoder's unconnected input); vocabulary 500, "
    "sequence_length 64, embed_dim 32, latent_dim 64, 2 heads, trained 2 steps on "
    "random right-padded ids instead of TextVectorization output."
)

_PACKAGE = "conformance.translation_transformer"


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TransformerEncoder(layers.Layer):
    def __init__(self, embed_dim, dense_dim, num_heads, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim = embed_dim
        self.dense_dim = dense_dim
        self.num_heads = num_heads
        self.attention = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.dense_proj = keras.Sequential(
            [layers.Dense(dense_dim, activation="relu"), layers.Dense(embed_dim)]
        )
        self.layernorm_1 = layers.LayerNormalization()
        self.layernorm_2 = layers.LayerNormalization()
        self.supports_masking = True

    def call(self, inputs, mask=None):
        if mask is not None:
            padding_mask = ops.cast(mask[:, None, :], dtype="int32")
        else:
            padding_mask = None

        attention_output = self.attention(
            query=inputs, value=inputs, key=inputs, attention_mask=padding_mask
        )
        proj_input = self.layernorm_1(inputs + attention_output)
        proj_output = self.dense_proj(proj_input)
        return self.layernorm_2(proj_input + proj_output)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"embed_dim": self.embed_dim, "dense_dim": self.dense_dim, "num_heads": self.num_heads}
        )
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class PositionalEmbedding(layers.Layer):
    def __init__(self, sequence_length, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.token_embeddings = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.position_embeddings = layers.Embedding(input_dim=sequence_length, output_dim=embed_dim)
        self.sequence_length = sequence_length
        self.vocab_size = vocab_size
        self.embed_dim = embed_dim

    def call(self, inputs):
        length = ops.shape(inputs)[-1]
        positions = ops.arange(0, length, 1)
        embedded_tokens = self.token_embeddings(inputs)
        embedded_positions = self.position_embeddings(positions)
        return embedded_tokens + embedded_positions

    def compute_mask(self, inputs, mask=None):
        return ops.not_equal(inputs, 0)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "sequence_length": self.sequence_length,
                "vocab_size": self.vocab_size,
                "embed_dim": self.embed_dim,
            }
        )
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TransformerDecoder(layers.Layer):
    def __init__(self, embed_dim, latent_dim, num_heads, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim = embed_dim
        self.latent_dim = latent_dim
        self.num_heads = num_heads
        self.attention_1 = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.attention_2 = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.dense_proj = keras.Sequential(
            [layers.Dense(latent_dim, activation="relu"), layers.Dense(embed_dim)]
        )
        self.layernorm_1 = layers.LayerNormalization()
        self.layernorm_2 = layers.LayerNormalization()
        self.layernorm_3 = layers.LayerNormalization()
        self.supports_masking = True

    def call(self, inputs, mask=None):
        inputs, encoder_outputs = inputs
        causal_mask = self.get_causal_attention_mask(inputs)

        if mask is None:
            inputs_padding_mask, encoder_outputs_padding_mask = None, None
        else:
            inputs_padding_mask, encoder_outputs_padding_mask = mask

        attention_output_1 = self.attention_1(
            query=inputs,
            value=inputs,
            key=inputs,
            attention_mask=causal_mask,
            query_mask=inputs_padding_mask,
        )
        out_1 = self.layernorm_1(inputs + attention_output_1)

        attention_output_2 = self.attention_2(
            query=out_1,
            value=encoder_outputs,
            key=encoder_outputs,
            query_mask=inputs_padding_mask,
            key_mask=encoder_outputs_padding_mask,
        )
        out_2 = self.layernorm_2(out_1 + attention_output_2)

        proj_output = self.dense_proj(out_2)
        return self.layernorm_3(out_2 + proj_output)

    def get_causal_attention_mask(self, inputs):
        input_shape = ops.shape(inputs)
        batch_size, sequence_length = input_shape[0], input_shape[1]
        i = ops.arange(sequence_length)[:, None]
        j = ops.arange(sequence_length)
        mask = ops.cast(i >= j, dtype="int32")
        mask = ops.reshape(mask, (1, input_shape[1], input_shape[1]))
        # Keras 3.15's `ops.tile` (TensorFlow) iterates over its repeats, which a
        # symbolic tensor refuses: the example's concatenated tensor becomes a list.
        mult = [batch_size, 1, 1]
        return ops.tile(mask, mult)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "embed_dim": self.embed_dim,
                "latent_dim": self.latent_dim,
                "num_heads": self.num_heads,
            }
        )
        return config


vocab_size = 500
sequence_length = 64
embed_dim = 32
latent_dim = 64
num_heads = 2


def training_data():
    """(inputs, targets) of two batches, as the example's format_dataset makes them."""
    data = synthetic.rng()
    eng = synthetic.token_ids(data, 32, 20, vocab_size)
    spa = synthetic.token_ids(data, 32, 21, vocab_size)
    return {"encoder_inputs": eng, "decoder_inputs": spa[:, :-1]}, spa[:, 1:]


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    # The example also wraps an `encoder` and a `decoder` model that `transformer`
    # does not use. Its `decoder` model lists `decoder_state_inputs` as an input
    # that its output never reads, which Keras 3.15 refuses ("Output ... is not
    # connected to `inputs`"), so neither is built here.
    encoder_inputs = keras.Input(shape=(None,), dtype="int64", name="encoder_inputs")
    x = PositionalEmbedding(sequence_length, vocab_size, embed_dim)(encoder_inputs)
    encoder_outputs = TransformerEncoder(embed_dim, latent_dim, num_heads)(x)

    decoder_inputs = keras.Input(shape=(None,), dtype="int64", name="decoder_inputs")
    x = PositionalEmbedding(sequence_length, vocab_size, embed_dim)(decoder_inputs)
    x = TransformerDecoder(embed_dim, latent_dim, num_heads)([x, encoder_outputs])
    x = layers.Dropout(0.5)(x)
    decoder_outputs = layers.Dense(vocab_size, activation="softmax")(x)

    transformer = keras.Model(
        {"encoder_inputs": encoder_inputs, "decoder_inputs": decoder_inputs},
        decoder_outputs,
        name="transformer",
    )
    transformer.compile(
        "rmsprop",
        loss=keras.losses.SparseCategoricalCrossentropy(ignore_class=0),
        metrics=["accuracy"],
    )

    inputs, targets = training_data()
    synthetic.train(transformer, inputs, targets, batch_size=16)
    return transformer
