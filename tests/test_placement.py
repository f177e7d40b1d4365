"""Nothing the user had is lost: paths checked before any work, one transaction
per export, external data placed atomically, interrupts and failures leave the
user's files byte-identical."""

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from models import VOCAB, save, tied_encoder

from keras_layers.export import (
    ExportOptions,
    OutputError,
    UsageError,
    ValidationFailed,
    export_model,
    placement,
)
from keras_layers.export.cli import main

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

SHAPES = ["--shapes", "1x4"]
APART = ExportOptions(shapes=[(1, 4)], external_data="always")
# The int8 gate pools at least 1,000 tokens (`validating.INT8_MIN_TOKENS`).
INT8_SHAPES = [(4, 256)]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return save(tied_encoder(layers=1), tmp_path_factory.mktemp("placement") / "model.keras")


@pytest.fixture(scope="module")
def other_model():
    """A model in memory with other weights than `model_path`'s."""
    return tied_encoder(layers=2, name="other")


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
    assert placement.data_files_read_by(failed) == {Path(raised.value.report["data_files"][0])}
    assert placement.data_files_read_by(out) != placement.data_files_read_by(failed)
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
    (old_data,) = placement.data_files_read_by(out)
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
    with pytest.raises(OutputError, match="No space left on device.*nothing at the output"):
        export_model(other, out, ExportOptions(shapes=[(1, 4)], external_data="always"))
    monkeypatch.undo()
    assert calls[0].endswith(".data") and calls[0] != old_data.name  # data first, new name
    assert placement.data_files_read_by(out) == {old_data}
    assert sorted(tmp_path.glob("m.onnx.*.data")) == [old_data]  # the new data taken back
    np.testing.assert_array_equal(logits(out), expected)
    # A successful replacement removes the data file only the old graph read.
    export_model(other, out, ExportOptions(shapes=[(1, 4)], external_data="always"))
    assert not old_data.exists()
    (new_data,) = placement.data_files_read_by(out)
    assert new_data.exists() and new_data.name.startswith("m.onnx.")


def test_external_data_always_works_when_every_tensor_is_small(tmp_path):
    """No weight reaches the data file's threshold: the graph holds them all,
    no (empty) data file is written, and the report says so."""
    import keras

    from keras_layers import ScaledEmbedding

    ids = keras.Input((None,), dtype="int32", name="token_ids")
    model = keras.Model(ids, ScaledEmbedding(5, 2)(ids))
    out = tmp_path / "s.onnx"
    report = export_model(model, out, ExportOptions(shapes=[(1, 3)], external_data="always"))
    assert report["passed"] and report["external_data"] is False and report["data_files"] == []
    assert any("no data file was written" in warning for warning in report["warnings"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.onnx", "s.report.json"]
    assert placement.data_files_read_by(out) == set()
    ort.InferenceSession(str(out))


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


def test_two_exports_to_one_output_never_leave_a_graph_without_its_data(
    tmp_path, model_path, other_model, monkeypatch
):
    """Issue #28: export A re-exports the weights already at the output, so
    its content-named data file is the one the old graph reads. Export B,
    with other weights, used to place its files and remove that data file as
    stale while A was between its data and graph renames; A's graph then read
    a missing file. Under the output lock the placements run one after the
    other. The heavy work runs one export at a time; only the placements race."""
    out = tmp_path / "m.onnx"
    export_model(model_path, out, APART)
    real_replace, real_write_json = os.replace, placement.write_json
    a_staged, a_between_renames, b_done = threading.Event(), threading.Event(), threading.Event()
    both_staged = threading.Barrier(2, timeout=120)

    def write_json(data, path):  # the last step of each export before the placement
        real_write_json(data, path)
        if threading.current_thread().name == "A":
            a_staged.set()
        both_staged.wait()
        if threading.current_thread().name == "B":
            a_between_renames.wait(timeout=120)

    def replace(source, target):
        if threading.current_thread().name == "A" and Path(target) == out:
            a_between_renames.set()
            b_done.wait(timeout=2)  # B finishes here unless the lock holds it
        real_replace(source, target)

    monkeypatch.setattr(placement, "write_json", write_json)
    monkeypatch.setattr(placement.os, "replace", replace)
    errors = []

    def export(model, done=None):
        try:
            export_model(model, out, APART)
        except BaseException as error:  # noqa: BLE001 - reported by the test
            errors.append(error)
            both_staged.abort()
        finally:
            if done is not None:
                done.set()

    a = threading.Thread(target=export, args=(model_path,), name="A")
    a.start()
    assert a_staged.wait(timeout=120)
    b = threading.Thread(target=export, args=(other_model, b_done), name="B")
    b.start()
    a.join(timeout=120)
    b.join(timeout=120)
    monkeypatch.undo()
    assert not errors and not a.is_alive() and not b.is_alive()
    read = placement.data_files_read_by(out)
    assert read and all(path.exists() for path in read), "the graph reads a missing data file"
    assert set(tmp_path.glob("m.onnx.*.data")) == read  # the other export's data removed
    logits(out)
    assert not placement.lock_path(out).exists()


def graph_reading(path: Path, locations: list[str]) -> None:
    """A small ONNX graph at `path` whose weights are in the files at
    `locations` (relative to its folder, or absolute), each written too."""
    import onnx
    from onnx import TensorProto, helper

    values = np.arange(4, dtype="float32")
    weights = []
    for index, location in enumerate(locations):
        data = Path(location) if Path(location).is_absolute() else path.parent / location
        data.parent.mkdir(parents=True, exist_ok=True)
        data.write_bytes(values.tobytes())
        tensor = helper.make_tensor(f"w{index}", TensorProto.FLOAT, [4], [0.0] * 4)
        tensor.ClearField("float_data")
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", "0"), ("length", "16")):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        weights.append(tensor)
    names = [tensor.name for tensor in weights]
    node = helper.make_node("Sum", names, ["y"])
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    graph = helper.make_graph([node], "old", [], [output], initializer=weights)
    onnx.save_model(helper.make_model(graph), str(path))


def test_only_data_files_the_replaced_graph_read_beside_it_are_removed(tmp_path, model_path):
    """Issue #28: the old graph read `keep/m.onnx.precious.data`, and an
    unrelated `m.onnx.precious.data` beside the output was removed (base names
    were compared). A data file is removed only when the replaced graph read
    that very path and it lies beside the graph, named after it: a subfolder's
    file, one reached by `..` or an absolute path is never ours."""
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "m.onnx"
    outside = tmp_path / "m.onnx.outside.data"
    absolute = tmp_path / "elsewhere" / "m.onnx.absolute.data"
    graph_reading(
        out, ["keep/m.onnx.precious.data", "../m.onnx.outside.data", str(absolute), "m.onnx.data"]
    )
    followed = placement.data_files_read_by(out)
    unrelated = folder / "m.onnx.precious.data"
    unrelated.write_bytes(b"mine")
    survivors = [unrelated, folder / "keep" / "m.onnx.precious.data", outside, absolute]
    before = {path: path.read_bytes() for path in survivors}
    export_model(model_path, out, APART)
    assert {path: path.read_bytes() for path in survivors} == before
    assert not (folder / "m.onnx.data").exists()  # read by the old graph, beside it, ours
    # `..` and absolute locations are never followed.
    assert followed == {folder / "keep" / "m.onnx.precious.data", folder / "m.onnx.data"}
    logits(out)


def test_a_data_file_another_graph_beside_reads_is_kept(tmp_path, model_path, other_model):
    out = tmp_path / "m.onnx"
    export_model(model_path, out, APART)
    (data,) = placement.data_files_read_by(out)
    shutil.copyfile(out, tmp_path / "backup.onnx")
    export_model(other_model, out, APART)
    assert data.exists() and placement.data_files_read_by(out) != {data}
    logits(tmp_path / "backup.onnx")


def acquired_within(output: Path, seconds: float) -> bool:
    """Whether `output_lock(output)` is taken and released within `seconds`."""

    def take():
        with placement.output_lock(output):
            pass

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    thread.join(timeout=seconds)
    return not thread.is_alive()


def is_held(output: Path) -> bool:
    """Whether someone holds the lock of `output` (probed without waiting)."""
    import fcntl

    try:
        descriptor = os.open(placement.lock_path(output), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(descriptor)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_the_lock_is_released_and_its_file_removed_on_every_exit(tmp_path, error):
    out = tmp_path / "m.onnx"
    with pytest.raises(error), placement.output_lock(out):
        assert placement.lock_path(out).is_file() and is_held(out)
        raise error
    assert list(tmp_path.iterdir()) == []
    assert acquired_within(out, 10)
    assert list(tmp_path.iterdir()) == []


def test_the_lock_admits_one_holder_at_a_time(tmp_path):
    """Each release removes the lock file; a waiter that locked the removed
    file must start over, or two holders would overlap."""
    out = tmp_path / "m.onnx"
    inside, overlaps = [], []

    def work():
        for _ in range(25):
            with placement.output_lock(out):
                inside.append(1)
                overlaps.append(len(inside))
                time.sleep(0.0005)
                inside.pop()

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(overlaps) == 150 and max(overlaps) == 1
    assert list(tmp_path.iterdir()) == []


def test_the_lock_of_a_killed_export_holds_no_one_up(tmp_path, model_path):
    """The kernel drops the lock of a process killed with SIGKILL; the file it
    left is reused by the next export and removed."""
    out = tmp_path / "m.onnx"
    holder = (
        "import sys, time; from pathlib import Path; "
        "from keras_layers.export import placement; "
        "held = placement.output_lock(Path(sys.argv[1])); held.__enter__(); "
        "print('held', flush=True); time.sleep(600)"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", holder, str(out)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout.readline() == "held\n"
        assert is_held(out)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
    assert placement.lock_path(out).exists()  # left by the killed holder
    assert acquired_within(out, 10)
    export_model(model_path, out, ExportOptions(shapes=[(1, 4)]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.report.json"]


def test_a_directory_at_the_data_path_is_exit_2_and_changes_nothing(tmp_path, model_path, capsys):
    """Issue #28: a directory squatting the content-named data path was an
    internal error (exit 3). Exports are byte-identical, so the first one
    tells the name the second one will place its data under."""
    first = export_model(model_path, tmp_path / "first" / "m.onnx", APART)
    folder = tmp_path / "second"
    (folder / Path(first["data_files"][0]).name).mkdir(parents=True)
    export_model(model_path, folder / "m.onnx", ExportOptions(shapes=[(1, 4)]))  # an old export
    before = snapshot(folder)
    code, err = run_cli(
        capsys, model_path, "-o", folder / "m.onnx", "--external-data", "always", *SHAPES
    )
    assert code == 2, err
    assert err.count("\n") == 1 and "internal error" not in err
    assert str(folder / Path(first["data_files"][0]).name) in err
    assert "a directory is in the way; remove or rename it" in err
    assert snapshot(folder) == before


@pytest.mark.skipif(
    not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == os.stat("/tmp").st_dev,
    reason="needs a second file system at /dev/shm",
)
def test_a_report_on_another_file_system_is_placed(model_path, capsys):
    """A rename cannot cross file systems: the report is first copied beside
    its destination (this was exit 3, after the graph had been placed)."""
    import tempfile

    with (
        tempfile.TemporaryDirectory(dir="/tmp") as here,
        tempfile.TemporaryDirectory(dir="/dev/shm") as there,
    ):
        report = Path(there) / "r.json"
        code, err = run_cli(
            capsys, model_path, "-o", Path(here) / "m.onnx", "--report", report, *SHAPES
        )
        assert code == 0, err
        assert json.loads(report.read_text())["passed"]
        assert sorted(os.listdir(here)) == ["m.onnx"] and os.listdir(there) == ["r.json"]


def test_a_live_export_keeps_its_staging_folder_however_old(tmp_path):
    """Stale staging folders (idle an hour) are removed, unless their export
    still runs: it holds its folder locked."""
    out = tmp_path / "m.onnx"
    dead = tmp_path / ".m.onnx.abcd1234.tmp"
    dead.mkdir()
    old = time.time() - 2 * placement.STALE_SECONDS
    os.utime(dead, (old, old))
    with placement.staging_folder(out) as live:
        assert not dead.exists()
        os.utime(live, (old, old))
        placement._remove_stale_staging(out)
        assert live.is_dir()
    assert list(tmp_path.iterdir()) == []


def test_a_directory_at_the_lock_path_is_refused_before_any_work(tmp_path, model_path, capsys):
    placement.lock_path(tmp_path / "m.onnx").mkdir()
    before = snapshot(tmp_path)
    code, err = run_cli(capsys, model_path, "-o", tmp_path / "m.onnx", *SHAPES)
    assert code == 2 and ".m.onnx.lock" in err and "is not a regular file; remove it" in err
    assert snapshot(tmp_path) == before


def test_a_file_of_the_user_at_the_lock_path_is_kept(tmp_path):
    """Lock files are empty; one with content at that name is the user's,
    locked and used, never removed."""
    out = tmp_path / "m.onnx"
    theirs = placement.lock_path(out)
    theirs.write_bytes(b"notes the user keeps here")
    with placement.output_lock(out):
        assert is_held(out)
    assert theirs.read_bytes() == b"notes the user keeps here"


@pytest.mark.parametrize("external", ["never", "always"])
def test_a_successful_export_removes_what_a_failed_one_kept(model_path, tmp_path, external):
    output = tmp_path / "model.onnx"
    strict = ExportOptions(shapes=[(1, 4)], atol=0.0, rtol=0.0, external_data=external)
    with pytest.raises(ValidationFailed):
        export_model(model_path, output, strict)
    failed = placement.Targets(output, placement.default_report_path(output)).failed()
    assert failed.onnx.is_file() and failed.report.is_file()
    export_model(model_path, output, ExportOptions(shapes=[(1, 4)], external_data=external))
    names = sorted(path.name for path in tmp_path.iterdir())
    assert not [name for name in names if ".failed" in name], names
    data = [name for name in names if name.endswith(".data")]
    assert len(data) == (1 if external == "always" else 0), names
    ort.InferenceSession(str(output), providers=["CPUExecutionProvider"])


def test_a_failed_command_creates_no_folder(model_path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["ghost/model.keras", *SHAPES]) == 2  # a typo: no such model
    assert "ghost" in capsys.readouterr().err
    output = tmp_path / "new" / "deeper" / "model.onnx"
    with pytest.raises(ValidationFailed):  # failed: its files are kept, so its folders too
        export_model(model_path, output, ExportOptions(shapes=[(1, 4)], atol=0.0, rtol=0.0))
    assert sorted(p.name for p in output.parent.iterdir()) == [
        "model.failed.onnx",
        "model.report.failed.json",
    ]
    shutil.rmtree(tmp_path / "new")
    unknown = ExportOptions(shapes=[(1, 4)], input_roles={"nope": "ids"})
    with pytest.raises(UsageError):  # fails while loading, staged: no folder left
        export_model(model_path, output, unknown)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
