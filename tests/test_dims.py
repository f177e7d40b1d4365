"""`dims.share_equal_shapes`: one `Shape` for tensors proven to share their dims, exactly.

Graphs are written by hand in the forms tf2onnx gives Keras' ops (the
Tensordot reshapes of a `Dense`, a mask built from `Shape` of a hidden state);
ONNX Runtime runs each before and after the rewrite. The evaluation may only
under-claim: every case where two shapes could differ at run time must keep
its own `Shape`.
"""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from keras_layers.export.graph import Dim, remove_dead_nodes, symbolic_dims
from keras_layers.export.passes.common_subexpressions import merge_common_subexpressions
from keras_layers.export.passes.share_shapes import share_equal_shapes

WIDTH = 8


def const(name, values, dtype=np.int64):
    return numpy_helper.from_array(np.array(values, dtype), name)


def model(nodes, initializers, inputs, outputs):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def hidden(name, dims=("batch", "sequence", WIDTH)):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))


def dense(x, out, weight):
    """tf2onnx's Tensordot of a Dense: to 2-D, MatMul, back to x's leading dims."""
    return [
        helper.make_node("Reshape", [x, "flat"], [f"{out}_2d"]),
        helper.make_node("MatMul", [f"{out}_2d", weight], [f"{out}_mm"]),
        helper.make_node("Shape", [x], [f"{out}_shape"]),
        helper.make_node("Slice", [f"{out}_shape", "zero", "two"], [f"{out}_lead"]),
        helper.make_node("Concat", [f"{out}_lead", "width"], [f"{out}_back"], axis=0),
        helper.make_node("Reshape", [f"{out}_mm", f"{out}_back"], [out]),
    ]


def causal_mask(x, out):
    """A layer's causal mask from `Shape` of its own input, as keras-hub builds it."""
    return [
        helper.make_node("Shape", [x], [f"{out}_shape"]),
        helper.make_node("Gather", [f"{out}_shape", "one_scalar"], [f"{out}_length"]),
        helper.make_node("Cast", [f"{out}_length"], [f"{out}_float"], to=TensorProto.FLOAT),
        helper.make_node("Range", ["zero_f", f"{out}_float", "one_f"], [f"{out}_range"]),
        helper.make_node("Unsqueeze", [f"{out}_range", "one"], [f"{out}_column"]),
        helper.make_node("GreaterOrEqual", [f"{out}_column", f"{out}_range"], [f"{out}_bool"]),
        helper.make_node("Cast", [f"{out}_bool"], [out], to=TensorProto.FLOAT),
    ]


CONSTANTS = [
    const("flat", [-1, WIDTH]),
    const("zero", [0]),
    const("one", [1]),
    const("two", [2]),
    const("width", [WIDTH]),
    const("one_scalar", 1),
    const("zero_f", 0.0, np.float32),
    const("one_f", 1.0, np.float32),
    numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((WIDTH, WIDTH)).astype("float32"), "w"
    ),
]


def two_layers():
    """x -> residual Dense -> x1; each layer's mask from its own input; both masks summed."""
    nodes = dense("x", "y0", "w") + [helper.make_node("Add", ["x", "y0"], ["x1"])]
    nodes += causal_mask("x", "m0") + causal_mask("x1", "m1")
    nodes += [
        helper.make_node("Add", ["m0", "m1"], ["masks"]),
        helper.make_node("ReduceSum", ["x1"], ["total"], keepdims=0),
        helper.make_node("Mul", ["masks", "total"], ["out"]),
    ]
    output = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    return model(nodes, list(CONSTANTS), [hidden("x")], [output])


def run(proto, feeds):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options)
    return session.run(None, feeds)


POSITIVE = {"batch", "sequence"}  # as the pipeline passes them for a forward export


def test_the_residual_streams_shape_is_proven_through_the_dense_reshapes():
    dims = symbolic_dims(two_layers().graph, POSITIVE)
    batch, sequence = Dim.symbol("batch"), Dim.symbol("sequence")
    assert dims["y0_2d"] == (batch * sequence, Dim.of(WIDTH))
    assert dims["x1"] == (batch, sequence, Dim.of(WIDTH))
    assert dims["m1_range"] == (sequence,)


def test_an_axis_that_may_be_empty_is_not_claimed_through_a_reshape_back():
    """Reshape copies the input's dim where its target holds 0: with sequence
    possibly 0, reshaping (batch*sequence, 8) back to (batch, sequence, 8)
    proves batch (0 with it) but not sequence."""
    dims = symbolic_dims(two_layers().graph, {"batch"})
    assert dims["y0"] == (Dim.symbol("batch"), None, Dim.of(WIDTH))


def test_each_layers_mask_becomes_one_copy_and_computes_the_same():
    proto = two_layers()
    rng = np.random.default_rng(1)
    for shape in [(1, 1, WIDTH), (2, 5, WIDTH), (3, 17, WIDTH)]:
        feeds = {"x": rng.standard_normal(shape).astype("float32")}
        before = run(proto, feeds)
        rewritten = onnx.ModelProto()
        rewritten.CopyFrom(proto)
        assert share_equal_shapes(rewritten, POSITIVE) == 2  # the Dense's and the mask's Shape(x1)
        merged = merge_common_subexpressions(rewritten)
        remove_dead_nodes(rewritten)
        # The second mask's six nodes, now reading the first's Shape, and the
        # first mask's Shape(x), the same node as the Dense's.
        assert merged == 7
        ops = [node.op_type for node in rewritten.graph.node]
        assert ops.count("Range") == 1 and ops.count("Shape") == 1
        np.testing.assert_array_equal(run(rewritten, feeds)[0], before[0])


def shapes_of(first_dims, second_dims, between):
    """Shape(a) and Shape(b) for inputs of the given dims, with `between` nodes making b from a."""
    inputs = [hidden("a", first_dims)]
    if second_dims is not None:
        inputs.append(hidden("b", second_dims))
    nodes = between + [
        helper.make_node("Shape", ["a"], ["sa"]),
        helper.make_node("Shape", ["b"], ["sb"]),
        helper.make_node("Concat", ["sa", "sb"], ["out"], axis=0),
    ]
    output = helper.make_tensor_value_info("out", TensorProto.INT64, None)
    return model(nodes, list(CONSTANTS), inputs, [output])


@pytest.mark.parametrize(
    ("first", "second", "between"),
    [
        # Two inputs whose axes are named apart, or not named at all.
        (("batch", "sequence"), ("batch", "decoder_sequence"), []),
        ((None, None), (None, None), []),
        # A broadcast between two different symbols could be either.
        (("batch", "sequence"), None, [helper.make_node("Add", ["a", "c"], ["b"])]),
        # A slice of part of a dynamic axis.
        (
            ("batch", "sequence"),
            None,
            [helper.make_node("Slice", ["a", "one", "two", "one"], ["b"])],
        ),
        # An op it does not know.
        (("batch", "sequence"), None, [helper.make_node("Relu6Unknown", ["a"], ["b"])]),
        # A Reshape to a shape it cannot read.
        (("batch", "sequence"), None, [helper.make_node("Reshape", ["a", "c_shape"], ["b"])]),
    ],
)
def test_shapes_that_may_differ_are_not_shared(first, second, between):
    inputs_c = [hidden("c", ("batch", "other")), hidden("c_shape_in", ("n",))]
    proto = shapes_of(first, second, between)
    proto.graph.input.extend(inputs_c)
    proto.graph.node.insert(0, helper.make_node("Cast", ["c_shape_in"], ["c_shape"], to=7))
    assert share_equal_shapes(proto) == 0


@pytest.mark.parametrize(
    ("other", "expected"),
    [
        ((1, 1), ("batch", "sequence")),
        ((1, 4), ("batch", 4)),
        (("batch", "sequence"), ("batch", "sequence")),
    ],
)
def test_broadcasting_keeps_what_it_proves(other, expected):
    proto = shapes_of(("batch", "sequence"), None, [helper.make_node("Add", ["a", "c"], ["b"])])
    proto.graph.input.append(hidden("c", other))
    dims = symbolic_dims(proto.graph)
    assert dims["b"] == tuple(Dim.of(d) if isinstance(d, int) else Dim.symbol(d) for d in expected)


def test_random_ops_and_graph_outputs_are_never_merged():
    nodes = [
        helper.make_node("RandomNormalLike", ["a"], ["r0"]),
        helper.make_node("RandomNormalLike", ["a"], ["r1"]),
        helper.make_node("Neg", ["a"], ["n0"]),
        helper.make_node("Neg", ["a"], ["n1"]),
        helper.make_node("Sub", ["r0", "r1"], ["out"]),
    ]
    outputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("out", "n0", "n1")
    ]
    proto = model(nodes, [], [hidden("a", ("batch", "sequence"))], outputs)
    assert merge_common_subexpressions(proto) == 0
    assert [node.input[0] for node in proto.graph.node][-1] == "r0"


def test_a_merged_value_read_inside_a_subgraph_is_renamed_there_too():
    branch = helper.make_graph(
        [helper.make_node("Identity", ["n1"], ["branch_out"])],
        "branch",
        [],
        [helper.make_tensor_value_info("branch_out", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("Neg", ["a"], ["n0"]),
        helper.make_node("Neg", ["a"], ["n1"]),
        helper.make_node("If", ["flag"], ["out"], then_branch=branch, else_branch=branch),
    ]
    inputs = [
        hidden("a", ("batch", "sequence")),
        helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
    ]
    output = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    proto = model(nodes, [], inputs, [output])
    feeds = {"a": np.arange(6, dtype="float32").reshape(2, 3), "flag": np.array(True)}
    before = run(proto, feeds)
    assert merge_common_subexpressions(proto) == 1
    remove_dead_nodes(proto)
    assert [node.op_type for node in proto.graph.node].count("Neg") == 1
    np.testing.assert_array_equal(run(proto, feeds)[0], before[0])


def _every_tensor_an_output(proto):
    exposed = onnx.ModelProto()
    exposed.CopyFrom(proto)
    outputs = {value.name for value in exposed.graph.output}
    extra = [name for node in exposed.graph.node for name in node.output if name not in outputs]
    exposed.graph.output.extend(helper.make_value_info(name, onnx.TypeProto()) for name in extra)
    return exposed


def _keras_hub_model(kind):
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    sizes = {"vocabulary_size": 100, "num_layers": 2, "hidden_dim": 16, "intermediate_dim": 32}
    if kind == "bart":
        return keras_hub.models.BartBackbone(num_heads=2, max_sequence_length=64, **sizes)
    return keras_hub.models.LlamaBackbone(num_query_heads=4, num_key_value_heads=2, **sizes)


@pytest.mark.tensorflow_only
@pytest.mark.parametrize("kind", ["bart", "llama", "llama with its cache"])
def test_every_claimed_dim_is_the_run_time_dim_on_keras_hub_models(tmp_path, kind):
    """The evaluation's claims against ONNX Runtime's actual shapes, on every
    tensor of an exported keras-hub model, with the encoder and decoder lengths
    apart (the claims are read with batch 3, sequence 7, decoder_sequence 5;
    a cached decoder's past 4 long, so its total length, 11, no Dim can write)."""
    import keras_hub

    from keras_layers.export import ExportOptions, export_model

    path = tmp_path / "model.onnx"
    if kind == "llama with its cache":
        model = keras_hub.models.LlamaCausalLM(_keras_hub_model("llama"), preprocessor=None)
        report = export_model(model, path, task="causal-lm")
    else:
        report = export_model(
            _keras_hub_model(kind), path, ExportOptions(shapes=[(2, 6), "padded"])
        )
    if kind != "bart":  # each decoder layer's mask and rotary tables
        assert report["graph"]["shapes_shared"] > 0
    proto = onnx.load(path)
    claimed = symbolic_dims(proto.graph)
    session = ort.InferenceSession(_every_tensor_an_output(proto).SerializeToString())
    # A decoder's attention_mask spans the past and the new tokens: 4 + 7.
    sizes = {"batch": 3, "sequence": 7, "decoder_sequence": 5, "past_sequence": 4}
    sizes["total_sequence"] = sizes["past_sequence"] + sizes["sequence"]
    types = {"tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(float)": "float32"}
    feeds = {
        value.name: np.ones([sizes.get(d, d) for d in value.shape], types[value.type])
        for value in session.get_inputs()
    }
    names = [value.name for value in session.get_outputs()]
    actual = dict(zip(names, session.run(None, feeds), strict=True))

    def size(dim):
        count, symbols = dim
        return count * int(np.prod([sizes[symbol] for symbol in symbols]))

    checked = 0
    for name, dims in claimed.items():
        if name not in actual or dims is None:
            continue
        got = np.shape(actual[name])
        assert len(dims) == len(got), name
        for dim, length in zip(dims, got, strict=True):
            if dim is not None:
                assert size(dim) == length, (name, dims, got)
                checked += 1
    assert checked > 100  # much of the graph is claimed, not just its inputs


def _int(name, values):
    return const(name, values)


def _float_in(name, dims):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def _int_in(name, dims):
    return helper.make_tensor_value_info(name, TensorProto.INT64, dims)


def _claim_case(nodes, inputs, initializers, feeds, opsets=()):
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_value_info("y", onnx.TypeProto())], initializers
    )
    opset_imports = [helper.make_opsetid("", 18), *opsets]
    return helper.make_model(graph, opset_imports=opset_imports), feeds


def _zeros(*shape):
    return np.zeros(shape, "float32")


MICROSOFT = [helper.make_opsetid("com.microsoft", 1)]
# Graphs where a careless evaluation claims a dim the run does not have, each
# with a feed that shows it (found by review: squeezes of symbols that are 1,
# optional inputs read as absent, backward slices, narrowing casts, FusedMatMul's
# transposes, inputs without a shape, overridable initializers, negative ranges,
# a Reshape target that is 0 at run time).
CLAIM_CASES = {
    "squeeze of a symbol that is 1": _claim_case(
        [helper.make_node("Squeeze", ["x"], ["y"])],
        [_float_in("x", ["batch", 3])],
        [],
        {"x": _zeros(1, 3)},
    ),
    "slice axes given at run time": _claim_case(
        [helper.make_node("Slice", ["x", "s", "e", "axes"], ["y"])],
        [_float_in("x", ["a", 5]), _int_in("axes", [1])],
        [_int("s", [0]), _int("e", [2])],
        {"x": _zeros(4, 5), "axes": np.array([1])},
    ),
    "squeeze axes given at run time": _claim_case(
        [helper.make_node("Squeeze", ["x", "axes"], ["y"])],
        [_float_in("x", [1, 1, 3]), _int_in("axes", [1])],
        [],
        {"x": _zeros(1, 1, 3), "axes": np.array([0])},
    ),
    "split sizes given at run time": _claim_case(
        [helper.make_node("Split", ["x", "sizes"], ["y", "z"])],
        [_float_in("x", [10]), _int_in("sizes", [2])],
        [],
        {"x": _zeros(10), "sizes": np.array([3, 7])},
    ),
    "backward slice": _claim_case(
        [helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"])],
        [_float_in("x", [5])],
        [_int("s", [-10]), _int("e", [-(2**63)]), _int("a", [0]), _int("st", [-1])],
        {"x": _zeros(5)},
    ),
    "cast to uint8": _claim_case(
        [
            helper.make_node("Cast", ["v"], ["b"], to=TensorProto.UINT8),
            helper.make_node("Cast", ["b"], ["i"], to=TensorProto.INT64),
            helper.make_node("Reshape", ["x", "i"], ["y"]),
        ],
        [_float_in("x", [44])],
        [_int("v", [300])],
        {"x": _zeros(44)},
    ),
    "FusedMatMul with transB": _claim_case(
        [helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", transB=1)],
        [_float_in("a", [2, 3]), _float_in("b", [4, 3])],
        [],
        {"a": _zeros(2, 3), "b": _zeros(4, 3)},
        MICROSOFT,
    ),
    "input without a shape": _claim_case(
        [helper.make_node("Identity", ["x"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [],
        {"x": _zeros(2, 3)},
    ),
    "initializer fed anew": _claim_case(
        [helper.make_node("Reshape", ["x", "t"], ["y"])],
        [_float_in("x", [6]), _int_in("t", [2])],
        [_int("t", [2, 3])],
        {"x": _zeros(6), "t": np.array([3, 2])},
    ),
    "range to a negative limit": _claim_case(
        [
            helper.make_node("Sub", ["p", "q"], ["limit"]),
            helper.make_node("Range", ["zero_scalar", "limit", "one_scalar"], ["y"]),
        ],
        [],
        [_int("p", 2), _int("q", 5), _int("zero_scalar", 0), _int("one_scalar", 1)],
        {},
    ),
    "range to a limit not known": _claim_case(
        [
            helper.make_node("ReduceSum", ["v"], ["limit"], keepdims=0),
            helper.make_node("Range", ["zero_scalar", "limit", "one_scalar"], ["y"]),
        ],
        [_int_in("v", ["n"])],
        [_int("zero_scalar", 0), _int("one_scalar", 1)],
        {"v": np.array([2, 3])},
    ),
    "expand to a shape partly known": _claim_case(
        [
            helper.make_node("Shape", ["x"], ["sx"]),
            helper.make_node("ReduceSum", ["v"], ["total"], keepdims=1),
            helper.make_node("Concat", ["sx", "total"], ["target"], axis=0),
            helper.make_node("Cast", ["target"], ["wide"], to=TensorProto.INT32),
            helper.make_node("Cast", ["wide"], ["back"], to=TensorProto.INT64),
            helper.make_node("Expand", ["x", "back"], ["y"]),
        ],
        [_float_in("x", ["a", 1]), _int_in("v", [2])],
        [],
        {"x": _zeros(4, 1), "v": np.array([2, 3])},
    ),
    "constant of a shape partly known": _claim_case(
        [
            helper.make_node("Shape", ["x"], ["sx"]),
            helper.make_node("ReduceSum", ["v"], ["total"], keepdims=1),
            helper.make_node("Concat", ["sx", "total"], ["target"], axis=0),
            helper.make_node("ConstantOfShape", ["target"], ["y"]),
        ],
        [_float_in("x", ["a"]), _int_in("v", [2])],
        [],
        {"x": _zeros(4), "v": np.array([2, 3])},
    ),
    "reshape target 0 at run time": _claim_case(
        [
            helper.make_node("Shape", ["w"], ["sw"]),
            helper.make_node("Concat", ["sw", "minus_one"], ["t"], axis=0),
            helper.make_node("Reshape", ["x", "t"], ["y"]),
        ],
        [_float_in("x", [3, 4]), _float_in("w", ["n"])],
        [_int("minus_one", [-1])],
        {"x": _zeros(3, 4), "w": _zeros(0)},
    ),
    "max of a size and a positive bound": _claim_case(
        [
            helper.make_node("Shape", ["x"], ["sx"]),
            helper.make_node("Max", ["sx", "two"], ["end"]),
            helper.make_node("Slice", ["w", "zero", "end"], ["y"]),
        ],
        [_float_in("x", ["n"]), _float_in("w", [5])],
        [_int("two", [2]), _int("zero", [0])],
        {"x": _zeros(0), "w": _zeros(5)},
    ),
    "select whose condition is known at run time only": _claim_case(
        [
            helper.make_node("Shape", ["x"], ["sx"]),
            helper.make_node("And", ["yes", "pick"], ["both"]),
            helper.make_node("Where", ["both", "sx", "two"], ["end"]),
            helper.make_node("Slice", ["w", "zero", "end"], ["y"]),
        ],
        [
            _float_in("x", ["n"]),
            _float_in("w", [5]),
            helper.make_tensor_value_info("pick", TensorProto.BOOL, [1]),
        ],
        [_int("two", [2]), _int("zero", [0]), const("yes", [True], np.bool_)],
        {"x": _zeros(0), "w": _zeros(5), "pick": np.array([False])},
    ),
    "a size compared with 0": _claim_case(
        [
            helper.make_node("Shape", ["x"], ["sx"]),
            helper.make_node("Equal", ["sx", "zero"], ["empty"]),
            helper.make_node("Cast", ["empty"], ["flag"], to=TensorProto.INT64),
            helper.make_node("Mul", ["flag", "three"], ["more"]),
            helper.make_node("Add", ["two", "more"], ["end"]),
            helper.make_node("Slice", ["w", "zero", "end"], ["y"]),
        ],
        [_float_in("x", ["n"]), _float_in("w", [5])],
        [_int("two", [2]), _int("three", [3]), _int("zero", [0])],
        {"x": _zeros(0), "w": _zeros(5)},
    ),
}


def test_tensorflows_slice_to_the_end_is_proven_to_take_the_whole_axis():
    """`tf.slice(x, begin, size)` with size -1 ("to the end") reaches ONNX as
    end = shape + (shape == -1) * INT_MAX: a size is never -1, so the end is
    the axis's own dim (Qwen3's masks; later layers' rotations hang on them)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["sx"]),
        helper.make_node("Equal", ["sx", "minus_one"], ["unbounded"]),
        helper.make_node("Cast", ["unbounded"], ["flag"], to=TensorProto.INT64),
        helper.make_node("Mul", ["flag", "int_max"], ["extra"]),
        helper.make_node("Add", ["sx", "extra"], ["end"]),
        helper.make_node("Slice", ["x", "starts", "end"], ["y"]),
    ]
    initializers = [
        const("minus_one", [-1]),
        const("int_max", [2**31 - 1]),
        const("starts", [0, 0]),
    ]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    proto = model(nodes, initializers, [hidden("x", ("sequence", "sequence"))], [output])
    dims = symbolic_dims(proto.graph, POSITIVE)
    assert dims["y"] == dims["x"] == (Dim.symbol("sequence"), Dim.symbol("sequence"))
    x = np.random.default_rng(3).standard_normal((5, 5)).astype("float32")
    np.testing.assert_array_equal(run(proto, {"x": x})[0], x)


def test_tensorflows_clamped_slice_end_is_proven_to_take_the_whole_axis():
    """tf2onnx writes `x[:, :shape(x)[1]]` (ESM's rotary tables) with the end
    clamped, `Max(float(ends), [1e9, -1e9, ...])`, and masked by a select
    whose condition ANDs a constant false: the end is the axis's own dim, so
    the slice is all of x, as the run shows."""
    nodes = [
        helper.make_node("Shape", ["x"], ["sx"]),
        helper.make_node("Gather", ["sx", "one_scalar"], ["length"]),
        helper.make_node("Unsqueeze", ["length", "zero"], ["length_1d"]),
        helper.make_node("Concat", ["zero", "length_1d", "zero", "zero"], ["ends"], axis=0),
        helper.make_node("Cast", ["ends"], ["ends_f"], to=TensorProto.FLOAT),
        helper.make_node("Max", ["ends_f", "clamp"], ["clamped_f"]),
        helper.make_node("Cast", ["clamped_f"], ["clamped"], to=TensorProto.INT64),
        helper.make_node("Equal", ["clamped", "big"], ["is_big"]),
        helper.make_node("And", ["is_big", "never"], ["masked"]),
        helper.make_node("Where", ["masked", "small", "clamped"], ["end"]),
        helper.make_node("Slice", ["x", "starts", "end", "axes"], ["y"]),
    ]
    initializers = [
        const("one_scalar", 1),
        const("zero", [0]),
        const("clamp", [1e9, -1e9, 1e9, 1e9], np.float32),
        const("big", [10**9]),
        const("never", [False] * 4, np.bool_),
        const("small", [-(10**9)]),
        const("starts", [0, 0, 0, 0]),
        const("axes", [0, 1, 2, 3]),
    ]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    proto = model(nodes, initializers, [hidden("x", (1, "sequence", 1, WIDTH))], [output])
    dims = symbolic_dims(proto.graph, POSITIVE)
    assert dims["y"] == dims["x"] == (Dim.of(1), Dim.symbol("sequence"), Dim.of(1), Dim.of(WIDTH))
    x = np.random.default_rng(2).standard_normal((1, 7, 1, WIDTH)).astype("float32")
    np.testing.assert_array_equal(run(proto, {"x": x})[0], x)


@pytest.mark.parametrize("case", list(CLAIM_CASES))
def test_no_dim_is_claimed_that_the_run_does_not_have(case):
    proto, feeds = CLAIM_CASES[case]
    claimed = symbolic_dims(proto.graph).get("y")
    actual = run(proto, feeds)[0].shape
    if claimed is not None:
        sizes = {"batch": 1, "a": 4, "n": 0}
        assert len(claimed) == len(actual)
        for dim, length in zip(claimed, actual, strict=True):
            if dim is not None:
                count, symbols = dim
                assert count * int(np.prod([sizes[s] for s in symbols])) == length, claimed


def test_a_merge_never_renames_an_omitted_output():
    """Two LayerNorms alike but for which optional outputs they make: never one."""
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g"], ["y1", "", "inverse"]),
        helper.make_node("LayerNormalization", ["x", "g"], ["y2", "", ""]),
        helper.make_node("Clip", ["x", "", "top"], ["clipped"]),
        helper.make_node("Add", ["y1", "y2"], ["s"]),
        helper.make_node("Add", ["s", "clipped"], ["t"]),
        helper.make_node("Add", ["t", "inverse"], ["out"]),
    ]
    initializers = [
        numpy_helper.from_array(np.ones(3, "float32"), "g"),
        numpy_helper.from_array(np.float32(0.5), "top"),
    ]
    output = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    proto = model(nodes, initializers, [hidden("x", (2, 3))], [output])
    feeds = {"x": np.arange(6, dtype="float32").reshape(2, 3)}
    before = run(proto, feeds)
    assert merge_common_subexpressions(proto) == 0
    assert [node.input[1] for node in proto.graph.node if node.op_type == "Clip"] == [""]
    np.testing.assert_array_equal(run(proto, feeds)[0], before[0])
