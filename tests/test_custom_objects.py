"""Custom layers as keras.io writes them (unregistered, `__init__` without `**kwargs`,
a TextVectorization with its own `standardize` function), given with `--import`."""

import importlib
import io
import os
import sys
import textwrap
import zipfile

import h5py
import keras
import pytest
from models import save
from test_export_bad_input import assert_one_clear_line, run_cli

from keras_layers.export import ExportOptions, export_model, loading
from keras_layers.export.errors import ModelLoadError

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

MODULE = "keras_io_layers"
REGISTERED = "keras_io>Doubler"
# A module as keras.io's examples write one: layers without registration, one
# without **kwargs, a module-level function, and a `Functional` that must never
# stand in for Keras' own class of that name.
SOURCE = textwrap.dedent(
    """
    import re
    import string

    import keras
    import tensorflow as tf
    from keras.layers import Dense  # imported, not defined here: never a custom object


    class Scale(keras.layers.Layer):
        def __init__(self, factor=2.0, **kwargs):
            super().__init__(**kwargs)
            self.factor = factor

        def call(self, x):
            return x * self.factor

        def get_config(self):
            return {**super().get_config(), "factor": self.factor}


    class Shift(keras.layers.Layer):
        def __init__(self, amount=1.0):
            super().__init__()
            self.amount = amount

        def call(self, x):
            return x + self.amount

        def get_config(self):
            config = super().get_config()
            config.update({"amount": self.amount})
            return config


    class Widen(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)

        def call(self, x):
            return x

        def get_config(self):
            return {**super().get_config(), "width": 3}


    @keras.saving.register_keras_serializable(package="keras_io")
    class Doubler(keras.layers.Layer):
        def call(self, x):
            return x * 2.0


    def halve(x):
        return x * 0.5


    class Functional(keras.layers.Layer):
        pass


    def custom_standardization(input_data):
        lowercase = tf.strings.lower(input_data)
        return tf.strings.regex_replace(lowercase, f"[{re.escape(string.punctuation)}]", "")
    """
)


def _with_external_weights(source, path):
    """`source`'s archive with its first variable stored in a file beside it, which
    Keras refuses to read (an HDF5 external dataset)."""
    outside = path.with_suffix(".bin")
    outside.write_bytes(bytes(1024))
    with zipfile.ZipFile(source) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    weights = io.BytesIO()
    with (
        h5py.File(io.BytesIO(entries["model.weights.h5"]), "r") as old,
        h5py.File(weights, "w") as new,
    ):

        def copy(name, item):
            if not isinstance(item, h5py.Dataset):
                new.require_group(name)
            elif name.endswith("vars/0"):
                new.create_dataset(
                    name, shape=item.shape, dtype=item.dtype, external=[(str(outside), 0, 1024)]
                )
            else:
                new.create_dataset(name, data=item[()])

        old.visititems(copy)
    entries["model.weights.h5"] = weights.getvalue()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The module's source folder and models saved from it. Keras finds unregistered
    classes only through custom objects, so this process knows none of them by name
    once the module and the registration are dropped."""
    folder = tmp_path_factory.mktemp("custom")
    (folder / f"{MODULE}.py").write_text(SOURCE)
    sys.path.insert(0, str(folder))
    try:
        mine = importlib.import_module(MODULE)
    finally:
        sys.path.remove(str(folder))
    inputs = keras.Input((3,))
    outputs = keras.layers.Dense(3)(mine.Doubler()(mine.Scale()(inputs)))
    outputs = keras.layers.Dense(2, activation=mine.halve)(outputs)
    models = {"custom": save(keras.Model(inputs, outputs), folder / "custom.keras")}
    models["shift"] = save(keras.Model(inputs, mine.Shift()(inputs)), folder / "shift.keras")
    # A class defined in the script that saves the model, as keras.io's examples do.
    gate = type("Gate", (mine.Scale,), {"__module__": "__main__"})
    models["script"] = save(keras.Model(inputs, gate()(inputs)), folder / "script.keras")
    models["widen"] = save(keras.Model(inputs, mine.Widen()(inputs)), folder / "widen.keras")
    vectorize = keras.layers.TextVectorization(
        max_tokens=20, output_sequence_length=4, standardize=mine.custom_standardization
    )
    vectorize.adapt(["The cat sat.", "A dog ran!"])
    text = keras.Input((1,), dtype="string")
    ids = keras.layers.Embedding(20, 4)(vectorize(text))
    models["text"] = save(keras.Model(text, ids), folder / "text.keras")
    dense = save(keras.Model(inputs, keras.layers.Dense(2)(inputs)), folder / "dense.keras")
    models["external"] = _with_external_weights(dense, folder / "external.keras")
    sys.modules.pop(MODULE)
    keras.saving.get_custom_objects().pop(REGISTERED)
    yield folder, models
    sys.modules.pop(MODULE, None)
    keras.saving.get_custom_objects().pop(REGISTERED, None)


@pytest.fixture(autouse=True)
def in_folder(saved, monkeypatch):
    """Each test runs in the module's folder, where `--import` finds it."""
    monkeypatch.chdir(saved[0])


def refused(capsys, model, *flags):
    """The command's one line refusing `model`: exit 2, nothing written."""
    output = model.with_suffix(".onnx")
    code, _, err = run_cli(capsys, model, "-o", output, *flags)
    assert code == 2, err
    assert not output.exists()
    return err


def test_without_import_the_message_names_the_class_and_its_module(saved, capsys):
    err = refused(capsys, saved[1]["custom"])
    assert_one_clear_line(err, "'Scale'", f"module {MODULE}", f"--import {MODULE}")
    with pytest.raises(ModelLoadError, match=rf"imports=\['{MODULE}'\]"):
        export_model(saved[1]["custom"], saved[0] / "api.onnx")


def test_import_finds_unregistered_layers_and_functions(saved, capsys):
    """Scale (unregistered), Doubler (registered) and halve (a function) all load;
    the module's own `Functional` does not replace Keras' class of that name."""
    model = saved[1]["custom"]
    code, _, err = run_cli(capsys, model, "-o", model.with_suffix(".onnx"), "--import", MODULE)
    assert code == 0, err
    assert model.with_suffix(".onnx").exists()
    loaded = loading.load(model, imports=[MODULE])
    assert {"Scale", "Doubler"} <= {type(layer).__name__ for layer in loaded.model.layers}
    assert type(loaded.model).__module__.startswith("keras.")


def test_init_without_kwargs_names_the_layer_and_the_fix(saved, capsys):
    err = refused(capsys, saved[1]["shift"], "--import", MODULE)
    assert_one_clear_line(
        err, "layer Shift", "'name'", "**kwargs", "super().__init__(**kwargs)", "from_config"
    )
    options = ExportOptions(imports=[MODULE])
    with pytest.raises(ModelLoadError, match=r"Add \*\*kwargs to Shift.__init__"):
        export_model(saved[1]["shift"], saved[0] / "api.onnx", options)


def test_a_class_of_the_training_script_must_move_to_a_module(saved, capsys):
    err = refused(capsys, saved[1]["script"])
    assert_one_clear_line(
        err, "'Gate'", "defined in the script that saved the model", "--import MODULE"
    )


def test_a_chained_error_keeps_its_root_cause(saved, capsys):
    """Keras' error about Widen starts with a generic line; its last one says why."""
    err = refused(capsys, saved[1]["widen"], "--import", MODULE)
    assert_one_clear_line(
        err,
        "could not be deserialized",
        "Unrecognized keyword arguments passed to Widen: {'width': 3}",
    )
    assert "config=" not in err


def test_hdf5_refusals_are_quoted(saved, capsys):
    err = refused(capsys, saved[1]["external"])
    assert_one_clear_line(err, "external.keras", "(an external dataset)")
    legacy = saved[0] / "legacy.h5"
    with h5py.File(legacy, "w") as file:
        file.attrs["keras_version"] = "2.15.0"
    assert_one_clear_line(refused(capsys, legacy), "HDF5", "model.save('model.keras')")


@pytest.mark.parametrize("imports", [[], ["--import", MODULE]])
def test_text_vectorization_is_refused_as_strings(saved, capsys, imports):
    """Before Keras trips over the unknown `custom_standardization`, or, with the
    module imported, before the model is built at all."""
    err = refused(capsys, saved[1]["text"], *imports)
    assert_one_clear_line(err, "takes strings", "string inputs cannot be exported", "token ids")
    assert "custom_standardization" not in err


def test_import_takes_a_path_and_says_where_a_name_was_searched(saved, capsys, tmp_path):
    model = saved[1]["custom"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.chdir(elsewhere)  # (in_folder's monkeypatch restores the folder)
    sys.modules.pop(MODULE, None)  # imported by the tests before
    code, _, err = run_cli(capsys, model, "-o", tmp_path / "by_name.onnx", "--import", MODULE)
    assert code == 2 and not (tmp_path / "by_name.onnx").exists(), err
    assert_one_clear_line(err, f"{MODULE}: cannot import it: it is not in {elsewhere} (the working")
    assert_one_clear_line(err, "(--import path/to/module.py)")
    sys.modules.pop(MODULE, None)
    output = tmp_path / "by_path.onnx"
    code, _, err = run_cli(capsys, model, "-o", output, "--import", saved[0] / f"{MODULE}.py")
    assert code == 0, err
    assert output.exists()


def test_a_saved_model_folder_gets_advice_that_works(tmp_path, capsys):
    ids = keras.Input((None,), dtype="int32", name="token_ids")
    model = keras.Model(ids, keras.layers.Dense(3)(keras.layers.Embedding(20, 4)(ids)))
    model.export(tmp_path / "saved", format="tf_saved_model", verbose=False)
    err = refused(capsys, tmp_path / "saved")
    assert_one_clear_line(err, "TensorFlow SavedModel", "keras.layers.TFSMLayer", "--unsafe")
    # The advice, followed, exports and passes.
    inputs = keras.Input((None,), dtype="int32", name="token_ids")
    layer = keras.layers.TFSMLayer(str(tmp_path / "saved"), call_endpoint="serve")
    keras.Model(inputs, layer(inputs)).save(tmp_path / "wrapped.keras")
    options = ExportOptions(shapes=[(1, 3), (2, 5)], unsafe=True, input_roles={"token_ids": "ids"})
    report = export_model(tmp_path / "wrapped.keras", tmp_path / "wrapped.onnx", options)
    assert report["passed"]
