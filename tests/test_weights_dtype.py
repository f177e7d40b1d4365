"""`--weights-dtype`: matrix weights stored in float16 or bfloat16 behind a
Cast to float32, checked against Keras in float32."""

import keras
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from keras_layers.export import ExportOptions, ValidationFailed, export_model, validate, validating
from keras_layers.export.errors import UsageError
from keras_layers.export.passes.weights_dtype import rounds, store_in_half, stored_dtype
from tests.zoo_models import redraw

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

SHAPES = [(1, 4), (2, 7), "padded"]


def _graph():
    """Gather(table) -> MatMul(w) + bias: two matrix weights and a bias."""
    rng = np.random.default_rng(0)
    table = rng.normal(size=(50, 16)).astype(np.float32)
    w = rng.normal(size=(16, 32)).astype(np.float32)
    bias = rng.normal(size=(32,)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["x"]),
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("Add", ["y", "bias"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [None])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 32])],
        [numpy_helper.from_array(a, n) for a, n in ((table, "table"), (w, "w"), (bias, "bias"))],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return proto, {"table": table, "w": w, "bias": bias}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_matrix_weights_are_stored_rounded_behind_a_cast(dtype):
    import ml_dtypes

    proto, arrays = _graph()
    ids = np.array([3, 7, 49])

    assert store_in_half(proto, dtype) == 2

    half = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
    stored = {t.name: t for t in proto.graph.initializer}
    assert stored["bias"].data_type == TensorProto.FLOAT  # an Add reads it: float32
    for name in ("table", "w"):
        assert helper.tensor_dtype_to_np_dtype(stored[name].data_type) == np.dtype(half)
        np.testing.assert_array_equal(
            numpy_helper.to_array(stored[name]), arrays[name].astype(half)
        )
    assert sorted(n.op_type for n in proto.graph.node) == [
        "Add",
        "Cast",
        "Cast",
        "Gather",
        "MatMul",
    ]
    got = ort.InferenceSession(proto.SerializeToString()).run(None, {"ids": ids})[0]
    rounded = {name: arrays[name].astype(half).astype(np.float32) for name in ("table", "w")}
    expected = rounded["table"][ids] @ rounded["w"] + arrays["bias"]
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize(
    "choice, policies, stored, rounded",
    [
        ("float32", ["bfloat16"], "float32", False),
        ("float16", [], "float16", True),
        ("float16", ["float16"], "float16", False),
        ("float16", ["bfloat16"], "float16", True),
        ("keep", ["bfloat16"], "bfloat16", False),
        ("keep", ["mixed_bfloat16"], "float32", False),  # mixed: float32 variables
        ("keep", [], "float32", False),
    ],
)
def test_the_stored_dtype_follows_the_choice_and_the_models_variables(
    choice, policies, stored, rounded
):
    assert stored_dtype(choice, policies) == stored
    assert rounds(choice, policies) is rounded


def _bert_like(dtype=None):
    import keras_hub

    keras.utils.set_random_seed(3)
    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=300,
        num_layers=2,
        num_heads=2,
        hidden_dim=64,
        intermediate_dim=128,
        max_sequence_length=16,
        dtype=dtype,
    )
    return redraw(backbone)


def _initializer_types(path) -> set:
    proto = onnx.load(str(path), load_external_data=False)
    return {t.data_type for t in proto.graph.initializer if np.prod(t.dims) >= 256}


def test_a_bfloat16_model_kept_in_bfloat16_matches_keras_at_float32_tolerances(tmp_path):
    """Keras computes in float32 from the bfloat16 values; the file stores those
    very values: no rounding, so the default tolerances hold."""
    path = tmp_path / "bf16.keras"
    _bert_like("bfloat16").save(path)
    kept, wide = tmp_path / "kept.onnx", tmp_path / "wide.onnx"

    report = export_model(path, kept, ExportOptions(shapes=SHAPES, weights_dtype="keep"))
    export_model(path, wide, ExportOptions(shapes=SHAPES))

    assert report["passed"] and report["weights_dtype"] == "bfloat16"
    assert report["tolerances"] == {
        "atol": validating.DEFAULT_ATOL,
        "rtol": validating.DEFAULT_RTOL,
    }
    assert TensorProto.BFLOAT16 in _initializer_types(kept)
    assert TensorProto.BFLOAT16 not in _initializer_types(wide)
    assert kept.stat().st_size < 0.6 * wide.stat().st_size


def test_float16_weights_pass_at_their_stated_tolerances_and_only_there(tmp_path):
    path = tmp_path / "bert.keras"
    _bert_like().save(path)
    out = tmp_path / "half.onnx"

    report = export_model(path, out, ExportOptions(shapes=SHAPES, weights_dtype="float16"))

    assert report["passed"] and report["weights_dtype"] == "float16"
    assert report["tolerances"] == {
        "atol": validating.HALF_WEIGHTS_ATOL,
        "rtol": validating.HALF_WEIGHTS_RTOL,
    }
    assert TensorProto.FLOAT16 in _initializer_types(out)
    # The rounding is real: the same file fails float32's tolerances, so the
    # checks above are not vacuous.
    with pytest.raises(ValidationFailed):
        validate(path, out, ExportOptions(shapes=SHAPES))


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(weights_dtype="float8"), "choose one of"),
        (dict(weights_dtype="float16", quantize="int8"), "float32 weights"),
    ],
)
def test_bad_weights_dtype_settings_are_refused(options, message):
    with pytest.raises(UsageError, match=message):
        ExportOptions(**options)
