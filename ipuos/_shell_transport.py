"""How ``ipuos shell`` and ``ipuos repl`` reach the shell on tile 0 through the daemon.

:class:`DaemonTransport` is how the terminal (``ipuos.shell.Terminal``, which may not
import the client) reaches its session: one connection holds the session open
(``shell.attach``), another carries the lines, so a long command never blocks the
session's life line and vice versa. (Apart from the commands in ``_cli_shell``, which
every ``ipuos`` command imports: this needs the shell package.)
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time

import click

from ._client import RESULT_LINGER_SECONDS, Client, DaemonError, MachineNotRunning
from ._protocol import REQUEST_LIMITS, json_bytes
from ._rundir import MachinePaths, hint
from .shell import RemoteError

#: bytes per put/get request
CHUNK = 1 << 20
#: the daemon gives up on tile 0 after 30 s (``_cmd_shell.QUICK_SECONDS``); this is later
ATTACH_SECONDS = 40.0
#: after this long without a session, say why the shell does not start
PATIENCE_SECONDS = 2.0
#: how long a session that ended may wait to see its machine finish halting
HALTING_SECONDS = 3.0
#: reconnect the line connection before the daemon would close it as idle (60 s)
IDLE_RECONNECT_SECONDS = 30.0
#: how long Tab waits for tile 0: the line cannot be edited meanwhile, and tile 0 answers
#: in a superstep or two unless a tile computes without an exchange point (then no wait helps)
COMPLETE_SECONDS = 1.5
#: how long a put given up waits for tile 0 to remove its partial file (a busy tile 0 does
#: it later: the request stays queued)
ABORT_SECONDS = 5.0
#: what a put reports when a second Ctrl-C stops the wait for tile 0's answer (tile 0 saw
#: the first, unless the answer was already on its way)
PUT_GIVEN_UP = ("stopped waiting for tile 0, which drops the copy unless it was put in place "
                "before the Ctrl-C reached it")
#: the longest line the shell sends (as JSON text): it rides in a request's header,
#: beside a few small fields
LINE_MAX = REQUEST_LIMITS.max_header - 1024


class _Fatal(RemoteError):
    """The machine went away: the terminal stops."""

    fatal = True


def _remote(exc: DaemonError) -> RemoteError:
    if exc.code in ("disconnected", "no_session", "not_running"):
        return _Fatal(exc.message)
    return RemoteError(exc.message)


class DaemonTransport:
    """A shell session on a machine daemon (see module doc); implements
    ``ipuos.shell.Transport``."""

    def __init__(self, paths: MachinePaths, width: int = 0):
        self.paths = paths
        self.state: dict = {}
        self._attached = threading.Event()
        self._error: BaseException | None = None
        self._closing = False
        #: why the session ended under the terminal (the machine halted), once it has
        self._lost: str | None = None
        self._on_lost: list = []
        #: the session's holder has finished (and set ``_lost`` if the session was lost)
        self._held = threading.Event()
        self._holder = Client(paths)
        self._thread = threading.Thread(target=self._hold, args=(width,), daemon=True,
                                        name="ipuos-shell-attach")
        self._thread.start()
        if not self._attached.wait(PATIENCE_SECONDS):
            click.echo(f"ipuos: waiting for tile 0 of machine {paths.name!r}, where the shell runs: the "
                       "machine answers between supersteps, and is in a long one (tiles compute one after "
                       "another, so a superstep lasts as long as all its tiles' compute together, and a "
                       "program computing without reaching an exchange point holds every tile; "
                       f"{hint('ps', paths.name)} says which, {hint('kill JOB', paths.name)} stops a job)",
                       err=True)
        if not self._attached.wait(ATTACH_SECONDS - PATIENCE_SECONDS):
            self._holder.close()
            raise DaemonError("timeout", f"machine {paths.name!r} did not open a shell session "
                              f"within {ATTACH_SECONDS:g} s")
        if not self.state:
            raise self._error or DaemonError("disconnected", "the shell session could not be opened")
        self.session = self.state["session"]
        self._client: Client | None = None
        self._used = 0.0
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def _hold(self, width: int) -> None:
        try:
            # (TZ: the shell's times are shown in the zone the user's own tools show them in)
            self._holder.call("shell.attach", {"width": width, "tz": os.environ.get("TZ")}, wait=None,
                              on_event=self._event)
        except BaseException as exc:  # the daemon went away, or we closed the connection
            self._error = exc
        finally:
            self._attached.set()
            try:
                if self.state and not self._closing:
                    self._session_lost()
            finally:
                self._held.set()

    def _session_lost(self) -> None:
        # a halting daemon drops sessions while it still answers for a moment: wait for
        # it to go before saying it did not
        deadline = time.monotonic() + HALTING_SECONDS
        while True:
            try:
                Client(self.paths).close()
            except MachineNotRunning as exc:
                # (a halt removes the socket; a daemon that died leaves it, nobody listening)
                why = (f"machine {self.paths.name!r} stopped without halting: its daemon crashed or was "
                       f"killed (its log is {self.paths.log})" if exc.stale
                       else f"machine {self.paths.name!r} has halted")
            except DaemonError:
                why = f"machine {self.paths.name!r} does not answer"
            else:
                if time.monotonic() < deadline:
                    time.sleep(0.05)
                    continue
                why = f"machine {self.paths.name!r} closed the session"
            break
        self._lost = f"the shell session ended: {why}"
        for callback in list(self._on_lost):
            callback(self._lost)

    def _why_lost(self) -> str | None:
        """Why the session ended, when a request finds the machine gone: the holder tells
        a halt from a crash (a request's broken connection cannot), once it has looked."""
        self._held.wait(HALTING_SECONDS + 2.0)
        return self._lost

    def when_lost(self, callback) -> None:
        """Call ``callback(message)`` (from another thread) if the session ends under the
        terminal, as when the machine halts: the terminal need not wait for a line."""
        self._on_lost.append(callback)
        if self._lost is not None:
            callback(self._lost)

    def _event(self, event: dict) -> None:
        if event.get("event") == "attached":
            self.state = dict(event)
            self._attached.set()

    def _line(self) -> Client:
        """The connection for requests, fresh if the daemon may have closed it as idle."""
        now = time.monotonic()
        if self._client is None or now - self._used > IDLE_RECONNECT_SECONDS:
            if self._client is not None:
                self._client.close()
            self._client = Client(self.paths)
        self._used = now
        return self._client

    def _call(self, cmd: str, args: dict, payload: bytes = b"", **options):
        with self._lock:
            try:
                return self._line().request(cmd, {"session": self.session, **args}, payload, **options)
            except MachineNotRunning as exc:
                self._client = None
                raise _Fatal(self._why_lost() or str(exc)) from None
            except DaemonError as exc:
                if exc.code == "disconnected":
                    self._client = None
                    raise _Fatal(self._why_lost() or exc.message) from None
                raise _remote(exc) from None
            except KeyboardInterrupt:
                # the reply may be half read: this connection is out of step from here on
                if self._client is not None:
                    self._client.close()
                    self._client = None
                raise
            finally:
                self._used = time.monotonic()

    # -- the Transport protocol ------------------------------------------------------------------

    def execute(self, line: str, *, payload: bytes = b"", eof: bool = False, on_output, width: int = 0,
                echoes_ctrl_c: bool = False) -> dict:
        #: after a Ctrl-C, until the daemon says where it cut the output ("cut"): what
        #: arrives meanwhile was printed before the Ctrl-C, and is dropped as a terminal's
        #: INTR drops the output it holds (what the command prints after, a handler's
        #: cleanup, comes after the cut and is shown)
        dropping = []

        def event(ev: dict) -> None:
            if ev.get("event") == "cut":
                dropping.clear()
                return
            if dropping:
                return
            for stream, text in ev.get("output") or ():
                on_output(stream, text)

        size = len(json_bytes(line))  # as the request carries it
        if size > LINE_MAX:
            raise RemoteError(f"a line of {size:,} bytes is too long for the shell (at most {LINE_MAX:,}); "
                              "put long text in a file (`put` copies one from the host)")
        pressed = []

        def interrupted(count: int) -> None:
            pressed.append(count)
            if count == 1:
                dropping.append(True)
            on_output("err", "\n")  # (after the ^C a terminal echoes: what follows starts a line)

        args = {"seq": next(self._seq), "line": line, "eof": eof, "width": width, "echoes_ctrl_c": echoes_ctrl_c}
        result, _ = self._call("shell.exec", args, payload, wait=None, interruptible=True, on_event=event,
                               on_interrupt=interrupted, linger=RESULT_LINGER_SECONDS)
        result["ctrl_c"] = bool(pressed)  # (the user's: a status of 130 may be a program's own)
        try:
            for stream, text in result.pop("output", None) or ():
                on_output(stream, text)
        except KeyboardInterrupt:
            # Ctrl-C while a slow terminal still prints what a finished command wrote: the
            # rest goes, the result stays (its mode, directory and status are tile 0's now)
            on_output("err", "\n" if echoes_ctrl_c else "^C\n")
        return result

    def complete(self, text: str) -> tuple[int, list[str]]:
        result, _ = self._call("shell.complete", {"text": text}, timeout=COMPLETE_SECONDS)
        return result["start"], result["words"]

    def put(self, path: str, chunks, name: str, *, on_interrupt=None) -> str:
        try:
            return self._put(path, chunks, name, on_interrupt)
        except BaseException:
            # Ctrl-C, or the host file failed: its partial copy on the chip goes at once
            try:
                self._call("shell.put_abort", {}, timeout=ABORT_SECONDS, wait=ABORT_SECONDS)
            except RemoteError:
                pass  # (else tile 0 removes it when the session's next put starts, or it ends)
            raise

    def _put(self, path: str, chunks, name: str, on_interrupt) -> str:
        offset = 0
        target = path
        chunks = iter(chunks)
        data = next(chunks, b"")
        stopping = []

        def interrupted(count: int) -> None:
            if count == 1:  # the request is cancelled: tile 0 stops the put unless it is done
                stopping.append(True)
                if on_interrupt is not None:
                    on_interrupt()

        while True:
            following = next(chunks, None)  # the last chunk says so: the file is put in place then
            try:
                result, _ = self._call("shell.put", {"path": target, "name": name, "offset": offset,
                                                     "last": following is None}, data, timeout=120.0,
                                       interruptible=True, on_interrupt=interrupted)
            except KeyboardInterrupt:
                if stopping:  # a second Ctrl-C
                    raise KeyboardInterrupt(PUT_GIVEN_UP) from None
                raise
            target = result["path"]
            if target is None or (stopping and following is not None):
                raise KeyboardInterrupt  # stopped in time: nothing was put in place
            offset += len(data)
            if following is None:
                return target
            data = following

    def get(self, path: str):
        offset = 0
        while True:
            result, data = self._call("shell.get", {"path": path, "offset": offset, "size": CHUNK},
                                      timeout=120.0)
            if data:
                yield data
            offset += len(data)
            if len(data) < CHUNK:
                return

    def close(self) -> None:
        """Detach: closing the session's connection ends it on tile 0."""
        self._closing = True
        for client in (self._client, self._holder):
            if client is not None:
                try:
                    client.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                client.close()
        self._thread.join(2.0)
