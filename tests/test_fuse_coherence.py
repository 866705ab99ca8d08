"""The mount keeps what it learns (the kernel keeps looked-up names; the daemon keeps
directories and complete listings), and still shows every change at once, whoever makes it.

Each test makes the host learn something first (a lookup, a listing, a file held open,
a directory it created itself), then changes it from a tile program, and checks that the
host sees the tile's state at once, with plain ``os`` calls, never waiting for a timeout.
The in-process tests at the end look inside: requests per create, which changes make the
kernel forget names, a restore, descriptors left after unmounting.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading

import pytest
from fuse_harness import InProcessMount, errno_of, file_id, fuse_session, host_tree, in_process_mount, mounted_machine  # noqa: F401
from fuse_harness import caller_flags_readable, new_mountpoint, runtime_dir, tile_tree  # noqa: F401

import ipuos
from ipuos import _mount
from ipuos.vfs import fuse_options


@pytest.fixture(scope="module")
def mm(runtime_dir, fuse_session):
    yield from mounted_machine("tiny")


def test_names_removed_by_a_tile_are_gone_for_the_host_at_once(mm):
    base = mm.tile(2)
    os.makedirs(base / "d" / "e")
    (base / "d" / "e" / "f").write_bytes(b"f")
    for _ in range(3):  # looked up: the kernel keeps these names now
        assert os.stat(base / "d" / "e" / "f").st_size == 1
    mm.run(2, "import os; os.remove('/d/e/f'); os.rmdir('/d/e')")
    assert errno_of(os.stat, base / "d" / "e" / "f") == errno.ENOENT
    assert errno_of(os.stat, base / "d" / "e") == errno.ENOENT
    assert not os.access(base / "d" / "e", os.F_OK)
    assert os.listdir(base / "d") == []
    # the names can be made again, from either side
    os.mkdir(base / "d" / "e")
    mm.run(2, "open('/d/e/f', 'w').write('again')")
    assert (base / "d" / "e" / "f").read_text() == "again"
    os.close(os.open(base / "d" / "e" / "g", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    mm.run(2, "import os; os.remove('/d/e/g')")
    fd = os.open(base / "d" / "e" / "g", os.O_CREAT | os.O_EXCL | os.O_WRONLY)  # not EEXIST
    os.close(fd)
    assert tile_tree(mm.booted, 2) == {"d": None, "d/e": None, "d/e/f": file_id(b"again"), "d/e/g": file_id(b"")}


_CWD_WATCHER = """
import json, os, sys, time
os.chdir(sys.argv[1])
print(json.dumps(os.getcwd()), flush=True)
sys.stdin.readline()  # (a tile changes a file elsewhere meanwhile)
seen = []
for _ in range(20):  # (the kernel is told apart from the change: give it the time)
    try:
        seen.append([os.getcwd(), sorted(os.listdir("."))])
    except OSError as exc:
        seen.append(exc.strerror)
    time.sleep(0.02)
print(json.dumps(seen), flush=True)
"""


@pytest.mark.parametrize("top", ["chip", "tiles"])
def test_a_tile_changing_a_file_leaves_the_directories_above_it_alone(mm, top):
    """The kernel was made to forget all of /chip (or /tiles) at every removal or rename
    on a tile: a shell (git) whose current directory was the mount's chip found it
    deleted, and every name under it got a new inode number."""
    where = mm.root / top
    (mm.chip / "keep").mkdir(exist_ok=True)
    (mm.chip / "keep" / "k").write_bytes(b"k")
    (mm.tile(3) / "kept").write_bytes(b"kept")
    watched = ["", "/keep", "/keep/k"] if top == "chip" else ["", "/3", "/3/kept"]
    inodes = [os.stat(str(where) + name).st_ino for name in watched]
    child = subprocess.Popen([sys.executable, "-c", _CWD_WATCHER, str(where)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(child.stdout.readline()) == str(where)
        if top == "chip":
            mm.run(0, "import os; open('/chip/t', 'w').close(); os.remove('/chip/t'); os.rename('/chip/keep/k', '/chip/k2'); os.rename('/chip/k2', '/chip/keep/k')")
        else:
            mm.run(9, "import os; open('/t', 'w').close(); os.remove('/t')")
        out, _ = child.communicate("go\n", timeout=60)
    finally:
        child.kill()
    listing = sorted(os.listdir(where))
    assert json.loads(out) == [[str(where), listing]] * 20
    if top == "chip":
        watched.pop()  # (k was renamed away and back: a new name)
    assert [os.stat(str(where) + name).st_ino for name in watched] == inodes[:len(watched)]


def test_a_tile_replacing_a_file_with_a_directory(mm):
    base = mm.tile(3)
    (base / "x").write_bytes(b"a file")
    assert stat.S_ISREG(os.stat(base / "x").st_mode)
    mm.run(3, "import os; os.remove('/x'); os.mkdir('/x'); open('/x/in', 'w').write('inside')")
    assert stat.S_ISDIR(os.stat(base / "x").st_mode)
    assert (base / "x" / "in").read_text() == "inside"
    mm.run(3, "import os; os.remove('/x/in'); os.rmdir('/x'); open('/x', 'w').write('a file again')")
    assert stat.S_ISREG(os.stat(base / "x").st_mode)
    assert (base / "x").read_text() == "a file again"


def test_a_tile_renaming_directories_the_host_has_looked_into(mm):
    base = mm.tile(4)
    os.makedirs(base / "a" / "b")
    (base / "a" / "b" / "c").write_bytes(b"c")
    assert (base / "a" / "b" / "c").read_bytes() == b"c"
    mm.run(4, "import os; os.rename('/a', '/z')")
    assert errno_of(os.stat, base / "a") == errno.ENOENT
    assert errno_of(os.stat, base / "a" / "b" / "c") == errno.ENOENT
    assert (base / "z" / "b" / "c").read_bytes() == b"c"
    mm.run(4, "import os; os.mkdir('/a'); os.rename('/z/b/c', '/a/c')")
    assert os.listdir(base / "a") == ["c"] and os.listdir(base / "z" / "b") == []
    assert host_tree(base) == tile_tree(mm.booted, 4) == {"a": None, "a/c": file_id(b"c"), "z": None,
                                                            "z/b": None}


def test_a_file_held_open_and_removed_by_a_tile(mm):
    """The kernel keeps the name of an open file whatever it is told; asked for it by path,
    the mount answers for the tile as it is now (and O_CREAT makes a new file)."""
    path = mm.tile(5) / "held"
    path.write_bytes(b"old")
    with open(path, "rb") as held:
        mm.run(5, "import os; os.remove('/held')")
        assert errno_of(os.stat, path) == errno.ENOENT
        assert not os.access(path, os.F_OK)
        assert errno_of(os.open, path, os.O_RDONLY) == errno.ENOENT
        with open(path, "wb") as fresh:  # O_CREAT through a name the kernel still holds
            fresh.write(b"new")
        assert held.read() == b"old"  # the open file is the old one, as on any filesystem
    assert path.read_bytes() == b"new"
    assert tile_tree(mm.booted, 5) == {"held": file_id(b"new")}


def test_a_file_held_open_and_replaced_by_a_directory_on_a_tile(mm):
    """The kernel keeps a name in use whatever it is told: a new type there must not look
    like a corrupt inode to it (EIO), by path or by listing. (The descriptor itself may
    answer EIO from then on: libfuse gives the directory the node of the file's name,
    and the kernel retires the file's inode.)"""
    base = mm.tile(11)
    (base / "f").write_bytes(b"a file")
    held = os.open(base / "f", os.O_RDONLY)
    try:
        mm.run(11, "import os; os.remove('/f'); os.mkdir('/f'); open('/f/in', 'w').write('x')")
        assert stat.S_ISDIR(os.stat(base / "f").st_mode)
        assert os.listdir(base / "f") == ["in"]
        assert sorted(entry.name for entry in os.scandir(base)) == ["f"]
        assert (base / "f" / "in").read_text() == "x"
    finally:
        try:
            os.close(held)
        except OSError:
            pass
    assert tile_tree(mm.booted, 11) == {"f": None, "f/in": file_id(b"x")}


def test_a_file_held_open_and_made_a_directory_on_a_tile_opens_as_one(mm):
    """Opened by path with no lookup first, the kernel takes the held name for the file:
    the mount must make it look again (ESTALE), not answer EISDIR for the directory."""
    path = mm.tile(10) / "opened"
    path.write_bytes(b"f")
    held = os.open(path, os.O_RDONLY)
    try:
        mm.run(10, "import os; os.remove('/opened'); os.mkdir('/opened'); open('/opened/in', 'w').close()")
        os.close(os.open(path, os.O_RDONLY))
        assert os.listdir(path) == ["in"]
    finally:
        _close_retired(held)
    shutil.rmtree(path)


def _close_retired(fd: int) -> None:
    """Close a descriptor of a file a tile has replaced by a directory."""
    try:
        os.close(fd)
    except OSError:
        pass  # (EIO: the directory has the file's node, and the kernel retired the file)


def test_a_directory_made_where_a_tile_removed_a_file_held_open(mm):
    """The kernel still holds the file's name, as a file; the mount's own mkdir there must
    not look like a tile's change of type (ESTALE, then EEXIST on the kernel's retry)."""
    path = mm.tile(10) / "was-a-file"
    path.write_bytes(b"f")
    held = os.open(path, os.O_RDONLY)
    try:
        mm.run(10, "import os; os.remove('/was-a-file')")
        os.mkdir(path)
        assert stat.S_ISDIR(os.stat(path).st_mode)
    finally:
        _close_retired(held)
    os.rmdir(path)


def test_names_the_host_moved_with_their_directory_and_a_tile_retyped(mm):
    """The kernel moves the names under a directory the mount renames; held there, and
    given another type by a tile, they are looked up afresh instead of answering EIO."""
    base = mm.tile(10)
    os.makedirs(base / "from" / "sub")
    (base / "from" / "f").write_bytes(b"f")
    held = [os.open(base / "from" / "sub", os.O_RDONLY), os.open(base / "from" / "f", os.O_RDONLY)]
    try:
        os.rename(base / "from", base / "to")
        mm.run(10, "import os; os.rmdir('/to/sub'); open('/to/sub', 'w').write('x'); "
                   "os.remove('/to/f'); os.mkdir('/to/f')")
        assert stat.S_ISREG(os.stat(base / "to" / "sub").st_mode)
        assert stat.S_ISDIR(os.stat(base / "to" / "f").st_mode)
    finally:
        for fd in held:
            try:
                os.close(fd)
            except OSError:
                pass  # (EIO: the kernel has retired the node of the old type)
    assert tile_tree(mm.booted, 10, "/to") == {"f": None, "sub": file_id(b"x")}
    shutil.rmtree(base / "to")


def test_a_writer_held_open_and_a_tile_replacing_its_file(mm):
    """A handle with writes not yet committed answers for its file's size by path, until a
    tile removes or replaces that file: then the path is the tile's file. (fstat of the
    handle asks by the same name: libfuse's high-level API cannot tell the two apart.)"""
    path = mm.tile(12) / "h"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, b"x" * 100)
        assert os.stat(path).st_size == 100  # what the writer sees
        mm.run(12, "import os; os.remove('/h'); open('/h', 'w').write('hi')")
        assert os.stat(path).st_size == 2
        assert path.read_bytes() == b"hi"
        mm.run(12, "import os; os.remove('/h')")
        assert errno_of(os.stat, path) == errno.ENOENT
        assert not os.path.exists(path)
        os.write(fd, b"more")  # the handle still works, on the file that is gone
    finally:
        os.close(fd)
    assert os.listdir(mm.tile(12)) == []


def test_a_writer_held_open_follows_a_rename_on_its_tile(mm):
    base = mm.tile(13)
    fd = os.open(base / "a", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, b"y" * 50)
        os.fsync(fd)
        mm.run(13, "import os; os.rename('/a', '/b')")
        assert errno_of(os.stat, base / "a") == errno.ENOENT
        os.write(fd, b"z" * 10)
        assert os.stat(base / "b").st_size == 60  # the writer's view, under its new name
    finally:
        os.close(fd)
    assert (base / "b").read_bytes() == b"y" * 50 + b"z" * 10


_REPLACING = {
    # atomic: the name always holds one of the generations
    "rename": """
        for i in range(1, {rounds} + 1):
            with open({path!r} + '.tmp', 'wb') as f:
                f.write(b'g' * i)
            os.rename({path!r} + '.tmp', {path!r})
            for _ in range(4):  # (the host's threads get a look at each generation: a
                for _ in range(5000):  # lookup and then its stat, each a request)
                    pass
                sync()
    """,
    # not atomic: a superstep between the two lets the host find no file there
    "rm+create": """
        for i in range(1, {rounds} + 1):
            os.remove({path!r})
            sync()
            with open({path!r}, 'wb') as f:
                f.write(b'g' * i)
            for _ in range(4):  # (the host's threads get a look at each generation: a
                for _ in range(5000):  # lookup and then its stat, each a request)
                    pass
                sync()
    """,
}


@pytest.mark.parametrize("how", sorted(_REPLACING))
def test_host_lookups_racing_a_tile_replacing_a_file_never_fail_stale(mm, how):
    """A tile replaces a file again and again while host threads stat it, open and read
    it, and hold it open: every answer is one of the generations (or, between a removal
    and the new file, ENOENT), as on a local disk. A name that keeps its type needs no
    ESTALE: the kernel would retry it only once, and the next replacement was often
    already there."""
    rounds = 150
    name = "replaced-" + how.replace("+", "-")
    host_path = mm.chip / name
    host_path.write_bytes(b"g" * rounds)
    program = "import os\n" + textwrap.dedent(_REPLACING[how]).format(rounds=rounds, path="/chip/" + name)
    outcomes: list = []  # sizes seen, or what went wrong
    done = threading.Event()

    def racer(look):
        while not done.is_set():
            try:
                outcomes.append(look())
            except OSError as exc:
                outcomes.append(errno.errorcode.get(exc.errno, exc.errno))

    def read():
        with open(host_path, "rb") as f:
            data = f.read()
        return len(data) if data == b"g" * len(data) else "mixed generations"

    held = open(host_path, "rb")  # a name in use: the kernel cannot drop it
    racers = [threading.Thread(target=racer, args=(look,))
              for look in (lambda: os.stat(host_path).st_size, lambda: os.stat(host_path).st_size, read)]
    for thread in racers:
        thread.start()
    try:
        mm.run(0, program)
    finally:
        done.set()
        for thread in racers:
            thread.join()
        held.close()
    host_path.unlink()
    sizes = {outcome for outcome in outcomes if isinstance(outcome, int)}
    failures = sorted({outcome for outcome in outcomes if not isinstance(outcome, int)}, key=str)
    assert len(sizes) > 10, repr(outcomes)  # (they did race)
    assert all(1 <= size <= rounds for size in sizes), sorted(sizes)
    allowed = ["ENOENT"] if how == "rm+create" else []
    assert set(failures) <= set(allowed), (
        f"{len(outcomes)} lookups: " + ", ".join(f"{outcomes.count(e)} {e}" for e in failures))


def test_listings_and_directories_the_mount_knows_follow_tile_changes(mm):
    base = mm.tile(6)
    os.mkdir(base / "made")  # made here: the mount knows it is empty
    (base / "listed").mkdir()
    (base / "listed" / "old").write_bytes(b"old")
    assert os.listdir(base / "listed") == ["old"]  # a complete listing, kept
    assert errno_of(os.stat, base / "made" / "t") == errno.ENOENT
    mm.run(6, """
        import os
        open('/made/t', 'w').write('tile')
        os.mkdir('/made/sub')
        open('/listed/new', 'w').write('new')
        os.remove('/listed/old')
    """)
    assert (base / "made" / "t").read_text() == "tile"
    assert stat.S_ISDIR(os.stat(base / "made" / "sub").st_mode)
    assert (base / "listed" / "new").read_text() == "new"
    assert errno_of(os.stat, base / "listed" / "old") == errno.ENOENT
    assert sorted(os.listdir(base / "made")) == ["sub", "t"]
    mm.run(6, "import os; os.rmdir('/made/sub'); os.rename('/made/t', '/listed/t')")
    assert os.listdir(base / "made") == [] and errno_of(os.stat, base / "made" / "sub") == errno.ENOENT
    assert sorted(os.listdir(base / "listed")) == ["new", "t"]


def test_directory_mtimes_follow_entries_made_and_removed_from_either_side(mm):
    base = mm.tile(8)
    os.makedirs(base / "dm" / "kept")

    def moved(action) -> bool:
        os.utime(base / "dm", ns=(1, 1))
        assert os.stat(base / "dm").st_mtime_ns == 1
        assert "dm" in os.listdir(base)  # the mount now keeps dm's attributes
        action()
        return os.stat(base / "dm").st_mtime_ns != 1

    assert moved(lambda: (base / "dm" / "host").write_bytes(b"made by the host"))
    assert not moved(lambda: (base / "dm" / "host").write_bytes(b"overwritten"))
    assert moved(lambda: mm.run(8, "open('/dm/tile', 'w').close()"))
    assert not moved(lambda: mm.run(8, "open('/dm/tile', 'a').write('more')"))
    assert moved(lambda: mm.run(8, "import os; os.remove('/dm/tile')"))
    assert moved(lambda: os.rename(base / "dm" / "host", base / "moved"))
    assert moved(lambda: mm.run(8, "import os; os.rmdir('/dm/kept')"))


def test_chip_disk_names_follow_changes_on_tile_0(mm):
    top = mm.chip / "co"
    os.mkdir(top)
    (top / "f").write_bytes(b"chip")
    assert (top / "f").read_bytes() == b"chip"
    mm.run(0, "import os; os.remove('/chip/co/f'); os.rmdir('/chip/co'); open('/chip/co', 'w').write('now a file')")
    assert stat.S_ISREG(os.stat(top).st_mode) and top.read_text() == "now a file"
    # tile 0's own disk is another filesystem with the same paths inside
    assert errno_of(os.stat, mm.tile(0) / "co") == errno.ENOENT
    os.unlink(top)


def test_a_long_running_tile_program_and_a_host_reader_agree_throughout(mm):
    """A tile program changes names step by step; after each step the host checks."""
    base = mm.tile(7)
    for step in range(6):
        name = f"s{step}"
        mm.run(7, f"""
            import os
            for old in os.listdir('/'):
                os.remove('/' + old)
            open('/{name}', 'w').write('{step}' * {step + 1})
        """)
        assert os.listdir(base) == [name]
        assert (base / name).read_text() == str(step) * (step + 1)
        for other in range(step):
            assert errno_of(os.stat, base / f"s{other}") == errno.ENOENT


def test_an_open_descriptor_reads_what_was_appended_since(mm):
    """tail -f, and a+ reading back its own appends: a littlefs handle sees the file as it
    was when opened, so a read at its end must look again."""
    base = mm.tile(14)
    (base / "log").write_text("start\n")
    with open(base / "log", "rb") as follower:
        assert follower.read() == b"start\n"
        mm.run(14, "open('/log', 'a').write('from the tile\\n')")
        with open(base / "log", "ab") as other:
            other.write(b"from the host\n")
        assert follower.read() == b"from the tile\nfrom the host\n"
        assert os.fstat(follower.fileno()).st_size == 34
    with open(base / "log", "a+") as both:
        both.write("own\n")
        both.flush()
        both.seek(0)
        assert both.read() == "start\nfrom the tile\nfrom the host\nown\n"
        assert os.lseek(both.fileno(), 0, os.SEEK_END) == 38


# -- in-process: what the mount does ------------------------------------------------------------

_CREATES = """
import os, sys
root, count = sys.argv[1], int(sys.argv[2])
os.mkdir(root + "/tiles/1/many")
for i in range(count):
    os.close(os.open(f"{root}/tiles/1/many/f{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
for i in range(count):
    os.stat(f"{root}/tiles/1/many/f{i}")
print("null")
"""


@pytest.fixture
def tiny(fuse_session):
    yield from in_process_mount("tiny")


@pytest.fixture
def one_thread(fuse_session, monkeypatch):
    """``tiny`` served by a single libfuse thread."""
    monkeypatch.setattr(_mount, "fuse_options", functools.partial(fuse_options, max_threads=1))
    yield from in_process_mount("tiny")


def test_libfuses_hiding_is_told_from_a_users_rename_on_a_single_thread(one_thread):
    # with one libfuse thread, the lookup of a rename's new name and the rename itself are
    # served by the same thread, one after the other, as libfuse's own check of a free
    # name and its hiding rename are
    result = one_thread.child("""
        import json, os, sys
        base = sys.argv[1] + "/tiles/5"
        with open(base + "/kept", "w") as f:
            f.write("kept")
        with open(base + "/gone", "w") as f:
            f.write("gone")
        kept, gone = os.open(base + "/kept", os.O_RDONLY), os.open(base + "/gone", os.O_RDONLY)
        os.rename(base + "/kept", base + "/.fuse_hidden0000000500000001")
        os.unlink(base + "/gone")
        listed = sorted(os.listdir(base))
        still = [os.pread(kept, 10, 0).decode(), os.pread(gone, 10, 0).decode()]
        os.close(kept); os.close(gone)
        print(json.dumps([listed, still, sorted(os.listdir(base))]))
    """)
    assert result == [[".fuse_hidden0000000500000001"], ["kept", "gone"], [".fuse_hidden0000000500000001"]]
    assert one_thread.machine.fs.listdir(5, "/") == [".fuse_hidden0000000500000001"]


def test_a_create_is_one_request_and_a_stat_one(tiny):
    operations = tiny.active.operations
    tiny.child("import os, sys; os.stat(sys.argv[1] + '/tiles/1'); print('null')")
    before = operations.requests
    tiny.child(_CREATES, 20)
    # the mkdir (its lookup, the tile's mount table, mkdir, its attributes); per file an
    # open and its close, then one stat; nothing for the directories around or new names
    assert operations.requests - before == 4 + 20 * 2 + 20


_HOLD_THEN_OPEN = """
import json, os, sys
path = sys.argv[1] + "/tiles/5/held"
held = os.open(path, os.O_RDONLY)  # (the kernel keeps a name in use, whatever it is told)
print("held", flush=True)
sys.stdin.readline()  # (a tile removes the file meanwhile)
try:
    os.close(os.open(path, int(sys.argv[2])))
    print(json.dumps(None), flush=True)
except OSError as exc:
    print(json.dumps(exc.errno), flush=True)
sys.stdin.readline()  # (its requests are counted meanwhile)
"""


def _open_held_name_of_removed_file(mounted: InProcessMount, flags: int) -> tuple[int | None, int]:
    """A child holds ``/tiles/5/held`` open, a tile removes the file, and the child opens
    the name again with ``flags``: the errno (None if it opened) and the requests made."""
    machine = mounted.machine
    machine.fs.write_file(5, "/held", b"old")
    child = subprocess.Popen([sys.executable, "-c", _HOLD_THEN_OPEN, mounted.path, str(flags)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "held\n"
        operations = mounted.active.operations
        # the kernel still keeps the name when the open comes (as it does until it has
        # been told to forget it, which is done apart from the tile's change)
        operations.hold_notices()
        machine.fs.remove(5, "/held")
        before = operations.requests
        child.stdin.write("open\n")
        child.stdin.flush()
        failed = json.loads(child.stdout.readline())
        requests = operations.requests - before
        child.communicate("exit\n", timeout=60)
    finally:
        mounted.active.operations.release_notices()
        child.kill()
    return failed, requests


def test_an_o_creat_open_of_a_name_whose_file_went_makes_the_file_at_once(tiny, caller_flags_readable):
    """The kernel opens the file it keeps the name of, without O_CREAT (it keeps that
    back); the mount sees the caller asked for it and makes the file in that one request,
    rather than have the kernel retry the open with a lookup and a create, which other
    processes unlinking and making the file meanwhile could fail with ESTALE."""
    failed, requests = _open_held_name_of_removed_file(tiny, os.O_WRONLY | os.O_CREAT)
    assert failed is None
    assert tiny.machine.fs.read_file(5, "/held") == b""
    # the open that found the file gone, the one that made it (and the close at release,
    # if it came yet): no ESTALE, lookups and create
    assert requests <= 3


_UNLINK_THEN_OPEN_INSIDE = """
import json, os, sys
base = sys.argv[1] + "/tiles/6"
with open(base + "/d", "w") as f:
    f.write("a file")
os.unlink(base + "/d")
print("unlinked", flush=True)
sys.stdin.readline()  # (a tile makes a directory there meanwhile)
try:
    with open(base + "/d/log", "w") as f:
        f.write("inside")
    print(json.dumps(None))
except OSError as exc:
    print(json.dumps(exc.errno))
"""


def test_a_directory_a_tile_made_where_a_file_was_just_unlinked_is_walked_into(tiny, caller_flags_readable):
    """An O_CREAT open is told a name just unlinked through the mount is gone (see
    vfs._retries), but not once a tile has made a directory there: its path goes
    through that directory."""
    child = subprocess.Popen([sys.executable, "-c", _UNLINK_THEN_OPEN_INSIDE, tiny.path],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "unlinked\n"
        tiny.machine.fs.makedirs(6, "/d")
        out, _ = child.communicate("go\n", timeout=60)
    finally:
        child.kill()
    assert json.loads(out) is None
    assert tiny.machine.fs.read_file(6, "/d/log") == b"inside"


_TRUNCATE_WHAT_CAME_BACK = """
import os, sys
path = sys.argv[1] + "/tiles/7/t"
with open(path, "w") as f:
    f.write("first")
os.unlink(path)
print("unlinked", flush=True)
sys.stdin.readline()  # (a tile makes the file again meanwhile)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
kept = os.dup(fd)  # (no release yet: only the close's flush)
os.close(fd)
print("closed", flush=True)
sys.stdin.readline()
"""


def test_a_create_that_found_a_file_there_shows_it_truncated_from_the_close(tiny, caller_flags_readable):
    """Told a name just unlinked is gone, an O_CREAT open sends a create, which finds the
    file a tile made again and truncates it: the tile shows it empty from the close on,
    as after any ``open(f, "w")``, not only once the last descriptor goes."""
    child = subprocess.Popen([sys.executable, "-c", _TRUNCATE_WHAT_CAME_BACK, tiny.path],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "unlinked\n"
        tiny.machine.fs.write_file(7, "/t", b"made again")
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "closed\n"
        assert tiny.machine.fs.stat(7, "/t").st_size == 0
        assert tiny.machine.fs.read_file(7, "/t") == b""
        child.communicate("exit\n", timeout=60)
    finally:
        child.kill()


@pytest.fixture
def tiny_read_only(fuse_session):
    yield from in_process_mount("tiny", readonly=True)


def test_a_read_only_mount_makes_no_file_for_an_o_creat_open_that_found_it_gone(tiny_read_only,
                                                                                 caller_flags_readable):
    failed, requests = _open_held_name_of_removed_file(tiny_read_only, os.O_RDONLY | os.O_CREAT)
    assert failed == errno.EROFS
    assert requests == 1  # the open that found the file gone: refused at once
    assert not tiny_read_only.machine.fs.exists(5, "/held")


def test_host_appends_beside_a_tile_holding_the_file_open_all_land(tiny):
    # ``>>`` from the host while a tile program keeps the log open for appending: each
    # handle used to commit its own view of the file at close, and the last one won
    job = tiny.machine.launch(
        "import os\n"
        "log = open('/log', 'a')\n"
        "log.write('tile: start\\n')\n"
        "while not os.path.exists('/go'):\n"
        "    sync()\n"
        "log.write('tile: end\\n')\n"
        "log.close()\n",
        tiles="2",
    )
    tiny.child("""
        import os, sys
        log = sys.argv[1] + "/tiles/2/log"
        while not os.path.exists(log) or not open(log).read():
            pass
        for n in range(3):
            with open(log, "a") as f:
                f.write(f"host >> {n}\\n")
        open(sys.argv[1] + "/tiles/2/go", "w").close()
        print("null")
    """)
    assert job.wait(30).ok
    assert tiny.machine.fs.read_file(2, "/log") == (
        b"tile: start\nhost >> 0\nhost >> 1\nhost >> 2\ntile: end\n")


def test_fstat_of_a_file_replaced_while_open_after_other_descriptors_closed(tiny):
    # libfuse hides a replaced file that is still open; closing some of its descriptors
    # used to leave the hidden name answering from a closed handle: EBADF from fstat
    result = tiny.child("""
        import json, os, sys
        p = sys.argv[1] + "/tiles/1/f"
        seen = set()
        for _ in range(10):
            with open(p, "w") as f:
                f.write("old content\\n")
            fds = [os.open(p, os.O_RDONLY) for _ in range(3)]
            with open(p + ".tmp", "w") as f:
                f.write("new\\n")
            os.rename(p + ".tmp", p)
            os.close(fds[0]); os.close(fds[1])
            seen.add((os.fstat(fds[2]).st_size, os.pread(fds[2], 100, 0).decode()))
            os.close(fds[2])
        print(json.dumps(sorted(seen)))
    """)
    assert result == [[12, "old content\n"]]


def test_stat_after_a_write_ran_out_of_space_beside_a_reader(tiny):
    # the writer's handle is lost by the remount after ENOSPC: stat and fstat answer
    # with the file as committed instead of EIO while it stays open
    result = tiny.child("""
        import json, os, sys
        p = sys.argv[1] + "/tiles/11/big"
        a = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        b = os.open(p, os.O_RDONLY)
        written = 0
        try:
            while True:
                written += os.write(a, b"x" * 1000)
        except OSError as e:
            error = e.errno
        sizes = [os.stat(p).st_size, os.fstat(a).st_size, os.fstat(b).st_size, len(os.pread(b, 1 << 20, 0))]
        os.close(a); os.close(b)
        print(json.dumps([error, written, sizes]))
    """)
    error, written, sizes = result
    assert error == errno.ENOSPC and sizes == [written] * 4, result


def test_only_changes_made_elsewhere_make_the_kernel_forget(tiny):
    operations, fs = tiny.active.operations, tiny.machine.fs
    kernel = operations._kernel
    assert kernel is not None, "the kernel keeps no names on this mount"
    tiny.child(_CREATES, 5)
    sent = kernel.sent
    tiny.child("""
        import os, sys
        d = sys.argv[1] + "/tiles/1/many"
        for i in range(5):
            os.rename(f"{d}/f{i}", f"{d}/g{i}")
        os.unlink(f"{d}/g0")
        os.mkdir(d + "/sub"); os.rmdir(d + "/sub")
        print("null")
    """)
    assert kernel.settle() and kernel.sent == sent  # the kernel saw those itself
    fs.write_file(1, "/many/g1", b"written on the tile")  # a change of contents: nothing
    fs.mkdir(1, "/many/tile-dir")  # a new name: nothing (absent names are never kept)
    assert kernel.settle() and kernel.sent == sent
    fs.remove(1, "/many/g2")
    assert kernel.settle() and kernel.sent == sent + 1
    fs.rename(1, "/many/g3", "/many/h3")  # the name gone, and the one it may have replaced
    assert kernel.settle() and kernel.sent == sent + 3
    got = tiny.child("""
        import os, sys, json
        d = sys.argv[1] + "/tiles/1/many"
        print(json.dumps([sorted(os.listdir(d)), open(d + "/g1").read(), os.path.exists(d + "/g2")]))
    """)
    assert got == [["g1", "g4", "h3", "tile-dir"], "written on the tile", False]


def test_a_restore_under_the_mount_shows_the_restored_files(tiny, tmp_path):
    from ipuos import _backup

    machine = tiny.machine
    tiny.child("""
        import os, sys
        open(sys.argv[1] + "/tiles/3/kept", "w").write("before the backup")
        os.mkdir(sys.argv[1] + "/chip/dir")
        print("null")
    """)
    _backup.backup(machine, str(tmp_path / "b.img"))
    got = tiny.child("""
        import os, sys, json
        r = sys.argv[1]
        os.unlink(r + "/tiles/3/kept"); os.rmdir(r + "/chip/dir")
        open(r + "/tiles/3/later", "w").write("after the backup")
        print(json.dumps([os.listdir(r + "/tiles/3"), os.path.isdir(r + "/chip/dir")]))
    """)
    assert got == [["later"], False]
    _backup.restore(machine, str(tmp_path / "b.img"))
    got = tiny.child("""
        import os, sys, json
        r = sys.argv[1]
        print(json.dumps([os.listdir(r + "/tiles/3"), open(r + "/tiles/3/kept").read(),
                          os.path.exists(r + "/tiles/3/later"), os.path.isdir(r + "/chip/dir")]))
    """)
    assert got == [["kept"], "before the backup", False, True]


def test_a_file_a_restore_brought_back_opens_right_after_a_walk_over_the_mount(tiny, tmp_path):
    """``rm -rf`` of a tree through the mount, a restore that brings it back, a ``find``
    over the mount, then ``cat`` of a restored file: the walk after the restore was
    taken for the kernel's retry of an open of a name just unlinked, and ``cat`` failed
    with ENOENT (for the rest of the half second) while ``ls`` listed the file."""
    from ipuos import _backup

    tiles = os.path.join(tiny.path, "tiles")
    for where in ("3", "4/x"):
        os.makedirs(os.path.join(tiles, where, "tree", "sub", "deeper"))
        with open(os.path.join(tiles, where, "tree", "a.txt"), "w") as f:
            f.write("hello")
        open(os.path.join(tiles, where, "tree", "sub", "deeper", "empty"), "w").close()
    _backup.backup(tiny.machine, str(tmp_path / "b.img"))
    for attempt in range(3):
        subprocess.run(["rm", "-rf", os.path.join(tiles, "3", "tree")], check=True)
        _backup.restore(tiny.machine, str(tmp_path / "b.img"))
        found = subprocess.run(["find", tiles], capture_output=True, text=True, timeout=60)
        assert found.returncode == 0, found.stderr
        cat = subprocess.run(["cat", os.path.join(tiles, "3", "tree", "a.txt")],
                             capture_output=True, text=True, timeout=60)
        assert (cat.returncode, cat.stdout, cat.stderr) == (0, "hello", ""), f"attempt {attempt}"


def _fuse_descriptors(pid: int | str = "self") -> list[str]:
    """What ``pid``'s /dev/fuse and socket descriptors lead to."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:
            continue  # (the listing's own descriptor)
        if target == "/dev/fuse" or target.startswith("socket:"):
            found.append(target)
    return found


def test_unmounting_leaves_no_descriptor_and_no_watcher(fuse_session):
    machine = ipuos.Machine("tiny")
    try:
        before = _fuse_descriptors()
        for _ in range(2):
            with InProcessMount(machine, new_mountpoint()) as first, InProcessMount(machine, new_mountpoint()) as second:
                for mounted in (first, second):
                    mounted.child("import os, sys; os.stat(sys.argv[1] + '/tiles/2'); print('null')")
                    assert mounted.active.operations._kernel is not None
                    # a watchdog holds its own socket to this process, and no other mount's
                    assert len(_fuse_descriptors(mounted.active.watchdog)) == 1
        assert machine.storage.changes.watchers == ()
        # libfuse's /dev/fuse and watchdog sockets are gone with their mounts
        assert sorted(_fuse_descriptors()) == sorted(before)
    finally:
        machine.close()


def test_a_cwd_and_relative_names_in_a_directory_the_tile_changes(tiny):
    fs = tiny.machine.fs
    fs.makedirs(8, "/w/inner")
    source = textwrap.dedent("""
        import os, sys, json
        os.chdir(sys.argv[1] + "/tiles/8/w")
        os.stat("inner")
        print("ready", flush=True)
        sys.stdin.readline()
        out = [os.path.exists("inner"), os.path.exists("made")]
        with open("made", "w") as f:
            f.write("relative")
        out.append(open("made").read())
        print(json.dumps(out))
    """)
    child = subprocess.Popen([sys.executable, "-c", source, tiny.path], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        fs.rmdir(8, "/w/inner")
        fs.write_file(8, "/w/made", b"from the tile")
        fs.remove(8, "/w/made")
        out, err = child.communicate("go\n", timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    assert out.strip() == '[false, false, "relative"]'
    assert fs.read_file(8, "/w/made") == b"relative"


# -- host and tile changes interleaved, against a model ---------------------------------

_NAMES = ["a", "b", "c", "a/x", "a/y", "b/x", "a/x/z"]


def _apply(root: str, kind: str, a: str, b: str, data: bytes):
    """One change under ``root`` with plain os calls: "ok" or the errno."""
    try:
        path = os.path.join(root, a)
        if kind == "mkdir":
            os.mkdir(path)
        elif kind == "rmdir":
            os.rmdir(path)
        elif kind == "rm":
            os.unlink(path)
        elif kind == "write":
            with open(path, "wb") as f:
                f.write(data)
        elif kind == "rename":
            os.rename(path, os.path.join(root, b))
        return "ok"
    except OSError as exc:
        return exc.errno


def _view(root: str) -> dict:
    """What is under ``root``, name by name (stat each, as the kernel would look it up)."""
    out = {}
    for name in _NAMES:
        try:
            st = os.stat(os.path.join(root, name))
        except OSError as exc:
            out[name] = exc.errno
            continue
        if stat.S_ISDIR(st.st_mode):
            out[name] = ("dir", sorted(os.listdir(os.path.join(root, name))))
        else:
            with open(os.path.join(root, name), "rb") as f:
                out[name] = ("file", st.st_size, f.read())
    return out


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_host_and_tile_changes_interleaved_match_a_model(mm, tmp_path, seed):
    """Changes made at random through the mount or by a tile program (which changes the
    same tree on the tile, through its own os module), with lookups, listings and reads
    through the mount after each: everything the mount answers matches a model tree."""
    import random

    rng = random.Random(seed)
    tile = 13 + seed % 3
    base = str(mm.tile(tile))
    for name in os.listdir(base):  # what other tests left there
        path = os.path.join(base, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)
    model = str(tmp_path / "model")
    os.mkdir(model)
    for step in range(120):
        kind = rng.choice(["mkdir", "rmdir", "rm", "write", "rename"])
        a, b = rng.choice(_NAMES), rng.choice(_NAMES)
        data = rng.randbytes(rng.randrange(0, 40))
        expected = _apply(model, kind, a, b, data)
        if rng.random() < 0.5:
            got = _apply(base, kind, a, b, data)
        else:
            program = textwrap.dedent(f"""
                import os
                def apply():
                    try:
                        if {kind!r} == "mkdir": os.mkdir({'/' + a!r})
                        elif {kind!r} == "rmdir": os.rmdir({'/' + a!r})
                        elif {kind!r} == "rm": os.remove({'/' + a!r})
                        elif {kind!r} == "write": open({'/' + a!r}, "wb").write({data!r})
                        elif {kind!r} == "rename": os.rename({'/' + a!r}, {'/' + b!r})
                        return "ok"
                    except OSError as exc:
                        return exc.errno
                print(repr(apply()))
            """)
            got = eval(mm.run(tile, program))
        assert got == expected, f"step {step}: {kind} {a} {b}: got {got}, the model {expected}"
        assert _view(base) == _view(model), f"step {step}: {kind} {a} {b}"
    assert host_tree(base) == tile_tree(mm.booted, tile)


def test_round_trips_with_the_shell_through_tile_0(mm):
    """The shell reaches other tiles' files through tile 0 (/tiles/N, over the exchange)
    and the chip disk on tile 0 itself: what it does is at once what the mount shows."""
    from daemon_harness import run_cli

    def shell(text):
        done = run_cli("shell", "-c", text, env=mm.booted.env())
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        return done.stdout

    (mm.tile(9) / "from-host.txt").write_text("written through the mount\n")
    os.makedirs(mm.chip / "shared", exist_ok=True)
    (mm.chip / "shared" / "note").write_bytes(b"chip bytes")
    assert shell("cat /tiles/9/from-host.txt") == "written through the mount\n"
    assert shell("cat /chip/shared/note") == "chip bytes"
    shell("echo from the shell > /tiles/9/from-shell.txt; mkdir /tiles/9/made; "
          "mv /tiles/9/from-host.txt /tiles/9/made/moved.txt; rm -r /chip/shared")
    assert (mm.tile(9) / "from-shell.txt").read_text() == "from the shell\n"
    assert sorted(os.listdir(mm.tile(9))) == ["from-shell.txt", "made"]
    assert (mm.tile(9) / "made" / "moved.txt").read_text() == "written through the mount\n"
    assert not (mm.chip / "shared").exists()
