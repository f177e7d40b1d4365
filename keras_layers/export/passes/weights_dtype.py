"""Weights stored in half precision, computed in float32.

With `--weights-dtype float16` (or `keep` for a model whose variables are
bfloat16 or float16), each float32 weight that only matrix products, lookups
and transposes read is stored in that dtype, and one `Cast` to float32 sits
between it and its readers: ONNX Runtime's CPU kernels for those ops (and the
fused ops after them) take float32. The file holds half the bytes. ONNX
Runtime folds each `Cast` of a weight when the session starts, so a session's
memory is that of the float32 file (measured in docs/performance.md); what
halves is the file, its download and its load from disk.

Biases, norm scales and other small or element-wise weights stay float32:
they are a small share of the bytes, and the ops that read them want float32.
The values go to the data file one weight at a time (`graph.weights`).
"""

import numpy as np
from onnx import TensorProto, helper

from keras_layers.export.graph import weights
from keras_layers.export.passes.context import Context, PassResult

# The ONNX types of the `--weights-dtype` choices that store in half precision.
HALF_TYPES = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
# Readers of a weight stored in half precision, and the input it must be.
_READERS = {"MatMul": 1, "Gemm": 1, "Gather": 0, "Transpose": 0}


def stored_dtype(choice: str, source_policies: list) -> str:
    """The dtype the weights are stored in for `--weights-dtype CHOICE`.

    Args:
        choice: `"float32"`, `"float16"` or `"keep"`.
        source_policies: the half-precision dtype policies the model was built
            in (`loading.LoadedModel.source_policies`): a `"bfloat16"` or
            `"float16"` policy keeps its variables in that dtype, a mixed one
            in float32.

    Returns:
        `"float32"`, `"float16"` or `"bfloat16"`.
    """
    if choice != "keep":
        return choice
    return next((dtype for dtype in HALF_TYPES if dtype in source_policies), "float32")


def rounds(choice: str, source_policies: list) -> bool:
    """Whether `choice` stores weights in a dtype that rounds the model's
    values (float16 from float32 or bfloat16 variables): its checks then
    allow for that rounding.

    Args:
        choice: `"float32"`, `"float16"` or `"keep"`.
        source_policies: the model's half-precision dtype policies.

    Returns:
        True where the stored weights differ from Keras' values.
    """
    stored = stored_dtype(choice, source_policies)
    return stored != "float32" and stored not in source_policies


def _readers(graph) -> dict:
    """{initializer name: [(node, input position)]}, main graph only."""
    initializers = {init.name for init in graph.initializer}
    found: dict[str, list] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name in initializers:
                found.setdefault(name, []).append((node, position))
    return found


def _stored_in_half(tensor, readers: list) -> bool:
    """A float32 weight of at least `EXTERNAL_MIN_BYTES` that only the ops of
    `_READERS` read, each at its weight input."""
    if tensor.data_type != TensorProto.FLOAT or not readers:
        return False
    if weights.byte_count(tensor) < weights.EXTERNAL_MIN_BYTES:
        return False
    return all(_READERS.get(node.op_type) == position for node, position in readers)


def store_in_half(proto, dtype: str, folder=None) -> int:
    """Store the matrix weights of `proto` in `dtype`, each behind a `Cast`
    to float32.

    Args:
        proto: the ModelProto, changed in place.
        dtype: `"float16"` or `"bfloat16"`.
        folder: the folder of its data files, if any.

    Returns:
        How many weights were stored in `dtype`.
    """
    graph = proto.graph
    half = helper.tensor_dtype_to_np_dtype(HALF_TYPES[dtype])
    readers = _readers(graph)
    casts = []
    for tensor in graph.initializer:
        found = readers.get(tensor.name, [])
        if not _stored_in_half(tensor, found):
            continue
        weights.replace(tensor, np.asarray(weights.values(tensor, folder)).astype(half), folder)
        cast = f"{tensor.name}/float32"
        casts.append(helper.make_node("Cast", [tensor.name], [cast], to=TensorProto.FLOAT))
        for node, position in found:
            node.input[position] = cast
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(casts + nodes)
    return len(casts)


def run(proto, context: Context) -> PassResult:
    """`store_in_half` as a pass, for `context.weights_dtype`.

    Args:
        proto: the ModelProto, changed in place.
        context: its `weights_dtype` and `data_folder`.

    Returns:
        How many weights were stored in half precision.
    """
    count = store_in_half(proto, context.weights_dtype, context.data_folder)
    return PassResult(proto, changed=count, report={"half_weights": count})
