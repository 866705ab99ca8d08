"""The kernel's file services: how anyone but the owner reaches a tile's files.

A tile's filesystems are touched only by its own greenlet (DESIGN, "Ownership"). The shell,
FUSE, backup and other tiles therefore send the owner a kernel request (``fs.stat``,
``fs.read`` ...) which it serves at an exchange point, between its own filesystem
operations. This module is the server side: one function per service, registered by name
on ``scheduler.services``. The caller's side is ``_client``.

Arguments and results are plain data (str, int, bytes, tuples, lists, dicts), so a request
marshals straight into the exchange. Paths are absolute in the tile's VFS (a relative path
is taken from ``/``, never from the cwd of whatever program runs there). Open files live
in a per-tile handle table; a handle is a small int valid on that tile only.

| service | arguments | result |
|---|---|---|
| ``fs.boot`` | | None (the tile's storage is up) |
| ``fs.stat`` | path | (name, is_dir, size, mtime_ns) |
| ``fs.listdir`` | path | [(name, is_dir, size, mtime_ns), ...] |
| ``fs.listdir_page`` | path, 0 or a cursor, max_bytes | (entries that fit, the next page's cursor or None) |
| ``fs.open`` | path, flags (``os.O_*`` or a mode string) | handle |
| ``fs.read`` | handle, offset or None, size | bytes (short at end of file) |
| ``fs.write`` | handle, offset or None, data | position after the write |
| ``fs.seek`` | handle, offset, whence | new position |
| ``fs.ftruncate`` / ``fs.flush`` / ``fs.fsync`` / ``fs.close`` | handle (, size) | None |
| ``fs.sync`` | | None (pending mtimes written to littlefs) |
| ``fs.truncate`` | path, size | None |
| ``fs.mkdir`` / ``fs.rmdir`` / ``fs.unlink`` | path | None |
| ``fs.makedirs`` | path, exist_ok | None |
| ``fs.rename`` | src, dst, noreplace=False | None (replaces dst unless noreplace: EEXIST) |
| ``fs.statvfs`` | path | the 10 fields of ``os.statvfs_result`` |
| ``fs.utime`` | path, mtime_ns or None (now) | None |
| ``fs.mounts`` | | [(path, kind, source, readonly, open_files), ...] |
| ``fs.snapshot`` | mount point | {block_size, block_count, data} |
| ``fs.restore`` | mount point, data | None (mounted) |
| ``fs.remount`` | mount point | None |
"""

from __future__ import annotations

import errno
import itertools
from typing import Callable

from ._backend import fs_error
from ._files import FILE_SIZE_MAX

__all__ = ["register_services", "HandleTable", "SERVICE_NAMES", "MAX_HANDLES"]

#: open files one tile keeps for remote callers
MAX_HANDLES = 1024
_HANDLES_KEY = "fs.handles"
_LISTINGS_KEY = "fs.listings"


class HandleTable:
    """The files a tile holds open for remote callers, by small integer handle."""

    __slots__ = ("_files", "_next")

    def __init__(self):
        self._files: dict[int, object] = {}
        self._next = 1

    def __len__(self) -> int:
        return len(self._files)

    def add(self, file) -> int:
        if len(self._files) >= MAX_HANDLES:
            file.close()
            raise fs_error(errno.EMFILE, file.name, f"{MAX_HANDLES} files are already open for remote callers")
        handle = self._next
        self._next += 1
        self._files[handle] = file
        return handle

    def get(self, handle: int):
        file = self._files.get(handle)
        if file is None:
            raise fs_error(errno.EBADF, None, f"no open file with handle {handle!r}")
        return file

    def pop(self, handle: int):
        file = self._files.pop(handle, None)
        if file is None:
            raise fs_error(errno.EBADF, None, f"no open file with handle {handle!r}")
        return file


def _handles(tile) -> HandleTable:
    return tile.kernel_state(_HANDLES_KEY, HandleTable)


def _absolute(path) -> str:
    if not isinstance(path, str):
        raise TypeError(f"paths are str, not {type(path).__name__}")
    return path if path[:1] == "/" or not path else "/" + path  # "" stays ENOENT


# -- the services: fn(tile, vfs, *args) ---------------------------------------------------


def _boot(tile, vfs) -> None:
    return None


def _stat(tile, vfs, path):
    return tuple(vfs.entry(_absolute(path)))


def _listdir(tile, vfs, path):
    return [tuple(entry) for entry in vfs.entries(_absolute(path))]


#: marshalled bytes of an entry beyond its name's: the tuple, a bool, a size, an mtime
_ENTRY_OVERHEAD = 48


def _listdir_page(tile, vfs, path, start, max_bytes):
    """A directory a page at a time: a tile's reply must fit its exchange buffer.

    ``start`` is 0 for a new listing, else the cursor the previous page returned. Every
    page of one listing comes from the directory as it was at the first: listing it again
    for each page, an entry made or removed before the cursor shifted the rest, and a
    name nobody touched was skipped or given twice. A cursor whose listing is no longer
    kept (see :class:`_Listings`) gets ``(None, None)``: the caller starts again."""
    listings = tile.kernel_state(_LISTINGS_KEY, _Listings)
    if start == 0:
        entries = [tuple(entry) for entry in vfs.entries(_absolute(path))]
        token = None
    else:
        try:
            token, start = start
        except (TypeError, ValueError):
            raise TypeError(f"fs.listdir_page: start is 0 or the cursor the last page gave, not {start!r}") from None
        entries = listings.get(token, path)
        if entries is None:
            return None, None
    page, used = [], 0
    for entry in entries[start:]:
        size = len(entry[0].encode("utf-8", "surrogateescape")) + _ENTRY_OVERHEAD
        if page and used + size > max_bytes:
            break
        page.append(entry)
        used += size
    end = start + len(page)
    if end >= len(entries):
        if token is not None:
            listings.drop(token)
        return page, None
    if token is None:
        token = listings.keep(path, entries)
    return page, (token, end)


class _Listings:
    """Directory listings being read a page at a time, by token. A reader that stops
    half-way never says so, so only the latest few are kept: a listing read that slowly
    is started again by its reader (it gets ``(None, None)``)."""

    KEPT = 16

    def __init__(self):
        self._kept: dict[int, tuple[str, list]] = {}
        self._tokens = itertools.count(1)

    def keep(self, path: str, entries: list) -> int:
        token = next(self._tokens)
        self._kept[token] = (path, entries)
        while len(self._kept) > self.KEPT:
            del self._kept[next(iter(self._kept))]
        return token

    def get(self, token: int, path: str):
        """The listing of ``path`` kept under ``token`` (None: none, or another's)."""
        kept = self._kept.get(token)
        return kept[1] if kept is not None and kept[0] == path else None

    def drop(self, token: int) -> None:
        self._kept.pop(token, None)


def _open(tile, vfs, path, flags):
    return _handles(tile).add(vfs.open_raw(_absolute(path), flags))


def _read(tile, vfs, handle, offset, size):
    file = _handles(tile).get(handle)
    if offset is not None:
        if offset > FILE_SIZE_MAX:  # no file reaches there: its end, as pread(2) says
            return b""
        file.seek(offset)
    return file.read(size)


def _write(tile, vfs, handle, offset, data):
    file = _handles(tile).get(handle)
    if offset is not None:
        if offset > FILE_SIZE_MAX:  # (the seek's EINVAL would be the wrong error)
            raise fs_error(errno.EFBIG, file.name)
        file.seek(offset)
    file.write(data)
    return file.tell()


def _seek(tile, vfs, handle, offset, whence):
    return _handles(tile).get(handle).seek(offset, whence)


def _ftruncate(tile, vfs, handle, size):
    _handles(tile).get(handle).truncate(size)


def _flush(tile, vfs, handle):
    # commits the data so other openers see it; the mtime stays a lazy stamp (unlike fsync)
    _handles(tile).get(handle).flush()


def _fsync(tile, vfs, handle):
    _handles(tile).get(handle).fsync()


def _sync(tile, vfs):
    vfs.sync()


def _close(tile, vfs, handle):
    _handles(tile).pop(handle).close()


def _truncate(tile, vfs, path, size):
    vfs.truncate(_absolute(path), size)


def _mkdir(tile, vfs, path):
    vfs.mkdir(_absolute(path))


def _makedirs(tile, vfs, path, exist_ok):
    vfs.makedirs(_absolute(path), exist_ok=exist_ok)


def _rmdir(tile, vfs, path):
    vfs.rmdir(_absolute(path))


def _unlink(tile, vfs, path):
    vfs.remove(_absolute(path))


def _rename(tile, vfs, src, dst, noreplace=False):
    src, dst = _absolute(src), _absolute(dst)
    if noreplace and vfs.exists(dst):  # one request: nothing on the tile comes between
        raise fs_error(errno.EEXIST, dst)
    vfs.rename(src, dst)


def _statvfs(tile, vfs, path):
    return tuple(vfs.statvfs(_absolute(path)))


def _utime(tile, vfs, path, mtime_ns):
    if mtime_ns is None:
        vfs.utime(_absolute(path))
    else:
        vfs.utime(_absolute(path), ns=(mtime_ns, mtime_ns))


def _mounts(tile, vfs):
    return [tuple(info) for info in vfs.mount_points()]


def _snapshot(tile, vfs, mount_point):
    backend = _storage_backend(vfs, mount_point)
    device = backend.device
    return {"block_size": device.block_size, "block_count": device.block_count,
            "data": backend.snapshot()}


def _restore(tile, vfs, mount_point, data):
    _storage_backend(vfs, mount_point).restore(data)


def _remount(tile, vfs, mount_point):
    _storage_backend(vfs, mount_point).remount()


def _storage_backend(vfs, mount_point):
    backend = vfs.backend(_absolute(mount_point))
    if not hasattr(backend, "snapshot"):
        raise fs_error(errno.EINVAL, mount_point, f"a {backend.kind} mount has no device")
    return backend


_SERVICES: dict[str, Callable] = {
    "fs.boot": _boot,
    "fs.stat": _stat,
    "fs.listdir": _listdir,
    "fs.listdir_page": _listdir_page,
    "fs.open": _open,
    "fs.read": _read,
    "fs.write": _write,
    "fs.seek": _seek,
    "fs.ftruncate": _ftruncate,
    "fs.flush": _flush,
    "fs.fsync": _fsync,
    "fs.sync": _sync,
    "fs.close": _close,
    "fs.truncate": _truncate,
    "fs.mkdir": _mkdir,
    "fs.makedirs": _makedirs,
    "fs.rmdir": _rmdir,
    "fs.unlink": _unlink,
    "fs.rename": _rename,
    "fs.statvfs": _statvfs,
    "fs.utime": _utime,
    "fs.mounts": _mounts,
    "fs.snapshot": _snapshot,
    "fs.restore": _restore,
    "fs.remount": _remount,
}

SERVICE_NAMES = tuple(_SERVICES)


def register_services(services: dict, vfs_of: Callable) -> None:
    """Add the ``fs.*`` services to a scheduler's ``services`` table.

    ``vfs_of(tile)`` returns the tile's Vfs, bringing its storage up on first use; it runs
    on the tile's own greenlet, like the service itself.
    """
    for name, function in _SERVICES.items():
        services[name] = _bind(function, vfs_of)


def _bind(function, vfs_of):
    def serve(tile, *args):
        vfs = vfs_of(tile)
        if vfs.pending:  # dropped files are committed before anyone looks
            vfs.close_pending()
        return function(tile, vfs, *args)

    serve.__name__ = serve.__qualname__ = f"serve_{function.__name__.lstrip('_')}"
    return serve
