"""Generate tokens with a decoder exported by `--task causal-lm`: ONNX Runtime and NumPy only.

The file takes `input_ids` (batch, new tokens) and, for each layer `i`,
`past_key_values.{i}.key` / `.value` (batch, heads, past tokens, head size),
and returns `logits` (batch, new tokens, vocabulary) and `present.{i}.key` /
`.value` (batch, heads, past + new tokens, head size): the names optimum and
onnxruntime-genai use. The first call (the prompt) passes caches with zero past
tokens; each later call passes one token per row and the caches the call
before returned (`docs/generation.md`).

Prompts of different lengths are right-padded and run in lockstep, as
keras-hub's `CausalLM.generate` runs them: the prompt is read up to the
shortest row's length in one call, then one position per call, where a row
still inside its prompt is fed its own next token instead of the sampled one.
So every row attends only to its own tokens, and no attention mask is needed.

`generate` checks every argument before the first call, against what the
file says (the vocabulary, from the logits' shape; the `input_ids` type) or,
where the file does not say, against what it does: the positions it runs
are asked of it with single-token calls after zero caches
(`CachedDecoder.longest_sequence`), and the memory the caches will take is
compared with what `memory.available_bytes` reports. Each refusal is a
`ValueError` (or an `ArgumentTypeError`, both a `TypeError` and a
`ValueError`) naming the argument ("Argument checks" in `docs/generation.md`).

Text in, text out: given the folder `--task causal-lm -o FOLDER/` writes for
a model saved with its preprocessor, `generate` also takes a string or a list
of strings. They are encoded with the folder's `tokenizer.json` (the
`tokenizers` library, start token included, no padding), generation stops at
the folder's end token (`genai_config.json`) or at `end_token_id` when one is
given, and the new tokens before it are returned decoded. `padding_mask` and
`pad_token_id` have nothing to act on there, and are refused.

A file that is damaged or not what the export writes (`model.onnx`,
`genai_config.json`, `tokenizer.json`) is a `DecoderFileError` (a `ValueError`)
naming the file and the problem, whatever the library reading it raised: ONNX
Runtime's `InvalidProtobuf`, the `json` module's `RecursionError`, the Rust
panic of the `tokenizers` library ("A damaged folder" in `docs/generation.md`).

Nothing here imports TensorFlow or Keras: a server that only generates needs
`onnxruntime` and `numpy` (and `onnx`, imported by the memory check).

Example (the export side, which does need TensorFlow):

>>> import keras_hub
>>> from keras_layers.export import export_model
>>> backbone = keras_hub.models.GPT2Backbone(
...     vocabulary_size=50, num_layers=1, num_heads=2, hidden_dim=8,
...     intermediate_dim=16, max_sequence_length=64)
>>> lm = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
>>> export_model(lm, tmp / "gpt2.onnx", task="causal-lm")["passed"]
True
"""

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from keras_layers.export import seq2seq_generation
from keras_layers.export.decoding import (
    _FOLDER_AGAIN,
    ArgumentTypeError,
    _check_count,
    _check_ids,
    _check_mask,
    _check_text,
    _check_token_type,
    _folder_tokenizer,
    _is_int,
    _is_text,
    _numpy_dtype,
    _picker,
    _said,
    _shown,
    decode_texts,
    encode_texts,
    lockstep,
    right_padded,
)
from keras_layers.export.errors import DecoderFileError

_EXPORT_AGAIN = "export the model again with --task causal-lm"
_PAST = "past_key_values."
_PADDING = ("attention_mask", "position_ids")


@dataclass(frozen=True)
class CacheInput:
    """One `past_key_values.{layer}.{key|value}` input of the file."""

    name: str
    heads: int
    head_size: int
    dtype: np.dtype

    @classmethod
    def read(cls, value, path: Path) -> "CacheInput":
        """From ONNX Runtime's description of the input.

        Args:
            value: the input (batch, heads, past_sequence, head size).
            path: the file, named when the input is refused.

        Returns:
            The cache input.

        Raises:
            DecoderFileError: the heads or the head size are not numbers.
        """
        shape = value.shape
        if len(shape) != 4 or not all(_is_int(shape[axis]) and shape[axis] > 0 for axis in (1, 3)):
            raise DecoderFileError(
                path,
                f"its input {value.name!r} has shape {shape}: generate needs (batch, heads, "
                "past tokens, head size) with the heads and the head size as numbers, as "
                f"--task causal-lm writes them; {_EXPORT_AGAIN}",
            )
        return cls(value.name, shape[1], shape[3], _numpy_dtype(value.type, value.name, path))

    def empty(self, batch: int, length: int = 0) -> np.ndarray:
        """Zeros for `batch` rows of `length` tokens (none: the first call's).

        Args:
            batch: rows.
            length: past tokens.

        Returns:
            Zeros shaped (batch, heads, length, head size).
        """
        return np.zeros((batch, self.heads, length, self.head_size), self.dtype)

    def bytes_per_token(self) -> int:
        """What one token of one row takes in this cache."""
        return self.heads * self.head_size * self.dtype.itemsize


class CachedDecoder:
    """An ONNX Runtime session over an exported decoder, one call at a time.

    Besides `step`, it answers what `generate` checks its arguments against:
    the `vocabulary` (the logits' last dimension) and the longest sequence the
    file runs (`longest_sequence`, asked of the file itself and remembered).

    Args:
        onnx_path: the file `--task causal-lm` wrote (its data file beside it).
        session_options: `onnxruntime.SessionOptions`, or None for the defaults.

    Example:

    >>> decoder = CachedDecoder(tmp / "gpt2.onnx")
    >>> cache = decoder.empty_cache(batch=2)
    >>> logits, cache = decoder.step(np.array([[5, 6, 7], [8, 9, 10]]), cache)
    >>> logits.shape[:2], decoder.cache_length(cache), decoder.vocabulary
    ((2, 3), 3, 50)
    """

    def __init__(self, onnx_path, session_options=None):
        import onnxruntime as ort

        path = Path(onnx_path)
        if not path.is_file():
            raise FileNotFoundError(
                f"onnx_path={str(path)!r}: no ONNX file at this path; give the file that "
                "--task causal-lm wrote"
            )
        try:
            self.session = ort.InferenceSession(
                str(path), session_options, providers=["CPUExecutionProvider"]
            )
        except Exception as error:  # noqa: BLE001 - InvalidProtobuf, Fail, ...: ONNX Runtime's own
            raise DecoderFileError(
                path, f"ONNX Runtime cannot load it ({_said(error)}); {_EXPORT_AGAIN}"
            ) from error
        inputs = {value.name: value for value in self.session.get_inputs()}
        outputs = {value.name: value for value in self.session.get_outputs()}
        self.cache_inputs = [
            CacheInput.read(value, path) for name, value in inputs.items() if name.startswith(_PAST)
        ]
        self.presents = [name.replace(_PAST, "present.") for name in self._cache_names]
        if (
            "input_ids" not in inputs
            or not self.cache_inputs
            or not {"logits", *self.presents} <= set(outputs)
        ):
            raise DecoderFileError(
                path,
                f"not a decoder with a key/value cache (its inputs are {sorted(inputs)}, its "
                f"outputs {sorted(outputs)}); export the model with --task causal-lm",
            )
        self.ids_dtype = _numpy_dtype(inputs["input_ids"].type, "input_ids", path)
        # A decoder that takes a padded batch (`attention_mask`, `position_ids`).
        self.padding_dtypes = {
            name: _numpy_dtype(inputs[name].type, name, path) for name in _PADDING if name in inputs
        }
        self.logits_dtype = _numpy_dtype(outputs["logits"].type, "logits", path)
        self.output_names = list(outputs)
        last = outputs["logits"].shape[-1] if outputs["logits"].shape else None
        self._vocabulary = last if isinstance(last, int) and last > 0 else None
        self._path = path
        self._runs = 0  # the longest sequence the file ran (`longest_sequence`)
        self._fails: int | None = None  # the shortest it failed on
        self._failure = ""  # ONNX Runtime's message for that one

    @cached_property
    def shares_buffer(self) -> bool:
        """Whether only `GroupQueryAttention` reads the past, so that one buffer
        may be past and present (`SharedCache`). Read from the file's graph on
        first use (by `generate`), not when the session opens: `step` alone
        never needs it."""
        return bool(self.padding_dtypes) and past_readers(self._path) == {"GroupQueryAttention"}

    @property
    def _cache_names(self) -> list:
        return [cache.name for cache in self.cache_inputs]

    @property
    def vocabulary(self) -> int:
        """The logits' last dimension: the file's own output shape, or, where
        the file leaves it symbolic, the logits of one token (id 0)."""
        if self._vocabulary is None and not self._probe(1):
            raise self.fails_on_one_token()
        return self._vocabulary

    def fails_on_one_token(self) -> DecoderFileError:
        """The error for a file that fails on its first token (`failure` says how)."""
        return DecoderFileError(
            self._path,
            f"it fails on one token with an empty cache ({self._failure}); {_EXPORT_AGAIN}",
        )

    def empty_cache(self, batch: int) -> dict:
        """Caches holding no tokens, for the first call."""
        return {cache.name: cache.empty(batch) for cache in self.cache_inputs}

    @staticmethod
    def cache_length(cache: dict) -> int:
        """How many tokens the caches hold."""
        return next(iter(cache.values())).shape[2]

    def _padding_feeds(self, shape: tuple, past: int, attention_mask, position_ids) -> dict:
        """`attention_mask` and `position_ids` for a file that takes them:
        as given, or a batch without padding (every position a token)."""
        batch, new = shape
        if attention_mask is None:
            attention_mask = np.ones((batch, past + new))
        if position_ids is None:
            position_ids = np.broadcast_to(np.arange(past, past + new), (batch, new))
        given = {"attention_mask": attention_mask, "position_ids": position_ids}
        return {name: np.asarray(given[name], dtype) for name, dtype in self.padding_dtypes.items()}

    def step(
        self, token_ids: np.ndarray, cache: dict, attention_mask=None, position_ids=None
    ) -> tuple[np.ndarray, dict]:
        """Run the file on the new tokens.

        Args:
            token_ids: int array (batch, new tokens).
            cache: the caches of the previous step (or `empty_cache`'s).
            attention_mask: for a file that takes one, (batch, past + new):
                1 on tokens, 0 on padding; default all 1 (`generate`'s lockstep).
            position_ids: for a file that takes them, (batch, new): each new
                token's position among its row's tokens; default past, past + 1, ...

        Returns:
            (the new tokens' logits (batch, new tokens, vocabulary), the grown caches).
        """
        token_ids = np.asarray(token_ids, self.ids_dtype)
        past = self.cache_length(cache)
        padding = self._padding_feeds(token_ids.shape, past, attention_mask, position_ids)
        feeds = {"input_ids": token_ids, **padding, **cache}
        outputs = dict(zip(self.output_names, self.session.run(None, feeds), strict=True))
        pairs = zip(self._cache_names, self.presents, strict=True)
        grown = {name: outputs[present] for name, present in pairs}
        return outputs["logits"], grown

    def _probe(self, length: int) -> bool:
        """Whether the file runs a sequence of `length` tokens: one call at
        batch 1, token 0 after a zero cache of `length - 1` tokens, which must
        return one row of logits and caches of `length` tokens. ONNX Runtime's
        failure is the answer, not an error; the answers are remembered."""
        import onnxruntime as ort

        if length <= self._runs:
            return True
        if self._fails is not None and length >= self._fails:
            return False
        feeds = {cache.name: cache.empty(1, length - 1) for cache in self.cache_inputs}
        feeds["input_ids"] = np.zeros((1, 1), self.ids_dtype)
        feeds.update(self._padding_feeds((1, 1), length - 1, None, None))
        quiet = ort.RunOptions()
        quiet.log_severity_level = 4  # the failure is expected: not logged
        try:
            results = self.session.run(None, feeds, quiet)
        except Exception as error:  # noqa: BLE001 - ONNX Runtime's failure is the answer
            self._fails, self._failure = length, " ".join(str(error).split())[:200]
            return False
        outputs = dict(zip(self.output_names, results, strict=True))
        logits = outputs["logits"]
        runs = (
            logits.ndim == 3
            and logits.shape[:2] == (1, 1)
            and logits.shape[2] == (self._vocabulary or logits.shape[2])
            and all(outputs[name].shape[2] == length for name in self.presents)
        )
        if not runs:
            self._fails = length
            self._failure = f"it returns logits of shape {logits.shape} for one token"
            return False
        self._vocabulary = self._vocabulary or logits.shape[2]
        self._runs = length
        return True

    def longest_sequence(self, wanted: int) -> int:
        """`wanted`, or the longest sequence the file runs when it is shorter.

        The file does not record its position limit (a position table's rows,
        for keras-hub's `PositionEmbedding`), so the file is asked: single-token
        calls at batch 1 after zero caches of 1, 2, 4, ... tokens, up to
        `wanted`, then halving between the longest that ran and the shortest
        that failed. Cheap next to generating, and remembered.

        Args:
            wanted: tokens the caller will feed the file.

        Returns:
            `wanted` when the file runs it; else the longest it runs (0 when it
            fails even on one token; `failure` says why).
        """
        length = max(self._runs, 1)
        if not self._probe(length):
            return 0
        while length < wanted:
            longer = min(2 * length, wanted)
            if not self._probe(longer):
                while longer - length > 1:
                    middle = (length + longer) // 2
                    length, longer = (middle, longer) if self._probe(middle) else (length, middle)
                return length
            length = longer
        return wanted

    @property
    def failure(self) -> str:
        """ONNX Runtime's message for the shortest sequence the file failed on."""
        return self._failure


class SharedCache:
    """One max-length buffer per cache, bound as both the past and the present
    of each step, for a decoder whose past only `GroupQueryAttention` reads
    (`CachedDecoder.shares_buffer`): the op writes the new keys and values
    into it in place, as onnxruntime-genai's `past_present_share_buffer`
    does, instead of returning a new cache (a copy of the past) every step.
    Steps run in lockstep: no padding, every row `length` tokens long.

    Args:
        decoder: the decoder.
        batch: rows.
        capacity: the longest sequence the steps will reach.
    """

    def __init__(self, decoder: CachedDecoder, batch: int, capacity: int):
        import onnxruntime as ort

        self.decoder, self.batch, self.length = decoder, batch, 0
        self.buffers = {
            cache.name: ort.OrtValue.ortvalue_from_numpy(cache.empty(batch, capacity))
            for cache in decoder.cache_inputs
        }

    def step(self, token_ids: np.ndarray) -> np.ndarray:
        """Run the file on the new tokens, the buffers written in place.

        Args:
            token_ids: int array (batch, new tokens).

        Returns:
            The new tokens' logits (batch, new tokens, vocabulary).
        """
        decoder = self.decoder
        token_ids = np.asarray(token_ids, decoder.ids_dtype)
        shape = (self.batch, self.length + token_ids.shape[1])
        feeds = decoder._padding_feeds(token_ids.shape, self.length, None, None)
        feeds["attention_mask"] = np.ones(shape, decoder.padding_dtypes["attention_mask"])
        binding = decoder.session.io_binding()
        binding.bind_output("logits")  # the first output bound: get_outputs()[0]
        for name, value in {"input_ids": token_ids, **feeds}.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name, present in zip(decoder._cache_names, decoder.presents, strict=True):
            binding.bind_ortvalue_input(name, self.buffers[name])
            binding.bind_ortvalue_output(present, self.buffers[name])
        decoder.session.run_with_iobinding(binding)
        self.length = shape[1]
        return binding.get_outputs()[0].numpy()


def past_readers(path) -> set:
    """The op types of the nodes that read a decoder's `past_key_values.*`
    inputs, less `Shape`s of their batch, heads and head size alone (what a
    shared max-length buffer does not change).

    Args:
        path: the decoder's ONNX file (its graph is read, not its weights).

    Returns:
        The set of op types.
    """
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    pasts = {value.name for value in graph.input if value.name.startswith(_PAST)}
    return {
        node.op_type
        for node in graph.node
        if pasts & set(node.input) and not _reads_no_length(node)
    }


def _reads_no_length(node) -> bool:
    """Whether `node` is a `Shape` of (batch, heads, length, size) that leaves out the length."""
    if node.op_type != "Shape":
        return False
    given = {attribute.name: attribute.i for attribute in node.attribute}
    start, end = given.get("start", 0), given.get("end", 4)
    start, end = (axis + 4 if axis < 0 else axis for axis in (start, end))
    return not start <= 2 < end


def _check_path(onnx_path) -> None:
    if not isinstance(onnx_path, CachedDecoder | str | os.PathLike):
        raise ArgumentTypeError(
            f"onnx_path={_shown(onnx_path)}: give the path of a file --task causal-lm wrote, "
            "or a CachedDecoder"
        )


def _check_ids_for(decoder: CachedDecoder, ids, mask, end_token_id, pad_token_id) -> None:
    """Prompt tokens, `end_token_id` and `pad_token_id` within the vocabulary
    and the model's `input_ids` type."""
    vocabulary = decoder.vocabulary
    limit = min(vocabulary, int(np.iinfo(decoder.ids_dtype).max) + 1)
    holds = f"the vocabulary [0, {vocabulary})"
    if limit < vocabulary:
        holds = f"[0, {limit}), the ids the model's {decoder.ids_dtype} input_ids hold"
    outside = np.argwhere(mask & ((ids < 0) | (ids >= limit)))
    if len(outside):
        row, position = outside[0]
        raise ValueError(
            f"token_ids[{row}, {position}]={ids[row, position].item()} is outside {holds}; give "
            "the ids of the model's tokenizer"
        )
    for name, value in (("end_token_id", end_token_id), ("pad_token_id", pad_token_id)):
        if value is not None and not 0 <= value < limit:
            raise ValueError(f"{name}={value} is outside {holds}; give a token id within it")


def _gigabytes(count: int) -> str:
    return f"{count / 1e9:,.1f} GB" if count >= 1e8 else f"{count / 1e6:,.1f} MB"


def _check_memory(decoder: CachedDecoder, shape: tuple, max_new_tokens: int) -> None:
    """Refuse a batch and length whose caches and outputs surely do not fit:
    every cache at the full length twice (a step's input and output), the
    prompt's logits and the tokens (a lower bound: ONNX Runtime's own work
    comes on top)."""
    from keras_layers.export import memory  # its import pulls in onnx: not for a server

    batch, prompt_length = shape
    total = prompt_length + max_new_tokens
    caches = 2 * batch * total * sum(cache.bytes_per_token() for cache in decoder.cache_inputs)
    logits = batch * prompt_length * decoder.vocabulary * decoder.logits_dtype.itemsize
    need = caches + logits + batch * total * decoder.ids_dtype.itemsize
    available = memory.available_bytes()
    if available is not None and need > available:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} with token_ids of shape {shape}: generating "
            f"needs at least {_gigabytes(need)} (the key/value caches of {total} tokens, held "
            f"twice during a step, and the prompt's logits) and {_gigabytes(available)} are "
            "available; ask for fewer new tokens or a smaller batch"
        )


def _check_positions(decoder: CachedDecoder, lengths: np.ndarray, max_new_tokens: int) -> None:
    """The longest prompt and its new tokens within the positions the file runs
    (`CachedDecoder.longest_sequence`). The last new token is never fed back,
    so the file is fed `longest prompt + max_new_tokens - 1` tokens."""
    longest = int(lengths.max())
    fed = longest + max_new_tokens - 1
    runs = decoder.longest_sequence(fed)
    if runs == fed:
        return
    if runs == 0:
        raise decoder.fails_on_one_token()
    limit = f"the model runs at most {runs} positions (ONNX Runtime fails past them)"
    if longest > runs:
        raise ValueError(
            f"token_ids: the longest prompt holds {longest} tokens and {limit}; shorten the "
            f"prompts to at most {runs} tokens"
        )
    raise ValueError(
        f"max_new_tokens={max_new_tokens}: the longest prompt ({longest} tokens) and its new "
        f"tokens (all but the last fed back) take {fed} positions and {limit}; ask for at "
        f"most max_new_tokens={runs - longest + 1}"
    )


def generate(
    onnx_path,
    token_ids,
    max_new_tokens: int,
    padding_mask=None,
    sampler: str = "greedy",
    seed: int | None = None,
    end_token_id: int | None = None,
    *,
    top_k: int = 50,
    top_p: float = 0.9,
    temperature: float = 1.0,
    pad_token_id: int = 0,
) -> np.ndarray:
    """Continue each prompt by `max_new_tokens` tokens with an exported decoder.

    Every argument is checked before any token is generated
    (`docs/generation.md`, "Argument checks").

    Args:
        onnx_path: a file `--task causal-lm` wrote, the folder `--task
            causal-lm -o FOLDER/` wrote, or a `CachedDecoder` (reused across calls);
            or a `--task seq2seq-lm -o FOLDER/` folder (or `Seq2SeqFolder`):
            ids are the encoder's, the result the decoder's (`seq2seq_generation`).
        token_ids: integer array (batch >= 1, prompt length >= 1); rows shorter
            than the longest are right-padded (any id) and marked by
            `padding_mask`; prompt ids lie in [0, vocabulary). Or text (a folder).
            For an encoder-decoder, also keras-hub's dict of ids
            (`encoder_token_ids`, `encoder_padding_mask`, `decoder_token_ids`,
            `decoder_padding_mask`; a speech model's `encoder_input_values`,
            an image-prompted one's `images` too).
        max_new_tokens: how many tokens each row gains, at least 1; the longest
            prompt and its new tokens must fit the model's positions.
        padding_mask: booleans (or 0/1) like `token_ids`, True on prompt tokens
            (keras-hub's `padding_mask`), each row's at its start; default all True.
            Refused with text, which `generate` lines up itself.
        sampler: `"greedy"`, `"top_k"` or `"top_p"`.
        seed: seeds the sampling (`numpy.random.default_rng(seed)`; an int >= 0,
            a `numpy.random.Generator` or None); the same seed gives the same tokens.
        end_token_id: a row stops after it generates this id (None: never; for
            text and encoder-decoders, the folder's end token).
        top_k: tokens kept by `"top_k"`, an int >= 1.
        top_p: probability mass kept by `"top_p"`, in (0, 1].
        temperature: logits are divided by it before sampling; finite, > 0.
        pad_token_id: written after each row's end, in [0, vocabulary); refused with text.

    Returns:
        For ids, an array (batch, prompt length + max_new_tokens) of the model's
        `input_ids` type (int32 or int64): row `i` holds its prompt (its first
        `padding_mask[i].sum()` ids), then its new tokens (up to and including
        `end_token_id`), then `pad_token_id`. For text: the new text(s).

    Raises:
        FileNotFoundError: no file at `onnx_path`.
        TypeError: an argument of the wrong type (`ArgumentTypeError`, also a
            `ValueError`); the message names it.
        DecoderFileError: a damaged file (the ONNX file, `genai_config.json`,
            `tokenizer.json`), a `ValueError` too; the message names the file.
        ValueError: an argument is out of range, too long for the model's
            positions or too large for the memory available; the message names
            it (`argument=value: why; what to do`).

    Example:

    >>> tokens = generate(tmp / "gpt2.onnx", [[5, 6, 7], [8, 9, 0]], max_new_tokens=4,
    ...                   padding_mask=[[1, 1, 1], [1, 1, 0]])
    >>> tokens.shape
    (2, 7)
    >>> int(tokens[1, -1])  # the shorter row ends with padding
    0
    """
    sampling = {"sampler": sampler, "seed": seed, "top_k": top_k, "top_p": top_p}
    sampling["temperature"] = temperature
    given = (max_new_tokens, padding_mask, end_token_id, pad_token_id, sampling)
    if seq2seq_generation.is_seq2seq_folder(onnx_path):
        return seq2seq_generation.generate(onnx_path, token_ids, *given)
    if _is_text(token_ids):
        _check_text(token_ids, padding_mask, pad_token_id)
        return _generate_text(onnx_path, token_ids, max_new_tokens, end_token_id, sampling)
    return _generate_ids(onnx_path, token_ids, *given)


def _generate_ids(onnx_path, token_ids, max_new_tokens, padding_mask, end, pad, sampling):
    """`generate` on ids with a decoder-only file, every argument checked first."""
    onnx_path = _model_file(onnx_path)
    _check_path(onnx_path)
    token_ids = _check_ids(token_ids)
    mask = _check_mask(padding_mask, token_ids.shape)
    _check_count(max_new_tokens)
    pick = _picker(**sampling)
    decoder = _checked_decoder(onnx_path, token_ids, mask, max_new_tokens, end, pad)
    capacity = int(mask.sum(axis=1).max()) + int(max_new_tokens)
    step = _stepper(decoder, token_ids.shape[0], capacity)
    new = int(max_new_tokens)
    return lockstep(step, decoder.ids_dtype, token_ids, mask, new, pick, end, pad)


def _checked_decoder(onnx_path, token_ids, mask, max_new_tokens, end_token_id, pad_token_id):
    """The decoder, once the special ids, the ids' range, the memory and the
    positions are checked against it."""
    _check_token_type("end_token_id", end_token_id, none_allowed=True)
    _check_token_type("pad_token_id", pad_token_id, none_allowed=False)
    decoder = onnx_path if isinstance(onnx_path, CachedDecoder) else CachedDecoder(onnx_path)
    _check_ids_for(decoder, token_ids, mask, end_token_id, pad_token_id)
    _check_memory(decoder, token_ids.shape, int(max_new_tokens))
    _check_positions(decoder, mask.sum(axis=1), int(max_new_tokens))
    return decoder


def _model_file(onnx_path):
    """A folder's `model.onnx`; any other path or decoder as it is."""
    if isinstance(onnx_path, str | os.PathLike) and Path(onnx_path).is_dir():
        return Path(onnx_path) / "model.onnx"
    return onnx_path


def _text_folder(onnx_path) -> Path:
    """The folder of a text generation: its tokenizer and config must be there."""
    folder = Path(onnx_path) if isinstance(onnx_path, str | os.PathLike) else None
    if folder is None or not all(
        (folder / name).is_file() for name in ("tokenizer.json", "genai_config.json")
    ):
        raise ValueError(
            f"onnx_path={_shown(onnx_path)}: text prompts need the folder `--task causal-lm "
            "-o FOLDER/` writes for a model saved with its preprocessor (tokenizer.json and "
            "genai_config.json beside model.onnx); give token ids, or that folder"
        )
    return folder


def _generate_text(onnx_path, prompts, max_new_tokens, end_token_id, sampling: dict):
    """`generate` on text: encode with the folder's tokenizer, generate, decode.
    A damaged file of the folder is a `DecoderFileError` naming it."""
    folder = _text_folder(onnx_path)
    tokenizer_path = folder / "tokenizer.json"
    tokenizer = _folder_tokenizer(tokenizer_path)
    folder_end = _folder_end_token(folder / "genai_config.json")
    empty = (
        "this prompt encodes to no token (the folder's tokenizer adds no start token); give a "
        "prompt of at least one token"
    )
    rows = encode_texts(tokenizer, tokenizer_path, prompts, "prompt", empty, _FOLDER_AGAIN)
    decoder = CachedDecoder(folder / "model.onnx")
    _check_folder_ids(decoder, folder, folder_end, rows)
    end = folder_end if end_token_id is None else end_token_id
    ids, mask = right_padded(rows)
    tokens = generate(decoder, ids, max_new_tokens, padding_mask=mask, end_token_id=end, **sampling)
    new = int(max_new_tokens)
    new_rows = [row[len(p) : len(p) + new] for row, p in zip(tokens.tolist(), rows, strict=True)]
    return decode_texts(tokenizer, tokenizer_path, new_rows, end, prompts, "prompt", _FOLDER_AGAIN)


def _folder_end_token(path: Path) -> int:
    """`model.eos_token_id` of a folder's `genai_config.json`: an int >= 0
    (whether the vocabulary holds it, `_check_folder_ids` says)."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:  # ValueError: JSON, UTF-8, digits
        raise DecoderFileError(
            path, f"cannot read it as JSON ({_said(error)}); {_FOLDER_AGAIN}"
        ) from error
    model = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model, dict):
        raise DecoderFileError(
            path, f'no "model" object (the file holds {_shown(config)}); {_FOLDER_AGAIN}'
        )
    if "eos_token_id" not in model:
        raise DecoderFileError(
            path,
            '"model"."eos_token_id" is missing: generate stops each text at the end token it '
            f"names; {_FOLDER_AGAIN}",
        )
    end = model["eos_token_id"]
    if not _is_int(end) or end < 0:
        raise DecoderFileError(
            path,
            f'"model"."eos_token_id" is {_shown(end)}: not an int token id (generate stops each '
            f"text at one end token); {_FOLDER_AGAIN}",
        )
    return end


def _check_folder_ids(decoder: CachedDecoder, folder: Path, end: int, rows: list) -> None:
    """The config's end token and the tokenizer's ids within the decoder's vocabulary."""
    vocabulary = decoder.vocabulary
    within = f"outside the vocabulary [0, {vocabulary}) of model.onnx"
    if end >= vocabulary:
        raise DecoderFileError(
            folder / "genai_config.json",
            f'"model"."eos_token_id" is {end}: {within}; {_FOLDER_AGAIN}',
        )
    for index, row in enumerate(rows):
        outside = [token for token in row if token >= vocabulary]
        if outside:
            raise DecoderFileError(
                folder / "tokenizer.json",
                f"it encodes prompt {index} to id {outside[0]}, {within}: it is not the "
                f"model's tokenizer; {_FOLDER_AGAIN}",
            )


def _stepper(decoder: CachedDecoder, batch: int, capacity: int):
    """A function of the new tokens giving their logits, the cache kept
    inside: one shared buffer where the decoder allows it (`SharedCache`),
    else a new cache each step."""
    if decoder.shares_buffer:
        return SharedCache(decoder, batch, capacity).step
    cache = [decoder.empty_cache(batch)]

    def step(token_ids):
        logits, cache[0] = decoder.step(token_ids, cache[0])
        return logits

    return step


def padded_greedy(
    decoder, token_ids, padding_mask, max_new_tokens: int, side: str = "right", with_logits=False
):
    """Greedy tokens the way onnxruntime-genai and Hugging Face run a batch:
    the whole padded prompt in one call with `attention_mask` and
    `position_ids`, then one token a row per call. This is how the export
    proves a decoder honours those inputs (`generate` needs neither: it runs
    prompts in lockstep).

    Args:
        decoder: a `CachedDecoder` whose file takes `attention_mask` and `position_ids`.
        token_ids: int array (batch, length), each row's prompt at its start.
        padding_mask: booleans like `token_ids`, True on each row's prompt.
        max_new_tokens: tokens each row gains.
        side: "right" (genai's: padding after each prompt) or "left" (each
            prompt moved to the end of its row, padding before it).
        with_logits: also return the logits each new token was chosen from.

    Returns:
        (batch, length + max_new_tokens) as `generate` returns them: each
        row's prompt, then its new tokens, then 0; with `with_logits`, a pair
        of those and the logits (batch, max_new_tokens, vocabulary).

    Raises:
        ValueError: the file takes no padding inputs, or `side` is neither.
    """
    if set(decoder.padding_dtypes) != set(_PADDING) or side not in ("right", "left"):
        raise ValueError(
            f"padded_greedy needs a decoder with {' and '.join(_PADDING)} inputs and side "
            f"'right' or 'left' (got {sorted(decoder.padding_dtypes)}, side={side!r})"
        )
    token_ids, mask = np.asarray(token_ids), np.asarray(padding_mask, bool)
    batch, width = token_ids.shape
    lengths, rows = mask.sum(axis=1), np.arange(batch)
    prompts = np.where(mask, token_ids, 0)
    if side == "left":  # each row's prompt right-aligned
        order = (np.arange(width) - (width - lengths)[:, None]) % width
        prompts, mask = prompts[rows[:, None], order], mask[rows[:, None], order]
    attention = mask.astype(np.int64)
    positions = np.maximum(np.cumsum(attention, axis=1) - 1, 0)
    logits, cache = decoder.step(prompts, decoder.empty_cache(batch), attention, positions)
    last = logits[rows, lengths - 1] if side == "right" else logits[:, -1]
    tokens = np.zeros((batch, width + max_new_tokens), decoder.ids_dtype)
    tokens[:, :width] = np.where(np.asarray(padding_mask, bool), token_ids, 0)
    chosen_from = []
    for step in range(max_new_tokens):
        chosen_from.append(last)
        chosen = last.argmax(axis=-1)
        tokens[rows, lengths + step] = chosen
        if step + 1 == max_new_tokens:
            break
        attention = np.concatenate([attention, np.ones((batch, 1), np.int64)], axis=1)
        positions = (lengths + step)[:, None]
        logits, cache = decoder.step(chosen[:, None], cache, attention, positions)
        last = logits[:, -1]
    return (tokens, np.stack(chosen_from, axis=1)) if with_logits else tokens
