"""The conformance set: public example models, written as their authors wrote them.

Each model of `tests/conformance/` (keras.io examples, the TensorFlow
Transformer tutorial; its package docstring says why these) is built and
trained a few steps, saved as a `.keras` file and loaded back, which must give
the outputs it gave before saving. Its export with the default flags, from
that file, and the mutants of the file are
`tests/test_mutants.py::test_conformance_validation_fails_every_mutant`, which
fails when the export does not pass (one export per model for both).

Marked `conformance`, which the default run leaves out:
`python -m pytest -m conformance`.
"""

import time

import keras
import numpy as np
import pytest

from tests import conformance

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.tensorflow_only,  # the export pipeline runs on TensorFlow
    # The examples' own Keras warnings (masks their custom layers drop, a loss
    # from_logits on softmax outputs): the models are kept as written.
    pytest.mark.filterwarnings("ignore::UserWarning:keras.*"),
]

SAMPLE_ROWS = 4


def _sample(module):
    """The first rows of the model's training inputs."""
    return keras.tree.map_structure(lambda array: array[:SAMPLE_ROWS], module.training_data()[0])


def _outputs(model, inputs) -> list[np.ndarray]:
    # In inference mode, as the export traces it: Keras 3's random
    # augmentation layers (`RandomFlip`, ... in the ViT example's model)
    # default to `training=True` when the model is called without it.
    outputs = model(inputs, training=False)
    return [keras.ops.convert_to_numpy(x) for x in keras.tree.flatten(outputs)]


@pytest.mark.parametrize("name", list(conformance.MODELS))
def test_round_trips_through_a_keras_file(name, tmp_path, record_property):
    module = conformance.MODELS[name]
    record_property("source", module.SOURCE)

    start = time.perf_counter()
    model = module.build()
    record_property("build_seconds", round(time.perf_counter() - start, 2))

    path = tmp_path / f"{name}.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    sample = _sample(module)
    for before, after in zip(_outputs(model, sample), _outputs(loaded, sample), strict=True):
        np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)
