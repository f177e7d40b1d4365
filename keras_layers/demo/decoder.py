"""A small tied decoder built from our layers that `--task causal-lm` can export.

`ScaledEmbedding` -> `SinusoidalPositionEncoding` -> keras-hub
`TransformerDecoder` blocks (causal, pre-LayerNorm) -> `LayerNormalization` ->
`TiedOutputDense`. It is also the worked example of the protocol a model of
one's own follows to be exported with a key/value cache (keras-hub's
`CausalLM` protocol, `keras_layers.export.causal_lm`):

- `call_with_cache(token_ids, cache, cache_update_index)` -> `(logits,
  hidden_states, cache)`: the same layers as `call`, with the position
  encoding started at `cache_update_index` and each block reading and writing
  its slice of the cache;
- `_build_cache(token_ids)` -> `(hidden_states, cache)`: a zero cache shaped
  (batch, layers, 2, sequence, heads, head size), filled by one call.
"""

import keras
from keras import ops

from keras_layers import ScaledEmbedding, SinusoidalPositionEncoding, TiedOutputDense


@keras.saving.register_keras_serializable(package="keras_layers_demo")
class TiedDecoder(keras.Model):
    """A causal language model whose output projection shares the embedding.

    Args:
        vocabulary: number of token ids.
        width: `d_model`, the embedding and hidden width.
        layers: number of keras-hub `TransformerDecoder` blocks.
        heads: attention heads per block (`width` must be divisible by it).
        intermediate: width of each block's feed-forward layer.
        layout: `SinusoidalPositionEncoding` channel layout.
        dropout: dropout rate inside the blocks (training only).

    Example:

    >>> import numpy as np
    >>> model = TiedDecoder(vocabulary=50, width=16, layers=1, heads=2, intermediate=32)
    >>> ids = np.array([[3, 4, 5]], "int32")
    >>> logits = model({"token_ids": ids, "padding_mask": np.ones_like(ids)})
    >>> tuple(logits.shape)
    (1, 3, 50)
    >>> hidden, cache = model._build_cache(ids)  # what --task causal-lm reads
    >>> tuple(cache.shape)
    (1, 1, 2, 3, 2, 8)
    """

    def __init__(
        self,
        vocabulary: int = 300,
        width: int = 32,
        layers: int = 2,
        heads: int = 4,
        intermediate: int = 64,
        layout: str = "interleave",
        dropout: float = 0.0,
        **kwargs,
    ):
        import keras_hub

        if width % heads:
            raise ValueError(f"width {width} must be divisible by heads {heads}")
        # Built before `super().__init__` wires them (the torch backend allows
        # no attribute assignment before it), kept as attributes after it.
        token_embedding = ScaledEmbedding(vocabulary, width, name="token_embedding")
        position_encoding = SinusoidalPositionEncoding(layout=layout, name="position_encoding")
        blocks = [
            keras_hub.layers.TransformerDecoder(
                intermediate_dim=intermediate,
                num_heads=heads,
                dropout=dropout,
                normalize_first=True,
                name=f"decoder_{index}",
            )
            for index in range(layers)
        ]
        final_norm = keras.layers.LayerNormalization(name="final_norm")
        output = TiedOutputDense(token_embedding, name="logits")

        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")
        hidden = position_encoding(token_embedding(token_ids))
        for block in blocks:
            hidden = block(hidden, decoder_padding_mask=padding_mask)
        logits = output(final_norm(hidden))
        kwargs.setdefault("name", "tied_decoder")
        super().__init__(
            inputs={"token_ids": token_ids, "padding_mask": padding_mask},
            outputs=logits,
            **kwargs,
        )
        self.token_embedding, self.position_encoding = token_embedding, position_encoding
        self.blocks, self.final_norm, self.logits = blocks, final_norm, output
        self.vocabulary, self.width, self.num_layers = vocabulary, width, layers
        self.heads, self.intermediate = heads, intermediate
        self.layout, self.dropout = layout, dropout

    def get_config(self) -> dict:
        return {
            "vocabulary": self.vocabulary,
            "width": self.width,
            "layers": self.num_layers,
            "heads": self.heads,
            "intermediate": self.intermediate,
            "layout": self.layout,
            "dropout": self.dropout,
            "name": self.name,
            "trainable": self.trainable,
        }

    @classmethod
    def from_config(cls, config: dict) -> "TiedDecoder":
        return cls(**config)

    def call_with_cache(self, token_ids, cache, cache_update_index):
        """Logits of `token_ids`, which sit at `cache_update_index ...`, with
        their keys and values written into `cache` (keras-hub's protocol).

        Args:
            token_ids: (batch, new tokens) ids.
            cache: (batch, layers, 2, sequence, heads, head size), key then value.
            cache_update_index: the position of the first of `token_ids`.

        Returns:
            `(logits, hidden states, cache)`, the cache with the new keys and
            values written.
        """
        hidden = self.token_embedding(token_ids)
        hidden = self.position_encoding(hidden, start_index=cache_update_index)
        caches = []
        for index, block in enumerate(self.blocks):
            hidden, block_cache = block(
                hidden,
                self_attention_cache=cache[:, index, ...],
                self_attention_cache_update_index=cache_update_index,
            )
            caches.append(block_cache)
        hidden = self.final_norm(hidden)
        return self.logits(hidden), hidden, ops.stack(caches, axis=1)

    def _build_cache(self, token_ids):
        """A cache for `token_ids`, filled by one `call_with_cache`."""
        batch, length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        head_size = self.width // self.heads
        shape = [batch, self.num_layers, 2, length, self.heads, head_size]
        cache = ops.zeros(shape, dtype=self.compute_dtype)
        _, hidden, cache = self.call_with_cache(token_ids, cache, 0)
        return hidden, cache
