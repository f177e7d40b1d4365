"""keras.io "Text classification with Switch Transformer" (Khalid Salama), adapted.

The example's `Switch` layer reshapes its input to `[num_tokens_per_batch,
embed_dim]`, a constant of the training batch: the model runs at batch 50
only (here 5), and its token ids come in as float32 (`layers.Input(shape=
(num_tokens_per_example,))` without a dtype). Not in the conformance set's
default-flag exports: it needs `--shapes 5x16`
(tests/test_public_inputs.py exports it so).
"""

import keras
import tensorflow as tf
from keras import layers

from tests.conformance import synthetic

SOURCE = "https://keras.io/examples/nlp/text_classification_with_switch_transformer/"
NOTES = (
    "vocab_size 1000, num_tokens_per_example 16, batch_size 5, embed_dim 16, 4 experts "
    "(the example: 20000, 200, 50, 32, 10); trained 2 steps on random ids; the "
    "load-balancing loss is kept."
)
SHAPES = [(5, 16)]

vocab_size = 1000
num_tokens_per_example = 16
embed_dim = 16
num_heads = 2
ff_dim = 16
num_experts = 4
batch_size = 5
dropout_rate = 0.25
num_tokens_per_batch = batch_size * num_tokens_per_example


@keras.saving.register_keras_serializable("conformance.switch_transformer")
class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim, **kwargs):
        super().__init__(**kwargs)
        self.maxlen, self.vocab_size, self.embed_dim = maxlen, vocab_size, embed_dim
        self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
        self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
        maxlen = tf.shape(x)[-1]
        positions = tf.range(start=0, limit=maxlen, delta=1)
        positions = self.pos_emb(positions)
        x = self.token_emb(x)
        return x + positions

    def get_config(self):
        return {
            **super().get_config(),
            "maxlen": self.maxlen,
            "vocab_size": self.vocab_size,
            "embed_dim": self.embed_dim,
        }


def create_feedforward_network(ff_dim, name=None):
    return keras.Sequential(
        [layers.Dense(ff_dim, activation="relu"), layers.Dense(ff_dim)], name=name
    )


def load_balanced_loss(router_probs, expert_mask):
    num_experts = tf.shape(expert_mask)[-1]
    density = tf.reduce_mean(expert_mask, axis=0)
    density_proxy = tf.reduce_mean(router_probs, axis=0)
    loss = tf.reduce_mean(density_proxy * density) * tf.cast((num_experts**2), tf.dtypes.float32)
    return loss


@keras.saving.register_keras_serializable("conformance.switch_transformer")
class Router(layers.Layer):
    def __init__(self, num_experts, expert_capacity, **kwargs):
        self.num_experts = num_experts
        self.route = layers.Dense(units=num_experts)
        self.expert_capacity = expert_capacity
        super().__init__(**kwargs)

    def call(self, inputs, training=False):
        router_logits = self.route(inputs)
        if training:
            router_logits += tf.random.uniform(shape=router_logits.shape, minval=0.9, maxval=1.1)
        router_probs = keras.activations.softmax(router_logits, axis=-1)
        expert_gate, expert_index = tf.math.top_k(router_probs, k=1)
        expert_mask = tf.one_hot(expert_index, depth=self.num_experts)
        aux_loss = load_balanced_loss(router_probs, expert_mask)
        self.add_loss(aux_loss)
        position_in_expert = tf.cast(
            tf.math.cumsum(expert_mask, axis=0) * expert_mask, tf.dtypes.int32
        )
        expert_mask *= tf.cast(
            tf.math.less(tf.cast(position_in_expert, tf.dtypes.int32), self.expert_capacity),
            tf.dtypes.float32,
        )
        expert_mask_flat = tf.reduce_sum(expert_mask, axis=-1)
        expert_gate *= expert_mask_flat
        combined_tensor = tf.expand_dims(
            expert_gate
            * expert_mask_flat
            * tf.squeeze(tf.one_hot(expert_index, depth=self.num_experts), 1),
            -1,
        ) * tf.squeeze(tf.one_hot(position_in_expert, depth=self.expert_capacity), 1)
        dispatch_tensor = tf.cast(combined_tensor, tf.dtypes.float32)
        return dispatch_tensor, combined_tensor

    def get_config(self):
        return {
            **super().get_config(),
            "num_experts": self.num_experts,
            "expert_capacity": self.expert_capacity,
        }


@keras.saving.register_keras_serializable("conformance.switch_transformer")
class Switch(layers.Layer):
    def __init__(self, num_experts, embed_dim, num_tokens_per_batch, capacity_factor=1, **kwargs):
        self.num_experts = num_experts
        self.embed_dim = embed_dim
        self.num_tokens_per_batch = num_tokens_per_batch
        self.experts = [create_feedforward_network(embed_dim) for _ in range(num_experts)]
        self.expert_capacity = num_tokens_per_batch // self.num_experts
        self.router = Router(self.num_experts, self.expert_capacity)
        super().__init__(**kwargs)

    def call(self, inputs):
        batch_size = tf.shape(inputs)[0]
        num_tokens_per_example = tf.shape(inputs)[1]
        inputs = tf.reshape(inputs, [self.num_tokens_per_batch, self.embed_dim])
        dispatch_tensor, combine_tensor = self.router(inputs)
        expert_inputs = tf.einsum("ab,acd->cdb", inputs, dispatch_tensor)
        expert_inputs = tf.reshape(
            expert_inputs, [self.num_experts, self.expert_capacity, self.embed_dim]
        )
        expert_input_list = tf.unstack(expert_inputs, axis=0)
        expert_output_list = [
            self.experts[idx](expert_input) for idx, expert_input in enumerate(expert_input_list)
        ]
        expert_outputs = tf.stack(expert_output_list, axis=1)
        expert_outputs_combined = tf.einsum("abc,xba->xc", expert_outputs, combine_tensor)
        outputs = tf.reshape(
            expert_outputs_combined,
            [batch_size, num_tokens_per_example, self.embed_dim],
        )
        return outputs

    def get_config(self):
        return {
            **super().get_config(),
            "num_experts": self.num_experts,
            "embed_dim": self.embed_dim,
            "num_tokens_per_batch": self.num_tokens_per_batch,
        }


@keras.saving.register_keras_serializable("conformance.switch_transformer")
class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ffn, dropout_rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim, self.num_heads, self.dropout_rate = embed_dim, num_heads, dropout_rate
        self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
        self.ffn = ffn
        self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
        self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)
        self.dropout1 = layers.Dropout(dropout_rate)
        self.dropout2 = layers.Dropout(dropout_rate)

    def call(self, inputs, training=None):
        attn_output = self.att(inputs, inputs)
        attn_output = self.dropout1(attn_output, training=training)
        out1 = self.layernorm1(inputs + attn_output)
        ffn_output = self.ffn(out1)
        ffn_output = self.dropout2(ffn_output, training=training)
        return self.layernorm2(out1 + ffn_output)

    def get_config(self):
        return {
            **super().get_config(),
            "embed_dim": self.embed_dim,
            "num_heads": self.num_heads,
            "ffn": keras.saving.serialize_keras_object(self.ffn),
            "dropout_rate": self.dropout_rate,
        }

    @classmethod
    def from_config(cls, config):
        config["ffn"] = keras.saving.deserialize_keras_object(config["ffn"])
        return cls(**config)


def create_classifier():
    switch = Switch(num_experts, embed_dim, num_tokens_per_batch)
    transformer_block = TransformerBlock(ff_dim, num_heads, switch)

    inputs = layers.Input(shape=(num_tokens_per_example,))
    embedding_layer = TokenAndPositionEmbedding(num_tokens_per_example, vocab_size, embed_dim)
    x = embedding_layer(inputs)
    x = transformer_block(x)
    x = layers.GlobalAveragePooling1D()(x)
    x = layers.Dropout(dropout_rate)(x)
    x = layers.Dense(ff_dim, activation="relu")(x)
    x = layers.Dropout(dropout_rate)(x)
    outputs = layers.Dense(2, activation="softmax")(x)
    return keras.Model(inputs=inputs, outputs=outputs)


def training_data():
    """(x, y): two batches of random ids (as float32, like the example's arrays) and labels."""
    data = synthetic.rng()
    ids = data.integers(1, vocab_size, size=(2 * batch_size, num_tokens_per_example))
    return ids.astype("float32"), synthetic.labels(data, 2 * batch_size, 2)


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    classifier = create_classifier()
    classifier.compile(
        optimizer=keras.optimizers.Adam(0.001),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    x_train, y_train = training_data()
    synthetic.train(classifier, x_train, y_train, batch_size=batch_size)
    return classifier
