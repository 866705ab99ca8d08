"""64-byte alltoall at 1472 tiles, with every tile's result landing in its SRAM.

Beside it, measured in the same run, three floors no implementation gets under:

* an empty superstep (the scheduler's);
* a plain numpy copy of the same bytes into every tile's SRAM (memory bandwidth:
  1472 x 1472 x ~70 B = ~150 MB per alltoall);
* the Python floor: bare greenlets, one per tile, each taking its own list of the 1472
  objects (the result every tile must get: a list of its own, which it may change) and
  dropping the one before, then switching back. No exchange, no copy into SRAM, no
  decoding: the least an alltoall's result costs the host's one Python thread.

An alltoall must do the work of both the copy and the lists, and the lists are Python's,
on one thread: the host's cores, shared perfectly, allow at most
min(1 / lists, cores / (copy + lists)) alltoalls a second: printed last.

Target: >= 100 alltoalls/s.

An alltoall and an empty superstep are each timed as the median interval between the
running program's exchanges (one per alltoall), not as the whole run: launching a
program on 1472 tiles takes about as long as three alltoalls.
"""

from __future__ import annotations

import os

import numpy as np

from _common import best_interleaved, elapsed, greenlet_rounds, parser, program_superstep, report

import ipuos
from ipuos._memtune import reexec_tuned


def own_lists(tiles: int, rounds: int):
    """The Python floor (see the module doc), as a measure of one round."""
    results = [bytes([rank % 251]) * 64 for rank in range(tiles)]  # decoded once, shared
    return greenlet_rounds(tiles, rounds, results.copy)


def main() -> None:
    reexec_tuned()  # run the machine as the daemon does (see ipuos._memtune)
    args = parser(__doc__).parse_args()
    tiles, rounds = (64, 5) if args.quick else (1472, 40)
    tile_spec = f"0-{tiles - 1}"
    with ipuos.Machine("mk2") as machine:
        program = (
            "payload = bytes([__tileid % 251]) * 64\n"
            f"for _ in range({rounds}):\n"
            "    got = alltoall(payload)\n"
            f"assert len(got) == {tiles} and got[7] == bytes([7]) * 64\n"
        )
        machine.run(program, tiles=tile_spec)  # warm up: greenlets and SRAM pages

        alltoall = program_superstep(machine, program, tile_spec)
        empty = program_superstep(machine, f"for _ in range({rounds}):\n    sync()\n", tile_spec)

        # the bytes really are in SRAM: the last tile's incoming buffer holds tile 7's payload
        region = machine.sram.memory(tiles - 1).get("exchange.in")
        landed = bytes(region.view)
        assert bytes([7]) * 64 in landed, "alltoall results did not land in tile SRAM"
        grid = machine.sram.flat.reshape(machine.ntiles, -1)
        data = np.frombuffer(landed[-tiles * 72 :], dtype=np.uint8).copy()
        column = region.offset + region.size - len(data)

        def raw_copy():
            grid[:tiles, column : column + len(data)] = data

        best = best_interleaved({"alltoall": alltoall, "empty": empty, "copy": elapsed(raw_copy),
                                 "lists": own_lists(tiles, rounds)}, args.repeat)
    rate, empty_rate, copy_rate = 1 / best["alltoall"], 1 / best["empty"], 1 / best["copy"]
    lists_rate = 1 / best["lists"]
    print(f"64-byte alltoall at {tiles} tiles, best of {args.repeat} (contenders run in turn)")
    report("empty superstep", empty_rate, "/s")
    report("numpy copy of the same bytes into every tile", copy_rate, "/s")
    report("Python floor: every tile's own list of the results, on bare greenlets", lists_rate, "/s")
    report("alltoall", rate, "/s", copy_rate, "raw copy", target=">= 100/s")
    report("alltoall", rate, "/s", empty_rate, "empty superstep")
    report("alltoall", rate, "/s", lists_rate, "Python floor")
    # Every alltoall must do both: the copy may spread over every core, the lists not
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    report(f"ceiling: both floors spread perfectly over this host's {cores} cores",
           min(lists_rate, cores / (best["lists"] + best["copy"])), "/s")


if __name__ == "__main__":
    main()
