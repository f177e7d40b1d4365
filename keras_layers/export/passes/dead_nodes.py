"""Dead nodes and unread initializers dropped (`graph.remove_dead_nodes`)."""

from keras_layers.export.graph import remove_dead_nodes
from keras_layers.export.passes.context import Context, PassResult


def run(proto, context: Context) -> PassResult:
    """Drop the nodes whose outputs nothing reads, then unread initializers.

    Args:
        proto: the ModelProto, changed in place.
        context: not read.

    Returns:
        How many nodes were dropped.
    """
    del context
    before = len(proto.graph.node)
    remove_dead_nodes(proto)
    return PassResult(proto, changed=before - len(proto.graph.node))
