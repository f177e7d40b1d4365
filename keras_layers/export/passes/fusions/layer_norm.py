"""LayerNorm: tf2onnx's 12-13 elementwise nodes folded back into `LayerNormalization`.

Keras' `LayerNormalization` reaches ONNX as `x * G + (-mean * G [+ beta])`
with `G = gamma / sqrt(var + eps)`: two means, a square, a root, a
reciprocal and five products over the activations. onnxslim has no LayerNorm
pattern and ONNX Runtime's (`FusionLayerNormalization`,
`FusionLayerNormalizationTF`) match the PyTorch and TF1 decompositions, not
this one (measured: 0 fusions on the reference encoder). Needs opset 17.
"""

import numpy as np
from onnx import helper

from keras_layers.export.passes.context import Context, PassResult
from keras_layers.export.passes.fusions.pattern import Rule, last_axis_reduce, run_rule

MAKES = ("LayerNormalization",)


def _match_layer_norm(g, add):
    """(x, gamma, beta, epsilon, add) for one LayerNorm ending at `add`, or None."""
    ranks = g.ranks
    for scaled_name in add.input:
        scaled = g.node(scaled_name, "Mul")
        shift_name = g.other_input(add, scaled_name)
        if scaled is None or shift_name is None or not g.only_used_by(scaled_name):
            continue
        for x in scaled.input:
            factor = g.other_input(scaled, x)
            found = _gain(g, factor)
            if found is None or not g.only_used_by(factor, 2):
                continue
            gamma, recip_name = found
            sqrt = g.node(g.producer[recip_name].input[0], "Sqrt")
            eps_add = sqrt and g.node(sqrt.input[0], "Add")
            if not eps_add:
                continue
            var_name = next((i for i in eps_add.input if g.node(i, "ReduceMean")), None)
            if var_name is None:
                continue
            epsilon = g.const(g.other_input(eps_add, var_name))
            variance = g.producer[var_name]
            square = g.node(variance.input[0], "Mul")
            if square is None or square.input[0] != square.input[1]:
                continue
            centred = g.node(square.input[0], "Sub")
            if centred is None or centred.input[0] != x:
                continue
            mean = g.node(centred.input[1], "ReduceMean")
            if mean is None or mean.input[0] != x:
                continue
            rank = ranks.get(x)
            if rank is None or not all(last_axis_reduce(g, n, rank) for n in (mean, variance)):
                continue
            beta = _match_shift(g, shift_name, factor, mean.output[0])
            if beta is None or gamma is None or epsilon is None or epsilon.size != 1:
                continue
            if gamma.size == 0:  # ones, dropped by onnxslim: see `_gain`
                dims = g.shapes.get(x, (None,))[0]
                width = dims[-1] if dims else None
                if not isinstance(width, int):
                    continue
                gamma = np.ones(width, np.float32)
            if not (_along_last_axis(gamma) and _along_last_axis(beta)):
                continue  # e.g. GroupNormalization's (groups, width) gains
            width = gamma.size
            if beta.size == 1:
                beta = np.full(width, beta.reshape(-1)[0], np.float32)
            if beta.size != width:
                continue
            return x, gamma, beta, float(epsilon.reshape(-1)[0]), add
    return None


def _along_last_axis(constant) -> bool:
    """Whether `constant` varies along the last axis only (a per-feature
    gain or shift), the one axis `LayerNormalization(axis=-1)` scales:
    GroupNormalization normalises `(..., groups, width)` over `width` but
    scales by a `(groups, width)` gain, which no `axis=-1` scale holds."""
    return all(dim == 1 for dim in constant.shape[:-1])


def _gain(g, factor):
    """(gamma, the reciprocal's name) for `G = gamma * 1 / sqrt(...)`, gamma a
    constant (None where it is not one), or None when `factor` is no such
    product.

    Over an axis of size 1 (keras.io's timeseries Transformer normalises
    features of shape (T, 1)) x - mean(x) is 0, so gamma's gradient is 0 and
    gamma stays 1; a product by one that keeps the reciprocal's
    (B, T, 1) shape is what onnxslim drops, and `factor` is then the
    reciprocal itself. Gamma comes back empty, to be made as wide as x's
    last axis. (A product by ones as wide as x broadcasts, and is kept.)
    """
    if g.node(factor, "Reciprocal") is not None:
        return np.ones(0, np.float32), factor
    gain = g.node(factor, "Mul")
    recip_name = gain and next((i for i in gain.input if g.node(i, "Reciprocal")), None)
    if not recip_name:
        return None
    return g.const(g.other_input(gain, recip_name)), recip_name


def _match_shift(g, name, factor, mean):
    """The `-mean*G [+ beta]` branch; returns beta (zeros when absent) or None."""
    beta = None
    node = g.producer.get(name)
    if node is not None and node.op_type == "Add":
        for inner in node.input:
            constant = g.const(g.other_input(node, inner))
            if constant is not None and g.node(inner, "Mul") and g.only_used_by(inner):
                beta, node = constant, g.producer[inner]
                break
        else:
            return None
    if node is None or node.op_type != "Mul" or factor not in node.input:
        return None
    negated = g.node(g.other_input(node, factor), "Neg")
    if negated is None or negated.input[0] != mean:
        return None
    return np.zeros(1, np.float32) if beta is None else beta


def _rewrite(edit, match):
    x, gamma, beta, epsilon, add = match
    width = gamma.size
    prefix = f"{add.output[0]}_ln"
    scale = edit.initializer(f"{prefix}_scale", gamma.reshape(width).astype(np.float32))
    bias = edit.initializer(f"{prefix}_bias", beta.reshape(width).astype(np.float32))
    node = helper.make_node("LayerNormalization", [x, scale, bias], [], axis=-1, epsilon=epsilon)
    edit.replace(add, [node])


# Every Add is a candidate and most are none, so a failed match says nothing.
RULE = Rule(
    makes="LayerNormalization",
    anchor="Add",
    form="x * G + (-mean(x) * G [+ beta]),  G = gamma / sqrt(mean((x - mean(x))^2) + eps)",
    match=_match_layer_norm,
    rewrite=_rewrite,
)


def run(proto, context: Context) -> PassResult:
    """Replace decomposed LayerNorms by `LayerNormalization` (opset 17+).

    Args:
        proto: the ModelProto, rewritten in place.
        context: its `shapes` give the ranks the match checks; below opset
            17 nothing is fused.

    Returns:
        How many were replaced, under "LayerNormalization".
    """
    if context.opset < 17:
        return PassResult(proto, {"LayerNormalization": 0})
    return run_rule(RULE, proto, context.shapes)
