"""A genai folder placed as one set: FOLDER shows the last export or the new one, never a mix.

A folder export writes several files that only make sense together (the
decoder, its data, `genai_config.json`, the tokenizer files, `report.json`,
`int4/`), and a reader (onnxruntime-genai, `generate`) reads them one by one.
Renaming them in one at a time cannot keep them together: a SIGKILL between
two renames, or one rename that fails, leaves the new decoder beside the old
config. So every file of an export lives in one folder of the export's store,
and what FOLDER shows is chosen by one link:

    FOLDER/
      .keras-layers/                 the store
        current -> version-1a2b3c4d  the one link that says which export FOLDER shows
        version-1a2b3c4d/            every file of that export
        staging-XXXXXXXX/            a running export's files (held with a lock)
      model.onnx -> .keras-layers/current/model.onnx
      genai_config.json -> .keras-layers/current/genai_config.json
      int4 -> .keras-layers/current/int4
      ...                            one link per file or folder of the export
      notes.txt                      anything else: not the export's, never touched

The export's entries of FOLDER are the links whose target is
`.keras-layers/current/` followed by their own name (`is_ours`); the current
version's listing is the manifest of what the export wrote. A link whose
name the current version lacks leads nowhere, and to every reader the file
is absent. Readers follow the links (a copy with `cp -rL` or `rsync -L` holds
plain files).

`place_folder` places a staged export, under the export's lock:

1. a link for each new name, made before the switch, leading nowhere until
   it. An entry at a new name that is not one of the links (the real files of
   an export written before the store, or a file of the user's with one of
   the export's names) is first copied into the current version (hard links
   where the file system allows) and then replaced by its link, one atomic
   rename each (an atomic exchange for a folder, where the system has one):
   a reader reads the same bytes before and after;
2. the staged folder renamed into the store, as a version;
3. the switch: a new `current` link renamed onto the old one. Up to this
   rename FOLDER shows the old export; from it on, the new one;
4. clean-up: the links of names only the old export had (leading nowhere
   now) and the old version are removed.

A SIGKILL at any instant leaves the old set or the new one; what steps 1, 2
and 4 had made (links leading nowhere, a version no link names) is removed
by the next placement. A step before 3 that fails takes back what 1 and 2
made and raises `OutputError` (exit 2): FOLDER is as it was. An export
written before the store leaves real files: a `report.json` of ours names
them (`_older_export`), and they are copied in by step 1 like the rest, so
that the switch removes those the new export does not write.
"""

import ctypes
import ctypes.util
import errno
import json
import os
import secrets
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from keras_layers.export import placement
from keras_layers.export.errors import OutputError, argument

STORE = ".keras-layers"
CURRENT = "current"
VERSION_PREFIX = "version-"
STAGING_PREFIX = "staging-"
# The name whose lock (`placement.output_lock`) placements take: the one
# exports before the store took, so that the two never place at once.
LOCKED_NAME = "model.onnx"
# Names an export written before the store placed (`_older_export`).
_OLDER_FILES = (
    "model.onnx",
    "genai_config.json",
    "report.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
_OLDER_FOLDERS = ("int4", "int8")


def link_target(name: str) -> str:
    """What the export's link for `name` in FOLDER says: through `current`."""
    return f"{STORE}/{CURRENT}/{name}"


def is_ours(entry: Path) -> bool:
    """Whether an entry of FOLDER is one of the export's links.

    Args:
        entry: a path directly in FOLDER.

    Returns:
        True for a link whose target is `.keras-layers/current/<its name>`.
    """
    try:
        return os.readlink(entry) == link_target(entry.name)
    except OSError:  # absent, or not a link
        return False


def _lexists(path: Path) -> bool:
    return os.path.lexists(path)


def _kind_in_the_way(entry: Path, folder_wanted: bool) -> str | None:
    """Why `entry` (not ours) cannot give way to the export's file or folder,
    or None: a folder goes where a folder (or nothing) is, a file where a
    file is; a link leading nowhere is nothing."""
    if not _lexists(entry) or is_ours(entry) or not os.path.exists(entry):
        return None
    mode = os.stat(entry).st_mode
    if folder_wanted:
        return None if stat.S_ISDIR(mode) else "is a file"
    if stat.S_ISDIR(mode):
        return "is a directory"
    if not stat.S_ISREG(mode):
        return "is not a regular file (a device, FIFO or socket)"
    return None


def check_names(folder: Path, files: list[str], folders: list[str]) -> None:
    """Fail before any work where FOLDER cannot take the export's entries.

    Args:
        folder: the folder.
        files: the names the export will place as files.
        folders: the names it will place as folders (`int4`).

    Raises:
        OutputError: the store's name is taken by something else, or an
            entry at one of the names is of the other kind (a file at
            `int4`, a directory at `model.onnx`) or a special file.
    """
    store = folder / STORE
    if _lexists(store) and (store.is_symlink() or not store.is_dir()):
        raise OutputError(
            f"{argument('folder', folder)}: {store} is not a folder; the export keeps its files "
            "there: remove or rename it"
        )
    wanted = [(name, False) for name in files] + [(name, True) for name in folders]
    for name, folder_wanted in wanted:
        why = _kind_in_the_way(folder / name, folder_wanted)
        if why:
            kind = "folder" if folder_wanted else "file"
            raise OutputError(
                f"{argument('folder', folder)}: {folder / name} {why}, where the export's "
                f"{name} {kind} goes; remove or rename it (nothing in the folder was changed)"
            )


@contextmanager
def staging(folder: Path) -> Iterator[Path]:
    """A private folder in FOLDER's store for an export's files, held while
    the export runs and removed with whatever is left in it. FOLDER, the
    folders on the way to it and the store, where this made them, are
    removed again if nothing was placed (a failed export creates nothing).

    Args:
        folder: the export's folder.

    Yields:
        The staging folder.

    Raises:
        OutputError: FOLDER or its store cannot be created.
    """
    store = folder / STORE
    made = [path for path in (*reversed(folder.parents), folder, store) if not path.exists()]
    try:
        store.mkdir(parents=True, exist_ok=True)
        _remove_stale_staging(store)
        staged = Path(tempfile.mkdtemp(dir=store, prefix=STAGING_PREFIX))
    except OSError as error:
        placement.remove_empty(made)
        raise OutputError(
            f"{argument('folder', folder)}: cannot create {store} ({error.strerror or error})"
        ) from error
    try:  # asked now, not after the export: the placement is made of links
        probe = _temporary_name(store, "link-")
        os.symlink(".", probe)
        probe.unlink()
    except OSError as error:
        shutil.rmtree(staged, ignore_errors=True)
        placement.remove_empty(made)
        raise OutputError(
            f"{argument('folder', folder)}: its file system takes no symbolic links "
            f"({error.strerror or error}), which the folder's placement is made of; export to "
            "a folder on another file system, then copy it with `cp -rL`"
        ) from error
    with placement.holding(staged, made):
        yield staged


def _remove_stale_staging(store: Path) -> None:
    """Remove the staging folders of killed exports: idle an hour, and not
    held by a running one."""
    for entry in store.iterdir():
        if not entry.name.startswith(STAGING_PREFIX):
            continue
        try:
            info = entry.lstat()
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and time.time() - info.st_mtime > placement.STALE_SECONDS:
            placement.remove_unless_held(entry)


def _temporary_name(store: Path, prefix: str) -> Path:
    return store / f"{prefix}{secrets.token_hex(4)}"


def _new_link(store: Path, target: str, final: Path) -> None:
    """Make the link `final` -> `target` in one step: made in the store under
    a temporary name, then renamed onto `final` (replacing a file there)."""
    made = _temporary_name(store, "link-")
    os.symlink(target, made)
    try:
        os.replace(made, final)
    except OSError:
        made.unlink(missing_ok=True)
        raise


def _current(store: Path) -> Path | None:
    """The version `current` names, or None."""
    try:
        target = os.readlink(store / CURRENT)
    except OSError:
        return None
    version = store / target
    return version if "/" not in target and version.is_dir() else None


def _sweep(folder: Path, store: Path) -> None:
    """Remove what killed or failed placements left (the module docstring):
    store entries that are neither `current`, its version nor a staging
    folder, and links of ours leading nowhere. Nothing a reader sees changes.
    Best effort: what cannot be removed stays for the next placement."""
    current = _current(store)
    for entry in store.iterdir():
        name = entry.name
        if name == CURRENT or name.startswith(STAGING_PREFIX) or entry == current:
            continue
        _remove(entry)
    for entry in folder.iterdir():
        if is_ours(entry) and not os.path.exists(entry):
            _remove(entry)


def _remove(entry: Path) -> None:
    try:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    except OSError:
        pass


def _older_export(folder: Path) -> list[str]:
    """The names an export written before the store placed in FOLDER as
    real files, where its `report.json` (a causal-lm folder report) is: the
    names such an export writes, and the data files named after its decoder."""
    report_path = folder / "report.json"
    if is_ours(report_path) or not report_path.is_file() or report_path.is_symlink():
        return []
    try:
        report = json.loads(report_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(report, dict) or report.get("task") != "causal-lm" or "folder" not in report:
        return []
    names = [name for name in (*_OLDER_FILES, *_OLDER_FOLDERS) if _lexists(folder / name)]
    names += [
        entry.name  # its data files, named after the decoder (`placement.data_name`)
        for entry in folder.iterdir()
        if entry.name.startswith("model.onnx.") and entry.name.endswith(".data")
    ]
    return [name for name in names if not is_ours(folder / name)]


def _copy_entry(source: Path, target: Path) -> None:
    """`source` (a file, a folder, or a link to one) as `target`, by hard
    links where the file system allows (the same bytes, no copy), else copied."""

    def link_or_copy(src, dst):
        try:
            os.link(src, dst, follow_symlinks=True)
        except OSError:
            shutil.copy2(src, dst)

    if os.path.isdir(source):
        shutil.copytree(source, target, copy_function=link_or_copy)
    else:
        link_or_copy(source, target)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux `renameat2(RENAME_EXCHANGE)`, macOS
    `renamex_np(RENAME_SWAP)`).

    Returns:
        True when swapped; False where the system or the file system has no
        such call.

    Raises:
        OSError: the call exists and failed (a permission, a busy path).
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    source, target = os.fsencode(a), os.fsencode(b)
    if sys.platform.startswith("linux") and hasattr(libc, "renameat2"):
        at_fdcwd, exchange = -100, 2
        failed = libc.renameat2(at_fdcwd, source, at_fdcwd, target, exchange) != 0
    elif sys.platform == "darwin" and hasattr(libc, "renamex_np"):
        failed = libc.renamex_np(source, target, 2) != 0  # RENAME_SWAP
    else:
        return False
    if not failed:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _adopt(folder: Path, store: Path, name: str) -> None:
    """Put FOLDER/`name`, a real entry, into the current version and replace
    it by the export's link: a reader reads the same bytes before and after
    (step 1 of the module docstring)."""
    entry = folder / name
    version = _current(store)
    if version is None:  # none yet: an empty one, which no link leads through
        version = _temporary_name(store, VERSION_PREFIX)
        version.mkdir()
        _new_link(store, version.name, store / CURRENT)
    copy = _temporary_name(store, "adopted-")
    _copy_entry(entry, copy)
    _remove(version / name)  # a stale copy, where a real entry had replaced its link
    os.replace(copy, version / name)
    if not os.path.isdir(entry) or entry.is_symlink():
        _new_link(store, link_target(name), entry)
        return
    link = _temporary_name(store, "link-")
    os.symlink(link_target(name), link)
    if not _exchange(link, entry):
        # No exchange: a moment without FOLDER/name (the module docstring).
        os.replace(entry, _temporary_name(store, "adopted-"))
        os.replace(link, entry)
        return
    shutil.rmtree(link, ignore_errors=True)  # the old folder, now at the link's name


def _set_permissions(root: Path) -> None:
    """Files and folders as new ones get them under the user's umask (the
    staging folder is private)."""
    mask = placement.umask()
    os.chmod(root, 0o777 & ~mask)
    for path in root.rglob("*"):
        if path.is_symlink():
            continue
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def place_folder(staged: Path, folder: Path) -> None:
    """Place the export staged in `staged` (a folder in FOLDER's store,
    `staging`) as FOLDER's files, replacing the last export's as one set
    (the module docstring says how).

    Args:
        staged: the staged export: its entries are the export's files.
        folder: FOLDER.

    Raises:
        OutputError: an entry at one of the names is of the other kind or a
            special file, or a step before the switch fails; FOLDER is then
            as it was.
    """
    store = folder / STORE
    names = sorted(entry.name for entry in staged.iterdir() if not entry.name.startswith("."))
    with placement.output_lock(folder / LOCKED_NAME):
        files = [name for name in names if not (staged / name).is_dir()]
        check_names(folder, files, [name for name in names if name not in files])
        _sweep(folder, store)
        made = []  # the links step 1 made, leading nowhere until the switch
        version = _temporary_name(store, VERSION_PREFIX)
        try:
            # The older export's report last: while it is a real file, the
            # next placement still knows the older files not yet adopted.
            adopted = sorted(
                {*names, *_older_export(folder)}, key=lambda n: (n == "report.json", n)
            )
            for name in adopted:
                entry = folder / name
                if is_ours(entry):
                    continue
                if os.path.exists(entry):  # a real entry, or a link to one
                    _adopt(folder, store, name)
                    continue
                current = _current(store)
                if current is not None:  # no link leads to it: one would bring it back
                    _remove(current / name)
                _new_link(store, link_target(name), entry)
                made.append(entry)
            _set_permissions(staged)
            os.replace(staged, version)
            old = _current(store)
            _new_link(store, version.name, store / CURRENT)  # the switch
        except OSError as error:
            for entry in made:
                _remove(entry)
            _remove(version)
            where = f" at {error.filename}" if error.filename else ""
            raise OutputError(
                f"cannot place the export in {folder} ({error.strerror or error}{where}); "
                "nothing in the folder was changed"
            ) from error
        for entry in folder.iterdir():
            if is_ours(entry) and entry.name not in names:
                _remove(entry)
        if old is not None:
            _remove(old)
