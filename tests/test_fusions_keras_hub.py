"""Fusions on the graphs keras-hub's encoders give with their default dropout.

With dropout set, Keras' `MultiHeadAttention` takes its einsum path: the query
scaled first, `keras.layers.Softmax` selecting -1e9 at masked logits and then
0 at masked probabilities. That path, and the GELUs keras-hub's encoders use
(tanh in BERT, TensorFlow's erfc form of the exact one in RoBERTa), are fused
here; each rule is also shown declining a graph that breaks its precondition.

Biases and LayerNorm parameters are redrawn away from their zero and one
initial values, as a trained checkpoint has them: onnxslim folds a zero bias
away, which would hide the bias fusions.
"""

import json

import keras
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from keras_layers.export import ExportOptions, export_model, fusions
from keras_layers.export.graph import remove_dead_nodes

pytestmark = [
    pytest.mark.tensorflow_only,  # the export pipeline runs on TensorFlow
    pytest.mark.xdist_group("fusions_keras_hub"),  # module fixtures: one worker (loadgroup)
]

LAYERS = 2
VOCAB = 100
SHAPES = [(2, 16), "padded"]


def redrawn(model, seed=0):
    """Biases and LayerNorm parameters drawn anew (kernels keep their draw)."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        if weight.path.endswith(("bias", "beta")):
            weight.assign(0.1 * rng.standard_normal(weight.shape).astype("float32"))
        elif weight.path.endswith("gamma"):
            weight.assign(1 + 0.1 * rng.standard_normal(weight.shape).astype("float32"))
    return model


def encoder(kind):
    """A tiny keras-hub encoder with its default dropout (0.1)."""
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = {"bert": keras_hub.models.BertBackbone, "roberta": keras_hub.models.RobertaBackbone}
    model = backbone[kind](
        vocabulary_size=VOCAB,
        num_layers=LAYERS,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=64,
    )
    return redrawn(model)


@pytest.fixture(scope="module", params=["bert", "roberta"])
def exported(request, tmp_path_factory):
    model = encoder(request.param)
    path = tmp_path_factory.mktemp(request.param) / f"{request.param}.onnx"
    report = export_model(model, path, ExportOptions(shapes=SHAPES))
    return request.param, model, path, report


def op_types(path):
    return [node.op_type for node in onnx.load(str(path)).graph.node]


def test_attention_with_dropout_is_fused_once_per_layer_and_validates(exported):
    kind, model, path, report = exported
    assert model.get_config()["dropout"] == 0.1  # MultiHeadAttention's einsum path
    assert report["passed"], report["worst"]
    assert {check["shape"] for check in report["checks"]} >= {"2x16", "padded"}
    assert report["graph"]["fused"]["MultiHeadAttention"] == LAYERS
    ops = op_types(path)
    assert ops.count("MultiHeadAttention") == LAYERS and "Softmax" not in ops


def test_gelus_are_fused_with_their_bias(exported):
    """BERT's `gelu_approximate` becomes FastGelu, RoBERTa's exact `gelu`
    BiasGelu; the Dense bias before each goes into the fused node."""
    kind, _, path, report = exported
    fused, ops = report["graph"]["fused"], op_types(path)
    expected = {"bert": "FastGelu", "roberta": "BiasGelu"}[kind]
    for op in fusions.GELU_FUSED:
        assert fused[op] == (LAYERS if op == expected else 0), (op, fused)
    assert ops.count(expected) == LAYERS
    assert "Erf" not in ops and "Pow" not in ops
    assert ops.count("Tanh") == (1 if kind == "bert" else 0)  # BERT's pooler
    graph = onnx.load(str(path)).graph
    biased = [node for node in graph.node if node.op_type == expected]
    assert all(len(node.input) == 2 and node.input[1] for node in biased)


def test_fused_files_match_keras_on_an_independent_padded_feed(exported):
    """Rows in full, right-padded, left-padded and all padding. A query that
    sees no key (the all-padding row) gets 0 from keras.layers.Softmax and the
    mean of the values from the fused op alone: this catches a missing zeroing."""
    kind, model, path, _ = exported
    assert "MultiHeadAttention" in op_types(path)
    rng = np.random.default_rng(123)
    batch, length = 4, 24
    valid = np.ones((batch, length), "int32")
    valid[1, 15:] = 0
    valid[2, :] = 0
    valid[3, :7] = 0
    feeds = {
        "token_ids": rng.integers(1, VOCAB, (batch, length)).astype("int32") * valid,
        "padding_mask": valid,
    }
    if kind == "bert":
        feeds["segment_ids"] = (np.arange(length)[None] >= 10).astype("int32").repeat(batch, 0)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    got = dict(zip(names, session.run(None, feeds), strict=True))
    expected = model(feeds, training=False)
    expected = expected if isinstance(expected, dict) else {names[0]: expected}
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], keras.ops.convert_to_numpy(value), atol=1e-4)


def test_skip_layer_norms_fuse_on_request(exported):
    """Off by default (ONNX Runtime's CPU kernel is slower than Add +
    LayerNormalization), on request every residual Add + LayerNorm is fused."""
    _, _, path, report = exported
    assert "SkipLayerNormalization" not in report["graph"]["fused"]
    proto = onnx.load(str(path))
    before = ort.InferenceSession(proto.SerializeToString())
    counts = fusions.fuse_gelus(proto, skip_norms=True)
    assert counts["SkipLayerNormalization"] == 2 * LAYERS
    after = ort.InferenceSession(proto.SerializeToString())
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCAB, (2, 16)).astype("int32")
    feeds = {"token_ids": ids, "padding_mask": np.ones_like(ids), "segment_ids": 0 * ids}
    feeds = {value.name: feeds[value.name] for value in before.get_inputs()}
    for got, reference in zip(after.run(None, feeds), before.run(None, feeds), strict=True):
        np.testing.assert_allclose(got, reference, atol=1e-5)


# Each rule below, on a small graph it fuses, then on the same graph with its
# precondition broken: that one is left alone, with a reason.


def _tensor(name, shape, kind=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, kind, list(shape))


def _model(nodes, inputs, outputs, constants):
    constants = [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in constants]
    graph = helper.make_graph(nodes, "g", inputs, outputs, constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _einsum_attention(heads, size, after_mask="mask"):
    """Keras' einsum attention as tf2onnx writes it: the query scaled, the
    product transposed, -1e9 selected before the softmax and 0 after it."""
    nodes = [
        helper.make_node("Mul", ["q", "scale"], ["qs"]),
        helper.make_node("Transpose", ["qs"], ["qt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["kt", "qt"], ["st"]),
        helper.make_node("Transpose", ["st"], ["logits"], perm=[0, 1, 3, 2]),
        helper.make_node("Where", ["mask", "logits", "big"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("Where", [after_mask, "probs", "zero"], ["kept"]),
        helper.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["kept", "vt"], ["heads"]),
        helper.make_node("Transpose", ["heads"], ["y"], perm=[0, 2, 1, 3]),
    ]
    inputs = [_tensor(n, ["b", f"{n}_len", heads, size]) for n in "qkv"]
    masks = {"mask", after_mask}
    inputs += [_tensor(n, ["b", 1, "q_len", "k_len"], TensorProto.BOOL) for n in sorted(masks)]
    constants = [("scale", size**-0.5), ("big", -1e9), ("zero", 0.0)]
    return _model(nodes, inputs, [_tensor("y", ["b", "q_len", heads, size])], constants)


def test_einsum_attention_is_fused_and_zeroes_queries_that_see_no_key():
    heads, size, length = 2, 4, 5
    proto = _einsum_attention(heads, size)
    unfused = ort.InferenceSession(proto.SerializeToString())
    assert fusions.fuse_attention(proto, fusions.tensor_shapes(proto)) == 1
    remove_dead_nodes(proto)  # as the slim stage does next
    assert "Softmax" not in [node.op_type for node in proto.graph.node]
    fused = ort.InferenceSession(proto.SerializeToString())

    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(0, 2, (2, length, heads, size)).astype("float32") for _ in "qkv")
    valid = np.arange(length)[None] < np.array([[length], [3]])  # row 1: 2 pads
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    logits = np.einsum("btnh,bsnh->bnts", q * np.float32(size**-0.5), k)
    masked = np.where(mask, logits, np.float32(-1e9))
    probs = np.exp(masked - masked.max(-1, keepdims=True))
    probs = np.where(mask, probs / probs.sum(-1, keepdims=True), 0)  # keras.layers.Softmax
    keras_like = np.einsum("bnts,bsnh->btnh", probs, v)
    assert not keras_like[1, 3:].any()  # padded queries see no key: 0

    feeds = {"q": q, "k": k, "v": v, "mask": mask}
    (got,) = fused.run(None, feeds)
    np.testing.assert_allclose(got, keras_like, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, unfused.run(None, feeds)[0], rtol=1e-4, atol=1e-5)


def test_einsum_attention_with_two_masks_is_left_alone():
    """Zeroing by another mask than the one selected into the logits is not
    what the fused op and its zeroing compute."""
    proto = _einsum_attention(2, 4, after_mask="other")
    before = proto.SerializeToString()
    declined = []
    assert fusions.fuse_attention(proto, fusions.tensor_shapes(proto), declined) == 0
    assert proto.SerializeToString() == before
    assert declined == [("probs", "the selects before and after the softmax read different masks")]


_TANH_CONSTANTS = [("half", 0.5), ("one", 1.0), ("cubic", 0.044715), ("root", 0.7978846)]


def _tanh_gelu(x, outputs=("y",), bias=None):
    """`gelu_approximate` as tf2onnx writes it, after `MatMul(x, w)` [+ bias]."""
    nodes = [helper.make_node("MatMul", [x, "w"], ["mm"])]
    if bias is not None:
        nodes.append(helper.make_node("Add", ["mm", "bias"], ["a"]))
    a = "a" if bias is not None else "mm"
    nodes += [
        helper.make_node("Mul", ["half", a], ["h"]),
        helper.make_node("Pow", [a, "three"], ["c"]),
        helper.make_node("Mul", ["cubic", "c"], ["k"]),
        helper.make_node("Add", [a, "k"], ["s"]),
        helper.make_node("Mul", ["root", "s"], ["t"]),
        helper.make_node("Tanh", ["t"], ["u"]),
        helper.make_node("Add", ["one", "u"], ["p"]),
        helper.make_node("Mul", ["h", "p"], ["y"]),
    ]
    constants = [*_TANH_CONSTANTS, ("three", 3.0), ("w", np.eye(8, 4))]
    if bias is not None:
        constants.append(("bias", bias))
    outputs = [_tensor(name, ["b", "t", 4]) for name in outputs]
    return _model(nodes, [_tensor(x, ["b", "t", 8])], outputs, constants)


def _run(proto, **feeds):
    return ort.InferenceSession(proto.SerializeToString()).run(None, feeds)


def test_fast_gelu_whose_inner_value_is_an_output_is_left_alone():
    """ONNX Runtime's FastGelu fusion would drop the graph output `u`."""
    proto = _tanh_gelu("x")
    assert fusions.fuse_gelus(proto)["FastGelu"] == 1
    proto = _tanh_gelu("x", outputs=("y", "u"))
    before = proto.SerializeToString()
    declined = []
    assert fusions.fuse_gelus(proto, declined)["FastGelu"] == 0
    assert proto.SerializeToString() == before
    assert ("u", "Tanh: a value it would remove is a graph output") in declined


def test_a_bias_of_one_value_is_left_out_of_fast_gelu():
    """An Add broadcasts a (1,) bias; FastGelu needs one value per channel
    (ONNX Runtime's fusion folds it in and the session then fails)."""
    x = np.random.default_rng(0).normal(size=(1, 3, 8)).astype("float32")
    proto = _tanh_gelu("x", bias=np.full(4, 0.5))
    assert fusions.fuse_gelus(proto)["FastGelu"] == 1
    assert [node.op_type for node in proto.graph.node] == ["MatMul", "FastGelu"]

    proto = _tanh_gelu("x", bias=[0.5])
    (reference,) = _run(proto, x=x)
    declined = []
    assert fusions.fuse_gelus(proto, declined)["FastGelu"] == 1  # without its bias
    assert [node.op_type for node in proto.graph.node] == ["MatMul", "Add", "FastGelu"]
    assert any("its bias is not a 1-D constant" in reason for _, reason in declined)
    np.testing.assert_allclose(_run(proto, x=x)[0], reference, rtol=1e-5, atol=1e-6)


def _erfc_gelu(root=0.5**0.5):
    """`gelu` (exact) as TensorFlow writes it: 0.5 * x * erfc(-x / sqrt(2))."""
    nodes = [
        helper.make_node("Neg", ["x"], ["n"]),
        helper.make_node("Mul", ["n", "root"], ["m"]),
        helper.make_node("Erf", ["m"], ["e"]),
        helper.make_node("Sub", ["one", "e"], ["s"]),
        helper.make_node("Mul", ["half", "x"], ["h"]),
        helper.make_node("Mul", ["h", "s"], ["y"]),
    ]
    constants = [("half", 0.5), ("one", 1.0), ("root", root)]
    return _model(nodes, [_tensor("x", ["b", 8])], [_tensor("y", ["b", 8])], constants)


def test_erfc_gelu_is_fused_and_another_constant_is_left_alone():
    x = np.random.default_rng(0).normal(0, 3, (4, 8)).astype("float32")
    proto = _erfc_gelu()
    (reference,) = _run(proto, x=x)
    assert fusions.fuse_gelus(proto)["Gelu"] == 1
    assert [node.op_type for node in proto.graph.node] == ["Gelu"]
    np.testing.assert_allclose(_run(proto, x=x)[0], reference, rtol=1e-6, atol=1e-6)

    proto = _erfc_gelu(root=0.7)  # not 1/sqrt(2): not a GELU
    before = proto.SerializeToString()
    declined = []
    assert fusions.fuse_gelus(proto, declined)["Gelu"] == 0
    assert proto.SerializeToString() == before
    assert ("e", "Erf: the erf's input is not -x / sqrt(2)") in declined


def _static_dense(back):
    """A `Dense` (bias, exact GELU) on x of (batch, 4, 8) as tf2onnx writes it
    where every axis but the batch is static, as in a ViT: to 2-D, MatMul,
    and back by the constant `back`."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Reshape", ["x", "flat"], ["x_2d"]),
        helper.make_node("MatMul", ["x_2d", "w"], ["product"]),
        helper.make_node("Reshape", ["product", "back"], ["dense"]),
        helper.make_node("Add", ["dense", "bias"], ["x"]),
        *_erfc_gelu().graph.node,
    ]
    # The GELU reads "x": the Dense's output gets that name, and its input another.
    nodes[0].input[0] = "pixels"
    constants = [
        numpy_helper.from_array(np.array([-1, 8], np.int64), "flat"),
        numpy_helper.from_array(np.array(back, np.int64), "back"),
        numpy_helper.from_array(rng.normal(size=(8, 6)).astype("float32"), "w"),
        numpy_helper.from_array(rng.normal(size=6).astype("float32"), "bias"),
        *_erfc_gelu().graph.initializer,
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [_tensor("pixels", ["b", 4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        constants,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_dense_whose_way_back_is_a_constant_is_one_matmul_with_its_bias_in_the_gelu():
    """Its x's static axes (4) are the constant's: one MatMul, the bias Add
    right after it, and the GELU takes the bias in (BiasGelu)."""
    x = np.random.default_rng(1).normal(size=(3, 4, 8)).astype("float32")
    proto = _static_dense([-1, 4, 6])
    (reference,) = _run(proto, pixels=x)
    assert fusions.fuse_tensordot_matmuls(proto, fusions.tensor_shapes(proto)) == 1
    assert fusions.fuse_gelus(proto)["BiasGelu"] == 1
    remove_dead_nodes(proto)
    assert [node.op_type for node in proto.graph.node] == ["MatMul", "BiasGelu"]
    np.testing.assert_allclose(_run(proto, pixels=x)[0], reference, rtol=1e-5, atol=1e-5)


def test_a_constant_way_back_that_is_not_xs_leading_axes_is_left_alone():
    """(3, 4, 8) to (12, 6) to (6, 2, 6): a reshape of its own, which one
    MatMul would not compute; and without x's shape nothing is proven."""
    proto = _static_dense([-1, 2, 6])
    before = proto.SerializeToString()
    declined = []
    assert fusions.fuse_tensordot_matmuls(proto, fusions.tensor_shapes(proto), declined) == 0
    assert proto.SerializeToString() == before and declined == []

    proto = _static_dense([-1, 4, 6])
    assert fusions.fuse_tensordot_matmuls(proto, None, declined) == 0
    assert [why for _, why in declined] == [
        "x's shape is not inferred: a constant way back cannot be read as its leading axes"
    ]


def _add_layer_norm(axis):
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"]),
        helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=axis),
    ]
    width = 8 if axis == -1 else 5
    inputs = [_tensor(name, [2, 5, 8]) for name in "ab"]
    constants = [("gamma", np.linspace(0.5, 1.5, width)), ("beta", np.linspace(-1, 1, width))]
    return _model(nodes, inputs, [_tensor("y", [2, 5, 8])], constants)


def test_a_layer_norm_over_another_axis_is_no_skip_layer_norm():
    """SkipLayerNormalization normalises the last axis; ONNX Runtime's fusion
    does not look at `axis`."""
    proto = _add_layer_norm(axis=-1)
    assert fusions.fuse_gelus(proto, skip_norms=True)["SkipLayerNormalization"] == 1

    proto = _add_layer_norm(axis=1)
    before = proto.SerializeToString()
    declined = []
    assert fusions.fuse_gelus(proto, declined, skip_norms=True)["SkipLayerNormalization"] == 0
    assert proto.SerializeToString() == before
    assert ("y", "LayerNormalization: normalises an axis other than the last") in declined


def test_the_report_and_verbose_say_why_a_softmax_was_not_fused(tmp_path, capsys):
    """A classifier's softmax (its output) is no attention: the report counts
    it with the reason, and `--verbose` prints it."""
    from keras_layers.export.cli import main

    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    hidden = keras.layers.Embedding(VOCAB, 8)(ids)
    probabilities = keras.layers.Softmax(name="probabilities")(keras.layers.Dense(3)(hidden))
    path = tmp_path / "classifier.keras"
    keras.Model(ids, probabilities).save(path)

    output = ["-o", str(tmp_path / "c.onnx")]
    assert main([str(path), *output, "--shapes", "1x4", "--verbose"]) == 0

    report = json.loads((tmp_path / "c.report.json").read_text())
    reason = "a softmax that no MatMul reads: not an attention"
    assert report["graph"]["declined"]["MultiHeadAttention"] == {reason: 1}
    printed = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert f"not fused (MultiHeadAttention) x1: {reason}" in printed


# Logits with a bias added, as keras-hub's T5 (relative position bias, carrying
# the padding mask, no scale), Falcon (ALiBi, scaled after the add) and Bloom
# (ALiBi added after the scale, the scaled product's `Shape` read for the
# mask) write them, and GPT-NeoX's product scaled inside the einsum's transpose.


def _biased_attention(form, heads, size, bias_shape=None):
    """The attention of `form` and its NumPy reference, written from the formula."""
    product = [
        helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["qt", "kt"], ["qk"]),
    ]
    extra_outputs = []
    if form == "t5":
        nodes = [*product, helper.make_node("Add", ["qk", "bias"], ["logits"])]
    elif form == "falcon":
        nodes = [
            *product,
            helper.make_node("Add", ["qk", "bias"], ["summed"]),
            helper.make_node("Mul", ["summed", "scale"], ["logits"]),
        ]
    elif form == "doubled":  # q.k + (b + b): a term read twice counts twice
        nodes = [
            *product,
            helper.make_node("Add", ["bias", "bias"], ["twice"]),
            helper.make_node("Add", ["qk", "twice"], ["logits"]),
        ]
    elif form == "xlnet":  # ((content + position) + segment) * scale
        nodes = [
            *product,
            helper.make_node("Add", ["qk", "bias"], ["content_position"]),
            helper.make_node("Add", ["content_position", "bias2"], ["summed"]),
            helper.make_node("Mul", ["summed", "scale"], ["logits"]),
        ]
    elif form == "bloom":
        nodes = [
            *product,
            helper.make_node("Mul", ["qk", "scale"], ["scaled"]),
            helper.make_node("Shape", ["scaled"], ["logits_shape"]),
            helper.make_node("Shape", ["scaled"], ["logits_lengths"], start=-2),
            helper.make_node("Add", ["scaled", "bias"], ["logits"]),
        ]
        extra_outputs = [
            _tensor("logits_shape", [4], TensorProto.INT64),
            _tensor("logits_lengths", [2], TensorProto.INT64),
        ]
    else:  # neox: einsum("aecd,abcd->acbe", key, query), scaled inside the transpose
        nodes = [
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1, 3]),
            helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 3, 1]),
            helper.make_node("MatMul", ["kt", "qt"], ["st"]),
            helper.make_node("Mul", ["st", "scale"], ["scaled"]),
            helper.make_node("Transpose", ["scaled"], ["logits"], perm=[0, 1, 3, 2]),
        ]
    masked = form != "t5"  # T5 adds its mask into the bias
    if masked:
        nodes += [
            helper.make_node("Where", ["mask", "logits", "big"], ["selected"]),
            helper.make_node("Softmax", ["selected"], ["probs"], axis=-1),
            helper.make_node("Where", ["mask", "probs", "zero"], ["kept"]),
        ]
    else:
        nodes.append(helper.make_node("Softmax", ["logits"], ["kept"], axis=-1))
    nodes += [
        helper.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["kept", "vt"], ["heads"]),
        helper.make_node("Transpose", ["heads"], ["y"], perm=[0, 2, 1, 3]),
    ]
    inputs = [_tensor(n, ["b", f"{n}_len", heads, size]) for n in "qkv"]
    if form != "neox":
        default = ["b", heads, "q_len", "k_len"] if form == "t5" else [1, heads, 1, "k_len"]
        inputs.append(_tensor("bias", bias_shape or default))
    if form == "xlnet":
        inputs.append(_tensor("bias2", ["b", heads, "q_len", "k_len"]))
    if masked:
        inputs.append(_tensor("mask", ["b", 1, "q_len", "k_len"], TensorProto.BOOL))
    constants = [("scale", size**-0.5), ("big", -1e9), ("zero", 0.0)]
    outputs = [_tensor("y", ["b", "q_len", heads, size]), *extra_outputs]
    return _model(nodes, inputs, outputs, constants)


def _biased_reference(form, feeds, size):
    q, k, v = feeds["q"], feeds["k"], feeds["v"]
    qk = np.einsum("btnh,bsnh->bnts", q, k)
    scale = np.float32(size**-0.5)
    logits = {
        "t5": lambda: qk + feeds["bias"],
        "falcon": lambda: (qk + feeds["bias"]) * scale,
        "xlnet": lambda: (qk + feeds["bias"] + feeds["bias2"]) * scale,
        "doubled": lambda: qk + 2 * feeds["bias"],
        "bloom": lambda: qk * scale + feeds["bias"],
        "neox": lambda: qk * scale,
    }[form]()
    if form != "t5":
        logits = np.where(feeds["mask"], logits, np.float32(-1e9))
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    if form != "t5":
        probs = np.where(feeds["mask"], probs, 0)  # keras.layers.Softmax
    return np.einsum("bnts,bsnh->btnh", probs, v)


@pytest.mark.parametrize("form", ["t5", "falcon", "xlnet", "doubled", "bloom", "neox"])
def test_biased_and_rescaled_attention_is_fused_exactly(form):
    """On a padded batch with an all-padding row and logits in the hundreds,
    the fused graph gives what the formula and the unfused graph give."""
    heads, size, batch, length = 2, 4, 3, 6
    proto = _biased_attention(form, heads, size)
    unfused = ort.InferenceSession(proto.SerializeToString())
    declined = []
    assert fusions.fuse_attention(proto, fusions.tensor_shapes(proto), declined) == 1, declined
    remove_dead_nodes(proto)
    ops = [node.op_type for node in proto.graph.node]
    assert "Softmax" not in ops and ops.count("MultiHeadAttention") == 1
    assert "MatMul" not in ops  # no logits left, even for Bloom's Shape readers
    fused = ort.InferenceSession(proto.SerializeToString())

    rng = np.random.default_rng(7)
    q, k, v = (rng.normal(0, 6, (batch, length, heads, size)).astype("float32") for _ in "qkv")
    valid = np.arange(length)[None] < np.array([[length], [4], [0]])  # row 2: all padding
    mask = valid[:, None, :, None] & valid[:, None, None, :]
    feeds = {"q": q, "k": k, "v": v}
    if form == "t5":  # position bias plus the additive padding mask, as keras-hub's T5
        position = rng.normal(0, 3, (1, heads, length, length)).astype("float32")
        feeds["bias"] = position + np.float32(-1e9) * ~valid[:, None, None, :]
    elif form != "neox":
        slopes = np.float32([0.5, 0.25]).reshape(1, heads, 1, 1)
        feeds["bias"] = (slopes * np.arange(length, dtype="float32")).astype("float32")
    if form == "xlnet":  # relative-position and segment terms, one per row, head and pair
        feeds["bias2"] = rng.normal(0, 3, (batch, heads, length, length)).astype("float32")
    if form != "t5":
        feeds["mask"] = mask
    expected = _biased_reference(form, feeds, size)
    assert np.abs(np.einsum("btnh,bsnh->bnts", q, k)).max() > 100  # large logits
    got, reference = fused.run(None, feeds), unfused.run(None, feeds)
    rows = valid if form == "t5" else np.ones_like(valid)  # T5's padded rows: any weights
    np.testing.assert_allclose(got[0][rows], expected[rows], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[0][rows], reference[0][rows], rtol=1e-4, atol=1e-4)
    for shape, shape_reference in zip(got[1:], reference[1:], strict=True):
        np.testing.assert_array_equal(shape, shape_reference)  # Bloom's Shape readers


@pytest.mark.parametrize(
    ("bias_shape", "reason"),
    [
        ([2, 2, "q_len", "k_len"], "the bias added to the logits has a fixed batch"),
        (
            [1, 1, 2, "q_len", "k_len"],
            "the bias added to the logits is not float32 of known rank up to 4",
        ),
    ],
)
def test_a_bias_the_fused_op_cannot_take_is_left_alone(bias_shape, reason):
    proto = _biased_attention("t5", 2, 4, bias_shape=bias_shape)
    before = proto.SerializeToString()
    declined = []
    assert fusions.fuse_attention(proto, fusions.tensor_shapes(proto), declined) == 0
    assert proto.SerializeToString() == before
    assert [why for _, why in declined] == [reason]


@pytest.mark.zoo  # minutes in all: with the zoo tier (the default suite has the graphs above)
@pytest.mark.parametrize(
    ("name", "attentions", "routers"),
    [
        ("T5Backbone", 6, 0),
        ("FalconBackbone", 2, 0),
        ("CLIPTextEncoder", 2, 0),
        ("DebertaV3Backbone", 2, 0),
        ("GemmaBackbone", 2, 0),
        ("XLNetBackbone", 2, 0),
        ("Gemma3nBackbone", 2, 0),
        ("ESMBackbone", 2, 0),
        ("GptOssBackbone", 2, 2),
    ],
)
def test_keras_hub_attention_with_a_bias_is_fused_in_every_layer(
    name, attentions, routers, tmp_path
):
    """T5 (relative bias, unscaled; 2 encoder, 2 decoder and 2 cross
    attentions), Falcon (ALiBi), CLIP (the mask built from the logits' shape),
    DeBERTa (disentangled terms, the key's transpose read twice), Gemma
    (grouped-query attention, one key/value head), XLNet (position and
    segment terms summed in a tree of Adds), Gemma 3n (heads repeated as
    `repeat_kv` does), ESM (the scale computed from the head size) and
    GPT-OSS (attention sinks), each built tiny by zoo_models: one fused op
    per attention, no softmax left but a mixture-of-experts router's (which
    weighs no values), and the file agrees with Keras on zoo_models'
    right-padded feed."""
    import zoo_models

    model = zoo_models.build(name)
    path = tmp_path / f"{name}.onnx"
    report = export_model(model, path)
    assert report["graph"]["fused"]["MultiHeadAttention"] == attentions, report["graph"]
    declined = report["graph"]["declined"].get("MultiHeadAttention", {})
    assert declined == (
        {"a softmax that no MatMul reads: not an attention": routers} if routers else {}
    )
    assert op_types(path).count("Softmax") == routers
    differences = zoo_models.parity(model, path, zoo_models.padded_feed(model))
    assert max(differences.values()) <= zoo_models.FEED_ATOL, differences


# Grouped-query attention: keras-hub's Gemma writes `einsum("btkgh,bskh->bkgts")`
# and `einsum("bkgts,bskh->btkgh")`, which the trace writes as transposes, an
# Unsqueeze and one broadcasting MatMul each (einsums.einsum_layout).


@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_einsum_layout_computes_the_einsum(data):
    """Any einsum the layout takes, computed its way, is NumPy's einsum."""
    from keras_layers.export.einsums import einsum_layout

    letters = list("abcdefg")
    batch = data.draw(st.lists(st.sampled_from(letters), min_size=1, max_size=2, unique=True))
    rest = [x for x in letters if x not in batch]
    contracted = data.draw(st.sampled_from(rest))
    rest.remove(contracted)
    free_a = data.draw(st.lists(st.sampled_from(rest), min_size=1, max_size=2, unique=True))
    rest = [x for x in rest if x not in free_a]
    free_b = data.draw(st.lists(st.sampled_from(rest), min_size=1, max_size=2, unique=True))
    a = "".join(data.draw(st.permutations(batch + [contracted] + free_a)))
    b = "".join(data.draw(st.permutations(batch + [contracted] + free_b)))
    out = "".join(data.draw(st.permutations(batch + free_a + free_b)))
    equation = f"{a},{b}->{out}"
    layout = einsum_layout(equation)
    if len(free_a) + len(free_b) < 3:
        assert layout is None  # tf2onnx's own lowering is a MatMul already
        return
    assert layout is not None, equation
    rng = np.random.default_rng(0)
    sizes = {x: int(rng.integers(1, 4)) for x in letters}
    x = rng.standard_normal([sizes[c] for c in a])
    y = rng.standard_normal([sizes[c] for c in b])
    expected = np.einsum(equation, x, y)
    perm_a, insert_a, perm_b, insert_b, after = layout
    x, y = x.transpose(perm_a), y.transpose(perm_b)
    for axis in insert_a:
        x = np.expand_dims(x, axis)
    for axis in insert_b:
        y = np.expand_dims(y, axis)
    product = x @ y
    product = product if after is None else product.transpose(after)
    np.testing.assert_allclose(product, expected, rtol=1e-12, atol=1e-12)


def _grouped_attention(kv_heads, groups, size, values_by_reshape=False):
    """Grouped-query attention as the trace writes Gemma's; with
    `values_by_reshape`, the value's transpose written as the Reshape onnxslim
    makes of it when there is one key/value head."""
    if values_by_reshape:
        values = [helper.make_node("Reshape", ["v", "v_target"], ["vt"])]
    else:
        values = [helper.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3])]
    nodes = [
        helper.make_node("Mul", ["q", "scale"], ["qs"]),
        helper.make_node("Transpose", ["qs"], ["qt"], perm=[0, 2, 3, 1, 4]),
        helper.make_node("Transpose", ["k"], ["kt4"], perm=[0, 2, 3, 1]),
        helper.make_node("Unsqueeze", ["kt4", "group_axis"], ["kt"]),
        helper.make_node("MatMul", ["qt", "kt"], ["logits"]),
        helper.make_node("Where", ["mask", "logits", "big"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("Where", ["mask", "probs", "zero"], ["kept"]),
        *values,
        helper.make_node("Unsqueeze", ["vt", "group_axis"], ["vg"]),
        helper.make_node("MatMul", ["kept", "vg"], ["heads"]),
        helper.make_node("Transpose", ["heads"], ["y"], perm=[0, 3, 1, 2, 4]),
    ]
    inputs = [
        _tensor("q", ["b", "q_len", kv_heads, groups, size]),
        _tensor("k", ["b", "k_len", kv_heads, size]),
        _tensor("v", ["b", "k_len", kv_heads, size]),
        _tensor("mask", ["b", 1, 1, "q_len", "k_len"], TensorProto.BOOL),
    ]
    outputs = [_tensor("y", ["b", "q_len", kv_heads, groups, size])]
    model = _model(nodes, inputs, outputs, [("scale", size**-0.5), ("big", -1e9), ("zero", 0)])
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([2], np.int64), "group_axis"),
            numpy_helper.from_array(np.array([0, kv_heads, -1, size], np.int64), "v_target"),
        ]
    )
    return model


@pytest.mark.parametrize(
    ("kv_heads", "groups", "values_by_reshape"), [(2, 3, False), (1, 4, True), (1, 2, False)]
)
def test_grouped_query_attention_is_fused_exactly(kv_heads, groups, values_by_reshape):
    """Each key/value head serves its `groups` query heads: the fused graph
    gives what the formula gives on a padded batch with an all-padding row."""
    size, batch, length = 4, 3, 6
    proto = _grouped_attention(kv_heads, groups, size, values_by_reshape)
    unfused = ort.InferenceSession(proto.SerializeToString())
    declined = []
    assert fusions.fuse_attention(proto, fusions.tensor_shapes(proto), declined) == 1, declined
    remove_dead_nodes(proto)
    ops = [node.op_type for node in proto.graph.node]
    assert "Softmax" not in ops and "MatMul" not in ops and "MultiHeadAttention" in ops
    fused = ort.InferenceSession(proto.SerializeToString())

    rng = np.random.default_rng(3)
    q = rng.normal(0, 8, (batch, length, kv_heads, groups, size)).astype("float32")
    k, v = (rng.normal(0, 6, (batch, length, kv_heads, size)).astype("float32") for _ in "kv")
    valid = np.arange(length)[None] < np.array([[length], [4], [0]])  # row 2: all padding
    causal = np.tril(np.ones((length, length), bool))
    mask = (causal[None] & valid[:, None, :])[:, None, None]  # (B, 1, 1, T, S)
    logits = np.einsum("btkgh,bskh->bkgts", q * np.float32(size**-0.5), k)
    assert np.abs(logits).max() > 100
    logits = np.where(mask, logits, np.float32(-1e9))
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs = np.where(mask, probs / probs.sum(-1, keepdims=True), 0)  # keras.layers.Softmax
    expected = np.einsum("bkgts,bskh->btkgh", probs, v)
    feeds = {"q": q, "k": k, "v": v, "mask": mask}
    (got,) = fused.run(None, feeds)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, unfused.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def test_a_reshape_that_is_no_transpose_is_left_alone():
    """With two key/value heads, (B, S, 2, H) reshaped to (B, 2, S, H) mixes
    heads and positions: no transpose, so no fusion."""
    proto = _grouped_attention(2, 2, 4, values_by_reshape=True)
    declined = []
    assert fusions.fuse_attention(proto, fusions.tensor_shapes(proto), declined) == 0
    assert [why for _, why in declined] == [
        "the grouped values do not reach the product through a transpose and an Unsqueeze"
    ]


def _repeated_kv_attention(kv_heads, groups, size, target="shape", repeat_axis=3):
    """Grouped-query attention in keras-hub's Gemma 3n form: q (B, T, N, H);
    k and v (B, S, K, H) made heads-first and repeated as Hugging Face's
    `repeat_kv`, `Reshape(Tile(Unsqueeze(., [2, 3]), [1, 1, 1, G, 1, 1]))`,
    to (B, N, S, H); the key then transposed to (B, N, H, S). The reshape's
    target is read off the shape (`target="shape"`) or a constant
    [0, N, -1, H]. `repeat_axis` 1 tiles the key/value head axis instead:
    query head n then reads head n % K, another order."""
    heads = kv_heads * groups
    repeats = [1, 1, 1, 1, 1, 1]
    repeats[repeat_axis] = groups
    nodes = [helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3])]
    for x in "kv":
        nodes += [
            helper.make_node("Transpose", [x], [f"{x}t"], perm=[0, 2, 1, 3]),
            helper.make_node("Unsqueeze", [f"{x}t", "axes23"], [f"{x}u"]),
            helper.make_node("Tile", [f"{x}u", "repeats"], [f"{x}tiled"]),
        ]
        if target == "shape":
            nodes += [
                helper.make_node("Shape", [f"{x}t"], [f"{x}shape"]),
                helper.make_node("Slice", [f"{x}shape", "zero_i", "one_i", "zero_i"], [f"{x}b"]),
                helper.make_node("Slice", [f"{x}shape", "two_i", "three_i", "zero_i"], [f"{x}s"]),
                helper.make_node(
                    "Concat", [f"{x}b", "heads_i", f"{x}s", "size_i"], [f"{x}target"], axis=0
                ),
            ]
        target_name = f"{x}target" if target == "shape" else "const_target"
        nodes.append(helper.make_node("Reshape", [f"{x}tiled", target_name], [f"{x}r"]))
    nodes += [
        helper.make_node("Transpose", ["kr"], ["krt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["qt", "krt"], ["logits"]),
        helper.make_node("Where", ["mask", "logits", "big"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "vr"], ["heads"]),
        helper.make_node("Transpose", ["heads"], ["y"], perm=[0, 2, 1, 3]),
    ]
    inputs = [
        _tensor("q", ["b", "q_len", heads, size]),
        _tensor("k", ["b", "k_len", kv_heads, size]),
        _tensor("v", ["b", "k_len", kv_heads, size]),
        _tensor("mask", ["b", 1, "q_len", "k_len"], TensorProto.BOOL),
    ]
    outputs = [_tensor("y", ["b", "q_len", heads, size])]
    model = _model(nodes, inputs, outputs, [("big", -1e9)])
    integers = {
        "axes23": [2, 3],
        "repeats": repeats,
        "zero_i": [0],
        "one_i": [1],
        "two_i": [2],
        "three_i": [3],
        "heads_i": [heads],
        "size_i": [size],
        "const_target": [0, heads, -1, size],
    }
    model.graph.initializer.extend(
        numpy_helper.from_array(np.array(value, np.int64), name) for name, value in integers.items()
    )
    return model


@pytest.mark.parametrize(("kv_heads", "groups", "target"), [(1, 2, "shape"), (2, 2, "constant")])
def test_heads_repeated_as_repeat_kv_are_fused_exactly(kv_heads, groups, target):
    """Gemma 3n's grouped-query attention: query head n reads key/value head
    n // G. The fused graph gives what the formula gives on a padded batch."""
    size, batch, length = 4, 3, 6
    proto = _repeated_kv_attention(kv_heads, groups, size, target)
    unfused = ort.InferenceSession(proto.SerializeToString())
    declined = []
    assert fusions.fuse_attention(proto, fusions.tensor_shapes(proto), declined) == 1, declined
    remove_dead_nodes(proto)
    ops = [node.op_type for node in proto.graph.node]
    assert "Softmax" not in ops and "Tile" not in ops and "MultiHeadAttention" in ops
    fused = ort.InferenceSession(proto.SerializeToString())

    rng = np.random.default_rng(5)
    q = rng.normal(0, 8, (batch, length, kv_heads * groups, size)).astype("float32")
    k, v = (rng.normal(0, 6, (batch, length, kv_heads, size)).astype("float32") for _ in "kv")
    valid = np.arange(length)[None] < np.array([[length], [4], [1]])
    causal = np.tril(np.ones((length, length), bool))
    mask = (causal[None] & valid[:, None, :])[:, None]  # (B, 1, T, S)
    head_of = np.arange(kv_heads * groups) // groups  # query head n reads head n // G
    logits = np.einsum("btnh,bsnh->bnts", q, k[:, :, head_of])
    assert np.abs(logits).max() > 100
    logits = np.where(mask, logits, np.float32(-1e9))
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    expected = np.einsum("bnts,bsnh->btnh", probs, v[:, :, head_of])
    feeds = {"q": q, "k": k, "v": v, "mask": mask}
    (got,) = fused.run(None, feeds)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, unfused.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def test_heads_repeated_in_another_order_are_left_alone():
    """Tiling the key/value head axis instead (head n reads head n % K) is
    not the order the fused op's repeat gives: no fusion, and the reason."""
    proto = _repeated_kv_attention(2, 2, 4, repeat_axis=1)
    declined = []
    assert fusions.fuse_attention(proto, fusions.tensor_shapes(proto), declined) == 0
    assert [why for _, why in declined] == [
        "the values do not reach the product through a heads-first transpose"
    ]


def test_a_scale_computed_from_the_head_size_is_fused_exactly():
    """ESM scales by `1 / sqrt(float(shape(k)[-1]))`, computed at run time:
    the head size is static, so the rule knows the scale and fuses it."""
    heads, size, batch, length = 2, 8, 2, 5
    nodes = [
        helper.make_node("Shape", ["k"], ["k_shape"]),
        helper.make_node("Slice", ["k_shape", "minus_one", "end", "axis0"], ["k_last"]),
        helper.make_node("Squeeze", ["k_last", "axis0"], ["k_size"]),
        helper.make_node("Cast", ["k_size"], ["k_size_f"], to=TensorProto.FLOAT),
        helper.make_node("Sqrt", ["k_size_f"], ["root"]),
        helper.make_node("Div", ["one", "root"], ["scale"]),
        helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["qt", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        helper.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["probs", "vt"], ["heads"]),
        helper.make_node("Transpose", ["heads"], ["y"], perm=[0, 2, 1, 3]),
    ]
    inputs = [_tensor(n, ["b", f"{n}_len", heads, size]) for n in "qkv"]
    proto = _model(nodes, inputs, [_tensor("y", ["b", "q_len", heads, size])], [("one", 1.0)])
    proto.graph.initializer.extend(
        numpy_helper.from_array(np.array([value], np.int64), name)
        for name, value in (("minus_one", -1), ("end", 2**62), ("axis0", 0))
    )
    unfused = ort.InferenceSession(proto.SerializeToString())
    declined = []
    assert fusions.fuse_attention(proto, fusions.tensor_shapes(proto), declined) == 1, declined
    (fused_node,) = [n for n in proto.graph.node if n.op_type == "MultiHeadAttention"]
    scale = next(a.f for a in fused_node.attribute if a.name == "scale")
    assert np.float32(scale) == np.float32(1) / np.sqrt(np.float32(size))
    fused = ort.InferenceSession(proto.SerializeToString())
    rng = np.random.default_rng(11)
    q, k, v = (rng.normal(0, 6, (batch, length, heads, size)).astype("float32") for _ in "qkv")
    logits = np.einsum("btnh,bsnh->bnts", q, k) * np.float32(size**-0.5)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    expected = np.einsum("bnts,bsnh->btnh", probs / probs.sum(-1, keepdims=True), v)
    feeds = {"q": q, "k": k, "v": v}
    (got,) = fused.run(None, feeds)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, unfused.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def _sink_attention(heads, size, sliding=False, column_width=1, window_fill=-1e9):
    """GPT-OSS's attention with sinks: the masked, scaled logits beside a
    learned logit per head, `softmax(concat(l, s) - max)[..., :-1] @ v`; with
    `sliding`, masked twice (padding and causal, then a window).
    `column_width` 2 broadcasts the sinks to two columns: not one sink;
    `window_fill` is what the window's select puts at masked logits."""
    nodes = [
        helper.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["qt", "kt"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["logits"]),
    ]
    if sliding:
        nodes.append(helper.make_node("Where", ["window", "logits", "window_fill"], ["windowed"]))
    source = "windowed" if sliding else "logits"
    nodes += [
        helper.make_node("Where", ["mask", source, "big"], ["masked"]),
        helper.make_node("Shape", ["masked"], ["masked_shape"]),  # GPT-OSS's sink shape
        helper.make_node("Slice", ["masked_shape", "zero_i", "three_i"], ["lead"]),
        helper.make_node("Concat", ["lead", "width_i"], ["column_shape"], axis=0),
        helper.make_node("Expand", ["sinks", "column_shape"], ["column"]),
        helper.make_node("Concat", ["masked", "column"], ["joined"], axis=3),
        helper.make_node("ReduceMax", ["joined", "last_i"], ["top"], keepdims=1),
        helper.make_node("Sub", ["joined", "top"], ["shifted"]),
        helper.make_node("Softmax", ["shifted"], ["probs"], axis=-1),
        helper.make_node("Slice", ["probs", "zero_i", "minus_one_i", "last_i"], ["kept"]),
        helper.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["kept", "vt"], ["heads_out"]),
        helper.make_node("Transpose", ["heads_out"], ["y"], perm=[0, 2, 1, 3]),
    ]
    inputs = [_tensor(n, ["b", f"{n}_len", heads, size]) for n in "qkv"]
    inputs.append(_tensor("mask", ["b", 1, "q_len", "k_len"], TensorProto.BOOL))
    if sliding:
        inputs.append(_tensor("window", [1, 1, "q_len", "k_len"], TensorProto.BOOL))
    constants = [("scale", size**-0.5), ("big", -1e9), ("window_fill", window_fill)]
    model = _model(nodes, inputs, [_tensor("y", ["b", "q_len", heads, size])], constants)
    sinks = np.linspace(-1.0, 2.0, heads, dtype=np.float32).reshape(1, heads, 1, 1)
    model.graph.initializer.append(numpy_helper.from_array(sinks, "sinks"))
    integers = {
        "zero_i": [0],
        "three_i": [3],
        "width_i": [column_width],
        "last_i": [3],
        "minus_one_i": [-1],
    }
    model.graph.initializer.extend(
        numpy_helper.from_array(np.array(value, np.int64), name) for name, value in integers.items()
    )
    return model, sinks.reshape(heads)


@pytest.mark.parametrize("sliding", [False, True], ids=["full", "sliding window"])
def test_attention_with_sinks_is_fused_exactly(sliding):
    """The sink takes probability but weighs no value: a query that sees no
    key gives 0, and the rest are scaled down, as the formula gives."""
    heads, size, batch, length = 2, 4, 3, 6
    proto, sinks = _sink_attention(heads, size, sliding)
    unfused = ort.InferenceSession(proto.SerializeToString())
    declined = []
    assert fusions.fuse_attention(proto, fusions.tensor_shapes(proto), declined) == 1, declined
    remove_dead_nodes(proto)
    ops = [node.op_type for node in proto.graph.node]
    assert "Softmax" not in ops and "MatMul" not in ops and "MultiHeadAttention" in ops
    fused = ort.InferenceSession(proto.SerializeToString())

    rng = np.random.default_rng(9)
    q, k, v = (rng.normal(0, 6, (batch, length, heads, size)).astype("float32") for _ in "qkv")
    valid = np.arange(length)[None] < np.array([[length], [4], [0]])  # row 2: all padding
    causal = np.tril(np.ones((length, length), bool))
    mask = (causal[None] & valid[:, None, :])[:, None]
    window = np.triu(np.ones((length, length), bool), -2)[None, None]  # the last 3 keys
    feeds = {"q": q, "k": k, "v": v, "mask": mask}
    kept = mask & window if sliding else mask
    if sliding:
        feeds["window"] = window
    logits = np.einsum("btnh,bsnh->bnts", q, k) * np.float32(size**-0.5)
    assert np.abs(logits).max() > 20
    logits = np.where(kept, logits, np.float32(-1e9))
    column = np.broadcast_to(sinks.reshape(1, heads, 1, 1), (batch, heads, length, 1))
    joined = np.concatenate([logits, column], axis=-1)
    probs = np.exp(joined - joined.max(-1, keepdims=True))
    probs = (probs / probs.sum(-1, keepdims=True))[..., :-1]
    expected = np.einsum("bnts,bsnh->btnh", probs, v)
    (got,) = fused.run(None, feeds)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got, unfused.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
    assert not got[2].any()  # the all-padding row: all weight on the sink


def test_sinks_broadcast_to_two_columns_are_left_alone():
    proto, _ = _sink_attention(2, 4, column_width=2)
    declined = []
    assert fusions.fuse_attention(proto, fusions.tensor_shapes(proto), declined) == 0
    assert [why for _, why in declined] == ["the sink column is not one float32 column"]


def test_two_selects_with_different_fills_are_left_alone():
    """Where both masks blank a row, Keras spreads it over the columns holding
    the larger fill; the fused op's one bias would spread it over all."""
    proto, _ = _sink_attention(2, 4, sliding=True, window_fill=-2.4e38)
    declined = []
    assert fusions.fuse_attention(proto, fusions.tensor_shapes(proto), declined) == 0
    assert [why for _, why in declined] == ["the selects fill masked logits with different values"]
