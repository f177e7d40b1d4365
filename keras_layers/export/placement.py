"""Where the files of an export go: with folder_placement.py (a genai folder's
files, placed as one set), the only modules that touch the user's paths.

Every file is first written into a staging folder beside the output (same file
system, so a rename is atomic) and moved into place only after the whole export
has passed: the float file, its data file, the int8 file and the report go
together. A failed export leaves every file the user had as it was and keeps
its own files under `.failed` names, with their own report.

Two exports to one output. The placement (`place`: renames, then removal of
the data files only the replaced graphs read) runs under `output_lock`, an
advisory `flock` on `.NAME.onnx.lock` beside the output, taken and released by
the pipeline around `place` alone. That is enough: until then each export
works in its own staging folder and touches nothing shared, and every fact the
placement acts on (which data files the replaced graphs read, which graphs
still read them) is read after the lock is taken, so no decision rests on a
file another export has since replaced. Holding it for the whole export would
make a second export wait minutes for nothing; the placement takes
milliseconds. The lock waits as long as the other holder places its files;
Ctrl-C ends the wait. The kernel drops a `flock` when its holder dies
(SIGKILL included), so a dead export never blocks the next one. The lock file
is removed on release, while still locked; a waiter that locked the removed
file sees that the name no longer leads to its file and starts over, so two
holders never overlap. A holder killed before that leaves the hidden file,
which the next export locks, reuses and removes. Without `fcntl` (not Linux or
macOS, the supported systems) there is no lock: concurrent exports to one
output are then not serialised.

A staging folder is held with a shared `flock` while its export runs, so the
removal of stale staging folders (idle an hour, `_remove_stale_staging`) never
takes the folder of a live export, however long it runs.

A data file is removed by a placement only when all of these hold: a graph it
replaced read it (its `location` resolved against that graph's folder; an
absolute location or one with `..` is never followed); it is ours, a regular
file directly in that folder named `NAME.onnx.*.data` or `NAME.onnx.data`
after a placed graph; and no graph reads it now, neither the placed graphs nor
any other `*.onnx` file directly in that folder (a copy of the graph, another
tool's output), whose bytes are searched for the data file's name without
parsing them: a false match only keeps a file.
"""

import hashlib
import json
import mmap
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

try:
    import fcntl
except ImportError:  # not Linux or macOS: no locks (the module docstring)
    fcntl = None

STAGING_SUFFIX = ".tmp"
LOCK_SUFFIX = ".lock"
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
    """A short content hash of a (possibly multi-GB) file, read in chunks: the
    first 16 hex digits of its SHA-256 (twice BLAKE2's speed here, with the
    CPU's SHA instructions: 1.7 against 0.9 GB/s)."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 24):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def data_files_read_by(graph: Path) -> set[Path]:
    """The external data files an existing ONNX graph reads, as paths: each
    `location` joined to the graph's folder, as ONNX Runtime resolves it (none
    if the file is not a graph, or cannot be parsed). A location that is
    absolute or climbs out with `..` is left out: no file there is ours."""
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
                location = Path(entry.value)
                if entry.key != "location" or location.is_absolute() or ".." in location.parts:
                    continue
                if location.parts:
                    found.add(graph.parent / location)
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
    # Missing folders are made when the files are staged (`staging_folder`),
    # not here: a command that fails creates nothing. Their nearest existing
    # ancestor must take them.
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        if parent.is_symlink() or (parent.parent.exists() and not parent.parent.is_dir()):
            raise OutputError(
                f"{argument(name, path)}: cannot create {path.parent} ({parent.parent} is "
                "not a folder)"
            )
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(
            f"{argument(name, path)}: cannot create {path.parent} ({parent} is a file)"
        )
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
    for name, path in (("output", targets.onnx), ("report_path", targets.report)):
        if "\x00" in str(path):
            raise OutputError(f"{argument(name, path)}: a path cannot hold a NUL character")
    _check_writable_file(targets.onnx, "output")
    _check_writable_file(targets.report, "report_path")
    lock = lock_path(targets.onnx)
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        raise OutputError(
            f"{argument('output', targets.onnx)}: {lock}, the file exports to it lock, "
            "is not a regular file; remove it"
        )
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
            remove_unless_held(entry)


def hold_folder(folder: Path) -> int | None:
    """A descriptor holding a shared lock on a live export's staging folder
    (None without `fcntl`)."""
    if fcntl is None:
        return None
    descriptor = os.open(folder, os.O_RDONLY)
    fcntl.flock(descriptor, fcntl.LOCK_SH)
    return descriptor


def remove_unless_held(folder: Path) -> None:
    """Remove a stale staging folder, unless the export that made it still runs."""
    if fcntl is None:
        shutil.rmtree(folder, ignore_errors=True)
        return
    try:
        descriptor = os.open(folder, os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY)
    except OSError:
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        shutil.rmtree(folder, ignore_errors=True)
    except OSError:  # held: its export is alive
        pass
    finally:
        os.close(descriptor)


@contextmanager
def staging_folder(output: Path, others: tuple = ()) -> Iterator[Path]:
    """A private folder beside `output`, held while the export runs and
    removed with whatever is left in it. Folders on the way to `output` (and
    to `others`, the export's other files: its report) that did not exist
    are made here and removed again when nothing was placed in them (a
    failed export creates nothing).

    Args:
        output: the export's main file (the staging folder goes beside it).
        others: the export's other final paths whose folders must exist.

    Returns:
        A context manager giving the staging folder's path.

    Raises:
        OutputError: the folders or the staging folder cannot be made.
    """
    paths = [output, *others]
    made = list(
        dict.fromkeys(
            parent for path in paths for parent in reversed(path.parents) if not parent.exists()
        )
    )
    _remove_stale_staging(output)
    try:
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
        folder = Path(
            tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.", suffix=STAGING_SUFFIX)
        )
    except OSError as error:
        remove_empty(made)
        raise OutputError(
            f"{argument('output', output)}: cannot create a staging folder in "
            f"{output.parent} ({error.strerror or error})"
        ) from error
    with holding(folder, made):
        yield folder


@contextmanager
def holding(folder: Path, made: list[Path]) -> Iterator[Path]:
    """Hold a staging folder (`hold_folder`) while its export runs; on every
    exit, remove it with whatever is left in it, and the folders of `made`
    (those the export created on the way to it) that are still empty.

    Args:
        folder: the staging folder.
        made: the folders the export created, outermost first.

    Yields:
        `folder`.
    """
    held = None
    try:
        held = hold_folder(folder)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if held is not None:
            os.close(held)
        remove_empty(made)


def remove_empty(folders: list[Path]) -> None:
    """Remove the folders an export made, deepest first, where still empty."""
    for folder in sorted(folders, key=lambda path: len(path.parts), reverse=True):
        try:
            folder.rmdir()
        except OSError:  # holds a placed file (or someone else's): kept
            continue


def remove_failed(targets: Targets) -> None:
    """After a successful export, remove what an earlier failed export to the
    same output kept (`Targets.failed`: its file, its int8 copy, its report,
    and the data files only its graph reads), so that no reader takes them
    for current. Best effort: a file that cannot be removed stays.

    Args:
        targets: the successful export's final paths.
    """
    failed = targets.failed()
    kept = data_files_read_by(targets.onnx)
    stale = [failed.onnx, failed.int8, failed.report]
    stale += [data for data in data_files_read_by(failed.onnx) if data not in kept]
    for path in stale:
        try:
            if path.is_file() and not path.is_symlink():
                path.unlink()
        except OSError:
            continue


def lock_path(output: Path) -> Path:
    """The lock file of the exports to `output`: `.NAME.lock` beside it."""
    return output.with_name(f".{output.name}{LOCK_SUFFIX}")


def _still_named(path: Path, descriptor: int) -> bool:
    """Whether `path` still names the file open as `descriptor`."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(descriptor)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _lock(path: Path) -> int:
    """Open and lock `path` (created if missing), and return the descriptor.
    Starts over when `path` no longer names the file it locked: the holder
    before removed it while this one waited."""
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    while True:
        try:
            descriptor = os.open(path, flags, 0o666)
        except OSError as error:
            raise OutputError(
                f"cannot create the lock file {path} ({error.strerror or error}); "
                "remove whatever is there, or make the folder writable"
            ) from error
        try:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                raise OutputError(f"the lock file {path}: is not a regular file; remove it")
            fcntl.flock(descriptor, fcntl.LOCK_EX)  # Ctrl-C interrupts the wait
            if _still_named(path, descriptor):
                return descriptor
        except BaseException:
            os.close(descriptor)
            raise
        os.close(descriptor)


@contextmanager
def output_lock(output: Path) -> Iterator[None]:
    """Hold the lock of the exports to `output` (the module docstring says
    why and for how long): waits while another export holds it, and removes
    the lock file on release, on every exit path.

    Raises:
        OutputError: the lock file cannot be created, or is not a regular file.
    """
    if fcntl is None:
        yield
        return
    path = lock_path(output)
    descriptor = _lock(path)
    try:
        yield
    finally:
        try:
            # Removed while still locked: a waiter on this file starts over.
            # Ours are empty: a file with content at that name is not ours.
            if _still_named(path, descriptor) and os.fstat(descriptor).st_size == 0:
                path.unlink()
        except OSError:
            pass  # left behind: the next export locks, reuses and removes it
        os.close(descriptor)


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(data: dict, path: Path) -> None:
    """Write `data` as indented JSON (for a staged report).

    Args:
        data: the report.
        path: the file to write.

    Raises:
        OutputError: the file cannot be written (a full disk).
    """
    try:
        with open(path, "w") as file:
            json.dump(data, file, indent=2, default=float)
            file.write("\n")
    except OSError as error:
        raise OutputError(
            f"cannot write the report {path} ({error.strerror or error}); "
            "nothing at the output paths was changed"
        ) from error


def _is_graph(staged: Path) -> bool:
    """The pipeline stages its graphs as `model.onnx` and `model.int8.onnx`."""
    return staged.name.endswith(".onnx")


def _check_destination(final: Path) -> None:
    """A final path must be free or hold a file that may be replaced."""
    try:
        info = final.lstat()
    except FileNotFoundError:
        return
    except OSError as error:
        raise OutputError(f"cannot place {final} ({error.strerror or error})") from error
    if stat.S_ISDIR(info.st_mode):
        raise OutputError(
            f"cannot place {final}: a directory is in the way; remove or rename it "
            "and export again (nothing at the output paths was changed)"
        )
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode)):
        raise OutputError(
            f"cannot place {final}: it is not a regular file (a device, FIFO or socket); "
            "remove it and export again (nothing at the output paths was changed)"
        )


def _beside_destinations(
    moves: list[tuple[Path, Path]], copies: list[Path]
) -> list[tuple[Path, Path]]:
    """The moves with every staged file on its destination's file system, so
    that each rename is atomic: a file staged elsewhere (a report on another
    disk) is first copied to a hidden name beside its destination, listed in
    `copies`."""
    result = []
    for staged, final in moves:
        try:
            if os.stat(staged).st_dev != os.stat(final.parent).st_dev:
                handle, copy = tempfile.mkstemp(
                    dir=final.parent, prefix=f".{final.name}.", suffix=STAGING_SUFFIX
                )
                os.close(handle)
                copies.append(Path(copy))
                shutil.copyfile(staged, copy)
                staged = Path(copy)
        except OSError as error:
            raise OutputError(
                f"cannot write {final} ({error.strerror or error}); "
                "nothing at the output paths was changed"
            ) from error
        result.append((staged, final))
    return result


def _mentioned_by_a_graph_beside(data: Path, graphs: list[Path]) -> bool:
    """Whether an ONNX file directly in `data`'s folder, other than `graphs`
    (parsed already), holds `data`'s name: its bytes are searched, not parsed."""
    needle = data.name.encode()
    skipped = {graph.name for graph in graphs if graph.parent == data.parent}
    for entry in data.parent.iterdir():
        if not entry.name.endswith(".onnx") or entry.name in skipped:
            continue
        try:
            if not stat.S_ISREG(entry.lstat().st_mode):
                continue
            with (
                open(entry, "rb") as file,
                mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view,
            ):
                if view.find(needle) >= 0:
                    return True
        except (OSError, ValueError):  # an empty file cannot be mapped, and holds nothing
            continue
    return False


def _ours(data: Path, graphs: list[Path]) -> bool:
    """A regular file directly beside one of our graphs, named after it."""
    try:
        regular = stat.S_ISREG(data.lstat().st_mode)
    except OSError:
        return False
    return regular and any(
        data.parent == graph.parent
        and data.name.startswith(f"{graph.name}.")
        and data.name.endswith(".data")
        for graph in graphs
    )


def _remove_stale_data(old_data: set[Path], graphs: list[Path]) -> None:
    """Remove the data files only the replaced graphs read (the module docstring)."""
    if not old_data:
        return
    still_read = set().union(*(data_files_read_by(g) for g in graphs))
    for stale in sorted(old_data - still_read):
        if _ours(stale, graphs) and not _mentioned_by_a_graph_beside(stale, graphs):
            stale.unlink(missing_ok=True)


def _rename_all(ordered: list[tuple[Path, Path]], graphs: list[Path], old_data: set[Path]):
    """Rename each staged file onto its destination. If one fails, the data
    files placed before it that no graph reads are taken back, and the
    failure is an `OutputError` saying what the output paths hold."""
    mode = 0o666 & ~umask()
    placed = []
    for staged, final in ordered:
        try:
            os.chmod(staged, mode)
            os.replace(staged, final)
        except OSError as error:
            replaced = [path for path in placed if path in graphs]
            read = set().union(old_data, *(data_files_read_by(g) for g in replaced))
            for path in placed:
                if path not in graphs and path.name.endswith(".data") and path not in read:
                    path.unlink(missing_ok=True)
            state = (
                f"{', '.join(map(str, replaced))} already hold the new export"
                if replaced
                else "nothing at the output paths was changed"
            )
            raise OutputError(
                f"cannot place {final} ({error.strerror or error}); {state}"
            ) from error
        placed.append(final)


def place(moves: list[tuple[Path, Path]]) -> None:
    """Rename staged files onto their final paths, data files first.

    Each rename is atomic. A data file is named by its content, so placing it
    never touches the data an older graph reads; the graph is renamed after it,
    so a reader finds either the old graph with its old data or the new graph
    with its new data. Data files that only the replaced graphs read are
    removed last (the module docstring says which). Every placed file gets the
    permissions a new file gets under the user's umask. The pipeline calls it
    under `output_lock`: everything it reads at the output side is read here.

    Args:
        moves: (staged file, final path) pairs.

    Raises:
        OutputError: a destination is a directory or a special file, or a
            staged file cannot be copied beside its destination (nothing is
            changed), or a rename fails (the message says what was placed).
    """
    for _, final in moves:
        _check_destination(final)
    graphs = [final for staged, final in moves if _is_graph(staged)]
    ordered = sorted(moves, key=lambda move: not move[0].name.endswith(".data"))
    copies: list[Path] = []
    try:
        ordered = _beside_destinations(ordered, copies)
        old_data = set().union(*(data_files_read_by(g) for g in graphs if g.exists()))
        _rename_all(ordered, graphs, old_data)
        _remove_stale_data(old_data, graphs)
    finally:
        for copy in copies:
            copy.unlink(missing_ok=True)
