"""The reference encoder every export benchmark uses.

Vocabulary 30522, d_model 256, `ScaledEmbedding(mask_zero=True)` ->
`SinusoidalPositionEncoding` -> 4 keras-hub `TransformerEncoder(intermediate_dim=1024,
num_heads=4)` -> `TiedOutputDense`: 10,972,672 parameters (43.9 MB in float32),
random weights.
"""

VOCABULARY, WIDTH, LAYERS, INTERMEDIATE, HEADS = 30522, 256, 4, 1024, 4


def build(
    vocabulary=VOCABULARY,
    width=WIDTH,
    layers=LAYERS,
    intermediate=INTERMEDIATE,
    heads=HEADS,
    seed=0,
):
    import keras
    import keras_hub

    from keras_layers import ScaledEmbedding, SinusoidalPositionEncoding, TiedOutputDense

    keras.utils.set_random_seed(seed)
    token_ids = keras.Input((None,), dtype="int32", name="token_ids")
    embedding = ScaledEmbedding(vocabulary, width, mask_zero=True, name="token_embedding")
    hidden = SinusoidalPositionEncoding(name="position_encoding")(embedding(token_ids))
    for index in range(layers):
        hidden = keras_hub.layers.TransformerEncoder(
            intermediate_dim=intermediate, num_heads=heads, name=f"encoder_{index}"
        )(hidden)
    logits = TiedOutputDense(embedding, name="logits")(hidden)
    return keras.Model(token_ids, logits, name="reference_encoder")


if __name__ == "__main__":
    import sys

    model = build()
    print(f"{model.count_params():,} parameters")
    if len(sys.argv) > 1:
        model.save(sys.argv[1])
