"""Backup and restore of a running machine's SRAM devices to an image on host disk.

:func:`backup` freezes the owners of the selected devices at an exchange point
(``_backup_freeze``), writes their bytes straight from SRAM into an image
(``_image.write_image``: atomic, verified format), and releases them. Every device is
copied at one point in time, with no filesystem operation in flight and nothing held back
in memory (pending mtimes, the chip disk's write-behind cache), and tile disks are hashed
and written where they lie in SRAM: no second copy of them is made.

:func:`restore` never leaves a machine half-restored. In order, touching nothing before
the last step:

1. open the image and check its structure (``_image``: magic, version, checksums, bombs);
2. check its geometry against the machine (preset, tiles, disk and block sizes) and that
   it holds a device for every tile asked for;
3. read and verify every byte into scratch memory (``Image.read_all``: all or nothing),
   meanwhile faulting in the SRAM pages the restore will fill (which changes no byte);
4. mount every device's filesystem there as its digest checks out (littlefs' mount walks
   every metadata pair), unmount, and check that doing so wrote nothing;
5. freeze the target tiles; a tile refuses if it runs a program or has files open, and
   then all are released as they were; the chip tile writes the chip disk's cache back
   before it holds, so no write-back of the old filesystem lands on the new bytes;
6. write the devices into SRAM and release the owners, each of which drops its old mounts
   without writing, so the new bytes are mounted on first use; a device that is blank in
   the image (its tile never used storage) leaves the tile blank, formatted on first use.

``--tiles`` and the chip disk: the chip disk belongs to the chip tile (tile 0), which
mounts it, so it goes with tile 0: ``backup --tiles 5-9`` holds five tile disks,
``--tiles 0`` tile 0's disk and the chip disk. ``restore`` restores what the image holds,
or, with ``--tiles``, that subset of it (the image must hold every device asked for).

Unsaved state (``halt --if-saved``): each machine remembers the digest of every device as
of the last backup or restore that covered it. :func:`unsaved` freezes the machine's
owners, hashes the devices of tiles whose storage is up (no other device can have changed:
only a tile whose storage is up writes its devices) and names those that differ, or, for
a device no backup or restore ever covered, those that hold any file. A file open with
writes littlefs has not committed (they are in the open file, on no device) makes its
device unsaved too, and a backup lists such files: the image holds them as last committed.

RAM disks (``mount --ram``) are scratch space, none of the machine's devices: no image
holds them, and a backup says so. Files on one count as unsaved, since halting loses them;
a restore leaves them mounted as they are (``Storage.forget``).
"""

from __future__ import annotations

import functools
import os
import stat
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ._backup_devices import CHIP, GEOMETRY_KEYS, Device, Residency, machine_devices, machine_meta, prefault
from ._backup_freeze import (FilesOpen, Freeze, FreezeCancelled, FreezeRefused, prepare_backup, prepare_restore,
                             running_jobs)
from ._image import FORMAT_VERSION, MAGIC, DeviceSnapshot, ImageError, device_digest, open_image, write_image
from ._plural import plural
from ._presets import PRESETS, ipus_in_range
from ._safepath import directory_problem
from ._diskwords import disks_of, times_alike
from ._tilespec import describe_tiles, format_tiles, parse_tiles, tiles_alike
from .blockdev import Filesystem, MemoryDevice, check_mounts

__all__ = ["BackupError", "Cancelled", "DIGEST", "Unsaved", "backup", "restore", "unsaved", "unsaved_state",
           "image_geometry_problems", "check_destination", "image_destination"]

#: the digest backups are written with: blake3 hashes ~4x faster than sha256 here
DIGEST = "blake3"
#: zstd level: 1 is zstd's fastest positive level; incompressible slots skip it (probes)
LEVEL = 1
#: how long ``halt --if-saved`` waits for busy tiles before it refuses (it cannot tell)
UNSAVED_WAIT = 10.0

#: progress(phase, done, total) with phases "waiting" (for tiles to reach an exchange
#: point), "queued" (for another backup, restore or check to let tiles go), "writing",
#: "reading", "checking", "restoring"; ``total`` may be None
Progress = Callable[[str, int, "int | None"], None]


class BackupError(Exception):
    """A backup or restore that cannot be done; the message is for the user."""


class TilesInUse(BackupError):
    """A restore refused because tiles are in use; ``files_open_on``: the tiles refused
    because files are open on them (the caller may know who holds them)."""

    def __init__(self, message: str, files_open_on: list[int]):
        super().__init__(message)
        self.files_open_on = files_open_on


class Cancelled(BackupError):
    """Cancelled (Ctrl-C) before anything was changed."""


# -- unsaved-state baselines -------------------------------------------------------------------


class _Baseline:
    """Per machine: device name -> (digest algorithm, chunk size, digest, image) as of the
    last backup or restore that covered it; ``image`` is that image file's identity (see
    _image_file): a device saved only in an image deleted or overwritten since is saved
    nowhere."""

    def __init__(self):
        self.lock = threading.Lock()
        self.digests: dict[str, tuple[str, int, str, tuple]] = {}

    def record(self, algo: str, chunk_size: int, digests: dict[str, str], path: str) -> None:
        image = _image_file(path)
        with self.lock:
            for name, digest in digests.items():
                self.digests[name] = (algo, chunk_size, digest, image)

    def get(self, name: str):
        with self.lock:
            return self.digests.get(name)


def _image_file(path: str) -> tuple:
    """(path, device, inode, size, mtime) of the image file at ``path``: another file put
    there, or this one changed in place, has another."""
    path = os.path.abspath(path)
    try:
        info = os.stat(path)
    except OSError:
        return (path, time.monotonic_ns())  # (equal to no other: a missing image is no copy)
    return (path, info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


_baselines: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_baselines_lock = threading.Lock()


def _baseline(machine) -> _Baseline:
    with _baselines_lock:
        base = _baselines.get(machine)
        if base is None:
            base = _baselines[machine] = _Baseline()
        return base


# -- selecting devices -------------------------------------------------------------------------


def _select(machine, tiles) -> tuple[list[int], list[Device]]:
    tile_ids = parse_tiles(tiles, machine.ntiles)  # TileSpecError for a bad spec
    wanted = set(tile_ids)
    return tile_ids, [d for d in machine_devices(machine) if d.owner in wanted]


def _describe(devices: list[Device]) -> str:
    disks = [d.owner for d in devices if d.name != CHIP]
    parts = []
    if disks:
        parts.append(f"{plural(len(disks), 'tile disk')} ({format_tiles(disks)})")
    if any(d.name == CHIP for d in devices):
        parts.append("the chip disk")
    return " and ".join(parts) or "no devices"


def _why(exc: Exception) -> str:
    """`` (reason)`` of a FreezeCancelled, or nothing when the user cancelled (Ctrl-C)."""
    return f" ({exc})" if str(exc) else ""


def _waiting_note(progress: Progress | None):
    """Tells the progress display how many tiles have yet to reach an exchange point."""
    if progress is None:
        return None

    def waiting(tiles: list[int], elsewhere: bool = False) -> None:
        if tiles:
            progress("queued" if elsewhere else "waiting", 0, len(tiles))

    return waiting


# -- backup ------------------------------------------------------------------------------------


def backup(machine, path, tiles=None, *, name: str | None = None, level: int | None = LEVEL,
           digest: str = DIGEST, progress: Progress | None = None,
           cancelled: threading.Event | None = None) -> dict:
    """Write an image of the devices of ``tiles`` (default all; see the module doc) to
    ``path`` atomically; return the image's summary. Raises BackupError (Cancelled if
    ``cancelled`` is set before the image is complete: the old file at ``path`` stays)."""
    path = image_destination(path)
    check_destination(path)
    tile_ids, devices = _select(machine, tiles)
    started = time.perf_counter()
    owners = sorted({d.owner for d in devices})
    with Freeze(machine, owners, "backup", prepare=prepare_backup) as freeze:
        try:
            freeze.hold(cancelled, _waiting_note(progress))
        except FreezeCancelled as exc:
            raise Cancelled(f"backup cancelled{_why(exc)}; {path} was not written") from None
        except FreezeRefused as exc:
            raise BackupError(f"cannot back up: {exc}; {path} was not written") from None
        frozen_at = time.time()
        residency = Residency.of(machine.sram)
        snapshots = (_snapshot(d, freeze.states[d.owner], residency) for d in devices)
        total = sum(d.length for d in devices)

        def writing(done: int, _total) -> None:
            if cancelled is not None and cancelled.is_set():
                raise Cancelled(f"backup cancelled; {path} was not written")
            if progress is not None:
                progress("writing", done, total)

        meta = machine_meta(machine, tile_ids, name)
        meta["taken"] = frozen_at
        try:
            summary = write_image(path, meta, snapshots, level=level, digest=digest,
                                  stable=True, progress=writing)
        except OSError as exc:
            raise BackupError(f"cannot write {path}: {exc.strerror or exc}") from None
        uncommitted = _uncommitted(devices, freeze)
    _baseline(machine).record(digest, summary["chunk_size"], summary["digests"], path)
    summary["uncommitted"] = [{"tile": tile, "path": path}
                              for tile, paths in _open_files_by_tile(uncommitted).items() for path in paths]
    summary["left_out"] = [{"tile": tile, "path": mount, "kind": kind}
                           for (tile, mount), (kind, _) in sorted(freeze.unimaged.items())]
    summary["times_left_out"] = [{"tile": tile, "path": mount, "files": count}
                                 for (tile, mount), count in sorted(freeze.unwritten_times.items())]
    summary["description"] = _describe(devices)  # ("devices" is image info's list)
    summary["seconds"] = time.perf_counter() - started
    return summary


def _snapshot(device: Device, state: str, residency) -> DeviceSnapshot:
    # a blank tile never used its storage: its SRAM is all zeros, nothing to read
    data, nonzero = (None, None) if state == "blank" else device.read(residency)
    return DeviceSnapshot(device.name, device.image_tile, device.mount, device.block_size,
                          device.block_count, data, nonzero)


_FILE_KINDS = {stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
               stat.S_IFBLK: "a block device"}


def image_destination(path) -> str:
    """The file a backup to ``path`` writes: absolute, and if ``path`` is a symbolic link,
    the file it names (the image replaces that file, as cp writes it)."""
    path = os.path.abspath(os.fspath(path))
    return os.path.realpath(path) if os.path.islink(path) else path


def check_destination(path: str) -> None:
    """BackupError if an image cannot be written at ``path`` (absolute): what can be known
    before anything is stopped or frozen."""
    directory = os.path.dirname(path)
    problem = directory_problem(directory)
    if problem:
        raise BackupError(f"cannot write {path}: {problem}")
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # a name too long, a loop of symbolic links, no permission
        raise BackupError(f"cannot write {path}: {exc.strerror or exc}") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise BackupError(f"cannot write {path}: it is a directory")
    if mode is not None and not stat.S_ISREG(mode):
        # (a socket there may be a machine's own: replaced, its daemon could not be reached)
        raise BackupError(f"cannot write {path}: it exists and is not a regular file "
                          f"({_FILE_KINDS.get(stat.S_IFMT(mode), 'a special file')}); an image only replaces a file")
    problem = _replacing_problem(path, mode) if mode is not None else None
    if problem:
        raise BackupError(f"cannot write {path}: it exists and {problem} (a backup replaces the "
                          "file); remove it first or choose another name")
    if os.statvfs(directory).f_flag & os.ST_RDONLY:
        raise BackupError(f"cannot write {path}: {directory} is on a read-only filesystem")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise BackupError(f"cannot write {path}: no permission to create files in {directory}")


#: the highest header version taken for a newer ipuos's image rather than for damage
_NEWER_VERSIONS_MAX = 255


def _replacing_problem(path: str, mode: int) -> str | None:
    """Why the file at ``path`` (of ``mode``) must not be replaced by a backup, or None: it
    may be if it is empty or an image this ipuos writes (a typo must not turn a program
    or a document into an image, nor lose a newer ipuos's backup this one cannot even
    read), and not made read-only (as a kept image is guarded: the image is written
    beside the file and renamed over it, which its mode alone would not stop)."""
    if not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        return f"is read-only (mode {stat.S_IMODE(mode):04o})"
    try:
        with open(path, "rb") as f:
            start = f.read(len(MAGIC) + 2)
    except OSError as exc:
        try:
            empty = os.stat(path).st_size == 0
        except OSError:
            empty = False
        # (one that cannot be read cannot be told from a document)
        return None if empty else f"cannot be read to tell whether it is an ipuos image ({exc.strerror or exc})"
    if not start:
        return None
    if not start.startswith(MAGIC):
        return "is not an ipuos image"
    version = int.from_bytes(start[len(MAGIC):], "little") if len(start) == len(MAGIC) + 2 else 0
    # (format versions count up one at a time: a huge one is damage, and a damaged image
    # is worth nothing to keep)
    if FORMAT_VERSION < version <= _NEWER_VERSIONS_MAX:
        return (f"is an image of format version {version}, written by a newer ipuos (this one "
                f"reads and writes version {FORMAT_VERSION})")
    return None


# -- restore -----------------------------------------------------------------------------------


def image_geometry_problems(meta: dict, machine) -> list[str]:
    """How the machine an image was taken on differs from ``machine`` (empty: alike)."""
    ours = machine_meta(machine, [])
    return [f"{key} {meta.get(key)!r} (this machine: {ours[key]!r})"
            for key in GEOMETRY_KEYS if meta.get(key) != ours[key]]


def _bootable(meta: dict) -> bool:
    """Whether ``ipuos boot --restore`` (the image's preset and IPUs, the default layout)
    starts a machine the image fits: not for a preset this ipuos lacks, nor for a machine
    made through the Python API with a geometry of its own."""
    preset, ipus = PRESETS.get(meta.get("preset")), meta.get("ipus")
    if preset is None or not ipus_in_range(ipus) or meta.get("chip_tile") != 0:
        return False
    return all(meta.get(key) == getattr(preset, key) for key in GEOMETRY_KEYS if hasattr(preset, key))


def _tiles_in_use(refused: FreezeRefused) -> "TilesInUse":
    return TilesInUse(f"cannot restore while tiles are in use: {refused}; nothing was restored",
                      [tile for tile, why in refused.reasons.items() if isinstance(why, FilesOpen)])


def restore(machine, path, tiles=None, *, name: str | None = None,
            progress: Progress | None = None, cancelled: threading.Event | None = None) -> dict:
    """Restore ``machine``'s devices from the image at ``path``: everything it holds, or
    those of ``tiles``. All checks come before any tile is touched (see the module doc)."""
    path = os.path.abspath(os.fspath(path))
    started = time.perf_counter()
    machine_name = f"machine {name!r}" if name else "this machine"
    try:
        # (any machine's image opens: its geometry is checked against this machine next,
        # so an image of a bigger one is refused as that, not as a decompression bomb)
        image = open_image(path, verify=False)
    except ImageError as exc:
        raise BackupError(f"{exc}; nothing was restored") from None
    with image:
        problems = image_geometry_problems(image.meta, machine)
        if not problems and image.device_bytes > machine.sram.nbytes:
            problems = [f"its devices hold {image.device_bytes} bytes (this machine's SRAM: "
                        f"{machine.sram.nbytes})"]
        if problems:
            if _bootable(image.meta):
                hint = (f"`ipuos boot --restore {path} --name NEW` (no --preset or --ipus) starts "
                        "a machine like it")
            else:
                hint = ("this ipuos cannot start a machine like it (`ipuos image extract` copies its "
                        "files out without one)")
            raise BackupError(f"image {path} was taken on another kind of machine: {'; '.join(problems)}. "
                              f"Nothing was restored; {hint}")
        devices = {d.name: d for d in machine_devices(machine)}
        entries = {e.name: e for e in image.devices}
        strangers = [n for n in entries if n not in devices]
        if strangers:
            raise BackupError(f"image {path} holds device {strangers[0]!r}, which {machine_name} "
                              "does not have; nothing was restored")
        if tiles is None:
            selected = [d for d in devices.values() if d.name in entries]
        else:
            wanted = set(parse_tiles(tiles, machine.ntiles))
            selected = [d for d in devices.values() if d.owner in wanted]
            missing = [d for d in selected if d.name not in entries]
            if missing:
                raise BackupError(
                    f"image {path} has no copy of {_describe(missing)}; it holds "
                    f"{_describe([devices[n] for n in entries])}; nothing was restored")
        for d in selected:
            e = entries[d.name]
            if (e.block_size, e.block_count) != (d.block_size, d.block_count):
                raise BackupError(
                    f"image {path}: device {d.name!r} has {e.block_count} blocks of {e.block_size} "
                    f"bytes, but on {machine_name} it has {d.block_count} of {d.block_size}; "
                    "nothing was restored")
        busy = running_jobs(machine, {d.owner for d in selected})
        if busy is not None:
            raise _tiles_in_use(busy)
        blank = {d.name: not entries[d.name].chunks for d in selected}
        _check_chip_tile(selected, blank, path)
        total = sum(d.length for d in selected)
        stored = {d.name: [(c.offset, c.length) for c in entries[d.name].chunks] for d in selected}
        # the SRAM pages the restore will fill are faulted in meanwhile (no byte changes)
        faulting = threading.Thread(target=prefault, args=(selected, stored), daemon=True,
                                    name="ipuos-restore-prefault")
        faulting.start()

        def reading(done: int, _total) -> None:
            if cancelled is not None and cancelled.is_set():
                raise Cancelled("restore cancelled; nothing was restored")
            if progress is not None:
                progress("reading", done, image.device_bytes)

        wanted = {d.name: d for d in selected if not blank[d.name]}

        def checked(entry, device_bytes) -> None:  # as each device's digest checks out
            device = wanted.get(entry.name)
            if device is not None:
                _mount_in_scratch(path, device, device_bytes)

        try:
            data = image.read_all(progress=reading, checked=checked)
        except ImageError as exc:
            raise BackupError(f"{exc}; nothing was restored") from None
        finally:
            faulting.join()
        digests = {d.name: entries[d.name].digest for d in selected}
        algo, chunk_size = image.digest_algorithm, image.chunk_size

    restored_owner: dict[int, bool] = {}
    for d in selected:
        restored_owner[d.owner] = restored_owner.get(d.owner, False) or not blank[d.name]
    storage = machine.storage

    def forget(tile) -> None:
        storage.forget(tile, restored=restored_owner[tile.id])

    owners = sorted(restored_owner)
    freeze = Freeze(machine, owners, "restore", prepare=prepare_restore, after=forget)
    try:
        freeze.hold(cancelled, _waiting_note(progress))
    except FreezeCancelled as exc:
        raise Cancelled(f"restore cancelled{_why(exc)}; nothing was restored") from None
    except FreezeRefused as exc:
        raise _tiles_in_use(exc) from None
    try:
        if progress is not None:
            progress("restoring", 0, total)
        residency = Residency.of(machine.sram)
        # one thread: measured here, two copying at once are slower (memory bandwidth)
        for d in selected:
            d.write(None if blank[d.name] else data[d.name], stored[d.name], residency)
        if progress is not None:
            progress("restoring", total, total)
    finally:
        # from the first byte written, the old mounts are stale whatever happens
        freeze.release(commit=True)
    problems = freeze.wait_released()
    if problems:
        raise BackupError(f"the devices were restored, but {FreezeRefused(problems)}; "
                          "restart the machine if those tiles misbehave")
    _baseline(machine).record(algo, chunk_size, digests, path)
    return {
        "path": path,
        "description": _describe(selected),
        "device_count": len(selected),
        "blank": sum(blank.values()),
        "device_bytes": total,
        "image_digest": image.image_digest,
        "seconds": time.perf_counter() - started,
    }


def _check_chip_tile(selected: list[Device], blank: dict[str, bool], path: str) -> None:
    """The chip tile formats or mounts its disk and the chip disk together, so an image
    must have both or neither blank (a real backup always does)."""
    chip = [d for d in selected if d.name == CHIP]
    if not chip:
        return
    disk = [d for d in selected if d.owner == chip[0].owner and d.name != CHIP]
    if disk and blank[disk[0].name] != blank[CHIP]:
        raise BackupError(
            f"image {path}: tile {chip[0].owner}'s disk is {'blank' if blank[disk[0].name] else 'formatted'} "
            f"but the chip disk is not; the chip tile brings both up together, so this image "
            "was not taken by ipuos; nothing was restored")


def _mount_in_scratch(path: str, d: Device, data) -> None:
    """Mount a restored filesystem in scratch memory before any tile is touched, as its
    tile will (littlefs' mount walks every metadata pair); it must not write a byte."""
    try:
        check_mounts(data, d.block_size)
    except OSError as exc:
        raise BackupError(f"image {path}: device {d.name!r} holds no filesystem that mounts "
                          f"without changes ({exc.strerror or exc}); nothing was restored") from None


# -- unsaved state -----------------------------------------------------------------------------


def _uncommitted(devices: list[Device], freeze: Freeze) -> dict[Device, list[str]]:
    """The devices (of ``devices``) that have files open with writes not committed yet,
    and those files' paths, as their owners reported them while freezing."""
    return {d: freeze.uncommitted[d.owner, d.mount] for d in devices if (d.owner, d.mount) in freeze.uncommitted}


def unsaved(machine, cancelled: threading.Event | None = None) -> list[str]:
    """Names of the devices whose contents halting would lose (see the module doc)."""
    changed, uncovered, uncommitted, _, _, image_gone = _unsaved(machine, cancelled)
    return sorted(set(changed) | set(uncovered) | {d.name for d in uncommitted}
                  | {name for names in image_gone.values() for name in names})


def _unsaved(machine, cancelled) -> tuple[list[str], list[str], dict[Device, list[str]], list[str], dict, dict]:
    """(devices changed since the last backup or restore, devices no backup or restore
    covered that hold files, open files with uncommitted writes by device, descriptions
    of the filesystems in no image that hold files, {(tile, mount): files whose mtimes
    a full disk had no room for}, {image path: devices holding files saved last there,
    but the image is gone or replaced})."""
    devices = machine_devices(machine)
    baseline = _baseline(machine)
    owners = sorted({d.owner for d in devices})
    changed, uncovered, image_gone = [], [], {}
    with Freeze(machine, owners, "check for unsaved files", prepare=prepare_backup) as freeze:
        try:
            freeze.hold(cancelled, timeout=UNSAVED_WAIT)
        except (FreezeCancelled, FreezeRefused) as exc:
            raise BackupError(f"it cannot tell what is unsaved: {exc}") from None
        residency = Residency.of(machine.sram)
        images: dict[str, tuple] = {}  # (each image looked at once)
        for d in devices:
            base = baseline.get(d.name)
            gone = False
            if base is not None:
                path = base[3][0]
                if path not in images:
                    images[path] = _image_file(path)
                gone = images[path] != base[3]
            if freeze.states[d.owner] != "up" and not gone:
                continue  # not written since it was restored (or since boot, blank)
            data, _ = d.read(residency)
            if gone:
                if _holds_files(d, data):
                    image_gone.setdefault(base[3][0], []).append(d.name)
            elif base is not None and base[2] != _blank_digest(base[0], base[1], d.length):
                algo, chunk_size, digest, _ = base
                if device_digest(data, chunk_size=chunk_size, digest=algo) != digest:
                    changed.append(d.name)
            elif _holds_files(d, data):
                # never saved, or saved blank: a tile formats its disk when it first uses
                # it (a listing will do), so only files make it unsaved
                (uncovered if base is None else changed).append(d.name)
        uncommitted = _uncommitted(devices, freeze)
    unimaged = [f"the {kind} on {mount} of tile {tile}"
                for (tile, mount), (kind, holds_files) in sorted(freeze.unimaged.items()) if holds_files]
    return changed, uncovered, uncommitted, unimaged, dict(freeze.unwritten_times), image_gone


@functools.lru_cache(maxsize=8)
def _blank_digest(algo: str, chunk_size: int, length: int) -> str:
    """The digest of a device that is all zeros (never used since boot)."""
    return device_digest(np.zeros(length, dtype=np.uint8), chunk_size=chunk_size, digest=algo)


def _holds_files(device: Device, data) -> bool:
    """Whether a device holds any file or directory (read on a copy, offline)."""
    if not data.any():
        return False
    copy = bytearray(data) if device.name != CHIP else data  # the chip's read() is a copy
    fs = Filesystem(MemoryDevice(copy, device.block_size))
    try:
        fs.mount()
    except OSError:
        return True  # unreadable: say it is unsaved rather than lose it
    try:
        return bool(fs.scandir("/"))
    finally:
        fs.unmount()


@dataclass
class Unsaved:
    """What halting a machine would lose, by what would save it: a backup saves devices
    changed since the last backup or restore; no backup holds writes still in open files
    (a program commits them when it flushes or closes the file) or files on a RAM disk."""

    #: names of the devices changed since the last backup or restore
    changed: list[str]
    #: names of the devices no backup or restore covered that hold files
    uncovered: list[str]
    #: tile -> the paths of its files open with writes not yet on its disk
    open_files: dict[int, list[str]]
    #: the filesystems in no image that hold files, described
    unimaged: list[str]
    #: (tile, mount) -> files whose mtimes a full disk had no room for (no image has them)
    unwritten_times: dict = field(default_factory=dict)
    #: image path -> names of the devices last saved there, but the image is gone or replaced
    image_gone: dict = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.changed or self.uncovered or self.open_files or self.unimaged or self.unwritten_times
                    or self.image_gone)

    @property
    def disks(self) -> bool:
        """Whether a backup would save some of it (a disk's files)."""
        return bool(self.changed or self.uncovered or self.unimaged or self.image_gone)

    def __str__(self) -> str:
        reasons = []
        gone = [(names, f"was saved last in {path}, which has been deleted or replaced since")
                for path, names in sorted(self.image_gone.items())]
        for names, what in ((self.changed, "changed since the last backup or restore"),
                            (self.uncovered, "holds files no backup or restore has covered"), *gone):
            disks = [int(n.split("/")[1]) for n in names if n != CHIP]
            parts = []
            if disks:
                parts.append(f"the disk{'s' if len(disks) > 1 else ''} of tile{'s' if len(disks) > 1 else ''} "
                             f"{format_tiles(disks)}")
            if CHIP in names:
                parts.append("the chip disk")
            if parts:
                several = len(disks) + (CHIP in names) > 1
                if several:
                    what = what.replace("holds", "hold", 1).replace("was saved", "were saved", 1)
                reasons.append(f"{' and '.join(parts)} {what}")
        for tiles, paths in tiles_alike((tile, tuple(paths)) for tile, paths in self.open_files.items()):
            one = len(tiles) == 1
            reasons.append(f"{describe_tiles(tiles)} hold{'s' if one else ''} {plural(len(paths), 'file')}"
                           f"{'' if one else ' each'} open with writes not yet on {'its disk' if one else 'their disks'} "
                           f"({', '.join(paths)})")
        if self.open_files:
            reasons[-1] += ", which no backup holds"
        for tiles, mount, files in times_alike(self.unwritten_times):
            it = "it" if len(tiles) == 1 else "them"
            reasons.append(f"the modification times of {files} on {disks_of(mount, tiles)} are not on {it} "
                           f"({'it is' if len(tiles) == 1 else 'they are'} too full to write them), and no "
                           "backup holds them")
        if self.unimaged:
            reasons.append(f"{' and '.join(self.unimaged)} hold{'' if len(self.unimaged) > 1 else 's'} files, "
                           "which no backup takes")
        return "; ".join(reasons)


def unsaved_state(machine, cancelled: threading.Event | None = None) -> Unsaved:
    """What halting ``machine`` would lose (nothing: a false Unsaved)."""
    changed, uncovered, uncommitted, unimaged, unwritten_times, image_gone = _unsaved(machine, cancelled)
    return Unsaved(changed, uncovered, _open_files_by_tile(uncommitted), unimaged, unwritten_times, image_gone)


def _open_files_by_tile(uncommitted: dict[Device, list[str]]) -> dict[int, list[str]]:
    """Tile id -> the paths of its open files with uncommitted writes, in tile order."""
    by_tile: dict[int, list[str]] = {}
    for d in sorted(uncommitted, key=lambda d: (d.owner, d.mount)):
        by_tile.setdefault(d.owner, []).extend(uncommitted[d])
    return by_tile

