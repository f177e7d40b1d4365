"""What every generation loop shares: argument checks, samplers, the lockstep loop, tokenizers.

A decoder-only folder (`generation`) and an encoder-decoder folder
(`seq2seq_generation`) check their arguments alike, sample alike
(`next_tokens`), run a batch's prompts in lockstep alike (`lockstep`) and read
a folder's `tokenizer.json` alike; those pieces live here, below both. NumPy
and the standard library only (ONNX Runtime and `tokenizers` where a
function needs them), never TensorFlow or Keras.
"""

import math
import numbers
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from keras_layers.export.errors import DecoderFileError, one_line

SAMPLERS = ("greedy", "top_k", "top_p")


_FOLDER_AGAIN = "export the folder again with --task causal-lm -o FOLDER/"


_ONNX_TYPES = {
    f"tensor({name})": np.dtype(name)
    for name in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
} | {
    "tensor(bool)": np.dtype(bool),
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(double)": np.dtype(np.float64),
}


class ArgumentTypeError(TypeError, ValueError):
    """An argument of `generate` of the wrong type. A `TypeError`, and a
    `ValueError` too: `generate` raised `ValueError` for every bad argument
    before types were told apart, and code that catches it keeps working."""


def _numpy_dtype(onnx_type: str, name: str, path: Path) -> np.dtype:
    if onnx_type not in _ONNX_TYPES:
        raise DecoderFileError(
            path,
            f"its {name!r} is of type {onnx_type}, which generate does not feed or read; "
            "export the model with --task causal-lm",
        )
    return _ONNX_TYPES[onnx_type]


def _said(error: BaseException) -> str:
    """What a library's error says, on one line, cut short."""
    return one_line(f"{type(error).__name__}: {error}", 200)


def _shown(value) -> str:
    """`repr(value)` on one line, cut short."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)


def _finite(value) -> bool:
    try:
        return math.isfinite(value)
    except (OverflowError, TypeError, ValueError):
        return False


def _array(name: str, value) -> np.ndarray:
    try:
        return np.asarray(value)
    except (ValueError, TypeError, OverflowError) as error:
        raise ArgumentTypeError(
            f"{name}={_shown(value)}: not an array ({' '.join(str(error).split())[:120]}); "
            "give a rectangular array of shape (batch, prompt length)"
        ) from error


def _check_ids(token_ids) -> np.ndarray:
    """2-D integers, at least one row and one token; their range needs the model."""
    ids = _array("token_ids", token_ids)
    if ids.ndim != 2 or 0 in ids.shape:
        raise ValueError(
            f"token_ids of shape {ids.shape}: must be of shape (batch, prompt length) with at "
            "least one row and one token a row; wrap one prompt as [ids]"
        )
    if ids.dtype.kind not in "iu":
        raise ArgumentTypeError(
            f"token_ids of dtype {ids.dtype}: not integer ids (bools, floats, strings and "
            "objects are refused); give int32 or int64 token ids"
        )
    return ids


def _check_mask(padding_mask, shape: tuple) -> np.ndarray:
    """Booleans or 0/1 numbers, right padding, at least one token a row."""
    if padding_mask is None:
        return np.ones(shape, bool)
    mask = _array("padding_mask", padding_mask)
    if mask.dtype.kind not in "biuf":
        raise ArgumentTypeError(
            f"padding_mask of dtype {mask.dtype}: not booleans or 0/1 numbers; give True (or "
            "1) on each prompt token and False (or 0) on padding"
        )
    if mask.shape != shape:
        raise ValueError(
            f"padding_mask of shape {mask.shape}: token_ids has shape {shape}; give one mask "
            "value per token (True for a prompt token)"
        )
    if mask.dtype.kind != "b":
        odd = np.argwhere(~np.isin(mask, (0, 1)))
        if len(odd):
            row, position = odd[0]
            raise ValueError(
                f"padding_mask[{row}, {position}]={mask[row, position].item()!r}: not 0 or 1; "
                "give True (or 1) on each prompt token and False (or 0) on padding"
            )
        mask = mask == 1
    lengths = mask.sum(axis=1)
    for row in np.flatnonzero(lengths == 0)[:1]:
        raise ValueError(
            f"padding_mask[{row}] marks no token: every row needs at least one prompt token; "
            "drop the row or give it a prompt"
        )
    holes = np.argwhere(mask != (np.arange(shape[1]) < lengths[:, None]))
    if len(holes):
        row, position = holes[0]
        raise ValueError(
            f"padding_mask[{row}] is not right padding: position {position} is padding before "
            f"prompt token {np.flatnonzero(mask[row])[-1]}; mark each row's prompt at its "
            "start (right padding, as keras-hub's preprocessors write it), padding after it"
        )
    return mask


def _check_count(max_new_tokens) -> None:
    if not _is_int(max_new_tokens):
        raise ArgumentTypeError(
            f"max_new_tokens={_shown(max_new_tokens)}: must be an int (not a bool or a "
            "float); give a count of new tokens"
        )
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens}: must be at least 1")


def _check_sampler(sampler, top_k, top_p, temperature) -> tuple[int, float, float]:
    """The sampler's numbers as `next_tokens` takes them (int, float, float)."""
    names = ", ".join(SAMPLERS)
    if not isinstance(sampler, str):
        raise ArgumentTypeError(f"sampler={_shown(sampler)}: not a name; use one of {names}")
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler={_shown(sampler)}: unknown; use one of {names}")
    if not _is_int(top_k):
        raise ArgumentTypeError(f"top_k={_shown(top_k)}: must be an int; give a count >= 1")
    if top_k < 1:
        raise ValueError(f"top_k={top_k}: must be a positive int (tokens kept)")
    for name, value, wanted in (("top_p", top_p, "in (0, 1]"), ("temperature", temperature, "> 0")):
        if not _is_real(value):
            raise ArgumentTypeError(
                f"{name}={_shown(value)}: must be a real number (not a bool or a string); give "
                f"a float {wanted}"
            )
    if not (_finite(top_p) and 0 < top_p <= 1):
        raise ValueError(f"top_p={_shown(top_p)}: must lie in (0, 1] (probability mass kept)")
    if not (_finite(temperature) and temperature > 0):
        raise ValueError(f"temperature={_shown(temperature)}: must be finite and positive")
    return int(top_k), float(top_p), float(temperature)


def _check_seed(seed) -> None:
    if seed is None or isinstance(seed, np.random.Generator):
        return
    if not _is_int(seed):
        raise ArgumentTypeError(
            f"seed={_shown(seed)}: must be an int, a numpy.random.Generator or None"
        )
    if seed < 0:
        raise ValueError(f"seed={seed}: must be non-negative")


def _check_token_type(name: str, value, none_allowed: bool) -> None:
    if (value is None and none_allowed) or _is_int(value):
        return
    allowed = "an int token id or None" if none_allowed else "an int token id"
    raise ArgumentTypeError(f"{name}={_shown(value)}: must be {allowed}")


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def next_tokens(logits, sampler="greedy", rng=None, top_k=50, top_p=0.9, temperature=1.0):
    """Pick one token per row from `logits` (batch, vocabulary).

    `greedy` takes the largest logit (the first on a tie, as `np.argmax` and
    Keras do). `top_k` samples from the `top_k` largest, `top_p` from the
    fewest tokens whose probabilities add up to `top_p` (nucleus sampling),
    both from `softmax(logits / temperature)` renormalised over what is kept.
    The arguments are not checked here; `generate` checks its own.

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


def _picker(sampler, seed, top_k, top_p, temperature):
    """`next_tokens` as a function of the logits alone, its arguments checked."""
    top_k, top_p, temperature = _check_sampler(sampler, top_k, top_p, temperature)
    _check_seed(seed)
    rng = np.random.default_rng(seed)

    def pick(logits):
        return next_tokens(logits, sampler, rng, top_k, top_p, temperature)

    return pick


def _is_text(token_ids) -> bool:
    if isinstance(token_ids, str):
        return True
    return (
        isinstance(token_ids, list | tuple)
        and bool(token_ids)
        and all(isinstance(item, str) for item in token_ids)
    )


def _prompt(prompts, index: int) -> str:
    """Text prompt `index` as the caller gave it: `token_ids` alone, or one of a list."""
    return "token_ids" if isinstance(prompts, str) else f"token_ids[{index}]"


def _texts(prompts) -> list:
    """Text prompts as a list (one string: a list of one)."""
    return [prompts] if isinstance(prompts, str) else list(prompts)


def _check_text(prompts, padding_mask, pad_token_id) -> None:
    """Text prompts must be valid Unicode. `padding_mask` and `pad_token_id`
    have nothing to act on there (each string is one prompt, and the new
    text holds no padding): refused, not ignored."""
    if padding_mask is not None:
        raise ValueError(
            f"padding_mask={_shown(padding_mask)}: text prompts are not padded (each string is "
            "one prompt, which generate tokenizes and lines up itself); leave padding_mask out, "
            "or give token ids"
        )
    if not (_is_int(pad_token_id) and pad_token_id == 0):  # 0: the default, not given
        raise ValueError(
            f"pad_token_id={_shown(pad_token_id)}: text prompts return each prompt's new text, "
            "which holds no padding; leave pad_token_id out, or give token ids"
        )
    for index, text in enumerate(_texts(prompts)):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:  # only a lone surrogate has no UTF-8
            raise ValueError(
                f"{_prompt(prompts, index)}={_shown(text)}: not valid text (a lone surrogate "
                f"U+{ord(text[error.start]):04X} at character {error.start} has no UTF-8 "
                "encoding); give the prompt as valid Unicode"
            ) from error


def _folder_tokenizer(path: Path, truncate: bool = False, again: str = _FOLDER_AGAIN):
    """The folder's `tokenizer.json`, as it encodes: no padding, and no
    truncation unless `truncate` (an encoder's input, truncated as keras-hub's
    preprocessor truncates it); `again` says how to write the folder anew."""
    try:
        from tokenizers import Tokenizer
    except ImportError as error:
        raise ValueError(
            "text prompts need the tokenizers library: pip install 'keras-layers[text]'"
        ) from error
    with _tokenizer_failures(path, "cannot read it", again):
        tokenizer = Tokenizer.from_file(str(path))
        tokenizer.no_padding()
        if not truncate:
            tokenizer.no_truncation()
    return tokenizer


def _is_rust_panic(error: BaseException) -> bool:
    """Whether `error` is a Rust panic of a library built with pyo3
    (`tokenizers`): a `pyo3_runtime.PanicException`, which derives from
    `BaseException` so that `except Exception` lets it through, and which
    pyo3 exports from no module to import; told by its type's name."""
    return any(
        kind.__module__ == "pyo3_runtime" and kind.__name__ == "PanicException"
        for kind in type(error).__mro__
    )


@contextmanager
def _tokenizer_failures(path: Path, doing: str, again: str = _FOLDER_AGAIN) -> Iterator[None]:
    """What the tokenizers library raises in the block, a Rust panic
    included, as a `DecoderFileError` on `path` ending with `again` (how to
    write the folder anew): the prompts are checked before, so the file is
    at fault. KeyboardInterrupt and SystemExit pass."""
    try:
        yield
    except BaseException as error:
        if not (isinstance(error, Exception) or _is_rust_panic(error)):
            raise
        raise DecoderFileError(
            path, f"the tokenizers library {doing} ({_said(error)}); {again}"
        ) from error


def encode_texts(tokenizer, path: Path, prompts, what: str, empty: str, again: str) -> list:
    """Each text's ids by a folder's tokenizer; a text of no token refused.

    Args:
        tokenizer: from `_folder_tokenizer(path)`.
        path: its file, named when the library fails.
        prompts: one string or a list of them (checked by `_check_text`).
        what: what a text is called in a failure ("prompt", "input").
        empty: why an empty result is refused, and what to do.
        again: how to write the folder anew.

    Returns:
        One list of ids a text.

    Raises:
        ValueError: a text encodes to no token.
        DecoderFileError: the library fails on a text.
    """
    rows = []
    for index, text in enumerate(_texts(prompts)):
        with _tokenizer_failures(path, f"fails on {what} {index}", again):
            rows.append(tokenizer.encode(text).ids)
        if not rows[-1]:
            raise ValueError(f"{_prompt(prompts, index)}={_shown(text)}: {empty}")
    return rows


def right_padded(rows: list) -> tuple:
    """Rows of ids as one int64 array, right-padded with 0, and its mask."""
    ids = np.zeros((len(rows), max(len(row) for row in rows)), np.int64)
    mask = np.zeros(ids.shape, bool)
    for index, row in enumerate(rows):
        ids[index, : len(row)], mask[index, : len(row)] = row, True
    return ids, mask


def decode_texts(
    tokenizer, path: Path, new_rows: list, end, prompts, what: str, again: str, dropped=None
):
    """Each row's new tokens, up to its end token, as text.

    Args:
        tokenizer: from `_folder_tokenizer(path)`.
        path: its file, named when the library fails.
        new_rows: each row's new ids (lists).
        end: the end id (not decoded, nor what follows it), or None.
        prompts: the texts generated from (one string: one string back).
        what: what a text is called in a failure ("prompt", "input").
        again: how to write the folder anew.
        dropped: ids removed before decoding the rest with every special
            token's text, as keras-hub's `Seq2SeqLM.generate_postprocess`
            removes its start, end and pad ids (None: every special token
            skipped).

    Returns:
        One string, or a list of them, as `prompts` was given.
    """
    decoded = []
    for index, new in enumerate(new_rows):
        new = new[: new.index(end)] if end is not None and end in new else new
        if dropped is not None:
            new = [token for token in new if token not in dropped]
        with _tokenizer_failures(path, f"fails on the new tokens of {what} {index}", again):
            decoded.append(tokenizer.decode(new, skip_special_tokens=dropped is None))
    return decoded[0] if isinstance(prompts, str) else decoded


def lockstep(step, dtype, token_ids, mask, max_new_tokens, pick, end_token_id, pad_token_id):
    """The lockstep loop of `generate` (and of an encoder-decoder's,
    `seq2seq_generation`), its arguments checked.

    Args:
        step: a function of the new tokens (batch, n) giving their logits
            (batch, n, vocabulary), the cache kept inside.
        dtype: the ids' NumPy type (the file's `input_ids`).
        token_ids: prompts (batch, length), right-padded.
        mask: booleans like `token_ids`, True on each row's prompt.
        max_new_tokens: tokens each row gains.
        pick: `next_tokens` as a function of the last logits (batch, vocabulary).
        end_token_id: a row stops after this id (None: never).
        pad_token_id: written after each row's end.

    Returns:
        (batch, length + max_new_tokens): each row's prompt, its new tokens,
        then `pad_token_id`.
    """
    batch, prompt_length = token_ids.shape
    lengths = mask.sum(axis=1)
    ends = lengths + max_new_tokens  # each row's length when done
    tokens = np.full((batch, prompt_length + max_new_tokens), pad_token_id, dtype)
    prompts = np.where(mask, token_ids, 0).astype(dtype)  # the ids checked to fit
    tokens[:, :prompt_length] = np.where(mask, prompts, pad_token_id)
    done = np.zeros(batch, bool)
    start = int(lengths.min())
    logits = step(tokens[:, :start])
    for position in range(start, int(ends.max())):
        sampled = pick(logits[:, -1])
        generating = (position >= lengths) & (position < ends) & ~done
        tokens[:, position] = np.where(generating, sampled, tokens[:, position])
        if end_token_id is not None:
            done |= generating & (sampled == end_token_id)
        if ((position + 1 >= ends) | done).all():
            break
        logits = step(tokens[:, position : position + 1])
    return tokens
