"""The ``__del__`` of an object a program left in a reference cycle: it outlives the
program (only Python's cycle collector frees it) and runs wherever that collector next
runs: inside another job on another tile, on the scheduler's loop, on a host thread.
There, what the program had of its tile (its files, os, imports, print, primitives)
refuses with an error that says why, which Python reports as "Exception ignored", and
the tile, its files and the scheduler are left as they were."""

from __future__ import annotations

import gc
import sys
import textwrap

import pytest

from ipuos import Machine


@pytest.fixture(scope="module")
def machine():
    with Machine("tiny") as m:
        yield m


@pytest.fixture
def ignored(monkeypatch):
    """What Python reports as "Exception ignored" to the host (the daemon's log), as
    text: the hook the tile runtime hands such reports on to is this one."""
    reports: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: reports.append(
        f"{report.err_msg or 'Exception ignored in'}: {report.object!r}: "
        f"{type(report.exc_value).__name__}: {report.exc_value}"))
    gc.collect()  # (what earlier tests left is not this test's)
    return reports


def run(machine, source, **kwargs):
    result = machine.run(textwrap.dedent(source), timeout=30, **kwargs)
    assert result.ok, result.format()
    return result


def leave_cycle(machine, del_body: str) -> None:
    """Run a program on tile 0 that ends leaving an object in a reference cycle, whose
    ``__del__`` runs ``del_body``."""
    body = textwrap.indent(textwrap.dedent(del_body), " " * 8)
    run(machine, f"class Late:\n    def __del__(self):\n{body}\nleft = [Late()]\nleft.append(left)\n", tiles="0")


#: a program whose allocations set off a full collection where it runs (the objects that
#: survive younger collections grow by far more than a quarter of all the others)
ALLOCATES = "keep = [[i] for i in range(400_000)]\nprint('allocated')\n"

ENDED = "the program that made this object has ended on tile 0"


def test_a_del_left_in_a_cycle_of_an_ended_program_neither_hangs_another_job_nor_reaches_a_tile(
        machine, ignored):
    """As found: the __del__ opened /tiles/5/x from inside tile 3's job, which hung, and
    left tile 0 waiting for a reply that never came."""
    leave_cycle(machine, 'open("/tiles/5/x", "w").write("bye")')
    result = run(machine, ALLOCATES, tiles="3")
    assert result.tiles[0].output == "allocated\n"
    assert any(report.startswith("Exception ignored in: <function Late.__del__") for report in ignored)
    assert [report.partition(": OSError: ")[2] for report in ignored] == [
        f"[Errno 9] open(): {ENDED}, and what it had of its tile (files, print, exchange) ended with it: an "
        "object in a reference cycle outlives its program (Python's cycle collector frees it later), so its "
        "__del__ can use none of that; release such things before the program ends (a with block, close(), "
        "or breaking the cycle)"]
    assert not machine.fs.exists(5, "/x")
    assert [(t["state"], t["waiting"]) for t in machine.tile_states()[:1]] == [("idle", None)]


@pytest.mark.parametrize("where", ["3", "0"])
def test_a_late_del_writes_nothing_to_its_tiles_disk_from_a_later_job(machine, ignored, where):
    """On another tile it would touch tile 0's filesystem from that tile's greenlet; on
    tile 0 it would write in the name of a program that is over."""
    leave_cycle(machine, 'open("/late.txt", "w").write("late")')
    run(machine, ALLOCATES, tiles=where)
    assert ignored and all(f"OSError: [Errno 9] open(): {ENDED}" in report for report in ignored)
    assert not machine.fs.exists(0, "/late.txt")


def test_a_late_del_reaches_neither_os_nor_imports_of_its_program(machine, ignored):
    machine.fs.write_file(0, "/helper.py", b"print('helper imported')\n")
    run(machine, """
        import os

        class Late:
            def __init__(self):
                self.os = os  # (the program's names are gone by the time it runs)

            def __del__(self):
                refusals = []
                for attempt in (lambda: self.os.listdir("/"), lambda: __import__("os"),
                                lambda: __import__("helper"), lambda: self.os.path.exists("/")):
                    try:
                        attempt()
                    except OSError as exc:
                        refusals.append(str(exc).partition(":")[0])
                raise OSError(", ".join(refusals))

        left = [Late()]
        left.append(left)
    """, tiles="0")
    gc.collect()  # (here, on the host's thread)
    machine.fs.remove(0, "/helper.py")
    assert [report.partition(": OSError: ")[2] for report in ignored] == [
        "[Errno 9] listdir(), [Errno 9] import os, [Errno 9] import helper, [Errno 9] exists()"]


def test_a_late_del_that_opens_the_chip_disk_while_its_tile_writes_there_is_refused_first(machine, ignored):
    """Tile 0 is inside littlefs, waiting for the stripes of /chip, when the __del__ runs
    on tile 3: it met a FilesystemBusyError there, and written at another moment, it would
    have written /chip from tile 3."""
    leave_cycle(machine, 'open("/chip/late.txt", "w").write("late")')
    writer = machine.launch("for i in range(100):\n    open('/chip/w.bin', 'wb').write(bytes(40_000))\n", tiles="0")
    run(machine, ALLOCATES, tiles="3")
    assert writer.wait(60).ok
    assert ignored and all(f"OSError: [Errno 9] open(): {ENDED}" in report for report in ignored)
    assert not machine.fs.exists(0, "/chip/late.txt")
    machine.fs.remove(0, "/chip/w.bin")


def test_the_primitives_and_print_of_an_ended_program_refuse_and_leave_the_scheduler_as_it_was(
        machine, ignored):
    """Taken as tile 0's, sync() in tile 3's job counted an arrival at a finished job's
    barrier and switched away from tile 3's greenlet, which nothing resumed: tile 3's
    job hung."""
    errors = len(machine.scheduler.internal_errors)
    run(machine, """
        class Late:
            def __init__(self, call):
                self.call = call

            def __del__(self):
                self.call()

        left = [Late(sync), Late(lambda: send(0, 'late')), Late(lambda: print('late')),
                Late(lambda: allreduce(1)), Late(lambda: recv(0))]
        left.append(left)
    """, tiles="0")
    assert run(machine, ALLOCATES, tiles="3").tiles[0].output == "allocated\n"
    assert sorted(report.partition(": RuntimeError: ")[2].partition(":")[0] for report in ignored) == [
        "allreduce()", "print()", "recv()", "send()", "sync()"]
    assert all(ENDED in report for report in ignored)
    assert [t.output for t in run(machine, "sync()\nprint(allreduce(1))", tiles="0-3").tiles] == ["4\n"] * 4
    assert len(machine.scheduler.internal_errors) == errors


def test_a_repl_sessions_del_run_off_its_tile_between_blocks_refuses(machine, ignored):
    """Between blocks the session still holds its files: a __del__ the cycle collector
    runs on a host thread then must not reach them, nor wait as tile 0 (a read of a file
    of tile 5 it holds open left tile 0 'waiting for reply from tile 5' for good)."""
    machine.fs.write_file(5, "/held.txt", b"held")
    errors = len(machine.scheduler.internal_errors)
    with machine.repl("0") as repl:
        assert repl.run(textwrap.dedent("""
            held = open('/tiles/5/held.txt')

            class Late:
                def __init__(self, call):
                    self.call = call

                def __del__(self):
                    self.call()

            left = [Late(lambda: open('/late.txt', 'w')), Late(lambda: held.read()), Late(sync),
                    Late(lambda: print('late'))]
            left.append(left)
            del left
        """)).ok
        gc.collect()  # (here, on the host's thread, between the session's blocks)
        assert [(t["state"], t["waiting"]) for t in machine.tile_states()[:1]] == [("idle", None)]
        assert repl.run("print(held.read())").tiles[0].output == "held\n"
    assert not machine.fs.exists(0, "/late.txt")
    elsewhere = "works only there, not on host thread 'MainThread'"
    reports = sorted(report.partition(": ")[2].partition(": ")[2] for report in ignored)
    expected = [f"PermissionError: [Errno 1] open(): this belongs to the program on tile 0 and {elsewhere}",
                f"RuntimeError: a request to tile 5: this belongs to the program on tile 0 and {elsewhere}",
                f"RuntimeError: print(): {ENDED}", f"RuntimeError: sync(): {ENDED}"]
    assert len(reports) == len(expected) and all(map(str.startswith, reports, expected)), reports
    assert len(machine.scheduler.internal_errors) == errors
    machine.fs.remove(5, "/held.txt")


def test_a_repl_sessions_del_run_on_its_tile_by_another_job_between_blocks_refuses(machine, ignored):
    """The session's files are its blocks': not another job's, which runs on the tile
    meanwhile (its current directory, its time)."""
    with machine.repl("0") as repl:
        assert repl.run("class Late:\n    def __del__(self):\n        open('/late.txt', 'w')\n\n"
                        "left = [Late()]\nleft.append(left)\ndel left\n").ok
        run(machine, ALLOCATES, tiles="0")
        assert repl.run("print('next block')").tiles[0].output == "next block\n"
    assert not machine.fs.exists(0, "/late.txt")
    assert [report.partition(": OSError: ")[2][:60] for report in ignored] == [f"[Errno 9] open(): {ENDED}"[:60]]


def test_a_del_run_elsewhere_while_its_program_still_runs_refuses_its_primitives(machine):
    """Python's cycle collector may free a running program's garbage anywhere: here on a
    host thread while the job's tiles reduce. Counted in as one of them, its sync() put
    the job's tiles out of step (a collective mismatch), and switched greenlets from the
    wrong thread. What it could not do is told on the program's output."""
    program = textwrap.dedent("""
        import os

        class Late:
            def __init__(self, call):
                self.call = call

            def __del__(self):
                self.call()

        if __tileid == 0:
            left = [Late(sync), Late(lambda: send(1, 'late')), Late(lambda: allreduce(1))]
            left.append(left)
            del left
        rounds = total = 0
        while not bcast(__tileid == 0 and os.path.exists('/go')):
            rounds, total = rounds + 1, total + allreduce(1)
        print(total == 2 * rounds, poll(0), poll(1))
    """)
    gc.disable()  # (no collection but the one below, wherever it would otherwise come)
    try:
        handle = machine.launch(program, tiles="0-1")
        while machine.tile_states()[0]["waiting"] is None:  # (until its loop runs)
            pass
        gc.collect()
    finally:
        gc.enable()
    machine.fs.write_file(0, "/go", b"")
    result = handle.wait(30)
    machine.fs.remove(0, "/go")
    assert result.ok, result.format()
    output = result.tiles[0].output
    assert output.endswith("\nTrue False False\n") and result.tiles[1].output == "True False False\n"
    refusals = [line for line in output.splitlines() if line.startswith("RuntimeError: ")]
    assert sorted(line.partition(": ")[2].partition(":")[0] for line in refusals) == [
        "allreduce()", "send()", "sync()"]
    assert all("works only there, not on host thread 'MainThread'" in line for line in refusals)
