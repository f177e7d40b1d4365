"""Where the files of an export go, and the only module that touches the user's paths.

Every file is first written into a staging folder beside the output (same file
system, so a rename is atomic) and moved into place only after the whole export
has passed: the float file, its data file, the int8 file and the report go
together. A failed export leaves every file the user had as it was and keeps
its own files under `.failed` names, with their own report.
"""

import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from keras_layers.export.errors import OutputError, argument

STAGING_SUFFIX = ".tmp"
# A staging folder idle this long belongs to an export that was killed.
STALE_SECONDS = 3600


@dataclass(frozen=True)
class Targets:
    """The final paths of one export."""

    onnx: Path
    report: Path

    @property
    def int8(self) -> Path:
        return self.onnx.with_name(f"{self.onnx.stem}.int8{self.onnx.suffix or '.onnx'}")

    def failed(self) -> "Targets":
        """Where the files of a failed export are kept instead."""
        return Targets(onnx=failed_path(self.onnx), report=failed_path(self.report))


def failed_path(path: Path) -> Path:
    """`model.onnx` -> `model.failed.onnx`; `model.report.json` -> `model.report.failed.json`."""
    return path.with_name(f"{path.stem}.failed{path.suffix}")


def data_name(onnx_name: str, digest: str) -> str:
    """The name of a graph's data file, named by its content, so that a new
    data file never replaces the one an older graph reads.

    Args:
        onnx_name: the graph's file name, `NAME.onnx`.
        digest: the data's content hash (`file_digest`).

    Returns:
        `NAME.onnx.<digest>.data`.
    """
    return f"{onnx_name}.{digest}.data"


def file_digest(path: Path) -> str:
    """A short content hash of a (possibly multi-GB) file, read in chunks."""
    digest = hashlib.blake2b(digest_size=8)
    with open(path, "rb") as file:
        while chunk := file.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()


def _data_files_read_by(graph: Path) -> set[Path]:
    """The external data files an existing ONNX graph reads (none if it is not
    one, or cannot be parsed)."""
    import onnx
    from onnx import TensorProto

    try:
        proto = onnx.load(str(graph), load_external_data=False)
    except Exception:  # noqa: BLE001 - not ours to judge: then it reads nothing we own
        return set()
    found = set()
    for tensor in proto.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            for entry in tensor.external_data:
                if entry.key == "location":
                    found.add(graph.with_name(Path(entry.value).name))
    return found


def default_report_path(output: Path) -> Path:
    return output.with_name(f"{output.stem}.report.json")


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _check_writable_file(path: Path, name: str) -> None:
    """`path` is a regular file or a new name in a folder we can write to."""
    if path.is_symlink() and not path.exists():
        raise OutputError(f"{argument(name, path)}: is a broken symbolic link; remove it first")
    if path.exists():
        mode = path.stat().st_mode
        if stat.S_ISDIR(mode):
            raise OutputError(
                f"{argument(name, path)}: is a directory; give a file name such as model.onnx"
            )
        if not stat.S_ISREG(mode):
            raise OutputError(
                f"{argument(name, path)}: is not a regular file (a device, FIFO or socket); "
                "only regular files are replaced"
            )
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputError(
            f"{argument(name, path)}: cannot create {parent} ({error.strerror})"
        ) from error
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as error:
        raise OutputError(
            f"{argument(name, path)}: {parent} is not writable ({error.strerror})"
        ) from error


def check_targets(targets: Targets, source: Path | None) -> None:
    """Fail before any work if the outputs cannot be written, or would collide
    with each other or with the model being exported.

    Args:
        targets: the final paths of the export's files.
        source: the `.keras` file being exported, if any.

    Raises:
        OutputError: a path cannot be written, or two of them are one file.
    """
    _check_writable_file(targets.onnx, "output")
    _check_writable_file(targets.report, "report_path")
    failed = targets.failed()
    # (what to call it in a message, path): the arguments by their own names,
    # the files derived from the output by what they are.
    files = [
        (argument("output", targets.onnx), targets.onnx),
        (argument("report_path", targets.report), targets.report),
        (f"the int8 file {targets.int8}", targets.int8),
        (f"the failed file {failed.onnx}", failed.onnx),
        (f"the failed report {failed.report}", failed.report),
    ]
    for index, (name, path) in enumerate(files):
        if source is not None and _same_file(path, source):
            raise OutputError(f"{name}: is the model being exported; choose another output name")
        for other_name, other in files[index + 1 :]:
            if _same_file(path, other):
                raise OutputError(
                    f"{name}: the same file as {other_name}; give them different names"
                )


def check_report_path(path: Path, others: list[Path]) -> None:
    """Fail before any work if a lone report (`checking.validate`'s) cannot be
    written, or is one of the files it reports on.

    Args:
        path: the report's path.
        others: the files it must not replace (the ONNX file, the model).

    Raises:
        OutputError: the path cannot be written, or is one of `others`.
    """
    _check_writable_file(path, "report_path")
    for other in others:
        if _same_file(path, other):
            raise OutputError(
                f"{argument('report_path', path)}: is {other}, which is being checked; "
                "choose another report name"
            )


def write_report(data: dict, path: Path) -> None:
    """Write a report in one step: to a private file beside `path`, then
    renamed onto it, so that `path` holds the old report or the new one.

    Args:
        data: the report.
        path: its final path.
    """
    handle, staged = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        write_json(data, Path(staged))
        place([(Path(staged), path)])
    finally:
        Path(staged).unlink(missing_ok=True)


def _remove_stale_staging(output: Path) -> None:
    """Remove staging folders of earlier exports to `output` that were killed.

    Only folders named exactly like ours (`.NAME.` + 8 random characters +
    `.tmp`; compared as text, never as a glob pattern) and idle for an hour, so
    a concurrent export to the same path keeps its own.
    """
    prefix = f".{output.name}."
    try:
        entries = list(output.parent.iterdir())
    except OSError:
        return
    for entry in entries:
        name = entry.name
        middle = name[len(prefix) : -len(STAGING_SUFFIX)]
        if not (
            name.startswith(prefix)
            and name.endswith(STAGING_SUFFIX)
            and len(middle) == 8
            and middle.isalnum()
        ):
            continue
        try:
            info = entry.lstat()
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and time.time() - info.st_mtime > STALE_SECONDS:
            shutil.rmtree(entry, ignore_errors=True)


@contextmanager
def staging_folder(output: Path) -> Iterator[Path]:
    """A private folder beside `output`, removed with whatever is left in it."""
    _remove_stale_staging(output)
    folder = Path(
        tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.", suffix=STAGING_SUFFIX)
    )
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(data: dict, path: Path) -> None:
    """Write `data` as indented JSON (for a staged report).

    Args:
        data: the report.
        path: the file to write.
    """
    with open(path, "w") as file:
        json.dump(data, file, indent=2, default=float)
        file.write("\n")


def place(moves: list[tuple[Path, Path]]) -> None:
    """Rename staged files onto their final paths, data files first.

    Each rename is atomic. A data file is named by its content, so placing it
    never touches the data an older graph reads; the graph is renamed after it,
    so a reader finds either the old graph with its old data or the new graph
    with its new data. Data files that only the replaced graphs read are
    removed last, and only those named like ours (`NAME.onnx.*.data`,
    `NAME.onnx.data`). Every placed file gets the permissions a new file gets
    under the user's umask.
    """
    mode = 0o666 & ~_umask()
    ordered = sorted(moves, key=lambda move: not move[0].name.endswith(".data"))
    graphs = [final for staged, final in moves if not staged.name.endswith((".data", ".json"))]
    old_data = set().union(*(_data_files_read_by(g) for g in graphs if g.exists()))
    for staged, final in ordered:
        os.chmod(staged, mode)
        os.replace(staged, final)
    still_read = set().union(*(_data_files_read_by(g) for g in graphs))
    for stale in old_data - still_read:
        owner = next((g for g in graphs if stale.name.startswith(f"{g.name}.")), None)
        if owner is not None and stale.name.endswith(".data") and stale.is_file():
            stale.unlink(missing_ok=True)
