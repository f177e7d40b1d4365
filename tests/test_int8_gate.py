"""The forward int8 file and its gate (issue #45, item 2): each row of an
activation is quantized alone, so a row's result never depends on the others
(an all-padding row's NaN stays in it), and a bias after it is added, not
scaled with the row; every reason a failed int8 file fails reaches the
terminal; the default grid holds the rows the gate needs."""

import json
import math

import keras
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from models import save, tied_encoder

from keras_layers.export import ExportOptions, export_model, loading, quantizing, validating
from keras_layers.export.cli import main
from keras_layers.export.tasks.forward import Forward

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow


def masked_pooling_classifier(heads: int = 1):
    """Ids -> Embedding(mask_zero) -> Dense -> masked mean -> softmax: the
    mean of an all-padding row is over no token, 0/0 = NaN."""
    keras.utils.set_random_seed(11)
    ids = keras.Input((None,), dtype="int32", name="ids")
    embedded = keras.layers.Embedding(200, 32, mask_zero=True)(ids)
    hidden = keras.layers.Dense(32, activation="relu")(embedded)
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    outputs = {
        f"class_{head}": keras.layers.Dense(5, activation="softmax", name=f"class_{head}")(pooled)
        for head in range(heads)
    }
    return keras.Model(ids, outputs if heads > 1 else outputs["class_0"])


def padded_ids(lengths, width: int = 12):
    """A batch of right-padded ids, one row per true length."""
    ids = np.random.default_rng(4).integers(1, 200, (len(lengths), width)).astype("int32")
    return np.where(np.arange(width) < np.array(lengths)[:, None], ids, 0)


def described(model):
    """The model loaded and described as an export describes it."""
    loaded = loading.load(model)
    loaded.inputs, loaded.outputs = Forward().describe(loaded)
    return loaded


def test_each_row_of_the_int8_file_gives_what_it_gives_alone(tmp_path):
    """A batch with an all-padding row: that row is NaN, as in the float file,
    and every other row is what the int8 file gives for it alone. With one
    scale for the whole activation, the NaN row made every row NaN (or came
    out finite, where ONNX Runtime's min/max skipped its NaN), and any row
    changed the others' rounding."""
    float_path, int8_path = tmp_path / "pool.onnx", tmp_path / "pool.int8.onnx"
    export_model(masked_pooling_classifier(), float_path, ExportOptions(shapes=[(2, 6)]))
    quantizing.quantize_int8(float_path, int8_path)
    int8 = ort.InferenceSession(str(int8_path), providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(str(float_path), providers=["CPUExecutionProvider"])
    for lengths in ([12, 5, 0, 9], [12, 5, 9], [1, 12]):
        ids = padded_ids(lengths)
        (batch,) = int8.run(None, {"ids": ids})
        (expected,) = reference.run(None, {"ids": ids})
        real = np.array(lengths) > 0
        for row in np.flatnonzero(real):
            (alone,) = int8.run(None, {"ids": ids[row : row + 1]})
            np.testing.assert_allclose(batch[row], alone[0], rtol=1e-6, atol=1e-7)
        assert np.isnan(batch[~real]).all() and np.isnan(expected[~real]).all()
        # Still a quantization of the float file: probabilities within 0.05.
        np.testing.assert_allclose(batch[real], expected[real], atol=0.05)
    ops = {node.op_type for node in onnx.load(str(int8_path)).graph.node}
    assert "DynamicQuantizeLinear" not in ops and "MatMulInteger" in ops


def test_a_row_of_zeros_gives_zeros_and_a_row_with_one_nan_gives_nans(tmp_path):
    """One MatMul, quantized: a row of zeros (scale 0) gives 0, a row with a
    single NaN, not first, gives NaN (ONNX Runtime's ReduceMax skips it), a row
    a million times larger changes no other, and every row is as alone."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "one_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", 8])],
        [numpy_helper.from_array(weight, "w")],
    )
    source, target = tmp_path / "matmul.onnx", tmp_path / "matmul.int8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), source)
    quantizing.quantize_int8(source, target)
    session = ort.InferenceSession(str(target), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((4, 16)).astype(np.float32)
    x[1] = 0.0
    x[2, 5] = np.nan
    x[3] *= 1e6
    (y,) = session.run(None, {"x": x})
    assert np.array_equal(y[1], np.zeros(8, np.float32))
    assert np.isnan(y[2]).all()
    for row in (0, 1, 3):
        (alone,) = session.run(None, {"x": x[row : row + 1]})
        np.testing.assert_allclose(y[row], alone[0], rtol=1e-6)
    np.testing.assert_allclose(
        y[0], x[0] @ weight, rtol=0.05, atol=0.05 * np.abs(x[0] @ weight).max()
    )


def test_a_bias_after_a_row_quantized_product_is_not_scaled_with_the_row(tmp_path):
    """`x @ w + b` quantized per row, run as ONNX Runtime optimizes it: the
    bias is added after the row scales, so the result is what the unfused
    graph gives, and no further from float32 than the per-tensor file's.
    ONNX Runtime fused the bias into its MatMulIntegerToFloat, whose kernel
    then multiplied it by each row's scale (largest magnitude / 127)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    weight = rng.standard_normal((64, 32)).astype(np.float32) / 8
    bias = rng.uniform(-3, 3, 32).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["y"])],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", 32])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    source = tmp_path / "dense.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), source)
    # Rows a hundredfold apart in size: one scale per tensor leaves the small
    # rows few steps, so per row must come out closer.
    x = (rng.standard_normal((16, 64)) * np.geomspace(0.1, 10, 16)[:, None]).astype(np.float32)
    expected = x @ weight + bias

    def run(path, level):
        options = ort.SessionOptions()
        options.graph_optimization_level = level
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return session.run(None, {"x": x})[0]

    def error(found):
        return float(np.linalg.norm(found - expected) / np.linalg.norm(expected))

    levels = ort.GraphOptimizationLevel
    found = {}
    for rows in (True, False):
        target = tmp_path / f"dense.rows_{rows}.onnx"
        quantizing.quantize_int8(source, target, rows=rows)
        found[rows] = run(target, levels.ORT_ENABLE_ALL)
        np.testing.assert_allclose(
            found[rows], run(target, levels.ORT_DISABLE_ALL), rtol=1e-5, atol=1e-5
        )
    per_row, per_tensor = error(found[True]), error(found[False])
    assert per_row <= per_tensor < 0.05, (per_row, per_tensor)


def test_a_failed_int8_validation_names_every_reason():
    """A failed check and a failed gate: the failure names both; a gate that
    fails for its agreement and for its count names both."""
    pool = validating._Pool()
    pool.add(validating.Check("2x5", "probs", 0, 0, True, 0.5, top1_tokens=10), None, None)
    (gate,) = pool.gates(0.9, 1000)
    assert "top-1 agreement 50.00%" in gate.problem and "only 10 tokens" in gate.problem
    broken = validating.Check("padded", "probs", math.inf, math.inf, False)
    broken.problem = "NaN or infinity differs"
    failure = validating.Validation(checks=[broken], gates=[gate]).failure()
    for reason in ("NaN or infinity differs", "top-1 agreement 50.00%", "only 10 tokens"):
        assert reason in failure, failure


def test_every_reason_the_int8_gates_fail_reaches_the_terminal(tmp_path, capsys):
    """Two outputs, each short of rows on the caller's grid: both reasons are
    printed, not only the first (the rest were in the report file alone)."""
    model = save(masked_pooling_classifier(heads=2), tmp_path / "two_heads.keras")
    output = tmp_path / "out.onnx"
    code = main([str(model), "-o", str(output), "--shapes", "2x5", "--quantize", "int8"])
    terminal = capsys.readouterr()
    assert code != 0
    report = json.loads((tmp_path / "out.report.failed.json").read_text())
    failed = [gate for gate in report["int8"]["gates"] if not gate["passed"]]
    assert sorted(gate["output"] for gate in failed) == ["class_0", "class_1"]
    lines = [" ".join(line.split()) for line in (terminal.out + terminal.err).splitlines()]
    for gate in failed:
        reason = " ".join(gate["problem"].split())
        assert any(gate["output"] in line and reason in line for line in lines), (gate, lines)


def test_the_default_int8_grid_holds_the_rows_the_gate_needs():
    """A classifier's top-1 decisions are its rows: the default grid holds 44,
    so an int8 export's grid adds 1,000 rows of 7 tokens. A language model's
    are its tokens (3,608 already): nothing is added."""
    classifier = described(masked_pooling_classifier())
    plain = validating.default_shapes(classifier)
    assert sum(shape[0] for shape in plain if shape != validating.PADDED) == 44
    assert validating.default_shapes(classifier, int8=True) == [*plain[:-1], (1000, 7), "padded"]
    encoder = described(tied_encoder())
    assert validating.default_shapes(encoder, int8=True) == validating.default_shapes(encoder)


def test_a_classifier_exports_int8_with_default_flags(tmp_path, capsys):
    """`--quantize int8` and nothing else: the gate judges enough rows (the
    padded point's empty row NaN in both files), and passes."""
    model = save(masked_pooling_classifier(), tmp_path / "pool.keras")
    code = main([str(model), "-o", str(tmp_path / "pool.onnx"), "--quantize", "int8"])
    terminal = capsys.readouterr()
    assert code == 0, terminal.out + terminal.err
    int8 = json.loads((tmp_path / "pool.report.json").read_text())["int8"]
    (gate,) = int8["gates"]
    assert gate["statistic"] == "top-1 agreement" and gate["tokens"] >= validating.INT8_MIN_TOKENS
    assert gate["passed"] and int8["passed"]
    padded = [check for check in int8["checks"] if check["shape"] == "padded"]
    assert padded and all(check["passed"] and check["top1_tokens"] == 4 for check in padded)
