"""The documentation: every example on docs/*.md runs alone, and the site builds.

A reader copies one block, not a page: each ```python block runs by itself,
in a fresh namespace and a fresh temporary working directory, so a block that
needs a file makes it. Each ```bash block that runs the export command
(`keras-layers-export`, `python export/to_onnx.py`, `python -m
keras_layers.export`) makes its inputs too: the default tier checks that every
file a command reads is written earlier in the same block (or is the demo),
the slow tier runs the block with `bash -euo pipefail` in a temporary
directory. A block right after `<!-- no-test: WHY -->` is skipped with that
reason (keep those few: each one is an example nobody checks).
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import keras
import pytest

from keras_layers.export.cli import parser

pytestmark = pytest.mark.tensorflow_only  # the export pipeline runs on TensorFlow

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# A fenced block, possibly indented (inside a list item or admonition).
FENCED = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<language>\w+)[ \t]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$",
    flags=re.S | re.M,
)
NO_TEST = re.compile(r"<!-- no-test(?:: (?P<reason>.*\S))? -->")
# How the pages spell the export command; what follows is its arguments.
COMMAND = re.compile(
    r"^(?:keras-layers-export|python (?:export/to_onnx\.py|-m keras_layers\.export))\b"
)
# The checkout's folders a command block names by relative path, as run from the checkout.
CHECKOUT_FOLDERS = ("export", "examples")
# generation.md exports and generates with decoders (a minute each): slow tier,
# as is any block elsewhere that exports a decoder or its folder.
SLOW_PAGES = {"generation.md"}
SLOW_CODE = 'task="causal-lm"'


@dataclass(frozen=True)
class Block:
    """One fenced block: its page, the line of its opening fence, its code
    (dedented), and why it is not run (`None`: it is run)."""

    page: Path
    line: int
    code: str
    skipped: str | None

    @property
    def id(self) -> str:
        return f"{self.page.name}:L{self.line}"

    def source(self) -> str:
        """The code padded with blank lines, so a traceback names the page's line."""
        return "\n" * self.line + self.code


def blocks(page: Path, language: str) -> list[Block]:
    """Every ```LANGUAGE block of `page`."""
    text = page.read_text()
    found = []
    for match in FENCED.finditer(text):
        if match.group("language") != language:
            continue
        before = text[: match.start()].rstrip().splitlines()
        marker = NO_TEST.fullmatch(before[-1].strip()) if before else None
        skipped = (marker["reason"] or "") if marker else None
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(page, line, textwrap.dedent(match.group("code")), skipped))
    return found


def commands(block: Block) -> list[tuple[int, str]]:
    """`(offset in the block, command line)` of each export command the block runs."""
    text = block.code.replace("\\\n", " ")
    found, offset = [], 0
    for line in text.splitlines(keepends=True):
        if COMMAND.match(line):
            found.append((offset, line.strip()))
        offset += len(line)
    return found


def command_blocks(page: Path) -> list[Block]:
    return [block for block in blocks(page, "bash") if commands(block)]


PAGES = sorted(DOCS.glob("*.md"))
PYTHON = [block for page in PAGES for block in blocks(page, "python")]
SHELL = [block for page in PAGES for block in command_blocks(page)]


def _params(examples: list[Block], slow: bool | None = None) -> list:
    """A param per block, skipped with its reason; in the slow tier when
    `slow`, or, when `slow` is None, when it is costly (`SLOW_PAGES`, `SLOW_CODE`)."""
    params = []
    for block in examples:
        marks = [pytest.mark.skip(reason=block.skipped)] if block.skipped is not None else []
        costly = block.page.name in SLOW_PAGES or SLOW_CODE in block.code
        if slow or (slow is None and costly):
            marks.append(pytest.mark.slow)
        params.append(pytest.param(block, id=block.id, marks=marks))
    return params


@pytest.fixture
def clean_keras():
    """Undo what an example may leave behind: a global dtype policy, graph state."""
    yield
    keras.mixed_precision.set_global_policy("float32")
    keras.backend.clear_session(free_memory=False)  # no gc.collect: 0.4 s a block saved


@pytest.mark.parametrize("block", _params(PYTHON))
def test_python_example_runs_alone(block, tmp_path, monkeypatch, clean_keras):
    monkeypatch.chdir(tmp_path)  # what the example saves lands here, and nothing else is here
    exec(compile(block.source(), str(block.page), "exec"), {"__name__": "__main__"})


def test_every_skipped_example_says_why():
    unexplained = [
        block.id
        for page in PAGES
        for language in ("python", "bash")
        for block in blocks(page, language)
        if block.skipped == ""
    ]
    assert not unexplained, f"write <!-- no-test: WHY --> before {unexplained}"


def _inputs(command: str) -> list[str]:
    """The files the export command `command` reads: MODEL (none: the demo),
    FILE.onnx with --check-only, and each --import module's file."""
    argv = shlex.split(COMMAND.sub("", command), comments=True)
    args = parser("keras-layers-export", Path("DEMO")).parse_args(argv)
    paths = [str(args.model)] if args.model is not None else []
    if args.check_only:
        paths.append(str(args.onnx_path))
    for module in args.imports or ():
        paths.append(module if module.endswith(".py") else f"{module.replace('.', '/')}.py")
    return paths


@pytest.mark.parametrize("block", _params(SHELL, slow=False))
def test_every_command_example_makes_its_inputs(block):
    """Each file an export command of the block reads is written earlier in
    the same block (its name appears before the command), or is the
    project's own (a module of keras_layers), or the command runs the demo."""
    for offset, command in commands(block):
        made = block.code.replace("\\\n", " ")[:offset]
        for path in _inputs(command):
            assert path in made or path.startswith("keras_layers/"), (
                f"{block.id}: `{command}` reads {path}, which the block does not make first"
            )


# A line that runs the demo: the command with no model argument.
_RUNS_THE_DEMO = re.compile(r"^(keras-layers-export|python export/to_onnx\.py)\s*(#.*)?$", re.M)


@pytest.mark.parametrize("block", _params(SHELL, slow=True))
def test_command_example_runs_alone(block, tmp_path, request):
    for folder in CHECKOUT_FOLDERS:
        (tmp_path / folder).symlink_to(ROOT / folder)
    # `python` and `keras-layers-export` are this environment's; the demo is
    # in a home of its own, never in the checkout's artifacts: trained once
    # per test run (tests/test_export.py checks the training), so an example
    # that runs it reuses it, as a user's second run does.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    home = str(tmp_path / "home")
    if _RUNS_THE_DEMO.search(block.code):
        shutil.copytree(request.getfixturevalue("trained_demo")[0], home)
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=tmp_path,
        env={**os.environ, "PATH": path, "KERAS_LAYERS_HOME": home},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, f"{block.id}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"


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
