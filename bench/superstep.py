"""Empty supersteps per second at 1472 tiles: the real scheduler beside a bare greenlet
loop (the ceiling) and an asyncio.Barrier version (the obvious alternative).

Targets: >= 1,000/s, >= 60% of the bare greenlet loop, >= 10x asyncio.
"""

from __future__ import annotations

import asyncio

import greenlet

from _common import best_time, parser, report

import ipuos
from ipuos._memtune import reexec_tuned


def bare_greenlets(tiles: int, rounds: int):
    """A bare loop over greenlets that only switch back: set up now, run when called."""
    main = greenlet.getcurrent()
    park = main.switch

    def body():
        while True:
            park()

    switches = [greenlet.greenlet(body).switch for _ in range(tiles)]
    for switch in switches:
        switch()  # start them, as the machine's tiles are started by the warm-up

    def run():
        for _ in range(rounds):
            for switch in switches:
                switch()

    return run


class _ConditionBarrier:
    """asyncio.Barrier's behaviour for Python 3.10, which lacks it."""

    def __init__(self, parties: int):
        self._parties = parties
        self._arrived = 0
        self._generation = 0
        self._condition = asyncio.Condition()

    async def wait(self) -> None:
        async with self._condition:
            generation = self._generation
            self._arrived += 1
            if self._arrived == self._parties:
                self._arrived = 0
                self._generation += 1
                self._condition.notify_all()
            else:
                await self._condition.wait_for(lambda: self._generation != generation)


def asyncio_barrier(tiles: int, rounds: int) -> None:
    async def main():
        barrier = getattr(asyncio, "Barrier", _ConditionBarrier)(tiles)

        async def body():
            for _ in range(rounds):
                await barrier.wait()

        await asyncio.gather(*(body() for _ in range(tiles)))

    asyncio.run(main())


def main() -> None:
    reexec_tuned()  # run the machine as the daemon does (see ipuos._memtune)
    args = parser(__doc__).parse_args()
    tiles, rounds = (64, 20) if args.quick else (1472, 300)
    with ipuos.Machine("mk2") as machine:
        tile_spec = f"0-{tiles - 1}"

        def steady_rate(program):
            """Supersteps/s at steady state: the difference of two run lengths cancels
            launching and ending the program on every tile."""

            def run(n):
                result = machine.run(program(n), tiles=tile_spec)
                assert result.ok and result.stats.supersteps >= n, result.format()

            run(rounds)  # warm up: start every tile's greenlet
            short = best_time(lambda: run(rounds // 3), args.repeat)
            long = best_time(lambda: run(rounds), args.repeat)
            return (rounds - rounds // 3) / max(long - short, 1e-9), short

        def scheduler_rate():
            """The scheduler alone: a job whose target is a Python function (what
            Scheduler.start_job takes), measured the same way."""
            sched = machine.scheduler

            def run(n):
                def target(api):
                    sync = api.sync
                    for _ in range(n):
                        sync()

                report = sched.start_job(range(tiles), target).future.result()
                assert report.ok

            run(rounds)
            short = best_time(lambda: run(rounds // 3), args.repeat)
            long = best_time(lambda: run(rounds), args.repeat)
            return (rounds - rounds // 3) / max(long - short, 1e-9)

        scheduler = scheduler_rate()
        # tile programs through the runtime (per-tile namespaces, program text in SRAM,
        # files): the loop in a function, as speed-minded Python is written ...
        in_function, _ = steady_rate(lambda n: f"def main():\n    for _ in range({n}):\n        sync()\nmain()\n")
        # ... and at module level, where every iteration stores and looks up names in
        # the tile's namespace dict, as in any Python module
        module_level, _ = steady_rate(lambda n: f"for _ in range({n}):\n    sync()\n")
        launch = best_time(lambda: machine.run("pass", tiles=tile_spec), args.repeat)
    bare_rate = rounds / best_time(bare_greenlets(tiles, rounds), args.repeat)
    asyncio_rounds = max(5, rounds // 10)
    asyncio_rate = asyncio_rounds / best_time(lambda: asyncio_barrier(tiles, asyncio_rounds), args.repeat)
    print(f"empty supersteps at {tiles} tiles, best of {args.repeat}")
    report("launching and ending a program on every tile", launch * 1e3, "ms")
    report("bare greenlet loop", bare_rate, "supersteps/s")
    report("asyncio.Barrier", asyncio_rate, "supersteps/s", bare_rate, "bare")
    report("ipuos scheduler", scheduler, "supersteps/s", bare_rate, "bare",
           target=">= 1,000/s and >= 0.60x bare")
    report("ipuos scheduler", scheduler, "supersteps/s", asyncio_rate, "asyncio", target=">= 10x")
    report("tile program, sync() loop in a function", in_function, "supersteps/s", bare_rate, "bare")
    report("tile program, sync() loop at module level", module_level, "supersteps/s", bare_rate, "bare")


if __name__ == "__main__":
    main()
