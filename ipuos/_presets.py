"""Hardware presets: how many tiles, how much SRAM, and how each tile's SRAM is laid out.

A preset fixes the chip (tiles per chip, SRAM per tile) and the default SRAM layout every
tile boots with: its exchange buffers, its own SRAM disk, and its share of the chip disk.
Everything can be overridden per machine with :meth:`Preset.replace`.
"""

from __future__ import annotations

import dataclasses

KiB = 1024


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    tiles_per_chip: int
    sram_per_tile: int
    #: bytes of SRAM each tile reserves for outgoing exchange payloads in one superstep
    exchange_out: int
    #: bytes of SRAM each tile reserves for incoming exchange payloads (messages not yet
    #: received, collective results)
    exchange_in: int
    #: size and block size of the tile's own SRAM disk, mounted at ``/`` (0: no disk)
    disk_size: int
    disk_block_size: int
    #: bytes every tile but tile 0 gives to the chip disk striped over them (0: no chip disk)
    chipdisk_share: int
    chipdisk_block_size: int
    #: bytes of tile 0's SRAM caching chip-disk blocks (write-behind, clustered reads):
    #: every miss costs a superstep, so this is what makes the chip disk usable
    chipdisk_cache: int = 0
    #: the unit that cache holds: 0 for whole blocks, or a power of two dividing the block
    #: (4096 streams big files ~1.6x faster, small ones 15-35% slower; see blockdev._striped)
    chipdisk_cache_page: int = 0
    #: how many of that cache's 4 KiB (littlefs' read unit) hold the first 4 KiB of blocks
    #: rather than whole ones: littlefs reads there far more than elsewhere (a file's
    #: skip-list, every directory), so keeping them apart from the streaming data cut a
    #: 64 MiB read from 43 to 14 exchanges per MiB and 1,000 creates in one directory
    #: from 1,743 to 4 (see blockdev._striped). Whole-block pages only, blocks bigger
    #: than 4 KiB.
    chipdisk_cache_heads: int = 0
    description: str = ""

    def replace(self, **changes) -> "Preset":
        """A copy with some fields changed, checked like the built-in presets."""
        preset = dataclasses.replace(self, **changes)
        preset.validate()
        return preset

    def validate(self) -> None:
        """ValueError naming the field if the geometry is impossible (sizes not multiples
        of 8 or of their block size, more reserved than a tile's SRAM, ...)."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type in ("int", int) and (type(value) is not int):
                raise ValueError(f"preset {self.name!r}: {field.name} must be an integer, not {value!r}")
        for field in ("exchange_out", "exchange_in", "disk_size", "disk_block_size", "chipdisk_share",
                      "chipdisk_block_size", "chipdisk_cache"):
            if getattr(self, field) % 8:
                raise ValueError(f"preset {self.name!r}: {field} must be a multiple of 8 bytes, "
                                 f"not {getattr(self, field)}")
        if self.exchange_out < 64 or self.exchange_in < self.exchange_out:
            raise ValueError(
                f"preset {self.name!r}: the exchange buffers must hold a message: exchange_out "
                f"at least 64 bytes and exchange_in at least exchange_out (they are "
                f"{self.exchange_out} and {self.exchange_in})"
            )
        if self.tiles_per_chip < 1:
            raise ValueError(f"preset {self.name!r}: tiles_per_chip must be at least 1")
        if self.sram_per_tile < 4 * KiB or self.sram_per_tile % 8:
            raise ValueError(
                f"preset {self.name!r}: sram_per_tile must be a multiple of 8 bytes and at least 4 KiB"
            )
        for field in ("exchange_out", "exchange_in", "disk_size", "chipdisk_share"):
            if getattr(self, field) < 0:
                raise ValueError(f"preset {self.name!r}: {field} cannot be negative")
        for size, block, what in (
            (self.disk_size, self.disk_block_size, "disk"),
            (self.chipdisk_share, self.chipdisk_block_size, "chipdisk"),
        ):
            if size and (block < 128 or size % block):
                raise ValueError(
                    f"preset {self.name!r}: {what} size {size} must be a whole number of "
                    f"blocks of at least 128 bytes (block size {block})"
                )
        page = self.chipdisk_cache_page
        if page and (page < 0 or page & (page - 1) or self.chipdisk_block_size % page):
            raise ValueError(f"preset {self.name!r}: chipdisk_cache_page must be 0 (whole blocks) or a "
                             f"power of two dividing chipdisk_block_size ({self.chipdisk_block_size}), not {page}")
        if self.chipdisk_cache_heads < 0:
            raise ValueError(f"preset {self.name!r}: chipdisk_cache_heads cannot be negative")
        if self.chipdisk_cache_heads and page:
            raise ValueError(f"preset {self.name!r}: chipdisk_cache_heads needs a cache of whole blocks "
                             f"(chipdisk_cache_page 0), not pages of {page} B")
        if self.chipdisk_share and self.chipdisk_cache < 2 * self.chipdisk_block_size:
            raise ValueError(
                f"preset {self.name!r}: the chip disk's cache must hold at least two blocks "
                f"({2 * self.chipdisk_block_size} B), not {self.chipdisk_cache}"
            )
        exchange = self.exchange_out + self.exchange_in + self.disk_size
        # tile 0 holds the chip disk's cache, every other tile a share of its blocks
        for what, reserved in (("every tile but 0", exchange + self.chipdisk_share),
                               ("tile 0", exchange + (self.chipdisk_cache if self.chipdisk_share else 0))):
            if reserved > self.sram_per_tile:
                raise ValueError(
                    f"preset {self.name!r}: the default layout of {what} needs {reserved} bytes "
                    f"but a tile has only {self.sram_per_tile}"
                )


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            name="mk2",
            tiles_per_chip=1472,
            sram_per_tile=624 * KiB,
            exchange_out=16 * KiB,
            # a 1472-tile alltoall of 64-byte objects needs ~100 KiB on every tile
            exchange_in=112 * KiB,
            disk_size=128 * KiB,
            disk_block_size=4 * KiB,
            chipdisk_share=64 * KiB,
            # 16 KiB blocks: littlefs walks a file's block list from its end at every
            # block boundary, so big files read ~3x faster than with 4 KiB blocks; the
            # cost is small files (each non-inline file takes a block)
            chipdisk_block_size=16 * KiB,
            chipdisk_cache=256 * KiB,
            # 12 whole blocks and 16 heads
            chipdisk_cache_heads=16,
            description="GC200: 1472 tiles x 624 KiB (~900 MiB per chip)",
        ),
        Preset(
            name="mk1",
            tiles_per_chip=1216,
            sram_per_tile=256 * KiB,
            exchange_out=8 * KiB,
            exchange_in=96 * KiB,
            disk_size=64 * KiB,
            disk_block_size=4 * KiB,
            chipdisk_share=32 * KiB,
            chipdisk_block_size=4 * KiB,
            chipdisk_cache=64 * KiB,
            description="GC2: 1216 tiles x 256 KiB",
        ),
        Preset(
            name="tiny",
            tiles_per_chip=16,
            sram_per_tile=64 * KiB,
            exchange_out=4 * KiB,
            exchange_in=8 * KiB,
            disk_size=16 * KiB,
            disk_block_size=512,
            chipdisk_share=16 * KiB,
            chipdisk_block_size=512,
            chipdisk_cache=8 * KiB,
            description="16 tiles x 64 KiB, for tests",
        ),
    )
}

DEFAULT_PRESET = "mk2"


#: the most chips one machine may have
MAX_IPUS = 64


def ipus_in_range(ipus) -> bool:
    """Whether ``ipus`` is a number of chips this ipuos makes a machine of."""
    return type(ipus) is int and 1 <= ipus <= MAX_IPUS


def largest_machine_tiles() -> int:
    """Tiles of the largest machine the built-in presets make."""
    return MAX_IPUS * max(p.tiles_per_chip for p in PRESETS.values())


def largest_machine_bytes() -> int:
    """SRAM of the largest machine the built-in presets make (MAX_IPUS chips of the
    biggest): what an image may legitimately hold."""
    return MAX_IPUS * max(p.tiles_per_chip * p.sram_per_tile for p in PRESETS.values())


def get_preset(name: str | Preset) -> Preset:
    """Look a preset up by name (a :class:`Preset` is returned as is)."""
    if isinstance(name, Preset):
        name.validate()
        return name
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(
            f"unknown preset {name!r}; choose one of {', '.join(sorted(PRESETS))}"
        ) from None
