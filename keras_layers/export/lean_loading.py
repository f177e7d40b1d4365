"""Load a `.keras` archive holding one copy of its weights in memory.

`keras.saving.load_model` first builds the model, drawing every weight from its
initializer, then reads the whole `model.weights.h5` entry into a `BytesIO`
(when `psutil` says it fits) and assigns each weight from it: the weights are
in memory several times over, and much of that stays held afterwards.

Here the model is built with its variables deferred (no initializer runs),
and each variable is created straight from its stored value, read through a
window onto the weights entry of the archive (Keras stores it uncompressed,
so it is one byte range of the file): a variable's values are read into a
buffer aligned as TensorFlow's kernels need, and the variable is made over
that buffer (DLPack), so the weights are in memory once, not copied on their
way from NumPy to a tensor to a variable (three times the largest variable
for a moment, measured). Both paths' peak memory and
time are measured by `benchmarks/big_model.py` (`benchmarks/results/big_model.json`).

It follows Keras' own loading steps (`saving_lib._model_from_config`,
`saving_lib._load_state`, `H5IOStore`), which are not public API. When they
are missing, or an archive is laid out differently (compressed weights,
`.npz` weights, assets), `load` returns None and the caller uses
`keras.saving.load_model`; `tests/test_lean_loading.py` checks that both give
the same variables.
"""

import io
import math
import os
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from keras_layers.export import compat
from keras_layers.export.compat import patched

WEIGHTS_ENTRY = "model.weights.h5"
CONFIG_ENTRY = "config.json"
# What Keras writes besides assets: with anything more, Keras' loader runs.
_PLAIN_ENTRIES = {CONFIG_ENTRY, "metadata.json", WEIGHTS_ENTRY}
_LOCAL_HEADER_BYTES = 30
# TensorFlow's CPU kernels assume a tensor's buffer is aligned to 64 bytes
# (EIGEN_MAX_ALIGN_BYTES); NumPy's large arrays start 16 bytes into a page.
_ALIGNMENT = 64


class _Window(io.BytesIO):
    """A read-only file object over `size` bytes of `fd` from `start`.

    h5py reads it through `readinto` (positional reads, nothing buffered).
    It subclasses `BytesIO` only because Keras' `H5IOStore` accepts no
    other file object.
    """

    def __init__(self, fd: int, start: int, size: int):
        super().__init__()
        self._fd, self._start, self._size, self._position = fd, start, size, 0

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        wanted = max(0, min(len(view), self._size - self._position))
        done = 0
        while done < wanted:
            got = os.preadv(self._fd, [view[done:wanted]], self._start + self._position + done)
            if got == 0:
                break
            done += got
        self._position += done
        return done

    def read(self, size: int | None = -1) -> bytes:
        left = max(0, self._size - self._position)
        size = left if size is None or size < 0 else min(size, left)
        data = bytearray(size)
        return bytes(data[: self.readinto(data)])

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def write(self, data) -> int:
        raise io.UnsupportedOperation("read-only window onto an archive entry")


def _entry_start(file, info: zipfile.ZipInfo) -> int | None:
    """Offset in the archive file of a stored entry's first byte."""
    file.seek(info.header_offset)
    header = file.read(_LOCAL_HEADER_BYTES)
    if len(header) != _LOCAL_HEADER_BYTES or header[:4] != b"PK\x03\x04":
        return None
    name_length = int.from_bytes(header[26:28], "little")
    extra_length = int.from_bytes(header[28:30], "little")
    return info.header_offset + _LOCAL_HEADER_BYTES + name_length + extra_length


def _keras_steps():
    """Keras' loading functions, or None when this Keras has other ones."""
    try:
        from keras.src.backend.tensorflow.core import Variable
        from keras.src.saving import saving_lib
    except ImportError:
        return None
    needed = (
        hasattr(saving_lib, "safe_get_h5_dataset")
        and hasattr(saving_lib, "_model_from_config")
        and hasattr(saving_lib, "_load_state")
        and hasattr(saving_lib, "H5IOStore")
        and hasattr(saving_lib, "_raise_loading_failure")
        and hasattr(Variable, "_direct_assign")
        and hasattr(Variable, "_initialize")
        and hasattr(Variable, "_initialize_with_initializer")
    )
    return (saving_lib, Variable) if needed else None


@contextmanager
def _deferred_variables(variable_class) -> Iterator[list]:
    """Variables this thread creates meanwhile from an initializer get no
    value; the list yielded collects them. (A variable created from a value,
    such as the step counter of the optimizer a keras-hub task compiles, is
    created as usual, and so is every variable another thread creates:
    `compat.patched` swaps for this thread only.)"""
    deferred = []

    def defer(self, initializer):
        self._value = None
        self._initializer = initializer
        deferred.append(self)

    with patched(variable_class, "_initialize_with_initializer", defer):
        yield deferred


def _aligned_empty(shape: tuple, dtype):
    """An uninitialised C-ordered array whose data start on `_ALIGNMENT`."""
    import numpy as np

    dtype = np.dtype(dtype)
    size = math.prod(shape) * dtype.itemsize
    raw = np.empty(size + _ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % _ALIGNMENT
    return raw[start : start + size].view(dtype).reshape(shape)


def _aligned_store(saving_lib):
    """Keras' `H5IOStore`, reading plain numeric weights into aligned arrays."""
    import h5py

    class AlignedStore(saving_lib.H5IOStore):
        def __getitem__(self, key):
            dataset = saving_lib.safe_get_h5_dataset(self._h5_entry_group, key)
            plain = isinstance(dataset, h5py.Dataset) and "dtype" not in dataset.attrs
            if not plain or dataset.dtype.kind not in "fiu" or not dataset.size:
                return super().__getitem__(key)  # bfloat16, strings, scalars: Keras' way
            array = _aligned_empty(dataset.shape, dataset.dtype)
            dataset.read_direct(array)
            return array

    return AlignedStore


def _adoptable(value, variable) -> bool:
    """`value` is an aligned C-ordered array of `variable`'s dtype and shape
    that a tensor can be made over without a copy."""
    import numpy as np

    return (
        isinstance(value, np.ndarray)
        and value.dtype.kind in "fiu"
        and str(value.dtype) == variable.dtype
        and tuple(value.shape) == tuple(variable.shape)
        and value.flags.c_contiguous
        and value.ctypes.data % _ALIGNMENT == 0
    )


@contextmanager
def _assign_creates(variable_class, deferred: list) -> Iterator[None]:
    """Meanwhile, assigning in this thread to one of the `deferred` variables
    that has no value yet creates it from the value (over the value's own
    buffer when `_adoptable`); every other assignment is Keras' own."""
    import tensorflow as tf

    original_assign = compat.original(variable_class, "assign")
    original = compat.original(variable_class, "_direct_assign")
    waiting = {id(variable) for variable in deferred}

    def assign(self, value):
        if id(self) in waiting and self._value is None and _adoptable(value, self):
            self._initialize(tf.experimental.dlpack.from_dlpack(value.__dlpack__()))
            self._initializer = None
            return value
        return original_assign(self, value)

    def direct_assign(self, value):
        if id(self) in waiting and self._value is None:
            self._initialize(value)
            self._initializer = None
        else:
            original(self, value)

    with patched(variable_class, "assign", assign):
        with patched(variable_class, "_direct_assign", direct_assign):
            yield


def _initialize_the_rest(deferred: list) -> None:
    """Run the initializers of deferred variables the archive did not fill."""
    for variable in deferred:
        if variable._value is None:
            variable._initialize_with_initializer(variable._initializer)
            variable._initializer = None


def _build_and_fill(saving_lib, variable_class, config: str, safe_mode: bool, window: _Window):
    """The model of `config` with every variable created from the weights
    `window` reads (or, for any the archive lacks, from its initializer)."""
    with _deferred_variables(variable_class) as deferred:
        model = saving_lib._model_from_config(config, None, False, safe_mode)
    store = _aligned_store(saving_lib)(window, mode="r")
    failed, errors = set(), {}
    try:
        with _assign_creates(variable_class, deferred):
            saving_lib._load_state(
                model,
                weights_store=store,
                assets_store=None,
                inner_path="",
                visited_saveables=set(),
                failed_saveables=failed,
                error_msgs=errors,
            )
    finally:
        store.close()
    if failed:
        saving_lib._raise_loading_failure(errors)
    _initialize_the_rest(deferred)
    return model


def load(path: Path, safe_mode: bool = True, config: str | None = None):
    """The model in the `.keras` archive at `path`, or None when
    `keras.saving.load_model` must load it: an archive laid out otherwise, a
    Keras without the steps used here, or a model that cannot be built or
    filled this way (one whose construction computes with its weights, as
    keras-hub's T5 does, or whose layers assign to a variable's value
    directly, as its SigLIP text encoder does: 3 of the 89 keras-hub text
    models). Keras' loader then loads it, or says what is wrong with it.

    Args:
        path: the `.keras` archive.
        safe_mode: Keras' safe mode (refuses Lambda layers' code).
        config: the model's config (JSON) to build instead of the
            archive's own (`loading` changes its dtype policies).

    Returns:
        The model, or None where Keras' own loader must load it.
    """
    import keras

    steps = _keras_steps()
    if steps is None or keras.backend.backend() != "tensorflow":
        return None
    saving_lib, variable_class = steps
    with zipfile.ZipFile(path) as archive, open(path, "rb") as file:
        names = set(archive.namelist())
        if not names <= _PLAIN_ENTRIES or {CONFIG_ENTRY, WEIGHTS_ENTRY} - names:
            return None
        info = archive.getinfo(WEIGHTS_ENTRY)
        start = _entry_start(file, info)
        if info.compress_type != zipfile.ZIP_STORED or start is None:
            return None
        config = archive.read(CONFIG_ENTRY).decode() if config is None else config
        window = _Window(file.fileno(), start, info.file_size)
        try:
            return _build_and_fill(saving_lib, variable_class, config, safe_mode, window)
        except Exception:  # noqa: BLE001 - Keras' own loader runs instead, and reports
            return None
