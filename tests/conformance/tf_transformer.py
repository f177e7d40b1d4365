"""TensorFlow's "Neural machine translation with a Transformer and Keras", adapted.

The full encoder-decoder on the tutorial's layers: the encoder of
`tf_transformer_encoder`, and here `CrossAttention` (which keeps its attention
scores, as the tutorial does for plotting), `CausalSelfAttention`
(`use_causal_mask=True`), `DecoderLayer`, `Decoder`, a final `Dense` to logits
over the target vocabulary, and the tutorial's `CustomSchedule`, `masked_loss`
and `masked_accuracy`.

Under Keras 3 the tutorial's padding mask does not travel as it did under
Keras 2: `MultiHeadAttention` returns no mask, so the `Add` after it drops the
mask, and Keras warns that `GlobalSelfAttention`/`EncoderLayer` "destroy the
mask". Only the first attention of the encoder and of the decoder sees it; the
code is left as the tutorial writes it, since that is what its readers run.
"""

import keras
import tensorflow as tf

from tests.conformance import synthetic
from tests.conformance.tf_transformer_encoder import (
    _PACKAGE,
    D_MODEL,
    DFF,
    DROPOUT_RATE,
    INPUT_VOCAB_SIZE,
    NUM_HEADS,
    BaseAttention,
    Encoder,
    FeedForward,
    PositionalEmbedding,
)

SOURCE = "https://www.tensorflow.org/text/tutorials/transformer"
NOTES = (
    "The tutorial's subclassed Transformer becomes a functional model of two inputs, "
    "context and x (token ids), to logits; its `del logits._keras_mask` has no "
    "functional counterpart and Keras 3 trains without it, so the output keeps the "
    "Dense layer's mask. Layers gain **kwargs and get_config, CustomSchedule gains "
    "get_config, and all are registered (the originals have neither); 1 layer, "
    "d_model 32, 2 heads, vocabularies 400 and 300, trained 2 steps."
)

TARGET_VOCAB_SIZE = 300
NUM_LAYERS = 1  # the encoder's two layers are tf_transformer_encoder's; one keeps this under 5 s


@keras.saving.register_keras_serializable(package=_PACKAGE)
class CrossAttention(BaseAttention):
    def call(self, x, context):
        attn_output, attn_scores = self.mha(
            query=x, key=context, value=context, return_attention_scores=True
        )

        # Cache the attention scores for plotting later.
        self.last_attn_scores = attn_scores

        x = self.add([x, attn_output])
        x = self.layernorm(x)

        return x


@keras.saving.register_keras_serializable(package=_PACKAGE)
class CausalSelfAttention(BaseAttention):
    def call(self, x):
        attn_output = self.mha(query=x, value=x, key=x, use_causal_mask=True)
        x = self.add([x, attn_output])
        x = self.layernorm(x)
        return x


@keras.saving.register_keras_serializable(package=_PACKAGE)
class DecoderLayer(keras.layers.Layer):
    def __init__(self, *, d_model, num_heads, dff, dropout_rate=0.1, **kwargs):
        super().__init__(**kwargs)
        self.d_model = d_model
        self.num_heads = num_heads
        self.dff = dff
        self.dropout_rate = dropout_rate

        self.causal_self_attention = CausalSelfAttention(
            num_heads=num_heads, key_dim=d_model, dropout=dropout_rate
        )

        self.cross_attention = CrossAttention(
            num_heads=num_heads, key_dim=d_model, dropout=dropout_rate
        )

        self.ffn = FeedForward(d_model, dff)

    def call(self, x, context):
        x = self.causal_self_attention(x=x)
        x = self.cross_attention(x=x, context=context)

        # Cache the last attention scores for plotting later
        self.last_attn_scores = self.cross_attention.last_attn_scores

        x = self.ffn(x)  # Shape `(batch_size, seq_len, d_model)`.
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
class Decoder(keras.layers.Layer):
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
        self.dropout = keras.layers.Dropout(dropout_rate)
        self.dec_layers = [
            DecoderLayer(d_model=d_model, num_heads=num_heads, dff=dff, dropout_rate=dropout_rate)
            for _ in range(num_layers)
        ]

        self.last_attn_scores = None

    def call(self, x, context):
        # `x` is token-IDs shape (batch, target_seq_len)
        x = self.pos_embedding(x)  # (batch_size, target_seq_len, d_model)

        x = self.dropout(x)

        for i in range(self.num_layers):
            x = self.dec_layers[i](x, context)

        self.last_attn_scores = self.dec_layers[-1].last_attn_scores

        # The shape of x is (batch_size, target_seq_len, d_model).
        return x

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


@keras.saving.register_keras_serializable(package=_PACKAGE)
class CustomSchedule(keras.optimizers.schedules.LearningRateSchedule):
    def __init__(self, d_model, warmup_steps=4000):
        super().__init__()

        self.d_model = d_model
        self.warmup_steps = warmup_steps

    def __call__(self, step):
        step = tf.cast(step, dtype=tf.float32)
        arg1 = tf.math.rsqrt(step)
        arg2 = step * (self.warmup_steps**-1.5)

        return tf.math.rsqrt(tf.cast(self.d_model, tf.float32)) * tf.math.minimum(arg1, arg2)

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps}


@keras.saving.register_keras_serializable(package=_PACKAGE)
def masked_loss(label, pred):
    mask = label != 0
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    loss = loss_object(label, pred)

    mask = tf.cast(mask, dtype=loss.dtype)
    loss *= mask

    loss = tf.reduce_sum(loss) / tf.reduce_sum(mask)
    return loss


@keras.saving.register_keras_serializable(package=_PACKAGE)
def masked_accuracy(label, pred):
    pred = tf.argmax(pred, axis=2)
    label = tf.cast(label, pred.dtype)
    match = label == pred

    mask = label != 0

    match = match & mask

    match = tf.cast(match, dtype=tf.float32)
    mask = tf.cast(mask, dtype=tf.float32)
    return tf.reduce_sum(match) / tf.reduce_sum(mask)


def training_data():
    """((context, x), labels) of two batches, the target shifted by one as in
    the tutorial's prepare_batch; context and target of different lengths."""
    data = synthetic.rng()
    pt = synthetic.token_ids(data, 32, 64, INPUT_VOCAB_SIZE)
    en = synthetic.token_ids(data, 32, 49, TARGET_VOCAB_SIZE)
    en_inputs, en_labels = en[:, :-1], en[:, 1:]
    return (pt, en_inputs), en_labels


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    context = keras.Input(shape=(None,), dtype="int64", name="context")
    x = keras.Input(shape=(None,), dtype="int64", name="x")
    encoder = Encoder(
        num_layers=NUM_LAYERS,
        d_model=D_MODEL,
        num_heads=NUM_HEADS,
        dff=DFF,
        vocab_size=INPUT_VOCAB_SIZE,
        dropout_rate=DROPOUT_RATE,
    )
    decoder = Decoder(
        num_layers=NUM_LAYERS,
        d_model=D_MODEL,
        num_heads=NUM_HEADS,
        dff=DFF,
        vocab_size=TARGET_VOCAB_SIZE,
        dropout_rate=DROPOUT_RATE,
    )
    final_layer = keras.layers.Dense(TARGET_VOCAB_SIZE)
    logits = final_layer(decoder(x, encoder(context)))
    transformer = keras.Model([context, x], logits)

    learning_rate = CustomSchedule(D_MODEL)
    optimizer = keras.optimizers.Adam(learning_rate, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    transformer.compile(loss=masked_loss, optimizer=optimizer, metrics=[masked_accuracy])

    inputs, en_labels = training_data()
    synthetic.train(transformer, inputs, en_labels, batch_size=16)
    return transformer
