"""`fusions.fuse_rms_norms`: keras-hub's RMS norms become `SimplifiedLayerNormalization`.

Checked on the models that use them, with their scales as initialised (ones,
which onnxslim folds away) and redrawn (the scale `Mul` stays), against Keras
by the export's own validation and against a NumPy formula written here; and
on hand-built graphs the rule must leave alone.
"""

import keras
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from keras_layers.export import ExportOptions, export_model, fusions
from tests import zoo_models

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow


def llama(redrawn: bool):
    import keras_hub

    keras.utils.set_random_seed(0)
    model = keras_hub.models.LlamaBackbone(
        vocabulary_size=64,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
    )
    return zoo_models.redraw(model) if redrawn else model


@pytest.mark.parametrize("redrawn", [False, True], ids=["initial scales", "redrawn scales"])
def test_every_rms_norm_of_llama_is_fused_and_the_export_matches_keras(redrawn, tmp_path):
    path = tmp_path / "llama.onnx"
    report = export_model(llama(redrawn), path, ExportOptions(shapes=[(2, 16), "padded"]))
    assert report["passed"]
    ops = [node.op_type for node in onnx.load(path).graph.node]
    # Two per layer and the final one.
    assert report["graph"]["fused"]["SimplifiedLayerNormalization"] == 5
    assert ops.count("SimplifiedLayerNormalization") == 5
    assert "ReduceMean" not in ops and "Sqrt" not in ops


def rms_graph(axis=-1, exponent=2.0, scale=True, epsilon=1e-6):
    """x * 1/sqrt(mean(x^2) + eps) [* scale], as tf2onnx writes it."""
    nodes = [
        helper.make_node("Pow", ["x", "two"], ["square"]),
        helper.make_node("ReduceMean", ["square", "axes"], ["mean"], keepdims=1),
        helper.make_node("Add", ["mean", "eps"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["root"]),
        helper.make_node("Reciprocal", ["root"], ["inverse"]),
        helper.make_node("Mul", ["x", "inverse"], ["normed" if scale else "y"]),
    ]
    rng = np.random.default_rng(0)
    initializers = [
        numpy_helper.from_array(np.array(exponent, np.float32), "two"),
        numpy_helper.from_array(np.array([axis], np.int64), "axes"),
        numpy_helper.from_array(np.array(epsilon, np.float32), "eps"),
    ]
    if scale:
        gain = (1 + 0.5 * rng.standard_normal(8)).astype(np.float32)
        nodes.append(helper.make_node("Mul", ["normed", "gain"], ["y"]))
        initializers.append(numpy_helper.from_array(gain, "gain"))
    graph = helper.make_graph(
        nodes,
        "rms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, 8])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def run(proto, x):
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("scale", [True, False])
def test_the_fused_node_computes_the_formula(scale):
    proto = rms_graph(scale=scale)
    x = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32) * 3
    gain = numpy_helper.to_array(proto.graph.initializer[-1]) if scale else 1.0
    expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * gain

    assert fusions.fuse_rms_norms(proto, fusions.tensor_shapes(proto)) == 1

    assert [node.op_type for node in proto.graph.node][-1] == "SimplifiedLayerNormalization"
    np.testing.assert_allclose(run(proto, x), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"axis": 1}, "not over the last axis"),
        ({"exponent": 3.0}, "not of x * x or x ** 2"),
    ],
)
def test_other_reductions_are_left_alone_with_the_reason(change, reason):
    proto = rms_graph(**change)
    declined = []
    assert fusions.fuse_rms_norms(proto, fusions.tensor_shapes(proto), declined) == 0
    assert reason in declined[0][1]
