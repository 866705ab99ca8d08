"""littlefs on a block device: the callback glue, a Filesystem and its File objects.

littlefs-python is a thin binding: it hands littlefs' C callbacks to a Python object and
littlefs' error codes back as ``LittleFSError``. Used directly it has traps, each one
reproduced on this project's machine; this module exists to make them unreachable:

* Exceptions raised in a callback are printed and dropped, and littlefs carries on with
  whatever was (or was not) in its buffer. The read callback cannot even report an error:
  the binding copies ``size`` bytes from whatever object it gets and returns success. So the
  glue catches everything, answers -EIO where it can, and remembers the exception; from
  then on it refuses every further write (nothing derived from a failed read can reach the
  medium) and the Filesystem raises ``OSError(EIO)`` naming the original. littlefs' caches
  may hold garbage after that, so the filesystem stays unusable until it is unmounted and
  mounted again (a *sticky* fault, like a power cut).
* ``LittleFS(mount=True)`` formats an image it cannot mount: silent data loss. Nothing here
  mounts or formats unless asked.
* Calling littlefs with a file handle it no longer has open (a second close, or any call
  after a failed close: littlefs unlinks the handle even when close fails) trips an
  assertion and aborts the process with SIGABRT. So does reading a write-only file or
  writing a read-only one. File objects refuse all of these before littlefs sees them.
* A handle freed while littlefs still lists it as open, or any call on an unmounted or
  never-mounted filesystem, reads freed memory. The Filesystem holds every open handle
  until it is closed, closes them all at unmount, and checks it is mounted.
* Renaming a directory into its own subtree succeeds in littlefs and loses the directory.
  ``rename`` refuses it with EINVAL, as POSIX does.
* littlefs is neither thread-safe nor re-entrant. A Filesystem admits one operation at a
  time and raises :class:`FilesystemBusyError` for a second one started (by another
  greenlet or thread) while the first is paused in a device call. It never waits.
* littlefs error codes are negated *Linux* errno numbers, and ``LittleFSError`` is not an
  ``OSError``. Every code is translated here, in one table.
* After littlefs runs out of space part-way through a commit it can leave its program
  cache dirty (upstream issue #760); the next commit then trips an assertion and aborts the
  process. So every ENOSPC is followed, inside the same call, by an unmount and mount,
  which resets the caches. That would also drop every open file's uncommitted writes,
  which on a host sit safely in the page cache: so each file keeps a journal of what it
  wrote and truncated since it last committed (a commit is forced past 1 MiB), and the
  remount opens every file again, applies its journal and commits it. The call that ran
  out of space is tried once more if that may have made room (a rewrite frees the old
  blocks only at that commit; a handle's out-of-date view of a file holds that
  version's blocks until it looks again, which the remount makes it do), and fails with
  ENOSPC alone if it still does not fit. Only a file whose journal no
  longer fits is lost: it raises EIO saying why, and its sync and close say ENOSPC once.
* littlefs keeps every open file in a list it walks (and asserts on). A handle dropped
  without closing it must outlive that filesystem handle, or the walk reads freed
  memory: such handles are kept until the next unmount (``_let_go``).
* Smaller ones: the binding's mode "a" does not create a missing file (here it does, as in
  Python); it cannot store an empty custom attribute (IndexError; refused here with a
  clear message); it ignores an unknown ``whence`` (refused here with EINVAL).
"""

from __future__ import annotations

import bisect
import collections
import errno
import io
import math
import operator
import os
import posixpath
import struct
import weakref
from typing import NamedTuple

from littlefs import LittleFSError, lfs

from ._lfsdir import directory_attribute
from ._memory import MemoryDevice, slicing_source
from ._protocol import BlockDevice

__all__ = [
    "translate_error",
    "check_mounts",
    "Filesystem",
    "File",
    "FileInfo",
    "FsInfo",
    "FilesystemBusyError",
    "CorruptFilesystemError",
    "MTIME_ATTRIBUTE",
    "MTIME_MIN_NS",
    "MTIME_MAX_NS",
    "wrong_mode_error",
    "checked_seek",
    "read_unit",
]

#: custom attribute type under which ``set_mtime`` stores a file's mtime ('t')
MTIME_ATTRIBUTE = 0x74
_MTIME = struct.Struct("<q")  # signed nanoseconds since the epoch
#: the times ``set_mtime`` keeps, in nanoseconds (1677-09-21 to 2262-04-11)
MTIME_MIN_NS, MTIME_MAX_NS = -(1 << 63), (1 << 63) - 1
_ENCODING = "utf-8"
_ATTR_MAX = 1022  # littlefs' LFS_ATTR_MAX, the default the binding builds with

_LFS_RDONLY = 1
_LFS_WRONLY = 2
_LFS_RDWR = 3
_LFS_CREAT = 0x0100
_LFS_EXCL = 0x0200
_LFS_TRUNC = 0x0400
_LFS_APPEND = 0x0800
_LFS_TYPE_DIR = 2
#: errors with which littlefs abandons a commit half-way, possibly leaving its program
#: cache dirty: NOSPC, NAMETOOLONG (an entry that does not fit in a metadata block; names
#: longer than name_max never reach littlefs), NOMEM. Not FBIG: a write past the largest
#: file is refused before anything is written, and must not cost other files their writes
_COMMIT_FAILURES = frozenset({-28, -36, -12})
_LFS_ERR_NAMETOOLONG = -36
_LFS_ERR_ISDIR = -21
_LFS_ERR_IO = -5


class FilesystemBusyError(RuntimeError):
    """A second littlefs call started while one is in progress on the same filesystem.

    This is a bug in the caller (ipuos lets only a filesystem's owner greenlet touch it),
    never a condition to retry, so it is not an ``OSError``.
    """


class CorruptFilesystemError(OSError):
    """littlefs found no consistent filesystem (``LFS_ERR_CORRUPT``); errno is EIO."""


class WritesLostError(OSError):
    """Unmounting dropped writes the device never took (errno EIO): its own cache held
    them, and the device failed before they could be written back. The device holds the
    filesystem as it was at its last successful write-back."""


class FileInfo(NamedTuple):
    """One directory entry or ``stat`` result."""

    name: str
    is_dir: bool
    size: int  # bytes for a file, 0 for a directory


class FsInfo(NamedTuple):
    """Filesystem geometry and usage (``statvfs``)."""

    block_size: int
    block_count: int
    blocks_used: int
    blocks_free: int
    name_max: int
    file_max: int
    attr_max: int
    disk_version: str


# -- error translation: the only place littlefs codes become errno ---------------------

# littlefs codes are negated Linux errno numbers, so they are mapped by name, not negated
# (the numbers differ on other systems). LFS_ERR_CORRUPT (-84) would read as EILSEQ,
# "invalid multibyte sequence"; it becomes EIO, which every POSIX tool understands
# (Linux's EUCLEAN is not portable), raised as CorruptFilesystemError so callers can still
# tell it apart. LFS_ERR_NOATTR becomes ENODATA, what getxattr reports for a missing one.
_ERRORS: dict[int, tuple[int, str | None]] = {
    -5: (errno.EIO, None),  # LFS_ERR_IO
    -84: (errno.EIO, "corrupt filesystem (littlefs found no valid metadata)"),
    -2: (errno.ENOENT, None),
    -17: (errno.EEXIST, None),
    -20: (errno.ENOTDIR, None),
    -21: (errno.EISDIR, None),
    -39: (errno.ENOTEMPTY, None),
    -9: (errno.EBADF, None),
    -27: (errno.EFBIG, None),
    -22: (errno.EINVAL, None),
    -28: (errno.ENOSPC, None),
    -12: (errno.ENOMEM, None),
    -61: (errno.ENODATA, "no such attribute"),
    -36: (errno.ENAMETOOLONG, None),
}


def translate_error(exc: LittleFSError, path: str | None = None,
                    path2: str | None = None) -> OSError:
    """The ``OSError`` (with a POSIX errno) for a ``LittleFSError``."""
    code = exc.code
    number, message = _ERRORS.get(code, (errno.EIO, f"unexpected littlefs error {code}"))
    message = message or os.strerror(number)
    cls = CorruptFilesystemError if code == -84 else OSError
    if path2 is not None:
        return cls(number, message, path, None, path2)
    return cls(number, message, path)


def _no_room_for_entry(path) -> OSError:
    return _error(errno.ENOSPC, path, "no space left on device (the directory entry does not fit)")


def _error(number: int, path: str | None = None, message: str | None = None) -> OSError:
    return OSError(number, message or os.strerror(number), path)


def wrong_mode_error(path, reading: bool) -> OSError:
    """Reading a file opened only for writing, or the reverse: what the host's files
    raise (``io.UnsupportedOperation``, an OSError and a ValueError), with errno EBADF."""
    return io.UnsupportedOperation(errno.EBADF, f"File not open for {'reading' if reading else 'writing'}",
                                   path)


#: littlefs positions are signed 32-bit (its largest file is 2 GiB - 1)
_LFS_FILE_MAX = (1 << 31) - 1


def checked_seek(offset, whence: int) -> int:
    """``offset`` as an int, refusing what the host's unbuffered files refuse: a float
    offset is a TypeError; a whence other than SEEK_SET/CUR/END, or an offset no littlefs
    file can reach, is EINVAL (the caller names the file)."""
    offset = operator.index(offset)
    if whence not in (os.SEEK_SET, os.SEEK_CUR, os.SEEK_END):
        raise OSError(errno.EINVAL, f"invalid whence ({whence!r}, should be 0, 1 or 2)")
    if not -_LFS_FILE_MAX <= offset <= _LFS_FILE_MAX:
        raise OSError(errno.EINVAL, "beyond the largest file littlefs holds (2 GiB)")
    return offset


# -- the littlefs callback object -----------------------------------------------------


class _DeviceCallbacks:
    """What littlefs calls: forwards to the device, never lets an exception escape.

    The first exception is kept in ``fault``; after it every call is refused (reads
    answer zeros, writes -EIO) until the owner calls ``reset``.

    littlefs-python looks ``read``/``prog``/``erase``/``sync`` up on this object for every
    callback, so they are instance attributes, switched to the route the state calls for
    instead of testing flags on every call (``_route``):

    * **refusing**, after a fault or while unmounting: the ``_refuse_*`` functions;
    * **fast**, on a healthy device that has a fast path and no fault plan attached: the
      closures ``_memory_fast_path``/``_cached_fast_path`` make for the device. They do
      what the checked path does, one Python call instead of two (or three), count in
      their own cells (the device adds those counts to its counters when they are read),
      and turn every exception into a fault just the same;
    * **checked**, otherwise (a device with a fault plan always): closures through the
      device's public operations (``_checked_path``).

    No route refers back to this object except through a weak reference (``_failer``):
    a bound method stored on its own instance would make a reference cycle, and objects
    in cycles wait for the garbage collector, which a restore (a filesystem per tile
    disk) then paid for in whole collections. The device tells the object when a fault
    plan comes or goes (``faults_changed``).
    """

    __slots__ = ("device", "unit", "fault", "commits", "_refusing", "_fast", "_checked", "read",
                 "prog", "erase", "sync", "__weakref__")

    def __init__(self, device, unit: int):
        self.device = device
        #: a request size littlefs often makes (its cache line), for the fast paths' counting
        self.unit = unit
        self.fault: BaseException | None = None
        #: ``[n]``: syncs littlefs asked for. littlefs syncs at the end of every metadata
        #: commit, so a change of ``n`` across a call says the call committed (a cell the
        #: routes share, so that none of them refers back to this object)
        self.commits = [0]
        self._refusing = False
        failed = _failer(self)
        #: (read, prog, erase, sync) through the device's public operations
        self._checked = _checked_path(device, failed, self.commits)
        #: the same for a healthy device, faster, or None
        self._fast = _fast_path(self, device, failed)
        if self._fast is not None:
            device._watch_faults(self)
        self._route()

    @property
    def refusing(self) -> bool:
        """Every call is refused (set after a fault, and while unmounting)."""
        return self._refusing

    @refusing.setter
    def refusing(self, value: bool) -> None:
        self._refusing = bool(value)
        self._route()

    def reset(self) -> None:
        self.fault = None
        self.refusing = False

    def faults_changed(self) -> None:
        """The device's fault plan was attached or detached."""
        self._route()

    def _route(self) -> None:
        if self._refusing:
            route = _REFUSING
        elif self._fast is not None and self.device.faults is None:
            route = self._fast
        else:
            route = self._checked
        self.read, self.prog, self.erase, self.sync = route

    def _failed(self, exc: BaseException) -> None:
        if self.fault is None:
            self.fault = exc
        self.refusing = True


def _failer(glue: _DeviceCallbacks):
    """``glue._failed`` through a weak reference (see :class:`_DeviceCallbacks`)."""
    ref = weakref.ref(glue)

    def failed(exc: BaseException) -> None:
        owner = ref()
        if owner is not None:
            owner._failed(exc)

    return failed


# -- refusing -------------------------------------------------------------------------


def _refuse_read(cfg, block, off, size):
    return bytes(size)


def _refuse_prog(cfg, block, off, data):
    return -5


def _refuse_erase(cfg, block):
    return -5


def _refuse_sync(cfg):
    return -5


_REFUSING = (_refuse_read, _refuse_prog, _refuse_erase, _refuse_sync)


# -- checked: through the device's public operations ------------------------------------


def _checked_path(device, failed, commits: list):
    device_read, device_prog = device.read, device.prog
    device_erase, device_sync = device.erase, device.sync

    def read(cfg, block, off, size):
        try:
            data = device_read(block, off, size)
            if type(data) is not bytes or len(data) != size:
                data = _exact(device, data, size, block, off)
            return data
        except BaseException as exc:
            failed(exc)
            return bytes(size)

    def prog(cfg, block, off, data):
        try:
            device_prog(block, off, data)
        except BaseException as exc:
            failed(exc)
            return -5
        return 0

    def erase(cfg, block):
        try:
            device_erase(block)
        except BaseException as exc:
            failed(exc)
            return -5
        return 0

    def sync(cfg):
        try:
            commits[0] += 1
            device_sync()
        except BaseException as exc:
            failed(exc)
            return -5
        return 0

    return read, prog, erase, sync


def _exact(device, data, size: int, block: int, off: int) -> bytes:
    """Coerce a device's answer to the ``bytes`` the binding copies from, or fail.

    The binding copies ``size`` bytes from the object's buffer without looking at its
    length or type: a short answer would hand littlefs whatever memory follows it.
    """
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data)
        if len(data) == size:
            return data
        raise OSError(
            errno.EIO,
            f"{device!r} returned {len(data)} bytes for a {size}-byte read "
            f"at block {block} offset {off}",
        )
    raise TypeError(f"{device!r}.read returned {type(data).__name__}, not bytes")


def _fast_path(glue: _DeviceCallbacks, device, failed):
    if type(device) is MemoryDevice:
        return _memory_fast_path(glue, device, failed)
    if isinstance(device, BlockDevice) and hasattr(device, "fast_read") and hasattr(device, "fast_prog"):
        return _cached_fast_path(glue, device, failed)
    return None


def _memory_fast_path(glue: _DeviceCallbacks, device: MemoryDevice, failed):
    """Callbacks for a plain, healthy :class:`MemoryDevice` (the tile disk).

    Each littlefs callback otherwise costs two Python calls (glue, then device) and a
    state test; for the tile-local disk that is a large share of littlefs' time. These
    slice the device's buffer themselves and count what the device's methods would have
    counted. The device's bounds checks are not repeated: littlefs checks every request
    against the same geometry before calling back, and a block past the end would still
    be caught here (it has no entry in ``starts`` or ``erase_counts``: a fault like any
    other).

    What a callback costs beyond the copy is mostly new int objects (CPython caches only
    -5..256), so the arithmetic and the counting avoid making them: block offsets come
    from a table, request counts wrap at 256 into a second cell, and bytes are counted
    only for requests of another size than the usual one (littlefs reads whole cache
    lines: on the tile disk, every read is ``read_size``).
    """
    view = device._view
    bs = device.block_size
    erased = device._erased_block
    # Reads slice the object that owns the memory (an mmap of tile SRAM, a bytearray):
    # one copy straight into a bytes/bytearray, instead of a memoryview slice and then
    # a copy. littlefs reads a whole cache line per callback (a 64 KiB file is ~50 of
    # them, its skip-list pointers included), so this is most of the glue's read cost.
    source, base = slicing_source(view)
    if device.block_count <= _OFFSET_TABLE_MAX:
        starts = [block * bs + base for block in range(device.block_count)]
        view_starts = [block * bs for block in range(device.block_count)]
    else:  # a big image: the table would cost more memory than it saves time
        starts = _Offsets(bs, base, device.block_count)
        view_starts = _Offsets(bs, 0, device.block_count)
    unit = glue.unit  # the usual request size: bytes are counted for the others only
    commits = glue.commits
    reads = reads_hi = read_odd = progs = progs_hi = prog_odd = erases = syncs = 0

    def read(cfg, block, off, size):
        nonlocal reads, reads_hi, read_odd
        try:
            reads += 1
            if reads == 256:
                reads_hi += 1
                reads = 0
            if size != unit:
                read_odd += size - unit
            start = starts[block] + off
            return source[start : start + size]
        except BaseException as exc:
            failed(exc)
            return bytes(size)

    def prog(cfg, block, off, data):
        nonlocal progs, progs_hi, prog_odd
        try:
            size = len(data)
            progs += 1
            if progs == 256:
                progs_hi += 1
                progs = 0
            if size != unit:
                prog_odd += size - unit
            start = view_starts[block] + off
            view[start : start + size] = data
        except BaseException as exc:
            failed(exc)
            return -5
        return 0

    def erase(cfg, block):
        nonlocal erases
        try:
            device.erase_counts[block] += 1
            erases += 1
            start = view_starts[block]
            view[start : start + bs] = erased
        except BaseException as exc:
            failed(exc)
            return -5
        return 0

    def sync(cfg):
        nonlocal syncs
        try:
            syncs += 1  # nothing to do: every prog is in the buffer already
            commits[0] += 1
        except BaseException as exc:
            failed(exc)
            return -5
        return 0

    def tally():
        nread = reads_hi * 256 + reads
        nprog = progs_hi * 256 + progs
        return nread, nread * unit + read_odd, nprog, nprog * unit + prog_odd, erases, syncs

    device._add_tally(tally, glue)
    return read, prog, erase, sync


#: devices with more blocks than this compute block offsets instead of looking them up
_OFFSET_TABLE_MAX = 1 << 16


class _Offsets:
    """``offsets[block]``: the table's job, computed (and range-checked) instead."""

    __slots__ = ("_bs", "_base", "_count")

    def __init__(self, bs: int, base: int, count: int):
        self._bs, self._base, self._count = bs, base, count

    def __getitem__(self, block: int) -> int:
        if not 0 <= block < self._count:
            raise IndexError(f"block {block} is outside the device")
        return block * self._bs + self._base


def _cached_fast_path(glue: _DeviceCallbacks, device, failed):
    """Callbacks for a device that keeps blocks in a cache of its own (the striped device).

    A hit is served by the device's ``fast_read``/``fast_prog`` straight from the glue,
    one Python call instead of two: a 64 KiB file is ~50 littlefs reads, and on the chip
    disk most of them hit. A miss (None/False) takes the checked path, through the
    device's own operations (which count it); erase and sync always do.
    """
    fast_read = device.fast_read
    fast_prog = device.fast_prog
    checked_read, checked_prog, checked_erase, checked_sync = glue._checked
    reads = bytes_read = progs = bytes_progged = 0

    def read(cfg, block, off, size):
        nonlocal reads, bytes_read
        try:
            data = fast_read(block, off, size)
            if data is None:
                return checked_read(cfg, block, off, size)
            reads += 1
            bytes_read += size
            return data
        except BaseException as exc:
            failed(exc)
            return bytes(size)

    def prog(cfg, block, off, data):
        nonlocal progs, bytes_progged
        try:
            if not fast_prog(block, off, data):
                return checked_prog(cfg, block, off, data)
            progs += 1
            bytes_progged += len(data)
        except BaseException as exc:
            failed(exc)
            return -5
        return 0

    def tally():
        return reads, bytes_read, progs, bytes_progged, 0, 0

    device._add_tally(tally, glue)
    return read, prog, checked_erase, checked_sync


# -- paths and flags -----------------------------------------------------------------


def _open_flags(flags) -> int:
    result = _FLAGS_SEEN.get(flags)
    if result is None:
        result = _parse_open_flags(flags)
        if len(_FLAGS_SEEN) < 64:
            _FLAGS_SEEN[flags] = result
    return result


_FLAGS_SEEN: dict = {}  # few distinct values ever occur


def _parse_open_flags(flags) -> int:
    """littlefs open flags from a mode string ("r", "w+", "ab", ...) or POSIX ``os.O_*``.

    Unlike littlefs-python's own parser, "a" creates a missing file, as in Python.
    Other POSIX flags (O_CLOEXEC, O_NOFOLLOW, ...) have no littlefs meaning and are ignored.
    """
    if isinstance(flags, str):
        mode = flags.replace("b", "").replace("t", "")
        plus = "+" in mode
        base = mode.replace("+", "")
        if len(base) != 1 or base not in "rwax" or mode.count("+") > 1:
            raise ValueError(f"invalid mode: {flags!r}")
        access = _LFS_RDWR if plus else (_LFS_RDONLY if base == "r" else _LFS_WRONLY)
        extra = {"r": 0, "w": _LFS_CREAT | _LFS_TRUNC, "a": _LFS_CREAT | _LFS_APPEND,
                 "x": _LFS_CREAT | _LFS_EXCL}[base]
        return access | extra
    if not isinstance(flags, int):
        raise TypeError(f"open flags must be a mode string or an int, not {type(flags).__name__}")
    access = flags & os.O_ACCMODE
    if access == os.O_RDONLY:
        result = _LFS_RDONLY
    elif access == os.O_WRONLY:
        result = _LFS_WRONLY
    elif access == os.O_RDWR:
        result = _LFS_RDWR
    else:
        raise ValueError(f"invalid access mode in open flags {flags:#o}")
    if flags & os.O_CREAT:
        result |= _LFS_CREAT
    if flags & os.O_EXCL:
        result |= _LFS_EXCL
    if flags & os.O_TRUNC:
        result |= _LFS_TRUNC
    if flags & os.O_APPEND:
        result |= _LFS_APPEND
    return result


def _mode_text(flags: int) -> str:
    text = {_LFS_RDONLY: "r", _LFS_WRONLY: "w", _LFS_RDWR: "r+"}[flags & 3]
    if flags & _LFS_APPEND:
        text = "a" if flags & 3 == _LFS_WRONLY else "a+"
    return text


# -- the filesystem ------------------------------------------------------------------


class Filesystem:
    """A littlefs filesystem on a :class:`~ipuos.blockdev.BlockDevice`.

    Nothing happens implicitly: call :meth:`format` to create a filesystem and
    :meth:`mount` to use one. Paths are absolute inside the filesystem ("/a/b"; a relative
    path is taken from the root), resolved lexically ("." and ".."), UTF-8 on disk.
    Every failure is an ``OSError`` with a POSIX errno (device faults: EIO).

    Configuration, all in bytes (see ``_config`` for why the defaults are what they are):
    ``read_size``/``prog_size`` (the device's I/O unit), ``cache_size`` (per cache; littlefs
    keeps a read and a write cache plus one per open file), ``lookahead_size`` (allocation
    bitmap), ``block_cycles`` (erase cycles before metadata moves; -1: never),
    ``name_max`` (longest name in bytes), ``metadata_max`` (longest metadata log; 0: a
    whole block).
    """

    def __init__(self, device, *, read_size: int | None = None, prog_size: int | None = None,
                 cache_size: int | None = None, lookahead_size: int | None = None,
                 block_cycles: int = -1, name_max: int = 255, metadata_max: int | None = None):
        self.device = device
        config = _config(device.block_size, device.block_count, read_size, prog_size,
                         cache_size, lookahead_size, block_cycles, name_max, metadata_max)
        self._callbacks = _DeviceCallbacks(device, config["cache_size"])
        self._cfg = lfs.LFSConfig(context=self._callbacks, **config)
        self.name_max = name_max
        self._lfs = None  # an lfs.LFSFilesystem while mounted
        self._mounts = 0  # mounts so far (a remount after ENOSPC included): see commit_mark
        # The busy flag: one token while idle, none while a littlefs call runs. Taking it
        # is a list.pop, atomic under the GIL (no thread or greenlet gets between the test
        # and the set), and never waits; it costs a third of a Lock.acquire(False), which
        # parses its arguments as keywords. Every call pays it, and a file is three calls.
        self._idle = [True]
        self._take = self._idle.pop  # IndexError: busy
        self._give = self._idle.append  # with True
        self._busy_with = ""
        self._open: dict[File, None] = {}  # open files, in the order they were opened
        #: open files removed (or replaced by a rename) while open: no longer littlefs'
        #: (see _Orphan), but open on this filesystem still, as on a host, where they keep
        #: it busy until their last handle is closed
        self._orphans: dict[File, None] = {}
        self._paths: dict[str, str] = {}  # path as given -> canonical path
        #: (operation, path, exception) of the device fault that made the fs unusable
        self._fault: tuple[str, str | None, BaseException] | None = None
        #: littlefs handles of files let go of after a fault without closing them (see
        #: ``_close_locked``): kept until unmount, while littlefs' list still points at them
        self._abandoned: list = []

    def __repr__(self) -> str:
        state = "mounted" if self._lfs is not None else "unmounted"
        if self._fault is not None:
            state += ", faulted"
        return f"<Filesystem on {self.device!r} ({state})>"

    # -- state -------------------------------------------------------------------------

    @property
    def mounted(self) -> bool:
        return self._lfs is not None

    @property
    def fault(self) -> BaseException | None:
        """The device error that left the filesystem unusable until remounted, if any."""
        return self._fault[2] if self._fault is not None else None

    @property
    def open_files(self) -> int:
        """Open file handles, those on a file removed while open included."""
        return len(self._open) + len(self._orphans)

    @property
    def removed_open_files(self) -> int:
        """Open handles on files removed (or replaced by a rename) while open."""
        return len(self._orphans)

    def open_paths(self) -> list[str]:
        """Paths of the open files, each once (a file removed while open has none)."""
        return sorted({f.path for f in self._open if not f._detached})

    def uncommitted(self) -> list[str]:
        """Paths of open files holding writes littlefs has not committed yet: they are on
        no device until flushed or closed (a snapshot of the device lacks them)."""
        return sorted({f.path for f in self._open if f._unsynced and f._can & _LFS_WRONLY})

    @property
    def commit_mark(self) -> tuple[int, int]:
        """A value that stays the same while the blocks in use cannot have been freed:
        littlefs frees blocks only in a commit (every one ends in a device sync, which is
        counted), and a mount may find other bytes on the device. So a filesystem found too
        full for something is still as full while the mark is unchanged, with no walk of it
        (``statvfs``) to tell. (Nearly: an open file truncated shorter holds fewer blocks
        before its commit, so the mark may say full a little longer than it is.)"""
        return self._mounts, self._callbacks.commits[0]

    @property
    def config(self) -> dict:
        """The littlefs configuration in use."""
        cfg = self._cfg
        return {name: getattr(cfg, name) for name in (
            "block_size", "block_count", "read_size", "prog_size", "cache_size",
            "lookahead_size", "name_max", "metadata_max")}

    # -- lifecycle -----------------------------------------------------------------------

    def format(self) -> None:
        """Create an empty filesystem on the device. The filesystem must be unmounted."""
        with self._exclusive("format"):
            if self._lfs is not None:
                raise _error(errno.EBUSY, message="cannot format a mounted filesystem")
            self._callbacks.reset()
            self._lifecycle_call("format", lfs.format, lfs.LFSFilesystem(), self._cfg)

    def mount(self) -> None:
        """Mount an existing filesystem. An unformatted or corrupt device raises
        :class:`CorruptFilesystemError` and is left untouched: nothing formats it."""
        with self._exclusive("mount"):
            if self._lfs is not None:
                raise _error(errno.EBUSY, message="filesystem is already mounted")
            self._callbacks.reset()
            handle = lfs.LFSFilesystem()
            self._lifecycle_call("mount", lfs.mount, handle, self._cfg)
            self._lfs = handle
            self._mounts += 1
            self._fault = None

    def unmount(self) -> None:
        """Close every open file (committing its writes), then unmount.

        The filesystem ends up unmounted even if a close fails; the first such error is
        raised afterwards so no lost write goes unreported.
        """
        with self._exclusive("unmount"):
            if self._lfs is None:
                raise _error(errno.EINVAL, message="filesystem is not mounted")
            first_error = None
            faulted = self._fault is not None  # already reported; closes cannot succeed
            for file in list(self._open):
                committed = "were committed"
                try:
                    self._close_locked(file)
                except OSError as exc:
                    committed = "could not be committed"
                    if not faulted:
                        first_error = first_error or exc
                if file.lost is None:  # later use is EIO saying why, not "closed file"
                    file.lost = (f"the filesystem was unmounted while this file was open (its "
                                 f"writes {committed}); open it again")
            _lose_orphans(self, "the filesystem was unmounted while this file, removed while "
                                "open, was open: its content is gone")
            handle, self._lfs = self._lfs, None
            device_failed = self._fault is not None or self._callbacks.fault is not None
            self._callbacks.refusing = True  # unmount only frees memory; make sure of it
            try:
                lfs.unmount(handle)
            except LittleFSError:
                pass
            self._abandoned.clear()
            self._callbacks.reset()
            if device_failed:
                # a device that failed may hold blocks in a cache of its own that never
                # reached it: the next mount must see what the device really holds
                drop = getattr(self.device, "drop_cache", None)
                dropped = drop() if drop is not None else 0
                if dropped:
                    first_error = WritesLostError(
                        errno.EIO, f"{dropped} cached pages written since {self.device!r} last wrote "
                        "its cache back could not be written (the device failed) and were dropped: "
                        "what changed since then is as it was before")
            self._fault = None
            if first_error is not None:
                raise first_error

    def release(self) -> None:
        """Free littlefs' memory without writing anything: for a filesystem whose device
        goes away with its machine (a mounted littlefs holds buffers nothing else frees).
        Open files are lost; the filesystem is unmounted."""
        if self._lfs is None:
            return
        for file in list(self._open):
            _lose(file, "the filesystem was released with its machine")
        _lose_orphans(self, "the filesystem was released with its machine")
        handle, self._lfs = self._lfs, None
        self._callbacks.refusing = True
        try:
            lfs.unmount(handle)
        except LittleFSError:
            pass
        self._abandoned.clear()

    def __enter__(self) -> "Filesystem":
        return self

    def __exit__(self, *exc_info) -> None:
        if self._lfs is not None:
            self.unmount()

    # -- files ---------------------------------------------------------------------------

    def open(self, path: str, flags="r") -> "File":
        """Open a file. ``flags``: a mode string ("r", "w", "a", "x", with "+"/"b"), or
        ``os.O_*`` flags. The file must be closed; unclosed files are closed at unmount."""
        lfs_flags = _open_flags(flags)
        path = self._paths.get(path) or self._path(path)
        return self._run("open", path, None, self._open_locked, path, lfs_flags)

    def _open_locked(self, handle, path: str, lfs_flags: int) -> "File":
        # registered inside the exclusive call, so an unmount can never miss a file that
        # littlefs has in its open list
        others = self._handles_on(path) if self._open else ()
        for other in others:
            if other._unsynced:  # the new handle must see what the others wrote
                _sync(handle, other)  # (notes its position: a failed commit moves it)
                other._unsynced = False
                self._committed(other)
        commits = self._callbacks.commits
        before = commits[0]
        file = File(self, lfs.file_open(handle, path, lfs_flags, _ENCODING), path, lfs_flags)
        # littlefs commits a new file's name inside open, and nothing else open does
        # commits (barring a repair after power loss): an open that committed created
        file.created = commits[0] != before
        if file.created:
            file._journal = []  # (nothing to truncate)
        self._open[file] = None
        if others:  # shared from now on: see File
            file._shared = True
            for other in others:
                other._shared = True
            if file._unsynced:  # opened truncating: the others see the empty file at once
                try:
                    lfs.file_sync(handle, file._handle)
                except BaseException:
                    # nobody will have this File: it must not stay open (the call may be
                    # tried again after a remount, which would carry it across)
                    self._open.pop(file, None)
                    self._let_go(file)
                    self._reshare()
                    raise
                file._unsynced = False
                self._committed(file)
                # and let go of the old version now (all are clean: synced above), as a
                # host frees a truncated file's blocks: littlefs keeps them for as long as
                # a handle's view lies in them, and the rewrite may need the room
                for other in others:
                    try:
                        _refresh(handle, other)
                    except LittleFSError:
                        pass  # (that handle is lost, and says why when used: this open stands)
        return file

    def _handles_on(self, path: str) -> list:
        """The usable open files whose path still names their file."""
        return [f for f in self._open if f.path == path and f._can]

    def _committed(self, file: "File") -> None:
        """``file`` has just committed changes: every other handle on its path must look
        again before it next uses the file (littlefs gives each handle its own view)."""
        file._accepted = False
        file._journal, file._journal_bytes = [], 0
        path = file.path
        for other in self._open:
            if other is not file and other.path == path:
                other._stale = True

    # -- names ---------------------------------------------------------------------------

    def stat(self, path: str) -> FileInfo:
        path = self._path(path)
        info = _info(self._run("stat", path, None, lfs.stat, path, _ENCODING))
        if not info.is_dir and any(f._unsynced for f in self._open):  # (no extra call otherwise)
            size = self._run("stat", path, None, _unsynced_sizes, self).get(path.rstrip("/"))
            if size is not None:
                info = info._replace(size=size)
        return info

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def scandir(self, path: str = "/") -> list[FileInfo]:
        """The entries of a directory (without "." and ".."), in littlefs order."""
        path = self._path(path)
        return self._with_unsynced_sizes(path, self._run("scandir", path, None, _read_directory, path))

    def scandir_mtimes(self, path: str = "/") -> list[tuple[FileInfo, int | None]]:
        """:meth:`scandir` with each entry's mtime (None if never set).

        littlefs looks a name up by walking its directory from the first metadata pair,
        so asking it for each entry's mtime is quadratic in the directory's size (and on
        the chip disk, a walk longer than the cache misses every pair); the directory's
        logs are read once instead (see ``_lfsdir``), and littlefs is asked per entry only
        when they do not show exactly what it listed.
        """
        path = self._path(path)
        entries, stored = self._run("scandir", path, None, _read_directory_attribute, path,
                                    self, MTIME_ATTRIBUTE)
        base = path.rstrip("/") + "/"
        if stored is None:
            mtimes = [self.get_mtime(base + info.name) for info in entries]
        else:
            mtimes = [None if data is None else _decode_mtime(data, base + info.name)
                      for info, data in zip(entries, stored)]
        return list(zip(self._with_unsynced_sizes(path, entries), mtimes))

    def _with_unsynced_sizes(self, path: str, entries: list[FileInfo]) -> list[FileInfo]:
        """``entries`` of directory ``path`` with the sizes open files have not committed."""
        if self._open and any(f._unsynced for f in self._open):
            sizes = self._run("scandir", path, None, _unsynced_sizes, self)
            base = path.rstrip("/") + "/"
            for index, info in enumerate(entries):
                size = sizes.get(base + info.name)
                if size is not None and not info.is_dir:
                    entries[index] = info._replace(size=size)
        return entries

    def listdir(self, path: str = "/") -> list[str]:
        return [entry.name for entry in self.scandir(path)]

    def mkdir(self, path: str) -> None:
        path = self._path(path)
        self._run("mkdir", path, None, lfs.mkdir, path, _ENCODING)

    def remove(self, path: str) -> None:
        """Delete a file (EISDIR for a directory: use :meth:`rmdir`)."""
        path = self._path(path)
        named = self._named(path)
        if named:
            self._run("remove", path, None, _orphaning, self, named, _remove_typed, path, False)
        else:
            self._run("remove", path, None, _remove_typed, path, False)

    unlink = remove

    def rmdir(self, path: str) -> None:
        """Delete an empty directory (ENOTDIR for a file, ENOTEMPTY if not empty)."""
        path = self._path(path)
        self._run("rmdir", path, None, _remove_typed, path, True)

    def rename(self, src: str, dst: str) -> None:
        """Move ``src`` to ``dst`` atomically, replacing a file or an empty directory."""
        src, dst = self._path(src), self._path(dst)
        inside = dst.rstrip("/").startswith(src.rstrip("/") + "/")
        base = src.rstrip("/")
        # (not a file removed or replaced while open: its old path names another file now)
        moving = [file for file in self._open
                  if file._handle is not None
                  and (file.path == base or file.path.startswith(base + "/"))]
        replaced = [file for file in self._open
                    if file.path == dst.rstrip("/") and file not in moving]
        operation = (_rename_open, src, dst, inside, moving) if moving else (_rename, src, dst, inside)
        if replaced:
            self._run("rename", src, dst, _orphaning, self, replaced, *operation)
        else:
            self._run("rename", src, dst, *operation)

    def _named(self, path: str) -> list:
        """The open files whose path still names their file."""
        return [f for f in self._open if f.path == path]

    def _reshare(self) -> None:
        """Work out again which open files share their file with another handle (after a
        sharer was closed, lost, removed or replaced)."""
        paths = collections.Counter(f.path for f in self._open if f._can)
        for f in self._open:
            f._shared = bool(f._can) and paths[f.path] > 1

    # -- attributes ----------------------------------------------------------------------

    def get_mtime(self, path: str) -> int | None:
        """The mtime stored with ``set_mtime`` (ns since the epoch), or None if never set."""
        data = self.get_attribute(path, MTIME_ATTRIBUTE)
        return None if data is None else _decode_mtime(data, path)

    def set_mtime(self, path: str, mtime_ns: int) -> None:
        if not MTIME_MIN_NS <= mtime_ns <= MTIME_MAX_NS:
            raise ValueError(f"mtime {mtime_ns} ns does not fit in 64 bits")
        self.set_attribute(path, MTIME_ATTRIBUTE, _MTIME.pack(mtime_ns))

    def get_attribute(self, path: str, kind: int) -> bytes | None:
        """A littlefs custom attribute (``kind`` 0-255), or None if the entry has none."""
        path = self._path(path)
        try:
            return self._run("getattr", path, None, lfs.getattr, path, _attr_kind(kind), _ENCODING)
        except OSError as exc:
            if exc.errno == errno.ENODATA:
                return None
            raise

    def set_attribute(self, path: str, kind: int, data: bytes) -> None:
        path = self._path(path)
        data = bytes(data)
        if not data:
            # littlefs could, but the binding indexes data[0] and raises IndexError
            raise ValueError("littlefs-python cannot store an empty attribute")
        if len(data) > _ATTR_MAX:
            raise _error(errno.E2BIG, path, f"attribute of {len(data)} bytes exceeds {_ATTR_MAX}")
        self._run("setattr", path, None, lfs.setattr, path, _attr_kind(kind), data, _ENCODING)

    def remove_attribute(self, path: str, kind: int) -> None:
        path = self._path(path)
        self._run("removeattr", path, None, lfs.removeattr, path, _attr_kind(kind), _ENCODING)

    # -- the filesystem as a whole ----------------------------------------------------------

    def statvfs(self) -> FsInfo:
        """Geometry and usage. ``blocks_used`` walks the filesystem (cost grows with size)."""
        info = self._run("statvfs", None, None, lfs.fs_stat)
        # (littlefs counts an open file's blocks and the copies its rewrites made apart,
        # so its count can pass the disk's: never more than all of it, never less than none free)
        used = min(self._run("statvfs", None, None, lfs.fs_size), info.block_count)
        major, minor = divmod(info.disk_version, 0x10000)
        return FsInfo(info.block_size, info.block_count, used, info.block_count - used,
                      info.name_max, info.file_max, info.attr_max, f"{major}.{minor}")

    # -- the one way into littlefs ---------------------------------------------------------

    def _run(self, op: str, path, path2, func, *args):
        """Call ``func(lfs_handle, *args)`` as one exclusive littlefs operation.

        Checks the filesystem is mounted and healthy, translates littlefs errors, and turns
        a device fault recorded by the callbacks into EIO (or re-raises a BaseException
        such as KeyboardInterrupt unchanged) once littlefs has unwound.
        """
        try:
            self._take()
        except IndexError:
            raise self._busy_error(op) from None
        try:
            self._busy_with = op
            handle = self._lfs
            if handle is None or self._fault is not None:
                raise self._unusable_error(path)
            try:
                result = func(handle, *args)
            except BaseException as exc:
                # returns only when the remount that follows ENOSPC may have made room
                # (see _call_failed): the call is tried once more
                self._call_failed(op, path, path2, exc, args[0] if args else None,
                                  rerun=_names_only(func, self))
                try:
                    result = func(self._lfs, *args)
                except BaseException as again:
                    self._call_failed(op, path, path2, again, args[0], retry=False)
            if self._callbacks.fault is not None:
                self._raise_fault(op, path)
            return result
        finally:
            self._give(True)

    def _call_failed(self, op: str, path, path2, exc: BaseException, culprit=None, retry=True,
                     rerun=False):
        """Raise what a littlefs call that raised ``exc`` amounts to. The caller holds the
        filesystem; ``culprit`` is the :class:`File` (or littlefs file handle) the call
        was about, if any.

        A device fault recorded by the callbacks wins (EIO naming it, or the
        BaseException itself); ENOSPC-like errors remount (see ``_remount_after_nospc``),
        and, if ``retry``, this returns so that the caller tries once more when the call
        may fit now: the remount committed writes the culprit had pending, or the call
        only names entries (``rerun``: a create, mkdir, attribute, or a plain remove or
        rename whose source is still there) and so failed atomically. littlefs' block
        allocator gives up once it has looked at as many blocks as the disk has since
        the operation began, without looking again at blocks freed since it last
        scanned: on a small disk a create could fail with half the disk free, and the
        same call succeed from a fresh mount's fresh scan. Every littlefs code becomes
        an ``OSError`` with its errno.
        """
        callbacks = self._callbacks
        if isinstance(exc, LittleFSError):
            if callbacks.fault is not None:
                self._raise_fault(op, path)
            if exc.code in _COMMIT_FAILURES:
                replayed = self._remount_after_nospc(op, path, culprit=culprit)
                # (retried with the same arguments: only a call given the File, which
                # has a new littlefs handle now, not the old handle itself)
                if replayed and retry and type(culprit) is File and exc.code != _LFS_ERR_NAMETOOLONG:
                    return
                if rerun and retry and self._lfs is not None and self._fault is None:
                    if op not in ("remove", "rmdir", "rename") or _exists(self._lfs, path):
                        return
                if exc.code == _LFS_ERR_NAMETOOLONG:
                    raise _no_room_for_entry(path) from None
            elif type(culprit) is File:  # (no remount: where it was is where it is)
                culprit._resume_at = None
            raise translate_error(exc, path, path2) from None
        if callbacks.fault is not None:
            self._fault = (op, path, callbacks.fault)
        raise exc

    def _lifecycle_call(self, op: str, func, *args) -> None:
        """format/mount: like ``_run`` but without a mounted filesystem. Caller is exclusive."""
        callbacks = self._callbacks
        try:
            func(*args)
        except LittleFSError as exc:
            if callbacks.fault is None:
                error = translate_error(exc)
                if op == "mount" and isinstance(error, CorruptFilesystemError):
                    error = CorruptFilesystemError(
                        errno.EIO, f"no valid littlefs filesystem on {self.device!r}")
                elif op == "mount" and error.errno == errno.EINVAL:
                    error = OSError(
                        errno.EINVAL,
                        f"the filesystem on {self.device!r} was made with a different block "
                        f"size, block count or name/file/attribute limits",
                    )
                raise error from None
        if callbacks.fault is not None:
            cause = callbacks.fault
            callbacks.reset()
            if not isinstance(cause, Exception):
                raise cause
            raise OSError(errno.EIO, f"device error during {op}: {cause}") from cause

    def _remount_after_nospc(self, op: str, path, culprit=None) -> bool:
        """Unmount and mount again after a failed commit, resetting littlefs' caches (see
        the module doc), and carry every open file across. Caller holds the filesystem
        exclusively; ``culprit`` is the :class:`File` (or littlefs handle) whose own call
        failed.

        A file with nothing uncommitted is opened again where it was. A file with writes
        pending has them applied again from its journal and committed: on a host they
        would sit in the page cache, and a write its user was told succeeded must not be
        lost because another write ran out of space. Only a file whose journal does not
        fit either is lost (EIO saying why, or, for the culprit, ENOSPC from its sync and
        close). (A file removed while open is no longer littlefs': see _Orphan.)

        Returns whether its failed call may fit now: the culprit had writes pending
        that are committed now (a rewrite frees the old blocks only then), or another
        handle's out-of-date view of a file, which held that version's blocks, was let go.
        """
        where = f" of {path!r}" if path else ""
        lost = (f"the filesystem ran out of space during {op}{where} and had to be remounted; "
                "writes to this file since it was last synced are lost; open it again")
        carried = []  # (file, position to reopen it at)
        culprit_file = None
        for file in self._open:
            if culprit is not None and (file is culprit or file._handle is culprit):
                culprit_file = file
            position = file._resume_at
            if file._handle is None and position is None:
                continue  # (no longer littlefs' at all)
            if position is None:
                position = lfs.file_tell(self._lfs, file._handle)
            file._resume_at = None
            carried.append((file, position))
        going_on = {file for file, _ in carried}
        for file in self._open:
            if file not in going_on:
                _lose_after_nospc(file, lost, file is culprit_file)
            self._let_go(file)
        self._open.clear()
        replayed = freed = False
        while True:
            handle = self._mount_afresh(op, path)
            if handle is None:
                for file, _ in carried:
                    _lose_after_nospc(file, lost, file is culprit_file)
                return False
            restart = None
            for index, (file, position) in enumerate(carried):
                try:
                    if file._journal:
                        _replay(handle, file, position)
                        self._committed(file)
                        replayed = replayed or file is culprit_file
                    else:
                        _reopen(handle, file, file.path, position)
                        # (a call that failed may have marked it: nothing is pending)
                        file._unsynced = file._accepted = False
                        # its old view held blocks: the call may fit now (it stays stale:
                        # its next use looks again, as an appender must)
                        freed = freed or file._stale
                except LittleFSError as exc:
                    _lose_after_nospc(file, lost, file is culprit_file)
                    if exc.code in _COMMIT_FAILURES:  # the caches are dirty again
                        restart = index
                        break
                    # otherwise its name is gone (removed by what failed, which committed)
                else:
                    self._open[file] = None
            if self._callbacks.fault is not None:
                self._fault = (op, path, self._callbacks.fault)
                for file, _ in carried:
                    _lose_after_nospc(file, lost, file is culprit_file)
                self._open.clear()
                return False
            if restart is None:
                break
            # the files done so far have committed: carry them, and the rest, to a fresh mount
            done = [(f, lfs.file_tell(handle, f._handle)) for f, _ in carried[:restart] if f in self._open]
            for file, _ in done:
                self._let_go(file)
            self._open.clear()
            carried = done + carried[restart + 1:]
        self._reshare()
        return (replayed or freed) and culprit_file in self._open

    def _let_go(self, file: "File") -> None:
        """Drop ``file``'s littlefs handle without closing it (closing would commit). The
        handle object stays alive until the next unmount: littlefs keeps every open file
        in a list it walks, and freeing one still on that list is a use after free."""
        if file._handle is not None:
            self._abandoned.append(file._handle)
            file._handle = None

    def _mount_afresh(self, op: str, path):
        """Let go of the mounted littlefs without writing anything, and mount the device
        again; the new handle, or None (the filesystem is faulted) if that failed."""
        old, self._lfs = self._lfs, None
        callbacks = self._callbacks
        callbacks.refusing = True  # unmount only frees memory; nothing may be written
        try:
            lfs.unmount(old)
        except LittleFSError:
            pass
        self._abandoned.clear()
        callbacks.reset()
        handle = self._lfs = lfs.LFSFilesystem()
        self._mounts += 1
        try:
            lfs.mount(handle, self._cfg)
        except LittleFSError as exc:
            # nothing left to use: report it like a device fault until someone remounts
            self._fault = (op, path, OSError(errno.EIO, f"remount after ENOSPC failed: {exc}"))
            return None
        if callbacks.fault is not None:
            self._fault = (op, path, callbacks.fault)
            return None
        return handle

    def _raise_fault(self, op: str, path) -> None:
        cause = self._callbacks.fault
        self._fault = (op, path, cause)
        if not isinstance(cause, Exception):  # KeyboardInterrupt, GreenletExit, SystemExit
            raise cause
        raise OSError(errno.EIO, f"device error during {op}: {cause}", path) from cause

    def _unusable_error(self, path) -> OSError:
        if self._lfs is None:
            return _error(errno.EINVAL, path, "filesystem is not mounted")
        return self._faulted_error(path)

    def _faulted_error(self, path) -> OSError:
        op, fault_path, cause = self._fault
        where = f" {fault_path!r}" if fault_path else ""
        error = OSError(
            errno.EIO,
            f"filesystem unusable after a device error during {op}{where} ({cause}); "
            f"unmount and mount it again",
            path,
        )
        error.__cause__ = cause
        return error

    def _busy_error(self, op: str) -> FilesystemBusyError:
        return FilesystemBusyError(
            f"{op}: the filesystem on {self.device!r} is busy with {self._busy_with}; "
            f"littlefs is not re-entrant and only its owner may call it, one call at a time"
        )

    def _exclusive(self, op: str):
        return _Exclusive(self, op)

    def _path(self, path) -> str:
        """The canonical absolute form of ``path``; names over ``name_max`` bytes refused."""
        canonical = self._paths.get(path)
        if canonical is None:
            canonical = self._canonical(path)
            if len(self._paths) >= 512:  # bounded: programs rarely touch many more names
                self._paths.clear()
            self._paths[path] = canonical
        return canonical

    def _canonical(self, path) -> str:
        path = os.fspath(path)
        if not isinstance(path, str):
            raise TypeError(f"paths are str, not {type(path).__name__}")
        if not path:
            raise _error(errno.ENOENT, path)
        if "\0" in path:
            raise ValueError("embedded null character in path")
        # a trailing slash stays: littlefs then insists on a directory (ENOTDIR otherwise)
        trailing = path.endswith("/") and path.strip("/") != ""
        path = posixpath.normpath("/" + path)
        if path.startswith("//"):
            path = path[1:]
        for name in path.split("/"):
            if len(name) > self.name_max // 4 and len(name.encode(_ENCODING)) > self.name_max:
                raise _error(errno.ENAMETOOLONG, path)
        return path + "/" if trailing else path

    # -- file operations (called by File) ------------------------------------------------

    def _close_locked(self, file: "File") -> None:
        """Close ``file`` in littlefs. Caller holds the filesystem exclusively.

        littlefs unlinks the handle whether or not the final sync succeeds, so the File is
        marked closed first and forgotten only after littlefs has let go of it.
        """
        file.closed = True
        file._can = 0
        file._stale = False
        if self._lfs is None:  # unmount closed it already
            return
        callbacks = self._callbacks
        try:
            if self._fault is not None:
                # After a device error littlefs may still hold the failed commit in its
                # program cache, and closing a file with writes would program past it: an
                # assertion, and the process aborts. So the file is only let go of.
                if file._handle is not None:
                    self._abandoned.append(file._handle)
                raise self._faulted_error(file.path)
            try:
                lfs.file_close(self._lfs, file._handle)
            except BaseException as exc:
                if not isinstance(exc, LittleFSError) or exc.code not in _COMMIT_FAILURES:
                    self._call_failed("close", file.path, None, exc)
                self._close_after_nospc(file, exc)
            if callbacks.fault is not None:
                self._raise_fault("close", file.path)
            if file._unsynced:
                self._committed(file)
        finally:
            self._open.pop(file, None)
            file._handle = None
            if file._shared:
                self._reshare()

    def _close_after_nospc(self, file: "File", exc: LittleFSError) -> None:
        """The final commit of closing ``file`` ran out of space. littlefs has let go of
        the handle, and with it what the file had pending: the remount carries the file
        across like any open one (from its journal), and it is closed again from there."""
        file._resume_at = 0
        try:
            self._call_failed("close", file.path, None, exc, file)  # returns if carried across
            try:
                lfs.file_close(self._lfs, file._handle)
            except BaseException as again:
                self._let_go(file)  # (littlefs has let go of it: keep the object till unmount)
                self._call_failed("close", file.path, None, again, retry=False)
            file._handle = None
        finally:
            if file._handle is not None:  # opened again, but nothing was replayed: let go
                self._let_go(file)
            self._open.pop(file, None)


class _Exclusive:
    """Context manager form of the busy flag, for format/mount/unmount."""

    __slots__ = ("fs", "op")

    def __init__(self, fs: Filesystem, op: str):
        self.fs, self.op = fs, op

    def __enter__(self):
        try:
            self.fs._take()
        except IndexError:
            raise self.fs._busy_error(self.op) from None
        self.fs._busy_with = self.op

    def __exit__(self, *exc_info):
        self.fs._give(True)


def check_mounts(data, block_size: int) -> None:
    """Mount the littlefs image ``data`` (any bytes-like object) and unmount it again,
    writing nothing: CorruptFilesystemError if it does not mount as a :class:`Filesystem`
    with the default configuration would, OSError(EROFS) if mounting would write to it.

    A restore checks every device of an image this way before touching any tile; a
    Filesystem costs ~7x as much to set up as the check itself, which needs none of it.
    """
    image = _ReadOnlyImage(data, block_size)
    size = image.size
    if size % block_size:
        raise ValueError(f"an image of {size} B is not a whole number of {block_size} B blocks")
    config = _config(block_size, size // block_size, None, None, None, None, -1, 255, None)
    handle = lfs.LFSFilesystem()
    try:
        lfs.mount(handle, lfs.LFSConfig(context=image, **config))
        lfs.unmount(handle)
    except LittleFSError as exc:
        if image.writes:
            raise OSError(errno.EROFS, "mounting it would write to it") from None
        error = translate_error(exc)
        if isinstance(error, CorruptFilesystemError):
            raise CorruptFilesystemError(errno.EIO, "no valid littlefs filesystem on it") from None
        raise error from None
    if image.writes:
        raise OSError(errno.EROFS, "mounting it would write to it")


class _ReadOnlyImage:
    """littlefs callbacks over an image in memory that refuse (and count) every write."""

    __slots__ = ("_source", "_base", "size", "_bs", "writes")

    def __init__(self, data, block_size: int):
        view = memoryview(data).cast("B")
        self._source, self._base = slicing_source(view)
        self.size = view.nbytes
        self._bs = block_size
        self.writes = 0

    def read(self, cfg, block, off, size):
        start = self._base + block * self._bs + off
        return self._source[start : start + size]

    def prog(self, cfg, block, off, data):
        self.writes += 1
        return _LFS_ERR_IO

    def erase(self, cfg, block):
        self.writes += 1
        return _LFS_ERR_IO

    def sync(self, cfg):
        return 0


#: the longest metadata log by default (see ``_config``)
_METADATA_LOG = 4096


def read_unit(block_size: int) -> int:
    """littlefs' read size by default (see :func:`_config`): the block, or its largest
    part up to 4 KiB. Every small read it makes (a skip-list pointer, a metadata tag)
    reads at least this much, so a device sees reads of this size or more."""
    return _largest_part(block_size, 4096)


def _largest_part(block_size: int, most: int) -> int:
    """The block, or the largest part of it got by halving, up to ``most`` bytes."""
    unit = block_size
    while unit > most and unit % 2 == 0:
        unit //= 2
    return unit


def _config(block_size, block_count, read_size, prog_size, cache_size, lookahead_size,
            block_cycles, name_max, metadata_max) -> dict:
    """Checked LFSConfig arguments (littlefs asserts, i.e. aborts, on inconsistent ones).

    Defaults, for SRAM and host files (byte-addressable, nothing wears out), measured on
    60 files in a directory and 64 KiB files, 512 B and 4 KiB blocks:

    * cache_size = block_size, up to 64 KiB: one callback per block of file data (file
      data starts past a block's skip-list pointers, so littlefs reads it through its
      cache, a line at a time). littlefs keeps a read and a write cache plus one per
      open file, in host RAM, not tile SRAM. On the chip disk's 16 KiB blocks, against
      4 KiB lines: 32 MiB written 84 -> 110 MB/s, read 134 -> 169 MB/s, creates 1,511
      -> 1,806/s (host client, best of 6 taken in turn, on a busy host); from tile 0,
      64 and 256 KiB files written 1.15-1.21x and read 1.17-1.37x as fast, but 4 KiB
      files read 0.72x: a small file's read fills a whole line, so its whole block
      comes from the stripes (the striped cache keeps the first 4 KiB of blocks).
    * read_size = the block, up to 4 KiB (:func:`read_unit`): littlefs fills its read
      cache from at least that much when it scans metadata, so a whole-block read
      replaces many small ones; each Python callback costs far more than copying 4 KiB.
      Creating files got 3-5x faster than with 16. File data reads fill whole lines.
    * prog_size 16: metadata commits are padded to prog_size, so a small unit packs more
      commits into a metadata block (fewer compactions); 64 and up measured slower.
    * metadata_max 4 KiB in bigger blocks: every open fetches its directory, and a fetch
      checks the metadata log's CRC from its start, so a log as long as a 16 KiB block
      (the chip disk's) made opening a small file there 3-6x slower than a log of 4 KiB
      (measured: 4 KiB files written and read back). Files inline in their directory up
      to metadata_max / 8 bytes (512 for a 4 KiB log, instead of 1022). Only commits and
      compaction heed it: an image written with any other value mounts as it is.
    * lookahead covering every block: one allocation scan finds all free blocks.
    * block_cycles -1: SRAM does not wear, so moving metadata for wear only costs time.
    """
    if block_size < 128:
        raise ValueError(f"littlefs needs blocks of at least 128 bytes, not {block_size}")
    if block_count < 2:
        raise ValueError("littlefs needs at least 2 blocks")
    if cache_size is None:
        cache_size = _largest_part(block_size, 64 * 1024)
    if read_size is None:
        read_size = math.gcd(read_unit(block_size), cache_size)
    if prog_size is None:  # (of the read size: a metadata log is whole read and prog units)
        prog_size = math.gcd(16, read_size)
    if lookahead_size is None:
        lookahead_size = max(8, -(-block_count // 64) * 8)
    if metadata_max is None:  # a 4 KiB log in bigger blocks, in whole read units
        metadata_max = -(-_METADATA_LOG // read_size) * read_size if block_size > _METADATA_LOG else 0
    for name, value in (("read_size", read_size), ("prog_size", prog_size),
                        ("cache_size", cache_size), ("lookahead_size", lookahead_size)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
    if cache_size % read_size or cache_size % prog_size:
        raise ValueError(f"cache_size {cache_size} must be a multiple of read_size and prog_size")
    if block_size % cache_size:
        raise ValueError(f"block size {block_size} must be a multiple of cache_size {cache_size}")
    if lookahead_size % 8:
        raise ValueError(f"lookahead_size must be a multiple of 8, not {lookahead_size}")
    unit = read_size * prog_size // math.gcd(read_size, prog_size)
    if not isinstance(metadata_max, int) or metadata_max < 0 or (metadata_max and (
            block_size % metadata_max or metadata_max % unit)):
        raise ValueError(f"metadata_max must be 0 or a multiple of read_size and prog_size ({unit}) "
                         f"that divides the block size {block_size}, not {metadata_max!r}")
    if block_cycles == 0:
        raise ValueError("block_cycles must be positive, or -1 to disable wear levelling")
    if not 1 <= name_max <= 1022:
        raise ValueError("name_max must be between 1 and 1022")
    return dict(block_size=block_size, block_count=block_count, read_size=read_size,
                prog_size=prog_size, cache_size=cache_size, lookahead_size=lookahead_size,
                block_cycles=block_cycles, name_max=name_max, metadata_max=metadata_max)


def _attr_kind(kind: int) -> int:
    if not isinstance(kind, int) or not 0 <= kind <= 255:
        raise ValueError(f"attribute type must be an int 0-255, not {kind!r}")
    return kind


def _info(info) -> FileInfo:
    if info.type == _LFS_TYPE_DIR:
        return FileInfo(info.name, True, 0)  # littlefs leaves a directory's size undefined
    return FileInfo(info.name, False, info.size)


def _read_directory(handle, path: str) -> list[FileInfo]:
    directory = lfs.dir_open(handle, path, _ENCODING)
    entries = []
    try:
        while True:
            info = lfs.dir_read(handle, directory, _ENCODING)
            if info is None:
                break
            if info.name != "." and info.name != "..":
                entries.append(_info(info))
    finally:
        lfs.dir_close(handle, directory)
    return entries


#: entries from which reading a directory's logs once beats asking littlefs per entry:
#: each lookup walks the directory, but the logs are parsed in Python (on a tile disk,
#: 1 entry: 131 us against 40; 16: 599 against 605; 200: 3.7 ms against 16 ms)
_ONE_PASS_FROM = 16


def _read_directory_attribute(handle, path: str, fs: Filesystem, kind: int):
    """``(entries, attributes)``: attribute ``kind`` of each entry as the directory's logs
    hold it, or None for the caller to ask littlefs (see ``_lfsdir``; always for a small
    directory, see ``_ONE_PASS_FROM``). Reading the logs goes to the device directly: a
    device error there also means asking littlefs, whose callbacks report it properly."""
    entries = _read_directory(handle, path)
    if len(entries) < _ONE_PASS_FROM:
        return entries, None
    cfg = fs._cfg
    try:
        stored = directory_attribute(fs.device.read, cfg.block_count, cfg.block_size,
                                     cfg.metadata_max or cfg.block_size, path, entries, kind)
    except Exception:
        stored = None
    return entries, stored


def _decode_mtime(data: bytes, path: str) -> int:
    if len(data) != _MTIME.size:
        raise CorruptFilesystemError(errno.EIO, "malformed mtime attribute", path)
    return _MTIME.unpack(data)[0]


def _parent_dir(handle, path: str) -> None:
    """ENOENT or ENOTDIR if ``path``'s parent is missing or not a directory."""
    parent = posixpath.dirname(path.rstrip("/")) or "/"
    if parent != "/" and lfs.stat(handle, parent, _ENCODING).type != _LFS_TYPE_DIR:
        raise LittleFSError(-20)  # ENOTDIR


def _rename(handle, src: str, dst: str, dst_inside_src: bool) -> None:
    # both parents first, then the source: the order Linux reports errors in
    _parent_dir(handle, src)
    _parent_dir(handle, dst)
    # littlefs moves a directory into its own subtree, which orphans it: refuse (POSIX
    # EINVAL). For a file source, littlefs' own answer (ENOTDIR) is the right one.
    if dst_inside_src and lfs.stat(handle, src, _ENCODING).type == _LFS_TYPE_DIR:
        lfs.stat(handle, posixpath.dirname(dst.rstrip("/")) or "/", _ENCODING)  # ENOENT first, as on Linux
        raise OSError(errno.EINVAL, "cannot move a directory into itself", src, None, dst)
    # a trailing slash on the destination asks for a directory: a file source is ENOTDIR
    # whatever the destination is, as on Linux (littlefs says EISDIR for "dir/", and the
    # check below ENOTEMPTY), only a missing source being said first
    if src.rstrip("/").startswith(dst.rstrip("/") + "/"):
        is_dir = lfs.stat(handle, src, _ENCODING).type == _LFS_TYPE_DIR  # (ENOENT first)
        if dst.endswith("/") and not is_dir:
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), src, None, dst)
        # onto a directory it is in, which is therefore not empty (Linux says so whatever
        # the types; littlefs said EISDIR)
        raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), src, None, dst)
    try:
        lfs.rename(handle, src, dst, _ENCODING)
    except LittleFSError as exc:
        if exc.code == _LFS_ERR_ISDIR and dst.endswith("/"):  # a file onto "dir/"
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), src, None, dst) from None
        raise


def _rename_open(handle, src: str, dst: str, dst_inside_src: bool, files: list) -> None:
    """``_rename`` with ``files`` open at or below ``src``. A littlefs handle keeps the
    directory entry it was opened at, and what it commits after a rename of that entry
    is lost: so each is committed and closed first, and opened again (at the same
    position) under its new name afterwards, or its old one if the rename failed.

    If the device fails on the way, a file that could not be committed, or not opened
    again, is lost (EIO saying so from then on): littlefs has let go of its handle, and
    handing that handle back to littlefs would abort the process. A commit that runs out
    of space instead leaves the file to the remount that follows (see
    ``Filesystem._remount_after_nospc``), as ``_reopen_in_place`` does: it is opened again
    at its position with its pending writes, or lost saying the disk was full."""
    closed = []
    base = new_base = src.rstrip("/")
    try:
        for file in files:
            position = file._resume_at = lfs.file_tell(handle, file._handle)
            closing, file._handle = file._handle, None  # littlefs unlinks it whether or not the commit works
            try:
                lfs.file_close(handle, closing)  # commits it
            except BaseException as exc:
                if not _out_of_space(file._fs, exc):
                    _lose(file, f"the device failed while it was being renamed to {dst!r}; writes to "
                          "it since it was last synced may be lost; open it again")
                raise
            file._resume_at = None
            closed.append((file, position))
        _rename(handle, src, dst, dst_inside_src)
        new_base = dst.rstrip("/")
    finally:
        failed = files[0]._fs._callbacks.fault is not None
        error = None
        for file, position in closed:
            path = new_base + file.path[len(base):]
            why = f"the device failed while it was being renamed to {dst!r}; open it again"
            if failed or error is not None:  # (nothing can be read now: only zeros)
                _lose(file, why)
                continue
            try:
                _reopen(handle, file, path, position)
            except BaseException as exc:  # the others are lost too, then this is raised
                _lose(file, why)
                error = exc
        if error is not None:
            raise error


def _out_of_space(fs: Filesystem, exc: BaseException) -> bool:
    """Whether ``exc``, raised by littlefs, is a commit that found no room (which the
    remount after ENOSPC recovers from) rather than a device failure."""
    return (isinstance(exc, LittleFSError) and exc.code in _COMMIT_FAILURES
            and fs._callbacks.fault is None)


def _lose(file: "File", why: str) -> None:
    """``file`` can no longer be used: every call says ``why`` (EIO); closing it is quiet
    unless it was written to."""
    file.lost, file._can = why, 0
    file._handle = None
    file._fs._open.pop(file, None)


def _lose_after_nospc(file: "File", why: str, culprit: bool) -> None:
    """``file`` did not survive the remount after ENOSPC (see
    ``Filesystem._remount_after_nospc``): every later call says ``why``."""
    file._fs._let_go(file)  # (before _lose drops it: see Filesystem._let_go)
    _lose(file, why)
    if culprit:
        if file._accepted:
            # earlier writes its user was told had succeeded are lost with this one: sync
            # and close say so, as a host's do after a failed write-back, with the cause
            file.lost_errno = errno.ENOSPC
        else:  # its user has the error: syncing and closing report nothing more
            file.flags &= ~_LFS_WRONLY


def _replay(handle, file: "File", position: int) -> None:
    """Open ``file`` again on a fresh mount and apply its journal (what it had written
    and truncated since it last committed), committing it; then put it at ``position``.
    (An appender's writes were recorded at the end they went to, so they replay alike.)

    What the journal amounts to is applied, not its steps (see :func:`_net_effect`): the
    file is cut once, at the lowest size a truncate left it (committed at once, so that
    a file rewritten from the start frees its old blocks before the new ones are
    needed), then the bytes written are written in ascending order, and committed once,
    at the end. littlefs rewrites a file from the first block a write changes to its
    end, so steps out of order (a header written at 0 after the body, as image writers
    do) needed room for the file twice, and a disk with room for it once lost it all."""
    _reopen(handle, file, file.path, 0)
    file_handle = file._handle
    committed = lfs.file_size(handle, file_handle)
    cut, extents, size = _net_effect(file._journal, committed)
    if cut < committed:
        lfs.file_truncate(handle, file_handle, cut)
        lfs.file_sync(handle, file_handle)
    for start, data in extents:
        lfs.file_seek(handle, file_handle, start, os.SEEK_SET)
        lfs.file_write(handle, file_handle, bytes(data))
    if lfs.file_size(handle, file_handle) != size:
        lfs.file_truncate(handle, file_handle, size)  # (a truncate that lengthened it last)
    lfs.file_sync(handle, file_handle)
    lfs.file_seek(handle, file_handle, position, os.SEEK_SET)
    file._unsynced = False  # (the caller marks it committed)


def _reopen(handle, file: "File", path: str, position: int) -> None:
    """Give ``file`` a new littlefs handle on ``path`` at ``position`` (what it was opened
    with, less creating or truncating: the file exists and holds what was committed)."""
    file._handle = lfs.file_open(handle, path, file.flags & ~(_LFS_CREAT | _LFS_EXCL | _LFS_TRUNC), _ENCODING)
    if position:
        lfs.file_seek(handle, file._handle, position, os.SEEK_SET)
    file.path = path


def _names_only(func, fs: Filesystem) -> bool:
    """Whether ``func``, a call ``Filesystem._run`` makes, changes directory entries and
    attributes only, in one littlefs operation that either happens or not: after a
    remount it can simply be called again (see ``Filesystem._call_failed``). Not the
    calls that carry open files along (``_orphaning``, ``_rename_open``)."""
    return func in _NAMES_ONLY or func == fs._open_locked


def _exists(handle, path: str) -> bool:
    try:
        lfs.stat(handle, path, _ENCODING)
    except LittleFSError:
        return False
    return True


def _remove_typed(handle, path: str, want_dir: bool) -> None:
    info = lfs.stat(handle, path, _ENCODING)
    is_dir = info.type == _LFS_TYPE_DIR
    if is_dir and not want_dir:
        raise LittleFSError(-21)  # EISDIR
    if want_dir and not is_dir:
        raise LittleFSError(-20)  # ENOTDIR
    lfs.remove(handle, path, _ENCODING)


#: (see _names_only)
_NAMES_ONLY = frozenset({lfs.mkdir, lfs.setattr, lfs.removeattr, _remove_typed, _rename})

# -- files -----------------------------------------------------------------------------


class File:
    """An open littlefs file. Get one from :meth:`Filesystem.open`.

    Binary only, unbuffered (littlefs caches internally). Writes are durable after
    :meth:`sync` or :meth:`close`. Every method raises ``ValueError`` once the file is
    closed, and ``io.UnsupportedOperation`` (errno EBADF) for a read on a write-only file
    or a write on a read-only one, before littlefs (which would abort the process) sees
    the call.

    Handles on one file agree as the host's do. littlefs gives each handle its own view
    and commits all of it at close, so left alone the last handle closed would undo the
    others' writes. So: opening a file commits the other handles' writes first; while
    several are open (``_shared``) every write and truncate commits at once; a handle
    another has committed under (``_stale``) reopens at its position before its next use;
    an append goes to the end wherever the position is. A file with one handle pays an
    attribute test or three per call for this.

    ``read``, ``write`` and ``close`` are every program's hot path: each is
    :meth:`Filesystem._run` written out, behind one test of ``_can`` (the littlefs access
    bits while the file is open and not lost, else 0) standing for ``_check``.
    """

    __slots__ = ("_fs", "_handle", "path", "flags", "closed", "lost", "lost_errno", "created", "_can", "_unsynced",
                 "_accepted", "_journal", "_journal_bytes", "_resume_at", "_detached", "_shared", "_stale",
                 "_seeked_appender", "_content", "_position", "__weakref__")

    def __init__(self, fs: Filesystem, handle, path: str, flags: int):
        self._fs = fs
        self._handle = handle
        self.path = path
        self.flags = flags
        self.closed = False
        #: this open created the file (set by Filesystem.open)
        self.created = False
        #: written (or truncated) since opened or last synced: a remount would lose that
        self._unsynced = bool(flags & _LFS_TRUNC)
        #: writes (or truncates) its user was told succeeded, not yet committed: if a write
        #: runs out of space they are lost with it, and sync and close must say so
        self._accepted = False
        #: what was written and truncated since the last commit, as ``(offset, bytes)``
        #: and ``(size, None)``: applied again if a remount after ENOSPC takes it away
        #: (see ``Filesystem._remount_after_nospc``)
        self._journal: list = [(0, None)] if flags & _LFS_TRUNC else []
        self._journal_bytes = 0
        #: the position before a write or truncate that failed: where it is reopened
        self._resume_at: int | None = None
        #: removed, or replaced by a rename, while open: its path names another file now
        self._detached = False
        #: (an orphan's: see _Orphan)
        self._content: bytearray | None = None
        self._position = 0
        #: why the file was taken away from under its user (the filesystem was remounted)
        self.lost: str | None = None
        #: the errno using a lost file raises
        self.lost_errno = errno.EIO
        #: ``flags & 3`` while the file may be used, 0 once closed or lost
        self._can = flags & 3
        #: another handle is open on the same file: every write is committed at once
        self._shared = False
        #: another handle has committed since this one's view was taken: look again first
        self._stale = False
        #: an append-mode file whose position was moved: its next write must go to the end
        self._seeked_appender = False

    def __repr__(self) -> str:
        state = "closed" if self.closed else _mode_text(self.flags)
        return f"<File {self.path!r} {state}>"

    @property
    def mode(self) -> str:
        return _mode_text(self.flags)

    @property
    def detached(self) -> bool:
        """Removed, or replaced by a rename, while open: its path names another file now,
        or none (its writes reach only its other handles; see :class:`_Orphan`)."""
        return self._detached

    def readable(self) -> bool:
        return bool(self.flags & _LFS_RDONLY)

    def writable(self) -> bool:
        return bool(self.flags & _LFS_WRONLY)

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes from the current position (all the rest if negative).

        littlefs gives each handle the file as it was when opened (or last synced): a
        read that reaches the end of that looks again, so what another handle committed
        since (``tail -f``, a reader of a log) is read too (see :func:`_catch_up`)."""
        if self._stale:
            self._fs._run("read", self.path, None, _refresh, self)
        if self._can & _LFS_RDONLY and type(size) is int and size > 0:
            data = self._fs._run("read", self.path, None, _read_clamped, self, size)
            if len(data) < size and not self._unsynced and self._fs._run("read", self.path, None, _catch_up, self):
                data += self._fs._run("read", self.path, None, _read_clamped, self, size - len(data))
            return data
        self._check(_LFS_RDONLY, "read")
        if size is None or size < 0:
            size = max(0, self._fs._run("read", self.path, None, _remaining, self._handle))
            if not size and not self._unsynced and self._fs._run("read", self.path, None, _catch_up, self):
                size = max(0, self._fs._run("read", self.path, None, _remaining, self._handle))
        if size == 0:
            return b""
        return self._fs._run("read", self.path, None, _read_clamped, self, size)

    def write(self, data) -> int:
        """Write all of ``data`` (any bytes-like object); returns its length."""
        if not self._can & _LFS_WRONLY:
            self._check(_LFS_WRONLY, "write")
        if type(data) is not bytes and type(data) is not bytearray:
            data = memoryview(data).cast("B").tobytes()
        if not data:
            return 0  # littlefs would fill a gap up to a position past the end
        if self._stale or self._shared or self._seeked_appender:
            return self._write_coherently(data)
        written = self._fs._run("write", self.path, None, _write_logged, self, data)
        self._accepted = True
        return written

    def _write_coherently(self, data) -> int:
        """A write that other handles on the file must not lose, nor overwrite: on the
        file as last committed, at its end in append mode (wherever the position was, as
        on the host), committed at once while another handle is open on it."""
        fs = self._fs
        if self._stale:
            fs._run("write", self.path, None, _refresh, self)
        if self._seeked_appender:
            # littlefs moves an appender's position to the end only from before it
            self._seeked_appender = False
            fs._run("write", self.path, None, _seek, self, 0, os.SEEK_END)
        written = fs._run("write", self.path, None, _write_logged, self, data)
        if self._shared:
            self.sync()  # (if this fails, so did the write: nothing was accepted)
        else:
            self._accepted = True
        return written

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._check(0, "seek")
        offset = self._checked_offset(offset, whence)
        if self._stale:
            self._fs._run("seek", self.path, None, _refresh, self)
        if self.flags & _LFS_APPEND:
            self._seeked_appender = True  # the next write goes to the end (see _write_coherently)
        if whence == os.SEEK_END and not self._unsynced:
            self._fs._run("seek", self.path, None, _catch_up, self)  # the end as it is now
        return self._fs._run("seek", self.path, None, _seek, self, offset, whence)

    def _checked_offset(self, offset, whence: int) -> int:
        """``offset`` as :func:`checked_seek` takes it, its error naming this file."""
        try:
            return checked_seek(offset, whence)
        except OSError as exc:
            exc.filename = self.path
            raise

    def tell(self) -> int:
        self._check(0, "tell")
        return self._fs._run("tell", self.path, None, lfs.file_tell, self._handle)

    def truncate(self, size: int | None = None) -> int:
        """Cut or zero-extend the file to ``size`` (default: the current position).
        The position does not move. Returns the new size."""
        self._check(_LFS_WRONLY, "truncate")
        if self._stale:
            self._fs._run("truncate", self.path, None, _refresh, self)
        if size is None:
            size = self.tell()
        if size < 0:
            raise _error(errno.EINVAL, self.path, "negative size")
        self._fs._run("truncate", self.path, None, _truncate_logged, self, size)
        self._accepted = True
        if self.flags & _LFS_APPEND:
            self._seeked_appender = True  # the end may be below its position now
        if self._shared:
            self.sync()
        return size

    def size(self) -> int:
        """Current size, including writes not yet synced."""
        self._check(0, "size")
        if self._stale:
            self._fs._run("size", self.path, None, _refresh, self)
        return self._fs._run("size", self.path, None, lfs.file_size, self._handle)

    def sync(self) -> None:
        """Commit this file's writes to the device. (On the file whose write ran out of
        space, nothing: its user has that error, and another would only repeat it.)"""
        if self.lost is not None and not self.flags & _LFS_WRONLY:
            return
        self._check(0, "sync")
        if self._stale:
            # littlefs keeps the blocks of a view another handle has committed over only
            # until that view is synced: they would be reused while it points at them
            self._fs._run("sync", self.path, None, _refresh, self)
        self._fs._run("sync", self.path, None, _sync, self)
        if self._unsynced:
            self._unsynced = False
            self._fs._committed(self)

    def close(self, *_exc_info) -> None:
        """Commit and close. Closing twice is harmless. If the final commit fails the file
        is closed anyway (littlefs has let go of it) and the error is raised. (Extra
        arguments are ignored: ``close`` is also ``__exit__``.)"""
        if not self._can:
            if self.closed:
                return
            if self._content is not None:  # (an orphan's, through a ``with`` begun before)
                return _Orphan.close(self)
            if self.lost is not None:
                self.closed = True
                if self.flags & _LFS_WRONLY:
                    raise _error(self.lost_errno, self.path, self.lost)
                return
        fs = self._fs
        try:
            fs._take()
        except IndexError:
            raise fs._busy_error("close") from None
        try:
            fs._close_locked(self)
        finally:
            fs._give(True)

    def __enter__(self) -> "File":
        return self

    __exit__ = close  # one call fewer at the end of every ``with``

    def _check(self, need: int, op: str) -> None:
        if self.lost is not None:  # taken away (closed too, or not): say why
            raise _error(self.lost_errno, self.path, self.lost)
        if self.closed:
            raise ValueError(f"{op} on closed file {self.path!r}")
        if self._content is not None:  # (littlefs has no handle for it: it would abort)
            raise RuntimeError(f"{op}: {self.path!r} was removed while open, and this is a "
                               "method of the file taken before: look it up again")
        if need and not self.flags & need:
            raise wrong_mode_error(self.path, need == _LFS_RDONLY)


class _Orphan(File):
    """A file removed, or replaced by a rename, while open. As on a host, it lives on
    unnamed for its open handles, which share its content (reads see every handle's
    writes) until the last one is closed, and then it is gone.

    littlefs keeps a handle working after its name is gone, but not when another handle
    has committed to the file under it: the handle's later commit landed on whichever
    entry had taken its place, and corrupted a directory. So the file leaves littlefs
    when its name does (see :func:`_orphaning`), and its content is kept in memory: the
    host's, not the tile's SRAM, and no bigger than the filesystem it came from.
    """

    __slots__ = ()

    def read(self, size: int = -1) -> bytes:
        self._usable(_LFS_RDONLY, "read")
        content, start = self._content, self._position
        end = len(content) if size is None or size < 0 else min(len(content), start + size)
        if end <= start:
            return b""
        self._position = end
        return bytes(content[start:end])

    def write(self, data) -> int:
        self._usable(_LFS_WRONLY, "write")
        data = memoryview(data).cast("B")
        if not data:
            return 0  # (as File's: a gap is filled only by data after it)
        content = self._content
        start = len(content) if self.flags & _LFS_APPEND else self._position
        self._room_for(start + len(data))
        if start > len(content):
            content.extend(bytes(start - len(content)))  # (a gap reads as zeros)
        content[start : start + len(data)] = data
        self._position = start + len(data)
        return len(data)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._usable(0, "seek")
        offset = self._checked_offset(offset, whence)
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: len(self._content)}[whence]
        if not 0 <= base + offset <= _LFS_FILE_MAX:
            raise _error(errno.EINVAL, self.path, "position out of range")
        self._position = base + offset
        return self._position

    def tell(self) -> int:
        self._usable(0, "tell")
        return self._position

    def truncate(self, size: int | None = None) -> int:
        self._usable(_LFS_WRONLY, "truncate")
        content = self._content
        if size is None:
            size = self._position
        if size < 0:
            raise _error(errno.EINVAL, self.path, "negative size")
        self._room_for(size)
        if size < len(content):
            del content[size:]
        else:
            content.extend(bytes(size - len(content)))
        return size

    def size(self) -> int:
        self._usable(0, "size")
        return len(self._content)

    def sync(self) -> None:
        self._usable(0, "sync")  # (nowhere to commit to: its name is gone)

    def close(self, *_exc_info) -> None:
        self.closed = True
        self._content = None
        self._fs._orphans.pop(self, None)

    __exit__ = close

    def _usable(self, need: int, op: str) -> None:
        if self.lost is not None:  # its filesystem was unmounted: say so, not "closed file"
            raise _error(self.lost_errno, self.path, self.lost)
        if self.closed:
            raise ValueError(f"{op} on closed file {self.path!r}")
        if need and not self.flags & need:
            raise wrong_mode_error(self.path, need == _LFS_RDONLY)

    def _room_for(self, size: int) -> None:
        cfg = self._fs._cfg
        if size > cfg.block_size * cfg.block_count:
            raise _error(errno.ENOSPC, self.path, "an open file whose name is gone grows no "
                         "bigger than its filesystem")


def _orphaning(handle, fs: Filesystem, files: list, operation, *args) -> None:
    """Run ``operation(handle, *args)``, which takes away the name of the file ``files``
    have open (a remove, or a rename over it); then make them its :class:`_Orphan` s.

    Nothing is committed first: on a full disk that commit is what would fail, and
    removing a file must free space, not need it. The content is the file as committed,
    read while the name still leads to it (once it is gone, littlefs may reuse the
    blocks), with what a handle wrote and has not committed applied from its journal
    (see File). If the operation fails, nothing has changed. Then a handle with nothing
    uncommitted is closed, which commits nothing; one with writes is let go of, since
    closing it would commit them (onto whatever entry littlefs takes for its: see
    :class:`_Orphan`), and the blocks they took stay taken until the next unmount."""
    reader = lfs.file_open(handle, files[0].path, _LFS_RDONLY, _ENCODING)
    try:
        size = lfs.file_size(handle, reader)
        content = bytearray(lfs.file_read(handle, reader, size) if size else b"")
    finally:
        lfs.file_close(handle, reader)
    for file in files:
        if file._unsynced:
            _apply_journal(content, file._journal)
    positions = [lfs.file_tell(handle, file._handle) for file in files]
    operation(handle, *args)
    for file, position in zip(files, positions):
        if file._unsynced:
            fs._let_go(file)
        else:
            closing, file._handle = file._handle, None
            lfs.file_close(handle, closing)
        fs._open.pop(file, None)
        fs._orphans[file] = None
        file.__class__ = _Orphan
        file._content, file._position = content, position
        file._can = 0  # (File's own fast paths are littlefs calls)
        file._detached = True
        file._unsynced = file._accepted = file._stale = file._shared = file._seeked_appender = False
        file._journal, file._journal_bytes = [], 0
    fs._reshare()


def _lose_orphans(fs: Filesystem, why: str) -> None:
    """The files removed while open on ``fs`` go with it (it is unmounted): every later
    call on them says ``why`` (EIO); closing them is quiet (nothing of theirs could be
    saved: their names were gone)."""
    for file in list(fs._orphans):
        _Orphan.close(file)
        file.lost = why


def _net_effect(journal: list, size: int) -> tuple[int, list[tuple[int, bytearray]], int]:
    """What a file's journal does to a file of ``size`` committed bytes: (the lowest
    size a truncate cut it to, else ``size``; the bytes written, as disjoint extents
    ``(offset, bytes)`` in ascending order, later writes over earlier ones, none past a
    later truncate; the final size). Bytes at or past the cut that no extent holds are
    zeros (a hole, or what a truncate cut off and a later one or a write lengthened)."""
    cut = size
    starts: list[int] = []  # (parallel lists: bisect on the starts)
    datas: list[bytearray] = []
    for offset, data in journal:
        if data is None:  # a truncate: nothing at or past it survives
            cut, size = min(cut, offset), offset
            index = bisect.bisect_left(starts, offset)
            del starts[index:], datas[index:]
            if index and starts[index - 1] + len(datas[index - 1]) > offset:
                del datas[index - 1][offset - starts[index - 1]:]
            continue
        end = offset + len(data)
        size = max(size, end)
        # the extents this write overlaps or touches become one
        first = last = bisect.bisect_right(starts, end)
        while first and starts[first - 1] + len(datas[first - 1]) >= offset:
            first -= 1
        if first == last:
            starts.insert(first, offset)
            datas.insert(first, bytearray(data))
            continue
        start = min(offset, starts[first])
        merged = bytearray(max(end, starts[last - 1] + len(datas[last - 1])) - start)
        for index in range(first, last):
            merged[starts[index] - start : starts[index] - start + len(datas[index])] = datas[index]
        merged[offset - start : end - start] = data
        starts[first:last] = [start]
        datas[first:last] = [merged]
    return cut, list(zip(starts, datas)), size


def _apply_journal(content: bytearray, journal: list) -> None:
    """Apply a file's journal (``(offset, bytes)`` writes and ``(size, None)`` truncates,
    in order) to ``content``, as littlefs applied them to the handle's view."""
    for offset, data in journal:
        if data is None:
            if offset < len(content):
                del content[offset:]
            else:
                content.extend(bytes(offset - len(content)))
            continue
        if offset > len(content):
            content.extend(bytes(offset - len(content)))
        content[offset : offset + len(data)] = data


#: a file with more than this many bytes written since it last committed commits before
#: writing more: its journal (see File) stays bounded, as a host's dirty pages do
_JOURNAL_LIMIT = 1 << 20


def _write_logged(handle, file: File, data) -> int:
    """Write ``data`` at ``file``'s position, and note it in the file's journal."""
    file_handle = file._handle
    position = file._resume_at = lfs.file_tell(handle, file_handle)  # (if this fails)
    if file._journal_bytes > _JOURNAL_LIMIT:
        lfs.file_sync(handle, file_handle)
        file._fs._committed(file)
    if type(data) is bytearray:
        data = bytes(data)  # (the journal keeps what was written, not what it becomes)
    written = lfs.file_write(handle, file_handle, data)
    file._resume_at = None
    if file.flags & _LFS_APPEND:  # it went to the end, wherever the position was
        position = lfs.file_tell(handle, file_handle) - written
    file._journal.append((position, data))
    file._journal_bytes += written
    file._unsynced = True
    return written


def _truncate_logged(handle, file: File, size: int) -> None:
    file_handle = file._handle
    file._resume_at = lfs.file_tell(handle, file_handle)
    lfs.file_truncate(handle, file_handle, size)
    file._resume_at = None
    file._journal.append((size, None))
    file._unsynced = True


def _seek(handle, file: File, offset: int, whence: int) -> int:
    if file._unsynced:  # (see _read_clamped)
        file._resume_at = lfs.file_tell(handle, file._handle)
    position = lfs.file_seek(handle, file._handle, offset, whence)
    file._resume_at = None
    return position


def _sync(handle, file: File) -> None:
    file._resume_at = lfs.file_tell(handle, file._handle)  # (see _read_clamped)
    lfs.file_sync(handle, file._handle)
    file._resume_at = None


#: reads asking for more than this many bytes are first cut to what the file holds
_READ_CLAMP = 64 * 1024


def _read_clamped(handle, file: File, size: int) -> bytes:
    # (the File, not its littlefs handle: a read first writes out what the handle has
    # cached, which may run out of space, and the retry after that needs the new handle)
    file_handle = file._handle
    if size > _READ_CLAMP:
        # the binding allocates (and zeroes) ``size`` bytes, twice over, whatever the
        # file holds: ask for no more than is there
        size = min(size, max(0, _remaining(handle, file_handle)))
    if not size:
        return b""
    if file._unsynced:  # (the write-out that fails leaves littlefs' position astray)
        file._resume_at = lfs.file_tell(handle, file_handle)
    data = lfs.file_read(handle, file_handle, size)
    file._resume_at = None
    return data


def _catch_up(handle, file: File) -> bool:
    """If the file has grown since ``file``'s handle was opened (another handle committed
    more), give it a new handle at the same position, and say so. Only for a handle with
    nothing uncommitted of its own (closing it writes nothing). (A handle whose file was
    removed or replaced is an orphan, which never comes here: see _Orphan.)"""
    try:
        info = lfs.stat(handle, file.path, _ENCODING)
    except LittleFSError:
        return False  # removed or moved by someone else: the handle keeps what it has
    if info.type == _LFS_TYPE_DIR or info.size <= lfs.file_size(handle, file._handle):
        return False
    _reopen_in_place(handle, file, "the file grew and could not be opened again; open it again")
    return True


def _unsynced_sizes(handle, fs: Filesystem) -> dict[str, int]:
    """path -> the size open handles with uncommitted writes give it: what ``stat`` and
    listings report, as the host's page cache would."""
    return {f.path: lfs.file_size(handle, f._handle) for f in fs._open
            if f._unsynced and f._can}


def _refresh(handle, file: File) -> None:
    """Give a stale handle (another handle committed since its view was taken) the file
    as it is now, at the same position. Not one with uncommitted writes of its own. (A
    removed or replaced file's handles are orphans, which never come here.)"""
    file._stale = False
    if file._can and file._handle is not None and not file._unsynced:
        _reopen_in_place(handle, file, "the file changed and could not be opened again; open it again")
        if file.flags & _LFS_APPEND:
            file._seeked_appender = True  # the end may have moved below its position


def _reopen_in_place(handle, file: File, why: str) -> None:
    position = file._resume_at = lfs.file_tell(handle, file._handle)
    closing, file._handle = file._handle, None
    # littlefs lets go of the handle even if closing fails; then (ENOSPC) the remount
    # opens the file again at ``_resume_at``
    lfs.file_close(handle, closing)
    try:
        _reopen(handle, file, file.path, position)
    except BaseException:
        _lose(file, why)
        raise
    file._resume_at = None


def _remaining(handle, file_handle) -> int:
    return lfs.file_size(handle, file_handle) - lfs.file_tell(handle, file_handle)
