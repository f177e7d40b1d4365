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

from keras_layers.export.graph import attribute, body_reads, perm, weights
from keras_layers.export.quantizing import ACCURACY_LEVEL, BLOCK_SIZE, WEIGHT_BITS, summary

_HALF = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


def _plain(node) -> bool:
    """A MatMul, or a Gemm that is one (no scaling, no transposed input A)."""
    if node.op_type == "MatMul":
        return True
    if node.op_type != "Gemm" or attribute(node, "transA", 0):
        return False
    bias = len(node.input) == 3 and node.input[2]
    return attribute(node, "alpha", 1.0) == 1.0 and (
        not bias or attribute(node, "beta", 1.0) == 1.0
    )


def _weight(node, initializers: dict, producers: dict) -> tuple:
    """`(initializer, transposed)`: the matrix a MatMul or plain Gemm
    multiplies by, directly or through a `Cast` of a half-precision one to
    float32, and whether the product reads it transposed (a Gemm's `transB`,
    a tied output projection's `Transpose`); `(None, False)` for any other."""
    if not _plain(node):
        return None, False
    name, transposed = node.input[1], bool(attribute(node, "transB", 0))
    producer = producers.get(name)
    if producer is not None and producer.op_type == "Transpose" and node.op_type == "MatMul":
        if perm(producer) in (None, [1, 0]):
            name, transposed = producer.input[0], True
            producer = producers.get(name)
    if producer is not None and producer.op_type == "Cast" and producer.input[0] in initializers:
        if attribute(producer, "to", 0) == TensorProto.FLOAT:
            name = producer.input[0]
    tensor = initializers.get(name)
    if tensor is None or len(tensor.dims) != 2:
        return None, False
    if tensor.data_type != TensorProto.FLOAT and tensor.data_type not in _HALF:
        return None, False
    return tensor, transposed


def _quantizer(kind: str, accuracy_level: int):
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        DefaultWeightOnlyQuantizer,
    )

    config = DefaultWeightOnlyQuantConfig(
        block_size=BLOCK_SIZE,
        is_symmetric=True,
        accuracy_level=accuracy_level,
        bits=WEIGHT_BITS[kind],
    )
    return DefaultWeightOnlyQuantizer(config)


def _quantized(quantizer, matmul, tensor, transposed: bool, folder: Path, data):
    """`matmul` as ONNX Runtime's quantizer makes it of `tensor` alone (its
    values widened to float32, transposed with `transposed`, named as
    `matmul` reads it), and the new initializers, their values appended to
    `data`."""
    matrix = np.asarray(weights.values(tensor, folder), dtype=np.float32)
    if transposed:
        matrix = np.ascontiguousarray(matrix.T)
    alone = helper.make_graph(
        [], "weight", [], [], [numpy_helper.from_array(matrix, matmul.input[1])]
    )
    del matrix
    made = list(_quantizer_call(quantizer, matmul, alone))
    new = []
    for made_init in alone.initializer:
        if made_init.name == matmul.input[1]:
            continue
        # A tensor of its own: one still inside `alone` would keep the whole
        # graph, the float32 weight with it, alive as long as it is.
        init = TensorProto()
        init.name, init.data_type = made_init.name, made_init.data_type
        init.dims.extend(made_init.dims)
        weights.store(init, numpy_helper.to_array(made_init), data)
        new.append(init)
    del alone
    return made, new


def _reading(template, matmul):
    """A copy of the quantized product `template` for the product `matmul`
    (its input and output), reading the same quantized weight."""
    node = type(template)()
    node.CopyFrom(template)
    node.input[0], node.output[0] = matmul.input[0], matmul.output[0]
    node.name = f"{matmul.name}_shared" if matmul.name else ""
    return node


def _quantizer_call(quantizer, matmul, graph) -> list:
    import logging

    log = logging.getLogger(type(quantizer).__module__)
    level = log.level
    log.setLevel(logging.WARNING)  # not a line per MatMul on the user's terminal
    try:
        return quantizer.quantize(matmul, [graph])
    finally:
        log.setLevel(level)


def quantize_streamed(
    proto, folder: Path, data_path: Path, kind: str, accuracy_level: int = ACCURACY_LEVEL
) -> dict:
    """Quantize the matrix products of `proto` in place, one weight at a time.

    Args:
        proto: the ModelProto, its weights in data files in `folder`
            (`graph.weights`); changed in place.
        folder: the folder of those data files.
        data_path: a new data file in `folder` for the quantized weights.
        kind: `"int4"` or `"int8"`.
        accuracy_level: `MatMulNBits`' compute: 4 (int8 activations) or 1 (float32).

    Returns:
        `quantizing.summary`: how many products were quantized.
    """
    graph = proto.graph
    initializers = {init.name: init for init in graph.initializer}
    producers = {output: node for node in graph.node for output in node.output}
    quantizer = _quantizer(kind, accuracy_level)
    nodes, added, count, done = [], [], 0, {}
    with open(data_path, "wb") as data:
        for node in graph.node:
            tensor, transposed = _weight(node, initializers, producers)
            if tensor is None:
                nodes.append(node)
                continue
            bias = node.op_type == "Gemm" and len(node.input) == 3 and node.input[2]
            product = f"{node.output[0]}_mm" if bias else node.output[0]
            name = f"{tensor.name}_kn" if transposed else tensor.name
            matmul = helper.make_node("MatMul", [node.input[0], name], [product], name=node.name)
            if name in done:  # a weight read twice is quantized once
                made = [_reading(done[name], matmul)]
            else:
                made, new = _quantized(quantizer, matmul, tensor, transposed, folder, data)
                done[name] = made[0]
                added.extend(new)
            nodes.extend(made)
            if bias:
                nodes.append(helper.make_node("Add", [product, node.input[2]], list(node.output)))
            count += 1
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(added)
    _drop_unread(graph)
    if not any(node.domain == "com.microsoft" for node in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return summary(kind, accuracy_level, count)


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
