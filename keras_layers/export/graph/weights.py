"""A weight's values wherever they are: in the proto, or in a data file.

An export writes every matrix weight to a data file as it is converted
(`converting`, `stage`), so no proto of the pipeline ever holds the matrices:
onnxslim, shape inference and the fusions copy and serialise a proto of nodes
and vectors only, whatever the model's size. A pass that needs a weight's values reads them here
(`values`: a read-only memory map of the file) and writes them back here
(`replace`: in place when the byte count is the same, else appended); the
last step writes the file the user gets (`save`): one self-contained ONNX
file, its tensors streamed into it one at a time, or a graph and a data file
holding the tensors it reads, in the graph's order.

Offsets in a data file are multiples of `DATA_ALIGNMENT`, the page size of
every common platform (64 KiB is Windows' mapping granularity), so that ONNX
Runtime can map a tensor from the file rather than copy it. Tensors under
`EXTERNAL_MIN_BYTES` (ONNX's own `size_threshold` default) stay in the graph.
"""

import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

EXTERNAL_MIN_BYTES = 1024
DATA_ALIGNMENT = 1 << 16
# Weights past this many bytes go to a data file beside the graph (protobuf's 2 GB).
INLINE_LIMIT = 1_800_000_000


def is_external(tensor) -> bool:
    """Whether `tensor`'s values are in a data file."""
    return tensor.data_location == TensorProto.EXTERNAL


def raw_bytes(array: np.ndarray) -> memoryview:
    """The bytes of `array` in C order, without a copy where it is contiguous
    (a view as bytes: Python's buffers know no bfloat16)."""
    return memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def _entries(tensor) -> dict:
    return {entry.key: entry.value for entry in tensor.external_data}


def _dtype(tensor) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).newbyteorder("<")


def values(tensor, folder: Path | None) -> np.ndarray:
    """The values of `tensor`: a read-only memory map of its bytes in the data
    file (its `location` in `folder`), or, for one held in the proto, an array.

    Args:
        tensor: an initializer (a TensorProto).
        folder: the folder of the data files its graph reads.

    Returns:
        The values, in the tensor's shape.

    Raises:
        ValueError: the tensor is in a data file and no folder was given.
    """
    if not is_external(tensor):
        return numpy_helper.to_array(tensor)
    if folder is None:
        raise ValueError(f"{tensor.name}: its values are in a data file, and no folder was given")
    entries = _entries(tensor)
    shape = tuple(tensor.dims)
    if not int(np.prod(shape, dtype=np.int64)):
        return np.zeros(shape, _dtype(tensor))
    return np.memmap(
        Path(folder) / entries["location"],
        dtype=_dtype(tensor),
        mode="r",
        offset=int(entries.get("offset", 0)),
        shape=shape,
    )


# Bytes read at a time by `chunks`.
_CHUNK_BYTES = 64 << 20


def chunks(tensor, folder: Path | None) -> Iterator[memoryview]:
    """The bytes of `tensor`'s values in order, a piece at a time.

    A tensor in a data file is read, not mapped: the pages read stay in the
    page cache, out of this process's resident memory, which a memory map
    of a multi-GB weight would grow by its whole size. Each piece is valid
    until the next is asked for.

    Args:
        tensor: an initializer.
        folder: the folder of its data file.

    Returns:
        An iterator over its bytes, up to 64 MiB at a time.

    Raises:
        ValueError: the data file ends before the tensor's values do.
    """
    if not is_external(tensor):
        yield memoryview(tensor.raw_data) if tensor.raw_data else raw_bytes(values(tensor, None))
        return
    entries = _entries(tensor)
    remaining = int(entries["length"])
    buffer = memoryview(bytearray(min(_CHUNK_BYTES, remaining)))
    with open(Path(folder) / entries["location"], "rb", buffering=0) as data:
        data.seek(int(entries.get("offset", 0)))
        while remaining:
            count = data.readinto(buffer[: min(remaining, len(buffer))])
            if not count:
                raise ValueError(f"{tensor.name}: its data file ends before its values do")
            yield buffer[:count]
            remaining -= count


def digest(tensor, folder: Path | None) -> bytes:
    """The SHA-256 of `tensor`'s bytes, read a piece at a time.

    Args:
        tensor: an initializer.
        folder: the folder of its data file.

    Returns:
        The 32-byte digest.

    Raises:
        ValueError: the data file ends before the tensor's values do.
    """
    hashed = hashlib.sha256()
    for piece in chunks(tensor, folder):
        hashed.update(piece)
    return hashed.digest()


def _append(tensor, pieces, data, digest=None) -> None:
    """Write `pieces` (buffers of bytes, in order) at the next aligned offset
    of `data` (an open binary file) and point `tensor` at them; with
    `digest`, hash the bytes the file gains (the padding too)."""
    end = data.seek(0, 2)
    offset = -(-end // DATA_ALIGNMENT) * DATA_ALIGNMENT
    data.seek(offset)
    if digest is not None:
        digest.update(bytes(offset - end))
    length = 0
    for piece in pieces:
        data.write(piece)
        if digest is not None:
            digest.update(piece)
        length += len(piece)
    del tensor.external_data[:]
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (
        ("location", Path(data.name).name),
        ("offset", str(offset)),
        ("length", str(length)),
    ):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def store(tensor, array: np.ndarray, data=None) -> None:
    """Give `tensor` the values of `array`: as raw bytes in the proto, or, with
    `data` (an open binary file) and at least `EXTERNAL_MIN_BYTES`, appended to
    that file at an aligned offset.

    Args:
        tensor: the TensorProto (its type and dims already set).
        array: its values.
        data: the data file, open for writing, or None.
    """
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    if data is None or little.nbytes < EXTERNAL_MIN_BYTES:
        tensor.raw_data = little.tobytes()
        return
    _append(tensor, [raw_bytes(little)], data)


def stage(tensor, array: np.ndarray, data=None) -> None:
    """`store` for a weight as it is converted, before the passes: a matrix
    (two axes or more longer than 1) goes to `data`, a vector (a bias, a
    LayerNorm's gamma and beta, an RMS norm's scale) stays in the proto,
    however wide.

    The passes read a vector's values and never a data file's: the fusions
    put a gamma into the op they make (`Graph.const`), ONNX Runtime's bias
    fusions read the bias, onnxslim folds a zero bias. A vector in the data
    file was no constant to them, so a model's LayerNorms fused below 256
    floats (`EXTERNAL_MIN_BYTES`) and none did from 256 on. A vector is a
    width's worth of values beside a matrix of width x width: the proto
    stays small. `save` still writes the user's file by size alone.

    Args:
        tensor: the TensorProto (its type and dims already set).
        array: its values.
        data: the staged data file, open for writing, or None.
    """
    matrix = sum(size > 1 for size in array.shape) > 1
    store(tensor, array, data if matrix else None)


def replace(tensor, array: np.ndarray, folder: Path | None) -> None:
    """Give `tensor` new values (and the type and dims of `array`), where they
    were: in the proto, or in its data file, over the old bytes when the byte
    count is the same (the caller has read them already), else appended.

    Args:
        tensor: an initializer.
        array: its new values.
        folder: the folder of its data file.
    """
    little = np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<"), copy=False))
    tensor.data_type = helper.np_dtype_to_tensor_dtype(array.dtype)
    del tensor.dims[:]
    tensor.dims.extend(array.shape)
    if not is_external(tensor):
        tensor.raw_data = little.tobytes()
        return
    entries = _entries(tensor)
    with open(Path(folder) / entries["location"], "r+b") as data:
        if int(entries["length"]) != little.nbytes:
            _append(tensor, [raw_bytes(little)], data)
            return
        data.seek(int(entries.get("offset", 0)))
        data.write(raw_bytes(little))


def _without_location(tensor):
    """A copy of `tensor` without its data file's location (`data_location`
    and `external_data` unset) and without values: what `_inlined` fills."""
    copy = TensorProto()
    copy.CopyFrom(tensor)
    del copy.external_data[:]
    copy.ClearField("data_location")
    copy.ClearField("raw_data")
    return copy


def _inlined(tensor, folder: Path | None):
    """A copy of `tensor` with its values in the proto, as a tensor converted
    in memory has them (`data_location` and `external_data` unset)."""
    if not is_external(tensor):
        copy = TensorProto()
        copy.CopyFrom(tensor)
        return copy
    copy = _without_location(tensor)
    copy.raw_data = raw_bytes(values(tensor, folder)).tobytes()
    return copy


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        low, number = number & 0x7F, number >> 7
        out.append(low | (0x80 if number else 0))
        if not number:
            return bytes(out)


def _inlined_size(tensor) -> int:
    """The serialised size of `_inlined(tensor)`, without reading its values."""
    if not is_external(tensor):
        return tensor.ByteSize()
    copy = _without_location(tensor)
    copy.raw_data = b""  # set, so its tag and a length of 0 count
    length = int(_entries(tensor)["length"])
    return copy.ByteSize() - 1 + len(_varint(length)) + length


def _fields(message, keep) -> bytes:
    """`message` serialised with only the fields whose number `keep` takes."""
    copy = type(message)()
    copy.CopyFrom(message)
    for field, _ in message.ListFields():
        if not keep(field.number):
            copy.ClearField(field.name)
    return copy.SerializeToString()


# Field numbers: ModelProto.graph, GraphProto.initializer (length-delimited).
_GRAPH, _INITIALIZER = 7, 5


def _key(number: int) -> bytes:
    return _varint(number << 3 | 2)


# TensorProto.raw_data's field number.
_RAW_DATA = 9


def _write_inlined(file, tensor, folder: Path | None) -> None:
    """Write `_inlined(tensor)` serialised, its values streamed from the data
    file a piece at a time (`chunks`): the fields before `raw_data`, its key
    and length, the bytes, the fields after it. Serialising the inlined copy
    whole held the tensor four times (read, copied into the proto, serialised)."""
    if not is_external(tensor):
        file.write(tensor.SerializeToString())
        return
    copy = _without_location(tensor)
    file.write(_fields(copy, lambda number: number < _RAW_DATA))
    file.write(_key(_RAW_DATA) + _varint(int(_entries(tensor)["length"])))
    for piece in chunks(tensor, folder):
        file.write(piece)
    file.write(_fields(copy, lambda number: number > _RAW_DATA))


def _save_one_file(proto, folder: Path | None, path: Path) -> None:
    """One ONNX file, byte for byte what `onnx.save_model` writes of the
    proto with every tensor in it, but each tensor read and written on its
    own: a message serialises its fields in the order of their numbers, so
    the file is the fields before the graph's initializers, each initializer,
    then the fields after them, every length known from the tensors' sizes."""
    graph = proto.graph
    kept = list(graph.initializer)
    del graph.initializer[:]
    try:
        sizes = [_inlined_size(tensor) for tensor in kept]
        head = _fields(graph, lambda number: number < _INITIALIZER)
        tail = _fields(graph, lambda number: number > _INITIALIZER)
        entries = sum(len(_key(_INITIALIZER)) + len(_varint(size)) + size for size in sizes)
        with open(path, "wb") as file:
            file.write(_fields(proto, lambda number: number < _GRAPH))
            file.write(_key(_GRAPH) + _varint(len(head) + entries + len(tail)) + head)
            for tensor, size in zip(kept, sizes, strict=True):
                file.write(_key(_INITIALIZER) + _varint(size))
                _write_inlined(file, tensor, folder)
            file.write(tail)
            file.write(_fields(proto, lambda number: number > _GRAPH))
    finally:
        graph.initializer.extend(kept)


def byte_count(tensor) -> int:
    """The size of a TensorProto's values, from its type and shape (wherever
    they are).

    Args:
        tensor: a TensorProto.

    Returns:
        The bytes.
    """
    count = int(np.prod(tensor.dims, dtype=np.int64)) if tensor.dims else 1
    return count * np.dtype(helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize


def _save_with_data(proto, folder: Path | None, path: Path, data_path: Path) -> str | None:
    """The graph at `path`, and the tensors of at least `EXTERNAL_MIN_BYTES`
    it reads in `data_path`, in the graph's order (bytes no tensor reads any
    more are left behind). Returns the data file's content hash
    (`placement.file_digest`'s), or None (and no file) when no tensor is that
    large."""
    digest = hashlib.sha256()
    written = False
    with open(data_path, "wb") as data:
        for tensor in proto.graph.initializer:
            if byte_count(tensor) < EXTERNAL_MIN_BYTES:
                if is_external(tensor):
                    tensor.CopyFrom(_inlined(tensor, folder))
                continue
            _append(tensor, chunks(tensor, folder), data, digest)  # read, then repointed
            written = True
    onnx.save_model(proto, path)
    if not written:
        data_path.unlink()
        return None
    return digest.hexdigest()[:16]


def save(proto, folder: Path | None, path: Path, data_path: Path | None = None) -> str | None:
    """Write the model the user gets.

    Args:
        proto: the ModelProto; its tensors in the proto or in data files in
            `folder`.
        folder: the folder of those data files.
        path: the ONNX file to write.
        data_path: with it, the tensors of at least `EXTERNAL_MIN_BYTES` go to
            this file (named in the graph by its file name, so it must be
            beside `path`); without, every tensor goes into the one file.

    Returns:
        The data file's content hash (`placement.file_digest`'s), or None
        when there is none.
    """
    if data_path is None:
        _save_one_file(proto, folder, path)
        return None
    return _save_with_data(proto, folder, path, data_path)


def save_in_memory(proto, path: Path) -> None:
    """Save a proto whose tensors are all in memory (loaded whole, or built):
    one file, or past `INLINE_LIMIT` bytes of weights a graph and one data
    file beside it (`{name}.data`).

    Args:
        proto: the ModelProto.
        path: the file to write.
    """
    external = sum(init.ByteSize() for init in proto.graph.initializer) > INLINE_LIMIT
    onnx.save(
        proto,
        str(path),
        save_as_external_data=external,
        all_tensors_to_one_file=True,
        location=f"{Path(path).name}.data",
    )
