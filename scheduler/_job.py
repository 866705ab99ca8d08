"""A job: one program launched on a set of tiles, which are its group for collectives."""

from __future__ import annotations

import itertools
import time
import traceback
import types
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ._errors import (
    CollectiveMismatchError,
    ComputeBudgetExceeded,
    JobAborted,
    TileInterrupt,
    TileKeyboardInterrupt,
    describe_exception,
    describe_tiles,
)
from ._outcome import ABORTED, ERROR, INTERRUPTED, OK, JobStats

if TYPE_CHECKING:
    from ._scheduler import Scheduler
    from ._tile import Tile

#: channels of point-to-point traffic: the user's, and the collectives' own: the
#: reduction tree's, scatter's and the prefix reductions' (a tile's inbox keys the
#: user's by sender rank, the others by (channel, sender rank))
USER_CHANNEL = 0
REDUCE_CHANNEL = 1
SCATTER_CHANNEL = 2
SCAN_CHANNEL = 3


#: seconds a program that caught a stop (``kill``, a second Ctrl-C, the machine halting)
#: may run on, exchanging, to clean up: past it, its tiles leave it at their next exchange
#: point (as ``docker stop`` waits before its SIGKILL; ``ipuos kill`` waits 2 s to report)
STOP_CATCH_GRACE = 1.0
#: seconds after the job's grace began by which every tile's grace is over, however late
#: its turn came: tiles compute one after another, and 1472 that each compute their
#: cleanup for a second (or spin after catching) would hold the machine for 25 minutes
STOP_CATCH_LIMIT = 5.0


@dataclass
class TileResult:
    rank: int
    tile: int
    status: str
    value: Any = None
    error: BaseException | None = None

    @property
    def traceback(self) -> str:
        """The formatted traceback of an ERROR result (formatted on demand: a failure on
        47,104 tiles must not format 47,104 tracebacks nobody reads)."""
        if self.error is None:
            return ""
        return "".join(traceback.format_exception(type(self.error), self.error, self.error.__traceback__))


class Job:
    """Scheduler-side state of a running job. Created only by :meth:`Scheduler.start_job`."""

    def __init__(
        self,
        sched: "Scheduler",
        job_id: int,
        tiles: list["Tile"],
        target: Callable,
        name: str,
        budget: float | None,
    ):
        self.sched = sched
        self.id = job_id
        self.name = name
        self.tiles = tiles
        self.ids = [t.id for t in tiles]
        self.nranks = len(tiles)
        #: what each tile runs. A callable object, called as is, goes through C
        #: (``slot_tp_call``) into a new C frame of the interpreter, which every greenlet
        #: switch of its tiles then copies; its bound ``__call__`` runs in the caller's C
        #: frame
        self.target = target if isinstance(target, (types.FunctionType, types.MethodType)) else target.__call__
        #: seconds a tile may compute in one superstep before it is interrupted (None: no limit)
        self.budget = budget
        #: tiles whose program still runs, by rank
        self.live: dict[int, "Tile"] = dict(enumerate(tiles))
        self.nlive = len(tiles)
        self._live_resumes: list | None = None
        # the collective in progress: arrivals, what was called, contributions
        self.gen = 0
        self.arrived = 0
        self.coll_kind: tuple | None = None
        #: the ``sync`` every tile of the job calls (see scheduler._api._job_sync)
        self.sync = None
        self.mismatch = False
        self.coll_off = [0] * self.nranks
        self.coll_len = [0] * self.nranks
        #: stands for the collective in progress (a new one each): see Tile.out_held
        self.coll_token = object()
        #: parts of the collective in progress moved out of their tiles' outgoing buffers
        #: to make room for replies, by rank (their ``coll_off`` is -1)
        self.coll_set_aside: dict[int, bytes] = {}
        self.coll_result = None
        #: what the collective in progress raises on every tile, left by a tile that could
        #: not take part in it (see _api._arrive_refusing)
        self.refusal: BaseException | None = None
        #: tiles waiting in recv (for deadlock detection)
        self.nrecv = 0
        #: a waiting tile was woken by a message in the last exchange
        self.progress = False
        #: a tile finished since the last exchange (recv waits may have become hopeless)
        self.finished_changed = False
        self.results: list[TileResult | None] = [None] * self.nranks
        #: rank -> the ranks whose early end failed its collective (see missing_tiles)
        self._blamed: dict[int, tuple[int, ...]] = {}
        #: rank -> how a tile ended that the others may miss ("it raised ValueError: boom")
        self.endings: dict[int, str] = {}
        #: rank -> the exception its target ends with and its description, made before
        #: the target tore its program down (see describe_failure)
        self._described: dict[int, tuple[BaseException, str]] = {}
        self.first_failure: TileResult | None = None
        #: the superstep in which a tile's exception stopped the job, while the others
        #: still run to their next exchange point, unhurried by the watchdog (None: not
        #: so stopped, or stopped at once, by an interrupt or a compute budget, or the
        #: job was being stopped before); see Tile.wait
        self.failed_in: int | None = None
        #: why the job was last interrupted, by a Ctrl-C or a stop (None: never)
        self.interrupted: str | None = None
        #: an interrupt that ends the job came (``kill``, its client gone, shutdown): unlike
        #: a Ctrl-C, which the program may catch and run on after, as a job like any other
        #: (its deadlocks reported, a failure handled as ever)
        self.stopping = False
        #: a stop that ends the job whatever its program catches came: such an interrupt,
        #: another tile's failure or the compute budget (see _stop_for_good)
        self.ending = False
        #: when the grace of a program that catches that stop began (time.monotonic()),
        #: for :meth:`past_stop_grace`
        self.stopped_at: float | None = None
        #: when a stop that ends the job was first asked for from outside its tiles (a
        #: kill, the budget; time.monotonic()): the job's grace begins only on the
        #: scheduler's thread, which a computing tile holds, and its limit counts from here
        self.stop_asked_at: float | None = None
        #: the kind and words of the first stop that ends the job: raised again in a
        #: program that caught it, once its grace is over (see stop_again)
        self._first_stop: tuple[type[BaseException], tuple] = (TileInterrupt, ("interrupted",))
        #: when wake_catchers is next due (time.monotonic()), None: not
        self._wake_due: float | None = None
        #: ranks whose tile is to raise the job's stop after the error it had pending
        #: when the stop came (see raise_in_tiles)
        self.stop_owed: set[int] = set()
        #: the user's Ctrl-Cs so far, and by rank the count at the last one a tile was
        #: handed (see ctrl_c_due)
        self.ctrl_cs = 0
        self._ctrl_c_taken: dict[int, int] = {}
        #: rank -> the Ctrl-C it had taken before its last (see ctrl_c_lost)
        self._ctrl_c_before: dict[int, int] = {}
        #: where ctrl_c_due_somewhere last found a tile due, and the Ctrl-C it found
        #: every live tile had taken
        self._due_hint = 0
        self._none_due_of = 0
        #: a Ctrl-C is queued for the scheduler thread to hand to the tiles (see
        #: hand_over_ctrl_c)
        self.ctrl_c_queued = False
        #: tiles handed a Ctrl-C while they were still to run in the superstep computing
        #: then: each takes it at its next exchange point (see raise_in_tiles)
        self.ctrl_c_later: set = set()
        #: why the job's tiles were stopped (the first abort, interrupt or deadlock)
        self.abort_reason: str | None = None
        #: ranks that computed past the budget (see over_budget)
        self.over_budget_ranks: set[int] = set()
        #: the superstep its tiles' programs begin in, all alike (see Scheduler._start_job)
        self.first_superstep = 0
        self.future: Future = Future()
        self.waiters: list["Tile"] = []
        self.stats = JobStats()
        self._start_per_tile = self._per_tile_bytes()
        self._start_superstep = sched.superstep
        #: chips its tiles are on (a sync across chips costs more), and its simulated
        #: exchange time: its own syncs and its own tiles' traffic (see end_superstep)
        self.nchips = len({tile_id // sched.tiles_per_chip for tile_id in self.ids})
        self.sim_cycles = 0.0
        self._start_wall = time.perf_counter()
        #: every tile has its incoming buffer at the same offset: broadcasts are one 2-D copy
        layouts = {(t.xin.offset, t.xin.size) for t in tiles}
        self.xin_offset = layouts.pop()[0] if len(layouts) == 1 else None

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.name!r} on {describe_tiles(self.ids)}>"

    @property
    def done(self) -> bool:
        return self.nlive == 0

    # -- called on tile greenlets --------------------------------------------------------

    def finish_tile(self, tile: "Tile", result: TileResult, failure: str) -> None:
        """Record a tile's end; fail the others if it failed on its own (``failure``
        describes its error, made on the tile: see :func:`describe_exception`)."""
        self.results[result.rank] = result
        del self.live[result.rank]
        self._live_resumes = None
        self.nlive -= 1
        self.finished_changed = True
        if result.status == ERROR and self.first_failure is None:
            self.first_failure = result
            over_budget = isinstance(result.error, ComputeBudgetExceeded)
            if not self.stopping and not over_budget:
                self.failed_in = self.sched.superstep
            if not (over_budget and self.ending):
                # (the tile over the budget, ending with its error, stops nothing more: the
                # budget stopped the job already, and the others' cleanup runs in its grace)
                self.abort(
                    JobAborted(
                        f"job {self.id} stopped: {self.describe([result.rank])} failed with {failure}"
                    )
                )
        elif result.status == INTERRUPTED and self.interrupted is None:
            # one tile was interrupted (the watchdog got there first): so are the rest
            kind = TileKeyboardInterrupt if isinstance(result.error, KeyboardInterrupt) else TileInterrupt
            self.interrupt(self.abort_reason or "interrupted", kind)
        if self.nlive == 0:
            self.sched._job_finished(self)
        elif self.arrived and self.arrived >= self.nlive:
            # the finished tile no longer takes part: the others' barrier may be complete
            self.sched._ready_jobs.append(self)

    def live_resumes(self) -> list:
        """The resume methods of the live tiles (cached: a barrier wakes them all)."""
        resumes = self._live_resumes
        if resumes is None:
            resumes = self._live_resumes = [t.resume for t in self.live.values()]
        return resumes

    def abort(self, signal: BaseException) -> None:
        """Stop the job: deliver ``signal`` to every live tile at its next exchange point.

        Interrupted or out of compute budget, a tile computing without reaching one is
        stopped at once by the watchdog. After a tile's own exception (``failed_in``) the
        others compute on to their next exchange point, however long that takes (their
        budget or an interrupt still stops them): interrupting them after the watchdog's
        first tick would make what they keep depend on timing.
        """
        if self.abort_reason is None:
            self.abort_reason = str(signal)
        if isinstance(signal, JobAborted):  # (a failure or the budget: an interrupt begins in interrupt())
            self._stop_for_good(signal, grace_now=self.failed_in is None)
        if self.failed_in is None:
            stop = type(signal) if isinstance(signal, TileInterrupt) else JobAborted
            self.sched.watchdog.interrupt(self, stop)
        self.raise_in_tiles(signal)

    def over_budget(self, rank: int) -> None:
        """(The watchdog's thread.) Tile ``rank`` computed for longer than the job's
        budget: the watchdog stops it, then has :meth:`out_of_budget` run."""
        self.over_budget_ranks.add(rank)
        if self.abort_reason is None:  # (what the tiles the watchdog stops next say)
            self.abort_reason = self.budget_message(rank)

    def name_stop(self, stop: BaseException, rank: int) -> BaseException:
        """Give ``stop`` the words it lacks: the watchdog can only inject a bare class
        into a computing tile, and whoever reports the stop (the job's result, a
        ``__del__`` it interrupted) must say why, as a stop raised at an exchange does."""
        if isinstance(stop, ComputeBudgetExceeded):
            if stop.args == (stop.UNNAMED,):
                stop.args = (self.budget_message(rank),)
        elif isinstance(stop, (TileInterrupt, JobAborted)) and not stop.args:
            stop.args = (self.abort_reason or "interrupted",)
        return stop

    def budget_message(self, rank: int) -> str:
        return f"{self.describe([rank])} computed for more than {self.budget:g} s without reaching an exchange point"

    def out_of_budget(self, rank: int) -> None:
        """(The scheduler's thread.) Tile ``rank`` computed for longer than the budget: the
        job is over on every tile, at its next exchange point, even if the program
        catches the tile's exception (and that tile's result is the budget's error, see
        ``_run_job``): whether it stopped must not hang on how long the tiles compute after."""
        if not self.done:
            self.abort(JobAborted(self.budget_message(rank)))

    def end_collective(self) -> None:
        """The collective in progress is over (done, or failed on every tile): the next
        one starts afresh. Its waiters see the generation change; a tile's wait that
        ends by an exception then no longer counts itself out (see _api._wait_counted):
        a tile that caught the error may already have arrived at the next one."""
        self.gen += 1
        self.clear_collective()

    def clear_collective(self) -> None:
        """No tile is in a collective (any more): forget what the last one gathered."""
        self.arrived = 0
        self.coll_token = object()
        if self.coll_set_aside:
            self.coll_set_aside = {}
        self.coll_kind = None
        self.mismatch = False
        self.refusal = None

    def fail_waits(self, error: BaseException) -> None:
        """End what every live tile waits in (a collective, a barrier, recv) with
        ``error`` on each: a deadlock, or tiles in different collectives."""
        self.end_collective()
        self.raise_in_tiles(error)

    def raise_in_tiles(self, error: BaseException) -> None:
        """Raise ``error`` in every live tile where it waits: a collective's or a deadlock's
        error, found when every live tile waits. A program may catch it and carry on, so
        unlike :meth:`abort` this arms no watchdog (which would interrupt the job's next
        compute) and gives the job no reason to stop."""
        ctrl_c = isinstance(error, TileKeyboardInterrupt)
        stop = _stops_for_good(error)
        # an interrupt that ends the job replaces whatever else a tile has still to raise
        # (a deadlock's error the program would catch, and run on)
        kill = stop and isinstance(error, TileInterrupt)
        # handed in the middle of a superstep, a Ctrl-C finds some tiles still to run in
        # it: resumed, each would take it where it last waited, a wait over long ago on
        # the chip (outside the program's try:, say), so it takes it at its next
        # exchange point instead (see take_ctrl_c_later), or at this superstep's exchange
        later = self.sched.still_to_run() if ctrl_c else ()
        if stop:
            self.ctrl_c_later.clear()
        for tile in self.live.values():
            pending = tile.signal
            # a stop replaces a Ctrl-C not yet raised: a program that catches that would
            # run on until the watchdog happened to catch it computing
            if ctrl_c and isinstance(pending, TileKeyboardInterrupt) and self.ctrl_c_due(tile.rank):
                # it still has the last Ctrl-C to raise: this one waits for its next
                # exchange point after that (see take_ctrl_c_later)
                self._leave_ctrl_c_for_later(tile)
                continue
            if pending is None or (stop and isinstance(pending, TileKeyboardInterrupt)) or (
                    kill and not _stops_for_good(pending)):
                # (one still to run in the job's first superstep has begun on the chip,
                # as the others have, and takes it at its next exchange point too; one
                # whose first superstep has not begun is stopped before its first line)
                if ctrl_c and tile in later and self.ctrl_c_due(tile.rank) and (
                        tile.program_depth >= 0 or self.sched.superstep >= self.first_superstep):
                    self._leave_ctrl_c_for_later(tile)
                    continue
                if ctrl_c and not self.ctrl_c_due(tile.rank, take=True):
                    continue  # (the watchdog stopped it with this Ctrl-C already)
                # a fresh instance per tile: each raise writes its own traceback into it
                tile.signal = type(error)(*error.args)
            elif stop and not _stops_for_good(pending):
                # a tile's failure behind an error the tile has still to raise (a collective
                # mismatch that failed the tile): it comes next, else a program that
                # catches that error would run on and never hear that the job is over
                self.stop_owed.add(tile.rank)
            self.sched.wake(tile)

    def hand_over_ctrl_c(self) -> None:
        """Hand the Ctrl-C queued for the scheduler thread to the tiles now. A Ctrl-C
        comes from another thread: the watchdog hands it to a computing tile at once,
        and the waiting tiles get it when the scheduler thread runs the queued call,
        after the superstep. A computing tile that caught it and goes on to exchange
        (its handler's allreduce) would meet the others still in their ``sync()``: a
        mismatch, their handlers never run. So it hands them theirs first (see
        ``_api._let_the_ctrl_c_land``)."""
        if self.ctrl_c_queued:
            self.ctrl_c_queued = False
            self.raise_in_tiles(TileKeyboardInterrupt(self.abort_reason or "interrupted (Ctrl-C)"))

    def ctrl_c_to_hand(self, tile) -> bool:
        """Whether ``tile``, at an exchange point, must first see a Ctrl-C handed out:
        one queued for the tiles, left for its next exchange point, or a later one than
        it had still to raise when that came."""
        return bool(self.ctrl_c_queued or self.ctrl_c_later
                    or (self.ctrl_cs and tile.signal is None and self.ctrl_c_due(tile.rank)))

    def _leave_ctrl_c_for_later(self, tile) -> None:
        """``tile`` takes the latest Ctrl-C at its next exchange point, or this
        superstep's exchange hands it (see Scheduler.hand_ctrl_c_later)."""
        if not self.ctrl_c_later:
            self.sched.hand_ctrl_c_later(self)
        self.ctrl_c_later.add(tile)

    def take_ctrl_c_later(self, tile=None) -> None:
        """Hand the Ctrl-C to ``tile`` at its exchange point, which is now, if it is due
        one: left for then, or a later Ctrl-C than the one it still had to raise when
        that came (None: every tile it was left for: the superstep's exchange)."""
        if tile is None:
            tiles, self.ctrl_c_later = self.ctrl_c_later, set()
        else:
            self.ctrl_c_later.discard(tile)
            tiles = (tile,)
        for tile in tiles:
            if self.live.get(tile.rank) is not tile or not self.ctrl_c_due(tile.rank):
                continue
            if tile.signal is not None:  # (the last Ctrl-C still to raise: this one after it)
                self._leave_ctrl_c_for_later(tile)
                continue
            self.ctrl_c_due(tile.rank, take=True)
            tile.signal = TileKeyboardInterrupt(self.abort_reason or "interrupted (Ctrl-C)")
            self.sched.wake(tile)

    def ctrl_c_epoch(self, rank: int) -> int:
        """Which of the job's Ctrl-Cs rank ``rank`` was last handed (0: none). The parts
        of a reduction, scan or scatter are filed under their sender's: each tile takes
        each Ctrl-C once, so a part sent before one, for the collective it cut short, is
        never taken for a part of the collective a handler calls after it."""
        return self._ctrl_c_taken.get(rank, 0)

    def ctrl_c_due(self, rank: int, take: bool = False) -> bool:
        """Whether rank ``rank`` is yet to be handed the latest Ctrl-C (``take``: it is
        now). One each, as a process gets one KeyboardInterrupt per Ctrl-C: the watchdog
        stops a tile computing with it, the others get it at their exchange point, and
        neither hands it twice. Read by the watchdog's thread, written by both (a
        tile is stopped one way or the other, never both at once)."""
        due = self._ctrl_c_taken.get(rank) != self.ctrl_cs
        if due and take:
            self._ctrl_c_before[rank] = self._ctrl_c_taken.get(rank, 0)
            self._ctrl_c_taken[rank] = self.ctrl_cs
        return due

    def ctrl_c_lost(self, rank: int) -> bool:
        """Python dropped the latest Ctrl-C rank ``rank`` took ("Exception ignored":
        raised in a ``__del__``, a weakref callback, a generator being finalised): it is
        due it again. False if it was due one already."""
        if self._ctrl_c_taken.get(rank) != self.ctrl_cs:
            return False
        self._ctrl_c_taken[rank] = self._ctrl_c_before.pop(rank, 0)
        self._none_due_of = -1  # (ctrl_c_due_somewhere must look again)
        return True

    def ctrl_c_due_somewhere(self) -> bool:
        """Whether a live tile is yet to be handed the latest Ctrl-C. The watchdog's
        thread asks every tick: it looks on from the tile it found last (tiles take it
        mostly in turn) and remembers when none is left (tiles only take it and leave),
        so one Ctrl-C costs about one pass over the job, not one per tick."""
        latest, taken, live = self.ctrl_cs, self._ctrl_c_taken, self.live
        if self._none_due_of == latest:
            return False
        start = self._due_hint
        for rank in itertools.chain(range(start, len(self.tiles)), range(start)):
            if rank in live and taken.get(rank) != latest:
                self._due_hint = rank
                return True
        self._none_due_of = latest
        return False

    def interrupt(self, reason: str, kind: type[TileInterrupt] = TileInterrupt) -> None:
        """Interrupt every tile: with the user's Ctrl-C (``TileKeyboardInterrupt``), which
        the program may catch and run on after, or with a stop that ends the job."""
        self.interrupted = reason
        self.ctrl_c_queued = False  # (handed to every tile now)
        stop = kind(reason)
        if kind is not TileKeyboardInterrupt:
            self.stopping = True
            self._stop_for_good(stop)
        self.failed_in = None  # (its tiles stop at once, wherever they are)
        self.abort(stop)

    def _stop_for_good(self, stop: BaseException, grace_now: bool = True) -> None:
        """The job ends whatever its program catches (``kill``, its client gone, the
        machine halting, a tile's failure, the compute budget): a program that catches
        ``stop`` has :data:`STOP_CATCH_GRACE` seconds to clean up, and is then left at
        its next exchange point (see Scheduler.leave_program).

        After a tile's failure (not ``grace_now``) the others compute on, unhurried, to
        their next exchange point, and tiles run one after another: the grace begins
        only at the exchange after the one that ends that superstep, once every tile
        has taken the stop, or a tile's cleanup would find it spent by the others'
        compute before its own turn came."""
        if not self.ending:  # (the first says why the job ends: a tile's failure, say)
            self.ending = True
            self._first_stop = (type(stop), stop.args)
        if grace_now:
            self.begin_grace()
        else:
            sched = self.sched
            sched.before_copies(lambda: sched.before_copies(self.begin_grace))

    def begin_grace(self) -> None:
        """Start the grace of programs that catch the job's stop (once)."""
        if self.stopped_at is None:
            self.stopped_at = time.monotonic()
            self.wake_catchers_at(self.stopped_at + STOP_CATCH_GRACE)

    def wake_catchers_at(self, when: float) -> None:
        """Have :meth:`wake_catchers` run at ``when`` (time.monotonic()), unless a call is
        due sooner (that one looks again for the tiles whose grace is not over yet)."""
        if self._wake_due is None or when < self._wake_due:
            self._wake_due = when
            self.sched.call_later(max(0.0, when - time.monotonic()) + 0.01, self._wake_catchers_due, when)

    def _wake_catchers_due(self, when: float) -> None:
        if self._wake_due == when:
            self._wake_due = None
            self.wake_catchers()

    def stop_again(self) -> BaseException:
        """The job's first stop, afresh: for a tile whose program caught it, past its grace."""
        kind, args = self._first_stop
        return kind(*args)

    def first_stop(self) -> tuple[type[BaseException], str]:
        """The kind of the job's first stop, and what it said."""
        kind, args = self._first_stop
        return kind, str(args[0]) if args else "interrupted"

    def wake_catchers(self) -> None:
        """Wake the tiles that had a stop raised and wait: past its grace, each that
        caught it has it raised again there (see Tile.wait). A tile whose grace is not
        over yet (its stop came later) is looked at again when it is.
        (A tile that caught a stop may wait with nothing left to wake it: the others gone.)"""
        due = None
        for tile in self.live.values():
            if tile.stop_taken:
                ends = self.grace_ends(tile)
                if ends is not None and ends <= time.monotonic():
                    self.sched.wake(tile)
                elif ends is not None:
                    due = ends if due is None else min(due, ends)
        if due is not None:
            self.wake_catchers_at(due)

    def parts_inside_requests(self) -> list[int]:
        """(From any thread, as a snapshot.) The tiles whose part of the job runs inside
        a request the tile serves (the shell's own, on tile 0): a program there that
        catches its stop is never left (see Tile.caught_a_stop), so only its own end or
        the machine halting ends it."""
        return [tile.id for tile in list(self.live.values()) if tile.program_depth > 1]

    def took_stop(self, tile: "Tile", at: float | None = None) -> None:
        """The job's stop was raised in ``tile``'s program, now or ``at`` (when the
        watchdog raised it as the tile computed): its grace counts from then, at the
        earliest (see grace_ends)."""
        tile.stop_taken = True
        tile.stop_raised_at = time.monotonic() if at is None else at
        ends = self.grace_ends(tile)
        if ends is not None:
            self.wake_catchers_at(ends)

    def grace_ends(self, tile: "Tile") -> float | None:
        """When the grace of ``tile``'s program, which took the job's stop, is over
        (time.monotonic()); None while the job's grace has not begun (see
        _stop_for_good). A program that caught it may clean up until then (exchanging,
        say), and is left by its tile only after (see Scheduler.leave_program): a second
        from the job's grace or from the stop landing in the tile, whichever is later,
        so that no tile's cleanup time is spent before its turn came; but no later than
        :data:`STOP_CATCH_LIMIT` after the job's grace began, or the stop was asked for
        (see stop_asked_at)."""
        began = self.stopped_at
        if began is None:
            return None
        return min(max(began, tile.stop_raised_at) + STOP_CATCH_GRACE, self._limit_from(began) + STOP_CATCH_LIMIT)

    def computing_grace_ends(self, tile: "Tile") -> float:
        """grace_ends for ``tile`` computing now, which took the job's stop (for the
        watchdog): while the job's grace has not begun (it begins on the scheduler's
        thread, which the tile holds), a second from its own stop, within the limit."""
        ends = self.grace_ends(tile)
        if ends is not None:
            return ends
        ends = tile.stop_raised_at + STOP_CATCH_GRACE
        asked = self.stop_asked_at
        return ends if asked is None else min(ends, asked + STOP_CATCH_LIMIT)

    def _limit_from(self, began: float) -> float:
        asked = self.stop_asked_at
        return began if asked is None else min(asked, began)

    def stop_asked(self, at: float) -> None:
        """(From any thread.) A stop that ends the job was asked for ``at``: see stop_asked_at."""
        if self.stop_asked_at is None:
            self.stop_asked_at = at

    def past_stop_grace(self, tile: "Tile") -> bool:
        """Whether the grace of ``tile``'s program is over (see grace_ends). Before the
        job's grace begins, it is over for a tile that has held the scheduler's thread
        since its stop (taken in this superstep's compute) for a second: it spins (on a
        ``send`` to a full buffer, say), and no exchange, which would begin the job's
        grace, comes while it does."""
        ends = self.grace_ends(tile)
        if ends is None and tile.stop_raised_at >= self.sched.compute_began:
            ends = tile.stop_raised_at + STOP_CATCH_GRACE
        return ends is not None and time.monotonic() >= ends

    # -- reports -------------------------------------------------------------------------

    def describe(self, ranks) -> str:
        """``tiles 0-1``: tiles of the job as its program numbers them (``__tileid``),
        with the machine's ids beside them when those differ, as in output headers:
        ``tiles 0-1 (machine tiles 20,40)``."""
        ranks = sorted(set(ranks))
        text = describe_tiles(ranks)
        ids = [self.ids[r] for r in ranks]
        if ids != ranks:
            text += f" (machine {describe_tiles(ids)})"
        return text

    def describe_failure(self, rank: int, exc: BaseException) -> None:
        """Describe now, on the tile, the exception rank ``rank``'s target is about to end
        with, for the abort of the others (see :meth:`failure_of`): its ``__str__`` may
        use the program's globals, which the target tears down before it returns."""
        self._described[rank] = (exc, describe_exception(exc))

    def failure_of(self, result: TileResult) -> str:
        """``"Type: message"`` for a failed tile's error: as its target described it (see
        :meth:`describe_failure`), or described now, on the tile."""
        described = self._described.pop(result.rank, None)
        if described is not None and described[0] is result.error:
            return described[1]
        return describe_exception(result.error)

    def ended_raising(self, rank: int, exc: BaseException) -> None:
        """Rank ``rank`` ended because its code raised ``exc``, caught by the job's own
        target (a repl prints it as the tile's output): the others' errors name it."""
        self.endings[rank] = f"it raised {describe_exception(exc)}"

    def missing_tiles(self, waiting, finished, waits_in: str) -> CollectiveMismatchError:
        """The error of the ``waiting`` ranks, whose collective ``waits_in`` needs the
        ``finished`` ranks: those of them that finished, or if none did, those stopped
        (by a failure, or a Ctrl-C before the program began).

        It names the tiles whose own end started it, never tiles that failed only because
        of them: a reduction's tree fails tile by tile, and every tile of the job then
        reports one cause, which groups as one output.
        """
        ended_well = [rank for rank in finished if self.ended_well(rank)]
        finished, ended = (ended_well, "finished") if ended_well else (finished, "stopped")
        roots = sorted({root for rank in finished for root in self._blamed.get(rank, (rank,))})
        for rank in waiting:
            self._blamed[rank] = tuple(roots)
        text = f"{waits_in} needs every tile of the job, but {self.describe(roots)} already {ended}"
        endings = [self.endings[rank] for rank in roots if rank in self.endings]
        if len(roots) == 1 and endings:
            text += f" ({endings[0]})"
        return CollectiveMismatchError(text)

    def how_ended(self, rank: int) -> str:
        """``has finished``, ``failed`` or ``was stopped``: how rank ``rank``'s program
        ended, for the errors of tiles that wait on it."""
        status = self.results[rank].status
        return {OK: "has finished", ERROR: "failed"}.get(status, "was stopped")

    def ended_well(self, rank: int) -> bool:
        """Whether rank ``rank``'s program has ended, and not by an exception or a stop."""
        result = self.results[rank]
        return result is not None and result.status == OK

    def waiting_report(self) -> str:
        """``tiles 0-5 wait in sync(); tile 6 waits in recv from tile 7``."""
        groups: dict[str, list[int]] = {}
        for rank, tile in self.live.items():
            groups.setdefault(tile.waiting or "sync()", []).append(rank)
        parts = []
        for what, ranks in sorted(groups.items(), key=lambda kv: kv[1][0]):
            verb = "waits" if len(ranks) == 1 else "wait"
            parts.append(f"{self.describe(ranks)} {verb} in {what}")
        return "; ".join(parts)

    def mismatch_report(self) -> str:
        """What a collective mismatch says: where the tiles wait. Tiles may all wait in
        what reads the same, a reduction with an op of one name, and still mismatch: the
        ops are different functions (see ``_api._closing``), which is said too."""
        report = self.waiting_report()
        if len({tile.waiting for tile in self.live.values()}) == 1:
            report += (", with ops of one name that are different functions (other code, or other values "
                       "captured) from tile to tile")
        return f"collective mismatch in job {self.id}: {report}"

    def _per_tile_bytes(self):
        """(sent, received) per tile of the job, this superstep's so far included."""
        engine = self.sched.engine
        sent = engine.bytes_out[self.ids].copy()
        received = engine.bytes_in[self.ids].copy()
        for rank, tile_id in enumerate(self.ids) if engine._step_out or engine._step_in else ():
            sent[rank] += engine._step_out.get(tile_id, 0)
            received[rank] += engine._step_in.get(tile_id, 0)
        return sent, received

    def _finalise_stats(self) -> None:
        sched = self.sched
        # the superstep the job ends in counts: a program without a sync ran in one
        self.stats.supersteps = sched.superstep - self._start_superstep + 1
        self.stats.wall_seconds = time.perf_counter() - self._start_wall
        sent, received = self._per_tile_bytes()
        self.stats.bytes_sent = (sent - self._start_per_tile[0]).tolist()
        self.stats.bytes_received = (received - self._start_per_tile[1]).tolist()
        self.stats.bytes_exchanged = sum(self.stats.bytes_sent)
        self.stats.sim_seconds = sched.engine.cost.seconds(self.sim_cycles)


def _stops_for_good(signal: BaseException) -> bool:
    """Whether ``signal`` ends the job whatever its program catches: an interrupt other
    than the user's Ctrl-C (``kill``, its client gone, shutdown), or the abort after a
    tile failed."""
    return isinstance(signal, JobAborted) or (
        isinstance(signal, TileInterrupt) and not isinstance(signal, TileKeyboardInterrupt))


@dataclass
class JobReport:
    """What :meth:`Scheduler.start_job`'s future resolves to."""

    job_id: int
    name: str
    tiles: list[int]
    results: list[TileResult]
    stats: JobStats = field(default_factory=JobStats)

    @property
    def ok(self) -> bool:
        return all(r.status == OK for r in self.results)
