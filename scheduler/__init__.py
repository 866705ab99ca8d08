"""Tiles as greenlets in bulk-synchronous supersteps, and the exchange between them.

The public API of the scheduler layer; everything else here is private.
"""

from ._api import TileAPI
from ._errors import (
    CollectiveMismatchError,
    ComputeBudgetExceeded,
    DeadlockError,
    ExchangeError,
    JobAborted,
    TileBusyError,
    TileFailed,
    TileInterrupt,
    describe_syntax_error,
)
from ._job import ABORTED, ERROR, INTERRUPTED, OK, Job, JobReport, JobStats, TileResult
from ._payload import TilePickler, TileUnpickler, decode, encode
from ._scheduler import Scheduler
from ._tile import Tile
from ._watchdog import TILE_GLOBALS_MARKER, TILE_SOURCE_LINES, budget_seconds

__all__ = [
    "ABORTED",
    "ERROR",
    "INTERRUPTED",
    "OK",
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
    "TilePickler",
    "TileResult",
    "TileUnpickler",
    "budget_seconds",
    "decode",
    "describe_syntax_error",
    "encode",
]
