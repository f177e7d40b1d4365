"""A model trained and saved under JAX or PyTorch exports through the TensorFlow
pipeline and matches the outputs computed in its original backend."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from keras_layers.export import ExportOptions, export_model

# The export runs on TensorFlow; the models come from the other backends, which
# the `backends` extra installs (CI runs these with -m cross_backend).
pytestmark = [pytest.mark.tensorflow_only, pytest.mark.cross_backend]

TRAIN_AND_SAVE = textwrap.dedent(
    """
    import sys
    import keras, numpy as np
    from keras_layers.demo import EncoderConfig, build_encoder

    model = build_encoder(EncoderConfig(200, 32, layers=1), seed=0)
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    data = rng.integers(1, 200, size=(64, 12)).astype("int32")
    model.fit(data, data, batch_size=16, epochs=1, verbose=0)
    probe = rng.integers(0, 200, size=(3, 17)).astype("int32")
    probe[1, 9:] = 0
    model.save(sys.argv[1])
    np.savez(sys.argv[2], token_ids=probe, logits=keras.ops.convert_to_numpy(model(probe)))
    """
)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_model_saved_under_another_backend_exports(tmp_path, backend):
    __import__(backend)  # the backends extra: an ImportError here is a set-up error
    model_path, outputs_path = tmp_path / "model.keras", tmp_path / "outputs.npz"
    env = {**os.environ, "KERAS_BACKEND": backend}
    subprocess.run(
        [sys.executable, "-c", TRAIN_AND_SAVE, str(model_path), str(outputs_path)],
        env=env,
        check=True,
        capture_output=True,
        timeout=600,
        cwd=Path(__file__).resolve().parent.parent,
    )
    report = export_model(
        model_path, tmp_path / "model.onnx", ExportOptions(shapes=[(2, 7), "padded"])
    )
    assert report["passed"]
    saved = np.load(outputs_path)
    session = ort.InferenceSession(str(tmp_path / "model.onnx"))
    (logits,) = session.run(None, {"token_ids": saved["token_ids"]})
    assert np.abs(logits - saved["logits"]).max() <= 1e-4
