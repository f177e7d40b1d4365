"""keras.io "Character-level recurrent sequence-to-sequence model" (fchollet), adapted.

Two one-hot inputs of their own lengths, `keras.Input(shape=(None,
num_encoder_tokens))` and `keras.Input(shape=(None, num_decoder_tokens))`,
named by Keras (no `decoder_` prefix): an `LSTM` encoder whose states start
the `LSTM` decoder, and a softmax over the decoder's characters.
"""

import keras

from tests.conformance import synthetic

SOURCE = "https://keras.io/examples/nlp/lstm_seq2seq/"
NOTES = (
    "latent_dim 16, 12 encoder and 9 decoder characters (the example: 256, 71, 93); "
    "trained 2 steps on random one-hot sequences of 7 and 5 steps instead of fra-eng."
)

latent_dim = 16
num_encoder_tokens = 12
num_decoder_tokens = 9


def training_data():
    """([encoder_input_data, decoder_input_data], decoder_target_data), one-hot."""
    data = synthetic.rng()
    eye_in, eye_out = keras.ops.eye(num_encoder_tokens), keras.ops.eye(num_decoder_tokens)
    encoder = keras.ops.take(eye_in, data.integers(0, num_encoder_tokens, (32, 7)), axis=0)
    decoder = keras.ops.take(eye_out, data.integers(0, num_decoder_tokens, (32, 5)), axis=0)
    target = keras.ops.take(eye_out, data.integers(0, num_decoder_tokens, (32, 5)), axis=0)
    return [keras.ops.convert_to_numpy(encoder), keras.ops.convert_to_numpy(decoder)], (
        keras.ops.convert_to_numpy(target)
    )


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    # Define an input sequence and process it.
    encoder_inputs = keras.Input(shape=(None, num_encoder_tokens))
    encoder = keras.layers.LSTM(latent_dim, return_state=True)
    encoder_outputs, state_h, state_c = encoder(encoder_inputs)
    # We discard `encoder_outputs` and only keep the states.
    encoder_states = [state_h, state_c]

    # Set up the decoder, using `encoder_states` as initial state.
    decoder_inputs = keras.Input(shape=(None, num_decoder_tokens))
    decoder_lstm = keras.layers.LSTM(latent_dim, return_sequences=True, return_state=True)
    decoder_outputs, _, _ = decoder_lstm(decoder_inputs, initial_state=encoder_states)
    decoder_dense = keras.layers.Dense(num_decoder_tokens, activation="softmax")
    decoder_outputs = decoder_dense(decoder_outputs)

    # Define the model that will turn
    # `encoder_input_data` & `decoder_input_data` into `decoder_target_data`
    model = keras.Model([encoder_inputs, decoder_inputs], decoder_outputs)
    model.compile(optimizer="rmsprop", loss="categorical_crossentropy", metrics=["accuracy"])
    x_train, y_train = training_data()
    synthetic.train(model, x_train, y_train, batch_size=16)
    return model
