"""Ctrl-C of a program computing on every tile of a 1-IPU machine: the time from the
Ctrl-C until every tile is done, beside launching and ending a program that does
nothing on the same tiles (every tile is visited once either way).

Tiles run one after another on the host, so each tile that runs after the Ctrl-C came
holds the thread until it takes it: the watchdog once stopped each, after a look every
10 ms (23 s for 1472 tiles), then every 0.1 ms once the tile had computed 0.5 ms (2 s);
now the scheduler thread raises it at the tile's 1000th bytecode (see
scheduler/_ctrl_c_settle.py).
"""

from __future__ import annotations

import time

from _common import best_interleaved, elapsed, parser, report

import ipuos
from ipuos._memtune import reexec_tuned

CATCHES = "try:\n    while True:\n        pass\nexcept KeyboardInterrupt:\n    print('caught')\n"
CATCHES_NOTHING = "while True:\n    pass\n"
#: a cleanup that computes (a tile has no clock: a loop of about HANDLER_MS, sized on
#: the host): the next tile's Ctrl-C must not wait for the watchdog to notice it is due
HANDLER_MS = 8
CLEANUP_LOOP = "for _ in range({n}):\n    pass\n"


def cleanup_loop_size() -> int:
    """The loop count that computes about HANDLER_MS here."""
    n = 10_000
    while True:
        code = compile(CLEANUP_LOOP.format(n=n), "<cleanup>", "exec")
        if min(elapsed(lambda: exec(code, {}))() for _ in range(5)) >= HANDLER_MS / 1e3:
            return n
        n *= 2


def cleans_up(n: int) -> str:
    loop = "".join("    " + line + "\n" for line in CLEANUP_LOOP.format(n=n).splitlines())
    return f"try:\n    while True:\n        pass\nexcept KeyboardInterrupt:\n{loop}    print('caught')\n"


def main() -> None:
    reexec_tuned()  # run the machine as the daemon does (see ipuos._memtune)
    args = parser(__doc__).parse_args()
    tiles = 64 if args.quick else 1472
    with ipuos.Machine("mk2") as machine:
        tile_spec = f"0-{tiles - 1}"

        def ctrl_c(source: str, caught: bool, tile_spec: str = tile_spec):
            def measure() -> float:
                handle = machine.launch(source, tiles=tile_spec)
                time.sleep(0.3)  # (computing: tile 0 holds the thread)
                started = time.perf_counter()
                handle.interrupt("interrupted (Ctrl-C)", ctrl_c=True)
                result = handle.wait(120)
                seconds = time.perf_counter() - started
                printed = sum(tile.output == "caught\n" for tile in result.tiles)
                assert result.ok == caught and printed == (len(result.tiles) if caught else 0), result.format()
                return seconds

            return measure

        def launch_pass():
            result = machine.run("pass", tiles=tile_spec)
            assert result.ok, result.format()

        cleaners = max(2, tiles // 8)  # (each computes HANDLER_MS or so: a few seconds for all)
        loops = cleanup_loop_size()

        def cleanups_alone():  # (the same loops, run and ended without a Ctrl-C)
            result = machine.run(CLEANUP_LOOP.format(n=loops), tiles=f"0-{cleaners - 1}")
            assert result.ok, result.format()

        measures = {"launch": elapsed(launch_pass), "caught": ctrl_c(CATCHES, True),
                    "uncaught": ctrl_c(CATCHES_NOTHING, False),
                    "cleanup": ctrl_c(cleans_up(loops), True, f"0-{cleaners - 1}"),
                    "cleanups alone": elapsed(cleanups_alone)}
        launch_pass()  # warm up: every tile's greenlet started, SRAM pages touched
        best = best_interleaved(measures, args.repeat)

    print(f"Ctrl-C of a program computing on {tiles} tiles, best of {args.repeat}")
    report("launching and ending `pass`", best["launch"] * 1e3, "ms")
    report("Ctrl-C to done, every tile catching it", best["caught"] * 1e3, "ms",
           best["launch"] * 1e3, "launch")
    report("Ctrl-C to done, no tile catching it", best["uncaught"] * 1e3, "ms",
           best["launch"] * 1e3, "launch")
    handover = (best["cleanup"] - best["cleanups alone"]) / cleaners
    report(f"Ctrl-C to done, {cleaners} tiles each cleaning up for "
           f"{best['cleanups alone'] / cleaners * 1e3:.0f} ms: beyond the cleanups run alone, per tile",
           handover * 1e3, "ms")


if __name__ == "__main__":
    main()
