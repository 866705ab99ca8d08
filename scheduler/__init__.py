"""Tiles as greenlets in bulk-synchronous supersteps, and the exchange between them.

The public API of the scheduler layer; everything else here is private.

The scheduler itself, tiles, the tile API (greenlet, numpy), jobs, payloads and the
watchdog are imported on first use: the CLI's client commands need only the errors, the
statuses and statistics of a result and the budget check, and start several times faster
without the rest (without jobs, payloads and the watchdog alone, ~30 ms sooner: they
bring logging, concurrent.futures, pickle and ctypes).
"""

from ipuos._lazy import lazy_exports

from ._errors import (
    CollectiveMismatchError,
    ComputeBudgetExceeded,
    DeadlockError,
    ExchangeError,
    JobAborted,
    TileBusyError,
    TileFailed,
    TileInterrupt,
    TileKeyboardInterrupt,
    describe_syntax_error,
    ended_call,
    foreign_call,
)
from ._budget import budget_seconds
from ._outcome import ABORTED, ERROR, INTERRUPTED, OK, JobStats

__all__ = [
    "ABORTED",
    "ERROR",
    "INTERRUPTED",
    "OK",
    "ProgramGlobals",
    "TILE_GLOBALS_MARKER",
    "TILE_SOURCE_LINES",
    "CollectiveMismatchError",
    "ComputeBudgetExceeded",
    "DeadlockError",
    "ExchangeError",
    "Job",
    "JobAborted",
    "JobReport",
    "JobStats",
    "Scheduler",
    "Tile",
    "TileAPI",
    "TileBusyError",
    "TileFailed",
    "TileInterrupt",
    "TileKeyboardInterrupt",
    "TilePickler",
    "TileResult",
    "TileUnpickler",
    "budget_seconds",
    "ctrl_c_dropped",
    "ctrl_cs_dropped_are_told",
    "decode",
    "describe_syntax_error",
    "encode",
    "ended_call",
    "foreign_call",
    "not_started",
]

#: public names imported on first use (see ipuos._lazy)
__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "Scheduler": "._scheduler", "not_started": "._scheduler", "Tile": "._tile", "TileAPI": "._api",
    "Job": "._job", "JobReport": "._job", "TileResult": "._job",
    "ProgramGlobals": "._payload", "TilePickler": "._payload", "TileUnpickler": "._payload",
    "decode": "._payload", "encode": "._payload",
    "TILE_GLOBALS_MARKER": "._watchdog", "TILE_SOURCE_LINES": "._watchdog",
    "ctrl_c_dropped": "._ctrl_c_settle", "ctrl_cs_dropped_are_told": "._ctrl_c_settle",
})
