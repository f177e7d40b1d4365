"""`fusions.pattern`: the rule helper every fusion is written with.

A toy rule (relu(-x) as -min(x, 0)) exercises what the real rules rely on:
reasons reach `declined` with the rule's prefix, nothing changes while
matching, a value made `once` is shared, nodes placed after a graph input go
first, and the rewritten graph computes what NumPy computes.
"""

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from keras_layers.export import fusions
from keras_layers.export.passes.fusions import (
    gelu,
    layer_norm,
    matmul,
    multi_head_attention,
    pattern,
    rms_norm,
    rotary,
)

RULES = (
    layer_norm.RULE,
    matmul.RULE,
    multi_head_attention.RULE,
    rms_norm.RULE,
    rotary.RULE,
    gelu.ERFC_GELU,
)


def _match(g, relu):
    negated = g.node(relu.input[0], "Neg")
    if negated is None:
        return None  # not a candidate: says nothing
    if not g.only_used_by(negated.output[0]):
        return "the negation is read by more than one node"
    return negated.input[0], relu


def _rewrite(edit, match):
    x, relu = match
    zero = edit.constant("toy_zero", np.float32(0))

    # A copy of x made once for every match, right after the graph input.
    def copy():
        made = edit.fresh("x_copy")
        edit.after(x, [helper.make_node("Identity", [x], [made])])
        return made

    source = edit.once(("copy", x), copy)
    low = edit.fresh(f"{relu.output[0]}_min")
    edit.replace(
        relu,
        [helper.make_node("Min", [source, zero], [low]), helper.make_node("Neg", [low], [])],
    )


TOY = pattern.Rule("Neg", "Relu", "Relu(Neg(x))", _match, _rewrite, reason_prefix="Relu: ")


def _toy_graph():
    nodes = [
        helper.make_node("Neg", ["x"], ["n1"]),
        helper.make_node("Relu", ["n1"], ["r1"]),  # a match
        helper.make_node("Neg", ["x"], ["n2"]),
        helper.make_node("Relu", ["n2"], ["r2"]),  # declined: n2 is read twice
        helper.make_node("Relu", ["x"], ["r3"]),  # no candidate
        helper.make_node("Sum", ["r1", "r2", "r3", "n2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "toy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_rule_rewrites_matches_and_says_why_it_declined_the_others():
    proto = _toy_graph()
    declined = []
    assert pattern.apply(TOY, proto, declined) == 1
    assert declined == [("r2", "Relu: the negation is read by more than one node")]
    onnx.checker.check_model(proto)
    ops = [node.op_type for node in proto.graph.node]
    assert ops[0] == "Identity"  # after the graph input: first
    assert ops.count("Relu") == 2 and ops.count("Min") == 1
    x = np.array([[-2.0, -0.5, 0.0], [0.5, 1.0, 3.0]], np.float32)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": x})
    relu = np.maximum
    np.testing.assert_array_equal(y, relu(-x, 0) + relu(-x, 0) + relu(x, 0) + -x)


def test_an_edit_leaves_the_graph_alone_until_committed():
    proto = _toy_graph()
    before = proto.SerializeToString()
    g = pattern.Graph(proto.graph)
    edit = pattern.Edit(proto)
    _rewrite(edit, _match(g, g.producer["r1"]))
    assert proto.graph.node[1].op_type == "Relu"  # nothing moved yet
    edit.commit()
    assert proto.SerializeToString() != before
    assert [n.op_type for n in proto.graph.node][:3] == ["Identity", "Neg", "Min"]


def test_every_rule_is_listed_in_the_docs_with_its_form():
    """docs/export.md, "How a fusion is written", shows each rule's anchor and form."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "export.md").read_text()
    section = page.split("## How a fusion is written", 1)[1].split("\n## ", 1)[0]
    for rule in RULES:
        assert f"`{rule.form}`" in section, rule.makes
        assert f"`{rule.anchor}`" in section and f"`{rule.makes}`" in section, rule.makes
    assert fusions.GELU_FUSED  # the rest of gelu's ops are ONNX Runtime's own fusions


def _scale_from_shape(head_size):
    """`1 / sqrt(float(shape(k)[-1]))`, as ESM's attention computes its scale."""
    nodes = [
        helper.make_node("Shape", ["k"], ["shape"]),
        helper.make_node("Slice", ["shape", "minus_one", "end", "zero"], ["last"]),
        helper.make_node("Squeeze", ["last", "zero"], ["size"]),
        helper.make_node("Cast", ["size"], ["size_f"], to=TensorProto.FLOAT),
        helper.make_node("Sqrt", ["size_f"], ["root"]),
        helper.make_node("Div", ["one", "root"], ["scale"]),
        helper.make_node("Shape", ["k"], ["first"], end=1),
        helper.make_node("Cast", ["first"], ["first_f"], to=TensorProto.FLOAT),
        helper.make_node("Sqrt", ["first_f"], ["first_root"]),
        helper.make_node("Gather", ["table", "first"], ["picked"]),
    ]
    graph = helper.make_graph(
        nodes,
        "scale",
        [helper.make_tensor_value_info("k", TensorProto.FLOAT, ["b", "s", 2, head_size])],
        [
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("first_root", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("picked", TensorProto.FLOAT, [1]),
        ],
        [
            onnx.numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
            onnx.numpy_helper.from_array(np.array([2**62], np.int64), "end"),
            onnx.numpy_helper.from_array(np.array([0], np.int64), "zero"),
            onnx.numpy_helper.from_array(np.float32(1), "one"),
            onnx.numpy_helper.from_array(np.arange(8, dtype=np.float32), "table"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_scale_computed_from_a_static_dim_is_known_and_a_dynamic_one_is_not():
    """The value is the one ONNX Runtime computes, bit for bit; the batch dim,
    unknown until run time, makes its root unknown."""
    proto = _scale_from_shape(head_size=8)
    g = pattern.Graph(proto.graph, fusions.tensor_shapes(proto))
    value = pattern.static_value(g, "scale")
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    computed, *_ = session.run(None, {"k": np.zeros((3, 5, 2, 8), np.float32)})
    assert value.dtype == np.float32 and value.tobytes() == computed.tobytes()
    assert pattern.static_value(g, "first_root") is None
    assert pattern.static_value(g, "first").tolist() == [None]
    assert pattern.static_value(g, "picked") is None  # indices unknown: no value, no crash


@pytest.mark.parametrize(
    ("equation", "shapes"),
    [
        ("...,d->...d", [(2, 3), (4,)]),  # RoFormerV2's rotary angles
        ("...,d->...d", [(), (4,)]),
        ("b...h,h->b...", [(2, 3, 5, 4), (4,)]),
        ("ij,...j->...i", [(3, 4), (2, 5, 4)]),
        ("...ij,...jk->...ik", [(2, 3), (5, 3, 4)]),  # the first "..." covers no axis
    ],
)
def test_an_ellipsis_written_out_computes_the_same(equation, shapes):
    """`einsums.explicit_ellipsis` gives an equation NumPy computes the same with."""
    from keras_layers.export.einsums import explicit_ellipsis

    rng = np.random.default_rng(0)
    operands = [rng.standard_normal(shape) for shape in shapes]
    explicit = explicit_ellipsis(equation, [len(shape) for shape in shapes])
    assert explicit is not None and "." not in explicit
    np.testing.assert_array_equal(np.einsum(explicit, *operands), np.einsum(equation, *operands))


def test_an_ellipsis_on_two_operands_is_kept():
    """Between two operands an ellipsis broadcasts 1 against any size; one letter does not."""
    from keras_layers.export.einsums import explicit_ellipsis

    assert explicit_ellipsis("...ij,...jk->...ik", [3, 3]) is None
    assert explicit_ellipsis("ij,jk->ik", [2, 2]) is None
