"""The ``__del__`` of an object a program left in a reference cycle: it outlives the
program (only Python's cycle collector frees it) and runs wherever that collector next
runs: inside another job on another tile, on the scheduler's loop, on a host thread.
There, what the program had of its tile (its files, os, imports, print, primitives)
refuses with an error that says why, which Python reports as "Exception ignored", and
the tile, its files and the scheduler are left as they were."""

from __future__ import annotations

import gc
import textwrap

import pytest

from ipuos import Machine


@pytest.fixture(scope="module")
def machine():
    with Machine("tiny") as m:
        yield m


def run(machine, source, **kwargs):
    result = machine.run(textwrap.dedent(source), timeout=30, **kwargs)
    assert result.ok, result.format()
    return result


#: a program whose allocations set off a full collection where it runs (the objects that
#: survive younger collections grow by far more than a quarter of all the others)
ALLOCATES = "keep = [[i] for i in range(400_000)]\nprint('allocated')\n"

def test_the_primitives_of_an_ended_program_leave_the_scheduler_as_it_was(machine):
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

        left = [Late(sync), Late(lambda: send(0, 'late')), Late(lambda: allreduce(1)), Late(lambda: recv(0))]
        left.append(left)
    """, tiles="0")
    assert run(machine, ALLOCATES, tiles="3").tiles[0].output == "allocated\n"
    assert [t.output for t in run(machine, "sync()\nprint(allreduce(1))", tiles="0-3").tiles] == ["4\n"] * 4
    assert len(machine.scheduler.internal_errors) == errors


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
