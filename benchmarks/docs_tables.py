"""Render the tables of docs/performance.md and docs/generation.md from the benchmark results.

    python benchmarks/docs_tables.py            # rewrite the page's tables in place
    python benchmarks/docs_tables.py --check    # exit 1, naming each table that differs

The page's numbers used to be copied by hand from benchmarks/results/*.json, and
a hand copy drifts: a number mistyped, or a new run saved without the page
updated. Each table now sits between `<!-- table: NAME -->` and `<!-- /table -->`
and is rewritten from the JSON, and tests/test_docs_tables.py fails while the
page and the JSON disagree. NAME is `<results file stem>.<table>`: the part
before the dot names the JSON file the table is read from.

Only what the JSON does not hold is written here: the page's row labels where
they differ from the JSON's keys, and the targets of the ratio table. The text
around the tables (including the numbers it quotes) is the author's, untouched.
Reading the results must not start TensorFlow, so only benchmark modules that
import nothing heavy at import time are used (see `scaling_by_length_table`).
"""

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# export_bench and results_io import only the standard library at import time.
from benchmarks.export_bench import ratios  # noqa: E402
from benchmarks.results_io import RESULTS  # noqa: E402

PAGE = ROOT / "docs" / "performance.md"
# Pages other than PAGE, by the results file their tables are read from.
PAGES_BY_STEM = {
    "generate": ROOT / "docs" / "generation.md",
    "genai": ROOT / "docs" / "generation.md",
    "seq2seq": ROOT / "docs" / "generation.md",
    "mutation": ROOT / "docs" / "conformance.md",
    "tokenizers": ROOT / "docs" / "tokenizers.md",
    "vision": ROOT / "docs" / "vision.md",
}
MARKED_TABLE = re.compile(
    r"^<!-- table: (?P<name>[\w.]+) -->\n(?P<body>.*?)^<!-- /table -->$", flags=re.S | re.M
)


def markdown_table(header: list, right_aligned: list, rows: list) -> str:
    """The table as the page writes it: `|---|` for text columns, `|---:|` for numbers.

    An empty cell is written `|  |`, every table alike.
    """
    align = "|" + "|".join("---:" if right else "---" for right in right_aligned) + "|"
    lines = ["| " + " | ".join(cells) + " |" for cells in [header, *rows]]
    return "\n".join([lines[0], align, *lines[1:]])


def _optional(value, spec: str) -> str:
    """`value` formatted, or an empty cell where the benchmark measured nothing (None)."""
    return "" if value is None else format(value, spec)


# --- export_bench.json -------------------------------------------------------

# The page's names for the exported files, where they say more than the JSON's keys.
FILE_LABELS = {
    "plain": "plain tf2onnx (`from_function`, as Keras' `model.export`)",
    "ours": "ours (float32)",
    "ours int8": "ours, `--quantize int8`",
}
# export_bench.py times only the quantization for the int8 file (it starts from
# our float32 file, in the benchmark's own process, so no peak RSS of its own).
EXPORT_TIME_NOTES = {"ours int8": " (quantize only)"}


def export_bench_files_table(report: dict) -> str:
    """Size, export cost and load time of each file of `export_bench.py`."""
    header = [
        "file",
        "MB",
        "x parameter bytes",
        "export s",
        "export peak RSS MB",
        "session load s",
    ]
    rows = [
        [
            FILE_LABELS.get(kind, kind),
            f"{row['file_bytes'] / 1e6:.2f}",
            f"{row['size_ratio']:.3f}",
            f"{row['seconds']:.1f}" + EXPORT_TIME_NOTES.get(kind, ""),
            _optional(row["peak_rss_mb"], ".0f"),
            f"{row['load_seconds']:.3f}",
        ]
        for kind, row in report["files"].items()
    ]
    return markdown_table(header, [False] + [True] * 5, rows)


# The page's names for the matmul bounds, which say which operands the bound
# feeds; the other paths appear under their JSON keys.
LATENCY_LABELS = {
    "matmul bound": "matmul bound (operands fed)",
    "matmul bound, prepacked": "matmul bound, weights prepacked",
    "int8 matmul bound, prepacked": "int8 matmul bound, weights prepacked",
    "int8 product bound (A pre-quantized)": "int8 product bound (activations pre-quantized)",
}


def export_bench_latency_table(report: dict) -> str:
    """Median and p90 milliseconds of every path at every shape, shapes side by side."""
    shapes = list(report["latency_ms"])
    header = ["path"] + [f"{shape} {stat}" for shape in shapes for stat in ("median", "p90")]
    paths = list(report["latency_ms"][shapes[0]])
    rows = []
    for path in paths:
        cells = [LATENCY_LABELS.get(path, path)]
        for shape in shapes:
            timing = report["latency_ms"][shape][path]
            cells += [f"{timing['median_ms']:.1f}", _optional(timing["p90_ms"], ".1f")]
        rows.append(cells)
    return markdown_table(header, [False] + [True] * (2 * len(shapes)), rows)


@dataclass(frozen=True)
class RatioRow:
    """One row of the ratio table: which ratio, and the target it is held to.

    `label` is the page's name, `key` the name `export_bench.ratios` gives it.
    `comparison` and `bound` are the performance issue's target (None: no
    target); `remark` follows the target on the page. `note` goes in the "met"
    column where the target is missed or there is none, to say what the ratio
    means instead.
    """

    label: str
    key: str
    comparison: str | None = None
    bound: float | None = None
    remark: str = ""
    note: str = ""

    def target(self) -> str:
        bound = f"{self.comparison} {self.bound:.2f}" if self.comparison else ""
        return " ".join(part for part in (bound, self.remark) if part)

    def met(self, value: float) -> str:
        if self.comparison is None:
            return self.note
        held = value <= self.bound if self.comparison == "<=" else value >= self.bound
        if held:
            return "yes"
        return "**no**" + (f": {self.note}" if self.note else "")


# The targets come from the performance issue, not from the JSON; the rows are
# the page's selection of `export_bench.ratios` (it leaves out the 1x128 int8 rows).
RATIO_ROWS = [
    RatioRow("export time ours/plain", "export time ours/plain", "<=", 0.50),
    RatioRow("export peak memory ours/plain", "export peak memory ours/plain", "<=", 0.50),
    RatioRow(
        "int8 file / float32 parameter bytes", "int8 file / float32 parameter bytes", "<=", 0.30
    ),
    RatioRow("1x128 ours / matmul bound", "1x128 ours / matmul bound", "<=", 1.10),
    RatioRow(
        "1x128 ours / matmul bound, prepacked",
        "1x128 ours / prepacked matmul bound",
        remark="(stricter bound, not a target)",
    ),
    RatioRow("1x128 XLA / ours (speed-up)", "1x128 XLA / ours (speed-up)", ">=", 1.30),
    RatioRow(
        "1x128 plain / ours (speed-up)",
        "1x128 plain / ours (speed-up)",
        ">=",
        1.00,
        remark="(no regression)",
    ),
    RatioRow("8x128 ours / matmul bound", "8x128 ours / matmul bound", "<=", 1.10),
    RatioRow(
        "8x128 ours / matmul bound, prepacked",
        "8x128 ours / prepacked matmul bound",
        remark="(stricter bound, not a target)",
    ),
    RatioRow("8x128 XLA / ours (speed-up)", "8x128 XLA / ours (speed-up)", ">=", 1.10),
    RatioRow(
        "8x128 plain / ours (speed-up)",
        "8x128 plain / ours (speed-up)",
        ">=",
        1.00,
        remark="(no regression)",
    ),
    RatioRow(
        "8x128 ours / int8 (speed-up)",
        "8x128 ours / int8 (speed-up)",
        ">=",
        1.70,
        note="at the ceiling below",
    ),
    RatioRow(
        "8x128 int8 matmul gain (prepacked / int8 bound)",
        "8x128 int8 matmul gain (prepacked bound / int8 bound)",
    ),
    RatioRow(
        "8x128 int8 ceiling, whole model",
        "8x128 int8 ceiling, whole model",
        note="the most this int8 can reach",
    ),
    RatioRow(
        "8x128 int8 ceiling, activations free to quantize",
        "8x128 int8 ceiling, activations free to quantize",
        note="the most any int8 can reach",
    ),
]


def export_bench_ratios_table(report: dict) -> str:
    """The ratios against the issue's targets, computed as `export_bench.py` computes them."""
    measured = ratios(report)
    rows = [
        [row.label, f"{measured[row.key]:.2f}", row.target(), row.met(measured[row.key])]
        for row in RATIO_ROWS
    ]
    return markdown_table(["ratio", "measured", "target", "met"], [False, True, True, False], rows)


# --- scaling.json -------------------------------------------------------------


def scaling_by_length_table(report: dict) -> str:
    """The sequence-length sweep.

    Cost per GFLOP is read as `scaling.relative_cost` stored it, not recomputed:
    importing benchmarks/scaling.py starts TensorFlow (it imports the demo
    encoder at module level).
    """
    header = ["sequence", "GFLOP", "median ms", "p90 ms", "ms per GFLOP", "cost/FLOP"]
    rows = [
        [
            str(row["length"]),
            f"{row['gflops']:.2f}",
            f"{row['median_ms']:.2f}",
            f"{row['p90_ms']:.2f}",
            f"{row['ms_per_gflop']:.1f}",
            f"{row['cost_per_flop_vs_first']:.2f}",
        ]
        for row in report["by_length"]
    ]
    return markdown_table(header, [True] * 6, rows)


def scaling_by_vocabulary_table(report: dict) -> str:
    """The vocabulary sweep, with each vocabulary's export (cost/FLOP as stored, as above)."""
    header = [
        "vocabulary",
        "GFLOP (1x128)",
        "median ms",
        "cost/FLOP",
        "export s",
        "export peak RSS MB",
        "file / parameter bytes",
    ]
    rows = [
        [
            f"{row['vocabulary']:,}",
            f"{row['gflops']:.2f}",
            f"{row['median_ms']:.2f}",
            f"{row['cost_per_flop_vs_first']:.2f}",
            f"{row['export_seconds']:.1f}",
            f"{row['export_peak_rss_mb']:.0f}",
            f"{row['size_ratio']:.3f}",
        ]
        for row in report["by_vocabulary"]
    ]
    return markdown_table(header, [True] * 7, rows)


# --- layers.json --------------------------------------------------------------


def layers_peers_table(report: dict) -> str:
    """Each layer against its peer (the ratio is the one layers.py stored per row)."""
    header = ["layer", "peer", "mode", "ours", "peer", "ours / peer"]
    rows = [
        [
            row["layer"],
            row["peer"],
            row["mode"],
            f"{row['ours_ms']:.3f}",
            f"{row['peer_ms']:.3f}",
            f"{row['ratio']:.2f}",
        ]
        for row in report["rows"]
    ]
    return markdown_table(header, [False] * 3 + [True] * 3, rows)


# --- big_model.json ------------------------------------------------------------


def _fused_cell(fused: dict | None) -> str:
    """`MultiHeadAttention 7, MatMul 15`: the fused ops of one export."""
    return ", ".join(f"{op} {count}" for op, count in sorted((fused or {}).items())) or "none"


def _added(row: dict, key: str, digits: int) -> str:
    """`row[key]` with `digits` decimals, in two significant figures where
    those decimals would show only zeros; empty when absent."""
    value = row.get(key)
    if value is None:
        return ""
    return f"{value:.1e}" if 0 < abs(value) < 10**-digits else f"{value:.{digits}f}"


def big_model_sweep_table(report: dict) -> str:
    """Peak memory and time of each export of the size sweep, in all and over
    the tiny model's (the fixed cost), and the ops it fused."""
    rows = [
        [
            row["model"],
            f"{row['parameters'] / 1e6:,.0f}M",
            f"{row['param_gb']:.2f}",
            "data file" if row["external_data"] else "one file",
            f"{row['peak_rss_gb']:.2f}",
            f"{row['peak_over_params']:.2f}",
            _added(row, "added_peak_over_params", 2),
            f"{row['seconds']:.0f}",
            f"{row['seconds_per_gb']:.1f}",
            _added(row, "added_seconds_per_gb", 1),
            _fused_cell(row.get("fused")),
            {True: "passed", False: "failed"}.get(row["passed"], f"exit {row['exit_code']}"),
        ]
        for row in report["rows"]
    ]
    header = [
        "model",
        "parameters",
        "weights GB",
        "weights",
        "peak RSS GB",
        "peak / weights",
        "added peak / weights",
        "export s",
        "s per GB",
        "added s per GB",
        "fused",
        "validation",
    ]
    right = [False, True, True, False, True, True, True, True, True, True, False, False]
    return markdown_table(header, right, rows)


def _default_gate(row: dict) -> str:
    """What the decoder gate's default thresholds (`ExportOptions`: agreement
    0.5, 0.25 nats) say of a streamed row: the run's own verdict, or, when the
    run opened the gate, the figures judged against them."""
    if row["exit_code"] != 0:
        return f"exit {row['exit_code']}"
    if not row["gate_opened"]:
        return "passed (the run's own gate)"
    failed = []
    if row["greedy_agreement"] < 0.5:
        failed.append("agreement < 0.5")
    if row["mean_abs_log_prob_change"] > 0.25:
        failed.append("log p change > 0.25")
    return f"refuses: {', '.join(failed)}" if failed else "passes"


def big_model_streamed_table(report: dict) -> str:
    """The streamed int4 export of keras-hub Llamas saved in bfloat16: peak
    memory against the bfloat16 and float32 bytes, time, the folder's size
    and the gate's figures against Keras."""
    rows = [
        [
            row["model"],
            row["weights"],
            str(row["accuracy_level"]),
            f"{row['bf16_gb']:.2f}",
            f"{row['float32_gb']:.2f}",
            f"{row['peak_rss_gb']:.2f}",
            f"{row['peak_over_bf16']:.2f}",
            f"{row['seconds']:.0f}",
            f"{row['int4_folder_gb']:.2f}",
            str(row["quantized"]),
            _added(row, "greedy_agreement", 3),
            _added(row, "genai_agreement", 3),
            _added(row, "mean_abs_log_prob_change", 4),
            _default_gate(row),
        ]
        for row in report.get("streamed", [])
    ]
    header = [
        "model",
        "weights",
        "accuracy level",
        "bfloat16 GB",
        "float32 GB",
        "peak RSS GB",
        "peak / bfloat16",
        "export s",
        "int4 folder GB",
        "MatMulNBits",
        "greedy agreement",
        "genai agreement",
        "mean abs log p change",
        "default gate",
    ]
    right = [False, False] + [True] * 11 + [False]
    return markdown_table(header, right, rows)


# --- generate.json ---------------------------------------------------------------


def generate_speed_table(report: dict) -> str:
    """New tokens per second of each way to generate, and the ratios the targets name."""
    rows = []
    for entry in report["models"]:
        for row in entry["rows"]:
            same = row["same_tokens_as_keras_hub"]
            rows.append(
                [
                    f"{entry['model']} ({entry['parameters'] / 1e6:.1f}M)",
                    str(row["batch"]),
                    *(f"{row[name]['tokens_per_second']:,.0f}" for name in GENERATE_CANDIDATES),
                    f"{row['cache_over_recompute']:.1f}x",
                    f"{row['cache_over_keras_hub']:.1f}x",
                    "yes" if same["ort_cache"] and same["ort_recompute"] else "no",
                ]
            )
    header = [
        "model",
        "batch",
        "ORT, cache",
        "ORT, recompute",
        "keras-hub generate",
        "ORT int8, cache",
        "cache / recompute",
        "cache / keras-hub",
        "tokens = keras-hub's",
    ]
    return markdown_table(header, [False] + [True] * 7 + [False], rows)


GENERATE_CANDIDATES = ("ort_cache", "ort_recompute", "keras_hub", "int8_cache")


# --- seq2seq.json ------------------------------------------------------------------


def seq2seq_speed_table(report: dict) -> str:
    """Greedy generation of an encoder-decoder folder against keras-hub's, and
    the batch-1 bound that memory bandwidth sets."""
    rows = []
    for row in report["rows"]:
        floor = report["models"][row["model"]]["floor"]
        bound = f"{floor['best_speedup_batch_1']:.2f}x" if row["batch"] == 1 else ""
        rows.append(
            [
                row["model"],
                str(row["batch"]),
                f"{row['ours']['ms']:,.0f}",
                f"{row['ours_opening']['ms']:,.0f}",
                f"{row['keras_hub']['ms']:,.0f}",
                f"{row['speedup']:.2f}x",
                bound,
                "yes" if row["same_tokens"] else "no",
                f"{row['ours_int8']['ms']:,.0f}",
                f"{row['ours_int8']['speedup']:.2f}x",
                f"{row['ours_int8']['rows_equal_to_keras_hub']}/{row['batch']}",
                *_optimum_cells(row.get("optimum")),
            ]
        )
    header = [
        "model",
        "batch",
        "ours ms",
        "ours ms, files opened in the call",
        "keras-hub XLA ms",
        "keras-hub / ours (target >= 3x)",
        "bound at float32",
        "same tokens",
        "int8 folder ms",
        "keras-hub / int8",
        "int8 rows = keras-hub's",
        "optimum ms",
        "ours / optimum (target <= 1.0)",
        "optimum's tokens = ours",
    ]
    aligned = [False] + [True] * 6 + [False] + [True] * 5 + [False]
    return markdown_table(header, aligned, rows)


def _optimum_cells(peer) -> list:
    """The optimum peer's cells: its time, our ratio and token agreement, or
    its error (not installed: the peers extra) across them."""
    if not peer:
        return ["not measured", "", ""]
    if "error" in peer:
        return [peer["error"], "", ""]
    same = "yes" if peer["same_tokens"] else "no"
    return [f"{peer['ms']:,.0f}", f"{peer['ours_over_optimum']:.2f}", same]


# --- real_models.json -------------------------------------------------------------

REAL_MODEL_LABELS = {"bert": "keras-hub BERT", "llama": "keras-hub Llama"}
# (ratio key of `real_models.ratios`, the page's column, the performance issue's
# target, whether it holds at every shape or only at the one named).
REAL_MODEL_TARGETS = [
    ("ours / pytorch + ort optimizer", "ours / PyTorch (<= 1.00)", 1.00, None),
    ("ours / keras export", "ours / Keras export (<= 0.90)", 0.90, None),
    ("ours / matmul bound", "ours / matmul bound (<= 1.10 BERT 8x128)", 1.10, ("bert", "8x128")),
]


def _fused_ops(fused: dict) -> str:
    return ", ".join(f"{op} {count}" for op, count in fused.items()) or "none"


def _against(value: float, target: float, applies: bool) -> str:
    """The ratio to 3 places (so that a miss by less than 0.005 shows), marked
    where it misses a target that applies to its row."""
    return f"{value:.3f}" + (" (miss)" if applies and value > target else "")


def real_models_latency_table(report: dict) -> str:
    """Median milliseconds of the four exports and the bound, and the ratios the targets name."""
    names = [
        "ours",
        "ours, per-layer shapes",
        "keras export",
        "plain tf2onnx",
        "pytorch + ort optimizer",
        "matmul bound",
    ]
    rows = []
    for kind, entry in report["models"].items():
        for shape, timing in entry["latency"].items():
            ratios = entry["ratios"][shape]
            cells = [REAL_MODEL_LABELS[kind], shape.replace("x", " x ")]
            cells += [f"{timing['ms'][name]['median_ms']:.2f}" for name in names]
            for key, _, target, only in REAL_MODEL_TARGETS:
                cells.append(_against(ratios[key], target, only in (None, (kind, shape))))
            cost = entry["cost_per_flop_vs_shortest"].get(shape, {}).get("ours")
            cells.append(_optional(cost, ".2f"))
            rows.append(cells)
    header = [
        "model",
        "batch x sequence",
        "ours ms",
        "ours, per-layer shapes ms",
        "Keras export ms",
        "plain tf2onnx ms",
        "PyTorch + ORT optimizer ms",
        "matmul bound ms",
        *(column for _, column, _, _ in REAL_MODEL_TARGETS),
        "ours, cost per FLOP vs 1 x 128",
    ]
    return markdown_table(header, [False, False] + [True] * (len(header) - 2), rows)


def real_models_files_table(report: dict) -> str:
    """Each file's node count, fused ops, export time and agreement with the PyTorch file."""
    rows = []
    for kind, entry in report["models"].items():
        for name, row in entry["files"].items():
            rows.append(
                [
                    REAL_MODEL_LABELS[kind],
                    name,
                    str(row["nodes"]),
                    _fused_ops(row["fused"]),
                    f"{row['export_seconds']:.1f}",
                    f"{row['max_abs_vs_pytorch_file']:.1e}",
                ]
            )
        rows.append(
            [
                REAL_MODEL_LABELS[kind],
                "ours, then ONNX Runtime's optimizer: what it adds",
                "",
                _fused_ops(entry["ort_optimizer_adds_to_ours"]),
                "",
                "",
            ]
        )
    header = ["model", "file", "nodes", "fused ops", "export s", "max abs diff vs PyTorch file"]
    return markdown_table(header, [False, False, True, False, True, True], rows)


def real_models_skip_norms_table(report: dict) -> str:
    """8 residual Adds each with the norm after it, against the fused skip norms."""
    rows = []
    for shape, row in report["skip_norms"]["ms"].items():
        fused_ops = [name for name in row if not name.startswith("Add + ")]
        for fused in fused_ops:
            separate = "Add + " + fused.removeprefix("Skip")
            rows.append(
                [
                    shape.replace("x", " x "),
                    f"`{separate}` -> `{fused}`",
                    f"{row[separate]:.3f}",
                    f"{row[fused]:.3f}",
                    f"{row[fused] / row[separate]:.2f}",
                ]
            )
    header = ["batch x sequence", "fusion", "separate ms", "fused ms", "fused / separate"]
    return markdown_table(header, [False, False, True, True, True], rows)


def real_models_profile_table(report: dict) -> str:
    """Milliseconds per run by kind of op, from ONNX Runtime's profiler."""
    rows, kinds = [], None
    for kind, entry in report["models"].items():
        profile = entry["profile"]
        for name, by_kind in profile["ms_by_kind"].items():
            kinds = list(by_kind)
            total = sum(by_kind.values())
            rows.append(
                [
                    REAL_MODEL_LABELS[kind],
                    profile["shape"].replace("x", " x "),
                    name,
                    f"{total:.1f}",
                    *(f"{by_kind[k]:.1f} ({by_kind[k] / total:.0%})" for k in kinds),
                ]
            )
    header = ["model", "batch x sequence", "file", "all ops ms", *(f"{k} ms" for k in kinds)]
    return markdown_table(header, [False, False, False] + [True] * (len(kinds) + 1), rows)


# --- attention_forms.json -----------------------------------------------------------


def attention_forms_speed_table(report: dict) -> str:
    """Each model's export with one fusion against the same without it."""
    rows = []
    for label, entry in report["models"].items():
        nodes = entry["nodes"]
        for shape, row in entry["latency"].items():
            rows.append(
                [
                    label,
                    entry["form"],
                    f"{entry['fused_ops']} {entry['op']}",
                    f"{nodes['unfused']} -> {nodes['fused']}",
                    shape.replace("x", " x "),
                    f"{row['ms']['unfused']:.2f}",
                    f"{row['ms']['fused']:.2f}",
                    f"{row['fused_over_unfused']:.2f}",
                ]
            )
    header = [
        "model",
        "form",
        "fused",
        "nodes",
        "batch x sequence",
        "unfused ms",
        "fused ms",
        "fused / unfused",
    ]
    return markdown_table(header, [False, False, True, True, False, True, True, True], rows)


# --- cached_attention.json ---------------------------------------------------------


def cached_attention_speed_table(report: dict) -> str:
    """A cached decoder generating: traced, `MultiHeadAttention`, `GroupQueryAttention`."""
    rows = []
    for label, entry in report["models"].items():
        for shape, row in entry["latency"].items():
            rows.append(
                [
                    label,
                    shape.replace("x", " x "),
                    str(entry["new_tokens"]),
                    *(f"{row['ms'][name]:.1f}" for name in ("traced", "mha", "gqa")),
                    f"{row['over_traced']['mha']:.2f}",
                    f"{row['over_traced']['gqa']:.2f}",
                ]
            )
    header = ["model", "batch x prompt", "new tokens", "traced ms", "MHA ms", "GQA ms"]
    header += ["MHA / traced", "GQA / traced"]
    return markdown_table(header, [False, False, True, True, True, True, True, True], rows)


# --- genai.json ---------------------------------------------------------------------

GENAI_LABELS = {
    "genai_fp32": "our folder in genai, fp32",
    "genai_fp32_all_cores": "the same, genai on all cores",
    "genai_int8": "our folder in genai, int8",
    "genai_int4": "our folder in genai, int4",
    "ours_generate": "our file through generate()",
    "keras_hub": "keras-hub generate (compiled)",
    "builder": "genai's model builder folder, fp32",
}


def _genai_row(entry: dict, row: dict, name: str) -> list:
    result = row.get(name, {})
    where = [entry["model"], str(row["batch"]), GENAI_LABELS[name]]
    if "tokens_per_second" not in result:
        why = str(result.get("error", "not run")).split("Error: ")[-1].replace("|", "/")
        return where + ["-"] * 5 + [why[:90]]
    size = entry["files"].get(name, {}).get("model_bytes", 0) / 1e6
    rss = entry["peak_rss_mb"].get(name)
    same = result.get("same_tokens_as_keras_hub")
    return where + [
        f"{result['tokens_per_second']:,.0f}",
        f"{result['tokens_per_second'] / row['keras_hub']['tokens_per_second']:.2f}x",
        f"{result['first_token_ms']:.1f}",
        f"{rss:.0f}" if isinstance(rss, float) else "-",
        f"{size:.1f}" if size else "-",
        "-" if name == "keras_hub" else ("yes" if same else "no"),
    ]


def genai_speed_table(report: dict) -> str:
    """Tokens per second in onnxruntime-genai and beside it, each candidate at each point."""
    rows = [
        _genai_row(entry, row, name)
        for entry in report["models"]
        for row in entry["rows"]
        for name in GENAI_LABELS
        if name in row or name in report["candidates"]
    ]
    header = ["model", "batch", "candidate", "new tokens/s", "x keras-hub", "first token ms"]
    header += ["peak RSS MB", "model MB", "tokens = keras-hub's"]
    return markdown_table(header, [False, True, False, True, True, True, True, True, False], rows)


# --- rule_engines.json -------------------------------------------------------------


def rule_engines_speed_table(report: dict) -> str:
    """The RMS norm rule written with our helper and with onnxscript's rewriter."""
    row = report["rms_norm"]
    rows = [
        [name, str(row["fused"][name]), f"{row['ms'][name]:.1f}"] for name in ("ours", "onnxscript")
    ]
    header = ["rule written with", "norms fused", "ms per pass"]
    return markdown_table(header, [False, True, True], rows)


# --- mutation.json ------------------------------------------------------------------


def _kill_rate(killed: int, applied: int) -> str:
    return f"{killed / applied:.0%}" if applied else ""


def _mutation_counts(report: dict) -> tuple[dict, dict]:
    """Per model and per mutation: mutants applied, killed, and the survivors' other side."""
    models, mutations = {}, {m["name"]: [0, 0, []] for m in report["mutations"]}
    for row in report["models"]:
        counts = models.setdefault(row["name"], [0, 0, []])
        for name, result in row.get("mutants", {}).items():
            if result["outcome"] == "not applicable":
                continue
            for entry, other in ((counts, name), (mutations[name], row["name"])):
                entry[0] += 1
                if result["outcome"] == "killed":
                    entry[1] += 1
                else:
                    entry[2].append(f"`{other}`")
    return models, mutations


def mutation_models_table(report: dict) -> str:
    """Kill rate per model: of the mutants that apply to its export, how many validation fails."""
    models, _ = _mutation_counts(report)
    rows = []
    for row in report["models"]:
        if row["status"] != "exported":
            rows.append([f"`{row['name']}`", "", "", "", row["status"]])
            continue
        applied, killed, survivors = models[row["name"]]
        rows.append(
            [
                f"`{row['name']}`",
                str(applied),
                str(killed),
                _kill_rate(killed, applied),
                ", ".join(survivors),
            ]
        )
    header = ["model", "mutants", "killed", "kill rate", "survived"]
    return markdown_table(header, [False, True, True, True, False], rows)


def mutation_mutations_table(report: dict) -> str:
    """Kill rate per mutation, over the models it applies to."""
    _, mutations = _mutation_counts(report)
    rows = [
        [
            f"`{name}`",
            str(applied),
            str(killed),
            _kill_rate(killed, applied),
            ", ".join(survivors),
        ]
        for name, (applied, killed, survivors) in mutations.items()
    ]
    header = ["mutation", "models it applies to", "killed", "kill rate", "survived in"]
    return markdown_table(header, [False, True, True, True, False], rows)


def conformance_table(report: dict) -> str:
    """The conformance set: each public example model, whether its default
    export passed, what fused, and the mutants validation failed."""
    models, _ = _mutation_counts(report)
    rows = []
    for row in report["models"]:
        if not row["name"].startswith("conformance/"):
            continue
        applied, killed, _ = models.get(row["name"], (0, 0, []))
        fused = ", ".join(f"{op} {count}" for op, count in sorted((row.get("fused") or {}).items()))
        passed = row["status"] == "exported" and row["baseline"]["problem"] is None
        rows.append(
            [
                f"`{row['name'].split('/', 1)[1]}`",
                row["description"].removeprefix("conformance: "),
                "pass" if passed else row["status"],
                fused or "none",
                f"{killed} of {applied}",
            ]
        )
    header = ["model", "source", "default export", "fused", "mutants failed"]
    return markdown_table(header, [False, False, False, False, True], rows)


# --- tokenizers.json ---------------------------------------------------------------

TOKENIZER_READERS = ("tokenizers", "onnxruntime-extensions")
TOKENIZER_ENGINES = ("keras-hub", "tokenizers", "ort-extensions pp_api", "onnxruntime graph")


def _prose_cell(text: str) -> str:
    """Message text safe in a table cell: no column break, no HTML tag (`<s>`), and
    no emphasis outside its `code` spans (which are kept as they are)."""
    parts = text.replace("|", "\\|").split("`")
    for index in range(0, len(parts), 2):  # outside the code spans
        for raw, escaped in (("<", "&lt;"), ("_", "\\_"), ("*", "\\*")):
            parts[index] = parts[index].replace(raw, escaped)
    return "`".join(parts)


def _tokenizer_outcome(row: dict, reader: str) -> str:
    """One reader's identity for one class: identical, the differences and how many
    the known gaps explain, or refused."""
    if row.get("refused"):
        return "refused"
    result = row["readers"][reader]
    if result["error"]:
        return "not loaded"
    if result["identical"]:
        return "identical"
    if result["measured_only"]:
        return f"{result['differences']} of {result['compared']} differ (other algorithm)"
    explained = result["explained_by_known_gaps"]
    return f"{result['differences']} of {result['compared']} differ, {explained} by known gaps"


def tokenizers_identity_table(report: dict) -> str:
    """Every zoo tokenizer class: family, each reader's identity, the ONNX graph's ids."""
    rows = []
    for row in report["tokenizers"]:
        graph = row.get("graph_same")
        rows.append(
            [
                f"`{row['name']}`",
                row["family"],
                *(_tokenizer_outcome(row, reader) for reader in TOKENIZER_READERS),
                "" if graph is None else f"{graph} of {report['corpus_texts']}",
                str(len(row["models"])),
            ]
        )
    header = ["class", "family", *TOKENIZER_READERS, "onnxruntime graph, same ids", "zoo models"]
    return markdown_table(header, [False] * 5 + [True], rows)


def tokenizers_speed_table(report: dict) -> str:
    """Strings per second per engine and batch, and each engine over keras-hub."""
    rows = []
    for row in report["tokenizers"]:
        for batch, timing in row.get("speed", {}).items():
            rates, ratios = timing["strings_per_s"], timing["vs_keras_hub"]
            cells = [_optional(rates.get(name), ",.0f") for name in TOKENIZER_ENGINES]
            cells += [_optional(ratios.get(name), ".1f") for name in TOKENIZER_ENGINES[1:]]
            rows.append([f"`{row['name']}`", batch, *cells])
    header = [
        "class",
        "batch",
        *(f"{name} strings/s" for name in TOKENIZER_ENGINES),
        *(f"{name} / keras-hub" for name in TOKENIZER_ENGINES[1:]),
    ]
    return markdown_table(header, [False] + [True] * 8, rows)


def tokenizers_gaps_table(report: dict) -> str:
    """Each known gap, by reader: the families and how many classes it is listed for."""
    gaps = {}
    for row in report["tokenizers"]:
        for reader, result in (row.get("readers") or {}).items():
            for gap in result["known_gaps"]:
                families, classes = gaps.setdefault((reader, gap), (set(), []))
                families.add(row["family"])
                classes.append(row["name"])
    rows = [
        [reader, _prose_cell(gap), ", ".join(sorted(families)), str(len(classes))]
        for (reader, gap), (families, classes) in sorted(gaps.items())
    ]
    header = ["reader", "known gap", "families", "classes"]
    return markdown_table(header, [False] * 3 + [True], rows)


def tokenizers_refused_table(report: dict) -> str:
    """The classes export_tokenizer refuses, with its message and the zoo models they serve."""
    rows = [
        [
            f"`{row['name']}`",
            row["family"],
            _prose_cell(row["refused"]),
            ", ".join(f"`{model}`" for model in row["models"]),
        ]
        for row in report["tokenizers"]
        if row.get("refused")
    ]
    return markdown_table(
        ["class", "family", "export_tokenizer says", "zoo models"], [False] * 4, rows
    )


def _reader_word(result: dict) -> str:
    if result["identical"]:
        return "identical"
    return "other algorithm" if result["measured_only"] else "known gaps"


def zoo_tokenizer_cells(results: Path = RESULTS) -> dict:
    """Zoo model class -> the tokenizer column of the zoo table (docs/models.md,
    rendered by benchmarks/zoo.py): its tokenizer class and each reader's
    identity (identical / known gaps / refused), joined by the model classes
    each tokenizers.json row serves. Empty without tokenizers.json."""
    path = results / "tokenizers.json"
    if not path.exists():
        return {}
    short = {"tokenizers": "tokenizers", "onnxruntime-extensions": "ort-extensions"}
    cells = {}
    for row in json.loads(path.read_text())["tokenizers"]:
        if row.get("refused"):
            cell = f"`{row['name']}` refused"
        else:
            words = (f"{short[n]} {_reader_word(r)}" for n, r in row["readers"].items())
            cell = f"`{row['name']}`: " + ", ".join(words)
        for model in row["models"]:
            cells[model] = "; ".join([*filter(None, [cells.get(model)]), cell])
    return cells


# --- vision.json -------------------------------------------------------------------

VISION_LABELS = {
    "ours": "ours",
    "keras_export": "Keras export",
    "tf2onnx": "plain tf2onnx",
    "xla": "XLA (no file)",
}
# (peer, the page's column, the bound on ours / peer)
VISION_SPEED_TARGETS = [("keras_export", "Keras export", 0.90), ("xla", "XLA", 0.90)]


def _vision_error(entry: dict) -> str:
    """The last clause of an error (ONNX Runtime's "No Op registered for
    ..."), safe in a cell: the whole message is in the JSON."""
    return _prose_cell(entry["error"].rsplit("Error ", 1)[-1].strip()[:120])


def vision_speed_table(report: dict) -> str:
    """Median milliseconds of every contender at every batch, and ours over the peers."""
    rows = []
    for row in report["rows"]:
        cells = [row["model"], str(row["batch"])]
        cells += [
            f"{row[name]['ms']:.1f}" if "ms" in row[name] else "error"
            for name in ("ours", "keras_export", "tf2onnx", "xla")
        ]
        for peer, _, bound in VISION_SPEED_TARGETS:
            ratio = row["ratios"][f"ours / {peer}"]
            cells.append("" if ratio is None else _against(ratio, bound, True))
        rows.append(cells)
    header = ["model", "batch", "ours ms", "Keras export ms", "plain tf2onnx ms", "XLA ms"]
    header += [f"ours / {label} (<= {bound:.2f})" for _, label, bound in VISION_SPEED_TARGETS]
    return markdown_table(header, [False] + [True] * 7, rows)


def vision_files_table(report: dict) -> str:
    """Each file: size against the parameters, nodes, Transposes, most common
    ops, export time, agreement with Keras, and whether ONNX Runtime runs it."""
    rows = []
    for model, files in report["files"].items():
        first = next(row for row in report["rows"] if row["model"] == model)
        differences = report["max_abs_diff_vs_keras"][model]
        for name in (*files, "xla"):
            facts = files.get(name, {})
            runs = _vision_error(first[name]) if "error" in first[name] else "yes"
            difference = differences.get(name)
            if "bytes" not in facts:
                rows.append([model, VISION_LABELS[name], *[""] * 6, runs, ""])
                continue
            rows.append(
                [
                    model,
                    VISION_LABELS[name],
                    f"{facts['bytes'] / 1e6:.1f}",
                    f"{facts['bytes_over_parameters']:.3f}",
                    str(facts["nodes"]),
                    str(facts["transposes"]),
                    ", ".join(f"{op} {n}" for op, n in list(facts["op_counts"].items())[:5]),
                    f"{facts['export_seconds']:.1f}",
                    runs,
                    _optional(difference, ".1e"),
                ]
            )
        rows[-1][-1] = _optional(differences.get("xla"), ".1e")
    header = ["model", "contender", "MB", "file / parameter bytes", "nodes", "Transposes"]
    header += ["most common ops", "export s", "runs in ONNX Runtime", "max abs diff vs Keras"]
    right = [False, False, True, True, True, True, False, True, False, True]
    return markdown_table(header, right, rows)


def vision_export_table(report: dict) -> str:
    """Our export's time and peak memory (its child process's VmHWM), against the weights."""
    rows = []
    for model, export in report["export"].items():
        weights = report["parameters_bytes"][model]
        if "error" in export:
            rows.append([model, f"{weights / 1e6:.1f}", *[""] * 7, _vision_error(export)])
            continue
        after = export.get("peak_rss_bytes_after_stage", {})
        converted = after.get("slim")
        validated = after.get("validate")
        rows.append(
            [
                model,
                f"{weights / 1e6:.1f}",
                f"{export['seconds']:.1f}",
                f"{export['built_rss_bytes'] / 1e6:,.0f}",
                f"{export['peak_rss_bytes'] / 1e6:,.0f}",
                f"{export['added_rss_bytes'] / 1e6:,.0f}",
                _optional(converted and (converted - export["built_rss_bytes"]) / 1e6, ",.0f"),
                _optional(validated and converted and (validated - converted) / 1e6, ",.0f"),
                _against(export["added_rss_bytes"] / weights, 2.5, True),
                f"{export['peak_rss_bytes'] / weights:.2f}",
            ]
        )
    header = ["model", "weights MB", "export s", "RSS before the export MB"]
    header += ["peak RSS MB", "added by the export MB", "of which to the slimmed file MB"]
    header += ["of which by validation MB", "added / weights (<= 2.5)", "peak / weights"]
    return markdown_table(header, [False] + [True] * 9, rows)


def vision_targets_table(report: dict) -> str:
    """Every target of the issue at every point, as the benchmark judged it."""
    rows = []
    for check in report["targets"]["checks"]:
        if check["met"] is None:
            met, measured = f"not measured: {_vision_error({'error': check['why']})}", ""
        else:
            met, measured = ("yes" if check["met"] else "**no**"), f"{check['ratio']:.3f}"
        batch = "" if check["batch"] is None else str(check["batch"])
        floor = _optional(check.get("multiply_add_floor"), ".3f")
        rows.append(
            [check["target"], check["model"], batch, measured, floor]
            + [f"{check['at_most']:.2f}", met]
        )
    header = ["target", "model", "batch", "measured", "Conv/MatMul kernels alone"]
    header += ["at most", "met"]
    return markdown_table(header, [False, False, True, True, True, True, False], rows)


def sequence_loops_table(report: dict) -> str:
    """Qwen3.5 and RWKV-7 at width 512: our file's proof, Keras' own export,
    and milliseconds of our file against the Keras model, shape by shape."""
    rows = []
    for row in report["rows"]:
        exports = report["exports"][row["model"]]
        ours, peer = exports["ours"], exports["keras_export"]
        ours_ms, keras_ms = row["ours"]["ms"], row["keras"]["ms"]
        rows.append(
            [
                f"`{row['model']}`",
                f"{row['batch']}x{row['length']}",
                f"passed, worst {ours['worst_abs_diff']:.1e}" if ours["passed"] else "failed",
                peer.get("error", "").split(":")[0] or "exported",
                f"{ours_ms:.1f}",
                f"{keras_ms:.1f}",
                f"{keras_ms / ours_ms:.1f}",
            ]
        )
    header = ["model", "shape", "our file's proof", "Keras' own export"]
    header += ["ours ms", "Keras ms", "Keras / ours"]
    return markdown_table(header, [False, False, False, False, True, True, True], rows)


VISION_TABLES: dict[str, Callable[[dict], str]] = {
    "vision.speed": vision_speed_table,
    "vision.files": vision_files_table,
    "vision.export": vision_export_table,
    "vision.targets": vision_targets_table,
}

TOKENIZER_TABLES: dict[str, Callable[[dict], str]] = {
    "tokenizers.identity": tokenizers_identity_table,
    "tokenizers.speed": tokenizers_speed_table,
    "tokenizers.gaps": tokenizers_gaps_table,
    "tokenizers.refused": tokenizers_refused_table,
}


MUTATION_TABLES: dict[str, Callable[[dict], str]] = {
    "mutation.conformance": conformance_table,
    "mutation.models": mutation_models_table,
    "mutation.mutations": mutation_mutations_table,
}


TABLES: dict[str, Callable[[dict], str]] = {
    "export_bench.files": export_bench_files_table,
    "export_bench.latency": export_bench_latency_table,
    "export_bench.ratios": export_bench_ratios_table,
    "scaling.by_length": scaling_by_length_table,
    "scaling.by_vocabulary": scaling_by_vocabulary_table,
    "layers.peers": layers_peers_table,
    "big_model.sweep": big_model_sweep_table,
    "big_model.streamed": big_model_streamed_table,
    "generate.speed": generate_speed_table,
    "real_models.latency": real_models_latency_table,
    "real_models.files": real_models_files_table,
    "real_models.skip_norms": real_models_skip_norms_table,
    "real_models.profile": real_models_profile_table,
    "attention_forms.speed": attention_forms_speed_table,
    "rule_engines.speed": rule_engines_speed_table,
    "cached_attention.speed": cached_attention_speed_table,
    "genai.speed": genai_speed_table,
    "seq2seq.speed": seq2seq_speed_table,
    "sequence_loops.speed": sequence_loops_table,
}


def page_of(name: str) -> Path:
    """The page a table is on: PAGE unless its results file has a page of its own."""
    return PAGES_BY_STEM.get(name.split(".")[0], PAGE)


def pages() -> list:
    return [PAGE, *PAGES_BY_STEM.values()]


TABLES.update(MUTATION_TABLES)
TABLES.update(TOKENIZER_TABLES)
TABLES.update(VISION_TABLES)


def render_tables(results: Path = RESULTS) -> dict:
    """Every table of the page, rendered from the JSON files in `results`."""
    reports = {}
    tables = {}
    for name, render in TABLES.items():
        stem = name.split(".")[0]
        if stem not in reports:
            reports[stem] = json.loads((results / f"{stem}.json").read_text())
        tables[name] = render(reports[stem])
    return tables


def page_tables(text: str) -> dict:
    """The text between each pair of markers of the page, by table name."""
    return {match["name"]: match["body"].rstrip("\n") for match in MARKED_TABLE.finditer(text)}


def unmarked_table_lines(text: str) -> list:
    """Line numbers of table lines (starting with `|`) outside the markers of a known table."""
    spans = [
        (text.count("\n", 0, match.start()), text.count("\n", 0, match.end()))
        for match in MARKED_TABLE.finditer(text)
        if match["name"] in TABLES
    ]
    return [
        number + 1
        for number, line in enumerate(text.splitlines())
        if line.lstrip().startswith("|")
        and not any(first <= number <= last for first, last in spans)
    ]


def rewrite(text: str, tables: dict) -> str:
    """`text` with the body of every marked table replaced by `tables[name]`."""

    def replace(match):
        name = match["name"]
        return f"<!-- table: {name} -->\n{tables[name]}\n<!-- /table -->"

    return MARKED_TABLE.sub(replace, text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if any table differs"
    )
    args = parser.parse_args(argv)
    tables = render_tables()
    problems, differing = [], []
    for page in pages():
        text = page.read_text()
        on_page = page_tables(text)
        names = [name for name in TABLES if page_of(name) == page]
        problems += [f"unknown table on {page.name}: {n}" for n in on_page if n not in names]
        problems += [f"table missing from {page.name}: {n}" for n in names if n not in on_page]
        problems += [
            f"table line outside markers: {page.name}:{line}" for line in unmarked_table_lines(text)
        ]
        changed = [name for name in names if name in on_page and on_page[name] != tables[name]]
        differing += changed
        if changed and not args.check and not problems:
            page.write_text(rewrite(text, tables))
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    if args.check:
        for name in differing:
            print(f"{name}: differs from benchmarks/results/{name.split('.')[0]}.json")
        return 1 if differing else 0
    print(f"rewrote {', '.join(differing)}" if differing else "every table is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
