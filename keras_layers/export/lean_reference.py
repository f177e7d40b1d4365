"""Keras' outputs with each intermediate tensor freed after its last use.

A functional Keras model runs its layers in order and keeps every layer's
output in one dictionary until the whole call returns (Keras 3.15,
`Function._run_through_graph`), so an eager call holds all of its
activations at once. For a ResNet-50-sized classifier on eight 224x224 images
that is 1.27 GB more than the weights, which the validation's reference
computation then peaked at (`benchmarks/vision.py`: the export added 14.9
times the weights, the conversion and passes 1.5 times).

`intermediates_freed` runs the same layers, in the same order, on the same
arguments, and drops a tensor from that dictionary once every layer that
reads it has run: the outputs are Keras' own, bit for bit
(`tests/test_lean_reference.py`), and what stays alive is only what some
layer still needs. Nested functional models (a keras-hub task around its
backbone) are walked the same way, since each runs through the same method.
"""

from collections import Counter
from contextlib import contextmanager

from keras_layers.export.compat import patched


def _consumed(function) -> Counter:
    """How many of `function`'s nodes read each tensor, by the tensor's id."""
    return Counter(
        id(tensor)
        for nodes in function._nodes_by_depth.values()
        for node in nodes
        if node.operation and not node.is_input
        for tensor in node.input_tensors
    )


def run_through_graph(function, inputs, operation_fn=lambda op: op, call_fn=None):
    """`Function._run_through_graph`, with each computed tensor released once
    the last node that reads it has run (the graph's outputs are kept).

    Args:
        function: the functional model (a `keras.src.ops.function.Function`).
        inputs: its inputs' values, in the structure of `function.inputs`;
            tensors pair with values as Keras pairs them (`zip`, not strict).
        operation_fn: wraps each node's operation before the call
            (`Functional.call` passes `training` this way).
        call_fn: when given, calls each operation instead (symbolic runs).

    Returns:
        The outputs, in the structure of the model's outputs.

    Raises:
        ValueError: an output is not computed from these inputs (Keras' message).
    """
    from keras import tree

    values = {id(x): y for x, y in zip(function.inputs, tree.flatten(inputs), strict=False)}
    kept = {id(x) for x in function.outputs}
    readers = _consumed(function)
    operation_for = getattr(function, "_get_operation_for_node", lambda node: node.operation)
    for depth in sorted(function._nodes_by_depth, reverse=True):
        for node in function._nodes_by_depth[depth]:
            if not node.operation or node.is_input:
                continue
            if any(id(x) not in values for x in node.input_tensors):
                continue  # not computable from these inputs, as Keras skips it
            args, kwargs = node.arguments.fill_in(values)
            if call_fn is not None:
                outputs = call_fn(operation_fn(node.operation), *args, **kwargs)
            else:
                outputs = operation_fn(operation_for(node))(*args, **kwargs)
            del args, kwargs
            for x, y in zip(node.outputs, tree.flatten(outputs), strict=False):
                values[id(x)] = y
            del outputs
            for x in node.input_tensors:
                readers[id(x)] -= 1
                if readers[id(x)] == 0 and id(x) not in kept:
                    values.pop(id(x), None)
    missing = [i for i, x in enumerate(function.outputs) if id(x) not in values]
    if missing:
        path = tree.flatten_with_path(function._outputs_struct)[missing[0]][0]
        raise ValueError(
            f"Output with path `{'.'.join(str(p) for p in path)}` is not connected to `inputs`"
        )
    return tree.pack_sequence_as(
        function._outputs_struct, [values[id(x)] for x in function.outputs]
    )


@contextmanager
def intermediates_freed():
    """Run functional Keras models with `run_through_graph` in this thread.

    Example:
        >>> import keras, numpy as np
        >>> inputs = keras.Input((4,))
        >>> model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dense(3)(inputs)))
        >>> x = np.ones((1, 4), "float32")
        >>> with intermediates_freed():
        ...     freed = np.asarray(model(x))
        >>> bool((freed == np.asarray(model(x))).all())
        True
    """
    from keras.src.ops import function

    with patched(function.Function, "_run_through_graph", run_through_graph):
        yield
