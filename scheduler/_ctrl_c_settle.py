"""A Ctrl-C for tiles that run after it came: raised once each has run a little.

On the chip every tile computes at once: when the user presses Ctrl-C, a tile the host
has yet to run in that superstep (one not yet begun, or still parked at its last
exchange point) had long been running beside the others, past its program's first
lines and into its ``try:``. On the host it runs only after the Ctrl-C came, so it
takes it at its next exchange point or, computing without reaching one, once it has
run :data:`CTRL_C_AFTER` bytecodes of its program.

Counting bytecodes rather than time gives every such tile the same start whatever the
host's load, and the scheduler thread raises the Ctrl-C itself, between two bytecodes
of the tile's own program: no other thread has to notice the tile computing. (The
watchdog did, a look or more per tile: 1472 tiles of `while True: pass` took 2 s to
stop.) Lines would be cheaper to count, but a loop on one line runs none after its
first.

It costs only from a Ctrl-C raised on the scheduler thread (the watchdog's in the
computing tile, or one a tile takes at its exchange point) to the next exchange: a
greenlet switch hook (``greenlet.settrace``) notes which tile the thread switches to,
and ``sys.settrace`` traces the program frames of one that is due. A scheduler thread
that someone else traces (a debugger, coverage) is left alone, as is Python 3.12 (it
starts no opcode events on frames already running: gh-103615): the watchdog stops
their tiles, as it stops a tile inside one long call into C, which runs no bytecode of
its program meanwhile.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import traceback
from typing import TYPE_CHECKING

import greenlet

from ._errors import TileKeyboardInterrupt, ctrl_c_raised_hooks
from ._watchdog import runs_user_code

if TYPE_CHECKING:
    from ._scheduler import Scheduler
    from ._tile import Tile

#: bytecodes of its program a tile resumed after a Ctrl-C runs before it takes it
#: (if it reaches no exchange point first): a program's first lines, and into its
#: loop. Traced, they take ~0.1 ms.
CTRL_C_AFTER = 1000

#: whether opcode events can be turned on for frames already running (see module doc)
_OPCODE_EVENTS_FOLLOW = sys.version_info[:2] != (3, 12)


#: thread id -> the CtrlCSettle of the scheduler running on it
_settles: dict[int, "CtrlCSettle"] = {}


def ctrl_c_dropped(unraisable) -> bool:
    """Whether ``unraisable`` (what ``sys.unraisablehook`` is given) is a tile's Ctrl-C
    that Python dropped ("Exception ignored in ..."): raised, by the watchdog or by the
    count, where Python drops exceptions: a ``__del__`` by any name or path, a weakref
    callback, a generator's ``finally`` as it is freed. Its tile is then due it again
    (raised at its program's next bytecode, or by the watchdog), so it is not lost,
    and nothing is to be told of it."""
    if not isinstance(unraisable.exc_value, TileKeyboardInterrupt):
        return False
    settle = _settles.get(threading.get_ident())
    return settle is not None and settle.dropped()


class _TellingDroppedCtrlCs:
    """``sys.unraisablehook``: a tile's dropped Ctrl-C is due again (see
    ctrl_c_dropped); anything else goes to the hook that was there."""

    #: (a hook that calls ctrl_c_dropped first says so: see _tell_dropped)
    tells_dropped_ctrl_cs = True

    def __init__(self, then):
        self.then = then

    def __call__(self, unraisable) -> None:
        if not ctrl_c_dropped(unraisable):
            self.then(unraisable)


@contextlib.contextmanager
def ctrl_cs_dropped_are_told():
    """While the tile running on this thread tears its program down: a Ctrl-C Python
    drops there (in a ``__del__``) is told, as Python tells it, and ends the program
    once all is let go of (the tile runtime's ``_end_on_tile``), not raised again."""
    settle = _settles.get(threading.get_ident())
    tile = settle.running_tile() if settle is not None else None
    if tile is None or tile in settle.tearing_down:
        yield
        return
    settle.tearing_down.add(tile)
    try:
        yield
    finally:
        settle.tearing_down.discard(tile)


def _tell_dropped() -> None:
    """Make sure the unraisable hook tells dropped Ctrl-Cs: a test runner (pytest) or
    an application may have set its own since (the tile runtime's tells them too)."""
    if not getattr(sys.unraisablehook, "tells_dropped_ctrl_cs", False):
        sys.unraisablehook = _TellingDroppedCtrlCs(sys.unraisablehook)


class CtrlCSettle:
    """Raises a Ctrl-C in each tile that is due it (``Job.ctrl_c_due``) at its
    :data:`CTRL_C_AFTER`-th bytecode. The scheduler thread's alone."""

    def __init__(self, sched: "Scheduler"):
        self._sched = sched
        self._tile_of = sched.tile_of
        #: the switch hook and the thread's trace function are this one's
        self.counting = False
        #: the tile running now, if it is due a Ctrl-C (else None), the key it is
        #: counted under, and how many bytecodes it has still to run before it takes it
        self._current: Tile | None = None
        self._key: tuple | None = None
        self._left = 0
        #: (tile, job, which of its Ctrl-Cs) -> bytecodes left, for the due tiles that
        #: have run and parked (at a wait that does not take the Ctrl-C: a file's)
        self._lefts: dict[tuple, int] = {}
        #: the tiles counted since counting started (their frames are unmarked at stop)
        self._counted: set = set()
        #: code object -> whether it is user code (see runs_user_code), as found so far
        self._user_code: dict = {}
        #: tiles tearing their program down (see ctrl_cs_dropped_are_told)
        self.tearing_down: set = set()
        # bound once: a hook or tracer is told from another by identity
        self._on_switch = self._on_switch
        self._on_call = self._on_call
        self._on_opcode = self._on_opcode

    def attach(self) -> None:
        """Start counting whenever a Ctrl-C is raised on this thread (the scheduler's),
        and have one Python drops raised again."""
        thread = threading.get_ident()
        _settles[thread] = self
        ctrl_c_raised_hooks[thread] = self.start

    def detach(self) -> None:
        """(The scheduler thread is ending.)"""
        self.stop()
        thread = threading.get_ident()
        ctrl_c_raised_hooks.pop(thread, None)
        _settles.pop(thread, None)

    def running_tile(self) -> "Tile | None":
        return self._tile_of.get(greenlet.getcurrent())

    def dropped(self) -> bool:
        """The running tile's Ctrl-C was dropped by Python (see ctrl_c_dropped): it is
        due again, at its next bytecode if counting (else the watchdog's). False if the
        tile had none to lose, or tears its program down (see ctrl_cs_dropped_are_told)."""
        tile = self.running_tile()
        job = tile.job if tile is not None else None
        if job is None or job.ending or tile in self.tearing_down or not job.ctrl_c_lost(tile.rank):
            return False
        self.start()
        tracer = sys.gettrace()
        if self.counting and tracer in (None, self._on_call):
            if tracer is None:  # (the count's own raise unset it)
                sys.settrace(self._on_call)
            self._count(tile, sys._getframe(1), left=1)
        return True

    def covers(self, job) -> bool:
        """Whether the tiles of ``job`` due a Ctrl-C take it from this (any thread)."""
        return self.counting and self._counted_in(job)

    def counts(self, tile) -> bool:
        """Whether ``tile`` takes the Ctrl-C it is due from this (any thread)."""
        return self.counting and self._due(tile)

    def start(self) -> None:
        """Count the bytecodes of the tiles due a Ctrl-C, from their next switch in, to
        the next exchange (a Ctrl-C is raised on this thread)."""
        _tell_dropped()
        if self.counting or sys.gettrace() is not None or not _OPCODE_EVENTS_FOLLOW:
            return  # (counting already; or traced by someone else: the watchdog's)
        previous = greenlet.settrace(self._on_switch)
        if previous is not None:  # (another switch hook: leave the thread as it was)
            greenlet.settrace(previous)
            return
        self.counting = True
        self._current = None
        sys.settrace(self._on_call)

    def stop(self) -> None:
        """Count no more: no tile that computes is due a Ctrl-C any more (the exchange
        has handed it to every tile yet to take it)."""
        if not self.counting:
            return
        self.counting = False
        self._current = None
        self._lefts.clear()
        self._user_code.clear()
        if greenlet.gettrace() is self._on_switch:
            greenlet.settrace(None)
        if sys.gettrace() is self._on_call:
            sys.settrace(None)
        # (a debugger attached later must not get opcode events it never asked for)
        for tile in self._counted:
            frame = tile.glet.gr_frame if tile.glet else None
            while frame is not None:
                if frame.f_trace is self._on_opcode:
                    frame.f_trace = None
                    frame.f_trace_opcodes = False
                frame = frame.f_back
        self._counted.clear()

    @staticmethod
    def _counted_in(job) -> bool:
        """Whether ``job`` has had a Ctrl-C and goes on (a stop that ends the job,
        ``kill`` or a failure, is the watchdog's to raise)."""
        return bool(job.ctrl_cs) and not job.ending

    def _due(self, tile: "Tile") -> bool:
        """Whether ``tile`` is yet to take its job's latest Ctrl-C, from this."""
        job = tile.job
        return job is not None and self._counted_in(job) and job.ctrl_c_due(tile.rank)

    def _on_switch(self, event: str, args: tuple) -> None:
        """greenlet's switch hook: runs in the greenlet switched to, before it resumes.
        (An exception here would end the switch, and the scheduler's loop with it.)"""
        try:
            if event != "switch" and event != "throw":
                return
            if self._current is not None:  # (leaving it: it counts on when it is back)
                self._lefts[self._key] = self._left
            tile = self._tile_of.get(args[1])
            if tile is None or not self._due(tile):
                self._current = None
                return
            tracer = sys.gettrace()
            if tracer is None:  # (raising the Ctrl-C in another tile unset it)
                sys.settrace(self._on_call)
            elif tracer is not self._on_call:
                self._current = None  # (someone else traces now: the watchdog's)
                return
            self._count(tile, sys._getframe().f_back)
        except Exception:
            self._current = None
            self._sched.report_internal_error("counting a tile's bytecodes before its Ctrl-C failed",
                                              traceback.format_exc())

    def _count(self, tile: "Tile", frame, left: int | None = None) -> None:
        """Count ``tile``'s bytecodes from here: ``left`` more before it takes its
        Ctrl-C (None: what it had left when it last ran, or CTRL_C_AFTER), in the
        frames it runs in now (``frame`` and below: they began before it was due) and
        those it calls."""
        self._current = tile
        self._counted.add(tile)
        self._key = key = (tile, tile.job, tile.job.ctrl_cs)
        self._left = self._lefts.pop(key, CTRL_C_AFTER) if left is None else left
        while frame is not None:  # (None: a greenlet's first switch)
            if frame.f_trace is None and self._runs_user_code(frame):
                self._trace(frame)
            frame = frame.f_back

    def _runs_user_code(self, frame) -> bool:
        code = frame.f_code
        user = self._user_code.get(code)
        if user is None:
            user = self._user_code[code] = runs_user_code(frame)
        return user

    def _trace(self, frame):
        frame.f_trace_lines = False
        frame.f_trace_opcodes = True
        frame.f_trace = self._on_opcode
        return self._on_opcode

    def _on_call(self, frame, event: str, arg):
        """The thread's trace function: a frame begins. Traced if it runs user code (the
        program's) on the tile due a Ctrl-C."""
        if self._current is not None and self._runs_user_code(frame):
            return self._trace(frame)
        return None

    def _on_opcode(self, frame, event: str, arg):
        """A program frame's trace function: count its bytecodes, and raise the Ctrl-C
        at the one it is due at, as the watchdog would, had it stopped the tile there."""
        if event != "opcode":
            return self._on_opcode
        tile = self._current
        if tile is None:
            return None  # (its tile is not due one now: stop tracing this frame)
        left = self._left - 1
        if left > 0:
            self._left = left
            return self._on_opcode
        if not self._may_raise(tile, frame):
            return self._on_opcode  # (it looks again at the next bytecode)
        self._current = None
        job = tile.job
        if not job.ending and job.ctrl_c_due(tile.rank, take=True):
            job.ctrl_c_later.discard(tile)  # (taken: the exchange has none to hand it)
            raise TileKeyboardInterrupt(job.abort_reason or TileKeyboardInterrupt.UNNAMED)
        return None

    def _may_raise(self, tile: "Tile", frame) -> bool:
        """Whether the Ctrl-C may be raised in ``frame`` now: the tile runs its program
        (not a file operation of its own, nor a request it serves), and nothing of it
        runs where Python drops an exception ("Exception ignored"): a ``__del__`` or
        anything the cycle collector runs."""
        if tile.job is None or tile.fs_depth or tile.service_depth > tile.program_depth:
            return False
        if self._sched.collecting:
            return False
        while frame is not None and self._runs_user_code(frame):
            if frame.f_code.co_name == "__del__":
                return False
            frame = frame.f_back
        return True
