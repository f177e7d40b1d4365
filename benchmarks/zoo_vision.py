"""Export every keras-hub image, audio, video and multimodal model and tabulate what happened.

    python benchmarks/zoo_vision.py               # every model: results/zoo_vision.json, the table
    python benchmarks/zoo_vision.py --only A B    # rerun models A and B, merged into the JSON
    python benchmarks/zoo_vision.py --table       # only re-render docs/models.md from the JSON
    python benchmarks/zoo_vision.py --check       # exit 1 if the page's table differs from the JSON

The models are those of tests/zoo_vision.py (tests/test_zoo_vision.py imports
the same module): every backbone the text zoo skips (no vocabulary, a
pre-built sub-model, or a float input) and every task on one, built tiny with
redrawn weights, composites from tiny parts. Each is exported with the default
flags, as a user would run it; the row records the exit status the command
line would give (0 passed, 1 `ValidationFailed`, 2 another `ExportError`, 3
anything else: an internal error), the roles the export gave the inputs, the
worst difference on the validation grid and on an independent feed
(`zoo_vision.media_feed`: three rows at sizes the grid did not choose), the
file's size over the parameter bytes, the node counts, the fused ops and the
export time; for a composite `keras_layers.export.parts` splits, the export
with `--parts` too, each part's file checked on its own independent feed.

The table between `<!-- table: zoo_vision -->` and `<!-- /table -->` on
docs/models.md is rendered from results/zoo_vision.json alone. Reading the
JSON must stay light: this module imports nothing heavy at import time.
"""

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # zoo_vision lives with the tests that use it

import zoo_vision  # noqa: E402

from benchmarks import zoo  # noqa: E402
from benchmarks.docs_tables import markdown_table, page_tables, rewrite  # noqa: E402
from benchmarks.results_io import RESULTS  # noqa: E402

PAGE = zoo.PAGE
RESULT = RESULTS / "zoo_vision.json"
TABLE = "zoo_vision"


def _roles(report: dict) -> str:
    """`name: role (axes)` for each input, as the report gives them."""
    return ", ".join(
        f"{entry['name']}: {entry.get('role', '?')}" for entry in report.get("inputs", [])
    )


def run_model(entry, folder: Path) -> dict:
    """Build, export and check one model; every outcome is a row, never a crash."""

    row = {
        "name": entry.name,
        "kind": entry.kind,
        "backbone": entry.backbone,
        "text_rule": entry.text_rule,
        "status": None,
        "exit_code": None,
        "error": None,
    }
    try:
        model = zoo_vision.build(entry.name)
    except zoo_vision.NotBuilt as error:
        return {**row, "status": "not built", "error": str(error)}
    except Exception as error:  # a zoo limitation, not the pipeline's: say so
        return {**row, "status": "not built", "error": zoo._one_line(error)}
    row["modality"] = zoo_vision.modality(model)
    row["parameters"] = int(model.count_params())
    output = folder / f"{entry.name}.onnx"
    flags, why = zoo_vision.FLAGS.get(entry.name, ({}, ""))
    if flags:
        row["flags"], row["flags_reason"] = flags, why
    error, report = zoo.export_row(model, output, row, flags)
    if report is not None:
        row["roles"] = _roles(report)
    if error is None:
        try:
            differences = zoo_vision.parity(model, output, zoo_vision.media_feed(model, entry.name))
            row["feed_max_abs_diff"] = max(differences.values())
            if not row["feed_max_abs_diff"] <= zoo_vision.FEED_ATOL:
                row["status"] = "feed mismatch"
        except Exception as caught:
            row["status"] = "feed mismatch"
            row["error"] = zoo._one_line(caught)
    if entry.name in zoo_vision.PARTS:
        row["parts"] = _parts_row(model, folder / f"{entry.name}.parts", entry.name)
    if _generates(model):  # speech and image to text
        row["seq2seq"] = zoo.seq2seq_folder(model, folder / f"{entry.name}_seq2seq")
    return row


def _generates(model) -> bool:
    """A keras-hub `Seq2SeqLM`, or an encoder-decoder whose calls `--task
    seq2seq-lm` adapts itself (`WhisperBackbone`, which has no `generate`)."""
    import keras_hub

    from keras_layers.export import seq2seq

    return isinstance(model, keras_hub.models.Seq2SeqLM) or seq2seq.protocol(model) is not model


def _parts_row(model, folder: Path, name: str) -> dict:
    """The composite exported with `--parts`, each file checked on its own feed."""
    from keras_layers.export import ExportError

    try:
        exported = zoo_vision.export_parts(model, folder, name)
    except ExportError as error:
        return {"status": f"exit {error.exit_code}: {type(error).__name__}", "error": str(error)}
    worst = max(exported["feed"].values())
    passed = exported["report"]["passed"] and worst <= zoo_vision.FEED_ATOL
    return {
        "status": "passed" if passed else "feed mismatch",
        "names": list(exported["feed"]),
        "feed_max_abs_diff": worst,
    }


def _parts_cell(row: dict) -> str:
    parts = row.get("parts")
    if parts is None:
        return ""
    if "names" not in parts:
        return parts["status"]
    return f"{parts['status']}: {', '.join(parts['names'])} ({parts['feed_max_abs_diff']:.1e})"


def run(names: list | None = None) -> list:
    return zoo.run_entries(zoo_vision.enumerate_vision(), run_model, names, "the vision zoo")


def save(rows: list, merge: bool) -> dict:
    """Write results/zoo_vision.json; with `merge`, `rows` replace their namesakes."""
    command = "python benchmarks/zoo_vision.py"
    return zoo.save_rows(rows, merge, RESULT, command, zoo_vision.FEED_ATOL)


def render(report: dict) -> str:
    header = [
        "model",
        "kind",
        "modality",
        "result",
        "grid max abs diff",
        "independent feed max abs diff",
        "file / parameter bytes",
        "nodes (tf2onnx)",
        "nodes (ours)",
        "fused",
        "export s",
        "with --parts (independent feed max abs diff)",
        "seq2seq-lm folder",
        "note",
    ]
    rows = [
        [
            f"`{row['name']}`",
            row["kind"],
            row.get("modality", ""),
            zoo._result(row),
            zoo._number(row.get("max_abs_diff"), ".1e"),
            zoo._number(row.get("feed_max_abs_diff"), ".1e"),
            zoo._number(row.get("size_ratio"), ".3f"),
            zoo._number(row.get("nodes_converted"), "d"),
            zoo._number(row.get("nodes_final"), "d"),
            ", ".join(
                f"{zoo.FUSED_LABELS.get(op, op)} {count}"
                for op, count in row.get("fused", {}).items()
            ),
            zoo._number(row.get("export_seconds"), ".1f"),
            _parts_cell(row),
            zoo._seq2seq_cell(row),
            _note(row).replace("|", "\\|"),
        ]
        for row in report["models"]
    ]
    aligned = [False] * 4 + [True] * 5 + [False, True, False, False, False]
    return markdown_table(header, aligned, rows)


def _note(row: dict) -> str:
    """Why a model failed, or the flag it exported with."""
    if row["status"] != "passed":
        return row.get("error") or ""
    if row.get("flags"):
        shapes = ",".join(
            point if isinstance(point, str) else f"{point[0]}x{point[1]}"
            for point in row["flags"]["shapes"]
        )
        return f"with `--shapes {shapes}`: {row['flags_reason']}"
    return ""


def page_table(text: str | None = None) -> str | None:
    return page_tables(PAGE.read_text() if text is None else text).get(TABLE)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="rerun these, merged")
    parser.add_argument("--table", action="store_true", help="only re-render the page's table")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page's table differs")
    args = parser.parse_args(argv)
    # As the export command and the tests run TensorFlow (`export.startup`):
    # with its oneDNN kernels a convolution larger than its map returns an
    # empty map instead of failing, and the grid takes sides the file cannot
    # (VGG's 7x7 head at 24 pixels a side).
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    if args.check:
        same = page_table() == render(json.loads(RESULT.read_text()))
        print("the vision zoo table is up to date" if same else f"{PAGE.name}: table differs")
        return 0 if same else 1
    report = json.loads(RESULT.read_text()) if args.table else save(run(args.only), bool(args.only))
    text = PAGE.read_text()
    if page_table(text) is None:
        raise SystemExit(f"{PAGE}: no `<!-- table: {TABLE} -->` ... `<!-- /table -->` markers")
    PAGE.write_text(rewrite(text, {**page_tables(text), TABLE: render(report)}))
    counts = {}
    for row in report["models"]:
        counts[zoo._result(row)] = counts.get(zoo._result(row), 0) + 1
    print(", ".join(f"{count} {result}" for result, count in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
