"""`python -m keras_layers.export`: the same command as `keras-layers-export`.

(The working directory that `-m` puts on sys.path is taken off in
`keras_layers/__init__.py`, before anything else is imported.)
"""

import sys

from keras_layers.export.cli import run

if __name__ == "__main__":
    sys.exit(run(prog="python -m keras_layers.export"))
