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


def asyncio_barrier(tiles: int, rounds: int) -> None:
    async def main():
        barrier = asyncio.Barrier(tiles)

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

        def run(n):
            result = machine.run(f"for _ in range({n}):\n    sync()\n", tiles=tile_spec)
            assert result.ok and result.stats.supersteps >= n

        run(rounds)  # warm up: start every tile's greenlet
        # steady state: the difference of two run lengths cancels launching the program
        short = best_time(lambda: run(rounds // 3), args.repeat)
        long = best_time(lambda: run(rounds), args.repeat)
        real_rate = (rounds - rounds // 3) / max(long - short, 1e-9)
        launch = best_time(lambda: run(0), args.repeat)
    bare_rate = rounds / best_time(bare_greenlets(tiles, rounds), args.repeat)
    asyncio_rounds = max(5, rounds // 10)
    asyncio_rate = asyncio_rounds / best_time(lambda: asyncio_barrier(tiles, asyncio_rounds), args.repeat)
    print(f"empty supersteps at {tiles} tiles, best of {args.repeat}")
    report("launching and ending a program on every tile", launch * 1e3, "ms")
    report("bare greenlet loop", bare_rate, "supersteps/s")
    report("asyncio.Barrier", asyncio_rate, "supersteps/s", bare_rate, "bare")
    report("ipuos scheduler", real_rate, "supersteps/s", bare_rate, "bare",
           target=">= 1,000/s and >= 0.60x bare")
    report("ipuos scheduler", real_rate, "supersteps/s", asyncio_rate, "asyncio", target=">= 10x")


if __name__ == "__main__":
    main()
