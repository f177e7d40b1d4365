"""Weight-only quantization one weight at a time, for decoders larger than memory.

`quantizing.quantize_weights` hands the whole decoder to ONNX Runtime's
`MatMulNBitsQuantizer`, which holds every weight in memory in float32. Here the
graph comes without its weights (they are in data files, `graph.weights`),
and each matrix product's weight is read on its own (a half-precision weight
behind its `Cast` widened to float32, a `Gemm`'s transposed), handed to the
same ONNX Runtime quantizer (`DefaultWeightOnlyQuantizer`, with the settings
of `quantizing.quantize_weights`) as a one-weight graph, and its `MatMulNBits`
blocks appended to a data file: memory holds one weight in float32 and its
quantized copy at a time. The file written is the layout onnxruntime-genai's
model builder writes; `tests/test_streamed_quantizing.py` checks that each
quantized weight is byte for byte what `quantize_weights` makes of it.
"""

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from keras_layers.export.graph import attribute, body_reads, weights
from keras_layers.export.quantizing import ACCURACY_LEVEL, BLOCK_SIZE, WEIGHT_BITS

_HALF = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


def _weight(node, initializers: dict, producers: dict):
    """The initializer a MatMul or plain Gemm multiplies by (directly, or
    through a `Cast` of a half-precision one to float32), or None."""
    if node.op_type == "Gemm":
        bias = len(node.input) == 3 and node.input[2]
        plain = attribute(node, "alpha", 1.0) == 1.0 and (
            not bias or attribute(node, "beta", 1.0) == 1.0
        )
        if not plain or attribute(node, "transA", 0):
            return None
    elif node.op_type != "MatMul":
        return None
    name = node.input[1]
    cast = producers.get(name)
    if cast is not None and cast.op_type == "Cast" and cast.input[0] in initializers:
        if attribute(cast, "to", 0) == TensorProto.FLOAT:
            name = cast.input[0]
    tensor = initializers.get(name)
    if tensor is None or len(tensor.dims) != 2:
        return None
    if tensor.data_type != TensorProto.FLOAT and tensor.data_type not in _HALF:
        return None
    return tensor


def _quantizer(kind: str):
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        DefaultWeightOnlyQuantizer,
    )

    config = DefaultWeightOnlyQuantConfig(
        block_size=BLOCK_SIZE,
        is_symmetric=True,
        accuracy_level=ACCURACY_LEVEL,
        bits=WEIGHT_BITS[kind],
    )
    return DefaultWeightOnlyQuantizer(config)


def _quantized(quantizer, node, tensor, folder: Path, data) -> tuple[list, list]:
    """The nodes replacing `node` and their new initializers (appended to
    `data`): ONNX Runtime's quantizer run on a graph of this one weight."""
    matrix = np.asarray(weights.values(tensor, folder), dtype=np.float32)
    name = tensor.name
    if node.op_type == "Gemm" and attribute(node, "transB", 0):
        matrix, name = np.ascontiguousarray(matrix.T), f"{name}_kn"
    alone = helper.make_graph([], "weight", [], [], [numpy_helper.from_array(matrix, name)])
    del matrix
    bias = node.op_type == "Gemm" and len(node.input) == 3 and node.input[2]
    product = f"{node.output[0]}_mm" if bias else node.output[0]
    matmul = helper.make_node("MatMul", [node.input[0], name], [product], name=node.name)
    made = list(_quantizer_call(quantizer, matmul, alone))
    if bias:
        made.append(helper.make_node("Add", [product, node.input[2]], list(node.output)))
    new = [init for init in alone.initializer if init.name != name]
    for init in new:
        array = numpy_helper.to_array(init)
        init.ClearField("raw_data")
        weights.store(init, array, data)
    return made, new


def _quantizer_call(quantizer, matmul, graph) -> list:
    import logging

    log = logging.getLogger(type(quantizer).__module__)
    level = log.level
    log.setLevel(logging.WARNING)  # not a line per MatMul on the user's terminal
    try:
        return quantizer.quantize(matmul, [graph])
    finally:
        log.setLevel(level)


def quantize_streamed(proto, folder: Path, data_path: Path, kind: str) -> dict:
    """Quantize the matrix products of `proto` in place, one weight at a time.

    Args:
        proto: the ModelProto, its weights in data files in `folder`
            (`graph.weights`); changed in place.
        folder: the folder of those data files.
        data_path: a new data file in `folder` for the quantized weights.
        kind: `"int4"` or `"int8"`.

    Returns:
        `{"bits", "block_size", "quantized"}`: how many products were quantized.
    """
    graph = proto.graph
    initializers = {init.name: init for init in graph.initializer}
    producers = {output: node for node in graph.node for output in node.output}
    quantizer = _quantizer(kind)
    nodes, added, count = [], [], 0
    with open(data_path, "wb") as data:
        for node in graph.node:
            tensor = _weight(node, initializers, producers)
            if tensor is None:
                nodes.append(node)
                continue
            made, new = _quantized(quantizer, node, tensor, folder, data)
            nodes.extend(made)
            added.extend(new)
            count += 1
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(added)
    _drop_unread(graph)
    if not any(node.domain == "com.microsoft" for node in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return {"bits": WEIGHT_BITS[kind], "block_size": BLOCK_SIZE, "quantized": count}


def _drop_unread(graph) -> None:
    """Drop the nodes nothing reads (the `Cast`s of quantized weights), then
    the initializers nothing reads."""
    outputs = {value.name for value in graph.output}

    def reads() -> set:
        return {name for node in graph.node for name in (*node.input, *body_reads(node))}

    while True:
        read = reads() | outputs
        kept = [node for node in graph.node if any(out in read for out in node.output)]
        if len(kept) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(kept)
    read = reads() | outputs
    kept = [init for init in graph.initializer if init.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
