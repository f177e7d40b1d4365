"""RMS norm: keras-hub's decomposed RMS norms folded into `SimplifiedLayerNormalization`.

Keras-hub's Llama, Mistral, Gemma, Qwen, ... normalise with
`x * rsqrt(mean(x^2) + eps) [* scale]`, which reaches ONNX as `Pow` (or
`Mul(x, x)`), `ReduceMean` over the last axis, `Add(eps)`, `Sqrt`,
`Reciprocal`, `Mul(x, .)` and, unless onnxslim folded a scale of ones away,
`Mul(scale)`: 6-7 nodes, two full passes over the activations, at every
norm. ONNX Runtime's own `FusionSimplifiedLayerNormalization` needs the
scale `Mul`, so it finds none on a model whose scales are still their initial
ones; this rule takes both forms, float32 only, and leaves alone any whose
width shape inference cannot tell. `SimplifiedLayerNormalization` is ONNX
Runtime's (registered in the ONNX domain, opset 1): other runtimes do not
know it.
"""

import numpy as np
from onnx import TensorProto, helper

from keras_layers.export.passes.context import Context, PassResult
from keras_layers.export.passes.fusions.pattern import Rule, last_axis_reduce, run_rule

MAKES = ("SimplifiedLayerNormalization",)


def _match_rms_norm(g, mean):
    """(x, epsilon, scale, node to replace) of one RMS norm, or why not."""
    square = g.producer.get(mean.input[0])
    if square is None or not g.only_used_by(square.output[0]):
        return "the mean is not of a square read only there"
    if square.op_type == "Mul" and square.input[0] == square.input[1]:
        x = square.input[0]
    elif square.op_type == "Pow" and g.is_scalar(square.input[1], 2.0):
        x = square.input[0]
    else:
        return "the mean is not of x * x or x ** 2"
    dims, elem_type = g.shapes.get(x, (None, None))
    if dims is None or elem_type != TensorProto.FLOAT or not isinstance(dims[-1], int):
        return "x is not float32 with a known last axis"
    if not last_axis_reduce(g, mean, len(dims)):
        return "the mean is not over the last axis alone"
    chain = []
    name = mean.output[0]
    for op in ("Add", "Sqrt", "Reciprocal"):
        consumers = g.consumers[name]
        if not g.only_used_by(name) or consumers[0].op_type != op:
            return f"the mean does not go on to {op} alone"
        chain.append(consumers[0])
        name = consumers[0].output[0]
    epsilon = g.const(g.other_input(chain[0], mean.output[0]))
    if epsilon is None or epsilon.size != 1:
        return "the added epsilon is not one constant"
    normalise = g.consumers[name]
    if not g.only_used_by(name) or normalise[0].op_type != "Mul":
        return "the inverse root does not go on to one Mul"
    if g.other_input(normalise[0], name) != x:
        return "the inverse root does not multiply x"
    last, width = normalise[0], dims[-1]
    scale = np.ones(width, np.float32)
    after = g.consumers[last.output[0]]
    if g.only_used_by(last.output[0]) and after[0].op_type == "Mul":
        gain = g.const(g.other_input(after[0], last.output[0]))
        if gain is not None and gain.size == width and gain.dtype == np.float32:
            scale, last = gain.reshape(width), after[0]
    return x, float(epsilon.reshape(-1)[0]), scale, last


def _rewrite(edit, match):
    x, epsilon, scale, last = match
    scale = edit.initializer(f"{last.output[0]}_rms_scale", scale)
    node = helper.make_node(
        "SimplifiedLayerNormalization", [x, scale], [], axis=-1, epsilon=epsilon
    )
    edit.replace(last, [node])


RULE = Rule(
    makes="SimplifiedLayerNormalization",
    anchor="ReduceMean",
    form="x * 1 / sqrt(mean(x * x) + eps) [* scale]",
    match=_match_rms_norm,
    rewrite=_rewrite,
)


def run(proto, context: Context) -> PassResult:
    """Replace decomposed RMS norms by ONNX Runtime's `SimplifiedLayerNormalization`.

    Args:
        proto: the ModelProto, rewritten in place.
        context: its `shapes` (`graph.tensor_shapes`) give x's type and width.

    Returns:
        How many were replaced, under "SimplifiedLayerNormalization", and
        (mean's output, reason) for each mean left alone.
    """
    return run_rule(RULE, proto, context.shapes)
