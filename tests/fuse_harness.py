"""Real FUSE mounts for the mount tests: mounted through real daemons, always unmounted.

Every mount point lives under one directory per test session; fixture finalizers unmount
what their test mounted (forcibly, even a dead mount), and the session finalizer fails the
run if any ipuos mount under that directory is still there, after removing it. A process
never uses files on a mount it serves itself, so tests that mount in their own process
(``in_process_mount``) drive the mount from child processes only.

Tile-side checks run real tile programs through the daemon (``run_on_tile``): what a
program on the tile sees is the other side of every round trip.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from daemon_harness import Booted, boot_machine, runtime_dir  # noqa: F401  (fixture)

from ipuos._mount import MountManager, mount_at, mount_entries, remove_mount

_session_dir: Path | None = None


def fuse_root() -> Path:
    """The directory every mount point of this session is made in."""
    global _session_dir
    if _session_dir is None:
        _session_dir = Path(tempfile.mkdtemp(prefix="ipuos-fuse-tests.", dir="/tmp"))
    return _session_dir


def our_mounts() -> list[str]:
    root = str(fuse_root()) + "/"
    return [entry.mountpoint for entry in mount_entries() if entry.mountpoint.startswith(root)]


@pytest.fixture(scope="session", autouse=False)
def fuse_session():
    """Checks at the end of the session that every mount made by the tests is gone."""
    yield fuse_root()
    left = our_mounts()
    for path in left:
        remove_mount(path)
    shutil.rmtree(fuse_root(), ignore_errors=True)
    assert not left, f"tests left these mounts behind: {left}"


def new_mountpoint(stem: str = "mnt") -> str:
    return tempfile.mkdtemp(prefix=stem + ".", dir=fuse_root())


def cleanup_mountpoint(path: str) -> None:
    """Unmount whatever is left at ``path`` (live or dead), then remove the directory."""
    if mount_at(path) is not None:
        remove_mount(path)
    assert mount_at(path) is None, f"{path} could not be unmounted"
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def mountpoint(fuse_session):
    """An empty directory to mount on; unmounted and removed after the test."""
    path = new_mountpoint()
    yield path
    cleanup_mountpoint(path)


# -- daemons ---------------------------------------------------------------------------------


def mount(booted: Booted, path: str, **args) -> dict:
    return booted.call("mount", {"mountpoint": path, **args}, timeout=30)


def umount(booted: Booted, path: str, lazy: bool = False) -> dict:
    return booted.call("umount", {"mountpoint": path, "lazy": lazy}, timeout=30)


class MountedMachine:
    """A daemon with its files mounted at ``path`` (``root`` is the mount as a Path)."""

    def __init__(self, booted: Booted, path: str):
        self.booted = booted
        self.path = path
        self.root = Path(path)

    def tile(self, tile: int) -> Path:
        return self.root / "tiles" / str(tile)

    @property
    def chip(self) -> Path:
        return self.root / "chip"

    def run(self, tile: int, source: str) -> str:
        return run_on_tile(self.booted, tile, source)

    def remount(self, **args) -> None:
        umount(self.booted, self.path)
        mount(self.booted, self.path, **args)


def mounted_machine(preset: str = "tiny", **mount_args):
    """Boot a machine and mount it; a generator for fixtures (halts and cleans up)."""
    booted = boot_machine(preset)
    path = new_mountpoint()
    try:
        mount(booted, path, **mount_args)
        yield MountedMachine(booted, path)
    finally:
        booted.halt()
        cleanup_mountpoint(path)
    log = booted.paths.log.read_text()
    # a callback that met an exception it did not expect answers EIO and logs it
    assert "failed unexpectedly" not in log and "Traceback" not in log, log[-3000:]


def run_on_tile(booted: Booted, tile: int, source: str) -> str:
    """Run ``source`` on ``tile`` through the daemon; its output (errors raise)."""
    source = textwrap.dedent(source)
    payload = source.encode()
    reply = booted.call("run", {"filename": "check.py", "source_len": len(payload), "tiles": str(tile)},
                        payload, wait=60)
    (result,) = reply["tiles"]
    if result["status"] != "ok":
        raise AssertionError(f"the tile program failed on tile {tile}:\n{result['error']}")
    return result["output"]


def file_id(data: bytes) -> tuple[int, str]:
    """How trees name a file's contents: (size, sha256), so big files cross as a line."""
    return len(data), hashlib.sha256(data).hexdigest()


def tile_tree(booted: Booted, tile: int, top: str = "/") -> dict:
    """{relative path: file_id or None for directories} of ``top`` on ``tile``, as a tile
    program sees it (tile 0's mount points left out of its root)."""
    out = run_on_tile(booted, tile, f"""
        import hashlib, json, os
        skip = {{"/chip", "/tiles"}} if {top!r} == "/" else set()
        tree = {{}}
        def walk(d, rel):
            for name in sorted(os.listdir(d)):
                full = d.rstrip("/") + "/" + name
                if full in skip:
                    continue
                key = rel + name
                if os.path.isdir(full):
                    tree[key] = None
                    walk(full, key + "/")
                else:
                    data = open(full, "rb").read()
                    tree[key] = [len(data), hashlib.sha256(data).hexdigest()]
        walk({top!r}, "")
        print(json.dumps(tree))
    """)
    return {key: (None if value is None else tuple(value)) for key, value in json.loads(out).items()}


def host_tree(top: str | Path) -> dict:
    """The same shape as :func:`tile_tree`, read through a host directory."""
    tree = {}
    top = str(top)
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        rel = os.path.relpath(dirpath, top)
        prefix = "" if rel == "." else rel + "/"
        for name in dirnames:
            tree[prefix + name] = None
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as handle:
                tree[prefix + name] = file_id(handle.read())
    return tree


# -- mounts served by the test process itself -------------------------------------------------


class InProcessMount:
    """A :class:`MountManager` mount of an in-process Machine, used from child processes."""

    def __init__(self, machine, path: str, **mount_args):
        self.machine = machine
        self.path = path
        self.manager = MountManager(machine, f"test{os.getpid()}")
        self.mount_args = mount_args

    def __enter__(self):
        self.active = self.manager.mount(self.path, **self.mount_args)
        return self

    def __exit__(self, *exc):
        self.manager.unmount_all("test over")
        cleanup_mountpoint(self.path)

    def child(self, source: str, *args, timeout: float = 60) -> dict:
        """Run ``source`` in a child Python (argv[1] is the mount point); its JSON output."""
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(source), self.path, *map(str, args)],
                              capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


def in_process_mount(preset: str = "tiny", **mount_args):
    """Fixture body: a fresh in-process machine of ``preset`` mounted in this process
    (use it from child processes only); unmounted and closed afterwards. ``mount_args``
    go to MountManager.mount."""
    import ipuos

    machine = ipuos.Machine(preset)
    try:
        with InProcessMount(machine, new_mountpoint(), **mount_args) as mounted:
            yield mounted
    finally:
        machine.close()


def errno_of(call, *args) -> int | None:
    """The errno ``call(*args)`` fails with, None if it succeeds."""
    try:
        call(*args)
    except OSError as exc:
        return exc.errno
    return None


# -- what the mount can read of its callers (vfs._syscalls) ------------------------------------


def blocked(argv: list[str], in_open: bool) -> subprocess.Popen:
    """Start ``argv`` and wait until it sleeps in a system call (an open, if ``in_open``):
    a process blocked as one waiting on the mount is. Killed and failed after 20 s."""
    from ipuos.vfs._syscalls import _OPEN_CALLS

    process = subprocess.Popen(argv)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{process.pid}/stat") as stat:
                sleeping = stat.read().rpartition(")")[2].split()[0] == "S"
            with open(f"/proc/{process.pid}/syscall") as syscall:
                call = syscall.read().split()[0]
        except OSError as exc:
            process.kill()
            pytest.skip(f"this host shows no process's system call: {exc}")
        if sleeping and call.isdigit() and (int(call) in _OPEN_CALLS) == in_open:
            return process
        time.sleep(0.01)
    process.kill()
    pytest.fail(f"{argv} never blocked")


#: opens its first argument with the flags in its second (a FIFO without a reader: blocks)
OPENER = "import os, sys; os.open(sys.argv[1], int(sys.argv[2]))"


@pytest.fixture(scope="session")
def caller_flags_readable(tmp_path_factory) -> None:
    """Skip unless this host lets the mount read a caller's open flags (vfs._syscalls):
    another architecture, an old kernel, or Yama's rules say no."""
    from ipuos.vfs._syscalls import _READABLE, creating_open

    if not _READABLE:
        pytest.skip("open flags of callers are not read on this host (see vfs._syscalls)")
    fifo = tmp_path_factory.mktemp("flags") / "fifo"
    os.mkfifo(fifo)
    process = blocked([sys.executable, "-c", OPENER, str(fifo), str(os.O_WRONLY | os.O_CREAT)], in_open=True)
    try:
        readable = creating_open(process.pid)
    finally:
        process.kill()
        process.wait()
    if readable is None:
        pytest.skip("this host does not let a process read a child's system call (Yama?)")
