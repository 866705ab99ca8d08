"""Starting a machine daemon detached, waiting for it to answer, and waiting for it to halt.

The daemon is started as ``python -m ipuos._daemon`` in a new session (``setsid``: no
controlling terminal, so the user's Ctrl-C and hang-up never reach it), from ``/``, with
stdin from /dev/null and stdout and stderr appended to the machine's log in the runtime
dir. We return once it answers ``hello``; if it exits first, the user gets the error line
it logged, not a timeout. From before the spawn until the daemon serves, the machine's
boot marker is held (first here, then by the daemon, which inherits it), so a ``halt`` or
``status`` meanwhile finds a machine that is starting, not none.

Like tmux, a command that needs a machine starts the default one:
:func:`ensure_running`. Two clients may race to do so; the loser's daemon finds the lock
taken and exits with status 3, and its client then simply waits for the winner.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ._client import CONNECT_SECONDS, Client, DaemonError, MachineNotRunning, SocketMissing
from ._memtune import tuned_environ
from ._protocol import ERROR_PREFIX, EXIT_ALREADY_RUNNING
from ._rundir import MachineLocked, MachinePaths, hold_boot_marker, lock_holder, open_runtime_file

#: how long a daemon may take to boot before the client gives up on it
BOOT_SECONDS = 120.0
HALT_SECONDS = 60.0
#: the log is moved aside to NAME.log.1 at boot once it is bigger than this
LOG_ROTATE_BYTES = 1024 * 1024


class BootFailed(Exception):
    """The daemon exited before it answered; the message is its own error line."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def boot(paths: MachinePaths, preset: str, ipus: int, restore: str | None = None,
         daemon_options: tuple[str, ...] = ()) -> dict:
    """Start the daemon for ``paths.name`` and return its ``hello`` once it answers.

    ``daemon_options`` are extra ``python -m ipuos._daemon`` options (e.g. its timeouts).
    Raises MachineLocked if it already runs, BootFailed if it cannot start.
    """
    holder = lock_holder(paths.lock)
    if holder is not None:
        raise MachineLocked(paths.name, holder or None)
    log_start = _log_size(paths.log)
    process = _spawn(paths, preset, ipus, restore, daemon_options)
    return _wait_until_answering(paths, process, log_start)


def ensure_running(paths: MachinePaths, preset: str, ipus: int) -> tuple[dict, bool]:
    """``hello`` from the running machine, booting it first if needed; and whether we booted it."""
    deadline = time.monotonic() + BOOT_SECONDS
    while True:
        try:
            return hello(paths), False
        except SocketMissing as exc:
            if exc.deleted:
                raise  # (waiting would not bring it back)
        except MachineNotRunning:
            pass
        try:
            return boot(paths, preset, ipus), True
        except MachineLocked:
            pass  # someone else is booting (or halting) it
        except BootFailed as exc:
            if exc.status != EXIT_ALREADY_RUNNING:
                raise
        if time.monotonic() > deadline:
            raise BootFailed(f"machine {paths.name!r} is locked by another process but never answered; "
                             f"see {paths.log}")
        time.sleep(0.1)


def hello(paths: MachinePaths, wait: float = 20.0) -> dict:
    with Client(paths, connect_timeout=min(wait, CONNECT_SECONDS)) as client:
        return client.call("hello", timeout=wait, wait=wait)


def wait_halted(paths: MachinePaths, timeout: float = HALT_SECONDS) -> bool:
    """Wait until the daemon has let go of its lock (it has fully stopped)."""
    deadline = time.monotonic() + timeout
    while lock_holder(paths.lock) is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _spawn(paths: MachinePaths, preset: str, ipus: int, restore: str | None,
           daemon_options: tuple[str, ...]) -> subprocess.Popen:
    command = [sys.executable, "-m", "ipuos._daemon", "--name", paths.name, "--preset", preset,
               "--ipus", str(ipus), "--rundir", str(paths.dir), *daemon_options]
    if restore is not None:
        command += ["--restore", os.path.abspath(restore)]
    log_fd = _open_log(paths.log)
    try:
        marker_fd = hold_boot_marker(paths.boot_marker)
    except BaseException:
        os.close(log_fd)
        raise
    command += ["--boot-marker-fd", str(marker_fd)]
    try:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            cwd="/",
            start_new_session=True,
            close_fds=True,
            pass_fds=(marker_fd,),
            env=tuned_environ(),
        )
    finally:
        os.close(log_fd)
        os.close(marker_fd)  # (the daemon holds it now, until it serves)


def _open_log(path: Path) -> int:
    try:
        if os.lstat(path).st_size > LOG_ROTATE_BYTES:
            os.replace(path, path.with_name(path.name + ".1"))
    except FileNotFoundError:
        pass
    return open_runtime_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, "log")


def _log_size(path: Path) -> int:
    try:
        size = os.lstat(path).st_size
    except FileNotFoundError:
        return 0
    return 0 if size > LOG_ROTATE_BYTES else size  # it will be rotated: read the new one whole


def _wait_until_answering(paths: MachinePaths, process: subprocess.Popen, log_start: int) -> dict:
    deadline = time.monotonic() + BOOT_SECONDS
    while True:
        status = process.poll()
        if status is not None:
            raise BootFailed(_logged_error(paths.log, log_start) or _ended_before_answering(status, paths),
                             status)
        try:
            info = hello(paths, wait=0.5)  # short: whoever answers may not be our daemon
        except MachineNotRunning:
            pass
        except DaemonError as exc:
            # ("connect": whatever holds the socket is not answering: ours exits saying why)
            if exc.code not in ("disconnected", "timeout", "connect"):
                raise BootFailed(f"the new daemon answered with an error: {exc.message}") from None
        else:
            if info.get("pid") == process.pid:
                return info
            # another boot of this name won the race: ours will exit saying so (above)
        if time.monotonic() > deadline:
            raise BootFailed(f"machine {paths.name!r} did not answer within {BOOT_SECONDS:g} s of "
                             f"starting (pid {process.pid}); see {paths.log}")
        time.sleep(0.02)


def _ended_before_answering(status: int, paths: MachinePaths) -> str:
    """Why a daemon that logged no error ended before answering its spawner."""
    if status == 0:  # (a halt found it as it came up, and got there first)
        return (f"machine {paths.name!r} was halted as it came up, before it answered (by `ipuos halt` "
                f"or a signal); see {paths.log}")
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return f"the daemon was ended by {name} before it answered (`ipuos halt` or kill); see {paths.log}"
    return f"the daemon exited with status {status} before answering; see {paths.log}"


def _logged_error(log: Path, start: int) -> str | None:
    """The last error line this daemon (what it wrote after ``start``) left in its log."""
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(start, f.tell() - 16384))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    errors = [line[len(ERROR_PREFIX):] for line in tail.splitlines() if line.startswith(ERROR_PREFIX)]
    return errors[-1] if errors else None
