"""The gate of a quantized decoder: greedy tokens and log-likelihood against Keras.

A quantized decoder cannot give Keras' logits within the float tolerances:
its weights moved. What a user of a language model sees is the text it
generates and how likely it finds real text, so a quantized file is judged
on both, against the float model in Keras:

- **greedy agreement**: for each check prompt, the share of the new greedy
  tokens that equal Keras' before the first one that differs (a greedy
  continuation that parts ways once goes its own way after), averaged over
  the prompts; it must be at least `min_agreement`;
- **log-likelihood change**: a held-out text (`HELD_OUT_TEXT`, through the
  model's tokenizer; a fixed run of ids without one), teacher-forced in one
  call: the mean over its tokens of |log p_quantized - log p_Keras| of each
  next token, in nats; it must be at most `max_nll_change`. The change of the
  mean negative log-likelihood (perplexity's logarithm) is reported too.

Keras' side is computed once, before the files are quantized
(`keras_side`); the files' side needs ONNX Runtime and NumPy only.
"""

from dataclasses import dataclass

import numpy as np

from keras_layers.export import generation

HELD_OUT_TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was "
    "the age of foolishness, it was the epoch of belief, it was the epoch of incredulity."
)
# Defaults of the gate (ExportOptions.decoder_min_agreement / decoder_max_nll_change).
MIN_AGREEMENT = 0.5
MAX_NLL_CHANGE = 0.25


@dataclass
class KerasSide:
    """The float model's side: the held-out ids and each next token's log-probability."""

    ids: np.ndarray  # (1, length)
    log_probs: np.ndarray  # (length - 1,)


def _log_probs(logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """log p(ids[t + 1] | ids[: t + 1]) for each t, from logits (length, vocabulary)."""
    logits = logits[:-1].astype(np.float64)
    top = logits.max(axis=-1, keepdims=True)
    log_norm = top[:, 0] + np.log(np.exp(logits - top).sum(axis=-1))
    return logits[np.arange(len(logits)), ids[1:]] - log_norm


def held_out_ids(preprocessor, vocabulary: int, context: int, dtype) -> np.ndarray:
    """The held-out text's ids (1, length), cut to the context.

    Args:
        preprocessor: the causal LM's preprocessor, or None (then a fixed run of ids).
        vocabulary: the decoder's vocabulary.
        context: the longest sequence the folder runs.
        dtype: the ids' dtype.

    Returns:
        The ids, at least 2 of them.
    """
    if preprocessor is None:
        ids = np.arange(1, 49) * 7 % vocabulary
    else:
        packed = preprocessor.generate_preprocess([HELD_OUT_TEXT])
        mask = np.asarray(packed["padding_mask"][0]).astype(bool)
        ids = np.asarray(packed["token_ids"][0])[mask]
    return ids[: max(2, min(len(ids), context))][None].astype(dtype)


def keras_side(forward_logits, ids: np.ndarray) -> KerasSide:
    """Keras' log-probabilities of the held-out ids.

    Args:
        forward_logits: `ids -> logits (1, length, vocabulary)`, the model
            recomputing the sequence (`causal_lm.forward_logits`).
        ids: the held-out ids (1, length).

    Returns:
        What `judge` compares a file with.
    """
    return KerasSide(ids, _log_probs(np.asarray(forward_logits(ids))[0], ids[0]))


def agreement(got: list, expected: list, prompt_length: int) -> float:
    """The share of Keras' new tokens that `got` repeats before its first
    difference; a run that stops early on the same token as Keras (an end
    token) counts as agreeing to the end.

    Args:
        got: the file's sequence: the prompt, then its new tokens.
        expected: Keras' sequence, as long as was asked.
        prompt_length: the prompt's length.

    Returns:
        A share between 0 and 1.
    """
    new = expected[prompt_length:]
    if len(got) < len(expected) and got == expected[: len(got)] and len(got) > prompt_length:
        return 1.0
    same = 0
    for ours, theirs in zip(got[prompt_length:], new, strict=False):
        if ours != theirs:
            break
        same += 1
    return same / max(1, len(new))


def judge(path, expected: list, keras: KerasSide, min_agreement: float, max_nll_change: float):
    """Run the quantized decoder and measure it against Keras.

    Args:
        path: the quantized decoder's file.
        expected: `(prompt ids, Keras' greedy tokens)` per check prompt.
        keras: Keras' side of the held-out text (`keras_side`).
        min_agreement: the least mean greedy agreement that passes.
        max_nll_change: the largest mean |log-probability change| that passes.

    Returns:
        `{"passed", "greedy_agreement", "per_prompt", "mean_abs_log_prob_change",
        "nll_change", "held_out_tokens", "thresholds", "failure"}`.
    """
    decoder = generation.CachedDecoder(path)
    per_prompt = []
    for ids, tokens in expected:
        new = len(tokens) - len(ids)
        got = generation.generate(decoder, [ids], new)[0].tolist()
        per_prompt.append(agreement(got, tokens, len(ids)))
    logits, _ = decoder.step(keras.ids, decoder.empty_cache(1))
    ours = _log_probs(logits[0], keras.ids[0])
    change = float(np.abs(ours - keras.log_probs).mean())
    mean_agreement = float(np.mean(per_prompt))
    failure = ""
    if mean_agreement < min_agreement:
        failure = f"greedy agreement {mean_agreement:.3f} < {min_agreement}"
    elif change > max_nll_change:
        failure = f"mean |log p change| {change:.4f} nats/token > {max_nll_change}"
    return {
        "passed": not failure,
        "greedy_agreement": mean_agreement,
        "per_prompt": per_prompt,
        "mean_abs_log_prob_change": change,
        "nll_change": float(keras.log_probs.mean() - ours.mean()),
        "held_out_tokens": int(keras.ids.shape[1]),
        "thresholds": {"min_agreement": min_agreement, "max_nll_change": max_nll_change},
        "failure": failure,
    }
