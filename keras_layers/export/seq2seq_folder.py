"""`--task seq2seq-lm -o FOLDER/`: an encoder-decoder as a folder that generates.

The folder `seq2seq_generation` reads (its docstring lists the files): the
encoder's file and the decoder's, each exported and proved by the pipeline
(`seq2seq.encoder_model` on the forward grid; the decoder's steps against
Keras' cached calls, task `seq2seq-decoder`), `seq2seq_config.json`, and, for
a model saved with its preprocessor, the tokenizer files (the encoder's
framing inside, proved token-identical on the stress corpus).

Then the folder as a whole is proved before anything is placed: greedy
generation from the staged folder (`keras_layers.export.generate`, ONNX
Runtime only) against keras-hub's own `generate_step` with a greedy sampler
(a plain model's: `protocol_greedy`),
on encoder inputs of different lengths in one padded batch; with a tokenizer,
on text too, against `generate` on the same strings (keras-hub's
preprocessor, its truncation and its detokenizer). Any difference fails the
export and nothing is placed (`folder_placement`: FOLDER shows the last
export or this one, never a mix).
"""

import json
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from keras_layers.export import (
    folder_placement,
    inputs,
    loading,
    merged_decoder,
    pipeline,
    placement,
    seq2seq,
    transformers_config,
    validating,
    whisper_folder,
)
from keras_layers.export.decoder_gate import agreement
from keras_layers.export.errors import ExportError, UsageError, ValidationFailed, argument
from keras_layers.export.genai_folder import GENAI_MISSING, _keep_failed, is_folder
from keras_layers.export.generation import generate
from keras_layers.export.options import ACCURACY_LEVEL, ExportOptions
from keras_layers.export.quantizing import quantize_weights, summary
from keras_layers.export.seq2seq_generation import (
    CONFIG_FILE,
    DECODER_FILE,
    ENCODER_FILE,
    FORMAT,
    SENTENCEPIECE_FILE,
    Seq2SeqFolder,
)
from keras_layers.export.tokenizer_files.exporting import FILE_NAMES as TOKENIZER_FILES
from keras_layers.export.tokenizer_files.gate import export_tokenizer

REPORT_FILE = "report.json"
# The pair the pipeline exports and proves, staged here until merged.
PARTS = ".parts"
PART_FILES = {
    "encoder": "encoder_model.onnx",
    "decoder": "decoder_with_past_model.onnx",
    "cross": "cross_model.onnx",  # the cross-attention projections
}
# The folder's proof: greedy tokens after the decoder's start, and the inputs.
NEW_TOKENS = 12
ENCODER_LENGTHS = (9, 5, 2)
PROOF_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Hi",
    "Machine learning turns text into token ids, 123 times.",
)
# Options a seq2seq folder does not take (yet), and why.
_REFUSED = {
    "shapes": "the encoder is checked on the forward grid and the decoder by decode steps",
    "report_path": f"the report is FOLDER/{REPORT_FILE}",
    "preprocessor": "the folder holds the tokenizer of a model saved with its preprocessor",
    "parts": "the folder already holds one file per part (encoder, decoder)",
    "channels_first": "an image-prompted encoder reads NHWC images, as Keras does",
}


@dataclass(frozen=True)
class Special:
    """The ids the folder's generation starts, stops and pads with."""

    start: tuple | None  # the decoder's start tokens; None without a preprocessor
    end: int | None
    pad: int


def _check(options: ExportOptions, output) -> Path:
    for name, why in _REFUSED.items():
        value = getattr(options, name)
        if value not in (None, False):
            raise UsageError(f"{argument(name, value)}: not taken by --task seq2seq-lm ({why})")
    path = Path(output) if isinstance(output, str | Path) and str(output) else None
    if path is None or path.suffix == ".onnx" or path.exists() and not is_folder(path):
        raise UsageError(
            f"{argument('output', output)}: --task seq2seq-lm writes a folder (encoder, decoder, "
            "config, tokenizer); give -o FOLDER/ (a path ending in /)"
        )
    return path


def special_ids(model, media: bool = False) -> Special:
    """The decoder's start tokens, the end and pad ids.

    Args:
        model: the encoder-decoder.
        media: its encoder reads audio or images (`Seq2Seq.masks_itself`):
            the preprocessor's tokenizer's start and end ids are read.

    Returns:
        With a keras-hub preprocessor, read from `generate_preprocess("")`
        (the start tokens keras-hub's generation begins with) and its
        tokenizer. Without one, the model's own `decoder_start_token_ids`,
        `end_token_id` and `pad_token_id` attributes where it has them (the
        protocol of a plain Keras encoder-decoder, `seq2seq`'s docstring);
        else no start tokens and no end id (`generate` then takes a dict
        with `decoder_token_ids`).

    Raises:
        UsageError: such an attribute is not an id (or a sequence of ids).
    """
    preprocessor = getattr(model, "preprocessor", None)
    if preprocessor is None:
        return _own_special_ids(model)
    if media:  # its generate_preprocess reads audio or images: the tokenizer's ids
        tokenizer = preprocessor.tokenizer
        start = getattr(tokenizer, "start_token_id", None)
        pad = getattr(tokenizer, "pad_token_id", None)
        return Special(
            None if start is None else (int(start),), tokenizer.end_token_id, int(pad or 0)
        )
    packed = preprocessor.generate_preprocess([""])
    ids = np.asarray(packed["decoder_token_ids"])[0]
    mask = np.asarray(packed["decoder_padding_mask"])[0].astype(bool)
    tokenizer = preprocessor.tokenizer
    pad = getattr(tokenizer, "pad_token_id", None)
    return Special(tuple(int(t) for t in ids[mask]), tokenizer.end_token_id, int(pad or 0))


def _check_special(model, special: Special, vocabulary: int) -> None:
    """Refuse special ids the model's vocabulary does not hold, by name."""
    named = [("decoder_start_token_ids", t) for t in special.start or ()]
    named += [("end_token_id", special.end), ("pad_token_id", special.pad)]
    for name, value in named:
        if value is not None and not 0 <= value < vocabulary:
            raise UsageError(
                f"{type(model).__name__}'s {name} holds {value}: outside the vocabulary "
                f"[0, {vocabulary}) of its logits; give ids the model writes"
            )


def _is_id(value) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool) and value >= 0


def _own_special_ids(model) -> Special:
    """The protocol's optional attributes, each checked."""
    start = getattr(model, "decoder_start_token_ids", None)
    end = getattr(model, "end_token_id", None)
    pad = getattr(model, "pad_token_id", None)
    name = type(model).__name__
    if start is not None and (
        isinstance(start, str | bytes)
        or not hasattr(start, "__len__")
        or not len(start)
        or not all(_is_id(t) for t in start)
    ):
        raise UsageError(
            f"{name}.decoder_start_token_ids is {start!r}: give a tuple of ids >= 0, such as (1,)"
        )
    for attribute, value in (("end_token_id", end), ("pad_token_id", pad)):
        if value is not None and not _is_id(value):
            raise UsageError(f"{name}.{attribute} is {value!r}: give an int >= 0, or None")
    return Special(
        None if start is None else tuple(int(t) for t in start),
        None if end is None else int(end),
        int(pad or 0),
    )


def folder_config(model, description: seq2seq.Seq2Seq, special: Special) -> dict:
    """`seq2seq_config.json`: what `seq2seq_generation.Seq2SeqFolder` reads.

    Args:
        model: the encoder-decoder.
        description: its sizes.
        special: its special ids.

    Returns:
        The config; the position limits are the smallest table of the
        backbone (the encoder's and the decoder's alike), None where no
        table bounds them (T5's relative positions).
    """
    backbone = getattr(model, "backbone", model)
    limit, source = inputs.max_sequence_length(backbone)
    return {
        "format": FORMAT,
        "model": type(model).__name__,
        "encoder": ENCODER_FILE,
        "decoder": DECODER_FILE,
        "layers": description.layers,
        "heads": description.heads,
        "head_size": description.head_size,
        "vocabulary": description.vocabulary,
        "decoder_start_token_ids": None if special.start is None else list(special.start),
        "end_token_id": special.end,
        "pad_token_id": special.pad,
        "max_encoder_length": description.max_samples if description.audio else limit,
        "max_decoder_length": limit,
        "positions_from": source,
        "encoder_input": description.encoder_input,
        "audio_channels": description.channels,
        "image_shape": None if description.image_shape is None else list(description.image_shape),
        "min_encoder_samples": description.min_samples,
    }


def keras_reference(model) -> str:
    """What Keras code `keras_greedy` runs for `model`, as the report names it.

    Args:
        model: the encoder-decoder.

    Returns:
        "keras-hub's generate_step", "the model's forward pass" (a model
        whose protocol is ours, `protocol_greedy`) or "the protocol's calls".
    """
    if callable(getattr(model, "generate_step", None)):
        return "keras-hub's generate_step"
    if hasattr(seq2seq.protocol(model), "forward_logits"):
        return "the model's forward pass"
    return "the protocol's calls"


def keras_greedy(model, encoder_ids, encoder_mask, prompts, new_tokens: int, end) -> list:
    """keras-hub's own greedy generation on ids: `generate_step` with a
    greedy sampler (the model's compiled sampler set back after); for a
    model without `generate_step`, `protocol_greedy`.

    Args:
        model: the encoder-decoder.
        encoder_ids: (batch, length) ids, right-padded; or float waveforms
            (batch, samples[, channels]) for a speech model.
        encoder_mask: booleans (batch, length), True on tokens (or samples).
        prompts: the decoder's start tokens (batch, n).
        new_tokens: tokens each row gains.
        end: the end id, or None.

    Returns:
        Each row's tokens after its prompt, up to its end token included.
    """
    if not callable(getattr(model, "generate_step", None)):
        return protocol_greedy(model, encoder_ids, encoder_mask, prompts, new_tokens, end)
    from keras_hub.samplers import GreedySampler

    extra = {}
    if isinstance(encoder_ids, tuple):  # an image-prompted encoder's ids and images
        encoder_ids, extra["images"] = encoder_ids
    audio = encoder_ids.dtype.kind == "f"  # a speech model's waveforms
    key = "encoder_input_values" if audio else "encoder_token_ids"
    batch, start = prompts.shape
    decoder = np.zeros((batch, start + new_tokens), "int32")
    decoder[:, :start] = prompts
    mask = np.zeros(decoder.shape, bool)
    mask[:, :start] = True
    sampler = model.sampler
    model.sampler = GreedySampler()
    try:
        output = model.generate_step(
            {
                key: encoder_ids if audio else encoder_ids.astype("int32"),
                "encoder_padding_mask": encoder_mask.astype(bool),
                "decoder_token_ids": decoder,
                "decoder_padding_mask": mask,
                **extra,
            },
            stop_token_ids=None if end is None else (end,),
        )
    finally:
        model.sampler = sampler
    return [_until_end(row[start:], end) for row in np.asarray(output["decoder_token_ids"])]


def protocol_greedy(model, encoder_ids, encoder_mask, prompts, new_tokens: int, end) -> list:
    """Greedy generation in Keras through the protocol's own calls, with no
    cache carried between steps: at each step the decoder runs on every
    token so far from fresh caches (index 0), and the last position's
    argmax is appended. The folder's cached steps must give the same tokens.
    Where the protocol is ours over a model with no cached calls of its own
    (`seq2seq.FeatureEncoderCalls`, Whisper), each step is the model's own
    forward pass instead (its `forward_logits`), so the adapter the folder's
    files were traced through is held to code it did not write.

    Args:
        model: the encoder-decoder (`call_encoder`, `call_decoder_with_cache`,
            `_initialize_cache`, or a form `seq2seq.protocol` adapts).
        encoder_ids: what the encoder reads (`keras_greedy`'s).
        encoder_mask: booleans (batch, length).
        prompts: the decoder's start tokens (batch, n).
        new_tokens: tokens each row gains.
        end: the end id, or None.

    Returns:
        Each row's tokens after its prompt, up to its end token included.
    """
    from keras import ops

    mask = ops.convert_to_tensor(encoder_mask.astype(bool))
    inputs = encoder_ids
    if not isinstance(inputs, tuple) and inputs.dtype.kind != "f":
        inputs = inputs.astype("int32")
    calls = seq2seq.protocol(model)
    forward = getattr(calls, "forward_logits", None)
    if forward is None:
        hidden, mask = seq2seq.encoder_outputs(calls, inputs, mask)
    tokens = np.asarray(prompts, "int32")
    for _ in range(new_tokens):
        if forward is not None:
            logits = forward(inputs, tokens)
        else:
            logits = seq2seq._first_step(model, hidden, mask, ops.convert_to_tensor(tokens))[0]
        last = np.argmax(ops.convert_to_numpy(logits)[:, -1], axis=-1).astype("int32")
        tokens = np.concatenate([tokens, last[:, None]], axis=1)
    return [_until_end(row[prompts.shape[1] :], end) for row in tokens]


def _until_end(row, end) -> list:
    row = [int(token) for token in row]
    return row[: row.index(end) + 1] if end is not None and end in row else row


def _keras_text(model, texts: list, max_length: int) -> list:
    """keras-hub's `generate` on strings with a greedy sampler."""
    from keras_hub.samplers import GreedySampler

    sampler, function = model.sampler, model.generate_function
    model.sampler, model.generate_function = GreedySampler(), None
    try:
        output = model.generate(list(texts), max_length=max_length)
    finally:
        model.sampler, model.generate_function = sampler, function
    return [str(text) for text in output]


def _proof_inputs(description: seq2seq.Seq2Seq, config: dict) -> tuple:
    if description.masks_itself:  # waveforms of the decoder check's lengths, padded; images
        waves, mask = seq2seq._encoder_inputs(description, np.random.default_rng(0))
        return waves, mask.astype(bool)
    limit = config["max_encoder_length"] or max(ENCODER_LENGTHS)
    lengths = np.minimum(np.array(ENCODER_LENGTHS), limit)
    rng = np.random.default_rng(0)
    mask = np.arange(lengths.max()) < lengths[:, None]
    ids = np.where(mask, rng.integers(1, description.vocabulary, mask.shape), 0)
    return ids.astype("int32"), mask


def composed(model, staged: Path, description, options: ExportOptions) -> dict:
    """The folder's two files together, teacher-forced: the merged decoder's
    steps on the encoder file's output (each file of the pair it was made
    from was proved alone, the decoder on Keras' keys and values), its first
    step projecting them, each call's logits against Keras' cached calls. Unlike
    greedy tokens, which a random model repeats whatever its input, the
    logits move with every input.

    Args:
        model: the encoder-decoder.
        staged: the staged folder.
        description: its sizes.
        options: the export's tolerances.

    Returns:
        `{"equal", "checks", "error"}`: the prompt's check and the decode steps'.
    """
    reference = seq2seq.decoder_references(model, description)
    opened = Seq2SeqFolder(staged)
    hidden, mask = opened.encode(reference.encoder_ids, reference.encoder_input_mask == 1)
    result = validating.Validation(atol=options.atol, rtol=options.rtol)
    fed = replace(reference, encoder_mask=mask)
    checked = seq2seq.check_steps(fed, opened.stepper(hidden, mask), result)
    return {
        "equal": checked.passed,
        "checks": [asdict(check) for check in checked.checks],
        "error": checked.error,
    }


def prove_folder(
    model, staged: Path, description, config: dict, special: Special, options: ExportOptions
) -> dict:
    """The staged folder against keras-hub: its files together
    (`composed`), and greedy generation against keras-hub's own.

    Args:
        model: the encoder-decoder.
        staged: the staged folder (every file written).
        description: its sizes.
        config: its `seq2seq_config.json`.
        special: its special ids.
        options: the export's tolerances.

    Returns:
        `{"passed", "composed", "ids": {...}, "text": {...} (with a
        tokenizer)}`: the composed logits' checks, then the greedy parts,
        each with the inputs, the tokens (or texts) of both sides and whether
        they are equal.
    """
    ids, mask = _proof_inputs(description, config)
    start = special.start or (1,)
    prompts = np.array([start] * len(mask), "int32")
    new = NEW_TOKENS
    if config["max_decoder_length"] is not None:
        new = min(new, config["max_decoder_length"] - len(start))
    expected = keras_greedy(model, ids, mask, prompts, new, special.end)
    key = "encoder_input_values" if description.audio else "encoder_token_ids"
    feeds = {key: ids, "encoder_padding_mask": mask, "decoder_token_ids": prompts}
    if description.image:
        feeds[key], feeds["images"] = ids
    tokens = generate(staged, feeds, new, end_token_id=special.end)
    got = [_until_end(row[len(start) :], special.end) for row in tokens]
    genai = staged / whisper_folder.FOLDER
    result = {
        "composed": composed(model, staged, description, options),
        "ids": {
            "start": list(start),
            "end": special.end,
            "encoder_lengths": [int(n) for n in mask.sum(axis=1)],
            "new_tokens": new,
            "reference": keras_reference(model),
            "keras": expected,
            "onnx": got,
            "equal": got == expected,
        },
    }
    if genai.is_dir() and _genai_installed():  # genai itself, on the same features and prompts
        rows = whisper_folder.genai_tokens(genai, ids, prompts, new)
        onnx = [_until_end(row, special.end) for row in rows]
        result["genai"] = {"keras": expected, "onnx": onnx, "equal": onnx == expected}
    if (staged / "tokenizer.json").is_file():
        keras_texts = _keras_text(model, PROOF_TEXTS, len(start) + new)
        onnx_texts = generate(staged, list(PROOF_TEXTS), new)
        result["text"] = {
            "inputs": list(PROOF_TEXTS),
            "keras": keras_texts,
            "onnx": onnx_texts,
            "equal": keras_texts == onnx_texts,
        }
    result["passed"] = all(part["equal"] for part in result.values())
    return result


def _failure(proof: dict) -> str:
    part = proof["composed"]
    if not part["equal"]:
        failed = [check for check in part["checks"] if not check["passed"]]
        said = part["error"] or (
            f"{failed[0]['shape']}: max |diff| {failed[0]['max_abs_diff']:.3g}" if failed else ""
        )
        return f"the encoder's and the decoder's files together differ from Keras ({said})"
    for kind, part in proof.items():
        if kind in ("passed", "composed") or part["equal"]:
            continue
        pairs = zip(part["keras"], part["onnx"], strict=True)
        row = next(i for i, (keras, onnx) in enumerate(pairs) if keras != onnx)
        return (
            f"greedy generation from the folder differs from keras-hub's on {kind} row {row}: "
            f"keras-hub {part['keras'][row]!r}, the folder {part['onnx'][row]!r}"
        )
    return ""


def _export_files(model, description, staging: Path, folder: Path, options, progress) -> dict:
    """The encoder's file, the decoder's step and the cross-attention
    projections (the decoder's first step), each through the pipeline,
    staged in `PARTS` and merged into optimum's pair (`merged_decoder`)."""
    nothing = f"Nothing was placed: {folder} is as it was."
    parts = (
        ("encoder", ENCODER_FILE, seq2seq.encoder_model(model, description), "forward"),
        ("decoder", DECODER_FILE, model, "seq2seq-decoder"),
        ("cross", DECODER_FILE, seq2seq.cross_model(model, description), "forward"),
    )
    (staging / PARTS).mkdir()
    reports = {}
    for name, file, keras_model, task in parts:
        inner = replace(options, report_path=staging / f".{name}.json")
        try:
            part = pipeline.export_model(
                keras_model, staging / PARTS / PART_FILES[name], inner, task=task, progress=progress
            )
        except ValidationFailed as error:
            message = f"the {name} ({file}): {error.reason}. {nothing}"
            raise ValidationFailed(message, error.report, error.reason) from error
        except ExportError as error:
            raise type(error)(f"the {name} ({file}): {error}. {nothing}") from error
        (staging / f".{name}.json").unlink()
        part["onnx_path"] = str(folder / file)
        reports[name] = part
    reports["merged"] = _merged(staging)
    return reports


def _merged(where: Path) -> dict:
    """`merged_decoder.merge` of the pair in `where/PARTS` into `where`."""
    parts = where / PARTS
    census = merged_decoder.merge(*(parts / name for name in PART_FILES.values()), where)
    return {"file": DECODER_FILE, "branches": census}


def export_folder(model, folder, options: ExportOptions, *, progress=None) -> dict:
    """Export an encoder-decoder as a folder that generates, proved, then placed.

    Args:
        model: a keras-hub `Seq2SeqLM` (or a model with its protocol,
            `seq2seq.describe`) in memory, or the path of a `.keras` file.
        folder: the folder to write (any path but an `.onnx` file's or an
            existing file's; made where missing).
        options: the export's options (`_REFUSED` lists those not taken).
        progress: called with a `pipeline.StageEvent` as each file's stages
            start and end.

    Returns:
        The report (also `FOLDER/report.json`): `passed`, `encoder`,
        `decoder` (each file's export report), `tokenizer`, `config`,
        `generation` (`prove_folder`) and, with `quantize`, `quantized`
        (`quantized_folder`'s gate).

    Raises:
        UsageError: an option is refused, the output is no folder, or the
            model does not follow the protocol (naming `--task causal-lm` for
            a decoder-only model).
        ConversionError, ValidationFailed: a file or the folder's generation
            fails; nothing is placed.

    Example:

    >>> import keras_hub
    >>> backbone = keras_hub.models.BartBackbone(vocabulary_size=40, num_layers=1,
    ...     num_heads=2, hidden_dim=8, intermediate_dim=16, max_sequence_length=16)
    >>> model = keras_hub.models.BartSeq2SeqLM(backbone)
    >>> report = export_folder(model, tmp / "bart", ExportOptions())
    >>> report["passed"], report["generation"]["ids"]["equal"]
    (True, True)
    >>> sorted(p.name for p in (tmp / "bart").iterdir() if not p.name.startswith("."))
    ['decoder_model_merged.onnx', 'encoder_model.onnx', 'report.json', 'seq2seq_config.json']
    """
    options = pipeline.checked_options(options)
    folder = _check(options, folder)
    if isinstance(model, str | Path):
        model = loading.load(model, imports=options.imports, unsafe=options.unsafe).model
    description = seq2seq.describe(model)
    special = special_ids(model, description.masks_itself)
    _check_special(model, special, description.vocabulary)
    config = folder_config(model, description, special)
    # A speech or image model's preprocessor reads media: its text side alone
    # is not the folder's input (generate takes waveforms or images and ids).
    media = description.masks_itself
    preprocessor = None if media else getattr(model, "preprocessor", None)
    files = _file_names(preprocessor)
    kind = options.quantize
    genai = [whisper_folder.FOLDER] if whisper_folder.why_not(description) is None else []
    folder_placement.check_names(folder, files, ([kind] if kind else []) + genai)
    nothing = f"Nothing was placed: {folder} is as it was."
    report = {"task": "seq2seq-lm", "folder": str(folder)}
    with folder_placement.staging(folder) as staging:
        # each file is proved in float32 first (the level is the quantized files')
        floats = replace(options, quantize=None, decoder_accuracy_level=ACCURACY_LEVEL)
        report.update(_export_files(model, description, staging, folder, floats, progress))
        if preprocessor is not None:
            report["tokenizer"] = _tokenizer(preprocessor, staging)
        placement.write_json(config, staging / CONFIG_FILE)
        report["config"] = config
        report["transformers"] = _transformers_files(model, special, staging)
        report["genai"] = _genai_folder(staging, description, special, config)
        proof = prove_folder(model, staging, description, config, special, options)
        report["generation"] = proof
        report["passed"] = proof["passed"]
        if genai:  # without onnxruntime-genai installed, its folder is written unproved
            _say_if_genai_proved(report["genai"], proof)
        report["report_path"] = str(folder / REPORT_FILE)
        if not proof["passed"]:
            reason = _failure(proof)
            raise ValidationFailed(f"{reason}. {nothing}", report, reason)
        if kind:
            _gate(model, staging, folder, description, report, options)
        shutil.rmtree(staging / PARTS)
        placement.write_json(report, staging / REPORT_FILE)
        folder_placement.place_folder(staging, folder)
    return report


def _say_if_genai_proved(genai: dict, proof: dict) -> None:
    """Whether genai ran the written genai/ folder; if not, why (not installed)."""
    genai["proved_in_genai"] = "genai" in proof
    if "genai" not in proof:
        genai["not_proved"] = GENAI_MISSING


def _genai_folder(staging: Path, description, special: Special, config: dict) -> dict:
    """onnxruntime-genai's whisper folder (`whisper_folder`) from the staged
    parts where the model is Whisper-shaped, else why not."""
    why = whisper_folder.why_not(description)
    if why is not None:
        return {"written": False, "why_not": why}
    parts = staging / PARTS
    written = whisper_folder.write(
        parts / PART_FILES["encoder"],
        parts / PART_FILES["decoder"],
        staging / whisper_folder.FOLDER,
        description,
        special,
        config["max_decoder_length"] or whisper_folder.FRAMES,
    )
    return {"written": True, **written}


def _file_names(preprocessor) -> list:
    """The files the folder may receive (the tokenizer's with a preprocessor)."""
    tokenizer_files = list(TOKENIZER_FILES) if preprocessor is not None else []
    if _proto(preprocessor) is not None:
        tokenizer_files.append(SENTENCEPIECE_FILE)
    files = [ENCODER_FILE, DECODER_FILE, CONFIG_FILE, REPORT_FILE, *tokenizer_files]
    return files + [transformers_config.CONFIG_FILE, transformers_config.GENERATION_FILE]


def _genai_installed() -> bool:
    try:
        import onnxruntime_genai  # noqa: F401 - the genai extra
    except ImportError:
        return False
    return True


def _proto(preprocessor) -> bytes | None:
    """A SentencePiece tokenizer's proto (None for another tokenizer)."""
    proto = getattr(getattr(preprocessor, "tokenizer", None), "proto", None)
    return proto if isinstance(proto, bytes) else None


def _tokenizer(preprocessor, staging: Path) -> dict:
    """The tokenizer files, proved (`export_tokenizer`), and a SentencePiece
    tokenizer's proto itself, which `generate` encodes with: its report."""
    report = export_tokenizer(preprocessor, staging).report()
    proto = _proto(preprocessor)
    if proto is not None:
        (staging / SENTENCEPIECE_FILE).write_bytes(proto)
        report["sentencepiece"] = SENTENCEPIECE_FILE
    return report


def _transformers_files(model, special: Special, staging: Path) -> dict:
    """`config.json` and `generation_config.json` where the model has a
    transformers architecture (`transformers_config`), for optimum's
    `ORTModelForSeq2SeqLM`; else the reason, for the report."""
    written = transformers_config.configs(model, special.start, special.end, special.pad)
    if written.config is None:
        return {"files": [], "why_not": written.why_not}
    placement.write_json(written.config, staging / transformers_config.CONFIG_FILE)
    placement.write_json(written.generation, staging / transformers_config.GENERATION_FILE)
    names = [transformers_config.CONFIG_FILE, transformers_config.GENERATION_FILE]
    return {"files": names, "model_type": written.config["model_type"]}


def _gate(model, staging: Path, folder: Path, description, report: dict, options) -> None:
    """Write and judge the quantized folder (`quantized_folder`) into the
    report; a failed gate raises, the refused folder kept beside FOLDER."""
    kind = options.quantize
    gate = quantized_folder(model, staging, description, report["generation"], options)
    report["quantized"] = {kind: gate}
    if not gate["passed"]:
        report["passed"] = False
        where = _keep_failed(staging / kind, folder)
        raise ValidationFailed(
            f"the {kind} folder fails its gate: {gate['failure']}. Nothing was placed: "
            f"{folder} is as it was. The {kind} folder was {where}",
            report,
            gate["failure"],
        )


def _log_probs(logits: np.ndarray, following: np.ndarray) -> np.ndarray:
    """log p of each next token (batch, n) under logits (batch, n, vocabulary)."""
    logits = logits.astype(np.float64)
    top = logits.max(axis=-1, keepdims=True)
    norm = top[..., 0] + np.log(np.exp(logits - top).sum(axis=-1))
    picked = np.take_along_axis(logits, following[..., None], axis=-1)[..., 0]
    return picked - norm


def _teacher_forced(reference, step) -> np.ndarray:
    """Each fed token's log-probability after the tokens before it, from
    `step`'s logits over the reference's calls (Keras' when `step` is None)."""
    calls = reference.tokens
    pairs = zip(calls[:-1], calls[1:], strict=True)
    following = [np.concatenate([fed[:, 1:], after[:, :1]], axis=1) for fed, after in pairs]
    found = []
    for index, tokens in enumerate(calls[:-1]):
        logits = reference.logits[index] if step is None else step(tokens)
        found.append(_log_probs(logits, following[index]))
    return np.concatenate(found, axis=1)


def quantized_folder(model, staging: Path, description, proof: dict, options) -> dict:
    """`staging/<kind>/`: both files' weights quantized (`MatMulNBits`,
    `quantizing.quantize_weights`) beside copies of the config and the
    tokenizer, judged by `decoder_gate`'s measures against Keras: greedy
    agreement on the proof's inputs (keras-hub's tokens, `prove_folder`),
    and the mean |log p change| of the teacher-forced tokens of the
    decoder's check (`seq2seq.decoder_references`: Keras' logits, the
    quantized encoder's keys and values fed to the quantized decoder).

    Args:
        model: the encoder-decoder.
        staging: the staged float32 folder, proved.
        description: its sizes.
        proof: `prove_folder`'s result (its ids part holds Keras' tokens).
        options: `quantize`, the gate's thresholds and accuracy level.

    Returns:
        `{"bits", "block_size", "accuracy_level", "quantized", "passed",
        "greedy_agreement", "per_row", "mean_abs_log_prob_change",
        "thresholds", "failure", "file_bytes"}`.
    """
    kind = options.quantize
    sub = staging / kind
    sub.mkdir()
    counts = 0
    (sub / PARTS).mkdir()
    for name in PART_FILES.values():
        part = quantize_weights(
            staging / PARTS / name, sub / PARTS / name, kind, options.decoder_accuracy_level
        )
        counts += part["quantized"]
    _merged(sub)
    shutil.rmtree(sub / PARTS)
    for path in staging.iterdir():
        if path.is_file() and path.suffix == ".json" and path.name != REPORT_FILE:
            shutil.copy2(path, sub / path.name)
    for name in (*TOKENIZER_FILES, SENTENCEPIECE_FILE):
        if (staging / name).is_file():
            shutil.copy2(staging / name, sub / name)
    ids = proof["ids"]
    inputs, mask = _proof_inputs(description, json.loads((sub / CONFIG_FILE).read_text()))
    start = proof["ids"]["start"]
    prompts = np.array([start] * len(mask), "int32")
    key = "encoder_input_values" if description.audio else "encoder_token_ids"
    feeds = {key: inputs, "encoder_padding_mask": mask, "decoder_token_ids": prompts}
    if description.image:
        feeds[key], feeds["images"] = inputs
    end = proof["ids"]["end"]
    tokens = generate(sub, feeds, ids["new_tokens"], end_token_id=end)
    rows = [
        agreement([*start, *_until_end(row[len(start) :], end)], [*start, *keras], len(start))
        for row, keras in zip(tokens.tolist(), ids["keras"], strict=True)
    ]
    reference = seq2seq.decoder_references(model, description)
    opened = Seq2SeqFolder(sub)
    step = opened.stepper(*opened.encode(reference.encoder_ids, reference.encoder_input_mask == 1))
    moved = _teacher_forced(reference, step) - _teacher_forced(reference, None)
    change = float(np.abs(moved).mean())
    share = float(np.mean(rows))
    failure = ""
    if share < options.decoder_min_agreement:
        failure = f"greedy agreement {share:.3f} < {options.decoder_min_agreement}"
    elif change > options.decoder_max_nll_change:
        failure = f"mean |log p change| {change:.4f} nats/token > {options.decoder_max_nll_change}"
    size = sum(path.stat().st_size for path in sub.iterdir() if path.suffix != ".json")
    return {
        **summary(kind, options.decoder_accuracy_level, counts),
        "passed": not failure,
        "greedy_agreement": share,
        "per_row": rows,
        "mean_abs_log_prob_change": change,
        "thresholds": {
            "min_agreement": options.decoder_min_agreement,
            "max_nll_change": options.decoder_max_nll_change,
        },
        "failure": failure,
        "file_bytes": size,
    }
