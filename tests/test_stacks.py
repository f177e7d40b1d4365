"""`stacks.fold_stack_picks`: `stack([x0, x1, ...])[i]` becomes `xi`, exactly; nothing else changes.

Graphs are written by hand in the shapes tf2onnx gives `tf.stack` (`Concat`
of `Unsqueeze`) and `t[:, i]` (`Slice` + `Squeeze`, the other axes sliced
whole with int32's largest value); ONNX Runtime runs each before and after.
"""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from keras_layers.export.graph import remove_dead_nodes
from keras_layers.export.passes.stacks import fold_shapes_of_stacks, fold_stack_picks

WHOLE = np.iinfo(np.int32).max
SHAPE = (2, 3, 4)  # each stacked input


def const(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def model(nodes, initializers, output_rank):
    inputs = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, SHAPE) for i in range(3)]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * output_rank)
    graph = helper.make_graph(nodes, "g", inputs, [output], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def stacked(axis, prefix="s"):
    """Nodes stacking x0, x1, x2 on `axis` into `prefix`."""
    nodes = [
        helper.make_node("Unsqueeze", [f"x{i}", f"{prefix}_axis"], [f"{prefix}_u{i}"])
        for i in range(3)
    ]
    nodes.append(
        helper.make_node("Concat", [f"{prefix}_u{i}" for i in range(3)], [prefix], axis=axis)
    )
    return nodes, [const(f"{prefix}_axis", [axis])]


def pick(source, starts, ends, axes, squeeze, steps=None):
    inputs = [source, "starts", "ends", "axes"] + (["steps"] if steps else [])
    nodes = [
        helper.make_node("Slice", inputs, ["sliced"]),
        helper.make_node("Squeeze", ["sliced", "squeeze_axes"], ["picked"]),
        helper.make_node("Identity", ["picked"], ["y"]),
    ]
    consts = [const("starts", starts), const("ends", ends), const("axes", axes)]
    consts.append(const("squeeze_axes", squeeze))
    if steps:
        consts.append(const("steps", steps))
    return nodes, consts


def run(proto):
    rng = np.random.default_rng(0)
    feeds = {f"x{i}": rng.standard_normal(SHAPE).astype("float32") for i in range(3)}
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0], feeds


def fold(proto):
    before, feeds = run(proto)
    folded = fold_stack_picks(proto)
    remove_dead_nodes(proto)
    onnx.checker.check_model(proto)
    after, _ = run(proto)
    np.testing.assert_array_equal(after, before)
    return folded, before, feeds, [node.op_type for node in proto.graph.node]


def test_a_pick_of_a_stack_is_the_picked_input():
    stack, consts = stacked(axis=1)
    picked, more = pick("s", [0, 2], [WHOLE, 3], [0, 1], [1])
    folded, out, feeds, ops = fold(model(stack + picked, consts + more, 3))
    assert folded == 1
    assert ops == ["Identity"]
    np.testing.assert_array_equal(out, feeds["x2"])


def test_a_pick_through_a_transpose_becomes_a_smaller_transpose():
    stack, consts = stacked(axis=0)  # (3, 2, 3, 4)
    transpose = [helper.make_node("Transpose", ["s"], ["t"], perm=[1, 2, 0, 3])]  # (2, 3, 3, 4)
    picked, more = pick("t", [1], [2], [2], [2])  # index 1 of the stacked axis, now axis 2
    folded, out, feeds, ops = fold(model(stack + transpose + picked, consts + more, 3))
    assert folded == 1
    assert ops == ["Identity"]  # the remaining permutation is the identity
    np.testing.assert_array_equal(out, feeds["x1"])


def test_a_stack_of_stacks_picked_at_once_and_transposed():
    inner, consts = stacked(axis=1, prefix="a")  # (2, 3, 3, 4)
    outer = [
        helper.make_node("Unsqueeze", ["a", "a_axis"], ["a_u"]),
        helper.make_node("Unsqueeze", ["a", "a_axis"], ["a_v"]),
        helper.make_node("Concat", ["a_u", "a_v"], ["o"], axis=1),  # (2, 2, 3, 3, 4)
        helper.make_node("Transpose", ["o"], ["t"], perm=[0, 3, 1, 2, 4]),  # (2, 3, 2, 3, 4)
    ]
    picked, more = pick("t", [0, 1, 2], [WHOLE, 2, 3], [0, 2, 3], [2, 3])
    folded, out, feeds, ops = fold(model(inner + outer + picked, consts + more, 3))
    assert folded == 1
    assert "Concat" not in ops
    np.testing.assert_array_equal(out, feeds["x2"].transpose(0, 1, 2))


@pytest.mark.parametrize(
    "starts, ends, axes, squeeze, steps",
    [
        ([0], [2], [1], [1], None),  # two indices: not a pick
        ([-1], [WHOLE], [1], [1], None),  # counted from the end
        ([1], [2], [1], [1], [2]),  # a step
        ([1, 1], [2, 2], [1, 2], [1], None),  # another axis sliced, not squeezed
    ],
)
def test_anything_but_a_single_index_pick_is_left_alone(starts, ends, axes, squeeze, steps):
    stack, consts = stacked(axis=1)
    picked, more = pick("s", starts, ends, axes, squeeze, steps)
    proto = model(stack + picked, consts + more, 3)
    nodes = len(proto.graph.node)
    assert fold_stack_picks(proto) == 0
    assert len(proto.graph.node) == nodes


def test_a_concat_of_other_tensors_is_not_taken_for_a_stack():
    nodes = [
        helper.make_node("Concat", ["x0", "x1", "x2"], ["s"], axis=1),  # (2, 9, 4)
    ]
    picked, more = pick("s", [1], [2], [1], [1])
    proto = model(nodes + picked, more, 2)
    assert fold_stack_picks(proto) == 0


def shape_model(extra_reader: bool):
    """Shape(concat([stack([x0, x1], 1), stack([x1, x2], 1)], 2)) and
    Shape(x0 ++ x1 on axis 1)."""
    stack_a, consts = stacked(axis=1, prefix="a")  # (2, 3, 3, 4) of x0, x1, x2
    nodes = stack_a + [
        helper.make_node("Concat", ["x0", "x1"], ["c"], axis=1),  # (2, 6, 4)
        helper.make_node("Concat", ["a", "a"], ["aa"], axis=2),  # (2, 3, 6, 4)
        helper.make_node("Shape", ["c"], ["c_shape"]),
        helper.make_node("Shape", ["aa"], ["aa_shape"]),
        helper.make_node("Concat", ["c_shape", "aa_shape"], ["y"], axis=0),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.INT64, [7])]
    if extra_reader:
        nodes.append(helper.make_node("Identity", ["aa"], ["z"]))
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    inputs = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, SHAPE) for i in range(3)]
    graph = helper.make_graph(nodes, "g", inputs, outputs, consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_the_shape_of_a_stack_read_only_for_its_shape_comes_from_its_parts():
    proto = shape_model(extra_reader=False)
    before, _ = run(proto)

    assert fold_shapes_of_stacks(proto) >= 2

    onnx.checker.check_model(proto)
    after, _ = run(proto)
    np.testing.assert_array_equal(after, before)
    assert before.tolist() == [2, 6, 4, 2, 3, 6, 4]
    big = [n for n in proto.graph.node if n.op_type in ("Concat", "Unsqueeze")]
    assert all(n.output[0] not in ("c", "aa", "a") for n in big)  # never made


def test_a_stack_read_for_more_than_its_shape_is_left_alone():
    proto = shape_model(extra_reader=True)
    fold_shapes_of_stacks(proto)
    assert "aa" in {node.output[0] for node in proto.graph.node}
    after, _ = run(proto)
    assert after.tolist() == [2, 6, 4, 2, 3, 6, 4]
