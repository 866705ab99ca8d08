"""The exchange primitives a tile program calls: sync, send/recv and the collectives.

Semantics follow BSP and what users of ePython and mpi4py expect: data sent in superstep S
is visible after the sync, in S+1; ``send`` never blocks; ``recv`` waits across supersteps
until a message from that sender has arrived, and messages from one sender arrive in
order. Collectives are called by every tile of the job; ranks are job-relative.

``sync`` is the hottest path in the system (an empty superstep is one ``sync`` per tile),
so it is a closure written out by hand instead of a method going through :meth:`Tile.wait`.
"""

from __future__ import annotations

import dis
import functools
import operator
from typing import TYPE_CHECKING, Callable

import greenlet

from ipuos._plural import plural

from ._collectives import ALLGATHER, ALLREDUCE, ALLTOALL, BCAST, EXSCAN, GATHER, REDUCE, SCAN, SCATTER, SYNC
from ._errors import ExchangeError, describe_exception, describe_tiles, exception_message, ended_call, foreign_call
from ._exchange import KIND_USER, LostMessage, Message, pad8
from ._job import REDUCE_CHANNEL, SCAN_CHANNEL, SCATTER_CHANNEL, USER_CHANNEL
from ._outcome import OK
from ._payload import MARSHAL_TYPES, decode, encode, marshal_dumps

if TYPE_CHECKING:
    from ._job import Job
    from ._tile import Tile

_REDUCE_OPS: dict[str, Callable] = {
    "sum": lambda values: functools.reduce(operator.add, values),
    "prod": lambda values: functools.reduce(operator.mul, values),
    "min": min,
    "max": max,
}


#: children per node of the reduction tree, at most (see Scheduler.reduce_fanin)
REDUCE_FANIN = 16

#: a reduction's part that failed (see TileAPI._tree_reduce), in a tile's hands and on
#: the wire: no payload encode() makes is that byte alone
FAILED_PART = object()
FAILED_PAYLOAD = b"F"

_ALLTOALL_KEY = (ALLTOALL, None)
_ALLGATHER_KEY = (ALLGATHER, None)
_ALLREDUCE_KEY = (ALLREDUCE, 0)
_SCAN_KEY = (SCAN, None)
_EXSCAN_KEY = (EXSCAN, None)
_WAIT_LABELS = {_ALLTOALL_KEY: "alltoall()", _ALLGATHER_KEY: "allgather()", _ALLREDUCE_KEY: "allreduce()",
                _SCAN_KEY: "scan()", _EXSCAN_KEY: "exscan()"}


class _Refused:
    """What a tile that passed a wrong root or op arrives with in their place in the
    collective's key (see :func:`_arrive_refusing`): it matches any tile's root or op,
    so that its error is every tile's error, not a mismatch."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "?"


REFUSED = _Refused()


def _label(key: tuple) -> str:
    """How a call of the collective ``key`` is named to the user: ``bcast(root=0)``."""
    if key[1] is REFUSED:
        return f"{key[0]}()"
    return _WAIT_LABELS.get(key[:2]) or f"{key[0]}(root={key[1]})"


def _closing(key: tuple, op, refused: bool = False) -> tuple[tuple, str]:
    """The key and wait label of the collective that closes a reduction ``key`` with
    ``op``. The op is part of it: tiles passing different ops (MPI calls it erroneous)
    are a mismatch, not a result made with whichever op each tree node had.
    ``refused``: ``op`` is no op at all, and the tile arrives refusing."""
    if refused:
        name, shown = REFUSED, repr(op)
    elif type(op) is str:
        name, shown = op, repr(op)
    else:
        shown = getattr(op, "__qualname__", None) or type(op).__name__
        name = (f"{shown}()", *_function_identity(op))  # (never a string op's name)
    label = _label(key)
    if name != "sum":
        label = f"{label[:-1]}{'' if label.endswith('()') else ', '}op={shown})"
    return key + (name,), label


#: types whose captured values tell two tiles' functions apart (see _function_identity)
_PLAIN = frozenset({int, float, complex, str, bytes, bool, type(None)})


def _function_identity(op) -> tuple:
    """What tells one tile's function from another's beyond its name: each tile's program
    makes its own function objects, so identity says nothing, and a name alone took two
    lambdas (``a + b`` on some tiles, ``a * b`` on others) for one op, or the closures
    one factory made with different values, and combined whichever each tree node had.
    So: where its code is (the same source compiled again, as modules imported on each
    tile are, is the same), the code itself, and what it captured where that is a plain
    value: closure cells and defaults; a ``functools.partial``'s arguments; the
    attributes of the object a method is bound to, or of a callable object, that its code
    reads and never sets, as they are when the collective is called. Values are
    compared as values are (``0.0 == -0.0``, ``1 == True``; a NaN is taken for another
    NaN; no repr: one of a huge int raises). (Globals the code reads are not captured:
    an op that reads one must find the same value on every tile.)"""
    if type(op) is functools.partial:
        return "partial", _function_identity(op.func), _plain(op.args), _plain_items(op.keywords.items())
    func, state = op, ()
    if hasattr(op, "__func__"):  # a bound method: its function, and what it is bound to
        func = op.__func__
        code = getattr(func, "__code__", None)
        if code is not None:
            state = _attributes(op.__self__, code)
    code = getattr(func, "__code__", None)
    if code is None:  # a callable object: its class's __call__, and its attributes
        func = getattr(type(op), "__call__", None)
        code = getattr(func, "__code__", None)
        if code is None:
            return ()
        state = _attributes(op, code)
    captured = []
    for cell in getattr(func, "__closure__", None) or ():
        try:
            captured.append(cell.cell_contents)
        except ValueError:  # (a cell not filled yet)
            captured.append(None)
    captured += getattr(func, "__defaults__", None) or ()
    return code.co_filename, code.co_firstlineno, code.co_code, code.co_consts, _plain(captured), state


def _plain(values) -> tuple:
    """``values`` as _function_identity compares them: plain ones as themselves, others
    by their type's name."""
    return tuple(((_NAN if value != value else value) if type(value) in _PLAIN else type(value).__qualname__)
                 for value in values)


def _plain_items(items) -> tuple:
    """(name, value) pairs as _function_identity compares them, in name order."""
    return tuple((name, *_plain((value,))) for name, value in sorted(items))


def _attributes(obj, code) -> tuple:
    """The object's own attributes that ``code`` may read (a name it uses), as
    _function_identity compares them: one it never reads (``self.rank``, different on
    every tile, beside the op's own state) makes no op different."""
    attributes = getattr(obj, "__dict__", None)
    if type(attributes) is not dict:  # (a class's, a module's: their code is compared already)
        return ()
    read = _settings_read(code)
    return _plain_items((name, value) for name, value in attributes.items() if type(name) is str and name in read)


@functools.lru_cache(maxsize=256)
def _settings_read(code) -> frozenset:
    """The attribute names ``code`` reads and never sets: an op's settings. One it sets
    too is state (a count of its calls), which differs between tiles once the tree has
    run the op on some of them only."""
    read, written = set(), set()
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_ATTR", "LOAD_METHOD"):
            read.add(instruction.argval)
        elif instruction.opname in ("STORE_ATTR", "DELETE_ATTR"):
            written.add(instruction.argval)
    return frozenset(read - written)


#: what a captured NaN is compared as (it equals no value, itself included)
_NAN = ("NaN",)


def _refuse_inside_op(what: str) -> None:
    raise RuntimeError(f"{what} called inside a reduction's op: the other tiles are waiting in the reduction, "
                       "so an op must only combine its two values (exchange before or after the reduction)")


def _ready_to_arrive(job: "Job", tile: "Tile", key: tuple, label: str) -> None:
    """``tile`` is about to take part in the collective ``key``, which is not the one in
    progress (if any), before it has written or refused anything for it: not while
    other tiles still have a signal to raise. The tiles a Ctrl-C finds waiting in a
    collective leave it one after another, as each is resumed, and the first out,
    running its handler, would meet with its handler's collective those still to leave
    theirs (a mismatch). It waits for them to leave first: before writing its part, as
    the last one out clears what the collective held.

    (Every collective comes here while a reduction is in progress, whose closing
    collective is another: so does one its op calls, which is refused.)"""
    if tile.in_op:
        _refuse_inside_op(label)
    while job.arrived:
        if job.ctrl_cs and job.ctrl_c_to_hand(tile):
            _let_the_ctrl_c_land(job, tile, label)  # (it raises its own Ctrl-C here, if it has one)
            continue
        if _merge_keys(job.coll_kind, key) is not None or not _others_to_raise(job, tile):
            return
        _wait_for_others_to_raise(job, tile, label)


def _note_kind(job: "Job", key: tuple) -> None:
    """``key`` is arriving at a collective not (yet) of its kind: the first tile to
    arrive fixes the collective; anyone else arriving at another is a mismatch (a
    refusing tile's REFUSED root or op takes the others')."""
    if not job.arrived:
        job.coll_kind = key
        return
    merged = _merge_keys(job.coll_kind, key)
    if merged is None:
        job.mismatch = True
    else:
        job.coll_kind = merged


def _others_to_raise(job: "Job", tile: "Tile") -> bool:
    """Whether a live tile of ``job`` other than ``tile`` has a signal still to raise (or
    a Ctrl-C still to take: see Job.raise_in_tiles)."""
    return bool(job.ctrl_c_later) or any(other.signal is not None and other is not tile
                                          for other in job.live.values())


def _wait_for_others_to_raise(job: "Job", tile: "Tile", label: str) -> None:
    """Wait, a superstep at a time, until no other live tile has a signal to raise:
    they were woken with it, so they raise it as they are resumed (one inside a file
    operation, or serving a request, raises it right after)."""
    sched = job.sched

    def raised() -> bool:
        if not _others_to_raise(job, tile):
            return True
        sched.wake(tile)  # (look again next superstep)
        return False

    tile.wait(raised, label)


def _merge_keys(known: tuple, key: tuple) -> tuple | None:
    """``known`` and ``key`` as one collective, REFUSED parts taking the other's; None
    if they are different collectives."""
    if len(known) != len(key):
        return None
    merged = []
    for mine, theirs in zip(known, key):
        if mine is REFUSED:
            mine = theirs
        elif theirs is not REFUSED and mine != theirs and not (mine in _ONE_COLLECTIVE and theirs in _ONE_COLLECTIVE):
            return None
        merged.append(mine)
    return tuple(merged)


#: the two names of one collective, which tiles may mix as they mix sync and barrier
_ONE_COLLECTIVE = (ALLTOALL, ALLGATHER)


#: ``tile.recv_src`` of a tile waiting in ``recv()`` for a message from any tile (>= 0: a
#: message landing wakes it, as one from the tile a ``recv(src)`` waits for does)
ANY_SOURCE = 1 << 30


def _first_arrived(inbox: dict):
    """The sender rank whose oldest unreceived program message arrived first, or None.
    (Program messages are filed under the sender's rank; other channels under tuples.
    Earlier arrivals lie lower in the incoming buffer, which compaction keeps in order.)"""
    first, first_off = None, None
    for key, queue in inbox.items():
        if queue and type(key) is int:
            off = queue[0].off
            if first_off is None or off < first_off:
                first, first_off = key, off
    return first


def _job_sync(job: "Job") -> Callable[[], None]:
    """``sync`` for every tile of ``job``: one function, made at the job's first call.

    An empty superstep is one ``sync`` per tile, so this is the hottest code in the
    system, and at 1472 tiles it is bound by memory, not instructions: a tile's objects
    go cold between its turns, and each one ``sync`` touches is a cache miss. So the
    common case touches nothing of the tile's own: not the tile, its request queue, nor
    a function or closure of its own: shared, they stay in the cache. (At 1472 tiles,
    against a closure per tile: 961 supersteps/s against 825, medians of ten runs taken
    in turn, and up to 3x while the host's caches are contended.) Two counts on the
    scheduler say whether any tile has a request queued or a signal pending; only then
    does ``sync`` look up which tile runs it and take the general wait.
    """
    cached = job.sync
    if cached is not None:
        return cached
    sched = job.sched
    runq = sched.runq
    next_tile = runq.popleft
    to_main = sched.to_main
    tile_of = sched.tile_of
    current = greenlet.getcurrent

    def sync() -> None:
        if sched.collecting or sched.left_for_exchange:  # (rare: see _before_sync)
            _before_sync(job)
        if job.coll_kind is not SYNC:  # (the first to arrive, or rare: see _ready_to_arrive)
            _ready_to_arrive(job, tile_of[current()], SYNC, "sync()")
            _note_kind(job, SYNC)
        arrived = job.arrived + 1
        job.arrived = arrived
        if arrived >= job.nlive:
            if not job.nlive:  # the job is over (looked at here, where it costs nothing)
                _check_sync_caller(job)
            sched._ready_jobs.append(job)
        gen = job.gen
        # a tile with requests serves them before it parks (see _arrive)
        if not sched.queued_requests:
            if runq:  # Tile.park, inlined
                next_tile()()
            else:
                to_main()
            if job.gen != gen and not sched.signalled:
                return
        _wait_counted(job, tile_of[current()], gen, "sync()")

    sync.__qualname__ = "sync"  # (what a wrong call's TypeError names)
    job.sync = sync
    return sync


def _before_sync(job: "Job") -> None:
    """What ``sync`` must look at only now and then: where it is called from, during a
    garbage collection (see _check_sync_caller), and what the calling tile's program left
    for its next exchange point (see Tile.at_next_exchange)."""
    sched = job.sched
    if sched.collecting:
        _check_sync_caller(job)
    if sched.left_for_exchange:
        tile = sched.tile_of.get(greenlet.getcurrent())
        if tile is not None:
            _run_left_for_exchange(tile)


def _run_left_for_exchange(tile: "Tile") -> None:
    """Run what ``tile``'s program left for its next exchange point, which is now."""
    hooks = tile.sched.left_for_exchange.pop(tile, None)
    if hooks:
        hooks.sort(key=lambda fn: fn == tile.leave_if_caught)  # (last: it may never return)
        for fn in hooks:
            fn()


def _check_sync_caller(job: "Job") -> None:
    """Refuse ``sync`` of ``job`` unless it runs on the greenlet of one of the job's live
    tiles. Counted in, a call from elsewhere would complete the job's barrier without
    its tiles, or switch away from a greenlet that nothing then resumes.

    Only code that Python runs on its own calls it elsewhere: the ``__del__`` of an
    object in a reference cycle, which the cycle collector runs wherever it is due (on
    another tile, a host thread), maybe once the program has ended. So ``sync`` looks
    only while a collection runs (``Scheduler.collecting``), and when the job is over:
    looking at every call cost ~10% of the supersteps of a 1472-tile job."""
    tile = job.sched.tile_of.get(greenlet.getcurrent())
    if tile is not None and job.live.get(tile.rank) is tile:
        return
    if job.done:
        raise RuntimeError(ended_call("sync()", describe_tiles(job.ids)))
    live = describe_tiles(t.id for t in job.live.values())
    raise RuntimeError(foreign_call("sync()", live, job.sched.running_where()))


def _check_call(tile: "Tile", job: "Job", what: str) -> None:
    """Refuse a primitive of ``job``'s program on ``tile`` called once that program has
    ended, or elsewhere than on the tile's greenlet (see :meth:`TileAPI._check_caller`)."""
    if tile.job is not job:
        raise RuntimeError(ended_call(what, f"tile {tile.id}"))
    if greenlet.getcurrent() is not tile.glet:
        raise RuntimeError(foreign_call(what, f"tile {tile.id}", tile.sched.running_where()))


def _wait_counted(job: "Job", tile: "Tile", gen: int, label: str) -> None:
    """Wait for the collective ``tile`` has arrived at (generation ``gen``) to complete.
    A tile that leaves it by an exception (a deadlock report it catches, say) is no
    longer counted in: the next barrier must not complete without it."""
    try:
        tile.wait(lambda: job.gen != gen, label)
    except BaseException:
        if job.gen == gen and job.arrived > 0:
            job.arrived -= 1
            job.sched.engine.give_back_part(tile, job)
            if job.arrived == 0:
                job.clear_collective()
        raise


def _make_allgather(tile: "Tile", job: "Job", key: tuple, label: str) -> Callable:
    """``alltoall``/``allgather`` for one tile of one job, as a closure (see _job_sync):
    a 1472-tile alltoall runs this 1472 times per superstep."""
    rank = tile.rank
    write_out = tile.sched.engine.write_out
    offsets = job.coll_off
    lengths = job.coll_len
    sched = tile.sched

    def allgather(obj) -> list:
        if tile.job is not job or sched.collecting:  # (see TileAPI._check_caller)
            _check_call(tile, job, label)
        if sched.left_for_exchange:
            _run_left_for_exchange(tile)
        if job.ctrl_cs and job.ctrl_c_to_hand(tile):  # (rare: see _let_the_ctrl_c_land)
            _let_the_ctrl_c_land(job, tile, label)
        if job.nlive < job.nranks:
            _refuse_finished(job, key, tile)
        if job.coll_kind != key:
            _ready_to_arrive(job, tile, key, label)
        try:  # (free until it raises: the fast path pays nothing for it)
            if type(obj) in MARSHAL_TYPES:
                payload = b"M" + marshal_dumps(obj)  # encode()'s fast path, inlined
            else:
                payload = encode(obj, by_name=True, program=tile.program_globals)
            offsets[rank] = write_out(tile, payload)
        except Exception as exc:  # cannot be sent, or too big: every tile's call raises
            _arrive_refusing(job, tile, key, label, exc)
        lengths[rank] = len(payload)
        tile.out_held = job.coll_token
        return _arrive(job, tile, key, label)

    allgather.__name__ = allgather.__qualname__ = label[:-2]  # (what a wrong call's TypeError names)
    return allgather


def _arrive(job: "Job", tile: "Tile", key: tuple, label: str):
    """Count ``tile`` in at the collective ``key``, wait until every live tile has
    arrived and the exchange has completed it, and return this tile's share.
    (``sync`` spells the same out: it is the one collective with no payload to spare a
    call against.)"""
    if job.coll_kind != key:
        _note_kind(job, key)  # (its callers went through _ready_to_arrive before writing)
    arrived = job.arrived + 1
    job.arrived = arrived
    if arrived >= job.nlive:
        job.sched._ready_jobs.append(job)
    gen = job.gen
    tile.waiting = label
    # requests that came while the tile could not serve them (inside a file operation)
    # have spent their wake: park now and nothing may come to serve them, while their
    # senders wait (a backup's freeze waits for every tile, and the others wait here)
    if not tile.requests:
        tile.park()
    if job.gen == gen or tile.signal is not None:
        try:
            _wait_counted(job, tile, gen, label)
        finally:
            tile.waiting = None
    tile.waiting = None
    return job.coll_result.value_for(tile)


def _let_the_ctrl_c_land(job: "Job", tile: "Tile", label: str) -> None:
    """``tile`` is about to exchange (before it sends anything) while a Ctrl-C is on its
    way to the job's tiles (see ``Job.hand_over_ctrl_c``), or left for this tile's next
    exchange point, which this is: hand it out (this tile raises its own here), and wait
    until the others have raised theirs, so that this tile's exchange is not taken for a
    part of what they waited for; they run their handlers, as it does."""
    job.hand_over_ctrl_c()
    job.take_ctrl_c_later(tile)
    _wait_for_others_to_raise(job, tile, label)


def _arrive_refusing(job: "Job", tile: "Tile", key: tuple, label: str, exc: Exception):
    """``tile`` cannot take part in the collective ``key`` (what it was to send cannot be
    sent: ``exc``), yet arrives at it, so that it ends with an error on every tile (see
    :func:`_refusal`), and this tile raises ``exc`` itself. Raising ``exc`` at once would
    leave the others waiting in the collective: a program that catches it and calls the
    collective again would have that call taken for this one, and every later value
    would be off by one."""
    if job.refusal is None:  # (named as called, without a reduction's op)
        job.refusal = _refusal(job, tile.rank, _label(key), exc)
    gen = job.gen
    try:
        _arrive(job, tile, key, label)
    except Exception:
        if job.gen == gen:
            raise  # it left before the collective ended (a deadlock report): that is its error
    raise exc  # (outside the handler: ``exc`` keeps its own context)


def _refusal(job: "Job", rank: int, label: str, exc: Exception) -> Exception:
    """The error the other tiles' calls of collective ``label`` raise when rank ``rank``
    could not take part in it (``exc``). Of ``exc``'s type, so that the ``except`` a
    program wrote for that error catches it on every tile, where the scheduler can make
    one per tile safely: a built-in exception, not a program's own class (its code
    would run on the scheduler's thread). Made here, on the refusing tile, where the
    watchdog can stop an ``__str__`` of the program's that never ends."""
    where = f"{label} failed on {job.describe([rank])}"
    if type(exc).__module__ == "builtins":
        try:
            return type(exc)(f"{where}: {exception_message(exc)}")  # (cut: every other tile carries it)
        except Exception:  # (one taking other arguments)
            pass
    return ExchangeError(f"{where}: {describe_exception(exc)}")


def _rank(value, nranks: int, what: str) -> int:
    """``value`` as a tile of a job of ``nranks`` (``what``: ``"send()"``, ``"bcast(): root"``).

    Any integer will do, as for a list index or mpi4py's ranks (an IntEnum of
    neighbours, numpy's integers); a bool is refused, being a slip far more often than
    a tile number. Not an integer: TypeError; not a tile of the job: ValueError.
    """
    if type(value) is not int:
        if isinstance(value, bool) or not hasattr(type(value), "__index__"):
            raise TypeError(f"{what}: a tile number is an int, not {type(value).__name__} ({value!r})")
        value = operator.index(value)
    if not 0 <= value < nranks:
        raise ValueError(f"{what}: no tile {value} in this job ({describe_tiles(range(nranks))})")
    return value


#: collectives refused at once to a program that caught its job's stop, in one
#: superstep, that tell it spins on them (see _refuse_finished)
SPINNING_REFUSALS = 1000


def _refuse_finished(job: "Job", key: tuple, tile: "Tile") -> None:
    """A collective reached after some tiles finished: a mismatch if one of them ended
    normally; if they all failed, the job is stopping and the tile stops with it."""
    # an interrupt on its way stopped the others (the watchdog stops a computing tile at
    # once): this tile takes it too, here, rather than an error that they have gone
    job.sched.hand_interrupts_due()
    if job.ctrl_cs and job.ctrl_c_to_hand(tile):
        job.hand_over_ctrl_c()
        job.take_ctrl_c_later(tile)
    finished = [r for r in range(job.nranks) if r not in job.live]
    if tile.signal is not None and not any(map(job.ended_well, finished)):
        tile.raise_signal()
    if tile.stop_taken and job.ending:
        # a program that caught its job's stop calls collectives that can never complete,
        # refused at once: many times in one superstep, it spins on them (a cleanup tries
        # a few), and no exchange ends while it holds the scheduler's thread, so the job's
        # grace (see Job._stop_for_good) begins now (one that spins slower is left past
        # its own second: Job.past_stop_grace)
        superstep = tile.sched.superstep
        tile.refusals = tile.refusals + 1 if tile.refused_in == superstep else 1
        tile.refused_in = superstep
        if tile.refusals >= SPINNING_REFUSALS:
            job.begin_grace()
            # (its grace is the job's, not counted from its own stop: tiles that spin so
            # take the thread in turn, and would each hold it for a grace of its own)
            tile.stop_raised_at = min(tile.stop_raised_at, job.stopped_at)
    raise job.missing_tiles([tile.rank], finished, f"{key[0]}()")


class TileAPI:
    """The exchange as seen by one tile of one job."""

    __slots__ = ("_tile", "_job", "_engine", "tileid", "numtiles", "sync", "barrier",
                 "alltoall", "allgather")

    def __init__(self, tile: "Tile", job: "Job"):
        self._tile = tile
        self._job = job
        self._engine = tile.sched.engine
        #: this tile's rank in the job, 0..numtiles-1
        self.tileid = tile.rank
        self.numtiles = job.nranks
        #: end this superstep: wait until every live tile of the job has called ``sync``
        self.sync = self.barrier = _job_sync(job)
        #: every tile contributes ``obj``; every tile gets the list of all, in rank order
        self.alltoall = _make_allgather(tile, job, _ALLTOALL_KEY, "alltoall()")
        #: the same as ``alltoall`` (the MPI name)
        self.allgather = _make_allgather(tile, job, _ALLGATHER_KEY, "allgather()")

    @property
    def physical_tile(self) -> int:
        """The machine-wide id of the tile this program runs on."""
        return self._tile.id

    @property
    def tile(self) -> "Tile":
        return self._tile

    @property
    def job(self) -> "Job":
        return self._job

    # -- barrier -------------------------------------------------------------------------


    # -- point to point ------------------------------------------------------------------

    def send(self, dst: int, obj) -> None:
        """Queue ``obj`` for tile ``dst`` of this job; it arrives after the next sync."""
        self._check_caller("send()")
        if type(dst) is not int or not 0 <= dst < self._job.nranks:
            dst = _rank(dst, self._job.nranks, "send()")
        self._send(dst, obj, USER_CHANNEL)

    def recv(self, src: int | None = None):
        """Wait for the next message from tile ``src`` of this job and return it; without
        ``src``, the first message to arrive from any tile (mpi4py's ANY_SOURCE)."""
        self._check_caller("recv()")
        if type(src) is not int or not self._tile.inbox.get(src):
            if src is None:
                return self._recv_any()
            if type(src) is not int or not 0 <= src < self._job.nranks:
                src = _rank(src, self._job.nranks, "recv()")
        return self._recv(src, src, f"recv from tile {src}")

    def sendrecv(self, obj, dst: int, src: int | None = None):
        """``send(dst, obj)``, then ``recv(src)``: a ring shift or an exchange with a
        partner in one call, as mpi4py's ``sendrecv`` (every tile can send first: a send
        never waits). Both ranks are checked before anything is sent: a bad ``src`` must
        not leave a message on its way."""
        self._check_caller("sendrecv()")
        nranks = self._job.nranks
        if type(dst) is not int or not 0 <= dst < nranks:
            dst = _rank(dst, nranks, "sendrecv()")
        if src is not None and (type(src) is not int or not 0 <= src < nranks):
            src = _rank(src, nranks, "sendrecv()")
        self._send(dst, obj, USER_CHANNEL)
        return self.recv(src)

    def _recv_any(self):
        tile = self._tile
        key = _first_arrived(tile.inbox)
        if key is None:
            job = self._job
            job.nrecv += 1
            tile.recv_src = ANY_SOURCE
            try:
                tile.wait(lambda: _first_arrived(tile.inbox) is not None, "recv from any tile")
            finally:
                job.nrecv -= 1
                tile.recv_src = -1
            key = _first_arrived(tile.inbox)
        return self._recv(key, key, "")

    def _send(self, dst: int, obj, channel: int) -> None:
        self._post(dst, encode(obj, by_name=True, program=self._tile.program_globals), channel)

    def _post(self, dst: int, payload: bytes, channel: int) -> None:
        job = self._job
        tile = self._tile
        off = self._engine.write_out(tile, payload)
        key = tile.rank if channel == USER_CHANNEL else (channel, tile.rank, job.ctrl_c_epoch(tile.rank))
        self._engine.post(tile, job.tiles[dst], off, len(payload), KIND_USER, (job, tile.rank, key))

    def _take(self, key, src: int, what: str) -> Message:
        """Wait for the next message queued under ``key`` (sent by rank ``src``); the
        caller decodes it, then ``consume``s it."""
        tile = self._tile
        queue = tile.inbox.get(key)
        if not queue:
            job = self._job
            job.nrecv += 1
            tile.recv_src = src
            try:
                tile.wait(lambda: bool(tile.inbox.get(key)), what)
            finally:
                job.nrecv -= 1
                tile.recv_src = -1
            queue = tile.inbox[key]
        return queue.popleft()

    def _recv(self, key, src: int, what: str):
        """The next message queued under ``key`` (sent by rank ``src``), waiting for it."""
        msg = self._take(key, src, what)
        tile = self._tile
        try:
            if type(msg) is LostMessage:
                raise msg.error
            start = tile.xin.base + msg.off
            return decode(self._engine.view[start : start + msg.length], tile.program_globals)
        finally:
            tile.consume(msg)

    def _recv_part(self, channel: int, src: int, label: str, failure: Exception | None):
        """A reduction's part from rank ``src`` (see :meth:`_send_part`), and this tile's
        error as it now stands: FAILED_PART if the part failed there, could not land here
        (this tile's incoming buffer was full) or cannot be loaded here, its error this
        tile's if it had none. Every tile's call then raises, in step."""
        msg = self._take(self._part_key(channel, src), src, label)
        tile = self._tile
        try:
            if type(msg) is LostMessage:
                raise msg.error
            start = tile.xin.base + msg.off
            payload = self._engine.view[start : start + msg.length]
            if payload == FAILED_PAYLOAD:
                return FAILED_PART, failure
            return decode(payload, tile.program_globals), failure
        except Exception as exc:  # (a program's __setstate__ that raises, a class this tile lacks ...)
            return FAILED_PART, exc if failure is None else failure
        finally:
            tile.consume(msg)

    def _part_key(self, channel: int, src: int) -> tuple:
        """The key a collective's part from rank ``src`` is filed under here (see
        Job.ctrl_c_epoch). After a Ctrl-C, parts of the collective it cut short that
        are still queued are dropped as this tile first waits for a part of another
        (they came before it took the Ctrl-C; those landing after are dropped as they
        land: see Scheduler._land)."""
        tile = self._tile
        epoch = self._job.ctrl_c_epoch(tile.rank)
        key = (channel, src, epoch)
        if epoch and key not in tile.inbox:
            tile.drop_collective_values(before_ctrl_c=epoch)
        return key

    def poll(self, src: int) -> bool:
        """True if a message from ``src`` has arrived and ``recv(src)`` would not wait.

        It never waits itself: a loop around it must call ``sync()`` (or the program
        computes without reaching an exchange point, and no message can arrive)."""
        self._check_caller("poll()")
        if type(src) is not int or not 0 <= src < self._job.nranks:
            src = _rank(src, self._job.nranks, "poll()")
        return bool(self._tile.inbox.get(src))

    # -- collectives ---------------------------------------------------------------------

    def bcast(self, obj, root: int = 0):
        """Every tile gets the ``obj`` of tile ``root`` (other tiles' ``obj`` is ignored)."""
        self._check_caller("bcast()")
        root, wrong = self._root_or_error(root, "bcast")
        self._refuse_unless_all_live(BCAST, wrong)
        payload = obj if self._tile.rank == root else None
        return self._collective((BCAST, root), payload, send=self._tile.rank == root, refused=wrong)

    def gather(self, obj, root: int = 0):
        """Tile ``root`` gets the list of every tile's ``obj``; the others get None."""
        self._check_caller("gather()")
        root, wrong = self._root_or_error(root, "gather")
        self._refuse_unless_all_live(GATHER, wrong)
        return self._collective((GATHER, root), obj, send=wrong is None, refused=wrong)

    def scatter(self, objs, root: int = 0):
        """Tile ``root`` passes a sequence of one object per tile; tile i gets item i
        (the other tiles' ``objs`` is ignored, as in mpi4py).

        The root sends every item point to point, all of them or none (a sequence too
        big for its outgoing buffer is a ValueError before anything is sent), and the
        collective ends the superstep they travel in, so a tile calling something else
        is a mismatch, not a hang.
        """
        self._check_caller("scatter()")
        root, refused = self._root_or_error(root, "scatter")
        self._refuse_unless_all_live(SCATTER, refused)
        tile = self._tile
        if tile.rank == root:
            try:
                payloads = self._scatter_payloads(objs)
            except Exception as exc:  # (every tile's scatter raises it: see _arrive_refusing)
                refused = exc
            else:
                for rank, payload in enumerate(payloads):
                    self._post(rank, payload, SCATTER_CHANNEL)
        self._collective((SCATTER, root), None, send=False, refused=refused)
        return self._recv(self._part_key(SCATTER_CHANNEL, root), root, f"scatter(root={root})")

    def _scatter_payloads(self, objs) -> list[bytes]:
        """The root's items for :meth:`scatter`, encoded, one per tile; an error if they
        are not that, or do not fit in what is left of its outgoing buffer."""
        tile = self._tile
        n = self._job.nranks
        try:
            items = list(objs)
        except TypeError:
            raise TypeError(f"scatter(): root passes a sequence of one object per tile, "
                            f"not {type(objs).__name__}") from None
        if len(items) != n:
            raise ValueError(f"scatter(): root's sequence has {plural(len(items), 'item')}; the job has "
                             f"{plural(n, 'tile')} (one each)")
        payloads = [encode(item, by_name=True, program=tile.program_globals) for item in items]
        need = sum(pad8(len(p)) for p in payloads)
        room = tile.xout.size - tile.out_used
        if need > room:
            raise ValueError(
                f"scatter() payload of {need} B does not fit in the outgoing buffer ({room} B "
                f"of {tile.xout.size} B left this superstep); scatter smaller objects")
        return payloads

    def reduce(self, obj, op="sum", root: int = 0):
        """Combine every tile's ``obj`` with ``op`` on tile ``root``; the others get None.

        ``op`` is ``"sum"``, ``"prod"``, ``"min"``, ``"max"`` or a two-argument callable;
        like MPI's, it must be associative (values are combined along a tree, in rank
        order).
        """
        self._check_caller("reduce()")
        root, wrong = self._root_or_error(root, "reduce")
        combine, wrong_op = self._reducer_or_error(op)
        wrong = wrong or wrong_op
        self._refuse_unless_all_live(REDUCE, wrong)  # (the tree would wait for them forever)
        # (the op as it was called: one that keeps state changes as the tree runs it)
        key, label = _closing((REDUCE, root), op, refused=wrong_op is not None)
        value, failure = self._tree_reduce(obj, combine, "reduce()", wrong)  # the tree ends on rank 0
        rank = self._tile.rank
        moved = self._collective(key, value, send=rank == 0 and root != 0, refused=failure, label=label)
        return value if rank == 0 == root else moved

    def allreduce(self, obj, op="sum"):
        """Like :meth:`reduce`, and every tile gets the result (a tree, then a bcast)."""
        self._check_caller("allreduce()")
        combine, wrong = self._reducer_or_error(op)
        self._refuse_unless_all_live(ALLREDUCE, wrong)
        key, label = _closing(_ALLREDUCE_KEY, op, refused=wrong is not None)  # (before it runs)
        value, failure = self._tree_reduce(obj, combine, "allreduce()", wrong)
        return self._collective(key, value, send=self._tile.rank == 0, refused=failure, label=label)

    def scan(self, obj, op="sum"):
        """Tile i gets the ``obj`` of tiles 0 to i combined with ``op``: a prefix
        reduction (MPI's scan). ``op`` as for :meth:`reduce`; combined in rank order."""
        self._check_caller("scan()")
        return self._prefix(obj, op, _SCAN_KEY)

    def exscan(self, obj, op="sum"):
        """Tile i gets the ``obj`` of tiles 0 to i-1 combined with ``op``; tile 0 gets
        None (MPI's exscan)."""
        self._check_caller("exscan()")
        return self._prefix(obj, op, _EXSCAN_KEY)

    def _prefix(self, obj, op, key: tuple):
        """scan/exscan by recursive doubling: after the round at ``distance`` d, tile r
        holds tiles r-2d+1 to r combined, so log2(n) supersteps of one message per tile
        (never a whole row of values in one tile's SRAM). A last collective makes a
        tile that called something else a mismatch rather than a hang, and a failed
        part an error on every tile (see :meth:`_tree_reduce`).

        One message per tile per superstep holds only if every round ends at an
        exchange: a tile below ``distance`` receives nothing in that round, and would
        send its next round's part (and exscan's shift) in the same superstep, paying
        for several copies of its part in the outgoing buffer (tile 0 of 16: four). So
        it waits out the round, as the tree's leaders do, by a message to itself."""
        job = self._job
        combine, wrong = self._reducer_or_error(op)
        self._refuse_unless_all_live(key[0], wrong)  # (a tile would wait for a finished one forever)
        label = _WAIT_LABELS[key]
        rank, n = self._tile.rank, job.nranks
        part, failure = (obj, None) if wrong is None else (FAILED_PART, wrong)
        closing, closing_label = _closing(key, op, refused=wrong is not None)  # (the op before it runs)
        distance = 1
        while distance < n:
            if rank + distance < n:
                part, failure = self._send_part(rank + distance, part, failure, SCAN_CHANNEL)
            if rank >= distance:
                earlier, failure = self._recv_part(SCAN_CHANNEL, rank - distance, label, failure)
                part, failure = self._combine_parts(combine, [earlier, part], failure)
            elif rank + distance < n:  # sent, and nothing to receive: the round's exchange still
                failure = self._wait_out_round(SCAN_CHANNEL, label, failure)
            distance *= 2
        if key is _EXSCAN_KEY:  # each tile's inclusive result moves one tile up
            if rank + 1 < n:
                part, failure = self._send_part(rank + 1, part, failure, SCAN_CHANNEL)
            part, failure = self._recv_part(SCAN_CHANNEL, rank - 1, label, failure) if rank else (None, failure)
        self._collective(closing, None, send=False, refused=failure, label=closing_label)  # (raises if a part failed)
        return part

    def _tree_reduce(self, obj, combine, label: str, wrong: Exception | None):
        """Reduce along a tree (fan-in ``Scheduler.reduce_fanin``): the result, on rank 0,
        and this tile's error if its part failed, for the collective that follows.

        A flat gather would need every value in one tile's SRAM: 47,104 tiles' worth does
        not fit. Each level costs one superstep; leaders receive at most fan-in - 1 values
        in one, few enough that any value small enough to send fits beside the others.

        That holds only if every value goes up in its level's superstep. A leader at the
        end of the job may have no children at a level (rank 3 of 4, fan-in 3): it would
        send up at once, and its value land on the next leader beside that leader's
        children of the level below. So it waits out the level instead, one exchange,
        by a message to itself.

        A tile whose part fails (the op raises, or its value cannot be sent) still sends
        and receives every message of the tree, a failure in place of its value: raising
        at once would leave a leader waiting for it, and a program that caught the error
        and reduced again would have stale values taken for new ones. The collective that
        ends the reduction then raises on every tile. So does a tile whose call is wrong
        (``wrong``: its root or op), its part failed from the start.
        """
        tile = self._tile
        rank, n = tile.rank, self._job.nranks
        fanin = tile.sched.reduce_fanin
        part, failure = (obj, None) if wrong is None else (FAILED_PART, wrong)
        stride = 1
        while stride < n:
            span = stride * fanin
            if rank % span:
                failure = self._send_part(rank - rank % span, part, failure, REDUCE_CHANNEL)[1]
                return None, failure
            if rank + stride >= n:  # no children at this level
                failure = self._wait_out_round(REDUCE_CHANNEL, label, failure)
            else:
                parts = [part]
                for child in range(rank + stride, min(rank + span, n), stride):
                    child_part, failure = self._recv_part(REDUCE_CHANNEL, child, label, failure)
                    parts.append(child_part)
                part, failure = self._combine_parts(combine, parts, failure)
            stride = span
        return (None if part is FAILED_PART else part), failure

    def _wait_out_round(self, channel: int, label: str, failure):
        """End a reduction's round at its exchange with nothing to receive in it, by a
        message to itself, so that what the tile sends next goes in the next superstep
        (see _tree_reduce, _prefix); returns this tile's error, as it now stands (the
        message fails in step if the outgoing buffer is full)."""
        rank = self._tile.rank
        failure = self._send_part(rank, None, failure, channel)[1]
        return self._recv_part(channel, rank, label, failure)[1]

    def _send_part(self, dst: int, part, failure, channel: int):
        """Send a reduction's ``part`` (a value, or FAILED_PART) to rank ``dst``; a value
        that cannot be sent fails, and the failure goes in its place. Returns the part
        and this tile's error, as they now stand."""
        if part is not FAILED_PART:
            try:
                self._send(dst, part, channel)
                return part, failure
            except Exception as exc:  # (unpicklable, or over the outgoing buffer)
                part, failure = FAILED_PART, exc if failure is None else failure
        self._post(dst, FAILED_PAYLOAD, channel)
        return part, failure

    def _combine_parts(self, combine, parts: list, failure):
        """``parts`` (see :meth:`_send_part`) combined in order, or FAILED_PART if one of
        them failed or ``combine`` raised; and this tile's error, as it now stands.

        While the op runs, the tile may not exchange (see _refuse_inside_op): the other
        tiles are waiting in the reduction, and a collective the op called went out of
        step with theirs for good."""
        if any(part is FAILED_PART for part in parts):  # (not ``in``: that calls values' __eq__)
            return FAILED_PART, failure
        tile = self._tile
        tile.in_op = True
        try:
            return combine(parts), failure
        except Exception as exc:  # (the program's op)
            return FAILED_PART, exc if failure is None else failure
        finally:
            tile.in_op = False

    # -- helpers -------------------------------------------------------------------------

    def _check_caller(self, what: str) -> None:
        """Refuse a call once the program has ended on its tile, or made elsewhere than
        on the tile's greenlet. Taken as the tile's, it would send from the tile's
        buffers or wait as the tile (parking a greenlet nothing then resumes), for a job
        that may be over. Only the ``__del__`` of an object in a reference cycle calls
        from elsewhere, run by Python's cycle collector wherever it is due: so where
        it runs is looked at only during a collection (see _check_sync_caller)."""
        tile = self._tile
        job = self._job
        if tile.job is not job or tile.sched.collecting:
            _check_call(tile, job, what)
        if tile.in_op:
            _refuse_inside_op(what)
        if tile.sched.left_for_exchange:
            _run_left_for_exchange(tile)
        if job.ctrl_cs and job.ctrl_c_to_hand(tile):  # (before anything is sent: see _let_the_ctrl_c_land)
            _let_the_ctrl_c_land(job, tile, what)

    def _collective(self, key: tuple, obj, send: bool = True, refused: Exception | None = None,
                    label: str | None = None):
        """Take part in the collective ``key``, sending ``obj`` if ``send``; ``refused``:
        this tile cannot take part (the error why), and every tile's call raises.
        ``label``: its wait as ``ps`` and reports show it (None: made from ``key``)."""
        tile = self._tile
        job = self._job
        if job.nlive < job.nranks:
            _refuse_finished(job, key, tile)
        label = label or _label(key)
        if job.coll_kind != key:
            _ready_to_arrive(job, tile, key, label)
        if send and refused is None:
            try:
                payload = encode(obj, by_name=True, program=tile.program_globals)
                job.coll_off[tile.rank] = self._engine.write_out(tile, payload)
            except Exception as exc:
                refused = exc
            else:
                job.coll_len[tile.rank] = len(payload)
                tile.out_held = job.coll_token
        if refused is not None:
            _arrive_refusing(job, tile, key, label, refused)
        return _arrive(job, tile, key, label)

    def _root_or_error(self, root, name: str) -> tuple[object, Exception | None]:
        """``root`` as a rank of the job, or REFUSED and the error why: the tile still
        arrives at the collective (see :func:`_arrive_refusing`), and every tile's call
        raises, so that a program catching the error stays in step."""
        if type(root) is int and 0 <= root < self._job.nranks:
            return root, None
        try:
            return _rank(root, self._job.nranks, f"{name}(): root"), None
        except (TypeError, ValueError) as exc:
            return REFUSED, exc

    @staticmethod
    def _reducer_or_error(op) -> tuple[Callable | None, Exception | None]:
        """How ``op`` combines a list of values, or None and the error why (which, as
        a wrong root's, every tile's call of the reduction raises)."""
        if callable(op):
            return (lambda values: functools.reduce(op, values)), None
        try:
            return _REDUCE_OPS[op], None
        except (KeyError, TypeError):
            return None, ValueError(
                f"unknown reduction {op!r}: use 'sum', 'prod', 'min', 'max' or a function of two values")

    def _refuse_unless_all_live(self, kind: str, wrong: Exception | None) -> None:
        """Refuse a collective of ``kind`` that some tiles of the job will never call
        (they have finished): with this tile's own mistake in calling it (``wrong``, a
        root or op), if any; else saying which tiles finished."""
        job = self._job
        if job.nlive < job.nranks:
            if wrong is not None:
                raise wrong
            _refuse_finished(job, (kind, None), self._tile)


# a wrong call's TypeError names the primitive as the program called it ("reduce()"),
# not the class behind it ("TileAPI.reduce()")
for _name in ("send", "recv", "sendrecv", "poll", "bcast", "gather", "scatter", "reduce", "allreduce", "scan",
              "exscan"):
    getattr(TileAPI, _name).__qualname__ = _name
del _name
