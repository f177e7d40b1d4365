"""A convolutional model's layout: its Transposes moved to the edges, its
BatchNorms folded into its Convs.

Keras builds images channels-last (NHWC); ONNX's Conv and pooling are
channels-first (NCHW). tf2onnx wraps each Conv in a Transpose pair and writes
an inference BatchNormalization as a per-channel `Mul` and `Add` between them.
Its TransposeOptimizer, which cancels such pairs, ran during conversion, but
the weights were graph inputs then (`tracing`): a `Mul` by a weight is no
`Mul` by a constant to it, and every pair stayed (a keras-hub ResNet: 16
Transposes, 9 Mul).

Measured on that ResNet (the file the pipeline wrote, its weights constants):
ONNX Runtime's offline optimizer at its basic level leaves 3 Transposes and 2
Mul, turns MatMul + Add into Gemm and imports every domain it knows; onnxslim
and onnxscript's optimizer and rewriter leave all 16 (their Conv fusions take
scalars only); tf2onnx's own optimizers leave 2 Transposes and no Mul. So the
Transposes are moved by tf2onnx's TransposeOptimizer, run again
(`_move_transposes`) with every weight and every Conv input hidden from it as
graph inputs: it moves Transposes and writes no weight. `_layout_optimizer`
adds what it lacks (an EfficientNet kept 6 of its 20 Transposes without): a
reduction with `keepdims=0` at opset 18 (a classifier's global average pool
takes the last Transpose in), a `Mul` by a broadcast tensor (a
squeeze-and-excite gate), `Div`, more elementwise ops, a working check for a
cancelling pair; and it folds no `Add` into a Conv's bias, which tf2onnx does
without checking the constant's broadcast.

Then `fold_affines`, ours, folds the per-channel `Mul`, `Add`, `Sub`, `Div`
and `BatchNormalization` after each Conv or ConvTranspose (through views that
keep the channels: a Transpose left, the Squeeze of Keras' Conv1D) into its
weight and bias, W' = W * s[:, None, None, None] and b' = b * s + t, where
that is exact: the constants vary along the channels alone, the Conv's output
is read by them alone and its weight by it alone (rewritten where it is, in
the data file if there). A BatchNorm before a Conv is not folded forward:
with zero padding the border would not get its offset. Each candidate left,
and each Transpose left between two ops, is declined with its reason.

It runs after every fusion, which match the graph tf2onnx wrote (a ViT's
patch embedding is a Conv), and only on graphs with a Conv.
"""

import functools

import numpy as np
from onnx import TensorProto, helper, numpy_helper, shape_inference

from keras_layers.export.graph import (
    Graph,
    attribute,
    body_reads,
    perm,
    remove_dead_nodes,
    sort_topologically,
    subgraphs,
    tensor_ranks,
    tensor_shapes,
    weights,
)
from keras_layers.export.passes.context import Context, PassResult

MAKES = ("Conv",)  # the Convs that took a BatchNorm (or another per-channel affine) in

# Elementwise ops of one input tf2onnx's TransposeOptimizer does not know.
_ELEMENTWISE = (
    "Celu",
    "Ceil",
    "Floor",
    "Gelu",
    "HardSigmoid",
    "HardSwish",
    "IsInf",
    "IsNaN",
    "Mish",
    "Not",
    "Round",
    "Sign",
    "Softsign",
    "ThresholdedRelu",
)
# Elementwise ops of two inputs it moves a Transpose through by transposing the other.
_BINARY = ("Add", "Div", "Pow")
_REDUCTIONS = ("ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum")
# The per-channel affine ops folded into a Conv.
_AFFINES = ("Mul", "Add", "Sub", "Div", "BatchNormalization")
_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)
_CONVS = ("Conv", "ConvTranspose")
# Ops between a Conv and its affines that move no value across channels.
_VIEWS = ("Transpose", "Squeeze", "Unsqueeze")


@functools.cache
def _layout_optimizer():
    """tf2onnx's TransposeOptimizer with the handlers this pass adds (see the
    module docstring), or None where tf2onnx cannot be imported. Its
    internals are listed in `compat.INTERNALS`."""
    try:
        from tf2onnx import utils
        from tf2onnx.optimizer.transpose_optimizer import TransposeOptimizer
    except ImportError:
        return None

    class LayoutOptimizer(TransposeOptimizer):
        def _initialize_handlers(self):
            super()._initialize_handlers()
            for op in _ELEMENTWISE:
                self._handler_map[op] = self._simple_through_handler
            # Its `_add_handler` would fold a constant into a bias-less Conv's
            # bias, a constant of shape [1, C, 1, 1] too, which broadcasts
            # along H of the NHWC tensor: `fold_affines` folds, with its checks.
            for op in _BINARY:
                self._handler_map[op] = self._handle_node_having_branches
            self._handler_map["Mul"] = self._mul_or_branches
            for op in _REDUCTIONS:
                self._handler_map[op] = self._reduction

        def _output_node_has_single_consumer_node(self, node):
            # Its `_transpose_handler` asks this of the second Transpose of a
            # pair before cancelling it, and looks that node up by its
            # output's name, which no node has (tf2onnx names a node's outputs
            # "node:0"): no pair was cancelled. The cancelling points every
            # reader of the second at the first's input, and keeps a graph
            # output by an Identity: right for any number of readers.
            del node
            return True

        def _mul_or_branches(self, trans, node):
            # Its own returns False, having changed nothing, where the other
            # input is neither a constant nor the same Transpose: a
            # squeeze-and-excite gate, [N, 1, 1, C], is transposed instead.
            return self._mul_handler(trans, node) or self._handle_node_having_branches(trans, node)

        def _reduction(self, trans, node):
            if node.get_attr_value("keepdims", 1) == 1 or len(node.input) < 2:
                if node.type == "ReduceSum":
                    return self._reducesum_handler(trans, node)
                return self._reduce_handler(trans, node)
            return self._reduction_dropping_axes(trans, node)

        def _reduction_dropping_axes(self, trans, node):
            """Reduce(Transpose(x, p), axes, keepdims=0) is Reduce(x, p[axes])
            with the kept axes put back in their order by a smaller Transpose
            (none where they keep it, a global pool's [N, C])."""
            if not node.inputs[1].is_const():
                return False
            order = trans.get_attr_value("perm")
            rank = len(order)
            axes = sorted({order[int(a) % rank] for a in node.inputs[1].get_tensor_value()})
            kept = [axis for axis in order if axis not in axes]
            if not axes or not kept:  # (no axes: all, or none with noop_with_empty_axes)
                return False
            shape = self._g.get_shape(node.output[0])
            if not self._switch_transpose_and_node(node, trans, update_shape=False):
                return False
            name = utils.make_name(node.inputs[1].name)
            new_axes = self._g.make_const(name, np.array(axes, np.int64))
            self._g.replace_input(node, node.input[1], new_axes.output[0], 1)
            back = [sorted(kept).index(axis) for axis in kept]
            trans.set_attr("perm", back)
            if shape:
                self._g.set_shape(node.output[0], [shape[back.index(i)] for i in range(len(back))])
            return True

    return LayoutOptimizer


def _read_by_bodies(proto) -> list:
    """The values of the main graph that an If, Loop or Scan body reads, as
    graph outputs (`ValueInfoProto`s of their type).

    A body reads them by name, which the TransposeOptimizer does not see: it
    would move a Transpose past such a value, and the body would read NCHW
    where it was written for NHWC (SAM3's box encoder gathered from its
    feature map with the channel index on the height axis). Shown to it as
    graph outputs, they keep their layout.
    """
    graph = proto.graph
    made = {name for node in graph.node for name in node.output}
    read = sorted({name for node in graph.node for name in body_reads(node)} & made)
    if not read:
        return []
    types = {value.name: value for value in graph.value_info}
    if any(name not in types for name in read):
        weights_shown = [  # their types and shapes, without their values
            helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
            for t in graph.initializer
        ]
        view = helper.make_graph(list(graph.node), "view", [*graph.input, *weights_shown], [])
        inferred = shape_inference.infer_shapes(
            helper.make_model(
                view, opset_imports=list(proto.opset_import), ir_version=proto.ir_version
            )
        )
        types.update({value.name: value for value in inferred.graph.value_info})
    return [
        helper.make_tensor_value_info(name, types[name].type.tensor_type.elem_type, None)
        for name in read
        if name in types
    ]


def _body_outputs_made(graph) -> None:
    """Give every body output that no node of the body makes an `Identity`.

    A Loop body passes a carried value through unchanged as an output that is
    its own input (its Identity removed by the passes before). ONNX allows
    it; tf2onnx's `Graph` does not, and raised on Qwen3.5's chunk loop, so
    the optimizer never ran on the whole model.
    """
    for node in graph.node:
        for body in subgraphs(node):
            _body_outputs_made(body)
            made = {name for inner in body.node for name in inner.output}
            for index, output in enumerate(body.output):
                if output.name not in made:
                    passed = f"{node.name or node.op_type}_passed_{index}"
                    body.node.append(helper.make_node("Identity", [output.name], [passed]))
                    output.name = passed


def _with_hidden(proto, hidden: set, shown_outputs=()):
    """A model of `proto`'s nodes and initializers, those in `hidden` shown
    as graph inputs of their type and shape instead, and `shown_outputs`
    (values no Transpose may move past) as graph outputs too."""
    graph = proto.graph
    shown = [
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in graph.initializer
        if t.name in hidden
    ]
    view = helper.make_graph(
        list(graph.node),
        graph.name,
        [*graph.input, *shown],
        [*graph.output, *shown_outputs],
        [t for t in graph.initializer if t.name not in hidden],
    )
    opsets = list(proto.opset_import)
    return helper.make_model(view, opset_imports=opsets, ir_version=proto.ir_version)


def _move_transposes(proto) -> str | None:
    """Run `_layout_optimizer` over `proto`'s graph, every weight in a data
    file and every Conv input hidden from it, and take its nodes and
    constants. Returns why it did not, or None."""
    optimizer = _layout_optimizer()
    if optimizer is None:
        return "Transpose: tf2onnx cannot be imported"
    from tf2onnx.graph import GraphUtil
    from tf2onnx.optimizer import ConstFoldOptimizer, IdentityOptimizer, optimize_graph

    graph = proto.graph
    convs = {name for node in graph.node if node.op_type in _CONVS for name in node.input[1:]}
    hidden = {t.name for t in graph.initializer if weights.is_external(t) or t.name in convs}
    # With two more of tf2onnx's own sequence, in a loop until nothing
    # changes: the constant folding folds the Reshapes and Transposes of a
    # constant the TransposeOptimizer writes. Not its back-to-back optimizer:
    # it merges Reshape(Reshape(x, s1), s2) into Reshape(x, s2) where s2
    # copies a dim (a 0) from s1's output, and the attention fusion writes
    # such pairs.
    steps = {
        "optimize_transpose": optimizer,
        "fold_constants": ConstFoldOptimizer,
        "remove_identity": IdentityOptimizer,
    }
    try:
        view = _with_hidden(proto, hidden, _read_by_bodies(proto))
        _body_outputs_made(view.graph)
        g = GraphUtil.create_graph_from_onnx_model(view)
        moved = optimize_graph(g, catch_errors=False, optimizers=steps).make_graph("")
    except Exception as error:  # noqa: BLE001 - its failure must not end the export
        return f"Transpose: tf2onnx's TransposeOptimizer failed ({type(error).__name__}: {error})"
    made = {name for node in moved.node for name in node.output}
    made |= {t.name for t in moved.initializer} | {v.name for v in graph.input} | hidden
    lost = [v.name for v in graph.output if v.name not in made]
    if lost:
        return f"Transpose: tf2onnx's TransposeOptimizer lost the output {lost[0]}"
    kept = [t for t in graph.initializer if t.name in hidden]
    del graph.node[:]
    graph.node.extend(moved.node)
    del graph.initializer[:]
    graph.initializer.extend([*kept, *moved.initializer])
    del graph.value_info[:]  # the layouts moved under the tensors' names
    sort_topologically(graph)
    return None


def _per_channel(value, rank: int, axis: int, channels: int):
    """`value` as a [channels] vector where, broadcast against a rank-`rank`
    tensor, it varies along `axis` alone; else None."""
    if value is None or value.ndim > rank:
        return None
    shape = (1,) * (rank - value.ndim) + value.shape
    if any(size != 1 for i, size in enumerate(shape) if i != axis):
        return None
    if shape[axis] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1).astype(np.float64), (channels,))


def _affine(g: Graph, node, source: str, rank: int, axis: int, channels: int):
    """(scale, offset) per channel of what `node` computes of `source`; None
    where it is no affine of a constant (a residual `Add`); a reason where it
    is one that cannot fold."""
    if node.op_type == "BatchNormalization":
        return _batch_norm(g, node, axis, channels)
    if len(node.input) != 2 or node.input[0] == node.input[1]:
        return None
    position = list(node.input).index(source)
    other = g.const(node.input[1 - position])
    if other is None or (node.op_type == "Div" and position == 1):
        return None  # c / x is no affine of x
    if other.dtype.kind != "f":
        return "its constant is not a float"
    value = _per_channel(other, rank, axis, channels)
    if value is None:
        return "its constant broadcasts along another axis than the channels"
    ones, zeros = np.ones(channels), np.zeros(channels)
    if node.op_type == "Mul":
        return value, zeros
    if node.op_type == "Add":
        return ones, value
    if node.op_type == "Sub":
        return (ones, -value) if position == 0 else (-ones, value)
    if not np.all(value):
        return "it divides by zero"
    return 1 / value, zeros


def _batch_norm(g: Graph, node, axis: int, channels: int):
    """(scale, offset) of an inference BatchNormalization, or a reason."""
    if axis != 1:
        return "a BatchNormalization after a Transpose of the Conv normalises another axis"
    if attribute(node, "training_mode", 0) or len([name for name in node.output if name]) != 1:
        return "the BatchNormalization runs in training mode"
    values = [g.const(name) for name in node.input[1:5]]
    if any(v is None or v.size not in (1, channels) for v in values):
        return "the BatchNormalization's parameters are not constants of the channels"
    gamma, beta, mean, variance = (
        np.broadcast_to(v.reshape(-1).astype(np.float64), (channels,)) for v in values
    )
    scale = gamma / np.sqrt(variance + attribute(node, "epsilon", 1e-5))
    return scale, beta - mean * scale


def _reads_a_constant(g: Graph, node) -> bool:
    return node.op_type in _AFFINES and any(g.const(name) is not None for name in node.input)


def _view_axes(g: Graph, node):
    """The constant axes of a Squeeze or Unsqueeze (an input from opset 13), or None."""
    if len(node.input) > 1:
        axes = g.const(node.input[1])
        return None if axes is None else [int(a) for a in np.ravel(axes)]
    return attribute(node, "axes", None)


def _channel_after(g: Graph, node, axis: int, rank: int):
    """(channel axis, rank) after the view `node`: a Transpose, or a Squeeze
    or Unsqueeze of constant axes other than the channels'; None where it is
    no such view."""
    if node.op_type == "Transpose":
        return (perm(node) or list(range(rank))[::-1]).index(axis), rank
    axes = _view_axes(g, node) if node.op_type in ("Squeeze", "Unsqueeze") else None
    if not axes:
        return None
    if node.op_type == "Squeeze":
        axes = {a % rank for a in axes}
        return None if axis in axes else (axis - sum(a < axis for a in axes), rank - len(axes))
    wider = rank + len(axes)
    axes = {a % wider for a in axes}
    return [i for i in range(wider) if i not in axes][axis], wider


def _chain(g: Graph, conv, rank: int, channels: int):
    """The affines after `conv`, each read by the next alone, through views
    (a Transpose, a Squeeze: Keras' Conv1D is a Conv2D of one row) that keep
    the channels: (nodes, scale, offset); a reason where the first affine
    cannot fold; None where no affine of a constant reads the Conv."""
    value, axis, nodes = conv.output[0], 1, []
    scale, offset, folded = np.ones(channels), np.zeros(channels), 0
    while value not in g.outputs and len(g.consumers[value]) == 1:
        (node,) = g.consumers[value]
        if node.op_type in _VIEWS:
            moved = _channel_after(g, node, axis, rank)
            if moved is None:
                break
            axis, rank = moved
        elif node.op_type in _AFFINES:
            step = _affine(g, node, value, rank, axis, channels)
            if isinstance(step, str) and not folded:
                return step
            if not isinstance(step, tuple):
                break
            scale, offset = scale * step[0], offset * step[0] + step[1]
            folded = len(nodes) + 1
        else:
            break
        nodes.append(node)
        value = node.output[0]
    else:
        if not folded and any(_reads_a_constant(g, n) for n in g.consumers[value]):
            producer = g.producer[value].op_type
            return f"the {producer}'s output has another reader" + (
                "" if producer in _CONVS else " (after the Conv)"
            )
    return (nodes[:folded], scale, offset) if folded else None


def _output_channels(conv, kernel) -> int:
    """A Conv's weight is [out, in / group, ...]; a ConvTranspose's [in, out / group, ...]."""
    if conv.op_type == "Conv":
        return kernel.dims[0]
    return kernel.dims[1] * attribute(conv, "group", 1)


def _scaled(conv, values, scale):
    """The weight `values` of `conv` with each output channel's filter times its scale."""
    if conv.op_type == "Conv":
        return values * scale.reshape((-1,) + (1,) * (values.ndim - 1))
    inputs, outputs = values.shape[:2]
    group = attribute(conv, "group", 1)
    # Input channel i feeds the outputs of its group only: output channel
    # (i // (inputs / group)) * outputs + j is its j-th.
    channel = (np.arange(inputs) // (inputs // group))[:, None] * outputs + np.arange(outputs)
    return values * scale[channel].reshape((inputs, outputs) + (1,) * (values.ndim - 2))


def _plan(g: Graph, conv):
    """What folding the affines after `conv` takes: (its weight, the
    affines' nodes and the views between, scale, offset); a reason where
    they cannot fold; None where no affine follows it."""
    kernel = g.initializers.get(conv.input[1])
    if kernel is None or kernel.data_type not in _FLOATS or len(kernel.dims) < 3:
        if any(_reads_a_constant(g, node) for node in g.consumers[conv.output[0]]):
            return "the Conv's weight is not a float constant"
        return None
    found = _chain(g, conv, len(kernel.dims), _output_channels(conv, kernel))
    if found is None or isinstance(found, str):
        return found
    if len(g.consumers[kernel.name]) != 1 or kernel.name in g.outputs:
        return "the Conv's weight is read by another node too"
    if len(conv.input) > 2 and conv.input[2] and g.const(conv.input[2]) is None:
        return "the Conv's bias is not a constant in the graph"
    return (kernel, *found)


def _fold(g: Graph, conv, plan, folder, name: str) -> list:
    """Fold as `plan` says: the weight scaled where it is, a new bias
    `name`, the Conv (or the last view after it) making the last affine's
    output. Returns the nodes to remove."""
    kernel, nodes, scale, offset = plan
    dtype = helper.tensor_dtype_to_np_dtype(kernel.data_type)
    scaled = _scaled(conv, weights.values(kernel, folder), scale)
    weights.replace(kernel, scaled.astype(dtype), folder)
    bias = g.const(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else 0
    new_bias = (np.asarray(bias, np.float64) * scale + offset).astype(dtype)
    g.graph.initializer.append(numpy_helper.from_array(new_bias, name))
    del conv.input[2:]
    conv.input.append(name)
    # The views stay, in their order, from the Conv to the last affine's output.
    last, value = nodes[-1].output[0], conv.output[0]
    views = [node for node in nodes if node.op_type in _VIEWS]
    for view in views:
        view.input[0], value = value, view.output[0]
    (views[-1] if views else conv).output[0] = last
    return [node for node in nodes if node.op_type not in _VIEWS]


def fold_affines(proto, folder=None) -> tuple[int, list]:
    """Fold the per-channel affines after each Conv into its weight and bias.

    Args:
        proto: the ModelProto, changed in place.
        folder: the folder of its data files, if any (`graph.weights`).

    Returns:
        (how many Convs took affines in, [(Conv output, reason)] for each
        Conv an affine reads that was left alone).
    """
    graph = proto.graph
    g = Graph(graph)
    taken = set(g.producer) | set(g.initializers) | g.inputs
    # Every plan is made on the graph as it was: no two share a node (each
    # affine is read by the next alone), and a fold changes nothing another
    # plan reads.
    plans = [(conv, _plan(g, conv)) for conv in graph.node if conv.op_type in _CONVS]
    declined = [(conv.output[0], plan) for conv, plan in plans if isinstance(plan, str)]
    removed = set()
    for conv, plan in plans:
        if isinstance(plan, tuple):
            name = conv.output[0] + "_bias"
            while name in taken:
                name += "_"
            taken.add(name)
            removed.update(id(node) for node in _fold(g, conv, plan, folder, name))
    if removed:
        kept = [node for node in graph.node if id(node) not in removed]
        del graph.node[:]
        graph.node.extend(kept)
    return sum(isinstance(plan, tuple) for _, plan in plans), declined


def _is_batch_norm_like(g: Graph, node, rank: int) -> bool:
    """Whether `node` multiplies or offsets a rank-`rank` tensor by a
    constant of more than one value varying along the channels (in either
    layout)."""
    if node.op_type == "BatchNormalization":
        return True
    if node.op_type not in _AFFINES:
        return False
    constants = [value for value in map(g.const, node.input) if value is not None]
    if len(constants) != 1 or constants[0].size < 2:
        return False
    (value,) = constants
    return any(_per_channel(value, rank, axis, value.size) is not None for axis in (1, rank - 1))


def _source(g: Graph, node) -> str | None:
    return next((name for name in node.input if g.const(name) is None), None)


def _after_a_conv(g: Graph, node, rank: int) -> bool:
    """Whether `node` reads a Conv through views, or another BN-like affine
    (then the fold, or that affine, gave the reason)."""
    producer = g.producer.get(_source(g, node))
    while producer is not None and producer.op_type in _VIEWS:
        producer = g.producer.get(producer.input[0])
    if producer is None:
        return False
    return producer.op_type in _CONVS or _is_batch_norm_like(g, producer, rank)


def _conv_after(g: Graph, node):
    """(the Conv the affines from `node` on feed, alone, through views or a
    Pad; whether it pads) or (None, False)."""
    value, padded = node.output[0], False
    for _ in range(8):
        readers = g.consumers[value]
        if len(readers) != 1:
            break
        (reader,) = readers
        if reader.op_type == "Conv" and reader.input[0] == value:
            pads = attribute(reader, "pads", [])
            auto = attribute(reader, "auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID")
            return reader, padded or any(pads) or auto
        if reader.op_type == "Pad":
            padded = True
        elif reader.op_type not in _VIEWS and not _reads_a_constant(g, reader):
            break
        value = reader.output[0]
    return None, False


def batch_norms_left(proto, shapes: dict) -> list:
    """(output, reason) for each BatchNorm left (a per-channel affine that
    reads no Conv): why no Conv took it in.

    Args:
        proto: the ModelProto.
        shapes: `graph.tensor_shapes` of its graph.

    Returns:
        One entry for the first affine of each.
    """
    g = Graph(proto.graph)
    ranks = tensor_ranks(shapes)
    kernels = [g.initializers.get(n.input[1]) for n in proto.graph.node if n.op_type in _CONVS]
    conv_ranks = {len(kernel.dims) for kernel in kernels if kernel is not None}
    declined = []
    for node in proto.graph.node:
        rank = ranks.get(node.output[0]) if node.output else None
        if rank not in conv_ranks or not _is_batch_norm_like(g, node, rank):
            continue
        if _after_a_conv(g, node, rank):
            continue
        conv, padded = _conv_after(g, node)
        producer = g.producer.get(_source(g, node))
        if conv is not None and padded:
            reason = "BN before a zero-padded Conv: not exact (the padded border gets no offset)"
        elif conv is not None:
            reason = "BN before a Conv: folding it into the Conv after it is not done"
        else:
            after = "the graph's input" if producer is None else producer.op_type
            reason = f"BN after {after}, not a Conv: no Conv to fold it into"
        declined.append((node.output[0], reason))
    return declined


def _from_an_input(g: Graph, value: str) -> bool:
    """Whether `value` is a graph input, or computed from one alone by
    elementwise ops of constants (Keras' `Rescaling`)."""
    while value not in g.inputs:
        node = g.producer.get(value)
        if node is None or node.op_type == "BatchNormalization":
            return False
        if not _reads_a_constant(g, node) and node.op_type not in ("Reshape", *_VIEWS):
            return False
        value = _source(g, node)
    return True


def transposes_left(proto) -> list:
    """(output, reason) for each Transpose between two ops: neither reading
    a graph input nor making a graph output.

    Args:
        proto: the ModelProto.

    Returns:
        One entry per Transpose, naming the ops it stops at.
    """
    g = Graph(proto.graph)
    declined = []
    for node in proto.graph.node:
        if node.op_type != "Transpose" or node.output[0] in g.outputs:
            continue
        if _from_an_input(g, node.input[0]):
            continue
        readers = ", ".join(sorted({reader.op_type for reader in g.consumers[node.output[0]]}))
        reason = f"Transpose: tf2onnx's TransposeOptimizer cannot move it past {readers}"
        declined.append((node.output[0], reason))
    return declined


def run(proto, context: Context) -> PassResult:
    """Move a convolutional graph's Transposes to its edges, then fold its
    BatchNorms into its Convs.

    Args:
        proto: the ModelProto, changed in place.
        context: its `data_folder` is where the weights are. (The stage runs
            this pass only where `run_onnxslim` allows shape inference.)

    Returns:
        The Convs that took a BatchNorm in, under "Conv"; what was left and
        why; the shapes inferred again (the Transposes moved changed the
        layout of tensors that kept their names).
    """
    graph = proto.graph
    if not any(node.op_type in _CONVS for node in graph.node):
        return PassResult(proto, {"Conv": 0})
    before = sum(node.op_type == "Transpose" for node in graph.node)
    failure = _move_transposes(proto)
    folded, declined = fold_affines(proto, context.data_folder)
    remove_dead_nodes(proto)  # the affines' constants, the biases replaced
    shapes = tensor_shapes(proto)
    declined += batch_norms_left(proto, shapes) + transposes_left(proto)
    if failure is not None:
        declined.append(("", failure))
    moved = before - sum(node.op_type == "Transpose" for node in graph.node)
    return PassResult(
        proto,
        {"Conv": folded},
        tuple(declined),
        folded + max(moved, 0),
        learned={"shapes": shapes},
    )
