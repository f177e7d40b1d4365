"""Stage 3, convert: run tf2onnx on the traced function.

Default opset 18: the newest that tf2onnx 1.16-1.17 emits and every onnxruntime
since 1.14 runs. Models whose weights pass protobuf's 2 GB limit are converted
with tf2onnx's `large_model` mode, which keeps tensors outside the proto.
"""

import logging
import re
import time
from dataclasses import dataclass

from export.errors import ConversionError, UsageError
from export.tracing import TracedModel

DEFAULT_OPSET = 18
MIN_OPSET = 13
# Above this many parameter bytes the proto would pass protobuf's 2 GiB limit.
LARGE_MODEL_BYTES = 1_800_000_000


@dataclass
class ConvertedModel:
    """The output of `convert`: an ONNX ModelProto, tensors possibly external."""

    proto: object
    opset: int
    external_tensors: dict | None  # name -> bytes, in large_model mode
    seconds: float


def supported_opsets() -> range:
    from tf2onnx import constants

    return range(MIN_OPSET, max(constants.OPSET_TO_IR_VERSION) + 1)


def check_opset(opset: int) -> int:
    opsets = supported_opsets()
    if opset not in opsets:
        raise UsageError(
            f"--opset {opset}: unsupported; choose {opsets.start}-{opsets.stop - 1} "
            f"(default {DEFAULT_OPSET})"
        )
    return opset


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _unsupported_ops(messages):
    """(node, op) pairs tf2onnx reported it cannot convert."""
    found = []
    for message in messages:
        pattern = r"Tensorflow op \[([^\]]+): ([^\]]+)\] is not supported"
        found.extend(re.findall(pattern, message))
    return found


def _layer_of(node_name: str) -> str:
    """Keras layer name from a TF node path such as `model_1/mix_1/Gelu/Erfc`."""
    parts = node_name.split("/")
    return re.sub(r"_\d+$", "", parts[1]) if len(parts) > 2 else node_name


def _unsupported_message(found) -> str:
    described = sorted(
        {f"op {op} in layer {_layer_of(node)!r} (TF node {node})" for node, op in found}
    )
    return (
        "tf2onnx cannot convert " + "; ".join(described) + ". Replace that layer, "
        "or write the computation with ops ONNX supports."
    )


def convert(traced: TracedModel, opset: int = DEFAULT_OPSET, large_model=False):
    import tf2onnx

    import export.op_handlers  # noqa: F401 - registers handlers with tf2onnx

    check_opset(opset)
    collector = _Collect()
    logger = logging.getLogger("tf2onnx")
    logger.addHandler(collector)
    start = time.perf_counter()
    try:
        proto, external = tf2onnx.convert.from_function(
            traced.function,
            input_signature=traced.signature,
            opset=opset,
            large_model=large_model,
        )
    except Exception as error:  # noqa: BLE001 - translated below
        unsupported = _unsupported_ops(collector.messages)
        if unsupported:
            raise ConversionError(_unsupported_message(unsupported)) from error
        raise ConversionError(f"tf2onnx failed: {type(error).__name__}: {error}") from error
    finally:
        logger.removeHandler(collector)
    unsupported = _unsupported_ops(collector.messages)
    if unsupported:
        raise ConversionError(_unsupported_message(unsupported))
    return ConvertedModel(proto, opset, external, time.perf_counter() - start)
