"""The VFS API, on a running tile, through every kind of mount a tile can have.

Each test body runs on the owner tile's greenlet (as a tile program's ``open`` and ``os``
do) against one place in its VFS: the tile's own SRAM disk, the chip disk on tile 0, a
host image file mounted on a tile, and another tile's disk through ``/tiles/N`` on tile
0. The chip disk comes both as the default striped device and as a plain RAM device.
Every mount must behave the same; only where the files really are differs.
"""

from __future__ import annotations

import errno
import os
import traceback

import pytest

import ipuos
from ipuos.blockdev import FileDevice, MemoryDevice
from ipuos.vfs import mount_device

KiB = 1024


class Place:
    """Where a test's files go: ``tile``'s VFS under ``top``."""

    def __init__(self, machine, tile: int, top: str):
        self.machine = machine
        self.tile = tile
        self.top = top

    def run(self, body):
        """``body(vfs, path)`` on the tile's greenlet; ``path(name)`` is where ``name`` goes."""
        machine = self.machine

        def call(tile):
            vfs = machine.storage.vfs(tile)
            return body(vfs, lambda name="": self.top + "/" + name.lstrip("/") if name else self.top or "/")

        machine.scheduler.services["test.call"] = lambda tile, fn: fn(tile)
        return machine.fs.submit(self.tile, "test.call", call).result(30)


def tile_disk(tmp_path):
    machine = ipuos.Machine("tiny", disk_size=32 * KiB)
    return Place(machine, 6, "")


def chip_disk(tmp_path):
    def chip(tile):
        return MemoryDevice.for_region(tile.memory.alloc("chiptest", 32 * KiB), 512)

    return Place(ipuos.Machine("tiny", disk_size=16 * KiB, chip_device=chip), 0, "/chip")


def striped_chip_disk(tmp_path):
    machine = ipuos.Machine("tiny", disk_size=16 * KiB, chipdisk_share=2 * KiB)
    return Place(machine, 0, "/chip")


def host_image(tmp_path):
    machine = ipuos.Machine("tiny", disk_size=16 * KiB)
    device = FileDevice.create(tmp_path / "image", 512, 64)
    place = Place(machine, 2, "/img")
    place.run(lambda vfs, path: mount_device(vfs, "/img", device, format=True) and None)
    return place


def other_tile(tmp_path):
    machine = ipuos.Machine("tiny", disk_size=32 * KiB)
    return Place(machine, 0, "/tiles/9")


@pytest.fixture(params=[tile_disk, chip_disk, striped_chip_disk, host_image, other_tile],
                ids=["tile-disk", "chip-disk", "striped-chip-disk", "host-image", "tiles-proxy"])
def place(request, tmp_path):
    place = request.param(tmp_path)
    yield place
    place.machine.close()


def test_a_path_too_long_to_cross_the_exchange_is_enametoolong(tmp_path):
    """On the tiny preset (4 KiB exchange buffers) a path of 4,040 bytes under /tiles/N
    got the exchange's own error ("a reply of 4133 B is larger than tile 1's outgoing
    exchange buffer"), or a request that did not fit."""
    place = other_tile(tmp_path)
    long = "/".join(["d" * 99] * 40 + ["e" * 40])

    def body(vfs, path):
        errors = []
        for use in (lambda: vfs.open(path(long)), lambda: vfs.stat(path(long)), lambda: vfs.listdir(path(long)),
                    lambda: vfs.rename(path(long), path("x"))):
            with pytest.raises(OSError) as excinfo:
                use()
            errors.append((excinfo.value.errno, excinfo.value.filename == path(long), str(excinfo.value)))
        return errors

    try:
        for number, named, message in place.run(body):
            assert (number, named) == (errno.ENAMETOOLONG, True), message
            assert "File name too long (a request to another tile carries paths of up to" in message
    finally:
        place.machine.close()


def test_text_files(place):
    def body(vfs, path):
        with vfs.open(path("t.txt"), "w") as f:
            f.write("ünïcode\n")
            print("second", 2, file=f)
        with vfs.open(path("t.txt"), "a", newline="\r\n") as f:
            f.write("third\n")
        with vfs.open(path("t.txt")) as f:
            lines = list(f)
        with vfs.open(path("t.txt"), "rb") as f:
            raw = f.read()
        return lines, raw

    lines, raw = place.run(body)
    assert lines == ["ünïcode\n", "second 2\n", "third\n"]
    assert raw == "ünïcode\nsecond 2\nthird\r\n".encode()


@pytest.mark.parametrize("mode", ["b", ""], ids=["binary", "text"])
def test_writes_land_where_the_position_says_after_empty_writes_and_appends(place, mode):
    """(Found on /tiles/N, whose client buffers writes: an empty write left the next
    write going to where it was; truncate() in append mode cut at the position from
    before the appends.)"""
    def body(vfs, path):
        data = (lambda text: text.encode()) if mode else (lambda text: text)
        with vfs.open(path("e"), "w" + mode) as f:
            f.write(data("abc"))
            f.flush()
            f.write(data(""))
            f.seek(0)
            f.write(data("Z"))
        for name in ("r", "a"):
            with vfs.open(path(name), "w" + mode) as f:
                f.write(data("0123456789"))
        with vfs.open(path("r"), "r+" + mode) as f:
            f.write(data(""))
            f.read(5)
            f.write(data("Z"))
        with vfs.open(path("a"), "a" + mode) as f:
            f.seek(2)
            f.write(data("XY"))
            cut = f.truncate()
        return [vfs.open(path(name), "rb").read() for name in ("e", "r", "a")], cut

    contents, cut = place.run(body)
    # (in text mode a read reads ahead, and the write after it goes to the end: as
    # CPython's own text files do)
    assert contents == [b"Zbc", b"01234Z6789" if mode else b"0123456789Z", b"0123456789XY"]
    assert cut == 12


def test_a_closed_file_is_named_as_it_was_opened(place):
    def body(vfs, path):
        f = vfs.open(path("c"), "wb")
        f.close()
        messages = []
        for use in (f.read, lambda: f.write(b"x"), f.tell, lambda: f.seek(0), f.truncate):
            with pytest.raises(ValueError) as excinfo:
                use()
            # (as a traceback shows it: with the error it was raised from, if any)
            messages.append("".join(traceback.format_exception(excinfo.value)))
        return path("c"), messages

    name, messages = place.run(body)
    for message in messages:
        assert message.count("closed file") == 1 and message.endswith(f"closed file {name!r}\n"), message


def test_binary_random_access(place):
    def body(vfs, path):
        data = bytes(range(256)) * 20
        with vfs.open(path("b"), "w+b") as f:
            f.write(data)
            f.seek(1000)
            middle = f.read(300)
            f.seek(-4, os.SEEK_END)
            tail = f.read()
            f.truncate(2000)
            size = f.seek(0, os.SEEK_END)
        with vfs.open(path("b"), "r+b") as f:
            f.seek(10)
            f.write(b"XYZ")
        with vfs.open(path("b"), "rb") as f:
            head = f.read(16)
            line = f.readline()
        return middle == data[1000:1300], tail == data[-4:], size, head, len(line)

    matches_middle, matches_tail, size, head, line = place.run(body)
    assert matches_middle and matches_tail and size == 2000
    assert head == bytes(range(10)) + b"XYZ" + bytes([13, 14, 15])
    assert line == 256 - 16 + 10 + 1  # up to and including the b"\n" (byte 10) of the next run


def test_names(place):
    def body(vfs, path):
        vfs.makedirs(path("a/b/c"))
        vfs.makedirs(path("a/b"), exist_ok=True)
        with vfs.open(path("a/b/file"), "w") as f:
            f.write("12345")
        vfs.rename(path("a/b/file"), path("a/moved"))
        vfs.replace(path("a/moved"), path("a/b/c/final"))
        prefix = len(path("a")) - len("/a")
        walked = [(top[prefix:], dirs, files) for top, dirs, files in vfs.walk(path("a"))]
        st = vfs.stat(path("a/b/c/final"))
        entries = sorted((e.name, e.is_dir()) for e in vfs.scandir(path("a/b")))
        vfs.remove(path("a/b/c/final"))
        for directory in ("a/b/c", "a/b", "a"):
            vfs.rmdir(path(directory))
        return walked, st.st_size, st.st_mtime_ns > 0, entries, vfs.exists(path("a"))

    walked, size, has_mtime, entries, exists = place.run(body)
    assert walked == [("/a", ["b"], []), ("/a/b", ["c"], []), ("/a/b/c", [], ["final"])]
    assert size == 5 and has_mtime and entries == [("c", True)] and not exists


def test_errno(place):
    def body(vfs, path):
        with vfs.open(path("file"), "w"):
            pass
        vfs.mkdir(path("dir"))
        with vfs.open(path("dir/x"), "w"):
            pass
        results = []
        for call in (
            lambda: vfs.open(path("missing")),
            lambda: vfs.mkdir(path("dir")),
            lambda: vfs.open(path("file/x"), "w"),
            lambda: vfs.open(path("dir")),
            lambda: vfs.remove(path("dir")),
            lambda: vfs.rmdir(path("dir")),
            lambda: vfs.rmdir(path("file")),
            lambda: vfs.open(path("n" * 300), "w"),
            lambda: vfs.open(path("file"), "x"),
            lambda: vfs.stat(path("file/")),
        ):
            try:
                call()
            except OSError as exc:
                results.append((errno.errorcode[exc.errno], exc.filename.startswith(path("x")[:-1])))
        return results

    assert place.run(body) == [("ENOENT", True), ("EEXIST", True), ("ENOTDIR", True),
                               ("EISDIR", True), ("EISDIR", True), ("ENOTEMPTY", True),
                               ("ENOTDIR", True), ("ENAMETOOLONG", True), ("EEXIST", True),
                               ("ENOTDIR", True)]


def test_mtime_and_utime(place):
    def body(vfs, path):
        with vfs.open(path("m"), "w") as f:
            f.write("x")
        written = vfs.stat(path("m")).st_mtime_ns
        vfs.utime(path("m"), ns=(0, 1_234_567_890_000_000_000))
        return written, vfs.stat(path("m")).st_mtime_ns, vfs.getmtime(path("m"))

    written, set_to, seconds = place.run(body)
    assert written > 1_600_000_000 * 10**9
    assert set_to == 1_234_567_890_000_000_000 and seconds == pytest.approx(1_234_567_890)


def test_enospc_leaves_earlier_files_and_space_comes_back(place):
    def body(vfs, path):
        with vfs.open(path("keep"), "wb") as f:
            f.write(b"k" * 600)
        written = []
        failure = None
        for n in range(200):
            try:
                with vfs.open(path(f"fill{n}"), "wb") as f:
                    f.write(bytes(512))
            except OSError as exc:
                failure = errno.errorcode[exc.errno]
                break
            written.append(path(f"fill{n}"))
        intact = all(vfs.open(p, "rb").read() == bytes(512) for p in written)
        kept = vfs.open(path("keep"), "rb").read() == b"k" * 600
        for p in written[:6]:
            vfs.remove(p)
        with vfs.open(path("after"), "wb") as f:
            f.write(bytes(1024))
        return failure, intact, kept, vfs.getsize(path("after"))

    assert place.run(body) == ("ENOSPC", True, True, 1024)


def test_deep_paths_and_long_names(place):
    def body(vfs, path):
        deep = "/".join(f"d{n}" for n in range(12))
        vfs.makedirs(path(deep))
        with vfs.open(path(deep + "/leaf"), "w") as f:
            f.write("deep")
        name_max = vfs.statvfs(path()).f_namemax
        with vfs.open(path("l" * name_max), "w"):
            pass
        try:
            vfs.open(path("l" * (name_max + 1)), "w")
        except OSError as exc:
            too_long = errno.errorcode[exc.errno]
        return vfs.open(path(deep + "/leaf")).read(), name_max, too_long

    assert place.run(body) == ("deep", 255, "ENAMETOOLONG")


def test_statvfs(place):
    def body(vfs, path):
        before = vfs.statvfs(path())
        with vfs.open(path("big"), "wb") as f:
            f.write(bytes(4 * before.f_bsize))
        during = vfs.statvfs(path())
        return before.f_bsize, before.f_blocks, before.f_bfree - during.f_bfree

    block_size, blocks, used = place.run(body)
    assert block_size == 512 and blocks in (32, 60, 64) and used >= 4


OPEN_MODES = ("r", "w", "a", "x", "r+", "w+", "a+", "x+", "rt", "wt", "rb", "wb", "ab", "xb", "r+b",
              "w+b", "a+b", "x+b")


def test_a_file_and_its_buffer_report_the_modes_the_hosts_do(place, tmp_path):
    # a text file's buffer is binary: "w" writes through a "wb" file, as on the host
    def modes(opener, remove):
        seen = {}
        for mode in OPEN_MODES:
            if mode.startswith("x"):
                remove()
            with opener(mode) as f:
                seen[mode] = (f.mode, getattr(f, "buffer", f).mode)
        return seen

    host_file = tmp_path / "modes"
    host_file.write_bytes(b"")
    expected = modes(lambda mode: open(host_file, mode), host_file.unlink)

    def body(vfs, path):
        vfs.open(path("modes"), "w").close()
        return modes(lambda mode: vfs.open(path("modes"), mode), lambda: vfs.remove(path("modes")))

    assert place.run(body) == expected
    # and through the host's client of the tile (what the shell and the daemon use)
    name = place.top + "/modes"
    fs = place.machine.fs
    assert modes(lambda mode: fs.open(place.tile, name, mode), lambda: fs.remove(place.tile, name)) == expected


def test_rename_with_a_trailing_slash_or_onto_the_other_kind_fails_as_on_the_host(place, tmp_path):
    # a trailing slash asks for a directory: a file moved to "d/" is ENOTDIR on Linux,
    # whatever is there (littlefs said EISDIR, or ENOTEMPTY for the directory it is in)
    cases = [("file", "d/"), ("file", "d"), ("d", "file"), ("file", "missing/"), ("file/", "x"),
             ("file/", "d/"), ("d", "file/"), ("d/sub/f", "d/sub/"), ("d/sub/f", "d/"),
             ("missing", "d/"), ("d", "empty/"), ("empty/", "new/"), ("file", "new")]

    def make(fs, opener, top):
        for name in ("d", "d/sub", "empty"):
            fs.mkdir(f"{top}/{name}")
        for name in ("file", "d/sub/f"):
            opener(f"{top}/{name}", "w").close()

    def outcome(fs, top, src, dst):
        try:
            fs.rename(f"{top}/{src}", f"{top}/{dst}")
        except OSError as exc:
            return errno.errorcode[exc.errno]
        return "moved"

    def tree(fs, top):
        return sorted(os.path.relpath(os.path.join(where, name), top)
                      for where, dirs, files in fs.walk(top) for name in dirs + files)

    expected = []
    for number, (src, dst) in enumerate(cases):
        top = str(tmp_path / str(number))
        os.mkdir(top)
        make(os, open, top)
        expected.append((src, dst, outcome(os, top, src, dst), tree(os, top)))

    def body(vfs, path):
        seen = []
        for src, dst in cases:
            top = path("case")
            vfs.mkdir(top)
            make(vfs, vfs.open, top)
            seen.append((src, dst, outcome(vfs, top, src, dst), tree(vfs, top)))
            for where, dirs, files in vfs.walk(top, topdown=False):  # room for the next case
                for name in files:
                    vfs.remove(f"{where}/{name}")
                vfs.rmdir(where)
        return seen

    assert place.run(body) == expected


def test_opening_a_directory_fails_as_on_the_host(place, tmp_path):
    # creating exclusively a directory that is there is EEXIST, the root and mount points
    # included; through a trailing slash EISDIR; any other writing mode EISDIR
    suffixes = ("", "/", "//", "/.", "/..", "/d", "/d/", "/d/.", "/d/..")
    modes = ("r", "rb", "w", "wb", "a", "r+", "w+", "a+", "x", "x+", "xb")

    def outcomes(opener, where):
        seen = {}
        for suffix in suffixes:
            for mode in modes:
                try:
                    opener(where(suffix), mode).close()
                except OSError as exc:
                    seen[suffix, mode] = errno.errorcode[exc.errno]
                else:
                    seen[suffix, mode] = "opened"
        return seen

    (tmp_path / "d").mkdir()
    # the tile disk's place is its root: compared with the host's own (d is made beside)
    host_top = str(tmp_path) if place.top else ""
    expected = outcomes(open, lambda suffix: (str(tmp_path) if suffix.startswith("/d") else host_top) + suffix
                        or "/")

    def body(vfs, path):
        vfs.mkdir(path("d"))
        return outcomes(vfs.open, lambda suffix: place.top + suffix or "/")

    assert place.run(body) == expected


def test_creating_through_a_trailing_slash_fails_as_on_the_host(place, tmp_path):
    # a trailing slash asks for a directory: in a directory that is EISDIR, but a file
    # earlier in the path is ENOTDIR and a missing directory ENOENT, as the walk finds them
    names = ("f/", "f/x/", "f/x/y/", "f/x", "d/x/", "d/", "missing/x/", "d/missing/x/")
    modes = ("r", "r+", "w", "w+", "a", "x")

    def outcomes(fs, opener, top):
        seen = {}
        for name in names:
            for mode in modes:
                try:
                    opener(f"{top}/{name}", mode).close()
                except OSError as exc:
                    seen[name, mode] = errno.errorcode[exc.errno]
                else:
                    seen[name, mode] = "opened"
        return seen

    def make(fs, opener, top):
        fs.mkdir(f"{top}/d")
        opener(f"{top}/f", "w").close()

    _as_on_the_host(place, tmp_path, make, outcomes)


def test_rename_looks_at_both_parents_before_a_last_dot(place, tmp_path):
    # Linux resolves the source's parent, then the destination's, and only then refuses
    # a last name "." or ".." (EBUSY)
    cases = [("missing/x", "d/."), ("f/x", "d/."), ("missing/x", "f/y/.."), ("f/x/y", "missing/a/.."),
             ("d/.", "missing/x"), ("d/..", "f/x"), ("f", "d/."), ("d/.", "e"), ("f", "d/.."),
             ("missing/x", "missing/y"), ("f/x", "missing/y"), ("missing/x", "f/y"), ("d/e/..", "g")]

    def outcomes(fs, opener, top):
        seen = []
        for src, dst in cases:
            try:
                fs.rename(f"{top}/{src}", f"{top}/{dst}")
            except OSError as exc:
                seen.append((src, dst, errno.errorcode[exc.errno]))
            else:
                seen.append((src, dst, "moved"))
        return seen

    def make(fs, opener, top):
        fs.mkdir(f"{top}/d")
        fs.mkdir(f"{top}/d/e")
        opener(f"{top}/f", "w").close()

    _as_on_the_host(place, tmp_path, make, outcomes)


def _as_on_the_host(place, tmp_path, make, outcomes) -> None:
    """``outcomes(fs, open, top)`` after ``make(fs, open, top)`` are the same on ``place``
    as with the host's os and open in ``tmp_path``."""
    make(os, open, str(tmp_path))
    expected = outcomes(os, open, str(tmp_path))

    def body(vfs, path):
        make(vfs, vfs.open, place.top)
        return outcomes(vfs, vfs.open, place.top)

    assert place.run(body) == expected


def test_tiles_view_hides_what_a_tile_mounts_or_unmounts_after_it_looked():
    # /tiles/N is tile N's own disk: what tile N mounts later must vanish from it, and
    # what it unmounts come back, though tile 0 learnt its mount points before
    machine = ipuos.Machine("tiny", disk_size=32 * KiB)
    tile0, tile5 = Place(machine, 0, "/tiles/5"), Place(machine, 5, "")

    def on_disk(vfs, path):
        vfs.mkdir("/m")
        with vfs.open("/m/disk.txt", "w") as f:
            f.write("disk")

    def mount_ram(vfs, path):
        device = MemoryDevice.new(512, 16)
        mount_device(vfs, "/m", device, format=True)
        with vfs.open("/m/ram.txt", "w") as f:
            f.write("ram")

    def look(vfs, path):  # (listing the tile's top last: it used to refresh what is hidden)
        seen = {}
        for name in ("m/disk.txt", "m/ram.txt"):
            try:
                with vfs.open(path(name)) as f:
                    seen[name] = f.read()
            except OSError as exc:
                seen[name] = errno.errorcode[exc.errno]
        try:
            with vfs.open(path("m/new.txt"), "w") as f:
                f.write("new")
            seen["new"] = "written"
        except OSError as exc:
            seen["new"] = errno.errorcode[exc.errno]
        seen["listing"] = sorted(vfs.listdir(path()))
        return seen

    try:
        tile5.run(on_disk)
        assert tile0.run(look) == {"listing": ["m"], "m/disk.txt": "disk", "m/ram.txt": "ENOENT",
                                   "new": "written"}
        tile5.run(mount_ram)
        assert tile0.run(look) == {"listing": [], "m/disk.txt": "ENOENT", "m/ram.txt": "ENOENT",
                                   "new": "ENOENT"}
        assert tile5.run(lambda vfs, path: sorted(vfs.listdir("/m"))) == ["ram.txt"]
        tile5.run(lambda vfs, path: vfs.umount("/m"))
        assert tile0.run(look) == {"listing": ["m"], "m/disk.txt": "disk", "m/ram.txt": "ENOENT",
                                   "new": "written"}
    finally:
        machine.close()
