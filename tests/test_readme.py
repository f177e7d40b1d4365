"""The README's Python examples run as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks(path):
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    # The onnxruntime example needs the demo's file: test_export.py runs it.
    blocks = [block for block in python_blocks(README) if "artifacts/demo" not in block]
    assert blocks, "README has no Python example"
    monkeypatch.chdir(tmp_path)
    for block in blocks:
        exec(compile(block.replace("/tmp/", f"{tmp_path}/"), str(README), "exec"), {})


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
