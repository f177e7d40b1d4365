"""Nothing the user had is lost: paths checked before any work, one transaction
per export, external data placed atomically, interrupts and failures leave the
user's files byte-identical."""

import hashlib
import json
import os
import stat
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from models import VOCAB, save, tied_encoder

from keras_layers.export import ExportOptions, ValidationFailed, export_model, placement
from keras_layers.export.cli import main

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

SHAPES = ["--shapes", "1x4"]
# The int8 gate pools at least 1,000 tokens (`validating.INT8_MIN_TOKENS`).
INT8_SHAPES = [(4, 256)]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save(tied_encoder(layers=1), tmp_path_factory.mktemp("placement") / "model.keras")


def snapshot(folder: Path) -> dict:
    """Every entry of `folder` (hidden ones too): name -> (kind, content hash)."""
    found = {}
    for entry in sorted(folder.iterdir()):
        info = entry.lstat()
        if stat.S_ISREG(info.st_mode):
            found[entry.name] = ("file", hashlib.sha256(entry.read_bytes()).hexdigest())
        else:
            found[entry.name] = (stat.filemode(info.st_mode)[0], None)
    return found


def logits(path: Path) -> np.ndarray:
    ids = np.random.default_rng(4).integers(1, VOCAB, size=(2, 6)).astype("int32")
    return ort.InferenceSession(str(path)).run(None, {"token_ids": ids})[0]


def run_cli(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def test_output_equal_to_the_model_is_refused(tmp_path, model_path, capsys):
    source = tmp_path / "m.keras"
    source.write_bytes(model_path.read_bytes())
    before = snapshot(tmp_path)
    code, err = run_cli(capsys, source, "-o", source, *SHAPES)
    assert code == 2 and "is the model being exported" in err
    assert snapshot(tmp_path) == before


def test_report_equal_to_output_is_refused(tmp_path, model_path, capsys):
    out = tmp_path / "out.onnx"
    code, err = run_cli(capsys, model_path, "-o", out, "--report", out, *SHAPES)
    assert code == 2 and f"--report {out}" in err and "same file" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", ["-o", "--report"])
def test_a_fifo_is_never_replaced(tmp_path, model_path, capsys, flag):
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    args = ["-o", tmp_path / "out.onnx", "--report", fifo] if flag == "--report" else ["-o", fifo]
    code, err = run_cli(capsys, model_path, *args, *SHAPES)
    assert code == 2 and "not a regular file" in err
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_glob_characters_in_the_output_never_touch_other_folders(tmp_path, model_path, capsys):
    """`-o 'dir/*'` once turned the stale-folder glob into `.*.*.tmp`."""
    unrelated = tmp_path / ".backup.keep.tmp"
    unrelated.mkdir()
    (unrelated / "precious").write_text("mine")
    old = time.time() - 7200
    os.utime(unrelated, (old, old))
    code, _ = run_cli(capsys, model_path, "-o", tmp_path / "*", *SHAPES)
    assert code == 0
    assert (unrelated / "precious").read_text() == "mine"
    assert (tmp_path / "*").exists()


@pytest.mark.parametrize("folder", ["[bold]x", "a[/]b", "[red]"])
def test_markup_in_paths_is_printed_as_written(tmp_path, model_path, capsys, folder):
    out = tmp_path / folder / "m.onnx"
    code = main([str(model_path), "-o", str(out), *SHAPES])
    printed = capsys.readouterr().out
    assert code == 0 and out.exists()
    assert str(out) in printed.replace("\n", "")


def test_a_failed_export_changes_no_file_of_the_user(tmp_path, model_path):
    """Float file, data file, int8 file and report: all as they were."""
    out = tmp_path / "m.onnx"
    export_model(
        model_path, out, ExportOptions(shapes=INT8_SHAPES, external_data="always", quantize="int8")
    )
    before = snapshot(tmp_path)
    with pytest.raises(ValidationFailed) as raised:
        export_model(
            model_path,
            out,
            ExportOptions(shapes=[(1, 4)], external_data="always", atol=0.0, rtol=0.0),
        )
    after = snapshot(tmp_path)
    assert {name: after[name] for name in before} == before
    failed = tmp_path / "m.failed.onnx"
    assert raised.value.report["onnx_path"] == str(failed)
    # The failed file reads its own data file, never the good export's.
    assert placement._data_files_read_by(failed) == {Path(raised.value.report["data_files"][0])}
    assert placement._data_files_read_by(out) != placement._data_files_read_by(failed)
    np.testing.assert_allclose(logits(failed), logits(out), atol=1e-4)


def test_a_failing_int8_check_places_nothing(tmp_path, model_path):
    out = tmp_path / "m.onnx"
    export_model(model_path, out, ExportOptions(shapes=INT8_SHAPES, quantize="int8"))
    before = snapshot(tmp_path)
    with pytest.raises(ValidationFailed, match="int8 validation failed") as raised:
        # No int8 file agrees at every token, and the gate refuses a grid
        # too small to decide.
        export_model(model_path, out, ExportOptions(shapes=[(1, 4)], quantize="int8"))
    after = snapshot(tmp_path)
    assert {name: after[name] for name in before} == before
    assert "Nothing was placed" in str(raised.value)
    assert (tmp_path / "m.failed.int8.onnx").exists()


def test_ctrl_c_in_the_int8_stage_leaves_every_file_as_it_was(
    tmp_path, model_path, monkeypatch, capsys
):
    from keras_layers.export import quantizing

    out = tmp_path / "m.onnx"
    export_model(model_path, out, ExportOptions(shapes=INT8_SHAPES, quantize="int8"))
    before = snapshot(tmp_path)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(quantizing, "quantize_int8", interrupted)
    code, err = run_cli(capsys, model_path, "-o", out, "--quantize", "int8", "--shapes", "4x256")
    assert code == 130 and "interrupted" in err
    assert snapshot(tmp_path) == before


def test_a_swallowed_ctrl_c_still_stops_the_export(tmp_path, model_path, monkeypatch, capsys):
    """A KeyboardInterrupt raised inside a gc callback is printed and dropped by
    Python; the export must stop at the next stage all the same."""
    import gc
    import signal

    from keras_layers.export import converting

    real_convert = converting.convert

    def convert_then_interrupt_in_gc(*args, **kwargs):
        result = real_convert(*args, **kwargs)

        def callback(phase, info):
            gc.callbacks.remove(callback)
            os.kill(os.getpid(), signal.SIGINT)  # raised in here, then swallowed

        gc.callbacks.append(callback)
        gc.collect()
        return result

    monkeypatch.setattr(converting, "convert", convert_then_interrupt_in_gc)
    out = tmp_path / "m.onnx"
    code, _ = run_cli(capsys, model_path, "-o", out, *SHAPES)
    assert code == 130
    assert not out.exists()


def test_external_data_is_replaced_atomically(tmp_path, model_path, monkeypatch):
    """New data is placed under a new name first, then the graph; a failure
    between the two leaves the old graph reading its old, intact data."""
    out = tmp_path / "m.onnx"
    export_model(model_path, out, ExportOptions(shapes=[(1, 4)], external_data="always"))
    (old_data,) = placement._data_files_read_by(out)
    expected = logits(out)
    other = save(tied_encoder(layers=2, name="other"), tmp_path / "other.keras")  # new weights

    real_replace = os.replace
    calls = []

    def fail_on_the_graph(source, target):
        calls.append(Path(target).name)
        if Path(target) == out:
            raise OSError(28, "No space left on device")
        real_replace(source, target)

    monkeypatch.setattr(placement.os, "replace", fail_on_the_graph)
    with pytest.raises(OSError):
        export_model(other, out, ExportOptions(shapes=[(1, 4)], external_data="always"))
    monkeypatch.undo()
    assert calls[0].endswith(".data") and calls[0] != old_data.name  # data first, new name
    assert placement._data_files_read_by(out) == {old_data}
    np.testing.assert_array_equal(logits(out), expected)
    # A successful replacement removes the data file only the old graph read.
    export_model(other, out, ExportOptions(shapes=[(1, 4)], external_data="always"))
    assert not old_data.exists()
    (new_data,) = placement._data_files_read_by(out)
    assert new_data.exists() and new_data.name.startswith("m.onnx.")


def test_external_data_always_works_when_every_tensor_is_small(tmp_path):
    import keras

    from keras_layers import ScaledEmbedding

    ids = keras.Input((None,), dtype="int32", name="token_ids")
    model = keras.Model(ids, ScaledEmbedding(5, 2)(ids))
    report = export_model(
        model, tmp_path / "s.onnx", ExportOptions(shapes=[(1, 3)], external_data="always")
    )
    assert report["passed"] and report["external_data"]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_every_file_follows_the_umask(tmp_path, model_path, umask):
    previous = os.umask(umask)
    try:
        export_model(
            model_path,
            tmp_path / "m.onnx",
            ExportOptions(shapes=INT8_SHAPES, external_data="always", quantize="int8"),
        )
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert len(modes) == 4  # graph, data, int8, report
    assert set(modes.values()) == {0o666 & ~umask}, modes


def test_a_file_onnx_runtime_refuses_is_kept_with_a_report_saying_why(
    tmp_path, model_path, monkeypatch, capsys
):
    """A crash after conversion is a validation failure: exit 1, the file kept
    as NAME.failed.onnx, a report naming what failed."""
    from keras_layers.export import slimming

    real_slim = slimming.slim

    def broken(proto, *args, **kwargs):
        result = real_slim(proto, *args, **kwargs)
        result.proto.graph.node[0].op_type = "NoSuchOp"
        return result

    monkeypatch.setattr(slimming, "slim", broken)
    out = tmp_path / "m.onnx"
    code, err = run_cli(capsys, model_path, "-o", out, *SHAPES)
    assert code == 1 and "ONNX Runtime cannot load the file" in err
    assert not out.exists() and (tmp_path / "m.failed.onnx").exists()
    report = json.loads((tmp_path / "m.report.failed.json").read_text())
    assert report["passed"] is False and "NoSuchOp" in report["validation_error"]


def test_an_export_that_cannot_fit_in_memory_is_refused_before_any_work(
    tmp_path, model_path, monkeypatch, capsys
):
    from keras_layers.export import memory

    monkeypatch.setattr(memory, "available_bytes", lambda: 10_000_000)  # 10 MB free
    code, err = run_cli(capsys, model_path, "-o", tmp_path / "m.onnx", *SHAPES)
    assert code == 2 and "GB of memory" in err and "--no-memory-check" in err
    assert list(tmp_path.iterdir()) == []
    assert (
        main([str(model_path), "-o", str(tmp_path / "m.onnx"), *SHAPES, "--no-memory-check"]) == 0
    )


def test_the_memory_estimate_reads_the_weights_from_the_archive(model_path):
    import keras

    from keras_layers.export import memory

    model = keras.saving.load_model(model_path)
    weights = memory.archive_weight_bytes(model_path)
    assert abs(weights - 4 * model.count_params()) < 64_000  # h5 headers
    assert memory.estimated_param_bytes(model) == 4 * sum(
        int(np.prod(w.shape)) for w in model.weights
    )
