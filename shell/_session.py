"""A shell session on tile 0, and what one command sees while it runs.

A :class:`Session` is one attached terminal: its current directory, its mode (the shell,
tile 0's Python, or a multirepl), its repl sessions, and the state Ctrl-C needs (which
command is running, the job it waits for). Sessions live in tile 0's ``kernel_data`` and
are changed on tile 0's greenlet; the daemon's threads only set the interrupt marks
(``interrupted`` and ``cancelled``: an assignment, a set's add, safe under the GIL) and read
the job to interrupt.

The current directory is the session's, not tile 0's: programs that run on tile 0 have
a cwd of their own in its VFS, and two terminals must not move each other around. So
:class:`SessionFs` makes every path absolute against the session's cwd before the VFS
sees it, and puts the name the user typed back into errors.

:class:`Context` is what a command handler gets: the files, the host, output streams
(with ``>`` redirection), the payload the terminal sent, and :meth:`Context.check`, the
point where a long command notices Ctrl-C.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
from typing import Callable

from ipuos._truncation import split_truncation, truncation_note
from ipuos.scheduler import TileInterrupt

__all__ = ["Session", "SessionFs", "Context", "Output", "ShellInterrupt", "absolute"]

#: C0 and C1 control characters and DEL
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")

#: output is sent to the terminal as it is produced once this much has collected
FLUSH_CHARS = 32 * 1024

SHELL, PYTHON, MULTIREPL = "shell", "python", "multirepl"


class ShellInterrupt(TileInterrupt):
    """Ctrl-C reached a command of session ``sid`` (raised by :meth:`Context.check`)."""

    def __init__(self, sid: int = 0):
        super().__init__("interrupted")
        self.sid = sid


def absolute(path: str, cwd: str) -> str:
    """The canonical absolute form of ``path`` (lexical: the VFS has no symbolic links)."""
    if not path.startswith("/"):
        path = cwd.rstrip("/") + "/" + path
    path = posixpath.normpath(path)
    return "/" + path.lstrip("/")  # normpath keeps a leading "//"


class Session:
    """One attached terminal (see module doc)."""

    def __init__(self, sid: int, client_pid: int | None):
        self.id = sid
        self.client_pid = client_pid
        self.cwd = "/"
        self.previous_cwd: str | None = None  # (cd - before any cd: "OLDPWD not set")
        #: the terminal's width for columns (0: not a terminal, one name per line)
        self.width = 0
        #: the tzinfo times are shown in: the client's (None: the host process's own)
        self.zone = None
        #: the terminal shows a Ctrl-C typed at it as ``^C`` itself (a tty's echo): the
        #: shell does not say it again
        self.echoes_ctrl_c = False
        self.mode = SHELL
        #: tile 0's Python (kept for the whole session) and the current multirepl
        self.python = None
        #: where the next block typed at Python starts (the shell's directory when it was
        #: entered; None: where the last block left off)
        self.python_starts_in: str | None = None
        self.repl = None
        #: the command running now: its sequence number, and the job it waits for
        self.busy = False
        self.seq = 0
        #: commands cancelled before tile 0 got to start them (each queued line its own)
        self.cancelled: set[int] = set()
        self.interrupted = False
        #: the command was interrupted for good (its terminal gave up on it): the reason a
        #: job it starts after that is stopped with, not with a Ctrl-C it may catch
        self.stopped: str | None = None
        self.job = None
        self.status = 0
        #: where the ``put`` under way writes until its last chunk is in
        self.put_temporary: str | None = None
        #: a chunk of that put is being written: tile 0 may serve this session's next
        #: request meanwhile (once the terminal gave up waiting), which must not remove
        #: the file under it
        self.put_writing = False
        #: the put was abandoned while a chunk was being written: that chunk removes it
        self.put_abandoned = False

    def abandon_put(self, fs) -> None:
        """The put under way will not finish: remove what it wrote (best effort), or
        leave that to the chunk being written now, when it is done."""
        if self.put_writing:
            self.put_abandoned = True
            return
        temporary, self.put_temporary = self.put_temporary, None
        if temporary is not None:
            try:
                fs.remove(temporary)
            except OSError:
                pass

    def prompt(self) -> str:
        if self.mode == PYTHON:
            return ">>> "
        if self.mode == MULTIREPL:
            return f"[{self.repl.tiles}]>>> "
        return f"ipuos:{self.cwd}$ "

    def state(self, status: int) -> dict:
        """What the terminal needs after a command: status, cwd, mode and prompt."""
        return {"status": status, "cwd": self.cwd, "mode": self.mode, "prompt": self.prompt()}

    def close(self) -> None:
        for repl in (self.python, self.repl):
            if repl is not None:
                repl.close()
        self.python = self.repl = None
        self.mode = SHELL  # (a command still finishing must not ask a closed repl for its prompt)


class Output:
    """A command's output: ``(stream, text)`` pieces, sent on as they pile up."""

    def __init__(self, emit: Callable[[list], None] | None):
        self._emit = emit
        self.pieces: list[list[str]] = []
        self._size = 0

    def write(self, stream: str, text: str) -> None:
        if not text:
            return
        pieces = self.pieces
        if pieces and pieces[-1][0] == stream:
            pieces[-1][1] += text
        else:
            pieces.append([stream, text])
        self._size += len(text)
        if self._size >= FLUSH_CHARS and self._emit is not None:
            self.flush()

    def flush(self) -> None:
        if self.pieces and self._emit is not None:
            pieces, self.pieces, self._size = self.pieces, [], 0
            self._emit(pieces)

    def take(self) -> list:
        pieces, self.pieces, self._size = self.pieces, [], 0
        return pieces


class SessionFs:
    """Tile 0's VFS with the session's cwd (see module doc). Binary files only."""

    def __init__(self, vfs, session: Session):
        self.vfs = vfs
        self.session = session

    def abspath(self, path: str) -> str:
        if not path:
            raise FileNotFoundError(2, "No such file or directory", path)
        if "\0" in path:
            raise ValueError(f"{path!r}: a file name cannot hold a NUL byte")
        return absolute(path, self.session.cwd)

    def _as_given(self, path: str) -> str:
        """The path for the VFS: absolute, but otherwise as typed, since the VFS reads it
        as the kernel does: ``missing/..`` is ENOENT, not the directory it lexically
        names, ``mkdir new/.`` does not make new, ``f/`` of a file is ENOTDIR."""
        self.abspath(path)  # (an empty path or a NUL is refused as for any other use)
        if path.startswith("/"):
            return path
        return self.session.cwd.rstrip("/") + "/" + path

    def place(self, path: str) -> tuple[str, str]:
        """(the filesystem ``path`` is on, the path inside it): equal for the same file by
        any spelling (see ``Vfs.place``: tile 0's own disk is ``/`` and ``/tiles/0``)."""
        return self.vfs.place(self.abspath(path))

    def _call(self, method: str, path: str, *args, **kwargs):
        full = self._as_given(path)
        try:
            return getattr(self.vfs, method)(full, *args, **kwargs)
        except OSError as exc:
            if exc.filename == full:
                exc.filename = path
            raise

    def entry(self, path: str):
        return self._call("entry", path)

    def entries(self, path: str):
        return self._call("entries", path)

    def open(self, path: str, mode: str = "rb"):
        return self._call("open", path, mode)

    def open_raw(self, path: str, flags):
        return self._call("open_raw", path, flags)

    def mkdir(self, path: str) -> None:
        self._call("mkdir", path)

    def makedirs(self, path: str) -> None:
        self._call("makedirs", path, 0o777, True)

    def rmdir(self, path: str) -> None:
        self._call("rmdir", path)

    def remove(self, path: str) -> None:
        self._call("remove", path)

    def statvfs(self, path: str):
        return self._call("statvfs", path)

    def utime(self, path: str, mtime_ns: int | None = None) -> None:
        """Set ``path``'s time to ``mtime_ns`` (None: now)."""
        self._call("utime", path, ns=None if mtime_ns is None else (mtime_ns, mtime_ns))

    def rename(self, src: str, dst: str) -> None:
        full_src, full_dst = self._as_given(src), self._as_given(dst)
        try:
            self.vfs.rename(full_src, full_dst)
        except OSError as exc:
            exc.filename, exc.filename2 = src, dst
            raise

    def isdir(self, path: str) -> bool:
        try:
            return self.entry(path).is_dir
        except (OSError, ValueError):
            return False

    def exists(self, path: str) -> bool:
        try:
            self.entry(path)
        except (OSError, ValueError):
            return False
        return True

    def ismount(self, path: str) -> bool:
        return self.vfs.ismount(self.abspath(path))

    def read_bytes(self, path: str) -> bytes:
        with self.open(path, "rb") as file:
            return file.read()

    def glob(self, pattern: str) -> list[str]:
        """Paths matching an ``fnmatch`` pattern (the parser spells bash's ``[^..]`` as
        ``[!..]``), component by component, sorted; names starting with "." only match a
        pattern that starts with "." too; a pattern ending in "/" matches directories only,
        and they keep the slash."""
        absolute_pattern = pattern.startswith("/")
        parts = [part for part in pattern.split("/") if part]
        found = ["/" if absolute_pattern else ""]
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            matches = []
            for base in found:
                if not any(c in part for c in "*?["):
                    candidate = _join(base, part)
                    if self.exists(candidate):
                        matches.append(candidate)
                    continue
                try:
                    entries = self.entries(base or ".")
                except (OSError, ValueError):
                    continue
                for entry in entries:
                    if entry.name.startswith(".") and not part.startswith("."):
                        continue
                    if (last or entry.is_dir) and fnmatch.fnmatchcase(entry.name, part):
                        matches.append(_join(base, entry.name))
            found = matches
            if not found:
                break
        if pattern.endswith("/") and parts:
            found = [path + "/" for path in found if self.isdir(path)]
        return sorted(found)


def _join(base: str, name: str) -> str:
    if not base:
        return name
    return base + name if base.endswith("/") else base + "/" + name


class Context:
    """What one command handler sees (see module doc)."""

    def __init__(self, *, server, tile, session: Session, fs: SessionFs, output: Output,
                 payload: bytes, name: str):
        self.server = server
        self.host = server.host
        self.tile = tile
        self.session = session
        self.fs = fs
        self.output = output
        #: bytes the terminal sent with the line (a host file for ``multirepl --data``)
        self.payload = payload
        #: the command's name, for messages
        self.name = name
        #: a file ``> redirect`` writes to instead of the terminal
        self.redirect = None
        #: where that file is (``SessionFs.place``), so a command can refuse to read it
        self.redirect_place: tuple[str, str] | None = None
        #: 1 once an error was reported (commands with many operands carry on)
        self.status = 0

    # -- output ------------------------------------------------------------------------------

    def write(self, text: str) -> None:
        if self.redirect is not None:
            # (lone surrogates a program printed are spelled \udcXX, as on the terminal)
            self.redirect.write(text.encode("utf-8", "backslashreplace"))
        else:
            self.output.write("out", text)

    def write_output_and_error(self, output: str, error: str) -> None:
        """What a program printed, then its error (a traceback) on the error stream, as
        Python writes one (and a SyntaxError here), after the output, on a line of its
        own; with ``> file``, the output goes into the file."""
        if self.redirect is not None:
            # (a note that the output was cut short is no part of it: into the file it went
            # as if the program had printed it)
            output, dropped = split_truncation(output)
            if dropped:
                error = truncation_note(dropped, " (a block's output is kept up to 64 KiB)") + error
        separator = "" if not error or not output or output.endswith("\n") or self.redirect else "\n"
        self.write(output + separator)
        if error:
            self.output.write("err", error)

    def write_bytes(self, data: bytes, decoder=None) -> None:
        """File contents: into a redirect byte for byte; to the terminal as UTF-8 text
        (``decoder``: an incremental one, for data that comes in pieces)."""
        if self.redirect is not None:
            self.redirect.write(data)
        elif decoder is not None:
            self.write(decoder.decode(data, final=not data))
        else:
            self.write(data.decode("utf-8", "replace"))

    def print(self, text: str = "") -> None:
        self.write(text + "\n")

    def shown(self, name: str) -> str:
        """A file name as listings print it: on a terminal, control characters as ``?``
        (as ``ls`` does there): a name may hold escape sequences that would drive the
        terminal, or newlines that fake other entries. Into a file or a pipe, as it is."""
        if self.redirect is not None or not self.session.width or _CONTROL.search(name) is None:
            return name
        return _CONTROL.sub("?", name)

    def error(self, message: str, status: int = 1) -> int:
        """Report ``cmd: message`` on the error stream; returns (and keeps) ``status``.
        On a terminal, control characters (of a file name in the message) show as ``?``,
        as in listings: see :meth:`shown`."""
        if self.session.width:
            message = _CONTROL.sub("?", message)
        self.output.write("err", f"{self.name}: {message}\n")
        self.status = max(self.status, status)
        return status

    def oserror(self, exc: OSError) -> int:
        """``cmd: path: reason`` for an error from the files."""
        reason = exc.strerror or str(exc)
        if exc.filename is not None and exc.filename2 is not None:
            return self.error(f"{exc.filename} -> {exc.filename2}: {reason}")
        if exc.filename is not None:
            return self.error(f"{exc.filename}: {reason}")
        return self.error(reason)

    # -- Ctrl-C ------------------------------------------------------------------------------

    def check(self) -> None:
        """Raise ShellInterrupt if the user pressed Ctrl-C: call between steps of long work."""
        if self.session.interrupted:
            raise ShellInterrupt(self.session.id)

    def wait(self, launched) -> None:
        """Wait on tile 0 for a job the command started; Ctrl-C interrupts the job (the
        command then reports what its tiles printed)."""
        session = self.session
        job = launched.job
        session.job = job
        try:
            if session.stopped is not None:  # (given up on while the job was being started)
                self.server.scheduler.interrupt_job(job, session.stopped)
            elif session.interrupted:  # Ctrl-C arrived while the job was being started
                self.server.scheduler.interrupt_job(job, "interrupted (Ctrl-C)", ctrl_c=True)
            self.server.scheduler.wait_job(self.tile, job)
        finally:
            session.job = None
