"""Command line of the export pipeline (`python export/to_onnx.py --help`).

A thin layer: it parses arguments, shows progress, and turns the pipeline's typed
errors into one line and an exit code: 0 every check passed, 1 validation failed,
2 bad input or usage, 3 an unexpected internal error, 130 interrupted.
"""

import argparse
import logging
import os
import sys
import time
import traceback
import warnings
from pathlib import Path

DEMO_MODEL = Path("artifacts/demo/demo_encoder.keras")
EXIT_OK, EXIT_INVALID, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


def _tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def parser() -> argparse.ArgumentParser:
    from export.converting import DEFAULT_OPSET
    from export.pipeline import EXTERNAL_DATA_CHOICES
    from export.validating import DEFAULT_ATOL, DEFAULT_RTOL

    p = argparse.ArgumentParser(
        prog="python export/to_onnx.py",
        description=(
            "Convert a Keras 3 .keras model to ONNX with tf2onnx, make the file lean, "
            "and prove in onnxruntime that it computes what Keras computes. Without "
            "MODEL, trains (once) and exports the demo encoder."
        ),
        epilog="Exit codes: 0 passed, 1 validation failed, 2 bad input, 3 internal error.",
    )
    p.add_argument(
        "model",
        nargs="?",
        type=Path,
        metavar="MODEL.keras",
        help=f"model to export (default: the demo, {DEMO_MODEL})",
    )
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        metavar="OUT.onnx",
        help="ONNX file to write (default: MODEL with .onnx)",
    )
    p.add_argument(
        "--report",
        type=Path,
        metavar="REPORT.json",
        help="JSON report path (default: OUT.report.json beside the output)",
    )
    p.add_argument(
        "--atol",
        type=_tolerance,
        default=DEFAULT_ATOL,
        help=f"absolute tolerance (default {DEFAULT_ATOL:g})",
    )
    p.add_argument(
        "--rtol",
        type=_tolerance,
        default=DEFAULT_RTOL,
        help=f"relative tolerance (default {DEFAULT_RTOL:g})",
    )
    p.add_argument(
        "--shapes",
        metavar="BxS,...",
        help="validation grid, e.g. 1x1,2x7,8x64,padded "
        "(default: batch 1,2,8 x seq 1,7,64,256, plus padded)",
    )
    p.add_argument(
        "--opset",
        type=int,
        default=DEFAULT_OPSET,
        help=f"ONNX opset (default {DEFAULT_OPSET})",
    )
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import a module that registers custom layers (repeatable)",
    )
    p.add_argument(
        "--unsafe",
        action="store_true",
        help="allow Lambda layers (runs code stored in the file: trusted files only)",
    )
    p.add_argument(
        "--external-data",
        choices=EXTERNAL_DATA_CHOICES,
        default="auto",
        help="store weights in OUT.onnx.data (auto: when over ~1.8 GB)",
    )
    p.add_argument(
        "--quantize",
        choices=["int8"],
        help="also write OUT.int8.onnx (dynamic int8), judged by top-1 agreement",
    )
    p.add_argument(
        "--retrain",
        action="store_true",
        help="retrain the demo even if a trained one exists",
    )
    p.add_argument("--verbose", action="store_true", help="show library logs and tracebacks")
    return p


def silence_native_stderr() -> None:
    """Send what native libraries write to descriptor 2 to /dev/null.

    For the script only (`export/to_onnx.py`), never for library users.
    """
    # TensorFlow's C++ runtime writes start-up lines (CUDA probing, CPU
    # features) straight to file descriptor 2, past any Python logging setting.
    # Point descriptor 2 at /dev/null and give Python's stderr a copy of the
    # real one, so only our own messages reach the terminal.
    real_stderr = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.stderr = os.fdopen(real_stderr, "w", buffering=1)


def _quiet_libraries(verbose: bool) -> None:
    if verbose:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    warnings.filterwarnings("ignore")
    for name in ("tf2onnx", "onnxslim", "absl", "tensorflow"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _demo(args, console) -> tuple[Path, dict]:
    from export import demo

    path = args.model or DEMO_MODEL
    metrics = None if args.retrain else demo.saved_metrics(path)
    if metrics is None:
        console.print(f"[bold]Training the demo encoder[/] -> {path}")
        start = time.perf_counter()
        metrics = demo.train(path, verbose=True)
        console.print(
            f"  trained in {time.perf_counter() - start:.1f} s; masked-token accuracy "
            f"on {metrics['held_out_sequences']} held-out sequences: "
            f"{metrics['masked_token_accuracy']:.1%}"
        )
    else:
        console.print(
            f"Reusing the trained demo {path} (masked-token accuracy "
            f"{metrics['masked_token_accuracy']:.1%}; --retrain to train again)"
        )
    if metrics["masked_token_accuracy"] < 0.9:
        console.print("[yellow]warning:[/] the demo is below its 90% accuracy target")
    return path, {"demo": {k: v for k, v in metrics.items() if k != "config"}}


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    _quiet_libraries(args.verbose)
    from rich.console import Console
    from rich.markup import escape

    console = Console(stderr=False, highlight=False)
    err = Console(stderr=True, highlight=False, soft_wrap=True)

    def progress(stage, seconds):
        if seconds is not None:
            console.print(f"  [green]✓[/] {stage:<9} {seconds:6.2f} s")

    from export.errors import ExportError, one_line
    from export.pipeline import export_model
    from export.reporting import render
    from export.validating import parse_shapes

    try:
        shapes = parse_shapes(args.shapes) if args.shapes else None
        extra, evaluate = None, None
        model = args.model
        if model is None:
            model, extra = _demo(args, console)
            from export.demo import int8_evaluation

            evaluate = int8_evaluation(model, extra["demo"]["masked_token_accuracy"])
        output = args.output or model.with_suffix(".onnx")
        console.print(f"[bold]Exporting[/] {model} -> {output}")
        start = time.perf_counter()
        report = export_model(
            model,
            output,
            report_path=args.report,
            shapes=shapes,
            atol=args.atol,
            rtol=args.rtol,
            opset=args.opset,
            imports=args.imports,
            unsafe=args.unsafe,
            external_data=args.external_data,
            quantize=args.quantize,
            evaluate=evaluate,
            progress=progress,
            extra_report=extra,
        )
        render(report, console)
        console.print(
            f"[green]passed[/]: {report['onnx_path']} matches Keras on "
            f"{len(report['checks'])} checks ({time.perf_counter() - start:.1f} s). "
            f"Report: {report['report_path']}"
        )
        if "int8" in report:
            int8 = report["int8"]
            console.print(
                f"[green]int8[/]: {int8['onnx_path']} ({int8['size_ratio']}x the float32 "
                f"parameter bytes); {int8['verdict']}"
            )
        if args.unsafe:
            err.print("[yellow]warning:[/] loaded with --unsafe (Lambda code allowed)")
        return EXIT_OK
    except ExportError as error:
        if getattr(error, "report", None):
            render(error.report, console)
        if args.verbose:
            traceback.print_exc()
        err.print(f"[red]error:[/] {escape(one_line(str(error)))}")
        return error.exit_code
    except KeyboardInterrupt:
        err.print("interrupted; the output path was left untouched")
        return 130
    except Exception as error:  # noqa: BLE001 - last resort: one line, exit 3
        if args.verbose:
            traceback.print_exc()
        err.print(
            f"[red]internal error:[/] {escape(one_line(f'{type(error).__name__}: {error}'))} "
            "(rerun with --verbose for the traceback, and please report it)"
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
