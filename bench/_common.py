"""Shared benchmark plumbing: argument parsing, best-of timing, one output format.

Every benchmark prints ``name: figure unit (ratio x baseline)`` lines; ratios compare
figures measured in the same run, because these machines are noisy.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable


def parser(description: str, repeat: int = 3) -> argparse.ArgumentParser:
    """Options every benchmark takes; ``repeat`` is the default number of runs per figure."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="tiny sizes: prove the benchmark runs (CI)")
    p.add_argument("--repeat", type=int, default=repeat, help=f"runs per figure; the best is kept (default {repeat})")
    return p


def elapsed(fn: Callable[[], object]) -> Callable[[], float]:
    """A measure (for :func:`best_interleaved`): the seconds one run of ``fn`` takes."""

    def measure() -> float:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started

    return measure


def median_step(stamps: list[float]) -> float:
    """The median interval between successive time stamps: a superstep's time, free of
    launching and ending the run and of the odd hiccup."""
    return statistics.median(b - a for a, b in zip(stamps, stamps[1:]))


def greenlet_rounds(tiles: int, rounds: int, work: Callable[[], object] | None = None) -> Callable[[], float]:
    """A measure (for :func:`best_interleaved`) of bare greenlets, one per tile, that each
    round call ``work()`` (if given; what it returns is kept until the next round, as a
    program keeps its last result) and switch back: set up now; each call runs
    ``rounds`` rounds and returns the median seconds of one. (``work``: a C callable
    such as a bound ``list.copy`` adds no Python frame of its own.)"""
    import greenlet

    park = greenlet.getcurrent().switch
    if work is None:
        def body():
            while True:
                park()
    else:
        def body():
            kept = None
            while True:
                kept = work()  # noqa: F841 (rebinding frees the last round's, as a program's does)
                park()

    switches = [greenlet.greenlet(body).switch for _ in range(tiles)]
    for switch in switches:
        switch()  # start them, as the machine's tiles are started by the warm-up

    def run() -> float:
        clock = time.perf_counter
        stamps = [clock()]
        for _ in range(rounds):
            for switch in switches:
                switch()
            stamps.append(clock())
        return median_step(stamps)

    return run


def program_superstep(machine, source: str, tiles: str) -> Callable[[], float]:
    """A measure (for :func:`best_interleaved`): run the tile program ``source`` on
    ``tiles`` of ``machine`` and return the median seconds between its exchanges.

    A tile has no clock, so the exchanges are stamped instead, by a hook (the public
    ``Scheduler.before_copies``) that each exchange runs and renews until the program
    has ended. It stamps only while a job runs (the program must be the only one), and
    goes in before the program starts (the scheduler runs calls in order), so even a
    short program is seen from its first superstep.
    """
    sched = machine.scheduler

    def measure() -> float:
        stamps, running = [], [True]

        def stamp():
            if sched.jobs:
                stamps.append(time.perf_counter())
            if running[0]:
                sched.before_copies(stamp)

        sched.call(sched.before_copies, stamp)
        try:
            result = machine.run(source, tiles=tiles)
        finally:
            running[0] = False
        assert result.ok, result.format()
        return median_step(stamps)

    return measure


def best_interleaved(measures: dict[str, Callable[[], float]], repeat: int) -> dict[str, float]:
    """The least of ``repeat`` values each of ``measures`` returns (seconds), taking them
    in turn. A machine whose speed drifts for seconds at a time (a busy neighbour on
    the host) then gives every contender its share of fast and slow spells: ratios
    between them hold far better than when one's runs all come before the other's."""
    best = dict.fromkeys(measures, float("inf"))
    for _ in range(max(1, repeat)):
        for name, measure in measures.items():
            best[name] = min(best[name], measure())
    return best


def best_rounds(contenders, measure: Callable, seconds: float, min_rounds: int = 5) -> dict:
    """``{name: best of measure(name)}``, taking one round of each contender in turn.

    This host's speed drifts in spells of seconds: measured one after another, each
    contender would get its own spell and the ratios would say more about the spells
    than about the code. Alternating round by round gives every contender the same
    ones. ``measure(name)`` returns a figure or a tuple of them (bigger is better); each
    is the best over ``seconds`` per contender, and at least ``min_rounds`` rounds.
    (:func:`best_interleaved` is the same for a fixed number of timings.)
    """
    best: dict = {}
    deadline = time.perf_counter() + seconds * len(contenders)
    rounds = 0
    while rounds < min_rounds or time.perf_counter() < deadline:
        rounds += 1
        for name in contenders:
            got = measure(name)
            seen = best.get(name)
            if seen is None:
                best[name] = got
            elif isinstance(got, tuple):
                best[name] = tuple(map(max, seen, got))
            else:
                best[name] = max(seen, got)
    return best


def report(name: str, value: float, unit: str, baseline: float | None = None,
           baseline_name: str = "", target: str = "") -> None:
    line = f"{name}: {value:,.1f} {unit}"
    if baseline:
        line += f"  ({value / baseline:.2f}x {baseline_name})"
    if target:
        line += f"  [target {target}]"
    print(line, flush=True)
