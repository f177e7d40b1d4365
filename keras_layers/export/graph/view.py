"""A graph read by a rewrite (`Graph`: producers, consumers, constants,
shapes) and the changes it makes (`Edit`, made in one pass at the end)."""

from collections import defaultdict
from collections.abc import Callable
from functools import cached_property

import numpy as np
from onnx import TensorProto, numpy_helper

from keras_layers.export.graph.evaluation import Evaluation
from keras_layers.export.graph.shapes import tensor_ranks
from keras_layers.export.graph.walk import body_reads, sort_topologically, use_contrib_domain


class Graph:
    """Producer, consumer, constant and shape lookups over a GraphProto.

    `shapes` is `shapes.tensor_shapes`' answer (and `ranks` the ranks it
    gives); `dims`, where a rule reads them, `evaluation.symbolic_dims`'.
    """

    def __init__(self, graph, shapes: dict | None = None, dims: dict | None = None):
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
        self.dims = {} if dims is None else dims
        self._evaluation = None

    @cached_property
    def ranks(self) -> dict:
        """{tensor: rank} where `shapes` tells it."""
        return tensor_ranks(self.shapes)

    def evaluation(self) -> Evaluation:
        """The graph's static evaluation (made on first use), whose `Shape`s
        also read the static dims in `shapes`."""
        if self._evaluation is None:
            self._evaluation = Evaluation(self.graph, shapes=self.shapes)
        return self._evaluation

    def const(self, name):
        """The values of initializer `name`; None if it is not one, or if its
        values are in a data file: a matrix weight, whose values no rule reads
        (`weights.stage` keeps vectors, a gamma or a bias, in the proto)."""
        init = self.initializers.get(name)
        if init is None or init.data_location == TensorProto.EXTERNAL:
            return None
        return numpy_helper.to_array(init)

    def const_shape(self, name):
        """The shape of initializer `name` (wherever its values are), or None."""
        init = self.initializers.get(name)
        return None if init is None else tuple(init.dims)

    def node(self, name, op_type):
        """The node making `name` if it is an `op_type`, else None.

        Args:
            name: a tensor.
            op_type: the op wanted.

        Returns:
            The NodeProto or None.
        """
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def only_used_by(self, name, count=1):
        """Whether `name` is no graph output and exactly `count` nodes read it.

        Args:
            name: a tensor.
            count: how many readers it must have.

        Returns:
            True or False.
        """
        return name not in self.outputs and len(self.consumers[name]) == count

    def other_input(self, node, name):
        """The input of the binary `node` that is not `name`; None if `name`
        is neither.

        Args:
            node: a node with two inputs.
            name: one of them.

        Returns:
            The other input's name, or None.
        """
        first, second = node.input
        return second if first == name else first if second == name else None

    def scalar(self, name):
        """The one value of constant `name`, or None if it is no one-value constant."""
        value = self.const(name)
        return None if value is None or value.size != 1 else float(value.reshape(-1)[0])

    def is_scalar(self, name, value: float, tolerance: float = 0.0) -> bool:
        """Whether `name` is a constant holding one value within `tolerance` of `value`.

        Args:
            name: a tensor.
            value: the value wanted.
            tolerance: how far from it the constant may be.

        Returns:
            True or False.
        """
        found = self.scalar(name)
        return found is not None and abs(found - value) <= tolerance

    def constant_input(self, node, value: float, tolerance: float = 0.0):
        """The input of the binary `node` that is not the scalar constant `value`, or None.

        Args:
            node: a node with two inputs.
            value: the constant wanted on one side.
            tolerance: as for `is_scalar`.

        Returns:
            The other input's name, or None.
        """
        name = next((i for i in node.input if self.is_scalar(i, value, tolerance)), None)
        return None if name is None else self.other_input(node, name)


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
        """The name of a constant holding `value`, made once per `key`.

        Args:
            key: names the constant (and, made unique, is its name).
            value: its values.

        Returns:
            The constant's name.
        """
        if key not in self._constants:
            self._constants[key] = self.fresh(key)
            array = numpy_helper.from_array(np.asarray(value), self._constants[key])
            self.proto.graph.initializer.append(array)
        return self._constants[key]

    def initializer(self, name: str, value) -> str:
        """A new constant named after `name`.

        Args:
            name: the name wanted (made unique).
            value: its values.

        Returns:
            Its (unique) name.
        """
        name = self.fresh(name)
        self.proto.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def once(self, key, make: Callable):
        """`make()`'s answer for `key`, called the first time only.

        Args:
            key: what the value is made for (hashable).
            make: makes it, and the nodes computing it.

        Returns:
            What `make` returned for `key`.
        """
        if key not in self._once:
            self._once[key] = make()
        return self._once[key]

    def replace(self, node, nodes: list) -> None:
        """Put `nodes` where `node` is; the last of them takes over its outputs.

        Args:
            node: the node replaced.
            nodes: the nodes in its place.
        """
        nodes[-1].ClearField("output")
        nodes[-1].output.extend(node.output)
        self._replaced[node.output[0]] = nodes

    def remove(self, node) -> None:
        """Drop `node`; another node must now make its outputs.

        Args:
            node: the node removed.
        """
        self._replaced[node.output[0]] = []

    def after(self, name: str, nodes: list) -> None:
        """Put `nodes` right after the node that makes `name`.

        Args:
            name: a tensor (a graph input or initializer: at the graph's start).
            nodes: the nodes to add.
        """
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
