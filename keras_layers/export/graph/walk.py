"""Walking a GraphProto: subgraphs, the names a graph reads and defines,
renames, dead nodes, topological order, and small node accessors.

A Loop's or Scan's body and an If's branches may read values of the graphs
around them without listing them as inputs; every function here that reads or
renames values follows such reads into the bodies.
"""

import heapq

from onnx import AttributeProto, helper


def labelled_subgraphs(node) -> list[tuple[str, object]]:
    """The subgraphs of a node (a Loop's or Scan's body, an If's branches), in
    attribute order, each with its attribute's name (and index in a list)."""
    found = []
    for attribute in node.attribute:
        if attribute.type == AttributeProto.GRAPH:
            found.append((attribute.name, attribute.g))
        elif attribute.type == AttributeProto.GRAPHS:
            found += [(f"{attribute.name}_{i}", g) for i, g in enumerate(attribute.graphs)]
    return found


def subgraphs(node) -> list:
    """The subgraphs of a node, in attribute order."""
    return [body for _, body in labelled_subgraphs(node)]


def free_names(graph) -> set[str]:
    """Names `graph` (with its own subgraphs) reads but does not define: values
    of the enclosing graphs, which a Loop body may read without declaring them."""
    defined = {value.name for value in graph.input}
    defined.update(init.name for init in graph.initializer)
    defined.update(name for node in graph.node for name in node.output)
    read = {value.name for value in graph.output}
    for node in graph.node:
        read.update(node.input)
        for body in subgraphs(node):
            read.update(free_names(body))
    return read - defined - {""}


def body_reads(node) -> set[str]:
    """Names the subgraphs of `node` read from enclosing graphs."""
    found = set()
    for body in subgraphs(node):
        found |= free_names(body)
    return found


def rename_reads(graph, renames: dict) -> None:
    """Point every read of a renamed value at its new name, in `graph` and in
    the subgraphs that read it from outside (unless they define it again).

    Args:
        graph: the GraphProto, changed in place.
        renames: {old name: new name}.
    """
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name in renames:
                node.input[index] = renames[name]
        for body in subgraphs(node):
            defined = {value.name for value in body.input}
            defined.update(init.name for init in body.initializer)
            defined.update(name for inner in body.node for name in inner.output)
            rename_reads(body, {k: v for k, v in renames.items() if k not in defined})


def remove_dead_nodes(proto) -> None:
    """Drop nodes whose outputs nothing reads, then unread initializers."""
    graph = proto.graph
    needed = {value.name for value in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(node.input)
            needed.update(body_reads(node))  # a Loop body reads outer values unlisted
    del graph.node[:]
    graph.node.extend(reversed(kept))
    # In place: re-adding a kept initializer copies it through serialisation,
    # which fails for one over 2 GiB.
    for position in reversed(range(len(graph.initializer))):
        if graph.initializer[position].name not in needed:
            del graph.initializer[position]


def _kahn(reads: list[list[int]], priority: list | None = None) -> list[int]:
    """Kahn's sort of the nodes not on a cycle (see `topological_order`)."""
    readers: list[list[int]] = [[] for _ in reads]
    waiting = [0] * len(reads)
    for node, sources in enumerate(reads):
        for source in set(sources):
            readers[source].append(node)
            waiting[node] += 1
    ready = [(priority[i] if priority else i, i) for i, count in enumerate(waiting) if not count]
    heapq.heapify(ready)
    order = []
    while ready:
        _, node = heapq.heappop(ready)
        order.append(node)
        for reader in readers[node]:
            waiting[reader] -= 1
            if not waiting[reader]:
                heapq.heappush(ready, (priority[reader] if priority else reader, reader))
    return order


def topological_order(reads: list[list[int]], priority: list | None = None) -> list[int]:
    """Kahn's sort of nodes given as `reads[i]`, the nodes node i reads from.

    Args:
        reads: for each node, the indices of the nodes it reads from.
        priority: without it, ready nodes go in index order; with it, the
            ready node with the smallest `priority[i]` goes first (equal
            priorities in index order).

    Returns:
        Every index once. Nodes on a cycle (an invalid graph) go last, in
        index order, so nothing is lost.
    """
    order = _kahn(reads, priority)
    placed = set(order)
    return order + [i for i in range(len(reads)) if i not in placed]


def node_reads(nodes: list) -> list[list[int]]:
    """For each node, the positions of the nodes it reads from (its inputs and
    its subgraphs' reads of outer values), itself left out."""
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    return [
        sorted({producer[n] for n in [*node.input, *body_reads(node)] if n in producer} - {i})
        for i, node in enumerate(nodes)
    ]


def sort_topologically(graph) -> None:
    """Order `graph.node` so every value is made before it is read; among the
    ready nodes, the one listed first goes first (ONNX Runtime's fusions append
    the nodes they make at the end).

    Raises:
        ValueError: the graph has a cycle.
    """
    nodes = list(graph.node)
    order = _kahn(node_reads(nodes))
    if len(order) != len(nodes):
        raise ValueError("the graph has a cycle")
    del graph.node[:]
    graph.node.extend(nodes[i] for i in order)


def attribute(node, name, default):
    """The value of `node`'s attribute `name`, or `default` when it has none.

    Args:
        node: a NodeProto.
        name: the attribute's name.
        default: what to return when the node has no such attribute.

    Returns:
        The attribute's value as `onnx.helper.get_attribute_value` gives it.
    """
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def perm(node):
    """A Transpose node's `perm`, or None when absent (reverse every axis)."""
    return next((list(a.ints) for a in node.attribute if a.name == "perm"), None)


def opset(proto) -> int:
    """The model's default-domain opset."""
    return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)


def use_contrib_domain(proto) -> None:
    """Import ONNX Runtime's `com.microsoft` domain, where its fused ops live."""
    if not any(o.domain == "com.microsoft" for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid("com.microsoft", 1))
