"""Bad input to `python export/to_onnx.py`: one clear line, exit 2, nothing written."""

import os
import resource
import signal
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import archives
import keras
import pytest
from models import lambda_model, save, sequential_model

from keras_layers.export import loading
from keras_layers.export.cli import main

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20
# A refusal takes well under a second; a check that opens a named pipe blocks forever.
HANG_SECONDS = 120


@pytest.fixture(scope="module")
def good_model(tmp_path_factory):
    return save(sequential_model(), tmp_path_factory.mktemp("good") / "good.keras")


def run_cli(capsys, *argv):
    """The command in this process, failing the test instead of hanging."""

    def hung(signum: int, frame: object) -> None:
        pytest.fail(f"the command still runs after {HANG_SECONDS} s (blocked on its input?)")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(HANG_SECONDS)
    try:
        code = main([str(a) for a in argv])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
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


def rezip(good: Path, path: Path, entries: dict[str, bytes | int]) -> Path:
    """The good model's archive at `path`, with `entries` replacing or joining its own.

    An entry given as bytes is stored as it is; one given as an int is that many
    spaces, deflated as it is written 1 MiB at a time, so that the test never holds
    it in memory and the archive stays about a thousand times smaller.
    """
    with zipfile.ZipFile(good) as source, zipfile.ZipFile(path, "w") as archive:
        for item in source.infolist():
            if item.filename not in entries:
                archive.writestr(item.filename, source.read(item))
        for name, content in entries.items():
            if isinstance(content, bytes):
                archive.writestr(name, content)
                continue
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w", force_zip64=True) as entry:
                for _ in range(content // MIB):
                    entry.write(b" " * MIB)
    return path


def make_fifo(directory: Path) -> Path:
    path = directory / "pipe.keras"
    os.mkfifo(path)
    return path


def make_string_input(directory: Path) -> Path:
    text = keras.Input(shape=(), dtype="string", name="text")
    ids = keras.layers.StringLookup(vocabulary=["a", "b", "c"], name="lookup")(text)
    vectors = keras.layers.Embedding(5, 4)(ids)
    model = keras.Model(text, keras.layers.Dense(2)(vectors))
    return save(model, directory / "text.keras")


CASES = {
    "missing file": (lambda d, g: [d / "missing.keras"], ["no such file"]),
    "not a .keras archive": (
        lambda d, g: [make_not_keras(d)],
        ["not a .keras archive"],
    ),
    "corrupt archive": (lambda d, g: [make_corrupt(d, g)], ["corrupt"]),
    "zip without config": (lambda d, g: [make_no_config(d)], ["no config.json"]),
    "directory as model": (lambda d, g: [d], ["is a directory"]),
    "named pipe as model": (lambda d, g: [make_fifo(d)], ["pipe.keras", "is a named pipe"]),
    "device as model": (lambda d, g: [Path(os.devnull)], ["is a device", "regular file"]),
    "config is not JSON": (
        lambda d, g: [rezip(g, d / "bad.keras", {"config.json": b"{'not': json"})],
        ["bad.keras", "config.json is not valid JSON", "re-save"],
    ),
    "config nested 3000 deep": (
        lambda d, g: [rezip(g, d / "deep.keras", {"config.json": b"[" * 3000 + b"]" * 3000})],
        ["deep.keras", "config.json nests 3000 levels deep", "re-save"],
    ),
    # 64 MiB of spaces stored in about 64 KB: over 100:1, inflated by nothing.
    "asset that inflates 1000 times": (
        lambda d, g: [rezip(g, d / "asset.keras", {"assets/big.txt": 64 * MIB})],
        ["asset.keras", "assets/big.txt", "decompression bomb"],
    ),
    # Each 1 MiB entry is under the per-entry floor; together 100 MiB from 170 KB.
    "many small entries that inflate 1000 times": (
        lambda d, g: [rezip(g, d / "many.keras", {f"assets/{i}.txt": MIB for i in range(100)})],
        ["many.keras", "entries would inflate", "decompression bomb"],
    ),
    # Weights files whose datasets declare far more than they store (tests/archives.py):
    # 64 MiB each, small enough that a missing check allocates nothing dangerous here.
    # The gigabyte ones run in a child process under a memory limit
    # (tests/test_hostile_archives.py).
    "weights declared and never written (chunked, a fill value)": (
        lambda d, g: [archives.dense_bomb(d / "fill.keras", 4096, 4096, "fill_only")],
        ["fill.keras", "layers/dense/vars/0 declares 64 MiB", "stores 0 bytes", "size bomb"],
    ),
    "weights declared and never written (contiguous)": (
        lambda d, g: [archives.dense_bomb(d / "unwritten.keras", 4096, 4096, "unallocated")],
        ["unwritten.keras", "stores 0 bytes (contiguous)", "size bomb"],
    ),
    "weights of zeros behind gzip": (
        lambda d, g: [archives.dense_bomb(d / "gzip.keras", 4096, 4096, "gzip_zeros")],
        ["gzip.keras", "declares 64 MiB", "gzip-compressed", "size bomb"],
    ),
    "weights declared 4 TiB long": (
        lambda d, g: [archives.hostile(d / "huge.keras", archives.huge_shape_h5())],
        ["huge.keras", "declares 4096.0 GiB", "stores 0 bytes", "size bomb"],
    ),
    "thousands of small weights that store nothing": (
        lambda d, g: [archives.hostile(d / "many.keras", archives.many_small_h5(2000, 8192))],
        ["many.keras", "2000 datasets declare 62 MiB and store 0 bytes", "size bomb"],
    ),
    "a size bomb in a compressed weights entry": (
        lambda d, g: [archives.dense_bomb(d / "zipped.keras", 4096, 4096, "fill_only", True)],
        ["zipped.keras", "declares 64 MiB", "size bomb"],
    ),
    "weights read from another file (external storage)": (
        lambda d, g: [archives.hostile(d / "ext.keras", archives.external_storage_h5(8, 16))],
        ["ext.keras", "layers/dense/vars/0 onto other files (an external dataset)"],
    ),
    "weights mapped onto another file (virtual dataset)": (
        lambda d, g: [archives.hostile(d / "virtual.keras", archives.virtual_h5(8, 16))],
        ["virtual.keras", "(a virtual dataset)"],
    ),
    "weights linked to another file": (
        lambda d, g: [archives.hostile(d / "link.keras", archives.external_link_h5())],
        ["link.keras", "links layers/dense to another file (/etc/passwd)"],
    ),
    "a contiguous weight patched to declare more than the file holds": (
        lambda d, g: [
            archives.hostile(d / "patched.keras", archives.lying_contiguous_h5(8, 16, 2**20))
        ],
        ["patched.keras", "cannot read its weights file", "invalid dataset size"],
    ),
    "string input": (
        lambda d, g: [make_string_input(d)],
        ["text.keras", "'text' takes strings", "text preprocessing", "token ids"],
    ),
    "unknown --opset": (
        lambda d, g: [g, "--opset", "99"],
        ["--opset 99", "unsupported"],
    ),
    "output parent is a file": (
        lambda d, g: [g, "-o", g / "x.onnx"],
        ["cannot create"],
    ),
    "output is a directory": (lambda d, g: [g, "-o", d], ["is a directory"]),
    "output is empty": (lambda d, g: [g, "-o", ""], ["-o ''", "empty path"]),
    "output holds a NUL": (lambda d, g: [g, "-o", "a\x00b.onnx"], ["NUL character"]),
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


def test_a_config_bomb_is_refused_without_inflating_it(tmp_path, good_model, capsys):
    # 2 GiB of spaces in a 2 MB file: reading it took gigabytes of memory.
    bomb = rezip(good_model, tmp_path / "bomb.keras", {"config.json": 2048 * MIB})
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code, _, err = run_cli(capsys, bomb, "-o", tmp_path / "out.onnx")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_kib) / 1024
    assert code == 2
    assert_one_clear_line(err, "bomb.keras", "config.json would inflate to 2.0 GiB")
    assert grown_mib < 300, f"the peak memory grew by {grown_mib:.0f} MiB"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.keras"]


@pytest.mark.parametrize(
    "text, depth",
    [
        (b'{"a": [1, {"b": []}], "c": {}}', 4),
        (b'{"name": "[[{{", "x": ["\\"]]", "\\\\", "{"]}', 2),
        (b'["\\\\\\"[", "]"]', 1),
        (b"[" * 3000 + b"]" * 3000, 3000),
        # A string across the scan's 1 MiB pieces, then an array.
        (b'{"s": "' + b"[" * (3 * MIB) + b'", "l": [[[]]]}', 4),
        (b'"plain"', 0),
    ],
)
def test_config_nesting_is_measured_outside_strings(text, depth):
    assert loading._nesting_depth(text) == depth


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


@pytest.mark.slow  # minutes; CI runs the slow tier (.ci/run)
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


@pytest.mark.parametrize(
    "body, phrase",
    [("import sys\nsys.exit(3)\n", "SystemExit"), ("raise RuntimeError('boom')\n", "boom")],
)
def test_an_import_that_exits_is_a_usage_error(
    tmp_path, good_model, capsys, monkeypatch, body, phrase
):
    """An --import module that calls sys.exit or raises ends in exit 2, one line;
    the export never stops with the module's own code."""
    (tmp_path / "exits_on_import.py").write_text(body)
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(
        capsys, good_model, "-o", tmp_path / "o.onnx", "--import", "exits_on_import"
    )
    assert code == 2
    assert_one_clear_line(err, "--import exits_on_import", phrase)
    assert not (tmp_path / "o.onnx").exists()
    sys.modules.pop("exits_on_import", None)


def test_an_import_that_ends_the_process_is_a_usage_error(tmp_path, good_model):
    """An --import module that calls os._exit(0), even under another name and
    inside `except Exception`, ended the command at once with exit 0 and
    nothing exported; now exit 2, one line. In a process of its own: in this
    one, the call would end pytest itself with exit 0."""
    (tmp_path / "exits_hard.py").write_text(
        "from os import _exit as leave\n\ntry:\n    leave(0)\nexcept Exception:\n    pass\n"
    )
    result = subprocess.run(
        [sys.executable, str(ROOT / "export" / "to_onnx.py"), str(good_model)]
        + ["-o", str(tmp_path / "o.onnx"), "--import", "exits_hard"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        timeout=HANG_SECONDS,
    )
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert_one_clear_line(result.stderr, "--import exits_hard", "it calls os._exit(0)")
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize(
    "argv, said",
    [
        (["MODEL", "--quantize", "int4"], "error: --quantize int4: 4-bit weights are for"),
        (["MODEL", "--opset", "99"], "error: --opset 99: unsupported; choose 13-"),
        (["ghost/model.keras"], "error: ghost/model.keras: no such file"),
        (["--check-only", "ghost.keras", "x.onnx"], "error: ghost.keras: no such file"),
        (["--check-only", "MODEL", "ghost.onnx"], "error: ghost.onnx: no such file; give the"),
    ],
    ids=["int4 for an encoder", "opset", "model", "checked model", "checked file"],
)
def test_a_missing_file_is_said_before_tensorflow_is_imported(tmp_path, good_model, argv, said):
    """A typo, or a flag that cannot apply, took 10-12 s to report: TensorFlow
    was imported first (reading tf2onnx's opsets imported it)."""
    argv = [str(good_model) if arg == "MODEL" else arg for arg in argv]
    code = (
        "import sys\nfrom keras_layers.export.cli import main\n"
        f"code = main({argv!r})\n"
        "print(sorted({'tensorflow', 'keras', 'onnxruntime'} & set(sys.modules)), code)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.stdout.strip().splitlines()[-1] == "[] 2", result.stdout + result.stderr
    assert result.stderr.strip().startswith(said), result.stderr
    assert not list(tmp_path.iterdir())
