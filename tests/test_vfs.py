"""The VFS itself: paths, the mount table, Python's open semantics, errno, mtimes.

These run a :class:`Vfs` with a host owner over real littlefs filesystems on RAM devices,
without a machine: what is checked here is the VFS's own logic. The same behaviour on
running tiles, through every kind of mount, is in ``test_vfs_mounts.py``.
"""

from __future__ import annotations

import errno
import gc
import io
import os
import stat
import time

import pytest

from ipuos.blockdev import FaultPlan, MemoryDevice
from ipuos.vfs import Backend, EmptyBackend, Vfs, mount_device
from ipuos.vfs._paths import normalize

BLOCK = 512


def make_vfs(blocks: int = 64) -> Vfs:
    vfs = Vfs()
    mount_device(vfs, "/", MemoryDevice.new(BLOCK, blocks), format=True)
    return vfs


@pytest.fixture
def vfs():
    return make_vfs()


def errno_of(excinfo) -> int:
    return excinfo.value.errno


# -- paths ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path, cwd, expected", [
    ("/", "/", ("/", False)),
    ("/a/b", "/", ("/a/b", False)),
    ("a/b", "/", ("/a/b", False)),
    ("b", "/a", ("/a/b", False)),
    ("./b/./c", "/a", ("/a/b/c", False)),
    ("//a///b//", "/", ("/a/b", True)),
    ("..", "/a/b", ("/a", True)),  # a final . or .. names a directory, as a trailing /
    ("../../../..", "/a/b", ("/", True)),
    ("f/.", "/", ("/f", True)),
    (".", "/a", ("/a", True)),
    ("/../x", "/", ("/x", False)),
    ("/a/../../b/", "/", ("/b", True)),
    (".hidden/..x", "/d", ("/d/.hidden/..x", False)),
    ("/", "/a", ("/", False)),
])
def test_normalize(path, cwd, expected):
    assert normalize(path, cwd) == expected


def test_relative_paths_follow_the_cwd(vfs):
    vfs.makedirs("/a/b")
    vfs.chdir("/a")
    assert vfs.getcwd() == "/a"
    with vfs.open("b/f", "w") as f:
        f.write("x")
    vfs.chdir("b")
    assert vfs.getcwd() == "/a/b"
    assert vfs.listdir() == ["f"] and vfs.listdir(".") == ["f"]
    assert vfs.abspath("../c") == "/a/c"
    vfs.chdir("../../..")  # never above /
    assert vfs.getcwd() == "/"
    with pytest.raises(NotADirectoryError):
        vfs.chdir("/a/b/f")
    with pytest.raises(FileNotFoundError):
        vfs.chdir("/nowhere")
    assert vfs.getcwd() == "/"


def test_dot_dot_climbs_out_of_a_real_directory(vfs):
    # as the kernel walks a path: "file/.." and "missing/.." are errors, not the parent
    vfs.makedirs("/rd/sub")
    with vfs.open("/rd/f.txt", "w"):
        pass
    vfs.chdir("/rd")
    with pytest.raises(NotADirectoryError) as info:
        vfs.stat("f.txt/..")
    assert info.value.filename == "f.txt/.."
    with pytest.raises(FileNotFoundError):
        vfs.stat("missing/../f.txt")
    with pytest.raises(NotADirectoryError):
        vfs.open("/rd/f.txt/../f.txt")
    assert vfs.listdir("sub/../sub") == [] and vfs.isdir("../rd") and vfs.isdir("../..")
    vfs.rmdir("sub")
    with pytest.raises(FileNotFoundError):  # what it climbed out of is gone now
        vfs.stat("sub/..")


def test_opening_through_a_final_dot_fails_as_on_the_host(vfs, tmp_path):
    # "d/." looks inside d, unlike "d/": what is wrong is said of d (the host is the model)
    def outcome(opener, path):
        try:
            opener(path).close()
        except OSError as exc:
            return exc.errno
        return "opened"

    (tmp_path / "file").write_bytes(b"")
    (tmp_path / "d").mkdir()
    vfs.open("/file", "w").close()
    vfs.mkdir("/d")
    for path in ("new/.", "file/.", "d/.", "d/new/.", "new/", "file/", "d/", "new/..", "d/..", "d", "."):
        for mode in ("w", "x", "a", "r+", "r"):
            host = outcome(lambda p: open(os.path.join(tmp_path, p), mode), path)  # (pathlib drops ".")
            assert outcome(lambda p: vfs.open("/" + p, mode), path) == host, (path, mode)
    flags = os.O_WRONLY | os.O_CREAT
    assert outcome(lambda p: vfs.open_raw("/" + p, flags), "new/.") == errno.ENOENT
    assert outcome(lambda p: vfs.open_raw("/" + p, flags), "file/.") == errno.ENOTDIR
    assert sorted(vfs.listdir("/")) == ["d", "file"]  # nothing was created


@pytest.mark.parametrize("operation", ["mkdir", "rmdir", "makedirs", "makedirs exist_ok", "create"])
def test_a_final_dot_or_dot_dot_names_what_is_there_as_on_the_host(vfs, tmp_path, operation):
    # "new/." is no directory to make: the host says new is missing (mkdir made it);
    # os.makedirs makes new, and mkdir -p "new/.." too (it made nothing)
    def outcome(fs, join, path):
        call = {"mkdir": fs.mkdir, "rmdir": fs.rmdir, "makedirs": fs.makedirs,
                "makedirs exist_ok": lambda p: fs.makedirs(p, exist_ok=True),
                "create": lambda p: (open if fs is os else fs.open)(p, "x").close()}[operation]
        try:
            call(join(path))
        except OSError as exc:
            return exc.errno
        return "done"

    def tree(fs, top):
        return sorted(os.path.relpath(os.path.join(where, name), top)
                      for where, dirs, files in fs.walk(top) for name in dirs + files)

    for path in ("new/.", "new/..", "new/./", "new/sub/.", "d/.", "d/..", "d/./", "d/new/.", "d/new/..",
                 "file/.", "file/..", "d/../new/.", "new/../d/."):
        host = tmp_path / f"{len(list(tmp_path.iterdir()))}"
        host.mkdir()
        (host / "d").mkdir()
        (host / "file").write_bytes(b"")
        vfs = make_vfs()
        vfs.mkdir("/d")
        vfs.open("/file", "w").close()
        expected = outcome(os, lambda p: os.path.join(host, p), path)
        assert (outcome(vfs, lambda p: "/" + p, path), tree(vfs, "/")) == (expected, tree(os, host)), path


def test_rmdir_of_dot_or_dot_dot_is_refused(vfs):
    vfs.makedirs("/rd/sub")
    vfs.chdir("/rd")
    for path, number in ((".", errno.EINVAL), ("sub/.", errno.EINVAL), ("sub/./", errno.EINVAL),
                         ("..", errno.ENOTEMPTY), ("sub/..", errno.ENOTEMPTY)):
        with pytest.raises(OSError) as info:
            vfs.rmdir(path)
        assert errno_of(info) == number, path
    assert vfs.isdir("/rd/sub")


def test_bad_paths(vfs):
    with pytest.raises(FileNotFoundError):
        vfs.stat("")
    with pytest.raises(ValueError):
        vfs.open("a\0b", "w")
    with pytest.raises(TypeError):
        vfs.stat(b"/bytes")
    with pytest.raises(TypeError):
        vfs.open(3)
    assert not vfs.exists("a\0b") and not vfs.exists("")
    # a name the host's decoder escaped (surrogateescape) is not UTF-8 text: EINVAL, as
    # through the mount, not a UnicodeEncodeError from the filesystem's binding
    vfs.open("/f", "w").close()
    for call in (lambda: vfs.open("\udcff", "w"), lambda: vfs.mkdir("/d\udcff"), lambda: vfs.stat("\udcff"),
                 lambda: vfs.rename("/f", "/\udcff"), lambda: vfs.listdir("/\udcff")):
        with pytest.raises(OSError) as info:
            call()
        assert info.value.errno == errno.EINVAL and "UTF-8" in info.value.strerror
    assert not vfs.exists("\udcff") and vfs.listdir("/") == ["f"]


def test_pathlike_paths(vfs, tmp_path):
    class Named:
        def __fspath__(self):
            return "/named"

    with vfs.open(Named(), "w") as f:
        f.write("x")
    assert vfs.isfile(Named()) and vfs.stat(Named()).st_size == 1
    entry = next(iter(vfs.scandir("/")))
    assert os.fspath(entry) == "/named"


# -- the mount table --------------------------------------------------------------------------


def test_longest_prefix_wins_by_whole_names(vfs):
    mount_device(vfs, "/chip", MemoryDevice.new(BLOCK, 32), format=True)
    mount_device(vfs, "/chip/inner", MemoryDevice.new(BLOCK, 32), format=True)
    for path in ("/f", "/chipper", "/chip/f", "/chip/inner/f", "/chip/innerx"):
        with vfs.open(path, "w") as f:
            f.write(path)
    assert sorted(vfs.backend("/").fs.listdir("/")) == ["chipper", "f"]
    assert sorted(vfs.backend("/chip").fs.listdir("/")) == ["f", "innerx"]
    assert vfs.backend("/chip/inner").fs.listdir("/") == ["f"]
    # mount points show up in their parent's listing, without a directory underneath
    assert sorted(vfs.listdir("/")) == ["chip", "chipper", "f"]
    assert sorted(vfs.listdir("/chip")) == ["f", "inner", "innerx"]
    assert vfs.isdir("/chip/inner") and vfs.ismount("/chip/inner") and not vfs.ismount("/chipper")
    assert vfs.stat("/chip").st_dev != vfs.stat("/").st_dev
    assert {e.name: e.is_dir() for e in vfs.scandir("/")}["chip"] is True


def test_a_mount_point_is_listed_with_its_filesystems_root(vfs):
    """As ``stat`` shows it (and Linux lists it): a new filesystem's root has the time it
    was made, and a mount point over a directory hides that directory's attributes."""
    vfs.mkdir("/over")
    vfs.utime("/over", ns=(0, 5))
    mount_device(vfs, "/over", MemoryDevice.new(BLOCK, 32), format=True)
    mount_device(vfs, "/new", MemoryDevice.new(BLOCK, 32), format=True)
    vfs.utime("/new", ns=(0, 77))  # the mounted root's time
    listed = {e.name: e.stat().st_mtime_ns for e in vfs.scandir("/")}
    assert listed == {"over": vfs.stat("/over").st_mtime_ns, "new": 77}
    assert listed["over"] not in (0, 5)  # its root's: stamped when it was formatted
    assert [e.name for e in vfs.entries("/")] == ["over", "new"]  # (once each)


def test_a_mount_point_whose_root_fails_is_still_listed(vfs):
    device = MemoryDevice.new(BLOCK, 32)
    mount_device(vfs, "/m", device, format=True)
    vfs.sync()
    device.attach_faults(FaultPlan(stop_after=0))  # answers nothing from now on
    assert [(e.name, e.is_dir()) for e in vfs.scandir("/")] == [("m", True)]
    with pytest.raises(OSError) as excinfo:
        vfs.stat("/m")
    assert errno_of(excinfo) == errno.EIO


def test_mount_errors(vfs):
    mount_device(vfs, "/m", MemoryDevice.new(BLOCK, 32), format=True)
    with pytest.raises(OSError) as excinfo:
        mount_device(vfs, "/m", MemoryDevice.new(BLOCK, 32), format=True)
    assert errno_of(excinfo) == errno.EBUSY
    with vfs.open("/file", "w"):
        pass
    with pytest.raises(NotADirectoryError):
        vfs.mount("/file", EmptyBackend())
    with pytest.raises(OSError) as excinfo:
        vfs.umount("/nothing")
    assert errno_of(excinfo) == errno.EINVAL
    with pytest.raises(OSError) as excinfo:
        vfs.umount("/")
    assert errno_of(excinfo) == errno.EBUSY


def test_mount_points_cannot_be_removed_or_moved(vfs):
    vfs.mkdir("/d")
    mount_device(vfs, "/d/m", MemoryDevice.new(BLOCK, 32), format=True)
    cases = [
        (lambda: vfs.rmdir("/d/m"), errno.EBUSY),
        (lambda: vfs.rmdir("/d"), errno.EBUSY),  # a mount below
        (lambda: vfs.rename("/d", "/e"), errno.EBUSY),
        (lambda: vfs.rename("/d/m", "/d/n"), errno.EBUSY),
        (lambda: vfs.remove("/d/m"), errno.EISDIR),
        (lambda: vfs.mkdir("/d/m"), errno.EEXIST),
        (lambda: vfs.rmdir("/"), errno.EBUSY),
    ]
    for call, expected in cases:
        with pytest.raises(OSError) as excinfo:
            call()
        assert errno_of(excinfo) == expected, excinfo.value


def test_umount_refuses_while_busy_then_detaches(vfs):
    backend = mount_device(vfs, "/m", MemoryDevice.new(BLOCK, 32), format=True)
    mount_device(vfs, "/m/sub", MemoryDevice.new(BLOCK, 32), format=True)
    with pytest.raises(OSError) as excinfo:
        vfs.umount("/m")
    assert errno_of(excinfo) == errno.EBUSY  # something is mounted below
    vfs.umount("/m/sub")
    f = vfs.open("/m/f", "w")
    with pytest.raises(OSError) as excinfo:
        vfs.umount("/m")
    assert errno_of(excinfo) == errno.EBUSY  # a file is open
    assert excinfo.value.strerror == "1 file is open on it"
    g = vfs.open("/m/g", "w")
    with pytest.raises(OSError) as excinfo:
        vfs.umount("/m")
    assert excinfo.value.strerror == "2 files are open on it"
    f.close()
    vfs.remove("/m/g")  # removed while open: still open, as on a host
    with pytest.raises(OSError) as excinfo:
        vfs.umount("/m")
    assert excinfo.value.strerror == "1 file is open on it (1 removed while open)"
    g.close()
    vfs.umount("/m")
    assert not backend.fs.mounted  # the mount owned it
    assert vfs.listdir("/") == []
    assert [m.path for m in vfs.mount_points()] == ["/"]


def test_exdev_between_mounts(vfs):
    mount_device(vfs, "/other", MemoryDevice.new(BLOCK, 32), format=True)
    with vfs.open("/f", "w"):
        pass
    with pytest.raises(OSError) as excinfo:
        vfs.rename("/f", "/other/f")
    assert errno_of(excinfo) == errno.EXDEV
    assert (excinfo.value.filename, excinfo.value.filename2) == ("/f", "/other/f")
    with vfs.open("/other/g", "w"):
        pass
    with pytest.raises(OSError) as excinfo:
        vfs.replace("/other/g", "/g")
    assert errno_of(excinfo) == errno.EXDEV


def test_read_only_mount(vfs):
    device = MemoryDevice.new(BLOCK, 32)
    writer = Vfs()
    mount_device(writer, "/", device, format=True)
    writer.mkdir("/d")
    with writer.open("/d/f", "w") as f:
        f.write("kept")
    writer.backend("/").detach()  # unmount littlefs so another owner may mount it
    mount_device(vfs, "/ro", device, readonly=True)
    assert vfs.open("/ro/d/f").read() == "kept"
    assert vfs.statvfs("/ro").f_flag & os.ST_RDONLY
    cases = [
        lambda: vfs.open("/ro/d/f", "w"),
        lambda: vfs.open("/ro/d/f", "r+"),
        lambda: vfs.open("/ro/new", "x"),
        lambda: vfs.open("/ro/d/f", "a"),
        lambda: vfs.open_raw("/ro/d/f", os.O_RDONLY | os.O_CREAT),
        lambda: vfs.mkdir("/ro/e"),
        lambda: vfs.remove("/ro/d/f"),
        lambda: vfs.rename("/ro/d/f", "/ro/d/g"),
        lambda: vfs.truncate("/ro/d/f", 0),
        lambda: vfs.utime("/ro/d/f"),
    ]
    for call in cases:
        with pytest.raises(OSError) as excinfo:
            call()
        assert errno_of(excinfo) == errno.EROFS
    # what does not exist is ENOENT first, what exists EEXIST, as on Linux
    with pytest.raises(FileNotFoundError):
        vfs.remove("/ro/missing")
    with pytest.raises(FileExistsError):
        vfs.mkdir("/ro/d")
    vfs.makedirs("/ro/d", exist_ok=True)
    assert vfs.open("/ro/d/f").read() == "kept"


def test_a_read_only_mount_refuses_an_open_as_a_writable_one_fails_or_with_erofs():
    # as on Linux: what would fail on a writable mount fails the same way (EISDIR, EEXIST,
    # ENOENT, ENOTDIR), and only what would write is EROFS
    def mounted(readonly: bool) -> Vfs:
        device = MemoryDevice.new(BLOCK, 32)
        writer = Vfs()
        mount_device(writer, "/", device, format=True)
        writer.mkdir("/d")
        writer.open("/f", "w").close()
        writer.backend("/").detach()
        vfs = make_vfs()
        vfs.mkdir("/m")
        mount_device(vfs, "/m", device, readonly=readonly)
        return vfs

    def outcome(vfs, path, mode):
        try:
            vfs.open(path, mode).close()
        except OSError as exc:
            return errno.errorcode[exc.errno]
        return "opened"

    for name in ("", "/", "/.", "/..", "/d", "/d/", "/d/.", "/f", "/f/", "/f/.", "/new", "/new/", "/new/.",
                 "/new/x", "/f/x", "/f/x/", "/f/x/y/", "/new/x/"):
        for mode in ("r", "r+", "w", "w+", "a", "a+", "x", "x+"):
            writable = outcome(mounted(False), "/m" + name, mode)
            expected = "EROFS" if writable == "opened" and mode != "r" else writable
            assert outcome(mounted(True), "/m" + name, mode) == expected, (name, mode)


def test_empty_backend_is_an_empty_read_only_root():
    vfs = Vfs()
    vfs.mount("/", EmptyBackend(), readonly=True)
    assert vfs.listdir("/") == [] and vfs.isdir("/")
    with pytest.raises(FileNotFoundError):
        vfs.open("/f")
    with pytest.raises(OSError) as excinfo:
        vfs.open("/f", "w")
    assert errno_of(excinfo) == errno.EROFS
    mount_device(vfs, "/chip", MemoryDevice.new(BLOCK, 32), format=True)
    assert vfs.listdir("/") == ["chip"]


def test_no_root_mounted():
    vfs = Vfs()
    with pytest.raises(FileNotFoundError):
        vfs.stat("/")


# -- files: Python's open semantics ------------------------------------------------------------


def test_text_and_binary(vfs):
    with vfs.open("/t", "w") as f:
        assert isinstance(f, io.TextIOBase) and f.mode == "w" and f.name == "/t"
        f.write("héllo\nwörld\n")
        print("third", file=f)
    with vfs.open("/t", "rb") as f:
        assert isinstance(f, io.RawIOBase) and f.mode == "rb"
        assert f.read() == "héllo\nwörld\nthird\n".encode()
    with vfs.open("/t") as f:
        assert f.readline() == "héllo\n"
        assert list(f) == ["wörld\n", "third\n"]
    with vfs.open("/t", "rb") as f:
        assert f.readline() == "héllo\n".encode()
        assert f.readline(3) == b"w\xc3\xb6"
        assert f.readlines() == [b"rld\n", b"third\n"]
        assert f.readline() == b""
    with vfs.open("/latin", "w", encoding="latin-1") as f:
        f.write("é")
    assert vfs.open("/latin", "rb").read() == b"\xe9"
    with pytest.raises(UnicodeDecodeError):
        vfs.open("/latin").read()
    assert vfs.open("/latin", errors="replace").read() == "\ufffd"


def test_newline_handling(vfs):
    with vfs.open("/n", "w", newline="\r\n") as f:
        f.write("a\nb\n")
    assert vfs.open("/n", "rb").read() == b"a\r\nb\r\n"
    assert vfs.open("/n").read() == "a\nb\n"  # universal newlines
    assert vfs.open("/n", newline="").read() == "a\r\nb\r\n"


def test_modes(vfs):
    with pytest.raises(FileNotFoundError):
        vfs.open("/f")
    with vfs.open("/f", "x") as f:
        f.write("one")
    with pytest.raises(FileExistsError):
        vfs.open("/f", "x")
    with vfs.open("/f", "a") as f:
        f.write(" two")
    with vfs.open("/f", "r+") as f:
        f.write("ONE")
        assert f.read() == " two"
    with vfs.open("/f") as f:
        assert f.read() == "ONE two"
    with vfs.open("/f", "w+") as f:
        assert f.read() == ""
        f.write("new")
        f.seek(0)
        assert f.read() == "new"
    with vfs.open("/f", "a+b") as f:
        assert f.tell() == 3 and f.read() == b""  # like the host's open: at the end
        f.write(b"!")
        f.seek(0)
        assert f.read() == b"new!"
    with vfs.open("/f", "a") as f:
        assert f.tell() == 4
    for bad in ("rw", "rr", "", "q", "rbt", "r++"):
        with pytest.raises(ValueError):
            vfs.open("/f", bad)
    with pytest.raises(ValueError):
        vfs.open("/f", "rb", encoding="utf-8")
    with pytest.raises(ValueError):
        vfs.open("/f", "r", buffering=0)
    for bad in ("x", 1.5, None, [1]):  # as the host's open: no int, no file
        for mode in ("r", "rb", "w"):
            with pytest.raises(TypeError, match="cannot be interpreted as an integer"):
                vfs.open("/f", mode, buffering=bad)
    with vfs.open("/f", "rb") as f:
        assert f.read() == b"new!"  # ("w" refused before it truncated)
    with pytest.raises(LookupError):
        vfs.open("/f", "r", encoding="no-such-codec")
    assert vfs.backend("/").open_files == 0  # the failed opens left nothing open


def test_seek_tell_truncate(vfs):
    with vfs.open("/f", "w+b") as f:
        f.write(b"0123456789")
        assert f.tell() == 10
        assert f.seek(2) == 2 and f.read(3) == b"234"
        assert f.seek(-2, os.SEEK_END) == 8 and f.read() == b"89"
        assert f.seek(-5, os.SEEK_CUR) == 5
        assert f.truncate(7) == 7 and f.tell() == 5
        assert f.truncate() == 5
        f.seek(0)
        assert f.read() == b"01234"
        buffer = bytearray(3)
        f.seek(1)
        assert f.readinto(buffer) == 3 and buffer == b"123"
        with pytest.raises(TypeError, match="read-write"):
            f.readinto(b"xxx")  # as the host's: refused before anything is read
        assert f.tell() == 4
    vfs.truncate("/f", 2)
    assert vfs.getsize("/f") == 2
    vfs.truncate("/f", 4)
    assert vfs.open("/f", "rb").read() == b"01\0\0"
    with pytest.raises(OSError) as excinfo:
        vfs.truncate("/f", -1)
    assert errno_of(excinfo) == errno.EINVAL
    with pytest.raises(IsADirectoryError):
        vfs.truncate("/", 0)


def test_closed_and_wrong_direction(vfs):
    f = vfs.open("/f", "wb")
    assert f.writable() and not f.readable() and f.seekable()
    with pytest.raises(OSError) as excinfo:
        f.read()
    assert errno_of(excinfo) == errno.EBADF and excinfo.value.filename == "/f"
    f.close()
    f.close()
    for call in (f.read, lambda: f.write(b"x"), f.tell, lambda: f.seek(0), f.flush,
                 f.readable, lambda: f.__enter__(), f.readline, lambda: f.writelines([]),
                 lambda: f.readlines(), lambda: iter(f)):
        with pytest.raises(ValueError):
            call()
    with pytest.raises(ValueError, match="closed file"):  # (as the host's: closed first)
        f.fileno()
    with vfs.open("/f", "rb") as still_open, vfs.open("/f") as text:
        for open_file in (still_open, text):
            with pytest.raises(io.UnsupportedOperation, match="no file descriptor"):
                open_file.fileno()
    with pytest.raises(TypeError):
        import pickle
        pickle.dumps(vfs.open("/f"))


def test_other_handles_see_writes_at_once_as_on_the_host(vfs):
    # (as with the host's unbuffered files: the data is in the filesystem once written)
    writer = vfs.open("/f", "w")
    writer.write("early")
    assert vfs.getsize("/f") == 5
    reader = vfs.open("/f")
    assert reader.read() == "early"
    writer.write(" and late")
    assert reader.read() == " and late" and vfs.getsize("/f") == 14
    truncator = vfs.open("/f", "w")  # truncates at open, for every handle
    assert reader.seek(0) == 0 and reader.read() == "" and vfs.getsize("/f") == 0
    writer.write("!")  # at its own position, 14: the gap reads as zeros
    assert vfs.open("/f", "rb").read() == b"\0" * 14 + b"!"
    for f in (writer, reader, truncator):
        f.close()
    assert vfs.open("/f", "rb").read() == b"\0" * 14 + b"!"  # the last close changed nothing


def test_appends_from_several_handles_all_land(vfs):
    handles = [vfs.open("/log", "a") for _ in range(3)]
    for round_ in range(2):
        for n, f in enumerate(handles):
            f.write(f"{round_}.{n};")
    for f in handles:
        f.close()
    assert vfs.open("/log").read() == "0.0;0.1;0.2;1.0;1.1;1.2;"
    with vfs.open("/log", "a") as f:  # at the end, wherever the position was put
        f.seek(100)
        f.write("end")
    assert vfs.open("/log").read() == "0.0;0.1;0.2;1.0;1.1;1.2;end"


def test_writes_at_other_offsets_from_two_handles_both_land(vfs):
    with vfs.open("/r", "w") as f:
        f.write("0123456789")
    first, second = vfs.open("/r", "r+"), vfs.open("/r", "r+")
    first.write("A")
    second.seek(5)
    second.write("B")
    first.close()  # it must not put back what it saw when it was opened
    second.close()
    assert vfs.open("/r").read() == "A1234B6789"


# -- names ---------------------------------------------------------------------------------------


def test_stat_and_scandir(vfs):
    vfs.mkdir("/d")
    with vfs.open("/d/f", "wb") as f:
        f.write(b"12345")
    st = vfs.stat("/d/f")
    assert stat.S_ISREG(st.st_mode) and st.st_size == 5 and st.st_nlink == 1
    assert stat.S_ISDIR(vfs.stat("/d").st_mode) and stat.S_ISDIR(vfs.stat("/").st_mode)
    with vfs.scandir("/d") as entries:
        (entry,) = list(entries)
    assert (entry.name, entry.path, entry.is_file(), entry.is_dir()) == ("f", "/d/f", True, False)
    assert entry.stat().st_size == 5 and entry.stat().st_mtime_ns == st.st_mtime_ns
    assert [e.path for e in vfs.scandir("d")] == ["d/f"]
    assert vfs.entries("/d") == [("f", False, 5, st.st_mtime_ns)]


def test_makedirs_walk_and_helpers(vfs):
    vfs.makedirs("/a/b/c")
    vfs.makedirs("/a/b/c", exist_ok=True)
    with pytest.raises(FileExistsError):
        vfs.makedirs("/a/b/c")
    with vfs.open("/a/b/file", "w"):
        pass
    with pytest.raises(FileExistsError):
        vfs.makedirs("/a/b/file", exist_ok=True)
    with pytest.raises(NotADirectoryError):
        vfs.makedirs("/a/b/file/x")
    walked = list(vfs.walk("/"))
    assert walked == [("/", ["a"], []), ("/a", ["b"], []), ("/a/b", ["c"], ["file"]), ("/a/b/c", [], [])]
    assert [top for top, _, _ in vfs.walk("/a", topdown=False)] == ["/a/b/c", "/a/b", "/a"]
    errors = []
    assert list(vfs.walk("/missing", onerror=errors.append)) == [] and len(errors) == 1
    assert vfs.exists("/a") and vfs.isdir("/a") and not vfs.isfile("/a")
    assert vfs.isfile("/a/b/file") and vfs.getsize("/a/b/file") == 0
    assert not vfs.exists("/a/b/file/x") and not vfs.isdir("/nope")


def test_rename_and_replace(vfs):
    for name, text in (("/a", "A"), ("/b", "B")):
        with vfs.open(name, "w") as f:
            f.write(text)
    vfs.replace("/a", "/b")
    assert vfs.listdir("/") == ["b"] and vfs.open("/b").read() == "A"
    vfs.mkdir("/d")
    vfs.rename("/b", "/d/c")
    assert vfs.open("/d/c").read() == "A"
    with pytest.raises(OSError) as excinfo:
        vfs.rename("/d", "/d/inside")
    assert errno_of(excinfo) == errno.EINVAL
    with pytest.raises(FileNotFoundError) as excinfo:
        vfs.rename("/missing", "/x")
    assert excinfo.value.filename == "/missing" and excinfo.value.filename2 == "/x"


def test_errno_table(vfs):
    with vfs.open("/file", "w"):
        pass
    vfs.mkdir("/dir")
    with vfs.open("/dir/x", "w"):
        pass
    name_max = vfs.statvfs("/").f_namemax
    cases = [
        (lambda: vfs.open("/missing"), errno.ENOENT),
        (lambda: vfs.stat("/missing/x"), errno.ENOENT),
        (lambda: vfs.mkdir("/dir"), errno.EEXIST),
        (lambda: vfs.open("/file", "x"), errno.EEXIST),
        (lambda: vfs.open("/file/x", "w"), errno.ENOTDIR),
        (lambda: vfs.listdir("/file"), errno.ENOTDIR),
        (lambda: vfs.stat("/file/"), errno.ENOTDIR),
        (lambda: vfs.rmdir("/file"), errno.ENOTDIR),
        (lambda: vfs.open("/dir"), errno.EISDIR),
        (lambda: vfs.open("/dir", "w"), errno.EISDIR),
        (lambda: vfs.open("/new/", "w"), errno.EISDIR),  # creating through a trailing slash
        (lambda: vfs.open("/file/", "a"), errno.EISDIR),
        (lambda: vfs.open("/file/", "r"), errno.ENOTDIR),
        (lambda: vfs.open("/new/", "r"), errno.ENOENT),
        (lambda: vfs.remove("/dir"), errno.EISDIR),
        (lambda: vfs.rmdir("/dir"), errno.ENOTEMPTY),
        (lambda: vfs.open("/" + "n" * (name_max + 1), "w"), errno.ENAMETOOLONG),
        (lambda: vfs.mkdir("/dir/" + "é" * (name_max // 2 + 1)), errno.ENAMETOOLONG),
    ]
    for call, expected in cases:
        with pytest.raises(OSError) as excinfo:
            call()
        assert errno_of(excinfo) == expected, (excinfo.value, errno.errorcode[expected])
        assert excinfo.value.filename is not None
    # the file name is the one the caller wrote, not the filesystem's own
    vfs.chdir("/dir")
    with pytest.raises(FileNotFoundError) as excinfo:
        vfs.open("nothing")
    assert excinfo.value.filename == "nothing"


def test_enospc_keeps_earlier_files_and_remove_frees_space():
    vfs = make_vfs(blocks=32)
    with vfs.open("/keep", "wb") as f:
        f.write(b"k" * 700)
    block = b"x" * BLOCK
    written = []
    with pytest.raises(OSError) as excinfo:
        for n in range(40):
            with vfs.open(f"/fill{n}", "wb") as f:
                f.write(block)
            written.append(f"/fill{n}")
    assert errno_of(excinfo) == errno.ENOSPC and excinfo.value.filename.startswith("/fill")
    assert vfs.backend("/").open_files == 0
    assert vfs.open("/keep", "rb").read() == b"k" * 700
    assert all(vfs.open(path, "rb").read() == block for path in written)
    for path in written[:4]:
        vfs.remove(path)
    with vfs.open("/after", "wb") as f:
        f.write(block * 2)
    vfs.backend("/").remount()
    assert vfs.open("/after", "rb").read() == block * 2
    assert vfs.open("/keep", "rb").read() == b"k" * 700


def test_statvfs(vfs):
    result = vfs.statvfs("/")
    assert result.f_bsize == BLOCK and result.f_blocks == 64
    assert 0 < result.f_bfree < result.f_blocks and result.f_namemax == 255
    with vfs.open("/big", "wb") as f:
        f.write(bytes(8 * BLOCK))
    assert vfs.statvfs("/").f_bfree <= result.f_bfree - 8
    with pytest.raises(FileNotFoundError):
        vfs.statvfs("/missing")


# -- modification times ----------------------------------------------------------------------------


def test_mtime_is_set_by_writes_and_visible_at_once(vfs):
    with vfs.open("/f", "w") as f:
        f.write("x")
    first = vfs.stat("/f").st_mtime_ns
    assert first > 0
    assert vfs.entries("/")[0].mtime_ns == first
    with vfs.open("/f") as f:  # reading does not change it
        f.read()
    assert vfs.stat("/f").st_mtime_ns == first
    with vfs.open("/f", "a") as f:
        f.write("y")
    second = vfs.stat("/f").st_mtime_ns
    assert second >= first
    vfs.utime("/f", ns=(0, 1_000_000_123))
    assert vfs.stat("/f").st_mtime_ns == 1_000_000_123
    assert vfs.getmtime("/f") == pytest.approx(1.000000123)
    vfs.utime("/f", (5, 7.5))
    assert vfs.stat("/f").st_mtime == 7.5
    vfs.utime("/f", (0, 1700000000.123456))  # the host's nanoseconds, not the product's
    assert vfs.stat("/f").st_mtime_ns == 1700000000_123456001
    vfs.utime("/f", (0, -1.5))
    assert vfs.stat("/f").st_mtime_ns == -1_500_000_000
    vfs.truncate("/f", 0)
    assert vfs.stat("/f").st_mtime_ns > 1_000_000_123
    with vfs.open("/touched", "a"):
        pass  # creating an empty file stamps it too
    assert vfs.stat("/touched").st_mtime_ns > 0
    vfs.mkdir("/d")
    assert vfs.stat("/d").st_mtime_ns > 0


def test_a_time_set_while_a_written_file_is_open_is_the_one_it_keeps(vfs):
    """Linux stamps a file at each write; the VFS at its flush or close: a time set
    after the last write (os.utime, touch -d, cp -p) must outlive that."""
    f = vfs.open("/w", "wb", buffering=0)
    f.write(b"abc")
    vfs.utime("/w", ns=(0, 1))
    f.close()
    assert vfs.stat("/w").st_mtime_ns == 1
    f = vfs.open("/w", "r+b")
    f.truncate(1)
    vfs.utime("/w", ns=(0, 2))
    f.flush()
    f.close()
    assert vfs.stat("/w").st_mtime_ns == 2
    with vfs.open("/w", "ab") as f:
        f.write(b"")  # an empty write leaves the time
    assert vfs.stat("/w").st_mtime_ns == 2
    f = vfs.open("/w", "ab", buffering=0)
    vfs.utime("/w", ns=(0, 3))
    f.write(b"later")  # a write after the time was set stamps it
    f.close()
    assert vfs.stat("/w").st_mtime_ns > 3


def test_a_written_file_keeps_the_time_of_its_last_write_not_of_its_close(vfs):
    """Linux stamps a file at each write, and close(2) leaves the time alone: a file
    written and closed later (a log kept open, an editor's buffer) keeps its last
    write's time. The VFS stamps at flush and close, with that time."""
    for last in ("write", "truncate"):
        f = vfs.open("/w", "wb", buffering=0)
        f.write(b"abc")
        if last == "truncate":
            f.truncate(1)
        done = time.time_ns()
        time.sleep(0.05)
        f.close()
        assert vfs.stat("/w").st_mtime_ns <= done, last
    f = vfs.open("/w", "ab", buffering=0)
    f.write(b"more")
    done = time.time_ns()
    time.sleep(0.05)
    f.flush()
    time.sleep(0.05)
    f.close()  # (nothing written since the flush: the time stays)
    assert vfs.stat("/w").st_mtime_ns <= done


def test_a_path_over_path_max_is_enametoolong(vfs):
    # (the VFS is where a path string is handed in, as the kernel's getname(): littlefs
    # below holds trees deeper than that, reached with shorter relative paths)
    vfs.makedirs("/d/d")
    for path in ("d/" * 2048, "/" + "d/" * 2047 + "x", "é" * 2048):
        with pytest.raises(OSError) as excinfo:
            vfs.stat(path)
        assert excinfo.value.errno == errno.ENAMETOOLONG and excinfo.value.filename == path
    assert vfs.stat("d/d").st_size == 0  # a short one still resolves


@pytest.mark.parametrize("kwargs, error", [
    (dict(times=(0, "x" * 100)), TypeError),  # (was multiplied by 10**9 first: a 100 GB str)
    (dict(times=(0, [1])), TypeError),
    (dict(times=(1,)), TypeError),
    (dict(times=(1, 2, 3)), TypeError),
    (dict(times=[1, 2]), TypeError),
    (dict(ns=(0, 1.5)), TypeError),
    (dict(ns=(0, "5")), TypeError),
    (dict(ns=[0, 1]), TypeError),
    (dict(times=(0, float("nan"))), ValueError),
    (dict(times=(0, float("inf"))), OverflowError),
    (dict(times=(0, 1e30)), OverflowError),  # (beyond time_t: was a ValueError)
    (dict(ns=(0, 10**30)), OverflowError),
    (dict(times=(0, 1), ns=(0, 1)), ValueError),
])
def test_utime_refuses_what_the_host_refuses(vfs, kwargs, error):
    vfs.open("/bad-time", "w").close()
    vfs.utime("/bad-time", ns=(0, 42))
    with pytest.raises(error):
        vfs.utime("/bad-time", **kwargs)
    assert vfs.stat("/bad-time").st_mtime_ns == 42


@pytest.mark.parametrize("kwargs, kept", [
    (dict(times=(0, -1e10)), -(1 << 63)),  # (time_t holds it, 64 bits of ns do not: as Linux clamps)
    (dict(ns=(0, -10**19)), -(1 << 63)),
    (dict(times=(0, 1e18)), (1 << 63) - 1),
])
def test_utime_keeps_the_nearest_time_a_tile_can_when_the_host_takes_it(vfs, kwargs, kept):
    vfs.open("/far-time", "w").close()
    vfs.utime("/far-time", **kwargs)
    assert vfs.stat("/far-time").st_mtime_ns == kept


def _changes_dir_mtimes(vfs, directories, action) -> list[bool]:
    """Set each directory's mtime far back, run ``action``, and say which moved."""
    for d in directories:
        vfs.utime(d, ns=(0, 1))
    action()
    return [vfs.stat(d).st_mtime_ns != 1 for d in directories]


@pytest.mark.parametrize("mode", ["w", "x", "a", "w+", "ab"])
def test_creating_a_file_changes_its_directory_mtime_and_no_other(vfs, mode):
    vfs.makedirs("/d/e")
    assert _changes_dir_mtimes(vfs, ["/d", "/d/e", "/"], lambda: vfs.open("/d/f", mode).close()) == [True, False, False]
    assert [e.stat().st_mtime_ns != 1 for e in vfs.scandir("/") if e.name == "d"] == [True]  # listings agree


@pytest.mark.parametrize("mode", ["w", "a", "r+", "wb"])
def test_writing_an_existing_file_leaves_its_directory_mtime(vfs, mode):
    vfs.mkdir("/d")
    with vfs.open("/d/f", "w") as f:
        f.write("old")

    def overwrite():
        with vfs.open("/d/f", mode) as f:
            f.write("new" if "b" not in mode else b"new")

    assert _changes_dir_mtimes(vfs, ["/d"], overwrite) == [False]
    assert _changes_dir_mtimes(vfs, ["/d"], lambda: vfs.truncate("/d/f", 1)) == [False]
    assert _changes_dir_mtimes(vfs, ["/d"], lambda: vfs.utime("/d/f", ns=(0, 5))) == [False]


def test_directory_mtimes_follow_entries_made_removed_and_renamed(vfs):
    vfs.makedirs("/a/sub")
    vfs.mkdir("/b")
    vfs.open("/a/f", "w").close()
    dirs = ["/a", "/b", "/a/sub", "/"]
    assert _changes_dir_mtimes(vfs, dirs, lambda: vfs.mkdir("/a/new")) == [True, False, False, False]
    assert _changes_dir_mtimes(vfs, dirs, lambda: vfs.rmdir("/a/new")) == [True, False, False, False]
    assert _changes_dir_mtimes(vfs, dirs, lambda: vfs.rename("/a/f", "/b/f")) == [True, True, False, False]
    assert _changes_dir_mtimes(vfs, dirs, lambda: vfs.rename("/b/f", "/b/g")) == [False, True, False, False]
    assert _changes_dir_mtimes(vfs, dirs, lambda: vfs.remove("/b/g")) == [False, True, False, False]
    # the moved directory keeps its own mtime; both parents change
    vfs.utime("/a/sub", ns=(0, 77))
    vfs.rename("/a/sub", "/sub")
    assert vfs.stat("/sub").st_mtime_ns == 77
    assert _changes_dir_mtimes(vfs, ["/", "/sub"], lambda: vfs.open("/new", "x").close()) == [True, False]


def test_directory_mtimes_reach_littlefs(vfs):
    littlefs = vfs.backend("/").fs
    vfs.mkdir("/d")
    vfs.utime("/d", ns=(0, 1))
    vfs.open("/d/f", "w").close()
    stamped = vfs.stat("/d").st_mtime_ns
    assert stamped > 1 and littlefs.get_mtime("/d") == 1  # kept in memory until a sync point
    vfs.sync()
    assert littlefs.get_mtime("/d") == stamped


def test_mtimes_reach_littlefs_at_sync_points(vfs):
    backend = vfs.backend("/")
    littlefs = backend.fs
    with vfs.open("/f", "w") as f:
        f.write("x")
    stamped = vfs.stat("/f").st_mtime_ns
    assert littlefs.get_mtime("/f") is None  # kept in memory (lazytime)
    vfs.sync()
    assert littlefs.get_mtime("/f") == stamped
    with vfs.open("/g", "wb") as f:
        f.write(b"y")
        f.fsync()
        assert littlefs.get_mtime("/g") == vfs.stat("/g").st_mtime_ns
    with vfs.open("/h", "w") as f:
        f.write("z")
    vfs.rename("/h", "/i")  # pending stamps are written before a rename moves entries
    assert littlefs.get_mtime("/i") == vfs.stat("/i").st_mtime_ns > 0
    with vfs.open("/j", "w") as f:
        f.write("j")
    image = backend.snapshot()  # a snapshot includes them
    copy = Vfs()
    copy_device = MemoryDevice.new(BLOCK, 64)
    copy_device.restore(image)
    mount_device(copy, "/", copy_device)
    assert copy.stat("/j").st_mtime_ns == vfs.stat("/j").st_mtime_ns


def test_pending_stamps_are_bounded(vfs, monkeypatch):
    from ipuos.vfs import _local

    monkeypatch.setattr(_local, "PENDING_STAMPS_MAX", 4)
    for n in range(20):
        with vfs.open(f"/f{n}", "w"):
            pass
    fs = vfs.backend("/").fs
    unwritten = [p for p in ["/", *(f"/f{n}" for n in range(20))] if fs.get_mtime(p) is None]
    assert len(unwritten) <= 4, unwritten


def test_stamps_that_find_the_disk_full_stay_and_follow_renames():
    """A file put in place by a rename (cp, put and mv write a temporary name first) on a
    nearly full disk lost its time: its stamp, due to be written before the rename, was
    dropped, and a new file has no older one to fall back on."""
    from ipuos.vfs._local import STAMP_RESERVE_BLOCKS

    vfs = make_vfs(blocks=32)
    littlefs = vfs.backend("/").fs
    vfs.mkdir("/d")
    for name, size in (("/filler", 20 * BLOCK), ("/old", 1)):
        with vfs.open(name, "wb") as f:
            f.write(b"f" * size)
    vfs.utime("/old", ns=(5, 5))
    with vfs.open("/.part", "wb") as f:
        f.write(b"n" * 3000)
    assert vfs.statvfs("/").f_bfree < STAMP_RESERVE_BLOCKS  # (no stamps are written now)
    stamped = vfs.stat("/.part").st_mtime_ns
    vfs.rename("/.part", "/old")
    assert vfs.stat("/old").st_mtime_ns == stamped  # not the replaced file's 5, nor none
    vfs.rename("/old", "/d/new")
    vfs.rename("/d", "/e")  # (a directory's: those of what is below it)
    assert vfs.stat("/e/new").st_mtime_ns == stamped
    assert littlefs.get_mtime("/e/new") is None  # (in memory, as lazytime keeps them)
    vfs.remove("/filler")
    vfs.sync()  # room again: written
    assert littlefs.get_mtime("/e/new") == stamped


def test_a_disk_too_full_for_stamps_is_walked_again_only_once_something_is_committed():
    """Finding the disk too full for stamps walks all of it (statvfs); every backup and
    every stamp past the bound did that again, though nothing could have been freed."""
    from ipuos.vfs._local import STAMP_RESERVE_BLOCKS

    vfs = make_vfs(blocks=32)
    backend = vfs.backend("/")
    for name, size in (("/filler", 20 * BLOCK), ("/x", 3000)):
        with vfs.open(name, "wb") as f:
            f.write(b"f" * size)
    assert vfs.statvfs("/").f_bfree < STAMP_RESERVE_BLOCKS
    stamped = vfs.stat("/x").st_mtime_ns
    vfs.sync()
    kept = backend.unwritten_times
    assert kept >= 2  # (/filler, /x and their directory's): kept, the disk is full
    reads = backend.device.reads
    vfs.sync()
    vfs.sync()
    assert backend.device.reads == reads  # nothing committed since: still full, not walked
    assert backend.unwritten_times == kept
    with vfs.open("/x", "rb") as f:  # (reading commits nothing either)
        assert len(f.read()) == 3000
    vfs.sync()
    assert backend.unwritten_times == kept
    vfs.remove("/filler")  # a commit that frees room
    vfs.sync()
    assert backend.unwritten_times == 0
    assert backend.fs.get_mtime("/x") == stamped


# -- files dropped without close --------------------------------------------------------------------


def test_a_dropped_file_is_committed_before_anything_looks(vfs):
    backend = vfs.backend("/")
    vfs.open("/f", "w").write("written and dropped")
    assert backend.open_files == 1 and len(vfs.pending) == 1  # the finalizer only deferred
    assert vfs.getsize("/f") == len("written and dropped")  # the next operation closed it
    assert backend.open_files == 0 and vfs.pending == []
    file = vfs.open("/g", "wb")
    file.write(b"pending")
    del file
    gc.collect()
    assert vfs.open("/g", "rb").read() == b"pending"


def test_a_text_file_dropped_loses_nothing(vfs):
    text = vfs.open("/t", "w")
    text.write("line\n")  # write_through: already in the binary file
    del text
    gc.collect()
    assert vfs.open("/t").read() == "line\n"


def test_a_file_dropped_on_another_thread_is_closed_by_the_owner(vfs):
    import threading

    files = [vfs.open("/x", "wb")]
    files[0].write(b"from the owner")
    thread = threading.Thread(target=files.clear)  # the last reference goes elsewhere
    thread.start()
    thread.join()
    assert len(vfs.pending) == 1
    vfs.sync()
    assert vfs.pending == [] and vfs.backend("/").open_files == 0
    assert vfs.backend("/").fs.open("/x").read() == b"from the owner"


def test_device_failure_is_eio_and_earlier_data_survives():
    device = MemoryDevice.new(BLOCK, 64)
    vfs = Vfs()
    backend = mount_device(vfs, "/", device, format=True)
    with vfs.open("/kept", "w") as f:
        f.write("safe")
    vfs.sync()
    device.attach_faults(FaultPlan(stop_after=3))
    with pytest.raises(OSError) as excinfo:
        with vfs.open("/lost", "wb") as f:
            f.write(bytes(4 * BLOCK))
    assert errno_of(excinfo) == errno.EIO
    with pytest.raises(OSError) as excinfo:
        vfs.listdir("/")
    assert errno_of(excinfo) == errno.EIO  # unusable until remounted
    device.detach_faults()
    backend.remount()
    assert vfs.open("/kept").read() == "safe"


def test_a_custom_backend_gets_inner_paths():
    seen = []

    class Recorder(Backend):
        kind = "recorder"

        def entry(self, path):
            seen.append(path)
            return super().entry(path)

    vfs = make_vfs()
    vfs.mount("/rec", Recorder())
    vfs.exists("/rec")
    vfs.exists("/rec/a/b/")
    vfs.chdir("/rec")
    assert seen == ["/", "/a/b/", "/"]
    assert vfs.mount_points()[1].kind == "recorder"
