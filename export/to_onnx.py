"""Export a Keras 3 model to ONNX and prove it matches: see `export/cli.py`.

Usage: python export/to_onnx.py [MODEL.keras] [-o OUT.onnx] [options]
"""

import os
import sys
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script: import the `export` package from the repository root,
    # not modules from this folder by their bare names.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from export.cli import main, silence_native_stderr  # noqa: E402

if __name__ == "__main__":
    if "--verbose" not in sys.argv:
        silence_native_stderr()
    sys.exit(main())
