"""FNet's Fourier mixing, exported: keras-hub's FNet mixes tokens with the
real part of a 2-D FFT (`ops.fft2`), which TensorFlow computes on complex
tensors that tf2onnx cannot convert. The trace writes it as products with the
DFT's cosine and sine tables (`tracing._fourier_transforms_as_products`);
before, every FNet class failed with ConversionError (exit 2).

Checked against NumPy's FFT (an independent reference), against Keras' own
FFT through the export's validation, and by a file whose sine table has the
wrong sign (the other sign convention of the DFT), which must fail.
"""

import keras
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import zoo_models
from onnx import numpy_helper

from keras_layers.export import ValidationFailed, export_model, validate

pytestmark = [pytest.mark.tensorflow_only, pytest.mark.xdist_group("fourier_mixing")]


class Mixing(keras.layers.Layer):
    """FNet's mixing as keras-hub writes it: the real part of `ops.fft2`."""

    def call(self, x):
        real, _ = keras.ops.fft2((x, keras.ops.zeros_like(x)))
        return real


@pytest.fixture(scope="module")
def mixing_file(tmp_path_factory):
    features = keras.Input(shape=(None, 12))
    model = keras.Model(features, Mixing()(features))
    path = tmp_path_factory.mktemp("mixing") / "mixing.onnx"
    assert export_model(model, path)["passed"]
    return model, path


def test_the_file_computes_numpys_fft_at_any_length(mixing_file):
    _, path = mixing_file
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for length in (1, 5, 16, 33):  # the sequence stays dynamic; odd lengths too
        x = np.random.default_rng(length).standard_normal((2, length, 12)).astype("float32")
        (got,) = session.run(None, {session.get_inputs()[0].name: x})
        np.testing.assert_allclose(got, np.fft.fft2(x).real, atol=2e-5 * length, rtol=1e-4)
    assert not any(node.op_type in ("DFT", "Loop") for node in onnx.load(str(path)).graph.node)


def test_a_sine_table_of_the_other_sign_fails_validation(mixing_file, tmp_path):
    model, path = mixing_file
    proto = onnx.load(str(path))
    angles = 2 * np.pi * (np.outer(np.arange(12), np.arange(12)) % 12) / 12
    flipped = 0
    for tensor in proto.graph.initializer:
        value = numpy_helper.to_array(tensor)
        if value.shape == (12, 12) and np.allclose(value, np.sin(angles), atol=1e-6):
            tensor.CopyFrom(numpy_helper.from_array(-value, tensor.name))
            flipped += 1
    assert flipped == 1
    onnx.save(proto, str(tmp_path / "flipped.onnx"))
    with pytest.raises(ValidationFailed, match="max abs diff"):
        validate(model, tmp_path / "flipped.onnx")


@pytest.mark.parametrize("name", ["FNetBackbone", "FNetTextClassifier"])
def test_keras_hub_fnet_exports_with_the_default_flags(name, tmp_path):
    report = export_model(zoo_models.build(name), tmp_path / f"{name}.onnx")
    assert report["passed"]
