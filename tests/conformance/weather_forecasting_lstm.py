"""keras.io "Timeseries forecasting for weather prediction" (Prabhanshu Attri et al.), adapted.

Float features of a fixed window, `(120 steps, 7 features)` as the example's
`timeseries_dataset_from_array` makes them, one `LSTM(32)` and a linear
`Dense(1)`, trained with MSE.
"""

import keras

from tests.conformance import synthetic

SOURCE = "https://keras.io/examples/timeseries/timeseries_weather_forecasting/"
NOTES = (
    "Trained 2 steps of 16 windows of random features instead of the Jena climate "
    "data; the model is the example's, at its own size."
)

learning_rate = 0.001
sequence_length = 120  # past / step: 720 / 6
n_features = 7


def training_data():
    """(x, y) of two batches of random windows and targets."""
    data = synthetic.rng()
    return (
        synthetic.features(data, (32, sequence_length, n_features)),
        synthetic.features(data, (32, 1)),
    )


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    inputs = keras.layers.Input(shape=(sequence_length, n_features))
    lstm_out = keras.layers.LSTM(32)(inputs)
    outputs = keras.layers.Dense(1)(lstm_out)

    model = keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=learning_rate), loss="mse")
    x_train, y_train = training_data()
    synthetic.train(model, x_train, y_train, batch_size=16)
    return model
