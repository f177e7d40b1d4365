"""keras.io "End-to-end Masked Language Modeling with BERT" (Ankur Singh), adapted.

The pretraining model of the example's Keras 3 version: fixed-length int64 ids,
a plain `Embedding` plus keras-hub's `PositionEmbedding` added with `+`,
`bert_module` written with functional layers (`MultiHeadAttention` called
positionally as `(query, key, value)`, post-norm `LayerNormalization(epsilon=1e-6)`,
a feed-forward `Sequential`), a softmax over the vocabulary, all wrapped in
`MaskedLanguageModel`, a `keras.Model` subclass over a functional graph that
overrides `compute_loss`, `compute_metrics` and `metrics`. Training weighs the
loss by per-token sample weights (the masked positions).
"""

from dataclasses import dataclass

import keras
import keras_hub
import numpy as np
from keras import layers

from tests.conformance import synthetic

SOURCE = "https://keras.io/examples/nlp/masked_language_modeling/"
NOTES = (
    "MaskedLanguageModel is registered (the example passes custom_objects to "
    "load_model instead); MAX_LEN 64, VOCAB_SIZE 500, EMBED_DIM 32, 2 heads, FF_DIM 32, "
    "1 layer; trained 2 steps on random ids with 15% masked, right-padded, without the "
    "TextVectorization layer."
)


@dataclass
class Config:
    MAX_LEN = 64
    BATCH_SIZE = 16
    LR = 0.001
    VOCAB_SIZE = 500
    EMBED_DIM = 32
    NUM_HEAD = 2  # used in bert model
    FF_DIM = 32  # used in bert model
    NUM_LAYERS = 1


config = Config()


def bert_module(query, key, value, i):
    # Multi headed self-attention
    attention_output = layers.MultiHeadAttention(
        num_heads=config.NUM_HEAD,
        key_dim=config.EMBED_DIM // config.NUM_HEAD,
        name=f"encoder_{i}_multiheadattention",
    )(query, key, value)
    attention_output = layers.Dropout(0.1, name=f"encoder_{i}_att_dropout")(attention_output)
    attention_output = layers.LayerNormalization(
        epsilon=1e-6, name=f"encoder_{i}_att_layernormalization"
    )(query + attention_output)

    # Feed-forward layer
    ffn = keras.Sequential(
        [
            layers.Dense(config.FF_DIM, activation="relu"),
            layers.Dense(config.EMBED_DIM),
        ],
        name=f"encoder_{i}_ffn",
    )
    ffn_output = ffn(attention_output)
    ffn_output = layers.Dropout(0.1, name=f"encoder_{i}_ffn_dropout")(ffn_output)
    sequence_output = layers.LayerNormalization(
        epsilon=1e-6, name=f"encoder_{i}_ffn_layernormalization"
    )(attention_output + ffn_output)
    return sequence_output


loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)
loss_tracker = keras.metrics.Mean(name="loss")


@keras.saving.register_keras_serializable(package="conformance.masked_language_modeling_bert")
class MaskedLanguageModel(keras.Model):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
        loss = loss_fn(y, y_pred, sample_weight)
        loss_tracker.update_state(loss, sample_weight=sample_weight)
        return keras.ops.sum(loss)

    def compute_metrics(self, x, y, y_pred, sample_weight):
        return {"loss": loss_tracker.result()}

    @property
    def metrics(self):
        # Listed so that `fit` resets the tracker at the start of each epoch.
        return [loss_tracker]


def create_masked_language_bert_model():
    inputs = layers.Input((config.MAX_LEN,), dtype="int64")

    word_embeddings = layers.Embedding(config.VOCAB_SIZE, config.EMBED_DIM, name="word_embedding")(
        inputs
    )
    position_embeddings = keras_hub.layers.PositionEmbedding(sequence_length=config.MAX_LEN)(
        word_embeddings
    )
    embeddings = word_embeddings + position_embeddings

    encoder_output = embeddings
    for i in range(config.NUM_LAYERS):
        encoder_output = bert_module(encoder_output, encoder_output, encoder_output, i)

    mlm_output = layers.Dense(config.VOCAB_SIZE, name="mlm_cls", activation="softmax")(
        encoder_output
    )
    mlm_model = MaskedLanguageModel(inputs, mlm_output, name="masked_bert_model")

    optimizer = keras.optimizers.Adam(learning_rate=config.LR)
    mlm_model.compile(optimizer=optimizer)
    return mlm_model


def training_data():
    """(masked ids, ids, sample weights) of two batches: 15% of the real tokens
    replaced by the mask id, weighted 1, as get_masked_input_and_labels does."""
    data = synthetic.rng()
    encoded_texts = synthetic.token_ids(
        data, 2 * config.BATCH_SIZE, config.MAX_LEN, config.VOCAB_SIZE
    )
    mask_token_id = config.VOCAB_SIZE - 1  # the example puts "[mask]" last
    inp_mask = (data.random(encoded_texts.shape) < 0.15) & (encoded_texts > 2)
    encoded_texts_masked = np.where(inp_mask, mask_token_id, encoded_texts)
    return encoded_texts_masked, encoded_texts, inp_mask.astype("float32")


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    mlm_model = create_masked_language_bert_model()
    encoded_texts_masked, encoded_texts, sample_weights = training_data()
    synthetic.train(
        mlm_model,
        encoded_texts_masked,
        encoded_texts,
        batch_size=config.BATCH_SIZE,
        sample_weight=sample_weights,
    )
    return mlm_model
