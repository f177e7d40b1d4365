"""Canonical form, last: the same model gives the same bytes on every run.

tf2onnx's node order (and so every name given in graph order) changes from
run to run; `canonicalize` orders the nodes by their structure alone and
names everything in that order. See `_canonical_order` for how.
"""

import hashlib
import re
from collections import ChainMap, Counter, defaultdict
from collections.abc import Mapping

from onnx import AttributeProto, TensorProto

from keras_layers.export.graph import (
    free_names,
    labelled_subgraphs,
    subgraphs,
    topological_order,
    weights,
)
from keras_layers.export.passes.context import Context, PassResult


class _Names:
    """New names of one graph's values; reads of other names go to the
    enclosing graph's `_Names`, as ONNX scoping does."""

    def __init__(self, graph, parent: "_Names | None", counters: dict, keep: set[str]):
        self.parent = parent
        self.counters = counters
        self.keep = keep
        self.initializers = {init.name for init in graph.initializer}
        self.names: dict[str, str] = {}

    def fresh(self, prefix: str) -> str:
        self.counters[prefix] = self.counters.get(prefix, 0) + 1
        return f"{prefix}{self.counters[prefix] - 1}"

    def define(self, name: str, prefix: str) -> str:
        if not name:  # an optional output left out
            return name
        self.names[name] = name if name in self.keep else self.fresh(prefix)
        return self.names[name]

    def read(self, name: str) -> str:
        if name in self.names or not name:
            return self.names.get(name, name)
        if name in self.initializers:  # named at its first read
            return self.define(name, "w")
        return self.parent.read(name) if self.parent else name


def _rename(graph, names: _Names) -> None:
    """Rename `graph`'s nodes and values in graph order, its subgraphs' in place
    of the node that holds them (reads inside a body follow the renaming)."""
    for value in graph.input:
        value.name = names.define(value.name, "t")
    for node in graph.node:
        node.name = names.fresh("n")
        for position, value in enumerate(node.input):
            node.input[position] = names.read(value)
        for label, body in labelled_subgraphs(node):  # a body cannot read its node's outputs
            # tf2onnx names a body after its TensorFlow function, whose number
            # grows with every function the process traced before.
            body.name = f"{node.name}_{label}"
            _rename(body, _Names(body, names, names.counters, set()))
        for position, value in enumerate(node.output):
            node.output[position] = names.define(value, "t")
    for value in graph.output:
        value.name = names.read(value.name)
    # Initializers nothing reads (none in the main graph after
    # `remove_dead_nodes`) are numbered last, by content, not by old name.
    unread = [init for init in graph.initializer if init.name not in names.names]
    for init in sorted(unread, key=_tensor_key):
        names.read(init.name)
    for init in graph.initializer:
        init.name = names.names[init.name]
    graph.initializer.sort(key=lambda init: (len(init.name), init.name))  # in place
    del graph.value_info[:]


def compact_names(proto, name: str = "model") -> None:
    """Short names for everything but the graph inputs and outputs.

    tf2onnx names nodes, tensors and constants after their full TensorFlow scope
    and its own counters and Python object ids
    (`einsum139870154093264_ba_left_set__935`), and shape inference stores a
    `value_info` per tensor. On a small model they weigh as much as half the
    weights, and ONNX Runtime needs none of them. So nodes become `n{i}`,
    intermediate tensors `t{i}` and initializers `w{i}`, numbered in graph
    order, subgraphs (Loop, Scan and If bodies, named `{node}_{attribute}`)
    included, with every read inside a body renamed with the value it reads.
    The names depend only on the node order: `canonicalize` fixes that order
    first.

    Args:
        proto: the ModelProto, renamed in place.
        name: the graph's name.
    """
    graph = proto.graph
    graph.name = name
    keep = {value.name for value in [*graph.input, *graph.output]}
    _rename(graph, _Names(graph, None, {}, keep))


def _key(*parts: bytes | str | int) -> bytes:
    """A 16-byte digest of `parts`; each is tagged and length-prefixed, so no
    two different lists of parts give the same bytes to hash."""
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        if isinstance(part, bytes):
            tag, data = b"b", part
        else:
            tag, data = (b"i" if isinstance(part, int) else b"s"), str(part).encode()
        digest.update(tag + len(data).to_bytes(8, "little") + data)
    return digest.digest()


def _tensor_key(tensor, folder=None) -> bytes:
    """Key of a tensor's type, shape and values, whatever its name; one in a
    data file (in `folder`) gets the key it would have in the proto."""
    raw = tensor.raw_data
    if folder is not None and weights.is_external(tensor):
        return _key("raw", tensor.data_type, *tensor.dims, "data", weights.digest(tensor, folder))
    if raw:  # tf2onnx, onnxslim and the fusions store every weight this way
        return _key("raw", tensor.data_type, *tensor.dims, "data", hashlib.sha256(raw).digest())
    copy = TensorProto()
    copy.CopyFrom(tensor)
    copy.name = ""
    copy.doc_string = ""
    return _key("typed", copy.SerializeToString(deterministic=True))


def _attribute_key(attribute, body_keys: list[bytes]) -> bytes:
    """Key of an attribute; a subgraph counts by its key in `body_keys`."""
    if attribute.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
        return _key(attribute.name, "graphs", *body_keys)
    if attribute.type == AttributeProto.TENSOR:
        return _key(attribute.name, "tensor", _tensor_key(attribute.t))
    if attribute.type == AttributeProto.TENSORS:
        return _key(attribute.name, "tensors", *map(_tensor_key, attribute.tensors))
    copy = AttributeProto()
    copy.CopyFrom(attribute)
    copy.doc_string = ""
    return _key(copy.SerializeToString(deterministic=True))


def _first_output_gets_the_value(graph) -> None:
    """In a subgraph, give a value returned by several outputs to the first of
    them, and its `Identity` copies to the others.

    A Loop body returns a value twice when it is both a carried state and a
    scan output (an RNN's hidden state). Outputs need distinct names, so
    tf2onnx returns it once as itself and once through an `Identity`, and
    which output gets the copy changes from run to run: two graphs that compute
    the same, but not one graph in two orders. Only whole-value copies read by
    nothing but that one output move; the output types stay where they are
    (they are the value's type at both).
    """
    read = [name for node in graph.node for name in node.input]
    read += [name for node in graph.node for body in subgraphs(node) for name in free_names(body)]
    readers = Counter(read)
    returned = Counter(value.name for value in graph.output)
    copy_of = {
        node.output[0]: node.input[0]
        for node in graph.node
        if node.op_type == "Identity"
        and node.domain in ("", "ai.onnx")
        and len(node.input) == 1
        and len(node.output) == 1
        and not readers[node.output[0]]
        and returned[node.output[0]] == 1
    }
    positions = defaultdict(list)  # value -> the outputs returning it or a copy of it
    for position, value in enumerate(graph.output):
        positions[copy_of.get(value.name, value.name)].append(position)
    for value, where in positions.items():
        names = [graph.output[position].name for position in where]
        if value in names and names[0] != value:
            other = names.index(value)
            graph.output[where[0]].name = value
            graph.output[where[other]].name = names[0]


def _node_key(node, scope: Mapping[str, bytes], captured: list[str]):
    """A node's key from above (see `_canonical_order`), and for each name of
    an enclosing graph its subgraphs read, a key of where they read it."""
    attributes, uses = [], []
    for attribute in sorted(node.attribute, key=lambda a: a.name):
        graphs = [attribute.g] if attribute.type == AttributeProto.GRAPH else attribute.graphs
        body_keys = []
        for index, body in enumerate(graphs):
            body_key, body_uses = _canonical_order(body, scope, top=False)
            body_keys.append(body_key)
            uses += [(name, _key(attribute.name, index, use)) for name, use in body_uses]
        attributes.append(_attribute_key(attribute, body_keys))
    key = _key(
        "node",
        node.domain,
        node.op_type,
        getattr(node, "overload", ""),
        *attributes,
        "reads",
        *[scope.get(name) or _key("undefined", name) for name in node.input],
        "captures",
        *sorted(scope.get(name) or _key("undefined", name) for name in captured),
        "writes",
        *[bool(name) for name in node.output],
    )
    return key, uses


def _keys_from_below(graph, nodes: list, order: list, above: list, captures: list):
    """Each node's key from below (see `_canonical_order`), and how each value
    is read: {name: [keys of its reads]}."""
    readings: dict[str, list[bytes]] = defaultdict(list)  # value -> how it is read
    for position, value in enumerate(graph.output):
        readings[value.name].append(_key("output", position))
    below = [b""] * len(nodes)
    for i in reversed(order):  # every reader of a node comes before it here
        node = nodes[i]
        below[i] = _key(
            "below",
            *[_key(p, *sorted(readings.get(name, ()))) for p, name in enumerate(node.output)],
        )
        for slot, name in enumerate(node.input):
            if name:
                readings[name].append(_key("read", slot, above[i], below[i]))
        for name, use in captures[i]:
            readings[name].append(_key("captured", above[i], below[i], use))
    return below, readings


def _canonical_order(
    graph, outer: Mapping[str, bytes], top: bool, folder=None
) -> tuple[bytes, list]:
    """Put `graph.node` and its subgraphs' nodes in an order that depends only on
    what the graph computes, not on the order or names it came with.

    Each node gets two keys. Its key from above hashes its op, domain,
    attributes and the keys of the values it reads, recursively (Merkle-style):
    a graph input by its name (by its position in a subgraph), an initializer
    by its content. Its key from below hashes, for each output, how it is read:
    each reader's two keys and the input slot, and the graph output positions
    it feeds. Two nodes with equal keys from above compute the same value; they
    may still feed different readers (a duplicate `Shape`), and then their
    renamed outputs would land in different places depending on which went
    first. The key from below tells them apart: following "slot s of a reader
    with this key" back from the graph's outputs reaches exactly one node, so
    two live nodes never have equal keys from below (barring a hash collision).
    Kahn's sort then always takes the ready node with the smallest pair of keys.

    Returns the graph's key (its outputs' keys) and, for each name of an
    enclosing graph that it reads, a key of where it reads it: the enclosing
    graph counts those reads in its keys from below.
    """
    if not top:
        _first_output_gets_the_value(graph)
    keys: dict[str, bytes] = {"": _key("absent")}  # an optional input left out
    scope = ChainMap(keys, outer)
    for init in graph.initializer:
        keys[init.name] = _key("initializer", _tensor_key(init, folder))
    for position, value in enumerate(graph.input):
        keys[value.name] = _key("input", value.name if top else position)
    nodes = list(graph.node)
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    free = [sorted(set().union(*map(free_names, subgraphs(node)))) for node in nodes]
    reads = [
        [producer[name] for name in [*node.input, *free[i]] if name in producer]
        for i, node in enumerate(nodes)
    ]
    order = topological_order(reads)
    above = [b""] * len(nodes)
    captures: list[list[tuple[str, bytes]]] = [[] for _ in nodes]
    for i in order:
        above[i], captures[i] = _node_key(nodes[i], scope, free[i])
        for position, name in enumerate(nodes[i].output):
            if name:
                keys[name] = _key(above[i], position)
    below, readings = _keys_from_below(graph, nodes, order, above, captures)
    canonical = topological_order(reads, [(above[i], below[i]) for i in range(len(nodes))])
    if canonical != list(range(len(nodes))):
        del graph.node[:]
        graph.node.extend(nodes[i] for i in canonical)
    uses = sorted(
        (name, _key(*sorted(found))) for name, found in readings.items() if name not in keys
    )
    outputs = [scope.get(value.name) or _key("undefined", value.name) for value in graph.output]
    return _key("graph", len(graph.input), *outputs), uses


def _clear(message, *fields: str) -> None:
    """Clear `fields` of `message` (those it has) that hold nothing but the default.

    ONNX's protos have field presence: `domain: ""` set and `domain` left unset
    mean the same but serialise differently, and tf2onnx sets such fields on
    some runs and not others.
    """
    known = message.DESCRIPTOR.fields_by_name
    for name in fields:
        if name in known and not getattr(message, name):
            message.ClearField(name)


def _drop_run_specific(proto) -> None:
    """Clear what may differ between runs without changing what the graph
    computes: doc strings, empty fields set or not, and the order of
    attributes, opsets and metadata."""
    proto.ClearField("doc_string")
    _clear(proto, "domain", "model_version", "producer_name", "producer_version")
    opsets = sorted((entry.domain, entry.version) for entry in proto.opset_import)
    del proto.opset_import[:]
    for domain, version in opsets:
        entry = proto.opset_import.add()
        entry.domain, entry.version = domain, version
    proto.metadata_props.sort(key=lambda entry: (entry.key, entry.value))
    graphs = [proto.graph]
    while graphs:
        graph = graphs.pop()
        graph.ClearField("doc_string")
        for value in [*graph.input, *graph.output, *graph.initializer]:
            value.ClearField("doc_string")
        for node in graph.node:
            node.ClearField("doc_string")
            _clear(node, "domain", "overload")
            node.attribute.sort(key=lambda attribute: attribute.name)
            for attribute in node.attribute:
                attribute.ClearField("doc_string")
                _clear(attribute, "ref_attr_name")
            graphs.extend(subgraphs(node))


# tf2onnx names the dims it cannot tell `unk__N`, N from a counter that runs in
# conversion order; the pattern is what `_number_unknown_dims` renumbers.
_UNKNOWN_DIM = re.compile(r"unk__\d+")


def _number_unknown_dims(proto) -> None:
    """Renumber tf2onnx's `unk__N` dims in graph order (subgraphs included).

    Equal names mark equal dims; one consistent renaming of every such name
    keeps which dims are equal. Left in a subgraph's inputs and outputs (and in
    a graph output whose axis Keras leaves unnamed).
    """
    numbers: dict[str, str] = {}
    graphs = [proto.graph]
    while graphs:
        graph = graphs.pop(0)
        for value in [*graph.input, *graph.output, *graph.value_info]:
            for dim in value.type.tensor_type.shape.dim:
                if _UNKNOWN_DIM.fullmatch(dim.dim_param):
                    dim.dim_param = numbers.setdefault(dim.dim_param, f"unk__{len(numbers)}")
        graphs += [body for node in graph.node for body in subgraphs(node)]


def canonicalize(proto, name: str = "model", folder=None) -> None:
    """Rewrite the proto so that the same model always gives the same bytes.

    tf2onnx orders independent nodes by set and `id()` iteration, so two
    exports of one model list them in different orders, and names given in
    graph order then differ too. This puts the nodes in an order computed
    from the graph's structure alone (`_canonical_order`, which also settles
    which output of a Loop body gets tf2onnx's `Identity` copy), names nodes,
    values, initializers and subgraphs in that order (`compact_names`), sorts
    the initializers by name, renumbers tf2onnx's `unk__N` dims
    (`_number_unknown_dims`) and drops what else may vary
    (`_drop_run_specific`). The graph's inputs and outputs keep their names and
    order. Run it last: any pass after it may undo it.

    Args:
        proto: the ModelProto, rewritten in place.
        name: the graph's name.
        folder: the folder of the data files its weights are in, if any:
            a weight there is keyed by its values, as in the proto, so the
            graph is the same wherever its weights are.
    """
    _canonical_order(proto.graph, {}, top=True, folder=folder)
    compact_names(proto, name=name)
    _number_unknown_dims(proto)
    _drop_run_specific(proto)


def run(proto, context: Context) -> PassResult:
    """`canonicalize`, named `context.model_name`.

    Args:
        proto: the ModelProto, rewritten in place.
        context: its `model_name` and `data_folder`.

    Returns:
        The bytes of every initializer, by its name before this pass renamed
        it (the report's `initializer_bytes`: weights keep their Keras paths
        until then).
    """
    sizes = {init.name: weights.byte_count(init) for init in proto.graph.initializer}
    canonicalize(proto, name=context.model_name, folder=context.data_folder)
    return PassResult(proto, report={"initializer_bytes": sizes})
