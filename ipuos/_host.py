"""The running machine as the daemon's command handlers see it.

One ``MachineHost`` per daemon: the :class:`Machine`, its name and files, the jobs started
through the daemon (a ``RunHandle`` each, so ``kill`` and a client's Ctrl-C can interrupt
them, and ``ps`` can name them), and the halt request the main thread waits for.
Handlers run on many threads at once; everything here is safe to call from any of them.

Looking at the machine must not hang when the machine is busy: ``tile_states()`` and
``stats()`` wait for the scheduler thread, which a tile computing without an exchange
point holds for as long as it computes. :meth:`MachineHost.look` waits a little, then
answers with the last snapshot and how old it is; at most one such call per kind waits
in the machine at a time, however many clients ask.
"""

from __future__ import annotations

import os
import threading
import time
import concurrent.futures
from concurrent.futures import Future
from dataclasses import dataclass

from ._backup import BackupError, Unsaved, unsaved_state
from ._collector import Collector
from ._machine import Machine, RunHandle
from ._mount import MountManager
from ._rundir import MachinePaths, hint
from ._tilespec import format_tiles


@dataclass
class HostedJob:
    """A job started through the daemon."""

    handle: RunHandle
    name: str
    tiles: str  # the tile spec as the client gave it
    started: float  # time.monotonic(): durations, whatever the wall clock does
    client_pid: int | None

    @property
    def id(self) -> int:
        return self.handle.job.id


class HaltRefused(Exception):
    """``halt`` was asked to keep unsaved state and cannot prove there is none."""


class MachineHost:
    def __init__(self, machine: Machine, paths: MachinePaths):
        self.machine = machine
        self.paths = paths
        self.name = paths.name
        self.pid = os.getpid()
        self.started = time.time()
        #: (uptime counts from here: a step of the wall clock made it negative, or days)
        self._started_monotonic = time.monotonic()
        self._jobs: dict[int, HostedJob] = {}
        self._lock = threading.Lock()
        #: set when a client asked the daemon to halt; the main thread does the rest
        self.halt_requested = threading.Event()
        #: per kind of look ("tile_states", "stats"): the call in progress, the last answer
        self._looking: dict[str, tuple[Future, float]] = {}
        self._last_look: dict[str, tuple[float, object]] = {}
        #: the host mounts of the machine's files (``ipuos mount``); unmounted at halt
        self.mounts = MountManager(machine, self.name, runtime_dir=paths.dir)
        #: the daemon's garbage collection (see ipuos._collector)
        self.collector = Collector(machine.scheduler)

    # -- looking ---------------------------------------------------------------------------

    def look(self, kind: str, wait: float) -> tuple[object, float | None]:
        """``machine.<kind>()``, or its last answer if the machine is busy for ``wait`` s.

        Returns ``(value, age)``: age is None for a fresh answer, else the seconds since
        the stale one was taken (value None if there never was one).
        """
        with self._lock:
            pending = self._looking.get(kind)
            if pending is None:
                pending = self._looking[kind] = (Future(), time.monotonic())
                threading.Thread(target=self._look_thread, args=(kind, pending[0]), daemon=True,
                                 name=f"ipuos-look-{kind}").start()
        future, asked = pending
        # whoever asked first waited already: later askers get the old answer at once
        wait = max(0.0, min(wait, asked + wait - time.monotonic()))
        try:
            return future.result(wait), None
        except concurrent.futures.TimeoutError:
            with self._lock:
                taken, value = self._last_look.get(kind, (None, None))
            return value, (time.monotonic() - taken if taken is not None else None)

    def _look_thread(self, kind: str, future: Future) -> None:
        try:
            value = getattr(self.machine, kind)()
        except BaseException as exc:
            with self._lock:
                self._looking.pop(kind, None)
            future.set_exception(exc)
            return
        with self._lock:
            self._looking.pop(kind, None)
            self._last_look[kind] = (time.monotonic(), value)
        future.set_result(value)

    # -- jobs ------------------------------------------------------------------------------

    def add_job(self, job: HostedJob) -> None:
        with self._lock:
            self._jobs[job.id] = job

    def remove_job(self, job_id: int, thaw: bool = False) -> None:
        """Forget a job that has ended (``thaw``: see ``Collector.job_ended``)."""
        with self._lock:
            self._jobs.pop(job_id, None)
        self.collector.job_ended(thaw)

    def job(self, job_id: int) -> HostedJob | None:
        with self._lock:
            return self._jobs.get(job_id)

    def jobs(self) -> list[HostedJob]:
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: j.id)

    def interrupt_all(self, reason: str) -> None:
        for job in self.jobs():
            job.handle.interrupt(reason)

    # -- saved state -----------------------------------------------------------------------

    def check_halt(self, if_saved: bool, before_backup: bool = False) -> None:
        """Raise HaltRefused when asked to keep unsaved state that halting would drop,
        saying what saves it: a backup saves only what is on the devices.

        ``before_backup``: only what the backup about to be taken could not save (files on
        a RAM disk, writes in files held open), and only if that can be told now: a halt
        that would be refused after the backup is refused before it writes an image."""
        if not if_saved:
            return
        try:
            unsaved = unsaved_state(self.machine)
        except BackupError as exc:  # (it cannot tell: a backup, which waits for busy tiles, can)
            if before_backup:
                return
            raise HaltRefused(f"machine {self.name!r} was not halted because {exc}; {self._back_up_first()}")
        if before_backup:
            if not (unsaved.open_files or unsaved.unimaged):
                return
            # only what the backup would not save, and that it was not taken
            unsaved = Unsaved([], [], unsaved.open_files, unsaved.unimaged)
            raise HaltRefused(f"machine {self.name!r} was not halted, nor backed up, because "
                              f"{unsaved}; {self._save_first(unsaved)}")
        if unsaved:
            advice = (self._save_first(unsaved) if unsaved.open_files or unsaved.unimaged or unsaved.unwritten_times
                      else self._back_up_first())
            raise HaltRefused(f"machine {self.name!r} was not halted because {unsaved}; {advice}")

    def _back_up_first(self) -> str:
        return (f"back it up first ({hint('halt --backup IMG', self.name)} backs it up and halts), "
                "or halt without --if-saved to discard its files")

    def _save_first(self, unsaved: Unsaved) -> str:
        """How to put what no backup holds where one does: open files' writes on their
        disks (closing the files), RAM disks' files on a disk."""
        steps = []
        if unsaved.open_files:
            files = sum(map(len, unsaved.open_files.values()))
            them = ("it" if files == 1 else "them") if not unsaved.unimaged else (
                "the open file" if files == 1 else "the open files")
            programs = "the program" if len(unsaved.open_files) == 1 else "the programs"
            steps.append(f"close {them} or end {programs} holding {'it' if files == 1 else 'them'}"
                         f"{self._holders(unsaved.open_files)}")
        if unsaved.unimaged:
            steps.append("copy them to a disk" if not unsaved.open_files else
                         "copy the files no backup takes to a disk")
        if unsaved.unwritten_times:
            steps.append("free some space on the full disk" + ("s" if len(unsaved.unwritten_times) > 1 else "")
                         + " (the times are written at the next backup)")
        alone = [what for what, present in (("those writes", unsaved.open_files),
                                            ("those times", unsaved.unwritten_times)) if present]
        dropped = alone[0] if len(alone) == 1 and not unsaved.disks else "them"
        return f"{' and '.join(steps)}, then back the machine up; or halt without --if-saved to discard {dropped}"

    def _holders(self, open_files: dict[int, list[str]]) -> str:
        """`` (job 3 on tile 5: `ipuos kill 3`)``: the jobs started through the daemon that
        run on ``open_files``' tiles, and how to end each; nothing if none does."""
        holders = []
        for job in self.jobs():
            tiles = sorted(set(job.handle.job.ids) & set(open_files))
            if tiles:
                holders.append(f"job {job.id} on tile{'s' if len(tiles) > 1 else ''} {format_tiles(tiles)}: "
                               f"{hint(f'kill {job.id}', self.name)}")
        return f" ({', '.join(holders)})" if holders else ""

    def request_halt(self) -> None:
        self.halt_requested.set()

    @property
    def uptime(self) -> float:
        return time.monotonic() - self._started_monotonic
