"""One tile's view of its files: mounts, a current directory, and a POSIX-like API.

:class:`Vfs` is what tile programs (through their ``open`` and ``os``), the kernel's
``fs.*`` services and the shell call. It resolves paths (see ``_paths``) against the
mount table (see ``_mounts``), enforces what belongs to the mount table rather than to a
filesystem (EROFS on read-only mounts, EXDEV between mounts, EBUSY on mount points), and
passes everything else to the backend. Errors are ``OSError`` with the errno the backend
chose and the file name *as the caller wrote it*, like the host's ``os``.

A Vfs belongs to one owner (a tile) and is only ever called on that owner's greenlet; it
does no locking. Resolved paths are cached (programs reopen the same few names), and the
cache is dropped whenever the mount table changes.
"""

from __future__ import annotations

import errno
import math
import operator
import os
import posixpath
import time
from typing import NamedTuple

from ipuos._plural import plural
from ipuos.blockdev import MTIME_MAX_NS, MTIME_MIN_NS

from ._backend import Backend, error_name, fs_error
from ._cwds import busy_reason
from ._entries import DirEntry, Entry, ScandirIterator, make_stat, make_statvfs
from ._files import (_MODES, check_binary_arguments, checked_size, close_dropped, flags_mode, no_file_descriptors,
                     parse_mode, raise_pending_signal, wrap_text)
from ._local import LittlefsBackend
from ._mounts import Mount, MountTable
from ._paths import checked, is_within, normalize, parent_and_name

__all__ = ["Vfs", "MountInfo", "HostOwner", "VFS_KEY", "existing_vfs"]

#: where a tile keeps its Vfs in ``tile.kernel_data``
VFS_KEY = "vfs"
_CACHE_LIMIT = 2048


class HostOwner:
    """The owner of a Vfs used outside any tile (single-threaded host code, tests)."""

    __slots__ = ("fs_depth", "glet")

    #: (a tile's pending interrupt or abort; the host has none)
    signal = None

    def __init__(self):
        self.fs_depth = 0
        self.glet = None

    def __repr__(self) -> str:
        return "<host>"


class MountInfo(NamedTuple):
    path: str
    kind: str  # "littlefs", "tiles", "empty"
    source: str  # what is mounted (a device, the tiles proxied)
    readonly: bool
    open_files: int


class Vfs:
    """The mount table, current directory and file API of one tile (see module doc)."""

    def __init__(self, owner=None):
        #: the tile this VFS belongs to (``fs_depth``/``glet``), or a :class:`HostOwner`
        self.owner = owner if owner is not None else HostOwner()
        self._mounts = MountTable()
        self._cwd = "/"
        #: once the current directory is removed: a mount of its own standing for it, as
        #: the kernel keeps a removed directory for whoever is in it (see _in_removed_cwd)
        self._removed_cwd: Mount | None = None
        #: rmdirs and renames so far: each may have taken a directory someone is in away
        #: (a repl's current directory is looked at again only if this moved meanwhile)
        self.removals = 0
        self._resolved: dict = {}
        #: files dropped without being closed; closed before the next operation
        self.pending: list = []
        #: the machine's ``_changes.ChangeFeed`` if others may keep what they learn of
        #: this tile's files (see :meth:`watch`), else None
        self.changes = None

    def __repr__(self) -> str:
        return f"<Vfs of {self.owner!r}: {len(self._mounts)} mounts>"

    # -- the mount table ---------------------------------------------------------------------

    def mount(self, path, target, *, readonly: bool = False, owns: bool = False,
              covering: bool = False) -> None:
        """Mount ``target`` at ``path``: a backend, or a mounted blockdev ``Filesystem``.

        ``owns``: the mount owns the backend (unmounting also unmounts littlefs).
        EBUSY if something is mounted there already; ENOTDIR if ``path`` is a file, unless
        ``covering``: a mount carried over from before the filesystem under it changed
        (a restore) covers whatever is there now, as a POSIX mount covers its directory.
        """
        vpath = self._canonical(path)
        backend = target if isinstance(target, Backend) else LittlefsBackend(target, self.owner)
        if len(self._mounts) and not covering:
            mount, inner = self._mounts.resolve(vpath)
            if mount.path != vpath:
                try:
                    is_dir = mount.backend.entry(inner).is_dir
                except (FileNotFoundError, NotADirectoryError):
                    is_dir = True  # a mount point needs no directory underneath
                if not is_dir:
                    raise fs_error(errno.ENOTDIR, path, "cannot mount on a file")
        self._mounts.add(vpath, backend, readonly=readonly, owns=owns)
        self._resolved.clear()
        feed = self.changes
        if feed is not None:
            if getattr(backend, "changes", False) is None:  # a littlefs backend: it reports
                backend.changes = feed.source(self.owner.id, vpath)
            feed.reset(self.owner.id, vpath)  # what paths there mean has changed

    def watch(self, feed) -> None:
        """Report changes to ``feed`` (a ``_changes.ChangeFeed``) from now on: every
        littlefs filesystem mounted here, now or later, reports its own, and mounting or
        unmounting anything says that everything under that mount point may have changed."""
        self.changes = feed
        for mount in self._mounts:
            if getattr(mount.backend, "changes", False) is None:
                mount.backend.changes = feed.source(self.owner.id, mount.path)

    def umount(self, path) -> None:
        """Remove the mount at ``path``: EINVAL if none, EBUSY if in use (a file open on
        it, a current directory in it: see ``_cwds``) or the root."""
        vpath = self._canonical(path)
        mount = self._mounts.get(vpath)
        if mount is None:
            raise fs_error(errno.EINVAL, path, "not a mount point")
        if vpath == "/":
            raise fs_error(errno.EBUSY, path, "the root filesystem cannot be unmounted")
        if any(other.path != vpath and other.path.startswith(vpath + "/") for other in self._mounts):
            raise fs_error(errno.EBUSY, path, "other filesystems are mounted below it")
        reason = busy_reason(self.owner, vpath)
        if reason is not None:
            raise fs_error(errno.EBUSY, path, f"target is busy ({reason})")
        backend = mount.backend
        if backend.open_files:  # (one removed while open too, as on a host)
            removed = backend.removed_open_files
            raise fs_error(errno.EBUSY, path, f"{plural(backend.open_files, 'file is', 'files are')} open on it"
                           + (f" ({removed} removed while open)" if removed else ""))
        self._mounts.remove(vpath)
        self._resolved.clear()
        if mount.owns:
            mount.backend.detach()
        if self.changes is not None:
            self.changes.reset(self.owner.id, vpath)

    def mounts(self) -> list[Mount]:
        """Every mount itself, sorted by path (for storage: what a restore carries over)."""
        return list(self._mounts)

    def mount_points(self) -> list[MountInfo]:
        """Every mount, sorted by path."""
        return [MountInfo(m.path, m.backend.kind, m.backend.describe(), m.readonly,
                          m.backend.open_files) for m in self._mounts]

    def place(self, path) -> tuple[str, str]:
        """Where ``path`` is: (the mount point of its filesystem, the path inside it),
        the same for every name of one file. A tile's own disk has a second name,
        ``/tiles/<its id>`` (tile 0's ``/tiles/0/a`` is its ``/a``), which a same-file
        check must see through: a copy onto itself would empty the file. Lexical, as
        :meth:`abspath`: the file need not exist."""
        mount, inner = self._mounts.resolve(self.abspath(path))
        on_tile = mount.backend.tile_path(inner)
        if on_tile is None:
            return mount.path, inner
        tile, inner = on_tile
        if tile == getattr(self.owner, "id", None) and self._mounts.resolve(inner)[0].path == "/":
            return "/", inner  # (what the tile mounted is not shown there: see _submounts)
        return f"{mount.path}/{tile}", inner

    def backend(self, path) -> Backend:
        """The backend mounted exactly at ``path`` (for storage tools: snapshot, restore)."""
        mount = self._mounts.get(self._canonical(path))
        if mount is None:
            raise fs_error(errno.EINVAL, path, "not a mount point")
        return mount.backend

    # -- the current directory ------------------------------------------------------------------

    @property
    def cwd(self) -> str:
        """The current directory's path (where it was, if it has been removed)."""
        return self._cwd

    @property
    def cwd_removed(self) -> bool:
        return self._removed_cwd is not None

    def getcwd(self) -> str:
        if self._removed_cwd is not None:
            raise fs_error(errno.ENOENT)  # (as the host's: no name, there is none)
        return self._cwd

    def chdir(self, path) -> None:
        vpath, mount, inner = self._resolve(path)
        try:
            entry = mount.backend.entry(inner)
        except OSError as exc:
            exc.filename = error_name(path)
            raise
        if not entry.is_dir:
            raise fs_error(errno.ENOTDIR, path)
        self._cwd = vpath
        if mount is not self._removed_cwd:  # ("." stays in the removed directory)
            self._removed_cwd = None

    def reset_cwd(self, path: str = "/", removed: bool = False) -> None:
        """Make the canonical ``path`` current without looking at any filesystem: each
        program starts at ``/``, a repl's next block where its last one left (``removed``:
        that directory had been removed, and still is to the repl)."""
        self._cwd = path
        self._removed_cwd = None
        if removed and len(self._mounts):
            self._cwd_was_removed(self._mounts.resolve(path)[0])

    def recheck_cwd(self) -> None:
        """Take the current directory as removed if it is not there now: a repl's, when
        directories were removed while it waited (its next block is still in the one
        it left, as on the host). A directory made again under that name meanwhile, or
        moved there, is taken for it: a tile keeps no identity of directories to tell."""
        if self._removed_cwd is not None or self._cwd == "/":
            return
        try:
            mount, inner = self._mounts.resolve(self._cwd)
        except OSError:
            return  # (nothing is mounted there now to look at)
        try:
            there = mount.backend.entry(inner).is_dir
        except (FileNotFoundError, NotADirectoryError):
            there = False
        except OSError:
            return  # (cannot tell now: a failing device says so at the next operation)
        if not there:
            self._cwd_was_removed(mount)

    def abspath(self, path) -> str:
        """The canonical absolute form of ``path`` (lexical: no filesystem access); an
        empty path is the current directory, as for ``os.path.abspath``."""
        path = path if type(path) is str else os.fspath(path)
        if self._removed_cwd is not None and path[:1] != "/":
            self.getcwd()  # (ENOENT, as the host's abspath says there)
        return normalize(checked(path), self._cwd)[0] if path else self._cwd

    def _cwd_was_removed(self, mount: Mount) -> None:
        """The current directory, on ``mount``, is gone: what relative paths name changes."""
        removed = Mount(self._cwd, _RemovedDirectory(mount.backend), mount.readonly, owns=False)
        removed.device = mount.device  # (still on that filesystem, as far as stat tells)
        self._removed_cwd = removed
        self._resolved.clear()  # (relative paths resolved from it when it was there)

    # -- files --------------------------------------------------------------------------------

    def open(self, file, mode: str = "r", buffering: int = -1, encoding: str | None = None,
             errors: str | None = None, newline: str | None = None, closefd: bool = True,
             opener=None):
        """Open a file with the host's ``open`` semantics (modes r/w/a/x, "+", "b"/"t")."""
        # the hot path of every program that touches a file: written out, not delegated
        spec = _MODES.get(mode) or parse_mode(mode)
        if type(buffering) is not int:
            buffering = operator.index(buffering)  # (TypeError for a str, a float, None)
        if encoding is not None or errors is not None or newline is not None:
            if spec.binary:
                check_binary_arguments(encoding, errors, newline)
        if not closefd or opener is not None:
            raise ValueError("closefd and opener are not supported on tiles (there are no fds)")
        if self.pending:
            self.close_pending()
        resolved = self._resolved.get(file) if type(file) is str else None
        if resolved is None:
            resolved = self._resolve(file)
            if type(file) is not str:
                file = os.fspath(file)
        mount = resolved[1]
        if spec.writes and mount.readonly:
            _refuse_open(mount, resolved[2], file, spec)
        try:
            raw = mount.backend.open(resolved[2], spec, file, self.pending)
        except OSError as exc:
            exc.filename = file
            _refine_open_error(exc, mount, resolved[2], file, spec)
            raise
        if spec.maybe_creates:
            raw.seek(0, os.SEEK_END)  # like the host's open: "a" starts at the end
        if spec.binary:
            if buffering == 0:
                raw.unbuffered()
            return raw
        return wrap_text(raw, spec, buffering, encoding, errors, newline)

    def open_raw(self, file, flags):
        """A binary file from POSIX ``os.O_*`` flags (or a mode string): what the host
        client and FUSE use, since O_CREAT without O_TRUNC has no ``open`` mode."""
        spec = flags_mode(flags) if isinstance(flags, int) else parse_mode(flags)
        if self.pending:
            self.close_pending()
        vpath, mount, inner = self._resolve(file)
        name = file if type(file) is str else os.fspath(file)
        if spec.writes and mount.readonly:
            _refuse_open(mount, inner, name, spec)
        try:
            return mount.backend.open(inner, spec, name, self.pending)
        except OSError as exc:
            exc.filename = error_name(name)
            _refine_open_error(exc, mount, inner, name, spec)
            raise

    def close_pending(self) -> None:
        """Close the files that were dropped without being closed (see ``close_dropped``)."""
        close_dropped(self.pending)

    # -- names ---------------------------------------------------------------------------------

    def entry(self, path) -> Entry:
        """(name, is_dir, size, mtime_ns) of ``path``: ``stat`` in exchange-ready form."""
        vpath, mount, inner = self._resolve(path)
        entry = self._on_backend(path, mount, inner, mount.backend.entry, inner)
        if inner == "/":  # a mount point: named as its parent directory sees it
            entry = entry._replace(name=parent_and_name(vpath)[1])
        return entry

    # (``dir_fd`` and the like: the host's ``os`` takes them, and the tile's is bound
    # to these methods; only their defaults mean anything on a tile)

    def stat(self, path, *, dir_fd=None, follow_symlinks: bool = True) -> os.stat_result:
        if dir_fd is not None:
            raise no_file_descriptors("stat")
        vpath, mount, inner = self._resolve(path)
        entry = self._on_backend(path, mount, inner, mount.backend.entry, inner)
        return make_stat(entry.is_dir, entry.size, entry.mtime_ns, device=mount.device)

    lstat = stat

    def entries(self, path=".") -> list[Entry]:
        """Every entry of a directory with type, size and mtime (one backend call), mount
        points included: what ``ls -l`` needs in one round trip."""
        vpath, mount, inner = self._resolve(path)
        entries = self._on_backend(path, mount, inner, mount.backend.entries, inner)
        extra = self._mounts.children(vpath)
        if extra:
            # a mount point shows the root of what is mounted there, as ``stat`` does
            base = vpath.rstrip("/") + "/"
            roots = {name: self._mounted_root(name, base + name) for name in extra}
            entries = [roots.pop(entry.name, entry) for entry in entries]
            entries.extend(roots.values())
        return entries

    def _mounted_root(self, name: str, top: str) -> Entry:
        """The entry for the mount point ``top``: its filesystem's root, named ``name``
        (a directory with no time if that root cannot be read now: the listing of the
        directory holding it must not fail for that)."""
        mount = self._mounts.get(top)
        try:
            root = mount.backend.entry("/")
        except OSError:
            return Entry(name, True, 0, 0)
        return Entry(name, True, root.size, root.mtime_ns)

    def listdir(self, path=".") -> list[str]:
        return [entry.name for entry in self.entries("." if path is None else path)]

    def scandir(self, path=".") -> ScandirIterator:
        path = "." if path is None else path  # (as the host's: None is the current directory)
        given = path if type(path) is str else os.fspath(path)
        vpath, mount, _ = self._resolve(path)
        return ScandirIterator([DirEntry(given, entry, mount.device) for entry in self.entries(path)])

    def walk(self, top=".", topdown: bool = True, onerror=None, followlinks: bool = False):
        """``os.walk``: (dirpath, dirnames, filenames) for every directory under ``top``."""
        top = top if type(top) is str else os.fspath(top)
        try:
            entries = self.entries(top)
        except OSError as exc:
            if onerror is not None:
                onerror(exc)
            return
        dirs = [e.name for e in entries if e.is_dir]
        files = [e.name for e in entries if not e.is_dir]
        if topdown:
            yield top, dirs, files
        for name in dirs:  # (joined as the host's: "d///" gives "d///e")
            yield from self.walk(posixpath.join(top, name), topdown, onerror, followlinks)
        if not topdown:
            yield top, dirs, files

    def mkdir(self, path, mode: int = 0o777, *, dir_fd=None) -> None:
        if dir_fd is not None:
            raise no_file_descriptors("mkdir")
        vpath, mount, inner = self._resolve(path)
        if _last_name(path) in (".", ".."):
            # names a directory that is there, if its parent is one: never one to make
            self.stat(path)  # (ENOENT for "missing/.", ENOTDIR for "file/.")
            raise fs_error(errno.EEXIST, path)
        if vpath == mount.path:
            raise fs_error(errno.EEXIST, path)
        # "mkdir d/" makes d, as on POSIX
        self._on_backend(path, mount, inner, mount.backend.mkdir, inner.rstrip("/"),
                         write=True, exists_errno=errno.EEXIST)

    def makedirs(self, name, mode: int = 0o777, exist_ok: bool = False) -> None:
        """``os.makedirs``: every missing directory on the way, then ``name`` itself."""
        path = checked(name)
        # each directory on the way is named as the caller wrote it ("d/f.txt/a"), as in
        # the host's errors; the VFS resolves the spelling
        parts = [part for part in path.split("/") if part]
        current = "/" if path[0] == "/" else ""
        made = False
        for index, part in enumerate(parts):
            current += part if not current or current.endswith("/") else "/" + part
            last = index == len(parts) - 1
            if part == "." and (made or not last):
                continue  # as os.makedirs: "new/." is done once new is made
            try:
                self.mkdir(current)
                made = True
            except FileExistsError as exc:
                if last and (not exist_ok or not self.isdir(current)):
                    exc.filename = error_name(name)
                    raise
        if not parts and not exist_ok:
            raise fs_error(errno.EEXIST, name)

    def rmdir(self, path, *, dir_fd=None) -> None:
        if dir_fd is not None:
            raise no_file_descriptors("rmdir")
        vpath, mount, inner = self._resolve(path)  # first: "missing/.." is ENOENT
        last = _last_name(path)
        if last == ".":
            self.stat(path)  # (ENOENT for "missing/.", ENOTDIR for "file/.")
            raise fs_error(errno.EINVAL, path, "cannot remove '.': name the directory itself")
        if last == "..":
            raise fs_error(errno.ENOTEMPTY, path)
        if self._mounts.mounted_below(vpath) or vpath == "/":
            raise fs_error(errno.EBUSY, path, "a filesystem is mounted here")
        self._on_backend(path, mount, inner, mount.backend.rmdir, inner, write=True)
        self.removals += 1
        if vpath == self._cwd and self._removed_cwd is None:
            self._cwd_was_removed(mount)

    def remove(self, path, *, dir_fd=None) -> None:
        if dir_fd is not None:
            raise no_file_descriptors("remove")
        vpath, mount, inner = self._resolve(path)
        if vpath == mount.path:
            raise fs_error(errno.EISDIR, path)
        self._on_backend(path, mount, inner, mount.backend.remove, inner, write=True)

    unlink = remove

    def rename(self, src, dst, *, src_dir_fd=None, dst_dir_fd=None) -> None:
        """Move ``src`` to ``dst``, replacing a file or an empty directory (POSIX rename).

        EXDEV between mounts (and between tiles under ``/tiles``); EBUSY for mount points.
        """
        if src_dir_fd is not None or dst_dir_fd is not None:
            raise no_file_descriptors("rename", "src_dir_fd" if src_dir_fd is not None else "dst_dir_fd")
        try:
            src_path, src_mount, src_inner = self._resolve(src)
            try:
                dst_path, dst_mount, dst_inner = self._resolve(dst)
            except OSError:
                self._check_rename_parent(src)  # (said first, as the kernel walks it first)
                raise
            refusal = None
            if _last_name(src) in (".", "..") or _last_name(dst) in (".", ".."):
                refusal = fs_error(errno.EBUSY, src, "cannot rename '.' or '..': name the directory itself", dst)
            elif (self._mounts.mounted_below(src_path) or src_path == "/"
                    or self._mounts.get(dst_path) is not None):
                refusal = fs_error(errno.EBUSY, src, "a filesystem is mounted here", dst)
            elif src_mount is not dst_mount:
                refusal = fs_error(errno.EXDEV, src, "cannot move between filesystems", dst)
            if refusal is not None:
                self._check_rename_parent(src)
                self._check_rename_parent(dst)
                raise refusal
            if src_mount.readonly:
                self._refuse_write(src_mount, src_inner, src)
            src_mount.backend.rename(src_inner, dst_inner)
        except OSError as exc:
            exc.filename, exc.filename2 = error_name(src), error_name(dst)
            raise
        self.removals += 1
        if self._removed_cwd is not None or src_path == dst_path:
            return
        if dst_path == self._cwd:
            self._cwd_was_removed(dst_mount)  # replaced by the directory moved onto it
        elif is_within(self._cwd, src_path):
            # moved with its directory: the kernel's current directory is the directory,
            # not its name, and getcwd follows it there
            self._cwd = dst_path + self._cwd[len(src_path):]

    replace = rename

    def _check_rename_parent(self, path) -> None:
        """ENOENT or ENOTDIR if the directory ``path`` (one side of a rename) is in is
        missing or a file. Linux looks up the source's parent, then the target's, before
        anything else about a rename (a last name ``.`` or ``..``, mounts, filesystems),
        and the VFS refuses some renames itself: so those look first. With a last ``.``
        or ``..`` it is the directory the path names that must be there."""
        given = error_name(path)
        if _last_name(given) in (".", ".."):
            self.entry(given)
            return
        parent = given.rstrip("/").rpartition("/")[0]
        if parent:  # ("": the root, or the current directory, which the kernel holds)
            if not self.entry(parent).is_dir:
                raise fs_error(errno.ENOTDIR, path)

    def truncate(self, path, length: int) -> None:
        length = checked_size(length, path)
        vpath, mount, inner = self._resolve(path)
        self._on_backend(path, mount, inner, mount.backend.truncate, inner, length, write=True)

    def utime(self, path, times=None, *, ns=None, dir_fd=None, follow_symlinks: bool = True) -> None:
        """Set the modification time (the only time a tile keeps): ``times`` as
        (atime, mtime) seconds, ``ns`` as nanoseconds, neither for now."""
        if dir_fd is not None:
            raise no_file_descriptors("utime")
        mtime_ns = _utime_ns(times, ns)
        vpath, mount, inner = self._resolve(path)
        self._on_backend(path, mount, inner, mount.backend.set_mtime, inner, mtime_ns, write=True)

    def statvfs(self, path="/") -> os.statvfs_result:
        vpath, mount, inner = self._resolve(path)
        try:
            mount.backend.entry(inner)
            block_size, block_count, blocks_free, name_max = mount.backend.statvfs(inner)
        except OSError as exc:
            exc.filename = error_name(path)
            raise
        return make_statvfs(block_size, block_count, blocks_free, name_max, readonly=mount.readonly)

    def sync(self) -> None:
        """Close dropped files and write what is kept in memory (pending mtimes) to every
        filesystem."""
        if self.pending:
            self.close_pending()
        for mount in self._mounts:
            sync = getattr(mount.backend, "sync", None)
            if sync is not None:
                sync()

    # -- os.path-style questions ------------------------------------------------------------------

    def exists(self, path) -> bool:
        try:
            self.entry(path)
        except (OSError, ValueError):
            return False
        return True

    def isdir(self, path) -> bool:
        try:
            return self.entry(path).is_dir
        except (OSError, ValueError):
            return False

    def isfile(self, path) -> bool:
        try:
            return not self.entry(path).is_dir
        except (OSError, ValueError):
            return False

    def ismount(self, path) -> bool:
        try:
            return self._mounts.get(self._canonical(path)) is not None
        except (OSError, ValueError):
            return False

    def getsize(self, path) -> int:
        return self.entry(path).size

    def getmtime(self, path) -> float:
        return self.entry(path).mtime_ns / 1e9

    # -- resolution -----------------------------------------------------------------------------

    def _canonical(self, path) -> str:
        return normalize(checked(path), self._cwd)[0]

    def _resolve(self, path):
        """(canonical path, mount, path inside the mount) for ``path``; cached.

        Every operation on a path starts here, so this is also where files dropped without
        being closed get closed: whatever looks at a file next sees what was written, and
        where a program's pending interrupt is raised (see :func:`raise_pending_signal`)."""
        if self.owner.signal is not None:
            raise_pending_signal(self.owner)
        if self.pending:
            self.close_pending()
        if type(path) is str:
            key = path if path[:1] == "/" else (self._cwd, path)
            hit = self._resolved.get(key)
            if hit is not None:
                return hit
        else:
            path = checked(path)
            key = path if path[:1] == "/" else (self._cwd, path)
        if self._removed_cwd is not None and path[:1] != "/":
            return self._in_removed_cwd(checked(path))
        vpath, trailing = normalize(checked(path), self._cwd)
        mount, inner = self._mounts.resolve(vpath)
        if trailing and inner != "/":
            inner += "/"  # littlefs then insists on a directory
        result = (vpath, mount, inner)
        if ".." in path and ".." in path.split("/"):
            self._climb_checked(path)
            return result  # not cached: what it climbs out of may change
        if len(self._resolved) >= _CACHE_LIMIT:
            self._resolved.clear()
        self._resolved[key] = result
        return result

    def _in_removed_cwd(self, path: str):
        """:meth:`_resolve` of a relative ``path`` once the current directory is removed,
        walked as the kernel walks it from the directory it still holds: ``.`` stays in
        that empty directory, ``..`` climbs to its parent, and any other name is not there
        (ENOENT), even if a directory of that name was made again since."""
        names = path.split("/")
        for index, name in enumerate(names):
            if name == "..":
                rest = "/".join(names[index + 1:])
                try:
                    return self._resolve(parent_and_name(self._cwd)[0].rstrip("/") + "/" + rest)
                except OSError as exc:
                    exc.filename = path
                    raise
            if name and name != ".":
                raise fs_error(errno.ENOENT, path)
        return self._cwd, self._removed_cwd, "/"

    def _climb_checked(self, path: str) -> None:
        """A ``..`` climbs out of a directory, as the kernel walks it: ``file/..`` is
        ENOTDIR and ``missing/..`` ENOENT, although lexically both name the parent. The
        current directory and its parents are not checked: the kernel holds the cwd, so
        ``..`` climbs out of it even after it was removed."""
        current = [] if path[0] == "/" else [name for name in self._cwd.split("/") if name]
        held = len(current)  # how many of current's directories are the cwd's own
        for name in path.split("/"):
            if name != "..":
                if name and name != ".":
                    current.append(name)
                continue
            if len(current) > held:
                where = "/" + "/".join(current)
                vpath, mount, inner = self._resolve(where)
                entry = self._on_backend(path, mount, inner, mount.backend.entry, inner)
                if not entry.is_dir:
                    raise fs_error(errno.ENOTDIR, path)
            if current:
                current.pop()
                held = min(held, len(current))

    def _on_backend(self, path, mount, inner: str, call, *args, write: bool = False,
                    exists_errno: int | None = None):
        """``call(*args)`` on ``mount``'s backend, errors naming ``path`` as the caller
        wrote it; a change (``write``) on a read-only mount is refused first."""
        if write and mount.readonly:
            self._refuse_write(mount, inner, path, exists_errno)
        try:
            return call(*args)
        except OSError as exc:
            exc.filename = error_name(path)
            raise

    def _refuse_write(self, mount, inner: str, path, exists_errno: int | None = None) -> None:
        """EROFS for a change on a read-only mount (ENOENT/EEXIST first where they apply)."""
        try:
            mount.backend.entry(inner)
        except FileNotFoundError:
            if exists_errno is None:
                raise fs_error(errno.ENOENT, path) from None
        else:
            if exists_errno is not None:
                raise fs_error(exists_errno, path)
        raise fs_error(errno.EROFS, path)


class _RemovedDirectory(Backend):
    """The removed current directory, for whoever is still in it: empty, with nothing to
    be made in it (the names in it were refused already: see ``Vfs._in_removed_cwd``),
    on the filesystem that held it."""

    kind = "removed"

    def __init__(self, held_by: Backend):
        self._held_by = held_by

    def describe(self) -> str:
        return f"a removed directory of {self._held_by.describe()}"

    def truncate(self, path: str, size: int) -> None:
        raise fs_error(errno.EISDIR, path)

    def set_mtime(self, path: str, mtime_ns: int) -> None:
        pass  # (the host sets it: the directory is there until it is left)

    def statvfs(self, path: str) -> tuple[int, int, int, int]:
        return self._held_by.statvfs("/")


def existing_vfs(tile) -> "Vfs | None":
    """``tile``'s VFS if its storage is up, else None; never brings it up (a tile nothing
    has used yet has an empty disk, and asking should not format it)."""
    return tile.kernel_data.get(VFS_KEY)


def _last_name(path) -> str:
    """The last name of a path as given (``"d/."`` -> ``"."``), for the calls that treat
    ``.`` and ``..`` specially."""
    return (path if type(path) is str else os.fspath(path)).rstrip("/").rpartition("/")[2]


def _refuse_open(mount, inner: str, name: str, mode) -> None:
    """Refuse to open for writing on a read-only mount, with the error Linux gives before
    the filesystem's being read-only (EROFS) comes into it: EISDIR for creating through a
    trailing slash or writing a directory, EEXIST for creating exclusively what is there,
    ENOENT for opening what is not there without creating it."""
    creates = mode.stamps or mode.maybe_creates
    if inner.endswith("/") and creates:
        try:  # (what the backends say of it: EISDIR in a directory, else its parent's error)
            parent_is_dir = mount.backend.entry(inner.rstrip("/").rpartition("/")[0] or "/").is_dir
        except OSError as exc:
            exc.filename = error_name(name)
            raise
        if not parent_is_dir:
            raise fs_error(errno.ENOTDIR, name)
        error = fs_error(errno.EISDIR, name)
    else:
        try:
            is_dir = mount.backend.entry(inner).is_dir
        except FileNotFoundError:
            if creates:  # where it would go is there: making it is what is refused
                parent = inner.rstrip("/").rpartition("/")[0] or "/"
                try:
                    mount.backend.entry(parent)
                except FileNotFoundError:
                    pass
                else:
                    raise fs_error(errno.EROFS, name) from None
            raise fs_error(errno.ENOENT, name) from None
        except OSError as exc:
            exc.filename = error_name(name)
            raise
        if mode.exclusive:
            error = fs_error(errno.EEXIST, name)
        elif is_dir:
            error = fs_error(errno.EISDIR, name)
        else:
            raise fs_error(errno.EROFS, name)
    _refine_open_error(error, mount, inner, name, mode)
    raise error


def _refine_open_error(exc: OSError, mount, inner: str, name: str, mode) -> None:
    """Raise the error Linux gives where the backend's differs: it sees ``d/`` and
    ``d/.`` alike, but the final ``.`` looks inside ``d`` and the slash does not.

    Opening ``d/.`` to write is EISDIR only if ``d`` is a directory: ENOENT if ``d`` is
    missing, ENOTDIR if it is a file. Creating ``d/`` exclusively is EISDIR, not EEXIST
    (``d/./`` is EEXIST: its last name is ``.``, there already). Creating exclusively
    what names a directory without that slash (``d``, ``d/.``, ``/``, a mount point) is
    EEXIST, whatever a backend says of opening its root.
    """
    last = _last_name(name)
    if exc.errno == errno.EEXIST:
        if name.endswith("/") and last not in ("", ".", ".."):  # ("": the root, all slashes)
            raise fs_error(errno.EISDIR, name) from None
        return
    if exc.errno != errno.EISDIR:
        return
    if last == "." and inner != "/":
        try:
            is_dir = mount.backend.entry(inner.rstrip("/")).is_dir
        except FileNotFoundError:
            raise fs_error(errno.ENOENT, name) from None
        if not is_dir:
            raise fs_error(errno.ENOTDIR, name) from None
    if mode.exclusive and (last in ("", ".", "..") or not name.endswith("/")):
        raise fs_error(errno.EEXIST, name) from None


def _utime_ns(times, ns) -> int:
    """The modification time ``os.utime`` was given, in nanoseconds, as a tile keeps it.

    Types are checked as the host checks them: before any arithmetic (``'x' * 10**9``
    is a gigabyte). A time the host's time_t cannot hold is OverflowError, as there; one
    it can hold, but not 64 bits of nanoseconds, becomes the nearest a tile keeps, as
    Linux clamps a time to what the filesystem keeps."""
    mtime_ns = _given_ns(times, ns)
    if not _TIME_T_MIN_NS <= mtime_ns <= _TIME_T_MAX_NS:
        raise OverflowError("timestamp out of range for platform time_t")
    return min(max(mtime_ns, MTIME_MIN_NS), MTIME_MAX_NS)


#: the times (in ns) a host's 64-bit time_t holds
_TIME_T_MIN_NS, _TIME_T_MAX_NS = -(1 << 63) * 1_000_000_000, (1 << 63) * 1_000_000_000 - 1


def _given_ns(times, ns) -> int:
    if times is not None and ns is not None:
        raise ValueError("utime: you may specify either 'times' or 'ns' but not both")
    if ns is not None:
        if type(ns) is not tuple or len(ns) != 2:
            raise TypeError("utime: 'ns' must be a tuple of two ints")
        return operator.index(ns[1])
    if times is None:
        return time.time_ns()
    if type(times) is not tuple or len(times) != 2:
        raise TypeError("utime: 'times' must be either a tuple of two ints or None")
    seconds = times[1]
    if not isinstance(seconds, float):
        return operator.index(seconds) * 1_000_000_000
    if math.isnan(seconds):
        raise ValueError("Invalid value NaN (not a number)")
    if math.isinf(seconds):
        raise OverflowError("timestamp out of range")
    # whole seconds and the fraction apart, rounded down, as the host does: a product
    # of the float with 10**9 has lost the last nanoseconds already
    whole = math.floor(seconds)
    return whole * 1_000_000_000 + math.floor((seconds - whole) * 1e9)
