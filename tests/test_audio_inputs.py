"""Waveform inputs read from the model: the role, the samples axis, the lengths.

A plain Keras speech front end (a strided `Conv1D` over raw samples) and
keras-hub's Moonshine backbone (16 kHz samples through a stride-64 `Conv1D`,
beside a padding mask and the decoder's tokens), built tiny with redrawn
weights. Before, Moonshine was fed one sample: "the model fails in Keras
itself on the generated input".
"""

import keras
import keras_hub
import numpy as np
import pytest
import zoo_models

from keras_layers.export import export_model, loading, validating

pytestmark = [pytest.mark.tensorflow_only, pytest.mark.xdist_group("audio_inputs")]


def _front_end():
    """A waveform of any length, `(batch, samples, 1)`, through a strided
    convolution of 16 samples: it takes 16 samples at least."""
    keras.utils.set_random_seed(0)
    wave = keras.Input(shape=(None, 1))
    hidden = keras.layers.Conv1D(8, 16, strides=4, activation="gelu")(wave)
    hidden = keras.layers.Conv1D(8, 3, strides=2)(hidden)
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    return keras.Model(wave, keras.layers.Dense(3, name="scores")(pooled))


def test_a_waveform_is_audio_on_a_samples_axis_from_the_fewest_it_takes(tmp_path):
    model = _front_end()
    report = export_model(model, tmp_path / "wave.onnx")
    assert report["passed"]
    (wave,) = report["inputs"]
    assert (wave["name"], wave["role"]) == ("inputs", "audio")
    assert wave["shape"] == ["batch", "samples", 1]
    assert "Conv1D" in wave["role_reason"] and "stride 4" in wave["role_reason"]
    labels = {check["shape"] for check in report["checks"]}
    # 16 samples for the first kernel, then 3 frames for the second: 24.
    assert {"1x1, 24 samples", "1x64, 192 samples", "8x256, 768 samples"} <= labels


def test_the_fewest_samples_are_those_keras_runs_and_no_fewer():
    loaded = loading.load(_front_end())
    fewest = validating.fewest_samples(loaded)
    assert fewest == 24
    with pytest.raises(ValueError):  # one sample fewer: the second kernel has nothing
        model = loaded.model
        model(np.zeros((1, fewest - 1, 1), "float32"))


@pytest.mark.slow  # an encoder-decoder export: about 30 s
def test_moonshine_is_fed_waveforms_it_takes_with_their_mask_on_the_samples_axis(tmp_path):
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.MoonshineBackbone(
        vocabulary_size=64,
        filter_dim=16,
        encoder_num_layers=2,
        decoder_num_layers=2,
        hidden_dim=16,
        intermediate_dim=32,
        encoder_num_heads=2,
        decoder_num_heads=2,
        max_position_embeddings=64,
    )
    report = export_model(zoo_models.redraw(backbone), tmp_path / "moonshine.onnx")
    assert report["passed"]
    roles = {info["name"]: (info["role"], info["shape"][1]) for info in report["inputs"]}
    assert roles["encoder_input_values"] == ("audio", "samples")
    assert roles["encoder_padding_mask"] == ("padding_mask", "samples")
    assert roles["decoder_token_ids"] == ("ids", "decoder_sequence")
    assert any(check["shape"] == "padded" for check in report["checks"])
