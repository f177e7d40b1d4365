"""The README's Python examples run as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def run_blocks(blocks, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block.replace("/tmp/", f"{tmp_path}/"), str(README), "exec"), {})


def test_readme_layer_examples_run(tmp_path, monkeypatch):
    """On every backend: the examples that use the layers alone."""
    blocks = [block for block in python_blocks(README) if "onnx" not in block]
    assert blocks, "README has no layer example"
    run_blocks(blocks, tmp_path, monkeypatch)


@pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow
def test_readme_export_example_runs(tmp_path, monkeypatch):
    # The onnxruntime example needs the demo's file: test_export.py runs it.
    blocks = [
        block
        for block in python_blocks(README)
        if "keras_layers.export" in block and "artifacts/demo" not in block
    ]
    assert len(blocks) == 1, "README has one export example"
    run_blocks(blocks, tmp_path, monkeypatch)


def test_readme_quick_start_commands():
    text = README.read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", text, flags=re.S)
    setup = 'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[dev]"'
    assert commands[:2] == [
        f"{setup} && python export/to_onnx.py",
        f"{setup} && python -m pytest",
    ]
    ci = (README.parent / ".ci" / "run").read_text()
    assert commands[1] in ci
