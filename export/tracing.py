"""Stage 2, trace: wrap the Keras model in a `tf.function` with an explicit signature.

`tf2onnx.convert.from_keras` is broken on Keras 3 (tensorflow-onnx#2329, #2348,
#2448), so the pipeline converts a `tf.function` instead. Its input signature is
derived from the model: input names are the Keras input names (or dict keys),
dtypes are kept, and outputs come back as a dict keyed by the output names, which
tf2onnx turns into the ONNX output names.
"""

from dataclasses import dataclass

from export.loading import LoadedModel, flatten


@dataclass
class TracedModel:
    """The output of `trace`: a `tf.function` and its input signature."""

    function: object
    signature: list
    input_names: list
    output_names: list


def trace(loaded: LoadedModel) -> TracedModel:
    import tensorflow as tf

    model = loaded.model
    signature = [
        tf.TensorSpec(shape=info.shape, dtype=info.dtype, name=info.name) for info in loaded.inputs
    ]
    input_names = [info.name for info in loaded.inputs]
    output_names = [info.name for info in loaded.outputs]

    def pack(tensors):
        if loaded.input_structure == "dict":
            return dict(zip(input_names, tensors, strict=True))
        if loaded.input_structure == "list":
            return list(tensors)
        return tensors[0]

    def serve(*tensors):
        outputs = flatten(model(pack(tensors), training=False), output_names)
        return dict(zip(output_names, outputs, strict=True))

    function = tf.function(serve, input_signature=signature, autograph=False)
    return TracedModel(function, signature, input_names, output_names)
