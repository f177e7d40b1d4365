"""Fold "stack, then pick one" out of the graph: `x[i]` of `stack([x0, x1, ...])` is `xi`.

Two exact rewrites (`fold_stack_picks`, then `fold_shapes_of_stacks` for
the stacks left read only for their shape).

TensorFlow's `tf.stack` reaches ONNX as `Concat` of `Unsqueeze`d inputs, and
`t[:, i, ...]` as `Slice` + `Squeeze`. A decoder's cache is stacked per layer
and per key/value, then picked apart by the next layer (keras-hub's
`call_with_cache` takes one stacked cache, `keras_layers.export.causal_lm`
builds it from the per-layer inputs): ONNX Runtime copies the whole cache for
every stack and every pick, which cost a decoder more time per token than all
its matrix products (ONNX Runtime's profiler put most of a step in `Concat`,
`Slice`, `Where`, `Transpose` and `Pad`; benchmarks/results/generate.json
times the files as exported, docs/generation.md).

The rule is exact, and only constants decide it: `Squeeze(Slice(X, starts,
ends, axes), axes')` that takes one index on each squeezed axis (the other
sliced axes whole) is replaced by the stacked input it picks, looked up through
`Concat`-of-`Unsqueeze` stacks and through `Transpose`s (a new, smaller
`Transpose` of the picked input takes the old one's place). Anything else,
and the graph is left as it was.
"""

import numpy as np
from onnx import helper, numpy_helper

from keras_layers.export.graph import remove_dead_nodes, rename_reads
from keras_layers.export.passes.context import Context, PassResult

# tf2onnx writes "to the end" as the largest int32 (or int64).
_WHOLE = np.iinfo(np.int32).max


def _constants(graph) -> dict:
    return {
        init.name: numpy_helper.to_array(init)
        for init in graph.initializer
        if init.data_location == 0 and np.prod(init.dims) <= 16
    }


def _picks(node, squeeze, constants) -> dict | None:
    """{axis: index} that `Squeeze(Slice(...))` picks, or None if it does not
    pick single indices (or slices anything else)."""
    arrays = [constants.get(name) for name in node.input[1:]]
    if len(arrays) < 3 or any(a is None for a in arrays) or len(squeeze.input) < 2:
        return None
    starts, ends, axes = (a.astype(np.int64).tolist() for a in arrays[:3])
    steps = arrays[3].tolist() if len(arrays) > 3 else [1] * len(starts)
    squeezed = constants.get(squeeze.input[1])
    if squeezed is None or min(axes + squeezed.tolist(), default=0) < 0:
        return None
    picks = {}
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        if step != 1:
            return None
        if start == 0 and end >= _WHOLE:
            continue  # the whole axis
        if start < 0 or end != start + 1:
            return None
        picks[axis] = start
    return picks if picks and sorted(picks) == sorted(squeezed.tolist()) else None


def _unsqueezed_axis(node, constants) -> int | None:
    axes = constants.get(node.input[1]) if len(node.input) > 1 else None
    return int(axes[0]) if axes is not None and axes.size == 1 and axes[0] >= 0 else None


class _Folder:
    def __init__(self, graph):
        self.graph = graph
        self.constants = _constants(graph)
        self.producers = {out: node for node in graph.node for out in node.output}
        self.new_nodes = []

    def pick(self, name: str, picks: dict) -> str | None:
        """The tensor `name` with index `i` taken (and the axis dropped) at
        each `{axis: i}`, found without copying, or None."""
        if not picks:
            return name
        node = self.producers.get(name)
        if node is None:
            return None
        if node.op_type == "Concat":
            axis = next(a.i for a in node.attribute if a.name == "axis")
            if axis not in picks or axis < 0:
                return None
            parts = [self.producers.get(part) for part in node.input]
            if not all(p is not None and p.op_type == "Unsqueeze" for p in parts):
                return None
            if any(_unsqueezed_axis(p, self.constants) != axis for p in parts):
                return None
            if picks[axis] >= len(parts):
                return None
            rest = {(a - 1 if a > axis else a): i for a, i in picks.items() if a != axis}
            return self.pick(parts[picks[axis]].input[0], rest)
        if node.op_type == "Transpose":
            perm = list(next(a.ints for a in node.attribute if a.name == "perm"))
            inner = self.pick(node.input[0], {perm[a]: i for a, i in picks.items()})
            if inner is None:
                return None
            kept = [p for a, p in enumerate(perm) if a not in picks]
            order = sorted(kept)
            new_perm = [order.index(p) for p in kept]
            if new_perm == list(range(len(new_perm))):
                return inner
            return self._transpose(inner, new_perm, node.name)
        return None

    def _transpose(self, source: str, perm: list, like: str) -> str:
        output = f"{like}_picked_{len(self.new_nodes)}"
        self.new_nodes.append(
            helper.make_node("Transpose", [source], [output], name=output, perm=perm)
        )
        return output


def fold_stack_picks(proto) -> int:
    """Replace each single-index pick of a stacked tensor by the tensor it
    picks (see the module docstring), until none is left: a pick of a pick
    (a layer's cache, then its keys) folds on the next pass. Returns how many
    picks were folded; the stacks nothing reads any more are left for
    `remove_dead_nodes`."""
    return _until_unchanged(proto, _fold_once)


def _until_unchanged(proto, once, between=None) -> int:
    """Run `once(graph)` until it changes nothing (`between(proto)` after
    each pass that did); returns the sum of what each pass changed."""
    total = 0
    while changed := once(proto.graph):
        total += changed
        if between is not None:
            between(proto)
    return total


def _fold_once(graph) -> int:
    folder = _Folder(graph)
    readers = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {value.name for value in graph.output}
    renames = {}
    for node in graph.node:
        if node.op_type != "Slice":
            continue
        after = readers.get(node.output[0], [])
        if len(after) != 1 or after[0].op_type != "Squeeze":
            continue
        squeeze = after[0]
        if not readers.get(squeeze.output[0]):  # folded on an earlier pass
            continue
        picks = _picks(node, squeeze, folder.constants)
        if picks is None or squeeze.output[0] in outputs:
            continue
        found = folder.pick(node.input[0], picks)
        if found is not None and found != squeeze.output[0]:
            renames[squeeze.output[0]] = found
    if not renames:
        return 0
    rename_reads(graph, renames)
    # The Squeezes stay (nothing reads them now), so a name is never renamed
    # twice; each new Transpose goes right before the first node reading it.
    placed = {node.output[0]: node for node in folder.new_nodes}
    nodes = []
    for node in graph.node:
        for name in node.input:
            if name in placed:
                nodes.append(placed.pop(name))
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return len(renames)


def fold_shapes_of_stacks(proto) -> int:
    """Compute `Shape(concat or stack)` from its inputs' shapes when shapes are
    all that is read of it, so the concatenation itself is never made.

    keras-hub sizes a decoder's attention mask from its cache's shape, and the
    cache `causal_lm.trace` hands it (the past plus room for the new tokens) is
    otherwise read by nothing once `fold_stack_picks` has run: without this,
    ONNX Runtime copies every layer's cache each step only to learn its length.
    Exact: `Concat` needs equal sizes off its axis, so the result is the first
    input's shape with the concatenated axis summed; `Unsqueeze` inserts a 1.
    Returns how many `Shape` nodes were rewritten (until none is left).
    """
    return _until_unchanged(proto, _shapes_once, between=remove_dead_nodes)


class _ShapeArithmetic:
    """Builds small int64 nodes computing a shape from other tensors' shapes."""

    def __init__(self, graph, taken: set, stem: str):
        self.graph, self.taken, self.stem, self.nodes = graph, taken, stem, []

    def fresh(self, suffix: str) -> str:
        name = f"{self.stem}_{suffix}"
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        return name

    def const(self, values) -> str:
        name = self.fresh("const")
        array = np.array(values, np.int64)
        self.graph.initializer.append(numpy_helper.from_array(array, name))
        return name

    def dims(self, tensor: str, start: int, end: int) -> str:
        """`Shape(tensor)[start:end]`."""
        shape, out = self.fresh("shape"), self.fresh("dims")
        self.nodes.append(helper.make_node("Shape", [tensor], [shape]))
        slice_inputs = [shape, self.const([start]), self.const([end])]
        self.nodes.append(helper.make_node("Slice", slice_inputs, [out]))
        return out

    def node(self, op: str, inputs: list, **attributes) -> str:
        out = self.fresh(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attributes))
        return out


def _shape_of(source, constants, arithmetic: _ShapeArithmetic) -> str | None:
    """The nodes computing `Shape(source's output)` from its inputs' shapes
    (their last output is the result), or None if `source` is not a stack."""
    if source.op_type == "Unsqueeze":
        axis = _unsqueezed_axis(source, constants)
        parts = [source.input[0]]
    else:
        axis = next(a.i for a in source.attribute if a.name == "axis")
        parts = list(source.input)
    if axis is None or axis < 0:
        return None
    whole = np.iinfo(np.int64).max
    before = arithmetic.dims(parts[0], 0, axis)
    if source.op_type == "Unsqueeze":
        middle, after = arithmetic.const([1]), arithmetic.dims(parts[0], axis, whole)
    else:
        middle = arithmetic.dims(parts[0], axis, axis + 1)
        for part in parts[1:]:  # (ONNX Runtime's Sum takes no int64)
            middle = arithmetic.node("Add", [middle, arithmetic.dims(part, axis, axis + 1)])
        after = arithmetic.dims(parts[0], axis + 1, whole)
    return arithmetic.node("Concat", [before, middle, after], axis=0)


def _shapes_once(graph) -> int:
    constants = _constants(graph)
    producers = {out: node for node in graph.node for out in node.output}
    readers = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {value.name for value in graph.output}
    taken = {*producers, *(init.name for init in graph.initializer)}
    taken |= {value.name for value in graph.input}
    added: dict[int, list] = {}
    for position, node in enumerate(graph.node):
        if node.op_type != "Shape" or node.attribute:
            continue
        source = producers.get(node.input[0])
        if source is None or source.op_type not in ("Concat", "Unsqueeze"):
            continue
        if source.output[0] in outputs:
            continue
        if any(reader.op_type != "Shape" for reader in readers[source.output[0]]):
            continue
        arithmetic = _ShapeArithmetic(graph, taken, node.output[0])
        result = _shape_of(source, constants, arithmetic)
        if result is None:
            continue
        last = arithmetic.nodes.pop()  # the Concat: it takes the Shape's place
        del last.output[:]
        last.output.extend(node.output)
        added[position] = arithmetic.nodes
        node.CopyFrom(last)
    nodes = []
    for position, node in enumerate(graph.node):
        nodes.extend(added.get(position, []))
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    return len(added)


def run(proto, context: Context) -> PassResult:
    """Fold the picks of stacked tensors, then the shapes of the stacks left.

    Args:
        proto: the ModelProto, rewritten in place.
        context: not read (only constants decide the rewrite).

    Returns:
        The picks folded (the report's `stack_picks_folded`).
    """
    del context
    picks = fold_stack_picks(proto)
    if picks:
        remove_dead_nodes(proto)
        fold_shapes_of_stacks(proto)
    return PassResult(proto, changed=picks, report={"stack_picks_folded": picks})
