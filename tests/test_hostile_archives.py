"""Hostile archives: what a `.keras` file declares, and the limits it runs under.

The memory check takes the weights an archive declares (the shapes of its HDF5
datasets and of its config's variables), never the bytes its zip stores, and
weighs them against the least of MemAvailable, the cgroup's memory limit and
the address-space limit (`keras_layers.export.memory`). Datasets that declare
far more than they store are refused before Keras reads them
(`loading._weights_held`).

The archives that declare gigabytes run `python export/to_onnx.py` in a child
process under an address-space limit (`ulimit -v`), so that a missing check
costs that child, never the test run: it must end in exit 0, 1 or 2 (never a
signal: a 1.6 GB bomb once ended in SIGSEGV inside TensorFlow), with one error
line, no staging folder left beside the output, and the output untouched. The
default suite runs the reported bomb; the others are `slow` (CI: `-m slow`).
The smaller bombs (64 MiB) run in process in tests/test_export_bad_input.py.
"""

import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import archives
import keras
import numpy as np
import pytest
from models import save, sequential_model

from keras_layers.export import loading, memory
from keras_layers.export.cli import main
from keras_layers.export.errors import UsageError

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

ROOT = Path(__file__).resolve().parent.parent
# The limit the report ran under. A tiny model's whole export needs 2.4 GB of
# address space on 2 cores (TensorFlow's threads take more on more cores).
ADDRESS_LIMIT = 6_000_000 * 1024
OLD_OUTPUT = b"the user's previous file"
BOMB_UNITS = 20_000  # Dense(20000) on 20000 features: 1.6 GB of float32 weights


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_LIMIT, ADDRESS_LIMIT))


def run_limited(folder: Path, model: Path, *flags: str) -> tuple[int, str, float, float]:
    """`python export/to_onnx.py MODEL -o folder/out.onnx` under the address-space
    limit: (exit code, negative for a signal; stderr; the child's peak RSS in GB;
    seconds)."""
    output = folder / "out.onnx"
    output.write_bytes(OLD_OUTPUT)
    command = [sys.executable, str(ROOT / "export/to_onnx.py"), str(model), "-o", str(output)]
    start = time.perf_counter()
    child = subprocess.Popen(
        [*command, "--shapes", "1x3", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_limit_address_space,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    watchdog = threading.Timer(600, child.kill)
    watchdog.start()
    try:
        err = child.stderr.read()
        _, status, usage = os.wait4(child.pid, 0)  # the child's own peak, not earlier ones'
    finally:
        watchdog.cancel()
        child.stderr.close()
    child.returncode = os.waitstatus_to_exitcode(status)
    return child.returncode, err.decode(), usage.ru_maxrss / 1e6, time.perf_counter() - start


def assert_ended_cleanly(folder: Path, code: int, err: str, *phrases: str) -> None:
    """Exit 0, 1 or 2, never a signal; on failure one error line holding
    `phrases`, no staging folder left and the output untouched."""
    assert code in (0, 1, 2), (code, err)
    lines = [line for line in err.strip().splitlines() if line.strip()]
    if code != 0:
        assert len(lines) == 1 and lines[0].startswith("error:"), err
        assert (folder / "out.onnx").read_bytes() == OLD_OUTPUT
    for phrase in phrases:
        assert phrase in err, (phrase, err)
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_a_size_bomb_is_refused_under_an_address_space_limit(tmp_path):
    """The reported bomb: 1.6 GB of Dense weights declared in 9.8 KB (chunked,
    never written). It ended in SIGSEGV after a 3.7 GB peak; now exit 2 before
    Keras builds the model."""
    bomb = archives.dense_bomb(tmp_path / "bomb.keras", BOMB_UNITS, BOMB_UNITS, "fill_only")
    assert bomb.stat().st_size < 16_000
    code, err, peak_gb, _ = run_limited(tmp_path, bomb)
    assert code == 2, err
    assert_ended_cleanly(
        tmp_path, code, err, "layers/dense/vars/0 declares 1.5 GiB", "stores 0 bytes", "size bomb"
    )
    assert peak_gb < 1.5, f"the child peaked at {peak_gb:.1f} GB"


def _many_small(path: Path) -> Path:
    return archives.hostile(path, archives.many_small_h5(10_000, 40_000))


def _external(path: Path) -> Path:
    config = archives.dense_config(BOMB_UNITS, BOMB_UNITS)
    return archives.write_keras(path, config, archives.external_storage_h5(BOMB_UNITS, BOMB_UNITS))


def _patched(path: Path) -> Path:
    config = archives.dense_config(8 * 2**24, 16)  # 8.6 GB declared by the config too
    return archives.write_keras(path, config, archives.lying_contiguous_h5(8, 16, 2**24))


# name: (make(path), extra flags, exit codes allowed, phrases of the error line)
SLOW_CASES = {
    "contiguous, never written": (
        lambda p: archives.dense_bomb(p, BOMB_UNITS, BOMB_UNITS, "unallocated"),
        [],
        (2,),
        ["stores 0 bytes (contiguous)", "size bomb"],
    ),
    "one chunk of 1.6 GB written": (
        lambda p: archives.dense_bomb(p, BOMB_UNITS, BOMB_UNITS, "partial"),
        [],
        (2,),
        ["declares 1.5 GiB", "stores 4 MiB (chunked)", "size bomb"],
    ),
    "256 MiB of zeros behind gzip": (
        lambda p: archives.dense_bomb(p, 8192, 8192, "gzip_zeros"),
        [],
        (2,),
        ["declares 256 MiB", "gzip-compressed", "size bomb"],
    ),
    "1.6 GB bomb in a deflated entry": (
        lambda p: archives.dense_bomb(p, BOMB_UNITS, BOMB_UNITS, "fill_only", compress=True),
        [],
        (2,),
        ["declares 1.5 GiB", "size bomb"],
    ),
    "4 TiB declared, maxshape unlimited": (
        lambda p: archives.hostile(p, archives.huge_shape_h5()),
        [],
        (2,),
        ["declares 4096.0 GiB", "size bomb"],
    ),
    "10,000 small datasets, 1.6 GB, none written": (
        _many_small,
        [],
        (2,),
        ["10000 datasets declare 1.5 GiB and store 0 bytes", "size bomb"],
    ),
    "1.6 GB read from /dev/zero": (_external, [], (2,), ["(an external dataset)"]),
    "contiguous kernel patched to 8.6 GB": (_patched, [], (2,), ["cannot read its weights file"]),
    "1.6 GB config, a tiny weights file": (
        lambda p: archives.config_only_bomb(p, BOMB_UNITS, BOMB_UNITS),
        [],
        (2,),
        ["GB of address space", "1.60 GB of weights", "under the address-space limit"],
    ),
    # The memory check off: Keras builds the 1.6 GB model, finds the weights
    # missing and fails (exit 2 after a 3.7 GB peak, measured), or runs out of
    # address space; either way, no signal.
    "1.6 GB config, a tiny weights file, --no-memory-check": (
        lambda p: archives.config_only_bomb(p, BOMB_UNITS, BOMB_UNITS),
        ["--no-memory-check"],
        (1, 2),
        [],
    ),
}


@pytest.mark.slow  # a child process each, TensorFlow imported under the limit
@pytest.mark.parametrize("case", sorted(SLOW_CASES))
def test_hostile_archives_end_cleanly_under_an_address_space_limit(case, tmp_path):
    make, flags, codes, phrases = SLOW_CASES[case]
    model = make(tmp_path / "hostile.keras")
    code, err, _, _ = run_limited(tmp_path, model, *flags)
    assert code in codes, (code, err)
    assert_ended_cleanly(tmp_path, code, err, *phrases)


@pytest.mark.slow
def test_a_small_model_exports_under_the_address_space_limit(tmp_path):
    """The control: TensorFlow imports and a tiny model exports under the limit."""
    model = save(sequential_model(), tmp_path / "good.keras")
    code, err, _, _ = run_limited(tmp_path, model)
    assert code == 0, err
    assert (tmp_path / "out.onnx").read_bytes() != OLD_OUTPUT


def test_the_estimate_is_the_weights_the_archive_declares(tmp_path):
    """A saved model's estimate is its float32 weights, to the byte; a compiled
    one's leaves out the optimizer's slots, which loading never reads."""
    model = save(sequential_model(), tmp_path / "plain.keras")
    weights = 4 * sequential_model().count_params()
    assert memory.estimated_param_bytes(model) == weights

    keras.utils.set_random_seed(1)
    dense = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8)])
    dense.compile("adam", "mse")
    dense.fit(np.zeros((4, 16)), np.zeros((4, 8)), verbose=0)
    compiled = save(dense, tmp_path / "compiled.keras")
    assert memory.estimated_param_bytes(compiled) == 4 * (16 * 8 + 8)


def test_a_config_declaring_more_than_its_weights_is_counted_by_its_config(tmp_path):
    """Keras builds what the config declares before it finds the weights
    missing: the estimate takes the config's variables, built unallocated."""
    path = archives.config_only_bomb(tmp_path / "config.keras", 2000, 2000)
    assert loading.declared_weight_bytes(path) == 4 * (2000 * 2000 + 2000)


def test_a_config_bomb_is_refused_before_loading(tmp_path, monkeypatch, capsys):
    """16 MB of Dense weights in the config, a tiny weights file, and 100 MB of
    address space left: refused with both figures and the limit, nothing staged."""
    tight = memory.Limit("a test limit", 10**8, address_space=True)
    monkeypatch.setattr(memory, "address_space_limit", lambda: tight)
    path = archives.config_only_bomb(tmp_path / "config.keras", 2000, 2000)
    output = tmp_path / "out.onnx"
    output.write_bytes(OLD_OUTPUT)
    code = main([str(path), "-o", str(output), "--shapes", "1x3"])
    err = capsys.readouterr().err
    assert code == 2
    phrases = ("GB of address space", "0.02 GB of weights", "0.1 GB are available", "a test limit")
    for phrase in phrases:
        assert phrase in err, (phrase, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.keras", "out.onnx"]
    assert output.read_bytes() == OLD_OUTPUT


def test_size_bombs_are_refused_with_the_memory_check_off(tmp_path, capsys):
    """The weights file's checks are the archive's, not the memory check's."""
    bomb = archives.dense_bomb(tmp_path / "bomb.keras", 4096, 4096, "fill_only")
    output = tmp_path / "out.onnx"
    output.write_bytes(OLD_OUTPUT)
    code = main([str(bomb), "-o", str(output), "--no-memory-check"])
    err = capsys.readouterr().err
    assert code == 2 and "size bomb" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.keras", "out.onnx"]
    assert output.read_bytes() == OLD_OUTPUT


def test_a_walk_of_the_weights_file_ends_on_a_cycle(tmp_path):
    """A group linked into itself is entered once; a dataset linked twice is
    counted twice (Keras would read it twice)."""
    path = archives.hostile(tmp_path / "cycle.keras", archives.cyclic_h5(8, 16))
    assert loading.declared_weight_bytes(path) == 4 * (2 * 16 * 8 + 8)


def _fake_cgroup(root: Path, version: int, levels: dict) -> None:
    """A /proc and /sys tree: the process in cgroup /app/job, each level's
    (limit, usage, inactive page cache), None for no limit."""
    (root / "proc/self").mkdir(parents=True)
    if version == 2:
        line, mount = "0::/app/job", "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw"
        base, names = root / "sys/fs/cgroup", ("memory.max", "memory.current", "inactive_file")
    else:
        line = "4:memory:/app/job"
        mount = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory"
        base = root / "sys/fs/cgroup/memory"
        names = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
    (root / "proc/self/cgroup").write_text(f"9:name=systemd:/\n{line}\n")
    (root / "proc/self/mountinfo").write_text(f"22 1 0:20 / / rw - ext4 /dev/vda rw\n{mount}\n")
    for relative, (limit, usage, cache) in levels.items():
        folder = base / relative
        folder.mkdir(parents=True, exist_ok=True)
        unlimited = "max" if version == 2 else str(2**63 - 4096)
        (folder / names[0]).write_text(f"{unlimited if limit is None else limit}\n")
        (folder / names[1]).write_text(f"{usage}\n")
        (folder / "memory.stat").write_text(f"anon 1\n{names[2]} {cache}\n")


@pytest.mark.parametrize("version", [1, 2])
def test_the_tightest_cgroup_limit_counts(version, tmp_path):
    """The process's cgroup and its ancestors: the least of limit - (usage -
    inactive page cache), naming the file that sets it."""
    _fake_cgroup(
        tmp_path,
        version,
        {
            ".": (None, 9_000_000_000, 0),
            "app": (4_000_000_000, 2_500_000_000, 500_000_000),  # 2.0 GB left
            "app/job": (3_000_000_000, 1_000_000_000, 0),  # 2.0 GB left, then less
        },
    )
    limit = memory.cgroup_limit(tmp_path)
    assert limit is not None and limit.available == 2_000_000_000 and not limit.address_space
    _fake_cgroup(tmp_path / "tighter", version, {"app/job": (3_000_000_000, 1_800_000_000, 0)})
    limit = memory.cgroup_limit(tmp_path / "tighter")
    assert limit.available == 1_200_000_000
    assert "app/job/memory." in limit.name and "3.0 GB, 1.8 GB in use" in limit.name


def test_no_cgroup_limit_is_none(tmp_path):
    _fake_cgroup(tmp_path, 2, {".": (None, 1, 0), "app/job": (None, 1, 0)})
    assert memory.cgroup_limit(tmp_path) is None
    assert memory.cgroup_limit(tmp_path / "nowhere") is None


def test_the_address_space_limit_is_what_ulimit_leaves(monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (6_000_000_000, resource.RLIM_INFINITY))
    monkeypatch.setattr(memory, "_virtual_size", lambda: 1_450_000_000)
    limit = memory.address_space_limit()
    assert limit.available == 4_550_000_000 and limit.address_space
    assert "ulimit -v: 6.0 GB, 1.4 GB of it mapped" in limit.name
    monkeypatch.setattr(resource, "getrlimit", lambda kind: (resource.RLIM_INFINITY,) * 2)
    assert memory.address_space_limit() is None


def test_the_limit_that_binds_is_named(monkeypatch):
    """Plenty of memory, 4.56 GB of address space left (6 GB less what
    TensorFlow maps): the 1.6 GB bomb's config is refused by the address space,
    a 204 MB model (the measured one: its export grew the virtual size by
    2.86 GB) passes."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert "tensorflow" in sys.modules  # imported: its address space is mapped already
    monkeypatch.setattr(
        memory,
        "limits",
        lambda: [
            memory.Limit("MemAvailable in /proc/meminfo", 23_000_000_000),
            memory.Limit("the address-space limit (test)", 4_560_000_000, True),
        ],
    )
    memory.check_fits(204_240_896)
    with pytest.raises(UsageError) as refused:
        memory.check_fits(1_600_080_000)
    message = str(refused.value)
    assert "9.6 GB of address space (0.8 GB + 5.5x its 1.60 GB of weights)" in message
    assert "4.6 GB are available under the address-space limit (test)" in message


def test_resident_memory_is_the_least_of_meminfo_and_the_cgroup(monkeypatch):
    monkeypatch.setattr(memory, "_meminfo_available", lambda: 20_000_000_000)
    cgroup = memory.Limit("the cgroup (test)", 3 * 10**9)
    monkeypatch.setattr(memory, "cgroup_limit", lambda: cgroup)
    monkeypatch.setattr(memory, "address_space_limit", lambda: None)
    assert memory.available_bytes() == 3 * 10**9
    assert memory.limits() == [memory.Limit("the cgroup (test)", 3 * 10**9)]
    with pytest.raises(UsageError, match="3.0 GB are available under the cgroup"):
        memory.check_fits(700_000_000)


def test_the_streamed_path_checks_the_declared_size_first(tmp_path, monkeypatch):
    """`--weights-dtype keep --quantize int4` (the streamed folder export) on an
    archive declaring 1.6 GB, with 1 GB left: refused before any work, as the
    float32 path refuses it (it reached 6.97 GB on a 3.2 GB declaration)."""
    from keras_layers.export import genai_folder
    from keras_layers.export.options import ExportOptions

    bomb = archives.config_only_bomb(tmp_path / "bomb.keras", BOMB_UNITS, BOMB_UNITS)
    monkeypatch.setattr(memory, "limits", lambda: [memory.Limit("MemAvailable", 1 << 30)])
    options = ExportOptions(quantize="int4", weights_dtype="keep")
    with pytest.raises(UsageError, match="MemAvailable"):
        genai_folder.streams(bomb, options)
    # The check is the one --no-memory-check skips.
    unchecked = ExportOptions(quantize="int4", weights_dtype="keep", memory_check=False)
    assert genai_folder.streams(bomb, unchecked)


def test_a_layer_name_of_megabytes_is_refused_before_keras_reads_it(tmp_path, capsys):
    """A 15 MiB layer name cost 3.1 GB of RSS in Keras and TensorFlow, outside
    the memory check; names are identifiers: refused, exit 2, one line."""
    config = archives.dense_config(8, 16)
    config["config"]["layers"][-1]["config"]["name"] = "d" * (15 << 20)
    path = archives.write_keras(
        tmp_path / "long_name.keras", config, archives.weights_h5(archives.dense_shapes(8, 16))
    )
    code = main([str(path), "-o", str(tmp_path / "out.onnx"), "--shapes", "1x3"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "15,728,640 characters" in err and "re-save the model" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out.onnx").exists()


def test_a_vocabulary_of_millions_of_tokens_counts_in_the_memory_check(tmp_path, monkeypatch):
    """A keras-hub vocabulary costs about 1 KB a token once loaded (a
    1,000,000-token WordPiece vocabulary, 9.9 MB of assets, grew the load by
    1.07 GB), outside the weights the check counted: an archive whose assets
    declare 4,000,000 tokens is refused, exit 2, before any work, naming them."""
    import zipfile

    from keras_layers.export import ExportOptions, export_model

    path = save(sequential_model(), tmp_path / "model.keras")
    vocabulary = "".join(f"t{index}\n" for index in range(4_000_000)).encode()
    with zipfile.ZipFile(path, "a", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("assets/tokenizer/vocabulary.txt", vocabulary)
    assert memory.archive_asset_bytes(path) == len(vocabulary)
    available = memory.BASELINE_BYTES + 2_000_000_000  # room for the weights, not the vocabulary
    monkeypatch.setattr(memory, "limits", lambda: [memory.Limit("MemAvailable", available)])
    megabytes = f"{len(vocabulary) / 1e6:.1f}".replace(".", r"\.")
    with pytest.raises(UsageError, match=rf"120x its {megabytes} MB of assets"):
        export_model(path, tmp_path / "out.onnx", ExportOptions(shapes=[(1, 3)]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.keras"]
