"""The documentation: every Python example on docs/*.md runs, and the site builds.

A page's examples run in order, in one namespace and one temporary working
directory, the way a reader works through the page. A block right after an
`<!-- no-test -->` line is skipped on purpose (keep those few: each one is an
example nobody checks).
"""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import pytest

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NO_TEST = "<!-- no-test -->"
# A fenced Python block, possibly indented (inside a list item or admonition).
PYTHON_BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$",
    flags=re.S | re.M,
)


def python_blocks(page: Path) -> list:
    """`(first_line, code, skipped)` for every ```python block of `page`."""
    text = page.read_text()
    blocks = []
    for match in PYTHON_BLOCK.finditer(text):
        first_line = text.count("\n", 0, match.start("code")) + 1
        before = text[: match.start()].rstrip().splitlines()
        skipped = bool(before) and before[-1].strip() == NO_TEST
        blocks.append((first_line, textwrap.dedent(match.group("code")), skipped))
    return blocks


PAGES = sorted(page for page in DOCS.glob("*.md") if python_blocks(page))


@pytest.fixture
def clean_keras():
    """Undo what an example may leave behind: a global dtype policy, graph state."""
    yield
    keras.mixed_precision.set_global_policy("float32")
    keras.backend.clear_session()


# generation.md exports and generates with three decoders (a minute): slow tier.
SLOW_PAGES = {"generation.md"}


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(page, id=page.name, marks=[pytest.mark.slow] * (page.name in SLOW_PAGES))
        for page in PAGES
    ],
)
def test_python_examples_run(page, tmp_path, monkeypatch, clean_keras):
    monkeypatch.chdir(tmp_path)  # examples that save files write them here
    namespace = {"__name__": "__main__"}
    for first_line, code, skipped in python_blocks(page):
        if skipped:
            continue
        # Pad with blank lines so a traceback points at the line in the page.
        source = "\n" * (first_line - 1) + code
        exec(compile(source, str(page), "exec"), namespace)


def test_site_builds_in_strict_mode(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "api" / "index.html").exists()


def test_every_test_the_guarantees_name_exists():
    """docs/export.md's Guarantees table cites tests by name; each must exist."""
    section = (DOCS / "export.md").read_text().split("## Guarantees", 1)[1].split("\n## ", 1)[0]
    cited = 0
    for row in section.splitlines():
        if not row.startswith("| ") or "tests/" not in row:
            continue
        current = None
        for file, name in re.findall(r"`(tests/[\w/]+\.py)?(?:::(\w+))?`", row.split("|")[2]):
            current = file or current
            source = (ROOT / current).read_text()
            if name:
                assert re.search(rf"^def {name}\(", source, flags=re.M), (current, name)
            cited += 1
    assert cited >= 15
