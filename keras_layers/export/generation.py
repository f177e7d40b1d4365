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

Nothing here imports TensorFlow or Keras: a server that only generates needs
`onnxruntime` and `numpy`.

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

from dataclasses import dataclass
from pathlib import Path

import numpy as np

SAMPLERS = ("greedy", "top_k", "top_p")
_PAST = "past_key_values."


@dataclass(frozen=True)
class CacheInput:
    """One `past_key_values.{layer}.{key|value}` input of the file."""

    name: str
    heads: int
    head_size: int
    dtype: np.dtype

    @classmethod
    def read(cls, value) -> "CacheInput":
        """From ONNX Runtime's description of the input (batch, heads,
        past_sequence, head size)."""
        return cls(value.name, value.shape[1], value.shape[3], _numpy_dtype(value.type))

    def empty(self, batch: int) -> np.ndarray:
        return np.zeros((batch, self.heads, 0, self.head_size), self.dtype)


class CachedDecoder:
    """An ONNX Runtime session over an exported decoder, one call at a time.

    Args:
        onnx_path: the file `--task causal-lm` wrote (its data file beside it).
        session_options: `onnxruntime.SessionOptions`, or None for the defaults.

    Example:

    >>> decoder = CachedDecoder(tmp / "gpt2.onnx")
    >>> cache = decoder.empty_cache(batch=2)
    >>> logits, cache = decoder.step(np.array([[5, 6, 7], [8, 9, 10]]), cache)
    >>> logits.shape[:2], decoder.cache_length(cache)
    ((2, 3), 3)
    """

    def __init__(self, onnx_path, session_options=None):
        import onnxruntime as ort

        path = Path(onnx_path)
        if not path.is_file():
            raise FileNotFoundError(
                f"onnx_path={str(path)!r}: no ONNX file at this path; give the file that "
                "--task causal-lm wrote"
            )
        self.session = ort.InferenceSession(
            str(path), session_options, providers=["CPUExecutionProvider"]
        )
        inputs = {value.name: value for value in self.session.get_inputs()}
        if "input_ids" not in inputs or not any(name.startswith(_PAST) for name in inputs):
            raise ValueError(
                f"onnx_path={str(path)!r}: not a decoder with a key/value cache (its inputs are "
                f"{sorted(inputs)}); export the model with --task causal-lm"
            )
        self.ids_dtype = _numpy_dtype(inputs["input_ids"].type)
        self.cache_inputs = [
            CacheInput.read(value) for name, value in inputs.items() if name.startswith(_PAST)
        ]
        self.output_names = [value.name for value in self.session.get_outputs()]
        self.presents = [name.replace(_PAST, "present.") for name in self._cache_names]

    @property
    def _cache_names(self) -> list:
        return [cache.name for cache in self.cache_inputs]

    def empty_cache(self, batch: int) -> dict:
        """Caches holding no tokens, for the first call."""
        return {cache.name: cache.empty(batch) for cache in self.cache_inputs}

    @staticmethod
    def cache_length(cache: dict) -> int:
        """How many tokens the caches hold."""
        return next(iter(cache.values())).shape[2]

    def step(self, token_ids: np.ndarray, cache: dict) -> tuple[np.ndarray, dict]:
        """Run the file on the new tokens.

        Args:
            token_ids: int array (batch, new tokens).
            cache: the caches of the previous step (or `empty_cache`'s).

        Returns:
            (the new tokens' logits (batch, new tokens, vocabulary), the grown caches).
        """
        feeds = {"input_ids": np.asarray(token_ids, self.ids_dtype), **cache}
        outputs = dict(zip(self.output_names, self.session.run(None, feeds), strict=True))
        pairs = zip(self._cache_names, self.presents, strict=True)
        grown = {name: outputs[present] for name, present in pairs}
        return outputs["logits"], grown


def _numpy_dtype(onnx_type: str) -> np.dtype:
    names = {"tensor(int32)": np.int32, "tensor(int64)": np.int64}
    names |= {"tensor(float)": np.float32, "tensor(float16)": np.float16}
    names |= {"tensor(double)": np.float64}
    return np.dtype(names[onnx_type])


def _check_prompt(token_ids, padding_mask, max_new_tokens) -> tuple[np.ndarray, np.ndarray]:
    token_ids = np.asarray(token_ids)
    if (
        token_ids.ndim != 2
        or token_ids.shape[1] == 0
        or not np.issubdtype(token_ids.dtype, np.integer)
    ):
        raise ValueError(
            f"token_ids={token_ids.dtype} {token_ids.shape}: not integer ids of shape (batch, "
            "prompt length) with at least one token; wrap one prompt as [ids]"
        )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int | np.integer):
        raise ValueError(f"max_new_tokens={max_new_tokens!r}: must be an int; give a count")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: must be at least 1")
    if padding_mask is None:
        return token_ids, np.ones(token_ids.shape, bool)
    mask = np.asarray(padding_mask).astype(bool)
    if mask.shape != token_ids.shape:
        raise ValueError(
            f"padding_mask of shape {mask.shape}: token_ids has shape {token_ids.shape}; give "
            "one mask value per token (True for a prompt token)"
        )
    lengths = mask.sum(axis=1)
    right_padded = mask == (np.arange(mask.shape[1]) < lengths[:, None])
    if not right_padded.all() or lengths.min() == 0:
        raise ValueError(
            "padding_mask: a row is not right padding or holds no token; mark each row's "
            "prompt at its start (right padding, as keras-hub's preprocessors write it), at "
            "least one token a row"
        )
    return token_ids, mask


def _check_sampler(sampler, top_k, top_p, temperature) -> None:
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler={sampler!r}: unknown; use one of {', '.join(SAMPLERS)}")
    if isinstance(top_k, bool) or not isinstance(top_k, int | np.integer) or top_k < 1:
        raise ValueError(f"top_k={top_k!r}: must be a positive int")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p!r}: must lie in (0, 1]")
    if not temperature > 0:
        raise ValueError(f"temperature={temperature!r}: must be positive")


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def next_tokens(logits, sampler="greedy", rng=None, top_k=50, top_p=0.9, temperature=1.0):
    """Pick one token per row from `logits` (batch, vocabulary).

    `greedy` takes the largest logit (the first on a tie, as `np.argmax` and
    Keras do). `top_k` samples from the `top_k` largest, `top_p` from the
    fewest tokens whose probabilities add up to `top_p` (nucleus sampling),
    both from `softmax(logits / temperature)` renormalised over what is kept.

    Args:
        logits: float array (batch, vocabulary).
        sampler: `"greedy"`, `"top_k"` or `"top_p"`.
        rng: a `numpy.random.Generator` (for the samplers).
        top_k: tokens kept by `"top_k"`.
        top_p: probability mass kept by `"top_p"`.
        temperature: logits are divided by it before sampling.

    Returns:
        int array (batch,): one token id per row.
    """
    logits = np.asarray(logits, np.float64)
    if sampler == "greedy":
        return logits.argmax(axis=-1)
    probs = _softmax(logits / temperature)
    order = np.argsort(-probs, axis=-1, kind="stable")
    ranked = np.take_along_axis(probs, order, axis=-1)
    if sampler == "top_k":
        keep = np.arange(ranked.shape[-1]) < top_k
    else:  # top_p: every token until the running total first reaches top_p
        before = np.cumsum(ranked, axis=-1) - ranked
        keep = before < top_p
    ranked = np.where(keep, ranked, 0.0)
    ranked /= ranked.sum(axis=-1, keepdims=True)
    draws = rng.random((ranked.shape[0], 1))
    picks = (np.cumsum(ranked, axis=-1) < draws).sum(axis=-1)
    picks = np.minimum(picks, keep.sum(axis=-1) - 1)  # a draw past rounding
    return np.take_along_axis(order, picks[:, None], axis=-1)[:, 0]


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

    Args:
        onnx_path: a file `--task causal-lm` wrote, or a `CachedDecoder`
            (reused across calls).
        token_ids: int array (batch, prompt length); rows shorter than the
            longest are right-padded (any id) and marked by `padding_mask`.
        max_new_tokens: how many tokens each row gains.
        padding_mask: bool array like `token_ids`, True on prompt tokens
            (keras-hub's `padding_mask`); default all True.
        sampler: `"greedy"`, `"top_k"` or `"top_p"`.
        seed: seeds the sampling (`numpy.random.default_rng(seed)`); the same
            seed gives the same tokens.
        end_token_id: a row stops after it generates this id.
        top_k: tokens kept by `"top_k"`.
        top_p: probability mass kept by `"top_p"`.
        temperature: logits are divided by it before sampling.
        pad_token_id: written after each row's end.

    Returns:
        int array (batch, prompt length + max_new_tokens): row `i` holds its
        prompt (its first `padding_mask[i].sum()` ids), then its new tokens
        (up to and including `end_token_id`), then `pad_token_id`.

    Raises:
        FileNotFoundError: no file at `onnx_path`.
        ValueError: the file is no decoder with a cache, or an argument is out
            of range; the message names it (`argument=value: why; what to do`).

    Example:

    >>> tokens = generate(tmp / "gpt2.onnx", [[5, 6, 7], [8, 9, 0]], max_new_tokens=4,
    ...                   padding_mask=[[1, 1, 1], [1, 1, 0]])
    >>> tokens.shape
    (2, 7)
    >>> int(tokens[1, -1])  # the shorter row ends with padding
    0
    """
    token_ids, mask = _check_prompt(token_ids, padding_mask, max_new_tokens)
    _check_sampler(sampler, top_k, top_p, temperature)
    decoder = onnx_path if isinstance(onnx_path, CachedDecoder) else CachedDecoder(onnx_path)
    rng = np.random.default_rng(seed)
    batch, prompt_length = token_ids.shape
    lengths = mask.sum(axis=1)
    ends = lengths + max_new_tokens  # each row's length when done
    tokens = np.full((batch, prompt_length + max_new_tokens), pad_token_id, token_ids.dtype)
    tokens[:, :prompt_length] = np.where(mask, token_ids, pad_token_id)
    done = np.zeros(batch, bool)
    start = int(lengths.min())
    logits, cache = decoder.step(tokens[:, :start], decoder.empty_cache(batch))
    for position in range(start, int(ends.max())):
        sampled = next_tokens(logits[:, -1], sampler, rng, top_k, top_p, temperature)
        generating = (position >= lengths) & (position < ends) & ~done
        tokens[:, position] = np.where(generating, sampled, tokens[:, position])
        if end_token_id is not None:
            done |= generating & (sampled == end_token_id)
        if ((position + 1 >= ends) | done).all():
            break
        logits, cache = decoder.step(tokens[:, position : position + 1], cache)
    return tokens
