"""A block device over a host image file.

Used for images on the host disk (tests, exported tile disks). The file must be exactly
``block_size * block_count`` bytes: a size mismatch almost always means the wrong geometry
or the wrong file, and guessing would let littlefs mount a misread image.
Positioned I/O (``pread``/``pwrite``) keeps each request a single system call.
"""

from __future__ import annotations

import os

from ._protocol import BlockDevice, device_error

__all__ = ["FileDevice"]


class FileDevice(BlockDevice):
    """Blocks stored in a host file of exactly ``block_size * block_count`` bytes.

    ``block_count`` may be omitted to take it from the file's size. ``sync`` calls
    ``fsync``, so a completed littlefs sync is on the host disk.
    """

    def __init__(self, path, block_size: int, block_count: int | None = None, *,
                 erase_value: int = 0x00):
        self.path = os.fspath(path)
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block size must be a positive integer, not {block_size!r}")
        fd = os.open(self.path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        try:
            actual = os.fstat(fd).st_size
            if block_count is None:
                if actual == 0 or actual % block_size:
                    raise ValueError(
                        f"{self.path}: {actual} bytes is not a whole number of "
                        f"{block_size}-byte blocks"
                    )
                block_count = actual // block_size
            elif actual != block_size * block_count:
                raise ValueError(
                    f"{self.path}: the image is {actual} bytes but {block_count} blocks of "
                    f"{block_size} bytes need exactly {block_size * block_count}"
                )
            super().__init__(block_size, block_count)
        except BaseException:
            os.close(fd)
            raise
        self.erase_value = erase_value
        self._fd = fd
        self._erased_block = bytes([erase_value]) * block_size

    @classmethod
    def create(cls, path, block_size: int, block_count: int, *, erase_value: int = 0x00,
               exist_ok: bool = False) -> "FileDevice":
        """Create an erased image file of the right size and open it.

        With the default erase value the file is sparse: it costs no disk until written.
        """
        size = block_size * block_count
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        if not exist_ok:
            flags |= os.O_EXCL
        fd = os.open(os.fspath(path), flags, 0o644)
        try:
            os.ftruncate(fd, 0)
            if erase_value:
                block = bytes([erase_value]) * block_size
                for b in range(block_count):
                    os.pwrite(fd, block, b * block_size)
            else:
                os.ftruncate(fd, size)
        finally:
            os.close(fd)
        return cls(path, block_size, block_count, erase_value=erase_value)

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def __repr__(self) -> str:
        return f"<FileDevice {self.path!r} {self.block_count} x {self.block_size} B>"

    def __del__(self):
        # a device dropped without close() must not leak its descriptor
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)

    def _read_block(self, block: int, off: int, size: int) -> bytes:
        data = os.pread(self._fd, size, block * self.block_size + off)
        if len(data) != size:
            raise device_error(f"{self.path}: short read at block {block} (file truncated?)")
        return data

    def _prog_block(self, block: int, off: int, data: bytes) -> None:
        if os.pwrite(self._fd, data, block * self.block_size + off) != len(data):
            raise device_error(f"{self.path}: short write at block {block} (disk full?)")

    def _erase_block(self, block: int) -> None:
        self._prog_block(block, 0, self._erased_block)

    def _sync(self) -> None:
        os.fsync(self._fd)
