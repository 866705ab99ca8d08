"""Exceptions a tile program can see from the exchange, and why each one exists.

They carry the tiles involved, so a report can name them: a hang the user has to diagnose
by hand is the failure mode these replace.
"""

from __future__ import annotations

import threading
from typing import Callable


def describe_tiles(ranks) -> str:
    """``[0, 1, 2, 5]`` -> ``"tiles 0-2,5"`` (``"tile 3"`` for one): the machine's own
    words (``ipuos._tilespec``), imported when first needed."""
    from ipuos._tilespec import describe_tiles as describe

    return describe(ranks)


#: characters of an exception's message a one-line description keeps (see describe_exception)
DESCRIBED_MESSAGE_MAX = 1000


def describe_exception(exc: BaseException) -> str:
    """``"Type: message"`` for a report, even when the exception's ``__str__`` raises or
    never ends (a program's own exception class may; the report must still be made, and
    a ``__str__`` stopped by an interrupt or a compute budget ends in this one).

    The message is cut at ``DESCRIBED_MESSAGE_MAX`` characters: a description is copied
    into the report of every other tile the failure stops, and one tile's 10 MB message
    was 1472 copies, 15 GB, on an mk2 chip."""
    message = exception_message(exc)
    name = _cut(type(exc).__name__, _NAME_MAX)
    return f"{name}: {message}" if message else name


#: characters of an exception class's name a description keeps (one may be made absurdly long)
_NAME_MAX = 200


def exception_message(exc: BaseException) -> str:
    """``str(exc)``, cut at ``DESCRIBED_MESSAGE_MAX`` characters (see describe_exception),
    even when ``__str__`` raises or never ends."""
    try:
        message = str(exc)
    except (Exception, TileInterrupt, JobAborted):
        message = "<exception str() failed>"
    return _cut(message, DESCRIBED_MESSAGE_MAX)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... [{len(text) - limit:,} more characters]"


def describe_syntax_error(filename: str, exc: SyntaxError) -> str:
    """``"prog.py: syntax error at line 3, column 7: ..."`` on one line (no place for
    errors of the whole text, such as a NUL byte in it)."""
    where = ""
    if exc.lineno:
        where = f" at line {exc.lineno}" + (f", column {exc.offset}" if exc.offset else "")
    return f"{filename}: syntax error{where}: {exc.msg}"


def ended_call(what: str, tiles: str) -> str:
    """Why ``what`` (``"send()"``, ``"print()"``, ``"open()"``) refuses for a program that
    has ended on ``tiles`` (``"tile 3"``): its objects in reference cycles outlive it
    (only Python's cycle collector frees them, whenever and wherever it next runs), and
    their ``__del__`` must act on nothing of the tile then."""
    return (f"{what}: the program that made this object has ended on {tiles}, and what it had of its "
            "tile (files, print, exchange) ended with it: an object in a reference cycle outlives its "
            "program (Python's cycle collector frees it later), so its __del__ can use none of that; "
            "release such things before the program ends (a with block, close(), or breaking the cycle)")


def foreign_call(what: str, tiles: str, where: str) -> str:
    """Why ``what`` of the program on ``tiles`` refuses on ``where`` (another tile, the
    scheduler's loop, a host thread): see ``Tile.elsewhere``."""
    return (f"{what}: this belongs to the program on {tiles} and works only there, not on {where}, "
            "where Python's cycle collector ran the __del__ of an object in a reference cycle; "
            "release such things explicitly (a with block, close(), or breaking the cycle)")


class ExchangeError(RuntimeError):
    """A tile program used the exchange in a way that cannot complete."""


class DeadlockError(ExchangeError):
    """Every live tile of a job waits and nothing in flight can wake any of them."""


class CollectiveMismatchError(ExchangeError):
    """The tiles of a job called different collectives (or different roots) in one step."""


#: thread id -> stops (TileInterrupt, JobAborted) made on that thread so far: a
#: machine's watchdog tells a program on its scheduler thread that catches every stop it
#: raises from a tile inside one long call into C (which takes none)
stops_raised: dict[int, int] = {}


def _count_stop() -> None:
    thread = threading.get_ident()
    stops_raised[thread] = stops_raised.get(thread, 0) + 1


#: thread id -> what a scheduler runs on its thread when a Ctrl-C is raised there (made
#: there, as the watchdog's lands: see CtrlCSettle)
ctrl_c_raised_hooks: dict[int, Callable[[], None]] = {}


class JobAborted(BaseException):
    """Another tile of the job failed; this tile is stopped at its next exchange point.

    A BaseException, like :class:`TileInterrupt`: the job is over, and ``except
    Exception`` in user code must not let the tile carry on as if it were not.
    """

    def __init__(self, *args):
        _count_stop()
        super().__init__(*args)


class TileBusyError(RuntimeError):
    """A job was asked to start on a tile that is already running one."""


class TileInterrupt(BaseException):
    """Raised inside a tile program to stop it (Ctrl-C, ``kill``, a compute budget).

    A BaseException, like KeyboardInterrupt, so that ``except Exception`` in user code
    does not swallow it.
    """

    def __init__(self, *args):
        _count_stop()
        super().__init__(*args)


class TileKeyboardInterrupt(TileInterrupt, KeyboardInterrupt):
    """The user's Ctrl-C, as a tile program gets it: a KeyboardInterrupt, as in Python,
    so that its ``except KeyboardInterrupt:`` cleanup runs; a TileInterrupt, as every stop
    is to the scheduler. Each Ctrl-C reaches each tile once (see Job.ctrl_c_due): a
    program that swallows it runs on, as Python's would, a job like any other, until
    the next Ctrl-C, or until whatever gives up on it (``kill``, its client's second
    Ctrl-C or its going away, a ``Machine.run()`` given up by Ctrl-C) raises a plain
    TileInterrupt, again and again until it stops (caught, a second later the tile leaves
    the program at its next exchange point: Scheduler.leave_program); that replaces a Ctrl-C a tile has
    not yet taken, and no Ctrl-C after it softens it (see Job.stopping). (Never handed
    to host code as such: there a KeyboardInterrupt would pass for the host's own
    Ctrl-C; see :func:`for_host`.)
    """

    #: what it says as the watchdog raises it in a computing tile (bare: it can inject
    #: only a class), as where the tile takes it at an exchange point
    UNNAMED = "interrupted (Ctrl-C)"

    def __init__(self, *args):
        super().__init__(*(args or (self.UNNAMED,)))
        hook = ctrl_c_raised_hooks.get(threading.get_ident())
        if hook is not None:
            hook()

    @property
    def __traceback__(self):
        """The traceback, ending in the program: raised by the scheduler thread's count
        of a tile's bytecodes (see CtrlCSettle), it began in the trace function that
        counted, which is none of the program's."""
        tb = _TRACEBACK.__get__(self)
        entry = tb
        while entry is not None and entry.tb_next is not None:
            if entry.tb_next.tb_frame.f_globals.get("__name__") == _COUNTED_IN:
                entry.tb_next = None
                break
            entry = entry.tb_next
        return tb

    @__traceback__.setter
    def __traceback__(self, tb) -> None:
        _TRACEBACK.__set__(self, tb)


_TRACEBACK = BaseException.__dict__["__traceback__"]
#: the module whose trace function raises a tile's Ctrl-C where it computes
_COUNTED_IN = "ipuos.scheduler._ctrl_c_settle"


def for_host(error: BaseException) -> BaseException:
    """``error``, a tile's, as host code may see it raised: a tile's Ctrl-C as a plain
    TileInterrupt (see TileKeyboardInterrupt)."""
    if isinstance(error, TileKeyboardInterrupt):
        return TileInterrupt(*error.args)
    return error


class ComputeBudgetExceeded(TileInterrupt):
    """The tile computed longer than its per-superstep budget without reaching an exchange."""

    #: what it says as the watchdog raises it (bare: it can inject only a class), caught
    #: by the program; the tile's result names the tile and the budget instead
    UNNAMED = "computed for longer than the job's compute budget without reaching an exchange point"

    def __init__(self, *args):
        super().__init__(*(args or (self.UNNAMED,)))


class TileFailed(OSError):
    """A tile that backs a device or serves a request has stopped answering."""


# shown to users as ipuos.scheduler.X (where they are exported), not the private module
for _cls in (
    ExchangeError, DeadlockError, CollectiveMismatchError, JobAborted, TileBusyError,
    TileInterrupt, TileKeyboardInterrupt, ComputeBudgetExceeded, TileFailed,
):
    _cls.__module__ = "ipuos.scheduler"
