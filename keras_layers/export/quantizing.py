"""Dynamic int8 quantization that keeps a tied matrix stored once.

ONNX Runtime's `quantize_dynamic` quantizes weights that are initializers. Our
lean float file feeds the tied output projection through a `Transpose` node of
the embedding matrix, which `quantize_dynamic` cannot see through, and it skips
`Gemm` (the attention projections) altogether. So the transpose is first made
an initializer again and every Gemm a MatMul; every MatMul and Gather weight is
then quantized, the tied table takes its projection's int8 values (see
`share_tied_int8`), and the slim stage's deduplication stores it once.
Each row of an activation is then quantized with its own scale
(`quantize_rows`), so that no row of a batch changes another's result.
"""

import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from keras_layers.export.graph.weights import save_in_memory
from keras_layers.export.options import ACCURACY_LEVEL
from keras_layers.export.slimming import deduplicate_initializers

QUANTIZED_OPS = ["MatMul", "Gather"]
# Ops whose weights an int8 file keeps in float32 (`quantize_int8`).
FLOAT_CONVOLUTIONS = ("Conv", "ConvTranspose")


def materialize_transposes(proto) -> dict:
    """Turn `Transpose(initializer)` nodes back into initializers.

    Returns {transposed name: original name}.
    """
    graph = proto.graph
    initializers = {init.name: init for init in graph.initializer}
    kept, made = [], {}
    for node in graph.node:
        if node.op_type == "Transpose" and node.input[0] in initializers:
            array = numpy_helper.to_array(initializers[node.input[0]])
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            graph.initializer.append(
                numpy_helper.from_array(array.transpose(perm).copy(), node.output[0])
            )
            made[node.output[0]] = node.input[0]
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    return made


def gemms_to_matmuls(proto) -> int:
    """`Gemm(A, B, C, transB=1)` with constant B -> `MatMul(A, B^T) + C`.

    ONNX Runtime's dynamic quantization handles MatMul but not Gemm, and the
    attention projections reach the graph as Gemm.
    """
    graph = proto.graph
    initializers = {init.name: init for init in graph.initializer}
    nodes, changed = [], 0
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        has_bias = len(node.input) == 3 and node.input[2]
        plain = attrs.get("alpha", 1.0) == 1.0 and (not has_bias or attrs.get("beta", 1.0) == 1.0)
        if node.op_type != "Gemm" or node.input[1] not in initializers or not plain:
            nodes.append(node)
            continue
        weight = numpy_helper.to_array(initializers[node.input[1]])
        if attrs.get("transB", 0):
            weight = weight.T
        if attrs.get("transA", 0):
            nodes.append(node)
            continue
        name = f"{node.input[1]}_kn"
        graph.initializer.append(numpy_helper.from_array(weight.copy(), name))
        product = f"{node.output[0]}_mm" if has_bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], name], [product]))
        if has_bias:
            nodes.append(helper.make_node("Add", [product, node.input[2]], list(node.output)))
        changed += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return changed


def share_tied_int8(proto, transposed: dict) -> int:
    """Quantize a tied embedding's lookup with its projection's int8 values.

    `quantize_dynamic` quantizes a Gather table as asymmetric uint8 and a MatMul
    weight as symmetric int8, so `E` and `E^T` come out different. Symmetric
    per-tensor int8 of `E^T` transposed *is* symmetric per-tensor int8 of `E`,
    so the table is replaced by it (with its scale and zero point), and
    deduplication can then store the matrix once.

    Args:
        proto: the quantized model, changed in place.
        transposed: the projection's weight name -> the lookup table's name.

    Returns:
        How many tables now share their projection's int8 values.
    """
    initializers = {init.name: init for init in proto.graph.initializer}
    shared = 0
    for projected, table in transposed.items():
        names = [f"{projected}_quantized", f"{projected}_scale", f"{projected}_zero_point"]
        targets = [f"{table}_quantized", f"{table}_scale", f"{table}_zero_point"]
        if not all(name in initializers for name in names + targets):
            continue
        values = numpy_helper.to_array(initializers[names[0]]).T.copy()
        replacements = [values] + [numpy_helper.to_array(initializers[n]) for n in names[1:]]
        for target, array in zip(targets, replacements, strict=True):
            initializers[target].CopyFrom(numpy_helper.from_array(array, target))
        shared += 1
    return shared


# The zero point of every row-quantized activation: values in [1, 255] about
# it, so that ONNX Runtime keeps its uint8 x int8 kernels (and the 7-bit
# weights' headroom, see `quantize_int8`) with one constant zero point. A
# zero point per row (asymmetric, as `DynamicQuantizeLinear`'s) is refused by
# ONNX Runtime's MatMulInteger and MatMulIntegerToFloat; correcting the
# product by zero point x column sums instead ran 1.7x the per-tensor file
# (2 layers, 256 wide, 8 x 128) for a relative L2 error of 0.031 against this
# one's 0.032 (per tensor: 0.033). Centring each row in float instead (its
# midrange subtracted, 254 steps over its range, midrange x the weights'
# column sums added to the product) ran 1.59x and 1.49x the per-tensor file
# (the reference encoder at 1x128 and 8x128, side by side; this one 1.31x and
# 1.20x) for a top-1 agreement with Keras of 99.632% against this one's
# 99.615% on 400,000 held-out tokens of the trained demo (per tensor:
# 99.604%). A zero point of 0 for the FFN's ReLU outputs, which leave half
# the symmetric range unused, gave 99.619%: within the noise, not kept.
ROW_ZERO_POINT = 128
# Since which opset each reduction takes its axes as an input, not an attribute.
_AXES_AS_INPUT = {"ReduceMax": 18, "ReduceSum": 13}


def quantize_rows(proto) -> int:
    """Give each row of every dynamically quantized activation its own scale.

    ONNX Runtime's `DynamicQuantizeLinear` quantizes a MatMul's activations
    with one scale over the whole tensor: the largest value of any row of the
    batch sets every row's precision, and a row that is NaN (a masked mean
    over no token, 0/0) makes every row NaN. Each becomes a per-row
    quantization instead: a row (the last axis, one token) is scaled by its
    own largest magnitude / 127 about the constant zero point
    `ROW_ZERO_POINT` (symmetric, so the MatMulIntegers that read it keep one
    zero point, which ONNX Runtime's kernels require), and a row holding NaN
    gets a NaN scale (ONNX Runtime's ReduceMax skips NaN that is not first).
    A row then gives the same int8 result in any batch. A bias added to such
    a product is kept out of ONNX Runtime's fused kernel, which would
    multiply it by the row scales (`_bias_outside_row_scaling`).

    Args:
        proto: the quantized model, changed in place.

    Returns:
        How many activations are now quantized per row.
    """
    graph = proto.graph
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    constants = {
        "row_quantize_axes": np.array([-1], np.int64),
        "row_quantize_127": np.array(127, np.float32),
        "row_quantize_one": np.array(1, np.float32),
        "row_quantize_zero_point": np.array(ROW_ZERO_POINT, np.uint8),
    }
    nodes, replaced, count = [], set(), 0
    for node in graph.node:
        if node.op_type != "DynamicQuantizeLinear":
            nodes.append(node)
            continue
        nodes.extend(_row_quantizer(node.input[0], node.output[0], node.output[1], opset))
        # The zero point becomes a constant, under the name the MatMulIntegers read.
        constants[node.output[2]] = constants["row_quantize_zero_point"]
        replaced.update(node.output)
        count += 1
    if not count:
        return 0
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(numpy_helper.from_array(v, name) for name, v in constants.items())
    # Shape inference typed the scales as scalars; they are now a column.
    kept = [info for info in graph.value_info if info.name not in replaced]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    _bias_outside_row_scaling(graph, replaced)
    return count


def _bias_outside_row_scaling(graph, row_quantized: set) -> int:
    """Add each bias that follows a row-scaled product as a `Sub` of its negation.

    ONNX Runtime fuses `MatMulInteger -> Cast -> Mul(scale) -> Add(constant)`
    into one `MatMulIntegerToFloat` with the constant as its bias, and that
    kernel applies an A scale that is not a scalar to its whole output, the
    bias included (`ScaleOutput` after the product, onnxruntime 1.32): each
    row's bias came out multiplied by the row's scale. The fusion takes an
    `Add` only (whichever side its constant is on), and `y - (-b)` is `y + b`
    to the bit, so the product is still fused, its row scaling right, and the
    bias is added after it. On the trained demo, top-1 agreement with Keras on
    its held-out tokens went from 99.496% to 99.607% (per tensor: 99.605%),
    the logits' relative L2 error against the float32 file from 0.0485 to
    0.0389 (0.0417). The bias's own pass costs up to 4% (the reference encoder
    and a 768-wide one at 1x128 and 8x128, timed side by side).

    Args:
        graph: the quantized graph, changed in place.
        row_quantized: the outputs of `quantize_rows`' quantizers.

    Returns:
        How many biases are now a `Sub`.
    """
    readers = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)

    def only_reader(node, op: str):
        found = readers.get(node.output[0], []) if node is not None else []
        return found[0] if len(found) == 1 and found[0].op_type == op else None

    initializers = {init.name: init for init in graph.initializer}
    negated, changed = {}, 0
    for product in graph.node:
        if product.op_type != "MatMulInteger" or product.input[0] not in row_quantized:
            continue
        scaled = only_reader(only_reader(product, "Cast"), "Mul")
        add = only_reader(scaled, "Add")
        bias = next((n for n in add.input if n in initializers), None) if add is not None else None
        if bias is None:
            continue
        if bias not in negated:
            negated[bias] = f"{bias}_negated"
            array = -numpy_helper.to_array(initializers[bias])
            graph.initializer.append(numpy_helper.from_array(array, negated[bias]))
        add.op_type = "Sub"
        del add.input[:]
        add.input.extend([scaled.output[0], negated[bias]])
        changed += 1
    # A bias that only these products read is stored negated alone.
    used = {name for node in graph.node for name in node.input}
    used |= {value.name for value in [*graph.input, *graph.output]}
    kept = [init for init in graph.initializer if init.name not in negated or init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return changed


def _row_quantizer(x: str, quantized: str, scale: str, opset: int) -> list:
    """The nodes that quantize `x` per row (`quantize_rows`): `quantized`
    (uint8, the shape of `x`) and `scale` (float, `x`'s shape with a last
    axis of 1). Few nodes: ONNX Runtime spends microseconds on each, and a
    file has one quantizer per MatMul input."""

    def name(suffix: str) -> str:
        return f"{x}_row_{suffix}"

    def reduce(op: str, source: str, target: str):
        if opset >= _AXES_AS_INPUT[op]:
            return helper.make_node(op, [source, "row_quantize_axes"], [target], keepdims=1)
        return helper.make_node(op, [source], [target], axes=[-1], keepdims=1)

    def node(op: str, inputs: list, output: str):
        return helper.make_node(op, inputs, [output])

    return [
        node("Abs", [x], name("abs")),
        reduce("ReduceMax", name("abs"), name("largest")),
        reduce("ReduceSum", x, name("sum")),
        node("IsNaN", [name("sum")], name("has_nan")),
        node("Where", [name("has_nan"), name("sum"), name("largest")], name("extent")),
        node("Div", [name("extent"), "row_quantize_127"], scale),
        # A row of zeros has scale 0: its values are then NaN (0/0) and
        # quantize to anything, but its product is 0 x scale 0 = 0, as it should.
        node("Div", [x, scale], name("steps")),
        node(
            "QuantizeLinear",
            [name("steps"), "row_quantize_one", "row_quantize_zero_point"],
            quantized,
        ),
    ]


def quantize_int8(source, target, rows: bool = True) -> dict:
    """Write an int8 dynamically quantized copy of `source` to `target`.

    Args:
        source: the validated float32 ONNX file.
        target: the int8 file to write.
        rows: quantize each row of an activation with its own scale
            (`quantize_rows`); False keeps ONNX Runtime's one scale per
            tensor (benchmarks/int8_rows.py compares the two).

    Returns:
        `{"stored_once": [...], "float_convolutions": N}`: the initializers
        the tied matrix shares, and how many convolutions keep float32
        weights (`QUANTIZED_OPS` holds no Conv: ONNX Runtime's dynamic
        `ConvInteger` is not offered; a CNN's int8 file quantizes its
        `Dense` layers only, and the report says so).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    proto = onnx.load(str(source))
    transposed = materialize_transposes(proto)
    gemms_to_matmuls(proto)
    with tempfile.TemporaryDirectory() as workdir:
        staged = Path(workdir) / "float.onnx"
        quantized = Path(workdir) / "int8.onnx"
        onnx.save(proto, str(staged))
        quantize_dynamic(
            staged,
            quantized,
            weight_type=QuantType.QInt8,
            op_types_to_quantize=QUANTIZED_OPS,
            per_channel=False,
            # Weights in 7 bits: ONNX Runtime's uint8 x int8 kernels on x86
            # CPUs without VNNI (AVX2) add pairs of products in 16 bits, which
            # 8-bit weights overflow (measured on an AVX2 EPYC, 8 x 64 tokens:
            # top-1 agreement with Keras 77% on the tests' tied encoder with 8
            # bits, 96.5% with 7; the demo encoder 96.9% and 97.7%). A file may
            # run on any CPU, so every file gets the range that holds on all.
            reduce_range=True,
            # ONNX shape inference cannot type what follows a contrib op
            # (`MultiHeadAttention`); every tensor quantized here is float32.
            extra_options={"WeightSymmetric": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        result = onnx.load(str(quantized))
    if rows:
        quantize_rows(result)
    share_tied_int8(result, transposed)
    changes = deduplicate_initializers(result)
    onnx.save(result, str(target))
    convolutions = sum(node.op_type in FLOAT_CONVOLUTIONS for node in result.graph.node)
    return {"stored_once": changes, "float_convolutions": convolutions}


# Rounds of each file in `latency`, interleaved, after one warm-up run each.
LATENCY_ROUNDS = 7
# A CNN's int8 file is kept when it is at least this much faster than the
# float32 file (float32's time over int8's). A ResNet-50-sized classifier's
# int8 file (53 float convolutions, its head quantized) measured 0.98x,
# 0.993x and 1.005x in three exports on one machine: a tie within the noise
# (benchmarks/results/int8_cnn.json); a tie decided either way by that
# noise is no reason to ship a second file.
MIN_KEPT_SPEEDUP = 1.05


def latency(float_path, int8_path, feeds: dict, rounds: int = LATENCY_ROUNDS) -> dict:
    """The float32 and int8 files' time on one input, measured side by side.

    int8 is not always faster: ONNX Runtime quantizes the activations of
    every product at run time, and a CNN's int8 file quantizes only its
    `Dense` head (its convolutions keep float32 weights), so it can be
    slower than the float32 file. Each round runs both files once, in turn,
    so that a shared machine's load falls on both alike.

    Args:
        float_path: the float32 file.
        int8_path: the int8 file.
        feeds: one input of the files, by name.
        rounds: how many interleaved rounds.

    Returns:
        `{"float32_ms", "int8_ms", "speedup", "rounds", "shape"}`: the
        median milliseconds of each, float32's over int8's, and the input's
        shapes.
    """
    import time

    import onnxruntime as ort

    sessions = [
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        for path in (float_path, int8_path)
    ]
    times = [[], []]
    for session in sessions:
        session.run(None, feeds)
    for _ in range(rounds):
        for index, session in enumerate(sessions):
            start = time.perf_counter()
            session.run(None, feeds)
            times[index].append(time.perf_counter() - start)
    float_ms, int8_ms = (1000 * float(np.median(t)) for t in times)
    return {
        "float32_ms": round(float_ms, 3),
        "int8_ms": round(int8_ms, 3),
        "speedup": round(float_ms / int8_ms, 3) if int8_ms else None,
        "rounds": rounds,
        "shape": {name: list(value.shape) for name, value in feeds.items()},
    }


# Weight-only quantization of a decoder's MatMul weights (`quantize_weights`).
WEIGHT_BITS = {"int4": 4, "int8": 8}
BLOCK_SIZE = 32
# MatMulNBits' `accuracy_level` 4: the activations quantized to int8 per
# block and the products summed in integers, as the model builder does on CPU.
# Measured on a 4-layer, 256-wide GPT-2 (7.5M parameters), 32 greedy tokens
# after 128 at batch 1 (AVX-512): int8 105 -> 1,307 tokens/s (float32: 799),
# its 32 tokens float32's at both levels; int4 988 -> 1,277. The decoder gate
# judges every file on the machine that exports it. Level 1 computes in
# float32 from the dequantized weights (`ExportOptions.decoder_accuracy_level`):
# slower, and no activation rounding on top of the weights'. The default
# and the choices are `options.ACCURACY_LEVEL` and `options.ACCURACY_LEVELS`.


def quantize_weights(source, target, kind: str, accuracy_level: int = ACCURACY_LEVEL) -> dict:
    """Write a weight-only quantized copy of the decoder `source` to `target`.

    Every MatMul whose weight is a constant becomes ONNX Runtime's
    `MatMulNBits` (com.microsoft): the weight in blocks of `BLOCK_SIZE` values
    along its input axis, each block with its own scale, 4 or 8 bits a value,
    symmetric; activations are float32 in and out, quantized to int8 inside
    the op at `accuracy_level` 4, or not at 1 (ONNX Runtime's own quantizer,
    `MatMulNBitsQuantizer`, the layout onnxruntime-genai's model builder
    writes). A tied output projection (a `Transpose` of the embedding) is
    made a weight first, so it is quantized too.

    Args:
        source: the validated float32 decoder.
        target: the file to write (weights inline; a data file beside it
            when they pass 1.8 GB).
        kind: "int4" or "int8".
        accuracy_level: `MatMulNBits`' compute: 4 (int8 activations) or 1 (float32).

    Returns:
        `{"bits", "block_size", "accuracy_level", "quantized"}`: how many
        MatMuls were quantized.
    """
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    proto = onnx.load(str(source))
    materialize_transposes(proto)
    gemms_to_matmuls(proto)
    quantizer = MatMulNBitsQuantizer(
        proto,
        bits=WEIGHT_BITS[kind],
        block_size=BLOCK_SIZE,
        is_symmetric=True,
        accuracy_level=accuracy_level,
    )
    log = logging.getLogger(MatMulNBitsQuantizer.__module__)
    level = log.level
    log.setLevel(logging.WARNING)  # not a line per MatMul on the user's terminal
    try:
        quantizer.process()
    finally:
        log.setLevel(level)
    result = quantizer.model.model
    count = sum(node.op_type == "MatMulNBits" for node in result.graph.node)
    save_in_memory(result, target)
    return summary(kind, accuracy_level, count)


def summary(kind: str, accuracy_level: int, count: int) -> dict:
    """What a weight-only quantization did, for the report.

    Args:
        kind: "int4" or "int8".
        accuracy_level: `MatMulNBits`' accuracy level.
        count: how many matrix products were quantized.

    Returns:
        `{"bits", "block_size", "accuracy_level", "quantized"}`.
    """
    return {
        "bits": WEIGHT_BITS[kind],
        "block_size": BLOCK_SIZE,
        "accuracy_level": accuracy_level,
        "quantized": count,
    }
