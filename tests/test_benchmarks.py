"""The benchmark scripts run (a smoke test: no timing is asserted).

Each quick run exports and times models for tens of seconds, so they run as
a CI phase of their own (`-m benchmarks`, or `-m peers` for the one that
needs torch), keeping the default suite within its budget."""

import json

import pytest

from benchmarks import layers, results_io

# TensorFlow: the export pipeline runs on it.
pytestmark = [pytest.mark.tensorflow_only, pytest.mark.benchmarks]


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
        "matmul bound, prepacked",
        "int8 matmul bound, prepacked",
        "int8 product bound (A pre-quantized)",
    } == set(timing)
    assert report["files"]["ours"]["size_ratio"] < report["files"]["plain"]["size_ratio"]
    assert (results_io.RESULTS / "export_bench.quick.png").exists()


def test_scaling_benchmark_quick_mode_reports_both_sweeps():
    from benchmarks import scaling

    report = scaling.main(["--quick"])
    assert [row["length"] for row in report["by_length"]] == scaling.QUICK["lengths"]
    assert [row["vocabulary"] for row in report["by_vocabulary"]] == scaling.QUICK["vocabularies"]
    # FLOPs grow with both. Each row's cost per FLOP is its own milliseconds per
    # GFLOP over the first row's, recomputed here from the timings the row reports.
    for key in ("by_length", "by_vocabulary"):
        rows = report[key]
        assert rows[1]["gflops"] > rows[0]["gflops"]
        first_ms_per_gflop = rows[0]["median_ms"] / rows[0]["gflops"]
        for row in rows:
            expected = row["median_ms"] / row["gflops"] / first_ms_per_gflop
            assert row["cost_per_flop_vs_first"] == pytest.approx(expected, rel=1e-6), row
        assert all(row["median_ms"] > 0 for row in rows)
    assert all(row["size_ratio"] < 1.2 for row in report["by_vocabulary"])
    assert (results_io.RESULTS / "scaling.quick.png").exists()


def test_attention_forms_benchmark_quick_mode_fuses_and_agrees():
    """Gemma (grouped queries) and T5 (relative bias): every attention of the
    fused file is one op; Llama: every rotation of a query or key is one op.
    The unfused file differs, and both agree."""
    from benchmarks import attention_forms

    report = attention_forms.main(["--quick"])
    layers = attention_forms.QUICK_SIZES["num_layers"]
    # T5: self, decoder self, cross; Llama: the query and the key.
    expected = {"Gemma": layers, "T5": 3 * layers, "Llama": 2 * layers}
    assert set(report["models"]) == set(expected)
    for label, entry in report["models"].items():
        assert entry["fused_ops"] == expected[label], label
        assert entry["nodes"]["fused"] != entry["nodes"]["unfused"], label
        for row in entry["latency"].values():
            assert row["max_abs_difference"] <= attention_forms.AGREEMENT_ATOL, label
            assert row["ms"]["fused"] > 0 and row["ms"]["unfused"] > 0
    assert (results_io.RESULTS / "attention_forms.quick.png").exists()


def test_cached_attention_benchmark_quick_mode_times_the_three_files():
    """The three decoders generate the same tokens (the script exits
    otherwise), each fused one with one op per layer."""
    from benchmarks import cached_attention

    report = cached_attention.main(["--quick"])
    layers = cached_attention.QUICK_SIZES["num_layers"]
    assert set(report["models"]) == {"GPT-2", "Gemma"}
    for entry in report["models"].values():
        assert entry["fused_ops"] == {"mha": layers, "gqa": layers}
        for row in entry["latency"].values():
            assert all(row["ms"][name] > 0 for name in cached_attention.CANDIDATES)


def test_tokenizers_benchmark_quick_mode_checks_and_times_one_class_per_family():
    """One tokenizer class per family: exported and checked (every difference
    explained by a known gap, or the class refused), and every engine timed."""
    from benchmarks import tokenizer_speed as tokenizers

    zoo_tokenizers = tokenizers.zoo_tokenizers
    report = tokenizers.main(["--quick"])
    rows = {row["name"]: row for row in report["tokenizers"]}
    assert set(rows) == set(zoo_tokenizers.representatives().values())
    for name, row in rows.items():
        if row["refused"]:
            assert name in zoo_tokenizers.REFUSED and name in row["refused"]
            continue
        for reader, result in row["readers"].items():
            assert result["error"] is None, (name, reader)
            if not result["measured_only"]:
                assert result["explained_by_known_gaps"] == result["differences"], (name, reader)
        assert set(row["speed"]) == {str(size) for size in tokenizers.BATCHES}
        for timing in row["speed"].values():
            assert {"keras-hub", "tokenizers"} <= set(timing["strings_per_s"]), name
            assert all(rate > 0 for rate in timing["strings_per_s"].values()), name
    written = json.loads((results_io.RESULTS / "tokenizers.quick.json").read_text())
    assert [row["name"] for row in written["tokenizers"]] == list(rows)


@pytest.mark.peers  # onnxscript comes with the peers extra
def test_rule_engines_benchmark_quick_mode_fuses_the_same_norms_both_ways():
    """Our RMS norm rule and the onnxscript one fuse every norm of the quick
    Llama: one before each attention and each MLP, one at the end."""
    from benchmarks import attention_forms, rule_engines

    report = rule_engines.main(["--quick"])
    norms = 2 * attention_forms.QUICK_SIZES["num_layers"] + 1
    assert report["rms_norm"]["fused"] == {"ours": norms, "onnxscript": norms}
    written = json.loads((results_io.RESULTS / "rule_engines.quick.json").read_text())
    assert written["rms_norm"]["fused"] == report["rms_norm"]["fused"]


@pytest.mark.peers
def test_real_models_benchmark_quick_mode_compares_all_four_exports():
    from benchmarks import real_models

    report = real_models.main(["--quick"])
    assert set(report["models"]) == {"bert", "llama"}
    for kind, entry in report["models"].items():
        # The PyTorch copy computes what Keras computes, and so does every file.
        assert entry["pytorch_vs_keras_max_abs"] < real_models.AGREEMENT_ATOL, kind
        assert set(entry["files"]) == {*real_models.CANDIDATES, real_models.UNSHARED}, kind
        for name, row in entry["files"].items():
            assert row["max_abs_vs_pytorch_file"] < real_models.AGREEMENT_ATOL, (kind, name)
        assert entry["files"]["ours"]["fused"]["MultiHeadAttention"] == 1, kind
        # The profile puts each file's matmuls in their kind, and sees each file run.
        profile = entry["profile"]["ms_by_kind"]
        assert set(profile) == set(real_models.PROFILED), kind
        for name, by_kind in profile.items():
            assert set(by_kind) == {*real_models.OP_KINDS, "layout and other"}, name
            assert by_kind["matmul"] > 0 and all(ms >= 0 for ms in by_kind.values()), name
        assert real_models.op_kind("RotaryEmbedding") == "rotary"
        assert real_models.op_kind("Reshape") == "layout and other"
        for shape, timing in entry["latency"].items():
            expected = {*real_models.CANDIDATES, real_models.UNSHARED, *real_models.BOUNDS}
            assert set(timing["ms"]) == expected, shape
            assert timing["gflops"] > 0
            ours = timing["ms"]["ours"]["median_ms"]
            ratio = entry["ratios"][shape]["ours / pytorch + ort optimizer"]
            assert ratio == pytest.approx(
                ours / timing["ms"]["pytorch + ort optimizer"]["median_ms"]
            )
    # Each chain of 8 skip norms, fused and not, timed at every shape.
    for timing in report["skip_norms"]["ms"].values():
        assert len(timing) == 2 * len(real_models.SKIP_NORMS)
    assert (results_io.RESULTS / "real_models.quick.png").exists()


def test_genai_benchmark_quick_mode_times_every_candidate_with_keras_hub_tokens():
    """Every candidate (the optional builder aside) generates at every point,
    to the full length; genai on the float folder gives keras-hub's tokens."""
    from benchmarks import genai

    report = genai.main(["--quick"])
    assert [entry["model"] for entry in report["models"]] == ["gpt2", "llama"]
    for entry in report["models"]:
        assert [row["batch"] for row in entry["rows"]] == list(genai.BATCHES)
        assert isinstance(entry["files"]["genai_fp32"]["past_present_share_buffer"], bool)
        for row in entry["rows"]:
            for name in genai.CANDIDATES:
                assert row[name]["tokens_per_second"] > 0, (entry["model"], name)
                assert row[name]["first_token_ms"] > 0 and row[name]["length_reached"], name
            assert row["genai_fp32"]["same_tokens_as_keras_hub"], (entry["model"], row["batch"])
    written = json.loads((results_io.RESULTS / "genai.quick.json").read_text())
    assert written["candidates"] == list(genai.CANDIDATES)
    assert written["targets"] == report["targets"]


def test_int8_rows_benchmark_quick_mode_compares_both_scales():
    """Per row, a row's logits in a batch are those it gives alone; per
    tensor, they are not."""
    from benchmarks import int8_rows

    report = int8_rows.main(["--quick"])
    (entry,) = report["models"].values()
    rows = entry["rows"]
    assert rows["per row"]["max_row_change_in_batch"] <= 1e-5
    assert rows["per tensor"]["max_row_change_in_batch"] > 1e-3
    (timing,) = entry["latency_ms"].values()
    assert timing["per row / per tensor"] > 0
    assert (results_io.RESULTS / "int8_rows.quick.json").exists()


def test_vision_benchmark_quick_mode_writes_the_documented_keys():
    """Both image classifiers, every contender at every batch: milliseconds or
    the error that kept it from running; the targets recorded, met or not."""
    from benchmarks import vision

    report = vision.main(["--quick"])
    models = list(vision.QUICK_MODELS)
    assert [(row["model"], row["batch"]) for row in report["rows"]] == [
        (model, batch) for model in models for batch in vision.BATCHES
    ]
    for row in report["rows"]:
        assert row["ours"]["ms"] > 0 and row["xla"]["ms"] > 0, row["model"]
        for contender in vision.CONTENDERS:
            assert ("ms" in row[contender]) != ("error" in row[contender]), contender
        assert set(row["ratios"]) == {"ours / keras_export", "ours / xla"}
        # ONNX Runtime's profile: kernel times by op type, the multiply-adds among them.
        profile = row["ours"]["profile"]
        assert 0 < profile["multiply_add_ms"] <= sum(profile["ms_by_op"].values()) + 1e-3
        assert 0 < profile["multiply_add_share"] and profile["run_ms"] > 0
    for key in ("files", "parameters_bytes", "export", "max_abs_diff_vs_keras"):
        assert set(report[key]) == set(models), key
    for model in models:
        assert set(report["files"][model]) == set(vision.FILES)
        ours = report["files"][model]["ours"]
        assert {"bytes", "nodes", "op_counts", "transposes"} <= set(ours), model
        export = report["export"][model]
        assert export["passed"] and export["seconds"] > 0 and export["peak_rss_bytes"] > 0
        # The high-water mark as each stage ends: rising, the last at the peak or below.
        after = list(export["peak_rss_bytes_after_stage"].values())
        assert list(export["peak_rss_bytes_after_stage"])[:2] == ["load", "trace"]
        assert after == sorted(after) and after[-1] <= export["peak_rss_bytes"]
        # Our file and XLA compute Keras' logits (tiny models: float32 rounding).
        assert report["max_abs_diff_vs_keras"][model]["ours"] < 1e-4, model
    targets = report["targets"]
    assert {"all_met", "missed", "not_measured", "checks"} <= set(targets)
    assert all(check["met"] in (True, False, None) for check in targets["checks"])
    speed = [c for c in targets["checks"] if c["met"] is not None and c["batch"] is not None]
    assert all(0 < c["multiply_add_floor"] <= c["ratio"] for c in speed)
    assert report["machine"]["cores"] and report["sessions"]["intra_op_num_threads"]
    written = json.loads((results_io.RESULTS / "vision.quick.json").read_text())
    assert written["rows"] == report["rows"] and written["targets"] == report["targets"]


def test_sequence_loops_benchmark_quick_mode_proves_and_times_both_models():
    """Qwen3.5 and RWKV-7 exported with their loops as ONNX `Loop`s and
    proved, Keras' own export's outcome recorded, and both sides timed at
    every shape."""
    from benchmarks import sequence_loops

    report = sequence_loops.main(["--quick"])
    assert set(report["exports"]) == set(sequence_loops.QUICK)
    for exports in report["exports"].values():
        ours = exports["ours"]
        assert ours["passed"] and ours["loops"] >= 1 and ours["worst_abs_diff"] < 1e-4
        assert ("seconds" in exports["keras_export"]) != ("error" in exports["keras_export"])
    assert [(row["model"], row["batch"], row["length"]) for row in report["rows"]] == [
        (model, *shape) for model in sequence_loops.QUICK for shape in sequence_loops.QUICK_SHAPES
    ]
    assert all(row["ours"]["ms"] > 0 and row["keras"]["ms"] > 0 for row in report["rows"])
    written = json.loads((results_io.RESULTS / "sequence_loops.quick.json").read_text())
    assert written["rows"] == report["rows"]


def test_int8_cnn_benchmark_quick_mode_records_the_gate_and_both_times():
    from benchmarks import int8_cnn

    report = int8_cnn.main(["--quick"])
    assert report["passed"] and report["int8"]["passed"]
    assert (
        sum(
            int(point.split("x")[0]) * count
            for point, count in report["grid_points"].items()
            if point[0].isdigit()
        )
        >= 1000
    )
    assert report["int8"]["latency"]["float32_ms"] > 0 and report["int8"]["latency"]["int8_ms"] > 0
    assert report["peak_rss_bytes"] >= report["built_rss_bytes"] > 0
    assert (results_io.RESULTS / "int8_cnn.quick.json").exists()


def test_seq2seq_benchmark_quick_mode_times_both_sides_on_the_same_tokens():
    from benchmarks import seq2seq

    report = seq2seq.main(["--quick", "--rounds", "2"])
    assert all(part["export"]["passed"] for part in report["models"].values())
    assert [(row["model"], row["batch"]) for row in report["rows"]] == [
        ("tiny BART", 1), ("tiny BART", 8), ("tiny T5", 1), ("tiny T5", 8)
    ]  # fmt: skip
    for row in report["rows"]:
        assert row["ours"]["ms"] > 0 and row["keras_hub"]["ms"] > 0
        assert row["same_tokens"]  # the same greedy tokens, or the timing compares nothing
    written = json.loads((results_io.RESULTS / "seq2seq.quick.json").read_text())
    assert written["rows"] == report["rows"]
