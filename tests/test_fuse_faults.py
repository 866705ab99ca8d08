"""Failures through the mount: failed tiles, a machine that does not answer, a machine that
stopped, and failures that are not OSErrors, each with the errno chosen for it (never an
accidental EINVAL).

These mounts are served by this very process (a Machine and a MountManager, as in the
daemon), so faults can be injected with ``scheduler.fail_tile``; the mount is only ever
used from child processes.
"""

from __future__ import annotations

import errno
import inspect
import time

import pytest
from fuse_harness import fuse_session, in_process_mount  # noqa: F401

import ipuos
from ipuos._sram import SRAM
from ipuos.scheduler import Scheduler
from ipuos.vfs import ChipFilesystem, HostFsClient, load_mfusepy

_ERRNO_OF = """
import errno, json, os, sys
root = sys.argv[1]
def attempt(call):
    try:
        call()
        return 0
    except OSError as exc:
        return exc.errno
"""


@pytest.fixture
def tiny(fuse_session):
    yield from in_process_mount("tiny")


def test_a_failed_tile_is_eio_and_its_neighbours_carry_on(tiny):
    tiny.child(_ERRNO_OF + """
open(root + "/tiles/3/f", "w").write("before")
open(root + "/tiles/4/f", "w").write("neighbour")
print(json.dumps(None))
""")
    tiny.machine.scheduler.fail_tile(3)
    got = tiny.child(_ERRNO_OF + """
t3, t4 = root + "/tiles/3", root + "/tiles/4"
print(json.dumps({
    "stat": attempt(lambda: os.stat(t3 + "/f")),
    "listdir": attempt(lambda: os.listdir(t3)),
    "open": attempt(lambda: open(t3 + "/f").read()),
    "create": attempt(lambda: open(t3 + "/g", "w")),
    "mkdir": attempt(lambda: os.mkdir(t3 + "/d")),
    "statvfs": attempt(lambda: os.statvfs(t3)),
    "neighbour": open(t4 + "/f").read(),
}))
""")
    assert got == {"stat": errno.EIO, "listdir": errno.EIO, "open": errno.EIO, "create": errno.EIO,
                   "mkdir": errno.EIO, "statvfs": errno.EIO, "neighbour": "neighbour"}
    tiny.machine.scheduler.fail_tile(3, failed=False)
    assert tiny.child(_ERRNO_OF + "print(json.dumps(open(root + '/tiles/3/f').read()))") == "before"


def test_a_failed_tile_under_the_chip_disk_is_eio(tiny):
    tiny.child(_ERRNO_OF + "open(root + '/chip/small', 'w').write('x'); print(json.dumps(None))")
    tiny.machine.scheduler.fail_tile(7)  # holds a stripe of /chip
    got = tiny.child(_ERRNO_OF + """
def write():
    with open(root + "/chip/big", "wb") as handle:
        handle.write(os.urandom(200 * 1024))
print(json.dumps(attempt(write)))
""")
    assert got == errno.EIO


def test_a_machine_that_does_not_answer_is_etimedout(tiny):
    operations = tiny.active.operations
    operations.timeout = 0.3  # what a stuck machine is allowed before a callback gives up
    # pure compute, no exchange point: tile 5 holds the scheduler thread, so no tile answers
    busy = tiny.machine.launch("x = 0\nfor i in range(40_000_000):\n    x += i\n", [5])
    try:
        time.sleep(0.2)
        started = time.monotonic()
        got = tiny.child(_ERRNO_OF + "print(json.dumps(attempt(lambda: os.stat(root + '/tiles/1/x'))))")
        assert got == errno.ETIMEDOUT
        assert time.monotonic() - started < 2.5
    finally:
        busy.wait(120)
    operations.timeout = 60.0
    assert tiny.child(_ERRNO_OF + "print(json.dumps(attempt(lambda: os.stat(root + '/tiles/1/x'))))") == errno.ENOENT


def test_once_the_machine_is_known_not_to_answer_later_requests_fail_at_once(tiny):
    """The kernel sends a directory's lookups one after another: stats of three names in
    one directory on a stuck machine failed after one timeout, two and three."""
    operations, client = tiny.active.operations, tiny.machine.storage.client
    operations.timeout = 1.0
    busy = tiny.machine.launch("x = 0\nwhile True:\n    x += 1\n", [5])
    try:
        time.sleep(0.2)
        started = time.monotonic()
        got = tiny.child(_ERRNO_OF + """
import threading
found = {}
def stat(name):
    found[name] = attempt(lambda: os.stat(f"{root}/tiles/1/{name}"))
threads = [threading.Thread(target=stat, args=(name,)) for name in "abc"]
for thread in threads: thread.start()
for thread in threads: thread.join()
print(json.dumps(sorted(found.values())))
""")
        assert got == [errno.ETIMEDOUT] * 3
        assert time.monotonic() - started < 2.5  # (one timeout, not three)
        with pytest.raises(TimeoutError, match="has not ended a superstep since a request waited 1 s"):
            tiny.machine.fs.stat(2, "/")  # (the host API's requests too)
    finally:
        busy.interrupt()
        busy.wait(60)
        operations.timeout = 60.0
    assert client.stalled_in is not None  # (past: the superstep ended)
    assert tiny.child(_ERRNO_OF + "print(json.dumps(attempt(lambda: os.stat(root + '/tiles/1/x'))))") == errno.ENOENT
    tiny.machine.fs.stat(2, "/")


def test_requests_from_concurrent_callers_share_supersteps(tiny):
    operations, scheduler = tiny.active.operations, tiny.machine.scheduler
    tiny.child(_ERRNO_OF + """
for tile in range(16):
    open(f"{root}/tiles/{tile}/f", "w").write("x")
print(json.dumps(None))
""")
    steps, requests = scheduler.superstep, operations.requests
    tiny.child(_ERRNO_OF + """
import threading
def stats(tile):
    for _ in range(100):
        os.stat(f"{root}/tiles/{tile}/f")
threads = [threading.Thread(target=stats, args=(tile,)) for tile in range(1, 9)]
for thread in threads: thread.start()
for thread in threads: thread.join()
print(json.dumps(None))
""")
    steps, requests = scheduler.superstep - steps, operations.requests - requests
    assert requests >= 800
    assert steps < 0.9 * requests, f"{requests} requests took {steps} supersteps"


# -- the operations object, called directly ----------------------------------------------------


def test_every_callback_answers_an_errno_of_its_choosing():
    """Each callback libfuse can reach is wrapped: whatever fails inside leaves as an OSError
    with a deliberate errno (mfusepy would turn anything else into EINVAL)."""
    mfusepy = load_mfusepy()
    fields = {name for name, *_ in mfusepy.fuse_operations._fields_}
    implemented = [name for name, member in inspect.getmembers(ChipFilesystem, inspect.isfunction)
                   if name in fields or name in ("create", "truncate", "getattr")]
    assert {"getattr", "readdir", "open", "create", "read", "write", "truncate", "unlink", "mkdir", "rmdir",
            "rename", "statfs", "utimens", "flush", "fsync", "release", "chmod", "chown", "link",
            "symlink", "mknod"} <= set(implemented)
    for name in implemented:
        assert hasattr(getattr(ChipFilesystem, name), "__wrapped__"), f"{name} maps no errors"
    # left to the kernel on purpose: it answers EOPNOTSUPP for these and stops asking
    for name in ("getxattr", "setxattr", "listxattr", "removexattr"):
        assert not hasattr(ChipFilesystem, name)


def test_failures_that_are_not_oserrors_are_eio():
    memory = SRAM(tiles=4, bytes_per_tile=64 * 1024)
    scheduler = Scheduler(memory, 4, 4096, 4096)  # no storage: no fs.* services at all
    scheduler.start()
    try:
        operations = ChipFilesystem(HostFsClient(scheduler, timeout=10), 4, chip_tile=None)
        with pytest.raises(OSError) as caught:
            operations.getattr("/tiles/1/x")  # LookupError on the tile: no such service
        assert caught.value.errno == errno.EIO
        with pytest.raises(OSError) as caught:
            operations.read("/tiles/1/x", 10, 0, 12345)
        assert caught.value.errno == errno.EBADF
        with pytest.raises(OSError) as caught:
            operations.getattr("/chip")
        assert caught.value.errno == errno.ENOENT  # this machine has no chip disk
    finally:
        scheduler.stop()
        memory.close()


def test_a_stopped_machine_is_eio():
    machine = ipuos.Machine("tiny")
    operations = ChipFilesystem(machine.fs, machine.ntiles)
    assert operations.getattr("/tiles/1")["st_nlink"] == 2
    machine.close()
    for call in (lambda: operations.getattr("/tiles/1/x"), lambda: operations.mkdir("/tiles/1/d", 0o755),
                 lambda: operations.statfs("/chip")):
        with pytest.raises(OSError) as caught:
            call()
        assert caught.value.errno == errno.EIO
