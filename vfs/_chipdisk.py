"""The chip disk: one littlefs filesystem striped over every other tile's SRAM.

Every tile but the chip tile (tile 0) gives ``chipdisk_share`` bytes of its SRAM (preset)
to a :class:`~ipuos.blockdev.StripedDevice` that tile 0 owns and mounts at ``/chip``. The
SRAM is reserved at boot, like the tile disks, so ``free`` and ``ps`` show it from the
start and no program can take it first; the device itself is built on tile 0 when its
storage comes up, because only tile 0's greenlet may use it (every block it misses in
its cache rides the exchange).

The device caches blocks in tile 0's own SRAM (write-behind, clustered reads), as much as
the preset's ``chipdisk_cache`` says. Every miss costs a superstep, so the cache is what
makes the chip disk usable: a 64 KiB file read through a 6-block cache took ~30
supersteps, through a 32-block one it takes two or three. ``chipdisk_cache_heads`` of
that cache hold only the first read unit of blocks (littlefs' skip-list pointers and
directory logs; see ``blockdev._striped``).
"""

from __future__ import annotations

from typing import Callable

from ipuos.blockdev import StripedDevice, read_unit

__all__ = ["CHIP_DISK_REGION", "CHIP_CACHE_REGION", "reserve_striped_chip_disk"]

#: the SRAM region each backing tile gives to the chip disk
CHIP_DISK_REGION = "chipdisk"
#: the chip tile's SRAM region holding the device's block cache
CHIP_CACHE_REGION = "chipdisk.cache"


def reserve_striped_chip_disk(scheduler, share: int, block_size: int, cache_bytes: int,
                              chip_tile: int = 0, cache_page: int = 0, cache_heads: int = 0) -> Callable | None:
    """Reserve the stripes and the cache now; return ``build(tile)`` making the device.

    None when there is nothing to stripe over (a one-tile machine, or no share). A cache
    layout that cannot work is a ValueError now, not when tile 0 boots.
    """
    backing = [tile for tile in scheduler.tiles if tile.id != chip_tile]
    if not share or not backing:
        return None
    page = cache_page or block_size
    head = read_unit(block_size) if cache_heads else 0
    if cache_heads and head == block_size:
        raise ValueError(f"chip disk blocks of {block_size} B are one littlefs read unit: "
                         "cache heads need bigger blocks")
    slots = StripedDevice.cache_slots(cache_bytes, block_size, page, cache_heads, head)
    stripes = [tile.memory.alloc(CHIP_DISK_REGION, share) for tile in backing]
    cache = scheduler.tiles[chip_tile].memory.alloc(CHIP_CACHE_REGION, slots * page + cache_heads * head)

    def build(tile) -> StripedDevice:
        return StripedDevice(scheduler, tile, stripes, block_size, cache, page=page, heads=cache_heads,
                             head=head)

    return build
