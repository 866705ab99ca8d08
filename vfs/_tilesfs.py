"""``/tiles``: every tile's files, seen from one tile (the shell's tile 0).

``/tiles`` lists the tile ids; ``/tiles/N/...`` is tile N's own disk, path for path (what
tile N itself mounted, such as tile 0's ``/chip`` and ``/tiles``, is left out: see
``_submounts``; creating, removing or renaming such a name is EBUSY, as in the FUSE
mount). Nothing
here touches another tile's filesystem: every operation becomes a kernel request to tile
N (``fs.stat``, ``fs.open`` ...) through a :class:`~ipuos.vfs._client.TileFsClient`, and
tile N's greenlet serves it, as the ownership rule demands. Errors are the ones tile N
raised, so errno semantics are the same as on the tile itself; the VFS then names the
path as the caller wrote it. Moving a file from one tile to another is EXDEV: they are
different filesystems.

Tile names are canonical decimal numbers ("7", never "07"); anything else is ENOENT.
"""

from __future__ import annotations

import errno
import os
import time

from ipuos._tilespec import tile_of_name

from ._backend import Backend, fs_error
from ._entries import Entry
from ._client import RemoteFile
from ._submounts import Submounts

__all__ = ["TilesBackend"]


class TilesBackend(Backend):
    """Tiles ``0 .. ntiles-1`` as directories, proxied through ``client``."""

    kind = "tiles"

    def __init__(self, client, ntiles: int, changes):
        """``changes``: the machine's ``ChangeFeed``, which tells when a tile's mount
        table has changed, so that what is hidden changes with it."""
        self.client = client
        self.ntiles = ntiles
        self._submounts = Submounts(changes)
        #: the time shown for ``/tiles`` and for each tile in its listing (a listing of
        #: 1472 tiles does not ask each for its time; ``stat`` of ``/tiles/N`` does)
        self._made_ns = time.time_ns()

    def describe(self) -> str:
        return f"tiles 0-{self.ntiles - 1} over the exchange"

    def _split(self, path: str, *, changing: bool = False) -> tuple[int | None, str]:
        """(tile, path on that tile) for a path inside the mount; (None, "/") for its top.
        ``changing``: the name is to be created, removed or renamed (see
        :meth:`Submounts.hidden_errno`)."""
        if not path[1:].partition("/")[0]:
            return None, "/"
        on_tile = self.tile_path(path)
        if on_tile is None:
            raise fs_error(errno.ENOENT, path)
        tile, inner = on_tile
        if inner != "/":
            self._submounts.refresh(tile, self.client.mounts)
            # only the tile's own disk is shown: what it mounted is hidden
            refused = self._submounts.hidden_errno(tile, inner, changing=changing)
            if refused == errno.EBUSY:
                raise fs_error(errno.EBUSY, path, f"a filesystem is mounted there (tile {tile}'s "
                               f"{inner.rstrip('/')}, which /tiles/{tile} does not show)")
            if refused is not None:
                raise fs_error(refused, path)
        return tile, inner

    def tile_path(self, path: str) -> tuple[int, str] | None:
        name, slash, rest = path[1:].partition("/")
        tile = tile_of_name(name)
        if tile is None or tile >= self.ntiles:
            return None
        return tile, "/" + rest if slash else "/"

    # -- names -------------------------------------------------------------------------------

    def entry(self, path: str) -> Entry:
        tile, rest = self._split(path)
        if tile is None:
            return Entry("", True, 0, self._made_ns)
        entry = self.client.entry(tile, rest)
        return entry._replace(name=str(tile)) if rest == "/" else entry

    def entries(self, path: str) -> list[Entry]:
        tile, rest = self._split(path)
        if tile is None:
            made = self._made_ns
            return [Entry(str(tile_id), True, 0, made) for tile_id in range(self.ntiles)]
        entries = self.client.entries(tile, rest)
        if rest == "/":  # (_split learns a tile's mount points only for paths below)
            self._submounts.refresh(tile, self.client.mounts)
        prefix = rest.rstrip("/") + "/"
        return [e for e in entries if not self._submounts.hides(tile, prefix + e.name)]

    def mkdir(self, path: str) -> None:
        tile, rest = self._split(path, changing=True)
        if tile is None or rest == "/":
            raise fs_error(errno.EEXIST, path)
        self.client.mkdir(tile, rest)

    def rmdir(self, path: str) -> None:
        tile, rest = self._split(path, changing=True)
        if tile is None or rest == "/":
            raise fs_error(errno.EBUSY, path, "a tile's root cannot be removed")
        self.client.rmdir(tile, rest)

    def remove(self, path: str) -> None:
        tile, rest = self._split(path, changing=True)
        if tile is None or rest == "/":
            raise fs_error(errno.EISDIR, path)
        self.client.remove(tile, rest)

    def rename(self, src: str, dst: str) -> None:
        src_tile, src_rest = self._split(src, changing=True)
        dst_tile, dst_rest = self._split(dst, changing=True)
        if src_tile is None or dst_tile is None or src_rest == "/" or dst_rest == "/":
            raise fs_error(errno.EBUSY, src, "a tile's root cannot be moved", dst)
        if src_tile != dst_tile:
            raise fs_error(errno.EXDEV, src, "cannot move between tiles", dst)
        self.client.rename(src_tile, src_rest, dst_rest)

    def truncate(self, path: str, size: int) -> None:
        tile, rest = self._split(path)
        if tile is None:
            raise fs_error(errno.EISDIR, path)
        self.client.truncate(tile, rest, size)

    def set_mtime(self, path: str, mtime_ns: int) -> None:
        tile, rest = self._split(path)
        if tile is None:
            raise fs_error(errno.EROFS, path)
        self.client.utime(tile, rest, mtime_ns)

    # -- files ----------------------------------------------------------------------------------

    def open(self, path: str, mode, name: str, pending) -> RemoteFile:
        tile, rest = self._split(path, changing=mode.stamps or mode.maybe_creates)
        if tile is None:
            raise fs_error(errno.EISDIR, path)
        client = self.client
        handle = client.call(tile, "fs.open", rest, mode.backend)
        flags = mode.backend
        append = "a" in flags if isinstance(flags, str) else bool(flags & os.O_APPEND)
        return RemoteFile(client, tile, handle, name, mode.raw_text, mode.readable, mode.writable, append)

    def statvfs(self, path: str) -> tuple[int, int, int, int]:
        tile, rest = self._split(path)
        if tile is None:
            return (512, 0, 0, 255)  # the directory of tiles holds no blocks of its own
        result = self.client.statvfs(tile, rest)
        return (result.f_bsize, result.f_blocks, result.f_bfree, result.f_namemax)
