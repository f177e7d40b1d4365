"""What the command prints: every figure whole at 80 columns, every result the
report holds that the user asked for (#45, 13)."""

import io

import pytest
from rich.console import Console

from keras_layers.export.cli import _print_passed

pytestmark = pytest.mark.tensorflow_only  # the display imports the pipeline's events

LABELS = [
    "prompt 4x9",
    "decode steps 1-20 (4x10 to 4x29)",
    "greedy 1x(7)+20, right-padded with attention_mask",
    "greedy 4x(5,9,2,12)+20, left-padded with attention_mask",
]
FIGURES = ["3.35e-08", "2.18e-04", "1.22e-03", "8.63e-04"]


def _check(label: str, figure: str) -> dict:
    return {
        "shape": label,
        "output": "greedy tokens" if "greedy" in label else "logits",
        "max_abs_diff": float(figure),
        "max_rel_diff": float(figure),
        "top1_agreement": 1.0,
        "passed": True,
        "problem": None,
    }


def _folder_report() -> dict:
    """A causal-LM folder export's report, as `export_folder` returns it."""
    gate = {
        "quantized": 13,
        "passed": True,
        "greedy_agreement": 0.7916666666666667,
        "genai_agreement": 0.7916666666666667,
        "mean_abs_log_prob_change": 0.0024562835365554096,
        "failure": "",
        "file_bytes": 59316,
    }
    return {
        "checks": [_check(label, figure) for label, figure in zip(LABELS, FIGURES, strict=True)],
        "tolerances": {"atol": 1e-4, "rtol": 1e-5},
        "file_bytes": 60000,
        "param_bytes": 54000,
        "size_ratio": 1.1082,
        "opset": 18,
        "graph": {"nodes_final": 109, "nodes_converted": 490, "declined": {}},
        "onnx_path": "gpt2/model.onnx",
        "report_path": "gpt2/report.json",
        "folder": {"genai": [1, 2], "generate": [1, 2], "quantized": {"int4": gate}},
    }


def _printed(report: dict, width: int = 80) -> str:
    out = io.StringIO()
    _print_passed(report, 1.0, False, Console(file=out, width=width, color_system=None))
    return out.getvalue()


def test_the_checks_table_keeps_every_figure_whole_at_80_columns():
    text = _printed(_folder_report())
    table = text.split("┗")[0] if "┗" in text else text.split("└")[0]
    assert all(len(line) <= 80 for line in table.splitlines()), table
    for figure in FIGURES:
        assert figure in table, (figure, table)
    # A label folds at its spaces, never in the middle of a word.
    assert "attention_ma…" not in table and "attention_mask" in table


def test_a_quantized_folders_gate_is_printed():
    text = " ".join(_printed(_folder_report()).split())
    assert "int4: 13 products in MatMulNBits" in text
    assert "greedy agreement 0.792 (genai 0.792)" in text
    assert "mean |log p change| 0.0025 nats/token" in text
