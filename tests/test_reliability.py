"""Reliability of the export: atomic output under SIGKILL, a full disk,
reproducible exports, and out-of-range token ids."""

import errno
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import VOCAB, save, tied_encoder

from keras_layers.export import ExportOptions, export_model
from keras_layers.export.cli import main

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

ROOT = Path(__file__).resolve().parent.parent


def export_command(model: Path, output: Path) -> list[str]:
    """The checkout's command exporting `model` to `output` on a one-point grid."""
    return [
        sys.executable,
        str(ROOT / "export" / "to_onnx.py"),
        str(model),
        "-o",
        str(output),
        "--shapes",
        "1x4",
    ]


@pytest.fixture(scope="module")
def model_and_good_file(tmp_path_factory):
    directory = tmp_path_factory.mktemp("reliable")
    model = save(tied_encoder(layers=1), directory / "model.keras")
    good = directory / "good.onnx"
    export_model(model, good, ExportOptions(shapes=[(1, 4)]))
    return model, good


@pytest.mark.parametrize("delay", [1.0, 4.0, 7.0, 10.0])
def test_sigkill_never_damages_the_output(tmp_path, model_and_good_file, delay):
    """Kill the export at several points: the old file stays whole and valid."""
    model, good = model_and_good_file
    output = tmp_path / "model.onnx"
    output.write_bytes(good.read_bytes())
    before = hashlib.sha256(output.read_bytes()).hexdigest()
    process = subprocess.Popen(
        export_command(model, output),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    # Exports are byte-identical, so "the old file or a complete new export"
    # means the same bytes whenever the kill lands: before, during or after
    # the placement.
    assert hashlib.sha256(output.read_bytes()).hexdigest() == before
    visible = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    assert visible in (["model.onnx"], ["model.onnx", "model.report.json"])
    onnx.checker.check_model(str(output))


@pytest.mark.parametrize("write", ["the converted weights", "the file"])
def test_disk_full_is_a_clear_error_and_changes_nothing(
    tmp_path, model_and_good_file, monkeypatch, capsys, write
):
    from keras_layers.export.graph import weights

    model, good = model_and_good_file
    output = tmp_path / "model.onnx"
    output.write_bytes(good.read_bytes())
    before = output.read_bytes()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    if write == "the file":
        monkeypatch.setattr(weights, "save", full)
    else:
        monkeypatch.setattr(weights, "store", full)
    code = main([str(model), "-o", str(output), "--shapes", "1x4"])
    assert code == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "Traceback" not in err
    assert output.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def _export_in_fresh_process(model: Path, output: Path, hash_seed: int) -> str:
    """Export `model` with the command in a new interpreter; returns the file's sha256."""
    environment = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    done = subprocess.run(
        export_command(model, output),
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return hashlib.sha256(output.read_bytes()).hexdigest()


@pytest.mark.slow  # minutes; CI runs the slow tier (.ci/run)
def test_exports_in_separate_processes_are_byte_identical(tmp_path, model_and_good_file):
    """The same file and flags give the same bytes: separate interpreters (other
    `id()`s, other hash seeds) and tf2onnx's set-ordered nodes change nothing."""
    model, good = model_and_good_file
    digests = [
        _export_in_fresh_process(model, tmp_path / f"run{seed}.onnx", seed) for seed in (0, 1, 2)
    ]
    assert len(set(digests)) == 1, digests
    # The in-process export of the fixture matches too.
    assert hashlib.sha256(good.read_bytes()).hexdigest() == digests[0]


def _other_order_and_names(proto) -> None:
    """Rewrite `proto` as another run of tf2onnx might have written it: another
    valid topological order (the node readied last goes first), other names for
    every intermediate tensor, initializer and node, and reversed lists."""
    graph = proto.graph
    nodes = list(graph.node)
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    readers = [[] for _ in nodes]
    waiting = [0] * len(nodes)
    for i, node in enumerate(nodes):
        for source in {producer[name] for name in node.input if name in producer}:
            readers[source].append(i)
            waiting[i] += 1
    ready = [i for i, count in enumerate(waiting) if not count]
    order = []
    while ready:
        order.append(ready.pop())
        for reader in readers[order[-1]]:
            waiting[reader] -= 1
            if not waiting[reader]:
                ready.append(reader)
    assert sorted(order) == list(range(len(nodes))) and order != sorted(order)
    keep = {value.name for value in [*graph.input, *graph.output]}
    renamed = {init.name: f"other_{init.name}" for init in graph.initializer}
    renamed.update(
        (name, f"other_{name}") for node in nodes for name in node.output if name not in keep
    )
    renamed.pop("", None)  # an optional output left out stays left out
    for init in graph.initializer:
        init.name = renamed[init.name]
    for node in nodes:
        node.name = f"other_{node.name}"
        for values in (node.input, node.output):
            for position, name in enumerate(values):
                values[position] = renamed.get(name, name)
    for value in graph.value_info:
        value.name = renamed.get(value.name, value.name)
    del graph.node[:]
    graph.node.extend(nodes[i] for i in order)
    initializers = list(graph.initializer)[::-1]
    del graph.initializer[:]
    graph.initializer.extend(initializers)
    opsets = list(proto.opset_import)[::-1]
    del proto.opset_import[:]
    proto.opset_import.extend(opsets)


def test_slim_gives_the_same_bytes_for_any_node_order(model_and_good_file):
    """Two tf2onnx runs differ in node order and names; the slimmed bytes do not."""
    import copy

    from keras_layers.export import converting, loading, slimming, tracing

    model, good = model_and_good_file
    loaded = loading.load(model)
    converted = converting.convert(tracing.trace(loaded)).proto

    def slimmed(proto) -> bytes:
        result = slimming.slim(proto, loaded.inputs, loaded.outputs, model_name=loaded.model.name)
        return result.proto.SerializeToString()

    expected = slimmed(copy.deepcopy(converted))
    shuffled = copy.deepcopy(converted)
    _other_order_and_names(shuffled)
    assert slimmed(shuffled) == expected
    # The canonical form alone, on the slimmed graph (no onnxslim to tidy up).
    again = onnx.ModelProto.FromString(expected)
    _other_order_and_names(again)
    assert again.SerializeToString() != expected
    slimming.canonicalize(again, name=loaded.model.name)
    assert again.SerializeToString() == expected
    assert good.read_bytes() == expected  # the fixture's export, earlier in this process


def _loop_model(variant: int):
    """x -> two equal Relus, one read inside a Loop body, one by a Neg.

    The body returns its state twice, as a carried state and a scan output,
    once through an `Identity` (as tf2onnx writes an RNN). Variant 1 is the
    same computation as another run could write it: other names, the Relus'
    roles swapped, the nodes in another order, the copy at the other output.
    """
    from onnx import TensorProto, helper, numpy_helper

    def name(value: str) -> str:
        return value if variant == 0 else f"other_{value}"

    captured, negated = ("r1", "r2") if variant == 0 else ("r2", "r1")
    carried, scanned = ("s2", "copy") if variant == 0 else ("copy", "s2")
    body_nodes = [
        helper.make_node("Identity", [name("c")], [name("c2")]),
        helper.make_node("Add", [name("s"), name(captured)], [name("s2")]),
        helper.make_node("Identity", [name("s2")], [name("copy")]),
    ]
    body = helper.make_graph(
        body_nodes if variant == 0 else [body_nodes[1], body_nodes[2], body_nodes[0]],
        "body",
        [
            helper.make_tensor_value_info(name("i"), TensorProto.INT64, []),
            helper.make_tensor_value_info(name("c"), TensorProto.BOOL, []),
            helper.make_tensor_value_info(name("s"), TensorProto.FLOAT, [3]),
        ],
        [
            helper.make_tensor_value_info(name("c2"), TensorProto.BOOL, []),
            helper.make_tensor_value_info(name(carried), TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info(name(scanned), TensorProto.FLOAT, [3]),
        ],
    )
    nodes = [
        helper.make_node("Relu", ["x"], [name(captured)]),
        helper.make_node("Relu", ["x"], [name(negated)]),
        helper.make_node("Neg", [name(negated)], [name("n")]),
        helper.make_node(
            "Loop", [name("trip"), name("cond"), "x"], [name("final"), "scan"], body=body
        ),
        helper.make_node("Add", [name("final"), name("n")], ["y"]),
    ]
    initializers = [
        numpy_helper.from_array(np.array(4, np.int64), name("trip")),
        numpy_helper.from_array(np.array(True), name("cond")),
    ]
    if variant == 1:
        nodes = [nodes[1], nodes[2], nodes[0], nodes[3], nodes[4]]
        initializers.reverse()
    graph = helper.make_graph(
        nodes,
        "toy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("scan", TensorProto.FLOAT, [4, 3]),
        ],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_canonical_form_of_a_loop_is_one_graph_and_still_runs():
    """Equal nodes with different readers, a Loop body reading outer values and
    tf2onnx's moving `Identity` copy: one canonical graph, computing the same."""
    from keras_layers.export import slimming

    x = np.array([-1.0, 0.5, 2.0], np.float32)
    files = []
    for variant in (0, 1):
        proto = _loop_model(variant)
        before = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})
        slimming.canonicalize(proto, name="toy")
        onnx.checker.check_model(proto, full_check=True)
        after = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})
        for old, new in zip(before, after, strict=True):
            np.testing.assert_array_equal(new, old)
        files.append(proto.SerializeToString())
    assert files[0] == files[1]
    # Reads inside the body were renamed with the values they read.
    loop = next(n for n in onnx.ModelProto.FromString(files[0]).graph.node if n.op_type == "Loop")
    read = {value for node in loop.attribute[0].g.node for value in node.input}
    assert all(value[0] in "tw" and value[1:].isdigit() for value in read), read


def test_out_of_range_ids_fail_loudly_in_keras_and_onnx(model_and_good_file):
    """TensorFlow and ONNX Runtime both refuse an id >= vocabulary (JAX clamps:
    see docs/export.md)."""
    import keras

    model, good = model_and_good_file
    ids = np.array([[1, 2, VOCAB + 5]], dtype="int32")
    with pytest.raises(Exception, match=r"(?i)indices|out of range|bound"):
        keras.saving.load_model(model)(ids)
    session = ort.InferenceSession(str(good))
    with pytest.raises(Exception, match=r"(?i)indices|out of|bound"):
        session.run(None, {"token_ids": ids})
