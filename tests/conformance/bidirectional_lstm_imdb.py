"""keras.io "Bidirectional LSTM on IMDB" (fchollet), adapted.

Variable-length int32 ids, an `Embedding` without a padding mask, two
`Bidirectional(LSTM)` layers (the first returning sequences) and a sigmoid.
"""

import keras
from keras import layers

from tests.conformance import synthetic

SOURCE = "https://keras.io/examples/nlp/bidirectional_lstm_imdb/"
NOTES = (
    "max_features 500, embedding 16 and LSTM units 16 instead of 20000/128/64; trained "
    "2 steps on random ids of length 64 instead of padded IMDB reviews."
)


max_features = 500
maxlen = 64


def training_data():
    """(x, y) of two batches: right-padded ids (pad_sequences pads at the front) and labels."""
    data = synthetic.rng()
    return synthetic.token_ids(data, 32, maxlen, max_features), synthetic.labels(data, 32, 2)


def build() -> keras.Model:
    keras.utils.set_random_seed(0)

    # Input for variable-length sequences of integers
    inputs = keras.Input(shape=(None,), dtype="int32")
    x = layers.Embedding(max_features, 16)(inputs)
    x = layers.Bidirectional(layers.LSTM(16, return_sequences=True))(x)
    x = layers.Bidirectional(layers.LSTM(16))(x)
    outputs = layers.Dense(1, activation="sigmoid")(x)
    model = keras.Model(inputs, outputs)

    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    x_train, y_train = training_data()
    synthetic.train(model, x_train, y_train, batch_size=16)
    return model
