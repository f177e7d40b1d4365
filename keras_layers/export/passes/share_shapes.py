"""One `Shape` for every set of tensors proven to share their dims.

keras-hub's decoder layers each build their attention mask and rotary tables
from `ops.shape` of their own input, so a 4-layer Llama traces four copies of
the same (batch, sequence, sequence) mask computation, each reading `Shape` of
a different hidden state. The copies compute the same values, but no pass can
merge them while they read different tensors: ONNX shape inference gives each
layer's hidden state fresh symbolic dims (it loses them at the Tensordot
reshapes), and ONNX Runtime's symbolic inference stops at keras-hub's
`min(1e9, sequence)` unless told to merge dims it cannot prove equal.

`share_equal_shapes` proves it instead, with the graph's symbolic dims
(`graph.symbolic_dims`, from the input axes' names: the `axis_names` pass
gives them first). Given a run that does not fail, two tensors given the same
fully known dims have the same shape at run time, so their `Shape` nodes are
one value: each later one is replaced by the first, and the copies
downstream become identical, for `common_subexpressions` to merge.
"""

from keras_layers.export.graph import Evaluation
from keras_layers.export.passes.context import Context, PassResult


def share_equal_shapes(proto, positive=frozenset()) -> int:
    """Read one `Shape` for every set of tensors proven to share their dims.

    Subgraphs are left alone.

    Args:
        proto: the ModelProto, changed in place.
        positive: as for `graph.symbolic_dims`: the input axis names that are
            at least 1 in every run.

    Returns:
        How many `Shape` nodes now read another's output instead (they are
        left unread, for dead-node removal).
    """
    evaluation = Evaluation(proto.graph, positive)
    first, replaced = {}, {}
    for node in proto.graph.node:
        if node.op_type != "Shape":
            continue
        dims = evaluation.shape.get(node.input[0])
        if dims is None or None in dims:
            continue
        key = (dims, tuple(sorted((a.name, a.i) for a in node.attribute)))
        if key in first:
            replaced[node.output[0]] = first[key]
        else:
            first[key] = node.output[0]
    outputs = {value.name for value in proto.graph.output}
    replaced = {old: new for old, new in replaced.items() if old not in outputs}
    for node in proto.graph.node:
        for position, name in enumerate(node.input):
            if name in replaced:
                node.input[position] = replaced[name]
    return len(replaced)


def run(proto, context: Context) -> PassResult:
    """Share the `Shape`s of tensors proven to share their dims.

    Last of the rewrites, as the fusions match `Shape`s of the very tensors
    they reshape: the per-layer copies of the masks and rotary tables that
    keras-hub's decoders build from `Shape` of each hidden state become one
    copy once those `Shape`s are one.

    Args:
        proto: the ModelProto, changed in place.
        context: its `positive` axes.

    Returns:
        The `Shape`s shared (the report's `shapes_shared`); where there are
        any, the copies they made identical are learned as `copies_to_merge`.
    """
    shared = share_equal_shapes(proto, context.positive)
    learned = {"copies_to_merge": True} if shared else {}
    return PassResult(proto, changed=shared, report={"shapes_shared": shared}, learned=learned)
