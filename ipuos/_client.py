"""The client side of the protocol: connect to a named machine, send requests, read replies.

``Client(paths).call("status")`` returns the result or raises :class:`DaemonError` with
the daemon's message; a result or event unfit for what its command reads of it (see
``_replies``) is a DaemonError too, saying the machine sent a bad reply. Long calls
stream events to ``on_event``. With ``interruptible=True`` a Ctrl-C does not kill the
client: it sends ``cancel`` for the call (the daemon interrupts the job) and keeps
reading, so the user still gets what the tiles printed; a second Ctrl-C gives up
waiting. Ctrl-C only sets a flag that the read loop checks between short polls, so it
never lands in the middle of reading a frame.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import stat
import threading
import time
from typing import Callable

from ._protocol import (
    BAD_JSON,
    BAD_VERSION,
    PREFIX,
    REPLY_LIMITS,
    REQUEST_LIMITS,
    FrameReader,
    ProtocolError,
    reply_result,
    request_frame,
)
from ._replies import event_problem, result_problem
from ._signals import catchable
from ._rundir import LOCK_SERVING, MachinePaths, hint, lock_holder, lock_state, starting, wait_started

CONNECT_SECONDS = 5.0
#: how long a client waits for a serving daemon to put back its deleted socket (it looks
#: four times a second)
SOCKET_PUT_BACK_SECONDS = 2.0
#: why a daemon answers nothing at all, not even that it is busy: Python raises no
#: interrupt inside a call into C, and such a call holds the interpreter, so none of the
#: daemon's threads runs until it returns
STUCK_IN_C = ("a tile is most likely inside one long call into C code (a regular expression that "
              "backtracks without end, say), which holds the whole daemon and cannot be interrupted")


def stuck_daemon(paths: MachinePaths, whose: str = "") -> str:
    """Why a machine answers nothing at all, and the ways out of it; ``whose``, put after
    the cause, may say which program that call may be."""
    pid = lock_holder(paths.lock)
    if pid and process_stopped(pid):
        return daemon_stopped(pid)
    return (f"{STUCK_IN_C}{whose}; it answers again once that call returns, or "
            f"{hint('halt --force', paths.name)} ends it")


#: what a daemon stopped by a signal is, wherever a client says so
STOPPED = "is stopped (by SIGSTOP, Ctrl-Z or a debugger)"


def daemon_stopped(pid: int) -> str:
    return f"its daemon (pid {pid}) {STOPPED}: `kill -CONT {pid}` lets it go on"


class _StoppedDaemon:
    """Tells a call waiting for a reply that its daemon has been stopped by a signal for
    :data:`STOPPED_SECONDS` (looked at once a second): a call that would time out anyway
    says so then, not after its whole timeout (30-40 s for ``ps`` or ``umount``)."""

    def __init__(self, paths: MachinePaths):
        self.paths = paths
        self.pid = 0
        self._since: float | None = None
        self._next_look = time.monotonic() + 1.0

    def for_long(self) -> bool:
        now = time.monotonic()
        if now < self._next_look:
            return False
        self._next_look = now + 1.0
        self.pid = lock_holder(self.paths.lock) or 0
        if not (self.pid and process_stopped(self.pid)):
            self._since = None
            return False
        if self._since is None:
            self._since = now
        return now - self._since >= STOPPED_SECONDS


def process_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal (or a tracer)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            return stat_file.read().rpartition(b")")[2].split()[:1] in ([b"T"], [b"t"])
    except OSError:
        return False
#: how long a client waits beyond a call's own timeout before it gives up on the daemon
GRACE_SECONDS = 10.0
#: how long a client waits after a second Ctrl-C for the call it then stops for good (a
#: job, a shell's run): its result still has what the tiles printed (their handlers'
#: cleanup, say)
RESULT_LINGER_SECONDS = 2.0
POLL_SECONDS = 0.1
#: how long a call that would time out anyway waits on a daemon stopped by a signal
#: before it says so (a debugger's brief stop is not worth failing for)
STOPPED_SECONDS = 2.0


class MachineNotRunning(Exception):
    """``stale``: its last daemon left its socket behind; ``in_the_way``: something else
    (a file, a directory) is where its socket goes, which booting will not remove."""

    def __init__(self, name: str, stale: bool = False, in_the_way: str | None = None):
        self.name = name
        self.stale = stale
        message = f"no machine named {name!r} is running; start one with {hint('boot', name)}"
        if in_the_way:
            message += f" once {in_the_way} is out of the way (it is no socket: remove it)"
        elif stale:
            message += " (its last daemon died without cleaning up; booting removes what it left)"
        super().__init__(message)


class DaemonError(Exception):
    """An error reply (``code`` and a message for the user), or a daemon that went away."""

    def __init__(self, code: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or {}


class SocketMissing(MachineNotRunning):
    """The machine's daemon holds its lock but has no socket to reach it by: it is starting
    or halting, or the socket was deleted or replaced from under it. ``pid``: the daemon's (0 if
    unknown). A MachineNotRunning, since nothing can reach it; ``ipuos halt`` stops it by
    signal."""

    def __init__(self, paths: MachinePaths, pid: int, deleted: bool = False):
        self.name = paths.name
        self.stale = False
        self.pid = pid
        #: the daemon serves (its lock says so): the socket was deleted or replaced, and stays so
        self.deleted = deleted
        if deleted:
            message = (f"machine {paths.name!r} runs (pid {pid or 'unknown'}), but its socket {paths.socket} "
                       f"was deleted or replaced: nothing can reach it; {hint('halt', paths.name)} stops it "
                       "by signal")
        else:
            message = (f"machine {paths.name!r} runs (pid {pid or 'unknown'}) but has no socket at {paths.socket}: "
                       f"it is starting or halting, or its socket was deleted; if this lasts, "
                       f"{hint('halt', paths.name)} stops it by signal")
        Exception.__init__(self, message)


class MachineStarting(SocketMissing):
    """The machine's daemon has been spawned but does not serve yet (its boot marker is
    held): it has not booted its machine, or not even taken its lock."""

    def __init__(self, paths: MachinePaths, pid: int | None):
        super().__init__(paths, pid or 0)
        which = f"pid {pid}" if pid else "its daemon has not taken its lock yet"
        Exception.__init__(self, f"machine {paths.name!r} is starting ({which}) and does not answer yet; "
                                 f"try again once it is up (`ipuos machines` lists it when it is)")


def _socket_path_mode(paths: MachinePaths) -> int | None:
    """The mode of what is where the machine's socket goes (not followed), or None."""
    try:
        return os.lstat(paths.socket).st_mode
    except OSError:
        return None


def _connect(sock, paths: MachinePaths, timeout: float) -> None:
    """Connect, waiting up to ``timeout`` for room in the daemon's queue: a Unix socket
    with a timeout fails at once (EAGAIN) while the queue is full, where a blocking connect
    would wait."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock.connect(str(paths.socket))
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise DaemonError("connect", (
                    f"machine {paths.name!r} accepts no connection: its queue at {paths.socket} stayed "
                    f"full for {timeout:g} s, so it is overloaded or stuck; see {paths.log}, or "
                    f"{hint('halt', paths.name)} stops it by signal")) from None
            time.sleep(0.02)


class Client:
    def __init__(self, paths: MachinePaths, connect_timeout: float = CONNECT_SECONDS):
        self.paths = paths
        deadline = time.monotonic() + connect_timeout
        put_back_by = time.monotonic() + min(connect_timeout, SOCKET_PUT_BACK_SECONDS)
        while True:
            try:
                sock = self._connected(paths, connect_timeout)
                break
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                # (refused: a socket file nobody listens on, which a serving daemon's is not:
                # its last daemon died, or it was replaced from under a running one)
                if not starting(paths):
                    if (isinstance(exc, FileNotFoundError) and time.monotonic() < put_back_by
                            and lock_state(paths.lock) == LOCK_SERVING and lock_holder(paths.lock)):
                        time.sleep(0.05)  # a serving daemon puts a deleted socket back
                        continue
                    self._not_running(paths, exc)
                if not wait_started(paths, max(0.0, deadline - time.monotonic())):
                    raise MachineStarting(paths, lock_holder(paths.lock)) from None
                # (it serves now, or died starting: look again)
        sock.settimeout(30.0)  # for sends; reads poll with their own deadlines
        self.sock = sock
        self.reader = FrameReader(sock, REPLY_LIMITS)
        self._ids = itertools.count(1)

    @staticmethod
    def _not_running(paths: MachinePaths, exc: OSError):
        pid = lock_holder(paths.lock)
        if pid is not None:
            raise SocketMissing(paths, pid, lock_state(paths.lock) == LOCK_SERVING) from None
        mode = _socket_path_mode(paths)
        squatted = mode is not None and not stat.S_ISSOCK(mode)
        raise MachineNotRunning(paths.name, stale=isinstance(exc, ConnectionRefusedError),
                                in_the_way=str(paths.socket) if squatted else None) from None

    @staticmethod
    def _connected(paths: MachinePaths, connect_timeout: float) -> socket.socket:
        """A socket connected to the daemon; FileNotFoundError or ConnectionRefusedError
        when nothing listens there. A symbolic link there is refused: it leads to another
        machine's socket, maybe, and `halt --name A` halted machine B."""
        mode = _socket_path_mode(paths)
        if mode is not None and stat.S_ISLNK(mode):
            raise DaemonError("bad_socket", f"{paths.socket} is a symbolic link, not the socket of machine "
                              f"{paths.name!r} (a daemon makes its own); remove it")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(connect_timeout)
        try:
            _connect(sock, paths, connect_timeout)
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            raise
        except PermissionError:
            sock.close()
            raise DaemonError("permission_denied", f"permission denied connecting to {paths.socket}; "
                              "is it another user's machine?") from None
        except DaemonError:
            sock.close()
            raise
        except OSError as exc:
            sock.close()
            raise DaemonError("connect", f"cannot connect to machine {paths.name!r} at {paths.socket}: "
                              f"{exc.strerror or exc}") from None
        return sock

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def call(self, cmd: str, args: dict | None = None, payload: bytes = b"", **options):
        """Send ``cmd`` and return its result (see :meth:`request` for the options)."""
        return self.request(cmd, args, payload, **options)[0]

    def request(
        self,
        cmd: str,
        args: dict | None = None,
        payload: bytes = b"",
        *,
        timeout: float | None = None,
        wait: float | None = -1,
        on_event: Callable[[dict], None] | None = None,
        interruptible: bool = False,
        on_interrupt: Callable[[int], None] | None = None,
        linger: float = 0.0,
    ) -> tuple[object, bytes]:
        """Send ``cmd`` and return ``(result, payload)``.

        ``timeout`` asks the daemon to give up after that many seconds. ``wait`` is how
        long this client waits for the reply (default: the timeout plus a grace period,
        or 30 s; None waits as long as it takes). ``on_interrupt(n)`` is told of the
        n-th Ctrl-C when ``interruptible``, also of one that came with the result. The
        first Ctrl-C cancels the call; the second gives up waiting (KeyboardInterrupt),
        at once, or with ``linger``, after telling the daemon so (it stops the call for
        good) and waiting that many seconds more for the result, which is then returned:
        a job stopped so still has its tiles' output to show.
        """
        if len(payload) > REQUEST_LIMITS.max_payload:
            raise DaemonError("too_large", f"{cmd!r} would send {len(payload) / 2**20:.1f} MiB; the daemon "
                              f"accepts at most {REQUEST_LIMITS.max_payload // 2**20} MiB in one request")
        request_id = next(self._ids)
        frame = request_frame(request_id, cmd, args, payload, timeout)
        header = len(frame) - PREFIX.size - len(payload)
        if header > REQUEST_LIMITS.max_header:  # (the daemon would drop the connection)
            raise DaemonError("too_large", f"{cmd!r} would send {header:,} bytes of arguments; the daemon "
                              f"accepts at most {REQUEST_LIMITS.max_header:,} in one request")
        if wait == -1:
            wait = (timeout if timeout is not None else 20.0) + GRACE_SECONDS
        interrupts = _InterruptFlag() if interruptible else None
        try:
            if interrupts is not None:
                # before sending: a Ctrl-C while a big request goes out cancels it like any
                # other, instead of cutting the frame short (the daemon may still act on it)
                interrupts.install()
            self._send(frame)
            deadline = None if wait is None else time.monotonic() + wait
            stopped = _StoppedDaemon(self.paths) if deadline is not None else None
            handled = 0
            while True:
                if interrupts is not None and interrupts.count > handled:
                    # one cancel per Ctrl-C (two may come between looks): the second abandons
                    # the call, and the daemon stops it for good
                    for _ in range(handled + 1, min(interrupts.count, 2 if linger else 1) + 1):
                        self._send(request_frame(next(self._ids), "cancel", {"id": request_id}))
                    handled = interrupts.count
                    if on_interrupt is not None:
                        on_interrupt(handled)
                    if handled > 1 and not linger or handled > 2:
                        raise KeyboardInterrupt
                    if handled == 2:
                        given_up = time.monotonic() + linger
                        deadline = given_up if deadline is None else min(deadline, given_up)
                if deadline is not None and time.monotonic() > deadline:
                    if interrupts is not None and interrupts.count >= 2:
                        raise KeyboardInterrupt  # (lingered after the second Ctrl-C: no result)
                    raise DaemonError("timeout", f"machine {self.paths.name!r} did not answer {cmd!r} "
                                      f"within {wait:g} s: {stuck_daemon(self.paths)}")
                frame = self._poll()
                if frame is None:
                    if stopped is not None and stopped.for_long():
                        raise DaemonError("timeout", f"machine {self.paths.name!r} cannot answer {cmd!r}: "
                                          f"{daemon_stopped(stopped.pid)}")
                    continue
                header = frame.header
                if header.get("id") != request_id:
                    if header.get("type") == "error" and header.get("id") is None:
                        self._raise_error(header)  # about the connection itself
                    continue  # e.g. the reply to our cancel
                kind = header.get("type")
                if kind == "event":
                    if on_event is not None:
                        on_event(self._event(header))
                elif kind == "result":
                    if interrupts is not None and interrupts.count > handled and on_interrupt is not None:
                        # it came with the result: too late to cancel this call, but the
                        # caller may have more to stop (the next chunks of a put)
                        on_interrupt(interrupts.count)
                    return self._result(frame, cmd), (b"" if header.get("result_in_payload") else frame.payload)
                elif kind == "error":
                    self._raise_error(header)
        finally:
            if interrupts is not None:
                interrupts.uninstall()

    def _send(self, frame: bytes) -> None:
        try:
            self.sock.sendall(frame)
        except OSError as exc:
            raise self._gone(exc) from None

    def _poll(self):
        try:
            return self.reader.poll(POLL_SECONDS)
        except ProtocolError as exc:
            if exc.code == BAD_VERSION:
                raise self._other_release(exc.message) from None
            raise self._bad_reply(exc.code, exc.message) from None
        except (EOFError, ConnectionError, OSError) as exc:
            raise self._gone(exc) from None

    def _result(self, frame, cmd: str) -> dict:
        try:
            result = reply_result(frame)
        except ProtocolError as exc:
            raise self._bad_reply(exc.code, exc.message) from None
        if not isinstance(result, dict):  # (every command answers one, and its callers index it)
            raise self._bad_reply(BAD_JSON, "its result is not a JSON object")
        self._check(result_problem(cmd, result))
        return result

    def _event(self, header: dict) -> dict:
        event = self._object(header, "event")
        self._check(event_problem(event))
        return event

    def _check(self, problem: str | None) -> None:
        """A field its reader needs is missing or of the wrong type: a bad reply, said so
        here once rather than as a KeyError or TypeError in that command."""
        if problem is not None:
            raise self._bad_reply(BAD_JSON, problem)

    def _object(self, header: dict, key: str) -> dict:
        """The reply's ``key`` (its event, its error), which must be a JSON object if there."""
        value = header.get(key) or {}
        if not isinstance(value, dict):
            raise self._bad_reply(BAD_JSON, f"its {key} is not a JSON object")
        return value

    def _bad_reply(self, code: str, what: str) -> DaemonError:
        return DaemonError(code, f"machine {self.paths.name!r} sent a bad reply: {what}")

    def _raise_error(self, header: dict):
        error = self._object(header, "error")
        code = str(error.get("code", "error"))
        message = str(error.get("message", "the daemon reported an error"))
        if code == BAD_VERSION:
            raise self._other_release(message)
        details = {k: v for k, v in error.items() if k not in ("code", "message")}
        raise DaemonError(code, message, details)

    def _other_release(self, message: str) -> DaemonError:
        """Client and daemon speak different protocol versions (either side noticed):
        the machine must be halted and started by this release."""
        return DaemonError(BAD_VERSION, f"machine {self.paths.name!r}: {message} "
                           f"({hint('halt', self.paths.name)}, then start the machine again)")

    def _gone(self, exc: BaseException) -> DaemonError:
        return DaemonError(
            "disconnected",
            f"machine {self.paths.name!r} closed the connection (it may have halted or crashed; "
            f"its log is {self.paths.log})",
        )




def interrupt_call(times: int = 1) -> None:
    """Count ``times`` Ctrl-Cs for the interruptible call the main thread is making (a
    SIGTERM handler cancels that way, as Ctrl-C does, even where SIGINT is ignored, as in
    a script's background job; twice stops a job for good). KeyboardInterrupt if there is
    none (not in the call yet, or past it): the command then ends as after a Ctrl-C."""
    flag = _InterruptFlag.active
    if flag is None:
        raise KeyboardInterrupt
    flag.count += times


class _InterruptFlag:
    """Counts Ctrl-Cs instead of raising KeyboardInterrupt (main thread only)."""

    #: the flag of the interruptible call in progress on the main thread
    active: "_InterruptFlag | None" = None

    def __init__(self):
        self.count = 0
        self._previous = None
        self._installed = False
        self._active = False
        self._outer: _InterruptFlag | None = None  # (a call made inside another's: back to it after)

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        self._outer, _InterruptFlag.active, self._active = _InterruptFlag.active, self, True
        if catchable(signal.SIGINT):  # (one ignored stays ignored: counts come from interrupt_call)
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True

    def uninstall(self) -> None:
        if self._active:
            _InterruptFlag.active, self._active = self._outer, False
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def _handle(self, _signum, _frame) -> None:
        self.count += 1
