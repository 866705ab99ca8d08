"""After one tile's exception, a tile whose exchange point had already completed runs on
to its next exchange point, however long it computes, in every superstep as in the
first: it keeps its output and may fail in its own way. The stop still reaches it there
(failure is contained, nothing hangs), and an interrupt or a compute budget still stops
every tile at once."""

from __future__ import annotations

import textwrap
import time

import pytest

from ipuos import Machine
from ipuos.scheduler import ABORTED, ERROR, INTERRUPTED, TileInterrupt


@pytest.fixture(scope="module")
def machine():
    with Machine("tiny") as m:
        yield m


def run(machine, source, tiles):
    return machine.run(textwrap.dedent(source), tiles=tiles, timeout=20)


def run_job(machine, target, tiles, budget=None):
    return machine.scheduler.start_job(tiles, target, budget=budget).future.result(20)


def test_a_failure_after_a_sync_lets_the_others_run_their_superstep(machine):
    result = run(machine, """
        sync()
        print("tile", __tileid, "computing")
        x = 1 / (__tileid - __tileid)
    """, tiles="0-3")
    for tile in result.tiles:
        assert tile.status == "error", result.format()
        assert tile.output == f"tile {tile.rank} computing\n"
        assert tile.error.rstrip().endswith("ZeroDivisionError: division by zero")


def test_a_recv_answered_before_the_failure_returns_its_message(machine):
    # the messages land in the order they were sent, and wake their receivers in that
    # order: tile 1 first, which fails before the others take their turns
    result = run(machine, """
        n = __numtiles
        send((__tileid + 1) % n, __tileid)
        got = recv((__tileid - 1) % n)
        print("tile", __tileid, "got", got)
        if __tileid == 1:
            raise ValueError("tile 1 fails")
        sync()
        print("never")
    """, tiles="0-3")
    assert [tile.output for tile in result.tiles] == [f"tile {r} got {(r - 1) % 4}\n" for r in range(4)]
    assert [tile.status for tile in result.tiles] == ["aborted", "error", "aborted", "aborted"]
    assert result.tiles[0].error.endswith("tile 1 failed with ValueError: tile 1 fails\n")


def test_a_tile_waiting_when_the_failure_comes_stops_at_that_exchange_point(machine):
    # tiles take their turns in rank order: tiles 0-2 are in their second sync when tile 3
    # fails in the same superstep, so they stop there
    result = run(machine, """
        sync()
        if __tileid == 3:
            raise ValueError("late")
        sync()
        print("tile", __tileid, "after the second sync")
    """, tiles="0-3")
    assert [tile.status for tile in result.tiles] == ["aborted", "aborted", "aborted", "error"]
    assert all(tile.output == "" for tile in result.tiles[:3]), result.format()


def test_a_tile_running_on_takes_the_stop_at_its_next_wait_and_never_hangs(machine):
    result = run(machine, """
        sync()
        if __tileid == 0:
            raise ValueError("boom")
        print("tile", __tileid, "runs on")
        recv(3 - __tileid if __tileid in (1, 2) else 1)  # nobody sends: only the stop ends it
    """, tiles="0-3")
    assert [tile.status for tile in result.tiles] == ["error", "aborted", "aborted", "aborted"]
    assert [tile.output for tile in result.tiles[1:]] == [f"tile {r} runs on\n" for r in (1, 2, 3)]


def test_an_interrupt_after_a_failure_stops_the_other_tiles_at_once(machine):
    ran_on = []

    def target(api):
        api.sync()
        if api.tileid == 0:
            raise ValueError("boom")
        if api.tileid == 1:  # runs on after tile 0's failure, and interrupts the job
            machine.scheduler.interrupt_job(api.job, "stopped by the test")
            return None
        ran_on.append(api.tileid)
        api.sync()
        return None

    report = run_job(machine, target, [0, 1, 2, 3])
    assert ran_on == []
    assert [r.status for r in report.results] == [ERROR, "ok", ABORTED, ABORTED]


def test_a_failure_after_an_interrupt_lets_no_tile_run_on(machine):
    # both tiles swallow the interrupt, tile 1 in a sync that then completes; tile 0 fails
    # in the next superstep: the job was interrupted first, so tile 1 stops at that sync
    # though it is over
    ran_on = []

    def target(api):
        try:
            api.sync()  # (tile 1 takes the interrupt here)
            if api.tileid == 0:
                machine.scheduler.interrupt_job(api.job, "stopped by the test")
                api.sync()  # (tile 0 here, once tile 1 has swallowed it and synced)
        except TileInterrupt:
            pass
        if api.tileid == 0:
            raise ValueError("boom")
        api.sync()
        ran_on.append(api.tileid)
        return None

    report = run_job(machine, target, [0, 1])
    assert ran_on == []
    assert [r.status for r in report.results] == [ERROR, ABORTED]


def test_an_interrupt_before_the_superstep_stops_every_tile_at_once(machine):
    ran_on = []

    def target(api):
        api.sync()
        if api.tileid == 0:
            machine.scheduler.interrupt_job(api.job, "stopped by the test")
            return None
        ran_on.append(api.tileid)
        return None

    report = run_job(machine, target, [0, 1, 2, 3])
    assert ran_on == []
    assert [r.status for r in report.results[1:]] == [INTERRUPTED] * 3


def test_a_compute_budget_still_stops_every_tile_at_once(machine):
    ran_on = []

    def target(api):
        api.sync()
        if api.tileid == 0:
            while True:
                pass
        ran_on.append(api.tileid)
        return None

    report = run_job(machine, target, [0, 1, 2, 3], budget=0.2)
    assert ran_on == []
    assert report.results[0].status == ERROR
    assert [r.status for r in report.results[1:]] == [ABORTED] * 3


#: compute (about 0.1-0.2 s) far longer than the watchdog's tick (10 ms): a tile running on
#: must not be interrupted, however long it computes before its next exchange point (no
#: `import time` to time it: an import may read a file, which is an exchange point)
LONG_COMPUTE = """
        x = 0
        for i in range(2_000_000):
            x += i
"""


@pytest.mark.parametrize("compute", ["", LONG_COMPUTE], ids=["at once", "after a long compute"])
def test_a_scatter_over_before_the_failure_hands_every_tile_its_item(machine, compute):
    """However long it computes first: the watchdog leaves a tile running on alone."""
    result = run(machine, """
        mine = scatter([10, 11, 12, 13] if __tileid == 0 else None)
        if __tileid == 0:
            raise ValueError("tile 0 fails")
    """ + compute + """
        print("tile", __tileid, "got", mine)
    """, tiles="0-3")
    assert [tile.status for tile in result.tiles] == ["error", "ok", "ok", "ok"], result.format()
    assert [tile.output for tile in result.tiles[1:]] == [f"tile {r} got {10 + r}\n" for r in (1, 2, 3)]


def test_a_failure_in_the_first_superstep_lets_the_others_compute_to_their_first_exchange(machine):
    result = run(machine, """
        if __tileid == 0:
            raise ValueError("tile 0 fails")
    """ + LONG_COMPUTE + """
        print("tile", __tileid, "reached its sync")
        sync()
        print("never")
    """, tiles="0-3")
    assert [tile.status for tile in result.tiles] == ["error", "aborted", "aborted", "aborted"], result.format()
    assert [tile.output for tile in result.tiles[1:]] == [f"tile {r} reached its sync\n" for r in (1, 2, 3)]


@pytest.mark.parametrize("operation", [
    'open("/runon.txt", "w").write("hi"); open("/runon.txt").read()',
    'import os; os.listdir("/"); os.makedirs("/runon_dir", exist_ok=True)',
    "import runon_mod",
], ids=["a file", "a directory", "an import"])
def test_a_tile_running_on_is_not_stopped_by_its_own_disk(machine, operation):
    # a file operation is an exchange point only when it reaches another tile's SRAM
    machine.fs.makedirs(1, "/lib", exist_ok=True)
    machine.fs.write_file(1, "/lib/runon_mod.py", b"X = 1\n")
    result = run(machine, f"""
        if __tileid == 0:
            raise KeyError("t0")
        print("before")
        {operation}
        print("after")
        sync()
        print("never")
    """, tiles="0-1")
    assert [tile.status for tile in result.tiles] == ["error", "aborted"], result.format()
    assert result.tiles[1].output == "before\nafter\n"


def test_a_tile_running_on_stops_at_a_file_operation_on_another_tile(machine):
    result = run(machine, """
        if __tileid == 1:
            raise KeyError("t1")
        print("before")
        open("/tiles/5/runon.txt", "w").write("x")
        print("never")
    """, tiles="0-1")
    assert [tile.status for tile in result.tiles] == ["aborted", "error"], result.format()
    assert result.tiles[0].output == "before\n"


def test_a_tile_running_on_in_a_chip_disk_loop_stops_once_it_reaches_the_stripes(machine):
    # its exchanges happen inside littlefs, where it must not stop: the next file
    # operation after one takes the stop
    result = run(machine, """
        import os
        if __tileid == 0:
            os.makedirs("/chip/runon", exist_ok=True)
        sync()
        if __tileid == 1:
            raise KeyError("t1")
        i = 0
        while True:
            open(f"/chip/runon/f{i % 4}", "wb").write(b"x" * 3000)
            i += 1
    """, tiles="0-1")
    assert [tile.status for tile in result.tiles] == ["aborted", "error"], result.format()


def test_an_interrupt_stops_a_tile_running_on_in_a_file_loop_at_once(machine):
    handle = machine.launch(textwrap.dedent("""
        if __tileid == 0:
            raise KeyError("t0")
        while True:
            open("/runon_spin.txt", "w").write("x")
    """), tiles="0-1")
    time.sleep(0.3)
    handle.interrupt()
    assert [tile.status for tile in handle.wait(10).tiles] == ["error", "interrupted"]
