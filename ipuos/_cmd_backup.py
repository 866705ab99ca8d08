"""Daemon command handlers for backup (registered on import by ``_commands``).

The daemon itself writes and reads image files: the bytes never cross the socket, and the
process that writes an image is the one holding the machine, so killing it (or its
client: the call is cancelled) leaves the old image or the complete new one, never a
partial file. Paths arrive absolute (the daemon runs in ``/``). Progress is streamed as
``{"event": "progress", "phase": ..., "done": ..., "total": ...}`` at most ~10 times a
second; a cancel (Ctrl-C, disconnect) gives up cleanly until the point of no return.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from ._backup import (BackupError, Cancelled, TilesInUse, backup, check_destination, image_destination, restore,
                      unsaved)
from ._commands import Arg, Call, CommandError, command
from ._plural import plural
from ._protocol import BAD_REQUEST
from ._rundir import hint
from ._tilespec import TileSpecError, parse_tiles

log = logging.getLogger("ipuos.daemon")

_EVENT_SECONDS = 0.1


class _Events:
    """Throttled progress events for one call, and its cancel flag."""

    def __init__(self, call: Call):
        self._call = call
        self._last = 0.0
        self._phase = None
        self.cancelled = threading.Event()
        call.on_cancel(self.cancelled.set)

    def __call__(self, phase: str, done: int, total) -> None:
        now = time.monotonic()
        final = total is not None and done >= total
        if phase == self._phase and not final and now - self._last < _EVENT_SECONDS:
            return
        self._phase, self._last = phase, now
        self._call.emit({"event": "progress", "phase": phase, "done": done, "total": total})


def _path(call: Call) -> str:
    path = call.args["path"]
    check_image_path(path)
    return path


def check_image_path(path: str) -> None:
    """CommandError unless ``path`` is an absolute path a file can have."""
    if "\0" in path:
        raise CommandError(BAD_REQUEST, f"image path {path!r} holds a NUL byte, which no file name can")
    if not os.path.isabs(path):
        raise CommandError(BAD_REQUEST, f"image paths must be absolute, not {path!r}")


def _failure(exc: BaseException) -> CommandError:
    if isinstance(exc, TileSpecError):
        return CommandError("bad_tiles", str(exc))
    if isinstance(exc, Cancelled):
        return CommandError("cancelled", str(exc))
    return CommandError("backup_failed", str(exc))


def check_not_own_mount(host, path: str) -> None:
    """CommandError if ``path`` is on one of this machine's own FUSE mounts: a backup
    freezes the tiles, and then none could serve the image's writes (they waited out the
    request timeout, with every tile frozen meanwhile)."""
    path = image_destination(path)  # (a link to a file on the mount is on the mount)
    try:
        mount = host.mounts.holding(os.path.dirname(path))
    except OSError:
        return  # (check_destination says what is wrong with it)
    if mount is not None:
        raise CommandError("backup_failed", f"cannot write {path}: it is on the mount {mount.mountpoint} "
                           f"of machine {host.name!r} itself, whose tiles stop while they are backed up; "
                           "choose a path on a host disk")


def run_backup(call: Call, path: str, tiles: str | None) -> dict:
    events = _Events(call)
    host = call.host
    check_not_own_mount(host, path)
    try:
        summary = backup(host.machine, path, tiles, name=host.name, progress=events,
                         cancelled=events.cancelled)
    except (BackupError, TileSpecError) as exc:
        raise _failure(exc) from None
    summary.pop("digests", None)  # one per device: kept by the daemon, not worth sending
    log.info("backed up %s to %s (%d bytes) in %.2f s", summary["description"], path,
             summary["file_size"], summary["seconds"])
    return summary


@command("backup", Arg("path", str), Arg("tiles", str, "all"), timeout=None)
def _backup(call: Call):
    """Back up tile disks (and the chip disk with tile 0) to an image file, atomically."""
    return run_backup(call, _path(call), call.args["tiles"])


@command("restore", Arg("path", str), Arg("tiles", str, None), timeout=None)
def _restore(call: Call):
    """Restore devices from an image: all checked in scratch memory before any tile."""
    path = _path(call)
    events = _Events(call)
    host = call.host
    try:
        summary = restore(host.machine, path, call.args["tiles"], name=host.name, progress=events,
                          cancelled=events.cancelled)
    except TilesInUse as exc:
        raise CommandError("backup_failed", f"{exc}{_mount_holders(host, exc.files_open_on)}") from None
    except (BackupError, TileSpecError) as exc:
        raise _failure(exc) from None
    log.info("restored %s from %s in %.2f s", summary["description"], path, summary["seconds"])
    return summary


def _mount_holders(host, tiles: list[int]) -> str:
    """Which of the machine's host mounts may hold the files open on ``tiles``, and how to
    find and close them: a process on the host holds them, and only its user can let go."""
    if not tiles:
        return ""
    ntiles, tiles = host.machine.ntiles, set(tiles)
    held = [(m, m.operations.open_files(tiles)) for m in host.mounts.mounts()
            # (every mount shows /chip, whatever its --tiles: the chip tile's files)
            if (set(parse_tiles(m.tiles, ntiles)) | {m.operations.chip_tile}) & tiles]
    holders = [m for m, count in held if count]
    if not holders:
        return ""
    shown = [f"{m.mountpoint} ({plural(count, 'file')} open through it)" for m, count in held if count][:3]
    more = f" and {plural(len(holders) - 3, 'more mount')}" if len(holders) > 3 else ""
    first = holders[0].mountpoint
    return (f". Files are held open through the host mount{'s' if len(holders) > 1 else ''} "
            f"{', '.join(shown)}{more}: close them (`fuser -vm {first}` or `lsof {first}` names the "
            "processes holding them), then restore again")


@command("unsaved", timeout=None)
def _unsaved(call: Call):
    """The devices whose files changed since the last backup or restore."""
    cancelled = threading.Event()
    call.on_cancel(cancelled.set)
    try:
        names = unsaved(call.host.machine, cancelled)
    except BackupError as exc:
        raise _failure(exc) from None
    return {"unsaved": names}


def halt_backup(call: Call, path: str) -> dict:
    """``halt --backup``: stop the daemon's jobs, back up, and only then let it halt. If
    the backup fails the machine keeps running and the error says so."""
    check_image_path(path)
    host = call.host
    try:  # a wrong path must not cost the running programs
        check_destination(path)
        check_not_own_mount(host, path)
    except (BackupError, CommandError) as exc:
        error = _failure(exc) if isinstance(exc, BackupError) else exc
        error.message = f"{error.message}; machine {host.name!r} was not halted"
        raise error from None
    stopped = sorted(job.id for job in _running(host))
    # (the reason holds whether or not the backup then succeeds and the machine halts)
    host.interrupt_all(f"stopped by `ipuos halt --backup` of machine {host.name!r}")
    try:
        _wait_for_jobs_to_end(call, path)
        return run_backup(call, path, None)
    except CommandError as exc:
        exc.message = f"{exc.message}; machine {host.name!r} was not halted{_what_became_of(host, stopped)}"
        raise


#: how long ``halt --backup`` waits for the programs it interrupted to end before the backup
#: (which then waits for their tiles to reach an exchange point)
JOBS_END_SECONDS = 10.0


def _wait_for_jobs_to_end(call: Call, path: str) -> None:
    """Wait for the interrupted jobs to end, so that the image holds what halting leaves
    (nobody writes after it), telling the client for how many tiles, as a backup does
    (a tile inside a long call into C code takes the interrupt only when the call returns)."""
    events = _Events(call)
    deadline = time.monotonic() + JOBS_END_SECONDS
    while (jobs := _running(call.host)) and time.monotonic() < deadline:
        if call.cancelled.is_set():
            raise _failure(Cancelled(f"backup cancelled; {path} was not written"))
        events("waiting", 0, sum(job.handle.job.nlive for job in jobs))
        try:
            jobs[0].handle.wait(0.1)
        except TimeoutError:
            pass


def _what_became_of(host, stopped: list[int]) -> str:
    """For the error of a halt --backup that did not halt: which of the jobs it interrupted
    have ended, and which have not yet."""
    running = {job.id for job in _running(host)}
    ended = [job for job in stopped if job not in running]
    still = [job for job in stopped if job in running]
    note = f", but its programs were stopped for the backup ({_jobs(ended)})" if ended else ""
    if still:
        note += (f"; {_jobs(still)} {'was' if len(still) == 1 else 'were'} interrupted for the backup but "
                 f"{'has' if len(still) == 1 else 'have'} not stopped yet (a tile inside one long call into "
                 f"C code stops only when the call returns; {hint('ps', host.name)} shows the jobs)")
    return note


def _running(host) -> list:
    """The host's jobs still running (an ended one stays listed until its client is told)."""
    return [job for job in host.jobs() if not job.handle.done]


def _jobs(ids: list[int]) -> str:
    return f"job{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"
