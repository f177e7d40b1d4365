"""The export command: `keras-layers-export`, `python -m keras_layers.export` and
the checkout's `python export/to_onnx.py` all run `run()`.

A thin layer: it parses flags, shows progress (`display`), calls `export_model`,
and turns the typed errors into one line and an exit code: 0 every check
passed, 1 validation failed, 2 bad input or usage, 3 an unexpected internal
error, 130 interrupted.
"""

import argparse
import logging
import os
import re
import sys
import time
import traceback
import warnings
from importlib import metadata
from pathlib import Path

from keras_layers.export import startup

EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
DEMO_NAME = "demo_encoder.keras"
# The API's argument names as the command line spells them, for error messages.
FLAGS = {
    "model": "MODEL",
    "output": "-o",
    "report_path": "--report",
    "shapes": "--shapes",
    "atol": "--atol",
    "rtol": "--rtol",
    "opset": "--opset",
    "imports": "--import",
    "unsafe": "--unsafe",
    "external_data": "--external-data",
    "weights_dtype": "--weights-dtype",
    "quantize": "--quantize",
    "int8_min_top1": "--int8-min-top1",
    "decoder_min_agreement": "--decoder-min-agreement",
    "decoder_max_nll_change": "--decoder-max-nll-change",
    "decoder_accuracy_level": "--decoder-accuracy-level",
    "allow_nonfinite": "--allow-nonfinite",
    "input_roles": "--input",
    "task": "--task",
    "onnx_path": "FILE.onnx",
    "preprocessor": "--with-preprocessor",
    "channels_first": "--channels-first",
    "parts": "--parts",
    "text_pairs": "--text-pairs",
    "sampler": "--sampler",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "temperature": "--temperature",
    "context_length": "--context-length",
    "end_token_id": "--end-token-id",
}
FIXES = {
    "unsafe": "--unsafe",
    "imports": "--import MODULE",
    "allow_nonfinite": "--allow-nonfinite",
    "shapes": "--shapes BxS,...",
    "memory_check": "--no-memory-check",
}


def default_demo_dir(checkout: Path | None = None) -> Path:
    """Where the demo's files go, one place per kind of installation:
    `$KERAS_LAYERS_HOME/demo` when set; else, run from a checkout (the
    package installed from it with `pip install -e`, or `checkout` given),
    its `artifacts/demo`, so that `python export/to_onnx.py` and
    `keras-layers-export` share one trained demo; else
    `$XDG_CACHE_HOME/keras-layers/demo` (default `~/.cache/keras-layers/demo`)."""
    home = os.environ.get("KERAS_LAYERS_HOME")
    if home:
        return Path(home).expanduser() / "demo"
    checkout = checkout or Path(__file__).resolve().parents[2]
    if (checkout / "export" / "to_onnx.py").is_file() and (checkout / "pyproject.toml").is_file():
        return checkout / "artifacts" / "demo"
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "keras-layers" / "demo"


def _version() -> str:
    try:
        return metadata.version("keras-layers")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def _shapes(text: str) -> list:
    """`--shapes`: comma-separated `BATCHxSEQ` pairs (`BATCHxSIDE` for
    images), `padded`, `structured` or `unprompted`."""
    shapes = []
    for item in text.split(","):
        item = item.strip().lower()
        if item in ("padded", "structured", "unprompted"):
            shapes.append(item)
            continue
        match = re.fullmatch(r"(\d{1,9})x(\d{1,9})", item)
        if not match or min(int(match.group(1)), int(match.group(2))) < 1:
            raise argparse.ArgumentTypeError(
                f"{item!r} is not BATCHxSEQ (BATCHxSIDE for images) with positive integers "
                "(example: --shapes 1x1,2x7,8x64,padded; for images 1x224,8x96,structured)"
            )
        shapes.append((int(match.group(1)), int(match.group(2))))
    return shapes


def _input_role(text: str) -> tuple:
    """`--input NAME=ROLE[@AXIS]` -> (NAME, `InputRole`), parsed once here."""
    from keras_layers.export.inputs import parse_override

    try:
        return parse_override(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def parser(prog: str, demo_dir: Path) -> argparse.ArgumentParser:
    """The command's arguments.

    Args:
        prog: the command's name, for `--help`.
        demo_dir: where the demo's files go (named in `--help`).

    Returns:
        The parser; its destinations that share a name with a field of
        `ExportOptions` are that field (`_options`).
    """
    p = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Convert a Keras 3 .keras model to ONNX with tf2onnx, make the file lean, "
            "and prove in onnxruntime that it computes what Keras computes. Without "
            f"MODEL, trains (once) and exports the demo encoder in {demo_dir}."
        ),
        epilog="Exit codes: 0 passed, 1 validation failed, 2 bad input, 3 internal error, "
        "130 interrupted.",
    )
    _add_paths(p, demo_dir)
    _add_checks(p)
    _add_conversion(p)
    _add_quantization(p)
    _add_folder(p)
    _add_inputs(p)
    _add_text(p)
    _add_command(p)
    return p


def _add_paths(p: argparse.ArgumentParser, demo_dir: Path) -> None:
    """MODEL, FILE.onnx, --check-only, -o, --report."""
    p.add_argument(
        "model",
        nargs="?",
        type=Path,
        metavar="MODEL.keras",
        help=f"model to export (default: the demo, {demo_dir / DEMO_NAME})",
    )
    p.add_argument(
        "onnx_path",
        nargs="?",
        type=Path,
        metavar="FILE.onnx",
        help="with --check-only: the ONNX file to check against MODEL",
    )
    p.add_argument(
        "--check-only",
        action="store_true",
        help="check FILE.onnx (made by any tool) against MODEL and write nothing, "
        "unless --report is given",
    )
    p.add_argument(
        "-o",
        "--output",
        metavar="OUT.onnx",
        help="ONNX file to write (default: MODEL with .onnx); with --task causal-lm, FOLDER/ "
        "(ending in / or an existing folder) writes the folder onnxruntime-genai runs",
    )
    p.add_argument(
        "--report",
        dest="report_path",
        type=Path,
        metavar="REPORT.json",
        help="JSON report path (default: OUT.report.json beside the output)",
    )


def _add_checks(p: argparse.ArgumentParser) -> None:
    """--atol, --rtol, --shapes: what the validation compares."""
    from keras_layers.export.validating import DEFAULT_ATOL, DEFAULT_RTOL

    p.add_argument(
        "--atol",
        type=_tolerance,
        default=DEFAULT_ATOL,
        help=f"absolute tolerance, times each output's spread (its standard deviation; "
        f"default {DEFAULT_ATOL:g})",
    )
    p.add_argument(
        "--rtol",
        type=_tolerance,
        default=DEFAULT_RTOL,
        help=f"relative tolerance (default {DEFAULT_RTOL:g})",
    )
    p.add_argument(
        "--shapes",
        type=_shapes,
        metavar="BxS,...",
        help="validation grid of batch x sequence, or batch x side of square images, "
        "e.g. 1x1,2x7,8x64,padded or 1x224,8x96,structured (default: batch 1,2,8 x seq "
        "1,7,64,256, plus padded; images: batch 1,2,8 x the smallest side the model takes "
        "and sides near 37 and 96, plus structured images)",
    )


def _add_conversion(p: argparse.ArgumentParser) -> None:
    """--opset, --import, --unsafe, --task, --external-data, --weights-dtype:
    what is loaded, and what the file is."""
    from keras_layers.export.converting import DEFAULT_OPSET
    from keras_layers.export.options import EXTERNAL_DATA_CHOICES, WEIGHTS_DTYPE_CHOICES
    from keras_layers.export.tasks import task_names

    p.add_argument(
        "--opset", type=int, default=DEFAULT_OPSET, help=f"ONNX opset (default {DEFAULT_OPSET})"
    )
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a module that defines custom layers or functions, registered or "
        "not (repeatable; searched for in the working directory too)",
    )
    p.add_argument(
        "--unsafe",
        action="store_true",
        help="allow Lambda layers (runs code stored in the file: trusted files only)",
    )
    p.add_argument(
        "--channels-first",
        action="store_true",
        help="the file takes the model's NHWC images as NCHW (batch, channels, height, "
        "width), as optimum's vision files do",
    )
    p.add_argument(
        "--parts",
        action="store_true",
        help="a composite as one file per part in -o FOLDER/, each checked against Keras: "
        "two towers (CLIP, SigLIP: vision_embedder, text_embedder), SAM (image_encoder, "
        "prompt_decoder), Stable Diffusion 3 (text encoders, diffuser, vae_decoder)",
    )
    p.add_argument(
        "--task",
        choices=task_names(),
        default="forward",
        help="forward: the model's call over whole sequences (default); causal-lm: a "
        "decoder with a key/value cache for generation (a keras-hub CausalLM, saved with "
        "its preprocessor or without, or a model with call_with_cache; "
        "docs/generation.md), checked by decode steps and greedy generation against "
        "Keras; with -o FOLDER/, a model saved with its preprocessor gets its tokenizer "
        "written, one without needs --end-token-id (and --context-length for rotary "
        "positions); seq2seq-lm: an encoder-decoder (every keras-hub Seq2SeqLM but EdRec: "
        "BART, T5, T5Gemma, Moonshine's speech, BLIP-2's images; or call_encoder and "
        "call_decoder_with_cache of your own) as "
        "-o FOLDER/ with the encoder's file, the decoder's with its caches, the config and "
        "the tokenizer, proved by greedy generation against keras-hub's",
    )
    p.add_argument(
        "--external-data",
        choices=EXTERNAL_DATA_CHOICES,
        default="auto",
        help="store weights in a data file beside OUT.onnx, named by its content "
        "(auto: when over ~1.8 GB)",
    )
    p.add_argument(
        "--weights-dtype",
        choices=WEIGHTS_DTYPE_CHOICES,
        default="float32",
        help="store the matrix weights in float32 (default), float16, or the dtype of the "
        "model's variables (keep: bfloat16 for a keras-hub preset); computed in float32. "
        "keep with --task causal-lm --quantize int4 -o FOLDER/ streams the stored weights "
        "into the int4 folder with no float32 copy (chosen by itself when float32 would not "
        "fit in memory)",
    )


def _add_quantization(p: argparse.ArgumentParser) -> None:
    """--quantize and the gates of the quantized files."""
    from keras_layers.export.decoder_gate import MAX_NLL_CHANGE, MIN_AGREEMENT
    from keras_layers.export.options import ACCURACY_LEVEL, ACCURACY_LEVELS, QUANTIZE_CHOICES
    from keras_layers.export.validating import INT8_MIN_TOKENS, INT8_MIN_TOP1

    p.add_argument(
        "--quantize",
        choices=QUANTIZE_CHOICES,
        help="also write OUT.int8.onnx (dynamic int8), judged by top-1 agreement; with "
        "--task causal-lm or seq2seq-lm -o FOLDER/, FOLDER/int8/ or FOLDER/int4/ (weight-only "
        "MatMulNBits, "
        "blocks of 32), judged by greedy agreement and log-likelihood change",
    )
    p.add_argument(
        "--int8-min-top1",
        type=_tolerance,
        default=INT8_MIN_TOP1,
        metavar="SHARE",
        help="the int8 gate: least top-1 agreement with Keras, pooled over the grid's "
        f"real tokens (at least {INT8_MIN_TOKENS}) (default {INT8_MIN_TOP1:g})",
    )
    p.add_argument(
        "--decoder-min-agreement",
        type=_tolerance,
        default=MIN_AGREEMENT,
        metavar="SHARE",
        help="a quantized decoder's gate: least mean share of greedy tokens equal to Keras' "
        f"before the first difference (default {MIN_AGREEMENT:g})",
    )
    p.add_argument(
        "--decoder-max-nll-change",
        type=_tolerance,
        default=MAX_NLL_CHANGE,
        metavar="NATS",
        help="a quantized decoder's gate: largest mean |log-probability change| of a "
        f"held-out text's tokens (default {MAX_NLL_CHANGE:g})",
    )
    p.add_argument(
        "--decoder-accuracy-level",
        type=int,
        choices=ACCURACY_LEVELS,
        default=ACCURACY_LEVEL,
        help="how a quantized decoder's MatMulNBits compute: 4, activations quantized to int8 "
        "(the fastest; the model builder's CPU setting), or 1, float32 from the dequantized "
        f"weights (default {ACCURACY_LEVEL})",
    )


def _add_folder(p: argparse.ArgumentParser) -> None:
    """--sampler, --top-k, --top-p, --temperature, --context-length,
    --end-token-id: what the genai folder's genai_config.json says."""
    from keras_layers.export.decoding import SAMPLERS
    from keras_layers.export.options import SAMPLER_DEFAULTS

    only = "only with --task causal-lm -o FOLDER/"
    p.add_argument(
        "--sampler",
        choices=SAMPLERS,
        help="the search genai_config.json sets, what onnxruntime-genai does unless its caller "
        "sets another (default greedy: the model's compiled sampler is not kept in a .keras "
        f"file); {only}",
    )
    p.add_argument(
        "--top-k",
        type=int,
        metavar="K",
        help="with --sampler top_k: the most likely tokens kept "
        f"(default {SAMPLER_DEFAULTS['top_k']}, keras-hub's)",
    )
    p.add_argument(
        "--top-p",
        type=float,
        metavar="P",
        help="with --sampler top_p: probability mass kept, in (0, 1] "
        f"(default {SAMPLER_DEFAULTS['top_p']:g}, keras-hub's)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        metavar="T",
        help="with --sampler top_k or top_p: the logits' temperature "
        f"(default {SAMPLER_DEFAULTS['temperature']:g})",
    )
    p.add_argument(
        "--context-length",
        type=int,
        metavar="N",
        help="genai_config.json's context_length, the longest sequence genai runs (default: the "
        "model's position table; for rotary positions, which have no table, the preprocessor's "
        "sequence length, and needed without a preprocessor); at most the position table; "
        f"{only}",
    )
    p.add_argument(
        "--end-token-id",
        type=int,
        metavar="ID",
        help="the id generation ends at, written as the start, end and pad ids: needed for a "
        "model saved without preprocessor (genai would stop at token 0); with one, its "
        f"tokenizer's is written; {only}",
    )


def _add_inputs(p: argparse.ArgumentParser) -> None:
    """--input, --no-memory-check, --allow-nonfinite: overrides of what is
    read from the model or the machine."""
    p.add_argument(
        "--input",
        dest="input_roles",
        action="append",
        default=[],
        type=_input_role,
        metavar="NAME=ROLE[@AXIS]",
        help="how to generate input NAME when the role read from the model is wrong: "
        "ROLE is ids, padding_mask, token_positions, positions or features; AXIS names "
        "its sequence axis "
        "(repeatable)",
    )
    p.add_argument(
        "--no-memory-check",
        dest="memory_check",
        action="store_false",
        help="export even when the estimated peak memory exceeds what is available",
    )
    p.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="accept NaN or infinity in Keras' own outputs (the ONNX file must match them)",
    )


def _add_text(p: argparse.ArgumentParser) -> None:
    """--with-preprocessor, --text-pairs: strings (`text_model`) or decoded
    images (`image_model`) in."""
    p.add_argument(
        "--with-preprocessor",
        dest="preprocessor",
        action="store_true",
        help="one file with the keras-hub task's preprocessor: strings in (its tokenizer and "
        "packing as onnxruntime-extensions ops before the model; run it with their library "
        "registered, docs/tokenizers.md), or decoded uint8 images of any size in (its image "
        "converter: resize, rescale, normalise); checked against predict",
    )
    p.add_argument(
        "--text-pairs",
        action="store_true",
        help="with --with-preprocessor: a second string input, text_pair, for a "
        "preprocessor that packs pairs",
    )
    p.add_argument(
        "--tokenizer-only",
        action="store_true",
        help="write MODEL's tokenizer (its keras-hub preprocessor's, framing included) as "
        "tokenizer.json, tokenizer_config.json and special_tokens_map.json in -o FOLDER "
        "(default: MODEL_tokenizer beside it), proved token-identical to keras-hub on the "
        "stress corpus first; no ONNX model",
    )


def _add_command(p: argparse.ArgumentParser) -> None:
    """--retrain, -q, --verbose, --version: the command itself."""
    p.add_argument(
        "--retrain", action="store_true", help="retrain the demo even if a trained one exists"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("--verbose", action="store_true", help="show library logs and tracebacks")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")


def _missing_path(args) -> str | None:
    """The one line for a model or ONNX file that does not exist, found
    before any library is imported: the same words the loader would say."""
    if args.model is not None and not os.path.lexists(args.model):
        return f"{args.model}: no such file"
    onnx_path = getattr(args, "onnx_path", None)
    if args.check_only and onnx_path is not None and not os.path.lexists(onnx_path):
        return f"{onnx_path}: no such file; give the path of an existing .onnx file"
    return None


def _quiet_libraries(verbose: bool) -> None:
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    warnings.filterwarnings("ignore")
    for name in ("tf2onnx", "onnxslim", "absl", "tensorflow"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _demo(args, demo_dir: Path, display) -> tuple[Path, dict, object]:
    """The trained demo (training it first if needed), its report entry and its
    int8 task check."""
    from rich.markup import escape

    from keras_layers.demo import task
    from keras_layers.export.pipeline import StageEvent

    path = args.model or demo_dir / DEMO_NAME
    metrics = None if args.retrain else task.saved_metrics(path)
    if metrics is None:
        display.print(f"[bold]Training the demo encoder[/] -> {escape(str(path))}")
        metrics = task.train(path, on_step=display.training_step)
        display(StageEvent("train", seconds=metrics["train_seconds"]))  # the report's figure
        display.print(
            f"  masked-token accuracy on {metrics['held_out_sequences']} held-out "
            f"sequences: {metrics['masked_token_accuracy']:.1%}"
        )
    else:
        display.print(
            f"Reusing the trained demo {escape(str(path))} (masked-token accuracy "
            f"{metrics['masked_token_accuracy']:.1%}; --retrain to train again)"
        )
    if metrics["masked_token_accuracy"] < 0.9:
        display.print("[yellow]warning:[/] the demo is below its 90% accuracy target")
    evaluate = task.int8_evaluation(path, metrics["masked_token_accuracy"])
    return path, {"demo": {k: v for k, v in metrics.items() if k != "config"}}, evaluate


def _options(args):
    """The `ExportOptions` of the flags: each field from the flag whose
    destination bears its name (`--input` pairs collected into a dict)."""
    from dataclasses import fields

    from keras_layers.export.options import ExportOptions

    given = {**vars(args), "input_roles": dict(args.input_roles)}
    return ExportOptions(
        **{f.name: given[f.name] for f in fields(ExportOptions) if f.name in given}
    )


def _export(args, demo_dir: Path, console) -> tuple[dict, float]:
    """Check the options, train the demo if it is the model, export; returns
    the report and the seconds the export took."""
    from dataclasses import replace

    from rich.markup import escape

    from keras_layers.export.api import export_model
    from keras_layers.export.display import StageDisplay
    from keras_layers.export.errors import UsageError, command_line_wording
    from keras_layers.export.genai_folder import refuse_folder_options

    with StageDisplay(console, quiet=args.quiet) as display, command_line_wording(FLAGS, FIXES):
        model, evaluate = args.model, None
        if model is None and args.task != "forward":
            raise UsageError(
                f"--task {args.task} needs MODEL: the demo is an encoder (export a "
                "keras-hub CausalLM, or keras_layers.demo.TiedDecoder)"
            )
        if args.onnx_path is not None:
            raise UsageError(
                f"FILE.onnx {args.onnx_path}: a second path is read only with --check-only; "
                f"add --check-only to check it, or write -o {args.onnx_path} to export to it"
            )
        _check_text_flags(args)
        options = _options(args)
        refuse_folder_options(options, args.task, args.output)
        if model is None:
            model, extra, evaluate = _demo(args, demo_dir, display)
            options = replace(options, extra_report=extra)
        output = args.output or model.with_suffix(".onnx")  # as given: "FOLDER/" keeps its /
        display.print(f"[bold]Exporting[/] {escape(str(model))} -> {escape(str(output))}")
        start = time.perf_counter()
        _check_folder_output(args)
        report = export_model(
            model, output, options, task=args.task, progress=display, evaluate=evaluate
        )
    return report, time.perf_counter() - start


def _check_folder_output(args) -> None:
    """A folder `-o` is the genai folder of `--task causal-lm`; refuse it otherwise."""
    from keras_layers.export.errors import UsageError
    from keras_layers.export.genai_folder import is_folder

    if args.output == "":
        raise UsageError("-o '': an empty path; give a file OUT.onnx (or FOLDER/ for a decoder)")
    if args.parts:
        if args.output is None or not is_folder(args.output):
            raise UsageError(
                f"--parts writes one file per part into a folder: give -o FOLDER/ (not "
                f"{args.output or 'a file beside the model'})"
            )
        return
    if args.task == "seq2seq-lm" and (args.output is None or not is_folder(args.output)):
        raise UsageError(
            f"--task seq2seq-lm writes a folder (encoder, decoder, config, tokenizer): give "
            f"-o FOLDER/ (not {args.output or 'a file beside the model'})"
        )
    if args.output is not None and is_folder(args.output) and args.task == "forward":
        raise UsageError(
            f"-o {args.output}: is a directory; a folder is written only for --task causal-lm "
            "(the folder onnxruntime-genai runs) and --task seq2seq-lm: give a file OUT.onnx, "
            "or add --task causal-lm"
        )


def _check_text_flags(args) -> None:
    """Refuse what `--with-preprocessor` does not take, before any work."""
    from keras_layers.export.errors import UsageError

    if args.text_pairs and not args.preprocessor:
        raise UsageError("--text-pairs: only with --with-preprocessor; add it, or leave this out")
    if not args.preprocessor:
        return
    refused = [
        (args.model is None, "MODEL", "the demo has no preprocessor: give MODEL.keras"),
        (args.task != "forward", f"--task {args.task}", "it exports the forward pass"),
        (args.quantize is not None, f"--quantize {args.quantize}", "leave --quantize out"),
    ]
    for given, flag, what in refused:
        if given:
            raise UsageError(f"{flag}: not taken with --with-preprocessor; {what}")


def _command(args):
    """The command the flags ask for: check, tokenizer files, or export."""
    from keras_layers.export.errors import UsageError

    if args.tokenizer_only and args.check_only:
        raise UsageError("--tokenizer-only: not taken with --check-only; leave one out")
    if args.tokenizer_only:
        return _tokenizer_only
    return _check_only if args.check_only else _export


# What --tokenizer-only takes (it loads the model and writes its tokenizer),
# or refuses with its own words (the preprocessor, a FILE.onnx).
TOKENIZER_FLAGS = ("model", "output", "imports", "unsafe", "preprocessor", "onnx_path")


def _export_flags_given(args, taken: tuple) -> list[tuple[bool, str, str]]:
    """`(given, flag, what to do)` for each option flag (`FLAGS`) other than
    `taken` that differs from its default: a flag that cannot apply is
    refused, never silently ignored."""
    defaults = parser("", Path()).parse_args([])
    found = []
    for name, flag in FLAGS.items():
        if name in taken or not hasattr(args, name):
            continue
        value = getattr(args, name)
        if value != getattr(defaults, name):
            scalar = isinstance(value, str | int | float | os.PathLike) and value is not True
            found.append(
                (True, f"{flag} {value}" if scalar else flag, "it applies to exports; leave it out")
            )
    return found


def _tokenizer_only(args, demo_dir: Path, console) -> tuple[dict, float]:
    """`--tokenizer-only`: MODEL's preprocessor as tokenizer files
    (`tokenizer_files.export_tokenizer`); returns the report and the seconds."""
    from rich.markup import escape

    from keras_layers.export import loading
    from keras_layers.export.display import StageDisplay
    from keras_layers.export.errors import UsageError, command_line_wording
    from keras_layers.export.tokenizer_files import export_tokenizer
    from keras_layers.export.tokenizer_files.vocabulary_fit import check_ids_fit, embedding_rows

    del demo_dir
    refused = [
        (args.model is None, "MODEL", "give the .keras file of a keras-hub task"),
        (args.preprocessor, "--with-preprocessor", "leave one out"),
        (args.onnx_path is not None, f"FILE.onnx {args.onnx_path}", "leave it out"),
        (args.output == "", "-o ''", "an empty path: give a folder"),
        *_export_flags_given(args, TOKENIZER_FLAGS),
    ]
    for given, flag, what in refused:
        if given:
            raise UsageError(f"{flag}: not taken with --tokenizer-only; {what}")
    default = args.model.with_name(f"{args.model.stem}_tokenizer")
    folder = Path(args.output) if args.output else default
    with StageDisplay(console, quiet=args.quiet) as display, command_line_wording(FLAGS, FIXES):
        display.print(
            f"[bold]Writing the tokenizer of[/] {escape(str(args.model))} -> {escape(str(folder))}"
        )
        start = time.perf_counter()
        model = loading.load(args.model, imports=args.imports, unsafe=args.unsafe).model
        preprocessor = getattr(model, "preprocessor", None)
        if preprocessor is None:
            raise UsageError(
                f"MODEL {args.model}: {type(model).__name__} was saved without a keras-hub "
                "preprocessor, so it holds no tokenizer; save the task with its preprocessor "
                "(task.save keeps it), or call export_tokenizer(tokenizer, folder) on the tokenizer"
            )
        rows = embedding_rows(model)
        if rows is not None:  # before any file: ids past the rows are not the model's
            check_ids_fit(preprocessor, rows, f"MODEL {args.model}")
        written = export_tokenizer(preprocessor, folder)
    return written.report(), time.perf_counter() - start


def _print_tokenizer(report: dict, seconds: float, verbose: bool, console) -> None:
    """The identity table and the files placed."""
    from rich.markup import escape

    from keras_layers.export.display import render_tokenizer

    del verbose
    render_tokenizer({"tokenizer": report}, console)
    console.print(
        f"[green]passed[/]: {escape(report['family'])} tokenizer files "
        f"({', '.join(report['files'])}) in {escape(report['folder'])} ({seconds:.1f} s)"
    )


def _check_only(args, demo_dir: Path, console) -> tuple[dict, float]:
    """`--check-only`: check FILE.onnx against MODEL (`checking.validate`);
    returns the report and the seconds the check took."""
    from rich.markup import escape

    from keras_layers.export.checking import validate
    from keras_layers.export.display import StageDisplay
    from keras_layers.export.errors import UsageError, command_line_wording
    from keras_layers.export.genai_folder import refuse_folder_options

    del demo_dir
    refused = [
        (args.output is not None, f"-o {args.output}", "it writes no ONNX file; leave -o out"),
        (args.quantize is not None, f"--quantize {args.quantize}", "leave --quantize out"),
        (args.retrain, "--retrain", "leave --retrain out"),
        (args.parts, "--parts", "leave it out; check a part's file against that part's model"),
        (
            args.model is None or args.onnx_path is None,
            "FILE.onnx",
            "give MODEL.keras FILE.onnx",
        ),
    ]
    for given, flag, what in refused:
        if given:
            raise UsageError(f"{flag}: --check-only checks an existing file; {what}")
    with StageDisplay(console, quiet=args.quiet) as display, command_line_wording(FLAGS, FIXES):
        display.print(
            f"[bold]Checking[/] {escape(str(args.onnx_path))} against {escape(str(args.model))}"
        )
        start = time.perf_counter()
        options = _options(args)
        refuse_folder_options(options, args.task, None)  # it writes no folder
        report = validate(args.model, args.onnx_path, options, task=args.task, progress=display)
    return report, time.perf_counter() - start


def _folder_line(folder: dict) -> str:
    """The genai folder's checks on one line (rich markup)."""
    genai = folder["genai"]
    ran = "no genai (not installed)" if genai is None else f"onnxruntime-genai on {len(genai)}"
    return (
        f"[green]folder[/]: {ran} text prompts gives keras-hub's ids, Keras' greedy tokens and "
        f"keras-hub's text; generate() on {len(folder['generate'])} prompts, alone and batched"
    )


def _print_seq2seq(report: dict, seconds: float, console) -> None:
    """An encoder-decoder folder: each file's checks, the folder's proof, the
    quantized folder's gate (rich markup)."""
    from rich.markup import escape

    parts = (("encoder", "encoder"), ("decoder", "decoder steps"),
             ("cross", "first step's cross-attention projections"))  # fmt: skip
    for name, label in parts:
        part = report[name]
        console.print(
            f"[green]{label}[/]: {escape(part['onnx_path'])} matches Keras on "
            f"{len(part['checks'])} checks"
        )
    written = report["transformers"]
    if written["files"]:
        console.print(
            f"[green]optimum[/]: {', '.join(written['files'])} ({written['model_type']}) for "
            "ORTModelForSeq2SeqLM"
        )
    proof = report["generation"]
    rows = len(proof["ids"]["keras"])
    said = f"greedy tokens = keras-hub's on {rows} padded rows"
    if "text" in proof:
        said += f" and on {len(proof['text']['inputs'])} texts"
    console.print(f"[green]folder[/]: the files together match Keras' cached calls; {said}")
    genai = report.get("genai", {})
    if genai.get("written"):
        how = (
            "its greedy tokens = keras-hub's, run in onnxruntime-genai"
            if genai.get("proved_in_genai")
            else "not run: onnxruntime-genai is not installed (the genai extra)"
        )
        console.print(f"[green]genai[/]: {escape(report['folder'])}/genai/ (whisper), {how}")
    for kind, gate in report.get("quantized", {}).items():
        console.print(
            f"[green]{kind}[/]: {escape(report['folder'])}/{kind}/ greedy agreement "
            f"{gate['greedy_agreement']:.3f}, mean |log p change| "
            f"{gate['mean_abs_log_prob_change']:.4f} nats"
        )
    console.print(
        f"[green]passed[/]: {escape(report['folder'])} ({seconds:.1f} s). "
        f"Report: {escape(report['report_path'])}"
    )


def _print_passed(report: dict, seconds: float, verbose: bool, console) -> None:
    """The checks' table, the files written and (verbose) the fusions declined."""
    from rich.markup import escape

    from keras_layers.export.display import (
        int8_summary,
        render_quantized_folder,
        render_report,
        render_streamed,
    )

    if report.get("task") == "seq2seq-lm":
        _print_seq2seq(report, seconds, console)
        return
    if "parts" in report:
        for name, part in report["parts"].items():
            console.print(f"[bold]{escape(name)}[/]: {escape(part['what'])}")
            _print_passed(part, sum(part["stage_seconds"].values()), verbose, console)
        console.print(f"Report of the parts: {escape(report['report_path'])}")
        return
    if "streamed" in report:
        render_streamed(report, console)
        console.print(
            f"[green]passed[/]: {escape(report['onnx_path'])}, the gate against Keras on the "
            f"same weights passed ({seconds:.1f} s). Report: {escape(report['report_path'])}"
        )
        return
    render_report(report, console)
    written = report.get("report_path")
    console.print(
        f"[green]passed[/]: {escape(report['onnx_path'])} matches Keras on "
        f"{len(report['checks'])} checks ({seconds:.1f} s). "
        + (f"Report: {escape(written)}" if written else "No file was written.")
    )
    if "folder" in report:
        console.print(_folder_line(report["folder"]))
        render_quantized_folder(report, console)
    if "int8" in report and report["int8"]["onnx_path"] is None:
        console.print(
            f"[yellow]int8 not kept[/]: slower than float32 ({int8_summary(report['int8'])})"
        )
    elif "int8" in report:
        console.print(
            f"[green]int8[/]: {escape(report['int8']['onnx_path'])} "
            f"({int8_summary(report['int8'])})"
        )
    if verbose and "graph" in report:
        for fusion, reasons in report["graph"]["declined"].items():
            for reason, count in reasons.items():
                console.print(f"not fused ({fusion}) x{count}: {escape(reason)}")


def main(argv=None, prog: str | None = None, demo_dir: Path | None = None) -> int:
    """Parse `argv`, export, print; returns the exit code.

    Args:
        argv: the arguments (default `sys.argv[1:]`).
        prog: the command's name for `--help` (default: how it was invoked).
        demo_dir: where the demo's files go (default `default_demo_dir()`).

    Returns:
        `EXIT_OK`, or the exit code of what went wrong (the module docstring
        lists them).
    """
    demo_dir = demo_dir or default_demo_dir()
    args = parser(prog or os.path.basename(sys.argv[0]), demo_dir).parse_args(argv)
    missing = _missing_path(args)
    if missing:  # said before TensorFlow is imported (10 s)
        print(f"error: {missing}", file=sys.stderr)
        return EXIT_USAGE
    _quiet_libraries(args.verbose)
    from rich.console import Console
    from rich.markup import escape

    from keras_layers.export.display import (
        render_int8_failure,
        render_report,
        render_streamed,
        render_tokenizer,
    )
    from keras_layers.export.errors import ExportError, one_line

    console = Console(stderr=False, highlight=False)
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        command = _command(args)
        report, seconds = command(args, demo_dir, console)
        if not args.quiet:
            printer = _print_tokenizer if command is _tokenizer_only else _print_passed
            printer(report, seconds, args.verbose, console)
        if args.unsafe:
            err.print("[yellow]warning:[/] loaded with --unsafe (Lambda code allowed)")
        return EXIT_OK
    except ExportError as error:
        folder_report = getattr(error, "report", None) and error.report.get("task") == "seq2seq-lm"
        if getattr(error, "report", None) and not args.quiet and not folder_report:
            render = render_tokenizer if "tokenizer" in error.report else render_report
            render = render_streamed if "streamed" in error.report else render
            render(error.report, console)
            int8 = error.report.get("int8")
            if int8 and not int8["passed"]:
                render_int8_failure(int8, console)
        if args.verbose:
            traceback.print_exc()
        err.print(f"[red]error:[/] {escape(one_line(str(error)))}")
        return error.exit_code
    except KeyboardInterrupt:
        err.print(
            "interrupted; the output paths hold the files they had before, or the "
            "complete new export, never a mix"
        )
        return EXIT_INTERRUPTED
    except Exception as error:  # noqa: BLE001 - last resort: one line, exit 3
        if args.verbose:
            traceback.print_exc()
        err.print(
            f"[red]internal error:[/] {escape(one_line(f'{type(error).__name__}: {error}'))} "
            "(rerun with --verbose for the traceback, and please report it)"
        )
        return EXIT_INTERNAL


def run(argv=None, prog: str | None = None, demo_dir: Path | None = None) -> int:
    """The commands' entry point: set up the process, then `main`.

    Args:
        argv: the arguments (default `sys.argv[1:]`).
        prog: the command's name in usage lines.
        demo_dir: where the demo's files go (default `default_demo_dir()`).

    Returns:
        The exit code.
    """
    argv = sys.argv[1:] if argv is None else argv
    startup.prepare_process(argv)
    return main(argv, prog=prog, demo_dir=demo_dir)


if __name__ == "__main__":
    sys.exit(run())
