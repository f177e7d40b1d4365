"""Stage 1, load: read a `.keras` file into a Keras model and describe its I/O."""

import functools
import importlib
import inspect
import json
import os
import re
import shutil
import stat
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import keras_layers
from keras_layers.export import audio, compat, images, lean_loading, prompts
from keras_layers.export import inputs as inputs_module
from keras_layers.export.errors import ModelLoadError, UsageError, argument, fix

# Dtype policies whose variables are float32 but whose compute is half
# precision, and pure half-precision policies: all are exported in float32.
_HALF_POLICIES = ("mixed_float16", "mixed_bfloat16", "float16", "bfloat16")
# Policies whose variables are half precision: `load(stored=True)` keeps them.
_PURE_HALF = ("bfloat16", "float16")
STORED_PRECISION = "StoredPrecision"
_STORED_PRECISION_CLASS = None

# Limits on a `.keras` archive, checked from the sizes its zip central directory
# declares before any entry is inflated. Python's zipfile never inflates an entry
# past its declared size (reading past it fails the CRC check), so these sizes bound
# what we and Keras can be made to read, extract or hold in memory.
#
# config.json: Keras writes about 1 KB a layer (keras-hub's BertBackbone 521 bytes, the
# 3-input functional model of tests/models.py 8 KB, 400 Dense layers 394 KB); the
# largest measured, a StringLookup holding a 250,000-token vocabulary, 3.1 MB. Parsing
# can take 25 times the text (16 MiB of `[],` becomes 400 MB of lists, 64 MiB 1.5 GB),
# so 16 MiB: five times that vocabulary, and a bounded parse.
_MAX_CONFIG_BYTES = 16 << 20
# How deeply config.json's arrays and objects may nest. json.loads, Keras and
# `_float32_config` recurse per level, so a config nested thousands deep raises
# RecursionError there; it is refused from an iterative scan first. Measured: keras-hub
# BertBackbone 4 levels, BertTextClassifier 6, a functional model 10, ten functional
# models each wrapping the next 37 (about 3 per model). 200 leaves room for 60 nested
# models and keeps `_float32_config` (2 frames per level) far from Python's 1000 frames.
_MAX_CONFIG_DEPTH = 200
# The longest layer or tensor name a config may give (names are identifiers;
# Keras and TensorFlow copy them into every op's name).
_MAX_NAME_CHARS = 4096
# Keras stores entries uncompressed, and weights (float noise) barely deflate, so a
# real entry inflates about 1:1 (text assets, re-zipped, about 4:1); deflate reaches
# 1032:1 only on repetitive filler. An entry over 1 MiB that would inflate more than
# 100 times its stored size is a decompression bomb. (Keras' own guard uses the same
# ratio, but only above 256 MiB, after our float32 copy has read the archive.)
_MAX_INFLATION = 100
_INFLATION_FLOOR_BYTES = 1 << 20
# Entries under the floor escape that test, and thousands of small ones could add up to
# gigabytes: the whole archive may inflate to at most 100 times its size plus room for
# the small entries, config.json included.
_INFLATION_SLACK_BYTES = _MAX_CONFIG_BYTES
# Entries are copied and scanned in pieces of this size, never whole.
_CHUNK_BYTES = 1 << 20
# What reading a damaged entry raises: a bad CRC or header, a truncated file, a bad
# deflate stream, an unknown compression method, an encrypted entry (RuntimeError).
_ZIP_ERRORS = (zipfile.BadZipFile, OSError, EOFError, zlib.error, NotImplementedError, RuntimeError)

# model.weights.h5 declares each dataset's shape and dtype in its metadata, apart from
# the bytes it stores, and Keras' loader allocates what a dataset declares (its own
# check starts at 4 GiB). Keras writes every dataset contiguous, uncompressed and
# written in full: it stores what it declares. A dataset can declare gigabytes and
# store nothing (chunked, never written: a fill value only), or a thousandth of them
# (gzip over zeros). The zip rule above applies inside the file: a dataset over 1 MiB
# may declare at most 100 times the bytes it stores (real weights, even re-packed with
# gzip, about 1:1), and all of them together at most 100 times their stored total plus
# 16 MiB (thousands of small ones). What a dataset stores counts at most the file's
# size (a crafted chunk index can claim more). Datasets whose bytes live in another
# file (external storage, virtual datasets, external links) are refused outright.
# 50,000 links bound the walk, to 20 s (0.4 ms each, measured on 2 cores): a
# 1B-parameter keras-hub model has about 600, an 800-layer convolutional net about 5,000.
_MAX_WEIGHT_LINKS = 50_000
# Top-level groups that loading with compile=False never reads: the optimizer's
# slots, which Keras saves for a compiled model (Adam: two per weight).
_UNREAD_GROUPS = ("optimizer",)
# What h5py raises on a file it cannot read.
_H5_ERRORS = (OSError, KeyError, ValueError, RuntimeError, TypeError)

# The first bytes of an HDF5 file, such as Keras 2's legacy `.h5` models.
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
# Packages whose objects Keras finds from the module a config names: never a custom object.
_KERAS_PACKAGES = ("keras", "keras_hub", "keras_cv", "keras_nlp")
# The arguments every layer's config holds (`Layer.get_config`), which Keras passes
# back to `__init__` when it rebuilds the layer.
_LAYER_ARGUMENTS = ("name", "trainable", "dtype", "activity_regularizer", "autocast")

# +1 for a byte that opens a JSON array or object, -1 for one that closes it.
_NESTING_STEPS = np.zeros(256, np.int8)
_NESTING_STEPS[[ord("["), ord("{")]] = 1
_NESTING_STEPS[[ord("]"), ord("}")]] = -1


@dataclass
class TensorInfo:
    """One model input or output: its name, shape (None = dynamic) and dtype,
    and for inputs the role the model gives it (`keras_layers.export.inputs`)."""

    name: str
    shape: tuple
    dtype: str
    role: str = "features"  # one of inputs.ROLES
    # For ids: the vocabulary size of the embedding that reads them.
    vocabulary: int | None = None
    # Whether id 0 is padding that the model masks (an Embedding with mask_zero).
    masks_zero: bool = False
    # The name of axis 1 when it is a sequence (`decoder_sequence` for a decoder's).
    sequence: str = "sequence"
    # Every axis' name, when axis 1 is not the only named one (a cache's).
    axes: tuple | None = None
    # Where the role comes from (`inputs.SOURCES`), and what in the model said so.
    role_source: str = "wiring"
    role_reason: str = ""
    # The sizes fed to axes 2.. (a free feature width read from the model's
    # weights, `inputs.feature_widths`); empty: each declared size, 1 if free.
    widths: tuple = ()
    # An image's layout, `NHWC` or `NCHW` (`images.describe`); `None` otherwise.
    layout: str | None = None
    # The values the model expects, when read from it (images of pixels: (0, 255)).
    value_range: tuple | None = None
    # For an output the file names otherwise: Keras' own name of it.
    key: str | None = None

    @property
    def keras_name(self) -> str:
        return self.key or self.name

    @property
    def is_padding_mask(self) -> bool:
        return self.role == "padding_mask"

    def axis_names(self) -> list:
        """Shape with dynamic axes named: `batch` first, then the sequence (or,
        for positions, their own count)."""
        if self.axes is not None:
            return list(self.axes)
        names = []
        for axis, size in enumerate(self.shape):
            if size is not None:
                names.append(size)
            elif axis == 0:
                names.append("batch")
            elif axis == 1:
                names.append(f"{self.name}_count" if self.role == "positions" else self.sequence)
            else:
                names.append(f"dim_{axis}")
        return names


@dataclass
class LoadedModel:
    """The output of `load`: the model and what the later stages need to know."""

    model: object
    path: Path | None  # None for a model passed in memory
    inputs: list
    outputs: list
    input_structure: str  # "single", "list" or "dict"
    output_structure: str
    source_policies: list = field(default_factory=list)  # half policies replaced
    param_bytes: int = 0
    # The longest sequence the position tables allow, and the layer that says so.
    max_length: int | None = None
    max_length_source: str | None = None
    # (Keras path, bytes) of each unique variable: the report's accounting, which
    # still holds once the model is released.
    variable_sizes: list = field(default_factory=list)
    name: str = "model"
    # The shortest sequence the model accepts (a Conv1D stack's kernels and
    # strides need several tokens), found by running Keras
    # (`validating.shortest_length`); 1 until then.
    min_length: int = 1
    # The sides of the default grid's images (`validating.image_sides`): the
    # smallest the model takes first; empty for a model without images.
    image_sides: tuple = ()
    # The fewest samples a waveform input takes (`validating.fewest_samples`);
    # the grid's lengths are multiples of it. 0 for a model without audio.
    min_samples: int = 0
    # Default lengths Keras itself fails on (`validating.refused_lengths`).
    refused_lengths: tuple = ()
    # The model's call as one TensorFlow graph (`validating.keras_outputs`),
    # made on first use for a big model; it holds the model too.
    graph_call: object = field(default=None, repr=False, compare=False)
    # What reading the model could only assume (a role probe that failed at
    # some size, a feature width read from the weights): report warnings.
    notes: list = field(default_factory=list)

    def release_model(self) -> None:
        """Drop the model, so that its weights can be freed: only for a model
        loaded from a file (one passed in memory is the caller's to keep)."""
        import gc

        if self.path is not None:
            self.model = None
            self.graph_call = None
            gc.collect()


# Imported before any user module, so that a file named like one of them in the
# user's folder (`onnxruntime.py`) can never stand in for it.
_DEPENDENCIES = ("tensorflow", "tf2onnx", "onnx", "onnxruntime", "onnxslim", "keras_hub")


def import_modules(names: list) -> dict:
    """Import user modules that define custom layers (`imports`).

    The working directory is searched for them, and only for them: it joins
    `sys.path` after every dependency is imported and leaves it afterwards.
    A module that raises, or calls `sys.exit`, is a usage error.

    A module that calls `os._exit` while it is imported is a usage error too
    (`_process_exit_refused`): the call would end the process at once, with
    the module's status, exit 0 for `os._exit(0)`, and nothing exported.

    Returns:
        What the modules define that Keras cannot find by itself, by name, for the
        loader (`_unregistered_objects`).
    """
    if not names:
        return {}
    for dependency in _DEPENDENCIES:
        importlib.import_module(dependency)
    found = {}
    for name in names:
        module = _import_one(str(name))
        found.update(_unregistered_objects(module))
    return found


def _import_one(name: str):
    """Import one user module: a dotted name, searched in the working
    directory and then the installed packages, or the path of a `.py` file
    (imported under its stem, its folder searched for its own imports).
    The folder joins `sys.path` for the import only."""
    as_path = name.endswith(".py") or os.sep in name
    folder = Path(name).resolve().parent if as_path else Path(os.getcwd())
    if as_path and not Path(name).is_file():
        raise UsageError(
            f"{argument('imports', name)}: no such file; give a .py file or a module name"
        )
    module_name = Path(name).stem if as_path else name
    if as_path and not module_name.isidentifier():
        raise UsageError(
            f"{argument('imports', name)}: {module_name!r} cannot be a module's name; rename the "
            "file to a Python identifier (letters, digits, underscores)"
        )
    added = str(folder) not in sys.path
    if added:
        sys.path.insert(0, str(folder))
    try:
        with _process_exit_refused():
            return importlib.import_module(module_name)
    except _ProcessExit as error:
        raise UsageError(
            f"{argument('imports', name)}: cannot import it: it calls os._exit({error.status}) "
            "while it is imported, which would end the export at once with nothing exported; "
            "remove the call, or guard it with `if __name__ == '__main__':`"
        ) from error
    except ModuleNotFoundError as error:
        where = f"{folder} (the working directory) and the installed packages"
        missing = f"a module it imports, {error.name!r}," if error.name != module_name else "it"
        raise UsageError(
            f"{argument('imports', name)}: cannot import it: {missing} is not in {where}; run "
            "from the folder that holds it, or give its path "
            f"({argument('imports', 'path/to/module.py')})"
        ) from error
    except (Exception, SystemExit) as error:  # noqa: BLE001 - the user's module
        raise UsageError(
            f"{argument('imports', name)}: cannot import it ({type(error).__name__}: {error})"
        ) from error
    finally:
        if added and str(folder) in sys.path:
            sys.path.remove(str(folder))


class _ProcessExit(BaseException):
    """`os._exit` called by a user module while it is imported. A
    `BaseException`, as `SystemExit` is, so that the module's own `except
    Exception` does not swallow it.

    Attributes:
        status: the exit status it asked for.
    """

    def __init__(self, status):
        super().__init__(status)
        self.status = status


@contextmanager
def _process_exit_refused() -> Iterator[None]:
    """`os._exit` raises `_ProcessExit` in this thread for the block.

    `os._exit` ends the process at once: no `finally`, no `atexit`, no exit
    code of ours, so nothing in the process can notice it afterwards; only a
    call made through the `os` module can be stopped, before it happens.
    Calls from other threads (through `compat.patched`) and from a process
    forked meanwhile (`multiprocessing` ends its children with `os._exit`)
    still exit, as does a call that bypasses `os` (`ctypes`' libc `_exit`).
    """
    parent = os.getpid()

    def refuse(status):
        if os.getpid() != parent:  # a forked child ends as it asks
            compat.original(os, "_exit")(status)
        raise _ProcessExit(status)

    with compat.patched(os, "_exit", refuse):
        yield


def _unregistered_objects(module) -> dict:
    """The layers (models included) and functions that `module` itself defines, and
    that no `register_keras_serializable` names, by the name the archive stores.

    keras.io's examples define custom layers without registering them, and a
    TextVectorization stores its `standardize` function by its bare name: Keras
    finds neither unless it is handed them as custom objects. What the module
    imports is left out, so that an import never stands in for a Keras layer.
    """
    import keras

    found = {}
    for value in vars(module).values():
        if getattr(value, "__module__", None) != module.__name__:
            continue
        layer = isinstance(value, type) and issubclass(value, keras.layers.Layer)
        if not (layer or inspect.isfunction(value)):
            continue
        if keras.saving.get_registered_name(value) == value.__name__:
            found[value.__name__] = value
    return found


def _check_archive(path: Path) -> None:
    """Refuse a MODEL path that is not a sound `.keras` archive of sane size.

    The file's kind is checked before it is opened (a named pipe would block the
    open forever), and the entries' sizes before any is inflated. config.json's
    content is checked where it is read, by `_read_config`.
    """
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: no such file") from None
    except OSError as error:
        raise ModelLoadError(f"{path}: cannot read it ({error.strerror or error})") from error
    if stat.S_ISDIR(mode):
        if (path / "saved_model.pb").is_file():
            raise ModelLoadError(
                f"{path}: is a TensorFlow SavedModel, which Keras 3's load_model cannot read. "
                "Wrap it in a Keras model and save that: layer = keras.layers.TFSMLayer("
                f"{str(path)!r}, call_endpoint='serve') (or 'serving_default'); "
                "inputs = keras.Input(...) as the SavedModel takes them; "
                "keras.Model(inputs, layer(inputs)).save('model.keras'). Export that file with "
                "--unsafe (Keras loads a TFSMLayer only then) and, for token ids, --input "
                "NAME=ids (the SavedModel hides its embedding from the role probe)"
            )
        raise ModelLoadError(
            f"{path}: is a directory, not a .keras file; give the model's .keras file "
            "(model.save('model.keras'))"
        )
    if not stat.S_ISREG(mode):
        kind = (
            "a named pipe"
            if stat.S_ISFIFO(mode)
            else "a socket"
            if stat.S_ISSOCK(mode)
            else "a device"
        )
        raise ModelLoadError(
            f"{path}: is {kind}, not a regular file; save the model to a file with "
            "model.save('model.keras') and pass that file"
        )
    try:
        with open(path, "rb") as file:
            signature = file.read(len(_HDF5_SIGNATURE))
    except OSError as error:
        raise ModelLoadError(f"{path}: cannot read it ({error.strerror or error})") from error
    if signature == _HDF5_SIGNATURE:
        raise ModelLoadError(
            f"{path}: an HDF5 file (Keras 2's legacy .h5 format?), not a .keras archive; "
            "load it with keras.saving.load_model and re-save it with "
            "model.save('model.keras')"
        )
    if not zipfile.is_zipfile(path):
        raise ModelLoadError(
            f"{path}: not a .keras archive (expected a zip with config.json; "
            "re-save the model with model.save('model.keras'))"
        )
    try:
        with zipfile.ZipFile(path) as archive:
            _check_entries(path, archive)
            # The CRC pass is kept: once the sizes are known to be sane it costs one
            # read of the archive in 1 MiB pieces, small beside the conversion. Keras
            # alone would not catch every corrupt entry: when reading model.weights.h5
            # fails it falls back to h5py reading the entry through seeks, and from
            # Python 3.12 on zipfile stops checking an entry's CRC once it is seeked.
            broken = archive.testzip()
            if broken is None:
                _weights_held(path, archive)  # size bombs and links, before Keras reads
    except _ZIP_ERRORS as error:
        raise ModelLoadError(f"{path}: corrupt .keras archive ({error})") from error
    if broken is not None:
        raise ModelLoadError(f"{path}: corrupt .keras archive (bad entry {broken})")


def _size(count: int) -> str:
    for unit in ("bytes", "KiB", "MiB"):
        if count < 1024:
            return f"{count:.0f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


def _check_entries(path: Path, archive: zipfile.ZipFile) -> None:
    """Refuse an archive without config.json, or a decompression bomb, from the
    zip's central directory alone: nothing is inflated."""
    fix_it = "re-save the model with model.save('model.keras')"
    try:
        config = archive.getinfo("config.json")  # the entry `open` would read
    except KeyError:
        raise ModelLoadError(
            f"{path}: not a .keras archive (no config.json inside the zip)"
        ) from None
    if config.file_size > _MAX_CONFIG_BYTES:
        raise ModelLoadError(
            f"{path}: config.json would inflate to {_size(config.file_size)}, more than "
            f"the {_size(_MAX_CONFIG_BYTES)} a model config may take; {fix_it}"
        )
    entries = archive.infolist()
    for entry in entries:
        if (
            entry.file_size > _INFLATION_FLOOR_BYTES
            and entry.file_size > _MAX_INFLATION * entry.compress_size
        ):
            raise ModelLoadError(
                f"{path}: the entry {entry.filename} would inflate from "
                f"{_size(entry.compress_size)} to {_size(entry.file_size)}, more than "
                f"{_MAX_INFLATION} times, like a decompression bomb; {fix_it}"
            )
    total = sum(entry.file_size for entry in entries)
    limit = _MAX_INFLATION * path.stat().st_size + _INFLATION_SLACK_BYTES
    if total > limit:
        raise ModelLoadError(
            f"{path}: its {len(entries)} entries would inflate to {_size(total)}, more "
            f"than the {_size(limit)} a model archive of its size can hold, like a "
            f"decompression bomb; {fix_it}"
        )


@contextmanager
def _weights_file(archive: zipfile.ZipFile, file) -> Iterator:
    """(model.weights.h5 opened with h5py, its size), or (None, 0) where the
    archive has none. A stored entry is read in place, through lean_loading's
    window onto the archive's `file`; a compressed one is inflated to a temporary
    file first (`_check_entries` bounds its size). Only metadata is read."""
    import h5py

    try:
        info = archive.getinfo(lean_loading.WEIGHTS_ENTRY)
    except KeyError:
        yield None, 0
        return
    start = (
        lean_loading._entry_start(file, info) if info.compress_type == zipfile.ZIP_STORED else None
    )
    if start is not None:
        source = lean_loading._Window(file.fileno(), start, info.file_size)
    else:
        source = tempfile.TemporaryFile()
        with archive.open(info) as entry:
            shutil.copyfileobj(entry, source, _CHUNK_BYTES)
    try:
        with h5py.File(source, "r") as weights:
            yield weights, info.file_size
    finally:
        source.close()


def _weight_datasets(path: Path, weights) -> Iterator[tuple]:
    """(path in the file, dataset) for each link to a dataset, found without
    recursion; a group linked twice is entered once. Soft links are not
    followed (Keras refuses them where it reads); a link to another file, or
    more than `_MAX_WEIGHT_LINKS` links, is refused."""
    import h5py

    stack, entered, links = [("", weights)], {h5py.h5o.get_info(weights.id).addr}, 0
    while stack:
        prefix, group = stack.pop()
        for name in group:
            links += 1
            if links > _MAX_WEIGHT_LINKS:
                raise ModelLoadError(
                    f"{path}: its weights file holds more than {_MAX_WEIGHT_LINKS} objects, "
                    "far more than a model's; re-save the model with model.save('model.keras')"
                )
            where = f"{prefix}{name}"
            link = group.get(name, getlink=True)
            if isinstance(link, h5py.ExternalLink):
                raise ModelLoadError(
                    f"{path}: its weights file links {where} to another file "
                    f"({link.filename}), which a saved model never does; re-save the model "
                    "with model.save('model.keras')"
                )
            if isinstance(link, h5py.SoftLink):
                continue
            item = group[name]  # (`get` would hide one that cannot be opened)
            if isinstance(item, h5py.Dataset):
                yield where, item
            elif isinstance(item, h5py.Group):
                address = h5py.h5o.get_info(item.id).addr
                if address not in entered:
                    entered.add(address)
                    stack.append((f"{where}/", item))


def _dataset_bytes(path: Path, where: str, dataset, file_size: int, keep=False) -> tuple:
    """(bytes declared, bytes stored, bytes once loaded) of one dataset, refused
    where its bytes live in another file or it stores far less than it declares
    (the rule: the comment above `_MAX_WEIGHT_LINKS`)."""
    fix_it = "re-save the model with model.save('model.keras')"
    if dataset.is_virtual or dataset.external:
        raise ModelLoadError(
            f"{path}: its weights file maps the dataset {where} onto other files "
            f"({'a virtual' if dataset.is_virtual else 'an external'} dataset), which a saved "
            f"model never does; {fix_it}"
        )
    shape = dataset.shape or ()
    elements = 1
    for size in shape:
        elements *= int(size)
    itemsize = dataset.id.get_type().get_size()
    declared = elements * itemsize
    stored = min(dataset.id.get_storage_size(), file_size)
    if declared > _INFLATION_FLOOR_BYTES and declared > _MAX_INFLATION * stored:
        how = (
            f"{dataset.compression}-compressed"
            if dataset.compression
            else "chunked"
            if dataset.chunks
            else "contiguous"
        )
        raise ModelLoadError(
            f"{path}: the weights file's dataset {where} declares {_size(declared)} (shape "
            f"{tuple(shape)} of {itemsize}-byte items) and stores {_size(stored)} ({how}): "
            f"more than {_MAX_INFLATION} times less, like a size bomb; {fix_it}"
        )
    # Loaded, a weight takes at least float32's 4 bytes (half precision is widened),
    # or with `load(stored=True)` its own.
    return declared, stored, elements * (itemsize if keep else max(itemsize, 4))


def _weights_held(path: Path, archive: zipfile.ZipFile, stored: bool = False) -> int:
    """The bytes the model's variables take once loaded, as the weights file's
    datasets declare them (the optimizer's left out: compile=False never reads
    them), each dataset checked (`_dataset_bytes`), and all of them together
    against what they store. A `.npz` weights entry counts its inflated size."""
    import h5py

    if lean_loading.WEIGHTS_ENTRY not in archive.namelist():
        return sum(i.file_size for i in archive.infolist() if i.filename.endswith(".npz"))
    held = declared_total = stored_total = 0
    seen = set()
    try:
        with open(path, "rb") as file, _weights_file(archive, file) as (weights, file_size):
            for where, dataset in _weight_datasets(path, weights):
                declared, kept, loaded = _dataset_bytes(path, where, dataset, file_size, stored)
                if where.split("/")[0] not in _UNREAD_GROUPS:
                    held += loaded
                address = h5py.h5o.get_info(dataset.id).addr
                if address not in seen:
                    seen.add(address)
                    declared_total += declared
                    stored_total += kept
    except _H5_ERRORS as error:
        raise ModelLoadError(
            f"{path}: cannot read its weights file {lean_loading.WEIGHTS_ENTRY} "
            f"({type(error).__name__}: {_cut(str(error), 200)}); re-save the model with "
            "model.save('model.keras')"
        ) from error
    limit = _MAX_INFLATION * min(stored_total, file_size) + _INFLATION_SLACK_BYTES
    if declared_total > limit:
        raise ModelLoadError(
            f"{path}: the weights file's {len(seen)} datasets declare {_size(declared_total)} "
            f"and store {_size(stored_total)}: more than {_MAX_INFLATION} times less, like "
            "a size bomb; re-save the model with model.save('model.keras')"
        )
    return held


def _config_variable_bytes(config: dict, stored: bool = False) -> int | None:
    """The bytes of the variables a model config declares, from the model built
    with its variables deferred: no initializer runs, nothing sizeable is
    allocated (`lean_loading`). None where it cannot be built so: a custom layer
    whose module is not imported yet, a Lambda layer, a layer whose construction
    computes with its weights, another Keras or backend."""
    import keras

    steps = lean_loading._keras_steps()
    if steps is None or keras.backend.backend() != "tensorflow":
        return None
    saving_lib, variable_class = steps
    keras_layers.ScaledEmbedding  # noqa: B018 - naming one registers the layers with Keras
    try:
        with lean_loading._deferred_variables(variable_class) as deferred:
            saving_lib._model_from_config(json.dumps(config), None, False, True)
    except Exception:  # noqa: BLE001 - the loader will build it, or say why not
        return None
    total = 0
    for variable in deferred:
        try:
            itemsize = max(4, np.dtype(variable.dtype).itemsize)
        except TypeError:
            itemsize = 4
        if stored and str(variable.dtype) in _PURE_HALF:
            itemsize = 2
        total += itemsize * int(np.prod(variable.shape, dtype=np.int64))
    return total


def declared_weight_bytes(path: Path, stored: bool = False) -> int | None:
    """The bytes a `.keras` archive's model will hold once loaded, from what the
    archive declares, read before anything is loaded: the larger of the sizes
    its weights file's datasets declare and those of the variables its config
    declares. Never the bytes the zip stores: a weights file can declare far
    more than it stores, and a config more than the weights file holds.

    Args:
        path: the `.keras` archive.
        stored: count half-precision weights at their own 2 bytes, as
            `load(stored=True)` holds them, not widened to float32.

    Returns:
        The bytes, or None where the file is no readable zip (loading says why).

    Raises:
        ModelLoadError: a decompression bomb (`_check_entries`), a size bomb or
            a link to another file in the weights file (`_weights_held`), an
            unreadable weights file, or a config `_read_config` refuses.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            _check_entries(path, archive)
            held = _weights_held(path, archive, stored)
            config = _read_config(path, archive)
    except _ZIP_ERRORS:
        return None
    return max(held, _config_variable_bytes(config, stored) or 0)


def _nesting_depth(text: bytes) -> int:
    """How deeply the arrays and objects of a JSON text nest.

    Found without recursion, in 1 MiB pieces. Brackets inside strings do not count:
    escaped backslashes and quotes are dropped first, so every quote left opens or
    closes a string, and a byte is inside one when an odd number of quotes precede it.
    """
    codes = np.frombuffer(text.replace(b"\\\\", b"").replace(b'\\"', b""), np.uint8)
    deepest = depth = 0
    quotes = 0  # parity of the quotes before the piece
    for start in range(0, len(codes), _CHUNK_BYTES):
        piece = codes[start : start + _CHUNK_BYTES]
        # uint8 counts wrap at 256, which keeps their parity.
        parity = np.cumsum(piece == ord('"'), dtype=np.uint8) + quotes
        steps = np.where(parity % 2 == 0, _NESTING_STEPS[piece], 0)
        levels = depth + np.cumsum(steps, dtype=np.int64)
        deepest = max(deepest, int(levels.max()))
        depth, quotes = int(levels[-1]), int(parity[-1]) % 2
    return deepest


def _read_config(path: Path, archive: zipfile.ZipFile) -> dict:
    """config.json of an archive `_check_entries` passed, read with a bounded read,
    its nesting checked before it is parsed."""
    fix_it = "re-save the model with model.save('model.keras')"
    try:
        with archive.open("config.json") as entry:
            text = entry.read(_MAX_CONFIG_BYTES + 1)
    except _ZIP_ERRORS as error:
        raise ModelLoadError(f"{path}: corrupt .keras archive ({error})") from error
    if len(text) > _MAX_CONFIG_BYTES:
        raise ModelLoadError(
            f"{path}: config.json is larger than the {_size(_MAX_CONFIG_BYTES)} a model "
            f"config may take; {fix_it}"
        )
    depth = _nesting_depth(text)
    if depth > _MAX_CONFIG_DEPTH:
        raise ModelLoadError(
            f"{path}: config.json nests {depth} levels deep, more than the "
            f"{_MAX_CONFIG_DEPTH} a model config can need; {fix_it}"
        )
    try:
        config = json.loads(text)
    except ValueError as error:  # JSONDecodeError, or bytes that are not text
        raise ModelLoadError(
            f"{path}: config.json is not valid JSON ({error}); {fix_it}"
        ) from error
    if not isinstance(config, dict):
        raise ModelLoadError(
            f"{path}: config.json holds a JSON {type(config).__name__}, not a model "
            f"config; {fix_it}"
        )
    long_name = next((name for name in _names(config) if len(name) > _MAX_NAME_CHARS), None)
    if long_name is not None:
        raise ModelLoadError(
            f"{path}: config.json names a layer or tensor with {len(long_name):,} characters "
            f"({long_name[:40]!r}...), more than the {_MAX_NAME_CHARS:,} a name can need (Keras "
            f"and TensorFlow copy names into every op: a 15 MiB name took 3 GB); {fix_it}"
        )
    return config


def _names(config) -> Iterator[str]:
    """Every `name` string of a config, at any depth (the nesting is bounded
    by `_MAX_CONFIG_DEPTH`)."""
    stack = [config]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            name = node.get("name")
            if isinstance(name, str):
                yield name
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _stored_policy(name: str) -> dict:
    """The config of a `StoredPrecision` policy keeping `name`'s variables."""
    return {
        "module": None,
        "class_name": STORED_PRECISION,
        "config": {"name": name},
        "registered_name": STORED_PRECISION,
    }


def _float32_config(config, stored: bool = False):
    """Replace half-precision dtype policies in a model config with float32
    compute: `float32` itself, or with `stored`, a pure half policy
    (`bfloat16`, `float16`) by `StoredPrecision`, which keeps its variables.

    Returns the new config and the sorted list of policies replaced. This recurses
    per level of `config`: it only ever gets one from `_read_config`, whose depth
    limit keeps it far from Python's recursion limit.
    """
    replaced = set()

    def swap(name):
        replaced.add(name)
        return _stored_policy(name) if stored and name in _PURE_HALF else "float32"

    def visit(node):
        if isinstance(node, dict):
            policy = node.get("config")
            if node.get("class_name") == "DTypePolicy" and isinstance(policy, dict):
                # (A policy whose config is not a dict is Keras' to refuse.)
                name = policy.get("name")
                if name in _HALF_POLICIES:
                    new = swap(name)
                    node = new if isinstance(new, dict) else {**node, "config": {"name": new}}
                return node
            return {
                key: (
                    (swap(value) if value in _HALF_POLICIES else value)
                    if key == "dtype" and isinstance(value, str)
                    else visit(value)
                )
                for key, value in node.items()
            }
        if isinstance(node, list):
            return [visit(item) for item in node]
        return node

    return visit(config), sorted(replaced)


def stored_precision_policy():
    """`StoredPrecision`: a Keras dtype policy whose variables keep a half
    precision dtype (`bfloat16`, `float16`, the policy's name) while the layer
    computes in float32, each variable cast as it is read (Keras' autocast,
    as in mixed precision, the other way round). A model loaded with it holds
    its weights in their stored bytes and computes as the same model widened
    to float32 (the widening is exact).

    Returns:
        The policy class (made once, when Keras is first needed).
    """
    from keras import DTypePolicy

    global _STORED_PRECISION_CLASS
    if _STORED_PRECISION_CLASS is None:

        class StoredPrecision(DTypePolicy):
            def _parse_name(self, name):
                if name not in _PURE_HALF:
                    raise ValueError(f"StoredPrecision keeps {_PURE_HALF}, not {name!r}")
                return "float32", name

        _STORED_PRECISION_CLASS = StoredPrecision
    return _STORED_PRECISION_CLASS


def _float32_config_of(path: Path, stored: bool = False) -> tuple[dict | None, list, dict]:
    """The archive's config made to compute in float32 (`_float32_config`), or
    None when it needs no change, the policies replaced, and the config as saved.

    The sizes are checked again here, where the archive is read, so that no
    archive reaches this read unchecked (the in-memory path comes straight here).
    """
    with zipfile.ZipFile(path) as archive:
        _check_entries(path, archive)
        config = _read_config(path, archive)
    new_config, replaced = _float32_config(config, stored)
    return (new_config if replaced else None), replaced, config


def _archive_copy(path: Path, new_config: dict, workdir: Path) -> Path:
    """A copy of the archive with `new_config` as its config.json, for Keras'
    own loader (`lean_loading` takes the new config without a copy)."""
    copy = workdir / path.name
    with zipfile.ZipFile(path) as archive, zipfile.ZipFile(copy, "w") as out:
        for item in archive.infolist():
            entry = zipfile.ZipInfo(item.filename, item.date_time)
            entry.compress_type = item.compress_type
            entry.external_attr = item.external_attr
            if item.filename == "config.json":
                out.writestr(entry, json.dumps(new_config).encode())
                continue
            # Piece by piece: the weights can take gigabytes. The declared size
            # lets zipfile choose zip64 for an entry over 4 GiB.
            entry.file_size = item.file_size
            with archive.open(item) as source, out.open(entry, "w") as target:
                shutil.copyfileobj(source, target, _CHUNK_BYTES)
    return copy


def _objects(config: dict) -> Iterator[dict]:
    """Every object a model config describes (a dict with a `class_name`), in the
    order the config lists them, found without recursion."""
    stack = [config]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "class_name" in node:
                yield node
            stack.extend(reversed(node.values()))
        elif isinstance(node, list):
            stack.extend(reversed(node))


def _custom_references(config: dict) -> dict:
    """The names under which the config refers to objects outside Keras' packages,
    each with the module that defined it (None for a function: Keras stores its
    bare name, under `builtins`)."""
    names = {}
    for node in _objects(config):
        if "module" not in node:  # a reference to a tensor, not an object to find
            continue
        module = node["module"]
        if isinstance(module, str) and module.split(".")[0] in _KERAS_PACKAGES:
            continue
        if node["class_name"] == "function":
            if isinstance(node.get("config"), str):
                names[node["config"]] = None
            continue
        for name in (node["class_name"], node.get("registered_name")):
            if isinstance(name, str):
                # Keras stores no module for a class of the script that saved it.
                names[name] = module or "__main__"
    return names


def _takes_strings(config: dict) -> str | None:
    """What in the config takes strings (an input, or a TextVectorization layer),
    or None."""
    layers = []
    for node in _objects(config):
        inner = node.get("config")
        if not isinstance(inner, dict):
            continue
        if node["class_name"] == "InputLayer" and inner.get("dtype") == "string":
            return f"the input {inner.get('name')!r}"
        if node["class_name"] == "TextVectorization":
            layers.append(f"the TextVectorization layer {inner.get('name')!r}")
    return layers[0] if layers else None


def _strings_refused(where: str, what: str) -> str:
    # tf2onnx has no ONNX op for TensorFlow's string lookup tables, so the
    # conversion would fail late, on `LookupTableFindV2`.
    return (
        f"{where}: {what} takes strings, and string inputs cannot be exported; export "
        "the model after its text preprocessing, taking token ids in"
    )


def _first_and_cause(error: Exception) -> str:
    """The first line of an error, and the line at the bottom of it that says what
    went wrong (Keras chains the errors of nested objects into one text)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    # `_raise_loading_failure` ends with the list of every object that failed.
    for index, line in enumerate(lines):
        if line.startswith("List of objects that could not be loaded"):
            lines = lines[:index]
            break
    causes = [line for line in lines[1:] if not line.startswith("config=")]
    first = _cut(lines[0], 200)
    if not causes:
        return first
    return f"{first} ... {_cut(causes[-1].removeprefix('Exception encountered: '), 300)}"


def _cut(line: str, limit: int) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _unknown(name: str, references: dict) -> str:
    """What to do about an object the loader cannot find, from the module that
    defined it when the config says which."""
    module = references.get(name)
    if module == "__main__":
        return (
            f"unknown layer or function '{name}', defined in the script that saved the "
            f"model. Put it in a module and import that with {fix('imports')}."
        )
    if module:
        return (
            f"unknown layer or function '{name}', defined in the module {module}. "
            f"Import that module with {fix('imports').replace('MODULE', module)}."
        )
    return (
        f"unknown layer or function '{name}'. Import the module that defines it "
        f"with {fix('imports')}."
    )


def _explain_load_error(path: Path, error: Exception, config: dict) -> str:
    """One line on why Keras could not load the archive, with the fix."""
    text = str(error)
    match = re.search(r"[Cc]ould not locate (?:class|function) '([^']+)'", text)
    if match:
        return f"{path}: {_unknown(match.group(1), _custom_references(config))}"
    if "safe_mode" in text and "Lambda" in text:
        return (
            f"{path}: the model holds a Lambda layer (Python code stored in the "
            "file), which Keras' safe mode refuses to load because it can run "
            f"arbitrary code. If you trust the file, pass {fix('unsafe')}."
        )
    match = re.search(r"([\w.]+)\.__init__\(\) got an unexpected keyword argument '(\w+)'", text)
    if match and match.group(2) in _LAYER_ARGUMENTS:
        name, argument_name = match.groups()
        return (
            f"{path}: the layer {name} cannot be rebuilt from its config: its __init__ "
            f"does not take '{argument_name}', which Keras passes every layer "
            f"({', '.join(_LAYER_ARGUMENTS[:3])}). Add **kwargs to {name}.__init__ and "
            f"pass them on with super().__init__(**kwargs), or give {name} a "
            "from_config classmethod."
        )
    return f"{path}: cannot load the model ({type(error).__name__}: {_first_and_cause(error)})"


def flatten(structure, names=None) -> list:
    """A single tensor, a list or a dict of tensors as a flat list.

    A dict's or a list's values may themselves be lists or dicts (keras-hub's
    D-FINE returns a tuple of hidden states under one key): they are taken
    apart in order, and named as `named_leaves` names them.

    Args:
        structure: a tensor, a list or tuple, or a dict of them, at any depth.
        names: for a dict, the order of its leaves by `named_leaves`' names
            (default: insertion order).

    Returns:
        The tensors, in order.
    """
    if isinstance(structure, dict) and names:
        leaves = dict(named_leaves(structure, []))
        return [leaves[name] for name in names]
    return [leaf for _, leaf in named_leaves(structure, None)]


def named_leaves(structure, top_names) -> list:
    """(name, tensor) for each leaf of a single, list or dict structure.

    A dict's leaves are named by their keys, a top-level list's or a single
    tensor's by `top_names` (None: by position); a list or dict nested under
    a name gives `name_0`, `name_1`, ... or `name_key`.

    Args:
        structure: a tensor, a list or tuple, or a dict of them, at any depth.
        top_names: the names of a top-level list's items or a single tensor.

    Returns:
        The pairs, in order.
    """

    def under(name, value) -> list:
        if isinstance(value, dict):
            return [pair for key, item in value.items() for pair in under(f"{name}_{key}", item)]
        if isinstance(value, list | tuple):
            return [pair for i, item in enumerate(value) for pair in under(f"{name}_{i}", item)]
        return [(name, value)]

    if isinstance(structure, dict):
        return [pair for key, value in structure.items() for pair in under(key, value)]
    items = list(structure) if isinstance(structure, list | tuple) else [structure]
    names = list(top_names) if top_names is not None else [str(i) for i in range(len(items))]
    return [pair for name, item in zip(names, items, strict=True) for pair in under(name, item)]


def _structure(value) -> str:
    if isinstance(value, dict):
        return "dict"
    if isinstance(value, list | tuple):
        return "list"
    return "single"


def _flat_named(structure, names_fallback):
    """(name, tensor) pairs of a single, list or dict structure of tensors."""
    return named_leaves(structure, names_fallback)


def _symbolic_io(model):
    """The model's input and output structures of symbolic tensors.

    Functional models have them; a Sequential model built from a
    `keras.Input` keeps them in the functional model it wraps (with the
    input's own name); a subclassed model has only the input shapes it was
    built with (one, a list when it was called on a list, a dict when on a
    dict), so it is called
    once on symbolic inputs (int32 for a two-axis input of a model with an
    embedding, float32 otherwise).
    """

    try:
        return model.input, model.output
    except (AttributeError, ValueError):
        pass
    functional = getattr(model, "_functional", None)
    if functional is not None:
        return functional.input, functional.output
    inputs = getattr(model, "_inputs", None) or []
    if inputs:
        return inputs[0] if len(inputs) == 1 else inputs, (
            model.outputs[0] if len(model.outputs) == 1 else model.outputs
        )
    shape = (model.get_build_config() or {}).get("input_shape")
    if shape is None:
        raise ModelLoadError(
            "the model's inputs are unknown (a subclassed model saved before it was "
            "called?). Call it on a batch of data once, then save it again."
        )
    embeds = any(hasattr(layer, "input_dim") for layer in model._flatten_layers())
    if isinstance(shape, dict):  # called on a dict: one input a key, named by it
        symbolic = {key: _symbolic_input(item, embeds, str(key)) for key, item in shape.items()}
        return symbolic, model(symbolic)
    several = bool(shape) and all(isinstance(item, list | tuple) for item in shape)
    shapes = list(shape) if several else [shape]
    symbolic = [
        _symbolic_input(item, embeds, "inputs" if not several else f"inputs_{index}")
        for index, item in enumerate(shapes)
    ]
    symbolic = symbolic if several else symbolic[0]
    return symbolic, model(symbolic)


def _symbolic_input(shape, embeds: bool, name: str):
    """A `keras.Input` for a build shape. The build shape is whatever batch
    the model first saw, e.g. (1, 3): the batch axis is always dynamic, and so
    is the sequence axis of token ids."""
    import keras

    shape = [None, *shape[1:]]
    ids = embeds and len(shape) == 2
    if ids:
        shape[1] = None
    return keras.Input(batch_shape=tuple(shape), dtype="int32" if ids else "float32", name=name)


# The probe's waveform length: long enough for the strided convolutions of
# speech models (Moonshine takes 384 samples at least).
_PROBE_SAMPLES = 4096
# The probe's points and boxes a row.
_PROBE_PROMPTS = 4


def _probe_size(info) -> tuple:
    """Every size after the batch that the role probe feeds an image (a side
    of 32), a waveform (`_PROBE_SAMPLES`) or prompts (`_PROBE_PROMPTS`)."""
    if prompts.is_prompt(info):
        return prompts.sizes(info, _PROBE_PROMPTS)
    if audio.is_audio(info):
        return (_PROBE_SAMPLES, *info.shape[2:])
    return tuple(images.dims(info, 1, 32)[1:])


def _file_outputs(flat_outputs: list, inputs: list, notes: list) -> list:
    """The outputs' `TensorInfo`s, each named as Keras names it, but for an
    output named as an input: `NAME_output` in the file (ONNX names each
    value once; tf2onnx dropped the input), Keras' name kept as its `key`,
    and a note for the report."""
    outputs, taken = [], {info.name for info in inputs}
    for name, t in flat_outputs:
        renamed = name
        if name in taken:  # SAM's segmenter: a `masks` prompt in, `masks` out
            renamed = next(
                f"{name}_output{n or ''}"
                for n in range(len(taken) + 1)
                if f"{name}_output{n or ''}" not in taken
            )
            notes.append(
                f"output {name!r} is named {renamed!r} in the file: an input has its name, "
                "and ONNX names each value once"
            )
        taken.add(renamed)
        key = name if renamed != name else None
        outputs.append(TensorInfo(renamed, tuple(t.shape), str(t.dtype), key=key))
    return outputs


def _probe_prompts(info, batch: int) -> np.ndarray:
    """A prompt input for the role probe: `_PROBE_PROMPTS` a row, drawn."""
    rng = np.random.default_rng(0)
    return prompts.draw(info, batch, prompts.sizes(info, _PROBE_PROMPTS)[0], rng)


def _media_inputs(model, specs: list, named: list) -> tuple:
    """The inputs whose role their name and shape tell (prompts, images,
    audio): their roles, the sizes the role probes feed them (images at one
    square side, waveforms at one length: the grid finds the sizes the model
    takes later) and, for prompts, how the probes draw them (as the grid
    does: SAM 3's boxes name an image of the batch)."""
    pictures = {
        name: found
        for (name, shape, dtype), (_, tensor) in zip(specs, named, strict=True)
        if (found := prompts.describe(model, name, shape, dtype))
        or (found := images.describe(model, name, shape, dtype, tensor))
        or (found := audio.describe(model, name, shape, dtype, tensor))
    }
    described = {
        name: TensorInfo(name, shape, dtype, **pictures[name])
        for name, shape, dtype in specs
        if name in pictures
    }
    probe_sides = {name: _probe_size(info) for name, info in described.items()}
    drawn = {
        name: functools.partial(_probe_prompts, info)
        for name, info in described.items()
        if prompts.is_prompt(info)
    }
    return pictures, probe_sides, drawn


def _describe(model, sizes=()):
    """The model's inputs (with their roles), outputs, structures, position
    tables and notes; `sizes` are the caller's `(batch, length)` grid points,
    where the role probe retries when the model fails at its own size."""
    try:
        input_struct, output_struct = _symbolic_io(model)
    except (TypeError, ValueError) as error:
        raise ModelLoadError(f"cannot read the model's inputs and outputs ({error})") from error
    flat_inputs = flatten(input_struct)
    # The top level's outputs (a dict's or a list's items may nest others).
    top_outputs = output_struct if isinstance(output_struct, list | tuple) else [output_struct]
    input_names = [t.name for t in flat_inputs]
    output_names = list(
        getattr(model, "output_names", None)
        or getattr(getattr(model, "_functional", None), "output_names", None)
        or []
    )
    if len(output_names) != len(top_outputs):
        output_names = [f"output_{i}" for i in range(len(top_outputs))]
    flat_outputs = _flat_named(output_struct, output_names)
    named = _flat_named(input_struct, input_names)
    structure = _structure(input_struct)
    specs = [(name, tuple(tensor.shape), str(tensor.dtype)) for name, tensor in named]
    pictures, probe_sides, drawn = _media_inputs(model, specs, named)
    widths = {}
    if all(dtype != "string" for _, _, dtype in specs):
        widths = inputs_module.feature_widths(
            model,
            [(*spec, tensor) for spec, (_, tensor) in zip(specs, named, strict=True)],
            structure,
            sizes,
            given=probe_sides,
            drawn=drawn,
        )
    probed = None
    if len(pictures) < len(specs):  # images alone need no probe: their role is read
        probed = inputs_module.probe(
            model,
            specs,
            structure,
            inputs_module.max_sequence_length(model)[0],
            sizes,
            {**{name: found for name, (found, _) in widths.items()}, **probe_sides},
            drawn,
        )
    notes = [f"input {name!r}: {source}" for name, (_, source) in widths.items()]
    notes += [probed.warning] if probed is not None and probed.warning else []
    inputs = []
    for name, tensor in named:
        dtype = str(tensor.dtype)
        readers = inputs_module.consumers(model, tensor)
        seen = probed.inputs[name] if probed and probed.inputs is not None else None
        role = dict(pictures.get(name) or inputs_module.role_of(name, dtype, readers, seen))
        fed = role.pop("widths", None) or widths.get(name, ((),))[0]
        inputs.append(
            TensorInfo(name=name, shape=tuple(tensor.shape), dtype=dtype, widths=fed, **role)
        )
    inputs = audio.with_masks(inputs)
    if structure != "dict":  # the names are the file's own: say what each input is
        inputs = inputs_module.named_by_role(inputs)
    outputs = _file_outputs(flat_outputs, inputs, notes)
    tables = probed.position_tables if probed is not None else []
    return inputs, outputs, structure, _structure(output_struct), tables, notes


def unique_variables(model) -> list:
    """Each variable once, however many layers read it (a tied matrix)."""
    seen, variables = set(), []
    for variable in model.weights:
        if id(variable) not in seen:
            seen.add(id(variable))
            variables.append(variable)
    return variables


def variable_bytes(variable, stored: bool = True) -> int:
    """A variable's size as exported.

    Args:
        variable: a Keras variable.
        stored: count a half-precision variable at its own 2 bytes (as
            `load(stored=True)` keeps it), not widened to float32.

    Returns:
        Its bytes.
    """
    size = 2 if stored and str(variable.dtype) in _PURE_HALF else 4
    return size * int(np.prod(variable.shape, dtype=np.int64))


def param_bytes(model, stored: bool = True) -> int:
    """The model's weights as exported, each shared variable counted once.

    Args:
        model: a Keras model.
        stored: as `variable_bytes` takes it.

    Returns:
        The bytes.
    """
    return sum(variable_bytes(variable, stored) for variable in unique_variables(model))


def _half_policies(model) -> list:
    names = {getattr(layer.dtype_policy, "name", None) for layer in model._flatten_layers()}
    return sorted(names & set(_HALF_POLICIES))


def _load_archive(path: Path, unsafe: bool, custom_objects: dict, stored: bool = False):
    """The archive's model, computing in float32 (`_float32_config`; with
    `stored`, half-precision variables kept), loaded with one copy of its
    weights in memory (`lean_loading`), or by Keras' `load_model` from a copy
    of the archive with the new config when that cannot read it.

    Of `custom_objects` (`import_modules`), only those the config names as objects
    outside Keras are handed to the loader: Keras looks some of its own names up
    among them first (a functional model's config names its class `Functional`
    as if registered), so a user's class of that name would replace Keras' own.
    """
    import keras

    new_config, replaced, config = _float32_config_of(path, stored)
    takes_strings = _takes_strings(config)
    if takes_strings:
        # Refused before Keras builds the model: it would trip first over the
        # `standardize` function of a TextVectorization, unknown in this process.
        raise ModelLoadError(_strings_refused(str(path), takes_strings))
    wanted = _custom_references(config)
    known = {name: obj for name, obj in custom_objects.items() if name in wanted}
    known[STORED_PRECISION] = stored_precision_policy()
    text = None if new_config is None else json.dumps(new_config)
    try:
        with keras.saving.custom_object_scope(known), tempfile.TemporaryDirectory() as workdir:
            model = lean_loading.load(path, safe_mode=not unsafe, config=text)
            if model is None:
                source = path if text is None else _archive_copy(path, new_config, Path(workdir))
                model = keras.saving.load_model(source, compile=False, safe_mode=not unsafe)
    except Exception as error:  # noqa: BLE001 - translated for the user
        raise ModelLoadError(_explain_load_error(path, error, config)) from error
    return model, replaced


def _in_float32(model, unsafe: bool, custom_objects: dict, stored: bool = False):
    """The in-memory `model` itself, or a float32 copy when it computes in half
    precision (saved to a temporary archive and loaded back, as from a file)."""
    if not _half_policies(model):
        return model, []
    with tempfile.TemporaryDirectory() as workdir:
        path = Path(workdir) / "model.keras"
        try:
            model.save(path)
        except Exception as error:  # noqa: BLE001 - translated for the user
            raise ModelLoadError(
                f"{argument('model')}: a mixed-precision model is exported in float32 "
                f"through a saved copy, and saving it failed ({type(error).__name__}: "
                f"{error}); make its custom layers serializable (get_config)"
            ) from error
        return _load_archive(path, unsafe, custom_objects, stored)


def load(
    model, imports=(), unsafe=False, input_roles=None, stored=False, shapes=None
) -> LoadedModel:
    """Load a `.keras` path, or take a model in memory, in float32, and
    describe its inputs and outputs.

    Args:
        model: a `keras.Model`, or the path of a `.keras` file.
        imports: modules to import first: the custom layers and functions they
            define are found by name, registered or not.
        unsafe: load in Keras' unsafe mode (Lambda layers' code runs).
        input_roles: overrides of the roles read from the model, by input name.
        stored: keep bfloat16 and float16 variables as stored, computing in
            float32 (`stored_precision_policy`): the weights take their
            stored bytes in memory, and the graph reads them through a Cast.
        shapes: the caller's validation grid: the role probe runs there too
            when the model fails at its own size (a model that runs at one
            batch size only).

    Returns:
        The `LoadedModel`.

    Raises:
        UsageError: `model` is neither, an import fails, or a role is unknown.
        ModelLoadError: the file cannot be read or holds no model.
    """
    import keras

    keras_layers.ScaledEmbedding  # noqa: B018 - naming one registers the layers with Keras

    custom_objects = import_modules(list(imports))
    if isinstance(model, keras.Model):
        path = None
        model, replaced = _in_float32(model, unsafe, custom_objects, stored)
    elif isinstance(model, str | os.PathLike):
        path = Path(model)
        _check_archive(path)
        model, replaced = _load_archive(path, unsafe, custom_objects, stored)
        if not isinstance(model, keras.Model):
            raise ModelLoadError(f"{path}: holds a {type(model).__name__}, not a model")
    else:
        raise UsageError(
            f"{argument('model')}: expected a keras.Model or the path of a .keras file, "
            f"got {type(model).__name__}"
        )
    sizes = [shape for shape in shapes or () if isinstance(shape, tuple | list)]
    inputs, outputs, input_structure, output_structure, tables, notes = _describe(model, sizes)
    inputs = inputs_module.apply_overrides(inputs, dict(input_roles or {}))
    max_length, max_length_source = inputs_module.max_sequence_length(model, tables)
    if not inputs:
        raise ModelLoadError(f"{path or argument('model')}: the model has no inputs")
    strings = [tensor.name for tensor in inputs if tensor.dtype == "string"]
    if strings:
        raise ModelLoadError(
            _strings_refused(str(path or argument("model")), f"the input {strings[0]!r}")
        )
    return LoadedModel(
        model=model,
        path=path,
        inputs=inputs,
        outputs=outputs,
        input_structure=input_structure,
        output_structure=output_structure,
        source_policies=replaced,
        param_bytes=param_bytes(model),
        max_length=max_length,
        max_length_source=max_length_source,
        variable_sizes=[(v.path, variable_bytes(v)) for v in unique_variables(model)],
        name=model.name,
        notes=notes,
    )
