"""Open files as tile code sees them: Python's ``open`` semantics over any backend.

Binary files are :class:`VfsFile` objects (an ``io.RawIOBase``): unbuffered, because the
filesystem underneath already caches (littlefs keeps a cache per open file; a remote file
buffers its writes itself), and a second buffer would only copy every byte once more.
Text files are a :class:`TextFile` (an ``io.TextIOWrapper``) over one, with Python's
``encoding``/``errors``/``newline`` handling. The default encoding is UTF-8: a tile has
no locale. Other handles see writes at once (see ``blockdev.File``); ``flush()`` commits
the file's data to its filesystem, durably.

Finalizers are the one hazard here. CPython closes a file the moment its last reference
goes, but the cyclic garbage collector may finalize one at any allocation: on another
tile's greenlet, on a host thread, or in the middle of this tile's own littlefs call. A
close there would touch a filesystem its owner is not running. So a finalizer never
closes anything: it puts the file on its VFS's *pending* list, and the owner closes
pending files before its next file operation of any kind and when the program ends; a
file on another tile's disk also at the program's next exchange point (``sync``, a
collective, ``send`` ...), before any other tile can look at it.
``open(p, "w").write(s)`` then behaves as on the host: whatever looks at ``p`` next (the
program, a remote request) sees ``s``, and a close that fails then (a full disk) is told
on the program's output, as the host tells the error its finalizer ignored. Text wrappers are created with ``write_through``,
so a wrapper that is dropped never strands text in itself.
"""

from __future__ import annotations

import errno
import io
import operator
import os

from ipuos.blockdev import wrong_mode_error

__all__ = ["OpenMode", "parse_mode", "flags_mode", "VfsFile", "TextFile", "wrap_text",
           "check_binary_arguments", "checked_size", "no_file_descriptors", "raise_pending_signal",
           "close_dropped"]


def close_dropped(pending: list) -> None:
    """Close the files on ``pending``: dropped without being closed (see above).

    A failure goes to the file's ``report_failed_close(file, exc)``, which a program's
    session sets on the files it opens (its output then says so, as the host reports
    the error its finalizer ignored); a file opened by no program has nobody to tell.
    """
    while pending:
        file = pending.pop()
        try:
            file.close()
        except Exception as exc:
            report = getattr(file, "report_failed_close", None)
            if report is not None:
                report(file, exc)


def raise_pending_signal(owner) -> None:
    """Raise the owner tile's pending interrupt or abort, if its program may take it here.

    A tile takes signals at exchange points outside filesystem operations. A program
    whose loop only does chip-disk I/O waits for the exchange only inside littlefs, where
    it must not stop: so file operations take the signal as they start, holding nothing
    yet. Not while the tile serves a request (the request is not the program), nor
    another tile's exception while this tile runs on to its next exchange point (see
    ``Tile.runs_on_after_failure``): a file operation on the tile's own disk is none,
    and one that reached another tile's SRAM has ended that superstep. (Callers test
    ``owner.signal`` first: the common case costs them one attribute test.)"""
    if (owner.fs_depth == 0 and owner.service_depth == owner.program_depth and owner.signal is not None
            and not owner.runs_on_after_failure()):
        owner.raise_signal()


def no_file_descriptors(call: str, argument: str = "dir_fd") -> NotImplementedError:
    """The error for a file descriptor given to ``call`` (``dir_fd=3``): tiles have none."""
    return NotImplementedError(f"tiles have no file descriptors: {call}() takes a path, not {argument}")


# -- modes ----------------------------------------------------------------------------


class OpenMode:
    """A parsed ``open`` mode (immutable).

    A class with slots rather than a NamedTuple: every ``open`` reads several fields, and
    a slot is read in half the time of a NamedTuple field.
    """

    __slots__ = (
        "backend",  # what the backend's open takes: "r", "w+", ... or os.O_* flags
        "binary",
        "readable",
        "writable",
        "writes",  # may change the filesystem: refused on a read-only mount
        "stamps",  # creates or truncates: the mtime is set even if nothing is written
        "maybe_creates",  # may create the file ("a", O_CREAT): stamped if it does
        "exclusive",  # creates or fails ("x", O_CREAT | O_EXCL): EEXIST for what is there
        "text",  # the ``mode`` of the file ``open`` returns, text or binary
        "raw_text",  # the binary file's ``mode`` ("wb" for "w"): a text file's ``buffer.mode``
    )
    _fields = __slots__

    def __init__(self, backend, binary: bool, readable: bool, writable: bool, writes: bool,
                 stamps: bool, maybe_creates: bool, exclusive: bool, text: str, raw_text: str):
        for name, value in zip(self._fields, (backend, binary, readable, writable, writes,
                                              stamps, maybe_creates, exclusive, text, raw_text)):
            object.__setattr__(self, name, value)

    def __setattr__(self, name, value):
        raise AttributeError("OpenMode is immutable")

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self._fields)

    def __eq__(self, other):
        if type(other) is not OpenMode:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"OpenMode({fields})"


_MODES: dict = {}
#: what the host's binary files report as ``mode`` (FileIO's spelling)
_BINARY_MODE_NAMES = {"r": "rb", "r+": "rb+", "w": "wb", "w+": "rb+", "a": "ab", "a+": "ab+",
                      "x": "xb", "x+": "xb+"}


#: the largest file littlefs keeps (its LFS_FILE_MAX)
FILE_SIZE_MAX = 2**31 - 1


def checked_size(size, path) -> int:
    """A size to truncate to, as the host's ``truncate`` takes it: an integer (a float is
    TypeError, not rounded down), not negative (EINVAL), within what littlefs can hold
    (EFBIG)."""
    size = operator.index(size)
    if size < 0:
        raise OSError(errno.EINVAL, "Invalid argument: negative size", path)
    if size > FILE_SIZE_MAX:
        raise OSError(errno.EFBIG, os.strerror(errno.EFBIG), path)
    return size


def parse_mode(mode) -> OpenMode:
    """Python's ``open`` mode rules ("r", "wb", "a+", "x", "rt" ...); ValueError otherwise."""
    parsed = _MODES.get(mode)
    if parsed is not None:
        return parsed
    if not isinstance(mode, str):
        raise TypeError(f"open() mode must be str, not {type(mode).__name__}")
    chars = set(mode)
    if chars - set("rwaxbt+") or len(chars) != len(mode):
        raise ValueError(f"invalid mode: {mode!r}")
    kinds = chars & set("rwax")
    if len(kinds) != 1:
        raise ValueError("must have exactly one of create/read/write/append mode")
    if "b" in chars and "t" in chars:
        raise ValueError("can't have text and binary mode at once")
    base = kinds.pop()
    plus = "+" in chars
    backend = base + ("+" if plus else "")
    binary = "b" in chars
    parsed = OpenMode(
        backend=backend,
        binary=binary,
        readable=plus or base == "r",
        writable=plus or base != "r",
        writes=plus or base != "r",
        stamps=base in "wx",
        maybe_creates=base == "a",
        exclusive=base == "x",
        text=_BINARY_MODE_NAMES[backend] if binary else mode,
        raw_text=_BINARY_MODE_NAMES[backend],
    )
    if len(_MODES) < 256:
        _MODES[mode] = parsed
    return parsed


def flags_mode(flags: int) -> OpenMode:
    """The mode for POSIX ``os.O_*`` flags (the host client and FUSE speak these)."""
    access = flags & os.O_ACCMODE
    writes = access != os.O_RDONLY or bool(flags & (os.O_CREAT | os.O_TRUNC))
    text = {os.O_RDONLY: "rb", os.O_WRONLY: "wb", os.O_RDWR: "rb+"}.get(access, "rb")
    return OpenMode(
        backend=flags,
        binary=True,
        readable=access != os.O_WRONLY,
        writable=access != os.O_RDONLY,
        writes=writes,
        stamps=bool(flags & (os.O_TRUNC | os.O_EXCL)) and writes,
        maybe_creates=bool(flags & os.O_CREAT),
        exclusive=flags & (os.O_CREAT | os.O_EXCL) == os.O_CREAT | os.O_EXCL,
        text=text,
        raw_text=text,
    )


# -- files ----------------------------------------------------------------------------


class VfsFile:
    """A binary file on a tile: ``read``/``write``/``seek``/``tell``/``truncate``/``flush``.

    The whole ``io.RawIOBase`` protocol (it is registered as one, so ``isinstance`` holds)
    without inheriting from it: an ``io`` subclass costs ~0.5 us more to create, and
    programs open files in loops. Subclasses implement ``read``, ``write``, ``seek``,
    ``tell``, ``truncate``, ``flush``, ``size`` and ``_close``; everything line-oriented
    and the finalizer policy live here.
    """

    __slots__ = ("name", "mode", "_closed", "_readable", "_writable", "_owner", "_pending",
                 "report_failed_close", "_raw", "__weakref__")

    def __init__(self, name: str, mode: str, readable: bool, writable: bool, owner, pending):
        self.name = name
        self.mode = mode
        self._closed = False
        self._readable = readable
        self._writable = writable
        #: whose filesystems this file lives on (its ``fs_depth`` brackets littlefs calls)
        self._owner = owner
        #: where the finalizer puts the file for its owner to close (None: _abandon it)
        self._pending = pending
        # (``report_failed_close``, unset unless a program opened the file: see Vfs.close_pending;
        # ``_raw``, unset unless opened unbuffered: see unbuffered)

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<{type(self).__name__} {self.name!r} mode={self.mode!r}{state}>"

    def __reduce_ex__(self, protocol):
        raise TypeError(f"an open file ({self.name!r}) cannot be sent to another tile or the host")

    # -- state ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def readable(self) -> bool:
        self._check_open()
        return self._readable

    def writable(self) -> bool:
        self._check_open()
        return self._writable

    def seekable(self) -> bool:
        self._check_open()
        return True

    def isatty(self) -> bool:
        self._check_open()
        return False

    def fileno(self) -> int:
        self._check_open()  # (a closed file says so first, as the host's does)
        raise io.UnsupportedOperation("files on a tile have no file descriptor")

    def close(self) -> None:
        """Commit and close. Closing twice is harmless; a failed final commit still
        closes the file and raises."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self):
        self._check_open()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # -- derived reading and writing ------------------------------------------------------

    def readall(self) -> bytes:
        return self.read(-1)

    def read1(self, size: int = -1) -> bytes:
        if type(size) is not int or size < -1:
            self._check_reads()
            size = max(-1, operator.index(size))  # (None is a TypeError, any negative all, as the host's)
        return self.read(size)

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        if view.readonly:  # before reading: the bytes read would be lost, the position moved
            raise TypeError(f"readinto() argument must be read-write bytes-like object, not "
                            f"{type(buffer).__name__}")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    readinto1 = readinto

    def readline(self, size: int | None = -1) -> bytes:
        """One line (up to ``size`` bytes), reading ahead in growing chunks and giving back
        what follows the newline with a seek: no second buffer to keep coherent."""
        if size is None:
            size = -1
        parts = []
        total = 0
        chunk = 128
        while size < 0 or total < size:
            want = chunk if size < 0 else min(chunk, size - total)
            data = self.read(want)
            if not data:
                break
            cut = data.find(b"\n")
            if cut >= 0:
                extra = len(data) - cut - 1
                if extra:
                    self.seek(-extra, os.SEEK_CUR)
                parts.append(data[: cut + 1])
                break
            parts.append(data)
            total += len(data)
            chunk = min(chunk * 2, 8192)
        return b"".join(parts)

    def readlines(self, hint: int | None = -1) -> list[bytes]:
        lines = []
        total = 0
        for line in self:
            lines.append(line)
            total += len(line)
            if hint is not None and 0 < hint < total:  # (once past the hint, as io's)
                break
        return lines

    def __iter__(self):
        self._check_open()
        return self

    def __next__(self) -> bytes:
        line = self.readline()
        if not line:
            raise StopIteration
        return line

    def writelines(self, lines) -> None:
        self._check_open()  # (even for no lines, as io's files)
        for line in lines:
            self.write(line)

    # -- finalization ----------------------------------------------------------------------

    def __del__(self):
        if self._closed:
            return
        try:
            if self._pending is not None:
                self._pending.append(self)  # resurrected; the owner closes it soon
            else:
                self._abandon()
        except Exception:
            pass  # nobody to report to from a finalizer

    def _abandon(self) -> None:
        """Let go of the file without waiting (files whose owner is not a tile's VFS)."""

    def unbuffered(self) -> None:
        """Make every write reach the file at once, as ``open(..., buffering=0)`` asks
        (a file on the tile's own filesystem does so already), and take any negative
        ``read`` size for everything, as the host's unbuffered (raw) files do."""
        self._raw = True

    # -- helpers -------------------------------------------------------------------------

    def _read_size(self, size) -> int:
        """A ``read`` size as the host's buffered files take it: None or -1 for everything,
        else not negative (ValueError: ``read(-5)`` is a mistake, not "all"), an integer
        (a float is TypeError); a file not open for reading says so first. (``read``
        calls this only for a size that is not an int of -1 or more.)"""
        self._check_reads()
        if size is None:
            return -1
        if not isinstance(size, int):
            try:
                size = operator.index(size)
            except TypeError:
                raise TypeError(f"argument should be integer or None, not {type(size).__name__!r}") from None
        if size < -1:
            if getattr(self, "_raw", False):  # (unset unless unbuffered)
                return -1
            raise ValueError("read length must be non-negative or -1")
        return size

    def _check_reads(self) -> None:
        """A file not open for reading says so before a read's size is looked at, as the
        host's do."""
        if not self._readable and not self._closed:
            raise wrong_mode_error(self.name, reading=True)

    def _check_open(self) -> None:
        if self._closed:
            raise self.closed_error()

    def closed_error(self) -> ValueError:
        return ValueError(f"I/O operation on closed file {self.name!r}")

    def _close(self) -> None:
        raise NotImplementedError


io.RawIOBase.register(VfsFile)


class TextFile(io.TextIOWrapper):
    """A text file: ``io.TextIOWrapper`` with the finalizer policy of :class:`VfsFile`."""

    def __del__(self):
        # io's own finalizer would flush and close here, wherever the collector runs it;
        # the binary file's finalizer hands it to the owner instead, and write_through
        # leaves nothing in this wrapper to lose
        pass

    def __reduce_ex__(self, protocol):
        raise TypeError(f"an open file ({self.name!r}) cannot be sent to another tile or the host")


def wrap_text(raw: VfsFile, mode: OpenMode, buffering: int, encoding, errors, newline) -> TextFile:
    """The text file over ``raw``; ``raw`` is closed if the text layer cannot be built."""
    if buffering == 0:
        raw.close()
        raise ValueError("can't have unbuffered text I/O")
    try:
        text = TextFile(raw, encoding or "utf-8", errors, newline,
                        line_buffering=buffering == 1, write_through=True)
        text.mode = mode.text
    except BaseException:
        raw.close()
        raise
    return text


def check_binary_arguments(encoding, errors, newline) -> None:
    for value, what in ((encoding, "an encoding"), (errors, "an errors"), (newline, "a newline")):
        if value is not None:
            raise ValueError(f"binary mode doesn't take {what} argument")

