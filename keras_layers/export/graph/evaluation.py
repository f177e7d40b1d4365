"""The one static evaluation of a graph: dims of every tensor and, where
constants and dims compute them, values.

Every dim of a graph input is the symbol its `dim_param` names (the pipeline
names the axes by what they are: every input's first axis is `batch`, and
inputs share `sequence` unless they are a decoder's; the validation grid
feeds them so), an unnamed one a symbol of its own; each op's output dims
follow from its inputs' dims and, for the small integer tensors that shapes
travel in, their values (`dims.Dim`: an integer times a product of symbols).
Values are also computed from constants, float arithmetic in float32 as ONNX
Runtime computes it: Keras computes some scales at run time from a shape
(ESM's attention scales by `1 / sqrt(float(shape(k)[-1]))`).

What each op does is one entry of the table `ops.OPS`. Ops it does not know,
ops outside the ONNX domain other than the few of ONNX Runtime's it reads
(`ops.CONTRIB`), optional inputs whose values it cannot read, and broadcasts
between two different symbols give unknown dims: the evaluation only ever
under-claims. Axes the caller names `positive` are taken to be at least 1
(ONNX's Reshape copies the input's dim where the target holds 0, so a target
size that could be 0 proves less); the others may be 0. Given a run that does
not fail, two tensors given the same fully known dims have the same shape at
run time.
"""

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from keras_layers.export.graph.dims import Dim
from keras_layers.export.graph.ops import (
    CONTRIB,
    MAX_ARRAY_ELEMENTS,
    MAX_DIM_VALUES,
    OPS,
    UNREADABLE,
)


class Evaluation:
    """Dims of every tensor, and values where they are known, in graph order.

    `shape`: {name: tuple of `Dim` (None for a dim not proven)}; a tensor
    missing has no known rank. `value`: {name: list of `Dim`, or NumPy
    array} (see `ops`). `shapes`, ONNX shape inference's answer
    (`shapes.tensor_shapes`), adds the static dims it knows where a `Shape`
    reads a tensor whose dims this evaluation does not prove.
    """

    def __init__(self, graph, positive=frozenset(), shapes: dict | None = None):
        self.shape: dict = {}
        self.value: dict = {}
        self.positive = set(positive)
        self.declared = {} if shapes is None else shapes
        self._unread = {}  # small initializers, read on first use
        fed = {value.name for value in graph.input}
        for init in graph.initializer:
            if init.name in fed:  # a default the caller may override
                continue
            self.shape[init.name] = tuple(Dim.of(d) for d in init.dims)
            external = init.data_location == onnx.TensorProto.EXTERNAL
            if math.prod(init.dims) <= MAX_ARRAY_ELEMENTS and not external:
                self._unread[init.name] = init
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
            self._evaluate(node)

    def _evaluate(self, node) -> None:
        op = node.op_type
        if node.domain not in ("", "ai.onnx") and not (
            node.domain == "com.microsoft" and op in CONTRIB
        ):
            return
        rule = OPS.get(op)
        if rule is None or not node.output or not node.output[0]:
            return
        try:
            out = rule(self, node)
        except UNREADABLE:
            return  # an input it cannot read: the outputs stay unknown
        if out is not None:
            self.shape[node.output[0]] = out

    # -- what the rules read -------------------------------------------------------

    def has(self, name: str) -> bool:
        """Whether `name`'s value is known (without reading a constant)."""
        return name in self.value or name in self._unread

    def get(self, name: str):
        """`name`'s value: a list of `Dim`, a NumPy array, or None."""
        found = self.value.get(name)
        if found is None and name in self._unread:
            array = numpy_helper.to_array(self._unread.pop(name))
            if array.dtype != object:  # (strings are no value of ours)
                found = self.value[name] = array
        return found

    def hold(self, name: str, array) -> None:
        """Record a computed array as `name`'s value, if small enough to keep.

        Args:
            name: the tensor.
            array: its values (a NumPy array).
        """
        if array.dtype != object and array.size <= MAX_ARRAY_ELEMENTS:
            self.value[name] = array

    def first(self, node):
        """The dims of `node`'s first input, or None."""
        return self.shape.get(node.input[0]) if node.input and node.input[0] else None

    def vector(self, name: str):
        """The dims a scalar or 1-D tensor holds, or None (values of higher
        ranks are never read: their broadcasts and gathers differ). Integers,
        booleans (as 0 and 1: a select's constant condition) and floats
        holding whole numbers (TensorFlow computes some positions in float)."""
        found = self.get(name)
        if isinstance(found, list):
            shape = self.shape.get(name)
            return None if shape is None or len(shape) > 1 else found
        if found is None or found.ndim > 1 or found.size > MAX_DIM_VALUES:
            return None
        if found.dtype.kind in "iub" or (
            found.dtype.kind == "f"
            and np.isfinite(found).all()
            and (found == np.round(found)).all()
        ):
            return [Dim.of(int(v)) for v in found.ravel()]
        return None

    def ints(self, name: str):
        """The static ints a small scalar or 1-D tensor holds, or None."""
        values = self.vector(name)
        if values is None or any(v is None or v.static is None for v in values):
            return None
        return [v.static for v in values]

    def array(self, name: str):
        """`name`'s value as a NumPy array where every entry is known, else None."""
        found = self.get(name)
        if not isinstance(found, list):
            return found
        if any(d is None or d.static is None for d in found):
            return None
        return self._shaped(name, np.array([d.static for d in found], np.int64))

    def floats(self, names) -> list | None:
        """The values of `names` when all are float arrays of one type, else None."""
        if not all(self.has(name) for name in names):
            return None
        found = [self.get(name) for name in names]
        if all(
            isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.dtype == found[0].dtype
            for a in found
        ):
            return found
        return None

    def dims_of(self, name: str):
        """The dims a `Shape` of `name` reads: this evaluation's, with the
        static dims shape inference declares where it proves none."""
        own = self.shape.get(name)
        declared = self.declared.get(name, (None,))[0]
        if declared is None:
            return own
        known = tuple(Dim.of(d) if isinstance(d, int) else None for d in declared)
        if own is None:
            return known
        if len(own) != len(known):
            return own
        pairs = zip(own, known, strict=True)
        return tuple(mine if mine is not None else theirs for mine, theirs in pairs)

    def attribute(self, node, name: str, default=None):
        """`node`'s attribute `name`, or `default`.

        Args:
            node: a NodeProto.
            name: the attribute's name.
            default: what a node without it gives.

        Returns:
            The attribute's value as `onnx.helper.get_attribute_value` gives it.
        """
        found = [helper.get_attribute_value(a) for a in node.attribute if a.name == name]
        return found[0] if found else default

    def optional(self, node, position: int, attribute: str | None = None):
        """Whether an optional input (or attribute) is given, and its ints.

        Args:
            node: a NodeProto.
            position: the input's position.
            attribute: the attribute that stands for it when the input is
                absent (older opsets), if any.

        Returns:
            (given, ints): its static ints are None where they cannot be
            read: the caller must then claim nothing.
        """
        if len(node.input) > position and node.input[position]:
            return True, self.ints(node.input[position])
        found = self.attribute(node, attribute) if attribute else None
        return found is not None, None if found is None else list(found)

    def never_zero(self, dim) -> bool:
        """Whether `dim` cannot be 0: static and nonzero, or a product of
        axes the caller says are at least 1."""
        if dim.static is not None:
            return dim.static != 0
        return set(dim[1]) <= self.positive

    def _shaped(self, name: str, values):
        """A scalar's values as a 0-d array (lists hold a scalar as one entry)."""
        return values.reshape(()) if self.shape.get(name) == () and values.size == 1 else values

    # -- answers ---------------------------------------------------------------------

    def static_value(self, name: str):
        """`name`'s value as a NumPy array, None where unknown: a float array
        where constants compute it, an object array of ints and Nones where it
        holds dims (a shape's entries, None at a dim not static)."""
        found = self.get(name)
        if not isinstance(found, list):
            return found
        values = np.array([None if d is None else d.static for d in found], object)
        return self._shaped(name, values)


def symbolic_dims(graph, positive=frozenset()) -> dict:
    """{tensor name: tuple of `Dim` (None for a dim not proven)}; a tensor
    missing has no known rank.

    Args:
        graph: the GraphProto (its subgraphs are not read).
        positive: the input axis names that are at least 1 in every run (the
            others may be 0, as a decoder's past is on its first call).

    Returns:
        The dims of every tensor whose rank is known.
    """
    return Evaluation(graph, positive).shape


def static_value(g, name: str):
    """The values of `name` where constants and static dims alone compute
    them, as a NumPy array; None otherwise.

    Args:
        g: a `view.Graph`; its `shapes` give the static dims a `Shape` reads
            where the evaluation proves none.
        name: the tensor.

    Returns:
        An initializer's values as they are (None for one in a data file);
        else the evaluation's (`Evaluation.static_value`): float arithmetic
        gives the value the graph would compute, in its own type.
    """
    value = g.const(name)
    if value is not None:
        return value
    return g.evaluation().static_value(name)
