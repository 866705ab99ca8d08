"""SIGTERM and SIGHUP for the commands that take a terminal over (``top``, the shell's
prompt): they must put the terminal back before they go, as Ctrl-C and ``q`` do, and
then die of the signal, as any program does, so that whoever started them sees how they
ended. Left to its default action, either signal ended them at once, leaving the
terminal without echo, in the alternate screen, with the cursor hidden.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Callable, NoReturn

from ._signals import handling

TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):
    """A termination signal came: unwind, putting the terminal back on the way, then
    :func:`die_of` it. A BaseException, as KeyboardInterrupt is, so that no ``except
    Exception`` on the way stops it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def on_termination(handler: Callable[[int], None]):
    """Call ``handler(signum)`` on SIGTERM or SIGHUP while the block runs (see
    :func:`._signals.handling`)."""
    with handling(TERMINATING_SIGNALS, lambda caught, _frame: handler(caught)):
        yield


def die_of(signum: int) -> NoReturn:
    """End the process by ``signum``'s default action, after flushing what it printed."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # (a hung-up terminal, a reader gone)
            stream.flush()
    signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # (not reached: the default action ends the process)
