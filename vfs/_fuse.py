"""The live chip's files as a host filesystem: FUSE operations over the file services.

:class:`ChipFilesystem` is an operations object for mfusepy (libfuse3). Its tree::

    /                  the machine
    /tiles/<id>/...    tile <id>'s own SRAM disk (the tiles chosen when mounting)
    /chip/...          the chip disk (tile 0's ``/chip``)

Callbacks run on libfuse's threads and never touch a tile: each one becomes ``fs.*``
kernel requests to the owner tile through a :class:`~ipuos.vfs.HostFsClient`, and waits
on its Future. Requests from concurrent callbacks (many host processes, several threads
of one) are queued together and served in the same superstep. No callback ever waits for
another FUSE request, so libfuse's thread pool cannot deadlock on itself.

Why each choice:

* **Kernel caching: names only, kept right by the tiles.** Tiles change their files
  behind the kernel's back. Attributes and absent names are never cached
  (``attr_timeout`` and ``negative_timeout`` 0: every stat reaches a tile), and
  ``direct_io`` keeps data out of the page cache (every read and write reaches a tile,
  and reads are not cut at a stale cached size; big requests pay for it: the kernel
  passes a 1 MiB ``write`` through as one request, where the page cache would split it
  into 128 KiB ones; ``mmap`` of files is not supported). Looked-up *names* are kept
  (``entry_timeout``, see ``ENTRY_TIMEOUT``) because every tile reports its changes
  (``_changes``): a removal or rename made on a tile makes the kernel forget that name,
  and the names below it, soon after (:class:`_KernelNames`; the directories above it,
  someone's cwd perhaps, are left alone). Until then, and for a name in use (a
  descriptor, a cwd, a lookup under way), the kernel asks by path, so it is answered
  with what the tile has there now: a file a tile replaced by another is the new file,
  as on a local disk. Only a name a tile has given another type
  answers ESTALE, so that the kernel looks it up again (``_as_told``). The mount keeps
  directories' complete listings the same way (:class:`_Known`). Without change notices
  (or the session descriptor) it keeps nothing.
* **Close-to-open consistency.** Data written through an open file is committed on the
  tile (and seen by new openers, the shell and tile programs) when the writer closes,
  flushes or fsyncs it, as with NFS. That is littlefs' own rule: an open handle works on
  the file as it was when it was opened, and commits its whole view, so of two descriptors
  writing one file the last to close wins. A handle with no writes of its own that reads
  to its end looks again, so a reader follows what others append (``tail -f``, ``a+``
  reading back its own appends). ``stat`` and ``fstat`` see the size the
  writer's handle sees at once. ``O_APPEND`` writes are the exception: each is appended
  at the tile's end of the file and committed at once (see ``_append``), so ``>>`` from
  several processes, or beside a tile program, loses nothing.
* **Unlink of an open file** goes to the tile at once: littlefs keeps the open handle
  working. libfuse would rather rename the file to ``.fuse_hiddenXXXXXXXXXXXXXXXX`` and
  remove it at the last close, which would show tiles a stray file (and leave it forever if
  the daemon died); with its ``hard_remove`` option instead, ``fstat`` of such a file
  fails with ESTALE (``tempfile.TemporaryFile`` does that). So the mount lets libfuse ask
  for the rename, and answers it by unlinking on the tile and keeping the hidden name to
  itself: the file is gone for everyone else, its descriptors still work. A user may
  rename a file to such a name too: libfuse's own rename is told apart by coming in the
  same kernel request as its check that the name is free (see :class:`_Requests`).
* **A tile directory shows that tile's own disk only**: tile 0's mount points (``/chip``,
  ``/tiles``) are hidden under ``/tiles/0`` (else ``/tiles/0/tiles/0/...`` recurses).
  Looking them up is ENOENT; creating such a name, or renaming onto it, is EBUSY
  (something is mounted there), one rule with the shell's ``/tiles``
  (``Submounts.hidden_errno``). Removing one, or renaming it away, is ENOENT here: the
  kernel looks the name up first (the shell's ``rmdir`` does not, and says EBUSY).

Errors are the owner tile's ``OSError`` errno, unchanged (ENOENT, EEXIST, ENOTDIR, EISDIR,
ENOTEMPTY, ENOSPC, ENAMETOOLONG, EROFS ...). Every callback maps errors itself (see
:func:`_errno_of`), because mfusepy turns anything but an ``OSError`` into EINVAL: a
failed tile is EIO, a machine that does not answer in time ETIMEDOUT, one that has stopped
EIO. What the mount adds itself: EXDEV to rename between two tiles or between a tile and
``/chip``; EPERM for hard links, symlinks, device nodes, chmod of setuid, setgid or sticky
(permission bits may be set, and are not kept: the mode stays 0644/0755) and chown to
anyone but the mounting user (a tile keeps no owners or permission bits,
and EPERM is what link(2), symlink(2) and mknod(2) document for a filesystem that cannot
make such a thing); EINVAL for ``rename`` flags other than RENAME_NOREPLACE (rename(2)'s
errno for an unsupported flag); EROFS on a read-only mount (the kernel answers most of
those before asking). Extended attributes are left out on purpose: the kernel then
answers EOPNOTSUPP (ENOTSUP) itself and stops asking, which saves a round trip per file
in ``ls -l`` and ``cp -a``.

mfusepy is imported on first use (:func:`load_mfusepy`): ipuos runs without libfuse, and
only mounting needs it.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import errno
import functools
import itertools
import logging
import os
import re
import stat as _stat
import struct
import threading
import time

from ipuos._tilespec import tile_of_name
from ipuos.blockdev import MTIME_MAX_NS, MTIME_MIN_NS

from ._changes import ADDED_DIR, ADDED_FILE, CHANGED, MOVED, REMOVED, RESET
from ._client import await_reply
from ._retries import Retries
from ._submounts import Submounts
from ._syscalls import creating_open

__all__ = ["ChipFilesystem", "FuseUnavailable", "load_mfusepy", "serve_fuse", "FUSE_SUBTYPE"]

log = logging.getLogger("ipuos.fuse")

#: the mount's type in the host's mount table is ``fuse.<this>``
FUSE_SUBTYPE = "ipuos"
#: what ``st_blksize`` says: big enough that cp/cat/Python buffer in big requests
#: (each request costs a round trip to a tile), small enough to waste no memory
IO_BLOCK = 128 * 1024
#: libfuse threads serving callbacks at once (each waits on a tile for most of its time)
MAX_THREADS = 16
#: names whose type the mount remembers telling the kernel (see _as_told)
_TOLD_MAX = 1 << 16
#: names of files libfuse hid remembered at most (hidden names are never reused)
_HIDDEN_FROM_MAX = 1 << 12
#: seconds the kernel may keep a name it has looked up, when the mount can make it forget
#: names at once (see "Kernel caching" in the module doc); attributes are never kept
ENTRY_TIMEOUT = 30.0

# utimensat's special tv_nsec values: mfusepy passes them through as they are
_UTIME_NOW = (1 << 30) - 1
_UTIME_OMIT = (1 << 30) - 2
_RENAME_NOREPLACE = 1
#: the names libfuse renames open files to when they are unlinked (see _hide)
_HIDDEN_NAME = re.compile(r"\.fuse_hidden[0-9a-f]{16}\Z")
#: bytes in a name littlefs takes (tiles' filesystems use its default)
_NAME_MAX = 255

#: open flags that mean something to a tile (the kernel adds O_LARGEFILE and such)
_OPEN_FLAGS = os.O_ACCMODE | os.O_APPEND | os.O_TRUNC | os.O_CREAT | os.O_EXCL
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_TRUNC | os.O_CREAT

FILE_PERMISSIONS = 0o644
DIR_PERMISSIONS = 0o755
#: the mode bits a chmod through the mount may not change (see ``chmod``)
_SPECIAL_BITS = _stat.S_ISUID | _stat.S_ISGID | _stat.S_ISVTX


def _mode(is_dir: bool) -> int:
    """The ``st_mode`` of every directory, or every file (a tile keeps no permissions)."""
    return (_stat.S_IFDIR | DIR_PERMISSIONS) if is_dir else (_stat.S_IFREG | FILE_PERMISSIONS)


class FuseUnavailable(RuntimeError):
    """libfuse3 (or mfusepy, or /dev/fuse) is missing: nothing can be mounted."""


_mfusepy = None
_load_lock = threading.Lock()


def load_mfusepy():
    """Import mfusepy on libfuse3, once; FuseUnavailable says what is missing."""
    global _mfusepy
    with _load_lock:
        if _mfusepy is not None:
            return _mfusepy
        # without it mfusepy prefers libfuse2 when both are installed
        if not os.environ.get("FUSE_LIBRARY_PATH"):
            os.environ["FUSE_LIBRARY_NAME"] = "fuse3"
        try:
            import mfusepy
        except (ImportError, OSError, AttributeError) as exc:  # no library, or a wrong one
            raise FuseUnavailable(
                f"FUSE is not available: {exc} (install libfuse3: `apt-get install fuse3`)"
            ) from None
        if mfusepy.fuse_version_major != 3:
            raise FuseUnavailable(
                f"ipuos mounts need libfuse 3; mfusepy loaded libfuse "
                f"{mfusepy.fuse_version_major}.{mfusepy.fuse_version_minor}"
            )
        if not os.path.exists("/dev/fuse"):
            raise FuseUnavailable("FUSE is not available: /dev/fuse is missing")
        _mfusepy = mfusepy
        return mfusepy


# -- errors -----------------------------------------------------------------------------


def _errno_of(exc: BaseException, where: str) -> int:
    """The errno a callback answers for ``exc``: the only place errors become numbers."""
    if isinstance(exc, (TimeoutError, concurrent.futures.TimeoutError)) and not (
        isinstance(exc, OSError) and exc.errno
    ):
        log.warning("%s: the machine did not answer in time", where)
        return errno.ETIMEDOUT
    if isinstance(exc, OSError) and isinstance(exc.errno, int) and exc.errno > 0:
        return exc.errno  # the tile's own errno (TileFailed is EIO)
    if isinstance(exc, RuntimeError):  # the scheduler refused it: the machine has stopped
        log.info("%s: %s", where, exc)
        return errno.EIO
    if isinstance(exc, (ValueError, OverflowError)):
        log.info("%s: refused a bad argument: %s", where, exc)
        return errno.EINVAL
    log.error("%s failed unexpectedly; answering EIO", where, exc_info=exc)
    return errno.EIO


def _fail(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def _callback(method):
    """Wrap an operation so that every failure leaves it as an OSError with a chosen errno."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self, *args):
        try:
            return method(self, *args)
        except Exception as exc:
            raise _fail(_errno_of(exc, f"{name}{args[:1]!r}")) from None

    return wrapper


# -- where a path lives -----------------------------------------------------------------

_ROOT, _TILES, _TILE_ROOT, _CHIP_ROOT, _INSIDE = range(5)


class _Place:
    """What a mount path names: one of the fixed directories, or a path on a tile."""

    __slots__ = ("kind", "tile", "inner", "base")

    def __init__(self, kind: int, tile: int | None = None, inner: str = "/", base: str = ""):
        self.kind = kind
        self.tile = tile
        self.inner = inner  # the path in the owner tile's VFS
        self.base = base  # where the mount's directory starts in that VFS ("" for "/")

    @property
    def fixed(self) -> bool:
        """One of the directories the mount itself provides (never removed or renamed)."""
        return self.kind != _INSIDE

    @property
    def synthetic(self) -> bool:
        """Answered by the mount itself: ``/``, ``/tiles`` and ``/chip``. A tile's root
        ``/tiles/N`` is fixed too, but its attributes are the tile's. (``/chip`` is looked
        up in the mount's root, under the root's lock, which a change notice needs: asking
        tile 0 there could wait on a notice that waits on the lookup; see _KernelNames.)"""
        return self.kind != _INSIDE and self.kind != _TILE_ROOT


class _Open:
    """An open file: the owner tile's handle, and what the mount remembers about it."""

    __slots__ = ("tile", "handle", "inner", "append", "dirty", "fresh", "written_ns")

    def __init__(self, tile: int, handle: int, inner: str, append: bool):
        self.tile = tile
        self.handle = handle
        #: its path on the tile (None once unlinked or replaced)
        self.inner: str | None = inner
        self.append = append
        #: written or truncated since the tile last committed it
        self.dirty = False
        #: created empty by this open and not changed since: its attributes are known
        self.fresh = False
        #: when it was last written or truncated (its mtime as its writer sees it until
        #: the tile commits, as POSIX marks mtime at the write)
        self.written_ns = 0

    def changed(self) -> None:
        self.dirty = True
        self.fresh = False
        self.written_ns = time.time_ns()


_FUSE_NOTIFY_INVAL_ENTRY = 3
_FUSE_ROOT_ID = 1


class _KernelNames:
    """The kernel's cache of looked-up names, and how to make it forget them.

    A notice is a ``FUSE_NOTIFY_INVAL_ENTRY`` written to the mount's ``/dev/fuse``
    connection, for a name in a directory given by its node id: the kernel drops that
    name and every unused name below it, so the next lookup of anything there asks
    again. It drops the name even if it is in use: a process whose current directory it
    is finds that directory deleted, and a bind mount below it is detached. So the name
    told is the one a tile changed, in its own directory, not the whole of ``/chip`` or
    ``/tiles`` (which broke ``git`` run in the mount's ``chip`` whenever a tile removed
    any file of the chip disk, and renumbered every inode).

    libfuse's high-level API hands out node ids without saying them, but the kernel
    says them: :meth:`_node` resolves the directory from the mount's root with
    ``openat2(RESOLVE_CACHED)``, which uses the kernel's cache alone (it fails rather
    than send a lookup), and reads the node id from the directory's file handle. A
    directory the kernel does not hold (or holds expired) names nothing below it that a
    lookup would not check again from above: the name is told in the deepest directory
    on the way that it does hold, and if that is the root, ``chip`` or ``tiles`` is
    looked up first (it expires while a shell works below it; answering it asks no
    tile).

    All of it is done by a thread of its own, never by the scheduler's: the kernel
    takes the directory's lock to drop a name, and a host process creating a file there
    holds that lock while its request waits for a tile. Until the thread has told the
    kernel, a name the kernel keeps is answered by path, with what the tile has there now
    (as a name in use always is: see the module doc). The descriptor is a duplicate of
    libfuse's, so a notice sent after an unmount fails harmlessly instead of touching
    freed libfuse state.
    """

    def __init__(self, fd: int, mountpoint: str | None = None, forgot_top=None):
        self._fd: int | None = fd
        #: where the mount is (None: only whole top names can be told)
        self._mountpoint = mountpoint
        #: ``forgot_top(name)``: after ``chip`` or ``tiles`` itself was told
        self._forgot_top = forgot_top
        #: the queue (never held while anything blocks: the scheduler thread takes it)
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        #: (path from the root, whether to tell the top name itself whole) to tell
        self._pending: list[tuple[str, bool]] = []
        self._busy = self._paused = False
        self._teller: threading.Thread | None = None
        #: held while the descriptor is written to or closed (by the teller and close)
        self._write_lock = threading.Lock()
        #: notices sent (tests and benchmarks)
        self.sent = 0

    def forget_name(self, rel: str, whole: bool = False) -> None:
        """Have the kernel forget ``rel`` (``chip/a/b``: a path from the mount's root)
        and every unused name below it, not the directories above it (``whole``: the
        top name ``rel`` itself, ``chip`` or ``tiles``). Returns at once."""
        with self._lock:
            if self._fd is None:
                return
            self._pending.append((rel, whole))
            if self._teller is None:
                self._teller = threading.Thread(target=self._run, name="ipuos-fuse-names", daemon=True)
                self._teller.start()
            self._wake.notify_all()

    def pause(self) -> None:
        """Hold notices back (and wait for one being told): an unmount fails while the
        teller looks a directory up."""
        with self._lock:
            self._paused = True
            while self._busy:
                self._wake.wait()

    def resume(self) -> None:
        with self._lock:
            self._paused = False
            self._wake.notify_all()

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until every notice asked for has been told (tests); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while (self._pending or self._busy) and self._fd is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(left)
        return True

    def _run(self) -> None:
        while True:
            with self._lock:
                while (not self._pending or self._paused) and self._fd is not None:
                    self._wake.wait()
                if self._fd is None:
                    return
                pending, self._pending = self._pending, []
                self._busy = True
            try:
                for rel, whole in dict.fromkeys(pending):  # (each once, in order)
                    try:
                        self._tell(rel, whole)
                    except Exception as exc:  # (never let the thread die: names would go stale)
                        log.warning("could not make the kernel forget %s: %s", rel, exc)
            finally:
                with self._lock:
                    self._busy = False
                    self._wake.notify_all()

    def _tell(self, rel: str, whole: bool) -> None:
        top = rel.split("/")[0]
        if whole or self._mountpoint is None:  # (no way to its directory: the whole top name)
            self._send(top)
            return
        if self._forget_below(rel):
            return
        try:
            os.stat(os.path.join(self._mountpoint, top))  # (the kernel looks it up afresh)
        except OSError:
            pass
        if not self._forget_below(rel):
            self._send(top)  # (what is left: the whole top name)

    def _forget_below(self, rel: str) -> bool:
        """Tell ``rel`` in the deepest directory on its way the kernel holds; False if
        it holds not even the top name (``chip``, ``tiles``)."""
        parts = rel.split("/")
        for depth in range(len(parts) - 1, 0, -1):
            node = self._node("/".join(parts[:depth]))
            if node is not None:
                self._send(parts[depth], node)
                return True
        return False

    def _send(self, name: str, parent: int = _FUSE_ROOT_ID) -> None:
        raw = name.encode()
        message = struct.pack("<IiQQII", 32 + len(raw) + 1, _FUSE_NOTIFY_INVAL_ENTRY, 0,
                              parent, len(raw), 0) + raw + b"\0"
        with self._write_lock:
            if self._fd is None:
                return
            self.sent += 1
            try:
                os.write(self._fd, message)
            except OSError as exc:
                # ENOENT: the kernel keeps nothing there; ENODEV, ENOTCONN: unmounted
                if exc.errno not in (errno.ENOENT, errno.ENODEV, errno.ENOTCONN):
                    log.warning("could not make the kernel forget %s: %s", name, exc)
        if parent == _FUSE_ROOT_ID and self._forgot_top is not None:
            self._forgot_top(name)  # (after: a lookup meanwhile is a fresh one)

    def _node(self, rel: str) -> int | None:
        """The node id of the directory ``rel`` if the kernel holds it, valid, in its
        cache; None otherwise (nothing is looked up). The descriptors it takes are
        closed at once: one held would keep the mount busy."""
        try:
            root = os.open(self._mountpoint, _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            fd = _openat2_cached(root, rel)
        finally:
            os.close(root)
        if fd is None:
            return None
        try:
            return _node_id(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        with self._lock:
            self._pending.clear()
            fd, self._fd = self._fd, None
            self._wake.notify_all()
        with self._write_lock:
            if fd is not None:
                os.close(fd)


_O_PATH = getattr(os, "O_PATH", 0o10000000)
_SYS_OPENAT2 = 437  # (the same number on every Linux architecture)
_RESOLVE_CACHED_BENEATH = 0x20 | 0x08 | 0x04 | 0x02  # CACHED, BENEATH, NO_SYMLINKS, NO_MAGICLINKS
_AT_EMPTY_PATH = 0x1000
#: the kernel's FUSE file handle: the node id's two halves and the generation
_FUSE_HANDLE = struct.Struct("<III")
#: its types: FILEID_INO64_GEN, and the same with the parent's
_FUSE_HANDLE_TYPES = (0x81, 0x82)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_HANDLE_MAX = 32  # bytes: a FUSE handle takes 12 (24 with its parent's)


class _FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int),
                ("f_handle", ctypes.c_ubyte * _HANDLE_MAX)]


_libc = None


def _c_library():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _openat2_cached(root: int, rel: str) -> int | None:
    """An O_PATH descriptor of the directory ``rel`` under ``root``, resolved from the
    kernel's cache alone, or None (not cached, expired, or no openat2 here)."""
    how = _OpenHow(_O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, 0, _RESOLVE_CACHED_BENEATH)
    try:
        fd = _c_library().syscall(_SYS_OPENAT2, root, os.fsencode(rel), ctypes.byref(how), ctypes.sizeof(how))
    except (OSError, AttributeError):
        return None
    return fd if fd >= 0 else None


def _node_id(fd: int) -> int | None:
    """The FUSE node id of the open directory ``fd``, from its file handle."""
    handle = _FileHandle(_HANDLE_MAX)
    mount_id = ctypes.c_int()
    if _c_library().name_to_handle_at(fd, b"", ctypes.byref(handle), ctypes.byref(mount_id), _AT_EMPTY_PATH) < 0:
        return None
    if handle.handle_type not in _FUSE_HANDLE_TYPES or handle.handle_bytes < _FUSE_HANDLE.size:
        return None  # (not a FUSE directory: the mount point was moved, say)
    high, low, _generation = _FUSE_HANDLE.unpack(bytes(handle.f_handle[:_FUSE_HANDLE.size]))
    return high << 32 | low


_libfuse_functions = None


def _libfuse():
    """The libfuse functions this module calls itself."""
    global _libfuse_functions
    if _libfuse_functions is None:
        mfusepy = load_mfusepy()
        lib = ctypes.CDLL(mfusepy._libfuse._name)  # own function objects: argtypes stay ours
        lib.fuse_get_context.restype = ctypes.POINTER(mfusepy.fuse_context)
        lib.fuse_get_session.restype = ctypes.c_void_p
        lib.fuse_get_session.argtypes = [ctypes.c_void_p]
        lib.fuse_session_fd.restype = ctypes.c_int
        lib.fuse_session_fd.argtypes = [ctypes.c_void_p]
        _libfuse_functions = lib
    return _libfuse_functions


#: a umask that no kernel request carries (a umask has 9 bits): see _Requests
_MARKED_UMASK = 0xFFFFFFFF


class _Requests:
    """Tells whether two callbacks serve the same kernel request.

    libfuse's high-level API does not say which request a callback serves, but it refills
    the calling thread's ``fuse_context`` (uid, gid, pid, umask) at the start of every
    request. A umask that no request carries, written there by one callback, is therefore
    still there for a later callback exactly when that serves the same request.

    What it is for: libfuse hides an open file that is unlinked (or replaced) with a
    getattr of a free ``.fuse_hidden`` name and then a rename to it, both within the unlink
    (or rename) request. A user's rename to such a name is a lookup request, then a rename
    request: the same two callbacks, maybe on the same thread, but never in one request.
    """

    def __init__(self, fuse: int):
        self._fuse = fuse  # this mount's libfuse instance
        self._get_context = _libfuse().fuse_get_context
        #: per libfuse thread: the path that thread's current request was marked for
        self._marked: dict[int, str] = {}

    def _context(self):
        """The calling thread's context, if it serves a request of this mount."""
        pointer = self._get_context()
        if not pointer or pointer.contents.fuse != self._fuse:
            return None  # (a call from outside libfuse, as tests make)
        return pointer.contents

    def caller(self) -> int | None:
        """The kernel's id of the thread whose request this callback serves."""
        context = self._context()
        return None if context is None else context.pid

    def mark(self, path: str) -> None:
        context = self._context()
        if context is not None:
            self._marked[threading.get_ident()] = path
            context.umask = _MARKED_UMASK

    def marked(self, path: str) -> bool:
        """Did an earlier callback of this very request mark ``path``?"""
        context = self._context()
        return (context is not None and context.umask == _MARKED_UMASK
                and self._marked.get(threading.get_ident()) == path)


def _session_fd() -> int:
    """The ``/dev/fuse`` descriptor of the libfuse session whose callback is running."""
    lib = _libfuse()
    fuse = lib.fuse_get_context().contents.fuse
    if not fuse:
        raise RuntimeError("no libfuse context")
    session = lib.fuse_get_session(fuse)
    fd = lib.fuse_session_fd(session) if session else -1
    if fd < 0:
        raise RuntimeError("libfuse has no session descriptor")
    return fd


class _Known:
    """What the mount has learnt of tile namespaces, kept right by the tiles' change notices.

    Per tile: ``entries`` {path: (True, 0, mtime_ns) for a directory, or False for "no
    such file"} and ``listings`` {directory: {name: is_dir}}, each listing complete (the
    directory holds those names and no other), so a lookup of any other name there is
    ENOENT without asking the tile. A *file's* attributes are never kept: its size and
    mtime are what change most, so every lookup of a file asks its tile (which also keeps
    each ``stat`` one request, batched with others). What a tile answered is kept by
    :meth:`learn` only if no
    notice about that tile arrived meanwhile (``gen``, read before the request was sent,
    is unchanged afterwards): an answer that may predate a change is used once, never
    kept. Notices (:meth:`notice`) arrive on the scheduler thread, from the owner tile
    right after each change and before it answers anything else; they only drop or
    adjust what is kept (dict operations, atomic under the GIL: no lock that a waiting
    callback could hold).
    """

    #: paths (or directories) kept per tile before starting again
    LIMIT = 1 << 16

    def __init__(self, ntiles: int, on_reset=None):
        #: per tile: how many notices it has sent
        self.gen = [0] * ntiles
        self.entries: dict[int, dict[str, tuple | bool]] = {}
        self.listings: dict[int, dict[str, dict[str, bool]]] = {}
        self._on_reset = on_reset

    def get(self, tile: int, path: str):
        """(is_dir, size, mtime_ns) of ``path``, False if it does not exist, None if unknown."""
        entries = self.entries.get(tile)
        if entries is not None:
            known = entries.get(path)
            if known is not None:
                return known
        listings = self.listings.get(tile)
        if listings is not None and path != "/":
            parent, _, name = path.rpartition("/")
            listing = listings.get(parent or "/")
            if listing is not None and name not in listing and (
                    len(name) <= _NAME_MAX // 4 or len(name.encode("utf-8", "surrogateescape")) <= _NAME_MAX):
                return False  # (a name over the limit is the tile's to answer: ENAMETOOLONG)
        return None

    def learn(self, tile: int, gen: int, path: str, known) -> None:
        """Keep what the tile said of ``path`` (a directory's attributes, or False: no such
        file), if no notice about the tile came since ``gen`` was read."""
        if known is not False and not known[0]:
            return  # a file: asked every time
        entries = self.entries.get(tile)
        if entries is None:
            entries = self.entries.setdefault(tile, {})
        elif len(entries) >= self.LIMIT:
            entries.clear()
        entries[path] = known
        if self.gen[tile] != gen:  # checked after storing: a notice now drops it itself
            entries.pop(path, None)

    def learn_listing(self, tile: int, gen: int, path: str, rows, hidden) -> None:
        """Keep a directory's complete listing, and its subdirectories' attributes."""
        listings = self.listings.get(tile)
        if listings is None:
            listings = self.listings.setdefault(tile, {})
        elif len(listings) >= self.LIMIT:
            listings.clear()
        entries = self.entries.get(tile)
        if entries is None:
            entries = self.entries.setdefault(tile, {})
        elif len(entries) >= self.LIMIT:
            entries.clear()
        prefix = path.rstrip("/") + "/"
        listings[path] = {name: is_dir for name, is_dir, _size, _mtime in rows}
        kept = []
        for name, is_dir, size, mtime in rows:
            full = prefix + name
            if is_dir and not hidden(full):  # (a mount point is never looked up here)
                entries[full] = (is_dir, size, mtime)
                kept.append(full)
        if self.gen[tile] != gen:
            listings.pop(path, None)
            for full in kept:
                entries.pop(full, None)

    def notice(self, tile: int, kind: str, path: str, path2) -> None:
        """A change on ``tile`` (see ``_changes``); runs on the scheduler thread."""
        self.gen[tile] += 1
        if kind == RESET or kind == MOVED:  # whole subtrees may have moved: start again
            self.entries.pop(tile, None)
            self.listings.pop(tile, None)
            if kind == RESET and self._on_reset is not None:
                self._on_reset(tile)
            return
        parent, _, name = path.rpartition("/")
        parent = parent or "/"
        entries = self.entries.get(tile)
        if entries is not None:
            entries.pop(path, None)
            if kind != CHANGED:  # an entry came or went: the directory's mtime moved
                entries.pop(parent, None)
        if kind == CHANGED:
            return
        listings = self.listings.get(tile)
        if listings is None:
            if kind == ADDED_DIR:
                self.listings.setdefault(tile, {})[path] = {}  # new, hence empty
            return
        listing = listings.get(parent)
        if kind == REMOVED:
            if listing is not None:
                listing.pop(name, None)
            listings.pop(path, None)
            return
        if listing is not None:  # ADDED_FILE, ADDED_DIR
            listing[name] = kind == ADDED_DIR
        if kind == ADDED_DIR:
            listings[path] = {}


class ChipFilesystem:
    """mfusepy operations serving a running machine's files (see module doc).

    ``client``: a :class:`HostFsClient`; ``ntiles``: tiles of the machine; ``tiles``: the
    ones under ``/tiles`` (None: all); ``chip_tile``: the owner of the chip disk, None if
    the machine has none; ``readonly``: refuse every change with EROFS; ``changes``: the
    machine's :class:`~ipuos.vfs._changes.ChangeFeed`, which lets the mount keep what
    tiles tell it (see :class:`_Known`); without one every lookup asks a tile.
    Call :meth:`close` when the mount is over.
    """

    use_ns = True  # times as integer nanoseconds

    def __init__(self, client, ntiles: int, *, tiles=None, chip_tile: int | None = 0,
                 readonly: bool = False, chip_mount: str = "/chip", changes=None):
        self.client = client
        self.ntiles = ntiles
        self.tiles = sorted(set(range(ntiles) if tiles is None else tiles))
        self._tile_set = frozenset(self.tiles)
        self.chip_tile = chip_tile
        self.chip_mount = chip_mount
        self.readonly = readonly
        self.uid = os.getuid()
        self.gid = os.getgid()
        self.mounted_ns = time.time_ns()
        self._opens: dict[int, _Open] = {}
        #: (tile, path) -> the open files of that path (getattr asks them for the size)
        self._by_path: dict[tuple[int, str], set[_Open]] = {}
        self._open_lock = threading.Lock()
        self._fh = itertools.count(1)
        #: (tile, path) -> the open files libfuse hid there after they were unlinked
        self._hidden_files: dict[tuple[int, str], set[_Open]] = {}
        #: (tile, path) -> the name a file libfuse hid there had, kept after libfuse has
        #: removed the hidden name too (see _unhidden)
        self._hidden_from: dict[tuple[int, str], str] = {}
        #: tells libfuse's hiding renames from a user's (None until libfuse serves)
        self._requests: _Requests | None = None
        #: (tile, path) -> whether the mount last told the kernel that name is a directory:
        #: the type of the node the kernel keeps for it, if it keeps one (see _as_told)
        self._told: dict[tuple[int, str], bool] = {}
        #: the kernel's retries of opens that found their file gone (see _first_try)
        self._retries = Retries(ENTRY_TIMEOUT)
        #: per tile: the mount points hidden under its directory (see Submounts)
        self._submounts = Submounts()
        self._send = client.submit
        #: seconds a callback waits for a tile before it answers ETIMEDOUT (a tile that
        #: computes without reaching an exchange point holds every tile up)
        self.timeout = client.timeout
        #: requests the mount has sent to tiles, for tests and benchmarks
        self.requests = 0
        self._count_lock = threading.Lock()
        #: what tiles said, kept while no change notice contradicts it (None: keep nothing)
        self._known: _Known | None = None
        #: makes the kernel forget names (None: it keeps none, entry_timeout 0)
        self._kernel: _KernelNames | None = None
        #: (tile, path) -> removals and renames of it this mount has in flight: the kernel
        #: updates its own cache for those, so their notices need not make it forget
        self._mine: dict[tuple[int, str], int] = {}
        self._changes = changes
        if changes is not None:
            self._known = _Known(ntiles, on_reset=self._submounts.forget)
            changes.watch(self._notice)
        #: set once libfuse has started serving (its init has run)
        self.initialized = threading.Event()
        #: where it is mounted (set by serve_fuse): the kernel's names are told from there
        self.mountpoint: str | None = None

    def close(self) -> None:
        """The mount is over (its loop has returned): stop listening to change notices,
        and close on their tiles the files still open. (The kernel sends no release for
        the last descriptor of a mount unmounted lazily: its connection ends first, and
        the tile would hold the file, refusing a restore, until the machine halts.)"""
        if self._changes is not None:
            self._changes.unwatch(self._notice)
            self._changes = None
        kernel, self._kernel = self._kernel, None
        if kernel is not None:
            kernel.close()
        self._requests = None  # (libfuse's contexts go with its loop)
        with self._open_lock:
            left = list(self._opens)
        for fh in left:
            try:
                self._forget_open(fh)
            except RuntimeError:
                break  # the machine has stopped: its tiles hold nothing any more

    def init_with_config(self, conn, config) -> None:
        """libfuse has started: if change notices can reach the kernel, let it keep the
        names it looks up (``entry_timeout``); else it keeps nothing, as mounted."""
        try:
            try:
                self._requests = _Requests(_libfuse().fuse_get_context().contents.fuse)
            except Exception as exc:  # never fail init: libfuse's hides then show on tiles
                log.warning("files unlinked while open will show on tiles until closed: %s", exc)
            if self._known is None or config is None:
                return
            try:
                self._kernel = _KernelNames(os.dup(_session_fd()), self.mountpoint, self._retries.forgot)
            except Exception as exc:  # never fail init: the mount just caches less
                log.warning("the kernel will not keep names on this mount: %s", exc)
                return
            config.entry_timeout = ENTRY_TIMEOUT
        finally:
            self.initialized.set()

    def _notice(self, tile: int, kind: str, path: str, path2) -> None:
        """A change on a tile (see ``_changes``); on the scheduler thread, right after it.

        What the mount keeps is corrected first; then, if the kernel may hold a name that
        is gone now (a removal, a rename, a restore), it is told to forget the names under
        ``/chip`` or ``/tiles`` before the tile goes on. Attributes and absent names need
        nothing: the kernel keeps none. The mount's own removals and renames need nothing
        either: the kernel has updated its names from their replies."""
        self._known.notice(tile, kind, path, path2)
        if self._retries.active:  # (see Retries.created and Retries.named)
            if kind == ADDED_FILE:
                self._retries.created(tile, path)
            elif kind == ADDED_DIR or kind == MOVED:
                self._retries.named(tile, path2 if kind == MOVED else path)
            elif kind == RESET:
                self._retries.reset(tile, path)
        kernel = self._kernel
        if kernel is None or kind in (CHANGED, ADDED_FILE, ADDED_DIR):
            return
        if kind != RESET and (tile, path) in self._mine:
            return
        self._gone_under(tile, kind, path, path2)
        for changed in (path, path2) if kind == MOVED else (path,):
            name = self._mount_name(tile, changed)
            if name is not None:
                kernel.forget_name(name)
        if kind == RESET and path == "/" and tile == self.chip_tile:
            kernel.forget_name("chip", whole=True)  # (a whole tile 0 restored: its chip disk too)

    def hold_notices(self) -> None:
        """Hold back telling the kernel to forget names (an unmount is about to be tried:
        looking a directory up would make it fail as busy); see release_notices."""
        if self._kernel is not None:
            self._kernel.pause()

    def release_notices(self) -> None:
        if self._kernel is not None:
            self._kernel.resume()

    def _mount_name(self, tile: int, path: str) -> str | None:
        """Where a tile's ``path`` is in the mount, from its root (``chip/a``,
        ``tiles/5/a``), or None if the mount does not show it."""
        chip = self.chip_mount
        if tile == self.chip_tile and (path == chip or path.startswith(chip + "/")):
            return "chip" + path[len(chip):]
        if tile in self._tile_set:
            return f"tiles/{tile}" + ("" if path == "/" else path)
        return None

    def _gone_under(self, tile: int, kind: str, path: str, path2) -> None:
        """A tile removed or renamed ``path`` (a RESET: everything under it may be new).

        Files this mount holds open there keep working through their handles but lose
        their names, as after the mount's own unlink (``_orphan``); a MOVED keeps them
        under the new name. (A name the kernel keeps while a tile gives it another type
        is ``_as_told``'s.) Runs on the scheduler thread: dict work under a lock nobody
        holds while waiting for a tile."""
        if kind == MOVED:
            self._renamed(tile, path, path2)
        else:
            self._orphan(tile, path, below=True)

    def _as_told(self, place: _Place, is_dir) -> None:
        """About to tell the kernel that ``place`` is a directory (or a file): ESTALE
        instead if it was last told the other type there.

        The kernel cannot drop a name that is in use (a descriptor, a cwd, a lookup under
        way), and asks for its attributes by its node; if a tile has put something of
        another type there since, the kernel would take the answer for a corrupt inode
        (EIO). ESTALE makes it look the name up afresh and retry, once: the new type is
        remembered now, so that the retry is answered. A name whose type is unchanged is
        answered as it is, whatever replaced it: libfuse asks by path, so any node the
        kernel keeps there reaches the new file. (Answering ESTALE for every replaced
        name failed stats racing a tile's replace loop: the next replacement often came
        before the kernel's retry.)"""
        told = self._told
        key = (place.tile, place.inner)
        before = told.get(key)
        if before == is_dir:
            return
        self._tell(key, is_dir)
        if before is not None:
            raise _fail(errno.ESTALE)

    def _first_try(self, place: _Place) -> bool:
        """An open found no file: is this the kernel's first try, not its one retry after
        an ESTALE? (See :mod:`._retries`: the retry's lookups are told the file is gone.)"""
        caller = self._caller()
        return caller is None or self._retries.first_try(caller, place.tile, place.inner)

    def _retry_lookup(self, place: _Place) -> bool:
        """Is this lookup of ``place`` the kernel's retry of an open that found no file?"""
        caller = self._caller()
        return caller is not None and self._retries.lookup(caller, place.tile, place.inner,
                                                           lambda: creating_open(caller))

    def _caller_creates(self) -> bool:
        """Is the caller known to be in an open with O_CREAT (see :mod:`._syscalls`)?"""
        caller = self._caller()
        return caller is not None and creating_open(caller) is True

    def _named(self, place: _Place) -> None:
        """The kernel has been told that ``place`` exists (see Retries.named)."""
        if self._retries.active:
            self._retries.named(place.tile, place.inner)

    def _acted(self) -> None:
        """The caller makes, removes or renames a name: see Retries.acted."""
        if self._retries.active:
            caller = self._caller()
            if caller is not None:
                self._retries.acted(caller)

    def _retried(self, place: _Place) -> None:
        """The caller has opened (or made) ``place``: no retry of its is pending there."""
        caller = self._caller()
        if caller is not None:
            self._retries.done(caller, place.tile, place.inner)

    def _caller(self) -> int | None:
        """The kernel's id of the thread whose request this is; None if unknown."""
        requests = self._requests
        return requests.caller() if requests is not None else None

    def _tell(self, key: tuple[int, str], is_dir) -> None:
        told = self._told
        if len(told) >= _TOLD_MAX:
            told.clear()  # (then a name the kernel holds and a tile retypes may EIO once: rare)
        told[key] = bool(is_dir)

    def _told_moved(self, tile: int, src: str, dst: str) -> None:
        """The mount renamed ``src`` to ``dst``: the kernel has moved its nodes with it."""
        told = self._told
        is_dir = told.pop((tile, src), None)
        if is_dir is None:
            told.pop((tile, dst), None)
            return
        told[(tile, dst)] = is_dir
        if is_dir:
            prefix = src + "/"
            for key in [key for key in list(told) if key[0] == tile and key[1].startswith(prefix)]:
                below = told.pop(key, None)
                if below is not None:
                    told[(tile, dst + key[1][len(src):])] = below

    def _change_own(self, tile: int, path: str, service: str, *args):
        """``_call`` for a removal or rename of ``path`` made through the mount."""
        key = (tile, path)
        with self._open_lock:
            self._mine[key] = self._mine.get(key, 0) + 1
        try:
            return self._call(tile, service, *args)
        finally:
            with self._open_lock:
                left = self._mine.pop(key) - 1
                if left:
                    self._mine[key] = left

    def _submit(self, tile: int, service: str, *args):
        """Queue one request for ``tile``; a Future of its answer."""
        with self._count_lock:
            self.requests += 1
        return self._send(tile, service, *args)

    def _call(self, tile: int, service: str, *args):
        return await_reply(self.client, tile, service, self._submit(tile, service, *args), self.timeout)

    # -- paths ---------------------------------------------------------------------------

    def _place(self, path: str | None) -> _Place:
        if path is None:  # an unlinked open file: only handle-based operations get here
            raise _fail(errno.ENOENT)
        if path == "/":
            return _Place(_ROOT)
        top, _, rest = path[1:].partition("/")
        if top == "tiles":
            if not rest:
                return _Place(_TILES)
            name, _, inner = rest.partition("/")
            tile = tile_of_name(name)
            if tile not in self._tile_set:
                raise _fail(errno.ENOENT)
            if not inner:
                return _Place(_TILE_ROOT, tile, "/")
            return _Place(_INSIDE, tile, "/" + inner)
        if top == "chip" and self.chip_tile is not None:
            chip = self.chip_mount
            if not rest:
                return _Place(_CHIP_ROOT, self.chip_tile, chip, chip)
            return _Place(_INSIDE, self.chip_tile, chip + "/" + rest, chip)
        raise _fail(errno.ENOENT)

    def _file_place(self, path, *, creating: bool = False, removing: bool = False) -> _Place:
        """The place of a path on a tile's filesystem; hidden paths raise. ``creating``: a
        new name is wanted there (EPERM in the mount's own directories, which hold only
        what the machine has); ``removing``: the name is to go (unlinked, or renamed)."""
        try:
            place = self._place(path)
        except FileNotFoundError:
            if creating and path.rpartition("/")[0] in ("", "/tiles"):
                raise _fail(errno.EPERM) from None
            raise
        if place.kind == _INSIDE:
            refused = self._hidden_errno(place, creating or removing)
            if refused is not None:
                raise _fail(refused)
        return place

    def _hidden_errno(self, place: _Place, changing: bool) -> int | None:
        """None if ``place`` is shown, else the errno for it: it is on another filesystem
        the tile has mounted (see module doc and ``Submounts.hidden_errno``)."""
        if self._submounts.known(place.tile) is None:
            self._submounts.learn(place.tile, self._call(place.tile, "fs.mounts"))
        return self._submounts.hidden_errno(place.tile, place.inner, place.base, changing=changing)

    def _refuse_if_readonly(self) -> None:
        if self.readonly:
            raise _fail(errno.EROFS)

    # -- attributes ----------------------------------------------------------------------

    def _attrs(self, is_dir: bool, size: int, mtime_ns: int) -> dict:
        return {
            "st_mode": _mode(is_dir),
            "st_nlink": 2 if is_dir else 1,
            "st_size": size,
            "st_blocks": -(-size // 512),
            "st_blksize": IO_BLOCK,
            "st_uid": self.uid,
            "st_gid": self.gid,
            "st_atime": mtime_ns,
            "st_mtime": mtime_ns,
            "st_ctime": mtime_ns,
        }

    @_callback
    def getattr(self, path, fh=None):
        if fh is None and self._requests is not None and _HIDDEN_NAME.match(path.rpartition("/")[2]):
            self._requests.mark(path)  # libfuse may be checking that it can hide a file there
        opened = self._opens.get(fh) if fh else None
        if opened is not None:
            if opened.fresh:
                # libfuse asks right after every create: answering from what the create
                # just did saves a round trip per file created
                opened.fresh = False
                return self._attrs(False, 0, time.time_ns())
            try:
                return self._open_attrs(path, opened)
            except OSError:
                if path is None or opened.inner is None:
                    raise
                # its handle has failed (a write that ran out of space lost it): the
                # file is still there, as last committed
        place = self._file_place(path)
        if place.synthetic:
            if fh is None and place.kind != _ROOT and self._kernel is not None:
                self._retries.root_lookup("tiles" if place.kind == _TILES else "chip", self._caller)
            return self._attrs(True, 0, self.mounted_ns)
        if place.fixed:  # a tile's root: as the tile has it
            return self._attrs(*self._stat(place))
        if fh is None and self._retries.active and self._retry_lookup(place):
            raise _fail(errno.ENOENT)  # (see _retries)
        writer = self._dirty_open(place.tile, place.inner)
        if writer is not None:
            try:
                return self._open_attrs(path, writer)
            except OSError:
                pass  # (as above: that handle failed; the file as committed)
        hidden = self._hidden_files.get((place.tile, place.inner))
        if hidden is not None:
            with self._open_lock:  # (release changes the set from other threads)
                still_open = list(hidden)
            for opened in still_open:
                try:
                    return self._open_attrs(None, opened)
                except OSError as exc:
                    if exc.errno != errno.EBADF:
                        raise
                    # closed meanwhile (a release after the list was taken): the next one
            raise _fail(errno.ENOENT)
        is_dir, size, mtime_ns = self._stat(place)
        self._as_told(place, is_dir)
        return self._attrs(is_dir, size, mtime_ns)

    def _stat(self, place: _Place) -> tuple:
        """(is_dir, size, mtime_ns) of a path on a tile, from what is known if possible."""
        known = self._known
        if known is None:
            return self._call(place.tile, "fs.stat", place.inner)[1:]
        tile, inner = place.tile, place.inner
        answer = known.get(tile, inner)
        if answer is False:
            raise _fail(errno.ENOENT)
        if answer is not None:
            return answer
        gen = known.gen[tile]
        try:
            answer = self._call(tile, "fs.stat", inner)[1:]
        except FileNotFoundError:
            known.learn(tile, gen, inner, False)
            raise
        known.learn(tile, gen, inner, answer)
        return answer

    def _dirty_open(self, tile: int, inner: str) -> _Open | None:
        """A file open here with changes not committed yet: its size is what the writer
        sees, not what the tile has committed (``fstat`` after ``write`` must agree)."""
        opens = self._by_path.get((tile, inner))
        if opens:
            for opened in list(opens):
                if opened.dirty:
                    return opened
        return None

    def _open_attrs(self, path, opened: _Open) -> dict:
        """Attributes of an open file, with the size its handle sees (the stat and the
        size ride the same superstep)."""
        size_future = self._submit(opened.tile, "fs.seek", opened.handle, 0, os.SEEK_END)
        stat_future = None
        if path is not None and opened.inner is not None:
            stat_future = self._submit(opened.tile, "fs.stat", opened.inner)
        size = size_future.result(self.timeout)
        mtime_ns = time.time_ns()
        if stat_future is not None:
            try:
                mtime_ns = stat_future.result(self.timeout)[3]
            except FileNotFoundError:
                pass  # unlinked, or renamed by someone else, while open: the handle still works
        if opened.dirty:  # written since the tile's commit: modified then
            mtime_ns = max(mtime_ns, opened.written_ns)
        return self._attrs(False, size, mtime_ns)

    @_callback
    def readdir(self, path, fh):
        place = self._file_place(path)
        kind = place.kind
        if kind == _ROOT:
            names = ["tiles"] + (["chip"] if self.chip_tile is not None else [])
            return [".", ".."] + [(name, _stat.S_IFDIR, 0) for name in names]
        if kind == _TILES:
            return [".", ".."] + [(str(tile), _stat.S_IFDIR, 0) for tile in self.tiles]
        # the tile's mount table rides the same superstep: a readdir refreshes what is hidden
        known = self._known
        gen = known.gen[place.tile] if known is not None else 0
        listing = self._submit(place.tile, "fs.listdir", place.inner)
        mounts = self._submit(place.tile, "fs.mounts")
        entries = listing.result(self.timeout)
        self._submounts.learn(place.tile, mounts.result(self.timeout))
        tile, base, submounts = place.tile, place.base, self._submounts
        if known is not None:
            known.learn_listing(tile, gen, place.inner, entries,
                                lambda full: submounts.hides(tile, full, base))
        prefix = place.inner.rstrip("/") + "/"
        out = [".", ".."]
        for name, is_dir, _size, _mtime in entries:
            if submounts.hides(tile, prefix + name, base):
                continue
            out.append((name, _stat.S_IFDIR if is_dir else _stat.S_IFREG, 0))
        return out

    @_callback
    def statfs(self, path):
        place = self._file_place(path)
        if place.kind in (_ROOT, _TILES):
            # directories of directories: no blocks of their own (summing every tile's
            # disk would bring up the storage of tiles nobody has used)
            return {"f_bsize": 512, "f_frsize": 512, "f_blocks": 0, "f_bfree": 0, "f_bavail": 0,
                    "f_files": 0, "f_ffree": 0, "f_favail": 0, "f_namemax": 255}
        result = self._call(place.tile, "fs.statvfs", place.inner)
        keys = ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files", "f_ffree",
                "f_favail", "f_flag", "f_namemax")
        return dict(zip(keys, result))

    # -- names -----------------------------------------------------------------------------

    @_callback
    def mkdir(self, path, mode):
        self._refuse_if_readonly()
        self._acted()
        place = self._file_place(path, creating=True)
        if place.fixed:
            raise _fail(errno.EEXIST)
        self._call(place.tile, "fs.mkdir", place.inner)
        self._tell((place.tile, place.inner), True)  # (libfuse looks it up at once)
        self._named(place)
        return 0

    @_callback
    def rmdir(self, path):
        self._refuse_if_readonly()
        self._acted()
        place = self._file_place(path, removing=True)
        if place.fixed:
            raise _fail(errno.EBUSY)
        self._change_own(place.tile, place.inner, "fs.rmdir", place.inner)
        self._told.pop((place.tile, place.inner), None)  # (the kernel drops the name)
        return 0

    @_callback
    def unlink(self, path):
        self._refuse_if_readonly()
        self._acted()
        place = self._file_place(path, removing=True)
        if place.fixed:
            raise _fail(errno.EISDIR)
        key = (place.tile, place.inner)
        if key in self._hidden_files:  # libfuse removing a name it hid: the tile has no such file
            with self._open_lock:
                self._hidden_files.pop(key, None)
            return 0
        self._change_own(place.tile, place.inner, "fs.unlink", place.inner)
        self._told.pop((place.tile, place.inner), None)
        self._orphan(place.tile, place.inner)
        if self._kernel is not None:
            self._retries.unlinked(place.tile, place.inner, self._caller())
        return 0

    @_callback
    def rename(self, old, new, flags=0):
        self._refuse_if_readonly()
        if flags & ~_RENAME_NOREPLACE:
            raise _fail(errno.EINVAL)  # RENAME_EXCHANGE, RENAME_WHITEOUT: not supported
        self._acted()
        if new.count("/") == 1:
            # into the mount's root (only its own directories are there): answered before
            # anything asks a tile, since the kernel holds the root locked meanwhile, and
            # a change notice waits for that lock (see _KernelNames)
            if self._place(old).fixed:
                raise _fail(errno.EBUSY)
            self._file_place(new, creating=True)
            raise _fail(errno.EBUSY)
        src = self._file_place(old, removing=True)
        if src.fixed:
            raise _fail(errno.EBUSY)
        dst = self._file_place(new, creating=True)
        if dst.fixed:
            raise _fail(errno.EBUSY)
        if src.tile != dst.tile:
            raise _fail(errno.EXDEV)
        if not flags and (src.tile, src.inner) in self._by_path and self._hiding(new):
            return self._hide(src, dst)
        self._change_own(src.tile, src.inner, "fs.rename", src.inner, dst.inner,
                         bool(flags & _RENAME_NOREPLACE))  # (checked on the tile, atomically)
        self._told_moved(src.tile, src.inner, dst.inner)
        self._renamed(src.tile, src.inner, dst.inner)
        self._named(dst)
        return 0

    def _orphan(self, tile: int, inner: str, below: bool = False) -> set:
        """Files open at a name that is gone (unlinked, or replaced by a rename) have no
        path any more: their handles work on, but nothing looks them up by path.
        ``below``: the names under ``inner`` are gone too (a directory, a whole mount)."""
        with self._open_lock:
            opens = self._by_path.pop((tile, inner), set())
            if below and self._by_path:
                prefix = "/" if inner == "/" else inner + "/"
                for key in [key for key in self._by_path if key[0] == tile and key[1].startswith(prefix)]:
                    opens |= self._by_path.pop(key)
            for opened in opens:
                opened.inner = None
        return opens

    def _hiding(self, new: str) -> bool:
        """Is a rename of an open file to ``new`` libfuse hiding it? Only if this very
        request checked first that ``new``, a name of libfuse's pattern, is free: a user's
        rename to such a name keeps the file (see _Requests)."""
        requests = self._requests
        return requests is not None and requests.marked(new)

    def _hide(self, src: _Place, hidden: _Place) -> int:
        """libfuse hides an open file that is unlinked (or replaced) by renaming it: unlink
        it on the tile instead, and answer for the hidden name from the open handles."""
        self._change_own(src.tile, src.inner, "fs.unlink", src.inner)
        self._told.pop((src.tile, src.inner), None)
        opens = self._orphan(src.tile, src.inner)
        if self._kernel is not None:  # (an unlink as any other: libfuse has no node of the name)
            self._retries.unlinked(src.tile, src.inner, self._caller())
        with self._open_lock:
            self._hidden_files[(hidden.tile, hidden.inner)] = opens
            if len(self._hidden_from) >= _HIDDEN_FROM_MAX:
                self._hidden_from.clear()
            self._hidden_from[(hidden.tile, hidden.inner)] = src.inner
        return 0

    def _unhidden(self, place: _Place) -> _Place:
        """The name the file libfuse hid at ``place`` had, else ``place``. (libfuse opens
        by its hidden name a file a process looked up just before it was unlinked, even
        once the hidden name is gone too: the kernel's retry of that open looks up the
        name the process gave.)"""
        name = self._hidden_from.get((place.tile, place.inner))
        return place if name is None else _Place(_INSIDE, place.tile, name, place.base)

    def _renamed(self, tile: int, src: str, dst: str) -> None:
        """Keep the paths of open files right (getattr and utimens look them up)."""
        self._orphan(tile, dst, below=True)  # (a directory replaced was empty: harmless)
        prefix = src + "/"
        with self._open_lock:
            for key in [key for key in self._by_path if key[0] == tile
                        and (key[1] == src or key[1].startswith(prefix))]:
                opens = self._by_path.pop(key)
                inner = dst + key[1][len(src):]
                for opened in opens:
                    opened.inner = inner
                self._by_path.setdefault((tile, inner), set()).update(opens)

    @_callback
    def truncate(self, path, length, fh=None):
        self._refuse_if_readonly()
        opened = self._opens.get(fh) if fh else None
        if opened is not None:  # ftruncate: through the handle, so its own writes agree
            opened.changed()
            self._call(opened.tile, "fs.ftruncate", opened.handle, length)
            return 0
        place = self._file_place(path)
        if place.fixed:
            raise _fail(errno.EISDIR)
        self._call(place.tile, "fs.truncate", place.inner, length)
        return 0

    @_callback
    def utimens(self, path, times=None):
        place = self._file_place(path)
        if times is None:
            mtime = None
        else:
            mtime = times[1]
            if mtime == _UTIME_NOW:
                mtime = None
            elif mtime == _UTIME_OMIT:
                # only the access time, which a tile does not keep: just say whether it exists
                return 0 if place.fixed else self._exists(place)
            else:
                # the nearest time a tile keeps, as Linux clamps times to what a filesystem
                # keeps (`touch -d 2300-01-01` works; ext4 and XFS keep less)
                mtime = min(max(mtime, MTIME_MIN_NS), MTIME_MAX_NS)
        self._refuse_if_readonly()
        if place.synthetic and place.kind != _CHIP_ROOT:
            raise _fail(errno.EPERM)  # the mount's own directories have no time to set
        # (the chip disk's root has, as a tile's root: tar x, cp -a and rsync -t set it.
        # Its attributes stay the mount's, see _Place.synthetic; the shell and tile
        # programs see the time set)
        if (place.tile, place.inner) in self._hidden_files:
            return 0  # the time of a file that no longer has a name: nobody can see it
        # a dirty open file would stamp "now" over this time when it is closed: commit it first
        for opened in list(self._by_path.get((place.tile, place.inner), ())):
            self._commit(opened)
        self._call(place.tile, "fs.utime", place.inner, mtime)
        return 0

    def _exists(self, place: _Place) -> int:
        self._stat(place)
        return 0

    @_callback
    def access(self, path, amode):
        """access(2) and chdir(2): whether it exists, and whether its mode grants ``amode``
        to its owner (the only user the kernel lets use the mount): a file is not
        executable. Without it the kernel would answer from the name it keeps, gone or not."""
        place = self._file_place(path)
        if place.fixed:
            is_dir = True
        elif (place.tile, place.inner) in self._hidden_files:
            is_dir = False  # (unlinked, still open: a file)
        else:
            is_dir = self._stat(place)[0]
            self._as_told(place, is_dir)  # (chdir: a directory now a file is ENOTDIR)
        granted = _stat.S_IMODE(_mode(is_dir)) >> 6  # the owner's bits: rwx as R_OK W_OK X_OK
        if amode & (os.R_OK | os.W_OK | os.X_OK) & ~granted:
            raise _fail(errno.EACCES)
        return 0

    @_callback
    def chmod(self, path, mode):
        """No permission bits on a tile: a change of them is accepted and not kept (the
        mode stays 0644 or 0755), as FAT's ``quiet`` option does: on a mount only its
        user may enter (no ``allow_other``) they would guard nothing, and tools that copy
        files set them as a matter of course (``rsync -a`` makes each file with
        ``fchmod(fd, 0600)``, or 0700 for a script, and copied nothing when that
        failed). Setuid, setgid and sticky, which a tile could never honour, are EPERM."""
        attrs = self.getattr(path)
        if (mode ^ attrs["st_mode"]) & _SPECIAL_BITS:
            raise _fail(errno.EPERM)
        return 0

    @_callback
    def chown(self, path, uid, gid):
        self.getattr(path)
        if uid not in (-1, self.uid) or gid not in (-1, self.gid):
            raise _fail(errno.EPERM)  # no owners on a tile
        return 0

    @_callback
    def link(self, target, source):
        raise _fail(errno.EPERM)

    @_callback
    def symlink(self, target, source):
        raise _fail(errno.EPERM)

    @_callback
    def mknod(self, path, mode, dev):
        raise _fail(errno.EPERM)

    # -- files -----------------------------------------------------------------------------

    def _open(self, path, flags: int, creating: bool) -> tuple[int, _Open]:
        flags &= _OPEN_FLAGS
        if flags & _WRITE_FLAGS and self.readonly:
            raise _fail(errno.EROFS)
        place = self._file_place(path, creating=creating)
        if place.fixed:
            raise _fail(errno.EISDIR if not creating else errno.EEXIST)
        return self._open_place(place, flags, creating)

    def _open_place(self, place: _Place, flags: int, creating: bool) -> tuple[int, _Open]:
        try:
            handle = self._call(place.tile, "fs.open", place.inner, flags)
        except OSError as exc:
            if not creating:
                if (isinstance(exc, FileNotFoundError) and self._unhidden(place) is place
                        and self._caller_creates()):
                    # the kernel found the name, but the file has gone since: the caller
                    # asked for O_CREAT, which the kernel keeps back from an open, so the
                    # file is made, as on a local disk. (Not for a file libfuse hid: the
                    # caller's descriptor would be on the hidden node, apart from the new
                    # file's; the retry's lookup of the name finds it gone, see _hide.)
                    if self.readonly:
                        raise _fail(errno.EROFS) from None
                    return self._open_place(place, flags | os.O_CREAT, True)
                if (isinstance(exc, FileNotFoundError) and self._kernel is not None
                        and self._first_try(self._unhidden(place))):
                    # the kernel found the name in its cache, but it was removed since (by
                    # a tile, or through the mount while another process held it open,
                    # which libfuse hid): ESTALE makes the kernel look the path up again
                    # and retry, so O_CREAT, if the caller's flags could not be read,
                    # creates the file
                    raise _fail(errno.ESTALE) from None
                if isinstance(exc, IsADirectoryError):  # (a tile retyped what the kernel opens)
                    self._as_told(place, True)
            elif self._retries.active:
                # a create that failed (a directory is there, say): if it was the kernel's
                # retry of an open, that retry is over all the same (see Retries.acted)
                self._retried(place)
            raise
        if self._retries.active:
            self._retried(place)
            if creating:
                self._retries.created(place.tile, place.inner)
        if creating:
            self._tell((place.tile, place.inner), False)
        opened = _Open(place.tile, handle, place.inner, bool(flags & os.O_APPEND))
        # an O_TRUNC open has changed the file already: littlefs commits that at flush (a
        # create made a new, empty file, committed as it was made: nothing to commit; one
        # that found a file there leaves its truncation to the release, which the tile's
        # views count meanwhile, as they count every open handle's)
        opened.dirty = bool(flags & os.O_TRUNC) and not creating
        if opened.dirty and opened.append:
            # appends commit one by one (see _append): the truncation must come first
            self._commit(opened)
        fh = next(self._fh)
        with self._open_lock:
            self._opens[fh] = opened
            self._by_path.setdefault((opened.tile, opened.inner), set()).add(opened)
        return fh, opened

    @_callback
    def open(self, path, flags):
        return self._open(path, flags, creating=False)[0]

    @_callback
    def create(self, path, mode, flags=os.O_WRONLY):
        fh, opened = self._open(path, flags | os.O_CREAT, creating=True)
        # new (O_EXCL) or emptied (O_TRUNC): empty either way
        opened.fresh = bool(flags & (os.O_EXCL | os.O_TRUNC))
        return fh

    def _opened(self, fh) -> _Open:
        opened = self._opens.get(fh)
        if opened is None:
            raise _fail(errno.EBADF)
        return opened

    @_callback
    def read(self, path, size, offset, fh):
        opened = self._opened(fh)
        data = self._call(opened.tile, "fs.read", opened.handle, offset, size)
        return data if type(data) is bytes else bytes(data)  # mfusepy needs bytes

    @_callback
    def write(self, path, data, offset, fh):
        opened = self._opened(fh)
        opened.fresh = False
        if opened.append and opened.inner is not None:
            return self._append(opened, data)
        opened.changed()
        # (an unlinked O_APPEND file has no name to append by: its handle appends)
        self._call(opened.tile, "fs.write", opened.handle, None if opened.append else offset, data)
        return len(data)

    def _append(self, opened: _Open, data) -> int:
        """An O_APPEND write: at the end of the file as the tile has it now, committed at
        once, through a handle of its own. Every littlefs handle works on the file as it
        was when it was opened and commits that view whole, so appends through long-lived
        handles from several writers (``>>`` from two shells, a tile program logging too)
        would overwrite each other; appended one by one they all land, in order."""
        tile = opened.tile
        handle = self._call(tile, "fs.open", opened.inner, os.O_WRONLY | os.O_APPEND)
        written = self._submit(tile, "fs.write", handle, None, data)
        closed = self._submit(tile, "fs.close", handle)  # served after the write: same tile
        try:
            written.result(self.timeout)
        finally:
            closed.result(self.timeout)
        return len(data)

    @_callback
    def flush(self, path, fh):
        """Every close(2) of a descriptor: commit what was written, so that whoever opens
        the file next (here, in the shell, on a tile) sees it, and close(2) reports ENOSPC."""
        self._commit(self._opened(fh))
        return 0

    def _commit(self, opened: _Open) -> None:
        if opened.dirty:
            opened.dirty = False
            self._call(opened.tile, "fs.flush", opened.handle)

    @_callback
    def fsync(self, path, datasync, fh):
        opened = self._opened(fh)
        opened.dirty = False
        self._call(opened.tile, "fs.fsync", opened.handle)
        return 0

    @_callback
    def release(self, path, fh):
        """The last descriptor is gone. The close is queued without waiting (release is
        asynchronous in the kernel anyway, and flush already reported errors); requests
        queued after it reach the tile after it."""
        self._forget_open(fh)
        return 0

    def _forget_open(self, fh) -> None:
        """Drop the open file ``fh`` and queue its close on its tile."""
        with self._open_lock:
            opened = self._opens.pop(fh, None)
            if opened is None:
                return
            key = (opened.tile, opened.inner)
            opens = self._by_path.get(key)
            if opens is not None:
                opens.discard(opened)
                if not opens:
                    del self._by_path[key]
            for hidden in self._hidden_files.values():  # (getattr must not ask a closed one)
                hidden.discard(opened)
        future = self._submit(opened.tile, "fs.close", opened.handle)
        future.add_done_callback(_log_close_failure)

    def open_files(self, tiles=None) -> int:
        """Files open through the mount (``tiles``: on those tiles only)."""
        if tiles is None:
            return len(self._opens)
        return sum(opened.tile in tiles for opened in list(self._opens.values()))


def _log_close_failure(future) -> None:
    exc = future.exception()
    if exc is not None:
        log.info("closing a file after its last descriptor went: %s", exc)


# -- the loop ---------------------------------------------------------------------------


_fuse_class = None


def _fuse_loop_class(mfusepy):
    """mfusepy's FUSE with the two libfuse3 arguments it drops passed on: the file handle
    of ``truncate`` (ftruncate must go through the open file, or its own uncommitted
    writes would undo the truncation) and ``rename``'s flags (RENAME_NOREPLACE must not
    silently replace); read-only opens marked ``noflush`` (the kernel then sends no
    FLUSH when they are closed: there is nothing to commit); and ``create`` called with
    its flags directly (mfusepy inspects the method's signature on every create, ~10 us)."""
    global _fuse_class
    if _fuse_class is not None:
        return _fuse_class

    can_skip_flush = any(field[0] == "noflush" for field in mfusepy.fuse_file_info._fields_)

    class _Fuse(mfusepy.FUSE):
        def open(self, path, fip):
            info = fip.contents
            info.fh = self.operations.open(path.decode(self.encoding, self.errors), info.flags)
            if can_skip_flush and info.flags & (os.O_ACCMODE | os.O_TRUNC) == os.O_RDONLY:
                info.noflush = 1  # nothing to commit at close: no FLUSH round trip per close
            return 0

        def create(self, path, mode, fip):
            info = fip.contents
            info.fh = self.operations.create(path.decode(self.encoding, self.errors), mode, info.flags)
            return 0

        def truncate_fuse_3(self, path, length, fip):
            fh = fip.contents.fh if fip else None
            name = None if path is None else path.decode(self.encoding, self.errors)
            return self.operations.truncate(name, length, fh)

        def rename_fuse_3(self, old, new, flags):
            return self.operations.rename(old.decode(self.encoding, self.errors),
                                          new.decode(self.encoding, self.errors), flags)

    _fuse_class = _Fuse
    return _Fuse


def fuse_options(*, fsname: str, readonly: bool, auto_unmount: bool = True,
                 max_threads: int = MAX_THREADS) -> dict:
    """The mount options (see the module doc for why)."""
    options = {
        "fsname": fsname,
        "subtype": FUSE_SUBTYPE,
        "direct_io": True,
        "attr_timeout": 0,
        "entry_timeout": 0,
        "negative_timeout": 0,
        # a listing gives the inode number stat gives (libfuse's node id) for every name
        # libfuse has a node for (those the kernel looked up); others stay unknown
        # (0xffffffff): naming each one would have the kernel keep a node per name listed
        "readdir_ino": True,
        "max_threads": max_threads,
        # libfuse 3.12-3.14 warns about max_threads without it
        "max_idle_threads": max_threads,
    }
    if auto_unmount:
        # fusermount3 stays behind as a watchdog: if this process dies, it unmounts
        options["auto_unmount"] = True
    if readonly:
        options["ro"] = True
    return options


def serve_fuse(operations, mountpoint: str, **options) -> None:
    """Mount ``operations`` at ``mountpoint`` and serve until it is unmounted (blocks).

    Runs libfuse in the calling thread (``foreground``: libfuse must never fork the
    daemon). Unmounting (``fusermount3 -u``) from anywhere makes it return. A process that
    wants its own signal handlers must install them before: libfuse takes SIGTERM, SIGINT
    and SIGHUP for itself when they are left at their defaults.
    """
    mfusepy = load_mfusepy()
    if isinstance(operations, ChipFilesystem):
        operations.mountpoint = os.path.abspath(mountpoint)
    _fuse_loop_class(mfusepy)(operations, mountpoint, foreground=True, **options)
