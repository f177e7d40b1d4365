"""Generate with an encoder-decoder folder (`--task seq2seq-lm -o FOLDER/`): ONNX Runtime and NumPy.

The folder (`seq2seq_folder` writes it) holds:

- `encoder_model.onnx`: `input_ids` and `attention_mask` in (a speech
  model: `input_values`, a waveform; an image-prompted one: `images` too);
  the encoder's `last_hidden_state` out and, where the encoder's output is
  not its input's length (speech frames, image queries),
  `encoder_attention_mask`, the mask the decoder reads;
- `decoder_model_merged.onnx` (optimum's, `merged_decoder`): `input_ids`,
  `encoder_attention_mask`, `encoder_hidden_states`, `use_cache_branch` and
  `past_key_values.{i}.decoder/encoder.key/value` in; `logits` and
  `present.{i}.decoder/encoder.key/value` out. The first call (branch
  false, every past empty) projects the encoder's output to each layer's
  cross-attention keys and values and returns them; every later call (branch
  true) is fed them back with its own past, which grows by the new tokens;
- `seq2seq_config.json`: the sizes, the decoder's start tokens, the end and
  pad ids and the positions the model's tables hold (`Seq2SeqFolder`);
- with a model saved with its preprocessor, `tokenizer.json` (its encoder's
  framing inside: start and end tokens, truncation) and, for a SentencePiece
  tokenizer, `spiece.model`, the proto itself, which `generate` encodes and
  decodes with (`SentencePieceText`).

`generate` (the one of `keras_layers.export`, which hands such a folder to
this module) takes what keras-hub's `Seq2SeqLM.generate` takes: text with a
tokenizer; or the encoder's ids (the decoder starts from the folder's start
tokens); or, as keras-hub takes them without a preprocessor, a dict of
`encoder_token_ids`, `encoder_padding_mask`, `decoder_token_ids` and
`decoder_padding_mask` (a speech model's waveforms under
`encoder_input_values`; an image-prompted model's `images` beside the ids).
Decoder prompts of different lengths run in lockstep (`decoding.lockstep`),
as keras-hub's samplers run them. `Seq2SeqFolder` opens the files once for
many calls.

Every argument is checked before the encoder runs, against the folder:
ids within the vocabulary, the encoder's input within its position table
(waveforms: finite, at least the samples the encoder needs for a frame;
images: the model's size), the decoder's prompt and new tokens within its
own. Nothing here imports TensorFlow or Keras.
"""

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from keras_layers.export import decoding
from keras_layers.export.decoding import _said, _shown
from keras_layers.export.errors import DecoderFileError

ENCODER_FILE = "encoder_model.onnx"
DECODER_FILE = "decoder_model_merged.onnx"
# The encoder's output and the merged decoder's inputs that read it (optimum's names).
HIDDEN_OUTPUT = "last_hidden_state"
HIDDEN_INPUT = "encoder_hidden_states"
BRANCH_INPUT = "use_cache_branch"
CONFIG_FILE = "seq2seq_config.json"
# A SentencePiece model's proto, by the name transformers' T5Tokenizer reads.
SENTENCEPIECE_FILE = "spiece.model"
FORMAT = "keras-layers seq2seq-lm"
# The keys a dict of ids may hold: keras-hub's `Seq2SeqLM.generate` inputs.
DICT_KEYS = (
    "encoder_token_ids",
    "encoder_padding_mask",
    "decoder_token_ids",
    "decoder_padding_mask",
)
_AGAIN = "export the model again with --task seq2seq-lm -o FOLDER/"


def is_seq2seq_folder(path) -> bool:
    """Whether `path` is a folder holding `seq2seq_config.json`, or a
    `Seq2SeqFolder` already opened.

    Args:
        path: anything `generate` was given as its file.

    Returns:
        True for a folder `--task seq2seq-lm -o FOLDER/` wrote.
    """
    if isinstance(path, Seq2SeqFolder):
        return True
    if not isinstance(path, str | os.PathLike):
        return False
    try:
        return (Path(path) / CONFIG_FILE).is_file()
    except (OSError, ValueError):
        return False


class EncoderInput:
    """What an encoder reads, from its `encoder_input`: `"ids"`, `"audio"`
    (a waveform) or `"image"` (images and a prompt's ids). Shared by the
    export's description (`seq2seq.Seq2Seq`) and the folder's settings."""

    encoder_input: str

    @property
    def audio(self) -> bool:
        """Whether the encoder reads a waveform, its mask over the samples."""
        return self.encoder_input == "audio"

    @property
    def image(self) -> bool:
        """Whether the encoder reads images beside the prompt's ids."""
        return self.encoder_input == "image"

    @property
    def masks_itself(self) -> bool:
        """Whether the encoder returns the mask the decoder reads (its output
        is not its input's length: audio frames, or image queries prepended)."""
        return self.encoder_input != "ids"


@dataclass(frozen=True)
class Settings(EncoderInput):
    """What `seq2seq_config.json` says, each value checked."""

    layers: int
    vocabulary: int
    decoder_start_token_ids: tuple | None  # None: give decoder_token_ids
    end_token_id: int | None
    pad_token_id: int
    max_encoder_length: int | None  # None: no position table bounds it
    max_decoder_length: int | None
    encoder_input: str = "ids"  # "audio": waveforms; "image": images and a prompt's ids
    audio_channels: int | None = None  # a waveform's last axis (None: (batch, samples))
    image_shape: tuple | None = None  # (height, width, channels) of an image input
    min_encoder_samples: int | None = None  # the fewest samples a waveform row takes


def _count(config: dict, key: str, path: Path, none_allowed: bool, least: int = 0):
    value = config.get(key)
    if value is None and none_allowed:
        return None
    if not decoding._is_int(value) or value < least:
        raise DecoderFileError(path, f'"{key}" is {_shown(value)}: not an int >= {least}; {_AGAIN}')
    return int(value)


def _encoder_input(config: dict, path: Path) -> str:
    kind = config.get("encoder_input", "ids")
    if kind not in ("ids", "audio", "image"):
        raise DecoderFileError(
            path, f'"encoder_input" is {_shown(kind)}, not "ids", "audio" or "image"; {_AGAIN}'
        )
    return kind


def _image_shape(config: dict, path: Path) -> tuple | None:
    shape = config.get("image_shape")
    if shape is None and config.get("encoder_input") != "image":
        return None
    if (
        not isinstance(shape, list)
        or len(shape) != 3
        or not all(decoding._is_int(size) and size >= 1 for size in shape)
    ):
        raise DecoderFileError(
            path, f'"image_shape" is {_shown(shape)}: not [height, width, channels]; {_AGAIN}'
        )
    return tuple(int(size) for size in shape)


def read_settings(path: Path) -> Settings:
    """Read and check a folder's `seq2seq_config.json`.

    Args:
        path: the file.

    Returns:
        Its settings.

    Raises:
        DecoderFileError: the file cannot be read, or a value is missing or
            of the wrong kind (named).
    """
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:
        raise DecoderFileError(
            path, f"cannot read it as JSON ({_said(error)}); {_AGAIN}"
        ) from error
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        shown = _shown(config.get("format") if isinstance(config, dict) else config)
        raise DecoderFileError(path, f'"format" is {shown}, not {FORMAT!r}; {_AGAIN}')
    starts = config.get("decoder_start_token_ids")
    if starts is not None and (
        not isinstance(starts, list) or not starts or not all(decoding._is_int(t) for t in starts)
    ):
        raise DecoderFileError(
            path, f'"decoder_start_token_ids" is {_shown(starts)}: not a list of ids; {_AGAIN}'
        )
    settings = Settings(
        layers=_count(config, "layers", path, False, 1),
        vocabulary=_count(config, "vocabulary", path, False, 1),
        decoder_start_token_ids=None if starts is None else tuple(int(t) for t in starts),
        end_token_id=_count(config, "end_token_id", path, True),
        pad_token_id=_count(config, "pad_token_id", path, False),
        max_encoder_length=_count(config, "max_encoder_length", path, True, 1),
        max_decoder_length=_count(config, "max_decoder_length", path, True, 1),
        encoder_input=_encoder_input(config, path),
        audio_channels=_count(config, "audio_channels", path, True, 1),
        image_shape=_image_shape(config, path),
        min_encoder_samples=_count(config, "min_encoder_samples", path, True, 1),
    )
    ids = [*(settings.decoder_start_token_ids or ()), settings.end_token_id, settings.pad_token_id]
    outside = [token for token in ids if token is not None and token >= settings.vocabulary]
    if outside:
        raise DecoderFileError(
            path, f"token id {outside[0]} lies outside the vocabulary [0, {settings.vocabulary})"
        )
    return settings


def _session(path: Path):
    import onnxruntime as ort

    if not path.is_file():
        raise DecoderFileError(path, f"missing from the folder; {_AGAIN}")
    try:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - InvalidProtobuf, Fail, ...: ONNX Runtime's own
        raise DecoderFileError(
            path, f"ONNX Runtime cannot load it ({_said(error)}); {_AGAIN}"
        ) from error


class Seq2SeqFolder:
    """The two sessions of an encoder-decoder folder and its settings; give
    it to `generate` in place of the folder's path to open the files once
    across calls (opening them takes about half a second at BART's size).

    Args:
        folder: the folder `--task seq2seq-lm -o FOLDER/` wrote.

    Raises:
        DecoderFileError: a file of the folder is missing, damaged or not
            what the export writes.

    Example:

    >>> import keras_hub
    >>> from keras_layers.export import Seq2SeqFolder, export_model, generate
    >>> backbone = keras_hub.models.BartBackbone(vocabulary_size=40, num_layers=1,
    ...     num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=16)
    >>> model = keras_hub.models.BartSeq2SeqLM(backbone, preprocessor=None)
    >>> export_model(model, tmp / "bart", task="seq2seq-lm")["passed"]
    True
    >>> bart = Seq2SeqFolder(tmp / "bart")
    >>> ids = [[5, 6, 7, 8], [9, 10, 0, 0]]
    >>> mask = [[1, 1, 1, 1], [1, 1, 0, 0]]
    >>> starts = [[2, 0], [2, 0]]  # BART's decoder start: </s> <s>
    >>> feeds = {"encoder_token_ids": ids, "encoder_padding_mask": mask,
    ...          "decoder_token_ids": starts}
    >>> first = generate(bart, feeds, 4)
    >>> first.shape, bool((first == generate(bart, feeds, 4)).all())
    ((2, 6), True)
    """

    def __init__(self, folder):
        self.folder = Path(folder)
        self._tokenizer = None
        self.settings = read_settings(self.folder / CONFIG_FILE)
        self.encoder = _session(self.folder / ENCODER_FILE)
        self.decoder = _session(self.folder / DECODER_FILE)
        layers = range(self.settings.layers)
        encoder_inputs = {value.name: value for value in self.encoder.get_inputs()}
        decoder_inputs = {value.name: value for value in self.decoder.get_inputs()}
        encoder_outputs = {value.name for value in self.encoder.get_outputs()}
        decoder_outputs = {value.name for value in self.decoder.get_outputs()}
        self.input_name = "input_values" if self.settings.audio else "input_ids"
        self.mask_output = self.settings.masks_itself
        names = {self.input_name, "attention_mask", *(["images"] if self.settings.image else [])}
        past = [
            f"past_key_values.{i}.{side}.{k}"
            for i in layers
            for side in ("decoder", "encoder")
            for k in ("key", "value")
        ]
        wanted = names <= set(encoder_inputs) and HIDDEN_OUTPUT in encoder_outputs
        steps = {"input_ids", "encoder_attention_mask", HIDDEN_INPUT, BRANCH_INPUT, *past}
        returned = {name.replace("past_key_values.", "present.") for name in past}
        if not wanted or not steps <= set(decoder_inputs) or not returned <= decoder_outputs:
            raise DecoderFileError(
                self.folder,
                f"its files are not an encoder and a merged decoder with {self.settings.layers} "
                f"layers' caches, as seq2seq_config.json says; {_AGAIN}",
            )
        self.ids_dtype = decoding._numpy_dtype(
            decoder_inputs["input_ids"].type, "input_ids", self.folder / DECODER_FILE
        )
        *_, heads, _, size = decoder_inputs[past[0]].shape
        if not all(decoding._is_int(n) and n > 0 for n in (heads, size)):
            raise DecoderFileError(
                self.folder / DECODER_FILE,
                f"its {past[0]} is {decoder_inputs[past[0]].shape}: not (batch, heads, "
                f"length, head size) with fixed heads and head size; {_AGAIN}",
            )
        self.sizes = (self.settings.layers, int(heads), int(size))

    def encode(self, token_ids: np.ndarray, mask: np.ndarray) -> tuple:
        """The encoder's output for a padded batch, and the mask the decoder
        reads with it.

        Args:
            token_ids: (batch, length) ids, or waveforms (batch, samples[,
                channels]) for an audio encoder, or `(ids, images)` for an
                image-prompted one (images (batch, height, width, channels)).
            mask: booleans (batch, length), True on tokens (or samples).

        Returns:
            `(hidden, mask)`: `last_hidden_state` (batch, length, hidden);
            the decoder's `encoder_attention_mask` (int32), `mask` itself or,
            for an audio or image-prompted encoder, the one over its output
            that the encoder's file returns.
        """
        feeds = {"attention_mask": mask.astype(np.int32)}
        if self.settings.image:
            token_ids, feeds["images"] = token_ids[0], token_ids[1].astype(np.float32)
        dtype = np.float32 if self.settings.audio else np.int32
        feeds[self.input_name] = token_ids.astype(dtype)
        if not self.mask_output:
            return self.encoder.run([HIDDEN_OUTPUT], feeds)[0], mask.astype(np.int32)
        hidden, frames = self.encoder.run([HIDDEN_OUTPUT, "encoder_attention_mask"], feeds)
        return hidden, frames

    def stepper(self, hidden: np.ndarray, mask: np.ndarray):
        """`merged_stepper` on the folder's decoder.

        Args:
            hidden: `encode`'s output.
            mask: `encode`'s mask (batch, length).

        Returns:
            `step(token_ids) -> logits`.
        """
        return merged_stepper(self.decoder, hidden, mask, self.sizes, self.ids_dtype)

    def tokenizer(self):
        """The folder's `tokenizer.json`, read on the first call.

        Returns:
            The tokenizer, truncating as the encoder's framing says.

        Raises:
            ValueError: the folder has no tokenizer (exported without its
                preprocessor).
            DecoderFileError: the file is damaged.
        """
        if self._tokenizer is None:
            path = self.folder / "tokenizer.json"
            if not path.is_file():
                raise ValueError(
                    f"text needs a tokenizer, and {self.folder} has no tokenizer.json (the "
                    "model was exported without its preprocessor); give token ids"
                )
            framed = decoding._folder_tokenizer(path, truncate=True, again=_AGAIN)
            model = self.folder / SENTENCEPIECE_FILE
            self._tokenizer = SentencePieceText(model, framed) if model.is_file() else framed
        return self._tokenizer


class _Encoded:
    """What `encode` returns, as the tokenizers library's `Encoding` does."""

    def __init__(self, ids: list):
        self.ids = ids


class SentencePieceText:
    """A folder's SentencePiece model (`spiece.model`, the proto keras-hub's
    tokenizer runs) framed as its `tokenizer.json` frames: the tokens of
    keras-hub's own tokenizer, where `tokenizer.json`'s readers have known
    gaps (a control token's literal text, the unigram lattice, the charsmap
    per grapheme, ties; `docs/tokenizers.md`).

    Args:
        path: the folder's `spiece.model`.
        framed: its `tokenizer.json`, read by the tokenizers library, whose
            start and end tokens and truncation are applied.

    Raises:
        DecoderFileError: the model cannot be read, or the framing is not a
            prefix and a suffix around the text's ids.
    """

    def __init__(self, path: Path, framed):
        import sentencepiece

        try:
            self._pieces = sentencepiece.SentencePieceProcessor(model_proto=path.read_bytes())
        except Exception as error:  # noqa: BLE001 - the library's own error types
            said = f"sentencepiece cannot read it ({_said(error)}); {_AGAIN}"
            raise DecoderFileError(path, said) from error
        self._framed = framed
        bare = self._pieces.encode("a")
        whole = framed.encode("a").ids
        starts = [i for i in range(len(whole) - len(bare) + 1) if whole[i : i + len(bare)] == bare]
        if not bare or not starts:
            raise DecoderFileError(path, f"tokenizer.json does not frame its ids; {_AGAIN}")
        self._prefix, self._suffix = whole[: starts[0]], whole[starts[0] + len(bare) :]
        limit = (framed.truncation or {}).get("max_length")
        self._room = None if limit is None else limit - len(self._prefix) - len(self._suffix)

    def encode(self, text: str) -> _Encoded:
        """`text`'s ids, framed and truncated as keras-hub's preprocessor does.

        Args:
            text: the text.

        Returns:
            Its ids, as `.ids`.
        """
        ids = self._pieces.encode(text)
        if self._room is not None:
            ids = ids[: max(self._room, 0)]
        return _Encoded([*self._prefix, *ids, *self._suffix])

    def decode(self, ids: list, skip_special_tokens: bool = True) -> str:
        """The text of `ids` (SentencePiece drops its control tokens); ids
        past the proto's pieces (a model's vocabulary may be larger, as T5's
        32,128 over 32,000) by `tokenizer.json`, which holds them.

        Args:
            ids: token ids.
            skip_special_tokens: passed to `tokenizer.json`'s reader.

        Returns:
            The text.
        """
        ids = [int(token) for token in ids]
        if any(token >= self._pieces.get_piece_size() for token in ids):
            return self._framed.decode(ids, skip_special_tokens=skip_special_tokens)
        return self._pieces.decode(ids)


def _kv_names(layers: int, side: str) -> list[str]:
    return [f"past_key_values.{i}.{side}.{k}" for i in range(layers) for k in ("key", "value")]


def _present(names: list) -> list:
    return [name.replace("past_key_values.", "present.") for name in names]


def _own_past_stepper(session, fixed: dict, own: dict, ids_dtype):
    """`step(token_ids) -> logits` feeding `fixed` and the decoder's own
    past `own`, replaced by what each call returns."""
    names = list(own)
    outputs = ["logits", *_present(names)]

    def step(token_ids):
        feeds = {**fixed, **own, "input_ids": np.asarray(token_ids).astype(ids_dtype)}
        logits, *present = session.run(outputs, feeds)
        own.update(zip(names, present, strict=True))
        return logits

    return step


def decoder_stepper(session, cross: list, mask: np.ndarray, ids_dtype=np.int32):
    """A function of a decoder step file's new tokens giving their logits:
    its own past kept inside (empty at first, then what each call returned),
    the encoder's keys and values read from `cross` at every call.

    Args:
        session: an ONNX Runtime session on a decoder step file (the one
            the pipeline proves, `seq2seq.trace_decoder`).
        cross: the encoder's keys and values, `2 * layers` arrays (batch,
            heads, encoder length, head size), key first.
        mask: the encoder's mask (batch, encoder length).
        ids_dtype: the file's `input_ids` type.

    Returns:
        `step(token_ids) -> logits`.
    """
    layers, (batch, heads, _, size) = len(cross) // 2, cross[0].shape
    fixed = {"encoder_attention_mask": mask.astype(np.int32)}
    fixed.update(zip(_kv_names(layers, "encoder"), cross, strict=True))
    empty = np.zeros((batch, heads, 0, size), cross[0].dtype)
    own = dict.fromkeys(_kv_names(layers, "decoder"), empty)
    return _own_past_stepper(session, fixed, own, ids_dtype)


def merged_stepper(session, hidden: np.ndarray, mask: np.ndarray, sizes: tuple, ids_dtype):
    """`decoder_stepper` on a merged decoder (`merged_decoder`): the first
    call takes the `else` branch, which projects `hidden` to the keys and
    values and returns them; every later call is fed them back.

    Args:
        session: an ONNX Runtime session on `decoder_model_merged.onnx`.
        hidden: the encoder's output (batch, encoder length, hidden).
        mask: the encoder's mask (batch, encoder length).
        sizes: `(layers, heads, head size)`.
        ids_dtype: the file's `input_ids` type.

    Returns:
        `step(token_ids) -> logits`.
    """
    layers, heads, size = sizes
    empty = np.zeros((hidden.shape[0], heads, 0, size), hidden.dtype)
    own_names, cross_names = _kv_names(layers, "decoder"), _kv_names(layers, "encoder")
    fixed = {"encoder_attention_mask": mask.astype(np.int32), HIDDEN_INPUT: hidden}
    later = []

    def step(token_ids):
        if later:
            return later[0](token_ids)
        feeds = {**fixed, **dict.fromkeys([*own_names, *cross_names], empty)}
        feeds["input_ids"] = np.asarray(token_ids).astype(ids_dtype)
        feeds[BRANCH_INPUT] = np.array([False])
        outputs = ["logits", *_present(own_names), *_present(cross_names)]
        logits, *present = session.run(outputs, feeds)
        fixed.update(zip(cross_names, present[2 * layers :], strict=True))
        fixed[BRANCH_INPUT] = np.array([True])
        own = dict(zip(own_names, present[: 2 * layers], strict=True))
        later.append(_own_past_stepper(session, fixed, own, ids_dtype))
        return logits

    return step


def _check_within(name: str, ids: np.ndarray, mask: np.ndarray, vocabulary: int) -> None:
    outside = np.argwhere(mask & ((ids < 0) | (ids >= vocabulary)))
    if len(outside):
        row, position = outside[0]
        raise ValueError(
            f"{name}[{row}, {position}]={int(ids[row, position])}: outside the vocabulary "
            f"[0, {vocabulary}) of the folder's model"
        )


def _check_length(name: str, length: int, limit: int | None, unit: str = "tokens") -> None:
    if limit is not None and length > limit:
        raise ValueError(
            f"{name}: {length} {unit}, but the model's position table holds {limit}; "
            "give a shorter input or fewer max_new_tokens"
        )


def _check_waves(values, settings: Settings, name: str = "token_ids") -> np.ndarray:
    """Float waveforms (batch, samples), or (batch, samples, channels) as the
    model reads them; finite, at least one row and one sample."""
    waves = decoding._array(name, values)
    if waves.dtype.kind != "f":
        raise decoding.ArgumentTypeError(
            f"{name} of dtype {waves.dtype}: the folder's encoder reads waveforms; give "
            "float32 samples (batch, samples), decoded audio in -1..1"
        )
    channels = settings.audio_channels
    if channels is not None and waves.ndim == 2:
        waves = waves[..., None] if channels == 1 else waves
    wanted = 2 if channels is None else 3
    if waves.ndim != wanted or 0 in waves.shape[:2] or (channels and waves.shape[2] != channels):
        shape = "(batch, samples)" if channels is None else f"(batch, samples, {channels})"
        raise ValueError(
            f"{name} of shape {waves.shape}: the folder's encoder reads waveforms of shape "
            f"{shape}, at least one row and one sample a row"
        )
    if not np.isfinite(waves).all():
        row = int(np.argwhere(~np.isfinite(waves))[0][0])
        raise ValueError(f"{name}[{row}] holds a NaN or infinite sample; give finite audio")
    return waves.astype(np.float32)


def _check_images(values, settings: Settings, rows: int) -> np.ndarray:
    """Float images (batch, height, width, channels) of the folder's size, finite."""
    images = decoding._array("images", values)
    if images.dtype.kind not in "fiu":
        raise decoding.ArgumentTypeError(f"images of dtype {images.dtype}: give float32 pixels")
    if images.shape != (rows, *settings.image_shape):
        raise ValueError(
            f"images of shape {images.shape}: the folder's encoder reads "
            f"{(rows, *settings.image_shape)}, one image a row of encoder_token_ids, "
            "resized and rescaled as the model's image converter does"
        )
    if not np.isfinite(images).all():
        raise ValueError("images holds a NaN or infinite value; give finite pixels")
    return images.astype(np.float32)


def _encoder_part(inputs, mask, settings: Settings, name: str = "token_ids") -> tuple:
    """The encoder's ids (or waveforms, each long enough) and their mask, checked."""
    if not settings.audio:
        encoder = decoding._check_ids(inputs)
        return encoder, decoding._check_mask(mask, encoder.shape)
    encoder = _check_waves(inputs, settings, name)
    mask = decoding._check_mask(mask, encoder.shape[:2])
    fewest = settings.min_encoder_samples
    short = np.flatnonzero(mask.sum(axis=1) < (fewest or 0))
    if len(short):
        row = int(short[0])
        raise ValueError(
            f"{name}[{row}] holds {int(mask[row].sum())} samples: the model's convolutions "
            f"leave no frame of fewer than {fewest}; give at least {fewest} samples a row"
        )
    return encoder, mask


def _from_dict(inputs: dict, settings: Settings) -> tuple:
    """keras-hub's dict of ids (a speech model's waveforms under
    `encoder_input_values`), each part checked."""
    first = "encoder_input_values" if settings.audio else "encoder_token_ids"
    keys = (first, *DICT_KEYS[1:], *(["images"] if settings.image else []))
    needed = [first, *(["images"] if settings.image else [])]
    unknown = sorted(set(inputs) - set(keys), key=str)
    if unknown or not all(key in inputs for key in needed):
        raise ValueError(
            f"token_ids: a dict of keys {sorted(inputs, key=str)}; give keras-hub's "
            f"{', '.join(keys)} ({' and '.join(needed)} at least)"
        )
    encoder, mask = _encoder_part(
        inputs[first], inputs.get("encoder_padding_mask"), settings, first
    )
    if settings.image:
        encoder = (encoder, _check_images(inputs["images"], settings, len(encoder)))
    if "decoder_token_ids" in inputs:
        decoder = decoding._check_ids(inputs["decoder_token_ids"])
        if decoder.shape[0] != len(mask):
            raise ValueError(
                f"decoder_token_ids of shape {decoder.shape}: {first} has "
                f"{len(mask)} rows; give one decoder prompt a row"
            )
        decoder_mask = decoding._check_mask(inputs.get("decoder_padding_mask"), decoder.shape)
        return encoder, mask, decoder, decoder_mask
    if "decoder_padding_mask" in inputs:
        raise ValueError("decoder_padding_mask without decoder_token_ids: give both, or neither")
    return (encoder, mask, *_start_prompts(settings, len(mask)))


def _start_prompts(settings: Settings, batch: int) -> tuple:
    if settings.decoder_start_token_ids is None:
        raise ValueError(
            "the folder names no decoder start tokens (the model was exported without its "
            "preprocessor): give a dict with decoder_token_ids, as keras-hub's generate takes it"
        )
    starts = np.array([settings.decoder_start_token_ids] * batch)
    return starts, np.ones(starts.shape, bool)


def generate(folder, token_ids, max_new_tokens, padding_mask, end_token_id, pad_token_id, sampling):
    """`keras_layers.export.generate` on a seq2seq folder (its docstring says
    what each argument is); every argument checked before the encoder runs.

    Args:
        folder: the folder, or a `Seq2SeqFolder` on it.
        token_ids: text, the encoder's ids, or keras-hub's dict of ids.
        max_new_tokens: tokens each row gains, at least 1.
        padding_mask: the encoder's mask with ids (None: all tokens).
        end_token_id: a row stops after this id (None: the folder's end token).
        pad_token_id: written after each row's end (ids only).
        sampling: `sampler`, `seed`, `top_k`, `top_p`, `temperature`.

    Returns:
        Text: the new text of each input. Ids: (batch, decoder prompt length
        + max_new_tokens), each row's decoder prompt, its new tokens, then
        the pad id.

    Raises:
        DecoderFileError: a file of the folder is damaged.
        ValueError: an argument is out of range or too long for the model's
            positions (`ArgumentTypeError` for the wrong type).
    """
    text = decoding._is_text(token_ids)
    if text:
        decoding._check_text(token_ids, padding_mask, pad_token_id)
    decoding._check_count(max_new_tokens)
    pick = decoding._picker(**sampling)
    decoding._check_token_type("end_token_id", end_token_id, none_allowed=True)
    decoding._check_token_type("pad_token_id", pad_token_id, none_allowed=False)
    model = folder if isinstance(folder, Seq2SeqFolder) else Seq2SeqFolder(folder)
    settings = model.settings
    end = settings.end_token_id if end_token_id is None else end_token_id
    for name, value in (("end_token_id", end), ("pad_token_id", pad_token_id)):
        if value is not None and not 0 <= value < settings.vocabulary:
            raise ValueError(
                f"{name}={value}: outside the vocabulary [0, {settings.vocabulary}) of the model"
            )
    if text and settings.audio:
        raise ValueError(
            f"token_ids={_shown(token_ids)}: the folder's encoder reads waveforms, not text; "
            "give float samples (batch, samples) or keras-hub's dict with encoder_input_values"
        )
    if settings.image and not isinstance(token_ids, dict):
        raise ValueError(
            f"token_ids={_shown(token_ids)}: the folder's encoder reads images with the "
            "prompt's ids; give keras-hub's dict with images and encoder_token_ids"
        )
    if text:
        encoder, mask, tokenizer = _encoded(model, token_ids)
        decoder, decoder_mask = _start_prompts(settings, encoder.shape[0])
    elif isinstance(token_ids, dict):
        encoder, mask, decoder, decoder_mask = _from_dict(token_ids, settings)
    else:
        encoder, mask = _encoder_part(token_ids, padding_mask, settings)
        decoder, decoder_mask = _start_prompts(settings, encoder.shape[0])
    if not settings.audio:
        ids = encoder[0] if settings.image else encoder
        _check_within("encoder_token_ids", ids, mask, settings.vocabulary)
    length = (encoder[0] if settings.image else encoder).shape[1]
    unit = "samples (or frames)" if settings.audio else "tokens"
    _check_length("the encoder's input", length, settings.max_encoder_length, unit)
    _check_within("decoder_token_ids", decoder, decoder_mask, settings.vocabulary)
    total = int(decoder_mask.sum(axis=1).max()) + int(max_new_tokens)
    named = f"the decoder's prompt and max_new_tokens={max_new_tokens}"
    _check_length(named, total, settings.max_decoder_length)
    tokens = _run(
        model, encoder, mask, decoder, decoder_mask, int(max_new_tokens), pick, end, pad_token_id
    )
    if not text:
        return tokens
    new_rows = [row[decoder.shape[1] :] for row in tokens.tolist()]
    path = model.folder / "tokenizer.json"
    dropped = {*(settings.decoder_start_token_ids or ()), end, settings.pad_token_id}
    return decoding.decode_texts(
        tokenizer, path, new_rows, end, token_ids, "input", _AGAIN, dropped - {None}
    )


def _run(model, encoder, mask, decoder, decoder_mask, max_new_tokens, pick, end, pad):
    mask = mask.astype(bool)
    if isinstance(encoder, tuple):  # the prompt's ids and their images
        encoder = (np.where(mask, encoder[0], 0), encoder[1])
    else:
        encoder = np.where(mask if encoder.ndim == 2 else mask[..., None], encoder, 0)
    step = model.stepper(*model.encode(encoder, mask))
    return decoding.lockstep(
        step, model.ids_dtype, decoder, decoder_mask, max_new_tokens, pick, end, pad
    )


def _encoded(model: Seq2SeqFolder, prompts) -> tuple:
    """Text encoded by the folder's tokenizer (framing and truncation as
    keras-hub's preprocessor frames the encoder's input), padded."""
    path = model.folder / "tokenizer.json"
    try:
        tokenizer = model.tokenizer()
    except ValueError as error:
        if isinstance(error, DecoderFileError):
            raise
        raise ValueError(f"token_ids={_shown(prompts)}: {error}") from None
    empty = "encodes to no token; give an input of at least one token"
    rows = decoding.encode_texts(tokenizer, path, prompts, "input", empty, _AGAIN)
    return (*decoding.right_padded(rows), tokenizer)


__all__ = ["Seq2SeqFolder", "generate", "is_seq2seq_folder"]
