"""Which tensors of a graph provably have the same shape, and sharing their `Shape`s.

keras-hub's decoder layers each build their attention mask and rotary tables
from `ops.shape` of their own input, so a 4-layer Llama traces four copies of
the same (batch, sequence, sequence) mask computation, each reading `Shape` of
a different hidden state. The copies compute the same values, but no pass can
merge them while they read different tensors: ONNX shape inference gives each
layer's hidden state fresh symbolic dims (it loses them at the Tensordot
reshapes), and ONNX Runtime's symbolic inference stops at keras-hub's
`min(1e9, sequence)` unless told to merge dims it cannot prove equal.

`share_equal_shapes` proves it instead, with a small symbolic evaluation:
every dim of a graph input is the symbol its `dim_param` names (the pipeline
names the axes by what they are: every input's first axis is `batch`, and
inputs share `sequence` unless they are a decoder's; the validation grid feeds
them so), an unnamed one a symbol of its own; each op's output dims follow
from its inputs' dims and, for the small integer tensors that shapes travel
in, their values. A dim is an integer times a product of symbols, so the
Tensordot `Reshape(x, [-1, K])` of a (batch, sequence, K) tensor is
(batch*sequence, K) and reshaping it back gives the symbols back. Ops it does
not know, ops outside the ONNX domain other than the few of ONNX Runtime's it
reads, optional inputs whose values it cannot read, and broadcasts between two
different symbols give unknown dims: the analysis only ever under-claims.
Axes the caller names `positive` are taken to be at least 1 (ONNX's Reshape
copies the input's dim where the target holds 0, so a target size that could
be 0 proves less); the others may be 0. Given a run that does not fail, two
tensors given the same fully known dims have the same shape at run time, so
their `Shape` nodes are one value: each later one is replaced by the first,
and the copies downstream become identical and are merged by
`slimming.merge_common_subexpressions`.
"""

import math
from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper

# A Slice end from here up means "to the end": Keras slices with 1e9 for it
# (keras-hub's masks), and no axis of a tensor that fits in memory is that long.
_TO_THE_END = 10**9
# Integer tensors up to this many elements have their values tracked.
_MAX_VALUE_ELEMENTS = 16


class Dim(tuple):
    """coefficient * product of symbols: (int, sorted tuple of symbol names)."""

    __slots__ = ()

    @classmethod
    def of(cls, value):
        if isinstance(value, Dim):
            return value
        return cls((int(value), ()))

    @classmethod
    def symbol(cls, name: str):
        return cls((1, (name,)))

    @property
    def static(self):
        """The int, when the dim has no symbol; else None."""
        return self[0] if not self[1] else None

    def __mul__(self, other):
        if self[0] * other[0] == 0:
            return Dim.of(0)
        return Dim((self[0] * other[0], tuple(sorted(self[1] + other[1]))))

    def divided_by(self, other):
        """self / other when it is a whole Dim, else None."""
        if other[0] == 0 or self[0] % other[0]:
            return None
        left = Counter(self[1])
        left.subtract(other[1])
        if any(count < 0 for count in left.values()):
            return None
        return Dim((self[0] // other[0], tuple(sorted(left.elements()))))


ONE = Dim.of(1)


def _broadcast(shapes):
    """Multidirectional broadcast of dim tuples; an axis is None where not provable."""
    if any(shape is None for shape in shapes):
        return None
    rank = max(len(shape) for shape in shapes)
    out = []
    for axis in range(rank):
        dims = {
            shape[axis - rank + len(shape)] for shape in shapes if axis - rank + len(shape) >= 0
        }
        dims.discard(ONE)
        if None in dims:
            out.append(None)
        elif not dims:
            out.append(ONE)
        elif len(dims) == 1:
            out.append(dims.pop())
        else:
            statics = {dim for dim in dims if dim.static is not None}
            # A symbol broadcast against a static size is that size (or the
            # run fails); two different symbols could be anything.
            out.append(statics.pop() if len(statics) == 1 else None)
    return tuple(out)


_SAME_AS_FIRST = {
    "Abs", "Cast", "Ceil", "Cos", "Elu", "Erf", "Exp", "FastGelu", "Floor", "Gelu", "BiasGelu",
    "HardSigmoid", "Identity", "IsInf", "IsNaN", "LayerNormalization", "LeakyRelu", "Log",
    "LogSoftmax", "Neg", "Not", "QuickGelu", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid",
    "RotaryEmbedding", "Sign", "SimplifiedLayerNormalization", "Sin", "Softmax", "Softplus",
    "Softsign", "Sqrt", "Tanh", "Trilu", "CumSum", "Dropout",
}  # fmt: skip
# ONNX Runtime's own ops this evaluation reads (the fusions write them); any
# other op outside the ONNX domain is unknown, whatever its name.
_CONTRIB = {
    "BiasGelu", "FastGelu", "Gelu", "QuickGelu", "MultiHeadAttention", "FusedMatMul",
    "RotaryEmbedding",
}  # fmt: skip
_BROADCASTING = {
    "Add", "And", "BitShift", "Div", "Equal", "Greater", "GreaterOrEqual", "Less",
    "LessOrEqual", "Max", "Min", "Mod", "Mul", "Or", "Pow", "PRelu", "Sub", "Sum", "Where", "Xor",
}  # fmt: skip


class _Evaluation:
    """Dims of every tensor, and values of small integer ones, in graph order."""

    def __init__(self, graph, positive=frozenset()):
        self.shape, self.value = {}, {}
        self.positive = set(positive)
        fed = {value.name for value in graph.input}
        for init in graph.initializer:
            if init.name in fed:  # a default the caller may override
                continue
            self.shape[init.name] = tuple(Dim.of(d) for d in init.dims)
            external = init.data_location == onnx.TensorProto.EXTERNAL
            if math.prod(init.dims) <= _MAX_VALUE_ELEMENTS and not external:
                self._hold(init.name, numpy_helper.to_array(init))
        for value in graph.input:
            tensor = value.type.tensor_type
            if not value.type.HasField("tensor_type") or not tensor.HasField("shape"):
                continue  # no shape declared: unknown, not a scalar
            # An unnamed axis gets a name no dim_param can have (":" is not
            # allowed in one made by this package, and the input's name is unique).
            self.shape[value.name] = tuple(
                Dim.of(d.dim_value)
                if d.HasField("dim_value")
                else Dim.symbol(d.dim_param or f"\0{value.name}:{axis}")
                for axis, d in enumerate(tensor.shape.dim)
            )
        for node in graph.node:
            try:
                self._evaluate(node)
            except (AttributeError, IndexError, KeyError, TypeError, ValueError, ZeroDivisionError):
                pass  # an input it cannot read: the outputs stay unknown

    # -- helpers ----------------------------------------------------------------

    def never_zero(self, dim):
        """Whether `dim` cannot be 0: static and nonzero, or a product of
        axes the caller says are at least 1."""
        if dim.static is not None:
            return dim.static != 0
        return set(dim[1]) <= self.positive

    def _hold(self, name, array):
        """Track a small constant's values: integers, booleans (as 0 and 1: a
        select's constant condition), or floats holding whole numbers
        (TensorFlow computes some positions in float, e.g. a float Range)."""
        if array.dtype.kind in "iub" or (
            array.dtype.kind == "f"
            and np.isfinite(array).all()
            and (array == np.round(array)).all()
        ):
            self.value[name] = [Dim.of(int(v)) for v in array.ravel()]

    def vector(self, name):
        """The dims a scalar or 1-D tensor holds, or None (values of higher
        ranks are never read: their broadcasts and gathers differ)."""
        shape = self.shape.get(name)
        if shape is None or len(shape) > 1:
            return None
        return self.value.get(name)

    def ints(self, name):
        """The static ints a small scalar or 1-D tensor holds, or None."""
        values = self.vector(name)
        if values is None or any(v is None or v.static is None for v in values):
            return None
        return [v.static for v in values]

    def _attribute(self, node, name, default=None):
        found = [helper.get_attribute_value(a) for a in node.attribute if a.name == name]
        return found[0] if found else default

    def _optional(self, node, position, attribute=None):
        """(given, ints): whether input `position` (or, when that input is
        absent, `attribute`) is given, and its static ints (None if they
        cannot be read: the caller must then claim nothing)."""
        if len(node.input) > position and node.input[position]:
            return True, self.ints(node.input[position])
        found = self._attribute(node, attribute) if attribute else None
        return found is not None, None if found is None else list(found)

    def _cast_keeps(self, node):
        """Whether a Cast keeps every tracked value as it is: to a 32- or
        64-bit integer or a float wide enough for any size (sizes stay far
        below 2**24; a static value is checked)."""
        limits = {
            onnx.TensorProto.INT64: 2**63,
            onnx.TensorProto.INT32: 2**31,
            onnx.TensorProto.FLOAT: 2**24,
            onnx.TensorProto.DOUBLE: 2**53,
        }
        limit = limits.get(self._attribute(node, "to"))
        values = self.value.get(node.input[0]) or []
        # An unknown value stays unknown, whatever the cast does to it.
        return limit is not None and all(
            v is None or v.static is None or abs(v.static) < limit for v in values
        )

    def _constant(self, node):
        """A Constant node's value as an array (any of its attribute forms)."""
        attribute = node.attribute[0]
        if attribute.name in ("value", "sparse_value"):
            if attribute.name == "sparse_value":
                raise ValueError("a sparse constant")
            return numpy_helper.to_array(attribute.t)
        value = helper.get_attribute_value(attribute)
        if isinstance(value, bytes | list) and value and isinstance(value[0], bytes):
            raise ValueError("a string constant")
        return np.array(value)

    def _transposes(self, node):
        names = ("transA", "transB", "transBatchA", "transBatchB")
        return any(self._attribute(node, name, 0) for name in names)

    # -- the ops ---------------------------------------------------------------------

    def _evaluate(self, node):
        op, inputs = node.op_type, node.input
        if node.domain not in ("", "ai.onnx") and not (
            node.domain == "com.microsoft" and op in _CONTRIB
        ):
            return
        if not node.output or not node.output[0]:
            return
        first = self.shape.get(inputs[0]) if inputs and inputs[0] else None
        out = None
        if op in _SAME_AS_FIRST:
            out = first
            if op == "Identity" or (op == "Cast" and self._cast_keeps(node)):
                if inputs[0] in self.value:
                    self.value[node.output[0]] = self.value[inputs[0]]
        elif op in _BROADCASTING:
            out = _broadcast([self.shape.get(name) for name in inputs])
            self._elementwise_value(node)
        elif op == "Constant":
            array = self._constant(node)
            out = tuple(Dim.of(d) for d in array.shape)
            if array.size <= _MAX_VALUE_ELEMENTS:
                self._hold(node.output[0], array)
        elif op == "Shape" and first is not None:
            start, end = self._attribute(node, "start", 0), self._attribute(node, "end")
            dims = list(first[start:end])
            self.value[node.output[0]] = dims
            out = (Dim.of(len(dims)),)
        elif op == "Gather":
            out = self._gather(node, first)
        elif op in ("Unsqueeze", "Squeeze"):
            out = self._squeeze(node, first, *self._optional(node, 1, "axes"))
        elif op == "Concat":
            out = self._concat(node)
        elif op == "Slice":
            out = self._slice(node, first)
        elif op == "Reshape":
            out = self._reshape(node, first, self.vector(inputs[1]))
        elif op == "Transpose" and first is not None:
            perm = self._attribute(node, "perm") or list(reversed(range(len(first))))
            out = tuple(first[axis] for axis in perm)
        elif op == "MatMul" or (op == "FusedMatMul" and not self._transposes(node)):
            out = self._matmul(first, self.shape.get(inputs[1]))
        elif op == "Gemm":
            out = self._gemm(node, first, self.shape.get(inputs[1]))
        elif op == "Expand":
            target = self.vector(inputs[1])
            out = None if target is None else _broadcast([first, tuple(target)])
        elif op == "ConstantOfShape":
            target = self.vector(inputs[0])
            out = None if target is None else tuple(target)
        elif op == "Tile":
            repeats = self.vector(inputs[1])
            if first is not None and repeats is not None:
                out = tuple(
                    None if d is None or r is None else d * r
                    for d, r in zip(first, repeats, strict=True)
                )
        elif op == "Range":
            start, limit, delta = (self.vector(name) for name in inputs)
            if start == [Dim.of(0)] and delta == [ONE] and limit is not None and limit[0]:
                (limit,) = limit
                if limit.static is not None:
                    out = (Dim.of(max(0, limit.static)),)
                elif limit[0] > 0:  # sizes are never negative
                    out = (limit,)
            if out is None and all(self.shape.get(name) == () for name in inputs):
                out = (None,)  # 1-D, of a length not proven
        elif op.startswith("Reduce"):
            out = self._reduce(node, first)
            values = self.vector(inputs[0])
            if op == "ReduceProd" and values is not None and out == (ONE,):
                self.value[node.output[0]] = [math.prod(values, start=ONE)]
        elif op == "Split":
            self._split(node, first)
        elif op == "MultiHeadAttention":
            value = self.shape.get(inputs[2])
            if first is not None and value is not None and len(first) == len(value) == 3:
                out = (first[0], first[1], value[2])
        if out is not None:
            self.shape[node.output[0]] = out

    def _elementwise_value(self, node):
        values = [self.vector(name) for name in node.input]
        ops = ("Mul", "Add", "Sub", "Div", "Max", "Min", "Where", "And", "Or", "Equal")
        if node.op_type not in ops or any(v is None for v in values):
            return
        length = max(len(v) for v in values)
        if any(len(v) not in (1, length) for v in values):
            return
        values = [v * length if len(v) == 1 else v for v in values]
        if node.op_type == "Where":  # a constant condition picks, value by value
            self.value[node.output[0]] = [
                None if pick is None or pick.static is None else (x if pick.static else y)
                for pick, x, y in zip(*values, strict=True)
            ]
            return
        if len(values) != 2:
            return
        if node.op_type in ("Max", "Min"):
            self.value[node.output[0]] = [
                self._extreme(node.op_type, x, y) for x, y in zip(*values, strict=True)
            ]
            return
        if node.op_type in ("And", "Or", "Equal"):
            self.value[node.output[0]] = [
                self._logical(node.op_type, x, y) for x, y in zip(*values, strict=True)
            ]
            return
        a, b = values
        result = []
        for x, y in zip(a, b, strict=True):
            if x is None or y is None:
                result.append(None)
            elif node.op_type == "Mul":
                result.append(x * y)
            elif node.op_type == "Div":
                result.append(x.divided_by(y) if y.static else None)
            elif x.static is not None and y.static is not None:
                result.append(
                    Dim.of(x.static + y.static if node.op_type == "Add" else x.static - y.static)
                )
            elif y.static == 0 or (node.op_type == "Add" and x.static == 0):
                result.append(x if y.static == 0 else y)  # adding or taking away 0
            else:
                result.append(None)
        self.value[node.output[0]] = result

    @staticmethod
    def _extreme(op, x, y):
        """max(x, y) or min(x, y) where it is provable: both static; or a size
        (a positive multiple of symbols, never negative) against a bound at
        most 0 for Max, or one axis's size against `_TO_THE_END` or more for
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
        if op == "Min" and bound.static >= _TO_THE_END and size[0] == 1 and len(size[1]) == 1:
            return size  # one axis's size, which is never that long
        return None

    @staticmethod
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

    def _gather(self, node, data):
        indices = self.shape.get(node.input[1])
        axis = self._attribute(node, "axis", 0)
        values, picked = self.vector(node.input[0]), self.ints(node.input[1])
        if values is not None and picked is not None:
            self.value[node.output[0]] = [values[i] for i in picked]
        if data is None or indices is None:
            return None
        axis %= len(data)
        return data[:axis] + indices + data[axis + 1 :]

    def _squeeze(self, node, first, given, axes):
        if first is None or (given and axes is None):
            return None
        if node.input[0] in self.value:
            self.value[node.output[0]] = self.value[node.input[0]]
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

    def _concat(self, node):
        shapes = [self.shape.get(name) for name in node.input]
        # A 1-D part whose values are not known (a sequence's total length
        # past + new, which no Dim can write) still holds a known number of them.
        values = [
            self.vector(name) or ([None] * s[0].static if self._static_vector(s) else None)
            for name, s in zip(node.input, shapes, strict=True)
        ]
        if all(v is not None for v in values):
            self.value[node.output[0]] = [v for value in values for v in value]
        if any(s is None for s in shapes) or len({len(s) for s in shapes}) != 1:
            return None
        axis = self._attribute(node, "axis") % len(shapes[0])
        sizes = [s[axis] for s in shapes]
        total = None
        if all(size is not None and size.static is not None for size in sizes):
            total = Dim.of(sum(size.static for size in sizes))
        out = list(_broadcast([s[:axis] + (ONE,) + s[axis + 1 :] for s in shapes]) or ())
        if not out:
            return None
        out[axis] = total
        return tuple(out)

    @staticmethod
    def _static_vector(shape) -> bool:
        """Whether `shape` is 1-D of a static, small length."""
        return (
            shape is not None
            and len(shape) == 1
            and shape[0] is not None
            and shape[0].static is not None
            and shape[0].static <= _MAX_VALUE_ELEMENTS
        )

    def _slice(self, node, first):
        starts, ends = self.ints(node.input[1]), self._slice_ends(node, first)
        has_axes, axes = self._optional(node, 3)
        has_steps, steps = self._optional(node, 4)
        if first is None or starts is None or ends is None:
            return None
        if (has_axes and axes is None) or (has_steps and steps is None):
            return None
        axes = axes if axes is not None else list(range(len(starts)))
        steps = steps if steps is not None else [1] * len(starts)
        if any(step <= 0 for step in steps):
            return None  # ONNX clamps a backward slice's start unlike Python
        values = self.vector(node.input[0])
        if values is not None and len(first) == 1 and steps == [1]:
            start, end = starts[0], ends[0]
            self.value[node.output[0]] = values[slice(start, min(end, len(values)))]
        out = list(first)
        for axis, start, end, step in zip(axes, starts, ends, steps, strict=True):
            axis %= len(first)
            dim = first[axis]
            if start == 0 and end >= _TO_THE_END and step == 1:
                continue
            if dim is not None and dim.static is not None:
                out[axis] = Dim.of(len(range(dim.static)[start:end:step]))
            else:
                out[axis] = None
        return tuple(out)

    def _slice_ends(self, node, first):
        """The Slice's ends as ints, an end that is its axis's own symbolic
        dim (keras' `x[:, :shape(x)[1]]`) read as "to the end"; or None."""
        ends = self.vector(node.input[2])
        if ends is None or first is None:
            return None
        has_axes, axes = self._optional(node, 3)
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
                found.append(_TO_THE_END)
            else:
                return None
        return found

    def _reshape(self, node, first, target):
        if target is None:
            return None
        copy = not self._attribute(node, "allowzero", 0)  # 0 copies the input's dim
        out = list(target)
        for i, d in enumerate(target):
            if not copy or d is None:
                continue
            known = first is not None and i < len(first) and first[i] is not None
            if d == Dim.of(0):
                out[i] = first[i] if known else None
            elif d.static is None and not self.never_zero(d):
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

    def _matmul(self, a, b):
        if a is None or b is None or len(a) < 2 or len(b) < 2:
            return None
        batch = _broadcast([a[:-2], b[:-2]])
        return None if batch is None else (*batch, a[-2], b[-1])

    def _gemm(self, node, a, b):
        if a is None or b is None or len(a) != 2 or len(b) != 2:
            return None
        rows = a[1] if self._attribute(node, "transA", 0) else a[0]
        columns = b[0] if self._attribute(node, "transB", 0) else b[1]
        return (rows, columns)

    def _reduce(self, node, first):
        if first is None:
            return None
        given, axes = self._optional(node, 1, "axes")
        keep = self._attribute(node, "keepdims", 1)
        if given and axes is None:
            return None
        if not axes:  # every axis, unless told to do nothing
            if self._attribute(node, "noop_with_empty_axes", 0):
                return first
            axes = range(len(first))
        axes = {a % len(first) for a in axes}
        if keep:
            return tuple(ONE if axis in axes else d for axis, d in enumerate(first))
        return tuple(d for axis, d in enumerate(first) if axis not in axes)

    def _split(self, node, first):
        if first is None:
            return
        axis = self._attribute(node, "axis", 0) % len(first)
        given, sizes = self._optional(node, 1, "split")
        if given and sizes is None:
            return
        if sizes is None and first[axis] is not None and first[axis].static is not None:
            parts = len(node.output)
            if first[axis].static % parts == 0:
                sizes = [first[axis].static // parts] * parts
        if sizes is None:
            return
        for name, size in zip(node.output, sizes, strict=True):
            self.shape[name] = first[:axis] + (Dim.of(size),) + first[axis + 1 :]


def symbolic_dims(graph, positive=frozenset()) -> dict:
    """{tensor name: tuple of `Dim` (None for a dim not proven) or None (rank unknown)}.

    `positive`: the input axis names that are at least 1 in every run (the
    others may be 0, as a decoder's past is on its first call).
    """
    return _Evaluation(graph, positive).shape


def share_equal_shapes(proto, positive=frozenset()) -> int:
    """Read one `Shape` for every set of tensors proven to share their dims.

    `positive` as for `symbolic_dims`. Returns how many `Shape` nodes now read
    another's output instead (they are left unread, for dead-node removal).
    Subgraphs are left alone.
    """
    evaluation = _Evaluation(proto.graph, positive)
    first, replaced = {}, {}
    for node in proto.graph.node:
        if node.op_type != "Shape":
            continue
        dims = evaluation.shape.get(node.input[0])
        if dims is None or None in dims:
            continue
        key = (dims, tuple(sorted((a.name, a.i) for a in node.attribute)))
        if key in first:
            replaced[node.output[0]] = first[key]
        else:
            first[key] = node.output[0]
    outputs = {value.name for value in proto.graph.output}
    replaced = {old: new for old, new in replaced.items() if old not in outputs}
    for node in proto.graph.node:
        for position, name in enumerate(node.input):
            if name in replaced:
                node.input[position] = replaced[name]
    return len(replaced)
