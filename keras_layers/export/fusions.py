"""The fusions one at a time, called on a graph by hand (tests, benchmarks).

The slim stage runs each fusion as a pass (`passes.fusions`, in
`slimming.PASSES`); these calls take the arguments a test has at hand, build
the pass's `Context` from them, run the pass and return its count.
"""

from keras_layers.export.graph import tensor_ranks, tensor_shapes, use_contrib_domain
from keras_layers.export.passes.context import Context
from keras_layers.export.passes.fusions import (
    layer_norm,
    matmul,
    multi_head_attention,
    rms_norm,
    rotary,
)
from keras_layers.export.passes.fusions.gelu import GELU_FUSED, fuse_erfc_gelus, fuse_gelus

__all__ = [
    "GELU_FUSED",
    "fuse_attention",
    "fuse_erfc_gelus",
    "fuse_gelus",
    "fuse_layer_norms",
    "fuse_rms_norms",
    "fuse_rotary_embeddings",
    "fuse_tensordot_matmuls",
    "tensor_ranks",
    "tensor_shapes",
    "use_contrib_domain",
]


def _count(fusion, proto, declined: list | None, **fields) -> int:
    """Run the pass `fusion` with a context of `fields`; its count of the op it makes."""
    result = fusion.run(proto, Context.of(proto, **fields))
    if declined is not None:
        declined.extend(result.declined)
    return result.fused[fusion.MAKES[0]]


def fuse_layer_norms(proto, ranks: dict) -> int:
    """Replace decomposed LayerNorms by `LayerNormalization` (opset 17+).

    Args:
        proto: the ModelProto, rewritten in place.
        ranks: `tensor_ranks` of the graph.

    Returns:
        How many were replaced.
    """
    # The rule reads ranks alone: shapes that tell nothing else.
    shapes = {name: ([None] * rank, None) for name, rank in ranks.items()}
    return _count(layer_norm, proto, None, shapes=shapes)


def fuse_tensordot_matmuls(proto, shapes: dict | None = None, declined: list | None = None) -> int:
    """`Reshape(MatMul(Reshape(x, [-1, d]), W), shape(x)[:-1] + [n])` -> `MatMul(x, W)`.

    Args:
        proto: the ModelProto, rewritten in place.
        shapes: `tensor_shapes` of the graph, where the way back may be a
            constant (x's axes but the first static); None for the computed
            way back only.
        declined: when given, gets (output, reason) for each candidate left alone.

    Returns:
        How many were replaced.
    """
    return _count(matmul, proto, declined, shapes=shapes)


def fuse_attention(proto, shapes: dict, declined: list | None = None, cached: bool = False) -> int:
    """Replace the traced attention by `MultiHeadAttention` (`multi_head_attention.run`).

    Args:
        proto: the ModelProto, rewritten in place.
        shapes: `tensor_shapes` of the graph.
        declined: when given, gets (softmax output, reason) for each softmax
            left alone.
        cached: a decoder exported with its cache (left to GroupQueryAttention).

    Returns:
        How many were replaced.
    """
    return _count(multi_head_attention, proto, declined, shapes=shapes, cached_decoder=cached)


def fuse_rms_norms(proto, shapes: dict, declined: list | None = None) -> int:
    """Replace decomposed RMS norms by `SimplifiedLayerNormalization` (`rms_norm.run`).

    Args:
        proto: the ModelProto, rewritten in place.
        shapes: `tensor_shapes` of the graph.
        declined: when given, gets (mean's output, reason) for each mean left alone.

    Returns:
        How many were replaced.
    """
    return _count(rms_norm, proto, declined, shapes=shapes)


def fuse_rotary_embeddings(proto, shapes: dict, positive=frozenset(), declined=None) -> int:
    """Replace rotate-half rotary embeddings by `RotaryEmbedding` (`rotary.run`).

    Args:
        proto: the ModelProto, rewritten in place; its dynamic axes named.
        shapes: `tensor_shapes` of the graph.
        positive: the input axis names that are at least 1.
        declined: when given, gets (candidate's output, reason) for each
            candidate left alone.

    Returns:
        How many rotations were fused.
    """
    return _count(rotary, proto, declined, shapes=shapes, positive=frozenset(positive))
