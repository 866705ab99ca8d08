"""Keep the machine's Python threads on one CPU: hand-offs between them stay cheap.

A request from the host (a FUSE callback, a daemon client, a ``Machine.fs`` call) is a
hand-off between two Python threads: the caller queues it and sleeps, the scheduler thread
wakes, serves it in a superstep and wakes the caller. Measured on the 2-CPU machines we
run on, such a round trip costs ~85 us when the two threads sit on different CPUs (the
kernel has to wake an idle CPU each way) and ~9 us when they share one. The threads hold
one GIL between them, so running them on one CPU takes no parallelism away from Python
code; a FUSE create, a ``stat`` or a shell command is mostly such hand-offs.

So the threads that trade requests with the scheduler are *pinned* to one CPU, the
"home" CPU, chosen once per process as the CPU the first pinned thread happens to be on
(the kernel has balanced it; several machines on one host get spread out that way).
Threads doing bulk work in C without the GIL (exchange copies, image compression and
hashing) are *unpinned*: they may use every CPU the process may use.

Threads started by a pinned thread inherit its CPU (Linux copies the affinity), so pins
are placed where threads begin: the scheduler thread, a mount's FUSE loop (libfuse's
workers are its children) and the daemon's client threads. ``IPUOS_PIN_THREADS=0`` turns
all of it off; where the platform cannot set affinities, or only one CPU is allowed,
nothing happens.
"""

from __future__ import annotations

import os
import threading

__all__ = ["pin_thread", "unpin_thread", "home_cpu"]

_lock = threading.Lock()
_home: int | None = None
#: the CPUs the process was allowed when this module was first used
_allowed: frozenset[int] | None = None


def _enabled() -> bool:
    return (hasattr(os, "sched_setaffinity") and os.environ.get("IPUOS_PIN_THREADS", "1") != "0")


def _allowed_cpus() -> frozenset[int]:
    global _allowed
    if _allowed is None:
        _allowed = frozenset(os.sched_getaffinity(0))
    return _allowed


def _current_cpu() -> int | None:
    """The CPU the calling thread runs on (field 39 of its ``stat``), None if unknown."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[36])  # fields after "(comm)" start at field 3
    except (OSError, IndexError, ValueError):
        return None


def home_cpu() -> int | None:
    """The CPU pinned threads run on, or None when pinning is off or pointless."""
    global _home
    if not _enabled():
        return None
    with _lock:
        if _home is None:
            allowed = _allowed_cpus()
            if len(allowed) < 2:
                return None
            cpu = _current_cpu()
            _home = cpu if cpu in allowed else min(allowed)
        return _home


def pin_thread() -> None:
    """Run the calling thread (and the threads it starts from now on) on the home CPU."""
    cpu = home_cpu()
    if cpu is not None:
        try:
            os.sched_setaffinity(0, {cpu})  # 0: the calling thread
        except OSError:
            pass  # a cpuset changed under us: running anywhere is still correct


def unpin_thread() -> None:
    """Let the calling thread run on every CPU the process was allowed (bulk C work)."""
    if _enabled() and _allowed is not None:
        try:
            os.sched_setaffinity(0, _allowed)
        except OSError:
            pass
