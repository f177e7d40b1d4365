"""Spectra in the file: `RFFT` (and `tf.signal.stft`) as the product by the
DFT's matrix (`op_handlers.rfft`).

tf2onnx 1.17 leaves `RFFT` and the ops reading its complex result
(`ComplexAbs`, `Real`, `Imag`) unconverted, so keras-hub's Whisper audio
converter (log-mel features of a 400-sample STFT) and anything built on
`keras.ops.rfft` failed to export. The oracle here is NumPy in float64:
`numpy.fft.rfft` for the matrix, and Whisper's log-mel written from its
recipe (reflect padding, Hann window, |STFT|^2 dropping the last frame, the
mel filters, log10 clamped at 1e-10 and at the maximum - 8, (x + 4) / 4).
"""

import keras
import keras_hub
import numpy as np
import onnxruntime as ort
import pytest

from keras_layers.export import export_model
from keras_layers.export.op_handlers import _dft_matrix

pytestmark = [pytest.mark.tensorflow_only]


@pytest.mark.parametrize("size, length", [(400, 400), (300, 400), (512, 400), (64, 64)])
def test_the_dft_matrix_is_numpys_rfft(size, length):
    frames = np.random.default_rng(0).standard_normal((5, size))
    spectrum = frames @ _dft_matrix(size, length).astype("float64")
    expected = np.fft.rfft(frames, n=length, axis=-1)  # zero-padded or cropped to length
    bins = length // 2 + 1
    np.testing.assert_allclose(spectrum.reshape(5, bins, 2)[..., 0], expected.real, atol=1e-4)
    np.testing.assert_allclose(spectrum.reshape(5, bins, 2)[..., 1], expected.imag, atol=1e-4)


def _log_mel(converter, audio: np.ndarray) -> np.ndarray:
    """Whisper's features in float64, from its recipe."""
    from keras_hub.src.models.whisper.whisper_audio_converter import frame_signal

    padded = np.zeros((audio.shape[0], converter.num_samples))
    padded[:, : audio.shape[1]] = audio
    padded = np.pad(padded, ((0, 0), (200, 200)), mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(400) / 400)  # periodic Hann
    frames = frame_signal(padded, 400, converter.stride) * window
    power = np.abs(np.fft.rfft(frames, n=400, axis=-1)[:, :-1, :]) ** 2
    log = np.log10(np.maximum(power @ converter.mel_filters.astype("float64"), 1e-10))
    log = np.maximum(log, log.max(axis=(1, 2), keepdims=True) - 8)
    return (log + 4) / 4


def test_whispers_audio_converter_exports_and_computes_its_log_mel(tmp_path):
    converter = keras_hub.layers.WhisperAudioConverter()
    audio = keras.Input((None,), name="audio")
    report = export_model(keras.Model(audio, converter(audio)), tmp_path / "features.onnx")
    assert report["passed"]
    session = ort.InferenceSession(str(tmp_path / "features.onnx"))
    waves = np.random.default_rng(1).uniform(-1, 1, (2, 16000)).astype("float32")  # 1 s
    (features,) = session.run(None, {"audio": waves})
    assert features.shape == (2, 3000, 80)
    # As close to float64 as TensorFlow's own FFT (2.5e-7); ONNX's DFT op was 1.2e-4 off.
    np.testing.assert_allclose(features, _log_mel(converter, waves), atol=5e-6, rtol=0)


def test_keras_ops_rfft_exports_its_real_and_imaginary_parts(tmp_path):
    keras.utils.set_random_seed(0)
    frames = keras.Input((None, 64), name="frames")
    real, imaginary = keras.ops.rfft(frames)
    spectrum = keras.ops.concatenate([real, imaginary], axis=-1)
    model = keras.Model(frames, keras.layers.Dense(3, name="scores")(spectrum))
    assert export_model(model, tmp_path / "rfft.onnx")["passed"]
    session = ort.InferenceSession(str(tmp_path / "rfft.onnx"))
    x = np.random.default_rng(2).standard_normal((2, 5, 64)).astype("float32")
    (got,) = session.run(None, {"frames": x})
    kernel, bias = (np.asarray(w, "float64") for w in model.get_layer("scores").weights)
    expected = np.fft.rfft(x.astype("float64"), axis=-1)
    expected = np.concatenate([expected.real, expected.imag], axis=-1) @ kernel + bias
    np.testing.assert_allclose(got, expected, atol=1e-4)
