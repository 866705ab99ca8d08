"""littlefs filesystems owned by the tile itself: its SRAM disk, the chip disk, images.

The backend and its files call :class:`~ipuos.blockdev.Filesystem` and nothing else: the
littlefs traps and the littlefs-to-errno table live there. What this module adds is the
ownership bracket and the modification time:

* Every littlefs call runs inside ``owner.fs_depth += 1 ... -= 1``. While the depth is
  non-zero the owner tile serves no kernel requests and takes no signal, even if the
  device pauses its greenlet inside a littlefs callback (a striped device waits for the
  exchange there): littlefs is not re-entrant, and only its owner may call it.
* littlefs keeps no times, so the mtime lives in a littlefs attribute
  (``blockdev.MTIME_ATTRIBUTE``, nanoseconds of host wall time), and is kept the way
  Linux's ``lazytime`` keeps timestamps. A file is stamped, in memory, when it is closed
  or flushed after a write or truncate (with the time of its last one, as Linux stamps
  each write), and when ``open`` creates or truncates it; a
  directory when an entry is created in it, removed from it, or renamed into or out of
  it (as POSIX has it); every stat and listing sees the stamp at once. Stamps reach littlefs when the file is
  ``fsync``-ed, before any rename, before a snapshot or unmount, and whenever
  :data:`PENDING_STAMPS_MAX` are waiting. Writing each stamp at close would be one more
  metadata commit per file (~15 us, as much as writing a 4 KiB file); the price of not
  doing so is that a crash of the device may lose up to that many recent mtimes, never
  data. Stamps that find the disk (nearly) full stay in memory, where stat sees them, and
  follow a rename, until stamps are written again with room to spare; the oldest go if
  many wait, and those still waiting when the filesystem is unmounted are lost (the data
  is safe; its time is an older one, or none for a file made since).
"""

from __future__ import annotations

import errno
from time import time_ns

from ipuos._plural import plural
from ipuos.blockdev import WritesLostError

from ._backend import Backend, fs_error
from ._changes import ADDED_DIR, ADDED_FILE, CHANGED, MOVED, REMOVED, RESET
from ._entries import Entry
from ._files import VfsFile, checked_size, raise_pending_signal

__all__ = ["LittlefsBackend", "LocalFile"]

#: mtimes kept in memory before they are written to littlefs together
PENDING_STAMPS_MAX = 1024
#: free blocks below which pending mtimes are kept in memory instead of written (see _write_stamps)
STAMP_RESERVE_BLOCKS = 4


class LittlefsBackend(Backend):
    """A mounted :class:`~ipuos.blockdev.Filesystem`, called only by its owner tile.

    ``owns``: the backend was made for its mount and unmounts littlefs when the mount
    goes. ``owner`` is the tile (anything with ``fs_depth`` and ``glet``).
    """

    kind = "littlefs"
    #: where changes are reported (a ``_changes.ChangeSource``; set by the Vfs it is
    #: mounted on, when someone may watch it), else None
    changes = None

    def __init__(self, filesystem, owner, *, owns: bool = False):
        self.fs = filesystem
        self.device = filesystem.device
        self.owner = owner
        self.owns = owns
        #: mtimes (ns) not yet written to littlefs, by canonical path
        self._stamps: dict[str, int] = {}
        #: the filesystem's commit_mark when it was found too full to write stamps
        self._full_at: tuple | None = None
        #: counts the times set (``os.utime``) while files were open; an open file keeps
        #: the count its last write saw (see LocalFile._written)
        self.times_set = 1
        #: the count at which each path's time was last set while files were open
        self._time_set_at: dict[str, int] = {}

    def describe(self) -> str:
        return repr(self.device)

    # -- lifecycle (format at first boot, mount existing bytes after a restore) ----------------

    def start(self, *, format: bool) -> None:
        """Format (if asked) and mount. Never formats what it was not told to."""
        owner = self.owner
        owner.fs_depth += 1
        try:
            if format:
                self.fs.format()
            self.fs.mount()
        finally:
            owner.fs_depth -= 1
        if format:
            self.stamp("/")  # made now, as mkfs dates a new filesystem's root

    def remount(self) -> None:
        """Unmount (committing open files) and mount again: how a filesystem comes back
        after a device error."""
        owner = self.owner
        owner.fs_depth += 1
        lost = None
        try:
            if self.fs.mounted:
                try:
                    if self.fs.fault is None:
                        self._write_stamps()
                except OSError:
                    pass  # (a device error, likely what brought us here): mounting decides
                finally:
                    try:
                        self.fs.unmount()
                    except WritesLostError as exc:
                        lost = exc
                    except OSError:
                        pass  # the device error that brought us here; mounting decides
            self._stamps.clear()
            self.fs.mount()
        finally:
            owner.fs_depth -= 1
            if self.changes is not None:
                self.changes.emit(RESET, "/")
        if lost is not None:  # mounted again, but the caller must hear what was lost
            raise fs_error(errno.EIO, None, f"mounted again, but {lost.strerror}")

    def snapshot(self) -> bytes:
        """Every byte of the device. The caller is the owner between filesystem operations,
        so the image is littlefs' last committed state (writes to files still open and
        not yet flushed are not in it)."""
        owner = self.owner
        owner.fs_depth += 1
        try:
            if self.fs.mounted and self.fs.fault is None:
                try:
                    self._write_stamps()
                except OSError:
                    pass  # the bytes are what is asked for, whatever state littlefs is in
            flush = getattr(self.device, "flush", None)
            if flush is not None:  # a write-behind cache (the chip disk): to the device first
                flush()
            return self.device.snapshot()
        finally:
            owner.fs_depth -= 1

    def restore(self, image) -> None:
        """Replace the device's bytes with ``image`` and mount them (EBUSY if files are
        open). If they do not mount, the filesystem stays unmounted and the error says why."""
        if self.fs.mounted and self.fs.open_files:
            raise fs_error(errno.EBUSY, None,
                           f"{plural(self.fs.open_files, 'file is', 'files are')} open on {self.device!r}")
        size = memoryview(image).nbytes
        if size != self.device.size:
            raise ValueError(f"an image of {size} bytes cannot restore {self.device!r} "
                             f"({self.device.size} bytes)")
        owner = self.owner
        owner.fs_depth += 1
        try:
            if self.fs.mounted:
                self.fs.unmount()
            self._stamps.clear()  # they were about the bytes being replaced
            self.device.restore(image)
            self.fs.mount()
        finally:
            owner.fs_depth -= 1
            if self.changes is not None:
                self.changes.emit(RESET, "/")

    def detach(self) -> None:
        if self.owns and self.fs.mounted:
            owner = self.owner
            owner.fs_depth += 1
            try:
                try:
                    if self.fs.fault is None:
                        self._write_stamps()
                finally:
                    self.fs.unmount()
            finally:
                owner.fs_depth -= 1

    def abandon(self) -> None:
        """Unmount without writing a byte, not even pending mtimes: the device's bytes were
        replaced underneath (a restore), and littlefs' view of them is stale. Files must
        be closed first."""
        self._stamps.clear()
        if self.fs.mounted:
            owner = self.owner
            owner.fs_depth += 1
            try:
                self.fs.unmount()
            except WritesLostError:
                pass  # (a failed device's cached writes: the new bytes replace them anyway)
            finally:
                owner.fs_depth -= 1

    # -- modification times ---------------------------------------------------------------------

    def stamp_written(self, path: str, written: int, written_at: int) -> None:
        """Stamp ``written_at`` as the mtime of ``path``, written then by a file whose last
        write saw the count ``written``: unless its time was set since, which Linux keeps
        (the mtime is the last write's, stamped here at flush and close)."""
        if self._time_set_at.get(path, 0) <= written:
            self.stamp(path, written_at)
        if self._time_set_at and not self.fs.open_files:
            self._time_set_at.clear()  # (no file that saw them is open)

    def stamp(self, path: str, mtime_ns: int | None = None) -> None:
        """Record ``mtime_ns`` (default now) as ``path``'s mtime (see module doc: written
        to littlefs later)."""
        stamps = self._stamps
        stamps[path] = time_ns() if mtime_ns is None else mtime_ns
        if len(stamps) > PENDING_STAMPS_MAX:
            self.sync()

    @property
    def unwritten_times(self) -> int:
        """mtimes kept in memory, which a (nearly) full disk had no room for (see
        _write_stamps), after a :meth:`sync`: a copy of the device lacks them."""
        return len(self._stamps)

    def sync(self, path: str | None = None) -> None:
        """Write pending mtimes to littlefs: ``path``'s, or all of them."""
        owner = self.owner
        owner.fs_depth += 1
        try:
            if path is None:
                self._write_stamps()
            else:
                mtime = self._stamps.pop(path, None)
                if mtime is not None:
                    try:
                        self.fs.set_mtime(path, mtime)
                    except OSError as exc:
                        if exc.errno == errno.ENOSPC:
                            self._stamps[path] = mtime  # (kept, as _write_stamps keeps them)
                        elif exc.errno != errno.ENOENT:
                            raise
        finally:
            owner.fs_depth -= 1

    def _write_stamps(self) -> None:
        """Caller holds the ownership bracket.

        Stamps stay in memory, not written, when the disk is (nearly) full: littlefs
        2.11 leaves its program cache dirty when a metadata commit fails with ENOSPC, and
        the next commit to another block then aborts the process (an assertion in
        ``lfs_bd_prog``). A user's own full-disk error can still lead there (reported to
        blockdev); the VFS at least never makes hundreds of such commits on its own.
        Kept, not dropped: a file copied into place by a rename has no older time to
        fall back on. Only the newer half of ``PENDING_STAMPS_MAX`` is kept, so that
        stamping does not try again at every stamp while the disk stays full.
        """
        stamps, self._stamps = self._stamps, {}
        if not stamps:
            return
        fs = self.fs
        # (statvfs walks the whole filesystem: on a full disk, every backup and every
        # stamp past the bound paid that again, though nothing had been freed since)
        mark = fs.commit_mark
        if mark == self._full_at or fs.statvfs().blocks_free < STAMP_RESERVE_BLOCKS:
            self._full_at = mark
            self._keep_unwritten(stamps)
            return
        for path, mtime in stamps.items():
            try:
                fs.set_mtime(path, mtime)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    # full after all: no more metadata commits (see above); those written
                    # already are kept too (the same time again, when there is room)
                    self._full_at = fs.commit_mark
                    self._keep_unwritten(stamps)
                    return
                if exc.errno != errno.ENOENT:
                    raise

    def _keep_unwritten(self, stamps: dict[str, int]) -> None:
        """Pending again: the newest of ``stamps`` (see _write_stamps)."""
        keep = PENDING_STAMPS_MAX // 2
        if len(stamps) > keep:
            stamps = dict(list(stamps.items())[-keep:])
        self._stamps = stamps

    def _follow_rename(self, src: str, dst: str) -> None:
        """After a rename: mtimes still pending (kept from a full disk) follow their
        entries, as littlefs moves the written ones; those of what it replaced go."""
        stamps = self._stamps
        if not stamps:
            return
        src, dst = src.rstrip("/"), dst.rstrip("/")
        replaced, moved = dst + "/", src + "/"
        for path in [path for path in stamps if path == dst or path.startswith(replaced)]:
            del stamps[path]
        for path in [path for path in stamps if path == src or path.startswith(moved)]:
            stamps[dst + path[len(src):]] = stamps.pop(path)

    def _mtime(self, path: str) -> int:
        """Caller holds the bracket; ``path`` canonical, without a trailing slash."""
        mtime = self._stamps.get(path)
        if mtime is None:
            mtime = self.fs.get_mtime(path) or 0
        return mtime

    # -- names -----------------------------------------------------------------------------

    def entry(self, path: str) -> Entry:
        owner = self.owner
        fs = self.fs
        owner.fs_depth += 1
        try:
            info = fs.stat(path)
            mtime = self._mtime(path.rstrip("/") or "/")
        finally:
            owner.fs_depth -= 1
        return Entry(info.name, info.is_dir, info.size, mtime)

    def entries(self, path: str) -> list[Entry]:
        owner = self.owner
        fs = self.fs
        base = path.rstrip("/") + "/"
        owner.fs_depth += 1
        try:
            stamps = self._stamps
            return [Entry(info.name, info.is_dir, info.size, stamps.get(base + info.name, mtime or 0))
                    for info, mtime in fs.scandir_mtimes(path)]
        finally:
            owner.fs_depth -= 1

    def mkdir(self, path: str) -> None:
        self._call(self.fs.mkdir, path)
        self.stamp(path)
        self.stamp(_parent(path))
        if self.changes is not None:
            self.changes.emit(ADDED_DIR, path)

    def rmdir(self, path: str) -> None:
        self._call(self.fs.rmdir, path)
        self._stamps.pop(path.rstrip("/"), None)
        self.stamp(_parent(path))
        if self.changes is not None:
            self.changes.emit(REMOVED, path)

    def remove(self, path: str) -> None:
        self._call(self.fs.remove, path)
        self._stamps.pop(path, None)
        self.stamp(_parent(path))
        if self.changes is not None:
            self.changes.emit(REMOVED, path)

    def rename(self, src: str, dst: str) -> None:
        owner = self.owner
        owner.fs_depth += 1
        try:
            self._write_stamps()  # littlefs moves attributes with their entries
            self.fs.rename(src, dst)
        finally:
            owner.fs_depth -= 1
        self._follow_rename(src, dst)
        self.stamp(_parent(src))
        self.stamp(_parent(dst))
        if self.changes is not None:
            self.changes.emit(MOVED, src, dst)

    def truncate(self, path: str, size: int) -> None:
        if size < 0:
            raise fs_error(errno.EINVAL, path, "negative size")
        owner = self.owner
        owner.fs_depth += 1
        try:
            with self.fs.open(path, "r+") as file:
                file.truncate(size)
        finally:
            owner.fs_depth -= 1
        self.stamp(path)
        if self.changes is not None:
            self.changes.emit(CHANGED, path)

    def set_mtime(self, path: str, mtime_ns: int) -> None:
        canonical = path.rstrip("/") or "/"
        self._stamps.pop(canonical, None)
        self._call(self.fs.set_mtime, path, mtime_ns)  # (as given: "file/" is ENOTDIR)
        if self.fs.open_files:  # an open file written before must not stamp over it
            self.times_set += 1
            self._time_set_at[canonical] = self.times_set
        if self.changes is not None:
            self.changes.emit(CHANGED, path)

    # -- files -------------------------------------------------------------------------------

    def open(self, path: str, mode, name: str, pending) -> "LocalFile":
        owner = self.owner
        fs = self.fs
        owner.fs_depth += 1
        try:
            try:
                file = fs.open(path, mode.backend)
            except NotADirectoryError:
                # creating through a trailing slash in a directory: Linux answers EISDIR
                # (littlefs ENOTDIR); under a file, ENOTDIR is right
                if (path.endswith("/") and (mode.stamps or mode.maybe_creates)
                        and fs.stat(_parent(path)).is_dir):
                    raise fs_error(errno.EISDIR, path) from None
                raise
        finally:
            owner.fs_depth -= 1
        created = file.created
        if created:
            self.stamp(_parent(path))
        if created or mode.stamps:
            # made or truncated now: stamped now, not at close, so a time set while the
            # file is open (touch -d, cp -a of an empty file) is the one it keeps
            self.stamp(path)
        if self.changes is not None:
            if created:
                self.changes.emit(ADDED_FILE, path)  # (littlefs committed the name)
            elif mode.stamps:
                self.changes.emit(CHANGED, path)  # truncated
        return LocalFile(file, self, name, mode, owner, pending, False)

    # -- the filesystem as a whole ---------------------------------------------------------

    def statvfs(self, path: str) -> tuple[int, int, int, int]:
        info = self._call(self.fs.statvfs)
        return (info.block_size, info.block_count, info.blocks_free, info.name_max)

    @property
    def open_files(self) -> int:
        return self.fs.open_files if self.fs.mounted else 0

    @property
    def removed_open_files(self) -> int:
        return self.fs.removed_open_files if self.fs.mounted else 0

    def open_paths(self) -> list[str]:
        """The paths (on this filesystem) of its open files, each once."""
        return self.fs.open_paths() if self.fs.mounted else []

    def _call(self, func, *args):
        owner = self.owner
        owner.fs_depth += 1
        try:
            return func(*args)
        finally:
            owner.fs_depth -= 1


def _parent(path: str) -> str:
    """The directory holding ``path`` (canonical; a trailing slash is allowed)."""
    return path.rstrip("/").rpartition("/")[0] or "/"


class LocalFile(VfsFile):
    """An open littlefs file of the owner tile.

    Each method is one bracketed call into the blockdev ``File``: this is the hot path of
    every tile program that reads or writes, so it stays that thin.
    """

    __slots__ = ("_file", "_backend", "_written", "_written_at")

    def __init__(self, file, backend: LittlefsBackend, name: str, mode, owner, pending,
                 dirty: bool):
        # VfsFile.__init__ written out: one call fewer on every open
        self.name = name
        self.mode = mode.raw_text
        self._closed = False
        self._readable = mode.readable
        self._writable = mode.writable
        self._owner = owner
        self._pending = pending
        self._file = file
        self._backend = backend
        #: written or truncated since the mtime was last stamped: the backend's count of
        #: times set then (truthy), else 0
        self._written = backend.times_set if dirty else 0
        #: when it was last written or truncated: its mtime, as the host's (time_ns)
        self._written_at = time_ns() if dirty else 0

    def read(self, size: int | None = -1) -> bytes:
        if type(size) is not int or size < -1:
            size = self._read_size(size)
        owner = self._owner
        if owner.signal is not None:
            raise_pending_signal(owner)
        owner.fs_depth += 1
        try:
            return self._file.read(size)
        except OSError as exc:
            exc.filename = self.name
            raise
        except ValueError:
            if self._closed:  # named as the program opened it, not as its filesystem does
                raise self.closed_error() from None
            raise
        finally:
            owner.fs_depth -= 1

    def write(self, data) -> int:
        owner = self._owner
        if owner.signal is not None:
            raise_pending_signal(owner)
        owner.fs_depth += 1
        try:
            written = self._file.write(data)
        except OSError as exc:
            exc.filename = self.name
            raise
        except ValueError:
            if self._closed:  # (see read)
                raise self.closed_error() from None
            raise
        finally:
            owner.fs_depth -= 1
        if written:  # (an empty write leaves the mtime, as on Linux)
            self._written = self._backend.times_set
            self._written_at = time_ns()
        return written

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._owned(self._file.seek, offset, whence)

    def tell(self) -> int:
        return self._owned(self._file.tell)

    def size(self) -> int:
        """Current size, including writes not yet committed."""
        return self._owned(self._file.size)

    def truncate(self, size: int | None = None) -> int:
        if size is not None:
            size = checked_size(size, self.name)
        result = self._owned(self._file.truncate, size)
        self._written = self._backend.times_set
        self._written_at = time_ns()
        return result

    def _owned(self, call, *args):
        """``call(*args)`` inside the owner's filesystem bracket (read and write spell the
        same out inline: they are the hot path), errors naming this file."""
        owner = self._owner
        owner.fs_depth += 1
        try:
            return call(*args)
        except OSError as exc:
            exc.filename = self.name
            raise
        except ValueError:
            if self._closed:  # (see read)
                raise self.closed_error() from None
            raise
        finally:
            owner.fs_depth -= 1

    def flush(self) -> None:
        """Commit this file's data to littlefs (its mtime is stamped)."""
        self._check_open()
        owner = self._owner
        owner.fs_depth += 1
        try:
            self._file.sync()
        except OSError as exc:
            exc.filename = self.name
            raise
        finally:
            owner.fs_depth -= 1
        if self._written and not self._file.detached:  # (its path names another file now)
            self._backend.stamp_written(self._file.path, self._written, self._written_at)
            self._written = 0
            if self._backend.changes is not None:
                self._backend.changes.emit(CHANGED, self._file.path)

    def fsync(self) -> None:
        """:meth:`flush`, and write the file's mtime to littlefs too (``os.fsync``)."""
        self.flush()
        try:
            self._backend.sync(self._file.path)
        except OSError as exc:
            exc.filename = self.name
            raise

    def close(self) -> None:
        """Commit and close (see :meth:`VfsFile.close`); stamps the mtime if written."""
        if self._closed:
            return
        self._closed = True
        owner = self._owner
        owner.fs_depth += 1
        try:
            self._file.close()
        except OSError as exc:
            exc.filename = self.name
            raise
        finally:
            owner.fs_depth -= 1
        if self._written and self._backend.fs.mounted and not self._file.detached:  # (see flush)
            self._backend.stamp_written(self._file.path, self._written, self._written_at)
            if self._backend.changes is not None:
                self._backend.changes.emit(CHANGED, self._file.path)
