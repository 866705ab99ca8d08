"""Where a machine's socket, lock and log live, and why they can be trusted.

Every machine has three files in one private runtime directory: ``NAME.sock`` (the daemon's
socket), ``NAME.lock`` (held with ``flock`` for the daemon's whole life, so there is one
daemon per name) and ``NAME.log`` (the daemon's stdout and stderr). A fourth,
``NAME.boot``, is the boot marker: held (a shared lock) from before a daemon is
spawned until it serves, so a machine that is starting, before its daemon has even taken
its lock, is seen (see :func:`starting`).

The directory is the first line of defence: another user who could write to it could
swap the socket for their own and read every program we send. So it must be a real
directory (not a symlink), owned by us, with no group or other permissions. We create it
that way; one that exists with a wrong owner or mode is refused, never "fixed", because
someone else may have made it.

Location: ``$IPUOS_RUNTIME_DIR`` if set, else ``$XDG_RUNTIME_DIR/ipuos``, else
``/tmp/ipuos-$UID``.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
import struct
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MACHINE = "default"
#: environment variable naming the machine when ``--name`` is not given
MACHINE_ENV = "IPUOS_MACHINE"
#: environment variable overriding the runtime directory (tests, several users of one uid)
RUNTIME_DIR_ENV = "IPUOS_RUNTIME_DIR"

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
#: sun_path holds 108 bytes including the terminating NUL
MAX_SOCKET_PATH = 107

#: how long a lock's holder may take to write its pid after taking the lock
_PID_WAIT_SECONDS = 0.5
#: how long a starting daemon waits out lookers' instant shared locks before giving up
_PROBE_WAIT_SECONDS = 2.0


class RuntimeDirError(Exception):
    """The runtime directory cannot be used safely; the message says how to fix it."""


class MachineLocked(Exception):
    """Another daemon holds this machine name."""

    def __init__(self, name: str, pid: int | None):
        self.name = name
        self.pid = pid
        held = f" (pid {pid})" if pid else ""
        super().__init__(f"machine {name!r} is already running{held}")


def check_name(name: str) -> str:
    """A machine name is a file name in the runtime dir: keep it plain."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"bad machine name {name!r}: use up to 64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def runtime_dir() -> Path:
    """The runtime directory for this user (not checked; see :func:`private_dir`)."""
    explicit = os.environ.get(RUNTIME_DIR_ENV)
    if explicit:
        # absolute: the daemon runs in / and must find the same directory as its client
        return Path(os.path.abspath(explicit))
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg) and os.path.isdir(xdg):
        return Path(xdg) / "ipuos"
    return Path(f"/tmp/ipuos-{os.getuid()}")


def private_dir(path: Path | None = None, create: bool = True) -> Path:
    """Return ``path`` (default :func:`runtime_dir`) after checking it is ours and private.

    Creates it with mode 0700 when missing and ``create`` is true (its parent must exist).
    Raises RuntimeDirError, with what to do, for anything else.
    """
    path = Path(path) if path is not None else runtime_dir()
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:  # (a file where a parent should be, a name too long, a loop)
        raise RuntimeDirError(f"cannot use the runtime directory {path}: {exc.strerror}; "
                              f"set {RUNTIME_DIR_ENV} to a directory you own") from None
    if info is None:
        if not create:
            raise RuntimeDirError(f"the runtime directory {path} does not exist") from None
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # someone made it meanwhile: check theirs below
        except OSError as exc:
            raise RuntimeDirError(
                f"cannot create the runtime directory {path}: {exc.strerror}; "
                f"set {RUNTIME_DIR_ENV} to a directory you own"
            ) from None
        info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise RuntimeDirError(
            f"refusing to use the runtime directory {path}: it is a symbolic link; "
            f"remove it, or set {RUNTIME_DIR_ENV} to a private directory"
        )
    if not stat.S_ISDIR(info.st_mode):
        raise RuntimeDirError(
            f"refusing to use the runtime directory {path}: it is not a directory; "
            f"remove it, or set {RUNTIME_DIR_ENV} to a private directory"
        )
    uid = os.geteuid()
    if info.st_uid != uid:
        raise RuntimeDirError(
            f"refusing to use the runtime directory {path}: it belongs to uid {info.st_uid}, "
            f"not to you (uid {uid}), so its owner could intercept your machines; "
            f"remove it, or set {RUNTIME_DIR_ENV} to a private directory"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise RuntimeDirError(
            f"refusing to use the runtime directory {path}: its mode is {mode:04o}, so other "
            f"users can reach your machines' sockets; make it private with `chmod 700 {path}`"
        )
    return path


@dataclass(frozen=True)
class MachinePaths:
    """The files of one named machine."""

    name: str
    dir: Path

    @property
    def socket(self) -> Path:
        return self.dir / f"{self.name}.sock"

    @property
    def lock(self) -> Path:
        return self.dir / f"{self.name}.lock"

    @property
    def log(self) -> Path:
        return self.dir / f"{self.name}.log"

    @property
    def boot_marker(self) -> Path:
        return self.dir / f"{self.name}.boot"


def machine_paths(name: str, directory: Path | None = None, create: bool = True) -> MachinePaths:
    """Check ``name`` and the runtime dir; the machine's file paths."""
    paths = MachinePaths(check_name(name), private_dir(directory, create))
    if len(os.fsencode(paths.socket)) > MAX_SOCKET_PATH:
        raise RuntimeDirError(
            f"the socket path {paths.socket} is longer than the {MAX_SOCKET_PATH} bytes a "
            f"Unix socket allows; set {RUNTIME_DIR_ENV} to a shorter directory"
        )
    return paths


def running_names(directory: Path | None = None) -> list[str]:
    """Names of machines whose lock is held right now, or that are starting, sorted."""
    try:
        folder = private_dir(directory, create=False)
    except RuntimeDirError:
        return []
    names = set()
    for lock in folder.glob("*.lock"):
        name = lock.name[: -len(".lock")]
        if _NAME_RE.match(name) and lock_holder(lock) is not None:
            names.add(name)
    for marker in folder.glob("*.boot"):
        name = marker.name[: -len(".boot")]
        if _NAME_RE.match(name) and starting(MachinePaths(name, folder)):
            names.add(name)
    return sorted(names)


# -- the lock ---------------------------------------------------------------------------------


def acquire_lock(path: Path, name: str) -> int:
    """Take the machine's lock for this process's life; the open fd (keep it open).

    The daemon removes its lock file when it halts, so a competitor may have opened the
    old file just before: after locking, check the path still names the file we locked,
    and start over if not. Raises MachineLocked when another daemon holds it.

    A client asking who holds the lock (``lock_holder``) takes it shared for an instant:
    that is not a daemon, so wait for it to let go rather than refuse to start.
    """
    deadline = time.monotonic() + _PROBE_WAIT_SECONDS
    while True:
        fd = open_runtime_file(path, os.O_RDWR | os.O_CREAT, "lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if _only_probed(fd) and time.monotonic() < deadline:
                os.close(fd)
                time.sleep(0.002)
                continue
            pid = _holder_pid(fd)
            os.close(fd)
            raise MachineLocked(name, pid) from None
        if same_file(path, fd):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)


def hint(command: str, name: str) -> str:
    """``ipuos COMMAND`` in backquotes, as the user must type it for machine ``name``: a
    message suggesting a command for a machine other than the default names it too."""
    return f"`ipuos {command}{'' if name == DEFAULT_MACHINE else f' --name {name}'}`"


#: (ENXIO: a FIFO opened for writing, non-blocking, with no reader)
_NOT_REGULAR = "it is not a regular file"


def open_runtime_file(path: Path, flags: int, what: str) -> int:
    """``os.open`` a machine's file in the runtime dir (never through a symbolic link,
    created 0600). RuntimeDirError says what is in the way: a directory or a link of that
    name is not ours to remove."""
    try:
        # (non-blocking: opening a FIFO put there would wait for a reader forever)
        fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        why = {errno.ELOOP: "it is a symbolic link", errno.ENXIO: _NOT_REGULAR}.get(exc.errno) or exc.strerror
        raise RuntimeDirError(f"cannot open the machine's {what} {path}: {why or exc}; remove or rename "
                              "it and boot again") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RuntimeDirError(f"cannot open the machine's {what} {path}: {_NOT_REGULAR}; "
                              "remove or rename it and boot again")
    os.set_blocking(fd, True)
    return fd


#: what the daemon holding a lock is doing, on the line after its pid: clients tell a
#: socket deleted from under a serving daemon (nothing will bring it back) from one not
#: bound yet or already gone with a halt (wait for those)
LOCK_SERVING = "serving"
LOCK_HALTING = "halting"


def mark_lock(fd: int, state: str) -> None:
    """Write ``state`` (``LOCK_SERVING``, ``LOCK_HALTING``) after the pid in a held lock."""
    text = f"{os.getpid()}\n{state}\n".encode()
    os.pwrite(fd, text, 0)  # (the pid stays where it was: a reader never sees it torn)
    os.ftruncate(fd, len(text))


def lock_state(path: Path) -> str:
    """What the lock's holder says it is doing (``""``: starting, or it does not say)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        lines = os.pread(fd, 64, 0).decode("ascii", "replace").splitlines()
    except OSError:
        return ""
    finally:
        os.close(fd)
    return lines[1].strip() if len(lines) > 1 else ""


# -- the boot marker ---------------------------------------------------------------------------
# A daemon takes its lock only once Python has started and imported it (~0.5 s), and binds
# its socket only once its machine has booted: until then, the lock alone cannot tell a
# machine that is starting from none at all, and a halt in that window would find nothing
# to stop. So whoever spawns a daemon holds the boot marker (a shared read lock:
# concurrent boots of one name do not wait for each other) and hands it to the daemon, which lets go
# once it serves; the kernel lets go for a daemon that dies first. It is never removed
# (removing a locked file races with whoever has just opened it); it is empty.


#: ``struct flock`` (Linux, 64-bit off_t): type, whence, start, length, pid (and padding)
_FLOCK = struct.Struct("hhqqi4x")


def hold_boot_marker(path: Path) -> int:
    """Hold the boot marker at ``path`` (a shared lock); the open fd, to hand to the daemon."""
    fd = open_runtime_file(path, os.O_RDWR | os.O_CREAT, "boot marker")
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, _FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0))
    except BaseException:
        os.close(fd)
        raise
    return fd


def starting(paths: MachinePaths) -> bool:
    """Whether a daemon of this machine is being started: spawned and not serving yet.
    (An open-file-description lock, like flock's, stays with the daemon that inherits it;
    unlike flock, it can be tested without being taken, so two lookers never see each
    other's probe as a boot.)"""
    try:
        fd = os.open(paths.boot_marker, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        found = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    finally:
        os.close(fd)
    return _FLOCK.unpack(found)[0] != fcntl.F_UNLCK


def wait_started(paths: MachinePaths, timeout: float) -> bool:
    """Wait until no daemon of this machine is starting; False if one still is at ``timeout``."""
    deadline = time.monotonic() + timeout
    while starting(paths):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def release_lock(fd: int, path: Path) -> None:
    """Remove the lock file while still holding it, then let go. (Only if ``path`` still
    names it: after the runtime dir was deleted, it may name another daemon's.)"""
    if same_file(path, fd):
        try:
            os.unlink(path)
        except OSError:
            pass  # (gone meanwhile, or its directory was replaced: nothing of ours to remove)
    os.close(fd)


def same_file(path: Path, fd: int) -> bool:
    """Whether ``path`` (not followed if a link) names the file open as ``fd``."""
    try:
        there, held = os.lstat(path), os.fstat(fd)
    except OSError:  # (gone, or its directory replaced by a file, or not ours to look in)
        return False
    return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)


def lock_holder(path: Path) -> int | None:
    """The pid of the daemon holding the lock at ``path`` (0 if unknown), or None if free."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP):
            return None
        raise
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder_pid(fd) or 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _only_probed(fd: int) -> bool:
    """Whether the lock is held only shared (by lookers), not exclusively (by a daemon)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


def _holder_pid(fd: int) -> int | None:
    """The pid in a lock file another process holds. It writes it just after taking the
    lock, so a competitor that took it a moment ago gets that moment to write it."""
    deadline = time.monotonic() + _PID_WAIT_SECONDS
    while True:
        pid = _read_pid(fd)
        if pid is not None or time.monotonic() >= deadline:
            return pid
        time.sleep(0.002)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").partition("\n")[0].strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
