"""Hostile `.keras` archives: configs and weight files whose declared sizes lie.

Each is a few kilobytes on disk however large the model it declares: the HDF5
datasets are created with h5py and never written (a fill value only), or hold
zeros behind gzip, so building them costs no memory and no time. Used by
tests/test_hostile_archives.py (run in a subprocess under an address-space
limit) and by the fuzz strategies of tests/test_fuzz.py (small sizes, in
process).
"""

import io
import json
import zipfile
from pathlib import Path

import h5py
import numpy as np

# How a dataset holds (or does not hold) the bytes its shape declares.
LAYOUTS = ("contiguous", "fill_only", "gzip_zeros", "unallocated", "partial")


def dense_config(units: int, width: int, layers: int = 1) -> dict:
    """A Sequential config of `layers` Dense layers of `units`, on `width` features,
    as Keras 3 saves it."""
    policy = {"module": "keras", "class_name": "DTypePolicy", "config": {"name": "float32"}}
    stack = [
        {
            "module": "keras.layers",
            "class_name": "InputLayer",
            "config": {"batch_shape": [None, width], "dtype": "float32", "name": "features"},
            "registered_name": None,
        }
    ]
    inputs = width
    for index in range(layers):
        stack.append(
            {
                "module": "keras.layers",
                "class_name": "Dense",
                "config": {"name": f"dense_{index}", "dtype": policy, "units": units},
                "registered_name": None,
                "build_config": {"input_shape": [None, inputs]},
            }
        )
        inputs = units
    return {
        "module": "keras",
        "class_name": "Sequential",
        "config": {"name": "sequential", "dtype": policy, "layers": stack},
        "registered_name": None,
        "build_config": {"input_shape": [None, width]},
    }


def make_dataset(group, name: str, shape: tuple, layout: str) -> None:
    """One float32 dataset of `shape` that holds its bytes as `layout` says."""
    if layout == "contiguous":
        group.create_dataset(name, data=np.full(shape, 0.01, np.float32))
        return
    if layout == "unallocated":  # contiguous, its storage allocated only when written
        group.create_dataset(name, shape=shape, dtype="float32", fillvalue=0.5)
        return
    chunks = tuple(max(1, min(size, 1024)) for size in shape) or None
    options = {"chunks": chunks, "fillvalue": 0.5, "maxshape": (None,) * len(shape)}
    if layout == "gzip_zeros":
        options.update(compression="gzip", compression_opts=9)
    dataset = group.create_dataset(name, shape=shape, dtype="float32", **options)
    if layout == "gzip_zeros":  # every chunk written, each deflating ~1000:1
        for start in range(0, shape[0], chunks[0]):
            block = (min(chunks[0], shape[0] - start), *shape[1:])
            dataset[start : start + block[0]] = np.zeros(block, np.float32)
    elif layout == "partial":  # one chunk written, the rest the fill value
        dataset[tuple(slice(0, size) for size in chunks)] = 1.0


def weights_h5(shapes: dict, layout: str = "contiguous") -> bytes:
    """A `model.weights.h5` laid out as Keras writes it, `{layer: [shape, ...]}`,
    each dataset held as `layout` says."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as file:
        file.create_group("vars")
        for layer, variables in shapes.items():
            group = file.create_group(f"layers/{layer}/vars")
            for index, shape in enumerate(variables):
                make_dataset(group, str(index), tuple(shape), layout)
    return buffer.getvalue()


def dense_shapes(units: int, width: int, layers: int = 1) -> dict:
    """The weights `dense_config` declares, by layer."""
    shapes, inputs = {}, width
    for index in range(layers):  # Keras files a layer by its class: dense, dense_1, ...
        shapes["dense" if index == 0 else f"dense_{index}"] = [(inputs, units), (units,)]
        inputs = units
    return shapes


def write_keras(path: Path, config: dict, weights: bytes, compress: bool = False) -> Path:
    """A `.keras` archive of `config` and `weights` at `path`."""
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("metadata.json", json.dumps({"keras_version": "3.15.1"}))
        archive.writestr("config.json", json.dumps(config))
        archive.writestr("model.weights.h5", weights, compress_type=method)
    return path


def dense_bomb(path: Path, units: int, width: int, layout: str, compress: bool = False) -> Path:
    """A Dense model whose config and weights both declare `units` x `width`
    weights, the weights held as `layout` says (the weights entry deflated
    with `compress`)."""
    weights = weights_h5(dense_shapes(units, width), layout)
    return write_keras(path, dense_config(units, width), weights, compress)


def hostile(path: Path, weights: bytes) -> Path:
    """A small Dense model's config (Dense(8) on 16 features) with `weights`."""
    return write_keras(path, dense_config(8, 16), weights)


def config_only_bomb(path: Path, units: int, width: int) -> Path:
    """A config declaring Dense(units) on `width` features, and a weights file
    holding a tiny model's: the config declares far more than the h5 holds."""
    small = weights_h5(dense_shapes(2, 2), "contiguous")
    return write_keras(path, dense_config(units, width), small)


def _with_vars(build) -> bytes:
    """A weights file with the top-level `vars` group Keras writes, then `build(file)`."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as file:
        file.create_group("vars")
        build(file)
    return buffer.getvalue()


def external_storage_h5(units: int, width: int, source: str = "/dev/zero") -> bytes:
    """Dense weights whose kernel's bytes are read from another file (HDF5
    external storage): /dev/zero, or any file of the machine that loads it."""

    def build(file):
        group = file.create_group("layers/dense/vars")
        size = units * width * 4
        group.create_dataset("0", (width, units), "float32", external=[(source, 0, size)])
        group.create_dataset("1", data=np.zeros(units, np.float32))

    return _with_vars(build)


def virtual_h5(units: int, width: int) -> bytes:
    """Dense weights whose kernel is a virtual dataset mapped onto another file."""

    def build(file):
        group = file.create_group("layers/dense/vars")
        layout = h5py.VirtualLayout(shape=(width, units), dtype="float32")
        layout[:] = h5py.VirtualSource("elsewhere.h5", "data", shape=(width, units))
        group.create_virtual_dataset("0", layout, fillvalue=0.5)
        group.create_dataset("1", data=np.zeros(units, np.float32))

    return _with_vars(build)


def external_link_h5() -> bytes:
    """A weights file whose layer group is a link into another file."""

    def build(file):
        file.create_group("layers")
        file["layers/dense"] = h5py.ExternalLink("/etc/passwd", "/layers/dense")

    return _with_vars(build)


def many_small_h5(count: int, elements: int) -> bytes:
    """`count` datasets of `elements` float32 each, never written: each under
    the per-dataset floor, together many times what the file stores."""

    def build(file):
        group = file.create_group("layers/dense/vars")
        for index in range(count):
            group.create_dataset(str(index), (elements,), "float32", chunks=(elements,))

    return _with_vars(build)


def huge_shape_h5(elements: int = 2**40) -> bytes:
    """A kernel declared as `elements` float32 (4 TiB by default), unlimited
    along its axis, holding a fill value only."""

    def build(file):
        group = file.create_group("layers/dense/vars")
        group.create_dataset(
            "0", (elements,), "float32", chunks=(4096,), maxshape=(None,), fillvalue=1.0
        )

    return _with_vars(build)


def cyclic_h5(units: int, width: int) -> bytes:
    """Honest Dense weights, in a file where a group links to itself and one
    dataset is linked twice (hard links): a walk must end."""

    def build(file):
        group = file.create_group("layers/dense/vars")
        group.create_dataset("0", data=np.full((width, units), 0.01, np.float32))
        group.create_dataset("1", data=np.zeros(units, np.float32))
        file["layers/dense/loop"] = file["layers/dense"]
        file["layers/copy"] = group["0"]

    return _with_vars(build)


def lying_contiguous_h5(units: int, width: int, factor: int) -> bytes:
    """Dense weights of `width` x `units` written contiguously, then the kernel's
    dataspace and layout patched to declare `factor` times as many columns
    (and as many stored bytes) as the file holds."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as file:
        file.create_group("vars")
        group = file.create_group("layers/dense/vars")
        group.create_dataset("0", data=np.full((width, units), 0.01, np.float32))
        group.create_dataset("1", data=np.zeros(units, np.float32))
        offset = group["0"].id.get_offset()
    data = bytearray(buffer.getvalue())
    dims = width.to_bytes(8, "little") + units.to_bytes(8, "little")
    at = data.index(dims + dims)  # the dataspace's sizes, then its maximum sizes
    for start in (at + 8, at + 24):
        data[start : start + 8] = (units * factor).to_bytes(8, "little")
    size = width * units * 4
    layout = b"\x03\x01" + offset.to_bytes(8, "little") + size.to_bytes(8, "little")
    at = data.index(layout)  # version 3, contiguous: address, then size
    data[at + 10 : at + 18] = (size * factor).to_bytes(8, "little")
    return bytes(data)
