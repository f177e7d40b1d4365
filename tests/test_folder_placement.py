"""A genai folder is placed as one set (`folder_placement`): at every instant,
a SIGKILL included, and after any failed step, FOLDER shows the last
export's files or the new one's, never a mix; what the last export wrote and
the new one does not goes with the switch; the user's files stay.

No model is exported here: the staged exports are small files, so every
step of a placement can be killed or failed in turn. What a reader sees is
`view`: every visible entry's bytes, links followed (a link leading nowhere
is an absent file, to every reader)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from keras_layers.export import folder_placement
from keras_layers.export.errors import OutputError

# Export A: a float folder with a tokenizer and an int4 folder.
EXPORT_A = {
    "model.onnx": "A's decoder",
    "model.onnx.aaaa.data": "A's weights",
    "genai_config.json": "A's config",
    "tokenizer.json": "A's tokenizer",
    "report.json": "A's report",
    "int4": {"model.onnx": "A's int4 decoder", "genai_config.json": "A's int4 config"},
}
# Export B: another model, without preprocessor, not quantized.
EXPORT_B = {
    "model.onnx": "B's decoder",
    "model.onnx.bbbb.data": "B's weights",
    "genai_config.json": "B's config",
    "report.json": "B's report",
}
# B streamed: only int4/ and the report (an int4 folder over a float one).
EXPORT_B_STREAMED = {
    "int4": {"model.onnx": "B's int4 decoder", "tokenizer.json": "B's tokenizer"},
    "report.json": "B's report",
}
USER = {"notes.txt": "mine"}
# An export written before the store: real files, and a report of a causal-lm folder.
OLDER_REPORT = json.dumps({"task": "causal-lm", "folder": {}, "passed": True})


def write(root: Path, tree: dict) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, content in tree.items():
        if isinstance(content, dict):
            write(root / name, content)
        else:
            (root / name).write_text(content)


def view(folder: Path) -> dict:
    """What a reader of `folder` sees: each visible entry's text (a folder's,
    entry by entry), links followed; hidden entries (the store, the lock)
    are not looked at."""
    found = {}
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") or not entry.exists():
            continue
        found[entry.name] = view(entry) if entry.is_dir() else entry.read_text()
    return found


def place(folder: Path, tree: dict) -> None:
    """Stage `tree` as an export does, and place it."""
    with folder_placement.staging(folder) as staged:
        write(staged, tree)
        folder_placement.place_folder(staged, folder)


def older_folder(folder: Path) -> None:
    """A's files as an export before the store left them: real files."""
    write(folder, {**EXPORT_A, "report.json": OLDER_REPORT})


def start(folder: Path, old: str) -> dict:
    """FOLDER holding the user's notes and export A (`old`: placed, or
    written before the store); returns what a reader sees."""
    write(folder, USER)
    if old == "placed":
        place(folder, EXPORT_A)
    else:
        older_folder(folder)
    return view(folder)


def store_entries(folder: Path) -> list:
    """The store's entries, a staging folder of a killed export left out
    (removed when idle an hour)."""
    store = folder / folder_placement.STORE
    return sorted(e.name for e in store.iterdir() if not e.name.startswith("staging-"))


@pytest.mark.parametrize("old", ["placed", "older"])
@pytest.mark.parametrize("new", [EXPORT_B, EXPORT_B_STREAMED], ids=["float", "streamed"])
def test_a_new_export_replaces_every_file_of_the_last_one_and_no_other(tmp_path, old, new):
    """Issue #45, item 17: B over A leaves none of A's files (its tokenizer,
    its int4/, its data), whether A was placed as a set or written before
    the store, and keeps the user's file."""
    folder = tmp_path / "deploy"
    start(folder, old)
    place(folder, new)
    assert view(folder) == {**new, **USER}
    current = os.readlink(folder / folder_placement.STORE / folder_placement.CURRENT)
    assert store_entries(folder) == sorted([folder_placement.CURRENT, current])
    visible = [entry for entry in folder.iterdir() if not entry.name.startswith(".")]
    assert all(folder_placement.is_ours(e) for e in visible if e.name not in USER)


KILLER = """
import json, os, signal, sys
from pathlib import Path
from keras_layers.export import folder_placement

folder, kill_at, tree = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
steps = 0

def counted(function):
    def step(*args, **kwargs):
        global steps
        steps += 1
        if steps == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return function(*args, **kwargs)
    return step

with folder_placement.staging(folder) as staged:
    for name, text in tree.items():
        (staged / name).write_text(text)
    for name in ("replace", "rename", "symlink", "link", "unlink", "rmdir", "mkdir", "chmod"):
        setattr(os, name, counted(getattr(os, name)))
    folder_placement._exchange = counted(folder_placement._exchange)
    folder_placement.place_folder(staged, folder)
"""


@pytest.mark.parametrize("old", ["placed", "older"])
def test_a_sigkill_at_any_step_leaves_the_last_export_or_the_new_one(tmp_path, old):
    """Issue #45, item 17: a child process places B over A and kills itself
    (SIGKILL) before its k-th change to the file system (rename, link,
    unlink, mkdir, ...), for every k until it finishes. Each time a reader
    sees A or B, never a mix, and the next placement gives B with nothing
    left over."""
    seen = set()
    for kill_at in range(1, 200):
        folder = tmp_path / f"k{kill_at}"
        before = start(folder, old)
        after = {**EXPORT_B, **USER}
        child = subprocess.run(
            [sys.executable, "-c", KILLER, str(folder), str(kill_at), json.dumps(EXPORT_B)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert child.returncode in (0, -signal.SIGKILL), child.stderr
        now = view(folder)
        assert now in (before, after), f"killed at step {kill_at}: a mix"
        seen.add("A" if now == before else "B")
        place(folder, EXPORT_B)  # the next export finds what the killed one left
        assert view(folder) == after
        assert len(store_entries(folder)) == 2  # `current` and its version
        if child.returncode == 0:
            break
    else:
        pytest.fail("the placement never finished")
    assert seen == {"A", "B"} and kill_at > 5


def failing_at(step: int):
    """A wrapper for file system calls: the `step`-th call of them all fails
    as on an immutable file."""
    calls = []

    def wrap(function):
        def call(*args, **kwargs):
            calls.append(function.__name__)
            if len(calls) == step:
                raise PermissionError(1, "Operation not permitted", str(args[-1]))
            return function(*args, **kwargs)

        return call

    return wrap


@pytest.mark.parametrize("old", ["placed", "older"])
def test_a_failing_step_at_any_point_leaves_the_folder_as_it_was(tmp_path, monkeypatch, old):
    """Issue #45, item 17: the k-th rename, link or exchange fails (as on an
    immutable genai_config.json), for every k until none is left: each time
    the placement raises OutputError and a reader sees A, as before."""
    for fail_at in range(1, 200):
        folder = tmp_path / f"f{fail_at}"
        before = start(folder, old)
        failing = failing_at(fail_at)
        with folder_placement.staging(folder) as staged:
            write(staged, EXPORT_B)
            with monkeypatch.context() as patch:
                for name in ("replace", "rename", "symlink"):
                    patch.setattr(os, name, failing(getattr(os, name)))
                patch.setattr(folder_placement, "_exchange", failing(folder_placement._exchange))
                try:
                    folder_placement.place_folder(staged, folder)
                except OutputError as error:
                    assert "nothing in the folder was changed" in str(error)
                    assert view(folder) == before, f"failed at step {fail_at}: a mix"
                    continue
        assert view(folder) == {**EXPORT_B, **USER}
        break
    else:
        pytest.fail("the placement never finished")
    assert fail_at > 3


def test_an_entry_of_the_other_kind_is_refused_and_nothing_changes(tmp_path):
    """Issue #45, item 18: a file where the export's int4/ goes, or a folder
    where a file goes, is an OutputError (exit 2) naming it."""
    folder = tmp_path / "deploy"
    write(folder, {"int4": "a file of mine", "model.onnx": {"x": "a folder of mine"}})
    before = view(folder)
    with pytest.raises(OutputError, match=r"deploy/int4 is a file, where the export's int4 folder"):
        folder_placement.check_names(folder, ["report.json"], ["int4"])
    with pytest.raises(OutputError, match=r"model.onnx is a directory, where the export's"):
        place(folder, EXPORT_B)
    assert view(folder) == before
    assert sorted(p.name for p in folder.iterdir()) == ["int4", "model.onnx"]


def test_a_failed_export_in_a_new_folder_creates_nothing(tmp_path):
    folder = tmp_path / "new" / "deploy"
    with pytest.raises(RuntimeError), folder_placement.staging(folder) as staged:
        write(staged, EXPORT_B)
        raise RuntimeError("the export failed")
    assert list(tmp_path.iterdir()) == []


def test_onnx_runtime_reads_a_placed_decoder_and_its_data_through_the_links(tmp_path):
    """ONNX Runtime resolves the external data of `FOLDER/model.onnx`, a
    link into the store, and refuses data outside the model's folder: the
    data is found, and the logits are the weights'."""
    weight = np.arange(12, dtype=np.float32).reshape(3, 4)
    tensor = numpy_helper.from_array(weight, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [tensor],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    folder = tmp_path / "deploy"
    with folder_placement.staging(folder) as staged:
        onnx.save_model(
            proto,
            staged / "model.onnx",
            save_as_external_data=True,
            location="model.onnx.cccc.data",
            size_threshold=0,
        )
        folder_placement.place_folder(staged, folder)
    assert (folder / "model.onnx").is_symlink() and (folder / "model.onnx.cccc.data").is_symlink()
    x = np.ones((1, 3), np.float32)
    (y,) = ort.InferenceSession(str(folder / "model.onnx")).run(None, {"x": x})
    np.testing.assert_array_equal(y, x @ weight)
