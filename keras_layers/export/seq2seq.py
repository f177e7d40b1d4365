"""Encoder-decoders (`Seq2SeqLM`): the protocol read, the encoder's file and the decoder's.

The first pieces of `--task seq2seq-lm` (issue #44; the folder, `generate`
and the command-line task follow). A model is
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

A plain Keras model with these three methods exports too (the TensorFlow
tutorial's Transformer in `examples/translate.py`); its optional
`decoder_start_token_ids`, `end_token_id` and `pad_token_id` attributes
stand in for a preprocessor's (`seq2seq_folder.special_ids`).

The cross-attention keys and values depend on the encoder's output alone, so
they are computed once per input: by the encoder's file, beside its output,
as onnxruntime-genai's Whisper encoder returns them (`encoder_model`). Every
decoder step then reads them and never projects the encoder's output again:
the decoder's file (`trace_decoder`, the pipeline's task `seq2seq-decoder`)
takes `input_ids`, `encoder_attention_mask` and optimum's
`past_key_values.{i}.decoder/encoder.key/value`, its own past growing by the
new tokens from an empty one, and returns `logits` and
`present.{i}.decoder.key/value` (optimum's `decoder_with_past` file, which
also serves the first step). It is checked against Keras' own cached calls
over a prompt and teacher-forced steps, on a padded encoder batch
(`decoder_references`, `validate_decoder`).
"""

import inspect
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from keras_layers.export import validating
from keras_layers.export.axes import PAST_AXIS
from keras_layers.export.causal_lm import _cache_writes_as_appends, _merge
from keras_layers.export.compat import original, patched
from keras_layers.export.errors import UsageError, one_line
from keras_layers.export.loading import TensorInfo
from keras_layers.export.seq2seq_generation import EncoderInput, decoder_stepper
from keras_layers.export.tracing import trace_call

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
# The cross-attention projections' inputs: the merged decoder's (optimum's).
CROSS_INPUTS = ("encoder_hidden_states", "encoder_attention_mask")
# An audio encoder's: optimum's waveform input, and the mask over its output
# frames that the decoder's cross-attention reads (the encoder's convolutions
# shorten the sequence, so the input's mask is not the decoder's).
AUDIO_INPUT = "input_values"
ENCODER_MASK_OUTPUT = "encoder_attention_mask"
# Each row's waveform in the decoder's check (audio encoders): long enough for
# several output frames, different, so the frames' mask pads.
AUDIO_LENGTHS = (4096, 2560, 1536)
# An image-prompted encoder's image input (keras-hub's name; NHWC, as Keras reads it).
IMAGE_INPUT = "images"


def cross_names(layers: int) -> list[str]:
    """`present.{i}.encoder.key/value` for each decoder layer, key first."""
    return [f"present.{i}.encoder.{kind}" for i in range(layers) for kind in ("key", "value")]


@dataclass(frozen=True)
class Seq2Seq(EncoderInput):
    """What the export reads of an encoder-decoder by running it once."""

    layers: int  # decoder layers, each with a self- and a cross-attention cache
    heads: int
    head_size: int
    hidden: int  # the encoder output's width
    vocabulary: int
    dtype: str  # the caches' (the model's compute dtype)
    encoder_input: str = "ids"  # "audio": a waveform; "image": images and a prompt's ids
    channels: int | None = None  # an audio input's last axis (None: (batch, samples))
    image_shape: tuple | None = None  # an image input's (height, width, channels)
    min_samples: int | None = None  # the fewest samples a waveform takes (one frame out)
    max_samples: int | None = None  # the most it takes (a position table), None: unbounded

    @property
    def audio_lengths(self) -> tuple:
        """The check's waveform lengths: `AUDIO_LENGTHS`, scaled down to
        the most samples the encoder takes."""
        longest = max(AUDIO_LENGTHS)
        if self.max_samples is None or self.max_samples >= longest:
            return AUDIO_LENGTHS
        return tuple(max(1, n * self.max_samples // longest) for n in AUDIO_LENGTHS)


def _refuse(model, why: str) -> UsageError:
    return UsageError(
        "--task seq2seq-lm needs an encoder-decoder following keras-hub's Seq2SeqLM protocol "
        "(`call_encoder(token_ids, padding_mask)`, `call_decoder_with_cache` with the "
        "arguments " + ", ".join(DECODER_ARGUMENTS) + ", and `_initialize_cache`), as "
        f"BartSeq2SeqLM and T5Seq2SeqLM do; {type(model).__name__} {why}. A decoder-only "
        "model exports with --task causal-lm"
    )


# T5Gemma's and T5Gemma2's form of `call_decoder_with_cache`: both caches in
# one tuple, one index, and the encoder's output after them.
TUPLE_CACHE_ARGUMENTS = (
    "decoder_token_ids",
    "decoder_padding_mask",
    "cache",
    "cache_update_index",
    "encoder_output",
    "encoder_padding_mask",
)


class Adapter:
    """The protocol over a keras-hub model whose methods take another form:
    `call_encoder` returns `(output, mask)` (the mask the decoder's
    cross-attention reads), and a subclass's `_decode` runs the decoder.

    Args:
        model: the keras-hub model.
    """

    encoder_input = "ids"
    max_samples = None  # the most samples (or frames) an audio encoder takes

    def __init__(self, model):
        self.model = model

    def call_encoder_with_mask(self, inputs, padding_mask):
        """The encoder's output and the mask its decoder reads.

        Args:
            inputs: what the model's encoder reads (ids, a waveform, or
                `(ids, images)`).
            padding_mask: True on its tokens (or samples).

        Returns:
            `(hidden, mask)`, the mask (batch, encoder output length).
        """
        return tuple(self.model.call_encoder(inputs, padding_mask))

    def call_encoder(self, inputs, padding_mask):
        """The protocol's `call_encoder`: `call_encoder_with_mask`'s output alone.

        Args:
            inputs: what the model's encoder reads.
            padding_mask: True on its tokens (or samples).

        Returns:
            The encoder's output (batch, length, hidden).
        """
        return self.call_encoder_with_mask(inputs, padding_mask)[0]

    def call_decoder_with_cache(
        self,
        encoder_hidden_states,
        encoder_padding_mask,
        decoder_token_ids,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        cross_attention_cache_update_index=None,
    ):
        """The protocol's cached decoder call (`seq2seq`'s docstring).

        Args:
            encoder_hidden_states: the encoder's output.
            encoder_padding_mask: the mask the decoder reads over it.
            decoder_token_ids: the new tokens (batch, n).
            self_attention_cache: (batch, layers, 2, length, heads, head size).
            self_attention_cache_update_index: where the new tokens go.
            cross_attention_cache: the encoder's keys and values, read when
                `cross_attention_cache_update_index` is None.
            cross_attention_cache_update_index: 0 to compute them from
                `encoder_hidden_states`.

        Returns:
            `(logits, hidden_states, self_attention_cache, cross_attention_cache)`.
        """
        index = self_attention_cache_update_index
        return self._decode(
            encoder_hidden_states,
            encoder_padding_mask,
            decoder_token_ids,
            self_attention_cache,
            0 if index is None else index,
            cross_attention_cache,
            cross_attention_cache_update_index is not None,
        )

    def _decode(self, hidden, mask, ids, own, index, cross, computed) -> tuple:
        """`(logits, hidden, own cache, cross cache)`; the cross-attention
        cache computed from `hidden` when `computed`, else read from `cross`."""
        raise NotImplementedError


class TupleCaches(Adapter):
    """keras-hub's T5Gemma and T5Gemma2, whose `call_decoder_with_cache(
    decoder_token_ids, decoder_padding_mask, cache=(self, cross),
    cache_update_index, encoder_output, encoder_padding_mask)` computes the
    cross-attention keys and values when the tuple's cross cache is None and
    reads them otherwise. The cache layout is the protocol's: (batch, layers,
    2, length, key/value heads, head size).
    """

    def _decode(self, hidden, mask, ids, own, index, cross, computed) -> tuple:
        logits, states, (own, cross) = self.model.call_decoder_with_cache(
            decoder_token_ids=ids,
            decoder_padding_mask=None,
            cache=(own, None if computed else cross),
            cache_update_index=index,
            encoder_output=hidden,
            encoder_padding_mask=mask,
        )
        return logits, states, own, cross

    def _initialize_cache(self, encoder_token_ids, decoder_token_ids):
        backbone = self.model.backbone
        sizes = (backbone.decoder_num_key_value_heads, backbone.decoder_head_dim)
        return _zero_caches(self.model, backbone.decoder_num_layers, sizes, encoder_token_ids,
                            decoder_token_ids)  # fmt: skip


def _zero_caches(model, layers: int, sizes: tuple, encoder_ids, decoder_ids) -> tuple:
    """The self- and the cross-attention caches, zero: (batch, layers, 2,
    length, heads, head size), at the decoder's and the encoder's lengths."""
    from keras import ops

    batch = ops.shape(encoder_ids)[0]
    return tuple(
        ops.zeros((batch, layers, 2, ops.shape(ids)[1], *sizes), model.compute_dtype)
        for ids in (decoder_ids, encoder_ids)
    )


class AudioEncoderCalls(Adapter):
    """keras-hub's Moonshine (`MoonshineAudioToText`): `call_encoder(
    encoder_input_values, padding_mask)` reads a waveform (batch, samples,
    1) and returns the mask over the output frames its strided convolutions
    leave; its own cached call takes one token at a time (the rotary position
    of the cache index alone), and its cross-attention keys and values are
    projected outside it (`_build_cache`). Here a call takes any number of
    new tokens, at positions from the cache index on, and computes the
    cross-attention cache from the encoder's output with the model's own
    layers, as `_build_cache` does.
    """

    encoder_input = "audio"

    def _decode(self, hidden, mask, ids, own, index, cross, computed) -> tuple:
        from keras import ops

        backbone = self.model.backbone
        if computed:
            cross = ops.stack(
                [
                    ops.stack(
                        [
                            block.cross_attention._key_dense(hidden),
                            block.cross_attention._value_dense(hidden),
                        ],
                        axis=1,
                    )
                    for block in backbone.decoder_blocks
                ],
                axis=1,
            )
        x = backbone.token_embedding(ids)
        positions = ops.arange(0, ops.shape(ids)[1], dtype="int32") + index
        rotary = backbone.decoder_rotary_embedding(positions)
        caches = []
        for i, block in enumerate(backbone.decoder_blocks):
            x, cache = block(
                decoder_sequence=x,
                encoder_sequence=hidden,
                rotary_embedding=rotary,
                encoder_padding_mask=mask,
                self_attention_cache=own[:, i, ...],
                self_attention_cache_update_index=index,
                cross_attention_cache=cross[:, i, ...],
                training=False,
            )
            caches.append(cache)
        states = backbone.decoder_post_norm(x)
        logits = backbone.token_embedding(states, reverse=True)
        return logits, states, ops.stack(caches, axis=1), cross

    def _initialize_cache(self, encoder_token_ids, decoder_token_ids):
        """Both caches, zero; `encoder_token_ids` stands for the encoder's
        output frames (its shape is what is read)."""
        backbone = self.model.backbone
        heads = backbone.decoder_num_heads
        size = backbone.hidden_dim // heads
        multiple = backbone.pad_head_dim_to_multiple_of
        if multiple is not None:
            size = (size + multiple - 1) // multiple * multiple
        return _zero_caches(self.model, backbone.decoder_num_layers, (heads, size),
                            encoder_token_ids, decoder_token_ids)  # fmt: skip


class FeatureEncoderCalls(Adapter):
    """keras-hub's Whisper (`WhisperBackbone`), which has no cached calls: its
    encoder reads log-mel features (batch, frames, mels), a waveform of `mels`
    channels here, attends to every frame (Whisper pads its audio to 30
    seconds of silence and masks nothing, so the mask returned is all ones
    over the frames its stride-2 convolution leaves), and holds at most
    `max_encoder_sequence_length` frames (its position table). The decoder is
    run as the backbone's functional graph runs it, layer by layer, with
    keras-hub's `TransformerDecoder` caches (computed at cross index 0, read
    at None), and the logits are the token embedding reversed (Whisper ties
    its output projection to it).
    """

    encoder_input = "audio"

    @property
    def max_samples(self) -> int:
        return int(self.model.max_encoder_sequence_length)

    def call_encoder_with_mask(self, inputs, padding_mask):
        """Whisper's encoder on features (batch, frames, mels).

        Args:
            inputs: the features.
            padding_mask: read for its batch alone (Whisper masks no frame).

        Returns:
            `(hidden, mask)`, the mask all True over the output frames.
        """
        import keras
        from keras import ops

        backbone = self.model
        x = keras.activations.gelu(backbone.encoder_conv_layer_1(inputs), approximate=False)
        x = backbone.encoder_padder(x)
        x = keras.activations.gelu(backbone.encoder_conv_layer_2(x), approximate=False)
        x = backbone.encoder_embeddings_add((x, backbone.encoder_position_embedding(x)))
        for layer in backbone.encoder_transformer_layers:
            x = layer(x, training=False)
        hidden = backbone.encoder_layer_norm(x)
        return hidden, ops.ones(ops.shape(hidden)[:2], "bool")

    def _decode(self, hidden, mask, ids, own, index, cross, computed) -> tuple:
        from keras import ops

        backbone = self.model
        x = backbone.decoder_embeddings(ids, start_index=index)
        owns, crosses = [], []
        for i, layer in enumerate(backbone.decoder_transformer_layers):
            x, layer_own, layer_cross = layer(
                decoder_sequence=x,
                encoder_sequence=hidden,
                encoder_padding_mask=mask,
                self_attention_cache=own[:, i, ...],
                self_attention_cache_update_index=index,
                cross_attention_cache=cross[:, i, ...],
                cross_attention_cache_update_index=0 if computed else None,
                training=False,
            )
            owns.append(layer_own)
            crosses.append(layer_cross)
        states = backbone.decoder_layer_norm(x)
        logits = backbone.token_embedding(states, reverse=True)
        return logits, states, ops.stack(owns, axis=1), ops.stack(crosses, axis=1)

    def forward_logits(self, inputs, token_ids):
        """The backbone's own forward pass (no cache, none of this class's
        calls): the logits at every position of `token_ids`.

        Args:
            inputs: features (batch, frames, mels).
            token_ids: the decoder's tokens (batch, n).

        Returns:
            The logits (batch, n, vocabulary).
        """
        from keras import ops

        outputs = self.model(
            {
                "encoder_features": ops.convert_to_tensor(inputs),
                "decoder_token_ids": ops.convert_to_tensor(token_ids),
                "decoder_padding_mask": ops.ones_like(ops.convert_to_tensor(token_ids)),
            },
            training=False,
        )
        return self.model.token_embedding(outputs["decoder_sequence_output"], reverse=True)

    def _initialize_cache(self, encoder_token_ids, decoder_token_ids):
        """Both caches, zero; `encoder_token_ids` stands for the encoder's
        output frames (its shape is what is read)."""
        backbone = self.model
        heads = backbone.num_heads
        sizes = (heads, backbone.hidden_dim // heads)
        return _zero_caches(self.model, backbone.num_layers, sizes, encoder_token_ids,
                            decoder_token_ids)  # fmt: skip


class ImagePromptCalls(Adapter):
    """keras-hub's BLIP-2 (`BLIP2Seq2SeqLM`): `call_encoder(
    encoder_token_ids, encoder_padding_mask, images)` prepends the image's
    Q-Former queries to the prompt and returns their mask with the prompt's,
    (batch, 1, length); `call_decoder_with_cache(decoder_token_ids,
    encoder_hidden_states, encoder_attention_mask, ...)` takes that mask
    and the protocol's caches and indices. `inputs` here is `(token_ids,
    images)`, and the mask the decoder reads is (batch, length).
    """

    encoder_input = "image"

    def call_encoder_with_mask(self, inputs, padding_mask):
        """BLIP-2's encoder on images and a prompt.

        Args:
            inputs: `(token_ids, images)`.
            padding_mask: True (or 1) on the prompt's tokens.

        Returns:
            `(hidden, mask)`: the queries and the prompt, and their mask
            (batch, queries + prompt length).
        """
        from keras import ops

        token_ids, images = inputs
        padding_mask = ops.cast(padding_mask, "int32")  # concatenated with its queries' mask
        hidden, mask = self.model.call_encoder(token_ids, padding_mask, images)
        return hidden, ops.reshape(mask, (ops.shape(mask)[0], ops.shape(mask)[-1]))

    def _decode(self, hidden, mask, ids, own, index, cross, computed) -> tuple:
        from keras import ops

        return self.model.call_decoder_with_cache(
            decoder_token_ids=ids,
            encoder_hidden_states=hidden,
            encoder_attention_mask=ops.cast(mask, "int32")[:, None, :],
            self_attention_cache=own,
            self_attention_cache_update_index=index,
            cross_attention_cache=cross,
            cross_attention_cache_update_index=0 if computed else None,
        )

    def _initialize_cache(self, encoder_token_ids, decoder_token_ids):
        """`encoder_token_ids` stands for the encoder's output (its shape is read)."""
        return self.model._initialize_cache(encoder_token_ids, decoder_token_ids)


def encoder_outputs(calls, inputs, padding_mask) -> tuple:
    """The encoder's output and the mask the decoder's cross-attention reads:
    the input's own, or the one an audio encoder returns over its frames.

    Args:
        calls: the protocol (`protocol(model)`).
        inputs: the encoder's ids or waveform.
        padding_mask: True on its tokens or samples.

    Returns:
        `(hidden, mask)`.
    """
    if hasattr(calls, "call_encoder_with_mask"):
        return tuple(calls.call_encoder_with_mask(inputs, padding_mask))
    return calls.call_encoder(inputs, padding_mask), padding_mask


def _is_whisper(model) -> bool:
    """keras-hub's `WhisperBackbone` (or a subclass): its layers by name."""
    return all(
        hasattr(model, name)
        for name in ("encoder_conv_layer_2", "encoder_padder", "decoder_transformer_layers")
    )


def protocol(model):
    """`model` itself when its methods are the protocol's; `TupleCaches`
    over it when they are T5Gemma's form, `AudioEncoderCalls` when Moonshine's,
    `ImagePromptCalls` when BLIP-2's.

    Args:
        model: an encoder-decoder.

    Returns:
        An object with the protocol's three methods (`describe` checks them).
    """
    if _is_whisper(model):
        return FeatureEncoderCalls(model)
    method = getattr(model, "call_decoder_with_cache", None)
    if not callable(method) or not callable(getattr(model, "call_encoder", None)):
        return model
    parameters = inspect.signature(method).parameters
    if all(name in parameters for name in DECODER_ARGUMENTS):
        return model
    encoder = inspect.signature(model.call_encoder).parameters
    if "encoder_input_values" in encoder and "cross_attention_cache" in parameters:
        return AudioEncoderCalls(model)
    if "images" in encoder and "encoder_attention_mask" in parameters:
        return ImagePromptCalls(model)
    if all(name in parameters for name in TUPLE_CACHE_ARGUMENTS):
        return TupleCaches(model)
    return model


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

    calls = protocol(model)
    for method in ("call_encoder", "call_decoder_with_cache", "_initialize_cache"):
        if not callable(getattr(calls, method, None)):
            raise _refuse(model, f"has no `{method}` method")
    parameters = inspect.signature(calls.call_decoder_with_cache).parameters
    missing = [name for name in DECODER_ARGUMENTS if name not in parameters]
    if missing:
        raise _refuse(model, f"names no {', '.join(missing)} in `call_decoder_with_cache`")
    kind = calls.encoder_input if isinstance(calls, Adapter) else "ids"
    audio = kind == "audio"
    channels = _audio_channels(model) if audio else None
    image_shape = _image_shape(model) if kind == "image" else None
    longest = getattr(calls, "max_samples", None)
    ids, mask = _probe(kind, channels, image_shape, longest)
    what = {"audio": f"a {mask.shape[1]}-sample waveform", "image": "an image and 3 tokens"}
    what = what.get(kind, "a 3-token input")
    try:
        hidden, mask = encoder_outputs(calls, ids, mask)
        frames = ops.zeros(ops.shape(hidden)[:2], "int32")
        self_cache, cross_cache = calls._initialize_cache(frames, frames[:, :1])
        logits = _first_step(model, hidden, mask)[0]
    except Exception as error:  # noqa: BLE001 - the model's own failure, named
        detail = one_line(f"{type(error).__name__}: {error}", 200)
        raise _refuse(model, f"fails on {what} ({detail})") from error
    try:  # a prompt of several tokens in one call, into a longer cache
        _first_step(model, hidden, mask, ops.ones((1, 2), "int32"), room=1)
    except Exception as error:  # noqa: BLE001 - the model's own failure, named
        detail = one_line(f"{type(error).__name__}: {error}", 200)
        raise UsageError(
            f"--task seq2seq-lm: {type(model).__name__}'s own `call_decoder_with_cache` fails "
            f"on 2 new tokens written into a cache of 3 ({detail}): it decodes one token a "
            "call, and the decoder's file takes a prompt of several tokens in one call, as "
            "keras-hub's other Seq2SeqLMs do. Not exportable as a folder today"
        ) from error
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
        encoder_input=kind,
        channels=channels,
        image_shape=image_shape,
        min_samples=_fewest_samples(calls, channels) if audio else None,
        max_samples=longest,
    )


def _frames(calls, samples: int, channels: int | None) -> int:
    """How many frames the encoder leaves of `samples` samples (0 where it fails)."""
    from keras import ops

    shape = (1, samples) if channels is None else (1, samples, channels)
    try:
        _, mask = encoder_outputs(calls, np.zeros(shape, "float32"), ops.ones((1, samples), "bool"))
    except Exception:  # noqa: BLE001 - too short for the model's convolutions
        return 0
    return int(np.asarray(mask).astype(bool).sum())


def _fewest_samples(calls, channels: int | None) -> int:
    """The fewest samples that leave the encoder one frame: fewer fail in
    ONNX Runtime's convolution, or leave a row the decoder cannot attend to."""
    high = 1
    while _frames(calls, high, channels) == 0:
        if high >= 2**20:
            return high
        high *= 2
    low = high // 2  # leaves no frame (or is 0)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if _frames(calls, middle, channels) else (middle, high)
    return high


def _audio_channels(model) -> int | None:
    """An audio encoder's last input axis (1 for Moonshine's (batch, samples,
    1), the mels of Whisper's features (batch, frames, mels)), read from the
    backbone's audio input; None for (batch, samples)."""
    backbone = getattr(model, "backbone", model)
    inputs = getattr(backbone, "input", None)
    inputs = inputs if isinstance(inputs, dict) else {}
    values = inputs.get("encoder_input_values", inputs.get("encoder_features"))
    shape = tuple(values.shape) if values is not None else (None, None, 1)
    return shape[2] if len(shape) == 3 else None


def _image_shape(model) -> tuple:
    """An image-prompted encoder's (height, width, channels), from the
    backbone's `images` input (fixed: a ViT's position table)."""
    backbone = getattr(model, "backbone", model)
    inputs = getattr(backbone, "input", None)
    images = inputs.get(IMAGE_INPUT) if isinstance(inputs, dict) else None
    shape = tuple(images.shape)[1:] if images is not None else ()
    if len(shape) != 3 or not all(isinstance(size, int) for size in shape):
        raise _refuse(model, f"reads images of shape {shape}, not of a fixed height and width")
    return shape


def _probe(kind: str, channels: int | None, image_shape: tuple | None, longest=None) -> tuple:
    """`describe`'s input: 3 token ids (with an image), or the longest
    waveform of the check."""
    from keras import ops

    if kind == "image":
        image = np.random.default_rng(0).uniform(0, 1, (1, *image_shape)).astype("float32")
        ids = ops.ones((1, 3), "int32")
        return (ids, ops.convert_to_tensor(image)), ops.ones((1, 3), "int32")
    if kind != "audio":
        return ops.ones((1, 3), "int32"), ops.ones((1, 3), "bool")
    samples = min(max(AUDIO_LENGTHS), longest or max(AUDIO_LENGTHS))
    shape = (1, samples) if channels is None else (1, samples, channels)
    values = np.random.default_rng(0).uniform(-1, 1, shape).astype("float32")
    return ops.convert_to_tensor(values), ops.ones((1, samples), "bool")


def _first_step(model, hidden, padding_mask, ids=None, room: int = 0) -> tuple:
    """The model's cached decoder call on `ids` (default one token, id 0)
    at index 0 of both caches, zero, that it builds for `hidden` (the
    self-attention one `room` slots longer than `ids`): both caches written,
    the cross-attention one from `hidden` whole."""
    from keras import ops

    model = protocol(model)
    if ids is None:
        ids = ops.zeros(ops.shape(hidden)[:2], "int32")[:, :1]
    encoder_ids = ops.zeros(ops.shape(hidden)[:2], "int32")
    slots = ops.zeros((ops.shape(ids)[0], ops.shape(ids)[1] + room), "int32")
    self_cache, cross_cache = model._initialize_cache(encoder_ids, slots)
    return model.call_decoder_with_cache(
        encoder_hidden_states=hidden,
        encoder_padding_mask=padding_mask,
        decoder_token_ids=ids,
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

    Args:
        model: an encoder-decoder (`describe`).
        hidden: the encoder's output (batch, encoder length, hidden).
        padding_mask: True on the encoder's tokens (batch, encoder length).
        layers: the decoder's layers.

    Returns:
        `2 * layers` tensors: layer 0's keys, its values, layer 1's keys, ...
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
        # An audio encoder's waveform input is read inside this layer's call,
        # where the pipeline cannot see the strided convolution (`audio.describe`).
        reads_waveform = description.audio

        def __init__(self, seq2seq, **kwargs):
            super().__init__(**kwargs)
            self.seq2seq = seq2seq

        def call(self, token_ids, attention_mask, images=None):
            mask = keras.ops.cast(attention_mask, "bool")
            if description.image:
                token_ids = (token_ids, images)
            hidden, frames = encoder_outputs(protocol(self.seq2seq), token_ids, mask)
            cross = cross_attention(self.seq2seq, hidden, frames, layers)
            if not description.masks_itself:
                return [hidden, *cross]
            return [hidden, *cross, keras.ops.cast(frames, "int32")]

    if description.audio:
        shape = (None,) if description.channels is None else (None, description.channels)
        ids = keras.Input(shape, dtype="float32", name=AUDIO_INPUT)
    else:
        ids = keras.Input((None,), dtype="int32", name=ENCODER_INPUTS[0])
    mask = keras.Input((None,), dtype="int32", name=ENCODER_INPUTS[1])
    inputs = {ids.name: ids, "attention_mask": mask}
    if description.image:
        images = keras.Input(description.image_shape, dtype="float32", name=IMAGE_INPUT)
        inputs[IMAGE_INPUT] = images
        outputs = EncoderSide(model, name="encoder_side")(ids, mask, images)
    else:
        outputs = EncoderSide(model, name="encoder_side")(ids, mask)
    names = [ENCODER_OUTPUT, *cross_names(layers)]
    if description.masks_itself:
        names.append(ENCODER_MASK_OUTPUT)
    named = {
        name: keras.layers.Identity(name=name.replace(".", "_"))(tensor)
        for name, tensor in zip(names, outputs, strict=True)
    }
    return keras.Model(inputs, named, name="encoder_model")


def cross_model(model, description: Seq2Seq | None = None):
    """The cross-attention projections alone, as a functional Keras model:
    what the merged decoder's first step computes (`merged_decoder`).

    Args:
        model: an encoder-decoder (`describe`).
        description: its sizes (default: `describe(model)`).

    Returns:
        A `keras.Model` from `encoder_hidden_states` (batch, encoder length,
        hidden) and `encoder_attention_mask` (1 on the encoder's tokens) to
        each decoder layer's `present.{i}.encoder.key/value`, for the
        forward pipeline, which converts, slims and proves it.

    Example:

    >>> import keras_hub
    >>> backbone = keras_hub.models.BartBackbone(vocabulary_size=40, num_layers=1,
    ...     num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=16)
    >>> model = keras_hub.models.BartSeq2SeqLM(backbone)
    >>> [tuple(output.shape) for output in cross_model(model).outputs]
    [(None, 2, None, 4), (None, 2, None, 4)]
    """
    import keras

    description = description or describe(model)
    layers = description.layers

    class CrossSide(keras.layers.Layer):
        def __init__(self, seq2seq, **kwargs):
            super().__init__(**kwargs)
            self.seq2seq = seq2seq

        def call(self, hidden, attention_mask):
            mask = keras.ops.cast(attention_mask, "bool")
            return cross_attention(self.seq2seq, hidden, mask, layers)

    hidden = keras.Input((None, description.hidden), dtype=description.dtype, name=CROSS_INPUTS[0])
    mask = keras.Input((None,), dtype="int32", name=CROSS_INPUTS[1])
    outputs = CrossSide(model, name="cross_side")(hidden, mask)
    named = {
        name: keras.layers.Identity(name=name.replace(".", "_"))(tensor)
        for name, tensor in zip(cross_names(layers), outputs, strict=True)
    }
    return keras.Model({hidden.name: hidden, mask.name: mask}, named, name="cross_model")


# --- the decoder, one step per call ----------------------------------------------

# The decoder file's inputs besides its caches (optimum's decoder_with_past names).
DECODER_INPUTS = ("input_ids", "encoder_attention_mask")
# Teacher-forced decode steps of the decoder's check, after a prompt of
# `DECODER_PROMPT` tokens, over encoder inputs of these lengths (padded).
DECODE_STEPS = 8
DECODER_PROMPT = 3
ENCODER_LENGTHS = (9, 5, 2)


def past_names(layers: int) -> list[str]:
    """optimum's past names, per layer: the decoder's key and value, then the encoder's."""
    return [
        f"past_key_values.{i}.{side}.{kind}"
        for i in range(layers)
        for side in ("decoder", "encoder")
        for kind in ("key", "value")
    ]


def _cache_info(description: Seq2Seq, name: str, sequence: str):
    shape = (None, description.heads, None, description.head_size)
    axes = ("batch", description.heads, sequence, description.head_size)
    return TensorInfo(name, shape, description.dtype, axes=axes)


def decoder_inputs(description: Seq2Seq) -> list:
    """`input_ids`, `encoder_attention_mask`, then `past_names`' caches."""
    ids = TensorInfo(DECODER_INPUTS[0], (None, None), "int32", role="ids")
    ids.axes = ("batch", "sequence")
    mask = TensorInfo(DECODER_INPUTS[1], (None, None), "int32")
    mask.axes = ("batch", "encoder_sequence")
    caches = [
        _cache_info(description, name, PAST_AXIS if ".decoder." in name else "encoder_sequence")
        for name in past_names(description.layers)
    ]
    return [ids, mask, *caches]


def decoder_outputs(description: Seq2Seq) -> list:
    """`logits`, then `present.{i}.decoder.key/value` (the past and the new tokens)."""
    logits = TensorInfo("logits", (None, None, description.vocabulary), description.dtype)
    logits.axes = ("batch", "sequence", description.vocabulary)
    layers = range(description.layers)
    names = [f"present.{i}.decoder.{kind}" for i in layers for kind in ("key", "value")]
    return [logits, *(_cache_info(description, name, "total_sequence") for name in names)]


def trace_decoder(loaded, description: Seq2Seq):
    """One decoder step as a `tf.function`: the new tokens attend to the
    past and to the encoder's keys and values, which are read, never
    recomputed (the model's cached call with cross index `None`).

    Args:
        loaded: the loaded encoder-decoder, whose weights become inputs.
        description: its sizes (`describe`).

    Returns:
        The traced function (`tracing.trace_call`), for `converting.convert`.

    Raises:
        UsageError: the model fails in Keras itself.
        ConversionError: it uses Python control flow on a tensor's value.
    """
    import tensorflow as tf

    model, layers = protocol(loaded.model), description.layers
    inputs = decoder_inputs(description)
    specs = [tf.TensorSpec(info.shape, info.dtype, name=info.name) for info in inputs]
    swap = [0, 2, 1, 3]  # optimum's (batch, heads, length, size) <-> keras-hub's

    def call(token_ids, encoder_mask, *past):
        new, start = tf.shape(token_ids)[1], tf.shape(past[0])[2]
        selves, crosses, pasts = [], [], {}
        for layer in range(layers):
            own, cross = past[4 * layer : 4 * layer + 2], past[4 * layer + 2 : 4 * layer + 4]
            grown = []
            for kind, cache in enumerate(own):
                cache = pasts[layer, kind] = tf.transpose(cache, swap)
                room = tf.zeros(tf.stack([tf.shape(cache)[0], new, *cache.shape[2:]]), cache.dtype)
                grown.append(tf.concat([cache, room], axis=1))
            selves.append(tf.stack(grown, axis=1))
            crosses.append(tf.stack([tf.transpose(c, swap) for c in cross], axis=1))
        stacked, cross_cache = tf.stack(selves, axis=1), tf.stack(crosses, axis=1)
        # Only the cross-attention mask reads it (its width is the encoder's length).
        shape = tf.stack([tf.shape(encoder_mask)[0], tf.shape(encoder_mask)[1], description.hidden])
        unread = tf.zeros(shape, description.dtype)
        with _cache_writes_as_appends(start, stacked, pasts):
            logits, _, cache, _ = model.call_decoder_with_cache(
                encoder_hidden_states=unread,
                encoder_padding_mask=tf.cast(encoder_mask, "bool"),
                decoder_token_ids=token_ids,
                self_attention_cache=stacked,
                self_attention_cache_update_index=start,
                cross_attention_cache=cross_cache,
                cross_attention_cache_update_index=None,
            )
        present = [tf.transpose(cache[:, i, k], swap) for i in range(layers) for k in (0, 1)]
        return [tf.cast(logits, description.dtype), *present]

    names = [info.name for info in decoder_outputs(description)]
    return trace_call(loaded, call, specs, names)


@dataclass
class DecoderReference:
    """Keras' side of the decoder's check: its cached calls, teacher-forced."""

    encoder_ids: "object"  # what the encoder reads: (batch, length) ids, 0 on padding, or waves
    encoder_input_mask: "object"  # (batch, length) int32, 0 on padding
    encoder_mask: "object"  # the decoder's: over the encoder's output, int32
    cross: list  # the encoder's keys and values, optimum's layout, per layer
    tokens: list  # the prompt, then the token fed at each step (batch, n)
    logits: list  # Keras' logits of each call


def _encoder_inputs(description: Seq2Seq, rng) -> tuple:
    """The check's encoder inputs, right-padded: ids of `ENCODER_LENGTHS`
    tokens, or waveforms of `AUDIO_LENGTHS` samples, and their mask."""
    lengths = np.array(description.audio_lengths if description.audio else ENCODER_LENGTHS)
    mask = (np.arange(lengths.max()) < lengths[:, None]).astype("int32")
    if description.audio:
        shape = mask.shape if description.channels is None else (*mask.shape, description.channels)
        waves = rng.uniform(-1, 1, shape).astype("float32")
        masked = mask if description.channels is None else mask[..., None]
        return (waves * masked).astype("float32"), mask
    ids = np.where(mask, rng.integers(1, description.vocabulary, mask.shape), 0).astype("int32")
    if description.image:
        images = rng.uniform(0, 1, (len(ids), *description.image_shape)).astype("float32")
        return (ids, images), mask
    return ids, mask


def decoder_references(model, description: Seq2Seq) -> DecoderReference:
    """Run Keras' cached decoder over a prompt and `DECODE_STEPS` greedy
    steps, for encoder inputs of `ENCODER_LENGTHS` tokens (or
    `AUDIO_LENGTHS` samples) padded to the longest (so a file that ignores
    the encoder's mask fails).

    Args:
        model: the encoder-decoder.
        description: its sizes (`describe`).

    Returns:
        What `validate_decoder` feeds the file and compares it with.
    """
    from keras import ops

    rng = np.random.default_rng(validating.SEED)
    ids, input_mask = _encoder_inputs(description, rng)
    batch = len(input_mask)
    prompt = rng.integers(1, description.vocabulary, (batch, DECODER_PROMPT)).astype("int32")
    model = protocol(model)
    hidden, mask = encoder_outputs(model, ids, input_mask.astype(bool))
    mask = np.asarray(mask).astype("int32")
    total = np.zeros((batch, DECODER_PROMPT + DECODE_STEPS), "int32")
    self_cache, cross_cache = model._initialize_cache(np.zeros(mask.shape, "int32"), total)
    tokens, logits, index, cross_index = [prompt], [], 0, 0
    for _ in range(DECODE_STEPS + 1):
        out, _, self_cache, cross = model.call_decoder_with_cache(
            encoder_hidden_states=hidden,
            encoder_padding_mask=mask.astype(bool),
            decoder_token_ids=ops.convert_to_tensor(tokens[-1]),
            self_attention_cache=self_cache,
            self_attention_cache_update_index=index,
            cross_attention_cache=cross_cache,
            cross_attention_cache_update_index=cross_index,
        )
        if cross_index == 0:
            cross_cache, cross_index = cross, None
        logits.append(np.asarray(out))
        index += tokens[-1].shape[1]
        tokens.append(logits[-1][:, -1:].argmax(axis=-1).astype("int32"))
    cross = np.asarray(cross_cache)
    layers = range(description.layers)
    layout = [cross[:, i, kind].transpose(0, 2, 1, 3) for i in layers for kind in (0, 1)]
    return DecoderReference(ids, input_mask, mask, layout, tokens[:-1], logits)


def validate_decoder(reference: DecoderReference, onnx_path, atol, rtol, lean_memory=False):
    """Run the decoder's file as generation does, from an empty past, fed
    Keras' own tokens and the encoder's keys and values, and compare each
    call's logits with Keras'.

    Args:
        reference: Keras' side (`decoder_references`).
        onnx_path: the decoder's file.
        atol: absolute tolerance of the logits.
        rtol: relative tolerance, times |Keras' logits|.
        lean_memory: ONNX Runtime without pre-packing and its memory arena
            (`validating.validate`).

    Returns:
        A `validating.Validation`: the prompt's check and the decode steps'
        (ONNX Runtime's own failure as `error`); never raises.
    """
    start = time.perf_counter()
    result = validating.Validation(atol=atol, rtol=rtol)
    session = validating._session(onnx_path, lean_memory)
    if isinstance(session, str):
        result.error = session
        return result
    step = decoder_stepper(session, reference.cross, reference.encoder_mask)
    return check_steps(reference, step, result, start)


def check_steps(reference: DecoderReference, step, result, start=None):
    """Feed `step` Keras' own tokens and compare each call's logits with Keras'.

    Args:
        reference: Keras' side (`decoder_references`).
        step: `step(token_ids) -> logits`, from an empty past (a decoder
            file's `decoder_stepper`, a folder's `Seq2SeqFolder.stepper`).
        result: the `validating.Validation` to fill, with its tolerances.
        start: `time.perf_counter()` when the check began.

    Returns:
        `result`: the prompt's check and the decode steps' (ONNX Runtime's
        own failure as `error`); never raises.
    """
    start = time.perf_counter() if start is None else start
    batch = reference.encoder_mask.shape[0]
    atol, rtol = result.atol, result.rtol
    steps = []
    try:
        calls = zip(reference.tokens, reference.logits, strict=True)
        for call, (tokens, expected) in enumerate(calls):
            logits = step(tokens)
            past = sum(t.shape[1] for t in reference.tokens[:call])
            label = f"decoder {batch}x{tokens.shape[1]} after {past}"
            check = validating.compare(label, "logits", logits, expected, atol, rtol)
            (result.checks if call == 0 else steps).append(check)
    except Exception as error:  # noqa: BLE001 - the file's failure, reported as one
        result.error = f"ONNX Runtime fails on the decoder: {one_line(str(error), 300)}"
        return result
    lengths = ",".join(map(str, reference.encoder_mask.sum(axis=1)))
    result.checks.append(_merge(f"decode steps 1-{len(steps)}, encoder ({lengths})", steps))
    result.seconds = time.perf_counter() - start
    return result
