"""Every example in the public docstrings runs and prints what it says."""

import doctest
import importlib

import pytest

MODULES = [
    "keras_layers.scaled_embedding",
    "keras_layers.sinusoidal_position_encoding",
    "keras_layers.tied_output_dense",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
