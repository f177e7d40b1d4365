"""The one helper every fusion rule shares: a rule's parts, graph lookups, and the edit.

A rule is written as four parts, each read on its own:

- `anchor`: the op type of the node a match starts from (a `Softmax` for
  attention, the final `Add` of a LayerNorm);
- `form`: the subgraph it matches, in the notation the docs use;
- `match(graph, anchor node)`: walks the form from the anchor through
  `Graph`'s lookups and checks every fact the fused op assumes (consumers,
  constants, shapes, element types). It returns what the rewrite needs, a
  reason (a string) when a check fails, or None when the node is no
  candidate at all;
- `rewrite(edit, match)`: says, through `Edit`, which nodes replace which.

`apply` runs a rule over a graph: every reason goes to the caller's
`declined` list as (anchor output, reason), the report's `graph.declined`.
No rewrite changes the graph while matching goes on: `Edit` records the
changes and makes them in one pass at the end, so every match sees the
graph tf2onnx wrote.

Why this helper rather than onnxscript's rewriter (which also has patterns,
checks with reasons and replacements): docs/export.md, "How a fusion is
written", measured by benchmarks/rule_engines.py.
"""

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper, numpy_helper


@dataclass(frozen=True)
class Rule:
    """One fusion: where a match starts, the form it takes, its check and its rewrite."""

    makes: str  # the op type the rewrite makes, the report's key
    anchor: str
    form: str
    match: Callable
    rewrite: Callable
    reason_prefix: str = ""  # put before each reason in `declined`


def body_reads(node) -> set[str]:
    """Names the subgraphs of `node` read from enclosing graphs."""
    from keras_layers.export.slimming import free_names, subgraphs

    found = set()
    for body in subgraphs(node):
        found |= free_names(body)
    return found


class Graph:
    """Producer, consumer, constant and shape lookups over a GraphProto.

    `shapes` is `tensor_shapes`' answer; `facts`, what else a rule's match
    reads (a rotation's symbolic dims, a LayerNorm's ranks), become
    attributes of the same names.
    """

    def __init__(self, graph, shapes: dict | None = None, **facts):
        self.graph = graph
        self.producer = {out: node for node in graph.node for out in node.output}
        self.consumers = defaultdict(list)
        for node in graph.node:
            for name in node.input:
                self.consumers[name].append(node)
            # A Loop/If/Scan body may read a value of this graph without
            # listing it as an input: that node reads it too, so no fusion
            # may take the value away from it.
            for name in body_reads(node):
                self.consumers[name].append(node)
        self.outputs = {value.name for value in graph.output}
        self.inputs = {value.name for value in graph.input}
        self.initializers = {init.name: init for init in graph.initializer}
        self.shapes = {} if shapes is None else shapes
        self.__dict__.update(facts)

    def const(self, name):
        """The values of initializer `name`; None if it is not one, or if its
        values are in a data file (a weight: no rule reads one's values)."""
        init = self.initializers.get(name)
        if init is None or init.data_location == TensorProto.EXTERNAL:
            return None
        return numpy_helper.to_array(init)

    def const_shape(self, name):
        """The shape of initializer `name` (wherever its values are), or None."""
        init = self.initializers.get(name)
        return None if init is None else tuple(init.dims)

    def node(self, name, op_type):
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def only_used_by(self, name, count=1):
        return name not in self.outputs and len(self.consumers[name]) == count

    def other_input(self, node, name):
        first, second = node.input
        return second if first == name else first if second == name else None

    def scalar(self, name):
        """The one value of constant `name`, or None if it is no one-value constant."""
        value = self.const(name)
        return None if value is None or value.size != 1 else float(value.reshape(-1)[0])

    def is_scalar(self, name, value: float, tolerance: float = 0.0) -> bool:
        """Whether `name` is a constant holding one value within `tolerance` of `value`."""
        found = self.scalar(name)
        return found is not None and abs(found - value) <= tolerance

    def constant_input(self, node, value: float, tolerance: float = 0.0):
        """The input of the binary `node` that is not the scalar constant `value`, or None."""
        name = next((i for i in node.input if self.is_scalar(i, value, tolerance)), None)
        return None if name is None else self.other_input(node, name)


# The ops `static_value` computes: those that move values (a shape's
# entries), and float arithmetic (a scale computed from a head size).
_MOVES = ("Identity", "Cast", "Slice", "Gather", "Squeeze", "Unsqueeze")
_FLOAT_MATH = {
    "Sqrt": np.sqrt,
    "Reciprocal": np.reciprocal,
    "Neg": np.negative,
    "Div": np.divide,
    "Mul": np.multiply,
    "Add": np.add,
    "Sub": np.subtract,
}


def static_value(g, name, depth: int = 12):
    """The values of `name` where constants and static dims alone compute
    them, as a NumPy array; None otherwise.

    Keras computes some scales at run time from a shape: ESM's attention
    scales by `1 / sqrt(float(shape(k)[-1]))` because TensorFlow lost the
    static head size. `Shape` gives an object array, None at a dim shape
    inference does not know; the ops that move values keep the Nones, and
    float arithmetic needs every value known. NumPy computes float32 as ONNX
    Runtime does (each operation rounded once), so the value is the one the
    graph would compute.
    """
    value = g.const(name)
    if value is not None or depth == 0:
        return value
    node = g.producer.get(name)
    if node is None:
        return None
    op = node.op_type
    if op == "Shape":
        dims = g.shapes.get(node.input[0], (None,))[0]
        if dims is None:
            return None
        start, end = attribute(node, "start", 0), attribute(node, "end", None)
        return np.array([d if isinstance(d, int) else None for d in dims[start:end]], object)
    if op not in _MOVES and op not in _FLOAT_MATH:
        return None
    inputs = [static_value(g, i, depth - 1) if i else None for i in node.input]
    x = inputs[0]
    if x is None or any(v is not None and v.dtype == object for v in inputs[1:]):
        return None  # indices, bounds or axes that depend on an unknown dim
    if x.dtype == object and None not in x.reshape(-1).tolist():
        x = x.astype(np.int64)  # every dim read is static
    if op in _FLOAT_MATH:
        if any(v is None or v.dtype.kind != "f" or v.dtype != x.dtype for v in inputs):
            return None
        return np.asarray(_FLOAT_MATH[op](*inputs)).astype(x.dtype)
    if op == "Identity":
        return x
    if op == "Cast":
        if x.dtype == object:
            return x  # values unknown somewhere: cast on read
        return x.astype(helper.tensor_dtype_to_np_dtype(attribute(node, "to", 1)))
    if op in ("Squeeze", "Unsqueeze"):
        axes = inputs[1] if len(inputs) > 1 else None
        axes = attribute(node, "axes", None) if axes is None else axes.reshape(-1).tolist()
        if axes is None:
            return None if op == "Unsqueeze" else np.squeeze(x)
        axes = tuple(int(a) for a in axes)
        return np.squeeze(x, axes) if op == "Squeeze" else np.expand_dims(x, axes)
    if x.ndim != 1:
        return None
    if op == "Gather":
        indices = inputs[1]
        if indices is None or attribute(node, "axis", 0) != 0:
            return None
        return x[indices.astype(np.int64)]
    # Slice of a vector: starts, ends [, axes [0] [, steps [1]]]
    starts, ends, *rest = (inputs[1:] + [None, None])[:4]
    if starts is None or ends is None:
        return None
    if any(
        given is not None and given.reshape(-1).tolist() != [want]
        for given, want in zip(rest, (0, 1), strict=True)
    ):
        return None
    return x[int(starts.reshape(-1)[0]) : int(ends.reshape(-1)[0])]


def sort_topologically(graph) -> None:
    """Order `graph.node` so every value is made before it is read; among the
    ready nodes, the one listed first goes first (ONNX Runtime's fusions append
    the nodes they make at the end)."""
    import heapq

    nodes = list(graph.node)
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    readers, waiting = defaultdict(list), []
    for i, node in enumerate(nodes):
        needs = {producer[n] for n in [*node.input, *body_reads(node)] if n in producer} - {i}
        waiting.append(len(needs))
        for j in needs:
            readers[j].append(i)
    ready = [i for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for j in readers[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(nodes):
        raise ValueError("the graph has a cycle")
    del graph.node[:]
    graph.node.extend(order)


class Edit:
    """The changes a rule's rewrites make, made at once by `commit`.

    Nodes replace a node in its place (`replace`) or go right after the node
    that makes a value (`after`; at the start of the graph when the value is
    an input or an initializer). Values
    computed once for many matches (a mask's bias, a table) are made through
    `once`; constants shared by matches through `constant`.
    """

    def __init__(self, proto):
        self.proto = proto
        graph = proto.graph
        self.taken = {
            *(name for node in graph.node for name in node.output),
            *(init.name for init in graph.initializer),
            *(value.name for value in graph.input),
        }
        self.sources = {init.name for init in graph.initializer} | {v.name for v in graph.input}
        self._replaced, self._after = {}, defaultdict(list)
        self._constants, self._once = {}, {}
        self.count = 0

    def fresh(self, name: str) -> str:
        """`name`, or `name` with underscores added until no tensor has it."""
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        return name

    def constant(self, key: str, value) -> str:
        """The name of a constant holding `value`, made once per `key`."""
        if key not in self._constants:
            self._constants[key] = self.fresh(key)
            array = numpy_helper.from_array(np.asarray(value), self._constants[key])
            self.proto.graph.initializer.append(array)
        return self._constants[key]

    def initializer(self, name: str, value) -> str:
        """A new constant named after `name`; its (unique) name."""
        name = self.fresh(name)
        self.proto.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def once(self, key, make: Callable):
        """`make()`'s answer for `key`, called the first time only."""
        if key not in self._once:
            self._once[key] = make()
        return self._once[key]

    def replace(self, node, nodes: list) -> None:
        """Put `nodes` where `node` is; the last of them takes over its outputs."""
        nodes[-1].ClearField("output")
        nodes[-1].output.extend(node.output)
        self._replaced[node.output[0]] = nodes

    def after(self, name: str, nodes: list) -> None:
        self._after[name] += nodes

    def commit(self) -> None:
        """Make the recorded changes, in one pass over the graph's nodes."""
        if not (self._replaced or self._after):
            return
        graph = self.proto.graph
        nodes = [new for name in self._after if name in self.sources for new in self._after[name]]
        for node in graph.node:
            key = node.output[0] if node.output else None
            nodes += self._replaced.get(key, [node])
            nodes += [new for output in node.output for new in self._after.get(output, [])]
        del graph.node[:]
        graph.node.extend(nodes)
        # A value made once for many matches went before the first match's
        # node; should another match's come earlier, reorder (a no-op else).
        sort_topologically(graph)
        if any(node.domain == "com.microsoft" for node in nodes):
            use_contrib_domain(self.proto)


def apply(rule: Rule, proto, declined: list | None = None, shapes=None, **facts) -> int:
    """Match `rule` at every node of its anchor type and rewrite each match.

    `shapes` and `facts` go to the `Graph` the match reads. Returns how many
    matches were rewritten; `declined`, when given, gets (anchor's output,
    reason) for each candidate whose check failed.
    """
    g = Graph(proto.graph, shapes, **facts)
    edit = Edit(proto)
    for node in [n for n in proto.graph.node if n.op_type == rule.anchor]:
        found = rule.match(g, node)
        if isinstance(found, str):
            if declined is not None:
                declined.append((node.output[0], rule.reason_prefix + found))
        elif found is not None:
            rule.rewrite(edit, found)
            edit.count += 1
    edit.commit()
    return edit.count


def use_contrib_domain(proto) -> None:
    """Import ONNX Runtime's `com.microsoft` domain, where its fused ops live."""
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def perm(node):
    """A Transpose node's `perm`, or None when absent (reverse every axis)."""
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def attribute(node, name, default):
    """The value of `node`'s attribute `name`, or `default` when it has none."""
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def opset(proto) -> int:
    """The model's default-domain opset."""
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)


def last_axis_reduce(g, node, rank):
    """Whether a ReduceMean node averages over the last axis only, keeping dims."""
    if attribute(node, "keepdims", 1) != 1:
        return False
    axes = attribute(node, "axes", None)
    if axes is None and len(node.input) > 1:
        value = g.const(node.input[1])
        axes = None if value is None else value.reshape(-1).tolist()
    return axes is not None and len(axes) == 1 and axes[0] in (-1, rank - 1)


def tensor_shapes(proto) -> dict:
    """Shape and element type of every tensor that ONNX shape inference can tell.

    {name: (dims, elem_type)}, each dim an int, a symbolic name, or None.
    """
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(proto, data_prop=True)
    shapes = {}
    for value in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        tensor = value.type.tensor_type
        if tensor.HasField("shape"):
            dims = [
                d.dim_value if d.HasField("dim_value") else d.dim_param or None
                for d in tensor.shape.dim
            ]
            shapes[value.name] = (dims, tensor.elem_type)
    return shapes


def tensor_ranks(shapes: dict) -> dict:
    """Rank of every tensor in `tensor_shapes`' answer."""
    return {name: len(dims) for name, (dims, _) in shapes.items()}
