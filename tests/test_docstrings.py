"""Every example in the public docstrings runs and prints what it says."""

import doctest
import importlib

import pytest

MODULES = [
    "keras_layers.scaled_embedding",
    "keras_layers.sinusoidal_position_encoding",
    "keras_layers.tied_output_dense",
    "keras_layers.demo.encoder",
    "keras_layers.demo.decoder",
    # The export pipeline runs on TensorFlow.
    pytest.param("keras_layers.export.pipeline", marks=pytest.mark.tensorflow_only),
    # Checking the opset asks tf2onnx, which imports TensorFlow.
    pytest.param("keras_layers.export.options", marks=pytest.mark.tensorflow_only),
    # Exports a decoder first (module docstring), then generates from it.
    pytest.param("keras_layers.export.generation", marks=pytest.mark.tensorflow_only),
    # Writes and proves a WordPiece tokenizer's files (keras-hub's tokenizer runs on TF).
    pytest.param("keras_layers.export.tokenizer_files.gate", marks=pytest.mark.tensorflow_only),
    # Builds a tiny BART and its encoder's side.
    pytest.param("keras_layers.export.seq2seq", marks=pytest.mark.tensorflow_only),
    # Exports a tiny BART as a seq2seq folder and proves it (ten seconds).
    pytest.param("keras_layers.export.seq2seq_folder", marks=pytest.mark.tensorflow_only),
    # Exports a tiny BART's folder, then generates from it twice with one
    # Seq2SeqFolder (ten seconds; seq2seq_folder's example already exports one
    # in the default run): the slow tier.
    pytest.param(
        "keras_layers.export.seq2seq_generation",
        marks=[pytest.mark.tensorflow_only, pytest.mark.slow],
    ),
    # Exports a decoder as a genai folder (half a minute): the slow tier.
    pytest.param(
        "keras_layers.export.genai_folder",
        marks=[pytest.mark.tensorflow_only, pytest.mark.slow],
    ),
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, extraglobs={"tmp": tmp_path})
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
