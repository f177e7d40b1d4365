"""Symbolic dims: an integer times a product of input-axis names.

A dim of a graph input is the symbol its `dim_param` names (`batch`,
`sequence`); what ops compute from dims stays exact while it is a whole
multiple of symbols: the Tensordot `Reshape(x, [-1, K])` of a
(batch, sequence, K) tensor is (batch*sequence, K), and reshaping it back
gives the symbols back.
"""

from collections import Counter


class Dim(tuple):
    """coefficient * product of symbols: (int, sorted tuple of symbol names)."""

    __slots__ = ()

    @classmethod
    def of(cls, value):
        """`value` as a Dim: a Dim as it is, an int as a constant."""
        if isinstance(value, Dim):
            return value
        return cls((int(value), ()))

    @classmethod
    def symbol(cls, name: str):
        """The dim named `name` (an input axis)."""
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


def broadcast(shapes):
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
