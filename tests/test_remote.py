"""Reaching a tile's files from elsewhere: the fs.* services, the host and tile clients,
and tile 0's /tiles mount. The owner always does the work, at an exchange point.
"""

from __future__ import annotations

import errno
import os
import threading
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import ipuos
from ipuos.vfs import SERVICE_NAMES, TileFsClient

KiB = 1024


@pytest.fixture(scope="module")
def machine():
    with ipuos.Machine("tiny") as m:
        yield m


def on_tile(machine, tile: int, function):
    """Run ``function(tile_object)`` on the tile's own greenlet; return its result."""
    machine.scheduler.services["test.call"] = lambda tile_obj, fn: fn(tile_obj)
    return machine.fs.submit(tile, "test.call", function).result(10)


def pattern(size: int, seed: int = 0) -> bytes:
    return bytes((i * 31 + seed * 17 + (i >> 8)) & 0xFF for i in range(size))


def test_every_service_is_registered(machine):
    assert set(SERVICE_NAMES) <= set(machine.scheduler.services)
    assert {"fs.stat", "fs.listdir", "fs.open", "fs.read", "fs.write", "fs.truncate", "fs.close",
            "fs.fsync", "fs.mkdir", "fs.rmdir", "fs.unlink", "fs.rename", "fs.statvfs",
            "fs.utime", "fs.snapshot", "fs.restore"} <= set(SERVICE_NAMES)


def test_raw_services(machine):
    submit = machine.fs.call
    submit(1, "fs.mkdir", "/raw")
    handle = submit(1, "fs.open", "/raw/f", os.O_RDWR | os.O_CREAT)
    assert submit(1, "fs.write", handle, None, b"hello") == 5
    assert submit(1, "fs.write", handle, 10, b"world") == 15
    assert submit(1, "fs.read", handle, 0, 100) == b"hello" + bytes(5) + b"world"
    assert submit(1, "fs.seek", handle, 0, os.SEEK_END) == 15
    submit(1, "fs.ftruncate", handle, 5)
    submit(1, "fs.fsync", handle)
    submit(1, "fs.close", handle)
    name, is_dir, size, mtime = submit(1, "fs.stat", "/raw/f")
    assert (name, is_dir, size) == ("f", False, 5) and mtime > 0
    assert submit(1, "fs.listdir", "raw") == [("f", False, 5, mtime)]  # relative: from /
    submit(1, "fs.utime", "/raw/f", 123)
    assert submit(1, "fs.stat", "/raw/f")[3] == 123
    submit(1, "fs.rename", "/raw/f", "/raw/g")
    submit(1, "fs.truncate", "/raw/g", 2)
    assert machine.fs.read_file(1, "/raw/g") == b"he"
    submit(1, "fs.unlink", "/raw/g")
    submit(1, "fs.rmdir", "/raw")
    assert os.statvfs_result(submit(1, "fs.statvfs", "/")).f_bsize == 512
    with pytest.raises(OSError) as excinfo:
        submit(1, "fs.read", 999, 0, 1)
    assert excinfo.value.errno == errno.EBADF


def test_rename_without_replacing_is_checked_on_the_owner(machine):
    """One request (FUSE's RENAME_NOREPLACE): nothing on the tile can come between the
    check and the rename."""
    machine.fs.write_file(6, "/keep", b"kept")
    machine.fs.write_file(6, "/move", b"moved")
    with pytest.raises(FileExistsError):
        machine.fs.call(6, "fs.rename", "/move", "/keep", True)
    assert machine.fs.read_file(6, "/keep") == b"kept"
    machine.fs.call(6, "fs.rename", "/move", "/new", True)
    machine.fs.call(6, "fs.rename", "/new", "/keep")  # replacing, as before
    assert machine.fs.read_file(6, "/keep") == b"moved"
    machine.fs.remove(6, "/keep")


def test_host_client_errors_carry_errno_and_names(machine):
    fs = machine.fs
    fs.write_file(2, "/file", b"x")
    cases = [
        (lambda: fs.stat(2, "/missing"), errno.ENOENT),
        (lambda: fs.mkdir(2, "/file"), errno.EEXIST),
        (lambda: fs.listdir(2, "/file"), errno.ENOTDIR),
        (lambda: fs.open(2, "/", "wb"), errno.EISDIR),
        (lambda: fs.rmdir(2, "/"), errno.EBUSY),
        (lambda: fs.open(2, "/" + "n" * 300, "wb"), errno.ENAMETOOLONG),
    ]
    for call, expected in cases:
        with pytest.raises(OSError) as excinfo:
            call()
        assert excinfo.value.errno == expected and excinfo.value.filename


def test_host_files_read_write_seek_append(machine):
    fs = machine.fs
    with fs.open(3, "/h", "w+b") as f:
        f.write(pattern(3000))
        assert f.tell() == 3000
        f.seek(100)
        assert f.read(50) == pattern(3000)[100:150]
        assert f.seek(-10, os.SEEK_END) == 2990 and f.read() == pattern(3000)[2990:]
        assert f.size() == 3000
    with fs.open(3, "/h", "ab") as f:
        f.write(b"tail")
        assert f.tell() == 3004
    with fs.open(3, "/h", "r", encoding="latin-1") as text:
        assert len(text.read()) == 3004
    assert fs.read_file(3, "/h")[-4:] == b"tail"

def test_host_requests_are_chunked(machine, monkeypatch):
    fs = machine.fs
    monkeypatch.setattr(fs, "chunk", 1000)
    big = pattern(8 * KiB)
    before = machine.scheduler.superstep
    fs.write_file(3, "/big", big)
    assert fs.read_file(3, "/big") == big
    assert machine.scheduler.superstep - before >= 2 * 8
    handle = fs.open_handle(3, "/big", "rb")
    assert fs.pread(3, handle, 1000, 2500) == big[1000:3500]
    fs.close_handle(3, handle)
    fs.remove(3, "/big")


def test_many_host_threads_at_once(machine):
    fs = machine.fs

    def worker(n):
        tile = n % machine.ntiles
        path = f"/thread{n}"
        for round_ in range(10):
            data = pattern(200 + round_, n)
            fs.write_file(tile, path, data)
            assert fs.read_file(tile, path) == data
            assert fs.stat(tile, path).st_size == len(data)
        fs.remove(tile, path)
        return n

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert sorted(pool.map(worker, range(32))) == list(range(32))


def test_many_requests_ride_one_superstep(machine):
    fs = machine.fs
    for tile in range(machine.ntiles):
        fs.statvfs(tile)  # bring every tile's storage up first
    before = machine.scheduler.superstep
    futures = fs.submit_all("fs.statvfs", range(machine.ntiles), "/")
    futures.update({100 + t: fs.submit(t, "fs.listdir", "/") for t in range(machine.ntiles)})
    for future in futures.values():
        future.result(10)
    assert machine.scheduler.superstep - before <= 2


def test_requests_are_served_while_a_program_runs(machine):
    machine.scheduler.services["test.probe"] = lambda tile: (tile.job is not None, tile.rank)
    handle = machine.launch("""
import os
while not os.path.exists("/stop"):
    sync()
""", tiles="12-13")
    assert machine.fs.submit(13, "test.probe").result(10) == (True, 1)
    for tile in (12, 13):
        machine.fs.write_file(tile, "/stop", b"")
    assert handle.wait(30).ok


def test_a_busy_tile_answers_at_its_next_exchange_point(machine):
    handle = machine.launch("""
import os
while not os.path.exists("/go"):
    sync()
total = 0
for i in range(3_000_000):   # pure compute: no exchange point for a while
    total += i
open("/phase", "w").write("computed")
while not os.path.exists("/stop"):
    sync()
""", tiles="14")
    machine.fs.write_file(14, "/go", b"")
    # the tile computes now; this request waits for its next exchange point, after which
    # the file exists (served any earlier, it would be ENOENT)
    assert machine.fs.read_file(14, "/phase") == b"computed"
    machine.fs.write_file(14, "/stop", b"")
    assert handle.wait(30).ok


def test_a_request_given_up_before_it_started_never_happens(machine):
    from ipuos.vfs import HostFsClient

    impatient = HostFsClient(machine.scheduler, timeout=0.2)
    handle = machine.launch("""
total = 0
for i in range(40_000_000):   # no exchange point for seconds: requests wait
    total += i
""", tiles="13")
    deadline = time.monotonic() + 10
    while not (machine.scheduler.in_compute and handle.job.live) and time.monotonic() < deadline:
        time.sleep(0.01)
    for attempt in (lambda: impatient.mkdir(12, "/late"),
                    lambda: impatient.open(12, "/late.txt", "wb")):
        with pytest.raises(TimeoutError):
            attempt()
    assert handle.wait(60).ok
    # what timed out was cancelled, not left to happen later behind the caller's back
    assert machine.fs.listdir(12, "/") == [n for n in machine.fs.listdir(12, "/") if not n.startswith("late")]
    assert machine.fs.mounts(12)[0][4] == 0


def test_an_open_that_answers_too_late_is_closed(machine):
    from concurrent.futures import Future

    from ipuos.vfs import HostFsClient
    from ipuos.vfs._client import await_reply

    client = HostFsClient(machine.scheduler)
    started = Future()
    assert started.set_running_or_notify_cancel()  # the tile serves it already: too late to cancel
    with pytest.raises(TimeoutError):
        await_reply(client, 11, "fs.open", started, 0.01)
    handle = client.call(11, "fs.open", "/slow", os.O_WRONLY | os.O_CREAT)
    assert machine.fs.mounts(11)[0][4] == 1
    started.set_result(handle)  # the answer arrives after its caller gave up
    deadline = time.monotonic() + 5
    while machine.fs.mounts(11)[0][4] and time.monotonic() < deadline:
        time.sleep(0.001)
    assert machine.fs.mounts(11)[0][4] == 0


def test_tile_to_tile_client_chunks_through_small_exchange_buffers(machine):
    data = pattern(8 * KiB, 5)  # the tiny preset's buffers carry ~3.5 KiB per request

    def from_tile_2(tile):
        client = TileFsClient(tile)
        assert client.chunk < 4 * KiB
        client.write_file(7, "/from2", data)
        back = client.read_file(7, "/from2")
        with client.open(7, "/from2", "rb") as f:
            f.seek(10_000)
            middle = f.read(5000)
        return back == data, middle == data[10_000:15_000], client.listdir(7, "/")

    before = machine.scheduler.superstep
    assert on_tile(machine, 2, from_tile_2) == (True, True, ["from2"])
    assert machine.scheduler.superstep - before >= 2 * 3  # it rode the exchange
    assert machine.fs.read_file(7, "/from2") == data


def test_a_directory_too_big_for_one_reply_is_listed_in_pages():
    names = sorted(f"entry-number-{i:03d}" for i in range(60))
    with ipuos.Machine("tiny", exchange_out=1024) as small:  # a reply carries < 1 KiB
        small.fs.mkdir(9, "/big")
        for name in names:
            small.fs.write_file(9, f"/big/{name}", b"")

        def from_tile_0(tile):
            vfs = small.storage.vfs(tile)
            client = TileFsClient(tile)
            assert len(names) * len(names[0]) > client.chunk  # more than one reply holds
            return sorted(vfs.listdir("/tiles/9/big")), sorted(e.name for e in client.entries(9, "/big"))

        assert on_tile(small, 0, from_tile_0) == (names, names)


def test_tiles_mount_on_tile_0(machine):
    machine.fs.write_file(4, "/four", b"4")
    machine.fs.mkdir(5, "/dir5")

    def look(tile):
        vfs = machine.storage.vfs(tile)
        results = {
            "tiles": vfs.listdir("/tiles"),
            "four": vfs.open("/tiles/4/four").read(),
            "entry": tuple(vfs.entries("/tiles/5"))[0][:2],
            "stat": vfs.stat("/tiles/4/four").st_size,
            "isdir": vfs.isdir("/tiles/5/dir5"),
        }
        vfs.rename("/tiles/4/four", "/tiles/4/quatre")
        with vfs.open("/tiles/5/dir5/out.txt", "w") as f:
            f.writelines(f"{n}\n" for n in range(1000))
        errors = {}
        for label, call in {
            "across tiles": lambda: vfs.rename("/tiles/4/quatre", "/tiles/5/quatre"),
            "no tile 99": lambda: vfs.stat("/tiles/99"),
            "not canonical": lambda: vfs.stat("/tiles/04"),
            "not a tile": lambda: vfs.listdir("/tiles/x"),
            "tile root": lambda: vfs.rmdir("/tiles/5"),
            "mkdir tile": lambda: vfs.mkdir("/tiles/5"),
            "open dir": lambda: vfs.open("/tiles", "w"),
            "remote enoent": lambda: vfs.open("/tiles/5/missing"),
            "remote notempty": lambda: vfs.rmdir("/tiles/5/dir5"),
            "to local": lambda: vfs.rename("/tiles/5/dir5/out.txt", "/out.txt"),
        }.items():
            try:
                call()
            except OSError as exc:
                errors[label] = (errno.errorcode[exc.errno], exc.filename)
        return results, errors

    results, errors = on_tile(machine, 0, look)
    assert results == {"tiles": [str(t) for t in range(16)], "four": "4", "entry": ("dir5", True),
                       "stat": 1, "isdir": True}
    assert errors == {
        "across tiles": ("EXDEV", "/tiles/4/quatre"),
        "no tile 99": ("ENOENT", "/tiles/99"),
        "not canonical": ("ENOENT", "/tiles/04"),
        "not a tile": ("ENOENT", "/tiles/x"),
        "tile root": ("EBUSY", "/tiles/5"),
        "mkdir tile": ("EEXIST", "/tiles/5"),
        "open dir": ("EISDIR", "/tiles"),
        "remote enoent": ("ENOENT", "/tiles/5/missing"),
        "remote notempty": ("ENOTEMPTY", "/tiles/5/dir5"),
        "to local": ("EXDEV", "/tiles/5/dir5/out.txt"),
    }
    assert machine.fs.listdir(4, "/") == ["quatre"]
    assert machine.fs.read_file(5, "/dir5/out.txt") == "".join(f"{n}\n" for n in range(1000)).encode()


def test_the_handle_table_is_bounded(machine, monkeypatch):
    from ipuos.vfs import _services

    monkeypatch.setattr(_services, "MAX_HANDLES", 3)
    handles = [machine.fs.open_handle(15, f"/h{n}", "wb") for n in range(3)]
    with pytest.raises(OSError) as excinfo:
        machine.fs.open_handle(15, "/h3", "wb")
    assert excinfo.value.errno == errno.EMFILE
    for handle in handles:
        machine.fs.close_handle(15, handle)
    with pytest.raises(OSError) as excinfo:
        machine.fs.close_handle(15, handles[0])
    assert excinfo.value.errno == errno.EBADF
    assert [m[4] for m in machine.fs.mounts(15)] == [0]


def test_a_dropped_host_file_is_still_closed(machine):
    f = machine.fs.open(9, "/dropped", "wb")
    f.write(b"sent")
    del f
    deadline = time.monotonic() + 5
    while machine.fs.mounts(9)[0][4] and time.monotonic() < deadline:
        time.sleep(0.001)
    assert machine.fs.mounts(9)[0][4] == 0
    assert machine.fs.read_file(9, "/dropped") == b"sent"


def test_a_host_thread_per_tile_of_a_running_program(machine):
    handle = machine.launch("""
import os
n = 0
while not os.path.exists("/stop"):
    open(f"/mine{n % 3}", "w").write(str(n))
    n += 1
    sync()
""", tiles="10-12")
    errors = []

    def poke(tile):
        try:
            for _ in range(20):
                for entry in machine.fs.entries(tile, "/"):
                    if entry.name.startswith("mine"):
                        int(machine.fs.read_file(tile, "/" + entry.name))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=poke, args=(t,)) for t in (10, 11, 12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for tile in (10, 11, 12):
        machine.fs.write_file(tile, "/stop", b"")
    assert handle.wait(30).ok and errors == []


def test_a_remote_write_refused_for_space_keeps_what_earlier_writes_were_told(machine):
    # tile 0 writes tile 13's file in pieces smaller than what it buffers: when sending
    # them finds the disk full, the write that sent is refused, and the ones before it,
    # which returned their counts, are still buffered: written once there is room again
    result = machine.run(textwrap.dedent("""
        import os
        with open("/tiles/13/filler", "wb") as g:
            g.write(b"F" * 6000)
        f = open("/tiles/13/data", "wb")
        expected = bytearray()
        refused = None
        for i in range(100):
            chunk = bytes([65 + i % 26]) * 1000
            try:
                f.write(chunk)
            except OSError as exc:
                refused = (i, exc.errno, f.tell() == len(expected))
                os.remove("/tiles/13/filler")
                f.write(chunk)
                expected += chunk
                break
            expected += chunk
        f.close()
        print(refused[1:], refused[0] > 1, os.path.getsize("/tiles/13/data") == len(expected),
              open("/tiles/13/data", "rb").read() == bytes(expected))
        os.remove("/tiles/13/data")
    """), tiles="0", timeout=60)
    assert result.ok, result.format()
    assert result.tiles[0].output == f"({errno.ENOSPC}, True) True True True\n"


def test_a_remote_file_that_fails_at_close_says_so(machine):
    result = machine.run(textwrap.dedent("""
        import os
        f = open("/tiles/12/big", "wb")
        try:
            for i in range(100):
                f.write(bytes(1000))
        except OSError as exc:
            print("write", exc.errno)
        try:
            f.close()
        except OSError as exc:
            print("close", exc.errno)
        print(f.closed)
        os.remove("/tiles/12/big")
    """), tiles="0", timeout=60)
    assert result.ok, result.format()
    assert result.tiles[0].output == f"write {errno.ENOSPC}\nclose {errno.ENOSPC}\nTrue\n"


def test_a_remote_file_dropped_unclosed_is_written_by_the_next_exchange_point(machine):
    # CPython closes a dropped file at once: on a tile, a file on another tile's disk is
    # closed, its buffered writes sent, before the program's next sync, collective or
    # send, so the tile that owns it sees them after that exchange point
    result = machine.run(textwrap.dedent("""
        if __tileid == 0:
            open("/tiles/3/in.txt", "w").write("input for tile 3")
            f = open("/tiles/3/in2.txt", "w"); f.write("second"); del f
        sync()
        if __tileid == 1:
            print(open("/in.txt").read(), open("/in2.txt").read())
        if __tileid == 0:
            open("/tiles/3/in.txt", "w").write("by a collective")
        x = allreduce(1)
        if __tileid == 1:
            print(open("/in.txt").read())
        if __tileid == 0:
            open("/tiles/3/in.txt", "w").write("before a message")
            send(1, "look")
        if __tileid == 1:
            recv(0)
            print(open("/in.txt").read())
    """), tiles="0,3", timeout=60)
    assert result.ok, result.format()
    assert result.tiles[1].output == "input for tile 3 second\nby a collective\nbefore a message\n"


def test_a_remote_file_freed_after_its_program_leaves_no_hook_behind(machine):
    # in a reference cycle, a dropped file is freed by the cycle collector, here on a host
    # thread after the block: nothing may stay registered for a tile's next exchange point
    # (every sync of the machine would look at it), and the tile's next file operation
    # closes the file, as any dropped one
    import gc

    repl = machine.repl("0")
    try:
        assert repl.run(textwrap.dedent("""
            class Holder:
                pass
            h = Holder()
            h.me = h
            h.f = open("/tiles/3/cycle.txt", "w")
            h.f.write("kept")
            del h
        """)).ok
        gc.collect()
        assert machine.scheduler.left_for_exchange == {}
        assert machine.fs.exists(0, "/")  # tile 0's next file operation: dropped files close
        assert machine.fs.read_file(3, "/cycle.txt") == b"kept"
    finally:
        repl.close()
        machine.fs.remove(3, "/cycle.txt")


@pytest.mark.parametrize("collective", ["allgather(f'part{__tileid}' * 50)", "alltoall(f'part{__tileid}' * 50)",
                                        "gather(f'part{__tileid}' * 50, 0)", "bcast(f'part{__tileid}' * 50, 1)"])
def test_a_tile_serving_files_keeps_its_part_of_a_collective_it_waits_in(machine, collective):
    # tiles 1 and 2 arrive at the collective first, then serve tile 0's file requests
    # while they wait in it: the replies must not overwrite their parts, which stay in
    # their outgoing buffers until tile 0 arrives too
    result = machine.run(textwrap.dedent(f"""
        import os
        if __tileid == 0:
            for n in range(5):
                open("/tiles/1/d.txt", "w").write("F" * 1500)
                os.path.exists("/tiles/2/missing")
        got = {collective}
        if __tileid == 0:
            print(got if type(got) is str else [p[:6] for p in got])
    """), tiles="0-2", timeout=60)
    assert result.ok, result.format()
    expected = {"bcast": "part1" * 50, "gather": ['part0p', 'part1p', 'part2p']}.get(
        collective.partition("(")[0], ['part0p', 'part1p', 'part2p'])
    assert result.tiles[0].output == f"{expected}\n"


def test_a_reply_that_does_not_fit_beside_a_waiting_part_still_goes_out(machine):
    # tile 1's part of the allgather nearly fills its outgoing buffer while tile 0 reads
    # a file from it: the reply must not wait for the collective (which waits for tile 0)
    result = machine.run(textwrap.dedent("""
        if __tileid == 0:
            open("/tiles/1/d.txt", "w").write("D" * 4000)
        sync()
        if __tileid == 0:
            data = open("/tiles/1/d.txt").read()
        got = allgather(str(__tileid) * 3500)
        print([(g[0], len(g)) for g in got], len(data) if __tileid == 0 else "")
    """), tiles="0-1", timeout=30)
    assert result.ok, result.format()
    assert result.tiles[0].output == "[('0', 3500), ('1', 3500)] 4000\n"


def test_a_reply_short_of_room_overwrites_no_message_sent_before_it(machine):
    # tile 1 sends a message, then waits in the allgather and serves tile 0's open: the
    # reply has no room beside the held part and the message, and must not take theirs
    machine.fs.write_file(1, "/a.txt", b"A" * 10)
    result = machine.run(textwrap.dedent("""
        if __tileid == 1:
            recv(0)
            send(0, b'U' * 2000)
            got = allgather('1' * 2040)
        else:
            send(1, b'go')
            f = open("/tiles/1/a.txt")
            u = recv(1)
            print(u == b'U' * 2000, f.read())
            got = allgather('x')
        print([g[:1] for g in got])
    """), tiles="0-1", timeout=30)
    assert result.ok, result.format()
    assert result.tiles[0].output == "True AAAAAAAAAA\n['x', '1']\n"


def test_a_tile_that_leaves_a_collective_by_an_exception_gets_its_room_back(machine):
    # its part (most of its outgoing buffer) was held for the collective; once it has
    # left it, what it sends in that same superstep must fit
    handle = machine.launch(textwrap.dedent("""
        if __tileid == 1:
            send(0, 'go')
            try:
                got = allgather('1' * 3400)
            except KeyboardInterrupt:
                print("left")
            send(0, b'x' * 1000)
        else:
            recv(1)  # (by the time it comes, tile 1 waits in the allgather)
            try:
                while True:
                    x = 1
            except KeyboardInterrupt:
                pass
            print(len(recv(1)))
    """), tiles="0-1")
    time.sleep(1.0)  # (tile 1 waits in the allgather, tile 0 computes)
    handle.interrupt(ctrl_c=True)
    result = handle.wait(30)
    assert result.ok, result.format()
    assert [t.output for t in result.tiles] == ["1000\n", "left\n"]


def test_a_paged_listing_is_the_directory_as_it_was_at_its_first_page(machine):
    """Pages came from listing the directory again: a name made or removed before the
    cursor shifted the rest, and one nobody touched was skipped or given twice."""
    call = machine.fs.call
    call(5, "fs.mkdir", "/paged")
    names = [f"k{i:02d}" for i in range(12)]
    for name in names:
        call(5, "fs.close", call(5, "fs.open", f"/paged/{name}", os.O_WRONLY | os.O_CREAT))

    def listed_while(change, *args):
        listed, cursor = call(5, "fs.listdir_page", "/paged", 0, 200)
        assert cursor is not None and 0 < len(listed) < 12
        call(5, change, *args)
        while cursor is not None:
            page, cursor = call(5, "fs.listdir_page", "/paged", cursor, 200)
            listed += page
        return [entry[0] for entry in listed]

    assert listed_while("fs.unlink", "/paged/k00") == names  # the rest moved up one: k04 was skipped
    names.remove("k00")
    assert listed_while("fs.mkdir", "/paged/a0") == names  # down one: k03 was given twice
    # a tile keeps a few listings; a reader whose listing it let go of starts again
    stale = call(5, "fs.listdir_page", "/paged", 0, 200)[1]
    for _ in range(20):
        call(5, "fs.listdir_page", "/paged", 0, 200)
    assert call(5, "fs.listdir_page", "/paged", stale, 200) == (None, None)
    # a cursor is for its own directory only
    cursor = call(5, "fs.listdir_page", "/paged", 0, 200)[1]
    assert call(5, "fs.listdir_page", "/", cursor, 200) == (None, None)
    client = TileFsClient.__new__(TileFsClient)  # (only its paging: calls go through the host)
    client.call, client.listing_page = call, 200
    assert [entry.name for entry in client.entries(5, "/paged")] == ["a0"] + names
