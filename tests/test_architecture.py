"""The layout's promises, read from the code (docs/design.md)."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "docs"))

import imports  # noqa: E402 - docs/imports.py, the page's generator

# The command line imports the stages inside functions so that `--help` starts
# fast; it is exempt from the count below.
# The commands import the pipeline when they run, not when they load: the
# console script's entry point (`_command`) exists to turn a missing extra
# into one error line.
COMMAND_LINE = {"keras_layers.export.cli", "keras_layers.export.__main__", "keras_layers._command"}
MOST_INSIDE_FUNCTIONS = 3
LONGEST_FUNCTION = 80


def _cycle(graph: dict) -> list | None:
    """One cycle of `graph` (module -> modules it imports), or None."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state:
                found = visit(target, [*path, target])
                if found:
                    return found
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return None


def _without_packages(found: dict) -> dict:
    """Top-level imports, less those of a package's `__init__` importing its own
    submodules (which Python runs as one import, not a cycle)."""
    return {
        module: {
            target
            for target in entry["top"]
            if not (target.startswith(module + ".") or module.startswith(target + "."))
        }
        for module, entry in found.items()
    }


def test_the_top_level_imports_have_no_cycle():
    assert _cycle(_without_packages(imports.imports())) is None


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_few_imports_of_the_package_hide_inside_functions():
    inside = [
        f"{module}:{function} imports {target}"
        for module, entry in imports.imports().items()
        if module not in COMMAND_LINE
        for function, target in entry["inside"]
    ]
    assert len(inside) <= MOST_INSIDE_FUNCTIONS, inside


def test_the_layers_never_import_the_export():
    for module, entry in imports.imports().items():
        if module.startswith("keras_layers.export"):
            continue
        assert not any(target.startswith("keras_layers.export") for target in entry["top"]), module


def test_the_graph_toolkit_imports_nothing_above_it():
    for module, entry in imports.imports().items():
        if module.startswith("keras_layers.export.graph"):
            outside = {t for t in entry["top"] if not t.startswith("keras_layers.export.graph")}
            assert outside == set(), f"{module} imports {outside}"


def test_no_function_is_longer_than_80_lines():
    long = []
    for path in sorted((ROOT / "keras_layers").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert long == []


def test_the_design_page_lists_the_imports_as_the_code_has_them():
    assert imports.main(["--check"]) == 0, "run: python docs/imports.py"


# Keras' layer API, overridden: documented by Keras and, for `call`, in the
# class docstring's "Call arguments".
KERAS_METHODS = {
    "call",
    "build",
    "compute_output_shape",
    "compute_mask",
    "get_config",
    "from_config",
    "quantize",
    "quantized_call",
}


def _parameters(function) -> list:
    arguments = function.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    names = names[1:] if names[:1] in (["self"], ["cls"]) else names
    return names + [a.arg for a in (arguments.vararg, arguments.kwarg) if a]


def _returns_a_value(function) -> bool:
    decorators = {getattr(d, "id", getattr(d, "attr", "")) for d in function.decorator_list}
    if "contextmanager" in decorators:
        return False
    if function.returns is not None:
        return not (isinstance(function.returns, ast.Constant) and function.returns.value is None)
    return any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(function))


def _public_functions(tree) -> list:
    found = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and not cls.name.startswith("_"):
            found += [
                node
                for node in cls.body
                if isinstance(node, ast.FunctionDef) and node.name not in KERAS_METHODS
            ]
    return [node for node in found if not node.name.startswith("_")]


def undocumented(tree) -> list:
    """Public functions of two or more parameters whose docstring lacks Args,
    Returns (when they return a value) or Raises (when they raise)."""
    missing = []
    for function in _public_functions(tree):
        if len(_parameters(function)) < 2:
            continue
        text = ast.get_docstring(function) or ""
        wanted = ["Args:"]
        wanted += ["Returns:"] if _returns_a_value(function) else []
        raises = any(isinstance(n, ast.Raise) and n.exc for n in ast.walk(function))
        wanted += ["Raises:"] if raises else []
        lacking = [section for section in wanted if section not in text]
        if lacking:
            missing.append(f"{function.name} lacks {', '.join(lacking)}")
    return missing


def test_public_functions_document_their_arguments_results_and_errors():
    missing = []
    for path in sorted((ROOT / "keras_layers").rglob("*.py")):
        rows = undocumented(ast.parse(path.read_text()))
        missing += [f"{path.relative_to(ROOT)}: {row}" for row in rows]
    assert missing == []


def test_the_docstring_check_finds_what_is_missing():
    source = (
        "def f(a, b):\n    '''Nothing.'''\n    raise ValueError(a)\n\n"
        "def g(a, b) -> int:\n    '''Args:\n        a, b.\n\n    Returns:\n        1.'''\n"
        "    return 1\n"
    )
    assert undocumented(ast.parse(source)) == ["f lacks Args:, Raises:"]
