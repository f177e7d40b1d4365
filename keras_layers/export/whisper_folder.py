"""onnxruntime-genai's `whisper` folder from a Whisper-shaped seq2seq export.

onnxruntime-genai runs one transformer encoder-decoder type, `whisper`, from
a folder of its own: `genai_config.json`, an encoder that reads
`audio_features` (batch, mels, 3000), exactly 30 seconds of log-mel frames,
and returns `encoder_hidden_states` and every decoder layer's
cross-attention keys and values (`present_key_cross_{i}`,
`present_value_cross_{i}`, (batch, heads, frames, head size)), and a decoder
that reads int32 `input_ids`, its own growing past (`past_key_self_{i}`) and
those keys and values (`past_key_cross_{i}`), and returns `logits` and
`present_key_self_{i}`. It feeds the decoder no encoder mask: Whisper
attends to every frame.

The seq2seq export already proves both halves in that form: its staged
encoder returns the cross-attention keys and values beside its output
(`seq2seq.encoder_model`), and its staged decoder step reads them
(`seq2seq.trace_decoder`). `write` rewrites those two proved graphs into
genai's names, graph to graph: a `Transpose` in front of the encoder (genai's
features are channels-first, Keras' (batch, frames, mels)), the masks the
proved files read built as ones from the shapes genai feeds, the inputs and
outputs renamed. No weight and no computation changes, and the folder's proof
then runs genai itself on it (`genai_tokens`) against keras-hub's tokens.

Only a model whose encoder takes genai's 3000 frames is written (`why_not`).
"""

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from keras_layers.export.graph.walk import remove_dead_nodes, rename_reads
from keras_layers.export.graph.weights import save_in_memory

FOLDER = "genai"  # the subfolder of the seq2seq folder that genai runs
ENCODER, DECODER, CONFIG = "encoder.onnx", "decoder.onnx", "genai_config.json"
FRAMES = 3000  # genai's whisper reads exactly 30 seconds of features
FEATURES = "audio_features"
HIDDEN = "encoder_hidden_states"
# genai's names, by layer, for the caches (past inputs and present outputs).
SELF_PAST = ("past_key_self_%d", "past_value_self_%d")
SELF_PRESENT = ("present_key_self_%d", "present_value_self_%d")
CROSS_PAST = ("past_key_cross_%d", "past_value_cross_%d")
CROSS_PRESENT = ("present_key_cross_%d", "present_value_cross_%d")


def why_not(description) -> str | None:
    """Why genai cannot run this encoder-decoder as `whisper`, or None.

    Args:
        description: the export's `seq2seq.Seq2Seq`.

    Returns:
        The reason, naming genai's constraint; None for a Whisper-shaped model.
    """
    if description.encoder_input != "audio" or not description.channels:
        return (
            "onnxruntime-genai runs one encoder-decoder type, whisper (log-mel features in); "
            "it has no path for text or waveform encoders such as BART, T5 or Moonshine"
        )
    if description.max_samples != FRAMES:
        return (
            f"onnxruntime-genai's whisper reads exactly {FRAMES} feature frames (30 s); this "
            f"encoder's position table holds {description.max_samples}"
        )
    return None


def _rename(graph, renames: dict) -> None:
    """Rename values of `graph`: where they are made (nodes, inputs), read
    (`walk.rename_reads`, subgraphs too) and returned."""
    for node in graph.node:
        node.output[:] = [renames.get(name, name) for name in node.output]
    for info in (*graph.input, *graph.output):
        info.name = renames.get(info.name, info.name)
    rename_reads(graph, renames)


def _replace_input(graph, name: str, nodes: list) -> None:
    """Drop input `name` of `graph`; `nodes` (placed first) compute it."""
    kept = [info for info in graph.input if info.name != name]
    del graph.input[:]
    graph.input.extend(kept)
    for node in reversed(nodes):
        graph.node.insert(0, node)


def _ones(name: str, source: str, axes: tuple, kind: int) -> list:
    """Nodes computing `name`, ones of `kind`, shaped as `source`'s `axes`."""
    pieces = [f"{name}/axis{axis}" for axis in axes]
    nodes = [
        helper.make_node("Shape", [source], [piece], name=piece, start=axis, end=axis + 1)
        for piece, axis in zip(pieces, axes, strict=True)
    ]
    nodes.append(helper.make_node("Concat", pieces, [f"{name}/dims"], name=f"{name}/dims", axis=0))
    one = helper.make_tensor(f"{name}/one", kind, [1], [1])
    nodes.append(
        helper.make_node("ConstantOfShape", [f"{name}/dims"], [name], name=name, value=one)
    )
    return nodes


def _cache_names(layers: int, optimum: str, genai: tuple) -> dict:
    """optimum's cache names (`optimum` formatted with `i` and `kind`) to
    genai's (`genai`: its key and its value template, by layer)."""
    return {
        optimum.format(i=i, kind=kind): template % i
        for i in range(layers)
        for kind, template in zip(("key", "value"), genai, strict=True)
    }


def _encoder(path: Path, layers: int, mels: int):
    """The staged encoder as genai's: `audio_features` (batch, mels, 3000)
    transposed in, the samples' mask ones, the frames' mask no longer returned."""
    model = onnx.load(str(path))
    graph = model.graph
    kind = {info.name: info.type.tensor_type.elem_type for info in graph.input}
    features = helper.make_tensor_value_info(
        FEATURES, kind["input_values"], ["batch", mels, FRAMES]
    )
    transpose = helper.make_node(
        "Transpose", [FEATURES], ["input_values"], name="channels_last", perm=[0, 2, 1]
    )
    _replace_input(graph, "input_values", [transpose])
    _replace_input(
        graph, "attention_mask", _ones("attention_mask", FEATURES, (0, 2), kind["attention_mask"])
    )
    graph.input.insert(0, features)
    outputs = [info for info in graph.output if info.name != "encoder_attention_mask"]
    del graph.output[:]
    graph.output.extend(outputs)
    renames = {"last_hidden_state": HIDDEN}
    renames.update(_cache_names(layers, "present.{i}.encoder.{kind}", CROSS_PRESENT))
    _rename(graph, renames)
    remove_dead_nodes(model)
    return model


def _decoder(path: Path, layers: int):
    """The staged decoder step as genai's: its caches renamed, the encoder
    mask ones over the cross keys' frames, int32 ids."""
    model = onnx.load(str(path))
    graph = model.graph
    kind = {info.name: info.type.tensor_type.elem_type for info in graph.input}
    renames = {
        **_cache_names(layers, "past_key_values.{i}.decoder.{kind}", SELF_PAST),
        **_cache_names(layers, "past_key_values.{i}.encoder.{kind}", CROSS_PAST),
        **_cache_names(layers, "present.{i}.decoder.{kind}", SELF_PRESENT),
    }
    _rename(graph, renames)
    mask = _ones(
        "encoder_attention_mask", CROSS_PAST[0] % 0, (0, 2), kind["encoder_attention_mask"]
    )
    _replace_input(graph, "encoder_attention_mask", mask)
    if kind["input_ids"] != TensorProto.INT32:  # genai feeds int32 ids: cast them
        ids = next(info for info in graph.input if info.name == "input_ids")
        ids.type.tensor_type.elem_type = TensorProto.INT32
        ids.name = "input_ids/int32"  # the graph's reads keep "input_ids", the cast's output
        cast = helper.make_node("Cast", [ids.name], ["input_ids"], to=kind["input_ids"])
        graph.node.insert(0, cast)
    return model


def config(description, special, max_length: int) -> dict:
    """genai's `genai_config.json` for the folder's two files.

    Args:
        description: the export's `seq2seq.Seq2Seq`.
        special: the export's special ids (`seq2seq_folder.Special`).
        max_length: the decoder's position limit (prompt and new tokens).

    Returns:
        The config.
    """
    layers, heads, size = description.layers, description.heads, description.head_size
    start = special.start or (0,)
    return {
        "model": {
            "type": "whisper",
            "vocab_size": description.vocabulary,
            "context_length": max_length,
            "bos_token_id": int(start[0]),
            "decoder_start_token_id": int(start[0]),
            "eos_token_id": int(special.end if special.end is not None else special.pad),
            "pad_token_id": int(special.pad),
            "encoder": {
                "filename": ENCODER,
                "hidden_size": description.hidden,
                "num_attention_heads": heads,
                "num_hidden_layers": layers,
                "head_size": size,
                "inputs": {"audio_features": FEATURES},
                "outputs": {
                    "encoder_hidden_states": HIDDEN,
                    "cross_present_key_names": CROSS_PRESENT[0],
                    "cross_present_value_names": CROSS_PRESENT[1],
                },
            },
            "decoder": {
                "filename": DECODER,
                "num_attention_heads": heads,
                "num_key_value_heads": heads,
                "head_size": size,
                "num_hidden_layers": layers,
                "hidden_size": heads * size,
                "inputs": {
                    "input_ids": "input_ids",
                    "past_key_names": SELF_PAST[0],
                    "past_value_names": SELF_PAST[1],
                    "cross_past_key_names": CROSS_PAST[0],
                    "cross_past_value_names": CROSS_PAST[1],
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": SELF_PRESENT[0],
                    "present_value_names": SELF_PRESENT[1],
                },
            },
        },
        "search": {
            "max_length": max_length,
            "num_beams": 1,
            "do_sample": False,
            "past_present_share_buffer": False,
        },
    }


def write(
    encoder_path: Path, decoder_path: Path, target: Path, description, special, max_length: int
) -> dict:
    """genai's whisper folder at `target` from the proved encoder and decoder step.

    Args:
        encoder_path: the staged encoder (returning the cross keys and values).
        decoder_path: the staged decoder step (reading them).
        target: the folder to create.
        description: the export's `seq2seq.Seq2Seq`.
        special: its special ids.
        max_length: the decoder's position limit.

    Returns:
        `{"folder", "files"}`.
    """
    target.mkdir()
    encoder = _encoder(encoder_path, description.layers, description.channels)
    save_in_memory(encoder, target / ENCODER)
    save_in_memory(_decoder(decoder_path, description.layers), target / DECODER)
    settings = config(description, special, max_length)
    (target / CONFIG).write_text(json.dumps(settings, indent=2) + "\n")
    return {"folder": target.name, "files": sorted(path.name for path in target.iterdir())}


def genai_tokens(folder: Path, features: np.ndarray, prompts: np.ndarray, new_tokens: int) -> list:
    """Greedy tokens from onnxruntime-genai on the folder.

    Args:
        folder: the genai folder.
        features: (batch, frames, mels), as Keras reads them (transposed here).
        prompts: the decoder's start tokens (batch, n).
        new_tokens: tokens each row gains (genai stops a row at its end id).

    Returns:
        Each row's tokens after its prompt.
    """
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(
        do_sample=False, max_length=prompts.shape[1] + new_tokens, batch_size=len(prompts)
    )
    generator = og.Generator(model, params)
    inputs = og.NamedTensors()
    inputs[FEATURES] = np.ascontiguousarray(np.transpose(features, (0, 2, 1)), np.float32)
    inputs["input_ids"] = np.asarray(prompts, np.int32)
    generator.set_inputs(inputs)
    while not generator.is_done():
        generator.generate_next_token()
    rows = [generator.get_sequence(row)[prompts.shape[1] :] for row in range(len(prompts))]
    return [[int(token) for token in row] for row in rows]
