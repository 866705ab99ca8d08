"""The superstep loop: compute, sync, exchange; and the doors into it from the host.

One thread owns every tile greenlet (greenlets belong to the thread that made them). Host
threads never touch tiles: they queue a callable with :meth:`Scheduler.call` or a kernel
request with :meth:`Scheduler.submit` and wait on the returned Future; the scheduler runs
queued work between supersteps. When no tile is runnable and nothing is in flight the
thread sleeps until the host queues something, so an idle machine costs no CPU.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import gc
import inspect
import itertools
import operator
import sys
import threading
import time
import traceback
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as _FutureTimeout
from typing import Callable, Iterable

import greenlet

from ipuos._affinity import pin_thread
from ipuos._costmodel import CostModel
from ipuos._plural import plural

from . import _collectives
from ._api import ANY_SOURCE, REDUCE_FANIN, TileAPI
from ._ctrl_c_settle import CtrlCSettle
from ._budget import budget_seconds
from ._errors import (
    CollectiveMismatchError,
    ComputeBudgetExceeded,
    DeadlockError,
    JobAborted,
    TileBusyError,
    TileFailed,
    TileInterrupt,
    TileKeyboardInterrupt,
    describe_tiles,
    for_host,
)
from ._exchange import KIND_REPLY, KIND_REQUEST, KIND_USER, ExchangeEngine
from ._job import Job, JobReport, TileResult
from ._outcome import ABORTED, ERROR, INTERRUPTED, OK
from ._payload import decode, encode
from ._tile import Request, Tile, parker
from ._watchdog import TILE_GLOBALS_MARKER, Watchdog, running_tile

#: how long :meth:`Scheduler.stop` lets tiles finish what they are doing
STOP_GRACE_SECONDS = 5.0


class Scheduler:
    """Runs every tile of a machine in bulk-synchronous supersteps."""

    def __init__(
        self,
        sram,
        tiles_per_chip: int,
        exchange_out: int,
        exchange_in: int,
        cost_model: CostModel | None = None,
    ):
        self.sram = sram
        self.ntiles = sram.tiles
        self.tiles_per_chip = tiles_per_chip
        self.nchips = (self.ntiles + tiles_per_chip - 1) // tiles_per_chip
        #: chips the running jobs span: what a sync costs (one chip syncs faster)
        self._chips_in_use = 0
        self.tiles: list[Tile] = []
        for tile_id in range(self.ntiles):
            memory = sram.memory(tile_id)
            xout = memory.alloc("exchange.out", exchange_out)
            xin = memory.alloc("exchange.in", exchange_in)
            self.tiles.append(Tile(self, tile_id, tile_id // tiles_per_chip, memory, xout, xin))
        self.engine = ExchangeEngine(sram, self.ntiles, tiles_per_chip, cost_model or CostModel())
        #: children per node of a reduction tree: as many as can all send a value that fits
        #: the outgoing buffer in one superstep without overflowing their leader's incoming one
        self.reduce_fanin = max(2, min(REDUCE_FANIN, 1 + exchange_in // exchange_out))
        #: kernel services by name: ``fn(tile, *args)`` run on the owning tile's greenlet
        self.services: dict[str, Callable] = {"job.run": _run_job}
        self.jobs: dict[int, Job] = {}
        #: tiles with a signal pending, and kernel requests queued on all tiles: while
        #: both are 0, no tile arriving at a sync has anything to do but park
        self.signalled = 0
        self.queued_requests = 0
        #: the tile each tile greenlet runs, for the paths that need to know which it is
        self.tile_of: dict[greenlet.greenlet, Tile] = {}
        #: raises a Ctrl-C in tiles that run after it came, where they compute
        self.ctrl_c_settle = CtrlCSettle(self)
        self.superstep = 0
        #: True while tile greenlets run (the compute phase); read by the watchdog
        self.in_compute = False
        #: when the compute phase running (or last run) began, and how many tiles it
        #: began with: see compute_progress
        self.compute_began = 0.0
        self.compute_tiles = 0
        #: True while Python's cyclic garbage collector runs, in any thread: only then
        #: does a ``__del__`` run far from its tile, maybe after its program ended (in
        #: a reference cycle), so only then do the primitives look at where they are
        #: called from (see _api._check_sync_caller)
        self.collecting = False
        #: what tiles' programs left for their next exchange point: {tile: [fn]} (see
        #: Tile.at_next_exchange; not _before_copies, which the exchange phase runs);
        #: empty, as nearly always, the primitives look no further
        self.left_for_exchange: dict[Tile, list[Callable[[], None]]] = {}
        #: problems inside the scheduler itself, kept for ``status`` and tests
        self.internal_errors: list[str] = []
        self.thread_ident: int | None = None
        self._job_ids = itertools.count(1)
        self._call_tags = itertools.count(1)
        #: the resume (greenlet switch) methods of the tiles to run next superstep
        self._runnable: list[Callable] = []
        #: those of this superstep still to run (see Tile.start)
        self.runq: collections.deque = collections.deque()
        #: the scheduler loop's greenlet, and the switch to it (set on its thread)
        self._main: greenlet.greenlet | None = None
        self.to_main: Callable | None = None
        self._ready_jobs: list[Job] = []
        self._finished_jobs: list[Job] = []
        self._host_replies: list[tuple[Future, bool, object]] = []
        self._deferred_replies: list[tuple[Tile, Tile, bytes]] = []
        #: run at the next exchange, before the remote copies (see before_copies)
        self._before_copies: list[Callable[[], None]] = []
        #: jobs with a Ctrl-C left for tiles' next exchange point (see Job.raise_in_tiles),
        #: and interrupts from host threads, applied at the next exchange too (see interrupt_job)
        self._ctrl_c_later: list[Job] = []
        self._interrupts_due: list[_HostInterrupt] = []
        self._calls: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        #: set once shutdown has failed what still waited: nothing may be queued after
        self._closed = False
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self.watchdog = Watchdog(self)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduler thread (tile greenlets are created inside it)."""
        if self._thread is not None:
            raise RuntimeError("the scheduler is already running")
        self._thread = threading.Thread(target=self._thread_main, name="ipuos-scheduler", daemon=True)
        gc.callbacks.append(self._note_collection)
        self._thread.start()
        self._started.wait()
        self.watchdog.start()

    def _note_collection(self, phase: str, info: dict) -> None:
        """``gc.callbacks``: keep :attr:`collecting`."""
        self.collecting = phase == "start"

    def stop(self, timeout: float = STOP_GRACE_SECONDS) -> bool:
        """Interrupt running jobs, let tiles reach a safe point, and end the thread.
        True if it has ended (False: a tile computing without reaching an exchange point
        still holds it, past the grace period; its state must not be touched)."""
        if self._thread is None:
            return True
        # a tile stuck in pure compute holds the scheduler thread: interrupt it from here
        for job in _snapshot(self.jobs):
            self.interrupt_job(job, "the machine is shutting down")
        self._stopping = True
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout + 5)
        ended = not self._thread.is_alive()
        if ended:
            _let_go_of_left_programs()  # (this thread is another: they are freed without running)
        else:
            self._fail_jobs_held()
        self.watchdog.stop()
        self.engine.close()
        self._thread = None
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._note_collection)
        return ended

    def _fail_jobs_held(self) -> None:
        """(From the host, once the scheduler's thread failed to end: a tile computing
        without an exchange point holds it, its program catching every interrupt.) Tell
        whoever waits for a job still running that the machine stopped without it: its
        tiles' output is out of reach, in the held thread."""
        tile = self.computing_tile()
        held = f"tile {tile.id}" if tile is not None else "a tile"
        for job in _snapshot(self.jobs):
            error = RuntimeError(f"the machine stopped before job {job.id} was done: {held} was still "
                                 "computing without reaching an exchange point, its program catching "
                                 "every interrupt, and what the job's tiles printed is lost")
            with contextlib.suppress(InvalidStateError):  # (done meanwhile)
                job.future.set_exception(error)

    def on_own_thread(self) -> bool:
        """True on the scheduler's thread or its watchdog's: :meth:`stop` waits for both to
        end, so neither may call it."""
        current = threading.current_thread()
        return current is self._thread or current is self.watchdog.thread

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    def computing_tile(self) -> Tile | None:
        """The tile whose program holds the scheduler's thread right now, or None. From
        any thread, as a snapshot: a tile that computes without reaching an exchange
        point holds every other tile and every request, so this is who to blame (and
        ``ipuos kill`` its job) when the machine does not answer."""
        if not self.in_compute:
            return None
        tile = running_tile(sys._current_frames().get(self.thread_ident))
        return tile if self.in_compute else None

    def compute_progress(self) -> tuple[float, int, int] | None:
        """(From any thread, as a snapshot.) The compute phase running now: the seconds
        since it began, how many of its tiles have computed so far, and how many it
        began with; None between compute phases. Tiles compute one after another, so a
        superstep lasts as long as all of its tiles' compute together: a phase many
        tiles into it is slow as a whole, not held by the tile computing now."""
        if not self.in_compute:
            return None
        began, tiles, left = self.compute_began, self.compute_tiles, len(self.runq)
        return time.monotonic() - began, max(0, tiles - left - 1), tiles

    def running_where(self) -> str:
        """Where the code running now is: ``"tile 3"`` (its greenlet), ``"the scheduler's
        loop"`` or ``"host thread 'NAME'"``, for errors that say where something was
        called from (see Tile.elsewhere)."""
        tile = self.tile_of.get(greenlet.getcurrent())
        if tile is not None:
            return f"tile {tile.id}"
        if threading.get_ident() == self.thread_ident:
            return "the scheduler's loop"
        return f"host thread {threading.current_thread().name!r}"

    def _thread_main(self) -> None:
        pin_thread()  # host requests hand off to this thread: see ipuos._affinity
        main = self._main = greenlet.getcurrent()
        self.to_main = main.switch
        park = parker(main, self.runq)
        for tile in self.tiles:
            tile.start(main, self.runq, park)
            self.tile_of[tile.glet] = tile
        self.thread_ident = threading.get_ident()
        self.ctrl_c_settle.attach()
        self._started.set()
        try:
            self._loop()
        except BaseException:
            self.report_internal_error("the scheduler loop crashed", traceback.format_exc())
        finally:
            self._shutdown_tiles()

    # -- host side (any thread) ----------------------------------------------------------

    def call(self, fn: Callable, *args) -> Future:
        """Run ``fn(*args)`` on the scheduler thread between supersteps."""
        future: Future = Future()
        self._enqueue(future, fn, args)
        return future

    def call_soon(self, fn: Callable, *args) -> None:
        """:meth:`call` with no result to wait for: a failure is reported as the
        scheduler's own internal error (``status`` shows it)."""
        self._enqueue(None, fn, args)

    def call_later(self, delay: float, fn: Callable, *args) -> None:
        """:meth:`call_soon` in ``delay`` seconds (nothing if the machine has stopped by then)."""
        def due() -> None:
            with contextlib.suppress(RuntimeError):  # (stopped meanwhile)
                self.call_soon(fn, *args)

        timer = threading.Timer(delay, due)
        timer.daemon = True
        timer.start()

    def call_wait(self, fn: Callable, *args, timeout: float | None = None):
        """:meth:`call` and wait for the result (runs inline on the scheduler thread)."""
        if threading.get_ident() == self.thread_ident:
            return fn(*args)
        return self.call(fn, *args).result(timeout)

    def submit(self, tile_id: int, service: str, *args) -> Future:
        """Send kernel request ``service(*args)`` to tile ``tile_id``; a Future of its reply.
        TypeError if ``tile_id`` is no integer (numpy's are)."""
        future: Future = Future()
        self._enqueue(None, self._deliver_host_request, (_tile_id(tile_id), service, args, future))
        return future

    def submit_all(self, tile_ids: Iterable[int], service: str, *args) -> dict[int, Future]:
        """:meth:`submit` of the same request to every tile of ``tile_ids``: {tile: Future}.

        One queued call for them all: submitting one at a time wakes the scheduler thread
        per tile, and its wake-ups then fight the caller for the lock (1472 tiles took
        25-230 ms that way, against a few ms at once). Served in the same superstep."""
        futures = {_tile_id(tile_id): Future() for tile_id in tile_ids}
        # (a list of its own: the caller owns the dict and may add to it meanwhile)
        self._enqueue(None, self._deliver_host_requests, (service, args, list(futures.items())))
        return futures

    def _deliver_host_requests(self, service: str, args: tuple, requests: list[tuple[int, Future]]) -> None:
        deliver = self._deliver_host_request
        for tile_id, future in requests:
            deliver(tile_id, service, args, future)

    def check_running(self) -> None:
        """RuntimeError saying why, unless the machine takes calls now."""
        if self.running and not self._closed:
            return
        if self._stopping or self._closed:
            raise RuntimeError("the machine has been shut down and runs nothing more: start a new one")
        if self._thread is None:
            raise RuntimeError("the machine is not running: it has not been started")
        raise RuntimeError("the machine is not running: its scheduler thread ended (see its internal errors)")

    def _enqueue(self, future, fn, args) -> None:
        with self._cond:  # (the lock: a call is never queued after shutdown failed the rest)
            self.check_running()
            self._calls.append((future, fn, args))
            self._cond.notify()

    def start_job(
        self,
        tile_ids: Iterable[int],
        target: Callable[[TileAPI], object],
        name: str = "job",
        budget: float | None = None,
        timeout: float | None = None,
    ) -> Job:
        """Launch ``target(api)`` on every tile in ``tile_ids`` (rank order = list order).

        Thread-safe. Returns the Job; ``job.future`` resolves to a :class:`JobReport`.
        TileBusyError if any tile already runs a job; ValueError for a ``budget`` that is
        not a positive, finite number of seconds.

        Jobs start between supersteps, so a tile computing without an exchange point
        holds the start up. TimeoutError if that takes over ``timeout`` seconds; then,
        as when the wait is given up any other way (Ctrl-C), the job never starts: only
        the caller would have had its handle to stop it.
        """
        if budget is not None:
            budget = budget_seconds(budget)
        ids = list(tile_ids)
        if threading.get_ident() == self.thread_ident:
            return self._start_job(ids, target, name, budget)
        future = self.call(self._start_job, ids, target, name, budget)
        try:
            return future.result(timeout)
        except BaseException as exc:
            if not future.cancel():  # (taken meanwhile: it started, or failed to)
                try:
                    job = future.result()
                except BaseException:
                    raise exc from None
                self.interrupt_job(job, "interrupted: the caller stopped waiting for it to start")
            if isinstance(exc, _FutureTimeout):
                raise not_started(name, timeout) from None
            raise

    def interrupt_job(self, job: Job, reason: str = "interrupted by the user", ctrl_c: bool = False) -> None:
        """Stop every tile of ``job`` (thread-safe; works on tiles stuck in pure compute).
        A job that has finished is left alone (the watchdog would keep it forever).

        ``ctrl_c``: the user's Ctrl-C, a KeyboardInterrupt in the program, once on each
        tile, which the program may catch (see TileKeyboardInterrupt); else a
        TileInterrupt, raised again until the tile stops (``kill``, a client gone)."""
        if job.future.done():
            return
        if job.abort_reason is None:
            job.abort_reason = reason  # before the watchdog's bare exception can land
        kind = TileKeyboardInterrupt if ctrl_c else TileInterrupt
        on_thread = threading.get_ident() == self.thread_ident
        if not ctrl_c:
            job.stop_asked(time.monotonic())
        if ctrl_c:
            job.ctrl_cs += 1
            # (before the watchdog may hand a computing tile its Ctrl-C: see Job.hand_over_ctrl_c)
            job.ctrl_c_queued = not on_thread
        self.watchdog.interrupt(job, kind)
        if on_thread:
            job.interrupt(reason, kind)
        else:
            # the watchdog may stop a computing tile at once; the others get theirs at the
            # next exchange, before it reads anything into a tile having gone (a collective
            # that "needs tile 3, which already stopped"); the call does it if that is later
            interrupt = _HostInterrupt(job, reason, kind)
            self._interrupts_due.append(interrupt)
            self.call(interrupt.hand)

    # -- scheduler thread ----------------------------------------------------------------

    def wake(self, tile: Tile) -> None:
        """Make ``tile`` runnable next superstep (harmless if it has nothing to do)."""
        self._runnable.append(tile.resume)

    def still_to_run(self) -> set:
        """The tiles still to be resumed in the superstep computing now (none between
        supersteps)."""
        if not self.in_compute or not self.runq:
            return set()
        queued = set(self.runq)
        running = self.tile_of.get(greenlet.getcurrent())  # (woken twice, it may be queued again)
        return {tile for tile in self.tiles if tile.resume in queued and tile is not running}

    def leave_program(self, tile: Tile) -> None:
        """Leave ``tile``'s program at the exchange point it has reached, never to run it
        again: it caught a stop raised at an exchange point and ran on to this one (see
        Tile.caught_a_stop), as a process that ignores SIGTERM gets SIGKILL. Nothing
        else would end it: raised again, it would be caught again.

        Its part of the job ends as the job's first stop said (interrupted, or aborted by
        another tile's failure or the budget); the program's own target ends it as far as
        it can without running it (``leave_hook``: its globals let go of, the files it
        left open closed, what it printed kept). The tile's kernel goes on in a new
        greenlet. The old one, whose
        stack holds the program's frames, is kept parked for good: a greenlet freed while
        suspended has GreenletExit thrown into it, which the program would catch too.
        (A program that computes on after catching, with no exchange point, is beyond
        this: only the watchdog reaches it, with stops it catches.)"""
        job, rank, old = tile.job, tile.rank, tile.glet
        tile.raised = tile.signal = None
        # (the hook's own exchanges must not come back here, nor a stop landing in a
        # __del__ it runs be taken for one the program caught)
        tile.stop_taken = False
        tile.code_over = True
        # (the tile over the budget too: it caught the budget's exception, as any stop)
        kind, words = job.first_stop()
        status = ABORTED if issubclass(kind, JobAborted) else INTERRUPTED
        error = kind(f"{words}; its program caught that and ran on, and its tile left it at its next "
                     "exchange point")
        hook, tile.leave_hook = tile.leave_hook, None
        if hook is not None:
            try:
                hook()
            except (TileInterrupt, JobAborted):
                pass  # (stopped again as it let go: what it held is let go of all the same)
            except Exception:
                self.report_internal_error(f"tile {tile.id}: ending a program it left failed",
                                           traceback.format_exc())
        _release_tile(tile)
        tile.service_depth = 0  # (the old greenlet's services are never returned to)
        del self.tile_of[old]
        _park_for_good(old)
        tile.start(self._main, self.runq, tile.park)
        self.tile_of[tile.glet] = tile
        job.finish_tile(tile, TileResult(rank, tile.id, status, error=error), "")
        self.wake(tile)  # (the new kernel serves what is queued for the tile)
        park = tile.park
        while True:  # a wake the old greenlet still had is passed on
            park()

    def hand_ctrl_c_later(self, job: Job) -> None:
        """Have this superstep's exchange hand ``job``'s Ctrl-C to the tiles it was left
        for that have not reached an exchange point by then (see Job.raise_in_tiles).
        Meanwhile a tile of them that computes takes it there (see CtrlCSettle), or
        where the scheduler thread is traced by someone else, the watchdog stops it: it
        looks often then, and the GIL changes hands often enough for it to (1472 tiles
        in `while True: pass` took 23 s, a tick each)."""
        self._ctrl_c_later.append(job)
        if not self.ctrl_c_settle.counting:  # (it began as the Ctrl-C was made: see CtrlCSettle)
            self.watchdog.hurry()

    def ctrl_c_left_for_later(self) -> bool:
        """Whether a Ctrl-C left for tiles' next exchange point is still due to one of
        them (see hand_ctrl_c_later; any thread: the watchdog asks)."""
        try:
            return any(job.ctrl_c_due(tile.rank) for job in tuple(self._ctrl_c_later)
                       for tile in tuple(job.ctrl_c_later))
        except RuntimeError:  # (changed size meanwhile: look again next time)
            return True

    def _loop(self) -> None:
        calls = self._calls
        clock = time.monotonic
        shared_at = clock()
        while True:
            if calls:
                self._run_calls()
            if self._stopping:
                return
            if not self._runnable and not self._exchange_pending():
                with self._cond:
                    while not calls and not self._stopping:
                        self._cond.wait()
                shared_at = clock()
                continue
            self._superstep()
            if clock() - shared_at > GIL_SHARE_EVERY:
                # supersteps back to back release the GIL only for moments (numpy's copies),
                # each time taking it back before a waiting thread wakes: CPython then never
                # forces a switch, and the host's threads (the daemon's connections, the
                # mount) waited seconds for it. A real pause hands it over
                time.sleep(GIL_HANDOVER)
                shared_at = clock()

    def _superstep(self) -> None:
        # written like a bare greenlet loop: per-tile work here costs 1472x per superstep
        runnable, self._runnable = self._runnable, []
        runq = self.runq
        runq.extend(runnable)
        popleft = runq.popleft
        self.compute_began = time.monotonic()
        self.compute_tiles = len(runq)
        self.in_compute = True
        while runq:  # each parking tile resumes the next; the last comes back here
            popleft()()
        self.in_compute = False
        self._exchange_phase()

    def _run_calls(self) -> None:
        calls = self._calls
        while calls:
            future, fn, args = calls.popleft()
            if future is not None and not future.set_running_or_notify_cancel():
                continue  # its caller gave up waiting (see start_job)
            try:
                result = fn(*args)
            except BaseException as exc:
                if future is None:
                    self.report_internal_error(f"host call {fn!r} failed", traceback.format_exc())
                else:
                    future.set_exception(exc)
            else:
                if future is not None:
                    future.set_result(result)

    def _answer_hosts(self) -> None:
        """Resolve the Futures of the host requests answered since the last exchange (at
        shutdown, some of never-served ones, which their host may have cancelled)."""
        replies, self._host_replies = self._host_replies, []
        for future, ok, value in replies:
            if not ok:
                _refuse(future, value)
                continue
            try:
                future.set_result(value)
            except InvalidStateError:
                pass

    def _exchange_pending(self) -> bool:
        return bool(
            self.engine.has_posted() or self._ready_jobs or self._finished_jobs
            or self._host_replies or self._deferred_replies or self._before_copies
        )

    def _exchange_phase(self) -> None:
        if self._interrupts_due or self._ctrl_c_later:
            self._hand_interrupts()
        if self.ctrl_c_settle.counting and not self._ctrl_c_later:
            self.ctrl_c_settle.stop()  # (every tile still due a Ctrl-C raises it as it resumes)
        engine = self.engine
        engine.settle()
        engine.deliver_p2p(self._land)
        if self._before_copies:
            hooks, self._before_copies = self._before_copies, []
            for hook in hooks:
                hook()
        engine.deliver_dma()
        if self._ready_jobs:
            ready, self._ready_jobs = self._ready_jobs, []
            for job in ready:
                if job.arrived and job.arrived >= job.nlive:
                    _collectives.complete(job)
        if self.jobs:
            self._detect_deadlocks()
        if self._finished_jobs:
            finished, self._finished_jobs = self._finished_jobs, []
            for job in finished:
                self._finalise_job(job)
        if self._host_replies:
            self._answer_hosts()
        engine.reset_out_buffers()
        if self._deferred_replies:
            deferred, self._deferred_replies = self._deferred_replies, []
            for server, client, payload in deferred:
                self._post_reply_payload(server, client, payload)
        engine.end_superstep(self._chips_in_use, self.jobs.values(), self.tiles)
        self.superstep += 1

    def hand_interrupts_due(self) -> None:
        """Hand out the interrupts host threads have asked for (see interrupt_job), now
        (scheduler thread or tile greenlets)."""
        due, self._interrupts_due = self._interrupts_due, []
        for interrupt in due:
            interrupt.hand()

    def _hand_interrupts(self) -> None:
        """Before the exchange judges any collective: the interrupts host threads asked
        for, and the Ctrl-Cs tiles were to take at their next exchange point."""
        self.hand_interrupts_due()
        later, self._ctrl_c_later = self._ctrl_c_later, []
        for job in later:
            job.take_ctrl_c_later()

    # -- messages arriving ---------------------------------------------------------------

    def _land(self, dst: Tile, arrivals) -> None:
        view = self.engine.view
        for kind, meta, src, abs_off, length, msg in arrivals:
            if kind == KIND_USER:  # (for the receiver's own job: the engine dropped others)
                job, src_rank, key = meta
                if type(key) is tuple and key[2] < job.ctrl_c_epoch(dst.rank):
                    continue  # a collective's part sent before a Ctrl-C the receiver took (see TileAPI._part_key)
                msg.src_rank = src_rank
                queue = dst.inbox.get(key)
                if queue is None:
                    queue = dst.inbox[key] = collections.deque()
                queue.append(msg)
                dst.land(msg)
                if dst.recv_src >= 0:
                    job.progress = True
                    self._runnable.append(dst.resume)
                continue
            payload = decode(view[abs_off : abs_off + length])
            if kind == KIND_REQUEST:
                tag, service, args = payload
                if not dst.alive:
                    self._queue_reply(dst, src, tag, False, TileFailed(5, f"tile {dst.id} is not answering"))
                    continue
                dst.queue(Request(service, args, self._tile_replier(dst, src, tag)))
            else:  # KIND_REPLY
                tag, ok, value = payload
                if tag in dst.given_up:  # its caller stopped waiting (see call_tile)
                    abandoned = dst.given_up.pop(tag)
                    if abandoned is not None:
                        abandoned(ok, value)
                    continue
                dst.replies[tag] = (ok, value)
            self._runnable.append(dst.resume)
        if dst.in_live == 0:
            dst.in_used = 0
        if dst.signal is not None:  # e.g. its incoming buffer overflowed: it fails now
            self._runnable.append(dst.resume)

    def _tile_replier(self, server: Tile, client: Tile, tag: int):
        return lambda ok, value: self._queue_reply(server, client, tag, ok, value)

    def _queue_reply(self, server: Tile, client: Tile, tag: int, ok: bool, value) -> None:
        try:
            payload = encode((tag, ok, value))
        except TypeError as exc:
            payload = encode((tag, False, TypeError(f"the reply could not be sent: {exc}")))
        self._post_reply_payload(server, client, payload)

    def _post_reply_payload(self, server: Tile, client: Tile, payload: bytes) -> None:
        engine = self.engine
        if len(payload) > server.xout.size:
            tag = decode(payload)[0]
            payload = encode((tag, False, ValueError(
                f"a reply of {len(payload)} B is larger than tile {server.id}'s outgoing "
                f"exchange buffer ({server.xout.size} B); ask for less at a time"
            )))
        try:
            off = engine.write_out(server, payload)
        except ValueError:  # the buffer is full this superstep: send it with the next one
            engine.make_room(server)
            self._deferred_replies.append((server, client, payload))
            return
        engine.post(server, client, off, len(payload), KIND_REPLY, None)

    def _deliver_host_request(self, tile_id: int, service: str, args: tuple, future: Future) -> None:
        # (a host that gave up waiting cancels the Future; one that has not started is
        # dropped: see Request.begin)
        if type(tile_id) is not int or not 0 <= tile_id < self.ntiles:
            _refuse(future, IndexError(f"no tile {tile_id!r}: this machine has tiles 0-{self.ntiles - 1}"))
            return
        tile = self.tiles[tile_id]
        if not tile.alive:
            _refuse(future, TileFailed(5, f"tile {tile_id} is not answering (it has failed)"))
            return
        # the reply goes to the list of the superstep that serves the request, which is a
        # later one than this if the tile is busy (e.g. paused inside a filesystem call)
        tile.queue(Request(service, args, lambda ok, value: self._host_replies.append((future, ok, value)),
                           future.set_running_or_notify_cancel))
        self._runnable.append(tile.resume)

    # -- kernel calls between tiles (on tile greenlets) ----------------------------------

    def call_tile(self, tile: Tile, dst_id: int, service: str, *args, abandoned=None):
        """From ``tile``'s greenlet: run ``service(*args)`` on tile ``dst_id`` and return its result.

        The request and the reply ride the exchange like any other message, so they cost
        a superstep each and are limited by the exchange buffers. If the wait ends in an
        exception (an interrupt), the reply is dropped when it comes, after
        ``abandoned(ok, value)`` if given (on the scheduler thread: it must not wait; an
        open whose file nobody will close can close it with :meth:`post_request`).
        """
        tile.check_own_greenlet("a request to tile {}", dst_id)  # (before it is sent: see Tile.elsewhere)
        if tile.stop_taken and tile.caught_a_stop() and tile.job.past_stop_grace(tile):
            self.leave_program(tile)  # (a remote file operation: an exchange point of its own)
        if dst_id == tile.id:
            return self.services[service](tile, *args)
        if not 0 <= dst_id < self.ntiles:
            raise IndexError(f"no tile {dst_id}: this machine has tiles 0-{self.ntiles - 1}")
        tag = next(self._call_tags)
        payload = encode((tag, service, args))
        off = self.engine.write_out(tile, payload)
        self.engine.post(tile, self.tiles[dst_id], off, len(payload), KIND_REQUEST, None)
        replies = tile.replies
        try:
            tile.wait(lambda: tag in replies, f"reply from tile {dst_id}")
        except BaseException:
            if tag in replies:
                ok, value = replies.pop(tag)
                if abandoned is not None:
                    abandoned(ok, value)
            else:
                tile.given_up[tag] = abandoned
            raise
        ok, value = replies.pop(tag)
        if ok:
            return value
        try:
            raise value
        finally:
            # (else this frame, in the error's traceback, holds the error: a cycle that
            # keeps what its callers hold, such as a dropped file, until the collector runs)
            del value

    def post_request(self, dst_id: int, service: str, *args) -> None:
        """Have tile ``dst_id`` run ``service(*args)`` when it can, nobody waiting for it
        (a failure is reported as an internal error; a failed tile is sent nothing).
        Scheduler thread or tile greenlets."""
        tile = self.tiles[dst_id]
        if not tile.alive:
            return
        tile.queue(Request(service, args, None))
        self._runnable.append(tile.resume)

    def call_tiles(self, tile: Tile, calls) -> list[tuple[bool, object]]:
        """From ``tile``'s greenlet: many kernel calls at once, all riding one exchange.

        ``calls`` are ``(dst_id, service, args)``; the result is ``(ok, value)`` per call,
        in order (``value`` is the exception when ``ok`` is False), so one failing tile
        does not hide the others' answers. Calls to ``tile`` itself run directly.
        """
        tile.check_own_greenlet("requests to other tiles")
        results: list = [None] * len(calls)
        pending: dict[int, int] = {}
        for index, (dst_id, service, args) in enumerate(calls):
            if dst_id == tile.id or not 0 <= dst_id < self.ntiles:
                try:
                    results[index] = (True, self.call_tile(tile, dst_id, service, *args))
                except Exception as exc:
                    results[index] = (False, exc)
                continue
            tag = next(self._call_tags)
            payload = encode((tag, service, tuple(args)))
            try:
                off = self.engine.write_out(tile, payload)
            except ValueError as exc:  # this superstep's buffer is full: the rest go next time
                if not pending:
                    results[index] = (False, exc)
                    continue
                self._await_replies(tile, pending, results)
                off = self.engine.write_out(tile, payload)
            self.engine.post(tile, self.tiles[dst_id], off, len(payload), KIND_REQUEST, None)
            pending[tag] = index
        self._await_replies(tile, pending, results)
        return results

    def _await_replies(self, tile: Tile, pending: dict[int, int], results: list) -> None:
        replies = tile.replies
        try:
            tile.wait(lambda: all(tag in replies for tag in pending),
                      plural(len(pending), "tile's reply", "tiles' replies"))
        except BaseException:
            for tag in pending:  # (see call_tile)
                if replies.pop(tag, None) is None:
                    tile.given_up[tag] = None
            raise
        for tag, index in pending.items():
            results[index] = replies.pop(tag)
        pending.clear()

    def remote_copy(self, tile: Tile, transfers, what: str = "remote memory") -> None:
        """From ``tile``'s greenlet: copy SRAM ranges at the next exchange and wait for it.

        ``transfers`` are ``(remote_tile_id, src_offset, dst_offset, nbytes)`` with offsets
        into the machine-wide SRAM; the remote tile's own greenlet is not involved (the
        exchange fabric moves the bytes), but if it has failed the copy raises TileFailed.
        All transfers ride one exchange. Requests are not served meanwhile: the caller is
        typically inside a filesystem operation.
        """
        if not transfers:
            return
        tile.check_own_greenlet("{}", what)
        outcome: list = []

        def done(error):
            outcome.append(error)
            self._runnable.append(tile.resume)

        tiles = self.tiles
        self.engine.post_dma(tile, [(tiles[remote_id], src, dst, nbytes)
                                    for remote_id, src, dst, nbytes in transfers], done)
        tile.fs_depth += 1
        try:
            tile.wait(lambda: outcome, what)
        finally:
            tile.fs_depth -= 1
        if outcome[0] is not None:
            raise outcome[0]

    def live_jobs(self) -> list[Job]:
        """The jobs not finished yet (any thread: a copy of the table as it is now)."""
        return _snapshot(self.jobs)

    def before_copies(self, hook: Callable[[], None]) -> None:
        """Run ``hook()`` at the next exchange, on the scheduler thread, just before the
        remote copies of that superstep are carried out: a device posts copies there
        that nobody waits for (the striped device's write-back after a sync). Every tile
        is parked then, so the hook may read the state of any tile's device."""
        self._before_copies.append(hook)

    def wait_job(self, tile: Tile, job: Job) -> JobReport:
        """From ``tile``'s greenlet: wait until ``job`` has finished on every tile."""
        if not job.future.done():
            job.waiters.append(tile)
            tile.wait(job.future.done, f"job {job.id}")
        return job.future.result()

    # -- jobs ----------------------------------------------------------------------------

    def _start_job(self, tile_ids: list[int], target, name: str, budget: float | None) -> Job:
        if not tile_ids:
            raise ValueError("a job needs at least one tile")
        if len(set(tile_ids)) != len(tile_ids):
            raise ValueError("a job cannot use a tile twice")
        tiles = [self.tiles[i] for i in tile_ids]
        busy = [t for t in tiles if t.job is not None]
        if busy:
            jobs = sorted({t.job.id for t in busy})
            verb = "runs" if len(busy) == 1 else "run"
            several = len(jobs) > 1
            raise TileBusyError(
                f"{describe_tiles(t.id for t in busy)} already {verb} job{'s' if several else ''} "
                f"{', '.join(map(str, jobs))}; wait for {'them' if several else 'it'} or kill "
                f"{'them' if several else 'it'} first"
            )
        dead = [t.id for t in tiles if not t.alive]
        if dead:
            verb = "has" if len(dead) == 1 else "have"
            raise TileFailed(5, f"{describe_tiles(dead)} {verb} failed and cannot run programs")
        job = Job(self, next(self._job_ids), tiles, target, name, budget)
        # started by a tile's code (the shell's `run`), mid-superstep: every tile begins in
        # the next one, the starting tile too, or what it sent in this one would reach
        # the others in their first superstep
        job.first_superstep = self.superstep + int(self.in_compute)
        self.jobs[job.id] = job
        self._count_chips()
        for rank, tile in enumerate(tiles):
            tile.job = job
            tile.rank = rank
            tile.signal = None  # whatever was meant for the job before is over with it
            tile.queue(Request("job.run", (job,), None))
        self._runnable.extend(t.resume for t in tiles)
        if budget:
            self.watchdog.watch(job)
        return job

    def _job_finished(self, job: Job) -> None:
        self._finished_jobs.append(job)

    def _finalise_job(self, job: Job) -> None:
        self.jobs.pop(job.id, None)
        self._count_chips()
        try:
            job._finalise_stats()
        except Exception:  # (the job's results still go to whoever waits for them)
            self.report_internal_error(f"job {job.id}'s statistics failed", traceback.format_exc())
        report = JobReport(job.id, job.name, job.ids, list(job.results), job.stats)
        job.future.set_result(report)
        self._runnable.extend(t.resume for t in job.waiters)
        job.waiters.clear()
        self.watchdog.forget(job)

    def _count_chips(self) -> None:
        per_chip = self.tiles_per_chip
        self._chips_in_use = len({tile_id // per_chip for job in self.jobs.values() for tile_id in job.ids})

    def _detect_deadlocks(self) -> None:
        for job in list(self.jobs.values()):
            if job.stopping:
                continue  # its tiles are being stopped: waiting on each other is expected
            if job.finished_changed:
                job.finished_changed = False
                if self._fail_hopeless_recvs(job):
                    continue  # those tiles fail now, and with them the job: no deadlock
            if job.progress:
                job.progress = False
                continue
            waiting = job.arrived + job.nrecv
            if job.nlive and job.arrived < job.nlive and waiting >= job.nlive:
                if any(tile.signal is not None for tile in job.live.values()):
                    continue  # a tile has an error to raise: it wakes with that
                if job.ctrl_c_queued:
                    # a tile that caught a Ctrl-C computing waits on the others, whose is
                    # still queued: it wakes them (see Job.hand_over_ctrl_c)
                    job.hand_over_ctrl_c()
                    continue
                if any(tile.service_depth > tile.program_depth for tile in job.live.values()):
                    continue  # a tile serves a request from inside its wait: that is under way
                if self._fail_hopeless_recvs(job):
                    continue  # the more specific report: those tiles fail, and the job with them
                waits = {tile.waiting or "sync()" for tile in job.live.values()}
                if len(waits) > 1 and all(map(_in_collective, waits)):
                    # every tile is in a collective, not all the same one: a reduction's
                    # tree waits in recv, so this is where such a mismatch shows
                    error = CollectiveMismatchError(job.mismatch_report())
                else:
                    error = DeadlockError(
                        f"deadlock in job {job.id}: every live tile waits and nothing in "
                        f"flight can wake them: {job.waiting_report()}"
                    )
                job.fail_waits(error)

    def _fail_hopeless_recvs(self, job: Job) -> bool:
        """Signal every tile waiting to recv from a tile that has finished; True if any."""
        failed = False
        for tile in job.live.values():
            src = tile.recv_src
            if src == ANY_SOURCE:
                continue  # (hopeless only when no live tile could send: the deadlock check's case)
            if src >= 0 and job.results[src] is not None and not _has_mail_from(tile, src) and tile.signal is None:
                if _in_collective(tile.waiting or ""):  # (a reduction's tree waits in recv)
                    tile.signal = job.missing_tiles([tile.rank], [src], tile.waiting)
                else:
                    tile.signal = DeadlockError(
                        f"{job.describe([tile.rank])} waits to recv from {job.describe([src])}, which "
                        f"{job.how_ended(src)} and sent nothing more"
                    )
                self._runnable.append(tile.resume)
                failed = True
        return failed

    # -- faults and diagnostics ----------------------------------------------------------

    def fail_tile(self, tile_id: int, failed: bool = True) -> None:
        """Fault injection: the tile stops answering exchange traffic and requests
        (``failed=False`` brings it back, its SRAM as it was)."""
        self.call_wait(self._set_failed, self.tiles[tile_id], failed)

    def _set_failed(self, tile, failed: bool) -> None:
        tile.alive = not failed
        (self.engine.failed_tiles.add if failed else self.engine.failed_tiles.discard)(tile.id)

    def report_internal_error(self, what: str, details: str) -> None:
        self.internal_errors.append(f"{what}\n{details}")

    def stats(self) -> dict:
        engine = self.engine
        return {
            "supersteps": self.superstep,
            "supersteps_with_traffic": engine.supersteps_with_traffic,
            "bytes_exchanged": int(engine.bytes_out.sum()),
            "simulated_exchange_seconds": engine.cost.seconds(engine.sim_cycles),
        }

    def _shutdown_tiles(self) -> None:
        """Interrupt jobs, let tiles leave filesystem callbacks, then end their greenlets.

        A greenlet paused inside a littlefs callback is never killed: littlefs would carry
        on with an error it cannot recover from. Such tiles are left alone.
        """
        self.ctrl_c_settle.detach()  # (stopping jobs end for good: no Ctrl-C is due now)
        for job in list(self.jobs.values()):
            self.watchdog.interrupt(job, TileInterrupt)
            job.interrupt("the machine is shutting down")
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while (self.jobs or self._runnable or self._exchange_pending()) and time.monotonic() < deadline:
            if self._calls:
                self._run_calls()
            for job in _snapshot(self.jobs):
                if job.stopped_at is not None:  # (no timer's call comes now)
                    job.wake_catchers()
            self._superstep()
        for tile in self.tiles:
            glet = tile.glet
            if glet and tile.fs_depth == 0:
                try:
                    glet.throw(greenlet.GreenletExit)
                except BaseException as exc:
                    self.report_internal_error(f"tile {tile.id} did not stop cleanly", repr(exc))
        self._fail_what_still_waits()

    def _fail_what_still_waits(self) -> None:
        """After shutdown: whoever still waits on this machine (a job that did not stop
        in the grace period, a host request never served, a host call) hears that it
        stopped, rather than waiting for ever."""
        stopped = "the machine stopped before {} was done"
        for tile in self.tiles:
            while tile.requests:
                request = tile.next_request()
                if request.reply is not None and request.begin is not None:  # (a host's)
                    request.reply(False, RuntimeError(stopped.format(f"request {request.name!r}")))
        self._answer_hosts()
        for job in list(self.jobs.values()):
            if not job.future.done():
                job.future.set_exception(RuntimeError(stopped.format(f"job {job.id}")))
        with self._cond:
            self._closed = True
            calls = list(self._calls)
            self._calls.clear()
        for future, _fn, _args in calls:
            if future is not None:
                _refuse(future, RuntimeError(stopped.format("a call")))


#: seconds of supersteps back to back after which the scheduler's thread pauses, and
#: how long, so that a host thread waiting for the GIL gets it (see Scheduler._loop)
GIL_SHARE_EVERY = 0.005  # (CPython's own switch interval)
GIL_HANDOVER = 0.0001


class _HostInterrupt:
    """An interrupt a host thread asked for: handed out once, at the next exchange or by
    the queued call, whichever comes first (a stop handed twice would stop a cleanup
    the program runs after catching the first)."""

    __slots__ = ("job", "reason", "kind", "handed")

    def __init__(self, job: Job, reason: str, kind: type):
        self.job, self.reason, self.kind = job, reason, kind
        self.handed = False

    def hand(self) -> None:
        if not self.handed:
            self.handed = True
            if not self.job.done:
                self.job.interrupt(self.reason, self.kind)


def _run_job(tile: Tile, job: Job) -> None:
    """The ``job.run`` kernel service: run the job's program on this tile."""
    api = TileAPI(tile, job)
    tile.program_depth = tile.service_depth
    try:
        if tile.signal is not None and _stops_before_start(job, tile.signal):
            tile.raise_signal()
        sched = tile.sched
        if sched.superstep < job.first_superstep:  # (see _start_job)
            sched.wake(tile)
            tile.wait(lambda: sched.superstep >= job.first_superstep, "its first superstep")
        value = job.target(api)
    except ComputeBudgetExceeded as exc:
        result = TileResult(tile.rank, tile.id, ERROR, error=job.name_stop(exc, tile.rank))
    except (TileInterrupt, JobAborted) as exc:
        job.name_stop(exc, tile.rank)
        status = ABORTED if isinstance(exc, JobAborted) else INTERRUPTED
        result = TileResult(tile.rank, tile.id, status, error=exc)
    except greenlet.GreenletExit as exc:
        if not tile.sched.running:  # the machine is ending the tile's greenlet (_shutdown_tiles)
            raise
        # a program's own (reachable through BaseException.__subclasses__()): an error
        # like any, which must not end the tile's kernel loop and leave the job unfinished
        result = TileResult(tile.rank, tile.id, ERROR, error=exc)
    except BaseException as exc:
        result = TileResult(tile.rank, tile.id, ERROR, error=exc)
    else:
        if tile.rank in job.over_budget_ranks:  # it caught the budget's exception, and ended
            result = TileResult(tile.rank, tile.id, ERROR, error=ComputeBudgetExceeded(job.budget_message(tile.rank)))
        else:
            result = TileResult(tile.rank, tile.id, OK, value=value)
    # a program's exception class may have a __str__ of its own: it runs while the tile
    # still belongs to the job, where an interrupt or the compute budget can stop it
    failure = job.failure_of(result) if result.status == ERROR else ""
    try:
        _release_tile(tile)
    finally:
        # an interrupt the watchdog aimed at the program may still land here, after it
        # ended: the job must count the tile as finished all the same, or it never ends
        job.finish_tile(tile, result, failure)


def _stops_before_start(job: Job, signal: BaseException) -> bool:
    """Whether a tile of ``job`` whose turn comes after ``signal`` skips its program.

    Interrupted (Ctrl-C, kill, shutdown) or failed on a compute budget, the job is over on
    every tile at once: a tile is not started only to be stopped (a job whose tiles never
    pause would take the watchdog a tick per tile: 20 s a chip). After another tile's
    exception a tile still runs to its next exchange point, as tiles computing side by
    side on the chip would, and may fail in its own way."""
    if isinstance(signal, TileInterrupt):
        return True
    failure = job.first_failure
    return failure is not None and isinstance(failure.error, ComputeBudgetExceeded)


#: greenlets holding programs their tiles left (see Scheduler.leave_program), by their
#: scheduler's thread: freed only once that has ended (a greenlet freed on its own, live
#: thread is thrown GreenletExit; on a dead one's, it is let go of without running)
_LEFT_BEHIND: dict[threading.Thread, list[greenlet.greenlet]] = {}

#: CPython's way to write a frame's local variables back (gone in 3.13: then they stay)
_locals_to_fast = getattr(ctypes.pythonapi, "PyFrame_LocalsToFast", None)


def _park_for_good(glet: greenlet.greenlet) -> None:
    """Keep ``glet`` (this thread's, holding the caller's frames) until this thread has
    ended, without what the left program's functions hold in their local variables
    (its globals its target let go of: see TileProgram): 20 MB a function held stayed
    with every kill. Its frames never run again, so they may hold None."""
    _let_go_of_left_programs()
    _LEFT_BEHIND.setdefault(threading.current_thread(), []).append(glet)
    if _locals_to_fast is None:
        return
    frame = sys._getframe(2)  # (below leave_program, which still runs)
    while frame is not None:
        if TILE_GLOBALS_MARKER in frame.f_globals and frame.f_code.co_flags & inspect.CO_OPTIMIZED:
            local = frame.f_locals  # (a snapshot: written back below)
            for name in frame.f_code.co_varnames:  # (not cells: a closure may share them)
                if name in local:
                    local[name] = None
            _locals_to_fast(ctypes.py_object(frame), ctypes.c_int(0))
        frame = frame.f_back


def _let_go_of_left_programs() -> None:
    """Let go of the left programs' greenlets whose thread has ended (never those of
    the calling thread, which is alive: freed here, they would run)."""
    for thread in list(_LEFT_BEHIND):  # (a copy: other machines' threads add theirs)
        if not thread.is_alive():
            _LEFT_BEHIND.pop(thread, None)


def _release_tile(tile: Tile) -> None:
    if tile.inbox:
        # the program's messages it never received are dropped with it, as are those sent
        # to it once it has finished (program messages are filed under int keys)
        unreceived = sum(len(queue) for key, queue in tile.inbox.items() if type(key) is int)
        tile.job.stats.dropped_messages += unreceived
    tile.sched.left_for_exchange.pop(tile, None)  # (the program's session has done it at its end)
    tile.job = None
    tile.program_depth = -1
    tile.program_globals = None
    tile.rank = -1
    tile.signal = None
    tile.raised = None  # (its traceback holds the program's frames)
    tile.leave_hook = None
    tile.stop_taken = tile.stop_injected = False
    tile.code_over = False
    tile.refused_in, tile.refusals = -1, 0
    tile.waiting = None
    tile.recv_src = -1
    tile.inbox.clear()
    for msg in tile.in_msgs:
        msg.off = -1
    tile.in_msgs.clear()
    tile.in_live = 0
    tile.in_used = 0


def not_started(name: str, timeout: float) -> TimeoutError:
    """The error of a job the machine did not take within ``timeout`` seconds."""
    return TimeoutError(f"{name} did not start within {timeout:g} s: the machine takes a job between "
                        "supersteps, and a tile is computing without reaching an exchange point")


def _tile_id(tile_id) -> int:
    """A host's tile id as an int (a numpy integer is one): TypeError if it is no integer."""
    if not isinstance(tile_id, bool):
        try:
            return operator.index(tile_id)
        except TypeError:
            pass
    raise TypeError(f"a tile id is an integer, not {tile_id!r}")


def _refuse(future: Future, error: BaseException) -> None:
    """Fail a host request's Future, unless its requester has cancelled it already."""
    try:
        future.set_exception(for_host(error))
    except InvalidStateError:
        pass


def _in_collective(wait: str) -> bool:
    """Whether a tile's wait label is a collective's: ``sync()``, ``allreduce()``,
    ``bcast(root=0)`` (a reduction's tree recv carries its collective's label), not
    ``recv from tile 3`` or any other wait."""
    return wait.endswith(")")


def _has_mail_from(tile: Tile, rank: int) -> bool:
    return any(queue and queue[0].src_rank == rank for queue in tile.inbox.values())


def _snapshot(table: dict) -> list:
    """The values of a dict another thread may be changing."""
    while True:
        try:
            return list(table.values())
        except RuntimeError:  # changed size during iteration: try again
            continue


