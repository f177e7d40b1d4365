"""Fuzz tier: mutated `.keras` archives and command lines never crash the command.

Every case must end in exit 0, 1 or 2, with one line on stderr and no
traceback, and must leave the files already at the output paths untouched
unless the export passed. The default suite runs the `fast` hypothesis profile;
CI's fuzz tier, `HYPOTHESIS_PROFILE=ci python -m pytest -m fuzz`, runs 1,000
reproducible cases per test, and `HYPOTHESIS_PROFILE=thorough` 2,000 random
ones (see tests/conftest.py).
"""

import functools
import io
import json
import os
import tempfile
import zipfile
from pathlib import Path

import archives
import h5py
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from models import save, sequential_model

from keras_layers.export.cli import main

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

OLD_OUTPUT = b"the user's previous file"


@functools.cache
def good_archive() -> bytes:
    """A small saved model (a plain function, so hypothesis never prints it)."""
    with tempfile.TemporaryDirectory() as folder:
        return save(sequential_model(), Path(folder) / "good.keras").read_bytes()


def entries(archive: bytes, folder: Path) -> dict[str, bytes]:
    path = folder / "source.keras"
    path.write_bytes(archive)
    with zipfile.ZipFile(path) as source:
        return {name: source.read(name) for name in source.namelist()}


def write_archive(path: Path, contents: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in contents.items():
            archive.writestr(name, data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=6,
)


def config_paths(node, prefix=()):
    """Every (path, value) in a JSON tree, the root first."""
    yield prefix, node
    items = (
        node.items()
        if isinstance(node, dict)
        else enumerate(node)
        if isinstance(node, list)
        else ()
    )
    for key, child in items:
        yield from config_paths(child, (*prefix, key))


def replaced(node, path, value):
    if not path:
        return value
    head, *rest = path
    copy = dict(node) if isinstance(node, dict) else list(node)
    copy[head] = replaced(node[head], rest, value)
    return copy


def truncate(data: bytes, folder: Path, fraction: float) -> bytes:
    return data[: int(len(data) * fraction)]


def flip(data: bytes, folder: Path, positions: list, values: list) -> bytes:
    array = bytearray(data)
    for position, value in zip(positions, values, strict=False):
        array[int(len(array) * position)] = value
    return bytes(array)


def rewritten(data: bytes, folder: Path, change) -> bytes:
    """The archive with its entries passed through `change(dict) -> None`."""
    contents = entries(data, folder)
    change(contents)
    path = folder / "edited.keras"
    write_archive(path, contents)
    return path.read_bytes()


def edit_config(data: bytes, folder: Path, choice: int, value, delete: bool) -> bytes:
    def change(contents):
        config = json.loads(contents["config.json"])
        paths = [path for path, _ in config_paths(config) if path]
        path = paths[choice % len(paths)]
        if delete:
            target = config
            for key in path[:-1]:
                target = target[key]
            del target[path[-1]]
        else:
            config = replaced(config, path, value)
        contents["config.json"] = json.dumps(config).encode()

    return rewritten(data, folder, change)


def add_entry(data: bytes, folder: Path, name: str, extra: bytes) -> bytes:
    return rewritten(data, folder, lambda contents: contents.__setitem__(name, extra))


def drop_entry(data: bytes, folder: Path, name: str) -> bytes:
    return rewritten(data, folder, lambda contents: contents.pop(name, None))


def lying_weights(data: bytes, folder: Path, layout: str, scale: int, deflate: bool) -> bytes:
    """The archive with every dataset of its weights file made again as `layout`
    (`archives.LAYOUTS`: written, never written, gzip over zeros, ...), its first
    axis `scale` times longer: declared sizes up to 64 MB, stored ones down to
    nothing; the weights entry deflated with `deflate`."""
    contents = entries(data, folder)
    buffer = io.BytesIO()
    with h5py.File(io.BytesIO(contents["model.weights.h5"]), "r") as source:
        with h5py.File(buffer, "w") as target:

            def copy(name, item):
                if isinstance(item, h5py.Group):
                    target.require_group(name)
                    return
                shape = (item.shape[0] * scale, *item.shape[1:]) if item.shape else ()
                group, _, leaf = name.rpartition("/")
                archives.make_dataset(target.require_group(group or "/"), leaf, shape, layout)

            source.visititems(copy)
    contents["model.weights.h5"] = buffer.getvalue()
    path = folder / "lying.keras"
    method = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in contents.items():
            archive.writestr(name, content, compress_type=method)
    return path.read_bytes()


ENTRIES = ["config.json", "metadata.json", "model.weights.h5"]

# Each case is a `functools.partial`, so a failing one prints its arguments.
mutations = st.one_of(
    st.builds(functools.partial, st.just(truncate), fraction=st.floats(0.0, 0.999)),
    st.builds(
        functools.partial,
        st.just(flip),
        positions=st.lists(st.floats(0.0, 0.999), min_size=1, max_size=8),
        values=st.lists(st.integers(0, 255), min_size=8, max_size=8),
    ),
    st.builds(
        functools.partial,
        st.just(edit_config),
        choice=st.integers(0, 10_000),
        value=json_values,
        delete=st.booleans(),
    ),
    st.builds(
        functools.partial,
        st.just(add_entry),
        name=st.sampled_from(["extra.bin", "assets/x", *ENTRIES]),
        extra=st.binary(max_size=64),
    ),
    st.builds(functools.partial, st.just(drop_entry), name=st.sampled_from(ENTRIES)),
    # In process, so at most 64 MB declared (the embedding's 300 rows, 1700 times):
    # gigabytes run in a child under a memory limit (tests/test_hostile_archives.py).
    st.builds(
        functools.partial,
        st.just(lying_weights),
        layout=st.sampled_from(archives.LAYOUTS),
        scale=st.sampled_from([1, 2, 30]) | st.integers(1, 1700),
        deflate=st.booleans(),
    ),
)


def assert_clean_ending(code: int, err: str) -> None:
    assert code in (0, 1, 2), (code, err)
    assert "Traceback" not in err
    if code != 0:
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), err


@pytest.mark.fuzz
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(mutate=mutations)
def test_mutated_archives_end_cleanly(mutate, tmp_path_factory, capsys):
    folder = tmp_path_factory.mktemp("case")
    model = folder / "model.keras"
    model.write_bytes(mutate(good_archive(), folder))
    output = folder / "out.onnx"
    output.write_bytes(OLD_OUTPUT)
    code = main([str(model), "-o", str(output), "--shapes", "1x3"])
    assert_clean_ending(code, capsys.readouterr().err)
    if code != 0:
        assert output.read_bytes() == OLD_OUTPUT


# Not --import: it imports whatever module a random name happens to spell.
FLAGS = [
    "-o",
    "--report",
    "--atol",
    "--rtol",
    "--shapes",
    "--opset",
    "--external-data",
    "--quantize",
    "-q",
    "--unsafe",
    "--allow-nonfinite",
    "--bogus",
]


@pytest.mark.fuzz
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    argv=st.lists(
        st.sampled_from(FLAGS) | st.text(alphabet="0123456789x,.-[]/*eEnaipd ", max_size=12),
        max_size=6,
    )
)
def test_mutated_command_lines_end_cleanly(argv, tmp_path_factory, capsys):
    folder = tmp_path_factory.mktemp("argv")
    model = folder / "model.keras"
    model.write_bytes(good_archive())
    output = folder / "out.onnx"
    output.write_bytes(OLD_OUTPUT)
    # The output is always given last; relative names (a random --report) land
    # in `folder`, the working directory of the case.
    args = [str(model), *[a.replace("/", "_") for a in argv], "-o", str(output)]
    cwd = Path.cwd()
    os.chdir(folder)
    try:
        code = main(args)
        err = capsys.readouterr().err
        assert_clean_ending(code, err)
    except SystemExit as exit_:  # argparse: usage and an error line, exit 2
        err = capsys.readouterr().err
        assert exit_.code == 2 and "error:" in err and "Traceback" not in err, err
        code = 2
    finally:
        os.chdir(cwd)
    if code != 0:
        assert output.read_bytes() == OLD_OUTPUT
