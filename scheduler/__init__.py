"""Tiles as greenlets in bulk-synchronous supersteps, and the exchange between them.

The public API of the scheduler layer; everything else here is private.

The scheduler itself, tiles and the tile API (greenlet, numpy) are imported on first
use: the CLI's client commands need only the errors, results and budget checks defined
here, and start several times faster without the rest.
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
    describe_syntax_error,
)
from ._job import ABORTED, ERROR, INTERRUPTED, OK, Job, JobReport, JobStats, TileResult
from ._payload import TilePickler, TileUnpickler, decode, encode
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

#: public names imported on first use (see ipuos._lazy)
__getattr__, __dir__ = lazy_exports(__name__, globals(),
                                    {"Scheduler": "._scheduler", "Tile": "._tile", "TileAPI": "._api"})
