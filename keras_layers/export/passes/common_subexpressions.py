"""Common subexpressions merged: a node that computes what an earlier node
computes reads that node's outputs instead.

onnxslim does this too, but only in its own pass; this one runs after the
fusions, which `share_shapes` must follow, where it made copies to merge.
"""

from keras_layers.export.graph import rename_reads, subgraphs
from keras_layers.export.passes.context import Context, PassResult

# Ops whose outputs differ from call to call on the same inputs: never merged.
_RANDOM_OPS = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
               "Multinomial", "Bernoulli", "Dropout"}  # fmt: skip
# ONNX Runtime's ops that compute a function of their inputs (others outside the
# ONNX domain, custom ones included, may draw at random or keep state).
_PURE_CONTRIB = {"BiasGelu", "FastGelu", "Gelu", "QuickGelu", "MultiHeadAttention",
                 "FusedMatMul", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
                 "MatMulIntegerToFloat", "DynamicQuantizeMatMul"}  # fmt: skip


def merge_common_subexpressions(proto) -> int:
    """Merge every node that computes what an earlier node computes: the same
    op, attributes and inputs (after earlier merges). Nodes with subgraphs,
    random ops and nodes making a graph output are kept as they are. Returns
    how many nodes now read another's outputs instead (left for dead-node
    removal)."""
    graph = proto.graph
    outputs = {value.name for value in graph.output}
    seen, renames, merged = {}, {}, 0
    for node in graph.node:  # in topological order, as ONNX requires
        for index, name in enumerate(node.input):
            if name in renames:
                node.input[index] = renames[name]
        pure = node.domain in ("", "ai.onnx") or (
            node.domain == "com.microsoft" and node.op_type in _PURE_CONTRIB
        )
        if not pure or node.op_type in _RANDOM_OPS or subgraphs(node):
            continue
        if outputs.intersection(node.output):
            continue
        attributes = sorted(a.SerializeToString(deterministic=True) for a in node.attribute)
        # Which optional outputs are made is part of the key: an omitted one
        # ("") must never be renamed to, or from, a real one.
        made = tuple(bool(name) for name in node.output)
        key = (node.domain, node.op_type, tuple(node.input), tuple(attributes), made)
        earlier = seen.setdefault(key, node)
        if earlier is not node:
            renames.update(
                (old, new) for old, new in zip(node.output, earlier.output, strict=True) if old
            )
            merged += 1
    if renames:
        rename_reads(graph, renames)  # subgraphs read outer values too
    return merged


def run(proto, context: Context) -> PassResult:
    """`merge_common_subexpressions` as a pass.

    Args:
        proto: the ModelProto, changed in place.
        context: not read.

    Returns:
        How many nodes now read another's outputs.
    """
    del context
    return PassResult(proto, changed=merge_common_subexpressions(proto))
