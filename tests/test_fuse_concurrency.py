"""Several host processes using one mount at once: writing, reading and renaming on the
same tile (and on the chip disk), while libfuse serves them on many threads and their
requests share supersteps; creating a file while others unlink it.

Each worker writes versions of its own files through a temporary name and renames them into
place, reads its own files back, and reads the other workers' files while they are being
replaced: a reader may find a name missing for a moment, but never a torn or mixed file
(every file carries its writer, version and a digest of itself).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
from fuse_harness import fuse_session, host_tree, mounted_machine, runtime_dir, tile_tree  # noqa: F401

WORKERS = 4

_WORKER = textwrap.dedent("""
    import hashlib, json, os, random, sys

    directory, me, workers, rounds, max_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    rng = random.Random(me)

    def body(writer, version, size):
        payload = random.Random(writer * 100003 + version).randbytes(size)
        head = f"{writer} {version} {size} ".encode() + hashlib.sha256(payload).hexdigest().encode() + b"\\n"
        return head + payload

    def check(data):
        head, _, payload = data.partition(b"\\n")
        writer, version, size, digest = head.split()
        assert len(payload) == int(size) and hashlib.sha256(payload).hexdigest().encode() == digest, "torn file"
        return int(writer), int(version)

    latest, torn, missing = {}, 0, 0
    for version in range(rounds):
        slot = version % 3
        data = body(me, version, rng.randrange(1, max_size))
        temporary = os.path.join(directory, f"w{me}.tmp")
        with open(temporary, "wb") as handle:
            handle.write(data)
        with open(temporary, "rb") as handle:
            assert handle.read() == data, "read back differs"
        final = os.path.join(directory, f"f{me}_{slot}")
        os.rename(temporary, final)
        latest[final] = version
        with open(final, "rb") as handle:
            assert check(handle.read()) == (me, version)
        other = os.path.join(directory, f"f{rng.randrange(workers)}_{rng.randrange(3)}")
        try:
            with open(other, "rb") as handle:
                check(handle.read())
        except FileNotFoundError:
            missing += 1
        os.listdir(directory)
    print(json.dumps({os.path.basename(k): v for k, v in latest.items()}))
""")


@pytest.fixture(scope="module")
def mm(runtime_dir, fuse_session):
    yield from mounted_machine("mk2")


def _run_workers(directory, rounds: int, max_size: int) -> dict:
    processes = [subprocess.Popen([sys.executable, "-c", _WORKER, str(directory), str(me), str(WORKERS),
                                   str(rounds), str(max_size)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for me in range(WORKERS)]
    latest, failures = {}, []
    for process in processes:
        out, err = process.communicate(timeout=300)
        if process.returncode:
            failures.append(err)
        else:
            latest.update(json.loads(out))
    assert not failures, "\n".join(failures)
    return latest


def _expected_version(path, version: int) -> None:
    with open(path, "rb") as handle:
        head = handle.readline().split()
    assert int(head[1]) == version


@pytest.mark.parametrize("where, rounds, max_size", [("tile", 60, 2500), ("chip", 30, 60_000)])
def test_processes_writing_reading_and_renaming_at_once(mm, where, rounds, max_size):
    directory = mm.tile(30) if where == "tile" else mm.chip / "concurrent"
    if where == "chip":
        os.mkdir(directory)
    latest = _run_workers(directory, rounds, max_size)
    assert sorted(os.listdir(directory)) == sorted(latest)  # no temporary left, nothing lost
    for name, version in latest.items():
        _expected_version(directory / name, version)
    tile, top = (30, "/") if where == "tile" else (0, "/chip/concurrent")
    assert tile_tree(mm.booted, tile, top) == host_tree(directory)


def test_many_readers_of_one_file(mm):
    data = os.urandom(300_000)
    path = mm.chip / "shared.bin"
    path.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    reader = ("import hashlib, sys\n"
              "for _ in range(3):\n"
              "    assert hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest() == sys.argv[2]\n")
    processes = [subprocess.Popen([sys.executable, "-c", reader, str(path), digest], stderr=subprocess.PIPE, text=True)
                 for _ in range(6)]
    errors = [p.communicate(timeout=120)[1] for p in processes if p.wait(timeout=120)]
    assert not errors, errors
    os.unlink(path)


_OPENER = textwrap.dedent("""
    import errno, json, sys, time
    path, seconds = sys.argv[1], float(sys.argv[2])
    opened, failed = 0, {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            open(path, "w").close()
            opened += 1
        except OSError as exc:
            name = errno.errorcode.get(exc.errno, str(exc.errno))
            failed[name] = failed.get(name, 0) + 1
    print(json.dumps([opened, failed]))
""")

_UNLINKER = textwrap.dedent("""
    import os, sys, time
    path, seconds = sys.argv[1], float(sys.argv[2])
    removed = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            pass
    print(removed)
""")


@pytest.mark.parametrize("where", ["tile", "chip"])
def test_opens_with_o_creat_racing_unlinks_never_fail(mm, where):
    """Two processes loop ``open(f, "w")`` while two others loop ``unlink(f)``: an open
    may find the file it looked up gone (libfuse hid it, or forgot its name, or the tile
    has none), and must create it, never fail with ESTALE or ENOENT (as on tmpfs)."""
    path = (mm.tile(31) if where == "tile" else mm.chip) / "contended"
    seconds = "2.5"
    processes = [subprocess.Popen([sys.executable, "-c", source, str(path), seconds], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
                 for source in (_OPENER, _OPENER, _UNLINKER, _UNLINKER)]
    results = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        results.append(json.loads(out))
    (opened1, failed1), (opened2, failed2), removed1, removed2 = results
    assert removed1 + removed2 > 50 and opened1 + opened2 > 100  # (they did race)
    assert failed1 == failed2 == {}, f"{opened1 + opened2} opens: {failed1} {failed2}"


_LOOK_AGAIN = textwrap.dedent("""
    import os, sys
    directory = os.path.dirname(sys.argv[1])
    os.listdir(directory)  # (stats the directory: libfuse asks as for a retry's walk)
    print(os.lstat(sys.argv[1]).st_size)
    os.rename(sys.argv[1], sys.argv[1])
    print("renamed")
""")


@pytest.mark.parametrize("where", ["tile", "chip", "chip dir"])
@pytest.mark.parametrize("maker", ["host", "tile program"])
def test_a_file_removed_and_made_again_is_there_for_the_next_process(mm, where, maker):
    """``rm f; echo new > f``, then another process lists the directory and stats ``f``:
    it was told "no such file" for half a second (taken for the kernel's retry of an
    open that raced the unlink), and its ``mv f f`` then hung in libfuse's path locks,
    unkillable. Made again by a tile program instead, rsync and tar skipped it."""
    top = {"tile": mm.tile(30), "chip": mm.chip, "chip dir": mm.chip / "again"}[where]
    top.mkdir(exist_ok=True)
    path = top / "again.txt"
    tile, inner = (30, "/again.txt") if where == "tile" else (0, str(path)[len(str(mm.root)):])
    for attempt in range(3):
        path.write_text("old\n")
        subprocess.run(["rm", str(path)], check=True)  # (each step its own process, as in a shell)
        if maker == "host":
            subprocess.run(["sh", "-c", f"echo newer > '{path}'"], check=True)
        else:
            mm.run(tile, f"with open({inner!r}, 'w') as f:\n    f.write('newer\\n')\n")
        try:
            looked = subprocess.run([sys.executable, "-c", _LOOK_AGAIN, str(path)], capture_output=True,
                                    text=True, timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("mv f f hung in the mount (it is released when the machine halts)")
        assert (looked.returncode, looked.stdout) == (0, "6\nrenamed\n"), (attempt, looked.stderr)
    path.unlink()


_CHURNER = textwrap.dedent("""
    import os, random, sys, time
    top, seed, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    rng = random.Random(seed)
    names = [os.path.join(top, name) for name in ("a", "b", "x", "y", "x/a", "x/b", "y/a")]
    done = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        op, path, other = rng.randrange(5), rng.choice(names), rng.choice(names)
        try:
            if op == 0:
                open(path, "w").close()
            elif op == 1:
                os.unlink(path)
            elif op == 2:
                os.rename(path, other)  # (now and then a name onto itself)
            elif op == 3:
                os.mkdir(path)
            else:
                os.rmdir(path)
        except OSError:
            pass
        done += 1
    print(done)
""")


@pytest.fixture
def tiny_mount(runtime_dir, fuse_session):
    yield from mounted_machine("tiny")


def test_names_churned_by_many_processes_never_hang_them(tiny_mount):
    """Six processes create, unlink, rename, mkdir and rmdir a few names of one tile
    directory at random. A lookup answered "no such file" for a name libfuse still had
    a node of (the mount taking it for the kernel's retry of an open that raced an
    unlink) made the kernel send a rename of that name onto itself, on which libfuse's
    path locks wait forever: within a second or two, processes hung, unkillable."""
    seconds = "4"
    processes = [subprocess.Popen([sys.executable, "-c", _CHURNER, str(tiny_mount.tile(1)), str(seed), seconds],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in range(6)]
    counts = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("a process hung in the mount (it is released when the machine halts)")
        assert process.returncode == 0, err
        counts.append(int(out))
    assert min(counts) > 200, counts  # (each churned through far more than it took to hang)
