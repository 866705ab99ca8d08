"""Freezing owner tiles at an exchange point, so the host can read or write their devices.

A tile's filesystems are touched only by its own greenlet (DESIGN, "Ownership"), so a
backup cannot just read SRAM whenever it likes: the owner might be half-way through a
littlefs commit, keep mtimes in memory, or (the chip tile) keep written blocks in the chip
disk's write-behind cache. Copying every device on its owner would be consistent but
doubles the bytes moved; instead each owner is asked, with a kernel request served at its
next exchange point (never inside a filesystem operation), to

1. get its devices ready: close files a program dropped, write pending mtimes, flush the
   chip disk's cache to its stripes (``prepare``, which may also refuse: a restore refuses
   tiles that run a program or have files open);
2. report how its storage is (``up``, ``restored``, ``blank``) and then *hold*: it parks
   inside the request with ``fs_depth`` raised, so it serves no other request, takes no
   signal and starts no filesystem operation until released. A program on it simply
   stays paused at the exchange point where it was; other tiles run on.

Once every owner holds, the host reads (backup) or writes (restore) their SRAM directly,
then releases them. A restore also asks each owner, on release, to drop its mounts without
writing (``after``), so the new bytes are mounted on next use. A release that comes first
(Ctrl-C, a refusal elsewhere) leaves every owner as it was.
"""

from __future__ import annotations

import posixpath
import threading
import time
import weakref
from typing import Callable

from ._plural import first_few, plural
from ._tilespec import describe_tiles, format_tiles
from .blockdev import MemoryDevice
from .vfs import LittlefsBackend

__all__ = ["SERVICE", "Freeze", "FreezeRefused", "FilesOpen", "FreezeCancelled", "prepare_backup", "prepare_restore"]

SERVICE = "backup.freeze"
#: open files a refusal names, at most
_PATHS_SHOWN = 3
#: freezes holding or waiting for tiles, of every machine (see Freeze.held_elsewhere),
#: and the lock that makes it safe from the threads of several requests at once
_active: "weakref.WeakSet[Freeze]" = weakref.WeakSet()
_active_lock = threading.Lock()


class FreezeRefused(Exception):
    """Some owners would not freeze; ``reasons`` maps tile id -> why."""

    def __init__(self, reasons: dict[int, str]):
        self.reasons = dict(sorted(reasons.items()))
        by_reason: dict[str, list[int]] = {}
        for tile, why in self.reasons.items():  # (a job on 16 tiles is one reason, not 16)
            by_reason.setdefault(why, []).append(tile)
        shown = [f"tile{'s' if len(tiles) > 1 else ''} {format_tiles(tiles)}: {why}"
                 for why, tiles in by_reason.items()]
        more = len(shown) - 5
        super().__init__("; ".join(shown[:5]) + (f"; and {plural(more, 'more reason')}" if more > 0 else ""))


class FilesOpen(str):
    """A refusal because files are open on the tile: whoever holds them (a program on the
    tile, the host mount) can be named by the caller, which knows the mounts."""


class FreezeCancelled(Exception):
    """The freeze was given up before every owner held (Ctrl-C, or the machine stopped)."""


class Freeze:
    """One freeze of a set of owner tiles (see the module doc). Use as a context manager
    around :meth:`hold`; leaving it releases every owner."""

    def __init__(self, machine, tiles, purpose: str,
                 prepare: Callable | None = None, after: Callable | None = None):
        self._machine = machine
        self._scheduler = machine.scheduler
        self.tiles = sorted(set(tiles))
        self.purpose = purpose
        #: ``prepare(tile, storage) -> reason or None``, on the owner, before it holds
        self._prepare = prepare
        #: ``after(tile)``, on the owner, when released with ``commit=True``
        self._after = after
        self._lock = threading.Lock()
        #: tile id -> its storage state when it froze
        self.states: dict[int, str] = {}
        self.refusals: dict[int, str] = {}
        self._arrived = 0
        self._all_in = threading.Event()
        self._held: list = []
        self._futures: dict = {}
        self.released = False
        self.commit = False
        #: tile id -> the error ``after`` raised there
        self.after_errors: dict[int, str] = {}
        #: (tile id, mount) -> paths of files open there with writes not yet committed
        #: (littlefs holds them in the file, not on the device: a copy lacks them)
        self.uncommitted: dict[tuple[int, str], list[str]] = {}
        #: (tile id, mount) -> (what, whether it holds files) of the filesystems mounted
        #: on no device of the machine (RAM disks), which no image holds
        self.unimaged: dict[tuple[int, str], tuple[str, bool]] = {}
        #: (tile, mount) -> how many files' mtimes a full disk had no room for (in memory
        #: only: a copy of the device lacks them)
        self.unwritten_times: dict[tuple[int, str], int] = {}

    def __enter__(self) -> "Freeze":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    # -- the host's side --------------------------------------------------------------------

    def hold(self, cancelled: threading.Event | None = None,
             waiting: Callable[[list[int]], None] | None = None, poll: float = 0.1,
             timeout: float | None = None) -> None:
        """Freeze every tile; return once all hold. ``waiting(tiles, elsewhere)`` is told,
        now and then, which tiles have not reached an exchange point yet, or (``elsewhere``
        true) which are held by another freeze. Raises FreezeRefused (all released) if any
        owner refused or cannot answer, FreezeCancelled if ``cancelled`` is set or
        ``timeout`` seconds pass first."""
        with _active_lock:
            _active.add(self)
        services = self._scheduler.services
        services.setdefault(SERVICE, _serve)
        if not self.tiles:
            self._all_in.set()
        else:
            try:
                self._futures = self._machine.fs.submit_all(SERVICE, self.tiles, self)
            except RuntimeError as exc:  # the machine has stopped
                raise FreezeCancelled(str(exc)) from None
        ticks = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._all_in.wait(poll):
            ticks += 1
            if cancelled is not None and cancelled.is_set():
                self.release()
                raise FreezeCancelled()  # (the caller says what was cancelled)
            if not self._scheduler.running:
                self.release()
                raise FreezeCancelled("the machine stopped")
            if deadline is not None and time.monotonic() > deadline:
                busy = self.pending()
                self.release()
                raise FreezeCancelled(f"{describe_tiles(busy)} did not reach an exchange point "
                                      f"within {timeout:g} s")
            failed = {t: f.exception() for t, f in self._futures.items() if f.done() and f.exception()}
            if failed:  # e.g. a tile that has failed and answers nothing
                self.release()
                raise FreezeRefused({t: (exc.strerror if isinstance(exc, OSError) and exc.strerror
                                         else str(exc)) for t, exc in failed.items()})
            if waiting is not None and ticks % 5 == 0:
                elsewhere = self.held_elsewhere()
                waiting(elsewhere or self.blocking(), bool(elsewhere))
        if self.refusals:
            self.release()
            raise FreezeRefused(self.refusals)

    def pending(self) -> list[int]:
        """Tiles that have not answered yet (busy computing without an exchange point)."""
        with self._lock:
            answered = set(self.states) | set(self.refusals)
        return [t for t in self.tiles if t not in answered]

    def blocking(self) -> list[int]:
        """The tiles the freeze waits for: those running a program among the pending (a
        tile computing without an exchange point holds up the scheduler, so every other
        tile is pending behind it), or all the pending if none runs one."""
        pending = self.pending()
        tiles = self._scheduler.tiles
        return [t for t in pending if tiles[t].job is not None] or pending

    def held_elsewhere(self) -> list[int]:
        """The pending tiles another freeze of this machine holds (another backup, a
        restore, a halt's check): they come once it lets them go."""
        pending = set(self.pending())
        held = set()
        with _active_lock:
            others = list(_active)
        for other in others:
            if other is not self and other._scheduler is self._scheduler and not other.released:
                with other._lock:
                    held |= pending & set(other.states)
        return sorted(held)

    def release(self, commit: bool = False) -> None:
        """Let every owner go; ``commit`` runs ``after`` on each first (idempotent)."""
        with _active_lock:
            _active.discard(self)
        with self._lock:
            if self.released:
                return
            self.commit = commit
            self.released = True
            held, self._held = self._held, []
        if held:
            wake = self._scheduler.wake
            try:
                self._scheduler.call(lambda: [wake(tile) for tile in held])
            except RuntimeError:
                pass  # the machine has stopped: nobody is left to wake

    def wait_released(self, timeout: float | None = 60.0) -> dict[int, str]:
        """Wait until every owner has left the freeze (and run ``after``); return what
        went wrong where (tile id -> error), if anything did."""
        for future in self._futures.values():
            future.result(timeout)
        return dict(self.after_errors)

    # -- the owner's side (on its own greenlet) ---------------------------------------------

    def _arrive(self) -> None:
        self._arrived += 1
        if self._arrived == len(self.tiles):
            self._all_in.set()

    def serve(self, tile) -> None:
        if self.released:
            return  # given up before this tile got here: nothing to do
        storage = self._machine.storage
        try:
            reason = self._prepare(tile, storage) if self._prepare is not None else None
        except Exception as exc:  # e.g. the chip disk's cache cannot reach its stripes
            reason = f"its storage could not be made ready ({type(exc).__name__}: {exc})"
        state = storage.state(tile)
        uncommitted, unimaged, unwritten = _survey(tile, storage) if state == "up" and not reason else ({}, {}, {})
        with self._lock:
            if self.released:
                return
            if reason:
                self.refusals[tile.id] = reason
                self._arrive()
                return
            self.states[tile.id] = state
            self.uncommitted.update(uncommitted)
            self.unimaged.update(unimaged)
            self.unwritten_times.update(unwritten)
            self._held.append(tile)
            self._arrive()
        tile.fs_depth += 1  # no requests, no signals, no filesystem operation meanwhile
        try:
            tile.wait(lambda: self.released, f"frozen for a {self.purpose}")
        finally:
            tile.fs_depth -= 1
        if self.commit and self._after is not None:
            try:
                self._after(tile)
            except Exception as exc:  # reported by wait_released; the tile carries on
                self.after_errors[tile.id] = f"{type(exc).__name__}: {exc}"


def _serve(tile, freeze: Freeze) -> None:
    """The ``backup.freeze`` kernel service."""
    freeze.serve(tile)


# -- what owners do before they hold ---------------------------------------------------------


def _littlefs_mounts(tile, storage):
    """The tile's mounted littlefs backends a backup holds: those its storage mounts at
    boot (``/`` and, on the chip tile, ``/chip``; ``/tiles`` is no filesystem of its own)."""
    vfs = storage.vfs(tile)  # only called for tiles that are up: nothing is brought up
    if vfs.pending:
        vfs.close_pending()
    found = []
    for path in storage.boot_mounts(tile):
        try:
            backend = vfs.backend(path)
        except OSError:
            continue  # e.g. /chip failed to mount at bring-up
        if isinstance(backend, LittlefsBackend):
            found.append((vfs, path, backend))
    return found


def _survey(tile, storage) -> tuple[dict, dict, dict]:
    """What an image of the tile's devices lacks, in one look at its mounts (a backup
    freezes every tile: this is per tile, so it is kept to one pass):

    * (tile id, mount) -> paths of files open there with writes not yet committed;
    * (tile id, mount) -> (what, whether it holds files) of the littlefs filesystems
      mounted on none of the machine's devices (``mount --ram``'s RAM disks);
    * (tile id, mount) -> how many files' mtimes a full disk had no room for.
    """
    vfs = storage.vfs(tile)  # only called for tiles that are up: nothing is brought up
    if vfs.pending:
        vfs.close_pending()
    devices = storage.boot_mounts(tile)
    uncommitted, unimaged, unwritten = {}, {}, {}
    for mount in vfs.mounts():
        backend = mount.backend
        if not isinstance(backend, LittlefsBackend):
            continue
        fs, key = backend.fs, (tile.id, mount.path)
        if mount.path not in devices:
            if fs.mounted:
                what = "RAM disk" if isinstance(backend.device, MemoryDevice) else "filesystem"
                unimaged[key] = (what, bool(fs.scandir("/")))
            continue
        paths = fs.uncommitted() if fs.mounted else None
        if paths:
            uncommitted[key] = [posixpath.join(mount.path, path.lstrip("/")) for path in paths]
        if backend.unwritten_times:
            unwritten[key] = backend.unwritten_times
    return uncommitted, unimaged, unwritten


def prepare_backup(tile, storage) -> str | None:
    """Make the tile's devices hold everything it has committed: mtimes kept in memory
    are written and the chip disk's write-behind cache is flushed to its stripes."""
    if storage.state(tile) != "up":
        return None  # nothing in memory: the bytes in SRAM are all there is
    for _, _, backend in _littlefs_mounts(tile, storage):
        fs = backend.fs
        if fs.mounted and fs.fault is None:
            try:
                backend.sync()
            except OSError:
                pass  # a full disk drops its stamps (see LittlefsBackend); the data is there
        _write_back(backend)
    return None


def running_jobs(machine, tiles) -> FreezeRefused | None:
    """The refusal a restore of ``tiles`` meets for those running a job, as it stands
    now: said at once, where the freeze would first wait for them to reach an exchange
    point (a program computing may take long) and then refuse them (prepare_restore,
    which checks again as each tile holds)."""
    reasons = {tile_id: _runs_job(job) for tile_id in tiles
               if (job := machine.scheduler.tiles[tile_id].job) is not None}
    return FreezeRefused(reasons) if reasons else None


def _runs_job(job) -> str:
    return f"it runs job {job.id} (wait for it, or stop it with `ipuos kill {job.id}`)"


def prepare_restore(tile, storage) -> str | None:
    """Refuse a tile whose files are in use: a program runs there or files are open.
    Otherwise write the chip disk's cache back first: a write-back a sync left due goes
    out at the next exchange, which comes while the tile holds, and may come after the
    host has written the restored bytes (``scheduler.before_copies``)."""
    if tile.job is not None:
        return _runs_job(tile.job)
    if storage.state(tile) != "up":
        return None
    mounts = _littlefs_mounts(tile, storage)
    open_files = sum(backend.open_files for _, _, backend in mounts)
    if open_files:
        # (one removed while open keeps its filesystem busy, as on a host: restored under
        # it, its later writes would land nowhere)
        removed = sum(backend.removed_open_files for _, _, backend in mounts)
        paths = [posixpath.join(mount, inner.lstrip("/")).rstrip("/") for _, mount, backend in mounts
                 for inner in backend.open_paths()]
        named = first_few(paths, _PATHS_SHOWN)
        named = "; ".join(filter(None, [named, f"{removed} removed while open" if removed else ""]))
        return FilesOpen(f"{plural(open_files, 'file is', 'files are')} open on it"
                         + (f" ({named})" if named else ""))
    for _, _, backend in mounts:
        try:
            _write_back(backend)
        except OSError:
            pass  # a backing tile failed: a write-back is all or nothing, so none lands later
    return None


def _write_back(backend) -> None:
    """Write the backend's device cache (the chip disk's write-behind) back now, and wait."""
    flush = getattr(backend.device, "flush", None)
    if flush is not None:
        flush()
