"""`pip install keras-layers` alone: the layers on JAX, with no TensorFlow or onnx.

Runs only in an environment made for it (`.ci/run` builds one with the
`layers-test` extra: keras, numpy, jax, pytest); the default suite deselects
it, since TensorFlow is installed there.
"""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.minimal_install


def test_the_export_stack_is_not_installed():
    for name in ("tensorflow", "onnx", "onnxruntime", "tf2onnx", "keras_hub"):
        assert importlib.util.find_spec(name) is None, f"{name} is installed"


def test_the_layers_run_on_jax_and_survive_save_and_load(tmp_path):
    import keras

    from keras_layers import ScaledEmbedding, SinusoidalPositionEncoding, TiedOutputDense

    assert keras.backend.backend() == "jax"
    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32")
    embedding = ScaledEmbedding(50, 8, mask_zero=True)
    hidden = SinusoidalPositionEncoding()(embedding(ids))
    model = keras.Model(ids, TiedOutputDense(embedding)(hidden))
    tokens = np.array([[3, 9, 4, 0], [7, 0, 0, 0]], "int32")
    # The formula: logits = (E[t] * sqrt(d) + PE) @ E^T, E the one shared matrix.
    table = keras.ops.convert_to_numpy(embedding.embeddings)
    position = np.arange(4)[:, None]
    channel = np.arange(8)[None, :]
    angle = position / 10000 ** (2 * (channel // 2) / 8)
    encoding = np.where(channel % 2 == 0, np.sin(angle), np.cos(angle))
    expected = (table[tokens] * np.sqrt(8) + encoding) @ table.T
    got = keras.ops.convert_to_numpy(model(tokens))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(tokens)), got, atol=1e-6)
    assert loaded.layers[-1].embedding is loaded.layers[1]


def test_the_export_package_names_the_extra_to_install():
    result = subprocess.run(
        [sys.executable, "-c", "import keras_layers.export"],
        capture_output=True,
        text=True,
        env={**os.environ, "KERAS_BACKEND": "jax"},
        timeout=120,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: keras_layers.export needs tensorflow")
    assert 'pip install "keras-layers[export]"' in last
