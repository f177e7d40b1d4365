"""The tf2onnx building blocks `keras_layers/export/converting.py` relies on are still there.

They are public in the package but not documented as API, so a tf2onnx upgrade
must be checked here first (pyproject pins tf2onnx below 1.18).
"""

import inspect

import numpy as np
import pytest

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow


def test_tf2onnx_building_blocks_exist():
    from tf2onnx import convert, optimizer, tf_loader, tf_utils, tfonnx
    from tf2onnx.graph import ExternalTensorStorage

    assert callable(convert.tensor_names_from_structed)
    assert "large_model" in inspect.signature(tf_loader.from_function).parameters
    assert callable(tf_utils.compress_graph_def)
    params = inspect.signature(tfonnx.process_tf_graph).parameters
    assert {"const_node_values", "tensors_to_rename", "opset"} <= set(params)
    assert len(optimizer._get_optimizers()) >= 10
    assert hasattr(ExternalTensorStorage(), "name_to_tensor_data")


def test_conversion_keeps_weights_inline_and_exact(tmp_path):
    import keras

    from keras_layers.export import converting, loading, tracing

    inputs = keras.Input((5,))
    dense = keras.layers.Dense(3, name="dense")
    keras.Model(inputs, dense(inputs)).save(tmp_path / "m.keras")
    loaded = loading.load(tmp_path / "m.keras")
    converted = converting.convert(tracing.trace(loaded))
    from onnx import TensorProto, numpy_helper

    initializers = {i.name: i for i in converted.proto.graph.initializer}
    assert all(i.data_location == TensorProto.DEFAULT for i in initializers.values())
    kernel = np.asarray(loaded.model.get_layer("dense").kernel)
    stored = [numpy_helper.to_array(i) for i in initializers.values()]
    assert any(a.shape == kernel.shape and np.array_equal(a, kernel) for a in stored)


@pytest.mark.parametrize("opset", [12, 19, 99])
def test_unsupported_opset_is_refused(opset):
    from keras_layers.export.converting import check_opset
    from keras_layers.export.errors import UsageError

    with pytest.raises(UsageError, match="unsupported"):
        check_opset(opset)


def test_weights_become_initializers_named_by_keras_path(tmp_path):
    import keras

    from keras_layers.export import converting, loading, tracing

    inputs = keras.Input((5,))
    keras.Model(inputs, keras.layers.Dense(3, name="dense")(inputs)).save(tmp_path / "m.keras")
    traced = tracing.trace(loading.load(tmp_path / "m.keras"))
    proto = converting.convert(traced).proto
    assert [i.name for i in proto.graph.input] == traced.input_names
    names = {i.name for i in proto.graph.initializer}
    assert {"dense/kernel", "dense/bias"} <= names


def test_attention_is_traced_as_batched_matmuls_and_restored(tmp_path):
    """keras-hub's encoder reaches ONNX without tf2onnx's 5-D einsum lowering."""
    import keras
    import keras_hub
    from keras.src.backend.tensorflow import nn

    from keras_layers.export import converting, loading, slimming, tracing

    original = nn._dot_product_attention_xla
    ids = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(50, 16, mask_zero=True)(ids)
    x = keras_hub.layers.TransformerEncoder(intermediate_dim=32, num_heads=2)(x)
    keras.Model(ids, x).save(tmp_path / "m.keras")
    loaded = loading.load(tmp_path / "m.keras")
    proto = converting.convert(tracing.trace(loaded)).proto
    assert nn._dot_product_attention_xla is original
    ops = [node.op_type for node in proto.graph.node]
    assert "Einsum" not in ops
    # The padding mask selects the logits in one `Where`, without Keras'
    # `ones_like(logits) & mask` expansion.
    assert "Where" in ops and "Expand" not in ops, ops
    # (tf2onnx's lowering of EinsumDense transposes its kernels in 5-D too;
    # onnxslim folds those, so the slimmed graph is the one to look at.)
    proto = slimming.slim(proto, loaded.inputs, loaded.outputs).proto
    perms = [
        list(a.ints)
        for node in proto.graph.node
        if node.op_type == "Transpose"
        for a in node.attribute
        if a.name == "perm"
    ]
    assert all(len(perm) <= 4 for perm in perms), perms
    assert [node.op_type for node in proto.graph.node].count("MultiHeadAttention") == 1


def test_select_keeps_selected_away_infinities_out(tmp_path):
    """`where(x > 0, log(x), 0)` is 0, not NaN, where log(x) is -inf or NaN."""
    import keras
    import onnxruntime as ort

    from keras_layers.export import converting, loading, tracing

    x = keras.Input((4,), name="x")
    y = keras.ops.where(x > 0, keras.ops.log(x), 0.0)
    keras.Model(x, y).save(tmp_path / "m.keras")
    loaded = loading.load(tmp_path / "m.keras")
    proto = converting.convert(tracing.trace(loaded)).proto
    session = ort.InferenceSession(proto.SerializeToString())
    values = np.array([[2.0, 0.0, -1.0, 1.0]], "float32")
    (got,) = session.run(None, {"x": values})
    np.testing.assert_allclose(got, np.asarray(loaded.model(values)), rtol=1e-6)
    np.testing.assert_allclose(got, [[np.log(2.0), 0.0, 0.0, 0.0]], rtol=1e-6)
