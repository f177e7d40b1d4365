"""What each ONNX op does to its outputs' dims and values: the table `OPS`.

`evaluation.Evaluation` looks every node's op up here. An entry is
`rule(evaluation, node)`: it returns the first output's dims (a tuple of
`Dim`, None for a dim not proven; None when not even the rank is known) and
records values on the evaluation as it finds them (`evaluation.value`). A
value is either a list of `Dim` (None for an entry not known), the dims a
scalar or 1-D integer tensor holds (a shape's entries), or a NumPy array of
a constant's values or of what constants compute: float arithmetic in the
tensor's own type, each operation rounded once, as ONNX Runtime computes it
(a scale computed from a head size). A rule raises on an input it cannot
read; the evaluation then leaves the outputs unknown.
"""

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from keras_layers.export.graph.dims import ONE, Dim, broadcast

# A Slice end from here up means "to the end": Keras slices with 1e9 for it
# (keras-hub's masks), and no axis of a tensor that fits in memory is that long.
TO_THE_END = 10**9
# Integer tensors up to this many elements have their values read as dims.
MAX_DIM_VALUES = 16
# Constant arrays up to this many elements have their values computed.
MAX_ARRAY_ELEMENTS = 4096
# What a rule may raise on an input it cannot read.
UNREADABLE = (
    AttributeError,
    IndexError,
    KeyError,
    OverflowError,
    TypeError,
    ValueError,
    ZeroDivisionError,
)

_SAME_AS_FIRST = {
    "Abs", "Ceil", "Cos", "Elu", "Erf", "Exp", "FastGelu", "Floor", "Gelu", "BiasGelu",
    "HardSigmoid", "IsInf", "IsNaN", "LayerNormalization", "LeakyRelu", "Log",
    "LogSoftmax", "Not", "QuickGelu", "Relu", "Round", "Selu", "Sigmoid",
    "RotaryEmbedding", "Sign", "SimplifiedLayerNormalization", "Sin", "Softmax", "Softplus",
    "Softsign", "Tanh", "Trilu", "CumSum", "Dropout",
}  # fmt: skip
# ONNX Runtime's own ops this evaluation reads (the fusions write them); any
# other op outside the ONNX domain is unknown, whatever its name.
CONTRIB = {
    "BiasGelu", "FastGelu", "Gelu", "QuickGelu", "MultiHeadAttention", "FusedMatMul",
    "RotaryEmbedding",
}  # fmt: skip
_BROADCASTING = {
    "And", "BitShift", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Max",
    "Min", "Mod", "Or", "Pow", "PRelu", "Sum", "Where", "Xor",
}  # fmt: skip
_REDUCTIONS = {
    "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
    "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare",
}  # fmt: skip
# The float arithmetic computed on constant values, unary and binary.
_FLOAT_UNARY = {"Sqrt": np.sqrt, "Reciprocal": np.reciprocal, "Neg": np.negative}
_FLOAT_BINARY = {"Div": np.divide, "Mul": np.multiply, "Add": np.add, "Sub": np.subtract}


def _computed(ev, name: str, make) -> None:
    """Record `make()`, an array computed from constant values, as `name`'s
    value; a computation that fails records nothing (and never costs the
    output its dims)."""
    try:
        with np.errstate(all="ignore"):
            ev.hold(name, np.asarray(make()))
    except UNREADABLE:
        pass


# -- values the op passes on as they are ------------------------------------------


def _same_as_first(ev, node):
    return ev.first(node)


def _identity(ev, node):
    found = ev.get(node.input[0])
    if found is not None:
        ev.value[node.output[0]] = found
    return ev.first(node)


def _cast_keeps(ev, node) -> bool:
    """Whether a Cast keeps every dim it holds as it is: to a 32- or 64-bit
    integer or a float wide enough for any size (sizes stay far below 2**24;
    a static value is checked)."""
    limits = {
        onnx.TensorProto.INT64: 2**63,
        onnx.TensorProto.INT32: 2**31,
        onnx.TensorProto.FLOAT: 2**24,
        onnx.TensorProto.DOUBLE: 2**53,
    }
    limit = limits.get(ev.attribute(node, "to"))
    values = ev.get(node.input[0])
    # An unknown value stays unknown, whatever the cast does to it.
    return limit is not None and all(
        v is None or v.static is None or abs(v.static) < limit for v in values
    )


def _cast_array(array, to):
    """`array` cast to the ONNX element type `to`, as NumPy casts (a number
    or boolean type only)."""
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(to))
    if dtype.kind not in "biuf":
        raise ValueError(f"a cast to {dtype}")
    return array.astype(dtype)


def _cast(ev, node):
    """Constant values cast as NumPy casts them; dims kept where `_cast_keeps`."""
    concrete = ev.array(node.input[0])
    if concrete is not None:
        _computed(ev, node.output[0], lambda: _cast_array(concrete, ev.attribute(node, "to")))
    elif isinstance(ev.get(node.input[0]), list) and _cast_keeps(ev, node):
        ev.value[node.output[0]] = ev.get(node.input[0])
    return ev.first(node)


def _constant_array(node):
    """A Constant node's value as an array (any of its attribute forms)."""
    attribute = node.attribute[0]
    if attribute.name in ("value", "sparse_value"):
        if attribute.name == "sparse_value":
            raise ValueError("a sparse constant")
        return numpy_helper.to_array(attribute.t)
    value = helper.get_attribute_value(attribute)
    if isinstance(value, bytes | list) and value and isinstance(value[0], bytes):
        raise ValueError("a string constant")
    floats = attribute.name in ("value_float", "value_floats")
    return np.array(value, np.float32 if floats else np.int64)


def _constant(ev, node):
    array = _constant_array(node)
    ev.hold(node.output[0], array)
    return tuple(Dim.of(d) for d in array.shape)


def _shape(ev, node):
    dims = ev.dims_of(node.input[0])
    if dims is None:
        return None
    start, end = ev.attribute(node, "start", 0), ev.attribute(node, "end")
    picked = list(dims[start:end])
    ev.value[node.output[0]] = picked
    return (Dim.of(len(picked)),)


# -- arithmetic -----------------------------------------------------------------


def _float_unary(function):
    def rule(ev, node):
        x = ev.get(node.input[0])
        if isinstance(x, np.ndarray) and x.dtype.kind == "f":
            _computed(ev, node.output[0], lambda: function(x).astype(x.dtype))
        return ev.first(node)

    return rule


def _arithmetic(function):
    """Float constants computed in their own type; dims multiplied, divided,
    added or subtracted where `_elementwise_value` proves the result."""

    def rule(ev, node):
        out = broadcast([ev.shape.get(name) for name in node.input])
        floats = ev.floats(node.input)
        if floats is not None:
            _computed(ev, node.output[0], lambda: function(*floats).astype(floats[0].dtype))
        else:
            _elementwise_value(ev, node)
        return out

    return rule


def _broadcasting(ev, node):
    out = broadcast([ev.shape.get(name) for name in node.input])
    _elementwise_value(ev, node)
    return out


def _elementwise_value(ev, node):
    values = [ev.vector(name) for name in node.input]
    ops = ("Mul", "Add", "Sub", "Div", "Max", "Min", "Where", "And", "Or", "Equal")
    if node.op_type not in ops or any(v is None for v in values):
        return
    length = max(len(v) for v in values)
    if any(len(v) not in (1, length) for v in values):
        return
    values = [v * length if len(v) == 1 else v for v in values]
    if node.op_type == "Where":  # a constant condition picks, value by value
        ev.value[node.output[0]] = [
            None if pick is None or pick.static is None else (x if pick.static else y)
            for pick, x, y in zip(*values, strict=True)
        ]
        return
    if len(values) != 2:
        return
    combine = {"Max": _extreme, "Min": _extreme, "And": _logical, "Or": _logical}
    combine |= {"Equal": _logical}
    if node.op_type in combine:
        ev.value[node.output[0]] = [
            combine[node.op_type](node.op_type, x, y) for x, y in zip(*values, strict=True)
        ]
        return
    ev.value[node.output[0]] = [
        _arithmetic_dim(node.op_type, x, y) for x, y in zip(*values, strict=True)
    ]


def _arithmetic_dim(op, x, y):
    """x op y for Mul, Div, Add or Sub where a `Dim` holds it exactly, else None."""
    if x is None or y is None:
        return None
    if op == "Mul":
        return x * y
    if op == "Div":
        return x.divided_by(y) if y.static else None
    if x.static is not None and y.static is not None:
        return Dim.of(x.static + y.static if op == "Add" else x.static - y.static)
    if y.static == 0 or (op == "Add" and x.static == 0):
        return x if y.static == 0 else y  # adding or taking away 0
    return None


def _extreme(op, x, y):
    """max(x, y) or min(x, y) where it is provable: both static; or a size
    (a positive multiple of symbols, never negative) against a bound at
    most 0 for Max, or one axis's size against `TO_THE_END` or more for
    Min, as TensorFlow's strided slices clamp their ends."""
    if x is None or y is None:
        return None
    if x.static is not None and y.static is not None:
        return Dim.of(max(x.static, y.static) if op == "Max" else min(x.static, y.static))
    size, bound = (x, y) if y.static is not None else (y, x)
    if bound.static is None or size[0] <= 0:
        return None
    if op == "Max" and bound.static <= 0:
        return size
    if op == "Min" and bound.static >= TO_THE_END and size[0] == 1 and len(size[1]) == 1:
        return size  # one axis's size, which is never that long
    return None


def _logical(op, x, y):
    """And, Or or Equal of two values as 0 or 1 where it is provable: both
    static, or (And, Or) one of them a constant that decides alone
    (TensorFlow's strided slices AND their end masks with constants)."""
    statics = [d.static for d in (x, y) if d is not None and d.static is not None]
    if op == "And" and any(v == 0 for v in statics):
        return Dim.of(0)
    if op == "Or" and any(v != 0 for v in statics):
        return ONE
    sizes = [d for d in (x, y) if d is not None and d.static is None and d[0] > 0]
    if op == "Equal" and len(sizes) == 1 and len(statics) == 1 and statics[0] < 0:
        return Dim.of(0)  # a size is never negative (tf.slice's size -1: "to the end")
    if len(statics) != 2:
        return None
    a, b = statics
    if op == "Equal":
        return Dim.of(int(a == b))
    return Dim.of(int(bool(a) and bool(b)) if op == "And" else int(bool(a) or bool(b)))


# -- picking and moving values ------------------------------------------------------


def _gather(ev, node):
    data, indices = ev.first(node), ev.shape.get(node.input[1])
    axis = ev.attribute(node, "axis", 0)
    x, picked = ev.get(node.input[0]), ev.get(node.input[1])
    if isinstance(x, np.ndarray) and isinstance(picked, np.ndarray):
        if x.ndim == 1 and axis in (0, -1) and picked.dtype.kind in "iu":
            _computed(ev, node.output[0], lambda: x[picked.astype(np.int64)])
    else:
        values, positions = ev.vector(node.input[0]), ev.ints(node.input[1])
        if values is not None and positions is not None:
            ev.value[node.output[0]] = [values[i] for i in positions]
    if data is None or indices is None:
        return None
    axis %= len(data)
    return data[:axis] + indices + data[axis + 1 :]


def _squeeze(ev, node):
    first = ev.first(node)
    given, axes = ev.optional(node, 1, "axes")
    x, out = ev.get(node.input[0]), node.output[0]
    if isinstance(x, np.ndarray) and not (given and axes is None):
        if node.op_type == "Squeeze":
            _computed(ev, out, lambda: np.squeeze(x, None if axes is None else tuple(axes)))
        elif axes is not None:
            _computed(ev, out, lambda: np.expand_dims(x, tuple(axes)))
    if first is None or (given and axes is None):
        return None
    if isinstance(x, list):
        ev.value[out] = x
    if node.op_type == "Unsqueeze":
        if axes is None:
            return None
        rank = len(first) + len(axes)
        axes = {a % rank for a in axes}
        rest = iter(first)
        return tuple(ONE if axis in axes else next(rest) for axis in range(rank))
    if axes is None:  # every axis of size 1: only static sizes say which
        if any(d is None or d.static is None for d in first):
            return None
        return tuple(d for d in first if d != ONE)
    axes = {a % len(first) for a in axes}
    return tuple(d for axis, d in enumerate(first) if axis not in axes)


def _static_vector(shape) -> bool:
    """Whether `shape` is 1-D of a static, small length."""
    return (
        shape is not None
        and len(shape) == 1
        and shape[0] is not None
        and shape[0].static is not None
        and shape[0].static <= MAX_DIM_VALUES
    )


def _concat(ev, node):
    shapes = [ev.shape.get(name) for name in node.input]
    # A 1-D part whose values are not known (a sequence's total length
    # past + new, which no Dim can write) still holds a known number of them.
    values = [
        ev.vector(name) or ([None] * s[0].static if _static_vector(s) else None)
        for name, s in zip(node.input, shapes, strict=True)
    ]
    if all(v is not None for v in values):
        ev.value[node.output[0]] = [v for value in values for v in value]
    if any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1:
        return None
    axis = ev.attribute(node, "axis") % len(shapes[0])
    sizes = [s[axis] for s in shapes]
    total = None
    if all(size is not None and size.static is not None for size in sizes):
        total = Dim.of(sum(size.static for size in sizes))
    out = list(broadcast([s[:axis] + (ONE,) + s[axis + 1 :] for s in shapes]) or ())
    if not out:
        return None
    out[axis] = total
    return tuple(out)


def _slice(ev, node):
    first = ev.first(node)
    starts, ends = ev.ints(node.input[1]), _slice_ends(ev, node, first)
    has_axes, axes = ev.optional(node, 3)
    has_steps, steps = ev.optional(node, 4)
    if first is None or starts is None or ends is None:
        return None
    if (has_axes and axes is None) or (has_steps and steps is None):
        return None
    axes = axes if axes is not None else list(range(len(starts)))
    steps = steps if steps is not None else [1] * len(starts)
    if any(step <= 0 for step in steps):
        return None  # ONNX clamps a backward slice's start unlike Python
    x = ev.get(node.input[0])
    if x is not None and len(first) == 1 and steps == [1]:
        start, end = starts[0], ends[0]
        if isinstance(x, list):
            ev.value[node.output[0]] = x[slice(start, min(end, len(x)))]
        else:
            _computed(ev, node.output[0], lambda: x[slice(start, min(end, len(x)))])
    out = list(first)
    for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
        axis %= len(first)
        dim = first[axis]
        if start == 0 and end >= TO_THE_END and step == 1:
            continue
        if dim is not None and dim.static is not None:
            out[axis] = Dim.of(len(range(dim.static)[start:end:step]))
        else:
            out[axis] = None
    return tuple(out)


def _slice_ends(ev, node, first):
    """The Slice's ends as ints, an end that is its axis's own symbolic
    dim (keras' `x[:, :shape(x)[1]]`) read as "to the end"; or None."""
    ends = ev.vector(node.input[2])
    if ends is None or first is None:
        return None
    has_axes, axes = ev.optional(node, 3)
    if has_axes and axes is None:
        return None
    axes = axes if axes is not None else list(range(len(ends)))
    if len(axes) != len(ends):
        return None
    found = []
    for axis, end in zip(axes, ends, strict=True):
        if end is not None and end.static is not None:
            found.append(end.static)
        elif end is not None and -len(first) <= axis < len(first) and end == first[axis]:
            found.append(TO_THE_END)
        else:
            return None
    return found


# -- dims from dims -------------------------------------------------------------------


def _reshape(ev, node):
    first, target = ev.first(node), ev.vector(node.input[1])
    if target is None:
        return None
    copy = not ev.attribute(node, "allowzero", 0)  # 0 copies the input's dim
    out = list(target)
    for i, d in enumerate(target):
        if not copy or d is None:
            continue
        known = first is not None and i < len(first) and first[i] is not None
        if d == Dim.of(0):
            out[i] = first[i] if known else None
        elif d.static is None and not ev.never_zero(d):
            # d may be 0 at run time, which would copy the input's dim
            # instead: claim d only where that dim is then 0 as well.
            if not known or not set(d[1]) <= set(first[i][1]):
                out[i] = None
    if Dim.of(-1) in out:
        known = [d for d in out if d != Dim.of(-1)]
        if first is None or None in first or None in known or out.count(Dim.of(-1)) != 1:
            return None
        total = Dim.of(1)
        for d in first:
            total = total * d
        divisor = Dim.of(1)
        for d in known:
            divisor = divisor * d
        out[out.index(Dim.of(-1))] = total.divided_by(divisor)
    return tuple(out)


def _transpose(ev, node):
    first = ev.first(node)
    if first is None:
        return None
    perm = ev.attribute(node, "perm") or list(reversed(range(len(first))))
    return tuple(first[axis] for axis in perm)


def _matmul(ev, node):
    names = ("transA", "transB", "transBatchA", "transBatchB")  # FusedMatMul's
    if any(ev.attribute(node, name, 0) for name in names):
        return None
    a, b = ev.first(node), ev.shape.get(node.input[1])
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return None
    batch = broadcast([a[:-2], b[:-2]])
    return None if batch is None else (*batch, a[-2], b[-1])


def _gemm(ev, node):
    a, b = ev.first(node), ev.shape.get(node.input[1])
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return None
    rows = a[1] if ev.attribute(node, "transA", 0) else a[0]
    columns = b[0] if ev.attribute(node, "transB", 0) else b[1]
    return (rows, columns)


def _expand(ev, node):
    target = ev.vector(node.input[1])
    return None if target is None else broadcast([ev.first(node), tuple(target)])


def _constant_of_shape(ev, node):
    target = ev.vector(node.input[0])
    return None if target is None else tuple(target)


def _tile(ev, node):
    first, repeats = ev.first(node), ev.vector(node.input[1])
    if first is None or repeats is None:
        return None
    return tuple(
        None if d is None or r is None else d * r for d, r in zip(first, repeats, strict=True)
    )


def _range(ev, node):
    start, limit, delta = (ev.vector(name) for name in node.input)
    if start == [Dim.of(0)] and delta == [ONE] and limit is not None and limit[0]:
        (limit,) = limit
        if limit.static is not None:
            return (Dim.of(max(0, limit.static)),)
        if limit[0] > 0:  # sizes are never negative
            return (limit,)
    if all(ev.shape.get(name) == () for name in node.input):
        return (None,)  # 1-D, of a length not proven
    return None


def _reduce(ev, node):
    first = ev.first(node)
    out = _reduced(ev, node, first)
    values = ev.vector(node.input[0])
    if node.op_type == "ReduceProd" and values is not None and out == (ONE,):
        ev.value[node.output[0]] = [math.prod(values, start=ONE)]
    return out


def _reduced(ev, node, first):
    if first is None:
        return None
    given, axes = ev.optional(node, 1, "axes")
    keep = ev.attribute(node, "keepdims", 1)
    if given and axes is None:
        return None
    if not axes:  # every axis, unless told to do nothing
        if ev.attribute(node, "noop_with_empty_axes", 0):
            return first
        axes = range(len(first))
    axes = {a % len(first) for a in axes}
    if keep:
        return tuple(ONE if axis in axes else d for axis, d in enumerate(first))
    return tuple(d for axis, d in enumerate(first) if axis not in axes)


def _split(ev, node):
    first = ev.first(node)
    if first is None:
        return None
    axis = ev.attribute(node, "axis", 0) % len(first)
    given, sizes = ev.optional(node, 1, "split")
    if given and sizes is None:
        return None
    if sizes is None and first[axis] is not None and first[axis].static is not None:
        parts = len(node.output)
        if first[axis].static % parts == 0:
            sizes = [first[axis].static // parts] * parts
    if sizes is None:
        return None
    for name, size in zip(node.output, sizes, strict=True):
        ev.shape[name] = first[:axis] + (Dim.of(size),) + first[axis + 1 :]
    return None  # every output's dims are recorded above


def _multi_head_attention(ev, node):
    first, value = ev.first(node), ev.shape.get(node.input[2])
    if first is not None and value is not None and len(first) == len(value) == 3:
        return (first[0], first[1], value[2])
    return None


OPS = {
    **dict.fromkeys(_SAME_AS_FIRST, _same_as_first),
    **dict.fromkeys(_BROADCASTING, _broadcasting),
    **dict.fromkeys(_REDUCTIONS, _reduce),
    **{op: _float_unary(function) for op, function in _FLOAT_UNARY.items()},
    **{op: _arithmetic(function) for op, function in _FLOAT_BINARY.items()},
    "Identity": _identity,
    "Cast": _cast,
    "Constant": _constant,
    "Shape": _shape,
    "Gather": _gather,
    "Squeeze": _squeeze,
    "Unsqueeze": _squeeze,
    "Concat": _concat,
    "Slice": _slice,
    "Reshape": _reshape,
    "Transpose": _transpose,
    "MatMul": _matmul,
    "FusedMatMul": _matmul,
    "Gemm": _gemm,
    "Expand": _expand,
    "ConstantOfShape": _constant_of_shape,
    "Tile": _tile,
    "Range": _range,
    "Split": _split,
    "MultiHeadAttention": _multi_head_attention,
}
