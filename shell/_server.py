"""The shell as kernel services: it runs on tile 0, as tile 0's work.

The daemon registers a :class:`ShellServer` on the scheduler; each terminal then talks to
tile 0 through kernel requests, served on tile 0's greenlet like any file request:

| service | arguments | result |
|---|---|---|
| ``shell.open`` | client pid, terminal width, time zone | ``{"session", "status", "cwd", "mode", "prompt", "ntiles", "sram_per_tile"}`` |
| ``shell.exec`` | session, seq, line, payload, eof, width, emit, echoes_ctrl_c | ``{"status", "cwd", "mode", "prompt", "output"}`` (``eof`` in the shell: the input has ended; the python and multirepl names are let go of) |
| ``shell.complete`` | session, text before the cursor | ``(start, [words])`` |
| ``shell.put`` | session, path, host name, bytes, offset, last, cancelled | the path written (None: given up) |
| ``shell.put_abort`` | session | None (the put under way will not finish: its file goes) |
| ``shell.get`` | session, path, offset, size | bytes (short at the end) |
| ``shell.close`` | session | None |
| ``shell.df`` / ``shell.meminfo`` | | a tile's disk use / SRAM regions (every tile) |

So every file operation of the shell goes through tile 0's VFS (other tiles' files via
``/tiles/N`` and the exchange), and a command costs supersteps like any tile's work. While
a command waits (for another tile's reply, for a job), tile 0 keeps serving requests, so
other terminals, FUSE and other tiles are not held up by it.

Output travels as ``[stream, text]`` pieces: in the result, or earlier through ``emit``
once a command has produced a lot (a ``cat`` of a big file streams).

Ctrl-C: :meth:`ShellServer.interrupt` (from the daemon's thread that saw the client's
cancel) marks the session's command interrupted and interrupts the job it waits for, if
any; long commands check the mark between steps (:meth:`Context.check`) and stop with
``^C`` (unless the terminal showed it: ``echoes_ctrl_c``), ``cmd: interrupted`` (as the
terminal's put and get say it) and status 130.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import posixpath

from ipuos.scheduler import JobAborted, TileInterrupt

from . import _changecmds, _filecmds, _progcmds, _syscmds  # noqa: F401  (registers the commands)
from ._changecmds import close_after_failure, resolve_target
from ._complete import complete
from ._parse import ShellSyntaxError, parse_line
from ._session import SHELL, Context, Output, Session, SessionFs, ShellInterrupt
from ._table import COMMANDS, Usage

__all__ = ["ShellServer", "SESSIONS_KEY"]

#: where tile 0 keeps its sessions in ``kernel_data``
SESSIONS_KEY = "shell.sessions"
#: why umount refuses a mount a session's current directory is in (a shell left in a
#: vanished directory is lost, so umount(8) says "target is busy")
_SESSION_BUSY = "a shell's working directory is in it; cd out first"
#: exit status of a command stopped by Ctrl-C (as sh reports SIGINT)
EXIT_INTERRUPTED = 130
EXIT_NOT_FOUND = 127

log = logging.getLogger("ipuos.shell")


def _working_directories(tile):
    from ipuos.vfs import working_directories  # (see shell/__init__: what the terminal imports)

    return working_directories(tile)


class ShellServer:
    """The shell's kernel services (see module doc).

    ``storage`` is the machine's :class:`~ipuos.vfs.Storage` (``storage.vfs(tile)`` is a
    tile's VFS, brought up on first use); ``host`` is the
    :class:`~ipuos.shell.ShellHost` that starts programs and repls.
    """

    def __init__(self, scheduler, storage, host, *, tile: int = 0):
        self.scheduler = scheduler
        self.storage = storage
        self.vfs_of = storage.vfs
        self.host = host
        self.tile_id = tile
        #: every session, by id (the same objects tile 0 keeps in its kernel_data)
        self.sessions: dict[int, Session] = {}
        self._ids = itertools.count(1)

    def install(self) -> None:
        """Register the services on the scheduler."""
        self.scheduler.services.update({
            "shell.open": self._serve_open,
            "shell.close": self._serve_close,
            "shell.exec": self._serve_exec,
            "shell.complete": self._serve_complete,
            "shell.put": self._serve_put,
            "shell.put_abort": self._serve_put_abort,
            "shell.get": self._serve_get,
            "shell.df": self._serve_df,
            "shell.meminfo": _serve_meminfo,
        })

    # -- from any thread ------------------------------------------------------------------------

    def interrupt(self, sid: int, seq: int | None = None, reason: str = "interrupted (Ctrl-C)",
                  ctrl_c: bool = True) -> None:
        """Ctrl-C for command ``seq`` of session ``sid`` (None: whatever runs now); a job
        it waits for is stopped with ``reason`` (``ctrl_c``: as Ctrl-C stops a job, a
        KeyboardInterrupt it may catch; else as ``kill`` does).

        The command notices at its next :meth:`Context.check`; the job it waits for, if
        any, is interrupted at once. A command waiting for another tile's reply is not
        woken: that reply always comes, since the only thing that can hold a tile back
        (computing without an exchange point) holds the whole machine, which the
        watchdog or ``kill`` must free first.
        """
        session = self.sessions.get(sid)
        if session is None:
            return
        if seq is not None and seq > session.seq:
            session.cancelled.add(seq)  # not started yet (tile 0 was busy): never start it
            return
        if not session.busy or (seq is not None and session.seq != seq):
            return
        session.interrupted = True
        if not ctrl_c:
            session.stopped = reason
        job = session.job
        if job is not None:
            self.scheduler.interrupt_job(job, reason, ctrl_c=ctrl_c)

    # -- sessions -----------------------------------------------------------------------------

    def _session(self, tile, sid) -> Session:
        session = self.sessions.get(sid)
        if session is None:
            raise LookupError(f"no shell session {sid!r} (it was closed; attach again)")
        return session

    def _serve_open(self, tile, client_pid, width=0, zone=None) -> dict:
        session = Session(next(self._ids), client_pid)
        session.width = width
        session.zone = zone
        self.sessions[session.id] = session
        tile.kernel_data.setdefault(SESSIONS_KEY, {})[session.id] = session
        _working_directories(tile).add(session, _SESSION_BUSY)
        # (the machine's size: the terminal reads no more of a multirepl's data file than fits)
        return {"session": session.id, **session.state(0), "ntiles": len(self.scheduler.tiles),
                "sram_per_tile": tile.memory.size}

    def _serve_close(self, tile, sid) -> None:
        session = self.sessions.pop(sid, None)
        tile.kernel_data.get(SESSIONS_KEY, {}).pop(sid, None)
        if session is not None:
            _working_directories(tile).discard(session)
            session.abandon_put(SessionFs(self.vfs_of(tile), session))  # a put cut short
            session.close()

    # -- a line --------------------------------------------------------------------------------

    def _serve_exec(self, tile, sid, seq, line, payload=b"", eof=False, width=0, emit=None,
                    echoes_ctrl_c=False) -> dict:
        session = self._session(tile, sid)
        output = Output(emit)
        if session.busy:
            output.write("err", "sh: this session's previous command is still being stopped; "
                         "try again in a moment\n")
            return {**session.state(1), "output": output.take()}
        if seq in session.cancelled:  # Ctrl-C came before tile 0 could start it
            session.cancelled.discard(seq)
            session.seq = seq
            if not echoes_ctrl_c:
                output.write("err", "^C\n")
            return {**session.state(EXIT_INTERRUPTED), "output": output.take()}
        session.busy = True
        session.seq = seq
        session.interrupted = False
        session.stopped = None
        session.width = width
        session.echoes_ctrl_c = echoes_ctrl_c
        try:
            vfs = self.vfs_of(tile)
            if session.mode == SHELL and eof:  # the terminal's input has ended
                sh = Context(server=self, tile=tile, session=session, fs=SessionFs(vfs, session),
                             output=output, payload=b"", name="sh")
                self._guarded(sh, lambda: _progcmds.end_sessions(sh))
                status = session.status
            elif session.mode == SHELL:
                status = self._run_line(tile, session, vfs, line, payload or b"", output)
            else:
                sh = Context(server=self, tile=tile, session=session, fs=SessionFs(vfs, session),
                             output=output, payload=b"", name=session.mode)
                status = self._guarded(sh, lambda: _progcmds.repl_line(sh, line, eof))
        finally:
            session.busy = False
            session.job = None
        session.status = status
        result = {**session.state(status), "output": output.take()}
        ending = self.host.halting()
        if ending is not None:  # (what it stopped was not stopped by a Ctrl-C: the terminal says so)
            result["ended"] = ending
        return result

    def _run_line(self, tile, session: Session, vfs, line: str, payload: bytes, output: Output) -> int:
        try:
            commands = parse_line(line)
        except ShellSyntaxError as exc:
            output.write("err", f"sh: {exc}\n")
            return 2
        for index, command in enumerate(commands):
            if _progcmds.enters_repl(command):
                if command.redirect is not None:
                    output.write("err", f"{command.name}: a repl's output cannot be redirected\n")
                    return 2
                if index != len(commands) - 1:
                    output.write("err", f"{command.name}: must be the last command on its line "
                                        "(the lines that follow are its input)\n")
                    return 2
        status = session.status
        for command in commands:
            status = self._run_command(tile, session, vfs, command, payload, output)
            session.status = status
            if session.interrupted or session.mode != SHELL:
                break  # Ctrl-C stops the rest of the line; a repl takes the next lines
        return status

    def _run_command(self, tile, session: Session, vfs, command, payload: bytes, output: Output) -> int:
        name = command.name
        spec = COMMANDS.get(name)
        if spec is None:
            # never handed to the host (IPUpy ran unknown commands with system())
            output.write("err", f"{name}: command not found (help lists the commands)\n")
            return EXIT_NOT_FOUND
        fs = SessionFs(vfs, session)
        sh = Context(server=self, tile=tile, session=session, fs=fs, output=output,
                     payload=payload, name=name)

        def run() -> int:
            args = _expand(fs, command.words[1:])
            if command.redirect is None:
                return spec.handler(sh, args)
            target, append = command.redirect
            flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
            path = target.text
            if target.pattern is not None:  # as bash: the one file it matches, else itself
                matches = fs.glob(target.pattern)
                if len(matches) > 1:
                    sh.name = "sh"
                    return sh.error(f"{target.text}: ambiguous redirect")
                path = matches[0] if matches else path
            try:
                sh.redirect = fs.open_raw(path, flags)
                sh.redirect_place = fs.place(path)
            except OSError as exc:
                sh.name = "sh"
                return sh.oserror(exc)
            try:
                return spec.handler(sh, args)
            finally:
                redirect, sh.redirect = sh.redirect, None
                redirect.close()

        return self._guarded(sh, run)

    def _guarded(self, sh: Context, run) -> int:
        """Run a command, turning everything it raises into a message and a status."""
        try:
            status = run()
            return status if isinstance(status, int) else 0
        except Usage as exc:
            status = sh.error(str(exc), 2)
            spec = COMMANDS.get(sh.name)
            if spec:  # (a line of its own: the command's text, not the user's, is never escaped)
                sh.output.write("err", f"usage: {spec.usage}\n")
            return status
        except (TileInterrupt, JobAborted) as exc:
            return self._interrupted(sh, exc)
        except OSError as exc:
            return sh.oserror(exc)
        except (ValueError, MemoryError) as exc:
            return sh.error(str(exc))
        except Exception as exc:
            log.error("shell command %r failed", sh.name, exc_info=True)
            return sh.error(f"internal error: {type(exc).__name__}: {exc} (the machine's log has details)")

    def _interrupted(self, sh: Context, exc: BaseException) -> int:
        """A command stopped by an interrupt: print ^C (unless the user's Ctrl-C shows on
        their terminal already) and, if it was the user's, that the command was. If the signal was not for this command (tile 0 served it
        while a job's part on tile 0 waited below it), give it back to the tile so that
        job still gets it."""
        session = sh.session
        mine = session.interrupted or (isinstance(exc, ShellInterrupt) and exc.sid == session.id)
        if not mine and sh.tile.signal is None:
            sh.tile.signal = exc
        if self.host.halting() is not None:
            return EXIT_INTERRUPTED  # (no Ctrl-C's: the terminal says the session ends, and why)
        if not (mine and session.echoes_ctrl_c):
            sh.output.write("err", "^C\n")
        if mine:  # (as put and get say: a cp cut short has not copied)
            sh.output.write("err", f"{sh.name}: interrupted\n")
        return EXIT_INTERRUPTED

    # -- completion and host files ---------------------------------------------------------

    def _serve_complete(self, tile, sid, text) -> tuple[int, list[str]]:
        session = self._session(tile, sid)
        return complete(SessionFs(self.vfs_of(tile), session), session, text)

    def _serve_put(self, tile, sid, path, name, data, offset, last=True, cancelled=None) -> str | None:
        """Write host bytes at ``offset`` of what becomes ``path`` (a directory gets
        ``name`` inside it) when the ``last`` chunk is in. Until then they go to a file of
        the session's beside it, so a put that fails (no space, Ctrl-C) leaves the old
        file, or none, as it was. That file goes as soon as the put is known not to
        finish (an error, ``shell.put_abort``, ``cancelled()`` turning true: the terminal's
        Ctrl-C), else when the session's next put starts or the session closes. Returns
        the absolute path written, or None if the put was given up before this chunk's
        end (nothing was put in place)."""
        session = self._session(tile, sid)
        fs = SessionFs(self.vfs_of(tile), session)
        if session.put_writing:  # (its terminal gave up waiting for a chunk still being written)
            raise OSError(errno.EBUSY, "the previous put is still being stopped; try again in a moment", path)
        target = path
        if offset == 0:
            session.abandon_put(fs)  # one cut short before, whose terminal could not say so
            session.put_abandoned = False

        def given_up() -> bool:
            if cancelled is not None and cancelled():
                session.put_abandoned = True
            return session.put_abandoned

        session.put_writing = True
        try:
            if offset == 0:
                target = resolve_target(fs, path, name)
            if not given_up():
                self._write_put_chunk(fs, session, target, data, offset)
            # the last moment to stop: once in place, the put has happened, whatever comes after
            if last and not given_up():
                fs.rename(session.put_temporary, target)
                session.put_temporary = None
                return target
            given_up()
        except BaseException as exc:
            session.put_abandoned = True
            if isinstance(exc, OSError):
                exc.filename = target  # the shell's name (another tile's error names its own path)
            raise
        finally:
            session.put_writing = False
            if session.put_abandoned:
                session.abandon_put(fs)
        return None if session.put_abandoned else target

    def _write_put_chunk(self, fs, session: Session, target: str, data, offset: int) -> None:
        """Write one chunk of a put into the file it goes to until its last chunk is in."""
        if offset == 0:
            session.put_temporary = posixpath.join(posixpath.dirname(target), f".ipuos-put-{session.id}")
            file = fs.open_raw(session.put_temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        elif session.put_temporary is None:
            raise OSError(errno.EINVAL, "no put of this session is under way", target)
        else:
            file = fs.open_raw(session.put_temporary, os.O_WRONLY)
            file.seek(offset)
        try:
            file.write(data)
        except BaseException:
            close_after_failure(file)
            raise
        file.close()

    def _serve_put_abort(self, tile, sid) -> None:
        """The terminal gives up its put (Ctrl-C, or its host file failed): remove what
        the put wrote."""
        session = self._session(tile, sid)
        session.abandon_put(SessionFs(self.vfs_of(tile), session))

    def _serve_df(self, tile) -> tuple[int, int]:
        """(size, used) of this tile's own disk. A disk nothing has used yet is empty, and
        is not formatted to say so; one a restore filled is mounted to count what it holds."""
        from ipuos.vfs import DISK_REGION  # (see shell/__init__: what the terminal imports)

        if self.storage.state(tile) == "blank":
            region = tile.memory.get(DISK_REGION)
            return (region.size if region is not None else 0, 0)
        info = self.vfs_of(tile).statvfs("/")
        size = info.f_blocks * info.f_frsize
        return (size, size - info.f_bfree * info.f_frsize)

    def _serve_get(self, tile, sid, path, offset, size) -> bytes:
        session = self._session(tile, sid)
        fs = SessionFs(self.vfs_of(tile), session)
        try:
            with fs.open(path, "rb") as file:
                file.seek(offset)
                return file.read(size)
        except OSError as exc:
            exc.filename = path
            raise


def _expand(fs: SessionFs, words) -> list[str]:
    """Arguments with globs expanded (a pattern that matches nothing stays as it is)."""
    args = []
    for word in words:
        if word.pattern is None:
            args.append(word.text)
        else:
            args.extend(fs.glob(word.pattern) or [word.text])
    return args


# -- services every tile answers -------------------------------------------------------------


def _serve_meminfo(tile) -> tuple[int, int, list[tuple[str, int]]]:
    """(SRAM size, bytes used, [(region, size), ...]) of this tile."""
    memory = tile.memory
    return (memory.size, memory.used, [(region.name, region.size) for region in memory.regions])
