"""Bare-FUSE baseline: an in-memory mfusepy filesystem and a FUSE throughput bench.

This is the "bare-FUSE ceiling" beside the real chip mount (``bench/fuse.py``):
whatever ipuos' own mount reaches, it cannot beat a filesystem whose callbacks do
nothing but touch a Python dict.

Reusable pieces::

    from bench.bare_fuse import BareFS, mounted, measure

    with mounted(BareFS(), "/tmp/mnt", direct_io=True) as mnt:
        figures = measure(mnt, size=64 << 20, block=1 << 20, files=2000)

``mounted`` runs the libfuse loop in a background thread (``foreground`` is forced,
libfuse must never fork the caller), waits until the mount answers, and always
unmounts on exit, lazily (``fusermount3 -uz``) if a file on it is still busy.

Run as a script::

    .venv/bin/python bench/bare_fuse.py            # 64 MiB, all option sets
    .venv/bin/python bench/bare_fuse.py --quick    # tiny sizes, for CI

Facts this module relies on (mfusepy 3.1.1, libfuse 3.14, Linux 6.x; see the
bare-FUSE report for evidence):

* ``FUSE_LIBRARY_NAME=fuse3`` must be set before ``import mfusepy``; without it
  mfusepy picks libfuse2 if installed and only falls back to fuse3.
* ``FUSE(...)`` works in a non-main thread with ``foreground=True``. libfuse then
  installs C handlers for SIGTERM/SIGHUP (if they are SIG_DFL) that end the loop
  instead of the process: install Python handlers first to keep control.
* Stop the loop from any thread with ``fusermount3 -u`` (or umount(2) as root): FUSE()
  returns normally at once. ``fuse_exit`` works only from inside a callback.
* ``read`` must return ``bytes``: a bytearray gives EINVAL, a str silently garbage.
* Non-OSError exceptions in callbacks become EINVAL (logged on logger "fuse");
  a ``BaseException`` (e.g. ``SystemExit``) answers EFAULT and ends the loop.
* A callback left undefined is NULL in libfuse: ENOSYS ("Function not implemented"),
  except link, which the kernel turns into EPERM.
* libfuse3 uses atomic O_TRUNC (``open`` sees O_TRUNC, no ``truncate`` call) and
  mfusepy drops the file handle of ``truncate`` (``ftruncate`` arrives as a path).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import mmap
import os
import re
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
try:
    import mfusepy
    from mfusepy import FUSE, FuseOSError, Operations
except (OSError, AttributeError) as exc:  # no libfuse installed, or a wrong one
    mfusepy = None
    FUSE = None
    Operations = object

    class FuseOSError(OSError):  # type: ignore[no-redef]
        def __init__(self, code: int) -> None:
            super().__init__(code, os.strerror(code))

    IMPORT_ERROR: Exception | None = exc
else:
    IMPORT_ERROR = None

__all__ = [
    "BareFS",
    "FuseUnavailable",
    "mounted",
    "is_mounted",
    "is_dead_mount",
    "force_unmount",
    "abort_connection",
    "tune_malloc",
    "measure",
    "Figures",
    "OPTION_SETS",
    "OptionSet",
    "RECOMMENDED",
    "run_set",
    "main",
]

# UTIME_NOW / UTIME_OMIT arrive verbatim in tv_nsec through mfusepy's utimens.
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2


class FuseUnavailable(RuntimeError):
    """libfuse3 / mfusepy / /dev/fuse is missing: FUSE benches cannot run."""


def _require_fuse() -> None:
    if IMPORT_ERROR is not None:
        raise FuseUnavailable(f"mfusepy/libfuse3 unavailable: {IMPORT_ERROR}")
    if not os.path.exists("/dev/fuse"):
        raise FuseUnavailable("/dev/fuse is missing")


# --------------------------------------------------------------------------------------
# The in-memory filesystem
# --------------------------------------------------------------------------------------


class _Node:
    __slots__ = ("mode", "data", "children", "nlink", "uid", "gid", "atime", "mtime", "ctime")

    def __init__(self, mode: int, uid: int, gid: int) -> None:
        now = time.time_ns()
        self.mode = mode
        self.data: bytearray | None = None if stat.S_ISDIR(mode) else bytearray()
        self.children: dict[str, _Node] | None = {} if stat.S_ISDIR(mode) else None
        self.nlink = 2 if stat.S_ISDIR(mode) else 1
        self.uid, self.gid = uid, gid
        self.atime = self.mtime = self.ctime = now


class BareFS(Operations):
    """A minimal in-memory filesystem: enough for cp, dd, ls, mkdir, rm, mv, touch.

    One lock guards the tree (callbacks run on many libfuse threads). Open files are
    tracked by handle, so reads and writes do not walk the path and an unlinked open
    file keeps its data. link/symlink/mknod/chown answer EPERM; xattrs ENOTSUP.
    """

    use_ns = True  # times are integer nanoseconds (mfusepy warns otherwise)

    def __init__(self, capacity: int = 1 << 34, conn: dict | None = None) -> None:
        """*conn*: fuse_conn_info fields to set at init (``max_read``, ``max_write``,
        ``max_readahead``, ``max_background``; ``want`` is OR-ed into the wanted
        capability bits). libfuse3's fuse_main rejects these as ``-o`` options."""
        self.conn_options = dict(conn or {})
        self.conn_info: dict = {}
        self._lock = threading.Lock()
        self._root = _Node(stat.S_IFDIR | 0o755, os.getuid(), os.getgid())
        self._handles: dict[int, _Node] = {}
        self._next_fh = 1
        self.capacity = capacity
        self.max_write_seen = 0
        self.max_read_seen = 0
        self.used = 0  # bytes in files still linked (statfs is O(1): a pure round trip)

    # -- helpers ------------------------------------------------------------------------
    def _lookup(self, path: str) -> _Node:
        node = self._root
        for part in path.split("/"):
            if not part:
                continue
            if node.children is None:
                raise FuseOSError(errno.ENOTDIR)
            node = node.children.get(part)  # type: ignore[assignment]
            if node is None:
                raise FuseOSError(errno.ENOENT)
        return node

    def _parent(self, path: str) -> tuple[_Node, str]:
        head, _, name = path.rstrip("/").rpartition("/")
        if not name:
            raise FuseOSError(errno.EEXIST)  # the root
        if len(name.encode()) > 255:
            raise FuseOSError(errno.ENAMETOOLONG)
        parent = self._lookup(head)
        if parent.children is None:
            raise FuseOSError(errno.ENOTDIR)
        return parent, name

    def _new_fh(self, node: _Node) -> int:
        fh = self._next_fh
        self._next_fh += 1
        self._handles[fh] = node
        return fh

    def _node(self, path: str | None, fh: int | None) -> _Node:
        if fh:
            node = self._handles.get(fh)
            if node is not None:
                return node
        if path is None:
            raise FuseOSError(errno.EBADF)
        return self._lookup(path)

    def init_with_config(self, conn, config) -> None:
        if conn is None:
            return
        for key, value in self.conn_options.items():
            if key == "want":
                conn.want |= value
            else:
                setattr(conn, key, value)
        self.conn_info = {key: getattr(conn, key) for key in (
            "proto_major", "proto_minor", "max_write", "max_read", "max_readahead",
            "capable", "want", "max_background", "congestion_threshold")}

    # -- metadata -----------------------------------------------------------------------
    def getattr(self, path: str, fh: int | None = None) -> dict:
        with self._lock:
            node = self._node(path, fh)
            size = len(node.data) if node.data is not None else 4096
            return {
                "st_mode": node.mode,
                "st_nlink": node.nlink,
                "st_size": size,
                "st_blocks": (size + 511) // 512,
                "st_blksize": 4096,
                "st_uid": node.uid,
                "st_gid": node.gid,
                "st_atime": node.atime,
                "st_mtime": node.mtime,
                "st_ctime": node.ctime,
            }

    def readdir(self, path: str, fh: int) -> list:
        with self._lock:
            node = self._lookup(path)
            if node.children is None:
                raise FuseOSError(errno.ENOTDIR)
            # (name, mode, 0): only the file-type bits of the mode reach the kernel.
            return [(".", stat.S_IFDIR, 0), ("..", stat.S_IFDIR, 0)] + [
                (name, child.mode, 0) for name, child in node.children.items()
            ]

    def statfs(self, path: str) -> dict:
        bsize = 4096
        used = self.used
        blocks = self.capacity // bsize
        free = max(0, blocks - (used + bsize - 1) // bsize)
        return {
            "f_bsize": bsize,
            "f_frsize": bsize,
            "f_blocks": blocks,
            "f_bfree": free,
            "f_bavail": free,
            "f_files": 1 << 20,
            "f_ffree": 1 << 20,
            "f_favail": 1 << 20,
            "f_namemax": 255,
        }

    def chmod(self, path: str, mode: int) -> int:
        with self._lock:
            node = self._lookup(path)
            node.mode = (node.mode & ~0o7777) | (mode & 0o7777)
            node.ctime = time.time_ns()
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        with self._lock:
            node = self._lookup(path)
            if uid not in (-1, node.uid) or gid not in (-1, node.gid):
                raise FuseOSError(errno.EPERM)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        now = time.time_ns()
        with self._lock:
            node = self._lookup(path)
            if times is None:
                node.atime = node.mtime = now
            else:
                # libfuse3 passes {tv_sec=0, tv_nsec=UTIME_NOW/UTIME_OMIT} through
                # verbatim; with use_ns mfusepy makes that the int 2**30-1 / 2**30-2.
                for attr, value in zip(("atime", "mtime"), times):
                    if value == UTIME_OMIT:
                        continue
                    setattr(node, attr, now if value == UTIME_NOW else int(value))
            node.ctime = now
        return 0

    # -- namespace ----------------------------------------------------------------------
    def mkdir(self, path: str, mode: int) -> int:
        with self._lock:
            parent, name = self._parent(path)
            if name in parent.children:  # type: ignore[operator]
                raise FuseOSError(errno.EEXIST)
            parent.children[name] = _Node(stat.S_IFDIR | (mode & 0o7777), os.getuid(), os.getgid())  # type: ignore[index]
            parent.nlink += 1
            parent.mtime = parent.ctime = time.time_ns()
        return 0

    def rmdir(self, path: str) -> int:
        with self._lock:
            parent, name = self._parent(path)
            node = parent.children.get(name)  # type: ignore[union-attr]
            if node is None:
                raise FuseOSError(errno.ENOENT)
            if node.children is None:
                raise FuseOSError(errno.ENOTDIR)
            if node.children:
                raise FuseOSError(errno.ENOTEMPTY)
            del parent.children[name]  # type: ignore[union-attr]
            parent.nlink -= 1
            parent.mtime = parent.ctime = time.time_ns()
        return 0

    def unlink(self, path: str) -> int:
        with self._lock:
            parent, name = self._parent(path)
            node = parent.children.get(name)  # type: ignore[union-attr]
            if node is None:
                raise FuseOSError(errno.ENOENT)
            if node.children is not None:
                raise FuseOSError(errno.EISDIR)
            del parent.children[name]  # type: ignore[union-attr]
            self.used -= len(node.data)  # type: ignore[arg-type]
            parent.mtime = parent.ctime = time.time_ns()
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._lock:
            oparent, oname = self._parent(old)
            nparent, nname = self._parent(new)
            node = oparent.children.get(oname)  # type: ignore[union-attr]
            if node is None:
                raise FuseOSError(errno.ENOENT)
            if node.children is not None and (new + "/").startswith(old.rstrip("/") + "/"):
                raise FuseOSError(errno.EINVAL)  # a directory into itself
            target = nparent.children.get(nname)  # type: ignore[union-attr]
            if target is not None:
                if target.children is not None:
                    if node.children is None:
                        raise FuseOSError(errno.EISDIR)
                    if target.children:
                        raise FuseOSError(errno.ENOTEMPTY)
                    nparent.nlink -= 1
                elif node.children is not None:
                    raise FuseOSError(errno.ENOTDIR)
                else:
                    self.used -= len(target.data)  # type: ignore[arg-type]
            del oparent.children[oname]  # type: ignore[union-attr]
            nparent.children[nname] = node  # type: ignore[index]
            if node.children is not None and oparent is not nparent:
                oparent.nlink -= 1
                nparent.nlink += 1
            now = time.time_ns()
            oparent.mtime = oparent.ctime = nparent.mtime = nparent.ctime = node.ctime = now
        return 0

    def link(self, target: str, source: str) -> int:
        raise FuseOSError(errno.EPERM)

    def symlink(self, target: str, source: str) -> int:
        raise FuseOSError(errno.EPERM)

    def mknod(self, path: str, mode: int, dev: int) -> int:
        raise FuseOSError(errno.EPERM)

    # -- files --------------------------------------------------------------------------
    def create(self, path: str, mode: int, flags: int = 0) -> int:
        with self._lock:
            parent, name = self._parent(path)
            node = parent.children.get(name)  # type: ignore[union-attr]
            if node is None:
                node = _Node(stat.S_IFREG | (mode & 0o7777), os.getuid(), os.getgid())
                parent.children[name] = node  # type: ignore[index]
                parent.mtime = parent.ctime = node.ctime
            elif flags & os.O_EXCL:
                raise FuseOSError(errno.EEXIST)
            elif node.children is not None:
                raise FuseOSError(errno.EISDIR)
            return self._new_fh(node)

    def open(self, path: str, flags: int) -> int:
        with self._lock:
            node = self._lookup(path)
            if node.children is not None and flags & os.O_ACCMODE != os.O_RDONLY:
                raise FuseOSError(errno.EISDIR)
            if flags & os.O_TRUNC and node.data is not None:
                # libfuse3 wants FUSE_CAP_ATOMIC_O_TRUNC: O_TRUNC arrives here, no truncate().
                self.used -= len(node.data)
                del node.data[:]
            return self._new_fh(node)

    def release(self, path: str, fh: int) -> int:
        with self._lock:
            self._handles.pop(fh, None)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        with self._lock:
            data = self._node(path, fh).data
            if data is None:
                raise FuseOSError(errno.EISDIR)
            if size > self.max_read_seen:
                self.max_read_seen = size
            # One copy, straight into the bytes mfusepy needs (a bytearray is refused).
            with memoryview(data) as view:
                return bytes(view[offset:offset + size])

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self._lock:
            node = self._node(path, fh)
            buf = node.data
            if buf is None:
                raise FuseOSError(errno.EISDIR)
            n = len(data)
            if n > self.max_write_seen:
                self.max_write_seen = n
            before = len(buf)
            if offset == before:
                buf += data
            else:
                if offset > before:
                    buf.extend(bytes(offset - before))
                buf[offset:offset + n] = data
            self.used += len(buf) - before
            node.mtime = node.ctime = time.time_ns()
            return n

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        # mfusepy's fuse3 truncate wrapper drops the file handle: only path arrives.
        with self._lock:
            node = self._node(path, fh)
            if node.data is None:
                raise FuseOSError(errno.EISDIR)
            self.used += length - len(node.data)
            if length < len(node.data):
                del node.data[length:]
            else:
                node.data.extend(bytes(length - len(node.data)))
            node.mtime = node.ctime = time.time_ns()
        return 0


# --------------------------------------------------------------------------------------
# Mount management
# --------------------------------------------------------------------------------------


def _unescape_mountinfo(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \\ooo octal.
    if "\\" not in field:
        return field
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mount_entry(mountpoint: str) -> tuple[str, str, str] | None:
    """(major:minor, fstype, source) of the top mount at *mountpoint*, from
    /proc/self/mountinfo. Does no I/O on the mount itself, so it never blocks."""
    target = os.path.realpath(mountpoint)
    found = None
    try:
        with open("/proc/self/mountinfo") as fp:
            for line in fp:
                left, _, right = line.partition(" - ")
                parts = left.split()
                if len(parts) >= 5 and _unescape_mountinfo(parts[4]) == target:
                    rparts = right.split()
                    found = (parts[2], rparts[0], rparts[1] if len(rparts) > 1 else "")
    except OSError:
        return None
    return found  # the last entry is the one on top


def is_mounted(mountpoint: str) -> bool:
    """True if a FUSE filesystem is mounted at *mountpoint*, live or dead. Never blocks.

    Note ``os.path.ismount`` is False (and ``os.path.exists`` False) on a dead mount:
    its stat fails with ENOTCONN. Use this instead.
    """
    entry = _mount_entry(mountpoint)
    return entry is not None and entry[1].startswith("fuse")


def is_dead_mount(mountpoint: str) -> bool:
    """True if *mountpoint* is a FUSE mount whose server is gone (ENOTCONN/ECONNABORTED).

    Uses ``statvfs``: the kernel never caches it, while ``stat`` of the root can be
    answered from the attribute cache for ``attr_timeout`` (1 s) after the server
    died. A dead mount answers at once; a live but *hung* server would block the
    call, so use this only where blocking is acceptable (or from a helper thread).
    """
    if not is_mounted(mountpoint):
        return False
    try:
        os.statvfs(mountpoint)
    except OSError as exc:
        return exc.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


FUSECTL = "/sys/fs/fuse/connections"


def abort_connection(device: str) -> bool:
    """Abort the FUSE connection *device* ("0:42" from mountinfo) through fusectl.

    Every pending and future request on it fails (ENOTCONN/ECONNABORTED) and the
    serving loop's read of /dev/fuse ends, even if the mount was lazily detached
    and files on it are still open. Needs fusectl mounted at /sys/fs/fuse/connections
    (``mount -t fusectl fusectl /sys/fs/fuse/connections``) and root.
    """
    minor = device.rpartition(":")[2]
    try:
        with open(os.path.join(FUSECTL, minor, "abort"), "w") as fp:
            fp.write("1")
    except OSError:
        return False
    return True


def _run_quiet(cmd: list[str]) -> int:
    try:
        return subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              check=False).returncode
    except OSError:  # the tool is missing
        return -1


def force_unmount(mountpoint: str) -> bool:
    """Unmount *mountpoint*, live or dead: ``fusermount3 -u``, then lazy ``-uz``,
    then (root, no fusermount3) ``umount -l``. Works on a dead ("Transport endpoint
    is not connected") mount too. Returns True if no FUSE mount is left there.

    A lazy unmount only detaches the name: a process with a file or cwd on the mount
    keeps the connection, and its server, alive until it lets go.
    """
    for cmd in (["fusermount3", "-u", "-q", mountpoint],
                ["fusermount3", "-uz", "-q", mountpoint],
                ["umount", "-l", mountpoint]):
        if not is_mounted(mountpoint):
            return True
        _run_quiet(cmd)
    return not is_mounted(mountpoint)


@contextlib.contextmanager
def mounted(operations, mountpoint: str, *, timeout: float = 10.0, nothreads: bool = False,
            **options) -> Iterator[str]:
    """Mount *operations* at *mountpoint* in a background thread; yield the mountpoint.

    *options* go to ``mfusepy.FUSE`` as ``-o`` options (``direct_io=True``,
    ``max_threads=N``, ``fsname="x"``, ``attr_timeout=0``, ``auto_unmount=True`` ...).
    ``foreground`` is forced (libfuse would otherwise fork). Connection limits
    (``max_write``/``max_read``/``max_readahead``) are *not* ``-o`` options on libfuse3:
    pass them to ``BareFS(conn=...)``.

    On exit: unmount (``fusermount3 -u``, lazily if busy), join the loop thread; if
    the loop is still alive after a lazy unmount (a file on the mount is still open),
    abort the connection through fusectl. Raises RuntimeError if the loop died with an
    exception (e.g. a BaseException in a callback) or could not be stopped.
    """
    _require_fuse()
    mountpoint = os.path.realpath(mountpoint)
    if is_mounted(mountpoint):
        raise RuntimeError(f"{mountpoint} is already a FUSE mount point")
    if not nothreads and mfusepy.fuse_version_major == 3 and mfusepy.fuse_version_minor >= 12:
        # libfuse 3.12-3.14 prints "Ignoring invalid max threads value 4294967295"
        # unless max_idle_threads is given; idle threads up to max_threads are kept.
        # (Same speed as the default; max_idle_threads=1 costs ~40% of creates/s
        # through thread churn.) Pass max_idle_threads=None for libfuse's default.
        options.setdefault("max_idle_threads", options.get("max_threads", 10))
    if options.get("max_idle_threads", 0) is None:
        del options["max_idle_threads"]
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            FUSE(operations, mountpoint, foreground=True, nothreads=nothreads, **options)
        except BaseException as exc:  # reported to the caller on exit
            errors.append(exc)

    thread = threading.Thread(target=serve, name=f"fuse:{mountpoint}", daemon=True)
    thread.start()
    device = None
    body_failed = False
    try:
        deadline = time.monotonic() + timeout
        while True:
            entry = _mount_entry(mountpoint)
            if entry is not None and entry[1].startswith("fuse"):
                device = entry[0]
                break
            if not thread.is_alive():
                raise RuntimeError(f"FUSE mount at {mountpoint} failed: {errors or 'loop exited'}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"FUSE mount at {mountpoint} did not appear in {timeout}s")
            time.sleep(0.002)
        os.statvfs(mountpoint)  # a real round trip: FUSE_INIT and one request served
        yield mountpoint
    except BaseException:
        body_failed = True
        raise
    finally:
        force_unmount(mountpoint)
        # After a clean unmount the loop returns at once; after a lazy one it lives
        # as long as something holds a file on the mount: give it a moment, then abort.
        thread.join(0.5)
        if thread.is_alive() and device is not None and abort_connection(device):
            thread.join(timeout)
        if not body_failed:
            if thread.is_alive():
                raise RuntimeError(f"FUSE loop for {mountpoint} did not exit after unmount "
                                   "(a file on it is open and fusectl is unavailable)")
            if errors:
                raise RuntimeError(f"FUSE loop for {mountpoint} died: {errors[0]!r}") from errors[0]


def tune_malloc(threshold: int = 4 << 20) -> bool:
    """Pin glibc's mmap/trim thresholds (process-wide) so ~1 MiB buffers are reused.

    By default glibc serves a fresh 1 MiB buffer with mmap and gives it back on free,
    so each use page-faults it in again. It bit when a read callback made two 1 MiB
    copies (``bytes(bytearray[a:b])``): 1 MiB direct_io reads fell to ~0.9 GB/s from
    ~2.5. With one copy (``bytes(memoryview[a:b])``, as BareFS does) the gain is
    within noise; keep it for callbacks that allocate big temporaries per request.
    Same as ``MALLOC_MMAP_THRESHOLD_=4194304 MALLOC_TRIM_THRESHOLD_=16777216``.
    Returns False where mallopt is unavailable (non-glibc).
    """
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    ok = mallopt(M_MMAP_THRESHOLD, threshold) == 1
    return mallopt(M_TRIM_THRESHOLD, 4 * threshold) == 1 and ok


# --------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------


@dataclass
class Figures:
    """Throughput through a mounted directory. MB is 10**6 bytes."""

    write_MBps: float = 0.0
    read_MBps: float = 0.0
    creates_per_s: float = 0.0
    statfs_per_s: float = 0.0
    size: int = 0
    block: int = 0
    files: int = 0
    extra: dict = field(default_factory=dict)

    def line(self) -> str:
        return (f"write {self.write_MBps:8.0f} MB/s  read {self.read_MBps:8.0f} MB/s  "
                f"create {self.creates_per_s:6.0f}/s  statfs {self.statfs_per_s:6.0f}/s")


def _best(fn, repeat: int) -> float:
    return min(fn() for _ in range(max(1, repeat)))


def measure(directory: str, *, size: int = 64 << 20, block: int = 1 << 20, files: int = 2000,
            statfs: int = 5000, repeat: int = 3) -> Figures:
    """Measure write/read MB/s, creates/s and request round trips/s through *directory*.

    Write: ``size`` bytes as ``block``-sized ``os.write`` calls into a fresh file, then
    close (the close is timed: it flushes). Read: the same file back with ``os.readv``
    into one preallocated buffer (no Python allocation per block). Creates: ``files``
    times ``open(O_CREAT|O_EXCL|O_WRONLY)`` + ``close`` of an empty file. Statfs: ``os.statvfs``
    of the directory in a loop: the kernel never caches it, so each call is one full
    FUSE round trip (kernel -> libfuse thread -> Python callback -> back); this bounds
    requests/s of any mount. Best of ``repeat`` runs each. Files are removed afterwards.
    """
    work = os.path.join(directory, f".bare_fuse_bench.{os.getpid()}")
    os.mkdir(work)
    try:
        # Page-aligned buffers: an unaligned 1 MiB buffer spans 257 pages and the
        # kernel splits each request in two (1022 KiB + 2 KiB) under direct_io.
        payload = mmap.mmap(-1, block)
        payload[:] = os.urandom(block)
        path = os.path.join(work, "seq.bin")
        nblocks = max(1, size // block)
        total = nblocks * block

        def do_write() -> float:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            t0 = time.perf_counter()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                for _ in range(nblocks):
                    if os.write(fd, payload) != block:
                        raise OSError(errno.EIO, "short write")
            finally:
                os.close(fd)
            return time.perf_counter() - t0

        buf = mmap.mmap(-1, block)

        def do_read() -> float:
            t0 = time.perf_counter()
            fd = os.open(path, os.O_RDONLY)
            got = 0
            try:
                while True:
                    n = os.readv(fd, [buf])
                    if not n:
                        break
                    got += n
            finally:
                os.close(fd)
            dt = time.perf_counter() - t0
            if got != total:
                raise OSError(errno.EIO, f"read back {got} bytes, wrote {total}")
            return dt

        t_write = _best(do_write, repeat)
        t_read = _best(do_read, repeat)
        if buf[:] != payload[:]:  # the last block read must be the last block written
            raise OSError(errno.EIO, "read-back mismatch")
        os.unlink(path)

        def do_create(round_: list[int] = [0]) -> float:
            round_[0] += 1
            sub = os.path.join(work, f"c{round_[0]}")
            os.mkdir(sub)
            names = [os.path.join(sub, f"f{i:06d}") for i in range(files)]
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
            t0 = time.perf_counter()
            for name in names:
                os.close(os.open(name, flags, 0o644))
            dt = time.perf_counter() - t0
            for name in names:
                os.unlink(name)
            os.rmdir(sub)
            return dt

        t_create = _best(do_create, repeat) if files else 0.0

        def do_statfs() -> float:
            statvfs = os.statvfs
            t0 = time.perf_counter()
            for _ in range(statfs):
                statvfs(work)
            return time.perf_counter() - t0

        t_statfs = _best(do_statfs, repeat) if statfs else 0.0
        return Figures(
            write_MBps=total / t_write / 1e6,
            read_MBps=total / t_read / 1e6,
            creates_per_s=files / t_create if files else 0.0,
            statfs_per_s=statfs / t_statfs if statfs else 0.0,
            size=total, block=block, files=files,
        )
    finally:
        _rmtree(work)


def _rmtree(path: str) -> None:
    import shutil
    shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class OptionSet:
    """One mount configuration: ``FUSE(...)`` options, fuse_conn_info fields set in
    init (``BareFS(conn=...)``), and whether glibc malloc is pinned (``tune_malloc``)."""

    fuse: dict
    conn: dict = field(default_factory=dict)
    malloc: bool = False


# Tried by main(), in this order (malloc tuning is process-wide and cannot be undone,
# so the tuned sets come last). libfuse3 facts behind them: direct_io is a fuse_config
# field (mfusepy sets it in init); max_write/max_readahead/big_writes/writeback_cache
# are rejected as -o options by libfuse3's fuse_main ("unknown option", mount fails);
# -o max_read=N fails unless init also sets conn.max_read; the default max_write is
# 1 MiB, and max_write also caps direct_io reads (the kernel's max_pages follows it).
OPTION_SETS: dict[str, OptionSet] = {
    "page-cache": OptionSet({}),
    "direct_io": OptionSet({"direct_io": True}),
    "direct_io+max_write256K": OptionSet({"direct_io": True}, {"max_write": 256 << 10}),
    "direct_io+malloc": OptionSet({"direct_io": True}, malloc=True),
    "direct_io+max_write256K+malloc": OptionSet({"direct_io": True}, {"max_write": 256 << 10},
                                                  malloc=True),
}
RECOMMENDED = "direct_io"


def run_set(name: str, mountpoint: str, **measure_args) -> tuple[Figures, BareFS]:
    """Mount a fresh BareFS with OPTION_SETS[name] at *mountpoint* and measure it."""
    opt = OPTION_SETS[name]
    if opt.malloc:
        tune_malloc()
    fs = BareFS(conn=opt.conn)
    with mounted(fs, mountpoint, fsname="bare_fuse", **opt.fuse):
        fig = measure(mountpoint, **measure_args)
    fig.extra.update(max_write_seen=fs.max_write_seen, max_read_seen=fs.max_read_seen)
    return fig, fs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI smoke run)")
    parser.add_argument("--size", type=int, default=64 << 20, help="bytes per sequential file")
    parser.add_argument("--block", type=int, default=1 << 20, help="bytes per write/read call")
    parser.add_argument("--files", type=int, default=3000, help="files for the create test")
    parser.add_argument("--statfs", type=int, default=20000, help="os.statvfs round trips")
    parser.add_argument("--repeat", type=int, default=3, help="best of N for each figure")
    parser.add_argument("--sets", default=",".join(OPTION_SETS),
                        help=f"comma-separated option sets, from: {', '.join(OPTION_SETS)}")
    parser.add_argument("--cpus", help="pin the process to these CPUs, e.g. 0 or 0,1 (on this VM "
                        "a cross-CPU thread wake-up costs ~60 us: one CPU gives ~2.5x the "
                        "requests/s)")
    parser.add_argument("--mountpoint", help="an empty directory to mount on (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.quick:
        args.size, args.block, args.files, args.statfs, args.repeat = 1 << 20, 128 << 10, 50, 200, 1
    try:
        _require_fuse()
    except FuseUnavailable as exc:
        print(f"bare_fuse: skipped: {exc}")
        return 0
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    names = [n for n in args.sets.split(",") if n]
    unknown = [n for n in names if n not in OPTION_SETS]
    if unknown:
        parser.error(f"unknown option sets: {unknown}")
    names.sort(key=lambda n: OPTION_SETS[n].malloc)  # tuned sets last, see OPTION_SETS
    print(f"bare FUSE, libfuse {mfusepy.fuse_version_major}.{mfusepy.fuse_version_minor}: "
          f"{args.size / 2**20:g} MiB in {args.block >> 10} KiB os.write/os.readv calls, "
          f"{args.files} creates, {args.statfs} statfs, best of {args.repeat}, "
          f"CPUs {sorted(os.sched_getaffinity(0))} (MB = 10^6 B)")
    with tempfile.TemporaryDirectory(prefix="bare_fuse.") as tmp:
        mnt = args.mountpoint or os.path.join(tmp, "mnt")
        os.makedirs(mnt, exist_ok=True)
        for name in names:
            fig, _ = run_set(name, mnt, size=args.size, block=args.block, files=args.files,
                             statfs=args.statfs, repeat=args.repeat)
            print(f"  {name:31s} {fig.line()}  requests <= {fig.extra['max_write_seen'] >> 10}"
                  f"/{fig.extra['max_read_seen'] >> 10} KiB w/r")
    return 0


if __name__ == "__main__":
    sys.exit(main())
