"""`passes.conv_layout`: a convolutional graph's Transposes moved to its edges
and its BatchNorms folded into its Convs.

Hand-built graphs in the form tf2onnx writes for Keras' channels-last layers
(a Conv between two Transposes, a BatchNorm as a per-channel Mul and Add in
NHWC) are run in ONNX Runtime, its own graph optimizations off, before and
after the pass: the same outputs on random inputs, and the op counts
expected. Mutants the fold must leave alone (a constant that broadcasts along
a spatial axis, a Conv read twice, a shared weight, a BatchNorm before a
zero-padded Conv) keep their ops and say why. Then keras-hub's ResNet, through
the whole pipeline, at a tiny and a real width, and a ViT, whose fusions come
first and whose graph the pass leaves alone.
"""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from keras_layers.export import export_model
from keras_layers.export.graph import weights
from keras_layers.export.passes import Context, conv_layout
from tests.models import tiny_resnet_classifier

pytestmark = pytest.mark.tensorflow_only  # the pass runs tf2onnx's optimizer

NCHW, NHWC = [0, 3, 1, 2], [0, 2, 3, 1]
RNG = np.random.default_rng(0)


def _normal(*shape, scale=0.3):
    return (scale * RNG.standard_normal(shape)).astype(np.float32)


class _Builder:
    """Nodes and constants of a graph, written as tf2onnx writes Keras' layers."""

    def __init__(self):
        self.nodes, self.constants, self.count = [], {}, 0

    def op(self, op_type, *inputs, **attributes):
        self.count += 1
        name = f"{op_type.lower()}{self.count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [name], **attributes))
        return name

    def const(self, value, name=None):
        name = name or f"c{len(self.constants)}"
        self.constants[name] = np.asarray(value)
        return name

    def conv(self, x, out, into, kernel=3, pads=1, weight=None):
        """Keras' Conv2D (no bias: a BatchNorm follows) on the NHWC `x`:
        Transpose, Conv, Transpose back."""
        weight = weight or self.const(_normal(out, into, kernel, kernel))
        conv = self.op("Conv", self.op("Transpose", x, perm=NCHW), weight, pads=[pads] * 4)
        return self.op("Transpose", conv, perm=NHWC)

    def batch_norm(self, x, channels, shape=None):
        """Keras' inference BatchNormalization as tf2onnx writes it: x * s + t."""
        shape = shape or [channels]
        scale = RNG.uniform(0.5, 1.5, channels).astype(np.float32).reshape(shape)
        return self.op("Add", self.op("Mul", x, self.const(scale)), self.const(_normal(*shape)))

    def model(self, output, input_shape=("batch", "height", "width", 3)):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))
        y = helper.make_tensor_value_info(output, TensorProto.FLOAT, None)
        constants = [numpy_helper.from_array(v, k) for k, v in self.constants.items()]
        graph = helper.make_graph(self.nodes, "g", [x], [y], constants)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        # The output's rank and dims, as the pipeline's graphs have them.
        inferred = onnx.shape_inference.infer_shapes(model)
        model.graph.output[0].CopyFrom(inferred.graph.output[0])
        return model


def _outputs(proto, x, path=None):
    """ONNX Runtime's outputs, its own graph optimizations (its Conv fusions,
    its transpose optimizer) off."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    model = str(path) if path else proto.SerializeToString()
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _after(proto, folder=None):
    """The pass run on a copy of `proto`: (the copy, its result)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(proto)
    result = conv_layout.run(copy, Context.of(copy, data_folder=folder))
    if folder is None:  # (the checker looks for a data file beside the process)
        onnx.checker.check_model(result.proto)
    return result.proto, result


def _ops(proto) -> dict:
    found = {}
    for node in proto.graph.node:
        found[node.op_type] = found.get(node.op_type, 0) + 1
    return found


def _same(before, after, shape=(2, 9, 11, 3)):
    """The graphs compute the same on random inputs (two draws)."""
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        np.testing.assert_allclose(_outputs(after, x), _outputs(before, x), rtol=1e-4, atol=1e-5)


def _reasons(result) -> list:
    return [reason for _, reason in result.declined]


def _resnet_block(stem=8, middle=4, out=16):
    """A ResNet stem and bottleneck block as tf2onnx writes them from Keras:
    12 Transposes, 5 BatchNorms as Mul + Add, a global average pool."""
    b = _Builder()
    h = b.op("Relu", b.batch_norm(b.conv("x", stem, 3), stem))
    h = b.op("Pad", h, b.const(np.array([0, 1, 1, 0, 0, 1, 1, 0], np.int64)))
    h = b.op("MaxPool", b.op("Transpose", h, perm=NCHW), kernel_shape=[3, 3], strides=[2, 2])
    pooled = b.op("Transpose", h, perm=NHWC)
    shortcut = b.batch_norm(b.conv(pooled, out, stem, kernel=1, pads=0), out)
    h = b.op("Relu", b.batch_norm(b.conv(pooled, middle, stem, kernel=1, pads=0), middle))
    h = b.op("Relu", b.batch_norm(b.conv(h, middle, middle), middle))
    h = b.batch_norm(b.conv(h, out, middle, kernel=1, pads=0), out)
    h = b.op("Relu", b.op("Add", shortcut, h))
    pooled = b.op("ReduceMean", h, b.const(np.array([1, 2], np.int64)), keepdims=0)
    logits = b.op("MatMul", pooled, b.const(_normal(out, 5)))
    return b.model(b.op("Add", logits, b.const(_normal(5))))


def test_a_resnet_block_keeps_one_transpose_and_no_batch_norm():
    before = _resnet_block()
    assert _ops(before)["Transpose"] == 12 and _ops(before)["Mul"] == 5
    after, result = _after(before)
    ops = _ops(after)
    assert ops["Transpose"] == 1  # the input's; the pool took the last one in
    assert "Mul" not in ops and ops["Add"] == 2  # the residual and the logits' bias
    assert ops["Conv"] == 5 and result.fused == {"Conv": 5}
    assert result.declined == ()
    assert result.learned["shapes"]  # the layouts moved: shapes inferred again
    _same(before, after)


def test_the_fold_rewrites_a_weight_where_it_is_in_the_data_file(tmp_path):
    before = _resnet_block(stem=16, middle=8, out=32)
    reference = np.random.default_rng(3).standard_normal((2, 9, 11, 3)).astype(np.float32)
    expected = _outputs(before, reference)
    with open(tmp_path / "model.data", "wb") as data:
        for tensor in before.graph.initializer:
            weights.stage(tensor, numpy_helper.to_array(tensor), data)
    external = {t.name for t in before.graph.initializer if weights.is_external(t)}
    assert len(external) == 4  # the kernels of 1 KiB and more; the rest stay in the proto
    after, result = _after(before, tmp_path)
    assert result.fused == {"Conv": 5} and _ops(after)["Transpose"] == 1
    assert external <= {t.name for t in after.graph.initializer if weights.is_external(t)}
    onnx.save(after, tmp_path / "model.onnx")
    np.testing.assert_allclose(
        _outputs(None, reference, tmp_path / "model.onnx"), expected, rtol=1e-4, atol=1e-5
    )


def test_a_loop_body_passing_its_value_through_does_not_stop_the_pass():
    """A Loop body whose output is its own input (a carried value passed
    through, its Identity removed; Qwen3.5's chunk loop) is valid ONNX that
    tf2onnx's Graph refused, so the whole pass failed: now it runs (the
    BatchNorm folds into the Conv) and the file computes the same."""
    b = _Builder()
    h = b.op("Relu", b.batch_norm(b.conv("x", 4, 3), 4))
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("carried", TensorProto.FLOAT, ["n", "a", "b", "c"]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("carried", TensorProto.FLOAT, ["n", "a", "b", "c"]),
        ],
    )
    trips = b.const(np.array(2, np.int64))
    looped = b.op("Loop", trips, "", h, body=body)
    proto = b.model(b.op("ReduceMean", looped, b.const(np.array([1, 2], np.int64)), keepdims=0))
    pooled = helper.make_tensor_value_info(proto.graph.output[0].name, TensorProto.FLOAT, ["n", 4])
    proto.graph.output[0].CopyFrom(pooled)  # (inference stops at the Loop)
    after, result = _after(proto)
    assert not any("failed" in reason for reason in _reasons(result)), _reasons(result)
    assert "Mul" not in _ops(after) and "Add" not in _ops(after)  # the BatchNorm folded
    _same(proto, after)


def test_a_batch_normalization_op_after_a_conv_with_a_bias_is_folded():
    b = _Builder()
    conv = b.op("Conv", "x", b.const(_normal(6, 3, 3, 3)), b.const(_normal(6)), pads=[1] * 4)
    parameters = [
        b.const(RNG.uniform(0.5, 1.5, 6).astype(np.float32)),
        b.const(_normal(6)),
        b.const(_normal(6)),
        b.const(RNG.uniform(0.5, 1.5, 6).astype(np.float32)),
    ]
    norm = b.op("BatchNormalization", conv, *parameters, epsilon=1e-3)
    before = b.model(b.op("Relu", norm), input_shape=("batch", 3, "height", "width"))
    after, result = _after(before)
    assert _ops(after) == {"Conv": 1, "Relu": 1} and result.fused == {"Conv": 1}
    _same(before, after, shape=(2, 3, 7, 5))


@pytest.mark.parametrize("group", [1, 2])
def test_a_batch_norm_after_a_conv_transpose_is_folded_per_output_channel(group):
    """A ConvTranspose's weight is [in, out / group, kh, kw]: the output
    channel of a filter depends on its input channel's group."""
    b = _Builder()
    up = b.op(
        "ConvTranspose",
        b.op("Transpose", "x", perm=NCHW),
        b.const(_normal(4, 6 // group, 3, 3)),
        strides=[2, 2],
        pads=[1, 1, 0, 0],
        group=group,
    )
    h = b.batch_norm(b.op("Transpose", up, perm=NHWC), 6)
    before = b.model(b.op("Relu", h), input_shape=("batch", "height", "width", 4))
    after, result = _after(before)
    assert _ops(after) == {"Transpose": 2, "ConvTranspose": 1, "Relu": 1}
    assert result.fused == {"Conv": 1}
    _same(before, after, shape=(2, 5, 4, 4))


def test_a_conv1d_folds_its_batch_norm_through_the_squeeze():
    """Keras' Conv1D as tf2onnx writes it: a Conv2D of one row between an
    Unsqueeze and a Squeeze, then the NWC Transpose."""
    b = _Builder()
    h = b.op("Transpose", b.op("Unsqueeze", "x", b.const(np.array([-3]))), perm=NCHW)
    h = b.op("Conv", h, b.const(_normal(8, 6, 1, 3)), pads=[0, 1, 0, 1])
    h = b.op("Transpose", b.op("Squeeze", h, b.const(np.array([2]))), perm=[0, 2, 1])
    before = b.model(b.op("Relu", b.batch_norm(h, 8)), input_shape=("batch", "time", 6))
    after, result = _after(before)
    assert "Mul" not in _ops(after) and "Add" not in _ops(after)
    # One Transpose at each edge: after the input's Unsqueeze, before the NWC output.
    assert _ops(after)["Transpose"] == 2 and result.fused == {"Conv": 1}
    assert result.declined == ()
    _same(before, after, shape=(2, 7, 6))


def test_a_squeeze_and_excite_gate_and_its_pool_take_no_transpose():
    """EfficientNet's block as tf2onnx writes it: the gate, [N, 1, 1, C],
    multiplies the NHWC features; the pool drops the spatial axes."""
    b = _Builder()
    h = b.batch_norm(b.conv("x", 8, 3), 8)
    h = b.op("Mul", h, b.op("Sigmoid", h))  # swish
    squeezed = b.op("ReduceMean", h, b.const(np.array([1, 2], np.int64)), keepdims=0)
    squeezed = b.op("Reshape", squeezed, b.const(np.array([-1, 8, 1, 1], np.int64)))
    gate = b.op("Conv", squeezed, b.const(_normal(8, 8, 1, 1)), b.const(_normal(8)))
    gate = b.op("Reshape", b.op("Sigmoid", gate), b.const(np.array([-1, 1, 1, 8], np.int64)))
    h = b.batch_norm(b.conv(b.op("Mul", h, gate), 8, 8, kernel=1, pads=0), 8)
    pooled = b.op("ReduceMean", b.op("Div", h, b.const(np.float32(2))), b.const([1, 2]))
    before = b.model(b.op("Relu", pooled))
    after, result = _after(before)
    ops = _ops(after)
    assert ops["Transpose"] == 1 and ops["Mul"] == 2  # the swish and the gate
    assert result.fused == {"Conv": 2}
    _same(before, after)


def test_a_dense_block_concatenates_channels_first_and_says_why_its_norm_stays():
    b = _Builder()
    rescaled = b.op("Add", b.op("Mul", "x", b.const(np.float32(2 / 255))), b.const(np.float32(-1)))
    first = b.op("Relu", b.batch_norm(b.conv(rescaled, 4, 3), 4))
    second = b.conv(first, 4, 4)
    joined = b.op("Concat", first, second, axis=3)
    h = b.op("Relu", b.batch_norm(joined, 8))  # DenseNet's pre-activation norm
    h = b.conv(h, 4, 8, kernel=1, pads=0)
    before = b.model(b.op("ReduceMean", h, b.const(np.array([1, 2], np.int64)), keepdims=0))
    after, result = _after(before)
    assert _ops(after)["Transpose"] == 1 and _ops(after)["Mul"] == 2  # rescaling, norm
    assert result.fused == {"Conv": 1}
    # (the Transpose after Keras' Rescaling, at the input, is no reason)
    assert _reasons(result) == ["BN after Concat, not a Conv: no Conv to fold it into"]
    _same(before, after)


@pytest.mark.parametrize("op", ["Mul", "Add"])
def test_a_constant_broadcast_along_a_spatial_axis_is_not_folded(op):
    """[1, C, 1, 1] on the NHWC tensor varies along H (as long as C here):
    tf2onnx's own Add fold would take it as the channels."""
    b = _Builder()
    h = b.op(op, b.conv("x", 6, 3), b.const(RNG.uniform(0.5, 1.5, (1, 6, 1, 1)).astype(np.float32)))
    before = b.model(b.op("Relu", h), input_shape=(2, 6, 5, 3))
    after, result = _after(before)
    assert _ops(after)[op] == 1 and result.fused == {"Conv": 0}
    assert _reasons(result) == ["its constant broadcasts along another axis than the channels"]
    _same(before, after, shape=(2, 6, 5, 3))


def test_a_conv_read_twice_or_a_shared_weight_is_not_folded():
    b = _Builder()
    conv = b.op(
        "Conv", b.op("Transpose", "x", perm=NCHW), b.const(_normal(4, 3, 3, 3)), pads=[1] * 4
    )
    twice = b.batch_norm(b.op("Transpose", conv, perm=NHWC), 4)
    other = b.op("Transpose", b.op("Relu", conv), perm=NHWC)
    weight = b.const(_normal(4, 3, 3, 3))
    shared = b.op("Add", *(b.batch_norm(b.conv("x", 4, 3, weight=weight), 4) for _ in range(2)))
    before = b.model(b.op("Add", b.op("Add", twice, other), shared))
    after, result = _after(before)
    assert _ops(after)["Mul"] == 3 and result.fused == {"Conv": 0}
    assert sorted(_reasons(result)) == [
        "the Conv's output has another reader",
        "the Conv's weight is read by another node too",
        "the Conv's weight is read by another node too",
    ]
    _same(before, after)


@pytest.mark.parametrize(
    "pads, reason",
    [
        (1, "BN before a zero-padded Conv: not exact (the padded border gets no offset)"),
        (0, "BN before a Conv: folding it into the Conv after it is not done"),
    ],
)
def test_a_batch_norm_before_a_conv_stays_and_says_why(pads, reason):
    b = _Builder()
    h = b.batch_norm("x", 3, shape=[1, 3, 1, 1])
    before = b.model(
        b.op("Conv", h, b.const(_normal(4, 3, 3, 3)), pads=[pads] * 4),
        input_shape=("batch", 3, "height", "width"),
    )
    after, result = _after(before)
    assert _ops(after) == {"Mul": 1, "Add": 1, "Conv": 1}
    assert _reasons(result) == [reason]
    _same(before, after, shape=(2, 3, 7, 5))


@pytest.mark.parametrize("filters", [[64, 16], [64, 256]], ids=["tiny", "256 channels"])
def test_a_keras_hub_resnet_keeps_one_transpose_and_no_batch_norm(tmp_path, filters):
    report = export_model(tiny_resnet_classifier(filters), tmp_path / "resnet.onnx")
    assert report["passed"]
    proto = onnx.load(tmp_path / "resnet.onnx", load_external_data=False)
    ops = _ops(proto)
    assert ops["Transpose"] <= 2 and "Mul" not in ops, ops
    convs = {node.output[0] for node in proto.graph.node if node.op_type == "Conv"}
    initializers = {tensor.name for tensor in proto.graph.initializer}
    for node in proto.graph.node:
        if node.op_type == "Add" and set(node.input) & convs:
            assert not set(node.input) & initializers, "an Add of a constant after a Conv"
    written = json.loads((tmp_path / "resnet.report.json").read_text())["graph"]
    assert written["fused"]["Conv"] == 9 and "Conv" not in written["declined"]


def test_a_vit_keeps_its_fusions_and_the_pass_leaves_its_graph_alone(tmp_path):
    """A ViT's patch embedding is a Conv: the pass runs on it, after the
    fusions, and its Transposes stop at the patches' Reshape."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.ViTBackbone(
        image_shape=(32, 32, 3),
        patch_size=8,
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        mlp_dim=64,
    )
    report = export_model(
        keras_hub.models.ViTImageClassifier(backbone, num_classes=5), tmp_path / "vit.onnx"
    )
    assert report["passed"]
    fused = report["graph"]["fused"]
    # Each exact GELU with its Dense's bias: the Dense is one MatMul (`fusions.matmul`).
    assert (fused["MultiHeadAttention"], fused["LayerNormalization"], fused["BiasGelu"]) == (
        2,
        5,
        2,
    )
    assert fused["Conv"] == 0
    proto = onnx.load(tmp_path / "vit.onnx")
    again, result = _after(proto)
    assert _ops(again) == _ops(proto) and result.changed == 0


def _pooled_rms_norm_head():
    """MobileNetV5's head, in Keras: a global pool kept 1 x 1, a 1x1 Conv, an
    RMS norm over its channels, a classifier. Free image sides."""
    import keras

    images = keras.Input((None, None, 3), name="images")
    x = keras.layers.Conv2D(8, 3, strides=2, padding="same")(images)
    x = keras.layers.GlobalAveragePooling2D(keepdims=True)(x)
    x = keras.layers.Conv2D(32, 1)(x)
    x = keras.layers.LayerNormalization(rms_scaling=True)(x)
    x = keras.layers.Flatten()(x)
    return keras.Model(images, keras.layers.Dense(3)(x))


def test_a_transpose_of_axes_of_size_one_is_no_reshape_by_a_stale_shape(tmp_path):
    """tf2onnx's TransposeOptimizer ends by turning each Transpose that moves
    only axes of size 1 into a Reshape, by shapes it records; a Transpose it
    moved left (N, 32, 1, 1) recorded in the NHWC layout, and the Reshape
    gave (N, 1, 32, 1): the norm averaged one value and the logits had 32
    rows per image (keras-hub's MobileNetV5). The file gives Keras' logits,
    one row per image, at sizes the grid did not choose."""
    model = _pooled_rms_norm_head()
    report = export_model(model, tmp_path / "head.onnx")
    assert report["passed"]
    session = ort.InferenceSession(str(tmp_path / "head.onnx"))
    for shape in ((1, 33, 47, 3), (3, 64, 96, 3)):
        images = RNG.uniform(0, 1, shape).astype(np.float32)
        (got,) = session.run(None, {"images": images})
        np.testing.assert_allclose(got, np.asarray(model(images)), rtol=1e-4, atol=1e-5)
