"""optimum's layout of an encoder-decoder: `encoder_model.onnx` and `decoder_model_merged.onnx`.

The pipeline exports and proves two files (`seq2seq`): the encoder, which
also returns each decoder layer's cross-attention keys and values, and the
decoder's step, which reads them as `past_key_values.{i}.encoder.key/value`.
optimum's `ORTModelForSeq2SeqLM` (and transformers.js) read another split:

- `encoder_model.onnx` returns `last_hidden_state` alone;
- `decoder_model_merged.onnx` takes `encoder_hidden_states` and a boolean
  `use_cache_branch` beside the step's inputs, and holds one `If`. Its
  `else` branch (the first step, `use_cache_branch` false, every past
  empty) projects the encoder's output to the cross-attention keys and
  values, runs the step on them and returns them as
  `present.{i}.encoder.key/value`; its `then` branch (every later step) runs
  the step on the keys and values it is fed and returns empty ones there.

`merge` rewrites the two proved files into these, graph to graph: the
projection is the encoder file's own subgraph from `last_hidden_state` to
its keys and values, moved into the `else` branch; the step is the decoder
file's graph, once in each branch. Both branches read one copy of the
weights from the outer graph, so the file holds the weights once (the
projections' are the encoder file's, which no longer holds them). The
projection runs once per input, in the first step: the `then` branch holds
no node that reads `encoder_hidden_states` (`branch_census` counts them).
Nothing is recomputed, so both files compute what the proved pair did,
bit for bit; the folder's proof then runs on the merged files.
"""

from pathlib import Path

import onnx
from onnx import helper

from keras_layers.export.graph.weights import save_in_memory
from keras_layers.export.seq2seq_generation import (
    BRANCH_INPUT,
    DECODER_FILE,
    ENCODER_FILE,
    HIDDEN_INPUT,
)

# Prefixes of each branch's own names (a branch may not reuse an outer name).
PAST, FIRST, CROSS = "with_past/", "first_step/", "cross/"
ENCODER_AXIS = "encoder_sequence"  # as `seq2seq.decoder_inputs` names it


def _live(graph) -> None:
    """Drop the nodes and initializers no output of `graph` reads."""
    needed, kept = {output.name for output in graph.output}, []
    for node in reversed(graph.node):
        if any(name in needed for name in node.output):
            kept.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(kept))
    initializers = [init for init in graph.initializer if init.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(initializers)


def _prefixed(nodes, prefix: str, outer: set, renames: dict | None = None) -> list:
    """Copies of `nodes` whose own names carry `prefix`; names in `outer`
    (the outer graph's inputs and weights) are kept, those in `renames` mapped."""
    renames = renames or {}
    copies = []
    for index, node in enumerate(nodes):
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = f"{prefix}{node.name}#{index}"  # unique, where a name was empty too
        for names in (copy.input, copy.output):
            for index, name in enumerate(names):
                if name in renames:
                    names[index] = renames[name]
                elif name and name not in outer:
                    names[index] = prefix + name
        copies.append(copy)
    return copies


def _renamed_info(info, name: str):
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(info)
    copy.name = name
    return copy


def _encoder_axis(info, axis: int):
    """A copy of `info` whose `axis` is named the decoder file's encoder axis
    (the projections' file names it as its own sequence, which in the merged
    file would name the new tokens' axis)."""
    copy = onnx.ValueInfoProto()
    copy.CopyFrom(info)
    copy.type.tensor_type.shape.dim[axis].dim_param = ENCODER_AXIS
    return copy


def _empty_like(info, name: str):
    """optimum's stand-in for an output a branch does not compute: an empty
    tensor of the output's type (0 on its first free axis, 1 on the others)."""
    dims, free = [], False
    for dim in info.type.tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(dim.dim_value)
        else:
            dims.append(1 if free else 0)
            free = True
    kind = info.type.tensor_type.elem_type
    value = helper.make_tensor(name, kind, dims, [])
    return helper.make_node("Constant", [], [name], name=name, value=value)


def _merged_graph(graph, projection: list, cross: list, hidden, weights: list):
    """The merged decoder's graph: the step `graph` in both branches of one
    `If`, the `projection` nodes (computing `cross`) before it in the first."""
    outer = {init.name for init in graph.initializer} | {value.name for value in graph.input}
    step_outputs = list(graph.output)
    past = _prefixed(graph.node, PAST, outer)
    past += [_empty_like(info, PAST + info.name) for info in cross]
    to_cross = {
        info.name.replace("present.", "past_key_values.", 1): CROSS + info.name for info in cross
    }
    first = projection + _prefixed(graph.node, FIRST, outer, to_cross)

    def branch(name, nodes, prefix, cross_prefix):
        outputs = [_renamed_info(info, prefix + info.name) for info in step_outputs]
        outputs += [_renamed_info(info, cross_prefix + info.name) for info in cross]
        return helper.make_graph(nodes, name, [], outputs)

    names = [info.name for info in step_outputs + cross]
    choose = helper.make_node(
        "If",
        [BRANCH_INPUT],
        names,
        name="use_cache_branch",
        then_branch=branch("with_past", past, PAST, PAST),
        else_branch=branch("first_step", first, FIRST, CROSS),
    )
    states = _renamed_info(hidden, HIDDEN_INPUT)
    flag = helper.make_tensor_value_info(BRANCH_INPUT, onnx.TensorProto.BOOL, [1])
    return helper.make_graph(
        [choose],
        "decoder_model_merged",
        [*graph.input, states, flag],
        [*step_outputs, *cross],
        initializer=[*graph.initializer, *weights],
    )


def merge(encoder_path, decoder_path, cross_path, folder) -> dict:
    """Write `folder/encoder_model.onnx` and `folder/decoder_model_merged.onnx`
    from the proved files (the module's docstring says how).

    Args:
        encoder_path: the encoder's file, `last_hidden_state` and
            `present.{i}.encoder.key/value` out.
        decoder_path: the decoder's step file (`past_key_values.{i}.decoder/
            encoder.key/value` in).
        cross_path: the projections' file (`seq2seq.cross_model`):
            `encoder_hidden_states` and `encoder_attention_mask` in, the
            keys and values out.
        folder: where both files are written (an existing folder; the
            sources may lie in it under other names).

    Returns:
        `branch_census` of the merged file.
    """
    encoder = onnx.load(str(encoder_path))
    decoder = onnx.load(str(decoder_path))
    projections = onnx.load(str(cross_path))
    cross = [_encoder_axis(info, 2) for info in projections.graph.output]
    hidden = next(value for value in projections.graph.input if value.name == HIDDEN_INPUT)
    hidden = _encoder_axis(hidden, 1)
    weights = []
    for init in projections.graph.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = CROSS + init.name
        weights.append(copy)
    inputs = {value.name for value in projections.graph.input}
    projection = _prefixed(projections.graph.node, CROSS, inputs)

    kept = [output for output in encoder.graph.output if ".encoder." not in output.name]
    del encoder.graph.output[:]
    encoder.graph.output.extend(kept)
    _live(encoder.graph)

    merged = _merged_graph(decoder.graph, projection, cross, hidden, weights)
    domains = {entry.domain: entry.version for entry in projections.opset_import}
    domains.update({entry.domain: entry.version for entry in decoder.opset_import})
    model = helper.make_model(
        merged,
        opset_imports=[helper.make_opsetid(domain, version) for domain, version in domains.items()],
        producer_name=decoder.producer_name,
    )
    model.ir_version = decoder.ir_version
    folder = Path(folder)
    save_in_memory(encoder, folder / ENCODER_FILE)
    save_in_memory(model, folder / DECODER_FILE)
    return branch_census(model)


def _reads(nodes, name: str) -> int:
    """How many of `nodes` read `name` or what is computed from it."""
    tainted, count = {name}, 0
    for node in nodes:
        if any(value in tainted for value in node.input):
            tainted.update(node.output)
            count += 1
    return count


def branch_census(model) -> dict:
    """What each branch of a merged decoder computes: its nodes, its
    products with a weight and how many nodes read the encoder's output
    (none in the `with_past` branch: the keys and values are projected
    once, first).

    Args:
        model: a merged decoder (`merge`), a `ModelProto`.

    Returns:
        `{"with_past": {...}, "first_step": {...}}`, each `{"nodes",
        "weight_products", "matmul_nbits", "read_encoder_output"}`
        (`weight_products`: `MatMul` and `Gemm` by a weight, and the
        quantized `MatMulNBits`).
    """
    choose = next(node for node in model.graph.node if node.op_type == "If")
    weights = {init.name for init in model.graph.initializer}

    def weighted(node):
        if node.op_type == "MatMulNBits":
            return True
        return node.op_type in ("MatMul", "Gemm") and node.input[1] in weights

    census = {}
    for attribute in choose.attribute:
        nodes = attribute.g.node
        census[attribute.g.name] = {
            "nodes": len(nodes),
            "weight_products": sum(weighted(node) for node in nodes),
            "matmul_nbits": sum(node.op_type == "MatMulNBits" for node in nodes),
            "read_encoder_output": _reads(nodes, HIDDEN_INPUT),
        }
    return census
