"""keras.io "Timeseries classification with a Transformer model" (Theodoros Ntakouris), adapted.

Functional code, no custom layer: `transformer_encoder` stacks
`MultiHeadAttention(dropout=...)`, `LayerNormalization(epsilon=1e-6)` applied
to the attention output *before* the residual add, and a `Conv1D(kernel_size=1)`
feed-forward; `build_model` pools with `GlobalAveragePooling1D` into a softmax.
The input is float features, `(time steps, 1)` as in FordA.
"""

import keras
from keras import layers

from tests.conformance import synthetic

SOURCE = "https://keras.io/examples/timeseries/timeseries_classification_transformer/"
NOTES = (
    "The input is (None, 1), any number of time steps, where the example fixes 500 "
    "from its data; head_size 16, 2 heads, 2 blocks, mlp_units [16], trained 2 steps "
    "on random series instead of FordA (n_classes is 2, as there)."
)

N_CLASSES = 2


def transformer_encoder(inputs, head_size, num_heads, ff_dim, dropout=0):
    # Attention and Normalization
    x = layers.MultiHeadAttention(key_dim=head_size, num_heads=num_heads, dropout=dropout)(
        inputs, inputs
    )
    x = layers.Dropout(dropout)(x)
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    res = x + inputs

    # Feed Forward Part
    x = layers.Conv1D(filters=ff_dim, kernel_size=1, activation="relu")(res)
    x = layers.Dropout(dropout)(x)
    x = layers.Conv1D(filters=inputs.shape[-1], kernel_size=1)(x)
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    return x + res


def build_model(
    input_shape,
    head_size,
    num_heads,
    ff_dim,
    num_transformer_blocks,
    mlp_units,
    dropout=0,
    mlp_dropout=0,
):
    inputs = keras.Input(shape=input_shape)
    x = inputs
    for _ in range(num_transformer_blocks):
        x = transformer_encoder(x, head_size, num_heads, ff_dim, dropout)

    x = layers.GlobalAveragePooling1D(data_format="channels_last")(x)
    for dim in mlp_units:
        x = layers.Dense(dim, activation="relu")(x)
        x = layers.Dropout(mlp_dropout)(x)
    outputs = layers.Dense(N_CLASSES, activation="softmax")(x)
    return keras.Model(inputs, outputs)


def training_data():
    """(x, y) of two batches: random series of 64 steps and labels."""
    data = synthetic.rng()
    return synthetic.features(data, (32, 64, 1)), synthetic.labels(data, 32, N_CLASSES)


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = build_model(
        (None, 1),
        head_size=16,
        num_heads=2,
        ff_dim=4,
        num_transformer_blocks=2,
        mlp_units=[16],
        mlp_dropout=0.4,
        dropout=0.25,
    )
    model.compile(
        loss="sparse_categorical_crossentropy",
        optimizer=keras.optimizers.Adam(learning_rate=1e-4),
        metrics=["sparse_categorical_accuracy"],
    )
    x_train, y_train = training_data()
    synthetic.train(model, x_train, y_train, batch_size=16)
    return model
