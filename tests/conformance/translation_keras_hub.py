"""keras.io "English-to-Spanish translation with KerasHub" (Abheesht Sharma), adapted.

keras-hub's own layers: `TokenAndPositionEmbedding` (no `mask_zero`, as the
example writes it), `TransformerEncoder` and a causal `TransformerDecoder`.
As in the example, the decoder is a model of its own over
`decoder_inputs` and `decoder_state_inputs`, called inside `transformer`
on the encoder's output (a model nested in a model), and the inputs are
`keras.Input(shape=(None,))`: float32, cast to ids by the embeddings. The
output is softmax probabilities over the Spanish vocabulary.
"""

import keras
import keras_hub

from tests.conformance import synthetic

SOURCE = "https://keras.io/examples/nlp/neural_machine_translation_with_keras_hub/"
NOTES = (
    "Vocabularies 300 and 400, MAX_SEQUENCE_LENGTH 64 (the example's 40 would cap the "
    "grid at 40), EMBED_DIM 32, INTERMEDIATE_DIM 64, 2 heads; trained 2 steps on "
    "random right-padded ids instead of WordPiece-tokenized pairs."
)

ENG_VOCAB_SIZE = 300
SPA_VOCAB_SIZE = 400
MAX_SEQUENCE_LENGTH = 64
EMBED_DIM = 32
INTERMEDIATE_DIM = 64
NUM_HEADS = 2


def training_data():
    """((encoder ids, decoder ids), targets) of two batches, right-padded with the
    [PAD] id 0 as StartEndPacker pads them."""
    data = synthetic.rng()
    eng = synthetic.token_ids(data, 32, 20, ENG_VOCAB_SIZE)
    spa = synthetic.token_ids(data, 32, 21, SPA_VOCAB_SIZE)
    return (eng, spa[:, :-1]), spa[:, 1:]


def build() -> keras.Model:
    keras.utils.set_random_seed(0)
    # Encoder (the example also wraps it in an `encoder` model, used only for decoding)
    encoder_inputs = keras.Input(shape=(None,), name="encoder_inputs")

    x = keras_hub.layers.TokenAndPositionEmbedding(
        vocabulary_size=ENG_VOCAB_SIZE,
        sequence_length=MAX_SEQUENCE_LENGTH,
        embedding_dim=EMBED_DIM,
    )(encoder_inputs)

    encoder_outputs = keras_hub.layers.TransformerEncoder(
        intermediate_dim=INTERMEDIATE_DIM, num_heads=NUM_HEADS
    )(inputs=x)

    # Decoder
    decoder_inputs = keras.Input(shape=(None,), name="decoder_inputs")
    encoded_seq_inputs = keras.Input(shape=(None, EMBED_DIM), name="decoder_state_inputs")

    x = keras_hub.layers.TokenAndPositionEmbedding(
        vocabulary_size=SPA_VOCAB_SIZE,
        sequence_length=MAX_SEQUENCE_LENGTH,
        embedding_dim=EMBED_DIM,
    )(decoder_inputs)

    x = keras_hub.layers.TransformerDecoder(intermediate_dim=INTERMEDIATE_DIM, num_heads=NUM_HEADS)(
        decoder_sequence=x, encoder_sequence=encoded_seq_inputs
    )
    x = keras.layers.Dropout(0.5)(x)
    decoder_outputs = keras.layers.Dense(SPA_VOCAB_SIZE, activation="softmax")(x)
    decoder = keras.Model([decoder_inputs, encoded_seq_inputs], decoder_outputs)
    decoder_outputs = decoder([decoder_inputs, encoder_outputs])

    transformer = keras.Model([encoder_inputs, decoder_inputs], decoder_outputs, name="transformer")
    transformer.compile("rmsprop", loss="sparse_categorical_crossentropy", metrics=["accuracy"])

    inputs, targets = training_data()
    synthetic.train(transformer, inputs, targets, batch_size=16)
    return transformer
