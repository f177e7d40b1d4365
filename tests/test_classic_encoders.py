"""Classic Keras encoders people train: RNNs (masked), Conv1D, and the TF
tutorial's Transformer encoder as a subclassed model. Each exports with the
default grid and is checked again on a padded feed built here."""

import keras
import numpy as np
import onnxruntime as ort
import pytest

from keras_layers.export import ExportOptions, export_model

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

VOCAB, WIDTH = 50, 8


def recurrent(kind: str) -> keras.Model:
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    x = keras.layers.Embedding(VOCAB, WIDTH, mask_zero=True)(ids)
    layer = {
        "LSTM": lambda: keras.layers.LSTM(WIDTH, return_sequences=True),
        "GRU": lambda: keras.layers.GRU(WIDTH, return_sequences=True),
        "SimpleRNN": lambda: keras.layers.SimpleRNN(WIDTH, return_sequences=True),
        "Bidirectional": lambda: keras.layers.Bidirectional(
            keras.layers.LSTM(WIDTH // 2, return_sequences=True)
        ),
        "LSTM, last state": lambda: keras.layers.LSTM(WIDTH),
        "Conv1D": lambda: keras.layers.Conv1D(WIDTH, 3, padding="same"),
    }[kind]()
    return keras.Model(ids, keras.layers.Dense(5)(layer(x)))


@keras.saving.register_keras_serializable(package="tests")
class TutorialEncoder(keras.Model):
    """The TF tutorial's encoder: embedding x sqrt(d) + a fixed sin/cos table,
    then keras.layers.MultiHeadAttention and a feed-forward block."""

    def __init__(self, vocabulary=VOCAB, width=16, heads=2, length=64, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary, self.width, self.heads, self.length = vocabulary, width, heads, length
        self.embedding = keras.layers.Embedding(vocabulary, width, mask_zero=True)
        position = np.arange(length)[:, None]
        rates = 1 / np.power(10000, (2 * (np.arange(width)[None, :] // 2)) / width)
        angles = position * rates
        table = np.concatenate([np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])], axis=-1)
        self.table = table.astype("float32")
        self.attention = keras.layers.MultiHeadAttention(heads, width // heads)
        self.norm1 = keras.layers.LayerNormalization()
        self.norm2 = keras.layers.LayerNormalization()
        self.feed = keras.layers.Dense(width, activation="relu")

    def call(self, token_ids):
        mask = keras.ops.not_equal(token_ids, 0)
        x = self.embedding(token_ids) * keras.ops.sqrt(keras.ops.cast(self.width, "float32"))
        table = keras.ops.convert_to_tensor(self.table)
        x = x + table[None, : keras.ops.shape(token_ids)[1], :]
        attention_mask = keras.ops.logical_and(mask[:, :, None], mask[:, None, :])
        x = self.norm1(x + self.attention(x, x, attention_mask=attention_mask))
        return self.norm2(x + self.feed(x))

    def get_config(self):
        return {
            **super().get_config(),
            "vocabulary": self.vocabulary,
            "width": self.width,
            "heads": self.heads,
            "length": self.length,
        }


def padded_ids(rng):
    ids = rng.integers(1, VOCAB, size=(3, 10)).astype("int32")
    ids[1, 6:] = 0
    ids[2, 1:] = 0
    return ids


@pytest.mark.parametrize(
    "kind",
    [
        "LSTM",
        pytest.param("GRU", marks=pytest.mark.slow),
        "SimpleRNN",
        pytest.param("Bidirectional", marks=pytest.mark.slow),
        "LSTM, last state",
        "Conv1D",
    ],
)
def test_recurrent_and_convolutional_encoders_export(tmp_path, kind):
    keras.utils.set_random_seed(0)
    model = recurrent(kind)
    report = export_model(model, tmp_path / "m.onnx")
    assert report["passed"]
    ids = padded_ids(np.random.default_rng(1))
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"token_ids": ids})
    np.testing.assert_allclose(got, keras.ops.convert_to_numpy(model(ids)), atol=1e-4)


def test_the_tutorial_transformer_encoder_exports(tmp_path):
    keras.utils.set_random_seed(0)
    model = TutorialEncoder()
    ids = padded_ids(np.random.default_rng(2))
    expected = keras.ops.convert_to_numpy(model(ids))
    model.save(tmp_path / "tutorial.keras")
    report = export_model(
        tmp_path / "tutorial.keras", tmp_path / "t.onnx", ExportOptions(shapes=[(1, 7), (2, 64)])
    )
    assert report["passed"]
    session = ort.InferenceSession(str(tmp_path / "t.onnx"), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"inputs": ids})
    valid = ids != 0  # Keras leaves padded rows' values to the implementation
    np.testing.assert_allclose(got[valid], expected[valid], atol=1e-4)


def test_a_fixed_position_table_is_reported_as_a_constant_not_a_weight(tmp_path):
    keras.utils.set_random_seed(0)
    model = TutorialEncoder()
    model(padded_ids(np.random.default_rng(0)))
    report = export_model(model, tmp_path / "t.onnx", ExportOptions(shapes=[(1, 7)]))
    assert report["passed"] and report["unused_weights"] == []
    assert report["param_bytes"] == 4 * model.count_params()
    assert report["constant_bytes"] >= model.table.nbytes  # the 64 x 16 float32 table


@pytest.mark.parametrize("kind", ["Bidirectional", "GRU", "Conv1D"])
def test_a_recurrent_models_reference_is_traced_once_and_is_keras_eager_output(kind):
    """The grid's Keras outputs for a model that loops over time steps come
    from one traced graph (eagerly, TensorFlow runs the loop op by op);
    they are the eager call's, rounding aside, padding mask included. A
    model without a recurrent layer stays eager."""
    from keras_layers.export import loading, validating

    model = recurrent(kind)
    loaded = loading.load(model)
    feeds = {"token_ids": padded_ids(np.random.default_rng(0))}
    got = validating.keras_outputs(loaded, feeds, "padded")
    (name,) = got
    expected = keras.ops.convert_to_numpy(model(feeds["token_ids"], training=False))
    np.testing.assert_allclose(got[name], expected, rtol=1e-5, atol=1e-6)
    traced = loaded.graph_call is not validating._EAGER
    assert traced == (kind != "Conv1D"), loaded.graph_call
