"""Checking a compute budget where it is given (the CLI, the shell, a daemon request),
before anything that enforces it (the watchdog) is imported."""

from __future__ import annotations

import math


def budget_seconds(value) -> float:
    """A compute budget as float seconds: a positive, finite number, else ValueError
    saying so (a string or NaN would break the watchdog's comparisons)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"the compute budget must be a number of seconds, not {value!r}")
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"the compute budget must be a positive, finite number of seconds, not {value!r}")
    return seconds
