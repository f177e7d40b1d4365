"""Speech to text: keras-hub's `MoonshineAudioToText` as a `--task seq2seq-lm` folder.

Moonshine's encoder reads a waveform (batch, samples, 1) and its strided
convolutions leave fewer frames than samples, so the mask the decoder's
cross-attention reads is the encoder's own over its frames: the encoder's
file returns it (`encoder_attention_mask`) beside the cross-attention keys
and values. Its cached call takes one token at a time and projects the
cross-attention keys and values outside it (`seq2seq.AudioEncoderCalls`
calls its layers as its own `_build_cache` does). The folder's greedy tokens
are held to keras-hub's own `generate_step` on waveforms of three lengths in
one padded batch.
"""

import numpy as np
import pytest

from keras_layers.export import Seq2SeqFolder, generate
from keras_layers.export.seq2seq_folder import keras_greedy
from tests import seq2seq_media

pytestmark = [
    pytest.mark.tensorflow_only,  # the export pipeline runs on TensorFlow
    pytest.mark.zoo,  # a zoo model's folder (half a minute): the zoo tier runs it
    pytest.mark.xdist_group("seq2seq_speech"),  # module fixtures: one worker (loadgroup)
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return seq2seq_media.exported("MoonshineAudioToText", tmp_path_factory.mktemp("speech"))


@pytest.fixture(scope="module")
def moonshine(exported):
    return exported[0]


@pytest.fixture(scope="module")
def folder(exported):
    return exported[1:]


def _waves(lengths=(3000, 1900), seed=3):
    rng = np.random.default_rng(seed)
    mask = np.arange(max(lengths)) < np.array(lengths)[:, None]
    return (rng.uniform(-1, 1, mask.shape) * mask).astype("float32"), mask


def test_the_folder_reads_waveforms_and_returns_the_frames_mask(folder):
    path, report = folder
    assert report["passed"] and report["generation"]["ids"]["equal"]
    assert report["config"]["encoder_input"] == "audio"
    assert report["config"]["audio_channels"] == 1
    inputs = {entry["name"]: entry for entry in report["encoder"]["inputs"]}
    assert inputs["input_values"]["role"] == "audio"
    assert inputs["attention_mask"]["shape"] == ["batch", "samples"]
    waves, mask = _waves()
    _cross, frames = Seq2SeqFolder(path).encode(waves[..., None], mask)
    assert frames.shape[1] < waves.shape[1] // 100  # frames, not samples
    assert frames.sum(axis=1).tolist()[0] > frames.sum(axis=1).tolist()[1]


def test_generate_on_waveforms_gives_keras_hubs_greedy_tokens(moonshine, folder):
    """Two waveforms of other lengths than the proof's, padded in one batch,
    given as (batch, samples): the channel axis is the folder's to add."""
    path, _ = folder
    waves, mask = _waves()
    start = np.array([[1], [1]], "int32")
    feeds = {"encoder_input_values": waves, "encoder_padding_mask": mask}
    feeds["decoder_token_ids"] = start
    tokens = generate(path, feeds, 7)
    expected = keras_greedy(moonshine, waves[..., None], mask, start, 7, None)
    assert tokens[:, 1:].tolist() == expected


def test_the_decoder_check_fails_a_folder_fed_the_samples_mask(moonshine, folder):
    """The composed check with the encoder file's frames mask passes; with
    every frame marked valid (the padded rows' silence attended to) it fails."""
    passed, unmasked, frames = seq2seq_media.unmasked_check(moonshine, folder[0])
    assert passed and not unmasked
    assert frames.sum(axis=1).min() < frames.shape[1]  # the batch pads frames


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("hello", "reads waveforms, not text"),
        (np.ones((1, 800), "int32"), "the folder's encoder reads waveforms; give float32"),
        (np.ones((1, 800, 2), "float32"), r"of shape \(1, 800, 2\).*\(batch, samples, 1\)"),
        (np.full((1, 900), np.nan, "float32"), r"token_ids\[0\] holds a NaN"),
        (np.zeros((1, 300), "float32"), r"token_ids\[0\] holds 300 samples.*fewer than"),
        ({"encoder_token_ids": np.ones((1, 3), "int32")}, "encoder_input_values at least"),
    ],
)
def test_generate_refuses_what_a_speech_folder_cannot_take(folder, given, message):
    path, _ = folder
    with pytest.raises(ValueError, match=message):
        generate(path, given, 3)
