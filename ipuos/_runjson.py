"""A RunResult as JSON and back: one format for the wire and for ``ipuos run --json``.

The daemon sends a finished run as this document and the client rebuilds the RunResult
from it, so grouping, exit status and ``--json`` output are computed by the same code
whether a program ran in-process or on a daemon.
"""

from __future__ import annotations

import dataclasses

from ._runresult import RunResult, TileRun
from .scheduler import JobStats

_TILE_FIELDS = tuple(f.name for f in dataclasses.fields(TileRun))
_STATS_FIELDS = tuple(f.name for f in dataclasses.fields(JobStats))


def run_result_to_json(result: RunResult) -> dict:
    return {
        "job": result.job_id,
        "program": result.name,  # ("name" is the machine in every document)
        "exit_status": result.exit_status,
        "tiles": [dataclasses.asdict(tile) for tile in result.tiles],
        "stats": dataclasses.asdict(result.stats),
    }


def refused_run_json(program: str, message: str) -> dict:
    """``run --json``'s document for a program that never started (a syntax error, tiles
    busy): a result's keys with no tiles and no stats (null), and its ``error``: not a
    result (``run_result_from_json`` refuses it). A script reading stdout gets a
    document whether or not the program ran; a usage error (status 2) or a machine that
    could not be reached prints none, only its message."""
    return {"job": None, "program": program, "exit_status": 1, "error": message,
            "tiles": [], "stats": None}


def run_result_from_json(doc: dict) -> RunResult:
    """Rebuild a RunResult; ValueError if the document is not one."""
    try:
        tiles = [TileRun(**{name: tile[name] for name in _TILE_FIELDS}) for tile in doc["tiles"]]
        stats = JobStats(**{name: doc["stats"][name] for name in _STATS_FIELDS if name in doc["stats"]})
        return RunResult(doc["job"], doc.get("program", ""), tiles, stats)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a run result: missing or malformed {exc}") from None
