"""ONNX shape inference's shapes and element types, as the fusions read them."""

from onnx import shape_inference


def tensor_shapes(proto) -> dict:
    """Shape and element type of every tensor that ONNX shape inference can tell.

    {name: (dims, elem_type)}, each dim an int, a symbolic name, or None.
    """
    inferred = shape_inference.infer_shapes(proto, data_prop=True)
    shapes = {}
    for value in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            dims = [
                d.dim_value if d.HasField("dim_value") else d.dim_param or None
                for d in tensor.shape.dim
            ]
            shapes[value.name] = (dims, tensor.elem_type)
    return shapes


def tensor_ranks(shapes: dict) -> dict:
    """Rank of every tensor in `tensor_shapes`' answer."""
    return {name: len(dims) for name, (dims, _) in shapes.items()}
