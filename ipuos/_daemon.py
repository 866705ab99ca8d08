"""The machine daemon: one process per named machine, serving clients on a Unix socket.

Started detached by ``ipuos boot`` (see ``_spawn``) as ``python -m ipuos._daemon``. In
order, it:

1. checks the private runtime dir and takes the machine's lock (``flock``), so one
   daemon owns a name; a second one exits with status 3 (its spawner's boot marker, handed
   down as ``--boot-marker-fd``, is held until step 4, so clients see it is starting);
2. removes a stale socket, but only after connecting to it was refused (a live daemon
   answers; a dead one leaves a file nobody listens on);
3. boots the :class:`Machine`, then binds the socket with umask 0177 (so it is created
   0600: no window where it is wider) and checks the result;
4. accepts clients, checking each peer's uid with SO_PEERCRED: the 0700 directory should
   already stop other users, and this check holds even if the directory was loosened;
   between clients, it puts back its lock and socket if they were deleted;
5. on ``halt`` (or SIGTERM/SIGINT): stops accepting, removes the socket, interrupts jobs,
   lets their clients get their results, closes the machine, removes and releases the lock.

Its stdout and stderr go to the machine's log file; a fatal start-up problem is logged as
one line beginning ``ipuos daemon: error:``, which the booting client shows the user.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import socket
import stat
import struct
import sys
import threading
import time
from pathlib import Path

from ._connection import Connection, ConnectionPolicy, HandlerSlots, linger_close
from ._backup import BackupError, restore as restore_image
from ._host import MachineHost
from ._machine import Machine
from ._mount import remove_dead_mounts
from ._presets import PRESETS
from ._protocol import (BUSY, ERROR_PREFIX, EXIT_ALREADY_RUNNING, EXIT_FAILED, EXIT_USAGE, PERMISSION_DENIED,
                        REQUEST_LIMITS, FrameBudget, error_frame)
from ._rundir import (LOCK_HALTING, LOCK_SERVING, MachineLocked, MachinePaths, RuntimeDirError, acquire_lock,
                      machine_paths, mark_lock, private_dir, release_lock, same_file)

#: connections served at once; more get a ``busy`` error
MAX_CLIENTS = 128
#: at MAX_CLIENTS, a new client takes the place of one that has sent nothing for this
#: long, or of one idle since its last request for the other (see _evict_idlest): longer
#: than a shell waits before it opens its line afresh (IDLE_RECONNECT_SECONDS), so that
#: no shell finds its line closed under it
EVICT_IDLE_SECONDS = 1.0
EVICT_USED_SECONDS = 45.0
#: request handler threads daemon-wide
MAX_HANDLERS = 256
#: bytes of big requests (a run's data, a put's chunk) being received at once, all
#: clients together: four of the biggest a request may be (see FrameBudget)
FRAME_BUDGET = 4 * (REQUEST_LIMITS.max_header + REQUEST_LIMITS.max_payload)
#: more, for the urgent commands alone (kill, status, ps, halt: see HandlerSlots)
RESERVED_HANDLERS = 16
#: how long halt lets running jobs report their results to their clients
HALT_GRACE_SECONDS = 5.0
#: how long, once the machine has stopped, clients' handlers have to send what its
#: stopping settled (a job held to the end is failed only then) before their sockets close
REPLY_GRACE_SECONDS = 2.0
ACCEPT_TICK_SECONDS = 0.25

log = logging.getLogger("ipuos.daemon")
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class StartupError(Exception):
    """The daemon cannot start; the message is for the user."""

    def __init__(self, message: str, status: int = EXIT_FAILED):
        super().__init__(message)
        self.status = status


class Daemon:
    def __init__(self, paths: MachinePaths, preset: str, ipus: int,
                 policy: ConnectionPolicy = ConnectionPolicy(), restore: str | None = None,
                 boot_marker_fd: int | None = None):
        self.policy = policy
        #: the spawner's boot marker, let go once serving (see ``_rundir.starting``)
        self.boot_marker_fd = boot_marker_fd
        self.paths = paths
        self.preset = preset
        self.ipus = ipus
        #: an image to restore after boot, before serving anyone (``boot --restore``)
        self.restore = restore
        self.host: MachineHost | None = None
        self.stopping = threading.Event()
        self.handler_slots = HandlerSlots(MAX_HANDLERS, RESERVED_HANDLERS)
        self.frame_budget = FrameBudget(FRAME_BUDGET)
        self._connections: dict[Connection, threading.Thread] = {}
        self._connections_lock = threading.Lock()
        self.lock_fd = -1
        self.listener: socket.socket | None = None
        #: (st_dev, st_ino) of the socket file the listener is bound to
        self._socket_file: tuple[int, int] | None = None
        self._last_warning = ""

    def run(self) -> None:
        """Boot, serve until halted, clean up. Raises StartupError if it cannot start."""
        try:
            self.lock_fd = acquire_lock(self.paths.lock, self.paths.name)
        except MachineLocked as exc:
            raise StartupError(f"{exc}; halt it first with `ipuos halt --name {self.paths.name}`",
                               EXIT_ALREADY_RUNNING) from None
        except RuntimeDirError as exc:
            raise StartupError(str(exc)) from None
        try:
            _remove_stale_socket(self.paths.socket)
            for path in remove_dead_mounts(self.paths.name):
                log.info("removed the dead mount at %s left by a daemon that died", path)
            machine = Machine(self.preset, self.ipus)
            self.host = MachineHost(machine, self.paths)
            if self.restore is not None:
                self._restore(machine)
            for kind in ("tile_states", "stats"):  # so a busy machine always has a last look
                self.host.look(kind, wait=30.0)
            self.host.collector.collect()  # the booted machine: frozen from now on
            try:
                self._listen()
                mark_lock(self.lock_fd, LOCK_SERVING)
                self._install_signals()
                self._started()
                log.info("machine %r booted: %s x%d, %d tiles in %.3f s; pid %d, socket %s",
                         self.paths.name, machine.preset.name, self.ipus, machine.ntiles,
                         machine.boot_seconds, os.getpid(), self.paths.socket)
                self._accept_loop()
            finally:
                if self.listener is not None:
                    mark_lock(self.lock_fd, LOCK_HALTING)  # (before the socket goes)
                self._shutdown()
        finally:
            release_lock(self.lock_fd, self.paths.lock)
        log.info("machine %r halted", self.paths.name)

    def _started(self) -> None:
        """Let go of the boot marker: clients now find the socket (or, later, a halt)."""
        if self.boot_marker_fd is not None:
            os.close(self.boot_marker_fd)
            self.boot_marker_fd = None

    def _restore(self, machine: Machine) -> None:
        try:
            summary = restore_image(machine, self.restore, name=self.paths.name)
        except BackupError as exc:
            machine.close()
            raise StartupError(f"{exc}; no machine was started") from None
        log.info("restored %s from %s in %.2f s", summary["description"], self.restore, summary["seconds"])

    # -- serving -------------------------------------------------------------------------

    def _install_signals(self) -> None:
        def halt(signum, _frame):
            log.info("%s: halting", signal.Signals(signum).name)
            self.host.request_halt()

        signal.signal(signal.SIGTERM, halt)
        signal.signal(signal.SIGINT, halt)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    def _listen(self) -> None:
        """Serve on a new socket at the machine's path (in place of any earlier one)."""
        listener = _bind_private(self.paths.socket)
        listener.settimeout(ACCEPT_TICK_SECONDS)
        info = os.lstat(self.paths.socket)
        if self.listener is not None:
            self.listener.close()
        self.listener, self._socket_file = listener, (info.st_dev, info.st_ino)

    def _accept_loop(self) -> None:
        while not self.host.halt_requested.is_set():
            try:
                self._stay_findable()
            except OSError as exc:  # (its directory made unreadable, say: it serves on)
                self._warn_once(f"cannot check the machine's socket and lock: {exc}")
            try:
                sock, _ = self.listener.accept()
            except (socket.timeout, InterruptedError):
                continue
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("cannot accept a client: %s", exc.strerror)
                    time.sleep(ACCEPT_TICK_SECONDS)
                    continue
                raise
            self._admit(sock)

    def _admit(self, sock: socket.socket) -> None:
        sock.settimeout(5.0)
        pid, uid, _gid = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        if uid != os.geteuid():
            log.warning("refused a connection from uid %d (pid %d): machines serve their owner only", uid, pid)
            _reply_and_close(sock, PERMISSION_DENIED,
                             f"permission denied: machine {self.paths.name!r} belongs to another user")
            return
        evicted = None
        with self._connections_lock:
            self._reap()
            if len(self._connections) >= MAX_CLIENTS:
                evicted = self._evict_idlest(time.monotonic())
                if evicted is None:
                    _reply_and_close(sock, BUSY, f"machine {self.paths.name!r} already serves {MAX_CLIENTS} "
                                     "clients; try again shortly")
                    return
            connection = Connection(sock, self.host, pid, self.handler_slots, self.stopping, self.policy,
                                    self.frame_budget)
            thread = threading.Thread(target=connection.serve, name=f"ipuos-client-{pid}", daemon=True)
            self._connections[connection] = thread
        if evicted is not None:  # (told outside the lock: telling it never waits long, but it may)
            idle, seconds = evicted
            idle.evict(f"closing a connection idle for {seconds:.0f} s: the daemon serves {MAX_CLIENTS} "
                       "clients at most, and another has come")
        try:
            thread.start()
        except RuntimeError:
            with self._connections_lock:
                self._connections.pop(connection, None)
            connection.close()

    def _evict_idlest(self, now: float) -> "tuple[Connection, float] | None":
        """At the limit of clients, make room by closing an idle one (connected, nothing
        asked or being answered): one that has sent nothing for EVICT_IDLE_SECONDS, else
        the one idle longest, if for EVICT_USED_SECONDS (a shell's connection waits
        between commands). Connections that never sent anything (or once a minute) held
        every place for the idle timeout, a minute, and then again. Caller holds
        ``_connections_lock``, and tells the one returned, idle for how long (see
        Connection.evict)."""
        idle = []
        for connection in self._connections:
            seconds = connection.idle_for(now)
            if seconds is not None and seconds >= (EVICT_USED_SECONDS if connection.has_sent else EVICT_IDLE_SECONDS):
                idle.append((not connection.has_sent, seconds, connection))
        if not idle:
            return None
        _, seconds, connection = max(idle, key=lambda entry: entry[:2])
        log.info("closing the connection of client pid %s, idle for %.1f s, to make room for another",
                 connection.peer_pid, seconds)
        del self._connections[connection]
        return connection, seconds

    def _reap(self) -> None:
        for connection, thread in list(self._connections.items()):
            if not thread.is_alive() and thread.ident is not None:
                del self._connections[connection]

    # -- halting -------------------------------------------------------------------------

    def _stay_findable(self) -> None:
        """Put back the machine's lock and socket if they were deleted from under it (a
        temp cleaner, ``rm -r`` of the runtime dir): without them no client can reach it,
        and booting the name again would start a second machine beside it, unseen. If
        another daemon has taken the name meanwhile, nothing can ever reach this one: it
        halts (leaving the other's files alone). A file put where the socket was is not
        ours to remove: clients are told the socket was replaced."""
        paths = self.paths
        if not same_file(paths.lock, self.lock_fd):
            try:
                private_dir(paths.lock.parent)
                fd = acquire_lock(paths.lock, paths.name)
            except MachineLocked as exc:
                log.error("the runtime files of machine %r were deleted, and another daemon has taken its "
                          "name since (%s): halting this one, which nothing can reach", paths.name, exc)
                self.host.request_halt()
                return
            except RuntimeDirError as exc:
                self._warn_once(f"cannot put back the machine's lock file, deleted from under it: {exc}")
                return
            mark_lock(fd, LOCK_SERVING)
            os.close(self.lock_fd)
            self.lock_fd = fd
            log.warning("put back the lock file %s, deleted from under the daemon", paths.lock)
        try:
            os.lstat(paths.socket)
        except FileNotFoundError:
            try:
                self._listen()
            except (OSError, StartupError) as exc:
                self._warn_once(f"cannot put back the socket {paths.socket}, deleted from under the daemon: {exc}")
                return
            log.warning("put back the socket %s, deleted from under the daemon", paths.socket)

    def _warn_once(self, message: str) -> None:
        if message != self._last_warning:
            log.warning("%s", message)
            self._last_warning = message

    def _shutdown(self) -> None:
        self.stopping.set()
        if self.listener is not None:
            self.listener.close()
            try:
                if _file_id(self.paths.socket) == self._socket_file:  # (never another's)
                    os.unlink(self.paths.socket)
            except OSError:
                pass  # (gone, or its directory replaced: nothing of ours to remove)
        host = self.host
        if host is None:
            return
        host.interrupt_all(f"machine {self.paths.name!r} is halting")
        # before waiting for clients: a foreground mount's client waits for its unmount
        host.mounts.unmount_all(f"machine {self.paths.name!r} halted")
        with self._connections_lock:
            connections = list(self._connections.items())
        deadline = time.monotonic() + HALT_GRACE_SECONDS
        for _, thread in connections:
            thread.join(max(0.0, deadline - time.monotonic()))
        host.machine.close()
        deadline = time.monotonic() + REPLY_GRACE_SECONDS
        for _, thread in connections:
            thread.join(max(0.0, deadline - time.monotonic()))
        for connection, thread in connections:
            connection.abort()
            thread.join(1.0)


def _remove_stale_socket(path: Path) -> None:
    """Remove a socket file nobody listens on (connect refused); refuse anything else."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise StartupError(f"{path} exists and is not a socket; remove it and boot again")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        os.unlink(path)
        log.info("removed the stale socket %s left by a daemon that died", path)
        return
    except FileNotFoundError:
        return
    except BlockingIOError:
        pass  # EAGAIN: a listener whose queue is full answers all the same
    except OSError as exc:
        raise StartupError(f"cannot tell whether {path} is still in use ({exc.strerror}); "
                           "remove it if no daemon runs, and boot again") from None
    finally:
        probe.close()
    raise StartupError(f"something already answers on {path} although this daemon holds the "
                       "machine's lock; stop it, remove the socket, and boot again")


def _file_id(path: Path) -> tuple[int, int]:
    info = os.lstat(path)
    return info.st_dev, info.st_ino


def _bind_private(path: Path) -> socket.socket:
    """Bind and listen on ``path``, created 0600 (umask set before bind, then checked)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old_umask)
    info = os.lstat(path)
    if stat.S_IMODE(info.st_mode) & 0o177 or info.st_uid != os.geteuid():
        listener.close()
        raise StartupError(f"the socket {path} came out with mode {stat.S_IMODE(info.st_mode):04o}; "
                           "refusing to serve on it")
    listener.listen(MAX_CLIENTS)
    return listener


def _reply_and_close(sock: socket.socket, code: str, message: str) -> None:
    """Refuse a connection at accept, before reading anything from it.

    This runs on the accept thread, so it lingers only for input already queued.
    """
    try:
        sock.sendall(error_frame(None, code, message))
    except OSError:
        pass
    linger_close(sock, seconds=0.05, max_bytes=64 * 1024)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ipuos._daemon",
                                     description="Run an ipuos machine daemon (normally started by `ipuos boot`).")
    parser.add_argument("--name", required=True)
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--ipus", type=int, default=1)
    parser.add_argument("--rundir", required=True)
    parser.add_argument("--restore", metavar="IMG")
    parser.add_argument("--boot-marker-fd", type=int, metavar="FD",
                        help="the spawner's boot marker, inherited: closed once serving")
    defaults = ConnectionPolicy()
    parser.add_argument("--idle-seconds", type=float, default=defaults.idle_seconds,
                        help="close client connections silent this long with nothing in flight")
    parser.add_argument("--frame-seconds", type=float, default=defaults.frame_seconds,
                        help="a frame must arrive whole within this long of its first byte")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s ipuos[%(process)d] %(levelname)s %(message)s")
    try:
        if args.restore is not None and not os.path.isabs(args.restore):
            raise StartupError(f"--restore needs an absolute path, not {args.restore!r}", EXIT_USAGE)
        if args.ipus < 1:
            raise StartupError(f"--ipus must be at least 1, not {args.ipus}", EXIT_USAGE)
        try:
            paths = machine_paths(args.name, Path(args.rundir))
        except (RuntimeDirError, ValueError) as exc:
            raise StartupError(str(exc), EXIT_USAGE) from None
        if not (args.idle_seconds > 0 and args.frame_seconds > 0):
            raise StartupError("--idle-seconds and --frame-seconds must be positive", EXIT_USAGE)
        policy = ConnectionPolicy(frame_seconds=args.frame_seconds, idle_seconds=args.idle_seconds)
        Daemon(paths, args.preset, args.ipus, policy, restore=args.restore,
               boot_marker_fd=args.boot_marker_fd).run()
    except StartupError as exc:
        print(ERROR_PREFIX + str(exc), file=sys.stderr, flush=True)
        return exc.status
    except MemoryError as exc:
        print(f"{ERROR_PREFIX}not enough memory to boot the machine: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    except Exception as exc:
        log.exception("the daemon failed")
        print(f"{ERROR_PREFIX}{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main())
