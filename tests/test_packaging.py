"""The installed product: import name, commands, version, the demo's place."""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.tensorflow_only  # the commands run the export pipeline

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def run(args, cwd):
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=ENV, timeout=300)


def console_script() -> str:
    path = Path(sysconfig.get_path("scripts")) / "keras-layers-export"
    assert path.exists(), "the console script is not installed: pip install -e ."
    return str(path)


@pytest.mark.parametrize(
    "command, prog",
    [
        ([console_script()], "keras-layers-export"),
        ([sys.executable, "-m", "keras_layers.export"], "python -m keras_layers.export"),
        ([sys.executable, str(ROOT / "export" / "to_onnx.py")], "python export/to_onnx.py"),
    ],
)
def test_every_command_is_the_same_cli_and_names_itself(command, prog, tmp_path):
    helped = run([*command, "--help"], tmp_path)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith(f"usage: {prog} ")
    for flag in ("--shapes", "--quantize", "-q, --quiet", "--version"):
        assert flag in helped.stdout
    version = run([*command, "--version"], tmp_path)
    assert version.returncode == 0
    assert version.stdout.split() == [*prog.split(), "0.1.0"]
    assert list(tmp_path.iterdir()) == []


def test_no_top_level_export_package_is_installed(tmp_path):
    """An `export.py` of the user's (yolov5 has one) never collides with us."""
    (tmp_path / "export.py").write_text("VALUE = 'theirs'\n")
    code = (
        "import export, keras_layers.export as ours\n"
        "print(export.VALUE, ours.export_model.__module__)"
    )
    result = run([sys.executable, "-c", code], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["theirs", "keras_layers.export.api"]
    alone = run([sys.executable, "-c", "import export"], ROOT / "tests")
    assert alone.returncode == 1 and "ModuleNotFoundError" in alone.stderr


def test_export_without_the_extra_names_the_extra(tmp_path):
    code = "import sys; sys.modules['tf2onnx'] = None; import keras_layers.export"
    result = run([sys.executable, "-c", code], tmp_path)
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: keras_layers.export needs tf2onnx")
    assert 'pip install "keras-layers[export]"' in last


def test_the_command_without_the_extra_is_one_error_line(tmp_path):
    """`pip install keras-layers` alone, then `keras-layers-export`: one line
    naming the extra, exit 2 (it printed a traceback, exit 1). The installed
    entry point is run with tf2onnx hidden, as if never installed."""
    code = (
        "import sys; sys.modules['tf2onnx'] = None\n"
        "from importlib.metadata import entry_points\n"
        "(command,) = entry_points(group='console_scripts', name='keras-layers-export')\n"
        "sys.exit(command.load()())"
    )
    result = run([sys.executable, "-c", code], tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        result.stderr.strip()
    ] and result.stderr.startswith("error: keras_layers.export needs tf2onnx")
    assert 'pip install "keras-layers[export]"' in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def saved_layers(tmp_path_factory):
    """A `.keras` file holding one of the layers, saved in its own process."""
    saved = tmp_path_factory.mktemp("saved") / "tiny.keras"
    build = (
        "import keras; from keras_layers import ScaledEmbedding; "
        "ids = keras.Input((None,), dtype='int32'); "
        f"keras.Model(ids, ScaledEmbedding(10, 4)(ids)).save({str(saved)!r})"
    )
    assert run([sys.executable, "-c", build], saved.parent).returncode == 0
    return saved


def _load_after(imports: str, saved, cwd):
    load = (
        f"{imports}; model = keras.saving.load_model({str(saved)!r}); "
        "print(type(model.layers[1]).__name__)"
    )
    return run([sys.executable, "-c", load], cwd)


@pytest.mark.parametrize(
    "imports",
    [
        "import keras; import keras_layers",
        "import keras_layers; import keras; keras_layers.ScaledEmbedding",
        "import keras_layers, keras; from keras_layers import TiedOutputDense",
    ],
)
def test_a_file_holding_the_layers_loads_once_keras_and_the_layers_are_imported(
    imports, saved_layers, tmp_path
):
    """The layers join Keras' registry when imported: at `import keras_layers`
    if Keras came first, else on first use of any layer's name (docs/design.md)."""
    loaded = _load_after(imports, saved_layers, tmp_path)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "ScaledEmbedding"


def test_the_one_order_that_does_not_register_the_layers_fails_with_keras_message(
    saved_layers, tmp_path
):
    """As documented: `import keras_layers` before Keras, and no layer named."""
    unregistered = _load_after("import keras_layers; import keras", saved_layers, tmp_path)
    assert unregistered.returncode == 1
    assert "Could not locate class 'ScaledEmbedding'" in unregistered.stderr


def test_the_generation_api_imports_neither_keras_nor_tensorflow(tmp_path):
    code = (
        "import sys; import keras_layers; from keras_layers.export import generate, CachedDecoder; "
        "print(sorted(m for m in ('keras', 'tensorflow', 'tf2onnx') if m in sys.modules))"
    )
    result = run([sys.executable, "-c", code], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
