"""Tile SRAM: one flat numpy array for the whole machine, carved into named regions.

Why one anonymous mapping rather than ``numpy.zeros``: numpy asks the kernel for huge pages
on big arrays, so touching one byte would make 2 MiB resident; a 32-chip machine (28 GiB
of SRAM) must cost nothing until used. The mapping is ``MAP_NORESERVE`` with huge pages
off, and 0x00 is the erased state so nothing is filled at boot.

Why one array for all chips rather than one per chip: the exchange engine moves bytes
between any two tiles with a single vectorised copy over flat indices.
"""

from __future__ import annotations

import mmap
from bisect import bisect_left, insort
from operator import attrgetter

import numpy as np

_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
#: regions start on 8-byte boundaries so the exchange can copy 64-bit words
ALIGN = 8


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


class Region:
    """A named, contiguous piece of one tile's SRAM. Read-only: the allocator's
    bookkeeping (and every view handed out) depends on it never moving.

    A class of its own rather than a frozen dataclass: launching a program allocates a
    region on every tile, and the dataclass's keyword ``__init__`` took a third of
    each allocation's time.
    """

    __slots__ = ("tile", "name", "offset", "size", "array", "view", "base")

    tile: int
    name: str
    offset: int  # inside the tile's SRAM
    size: int
    array: np.ndarray  # uint8 view of exactly this region
    view: memoryview  # writable byte view of exactly this region
    #: offset of the region's first byte in the machine-wide SRAM array
    base: int

    def __init__(self, tile: int, name: str, offset: int, size: int, array: np.ndarray,
                 view: memoryview, base: int):
        init = object.__setattr__
        init(self, "tile", tile)
        init(self, "name", name)
        init(self, "offset", offset)
        init(self, "size", size)
        init(self, "array", array)
        init(self, "view", view)
        init(self, "base", base)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"an SRAM region is read-only (cannot set {name!r}); free it and allocate another")

    def __delattr__(self, name: str) -> None:
        self.__setattr__(name, None)

    def __repr__(self) -> str:
        return f"<Region tile {self.tile} {self.name!r} {self.size} B at {self.offset}>"


_offset = attrgetter("offset")


class TileMemory:
    """The region allocator of one tile: named regions within a fixed byte budget."""

    __slots__ = ("tile", "size", "_sram", "_regions", "_by_offset")

    def __init__(self, sram: "SRAM", tile: int):
        self.tile = tile
        self.size = sram.bytes_per_tile
        self._sram = sram
        self._regions: dict[str, Region] = {}
        #: the same regions in address order, kept so as they come and go: finding a gap
        #: walks them without sorting (a launch allocates on every tile)
        self._by_offset: list[Region] = []

    def alloc(self, name: str, size: int) -> Region:
        """Reserve ``size`` bytes under ``name``; MemoryError if the tile cannot fit it."""
        if name in self._regions:
            raise ValueError(f"tile {self.tile} already has an SRAM region named {name!r}")
        if size < 0:
            raise ValueError(f"region size cannot be negative ({size})")
        need = _align(size)
        offset = self._find_gap(need)
        if offset is None:
            raise MemoryError(self._overflow_message(name, size))
        base = self.tile * self.size + offset
        sram = self._sram
        region = Region(self.tile, name, offset, size, sram.flat[base : base + size],
                        sram.view[base : base + size], base)
        self._regions[name] = region
        insort(self._by_offset, region, key=_offset)
        return region

    def free(self, name: str) -> None:
        """Release a region. Its bytes are zeroed: 0x00 is the erased state of SRAM."""
        region = self._regions.pop(name, None)
        if region is None:
            raise KeyError(f"tile {self.tile} has no SRAM region named {name!r}")
        by_offset = self._by_offset
        index = bisect_left(by_offset, region.offset, key=_offset)
        while by_offset[index] is not region:  # (an empty region shares its offset)
            index += 1
        del by_offset[index]
        if region.size:
            region.array[:] = 0

    def get(self, name: str) -> Region | None:
        return self._regions.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._regions

    @property
    def regions(self) -> list[Region]:
        """The regions in address order."""
        return list(self._by_offset)

    @property
    def used(self) -> int:
        return sum(_align(r.size) for r in self._regions.values())

    @property
    def free_bytes(self) -> int:
        return self.size - self.used

    def largest_free(self) -> int:
        """The biggest region that could still be allocated."""
        return self.largest_free_after()

    def fits(self, size: int) -> bool:
        """Whether a region of ``size`` bytes could be allocated now."""
        return self._find_gap(_align(size)) is not None

    def largest_free_after(self, *sizes: int) -> int | None:
        """The biggest region that could still be allocated once regions of ``sizes``
        were, in that order, as :meth:`alloc` places them; None if they do not all fit.
        (What a program's start takes, checked before it starts on any tile.)"""
        gaps, cursor = [], 0
        for region in self._by_offset:
            gaps.append([cursor, region.offset - cursor])
            cursor = region.offset + _align(region.size)
        gaps.append([cursor, self.size - cursor])
        for size in sizes:
            need = _align(size)
            gap = next((gap for gap in gaps if gap[1] >= need), None)  # (first fit, as _find_gap)
            if gap is None:
                return None
            gap[0] += need
            gap[1] -= need
        return max(length for _, length in gaps)

    def usage(self) -> dict:
        """Per-region usage, for ``free``, ``ps`` and ``top``."""
        return {
            "tile": self.tile,
            "size": self.size,
            "used": self.used,
            "free": self.free_bytes,
            "regions": [
                {"name": r.name, "offset": r.offset, "size": r.size} for r in self.regions
            ],
        }

    def _find_gap(self, need: int) -> int | None:
        """The lowest offset with ``need`` free bytes (first fit), or None."""
        cursor = 0
        for region in self._by_offset:
            if region.offset - cursor >= need:
                return cursor
            cursor = region.offset + _align(region.size)
        return cursor if self.size - cursor >= need else None

    def _overflow_message(self, name: str, size: int) -> str:
        held = ", ".join(f"{r.name} {r.size} B" for r in self.regions) or "none"
        return (
            f"tile {self.tile}: cannot allocate {size} B of SRAM for {name!r}: "
            f"{self.free_bytes} B free of {self.size} B (largest gap {self.largest_free()} B); "
            f"regions held: {held}"
        )


class SRAM:
    """All tiles' SRAM as one lazily-backed ``uint8`` array, ``tiles * bytes_per_tile`` long."""

    def __init__(self, tiles: int, bytes_per_tile: int):
        if bytes_per_tile % ALIGN:
            raise ValueError(f"bytes per tile must be a multiple of {ALIGN}")
        self.tiles = tiles
        self.bytes_per_tile = bytes_per_tile
        self.nbytes = tiles * bytes_per_tile
        self._mmap = mmap.mmap(
            -1, self.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
        )
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            self._mmap.madvise(mmap.MADV_NOHUGEPAGE)
        self.flat = np.frombuffer(self._mmap, dtype=np.uint8)
        #: 64-bit word view of the same memory, for word-wise exchange copies
        self.words = self.flat.view(np.uint64)
        self.view = memoryview(self._mmap)
        self._memories: dict[int, TileMemory] = {}

    def tile_array(self, tile: int) -> np.ndarray:
        """The whole SRAM of one tile as a ``uint8`` array."""
        self._check_tile(tile)
        start = tile * self.bytes_per_tile
        return self.flat[start : start + self.bytes_per_tile]

    def memory(self, tile: int) -> TileMemory:
        """The region allocator of ``tile`` (created on first use)."""
        mem = self._memories.get(tile)
        if mem is None:
            self._check_tile(tile)
            mem = self._memories[tile] = TileMemory(self, tile)
        return mem

    def _check_tile(self, tile: int) -> None:
        if not 0 <= tile < self.tiles:
            raise IndexError(f"no tile {tile}: this machine has tiles 0-{self.tiles - 1}")

    def close(self) -> None:
        """Release the mapping. Views handed out earlier must be dropped first."""
        self._memories.clear()
        del self.flat, self.words
        self.view.release()
        try:
            self._mmap.close()
        except BufferError:
            # a numpy view still exists somewhere; the mapping goes with the last of them
            pass
