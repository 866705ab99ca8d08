"""The daemon's command table: one small handler per command.

A handler takes a :class:`Call` (the request's checked arguments, its payload, the
machine host, a way to stream events, a cancel hook) and returns the result: a JSON-able
value, or a :class:`Reply` to send binary data too. It raises :class:`CommandError` for
anything the user should read. To add a command (``backup``, ``mount``, ``shell`` ...)::

    @command("backup", Arg("path", str), Arg("tiles", str, "all"), timeout=None)
    def _backup(call: Call):
        for done, total in ...:
            call.emit({"progress": done, "total": total})
            if call.cancelled.is_set(): ...
        return {"bytes": n}

Arguments are checked against their :class:`Arg` declarations before the handler runs
(missing, unknown or wrongly typed ones are a ``bad_request`` error), so handlers never
see a hostile shape. ``timeout`` is the most seconds a call may take (None: until it
finishes or the client cancels); a client may ask for less. Handlers run on their own
threads and reach tiles only through the Machine's public, thread-safe methods.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import logging
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Callable

from ._host import HaltRefused, HostedJob, MachineHost
from ._protocol import BAD_REQUEST, SUPPORTED_VERSIONS, TIMEOUT, VERSION, Request, finite_number
from ._rundir import hint
from ._runjson import run_result_to_json
from ._runresult import STOPPED_FOR_GOOD
from ._truncation import split_truncation, truncation_note
from ._source import source_problem, source_text
from ._tilespec import TileSpecError, format_tiles
from .scheduler import TileBusyError, budget_seconds, describe_syntax_error

log = logging.getLogger("ipuos.daemon")

#: seconds a command may take unless it says otherwise
DEFAULT_TIMEOUT = 10.0

_REQUIRED = object()

#: one letter per tile state in ``ps`` snapshots (47,104 tiles stay a small reply)
STATE_CODES = {"idle": "i", "running": "r", "waiting": "w", "dead": "d"}
#: how long ``ps`` and ``status`` wait for a busy machine before showing its last snapshot
LOOK_SECONDS = 1.0


class CommandError(Exception):
    """A failure to report to the client as ``{"code": ..., "message": ...}``."""

    def __init__(self, code: str, message: str, **details):
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


@dataclass(frozen=True)
class Arg:
    """One argument of a command: its name, JSON type, and default (none: required)."""

    name: str
    kind: type
    default: object = _REQUIRED

    def check(self, cmd: str, args: dict):
        if self.name not in args:
            if self.default is _REQUIRED:
                raise CommandError(BAD_REQUEST, f"command {cmd!r} needs the argument {self.name!r}")
            return self.default
        value = args[self.name]
        if value is None and self.default is None:
            return None
        if self.kind is float:
            number = finite_number(value)
            if number is None:
                what = (f"not {type(value).__name__}" if isinstance(value, bool) or not isinstance(value, (int, float))
                        else "and this one is infinite or too big")
                raise CommandError(
                    BAD_REQUEST, f"argument {self.name!r} of command {cmd!r} must be a finite number, {what}")
            return number
        if self.kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, self.kind)
        if not ok:
            raise CommandError(
                BAD_REQUEST,
                f"argument {self.name!r} of command {cmd!r} must be {_KIND_NAMES[self.kind]}, "
                f"not {type(value).__name__}",
            )
        return value


_KIND_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
               list: "a list", dict: "an object"}


@dataclass
class Reply:
    """A result with binary data beside it."""

    result: object
    payload: bytes = b""


@dataclass(frozen=True)
class Command:
    name: str
    handler: Callable[["Call"], object]
    args: tuple[Arg, ...]
    timeout: float | None
    help: str
    #: gets a handler thread when every ordinary one is taken (see HandlerSlots)
    urgent: bool = False

    def check_args(self, args: dict) -> dict:
        known = {a.name for a in self.args}
        unknown = sorted(set(args) - known)
        if unknown:
            raise CommandError(BAD_REQUEST, f"command {self.name!r} has no argument {unknown[0]!r}")
        return {a.name: a.check(self.name, args) for a in self.args}

    def deadline_seconds(self, asked: float | None) -> float | None:
        limits = [t for t in (self.timeout, asked) if t is not None]
        return min(limits) if limits else None


#: the command table, by name
COMMANDS: dict[str, Command] = {}


def command(name: str, *args: Arg, timeout: float | None = DEFAULT_TIMEOUT, urgent: bool = False):
    """Register the decorated function as the handler of command ``name``; ``urgent``:
    one that must get through a daemon whose handlers are all taken (see HandlerSlots)."""

    def register(fn):
        if name in COMMANDS:
            raise ValueError(f"command {name!r} is registered twice")
        COMMANDS[name] = Command(name, fn, args, timeout, (fn.__doc__ or "").strip(), urgent)
        return fn

    return register


@dataclass
class Call:
    """One request being served: what a handler gets."""

    request: Request
    args: dict
    host: MachineHost
    peer_pid: int | None
    emit_frame: Callable[[dict], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: the client has given up on the call: nobody waits for what it does any more
    abandoned: bool = False
    _cancel_hooks: list = field(default_factory=list)
    _abandon_hooks: list = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def payload(self) -> bytes:
        return self.request.payload

    def emit(self, event: dict) -> None:
        """Stream an event to the client before the result (dropped once the call ended)."""
        self.emit_frame(event)

    def on_cancel(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` when the client cancels, disconnects or the call times out
        (at once if that already happened)."""
        with self._lock:
            if not self.cancelled.is_set():
                self._cancel_hooks.append(hook)
                return
        hook()

    def on_abandon(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` (after the cancel hooks) once the client has given up on the call:
        a second cancel (its second Ctrl-C), its connection gone, the call timed out; at
        once if that already happened (a fast double Ctrl-C may come before the handler
        gets here). What the call started must then stop for good: nobody waits for it."""
        with self._lock:
            if not self.abandoned:
                self._abandon_hooks.append(hook)
                return
        hook()

    def cancel(self, abandon: bool = False) -> None:
        """The client's cancel (its Ctrl-C); ``abandon``: it has given up on the call (see
        :meth:`on_abandon`), as a second cancel also says."""
        with self._lock:
            hooks = []
            if not self.cancelled.is_set():
                self.cancelled.set()
                hooks, self._cancel_hooks = self._cancel_hooks, []
            elif not abandon:
                abandon = True  # (a second cancel)
            if abandon and not self.abandoned:
                self.abandoned = True
                hooks += self._abandon_hooks
                self._abandon_hooks = []
        for hook in hooks:
            try:
                hook()
            except Exception:  # (the client's other calls on this connection go on)
                log.exception("a cancel hook of %s failed", self.request.cmd)


# -- the commands -----------------------------------------------------------------------------


def _identity(host: MachineHost) -> dict:
    machine = host.machine
    return {
        "name": host.name,
        "pid": host.pid,
        "preset": machine.preset.name,
        "ipus": machine.ipus,
        "ntiles": machine.ntiles,
    }


@command("hello", urgent=True)
def _hello(call: Call):
    """Who this daemon is and which protocol versions it speaks."""
    return {
        "protocol": VERSION,
        "supported": list(SUPPORTED_VERSIONS),
        "ipuos": _ipuos_version(),
        **_identity(call.host),
    }


@command("status", urgent=True)
def _status(call: Call):
    """The machine: geometry, uptime, supersteps, exchange traffic and its simulated time."""
    host = call.host
    machine = host.machine
    stats, age = _look(host, "stats")
    return {
        **_identity(host),
        "tiles_per_chip": machine.preset.tiles_per_chip,
        "sram_per_tile": machine.preset.sram_per_tile,
        "uptime_seconds": host.uptime,
        "boot_seconds": machine.boot_seconds,
        "supersteps": stats["supersteps"],
        "supersteps_with_traffic": stats["supersteps_with_traffic"],
        "bytes_exchanged": stats["bytes_exchanged"],
        "simulated_exchange_seconds": stats["simulated_exchange_seconds"],
        "njobs": len(host.jobs()),
        "mounts": [active.mountpoint for active in host.mounts.mounts()],
        "socket": str(host.paths.socket),
        "log": str(host.paths.log),
        "protocol": VERSION,
        "ipuos": _ipuos_version(),
        **_staleness(host, age, "the supersteps and exchange figures are"),
    }


@command("ps", urgent=True)
def _ps(call: Call):
    """Every tile's state, job and SRAM use (compact: one letter per state), and the jobs."""
    host = call.host
    machine = host.machine
    snapshot, age = _look(host, "tile_states")
    states, jobs_of, used, waiting = [], [], [], {}
    for tile in snapshot:
        states.append(STATE_CODES.get(tile["state"], "?"))
        jobs_of.append(tile["job"])
        used.append(tile["sram_used"])
        if tile["waiting"]:
            waiting[str(tile["tile"])] = tile["waiting"]
    live = {job.id: job for job in machine.scheduler.live_jobs()}
    if age is not None:  # an old snapshot: at least show which jobs run, and where, now
        for tile, job_id in enumerate(jobs_of):
            if job_id is not None and job_id not in live:  # it has finished since
                states[tile], jobs_of[tile] = STATE_CODES["idle"], None
                waiting.pop(str(tile), None)
        for job in live.values():
            for tile in job.ids:
                states[tile], jobs_of[tile] = STATE_CODES["running"], job.id
                waiting.pop(str(tile), None)
    tiles_of_job: dict[int, list[int]] = {}
    for tile, job_id in enumerate(jobs_of):
        if job_id is not None:
            tiles_of_job.setdefault(job_id, []).append(tile)
    now = time.monotonic()
    jobs = []
    for job_id in sorted(set(tiles_of_job) | {j.id for j in host.jobs()}):
        hosted = host.job(job_id)
        tiles = tiles_of_job.get(job_id, [])
        jobs.append({
            "job": job_id,
            # (not started through the daemon: the shell's, a repl's; or just launched)
            "name": hosted.name if hosted else (live[job_id].name if job_id in live else ""),
            "tiles": format_tiles(tiles) if tiles else "",
            "ntiles": len(tiles),
            "elapsed_seconds": now - hosted.started if hosted else None,
            "client_pid": hosted.client_pid if hosted else None,
        })
    return {
        "ntiles": machine.ntiles,
        "tiles_per_chip": machine.preset.tiles_per_chip,
        "sram_per_tile": machine.preset.sram_per_tile,
        "state_codes": {code: state for state, code in STATE_CODES.items()},
        "states": "".join(states),
        "jobs_of_tiles": jobs_of,
        "sram_used": used,
        "waiting": waiting,
        "jobs": jobs,
        **_staleness(host, age, "the tiles' SRAM use and waits are",
                     "; which tiles run which jobs is as it is now"),
    }


def _look(host: MachineHost, kind: str):
    value, age = host.look(kind, LOOK_SECONDS)
    if value is None:
        raise CommandError(TIMEOUT, f"machine {host.name!r} is busy and has not answered yet: {busy_why(host)}")
    return value, age


def _staleness(host: MachineHost, age: float | None, old: str, fresh: str = "") -> dict:
    """Fields saying a reply shows an old snapshot of ``old`` (what the reply took from
    it; ``fresh`` says what it did not), and why."""
    if age is None:
        return {}
    return {"stale_seconds": age,
            "stale_reason": f"{old} as the last look at them found them, {age:.1f} s ago{fresh}: "
                            f"{busy_why(host)}"}


def busy_why(host: MachineHost) -> str:
    """Why the machine serves nothing now, naming the tile and job that hold it when one
    computes (without an exchange point it holds every tile, and every request)."""
    scheduler = host.machine.scheduler
    tile = scheduler.computing_tile()
    job = tile.job if tile is not None else None
    if job is None:
        return ("a tile may be computing without reaching an exchange point, which holds the "
                f"whole machine ({hint('ps', host.name)} shows jobs, {hint('kill JOB', host.name)} "
                "stops one; --budget limits compute per superstep)")
    progress = scheduler.compute_progress()
    if progress is not None and progress[1] > 0:
        # (many tiles each computing a while are as slow as one that never stops: say both)
        seconds, done, tiles = progress
        return (f"tile {tile.id} (job {job.id}) is computing, in superstep {scheduler.superstep}, which has "
                f"computed for {seconds:.1f} s so far, tile after tile: {done} of its {tiles} tiles before "
                "this one. A superstep lasts as long as all its tiles' compute together, and a tile that "
                "computes without reaching an exchange point holds the whole machine "
                f"({hint(f'kill {job.id}', host.name)} stops the job; --budget limits each tile's compute "
                "per superstep)")
    return (f"tile {tile.id} (job {job.id}) is computing without reaching an exchange point, which "
            f"holds the whole machine ({hint(f'kill {job.id}', host.name)} stops it; --budget limits "
            "compute per superstep)")


@command(
    "run",
    Arg("filename", str),
    Arg("source_len", int),
    Arg("tiles", str, "all"),
    Arg("budget", float, None),
    Arg("has_data", bool, False),
    Arg("args", list, None),
    timeout=None,
)
def _run(call: Call):
    """Run a program on tiles; the payload is its source, then the data file if any.

    Emits ``started`` once the job runs; cancelling the call interrupts the job, whose
    result (with what the tiles printed so far) is still the reply.
    """
    args = call.args
    payload = call.payload
    source_len = args["source_len"]
    if not 0 <= source_len <= len(payload):
        raise CommandError(BAD_REQUEST, f"source_len {source_len} does not fit the {len(payload)}-byte payload")
    if args["budget"] is not None:
        try:
            budget_seconds(args["budget"])
        except ValueError as exc:
            raise CommandError(BAD_REQUEST, str(exc)) from None
    filename = args["filename"]
    if "\0" in filename:  # (compile() refused it, naming neither the argument nor the file)
        raise CommandError(BAD_REQUEST, f"the program's file name {filename!r} holds a NUL byte, which no file name can")
    program_args = args["args"] or []
    if not all(isinstance(a, str) for a in program_args):
        raise CommandError(BAD_REQUEST, "the program's arguments must be strings")
    source = payload[:source_len]
    data = payload[source_len:] if args["has_data"] else None
    machine = call.host.machine
    try:
        text = source_text(source)
    except (UnicodeDecodeError, SyntaxError) as exc:
        raise CommandError("bad_program", f"{filename} {source_problem(exc)}") from None
    try:
        handle = machine.launch(text, args["tiles"], data, filename=filename, budget=args["budget"],
                                argv=[filename, *program_args])
    except TileSpecError as exc:
        raise CommandError("bad_tiles", str(exc)) from None
    except SyntaxError as exc:
        raise CommandError("syntax_error", describe_syntax_error(filename, exc),
                           line=exc.lineno) from None
    except TileBusyError as exc:
        raise CommandError("tiles_busy", f"{exc} ({hint('ps', call.host.name)} lists jobs, "
                                         f"{hint('kill JOB', call.host.name)} stops one)") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise CommandError("bad_program", str(exc)) from None
    job = HostedJob(handle, filename, args["tiles"], time.monotonic(), call.peer_pid)
    call.host.add_job(job)
    try:
        # weakly: a Ctrl-C may arrive after the job ended, once its handle has gone (below)
        interrupt = weakref.WeakMethod(handle.interrupt)

        def stop(reason: str, ctrl_c: bool = False) -> None:
            job_interrupt = interrupt()
            if job_interrupt is not None:
                with contextlib.suppress(RuntimeError):  # (the machine has stopped, and the job with it)
                    job_interrupt(reason, ctrl_c=ctrl_c)

        # the Ctrl-C a KeyboardInterrupt the program may catch; if it does, and runs on, the
        # client giving up (its second Ctrl-C, or gone) stops it whatever it catches
        call.on_cancel(lambda: stop("interrupted (Ctrl-C)", ctrl_c=True))
        call.on_abandon(lambda: stop(STOPPED_FOR_GOOD))
        call.emit({"event": "started", "job": job.id, "tiles": format_tiles(handle.job.ids),
                   "ntiles": len(handle.job.ids)})
        try:
            result = handle.wait()
        except RuntimeError as exc:  # the machine stopped with the job still running (see Scheduler.stop)
            raise CommandError("halted", str(exc)) from None
    finally:
        call.host.remove_job(job.id)
    reply = run_result_to_json(fit_for_reply(result))
    # a job leaves its per-tile objects (namespaces, closures, output buffers) in reference
    # cycles, which waited for a full collection: ~94 MB per big-output run on one chip
    # stayed in the daemon. The connection collects them once the client has its reply
    # (ipuos._collector); nothing here may keep them alive until then.
    del result, handle
    return reply


#: characters of output (and errors) a run's reply carries at most, over all its tiles:
#: each tile keeps its own limit in characters, and at 4 bytes a character on thousands
#: of tiles a reply passed the protocol's frame limit and the client got no output at all
REPLY_OUTPUT_MAX = 64 * 1024 * 1024


def fit_for_reply(result):
    """``result``, its largest outputs and errors cut (saying so) if together they pass
    :data:`REPLY_OUTPUT_MAX` characters: each to the one length that fits them all, so
    that short texts keep all they hold and the long share the rest evenly."""
    tiles = result.tiles
    texts = [len(text) for tile in tiles for text in (tile.output, tile.error or "")]
    if sum(texts) <= REPLY_OUTPUT_MAX:
        return result
    keep = _even_cap(texts, REPLY_OUTPUT_MAX)
    trimmed = [dataclasses.replace(tile, output=_cut(tile.output, keep), error=tile.error and _cut(tile.error, keep))
               for tile in tiles]
    return dataclasses.replace(result, tiles=trimmed)


def _even_cap(lengths: list[int], budget: int) -> int:
    """The largest length L with sum(min(n, L) for n in lengths) <= budget."""
    left, count = budget, len(lengths)
    for n in sorted(lengths):
        if n * count > left:
            return left // count
        left -= n
        count -= 1
    return max(lengths, default=0)


def _cut(text: str, keep: int) -> str:
    body, dropped = split_truncation(text)  # (a tile's own cap cut it before: one count of both)
    if len(body) <= keep:
        return text
    kept = body[:keep]
    return kept + ("" if kept.endswith("\n") or not kept else "\n") + truncation_note(
        len(body) - keep + dropped, " for the reply")


#: how long ``kill`` waits to report how the job ended
KILL_WAIT = 2.0


@command("kill", Arg("job", int), urgent=True)
def _kill(call: Call):
    """Interrupt a job started through the daemon; its client gets what its tiles printed."""
    job_id = call.args["job"]
    job = call.host.job(job_id)
    if job is None:
        raise CommandError("no_such_job", f"no job {job_id} is running on machine "
                           f"{call.host.name!r}; {hint('ps', call.host.name)} lists its jobs")
    job.handle.interrupt(f"killed with `ipuos kill {job_id}`")
    # say what became of it: a tile inside one long call into C code (a regex, sum() of
    # a huge range) holds the interpreter, and the interrupt lands only when it returns
    try:
        result = job.handle.wait(KILL_WAIT)
    except TimeoutError:
        return {"job": job_id, "interrupted": True, "ended": False,
                "catching_tile": call.host.machine.scheduler.watchdog.swallowing(job.handle.job),
                "inside_requests": job.handle.job.parts_inside_requests()}
    stopped = any(t.status == "interrupted" for t in result.tiles)
    return {"job": job_id, "interrupted": True, "ended": True, "stopped": stopped,
            "exit_status": result.exit_status}


@command("halt", Arg("if_saved", bool, False), Arg("backup", str, None), timeout=None, urgent=True)
def _halt(call: Call):
    """Stop the daemon: interrupt jobs, close the machine, remove socket and lock
    (``backup``: back the machine up first, and stay up if that fails)."""
    host = call.host
    backup = None
    try:
        if call.args["backup"] is not None:
            from ._cmd_backup import halt_backup

            if not host.jobs():  # (with programs running it cannot tell until they are stopped)
                host.check_halt(call.args["if_saved"], before_backup=True)
            backup = halt_backup(call, call.args["backup"])
        host.check_halt(call.args["if_saved"])
    except HaltRefused as exc:
        done = (f" (its programs were stopped and it was backed up to {call.args['backup']} first)"
                if backup is not None else "")
        raise CommandError("refused", f"{exc}{done}") from None
    jobs = [job.id for job in host.jobs()]
    busy = [{"mountpoint": mount.mountpoint, "open_files": files} for mount in host.mounts.mounts()
            if (files := mount.operations.open_files())]
    log.info("halt requested by client pid %s", call.peer_pid)
    host.request_halt()
    return {"name": host.name, "pid": host.pid, "interrupted_jobs": jobs, "backup": backup, "busy_mounts": busy}


def _ipuos_version() -> str:
    try:
        return importlib.metadata.version("ipuos")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# Each area keeps its handlers in its own module; importing it registers them.
from . import _cmd_backup, _cmd_mount, _cmd_shell  # noqa: E402,F401
