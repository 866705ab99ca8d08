"""What the VFS says about names: entries, ``stat`` and ``statvfs`` results, ``DirEntry``.

Backends answer with :class:`Entry` tuples (name, is_dir, size, mtime_ns): plain enough to
cross the exchange as they are (``tuple(entry)`` marshals), and everything ``ls -l`` needs.
The VFS turns them into the host's own ``os.stat_result`` and ``os.statvfs_result``, so
code written against ``os`` (``stat.S_ISDIR(st.st_mode)``, ``st.st_mtime_ns``, a FUSE
``getattr``) works unchanged.

There is no owner, group or permission model on a tile: files are 0644, directories 0755,
owned by uid 0. littlefs keeps no times of its own; the VFS stores the modification time
as a littlefs attribute and reports it for atime and ctime too.
"""

from __future__ import annotations

import os
import stat as _stat
from typing import NamedTuple

__all__ = ["Entry", "DirEntry", "ScandirIterator", "make_stat", "make_statvfs"]

FILE_MODE = _stat.S_IFREG | 0o644
DIR_MODE = _stat.S_IFDIR | 0o755


class Entry(NamedTuple):
    """One name as a backend reports it. ``mtime_ns`` is 0 when never recorded."""

    name: str
    is_dir: bool
    size: int
    mtime_ns: int


def make_stat(is_dir: bool, size: int, mtime_ns: int, *, device: int = 0,
              block_size: int = 512) -> os.stat_result:
    """An ``os.stat_result`` for an entry (``device`` tells mounts apart, like st_dev)."""
    seconds = mtime_ns / 1e9
    whole = mtime_ns // 1_000_000_000
    return os.stat_result(
        (DIR_MODE if is_dir else FILE_MODE, 0, device, 2 if is_dir else 1, 0, 0, size,
         whole, whole, whole),
        {"st_atime": seconds, "st_mtime": seconds, "st_ctime": seconds,
         "st_atime_ns": mtime_ns, "st_mtime_ns": mtime_ns, "st_ctime_ns": mtime_ns,
         "st_blksize": block_size, "st_blocks": -(-size // 512), "st_rdev": 0},
    )


def make_statvfs(block_size: int, block_count: int, blocks_free: int, name_max: int,
                 *, readonly: bool = False) -> os.statvfs_result:
    """An ``os.statvfs_result``. littlefs has no inode table: files are limited only by
    space, so the file counts report free blocks (each file needs at least part of one)."""
    flags = os.ST_RDONLY if readonly else 0
    return os.statvfs_result((block_size, block_size, block_count, blocks_free, blocks_free,
                              block_count, blocks_free, blocks_free, flags, name_max))


class DirEntry:
    """What ``scandir`` yields: like ``os.DirEntry``, with the stat already known.

    One directory read fetches every entry's type, size and mtime, so ``is_dir()`` and
    ``stat()`` never go back to the filesystem (or across the exchange).
    """

    __slots__ = ("name", "path", "_entry", "_device")

    def __init__(self, directory: str, entry: Entry, device: int = 0):
        self.name = entry.name
        self.path = directory + entry.name if directory.endswith("/") else f"{directory}/{entry.name}"
        self._entry = entry
        self._device = device

    def __reduce__(self):
        # (as the host's os.DirEntry: an entry is a moment of one directory listing, not data)
        raise TypeError(f"cannot pickle {type(self).__name__!r} object")

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        return self._entry.is_dir

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        return not self._entry.is_dir

    def is_symlink(self) -> bool:
        return False

    def is_junction(self) -> bool:
        return False

    def inode(self) -> int:
        return 0

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        entry = self._entry
        return make_stat(entry.is_dir, entry.size, entry.mtime_ns, device=self._device)

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"<DirEntry {self.name!r}>"


class ScandirIterator:
    """``scandir``'s result: an iterator that is also a context manager, as on the host.

    The directory was read completely when it was created, so closing frees nothing.
    """

    __slots__ = ("_entries",)

    def __init__(self, entries: list[DirEntry]):
        self._entries = iter(entries)

    def __iter__(self) -> "ScandirIterator":
        return self

    def __next__(self) -> DirEntry:
        return next(self._entries)

    def close(self) -> None:
        self._entries = iter(())

    def __enter__(self) -> "ScandirIterator":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
