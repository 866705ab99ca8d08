"""The simulated-time cost model of the exchange.

Figures are *simulated* chip time, never host wall time: about 4 bytes per cycle per tile
in each direction at ~1.33 GHz (~8 TB/s all-to-all on a 1472-tile chip) and a chip-wide
sync of a few hundred cycles. Traffic between chips crosses IPU-Links, modelled as a
slower per-tile rate.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostModel:
    clock_hz: float = 1.33e9
    bytes_per_cycle: float = 4.0
    sync_cycles: int = 300
    #: extra cycles for a sync that spans several chips
    multichip_sync_cycles: int = 1500
    #: per-tile rate for bytes that cross chips (IPU-Link), much lower than on-chip
    interchip_bytes_per_cycle: float = 0.25

    def sync(self, chips: int) -> int:
        return self.sync_cycles if chips <= 1 else self.multichip_sync_cycles

    def exchange(self, busiest_tile_bytes: int, busiest_interchip_bytes: int = 0) -> float:
        """Cycles to move data when the busiest tile sends or receives this many bytes."""
        cycles = busiest_tile_bytes / self.bytes_per_cycle
        if busiest_interchip_bytes:
            cycles += busiest_interchip_bytes / self.interchip_bytes_per_cycle
        return cycles

    def seconds(self, cycles: float) -> float:
        return cycles / self.clock_hz
