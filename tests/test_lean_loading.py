"""`lean_loading.load` gives the model `keras.saving.load_model` gives, with
one copy of the weights: same variables (paths, dtypes, values), same outputs,
and Keras' own fallback for archives it does not read."""

import threading
import zipfile

import keras
import numpy as np
import pytest

from keras_layers.export import lean_loading
from tests import models
from tests.zoo_models import redraw

pytestmark = pytest.mark.tensorflow_only  # the loader builds TensorFlow variables


def _bert():
    import keras_hub

    return keras_hub.models.BertBackbone(
        vocabulary_size=50,
        num_layers=2,
        num_heads=2,
        hidden_dim=8,
        intermediate_dim=16,
        max_sequence_length=16,
    )


def _llama_causal_lm():
    import keras_hub

    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=50,
        num_layers=2,
        num_query_heads=4,
        num_key_value_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
    )
    return keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)


def _lstm_with_batch_norm():
    ids = keras.Input((None,), dtype="int32", name="ids")
    hidden = keras.layers.Embedding(30, 8, mask_zero=True)(ids)
    hidden = keras.layers.LSTM(6, return_sequences=True)(hidden)
    hidden = keras.layers.BatchNormalization()(hidden)
    hidden = keras.layers.Dropout(0.3)(hidden)
    return keras.Model(ids, keras.layers.Dense(4)(hidden))


BUILDERS = {
    "tied_encoder": models.tied_encoder,
    "bert": _bert,
    "llama_causal_lm": _llama_causal_lm,
    "lstm_batch_norm": _lstm_with_batch_norm,
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_the_lean_load_gives_keras_own_model(name, tmp_path):
    keras.utils.set_random_seed(1)
    model = redraw(BUILDERS[name]())
    if name == "lstm_batch_norm":  # non-trainable moving statistics, not zero
        for weight in model.non_trainable_weights:
            weight.assign(np.full(weight.shape, 0.7, weight.dtype))
    path = tmp_path / f"{name}.keras"
    model.save(path)

    lean = lean_loading.load(path)
    reference = keras.saving.load_model(path, compile=False)

    assert lean is not None
    models.assert_same_variables(lean, reference)
    feeds = {
        tensor.name: np.random.default_rng(0).integers(0, 2, size=(2, 7)).astype("int32")
        if tensor.dtype.startswith("int")
        else np.ones((2, 7), tensor.dtype)
        for tensor in reference.inputs
    }
    feed = feeds if len(feeds) > 1 else next(iter(feeds.values()))
    for got, expected in zip(
        keras.tree.flatten(lean(feed, training=False)),
        keras.tree.flatten(reference(feed, training=False)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_no_variable_is_left_deferred(tmp_path):
    """A later StatelessScope (the trace uses one) must find nothing to initialize."""
    from keras.src.backend.common import global_state

    path = tmp_path / "tied.keras"
    models.tied_encoder().save(path)
    model = lean_loading.load(path)

    assert global_state.get_global_attribute("uninitialized_variables", []) == []
    with keras.StatelessScope():
        pass
    assert all(variable.value is not None for variable in model.variables)


def test_a_compressed_archive_falls_back_to_keras(tmp_path):
    path = tmp_path / "tied.keras"
    models.tied_encoder().save(path)
    packed = tmp_path / "packed.keras"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(packed, "w") as target:
        for item in source.infolist():
            target.writestr(item.filename, source.read(item), zipfile.ZIP_DEFLATED)

    assert lean_loading.load(packed) is None


def test_the_window_reads_only_its_byte_range(tmp_path):
    path = tmp_path / "bytes"
    path.write_bytes(bytes(range(100)))
    with open(path, "rb") as file:
        window = lean_loading._Window(file.fileno(), 10, 20)
        assert window.read(5) == bytes(range(10, 15))
        window.seek(-3, 2)
        assert window.read() == bytes(range(27, 30))
        assert window.read(4) == b""
        window.seek(18)
        buffer = bytearray(8)
        assert window.readinto(buffer) == 2
        assert bytes(buffer[:2]) == bytes([28, 29])


@keras.saving.register_keras_serializable(package="test_lean_loading")
class _PausingScale(keras.layers.Layer):
    """Holds the thread that builds it inside `build` while `hold` is set,
    until `release` is set."""

    hold, inside, release = threading.Event(), threading.Event(), threading.Event()

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones")
        if _PausingScale.hold.is_set():
            _PausingScale.inside.set()
            _PausingScale.release.wait(60)

    def call(self, inputs):
        return inputs * self.scale


def test_layers_built_in_another_thread_during_a_load_are_keras_own(tmp_path):
    """The load defers variable creation in its own thread only: a layer
    built and assigned to in another thread meanwhile gets its initial value
    at once, and the loaded model still equals Keras' own load."""
    keras.utils.set_random_seed(2)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, _PausingScale()(keras.layers.Dense(3)(inputs)))
    model.layers[-1].scale.assign([2.0, 3.0, 4.0])
    path = tmp_path / "pausing.keras"
    model.save(path)
    loaded = {}
    _PausingScale.hold.set()
    loader = threading.Thread(target=lambda: loaded.update(model=lean_loading.load(path)))
    loader.start()
    try:
        assert _PausingScale.inside.wait(60), "the load never reached the layer's build"
        dense = keras.layers.Dense(5, kernel_initializer="ones", bias_initializer="zeros")
        dense.build((None, 2))
        # While the load is still held inside its build:
        assert dense.kernel._value is not None
        np.testing.assert_array_equal(np.asarray(dense.kernel.value), np.ones((2, 5)))
        dense.bias.assign(np.full(5, 7.0, "float32"))
        np.testing.assert_array_equal(np.asarray(dense.bias.value), np.full(5, 7.0))
    finally:
        _PausingScale.hold.clear()
        _PausingScale.release.set()
        loader.join()

    np.testing.assert_array_equal(np.asarray(dense.bias.value), np.full(5, 7.0))
    reference = keras.saving.load_model(path, compile=False)
    models.assert_same_variables(loaded["model"], reference)


# Child: load the archive and print how much the peak RSS grew meanwhile.
_PEAK_PROBE = """
import json, sys
from keras_layers import ScaledEmbedding, TiedOutputDense  # registers them
from keras_layers.export import lean_loading

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

open("/proc/self/clear_refs", "w").write("5")  # the peak starts at the current RSS
before = status("VmRSS")
model = lean_loading.load(sys.argv[1])
print(json.dumps({"grown": status("VmHWM") - before, "loaded": model is not None}))
"""


def test_a_large_variable_is_in_memory_once_while_it_loads(tmp_path):
    """TensorFlow copies an array twice on its way to a variable (NumPy ->
    tensor -> variable); the lean load makes the variable over the array it
    read. A 400 MB matrix's load grows the peak RSS by its size, not three
    times it (3.0x measured through Keras' conversion)."""
    import json
    import subprocess
    import sys

    from keras_layers import ScaledEmbedding, TiedOutputDense

    ids = keras.Input((None,), dtype="int32")
    embedding = ScaledEmbedding(50_000, 2048)
    path = tmp_path / "tied.keras"
    keras.Model(ids, TiedOutputDense(embedding)(embedding(ids))).save(path)
    probe = subprocess.run(
        [sys.executable, "-c", _PEAK_PROBE, str(path)], capture_output=True, text=True, check=True
    )
    measured = json.loads(probe.stdout.strip().splitlines()[-1])
    assert measured["loaded"]
    assert measured["grown"] < 1.25 * 50_000 * 2048 * 4, measured
