"""Reliability of the export: atomic output under SIGKILL, a full disk,
reproducible exports, and out-of-range token ids."""

import collections
import errno
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import VOCAB, save, tied_encoder

from keras_layers.export import export_model
from keras_layers.export.cli import main

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def model_and_good_file(tmp_path_factory):
    directory = tmp_path_factory.mktemp("reliable")
    model = save(tied_encoder(layers=1), directory / "model.keras")
    good = directory / "good.onnx"
    export_model(model, good, shapes=[(1, 4)])
    return model, good


@pytest.mark.parametrize("delay", [1.0, 4.0, 7.0, 10.0])
def test_sigkill_never_damages_the_output(tmp_path, model_and_good_file, delay):
    """Kill the export at several points: the old file stays whole and valid."""
    model, good = model_and_good_file
    output = tmp_path / "model.onnx"
    output.write_bytes(good.read_bytes())
    before = hashlib.sha256(output.read_bytes()).hexdigest()
    process = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "export" / "to_onnx.py"),
            str(model),
            "-o",
            str(output),
            "--shapes",
            "1x4",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    # Old or new, never a mix: either the old bytes, or (when the export got to
    # its placement before the kill, which a fast machine does) a complete new
    # export with its report, which computes what the old file computes.
    visible = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    if hashlib.sha256(output.read_bytes()).hexdigest() == before:
        assert visible in (["model.onnx"], ["model.onnx", "model.report.json"])
    else:  # the report is renamed right after the graph
        assert visible in (["model.onnx"], ["model.onnx", "model.report.json"])
        ids = np.random.default_rng(5).integers(1, VOCAB, size=(2, 9)).astype("int32")
        old, new = (
            ort.InferenceSession(str(path)).run(None, {"token_ids": ids})[0]
            for path in (good, output)
        )
        np.testing.assert_array_equal(new, old)
    onnx.checker.check_model(str(output))


def test_disk_full_is_a_clear_error_and_changes_nothing(
    tmp_path, model_and_good_file, monkeypatch, capsys
):
    model, good = model_and_good_file
    output = tmp_path / "model.onnx"
    output.write_bytes(good.read_bytes())
    before = output.read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(onnx, "save_model", full)
    code = main([str(model), "-o", str(output), "--shapes", "1x4"])
    assert code == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "Traceback" not in err
    assert output.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_two_exports_have_the_same_weights_ops_and_outputs(tmp_path, model_and_good_file):
    """Byte identity is out of reach (tf2onnx orders independent nodes by set and
    id iteration); everything that matters is identical."""
    model, _ = model_and_good_file
    first, second = tmp_path / "a.onnx", tmp_path / "b.onnx"
    export_model(model, first, shapes=[(1, 4)])
    export_model(model, second, shapes=[(1, 4)])
    protos = [onnx.load(path) for path in (first, second)]

    def weights(proto):
        return sorted(
            hashlib.sha256(onnx.numpy_helper.to_array(init).tobytes()).hexdigest()
            for init in proto.graph.initializer
        )

    assert weights(protos[0]) == weights(protos[1])
    ops = [collections.Counter(n.op_type for n in p.graph.node) for p in protos]
    assert ops[0] == ops[1]
    ids = np.random.default_rng(3).integers(0, VOCAB, size=(3, 21)).astype("int32")
    outputs = [
        ort.InferenceSession(str(p)).run(None, {"token_ids": ids})[0] for p in (first, second)
    ]
    assert np.array_equal(outputs[0], outputs[1])


def test_out_of_range_ids_fail_loudly_in_keras_and_onnx(model_and_good_file):
    """TensorFlow and ONNX Runtime both refuse an id >= vocabulary (JAX clamps:
    see docs/export.md)."""
    import keras

    model, good = model_and_good_file
    ids = np.array([[1, 2, VOCAB + 5]], dtype="int32")
    with pytest.raises(Exception, match=r"(?i)indices|out of range|bound"):
        keras.saving.load_model(model)(ids)
    session = ort.InferenceSession(str(good))
    with pytest.raises(Exception, match=r"(?i)indices|out of|bound"):
        session.run(None, {"token_ids": ids})
