"""Shared benchmark plumbing: argument parsing, best-of timing, one output format.

Every benchmark prints ``name: figure unit (ratio x baseline)`` lines; ratios compare
figures measured in the same run, because these machines are noisy.
"""

from __future__ import annotations

import argparse
import time
from typing import Callable


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="tiny sizes: prove the benchmark runs (CI)")
    p.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is kept")
    return p


def best_time(fn: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` runs of ``fn``, in seconds."""
    best = float("inf")
    for _ in range(max(1, repeat)):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def report(name: str, value: float, unit: str, baseline: float | None = None,
           baseline_name: str = "", target: str = "") -> None:
    line = f"{name}: {value:,.1f} {unit}"
    if baseline:
        line += f"  ({value / baseline:.2f}x {baseline_name})"
    if target:
        line += f"  [target {target}]"
    print(line, flush=True)
