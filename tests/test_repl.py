"""``Machine.repl``: interpreters on tiles whose namespaces persist between blocks."""

from __future__ import annotations

import gc
import threading
import time
import warnings

import pytest

import ipuos
from ipuos.blockdev import MemoryDevice
from ipuos.scheduler import TileBusyError
from ipuos.vfs import mount_device


@pytest.fixture(scope="module")
def machine():
    with ipuos.Machine("tiny") as machine:
        yield machine


def test_names_persist_between_blocks(machine):
    repl = machine.repl("0-3")
    assert repl.run("x = __tileid * 10").ok
    result = repl.run("print(x + 1)")
    assert result.outputs() == {0: "1\n", 1: "11\n", 2: "21\n", 3: "31\n"}
    repl.run("def twice(v):\n    return 2 * v\n")
    assert repl.run("print(twice(x))").outputs()[3] == "60\n"


def test_exit_ends_the_block_and_the_session_goes_on(machine):
    """As documented: the block's exit code is its result's; the caller decides whether
    the session ends (the shell's multirepl leaves on it)."""
    with machine.repl("0-1") as repl:
        repl.run("x = 5")
        result = repl.run("print('before')\nexit(3)\nprint('after')")
        assert result.exit_status == 3 and result.outputs() == {0: "before\n", 1: "before\n"}
        assert repl.run("print(x)").outputs() == {0: "5\n", 1: "5\n"}


def test_a_bare_expression_shows_its_value(machine):
    repl = machine.repl("0-1")
    result = repl.run("__tileid + 40")
    assert result.outputs() == {0: "40\n", 1: "41\n"}
    assert repl.run("None").outputs() == {0: "", 1: ""}
    assert repl.run("print(_)").outputs() == {0: "40\n", 1: "41\n"}  # the last value shown


def test_every_expression_statement_at_the_prompt_shows_its_value_as_in_python(machine):
    """Python's REPL shows each expression statement of a block at top level, in loops
    and ifs too (not in function bodies), and keeps ``_`` in builtins, where a name the
    user assigns hides it."""
    repl = machine.repl("0")
    assert repl.run("1; 2").outputs() == {0: "1\n2\n"}
    assert repl.run("for i in range(3):\n    i\n").outputs() == {0: "0\n1\n2\n"}
    assert repl.run("def f():\n    7\n    return 8\nf()\n").outputs() == {0: "8\n"}
    assert repl.run("print(_)").outputs() == {0: "8\n"}
    assert repl.run("_ = 5\n3\n").outputs() == {0: "3\n"}
    assert repl.run("_").outputs() == {0: "5\n"}  # the user's own _, as in Python
    assert repl.run("del _\n_").outputs() == {0: "5\n"}  # (showing 5 kept it, as Python's does)
    launched = repl.launch("1; 2", echo=False)  # (python -c shows nothing)
    assert launched.wait(10).outputs() == {0: ""}


def test_primitives_are_rebound_to_each_block(machine):
    repl = machine.repl("0-7")
    repl.run("def total():\n    return allreduce(__tileid)\n")
    assert repl.run("print(total())").format() == "[8 tiles: 0-7]\n28\n"
    assert repl.run("print(total())").format() == "[8 tiles: 0-7]\n28\n"  # a new job, same name


def test_modules_the_tiles_import_use_each_blocks_primitives(machine):
    repl = machine.repl("0-1")
    module = "def total(x):\n    return allreduce(x)\n"
    assert repl.run(f"n = open('/rm_first.py', 'w').write({module!r})\nimport rm_first\nprint(rm_first.total(1))"
                    ).format() == "[2 tiles: 0-1]\n2\n"
    # a later block is another job: a module imported before, or only now, uses its primitives
    assert repl.run("print(rm_first.total(2))").format() == "[2 tiles: 0-1]\n4\n"
    assert repl.run(f"n = open('/rm_later.py', 'w').write({module!r})\nimport rm_later\nprint(rm_later.total(5))"
                    ).format() == "[2 tiles: 0-1]\n10\n"


def test_blocks_as_bytes_or_with_a_bom_and_a_block_that_runs_too_long(machine):
    repl = machine.repl("0-1")
    assert repl.run(b"y = 1\n1/0").format().endswith("ZeroDivisionError: division by zero\n")
    assert repl.run("\ufeffprint(y)").outputs() == {0: "1\n", 1: "1\n"}
    # as Machine.run: nobody else holds the block's handle to stop it, so it is stopped
    with pytest.raises(TimeoutError, match="and was interrupted"):
        repl.run("while True:\n    sync()", timeout=0.3)
    assert repl.run("print('next')").outputs() == {0: "next\n", 1: "next\n"}


def test_one_tiles_exception_is_grouped_output_not_an_abort(machine):
    repl = machine.repl("0-5")
    result = repl.run("print(10 // (__tileid % 3))")
    text = result.format()
    assert "[2 tiles: 0,3]\nTraceback (most recent call last):" in text
    assert "ZeroDivisionError: integer division or modulo by zero" in text
    assert "[2 tiles: 1,4]\n10\n" in text and "[2 tiles: 2,5]\n5\n" in text
    assert result.exit_status == 1
    assert repl.run("print('still here')").ok  # the failure left every namespace intact



@pytest.mark.parametrize("collective", ["allreduce(__tileid)", "reduce(1, 'sum', 0)", "alltoall(1)", "sync()"])
def test_a_collective_missing_a_tile_that_raised_says_why_in_one_group(machine, collective):
    with machine.repl("0-15") as repl:
        result = repl.run(f"if __tileid == 3: raise ValueError('boom')\nx = {collective}\n")
    groups = result.grouped()
    assert [g.tiles for g in groups] == [tuple(t for t in range(16) if t != 3), (3,)]
    if collective == "sync()":  # a barrier of the live tiles: the others carry on
        assert groups[0].text == ""
        return
    name = collective.partition("(")[0]
    assert groups[0].text.endswith(
        f"CollectiveMismatchError: {name}() needs every tile of the job, but tile 3 already "
        "finished (it raised ValueError: boom)\n")
    assert groups[1].text.endswith("ValueError: boom\n")

def test_tiledata_is_split_once_and_kept(machine):
    repl = machine.repl("0-3", data="a\nb\nc\nd\n")
    assert repl.run("print(__tiledata.strip())").outputs() == {0: "a\n", 1: "b\n", 2: "c\n", 3: "d\n"}
    repl.run("__tiledata = 'changed'")
    assert repl.run("print(__tiledata)").outputs()[2] == "changed\n"


def test_files_and_cwd_persist(machine):
    repl = machine.repl("2")
    repl.run("import os\nos.mkdir('/repl-dir')\nos.chdir('/repl-dir')\nf = open('notes', 'w')")
    repl.run("f.write('kept open between blocks')\nf.close()")
    assert repl.run("print(os.getcwd(), open('notes').read())").outputs() == {
        2: "/repl-dir kept open between blocks\n"}


def test_syntax_errors_stop_before_any_tile_runs(machine):
    repl = machine.repl("0-1")
    with pytest.raises(SyntaxError):
        repl.launch("x = = 1")


def test_interrupting_a_block(machine):
    repl = machine.repl("0-3")
    handle = repl.launch("while True:\n    pass\n")
    time.sleep(0.2)
    handle.interrupt("stop it")
    result = handle.wait(10)
    assert result.exit_status == 130 and "stop it" in result.format()
    assert repl.run("print('alive')").format() == "[4 tiles: 0-3]\nalive\n"


def test_a_block_whose_exception_str_never_ends_can_be_interrupted(machine):
    repl = machine.repl("0-1")
    handle = repl.launch("class Stuck(Exception):\n    def __str__(self):\n        while True:\n"
                         "            pass\nraise Stuck()\n")
    time.sleep(0.2)
    handle.interrupt("stop it")
    result = handle.wait(10)
    assert all(tile.error.endswith("Stuck: <exception str() failed>\n") for tile in result.tiles)
    assert repl.run("print('alive')").format() == "[2 tiles: 0-1]\nalive\n"


def test_a_sessions_context_variables_last_between_its_blocks_only(machine):
    repl = machine.repl("0-1")
    repl.run("import decimal\ndecimal.getcontext().prec = 5")
    assert repl.run("print(decimal.Decimal(2).sqrt())").outputs() == {0: "1.4142\n", 1: "1.4142\n"}
    other = machine.repl("0-1")
    assert other.run("import decimal\nprint(decimal.Decimal(1) / 3)").outputs()[0] == "0.3333333333333333333333333333\n"


def test_a_sessions_csv_field_size_limit_lasts_between_its_blocks_only(machine):
    repl = machine.repl("0-1")
    repl.run("import csv\ncsv.field_size_limit(16)")
    assert repl.run("print(csv.field_size_limit())").outputs() == {0: "16\n", 1: "16\n"}
    other = machine.repl("0-1")
    assert other.run("import csv\nprint(csv.field_size_limit())").outputs()[0] == "131072\n"
    assert repl.run("print(len(next(csv.reader(['x' * 20]))[0]))").by_rank(0).error.endswith(
        "Error: field larger than field limit (16)\n")


def test_a_busy_tile_refuses_a_block(machine):
    repl = machine.repl("0-1")
    handle = machine.launch("while True:\n    sync()\n", tiles="1")
    try:
        with pytest.raises(TileBusyError):
            repl.launch("pass")
    finally:
        handle.interrupt()
        handle.wait(10)


def test_names_complete_before_the_first_block(machine):
    # (before the first block the tile had made no namespace: Tab offered the host's
    # builtins and none of the tile's own names)
    from ipuos.shell._complete import complete_python

    repl = machine.repl("0-1")
    before = repl.namespace()
    assert complete_python(before, "allred") == (0, ["allreduce"])
    assert complete_python(before, "__tile") == (0, ["__tiledata", "__tileid"])
    assert complete_python(before, "__tiledata.spl") == (0, ["__tiledata.split", "__tiledata.splitlines"])
    repl.run("pass")
    after = repl.namespace()
    assert set(before) <= set(after)
    assert {name for name in set(after) - set(before) if not name.startswith("__ipuos")} == {"open"}
    assert before["__builtins__"]["open"] is not open  # the tile's, not the host's
    assert repl.namespace(1) is not after
    for rank in (2, -1, "0"):  # (a rank outside the session gave the starting names)
        with pytest.raises(IndexError, match=f"no rank {rank!r} in this session: its ranks are 0-1"):
            repl.namespace(rank)


def test_close_forgets_namespaces(machine):
    repl = machine.repl("0")
    repl.run("secret = 1")
    repl.close()
    assert "NameError" in repl.run("print(secret)").format()


def test_closing_a_session_lets_go_of_its_names_on_each_tile(machine):
    """As a program's end does: each object's __del__ runs on its tile, in the session's
    context (decimal's precision), with the tile's files; what it prints is the tile's
    output of the session's end."""
    repl = machine.repl("1-3")
    assert repl.run("""
import decimal
decimal.getcontext().prec = 3

class Goodbye:
    def __del__(self):
        print('bye from', __physical_tile, decimal.Decimal(1) / 3)
        with open('/bye.txt', 'w') as file:
            file.write(f'written by tile {__physical_tile}')

goodbye = Goodbye()
""").ok
    ended = repl.close()
    assert ended.outputs() == {tile: f"bye from {tile} 0.333\n" for tile in (1, 2, 3)}
    for tile in (1, 2, 3):
        assert machine.fs.read_file(tile, "/bye.txt") == f"written by tile {tile}".encode()
        machine.fs.remove(tile, "/bye.txt")
    assert "NameError" in repl.run("goodbye").format()  # (a later block starts afresh)


def test_closing_twice_ends_once(machine):
    repl = machine.repl("6-7")
    repl.run("class Goodbye:\n    def __del__(self):\n        print('bye')\n\ngoodbye = Goodbye()\n")
    assert repl.close().outputs() == {6: "bye\n", 7: "bye\n"}
    assert repl.close() is None  # (as documented: nothing left to end)
    # a later block starts the session afresh, and closing ends that one
    repl.run("class Goodbye:\n    def __del__(self):\n        print('bye again')\n\nagain = Goodbye()\n")
    assert repl.close().outputs() == {6: "bye again\n", 7: "bye again\n"}
    assert repl.close() is None


def test_a_session_dropped_without_close_gives_back_its_sram_and_its_cwd(machine):
    """Its data's SRAM and its current directory, which keeps a mount busy, would
    otherwise be held for as long as the machine runs."""
    def mount_ram(tile):
        vfs = machine.storage.vfs(tile)
        vfs.mkdir("/dropped")
        mount_device(vfs, "/dropped", MemoryDevice.new(512, 16), format=True)

    def umount(tile):
        machine.storage.vfs(tile).umount("/dropped")
        machine.storage.vfs(tile).rmdir("/dropped")

    on_tile(machine, 6, mount_ram)
    repl = machine.repl("6", data="kept in SRAM\n")
    assert repl.run("import os\nos.chdir('/dropped')").ok
    region = repl.state.region_name
    assert region in regions(machine, 6)
    with pytest.raises(OSError, match="target is busy"):
        on_tile(machine, 6, umount)
    with pytest.warns(ResourceWarning, match="dropped without close"):
        del repl
        gc.collect()
        assert region not in regions(machine, 6)  # (the release was queued before this ask)
    on_tile(machine, 6, umount)


def test_a_session_dropped_before_its_block_ran_still_gives_back_its_sram(machine):
    """The block reserves the tile's data only as it starts there: the release waits for
    it rather than judging from what the session held as it was dropped."""
    blocker = machine.launch("for _ in range(4):\n    sum(range(2_000_000))\n    sync()\n", tiles="0")
    repl = machine.repl("3", data="kept in SRAM\n")
    handle = repl.launch("x = 1")  # (runs after tile 0's compute in the same superstep)
    region = repl.state.region_name
    with pytest.warns(ResourceWarning, match="dropped without close"):
        del repl
        gc.collect()
        assert handle.wait(30).ok and blocker.wait(30).ok
        assert region not in regions(machine, 3)


def test_a_closed_session_dropped_warns_only_if_a_later_block_ran(machine):
    repl = machine.repl("7", data="x\n")
    assert repl.run("y = 1").ok
    repl.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del repl
        gc.collect()
        regions(machine, 7)  # (after anything the drop queued)
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    repl = machine.repl("7", data="x\n")
    repl.close()
    assert repl.run("y = 2").ok  # (starts afresh, and holds the tile's data again)
    region = repl.state.region_name
    with pytest.warns(ResourceWarning, match="a repl session on 1 tile was dropped"):
        del repl
        gc.collect()
        assert region not in regions(machine, 7)


def regions(machine, tile: int) -> list[str]:
    return [region["name"] for region in machine.sram_usage(tile)["regions"]]


def on_tile(machine, tile: int, function):
    """Run ``function(tile_object)`` on the tile's own greenlet; OSError as raised there."""
    machine.scheduler.services["test.call"] = lambda tile_obj, fn: fn(tile_obj)
    return machine.fs.submit(tile, "test.call", function).result(10)


def test_closing_a_session_already_ending_waits_for_that_end(machine):
    # (a with-block's exit after end(), say: the end is no block to interrupt)
    repl = machine.repl("4-5")
    assert repl.run("""
import os

class Slow:
    def __del__(self):
        while not os.path.exists('/go'):
            sync()
        print('let go')

slow = Slow()
""").ok
    repl.end()
    threading.Timer(0.3, lambda: [machine.fs.write_file(t, "/go", b"") for t in (4, 5)]).start()
    ended = repl.close()
    assert ended is not None and ended.outputs() == {4: "let go\n", 5: "let go\n"}
    assert repl.close() is None  # (closing again: nothing left to end)


@pytest.mark.parametrize("loop", ["while True:\n            sync()", "while True:\n            pass"],
                         ids=["at-exchanges", "computing"])
def test_a_del_that_never_ends_as_a_session_ends_is_interrupted_and_the_rest_let_go(machine, loop):
    """Stopped at an exchange or (the watchdog's bare exception) computing, the
    ``__del__`` says why, as a program stopped either way does."""
    repl = machine.repl("0-1")
    repl.run("class Polite:\n    def __del__(self):\n        print('bye')\n\n"
             f"class Stuck:\n    def __del__(self):\n        for _ in range(3):\n            sync()\n        {loop}\n\n"
             "polite = Polite()\nstuck = Stuck()\n")
    start = machine.scheduler.superstep
    handle = repl.end()
    deadline = time.monotonic() + 30  # (until Stuck.__del__ syncs: not a fixed sleep, a loaded host is slow)
    while machine.scheduler.superstep < start + 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    handle.interrupt("stop it")
    result = handle.wait(10)
    for output in result.outputs().values():  # (the latest name goes first, as for a program)
        assert output.startswith("Exception ignored in: <function Stuck.__del__ at ")
        assert output.endswith("\nTileInterrupt: stop it\nbye\n")
    assert repl.run("print('alive')").format() == "[2 tiles: 0-1]\nalive\n"


def test_a_sessions_end_interrupted_before_its_tiles_start_still_lets_go(machine):
    """(Ctrl-C as soon as the end starts: the interrupted job's tiles skip their part)"""
    repl = machine.repl("6-7")
    repl.run("class Goodbye:\n    def __del__(self):\n        open('/bye.txt', 'w').close()\n\n"
             "goodbye = Goodbye()\n")

    def end_and_interrupt():  # (on the scheduler's thread: before any tile runs)
        handle = repl.end()
        handle.interrupt("at once")
        return handle

    assert machine.scheduler.call_wait(end_and_interrupt).wait(10).exit_status == 130
    for job in machine.scheduler.live_jobs():
        job.future.result(10)
    for tile in (6, 7):
        assert machine.fs.exists(tile, "/bye.txt")
        machine.fs.remove(tile, "/bye.txt")


def test_closing_a_session_while_its_block_runs_stops_the_block_then_lets_go(machine):
    repl = machine.repl("4-5")
    repl.run("class Goodbye:\n    def __del__(self):\n        print('bye')\n\ngoodbye = Goodbye()\n")
    handle = repl.launch("while True:\n    sync()\n")
    ended = repl.close()
    assert handle.wait(10).exit_status == 130
    assert ended.outputs() == {4: "bye\n", 5: "bye\n"}


def test_programs_get_their_arguments(machine):
    result = machine.run("print(__args)", tiles="0", argv=["prog.py", "-v", "x"], filename="prog.py")
    assert result.outputs() == {0: "['prog.py', '-v', 'x']\n"}
    assert machine.run("print(__args)", tiles="0", filename="p.py").outputs() == {0: "['p.py']\n"}


def test_blocks_from_two_threads_on_disjoint_tiles(machine):
    left, right = machine.repl("0-3"), machine.repl("4-7")
    results = {}

    def run(name, repl):
        results[name] = repl.run("print(allreduce(1))").format()

    threads = [threading.Thread(target=run, args=item) for item in (("l", left), ("r", right))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {"l": "[4 tiles: 0-3]\n4\n", "r": "[4 tiles: 4-7]\n4\n"}


@pytest.mark.parametrize("wipe", ["globals().clear()", "del __builtins__", "__builtins__ = None"])
def test_a_block_that_wipes_its_globals_leaves_the_tile_a_tile(machine, wipe):
    """The next block still prints to its tile and still has no host modules: exec would
    otherwise hand a namespace without the tile's builtins the host's own."""
    repl = machine.repl("0-1")
    assert repl.run("x = 1\n" + wipe).ok
    result = repl.run("print('still here', __tileid)")
    assert result.outputs() == {0: "still here 0\n", 1: "still here 1\n"}
    result = repl.run("import sys")
    assert not result.ok and "tiles have no access to the host" in result.by_rank(0).error
    result = repl.run("1 / 0")
    assert "ZeroDivisionError" in result.by_rank(0).error and '1 / 0' in result.by_rank(0).error
    assert "_runtime.py" not in result.by_rank(0).text  # (tracebacks still show the tile's frames only)


def test_a_file_on_another_tile_dropped_in_a_block_is_written_when_the_block_ends(machine):
    # CPython closes a dropped file at once; a block that drops one on another tile's
    # disk, with its writes still buffered, has them written by the time it ends
    repl = machine.repl("0,3")
    try:
        assert repl.run("if __tileid == 0:\n    open('/tiles/3/block.txt', 'w').write('from block 1')\n").ok
        assert machine.fs.read_file(3, "/block.txt") == b"from block 1"
        result = repl.run("if __tileid == 1:\n    print(open('/block.txt').read())\n")
        assert result.outputs()[3] == "from block 1\n"
    finally:
        repl.close()
        machine.fs.remove(3, "/block.txt")


def test_help_prints_an_objects_documentation_and_dir_shows_the_programs_names(machine):
    # help was missing (Python's pages through the host's terminal), and dir() listed the
    # runtime's markers among the program's names
    repl = machine.repl("0")
    result = repl.run('def f(x):\n    "Doubles x."\nhelp(f)\nhelp(len)\nhelp()\nprint(dir())\n')
    text = result.outputs()[0]
    assert "f(x)\n    Doubles x.\n" in text and "len(obj, /)\n    Return the number of items" in text
    assert "On a tile, help(object) shows an object's documentation" in text
    names = eval(text.splitlines()[-1])
    assert "f" in names and "__tileid" in names and not [n for n in names if n.startswith("__ipuos")]
    assert repl.run("help(1, 2)").tiles[0].error.rstrip().endswith(
        "TypeError: help() takes at most 1 argument (2 given)")
