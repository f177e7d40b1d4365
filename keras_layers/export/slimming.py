"""Stage 4, slim: make the converted graph lean.

1. onnxslim folds constants and drops dead nodes and initializers (tf2onnx keeps
   copies of weights that only feed `Shape`).
2. Repeated weights are stored once. The trace stage already keeps a tied
   embedding from being folded into a second, transposed constant (see
   `keras_layers/export/tracing.py`); this pass catches what other graphs repeat (equal
   LayerNorm scales, a transposed copy a model computes itself). No maintained
   tool deduplicates a transposed copy (onnxslim and onnxoptimizer compare
   tensors only as they are), so this stage does it: an exact duplicate is
   replaced by the original, a transposed one by a `Transpose` node of the
   original, which ONNX Runtime folds once when the session loads.
3. Dynamic axes get names (`batch`, `sequence`) instead of tf2onnx's `unk__N`.
4. Canonical form, last: the same model gives the same bytes on every run.
   tf2onnx's node order (and so every name given in graph order) changes from
   run to run; `canonicalize` orders the nodes by their structure alone and
   names everything in that order. See `_canonical_order` for how.
"""

import hashlib
import heapq
import re
import time
from collections import ChainMap, Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from keras_layers.export import causal_lm, dims, fusions, stacks
from keras_layers.export.fusions import rotary
from keras_layers.export.loading import TensorInfo

# Tensors smaller than this are not worth hashing.
_MIN_DEDUPE_ELEMENTS = 64


@dataclass
class SlimmedModel:
    """The output of `slim`: the lean proto and what changed."""

    proto: object
    nodes_before: int
    nodes_after: int
    deduplicated: list = field(default_factory=list)  # (removed, kept, "same"|"T")
    fused: dict = field(default_factory=dict)  # op type -> subgraphs folded into it
    seconds: float = 0.0
    # Bytes of every initializer the final graph reads, by its name before
    # `canonicalize` renamed it: weights keep their Keras paths until then.
    initializer_bytes: dict = field(default_factory=dict)
    # Picks of one slice of a stacked tensor replaced by that slice (`stacks`).
    stack_picks_folded: int = 0
    shapes_shared: int = 0
    # Candidates a fusion left alone: {fused op type: {reason: how many}}.
    declined: dict = field(default_factory=dict)


def _tensor_bytes(tensor) -> int:
    """The size of a TensorProto's values, from its type and shape."""
    from onnx import helper

    count = int(np.prod(tensor.dims, dtype=np.int64)) if tensor.dims else 1
    return count * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def _digest(array: np.ndarray) -> str:
    return hashlib.sha256(memoryview(np.ascontiguousarray(array))).hexdigest()


def deduplicate_initializers(proto) -> list:
    """Store every repeated or transposed weight once; returns what changed."""
    import onnx
    from onnx import numpy_helper

    graph = proto.graph
    seen = {}  # (dtype, shape, digest) -> name of the first tensor with that content
    shapes = set()  # (dtype, shape) of the tensors in `seen`
    changes = []
    renames = {}
    transposes = []
    removed = []  # positions in graph.initializer
    for position, init in enumerate(graph.initializer):
        size = int(np.prod(init.dims)) if init.dims else 1
        if size < _MIN_DEDUPE_ELEMENTS or init.data_location == onnx.TensorProto.EXTERNAL:
            continue  # a weight already in the data file is one variable, stored once
        array = numpy_helper.to_array(init)
        key = (array.dtype.str, array.shape, _digest(array))
        if key in seen:
            renames[init.name] = seen[key]
            changes.append((init.name, seen[key], "same"))
            removed.append(position)
            continue
        # Hash the transpose (a full copy) only if a tensor of that shape exists.
        if array.ndim == 2 and (array.dtype.str, array.shape[::-1]) in shapes:
            transposed_key = (array.dtype.str, array.shape[::-1], _digest(array.T))
            if transposed_key in seen:
                original = seen[transposed_key]
                transposes.append(
                    onnx.helper.make_node(
                        "Transpose",
                        [original],
                        [init.name],
                        perm=[1, 0],
                        name=f"{init.name}/tied_transpose",
                    )
                )
                changes.append((init.name, original, "T"))
                removed.append(position)
                continue
        seen[key] = init.name
        shapes.add(key[:2])
    if not changes:
        return changes
    for position in reversed(removed):  # in place: no copy of the kept weights
        del graph.initializer[position]
    _rename_reads(graph, renames)
    for output in graph.output:
        if output.name in renames:
            raise ValueError(f"graph output {output.name} is a duplicated weight")
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(transposes + nodes)
    return changes


def shared_weights(proto, min_elements: int = _MIN_DEDUPE_ELEMENTS) -> list:
    """Weights read by more than one node: `(name, shape, [reader op types])`.

    A tied embedding shows up here once, read by the lookup (`Gather`) and by
    the output projection (`Transpose`, or `MatMul` after quantization).
    """
    readers = {}
    for node in proto.graph.node:
        for name in set(node.input):
            readers.setdefault(name, []).append(node.op_type)
    shared = []
    for init in proto.graph.initializer:
        size = int(np.prod(init.dims)) if init.dims else 1
        if size >= min_elements and len(readers.get(init.name, [])) > 1:
            shared.append((init.name, list(init.dims), sorted(readers[init.name])))
    return shared


def _labelledsubgraphs(node) -> list[tuple[str, object]]:
    """The subgraphs of a node (a Loop's or Scan's body, an If's branches), in
    attribute order, each with its attribute's name (and index in a list)."""
    from onnx import AttributeProto

    found = []
    for attribute in node.attribute:
        if attribute.type == AttributeProto.GRAPH:
            found.append((attribute.name, attribute.g))
        elif attribute.type == AttributeProto.GRAPHS:
            found += [(f"{attribute.name}_{i}", g) for i, g in enumerate(attribute.graphs)]
    return found


def _rename_reads(graph, renames: dict) -> None:
    """Point every read of a renamed value at its new name, in `graph` and in
    the subgraphs that read it from outside (unless they define it again)."""
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name in renames:
                node.input[index] = renames[name]
        for body in subgraphs(node):
            defined = {value.name for value in body.input}
            defined.update(init.name for init in body.initializer)
            defined.update(name for inner in body.node for name in inner.output)
            _rename_reads(body, {k: v for k, v in renames.items() if k not in defined})


def subgraphs(node) -> list:
    """The subgraphs of a node, in attribute order."""
    return [body for _, body in _labelledsubgraphs(node)]


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
        for label, body in _labelledsubgraphs(node):  # a body cannot read its node's outputs
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


def _tensor_key(tensor) -> bytes:
    """Key of a tensor's type, shape and values, whatever its name."""
    raw = tensor.raw_data
    if raw:  # tf2onnx, onnxslim and the fusions store every weight this way
        return _key("raw", tensor.data_type, *tensor.dims, "data", hashlib.sha256(raw).digest())
    from onnx import TensorProto

    copy = TensorProto()
    copy.CopyFrom(tensor)
    copy.name = ""
    copy.doc_string = ""
    return _key("typed", copy.SerializeToString(deterministic=True))


def _attribute_key(attribute, body_keys: list[bytes]) -> bytes:
    """Key of an attribute; a subgraph counts by its key in `body_keys`."""
    from onnx import AttributeProto

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


def _topological(reads: list[list[int]], priority: list | None = None) -> list[int]:
    """Kahn's sort of nodes given as `reads[i]`, the nodes node i reads from.

    Without `priority`, ready nodes go in index order; with it, the ready node
    with the smallest `priority[i]` goes first (equal priorities in index
    order). Nodes on a cycle (an invalid graph) go last, in index order, so
    nothing is lost.
    """
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
    placed = set(order)
    return order + [i for i in range(len(reads)) if i not in placed]


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


def _canonical_order(
    graph, outer: Mapping[str, bytes], top: bool
) -> tuple[bytes, list[tuple[str, bytes]]]:
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
    from onnx import AttributeProto

    if not top:
        _first_output_gets_the_value(graph)
    keys: dict[str, bytes] = {"": _key("absent")}  # an optional input left out
    scope = ChainMap(keys, outer)
    for init in graph.initializer:
        keys[init.name] = _key("initializer", _tensor_key(init))
    for position, value in enumerate(graph.input):
        keys[value.name] = _key("input", value.name if top else position)
    nodes = list(graph.node)
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    free = [sorted(set().union(*map(free_names, subgraphs(node)))) for node in nodes]
    reads = [
        [producer[name] for name in [*node.input, *free[i]] if name in producer]
        for i, node in enumerate(nodes)
    ]
    order = _topological(reads)

    above = [b""] * len(nodes)
    body_reads: list[list[tuple[str, bytes]]] = [[] for _ in nodes]
    for i in order:
        node = nodes[i]
        attributes = []
        for attribute in sorted(node.attribute, key=lambda a: a.name):
            graphs = [attribute.g] if attribute.type == AttributeProto.GRAPH else attribute.graphs
            body_keys = []
            for index, body in enumerate(graphs):
                body_key, uses = _canonical_order(body, scope, top=False)
                body_keys.append(body_key)
                body_reads[i] += [(name, _key(attribute.name, index, use)) for name, use in uses]
            attributes.append(_attribute_key(attribute, body_keys))
        above[i] = _key(
            "node",
            node.domain,
            node.op_type,
            getattr(node, "overload", ""),
            *attributes,
            "reads",
            *[scope.get(name) or _key("undefined", name) for name in node.input],
            "captures",
            *sorted(scope.get(name) or _key("undefined", name) for name in free[i]),
            "writes",
            *[bool(name) for name in node.output],
        )
        for position, name in enumerate(node.output):
            if name:
                keys[name] = _key(above[i], position)

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
        for name, use in body_reads[i]:
            readings[name].append(_key("captured", above[i], below[i], use))

    canonical = _topological(reads, [(above[i], below[i]) for i in range(len(nodes))])
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


def canonicalize(proto, name: str = "model") -> None:
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
    """
    _canonical_order(proto.graph, {}, top=True)
    compact_names(proto, name=name)
    _number_unknown_dims(proto)
    _drop_run_specific(proto)


def name_dynamic_axes(proto, inputs: list, outputs: list) -> None:
    """Give graph inputs and outputs the axis names of their Keras tensors."""
    by_name = {info.name: info for info in [*inputs, *outputs]}
    for value in [*proto.graph.input, *proto.graph.output]:
        info: TensorInfo | None = by_name.get(value.name)
        if info is None:
            continue
        dims = value.type.tensor_type.shape.dim
        for dim, axis_name in zip(dims, info.axis_names(), strict=False):
            if isinstance(axis_name, str):
                dim.ClearField("dim_value")
                dim.dim_param = axis_name


def _reshaped_dims(dims: list, shape: list) -> list | None:
    """ONNX Reshape's output dims (`allowzero` 0: a 0 copies the input's dim),
    or None where they do not hold the same number of elements."""
    out = [dims[i] if size == 0 and i < len(dims) else size for i, size in enumerate(shape)]
    total = int(np.prod(dims, dtype=np.int64))
    if out.count(-1) == 1:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        if known == 0 or total % known:
            return None
        out[out.index(-1)] = total // known
    if -1 in out or int(np.prod(out, dtype=np.int64)) != total:
        return None
    return out


def fold_weight_views(proto) -> int:
    """Fold `Reshape(W, constant)` and `Identity(W)` of an initializer read by
    that node alone into the initializer itself: a row-major reshape changes
    only its dims, never its bytes, so a weight in the data file stays where
    it is. Without this, ONNX Runtime folds them when the session starts,
    copying each weight it reshapes (measured: a 2.5 GB encoder's session
    held 3.5 GB instead of 2.5). Returns the number of nodes folded."""
    import onnx
    from onnx import numpy_helper

    graph = proto.graph
    initializers = {init.name: init for init in graph.initializer}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in {*node.input, *(n for b in subgraphs(node) for n in free_names(b))}:
            readers[name] = readers.get(name, 0) + 1
    outputs = {value.name for value in graph.output}
    renames, folded = {}, []
    for position, node in enumerate(graph.node):
        if node.op_type not in ("Reshape", "Identity") or not node.input:
            continue
        weight = initializers.get(node.input[0])
        if weight is None or readers.get(weight.name) != 1 or node.output[0] in outputs:
            continue
        if node.op_type == "Reshape":
            shape = initializers.get(node.input[1]) if len(node.input) > 1 else None
            allowzero = any(a.name == "allowzero" and a.i for a in node.attribute)
            if shape is None or allowzero or shape.data_location == onnx.TensorProto.EXTERNAL:
                continue
            dims = _reshaped_dims(list(weight.dims), numpy_helper.to_array(shape).tolist())
            if dims is None:
                continue
            del weight.dims[:]
            weight.dims.extend(dims)
        renames[node.output[0]] = weight.name
        folded.append(position)
    for position in reversed(folded):
        del graph.node[position]
    _rename_reads(graph, renames)
    return len(folded)


def remove_dead_nodes(proto) -> None:
    """Drop nodes whose outputs nothing reads, then unread initializers."""
    graph = proto.graph
    needed = {value.name for value in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(node.input)
            for body in subgraphs(node):  # a Loop body reads outer values unlisted
                needed.update(free_names(body))
    del graph.node[:]
    graph.node.extend(reversed(kept))
    # In place: re-adding a kept initializer copies it through serialisation,
    # which fails for one over 2 GiB.
    for position in reversed(range(len(graph.initializer))):
        if graph.initializer[position].name not in needed:
            del graph.initializer[position]


# Ops whose outputs differ from call to call on the same inputs: never merged.
_RANDOM_OPS = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
               "Multinomial", "Bernoulli", "Dropout"}  # fmt: skip
# ONNX Runtime's ops that compute a function of their inputs (others outside the
# ONNX domain, custom ones included, may draw at random or keep state).
_PURE_CONTRIB = {"BiasGelu", "FastGelu", "Gelu", "QuickGelu", "MultiHeadAttention",
                 "FusedMatMul", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization",
                 "MatMulIntegerToFloat", "DynamicQuantizeMatMul"}  # fmt: skip


def merge_common_subexpressions(proto) -> int:
    """Merge every node that computes what an earlier node computes: the same
    op, attributes and inputs (after earlier merges). Nodes with subgraphs,
    random ops and nodes making a graph output are kept as they are. Returns
    how many nodes now read another's outputs instead (left for dead-node
    removal). onnxslim does this too, but only in its own pass; this one runs
    after the fusions, which `dims.share_equal_shapes` must follow."""
    graph = proto.graph
    outputs = {value.name for value in graph.output}
    seen, renames, merged = {}, {}, 0
    for node in graph.node:  # in topological order, as ONNX requires
        for index, name in enumerate(node.input):
            if name in renames:
                node.input[index] = renames[name]
        pure = node.domain in ("", "ai.onnx") or (
            node.domain == "com.microsoft" and node.op_type in _PURE_CONTRIB
        )
        if not pure or node.op_type in _RANDOM_OPS or subgraphs(node):
            continue
        if outputs.intersection(node.output):
            continue
        attributes = sorted(a.SerializeToString(deterministic=True) for a in node.attribute)
        # Which optional outputs are made is part of the key: an omitted one
        # ("") must never be renamed to, or from, a real one.
        made = tuple(bool(name) for name in node.output)
        key = (node.domain, node.op_type, tuple(node.input), tuple(attributes), made)
        earlier = seen.setdefault(key, node)
        if earlier is not node:
            renames.update(
                (old, new) for old, new in zip(node.output, earlier.output, strict=True) if old
            )
            merged += 1
    if renames:
        _rename_reads(graph, renames)  # subgraphs read outer values too
    return merged


def slim(
    proto, inputs: list, outputs: list, run_onnxslim: bool = True, model_name: str = "model"
) -> SlimmedModel:
    """Slim the graph. `run_onnxslim=False` for protos past 2 GB, which onnxslim
    and ONNX shape inference cannot serialise; the other passes still run."""
    start = time.perf_counter()
    before = len(proto.graph.node)
    fused = {"LayerNormalization": 0, "MatMul": 0, "MultiHeadAttention": 0}
    fused["SimplifiedLayerNormalization"] = 0
    fused["RotaryEmbedding"] = 0
    fused |= dict.fromkeys(fusions.GELU_FUSED, 0)
    # (candidate's output, why it was left alone), by fusion.
    declined = {"MultiHeadAttention": [], "SimplifiedLayerNormalization": [], "Gelu": []}
    declined["RotaryEmbedding"] = []
    # First: a decoder's stacked caches, picked apart again, are most of its
    # nodes and of its time per token (`keras_layers.export.stacks`).
    picks = stacks.fold_stack_picks(proto)
    if picks:
        remove_dead_nodes(proto)
        stacks.fold_shapes_of_stacks(proto)
    if run_onnxslim:
        import onnxslim

        proto = onnxslim.slim(proto)
        # Shape inference, like onnxslim, cannot take a proto past 2 GB. One
        # pass serves both fusions: each rewrite keeps its output's name and
        # shape, so the shapes stay true for every tensor the other reads.
        shapes = fusions.tensor_shapes(proto)
        fused["LayerNormalization"] = fusions.fuse_layer_norms(proto, fusions.tensor_ranks(shapes))
    else:  # onnxslim, which folds these (copying), did not run
        fold_weight_views(proto)
    fused["MatMul"] = fusions.fuse_tensordot_matmuls(proto)
    if run_onnxslim:
        attention = declined["MultiHeadAttention"]
        # A decoder with a cache (its cache inputs name a past axis) mostly
        # runs one query at a time: see `fusions.fuse_attention`.
        cached = any(info.axes and causal_lm.PAST_AXIS in info.axes for info in inputs)
        fused["MultiHeadAttention"] = fusions.fuse_attention(proto, shapes, attention, cached)
        # After attention, whose match needs shape inference: ONNX knows no
        # SimplifiedLayerNormalization, so inference stops at one.
        # The nodes the fusions above replaced would be candidates too.
        remove_dead_nodes(proto)
        norms = declined["SimplifiedLayerNormalization"]
        fused["SimplifiedLayerNormalization"] = fusions.fuse_rms_norms(proto, shapes, norms)
    # After the Dense fusion, which puts each bias Add right after a MatMul.
    # It serialises nothing, so protos past 2 GB get it too.
    fused |= fusions.fuse_gelus(proto, declined["Gelu"])
    # Last of the rewrites, as the fusions match `Shape`s of the very tensors
    # they reshape: the per-layer copies of the masks and rotary tables that
    # keras-hub's decoders build from `Shape` of each hidden state become one
    # copy once those `Shape`s are one. The input axes' names say which axes
    # are one size (the validation grid feeds them so), and `dims` reads them.
    name_dynamic_axes(proto, inputs, outputs)
    # Every run has a batch and each sequence at least 1 long, a cached
    # decoder's new tokens too (every call feeds one or more); its past (its
    # cache inputs name their own axes) may be empty.
    positive = {"batch"} | {
        info.sequence for info in inputs if info.axes is None and info.role != "positions"
    }
    positive |= {info.axes[1] for info in inputs if info.axes and info.role == "ids"}
    if run_onnxslim:
        # Its proof reads the named axes; before the sharing, which merges
        # the layers' copies of the angle tables it builds.
        fused["RotaryEmbedding"] = rotary.fuse_rotary_embeddings(
            proto, shapes, positive, declined["RotaryEmbedding"]
        )
    shared = dims.share_equal_shapes(proto, positive)
    if shared:
        merge_common_subexpressions(proto)
    remove_dead_nodes(proto)
    changes = deduplicate_initializers(proto)
    initializer_bytes = {init.name: _tensor_bytes(init) for init in proto.graph.initializer}
    # Last: every pass above may add, drop or reorder nodes.
    canonicalize(proto, name=model_name)
    return SlimmedModel(
        proto=proto,
        nodes_before=before,
        nodes_after=len(proto.graph.node),
        deduplicated=changes,
        fused=fused,
        seconds=time.perf_counter() - start,
        initializer_bytes=initializer_bytes,
        stack_picks_folded=picks,
        shapes_shared=shared,
        declined={
            fusion: dict(Counter(reason for _, reason in reasons).most_common())
            for fusion, reasons in declined.items()
            if reasons
        },
    )
