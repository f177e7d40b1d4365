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


@keras.saving.register_keras_serializable("tests.model_structures")
class DictCalled(keras.Model):
    """A subclassed model called on a dict, as keras-hub's task models and
    `examples/translate.py`'s `Translator` are."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embedding = keras.layers.Embedding(20, 8)
        self.classifier = keras.layers.Dense(5)

    def call(self, inputs):
        mask = keras.ops.cast(inputs["padding_mask"], "float32")[..., None]
        return self.classifier(self.embedding(inputs["token_ids"]) * mask)


@pytest.mark.parametrize("from_file", [False, True])
def test_a_subclassed_model_called_on_a_dict_has_one_input_a_key(tmp_path, from_file):
    keras.utils.set_random_seed(0)
    model = DictCalled()
    model({"token_ids": np.zeros((2, 3), "int32"), "padding_mask": np.ones((2, 3), "int32")})
    if from_file:
        model.save(tmp_path / "dict_called.keras")
        model = tmp_path / "dict_called.keras"
    report = export_model(model, tmp_path / "dict_called.onnx", ExportOptions(shapes=SHAPES))
    assert report["passed"]
    assert _names(tmp_path / "dict_called.onnx")[0] == ["token_ids", "padding_mask"]


def _nested_outputs() -> keras.Model:
    """keras-hub's D-FINE returns a dict whose values may be tuples of tensors."""
    keras.utils.set_random_seed(0)
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(20, 8)(ids)
    first = keras.layers.Dense(8, name="first")(x)
    second = keras.layers.Dense(8, name="second")(first)
    pooled = keras.layers.GlobalAveragePooling1D()(second)
    return keras.Model(ids, {"logits": pooled, "hidden": (first, second)})


@pytest.mark.parametrize("from_file", [False, True], ids=["in memory", "from its file"])
def test_an_output_dict_holding_a_tuple_has_one_output_per_tensor(tmp_path, from_file):
    """Each tensor of the tuple is an output of its own, named by its key and
    position, and each is checked against Keras' (a wrong one fails)."""
    model = _nested_outputs()
    source = model
    if from_file:
        source = tmp_path / "nested.keras"
        model.save(source)
    report = export_model(source, tmp_path / "nested.onnx", ExportOptions(shapes=SHAPES))
    assert report["passed"]
    graph = onnx.load(str(tmp_path / "nested.onnx")).graph
    names = [value.name for value in graph.output]
    assert sorted(names) == ["hidden_0", "hidden_1", "logits"]
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp_path / "nested.onnx"))
    ids = np.array([[3, 1, 4, 1, 5]], "int32")
    got = dict(zip(names, session.run(None, {"token_ids": ids}), strict=True))
    expected = model(ids)
    np.testing.assert_allclose(got["hidden_1"], np.asarray(expected["hidden"][1]), atol=1e-5)
    np.testing.assert_allclose(got["hidden_0"], np.asarray(expected["hidden"][0]), atol=1e-5)
    np.testing.assert_allclose(got["logits"], np.asarray(expected["logits"]), atol=1e-5)


def test_an_input_no_output_reads_stays_an_input_of_the_file(tmp_path):
    """keras-hub's Stable Diffusion 3 tasks take inputs their outputs do not
    read; tf2onnx drops them, and a caller feeding the model's inputs was
    refused ("Invalid input name"). The file declares it, in the model's order."""
    keras.utils.set_random_seed(0)
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    unread = keras.Input(shape=(None, None, 3), name="images")
    logits = keras.layers.Dense(2)(keras.layers.Embedding(10, 4)(ids))
    model = keras.Model({"token_ids": ids, "images": unread}, logits)
    report = export_model(model, tmp_path / "unread.onnx", ExportOptions(shapes=SHAPES))
    assert report["passed"]
    assert any("'images': no output of the model reads it" in w for w in report["warnings"])
    graph = onnx.load(str(tmp_path / "unread.onnx")).graph
    assert sorted(value.name for value in graph.input) == ["images", "token_ids"]
    import onnxruntime as ort

    session = ort.InferenceSession(str(tmp_path / "unread.onnx"))
    feed = {
        "token_ids": np.array([[1, 2, 3]], "int32"),
        "images": np.zeros((1, 4, 4, 3), "float32"),
    }
    (got,) = session.run(None, feed)
    np.testing.assert_allclose(got, np.asarray(model(feed)), atol=1e-6)
