"""Exports made wrong the ways exports go wrong: mutations of an ONNX file.

`keras_layers.export.validate` claims that ONNX Runtime computes what Keras
computes. A check is worth what it can fail: each `Mutation` here takes a
correct file and breaks it the way a real export bug would (the padding mask
lost on the way into the fused attention, an epsilon taken from the other
framework's defaults, the 1/sqrt(head size) forgotten, ...), and
tests/test_mutants.py and benchmarks/mutation.py check that the validator,
with its default settings, fails every mutant.

A mutation finds its structure in the graph and changes a copy; where the
structure is absent it says why (`Mutant.reason`) instead of breaking
something else. What it changes is listed in `Mutant.where`, one line per
site. A mutant stays a valid ONNX model that ONNX Runtime loads and runs, so
a mutant that survives is the validator's miss, never a load error.

| mutation | the bug it stands for |
|---|---|
| `mask_ignored` | the padding mask never reaches the attention (or the recurrence) |
| `weight_scaled` | one weight 1% off (a stale or re-rounded copy of it) |
| `late_weight_scaled` | the weight of the layer nearest an output 1% off (a late layer's copy) |
| `positions_swapped` | positions 0 and 1 swapped (in the table, or before the sinusoid) |
| `layernorm_epsilon` | every norm's epsilon taken from the other framework's default |
| `attention_scale_dropped` | the attention's 1/sqrt(head size) left out |
| `embedding_scale_dropped` | the embedding's sqrt(d_model) left out |
| `softcap_dropped` | a logit softcap (`cap * tanh(x / cap)`) left out |
| `head_zeroed` | one attention head's output lost (a wrong head split) |
| `channels_swapped` | an image input's channels reversed, RGB <-> BGR (the other library's order) |

Imports numpy and onnx only: benchmarks read it without TensorFlow.
"""

import hashlib
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MICROSOFT = "com.microsoft"
FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)
# Ops that mix a value with weights or with other positions: a value computed
# through one of them is no longer a plain mask.
PRODUCTS = {"MatMul", "Gemm", "Einsum", "Conv", "ConvTranspose", "FusedMatMul", "MatMulInteger"}
MIXING = PRODUCTS | {"Softmax", "LSTM", "GRU", "RNN", "Loop", "Scan"}
# Ops that move or copy a value without changing it elementwise.
LAYOUT = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Expand", "Identity", "Cast", "Tile"}
# Ops whose output has the largest rank of their inputs (elementwise, with
# broadcasting; products of matrices; the ONNX Runtime ops that keep shapes).
PASSES_RANK = {
    "Add", "Sub", "Mul", "Div", "Pow", "Where", "Equal", "Greater", "Less", "And", "Or",
    "Not", "Cast", "Identity", "Softmax", "Tanh", "Sigmoid", "Relu", "Erf", "Sqrt",
    "Reciprocal", "Neg", "MatMul", "RotaryEmbedding", "LayerNormalization",
    "SimplifiedLayerNormalization", "Gelu", "FastGelu", "Min", "Max",
}  # fmt: skip
FUSED_ATTENTION = {
    ("MultiHeadAttention", MICROSOFT),
    ("Attention", MICROSOFT),
    ("GroupQueryAttention", MICROSOFT),
    ("Attention", ""),  # ONNX's own, opset 23
}
# The inputs of each fused attention that carry the padding mask, and how each
# is made neutral: dropped (an optional mask), turned into a neutral value
# (an additive bias, or a boolean mask), or, for GroupQueryAttention, whose
# `seqlens_k` is required, set to every row's full length.
DROP, NEUTRAL, FULL_LENGTH = "drop", "neutral", "full length"
MASK_INPUTS = {
    ("MultiHeadAttention", MICROSOFT): {4: DROP, 5: NEUTRAL},  # key_padding_mask, attention_bias
    ("Attention", MICROSOFT): {3: DROP, 5: NEUTRAL},  # mask_index, attention_bias
    ("GroupQueryAttention", MICROSOFT): {5: FULL_LENGTH, 10: NEUTRAL},  # seqlens_k, attention_bias
    ("Attention", ""): {3: NEUTRAL, 6: DROP},  # attn_mask, nonpad_kv_seqlen
}
RECURRENT = {"LSTM", "GRU", "RNN"}  # input 4: sequence_lens
NORMS = {
    "LayerNormalization",
    "SkipLayerNormalization",
    "SimplifiedLayerNormalization",
    "SkipSimplifiedLayerNormalization",
    "RMSNormalization",
}
# The identity element of each op that combines two mask terms: making one
# operand this value leaves the other term alone (`Min` and `Max` of masks
# valued 0 or 1, as keras-hub combines a padding and a causal mask).
IDENTITY = {"And": True, "Or": False, "Add": 0, "Mul": 1, "Min": 1, "Max": 0}
# For a comparison of a mask with a constant c, the value the mask must take
# for the comparison to be true, and to be false.
COMPARISONS = {
    "Greater": (1, 0),
    "GreaterOrEqual": (0, -1),
    "Less": (-1, 0),
    "LessOrEqual": (0, 1),
    "Equal": (0, 1),
}

# The LayerNorm epsilons the frameworks default to. Keras' LayerNormalization
# defaults to 1e-3; PyTorch's to 1e-5, and the Hugging Face configurations go
# smaller still (BERT 1e-12, Llama 1e-6). The classic bug is a model moved
# across that line with the other side's default: a PyTorch-family epsilon
# (below 1e-4) becomes Keras' 1e-3, and Keras' becomes PyTorch's 1e-5.
KERAS_EPSILON = 1e-3
TORCH_EPSILON = 1e-5
EPSILON_LINE = 1e-4
# How much `weight_scaled` and `late_weight_scaled` scale their weight.
WEIGHT_FACTOR = 1.01
# The channels of an image `channels_swapped` reverses: RGB, as Keras'
# image models take it (BGR is OpenCV's and Caffe's order), as floats or as
# the decoded bytes an image task's converter takes.
COLOUR_CHANNELS = 3
PIXEL_TYPES = (*FLOATS, TensorProto.UINT8)


def wrong_epsilon(epsilon: float) -> float:
    """The other framework family's default for a norm of `epsilon` (see `KERAS_EPSILON`)."""
    return KERAS_EPSILON if epsilon < EPSILON_LINE else TORCH_EPSILON


@dataclass(frozen=True)
class Mutant:
    """What one mutation did to one file.

    `proto` is the changed copy, or None when the mutation does not apply;
    `where` lists each change (what, where, the old and new values);
    `reason` says why the mutation does not apply.
    """

    mutation: str
    proto: onnx.ModelProto | None
    where: tuple = ()
    reason: str | None = None

    @property
    def applied(self) -> bool:
        return self.proto is not None


@dataclass(frozen=True)
class Mutation:
    """One way to make an export wrong.

    `change(graph)` edits the `Graph` in place and returns the list of what it
    changed, or a string: the reason it does not apply (then nothing changed).
    """

    name: str
    description: str
    change: Callable[["Graph"], "list[str] | str"]

    def apply(self, proto: onnx.ModelProto) -> Mutant:
        """A mutant of `proto` (which is left as it is)."""
        copy = onnx.ModelProto()
        copy.CopyFrom(proto)
        graph = Graph(copy)
        outcome = self.change(graph)
        if isinstance(outcome, str):
            return Mutant(self.name, None, (), outcome)
        graph.finish()
        return Mutant(self.name, copy, tuple(outcome))


# --- the graph, as the mutations read and edit it ------------------------------


def _subgraphs(node) -> list:
    graphs = []
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            graphs.append(attribute.g)
        elif attribute.type == onnx.AttributeProto.GRAPHS:
            graphs.extend(attribute.graphs)
    return graphs


def _outer_names(graph) -> set:
    """The names a (sub)graph reads from the scopes around it."""
    defined = {value.name for value in graph.input} | {t.name for t in graph.initializer}
    defined |= {name for node in graph.node for name in node.output}
    used = set()
    for node in graph.node:
        used.update(node.input)
        for body in _subgraphs(node):
            used |= _outer_names(body)
    return {name for name in used if name and name not in defined}


def _all_names(graph, names: set) -> set:
    names |= {value.name for value in graph.input} | {t.name for t in graph.initializer}
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
        for body in _subgraphs(node):
            _all_names(body, names)
    return names


def _rename_reads(graph, old: str, new: str) -> None:
    """Every read of `old` in `graph` and the graphs inside it now reads `new`."""
    for node in graph.node:
        for index, name in enumerate(node.input):
            if name == old:
                node.input[index] = new
        for body in _subgraphs(node):
            _rename_reads(body, old, new)


def attribute(node, name: str, default=None):
    for entry in node.attribute:
        if entry.name == name:
            return helper.get_attribute_value(entry)
    return default


def set_attribute(node, name: str, value) -> None:
    for index, entry in enumerate(node.attribute):
        if entry.name == name:
            del node.attribute[index]
            break
    node.attribute.append(helper.make_attribute(name, value))


def describe(node) -> str:
    """A node as the `where` lines name it: its op and its name or first output."""
    return f"{node.op_type} {node.name!r}" if node.name else f"{node.op_type} -> {node.output[0]!r}"


def _type_view(proto) -> onnx.ModelProto:
    """`proto` with its large initializers as typed graph inputs instead: shape
    inference needs their types and shapes, not their values."""
    view = onnx.ModelProto()
    view.CopyFrom(proto)
    kept = []
    for tensor in view.graph.initializer:
        if np.prod(tensor.dims, dtype=np.int64) > 64:
            view.graph.input.append(
                helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            )
        else:
            kept.append(tensor)
    del view.graph.initializer[:]
    view.graph.initializer.extend(kept)
    return view


class Graph:
    """A model's main graph, indexed for the mutations, with the edits they make.

    Nodes are edited in place; new nodes are queued before or after an
    existing one and put in place by `finish`, so the order stays topological.
    For each value it knows its producer, its readers, its element type and
    shape where inference finds them, which graph inputs it reads the values
    of (reading only a shape does not count), and whether it went through a
    product, a softmax or a recurrence (`mixed`).
    """

    def __init__(self, proto: onnx.ModelProto):
        self.proto = proto
        graph = proto.graph
        self.nodes = list(graph.node)
        self.initializers = {tensor.name: tensor for tensor in graph.initializer}
        self.inputs = [value.name for value in graph.input if value.name not in self.initializers]
        self.producer = {name: node for node in self.nodes for name in node.output if name}
        self.consumers = defaultdict(list)
        self.outer = {}  # id(node) -> what its subgraphs read from the main graph
        for node in self.nodes:
            for index, name in enumerate(node.input):
                if name:
                    self.consumers[name].append((node, index))
            self.outer[id(node)] = set().union(*map(_outer_names, _subgraphs(node)))
        self._names = _all_names(graph, set())
        self._counter = 0
        self._before, self._after = defaultdict(list), defaultdict(list)
        self._constants = {}
        self._types, self._shapes = self._infer()
        self._reads, self._mixed = self._dataflow()
        self._positions = {id(node): index for index, node in enumerate(self.nodes)}
        self._ranks = self._rank_fallback()

    # -- reading --

    def _infer(self) -> tuple[dict, dict]:
        try:
            inferred = onnx.shape_inference.infer_shapes(_type_view(self.proto)).graph
        except Exception:  # noqa: BLE001 - inference is a help, not a must
            inferred = self.proto.graph
        types, shapes = {}, {}
        for value in [*inferred.input, *inferred.output, *inferred.value_info]:
            tensor = value.type.tensor_type
            if tensor.elem_type:
                types[value.name] = tensor.elem_type
            if tensor.HasField("shape"):
                shapes[value.name] = [
                    dim.dim_value if dim.HasField("dim_value") else None for dim in tensor.shape.dim
                ]
        for tensor in self.proto.graph.initializer:
            types[tensor.name] = tensor.data_type
            shapes[tensor.name] = list(tensor.dims)
        return types, shapes

    def _dataflow(self) -> tuple[dict, dict]:
        reads = {name: frozenset([name]) for name in self.inputs}
        mixed = {}
        for node in self.nodes:  # topological order
            sources = [name for name in node.input if name] + sorted(self.outer[id(node)])
            data = self.initializers.get(node.input[0]) if node.input else None
            lookup = node.op_type == "Gather" and data is not None and data.data_type in FLOATS
            if node.op_type in ("Shape", "Size"):  # only the shape: no value read
                read, mix = frozenset(), False
            else:
                read = frozenset().union(*(reads.get(name, frozenset()) for name in sources))
                mix = (
                    node.op_type in MIXING
                    or node.domain == MICROSOFT
                    or lookup  # an embedding lookup
                    or any(mixed.get(name, False) for name in sources)
                )
            for name in node.output:
                reads[name], mixed[name] = read, mix
        return reads, mixed

    def reads(self, name: str) -> frozenset:
        """The graph inputs whose values `name` depends on."""
        return self._reads.get(name, frozenset())

    def mixed(self, name: str) -> bool:
        """Whether `name` went through a product, softmax, recurrence or lookup."""
        return self._mixed.get(name, False)

    def mask_term(self, name: str) -> bool:
        """Whether `name` is computed from the inputs' values by elementwise
        and layout ops alone: a mask, or a bias made of one."""
        return bool(self.reads(name)) and not self.mixed(name)

    def constant(self, name: str):
        """The value of an initializer or `Constant` output, or None."""
        if name in self._constants:
            return self._constants[name]
        value = None
        if name in self.initializers:
            value = numpy_helper.to_array(self.initializers[name])
        elif (node := self.producer.get(name)) is not None and node.op_type == "Constant":
            for entry in node.attribute:
                found = helper.get_attribute_value(entry)
                tensor = entry.type == onnx.AttributeProto.TENSOR
                value = numpy_helper.to_array(found) if tensor else np.array(found)
        self._constants[name] = value
        return value

    def scalar(self, name: str):
        """The value of a one-element constant, or None."""
        value = self.constant(name)
        return value.reshape(-1)[0].item() if value is not None and value.size == 1 else None

    def dtype(self, name: str) -> int | None:
        """The element type of `name` (TensorProto enum), from inference or its producer."""
        if name in self._types:
            return self._types[name]
        node = self.producer.get(name)
        if node is None:
            return None
        if node.op_type in {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not"}:
            return TensorProto.BOOL
        if node.op_type in {"And", "Or", "Xor", "IsNaN", "IsInf"}:
            return TensorProto.BOOL
        if node.op_type == "Cast":
            return attribute(node, "to")
        if node.op_type in ("Shape", "Size"):
            return TensorProto.INT64
        if node.op_type == "Where":
            return self.dtype(node.input[1])
        return self.dtype(node.input[0]) if node.input and node.input[0] else None

    def _rank_fallback(self) -> dict:
        """Ranks where inference stops (after an ONNX Runtime op it does not
        know, such as RotaryEmbedding), from the few ops attention is made of."""
        ranks = {name: len(shape) for name, shape in self._shapes.items()}
        for node in self.nodes:
            if not node.output or node.output[0] in ranks:
                continue
            known = [ranks[name] for name in node.input if name in ranks]
            rank = None
            if node.op_type == "Reshape" and (target := self.constant(node.input[1])) is not None:
                rank = target.size
            elif node.op_type == "Transpose" and (perm := attribute(node, "perm")):
                rank = len(perm)
            elif node.op_type in ("Unsqueeze", "Squeeze") and node.input[0] in ranks:
                axes = attribute(node, "axes")
                if axes is None and len(node.input) > 1:
                    axes = self.constant(node.input[1])
                if axes is not None:
                    step = 1 if node.op_type == "Unsqueeze" else -1
                    rank = ranks[node.input[0]] + step * np.size(axes)
            elif node.op_type in PASSES_RANK and known:
                rank = max(known)
            if rank is not None:
                ranks[node.output[0]] = int(rank)
        return ranks

    def rank(self, name: str) -> int | None:
        return self._ranks.get(name)

    def shape(self, name: str) -> list | None:
        """`name`'s dimensions where inference finds them (None for a free one)."""
        return self._shapes.get(name)

    def position(self, node) -> int:
        return self._positions[id(node)]

    # -- editing --

    def fresh(self, stem: str) -> str:
        while True:
            self._counter += 1
            name = f"mutant_{stem}_{self._counter}"
            if name not in self._names:
                self._names.add(name)
                return name

    def add_constant(self, value: np.ndarray, stem: str) -> str:
        name = self.fresh(stem)
        self.proto.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def typed(self, value, elem_type: int) -> np.ndarray:
        return np.array(value, dtype=helper.tensor_dtype_to_np_dtype(elem_type))

    def insert_before(self, node, nodes: list) -> None:
        self._before[id(node)].extend(nodes)

    def insert_after(self, node, nodes: list) -> None:
        self._after[id(node)].extend(nodes)

    def filled_like(self, name: str, value, before) -> str:
        """A new value of `name`'s shape and type, every element `value`."""
        elem_type = self.dtype(name)
        if elem_type is None:
            raise ValueError(f"the element type of {name!r} is unknown")
        shape, filled = self.fresh("shape"), self.fresh("neutral")
        fill = numpy_helper.from_array(self.typed([value], elem_type), "value")
        self.insert_before(
            before,
            [
                helper.make_node("Shape", [name], [shape]),
                helper.make_node("ConstantOfShape", [shape], [filled], value=fill),
            ],
        )
        return filled

    def finish(self) -> None:
        """Put the queued nodes in place."""
        ordered = []
        for node in self.nodes:
            for item in [*self._before[id(node)], node, *self._after[id(node)]]:
                copy = onnx.NodeProto()
                copy.CopyFrom(item)
                ordered.append(copy)
        del self.proto.graph.node[:]
        self.proto.graph.node.extend(ordered)


# --- mask_ignored ---------------------------------------------------------------


def _neutral_for(g: Graph, node, index: int):
    """The value of `node.input[index]` under which `node` ignores it (the
    mask term read there): None where there is none."""
    op = node.op_type
    if op == "Where" and index == 0:
        kept, filled = g.mixed(node.input[1]), g.mixed(node.input[2])
        if kept != filled:
            return kept  # select the scores, never the fill value
        return None
    if op == "Add" or (op == "Sub" and index == 1):
        return 0
    if op in ("And", "Or", "Mul"):
        return IDENTITY[op]
    return None


def _same_kind(value, identity) -> bool:
    return isinstance(value, bool) == isinstance(identity, bool) and value == identity


def _isolate(g: Graph, name: str, neutral) -> tuple:
    """Follow the mask term `name` back to the part of it that reads the
    inputs: through copies and casts, `Not`, a comparison with a constant, a
    select whose other branch is already `neutral`, and a combination (`And`,
    `Min`, `Add`, ...) with a term that reads no input (a causal mask, a
    relative position bias), which is kept.

    Returns the path, as `(node, index)` steps from `name`'s producer down
    (each step goes into `node.input[index]`), and the neutral value of the
    last input the path reads."""
    path = []
    for _ in range(64):
        producer = g.producer.get(name)
        if producer is None or producer.domain not in ("", "ai.onnx"):
            break
        op = producer.op_type
        index = 0
        if op in LAYOUT or op in ("Slice", "Gather"):  # a part of a neutral value is neutral
            pass
        elif op == "Not":
            neutral = not neutral
        elif op in COMPARISONS and g.scalar(producer.input[1]) is not None:
            if not isinstance(neutral, bool) or producer.input[0] in g.inputs:
                break  # token ids compared with the padding id: the comparison is the mask
            offset = COMPARISONS[op][0 if neutral else 1]
            neutral = g.scalar(producer.input[1]) + offset
        elif op in IDENTITY and _same_kind(neutral, IDENTITY[op]):
            terms = [i for i, entry in enumerate(producer.input) if entry and g.mask_term(entry)]
            if len(terms) != 1:
                break
            index = terms[0]
        elif op == "Where":
            branches = [g.constant(entry) for entry in producer.input[1:]]
            same = [value is not None and bool(np.all(value == neutral)) for value in branches]
            if same[0] == same[1]:
                break
            neutral = same[0]
        else:
            break
        path.append((producer, index))
        name = producer.input[index]
    return path, neutral


def _neutralize(g: Graph, readers: list, name: str, neutral) -> str:
    """Make the mask term `name` neutral for `readers` (its `(node, index)`
    edges into the attentions) only: the path down to the term's input-reading
    part is copied, the copy reads a neutral value, and whatever else reads
    the mask (the zeroing of rows that see no key, a pooling) keeps it."""
    path, value = _isolate(g, name, neutral)
    first = min((reader for reader, _ in readers), key=g.position)
    deep = path[-1][0].input[path[-1][1]] if path else name
    replacement = g.filled_like(deep, value, first)
    value = g.typed([value], g.dtype(deep))[0].item()  # as the mask holds it: True, 1, 1.0
    for node, index in reversed(path):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = g.fresh("unmasked")
        copy.output[:] = [g.fresh("unmasked") for _ in node.output]
        copy.input[index] = replacement
        g.insert_before(first, [copy])
        replacement = copy.output[0]
    for reader, index in readers:
        reader.input[index] = replacement
    edges = ", ".join(f"{describe(reader)} input {index}" for reader, index in readers)
    if not path:
        return f"{edges} ({name!r}) -> all {value!r}"
    return (
        f"{edges} ({name!r}): {deep!r} -> all {value!r} in a copy of the {len(path)} "
        f"nodes between ({', '.join(node.op_type for node, _ in path)})"
    )


def _softmax_mask_edge(g: Graph, softmax):
    """The edge nearest to `softmax` where a mask term joins its logits, or None."""
    queue, seen = deque([(softmax, 0)]), set()
    while queue:
        node, index = queue.popleft()
        name = node.input[index]
        if name in seen:
            continue
        seen.add(name)
        if g.mask_term(name):
            return node, index
        producer = g.producer.get(name)
        if producer is None or producer.op_type in PRODUCTS or producer.domain == MICROSOFT:
            continue
        queue.extend((producer, i) for i, entry in enumerate(producer.input) if entry)
    return None


def _seqlens_full(g: Graph, node) -> str:
    """GroupQueryAttention's `seqlens_k` (each row's last valid key) replaced by
    the last key of the whole batch: no key is padding."""
    batch, last, full = g.fresh("batch"), g.fresh("last_key"), g.fresh("seqlens_k")
    one = g.add_constant(np.array(1, np.int32), "one")
    g.insert_before(
        node,
        [
            helper.make_node("Shape", [node.input[0]], [batch], start=0, end=1),
            helper.make_node("Sub", [node.input[6], one], [last]),
            helper.make_node("Expand", [last, batch], [full]),
        ],
    )
    old, node.input[5] = node.input[5], full
    return f"{describe(node)} seqlens_k ({old!r}) -> total_sequence_length - 1 for every row"


def _loop_masks(g: Graph, node) -> list:
    """A recurrence unrolled into a Loop or Scan reads the mask in its body:
    every boolean mask term it reads from outside becomes all true (Keras'
    masks are true at real tokens)."""
    where = []
    explicit = list(enumerate(node.input))[2 if node.op_type == "Loop" else 0 :]
    for index, name in explicit:
        if name and g.mask_term(name) and g.dtype(name) == TensorProto.BOOL:
            node.input[index] = g.filled_like(name, True, node)
            where.append(f"{describe(node)} input {index} ({name!r}) -> all true")
    for name in sorted(g.outer[id(node)]):
        if g.mask_term(name) and g.dtype(name) == TensorProto.BOOL:
            neutral = g.filled_like(name, True, node)
            for body in _subgraphs(node):
                _rename_reads(body, name, neutral)
            where.append(f"{describe(node)} body's read of {name!r} -> all true")
    return where


def mask_ignored(g: Graph):
    edges, where = [], []
    for node in g.nodes:
        key = (node.op_type, node.domain or "")
        if key in MASK_INPUTS:
            for index, how in MASK_INPUTS[key].items():
                if index >= len(node.input) or not node.input[index]:
                    continue
                name = node.input[index]
                if how == DROP:
                    node.input[index] = ""
                    where.append(f"{describe(node)} input {index} ({name!r}) dropped")
                elif how == FULL_LENGTH:
                    where.append(_seqlens_full(g, node))
                elif g.mask_term(name):
                    neutral = True if g.dtype(name) == TensorProto.BOOL else 0
                    edges.append((node, index, neutral))
        elif node.op_type == "Softmax":
            edge = _softmax_mask_edge(g, node)
            if edge is not None:
                neutral = _neutral_for(g, *edge)
                if neutral is not None:
                    edges.append((*edge, neutral))
        elif node.op_type in RECURRENT and len(node.input) > 4 and node.input[4]:
            if g.reads(node.input[4]):
                name, node.input[4] = node.input[4], ""
                where.append(f"{describe(node)} sequence_lens ({name!r}) dropped")
        elif node.op_type in ("Loop", "Scan"):
            where += _loop_masks(g, node)
    by_term = defaultdict(list)  # one copy per mask term, however many attentions read it
    for node, index, neutral in edges:
        by_term[(node.input[index], neutral)].append((node, index))
    for (name, neutral), readers in by_term.items():
        where.append(_neutralize(g, readers, name, neutral))
    return where or (
        "no mask term reads the inputs: no fused attention has a mask input, no softmax's "
        "logits are masked by a value computed from the inputs (a causal mask alone is not "
        "the padding mask), and no recurrence reads a mask"
    )


# --- weight_scaled ----------------------------------------------------------------

WEIGHT_READERS = PRODUCTS | {"Attention"}
NO_PRODUCT_WEIGHT = (
    "no float initializer of two or more dimensions is read by a MatMul, Gemm, Conv, "
    "Einsum or fused Attention"
)


def _product_weights(g: Graph, node) -> list:
    """The float initializers of two or more dimensions that `node` reads, if it is a product."""
    if node.op_type not in WEIGHT_READERS:
        return []
    return [
        name
        for name in node.input
        if (tensor := g.initializers.get(name)) is not None
        and tensor.data_type in FLOATS
        and len(tensor.dims) >= 2
    ]


def _size_then_digest(g: Graph, name: str) -> tuple:
    """The larger weight first, then the one whose values digest lower: an
    order by what the weight is, never by node order or names, which differ
    from one export process to the next."""
    value = numpy_helper.to_array(g.initializers[name])
    return (-value.size, hashlib.sha256(value.tobytes()).hexdigest())


def weight_scaled(g: Graph):
    """The largest float weight of two or more dimensions that a product reads
    (ties broken by a digest of its values) times `WEIGHT_FACTOR`."""
    candidates = dict.fromkeys(name for node in g.nodes for name in _product_weights(g, node))
    if not candidates:
        return NO_PRODUCT_WEIGHT
    name = min(candidates, key=lambda name: _size_then_digest(g, name))
    tensor = g.initializers[name]
    value = numpy_helper.to_array(tensor)
    tensor.CopyFrom(numpy_helper.from_array((value * WEIGHT_FACTOR).astype(value.dtype), name))
    readers = ", ".join(describe(reader) for reader, _ in g.consumers[name])
    return [f"initializer {name!r} {list(tensor.dims)} x {WEIGHT_FACTOR} (read by {readers})"]


def _steps_to_outputs(g: Graph) -> dict:
    """`id(node)` -> the nodes on the shortest path from `node` to a graph
    output, `node` included: 1 for a node that writes one."""
    steps, queue = {}, deque()
    for output in g.proto.graph.output:
        node = g.producer.get(output.name)
        if node is not None and id(node) not in steps:
            steps[id(node)] = 1
            queue.append(node)
    while queue:
        node = queue.popleft()
        for name in [*node.input, *sorted(g.outer[id(node)])]:
            producer = g.producer.get(name)
            if producer is not None and id(producer) not in steps:
                steps[id(producer)] = steps[id(node)] + 1
                queue.append(producer)
    return steps


def late_weight_scaled(g: Graph):
    """The weight of the product nearest a graph output (fewest nodes away;
    ties broken as `weight_scaled` breaks them) times `WEIGHT_FACTOR`, as that
    product reads it: a weight other nodes read too (a tied embedding) is
    scaled in a copy, so that only the late layer is off."""
    steps = _steps_to_outputs(g)
    candidates = [
        (steps[id(node)], node, name)
        for node in g.nodes
        if id(node) in steps
        for name in _product_weights(g, node)
    ]
    if not candidates:
        return NO_PRODUCT_WEIGHT + " on the way to an output"
    distance, node, name = min(
        candidates, key=lambda found: (found[0], *_size_then_digest(g, found[2]))
    )
    tensor = g.initializers[name]
    value = numpy_helper.to_array(tensor)
    scaled = (value * WEIGHT_FACTOR).astype(value.dtype)
    others = sorted({describe(reader) for reader, _ in g.consumers[name] if reader is not node})
    if others:
        copy = g.add_constant(scaled, "late_weight")
        node.input[:] = [copy if entry == name else entry for entry in node.input]
        kept = f"in a copy ({', '.join(others)} keep the original)"
    else:
        tensor.CopyFrom(numpy_helper.from_array(scaled, name))
        kept = "its only reader"
    return [
        f"{describe(node)}, {distance} node(s) from an output: initializer {name!r} "
        f"{list(tensor.dims)} x {WEIGHT_FACTOR}, {kept}"
    ]


# --- positions_swapped ---------------------------------------------------------------


def _positional(g: Graph, indices: str) -> bool:
    """Whether gather indices are positions: computed from shapes alone, or
    from an input named for positions."""
    return all("position" in name for name in g.reads(indices))


def _table(g: Graph, name: str):
    """The float initializer [positions, width] (or [1, positions, width]),
    positions >= 2, that `name` is or expands, and that no product reads as
    a weight; else None."""
    node = g.producer.get(name)
    if node is not None and node.op_type == "Expand":
        name = node.input[0]
    tensor = g.initializers.get(name)
    if tensor is None or tensor.data_type not in FLOATS:
        return None
    dims = list(tensor.dims)
    if not (len(dims) == 2 or (len(dims) == 3 and dims[0] == 1)) or dims[-2] < 2:
        return None
    if any(reader.op_type in WEIGHT_READERS for reader, _ in g.consumers[tensor.name]):
        return None  # a weight, not a table
    return tensor


def _token_embedding(g: Graph, name: str) -> bool:
    """Whether `name` is a lookup of the input's tokens in a float table,
    perhaps scaled, cast, or summed with another lookup (segments)."""
    node = g.producer.get(name)
    if node is None:
        return False
    if node.op_type == "Gather":
        data = g.initializers.get(node.input[0])
        return data is not None and data.data_type in FLOATS and not _positional(g, node.input[1])
    if node.op_type == "Cast":
        return _token_embedding(g, node.input[0])
    if node.op_type == "Mul" and (index := _scalar_operand(g, node)) is not None:
        return _token_embedding(g, node.input[1 - index])
    if node.op_type == "Add":
        return any(_token_embedding(g, entry) for entry in node.input)
    return False


def _position_table(g: Graph):
    """The first position table: a table (`_table`) read by a Gather of
    positions, sliced along the positions, or, where the sequence length is
    fixed and the lookup was folded into a constant, added to the token
    embedding. Returns the reader and the table, or None."""
    for node in g.nodes:
        if node.domain or not node.input:
            continue
        if node.op_type == "Gather" and (tensor := _table(g, node.input[0])) is not None:
            along = attribute(node, "axis", 0) % len(tensor.dims) == len(tensor.dims) - 2
            if along and _positional(g, node.input[1]):  # not a token or segment embedding
                return node, tensor
        elif node.op_type == "Slice" and (tensor := _table(g, node.input[0])) is not None:
            if not any(g.reads(name) for name in node.input[1:] if name):
                return node, tensor
        elif node.op_type == "Add":
            for index, name in enumerate(node.input):
                tensor = _table(g, name)
                if tensor is not None and _token_embedding(g, node.input[1 - index]):
                    return node, tensor
    return None


def _reaches_sinusoid(g: Graph, start) -> bool:
    queue, seen = deque([start]), set()
    while queue and len(seen) < 200:
        node = queue.popleft()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.op_type in ("Sin", "Cos"):
            return True
        if node.op_type in MIXING or node.domain == MICROSOFT:
            continue
        for name in node.output:
            queue.extend(reader for reader, _ in g.consumers[name])
    return False


def _swap_positions(g: Graph, node, readers: list) -> str:
    """Positions 0 and 1 of a Range swapped, for `readers` only."""
    positions = node.output[0]
    elem_type = g.dtype(node.input[0]) or g.dtype(positions)
    zero = g.add_constant(g.typed(0, elem_type), "position_0")
    one = g.add_constant(g.typed(1, elem_type), "position_1")
    is_0, is_1, half, swapped = (g.fresh(stem) for stem in ("is_0", "is_1", "half", "swapped"))
    g.insert_after(
        node,
        [
            helper.make_node("Equal", [positions, zero], [is_0]),
            helper.make_node("Equal", [positions, one], [is_1]),
            helper.make_node("Where", [is_1, zero, positions], [half]),
            helper.make_node("Where", [is_0, one, half], [swapped]),
        ],
    )
    for reader, index in readers:
        reader.input[index] = swapped
    names = ", ".join(describe(reader) for reader, _ in readers)
    return f"{describe(node)}: positions 0 and 1 swapped on the way to Sin/Cos (read by {names})"


def positions_swapped(g: Graph):
    found = _position_table(g)
    if found is not None:
        node, tensor = found
        table = numpy_helper.to_array(tensor).copy()
        rows = table if table.ndim == 2 else table[0]
        rows[[0, 1]] = rows[[1, 0]]
        tensor.CopyFrom(numpy_helper.from_array(table, tensor.name))
        where = f"position table {tensor.name!r} {list(tensor.dims)} read by {describe(node)}"
        return [f"{where}: rows 0 and 1 swapped"]
    where = []
    for node in g.nodes:
        if node.op_type == "Range" and not node.domain:
            readers = [
                (reader, index)
                for reader, index in g.consumers[node.output[0]]
                if _reaches_sinusoid(g, reader)
            ]
            if readers:
                where.append(_swap_positions(g, node, readers))
    return where or (
        "no position table (a float constant [positions, width] read by a Gather of positions, "
        "a Slice, or added to the token embedding) and no Range feeding Sin/Cos: the model "
        "encodes no absolute positions this way (relative bias, ALiBi, or none)"
    )


# --- layernorm_epsilon ----------------------------------------------------------------


def _decomposed_epsilon(g: Graph, node):
    """The index of the epsilon of `Add(variance, epsilon)` in a decomposed
    norm (ReduceMean before, Sqrt or Pow after), or None."""
    if node.op_type != "Add" or node.domain:
        return None
    readers = {reader.op_type for reader, _ in g.consumers[node.output[0]]}
    if not readers & {"Sqrt", "Pow"}:
        return None
    for index, name in enumerate(node.input):
        epsilon, other = g.scalar(name), g.producer.get(node.input[1 - index])
        if epsilon is not None and 0 < epsilon <= 1e-2 and other is not None:
            if other.op_type == "ReduceMean" and g.dtype(name) in FLOATS:
                return index
    return None


def layernorm_epsilon(g: Graph):
    where = []
    for node in g.nodes:
        if node.op_type in NORMS:
            old = attribute(node, "epsilon", 1e-5)
            new = wrong_epsilon(old)
            set_attribute(node, "epsilon", new)
            where.append(f"{describe(node)} epsilon {old:.3g} -> {new:.3g}")
        elif (index := _decomposed_epsilon(g, node)) is not None:
            name = node.input[index]
            old = g.scalar(name)
            new = wrong_epsilon(old)
            value = g.constant(name)
            node.input[index] = g.add_constant(np.full_like(value, new), "epsilon")
            where.append(f"{describe(node)} (decomposed norm) epsilon {old:.3g} -> {new:.3g}")
    return where or (
        "no norm: no fused LayerNormalization or RMS norm, and no Add(ReduceMean(...), "
        "epsilon) before a Sqrt or Pow"
    )


# --- scales ------------------------------------------------------------------------------


def _softcap(g: Graph, node):
    """`x` when `node` is `Mul(Tanh(Div(x, cap)), cap)` (or with `Mul(x, 1/cap)`), else None."""
    if node.op_type != "Mul":
        return None
    for index, name in enumerate(node.input):
        tanh = g.producer.get(name)
        if tanh is None or tanh.op_type != "Tanh" or g.scalar(node.input[1 - index]) is None:
            continue
        inner = g.producer.get(tanh.input[0])
        if (
            inner is not None
            and inner.op_type in ("Div", "Mul")
            and g.scalar(inner.input[1]) is not None
        ):
            return inner.input[0]
    return None


def _scalar_operand(g: Graph, node):
    """The index of the scalar constant of `Mul(x, c)`, `Mul(c, x)` or `Div(x, c)`, or None."""
    if node.op_type == "Div":
        return 1 if g.scalar(node.input[1]) is not None else None
    if node.op_type == "Mul":
        scalars = [i for i, name in enumerate(node.input) if g.scalar(name) is not None]
        return scalars[0] if len(scalars) == 1 else None
    return None


def _unscale(g: Graph, node, index: int) -> float:
    """`node` reads ones instead of its scalar constant `index` (a new
    initializer: other readers keep the old one); returns the old value."""
    name = node.input[index]
    node.input[index] = g.add_constant(np.ones_like(g.constant(name)), "unscaled")
    return g.scalar(name)


def _operand_scales(g: Graph, name: str) -> list:
    """Scales applied to a product's operand (the query, usually) before it."""
    sites = []
    for _ in range(16):
        node = g.producer.get(name)
        if node is None:
            break
        if node.op_type in LAYOUT or (node.op_type == "RotaryEmbedding"):
            name = node.input[0]
        elif (index := _scalar_operand(g, node)) is not None:
            sites.append((node, index))
            name = node.input[1 - index]
        else:
            break
    return sites


def _probabilities_reader(g: Graph, softmax):
    """The product that weighs values by `softmax`'s output (through a
    select, a cast or a transpose), or None: then the softmax is no attention."""
    name = softmax.output[0]
    for _ in range(4):
        readers = g.consumers[name]
        if len(readers) != 1:
            return None
        reader, index = readers[0]
        if reader.op_type in ("MatMul", "Einsum") and index == 0:
            return reader
        if reader.op_type not in ("Where", "Cast", "Identity", "Transpose"):
            return None
        name = reader.output[0]
    return None


def _logit_scales(g: Graph, softmax) -> list:
    """The scalar Muls and Divs on an attention's logits or on its query."""
    sites, name = [], softmax.input[0]
    for _ in range(24):
        node = g.producer.get(name)
        if node is None:
            break
        if node.op_type in ("Add", "Sub", "Where"):  # a mask or a bias: follow the scores
            scores = [entry for entry in node.input[(node.op_type == "Where") :] if g.mixed(entry)]
            if len(scores) != 1:
                break
            name = scores[0]
        elif node.op_type in LAYOUT:
            name = node.input[0]
        elif (capped := _softcap(g, node)) is not None:
            name = capped
        elif (index := _scalar_operand(g, node)) is not None:
            sites.append((node, index))
            name = node.input[1 - index]
        elif node.op_type in ("MatMul", "Einsum"):
            for operand in node.input:
                sites += _operand_scales(g, operand)
            break
        else:
            break
    return sites


def attention_scale_dropped(g: Graph):
    where, done = [], set()
    for node in g.nodes:
        if (node.op_type, node.domain or "") in FUSED_ATTENTION:
            old = attribute(node, "scale", 0.0)
            set_attribute(node, "scale", 1.0)
            was = f"{old:.4g}" if old else "1/sqrt(head size) (the default)"
            where.append(f"{describe(node)} scale {was} -> 1")
        elif node.op_type == "Softmax" and _probabilities_reader(g, node) is not None:
            for site, index in _logit_scales(g, node):
                if (id(site), index) in done:
                    continue
                done.add((id(site), index))
                old = _unscale(g, site, index)
                where.append(f"{describe(site)} {site.op_type.lower()} by {old:.4g} -> 1")
    return where or (
        "no attention scale: no fused attention, and no Mul or Div by a constant on an "
        "attention's logits or query (the scale may be folded into the query weights)"
    )


def embedding_scale_dropped(g: Graph):
    where = []
    for node in g.nodes:
        if node.op_type != "Gather" or node.domain or len(node.input) < 2:
            continue
        table = g.initializers.get(node.input[0])
        if table is None or table.data_type not in FLOATS or len(table.dims) != 2:
            continue
        if _positional(g, node.input[1]):
            continue  # a position table
        name, readers = node.output[0], []
        for _ in range(3):
            readers = g.consumers[name]
            if len(readers) == 1 and readers[0][0].op_type == "Cast":
                name = readers[0][0].output[0]
                continue
            break
        for reader, _ in readers:
            index = _scalar_operand(g, reader)
            if reader.op_type == "Mul" and index is not None and g.scalar(reader.input[index]) != 1:
                old = _unscale(g, reader, index)
                where.append(
                    f"{describe(reader)} after the lookup in {table.name!r}: x {old:.4g} -> x 1"
                )
    return where or (
        "no embedding scale: no Mul by a constant right after a token embedding's Gather "
        "(the model does not scale its embeddings)"
    )


def softcap_dropped(g: Graph):
    where = []
    for node in g.nodes:
        if (node.op_type, node.domain or "") in FUSED_ATTENTION and attribute(node, "softcap", 0.0):
            old = attribute(node, "softcap")
            set_attribute(node, "softcap", 0.0)
            where.append(f"{describe(node)} softcap {old:.4g} -> 0 (none)")
        elif node.op_type == "Tanh":
            readers = g.consumers[node.output[0]]
            if len(readers) != 1 or _softcap(g, readers[0][0]) is None:
                continue
            (mul, index) = readers[0]
            cap = g.scalar(mul.input[1 - index])
            node.op_type = "Identity"  # cap * (x / cap): x, up to rounding
            where.append(f"{describe(node)}: Tanh -> Identity (softcap {cap:.4g} dropped)")
    return (
        where or "no softcap: no Tanh between a division by a constant and a multiplication by one"
    )


# --- head_zeroed --------------------------------------------------------------------------


def _zero_fused_head(g: Graph, node, heads: int) -> str:
    """Head 0 of a fused attention's (batch, sequence, heads x size) output zeroed."""
    out = node.output[0]
    node.output[0] = g.fresh("attention")
    elem_type = g.dtype(node.input[0]) or TensorProto.FLOAT
    keep = g.typed(np.ones((heads, 1)), elem_type)
    keep[0] = 0
    split = g.add_constant(np.array([0, 0, heads, -1], np.int64), "split_heads")
    mask = g.add_constant(keep, "head_mask")
    parts, kept, shape = g.fresh("heads"), g.fresh("kept"), g.fresh("shape")
    g.insert_after(
        node,
        [
            helper.make_node("Reshape", [node.output[0], split], [parts]),
            helper.make_node("Mul", [parts, mask], [kept]),
            helper.make_node("Shape", [node.output[0]], [shape]),
            helper.make_node("Reshape", [kept, shape], [out]),
        ],
    )
    return f"{describe(node)}: head 0 of {heads} zeroed in its output"


def _zero_product_head(g: Graph, product, rank: int) -> str:
    """Head 0 of an attention's (batch, heads..., queries, size) product zeroed:
    the elements whose every head axis (1 to rank - 3) is at 0."""
    out = product.output[0]
    product.output[0] = g.fresh("attention")
    elem_type = g.dtype(out) or TensorProto.FLOAT
    zero = g.add_constant(np.array(0, np.int64), "zero")
    one = g.add_constant(np.array(1, np.int64), "one")
    nodes, others = [], []
    for axis in range(1, rank - 2):
        size, count, index, placed, other = (
            g.fresh(stem) for stem in ("size", "count", "index", "placed", "other_head")
        )
        shape = [1] * rank
        shape[axis] = -1
        along = g.add_constant(np.array(shape, np.int64), "along")
        nodes += [
            helper.make_node("Shape", [product.output[0]], [size], start=axis, end=axis + 1),
            helper.make_node("Squeeze", [size], [count]),
            helper.make_node("Range", [zero, count, one], [index]),
            helper.make_node("Reshape", [index, along], [placed]),
            helper.make_node("Greater", [placed, zero], [other]),
        ]
        others.append(other)
    keep = others[0]
    for other in others[1:]:
        either = g.fresh("other_head")
        nodes.append(helper.make_node("Or", [keep, other], [either]))
        keep = either
    factor = g.fresh("head_mask")
    nodes += [
        helper.make_node("Cast", [keep], [factor], to=elem_type),
        helper.make_node("Mul", [product.output[0], factor], [out]),
    ]
    g.insert_after(product, nodes)
    return f"{describe(product)}: head 0 of the (batch, heads..., queries, size) product zeroed"


def head_zeroed(g: Graph):
    for node in g.nodes:
        key = (node.op_type, node.domain or "")
        if key in FUSED_ATTENTION:
            heads = attribute(node, "num_heads") or attribute(node, "q_num_heads")
            if heads and heads > 1:
                return [_zero_fused_head(g, node, heads)]
        elif node.op_type == "Softmax":
            product = _probabilities_reader(g, node)
            if product is None or product.op_type != "MatMul":
                continue
            rank = g.rank(product.output[0]) or g.rank(node.input[0])
            if rank is not None and rank >= 4:
                return [_zero_product_head(g, product, rank)]
    return (
        "no attention with separate heads: no fused attention with num_heads > 1, and no "
        "softmax weighing values in a (batch, heads, queries, keys) product"
    )


# --- channels_swapped -------------------------------------------------------------------


def _declared(g: Graph, name: str) -> str:
    """A graph input as the file declares it: `float [batch, 224, 224, 3]`."""
    value = next(value for value in g.proto.graph.input if value.name == name)
    tensor = value.type.tensor_type
    dims = [dim.dim_param or str(dim.dim_value) for dim in tensor.shape.dim]
    kind = TensorProto.DataType.Name(tensor.elem_type).lower()
    return f"{kind} [{', '.join(dims)}]" if tensor.HasField("shape") else kind


def _colour_axis(g: Graph, name: str) -> int | None:
    """The channel axis of a float or uint8 graph input of four axes with
    `COLOUR_CHANNELS` channels: 3 (NHWC, Keras' default, tried first) or 1
    (NCHW); None for any other input."""
    shape = g.shape(name)
    if g.dtype(name) not in PIXEL_TYPES or shape is None or len(shape) != 4:
        return None
    for axis in (3, 1):
        if shape[axis] == COLOUR_CHANNELS:
            return axis
    return None


def channels_swapped(g: Graph):
    """Every RGB image input read in the reverse channel order, BGR: a
    `Gather` of channels 2, 1, 0 on its channel axis, which every reader of
    the input reads instead."""
    where, others = [], []
    for name in g.inputs:
        axis = _colour_axis(g, name)
        if axis is None or not g.nodes:
            others.append(f"{name!r} {_declared(g, name)}")
            continue
        reversed_ = g.fresh("channels_reversed")
        readers = len(g.consumers[name])
        _rename_reads(g.proto.graph, name, reversed_)
        order = g.add_constant(np.arange(COLOUR_CHANNELS)[::-1].astype(np.int64), "channel_order")
        reversal = helper.make_node("Gather", [name, order], [reversed_], axis=axis)
        g.insert_before(g.nodes[0], [reversal])
        where.append(
            f"input {name!r} {_declared(g, name)}: channels reversed on axis {axis} "
            f"(RGB <-> BGR) for its {readers} reader(s)"
        )
    return where or (
        f"no image input: no float or uint8 graph input of four axes with {COLOUR_CHANNELS} "
        f"channels on axis 3 (NHWC) or 1 (NCHW); the inputs are {', '.join(others) or 'none'}"
    )


MUTATIONS = (
    Mutation(
        "mask_ignored",
        "the padding mask neutral in every attention and recurrence: a fused attention's "
        "mask input dropped or made neutral, the masking term of unfused logits made neutral "
        "(a causal term kept), a recurrence's sequence lengths or mask dropped",
        mask_ignored,
    ),
    Mutation(
        "weight_scaled",
        f"the largest float weight of 2+ dimensions read by a product, x {WEIGHT_FACTOR}",
        weight_scaled,
    ),
    Mutation(
        "late_weight_scaled",
        "the float weight of 2+ dimensions read by the product nearest a graph output (fewest "
        f"nodes away), x {WEIGHT_FACTOR} for that product only",
        late_weight_scaled,
    ),
    Mutation(
        "positions_swapped",
        "rows 0 and 1 of the position table swapped, or positions 0 and 1 swapped before "
        "the Sin/Cos that encode them",
        positions_swapped,
    ),
    Mutation(
        "layernorm_epsilon",
        f"every norm's epsilon from the other framework's default: below {EPSILON_LINE:g} "
        f"-> Keras' {KERAS_EPSILON:g}, else -> PyTorch's {TORCH_EPSILON:g}",
        layernorm_epsilon,
    ),
    Mutation(
        "attention_scale_dropped",
        "every attention's scale set to 1: fused ops' `scale`, or the Mul/Div by a constant "
        "on the logits or the query",
        attention_scale_dropped,
    ),
    Mutation(
        "embedding_scale_dropped",
        "the Mul by a constant right after the token embedding's Gather set to x 1",
        embedding_scale_dropped,
    ),
    Mutation(
        "softcap_dropped",
        "every logit softcap cap * tanh(x / cap) replaced by x",
        softcap_dropped,
    ),
    Mutation(
        "head_zeroed",
        "head 0 of the first attention's output zeroed before the output projection",
        head_zeroed,
    ),
    Mutation(
        "channels_swapped",
        f"every float or uint8 image input of {COLOUR_CHANNELS} channels (4 axes, NHWC or NCHW) "
        "read in the reverse channel order, RGB <-> BGR",
        channels_swapped,
    ),
)
BY_NAME = {mutation.name: mutation for mutation in MUTATIONS}


# --- files ----------------------------------------------------------------------------------


def external_threshold(path) -> int | None:
    """The size in bytes of the smallest weight the ONNX file at `path` keeps
    in a data file beside it; None when it keeps every weight inline."""
    proto = onnx.load(str(path), load_external_data=False)
    sizes = [
        int({entry.key: entry.value for entry in tensor.external_data}.get("length", 0))
        for tensor in proto.graph.initializer
        if tensor.data_location == TensorProto.EXTERNAL
    ]
    return min(sizes) if sizes else None


def uses_external_data(path) -> bool:
    """Whether the ONNX file at `path` keeps weights in a data file beside it."""
    return external_threshold(path) is not None


def save(mutant: Mutant, path, like) -> Path:
    """Write `mutant` to `path`, its weights inline or in one data file
    (`path.name + ".data"`) as the file `like` keeps them: every weight as
    large as the smallest one `like` keeps outside goes outside."""
    if not mutant.applied:
        raise ValueError(f"{mutant.mutation} did not apply: {mutant.reason}")
    path = Path(path)
    threshold = external_threshold(like)
    if threshold is None:
        onnx.save_model(mutant.proto, str(path))
    else:
        onnx.save_model(
            mutant.proto,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=f"{path.name}.data",
            size_threshold=threshold,
        )
    return path


def mutate_file(source, folder) -> dict:
    """Every mutation of the ONNX file `source`, the applied ones written to
    `folder` as `<mutation>.onnx`: mutation name -> (Mutant, path or None)."""
    proto = onnx.load(str(source))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    done = {}
    for mutation in MUTATIONS:
        mutant = mutation.apply(proto)
        path = save(mutant, folder / f"{mutation.name}.onnx", source) if mutant.applied else None
        done[mutation.name] = (mutant, path)
    return done
