"""Stage 3, convert: TensorFlow graph to ONNX with tf2onnx's building blocks.

`tf2onnx.convert.from_function` runs tf2onnx's twelve ONNX optimizers in a loop
until nothing changes, deep-copying the whole graph before each one (to roll back
a failing optimizer) and re-serialising every node after it: most of an
export's time and memory (`benchmarks/export_bench.py` measures it). This stage runs
the same steps as `from_function` (freeze, convert with `process_tf_graph`,
optimize, `make_model`) but runs each optimizer once.
The weights are inputs of the traced function (`keras_layers/export/tracing.py`), so the
frozen graph holds no weight constants; they become initializers at the end
(`_weights_to_initializers`). The few large constants the graph still has stay
out of the node protos (tf2onnx's `large_model` storage) until `make_model`.
onnxslim, in the next stage, does the folding and dead-code removal that the
later sweeps would have done. It relies on tf2onnx functions that are public in
the package but not documented as API; `tests/test_converting.py` pins that.

Default opset 18: the newest tf2onnx 1.16-1.17 emits, run by every
onnxruntime since 1.14.
"""

import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from keras_layers.export import compat
from keras_layers.export.compat import patched
from keras_layers.export.errors import ConversionError, OutputError, UsageError, argument
from keras_layers.export.graph import free_names, rename_reads, subgraphs, weights
from keras_layers.export.op_handlers import HANDLERS
from keras_layers.export.tracing import TracedModel

DEFAULT_OPSET = 18
MIN_OPSET = 13
# Above this many parameter bytes the proto would pass protobuf's 2 GiB limit,
# so the file is saved with external data.
LARGE_MODEL_BYTES = 1_800_000_000


@dataclass
class ConvertedModel:
    """The output of `convert`: an ONNX ModelProto with its tensors inline, or
    its weights in the data file `convert` was given."""

    proto: object
    opset: int
    seconds: float
    # Keras paths of the weights the outputs depend on (`read_weights`).
    weights_read: set = field(default_factory=set)


def read_weights(proto) -> set[str]:
    """Initializers the graph outputs depend on, walking back from the
    outputs (into Loop/If/Scan bodies too). Right after conversion they still
    carry the Keras paths of the weights, before any pass merges, reshapes or
    renames them: a weight missing here is one the exported outputs never read."""
    graph = proto.graph
    producer = {name: node for node in graph.node for name in node.output}
    initializers = {init.name for init in graph.initializer}
    pending = [value.name for value in graph.output]
    seen, read = set(), set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in initializers:
            read.add(name)
        node = producer.get(name)
        if node is not None:
            pending.extend(node.input)
            for body in subgraphs(node):
                pending.extend(free_names(body))
    return read


def supported_opsets() -> range:
    """The opsets tf2onnx converts to, read from its `constants` module alone:
    importing the `tf2onnx` package imports TensorFlow (10 s), and a bad flag
    is refused before that."""
    constants = sys.modules.get("tf2onnx.constants") or _tf2onnx_constants()
    return range(MIN_OPSET, max(constants.OPSET_TO_IR_VERSION) + 1)


def _tf2onnx_constants():
    """tf2onnx's `constants.py` (it imports onnx only), loaded on its own."""
    import importlib.util

    package = importlib.util.find_spec("tf2onnx")
    location = Path(package.submodule_search_locations[0]) / "constants.py"
    spec = importlib.util.spec_from_file_location("_keras_layers_tf2onnx_constants", location)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_opset(opset: int) -> int:
    opsets = supported_opsets()
    if opset not in opsets:
        raise UsageError(
            f"{argument('opset', opset)}: unsupported; choose {opsets.start}-{opsets.stop - 1} "
            f"(default {DEFAULT_OPSET})"
        )
    return opset


def _unconverted(graph) -> list[tuple[str, str]]:
    """(TF node, op) pairs tf2onnx left as TensorFlow ops: nodes of the ONNX
    domain whose type is no ONNX operator (`onnx.defs.has`), in `graph` (a
    GraphProto) and in the bodies of its Loop, If and Scan nodes."""
    from onnx import AttributeProto, defs

    found = []
    for node in graph.node:
        if node.domain in ("", "ai.onnx") and not defs.has(node.op_type):
            found.append((node.name, node.op_type))
        for attribute in node.attribute:
            if attribute.type == AttributeProto.GRAPH:
                found.extend(_unconverted(attribute.g))
            elif attribute.type == AttributeProto.GRAPHS:
                for body in attribute.graphs:
                    found.extend(_unconverted(body))
    return found


def _layer_of(node_name: str) -> str:
    """Keras layer name from a TF node path such as `model_1/mix_1/Gelu/Erfc`."""
    parts = node_name.split("/")
    return re.sub(r"_\d+$", "", parts[1]) if len(parts) > 2 else node_name


def _unsupported_message(found) -> str:
    described = sorted(
        {f"op {op} in layer {_layer_of(node)!r} (TF node {node})" for node, op in found}
    )
    return (
        "tf2onnx cannot convert " + "; ".join(described) + ". Replace that layer, "
        "or write the computation with ops ONNX supports."
    )


def _inline_external_tensors(proto, storage) -> None:
    """Put the tensors tf2onnx kept aside back into the proto as raw data."""
    from onnx import TensorProto

    tensors = storage.name_to_tensor_data
    for init in proto.graph.initializer:
        if init.data_location != TensorProto.EXTERNAL:
            continue
        location = {entry.key: entry.value for entry in init.external_data}["location"]
        init.raw_data = tensors[location]
        del init.external_data[:]
        init.data_location = TensorProto.DEFAULT


def _values(variable) -> np.ndarray:
    """A variable's values as a NumPy array, without a copy where TensorFlow
    allows one (a read of the variable shares its buffer; `.numpy()` copies)."""
    import keras

    value = variable.value
    read = getattr(value, "read_value", None)
    return np.asarray(read()) if read is not None else keras.ops.convert_to_numpy(value)


@contextmanager
def _data_file(path: Path | None) -> Iterator:
    """The data file open for writing (None without a path); an error writing
    it is the disk's, said as such."""
    if path is None:
        yield None
        return
    try:
        with open(path, "wb") as data:
            yield data
    except OSError as error:
        raise OutputError(
            f"cannot write the weights to {path} ({error.strerror or error}); "
            "nothing at the output paths was changed"
        ) from error


def _weights_to_initializers(proto, traced: TracedModel, data_path: Path | None = None) -> None:
    """Replace the weight inputs of the graph by initializers holding their values.

    Each variable is read into NumPy on its own and its bytes are set on a new
    initializer in place (`RepeatedField.append` and `numpy_helper.from_array` +
    `CopyFrom` copy by serialising, which fails for a tensor over 2 GiB), or,
    with `data_path` and a matrix (`weights.stage`), written to that file, which
    the initializer then points at: the graph never holds those weights, and
    memory holds one variable's copy at a time. Names are the variables' Keras
    paths (`token_embedding/embeddings`).
    """
    from onnx import helper

    graph = proto.graph
    specs = dict(zip(traced.weight_input_names(), traced.weights, strict=True))
    kept = [value for value in graph.input if value.name not in specs]
    names = {}
    with _data_file(data_path) as data:
        for value in graph.input:
            variable = specs.get(value.name)
            if variable is None:
                continue
            name = variable.path if variable.path not in names.values() else value.name
            names[value.name] = name
            array = _values(variable)
            tensor = graph.initializer.add()
            tensor.name = name
            tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
            tensor.dims.extend(array.shape)
            weights.stage(tensor, array, data)
            del array
    del graph.input[:]
    graph.input.extend(kept)
    # Reads inside If and Loop bodies too: a branch that alone uses a weight
    # (SAM's mask embedding, SAM3's box encoder) reads it from the main graph.
    rename_reads(graph, names)


@contextmanager
def _numpy_product_alias() -> Iterator[None]:
    """`np.product` for the duration of one conversion.

    tf2onnx 1.17's external tensor storage still calls `np.product`, which
    NumPy 2 removed; it is `np.prod` under its old name. The alias is taken
    away again, so it never outlives the export call.
    """
    if compat.original(np, "product", None) is not None:
        yield
        return
    with patched(np, "product", np.prod):
        yield


@contextmanager
def _grappler_without_placeholder_shapes() -> Iterator[None]:
    """Hide the static shapes of the graph's placeholders from Grappler.

    Freezing runs Grappler's function inlining, which builds a zero-filled
    tensor for every placeholder of static shape; the weights are
    placeholders here, and TensorFlow keeps that memory until the process
    ends (as much again as the weights: `benchmarks/big_model.py`). Grappler
    gets the placeholders without shapes and the result gets them back.
    """
    from tensorflow.python.grappler import tf_optimizer

    original = compat.original(tf_optimizer, "OptimizeGraph")

    def optimize(config_proto, metagraph, *args, **kwargs):
        shapes = {}
        for node in metagraph.graph_def.node:
            if node.op == "Placeholder" and "shape" in node.attr:
                shapes[node.name] = type(node.attr["shape"])()
                shapes[node.name].CopyFrom(node.attr["shape"])
                node.attr["shape"].shape.unknown_rank = True
                del node.attr["shape"].shape.dim[:]
        graph_def = original(config_proto, metagraph, *args, **kwargs)
        for node in graph_def.node:
            if node.name in shapes:
                node.attr["shape"].CopyFrom(shapes[node.name])
        return graph_def

    with patched(tf_optimizer, "OptimizeGraph", optimize):
        yield


@contextmanager
def _branch_input_shapes() -> Iterator[None]:
    """Give the bodies of `tf.cond` the shapes of what they are called with.

    tf2onnx converts each function of the graph (a `tf.cond`'s two branches,
    a loop's body) on its own, its inputs shaped as the caller's inputs. Two
    slips leave an `If`'s branches with no shapes at all, and then tf2onnx's
    Conv handler finds no kernel shape and its Unpack no rank (keras-hub's
    SAM mask embedding, SAM3's box encoder, each under a `cond` on whether
    a prompt is empty):

    - an `If` node's first input is its condition, not a branch argument,
      yet tf2onnx hands the branches all of the node's input shapes and then
      drops the last: every argument gets its neighbour's shape. Here the
      branches get the shapes of the inputs after the condition.
    - Grappler's specialised functions mark each argument's shape unknown
      (`_output_shapes`), and `function_def_to_graph` lets that mark win over
      the shapes it is given. Where a shape is given, the mark is dropped.
    """
    from tensorflow.core.framework import function_pb2
    from tf2onnx import tf_loader

    list_to_onnx = compat.original(tf_loader, "tflist_to_onnx")
    to_graph = compat.original(tf_loader, "function_def_to_graph")

    def tflist_to_onnx(graph, *args, **kwargs):
        converted = list_to_onnx(graph, *args, **kwargs)
        functions = converted[5]
        for operation in graph.get_operations():
            if operation.type in ("If", "StatelessIf"):
                shapes = [tensor.get_shape() for tensor in operation.inputs[1:]]
                for branch in ("then_branch", "else_branch"):
                    functions[operation.get_attr(branch).name] = shapes
        return converted

    def function_def_to_graph(fdef, input_shapes=None, **kwargs):
        if input_shapes:
            fdef, given = function_pb2.FunctionDef.FromString(fdef.SerializeToString()), fdef
            for position, shape in enumerate(input_shapes):
                marks = fdef.arg_attr[position].attr if position in given.arg_attr else {}
                if shape is not None and "_output_shapes" in marks:
                    del marks["_output_shapes"]
        return to_graph(fdef, input_shapes=input_shapes, **kwargs)

    with (
        patched(tf_loader, "tflist_to_onnx", tflist_to_onnx),
        patched(tf_loader, "function_def_to_graph", function_def_to_graph),
    ):
        yield


def _captured_constants(concrete, explicit: int) -> dict:
    """Tensors the traced function captured from outside, by placeholder name.

    A model may hold a tensor made eagerly (Gemma's `sqrt(hidden_dim)`): the
    trace captures it as an extra placeholder after the signature's inputs,
    and tf2onnx would make it a graph input that no caller can feed. Its value
    is known; `_captures_to_initializers` stores it as a constant.
    """
    import tensorflow as tf

    placeholders = concrete.inputs[explicit:]
    return {
        placeholder.name: value.numpy()
        for placeholder, value in zip(placeholders, concrete.captured_inputs, strict=False)
        if placeholder.dtype != tf.dtypes.resource and hasattr(value, "numpy")
    }


def _captures_to_initializers(proto, captured: dict) -> None:
    """Replace graph inputs fed by captured constants with initializers."""
    from onnx import numpy_helper

    graph = proto.graph
    names = {value.name for value in graph.input} & set(captured)
    for position in reversed(range(len(graph.input))):
        if graph.input[position].name in names:
            del graph.input[position]
    for name in sorted(names):
        graph.initializer.append(numpy_helper.from_array(captured[name], name))


def _optimizers(optimizer) -> dict:
    """tf2onnx's optimizers, in its order, with its TransposeOptimizer's last
    step left out.

    That step turns each Transpose that moves only axes of size 1 into a
    Reshape, by the shapes recorded on the graph; after it has moved a
    Transpose, the recorded shape of the Transpose's input can still be the
    old layout's, and the Reshape is then wrong for every input: keras-hub's
    MobileNetV5 head turned (N, 32, 1, 1) into (N, 1, 32, 1) instead of
    (N, 1, 1, 32), its RMS norm averaged one value, and the logits came out
    with 32 rows per image. The Transpose is kept here; passes/conv_layout.py
    reruns the optimizer, step included, on a graph whose shapes ONNX's own
    inference has just given.
    """
    from tf2onnx.optimizer.transpose_optimizer import TransposeOptimizer

    class WithoutReshapes(TransposeOptimizer):
        def post_optimize_action(self):
            return

    return {
        name: WithoutReshapes if factory is TransposeOptimizer else factory
        for name, factory in optimizer._get_optimizers().items()
    }


def _tf2onnx(traced: TracedModel, opset: int, data_path: Path | None):
    import tensorflow as tf
    from tf2onnx import convert, optimizer, tf_loader, tf_utils, tfonnx
    from tf2onnx.graph import ExternalTensorStorage

    concrete = traced.function.get_concrete_function(*traced.signature)
    inputs = [t.name for t in concrete.inputs if t.dtype != tf.dtypes.resource]
    captured = _captured_constants(concrete, len(traced.signature))
    outputs = [t.name for t in concrete.outputs if t.dtype != tf.dtypes.resource]
    renames = convert.tensor_names_from_structed(concrete, inputs, outputs)
    with tf.device("/cpu:0"), _grappler_without_placeholder_shapes():
        frozen = tf_loader.from_function(concrete, inputs, outputs, large_model=True)
    with tf.Graph().as_default() as tf_graph, _branch_input_shapes():
        constants = tf_utils.compress_graph_def(frozen)
        storage = ExternalTensorStorage()
        tf.import_graph_def(frozen, name="")
        graph = tfonnx.process_tf_graph(
            tf_graph,
            continue_on_error=True,
            opset=opset,
            input_names=inputs,
            output_names=outputs,
            const_node_values=constants,
            tensors_to_rename=renames,
            custom_op_handlers=HANDLERS,
        )
        for iteration, factory in enumerate(_optimizers(optimizer).values()):
            graph = factory().optimize(graph, iteration) or graph
        graph.topological_sort(graph.get_nodes())
        with _numpy_product_alias():
            proto = graph.make_model(concrete.name, external_tensor_storage=storage)
    unconverted = _unconverted(proto.graph)
    if unconverted:
        raise ConversionError(_unsupported_message(unconverted))
    _inline_external_tensors(proto, storage)
    _weights_to_initializers(proto, traced, data_path)
    _captures_to_initializers(proto, captured)
    return proto


def convert(
    traced: TracedModel, opset: int = DEFAULT_OPSET, data_path: Path | None = None
) -> ConvertedModel:
    """Convert the traced function to an ONNX proto with its weights as initializers.

    Args:
        traced: the output of `tracing.trace`.
        opset: the ONNX opset.
        data_path: if given, the matrix weights of at least
            `weights.EXTERNAL_MIN_BYTES` are written to this file
            (`weights.stage`) and the initializers point at it (by its
            name, so the graph must be saved beside it); otherwise they are
            held in the proto.

    Returns:
        The `ConvertedModel`.

    Raises:
        ConversionError: tf2onnx left an op unconverted (the message names the
            op and the Keras layer it came from), or failed.
        OutputError: the data file cannot be written (a full disk).
    """
    check_opset(opset)
    start = time.perf_counter()
    try:
        proto = _tf2onnx(traced, opset, data_path)
    except (ConversionError, OutputError):
        raise
    except Exception as error:  # noqa: BLE001 - translated below
        raise ConversionError(f"tf2onnx failed: {type(error).__name__}: {error}") from error
    return ConvertedModel(proto, opset, time.perf_counter() - start, read_weights(proto))
