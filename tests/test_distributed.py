"""Training beyond one device keeps the tie, matches one device, and exports.

Each strategy runs `examples/train_distributed.py` in its own process (the
backend and the device count are fixed before Keras is imported) on the same
global batches from the same start, and is compared with the one-device run of
its backend.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import keras_layers  # noqa: F401 - registers the layers for load_model
from keras_layers.export import ExportOptions, export_model

pytestmark = [
    pytest.mark.tensorflow_only,
    pytest.mark.xdist_group("distributed"),  # module fixtures: one worker (loadgroup)
]

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "train_distributed.py"
STEPS = 8
# The replicas sum their gradients in another order than one device does: the
# same losses up to float32 summation order (measured: at most 9.5e-8 relative).
LOSS_RTOL = 1e-5


def train(strategy, out):
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "XLA_FLAGS")}
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--strategy", strategy, "--steps", str(STEPS)]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def probe(out):
    return np.load(out.with_name(f"{out.stem}.probe.npz"))


def check_exports(model_path, tmp_path):
    reloaded = keras.saving.load_model(model_path, compile=False)
    matrices = [v for v in reloaded.weights if v.path.endswith("embeddings")]
    assert len(matrices) == 1, [v.path for v in reloaded.weights]
    report = export_model(
        model_path, tmp_path / f"{model_path.stem}.onnx", ExportOptions(shapes=[(2, 9)])
    )
    assert report["passed"]
    assert report["graph"]["shared_weights"][0]["read_by"] == ["Gather", "Transpose"]
    # The file's logits are the trained model's: compare with the saved probe.
    import onnxruntime as ort

    saved = probe(model_path)
    session = ort.InferenceSession(str(tmp_path / f"{model_path.stem}.onnx"))
    (logits,) = session.run(None, {"token_ids": saved["token_ids"]})
    np.testing.assert_allclose(logits, saved["final"], atol=1e-4, rtol=1e-3)


@pytest.fixture(scope="module")
def tf_single(tmp_path_factory):
    out = tmp_path_factory.mktemp("tf_single") / "single.keras"
    return train("tf-single", out), out


@pytest.mark.slow  # minutes; CI runs the slow tier (.ci/run)
@pytest.mark.parametrize("strategy", ["mirrored", "multi-worker"])
def test_tensorflow_strategy_matches_one_device_and_exports(tmp_path, tf_single, strategy):
    single, _ = tf_single
    out = tmp_path / f"{strategy}.keras"
    result = train(strategy, out)
    assert result["replicas"] == 2 and single["replicas"] == 1
    assert result["tied"] and single["tied"]
    if strategy == "multi-worker":
        assert result["workers_agree"]
    np.testing.assert_allclose(result["losses"], single["losses"], rtol=LOSS_RTOL)
    check_exports(out, tmp_path)


@pytest.fixture(scope="module")
def jax_single(tmp_path_factory):
    out = tmp_path_factory.mktemp("jax_single") / "single.keras"
    return train("jax-single", out), out


@pytest.mark.cross_backend
def test_jax_data_parallel_matches_one_device_and_exports(tmp_path, jax_single):
    single, _ = jax_single
    out = tmp_path / "data_parallel.keras"
    result = train("jax-data-parallel", out)
    assert result["backend"] == "jax" and result["replicas"] == 2
    assert result["tied"] and single["tied"]
    np.testing.assert_allclose(result["losses"], single["losses"], rtol=LOSS_RTOL)
    check_exports(out, tmp_path)


@pytest.mark.cross_backend
def test_jax_model_parallel_shards_the_tied_matrix(tmp_path, jax_single):
    single, single_path = jax_single
    out = tmp_path / "model_parallel.keras"
    result = train("jax-model-parallel", out)
    assert result["tied"]
    # The vocabulary axis of the one tied matrix is split over the 2 devices.
    assert result["embedding_placement"] == "NamedSharding('model', None)"
    # Same weights, sharded or not: the same logits from TiedOutputDense.
    np.testing.assert_allclose(
        probe(out)["initial"], probe(single_path)["initial"], atol=1e-6, rtol=1e-6
    )
    np.testing.assert_allclose(result["losses"], single["losses"], rtol=LOSS_RTOL)
    check_exports(out, tmp_path)
