"""Drop-in Keras 3 layers for Transformer embeddings.

`ScaledEmbedding` (token embedding times a constant, with a matched
initialisation), `SinusoidalPositionEncoding` (the fixed sin/cos encoding, exact
in float32) and `TiedOutputDense` (logits that share an embedding's matrix and
stay tied through saving and loading).
"""

import os as _os
import sys as _sys
import typing as _typing


def _export_command_startup() -> None:
    """Prepare the process when it is the export command, and only then.

    `python -m keras_layers.export` puts the working directory first on
    sys.path before this package is imported: it is taken off before Keras and
    the export stack are, so a stray `keras.py` or `onnxruntime.py` there cannot
    stand in for them. The commands (`-m`, `keras-layers-export` and the
    checkout's `export/to_onnx.py`) also keep the lines TensorFlow's C++ runtime
    writes to descriptor 2 on import off the terminal unless `--verbose` (no
    environment variable silences them in TensorFlow 2.21): descriptor 2 goes
    to /dev/null, and Python's `sys.stderr` keeps the real one. As a library,
    sys.path and the descriptors are the caller's business.

    The commands also run TensorFlow without its oneDNN kernels
    (`TF_ENABLE_ONEDNN_OPTS=0`, unless the environment says otherwise): their
    allocator never returns memory, so the Keras model released before
    ONNX Runtime validates a big model would still hold its weights (measured
    on 2.48 GB of weights: 3.41 GB resident after the release with oneDNN,
    1.62 GB without; see `keras_layers/export/pipeline.py`).
    """
    argv = _sys.orig_argv
    module = argv[argv.index("-m") + 1 : argv.index("-m") + 2] if "-m" in argv else []
    as_module = module == ["keras_layers.export"]
    script = _os.path.basename(_sys.argv[0]) in ("keras-layers-export", "to_onnx.py")
    if not (as_module or script):
        return
    _os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    if as_module and _sys.path[:1] in ([""], [_os.getcwd()]):
        del _sys.path[0]
    if "--verbose" not in argv:
        real_stderr = _os.dup(2)
        devnull = _os.open(_os.devnull, _os.O_WRONLY)
        _os.dup2(devnull, 2)
        _os.close(devnull)
        _sys.stderr = _os.fdopen(real_stderr, "w", buffering=1)


_export_command_startup()

# The layers import Keras, and importing Keras imports its backend (TensorFlow
# by default): `keras_layers.export.generate`, which runs on ONNX Runtime and
# NumPy alone, must not pay for that, and on a server without TensorFlow it
# could not. So the layers are imported on first use (PEP 562), and no later
# than Keras itself: Keras loads a `.keras` file's custom layers only from its
# registry, so `import keras_layers` must still register them before any model
# is loaded, whichever of the two is imported first.
_LAYERS = {
    "ScaledEmbedding": "keras_layers.scaled_embedding",
    "SinusoidalPositionEncoding": "keras_layers.sinusoidal_position_encoding",
    "TiedOutputDense": "keras_layers.tied_output_dense",
    "clone_model_keeping_ties": "keras_layers.tied_output_dense",
}

__all__ = [
    "ScaledEmbedding",
    "SinusoidalPositionEncoding",
    "TiedOutputDense",
    "clone_model_keeping_ties",
]
__version__ = "0.1.0"

if _typing.TYPE_CHECKING:  # what type checkers and the API docs read
    from keras_layers.scaled_embedding import ScaledEmbedding
    from keras_layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
    from keras_layers.tied_output_dense import TiedOutputDense, clone_model_keeping_ties


def _import_layers() -> None:
    import importlib

    for module in dict.fromkeys(_LAYERS.values()):
        importlib.import_module(module)


class _LayersFollowKeras:
    """A `sys.meta_path` entry that imports the layers right after Keras.

    It finds nothing itself: for `keras` it asks the finders after it and
    wraps the loader, so the layers (and their registration) are imported as
    soon as Keras' own module has run, then it leaves `sys.meta_path`. A
    `find_spec("keras")` that only probes (no import) changes nothing.
    """

    def find_spec(self, name, path=None, target=None):
        if name != "keras":
            return None
        for finder in _sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenImportLayers(spec.loader, self)
                return spec
        return None


class _ThenImportLayers:
    """Keras' own loader, then `_import_layers`."""

    def __init__(self, loader, finder):
        self._loader, self._finder = loader, finder

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        if self._finder in _sys.meta_path:
            _sys.meta_path.remove(self._finder)
        _import_layers()


if "keras" in _sys.modules:
    _import_layers()
else:
    _sys.meta_path.insert(0, _LayersFollowKeras())


def __getattr__(name: str):
    if name not in _LAYERS:
        raise AttributeError(f"module 'keras_layers' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAYERS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted([*globals(), *_LAYERS])
