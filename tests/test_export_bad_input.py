"""Bad input to `python export/to_onnx.py`: one clear line, exit 2, nothing written."""

import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import keras
import pytest
from models import lambda_model, save, sequential_model

from keras_layers.export.cli import main

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def good_model(tmp_path_factory):
    return save(sequential_model(), tmp_path_factory.mktemp("good") / "good.keras")


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_clear_line(err, *phrases):
    lines = [line for line in err.strip().splitlines() if line.strip()]
    text = " ".join(lines)
    assert text.startswith("error:"), err
    assert "Traceback" not in err
    for phrase in phrases:
        assert phrase in text, (phrase, text)


def make_not_keras(directory: Path) -> Path:
    path = directory / "notes.keras"
    path.write_text("this is not a zip archive")
    return path


def make_corrupt(directory: Path, good: Path) -> Path:
    path = directory / "corrupt.keras"
    data = good.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def make_no_config(directory: Path) -> Path:
    path = directory / "empty.keras"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("metadata.json", "{}")
    return path


CASES = {
    "missing file": (lambda d, g: [d / "missing.keras"], ["no such file"]),
    "not a .keras archive": (
        lambda d, g: [make_not_keras(d)],
        ["not a .keras archive"],
    ),
    "corrupt archive": (lambda d, g: [make_corrupt(d, g)], ["corrupt"]),
    "zip without config": (lambda d, g: [make_no_config(d)], ["no config.json"]),
    "directory as model": (lambda d, g: [d], ["is a directory"]),
    "unknown --opset": (
        lambda d, g: [g, "--opset", "99"],
        ["--opset 99", "unsupported"],
    ),
    "output parent is a file": (
        lambda d, g: [g, "-o", g / "x.onnx"],
        ["cannot create"],
    ),
    "output is a directory": (lambda d, g: [g, "-o", d], ["is a directory"]),
    "unimportable --import": (
        lambda d, g: [g, "--import", "no_such_module_xyz"],
        ["--import no_such_module_xyz"],
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, good_model, capsys):
    make_args, phrases = CASES[case]
    work = tmp_path / "work"
    work.mkdir()
    args = make_args(work, good_model)
    before = sorted(p.name for p in work.iterdir())
    good_bytes = good_model.read_bytes()
    if "-o" not in [str(a) for a in args]:
        args += ["-o", work / "out.onnx"]
    code, _, err = run_cli(capsys, *args)
    assert code == 2
    assert_one_clear_line(err, *phrases)
    assert sorted(p.name for p in work.iterdir()) == before  # nothing written
    assert good_model.read_bytes() == good_bytes


@pytest.mark.parametrize(
    "argv, phrase",
    [
        (["--atol", "-1"], "--atol"),
        (["--rtol", "nan"], "--rtol"),
        (["--atol", "abc"], "--atol"),
        (["--bogus"], "--bogus"),
        (["--shapes", "2by7"], "BATCHxSEQ"),
        (["--shapes", "0x7"], "--shapes"),
        (["--shapes", "99999999999x99999999999"], "--shapes"),
    ],
)
def test_bad_flags_exit_2(argv, phrase, good_model, capsys):
    with pytest.raises(SystemExit) as raised:
        main([str(good_model), *argv])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and phrase in err


def test_a_grid_point_too_large_to_check_is_refused_before_any_work(good_model, capsys):
    code, _, err = run_cli(capsys, good_model, "--shapes", "100000x100000")
    assert code == 2
    assert_one_clear_line(err, "--shapes", "tokens")


def test_lambda_is_refused_in_safe_mode_and_allowed_with_unsafe(tmp_path, capsys):
    model = save(lambda_model(), tmp_path / "lambda.keras")
    code, _, err = run_cli(capsys, model, "-o", tmp_path / "l.onnx", "--shapes", "1x3")
    assert code == 2
    assert_one_clear_line(err, "Lambda", "--unsafe")
    assert not (tmp_path / "l.onnx").exists()
    code, _, err = run_cli(capsys, model, "-o", tmp_path / "l.onnx", "--shapes", "1x3", "--unsafe")
    assert code == 0
    assert "--unsafe" in err  # the warning


@keras.saving.register_keras_serializable(package="tests")
class InverseErf(keras.layers.Layer):
    def call(self, x):
        return keras.ops.erfinv(x)


def test_unsupported_op_names_the_op_and_the_layer(tmp_path, capsys):
    inputs = keras.Input((4,))
    outputs = InverseErf(name="inverse_erf")(inputs)
    model = save(keras.Model(inputs, outputs), tmp_path / "erfinv.keras")
    code, _, err = run_cli(capsys, model, "-o", tmp_path / "e.onnx", "--shapes", "1x4")
    assert code == 2
    assert_one_clear_line(err, "tf2onnx cannot convert", "Erfinv", "inverse_erf")
    assert not (tmp_path / "e.onnx").exists()


CUSTOM_LAYER = textwrap.dedent(
    """
    import keras

    @keras.saving.register_keras_serializable(package="mine")
    class Doubler(keras.layers.Layer):
        def call(self, x):
            return x * 2.0
    """
)


def test_unknown_custom_layer_suggests_import(tmp_path):
    (tmp_path / "my_layers.py").write_text(CUSTOM_LAYER)
    build = (
        "import keras, my_layers\n"
        "i = keras.Input((3,))\n"
        "keras.Model(i, my_layers.Doubler()(i)).save('custom.keras')\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    subprocess.run(
        [sys.executable, "-c", build],
        cwd=tmp_path,
        check=True,
        env=env,
        capture_output=True,
        timeout=300,
    )
    script = str(ROOT / "export" / "to_onnx.py")
    refused = subprocess.run(
        [sys.executable, script, "custom.keras", "--shapes", "1x3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert refused.returncode == 2
    assert "Doubler" in refused.stderr and "--import" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "custom.onnx").exists()
    accepted = subprocess.run(
        [
            sys.executable,
            script,
            "custom.keras",
            "--shapes",
            "1x3",
            "--import",
            "my_layers",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert accepted.returncode == 0, accepted.stderr
    assert (tmp_path / "custom.onnx").exists()
