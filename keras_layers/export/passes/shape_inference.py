"""ONNX shape inference, once, for the fusions after it.

One inference serves every fusion that reads shapes: each rewrite keeps its
output's name and shape, so the shapes stay true for every tensor the others
read. Like onnxslim it serialises the proto, so it runs only where
`context.run_onnxslim` allows.
"""

from keras_layers.export.graph import tensor_shapes
from keras_layers.export.passes.context import Context, PassResult


def run(proto, context: Context) -> PassResult:
    """Infer every tensor's shape and element type.

    Args:
        proto: the ModelProto (not changed).
        context: not read.

    Returns:
        `graph.tensor_shapes` of the model, learned as the context's `shapes`.
    """
    del context
    return PassResult(proto, learned={"shapes": tensor_shapes(proto)})
