"""The mount tells whether the thread behind a request is in an open that creates a
missing file (vfs._syscalls), read from /proc while that thread is blocked in its call:
here, processes blocked opening a FIFO that has no reader."""

from __future__ import annotations

import os
import sys

import pytest
from fuse_harness import OPENER, blocked, caller_flags_readable  # noqa: F401  (fixture)

from ipuos.vfs._syscalls import creating_open

pytestmark = pytest.mark.usefixtures("caller_flags_readable")


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    processes = []
    yield path, processes
    for process in processes:
        process.kill()
        process.wait()


@pytest.mark.parametrize("flags, creating", [
    (os.O_WRONLY | os.O_CREAT | os.O_TRUNC, True),  # open(f, "w")
    (os.O_WRONLY | os.O_CREAT | os.O_APPEND, True),  # open(f, "a")
    (os.O_WRONLY, False),
    (os.O_WRONLY | os.O_TRUNC, False),
])
def test_an_open_tells_whether_it_creates(fifo, flags, creating):
    path, processes = fifo
    processes.append(blocked([sys.executable, "-c", OPENER, str(path), str(flags)], in_open=True))
    assert creating_open(processes[-1].pid) is creating


def test_a_thread_in_another_call_is_not_creating(fifo):
    _, processes = fifo
    processes.append(blocked(["sleep", "60"], in_open=False))
    assert creating_open(processes[-1].pid) is False


def test_a_thread_that_is_not_there_is_not_known():
    assert creating_open(0) is None  # (a request the kernel makes itself has no caller)
    with open("/proc/sys/kernel/pid_max") as pid_max:
        beyond = int(pid_max.read()) + 1
    assert creating_open(beyond) is None
