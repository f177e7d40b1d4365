"""`validate` and `--check-only`: any ONNX file checked against its Keras model,
and nothing written."""

import json
from pathlib import Path

import keras
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from keras_layers.export import ExportOptions, UsageError, ValidationFailed, export_model, validate
from keras_layers.export.cli import main

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

SHAPES = [(1, 3), (2, 5)]
OPTIONS = ExportOptions(shapes=SHAPES)


def tiny_model() -> keras.Model:
    keras.utils.set_random_seed(3)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(50, 8, name="embedding")(ids)
    return keras.Model(ids, keras.layers.Dense(4, name="head")(x), name="tiny")


def snapshot(folder: Path) -> dict:
    """Every file of `folder`: its bytes and modification time."""
    return {path.name: (path.read_bytes(), path.stat().st_mtime_ns) for path in folder.iterdir()}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The model saved, our export of it (with its report), Keras' own export
    of it, and a file with one weight scaled by 1.01, each in a folder of its own."""
    root = tmp_path_factory.mktemp("files")
    model = tiny_model()
    model(np.zeros((1, 3), "int32"))  # Keras' export needs a model that was called
    model.save(root / "model.keras")
    ours = root / "ours"
    ours.mkdir()
    export_report = export_model(model, ours / "model.onnx", OPTIONS)
    theirs = root / "keras"
    theirs.mkdir()
    model.export(str(theirs / "model.onnx"), format="onnx")
    wrong = root / "wrong"
    wrong.mkdir()
    proto = onnx.load(str(ours / "model.onnx"))
    scaled = max(
        (t for t in proto.graph.initializer if t.data_type == TensorProto.FLOAT),
        key=lambda t: numpy_helper.to_array(t).size,
    )
    scaled.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scaled) * 1.01, scaled.name))
    onnx.save(proto, str(wrong / "model.onnx"))
    return {"root": root, "model": model, "export_report": export_report}


def test_our_export_validates_and_nothing_is_written(files):
    folder = files["root"] / "ours"
    before = snapshot(folder)
    report = validate(files["model"], folder / "model.onnx", OPTIONS)
    assert report["passed"] and report["validated_only"]
    assert len(report["checks"]) == len(files["export_report"]["checks"])
    assert report["input_mapping"] == {} and report["output_mapping"] == {}
    assert snapshot(folder) == before


def test_keras_own_export_validates_with_its_output_mapped(files):
    """Keras' `model.export(format="onnx")` keeps the input's name and calls
    its output `Identity:0`: the output is paired positionally, and passes."""
    folder = files["root"] / "keras"
    before = snapshot(folder)
    report = validate(files["root"] / "model.keras", folder / "model.onnx", OPTIONS)
    assert report["passed"], report["worst"]
    assert report["input_mapping"] == {}
    assert report["output_mapping"] == {"head": "Identity:0"}
    assert report["worst"]["max_abs_diff"] < 1e-5
    assert snapshot(folder) == before


def test_a_wrong_file_fails_and_names_the_output(files):
    folder = files["root"] / "wrong"
    before = snapshot(folder)
    with pytest.raises(ValidationFailed, match="output 'head'") as caught:
        validate(files["model"], folder / "model.onnx", OPTIONS)
    report = caught.value.report
    assert not report["passed"] and report["worst"]["output"] == "head"
    assert "no file was written" in str(caught.value)
    assert snapshot(folder) == before


def test_the_report_is_the_one_file_written(files, tmp_path):
    report_path = tmp_path / "check.json"
    validate(
        files["model"],
        files["root"] / "ours" / "model.onnx",
        ExportOptions(shapes=SHAPES, report_path=report_path),
    )
    assert [path.name for path in tmp_path.iterdir()] == ["check.json"]
    assert json.loads(report_path.read_text())["validated_only"] is True


def another_models_file(path: Path) -> Path:
    """An ONNX file of two inputs, `a` and `b`, that no Keras model here has."""
    a, b = (helper.make_tensor_value_info(n, TensorProto.INT32, [None, None]) for n in "ab")
    out = helper.make_tensor_value_info("c", TensorProto.INT32, [None, None])
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "other", [a, b], [out])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


@pytest.mark.parametrize(
    "make, phrases",
    [
        (lambda folder: folder / "missing.onnx", ["no such file", "existing .onnx"]),
        (
            lambda folder: folder / "notes.onnx",
            ["ONNX Runtime cannot load the file (", "give a complete ONNX model"],
        ),
        (
            another_models_file,
            ["inputs are ['a', 'b']", "model's are ['token_ids']", "check the file against"],
        ),
    ],
    ids=["missing", "text", "another model"],
)
def test_bad_files_are_usage_errors_with_the_fix(files, tmp_path, make, phrases):
    (tmp_path / "notes.onnx").write_text("not an ONNX model")
    path = make(tmp_path / "other.onnx") if make is another_models_file else make(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(UsageError) as caught:
        validate(files["model"], path, OPTIONS)
    message = str(caught.value)
    assert message.startswith(f"onnx_path={str(path)!r}: "), message
    for phrase in phrases:
        assert phrase in message, (phrase, message)
    assert snapshot(tmp_path) == before


def check_only(capsys, *argv):
    code = main(["--check-only", *map(str, argv), "--shapes", "1x3,2x5"])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, " ".join(captured.out.split()), captured.err


def test_the_command_passes_fails_and_refuses_writing_nothing(files, capsys):
    root = files["root"]
    before = {name: snapshot(root / name) for name in ("ours", "wrong")}
    code, out, _ = check_only(capsys, root / "model.keras", root / "ours" / "model.onnx")
    assert code == 0 and "matches Keras on 2 checks" in out and "No file was written" in out
    code, _, err = check_only(capsys, root / "model.keras", root / "wrong" / "model.onnx")
    assert code == 1 and "validation failed: output 'head'" in err
    ours = root / "ours" / "model.onnx"
    code, _, err = check_only(capsys, root / "model.keras", ours, "-o", root / "ours" / "x.onnx")
    assert code == 2 and err.startswith("error: -o ") and len(err.strip().splitlines()) == 1
    code = main([str(root / "model.keras"), str(ours)])  # FILE.onnx without --check-only
    err = capsys.readouterr().err
    assert code == 2 and "add --check-only" in err and len(err.strip().splitlines()) == 1
    assert {name: snapshot(root / name) for name in ("ours", "wrong")} == before


def test_the_command_writes_the_report_it_is_given(files, capsys, tmp_path):
    root, report_path = files["root"], tmp_path / "r.json"
    code, out, _ = check_only(
        capsys, root / "model.keras", root / "ours" / "model.onnx", "--report", report_path
    )
    assert code == 0 and "Report: " in out and out.endswith("r.json")
    assert [path.name for path in tmp_path.iterdir()] == ["r.json"]


def _same_names_file(path: Path, dtype=TensorProto.INT32, rows: int = 50) -> Path:
    """Another model's file with the model's names: `token_ids` -> `head`,
    a `Gather` from a table of `rows` rows (ids past it fail in ONNX Runtime)."""
    ids = helper.make_tensor_value_info("token_ids", dtype, [None, None])
    out = helper.make_tensor_value_info("head", TensorProto.FLOAT, [None, None, 4])
    table = numpy_helper.from_array(np.ones((rows, 4), np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "token_ids"], ["head"])],
        "other",
        [ids],
        [out],
        [table],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


@pytest.mark.parametrize(
    "dtype, rows, phrases",
    [
        (TensorProto.INT64, 50, ["input 'token_ids' takes tensor(int64)", "tensor(int32)"]),
        (TensorProto.INT32, 3, ["ONNX Runtime fails on the 1x3 input", "this model's inputs"]),
    ],
    ids=["another type", "another vocabulary"],
)
def test_another_models_file_with_the_same_names_is_exit_2(files, capsys, dtype, rows, phrases):
    path = _same_names_file(files["root"] / f"same_names_{rows}.onnx", dtype, rows)
    code, _, err = check_only(capsys, files["root"] / "model.keras", path)
    assert code == 2, err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    for phrase in phrases + ["check it against the model" if rows == 3 else "check the file"]:
        assert phrase in err, (phrase, err)


def test_a_file_of_float_inputs_is_checked(tmp_path, capsys):
    """ONNX Runtime calls float32 `tensor(float)`: the model's float32 input
    is the file's (it was refused as another type)."""
    keras.utils.set_random_seed(3)
    frames = keras.Input((None, 6), name="frames")
    model = keras.Model(frames, keras.layers.Dense(4, name="head")(frames))
    model.save(tmp_path / "frames.keras")
    export_model(model, tmp_path / "frames.onnx", OPTIONS)
    assert validate(model, tmp_path / "frames.onnx", OPTIONS)["passed"]
    code, out, err = check_only(capsys, tmp_path / "frames.keras", tmp_path / "frames.onnx")
    assert code == 0 and "matches Keras on 2 checks" in out, err


def _causal_lm_file(path: Path) -> Path:
    """A file with the names `--task causal-lm` writes (one layer's cache)."""
    ids = [
        helper.make_tensor_value_info(name, TensorProto.INT64, [None, None])
        for name in ("input_ids", "attention_mask", "position_ids")
    ]
    past = [
        helper.make_tensor_value_info(f"past_key_values.0.{kind}", TensorProto.FLOAT, None)
        for kind in ("key", "value")
    ]
    nodes = [helper.make_node("Cast", ["input_ids"], ["logits"], to=TensorProto.FLOAT)] + [
        helper.make_node("Identity", [f"past_key_values.0.{kind}"], [f"present.0.{kind}"])
        for kind in ("key", "value")
    ]
    outputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
        for name in ("logits", "present.0.key", "present.0.value")
    ]
    graph = helper.make_graph(nodes, "decoder", ids + past, outputs)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def test_a_causal_lm_file_checked_without_the_task_is_told_to_add_it(files, capsys, tmp_path):
    """A `--task causal-lm` file checked as a forward pass: its cache inputs are
    no input of the model, and the message says which flag checks it."""
    path = _causal_lm_file(tmp_path / "decoder.onnx")
    code, _, err = check_only(capsys, files["root"] / "model.keras", path)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "it looks like a causal-LM file: add --task causal-lm;" in err, err
    with pytest.raises(UsageError, match="causal-LM file: add task='causal-lm'"):
        validate(files["model"], path, OPTIONS)
    another = another_models_file(tmp_path / "other.onnx")  # no cache: no such hint
    with pytest.raises(UsageError) as caught:
        validate(files["model"], another, OPTIONS)
    assert "causal-LM" not in str(caught.value)


def test_a_file_paired_by_position_is_checked_without_reading_its_weights(tmp_path, monkeypatch):
    """A file whose one input and output have other names, its weights in a
    data file: checked in place, never loaded into a rewritten proto (that
    grew with the data, and failed past protobuf's 2 GB)."""
    model = tiny_model()
    export_model(
        model, tmp_path / "model.onnx", ExportOptions(shapes=SHAPES, external_data="always")
    )
    proto = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    proto.graph.input[0].name, proto.graph.output[0].name = "ids", "scores"
    for node in proto.graph.node:
        node.input[:] = ["ids" if name == "token_ids" else name for name in node.input]
        node.output[:] = ["scores" if name == "head" else name for name in node.output]
    onnx.save_model(proto, str(tmp_path / "renamed.onnx"))
    loads = []
    original = onnx.load_model

    def watched(*args, **kwargs):
        loads.append(kwargs.get("load_external_data", True))
        return original(*args, **kwargs)

    monkeypatch.setattr(onnx, "load", watched)
    monkeypatch.setattr(onnx, "load_model", watched)
    checked = validate(model, tmp_path / "renamed.onnx", OPTIONS)
    assert checked["passed"]
    assert (checked["input_mapping"], checked["output_mapping"]) == (
        {"token_ids": "ids"},
        {"head": "scores"},
    )
    assert True not in loads  # no weight was read into a proto
