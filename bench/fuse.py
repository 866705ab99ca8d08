"""The FUSE mount of a live machine beside the VFS API and beside bare FUSE.

Three ways to write and read the same 64 MiB to the chip disk (``/chip``, striped over
the other 1471 tiles of an mk2 chip), in 1 MiB requests, and to create empty files:

* ``mount``  - the machine mounted with ``ipuos._mount.MountManager`` (the daemon's own
  code; this process plays the daemon), driven by a *separate* process through the
  kernel: ``os.write``/``os.readv`` of 1 MiB from a page-aligned buffer,
  ``open(O_CREAT|O_EXCL)`` + ``close`` of empty files, ``os.stat`` of a file.
* ``api``    - the baseline: the same requests through ``machine.fs``, the host file
  client, from a host thread of this process: ``fs.open``, 1 MiB ``fs.write``/``fs.read``,
  ``fs.close``. Every FUSE callback makes exactly these requests, so mount/api is what
  the kernel, libfuse, mfusepy and the thread hand-offs cost (target >= 0.5).
* ``bare``   - the ceiling: ``bare_fuse.BareFS``, an in-memory mfusepy filesystem with the
  same options (direct_io, attribute/entry/negative timeouts 0), mounted in this process
  and measured the same way from a separate process (target >= 0.3).

For information, ``tile`` writes and reads the same bytes from a program's seat: on tile
0's greenlet through its own VFS (no host hop at all); and the supersteps and requests each
MiB costs. Creates go into a fresh directory per round: littlefs finds names by scanning
the directory, so creates/s fall with the directory's size (with the VFS API too).

Run: ``.venv/bin/python bench/fuse.py [--quick] [--cpus 0]``. Creates are measured on
``/chip`` and on tile 1's own disk (target >= 2,000/s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _common import parser  # noqa: E402
from bare_fuse import BareFS, mounted  # noqa: E402

import ipuos  # noqa: E402
from ipuos._mount import MountManager  # noqa: E402

MiB = 1 << 20

_CHILD = r"""
import json, mmap, os, sys, time
mode, directory, size, block, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
path = os.path.join(directory, "seq.bin")
buf = mmap.mmap(-1, max(block, 4096))  # page-aligned: the kernel passes it through in one request
best = float("inf")
if mode == "write":
    buf[:] = os.urandom(block)
    for _ in range(repeat):
        if os.path.exists(path):
            os.unlink(path)  # rewriting in place would need room for both copies (copy-on-write)
        started = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        for _ in range(size // block):
            assert os.write(fd, buf) == block
        os.close(fd)
        best = min(best, time.perf_counter() - started)
    result = size // block * block / best / 1e6
elif mode == "read":
    for _ in range(repeat):
        started = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        got = 0
        while True:
            n = os.readv(fd, [buf])
            got += n
            if n < block:
                break
        os.close(fd)
        best = min(best, time.perf_counter() - started)
    assert got == size // block * block, got
    os.unlink(path)
    result = got / best / 1e6
elif mode == "create":
    files = size
    for round_ in range(repeat):
        sub = os.path.join(directory, f"creates{round_}")
        os.mkdir(sub)
        names = [os.path.join(sub, f"f{i:06d}") for i in range(files)]
        started = time.perf_counter()
        for name in names:
            os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        best = min(best, time.perf_counter() - started)
        for name in names:
            os.unlink(name)
        os.rmdir(sub)
    result = files / best
else:  # stat: one existing file, looked up from the directory it is in
    open(path, "wb").close()
    os.chdir(directory)
    count = size
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(count):
            os.stat("seq.bin")
        best = min(best, time.perf_counter() - started)
    os.chdir("/")
    os.unlink(path)
    result = count / best
print(json.dumps(result))
"""


def child(mode: str, directory: str, size: int, block: int, repeat: int) -> float:
    """One measurement in a child process: a process must never use files on a mount it
    serves itself, and a real user's process is a different one anyway."""
    done = subprocess.run([sys.executable, "-c", _CHILD, mode, directory, str(size), str(block), str(repeat)],
                          capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"measuring {mode} in {directory} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def through_mount(directory: str, size: int, block: int, files: int, stats: int, repeat: int,
                  counters=None) -> dict:
    """write/read MB/s, creates/s and stats/s through a mounted directory; with
    ``counters()`` -> (supersteps, requests), also what each MiB cost the machine."""
    figures = {}
    for mode, args in (("write", (size, block)), ("read", (size, block)), ("create", (files, 0)),
                       ("stat", (stats, 0))):
        before = counters() if counters else None
        figures[mode] = child(mode, directory, *args, repeat)
        if counters and mode in ("write", "read"):
            steps, requests = (after - first for after, first in zip(counters(), before))
            mib = repeat * (size // block * block) / MiB
            figures[f"{mode}_steps_per_MiB"] = steps / mib
            figures[f"{mode}_requests_per_MiB"] = requests / mib
    return figures


def api_figures(machine, size: int, block: int, files: int, repeat: int) -> dict:
    """The same requests as the mount makes, from a host thread through ``machine.fs``."""
    fs = machine.fs
    payload = os.urandom(block)
    count = size // block
    path = "/chip/api_seq.bin"
    sched = machine.scheduler

    def write() -> float:
        if fs.exists(0, path):
            fs.remove(0, path)
        started = time.perf_counter()
        handle = fs.open_handle(0, path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        for index in range(count):
            fs.pwrite(0, handle, index * block, payload)
        fs.call(0, "fs.flush", handle)
        fs.close_handle(0, handle)
        return time.perf_counter() - started

    def read() -> float:
        started = time.perf_counter()
        handle = fs.open_handle(0, path, os.O_RDONLY)
        got = 0
        while True:
            data = fs.pread(0, handle, got, block)
            got += len(data)
            if len(data) < block:
                break
        fs.close_handle(0, handle)
        if got != count * block:
            raise AssertionError(f"read {got} bytes back, wrote {count * block}")
        return time.perf_counter() - started

    steps = sched.superstep
    t_write = min(write() for _ in range(repeat))
    write_steps = (sched.superstep - steps) / repeat
    steps = sched.superstep
    t_read = min(read() for _ in range(repeat))
    read_steps = (sched.superstep - steps) / repeat
    fs.remove(0, path)

    def create() -> float:
        directory = f"/chip/api_c{time.monotonic_ns()}"
        fs.mkdir(0, directory)
        names = [f"{directory}/f{i:06d}" for i in range(files)]
        started = time.perf_counter()
        for name in names:
            fs.close_handle(0, fs.open_handle(0, name, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        elapsed = time.perf_counter() - started
        for name in names:
            fs.remove(0, name)
        fs.rmdir(0, directory)
        return elapsed

    t_create = min(create() for _ in range(repeat))
    mib = count * block / MiB
    return {"write": count * block / t_write / 1e6, "read": count * block / t_read / 1e6,
            "create": files / t_create, "write_steps_per_MiB": write_steps / mib,
            "read_steps_per_MiB": read_steps / mib}


def tile_figures(machine, size: int, block: int, repeat: int) -> dict:
    """Tile 0 writing and reading /chip through its own VFS, on its own greenlet."""
    payload = os.urandom(block)
    count = size // block

    def run(tile, vfs_of):
        vfs = vfs_of(tile)
        best_w = best_r = float("inf")
        for _ in range(repeat):
            if vfs.exists("/chip/tile_seq.bin"):
                vfs.remove("/chip/tile_seq.bin")
            started = time.perf_counter()
            with vfs.open("/chip/tile_seq.bin", "wb") as file:
                for _ in range(count):
                    file.write(payload)
            best_w = min(best_w, time.perf_counter() - started)
            started = time.perf_counter()
            with vfs.open("/chip/tile_seq.bin", "rb") as file:
                while len(file.read(block)) == block:
                    pass
            best_r = min(best_r, time.perf_counter() - started)
        vfs.remove("/chip/tile_seq.bin")
        return best_w, best_r

    machine.scheduler.services["bench.run"] = lambda tile, fn, args: fn(tile, *args)
    t_write, t_read = machine.fs.submit(0, "bench.run", run, (machine.storage.vfs,)).result()
    return {"write": count * block / t_write / 1e6, "read": count * block / t_read / 1e6}


def main() -> int:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--cpus", help="pin this process (and the measuring children) to these CPUs, e.g. 0")
    args = p.parse_args()
    size, block, files, stats, repeat = 64 * MiB, MiB, 1000, 5000, args.repeat
    if args.quick:
        size, block, files, stats, repeat = MiB, 128 << 10, 50, 100, 1
    if args.cpus:
        os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})

    machine = ipuos.Machine("mk2")
    manager = MountManager(machine, f"bench{os.getpid()}")
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="ipuos-fuse-bench.") as tmp:
        mnt, bare_mnt = os.path.join(tmp, "chip"), os.path.join(tmp, "bare")
        os.mkdir(mnt)
        os.mkdir(bare_mnt)
        try:
            chip = machine.fs.statvfs(0, "/chip")
            print(f"mk2 machine, chip disk {chip.f_blocks * chip.f_bsize / MiB:.0f} MiB "
                  f"({chip.f_bsize} B blocks); {size / MiB:g} MiB in {block >> 10} KiB requests, "
                  f"{files} creates per directory, best of {repeat}; CPUs {sorted(os.sched_getaffinity(0))} "
                  "(MB = 10^6 B)", flush=True)
            results["tile"] = tile_figures(machine, size, block, repeat)
            results["api"] = api_figures(machine, size, block, files, repeat)
            active = manager.mount(mnt)

            def counters():
                return machine.scheduler.superstep, active.operations.requests

            results["mount"] = through_mount(os.path.join(mnt, "chip"), size, block, files, stats, repeat,
                                             counters)
            # a tile's own disk is 128 KiB: creates and stats only
            results["mount tile 1"] = {
                "create": child("create", os.path.join(mnt, "tiles", "1"), min(files, 500), 0, repeat),
                "stat": child("stat", os.path.join(mnt, "tiles", "1"), stats, 0, repeat)}
        finally:
            manager.unmount_all("the benchmark is over")
            machine.close()
        # the same options as the machine's mount: direct_io, and no kernel caching
        with mounted(BareFS(), bare_mnt, fsname="bare_fuse", direct_io=True, attr_timeout=0,
                     entry_timeout=0, negative_timeout=0):
            results["bare"] = through_mount(bare_mnt, size, block, files, stats, repeat)

    for name in ("tile", "api", "mount", "bare"):
        fig = results[name]
        extra = f"  create {fig['create']:7,.0f}/s" if "create" in fig else ""
        extra += f"  stat {fig['stat']:7,.0f}/s" if "stat" in fig else ""
        print(f"  {name:6s} write {fig['write']:7,.0f} MB/s  read {fig['read']:7,.0f} MB/s{extra}")
    mount, api, bare = results["mount"], results["api"], results["bare"]
    print(f"  mount/api   write {mount['write'] / api['write']:.2f}x  read {mount['read'] / api['read']:.2f}x  "
          f"create {mount['create'] / api['create']:.2f}x   [target >= 0.50]")
    print(f"  mount/bare  write {mount['write'] / bare['write']:.2f}x  read {mount['read'] / bare['read']:.2f}x  "
          f"create {mount['create'] / bare['create']:.2f}x   [target >= 0.30]")
    print(f"  api/bare    write {api['write'] / bare['write']:.2f}x  read {api['read'] / bare['read']:.2f}x"
          "   (what the VFS itself allows)")
    print(f"  creates/s   /chip {mount['create']:,.0f}, tile 1's disk {results['mount tile 1']['create']:,.0f}"
          "   [target >= 2,000]")
    print(f"  per MiB     mount: write {mount['write_steps_per_MiB']:.1f} supersteps, "
          f"{mount['write_requests_per_MiB']:.1f} requests; read {mount['read_steps_per_MiB']:.1f} supersteps, "
          f"{mount['read_requests_per_MiB']:.1f} requests")
    print(f"              api:   write {api['write_steps_per_MiB']:.1f} supersteps; "
          f"read {api['read_steps_per_MiB']:.1f} supersteps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
