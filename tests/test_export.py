"""The export pipeline end to end: conversion, validation, report, atomic output."""

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import dict_model, sample_ids, save, sequential_model, tied_encoder

from keras_layers import ScaledEmbedding, SinusoidalPositionEncoding, TiedOutputDense
from keras_layers.export import ExportOptions, ValidationFailed, export_model
from keras_layers.export.cli import main

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

ROOT = Path(__file__).resolve().parent.parent
QUICK_SHAPES = [(1, 1), (2, 7), (8, 64), "padded"]


@pytest.fixture(scope="module")
def encoder_export(tmp_path_factory):
    """One keras-hub encoder stack with tied output, exported once for the module."""
    directory = tmp_path_factory.mktemp("encoder")
    model_path = save(tied_encoder(), directory / "encoder.keras")
    output = directory / "encoder.onnx"
    report = export_model(model_path, output)
    return model_path, output, report


def test_encoder_stack_exports_and_validates(encoder_export):
    _, output, report = encoder_export
    assert report["passed"] is True
    assert output.exists() and Path(report["report_path"]).exists()
    shapes = {check["shape"] for check in report["checks"]}
    assert shapes == {f"{b}x{s}" for b in (1, 2, 8) for s in (1, 7, 64, 256)} | {"padded"}
    assert all(check["max_abs_diff"] <= 1e-4 for check in report["checks"])
    assert all(check["top1_agreement"] == 1.0 for check in report["checks"])


def test_report_holds_every_field(encoder_export):
    _, output, report = encoder_export
    on_disk = json.loads(Path(report["report_path"]).read_text())
    for key in (
        "passed",
        "onnx_path",
        "opset",
        "file_bytes",
        "param_bytes",
        "inputs",
        "outputs",
        "checks",
        "stage_seconds",
        "versions",
        "tolerances",
    ):
        assert key in on_disk, key
    assert on_disk["inputs"] == [
        {
            "name": "token_ids",
            "shape": ["batch", "sequence"],
            "dtype": "int32",
            "role": "ids",
            "role_source": "wiring",
            "role_reason": "read by embedding 'token_embedding' (vocabulary 300); 0 is padding "
            "(masked by 'token_embedding')",
            "vocabulary": 300,
            "masks_zero": True,
        }
    ]
    assert on_disk["warnings"] == []
    assert on_disk["outputs"][0]["shape"] == ["batch", "sequence", 300]
    assert set(on_disk["stage_seconds"]) == {
        "load",
        "trace",
        "convert",
        "slim",
        "validate",
        "report",
    }
    for package in ("keras", "tensorflow", "tf2onnx", "onnx", "onnxruntime"):
        assert on_disk["versions"][package]
    for check in on_disk["checks"]:
        assert {"shape", "output", "max_abs_diff", "max_rel_diff", "passed"} <= set(check)
    assert on_disk["file_bytes"] == output.stat().st_size


def test_onnx_names_axes_and_runs(encoder_export):
    model_path, output, _ = encoder_export
    proto = onnx.load(output)
    (graph_input,) = proto.graph.input
    assert graph_input.name == "token_ids"
    dims = [d.dim_param or d.dim_value for d in graph_input.type.tensor_type.shape.dim]
    assert dims == ["batch", "sequence"]
    out_dims = [
        d.dim_param or d.dim_value for d in proto.graph.output[0].type.tensor_type.shape.dim
    ]
    assert out_dims == ["batch", "sequence", 300]
    assert proto.opset_import[0].version >= 17
    session = ort.InferenceSession(str(output))
    ids = sample_ids(3, 11)
    (logits,) = session.run(None, {"token_ids": ids})
    expected = keras.saving.load_model(model_path)(ids)
    np.testing.assert_allclose(logits, expected, atol=1e-4)


def test_tied_matrix_is_stored_once(encoder_export):
    _, output, report = encoder_export
    proto = onnx.load(output)
    big = [init for init in proto.graph.initializer if 300 in init.dims]
    assert len(big) == 1, [init.name for init in big]
    # The one matrix feeds both the lookup and the output projection.
    shared = report["graph"]["shared_weights"]
    assert [entry["shape"] for entry in shared] == [list(big[0].dims)]
    assert shared[0]["read_by"] == ["Gather", "Transpose"]


def test_dict_inputs_and_outputs(tmp_path):
    model_path = save(dict_model(), tmp_path / "dict.keras")
    report = export_model(model_path, tmp_path / "dict.onnx", ExportOptions(shapes=QUICK_SHAPES))
    assert report["passed"]
    assert [i["name"] for i in report["inputs"]] == [
        "token_ids",
        "segment_ids",
        "padding_mask",
    ]
    assert {o["name"] for o in report["outputs"]} == {"sequence_logits", "pooled"}
    session = ort.InferenceSession(str(tmp_path / "dict.onnx"))
    assert {o.name for o in session.get_outputs()} == {"sequence_logits", "pooled"}
    # The padded grid point fed a padding mask with zeros.
    assert any(check["shape"] == "padded" for check in report["checks"])


def test_sequential_model(tmp_path):
    model_path = save(sequential_model(), tmp_path / "seq.keras")
    report = export_model(model_path, tmp_path / "seq.onnx", ExportOptions(shapes=[(2, 5)]))
    assert report["passed"]


def test_mixed_precision_model_exports_in_float32(tmp_path, policy):
    policy("mixed_float16")
    model = tied_encoder(layers=1)
    model_path = save(model, tmp_path / "mixed.keras")
    policy("float32")
    report = export_model(model_path, tmp_path / "mixed.onnx", ExportOptions(shapes=QUICK_SHAPES))
    assert report["passed"]
    assert "mixed_float16" in report["exported_from_policies"]
    proto = onnx.load(tmp_path / "mixed.onnx")
    assert proto.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    half = [i for i in proto.graph.initializer if i.data_type == onnx.TensorProto.FLOAT16]
    assert not half


def test_failed_validation_keeps_the_good_file(tmp_path, encoder_export):
    model_path, good_output, _ = encoder_export
    output = tmp_path / "model.onnx"
    output.write_bytes(good_output.read_bytes())
    before = output.read_bytes()
    with pytest.raises(ValidationFailed) as raised:
        export_model(model_path, output, ExportOptions(atol=0.0, rtol=0.0, shapes=[(8, 64)]))
    assert output.read_bytes() == before
    report = raised.value.report
    assert report["passed"] is False
    assert report["worst"]["max_abs_diff"] > 0
    assert Path(report["onnx_path"]) == tmp_path / "model.failed.onnx"
    assert (tmp_path / "model.failed.onnx").exists()
    # The failed export's report sits beside its file; no report of the good
    # file is overwritten.
    assert not (tmp_path / "model.report.json").exists()
    failed_report = tmp_path / "model.report.failed.json"
    assert json.loads(failed_report.read_text())["passed"] is False
    assert report["report_path"] == str(failed_report)
    assert "logits" in str(raised.value) and "8x64" in str(raised.value)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_tampered_graph_fails_validation(tmp_path, monkeypatch, encoder_export):
    """A wrong weight in the file is caught at the default tolerances."""
    import math

    from keras_layers.export import slimming
    from keras_layers.export.graph import weights

    real_slim = slimming.slim

    def tampered(proto, *args, **kwargs):
        result = real_slim(proto, *args, **kwargs)
        init = max(result.proto.graph.initializer, key=lambda i: math.prod(i.dims))
        array = np.array(weights.values(init, kwargs["data_folder"]))
        array.flat[0] += 0.5
        weights.replace(init, array, kwargs["data_folder"])
        return result

    monkeypatch.setattr(slimming, "slim", tampered)
    model_path, _, _ = encoder_export
    code = main([str(model_path), "-o", str(tmp_path / "t.onnx"), "--shapes", "2x7"])
    assert code == 1
    assert not (tmp_path / "t.onnx").exists()
    assert (tmp_path / "t.failed.onnx").exists()


def test_cli_exit_code_and_report_path(tmp_path, encoder_export):
    model_path, _, _ = encoder_export
    report = tmp_path / "r" / "report.json"
    code = main(
        [
            str(model_path),
            "-o",
            str(tmp_path / "cli.onnx"),
            "--report",
            str(report),
            "--shapes",
            "1x3,padded",
            "--opset",
            "17",
        ]
    )
    assert code == 0
    data = json.loads(report.read_text())
    assert data["passed"] and data["opset"] == 17
    assert [c["shape"] for c in data["checks"]] == ["1x3", "padded"]


def test_readme_inference_snippet_runs(encoder_export, monkeypatch, tmp_path):
    """The README's onnxruntime example, run against a real exported file."""
    import re

    _, output, _ = encoder_export
    text = (ROOT / "README.md").read_text()
    (snippet,) = [
        block
        for block in re.findall(r"```python\n(.*?)```", text, flags=re.S)
        if "demo_encoder.onnx" in block
    ]
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(snippet.replace("artifacts/demo/demo_encoder.onnx", str(output)), namespace)
    assert namespace["logits"].shape[-1] == 300


def test_script_runs_from_a_shell_without_traceback(tmp_path):
    """`python export/to_onnx.py` with bad input: one line, exit 2, in a real process."""
    missing = tmp_path / "nope.keras"
    result = subprocess.run(
        [sys.executable, str(ROOT / "export" / "to_onnx.py"), str(missing)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert result.returncode == 2
    assert "no such file" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # minutes; CI runs the slow tier (.ci/run)
def test_demo_default_run_trains_exports_and_reuses(tmp_path, monkeypatch, capsys, trained_demo):
    """The command with no arguments: the README's main job (run once per
    test run, `trained_demo` in tests/conftest.py). Its files go to
    `$KERAS_LAYERS_HOME/demo`, never to the working directory."""
    home, out, left = trained_demo
    assert left == []
    report = json.loads((home / "demo" / "demo_encoder.report.json").read_text())
    assert report["passed"]
    assert report["demo"]["masked_token_accuracy"] >= 0.90
    assert any(check["shape"] == "padded" for check in report["checks"])
    assert "Training the demo encoder" in out
    # The console's training time is the report's (it timed more than the report did).
    assert f"train     {report['demo']['train_seconds']:6.2f} s" in out, out
    # A rerun reuses the trained model instead of training again; int8 this time,
    # on enough tokens for the int8 gate (1,000 pooled over the grid). In a
    # copy of the home: the trained one is shared.
    shutil.copytree(home, tmp_path / "home")
    monkeypatch.setenv("KERAS_LAYERS_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    report_path = tmp_path / "home" / "demo" / "demo_encoder.report.json"
    assert main(["--shapes", "2x32,4x256,padded", "--quantize", "int8"]) == 0
    assert "Reusing the trained demo" in capsys.readouterr().out
    int8 = json.loads(report_path.read_text())["int8"]
    assert int8["passed"] and Path(int8["onnx_path"]).name == "demo_encoder.int8.onnx"
    assert int8["evaluation"]["top1_agreement"] >= 0.995
    assert (
        int8["evaluation"]["keras_masked_token_accuracy"]
        - int8["evaluation"]["masked_token_accuracy"]
        <= 0.01
    )


def test_int8_copy_stores_the_tied_matrix_once(tmp_path, encoder_export):
    from onnx import TensorProto

    from keras_layers.export import quantizing

    _, output, report = encoder_export
    target = tmp_path / "int8.onnx"
    quantizing.quantize_int8(output, target)
    proto = onnx.load(target)
    int8 = [i for i in proto.graph.initializer if i.data_type == TensorProto.INT8]
    assert [i.dims for i in int8].count([300, 32]) + [i.dims for i in int8].count([32, 300]) == 1
    assert "Gemm" not in {node.op_type for node in proto.graph.node}
    session = ort.InferenceSession(str(target))
    ids = sample_ids(4, 16)
    (logits,) = session.run(None, {"token_ids": ids})
    (reference,) = ort.InferenceSession(str(output)).run(None, {"token_ids": ids})
    # Random weights give near-tied logits, so int8 flips some of them (86%
    # agree here); a broken quantization would agree about 1/300 of the time.
    # The trained demo's held-out check holds the real bar (99.5%).
    assert (logits.argmax(-1) == reference.argmax(-1)).mean() > 0.5


def test_layer_norms_and_dense_layers_are_folded(encoder_export):
    _, output, report = encoder_export
    ops = [node.op_type for node in onnx.load(output).graph.node]
    # 2 encoder layers x 2 LayerNorms and 2 feed-forward Dense layers, plus the
    # tied output projection; each layer's attention in one node.
    assert ops.count("LayerNormalization") == 4
    assert "ReduceMean" not in ops and "Sqrt" not in ops
    assert report["graph"]["fused"] == {
        "LayerNormalization": 4,
        "MatMul": 5,
        "MultiHeadAttention": 2,
        "SimplifiedLayerNormalization": 0,  # LayerNorms, not RMS norms
        "RotaryEmbedding": 0,  # sinusoidal positions, added once, not rotations
        "GroupQueryAttention": 0,  # no cache: GroupQueryAttention is the cached decoder's
        # The encoder's feed-forward uses relu: no gelu to fuse.
        "Gelu": 0,
        "BiasGelu": 0,
        "FastGelu": 0,
        "QuickGelu": 0,
        "Conv": 0,  # no convolution: no BatchNorm folded into one
    }
    assert ops.count("MultiHeadAttention") == 2 and "Softmax" not in ops
    assert report["graph"]["nodes_final"] < report["graph"]["nodes_converted"]


def test_fusions_leave_unmatched_graphs_alone():
    """A mean over the first axis is not a LayerNorm and must not be fused."""
    from onnx import TensorProto, helper

    from keras_layers.export import fusions

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [0])
    eps = helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-3])
    gamma = helper.make_tensor("gamma", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["m"]),
        helper.make_node("Neg", ["m"], ["nm"]),
        helper.make_node("Sub", ["x", "m"], ["c"]),
        helper.make_node("Mul", ["c", "c"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["v"]),
        helper.make_node("Add", ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Reciprocal", ["s"], ["r"]),
        helper.make_node("Mul", ["r", "gamma"], ["g"]),
        helper.make_node("Mul", ["x", "g"], ["a"]),
        helper.make_node("Mul", ["nm", "g"], ["b"]),
        helper.make_node("Add", ["a", "b"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y], [axes, eps, gamma])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert fusions.fuse_layer_norms(proto, fusions.tensor_ranks(fusions.tensor_shapes(proto))) == 0
    # The same graph over the last axis is a LayerNorm.
    proto.graph.initializer[0].CopyFrom(helper.make_tensor("axes", TensorProto.INT64, [1], [1]))
    assert fusions.fuse_layer_norms(proto, fusions.tensor_ranks(fusions.tensor_shapes(proto))) == 1


@keras.saving.register_keras_serializable(package="tests")
class SubclassedEncoder(keras.Model):
    """A subclassed model: its inputs are known only from the shape it was built with."""

    def __init__(self, vocabulary=50, width=8, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary, self.width = vocabulary, width
        self.embedding = ScaledEmbedding(vocabulary, width, name="embedding")
        self.position = SinusoidalPositionEncoding()
        self.head = TiedOutputDense(self.embedding)

    def call(self, token_ids):
        return self.head(self.position(self.embedding(token_ids)))

    def get_config(self):
        return {**super().get_config(), "vocabulary": self.vocabulary, "width": self.width}


def test_subclassed_model(tmp_path):
    model = SubclassedEncoder()
    model(np.zeros((1, 3), "int32"))
    model.save(tmp_path / "sub.keras")
    report = export_model(
        tmp_path / "sub.keras", tmp_path / "sub.onnx", ExportOptions(shapes=[(2, 5)])
    )
    assert report["passed"]
    assert report["inputs"][0]["dtype"] == "int32"
    assert report["inputs"][0]["shape"] == ["batch", "sequence"]


KERAS_MASKED = np.float32(-0.7 * 3.38953e38)  # what Keras selects for a masked logit


def _traced_attention_graph(heads, size):
    """Attention as the trace writes it: q, k, v (B, T, N, H) and a (B, 1, T, S) mask."""
    from onnx import TensorProto, helper, numpy_helper

    def four_d(name, kind=TensorProto.FLOAT, last=(heads, size)):
        return helper.make_tensor_value_info(name, kind, ["b", name + "_len", *last])

    heads_first = [0, 2, 1, 3]
    nodes = [
        helper.make_node("Transpose", ["q"], ["qt"], perm=heads_first),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["qt", "kt"], ["logits"]),
        helper.make_node("Mul", ["logits", "scale"], ["scaled"]),
        helper.make_node("Where", ["mask", "scaled", "big"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
        helper.make_node("Transpose", ["v"], ["vt"], perm=heads_first),
        helper.make_node("MatMul", ["probs", "vt"], ["heads"]),
        helper.make_node("Transpose", ["heads"], ["y"], perm=heads_first),
    ]
    mask = helper.make_tensor_value_info("mask", TensorProto.BOOL, ["b", 1, "q_len", "k_len"])
    constants = [
        numpy_helper.from_array(np.float32(size**-0.5), "scale"),
        numpy_helper.from_array(KERAS_MASKED, "big"),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [four_d("q"), four_d("k"), four_d("v"), mask],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        constants,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_fused_attention_masks_padded_rows_as_keras_does():
    """A padded query attends to no key, and Keras gives it the mean of all values.

    Its logits here reach the hundreds: adding -1e9 to mask them would not give
    that (-1e9 + 40 rounds to -1e9 + 64, so the largest logit would win).
    """
    from keras_layers.export import fusions

    heads, size, length = 2, 4, 5
    proto = _traced_attention_graph(heads, size)
    unfused = ort.InferenceSession(proto.SerializeToString())
    assert fusions.fuse_attention(proto, fusions.tensor_shapes(proto)) == 1
    assert "MultiHeadAttention" in [node.op_type for node in proto.graph.node]
    fused = ort.InferenceSession(proto.SerializeToString())

    rng = np.random.default_rng(0)
    q, k = (rng.normal(0, 8, (2, length, heads, size)).astype("float32") for _ in "qk")
    v = rng.normal(0, 1, (2, length, heads, size)).astype("float32")
    valid = np.arange(length)[None] < np.array([[length], [3]])  # row 1: 2 pads
    mask = (valid[:, None, :, None] & valid[:, None, None, :]).astype(bool)
    feeds = {"q": q, "k": k, "v": v, "mask": mask}

    logits = np.einsum("btnh,bsnh->bnts", q, k) * np.float32(size**-0.5)
    assert np.abs(logits).max() > 100

    def attend(masked_logits):
        probs = np.exp(masked_logits - masked_logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        return np.einsum("bnts,bsnh->btnh", probs, v)

    keras_like = attend(np.where(mask, logits, KERAS_MASKED))
    np.testing.assert_allclose(
        keras_like[1, 3:], np.broadcast_to(v[1].mean(0), (2, heads, size)), rtol=1e-5, atol=1e-6
    )
    added = attend(logits + np.where(mask, np.float32(0), np.float32(-1e9)))
    assert np.abs(added[1, 3:] - keras_like[1, 3:]).max() > 0.1  # what -1e9 would give

    (got,) = fused.run(None, feeds)
    (reference,) = unfused.run(None, feeds)
    np.testing.assert_allclose(got, keras_like, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-5)
    # An empty batch runs too (a -1 in the fused reshapes could not be inferred).
    empty = {name: value[:0] for name, value in feeds.items()}
    assert fused.run(None, empty)[0].shape == (0, length, heads, size)


def test_old_opsets_export_without_the_ops_they_lack(tmp_path):
    """`LayerNormalization` needs opset 17 and the fused attention's `Shape` 15."""
    model_path = save(tied_encoder(), tmp_path / "encoder.keras")
    report = export_model(
        model_path, tmp_path / "old.onnx", ExportOptions(shapes=QUICK_SHAPES, opset=13)
    )
    assert report["passed"] and report["opset"] == 13
    assert report["graph"]["fused"]["LayerNormalization"] == 0
    assert report["graph"]["fused"]["MultiHeadAttention"] == 0


def test_causal_decoder_attention_is_fused_and_validates(tmp_path):
    """keras-hub's decoder masks causally and by padding; the fused op keeps both."""
    import keras_hub

    ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(60, 16, mask_zero=True)(ids)
    x = keras_hub.layers.TransformerDecoder(intermediate_dim=32, num_heads=2)(x)
    model_path = save(keras.Model(ids, keras.layers.Dense(60)(x)), tmp_path / "decoder.keras")
    report = export_model(model_path, tmp_path / "decoder.onnx", ExportOptions(shapes=QUICK_SHAPES))
    assert report["passed"]
    assert report["graph"]["fused"]["MultiHeadAttention"] == 1


def test_a_model_in_memory_exports_without_saving_it_first(tmp_path):
    model = tied_encoder(layers=1, name="in_memory")
    report = export_model(model, tmp_path / "mem.onnx", ExportOptions(shapes=[(2, 5), "padded"]))
    assert report["passed"]
    assert report["source_model"] == "in memory: in_memory"
    session = ort.InferenceSession(str(tmp_path / "mem.onnx"), providers=["CPUExecutionProvider"])
    ids = sample_ids(2, 5)
    (logits,) = session.run(None, {"token_ids": ids})
    np.testing.assert_allclose(logits, keras.ops.convert_to_numpy(model(ids)), atol=1e-4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mem.onnx", "mem.report.json"]


def test_a_mixed_precision_model_in_memory_is_exported_in_float32(tmp_path, policy):
    policy("mixed_float16")
    model = tied_encoder(layers=1)
    policy("float32")
    report = export_model(model, tmp_path / "half.onnx", ExportOptions(shapes=[(2, 5)]))
    assert report["passed"] and "mixed_float16" in report["exported_from_policies"]
    assert model.get_layer("token_embedding").dtype_policy.name == "mixed_float16"  # untouched


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"opset": 99}, ["opset=99", "unsupported"]),
        ({"quantize": "int4"}, ["quantize='int4'", "decoders", "int8"]),
        ({"external_data": "sometimes"}, ["external_data='sometimes'", "auto"]),
        ({"atol": -1.0}, ["atol=-1.0", ">= 0"]),
        ({"rtol": float("nan")}, ["rtol=nan", "finite"]),
        ({"shapes": [(0, 3)]}, ["shapes=[(0, 3)]", "positive"]),
        ({"shapes": []}, ["shapes=[]", "non-empty"]),
        ({"imports": ["no_such_module_xyz"]}, ["imports='no_such_module_xyz'"]),
    ],
)
def test_api_errors_name_the_api_argument(tmp_path, kwargs, words):
    from keras_layers.export import UsageError

    model = tied_encoder(layers=1)
    with pytest.raises(UsageError) as raised:
        export_model(model, tmp_path / "x.onnx", ExportOptions(**kwargs))
    message = str(raised.value)
    for word in words:
        assert word in message, message
    assert "--" not in message  # no command-line flags in an API error
    assert list(tmp_path.iterdir()) == []


def test_api_refuses_what_is_not_a_model(tmp_path):
    from keras_layers.export import UsageError

    with pytest.raises(UsageError, match="expected a keras.Model or the path"):
        export_model(42, tmp_path / "x.onnx")


@keras.saving.register_keras_serializable(package="tests")
class Log(keras.layers.Layer):
    """log(x): NaN for about half of the grid's standard-normal inputs."""

    def call(self, x):
        return keras.ops.log(x)


def test_nan_in_keras_own_outputs_fails_unless_allowed(tmp_path):
    inputs = keras.Input((4,), name="x")
    model = keras.Model(inputs, Log(name="log")(inputs))
    with pytest.raises(ValidationFailed, match="NaN or infinity") as raised:
        export_model(model, tmp_path / "nan.onnx", ExportOptions(shapes=[(8, 4)]))
    (check,) = raised.value.report["checks"]
    assert 0.2 < check["keras_nonfinite"] < 0.8
    assert "allow_nonfinite=True" in check["problem"]
    report = export_model(
        model, tmp_path / "nan.onnx", ExportOptions(shapes=[(8, 4)], allow_nonfinite=True)
    )
    assert report["passed"] and report["checks"][0]["keras_nonfinite"] > 0.2


def test_the_padded_point_has_a_row_of_padding_only_and_its_nan_is_compared(tmp_path):
    """A masked mean over a row with no token is 0 / 0 in Keras: NaN there
    alone is the model's right answer, not a failure, but ONNX must give it
    too. NaN in a row with tokens, or a number where Keras has NaN, fails."""
    from keras_layers.export.loading import load
    from keras_layers.export.validating import compare, make_inputs

    ids = keras.Input((None,), dtype="int32", name="ids")
    hidden = keras.layers.Embedding(50, 4, mask_zero=True)(ids)
    model = keras.Model(ids, keras.layers.GlobalAveragePooling1D()(hidden))
    feeds = make_inputs(load(model), "padded", np.random.default_rng(0))
    assert not feeds["ids"][-1].any() and feeds["ids"][:-1, 0].all()  # the last row: padding
    report = export_model(model, tmp_path / "mean.onnx", ExportOptions(shapes=["padded"]))
    (check,) = report["checks"]
    assert report["passed"] and 0 < check["keras_nonfinite"] < 0.25

    valid = np.array([[True, True], [False, False]])
    expected = np.array([[1.0, 2.0], [np.nan, np.nan]], np.float32)
    assert compare("p", "y", expected.copy(), expected, 1e-4, 1e-3, valid).passed
    numbers = np.nan_to_num(expected)
    assert compare("p", "y", numbers, expected, 1e-4, 1e-3, valid).problem == (
        "NaN or infinity differs"
    )
    assert not compare("p", "y", expected[::-1].copy(), expected[::-1], 1e-4, 1e-3, valid).passed


@keras.saving.register_keras_serializable(package="tests")
class ScaleByEagerConstant(keras.layers.Layer):
    """Holds a tensor made eagerly, as GemmaBackbone's sqrt(hidden_dim): the
    trace captures it from outside the function."""

    def build(self, input_shape):
        self.factor = keras.ops.convert_to_tensor(np.float32(3.0))

    def call(self, x):
        return x * self.factor


def test_a_captured_constant_is_folded_not_a_graph_input(tmp_path):
    inputs = keras.Input((4,), name="x")
    model = keras.Model(inputs, ScaleByEagerConstant()(inputs))
    report = export_model(model, tmp_path / "c.onnx", ExportOptions(shapes=[(2, 4)]))
    assert report["passed"]
    assert [i.name for i in onnx.load(tmp_path / "c.onnx").graph.input] == ["x"]


def test_gemma_backbone_exports_with_its_captured_scale(tmp_path):
    import keras_hub

    keras.utils.set_random_seed(11)
    model = keras_hub.models.GemmaBackbone(
        vocabulary_size=100,
        num_layers=1,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=16,
        intermediate_dim=32,
        head_dim=8,
    )
    report = export_model(model, tmp_path / "gemma.onnx", ExportOptions(shapes=[(2, 5), "padded"]))
    assert report["passed"]
    names = sorted(i.name for i in onnx.load(tmp_path / "gemma.onnx").graph.input)
    assert names == ["padding_mask", "token_ids"]
    # Its grouped-query attention (2 query heads on 1 key/value head) is fused.
    assert report["graph"]["fused"]["MultiHeadAttention"] == 1


@keras.saving.register_keras_serializable(package="tests")
class BranchOnData(keras.layers.Layer):
    """Python `if` on a tensor's value: runs eagerly, has no static graph
    (keras-hub's Qwen3.5 and RWKV7 layers did the like on the sequence
    length, before keras_layers.export.sequence_loops)."""

    def compute_output_shape(self, shape):
        return shape

    def call(self, x):
        if keras.ops.sum(x) > 0:
            return x * 2.0
        return x


def test_python_control_flow_on_data_is_a_clear_conversion_error(tmp_path):
    from keras_layers.export import ConversionError

    inputs = keras.Input((4,), name="x")
    model = keras.Model(inputs, BranchOnData()(inputs))
    with pytest.raises(ConversionError, match="cannot be traced into a static graph"):
        export_model(model, tmp_path / "b.onnx", ExportOptions(shapes=[(2, 4)]))
    assert list(tmp_path.iterdir()) == []


def test_a_quick_gelu_onnx_runtime_cannot_read_is_left_alone(tmp_path):
    """x * sigmoid(1.702 x) as keras-hub's CLIP writes it crashed ONNX Runtime's
    FusionQuickGelu (None.item()); the match is declined, the export goes on."""
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    hidden = keras.layers.Embedding(10, 8)(ids)
    gelu = keras.layers.Activation(lambda t: t * keras.ops.sigmoid(1.702 * t))(hidden)
    model = keras.Model(ids, keras.layers.Dense(4)(gelu))
    report = export_model(model, tmp_path / "q.onnx", ExportOptions(shapes=[(2, 5)], unsafe=True))
    assert report["passed"]


def test_one_demo_folder_per_installation(tmp_path, monkeypatch):
    """In a checkout both commands share its `artifacts/demo` (the installed
    `keras-layers-export` trained a second demo in ~/.cache); elsewhere the
    cache folder; `$KERAS_LAYERS_HOME` wins over both."""
    from keras_layers.export.cli import default_demo_dir

    root = Path(__file__).resolve().parent.parent
    monkeypatch.delenv("KERAS_LAYERS_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_demo_dir() == root / "artifacts" / "demo"  # pip install -e of this checkout
    assert default_demo_dir(checkout=root) == root / "artifacts" / "demo"
    assert default_demo_dir(checkout=tmp_path) == tmp_path / "cache" / "keras-layers" / "demo"
    monkeypatch.setenv("KERAS_LAYERS_HOME", str(tmp_path / "home"))
    assert default_demo_dir() == default_demo_dir(checkout=root) == tmp_path / "home" / "demo"


def test_the_python_api_prints_no_tensorflow_warning_per_weight(tmp_path, caplog):
    """TensorFlow warned `__weight_0 is not a valid node name` once per weight
    we fed the traced function: our names, so ours to make valid."""
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    model = keras.Model(ids, keras.layers.Dense(3, name="head")(keras.layers.Embedding(20, 4)(ids)))
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        assert export_model(model, tmp_path / "m.onnx", ExportOptions(shapes=[(1, 3)]))["passed"]
    assert not [r for r in caplog.records if "not a valid node name" in r.getMessage()]
