"""Dynamic axes named: graph inputs and outputs get the axis names of their
Keras tensors (`batch`, `sequence`) instead of tf2onnx's `unk__N`.

The input axes' names say which axes are one size (the validation grid
feeds them so), and the symbolic dims the later passes prove read them.
"""

from keras_layers.export.passes.context import Context, PassResult


def name_dynamic_axes(proto, axis_names) -> int:
    """Give graph inputs and outputs the axis names of their Keras tensors.

    Args:
        proto: the ModelProto, changed in place.
        axis_names: {graph input or output: its axes' names, a str for each
            dynamic axis (anything else leaves that axis as it is)}.

    Returns:
        How many axes were named.
    """
    named = 0
    for value in [*proto.graph.input, *proto.graph.output]:
        names = axis_names.get(value.name)
        if names is None:
            continue
        dims = value.type.tensor_type.shape.dim
        for dim, axis_name in zip(dims, names, strict=False):
            if isinstance(axis_name, str):
                dim.ClearField("dim_value")
                dim.dim_param = axis_name
                named += 1
    return named


def run(proto, context: Context) -> PassResult:
    """`name_dynamic_axes` with the context's `axis_names`.

    Args:
        proto: the ModelProto, changed in place.
        context: its `axis_names`.

    Returns:
        How many axes were named.
    """
    return PassResult(proto, changed=name_dynamic_axes(proto, context.axis_names))
