"""Speech to text: keras-hub's `WhisperBackbone` as a `--task seq2seq-lm` folder.

keras-hub's Whisper has no `generate` and no cached calls: the export runs
its layers as its functional graph does, with keras-hub's decoder caches
(`seq2seq.FeatureEncoderCalls`), and the folder's greedy tokens are held to
the backbone's own forward pass, rerun on every token so far at each step
(`seq2seq_folder.protocol_greedy` through `forward_logits`), so the adapter
the files were traced through answers to code it did not write. A model
whose encoder takes 30 s of features (3000 frames, as every Whisper does)
also gets onnxruntime-genai's `whisper` folder (`genai/`), proved by running
genai itself on the same features.
"""

import numpy as np
import pytest

from keras_layers.export import ValidationFailed, export_model, generate, seq2seq, whisper_folder
from keras_layers.export.seq2seq_folder import protocol_greedy
from tests import zoo_models

pytestmark = [
    pytest.mark.tensorflow_only,  # the export pipeline runs on TensorFlow
    pytest.mark.zoo,  # a zoo model's folders (a minute): the zoo tier runs them
    pytest.mark.xdist_group("seq2seq_whisper"),  # module fixtures: one worker (loadgroup)
]

MELS = 8
PROMPT = [[1, 2]] * 3


def _whisper(frames: int = whisper_folder.FRAMES):
    """A tiny Whisper whose encoder table holds `frames` frames, weights
    redrawn (N(0, 0.2): keras-hub's own initialiser leaves every row the same
    tokens, whatever its features)."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(zoo_models.SEED)
    backbone = keras_hub.models.WhisperBackbone(
        vocabulary_size=96,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        num_mels=MELS,
        max_encoder_sequence_length=frames,
        max_decoder_sequence_length=32,
    )
    return zoo_models.redraw(backbone)


def _features(lengths=(3000, 1800, 900), seed=5):
    rng = np.random.default_rng(seed)
    mask = np.arange(max(lengths)) < np.array(lengths)[:, None]
    return (rng.normal(size=(*mask.shape, MELS)) * mask[..., None]).astype("float32"), mask


@pytest.fixture(scope="module")
def whisper():
    return _whisper()


@pytest.fixture(scope="module")
def folder(whisper, tmp_path_factory):
    path = tmp_path_factory.mktemp("whisper") / "folder"
    return path, export_model(whisper, f"{path}/", task="seq2seq-lm")


def test_the_cached_calls_give_the_backbones_own_forward_logits(whisper):
    """The adapter, step by step (a 2-token prompt, then one token a call),
    against the backbone's functional forward pass on the whole sequence."""
    features, mask = _features((3000, 3000), seed=1)
    ids = np.array([[1, 5, 7, 9, 3], [1, 4, 4, 2, 8]], "int32")
    calls = seq2seq.protocol(whisper)
    expected = np.asarray(calls.forward_logits(features, ids))
    hidden, frames = calls.call_encoder_with_mask(features, mask)
    assert tuple(frames.shape) == (2, 1500)  # the stride-2 convolution halves the frames
    own, cross = calls._initialize_cache(np.zeros((2, 1500), "int32"), ids)
    logits, _, own, cross = calls.call_decoder_with_cache(
        hidden, frames, ids[:, :2], own, 0, cross, 0
    )
    steps = [np.asarray(logits)]
    for index in range(2, 5):
        step = calls.call_decoder_with_cache(
            hidden, frames, ids[:, index : index + 1], own, index, cross, None
        )
        logits, _, own, cross = step
        steps.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), expected, atol=1e-5, rtol=1e-4)


def test_the_folder_generates_the_backbones_greedy_tokens_in_ort_and_in_genai(folder):
    path, report = folder
    assert report["passed"]
    proof = report["generation"]
    assert proof["ids"]["equal"] and proof["genai"]["equal"]
    assert proof["ids"]["reference"] == "the model's forward pass"
    assert proof["genai"]["onnx"] == proof["ids"]["keras"]
    assert len({tuple(row) for row in proof["ids"]["keras"]}) > 1  # the rows' features matter
    assert report["genai"] == {
        "written": True,
        "folder": "genai",
        "files": ["decoder.onnx", "encoder.onnx", "genai_config.json"],
        "proved_in_genai": True,
    }
    assert report["config"]["max_encoder_length"] == whisper_folder.FRAMES
    assert report["config"]["audio_channels"] == MELS


def test_generate_from_the_folder_gives_the_forward_passes_tokens(whisper, folder):
    path, _ = folder
    features, mask = _features()
    prompts = np.array(PROMPT, "int32")
    tokens = generate(
        path,
        {
            "encoder_input_values": features,
            "encoder_padding_mask": mask,
            "decoder_token_ids": prompts,
        },
        max_new_tokens=6,
    )
    expected = protocol_greedy(whisper, features, mask, prompts, 6, None)
    assert tokens[:, 2:].tolist() == expected


def test_genai_runs_the_folder_as_whisper(whisper, folder):
    path, _ = folder
    features, mask = _features(seed=9)
    prompts = np.array(PROMPT, "int32")
    got = whisper_folder.genai_tokens(path / "genai", features, prompts, 6)
    assert got == protocol_greedy(whisper, features, mask, prompts, 6, None)


def test_more_frames_than_the_encoder_table_is_a_value_error_naming_the_limit(folder):
    path, _ = folder
    features, mask = _features((3001, 20))
    with pytest.raises(ValueError, match="3001 samples .*holds 3000"):
        inputs = {"encoder_input_values": features, "encoder_padding_mask": mask}
        generate(path, {**inputs, "decoder_token_ids": np.array(PROMPT[:2], "int32")}, 2)


def test_a_genai_decoder_that_prefers_a_token_fails_the_proof_and_places_nothing(
    whisper, tmp_path, monkeypatch
):
    """The genai part of the proof compares tokens: a decoder whose logits
    favour one token (+3 on id 7) must fail it, and the folder is not written."""
    import onnx
    from onnx import helper

    write = whisper_folder.write

    def biased(*args):
        written = write(*args)
        target = args[2] / whisper_folder.DECODER
        model = onnx.load(str(target))
        graph = model.graph
        bias = np.zeros(96, "float32")
        bias[7] = 3.0
        graph.initializer.append(onnx.numpy_helper.from_array(bias, "mutant/bias"))
        for node in graph.node:
            node.output[:] = ["mutant/logits" if name == "logits" else name for name in node.output]
        graph.node.append(helper.make_node("Add", ["mutant/logits", "mutant/bias"], ["logits"]))
        onnx.save(model, str(target))
        return written

    monkeypatch.setattr(whisper_folder, "write", biased)
    target = tmp_path / "mutant"
    with pytest.raises(ValidationFailed, match="genai"):
        export_model(whisper, f"{target}/", task="seq2seq-lm")
    assert not target.exists()


def test_without_genai_installed_the_folder_is_written_and_says_it_is_unproved(
    whisper, tmp_path, monkeypatch
):
    from keras_layers.export import seq2seq_folder

    monkeypatch.setattr(seq2seq_folder, "_genai_installed", lambda: False)
    report = export_model(whisper, f"{tmp_path}/folder/", task="seq2seq-lm")
    assert report["passed"] and "genai" not in report["generation"]
    assert report["genai"]["proved_in_genai"] is False
    assert report["genai"]["not_proved"].startswith("onnxruntime-genai is not installed")
    assert (tmp_path / "folder" / whisper_folder.FOLDER / "genai_config.json").is_file()


def test_an_encoder_of_another_length_gets_no_genai_folder_and_says_why(tmp_path):
    report = export_model(_whisper(64), f"{tmp_path / 'short'}/", task="seq2seq-lm")
    assert report["passed"] and "genai" not in report["generation"]
    assert report["genai"]["written"] is False
    assert "exactly 3000 feature frames" in report["genai"]["why_not"]
    assert not (tmp_path / "short" / "genai").exists()


def test_the_command_line_exports_a_saved_whisper_and_says_genai_ran_it(
    whisper, tmp_path, capsys, monkeypatch
):
    """A `.keras` file, as a user has one: loaded, recognised as Whisper by
    its layers, exported with its genai folder, which the command reports."""
    from keras_layers.export import cli

    monkeypatch.setenv("COLUMNS", "1000")  # rich folds long paths mid-word at its width
    path = tmp_path / "whisper.keras"
    whisper.save(path)
    assert cli.main([str(path), "--task", "seq2seq-lm", "-o", f"{tmp_path}/out/"]) == 0
    said = capsys.readouterr().out
    assert "genai/ (whisper), its greedy tokens = keras-hub's, run in onnxruntime-genai" in said
    assert (tmp_path / "out" / "genai" / whisper_folder.CONFIG).is_file()
