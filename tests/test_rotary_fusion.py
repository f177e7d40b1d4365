"""`fusions.rotary`: rotary position embeddings become ONNX Runtime's `RotaryEmbedding`.

Checked against RoFormer's rotation written here in NumPy (feature i turned
with feature i + H/2 by the angle position * base^(-2i/H)), on keras-hub's
`RotaryEmbedding` layer and on a hand-written rotation in both of the forms
the rule matches; and on lookalikes the rule must leave alone, which must
still export and match Keras.
"""

import keras
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from keras import ops

from keras_layers.export import ExportOptions, export_model

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

VOCAB, HEADS, SIZE = 50, 3, 8
SHAPES = [(2, 16), (1, 1), (3, 5), "padded"]


def rotate(x, positions, base=10000.0, scaling=1.0):
    """RoFormer's rotation, "rotate half" pairing, of x (batch, seq, heads, size)
    at `positions` (batch or 1, seq)."""
    half = x.shape[-1] // 2
    frequencies = base ** (-2.0 * np.arange(half) / x.shape[-1]) / scaling
    angles = positions[:, :, None, None] * frequencies  # (b, s, 1, half)
    first, second = x[..., :half], x[..., half:]
    cos, sin = np.cos(angles), np.sin(angles)
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def model_around(rotation, with_positions=False, size=SIZE):
    """token ids -> embedding -> (batch, seq, heads, size) -> `rotation` -> flat."""
    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    inputs = [ids]
    x = keras.layers.Embedding(VOCAB, HEADS * size)(ids)
    x = keras.layers.Reshape((-1, HEADS, size))(x)
    if with_positions:
        positions = keras.Input((None,), dtype="int32", name="position_ids")
        inputs.append(positions)
        x = rotation(x, positions=positions)
    else:
        x = rotation(x)
    return keras.Model(inputs, keras.layers.Reshape((-1, HEADS * size))(x))


def embedded(model, ids):
    table = model.layers[1].embeddings.numpy()
    return table[ids].reshape(*ids.shape, HEADS, -1)


def run(path, feeds):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def ops_of(path):
    return [node.op_type for node in onnx.load(path).graph.node]


@pytest.mark.parametrize(
    "arguments",
    [{}, {"max_wavelength": 500, "scaling_factor": 4.0}],
    ids=["default", "wavelength 500, scaling 4"],
)
def test_keras_hub_rotary_embedding_is_fused_and_matches_roformer(arguments, tmp_path):
    import keras_hub

    model = model_around(keras_hub.layers.RotaryEmbedding(**arguments))
    path = tmp_path / "rope.onnx"
    report = export_model(model, path, ExportOptions(shapes=SHAPES))
    assert report["passed"] and report["graph"]["fused"]["RotaryEmbedding"] == 1
    found = ops_of(path)
    assert found.count("RotaryEmbedding") == 1 and "Neg" not in found and "Split" not in found
    base = arguments.get("max_wavelength", 10000.0)
    scaling = arguments.get("scaling_factor", 1.0)
    for batch, length in [(1, 1), (2, 7), (1, 300)]:
        ids = np.random.default_rng(length).integers(0, VOCAB, (batch, length)).astype(np.int32)
        expected = rotate(embedded(model, ids), np.arange(length)[None], base, scaling)
        got = run(path, {"token_ids": ids}).reshape(expected.shape)
        np.testing.assert_allclose(got, expected, rtol=0, atol=2e-5)


def test_a_rotation_of_two_features_is_fused(tmp_path):
    """Head size 2 (GPT-NeoX turns a quarter of each head: 2 of 8 in a tiny
    config): the angle table's halves are single features, stacked on an axis
    that only a size-1 axis follows."""
    import keras_hub

    model = model_around(keras_hub.layers.RotaryEmbedding(), size=2)
    path = tmp_path / "two.onnx"
    report = export_model(model, path, ExportOptions(shapes=SHAPES))
    assert report["passed"] and report["graph"]["fused"]["RotaryEmbedding"] == 1
    ids = np.random.default_rng(4).integers(0, VOCAB, (2, 9)).astype(np.int32)
    expected = rotate(embedded(model, ids), np.arange(9)[None])
    got = run(path, {"token_ids": ids}).reshape(expected.shape)
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-5)


class HandWrittenRotation(keras.layers.Layer):
    """x * cos(e) + concat(-x2, x1) * sin(e), with e = concat(f, g) on the last
    axis: g = f is a rotation; g = 2f is not one (its halves differ)."""

    def __init__(self, second_half_factor=1.0, **kwargs):
        super().__init__(**kwargs)
        self.second_half_factor = second_half_factor

    def call(self, x):
        half = SIZE // 2
        positions = ops.arange(ops.shape(x)[1], dtype="float32")
        frequencies = ops.convert_to_tensor(10000.0 ** (-2.0 * np.arange(half) / SIZE), "float32")
        f = ops.expand_dims(positions, -1) * frequencies
        angles = ops.concatenate([f, f * self.second_half_factor], axis=-1)[None, :, None, :]
        first, second = ops.split(x, 2, axis=-1)
        rotated = ops.concatenate([-second, first], axis=-1)
        return x * ops.cos(angles) + rotated * ops.sin(angles)


def test_a_rotation_written_by_hand_with_concatenations_is_fused(tmp_path):
    model = model_around(HandWrittenRotation())
    path = tmp_path / "hand.onnx"
    report = export_model(model, path, ExportOptions(shapes=SHAPES))
    assert report["passed"] and report["graph"]["fused"]["RotaryEmbedding"] == 1
    ids = np.random.default_rng(0).integers(0, VOCAB, (2, 9)).astype(np.int32)
    expected = rotate(embedded(model, ids), np.arange(9)[None])
    np.testing.assert_allclose(run(path, {"token_ids": ids}).reshape(expected.shape), expected,
                               rtol=0, atol=2e-5)  # fmt: skip


def test_angles_whose_halves_differ_are_left_alone_and_say_why(tmp_path):
    model = model_around(HandWrittenRotation(second_half_factor=2.0))
    path = tmp_path / "lookalike.onnx"
    report = export_model(model, path, ExportOptions(shapes=SHAPES))
    assert report["passed"] and report["graph"]["fused"]["RotaryEmbedding"] == 0
    assert "RotaryEmbedding" not in ops_of(path)
    reasons = report["graph"]["declined"]["RotaryEmbedding"]
    assert reasons == {"the angles' two halves are not one tensor written twice": 1}
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 6)).astype(np.int32)
    np.testing.assert_allclose(run(path, {"token_ids": ids}), model(ids), rtol=0, atol=2e-5)


def test_per_row_positions_are_fused_with_their_positions_as_the_ops_input(tmp_path):
    """keras-hub's layer given `position_ids` (batch, sequence), as a decoder
    with a padded batch is traced: the op reads each row's positions from a
    table up to the largest of them."""
    import keras_hub

    model = model_around(keras_hub.layers.RotaryEmbedding(), with_positions=True)
    path = tmp_path / "positions.onnx"
    report = export_model(model, path, ExportOptions(shapes=SHAPES))
    assert report["passed"] and report["graph"]["fused"]["RotaryEmbedding"] == 1
    assert "Neg" not in ops_of(path) and "RotaryEmbedding" not in report["graph"]["declined"]
    ids = np.random.default_rng(2).integers(0, VOCAB, (2, 6)).astype(np.int32)
    cases = [
        [[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]],
        [[3, 3, 0, 1, 2, 900]] * 2,
        [[0] * 6, [1] * 6],  # a table shorter than the sequence: ONNX Runtime refuses one
    ]
    for positions in cases:
        positions = np.array(positions, np.int32)
        expected = rotate(embedded(model, ids), positions)
        got = run(path, {"token_ids": ids, "position_ids": positions}).reshape(expected.shape)
        np.testing.assert_allclose(got, expected, rtol=0, atol=5e-5)


def test_per_row_positions_of_floats_are_left_alone_and_say_why(tmp_path):
    """The op's positions are integers: angles from float positions are not
    what it computes, and stay as traced."""
    import keras_hub

    keras.utils.set_random_seed(0)
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    positions = keras.Input((None,), dtype="float32", name="position_ids")
    x = keras.layers.Reshape((-1, HEADS, SIZE))(keras.layers.Embedding(VOCAB, HEADS * SIZE)(ids))
    x = keras_hub.layers.RotaryEmbedding()(x, positions=positions)
    model = keras.Model([ids, positions], keras.layers.Reshape((-1, HEADS * SIZE))(x))
    path = tmp_path / "float_positions.onnx"
    report = export_model(model, path, ExportOptions(shapes=SHAPES))
    assert report["passed"] and report["graph"]["fused"]["RotaryEmbedding"] == 0
    reasons = report["graph"]["declined"]["RotaryEmbedding"]
    assert reasons == {
        "each row's angles are not its integer positions times constant frequencies": 1
    }


class EsmRotation(keras.layers.Layer):
    """keras-hub's ESM rotary embedding of x as query and 2x as key, summed: its
    factors are views of the cosine and sine, `cos(e)[None, :, None, :]`
    sliced to the sequence as `x[:, :shape(x)[1]]` (a clamped end in ONNX)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        from keras_hub.src.models.esm.esm_attention import ESMRotaryEmbedding

        self.rotary = ESMRotaryEmbedding()

    def call(self, x):
        query, key = self.rotary(x, 2.0 * x)
        return query + key


def test_esms_rotation_of_sliced_views_is_fused_and_matches_roformer(tmp_path):
    model = model_around(EsmRotation())
    path = tmp_path / "esm.onnx"
    report = export_model(model, path, ExportOptions(shapes=SHAPES))
    assert report["passed"] and report["graph"]["fused"]["RotaryEmbedding"] == 2, report["graph"]
    assert "Neg" not in ops_of(path)
    for batch, length in [(1, 1), (2, 7)]:
        ids = np.random.default_rng(length).integers(0, VOCAB, (batch, length)).astype(np.int32)
        expected = 3 * rotate(embedded(model, ids), np.arange(length)[None])
        got = run(path, {"token_ids": ids}).reshape(expected.shape)
        np.testing.assert_allclose(got, expected, rtol=0, atol=4e-5)
