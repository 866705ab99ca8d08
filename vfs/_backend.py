"""What the VFS needs from a mounted filesystem: the backend interface.

A backend sees canonical paths *inside* itself ("/", "/a/b"; a trailing slash means "must
be a directory") and answers with :class:`~ipuos.vfs._entries.Entry` tuples, open
:class:`~ipuos.vfs._files.VfsFile` objects, or ``OSError`` with a POSIX errno. The VFS
around it does the rest: paths, the mount table, read-only mounts, text files, error
file names as the caller wrote them.

Three kinds exist: littlefs on a block device (``_local``), the ``/tiles`` proxy to
other tiles' files (``_tilesfs``), and :class:`EmptyBackend`, the read-only empty root of
a tile that has no disk. The base class answers everything as an empty, read-only
directory would, so a backend only writes what it supports.
"""

from __future__ import annotations

import errno
import os

from ._entries import Entry

__all__ = ["Backend", "EmptyBackend", "fs_error"]


def fs_error(number: int, path=None, message: str | None = None, path2=None) -> OSError:
    """``OSError(number)`` with the right subclass (FileNotFoundError ...) and file names."""
    message = message or os.strerror(number)
    if path2 is not None:
        return OSError(number, message, error_name(path), None, error_name(path2))
    return OSError(number, message, error_name(path))


def error_name(path):
    """The file name an error gives for ``path``: as the caller wrote it, but a str, as
    the host's errors name a ``pathlib.Path`` (None stays None)."""
    return path if path is None or type(path) is str else os.fspath(path)


class Backend:
    """A mounted filesystem, as the VFS calls it. Defaults: an empty read-only directory."""

    #: short name for ``mounts()``: "littlefs", "tiles", "empty"
    kind = "empty"

    def describe(self) -> str:
        """What is mounted, for ``mount`` listings (e.g. the device)."""
        return self.kind

    def tile_path(self, path: str) -> tuple[int, str] | None:
        """(tile, path on its own disk) if ``path`` names a file of one tile's disk,
        reached through this mount; None for a filesystem of this mount's own."""
        return None

    # -- names -----------------------------------------------------------------------------

    def entry(self, path: str) -> Entry:
        if path.rstrip("/") == "":
            return Entry("", True, 0, 0)
        raise fs_error(errno.ENOENT, path)

    def entries(self, path: str) -> list[Entry]:
        self.entry(path)
        return []

    def open(self, path: str, mode, name: str, pending):
        if path.rstrip("/") == "":
            raise fs_error(errno.EISDIR, path)
        if mode.writes:
            raise fs_error(errno.EROFS, path)
        raise fs_error(errno.ENOENT, path)

    def mkdir(self, path: str) -> None:
        self._read_only(path)

    def rmdir(self, path: str) -> None:
        self._read_only(path)

    def remove(self, path: str) -> None:
        self._read_only(path)

    def rename(self, src: str, dst: str) -> None:
        self._read_only(src)

    def truncate(self, path: str, size: int) -> None:
        self._read_only(path)

    def set_mtime(self, path: str, mtime_ns: int) -> None:
        self._read_only(path)

    # -- the filesystem as a whole ---------------------------------------------------------

    def statvfs(self, path: str) -> tuple[int, int, int, int]:
        """(block size, block count, free blocks, longest name in bytes) of the
        filesystem holding ``path``."""
        return (512, 0, 0, 255)

    @property
    def open_files(self) -> int:
        """Files open on this backend, those removed while open included (a mount with
        open files cannot be unmounted)."""
        return 0

    @property
    def removed_open_files(self) -> int:
        """How many of :attr:`open_files` are on files removed while open (no path)."""
        return 0

    def detach(self) -> None:
        """Called when the mount that owns this backend is removed."""

    def _read_only(self, path: str) -> None:
        self.entry(path)  # ENOENT for what does not exist, as a real filesystem says
        raise fs_error(errno.EROFS, path)


class EmptyBackend(Backend):
    """The root of a tile without a disk: an empty directory nothing can be written to."""
