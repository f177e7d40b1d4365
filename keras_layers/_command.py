"""The `keras-layers-export` console script, before the export package loads.

With `pip install keras-layers` alone (no `export` extra), importing
`keras_layers.export` raises an ImportError naming the extra; the command
prints that as one `error:` line and exits 2, instead of a traceback.
Nothing here imports the layers or any library.
"""

import sys

EXIT_USAGE = 2


def run() -> int:
    """Run the export command, or say which extra it needs.

    Returns:
        The command's exit code; 2 when the `export` extra is missing.
    """
    try:
        from keras_layers.export.cli import run as export
    except ImportError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    return export()
