"""Export every keras-hub text model of the zoo tier and tabulate what happened.

    python benchmarks/zoo.py                 # every model: results/zoo.json and the page's table
    python benchmarks/zoo.py --only A B      # rerun models A and B, merged into results/zoo.json
    python benchmarks/zoo.py --table         # only re-render docs/models.md from the JSON
    python benchmarks/zoo.py --check         # exit 1 if the page's table differs from the JSON

The models are those of tests/zoo_models.py (the zoo tests import the same
module): every backbone and text task of `keras_hub.models`, built tiny with
redrawn weights. Each is exported with the default flags, as a user would run
it; the row records the exit status the command line would give (0 passed, 1
`ValidationFailed`, 2 another `ExportError`, 3 anything else: an internal
error), the worst difference on the validation grid and on an independent
right-padded feed, the file's size over the parameter bytes, the node counts
(tf2onnx's graph, and ours after slimming), the fused ops and the export time.
Each causal LM is also exported as the onnxruntime-genai folder (`--task
causal-lm -o FOLDER/`, prompts of ids): the genai column says on how many
prompts genai gave Keras' greedy tokens alone and in one padded batch, and
whether the folder shares one cache buffer (`GroupQueryAttention`), or why it
was not exported. Each `Seq2SeqLM` is also exported as an encoder-decoder
folder (`--task seq2seq-lm -o FOLDER/`): the seq2seq column says whether its
proof passed (the decoder's steps against Keras' cached calls, the two files
together, greedy tokens against keras-hub's `generate_step`), or why not.

The table between `<!-- table: zoo -->` and `<!-- /table -->` on
docs/models.md is rendered from results/zoo.json alone, so
tests/test_zoo.py can check the page against the JSON without TensorFlow
running anything. Reading the JSON must stay light: this module imports
nothing heavy at import time.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # zoo_models lives with the tests that use it

import zoo_models  # noqa: E402

from benchmarks.docs_tables import (  # noqa: E402
    markdown_table,
    page_tables,
    rewrite,
    zoo_tokenizer_cells,
)
from benchmarks.results_io import RESULTS  # noqa: E402

PAGE = ROOT / "docs" / "models.md"
RESULT = RESULTS / "zoo.json"
TABLE = "zoo"
# The status of a class the text rule hands on: tests/test_zoo_vision.py and
# benchmarks/zoo_vision.py export it (never a skip: its row is in that table).
VISION_ZOO = "in the vision zoo"
FUSED_LABELS = {
    "LayerNormalization": "LN",
    "MatMul": "MatMul",
    "MultiHeadAttention": "MHA",
    "SimplifiedLayerNormalization": "RMSNorm",
    "RotaryEmbedding": "RoPE",
}


def _exit_code(error: BaseException | None) -> int:
    """The command line's exit status for this outcome (keras_layers.export.cli)."""
    from keras_layers.export import ExportError

    if error is None:
        return 0
    return error.exit_code if isinstance(error, ExportError) else 3


def _one_line(error: BaseException) -> str:
    from keras_layers.export.errors import one_line

    return one_line(f"{type(error).__name__}: {error}", limit=300)


def _from_report(row: dict, report: dict) -> None:
    diffs = [check["max_abs_diff"] for check in report["checks"]]
    graph = report["graph"]
    row.update(
        max_abs_diff=max(diffs) if diffs else None,
        file_bytes=report["file_bytes"],
        param_bytes=report["param_bytes"],
        size_ratio=report["size_ratio"],
        nodes_converted=graph["nodes_converted"],
        nodes_final=graph["nodes_final"],
        fused={op: count for op, count in graph["fused"].items() if count},
        declined=graph.get("declined", {}),
        stage_seconds=report["stage_seconds"],
    )


def run_model(entry, folder: Path) -> dict:
    """Build, export and check one model; every outcome is a row, never a crash."""

    row = {
        "name": entry.name,
        "kind": entry.kind,
        "backbone": entry.backbone,
        "status": None,
        "exit_code": None,
        "error": None,
        "unsupported": zoo_models.UNSUPPORTED.get(entry.name),
    }
    if entry.skip_reason:
        return {**row, "status": VISION_ZOO, "error": entry.skip_reason}
    try:
        model = zoo_models.build(entry.name)
    except zoo_models.NotATextModel as error:
        return {**row, "status": VISION_ZOO, "error": str(error)}
    except Exception as error:  # a zoo limitation, not the pipeline's: say so
        return {**row, "status": "not built", "error": _one_line(error)}
    output = folder / f"{entry.name}.onnx"
    error, _report = export_row(model, output, row)
    if entry.name.endswith("CausalLM"):
        row["genai"] = genai_folder(model, folder / f"{entry.name}_folder")
    if entry.name.endswith("Seq2SeqLM"):
        row["seq2seq"] = seq2seq_folder(model, folder / f"{entry.name}_seq2seq")
    if error is None:
        try:
            feed = zoo_models.padded_feed(model, width=zoo_models.FEED_WIDTH.get(entry.name))
            differences = zoo_models.parity(model, output, feed)
            row["feed_max_abs_diff"] = max(differences.values())
            if row["feed_max_abs_diff"] > zoo_models.FEED_ATOL:
                row["status"] = "feed mismatch"
        except Exception as caught:
            row["status"] = "feed mismatch"
            row["error"] = _one_line(caught)
    return row


def export_row(model, output: Path, row: dict, flags: dict | None = None) -> tuple:
    """Export `model` to `output` with the default flags (or `flags`, the
    `ExportOptions` fields a model needs) and fill `row`: the export time,
    the exit status, the status, the error and what the report says.
    Returns `(error or None, report or None)`."""
    from keras_layers.export import ExportOptions, ValidationFailed, export_model

    start = time.perf_counter()
    try:
        report = export_model(model, output, ExportOptions(**(flags or {})))
        error = None
    except Exception as caught:
        error = caught
        report = caught.report if isinstance(caught, ValidationFailed) else None
    row["export_seconds"] = round(time.perf_counter() - start, 2)
    row["exit_code"] = _exit_code(error)
    row["status"] = "passed" if error is None else type(error).__name__
    if error is not None:
        row["error"] = _one_line(error)
    if report is not None:
        _from_report(row, report)
    return error, report


def genai_folder(model, folder: Path) -> dict:
    """A causal LM exported as the onnxruntime-genai folder (`--task causal-lm
    -o FOLDER/`, prompts of ids): what the export's proof found in genai.

    Args:
        model: the causal LM.
        folder: the folder to write.

    Returns:
        `passed`, the prompts genai gave Keras' tokens alone and batched (of
        how many), whether the config shares the cache buffer (then genai
        also ran without), the `GroupQueryAttention` count, or the error.
    """
    from keras_layers.export import ExportOptions, ValidationFailed, export_model

    # The zoo's models have no tokenizer: the end id is any (0, as the folders
    # had before one was asked for), and their 32 positions the context.
    settings = ExportOptions(end_token_id=0, context_length=32)
    try:
        report = export_model(model, f"{folder}/", settings, task="causal-lm")
    except Exception as caught:
        found = {"passed": False, "error": _one_line(caught)}
        report = caught.report if isinstance(caught, ValidationFailed) else None
        if report is None or "folder" not in report:
            return found
    else:
        found = {"passed": True, "error": None}
    proof = report["folder"]
    rows, batched = proof.get("genai") or [], proof.get("genai_batched") or []
    return found | {
        "alone": [sum(row["tokens_equal"] for row in rows), len(rows)],
        "batched": [sum(row["batched_equal"] for row in batched), len(batched)],
        "shared_buffer": bool(proof["config"]["search"]["past_present_share_buffer"]),
        "group_query_attention": report["graph"]["fused"].get("GroupQueryAttention", 0),
        "not_checked": proof.get("not_checked", []),
    }


def seq2seq_folder(model, folder: Path) -> dict:
    """A `Seq2SeqLM` exported as an encoder-decoder folder (`--task
    seq2seq-lm -o FOLDER/`): what its proof found.

    Args:
        model: the encoder-decoder.
        folder: the folder to write.

    Returns:
        `passed`, the decoder's worst logit difference over its steps, the
        greedy tokens' agreement (rows equal, of how many), or the error.
    """
    from keras_layers.export import ValidationFailed, export_model

    start = time.perf_counter()
    try:
        report = export_model(model, f"{folder}/", task="seq2seq-lm")
    except Exception as caught:
        found = {"passed": False, "exit_code": _exit_code(caught), "error": _one_line(caught)}
        report = caught.report if isinstance(caught, ValidationFailed) else None
        if report is None or "generation" not in report:
            return found
    else:
        found = {"passed": True, "exit_code": 0, "error": None}
    ids, genai = report["generation"]["ids"], report["generation"].get("genai")
    found |= {
        "seconds": round(time.perf_counter() - start, 1),
        "decoder_max_abs_diff": max(c["max_abs_diff"] for c in report["decoder"]["checks"]),
        "greedy_rows": [_rows_equal(ids), len(ids["keras"])],
        "new_tokens": ids["new_tokens"],
        "reference": ids["reference"],
    }
    if genai is not None:  # onnxruntime-genai ran the folder's genai/ files
        found["genai_rows"] = [_rows_equal(genai), len(genai["keras"])]
    return found


def _rows_equal(ids: dict) -> int:
    return sum(k == o for k, o in zip(ids["keras"], ids["onnx"], strict=True))


def _seq2seq_cell(row: dict) -> str:
    """The seq2seq column: the folder's proof, or why it was not exported."""
    found = row.get("seq2seq")
    if not found:
        return ""
    if "greedy_rows" not in found:
        why = found["error"].split("--task seq2seq-lm: ", 1)[-1].removeprefix("UsageError: ")
        return f"not exported (exit {found['exit_code']}): {why}"[:200].replace("|", "/")
    equal, rows = found["greedy_rows"]
    reference = found.get("reference", "keras-hub's generate_step")
    cell = (
        f"decoder steps max abs diff {found['decoder_max_abs_diff']:.1e}, "
        f"greedy {equal}/{rows} rows x {found['new_tokens']} tokens = {reference}"
    )
    if "genai_rows" in found:
        cell += ", in onnxruntime-genai {}/{} rows".format(*found["genai_rows"])
    return cell if found["passed"] else f"failed: {cell}"


def _genai_cell(row: dict) -> str:
    """The genai column: prompts equal alone and batched, the shared buffer."""
    genai = row.get("genai")
    if not genai:
        return ""
    if "alone" not in genai:  # the reason, after the protocol the refusal names
        why = genai["error"].split("head size)); ", 1)[-1].split(". Export a keras-hub")[0]
        return f"not exported (exit 2): {why}"[:160].replace("|", "/")
    (alone, of), (batched, together) = genai["alone"], genai["batched"]
    parts = [f"{alone}/{of} alone", f"{batched}/{together} batched" if together else "lockstep"]
    parts.append("shared buffer" if genai["shared_buffer"] else "own cache per step")
    return ("" if genai["passed"] else "failed: ") + ", ".join(parts)


def run(names: list | None = None) -> list:
    return run_entries(zoo_models.enumerate_zoo(), run_model, names, "the zoo")


def run_entries(entries: list, run_one, names: list | None, what: str) -> list:
    """`run_one(entry, folder)` for each of `entries` (those in `names`, when
    given), a line printed for each; shared with benchmarks/zoo_vision.py.

    Raises:
        SystemExit: a name is not among the entries (`what` names them).
    """
    if names:
        unknown = sorted(set(names) - {entry.name for entry in entries})
        if unknown:
            raise SystemExit(f"not in {what}: {', '.join(unknown)}")
        entries = [entry for entry in entries if entry.name in names]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for number, entry in enumerate(entries, 1):
            row = run_one(entry, Path(folder))
            rows.append(row)
            seconds = row.get("export_seconds")
            print(
                f"[{number}/{len(entries)}] {entry.name}: {row['status']}"
                + (f" ({seconds:.1f} s)" if seconds is not None else "")
                + (f" - {row['error']}" if row["error"] and row["status"] != VISION_ZOO else ""),
                flush=True,
            )
    return rows


def _versions() -> dict:
    from importlib import metadata

    return {name: metadata.version(name) for name in ("keras", "keras-hub", "tensorflow")}


def save(rows: list, merge: bool) -> dict:
    """Write results/zoo.json; with `merge`, `rows` replace their namesakes."""
    return save_rows(rows, merge, RESULT, "python benchmarks/zoo.py", zoo_models.FEED_ATOL)


def save_rows(rows: list, merge: bool, result: Path, command: str, feed_atol: float) -> dict:
    """Write `result`; with `merge`, `rows` replace their namesakes in it."""
    import os
    import platform

    if merge and result.exists():
        previous = json.loads(result.read_text())
        fresh = {row["name"]: row for row in rows}
        rows = [fresh.pop(row["name"], row) for row in previous["models"]] + list(fresh.values())
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "command": command,
        "versions": _versions(),
        "feed_atol": feed_atol,
        "models": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    result.write_text(json.dumps(report, indent=2) + "\n")
    return report


# --- the page's table ---------------------------------------------------------


def _number(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def _result(row: dict) -> str:
    if row["status"] == "passed":
        return "passed"
    if row["exit_code"] is None:
        return row["status"]
    return f"exit {row['exit_code']}: {row['status']}"


def _note(row: dict) -> str:
    note = row["unsupported"] or (row["error"] if row["status"] != "passed" else "") or ""
    return note.replace("|", "\\|")


def zoo_table(report: dict) -> str:
    """The text models' rows, then the classes the rule hands to the vision zoo, with why."""
    header = [
        "model",
        "kind",
        "result",
        "grid max abs diff",
        "padded feed max abs diff",
        "file / parameter bytes",
        "nodes (tf2onnx)",
        "nodes (ours)",
        "fused",
        "export s",
        "tokenizer",
        "onnxruntime-genai folder",
        "seq2seq-lm folder",
        "note",
    ]
    # The tokenizer column joins results/tokenizers.json (benchmarks/tokenizer_speed.py).
    tokenizers = zoo_tokenizer_cells()
    tested = [row for row in report["models"] if row["status"] != VISION_ZOO]
    rows = [
        [
            f"`{row['name']}`",
            row["kind"],
            _result(row),
            _number(row.get("max_abs_diff"), ".1e"),
            _number(row.get("feed_max_abs_diff"), ".1e"),
            _number(row.get("size_ratio"), ".3f"),
            _number(row.get("nodes_converted"), "d"),
            _number(row.get("nodes_final"), "d"),
            ", ".join(
                f"{FUSED_LABELS.get(op, op)} {count}" for op, count in row.get("fused", {}).items()
            ),
            _number(row.get("export_seconds"), ".1f"),
            tokenizers.get(row["name"], ""),
            _genai_cell(row),
            _seq2seq_cell(row),
            _note(row),
        ]
        for row in tested
    ]
    aligned = [False] * 3 + [True] * 5 + [False, True, False, False, False, False]
    table = markdown_table(header, aligned, rows)
    handed = [row for row in report["models"] if row["status"] == VISION_ZOO]
    lines = [f"- `{row['name']}`: {row['error']}" for row in handed]
    unfused, rotations = (_declined(tested, op) for op in ("MultiHeadAttention", "RotaryEmbedding"))
    # (no trailing newline: the page's markers hold the body stripped of it)
    return "\n".join(
        [
            table,
            "",
            *(
                [
                    "Softmaxes not fused into attention, with the reason the report's"
                    f" `graph.declined` gives ({len(unfused)} models). Every softmax is a"
                    " candidate: a mixture-of-experts router's (Mixtral, Qwen MoE, Qwen 3"
                    " MoE, GPT-OSS) is no attention, and its reason is that its"
                    " probabilities weigh no values:",
                    "",
                    *unfused,
                    "",
                ]
                if unfused
                else []
            ),
            *(
                [
                    "Rotations of queries and keys not fused into `RotaryEmbedding`, with"
                    f" the reason ({len(rotations)} models):",
                    "",
                    *rotations,
                    "",
                ]
                if rotations
                else []
            ),
            f"Not text models, by the rule: exported by the vision zoo, each with its row in"
            f" the next section's table ({len(handed)} classes):",
            "",
            *lines,
        ]
    ).rstrip("\n")


def _declined(rows: list, op: str) -> list:
    """A line for each model whose candidates for fusion `op` were left alone, with why."""
    return [
        f"- `{row['name']}`: "
        + "; ".join(f"{reason} (x{count})" for reason, count in reasons.items())
        for row in rows
        if (reasons := row.get("declined", {}).get(op))
    ]


def render(report: dict) -> str:
    return zoo_table(report)


def page_table(text: str | None = None) -> str | None:
    """The body between the page's zoo markers (None when there are none)."""
    return page_tables(PAGE.read_text() if text is None else text).get(TABLE)


def write_page(report: dict) -> bool:
    """Rewrite the page's zoo table; True when it changed."""
    text = PAGE.read_text()
    if page_table(text) is None:
        raise SystemExit(f"{PAGE}: no `<!-- table: {TABLE} -->` ... `<!-- /table -->` markers")
    rendered = render(report)
    if page_table(text) == rendered:
        return False
    PAGE.write_text(rewrite(text, {**page_tables(text), TABLE: rendered}))
    return True


def summary(report: dict) -> dict:
    """Models per result, for the command's last line and the docs' text."""
    counts = {}
    for row in report["models"]:
        counts[_result(row)] = counts.get(_result(row), 0) + 1
    return counts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="rerun these, merged")
    parser.add_argument("--table", action="store_true", help="only re-render the page's table")
    parser.add_argument("--check", action="store_true", help="exit 1 if the page's table differs")
    args = parser.parse_args(argv)
    if args.check:
        same = page_table() == render(json.loads(RESULT.read_text()))
        print("the zoo table is up to date" if same else f"{PAGE.name}: zoo table differs")
        return 0 if same else 1
    if args.table:
        report = json.loads(RESULT.read_text())
    else:
        report = save(run(args.only), merge=bool(args.only))
        print(f"wrote {RESULT}")
    changed = write_page(report)
    print(f"rewrote the zoo table of {PAGE}" if changed else "the zoo table is up to date")
    print(json.dumps(summary(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
