"""The one small tied encoder the demo, the tests, the benchmarks and the docs build.

`ScaledEmbedding(mask_zero=True)` -> `SinusoidalPositionEncoding` -> keras-hub
`TransformerEncoder` blocks -> (optional final `LayerNormalization`) ->
`TiedOutputDense` sharing the embedding matrix. Sizes and the few architectural
switches live in `EncoderConfig`, so every caller builds the same model family.
"""

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class EncoderConfig:
    """Sizes and switches of the tied encoder.

    Args:
        vocabulary: number of token ids (id 0 is padding).
        width: `d_model`, the embedding and hidden width.
        layers: number of keras-hub `TransformerEncoder` blocks.
        heads: attention heads per block (`width` must be divisible by it).
        intermediate: width of each block's feed-forward layer.
        normalize_first: pre-LayerNorm blocks (keras-hub's `normalize_first`).
        final_norm: a `LayerNormalization` before the tied output projection.
        layout: `SinusoidalPositionEncoding` channel layout.
        output_bias: whether `TiedOutputDense` adds a bias.
        name: the Keras model's name.
    """

    vocabulary: int = 300
    width: int = 32
    layers: int = 2
    heads: int = 4
    intermediate: int = 64
    normalize_first: bool = False
    final_norm: bool = False
    layout: str = "interleave"
    output_bias: bool = False
    name: str = "tied_encoder"

    def with_(self, **changes) -> "EncoderConfig":
        """A copy with some fields changed."""
        return replace(self, **changes)


# The 11M-parameter model every export benchmark uses: vocabulary 30522,
# d_model 256, 4 blocks of 4 heads with intermediate width 1024.
REFERENCE_ENCODER = EncoderConfig(
    vocabulary=30522, width=256, layers=4, heads=4, intermediate=1024, name="reference_encoder"
)


def build_encoder(config: EncoderConfig = EncoderConfig(), seed: int | None = None):
    """Build the tied encoder of `config` with freshly drawn weights.

    Args:
        config: sizes and switches (see `EncoderConfig`).
        seed: when given, `keras.utils.set_random_seed(seed)` first, so the
            weights are reproducible.

    Returns:
        A functional `keras.Model` from int32 `token_ids` (batch, sequence) to
        float logits (batch, sequence, vocabulary).

    Example:

    >>> model = build_encoder(EncoderConfig(vocabulary=50, width=16, layers=1), seed=0)
    >>> model.output_shape
    (None, None, 50)
    """
    import keras
    import keras_hub

    from keras_layers import ScaledEmbedding, SinusoidalPositionEncoding, TiedOutputDense

    if seed is not None:
        keras.utils.set_random_seed(seed)
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    embedding = ScaledEmbedding(
        config.vocabulary, config.width, mask_zero=True, name="token_embedding"
    )
    hidden = SinusoidalPositionEncoding(layout=config.layout, name="position_encoding")(
        embedding(token_ids)
    )
    for index in range(config.layers):
        hidden = keras_hub.layers.TransformerEncoder(
            intermediate_dim=config.intermediate,
            num_heads=config.heads,
            normalize_first=config.normalize_first,
            name=f"encoder_{index}",
        )(hidden)
    if config.final_norm:
        hidden = keras.layers.LayerNormalization(name="final_norm")(hidden)
    logits = TiedOutputDense(embedding, use_bias=config.output_bias, name="logits")(hidden)
    return keras.Model(token_ids, logits, name=config.name)
