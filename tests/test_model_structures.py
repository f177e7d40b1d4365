"""Models written the other ways Keras allows keep their inputs and names (#45, 8-9).

A `keras.Sequential` model built from a named `keras.Input` exports with the
input's and the last layer's names, as the same model written functionally
does; a subclassed model called on a list of inputs (keras.io's speech
Transformer calls `model([source, target])`) exports with one input each,
from memory and from its `.keras` file.
"""

import keras
import numpy as np
import onnx
import pytest

from keras_layers.export import ExportOptions, export_model

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

SHAPES = [(1, 3), (2, 5)]


def _sequential() -> keras.Model:
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input(shape=(None,), dtype="int32", name="token_ids"),
            keras.layers.Embedding(20, 8),
            keras.layers.Dense(5, name="logits"),
        ]
    )


@keras.saving.register_keras_serializable("tests.model_structures")
class SourceTarget(keras.Model):
    """keras.io's speech Transformer's shape of call: `source, target = inputs`."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.source_projection = keras.layers.Dense(8)
        self.target_embedding = keras.layers.Embedding(20, 8)
        self.classifier = keras.layers.Dense(20)

    def call(self, inputs):
        source, target = inputs
        memory = keras.ops.mean(self.source_projection(source), axis=1, keepdims=True)
        return self.classifier(self.target_embedding(target) + memory)


def _names(path) -> tuple[list, list]:
    graph = onnx.load(str(path)).graph
    return [v.name for v in graph.input], [v.name for v in graph.output]


@pytest.mark.parametrize("from_file", [False, True])
def test_a_sequential_model_keeps_its_input_and_output_names(tmp_path, from_file):
    model = _sequential()
    if from_file:
        model.save(tmp_path / "sequential.keras")
        model = tmp_path / "sequential.keras"
    report = export_model(model, tmp_path / "sequential.onnx", ExportOptions(shapes=SHAPES))
    assert report["passed"]
    assert _names(tmp_path / "sequential.onnx") == (["token_ids"], ["logits"])


@pytest.mark.parametrize("from_file", [False, True])
def test_a_subclassed_model_called_on_a_list_has_one_input_each(tmp_path, from_file):
    keras.utils.set_random_seed(0)
    model = SourceTarget()
    model([np.zeros((2, 6, 4), "float32"), np.zeros((2, 3), "int32")])
    if from_file:
        model.save(tmp_path / "source_target.keras")
        model = tmp_path / "source_target.keras"
    report = export_model(model, tmp_path / "source_target.onnx", ExportOptions(shapes=SHAPES))
    assert report["passed"]
    roles = [(entry["dtype"], entry["role"]) for entry in report["inputs"]]
    assert roles == [("float32", "features"), ("int32", "ids")]
