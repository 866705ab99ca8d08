"""A block device over a writable byte buffer: the tile-local SRAM disk.

The device keeps one flat ``memoryview`` of the buffer and serves every request with a
slice of it: no numpy call, no per-call allocation beyond the bytes returned. That makes a
tile's own disk about as fast as Python can move bytes, which matters because littlefs calls
back into Python for every cache line it reads or writes.
"""

from __future__ import annotations

import mmap

import numpy as np

from ._protocol import BlockDevice

__all__ = ["MemoryDevice"]


class MemoryDevice(BlockDevice):
    """Blocks stored in a byte buffer: a ``Region.view`` of tile SRAM, a bytearray, ...

    ``block_count`` defaults to as many whole blocks as the buffer holds; a buffer that is
    not a whole number of blocks is refused rather than silently truncated.
    """

    def __init__(self, buffer, block_size: int, block_count: int | None = None, *,
                 erase_value: int = 0x00, label: str | None = None):
        view = memoryview(buffer)
        if view.readonly:
            raise TypeError("MemoryDevice needs a writable buffer")
        if not view.contiguous:
            raise TypeError("MemoryDevice needs a contiguous buffer")
        view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block size must be a positive integer, not {block_size!r}")
        if block_count is None:
            if len(view) % block_size:
                raise ValueError(
                    f"a buffer of {len(view)} bytes is not a whole number of "
                    f"{block_size}-byte blocks"
                )
            block_count = len(view) // block_size
        elif len(view) != block_size * block_count:
            raise ValueError(
                f"{block_count} blocks of {block_size} bytes need a buffer of "
                f"{block_size * block_count} bytes, not {len(view)}"
            )
        if not 0 <= erase_value <= 255:
            raise ValueError(f"erase value must be a byte, not {erase_value!r}")
        super().__init__(block_size, block_count)
        self.erase_value = erase_value
        self.label = label
        self._view = view
        self._erased_block = bytes([erase_value]) * block_size

    @classmethod
    def for_region(cls, region, block_size: int) -> "MemoryDevice":
        """A device over a tile's SRAM region (an ``ipuos._sram.Region``)."""
        return cls(region.view, block_size, label=f"tile {region.tile} {region.name!r}")

    @classmethod
    def new(cls, block_size: int, block_count: int, *, erase_value: int = 0x00) -> "MemoryDevice":
        """A device over a fresh, erased bytearray (scratch space, tests, restore checks)."""
        buffer = bytearray([erase_value]) * (block_size * block_count)
        return cls(buffer, block_size, block_count, erase_value=erase_value)

    @property
    def buffer(self) -> memoryview:
        """The device's bytes (a live view, not a copy)."""
        return self._view

    def snapshot(self) -> bytes:
        return self._view.tobytes()

    def restore(self, image: bytes) -> None:
        image = memoryview(image).cast("B")
        if len(image) != len(self._view):
            raise ValueError(f"image is {len(image)} bytes but the device holds {len(self._view)}")
        self._view[:] = image

    def close(self) -> None:
        # the buffer belongs to the caller; only our view of it is released
        self._view.release()

    def __repr__(self) -> str:
        where = f" {self.label}" if self.label else ""
        return f"<MemoryDevice{where} {self.block_count} x {self.block_size} B>"

    def _read_block(self, block: int, off: int, size: int) -> bytes:
        start = block * self.block_size + off
        return self._view[start : start + size].tobytes()

    def _prog_block(self, block: int, off: int, data: bytes) -> None:
        start = block * self.block_size + off
        self._view[start : start + len(data)] = data

    def _erase_block(self, block: int) -> None:
        start = block * self.block_size
        self._view[start : start + self.block_size] = self._erased_block


class _ViewSlicer:
    """Slices of a memoryview as bytes: the fallback when its owner cannot be sliced."""

    __slots__ = ("_view",)

    def __init__(self, view):
        self._view = view

    def __getitem__(self, key):
        return self._view[key].tobytes()


def slicing_source(view: memoryview):
    """(object whose slices are bytes or bytearray of ``view``'s memory, offset of ``view``
    in it): the view's owner when that is an mmap or a bytearray, else a slicer."""
    owner = view.obj
    if isinstance(owner, (bytearray, mmap.mmap)) and view.contiguous:
        try:
            offset = (np.frombuffer(view, np.uint8).ctypes.data
                      - np.frombuffer(owner, np.uint8).ctypes.data)
        except (TypeError, ValueError, BufferError):
            offset = -1
        if 0 <= offset and offset + view.nbytes <= len(owner):
            return owner, offset
    return _ViewSlicer(view), 0
