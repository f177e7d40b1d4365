"""Importing the package changes nothing in the process; the commands run
nothing of the working folder.

Each import runs in a fresh interpreter that records the process state before
and after it: `sys.path`, the environment, descriptors 0-2, `sys.stdin`,
`sys.stdout` and `sys.stderr`, `sys.meta_path` and `sys.path_hooks`, the
warning filters and every logger's level. NumPy adds warning filters of its
own when imported: the probe imports the third-party modules a statement needs
first, so what it sees changed is what our code changed.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Runs in the child: state before, the import under test, state after.
PROBE = """
import json, logging, os, sys, warnings

def state():
    fds = {}
    for fd in (0, 1, 2):
        try:
            info = os.fstat(fd)
            fds[fd] = [info.st_dev, info.st_ino, os.readlink(f"/proc/self/fd/{fd}")]
        except OSError as error:
            fds[fd] = str(error)
    loggers = {
        name: logger.level
        for name, logger in logging.Logger.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    return {
        "sys.path": list(sys.path),
        "os.environ": dict(os.environ),
        "descriptors": fds,
        "streams": [id(sys.stdin), id(sys.stdout), id(sys.stderr)],
        "sys.meta_path": [repr(finder) for finder in sys.meta_path],
        "sys.path_hooks": [repr(hook) for hook in sys.path_hooks],
        "warnings.filters": [repr(entry) for entry in warnings.filters],
        "root logger": logging.getLogger().level,
        "loggers": loggers,
    }

for name in sys.argv[2:]:
    __import__(name)
before = state()
exec(sys.argv[1])
after = state()
# A logger the import created is new state only if it was given a level.
after["loggers"] = {
    name: level for name, level in after["loggers"].items()
    if name in before["loggers"] or level != logging.NOTSET
}
print(json.dumps({key: [before[key], after[key]] for key in before if before[key] != after[key]}))
"""

IMPORTS = {
    "the layers": "import keras_layers",
    "the generation API": (
        "from keras_layers.export import generate, CachedDecoder",
        "numpy",
        "onnxruntime",
    ),
    "the console script's module": "import keras_layers.export.cli",
    "python -m keras_layers.export's module": "import keras_layers.export.__main__",
    "export/to_onnx.py": (
        f"import runpy; runpy.run_path({str(ROOT / 'export' / 'to_onnx.py')!r}, run_name='x')"
    ),
}


@pytest.mark.parametrize("statement", IMPORTS.values(), ids=IMPORTS.keys())
def test_an_import_leaves_the_process_as_it_was(statement, tmp_path):
    statement, *dependencies = statement if isinstance(statement, tuple) else (statement,)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, statement, *dependencies],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    changed = json.loads(done.stdout.strip().splitlines()[-1])
    assert changed == {}, f"{statement!r} changed {sorted(changed)}: {changed}"


def test_the_probe_sees_a_change_of_each_kind(tmp_path):
    """The check above can fail: a statement that changes each thing is caught."""
    statement = (
        "import os, sys, warnings, logging; sys.path.insert(0, 'x'); os.environ['X'] = '1'; "
        "os.dup2(os.open(os.devnull, os.O_WRONLY), 2); sys.stderr = open(os.devnull, 'w'); "
        "sys.meta_path.insert(0, object()); warnings.filterwarnings('ignore'); "
        "logging.getLogger('absl').setLevel(logging.ERROR); logging.getLogger().setLevel(5)"
    )
    done = subprocess.run(
        [sys.executable, "-c", PROBE, statement], cwd=tmp_path, capture_output=True, text=True
    )
    changed = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(changed) == {
        "sys.path",
        "os.environ",
        "descriptors",
        "streams",
        "sys.meta_path",
        "warnings.filters",
        "root logger",
        "loggers",
    }


SHADOWS = ("typing", "keras", "numpy", "onnx", "onnxruntime", "tf2onnx", "onnxslim")


@pytest.mark.tensorflow_only
@pytest.mark.parametrize(
    "command",
    [
        ["keras-layers-export"],
        [sys.executable, "-m", "keras_layers.export"],
        [sys.executable, str(ROOT / "export" / "to_onnx.py")],
    ],
    ids=["console script", "python -m", "export/to_onnx.py"],
)
def test_no_module_of_the_working_folder_runs_under_a_command(command, tmp_path):
    """A `typing.py`, `keras.py`, `numpy.py` ... where the command runs stays unread."""
    if command[0] == "keras-layers-export":
        command = [str(Path(sys.executable).with_name("keras-layers-export"))]
    marker = tmp_path / "ran"
    for name in SHADOWS:
        (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write('{name} ')\n")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    for arguments in (["--help"], ["missing.keras"]):
        done = subprocess.run(
            [*command, *arguments],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert done.returncode in (0, 2), done.stderr
        assert not marker.exists(), f"{arguments}: ran {marker.read_text()}"


def test_a_module_of_the_working_folder_would_be_seen(tmp_path):
    """The check above can fail: a plain `python -c` there does run `typing.py`."""
    marker = tmp_path / "ran"
    (tmp_path / "typing.py").write_text(f"open({str(marker)!r}, 'a').write('typing')\n")
    subprocess.run([sys.executable, "-c", "import typing"], cwd=tmp_path, check=False)
    assert marker.read_text() == "typing"
