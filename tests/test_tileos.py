"""Tile programs and their files: ``open``, the tile ``os`` module, importing from files.

Everything runs through ``Machine.run`` on a tiny machine, so each program is real tile
code on its tile's greenlet, against the tile's own littlefs disk.
"""

from __future__ import annotations

import os
import posixpath
import subprocess
import sys
import textwrap

import pytest

import ipuos


@pytest.fixture(scope="module")
def machine():
    with ipuos.Machine("tiny") as m:
        yield m


def run(machine, source, tiles="0", **kwargs):
    return machine.run(textwrap.dedent(source), tiles=tiles, timeout=30, **kwargs)


def output(result, rank=0):
    tile = result.tiles[rank]
    assert tile.status == "ok", tile.error
    return tile.output


def test_open_writes_the_tiles_own_file(machine):
    result = run(machine, """
        with open(f"/own{__tileid}.txt", "w") as f:
            f.write(f"tile {__physical_tile}\\n")
        print(open(f"/own{__tileid}.txt").read(), end="")
    """, tiles="4-6")
    assert [t.output for t in result.tiles] == ["tile 4\n", "tile 5\n", "tile 6\n"]
    # each tile has its own disk: tile 4 has no file of tile 5
    assert machine.fs.read_file(5, "/own1.txt") == b"tile 5\n"
    assert not machine.fs.exists(4, "/own1.txt")


def test_binary_text_and_print_to_a_file(machine):
    result = run(machine, """
        with open("/data.bin", "wb") as f:
            f.write(bytes(range(5)))
        with open("/log.txt", "a") as log:
            print("one", 1, file=log)
            log.write("two\\n")
        with open("/data.bin", "rb") as f:
            print(list(f.read()))
        for line in open("/log.txt"):
            print(repr(line))
        with open("/data.bin", "r+b") as f:
            f.seek(2)
            f.write(b"X")
            f.seek(0)
            print(f.read(), f.tell())
    """, tiles="1")
    assert output(result) == "[0, 1, 2, 3, 4]\n'one 1\\n'\n'two\\n'\nb'\\x00\\x01X\\x03\\x04' 5\n"


def test_os_module(machine):
    result = run(machine, """
        import os
        os.makedirs("/a/b/c", exist_ok=True)
        os.chdir("/a")
        print(os.getcwd(), os.listdir("."), os.sep)
        with open("b/file", "w") as f:
            f.write("12345")
        st = os.stat("b/file")
        print(st.st_size, st.st_mtime > 0)
        os.rename("b/file", "b/moved")
        os.replace("b/moved", "b/c/final")
        print(sorted(e.name for e in os.scandir("b")))
        print([(top, dirs, files) for top, dirs, files in os.walk("/a")])
        os.truncate("b/c/final", 2)
        os.utime("b/c/final", ns=(0, 42))
        print(os.stat("b/c/final").st_size, os.stat("b/c/final").st_mtime_ns)
        os.remove("b/c/final")
        os.rmdir("b/c")
        os.removedirs("b")  # b only: the parents it names (none), not the cwd /a
        print(os.listdir("/"), os.statvfs("/").f_bsize > 0)
        try:
            os.rmdir("/nothing")
        except FileNotFoundError as e:
            print("ENOENT", e.filename)
        print(os.environ, os.getenv("HOME", "none"), os.name)
    """, tiles="2")
    assert output(result) == (
        "/a ['b'] /\n"
        "5 True\n"
        "['c']\n"
        "[('/a', ['b'], []), ('/a/b', ['c'], []), ('/a/b/c', [], ['final'])]\n"
        "2 42\n"
        "['a'] True\n"
        "ENOENT /nothing\n"
        "{} none posix\n"
    )


def test_os_path_every_import_form(machine):
    result = run(machine, """
        import os.path
        from os import path
        from os.path import join, exists
        import os as o
        print(os.path is path is o.path, join("a", "b"))
        open("/p.txt", "w").write("abc")
        os.chdir("/")
        os.mkdir("/q")
        os.chdir("/q")
        print(exists("/p.txt"), path.isfile("/p.txt"), path.isdir("/q"), path.getsize("/p.txt"))
        print(path.abspath("x"), path.relpath("/p.txt"), path.realpath("../p.txt"))
        print(path.basename("/a/b.py"), path.dirname("/a/b.py"), path.splitext("b.tar.gz"))
        print(path.normpath("/a/./b/../c"), path.expanduser("~/x"), path.getmtime("/p.txt") > 0)
        print(path.exists("/nope"), path.ismount("/"), path.islink("/p.txt"))
        print(path.realpath("../p.txt", strict=True), path.realpath("nope"))
        try:
            path.realpath("nope", strict=True)
        except FileNotFoundError as exc:
            print("strict:", exc.errno, exc.filename)
    """, tiles="3")
    assert output(result) == (
        "True a/b\n"
        "True True True 3\n"
        "/q/x ../p.txt /p.txt\n"
        "b.py /a ('b.tar', '.gz')\n"
        "/a/c ~/x True\n"
        "False True False\n"
        "/p.txt /q/nope\n"
        "strict: 2 nope\n"
    )


def test_host_only_parts_of_os_stay_out(machine):
    result = run(machine, """
        import os
        print(hasattr(os, "system"), hasattr(os, "open"), hasattr(os, "fork"))
        try:
            import os.nothing
        except ImportError as e:
            print("ImportError")
    """)
    assert output(result) == "False False False\nImportError\n"


def test_what_a_tiles_os_lacks_says_why(machine):
    result = run(machine, """
        import os
        for name in ("chmod", "chown", "link", "symlink", "open", "system", "getuid",
                     "sched_getaffinity", "no_such_thing"):
            try:
                getattr(os, name)
            except AttributeError as exc:
                print(exc)
    """)
    lacks = "module 'os' has no attribute {!r} on a tile: tiles have no {}".format
    assert output(result).splitlines() == [
        lacks("chmod", "permission bits"), lacks("chown", "owners"), lacks("link", "hard links"),
        lacks("symlink", "symbolic links"), lacks("open", "file descriptors"),
        lacks("system", "processes"), lacks("getuid", "users"),
        "module 'os' has no attribute 'sched_getaffinity' on a tile: a tile's os has only the "
        "functions of its files (see help(os))",
        "module 'os' has no attribute 'no_such_thing'",
    ]


def test_what_a_tiles_os_path_lacks_says_why(machine):
    result = run(machine, """
        import os
        print(hasattr(os.path, "samestat"), hasattr(os.path, "sameopenfile"))
        for name in ("samestat", "sameopenfile", "genericpath", "no_such_thing"):
            try:
                getattr(os.path, name)
            except AttributeError as exc:
                print(exc)
    """)
    assert output(result).splitlines() == [
        "False False",
        "module 'os.path' has no attribute 'samestat' on a tile: a tile's stat results have no inode "
        "numbers to compare (os.path.samefile compares where paths lead)",
        "module 'os.path' has no attribute 'sameopenfile' on a tile: tiles have no file descriptors",
        "module 'os.path' has no attribute 'genericpath' on a tile: a tile's os.path has only what "
        "applies to its files (see help(os.path))",
        "module 'os.path' has no attribute 'no_such_thing'",
    ]


def test_errors_are_oserrors_with_filenames(machine):
    result = run(machine, """
        import os
        for call in (lambda: open("/missing.txt"), lambda: os.mkdir("/"),
                     lambda: open("/", "w"), lambda: os.listdir("/missing/dir")):
            try:
                call()
            except OSError as e:
                print(type(e).__name__, e.errno, e.filename)
    """, tiles="1")
    assert output(result) == (
        "FileNotFoundError 2 /missing.txt\n"
        "FileExistsError 17 /\n"
        "IsADirectoryError 21 /\n"
        "FileNotFoundError 2 /missing/dir\n"
    )


@pytest.mark.parametrize("where, tile", [("/edges", "3"), ("/tiles/3/edges-remote", "0"), ("/chip/edges", "0")])
def test_os_and_open_match_the_hosts_at_their_edges(machine, where, tile):
    """Each line once did otherwise: "f/." named the file itself (so remove, rename or
    truncate of it acted on the file); removedirs climbed past what it was given into
    the cwd and its parents; '' and None were not the current directory; readlines(hint)
    stopped a line early; a float size was rounded down; buffering=0 was held back on
    another tile."""
    result = run(machine, f"""
        import os
        os.makedirs("{where}", exist_ok=True)
        os.chdir("{where}")
        open("f", "w").write("precious")
        errors = []
        for call in (lambda: os.remove("f/."), lambda: os.rename("f/.", "g"),
                     lambda: os.truncate("f/.", 0), lambda: os.stat("f/.")):
            try:
                call()
            except NotADirectoryError:
                errors.append("ENOTDIR")
        print(errors, open("f").read(), os.path.isdir("f/.."), os.path.exists("f/."))
        os.makedirs("top/work/a/b")
        os.chdir("top/work")
        os.removedirs("a/b")
        print(os.listdir(None), os.getcwd().endswith("top/work"), os.path.abspath("") == os.getcwd(),
              os.path.relpath("x", ""))
        try:
            os.path.relpath("")
        except ValueError as exc:
            print(exc)
        open("lines", "wb").write(b"l1\\nl2\\nl3\\n")
        print(open("lines", "rb").readlines(3), open("lines", "rb").readlines(2))
        for call in (lambda: os.truncate("lines", 1.5), lambda: open("lines", "r+b").truncate(2.5)):
            try:
                call()
            except TypeError:
                print("TypeError")
        try:
            os.truncate("lines", 2**40)
        except OSError as exc:
            print(exc.errno == __import__("errno").EFBIG)
        log = open("log", "ab", buffering=0)
        log.write(b"first")
        print(os.path.getsize("log"), open("log", "rb").read())
        log.close()
    """, tiles=tile)
    assert output(result).splitlines() == [
        "['ENOTDIR', 'ENOTDIR', 'ENOTDIR', 'ENOTDIR'] precious False False",
        "[] True True x",
        "no path specified",
        "[b'l1\\n', b'l2\\n'] [b'l1\\n']",
        "TypeError", "TypeError",
        "True",
        "5 b'first'",
    ]


def test_rename_and_rmdir_of_dot_and_dotdot_give_the_hosts_errors(machine):
    result = run(machine, """
        import os
        os.mkdir("/dots")
        os.chdir("/dots")
        os.mkdir("d")
        open("f", "w").close()
        for call in (lambda: os.rename(".", "x"), lambda: os.rename("d", "x/."), lambda: os.rename("d/.", "y"),
                     lambda: os.rename("f", "d/.."), lambda: os.rmdir("missing/.."), lambda: os.rmdir("d/.."),
                     lambda: os.rmdir("d/.")):
            try:
                call()
            except OSError as exc:
                print(exc.errno, end=" ")
    """, tiles="5")
    assert output(result) == "16 2 16 16 2 39 22 "  # as CPython on Linux: EBUSY ENOENT ... EINVAL


def test_an_uncaught_file_error_is_a_tile_error(machine):
    result = run(machine, "open('/no/such/file')", tiles="0-1")
    assert not result.ok
    assert all("FileNotFoundError" in t.error and "/no/such/file" in t.error for t in result.tiles)


def test_files_left_open_are_closed_when_the_program_ends(machine):
    result = run(machine, """
        f = open("/unclosed.bin", "wb")
        f.write(b"committed at exit")
        g = open("/unclosed.txt", "w")
        g.write("text too")
        keep = [f, g]    # still referenced when the program ends
    """, tiles="6")
    assert result.ok
    assert machine.fs.read_file(6, "/unclosed.bin") == b"committed at exit"
    assert machine.fs.read_file(6, "/unclosed.txt") == b"text too"
    assert [m[4] for m in machine.fs.mounts(6) if m[0] == "/"] == [0]  # nothing left open


def test_each_program_starts_in_the_root(machine):
    run(machine, "import os\nos.mkdir('/somewhere')\nos.chdir('/somewhere')")
    assert output(run(machine, "import os\nprint(os.getcwd())")) == "/\n"


def test_a_repls_current_directory_is_its_own(machine):
    # (the tile's VFS held one cwd: another repl's chdir moved this one, and any program
    # on the tile sent it back to /)
    mine, other = machine.repl("2"), machine.repl("2")
    assert mine.run("import os; os.makedirs('/mine', exist_ok=True); os.chdir('/mine'); "
                    "open('note', 'w').write('here')").ok
    assert other.run("import os; os.makedirs('/other', exist_ok=True); os.chdir('/other')").ok
    run(machine, "x = 1", tiles="2")  # a program, touching no file
    run(machine, "import os; os.chdir('/other')", tiles="2")
    assert mine.run("print(os.getcwd(), open('note').read())").outputs() == {2: "/mine here\n"}
    assert other.run("print(os.getcwd())").outputs() == {2: "/other\n"}
    assert output(run(machine, "import os; print(os.getcwd())", tiles="2")) == "/\n"


def test_a_repl_whose_first_block_touched_no_file_keeps_its_cwd(machine):
    lazy = machine.repl("3")
    assert lazy.run("x = 1").ok  # its session has no VFS yet
    run(machine, "import os; os.makedirs('/elsewhere', exist_ok=True); os.chdir('/elsewhere')",
        tiles="3")
    assert lazy.run("import os; print(os.getcwd())").outputs() == {3: "/\n"}


def test_files_are_shared_between_programs_and_the_host(machine):
    machine.fs.write_file(7, "/from_host.txt", b"written by the host")
    result = run(machine, """
        print(open("/from_host.txt").read())
        open("/from_tile.txt", "w").write("written by tile 7")
    """, tiles="7")
    assert output(result) == "written by the host\n"
    assert machine.fs.read_file(7, "/from_tile.txt") == b"written by tile 7"


def put_files(machine, tile: int, files: dict[str, bytes]) -> None:
    """Write ``files`` (path: bytes) on ``tile``'s disk, making their directories."""
    for path, data in files.items():
        machine.fs.makedirs(tile, posixpath.dirname(path), exist_ok=True)
        machine.fs.write_file(tile, path, data)


def test_import_from_lib_and_the_cwd(machine):
    put_files(machine, 8, {
        "/lib/helper.py": b"WHERE = __file__\n",
        "/lib/libonly.py": b"def twice(x):\n    return 2 * x\n",
        "/lib/pkg/__init__.py": b"from pkg import sub\nNAME = 'pkg'\n",
        "/lib/pkg/sub.py": b"VALUE = 7\n",
        "/work/local.py": b"print('local runs on tile', __physical_tile)\n",
        "/helper.py": b"WHERE = 'the cwd wins'\n",
        "/lib/both.py": b"KIND = 'module'\n",
        "/lib/both/__init__.py": b"KIND = 'package'\n",
    })
    result = run(machine, """
        import helper
        print(helper.WHERE)
        import os
        os.chdir("/lib")
        # already imported: the same module, not the one in the new cwd
        import helper as again
        from libonly import twice
        print(again is helper, twice(21))
        import pkg, pkg.sub
        from pkg.sub import VALUE
        print(pkg.NAME, pkg.sub.VALUE, VALUE, pkg.__path__)
        import both        # a package beside a module of its name wins, as on the host
        print(both.KIND)
        os.chdir("/work")
        import local
        import json        # standard modules still win over files
        print(json.dumps([1]))
    """, tiles="8")
    assert output(result) == (
        "the cwd wins\n"
        "True 42\n"
        "pkg 7 7 ['/lib/pkg']\n"
        "package\n"
        "local runs on tile 8\n"
        "[1]\n"
    )


def test_star_imports_and_packages_as_on_the_host(machine):
    put_files(machine, 11, {
        "/lib/spkg/__init__.py": b"__all__ = ['sub', 'Y']\nY = 2\n",
        "/lib/spkg/sub.py": b"Z = 3\n",
        "/lib/helpers.py": b"import json\ndef double(x):\n    return 2 * x\n",
        "/lib/plain.py": b"A = 1\n",
    })
    result = run(machine, """
        from functools import reduce
        from helpers import *            # its own public names only, not the tile's
        print(reduce(lambda a, b: a + b, [1, 2, 3]), double(4), json.dumps(1))
        print(sorted(n for n in dir() if not n.startswith("_") and n not in (
            "reduce", "double", "json", "sync", "barrier", "send", "recv", "sendrecv", "poll", "alltoall",
            "allgather", "bcast", "gather", "scatter", "allreduce", "scan", "exscan", "print", "open")))
        from spkg import *               # __all__ names a submodule not imported yet
        print(sub.Z, Y)
        for statement in ("import plain.sub", "from plain.x import y", "import spkg.nothing",
                          "import not_anywhere"):
            try:
                exec(statement)
            except ModuleNotFoundError as exc:
                print(type(exc).__name__, exc.name, "not a package" in str(exc))
    """, tiles="11")
    assert output(result) == (
        "6 8 1\n"
        "[]\n"
        "3 2\n"
        "ModuleNotFoundError plain.sub True\n"
        "ModuleNotFoundError plain.x True\n"
        "ModuleNotFoundError spkg.nothing False\n"
        "ModuleNotFoundError not_anywhere False\n"
    )


def test_modules_with_a_bom_or_a_coding_line_import(machine):
    # the encoding is the module's own (PEP 263), as CPython's importer reads it
    machine.fs.makedirs(13, "/lib", exist_ok=True)
    machine.fs.write_file(13, "/lib/bom.py", "\ufeffWORD = 'caf\u00e9'\n".encode("utf-8"))
    machine.fs.write_file(13, "/lib/latin.py",
                          "# -*- coding: latin-1 -*-\nWORD = 'caf\u00e9'\n".encode("latin-1"))
    result = run(machine, """
        import bom, latin
        print(bom.WORD == latin.WORD == 'caf\\u00e9')
    """, tiles="13")
    assert output(result) == "True\n"


def test_file_misuse_raises_what_the_hosts_files_raise(machine):
    # on the tile's own disk, the chip disk and another tile's disk alike; errors name
    # the file as the program wrote it
    result = run(machine, """
        import os, errno
        def outcome(call):
            try:
                call()
            except Exception as e:
                return type(e).__name__, getattr(e, "errno", None), getattr(e, "filename", None)
            return "no error"
        for base in ("/", "/chip/", "/tiles/3/"):
            os.makedirs(base + "w", exist_ok=True)
            os.chdir(base + "w")
            with open("a.bin", "wb") as f:
                print(outcome(f.read), outcome(lambda: f.seek(1.5)), outcome(lambda: f.seek(0, 5)))
            with open("a.bin", "rb") as f:
                print(outcome(lambda: f.write(b"x")), outcome(lambda: f.truncate(0)),
                      outcome(lambda: f.seek(2**40)))
            open("f.txt", "w").close()
            print(outcome(lambda: os.makedirs("f.txt/a/b")), outcome(lambda: open("gone.bin")))
            for name in ("a.bin", "f.txt"):
                os.remove(name)
            os.chdir("..")
            os.rmdir("w")
    """, tiles="0")
    expected = (
        "('UnsupportedOperation', 9, 'a.bin') ('TypeError', None, None) ('OSError', 22, 'a.bin')\n"
        "('UnsupportedOperation', 9, 'a.bin') ('UnsupportedOperation', 9, 'a.bin') ('OSError', 22, 'a.bin')\n"
        "('NotADirectoryError', 20, 'f.txt/a') ('FileNotFoundError', 2, 'gone.bin')\n"
    )
    assert output(result) == expected * 3


def test_a_missing_module_is_a_clear_import_error(machine):
    result = run(machine, "import not_anywhere", tiles="9")
    error = result.tiles[0].error
    assert "ModuleNotFoundError: no module named 'not_anywhere' on this tile" in error  # (as the host's)
    assert "/lib" in error


@pytest.mark.parametrize("call, error", [
    ('__import__("")', "ValueError: Empty module name"),
    ('__import__(".")', "ModuleNotFoundError: no module named '.'"),
    ('__import__("..")', "ModuleNotFoundError: no module named '..'"),
    ('__import__("sub/x")', "ModuleNotFoundError: no module named 'sub/x'"),
    ('__import__("/lib/sub/x")', "ModuleNotFoundError: no module named '/lib/sub/x'"),
    ('__import__("sub..x")', "ModuleNotFoundError: no module named 'sub.'"),
    ('__import__("sub.")', "ModuleNotFoundError: no module named 'sub.'"),
    ('__import__("sub./x")', "ModuleNotFoundError: no module named 'sub./x'"),
    ('__import__(b"sub")', "TypeError: module name must be a string"),
    ('__import__("sub", fromlist=["/x"]).__dict__["/x"]', "KeyError: '/x'"),
])
def test_a_module_name_no_file_can_have_imports_nothing(machine, call, error):
    # as the host's: a name is no path, and an empty part names no module (the files
    # /lib/__init__.py and /lib/sub/x.py would otherwise be run for them)
    put_files(machine, 12, {"/lib/__init__.py": b"print('ran /lib/__init__.py')\n",
                            "/lib/sub/__init__.py": b"", "/lib/sub/x.py": b"X = 1\n"})
    result = run(machine, call, tiles="12")
    assert result.tiles[0].output == ""
    assert error in result.tiles[0].error.splitlines()[-1]


def test_errors_in_imported_modules_point_at_their_file(machine):
    machine.fs.makedirs(10, "/lib", exist_ok=True)
    machine.fs.write_file(10, "/lib/broken.py", b"x = 1\nraise RuntimeError('inside the module')\n")
    result = run(machine, "import broken", tiles="10")
    error = result.tiles[0].error
    assert 'File "/lib/broken.py", line 2' in error and "RuntimeError: inside the module" in error
    # a failed import leaves nothing behind: importing again runs it again
    result = run(machine, "try:\n    import broken\nexcept RuntimeError:\n    import broken\n",
                 tiles="10")
    assert "RuntimeError" in result.tiles[0].error


def test_a_program_on_tile_0_reaches_every_tile(machine):
    machine.fs.write_file(11, "/note", b"on tile 11")
    result = run(machine, """
        import os
        print(len(os.listdir("/tiles")), sorted(os.listdir("/"))[-1])
        print(open("/tiles/11/note").read())
        with open("/tiles/12/from0", "w") as f:
            for n in range(3):
                print("line", n, file=f)
    """)
    assert output(result) == "16 tiles\non tile 11\n"
    assert machine.fs.read_file(12, "/from0") == b"line 0\nline 1\nline 2\n"


def test_tile_0s_mount_points_have_times_of_their_own(machine):
    """``ls -l /`` on tile 0: ``/chip`` shows the chip disk's root, ``/tiles`` the time it
    was mounted, as does each tile in its listing; none shows the epoch."""
    result = run(machine, """
        import os
        listed = {e.name: e.stat().st_mtime_ns for e in os.scandir("/")}
        print(listed["chip"] == os.stat("/chip").st_mtime_ns, listed["tiles"] == os.stat("/tiles").st_mtime_ns)
        print(min(listed.values()) > 10**18, min(e.stat().st_mtime_ns for e in os.scandir("/tiles")) > 10**18)
    """)
    assert output(result) == "True True\nTrue True\n"


def test_a_dropped_file_is_committed_before_anything_looks_at_it(machine):
    handle = machine.launch(textwrap.dedent("""
        import os
        open("/b.bin", "wb").write(b"12345")
        open("/t.txt", "w").write("abc")
        print(os.path.getsize("/b.bin"), os.path.getsize("/t.txt"), open("/t.txt").read())
        open("/for_host.txt", "w").write("seen by the host while the program runs")
        while not os.path.exists("/stop"):
            sync()
    """), tiles="15")
    assert machine.fs.read_file(15, "/for_host.txt") == b"seen by the host while the program runs"
    machine.fs.write_file(15, "/stop", b"")
    assert output(handle.wait(30)) == "5 3 abc\n"


def test_a_dropped_file_that_fails_to_close_says_so_once(machine):
    # the host reports each (``Exception ignored ... OSError: [Errno 28]``): a file
    # on another tile is written at close, and a full disk refuses it then
    try:
        result = run(machine, """
            import os
            os.makedirs("/tiles/14/full", exist_ok=True)
            for i in range(30):
                open(f"/tiles/14/full/f{i}", "wb").write(b"x" * 900)
            print("sizes", [os.path.getsize(f"/tiles/14/full/f{i}") for i in range(30)])
            open("/tiles/14/full/last", "wb").write(b"x" * 900)  # closed as the program ends
        """)
        lines = output(result).splitlines()
        sizes = eval(next(line for line in lines if line.startswith("sizes"))[len("sizes "):])
        lost = [f"/tiles/14/full/f{i}" for i, size in enumerate(sizes) if size == 0]
        assert lost and len(lost) < 30
        told = lines[:lines.index(next(line for line in lines if line.startswith("sizes")))]
        assert told == [f"warning: closing {name!r} (dropped without close()) failed: "
                        f"[Errno 28] No space left on device: {name!r}" for name in lost]
        assert lines[-1] == ("warning: closing '/tiles/14/full/last' at exit failed: "
                             "[Errno 28] No space left on device: '/tiles/14/full/last'")
    finally:
        run(machine, "import shutil; shutil.rmtree('/tiles/14/full', ignore_errors=True)")


def test_a_repls_dropped_file_that_fails_to_close_is_told_by_its_block(machine):
    repl = machine.repl("0")
    try:
        assert repl.run(textwrap.dedent("""
            import os
            os.makedirs("/tiles/14/full", exist_ok=True)
            try:
                for i in range(30):
                    with open(f"/tiles/14/full/g{i}", "wb") as f:
                        f.write(b"x" * 900)
            except OSError:
                pass
        """)).ok
        # closed as the block ends (CPython would have closed it at once): told there
        dropped = repl.run('open("/tiles/14/full/late", "wb").write(b"x" * 900)')
        told = ("warning: closing '/tiles/14/full/late' (dropped without close()) failed: "
                "[Errno 28] No space left on device: '/tiles/14/full/late'\n")
        assert dropped.outputs() == {0: "900\n" + told}
        assert repl.run("pass").outputs() == {0: ""}
    finally:
        repl.close()
        run(machine, "import shutil; shutil.rmtree('/tiles/14/full', ignore_errors=True)")


def test_os_walk_from_tile_0_root_terminates_and_tiles_0_is_its_own_disk_only():
    from ipuos import Machine

    with Machine("tiny") as machine:
        result = machine.run(
            "import os\n"
            "open('/mine.txt', 'w').write('x')\n"
            "seen = [d for d, _, _ in os.walk('/')]\n"
            "print(len(seen) > 16, sorted(os.listdir('/tiles/0')), os.path.exists('/tiles/0/chip'))\n"
            "print(any(d.startswith('/tiles/0/tiles') for d in seen))\n",
            tiles="0", timeout=60,
        )
        assert result.ok, result.format()
        assert result.tiles[0].output == "True ['mine.txt'] False\nFalse\n"


#: glob, pathlib and shutil through their public API, printing what they return and
#: raise with the root written as "@"; the test runs it on a tile and on the host
_STDLIB_PARITY = r'''
import glob, os, shutil
from pathlib import Path


def show(*values):
    print(*[repr(v).replace(ROOT, "@") for v in values])


def attempt(call):
    try:
        show(call())
    except Exception as exc:  # noqa: BLE001
        show(type(exc).__name__, getattr(exc, "errno", None), getattr(exc, "filename", None))


os.makedirs(ROOT + "/d/sub/deep")
os.makedirs(ROOT + "/d/.h")
for name in ("a.txt", "b.py", ".hidden", "sub/c.txt", "sub/deep/e.txt", ".h/x.txt"):
    with open(f"{ROOT}/d/{name}", "w") as f:
        f.write(name * 3)
os.chdir(ROOT + "/d")
for pattern, options in [
    ("*", {}), ("**/*.txt", {"recursive": True}), ("**", {"recursive": True}),
    ("**/", {"recursive": True}), ("*/", {}), (".*", {}), ("[ab]*", {}), ("?.py", {}),
    ("sub/*/e*", {}), ("sub/deep", {}), ("nothing", {}), ("", {}), ("a.txt/", {}),
    ("**/*.txt", {"recursive": True, "include_hidden": True}), ("**/*.txt", {}),
    (ROOT + "/d/s*/*", {}), ("*.txt", {"root_dir": ROOT + "/d/sub"}),
    ("**", {"root_dir": ROOT + "/d", "recursive": True}),
]:
    show(pattern, sorted(glob.glob(pattern, **options)))
show(glob.escape("a[b]*?.txt"), glob.has_magic("x[y"), sorted(glob.iglob("*.py")))

here = Path(ROOT) / "d"
show(sorted(str(p) for p in here.glob("**")), sorted(str(p) for p in here.glob("*/")))
show(sorted(str(p) for p in here.rglob("*.txt")), sorted(str(p) for p in here.glob("sub/*")))
show(sorted(p.name for p in here.iterdir()), (here / "a.txt").read_text(), (here / "b.py").read_bytes())
show((here / "new.txt").write_text("fresh"), (here / "new.bin").write_bytes(b"\0\1"))
show((here / "a.txt").exists(), (here / "no").exists(), here.is_dir(), (here / "a.txt").is_file(),
     (here / "a.txt").is_symlink(), (here / "no").is_dir(), (here / "a.txt").stat().st_size)
show(Path("sub/../x").resolve(), Path("sub").absolute(), Path.cwd(), (here / "b.py").samefile("b.py"))
attempt(lambda: (here / "a.txt").touch(exist_ok=False))
attempt(lambda: (here / "t1").touch())
attempt(lambda: (here / "p/q").mkdir())
attempt(lambda: (here / "p/q").mkdir(parents=True))
attempt(lambda: (here / "p/q").mkdir(parents=True))
attempt(lambda: (here / "p/q").mkdir(parents=True, exist_ok=True))
attempt(lambda: (here / "a.txt").mkdir(exist_ok=True))
attempt(lambda: (here / "gone").unlink())
attempt(lambda: (here / "gone").unlink(missing_ok=True))
attempt(lambda: (here / "t1").rename(here / "t2"))
attempt(lambda: (here / "t2").replace(here / "new.bin"))
attempt(lambda: (here / "p").rmdir())
attempt(lambda: list(here.glob("")))
attempt(lambda: list(here.glob("/abs")))
attempt(lambda: (here / "b.py").write_text(b"bytes"))

attempt(lambda: shutil.copytree(ROOT + "/d/sub", ROOT + "/copy"))
show(sorted(glob.glob(ROOT + "/copy/**", recursive=True)))
attempt(lambda: shutil.copytree(ROOT + "/d/sub", ROOT + "/copy"))
attempt(lambda: shutil.copytree(ROOT + "/d", ROOT + "/copy", dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("*.py", ".h*", "p")))
show(sorted(glob.glob(ROOT + "/copy/**", recursive=True, include_hidden=True)))
attempt(lambda: shutil.copy(ROOT + "/d/a.txt", ROOT + "/copy"))
attempt(lambda: shutil.copy2(ROOT + "/d/b.py", ROOT + "/copy/b2.py"))
show(os.stat(ROOT + "/d/b.py").st_mtime == os.stat(ROOT + "/copy/b2.py").st_mtime)
attempt(lambda: shutil.copyfile(ROOT + "/d/a.txt", ROOT + "/d/a.txt"))
attempt(lambda: shutil.copyfile(ROOT + "/d/missing", ROOT + "/d/x"))
attempt(lambda: shutil.copyfile(ROOT + "/d/a.txt", ROOT + "/d/sub"))
for target in ("/missing/", "/d/missing/", "/d/a.txt/", "/d/sub/"):
    for copier in (shutil.copy, shutil.copyfile):
        try:
            show(copier(ROOT + "/d/a.txt", ROOT + target))
        except OSError as exc:
            show(type(exc).__name__, str(exc))
show(sorted(where for where, dirs, files in os.walk(ROOT + "/d///")))
attempt(lambda: shutil.move(ROOT + "/copy/b2.py", ROOT + "/d/sub"))
attempt(lambda: shutil.move(ROOT + "/copy/a.txt", ROOT + "/d"))
attempt(lambda: shutil.move(ROOT + "/copy", ROOT + "/moved"))
show(sorted(glob.glob(ROOT + "/*")), open(ROOT + "/d/sub/b2.py").read())
failures = []
attempt(lambda: shutil.rmtree(ROOT + "/nothing"))
attempt(lambda: shutil.rmtree(ROOT + "/nothing", ignore_errors=True))
attempt(lambda: shutil.rmtree(ROOT + "/d/a.txt", onerror=lambda f, p, e: failures.append((p, e[0].__name__))))
attempt(lambda: shutil.rmtree(ROOT + "/nothing", onerror=lambda f, p, e: failures.append((p, e[0].__name__))))
show(failures)
attempt(lambda: shutil.move(ROOT + "/d/sub", ROOT + "/d/sub/deep"))
attempt(lambda: shutil.rmtree(ROOT + "/moved"))
show(sorted(os.listdir(ROOT)))
'''


@pytest.mark.parametrize("where, tile", [("/parity", "2"), ("/chip/parity", "0"), ("/tiles/5/parity", "0")])
def test_glob_pathlib_and_shutil_do_on_a_tile_what_they_do_on_the_host(machine, where, tile, tmp_path):
    host_root = str(tmp_path / "parity")
    os.mkdir(host_root)
    host = subprocess.run([sys.executable, "-c", f"ROOT = {host_root!r}\n" + _STDLIB_PARITY],
                          capture_output=True, text=True, timeout=60)
    assert host.returncode == 0, host.stderr
    result = machine.run(f"import os\nos.mkdir({where!r})\nROOT = {where!r}\n" + _STDLIB_PARITY,
                         tiles=tile, timeout=60)
    assert output(result).splitlines() == host.stdout.splitlines()


#: every tile os function the host's takes dir_fd (or the like) for, with the defaults
_DIR_FD_DEFAULTS = r'''
import os
os.chdir(ROOT)
os.mkdir("m", dir_fd=None)
os.mkdir("m/n", 0o777, dir_fd=None)
open("f", "w").write("x")
os.utime("f", ns=(5, 5 * 10**9), dir_fd=None, follow_symlinks=True)
print(os.stat("f", dir_fd=None, follow_symlinks=True).st_mtime, os.lstat("f", dir_fd=None).st_size)
os.rename("f", "g", src_dir_fd=None, dst_dir_fd=None)
os.replace("g", "h", src_dir_fd=None, dst_dir_fd=None)
print(os.access("h", os.R_OK, dir_fd=None, effective_ids=False, follow_symlinks=True))
os.remove("h", dir_fd=None)
open("u", "w").close()
os.unlink("u", dir_fd=None)
os.rmdir("m/n", dir_fd=None)
os.rmdir("m", dir_fd=None)
print(sorted(os.listdir()))
'''


@pytest.mark.parametrize("where, tile", [("/dirfd", "2"), ("/tiles/5/dirfd", "0")])
def test_the_default_dir_fd_is_taken_as_on_the_host(machine, where, tile, tmp_path):
    host = subprocess.run([sys.executable, "-c", f"ROOT = {str(tmp_path)!r}\n" + _DIR_FD_DEFAULTS],
                          capture_output=True, text=True, timeout=60)
    assert host.returncode == 0, host.stderr
    result = machine.run(f"import os\nos.mkdir({where!r})\nROOT = {where!r}\n" + _DIR_FD_DEFAULTS,
                         tiles=tile, timeout=60)
    assert output(result) == host.stdout == "5.0 1\nTrue\n[]\n"


def test_a_dir_fd_is_refused_saying_tiles_have_no_file_descriptors(machine):
    result = run(machine, """
        import os
        open("/dirfd_file", "w").close()
        for call in (lambda: os.mkdir("/x", dir_fd=3), lambda: os.stat("/", dir_fd=3),
                     lambda: os.lstat("/", dir_fd=3), lambda: os.remove("/dirfd_file", dir_fd=3),
                     lambda: os.unlink("/dirfd_file", dir_fd=3), lambda: os.rmdir("/x", dir_fd=3),
                     lambda: os.rename("/dirfd_file", "/y", src_dir_fd=3),
                     lambda: os.replace("/dirfd_file", "/y", dst_dir_fd=3),
                     lambda: os.utime("/dirfd_file", dir_fd=3), lambda: os.access("/", os.F_OK, dir_fd=3)):
            try:
                call()
            except NotImplementedError as exc:
                print(exc)
        print(sorted(os.listdir("/")).count("dirfd_file"), "x" in os.listdir("/"), "y" in os.listdir("/"))
    """, tiles="2")
    assert output(result).splitlines() == [
        "tiles have no file descriptors: mkdir() takes a path, not dir_fd",
        "tiles have no file descriptors: stat() takes a path, not dir_fd",
        "tiles have no file descriptors: stat() takes a path, not dir_fd",
        "tiles have no file descriptors: remove() takes a path, not dir_fd",
        "tiles have no file descriptors: remove() takes a path, not dir_fd",
        "tiles have no file descriptors: rmdir() takes a path, not dir_fd",
        "tiles have no file descriptors: rename() takes a path, not src_dir_fd",
        "tiles have no file descriptors: rename() takes a path, not dst_dir_fd",
        "tiles have no file descriptors: utime() takes a path, not dir_fd",
        "tiles have no file descriptors: access() takes a path, not dir_fd",
        "1 False False",
    ]


#: reads of every size a program may pass, in each mode; the test runs it on a tile and
#: on the host
_READ_SIZES = r'''
open(PATH, "wb").write(b"ab\ncd\nef\n")
open(PATH + ".w", "wb").close()
for mode, buffering in (("rb", -1), ("r", -1), ("rb", 0), ("wb", -1)):
    for call in ("f.read(-5)", "f.read(-1)", "f.read(None)", "f.read(2)", "f.read(1.5)", "f.read('x')",
                 "f.read1(-5)", "f.read1(None)", "f.readline(-5)"):
        with open(PATH + (".w" if "w" in mode else ""), mode, buffering=buffering) as f:
            try:
                result = repr(eval(call))
            except Exception as exc:  # (io.UnsupportedOperation's words differ: its kind counts)
                result = type(exc).__name__ + (f": {exc}" if type(exc) in (ValueError, TypeError) else "")
        print(mode, buffering, call, result)
'''


@pytest.mark.parametrize("where, tile", [("/sizes", "2"), ("/tiles/3/sizes", "0")])
def test_read_sizes_are_taken_as_on_the_host(machine, where, tile, tmp_path):
    # (read(-5) of a buffered binary file once read everything: the host's refuses it)
    host = subprocess.run([sys.executable, "-c", f"PATH = {str(tmp_path / 'f')!r}\n" + _READ_SIZES],
                          capture_output=True, text=True, timeout=60)
    assert host.returncode == 0, host.stderr
    assert "rb -1 f.read(-5) ValueError: read length must be non-negative or -1" in host.stdout
    result = machine.run(f"PATH = {where!r}\n" + _READ_SIZES, tiles=tile, timeout=60)
    tile_lines = output(result).splitlines()
    # (a tile's unbuffered file has read1 where the host's raw file has none)
    expected = [line for line in host.stdout.splitlines() if not line.startswith("rb 0 f.read1")]
    assert [line for line in tile_lines if not line.startswith("rb 0 f.read1")] == expected


def test_tile_pathlib_and_shutil_refuse_what_tiles_lack(machine):
    result = run(machine, """
        import pathlib, shutil, glob
        for call in (lambda: pathlib.Path("/").chmod(0o700), lambda: pathlib.Path("/").owner(),
                     lambda: pathlib.Path("/x").symlink_to("/"), lambda: pathlib.Path.home(),
                     lambda: glob.glob("*", dir_fd=3), lambda: shutil.rmtree("/", dir_fd=3)):
            try:
                call()
            except (NotImplementedError, RuntimeError) as exc:
                print(type(exc).__name__, exc)
        print(hasattr(shutil, "which"), hasattr(shutil, "unpack_archive"), hasattr(shutil, "copymode"))
        print(pathlib.Path("~").expanduser(), isinstance(pathlib.Path("/"), pathlib.PurePosixPath))
    """)
    assert output(result).splitlines() == [
        "NotImplementedError Path.chmod() is unsupported on a tile: its files have no permission bits",
        "NotImplementedError Path.owner() is unsupported on a tile: its files have no owners",
        "NotImplementedError Path.symlink_to() is unsupported on a tile: its files have no symbolic links",
        "RuntimeError Could not determine home directory: tiles have none",
        "NotImplementedError tiles have no file descriptors: pass root_dir instead of dir_fd",
        "NotImplementedError tiles have no file descriptors: rmtree takes a path",
        "False False False",
        "~ True",
    ]


def test_each_program_gets_its_own_pathlib_bound_to_its_tile(machine):
    result = run(machine, """
        from pathlib import Path
        Path(f"/mine{__tileid}").write_text(str(__physical_tile))
        print(sorted(p.name for p in Path("/").glob("mine*")), Path(f"/mine{__tileid}").read_text())
    """, tiles="6-7")
    assert [t.output for t in result.tiles] == ["['mine0'] 6\n", "['mine1'] 7\n"]


def test_a_tiles_paths_pickle_and_travel_and_arrive_as_the_receivers_path(machine):
    # the tile's Path is made for each program under pathlib's name, which pickle's own
    # lookup finds to be the host's class: pickling one failed, and so did sending one
    result = run(machine, """
        import os, pathlib, pickle
        open("/one", "w").close()
        back = pickle.loads(pickle.dumps(pathlib.Path("/a") / "b"))
        got = allgather(pathlib.Path(f"/from{__tileid}"))
        print(type(back) is pathlib.Path, back, [str(p) for p in got], {type(p) is pathlib.Path for p in got})
        for what in (lambda: pickle.dumps(next(os.scandir("/"))), lambda: allgather(list(os.scandir("/")))):
            try:
                what()
            except TypeError as exc:  # (as the host's os.DirEntry: refused when sent, not when it arrives)
                print(exc)
    """, tiles="2-3")
    assert output(result, 1).splitlines() == [
        "True /a/b ['/from0', '/from1'] {True}",
        "cannot pickle 'DirEntry' object",
        "cannot send an object of type list through the exchange: cannot pickle 'DirEntry' object",
    ]


def test_in_memory_streams_and_path_functions_travel_and_a_renamed_class_is_refused_when_sent(machine):
    # a BytesIO and os.path.join were sent, then refused where they arrived ("no module
    # '_io' there"); a class bound under another name went out, and failed on arrival
    result = run(machine, """
        import io, os, pickle
        class A:
            pass
        B = A
        del A
        send(1 - __tileid, [io.BytesIO(b"abc"), io.StringIO("hello"), os.path.join])
        raw, text, join = recv()
        print(raw.getvalue(), text.getvalue(), join("a", "b"))
        for attempt in (lambda: send(1 - __tileid, B()), lambda: pickle.dumps(B())):
            try:
                attempt()
            except (TypeError, pickle.PicklingError) as exc:
                print(type(exc).__name__, exc)
    """, tiles="2-3")
    assert output(result, 1).splitlines() == [
        "b'abc' hello a/b",
        "TypeError cannot send an object of type A through the exchange: Can't pickle <class '__main__.A'>: "
        "attribute lookup A on __main__ failed",
        "PicklingError Can't pickle <class '__main__.A'>: attribute lookup A on __main__ failed",
    ]


def test_dotdot_climbs_out_of_a_removed_current_directory_as_on_the_host(machine):
    result = run(machine, """
        import os
        os.makedirs("/gone/here/deeper")
        os.chdir("/gone/here/deeper")
        os.rmdir("/gone/here/deeper")
        for path in ("../../here", "missing/..", "../missing/.."):
            try:
                os.stat(path)
                print(path, "ok")
            except OSError as exc:
                print(path, type(exc).__name__)
        os.chdir("..")
        print(os.getcwd(), os.listdir("."))
    """, tiles="3")
    assert output(result).splitlines() == [
        "../../here ok", "missing/.. FileNotFoundError", "../missing/.. FileNotFoundError", "/gone/here []"]


def test_os_access_and_renames(machine):
    result = run(machine, """
        import os
        open("/acc", "w").close()
        os.mkdir("/accdir")
        print([os.access("/acc", m) for m in (os.F_OK, os.R_OK, os.W_OK, os.R_OK | os.W_OK, os.X_OK)],
              os.access("/accdir", os.X_OK | os.W_OK), os.access("/none", os.F_OK))
        os.renames("/acc", "/new/parents/acc")
        os.makedirs("/old/empty/below")
        open("/old/empty/below/f", "w").close()
        os.renames("/old/empty/below/f", "/g")
        print(os.listdir("/new/parents"), os.path.exists("/old"), os.path.exists("/g"))
        for call in (lambda: os.access("/", "r"), lambda: os.access("/", os.F_OK, dir_fd=3)):
            try:
                call()
            except (TypeError, NotImplementedError) as exc:
                print(type(exc).__name__)
    """, tiles="4")
    assert output(result).splitlines() == [
        "[True, True, True, True, False] True False",
        "['acc'] False True",
        "TypeError", "NotImplementedError",
    ]


def test_os_access_w_ok_is_false_on_a_read_only_mount():
    with ipuos.Machine("tiny", disk_size=0) as bare:  # "/" is an empty read-only directory
        result = bare.run("import os\nprint(os.access('/', os.R_OK), os.access('/', os.W_OK))", tiles="3")
    assert result.tiles[0].output == "True False\n"


def test_opening_the_root_of_a_tile_without_a_disk_or_tiles_fails_as_on_the_host(tmp_path):
    # "x" on a directory that is there is EEXIST, even where nothing may be written
    # (a tile without a disk has a read-only empty root) or nothing is stored (/tiles)
    opens = """
        for path in PATHS:
            for mode in ("x", "x+", "w", "a", "r+", "r"):
                try:
                    open(path, mode)
                except OSError as exc:
                    print(mode, exc.errno)
    """
    host_paths = ["/", "//", str(tmp_path), str(tmp_path) + "/"]
    host = subprocess.run([sys.executable, "-c", f"PATHS = {host_paths!r}\n" + textwrap.dedent(opens)],
                          capture_output=True, text=True, timeout=60)
    assert host.returncode == 0, host.stderr
    with ipuos.Machine("tiny", disk_size=0) as bare:
        result = bare.run("PATHS = ['/', '//', '/tiles', '/tiles/']\n" + textwrap.dedent(opens), tiles="0",
                          timeout=30)
    assert output(result) == host.stdout


_REMOVED_CWD_PARITY = r'''
import os


def attempt(label, call):
    try:
        value = call()
    except Exception as exc:  # noqa: BLE001
        print(label, type(exc).__name__, getattr(exc, "errno", None))
    else:
        print(label, "ok", value)


os.chdir(ROOT)
os.mkdir("d")
os.mkdir("e")
open("e/f", "w").close()
os.chdir("d")
os.rmdir("../d")
attempt("getcwd", os.getcwd)
attempt("listdir", lambda: (os.listdir(), os.listdir("."), os.listdir("./"), os.listdir("..")))
attempt("scandir", lambda: [entry.name for entry in os.scandir(".")])
attempt("walk", lambda: list(os.walk(".")))
attempt("stat", lambda: (os.path.isdir("."), os.path.isdir("./.."), os.path.exists("x"), os.access(".", os.W_OK)))
for path in ("x", "./x", ".", "x/.."):
    for mode in ("r", "w", "a", "x", "r+"):
        attempt(f"open {path} {mode}", lambda: open(path, mode).close())
for label, call in [
    ("mkdir x", lambda: os.mkdir("x")), ("mkdir .", lambda: os.mkdir(".")), ("mkdir x/", lambda: os.mkdir("x/")),
    ("makedirs a/b", lambda: os.makedirs("a/b")), ("makedirs . exist_ok", lambda: os.makedirs(".", exist_ok=True)),
    ("rmdir .", lambda: os.rmdir(".")), ("remove .", lambda: os.remove(".")), ("remove x", lambda: os.remove("x")),
    ("rename . ../y", lambda: os.rename(".", "../y")), ("rename x y", lambda: os.rename("x", "y")),
    ("rename ../e/f g", lambda: os.rename("../e/f", "g")), ("rename ../e/f ./g", lambda: os.rename("../e/f", "./g")),
    ("truncate .", lambda: os.truncate(".", 0)), ("utime .", lambda: os.utime(".")),
    ("utime x", lambda: os.utime("x")), ("statvfs .", lambda: os.statvfs(".").f_bsize > 0),
    ("stat x/..", lambda: os.stat("x/..").st_size >= 0), ("abspath x", lambda: os.path.abspath("x")),
    ("realpath x", lambda: os.path.realpath("x")), ("relpath /", lambda: os.path.relpath("/")),
    ("open ../e/f", lambda: open("../e/f").read()), ("open ../z w", lambda: open("../z", "w").close()),
    ("chdir .", lambda: os.chdir(".")), ("getcwd again", os.getcwd),
    # made again: still not the directory this program is in
    ("mkdir ../d", lambda: os.mkdir("../d")),
    ("helper", lambda: open("../d/helper_of_a_removed_cwd.py", "w").write("X = 1")),
    ("import", lambda: __import__("helper_of_a_removed_cwd").X),
    ("listdir made again", lambda: os.listdir(".")), ("open x w made again", lambda: open("x", "w").close()),
    ("getcwd made again", os.getcwd),
    ("chdir ..", lambda: os.chdir("..")), ("getcwd after", lambda: os.getcwd() == ROOT),
    ("listdir after", lambda: sorted(os.listdir("."))),
]:
    attempt(label, call)
'''


@pytest.mark.parametrize("where, tile", [("/removed-cwd", "3"), ("/chip/removed-cwd", "0"),
                                         ("/tiles/5/removed-cwd", "0")])
def test_a_removed_current_directory_is_empty_and_nameless_as_on_the_host(machine, where, tile, tmp_path):
    host, on_tile = _on_the_host_and_a_tile(machine, _REMOVED_CWD_PARITY, where, tile, tmp_path)
    assert on_tile == host


def _on_the_host_and_a_tile(machine, program: str, where: str, tile: str, tmp_path):
    """The lines ``program`` prints with ``ROOT`` an empty directory: on the host, and on
    ``tile`` at ``where`` (made here)."""
    host_root = str(tmp_path / "root")
    os.mkdir(host_root)
    host = subprocess.run([sys.executable, "-c", f"ROOT = {host_root!r}\n" + program],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert host.returncode == 0, host.stderr
    result = machine.run(f"import os\nos.mkdir({where!r})\nROOT = {where!r}\n" + program, tiles=tile, timeout=60)
    return host.stdout.splitlines(), output(result).splitlines()


_RENAMED_CWD_PARITY = """
import os
os.chdir(ROOT)
os.makedirs("a/sub")
os.chdir("a/sub")
os.rename(ROOT + "/a", ROOT + "/b")  # the directory moves, and the current one with it
print(os.getcwd()[len(ROOT):])
os.mkdir(ROOT + "/a")  # another directory under the old name
with open("here", "w") as file:
    file.write("x")
print(sorted(os.listdir(ROOT + "/b/sub")), sorted(os.listdir(ROOT + "/a")))
os.chdir("..")
print(os.getcwd()[len(ROOT):], sorted(os.listdir(".")))
"""


@pytest.mark.parametrize("where, tile", [("/renamed-cwd", "12"), ("/chip/renamed-cwd", "0")])
def test_a_renamed_current_directory_is_followed_as_on_the_host(machine, where, tile, tmp_path):
    host, on_tile = _on_the_host_and_a_tile(machine, _RENAMED_CWD_PARITY, where, tile, tmp_path)
    assert host[0] == "/b/sub"
    assert on_tile == host


def test_a_repls_next_block_is_still_in_its_removed_directory(machine):
    # as on the host, whoever removed it and whatever ran on the tile between the blocks
    is_removed = """
try:
    os.getcwd()
except FileNotFoundError:
    print("removed", os.listdir("."))
"""
    itself, by_host, by_host_later = machine.repl("4"), machine.repl("4"), machine.repl("4")
    assert itself.run("import os; os.mkdir('/left'); os.chdir('/left'); os.rmdir('/left'); "
                      "os.mkdir('/left'); open('/left/new', 'w').close()").ok
    assert by_host.run("import os; os.mkdir('/gone1'); os.chdir('/gone1')").ok
    machine.fs.rmdir(4, "/gone1")
    assert by_host_later.run("import os; os.mkdir('/gone2'); os.chdir('/gone2')").ok
    run(machine, "import os; os.chdir('/left')", tiles="4")  # another program, in the one made again
    machine.fs.rmdir(4, "/gone2")
    for repl in (itself, by_host, by_host_later):
        assert repl.run(is_removed).outputs() == {4: "removed []\n"}


def test_a_file_removed_while_open_lives_on_for_its_handles_and_stamps_nothing(machine):
    result = run(machine, """
        import os
        f = open("/orphan.txt", "w+")
        f.write("first ")
        f.flush()
        os.remove("/orphan.txt")
        with open("/orphan.txt", "w") as g:  # another file at its name
            g.write("new")
        os.utime("/orphan.txt", (1, 1))
        f.write("second")
        f.seek(0)
        print(f.read())
        f.close()  # (stamps no mtime on the file that took its name)
        print(open("/orphan.txt").read(), os.stat("/orphan.txt").st_mtime, os.listdir("/").count("orphan.txt"))
        os.remove("/orphan.txt")
    """)
    assert output(result) == "first second\nnew 1.0 1\n"


def test_tile_shutil_lacks_say_why(machine):
    result = run(machine, """
        import shutil
        for name in ("copymode", "chown", "which", "make_archive", "disk_usage", "no_such_thing"):
            try:
                getattr(shutil, name)
                print(name, "present")
            except AttributeError as exc:
                print(exc)
    """)
    assert output(result).splitlines() == [
        "module 'shutil' has no attribute 'copymode' on a tile: its files have no permission bits",
        "module 'shutil' has no attribute 'chown' on a tile: its files have no owners",
        "module 'shutil' has no attribute 'which' on a tile: tiles run no host programs",
        "module 'shutil' has no attribute 'make_archive' on a tile: archives are left out: a tile has "
        "only its own files",
        "disk_usage present",
        "module 'shutil' has no attribute 'no_such_thing'",
    ]


def test_tile_0s_own_disk_by_its_tiles_name_is_the_same_file(machine):
    # /tiles/0/x is tile 0's /x: copying or moving a file onto itself by that name must be
    # refused as the host refuses it, not empty the file or delete the tree
    result = run(machine, """
        import os, shutil
        os.makedirs("/same/sub", exist_ok=True)
        with open("/same/sub/f", "w") as f:
            f.write("precious")
        with open("/same/g", "w") as f:
            f.write("precious-g")
        print(os.path.samefile("/same/g", "/tiles/0/same/g"), os.path.samefile("/same/g", "/tiles/1/same/g")
              if os.path.exists("/tiles/1/same/g") else "-")
        for call in (lambda: shutil.copyfile("/same/g", "/tiles/0/same/g"),
                     lambda: shutil.copy2("/tiles/0/same/g", "/same/"),
                     lambda: shutil.move("/same/g", "/tiles/0/same/g"),
                     lambda: shutil.move("/same/sub", "/tiles/0/same"),
                     lambda: shutil.move("/same/sub", "/tiles/0/same/sub")):
            try:
                call()
                print("no error")
            except OSError as exc:
                print(type(exc).__name__)
        try:
            shutil.copytree("/same", "/tiles/0/same", dirs_exist_ok=True)
        except shutil.Error:
            print("Error")  # (its list garbled as the host's: each SameFileError's text, char by char)
        print(open("/same/g").read(), open("/same/sub/f").read(), sorted(os.listdir("/same")))
        import pathlib
        print(pathlib.Path("/tiles/0/same/sub/f").samefile("/same/sub/f"))
        try:
            shutil.move("/same", "/tiles/0/same/sub/inner")
        except shutil.Error as exc:
            print(exc)
        print(sorted(os.listdir("/same")))
        shutil.rmtree("/same")
    """)
    assert output(result).splitlines() == [
        "True -",
        "SameFileError",
        "SameFileError",
        "SameFileError",
        "Error",  # (sub is there already)
        "OSError",  # EXDEV, as rename(2) between two mounts of one filesystem
        "Error",
        "precious-g precious ['g', 'sub']",
        "True",
        "Cannot move a directory '/same' into itself '/tiles/0/same/sub/inner'.",
        "['g', 'sub']",
    ]


def test_paths_that_are_not_str_say_what_tiles_take(machine):
    result = run(machine, """
        import os
        for call in (lambda: open(0), lambda: os.stat(3), lambda: open(None), lambda: os.listdir(b"/"),
                     lambda: open(1.5)):
            try:
                call()
            except TypeError as exc:
                print(exc)
    """)
    assert output(result) == (
        "tile paths are str: a tile has no file descriptors to open by number\n"
        "tile paths are str: a tile has no file descriptors to open by number\n"
        "expected str or os.PathLike object, not NoneType (tile paths are str)\n"
        "tile paths are str, not bytes\n"
        "expected str or os.PathLike object, not float (tile paths are str)\n")
