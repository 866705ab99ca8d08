"""Signals held while littlefs runs on the main thread, and acted on between its calls.

littlefs-python swallows an exception raised in one of its block-device callbacks
(DESIGN.md): it prints "Exception ignored" and littlefs carries on with whatever the
callback returned. The callbacks catch what they raise themselves, but Python runs a
signal's handler where it next looks for one, and while littlefs works that is the first
instruction of its next callback, before the callback's ``try:``. So a KeyboardInterrupt
from Ctrl-C escapes the callback, is swallowed, and a good image reads as a corrupt
filesystem (or, worse, as wrong bytes). Only a process that runs littlefs on its main
thread, the one Python runs handlers on, meets this: the offline ``ipuos image``
commands (a machine runs littlefs on its scheduler's thread).

So while they use littlefs, :func:`signals_held` has SIGINT, SIGTERM and SIGHUP only
noted, and :func:`checkpoint`, called between littlefs calls, acts on one: SIGINT raises
KeyboardInterrupt (``ipuos: interrupted``, status 130), SIGTERM and SIGHUP raise
SystemExit with 128 + the signal's number, the status a shell shows for a process the
signal ended. Either unwinds through the command's cleanups (an extraction removes its
staging directory), which the signal's default action would have skipped. A signal the
process ignores (``nohup``, SIGINT in a background job) stays ignored.

A command whose work is committed (an extraction renamed into place) calls
:func:`settle`: a signal noted before is still acted on, one after it (while the command
reports its work) is dropped, and the status says the work was done (0), never that it
was stopped while it was not.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

__all__ = ["HELD", "catchable", "checkpoint", "handling", "settle", "signals_held"]

#: what ends a command from outside: Ctrl-C, kill, its terminal going away
HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: the signals received while held and not yet acted on, in order
_noted: list[int] = []

#: whether :func:`settle` was called in the current :func:`signals_held`: noted
#: signals are dropped until it ends
_settled = False


def _note(signum: int, _frame) -> None:
    if not _settled:
        _noted.append(signum)


def checkpoint() -> None:
    """Act on the first signal noted since the last checkpoint, if any (see the module
    doc); call it only where no littlefs call is in progress."""
    if _noted:
        signum = _noted[0]
        _noted.clear()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)


def settle() -> None:
    """Act on a signal noted so far (as :func:`checkpoint`), then drop the held signals
    until :func:`signals_held` ends: call it inside, just before the command commits its
    work, the last point where a stop leaves nothing behind. After it the work is done,
    and the command reports it before it leaves the block."""
    global _settled
    checkpoint()
    _settled = True


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP only noted inside (acted on at each :func:`checkpoint`,
    and on leaving, unless :func:`settle` was called: then dropped); their handlers are
    back afterwards."""
    global _settled
    try:
        with handling(HELD, _note):
            yield
    finally:
        settled, _settled = _settled, False
        if settled:
            _noted.clear()
        else:
            checkpoint()


def catchable(signum: int) -> bool:
    """Whether a handler of ours may take ``signum``: not one the process ignores
    (``nohup``; SIGINT and SIGQUIT in a job ``sh`` started with ``&``, so that Ctrl-C on
    the script leaves it alone), nor one whose handler was not set from Python (it could
    not be put back)."""
    current = signal.getsignal(signum)
    return current is not signal.SIG_IGN and current is not None


@contextlib.contextmanager
def handling(signums, handler) -> Iterator[None]:
    """``handler(signum, frame)`` for each of ``signums`` inside, then the handlers
    before it back. A signal the process ignores (``nohup``, SIGINT in a background job)
    stays ignored, as does one whose handler was not set from Python (it could not be
    put back). Off the main thread it changes nothing: Python runs handlers there only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    try:
        for signum in signums:
            if catchable(signum):
                previous[signum] = signal.signal(signum, handler)
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
