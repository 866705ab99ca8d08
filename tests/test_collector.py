"""The daemon's garbage collection (``ipuos._collector``): a real machine, real jobs, and
the daemon's run handler over a real socket pair.

These freeze this test process's objects, so each test leaves the collector as it found
it: thawed and enabled. Automatic collections are off meanwhile, so that what a test sees
freed was freed by the collection it made.
"""

from __future__ import annotations

import gc
import socket
import threading
import time
import weakref

import pytest
from daemon_harness import read_frame, request, unique_name, wait_for

from ipuos import Machine
from ipuos._collector import Collector
from ipuos._connection import Connection, HandlerSlots
from ipuos._host import MachineHost
from ipuos._rundir import machine_paths


@pytest.fixture
def machine():
    gc.disable()
    try:
        with Machine("tiny") as m:
            yield m
    finally:
        gc.unfreeze()
        gc.enable()


class Cycle:
    def __init__(self):
        self.me = self


def walked(obj) -> bool:
    """Whether a full collection walks ``obj`` (frozen objects are no collection's)."""
    return any(o is obj for o in gc.get_objects())


def test_a_collection_freezes_the_machine_so_full_collections_skip_it(machine):
    greenlet = machine.scheduler.tiles[3].glet
    assert walked(greenlet)
    Collector(machine.scheduler).collect()
    assert not walked(greenlet)
    assert machine.run("print(__tileid)", tiles="3").ok  # a frozen machine runs as before


def test_a_jobs_cycles_are_freed_by_the_next_collection(machine):
    collector = Collector(machine.scheduler)
    collector.collect()
    refs = []

    def target(api):
        refs.append(weakref.ref(Cycle()))

    assert machine.scheduler.start_job(range(4), target).future.result().ok
    assert len(refs) == 4 and all(ref() is not None for ref in refs)  # garbage, in cycles
    collector.collect()
    assert [ref() for ref in refs] == [None] * 4


def test_nothing_is_frozen_while_a_job_runs(machine):
    """A running job's objects die with it: frozen, no ordinary collection would free them."""
    refs, stop = [], threading.Event()

    def target(api):
        refs.append(weakref.ref(Cycle()))
        kept = refs[-1]()  # alive until the job ends
        while not stop.is_set():
            api.sync()
        assert kept is not None

    handle = machine.scheduler.start_job(range(2), target)
    wait_for(lambda: len(refs) == 2, what="both tiles to make their objects")
    collector = Collector(machine.scheduler)
    collector.collect()
    assert walked(machine.scheduler.tiles[5].glet)  # not frozen: a job was running
    stop.set()
    assert handle.future.result().ok
    collector.collect()
    assert [ref() for ref in refs] == [None, None]
    assert not walked(machine.scheduler.tiles[5].glet)  # and frozen once none runs


def test_cycles_that_die_frozen_wait_for_a_thorough_collection(machine):
    collector = Collector(machine.scheduler, thorough_every=3)
    cycle = Cycle()
    ref = weakref.ref(cycle)
    collector.collect()  # (first) frozen while alive
    del cycle
    collector.collect()  # (second) an ordinary collection does not walk the frozen
    assert ref() is not None
    collector.collect()  # (third) every third is thorough
    assert ref() is None

    cycle = Cycle()
    ref = weakref.ref(cycle)
    collector.collect()
    del cycle
    collector.collect(thorough=True)  # as after a restore, whatever the count
    assert ref() is None


def test_the_daemon_collects_after_a_job_ended_only(machine):
    """A job that ended (``ipuos run``'s, or one the shell started: the host forgets
    both) makes the next reply's collection due; nothing else does."""
    host = MachineHost(machine, machine_paths(unique_name()))
    greenlet = machine.scheduler.tiles[4].glet
    host.collector.collect_if_due()
    assert walked(greenlet)  # no job has ended: nothing collected, nothing frozen
    host.remove_job(7)
    host.collector.collect_if_due()
    assert not walked(greenlet)


def test_a_repl_sessions_end_frees_what_its_blocks_kept_frozen(machine):
    """A repl session's names live through the collections after its blocks, frozen;
    its end (a job on its tiles) makes the next collection thaw them, rather than every
    session's leaving garbage until the thorough count comes round."""
    from ipuos._cmd_shell import _DaemonShellHost

    host = MachineHost(machine, machine_paths(unique_name()))
    repl = _DaemonShellHost(host).open_repl([0, 1], None, None)
    repl.launch("class Loop:\n    pass\nkept = Loop()\nkept.me = kept\n").handle.wait(30)
    ref = weakref.ref(repl.namespace()["kept"])
    host.collector.collect_if_due()  # (the block ended) the session's names are frozen now
    assert ref() is not None
    repl.close().handle.wait(30)
    host.collector.collect_if_due()
    assert ref() is None


def test_thorough_every_must_be_positive(machine):
    with pytest.raises(ValueError, match="thorough_every must be at least 1, not 0"):
        Collector(machine.scheduler, thorough_every=0)


@pytest.fixture
def daemon_socket(machine):
    """A socket to the daemon's connection handler serving ``machine`` in this process."""
    ours, theirs = socket.socketpair()
    host = MachineHost(machine, machine_paths(unique_name()))
    connection = Connection(ours, host, None, HandlerSlots(4), threading.Event())
    threading.Thread(target=connection.serve, daemon=True).start()
    try:
        yield theirs
    finally:
        connection.close()
        ours.close()
        theirs.close()


def result_of(sock) -> dict:
    while (header := read_frame(sock).header)["type"] != "result":
        pass
    return header["result"]


def test_the_daemon_collects_and_freezes_after_replying_to_a_run(machine, daemon_socket):
    greenlet = machine.scheduler.tiles[2].glet
    assert walked(greenlet)
    source = b"print('ran')"
    daemon_socket.sendall(request(1, "run", {"filename": "p.py", "source_len": len(source), "tiles": "2"},
                                  source))
    result = result_of(daemon_socket)
    assert result["exit_status"] == 0 and result["tiles"][0]["output"] == "ran\n", result
    wait_for(lambda: not walked(greenlet), what="the machine to be frozen after the reply")


def test_the_daemon_collects_after_answering_a_large_request(machine, daemon_socket):
    """A refused ``run --data`` (more than the tiles' SRAM holds) left its data in a
    reference cycle, the refusal's traceback, that no collection came for: 60 MB a time,
    until the daemon held ~2 GB. A small request makes no collection due."""
    greenlet = machine.scheduler.tiles[2].glet
    source = b"print(len(__tiledata))"

    def refused_run(request_id: int, data: bytes) -> None:
        daemon_socket.sendall(request(request_id, "run", {"filename": "d.py", "source_len": len(source),
                                                          "tiles": "2", "has_data": True}, source + data))
        while (header := read_frame(daemon_socket).header)["type"] != "error":
            pass
        assert "does not fit in the SRAM of 1 tile (2)" in header["error"]["message"], header

    refused_run(1, b"y" * 99_999 + b"\n")  # (100 KB: more than a tiny tile holds, less than large)
    time.sleep(0.2)
    assert walked(greenlet)  # nothing collected, nothing frozen
    refused_run(2, (b"y" * 99 + b"\n") * 20_000)  # 2 MB
    wait_for(lambda: not walked(greenlet), what="the collection after the large request")
