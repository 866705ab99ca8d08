"""Interrupting a tile that is stuck in pure compute.

A tile in ``while True: pass`` never reaches an exchange point, so no flag it could check
will ever be read; the only way in is an asynchronous exception raised in the scheduler
thread (``PyThreadState_SetAsyncExc``), which lands in whatever Python frame that thread
is executing. That must be the tile program, never the scheduler, the VFS, or littlefs
glue, where an exception at an arbitrary bytecode would corrupt state. So before
injecting, the watchdog walks the scheduler thread's stack from the top, looking through
library frames (the standard library, site-packages): the first other frame decides. A
tile program (its globals carry :data:`TILE_GLOBALS_MARKER`) or any other user code is
safe, like KeyboardInterrupt in ordinary Python; an ``ipuos`` module is not.

Why the check is not overtaken by the scheduler thread: the watchdog does it right
after it wakes and takes the GIL, and a thread holding the GIL keeps it until it blocks
or another thread has waited a full switch interval (5 ms); the check takes microseconds.
On a loaded machine the OS may still deschedule the watchdog mid-check, so right before
injecting it checks again that the scheduler thread is in the frame it found safe
(a window of a few bytecodes remains; ``_run_job`` finishes the job even if an
interrupt lands there).
"""

from __future__ import annotations

import ctypes
import sys
import sysconfig
import threading
import time
import traceback
import types
from typing import TYPE_CHECKING

from ._errors import ComputeBudgetExceeded, JobAborted, TileInterrupt, TileKeyboardInterrupt, stops_raised
from ._exchange import switch_often

if TYPE_CHECKING:
    from ._job import Job
    from ._scheduler import Scheduler

#: key the tile runtime puts into every tile program's globals
TILE_GLOBALS_MARKER = "__ipuos_tile_program__"
#: key under which tile code's globals keep its source lines by file name, for its
#: tracebacks: the process-wide linecache holds one text per name ("<program>"), and
#: another program, or another tile's /lib/mod.py, may have replaced it by then
TILE_SOURCE_LINES = "__ipuos_source_lines__"

_TICK = 0.01
#: while a tile is still due a Ctrl-C (see Watchdog.hurry)
_HURRIED_TICK = 0.0001
#: CPU seconds a tile computes, once seen computing, before the watchdog hands it a
#: Ctrl-C: a tile resumed after the Ctrl-C came had, on the chip, long been running on
#: beside the others, past its first lines and into the program's `try:`; stopped at
#: once, it could take it there (seen under load: tile 1 interrupted before it began)
_CTRL_C_SETTLE = 0.0005
#: the same for a tile whose bytecodes the scheduler thread counts to raise its Ctrl-C
#: itself (see CtrlCSettle): a backstop, for one that reaches its count no sooner (in
#: one long call into C, which runs none of them)
_CTRL_C_SETTLE_COUNTED = 0.02
#: a tile not due a Ctrl-C that has computed this long since it was sampled or stopped
#: (on in its handler, or another job's) keeps the due ones waiting however often the
#: watchdog looks, which slows it 13-30%: it calms until another tile computes, and the
#: next due tile then waits up to a tick (10 ms), a tenth of this at most
_HURRY_PATIENCE = 0.1
#: an interrupt the program swallowed (a bare ``except:``) is raised again this often,
#: until the tile stops computing (not a Ctrl-C: one each, as in Python; see
#: TileKeyboardInterrupt)
_REPEAT = 0.02
#: stops a tile's program must have caught for the watchdog to say it catches them all
_CAUGHT_FOR_GOOD = 5
#: the stops that end a job whatever its program catches: raised again only once the
#: program's grace for its cleanup is over (see Watchdog._cleaning_up)
_FOR_GOOD = (TileInterrupt, JobAborted)



#: code here is library code: interrupting it is safe exactly when its caller's is
_LIBRARY_DIRS = tuple(
    sorted({sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")})
)


#: library code the garbage collector runs from inside whatever allocates (weakref
#: callbacks): an exception landing there is printed as "ignored" and lost
_COLLECTOR_CALLBACKS = ("_weakrefset.py", "weakref.py")


_USER, _IPUOS, _LIBRARY = "user", "ipuos", "library"


def _code_of(frame) -> str:
    """Whose code ``frame`` runs: a tile program's or any other user code (_USER),
    ipuos' own (_IPUOS), or the standard library's or an installed package's (_LIBRARY)."""
    module_globals = frame.f_globals
    if TILE_GLOBALS_MARKER in module_globals:
        return _USER
    name = module_globals.get("__name__")
    if type(name) is str and (name == "ipuos" or name.startswith("ipuos.")):
        return _IPUOS
    filename = frame.f_code.co_filename
    # (code a library generated, compiled from a string: a namedtuple's or a dataclass'
    # methods, called from anywhere, ipuos' own code included)
    return _LIBRARY if filename.startswith(_LIBRARY_DIRS) or filename.startswith("<") else _USER


def runs_user_code(frame) -> bool:
    """Whether ``frame`` runs user code: where an interrupt may be raised."""
    return _code_of(frame) is _USER


def _safe_to_interrupt(frame) -> bool:
    """True if the innermost frame that is not library code is user code, not ipuos
    (and the innermost is no weakref callback: the interrupt comes again a little later)."""
    if frame is not None and frame.f_code.co_filename.endswith(_COLLECTOR_CALLBACKS):
        return False
    while frame is not None:
        code = _code_of(frame)
        if code is not _LIBRARY:
            return code is _USER
        frame = frame.f_back
    return False


def running_tile(frame):
    """The Tile whose greenlet owns ``frame``: the bottom frame is its kernel loop."""
    bottom = None
    while frame is not None:
        # (another thread's frames, read as that thread runs on and switches greenlets:
        # a link may be torn down under the walk, once seen to lead to a dict)
        if type(frame) is not types.FrameType:
            return None
        bottom, frame = frame, frame.f_back
    if bottom is None or bottom.f_code.co_name != "_kernel_main":
        return None
    return bottom.f_locals.get("self")


class Watchdog:
    """A thread that interrupts tiles on request or when they exceed a compute budget."""

    def __init__(self, sched: "Scheduler"):
        self._sched = sched
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._interrupts: dict["Job", type[BaseException]] = {}
        self._budgets: set["Job"] = set()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._sample: tuple | None = None
        self._sample_since = 0.0
        #: the scheduler thread's CPU time when the sample was first seen (see _settled)
        self._sample_cpu: float | None = None
        self._cpu_clock: tuple[int, int] | None = None  # (thread ident, its CPU clock)
        self._injected: tuple | None = None
        self._injected_at = 0.0
        #: stops_raised when the watchdog last raised one, and how many of those the
        #: tile computing since has caught
        self._raised_before = 0
        self._caught = 0
        #: job -> the tile whose program catches every stop raised in it
        self._swallowing: dict["Job", int] = {}
        #: looking often, for a Ctrl-C left for tiles still to run (see hurry), and
        #: how many times it was asked to (a calm decided before the last ask is void)
        self._hurried = False
        self._hurries = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ipuos-watchdog", daemon=True)
        self._thread.start()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def stop(self) -> None:
        with self._lock:  # (a hurry after it would never be undone: see hurry)
            self._stopped = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(2)

    def interrupt(self, job: "Job", kind: type[BaseException] = TileInterrupt) -> None:
        with self._lock:
            if kind is TileKeyboardInterrupt and self._interrupts.get(job, kind) is not kind:
                return  # (a Ctrl-C after a stop must not turn it into one the program may catch)
            self._interrupts[job] = kind
        if kind is TileKeyboardInterrupt:
            # tiles that catch it and run on take the thread one after another, each
            # computing until this thread stops it: looking every tick, 1472 of them in
            # `try: while True: pass` took 23 s
            self.hurry()
        else:
            self._wake.set()

    def watch(self, job: "Job") -> None:
        with self._lock:
            self._budgets.add(job)
        self._wake.set()

    def forget(self, job: "Job") -> None:
        with self._lock:
            self._interrupts.pop(job, None)
            self._budgets.discard(job)
            self._swallowing.pop(job, None)

    def swallowing(self, job: "Job") -> int | None:
        """The tile of ``job`` whose program has caught the stops raised in it and
        computes on (a bare ``except:`` in a loop), if any: nothing stops it but closing
        the machine. (A tile inside one long call into C takes none until it returns.)"""
        return self._swallowing.get(job)

    @property
    def hurried(self) -> bool:
        """Whether it looks often now (see hurry)."""
        return self._hurried

    def hurry(self) -> None:
        """Look now, and often (the GIL changing hands often meanwhile), while a tile
        is still due a Ctrl-C: one the watchdog was asked to raise (see interrupt), or
        one the scheduler left for tiles' next exchange point (see
        Scheduler.hand_ctrl_c_later)."""
        with self._lock:
            if self._stopped:
                return  # (the thread that would calm it is gone: the interval is the process's)
            self._hurries += 1
            if not self._hurried:
                self._hurried = True
                switch_often.enter()
        self._wake.set()

    def _ctrl_c_due(self) -> bool:
        """Whether some live tile has still to take a Ctrl-C from this thread (see
        hurry): not one the scheduler thread counts its way to (see CtrlCSettle)."""
        settle = self._sched.ctrl_c_settle
        if not settle.counting and self._sched.ctrl_c_left_for_later():
            return True
        with self._lock:
            jobs = [job for job, kind in self._interrupts.items() if kind is TileKeyboardInterrupt]
        return any(not settle.covers(job) and job.ctrl_c_due_somewhere() for job in jobs)

    def _hurry_helps(self) -> bool:
        """Whether looking often still helps: a tile is due a Ctrl-C, and no tile that
        is not has held the thread for long, keeping the due ones waiting."""
        sample = self._sample
        since = max(self._sample_since, self._injected_at) if self._injected == sample else self._sample_since
        if sample is not None and time.monotonic() - since > _HURRY_PATIENCE:
            tile = sample[0]
            job = tile.job
            if job is None or self._interrupts.get(job) is not TileKeyboardInterrupt or not job.ctrl_c_due(tile.rank):
                return False
        return self._ctrl_c_due()

    def _calm(self, hurries: int | None = None) -> None:
        """Look at the usual pace again, unless asked to hurry since ``hurries``."""
        with self._lock:
            if self._hurried and hurries in (None, self._hurries):
                self._hurried = False
                switch_often.leave()

    def _run(self) -> None:
        try:
            while not self._stopped:
                if self._hurried:
                    hurries = self._hurries
                    if not self._hurry_helps():
                        self._calm(hurries)
                busy = bool(self._interrupts or self._budgets or self._hurried)
                self._wake.wait((_HURRIED_TICK if self._hurried else _TICK) if busy else None)
                self._wake.clear()
                if self._stopped:
                    return
                try:
                    self._check()
                except Exception:  # (it must live on: nothing else stops a computing tile)
                    self._sched.report_internal_error("the watchdog's look at the computing tile failed",
                                                      traceback.format_exc())
        finally:
            self._calm()  # (the interval is the process's: never left short)

    @staticmethod
    def _cleaning_up(job: "Job", tile, now: float) -> bool:
        """Whether ``tile``, computing, runs its program's cleanup after a stop that
        ends its job (taken at an exchange point, or raised by this thread as it
        computed), within the second of grace README promises (see
        Job.computing_grace_ends): the stop is raised again only after it."""
        return (tile.stop_taken or tile.stop_injected) and now < job.computing_grace_ends(tile)

    def _scheduler_cpu(self) -> float | None:
        """The scheduler thread's CPU seconds (None where the OS cannot tell)."""
        ident = self._sched.thread_ident
        try:
            if self._cpu_clock is None or self._cpu_clock[0] != ident:
                self._cpu_clock = (ident, time.pthread_getcpuclockid(ident))
            return time.clock_gettime(self._cpu_clock[1])
        except (AttributeError, OSError, TypeError):
            return None

    def _settled(self, tile, now: float) -> bool:
        """Whether the sampled tile has computed long enough since first seen to be
        handed its Ctrl-C here: _CTRL_C_SETTLE, or _CTRL_C_SETTLE_COUNTED if the
        scheduler thread counts its bytecodes to raise it itself (see CtrlCSettle)."""
        settle = _CTRL_C_SETTLE_COUNTED if self._sched.ctrl_c_settle.counts(tile) else _CTRL_C_SETTLE
        cpu, since = self._scheduler_cpu(), self._sample_cpu
        if cpu is None or since is None:
            return now - self._sample_since >= settle
        return cpu - since >= settle

    def _check(self) -> None:
        sched = self._sched
        frame = sys._current_frames().get(sched.thread_ident)
        tile = running_tile(frame) if sched.in_compute else None
        if tile is None:
            self._sample = None
            return
        job = tile.job
        sample = (tile, sched.superstep)
        now = time.monotonic()
        if sample != self._sample:
            self._sample, self._sample_since = sample, now
            self._sample_cpu = self._scheduler_cpu()
            self._injected = None
            self._caught = 0
            if not self._hurried and self._ctrl_c_due():
                self.hurry()  # (calmed while another tile held the thread: see _hurry_helps)
        if job is None or (self._injected == sample and now - self._injected_at < _REPEAT):
            return
        kind = self._interrupts.get(job)
        if kind is TileKeyboardInterrupt and not job.ctrl_c_due(tile.rank):
            kind = None  # (it had this Ctrl-C: a program that swallows it runs on)
        if kind is None and job in self._budgets and job.budget and now - self._sample_since > job.budget:
            kind = ComputeBudgetExceeded
            with self._lock:
                tripped = job in self._budgets  # (not forgotten meanwhile: the entry would stay)
                if tripped:
                    job.over_budget(tile.rank)  # (before any tile is stopped: what they say)
                    # the job fails; its other tiles must not each burn a budget of their own
                    self._interrupts[job] = JobAborted
                    job.stop_asked(now)
            if tripped:  # ... and it fails on every tile, though the program catch this
                try:
                    sched.call_soon(job.out_of_budget, tile.rank)
                except RuntimeError:
                    pass  # (the machine is stopping: so is the job)
        if kind in _FOR_GOOD and self._cleaning_up(job, tile, now):
            return
        if kind is not None and _safe_to_interrupt(frame):
            ident, exc = ctypes.c_ulong(sched.thread_ident), ctypes.py_object(kind)
            # the OS may have descheduled this thread since the sample, and the scheduler
            # thread run on into the kernel (ending the tile's job, say): inject only if it
            # is still in the frame found safe, checked as late as Python allows
            if sys._current_frames().get(sched.thread_ident) is frame:
                if kind is TileKeyboardInterrupt and not (self._settled(tile, now) and job.ctrl_c_due(tile.rank, take=True)):
                    return  # (just seen: next look; or it took this Ctrl-C at an exchange point since)
                raised = stops_raised.get(sched.thread_ident, 0)
                if self._injected == sample and raised != self._raised_before:
                    self._caught += 1  # (the last one was raised, and the tile computes on)
                    if self._caught >= _CAUGHT_FOR_GOOD and kind is not TileKeyboardInterrupt:
                        with self._lock:
                            if job in self._interrupts:  # (not forgotten meanwhile)
                                self._swallowing[job] = tile.id
                self._raised_before = raised
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ident, exc)
                if kind is not TileKeyboardInterrupt and not tile.stop_injected and not tile.stop_taken:
                    tile.stop_raised_at = now  # (its grace counts from here: Job.grace_ends)
                    tile.stop_injected = True
                self._injected, self._injected_at = sample, now
