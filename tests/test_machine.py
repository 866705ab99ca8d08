"""The Machine API: presets, geometry, results, grouping, handles, state."""

from __future__ import annotations

import gc
import sys
import threading
import time

import pytest

import ipuos
from ipuos import PRESETS, Machine, TileSpecError, format_groups, group_texts
from ipuos.scheduler import TileBusyError


@pytest.fixture(scope="module")
def machine():
    with Machine("tiny") as m:
        yield m


def test_presets_have_the_documented_geometry():
    assert (PRESETS["mk2"].tiles_per_chip, PRESETS["mk2"].sram_per_tile) == (1472, 638_976)
    assert (PRESETS["mk1"].tiles_per_chip, PRESETS["mk1"].sram_per_tile) == (1216, 256 * 1024)
    assert (PRESETS["tiny"].tiles_per_chip, PRESETS["tiny"].sram_per_tile) == (16, 64 * 1024)


def test_ipus_multiply_tiles_and_ids_are_global():
    with Machine("tiny", ipus=3) as m:
        assert m.ntiles == 48
        result = m.run("print(__physical_tile // 16)", tiles="10,20,47")
        assert [t.output for t in result.tiles] == ["0\n", "1\n", "2\n"]


def test_bad_machine_parameters_are_clear():
    with pytest.raises(ValueError, match="unknown preset 'mk9'"):
        Machine("mk9")
    for ipus in (0, 65, True, 1.0):
        with pytest.raises(ValueError, match="ipus must be a whole number of chips from 1 to 64"):
            Machine("tiny", ipus=ipus)
    for overrides, message in (
        ({"exchange_out": 0}, "exchange buffers must hold a message"),
        ({"exchange_in": 0}, "exchange buffers must hold a message"),
        ({"disk_size": "16k"}, "disk_size must be an integer, not '16k'"),
        ({"disk_size": None}, "disk_size must be an integer, not None"),
        ({"exchange_in": 1.5}, "exchange_in must be an integer, not 1.5"),
        ({"tiles_per_chip": 2.5}, "tiles_per_chip must be an integer"),
        ({"exchange_out": 4097}, "exchange_out must be a multiple of 8 bytes"),
    ):
        with pytest.raises(ValueError, match=message):
            Machine("tiny", **overrides)
    with pytest.raises(ValueError, match="layout of every tile but 0 needs .* bytes"):
        Machine("tiny", exchange_in=80 * 1024)
    with pytest.raises(ValueError, match="layout of tile 0 needs"):
        Machine("tiny", chipdisk_cache=60 * 1024)
    with pytest.raises(ValueError, match="cache must hold at least two blocks"):
        Machine("tiny", chipdisk_cache=512)
    for page in (3000, 8192, -4):
        with pytest.raises(ValueError, match="chipdisk_cache_page must be 0 .* or a power of two dividing"):
            Machine("tiny", chipdisk_cache_page=page)
    for overrides, message in (
        ({"chipdisk_cache_heads": -1}, "chipdisk_cache_heads cannot be negative"),
        ({"chipdisk_cache_heads": 2, "chipdisk_cache_page": 128},
         "chipdisk_cache_heads needs a cache of whole blocks .chipdisk_cache_page 0., not pages of 128 B"),
        ({"chipdisk_cache_heads": 2}, "chip disk blocks of 512 B are one littlefs read unit"),
        ({"chipdisk_cache_heads": 3, "chipdisk_block_size": 8192, "chipdisk_cache": 24 * 1024},
         "a cache of 24576 B holds fewer than two 8192 B blocks beside 3 heads of 4096 B"),
    ):
        with pytest.raises(ValueError, match=message):
            Machine("tiny", **overrides)
    # (a cost model of the wrong type used to kill the scheduler at the first job's end)
    with pytest.raises(TypeError, match="cost_model is a CostModel, not str"):
        Machine("tiny", cost_model="x")
    with pytest.raises(TypeError, match="chip_device .* a callable, not 5"):
        Machine("tiny", chip_device=5)


def test_bad_api_arguments_are_refused_before_anything_happens(machine):
    for source in (5, None):
        with pytest.raises(TypeError, match="a program's source is str or bytes"):
            machine.run(source, tiles="0")
    assert machine.run(bytearray(b"\xef\xbb\xbfprint(1)"), tiles="0").tiles[0].output == "1\n"
    # bytes would iterate as byte values: b"3" was tile 51
    for spec in (b"3", bytearray(b"12")):
        with pytest.raises(TileSpecError, match="a spec like '0-15' .a str., not"):
            machine.run("pass", tiles=spec)
    with pytest.raises(TileSpecError, match="no tile 999999999999 on this machine"):
        machine.run("pass", tiles=range(10**12))  # (refused by its ends, never listed)
    for limit in ("5", 1.5, -1):  # (they used to fail every tile's print, as if the program had)
        with pytest.raises(ValueError, match="output_limit is the characters of output kept"):
            machine.run("print(1)", tiles="0", output_limit=limit)
        with pytest.raises(ValueError, match="output_limit"):
            machine.repl("0", output_limit=limit)
    for argv in (5, "abc", [1]):
        with pytest.raises(TypeError, match="argv is a list of str"):
            machine.run("print(__args)", tiles="0", argv=argv)
    result = machine.run("print(__tileid % 3)", tiles="0-9")
    with pytest.raises(ValueError, match="max_groups is a count"):
        result.format(-1)
    machine.fs.write_file(0, "/kept", b"hello")
    with pytest.raises(TypeError, match="write_file writes bytes, not str"):
        machine.fs.write_file(0, "/kept", "text")
    assert machine.fs.read_file(0, "/kept") == b"hello"  # (it used to be emptied first)
    machine.fs.remove(0, "/kept")


def test_a_chip_disk_cached_in_pages_keeps_files():
    with Machine("tiny", chipdisk_cache_page=128) as paged:  # 4 pages a block
        data = bytes(range(256)) * 300
        paged.fs.write_file(0, "/chip/f", data)
        assert paged.fs.read_file(0, "/chip/f") == data
        result = paged.run("import os\nprint(os.stat('/chip/f').st_size)", tiles="0")
        assert result.ok and result.outputs()[0] == f"{len(data)}\n"
        page = paged.scheduler.call_wait(
            lambda: paged.storage.vfs(paged.scheduler.tiles[0]).backend("/chip").fs.device.page)
        assert page == 128


def test_a_chip_disk_with_cache_heads_keeps_files():
    # 8 KiB blocks: littlefs reads them in 4 KiB units, and two of those are heads
    with Machine("tiny", chipdisk_block_size=8192, chipdisk_cache=24 * 1024, chipdisk_cache_heads=2) as m:
        big, small = bytes(range(256)) * 400, b"small file"
        m.fs.write_file(0, "/chip/big", big)
        for i in range(5):
            m.fs.write_file(0, f"/chip/s{i}", small * (i + 1))
        assert m.fs.read_file(0, "/chip/big") == big
        result = m.run("import os\nprint(sorted(os.listdir('/chip')), len(open('/chip/big', 'rb').read()))",
                       tiles="0")
        assert result.ok and result.outputs()[0] == f"{['big'] + [f's{i}' for i in range(5)]} {len(big)}\n"
        assert [m.fs.read_file(0, f"/chip/s{i}") for i in range(5)] == [small * (i + 1) for i in range(5)]
        device = m.scheduler.call_wait(lambda: m.storage.vfs(m.scheduler.tiles[0]).backend("/chip").fs.device)
        assert (device.head, device.cache.size, device.heads_fetched > 0) == (4096, 24 * 1024, True)


def test_bad_tile_spec_is_refused_before_anything_runs(machine):
    with pytest.raises(TileSpecError, match="no tile 16"):
        machine.run("print(1)", tiles="0-16")


def test_result_grouping_by_count_with_tile_ranges(machine):
    result = machine.run("print(__tileid % 3 == 0)")
    groups = result.grouped()
    assert [(g.text, g.count, g.tile_ranges) for g in groups] == [
        ("False\n", 10, "1-2,4-5,7-8,10-11,13-14"),
        ("True\n", 6, "0-15:3"),
    ]
    assert result.format() == "[10 tiles: 1-2,4-5,7-8,10-11,13-14]\nFalse\n[6 tiles: 0-15:3]\nTrue\n"


def test_grouping_caps_distinct_outputs():
    groups = group_texts({t: f"tile {t}\n" for t in range(30)})
    text = format_groups(groups, max_groups=5)
    assert text.count("[1 tile:") == 5
    assert text.endswith("... 25 more distinct outputs from 25 tiles\n")


def test_the_cap_on_distinct_outputs_keeps_failed_groups_first_in_their_order():
    texts = {t: f"tile {t}\n" for t in range(10)}
    text = format_groups(group_texts(texts, failed={7}), max_groups=3)
    assert text == "[1 tile: 0]\ntile 0\n[1 tile: 1]\ntile 1\n[1 tile: 7]\ntile 7\n" \
        "... 7 more distinct outputs from 7 tiles\n"
    # more failed groups than the cap: those left out are counted as failed
    text = format_groups(group_texts(texts, failed=range(2, 10)), max_groups=3)
    assert [line for line in text.splitlines() if line.startswith("[")] == [
        "[1 tile: 2]", "[1 tile: 3]", "[1 tile: 4]"]
    assert text.endswith("\n... 7 more distinct outputs from 7 tiles (5 failed)\n")
    # a failed tile's text is its own group even where another tile's reads the same
    groups = group_texts({0: "same\n", 1: "same\n", 2: "same\n"}, failed={1})
    assert [(g.tiles, g.failed) for g in groups] == [((0, 2), False), ((1,), True)]


def test_a_failed_tiles_traceback_is_shown_past_twenty_distinct_outputs():
    program = "print('result', __tileid * 7)\nif __tileid == 31: raise ValueError('the real problem')\n"
    with Machine("tiny", ipus=2) as machine:
        result = machine.run(program)
        with machine.repl("0-31") as repl:
            block = repl.run(program)
    for ran in (result, block):  # (a repl block's exception is its tile's output: exit code 1)
        text = ran.format()
        assert text.count("\n[1 tile: ") + text.startswith("[1 tile: ") == 20
        assert "\n[1 tile: 31]\nresult 217\nTraceback (most recent call last):\n" in text
        assert "ValueError: the real problem\n... 12 more distinct outputs from 12 tiles\n" in text
        assert ran.exit_status == 1


def test_a_tile_that_exits_non_zero_shows_its_code_even_when_it_printed_nothing():
    with Machine("tiny") as machine:
        silent = machine.run("if __tileid == 1: raise SystemExit(3)", tiles="0-3")
        assert silent.format() == "[1 tile: 1, exit code 3]\n"
        assert silent.exit_status == 3
        # the same text from tiles that exited differently: one group per exit code
        said = machine.run("print('hi')\nif __tileid in (1, 2): exit(__tileid + 2)", tiles="0-3")
        assert said.format() == ("[2 tiles: 0,3]\nhi\n[1 tile: 1, exit code 3]\nhi\n"
                                 "[1 tile: 2, exit code 4]\nhi\n")
        # past the cap, such tiles are kept first and counted as failed like the others
        many = machine.run("print(__tileid)\nif __tileid > 12: exit(1)")
    text = many.format(max_groups=2)
    assert text.startswith("[1 tile: 13, exit code 1]\n13\n[1 tile: 14, exit code 1]\n14\n")
    assert text.endswith("... 14 more distinct outputs from 14 tiles (1 failed)\n")


def test_an_exit_message_is_the_error_not_the_output_as_python_prints_it_to_stderr(machine):
    result = machine.run("print('out')\nraise SystemExit('bye')", tiles="0-1")
    assert [(t.output, t.error, t.exit_code) for t in result.tiles] == [("out\n", "bye\n", 1)] * 2
    assert result.exit_status == 1
    with machine.repl(tiles="2") as repl:
        block = repl.run("print('out')\nexit('gone')")
    assert [(t.output, t.error, t.exit_code) for t in block.tiles] == [("out\n", "gone\n", 1)]


def test_a_programs_doc_and_spec_are_a_scripts(machine):
    """``print(__doc__)`` for usage text printed the builtins module's documentation, and
    ``__spec__`` was a NameError."""
    bare = machine.run("print(repr(__doc__), __spec__, __package__)", tiles="0")
    assert bare.tiles[0].output == "None None None\n", bare.format()
    documented = machine.run('"""Usage: prog FILE"""\nprint(__doc__)', tiles="0")
    assert documented.tiles[0].output == "Usage: prog FILE\n", documented.format()
    with machine.repl(tiles="1") as repl:
        assert repl.run("print(repr(__doc__))").tiles[0].output == "None\n"


def test_grouped_output_keeps_blank_lines_and_counts_in_the_singular():
    text = format_groups(group_texts({0: "a\n\n", 1: "a\n", 2: "b", 3: ""}), max_groups=2)
    assert text == "[1 tile: 0]\na\n\n[1 tile: 1]\na\n... 1 more distinct output from 1 tile\n"


def test_a_group_header_keeps_to_two_lines_however_scattered_its_tiles():
    from ipuos._grouping import HEADER_RANGES_MAX, OutputGroup

    tiles = tuple(t for t in range(1472) if t * 7 % 11 < 5)  # no regular pattern
    group = OutputGroup("text", tiles)
    header = group.header()
    assert header.startswith("[669 tiles: 0,2-8:3,") and header.endswith(" more ranges)]")
    assert len(header) < HEADER_RANGES_MAX + 40
    shown, left = header[len("[669 tiles: "):].split(",... (+")
    assert shown.count(",") + 1 + int(left.split()[0]) == group.tile_ranges.count(",") + 1
    assert OutputGroup("x", (1, 2, 3)).header() == "[3 tiles: 1-3]"


def test_errors_group_like_output(machine):
    result = machine.run("if __tileid in (1, 2): raise KeyError('k')\nprint('fine')", tiles="0-3")
    texts = {g.tile_ranges: g.text for g in result.grouped()}
    assert "KeyError: 'k'" in texts["1-2"]
    assert result.exit_status == 1
    assert [t.status for t in result.tiles] == ["aborted", "error", "error", "aborted"] or \
        [t.status for t in result.tiles] == ["ok", "error", "error", "ok"]


def test_launch_wait_timeout_and_interrupt(machine):
    handle = machine.launch("while True:\n    pass", tiles="0-1")
    with pytest.raises(TimeoutError, match="still runs"):
        handle.wait(0.05)
    handle.interrupt()
    result = handle.wait(5)
    assert [t.status for t in result.tiles] == ["interrupted", "interrupted"]
    assert result.exit_status == 130
    assert machine.run("print('alive')", tiles="0").tiles[0].output == "alive\n"


@pytest.mark.parametrize("loop", [
    "while True:\n    with open('/chip/f', 'wb') as f:\n        f.write(b'x' * 1000)\n",
    "f = open('/chip/g', 'wb')\nwhile True:\n    f.seek(0)\n    f.write(b'y' * 4096)\n    f.flush()\n",
    "open('/chip/h', 'wb').write(bytes(50000))\nf = open('/chip/h', 'rb')\nwhile True:\n    f.seek(0)\n    f.read()\n",
])
def test_a_program_doing_only_chip_disk_io_can_be_interrupted(machine, loop):
    """It waits for the exchange only inside littlefs, where it must not stop: file
    operations take the interrupt as they start. The disk is whole afterwards."""
    handle = machine.launch(loop, tiles="0")
    time.sleep(0.3)
    handle.interrupt()
    assert handle.wait(5).tiles[0].status == "interrupted"
    assert machine.fs.listdir(0, "/chip")  # tile 0 serves requests again, /chip usable
    machine.fs.write_file(0, "/chip/after", b"ok")
    assert machine.fs.read_file(0, "/chip/after") == b"ok"


# a deadlock, a mismatch and an oversized payload: errors a program may catch and go on from
@pytest.mark.parametrize("error, trigger", [
    ("DeadlockError", "recv((__tileid + 1) % 2)"),
    ("CollectiveMismatchError", "sync() if __tileid else allreduce(1)"),
    ("ValueError", "alltoall('x' * 100_000)"),
])
def test_a_program_that_catches_an_exchange_error_computes_on(machine, error, trigger):
    """Such an error is raised where every tile waits, and stops nothing: the tiles'
    compute afterwards, many watchdog ticks long, must not be interrupted."""
    result = machine.run(f"""
try:
    {trigger}
except Exception as exc:
    print('caught', type(exc).__name__)
total = 0
for i in range(1_000_000):
    total += i
print(allreduce(total))
""", tiles="0-1", timeout=30)
    assert result.ok, result.format()
    assert [t.output for t in result.tiles] == [f"caught {error}\n{2 * sum(range(1_000_000))}\n"] * 2


def test_an_interrupt_after_a_caught_error_reports_its_own_reason(machine):
    handle = machine.launch("try:\n    recv(0)\nexcept Exception:\n    pass\nwhile True:\n    pass",
                            tiles="0")
    with pytest.raises(TimeoutError, match="still runs"):
        handle.wait(0.3)
    handle.interrupt("stopped by the test")
    tile = handle.wait(5).tiles[0]
    assert tile.status == "interrupted"
    assert "stopped by the test" in tile.error and "deadlock" not in tile.error


STUCK_STR = "class Stuck(Exception):\n    def __str__(self):\n        while True:\n            pass\n"


@pytest.mark.parametrize("stop", ["interrupt", "budget"])
def test_an_exception_whose_str_never_ends_is_stopped_like_any_compute(machine, stop):
    """Reporting a program's exception runs its class's __str__: that is the program's
    compute, on its tile, which an interrupt or the budget stops; the machine goes on."""
    source = STUCK_STR + "if __tileid == 0:\n    raise Stuck()\nsync()\n"
    handle = machine.launch(source, tiles="0-1", budget=0.3 if stop == "budget" else None)
    if stop == "interrupt":
        with pytest.raises(TimeoutError, match="still runs"):
            handle.wait(0.3)
        handle.interrupt()
    first, second = handle.wait(10).tiles
    assert first.status == "error" and first.error.endswith("Stuck: <exception str() failed>\n")
    assert second.status == "aborted" and "failed with Stuck: <exception str() failed>" in second.error
    assert machine.run("print('alive')", tiles="0").tiles[0].output == "alive\n"


def test_an_exception_chained_to_one_whose_str_never_ends_is_reported(machine):
    handle = machine.launch(STUCK_STR + "try:\n    raise Stuck()\nexcept Exception as exc:\n"
                            "    raise ValueError('plain') from exc\n", tiles="0")
    with pytest.raises(TimeoutError, match="still runs"):
        handle.wait(0.3)
    handle.interrupt()
    error = handle.wait(10).tiles[0].error
    assert "Stuck: <exception str() failed>" in error and error.endswith("ValueError: plain\n")


def test_interrupting_opens_of_another_tiles_files_leaves_nothing_open_there():
    """A program on tile 0 interrupted while it waits for another tile's answer to an
    open: that tile had opened the file, and nobody would ever close it (a restore of
    its disk was then refused, files being open)."""
    import random

    rng = random.Random(7)
    with Machine("tiny") as m:
        m.fs.write_file(5, "/f", b"hello")
        for _ in range(12):
            handle = m.launch("while True:\n    open('/tiles/5/f', 'rb').close()\n", tiles="0")
            time.sleep(rng.uniform(0.005, 0.05))
            handle.interrupt()
            assert handle.wait(10).tiles[0].status == "interrupted"

        def leftovers():
            tile0, tile5 = m.scheduler.tiles[0], m.scheduler.tiles[5]
            return (len(tile0.replies), len(tile5.kernel_data.get("fs.handles") or ()),
                    [info.open_files for info in tile5.kernel_data["vfs"].mount_points()])

        time.sleep(0.1)  # (a close posted for an abandoned open runs at tile 5's next turn)
        assert m.scheduler.call_wait(leftovers) == (0, 0, [0])
        snapshot = m.fs.snapshot(5, "/")
        m.fs.restore(5, "/", snapshot["data"])  # refused while files are open


def test_tiles_of_a_stopped_job_that_have_not_started_never_start(machine):
    """A job whose tiles never pause runs them one at a time: stopping it must not start
    each remaining tile only for the watchdog to stop it a tick later (about 20 ms a
    tile, 22 s for a chip)."""
    handle = machine.launch("print('started')\nwhile True:\n    pass\n", tiles="0-7")
    time.sleep(0.2)
    handle.interrupt()
    result = handle.wait(10)
    assert [t.status for t in result.tiles] == ["interrupted"] * 8
    assert sum(t.output == "started\n" for t in result.tiles) == 1  # the one that was running
    budgeted = machine.run("print('started')\nwhile True:\n    pass\n", tiles="0-7", budget=0.1, timeout=10)
    assert [t.status for t in budgeted.tiles].count("error") == 1
    assert sum(t.output == "started\n" for t in budgeted.tiles) == 1


def test_run_that_times_out_interrupts_its_program(machine):
    # run() returns no handle: a program left running would hold its tiles for good
    with pytest.raises(TimeoutError, match="ran longer than 0.1 s, and was interrupted"):
        machine.run("while True:\n    pass", tiles="2-3", timeout=0.1)
    assert machine.run("print('free')", tiles="2-3", timeout=10).format() == "[2 tiles: 2-3]\nfree\n"


def _busy_machine(machine, seconds: float):
    """A program computing on tile 0 for ``seconds`` without an exchange point: the
    scheduler takes no new job meanwhile."""
    busy = machine.launch("while True:\n    pass\n", tiles="0")
    threading.Timer(seconds, busy.interrupt).start()
    time.sleep(0.2)  # (well inside its compute)
    return busy


def _never_ran(machine, tile: int) -> bool:
    result = machine.run("import os\nprint(os.path.exists('/ran'))", tiles=str(tile), timeout=10)
    return result.tiles[0].output == "False\n"


@pytest.mark.parametrize("data, room", [(None, 1024), (("x" * 74 + "\n") * 20, 2048)])
def test_a_program_a_tile_has_no_room_for_starts_on_no_tile(machine, data, room):
    """Tile 5's SRAM cannot take the program's text (or its share of the data beside
    it): it failed with a MemoryError, while tile 4 ran up to its first exchange point,
    leaving a file behind. The program is refused before it starts, saying why."""
    memory = machine.sram.memory(5)
    machine.scheduler.call_wait(lambda: memory.alloc("filler", memory.largest_free() - room))
    program = "open('/ran', 'w').close()\nsync()\n# " + "padding " * 200 + "\n"
    try:
        with pytest.raises(ValueError) as info:
            machine.run(program, tiles="4-5", data=data)
    finally:
        machine.scheduler.call_wait(memory.free, "filler")
    if data is None:
        assert str(info.value).startswith(f"the program ({len(program)} bytes) does not fit in the free SRAM "
                                          "of tile 5, which has room for 1024 bytes at most")
    else:
        assert "tile 5's share is 750 bytes, and it has room for " in str(info.value)
    assert _never_ran(machine, 4) and _never_ran(machine, 5)
    # with the room back, it runs (writing no file: the machine is the module's)
    assert machine.run(program.replace("open('/ran', 'w').close()", "pass"), tiles="4-5", data=data).ok


@pytest.mark.parametrize("data", [None, "its share\n"])
def test_run_timeout_bounds_the_wait_for_a_busy_machine_to_take_the_program(machine, data):
    # (with data, whose room is checked on the scheduler thread first, it waited for good)
    busy = _busy_machine(machine, 2.0)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="did not start within 0.3 s"):
        machine.run("open('/ran', 'w').close()", tiles="5", data=data, timeout=0.3)
    assert time.monotonic() - started < 1.5
    busy.wait(10)
    assert _never_ran(machine, 5)


@pytest.mark.parametrize("timeout, error, message", [
    (0, ValueError, "timeout must be more than 0 seconds (or None: no limit), not 0"),
    (-1, ValueError, "timeout must be more than 0 seconds"),
    (float("nan"), ValueError, "timeout must be more than 0 seconds"),
    ("1", TypeError, "timeout is seconds (a number, or None: no limit), not '1'"),
    (True, TypeError, "timeout is seconds")])
def test_a_timeout_that_is_no_wait_is_refused_before_anything_starts(machine, timeout, error, message):
    # (0 on an idle machine said a tile was computing without an exchange point)
    with pytest.raises(error) as info:
        machine.run("open('/ran', 'w').close()", tiles="5", timeout=timeout)
    assert str(info.value).startswith(message)
    assert _never_ran(machine, 5)


@pytest.mark.parametrize("timeout", [float("inf"), 1e12])
def test_a_timeout_too_long_for_the_platform_is_no_limit(machine, timeout):
    # (threading raised OverflowError from inside the scheduler, and nothing ran)
    assert machine.run("print(1)", tiles="0", timeout=timeout).outputs() == {0: "1\n"}
    assert machine.launch("print(2)", tiles="0", start_timeout=timeout).wait().outputs() == {0: "2\n"}
    assert machine.repl("0").run("print(3)", timeout=timeout).outputs() == {0: "3\n"}
    assert machine.stats(timeout=timeout)["ntiles"] == machine.ntiles
    with pytest.raises(ValueError, match="must be more than 0 seconds"):
        machine.repl("0").run("print(4)", timeout=0)  # (a repl's timeout is checked too)


def test_ctrl_c_while_a_busy_machine_has_not_taken_the_program_starts_nothing(machine):
    import os
    import signal

    busy = _busy_machine(machine, 1.5)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))  # (a real Ctrl-C)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            machine.run("open('/ran', 'w').close()", tiles="6")
    finally:
        timer.cancel()
    busy.wait(10)
    assert _never_ran(machine, 6)


@pytest.mark.parametrize("api", ["run", "repl"])
def test_ctrl_c_in_run_stops_a_program_that_swallows_it(machine, api):
    """The caller stopped waiting and holds no handle: the program gets its Ctrl-C, and
    is then stopped whatever it catches, so its tiles take the next program."""
    import os
    import signal

    from daemon_harness import wait_for

    loop = "while True:\n    try:\n        sync()\n    except KeyboardInterrupt:\n        pass\n"
    scheduler = machine.scheduler

    def on_tile_11():
        return scheduler.tiles[11].job

    def ctrl_c_once_it_runs():
        wait_for(lambda: on_tile_11() is not None, what="the program to start")
        os.kill(os.getpid(), signal.SIGINT)  # (a real Ctrl-C)

    repl = machine.repl(tiles="11") if api == "repl" else None
    presser = threading.Thread(target=ctrl_c_once_it_runs)
    presser.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            (machine.run(loop, tiles="11") if repl is None else repl.run(loop))
    finally:
        presser.join()
    try:
        wait_for(lambda: on_tile_11() is None, what="the program to stop")
    finally:
        job = on_tile_11()
        if job is not None:
            scheduler.interrupt_job(job, "the test is over")
        if repl is not None:
            repl.close()
    assert machine.run("print('free')", tiles="11").tiles[0].output == "free\n"


def test_host_threads_get_the_gil_while_tiles_exchange_back_to_back(machine):
    """Supersteps back to back release the GIL only for moments (numpy's copies), and a
    host thread waiting for it (the daemon's connections, the mount) waited seconds:
    twenty sleeps of a millisecond took ~8 s beside this program."""
    handle = machine.launch("while True:\n    send((__tileid + 1) % 4, 1)\n    recv()\n", tiles="12-15")
    try:
        started = time.monotonic()
        for _ in range(20):
            time.sleep(0.001)
        assert time.monotonic() - started < 2.0
    finally:
        handle.interrupt("the test is over")
        handle.wait(20)


# (catches at two depths: a stop the watchdog raised while a tile computed could land
# between the try and its loop's jump, and end the program there, once in a while)
_CATCHES_EVERY_STOP = ("f = open('/left-open', 'w')\n"
                       "n = f.write('written %d' % __tileid)  # (no echo in a repl)\n"
                       "print('began')\n"
                       "while True:\n"
                       "    try:\n"
                       "        while True:\n"
                       "            try:\n"
                       "                x = sum(range(20000))\n"
                       "                y = {waits_in}  # (no echo in a repl)\n"
                       "            except BaseException:  # (what a bare except: does)\n"
                       "                pass\n"
                       "    except BaseException:\n"
                       "        pass\n")


@pytest.mark.parametrize("api", ["run", "repl"])
@pytest.mark.parametrize("waits_in", ["sync()", "allreduce(1)"])
def test_a_stop_caught_at_an_exchange_point_leaves_the_program_there(machine, api, waits_in):
    """A program catching every stop (kill) and exchanging in its loop is left at its
    next exchange point: raised again, the stop would be caught again. Its part ends
    interrupted, saying so, with what it printed; the file it left open is closed (its
    write kept); its tiles take the next program, which exchanges as ever."""
    tiles = "8-11"
    repl = machine.repl(tiles=tiles) if api == "repl" else None
    source = _CATCHES_EVERY_STOP.format(waits_in=waits_in)
    handle = machine.launch(source, tiles=tiles) if repl is None else repl.launch(source)
    try:
        _wait_until_it_loops(machine)
        handle.interrupt("killed by the test")
        result = handle.wait(20)
    finally:
        if repl is not None:
            repl.close()
    assert [tile.status for tile in result.tiles] == ["interrupted"] * 4
    assert [tile.output for tile in result.tiles] == ["began\n"] * 4
    assert {tile.error for tile in result.tiles} == {
        "killed by the test; its program caught that and ran on, and its tile left it at its next exchange point\n"}
    assert result.exit_status == 130
    after = machine.run("print(open('/left-open').read(), allreduce(1))", tiles=tiles)
    assert [tile.output for tile in after.tiles] == [f"written {rank} 4\n" for rank in range(4)]
    assert machine.scheduler.internal_errors == []


@pytest.mark.skipif(not hasattr(__import__("ctypes").pythonapi, "PyFrame_LocalsToFast"),
                    reason="Python 3.13 has no way to write a frame's locals: they stay")
def test_a_left_program_lets_go_of_what_its_functions_held(machine):
    """The left program's frames stay parked with its greenlet, but not what its
    functions' local variables held: 20 MB a function held stayed with every kill."""
    source = ("class HeldByAFunction:\n    pass\n"
              "def work():\n"
              "    held = HeldByAFunction()\n"
              "    while True:\n"
              "        try:\n"
              "            while True:\n"
              "                try:\n"
              "                    sync()\n"
              "                except BaseException:\n"
              "                    pass\n"
              "        except BaseException:\n"
              "            pass\n"
              "work()\n")
    handle = machine.launch(source, tiles="8-9")
    _wait_until_it_loops(machine)
    handle.interrupt("killed by the test")
    assert handle.wait(20).exit_status == 130
    gc.collect()
    assert [type(o).__name__ for o in gc.get_objects() if type(o).__name__ == "HeldByAFunction"] == []


@pytest.mark.parametrize("waits_in", ["sync()", "allreduce(1)"])
def test_closing_a_machine_leaves_a_program_that_catches_every_stop(waits_in):
    """Closing stops every job, and a program that catches the stop is left at its next
    exchange point once its grace is over, not waited for until the machine's own grace
    runs out (then thrown GreenletExit, which it caught too)."""
    machine = Machine("tiny")
    try:
        handle = machine.launch(_CATCHES_EVERY_STOP.format(waits_in=waits_in), tiles="0-3")
        _wait_until_it_loops(machine)
    finally:
        machine.close()
    result = handle.wait(0)
    assert {tile.error for tile in result.tiles} == {
        ("the machine is shutting down; its program caught that and ran on, and its tile left it at its next "
         "exchange point\n")}
    assert machine.scheduler.internal_errors == []


@pytest.mark.parametrize("waits_in", ["sync()", "allreduce(1)"])
def test_a_job_whose_tile_failed_leaves_the_tiles_catching_its_stop(machine, waits_in):
    """Tile 8 fails; the others catch the JobAborted raised in them and exchange on among
    themselves. The job never ended (only a kill did); now, as after a kill, their tiles
    leave them at their next exchange point a second later, saying why."""
    failing = ("if __tileid == 0:\n"
               "    for _ in range(5):\n"
               f"        y = {waits_in}\n"
               "    raise ValueError('the failure')\n")
    source = failing + _CATCHES_EVERY_STOP.format(waits_in=waits_in)
    tiles = "8-11"
    started = time.monotonic()
    result = machine.launch(source, tiles=tiles).wait(20)
    assert time.monotonic() - started < 10  # (the grace is 1 s)
    assert [tile.status for tile in result.tiles] == ["error"] + ["aborted"] * 3, result.format()
    assert "ValueError: the failure" in result.tiles[0].error
    assert {tile.error for tile in result.tiles[1:]} == {
        "aborted: job %d stopped: tile 0 (machine tile 8) failed with ValueError: the failure; its program caught that and "
        "ran on, and its tile left it at its next exchange point\n" % result.job_id}
    assert [tile.output for tile in result.tiles] == [""] + ["began\n"] * 3
    after = machine.run("print(open('/left-open').read(), allreduce(1))", tiles="9-11")
    assert [tile.output for tile in after.tiles] == [f"written {rank} 3\n" for rank in range(1, 4)]
    assert machine.scheduler.internal_errors == []


def test_tiles_that_catch_a_failure_have_their_grace_once_every_tile_has_taken_it(machine):
    """Tile 8 fails at once; the others compute ~0.7 s each, one after another, to their
    sync, catch the stop and exchange once to clean up. The grace began at the failure,
    so it was spent before the last tiles' turn came, and their cleanup was cut short."""
    source = ("if __tileid == 0:\n"
              "    raise ValueError('the failure')\n"
              "x = sum(range(40 * 10 ** 6))\n"
              "try:\n"
              "    sync()\n"
              "except BaseException as e:\n"
              "    print('caught', type(e).__name__)\n"
              "    sync()\n"
              "    print('cleaned up')\n"
              "    raise\n")
    result = machine.launch(source, tiles="8-11").wait(20)
    assert [tile.output for tile in result.tiles] == [""] + ["caught JobAborted\ncleaned up\n"] * 3, result.format()
    assert {tile.error for tile in result.tiles[1:]} == {
        "aborted: job %d stopped: tile 0 (machine tile 8) failed with ValueError: the failure\n" % result.job_id}


def test_each_tile_has_its_grace_from_the_stop_landing_in_it(machine):
    """Sixteen tiles; tile 0 fails at once; each other tile computes ~0.17 s, one after
    another, catches the stop and tries a cleanup allreduce (refused: tile 0 is gone).
    The first refusal began the job's grace, and the tiles whose turn came a second
    later were left at their first cleanup exchange."""
    source = ("if __tileid == 0:\n"
              "    raise ValueError('the failure')\n"
              "x = sum(range(10 ** 7))\n"
              "try:\n"
              "    sync()\n"
              "except BaseException as e:\n"
              "    print('caught', type(e).__name__)\n"
              "    try:\n"
              "        allreduce(1)\n"
              "    except Exception as e2:\n"
              "        print('cleanup:', type(e2).__name__)\n"
              "    print('saved')\n"
              "    raise\n")
    result = machine.launch(source, tiles="0-15").wait(60)
    assert [tile.output for tile in result.tiles[1:]] == [
        "caught JobAborted\ncleanup: CollectiveMismatchError\nsaved\n"] * 15, result.format()


def test_a_stop_landing_in_a_teardown_del_is_not_taken_for_one_the_program_caught(machine):
    """Tile 0's program, catching nothing, ends as tile 1 fails; its teardown runs four
    ``__del__`` that each write a file on another tile's disk, while another job makes
    each superstep last ~1 s. A stop landing in one of them (ignored there, as Python
    ignores what a ``__del__`` raises) set the program down as one that caught its stop:
    the tile left it in the middle of its teardown, past its grace, and said it had caught
    that and run on."""
    source = ("class Saver:\n"
              "    def __init__(self, t):\n"
              "        self.t = t\n"
              "    def __del__(self):\n"
              "        with open('/tiles/%d/out' % self.t, 'w') as f:\n"
              "            f.write('saved')\n"
              "if __tileid == 0:\n"
              "    a, b, c, d = Saver(3), Saver(4), Saver(5), Saver(6)\n"
              "for i in range(3):\n"
              "    if __tileid == 2:\n"
              "        x = sum(range(12 * 10 ** 6))\n"
              "    sync()\n"
              "if __tileid == 1:\n"
              "    raise ValueError('the failure')\n"
              "if __tileid == 2:\n"
              "    sync()\n")
    handle = machine.launch(source, tiles="0-2")
    slow = machine.launch("for i in range(6):\n    x = sum(range(60 * 10 ** 6))\n    sync()\n", tiles="9")
    result = handle.wait(60)
    slow.wait(60)
    assert result.tiles[0].error.endswith(
        "aborted: job %d stopped: tile 1 failed with ValueError: the failure\n" % result.job_id), result.format()
    assert "caught that and ran on" not in result.tiles[0].error


_CLEANS_UP = ("try:\n"
              "    while True:\n"
              "        {work}\n"
              "        sync()\n"
              "except BaseException as e:\n"
              "    print('caught', type(e).__name__)\n"
              "    y = sum(range(20000))\n"
              "    sync()\n"
              "    y = sum(range(20000))\n"
              "    print('cleaned up')\n")


def test_a_kill_leaves_every_tile_its_cleanup(machine):
    """Sixteen tiles loop computing a little between syncs; on a kill each catches the
    stop, computes a little, exchanges once and ends. The watchdog raised the stop again
    in tiles it found computing in their handler, and a tile it had stopped computing
    took the stop a second time at its cleanup's sync: 2-4 tiles' cleanups were cut."""
    for _ in range(3):
        handle = machine.launch(_CLEANS_UP.format(work="y = sum(range(2000))"), tiles="0-15")
        _wait_until_it_loops(machine, 20)
        handle.interrupt("killed by the test")
        result = handle.wait(20)
        assert [tile.output for tile in result.tiles] == ["caught TileInterrupt\ncleaned up\n"] * 16, result.format()


def test_the_budget_leaves_every_tile_its_cleanup_and_names_the_tile_over_it(machine):
    """Tile 2 computes past the budget; every tile catches what is raised in it, cleans
    up with one sync and ends. The tile over budget then took the budget's stop a second
    time at its cleanup's sync, and the others the failure that tile's end made: no
    cleanup finished, and the tile over budget was reported aborted, not failed with the
    budget's error, as a tile that caught that and ended is."""
    source = _CLEANS_UP.format(work="if __tileid == 2:\n            for i in range(3 * 10 ** 6):\n                pass")
    for _ in range(3):
        result = machine.launch(source, tiles="0-3", budget=0.05).wait(20)
        assert [tile.status for tile in result.tiles] == ["ok", "ok", "error", "ok"], result.format()
        assert all(tile.output.endswith("cleaned up\n") for tile in result.tiles), result.format()
        assert result.tiles[2].output.startswith("caught ComputeBudgetExceeded\n")
        assert result.tiles[2].error == ("ipuos.scheduler.ComputeBudgetExceeded: tile 2 computed for more than "
                                         "0.05 s without reaching an exchange point\n")


def _wait_until_it_loops(machine, supersteps: int = 5) -> None:
    """Wait until the machine has run ``supersteps`` more supersteps."""
    from daemon_harness import wait_for

    start = machine.scheduler.superstep
    wait_for(lambda: machine.scheduler.superstep > start + supersteps, what="the program to loop")


#: a program's start: tile 0 fails, and tile 1 catches the job's stop at its sync
_TILE_1_CATCHES_TILE_0S_FAILURE = ("if __tileid == 0:\n"
                                   "    raise ValueError('the failure')\n"
                                   "try:\n"
                                   "    sync()\n"
                                   "except BaseException:\n"
                                   "    print('caught')\n")


def test_a_tile_that_caught_its_jobs_failure_and_computes_forever_ends_at_a_kill(machine):
    """Tile 0 fails; tile 1 takes the job's stop at its sync, catches it and computes on
    forever: a runaway, which a kill ends. Neither the failure's
    grace nor the kill's began (each begins on the scheduler's thread, which tile 1
    holds), and the watchdog took that for a grace not over, and raised nothing."""
    from daemon_harness import wait_for

    source = (_TILE_1_CATCHES_TILE_0S_FAILURE +
              "while True:\n"
              "    pass\n")
    handle = machine.launch(source, tiles="0-1")
    wait_for(lambda: machine.scheduler.tiles[1].stop_taken, what="tile 1 to catch the failure")
    time.sleep(0.5)
    assert not handle.job.future.done()  # (a runaway: nothing but a kill or a budget ends it)
    started = time.monotonic()
    handle.interrupt("killed by the test")
    result = handle.wait(30)
    assert time.monotonic() - started < 5
    assert [tile.status for tile in result.tiles] == ["error", "interrupted"], result.format()
    assert result.tiles[1].output == "caught\n"


def test_a_cleanup_that_tries_a_few_collectives_is_not_taken_for_a_spin(machine):
    """Sixteen tiles; tile 0 fails at once; the others compute ~0.17 s each, then their
    ``finally:`` tries three collectives, each refused at once (tile 0 is gone), and
    prints. Two refusals in a superstep were taken for a program spinning on them, and
    the later tiles were left before they printed, though they caught no stop."""
    source = ("if __tileid == 0:\n"
              "    raise ValueError('the failure')\n"
              "x = sum(range(10 ** 7))\n"
              "try:\n"
              "    sync()\n"
              "finally:\n"
              "    for i in range(3):\n"
              "        try:\n"
              "            allreduce(1)\n"
              "        except Exception:\n"
              "            pass\n"
              "    print('saved')\n")
    result = machine.launch(source, tiles="0-15").wait(60)
    assert [tile.output for tile in result.tiles[1:]] == ["saved\n"] * 15, result.format()


def test_tiles_that_catch_a_kill_and_compute_on_are_all_left_within_a_few_seconds(machine):
    """Each of sixteen tiles catches the kill at its sync and then computes on without an
    exchange point; each had a second of grace counted from its own turn, and took the
    scheduler's thread in turn: 15 s for 16 tiles (25 minutes for 1472)."""
    source = ("try:\n"
              "    while True:\n"
              "        sync()\n"
              "except:\n"
              "    pass\n"
              "while True:\n"
              "    try:\n"
              "        send((__tileid + 1) % __numtiles, 1)\n"
              "    except:\n"
              "        pass\n")
    handle = machine.launch(source, tiles="0-15")
    _wait_until_it_loops(machine)
    started = time.monotonic()
    handle.interrupt("killed by the test")
    result = handle.wait(30)
    assert time.monotonic() - started < 10  # (STOP_CATCH_LIMIT is 5 s)
    assert {tile.status for tile in result.tiles} == {"interrupted"}


def test_a_program_that_caught_a_failure_and_loops_on_a_refused_collective_is_left_soon(machine):
    """Tile 0 fails; tile 1 catches the job's stop and loops: a collective, refused at
    once, then ~40 ms of compute. Only a thousand refusals in a superstep began the
    job's grace: 40 s. Refused past its own second, it spins as surely."""
    source = (_TILE_1_CATCHES_TILE_0S_FAILURE +
              "while True:\n"
              "    try:\n"
              "        allreduce(1)\n"
              "    except Exception:\n"
              "        pass\n"
              "    x = sum(range(3 * 10 ** 6))\n")
    started = time.monotonic()
    result = machine.launch(source, tiles="0-1").wait(120)
    assert time.monotonic() - started < 6
    assert [tile.status for tile in result.tiles] == ["error", "aborted"], result.format()
    assert result.tiles[1].output.startswith("caught\n")


def test_a_program_that_caught_a_failure_and_loops_on_a_full_send_is_left(machine):
    """Tile 1 catches the job's stop and sends to tile 0 for ever: once its outgoing
    buffer is full, each send fails at once. No exchange comes while it holds the
    thread, so the job's grace never began, and nothing ended it."""
    source = (_TILE_1_CATCHES_TILE_0S_FAILURE +
              "while True:\n"
              "    try:\n"
              "        send(0, 1)\n"
              "    except Exception:\n"
              "        pass\n")
    started = time.monotonic()
    result = machine.launch(source, tiles="0-1").wait(60)
    assert time.monotonic() - started < 5
    assert [tile.status for tile in result.tiles] == ["error", "aborted"], result.format()


def test_one_long_cleanup_after_a_failure_does_not_cut_the_later_tiles(machine, monkeypatch):
    """Tile 0 fails; every other tile catches the stop and cleans up, computing, then
    tries one collective (refused) and prints. Tile 1's cleanup, the first and longest,
    ran past its own second: that began the job's grace, and the limit after it cut the
    cleanups of the tiles whose turn came later. (The limit is cut to 1.5 s here so
    that the later tiles' cleanups, each well under their second, outlast it.)"""
    monkeypatch.setattr("ipuos.scheduler._job.STOP_CATCH_LIMIT", 1.5)
    source = ("if __tileid == 0:\n"
              "    raise ValueError('the failure')\n"
              "try:\n"
              "    sync()\n"
              "except BaseException:\n"
              "    for i in range((5 if __tileid == 1 else 1) * 10 ** 7):\n"
              "        pass\n"
              "    try:\n"
              "        allreduce(1)\n"
              "    except Exception:\n"
              "        pass\n"
              "    print('cleaned')\n")
    result = machine.launch(source, tiles="0-9").wait(120)
    assert [tile.output for tile in result.tiles[2:]] == ["cleaned\n"] * 8, result.format()


def _loop_rate(machine) -> float:
    """Iterations of an empty ``for`` loop a tile runs per second on this host."""
    started = time.monotonic()
    machine.run("for i in range(2 * 10 ** 6):\n    pass\n", tiles="0")
    return 2 * 10 ** 6 / (time.monotonic() - started)


def test_a_kill_mid_superstep_leaves_every_tile_within_a_few_seconds(machine):
    """Sixteen tiles compute ~0.2 s a superstep; the kill lands mid-superstep, and each
    tile's cleanup computes ~0.5 s (in Python: a stop lands only between bytecodes). The job's grace, and with it the 5 s limit, began
    only at the exchange, once every tile had computed its cleanup in turn: 12 s."""
    per_second = _loop_rate(machine)  # (the loops are sized in seconds: hosts differ threefold)
    source = ("try:\n"
              "    while True:\n"
              f"        for i in range({int(0.2 * per_second)}):\n"
              "            pass\n"
              "        sync()\n"
              "except BaseException:\n"
              f"    for i in range({int(0.5 * per_second)}):\n"
              "        pass\n"
              "    print('cleaned')\n"
              "    while True:\n"
              "        sync()\n")
    handle = machine.launch(source, tiles="0-15")
    time.sleep(1.0)
    started = time.monotonic()
    handle.interrupt("killed by the test")
    result = handle.wait(60)
    assert time.monotonic() - started < 8  # (STOP_CATCH_LIMIT is 5 s)
    assert {tile.status for tile in result.tiles} == {"interrupted"}, result.format()
    # the first to clean up had their second (those whose turn came past the limit, none)
    assert [tile.output for tile in result.tiles].count("cleaned\n") >= 3, result.format()


def test_kills_while_a_tile_leaves_a_program_keep_its_output_and_free_its_sram(machine):
    """Tile 0's program catches the kill and syncs on; leaving it, its tile tears it down,
    and four ``__del__`` there write files on other tiles' disks, a superstep or more
    each (another job makes them ~1 s). Kills meanwhile landed in a ``__del__``, and the
    next remote request left the program again from inside its own teardown: what it
    printed was lost and its SRAM stayed allocated."""
    source = ("class Saver:\n"
              "    def __init__(self, t):\n"
              "        self.t = t\n"
              "    def __del__(self):\n"
              "        with open('/tiles/%d/out' % self.t, 'w') as f:\n"
              "            f.write('saved')\n"
              "a, b, c, d = Saver(3), Saver(4), Saver(5), Saver(6)\n"
              "print('started')\n"
              "while True:\n"
              "    try:\n"
              "        sync()\n"
              "    except BaseException as e:\n"
              "        pass\n")
    slow = machine.launch("for i in range(12):\n    x = sum(range(4 * 10 ** 7))\n    sync()\n", tiles="9")
    handle = machine.launch(source, tiles="0")
    time.sleep(1.0)
    started = time.monotonic()
    handle.interrupt("killed by the test")
    while True:
        try:
            result = handle.wait(0.3)
            break
        except TimeoutError:
            if time.monotonic() - started > 1.2:
                handle.interrupt("killed by the test again")
    slow.interrupt("the test is done")
    slow.wait(20)
    assert result.tiles[0].output.startswith("started\n"), result.format()
    regions = machine.scheduler.call(lambda: [r.name for r in machine.scheduler.tiles[0].memory.regions]).result(5)
    assert not [name for name in regions if name.startswith("job")], regions
    assert machine.scheduler.internal_errors == []


def test_a_program_that_catches_nothing_keeps_what_it_wrote_to_another_tiles_disk(machine):
    """Tile 0 writes a file on tile 3's disk and waits; tile 1 fails, and tile 2
    computes ~1.7 s on before its next exchange point. Tile 0's program, catching
    nothing, ended and closed the file: that close, a request to tile 3, was taken for
    the program running on after its stop, and the tile left it there, the data lost."""
    source = ("if __tileid == 0:\n"
              "    f = open('/tiles/3/out', 'w')\n"
              "    f.write('written by tile 0')\n"
              "sync()\n"
              "if __tileid == 1:\n"
              "    raise ValueError('the failure')\n"
              "if __tileid == 2:\n"
              "    x = sum(range(100 * 10 ** 6))\n"
              "sync()\n")
    result = machine.launch(source, tiles="0-2").wait(20)
    assert result.tiles[0].error == ("aborted: job %d stopped: tile 1 failed with "
                                     "ValueError: the failure\n" % result.job_id), result.format()
    assert machine.run("print(open('/tiles/3/out').read())", tiles="0").tiles[0].output == "written by tile 0\n"


def test_a_recv_that_can_never_be_met_after_a_caught_failure_is_a_deadlock(machine):
    """A failure no longer turned off the job's deadlock reports: a program that caught
    it and then waited for the failed tile waited out the grace instead (and one run
    by the shell on tile 0, which is never left, for good)."""
    source = ("if __tileid == 0:\n"
              "    raise ValueError('the failure')\n"
              "try:\n"
              "    sync()\n"
              "except BaseException:\n"
              "    recv(0)\n")
    started = time.monotonic()
    result = machine.launch(source, tiles="8-9").wait(20)
    assert time.monotonic() - started < 0.9  # (not after the 1 s grace)
    assert result.tiles[1].status == "error"
    assert result.tiles[1].error.endswith(
        "DeadlockError: tile 1 (machine tile 9) waits to recv from tile 0 (machine tile 8), which "
        "failed and sent nothing more\n"), result.tiles[1].error


def test_tiles_catching_a_collective_mismatch_hear_that_the_job_is_over(machine):
    """Tile 8 syncs while the others reduce: the mismatch fails tile 8, which catches
    nothing, and the others caught theirs and reduced again, each call refused at once
    (a tile has gone): the tile's failure never reached them (it came while they still had
    the mismatch to raise), and the job spun for good on the scheduler's thread."""
    source = "if __tileid == 0:\n    sync()\n" + _CATCHES_EVERY_STOP.format(waits_in="allreduce(1)")
    result = machine.launch(source, tiles="8-11").wait(20)
    assert [tile.status for tile in result.tiles] == ["error"] + ["aborted"] * 3, result.format()
    assert "CollectiveMismatchError: collective mismatch" in result.tiles[0].error
    assert all(tile.error.startswith("aborted: job %d stopped: tile 0 (machine tile 8) failed with "
                                     "CollectiveMismatchError: " % result.job_id) for tile in result.tiles[1:])
    assert machine.run("print(allreduce(1))", tiles="8-11").tiles[0].output == "4\n"
    assert machine.scheduler.internal_errors == []


def test_a_job_out_of_budget_leaves_the_tiles_catching_its_stop(machine):
    """Tile 8 computes past the job's budget once; every tile catches what is raised in
    it and syncs on: the job never ended. Now each tile leaves its program a second on."""
    source = ("first = True\n"
              "while True:\n"
              "    try:\n"
              "        while True:\n"
              "            try:\n"
              "                if __tileid == 0 and first:\n"
              "                    first = False\n"
              "                    for _ in range(10 ** 8):\n"
              "                        pass\n"
              "                sync()\n"
              "            except BaseException:\n"
              "                pass\n"
              "    except BaseException:\n"
              "        pass\n")
    result = machine.launch(source, tiles="8-11", budget=0.05).wait(20)
    # (the tile over budget too: it caught the budget's exception and took the job's stop
    # after, as in test_a_caught_compute_budget_still_ends_the_job_on_every_tile_saying_why)
    assert [tile.status for tile in result.tiles] == ["aborted"] * 4, result.format()
    left = "; its program caught that and ran on, and its tile left it at its next exchange point\n"
    budget = "tile 0 (machine tile 8) computed for more than 0.05 s without reaching an exchange point"
    assert {tile.error for tile in result.tiles} == {f"aborted: {budget}{left}"}
    assert machine.scheduler.internal_errors == []


@pytest.mark.parametrize("waits_in", ["sync()", "allreduce(1)"])
def test_every_handler_of_a_ctrl_c_exchanges_with_the_others(machine, waits_in):
    """Tile 0 computes while the others wait in a collective; on a Ctrl-C each tile's
    handler reduces again. With three tiles or more, the first tile out of the
    collective met those still leaving it (a collective mismatch); a part sent for the
    interrupted allreduce was summed with the handlers' (21 instead of 30)."""
    from daemon_harness import wait_for

    source = ("try:\n"
              "    if __tileid == 0:\n"
              "        recv(1)  # (by the time it comes, the others wait)\n"
              "        while True:\n"
              "            pass\n"
              "    if __tileid == 1:\n"
              "        send(0, 'go')\n"
              f"    {waits_in}\n"
              "except KeyboardInterrupt:\n"
              "    print('handler', allreduce(10))\n")
    scheduler = machine.scheduler
    handle = machine.launch(source, tiles="0-3")
    wait_for(lambda: scheduler.computing_tile() is scheduler.tiles[0], what="tile 0 computing")
    handle.interrupt(ctrl_c=True)
    result = handle.wait(10)
    assert [run.output for run in result.tiles] == ["handler 40\n"] * 4, result.format()
    assert result.exit_status == 0


def _ctrl_c_while_one_computes(machine, source: str, first: int, last: int):
    """Launch ``source`` on tiles ``first`` to ``last``, press Ctrl-C once one of them
    computes, and return the result (the program must end well)."""
    from daemon_harness import wait_for

    scheduler = machine.scheduler
    handle = machine.launch(source, tiles=f"{first}-{last}")
    wait_for(lambda: scheduler.computing_tile() in scheduler.tiles[first:last + 1], what="a tile computing")
    handle.interrupt(ctrl_c=True)
    result = handle.wait(10)
    assert result.exit_status == 0, result.format()
    return result


#: tests of the scheduler thread counting bytecodes to a Ctrl-C (see test_scheduler.py)
counting = pytest.mark.skipif(sys.gettrace() is not None or sys.version_info[:2] == (3, 12),
                              reason="a traced thread (coverage, a debugger), or Python 3.12: the watchdog's")


@counting
def test_tiles_that_begin_after_a_ctrl_c_take_it_after_as_many_bytecodes_each(machine):
    """The tile program's view of the scheduler's test of this: the tile that computes
    when the Ctrl-C comes counts on as far as it got; each tile begun after it takes its
    Ctrl-C after as many bytecodes of its program as the next, so all count as far."""
    import collections

    source = ("n = 0\n"
              "try:\n"
              "    while True:\n"
              "        n += 1\n"
              "except KeyboardInterrupt:\n"
              "    print(n)\n")
    result = _ctrl_c_while_one_computes(machine, source, 4, 7)
    counts = collections.Counter(run.output for run in result.tiles)
    assert sorted(counts.values()) == [1, 3], result.format()
    assert machine.scheduler.internal_errors == []


@counting
def test_tiles_that_begin_after_a_ctrl_c_take_it_in_their_program_not_in_a_file_operation(machine):
    """The tiles begun after the Ctrl-C spend most of their bytecodes listing a
    directory: ipuos' own code, but which makes namedtuples, whose methods the standard
    library compiles from strings. Counted as the program's, the Ctrl-C came in the
    middle of the VFS's listing; it comes in the program's own code."""
    source = ("import os\n"
              "os.mkdir('/listed')\n"
              "for i in range(40):\n"
              "    open(f'/listed/f{i}', 'w').close()\n"
              "try:\n"
              "    while True:\n"
              "        os.listdir('/listed')\n"
              "except KeyboardInterrupt as e:\n"
              "    tb = e.__traceback__\n"
              "    while tb.tb_next is not None:\n"
              "        tb = tb.tb_next\n"
              "    print(tb.tb_frame.f_code.co_filename)\n"
              "finally:\n"
              "    for name in os.listdir('/listed'):\n"
              "        os.remove('/listed/' + name)\n"
              "    os.rmdir('/listed')\n")
    result = _ctrl_c_while_one_computes(machine, source, 12, 15)
    assert [run.output for run in result.tiles] == ["<program>\n"] * 4, result.format()


@counting
def test_a_ctrl_c_python_drops_in_a_tile_program_is_raised_again(machine):
    """The program frees a generator whose ``finally:`` computes, where Python drops any
    exception: a Ctrl-C raised there is raised again, and told of nowhere (it was lost:
    the tiles computed on, and "Exception ignored" was printed)."""
    source = ("def gen():\n"
              "    try:\n"
              "        yield\n"
              "    finally:\n"
              "        t = 0\n"
              "        for i in range(60):\n"
              "            t += i\n"
              "try:\n"
              "    while True:\n"
              "        if __tileid:\n"
              "            g = gen()\n"
              "            next(g)\n"
              "            del g\n"
              "except KeyboardInterrupt:\n"
              "    print('caught')\n")
    result = _ctrl_c_while_one_computes(machine, source, 4, 7)
    assert [run.output for run in result.tiles] == ["caught\n"] * 4, result.format()


def test_a_repl_as_a_context_manager_frees_its_tiles_data_on_the_way_out(machine):
    def regions() -> list[str]:
        return [r["name"] for r in machine.sram_usage(9)["regions"]]

    with pytest.raises(ZeroDivisionError):
        with machine.repl(tiles="9", data="payload") as repl:
            assert repl.run("print(__tiledata)").tiles[0].output == "payload\n"
            assert any(name.endswith(".tiledata") for name in regions())
            1 / 0
    assert not any(name.endswith(".tiledata") for name in regions())


def test_interrupting_a_finished_job_keeps_nothing(machine):
    handle = machine.launch("x = bytes(1000)", tiles="4")
    handle.wait(10)
    handle.interrupt()  # (try: wait() finally: interrupt() is a common pattern)
    assert handle.job not in machine.scheduler.watchdog._interrupts


def test_tracebacks_show_the_failing_programs_own_lines(machine):
    # another program compiled since must not lend its text to this one's traceback
    failing = machine.launch("x = 1\n1/0\n", tiles="0")
    failing.wait(10)
    machine.run("y = 2\nprint('unrelated')\n", tiles="1")
    text = failing.wait(10).format()
    assert "    1/0" in text and "unrelated" not in text
    first, second = machine.repl(tiles="2"), machine.repl(tiles="3")
    block = first.launch("a = 1\nb = 1/0\n")
    second.run("zzz = 5\nqqq = 6\n")
    assert "b = 1/0" in block.wait(10).format()
    first.close()
    second.close()


def test_a_host_request_to_a_tile_that_is_no_int_fails_at_once(machine):
    import numpy as np

    machine.fs.write_file(3, "/n", b"x")
    assert "n" in machine.fs.listdir(np.int64(3), "/")  # (an integer, as run()'s tiles take)
    for bad in ("3", True, 3.0, None):
        with pytest.raises(TypeError, match=f"a tile id is an integer, not {bad!r}"):
            machine.fs.listdir(bad, "/")
    with pytest.raises(IndexError, match="no tile 99: this machine has tiles 0-15"):
        machine.fs.listdir(99, "/")


def test_busy_tiles_are_refused(machine):
    handle = machine.launch("while True:\n    sync()", tiles="5")
    try:
        with pytest.raises(TileBusyError, match="tile 5 already runs job"):
            machine.run("pass", tiles="4-6")
    finally:
        handle.interrupt()
        handle.wait(5)


def test_programs_from_many_host_threads_at_once(machine):
    results = {}

    def worker(tile):
        results[tile] = machine.run(f"print(allreduce({tile}))", tiles=[tile]).tiles[0].output

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == {t: f"{t}\n" for t in range(16)}


def test_tile_states_and_sram_usage(machine):
    handle = machine.launch("while True:\n    sync()", tiles="3")
    try:
        deadline = time.monotonic() + 5
        while True:
            states = {s["tile"]: s for s in machine.tile_states()}
            if states[3]["state"] != "idle" or time.monotonic() > deadline:
                break
        assert states[3]["job"] == handle.job.id and states[3]["state"] in ("running", "waiting")
        assert states[9]["state"] == "idle" and states[9]["job"] is None
        usage = machine.sram_usage(3)
        names = [r["name"] for r in usage["regions"]]
        assert "exchange.out" in names and "exchange.in" in names
        assert any(n.endswith(".program") for n in names)
    finally:
        handle.interrupt()
        handle.wait(5)


def test_stats_report_simulated_time_separately(machine):
    machine.run("x = alltoall(b'y' * 64)")
    stats = machine.stats()
    assert stats["supersteps"] > 0 and stats["bytes_exchanged"] > 0
    assert 0 < stats["simulated_exchange_seconds"] < 1
    # the geometry in the words of status --json: a count of tiles is ntiles
    assert (stats["preset"], stats["ipus"], stats["ntiles"]) == ("tiny", 1, 16) and "tiles" not in stats


def test_close_interrupts_running_programs():
    m = Machine("tiny")
    handle = m.launch("while True:\n    pass", tiles="0")
    time.sleep(0.05)
    m.close()
    assert handle.wait(5).tiles[0].status == "interrupted"


@pytest.mark.parametrize("use", [
    lambda m: m.run("print(1)"),
    lambda m: m.repl("0"),
    lambda m: m.fs.listdir(0, "/"),
    lambda m: m.stats(),
], ids=["run", "repl", "fs", "stats"])
def test_a_closed_machine_says_it_was_shut_down(use):
    m = Machine("tiny")
    m.close()
    with pytest.raises(RuntimeError, match="^the machine has been shut down and runs nothing more: start a new one$"):
        use(m)


def _wait_for_threads_to_end(threads, seconds: float = 10.0) -> list:
    deadline = time.monotonic() + seconds
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [t.name for t in threads if t.is_alive()]


def test_a_machine_dropped_without_close_stops_its_threads():
    m = Machine("tiny")
    m.run("print('hello')", tiles="0-3")
    m.fs.write_file(2, "/f", b"x")
    threads = [m.scheduler._thread, m.scheduler.watchdog.thread]
    del m  # (a program still running would keep its machine, as a thread does)
    gc.collect()
    assert _wait_for_threads_to_end(threads) == []


def test_an_abandoned_machine_stopped_from_its_own_thread_does_not_wait_for_itself():
    """The garbage collector may finalize a dropped machine on the machine's own thread
    (any allocation in a tile program can run it): stopping must not join that thread."""
    from ipuos._machine import _stop_abandoned

    m = Machine("tiny")
    scheduler = m.scheduler
    threads = [scheduler._thread, scheduler.watchdog.thread]
    scheduler.services["test.stop"] = lambda tile: _stop_abandoned(scheduler, m.storage)
    scheduler.submit(1, "test.stop").result(5)  # returns: it did not wait for itself
    assert _wait_for_threads_to_end(threads) == []
    m.close()  # (nothing left to do)


def test_close_lets_go_of_every_tiles_filesystems():
    """A mounted littlefs holds buffers outside SRAM that nothing else frees: about
    10 MiB per mk1 machine stayed after close()."""
    m = Machine("tiny", storage="eager")
    m.fs.write_file(0, "/chip/f", b"x")
    handle = m.launch("f = open('/kept-open', 'w')\nwhile True:\n    sync()\n", tiles="3")
    time.sleep(0.1)
    filesystems = m.scheduler.call_wait(lambda: [
        m.scheduler.tiles[t].kernel_data["vfs"].backend(info.path).fs
        for t in range(m.ntiles) for info in m.scheduler.tiles[t].kernel_data["vfs"].mount_points()
        if hasattr(m.scheduler.tiles[t].kernel_data["vfs"].backend(info.path), "fs")])
    assert len(filesystems) == m.ntiles + 1 and all(fs.mounted for fs in filesystems)
    m.close()
    assert handle.wait(5).tiles[0].status == "interrupted"
    assert not any(fs.mounted for fs in filesystems)


def test_a_job_that_outlives_close_fails_its_waiters_instead_of_hanging_them(monkeypatch):
    from ipuos.scheduler import _job, _scheduler, _watchdog

    monkeypatch.setattr(_scheduler, "STOP_GRACE_SECONDS", 0.3)
    # a job that takes no interrupt (a program can swallow one, but only most of the time)
    monkeypatch.setattr(_job.Job, "interrupt", lambda self, *args, **kwargs: None)
    monkeypatch.setattr(_watchdog.Watchdog, "interrupt", lambda self, *args, **kwargs: None)
    m = Machine("tiny")
    handle = m.launch("while True:\n    sync()\n", tiles="0-1")
    time.sleep(0.1)
    m.close()
    with pytest.raises(RuntimeError, match="the machine stopped before job 1 was done"):
        handle.wait(3)


def test_the_public_api_is_importable_and_documented():
    import inspect

    undocumented = []
    for name in ipuos.__all__:
        obj = getattr(ipuos, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            if not inspect.getdoc(obj):
                undocumented.append(name)
            if inspect.isclass(obj) and obj.__module__.startswith("ipuos"):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or not (inspect.isfunction(member) or isinstance(member, property)):
                        continue
                    if not inspect.getdoc(member) and attr not in ("by_rank", "outputs"):
                        undocumented.append(f"{name}.{attr}")
    assert undocumented == []


def test_a_job_on_one_chip_of_several_pays_a_one_chip_sync():
    from ipuos._costmodel import CostModel

    model = CostModel()
    with Machine("tiny", ipus=3) as machine:
        supersteps = {}
        for spec in ("0-7", "10-20"):  # one chip; two chips
            result = machine.run("for i in range(10):\n    sync()\n", tiles=spec)
            supersteps[spec] = (result.stats.supersteps, result.stats.sim_seconds)
    (one_count, one_chip), (two_count, two_chips) = supersteps["0-7"], supersteps["10-20"]
    assert one_count == two_count and one_chip > 0
    assert one_chip / two_chips == pytest.approx(model.sync_cycles / model.multichip_sync_cycles)


def test_bad_tiles_and_data_arguments_are_clear(machine):
    for tiles in (True, 2.0):
        with pytest.raises(TileSpecError, match="a tile id or ids"):
            machine.run("pass", tiles=tiles)
    with pytest.raises(TypeError, match="data is text or bytes to split over the tiles, not int"):
        machine.run("pass", tiles="0", data=123)
    with pytest.raises(ValueError, match=r"the data is not UTF-8 text \(byte 3"):
        machine.run("pass", tiles="0-1", data=b"abc\xff\n")
    result = machine.run("print('x' * 100_000)", tiles="0", output_limit=None)  # no limit
    assert result.tiles[0].output == "x" * 100_000 + "\n"


def test_a_repl_block_over_its_budget_reports_the_programs_frames(machine):
    repl = machine.repl(tiles="0-1")
    text = repl.run("if __tileid == 0:\n    while True: pass\nelse:\n    sync()\n", budget=0.3).format()
    assert "ComputeBudgetExceeded: tile 0 computed for more than 0.3 s" in text
    assert "_scheduler.py" not in text and "ipuos.scheduler." not in text
    assert repl.run("print('alive')").format() == "[2 tiles: 0-1]\nalive\n"
    repl.close()


def test_a_first_file_operation_on_tile_0_does_not_end_its_superstep():
    """Tile 0's storage includes /chip, striped over the other tiles: bringing it up takes
    the exchange. It is up before any program runs, so a program's first import or file
    operation there is no exchange point (messages sent this superstep stay in flight)."""
    with Machine("tiny") as machine:
        result = machine.run("""
if __tileid == 1:
    send(0, "hello")
    sync()
else:
    before = poll(1)
    import os
    os.listdir("/")
    open("/x", "w").close()
    print(before, poll(1))
    sync()
    print(poll(1))
""", tiles="0-1")
        assert result.ok, result.format()
        assert result.tiles[0].output == "False False\nTrue\n"


def test_the_scheduler_names_the_tile_that_holds_it():
    """A program computing without an exchange point holds every tile; the daemon's
    'not answering' messages name it from this."""
    with Machine("tiny") as machine:
        assert machine.scheduler.computing_tile() is None
        handle = machine.launch("while True:\n    pass\n", tiles="5")
        try:
            deadline = time.monotonic() + 10
            while machine.scheduler.computing_tile() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            tile = machine.scheduler.computing_tile()
            assert tile is not None and tile.id == 5 and tile.job is not None
        finally:
            handle.interrupt()
            handle.wait(10)
        assert machine.scheduler.computing_tile() is None


def test_looks_at_a_busy_machine_can_be_bounded(machine):
    busy = _busy_machine(machine, 2.0)
    for look in (machine.stats, machine.tile_states, lambda **kw: machine.sram_usage(3, **kw)):
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="within 0.2 s: the machine answers between supersteps, and a "
                                               "tile is computing without reaching an exchange point"):
            look(timeout=0.2)
        assert time.monotonic() - started < 1.0
    busy.wait(10)
    assert machine.stats(timeout=5)["ntiles"] == 16 and len(machine.tile_states(timeout=5)) == 16
