"""Fusions on the forms Keras' own layers take in public example code.

keras.io's examples and the TensorFlow Transformer tutorial (tests/conformance/)
call `MultiHeadAttention(dropout=...)` without a mask and normalise a feature
axis of size 1; each form is exported here from `keras.layers` alone, at tiny
sizes, and must fuse and pass the export's own validation. Beside each, a
graph that only looks like the form is shown declined, with its reason where
the rule gives one.
"""

import keras
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from keras_layers.export import ExportOptions, export_model, fusions
from keras_layers.export.graph import remove_dead_nodes
from keras_layers.export.passes.context import Context
from keras_layers.export.passes.fusions import layer_norm
from tests.test_fusions_keras_hub import _model, _tensor

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

SHAPES = [(2, 5)]


def _export(model, tmp_path):
    path = tmp_path / "model.onnx"
    report = export_model(model, path, ExportOptions(shapes=SHAPES))
    return report, [node.op_type for node in onnx.load(str(path)).graph.node]


def _self_attention(features_shape, **arguments):
    keras.utils.set_random_seed(0)
    x = keras.Input(features_shape)
    y = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, **arguments)(x, x)
    return keras.Model(x, y)


@pytest.mark.parametrize(
    "arguments",
    [{"dropout": 0.1}, {"dropout": 0.1, "attention_axes": (1,)}, {"attention_axes": (1,)}],
    ids=["dropout", "dropout, default axes given", "default axes given"],
)
def test_attention_without_a_mask_is_fused_and_validates(arguments, tmp_path):
    """With dropout and no mask, Keras' einsum path reaches ONNX with the
    softmax over axis 2 and the product's transpose after it (tf2onnx's
    transpose optimizer moves it there); the default attention axes given
    explicitly give the graph they give by default."""
    report, ops = _export(_self_attention((None, 8), **arguments), tmp_path)
    assert report["passed"], report["worst"]
    assert report["graph"]["fused"]["MultiHeadAttention"] == 1
    assert "MultiHeadAttention" not in report["graph"]["declined"]
    assert "Softmax" not in ops


@pytest.mark.slow  # 25 s: a model of attention over two axes, exported
def test_attention_over_two_axes_is_declined_with_its_reason(tmp_path):
    """2-D attention over (1, 2) of a 4-D input normalises two key axes at
    once: Keras writes that softmax as exp(x - logsumexp(x)), which the fused
    op, attending over one axis, does not compute."""
    model = _self_attention((3, 4, 8), attention_axes=(1, 2))
    report, _ = _export(model, tmp_path)
    assert report["passed"], report["worst"]
    assert report["graph"]["fused"]["MultiHeadAttention"] == 0
    reason = (
        "a softmax over 2 axes, exp(x - logsumexp(x)) as Keras writes it "
        "(MultiHeadAttention with attention_axes of several axes): the fused op "
        "attends over one"
    )
    assert report["graph"]["declined"]["MultiHeadAttention"] == {reason: 1}


def _swapped_attention(heads, size, softmax_axis=2, masked=False):
    """Keras' einsum attention without a mask as tf2onnx writes it: the query
    scaled, `MatMul(k^T, q^T)` normalised over axis 2, then transposed."""
    logits = "st"
    nodes = [
        helper.make_node("Mul", ["q", "scale"], ["qs"]),
        helper.make_node("Transpose", ["qs"], ["qt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["kt", "qt"], ["st"]),
    ]
    inputs = [_tensor(n, ["b", f"{n}_len", heads, size]) for n in "qkv"]
    if masked:
        nodes.append(helper.make_node("Where", ["mask", "st", "big"], ["masked"]))
        inputs.append(_tensor("mask", ["b", 1, "k_len", "q_len"], TensorProto.BOOL))
        logits = "masked"
    nodes += [
        helper.make_node("Softmax", [logits], ["probs"], axis=softmax_axis),
        helper.make_node("Transpose", ["probs"], ["pt"], perm=[0, 1, 3, 2]),
        helper.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["pt", "vt"], ["heads"]),
        helper.make_node("Transpose", ["heads"], ["y"], perm=[0, 2, 1, 3]),
    ]
    constants = [("scale", size**-0.5), ("big", -1e9)]
    return _model(nodes, inputs, [_tensor("y", ["b", "q_len", heads, size])], constants)


def test_a_softmax_over_axis_2_then_transposed_is_fused_exactly():
    heads, size = 2, 4
    proto = _swapped_attention(heads, size)
    unfused = ort.InferenceSession(proto.SerializeToString())
    declined = []
    assert fusions.fuse_attention(proto, fusions.tensor_shapes(proto), declined) == 1, declined
    remove_dead_nodes(proto)
    assert "Softmax" not in [node.op_type for node in proto.graph.node]
    fused = ort.InferenceSession(proto.SerializeToString())

    rng = np.random.default_rng(0)
    q = rng.normal(0, 3, (2, 5, heads, size)).astype("float32")  # logits in the tens
    k, v = (rng.normal(0, 3, (2, 7, heads, size)).astype("float32") for _ in "kv")
    logits = np.einsum("btnh,bsnh->bnts", q * np.float32(size**-0.5), k)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    expected = np.einsum("bnts,bsnh->btnh", probs / probs.sum(-1, keepdims=True), v)
    feeds = {"q": q, "k": k, "v": v}
    (got,) = fused.run(None, feeds)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, unfused.run(None, feeds)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("softmax_axis", "masked", "reason"),
    [
        # Over the queries: transposed, the rows would not sum to 1.
        (3, False, "the probabilities do not weigh the values in a MatMul"),
        (
            1,
            False,
            "the softmax is over axis 1 of a rank-4 tensor, not the last, and no "
            "transpose of the last two axes follows it",
        ),
        (2, True, "a mask selects logits that the softmax reads transposed"),
    ],
    ids=["over the queries", "over the heads", "masked"],
)
def test_a_softmax_not_provably_over_the_keys_is_left_alone(softmax_axis, masked, reason):
    proto = _swapped_attention(2, 4, softmax_axis, masked)
    before = proto.SerializeToString()
    declined = []
    assert fusions.fuse_attention(proto, fusions.tensor_shapes(proto), declined) == 0
    assert proto.SerializeToString() == before
    assert [why for _, why in declined] == [reason]


def test_a_softmax_no_matmul_reads_is_declined_as_no_attention():
    nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=-1)]
    proto = _model(nodes, [_tensor("x", ["b", 3])], [_tensor("y", ["b", 3])], [])
    declined = []
    assert fusions.fuse_attention(proto, fusions.tensor_shapes(proto), declined) == 0
    assert declined == [("y", "a softmax that no MatMul reads: not an attention")]


@pytest.mark.parametrize("width", [1, 4])
def test_a_layer_norm_with_gamma_one_is_fused_and_validates(width, tmp_path):
    """keras.io's timeseries Transformer normalises a feature axis of size 1,
    where x - mean(x) is 0, so gamma's gradient is 0 and gamma stays 1;
    onnxslim drops the product by that one, leaving
    `x * R + (-mean(x) * R + beta)`. A product by four ones broadcasts the
    (B, T, 1) root, so it is kept, and the LayerNorm fused as before."""
    keras.utils.set_random_seed(0)
    x = keras.Input((None, width))
    norm = keras.layers.LayerNormalization(epsilon=1e-6)
    y = keras.layers.Dense(3)(norm(x) + x)
    model = keras.Model(x, y)
    norm.beta.assign(np.full(width, 0.5, "float32"))
    report, ops = _export(model, tmp_path)
    assert report["passed"], report["worst"]
    assert report["graph"]["fused"]["LayerNormalization"] == 1
    assert ops.count("LayerNormalization") == 1 and "Sqrt" not in ops


def test_a_group_norm_is_no_layer_norm_and_validates(tmp_path):
    """GroupNormalization (RWKV-7's `ln_x`) normalises `(..., groups,
    width)` over `width` like a LayerNorm but scales by a `(groups, width)`
    gain, which `LayerNormalization(axis=-1)`'s scale cannot hold: fused,
    ONNX Runtime refused the file. It is left unfused and the file
    validates."""
    keras.utils.set_random_seed(0)
    x = keras.Input((8,))  # RWKV-7 flattens (batch, length, features) first
    norm = keras.layers.GroupNormalization(groups=2, epsilon=1e-5)
    model = keras.Model(x, keras.layers.Dense(3)(norm(x)))
    rng = np.random.default_rng(0)
    norm.gamma.assign(rng.normal(1, 0.5, 8).astype("float32"))
    norm.beta.assign(rng.normal(0, 0.5, 8).astype("float32"))
    path = tmp_path / "model.onnx"
    report = export_model(model, path, ExportOptions())
    ops = [node.op_type for node in onnx.load(str(path)).graph.node]
    assert report["passed"], report["worst"]
    assert report["graph"]["fused"]["LayerNormalization"] == 0
    assert "LayerNormalization" not in ops


def _gamma_free_norm(width, centred=True):
    """`x * R + (-mean(x) * R)`, R = 1 / sqrt(mean((x - mean(x))^2) + eps): a
    LayerNorm whose gamma is 1 and beta 0, both dropped, at any width;
    `centred=False` squares x itself (an RMS norm's root)."""
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["mean"], keepdims=1),
        helper.make_node("Sub", ["x", "mean"], ["centred"]),
        helper.make_node("Mul", ["centred" if centred else "x"] * 2, ["square"]),
        helper.make_node("ReduceMean", ["square", "axes"], ["variance"], keepdims=1),
        helper.make_node("Add", ["variance", "eps"], ["shifted"]),
        helper.make_node("Sqrt", ["shifted"], ["root"]),
        helper.make_node("Reciprocal", ["root"], ["r"]),
        helper.make_node("Neg", ["mean"], ["negated"]),
        helper.make_node("Mul", ["x", "r"], ["scaled"]),
        helper.make_node("Mul", ["negated", "r"], ["shift"]),
        helper.make_node("Add", ["scaled", "shift"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [_tensor("x", ["b", "t", width])],
        [_tensor("y", ["b", "t", width])],
        [
            numpy_helper.from_array(np.array([-1], np.int64), "axes"),
            numpy_helper.from_array(np.float32(1e-6), "eps"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _fuse_layer_norms(proto) -> int:
    context = Context.of(proto, shapes=fusions.tensor_shapes(proto))
    return layer_norm.run(proto, context).fused["LayerNormalization"]


def test_a_layer_norm_whose_gamma_was_folded_is_fused_exactly():
    proto = _gamma_free_norm(4)
    assert _fuse_layer_norms(proto) == 1
    remove_dead_nodes(proto)
    assert [node.op_type for node in proto.graph.node] == ["LayerNormalization"]
    x = np.random.default_rng(0).normal(0, 2, (2, 3, 4)).astype("float32")
    (got,) = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})
    centred = x - x.mean(-1, keepdims=True)
    expected = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("width", "centred"),
    [(4, False), ("features", True)],
    ids=["variance of x, not x - mean(x)", "width unknown"],
)
def test_a_gamma_free_form_that_is_no_layer_norm_is_left_alone(width, centred):
    """Without gamma the width of LayerNormalization's scale comes from x's
    static last axis; an unknown one, or a root of mean(x^2), is not fused
    (the LayerNorm rule, whose candidates are every Add, gives no reason)."""
    proto = _gamma_free_norm(width, centred)
    before = proto.SerializeToString()
    assert _fuse_layer_norms(proto) == 0
    assert proto.SerializeToString() == before


def _tanh_read_by(reader):
    nodes = [
        helper.make_node("Tanh", ["x"], ["t"]),
        helper.make_node(reader, ["t", "x"], ["y"]),
    ]
    return _model(nodes, [_tensor("x", ["b", 4])], [_tensor("y", ["b", 4])], [])


def test_a_tanh_no_add_reads_is_no_gelu_candidate():
    """An LSTM's tanh goes to a Mul: it is no tanh GELU, whose tanh is read by
    `1 + tanh`, and the report does not list it; a tanh read by an Add that is
    no GELU still gets ONNX Runtime's reason."""
    declined = []
    assert fusions.fuse_gelus(_tanh_read_by("Mul"), declined)["FastGelu"] == 0
    assert declined == []
    assert fusions.fuse_gelus(_tanh_read_by("Add"), declined)["FastGelu"] == 0
    assert declined == [("t", "Tanh: onnxruntime's FusionFastGelu found no match")]
