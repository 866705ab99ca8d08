"""One tile: its greenlet, its kernel loop, and the one way it waits.

Every wait is a loop that re-checks its condition after each wake, so any wake may be
spurious: wakers never need to know exactly what a tile waits for, and a tile that is
woken twice in one superstep merely parks again. While parked, a tile serves the kernel
requests queued for it (file operations from the shell, the host, other tiles), except
while it is itself inside a filesystem operation: littlefs is not re-entrant, and the
ownership rule says only this greenlet may touch this tile's filesystems.
"""

from __future__ import annotations

import collections
import threading
import traceback
from typing import TYPE_CHECKING, Callable

import greenlet

from ._errors import JobAborted, TileInterrupt, TileKeyboardInterrupt, foreign_call

#: signals that stop a job's program (a deadlock report concerns the wait it ended)
_JOB_SIGNALS = (JobAborted, TileInterrupt)

if TYPE_CHECKING:
    from ._job import Job
    from ._scheduler import Scheduler

#: how deep requests may nest while a tile waits inside a request it is serving
MAX_SERVICE_DEPTH = 8


class Request:
    """A kernel request: run service ``name`` on the owner tile and reply to ``origin``."""

    __slots__ = ("name", "args", "reply", "begin")

    def __init__(self, name: str, args: tuple, reply: Callable[[bool, object], None] | None,
                 begin: Callable[[], bool] | None = None):
        self.name = name
        self.args = args
        #: called on the serving tile with (ok, value); None for fire-and-forget requests
        self.reply = reply
        #: called just before serving: False means the requester gave up (a host that
        #: timed out cancels its Future), and the request is dropped, not served
        self.begin = begin


def parker(main: greenlet.greenlet, runq: collections.deque) -> Callable[[], None]:
    """``park`` for every tile of a scheduler: give the thread to the next tile to run
    this superstep, or, after the last, back to the scheduler's loop (``main``). One
    greenlet switch per tile instead of two (empty supersteps at 1472 tiles: ~1,100/s
    against ~965/s), and one function all tiles share, so it stays in the cache.
    """
    to_main = main.switch
    next_tile = runq.popleft

    def park() -> None:
        if runq:
            next_tile()()
        else:
            to_main()

    return park


class Tile:
    """Scheduler-side state of one tile. Tile programs never see this object directly."""

    __slots__ = (
        "id", "chip", "sched", "memory", "glet", "resume", "park",
        "job", "rank", "_signal", "raised", "waiting",
        "requests", "service_depth", "program_depth", "fs_depth", "in_op",
        "xout", "xin", "out_used", "out_held", "in_used", "in_live", "in_msgs", "inbox", "recv_src", "replies",
        "given_up", "leave_hook", "stop_taken", "stop_injected", "stop_raised_at", "code_over", "refused_in", "refusals",
        "alive", "kernel_data", "program_globals", "__weakref__",
    )  # fmt: skip

    def __init__(self, sched: "Scheduler", tile_id: int, chip: int, memory, xout, xin):
        self.id = tile_id
        self.chip = chip
        self.sched = sched
        self.memory = memory
        self.glet: greenlet.greenlet | None = None
        self.resume: Callable | None = None
        self.park: Callable | None = None
        #: the job this tile runs (None when idle), and its rank in that job
        self.job: Job | None = None
        self.rank = -1
        self._signal: BaseException | None = None  # (see the ``signal`` property)
        #: the signal raised last (a request that ends with it hands it back to the job)
        self.raised: BaseException | None = None
        #: what ends the running program's part here if the tile leaves it (its files
        #: closed, its output kept: see Scheduler.leave_program); set by the job's target
        self.leave_hook: Callable[[], None] | None = None
        #: a stop (``kill``, a second Ctrl-C, the machine halting) was raised in the
        #: running program: reaching an exchange point again, it caught that (see
        #: caught_a_stop)
        self.stop_taken = False
        #: the watchdog raised the job's stop in the program as it computed (see
        #: raise_signal)
        self.stop_injected = False
        #: when the stop was raised (time.monotonic()): see Job.grace_ends
        self.stop_raised_at = 0.0
        #: the running program's own code is over, its target tears it down (see
        #: program_code_over)
        self.code_over = False
        #: the superstep in which a collective of a program that caught its stop was last
        #: refused at once (see _api._refuse_finished)
        self.refused_in = -1
        self.refusals = 0
        #: what the tile waits for, for ``ps`` and deadlock reports (None: not waiting)
        self.waiting: str | None = None
        #: what the globals in the running program's data are (set by the tile runtime;
        #: see ``_payload.ProgramGlobals``)
        self.program_globals = None
        self.requests: collections.deque[Request] = collections.deque()
        self.service_depth = 0
        #: the service depth the job's program runs at (-1: none): deeper, the tile is
        #: serving a request while the program waits
        self.program_depth = -1
        #: >0 while inside a filesystem operation: requests are not served then
        self.fs_depth = 0
        #: the program's reduction op is running (see _api.TileAPI._combine_parts)
        self.in_op = False
        self.xout = xout
        self.xin = xin
        #: bytes of the outgoing exchange buffer used this superstep
        self.out_used = 0
        #: the ``coll_token`` of the collective whose part this tile last wrote out (its
        #: part stays in the buffer until that collective completes)
        self.out_held = None
        #: end of the received-message arena in the incoming exchange buffer
        self.in_used = 0
        #: live (not yet consumed) messages in the incoming arena, for compaction
        self.in_msgs: list = []
        self.in_live = 0
        #: user messages per sending rank, in arrival order
        self.inbox: dict[int, collections.deque] = {}
        #: the rank this tile waits to recv from (-1: not in recv)
        self.recv_src = -1
        #: replies to kernel calls this tile made, by call tag
        self.replies: dict[int, object] = {}
        #: call tags whose caller stopped waiting: their replies are dropped on arrival,
        #: after the callback kept here (or None)
        self.given_up: dict[int, object] = {}
        #: False once the tile has been failed on purpose (fault injection): it stops answering
        self.alive = True
        #: per-tile state of the layers above (the VFS keeps the tile's mounts here), so
        #: the scheduler needs to know nothing about them
        self.kernel_data: dict = {}

    def __repr__(self) -> str:
        return f"<Tile {self.id}>"

    # -- lifecycle -----------------------------------------------------------------------

    def start(self, main: greenlet.greenlet, runq: collections.deque, park: Callable[[], None]) -> None:
        """Create the tile's greenlet (in the scheduler thread; it runs on first wake).
        ``park`` (see :func:`parker`) is how it gives the thread to the next tile."""
        # the plain function, given the tile at its first switch: a bound method would
        # add a C frame to the stack greenlet copies at every switch of this tile
        glet = self.glet = greenlet.greenlet(Tile._kernel_main, parent=main)

        def first_resume() -> None:
            # a greenlet's stack begins where it is first switched to. Started from a
            # parking tile, it would begin inside that tile's stack, the next one inside
            # its, and so on down the C stack: tiles start from the scheduler's loop only
            if glet:
                self.resume = glet.switch
                glet.switch()
            elif greenlet.getcurrent() is main:
                self.resume = glet.switch
                glet.switch(self)
            else:
                runq.appendleft(first_resume)
                main.switch()

        self.resume = first_resume
        self.park = park

    def _kernel_main(self) -> None:
        """The tile's kernel: wait for requests, serve them, forever."""
        requests = self.requests
        while True:
            while not requests:
                self.waiting = None
                self.park()
            self._serve_requests()

    @property
    def state(self) -> str:
        """``idle``, ``running``, ``waiting`` or ``dead``, for ``ps`` and ``top``."""
        if not self.alive:
            return "dead"
        if self.job is None and self.service_depth == 0:
            return "idle"
        return "waiting" if self.waiting else "running"

    # -- what the tile must notice at its next exchange point ---------------------------

    @property
    def signal(self) -> BaseException | None:
        """An exception to raise at the next exchange point (abort, interrupt, deadlock)."""
        return self._signal

    @signal.setter
    def signal(self, value: BaseException | None) -> None:
        # the scheduler counts the tiles with a signal pending, so that ``sync`` can tell
        # from one shared number that it has nothing to raise (see scheduler._api)
        if (value is None) is not (self._signal is None):
            self.sched.signalled += 1 if value is not None else -1
        self._signal = value

    def queue(self, request: Request) -> None:
        """Queue ``request`` for this tile to serve (the caller wakes the tile)."""
        self.requests.append(request)
        self.sched.queued_requests += 1

    def next_request(self) -> Request:
        """Take the oldest queued request (there must be one)."""
        request = self.requests.popleft()
        self.sched.queued_requests -= 1
        return request

    # -- where code runs ---------------------------------------------------------------

    def elsewhere(self) -> str | None:
        """Where the running code is, if not on this tile's greenlet (None: on it):
        ``"tile 3"``, ``"the scheduler's loop"`` or a host thread. Only the tile's own
        greenlet may wait, exchange or touch its filesystems as the tile, yet a program's
        objects may be freed anywhere: Python's cycle collector runs wherever it is due,
        and with it the ``__del__`` of objects in reference cycles."""
        return None if greenlet.getcurrent() is self.glet else self.sched.running_where()

    def check_own_greenlet(self, what: str, *details) -> None:
        """RuntimeError unless on this tile's greenlet (see :meth:`elsewhere`): waiting
        there would park another tile's greenlet (which nothing then resumes) or switch
        greenlets from another thread, and leave this tile's state half-changed.
        (``what.format(*details)`` says what was refused: made only then.)"""
        if greenlet.getcurrent() is not self.glet:
            raise RuntimeError(foreign_call(what.format(*details), f"tile {self.id}", self.elsewhere()))

    # -- waiting -------------------------------------------------------------------------

    def wait(self, ready: Callable[[], bool], what: str) -> None:
        """Park until ``ready()`` holds, serving requests meanwhile.

        Raises the tile's pending signal (an abort, an interrupt, a deadlock report) if
        one arrives first. ``what`` describes the wait for ``ps`` and error reports. Only
        on the tile's own greenlet (RuntimeError elsewhere: see :meth:`elsewhere`).
        """
        self.check_own_greenlet("waiting for {}", what)
        while True:
            if self.stop_taken and self.signal is None and self.caught_a_stop() and self.job.past_stop_grace(self):
                # the program caught its stop, and its grace is over: raised again here, the
                # stop unwinds this wait (what it counted is given back) and, caught again,
                # the program is left at its next exchange point (see leave_if_caught)
                self.signal = self.job.stop_again()
            # never inside a filesystem operation: littlefs would be left half-way through
            # it; the signal is raised at the next exchange point after the operation. Nor
            # inside a request served while the job's program waits: the request has
            # nothing to do with the job, and the program takes the signal when it is done
            if self.signal is not None and self.fs_depth == 0 and (
                    self.job is None or self.service_depth <= self.program_depth):
                if self._over_before_failure(ready):
                    return
                self.raise_signal()
            if ready():
                return
            if self.requests:
                if self.can_serve():
                    self._serve_requests()
                    continue
                if self.job is not None and self.program_depth < 0 and self.fs_depth == 0 and (
                        self._start_own_program()):
                    continue
            self.waiting = what
            self.park()
            self.waiting = None

    def caught_a_stop(self) -> bool:
        """Whether the program caught a stop raised in it (``kill``, a second Ctrl-C, the
        machine halting, another tile's failure, the compute budget: not a first Ctrl-C,
        which it may catch) and has run on to
        another exchange point: a bare ``except:`` around its work. Past the stop's grace
        (Job.past_stop_grace), the tile leaves it there. Only where the program itself
        exchanges or waits: not inside a filesystem operation (littlefs would be left
        half-way through one), nor inside a request served meanwhile; and only a program
        the tile's kernel runs itself: one run inside a request it serves (the shell's,
        on tile 0) runs on, since its tile cannot leave it without leaving that request
        unanswered."""
        job = self.job
        return (job is not None and job.ending and self.stop_taken and self.fs_depth == 0
                and self.service_depth == self.program_depth == 1)

    def _over_before_failure(self, ready: Callable[[], bool]) -> bool:
        """Whether this wait ended before another tile's exception stopped the job: the
        wait is over (``ready()``), and the failure came in the superstep computing now,
        so after the exchange that ended it. The tile then runs on to its next exchange
        point, as tiles computing side by side on the chip would, and takes the stop
        there (keeping its output, and maybe failing in its own way)."""
        return self.runs_on_after_failure() and ready()

    def runs_on_after_failure(self) -> bool:
        """Whether the pending signal is another tile's exception that came in the
        superstep this tile computes in: the tile runs on to its next exchange point (see
        Job.abort) and takes the stop there, not where its program merely pauses, such as
        a file operation on its own disk. (An interrupt or a compute budget stops it at
        once: the job has no ``failed_in`` then.)"""
        job = self.job
        return (job is not None and job.failed_in == self.sched.superstep
                and type(self._signal) is JobAborted)

    def raise_signal(self) -> None:
        signal, self.signal = self.signal, None
        job = self.job
        if (self.stop_injected and not self.stop_taken and job is not None and job.ending
                and isinstance(signal, _JOB_SIGNALS) and not isinstance(signal, TileKeyboardInterrupt)
                and not self.code_over):
            # the watchdog raised the job's stop in the program as it computed, and it
            # caught that and ran on to this exchange point: its grace runs from then,
            # and it is left after it (see leave_if_caught), not stopped here again
            job.took_stop(self, at=self.stop_raised_at)
            self.at_next_exchange(self.leave_if_caught)
            return
        self.raised = signal
        if isinstance(signal, TileKeyboardInterrupt) and job is not None:
            # handed out with it, the Ctrl-C has a number of its own: what the handlers of
            # tiles that took it sooner have sent here already is kept for this one's
            self.drop_collective_values(before_ctrl_c=self.job.ctrl_c_epoch(self.rank))
        else:
            self.drop_collective_values()
            if job is not None and self.rank in job.stop_owed and not isinstance(signal, _JOB_SIGNALS):
                job.stop_owed.discard(self.rank)
                self.at_next_exchange(self._take_owed_stop)
            if job is not None and job.ending and isinstance(signal, _JOB_SIGNALS) and not self.code_over:
                # caught, it must not run on: past its grace, its next exchange point leaves
                # it, before it takes part (a collective that completes at once, another
                # tile gone, would never bring it to a wait)
                if not self.stop_taken:
                    job.took_stop(self)
                self.at_next_exchange(self.leave_if_caught)
        raise signal

    def _take_owed_stop(self) -> None:
        """(At the program's next exchange point after it raised the error it had
        pending when its job's stop came, see Job.stop_owed: caught, that error must not
        hide the stop. Not sooner: the program that did not catch it is torn down
        without the stop landing in the exchanges that closing its files makes.)"""
        if self.signal is None and not self.code_over:
            self.signal = self.job.stop_again()

    def program_code_over(self) -> None:
        """(From a job's target, once the program's own code has ended, before it tears
        the program down.) Closing the files it left open may exchange (one on another
        tile's disk): that is not the program running on after catching a stop, and
        must not leave it half torn down (see caught_a_stop), nor has a stop that lands
        there (in a ``__del__``, which Python ignores) be taken for one it caught."""
        self.stop_taken = False
        self.code_over = True

    def leave_if_caught(self) -> None:
        """(At the program's next exchange point after a stop was raised in it, before it
        takes part: leave it if it caught that and its grace is over, else look again at
        the one after.)"""
        if self.caught_a_stop():
            if self.job.past_stop_grace(self):
                self.sched.leave_program(self)  # (never returns)
            self.at_next_exchange(self.leave_if_caught)

    def drop_collective_values(self, before_ctrl_c: int | None = None) -> None:
        """Free the values queued for this tile by a reduction, scatter or prefix
        reduction the signal cuts short: a program that catches the error and calls it
        again would take them for its new call's. (Only collectives' channels are keyed
        by tuples, ``(channel, sender, Ctrl-C)``.) Dropped when the signal is raised, not
        when it is sent: a tile whose wait was over before a failure runs on with what it
        received (see _over_before_failure). ``before_ctrl_c``: only those sent before
        the Ctrl-C of that number (see Job.ctrl_c_epoch)."""
        inbox = self.inbox
        for key in [key for key in inbox if type(key) is tuple
                    and (before_ctrl_c is None or key[2] < before_ctrl_c)]:
            for msg in inbox.pop(key):
                self.consume(msg)

    def at_next_exchange(self, fn: Callable[[], None]) -> bool:
        """Have ``fn()`` run on this tile's greenlet when its program next reaches an
        exchange point (``sync``, a collective, ``send``, ``recv`` ...), before it takes
        part: what the program left for later is done before another tile can look (a
        file on another tile's disk that it dropped without closing, its last writes
        still buffered: CPython would have closed it at once). Once per ``fn`` until it
        has run. Only while a program runs here, and only from the scheduler's thread (a
        finalizer runs wherever it is due): False otherwise, and ``fn`` is not kept, so
        that no entry outlives the program and keeps every ``sync`` of the machine
        looking (the entry goes when the program ends, if not before)."""
        sched = self.sched
        if self.job is None or threading.get_ident() != sched.thread_ident:
            return False
        hooks = sched.left_for_exchange.setdefault(self, [])  # (one thread: no race with the pop)
        if fn not in hooks:
            hooks.append(fn)
        return True

    def kernel_state(self, key: str, make: Callable[[], object]):
        """The layers' state under ``key`` in :attr:`kernel_data`, made by ``make()`` on
        first use."""
        state = self.kernel_data.get(key)
        if state is None:
            state = self.kernel_data[key] = make()
        return state

    def can_serve(self) -> bool:
        return self.fs_depth == 0 and self.service_depth < MAX_SERVICE_DEPTH

    def land(self, msg) -> None:
        """Account a message that arrived in the incoming arena."""
        self.in_msgs.append(msg)
        self.in_live += 1

    def consume(self, msg) -> None:
        """Release a received message's bytes; an emptied arena starts over at offset 0."""
        msg.off = -1
        self.in_live -= 1
        if self.in_live == 0:
            self.in_used = 0
            self.in_msgs.clear()

    # -- serving kernel requests ---------------------------------------------------------

    def _serve_requests(self) -> None:
        requests = self.requests
        while requests and self.can_serve():
            self._serve(self.next_request())

    def _start_own_program(self) -> bool:
        """At the nesting cap, start this tile's part of its job all the same, if queued:
        a request this tile serves may be waiting for that very job (the shell waits for a
        repl block on tiles that include its own), and nothing else can start it: the tile
        would wait for itself for ever. True if it did. (The program runs one level past
        the cap and serves nothing while it waits, so the stack stays bounded.)"""
        for request in self.requests:
            if request.name == "job.run" and request.args[0] is self.job:
                self.requests.remove(request)
                self.sched.queued_requests -= 1
                self._serve(request)
                return True
        return False

    def _serve(self, request: Request) -> None:
        """Serve one request and send its reply (a failure goes to its requester)."""
        if request.begin is not None and not request.begin():
            return
        service = self.sched.services.get(request.name)
        self.service_depth += 1
        try:
            if service is None:
                raise LookupError(f"tile {self.id} has no kernel service {request.name!r}")
            args = request.args
            # one argument (job.run's) goes as a plain call: ``f(*args)`` nests the C
            # stack, and every greenlet switch copies the tile's stack
            ok, value = True, (service(self, args[0]) if len(args) == 1 else service(self, *args))
        except TileInterrupt as exc:
            ok, value = False, exc
        except Exception as exc:  # the requester gets the error; the kernel carries on
            ok, value = False, exc
        except BaseException as exc:
            # GreenletExit at shutdown must unwind the tile; anything else is reported
            if isinstance(exc, greenlet.GreenletExit):
                raise
            ok, value = False, exc
        finally:
            self.service_depth -= 1
        if not ok and value is self.raised and isinstance(value, _JOB_SIGNALS):
            # the job's abort or interrupt reached a wait inside this request: the
            # request fails with it, and the job's program must still stop at its
            # own next exchange point
            self.raised = None
            if self.job is not None and self.signal is None:
                self.signal = type(value)(*value.args)
        if request.reply is not None:
            try:
                request.reply(ok, value)
            except Exception:
                self.sched.report_internal_error(
                    f"tile {self.id}: replying to {request.name!r} failed",
                    traceback.format_exc(),
                )
        elif not ok and not isinstance(value, _JOB_SIGNALS):
            # nobody waits for this request's reply: the failure would go unseen
            self.sched.report_internal_error(
                f"tile {self.id}: kernel service {request.name!r} failed",
                "".join(traceback.format_exception(value)),
            )

