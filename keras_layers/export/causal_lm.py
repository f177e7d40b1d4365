"""`--task causal-lm`: export a decoder with its key/value cache; prove it generates as Keras does.

A model is exportable this way when it follows keras-hub's `CausalLM`
protocol, which every keras-hub causal LM with a plain text cache follows
(GPT-2, OPT, Llama, Mistral, Gemma, Qwen, Phi-3, Falcon, Bloom, GPT-NeoX, ...)
and `keras_layers.demo.TiedDecoder` shows for a model of one's own:

- `call_with_cache(token_ids, cache, cache_update_index)` returns
  `(logits, hidden_states, cache)`: the logits of `token_ids`, which sit at
  positions `cache_update_index ...` of the sequence, after writing their keys
  and values into `cache` at those positions and attending to every earlier one;
- `_build_cache(token_ids)` returns `(hidden_states, cache)`, the cache shaped
  (batch, layers, 2, sequence, heads, head size), key then value.

The exported graph turns that fixed-length cache into the growing one of
optimum and onnxruntime-genai: it appends room for the new tokens to each
`past_key_values.{i}.key/value` (batch, heads, past, head size), calls
`call_with_cache` at index `past`, and returns the filled caches as
`present.{i}.key/value`. The checks then run the file next to Keras:
`references` (Keras only, so a big model can be released before ONNX Runtime
maps the file) and `validate` (ONNX Runtime only, through
`keras_layers.export.generation`). `keras_layers.export.tasks.causal_lm` runs
them as the pipeline's stages.
"""

import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import numpy as np

from keras_layers.export import compat, generation, validating
from keras_layers.export.axes import PAST_AXIS
from keras_layers.export.compat import patched
from keras_layers.export.errors import UsageError, one_line
from keras_layers.export.loading import LoadedModel, TensorInfo, flatten
from keras_layers.export.tracing import TracedModel, trace_call

# The inputs of a padded batch, as onnxruntime-genai and optimum name them.
PADDING_INPUTS = ("attention_mask", "position_ids")
# Validation: decode steps after the prompt, checked logit by logit against
# Keras' own cached call, and as many greedy tokens compared with Keras
# recomputing the whole sequence at every step.
DECODE_STEPS = 32
STEP_PROMPT = (4, 9)  # batch, prompt length of the step-by-step check
GREEDY_PROMPTS = ((7,), (5, 9, 2, 12))  # prompt lengths of each greedy batch


@dataclass
class Decoder:
    """What the causal-lm stages know of the model: its cache and sizes."""

    layers: int
    heads: int
    head_size: int
    dtype: str
    vocabulary: int
    ids_dtype: str = "int32"
    max_length: int | None = None
    # `attention_mask` and `position_ids` inputs (`padding_inputs`).
    padded: bool = False
    # The model's own inputs and outputs, for recomputing whole sequences.
    forward_inputs: list = field(default_factory=list)
    forward_outputs: list = field(default_factory=list)

    def cache_names(self, prefix: str) -> list:
        return [f"{prefix}.{i}.{kind}" for i in range(self.layers) for kind in ("key", "value")]

    def _cache_info(self, name: str, sequence: str) -> TensorInfo:
        """A cache in optimum's layout, (batch, heads, sequence, head size).
        (keras-hub's own, sequence before heads, generated fewer tokens a second
        side by side; benchmarks/results/generate.json times the layout kept.)"""
        shape = (None, self.heads, None, self.head_size)
        axes = ("batch", self.heads, sequence, self.head_size)
        return TensorInfo(name, shape, self.dtype, axes=axes)

    def inputs(self) -> list:
        ids = TensorInfo("input_ids", (None, None), self.ids_dtype, role="ids")
        ids.axes = ("batch", "sequence")
        extra = []
        if self.padded:
            extra = [TensorInfo(name, (None, None), "int64") for name in PADDING_INPUTS]
            extra[0].axes, extra[1].axes = ("batch", "total_sequence"), ("batch", "sequence")
        names = self.cache_names("past_key_values")
        return [ids, *extra] + [self._cache_info(name, PAST_AXIS) for name in names]

    def outputs(self) -> list:
        logits = TensorInfo("logits", (None, None, self.vocabulary), self.dtype)
        logits.axes = ("batch", "sequence", self.vocabulary)
        names = self.cache_names("present")
        return [logits] + [self._cache_info(name, "total_sequence") for name in names]


def _refuse(model, why: str) -> UsageError:
    return UsageError(
        f"--task causal-lm needs a decoder following keras-hub's CausalLM protocol "
        f"(`call_with_cache` and `_build_cache(token_ids)` with a cache shaped (batch, layers, "
        f"2, sequence, heads, head size)); {type(model).__name__} {why}. Export a keras-hub "
        "CausalLM, or see keras_layers.demo.TiedDecoder for a model of "
        "your own; without --task causal-lm the full-sequence forward pass is exported"
    )


def describe(loaded: LoadedModel) -> Decoder:
    """Read the cache layout by building a cache for one short prompt.

    Raises:
        UsageError: the model does not follow the protocol (named in the message).
    """
    from keras import ops

    model = loaded.model
    for method in ("call_with_cache", "_build_cache"):
        if not callable(getattr(model, method, None)):
            raise _refuse(model, f"has no `{method}` method")
    ids = ops.ones((1, 2), "int32")
    uses = {"mask": 0, "positions": 0}
    try:
        _, cache = model._build_cache(ids)
        with padding_inputs(ops.ones((1, 2), "int32"), ops.arange(2)[None], uses):
            logits = model.call_with_cache(ids, cache, 0)[0]
    except Exception as error:  # noqa: BLE001 - the model's own failure, named
        detail = one_line(f"{type(error).__name__}: {error}", 200)
        raise _refuse(model, f"fails on a 2-token prompt ({detail})") from error
    shape = tuple(cache.shape)
    if len(shape) != 6 or shape[0] != 1 or shape[2] != 2 or shape[3] != 2:
        raise _refuse(model, f"builds a cache of shape {shape}")
    ids_dtypes = [info.dtype for info in loaded.inputs if info.role == "ids"]
    return Decoder(
        layers=shape[1],
        heads=shape[4],
        head_size=shape[5],
        dtype=str(np.dtype(cache.dtype.name if hasattr(cache.dtype, "name") else cache.dtype)),
        vocabulary=int(logits.shape[-1]),
        ids_dtype=ids_dtypes[0] if ids_dtypes else "int32",
        max_length=loaded.max_length,
        padded=_takes_padding(model, uses),
        forward_inputs=list(loaded.inputs),
        forward_outputs=list(loaded.outputs),
    )


def _sliding_window(model) -> bool:
    """Whether a layer of the model attends through a sliding window."""
    for layer in model._flatten_layers(include_self=True, recursive=True):
        flag = getattr(layer, "use_sliding_window_attention", None)
        if flag is not None:
            if flag:
                return True
            continue
        if any(getattr(layer, name, None) for name in ("sliding_window", "sliding_window_size")):
            return True
    return False


def _takes_padding(model, uses: dict) -> bool:
    """Whether the decoder gets `attention_mask` and `position_ids`: keras-hub's
    causal mask and position layers (at the cache index) computed every
    position of the probe, and no sliding window counts distances in cache
    slots (right padding would put padding inside a row's window)."""
    return (
        uses["mask"] > 0
        and uses["positions"] > 0
        and not uses.get("other_positions")
        and not _sliding_window(model)
    )


def trace(loaded: LoadedModel, decoder: Decoder) -> TracedModel:
    """The decoder as a `tf.function` from `input_ids` and the past caches to
    `logits` and the present caches (the weights are inputs, as in `tracing`).

    Args:
        loaded: the loaded model, its inputs and outputs still its own call's.
        decoder: its cache layout (`describe`).

    Returns:
        The traced function, for `converting.convert`.

    Raises:
        UsageError: the model fails in Keras itself.
        ConversionError: it uses Python control flow on a tensor's value.
    """
    import tensorflow as tf

    model = loaded.model
    inputs, outputs = decoder.inputs(), decoder.outputs()
    specs = [tf.TensorSpec(info.shape, info.dtype, name=info.name) for info in inputs]
    swap = [0, 2, 1, 3]  # (batch, heads, sequence, size) <-> (batch, sequence, heads, size)

    def keras_layout(cache):  # keras-hub's (batch, sequence, heads, size), and back
        return tf.transpose(cache, swap)

    def call(token_ids, *past):
        mask, positions = past[:2] if decoder.padded else (None, None)
        past = past[2:] if decoder.padded else past
        new = tf.shape(token_ids)[1]
        start = tf.shape(keras_layout(past[0]))[1]
        per_layer, pasts = [], {}
        for layer in range(decoder.layers):
            key_value = []
            for kind, cache in enumerate(past[2 * layer : 2 * layer + 2]):
                cache = pasts[layer, kind] = keras_layout(cache)
                room_shape = [tf.shape(cache)[0], new, decoder.heads, decoder.head_size]
                room = tf.zeros(tf.stack(room_shape), cache.dtype)
                key_value.append(tf.concat([cache, room], axis=1))
            per_layer.append(tf.stack(key_value, axis=1))
        stacked = tf.stack(per_layer, axis=1)
        with (
            _cache_writes_as_appends(start, stacked, pasts),
            padding_inputs(mask, positions, {"mask": 0, "positions": 0}),
        ):
            logits, _, cache = model.call_with_cache(token_ids, stacked, start)
        present = [
            keras_layout(cache[:, layer, kind])  # (its own inverse)
            for layer in range(decoder.layers)
            for kind in (0, 1)
        ]
        return [tf.cast(logits, decoder.dtype), *present]

    return trace_call(loaded, call, specs, [info.name for info in outputs])


def _picked(tensor, stacked) -> tuple | None:
    """(layer, kind) when `tensor` is `stacked[:, layer, ...][:, kind, ...]`,
    read from the two `StridedSlice` ops TensorFlow traced for it; else None."""
    import tensorflow as tf

    indices = []
    for _ in range(2):
        op = tensor.op
        if op.type != "StridedSlice" or len(op.inputs) != 4:
            return None
        begin, end, strides = (tf.get_static_value(value) for value in op.inputs[1:])
        masks = [op.get_attr(name) for name in ("begin_mask", "end_mask", "ellipsis_mask")]
        masks += [op.get_attr("new_axis_mask"), op.get_attr("shrink_axis_mask")]
        if begin is None or end is None or strides is None or masks != [1, 1, 4, 0, 2]:
            return None
        if len(begin) != 3 or list(strides) != [1, 1, 1] or end[1] != begin[1] + 1:
            return None
        indices.append(int(begin[1]))
        tensor = op.inputs[0]
    return (indices[1], indices[0]) if tensor is stacked else None


@contextmanager
def padding_inputs(attention_mask, position_ids, uses: dict):
    """keras-hub's decoders, for the block, honour a padding mask and positions.

    keras-hub's cached call has one position for the whole batch (its
    `cache_update_index`), and its generate needs no more: prompts run in
    lockstep. onnxruntime-genai and Hugging Face's generation pad a batch
    instead (genai on the right) and pass `attention_mask` (batch, total
    length: 1 on tokens, 0 on padding) and `position_ids` (batch, new tokens:
    each token's position among its row's tokens). In the block, keras-hub's
    causal mask (`compute_causal_mask`, which its decoder layers import by
    name, `compat.CAUSAL_MASK_USERS`) is also false on padded keys, and its
    position layers (`RotaryEmbedding`, `PositionEmbedding`, called with a
    start index) take `position_ids` instead.

    Args:
        attention_mask: (batch, total length) integers, or None to change nothing.
        position_ids: (batch, new tokens) integers.
        uses: counts of each replacement's calls (`"mask"`, `"positions"`):
            `describe` gives the decoder these inputs only when both ran.
    """
    if attention_mask is None:
        yield
        return
    from importlib import import_module

    from keras import ops

    keys = ops.cast(attention_mask, "bool")[:, None, :]
    swaps = []
    for name in compat.CAUSAL_MASK_USERS:
        module = import_module(f"keras_hub.src.{name}")
        causal = compat.original(module, "compute_causal_mask")

        def masked(*args, causal=causal, **kwargs):
            uses["mask"] += 1
            return ops.logical_and(causal(*args, **kwargs), keys)

        swaps.append((module, "compute_causal_mask", masked))
    for name, cls in (
        ("rotary_embedding", "RotaryEmbedding"),
        ("position_embedding", "PositionEmbedding"),
    ):
        owner = getattr(import_module(f"keras_hub.src.layers.modeling.{name}"), cls)
        call = compat.original(owner, "call")

        def positioned(layer, inputs, start_index=None, positions=None, call=call):
            if start_index is None or positions is not None:  # not the cache index's
                uses["other_positions"] = uses.get("other_positions", 0) + 1
                return call(layer, inputs, start_index=start_index or 0, positions=positions)
            uses["positions"] += 1
            return call(layer, inputs, start_index=start_index, positions=position_ids)

        swaps.append((owner, "call", positioned))
    with ExitStack() as stack:
        for owner, name, value in swaps:
            stack.enter_context(patched(owner, name, value))
        yield


@contextmanager
def _cache_writes_as_appends(start, stacked, pasts: dict):
    """Trace the cache writes at `start` as appends.

    keras-hub's cached attention writes the new keys and values with
    `ops.slice_update(cache, [0, cache_update_index, 0, 0], update)`. In the
    graph `trace` builds, every such cache has exactly `start + new` rows (the
    past, then room for the new tokens) and the index is `start` itself, so
    the write is `concat([cache[:, :start], update])`: one copy, where the
    general conversion (`op_handlers.xla_dynamic_update_slice`) pads the
    update and a mask to the cache's size and selects (a `Where` over the
    whole cache at every step, which ONNX Runtime's profiler showed among a
    step's largest costs; benchmarks/results/generate.json times the files
    as exported). Other writes, or a Keras without this backend function, are
    traced as they are; the decode checks would catch a model that wrote a
    cache of another length at `start`.
    """
    try:
        from keras.src.backend.tensorflow import core
    except ImportError:
        yield
        return
    original = compat.original(core, "slice_update", None)
    if original is None:
        yield
        return
    import tensorflow as tf

    def slice_update(inputs, start_indices, updates):
        starts = list(start_indices) if isinstance(start_indices, list | tuple) else []
        appends = (
            len(starts) == 4
            and starts[1] is start
            and all(isinstance(s, int) and s == 0 for s in (starts[0], *starts[2:]))
        )
        if not appends:
            return original(inputs, start_indices, updates)
        # When the cache is one of `stacked`'s, its first `start` rows are
        # that layer's past itself: appended to without slicing it back out.
        found = _picked(inputs, stacked)
        kept = pasts[found] if found in pasts else inputs[:, :start]
        return tf.concat([kept, tf.cast(updates, inputs.dtype)], axis=1)

    with patched(core, "slice_update", slice_update):
        yield


@dataclass
class Reference:
    """Keras' side of the checks, computed before ONNX Runtime runs."""

    step_prompt: np.ndarray  # (batch, length) ids
    step_tokens: list  # the token fed at each decode step, (batch, 1)
    step_logits: list  # Keras' logits for the prompt, then for each step
    # Per batch: prompt ids, padding mask, Keras' greedy tokens, and for a
    # decoder with padding inputs the logits that chose each row's new tokens
    # (batch, new tokens, vocabulary), each row computed alone.
    greedy: list


@dataclass(frozen=True)
class Lengths:
    """The prompts and decode steps of the checks, fit to the model's positions."""

    step_prompt: tuple  # batch, prompt length of the step-by-step check
    greedy: tuple  # prompt lengths of each greedy batch
    steps: int  # decode steps, and new tokens of each greedy batch


def check_lengths(max_length: int | None) -> Lengths:
    """The checks' prompts and steps for a model of `max_length` positions.

    Prompts are cut to at most half the positions (`STEP_PROMPT` and
    `GREEDY_PROMPTS` as they are from 24 positions on), the decode steps to
    `DECODE_STEPS` and to what the longest prompt leaves. So the step check
    feeds at most `max_length` tokens, and each greedy batch less.

    Args:
        max_length: the longest sequence the model's position tables allow,
            or None when nothing bounds it.

    Returns:
        The lengths the checks use.

    Raises:
        UsageError: fewer than 2 positions (a prompt and a decode step).
    """
    if max_length is not None and max_length < 2:
        raise UsageError(
            f"the model holds {max_length} positions, too few for the generation checks: a "
            "prompt token and a decode step need 2; export it without --task causal-lm"
        )
    cap = max_length // 2 if max_length is not None else None

    def cut(length: int) -> int:
        return length if cap is None else min(length, cap)

    batch, length = STEP_PROMPT
    greedy = tuple(tuple(cut(n) for n in lengths) for lengths in GREEDY_PROMPTS)
    longest = max(cut(length), *(max(lengths) for lengths in greedy))
    steps = DECODE_STEPS if max_length is None else min(DECODE_STEPS, max_length - longest)
    return Lengths((batch, cut(length)), greedy, steps)


def forward_logits(loaded: LoadedModel, decoder: Decoder, ids: np.ndarray) -> np.ndarray:
    """Keras recomputing the whole sequence: the model's own call.

    Args:
        loaded: the loaded model (its own call's inputs and outputs).
        decoder: its description (`describe`).
        ids: token ids (batch, length).

    Returns:
        The logits (batch, length, vocabulary).

    Raises:
        UsageError: the model takes an input besides ids and a padding mask.
    """
    feeds = {}
    for info in decoder.forward_inputs:
        if info.role == "ids":
            feeds[info.name] = ids.astype(info.dtype)
        elif info.is_padding_mask:
            feeds[info.name] = np.ones(ids.shape, info.dtype)
        else:
            raise _refuse(loaded.model, f"takes an input {info.name!r} besides ids and a mask")
    if loaded.input_structure == "dict":
        args = feeds
    elif loaded.input_structure == "list":
        args = list(feeds.values())
    else:
        args = next(iter(feeds.values()))
    names = [info.name for info in decoder.forward_outputs]
    return np.asarray(flatten(loaded.model(args, training=False), names)[0])


def keras_greedy(loaded, decoder, prompt, mask, new_tokens) -> np.ndarray:
    """Greedy tokens from Keras recomputing the sequence at every position,
    with prompts in lockstep as `generation.generate` runs them.

    Args:
        loaded: the loaded model.
        decoder: its description (`describe`).
        prompt: ids (batch, length), right-padded.
        mask: True on each row's prompt tokens.
        new_tokens: how many tokens each row gains.

    Returns:
        (batch, length + new_tokens): each row's prompt, then its new tokens.
    """
    lengths = mask.sum(axis=1)
    tokens = np.zeros((prompt.shape[0], prompt.shape[1] + new_tokens), prompt.dtype)
    tokens[:, : prompt.shape[1]] = np.where(mask, prompt, 0)
    for position in range(int(lengths.min()), int((lengths + new_tokens).max())):
        logits = forward_logits(loaded, decoder, tokens[:, :position])[:, -1]
        generating = (position >= lengths) & (position < lengths + new_tokens)
        tokens[:, position] = np.where(generating, logits.argmax(axis=-1), tokens[:, position])
    return tokens


def _row_logits(loaded, decoder, tokens, lengths, steps: int) -> np.ndarray:
    """Keras' logits that chose each row's `steps` new tokens, the row alone."""
    rows = []
    for row, length in enumerate(lengths):
        sequence = tokens[row : row + 1, : length + steps - 1]
        rows.append(forward_logits(loaded, decoder, sequence)[0, length - 1 :])
    return np.stack(rows)


def _prompt(rng, decoder: Decoder, lengths) -> tuple[np.ndarray, np.ndarray]:
    mask = np.arange(max(lengths)) < np.array(lengths)[:, None]
    ids = rng.integers(1, decoder.vocabulary, mask.shape)
    return np.where(mask, ids, 0).astype(decoder.ids_dtype), mask


def references(loaded: LoadedModel, decoder: Decoder, on_step=None) -> Reference:
    """Run Keras: its cached call over a prompt and `DECODE_STEPS` greedy
    steps, and its greedy tokens recomputing the full sequence (prompts and
    steps cut to fit a model of few positions, `check_lengths`).

    Args:
        loaded: the loaded model (its own call's inputs and outputs).
        decoder: its cache layout (`describe`).
        on_step: called as `on_step(done, total)` after each greedy batch.

    Returns:
        What `validate` compares the file with.

    Raises:
        UsageError: the model holds fewer than 2 positions.
    """
    from keras import ops

    lengths = check_lengths(decoder.max_length)
    steps = lengths.steps
    rng = np.random.default_rng(validating.SEED)
    model = loaded.model
    batch, length = lengths.step_prompt
    prompt, _ = _prompt(rng, decoder, [length] * batch)
    cache = ops.zeros(
        (batch, decoder.layers, 2, length + steps, decoder.heads, decoder.head_size),
        decoder.dtype,
    )
    logits, _, cache = model.call_with_cache(ops.convert_to_tensor(prompt), cache, 0)
    step_logits, step_tokens = [np.asarray(logits)], []
    for step in range(steps):
        token = step_logits[-1][:, -1].argmax(axis=-1)[:, None].astype(prompt.dtype)
        logits, _, cache = model.call_with_cache(ops.convert_to_tensor(token), cache, length + step)
        step_tokens.append(token)
        step_logits.append(np.asarray(logits))
    greedy = []
    for prompt_lengths in lengths.greedy:
        ids, mask = _prompt(rng, decoder, prompt_lengths)
        tokens = keras_greedy(loaded, decoder, ids, mask, steps)
        logits = None
        if decoder.padded:
            logits = _row_logits(loaded, decoder, tokens, mask.sum(axis=1), steps)
        greedy.append((ids, mask, tokens, logits))
        if on_step:
            on_step(len(greedy), len(lengths.greedy) + 1)
    return Reference(prompt, step_tokens, step_logits, greedy)


def _token_check(label: str, got: np.ndarray, expected: np.ndarray) -> validating.Check:
    differ = np.argwhere(got != expected)
    problem = None
    if len(differ):
        row, position = differ[0]
        problem = (
            f"{len(differ)} tokens differ; first at row {row}, position {position}: "
            f"ONNX Runtime {got[row, position]}, Keras {expected[row, position]}"
        )
    return validating.Check(
        shape=label,
        output="greedy tokens",
        max_abs_diff=float(len(differ)),
        max_rel_diff=float(len(differ)) / got.size,
        passed=not len(differ),
        problem=problem,
    )


def _padded_checks(decoder, label: str, batch: tuple, side: str, atol, rtol) -> list:
    """The greedy batch padded (`generation.padded_greedy`): its tokens, and
    the logits that chose them against Keras' for each row alone (a random
    model's greedy tokens can survive an ignored mask; its logits cannot)."""
    ids, mask, expected, keras_logits = batch
    new = expected.shape[1] - ids.shape[1]
    tokens, logits = generation.padded_greedy(decoder, ids, mask, new, side, with_logits=True)
    found = [_token_check(label, tokens, expected)]
    if found[0].passed:
        found.append(validating.compare(label, "logits", logits, keras_logits, atol, rtol))
    return found


def _merge(label: str, steps: list) -> validating.Check:
    """One check for all decode steps: the largest differences, the lowest
    top-1 agreement, and the first failing step named in `problem`."""
    failed = [check for check in steps if not check.passed]
    problem = None
    if failed:
        first = failed[0]
        problem = f"{len(failed)} steps fail; first {first.shape}: " + (
            first.problem or f"max abs diff {first.max_abs_diff:.3g}"
        )
    agreements = [check.top1_agreement for check in steps if check.top1_agreement is not None]
    return validating.Check(
        shape=label,
        output="logits",
        max_abs_diff=max(check.max_abs_diff for check in steps),
        max_rel_diff=max(check.max_rel_diff for check in steps),
        passed=not failed,
        top1_agreement=min(agreements) if agreements else None,
        problem=problem,
    )


def validate(
    reference: Reference, onnx_path, atol, rtol, on_step=None, lean_memory=False
) -> validating.Validation:
    """Run the file as `generation.generate` does and compare with Keras.

    Checks: the prompt's logits and each decode step's (teacher-forced with
    Keras' greedy tokens) within `atol + rtol |Keras|`; then each greedy batch
    token by token.

    Args:
        reference: Keras' side (`references`).
        onnx_path: the exported decoder.
        atol: absolute tolerance of the logits.
        rtol: relative tolerance, times |Keras' logits|.
        on_step: called as `on_step(done, total)` after the steps and each
            greedy batch.
        lean_memory: ONNX Runtime without pre-packing and its memory arena
            (`validating.validate`).

    Returns:
        The checks (ONNX Runtime's own failure as `error`); never raises.
    """
    start = time.perf_counter()
    result = validating.Validation(atol=atol, rtol=rtol)
    try:
        decoder = generation.CachedDecoder(onnx_path, validating.session_options(lean_memory))
    except Exception as error:  # noqa: BLE001 - the file's failure, reported as one
        result.error = f"ONNX Runtime cannot load the file: {one_line(str(error), 300)}"
        return result
    prompt = reference.step_prompt
    try:
        logits, cache = decoder.step(prompt, decoder.empty_cache(prompt.shape[0]))
        batch, length = prompt.shape
        label = f"prompt {batch}x{length}"
        result.checks.append(
            validating.compare(label, "logits", logits, reference.step_logits[0], atol, rtol)
        )
        steps = []
        for step, token in enumerate(reference.step_tokens, start=1):
            logits, cache = decoder.step(token, cache)
            label = f"decode step {step} ({batch}x{length + step})"
            expected = reference.step_logits[step]
            steps.append(validating.compare(label, "logits", logits, expected, atol, rtol))
        total = length + len(steps)
        label = f"decode steps 1-{len(steps)} ({batch}x{length + 1} to {batch}x{total})"
        result.checks.append(_merge(label, steps))
        if on_step:
            on_step(1, len(reference.greedy) + 1)
        for done, (ids, mask, expected, logits) in enumerate(reference.greedy, start=2):
            new = expected.shape[1] - ids.shape[1]
            got = generation.generate(decoder, ids, new, padding_mask=mask)
            lengths = ",".join(str(n) for n in mask.sum(axis=1))
            label = f"greedy {ids.shape[0]}x({lengths})+{new}"
            result.checks.append(_token_check(label, got, expected))
            for side in ("right", "left") if decoder.padding_dtypes else ():
                padded = f"{label}, {side}-padded with attention_mask"
                batch = (ids, mask, expected, logits)
                result.checks.extend(_padded_checks(decoder, padded, batch, side, atol, rtol))
            if on_step:
                on_step(done, len(reference.greedy) + 1)
    except Exception as error:  # noqa: BLE001 - the file's failure, reported as one
        result.error = f"ONNX Runtime fails on the decoder: {one_line(str(error), 300)}"
    result.seconds = time.perf_counter() - start
    return result
