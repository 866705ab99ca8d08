"""The caller's side of the file services: the same API from the host and from a tile.

:class:`FsClient` turns the ``fs.*`` services (see ``_services``) into calls that look like
``os`` and ``open``, with errors raised as the ``OSError`` the owner tile raised. Two
transports carry the requests:

* :class:`HostFsClient`, for host threads (the daemon, FUSE callbacks, backup): each
  request is queued with ``scheduler.submit`` and waited for on its Future. Requests from
  many threads, or many :meth:`HostFsClient.submit` calls, are delivered together and
  served in the same superstep.
* :class:`TileFsClient`, for code on a tile (the ``/tiles`` mount, the shell): requests
  ride the exchange with ``scheduler.call_tile``, so each costs a round trip of
  supersteps and must fit the exchange buffers: reads and writes go in chunks sized
  from them.

:class:`RemoteFile` is an open file on another tile, as a file object. Its writes are
collected up to one chunk before they are sent when they ride the exchange (a line-by-line
writer would otherwise pay a round trip of supersteps per line), so, as with Python's
buffered files, an error from such a write may surface at the next flush, seek or close.
From the host every write is sent at once.
"""

from __future__ import annotations

import concurrent.futures
import errno
import functools
import os
from collections.abc import Callable

from ipuos.blockdev import checked_seek, wrong_mode_error

from ._backend import fs_error
from ._entries import Entry, make_stat
from ._files import VfsFile, checked_size, close_dropped, flags_mode, parse_mode, wrap_text

__all__ = ["FsClient", "HostFsClient", "TileFsClient", "RemoteFile"]

#: bytes per request between the host and a tile (nothing limits them but latency)
HOST_CHUNK = 1 << 20
#: room a request or reply needs besides its data (tags, service name, handle, offset)
_ENVELOPE = 512
#: times a paged listing is started again when the tile let go of it half-way
_LISTING_TRIES = 3


class FsClient:
    """The file API of other tiles. Subclasses provide :meth:`call` and :attr:`chunk`."""

    #: most bytes of file data one request or reply carries
    chunk = HOST_CHUNK
    #: bytes a RemoteFile collects before sending them (0: every write is sent at once)
    write_behind = 0
    #: most bytes of directory entries one reply carries (None: any number)
    listing_page: int | None = None

    def call(self, tile: int, service: str, *args):
        """Run ``service(*args)`` on ``tile`` and return its result (or raise its error)."""
        raise NotImplementedError

    def dropped(self) -> None:
        """A file of this client was dropped without being closed, and is on its owner's
        pending list (see ``_files``). The host's files are let go of instead."""

    # -- names -------------------------------------------------------------------------------

    def entry(self, tile: int, path: str) -> Entry:
        return Entry(*self.call(tile, "fs.stat", path))

    def stat(self, tile: int, path: str) -> os.stat_result:
        _, is_dir, size, mtime_ns = self.call(tile, "fs.stat", path)
        return make_stat(is_dir, size, mtime_ns, device=tile + 1)

    def entries(self, tile: int, path: str = "/") -> list[Entry]:
        """Every entry of a directory with type, size and mtime: one request, or one per
        page where a reply must fit an exchange buffer (:attr:`listing_page`)."""
        if self.listing_page is None:
            return [Entry(*item) for item in self.call(tile, "fs.listdir", path)]
        for _ in range(_LISTING_TRIES):
            out: list[Entry] = []
            start = 0
            while start is not None:
                page, start = self.call(tile, "fs.listdir_page", path, start, self.listing_page)
                if page is None:
                    break  # the tile let go of this listing (others were read meanwhile): again
                out.extend(Entry(*item) for item in page)
            else:
                return out
        raise fs_error(errno.EAGAIN, path, f"tile {tile} let go of this directory's listing "
                       f"{_LISTING_TRIES} times before it was read; try again")

    def listdir(self, tile: int, path: str = "/") -> list[str]:
        return [entry.name for entry in self.entries(tile, path)]

    def exists(self, tile: int, path: str) -> bool:
        try:
            self.call(tile, "fs.stat", path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def mkdir(self, tile: int, path: str) -> None:
        self.call(tile, "fs.mkdir", path)

    def makedirs(self, tile: int, path: str, exist_ok: bool = False) -> None:
        self.call(tile, "fs.makedirs", path, exist_ok)

    def rmdir(self, tile: int, path: str) -> None:
        self.call(tile, "fs.rmdir", path)

    def remove(self, tile: int, path: str) -> None:
        self.call(tile, "fs.unlink", path)

    unlink = remove

    def rename(self, tile: int, src: str, dst: str) -> None:
        self.call(tile, "fs.rename", src, dst)

    replace = rename

    def truncate(self, tile: int, path: str, size: int) -> None:
        self.call(tile, "fs.truncate", path, size)

    def utime(self, tile: int, path: str, mtime_ns: int | None = None) -> None:
        self.call(tile, "fs.utime", path, mtime_ns)

    def statvfs(self, tile: int, path: str = "/") -> os.statvfs_result:
        return os.statvfs_result(self.call(tile, "fs.statvfs", path))

    def mounts(self, tile: int) -> list[tuple]:
        return self.call(tile, "fs.mounts")

    def sync(self, tile: int) -> None:
        """Write what ``tile`` keeps in memory (pending mtimes) to its filesystems."""
        self.call(tile, "fs.sync")

    # -- files ---------------------------------------------------------------------------------

    def open(self, tile: int, path: str, mode="rb", *, encoding=None, errors=None, newline=None):
        """An open file on ``tile``: ``mode`` as for ``open`` (text or binary) or
        ``os.O_*`` flags (binary)."""
        spec = flags_mode(mode) if isinstance(mode, int) else parse_mode(mode)
        handle = self.call(tile, "fs.open", path, spec.backend)
        append = ("a" in mode) if isinstance(mode, str) else bool(mode & os.O_APPEND)
        raw = RemoteFile(self, tile, handle, path, spec.raw_text, spec.readable, spec.writable, append)
        if spec.binary:
            return raw
        return wrap_text(raw, spec, -1, encoding, errors, newline)

    def read_file(self, tile: int, path: str) -> bytes:
        with self.open(tile, path, "rb") as file:
            return file.read()

    def write_file(self, tile: int, path: str, data) -> None:
        if isinstance(data, str):  # (checked before the file is opened, and emptied)
            raise TypeError("write_file writes bytes, not str: encode the text first")
        data = memoryview(data)  # TypeError for what is not bytes-like, before the open too
        with self.open(tile, path, "wb") as file:
            file.write(data)

    # positional I/O on handles, for callers that keep their own offsets (FUSE)

    def open_handle(self, tile: int, path: str, flags) -> int:
        return self.call(tile, "fs.open", path, flags)

    def pread(self, tile: int, handle: int, offset: int, size: int) -> bytes:
        parts = []
        while size > 0:
            data = self.call(tile, "fs.read", handle, offset, min(size, self.chunk))
            parts.append(data)
            if len(data) < min(size, self.chunk):
                break
            offset += len(data)
            size -= len(data)
        return b"".join(parts)

    def pwrite(self, tile: int, handle: int, offset: int | None, data,
               landed: Callable[[int], None] | None = None) -> int:
        """Write ``data`` at ``offset`` (None: the handle's position, or the end in append
        mode); returns the position after it. It goes in pieces: ``landed(n)`` is told
        of each as it is written, so that a caller knows what a failure left unwritten."""
        view = memoryview(data).cast("B")
        position = offset
        if not len(view):
            return self.call(tile, "fs.write", handle, offset, b"")
        for start in range(0, len(view), self.chunk):
            piece = view[start : start + self.chunk].tobytes()
            position = self.call(tile, "fs.write", handle, offset, piece)
            if offset is not None:
                offset += len(piece)
            if landed is not None:
                landed(len(piece))
        return position

    def close_handle(self, tile: int, handle: int) -> None:
        self.call(tile, "fs.close", handle)

    # -- storage ----------------------------------------------------------------------------------

    def snapshot(self, tile: int, mount_point: str = "/") -> dict:
        """{block_size, block_count, data}: the device under ``mount_point`` byte for byte,
        taken by its owner between filesystem operations."""
        return self.call(tile, "fs.snapshot", mount_point)

    def restore(self, tile: int, mount_point: str, data) -> None:
        """Overwrite the device under ``mount_point`` with ``data`` and mount it."""
        self.call(tile, "fs.restore", mount_point, data)

    def remount(self, tile: int, mount_point: str = "/") -> None:
        self.call(tile, "fs.remount", mount_point)

    # -- hooks for RemoteFile ---------------------------------------------------------------------

    #: the tile whose greenlet uses these files (None: host threads)
    owner = None
    #: where finalizers put dropped files for the owner to close (None: :meth:`abandon`)
    pending = None

    def abandon(self, tile: int, handle: int, unsent: bytes | None, offset) -> None:
        """Let go of a dropped file without waiting: a finalizer must never block."""


class HostFsClient(FsClient):
    """The file API for host threads; every call waits for the owner tile's answer.

    ``timeout`` (seconds) bounds each wait; a machine that stops answering raises
    ``TimeoutError`` rather than hanging its caller.
    """

    def __init__(self, scheduler, *, timeout: float | None = 60.0):
        self._scheduler = scheduler
        self.timeout = timeout
        #: the superstep a request timed out in, none having ended while it waited: until
        #: one ends, the machine answers nobody, and later requests fail at once rather
        #: than each wait out its own timeout (a host's lookups in one directory come one
        #: after another: three stats waited a minute, two and three)
        self.stalled_in: int | None = None
        self._stalled_after = 0.0  # (the seconds that request waited)

    def submit(self, tile: int, service: str, *args):
        """Queue a request without waiting: a Future of its result. Requests queued together
        are served in the same superstep. TimeoutError at once while the machine is known
        to answer nobody (see ``stalled_in``)."""
        step = self._scheduler.superstep
        if self.stalled_in == step:
            raise TimeoutError(
                f"tile {tile} cannot answer {service!r}: the machine has not ended a superstep since a "
                f"request waited {self._stalled_after:g} s for it (a program may be computing without "
                "reaching an exchange point)")
        future = self._scheduler.submit(tile, service, *args)
        future.ipuos_superstep = step  # (await_reply tells a stalled machine by it)
        return future

    def submit_all(self, service: str, tiles, *args) -> dict:
        """``submit`` the same request to every tile in ``tiles``: {tile: Future}."""
        return self._scheduler.submit_all(tiles, service, *args)

    def call(self, tile: int, service: str, *args):
        return await_reply(self, tile, service, self.submit(tile, service, *args), self.timeout)

    def timed_out(self, future, waited: float) -> None:
        """A request submitted here was given up after ``waited`` seconds: if no superstep
        has ended since it was submitted, the machine answers nobody until one does
        (``stalled_in``)."""
        step = getattr(future, "ipuos_superstep", None)
        if step is not None and step == self._scheduler.superstep:
            self.stalled_in, self._stalled_after = step, waited

    def abandon(self, tile: int, handle: int, unsent: bytes | None, offset) -> None:
        try:
            if unsent:
                self._scheduler.submit(tile, "fs.write", handle, offset, unsent)
            self._scheduler.submit(tile, "fs.close", handle)
        except RuntimeError:
            pass  # the machine has stopped: nothing is left to close


def await_reply(client: HostFsClient, tile: int, service: str, future, timeout: float | None):
    """The answer to a host request, waiting at most ``timeout`` seconds.

    Giving up leaves nothing behind: a request the tile has not started yet is cancelled
    (it never happens; see ``scheduler.Request.begin``), and the handle of an open the
    tile is already serving is closed when it arrives. (A started operation of another
    kind completes, as a syscall interrupted too late does.)
    """
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        client.timed_out(future, timeout)
        if not future.cancel() and service == "fs.open":
            future.add_done_callback(
                lambda done: done.exception() is None and client.abandon(tile, done.result(), None, None))
        raise TimeoutError(
            f"tile {tile} did not answer {service!r} within {timeout:g} s (it may be busy: a program "
            "computing without reaching an exchange point, or a long operation before this one)") from None


class TileFsClient(FsClient):
    """The file API for code running on ``tile`` (its own greenlet), over the exchange.

    ``pending``: the list the finalizer of a dropped file puts it on (the tile's VFS gives
    its own, so its next operation closes them).
    """

    def __init__(self, tile, *, pending: list | None = None):
        self._tile = tile
        self._call_tile = tile.sched.call_tile
        # a request and its reply must each fit the exchange buffers on both sides
        room = min(tile.xout.size, tile.xin.size) - _ENVELOPE
        self.chunk = max(64, room // 64 * 64)
        self.write_behind = self.chunk  # a round trip per small write would cost supersteps
        self.listing_page = self.chunk - 64  # (the page's own envelope)
        #: the most bytes of paths a request may carry (its error reply names them again,
        #: beside the error's own words)
        self.longest_paths = max(0, room - 128)
        self.owner = tile
        self.pending = pending if pending is not None else []
        # (one object, so that a tile's next exchange point closes them once)
        self._close_dropped = functools.partial(close_dropped, self.pending)

    def dropped(self) -> None:
        """Its buffered writes go out, and it is closed, at the program's next exchange
        point at the latest, before any other tile can look at it (no program running:
        at the tile's next file operation, as any dropped file)."""
        self._tile.at_next_exchange(self._close_dropped)

    def call(self, tile: int, service: str, *args):
        chars = 0  # (every request takes this path: no list made for the common case)
        for arg in args:
            if type(arg) is str:
                chars += len(arg)
        if chars * 4 > self.longest_paths:  # (UTF-8: at most 4 bytes a character)
            self._check_path_room([arg for arg in args if type(arg) is str])
        if service == "fs.open":  # interrupted before the handle came: close it when it does
            sched = self._tile.sched
            return self._call_tile(self._tile, tile, service, *args,
                                   abandoned=lambda ok, handle: ok and sched.post_request(tile, "fs.close", handle))
        return self._call_tile(self._tile, tile, service, *args)

    def _check_path_room(self, paths: list[str]) -> None:
        """ENAMETOOLONG for paths too long to cross the exchange in a request (and in
        the error that names them on the way back): not an exchange buffer's error."""
        size = sum(len(path.encode("utf-8", "surrogatepass")) for path in paths)
        if size > self.longest_paths:
            raise OSError(errno.ENAMETOOLONG, f"{os.strerror(errno.ENAMETOOLONG)} (a request to another tile "
                                              f"carries paths of up to {self.longest_paths} bytes on this machine, "
                                              f"whose exchange buffers are small)", paths[0])


def _naming_errors(method):
    """Errors from the serving tile name the path as this tile's program wrote it
    (``/tiles/3/w/a.bin`` or ``a.bin``), not as the other tile knows it."""
    @functools.wraps(method)
    def wrapper(self, *args):
        try:
            return method(self, *args)
        except OSError as exc:
            exc.filename = self.name
            raise
    return wrapper


class RemoteFile(VfsFile):
    """An open file on another tile, reached through a :class:`FsClient`."""

    __slots__ = ("_client", "_tile", "_handle", "_position", "_append", "_unsent", "_unsent_at", "_write_now")

    def __init__(self, client: FsClient, tile: int, handle: int, name: str, mode: str,
                 readable: bool, writable: bool, append: bool):
        VfsFile.__init__(self, name, mode, readable, writable, client.owner, client.pending)
        self._client = client
        self._tile = tile
        self._handle = handle
        self._position = 0
        self._append = append
        #: writes not sent yet, and the offset the first of them goes to
        self._unsent: bytearray | None = None
        self._unsent_at = 0
        #: every write sent at once (buffering=0), not held until a chunk fills
        self._write_now = False

    @property
    def tile(self) -> int:
        return self._tile

    @property
    def handle(self) -> int:
        return self._handle

    @_naming_errors
    def read(self, size: int | None = -1) -> bytes:
        if type(size) is not int or size < -1:
            size = self._read_size(size)
        self._check_open()
        if not self._readable:
            raise wrong_mode_error(self.name, reading=True)
        self._send_writes()
        client = self._client
        chunk = client.chunk
        parts = []
        left = size
        while left != 0:
            want = chunk if left < 0 else min(chunk, left)
            data = client.call(self._tile, "fs.read", self._handle, self._position, want)
            self._position += len(data)
            parts.append(data)
            if len(data) < want:
                break
            if left > 0:
                left -= len(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    @_naming_errors
    def write(self, data) -> int:
        self._check_open()
        if not self._writable:
            raise wrong_mode_error(self.name, reading=False)
        view = memoryview(data).cast("B")
        count = len(view)
        if not count:
            return 0  # (nothing to hold: an empty buffer would keep this position for the next write)
        if self._unsent is None:
            self._unsent = bytearray()
            self._unsent_at = self._position
        self._unsent += view
        self._position += count
        if self._write_now or len(self._unsent) >= self._client.write_behind:
            try:
                self._send_writes()
            except OSError:
                # as the host's buffered file: this write is refused, and what earlier
                # writes were told they had written stays buffered for the next try (a
                # write bigger than a piece may have sent some of its own: tell() says)
                refused = min(count, len(self._unsent))
                del self._unsent[len(self._unsent) - refused:]
                self._position -= refused
                if not self._unsent:
                    self._unsent = None
                raise
        return count

    def unbuffered(self) -> None:
        VfsFile.unbuffered(self)
        self._write_now = True

    @_naming_errors
    def seek(self, offset: int, whence: int = 0) -> int:
        self._check_open()
        offset = checked_seek(offset, whence)
        self._send_writes()
        if whence == os.SEEK_SET:
            position = offset
        elif whence == os.SEEK_CUR:
            position = self._position + offset
        else:
            position = self._client.call(self._tile, "fs.seek", self._handle, offset, whence)
        if position < 0:
            raise fs_error(errno.EINVAL, self.name, "negative seek position")
        self._position = position
        return position

    @_naming_errors
    def tell(self) -> int:
        self._check_open()
        if self._append:  # (where buffered appends land is known once they are sent)
            self._send_writes()
        return self._position

    @_naming_errors
    def size(self) -> int:
        self._check_open()
        self._send_writes()
        return self._client.call(self._tile, "fs.seek", self._handle, 0, os.SEEK_END)

    @_naming_errors
    def truncate(self, size: int | None = None) -> int:
        self._check_open()
        if size is not None:
            size = checked_size(size, self.name)
        self._send_writes()  # (first: where buffered appends land is known once they are sent)
        if size is None:
            size = self._position
        self._client.call(self._tile, "fs.ftruncate", self._handle, size)
        return size

    @_naming_errors
    def flush(self) -> None:
        self._check_open()
        self._send_writes()
        self._client.call(self._tile, "fs.fsync", self._handle)

    fsync = flush

    @_naming_errors
    def _close(self) -> None:
        try:
            self._send_writes()
        finally:
            self._client.call(self._tile, "fs.close", self._handle)

    def __del__(self):
        dropped = not self._closed and self._pending is not None
        VfsFile.__del__(self)  # (on the pending list now)
        if dropped:
            try:
                self._client.dropped()
            except Exception:
                pass  # (a finalizer has nobody to tell; the next file operation closes it)

    def _abandon(self) -> None:
        self._closed = True
        unsent, self._unsent = self._unsent, None
        self._client.abandon(self._tile, self._handle, bytes(unsent) if unsent else None,
                             None if self._append else self._unsent_at)

    def _send_writes(self) -> None:
        unsent = self._unsent
        if not unsent:
            self._unsent = None
            return

        def landed(n: int) -> None:
            del unsent[:n]
            self._unsent_at += n

        # each piece is let go of once written: one that fails stays unsent with the rest,
        # and the next use of the file tries again (a close that fails loses them, saying
        # so, as the host's buffered files do). Sent from a copy: ``landed`` resizes the
        # buffer, which a view of it would forbid (BufferError)
        self._position = self._client.pwrite(self._tile, self._handle, None if self._append else self._unsent_at,
                                             bytes(unsent), landed)
        self._unsent = None

