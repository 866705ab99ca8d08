"""Real machine daemons for the daemon, protocol and CLI tests: booted, used, always halted.

Every daemon lives in one private runtime dir per test session (``$IPUOS_RUNTIME_DIR``,
short, under /tmp: Unix socket paths are limited to 107 bytes) and has a unique name, so
tests never meet a user's machines or each other's. ``Booted.halt`` runs from fixture
finalizers; a session finalizer SIGKILLs anything still holding a lock in the dir.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass
from pathlib import Path

import pytest

from ipuos._client import Client, DaemonError, MachineNotRunning
from ipuos._protocol import REPLY_LIMITS, FrameReader, encode_frame
from ipuos._rundir import RUNTIME_DIR_ENV, MachinePaths, lock_holder, machine_paths
from ipuos._spawn import boot, wait_halted

IPUOS = str(Path(sys.executable).with_name("ipuos"))
_names = itertools.count(1)


def unique_name(stem: str = "t") -> str:
    return f"{stem}{os.getpid()}-{next(_names)}"


@dataclass
class Booted:
    """A running daemon started by a test."""

    name: str
    paths: MachinePaths
    pid: int

    def client(self) -> Client:
        return Client(self.paths)

    def call(self, cmd: str, args: dict | None = None, payload: bytes = b"", **options):
        with self.client() as client:
            return client.call(cmd, args, payload, **options)

    def env(self, **extra) -> dict:
        """Environment for a CLI subprocess that talks to this machine by default."""
        env = dict(os.environ, IPUOS_MACHINE=self.name, **extra)
        return env

    def halt(self) -> None:
        try:
            with self.client() as client:
                client.call("halt")
        except (MachineNotRunning, DaemonError):
            pass
        if not wait_halted(self.paths, timeout=15):
            _kill(self.paths)


def boot_machine(preset: str = "tiny", name: str | None = None, daemon_options: tuple[str, ...] = (),
                 ipus: int = 1) -> Booted:
    paths = machine_paths(name or unique_name())
    info = boot(paths, preset, ipus, daemon_options=daemon_options)
    return Booted(paths.name, paths, info["pid"])


def _kill(paths: MachinePaths) -> None:
    pid = lock_holder(paths.lock)
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        wait_halted(paths, timeout=10)


@pytest.fixture
def empty_runtime_dir(monkeypatch):
    """A runtime dir of this test's own, with no machine in it: a message that lists the
    machines running says nothing more, whatever other tests have running."""
    path = Path(tempfile.mkdtemp(prefix="ipe", dir="/tmp"))
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def runtime_dir():
    """A private runtime dir for the whole session, set in the environment."""
    path = Path(tempfile.mkdtemp(prefix="ipt", dir="/tmp"))
    saved = os.environ.get(RUNTIME_DIR_ENV)
    os.environ[RUNTIME_DIR_ENV] = str(path)
    yield path
    for lock in path.glob("*.lock"):
        _kill(MachinePaths(lock.name[: -len(".lock")], path))
    if saved is None:
        os.environ.pop(RUNTIME_DIR_ENV, None)
    else:
        os.environ[RUNTIME_DIR_ENV] = saved
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def machine(runtime_dir):
    """A fresh tiny machine for one test."""
    booted = boot_machine()
    yield booted
    booted.halt()


@pytest.fixture(scope="module")
def shared_machine(runtime_dir):
    """One tiny machine for a module's tests that leave it as they found it."""
    booted = boot_machine()
    yield booted
    booted.halt()


# -- raw protocol access ----------------------------------------------------------------------


def raw_socket(paths: MachinePaths, timeout: float = 10.0) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(str(paths.socket))
    return sock


#: one reader per socket: a read may take in more than one frame, and the rest must wait
#: in that reader's buffer for the next call
_readers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def read_frame(sock: socket.socket, timeout: float = 10.0, reader: FrameReader | None = None):
    """The next frame from the daemon, or None if it closed the connection."""
    if reader is None:
        reader = _readers.get(sock)
        if reader is None:
            reader = _readers[sock] = FrameReader(sock, REPLY_LIMITS)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            frame = reader.poll(0.1)
        except (EOFError, ConnectionError):
            return None
        if frame is not None:
            return frame
    raise AssertionError(f"no frame within {timeout} s")


def closed_by_peer(sock: socket.socket, timeout: float = 10.0) -> bool:
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def request(request_id: int, cmd: str, args: dict | None = None, payload: bytes = b"") -> bytes:
    return encode_frame({"id": request_id, "cmd": cmd, "args": args or {}}, payload)


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.05, what: str = "a condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def run_cli(*args: str, env: dict | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """The real ``ipuos`` command in a subprocess."""
    return subprocess.run([IPUOS, *args], capture_output=True, text=True, env=env, timeout=timeout)
