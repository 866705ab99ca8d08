"""Files through a real FUSE mount of a running machine: round trips and the errno table.

One tiny machine (16 tiles, 16 KiB tile disks, a 240 KiB chip disk) is mounted by its
daemon for the module; this process uses the mount with plain ``os`` calls, and checks the
other side with programs running on the tiles.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import shutil
import subprocess
import stat
import tempfile
import time

import pytest
from fuse_harness import errno_of, file_id, fuse_session, host_tree, mounted_machine, runtime_dir, tile_tree  # noqa: F401

from ipuos._mount import mount_at


@pytest.fixture(scope="module")
def mm(runtime_dir, fuse_session):
    yield from mounted_machine("tiny")


def test_layout(mm):
    assert sorted(os.listdir(mm.root)) == ["chip", "tiles"]
    assert sorted(os.listdir(mm.root / "tiles"), key=int) == [str(t) for t in range(16)]
    for path in (mm.root, mm.root / "tiles", mm.tile(5), mm.chip):
        assert stat.S_ISDIR(os.stat(path).st_mode)
    # tile 0's own disk only: its mount points (/chip, /tiles) are not repeated under it
    assert "chip" not in os.listdir(mm.tile(0)) and "tiles" not in os.listdir(mm.tile(0))
    assert errno_of(os.stat, mm.tile(0) / "chip") == errno.ENOENT
    assert errno_of(os.stat, mm.root / "tiles" / "16") == errno.ENOENT
    assert errno_of(os.stat, mm.root / "tiles" / "03") == errno.ENOENT
    assert mount_at(mm.path).source.startswith("ipuos:")
    info = os.stat(mm.tile(1))
    assert (info.st_uid, info.st_gid) == (os.getuid(), os.getgid())


def test_host_writes_are_seen_by_tile_programs(mm):
    data = os.urandom(3000)
    os.makedirs(mm.tile(3) / "dir" / "sub")
    (mm.tile(3) / "dir" / "sub" / "f.bin").write_bytes(data)
    (mm.chip / "c.txt").write_text("on the chip disk\n")
    assert tile_tree(mm.booted, 3)["dir/sub/f.bin"] == file_id(data)
    assert mm.run(0, "print(open('/chip/c.txt').read(), end='')") == "on the chip disk\n"
    assert mm.run(3, "import os; print(os.path.getsize('/dir/sub/f.bin'))") == "3000\n"


def test_tile_changes_are_seen_by_the_host_at_once(mm):
    path = mm.tile(4) / "g.txt"
    assert not path.exists()  # a negative lookup the kernel must not remember
    mm.run(4, "open('/g.txt', 'w').write('first')")
    assert path.read_text() == "first"
    size = os.stat(path).st_size  # cached attributes must not hide the next change
    mm.run(4, "open('/g.txt', 'a').write(' and second')")
    assert os.stat(path).st_size == size + len(" and second")
    assert path.read_text() == "first and second"
    mm.run(4, "import os; os.rename('/g.txt', '/h.txt')")
    assert not path.exists() and (mm.tile(4) / "h.txt").read_text() == "first and second"
    mm.run(4, "import os; os.remove('/h.txt')")
    assert os.listdir(mm.tile(4)) == []


def test_writes_are_committed_at_close_and_the_writer_sees_them_before(mm):
    path = mm.tile(5) / "w.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, b"x" * 1000)
        assert os.fstat(fd).st_size == 1000  # the writer's own view, not yet committed
        assert os.stat(path).st_size == 1000
        assert os.lseek(fd, 0, os.SEEK_END) == 1000
    finally:
        os.close(fd)
    assert mm.run(5, "print(len(open('/w.bin', 'rb').read()))") == "1000\n"


def test_ftruncate_goes_through_the_open_file(mm):
    path = mm.tile(5) / "t.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, b"0123456789")
        os.ftruncate(fd, 4)  # must not be undone by the handle's own uncommitted writes
        assert os.fstat(fd).st_size == 4
        os.pwrite(fd, b"AB", 6)  # past the end: a hole of zeros
    finally:
        os.close(fd)
    assert path.read_bytes() == b"0123\0\0AB"
    os.truncate(path, 2)
    assert path.read_bytes() == b"01"
    os.truncate(path, 5)
    assert path.read_bytes() == b"01\0\0\0"
    assert tile_tree(mm.booted, 5)["t.bin"] == file_id(b"01\0\0\0")


def test_append_goes_to_the_tiles_end(mm):
    path = mm.tile(6) / "log"
    path.write_bytes(b"start\n")
    first = os.open(path, os.O_WRONLY | os.O_APPEND)
    second = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(first, b"one\n")
        os.close(first)
        first = None
        mm.run(6, "open('/log', 'a').write('tile\\n')")
        os.write(second, b"two\n")
    finally:
        for fd in (first, second):
            if fd is not None:
                os.close(fd)
    assert path.read_bytes() == b"start\none\ntile\ntwo\n"


def test_modification_times(mm):
    path = mm.tile(2) / "m"
    path.write_bytes(b"data")
    os.utime(path, ns=(5, 1_234_567_890_123_456_789))
    assert os.stat(path).st_mtime_ns == 1_234_567_890_123_456_789
    assert mm.run(2, "import os; print(os.stat('/m').st_mtime_ns)") == "1234567890123456789\n"
    # cp -p: write, set the time on the open file, close: the close must not stamp "now"
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    os.write(fd, b"copied")
    os.utime(fd, ns=(7, 1_000_000_000_000_000_007))
    os.close(fd)
    assert os.stat(path).st_mtime_ns == 1_000_000_000_000_000_007
    os.utime(path)  # touch: now
    assert abs(os.stat(path).st_mtime - time.time()) < 60
    os.utime(path, ns=(1, 2), follow_symlinks=True)
    assert os.stat(path).st_mtime_ns == 2
    # touch -d, cp -a of an empty file: create, set the time while open, close
    new = mm.tile(2) / "made-empty"
    fd = os.open(new, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    os.utime(fd, ns=(3, 1_000_000_000_000_000_003))
    os.close(fd)
    assert os.stat(new).st_mtime_ns == 1_000_000_000_000_000_003
    subprocess.run(["touch", "-d", "2001-02-03 04:05:06", str(mm.tile(2) / "touched")], check=True)
    assert time.gmtime(os.stat(mm.tile(2) / "touched").st_mtime)[:3] == (2001, 2, 3)


def test_times_beyond_what_a_tile_keeps_are_clamped(mm):
    # a tile keeps signed 64-bit nanoseconds (1677 to 2262): a time beyond is set to the
    # nearest one kept, as Linux clamps times to what a filesystem keeps, not refused
    path = mm.tile(2) / "far"
    path.write_bytes(b"far")
    subprocess.run(["touch", "-d", "2300-01-01", str(path)], check=True)
    assert os.stat(path).st_mtime_ns == (1 << 63) - 1
    os.utime(path, ns=(0, -(1 << 70)))
    assert os.stat(path).st_mtime_ns == -(1 << 63)
    assert mm.run(2, "import os; print(os.stat('/far').st_mtime_ns)") == f"{-(1 << 63)}\n"
    os.unlink(path)


def test_a_write_moves_the_mtime_its_writer_sees_before_the_commit(mm):
    path = mm.tile(2) / "written"
    path.write_bytes(b"old")
    os.utime(path, ns=(1, 1_000_000_000_000_000_000))
    fd = os.open(path, os.O_WRONLY)
    try:
        before = time.time_ns()
        os.write(fd, b"new")
        for seen in (os.fstat(fd).st_mtime_ns, os.stat(path).st_mtime_ns):
            assert before <= seen <= time.time_ns()
        os.ftruncate(fd, 1)
        assert os.fstat(fd).st_mtime_ns >= seen
    finally:
        os.close(fd)
    assert os.stat(path).st_mtime_ns >= seen
    os.unlink(path)


def test_tile_and_chip_roots_have_their_filesystems_times(mm, tmp_path):
    """/tiles/N is tile N's root: its time is the tile's, moves when an entry comes or
    goes, and can be set (tar x, cp -a and rsync -t set it, and failed)."""
    root = mm.tile(14)
    os.utime(root, ns=(1, 5_000_000_000))
    assert os.stat(root).st_mtime_ns == 5_000_000_000
    assert mm.run(14, "import os; print(os.stat('/').st_mtime_ns)") == "5000000000\n"
    (root / "new-entry").write_bytes(b"x")
    assert os.stat(root).st_mtime_ns > 5_000_000_000
    (root / "new-entry").unlink()
    source = tmp_path / "src"
    source.mkdir()
    (source / "f").write_bytes(b"archived")
    os.utime(source, ns=(1, 7_000_000_000))
    subprocess.run(["tar", "cf", str(tmp_path / "a.tar"), "-C", str(source), "."], check=True)
    done = subprocess.run(["tar", "xf", str(tmp_path / "a.tar"), "-C", str(mm.tile(14))],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (mm.tile(14) / "f").read_bytes() == b"archived"
    assert os.stat(mm.tile(14)).st_mtime_ns == 7_000_000_000
    with pytest.raises(PermissionError):
        os.utime(mm.root / "tiles", ns=(1, 1))  # (the mount's own directories have no time to set)
    # the chip disk's root is a filesystem's root too: tar x (cp -a, rsync -t) into /chip sets it
    done = subprocess.run(["tar", "xf", str(tmp_path / "a.tar"), "-C", str(mm.chip)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert mm.run(0, "import os; print(os.stat('/chip').st_mtime_ns)") == "7000000000\n"
    assert (mm.chip / "f").read_bytes() == b"archived"
    os.unlink(mm.chip / "f")


def test_unlinked_open_file_keeps_working_and_leaves_nothing_behind(mm):
    path = mm.tile(8) / "gone"
    path.write_bytes(b"still here")
    fd = os.open(path, os.O_RDWR)
    try:
        os.unlink(path)
        assert os.listdir(mm.tile(8)) == []  # no .fuse_hidden file for a tile to trip on
        assert os.pread(fd, 100, 0) == b"still here"
        os.pwrite(fd, b"S", 0)
        assert os.fstat(fd).st_size == 10
        path.write_bytes(b"a new file")  # the name is free again
        assert os.stat(path).st_size == 10
    finally:
        os.close(fd)
    assert path.read_bytes() == b"a new file"
    assert tile_tree(mm.booted, 8) == {"gone": file_id(b"a new file")}
    os.unlink(path)


def test_an_open_file_renamed_to_a_name_like_libfuses_hidden_ones_is_kept(mm):
    # libfuse hides open files that are unlinked under such names: a user's rename to one
    # is still a rename
    base = mm.tile(8)
    (base / "precious").write_bytes(b"precious data")
    hidden = base / ".fuse_hidden0123456789abcdef"
    with open(base / "precious", "rb") as held:
        os.rename(base / "precious", hidden)
        assert os.listdir(base) == [hidden.name]
        assert held.read() == b"precious data"
    assert os.listdir(base) == [hidden.name]
    assert tile_tree(mm.booted, 8) == {hidden.name: file_id(b"precious data")}
    os.unlink(hidden)


def test_replacing_an_open_file_and_anonymous_temporary_files(mm):
    base = mm.tile(8)
    (base / "old").write_bytes(b"old contents")
    (base / "new").write_bytes(b"new")
    with open(base / "old", "rb") as held:
        os.rename(base / "new", base / "old")  # replaces a file that is open
        assert held.read() == b"old contents"
        assert os.fstat(held.fileno()).st_size == 12
        assert sorted(os.listdir(base)) == ["old"]
    assert tile_tree(mm.booted, 8) == {"old": file_id(b"new")}
    os.unlink(base / "old")
    with tempfile.TemporaryFile(dir=base) as scratch:  # open, unlink, then fstat and use
        scratch.write(b"scratch" * 100)
        scratch.seek(0)
        assert scratch.read() == b"scratch" * 100
        assert os.listdir(base) == []
    assert os.listdir(base) == [] and tile_tree(mm.booted, 8) == {}


def test_rename_within_a_tile_and_replacing(mm):
    base = mm.tile(9)
    (base / "a").write_bytes(b"A")
    (base / "b").write_bytes(b"B")
    os.mkdir(base / "d")
    os.rename(base / "a", base / "b")  # replaces
    os.rename(base / "b", base / "d" / "c")
    os.rename(base / "d", base / "e")
    assert host_tree(base) == {"e": None, "e/c": file_id(b"A")}
    assert tile_tree(mm.booted, 9) == host_tree(base)


def _renameat2(src, dst, flags: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.renameat2(-100, os.fsencode(src), -100, os.fsencode(dst), flags)  # AT_FDCWD
    return 0 if result == 0 else ctypes.get_errno()


def test_rename_flags(mm):
    base = mm.tile(9)
    (base / "x").write_bytes(b"x")
    (base / "y").write_bytes(b"y")
    assert _renameat2(base / "x", base / "y", 1) == errno.EEXIST  # RENAME_NOREPLACE
    assert _renameat2(base / "x", base / "z", 1) == 0
    assert _renameat2(base / "z", base / "y", 2) == errno.EINVAL  # RENAME_EXCHANGE: not supported
    assert {"y", "z"} <= set(os.listdir(base))
    assert (base / "z").read_bytes() == b"x" and (base / "y").read_bytes() == b"y"


def _table(mm):
    t3, t4 = mm.tile(12), mm.tile(13)
    return [
        ("stat of a missing file", errno.ENOENT, lambda: os.stat(t3 / "nope")),
        ("open of a missing file", errno.ENOENT, lambda: os.open(t3 / "nope", os.O_RDONLY)),
        ("unlink of a missing file", errno.ENOENT, lambda: os.unlink(t3 / "nope")),
        ("rmdir of a missing directory", errno.ENOENT, lambda: os.rmdir(t3 / "nope")),
        ("a file in a missing directory", errno.ENOENT, lambda: open(t3 / "nope" / "f", "w")),
        ("mkdir of an existing directory", errno.EEXIST, lambda: os.mkdir(t3 / "d")),
        ("O_EXCL of an existing file", errno.EEXIST, lambda: os.open(t3 / "f", os.O_CREAT | os.O_EXCL | os.O_WRONLY)),
        ("a path through a file", errno.ENOTDIR, lambda: os.stat(t3 / "f" / "x")),
        ("rmdir of a file", errno.ENOTDIR, lambda: os.rmdir(t3 / "f")),
        ("opening a directory to write", errno.EISDIR, lambda: os.open(t3 / "d", os.O_WRONLY)),
        ("unlink of a directory", errno.EISDIR, lambda: os.unlink(t3 / "d")),
        ("rename of a file onto a directory", errno.EISDIR, lambda: os.rename(t3 / "f", t3 / "d")),
        ("rmdir of a non-empty directory", errno.ENOTEMPTY, lambda: os.rmdir(t3 / "full")),
        ("rename onto a non-empty directory", errno.ENOTEMPTY, lambda: os.rename(t3 / "d", t3 / "full")),
        ("a 256-byte name", errno.ENAMETOOLONG, lambda: open(t3 / ("n" * 256), "w")),
        ("rename between tiles", errno.EXDEV, lambda: os.rename(t3 / "f", t4 / "f")),
        ("rename from a tile to /chip", errno.EXDEV, lambda: os.rename(t3 / "f", mm.chip / "f")),
        ("rename from /tiles/0 to /chip", errno.EXDEV, lambda: os.rename(mm.tile(0) / "z", mm.chip / "z")),
        ("rename of a directory into itself", errno.EINVAL, lambda: os.rename(t3 / "full", t3 / "full" / "in")),
        ("rmdir of a tile's directory", errno.EBUSY, lambda: os.rmdir(mm.tile(5))),
        ("rename of /chip", errno.EBUSY, lambda: os.rename(mm.chip, mm.root / "tiles" / "chip")),
        ("mkdir of /tiles/0/chip (the chip disk's mount point)", errno.EBUSY, lambda: os.mkdir(mm.tile(0) / "chip")),
        ("mkdir in the mount's root", errno.EPERM, lambda: os.mkdir(mm.root / "new")),
        ("a file in /tiles", errno.EPERM, lambda: open(mm.root / "tiles" / "16", "w")),
        ("a hard link", errno.EPERM, lambda: os.link(t3 / "f", t3 / "g")),
        ("a symlink", errno.EPERM, lambda: os.symlink("f", t3 / "s")),
        ("a FIFO", errno.EPERM, lambda: os.mkfifo(t3 / "fifo")),
        ("a device node", errno.EPERM, lambda: os.mknod(t3 / "dev", stat.S_IFCHR | 0o600, os.makedev(1, 3))),
        ("chmod setuid", errno.EPERM, lambda: os.chmod(t3 / "f", 0o4644)),
        ("chmod sticky", errno.EPERM, lambda: os.chmod(t3, 0o1755)),
        ("chown to another user", errno.EPERM, lambda: os.chown(t3 / "f", os.getuid() + 1, -1)),
        ("getxattr", errno.ENOTSUP, lambda: os.getxattr(t3 / "f", "user.x")),
        ("setxattr", errno.ENOTSUP, lambda: os.setxattr(t3 / "f", "user.x", b"1")),
        ("listxattr", errno.ENOTSUP, lambda: os.listxattr(t3 / "f")),
    ]


def test_errno_table(mm):
    t3 = mm.tile(12)
    os.mkdir(t3 / "d")
    os.mkdir(t3 / "full")
    (t3 / "full" / "x").write_bytes(b"x")
    (t3 / "f").write_bytes(b"f")
    (mm.tile(0) / "z").write_bytes(b"z")
    try:
        wrong = []
        for what, expected, call in _table(mm):
            got = errno_of(call)
            if got != expected:
                wrong.append(f"{what}: {errno.errorcode.get(got, got)} (expected {errno.errorcode[expected]})")
        assert not wrong, "\n".join(wrong)
        # nothing half-done behind the failures
        assert host_tree(t3) == {"d": None, "f": file_id(b"f"), "full": None, "full/x": file_id(b"x")}
        assert tile_tree(mm.booted, 12) == host_tree(t3)
    finally:
        for name in ("full/x", "f"):
            os.unlink(t3 / name)
        os.rmdir(t3 / "full")
        os.rmdir(t3 / "d")
        os.unlink(mm.tile(0) / "z")


def test_positions_past_the_largest_file_read_as_its_end_and_refuse_writes(mm):
    """littlefs files stop at 2 GiB - 1: reading past that is end of file and writing
    there EFBIG, as on any filesystem with a size limit, and refusing one write costs
    nobody anything (a remount would lose other files' uncommitted writes)."""
    path, other = mm.tile(13) / "edge", mm.tile(13) / "other"
    pending = os.open(other, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.write(pending, b"not committed yet")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, b"data")
        for offset in (2**31 - 1, 2**31, 3 * 2**30, 2**40):
            assert os.pread(fd, 10, offset) == b""
            assert errno_of(lambda: os.pwrite(fd, b"Z", offset)) == errno.EFBIG, offset
        assert os.pread(fd, 10, 0) == b"data"
        os.write(pending, b", and more")
    finally:
        os.close(fd)
        os.close(pending)
    assert other.read_bytes() == b"not committed yet, and more" and path.read_bytes() == b"data"
    os.unlink(path)
    os.unlink(other)


def test_what_does_work_without_owners_or_permissions(mm):
    path = mm.tile(10) / "p"
    path.write_bytes(b"p")
    os.chmod(path, 0o644)  # the mode it has: no change, no error
    os.chmod(mm.tile(10), 0o755)
    # permission bits guard nothing on a mount only its user enters: set, not kept
    # (rsync -a makes each file with fchmod(fd, 0600), a script's with 0700)
    os.chmod(path, 0o600)
    with open(path, "rb+") as f:
        os.fchmod(f.fileno(), 0o700)
    os.chmod(path, 0o444)
    os.chmod(mm.tile(10), 0o700)
    os.chown(path, os.getuid(), os.getgid())
    os.chown(path, -1, -1)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert stat.S_IMODE(os.stat(mm.tile(10)).st_mode) == 0o755
    # access(2) agrees with the mode: a file is not executable, a directory is searchable
    assert os.access(path, os.R_OK | os.W_OK) and not os.access(path, os.X_OK)
    assert os.access(mm.tile(10), os.R_OK | os.W_OK | os.X_OK) and os.access(mm.root, os.X_OK)
    assert shutil.which("p", path=str(mm.tile(10))) is None
    os.unlink(path)


def test_statvfs_is_the_tiles_filesystem(mm):
    tile = os.statvfs(mm.tile(11))
    chip = os.statvfs(mm.chip)
    assert (tile.f_bsize, tile.f_blocks) == (512, 32)  # tiny: 16 KiB of 512 B blocks
    assert chip.f_blocks == 15 * 16 * 1024 // 512
    assert tile.f_namemax == 255
    before = tile.f_bfree
    (mm.tile(11) / "big").write_bytes(b"b" * 4096)
    assert os.statvfs(mm.tile(11)).f_bfree < before
    os.unlink(mm.tile(11) / "big")


def test_a_full_disk_is_enospc_and_recovers(mm):
    path = mm.tile(7) / "fill"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    chunk = b"z" * 1024
    written, failure = 0, None
    try:
        while written < 64 * 1024:
            os.write(fd, chunk)
            written += len(chunk)
    except OSError as exc:
        failure = exc.errno
    finally:
        try:
            os.close(fd)
        except OSError as exc:  # the commit at close can be what finds the disk full
            failure = failure or exc.errno
    assert failure == errno.ENOSPC
    assert written < 16 * 1024
    os.unlink(path)
    assert os.listdir(mm.tile(7)) == []
    (mm.tile(7) / "after").write_bytes(b"room again" * 100)
    assert tile_tree(mm.booted, 7) == {"after": file_id(b"room again" * 100)}
    os.unlink(mm.tile(7) / "after")


def test_writes_before_one_that_ran_out_of_space_are_kept(mm):
    # as on Linux, only the write that found no room fails: the file's earlier writes,
    # committed or not, stay, and fsync and close succeed
    path = mm.tile(9) / "g"
    for report_by in (os.fsync, os.close):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            os.write(fd, b"a" * 1000)
            os.fsync(fd)
            assert os.write(fd, b"b" * 1000) == 1000
            assert errno_of(os.write, fd, b"c" * 64 * 1024) == errno.ENOSPC
            assert os.write(fd, b"d") == 1  # (from where the failed write began)
            assert errno_of(report_by, fd) is None, report_by
        finally:
            if report_by is os.fsync:
                assert errno_of(os.close, fd) is None
        assert path.read_bytes() == b"a" * 1000 + b"b" * 1000 + b"d"
    os.unlink(path)


def test_chip_disk_round_trip_of_a_bigger_file(mm):
    data = os.urandom(150 * 1024)
    (mm.chip / "big.bin").write_bytes(data)
    assert (mm.chip / "big.bin").read_bytes() == data
    digest = mm.run(0, "import hashlib; print(hashlib.sha256(open('/chip/big.bin', 'rb').read()).hexdigest())")
    assert digest.strip() == hashlib.sha256(data).hexdigest()
    os.unlink(mm.chip / "big.bin")


def test_a_listing_gives_the_inode_numbers_stat_gives(mm):
    base = mm.tile(14)
    (base / "d").mkdir()
    (base / "d" / "f").write_bytes(b"f")
    ino = {name: os.stat(base / "d" / name).st_ino for name in ("f", ".")}
    assert {entry.name: entry.inode() for entry in os.scandir(base / "d")} == {"f": ino["f"]}
    found = subprocess.run(["find", str(base), "-inum", str(ino["f"])], capture_output=True, text=True, timeout=60)
    assert found.stdout.split() == [str(base / "d" / "f")], found.stderr
    assert {entry.name: entry.inode() for entry in os.scandir(base)}["d"] == ino["."]
