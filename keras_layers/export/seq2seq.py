"""Encoder-decoders (`Seq2SeqLM`): the protocol read, and the encoder's file.

The first piece of `--task seq2seq-lm` (issue #44; the decoder with its
growing self-attention cache, the folder and `generate` follow). A model is
an encoder-decoder here when it follows keras-hub's `Seq2SeqLM` protocol as
BART, T5 and their kin write it:

- `call_encoder(token_ids, padding_mask)` returns the encoder's output,
  (batch, encoder length, hidden);
- `call_decoder_with_cache(encoder_hidden_states, encoder_padding_mask,
  decoder_token_ids, self_attention_cache, self_attention_cache_update_index,
  cross_attention_cache, cross_attention_cache_update_index)` returns
  `(logits, hidden_states, self_attention_cache, cross_attention_cache)`,
  the caches stacked (batch, layers, 2, length, heads, head size), key then
  value; with `cross_attention_cache_update_index=0` it computes the
  cross-attention keys and values from the encoder's output, with `None` it
  reads them from the cache;
- `_initialize_cache(encoder_token_ids, decoder_token_ids)` returns both
  caches, zero, at those lengths.

The cross-attention keys and values depend on the encoder's output alone, so
they are computed once per input: by the encoder's file, beside its output,
as onnxruntime-genai's Whisper encoder returns them (`encoder_model`). Every
decoder step then reads them and never projects the encoder's output again.
"""

import inspect
from contextlib import contextmanager
from dataclasses import dataclass

from keras_layers.export.compat import original, patched
from keras_layers.export.errors import UsageError, one_line

# The arguments of `call_decoder_with_cache` the protocol passes by name.
DECODER_ARGUMENTS = (
    "encoder_hidden_states",
    "encoder_padding_mask",
    "decoder_token_ids",
    "self_attention_cache",
    "self_attention_cache_update_index",
    "cross_attention_cache",
    "cross_attention_cache_update_index",
)
# The encoder file's names: optimum's for its inputs and its output, and the
# cross-attention keys and values named as optimum's decoder returns them.
ENCODER_INPUTS = ("input_ids", "attention_mask")
ENCODER_OUTPUT = "last_hidden_state"


def cross_names(layers: int) -> list[str]:
    """`present.{i}.encoder.key/value` for each decoder layer, key first."""
    return [f"present.{i}.encoder.{kind}" for i in range(layers) for kind in ("key", "value")]


@dataclass(frozen=True)
class Seq2Seq:
    """What the export reads of an encoder-decoder by running it once."""

    layers: int  # decoder layers, each with a self- and a cross-attention cache
    heads: int
    head_size: int
    hidden: int  # the encoder output's width
    vocabulary: int
    dtype: str  # the caches' (the model's compute dtype)


def _refuse(model, why: str) -> UsageError:
    return UsageError(
        "--task seq2seq-lm needs an encoder-decoder following keras-hub's Seq2SeqLM protocol "
        "(`call_encoder(token_ids, padding_mask)`, `call_decoder_with_cache` with the "
        "arguments " + ", ".join(DECODER_ARGUMENTS) + ", and `_initialize_cache`), as "
        f"BartSeq2SeqLM and T5Seq2SeqLM do; {type(model).__name__} {why}. A decoder-only "
        "model exports with --task causal-lm"
    )


def describe(model) -> Seq2Seq:
    """Read an encoder-decoder's caches by running it on a 3-token input.

    Args:
        model: a Keras model.

    Returns:
        Its sizes.

    Raises:
        UsageError: the model does not follow the protocol (what it lacks or
            where it fails is named).
    """
    import keras
    from keras import ops

    for method in ("call_encoder", "call_decoder_with_cache", "_initialize_cache"):
        if not callable(getattr(model, method, None)):
            raise _refuse(model, f"has no `{method}` method")
    parameters = inspect.signature(model.call_decoder_with_cache).parameters
    missing = [name for name in DECODER_ARGUMENTS if name not in parameters]
    if missing:
        raise _refuse(model, f"names no {', '.join(missing)} in `call_decoder_with_cache`")
    ids, mask = ops.ones((1, 3), "int32"), ops.ones((1, 3), "bool")
    try:
        hidden = model.call_encoder(ids, mask)
        self_cache, cross_cache = model._initialize_cache(ids, ids[:, :1])
        logits = _first_step(model, hidden, mask)[0]
    except Exception as error:  # noqa: BLE001 - the model's own failure, named
        detail = one_line(f"{type(error).__name__}: {error}", 200)
        raise _refuse(model, f"fails on a 3-token input ({detail})") from error
    shape = tuple(cross_cache.shape)
    if len(shape) != 6 or shape[2] != 2 or tuple(self_cache.shape)[:3] != shape[:3]:
        raise _refuse(model, f"builds caches of shapes {tuple(self_cache.shape)} and {shape}")
    return Seq2Seq(
        layers=shape[1],
        heads=shape[4],
        head_size=shape[5],
        hidden=int(hidden.shape[-1]),
        vocabulary=int(logits.shape[-1]),
        dtype=keras.backend.standardize_dtype(cross_cache.dtype),
    )


def _first_step(model, hidden, padding_mask) -> tuple:
    """The model's cached decoder call on one token (id 0) at index 0 of both
    caches, zero, that it builds for `hidden`: both caches written, the
    cross-attention one from `hidden` whole."""
    from keras import ops

    ids = ops.zeros(ops.shape(hidden)[:2], "int32")
    self_cache, cross_cache = model._initialize_cache(ids, ids[:, :1])
    return model.call_decoder_with_cache(
        encoder_hidden_states=hidden,
        encoder_padding_mask=padding_mask,
        decoder_token_ids=ids[:, :1],
        self_attention_cache=self_cache,
        self_attention_cache_update_index=0,
        cross_attention_cache=cross_cache,
        cross_attention_cache_update_index=0,
    )


@contextmanager
def _whole_writes():
    """Trace a cache write at index 0 of an update as long as the cache as
    the update itself: the cross-attention cache is written whole, once, from
    the encoder's output, and a general write would pad and select over it."""
    import tensorflow as tf
    from keras.src.backend.tensorflow import core

    general = original(core, "slice_update")

    def slice_update(inputs, start_indices, updates):
        starts = list(start_indices) if isinstance(start_indices, list | tuple) else []
        whole = starts and all(isinstance(s, int) and s == 0 for s in starts)
        if whole and inputs.shape.rank == updates.shape.rank:
            return tf.cast(updates, inputs.dtype)
        return general(inputs, start_indices, updates)

    with patched(core, "slice_update", slice_update):
        yield


def cross_attention(model, hidden, padding_mask, layers: int) -> list:
    """Each decoder layer's cross-attention keys and values of `hidden`, in
    optimum's layout (batch, heads, encoder length, head size), key first.

    Computed by the model's own cached call at cross index 0, on one decoder
    token whose result nothing reads (the conversion drops it).
    """
    from keras import ops

    with _whole_writes():
        cross_cache = _first_step(model, hidden, padding_mask)[3]
    return [
        ops.transpose(cross_cache[:, layer, kind], (0, 2, 1, 3))
        for layer in range(layers)
        for kind in (0, 1)
    ]


def encoder_model(model, description: Seq2Seq | None = None):
    """The encoder's side as a functional Keras model on `model`'s own weights.

    Args:
        model: an encoder-decoder (`describe`).
        description: its sizes (default: `describe(model)`).

    Returns:
        A `keras.Model` from `input_ids` and `attention_mask` (1 on tokens,
        0 on padding; batch, encoder length) to `last_hidden_state` and each
        decoder layer's `present.{i}.encoder.key/value`, for the forward
        pipeline, which converts, slims and proves it on its grid.

    Raises:
        UsageError: the model does not follow the protocol.

    Example:

    >>> import keras_hub
    >>> backbone = keras_hub.models.BartBackbone(vocabulary_size=40, num_layers=1,
    ...     num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=16)
    >>> model = keras_hub.models.BartSeq2SeqLM(backbone)
    >>> encoder = encoder_model(model)
    >>> [tuple(output.shape) for output in encoder.outputs][:2]
    [(None, None, 8), (None, 2, None, 4)]
    """
    import keras

    description = description or describe(model)
    layers = description.layers

    class EncoderSide(keras.layers.Layer):
        def __init__(self, seq2seq, **kwargs):
            super().__init__(**kwargs)
            self.seq2seq = seq2seq

        def call(self, token_ids, attention_mask):
            mask = keras.ops.cast(attention_mask, "bool")
            hidden = self.seq2seq.call_encoder(token_ids, mask)
            cross = cross_attention(self.seq2seq, hidden, mask, layers)
            return [hidden, *cross]

    ids = keras.Input((None,), dtype="int32", name=ENCODER_INPUTS[0])
    mask = keras.Input((None,), dtype="int32", name=ENCODER_INPUTS[1])
    outputs = EncoderSide(model, name="encoder_side")(ids, mask)
    names = [ENCODER_OUTPUT, *cross_names(layers)]
    named = {
        name: keras.layers.Identity(name=name.replace(".", "_"))(tensor)
        for name, tensor in zip(names, outputs, strict=True)
    }
    return keras.Model({"input_ids": ids, "attention_mask": mask}, named, name="encoder_model")
