"""The import picture of `keras_layers`, read from the code: docs/design.md's list.

    python docs/imports.py            # rewrite the list in docs/design.md
    python docs/imports.py --check    # exit 1 if the page's list differs from the code

For each module of the package, the package's modules it imports at its top
level (what runs when it is imported). Imports inside functions are listed
apart: they run later, and outside the command line they are kept to a few.
tests/test_architecture.py checks the page, that the top-level imports have no
cycle, and that dependencies point one way.
"""

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "keras_layers"
PAGE = ROOT / "docs" / "design.md"
BEGIN, END = "<!-- imports -->", "<!-- /imports -->"


def module_name(path: Path) -> str:
    """`keras_layers/export/graph/model.py` -> `keras_layers.export.graph.model`."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _own(name: str, modules: set) -> str | None:
    """The package's module that `name` is (or lies in), if any."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node, module: str, is_package: bool, modules: set) -> set:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = _absolute(node, module, is_package)
        names = [f"{base}.{alias.name}" for alias in node.names] + [base]
    found = {_own(name, modules) for name in names}
    # `from package import submodule` names the submodule, not the package too.
    if isinstance(node, ast.ImportFrom) and len(found - {None}) > 1:
        found.discard(_own(_absolute(node, module, is_package), modules))
    return found - {None, module}


def _in_type_checking(node, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            return True
    return False


def imports() -> dict:
    """module -> {"top": set of own modules imported at import time,
    "inside": list of (function, own module) imported inside functions}."""
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    found = {}
    for path in paths:
        module = module_name(path)
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        entry = found[module] = {"top": set(), "inside": []}
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            if _in_type_checking(node, parents):
                continue
            targets = _targets(node, module, is_package, modules)
            function = _enclosing_function(node, parents)
            if function is None:
                entry["top"] |= targets
            else:
                entry["inside"] += [(function, target) for target in sorted(targets)]
    return found


def _enclosing_function(node, parents: dict) -> str | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return node.name
    return None


def _short(module: str) -> str:
    return module.removeprefix("keras_layers.") if module != "keras_layers" else module


def render(found: dict) -> str:
    """The page's list: one line per module, what it imports at its top level,
    then what it imports inside functions."""
    lines = []
    for module in sorted(found):
        top = ", ".join(_short(target) for target in sorted(found[module]["top"])) or "-"
        line = f"- `{_short(module)}`: {top}"
        inside = found[module]["inside"]
        if inside:
            line += "; inside functions: " + ", ".join(
                f"{_short(target)} (`{function}`)" for function, target in inside
            )
        lines.append(line)
    return "\n".join(lines)


def rewrite(text: str, listing: str) -> str:
    """The page with the text between the markers replaced by `listing`."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{listing}\n{END}{tail}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page differs")
    args = parser.parse_args(argv)
    text = PAGE.read_text()
    wanted = rewrite(text, render(imports()))
    if args.check:
        if wanted != text:
            print(f"{PAGE.relative_to(ROOT)}: the import list differs; run python docs/imports.py")
            return 1
        return 0
    PAGE.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
