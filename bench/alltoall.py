"""64-byte alltoall at 1472 tiles, with every tile's result landing in its SRAM.

Beside it, measured in the same run: an empty superstep (the scheduler's floor) and a
plain numpy copy of the same bytes into every tile's SRAM (the memory-bandwidth floor:
1472 x 1472 x ~70 B = ~150 MB per alltoall). Target: >= 100 alltoalls/s.

An alltoall and an empty superstep are each timed as the median interval between the
running program's exchanges (one per alltoall), not as the whole run: launching a
program on 1472 tiles takes about as long as three alltoalls.
"""

from __future__ import annotations

import numpy as np

from _common import best_interleaved, elapsed, parser, program_superstep, report

import ipuos
from ipuos._memtune import reexec_tuned


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

        best = best_interleaved({"alltoall": alltoall, "empty": empty, "copy": elapsed(raw_copy)},
                                args.repeat)
    rate, empty_rate, copy_rate = 1 / best["alltoall"], 1 / best["empty"], 1 / best["copy"]
    print(f"64-byte alltoall at {tiles} tiles, best of {args.repeat} (contenders run in turn)")
    report("empty superstep", empty_rate, "/s")
    report("numpy copy of the same bytes into every tile", copy_rate, "/s")
    report("alltoall", rate, "/s", copy_rate, "raw copy", target=">= 100/s")
    report("alltoall", rate, "/s", empty_rate, "empty superstep")


if __name__ == "__main__":
    main()
