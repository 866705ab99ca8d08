"""A reusable behaviour suite for anything that offers the blockdev ``Filesystem`` API.

Subclass :class:`FilesystemTests` in a ``test_*.py`` module and implement
``make_filesystem(tmp_path)``: it returns a freshly formatted, mounted filesystem (small:
tens of KiB, so the ENOSPC tests stay quick). Override ``remount(fs)`` if unmount+mount
on the same object is not how your filesystem comes back (it must return the filesystem
to use afterwards). Every ``test_*`` method then runs against your filesystem.
"""

from __future__ import annotations

import errno
import os

import pytest


def pattern(size: int, seed: int = 0) -> bytes:
    """Deterministic bytes that differ at every offset and between seeds."""
    return bytes((i * 31 + seed * 17 + (i >> 8)) & 0xFF for i in range(size))


def errno_of(excinfo) -> int:
    return excinfo.value.errno


class FilesystemTests:
    """Behaviour every ipuos filesystem must have. See the module docstring."""

    def make_filesystem(self, tmp_path):
        raise NotImplementedError

    def remount(self, fs):
        fs.unmount()
        fs.mount()
        return fs

    @pytest.fixture
    def fs(self, tmp_path):
        fs = self.make_filesystem(tmp_path)
        yield fs
        if fs.mounted:
            fs.unmount()

    # -- helpers ---------------------------------------------------------------------

    @staticmethod
    def write_file(fs, path, data, mode="w"):
        with fs.open(path, mode) as f:
            assert f.write(data) == len(data)

    @staticmethod
    def read_file(fs, path):
        with fs.open(path, "r") as f:
            return f.read()

    # -- reading and writing ------------------------------------------------------------

    def test_an_open_says_whether_it_created_the_file(self, fs):
        fs.mkdir("/d")
        opens = [("/d/new", "w", True), ("/d/new", "w", False), ("/d/new", "a", False),
                 ("/d/new", "r+", False), ("/d/new", "r", False), ("/d/app", "a", True),
                 ("/d/ex", "x", True), ("/d/flags", os.O_WRONLY | os.O_CREAT, True),
                 ("/d/flags", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, False)]
        for path, mode, created in opens:
            with fs.open(path, mode) as f:
                assert f.created is created, (path, mode)
        with fs.open("/d/new", "w") as f:
            f.write(b"x")
            with fs.open("/d/new", "r") as g:  # commits the first handle's write: no create
                assert not g.created and g.read() == b"x"

    def test_round_trip_of_many_sizes(self, fs):
        bs = fs.statvfs().block_size
        sizes = sorted({0, 1, 15, 16, 17, 100, 255, 256, 257, bs // 4, bs // 2, bs - 1, bs,
                        bs + 1, 2 * bs - 8, 2 * bs + 3, 5 * bs + 7})
        for n, size in enumerate(sizes):
            self.write_file(fs, f"/f{n}", pattern(size, n))
        for n, size in enumerate(sizes):
            assert self.read_file(fs, f"/f{n}") == pattern(size, n)
            assert fs.stat(f"/f{n}").size == size
        fs = self.remount(fs)
        for n, size in enumerate(sizes):
            assert self.read_file(fs, f"/f{n}") == pattern(size, n)

    def test_chunked_writes_and_partial_reads(self, fs):
        data = pattern(3000, 1)
        with fs.open("/f", "w") as f:
            for start in range(0, len(data), 77):
                f.write(data[start : start + 77])
        with fs.open("/f", "r") as f:
            assert f.read(10) == data[:10]
            assert f.read(0) == b""
            assert f.read(1000) == data[10:1010]
            assert f.read() == data[1010:]
            assert f.read(5) == b""  # at end of file
            assert f.read() == b""

    def test_write_accepts_bytes_like_objects(self, fs):
        with fs.open("/f", "w") as f:
            f.write(bytearray(b"ab"))
            f.write(memoryview(b"cdef")[1:3])
            f.write(memoryview(bytes(range(8))).cast("I"))
        assert self.read_file(fs, "/f") == b"abde" + bytes(range(8))

    def test_seek_and_tell(self, fs):
        self.write_file(fs, "/f", pattern(1000))
        with fs.open("/f", "r+") as f:
            assert f.tell() == 0
            assert f.seek(100) == 100
            assert f.read(4) == pattern(1000)[100:104]
            assert f.seek(10, os.SEEK_CUR) == 114
            assert f.seek(-10, os.SEEK_END) == 990
            assert f.read() == pattern(1000)[990:]
            with pytest.raises(OSError) as excinfo:
                f.seek(-1)
            assert errno_of(excinfo) == errno.EINVAL
            with pytest.raises(OSError) as excinfo:
                f.seek(0, 42)
            assert errno_of(excinfo) == errno.EINVAL

    def test_write_past_end_fills_gap_with_zeros(self, fs):
        with fs.open("/f", "w+") as f:
            f.write(b"head")
            f.seek(600)
            f.write(b"tail")
            assert f.size() == 604
        assert self.read_file(fs, "/f") == b"head" + bytes(596) + b"tail"

    def test_empty_write_past_end_leaves_the_file_alone(self, fs):
        # As on a host: writing nothing writes nothing, not even the gap
        with fs.open("/f", "w+") as f:
            f.write(b"head")
            f.seek(600)
            assert f.write(b"") == 0
            assert f.size() == 4
            assert f.tell() == 600
        assert self.read_file(fs, "/f") == b"head"

    def test_an_empty_write_leaves_no_mark_on_where_the_next_one_goes(self, fs):
        # (a client buffering writes once sent the next one to where the empty one was)
        with fs.open("/f", "w+") as f:
            f.write(b"abc")
            f.sync()
            assert f.write(b"") == 0
            f.seek(0)
            f.write(b"Z")
        assert self.read_file(fs, "/f") == b"Zbc"
        self.write_file(fs, "/g", b"0123456789")
        with fs.open("/g", "r+") as f:
            assert f.write(b"") == 0
            assert f.read(5) == b"01234"
            f.write(b"Z")
        assert self.read_file(fs, "/g") == b"01234Z6789"

    def test_overwrite_in_the_middle(self, fs):
        self.write_file(fs, "/f", pattern(2000))
        with fs.open("/f", "r+") as f:
            f.seek(700)
            f.write(b"X" * 50)
        expected = pattern(2000)[:700] + b"X" * 50 + pattern(2000)[750:]
        assert self.read_file(fs, "/f") == expected

    def test_truncate(self, fs):
        self.write_file(fs, "/f", pattern(1500))
        with fs.open("/f", "r+") as f:
            f.seek(1200)
            assert f.truncate(300) == 300
            assert f.tell() == 1200  # the position does not move
            assert f.size() == 300
            assert f.truncate(800) == 800  # grows with zeros
            f.seek(100)
            assert f.truncate() == 100  # default: the current position
        assert self.read_file(fs, "/f") == pattern(1500)[:100]
        with fs.open("/f", "r+") as f:
            f.truncate(400)
        assert self.read_file(fs, "/f") == pattern(1500)[:100] + bytes(300)
        with fs.open("/f", "r+") as f:
            with pytest.raises(OSError) as excinfo:
                f.truncate(-1)
            assert errno_of(excinfo) == errno.EINVAL

    def test_append(self, fs):
        with fs.open("/log", "a") as f:  # "a" creates the file
            f.write(b"one,")
        with fs.open("/log", "a") as f:
            f.write(b"two,")
        with fs.open("/log", "a+") as f:
            f.seek(0)
            assert f.read() == b"one,two,"
            f.seek(0)
            f.write(b"three")  # appends regardless of the position
        assert self.read_file(fs, "/log") == b"one,two,three"

    def test_truncate_at_the_position_after_appending(self, fs):
        # an append lands at the end wherever the position was: truncate() cuts there
        self.write_file(fs, "/log", b"0123456789")
        with fs.open("/log", "a") as f:
            f.seek(2)
            f.write(b"XY")
            assert f.truncate() == 12
        assert self.read_file(fs, "/log") == b"0123456789XY"

    def test_open_modes(self, fs):
        self.write_file(fs, "/f", b"original")
        with pytest.raises(FileExistsError):
            fs.open("/f", "x")
        with fs.open("/f", "r+") as f:  # r+ keeps the contents
            f.write(b"O")
        assert self.read_file(fs, "/f") == b"Original"
        with fs.open("/f", "w") as f:  # w truncates
            f.write(b"new")
        assert self.read_file(fs, "/f") == b"new"
        with fs.open("/g", "xb") as f:
            f.write(b"created")
        assert self.read_file(fs, "/g") == b"created"
        with pytest.raises(FileNotFoundError):
            fs.open("/missing", "r")
        with pytest.raises(FileNotFoundError):
            fs.open("/missing", "r+")
        with pytest.raises(ValueError):
            fs.open("/f", "rw")

    def test_open_with_posix_flags(self, fs):
        f = fs.open("/p", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        f.write(b"hello")
        f.close()
        with pytest.raises(FileExistsError):
            fs.open("/p", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with fs.open("/p", os.O_RDWR | os.O_APPEND) as f:
            f.write(b"!")
            f.seek(0)
            assert f.read() == b"hello!"
        with fs.open("/p", os.O_WRONLY | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)) as f:
            pass
        assert self.read_file(fs, "/p") == b""
        with pytest.raises(FileNotFoundError):
            fs.open("/q", os.O_RDONLY)

    def test_wrong_direction_is_ebadf_not_an_abort(self, fs):
        self.write_file(fs, "/f", b"data")
        with fs.open("/f", "r") as f:
            assert f.readable() and not f.writable()
            for call in (lambda: f.write(b"x"), lambda: f.truncate(1)):
                with pytest.raises(OSError) as excinfo:
                    call()
                assert errno_of(excinfo) == errno.EBADF
        with fs.open("/f", "a") as f:
            assert f.writable() and not f.readable()
            with pytest.raises(OSError) as excinfo:
                f.read()
            assert errno_of(excinfo) == errno.EBADF
        assert self.read_file(fs, "/f") == b"data"

    def test_closed_file_refuses_everything(self, fs):
        f = fs.open("/f", "w+")
        f.write(b"abc")
        f.close()
        f.close()  # closing twice is harmless
        assert f.closed
        for call in (f.read, lambda: f.write(b"x"), f.tell, lambda: f.seek(0), f.sync,
                     f.size, lambda: f.truncate(0)):
            with pytest.raises(ValueError):
                call()
        assert self.read_file(fs, "/f") == b"abc"

    def test_sync_makes_writes_durable_before_close(self, fs):
        f = fs.open("/f", "w")
        f.write(b"synced")
        f.sync()
        with fs.open("/f", "r") as reader:
            assert reader.read() == b"synced"
        f.write(b" and more")
        f.close()
        assert self.read_file(fs, "/f") == b"synced and more"

    def test_two_handles_on_one_file(self, fs):
        self.write_file(fs, "/f", b"0123456789")
        with fs.open("/f", "r") as a, fs.open("/f", "r") as b:
            assert a.read(3) == b"012"
            assert b.read(5) == b"01234"
            assert a.read(2) == b"34"

    def test_a_handle_keeps_what_others_wrote_when_its_file_loses_its_name(self, fs):
        """As on the host: a removed or replaced file is the file as last written, through
        any handle, not what this handle saw when it last looked."""
        for lose_name in (lambda: fs.remove("/f"), lambda: self.write_file(fs, "/other", b"other")
                          or fs.rename("/other", "/f")):
            self.write_file(fs, "/f", b"old-content")
            with fs.open("/f", "r") as reader, fs.open("/f", "r+") as appender:
                self.write_file(fs, "/f", b"NEW")  # a third handle rewrites it
                lose_name()
                assert reader.read() == b"NEW"
                appender.seek(0, os.SEEK_END)
                appender.write(b"+")
                appender.seek(0)
                assert appender.read() == b"NEW+"
            if fs.exists("/f"):
                fs.remove("/f")

    def test_unmount_commits_open_files(self, fs):
        f = fs.open("/f", "w")
        f.write(b"not closed by its user")
        fs = self.remount(fs)
        assert f.closed
        assert self.read_file(fs, "/f") == b"not closed by its user"
        with pytest.raises(OSError) as info:  # not "closed file": its user did not close it
            f.write(b"more")
        assert info.value.errno == errno.EIO and "unmounted while this file was open" in str(info.value)
        f.close()  # harmless

    # -- names and directories -------------------------------------------------------------

    def test_listdir_and_scandir(self, fs):
        assert fs.listdir("/") == []
        fs.mkdir("/d")
        self.write_file(fs, "/a", b"1234")
        self.write_file(fs, "/d/b", b"")
        assert sorted(fs.listdir("/")) == ["a", "d"]
        assert fs.listdir("/d") == ["b"]
        entries = {e.name: e for e in fs.scandir("/")}
        assert entries["a"].size == 4 and not entries["a"].is_dir
        assert entries["d"].is_dir and entries["d"].size == 0
        with pytest.raises(NotADirectoryError):
            fs.listdir("/a")
        with pytest.raises(FileNotFoundError):
            fs.listdir("/nope")

    def test_stat(self, fs):
        self.write_file(fs, "/f", b"12345")
        fs.mkdir("/d")
        info = fs.stat("/f")
        assert (info.name, info.is_dir, info.size) == ("f", False, 5)
        assert fs.stat("/d").is_dir
        assert fs.stat("/").is_dir
        assert fs.exists("/f") and not fs.exists("/g") and not fs.exists("/f/g")
        with pytest.raises(FileNotFoundError):
            fs.stat("/g")

    def test_mkdir_and_rmdir(self, fs):
        fs.mkdir("/d")
        with pytest.raises(FileExistsError):
            fs.mkdir("/d")
        self.write_file(fs, "/d/f", b"x")
        with pytest.raises(OSError) as excinfo:
            fs.rmdir("/d")
        assert errno_of(excinfo) == errno.ENOTEMPTY
        with pytest.raises(NotADirectoryError):
            fs.rmdir("/d/f")
        with pytest.raises(IsADirectoryError):
            fs.remove("/d")
        fs.remove("/d/f")
        fs.rmdir("/d")
        assert not fs.exists("/d")
        with pytest.raises(FileNotFoundError):
            fs.rmdir("/d")
        with pytest.raises(FileNotFoundError):
            fs.remove("/d")
        with pytest.raises(FileNotFoundError):
            fs.mkdir("/no/parent")
        with pytest.raises(FileExistsError):
            fs.mkdir("/")

    def test_paths_are_normalised(self, fs):
        fs.mkdir("/a")
        fs.mkdir("a/b")  # relative to the root
        self.write_file(fs, "/a/./b/../b//f", b"x")
        assert fs.listdir("/a/b/") == ["f"]
        assert self.read_file(fs, "a/b/f") == b"x"
        with pytest.raises(NotADirectoryError):
            fs.stat("/a/b/f/")  # a trailing slash insists on a directory
        with pytest.raises(FileNotFoundError):
            fs.stat("")
        with pytest.raises(ValueError):
            fs.stat("/a\0b")

    def test_errno_for_each_error(self, fs):
        self.write_file(fs, "/file", b"x")
        fs.mkdir("/dir")
        cases = [
            (lambda: fs.open("/missing"), errno.ENOENT),
            (lambda: fs.open("/dir"), errno.EISDIR),
            (lambda: fs.open("/dir", "w"), errno.EISDIR),
            (lambda: fs.open("/file/x", "w"), errno.ENOTDIR),
            (lambda: fs.open("/file/x/", "w"), errno.ENOTDIR),  # (in a directory, EISDIR)
            (lambda: fs.mkdir("/file/x"), errno.ENOTDIR),
            (lambda: fs.mkdir("/file"), errno.EEXIST),
            (lambda: fs.open("/file", "x"), errno.EEXIST),
            (lambda: fs.listdir("/file"), errno.ENOTDIR),
            (lambda: fs.remove("/dir"), errno.EISDIR),
            (lambda: fs.rmdir("/file"), errno.ENOTDIR),
            (lambda: fs.open("/" + "n" * 300, "w"), errno.ENAMETOOLONG),
        ]
        for call, expected in cases:
            with pytest.raises(OSError) as excinfo:
                call()
            assert errno_of(excinfo) == expected, (excinfo.value, errno.errorcode[expected])
            assert excinfo.value.filename is not None

    def test_name_length_limit(self, fs):
        name_max = fs.statvfs().name_max
        longest = "n" * name_max
        self.write_file(fs, "/" + longest, b"ok")
        fs.mkdir("/" + "d" * name_max)
        assert sorted(fs.listdir("/")) == sorted([longest, "d" * name_max])
        for call in (lambda p: fs.open(p, "w"), fs.mkdir, fs.stat,
                     lambda p: fs.rename("/" + longest, p)):
            with pytest.raises(OSError) as excinfo:
                call("/" + "n" * (name_max + 1))
            assert errno_of(excinfo) == errno.ENAMETOOLONG
        # the limit counts encoded bytes: "é" is two of them
        with pytest.raises(OSError) as excinfo:
            fs.mkdir("/" + "é" * (name_max // 2 + 1))
        assert errno_of(excinfo) == errno.ENAMETOOLONG
        fs.mkdir("/" + "é" * (name_max // 2))

    def test_unicode_names(self, fs):
        self.write_file(fs, "/données-ταυ-🙂", b"u")
        assert fs.listdir("/") == ["données-ταυ-🙂"]
        assert self.read_file(fs, "/données-ταυ-🙂") == b"u"

    def test_deep_paths(self, fs):
        info = fs.statvfs()
        depth = max(4, min(24, info.block_count // 4))  # each directory costs two blocks
        path = ""
        for level in range(depth):
            path += f"/level{level}"
            fs.mkdir(path)
        self.write_file(fs, path + "/leaf", b"deep")
        fs = self.remount(fs)
        assert self.read_file(fs, path + "/leaf") == b"deep"
        assert fs.listdir(path) == ["leaf"]

    def test_many_files_in_one_directory(self, fs):
        fs.mkdir("/many")
        for n in range(60):
            self.write_file(fs, f"/many/f{n:03}", pattern(n, n))
        fs = self.remount(fs)
        assert sorted(fs.listdir("/many")) == [f"f{n:03}" for n in range(60)]
        for n in range(60):
            assert self.read_file(fs, f"/many/f{n:03}") == pattern(n, n)

    # -- rename ------------------------------------------------------------------------------

    def test_rename_file(self, fs):
        self.write_file(fs, "/a", b"A")
        fs.mkdir("/d")
        fs.rename("/a", "/d/b")
        assert not fs.exists("/a")
        assert self.read_file(fs, "/d/b") == b"A"
        fs.rename("/d/b", "/d/b")  # to itself: nothing happens
        assert self.read_file(fs, "/d/b") == b"A"
        fs.rename("/d", "/d/")
        assert fs.listdir("/d") == ["b"]

    def test_rename_replaces_a_file(self, fs):
        self.write_file(fs, "/new", b"new contents")
        self.write_file(fs, "/old", b"old")
        fs.rename("/new", "/old")
        assert fs.listdir("/") == ["old"]
        assert self.read_file(fs, "/old") == b"new contents"

    def test_rename_directory(self, fs):
        fs.mkdir("/d")
        self.write_file(fs, "/d/f", b"inside")
        fs.mkdir("/empty")
        fs.rename("/d", "/empty")  # replaces an empty directory
        assert fs.listdir("/") == ["empty"]
        assert self.read_file(fs, "/empty/f") == b"inside"
        fs.mkdir("/other")
        fs.rename("/empty", "/other/moved")
        assert self.read_file(fs, "/other/moved/f") == b"inside"

    def test_rename_of_open_files_keeps_their_writes(self, fs):
        """A file (or a directory holding one) renamed while open for writing: what is
        written before and after lands in the file under its new name (POSIX)."""
        writer = fs.open("/a", "w")
        writer.write(b"before ")
        fs.rename("/a", "/b")
        writer.write(b"after")
        writer.close()
        assert fs.listdir("/") == ["b"]
        assert self.read_file(fs, "/b") == b"before after"
        fs.mkdir("/d")
        inner = fs.open("/d/f", "w")
        inner.write(b"1")
        fs.rename("/d", "/e")
        inner.write(b"2")
        inner.close()
        assert self.read_file(fs, "/e/f") == b"12"

    def test_rename_errors(self, fs):
        self.write_file(fs, "/file", b"f")
        fs.mkdir("/dir")
        fs.mkdir("/full")
        self.write_file(fs, "/full/x", b"x")
        cases = [
            (("/missing", "/x"), errno.ENOENT),
            (("/file", "/nope/file"), errno.ENOENT),
            (("/file", "/dir"), errno.EISDIR),
            (("/dir", "/file"), errno.ENOTDIR),
            (("/dir", "/full"), errno.ENOTEMPTY),
            (("/full", "/full/sub"), errno.EINVAL),  # littlefs itself would lose /full
            (("/dir", "/dir/deeper/still"), errno.ENOENT),  # no /dir/deeper: Linux says so first
            (("/file", "/file/x"), errno.ENOTDIR),
            (("/full/x", "/full"), errno.ENOTEMPTY),  # onto the directory it is in
            (("/missing/x", "/file/y"), errno.ENOENT),  # the source's parent is looked at first
            (("/full/nothing", "/file/y"), errno.ENOTDIR),  # then the target's
        ]
        for (src, dst), expected in cases:
            with pytest.raises(OSError) as excinfo:
                fs.rename(src, dst)
            assert errno_of(excinfo) == expected, (src, dst, excinfo.value)
        assert sorted(fs.listdir("/")) == ["dir", "file", "full"]
        assert fs.listdir("/full") == ["x"]

    # -- space ---------------------------------------------------------------------------------

    def test_statvfs(self, fs):
        before = fs.statvfs()
        assert before.blocks_used + before.blocks_free == before.block_count
        assert before.name_max >= 1
        size = 4 * before.block_size
        self.write_file(fs, "/big", pattern(size))
        during = fs.statvfs()
        assert during.blocks_used >= before.blocks_used + 4
        fs.remove("/big")
        assert fs.statvfs().blocks_used == before.blocks_used

    def test_enospc_keeps_earlier_files_and_delete_frees_space(self, fs):
        self.write_file(fs, "/keep", pattern(700, 3))
        fs.mkdir("/dir")
        self.write_file(fs, "/dir/keep2", b"second")
        info = fs.statvfs()
        chunk = pattern(info.block_size, 9)
        committed = []
        with pytest.raises(OSError) as excinfo:
            for n in range(info.block_count + 1):
                self.write_file(fs, f"/fill{n}", chunk)
                committed.append(f"/fill{n}")
        assert errno_of(excinfo) == errno.ENOSPC
        assert fs.open_files == 0  # the failed file was closed all the same
        assert self.read_file(fs, "/keep") == pattern(700, 3)
        assert self.read_file(fs, "/dir/keep2") == b"second"
        for path in committed:
            assert self.read_file(fs, path) == chunk
        with pytest.raises(OSError) as excinfo:
            self.write_file(fs, "/more", chunk * 2)
        assert errno_of(excinfo) == errno.ENOSPC
        for path in committed[:4]:
            fs.remove(path)
        self.write_file(fs, "/after", chunk * 2)
        fs = self.remount(fs)
        assert self.read_file(fs, "/after") == chunk * 2
        assert self.read_file(fs, "/keep") == pattern(700, 3)
        for path in committed[4:]:
            assert self.read_file(fs, path) == chunk

    def test_enospc_mid_write_keeps_the_writes_before_it(self, fs):
        self.write_file(fs, "/keep", b"kept")
        chunk = pattern(fs.statvfs().block_size, 5)
        f = fs.open("/filler", "w")
        accepted = 0
        with pytest.raises(OSError) as excinfo:
            for _ in range(fs.statvfs().block_count + 1):
                f.write(chunk)
                accepted += 1
        assert errno_of(excinfo) == errno.ENOSPC
        assert accepted > 0
        # as on a host, only the write that found no room failed: the file goes on from
        # where it began, with every chunk written before, or (a client that sends writes
        # behind, as a host's buffered file) still buffered, tried again at the close,
        # which says if they still do not fit: written, or told of, never lost silently
        kept = f.tell() // len(chunk)
        assert f.tell() == kept * len(chunk) and 0 < kept <= accepted
        try:
            f.close()
            closed = True
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
            closed = False
        assert fs.open_files == 0
        content = self.read_file(fs, "/filler")
        if closed:
            assert content == chunk * kept
        else:  # (what was sent before the buffered writes: a prefix)
            assert len(content) < kept * len(chunk) and (chunk * kept).startswith(content)
        fs = self.remount(fs)
        assert self.read_file(fs, "/filler") == content
        assert self.read_file(fs, "/keep") == b"kept"
        fs.remove("/filler")
        self.write_file(fs, "/filler", b"small")  # the space came back
        assert self.read_file(fs, "/filler") == b"small"

    # -- attributes ----------------------------------------------------------------------------

    def test_mtime_attribute(self, fs):
        self.write_file(fs, "/f", b"x")
        fs.mkdir("/d")
        assert fs.get_mtime("/f") is None
        stamp = 1_700_000_000_123_456_789
        fs.set_mtime("/f", stamp)
        fs.set_mtime("/d", -5)  # before the epoch is allowed
        assert fs.get_mtime("/f") == stamp
        fs = self.remount(fs)
        assert fs.get_mtime("/f") == stamp
        assert fs.get_mtime("/d") == -5
        fs.rename("/f", "/d/g")  # the attribute moves with the file
        assert fs.get_mtime("/d/g") == stamp
        fs.set_mtime("/d/g", stamp + 1)
        assert fs.get_mtime("/d/g") == stamp + 1
        with pytest.raises(FileNotFoundError):
            fs.set_mtime("/missing", 1)
        with pytest.raises(FileNotFoundError):
            fs.get_mtime("/missing")

    def test_custom_attributes(self, fs):
        self.write_file(fs, "/f", b"x")
        assert fs.get_attribute("/f", 1) is None
        fs.set_attribute("/f", 1, b"one")
        fs.set_attribute("/f", 2, b"2")
        assert fs.get_attribute("/f", 1) == b"one"
        assert fs.get_attribute("/f", 2) == b"2"
        fs.remove_attribute("/f", 1)
        assert fs.get_attribute("/f", 1) is None
        with pytest.raises(OSError) as excinfo:
            fs.set_attribute("/f", 3, bytes(1023))
        assert errno_of(excinfo) == errno.E2BIG
        with pytest.raises(ValueError):
            fs.set_attribute("/f", 256, b"")
