"""Every internal of another library that the export swaps still exists, and
`patched` puts back what was there."""

import threading

import numpy as np
import pytest

from keras_layers.export import compat

pytestmark = pytest.mark.tensorflow_only  # the internals are TensorFlow backend's


@pytest.mark.parametrize("internal", compat.INTERNALS, ids=lambda internal: internal.path)
def test_each_listed_internal_exists_in_the_versions_installed(internal):
    owner = internal.owner()  # raises if its module or class is gone
    if not internal.added:
        assert hasattr(owner, internal.name), (
            f"{internal.module}.{internal.path} is gone from the installed version; "
            f"{internal.user} was written for {internal.written_for}"
        )


def test_patched_restores_an_attribute_and_removes_an_added_one():
    from tensorflow.python.grappler import tf_optimizer

    original = tf_optimizer.OptimizeGraph
    with pytest.raises(RuntimeError), compat.patched(tf_optimizer, "OptimizeGraph", len):
        assert tf_optimizer.OptimizeGraph("abc") == 3
        assert compat.original(tf_optimizer, "OptimizeGraph") is original
        raise RuntimeError("the block fails")
    assert tf_optimizer.OptimizeGraph is original
    had_product = hasattr(np, "product")
    with compat.patched(np, "product", np.prod):
        assert np.product([2, 3]) == 6
    assert hasattr(np, "product") == had_product


def test_an_inherited_method_is_restored_as_inherited():
    from keras.src.backend.tensorflow.core import Variable

    inherited = "_direct_assign" not in Variable.__dict__
    original = Variable._direct_assign
    with compat.patched(Variable, "_direct_assign", lambda self, value: ("swapped", value)):
        assert Variable._direct_assign(None, 1) == ("swapped", 1)
        assert compat.original(Variable, "_direct_assign") is original
    assert Variable._direct_assign is original
    assert ("_direct_assign" not in Variable.__dict__) == inherited


def _in_thread(function):
    """What `function()` returns (or raises) when called in a thread of its own."""
    result = {}

    def run():
        try:
            result["value"] = function()
        except Exception as error:  # noqa: BLE001 - raised again in the caller
            result["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def test_a_swap_is_invisible_to_other_threads():
    """Inside a block, this thread calls the replacement and every other
    thread the original; blocks in two threads at once each see their own,
    and the attribute is put back when the last block ends."""
    from tensorflow.python.grappler import tf_optimizer

    original = tf_optimizer.OptimizeGraph
    inside, release = threading.Event(), threading.Event()
    seen = {}

    def other_block():
        with compat.patched(tf_optimizer, "OptimizeGraph", lambda *args: "other"):
            seen["other"] = tf_optimizer.OptimizeGraph()
            inside.set()
            release.wait(10)
            seen["other, later"] = tf_optimizer.OptimizeGraph()

    with compat.patched(tf_optimizer, "OptimizeGraph", lambda *args: "mine"):
        assert _in_thread(lambda: tf_optimizer.OptimizeGraph.__name__) == "OptimizeGraph"
        assert _in_thread(lambda: compat.original(tf_optimizer, "OptimizeGraph")) is original
        other = threading.Thread(target=other_block)
        other.start()
        assert inside.wait(10)
        assert tf_optimizer.OptimizeGraph() == "mine"
    assert tf_optimizer.OptimizeGraph is not original  # the other block is still open
    release.set()
    other.join()
    assert seen == {"other": "other", "other, later": "other"}
    assert tf_optimizer.OptimizeGraph is original


def test_another_thread_calls_the_original_function():
    calls = []
    with compat.patched(np, "product", lambda values: calls.append(values) or -1):
        assert np.product([2, 3]) == -1
        if compat.original(np, "product", None) is None:  # NumPy 2: no product outside
            with pytest.raises(AttributeError):
                _in_thread(lambda: np.product([2, 3]))
        else:
            assert _in_thread(lambda: np.product([2, 3])) == 6
    assert calls == [[2, 3]]


def test_an_unlisted_attribute_is_refused_with_the_fix():
    with pytest.raises(LookupError, match="not listed as swapped in keras_layers.export.compat"):
        with compat.patched(np, "prod", np.sum):
            pass
    assert np.prod is not np.sum


def test_no_module_swaps_an_attribute_outside_compat():
    """Each listed `user` names a function that exists; none of the stages
    assigns to another library's attribute by hand (`X.attr = ...` of a module
    imported from outside the package)."""
    import ast
    from pathlib import Path

    folder = Path(compat.__file__).parent
    offenders = []
    for path in folder.rglob("*.py"):
        if path.name == "compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id
                    in {
                        "np",
                        "nn",
                        "core",
                        "backend_numpy",
                        "tf_optimizer",
                        "variable_class",
                        "Variable",
                        "keras",
                        "tf",
                    }
                ):
                    offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == [], f"swap these through compat.patched: {offenders}"
