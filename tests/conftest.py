import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow without its oneDNN kernels, as the command runs it
# (startup.prepare_process). With them, on an AVX-512 CPU (TensorFlow 2.21),
# a Conv1D too long for its input returned a (2, 2, 8) output at length 2
# after failing at length 1, and failed at length 7 quoting length 1's
# sizes: Keras' own reference shapes depended on the CPU and on the order of
# the calls (tests/test_validation_rules.py's conv model).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def policy():
    """Set a global dtype policy for one test and restore float32 after it."""

    def set_policy(name):
        keras.mixed_precision.set_global_policy(name)

    yield set_policy
    keras.mixed_precision.set_global_policy("float32")


@pytest.fixture(scope="session")
def trained_demo(tmp_path_factory, worker_id):
    """The demo encoder, trained once per test run by the command with no
    arguments (the README's main job) into a home of its own.

    Training takes a minute; two tests need a trained demo (this one's
    assertions are in tests/test_export.py, and docs/export.md's first
    example reuses it). Workers share it: the first to ask trains under a
    lock, the others wait and read. Returns the home, what the command
    printed, and what it left in its working directory.
    """
    import fcntl
    import subprocess
    import sys
    from pathlib import Path

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if worker_id != "master" else base) / "trained_demo"
    shared.mkdir(exist_ok=True)
    home, cwd, printed = shared / "home", shared / "cwd", shared / "printed.txt"
    with (shared / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not printed.exists():
            cwd.mkdir()
            script = Path(__file__).resolve().parent.parent / "export" / "to_onnx.py"
            result = subprocess.run(
                [sys.executable, str(script)],
                cwd=cwd,
                env={**os.environ, "KERAS_LAYERS_HOME": str(home)},
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
            printed.write_text(result.stdout)  # last: the home is whole once it exists
    return home, printed.read_text(), sorted(path.name for path in cwd.iterdir())


from hypothesis import HealthCheck, settings  # noqa: E402

# Property tests: a fast profile for the default suite, CI's for its fuzz tier
# (HYPOTHESIS_PROFILE=ci python -m pytest -m fuzz), a thorough one on demand
# (HYPOTHESIS_PROFILE=thorough python -m pytest tests/test_properties.py tests/test_fuzz.py).
settings.register_profile(
    "fast",
    max_examples=15,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
# CI's fuzz tier: reproducible (derandomized), sized to fit CI's budget
# (1,000 cases a test, about half the 2,000 of the thorough profile's time).
settings.register_profile(
    "ci",
    max_examples=1000,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "thorough",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fast"))


def _group_module_fixtures(items):
    """Give a test that uses a fixture its module shares (scope `module` or
    `class`, an export made once) the module's `xdist_group`, unless it has
    one: `--dist loadgroup` then runs those tests on one worker, which makes
    the fixture once, and hands out the module's other tests one by one."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        definitions = getattr(item, "_fixtureinfo", None)
        definitions = definitions.name2fixturedefs.values() if definitions else ()
        module = getattr(item, "module", None)
        if module is not None and any(
            chain[-1].scope in ("module", "class") and chain[-1].func.__module__ == module.__name__
            for chain in definitions
        ):
            item.add_marker(pytest.mark.xdist_group(module.__name__))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Group the tests of a module's shared fixtures (`_group_module_fixtures`).
    Under another Keras backend, deselect what needs TensorFlow (it runs in
    the TensorFlow run of the suite); never skip silently."""
    _group_module_fixtures(items)
    if keras.backend.backend() == "tensorflow":
        return
    keep, drop = [], []
    for item in items:
        (drop if item.get_closest_marker("tensorflow_only") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_configure(config):
    """Refuse a run whose pytest-xdist would ignore `xdist_group`: pytest 9
    keeps a test's id in `Node._id`, and pytest-xdist 3.8 writes the group's
    suffix to `_nodeid`, silently, so each worker made every module fixture."""
    from importlib import metadata

    if config.getoption("dist", "no") != "loadgroup":
        return
    versions = [metadata.version(name) for name in ("pytest", "pytest-xdist")]
    pytest_version, xdist = (tuple(int(part) for part in v.split(".")[:2]) for v in versions)
    if pytest_version[0] >= 9 and xdist <= (3, 8):
        raise pytest.UsageError(
            f"pytest {versions[0]} with pytest-xdist {versions[1]} ignores xdist_group: "
            "install the pytest the dev extra pins (pip install -e '.[dev]')"
        )
