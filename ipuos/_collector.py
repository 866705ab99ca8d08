"""The daemon's garbage collection: full collections that leave the machine alone.

A machine keeps ~125 objects per tile that Python's cyclic garbage collector tracks (its
greenlet, kernel closures, its storage's littlefs glue): ~180,000 on an mk2 chip whose
tiles have used their disks. A full collection walks every one of them, which took
120-280 ms here, and CPython starts one whenever the objects that survived younger
collections have grown by a quarter since the last. A program with a ``sync()`` on every
tile of mk2 grows them that much by itself, and spent such a walk inside each run.

``gc.freeze()`` moves everything alive into a generation no collection walks. The daemon
collects once it has booted, and after replying to any request during which a job ended
(``ipuos run``, or a program the shell ran: a job's tiles leave their namespaces in
reference cycles) or whose payload was large (a refusal's traceback can hold its data),
and then freezes what survived, which is mostly the machine: the
automatic collections during the next job walk only what is newer than that.

What it costs: an object that is frozen and later dropped in a reference cycle is found by
no collection until it is thawed. The largest such garbage is known when it is made: a
repl session keeps its tiles' namespaces, contexts and APIs (~95,000 objects, ~8 MB on
mk2) through the collections after its blocks, and they die with the session. So the end
of a repl session asks for a thorough collection, which thaws everything first (the
machine's ~60,000 objects: tens of ms), and then hands what the heap no longer uses back to
the system (glibc's ``malloc_trim``: the per-thread arenas otherwise keep their peak; after
60 sessions the daemon went from 225 MB to 124 MB with the first, to 90 MB with both).
Whatever else a daemon drops that way is small beside the machine, so every
:data:`THOROUGH_EVERY`-th collection thaws everything too: garbage frozen by mistake
waits that long at most. (A restore's replaced mounts are freed as they
are dropped: they hold no cycles.) Nothing is frozen while a job runs: its objects are
about to become garbage.

Only the daemon does this, since it owns its process. A program that uses
:class:`~ipuos.Machine` in its own process keeps Python's collection policy.
"""

from __future__ import annotations

import ctypes
import gc
import threading

__all__ = ["Collector", "THOROUGH_EVERY"]

#: every this many collections, everything frozen is thawed and walked again
THOROUGH_EVERY = 16


class Collector:
    """Collects garbage and freezes the survivors, for one daemon's machine."""

    def __init__(self, scheduler, thorough_every: int = THOROUGH_EVERY):
        if thorough_every < 1:
            raise ValueError(f"thorough_every must be at least 1, not {thorough_every}")
        self._scheduler = scheduler
        self._thorough_every = thorough_every
        self._since_thorough = 0
        self._garbage_due = False
        self._thaw = False
        # (two handler threads interleaving would freeze what the other has not collected)
        self._lock = threading.Lock()

    def job_ended(self, thaw: bool = False) -> None:
        """Note that a job has ended: its garbage waits for :meth:`collect_if_due`.
        ``thaw``: some of it has been frozen since (a repl session's end: what its blocks
        kept), so that collection is a thorough one."""
        if thaw:
            self._thaw = True
        self._garbage_due = True

    def large_request_done(self) -> None:
        """Note that a request with a large payload (a program's data, a file put) has
        been answered: what it made may hold the payload in a reference cycle (a refusal's
        traceback holding the frame that split the data), and nothing else may collect it
        for long (a few big strings are few allocations): 60 MB a refused ``run --data``
        kept, until ~2 GB."""
        self._garbage_due = True

    def collect_if_due(self) -> None:
        """:meth:`collect` if a job has ended (or a large request been answered) since this
        was last asked (the daemon asks after every reply, on the handler's thread: the
        client is not kept waiting)."""
        if self._garbage_due:
            self._garbage_due = False  # (before collecting: a job ending meanwhile is due again)
            self.collect()

    def collect(self, thorough: bool = False) -> None:
        """Free unreachable objects, then freeze the survivors unless a job runs.

        ``thorough`` (or every :data:`THOROUGH_EVERY`-th call) thaws all that is frozen
        first, so that cycles which died frozen are found too."""
        with self._lock:
            self._since_thorough += 1
            thorough = thorough or self._thaw or self._since_thorough >= self._thorough_every
            if thorough:
                self._thaw = False  # (before: one asked for meanwhile is due again)
                gc.unfreeze()
                self._since_thorough = 0
            gc.collect()
            if not self._scheduler.jobs:
                gc.freeze()
            if thorough:
                _trim_heap()


def _heap_trimmer():
    """glibc's ``malloc_trim``, or None (another C library: the heap stays as it is)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_malloc_trim = _heap_trimmer()


def _trim_heap() -> None:
    if _malloc_trim is not None:
        _malloc_trim(0)
