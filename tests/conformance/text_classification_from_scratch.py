"""keras.io "Text classification from scratch" (Mark Omernick, Francois Chollet), adapted.

The model of the example's "option 2", which takes vocabulary indices:
variable-length int64 ids, `Embedding`, `Dropout`, two
`Conv1D(kernel_size=7, padding="valid", strides=3)`, `GlobalMaxPooling1D`, a
ReLU `Dense` and a sigmoid named `predictions`. Two valid convolutions of
width 7 and stride 3 need at least 25 tokens; the example always feeds 500
(`TextVectorization(output_sequence_length=500)`).
"""

import keras
from keras import layers

from tests.conformance import synthetic

SOURCE = "https://keras.io/examples/nlp/text_classification_from_scratch/"
NOTES = (
    "The TextVectorization layer (strings in) is left out, as in the example's own "
    "option 2: the model takes its ids; max_features 500, embedding_dim 16, 16 filters "
    "instead of 20000/128/128; trained 2 steps on random ids of length 64."
)


max_features = 500
embedding_dim = 16
sequence_length = 64


def training_data():
    """(x, y) of two batches: right-padded ids and labels."""
    data = synthetic.rng()
    return (
        synthetic.token_ids(data, 32, sequence_length, max_features),
        synthetic.labels(data, 32, 2),
    )


def build() -> keras.Model:
    keras.utils.set_random_seed(0)

    # A integer input for vocab indices.
    inputs = keras.Input(shape=(None,), dtype="int64")

    x = layers.Embedding(max_features, embedding_dim)(inputs)
    x = layers.Dropout(0.5)(x)

    # Conv1D + global max pooling
    x = layers.Conv1D(16, 7, padding="valid", activation="relu", strides=3)(x)
    x = layers.Conv1D(16, 7, padding="valid", activation="relu", strides=3)(x)
    x = layers.GlobalMaxPooling1D()(x)

    x = layers.Dense(16, activation="relu")(x)
    x = layers.Dropout(0.5)(x)

    predictions = layers.Dense(1, activation="sigmoid", name="predictions")(x)

    model = keras.Model(inputs, predictions)

    model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    x_train, y_train = training_data()
    synthetic.train(model, x_train, y_train, batch_size=16)
    return model
