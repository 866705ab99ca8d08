"""The devices a backup holds, and where their bytes live in the machine's SRAM.

A machine has two kinds of SRAM block device, and an image names them after the owner
tile, whose greenlet alone mounts them (DESIGN, "Ownership"):

* ``tile/N/disk``: tile N's own disk, the ``disk`` region of its SRAM, mounted at ``/``;
* ``chip``: the chip disk, mounted at ``/chip`` by the chip tile (tile 0) and striped over
  the ``chipdisk`` region of every other tile. Block ``b`` lives in stripe ``b % n`` at
  offset ``(b // n) * block_size`` (``blockdev.StripedDevice``'s documented layout; a test
  holds the two together). In an image its bytes are in block order, so the image can be
  mounted as it is, offline.

Only the owner writes these bytes, and only while its storage is up. So a tile whose
storage was never brought up (state ``blank``) has an all-zero disk that need not be read,
and one that holds restored bytes not yet mounted (``restored``) cannot change until it is
brought up. A backup reads the regions here while their owners are frozen
(``_backup_freeze``); a restore writes them, likewise.

Machines built with a custom ``chip_device`` (tests) have no striped chip disk: their
backups hold the tile disks only.

What need not be read at all: SRAM is a private anonymous mapping, so a page the process
never touched reads as zeros (and reading it costs a page fault, ~1 us, for nothing).
:class:`Residency` asks the kernel which pages are resident (``/proc/self/pagemap``: one
8-byte entry per page, ~2 MB for a whole 1-IPU machine) and hands the image writer the
byte ranges that may be non-zero. A formatted but empty chip disk is 92 MiB of SRAM of
which a few pages were ever written: it costs a few pages instead of 23,000 faults.
Where pagemap cannot be read, everything counts as possibly non-zero.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import weakref

import numpy as np

from ._tilespec import format_tiles
from .vfs import CHIP_DISK_MOUNT, CHIP_DISK_REGION, DISK_REGION

__all__ = ["CHIP", "Device", "machine_devices", "machine_meta", "tile_disk_name"]

#: the chip disk's device name
CHIP = "chip"
_PAGE = mmap.PAGESIZE


def tile_disk_name(tile: int) -> str:
    return f"tile/{tile}/disk"


@dataclasses.dataclass(frozen=True, eq=False)
class Device:
    """One SRAM block device of a machine: its image identity and where its bytes are."""

    name: str
    owner: int  # the tile whose greenlet mounts it
    mount: str
    block_size: int
    block_count: int
    #: the device's SRAM regions: one for a tile disk; the stripes, in order, for the chip
    regions: tuple

    @property
    def length(self) -> int:
        return self.block_size * self.block_count

    @property
    def image_tile(self) -> int | None:
        """The ``tile`` of its image entry: the tile whose SRAM holds it (None: many)."""
        return self.owner if self.name != CHIP else None

    @property
    def _rows(self) -> int:
        return self.block_count // len(self.regions)

    def read(self, residency: "Residency | None" = None) -> tuple[np.ndarray, list | None]:
        """``(bytes in block order, ranges that may be non-zero or None)``. A tile disk is
        a view of its live SRAM (read it while its owner is frozen); the chip disk is
        gathered from its stripes into a fresh, lazily zeroed buffer, copying only the
        blocks whose pages are resident."""
        if self.name != CHIP:
            region = self.regions[0]
            ranges = residency.ranges(region.base, self.length) if residency else None
            return region.array[: self.length], ranges
        rows, width, bs = self._rows, len(self.regions), self.block_size
        out = _lazy_zeros(self.length)
        # SRAM offset of block b = stripe base (b % width) + (b // width) * bs, as (rows, width)
        bases = np.array([region.base for region in self.regions], np.int64)
        where = bases[None, :] + (np.arange(rows, dtype=np.int64) * bs)[:, None]
        used = residency.blocks(where.ravel(), bs) if residency else np.ones(rows * width, bool)
        live = np.flatnonzero(used)  # block numbers, in block order
        grid = out.reshape(rows, width, bs)
        by_stripe = used.reshape(rows, width)
        for i in np.flatnonzero(by_stripe.any(axis=0)).tolist():
            stripe = self.regions[i].array[: rows * bs].reshape(rows, bs)
            these = by_stripe[:, i]
            if these.all():
                grid[:, i, :] = stripe
            else:
                grid[these, i, :] = stripe[these]
        return out, _block_ranges(live, bs)

    def write(self, data, stored=None, residency: "Residency | None" = None) -> None:
        """Overwrite the device's SRAM with ``data`` (block order; None: all zeros).

        ``stored``: byte ranges of ``data`` that may be non-zero (the image's stored
        chunks; None: all of it); only those are copied, and elsewhere only resident pages
        are zeroed (the rest read as zeros already). So restoring a sparse device, or a
        blank one onto a fresh tile, makes no more SRAM resident than it needs."""
        if data is None:
            stored = []
        bs = self.block_size
        if self.name != CHIP and data is not None and (stored is None or stored == [(0, self.length)]):
            np.copyto(self.regions[0].array[: self.length], np.frombuffer(data, np.uint8))  # all of it
            return
        mask = np.ones(self.block_count, bool) if stored is None else _block_mask(stored, bs, self.block_count)
        if self.name != CHIP:
            region = self.regions[0]
            target = region.array[: self.length].reshape(self.block_count, bs)
            source = None if data is None else np.frombuffer(data, np.uint8).reshape(self.block_count, bs)
            _write_blocks(target, source, mask, self._resident([region.base], self.block_count, residency))
            return
        rows, width = self._rows, len(self.regions)
        grid = None if data is None else np.frombuffer(data, np.uint8).reshape(rows, width, bs)
        mask = mask.reshape(rows, width)
        resident = self._resident([r.base for r in self.regions], rows, residency).reshape(rows, width)
        for i in np.flatnonzero((mask | resident).any(axis=0)).tolist():
            stripe = self.regions[i].array[: rows * bs].reshape(rows, bs)
            _write_blocks(stripe, None if grid is None else grid[:, i, :], mask[:, i], resident[:, i])

    def _resident(self, bases, rows: int, residency: "Residency | None") -> np.ndarray:
        """Per block, in block order (``rows`` of ``len(bases)`` stripes): may its SRAM
        hold anything now?"""
        bs = self.block_size
        where = (np.asarray(bases, np.int64)[None, :] + (np.arange(rows, dtype=np.int64) * bs)[:, None]).ravel()
        if residency is None:
            return np.ones(len(where), bool)
        return residency.blocks(where, bs)


def prefault(devices: list["Device"], stored: dict) -> None:
    """Fault in, ahead of time, the SRAM pages a restore is about to fill.

    A machine just booted has never touched its SRAM, and copying 184 MiB into fresh
    pages costs ~6x a copy into present ones (a fault and a page of zeroes each). Asking
    the kernel for the pages with ``MADV_POPULATE_WRITE`` changes no byte of SRAM (a
    missing page reads as zeros, a populated one holds zeros), so it may run before the
    tiles are frozen, while the image is still being verified. Only tile disks' stored
    ranges are asked for; anything that fails (an old kernel) is simply skipped.
    """
    madvise = _libc_madvise()
    if madvise is None:
        return
    for d in devices:
        if d.name == CHIP:
            continue
        base = d.regions[0].array.ctypes.data
        for offset, length in stored.get(d.name) or ():
            first = (base + offset) // _PAGE * _PAGE
            last = -(-(base + offset + length) // _PAGE) * _PAGE
            if madvise(first, last - first, _MADV_POPULATE_WRITE) != 0:
                return  # not supported here: the copy will fault instead


_MADV_POPULATE_WRITE = 23  # Linux 5.14
_madvise = None


def _libc_madvise():
    global _madvise
    if _madvise is None:
        try:
            import ctypes

            call = ctypes.CDLL(None, use_errno=True).madvise
            call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            call.restype = ctypes.c_int
            _madvise = call
        except (OSError, AttributeError):
            _madvise = False
    return _madvise or None


def _block_mask(ranges, bs: int, count: int) -> np.ndarray:
    mask = np.zeros(count, bool)
    for offset, length in ranges:
        mask[offset // bs : -(-(offset + length) // bs)] = True
    return mask


def _write_blocks(target: np.ndarray, source, copy: np.ndarray, resident: np.ndarray) -> None:
    """Copy the ``copy`` rows of ``source`` into ``target`` (blocks as rows); zero the
    other rows that are ``resident`` and not zero already."""
    if source is not None and copy.all():
        np.copyto(target, source)
        return
    if source is not None and copy.any():
        target[copy] = source[copy]
    clear = resident & ~copy if source is not None else resident
    for first, count in _block_ranges(np.flatnonzero(clear), 1):
        _zero(target[first : first + count])


def _block_ranges(blocks: np.ndarray, bs: int) -> list[tuple[int, int]]:
    """Byte ranges covering the sorted block numbers ``blocks``, runs merged."""
    if not len(blocks):
        return []
    breaks = np.flatnonzero(np.diff(blocks) != 1)
    starts = np.concatenate(([blocks[0]], blocks[breaks + 1]))
    ends = np.concatenate((blocks[breaks], [blocks[-1]])) + 1
    return [(int(a) * bs, int(b - a) * bs) for a, b in zip(starts, ends)]


class Residency:
    """Which pages of the machine's SRAM mapping the process has ever touched."""

    def __init__(self, sram):
        self._base = sram.flat.ctypes.data
        self._nbytes = sram.nbytes
        self.pages = _resident_pages(self._base, self._nbytes)  # bool per page, or None

    @classmethod
    def of(cls, sram) -> "Residency | None":
        residency = cls(sram)
        return residency if residency.pages is not None else None

    def ranges(self, offset: int, length: int) -> list[tuple[int, int]]:
        """Byte ranges of ``[offset, offset + length)`` of SRAM (relative to ``offset``) in
        resident pages: outside them the bytes are zero."""
        first = (self._base + offset) // _PAGE
        last = (self._base + offset + length - 1) // _PAGE
        start = first - self._base // _PAGE
        pages = self.pages[start : start + last - first + 1]
        if pages.all():
            return [(0, length)]
        if not pages.any():
            return []
        used = np.flatnonzero(pages)
        out = []
        origin = self._base + offset
        for a, n in _block_ranges(used, 1):
            lo = max((first + a) * _PAGE, origin)
            hi = min((first + a + n) * _PAGE, origin + length)
            out.append((lo - origin, hi - lo))
        return out

    def blocks(self, offsets: np.ndarray, size: int) -> np.ndarray:
        """For blocks of ``size`` bytes at SRAM ``offsets``: is any of their pages resident?"""
        page0 = self._base // _PAGE
        first = (self._base + offsets) // _PAGE - page0
        last = (self._base + offsets + size - 1) // _PAGE - page0
        used = self.pages[first].copy()
        for extra in range(1, int((last - first).max()) + 1 if len(offsets) else 0):
            used |= self.pages[np.minimum(first + extra, last)]
        return used


def _resident_pages(address: int, nbytes: int) -> np.ndarray | None:
    """Per page of ``[address, address + nbytes)``: resident or swapped (may hold data)?"""
    first = address // _PAGE
    count = (address + nbytes + _PAGE - 1) // _PAGE - first
    try:
        fd = os.open("/proc/self/pagemap", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        raw = bytearray(count * 8)
        view = memoryview(raw)
        done = 0
        while done < len(raw):
            got = os.preadv(fd, [view[done:]], first * 8 + done)
            if got <= 0:
                return None
            done += got
    except OSError:
        return None
    finally:
        os.close(fd)
    entries = np.frombuffer(raw, "<u8")
    return (entries >> np.uint64(62)) != 0  # bit 63 present, bit 62 swapped


def _zero(array: np.ndarray) -> None:
    if array.any():
        array[:] = 0


def _lazy_zeros(n: int) -> np.ndarray:
    """``n`` zero bytes whose untouched pages cost no RAM."""
    if n < 1 << 20:
        return np.zeros(n, np.uint8)
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0))
    return np.frombuffer(m, np.uint8)


_devices_of: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def machine_devices(machine) -> list[Device]:
    """Every SRAM block device of ``machine``: the tile disks in tile order, then the chip
    disk (if it is the striped one). Regions are fixed at boot, so this is worked out
    once per machine."""
    devices = _devices_of.get(machine)
    if devices is None:
        devices = _devices_of[machine] = _find_devices(machine)
    return list(devices)


def _find_devices(machine) -> list[Device]:
    storage = machine.storage
    tiles = machine.scheduler.tiles
    devices = []
    bs = storage.disk_block_size
    for tile in tiles:
        region = tile.memory.get(DISK_REGION)
        if region is not None and bs:
            devices.append(Device(tile_disk_name(tile.id), tile.id, "/", bs, region.size // bs, (region,)))
    stripes = tuple(t.memory.get(CHIP_DISK_REGION) for t in tiles if t.id != storage.chip_tile)
    cbs = machine.preset.chipdisk_block_size
    if stripes and all(s is not None for s in stripes) and cbs:
        rows = min(s.size for s in stripes) // cbs
        if rows:
            devices.append(Device(CHIP, storage.chip_tile, CHIP_DISK_MOUNT, cbs, rows * len(stripes), stripes))
    return devices


def machine_meta(machine, tiles: list[int], name: str | None = None) -> dict:
    """The geometry an image records, and that a restore checks."""
    p = machine.preset
    meta = {
        "preset": p.name,
        "ipus": machine.ipus,
        "tiles_per_chip": p.tiles_per_chip,
        "sram_per_tile": p.sram_per_tile,
        "disk_size": p.disk_size,
        "disk_block_size": p.disk_block_size,
        "chipdisk_share": p.chipdisk_share,
        "chipdisk_block_size": p.chipdisk_block_size,
        "chip_tile": machine.storage.chip_tile,
        "tiles": format_tiles(tiles) if tiles else "",
    }
    if name is not None:
        meta["machine"] = name
    return meta


#: the meta keys a restore compares with the machine, with how to say each in a message
GEOMETRY_KEYS = ("preset", "ipus", "tiles_per_chip", "sram_per_tile", "disk_size",
                 "disk_block_size", "chipdisk_share", "chipdisk_block_size", "chip_tile")
