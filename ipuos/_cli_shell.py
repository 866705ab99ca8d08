"""CLI commands for the shell (added to the ``ipuos`` group on import by ``_cli``).

``ipuos shell`` attaches a terminal to the shell on tile 0 (starting the machine if none
runs, like ``ipuos run``); ``ipuos repl`` is the same terminal started in the multirepl.
:class:`DaemonTransport` is how the terminal (``ipuos.shell.Terminal``, which may not
import the client) reaches its session: one connection holds the session open
(``shell.attach``), another carries the lines, so a long command never blocks the
session's life line and vice versa.
"""

from __future__ import annotations

import itertools
import shutil
import socket
import sys
import threading
import time

import click

from ._cli import (
    EXIT_INTERRUPTED,
    _Errors,
    _fail,
    _geometry,
    attach_machine,
    ipus_option,
    main,
    name_option,
    preset_option,
)
from ._client import Client, DaemonError, MachineNotRunning
from ._protocol import REQUEST_LIMITS, json_bytes
from ._rundir import MachinePaths, hint
from .shell import RemoteError, quote

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
        self._holder = Client(paths)
        self._thread = threading.Thread(target=self._hold, args=(width,), daemon=True,
                                        name="ipuos-shell-attach")
        self._thread.start()
        if not self._attached.wait(PATIENCE_SECONDS):
            click.echo(f"ipuos: waiting for tile 0 of machine {paths.name!r}, where the shell runs: the "
                       "machine is busy (a program computing without reaching an exchange point holds "
                       f"every tile; {hint('ps', paths.name)} shows jobs, {hint('kill JOB', paths.name)} "
                       "stops one)", err=True)
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
            self._holder.call("shell.attach", {"width": width}, wait=None, on_event=self._event)
        except BaseException as exc:  # the daemon went away, or we closed the connection
            self._error = exc
        finally:
            self._attached.set()
            if self.state and not self._closing:
                self._session_lost()

    def _session_lost(self) -> None:
        # a halting daemon drops sessions while it still answers for a moment: wait for
        # it to go before saying it did not
        deadline = time.monotonic() + HALTING_SECONDS
        while True:
            try:
                Client(self.paths).close()
            except MachineNotRunning:
                why = f"machine {self.paths.name!r} has halted"
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
                raise _Fatal(str(exc)) from None
            except DaemonError as exc:
                if exc.code == "disconnected":
                    self._client = None
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

    def execute(self, line: str, *, payload: bytes = b"", eof: bool = False, on_output, width: int = 0) -> dict:
        def event(ev: dict) -> None:
            for stream, text in ev.get("output") or ():
                on_output(stream, text)

        size = len(json_bytes(line))  # as the request carries it
        if size > LINE_MAX:
            raise RemoteError(f"a line of {size:,} bytes is too long for the shell (at most {LINE_MAX:,}); "
                              "put long text in a file (`put` copies one from the host)")
        def interrupted(count: int) -> None:
            if count == 1:  # (after the ^C a terminal echoes: the report starts a line)
                on_output("err", "\n")

        args = {"seq": next(self._seq), "line": line, "eof": eof, "width": width}
        result, _ = self._call("shell.exec", args, payload, wait=None, interruptible=True, on_event=event,
                               on_interrupt=interrupted)
        try:
            for stream, text in result.pop("output", None) or ():
                on_output(stream, text)
        except KeyboardInterrupt:
            # Ctrl-C while a slow terminal still prints what a finished command wrote: the
            # rest goes, the result stays (its mode, directory and status are tile 0's now)
            on_output("err", "^C\n")
        return result

    def complete(self, text: str) -> tuple[int, list[str]]:
        result, _ = self._call("shell.complete", {"text": text}, timeout=COMPLETE_SECONDS)
        return result["start"], result["words"]

    def put(self, path: str, chunks, name: str) -> str:
        offset = 0
        target = path
        chunks = iter(chunks)
        data = next(chunks, b"")
        while True:
            following = next(chunks, None)  # the last chunk says so: the file is put in place then
            result, _ = self._call("shell.put", {"path": target, "name": name, "offset": offset,
                                                 "last": following is None}, data, timeout=120.0)
            target = result["path"]
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


# -- the commands --------------------------------------------------------------------------------


def _attach_terminal(name: str, preset, ipus, command_text: str | None, first_line: str | None) -> int:
    from .shell import Terminal, history_path

    paths, info = attach_machine(name, preset, ipus)
    interactive = command_text is None and sys.stdin.isatty() and sys.stdout.isatty()
    width = shutil.get_terminal_size().columns if interactive else 0
    with _Errors():
        try:
            transport = DaemonTransport(paths, width)
        except KeyboardInterrupt:  # given up waiting for a busy tile 0
            _fail(f"stopped waiting for tile 0 of machine {name!r}; no shell was opened", EXIT_INTERRUPTED)
    try:
        terminal = Terminal(transport, transport.state, history_file=history_path(),
                            exit_on_leave=first_line is not None)
        if first_line is not None:
            terminal.feed(first_line)
            if terminal.mode == "shell":  # the repl did not start; the error is printed
                return terminal.status or 1
        if command_text is not None:
            # lines end at newlines only, as the shell splits piped input (splitlines
            # would also break at a form feed or U+2028 inside quotes)
            lines = command_text.split("\n")
            while lines and not lines[-1]:
                lines.pop()
            return terminal.run_script(lines)
        if interactive:
            if first_line is None:
                click.echo(f"ipuos shell on machine {name!r} ({_geometry(info)}): `help` lists "
                           "commands, Ctrl-D leaves.")
            return terminal.interact()
        return terminal.run_script(sys.stdin)
    finally:
        transport.close()


@main.command()
@click.option("-c", "command_text", metavar="LINES", help="run these shell lines and exit with the last status")
@preset_option(None)
@ipus_option(None)
@name_option
def shell(command_text, preset, ipus, name) -> None:
    """The shell on tile 0: files of every tile, programs, the multirepl.

    Starts the machine if it is not running. Reads commands from the terminal, from -c,
    or from a pipe; the exit status is the last command's.
    """
    sys.exit(_attach_terminal(name, preset, ipus, command_text, None))


@main.command()
@click.option("--tiles", "tile_spec", default="all", show_default=True, help="tiles to run every block on")
@click.option("--data", "data_file", type=click.Path(exists=True, dir_okay=False),
              help="host file split over the tiles as __tiledata")
@click.option("-c", "command_text", metavar="CODE", help="run these lines as blocks and exit")
@preset_option(None)
@ipus_option(None)
@name_option
def repl(tile_spec, data_file, command_text, preset, ipus, name) -> None:
    """The multirepl: every block of Python runs on every selected tile.

    Names persist between blocks; output (and exceptions) are grouped by identical text,
    most frequent first, with tile ranges.
    """
    line = f"multirepl --tiles {quote(tile_spec)}"
    if data_file is not None:
        line += f" --data {quote(data_file)}"
    sys.exit(_attach_terminal(name, preset, ipus, command_text, line))
