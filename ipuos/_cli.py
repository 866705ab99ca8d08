"""The ``ipuos`` command line (click): thin clients of the machine daemon.

Every command names its machine with ``--name`` or ``$IPUOS_MACHINE`` (default
``default``). ``run`` starts the machine when none runs, like tmux; the read-only
commands (``ps``, ``status``, ``top``) only look, and all of them take ``--json``.

Exit statuses: 0 ok; 1 an error; 2 a usage error; 3 no such machine is running;
130 interrupted (Ctrl-C), except ``top``, for which Ctrl-C (like ``q``) is the way out;
``run`` otherwise exits with its program's status. Output that cannot be written (a
full disk) is an error in one line; a reader that has gone (``| head``) ends any command
quietly, with status 1.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import os
import signal
import sys
import threading
import time

import click
from click.core import ParameterSource

from ._client import (RESULT_LINGER_SECONDS, STOPPED, STUCK_IN_C, Client, DaemonError, MachineNotRunning,
                      SocketMissing, interrupt_call, process_stopped, stuck_daemon)
from ._entry import interrupted
from ._protocol import BAD_VERSION, BUSY, REQUEST_LIMITS
from ._plural import first_few, plural
from ._presets import DEFAULT_PRESET, MAX_IPUS, PRESETS
from ._readlimit import read_at_most
from ._rundir import (
    DEFAULT_MACHINE,
    LOCK_HALTING,
    MACHINE_ENV,
    MachineLocked,
    MachinePaths,
    RuntimeDirError,
    check_name,
    hint,
    lock_holder,
    lock_state,
    machine_paths,
    private_dir,
    running_names,
    starting,
    wait_started,
)
from ._runjson import refused_run_json, run_result_from_json, run_result_to_json
from ._runresult import EXIT_INTERRUPTED, RunResult
from ._spelling import program_option_slip
from ._spawn import BOOT_SECONDS, BootFailed, boot as boot_daemon, ensure_running, hello, wait_halted
from ._terminate import Terminated, die_of, on_termination
from ._tilespec import TileSpecError, parse_tiles
from ._views import format_ps, format_status, human_bytes, ps_json

EXIT_NOT_RUNNING = 3


def _fail(message: str, status: int = 1):
    click.echo(f"ipuos: {message}", err=True)
    sys.exit(status)


def not_utf8_path(path: str, what: str, remedy: str) -> str | None:
    """Why ``path`` cannot be handed to the daemon, or None if it can: the daemon takes
    paths as text, and one holding undecodable bytes (click hands them over
    surrogate-escaped) would reach it changed, naming another file."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        return f"{shown}: this {what} is not UTF-8 text, and the daemon takes UTF-8 paths only; {remedy}"
    return None


def image_path(image: str, *, writing: bool) -> str:
    """An IMAGE argument (to write, or to read) as the absolute path of a file, resolved
    here: the daemon would read ``/proc/self/...`` or ``/dev/stdout`` as its own."""
    if not image:
        _fail("an empty image path names no file; give the image's file name")
    if image == "-":
        _fail("'-': an image is a file, not standard input or output (a backup replaces its "
              "file once the image is complete); give the image's file name")
    problem = directory_name_problem(image, writing)
    if problem:
        _fail(problem)
    problem = not_utf8_path(image, "image path", "rename the file or give a link with a UTF-8 name")
    if problem:
        _fail(problem)
    return os.path.realpath(image)


def directory_name_problem(image: str, writing: bool) -> str | None:
    """Why IMAGE names no image file, if it ends with a slash: that names a directory, as
    for ``cp`` (resolving the path would drop the slash, and read or write a file of that
    name)."""
    if not image.endswith(os.sep):
        return None
    if writing:
        stripped = image.rstrip(os.sep)
        if stripped and os.path.lexists(stripped) and not os.path.isdir(stripped):
            return f"{image}: not an image file name (it ends with {os.sep}); to replace that file, drop the {os.sep}"
        return (f"{image}: not an image file name (it ends with {os.sep}); name the file, "
                f"e.g. {os.path.join(image, 'machine.img')}")
    return f"{image}: not an image file name (it ends with {os.sep}, which names a directory)"


def _others_running(name: str) -> str:
    """What to add to "no machine named X is running": the machines that are (a user
    who booted one by another name, or in another shell's IPUOS_MACHINE, meant that)."""
    others = [other for other in running_names() if other != name]
    if not others:
        return ""
    return f"; running: {first_few(others, 5)} (name one with --name or IPUOS_MACHINE)"


class _Errors:
    """Turn the client-side exceptions into one clear line and an exit status."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None:
            return False
        if isinstance(exc, MachineNotRunning):
            _fail(str(exc) + _others_running(exc.name), EXIT_NOT_RUNNING)
        if isinstance(exc, DaemonError):
            _fail(exc.message)
        if isinstance(exc, (RuntimeDirError, BootFailed, MachineLocked)):
            _fail(str(exc))
        return False


def _paths(name: str) -> MachinePaths:
    with _Errors():
        try:
            return machine_paths(name)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--name") from None


class StdoutError(OSError):
    """The command's output could not be written: a full disk, a pipe whose reader has gone."""


class _WholeWrites(io.RawIOBase):
    """Standard output's descriptor under ``sys.stdout``'s text and buffer layers: every
    write goes out whole or raises StdoutError. (A disk with less room than a large write
    takes part of it, as does a pipe whose reader leaves, and Python's own stdout then
    drops the rest without an error.) After a failure, writes are dropped: it is reported
    once, not again when the interpreter flushes stdout as it exits."""

    def __init__(self, fd: int | None):
        super().__init__()
        self.fd = fd  # None: standard output was closed when the command started
        self.error: StdoutError | None = None

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        if self.fd is None:
            raise OSError(errno.EBADF, "standard output is closed")
        return self.fd

    def isatty(self) -> bool:
        return self.fd is not None and os.isatty(self.fd)

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        size = len(view)
        if self.error is None:
            try:
                if self.fd is None and size:
                    raise OSError(errno.EBADF, os.strerror(errno.EBADF))
                while view:
                    view = view[os.write(self.fd, view):]
            except OSError as exc:
                self.error = StdoutError(exc.errno, exc.strerror)
                raise self.error from None
        return size


@contextlib.contextmanager
def _whole_output():
    """Run a command whose output is written whole or fails with one line and status 1,
    not a traceback, nor a file cut short and status 0. A reader that has gone (``| head``)
    ends it quietly, as it does any command-line tool."""
    stdout = sys.stdout
    if stdout is None:
        # descriptor 1 was closed when Python started (``>&-``): writes fail, as they do
        # on any closed descriptor, never reaching a file the command opens as 1 since
        fd, layers = None, {"encoding": "utf-8", "errors": "strict"}
    else:
        try:
            fd = stdout.fileno()
        except (AttributeError, OSError, ValueError):  # (no descriptor: CliRunner's capture)
            yield
            return
        stdout.flush()
        layers = {"encoding": stdout.encoding, "errors": stdout.errors,
                  "line_buffering": stdout.line_buffering, "write_through": stdout.write_through}
    raw = _WholeWrites(fd)
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(raw), **layers)
    try:
        yield
    except StdoutError:
        pass  # (reported below)
    finally:
        with contextlib.suppress(StdoutError):
            sys.stdout.flush()  # what is still buffered, while a failure can be reported
        sys.stdout = stdout
        if raw.error is not None:
            if raw.error.errno != errno.EPIPE:
                click.echo(f"ipuos: write error: {raw.error.strerror}", err=True)
            sys.exit(1)


class _Commands(click.Group):
    def main(self, *args, **kwargs):
        with _whole_output():
            return super().main(*args, **kwargs)

    # (a Ctrl-C while the command line is parsed, or the command runs: click would say
    # "Aborted!" and exit 1, an error)
    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt:
            interrupted()

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            interrupted()
        except Terminated as exc:  # (a command that took the terminal over has put it back)
            die_of(exc.signum)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ipuos")
def main() -> None:
    """A simulated many-core chip running a small Python operating system.

    The machine runs in a background daemon; these commands talk to it.
    """


def _machine_name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Check the name where click still knows where it came from: a bad one set in the
    environment is not the fault of a --name nobody typed."""
    try:
        return check_name(value)
    except ValueError as exc:
        came_from = ctx.get_parameter_source(param.name)
        where = f" (from ${MACHINE_ENV})" if came_from is ParameterSource.ENVIRONMENT else ""
        raise click.BadParameter(f"{exc}{where}", ctx, param) from None


name_option = click.option(
    "--name", envvar=MACHINE_ENV, default=DEFAULT_MACHINE, show_default=True, callback=_machine_name,
    help=f"which machine (also ${MACHINE_ENV})",
)
json_option = click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")


class Seconds(click.FloatRange):
    """A number of seconds within a range, and finite: click's FloatRange lets NaN through
    (it compares false with either bound), and, with no upper bound, infinity."""

    name = "number of seconds"

    def convert(self, value, param, ctx):
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds


def preset_option(default):
    return click.option(
        "--preset", type=click.Choice(sorted(PRESETS)), default=default,
        show_default=default is not None,
        help="chip model: tiles per chip and SRAM per tile" + (
            "" if default else f" (when the machine is started; default {DEFAULT_PRESET})"),
    )


def ipus_option(default):
    return click.option(
        "--ipus", type=click.IntRange(1, MAX_IPUS), default=default, show_default=default is not None,
        help="number of chips" + ("" if default else " (when the machine is started; default 1)"),
    )


# -- lifecycle --------------------------------------------------------------------------------


@main.command()
@preset_option(DEFAULT_PRESET)
@ipus_option(1)
@name_option
@click.option("--restore", metavar="IMG", type=click.Path(dir_okay=False),
              help="restore a backup image before serving (its preset and IPUs unless given)")
@click.pass_context
def boot(ctx, preset, ipus, name, restore) -> None:
    """Start a machine in the background."""
    paths = _paths(name)
    if restore is not None:
        restore = image_path(restore, writing=False)
        preset, ipus = _cli_backup.boot_geometry(ctx, restore, preset, ipus)
    with _Errors():
        try:
            info = boot_daemon(paths, preset, ipus, restore)
        except MachineLocked as exc:
            _fail(f"{exc}; {hint('halt', name)} stops it, or boot another with --name")
        except KeyboardInterrupt:
            # (its daemon runs on its own once started: a Ctrl-C stops the waiting only)
            if lock_holder(paths.lock) is None and not starting(paths):
                interrupted()
            _fail(f"stopped waiting; machine {name!r} is still booting ({hint('halt', name)} stops it)",
                  EXIT_INTERRUPTED)
    restored = f" from {restore}" if restore is not None else ""
    click.echo(f"booted machine {name!r}{restored}: {_geometry(info)} (pid {info['pid']}; log {paths.log})")


#: how long halt waits for the daemon to answer before it turns to SIGTERM
HALT_ANSWER_SECONDS = 30.0
#: how long a daemon sent SIGTERM may take to start halting: one that can run Python at
#: all does within a tick of its accept loop; one held by a call into C never does
SIGTERM_SECONDS = 5.0
#: how long a daemon sent SIGKILL may take to let go of its lock (the kernel's part)
SIGKILL_SECONDS = 10.0


@main.command()
@name_option
@click.option("--if-saved", is_flag=True,
              help="refuse to halt if a disk changed since the last backup or restore "
                   "(compared byte for byte: a file written and then removed counts), a disk "
                   "no backup or restore covered holds files, open files hold unflushed "
                   "writes, or RAM disks hold files (they would be lost)")
@click.option("--backup", metavar="IMG", type=click.Path(dir_okay=False),
              help="stop its programs, back the machine up to IMG, then halt; if the backup "
                   "fails the machine keeps running (an IMG that cannot be written is found "
                   "before the programs are stopped; one that fails later leaves them stopped)")
@click.option("--force", is_flag=True,
              help=f"send the daemon SIGTERM (a clean halt) without asking, and SIGKILL if it "
                   f"has not started halting {SIGTERM_SECONDS:g} s later: for a machine that "
                   "answers nothing, held by a tile inside one long call into C code")
def halt(name, if_saved, backup, force) -> None:
    """Stop a machine: interrupt its programs and drop its memory.

    A machine that does not answer is sent SIGTERM; if that does not stop it either, halt
    says so, naming the daemon's pid, and `halt --force` kills it.
    """
    if force and (if_saved or backup is not None):
        raise click.UsageError("--force cannot be combined with --if-saved or --backup: a daemon "
                               "that must be killed can neither back up nor say what is unsaved")
    paths = _paths(name)
    saving = if_saved or backup is not None
    _wait_for_start(paths, saving)
    if not saving and starting(paths):  # (its daemon holds its lock and boots: a restore may take long)
        pid = lock_holder(paths.lock)
        if pid is not None:
            _halt_by_signal(paths, pid, False, "it was starting", force=force)
            return
    if force:
        pid = lock_holder(paths.lock)
        if pid is None:
            _fail(str(MachineNotRunning(name)) + _others_running(name), EXIT_NOT_RUNNING)
        _halt_by_signal(paths, pid, False, "--force", force=True)
        return
    with _Errors():
        try:
            client = Client(paths)
        except SocketMissing as exc:
            _halt_by_signal(paths, exc.pid, if_saved or backup is not None)
            return
        except DaemonError as exc:
            if exc.code != "connect":
                raise
            # its queue stayed full: it takes no connection, as stuck as one that does not answer
            _halt_unanswering(paths, lock_holder(paths.lock), if_saved or backup is not None,
                              "accepts no connection")
            return
    # (read now: a daemon of another release may halt as asked and be gone from its lock
    # by the time its reply turns out unreadable, below)
    pid = lock_holder(paths.lock)
    if pid and process_stopped(pid):  # (it would take the request and answer nothing)
        client.close()
        _halt_unanswering(paths, pid, saving, STOPPED)
        return
    with _Errors(), client:
        args = {"if_saved": if_saved, "backup": None if backup is None else image_path(backup, writing=True)}
        try:
            reply = (_cli_backup.halt_with_backup(client, args) if backup
                     else client.call("halt", args, wait=HALT_ANSWER_SECONDS))
        except DaemonError as exc:
            if exc.code == BAD_VERSION and not (backup or if_saved):
                # a daemon of another ipuos release: the way to the one this client speaks
                # is to stop it, and SIGTERM halts a daemon as cleanly as asking does
                client.close()
                _halt_by_signal(paths, pid, False, "it runs another ipuos release")
                return
            plain = not (backup or if_saved)
            if plain and exc.code == BUSY and not exc.details.get("halting"):
                # every client slot or handler is taken: SIGTERM halts it just as cleanly,
                # and a user must always be able to stop a machine
                client.close()
                _halt_by_signal(paths, pid, False, "every client slot or request handler was taken")
                return
            if exc.code == "timeout":
                client.close()
                _halt_unanswering(paths, pid, not plain,
                                  f"did not answer 'halt' within {HALT_ANSWER_SECONDS:g} s")
                return
            # another halt got there first: the daemon refuses new requests, or drops the
            # connection as it goes. A plain halt has what it asked for once it is gone.
            if not plain or exc.code not in (BUSY, "disconnected") or not wait_halted(paths):
                raise
            click.echo(f"halted machine {name!r} (another halt was stopping it)")
            return
    if not wait_halted(paths):
        _fail(f"machine {name!r} (pid {reply['pid']}) was asked to halt but still runs; see {paths.log}")
    jobs = reply["interrupted_jobs"]
    note = f" (interrupted job{'s' if len(jobs) > 1 else ''} {', '.join(map(str, jobs))})" if jobs else ""
    saved = f" after backing it up to {reply['backup']['path']}" if reply.get("backup") else ""
    click.echo(f"halted machine {name!r}{saved}{note}")
    for busy in reply.get("busy_mounts", ()):
        click.echo(f"ipuos: detached the mount at {busy['mountpoint']}, where {plural(busy['open_files'], 'file')} "
                   f"{'was' if busy['open_files'] == 1 else 'were'} open: using "
                   f"{'it' if busy['open_files'] == 1 else 'them'} now fails", err=True)
    if reply.get("backup"):
        _cli_backup.echo_backup_notes(reply["backup"])


def _wait_for_start(paths: MachinePaths, until_up: bool) -> None:
    """A machine that is starting (``ipuos run ... &`` just spawned it) is halted, not
    reported as not running: wait until its daemon holds the lock, so that it has a pid
    to signal, as a daemon booting is halted (a boot restoring a big image may take
    minutes); ``until_up``, to back it up or say whether it is saved, which only its
    answer can, until it serves."""
    if not starting(paths) or (not until_up and lock_holder(paths.lock) is not None):
        return
    click.echo(f"ipuos: machine {paths.name!r} is starting; halting it once it "
               f"{'is up' if until_up else 'has a daemon pid'}", err=True)
    deadline = time.monotonic() + BOOT_SECONDS
    while starting(paths) and (until_up or lock_holder(paths.lock) is None):
        if time.monotonic() > deadline:
            return  # (what follows stops it by signal, or says what is in the way)
        time.sleep(0.02)


def _halt_unanswering(paths, pid: int | None, saving: bool, what: str) -> None:
    """Halt a daemon that takes requests but answers none: SIGTERM, unless asked to save
    first, which only its answer can do."""
    if pid is None:  # (it has just halted, another halt having got there first)
        click.echo(f"halted machine {paths.name!r} (another halt was stopping it)")
        return
    if saving and process_stopped(pid):
        _fail(f"machine {paths.name!r} (pid {pid}) {STOPPED}, so it cannot back up "
              f"or say whether it is saved: `kill -CONT {pid}` lets it go on; then halt it again")
    if saving:
        _fail(f"machine {paths.name!r} (pid {pid}) {what}, so it cannot back up or say whether it is "
              f"saved: {stuck_daemon(paths)}, discarding its files")
    _halt_by_signal(paths, pid, False, f"it {what}")


def _halt_by_signal(paths, pid: int, saving: bool, why: str = "it had no socket", force: bool = False) -> None:
    """Halt a daemon nothing can talk to (its socket is gone, it speaks another protocol,
    it does not answer) the way SIGTERM halts it. Not when asked to save first: that needs
    the daemon's answer. A daemon that does not start halting is named, with the way to
    kill it; ``force`` kills it."""
    if saving:
        _fail(f"machine {paths.name!r} (pid {pid}) has no socket, so it cannot back up or say "
              "whether it is saved; `ipuos halt` without --if-saved or --backup stops it")
    if not pid:
        _fail(f"machine {paths.name!r}: its lock does not say its daemon's pid, so it cannot be sent a "
              f"signal; see {paths.log}")
    _send_signal(pid, signal.SIGTERM)
    if process_stopped(pid):  # (else it halts whenever someone lets it go on)
        _send_signal(pid, signal.SIGCONT)
    deadline = time.monotonic() + SIGTERM_SECONDS
    while lock_holder(paths.lock) is not None and lock_state(paths.lock) != LOCK_HALTING:
        if time.monotonic() > deadline:
            break
        time.sleep(0.02)
    else:  # it is halting, as asked
        if wait_halted(paths):
            click.echo(f"halted machine {paths.name!r} ({why}: stopped by signal)")
            return
        if not force:
            _fail(f"machine {paths.name!r} (pid {pid}) was sent SIGTERM and started halting, but "
                  f"still runs; see {paths.log}; {hint('halt --force', paths.name)} kills it")
    if not force:
        _fail(f"machine {paths.name!r} (pid {pid}): {why}, and SIGTERM did not stop it: {STUCK_IN_C}. "
              f"{hint('halt --force', paths.name)} kills it (as `kill -9 {pid}` does); its programs "
              "and files are dropped, as any halt drops them")
    _send_signal(pid, signal.SIGKILL)
    if not wait_halted(paths, SIGKILL_SECONDS):
        _fail(f"machine {paths.name!r} (pid {pid}) was sent SIGKILL but still holds its lock "
              f"{paths.lock}; see {paths.log}")
    click.echo(f"killed machine {paths.name!r} (pid {pid}) with SIGKILL: SIGTERM did not stop it")


def _send_signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # it has just ended


# -- programs ---------------------------------------------------------------------------------


class _RunCommand(click.Command):
    """``run``: the options it does not know are the program's, except one that looks like
    a slip for its own (``--tile 0`` would run the program on every tile), unless it
    comes after ``--`` (click drops the ``--`` from what it hands on: hence here).

    Its one short option, ``-h``, is only ever the whole word: click reads ``-h.py`` or a
    program's ``-vh`` as short options bundled, and ``run -h.py`` printed the help and
    exited 0 without running the file, where ``run -x.py`` runs it. So click knows only
    ``--help``, and a word ``-h`` is made that here."""

    def parse_args(self, ctx, args):
        options = [param for param in self.params if isinstance(param, click.Option)]
        own = [opt for option in options for opt in option.opts if opt.startswith("--")]
        takes_value = {opt for option in options if not option.is_flag for opt in option.opts}
        args = list(args)
        index = 0
        while index < len(args) and args[index] != "--":
            name, eq, _ = args[index].partition("=")
            if name in takes_value and not eq:
                index += 1  # (its value, whatever it looks like)
            elif args[index] == "-h":  # (the whole word: -h=1.py is a file's name)
                args[index] = "--help"
            elif name not in own and (slip := program_option_slip(name, own)) is not None:
                raise click.UsageError(slip, ctx)
            index += 1
        return super().parse_args(ctx, args)


# (the program's options are those run does not know; -h: see _RunCommand)
@main.command(cls=_RunCommand, context_settings={"ignore_unknown_options": True, "help_option_names": ["--help"]})
@click.argument("file", type=click.File("rb"))
@click.argument("program_args", metavar="[ARGS]...", nargs=-1, type=click.UNPROCESSED)
@click.option("--tiles", "tile_spec", default="all", show_default=True, help="tiles to run on, e.g. 0-99,200")
@click.option("--data", "data_file", type=click.File("rb"), help="host file split over the tiles as __tiledata")
@click.option("--budget", type=Seconds(min=0, min_open=True), metavar="SECONDS",
              help="seconds a tile may compute per superstep")
@click.option("--json", "as_json", is_flag=True, help="print per-tile results as JSON")
@click.option("--stats", "show_stats", is_flag=True, help="print supersteps, bytes and simulated exchange time")
@preset_option(None)
@ipus_option(None)
@name_option
def run(file, program_args, tile_spec, data_file, budget, as_json, show_stats, preset, ipus, name) -> None:
    """Run a Python FILE on tiles of the machine and print their output, grouped.

    ARGS reach the program as __args, after FILE's name; options ipuos does not know
    are the program's too (after `--`, every argument is), except one that looks like a
    slip for run's own (--tile, --dat): it is refused, and after `--` it is passed on.
    -h, like --help, is run's own before `--` (a program's -h goes after it).
    Starts the machine if it is not running. Ctrl-C interrupts the program and still
    prints what its tiles printed; so do SIGTERM and SIGHUP, which stop it for good,
    then end ipuos run by the signal. Each tile's output is kept up to 64 KiB (65,536
    characters); a last line `[output truncated: N more characters]` counts the rest.
    """
    filename = getattr(file, "name", "<stdin>")  # ("-" is stdin, named so by Python)
    if data_file is not None and getattr(data_file, "name", "<stdin>") == filename == "<stdin>":
        raise click.UsageError("FILE and --data cannot both be read from standard input (-); "
                               "give one of them as a file")
    source, data = _read_run_request(file, data_file)
    _check_run_request(source, data, program_args)  # (before a machine is started for it)
    paths, info = attach_machine(name, preset, ipus, tile_spec)
    _check_program_fits(source, info)
    args = {"filename": filename, "source_len": len(source), "tiles": tile_spec,
            "budget": budget, "has_data": data is not None, "args": list(program_args)}
    progress = _RunProgress(not as_json and _stderr_is_terminal(), paths)
    terminated: list[int] = []

    def stop_for_good(signum: int) -> None:
        # SIGTERM or SIGHUP (`timeout`, a CI runner, a closed terminal): stop the job
        # whatever it catches, as a second Ctrl-C does, print what the tiles printed, then
        # die of the signal (left to their default action, the output was lost unseen)
        terminated.append(signum)
        interrupt_call(times=2)

    with _Errors(), Client(paths) as client, progress, on_termination(stop_for_good):
        try:
            doc = client.call("run", args, source + (data or b""), wait=None, interruptible=True,
                              linger=RESULT_LINGER_SECONDS,
                              on_event=progress.event, on_interrupt=progress.interrupted)
        except DaemonError as exc:
            progress.clear()
            if exc.code == "bad_tiles":
                raise click.BadParameter(exc.message, param_hint="--tiles") from None
            if exc.code == "halted":  # (the machine halted, a tile holding it: see Scheduler.stop)
                _fail(exc.message, EXIT_INTERRUPTED)
            if as_json and exc.code in PROGRAM_NOT_STARTED:
                click.echo(json.dumps(refused_run_json(filename, exc.message), indent=1))
            raise
        except KeyboardInterrupt:
            progress.clear()
            job = f" for job {progress.job}" if progress.job else ""  # (unknown before it starts)
            message = f"stopped waiting{job}; it is being interrupted ({hint('ps', paths.name)} shows it)"
            if terminated:
                click.echo(f"ipuos: {message}", err=True)
                die_of(terminated[0])
            _fail(message, EXIT_INTERRUPTED)
    result = run_result_from_json(doc)
    _print_result(result, as_json, show_stats)
    if terminated:
        die_of(terminated[0])
    sys.exit(result.exit_status)


def _read_run_request(file, data_file) -> tuple[bytes, bytes | None]:
    """FILE's bytes and --data's, read no further than one run request carries (and a
    byte more, to tell there is more): either may be endless (/dev/zero, a FIFO)."""
    limit = REQUEST_LIMITS.max_payload
    source = read_at_most(file, limit)
    if data_file is None or len(source) > limit:  # (refused already: no data is read)
        return source, None
    return source, read_at_most(data_file, max(0, limit - len(source)))


def _check_program_fits(source: bytes, info: dict) -> None:
    """Refuse a program bigger than a tile of the machine: every tile holds the whole
    program in its SRAM, and a big one would only be compiled (the daemon answering
    nothing meanwhile) to fail on every tile."""
    preset = PRESETS.get(info["preset"])
    if preset is not None and len(source) > preset.sram_per_tile:
        raise click.UsageError(
            f"FILE ({human_bytes(len(source))}) does not fit in a tile: every tile holds the whole "
            f"program in its SRAM, {human_bytes(preset.sram_per_tile)} on machine {info['name']!r}; "
            "keep data out of the program: give it with --data, or read it from a file")


def _check_run_request(source: bytes, data: bytes | None, program_args) -> None:
    """Refuse what the daemon could not take, saying which part is at fault."""
    limit = REQUEST_LIMITS.max_payload
    carries = f"the {human_bytes(limit)} one run request carries"
    if len(source) > limit:
        sram = max(preset.sram_per_tile for preset in PRESETS.values())
        raise click.UsageError(
            f"FILE (more than {human_bytes(limit)}) exceeds {carries}, and every tile holds the whole "
            f"program in its SRAM ({sram // 1024} KiB at most); keep data out of the program: "
            "give it with --data, or read it from a file")
    if data is not None and len(source) + len(data) > limit:
        raise click.UsageError(
            f"FILE ({human_bytes(len(source))}) and --data (more than {human_bytes(limit - len(source))}) together "
            f"exceed {carries}; split the data over several runs, or copy it to the chip disk "
            "(`put` in `ipuos shell`) and read it from /chip on tile 0")
    for position, arg in enumerate(program_args, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:  # (click hands over undecodable bytes surrogate-escaped)
            shown = os.fsencode(arg)
            raise click.UsageError(f"argument {position} ({shown!r}) is not UTF-8 text; tile "
                                   "programs get their arguments as text") from None


#: the daemon's refusals of a run that leave the program unstarted, which ``--json`` reports
#: as a document on stdout (the message still goes to stderr)
PROGRAM_NOT_STARTED = frozenset({"syntax_error", "bad_program", "tiles_busy"})

#: seconds a job may take to start before its client says why it waits
START_PATIENCE_SECONDS = 3.0
#: how long a waiting client gives the daemon to answer ``hello`` before it calls it stuck
PROBE_SECONDS = 3.0


class _RunProgress:
    """A one-line note on a terminal's stderr while a job runs (never in pipes or --json),
    and, anywhere, a note on stderr if the job has not started after a few seconds: the
    machine takes new work only between supersteps, and a silent wait looks like a hang."""

    def __init__(self, enabled: bool, paths: MachinePaths):
        self.enabled = enabled
        self.job = None
        self._shown = False
        self._patience = threading.Timer(START_PATIENCE_SECONDS, self._not_started, (paths,))
        self._patience.daemon = True

    def __enter__(self) -> "_RunProgress":
        self._patience.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.clear()

    def _not_started(self, paths: MachinePaths) -> None:
        name = paths.name
        # a tile computing in Python holds the scheduler only, and ps and kill help; one
        # inside a call into C holds the whole daemon, which then answers nothing, not
        # even that it has started this job: that call may be this job's own
        try:
            hello(paths, wait=PROBE_SECONDS)
            note = ("has not started the job yet: a tile is computing without reaching an exchange "
                    "point, and the machine takes new work only between supersteps "
                    f"({hint('ps', name)} shows jobs, {hint('kill JOB', name)} stops one)")
        except MachineNotRunning:
            return  # (it has gone: the run call says so)
        except DaemonError as exc:
            if exc.code not in ("timeout", "connect"):
                return
            note = (f"does not answer at all (daemon pid {lock_holder(paths.lock)}), so it cannot say "
                    "whether this job has started: "
                    f"{stuck_daemon(paths, ', perhaps this very job (it may have started and gone into one)')}"
                    " (Ctrl-C twice stops waiting)")
        if self.job is None:  # (not started while we asked)
            self.clear()
            click.echo(f"ipuos: machine {name!r} {note}", err=True)

    def event(self, event: dict) -> None:
        if event.get("event") == "started":
            self._patience.cancel()
            self.job = event.get("job")
            self._show(f"job {self.job} runs on tiles {event.get('tiles')}; Ctrl-C interrupts it")

    def interrupted(self, count: int) -> None:
        if count == 1:
            self._show(f"interrupting job {self.job or '?'}... (Ctrl-C again to stop it for good)")
        elif count == 2:
            self._show(f"stopping job {self.job or '?'}... (Ctrl-C again to stop waiting)")

    def _show(self, text: str) -> None:
        if self.enabled:
            click.echo(f"\r\x1b[K{text}", err=True, nl=False)
            self._shown = True

    def clear(self) -> None:
        self._patience.cancel()
        if self._shown:
            click.echo("\r\x1b[K", err=True, nl=False)
            self._shown = False


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def attach_machine(name: str, preset: str | None = None, ipus: int | None = None,
                   tile_spec: str | None = None) -> tuple[MachinePaths, dict]:
    """The paths of machine ``name`` and its ``hello`` answer, started (like tmux) if it is
    not running; a ``--preset``/``--ipus`` the running machine does not have is refused.
    A ``--tiles`` spec is checked first: a typo must not leave a machine started for it."""
    paths = _paths(name)
    if tile_spec is not None and lock_holder(paths.lock) is None:
        # against the machine about to be started for it
        _check_tile_spec(tile_spec, PRESETS[preset or DEFAULT_PRESET].tiles_per_chip * (ipus or 1))
    with _Errors():
        info, booted = ensure_running(paths, preset or DEFAULT_PRESET, ipus or 1)
    if booted:
        click.echo(f"ipuos: started machine {name!r} ({_geometry(info)}); "
                   f"{hint('halt', name)} stops it", err=True)
    else:
        _check_geometry(name, info, preset, ipus)
        if tile_spec is not None:
            _check_tile_spec(tile_spec, info["ntiles"])  # the running machine's own tiles
    return paths, info


def _check_tile_spec(tile_spec: str, ntiles: int) -> None:
    """BadParameter for a spec that is malformed or names a tile a machine of ``ntiles``
    tiles lacks."""
    try:
        parse_tiles(tile_spec, ntiles)
    except TileSpecError as exc:
        raise click.BadParameter(str(exc), param_hint="--tiles") from None


def _check_geometry(name: str, info: dict, preset: str | None, ipus: int | None) -> None:
    """Refuse a --preset/--ipus the running machine does not have: results would differ."""
    wanted = []
    if preset is not None and preset != info["preset"]:
        wanted.append(f"--preset {preset}")
    if ipus is not None and ipus != info["ipus"]:
        wanted.append(f"--ipus {ipus}")
    if wanted:
        _fail(f"machine {name!r} is running as {_geometry(info)}, not {' '.join(wanted)}; drop the "
              f"option to use it, {hint('halt', name)} it first, or pick another --name")


def _geometry(info: dict) -> str:
    return f"{info['preset']}, {plural(info['ipus'], 'IPU')}, {info['ntiles']} tiles"


def _print_result(result: RunResult, as_json: bool, show_stats: bool) -> None:
    if as_json:
        click.echo(json.dumps(run_result_to_json(result), indent=1))
        return
    click.echo(result.format(), nl=False, color=True)  # the tiles' bytes: ANSI codes too, piped or not
    if show_stats:
        s = result.stats
        click.echo(
            f"-- {plural(len(result.tiles), 'tile')}, {plural(s.supersteps, 'superstep')}, "
            f"{s.wall_seconds:.3f} s wall, {s.sim_seconds * 1e6:.1f} us simulated exchange",
            err=True,
        )
        if s.bytes_sent:
            click.echo(f"-- {s.bytes_exchanged:,} bytes exchanged; per tile sent "
                       f"{_spread(s.bytes_sent)}, received {_spread(s.bytes_received)}", err=True)
        if s.dropped_messages:  # (a program that sends more than it receives may mean to)
            click.echo(f"-- {plural(s.dropped_messages, 'message was', 'messages were')} sent "
                       "but never received (dropped)", err=True)


def _spread(values: list[int]) -> str:
    low, high = min(values), max(values)
    return f"{low:,} B" if low == high else f"{low:,}-{high:,} B (mean {sum(values) / len(values):,.0f})"


@main.command()
@click.argument("job", type=int)
@name_option
def kill(job, name) -> None:
    """Interrupt JOB (its client still prints what its tiles printed)."""
    paths = _paths(name)
    with _Errors(), Client(paths) as client:
        reply = client.call("kill", {"job": job})
    catching = reply.get("catching_tile")
    if not reply.get("ended", True) and catching is not None:
        _fail(f"asked job {job} to stop; it has not stopped: the program on tile {catching} catches the "
              "interrupt (a bare `except:` or `except BaseException:` around its work) and computes on, "
              "holding the whole machine; nothing stops it but halting the machine "
              f"({hint('halt', paths.name)}), and the files on the machine go with it")
    inside = reply.get("inside_requests") or []
    if not reply.get("ended", True) and inside:
        _fail(f"asked job {job} to stop; its part on tile {inside[0]} has not stopped: it runs inside the "
              "shell's own request there, and its program catches the stop (a bare `except:` around its "
              f"work): the tile cannot leave it without leaving the shell. It runs until its program ends "
              f"or the machine halts ({hint('halt', paths.name)})")
    if not reply.get("ended", True):
        click.echo(f"asked job {job} to stop; it has not stopped yet: a tile inside one long call "
                   "into C code (a regular expression, sum() of a huge range) is interrupted only "
                   f"when that call returns. {hint('ps', paths.name)} shows whether it still runs")
    elif reply.get("stopped", True):
        click.echo(f"interrupted job {job}")
    else:
        click.echo(f"job {job} finished before the interrupt reached it "
                   f"(exit status {reply.get('exit_status', 0)})")


# -- looking ----------------------------------------------------------------------------------


@main.command()
@name_option
@json_option
@click.option("--tiles", "tile_spec", help="list these tiles one by one, e.g. 0-3")
def ps(name, as_json, tile_spec) -> None:
    """Tiles (state, job, SRAM used) and jobs of the machine."""
    paths = _paths(name)
    with _Errors(), Client(paths) as client:
        snapshot = client.call("ps")
    tiles = None
    if tile_spec is not None:
        try:
            tiles = parse_tiles(tile_spec, snapshot["ntiles"])
        except TileSpecError as exc:
            raise click.BadParameter(str(exc), param_hint="--tiles") from None
    if as_json:
        click.echo(json.dumps(ps_json(name, snapshot, tiles), indent=1))
    else:
        click.echo(format_ps(name, snapshot, tiles), nl=False)


@main.command()
@json_option
def machines(as_json) -> None:
    """The machines running for this user, by name."""
    with _Errors():
        directory = private_dir()
    found = []
    for name in running_names(directory):
        paths = machine_paths(name, directory)
        try:
            found.append({**hello(paths, wait=5.0), "answering": True})
        except (MachineNotRunning, DaemonError) as exc:
            pid = lock_holder(paths.lock)
            # (None, and not starting: it has just halted) busy, hung, starting, unreachable
            if pid is not None or starting(paths):
                found.append({"name": name, "pid": pid, "answering": False, "problem": str(exc)})
    if as_json:
        click.echo(json.dumps(found, indent=1))
        return
    if not found:
        click.echo("no machines are running; `ipuos boot` starts one")
    for info in found:
        if info.get("answering", True):
            click.echo(f"{info['name']}  {_geometry(info)}  pid {info['pid']}")
        else:
            pid = f"  pid {info['pid']}" if info["pid"] else ""
            click.echo(f"{info['name']}  not answering: {info['problem']}{pid}")


@main.command()
@name_option
@json_option
def status(name, as_json) -> None:
    """The machine: geometry, uptime, supersteps, bytes exchanged, simulated exchange time."""
    paths = _paths(name)
    with _Errors(), Client(paths) as client:
        info = client.call("status")
    if as_json:
        click.echo(json.dumps(info, indent=1))
    else:
        click.echo(format_status(info), nl=False)


@main.command()
@name_option
@json_option
@click.option("--by", "view", type=click.Choice(["state", "sram"]), default="state", show_default=True,
              help="colour tiles by state or by SRAM use")
@click.option("--interval", type=Seconds(0.1, 60), metavar="SECONDS", default=1.0, show_default=True,
              help="seconds between refreshes")
@click.option("--once", is_flag=True, help="print one frame and exit (the default when not on a terminal)")
def top(name, as_json, view, interval, once) -> None:
    """A live map of all tiles, coloured by state or SRAM use (s switches between the
    two; q or Ctrl-C quits)."""
    from rich.console import Console

    from ._top import FILE_ROWS, print_once, run_live

    paths = _paths(name)
    console = Console()
    with _Errors(), Client(paths) as client:
        def fetch():
            return client.call("status", timeout=10.0), client.call("ps", timeout=10.0)

        if as_json:
            status_reply, snapshot = fetch()
            click.echo(json.dumps({"status": status_reply, **ps_json(name, snapshot)}, indent=1))
            return
        if once or not console.is_terminal:
            status_reply, snapshot = fetch()
            rows = max(4, console.height - 10) if console.is_terminal else FILE_ROWS
            print_once(console, status_reply, snapshot, view, rows)
            return
        try:
            run_live(console, fetch, view, interval)
        except KeyboardInterrupt:
            pass


# Each area keeps its commands in its own module; importing it adds them to ``main``.
from . import _cli_backup, _cli_mount, _cli_shell  # noqa: E402,F401
