"""Will the export fit in memory? Checked before the expensive work.

Every export takes one path, whatever the model's size: the matrix weights go
to a data file as they are converted, the passes rewrite a graph without them,
and the checks compute Keras' outputs and release the model before ONNX
Runtime maps that file (for models of `LEAN_VALIDATION_BYTES` or more). Its
peak RSS is the libraries' fixed cost plus a multiple of the weights;
`benchmarks/big_model.py` measures both (`benchmarks/results/big_model.json`:
a tiny model's export peaks at 1.43 GB, and every size from 0.1 to 4 GB adds
at most 2.1 times its weights), and `BASELINE_BYTES` and
`PEAK_PER_PARAM_BYTE` are set above them, so that the check refuses only
exports that would surely be killed.

The weights are what the archive declares (`loading.declared_weight_bytes`: the
shapes of model.weights.h5's datasets and of the config's variables, never the
bytes the zip stores), and what is available is the least of three limits
(`limits`): MemAvailable, the cgroup's memory limit, and the address-space
limit (`ulimit -v`). Under the last, what counts is the process's virtual size,
which grows faster than its RSS: TensorFlow's threads and allocators reserve
address space they never touch. Measured on 2 cores with /proc/self/status
(VmSize at the check, after TensorFlow's import: 1.44 GB, RSS 0.58 GB; VmPeak
at the end): an export of a tiny model grows it by 0.75-0.83 GB; with the
thread pools of 16 cores (TF_NUM_INTRAOP_THREADS = TF_NUM_INTEROP_THREADS = 16)
by 1.37 GB, 39 MB a core more (at 64, 2.15 GB: 21 MB a core), hence 48 MB a
core. Over the tiny model's, a 204 MB model's export with its weights in a data
file (the one path, since) grew it by 5.1 times its weights (1.79 GB), a 484 MB
model's by 3.1 times (2.25 GB): `ADDRESS_PER_PARAM_BYTE` is above each (it
overestimates big models, whose ratio falls toward that of the RSS). A tiny
model's export needs a limit of 2.4 GB (`ulimit -v 2000000` fails to import
onnxruntime).
"""

import os
import resource
import stat
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from keras_layers.export.converting import LARGE_MODEL_BYTES
from keras_layers.export.errors import UsageError, fix
from keras_layers.export.loading import declared_weight_bytes, param_bytes
from keras_layers.export.validating import LEAN_VALIDATION_BYTES

PEAK_PER_PARAM_BYTE = 2.5
# What a keras-hub tokenizer's vocabulary costs once Keras loads it, per byte
# of its assets in the archive (Python strings, TensorFlow lookup tables):
# load growth / assets bytes for WordPiece vocabularies of 200,000 and
# 1,000,000 tokens (1.9 and 9.9 MB of assets) measured 118x and 107x.
ASSET_PEAK_PER_BYTE = 120
BASELINE_BYTES = 1_500_000_000  # TensorFlow, Keras, onnxruntime loaded, a tiny model

# The growth of the virtual size from the check to the export's end: a tiny
# model's, each core's threads, and per byte of weights (measured: module docstring).
ADDRESS_PER_PARAM_BYTE = 5.5
# The streamed export of a causal LM into an int4 folder (`genai_folder`):
# the model held in its stored half precision, one weight widened at a time;
# per stored byte (measured: `benchmarks/big_model.py --streamed`).
STREAMED_PEAK_PER_STORED_BYTE = 1.25
STREAMED_ADDRESS_PER_STORED_BYTE = 3.0
ADDRESS_BASELINE_BYTES = 750_000_000
ADDRESS_PER_CORE_BYTES = 48_000_000
# Importing TensorFlow, Keras, tf2onnx and onnxruntime, when the check runs first
# (the command imports them before it): VmSize 14 MB -> 1.53 GB.
ADDRESS_IMPORT_BYTES = 1_550_000_000

_UNLIMITED_CGROUP = 1 << 62  # cgroup v1 writes "no limit" as about 2**63


@dataclass(frozen=True)
class Limit:
    """What one limit leaves the process: `available` bytes, of resident memory
    or (`address_space`) of virtual size; `name` says which limit for the user."""

    name: str
    available: int
    address_space: bool = False


def validates_lean(external: bool, weight_bytes: int) -> bool:
    """Whether the checks compute Keras' outputs first and release the model
    before ONNX Runtime maps the weights, without pre-packing them
    (`pipeline.validate_stage`): for a data file the user gets, and for any
    model of at least `LEAN_VALIDATION_BYTES`, where the two copies would
    otherwise be held at once. Smaller models are checked with the session
    options a user's session has.

    Args:
        external: whether the weights go to a data file.
        weight_bytes: the model's weights, in bytes.

    Returns:
        True where the checks run lean.
    """
    return external or weight_bytes >= LEAN_VALIDATION_BYTES


def uses_external_data(external_data: str, weight_bytes: int) -> bool:
    """Whether the export takes the data-file path.

    Args:
        external_data: `"always"`, `"never"` or `"auto"`.
        weight_bytes: the model's weights, in bytes.

    Returns:
        True for `"always"`, or `"auto"` with weights past `LARGE_MODEL_BYTES`.
    """
    return external_data == "always" or (
        external_data == "auto" and weight_bytes > LARGE_MODEL_BYTES
    )


def _meminfo_available() -> int | None:
    """`MemAvailable` from /proc/meminfo (Linux); None where it cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read_number(path: Path) -> int | None:
    """The integer a cgroup file holds; None for "max", or where unreadable."""
    try:
        text = path.read_text().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _stat_value(path: Path, key: str) -> int:
    """One counter of a cgroup's memory.stat (0 where absent)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_folders(root: Path) -> list:
    """The memory cgroup folders of this process, its own and its ancestors' up
    to the mount, each with the names of its files (limit, usage, reclaimable
    page cache), in cgroup v1's memory controller and v2's unified hierarchy
    (a hybrid system mounts both). Found from /proc/self/cgroup and
    /proc/self/mountinfo."""
    try:
        groups = (root / "proc/self/cgroup").read_text().splitlines()
        mounts = [line.split() for line in (root / "proc/self/mountinfo").read_text().splitlines()]
    except OSError:
        return []
    found = []
    for line in groups:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        v2 = controllers == ""
        if not (v2 or "memory" in controllers.split(",")):
            continue
        for fields in mounts:
            if "-" not in fields[:-2] or len(fields) < 5:
                continue
            fstype, *_, options = fields[fields.index("-") + 1 :]
            if fstype != ("cgroup2" if v2 else "cgroup") or not (
                v2 or "memory" in options.split(",")
            ):
                continue
            mount_root, point = fields[3], root / fields[4].lstrip("/")
            inside = os.path.relpath(path, mount_root) if path.startswith(mount_root) else "."
            folder = point / inside if (point / inside).is_dir() else point
            files = (
                ("memory.max", "memory.current", "inactive_file")
                if v2
                else ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
            )
            chain = [folder, *[p for p in folder.parents if p.is_relative_to(point)]]
            found += [(f, files) for f in chain]
            break
    return found


def cgroup_limit(root: Path = Path("/")) -> Limit | None:
    """What the memory cgroup leaves: the least, over the process's cgroup and
    its ancestors, of the limit less the usage (less the page cache it can
    reclaim, `inactive_file`); None where no limit is set or none can be read.

    Args:
        root: where /proc and /sys are (tests give a fake tree).

    Returns:
        The `Limit`, naming the file that sets it.
    """
    best = None
    for folder, (limit_name, usage_name, cache_name) in _cgroup_folders(root):
        limit = _read_number(folder / limit_name)
        usage = _read_number(folder / usage_name)
        if limit is None or usage is None or limit >= _UNLIMITED_CGROUP:
            continue
        used = max(0, usage - _stat_value(folder / "memory.stat", cache_name))
        left = max(0, limit - used)
        if best is None or left < best.available:
            name = (
                f"the cgroup's memory limit ({folder / limit_name}: "
                f"{limit / 1e9:.1f} GB, {used / 1e9:.1f} GB in use)"
            )
            best = Limit(name, left)
    return best


def _virtual_size() -> int | None:
    """The process's virtual size (VmSize in /proc/self/status), in bytes."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def address_space_limit() -> Limit | None:
    """What `RLIMIT_AS` (`ulimit -v`) leaves: the soft limit less the process's
    virtual size; None without a limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    size = _virtual_size()
    if soft == resource.RLIM_INFINITY or size is None:
        return None
    name = (
        f"the address-space limit (ulimit -v: {soft / 1e9:.1f} GB, "
        f"{size / 1e9:.1f} GB of it mapped)"
    )
    return Limit(name, max(0, soft - size), address_space=True)


def available_bytes() -> int | None:
    """The resident memory the export may take: the least of `MemAvailable` and
    what the cgroup's limit leaves; None where neither can be read."""
    figures = [_meminfo_available()]
    cgroup = cgroup_limit()
    figures.append(cgroup.available if cgroup else None)
    known = [figure for figure in figures if figure is not None]
    return min(known) if known else None


def limits() -> list:
    """Every limit that applies to the export, as `Limit`s: resident memory (the
    least of MemAvailable and the cgroup's limit) and the address space."""
    found = []
    meminfo, cgroup = _meminfo_available(), cgroup_limit()
    resident = available_bytes()
    if resident is not None:
        tight = cgroup is not None and (meminfo is None or cgroup.available <= meminfo)
        name = cgroup.name if tight else "MemAvailable in /proc/meminfo"
        found.append(Limit(name, resident))
    address = address_space_limit()
    if address is not None:
        found.append(address)
    return found


def _address_baseline() -> int:
    """The address space an export takes besides its weights, on this machine."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    imported = "tensorflow" in sys.modules
    return (
        ADDRESS_BASELINE_BYTES
        + ADDRESS_PER_CORE_BYTES * (cores or 1)
        + (0 if imported else ADDRESS_IMPORT_BYTES)
    )


def _refusal(
    limit: Limit, weight_bytes: int, streamed: bool = False, asset_bytes: int = 0
) -> str | None:
    """Why `limit` cannot hold the export, or None where it can."""
    if limit.address_space:
        ratio = STREAMED_ADDRESS_PER_STORED_BYTE if streamed else ADDRESS_PER_PARAM_BYTE
        baseline, what = _address_baseline(), "of address space"
    else:
        ratio = STREAMED_PEAK_PER_STORED_BYTE if streamed else PEAK_PER_PARAM_BYTE
        baseline, what = BASELINE_BYTES, "of memory"
    need = baseline + ratio * weight_bytes + ASSET_PEAK_PER_BYTE * asset_bytes
    if need <= limit.available:
        return None
    assets = (
        f" + {ASSET_PEAK_PER_BYTE}x its {asset_bytes / 1e6:.1f} MB of assets (a tokenizer's "
        "vocabulary)"
        if asset_bytes
        else ""
    )
    return (
        f"exporting this model needs about {need / 1e9:.1f} GB {what} "
        f"({baseline / 1e9:.1f} GB + {ratio}x its {weight_bytes / 1e9:.2f} GB of weights{assets}) "
        f"and {limit.available / 1e9:.1f} GB are available under {limit.name}; free "
        f"memory or raise the limit, or try anyway with {fix('memory_check')}"
    )


def check_fits(weight_bytes: int, streamed: bool = False, asset_bytes: int = 0) -> None:
    """Refuse an export whose estimated peak exceeds the memory available.

    Args:
        weight_bytes: the model's weights, in bytes (as stored, with `streamed`).
        streamed: the estimate of the streamed export of a causal LM into
            an int4 folder (`STREAMED_PEAK_PER_STORED_BYTE`).
        asset_bytes: the archive's assets (`archive_asset_bytes`), each byte
            counted `ASSET_PEAK_PER_BYTE` times.

    Raises:
        UsageError: the estimate exceeds what a limit leaves (exit 2); the
            message gives both figures, the limit, and the flag that skips the
            check.
    """
    for limit in limits():
        reason = _refusal(limit, weight_bytes, streamed, asset_bytes)
        if reason is not None:
            raise UsageError(reason)


def archive_weight_bytes(path: Path, stored: bool = False) -> int:
    """The weights a `.keras` archive declares (`loading.declared_weight_bytes`),
    or, where its weights file cannot be read, the sizes its zip directory gives.

    Args:
        path: the archive.
        stored: count half-precision weights at their own 2 bytes.

    Returns:
        The bytes.
    """
    declared = declared_weight_bytes(path, stored)
    if declared is not None:
        return declared
    with zipfile.ZipFile(path) as archive:
        return sum(item.file_size for item in archive.infolist() if item.filename.endswith(".h5"))


def archive_asset_bytes(model) -> int:
    """The bytes of a `.keras` archive's assets (a tokenizer's vocabulary),
    as its zip directory gives them; 0 for a model in memory (its assets are
    loaded already) or a file that is not an archive (loading says why).

    Args:
        model: the model, or its path.

    Returns:
        The bytes.
    """
    if not isinstance(model, str | os.PathLike):
        return 0
    try:
        if not stat.S_ISREG(os.stat(model).st_mode):
            return 0
        with zipfile.ZipFile(model) as archive:
            entries = archive.infolist()
    except (OSError, zipfile.BadZipFile):
        return 0
    return sum(item.file_size for item in entries if item.filename.startswith("assets/"))


def estimated_param_bytes(model, stored: bool = False) -> int:
    """The weights' bytes of a model in memory or of a `.keras` path.

    Args:
        model: the model, or its path.
        stored: count half-precision weights at their own 2 bytes, not
            widened to float32.

    Returns:
        The bytes (0 where loading will refuse it and say why).

    Raises:
        ModelLoadError: the archive's weights file is refused (a size bomb, a
            link to another file: `loading.declared_weight_bytes`).
    """
    if isinstance(model, str | os.PathLike):
        try:
            if not stat.S_ISREG(os.stat(model).st_mode):
                return 0  # a FIFO or device is never opened here: loading refuses it
            return archive_weight_bytes(Path(model), stored)
        except (OSError, zipfile.BadZipFile):
            return 0  # not readable as an archive: loading will say why
    if not hasattr(model, "weights"):
        return 0  # not a model: loading will say so
    return param_bytes(model, stored)
