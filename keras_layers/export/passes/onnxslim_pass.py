"""onnxslim: constant folding, dead nodes and initializers (tf2onnx keeps
copies of weights that only feed `Shape`).

onnxslim serialises the proto, and folds what it can read. The weights in a
data file are shown to it as graph inputs of their type and shape for the
time it runs, so that it neither copies them nor tries to read a file it
cannot find: it folds the graph around them, and `weight_views` folds the
views of a weight onnxslim would have folded. The weights it left unread are
initializers again after it.
"""

from onnx import helper

from keras_layers.export import compat
from keras_layers.export.graph import body_reads, weights
from keras_layers.export.passes.context import Context, PassResult


def _hide_external(graph) -> dict:
    """Move the initializers in a data file to graph inputs; returns them by name."""
    hidden = {tensor.name: tensor for tensor in graph.initializer if weights.is_external(tensor)}
    kept = [tensor for tensor in graph.initializer if tensor.name not in hidden]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    graph.input.extend(
        helper.make_tensor_value_info(name, tensor.data_type, list(tensor.dims))
        for name, tensor in hidden.items()
    )
    return hidden


def _restore(graph, hidden: dict) -> None:
    """Make the hidden weights initializers again, those still read."""
    inputs = [value for value in graph.input if value.name not in hidden]
    del graph.input[:]
    graph.input.extend(inputs)
    read = {name for node in graph.node for name in (*node.input, *body_reads(node))}
    read |= {value.name for value in graph.output}
    graph.initializer.extend(tensor for name, tensor in hidden.items() if name in read)


class _UsedTensors(list):
    """onnx-graphsurgeon's used tensors, asked `tensor in used` by name (a
    graph's tensor names are unique). Its `cleanup` asks that of every graph
    input, and the hidden weights are graph inputs: a list scanned with
    `Variable.__eq__` (which compares the tensors' producers and consumers
    too) made each cleanup inputs x tensors comparisons, 5.3 million in one
    export of a 22-layer Llama, the most of onnxslim's time."""

    def __init__(self, tensors):
        super().__init__(tensors)
        self.names = {tensor.name for tensor in tensors}

    def __contains__(self, tensor) -> bool:
        return getattr(tensor, "name", None) in self.names


def _slim(onnxslim, proto):
    """`onnxslim.slim(proto)`, its cleanups asking for used tensors by name
    (`_UsedTensors`)."""
    from onnxslim.third_party.onnx_graphsurgeon.ir.graph import Graph

    used = compat.original(Graph, "_get_used_node_ids", None)
    if used is None:  # another onnxslim layout: slower, the same result
        return onnxslim.slim(proto)

    def by_name(graph):
        node_ids, tensors = used(graph)
        return node_ids, _UsedTensors(tensors)

    with compat.patched(Graph, "_get_used_node_ids", by_name):
        return onnxslim.slim(proto)


def run(proto, context: Context) -> PassResult:
    """Run onnxslim over the model.

    Args:
        proto: the ModelProto (onnxslim returns a new one).
        context: not read (the stage runs this pass only where
            `run_onnxslim` allows).

    Returns:
        The slimmed proto, and how many nodes fewer it has.
    """
    import onnxslim  # (imported here: the heaviest pass)

    del context
    before = len(proto.graph.node)
    hidden = _hide_external(proto.graph)
    try:
        slimmed = _slim(onnxslim, proto)
    finally:
        _restore(proto.graph, hidden)
    if slimmed is not proto:
        _restore(slimmed.graph, hidden)
    return PassResult(slimmed, changed=before - len(slimmed.graph.node))
