"""Daemon command handlers for the shell (registered on import by ``_commands``).

The shell itself runs on tile 0 (``ipuos.shell``); these handlers only carry requests
there and answers back:

| command | arguments | what |
|---|---|---|
| ``shell.attach`` | width, tz | opens a session on tile 0; emits ``attached`` with its id, then stays in flight until the client goes (the session closes then) |
| ``shell.exec`` | session, seq, line, eof, width, echoes_ctrl_c; payload | runs a line; emits ``{"output": [[stream, text], ...]}`` as it comes; cancel = Ctrl-C |
| ``shell.complete`` | session, text | ``{"start", "words"}`` |
| ``shell.put`` | session, path, name, offset, last; payload | writes a chunk of a host file (in place at the last); ``{"path"}`` (null: stopped by a cancel, nothing in place) |
| ``shell.put_abort`` | session | the put under way will not finish: its partial file is removed |
| ``shell.get`` | session, path, offset, size | a chunk of a chip file as the payload |

Keeping ``shell.attach`` in flight for the session's life does two things: the
connection never looks idle to the daemon, and a client that dies (or is killed) closes
its session, since a disconnect cancels the call.

What the shell needs from the runtime (starting programs and repls, listing and killing
jobs) it gets from :class:`_DaemonShellHost`, built here because the shell layer may not
import the runtime. Jobs the shell starts are registered with the host like ``ipuos run``
jobs, so ``ipuos ps`` names them, ``ipuos kill`` stops them, and halting interrupts them.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
import weakref
from dataclasses import dataclass

from ._commands import Arg, Call, CommandError, Reply, busy_why, command
from ._host import HostedJob, MachineHost
from ._machine import RunHandle
from ._runresult import STOPPED_FOR_GOOD, process_status
from ._runtime import ReplBlock
from ._timezone import client_zone
from ._tilespec import format_tiles
from .shell import ShellServer

#: the tile the shell runs on
SHELL_TILE = 0
#: how long a request that should be quick (open, complete, put, get) may wait for tile 0
QUICK_SECONDS = 30.0
#: most bytes ``shell.get`` returns at once
MAX_GET = 4 << 20


# -- what the shell needs from the runtime ---------------------------------------------------


class _Launched:
    """A job the shell started, as the shell sees it."""

    def __init__(self, handle: RunHandle):
        self.handle = handle
        self.job = handle.job

    def report(self, max_groups):
        result = self.handle.wait(0)  # the shell has waited for the job on tile 0 already
        per_tile = [(tile.tile, tile.output, tile.error) for tile in result.tiles]
        # (a repl block's exit() ends the repl, which says on which tiles, with which status)
        repl_block = isinstance(self.handle.program, ReplBlock)
        return result.format(max_groups, exit_codes=not repl_block), result.exit_status, per_tile

    def exits(self) -> list[tuple[int, int]]:
        ranks = getattr(self.handle.program, "exited", ())
        if not ranks:
            return []
        return [(tile.tile, process_status(tile.exit_code)) for tile in self.handle.wait(0).tiles
                if tile.rank in ranks]


class _Repl:
    def __init__(self, repl, shell_host: "_DaemonShellHost", client_pid):
        self.repl = repl
        self.tiles = format_tiles(repl.tile_ids)
        self.ntiles = len(repl.tile_ids)
        self._shell_host = shell_host
        self._client_pid = client_pid

    def launch(self, source: str, *, echo: bool = True, cwd: str | None = None, sink=None) -> _Launched:
        handle = self.repl.launch(source, echo=echo, cwd=cwd, sink=sink)
        self._shell_host.track(handle, handle.job.name, self.tiles, self._client_pid)
        return _Launched(handle)

    def namespace(self) -> dict:
        return self.repl.namespace(0)

    def close(self) -> _Launched | None:
        handle = self.repl.end()
        if handle is None:
            return None
        # (what the session kept between its blocks has been frozen: ipuos._collector)
        self._shell_host.track(handle, handle.job.name, self.tiles, self._client_pid, thaw=True)
        return _Launched(handle)


@dataclass
class _JobInfo:
    id: int
    name: str
    tiles: str
    ntiles: int
    elapsed: float | None
    client_pid: int | None


class _DaemonShellHost:
    """The :class:`~ipuos.shell.ShellHost` of a daemon (called on tile 0's greenlet)."""

    def __init__(self, host: MachineHost):
        self.host = host
        self.machine = host.machine

    def launch(self, source, filename, tiles, data, argv, budget, client_pid) -> _Launched:
        handle = self.machine.launch(source, tiles, data, filename=filename, budget=budget, argv=argv)
        self.track(handle, filename, tiles, client_pid)
        return _Launched(handle)

    def open_repl(self, tiles, data, client_pid) -> _Repl:
        return _Repl(self.machine.repl(tiles, data), self, client_pid)

    def track(self, handle: RunHandle, name: str, tiles: str, client_pid, *, thaw: bool = False) -> None:
        hosted = HostedJob(handle, name, tiles, time.monotonic(), client_pid)
        self.host.add_job(hosted)
        handle.job.future.add_done_callback(lambda _: self.host.remove_job(hosted.id, thaw))

    def jobs(self) -> list[_JobInfo]:
        hosted = {job.id: job for job in self.host.jobs()}
        now = time.monotonic()
        found = []
        for job in list(self.machine.scheduler.jobs.values()):
            mine = hosted.get(job.id)
            found.append(_JobInfo(job.id, mine.name if mine else job.name, format_tiles(job.ids),
                                  len(job.ids), now - mine.started if mine else None,
                                  mine.client_pid if mine else None))
        return sorted(found, key=lambda info: info.id)

    def halting(self) -> str | None:
        return f"machine {self.host.name!r} is halting" if self.host.halt_requested.is_set() else None

    def kill(self, job_id: int, reason: str) -> bool:
        job = self.machine.scheduler.jobs.get(job_id)
        if job is None:
            return False
        self.machine.scheduler.interrupt_job(job, reason)
        return True


# -- one shell server per daemon ---------------------------------------------------------------

_servers: "weakref.WeakKeyDictionary[MachineHost, ShellServer]" = weakref.WeakKeyDictionary()
_servers_lock = threading.Lock()


def _server(host: MachineHost) -> ShellServer:
    with _servers_lock:
        server = _servers.get(host)
        if server is None:
            machine = host.machine
            server = ShellServer(machine.scheduler, machine.storage, _DaemonShellHost(host),
                                 tile=SHELL_TILE)
            server.install()
            _servers[host] = server
        return server


def _ask(call: Call, service: str, *args, timeout: float | None = QUICK_SECONDS):
    """Run a shell service on tile 0 and wait for it; errors become CommandErrors."""
    future = call.host.machine.scheduler.submit(SHELL_TILE, service, *args)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        raise CommandError("timeout", f"tile {SHELL_TILE} (the shell's) did not answer within {timeout:g} s: "
                           f"{busy_why(call.host)}") from None
    except OSError as exc:
        raise CommandError("os_error", _os_message(exc)) from None
    except LookupError as exc:
        raise CommandError("no_session", str(exc.args[0] if exc.args else exc)) from None
    except RuntimeError as exc:
        raise CommandError("not_running", str(exc)) from None


def _os_message(exc: OSError) -> str:
    reason = exc.strerror or str(exc)
    return f"{exc.filename}: {reason}" if exc.filename is not None else reason


# -- the commands ------------------------------------------------------------------------------


@command("shell.attach", Arg("width", int, 0), Arg("tz", str, None), timeout=None)
def _attach(call: Call):
    """Open a shell session on tile 0; it lasts until this call is cancelled or the client
    disconnects. ``tz``: the client's TZ (None: unset), the zone the session shows times in."""
    server = _server(call.host)
    opened = _ask(call, "shell.open", call.peer_pid, call.args["width"], client_zone(call.args["tz"]))
    sid = opened["session"]
    gone = threading.Event()
    call.on_cancel(gone.set)
    try:
        call.emit({"event": "attached", **opened})
        while not gone.wait(0.25):
            if call.host.halt_requested.is_set():
                break  # halting: let the connection finish now, not after the grace period
    finally:
        halting = call.host.halt_requested.is_set()
        server.interrupt(sid, ctrl_c=False, reason=f"machine {call.host.name!r} is halting" if halting
                         else "the shell's terminal went away")
        try:
            call.host.machine.scheduler.submit(SHELL_TILE, "shell.close", sid)
        except RuntimeError:
            pass  # the machine has stopped
    return {"session": sid, "closed": True}


@command("shell.exec", Arg("session", int), Arg("seq", int), Arg("line", str), Arg("eof", bool, False),
         Arg("width", int, 0), Arg("echoes_ctrl_c", bool, False), timeout=None)
def _exec(call: Call):
    """Run one line in a session; output streams as ``output`` events; cancel = Ctrl-C."""
    server = _server(call.host)
    args = call.args
    pieces: queue.SimpleQueue = queue.SimpleQueue()
    done = object()
    try:
        future = call.host.machine.scheduler.submit(
            SHELL_TILE, "shell.exec", args["session"], args["seq"], args["line"], call.payload,
            args["eof"], args["width"], pieces.put, args["echoes_ctrl_c"])
    except RuntimeError as exc:  # the machine is stopping
        raise CommandError("not_running", str(exc)) from None

    def cancelled() -> None:
        pieces.put(_CUT)  # (before the tile hears of it: what it prints from now on comes after)
        server.interrupt(args["session"], args["seq"])

    call.on_cancel(cancelled)
    # (the terminal's second Ctrl-C, or its going away, gives up on the line: a program
    # that caught the first Ctrl-C and runs on is stopped whatever it catches)
    call.on_abandon(lambda: server.interrupt(args["session"], args["seq"], ctrl_c=False, reason=STOPPED_FOR_GOOD))
    future.add_done_callback(lambda _: pieces.put(done))
    finished = passed_cut = False
    while not finished:
        batch = [pieces.get()]
        size = 0
        # what piled up meanwhile goes as one event (of a size the reply's header limit
        # takes even with every character escaped in JSON)
        while batch[-1] is not done and size < MAX_EVENT_CHARS and not pieces.empty():
            if batch[-1] is not _CUT:
                size += sum(len(text) for _, text in batch[-1])
            batch.append(pieces.get())
        finished = batch[-1] is done
        if call.cancelled.is_set() and not passed_cut:
            # a Ctrl-C: what the tile printed before it and the terminal has not been sent
            # is dropped, as a terminal's INTR flushes the output it holds (a big `cat` to
            # a slow terminal went on for seconds, to its end); what the command prints
            # after it (a handler's cleanup) goes on, after a "cut" event that tells the
            # terminal to show output again
            cuts = [index for index, item in enumerate(batch) if item is _CUT]
            if cuts:
                batch = batch[cuts[-1] + 1:]
                passed_cut = True
                call.emit({"event": "cut"})
            else:
                batch = []
        output = _joined([piece for item in batch if item is not done and item is not _CUT for piece in item])
        if output:
            call.emit({"output": output})
    try:
        return future.result()
    except LookupError as exc:
        raise CommandError("no_session", str(exc.args[0] if exc.args else exc)) from None


#: in a line's output queue: the client's Ctrl-C came here (see _exec)
_CUT = object()

#: the output characters one ``output`` event gathers, at most (about; see _exec)
MAX_EVENT_CHARS = 1024 * 1024


def _joined(pieces: list[list[str]]) -> list[list[str]]:
    """``(stream, text)`` pieces with each run of one stream's made one: a program that
    prints line by line, streamed to the terminal, goes out in as few events as the
    terminal can take."""
    runs: list[tuple[str, list[str]]] = []
    for stream, text in pieces:
        if runs and runs[-1][0] == stream:
            runs[-1][1].append(text)
        else:
            runs.append((stream, [text]))
    return [[stream, "".join(texts)] for stream, texts in runs]


@command("shell.complete", Arg("session", int), Arg("text", str), timeout=10.0)
def _complete(call: Call):
    """Tab completion: where the word starts and what could replace it."""
    _server(call.host)
    start, words = _ask(call, "shell.complete", call.args["session"], call.args["text"], timeout=5.0)
    return {"start": start, "words": words}


@command("shell.put", Arg("session", int), Arg("path", str), Arg("name", str), Arg("offset", int),
         Arg("last", bool, True), timeout=120.0)
def _put(call: Call):
    """Write the payload (a chunk of a host file) at ``offset`` of ``path`` on the chip."""
    _server(call.host)
    args = call.args
    if args["offset"] < 0:
        raise CommandError("bad_request", "the offset cannot be negative")
    _check_chip_path(args["path"])
    # a cancel (the client's Ctrl-C) stops the put unless its file is in place already;
    # the reply says which
    path = _ask(call, "shell.put", args["session"], args["path"], args["name"], call.payload,
                args["offset"], args["last"], call.cancelled.is_set, timeout=110.0)
    return {"path": path}  # (None: the put was given up, and nothing put in place)


def _check_chip_path(path: str) -> None:
    # (the VFS raises ValueError for it, as Python's own open does: here it is the request's fault)
    if "\0" in path:
        raise CommandError("bad_request", f"{path!r}: a file name cannot hold a NUL byte")


@command("shell.put_abort", Arg("session", int), timeout=60.0)
def _put_abort(call: Call):
    """The client gives up its put: tile 0 removes what the put wrote."""
    _server(call.host)
    _ask(call, "shell.put_abort", call.args["session"])
    return {}


@command("shell.get", Arg("session", int), Arg("path", str), Arg("offset", int), Arg("size", int),
         timeout=120.0)
def _get(call: Call):
    """Read up to ``size`` bytes of ``path`` on the chip from ``offset`` (the payload)."""
    _server(call.host)
    args = call.args
    if args["offset"] < 0 or not 0 < args["size"] <= MAX_GET:
        raise CommandError("bad_request", f"offset must be >= 0 and size 1..{MAX_GET}")
    _check_chip_path(args["path"])
    data = _ask(call, "shell.get", args["session"], args["path"], args["offset"], args["size"],
                timeout=110.0)
    return Reply({"size": len(data)}, bytes(data))
