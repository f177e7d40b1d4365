"""The benchmark scripts run (a smoke test: no timing is asserted)."""

import json

import pytest

from benchmarks import layers

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow


def test_layers_benchmark_quick_mode_writes_every_row():
    rows = layers.main(["--quick"])
    assert {row["layer"] for row in rows} == {"embedding", "position encoding", "tied output"}
    assert {row["mode"] for row in rows} == {"eager", "tf.function"}
    for row in rows:
        assert row["ours_ms"] > 0 and row["peer_ms"] > 0
    written = json.loads((layers.RESULTS / "layers.quick.json").read_text())
    assert len(written["rows"]) == 6


def test_export_benchmark_quick_mode_reports_every_path():
    from benchmarks import export_bench

    report = export_bench.main(["--quick"])
    assert set(report["files"]) == {"plain", "ours", "ours int8"}
    (timing,) = report["latency_ms"].values()
    assert {
        "keras eager",
        "tf.function",
        "tf.function XLA",
        "ort plain",
        "ort ours",
        "ort ours int8",
        "matmul bound",
    } == set(timing)
    assert report["files"]["ours"]["size_ratio"] < report["files"]["plain"]["size_ratio"]
    assert (export_bench.RESULTS / "export_bench.quick.png").exists()
