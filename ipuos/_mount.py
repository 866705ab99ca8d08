"""Host mounts of a running machine's files, served by its daemon (``ipuos mount``).

The daemon process serves every mount of its machine: a FUSE loop thread per mount, with
the operations of :class:`ipuos.vfs.ChipFilesystem` over the machine's host file client.
Serving from the daemon (not from the ``ipuos mount`` client) keeps the mount alive after
the command returns, lets ``halt`` unmount it, and keeps every request one queue hop away
from the tiles.

Life of a mount:

* ``ipuos mount MNT`` mounts and returns; the mount lives until ``ipuos umount MNT``, an
  unmount from outside (``fusermount3 -u``), or ``halt``.
* ``ipuos mount --foreground MNT`` stays attached: the mount lives exactly as long as the
  command. Ctrl-C, SIGTERM, or the command dying (its connection drops) unmounts it, lazily
  if a file on it is still open (see below); ``ipuos umount`` from elsewhere ends the
  command.
* ``ipuos umount MNT`` unmounts cleanly, or refuses with EBUSY when a process still has a
  file or its working directory there (like umount(8)); ``--lazy`` detaches the name at
  once and lets those processes finish (``fusermount3 -uz``).
* ``halt`` unmounts every mount of the machine before the machine stops (lazily if busy:
  the files that were open there then fail with EIO or ENOTCONN, never hang).
* If the daemon dies (kill -9), libfuse's ``auto_unmount`` watchdog (a ``fusermount3``
  left running beside the daemon) unmounts lazily: no dead "Transport endpoint is not
  connected" mount is left behind. Should one be left anyway (the watchdog was killed
  too), ``ipuos umount`` removes it: see :func:`remove_mount`.

Which machine serves a mount is written in the host's mount table: its source is
``ipuos:NAME`` and its type ``fuse.ipuos`` (:func:`mount_at` reads
``/proc/self/mountinfo``, which never blocks, unlike a ``stat`` of a dead or hung mount).

One trap shapes this module: a process must never use files on its own FUSE mount while
it serves it (it would wait for itself, and hangs on exit). The daemon only ever looks at
its mount points through the mount table.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import stat
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field

from ._affinity import pin_thread
from ._tilespec import TileSpecError, format_tiles, parse_tiles
from .vfs import CHIP_DISK_MOUNT, FUSE_SUBTYPE, ChipFilesystem, FuseUnavailable, fuse_options, serve_fuse

__all__ = ["MountManager", "MountError", "MountEntry", "MountServer", "mount_answers", "mount_at",
           "mount_entries", "mount_server", "remove_mount", "unmount_path", "MOUNT_TYPE", "SOURCE_PREFIX",
           "PROBE_SECONDS"]

log = logging.getLogger("ipuos.daemon")

MOUNT_TYPE = "fuse." + FUSE_SUBTYPE
#: a mount's source in the mount table: ``ipuos:NAME``
SOURCE_PREFIX = "ipuos:"
#: how long a mount may take to appear in the mount table
MOUNT_SECONDS = 10.0
#: how long an unmounted loop may take to return
LOOP_EXIT_SECONDS = 10.0
#: how long a mount may take to answer a probe (see mount_answers)
PROBE_SECONDS = 5.0


class MountError(Exception):
    """A mount or unmount that cannot be done; ``code`` is for the protocol."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# -- the host's mount table -------------------------------------------------------------


@dataclass(frozen=True)
class MountEntry:
    """One line of ``/proc/self/mountinfo``."""

    mountpoint: str
    fstype: str
    source: str
    device: str  # major:minor, different for every FUSE connection

    @property
    def machine(self) -> str | None:
        """The machine serving this mount, if it is an ipuos mount."""
        if self.fstype == MOUNT_TYPE and self.source.startswith(SOURCE_PREFIX):
            return self.source[len(SOURCE_PREFIX):]
        return None


def _unescape(field_text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes (``\\040``)."""
    if "\\" not in field_text:
        return field_text
    out, i = [], 0
    while i < len(field_text):
        char = field_text[i]
        digits = field_text[i + 1 : i + 4]
        if char == "\\" and len(digits) == 3 and all(c in "01234567" for c in digits):
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            out.append(char)
            i += 1
    return "".join(out)


def mount_entries() -> list[MountEntry]:
    """Every mount this process sees, in mount order (never touches the mounts themselves)."""
    entries = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
        for line in table:
            left, sep, right = line.partition(" - ")
            parts, rparts = left.split(), right.split()
            if not sep or len(parts) < 5 or len(rparts) < 2:
                continue
            entries.append(MountEntry(_unescape(parts[4]), rparts[0], _unescape(rparts[1]), parts[2]))
    return entries


def mount_at(path: str) -> MountEntry | None:
    """The mount on top at exactly ``path`` (an absolute, canonical path), if any."""
    found = None
    for entry in mount_entries():
        if entry.mountpoint == path:
            found = entry
    return found


def ipuos_mount_holding(path: str) -> MountEntry | None:
    """The innermost ipuos mount that ``path`` (absolute, canonical) is inside, if any."""
    found = None
    for entry in mount_entries():
        if entry.machine is not None and path.startswith(entry.mountpoint.rstrip("/") + "/"):
            if found is None or len(entry.mountpoint) > len(found.mountpoint):
                found = entry
    return found


def canonical_mountpoint(path: str) -> str:
    """``path`` absolute and with symlinks resolved, without touching ``path`` itself (it
    may be a dead mount, whose stat fails, or a live one of this very process)."""
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    if not name:
        return path
    path = os.path.join(os.path.realpath(parent), name)
    if mount_at(path) is not None:
        return path  # (even lstat of a mount point asks the mount, which may never answer)
    if os.path.islink(path):
        # fusermount3 and umount(8) follow it: so must every check of the mount table
        return os.path.realpath(path)
    return path


def already_mounted(path: str, entry: MountEntry) -> str:
    """Why nothing can be mounted at ``path``, where ``entry`` is."""
    owner = f"machine {entry.machine!r}" if entry.machine else entry.fstype
    return (f"{path} is already a mount point ({owner}); unmount it first "
            "(`ipuos umount` removes ipuos mounts, even dead ones)")


def _inside(path: str, top: str) -> bool:
    """Is ``path`` below the directory ``top`` (both canonical), not ``top`` itself?"""
    return path.startswith(top.rstrip("/") + "/")


def refuse_over_runtime_dir(mountpoint: str, runtime_dir) -> None:
    """MountError if a mount at ``mountpoint`` (canonical) would cover ``runtime_dir``: it
    would hide the machines' sockets, locking every ipuos command out (umount and halt
    too), and the mount's mode would fail the runtime directory's privacy check."""
    runtime = os.path.realpath(runtime_dir)
    if runtime == mountpoint or _inside(runtime, mountpoint):
        where = "is" if runtime == mountpoint else "holds"
        raise MountError("bad_mountpoint", f"{mountpoint} {where} the runtime directory {runtime} "
                         "(the machines' sockets): a mount there would lock every ipuos command "
                         "out; mount somewhere else")


def _run(command: list[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return 127, f"{command[0]} is not installed"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(command)} did not finish in 30 s"
    return done.returncode, (done.stderr or done.stdout).strip()


def unmount_path(path: str, *, lazy: bool = False) -> tuple[bool, str]:
    """Unmount the FUSE mount at ``path``: ``fusermount3 -u`` (``-uz`` if ``lazy``), or
    umount(8) where fusermount3 is missing (root). Returns (gone, what the tool said)."""
    before = mount_at(path)
    if before is None:
        return True, ""
    said = ""
    for command in ([["fusermount3", "-u", "-z", path], ["umount", "-l", path]] if lazy
                    else [["fusermount3", "-u", path], ["umount", path]]):
        status, said = _run(command)
        if status != 127:  # the tool ran (whatever it said); else try the next one
            break
    after = mount_at(path)
    return after is None or after.device != before.device, said


def _watchdogs(mountpoint: str) -> set[int]:
    """This process's ``fusermount3`` children left watching a mount at ``mountpoint``."""
    me = os.getpid()
    return {pid for pid, parent in _watchdog_parents(mountpoint).items() if parent == me}


def _watchdog_parents(mountpoint: str) -> dict[int, int]:
    """The ``fusermount3`` processes left watching a mount at ``mountpoint`` (libfuse's
    auto_unmount watchdogs), each with its parent: the process that serves the mount."""
    found = {}
    target = os.fsencode(mountpoint)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
            if not (os.path.basename(argv[0]) == b"fusermount3" and target in argv
                    and any(b"auto_unmount" in arg for arg in argv)):
                continue
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rpartition(b")")[2].split()
            found[int(entry.name)] = int(fields[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return found


@dataclass(frozen=True)
class MountServer:
    """The process serving a mount, as the host tells it."""

    pid: int
    #: the runtime directory it was started with, if it is a machine's daemon
    runtime_dir: str | None


def mount_server(mountpoint: str) -> MountServer | None:
    """Who serves the FUSE mount at ``mountpoint``: the parent of its auto_unmount
    watchdog. None if that is not known (no watchdog, or several for that path)."""
    parents = set(_watchdog_parents(mountpoint).values())
    if len(parents) != 1:
        return None
    (pid,) = parents
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = [arg.decode("utf-8", "surrogateescape") for arg in handle.read().split(b"\0")]
    except OSError:
        return None
    runtime_dir = None
    if "ipuos._daemon" in argv and "--rundir" in argv[:-1]:
        runtime_dir = argv[argv.index("--rundir") + 1]
    return MountServer(pid, runtime_dir)


def mount_answers(path: str, timeout: float = PROBE_SECONDS) -> bool | None:
    """Does the FUSE mount at ``path`` answer? False if it is dead: its connection is
    gone (ENOTCONN, ECONNABORTED), nobody serves it. None if no answer came within
    ``timeout`` (its server may be stopped, or busy): the thread that asked is left
    waiting. Never ask from the process serving the mount: it would wait for itself."""
    answer = {}

    def probe() -> None:
        try:
            os.statvfs(path)  # (a stat could be answered from what the kernel keeps)
            answer["alive"] = True
        except OSError as exc:  # any other error is an answer too
            answer["alive"] = exc.errno not in (errno.ENOTCONN, errno.ECONNABORTED)

    thread = threading.Thread(target=probe, daemon=True, name="ipuos-mount-probe")
    thread.start()
    thread.join(timeout)
    return answer.get("alive")


# sock_diag (linux/sock_diag.h, linux/unix_diag.h): what ``ss -x`` asks the kernel
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_UDIAG_SHOW_PEER = 0x04
_UNIX_DIAG_PEER = 2
_NO_COOKIE = 0xFFFFFFFF


def _unix_peer(inode: int) -> int | None:
    """The inode of the socket at the other end of the Unix socket ``inode``, or None if
    the kernel does not say (no sock_diag support)."""
    request = struct.pack("=BBHIIIII", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, inode, _UDIAG_SHOW_PEER,
                          _NO_COOKIE, _NO_COOKIE)
    header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    try:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, _NETLINK_SOCK_DIAG) as diag:
            diag.settimeout(5)
            diag.send(header + request)
            reply = diag.recv(65536)
    except OSError:
        return None
    if len(reply) < 32 or struct.unpack_from("=H", reply, 4)[0] != _SOCK_DIAG_BY_FAMILY:
        return None  # an error message: no such socket
    end = min(len(reply), struct.unpack_from("=I", reply)[0])
    offset = 32  # past the message header and struct unix_diag_msg: its attributes
    while offset + 8 <= end:
        length, kind = struct.unpack_from("=HH", reply, offset)
        if length < 4:
            break
        if kind == _UNIX_DIAG_PEER:
            return struct.unpack_from("=I", reply, offset + 4)[0]
        offset += (length + 3) & ~3
    return None


def _watchdog_socket(pid: int) -> int | None:
    """This process's descriptor of libfuse's socket to the auto_unmount watchdog ``pid``,
    made close-on-exec; None if it cannot be found.

    libfuse leaves it open for the life of the process, inheritable by every later child
    (each next watchdog among them): the mount's owner closes it once the watchdog is
    gone (see _end_watchdog). The watchdog names its own end in ``_FUSE_COMMFD``."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            names = dict(item.partition(b"=")[::2] for item in handle.read().split(b"\0"))
        theirs = os.readlink(f"/proc/{pid}/fd/{int(names[b'_FUSE_COMMFD'])}")
    except (OSError, KeyError, ValueError):
        return None
    if not (theirs.startswith("socket:[") and theirs.endswith("]")):
        return None
    ours = _unix_peer(int(theirs[len("socket:["):-1]))
    if ours is None:
        return None
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == f"socket:[{ours}]":
                fd = int(name)
                os.set_inheritable(fd, False)
                return fd
        except OSError:
            continue  # (closed meanwhile: the listing's own descriptor)
    return None


def _end_watchdog(pid: int, socket_fd: int | None) -> None:
    """Stop the auto_unmount watchdog of a mount that has ended, reap it, and close
    libfuse's socket to it (``socket_fd``, see _watchdog_socket).

    Closing the socket alone would make the watchdog lazily unmount whatever
    ``fuse.ipuos`` mount sits at that path by then, maybe a new one, maybe another
    machine's. It ignores SIGTERM; its mount is gone, so there is nothing for it to
    finish: SIGKILL first."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass
    if socket_fd is not None:
        os.close(socket_fd)


def remove_mount(path: str) -> bool:
    """Remove a mount nobody serves any more (its daemon died and took the watchdog with
    it: every use says "Transport endpoint is not connected"). ``fusermount3 -u``, then
    lazily, then umount(8) ``-l``; returns whether it is gone."""
    for lazy in (False, True):
        gone, _ = unmount_path(path, lazy=lazy)
        if gone:
            return True
    _run(["umount", "-l", path])
    return mount_at(path) is None


def remove_dead_mounts(machine: str) -> list[str]:
    """Remove the dead mounts of machine ``machine`` (a daemon of that name booting: its
    last one died with its watchdog, as a kill of their whole process group does);
    returns where they were. A live mount of that name, served from another runtime
    dir, answers, and is left alone, as is one that does not answer in time."""
    removed = []
    for entry in mount_entries():
        if entry.machine == machine and mount_answers(entry.mountpoint) is False:
            if remove_mount(entry.mountpoint):
                removed.append(entry.mountpoint)
    return removed


# -- the daemon's mounts ------------------------------------------------------------------


@dataclass(eq=False)  # (one per mount: compared and hashed by identity)
class ActiveMount:
    """A mount the daemon serves."""

    mountpoint: str
    readonly: bool
    tiles: str  # the tile spec, as ranges
    foreground: bool
    client_pid: int | None
    operations: ChipFilesystem
    started: float = field(default_factory=time.time)
    #: set when the FUSE loop has returned (unmounted, from anywhere)
    done: threading.Event = field(default_factory=threading.Event)
    #: set when a foreground client may return: the loop has returned, or ``halt``
    #: detached the mount (its files still open fail once the machine has stopped)
    released: threading.Event = field(default_factory=threading.Event)
    #: why it ended, for a foreground client ("unmounted", "machine halted" ...)
    reason: str = ""
    error: BaseException | None = None
    thread: threading.Thread | None = None
    #: the mount table's major:minor for it, and libfuse's auto_unmount watchdog
    device: str = ""
    watchdog: int | None = None
    #: this process's descriptor of libfuse's socket to the watchdog
    watchdog_socket: int | None = None
    #: unmounted lazily: its name is free, its open files are served until closed
    detached: bool = False

    def describe(self) -> dict:
        return {
            "mountpoint": self.mountpoint,
            "detached": self.detached,
            "readonly": self.readonly,
            "tiles": self.tiles,
            "foreground": self.foreground,
            "client_pid": self.client_pid,
            "since": self.started,
            "open_files": self.operations.open_files(),
            "requests": self.operations.requests,
        }


class MountManager:
    """Every mount of one machine (one per daemon); safe to call from any thread.
    ``runtime_dir``: where the daemon's socket is, which no mount may cover."""

    def __init__(self, machine, name: str, runtime_dir=None):
        self.machine = machine
        self.name = name
        self.runtime_dir = runtime_dir
        self._mounts: dict[str, ActiveMount] = {}
        #: mounts detached lazily, served until their last file is closed
        self._detached: set[ActiveMount] = set()
        self._lock = threading.Lock()
        self._halting = False
        #: held while a mount starts, until its watchdog socket is close-on-exec: the
        #: fusermount3 of a mount starting meanwhile would inherit it (see _watchdog_socket)
        self._starting = threading.Lock()

    def mounts(self) -> list[ActiveMount]:
        """The mounts, and those detached lazily that still serve open files."""
        self._follow_moves()
        with self._lock:
            return sorted([*self._mounts.values(), *self._detached], key=lambda m: m.mountpoint)

    def get(self, mountpoint: str) -> ActiveMount | None:
        self._follow_moves()
        with self._lock:
            return self._mounts.get(mountpoint)

    def _follow_moves(self) -> None:
        """Know each mount by where it is now. Renaming a directory above a mount point
        moves the mount with it (the kernel's table shows the new path): known by its
        old path, it could not be unmounted, and halt left it dead. Found by its device
        number, which is the connection's own; of several places (bind mounts), the
        one it had stays, else the first."""
        with self._lock:
            mounts = [active for active in self._mounts.values() if active.device]
        if not mounts:
            return
        places: dict[str, list[str]] = {}
        source = SOURCE_PREFIX + self.name
        for entry in mount_entries():
            # (a device number is reused once its mount has gone: only this machine's count)
            if entry.fstype == MOUNT_TYPE and entry.source == source:
                places.setdefault(entry.device, []).append(entry.mountpoint)
        with self._lock:
            for active in mounts:
                now = places.get(active.device)
                if (not now or active.mountpoint in now or self._mounts.get(active.mountpoint) is not active
                        or now[0] in self._mounts):
                    continue
                del self._mounts[active.mountpoint]
                log.info("machine %r's mount at %s has moved to %s", self.name, active.mountpoint, now[0])
                active.mountpoint = now[0]
                self._mounts[now[0]] = active

    def holding(self, path: str) -> ActiveMount | None:
        """The mount of this machine that the existing directory ``path`` is on, if any
        (by device number: whatever path leads there, symlinks or bind mounts)."""
        mounts = self.mounts()
        if not mounts:
            return None
        st = os.stat(path)
        device = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        return next((m for m in mounts if m.device == device), None)

    def mount(self, mountpoint: str, *, readonly: bool = False, tiles: str = "all",
              foreground: bool = False, client_pid: int | None = None) -> ActiveMount:
        """Mount the machine's files at ``mountpoint`` and return once it answers."""
        if "\0" in mountpoint:
            raise MountError("bad_mountpoint", f"the mount point {mountpoint!r} holds a NUL byte, which no path can")
        if not os.path.isabs(mountpoint):
            raise MountError("bad_mountpoint", f"the mount point must be an absolute path, not {mountpoint!r}")
        mountpoint = canonical_mountpoint(mountpoint)
        machine = self.machine
        try:
            tile_ids = parse_tiles(tiles, machine.ntiles)
        except TileSpecError as exc:
            raise MountError("bad_tiles", str(exc)) from None
        self._check_mountpoint(mountpoint)
        storage = machine.storage
        chip_tile = storage.chip_tile if storage.chip_device is not None else None
        operations = ChipFilesystem(machine.fs, machine.ntiles, tiles=tile_ids, chip_tile=chip_tile,
                                    readonly=readonly, chip_mount=CHIP_DISK_MOUNT,
                                    changes=storage.changes)
        active = ActiveMount(mountpoint, readonly, format_tiles(tile_ids), foreground, client_pid, operations)
        with self._lock:
            if self._halting or mountpoint in self._mounts:
                operations.close()
            if self._halting:
                raise MountError("halting", f"machine {self.name!r} is halting")
            if mountpoint in self._mounts:
                raise MountError("already_mounted", f"{mountpoint} is already a mount of machine {self.name!r}")
            self._mounts[mountpoint] = active
        options = fuse_options(fsname=SOURCE_PREFIX + self.name, readonly=readonly)
        thread = threading.Thread(target=self._serve, args=(active, options), daemon=True,
                                  name=f"ipuos-fuse:{mountpoint}")
        active.thread = thread
        try:
            with self._starting:
                thread.start()
                self._wait_mounted(active)
        except BaseException:
            unmount_path(mountpoint, lazy=True)
            with self._lock:
                if self._mounts.get(mountpoint) is active:
                    del self._mounts[mountpoint]
            operations.close()
            raise
        log.info("mounted machine %r at %s (%s, tiles %s)", self.name, mountpoint,
                 "read-only" if readonly else "read-write", active.tiles)
        return active

    def _check_mountpoint(self, mountpoint: str) -> None:
        if self.runtime_dir is not None:
            refuse_over_runtime_dir(mountpoint, self.runtime_dir)
        self._follow_moves()
        with self._lock:
            attached = list(self._mounts.values())
        for active in attached:
            if mountpoint == active.mountpoint:
                raise MountError("already_mounted", f"{mountpoint} is already a mount of machine {self.name!r}")
            if _inside(mountpoint, active.mountpoint):
                # this process would stat its own mount while mounting on it
                raise MountError("bad_mountpoint", f"{mountpoint} is inside {active.mountpoint}, a mount of "
                                 f"machine {self.name!r}; mount somewhere else")
            if _inside(active.mountpoint, mountpoint):
                # it would hide that mount: nothing could reach it, nor unmount it by its path
                raise MountError("bad_mountpoint", f"{mountpoint} holds {active.mountpoint}, a mount of "
                                 f"machine {self.name!r}; mount somewhere else, or unmount that first")
        entry = mount_at(mountpoint)
        if entry is not None:
            raise MountError("already_mounted", already_mounted(mountpoint, entry))
        try:
            info = os.stat(mountpoint)
        except FileNotFoundError:
            raise MountError("bad_mountpoint", f"{mountpoint} does not exist; create the directory first") from None
        except OSError as exc:
            raise MountError("bad_mountpoint", f"cannot use {mountpoint}: {exc.strerror}") from None
        if not stat.S_ISDIR(info.st_mode):
            raise MountError("bad_mountpoint", f"{mountpoint} is not a directory")

    def _serve(self, active: ActiveMount, options: dict) -> None:
        pin_thread()  # libfuse's workers start here and inherit it: see ipuos._affinity
        try:
            serve_fuse(active.operations, active.mountpoint, **options)
        except FuseUnavailable as exc:
            active.error = exc
        except BaseException as exc:  # reported by mount() or in the log
            active.error = exc
            log.error("the FUSE loop for %s failed: %r", active.mountpoint, exc)
        finally:
            active.operations.close()
            entry = mount_at(active.mountpoint)
            if entry is not None and active.device and entry.device == active.device:
                unmount_path(active.mountpoint, lazy=True)  # the loop died under a live mount
            if active.watchdog is not None:
                _end_watchdog(active.watchdog, active.watchdog_socket)
            with self._lock:
                if self._mounts.get(active.mountpoint) is active:
                    del self._mounts[active.mountpoint]
                self._detached.discard(active)
            active.reason = active.reason or "unmounted"
            active.done.set()
            active.released.set()
            log.info("machine %r is no longer mounted at %s (%s)", self.name, active.mountpoint, active.reason)

    def _wait_mounted(self, active: ActiveMount) -> None:
        source = SOURCE_PREFIX + self.name
        deadline = time.monotonic() + MOUNT_SECONDS
        while True:
            entry = mount_at(active.mountpoint)
            if (entry is not None and entry.fstype == MOUNT_TYPE and entry.source == source
                    and active.operations.initialized.is_set()):  # (libfuse has started too)
                active.device = entry.device
                with self._lock:
                    taken = {other.watchdog for other in (*self._mounts.values(), *self._detached)}
                fresh = _watchdogs(active.mountpoint) - taken
                active.watchdog = min(fresh) if len(fresh) == 1 else None
                if active.watchdog is not None:
                    active.watchdog_socket = _watchdog_socket(active.watchdog)
                return
            if active.done.is_set():
                error = active.error
                if isinstance(error, FuseUnavailable):
                    raise MountError("no_fuse", str(error))
                raise MountError("mount_failed", f"mounting at {active.mountpoint} failed"
                                 + (f": {error}" if error else "") + " (libfuse's reason is in the machine's log)")
            if time.monotonic() > deadline:
                raise MountError("mount_failed", f"the mount at {active.mountpoint} did not appear "
                                 f"within {MOUNT_SECONDS:g} s")
            time.sleep(0.005)

    def unmount(self, mountpoint: str, *, lazy: bool = False, reason: str = "unmounted") -> dict:
        """Unmount one of this machine's mounts. EBUSY-like ``busy`` error if a process
        still uses it, unless ``lazy``."""
        mountpoint = canonical_mountpoint(mountpoint)
        active = self.get(mountpoint)
        if active is None:
            raise MountError("not_mounted", f"machine {self.name!r} has no mount at {mountpoint}")
        active.reason = reason
        active.operations.hold_notices()
        gone, said = unmount_path(mountpoint, lazy=lazy)
        if not gone:
            active.operations.release_notices()
            active.reason = ""
            raise MountError("busy", f"{mountpoint} is busy: a process has a file or its working "
                             f"directory there ({said or 'target is busy'}); close it, or "
                             "`ipuos umount --lazy` to detach it now and let them finish")
        # a clean unmount ends the loop at once; a lazy one when the last file is closed
        active.done.wait(LOOP_EXIT_SECONDS if not lazy else 0.5)
        if not active.done.is_set():
            with self._lock:  # detached: its name is free for a new mount meanwhile
                if self._mounts.get(mountpoint) is active:
                    del self._mounts[mountpoint]
                    active.detached = True
                    self._detached.add(active)
        return {"mountpoint": mountpoint, "lazy": lazy, "loop_ended": active.done.is_set()}

    def unmount_all(self, reason: str) -> list[str]:
        """Unmount everything, lazily where busy (``halt``); returns the mount points."""
        self._follow_moves()
        with self._lock:
            self._halting = True
            mounts = list(self._mounts.values())
        unmounted = []
        for active in mounts:
            active.reason = reason
            active.operations.hold_notices()  # (for good: the machine is halting)
            gone, _ = unmount_path(active.mountpoint)
            if gone:
                unmounted.append(active)
                continue
            # busy: detached, and whoever still uses it sees the machine stop; nothing
            # waits for its processes (a shell whose cwd is there would hold halt up)
            unmount_path(active.mountpoint, lazy=True)
            active.reason = f"{reason}; it was in use, so it was detached"
            active.detached = True
            active.released.set()
        for active in unmounted:
            active.done.wait(1.0)
        return [active.mountpoint for active in mounts]
