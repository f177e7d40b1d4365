"""Load a script of the checkout (an example, a docs experiment) as a module, for its tests."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_script(relative: str, name: str):
    """The script at `ROOT / relative`, executed as the module `name`."""
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
