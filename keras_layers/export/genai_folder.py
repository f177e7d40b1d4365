"""`--task causal-lm -o FOLDER/`: the folder onnxruntime-genai runs, text in, text out.

People who deploy ONNX language models run them in onnxruntime-genai
(Python, C#, C++, Java, mobile), which reads a folder: the decoder, a
`genai_config.json` that names its inputs, outputs and sizes, and the
tokenizer files. `export_folder` builds that folder as one transaction:

1. load: the causal LM (a keras-hub `CausalLM`, with its preprocessor when
   it was saved with one), described by `causal_lm.describe`;
2. export: the cached decoder, `export_model(task="causal-lm")`, with every
   check that task runs, into a private staging folder beside FOLDER;
3. tokenizer: the preprocessor's tokenizer files, through the tokenizer gate
   (`tokenizer_files.export_tokenizer`: proved token-identical or refused);
4. config: `genai_config.json` (`genai_config`): the decoder's names and
   sizes, the start, end and pad ids (`special_ids`: the tokenizer's, or
   `end_token_id`), the context length (`context_of`: the model's position
   table, else the preprocessor's length, or `context_length`), and the
   search (`search_settings`: greedy unless `sampler` names another; the
   model's compiled sampler is not read);
5. prove with the runtime users run (`prove_folder`): with
   onnxruntime-genai installed, its tokenizer must give keras-hub's prompt ids
   (start token included: genai adds special tokens only after
   `tokenizer.update_options(add_special_tokens="true")`, which is how the
   folder is meant to be used), and its greedy generation on text prompts
   must give the tokens of Keras recomputing each sequence, and keras-hub's
   text for them. Without it, the same checks run through
   `keras_layers.export.generate` and the `tokenizers` library, and the
   report says genai was not checked. Prompts of different lengths are
   also run in one batch, in genai (which pads on the right and passes
   `attention_mask` and `position_ids`: each row must give the same prompt's
   tokens alone) and in `generate` (lockstep). A decoder whose positions
   keras-hub's position layers do not compute takes no `attention_mask`
   (`causal_lm.padding_inputs`): genai then runs it one prompt at a time,
   and the report says so. Where every layer's attention became
   `GroupQueryAttention` (`passes.fusions.group_query_attention`), the
   config sets `past_present_share_buffer` (genai preallocates one
   max-length cache per layer, written in place) and genai's checks run
   with it and again without it;
6. quantize (`--quantize int4|int8`): `FOLDER/int4/` (or `int8/`), the
   decoder's weights in `MatMulNBits` beside copies of the config and
   tokenizer files, judged by `decoder_gate` (greedy agreement and the
   log-likelihood change of a held-out text, against Keras); a failed gate
   fails the export and keeps the refused folder as `FOLDER.int4.failed`;
A causal LM stored in bfloat16 or float16 whose float32 export would not fit
in memory (or any, with `weights_dtype="keep"` and `quantize`) takes the
streamed path instead of 2-6 (`_write_streamed`): held in its stored
precision (`loading.load(stored=True)`), traced and converted with no float
check, quantized one weight at a time (`streamed_quantizing`) into
`FOLDER/int4/` with the tokenizer files and the config, and judged by the
gate of 6 alone: no float32 copy of the weights is made, and no float decoder
is written.

7. place: only when everything passed are the files placed, as one set
   (`folder_placement`): FOLDER shows the last export's files or the new
   one's, never a mix, at every instant (a SIGKILL included); what the last
   export wrote and this one does not (its tokenizer, its `int4/`) goes with
   the switch; other files in FOLDER are left alone. On any failure FOLDER
   is as it was.

Before any conversion, an `-o` without a suffix is refused (`refuse_ambiguous_output`:
a folder or a file?), an entry of the other kind at one of the export's names
(a file at `FOLDER/int4`) is refused (`folder_placement.check_names`), and
so is a tokenizer whose ids reach past the decoder's rows
(`tokenizer_files.vocabulary_fit`).
"""

import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from keras_layers.export import (
    causal_lm,
    decoder_gate,
    folder_placement,
    generation,
    inputs,
    loading,
    memory,
    pipeline,
    placement,
    quantizing,
    streamed_quantizing,
)
from keras_layers.export.errors import UsageError, ValidationFailed, argument
from keras_layers.export.graph import weights
from keras_layers.export.options import ACCURACY_LEVEL, SAMPLER_DEFAULTS, ExportOptions
from keras_layers.export.pipeline import checked_options, export_model
from keras_layers.export.tokenizer_files.exporting import FILE_NAMES as TOKENIZER_FILES
from keras_layers.export.tokenizer_files.gate import check_folder, export_tokenizer
from keras_layers.export.tokenizer_files.vocabulary_fit import check_ids_fit

MODEL_FILE = "model.onnx"
CONFIG_FILE = "genai_config.json"
REPORT_FILE = "report.json"
# The streamed export's quantized weights, in the staging folder.
_QUANTIZED = "quantized.data"
# Text prompts of the checks: different lengths, digits, punctuation.
CHECK_PROMPTS = (
    "The quick brown fox",
    "Once upon a time, in a land far away, there lived",
    "1 2 3",
)
NEW_TOKENS = 12
GENAI_MISSING = "onnxruntime-genai is not installed: pip install 'keras-layers[genai]'"


def is_folder(output) -> bool:
    """Whether an output path names a folder: it ends with a separator or is one.

    Args:
        output: the `-o` value, as given.

    Returns:
        True for `FOLDER/` or an existing folder.
    """
    text = str(output)
    try:
        return text.endswith(("/", "\\")) or Path(text).is_dir()
    except (OSError, ValueError):  # a name no file can have: the export says why
        return False


def refuse_ambiguous_output(task: str, output) -> None:
    """Refuse a causal LM's output path that names neither a folder nor a
    file: no separator at its end, no suffix, and no folder there
    (`gpt2_lm`). It could be meant as the genai folder (`gpt2_lm/`) or as the
    decoder file (`gpt2_lm.onnx`), and the wrong guess gives no error until
    onnxruntime-genai looks for `genai_config.json`.

    Args:
        task: the export's task.
        output: the output path as given, or None.

    Raises:
        UsageError: the path is ambiguous; the message gives both spellings.
    """
    if task != "causal-lm" or output is None or is_folder(output):
        return
    path = Path(output)
    if str(output) and path.suffix == "" and path.name not in ("", ".", ".."):
        raise UsageError(
            f"{argument('output', output)}: a folder or a file? Write "
            f"{argument('output', f'{output}/')} for the folder onnxruntime-genai runs "
            f"(decoder, genai_config.json, tokenizer), or {argument('output', f'{output}.onnx')} "
            "for the decoder file alone"
        )


@dataclass(frozen=True)
class SpecialIds:
    """The ids genai needs: the start token it adds, the end it stops at, the pad."""

    bos: int
    eos: int
    pad: int


def special_ids(preprocessor, vocabulary: int, end_token_id: int | None = None) -> SpecialIds:
    """The start, end and pad ids: the preprocessor's tokenizer's, or
    `end_token_id` as all three.

    onnxruntime-genai stops at the config's end id, and takes 0 where none is
    written (it refuses one outside the vocabulary): an end id no one chose
    would end generation at a real token. So a model without preprocessor
    needs `end_token_id`.

    Args:
        preprocessor: the causal LM's preprocessor, or None (the folder then
            has no tokenizer: genai takes ids, not text).
        vocabulary: the decoder's vocabulary size (the ids must lie in it).
        end_token_id: the end id the caller gives (`ExportOptions.end_token_id`):
            needed without a preprocessor, or when its tokenizer has no end
            token; where the tokenizer has one, a different id is refused.

    Returns:
        The ids.

    Raises:
        UsageError: no end id is known, a given one differs from the
            tokenizer's, or an id lies outside the vocabulary.
    """
    if end_token_id is not None and end_token_id >= vocabulary:
        raise UsageError(
            f"{argument('end_token_id', end_token_id)}: outside the decoder's vocabulary of "
            f"{vocabulary}; give an id below it"
        )
    tokenizer = getattr(preprocessor, "tokenizer", None)
    end = getattr(tokenizer, "end_token_id", None)
    if end is not None and end_token_id is not None and int(end) != end_token_id:
        raise UsageError(
            f"{argument('end_token_id', end_token_id)}: the preprocessor's "
            f"{type(tokenizer).__name__} ends at {end}, as the folder's tokenizer files do; "
            "leave this out"
        )
    end = end_token_id if end is None else end
    if end is None:
        what = f"{type(tokenizer).__name__} has no end token"
        what = "the model has no preprocessor" if preprocessor is None else what
        raise UsageError(
            f"{argument('end_token_id')}: {what}, so nothing says which id ends a sequence, and "
            "onnxruntime-genai stops at the config's end id (at 0 when none is written); give "
            f"{argument('end_token_id', 'ID')}, the id your tokenizer ends with (written as the "
            "start, end and pad ids)"
        )
    start = getattr(tokenizer, "start_token_id", None)
    pad = getattr(tokenizer, "pad_token_id", None)
    ids = SpecialIds(
        int(end if start is None else start), int(end), int(end if pad is None else pad)
    )
    for name, value in asdict(ids).items():
        if not 0 <= value < vocabulary:
            raise UsageError(
                f"the tokenizer's {name} id {value} lies outside the decoder's vocabulary of "
                f"{vocabulary}: the tokenizer and the model do not match"
            )
    return ids


def search_settings(options: ExportOptions, context_length: int, shared: bool) -> dict:
    """The search the folder's config sets: greedy, unless `options.sampler`
    names another (with keras-hub's numbers where none is given).

    The model's compiled sampler is not read: a `.keras` file does not keep
    it, and keras-hub compiles every task with top-k (k=5) when it is made,
    so a model's sampler does not say whether its user chose one.

    Args:
        options: the export's options (`sampler`, `top_k`, `top_p`, `temperature`).
        context_length: the folder's context length, genai's default `max_length`.
        shared: the decoder may share its past and present buffers.

    Returns:
        genai's `search` entries.
    """
    numbers = {
        name: default if getattr(options, name) is None else getattr(options, name)
        for name, default in SAMPLER_DEFAULTS.items()
    }
    found = {
        "do_sample": False,
        "num_beams": 1,
        "num_return_sequences": 1,
        "max_length": int(context_length),
        "min_length": 0,
        "past_present_share_buffer": shared,
        "repetition_penalty": 1.0,
        "temperature": 1.0,
        "top_k": 1,
        "top_p": 1.0,
    }
    # genai samples top-k where top_k > 1 (top_p 1), top-p where top_k is 0.
    if options.sampler == "top_k":
        found.update(do_sample=True, top_k=int(numbers["top_k"]))
    elif options.sampler == "top_p":
        found.update(do_sample=True, top_k=0, top_p=float(numbers["top_p"]))
    if found["do_sample"]:
        found["temperature"] = float(numbers["temperature"])
    return found


def position_limit(loaded) -> tuple[int | None, str | None]:
    """The longest sequence the model's position tables allow, and the layer
    that says so; `(None, None)` when no table bounds it (rotary positions).

    `loaded.max_length` reads every layer's `sequence_length`, the
    preprocessor's packing length among them (keras-hub saves it with the
    task); where that is what bounds it, the backbone's own bound is read.

    Args:
        loaded: the loaded causal LM.

    Returns:
        The bound and its layer's name.
    """
    preprocessor = getattr(loaded.model, "preprocessor", None)
    if preprocessor is None:
        return loaded.max_length, loaded.max_length_source
    names = {layer.name for layer in preprocessor._flatten_layers(include_self=True)}
    if loaded.max_length_source not in names:
        return loaded.max_length, loaded.max_length_source
    backbone = getattr(loaded.model, "backbone", None)
    return inputs.max_sequence_length(backbone) if backbone is not None else (None, None)


def context_of(loaded, preprocessor, asked: int | None) -> tuple[int, str]:
    """The folder's context length and where it comes from.

    Args:
        loaded: the loaded causal LM.
        preprocessor: its preprocessor, or None.
        asked: `ExportOptions.context_length`, or None.

    Returns:
        `asked`, else the model's position table's length (`position_limit`),
        else (rotary positions) the preprocessor's `sequence_length`; and
        what gave it, for the report.

    Raises:
        UsageError: `asked` exceeds the position table, or nothing gives a
            length (rotary positions and no preprocessor).
    """
    limit, source = position_limit(loaded)
    if limit is not None and asked is not None and asked > limit:
        raise UsageError(
            f"{argument('context_length', asked)}: the model's position table ({source}) holds "
            f"{limit} positions; give at most {limit}, or leave it out"
        )
    if asked is not None:
        return asked, "context_length, as given"
    if limit is not None:
        return limit, f"the position table of {source}"
    packing = getattr(preprocessor, "sequence_length", None)
    if isinstance(packing, int) and packing > 0:
        return packing, "the preprocessor's sequence_length (the positions have no table)"
    raise UsageError(
        f"{argument('context_length')}: the model's positions have no table (rotary) and it has "
        "no preprocessor, so nothing says how long a sequence it runs; give "
        f"{argument('context_length', 'N')}, at most the length it was trained for"
    )


_GREEDY_BY_DEFAULT = (
    "the default: greedy, since the model's compiled sampler is not kept in a .keras file and "
    "keras-hub compiles every task with top_k when it is made"
)
# The options only a folder takes: its genai_config.json's.
FOLDER_OPTIONS = ("sampler", "top_k", "top_p", "temperature", "context_length", "end_token_id")


def refuse_folder_options(options: ExportOptions, task: str, output) -> None:
    """Refuse a folder's option (`FOLDER_OPTIONS`) given to an export that
    writes no folder, before any work.

    Args:
        options: the export's options.
        task: the export's task.
        output: its output path, or None (a file beside the model).

    Raises:
        UsageError: the first such option given, named.
    """
    if task == "causal-lm" and output is not None and is_folder(output):
        return
    for name in FOLDER_OPTIONS:
        value = getattr(options, name)
        if value is not None:
            raise UsageError(
                f"{argument(name, value)}: sets the genai folder's genai_config.json; only with "
                f"{argument('task', 'causal-lm')} and a folder output "
                f"({argument('output', 'FOLDER/')}); leave it out"
            )


def why_no_shared_buffer(path) -> str | None:
    """Why onnxruntime-genai may not give the decoder one preallocated cache
    buffer as both past and present (None where it may): the past must be
    read by `GroupQueryAttention` alone, which writes the new keys and values
    in place (`passes.fusions.group_query_attention`). A traced attention
    returns a new cache, the past then the new tokens, and any other node
    reading the past would read the buffer's full length.

    Args:
        path: the decoder's ONNX file (its graph is read, not its weights).

    Returns:
        The reason, or None.
    """
    readers = generation.past_readers(path)
    if readers == {"GroupQueryAttention"}:
        return None
    others = ", ".join(sorted(readers - {"GroupQueryAttention"}))
    return (
        f"past_present_share_buffer: the past is read by {others} besides any "
        "GroupQueryAttention (see the report's graph.declined), so the decoder needs a new "
        "cache per step, the past then the new tokens; it is false"
    )


def query_heads(model, decoder) -> int:
    """The attention's query heads: the keras-hub backbone's `num_query_heads`
    (grouped-query models) or `num_heads`, else the cache's heads.

    Args:
        model: the causal LM.
        decoder: its description (the cache's key/value heads).

    Returns:
        The count.
    """
    backbone = getattr(model, "backbone", None)
    for name in ("num_query_heads", "num_heads"):
        value = getattr(backbone, name, None)
        if isinstance(value, int) and value > 0 and value % decoder.heads == 0:
            return value
    return decoder.heads


def genai_config(
    decoder, ids: SpecialIds, context_length: int, search: dict, heads: int | None = None
) -> dict:
    """The `genai_config.json` of the folder.

    Args:
        decoder: the decoder's description (`causal_lm.describe`).
        ids: the start, end and pad ids.
        context_length: the longest sequence the folder is run to.
        search: the search defaults.
        heads: the query heads (`query_heads`); the cache's by default.

    Returns:
        The document: model type `decoder` (a generic decoder: genai's
        family-specific types expect inputs this decoder does not have), the
        names as the export writes them, the sizes, and `search`.
    """
    return {
        "model": {
            "type": "decoder",
            "bos_token_id": ids.bos,
            "eos_token_id": ids.eos,
            "pad_token_id": ids.pad,
            "vocab_size": int(decoder.vocabulary),
            "context_length": int(context_length),
            "decoder": {
                "filename": MODEL_FILE,
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "head_size": int(decoder.head_size),
                "hidden_size": int((heads or decoder.heads) * decoder.head_size),
                "num_attention_heads": int(heads or decoder.heads),
                "num_key_value_heads": int(decoder.heads),
                "num_hidden_layers": int(decoder.layers),
                "inputs": {
                    "input_ids": "input_ids",
                    **{name: name for name in causal_lm.PADDING_INPUTS if decoder.padded},
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
            },
        },
        "search": search,
    }


@dataclass
class _Expected:
    """keras-hub's side of one prompt: its ids and Keras' greedy continuation."""

    prompt: str | None  # None: a prompt of ids (a model without preprocessor)
    ids: list
    tokens: list  # prompt ids, then NEW_TOKENS greedy tokens
    text: str  # keras-hub's text of the new tokens


def _prompt_ids(preprocessor, prompts, context: int, dtype) -> list:
    """(prompt, ids) for the prompts keras-hub packs whole and that leave room
    in the context for a new token."""
    kept = []
    for prompt in prompts:
        packed = preprocessor.generate_preprocess([prompt])
        mask = np.asarray(packed["padding_mask"][0]).astype(bool)
        if mask.all() or mask.sum() >= context:  # truncated, or no room left
            continue
        kept.append((prompt, np.asarray(packed["token_ids"][0])[mask].astype(dtype)))
    return kept


def expectations(
    loaded, decoder, prompts, new_tokens: int, context: int, end: int | None = None
) -> list:
    """keras-hub's prompt ids and Keras' greedy tokens and text, per prompt.

    Args:
        loaded: the loaded causal LM, its preprocessor attached.
        decoder: its description.
        prompts: text prompts (one keras-hub would truncate, or that leaves no
            room in the context, is left out).
        new_tokens: greedy tokens after each prompt, at most (fewer when the
            longest prompt leaves less room in the context).
        context: the folder's context length.
        end: the folder's end id, which no prompt of ids holds (a model
            without preprocessor): genai reads a prompt's trailing pad id,
            the end id here, as padding.

    Returns:
        One `_Expected` per prompt kept.
    """
    preprocessor = getattr(loaded.model, "preprocessor", None)
    if preprocessor is None:  # ids in, ids out: prompts of ids, no text
        return _id_expectations(loaded, decoder, min(new_tokens, context - 9), end)
    kept = _prompt_ids(preprocessor, prompts, context, decoder.ids_dtype)
    if not kept:
        return []
    new_tokens = min(new_tokens, context - max(ids.size for _, ids in kept))
    expected, end = [], preprocessor.tokenizer.end_token_id
    for prompt, ids in kept:
        tokens = causal_lm.keras_greedy(
            loaded, decoder, ids[None], np.ones((1, ids.size), bool), new_tokens
        )[0]
        text = preprocessor.tokenizer.detokenize(_until_end(tokens[ids.size :].tolist(), end))
        text = text.numpy() if hasattr(text, "numpy") else text
        text = text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
        expected.append(_Expected(prompt, ids.tolist(), tokens.tolist(), text))
    return expected


def _until_end(tokens: list, end: int) -> list:
    """The new tokens before the first end token: the text a user is given."""
    return tokens[: tokens.index(end)] if end in tokens else tokens


def _id_expectations(loaded, decoder, new_tokens: int, end: int | None) -> list:
    expected = []
    for length in (5, 9, 1):
        ids = np.arange(1, length + 1) * 7 % decoder.vocabulary
        ids = np.where(ids == end, (ids + 1) % decoder.vocabulary, ids).astype(decoder.ids_dtype)
        mask = np.ones((1, length), bool)
        tokens = causal_lm.keras_greedy(loaded, decoder, ids[None], mask, new_tokens)[0]
        expected.append(_Expected(None, ids.tolist(), tokens.tolist(), ""))
    return expected


TEXT_GAP = (
    "onnxruntime-genai's decoder ends the text at the first token sequence that is not valid "
    "UTF-8, after one U+FFFD, and before the first NUL character (its text is a C string); "
    "keras-hub replaces each invalid byte and keeps NUL, and goes on (a trained model rarely "
    "emits such sequences; random weights often do)"
)


def _text_gap(text: str, expected: str) -> bool:
    """genai's text is keras-hub's cut where genai cuts it: after the first
    U+FFFD or before the first NUL, whichever comes first."""
    cuts = [i + 1 for i in [expected.find("\ufffd")] if i >= 0]
    cuts += [i for i in [expected.find("\x00")] if i >= 0]
    return bool(cuts) and text == expected[: min(cuts)]


def _stopped_right(got: list, expected: list, eos: int) -> bool:
    """The runtime's tokens are Keras' up to where it stopped: the full
    length, or an end token (kept as the last token, or, as genai leaves it
    out of a sequence it ends, the next of Keras')."""
    stopped = got[-1:] == [eos] or expected[len(got) : len(got) + 1] == [eos]
    return got == expected[: len(got)] and (len(got) == len(expected) or stopped)


def _genai_tokens(model, og, item: _Expected, share: bool) -> list:
    """genai's greedy sequence for one prompt's ids: the prompt, then the new tokens."""
    params = og.GeneratorParams(model)
    params.set_search_options(
        max_length=len(item.tokens), do_sample=False, past_present_share_buffer=share
    )
    generator = og.Generator(model, params)
    generator.append_tokens(item.ids)
    while not generator.is_done():
        generator.generate_next_token()
    return [int(i) for i in generator.get_sequence(0)]


def _genai_row(model, og, item: _Expected, eos: int, share: bool) -> dict:
    tokenizer = None
    ids = item.ids  # a prompt of ids (no preprocessor): nothing to encode
    if item.prompt is not None:
        tokenizer = og.Tokenizer(model)
        tokenizer.update_options(add_special_tokens="true")
        ids = [int(i) for i in tokenizer.encode(item.prompt)]
    tokens = _genai_tokens(model, og, item, share)
    new = _until_end(tokens[len(item.ids) :], eos)
    text = tokenizer.decode(new) if new and tokenizer is not None else ""
    return {
        "prompt": item.prompt,
        "ids_equal": ids == item.ids,
        "tokens_equal": _stopped_right(tokens, item.tokens, eos),
        "text_equal": text == item.text or _text_gap(text, item.text),
        "text_gap": text != item.text and _text_gap(text, item.text),
        "keras": {"ids": item.ids, "tokens": item.tokens, "text": item.text},
        "genai": {"ids": ids, "tokens": tokens, "text": text},
    }


def _genai_batch(model, og, expected: list, ids: tuple, share: bool) -> list:
    """genai on every prompt in one batch: its own padding (on the right) and
    mask; each row's new tokens must be the same prompt's alone. `ids` are the
    end and pad ids."""
    eos, pad = ids
    new = len(expected[0].tokens) - len(expected[0].ids)
    if expected[0].prompt is not None:
        tokenizer = og.Tokenizer(model)
        tokenizer.update_options(add_special_tokens="true")
        batch = tokenizer.encode_batch([item.prompt for item in expected]).as_numpy()
    else:
        batch = np.full((len(expected), max(len(item.ids) for item in expected)), pad, np.int32)
        for row, item in enumerate(expected):
            batch[row, : len(item.ids)] = item.ids
    params = og.GeneratorParams(model)
    params.set_search_options(
        max_length=batch.shape[1] + new,
        do_sample=False,
        batch_size=len(expected),
        past_present_share_buffer=share,
    )
    generator = og.Generator(model, params)
    generator.append_tokens(batch)
    while not generator.is_done():
        generator.generate_next_token()
    rows = []
    for row, item in enumerate(expected):
        tokens = [int(i) for i in generator.get_sequence(row)][batch.shape[1] :]
        tokens = tokens[: tokens.index(eos) + 1] if eos in tokens else tokens
        rows.append(
            {
                "prompt": item.prompt,
                "batched_equal": _stopped_right(tokens, item.tokens[len(item.ids) :], eos),
                "keras": {"tokens": item.tokens[len(item.ids) :]},
                "genai_batched": {"tokens": tokens},
            }
        )
    return rows


def _generate_rows(folder: Path, expected: list) -> list:
    """The same checks through `generation.generate`, alone and batched."""
    decoder = generation.CachedDecoder(folder / MODEL_FILE)
    rows = []
    longest = max(len(item.ids) for item in expected)
    new = len(expected[0].tokens) - len(expected[0].ids)
    batch = np.zeros((len(expected), longest), decoder.ids_dtype)
    mask = np.zeros(batch.shape, bool)
    for row, item in enumerate(expected):
        batch[row, : len(item.ids)], mask[row, : len(item.ids)] = item.ids, True
    together = generation.generate(decoder, batch, new, padding_mask=mask)
    for row, item in enumerate(expected):
        alone = generation.generate(decoder, [item.ids], new)[0].tolist()
        batched = together[row, : len(item.tokens)].tolist()
        rows.append(
            {
                "prompt": item.prompt,
                "tokens_equal": alone == item.tokens,
                "batched_equal": batched == item.tokens,
                "keras": {"tokens": item.tokens},
                "generate": {"alone": alone, "batched": batched},
            }
        )
    return rows


def _genai_checks(folder: Path, og, expected: list, config: dict, share: bool) -> dict:
    """genai's rows with `past_present_share_buffer` set to `share`: one prompt
    at a time, and all prompts in one batch where the decoder takes
    `attention_mask`; or the error genai raised."""
    eos, pad = int(config["model"]["eos_token_id"]), int(config["model"]["pad_token_id"])
    padded = set(causal_lm.PADDING_INPUTS) <= set(config["model"]["decoder"]["inputs"])
    found = {"genai": [], "genai_batched": []}
    try:
        model = og.Model(str(folder))
        found["genai"] = [_genai_row(model, og, item, eos, share) for item in expected]
        if padded:
            found["genai_batched"] = _genai_batch(model, og, expected, (eos, pad), share)
    except Exception as error:  # genai's own error type: it refused the folder
        found["genai_error"] = f"{type(error).__name__}: {error}"
    return found


def prove_folder(folder, expected: list, eos: int) -> dict:
    """Run the folder as users will, on the expected prompts.

    Args:
        folder: the folder (model, config, tokenizer files).
        expected: keras-hub's side, per prompt (`expectations`).
        eos: the end id genai stops at.

    Returns:
        `{"passed", "genai", "genai_batched", "generate", "not_checked"}`:
        genai's rows, one prompt at a time (or why genai was not run), and
        all prompts in one batch (for a decoder that takes `attention_mask`),
        with the config's `past_present_share_buffer`; `genai_unshared` the
        same without the shared buffer, where the config shares one; and
        `generate`'s rows, alone and batched.
    """
    folder = Path(folder)
    config = json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8"))
    config["model"]["eos_token_id"] = eos
    result = {"generate": _generate_rows(folder, expected), "not_checked": [], "known_gaps": []}
    shared = bool(config["search"].get("past_present_share_buffer"))
    padded = set(causal_lm.PADDING_INPUTS) <= set(config["model"]["decoder"]["inputs"])
    try:
        import onnxruntime_genai as og
    except ImportError:
        result["genai"] = None
        result["not_checked"].append(f"genai: {GENAI_MISSING}")
    else:
        result.update(_genai_checks(folder, og, expected, config, shared))
        if shared:
            result["genai_unshared"] = _genai_checks(folder, og, expected, config, False)
        if any(row["text_gap"] for row in result["genai"]):
            result["known_gaps"] = [TEXT_GAP]
        if not padded:
            result["not_checked"].append(
                "genai with a batch of prompts of different lengths: genai pads a batch, and "
                "this decoder takes no attention_mask (its positions are not computed by "
                "keras-hub's position layers); run one prompt at a time"
            )
    why = None if shared else why_no_shared_buffer(folder / MODEL_FILE)
    result["not_checked"] += [why] if why else []
    result["passed"] = _all_equal(result)
    return result


def _all_equal(result: dict) -> bool:
    """Whether genai (both buffer settings) and generate gave Keras' tokens and text."""
    unshared = result.get("genai_unshared", {})
    if "genai_error" in result or "genai_error" in unshared:
        return False
    rows = [*result["generate"], *(result["genai"] or []), *result.get("genai_batched", [])]
    rows += [*unshared.get("genai", []), *unshared.get("genai_batched", [])]
    keys = ("ids_equal", "tokens_equal", "text_equal", "batched_equal")
    return all(row.get(key, True) for row in rows for key in keys)


def failure(result: dict) -> str:
    """The first failed check of `prove_folder`'s result, on one line ("" when none).

    Args:
        result: `prove_folder`'s result.

    Returns:
        What differs, for which prompt, with both sides.
    """
    unshared = result.get("genai_unshared")
    if unshared is not None:  # the same checks without the shared buffer
        found = failure({**unshared, "generate": []})
        if found:
            return f"{found} (past_present_share_buffer false)"
    if "genai_error" in result:
        return f"onnxruntime-genai refused the folder: {result['genai_error']}"
    for row in result["genai"] or []:
        for what in ("ids", "tokens", "text"):
            if not row[f"{what}_equal"]:
                return (
                    f"onnxruntime-genai's {what} for {row['prompt']!r} differ from keras-hub's: "
                    f"{row['genai'][what]!r} / {row['keras'][what]!r}"
                )
    for row in result.get("genai_batched", []):
        if not row["batched_equal"]:
            return (
                f"onnxruntime-genai's new tokens for {row['prompt']!r} in a batch of prompts "
                f"differ from keras-hub's alone: {row['genai_batched']['tokens']!r} / "
                f"{row['keras']['tokens']!r}"
            )
    for row in result["generate"]:
        for key, side in (("tokens_equal", "alone"), ("batched_equal", "batched")):
            if not row[key]:
                return (
                    f"generate's tokens for {row['prompt']!r} ({side}) differ from Keras' greedy: "
                    f"{row['generate'][side]} / {row['keras']['tokens']}"
                )
    return ""


def _quantized(kind: str, staging: Path, options, expected: list, keras) -> dict:
    """`staging/<kind>/`: the decoder's weights quantized beside the folder's
    config and tokenizer files, judged by `decoder_gate` (`_judged`)."""
    sub = staging / kind
    sub.mkdir()
    summary = quantizing.quantize_weights(
        staging / MODEL_FILE, sub / MODEL_FILE, kind, options.decoder_accuracy_level
    )
    for path in staging.iterdir():
        if path.is_file() and path.suffix == ".json" and path.name != REPORT_FILE:
            shutil.copy2(path, sub / path.name)
    return {**summary, **_judged(sub, options, expected, keras)}


def _judged(sub: Path, options, expected: list, keras) -> dict:
    """`decoder_gate`'s verdict on the quantized folder `sub` (through
    `generate`, and through onnxruntime-genai when it is installed), and the
    bytes of its model files."""
    pairs = [(item.ids, item.tokens) for item in expected]
    gate = decoder_gate.judge(
        sub / MODEL_FILE,
        pairs,
        keras,
        options.decoder_min_agreement,
        options.decoder_max_nll_change,
    )
    gate["genai_agreement"] = None
    try:
        import onnxruntime_genai as og
    except ImportError:
        gate["not_checked"] = [f"genai: {GENAI_MISSING}"]
    else:
        model = og.Model(str(sub))
        config = json.loads((sub / CONFIG_FILE).read_text(encoding="utf-8"))
        shared = bool(config["search"].get("past_present_share_buffer"))
        shares = [
            decoder_gate.agreement(
                _genai_tokens(model, og, item, shared), item.tokens, len(item.ids)
            )
            for item in expected
        ]
        gate["genai_agreement"] = float(np.mean(shares))
        if not gate["failure"] and gate["genai_agreement"] < options.decoder_min_agreement:
            gate["failure"] = (
                f"onnxruntime-genai's greedy agreement {gate['genai_agreement']:.3f} < "
                f"{options.decoder_min_agreement}"
            )
            gate["passed"] = False
    size = sum(path.stat().st_size for path in sub.iterdir() if path.suffix != ".json")
    return {**gate, "file_bytes": size}


def _held_out_side(loaded, decoder, context: int) -> decoder_gate.KerasSide:
    """Keras' side of a quantized decoder's gate, computed before any ONNX."""
    preprocessor = getattr(loaded.model, "preprocessor", None)
    held_out = decoder_gate.held_out_ids(
        preprocessor, decoder.vocabulary, context, decoder.ids_dtype
    )
    return decoder_gate.keras_side(
        lambda ids: causal_lm.forward_logits(loaded, decoder, ids), held_out
    )


def _gate_quantized(
    report: dict, staging: Path, folder: Path, options, sides, gate=None, progress=None
):
    """Write and judge the quantized folder in `staging` (or take `gate`, the
    streamed export's); its figures go into the report, and a failed gate
    raises with the refused folder kept."""
    kind = options.quantize
    if gate is None:
        with _stage(progress, kind):
            gate = _quantized(kind, staging, options, *sides)
    report["folder"]["quantized"] = {kind: gate}
    if not gate["passed"]:
        report["passed"] = False
        where = _keep_failed(staging / kind, folder)
        raise ValidationFailed(
            f"the {kind} decoder fails its gate: {gate['failure']}. Nothing was placed; the "
            f"{kind} folder was {where}",
            report,
        )


def _keep_failed(sub: Path, folder: Path) -> str:
    """Move a refused quantized folder beside FOLDER as `FOLDER.<kind>.failed`,
    unless that cannot be (then it goes with the staging folder); returns
    where it went, for the message. FOLDER is made absolute first: `-o ./`
    names the working folder, whose name is not in the path."""
    absolute = Path(os.path.abspath(folder))
    if not absolute.name:
        return "not kept (the folder has no parent to keep it in)"
    kept = absolute.with_name(f"{absolute.name}.{sub.name}.failed")
    if os.path.lexists(kept):  # a link leading nowhere is a path too
        return f"not kept ({kept} exists; remove it to keep the next one)"
    try:
        shutil.move(str(sub), str(kept))
    except OSError as error:
        return f"not kept ({kept}: {error.strerror or error})"
    return f"kept as {kept}"


def _checked(options, folder) -> ExportOptions:
    options = checked_options(options)
    refused = [
        (options.report_path is not None, "report_path", "the report is FOLDER/report.json"),
        (options.external_data == "always", "external_data", "leave it to auto"),
    ]
    for given, name, why in refused:
        if given:
            raise UsageError(
                f"{argument(name, getattr(options, name))}: not taken with a folder output "
                f"({folder}); {why}"
            )
    return options


def _names(streamed: bool, preprocessor, options) -> tuple[list, list]:
    """The files and folders the export places at FOLDER's top level
    (`folder_placement.check_names` checks them before any work)."""
    files = [REPORT_FILE]
    if not streamed:  # the streamed export writes its decoder, config and tokenizer in int4/
        files += [MODEL_FILE, CONFIG_FILE, *(TOKENIZER_FILES if preprocessor is not None else ())]
    return files, [options.quantize] if options.quantize else []


def export_folder(
    lm, folder, options: ExportOptions | None = None, *, prompts=CHECK_PROMPTS, progress=None
):
    """Export a causal LM as the folder onnxruntime-genai runs, proved, then placed.

    Args:
        lm: a keras-hub `CausalLM` (its preprocessor attached for text in and
            out, or None for ids), or the path of a `.keras` file holding one.
        folder: the folder to write (created if missing): its files are
            the last export's or this one's, never a mix
            (`folder_placement`); other files in it are left alone.
        options: the export's `ExportOptions` (tolerances, opset, `quantize`,
            the config's `sampler`, `context_length`, `end_token_id`, ...);
            `report_path` and `external_data="always"` are refused.
            With `quantize`, `weights_dtype="keep"` (or a float32 export
            that would not fit in memory) makes it the streamed export:
            only `FOLDER/<kind>/` is written (`streams`).
        prompts: the text prompts of the genai check.
        progress: called with a `pipeline.StageEvent` as each stage starts and
            ends (Keras' side, the decoder's own stages, the folder's checks in
            genai, the quantized decoder), as `export_model` calls it.

    Returns:
        The report (also `FOLDER/report.json`): the decoder's export report,
        with `tokenizer` (the tokenizer gate's) and `folder` (the config and
        `prove_folder`'s result); a streamed export's has `streamed`, the
        graph's figures and the gate's, and no float checks.

    Raises:
        UsageError: not a causal LM, an option refused, a tokenizer that
            cannot be written or whose ids reach past the decoder's rows, no
            end id known (`special_ids`), or no context length (`context_of`).
        OutputError: `folder` cannot hold the files (an entry of the other
            kind at one of their names), before any work.
        ValidationFailed: the decoder, the tokenizer files or the folder in
            genai (or `generate`) differ from Keras; nothing is placed.

    Example:

    >>> import keras_hub
    >>> from keras_layers.export import ExportOptions
    >>> from keras_layers.export.genai_folder import export_folder
    >>> backbone = keras_hub.models.GPT2Backbone(vocabulary_size=64, num_layers=1,
    ...     num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=32)
    >>> lm = keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)
    >>> report = export_folder(lm, tmp / "gpt2", ExportOptions(end_token_id=63))
    >>> sorted(path.name for path in (tmp / "gpt2").iterdir())
    ['.keras-layers', 'genai_config.json', 'model.onnx', 'report.json']
    """
    folder = check_folder(folder)
    options = _checked(options, folder)
    streamed = streams(lm, options)
    with _stage(progress, "keras"):
        described, expected, keras = _describe_lm(lm, folder, options, prompts, streamed)
    described.progress = progress
    with folder_placement.staging(folder) as staging:
        write = _write_streamed if streamed else _write_float
        report = write(described, staging, folder, options, (expected, keras))
        decoder_path = folder / options.quantize / MODEL_FILE if streamed else folder / MODEL_FILE
        report.update(onnx_path=str(decoder_path), report_path=str(folder / REPORT_FILE))
        placement.write_json(report, staging / REPORT_FILE)
        folder_placement.place_folder(staging, folder)
    return report


def _describe_lm(lm, folder: Path, options: ExportOptions, prompts, streamed: bool):
    """The causal LM loaded and described for the folder's stages (its
    decoder, special ids, context, search settings, heads), with Keras'
    expected tokens on `prompts` and, for a quantized folder, its held-out
    side: `(described, expected, keras)`. Refuses, before any file, what
    the folder cannot hold."""
    started = time.perf_counter()
    loaded = loading.load(lm, imports=options.imports, unsafe=options.unsafe, stored=streamed)
    decoder = causal_lm.describe(loaded)
    preprocessor = getattr(loaded.model, "preprocessor", None)
    if preprocessor is not None:
        check_ids_fit(preprocessor, decoder.vocabulary, "the decoder")
    ids = special_ids(preprocessor, decoder.vocabulary, options.end_token_id)
    folder_placement.check_names(folder, *_names(streamed, preprocessor, options))
    context, context_from = context_of(loaded, preprocessor, options.context_length)
    expected = expectations(loaded, decoder, prompts, NEW_TOKENS, context, ids.eos)
    if not expected:
        raise UsageError(
            f"none of the check prompts fits the model's context of {context} tokens with a "
            "new token after it: give shorter prompts"
        )
    keras = _held_out_side(loaded, decoder, context) if options.quantize else None
    searches = {shared: search_settings(options, context, shared) for shared in (True, False)}
    told = getattr(getattr(preprocessor, "tokenizer", None), "end_token_id", None) is not None
    chosen = {
        "sampler": options.sampler or "greedy",
        "sampler_from": "sampler, as given" if options.sampler else _GREEDY_BY_DEFAULT,
        "context_length_from": context_from,
        "end_token_id_from": "the preprocessor's tokenizer" if told else "end_token_id, as given",
    }
    # Read from the model now: the streamed export releases it before the config.
    heads = query_heads(loaded.model, decoder)
    described = _Described(loaded, decoder, preprocessor, ids, context, searches, heads, chosen)
    described.seconds["load_and_keras"] = time.perf_counter() - started
    return described, expected, keras


@contextmanager
def _stage(progress, name: str) -> Iterator[None]:
    """Tell `progress` (when given) that stage `name` starts, then how long
    it took, as `export_model`'s stages do (`pipeline.StageEvent`)."""
    if progress is None:
        yield
        return
    progress(pipeline.StageEvent(name))
    started = time.perf_counter()
    yield
    progress(pipeline.StageEvent(name, seconds=time.perf_counter() - started))


@dataclass
class _Described:
    """What the folder's stages know of the loaded causal LM."""

    loaded: object
    decoder: causal_lm.Decoder
    preprocessor: object
    ids: SpecialIds
    context: int
    searches: dict  # `search_settings`', by whether the cache buffer is shared
    heads: int  # `query_heads`
    chosen: dict  # the sampler, and where the context length and end id come from
    seconds: dict = field(default_factory=dict)  # the streamed export's stages
    progress: object = None  # `export_folder`'s callback, or None

    def config(self, model_path: Path) -> dict:
        """`genai_config` for the decoder at `model_path` (its cache shared
        where `why_no_shared_buffer` finds nothing against it)."""
        search = self.searches[why_no_shared_buffer(model_path) is None]
        return genai_config(self.decoder, self.ids, self.context, search, self.heads)

    def folder_report(self, config: dict) -> dict:
        """The report's `folder` entry, before any check: the config written,
        its context length, and what chose its settings."""
        return {"config": config, "context_length": self.context, "chosen": self.chosen}


def _write_float(described: _Described, staging: Path, folder: Path, options, sides) -> dict:
    """The float32 decoder exported and checked (`export_model`), the
    tokenizer files, the config, the folder proved; then, with `quantize`,
    `staging/<kind>/` quantized from it and gated."""
    inner = _unquantized(options, report_path=staging / REPORT_FILE)
    loaded = described.loaded
    report = export_model(
        loaded.model, staging / MODEL_FILE, inner, task="causal-lm", progress=described.progress
    )
    with _stage(described.progress, "genai"):
        if described.preprocessor is not None:
            report["tokenizer"] = export_tokenizer(described.preprocessor, staging).report()
        config = described.config(staging / MODEL_FILE)
        placement.write_json(config, staging / CONFIG_FILE)
        proof = prove_folder(staging, sides[0], described.ids.eos)
    report["folder"] = {**described.folder_report(config), **proof}
    report["passed"] = report["passed"] and proof["passed"]
    if not proof["passed"]:
        raise ValidationFailed(
            f"the folder does not generate as Keras does: {failure(proof)}. Nothing was placed.",
            report,
        )
    if options.quantize:
        _gate_quantized(report, staging, folder, options, sides, progress=described.progress)
    return report


def _unquantized(options, **changes):
    """`options` for the float decoder's conversion: no quantization, and
    so no accuracy level of one, with `changes`."""
    return replace(options, quantize=None, decoder_accuracy_level=ACCURACY_LEVEL, **changes)


def _write_streamed(described: _Described, staging: Path, folder: Path, options, sides) -> dict:
    """The streamed export: the decoder traced from the model holding its
    stored half-precision weights, its matrix products quantized one weight
    at a time (`streamed_quantizing`) into `staging/<kind>/` with the
    tokenizer files and the config, and gated against Keras on the same
    stored weights. No float32 copy of the weights is ever made, so no float
    decoder is written or checked: the gate is the check."""
    kind, loaded = options.quantize, described.loaded
    sub = staging / kind
    sub.mkdir()
    # `keep`, whatever was asked: the weights stay in their stored dtype (a
    # float32 copy in the data file is what this export never makes).
    inner = _unquantized(options, report_path=None, weights_dtype="keep")
    with _stage(described.progress, "convert"):
        proto, graph = pipeline.convert_loaded(loaded, staging, inner)
    loaded.release_model()  # Keras' weights go before the gate's ONNX Runtime session
    started = time.perf_counter()
    with _stage(described.progress, kind):
        summary = streamed_quantizing.quantize_streamed(
            proto, staging, staging / _QUANTIZED, kind, options.decoder_accuracy_level
        )
        weights.save(proto, staging, sub / MODEL_FILE, sub / f"{MODEL_FILE}.data")
    for path in staging.glob("*.data"):
        path.unlink()  # the staging copies: the folder's data file holds what it reads
    described.seconds["quantize"] = time.perf_counter() - started
    streamed = {"weight_bytes": loaded.param_bytes, "stored_policies": loaded.source_policies}
    report = {"passed": True, "task": "causal-lm", "streamed": streamed, **graph}
    if described.preprocessor is not None:
        report["tokenizer"] = export_tokenizer(described.preprocessor, sub).report()
    config = described.config(sub / MODEL_FILE)
    placement.write_json(config, sub / CONFIG_FILE)
    report["folder"] = described.folder_report(config)
    started = time.perf_counter()
    with _stage(described.progress, "gate"):
        gate = {**summary, **_judged(sub, options, *sides)}
    described.seconds["gate"] = time.perf_counter() - started
    seconds = {**described.seconds, **graph["stage_seconds"]}
    report["stage_seconds"] = {name: round(value, 3) for name, value in seconds.items()}
    _gate_quantized(report, staging, folder, options, sides, gate)
    return report


def streams(lm, options: ExportOptions) -> bool:
    """Whether the folder is written by the streamed export (`_write_streamed`):
    asked for (`quantize` with `weights_dtype="keep"`), or chosen because
    the float32 export would not fit in memory and the stored weights would.

    Args:
        lm: the causal LM or its path.
        options: the export's options.

    Returns:
        True for the streamed export.

    Raises:
        UsageError: neither export fits (exit 2): both figures are said.
    """
    if options.quantize and options.weights_dtype == "keep":
        if options.memory_check:  # the streamed path's own estimate, before any work
            stored, assets = memory.estimated_param_bytes(lm, True), memory.archive_asset_bytes(lm)
            memory.check_fits(stored, streamed=True, asset_bytes=assets)
        return True
    if not options.memory_check:
        return False
    widened, assets = memory.estimated_param_bytes(lm), memory.archive_asset_bytes(lm)
    try:
        memory.check_fits(widened, asset_bytes=assets)
    except UsageError as refusal:
        stored = memory.estimated_param_bytes(lm, stored=True)
        if not options.quantize or stored >= widened:
            raise
        try:
            memory.check_fits(stored, streamed=True, asset_bytes=assets)
        except UsageError as streamed:
            raise UsageError(f"{refusal}; streamed from its stored weights, {streamed}") from None
        return True
    return False
