"""Scheduler semantics: BSP visibility, point-to-point, collectives, failure containment.

Jobs here are Python callables run by the real scheduler thread on real greenlets; the
tile-program runtime is tested separately (test_runtime.py).
"""

from __future__ import annotations

import copy
import operator
import re
import sys
import threading
import time
import weakref

import greenlet
import pytest

from daemon_harness import wait_for

from ipuos._costmodel import CostModel
from ipuos._sram import SRAM
from ipuos.scheduler._ctrl_c_settle import CTRL_C_AFTER
from ipuos.scheduler import (
    ABORTED,
    ERROR,
    INTERRUPTED,
    OK,
    CollectiveMismatchError,
    ComputeBudgetExceeded,
    DeadlockError,
    JobAborted,
    Scheduler,
    TileBusyError,
    TileInterrupt,
    TileKeyboardInterrupt,
)

NTILES = 8


@pytest.fixture(scope="module")
def sched():
    sram = SRAM(NTILES, 64 * 1024)
    scheduler = Scheduler(sram, tiles_per_chip=NTILES, exchange_out=2048, exchange_in=4096)
    scheduler.start()
    yield scheduler
    try:
        assert_pending_counts_exact(scheduler)
    finally:  # (a test that left a tile computing: the look times out, the stop ends it)
        scheduler.stop()
    assert scheduler.internal_errors == []


def assert_pending_counts_exact(scheduler):
    """The scheduler's counts of tiles with a signal and of queued requests, which tell
    ``sync`` whether it may simply park, match the tiles themselves (read on the
    scheduler's thread, between supersteps)."""
    def counts():
        tiles = scheduler.tiles
        return ((scheduler.signalled, scheduler.queued_requests),
                (sum(t.signal is not None for t in tiles), sum(len(t.requests) for t in tiles)))

    # (not for ever: a tile a test left computing holds the thread, and a teardown that
    # waited on it would hang the whole run)
    kept, actual = scheduler.call_wait(counts, timeout=30)
    assert kept == actual


def run(sched, target, tiles=range(NTILES), budget=None, timeout=10):
    job = sched.start_job(list(tiles), target, budget=budget)
    return job.future.result(timeout)


def values(report):
    assert report.ok, [(r.status, r.traceback or r.error) for r in report.results]
    return [r.value for r in report.results]


# -- barrier and BSP visibility ---------------------------------------------------------


def test_message_is_visible_only_after_the_sync(sched):
    def prog(api):
        peer = (api.tileid + 1) % api.numtiles
        api.send(peer, api.tileid)
        before = api.poll((api.tileid - 1) % api.numtiles)
        api.sync()
        after = api.poll((api.tileid - 1) % api.numtiles)
        return before, after, api.recv((api.tileid - 1) % api.numtiles)

    for rank, (before, after, got) in enumerate(values(run(sched, prog))):
        assert (before, after, got) == (False, True, (rank - 1) % NTILES)


def test_sync_is_a_barrier_of_the_jobs_tiles(sched):
    log = []

    def prog(api):
        for step in range(3):
            log.append((step, api.tileid))
            api.sync()

    values(run(sched, prog))
    steps = [step for step, _ in log]
    assert steps == sorted(steps), "a tile ran ahead of a barrier"


def test_finished_tiles_no_longer_take_part_in_sync(sched):
    def prog(api):
        if api.tileid < 3:
            return "early"
        for _ in range(4):
            api.sync()
        return "late"

    assert values(run(sched, prog)) == ["early"] * 3 + ["late"] * (NTILES - 3)


def test_tiles_looping_on_sync_serve_requests_and_stop_when_interrupted(sched):
    sched.services["test.whoami"] = lambda tile, word: (tile.id, word)
    started = threading.Event()

    def prog(api):
        started.set()
        while True:
            api.sync()

    job = sched.start_job(list(range(NTILES)), prog)
    assert started.wait(5)
    replies = [sched.submit(tile_id, "test.whoami", "hi") for tile_id in range(NTILES)]
    assert [reply.result(5) for reply in replies] == [(tile_id, "hi") for tile_id in range(NTILES)]
    sched.interrupt_job(job)
    report = job.future.result(10)
    assert {result.status for result in report.results} == {INTERRUPTED}
    assert_pending_counts_exact(sched)
    assert sched.call_wait(lambda: (sched.signalled, sched.queued_requests)) == (0, 0)


def test_a_signal_pending_on_another_tile_leaves_a_jobs_barriers_alone(sched):
    # while any tile has a signal pending, every sync takes the general wait: it must
    # still be a barrier, and raise nothing on the tiles the signal is not for
    idle = sched.tiles[NTILES - 1]
    log = []

    def prog(api):
        for step in range(4):
            log.append(step)
            api.sync()
        return "done"

    sched.call_wait(setattr, idle, "signal", ValueError("meant for the idle tile"))
    try:
        report = run(sched, prog, tiles=range(NTILES - 1))
        assert values(report) == ["done"] * (NTILES - 1)
        assert report.stats.supersteps == 5  # four syncs: five supersteps
        assert log == sorted(log), "a tile ran ahead of a barrier"
        assert_pending_counts_exact(sched)
        assert sched.call_wait(lambda: sched.signalled) == 1
    finally:
        sched.call_wait(setattr, idle, "signal", None)
    assert sched.call_wait(lambda: sched.signalled) == 0


def test_superstep_count_and_stats(sched):
    def prog(api):
        for _ in range(5):
            api.send((api.tileid + 1) % api.numtiles, b"x" * 100)
            api.sync()
            api.recv((api.tileid - 1) % api.numtiles)

    report = run(sched, prog)
    assert report.ok
    assert report.stats.supersteps == 6  # five syncs: six supersteps
    assert report.stats.sim_seconds > 0
    assert 5 * NTILES * 100 <= report.stats.bytes_exchanged < 5 * NTILES * 200
    # per tile: each sent five messages of ~100 B and received five
    assert len(report.stats.bytes_sent) == len(report.stats.bytes_received) == NTILES
    assert all(500 <= n < 1000 for n in report.stats.bytes_sent + report.stats.bytes_received)
    assert sum(report.stats.bytes_sent) == report.stats.bytes_exchanged
    stats = sched.stats()
    assert stats["bytes_exchanged"] >= report.stats.bytes_exchanged

    collective = run(sched, lambda api: api.allgather(b"y" * 100))
    assert NTILES * 100 <= collective.stats.bytes_exchanged < NTILES * 200
    # every tile sent its own ~100 B and received everyone's
    assert all(100 <= n < 200 for n in collective.stats.bytes_sent)
    assert all(NTILES * 100 <= n < NTILES * 200 for n in collective.stats.bytes_received)
    # counted alike both ways: what was sent is what was received (payloads, not padding)
    assert sum(collective.stats.bytes_received) == NTILES * sum(collective.stats.bytes_sent)


@pytest.fixture(scope="module")
def two_chips():
    """Two chips of eight tiles: tiles 8-15 are on chip 1."""
    scheduler = Scheduler(SRAM(16, 64 * 1024), tiles_per_chip=8, exchange_out=2048, exchange_in=8192)
    scheduler.start()
    yield scheduler
    scheduler.stop()
    assert scheduler.internal_errors == []


def test_a_jobs_simulated_time_is_its_own_syncs_and_traffic(two_chips):
    def syncs(api):
        for _ in range(20):
            api.sync()

    alone = run(two_chips, syncs, tiles=[0, 1]).stats
    # beside a busy job on the other chip: the same supersteps, at one chip's sync cost
    busy = two_chips.start_job(list(range(8, 16)),
                               lambda api: [api.alltoall(b"z" * 200) for _ in range(200)])
    beside = run(two_chips, syncs, tiles=[0, 1]).stats
    assert busy.future.result(10).ok
    assert beside.supersteps == alone.supersteps
    assert beside.sim_seconds == alone.sim_seconds == CostModel().seconds(300 * (alone.supersteps - 1))


def test_bytes_across_chips_cost_the_same_by_messages_or_by_a_collective(two_chips):
    payload = b"q" * 400

    def messages(api):
        if api.tileid < api.numtiles - 1:
            api.send(api.numtiles - 1, payload)
        else:
            return sum(len(api.recv(rank)) for rank in range(api.numtiles - 1))

    def gathered(api):
        got = api.gather(payload, api.numtiles - 1)
        return sum(map(len, got)) if got else None

    one_chip = list(range(8))
    across = list(range(1, 9))  # seven senders on chip 0, the receiver on chip 1
    by_messages = run(two_chips, messages, tiles=across).stats.sim_seconds
    by_gather = run(two_chips, gathered, tiles=across).stats.sim_seconds
    assert by_messages == pytest.approx(by_gather, rel=0.1)  # (messages are padded to 8 B)
    assert by_messages > 5 * run(two_chips, messages, tiles=one_chip).stats.sim_seconds
    # one sender across: only its bytes take the slow link, not the whole collective's
    to_zero = run(two_chips, lambda api: api.gather(payload), tiles=list(range(9))).stats.sim_seconds
    cost = CostModel()
    all_over_links = cost.seconds(9 * 400 / cost.interchip_bytes_per_cycle)
    assert to_zero < 0.3 * all_over_links


# -- point to point ---------------------------------------------------------------------


def test_recv_waits_across_supersteps_and_keeps_sender_order(sched):
    def prog(api):
        if api.tileid == 0:  # waits from the first superstep on
            start = api.job.sched.superstep
            got = [api.recv(1) for _ in range(6)]
            return got, api.job.sched.superstep - start
        if api.tileid == 1:  # paced by ping-pong with tile 2: one superstep per round
            for i in range(6):
                api.send(0, i)
                api.send(2, "ping")
                api.recv(2)
            api.send(2, None)
        else:
            while api.recv(1) is not None:
                api.send(1, "pong")
        return None

    got, supersteps = values(run(sched, prog, tiles=[0, 1, 2]))[0]
    assert got == [0, 1, 2, 3, 4, 5]
    assert supersteps >= 6


def test_recv_without_a_source_takes_the_first_message_from_any_tile(sched):
    """mpi4py's default (source=ANY_SOURCE): a master collects from whichever worker
    is done, in the order the messages arrived; each sender's own order is kept."""
    def prog(api):
        if api.tileid == 0:
            return [api.recv() for _ in range(2 * (api.numtiles - 1))]
        api.send(0, (api.tileid, "first"))
        api.send(0, (api.tileid, "second"))
        return None

    got = values(run(sched, prog, tiles=[0, 1, 2, 3]))[0]
    assert sorted(got) == sorted((t, w) for t in (1, 2, 3) for w in ("first", "second"))
    for t in (1, 2, 3):
        assert got.index((t, "first")) < got.index((t, "second"))


def test_recv_from_any_tile_waits_across_supersteps_and_is_a_deadlock_if_none_will_send(sched):
    def prog(api):
        if api.tileid == 0:
            got = api.recv()
            return got, api.recv()  # tile 1 sends once only, tile 2 never
        if api.tileid == 1:
            api.send(0, "late")
        return None

    report = run(sched, prog, tiles=[0, 1, 2])
    assert report.results[0].status == ERROR
    assert "tile 0 waits in recv from any tile" in str(report.results[0].error)


def test_sendrecv_sends_then_receives(sched):
    def prog(api):
        right, left = (api.tileid + 1) % api.numtiles, (api.tileid - 1) % api.numtiles
        return api.sendrecv(api.tileid * 10, right, left), api.sendrecv("any", right)

    assert values(run(sched, prog, tiles=[0, 1, 2])) == [(20, "any"), (0, "any"), (10, "any")]


def test_sendrecv_checks_both_ranks_before_it_sends(sched):
    def prog(api):
        errors = []
        if api.tileid == 0:
            for dst, src in ((9, 1), (1, 9)):
                try:
                    api.sendrecv("stray", dst, src)
                except ValueError as exc:
                    errors.append(str(exc))
        api.sync()
        return errors if api.tileid == 0 else api.poll(0)

    assert values(run(sched, prog, tiles=[0, 1])) == [
        ["sendrecv(): no tile 9 in this job (tiles 0-1)"] * 2, False]  # (nothing was sent)


def test_allgather_and_alltoall_are_one_collective_tiles_may_mix(sched):
    """(as sync and barrier: a mismatch error said they differ)"""
    def prog(api):
        gather = api.allgather if api.tileid == 1 else api.alltoall
        return gather(api.tileid * 10), api.bcast("after", 0)

    assert values(run(sched, prog, tiles=[0, 1, 2])) == [([0, 10, 20], "after")] * 3


def test_messages_sent_together_arrive_together_in_order(sched):
    def prog(api):
        if api.tileid == 1:
            for i in range(20):
                api.send(0, i)
        api.sync()
        if api.tileid == 0:
            arrived = [api.poll(1)]
            return [api.recv(1) for _ in range(20)], arrived
        return None

    assert values(run(sched, prog, tiles=[0, 1]))[0] == (list(range(20)), [True])


def test_send_never_blocks_and_messages_carry_structures(sched):
    payload = {"a": [1, 2.5, "x"], "b": (None, True), "c": b"\x00\xff"}

    def prog(api):
        if api.tileid == 0:
            for dst in range(1, api.numtiles):
                api.send(dst, payload)
            return "sent"
        return api.recv(0)

    got = values(run(sched, prog))
    assert got[0] == "sent" and all(v == payload for v in got[1:])


def test_received_objects_are_private_copies(sched):
    def prog(api):
        if api.tileid == 0:
            data = [1, 2, 3]
            api.send(1, data)
            api.send(2, data)
            return None
        mine = api.recv(0)
        mine.append(api.tileid)
        api.sync()
        return mine

    got = values(run(sched, prog, tiles=[0, 1, 2]))
    assert got[1:] == [[1, 2, 3, 1], [1, 2, 3, 2]]


def test_bad_destination_is_a_clear_error(sched):
    def prog(api):
        api.send(99, "x")

    report = run(sched, prog, tiles=[0, 1])
    assert {r.status for r in report.results} <= {ERROR, ABORTED}
    first = report.results[0] if report.results[0].status == ERROR else report.results[1]
    assert "no tile 99" in str(first.error)


def test_payload_larger_than_the_exchange_buffer_is_a_value_error(sched):
    def prog(api):
        if api.tileid == 0:
            messages = []
            for size in (5000, 1500, 1500):  # the outgoing buffer is 2048 B
                try:
                    api.send(1, b"x" * size)
                except ValueError as exc:
                    messages.append(str(exc))
            return messages
        return None

    too_big, too_many = values(run(sched, prog, tiles=[0, 1]))[0]
    # (whether sync() between sends would help: it said so of one no buffer holds)
    assert too_big.startswith("exchange payload of 5006 B does not fit in the outgoing buffer (2048 B of "
                              "2048 B left this superstep); it can never go in one piece: send it in smaller parts")
    assert too_many.endswith("left this superstep); send less per superstep or sync() between sends")


def test_a_collective_result_too_big_for_the_incoming_buffer_is_a_value_error(sched):
    def prog(api):
        try:
            api.alltoall(b"y" * 1000)  # 4 x ~1 KiB of results into each 4 KiB buffer, at most
        except ValueError as exc:
            return str(exc)
        return "fitted"

    report = run(sched, prog, tiles=[0, 1, 2, 3, 4, 5])
    messages = values(report)
    assert all("does not fit in the incoming exchange buffer" in m for m in messages), messages
    assert values(run(sched, lambda api: len(api.alltoall(b"z" * 100)), tiles=[0, 1])) == [2, 2]


def test_receive_buffer_overflow_fails_the_receiver(sched):
    def prog(api):
        if api.tileid == 0:
            for _ in range(6):  # 6 x ~1 KiB into a 4 KiB incoming buffer, never received
                api.send(1, b"y" * 1000)
                api.sync()
            return None
        for _ in range(6):
            api.sync()

    report = run(sched, prog, tiles=[0, 1])
    receiver = report.results[1]
    assert receiver.status == ERROR
    assert isinstance(receiver.error, ValueError)
    assert "incoming exchange buffer full" in str(receiver.error)


def test_an_overflow_while_waiting_in_recv_fails_the_receiver_not_a_false_deadlock(sched):
    def prog(api):
        if api.tileid == 0:
            return api.recv(1)  # waits while three senders overflow its buffer
        api.send(0, b"y" * 1500)  # 3 x 1.5 KiB into 4 KiB
        api.sync()

    report = run(sched, prog, tiles=[0, 1, 2, 3])
    receiver = report.results[0]
    assert isinstance(receiver.error, ValueError), receiver.error
    assert "incoming exchange buffer full" in str(receiver.error)
    assert not any(isinstance(r.error, DeadlockError) for r in report.results)
    # nothing was left unreceived: it is too much in one exchange, not messages left
    # waiting (it told everyone to recv() them)
    assert str(receiver.error).endswith("; send it fewer bytes per superstep (sync() between sends) "
                                        "(senders still running are told too)")
    assert "recv()" not in str(receiver.error)


def test_an_overflow_tells_the_receiver_and_every_sender_what_was_lost(sched):
    """The senders' sync() succeeded, and the receiver's error did not say that messages
    were lost: a program catching it ran on with a hole in its stream."""
    def prog(api):
        if api.tileid == 0:
            api.send(0, b"x" * 1000)
        api.sync()
        if api.tileid:
            api.send(0, b"y" * 1500)  # 3 x 1.5 KiB into 4 KiB, with 1 KiB already there
        try:
            api.sync()
        except ValueError as exc:
            return str(exc)

    report = run(sched, prog, tiles=[0, 1, 2, 3])
    errors = values(report)
    assert re.fullmatch(r"tile 0: incoming exchange buffer full \(1008 B of unreceived messages \+ 4536 B "
                        r"arriving > 4096 B\): 3 messages \(4518 B\) from tiles 1-3 dropped and lost; .*",
                        errors[0]), errors
    for error in errors[1:]:
        assert error.startswith("send() to tile 0: 1 message (1506 B) sent before this exchange point dropped "
                                "and lost: its incoming exchange buffer was full"), errors
    assert report.stats.dropped_messages == 4  # (and the one tile 0 never received)


def test_an_overflow_names_senders_that_have_finished_by_their_ranks(sched):
    # senders that end right after their send have left the job (their tile's rank is
    # -1 by the exchange): the receiver's error must still name them
    def prog(api):
        if api.tileid == 2:
            api.send(1, b"y" * 1500)
            api.sync()
            return None
        if api.tileid != 1:
            api.send(1, b"y" * 1500)
            return None
        try:
            api.sync()
        except ValueError as exc:
            return str(exc)

    report = run(sched, prog, tiles=[0, 1, 2, 3])
    error = report.results[1].value
    assert "3 messages (4518 B) from tiles 0,2-3 dropped and lost" in error, error


def test_messages_a_tile_never_received_count_as_dropped_when_it_ends(sched):
    def prog(api):
        if api.tileid == 0:
            api.send(1, b"first")
            api.send(1, b"second")
            api.send(2, b"third")
        api.sync()
        if api.tileid == 1:
            return api.recv(0)

    report = run(sched, prog, tiles=[0, 1, 2])
    assert values(report) == [None, b"first", None]
    assert report.stats.dropped_messages == 2


def test_messages_to_a_finished_tile_are_dropped_and_leave_it_clean(sched):
    def prog(api):
        if api.tileid == 3:
            return "done early"
        api.sync()
        api.send(3, b"x" * 1500)  # three of these would overflow tile 3's buffer
        api.sync()

    report = run(sched, prog, tiles=[0, 1, 2, 3])
    assert report.ok and report.stats.dropped_messages == 3
    # the tile takes its next job as it was: no error left over, no buffer half full
    assert values(run(sched, lambda api: api.sync() or "fine", tiles=[3])) == ["fine"]
    assert sched.tiles[3].in_used == 0


# -- collectives ------------------------------------------------------------------------


def test_alltoall_and_allgather_return_every_tiles_object_in_order(sched):
    def prog(api):
        return api.alltoall(api.tileid * 10), api.allgather(str(api.tileid))

    expected = ([r * 10 for r in range(NTILES)], [str(r) for r in range(NTILES)])
    assert values(run(sched, prog)) == [expected] * NTILES


def test_alltoall_lists_are_private_to_each_tile(sched):
    def prog(api):
        got = api.alltoall((api.tileid, "same"))
        got.append("mine")
        api.sync()
        return len(got)

    assert values(run(sched, prog)) == [NTILES + 1] * NTILES


def test_mutable_collective_results_are_private(sched):
    def prog(api):
        got = api.bcast({"k": []}, root=2)
        got["k"].append(api.tileid)
        api.sync()
        return got["k"]

    assert values(run(sched, prog)) == [[r] for r in range(NTILES)]


def test_large_bcast_lands_in_every_tile_while_the_tiles_compute():
    # big enough (48 tiles x 96 KiB) for the background landing: the bytes must be in
    # every receiver's SRAM by the next exchange, and the GIL switch interval the landing
    # shortens must be back to what it was
    ntiles, size = 48, 96 * 1024
    sram = SRAM(ntiles, 256 * 1024)
    scheduler = Scheduler(sram, tiles_per_chip=ntiles, exchange_out=size + 1024,
                          exchange_in=size + 1024)
    interval = sys.getswitchinterval()
    scheduler.start()
    try:
        def prog(api):
            got = api.bcast(bytes(range(256)) * (size // 256 - 1) if api.tileid == 5 else None, root=5)
            total = sum(range(50_000))  # compute while the landing is in flight
            api.sync()
            return len(got), got[:4], total

        expected = (size - 256, bytes(range(4)), sum(range(50_000)))
        assert values(run(scheduler, prog, tiles=range(ntiles))) == [expected] * ntiles
        payload = bytes(range(256)) * (size // 256 - 1)
        for tile in scheduler.tiles:
            assert payload in bytes(sram.memory(tile.id).get("exchange.in").view), tile.id
        assert sys.getswitchinterval() == interval
    finally:
        scheduler.stop()
    assert scheduler.internal_errors == []


def test_bcast_and_gather(sched):
    def prog(api):
        b = api.bcast("from root" if api.tileid == 3 else "ignored", root=3)
        g = api.gather(api.tileid**2, root=1)
        return b, g

    got = values(run(sched, prog))
    assert all(b == "from root" for b, _ in got)
    assert got[1][1] == [r**2 for r in range(NTILES)]
    assert all(g is None for rank, (_, g) in enumerate(got) if rank != 1)


def test_scatter_gives_each_tile_its_item_of_the_roots_sequence(sched):
    def prog(api):
        items = [{"rank": r, "data": [r] * r} for r in range(api.numtiles)]
        first = api.scatter(items if api.tileid == 2 else "ignored", root=2)
        second = api.scatter(range(10, 10 + api.numtiles) if api.tileid == 0 else None)
        return first, second

    got = values(run(sched, prog))
    assert got == [({"rank": r, "data": [r] * r}, 10 + r) for r in range(NTILES)]


def test_scatter_items_are_each_tiles_own_objects(sched):
    def prog(api):
        shared = [0]
        mine = api.scatter([shared] * api.numtiles if api.tileid == 0 else None)
        mine.append(api.tileid)
        api.sync()
        return mine

    assert values(run(sched, prog)) == [[0, r] for r in range(NTILES)]


@pytest.mark.parametrize("items, error", [
    ([1, 2, 3], "ValueError: scatter(): root's sequence has 3 items; the job has 4 tiles (one each)"),
    ([1], "ValueError: scatter(): root's sequence has 1 item; the job has 4 tiles (one each)"),
    (7, "TypeError: scatter(): root passes a sequence of one object per tile, not int"),
])
def test_scatter_refuses_a_root_sequence_of_the_wrong_size(sched, items, error):
    def prog(api):
        return api.scatter(items if api.tileid == 0 else None)

    report = run(sched, prog, tiles=[0, 1, 2, 3])
    assert f"{error}" in report.results[0].traceback
    kind, message = error.split(": ", 1)  # the others' scatter raises it too, naming the root
    for result in report.results[1:]:
        assert result.status == ERROR, result
        assert f"{kind}: scatter(root=0) failed on tile 0: {message}" in result.traceback


def test_a_scatter_too_big_for_the_outgoing_buffer_sends_nothing(sched):
    def prog(api):
        with pytest.raises(ValueError, match="does not fit in the outgoing buffer"):  # (on every tile)
            api.scatter([b"x" * 600] * api.numtiles if api.tileid == 0 else None)  # 2400 B > 2 KiB
        return api.scatter([b"y"] * api.numtiles if api.tileid == 0 else None)

    assert values(run(sched, prog, tiles=[0, 1, 2, 3])) == [b"y"] * 4


@pytest.mark.parametrize("other", ["sync", "bcast", "scatter from 3"])
def test_scatter_against_another_collective_is_a_mismatch(sched, other):
    def prog(api):
        if api.tileid == 3:
            if other == "sync":
                return api.sync()
            if other == "bcast":
                return api.bcast(1)
            return api.scatter([0] * api.numtiles, root=3)
        return api.scatter([0] * api.numtiles if api.tileid == 0 else None)

    report = run(sched, prog, tiles=[0, 1, 2, 3])
    assert all(isinstance(r.error, CollectiveMismatchError) for r in report.results), [r.error for r in report.results]
    assert "tiles 0-2 wait in scatter(root=0)" in str(report.results[0].error)


@pytest.mark.parametrize(
    "op, expected",
    [("sum", sum(range(1, 9))), ("prod", 40320), ("min", 1), ("max", 8)],
)
def test_reduce_and_allreduce_ops(sched, op, expected):
    def prog(api):
        return api.reduce(api.tileid + 1, op, root=0), api.allreduce(api.tileid + 1, op)

    got = values(run(sched, prog))
    assert got[0] == (expected, expected)
    assert all(r == (None, expected) for r in got[1:])


@pytest.mark.parametrize("ntiles", range(1, NTILES + 1))
def test_reductions_of_values_near_the_outgoing_buffer_size(sched, ntiles):
    # the tree's fan-in keeps every leader's incoming values inside its buffer, whatever
    # the job's size: a leader with no children of its own (rank 3 of 4 here, fan-in 3)
    # must not send up the tree early, beside the values of the level below. And a scan's
    # tile with nothing to receive in a round must not send its next round's part (or
    # exscan's shift) in the same superstep: tile 0 of 8 sent three copies of its value
    def prog(api):
        value = bytes([api.tileid]) * 2000  # under the 2 KiB outgoing buffer
        def add(a, b):
            return bytes(x + y for x, y in zip(a, b))
        return (api.allreduce(value, add)[0], (api.reduce(value, add, root=ntiles - 1) or [None])[0],
                api.scan(value, add)[0], (api.exscan(value, add) or [None])[0])

    total = sum(range(ntiles))
    assert values(run(sched, prog, tiles=range(ntiles))) == [
        (total, total if rank == ntiles - 1 else None, sum(range(rank + 1)), sum(range(rank)) if rank else None)
        for rank in range(ntiles)]


@pytest.mark.parametrize("first, others, report", [
    ("allreduce", "sync", "tile 0 waits in allreduce(); tiles 1-3 wait in sync()"),
    ("reduce", "sync", "tile 0 waits in reduce(); tiles 1-3 wait in sync()"),
    ("allreduce", "gather", "tile 0 waits in allreduce(); tiles 1-3 wait in gather(root=0)"),
])
def test_a_reduction_against_another_collective_is_a_mismatch_not_a_deadlock(sched, first, others, report):
    # rank 0 waits for its children in the reduction's tree, not at the collective
    # itself, so only the deadlock detector sees the tiles disagree
    def prog(api):
        if api.tileid == 0:
            return getattr(api, first)(1)
        return api.sync() if others == "sync" else api.gather(1)

    results = run(sched, prog, tiles=[0, 1, 2, 3]).results
    assert all(isinstance(r.error, CollectiveMismatchError) for r in results), [r.error for r in results]
    assert "collective mismatch in job" in str(results[0].error) and report in str(results[0].error)


def test_allreduce_against_a_bcast_from_0_is_a_mismatch(sched):
    # allreduce ends in a broadcast from rank 0: it must not pass for the user's own bcast
    def prog(api):
        return api.bcast(5, 0) if api.tileid == 0 else api.allreduce(1)

    report = run(sched, prog, tiles=[0, 1, 2, 3])
    assert all(isinstance(r.error, CollectiveMismatchError) for r in report.results)
    assert "tiles 1-3 wait in allreduce()" in str(report.results[0].error)


def test_a_barrier_after_a_caught_deadlock_still_waits_for_every_tile(sched):
    def prog(api):
        if api.tileid == 0:
            with pytest.raises(DeadlockError):
                api.recv(1)
            api.recv(2)
            api.send(1, "m")
            api.sync()
            return None
        with pytest.raises(DeadlockError):
            api.sync()
        if api.tileid == 2:
            api.send(0, "go")
        api.sync()  # completes only once tile 0 has sent and synced too
        return api.poll(0) if api.tileid == 1 else None

    assert values(run(sched, prog, tiles=[0, 1, 2])) == [None, True, None]


@pytest.mark.parametrize("error, first, others", [
    (DeadlockError, lambda api: api.recv(1), lambda api: api.sync()),
    (CollectiveMismatchError, lambda api: api.allreduce(1), lambda api: api.allgather(1)),
    (CollectiveMismatchError, lambda api: api.reduce(1), lambda api: api.allgather(1)),
    (CollectiveMismatchError, lambda api: api.allreduce(1), lambda api: api.sync()),
], ids=["recv-sync", "allreduce-allgather", "reduce-allgather", "allreduce-sync"])
@pytest.mark.parametrize("after", ["allgather", "allreduce", "sync"])
def test_the_collective_after_a_caught_error_completes(sched, error, first, others, after):
    """Every tile caught the error and calls the same collective next: it completes. The
    failed one was left counting the tiles still to wake as arrived, and the first tile
    to call the next one (rank 0, woken first) was taken for a mismatch."""
    def prog(api):
        with pytest.raises(error):
            (first if api.tileid == 0 else others)(api)
        return getattr(api, after)(api.tileid) if after != "sync" else api.sync()

    report = run(sched, prog, tiles=[0, 1, 2, 3])
    assert [r.status for r in report.results] == [OK] * 4, [r.error for r in report.results]
    expected = {"allgather": [0, 1, 2, 3], "allreduce": 6, "sync": None}[after]
    assert values(report) == [expected] * 4


def test_a_deeply_nested_broadcast_arrives(sched):
    def prog(api):
        value = 1
        for _ in range(600):  # deep enough that checking it recursively failed
            value = (value,)
        got = api.bcast(value if api.tileid == 0 else None, 0)
        depth = 0
        while type(got) is tuple:
            got, depth = got[0], depth + 1
        return depth, got

    assert values(run(sched, prog, tiles=[0, 1])) == [(600, 1)] * 2


@pytest.mark.parametrize("root", [0, 3, NTILES - 1])
def test_reduce_to_any_root_twice_in_a_row(sched, root):
    def prog(api):
        first = api.reduce(api.tileid + 1, root=root)
        second = api.reduce((api.tileid + 1) * 100, root=root)
        return first, second

    got = values(run(sched, prog))
    total = sum(range(1, NTILES + 1))
    assert got[root] == (total, total * 100)
    assert all(g == (None, None) for rank, g in enumerate(got) if rank != root)


def test_reduce_with_different_roots_is_a_mismatch(sched):
    def prog(api):
        return api.reduce(api.tileid + 1, root=1 if api.tileid == 0 else 0)

    report = run(sched, prog)
    assert all(r.status == ERROR for r in report.results)
    error = report.results[0].error
    assert isinstance(error, CollectiveMismatchError)
    assert "tile 0 waits in reduce(root=1)" in str(error)
    assert "tiles 1-7 wait in reduce(root=0)" in str(error)


def test_reduce_with_a_callable(sched):
    def prog(api):
        return api.allreduce({api.tileid}, lambda a, b: a | b)

    assert values(run(sched, prog)) == [set(range(NTILES))] * NTILES


@pytest.mark.parametrize("ntiles", [1, 2, 5, NTILES])
def test_scan_and_exscan_are_prefix_reductions_in_rank_order(sched, ntiles):
    def prog(api):
        mine = str(api.tileid)
        return (api.scan(api.tileid + 1), api.exscan(api.tileid + 1), api.scan(mine, lambda a, b: a + b),
                api.exscan(mine, lambda a, b: a + b), api.scan(-api.tileid, "min"))

    got = values(run(sched, prog, tiles=range(ntiles)))
    for rank, (total, before, text, text_before, low) in enumerate(got):
        assert total == (rank + 1) * (rank + 2) // 2
        assert before == (None if rank == 0 else rank * (rank + 1) // 2)
        assert text == "".join(map(str, range(rank + 1)))  # order kept: the op need not commute
        assert text_before == (None if rank == 0 else "".join(map(str, range(rank))))
        assert low == -rank


def test_scan_takes_log2_supersteps_of_one_message_each(sched):
    def prog(api):
        return api.scan(1)

    report = run(sched, prog)
    assert [r.value for r in report.results] == list(range(1, NTILES + 1))
    assert report.stats.supersteps <= (NTILES - 1).bit_length() + 2


@pytest.mark.parametrize("other", ["sync", "exscan", "allreduce"])
def test_scan_against_another_collective_is_a_mismatch(sched, other):
    def prog(api):
        if api.tileid == 2:
            return getattr(api, other)() if other == "sync" else getattr(api, other)(1)
        return api.scan(1)

    report = run(sched, prog)
    assert all(r.status in (ERROR, ABORTED) for r in report.results)
    assert isinstance(report.results[2].error, CollectiveMismatchError), report.results[2].error
    assert "scan()" in str(report.results[2].error)


def test_scan_after_a_tile_finished_says_so(sched):
    def prog(api):
        if api.tileid == 6:
            return None
        return api.scan(1)

    report = run(sched, prog)
    for result in report.results[:6]:
        assert "scan() needs every tile of the job, but tile 6 already finished" in str(result.error)


def test_unknown_reduction_is_a_clear_error(sched):
    def prog(api):
        api.allreduce(1, "average")

    report = run(sched, prog, tiles=[0])
    assert report.results[0].status == ERROR
    assert "unknown reduction 'average'" in str(report.results[0].error)


@pytest.mark.parametrize("call", [lambda api: api.reduce(1, None), lambda api: api.allreduce(1, None),
                                  lambda api: api.scan(1, "mean"), lambda api: api.exscan(1, "mean")],
                         ids=["reduce", "allreduce", "scan", "exscan"])
def test_a_wrong_op_is_every_tiles_own_error_even_once_a_tile_finished(sched, call):
    """Each tile's call names its own mistake, not another tile's (nor, when one raised
    at once and finished, that tile's end)."""
    report = run(sched, call, tiles=[0, 1, 2, 3])
    errors = [r.error for r in report.results]
    assert all(isinstance(e, ValueError) and "unknown reduction" in str(e) for e in errors), errors


@pytest.mark.parametrize("call, report", [
    (lambda api: api.allreduce(1, "max" if api.tileid == 0 else "sum"),
     "tile 0 waits in allreduce(op='max'); tiles 1-3 wait in allreduce()"),
    (lambda api: api.reduce(1, "min" if api.tileid == 3 else "prod", root=2),
     "tiles 0-2 wait in reduce(root=2, op='prod'); tile 3 waits in reduce(root=2, op='min')"),
    (lambda api: api.scan(1, operator.add if api.tileid == 1 else operator.mul),
     "tiles 0,2-3 wait in scan(op=mul); tile 1 waits in scan(op=add)"),
    (lambda api: api.exscan(1, "sum" if api.tileid else max), "tile 0 waits in exscan(op=max); tiles 1-3 wait in exscan()"),
], ids=["allreduce", "reduce", "scan", "exscan"])
def test_tiles_reducing_with_different_ops_are_a_mismatch(sched, call, report):
    """(Each node of the tree combined with its own op: the result was made with
    whichever op tile 0 had, say, and no tile was told.)"""
    def prog(api):
        with pytest.raises(CollectiveMismatchError, match=re.escape(report)):
            call(api)
        return api.allreduce(api.tileid, max)  # (the same function on every tile: fine)

    assert values(run(sched, prog, tiles=[0, 1, 2, 3])) == [3] * 4


def test_a_reduction_after_a_caught_mismatch_sees_only_its_own_values(sched):
    """The mismatched allreduce had sent its values up the tree already; the abort must
    not leave them for the next reduction to combine."""
    def prog(api):
        try:
            if api.tileid == 0:
                api.sync()
            else:
                api.allreduce(1000)
        except CollectiveMismatchError:
            pass
        return api.allreduce(api.tileid), api.reduce(1)

    report = run(sched, prog)
    assert [r.status for r in report.results] == [OK] * NTILES
    assert values(report) == [(sum(range(NTILES)), NTILES)] + [(sum(range(NTILES)), None)] * (NTILES - 1)
    assert all(tile.in_live == 0 for tile in sched.tiles[:NTILES])  # (the values were freed)


def test_collective_mismatch_names_the_tiles(sched):
    def prog(api):
        if api.tileid == 2:
            api.bcast("x", root=0)
        else:
            api.alltoall(api.tileid)

    report = run(sched, prog)
    assert all(r.status == ERROR for r in report.results)
    message = str(report.results[0].error)
    assert isinstance(report.results[0].error, CollectiveMismatchError)
    assert "tile 2 waits in bcast(root=0)" in message
    assert "tiles 0-1,3-7 wait in alltoall()" in message


def test_collective_after_a_tile_finished_is_an_error(sched):
    def prog(api):
        if api.tileid == 0:
            return None
        api.alltoall(1)

    report = run(sched, prog, tiles=[0, 1, 2])
    assert [r.status for r in report.results] == [OK, ERROR, ERROR]
    assert "tile 0 already finished" in str(report.results[1].error)


@pytest.mark.parametrize("collective", ["reduce", "allreduce"])
@pytest.mark.parametrize("first_sync", [True, False])  # without: tile 3 ends as the others start
def test_a_reduction_after_a_tile_finished_says_so_rather_than_deadlock(sched, collective, first_sync):
    def prog(api):
        if api.tileid == 3:
            return None
        if first_sync:
            api.sync()
        getattr(api, collective)(1)

    report = run(sched, prog, tiles=[0, 1, 2, 3])
    assert report.results[3].status == OK
    assert isinstance(report.results[0].error, CollectiveMismatchError)
    assert f"{collective}() needs every tile of the job, but tile 3 already finished" in str(report.results[0].error)
    for result in report.results[1:3]:  # the same error, or stopped by tile 0's
        assert result.status in (ERROR, ABORTED)
        assert "tile 3 already finished" in str(result.error)


def test_a_reduction_tree_failing_tile_by_tile_blames_the_tile_that_ended(sched):
    """The tree's tiles fail one after another, each missing its partner; every error
    names the tile whose end started it, so that they group as one."""
    def prog(api):
        if api.tileid == 3:
            return None
        try:
            api.allreduce(1)
        except CollectiveMismatchError as exc:
            return str(exc)

    report = run(sched, prog)
    assert NTILES >= 8  # a tree some levels deep
    messages = {r.value for r in report.results if r.rank != 3}
    assert messages == {"allreduce() needs every tile of the job, but tile 3 already finished"}


def test_tile_numbers_are_integers_not_bools_or_floats(sched):
    import enum

    class Side(enum.IntEnum):
        LEFT = 0
        RIGHT = 1

    def prog(api):
        api.send(Side.RIGHT if api.tileid == 0 else Side.LEFT, "hello")  # any integer will do
        api.sync()
        got = []
        for call in (lambda: api.send(True, 1), lambda: api.recv(1.0), lambda: api.recv([1]),
                     lambda: api.poll(0.0), lambda: api.bcast(1, root=False),
                     lambda: api.send(2, 1), lambda: api.gather(1, root=-1)):
            try:
                call()
            except (TypeError, ValueError) as exc:
                got.append(f"{type(exc).__name__}: {exc}")
        return got, api.recv(Side(1 - api.tileid)), api.bcast(api.tileid, root=Side.RIGHT)

    assert values(run(sched, prog, tiles=[0, 1])) == [([
        "TypeError: send(): a tile number is an int, not bool (True)",
        "TypeError: recv(): a tile number is an int, not float (1.0)",
        "TypeError: recv(): a tile number is an int, not list ([1])",
        "TypeError: poll(): a tile number is an int, not float (0.0)",
        "TypeError: bcast(): root: a tile number is an int, not bool (False)",
        "ValueError: send(): no tile 2 in this job (tiles 0-1)",
        "ValueError: gather(): root: no tile -1 in this job (tiles 0-1)",
    ], "hello", 1)] * 2
    report = run(sched, lambda api: api.send(1, "x"), tiles=[0])
    assert str(report.results[0].error) == "send(): no tile 1 in this job (tile 0)"


# -- deadlocks, failures, interrupts -----------------------------------------------------


def test_deadlock_all_waiting_in_recv(sched):
    def prog(api):
        api.recv((api.tileid + 1) % api.numtiles)

    report = run(sched, prog, tiles=[0, 1, 2])
    assert all(isinstance(r.error, DeadlockError) for r in report.results)
    assert "tile 0 waits in recv from tile 1" in str(report.results[0].error)


def test_reports_give_the_machine_tiles_beside_the_programs_numbers(sched):
    def prog(api):
        if api.tileid == 0:
            api.recv(1)
        else:
            api.sync()

    message = str(run(sched, prog, tiles=[3, 5]).results[0].error)
    assert ("tile 0 (machine tile 3) waits in recv from tile 1; "
            "tile 1 (machine tile 5) waits in sync()") in message


def test_deadlock_recv_against_sync(sched):
    def prog(api):
        if api.tileid == 0:
            api.recv(1)
        else:
            api.sync()

    report = run(sched, prog, tiles=[0, 1])
    message = str(report.results[0].error)
    assert "tile 0 waits in recv from tile 1" in message and "tile 1 waits in sync()" in message


def test_recv_from_a_finished_tile_is_a_deadlock(sched):
    def prog(api):
        if api.tileid == 0:
            api.send(1, "only one")
            return None
        first = api.recv(0)
        second = api.recv(0)  # tile 0 finished after one message
        return first, second

    report = run(sched, prog, tiles=[0, 1])
    assert report.results[1].status == ERROR
    assert "which has finished" in str(report.results[1].error)


@pytest.mark.parametrize("collective", ["sync", "alltoall", "bcast", "reduce", "allreduce"])
def test_exception_on_one_tile_aborts_the_others_at_their_next_collective(sched, collective):
    def prog(api):
        if api.tileid == 5:
            raise ZeroDivisionError("boom")
        # tiles 0-4 arrive before tile 5 fails, tiles 6-7 after it has finished
        getattr(api, collective)(*(() if collective == "sync" else (api.tileid,)))
        return "unreachable"

    report = run(sched, prog)
    assert report.results[5].status == ERROR
    assert "ZeroDivisionError: boom" in report.results[5].traceback
    others = [r for r in report.results if r.rank != 5]
    assert all(r.status == ABORTED for r in others)
    assert all(isinstance(r.error, JobAborted) and "tile 5 failed" in str(r.error) for r in others)


def test_except_exception_does_not_keep_an_aborted_tile_going(sched):
    def prog(api):
        if api.tileid == 1:
            raise ValueError("boom")
        steps = 0
        while steps < 5:
            try:
                api.sync()
                steps += 1
            except Exception:  # (as careless user code does)
                pass
        return steps

    report = run(sched, prog, tiles=[0, 1, 2])
    assert [r.status for r in report.results] == [ABORTED, ERROR, ABORTED]


def test_a_target_raising_greenlet_exit_fails_its_tile_and_the_tile_lives_on(sched):
    # (only the machine's shutdown ends a tile's greenlet)
    def prog(api):
        if api.tileid == 2:
            raise greenlet.GreenletExit("not the machine's")
        api.sync()

    report = run(sched, prog, tiles=range(4))
    assert [r.status for r in report.results] == [ABORTED, ABORTED, ERROR, ABORTED]
    assert isinstance(report.results[2].error, greenlet.GreenletExit)
    assert values(run(sched, lambda api: api.tileid, tiles=[2])) == [0]


def test_interrupt_stops_a_runaway_tile_and_the_machine_keeps_running(sched):
    def prog(api):
        if api.tileid == 0:
            while True:
                pass
        api.sync()

    job = sched.start_job([0, 1, 2], prog)
    time.sleep(0.1)
    assert not job.future.done()
    sched.interrupt_job(job, "stop please")
    report = job.future.result(5)
    assert report.results[0].status == INTERRUPTED
    assert "stop please" in str(report.results[0].error)
    assert values(run(sched, lambda api: api.allreduce(1), tiles=[0, 1, 2])) == [3, 3, 3]


def test_interrupt_reaches_tiles_parked_in_recv(sched):
    def prog(api):
        if api.tileid == 0:
            while True:  # never sends: tile 1 waits, but this is no deadlock
                pass
        return api.recv(0)

    job = sched.start_job([0, 1], prog)
    time.sleep(0.1)
    sched.interrupt_job(job)
    assert [r.status for r in job.future.result(5).results] == [INTERRUPTED, INTERRUPTED]


def test_compute_budget(sched):
    def prog(api):
        if api.tileid == 1:
            x = 0
            while True:
                x += 1
        api.sync()

    report = run(sched, prog, tiles=[0, 1, 2, 3], budget=0.2)  # (else it fails waiting)
    assert report.results[1].status == ERROR
    assert "computed for more than 0.2 s" in str(report.results[1].error)
    assert [r.status for r in report.results if r.rank != 1] == [ABORTED] * 3


@pytest.mark.parametrize("budget", ["0.5", -1, 0, float("nan"), float("inf"), True, 10**400])
def test_a_budget_must_be_a_positive_finite_number(sched, budget):
    """Checked before the job starts: a string or NaN reached the watchdog's comparisons
    and killed its thread, after which nothing could interrupt a job."""
    with pytest.raises(ValueError, match="compute budget must be a"):
        sched.start_job([0], lambda api: None, budget=budget)
    assert sched.watchdog.thread.is_alive()
    assert not sched.jobs


def test_user_code_cannot_swallow_an_interrupt_with_except_exception(sched):
    def prog(api):
        try:
            while True:
                pass
        except Exception:
            return "swallowed"

    job = sched.start_job([0], prog)
    time.sleep(0.05)
    sched.interrupt_job(job)
    assert job.future.result(5).results[0].status == INTERRUPTED


def test_an_interrupt_swallowed_by_a_bare_except_comes_again(sched):
    """Like a repeated Ctrl-C: the tile stops once one lands outside its handler. (A
    program spinning inside ``try`` with a bare ``except`` around it cannot be stopped
    this way: the interrupt always lands inside; docs/architecture.md says so.)"""
    caught = []

    def step():
        for _ in range(20):  # most places an interrupt can land are in here, in the try
            pass

    def prog(api):
        while True:
            try:
                step()
            except BaseException as exc:  # what a bare except does
                caught.append(type(exc).__name__)

    job = sched.start_job([0], prog)
    time.sleep(0.05)
    sched.interrupt_job(job)
    # (how many repeats it takes is chance: where each one lands)
    assert job.future.result(60).results[0].status == INTERRUPTED
    assert sched.call_wait(lambda: "the scheduler answers") == "the scheduler answers"


def test_ctrl_c_is_a_keyboard_interrupt_each_tile_gets_once_and_may_clean_up_after(sched):
    """Tile 0 computes (the watchdog stops it), the others wait in sync (stopped there).
    Its cleanup reaches an exchange point: a second delivery of the same Ctrl-C would
    land there."""
    caught = []

    def prog(api):
        try:
            while True:
                if api.tileid == 0:
                    while True:
                        pass
                api.sync()
        except KeyboardInterrupt as exc:
            caught.append((api.tileid, type(exc)))
            api.sync()  # (cleanup that exchanges)
            raise

    job = sched.start_job([0, 1, 2], prog)
    time.sleep(0.1)
    sched.interrupt_job(job, "interrupted (Ctrl-C)", ctrl_c=True)
    report = job.future.result(5)
    assert [r.status for r in report.results] == [INTERRUPTED] * 3
    assert all(str(r.error) == "interrupted (Ctrl-C)" for r in report.results)
    assert sorted(caught) == [(rank, TileKeyboardInterrupt) for rank in range(3)]


def test_a_program_that_swallows_ctrl_c_runs_on_until_kill(sched):
    caught = [0, 0]
    rounds = [0, 0]  # supersteps each tile has passed

    def prog(api):
        while True:
            try:
                while True:
                    if api.tileid == 0:
                        for _ in range(10**5):
                            pass
                    api.sync()
                    rounds[api.tileid] += 1
            except KeyboardInterrupt:
                caught[api.tileid] += 1

    def runs_on(past: int) -> None:
        """Wait until both tiles have passed ``past`` supersteps more."""
        goal = [n + past for n in rounds]
        wait_for(lambda: all(n >= g for n, g in zip(rounds, goal)) or job.future.done(), what="supersteps")

    job = sched.start_job([0, 1], prog)
    for presses in (1, 2):
        runs_on(3)
        sched.interrupt_job(job, "interrupted (Ctrl-C)", ctrl_c=True)
        wait_for(lambda: caught == [presses, presses] or job.future.done(), what="the Ctrl-C caught")
        runs_on(5)  # (a second delivery of the same Ctrl-C would have come by now)
        assert not job.future.done() and caught == [presses, presses]  # one each per Ctrl-C
    sched.interrupt_job(job, "killed")  # not a KeyboardInterrupt: it stops
    report = job.future.result(5)
    assert [r.status for r in report.results] == [INTERRUPTED] * 2
    assert not any(isinstance(r.error, KeyboardInterrupt) for r in report.results)
    assert caught == [2, 2]


def _started(job, entered: list, ntiles: int) -> None:
    """Wait until each of the job's ``ntiles`` tiles has put its rank in ``entered``."""
    wait_for(lambda: len(entered) == ntiles or job.future.done(), what="the tiles to start")


def _sync_until_a_ctrl_c(api, entered: list) -> None:
    """A tile program's start: count the tile in, then sync until a Ctrl-C, caught."""
    entered.append(api.tileid)
    try:
        while True:
            api.sync()
    except KeyboardInterrupt:
        pass


def test_a_caught_ctrl_c_leaves_deadlocks_reported(sched):
    """Without the Ctrl-C the recv ring deadlocks at once: after a Ctrl-C the program
    caught, it is a job like any other."""
    entered = []

    def prog(api):
        _sync_until_a_ctrl_c(api, entered)
        api.recv((api.tileid + 1) % api.numtiles)

    job = sched.start_job([0, 1, 2], prog)
    _started(job, entered, 3)
    sched.interrupt_job(job, "interrupted (Ctrl-C)", ctrl_c=True)
    try:
        report = job.future.result(5)
    finally:
        sched.interrupt_job(job, "the test is over")
    assert [r.status for r in report.results] == [ERROR] * 3
    assert all(isinstance(r.error, DeadlockError) for r in report.results)


def test_a_caught_ctrl_c_leaves_a_failure_handled_as_ever(sched):
    """After one tile's exception the others run on to their next exchange point (see
    Job.abort), a caught Ctrl-C before or not."""
    entered, ran_on = [], []

    def prog(api):
        _sync_until_a_ctrl_c(api, entered)
        api.sync()
        if api.tileid == 0:
            raise ValueError("boom")
        ran_on.append(api.tileid)
        api.sync()

    job = sched.start_job([0, 1, 2], prog)
    _started(job, entered, 3)
    sched.interrupt_job(job, "interrupted (Ctrl-C)", ctrl_c=True)
    report = job.future.result(5)
    assert [r.status for r in report.results] == [ERROR, ABORTED, ABORTED]
    assert sorted(ran_on) == [1, 2]


def test_a_failure_while_the_others_have_a_ctrl_c_still_to_raise_stops_them(sched):
    """Tile 0 takes its Ctrl-C first and fails at once, while tiles 1 and 2 have theirs
    still to raise: the job's abort must not wait behind a Ctrl-C they catch (it did,
    and they ran on to the end as if the job had not failed)."""
    entered = []

    def prog(api):
        _sync_until_a_ctrl_c(api, entered)
        if api.tileid == 0:
            raise ValueError("boom")
        api.sync()
        api.sync()

    job = sched.start_job([0, 1, 2], prog)
    _started(job, entered, 3)
    # on the scheduler thread, between supersteps: every tile gets its Ctrl-C as it
    # waits, and tile 0 (resumed first) raises and fails before the others resume
    sched.call(sched.interrupt_job, job, "interrupted (Ctrl-C)", True).result(5)
    report = job.future.result(5)
    assert [r.status for r in report.results] == [ERROR, ABORTED, ABORTED]
    assert "tile 0 failed with ValueError: boom" in str(report.results[1].error)


@pytest.mark.parametrize("handler", ["allreduce", "recv"])
def test_a_ctrl_c_reaches_tiles_at_an_exchange_point_before_the_computing_one_meets_them(sched, handler):
    """Tile 2 computes, the others wait in sync(): the watchdog hands tile 2 its Ctrl-C at
    once, and its handler's allreduce met the others still in sync() (their Ctrl-C was
    queued for the scheduler thread): a collective mismatch, and their handlers never ran.
    Every tile runs its handler, as processes all get a terminal's SIGINT."""
    entered, handled = [], {}

    def prog(api):
        entered.append(api.tileid)
        try:
            api.sync()
            if api.tileid == 2:
                while True:
                    pass
            while True:
                api.sync()
        except KeyboardInterrupt:
            if handler == "allreduce":
                handled[api.tileid] = api.allreduce(api.tileid)
            else:  # a ring: each sends to the next and takes from the one before
                api.send((api.tileid + 1) % api.numtiles, api.tileid)
                handled[api.tileid] = api.recv((api.tileid - 1) % api.numtiles)

    for _ in range(3):
        entered.clear()
        handled.clear()
        job = sched.start_job(range(4), prog)
        _started(job, entered, 4)
        wait_for(lambda: sched.in_compute, what="tile 2 computing")
        sched.interrupt_job(job, "interrupted (Ctrl-C)", ctrl_c=True)  # (from this thread: queued)
        report = job.future.result(10)
        assert [r.status for r in report.results] == [OK] * 4, [r.error for r in report.results]
        assert handled == ({0: 6, 1: 6, 2: 6, 3: 6} if handler == "allreduce" else {0: 3, 1: 0, 2: 1, 3: 2})


def _ctrl_c_while_computing(sched, prog, ntiles: int, entered: list, computing: int | None, begun: int = 0):
    """Run ``prog`` on tiles 0 to ``ntiles - 1``, press Ctrl-C (from this thread: queued)
    once ``begun`` tiles (all, if 0) have begun (``entered``) and tile ``computing`` (None:
    the first to begin) computes, and return the job's report (the job is stopped for
    good whatever happens)."""
    job = sched.start_job(range(ntiles), prog)
    try:
        wait_for(lambda: len(entered) == (begun or ntiles) and sched.computing_tile() is sched.tiles[
            entered[0] if computing is None else computing], what=f"tile {computing} computing")
        sched.interrupt_job(job, "interrupted (Ctrl-C)", ctrl_c=True)
        return job.future.result(10)
    finally:
        sched.interrupt_job(job, "the test is over")  # (a no-op once it has ended)


@pytest.mark.parametrize("ntiles, computing", [(2, 1), (3, 2), (5, 4), (4, 1), (5, 2)])
@pytest.mark.parametrize("waiting_in", ["sync", "allreduce"])
def test_handlers_exchange_afresh_after_a_ctrl_c_that_stopped_a_collective(sched, waiting_in, ntiles, computing):
    """One tile computes; those before it wait in a collective, those after it have not
    been resumed in that superstep yet. On a Ctrl-C every tile's handler reduces again
    and must get exactly the handlers' values. Bugs did otherwise: a part an interrupted
    allreduce had already sent was taken for the handlers' (2 tiles: 11 instead of 20);
    the first tile out of the collective met with its handler's those still to leave
    theirs (a collective mismatch, or handlers that never ran); and the leader, raising
    its Ctrl-C a superstep after the tiles behind the computing one, dropped the parts
    their handlers had sent it already (a deadlock)."""
    entered, handled = [], {}

    def prog(api):
        entered.append(api.tileid)
        try:
            api.sync()  # (every tile has begun: those after the computing one take the Ctrl-C here)
            if api.tileid == computing:
                while True:
                    pass
            api.sync() if waiting_in == "sync" else api.allreduce(1)
        except KeyboardInterrupt:
            handled[api.tileid] = api.allreduce(10)

    for _ in range(2):
        entered.clear()
        handled.clear()
        report = _ctrl_c_while_computing(sched, prog, ntiles, entered, computing)
        assert [r.status for r in report.results] == [OK] * ntiles, [r.error for r in report.results]
        assert handled == dict.fromkeys(range(ntiles), 10 * ntiles)


@pytest.mark.parametrize("ntiles", [2, 3, 5])
@pytest.mark.parametrize("handler_exchanges", [False, True])
@pytest.mark.parametrize("first_superstep", [False, True])
def test_tiles_still_to_run_when_a_ctrl_c_comes_take_it_at_their_next_exchange_point(
        sched, ntiles, handler_exchanges, first_superstep):
    """Tile 0, resumed first, computes; the others, still to run in that superstep, were
    given the Ctrl-C where they last waited: a sync() before the program's try:, so
    they died of it (their handlers never ran), or went on to meet a tile 0 that had
    ended ('needs tile 0, which already finished'). On the chip they had long left
    that sync(): they take it at their next exchange point, inside the try:. In the
    job's first superstep (no sync() first) they had not begun at all, and were stopped
    before their first line: tile 0's handler met no one (a CollectiveMismatchError).
    On the chip they had begun too. (There the tile that computes is the first to begin,
    not always tile 0: a job started while a fresh scheduler boots its tiles begins on
    the first tile booted after it.)"""
    entered, handled = [], {}

    def prog(api):
        first = not entered
        entered.append(api.tileid)
        if not first_superstep:
            api.sync()
        try:
            if (first if first_superstep else api.tileid == 0):
                while True:
                    pass
            api.allreduce(1)
        except KeyboardInterrupt:
            handled[api.tileid] = api.allreduce(10) if handler_exchanges else True

    report = (_ctrl_c_while_computing(sched, prog, ntiles, entered, None, begun=1) if first_superstep
              else _ctrl_c_while_computing(sched, prog, ntiles, entered, 0))
    assert [r.status for r in report.results] == [OK] * ntiles, [r.error for r in report.results]
    assert handled == dict.fromkeys(range(ntiles), 10 * ntiles if handler_exchanges else True)


def _counting_to_a_ctrl_c(first_superstep: bool, entered: list, counted: dict, handler_syncs: bool = False):
    """A program whose tiles count until their Ctrl-C, into ``counted[tileid] =
    (computed when it came, count)``; the first to begin computes (in the job's first
    superstep), or else tile 0 (after a sync()). ``handler_syncs``: the handler ends in
    a sync(), which the computing tile is the first to reach."""

    def prog(api):
        first = not entered
        entered.append(api.tileid)
        if not first_superstep:
            api.sync()
        n = 0
        try:
            while True:
                n += 1
        except KeyboardInterrupt:
            counted[api.tileid] = (first if first_superstep else api.tileid == 0, n)
            if handler_syncs:
                api.sync()

    return prog


#: the tests of the scheduler thread counting bytecodes to a Ctrl-C (CtrlCSettle): not
#: where it leaves that to the watchdog
counting = pytest.mark.skipif(sys.gettrace() is not None or sys.version_info[:2] == (3, 12),
                              reason="a traced thread (coverage, a debugger), or Python 3.12: the watchdog's")


@counting
@pytest.mark.parametrize("handler_syncs", [False, True])
@pytest.mark.parametrize("first_superstep", [False, True])
def test_tiles_that_run_after_a_ctrl_c_take_it_after_as_many_bytecodes_each(sched, first_superstep, handler_syncs):
    """The tiles the host runs after the Ctrl-C came compute without reaching an
    exchange point: each takes the Ctrl-C once it has run CTRL_C_AFTER bytecodes of its
    program, so each counts as far as the next, however busy the host. (The watchdog
    stopped each a time after it saw it computing: each counted to its own n, and each
    took the watchdog a look or more: 1472 tiles, 2 s.) Counting stops with the
    superstep: nothing traces the scheduler thread after it."""
    entered, counted = [], {}
    prog = _counting_to_a_ctrl_c(first_superstep, entered, counted, handler_syncs)
    report = (_ctrl_c_while_computing(sched, prog, 4, entered, None, begun=1) if first_superstep
              else _ctrl_c_while_computing(sched, prog, 4, entered, 0))
    assert [r.status for r in report.results] == [OK] * 4, [r.error for r in report.results]
    later = [n for computed, n in counted.values() if not computed]
    assert len(later) == 3 and len(set(later)) == 1, counted
    # (into its loop: the program's first lines and ~5 bytecodes a turn; not past it)
    assert 100 < later[0] < CTRL_C_AFTER / 4, counted
    assert not sched.ctrl_c_settle.counting
    assert sched.call_wait(sys.gettrace) is None and sched.call_wait(greenlet.gettrace) is None


def _compute_a_little() -> int:
    """A few hundred bytecodes of compute (where Python drops exceptions, below)."""
    total = 0
    for i in range(60):
        total += i
    return total


class _Finalised:
    """Computes as it is freed: a Ctrl-C raised in its ``__del__`` would be printed as
    "Exception ignored" and lost."""

    def __del__(self):
        _compute_a_little()


class _ClosedAsDel:
    def close(self):
        _compute_a_little()

    __del__ = close


class _DelThroughLibrary:
    def __del__(self):
        copy.copy(self)

    def __copy__(self):
        _compute_a_little()


class _SlowDel:
    def __del__(self):
        for _ in range(200_000):  # (past the watchdog's 20 ms backstop)
            pass


def _finally_computes():
    try:
        yield
    finally:
        _compute_a_little()


class _Referent:
    pass


def _weakref_callback(ref):
    _compute_a_little()


def _drops(kind: str) -> None:
    """Free something whose finalising code (``kind``) computes, where Python drops
    any exception."""
    if kind == "del":
        _Finalised()
    elif kind == "del_by_another_name":
        _ClosedAsDel()
    elif kind == "del_through_a_library":
        _DelThroughLibrary()
    elif kind == "slow_del":
        _SlowDel()
    elif kind == "generator_finally":
        generator = _finally_computes()
        next(generator)
        del generator
    elif kind == "weakref_callback":
        referent = _Referent()
        ref = weakref.ref(referent, _weakref_callback)  # noqa: F841
        del referent


@counting
@pytest.mark.parametrize("kind", ["del", "del_by_another_name", "del_through_a_library", "slow_del",
                                  "generator_finally", "weakref_callback"])
def test_a_ctrl_c_python_drops_is_raised_again(sched, kind):
    """Tiles run after the Ctrl-C spend most of their bytecodes in code where Python
    drops exceptions ("Exception ignored"). The count waits for a bytecode outside a
    ``__del__``; where no name tells (or the watchdog's backstop raises it, past a slow
    ``__del__``), it is raised again. (It was lost, and those tiles computed on for ever.)"""
    entered, counted = [], {}

    def prog(api):
        entered.append(api.tileid)
        api.sync()
        n = 0
        try:
            while True:
                if api.tileid:  # (tile 0 computes plainly: the watchdog's Ctrl-C lands anywhere)
                    _drops(kind)
                n += 1
        except KeyboardInterrupt:
            counted[api.tileid] = n

    report = _ctrl_c_while_computing(sched, prog, 4, entered, 0)
    assert [r.status for r in report.results] == [OK] * 4, [r.error for r in report.results]
    assert sorted(counted) == [0, 1, 2, 3]


def test_a_tracer_of_the_scheduler_thread_is_left_alone_by_a_ctrl_c(sched):
    """A debugger or coverage that traces the scheduler thread keeps its tracer: the
    tiles that run after the Ctrl-C are stopped by the watchdog instead, where they
    compute, and run their handlers all the same."""
    frames = []

    def tracer(frame, event, arg):
        frames.append(frame.f_code.co_name)

    sched.call_wait(sys.settrace, tracer)
    try:
        entered, counted = [], {}
        report = _ctrl_c_while_computing(sched, _counting_to_a_ctrl_c(True, entered, counted), 3,
                                         entered, None, begun=1)
        assert [r.status for r in report.results] == [OK] * 3, [r.error for r in report.results]
        assert len(counted) == 3 and "prog" in frames
        assert sched.call_wait(sys.gettrace) is tracer
    finally:
        sched.call_wait(sys.settrace, None)


@pytest.mark.parametrize("second", ["ctrl_c", "stop"])
def test_a_second_interrupt_while_handlers_exchange_stops_every_tile(sched, second):
    """Tile 0's handler computes, the others' wait in allreduce() for it; a second Ctrl-C
    or a stop then came to tile 0 at once, and the others' allreduce() reported it gone
    (a CollectiveMismatchError, the job failed) instead of their own interrupt."""
    entered, handling = [], []

    def prog(api):
        entered.append(api.tileid)
        try:
            while True:
                api.allreduce(1)
        except KeyboardInterrupt:
            handling.append(api.tileid)
            if api.tileid == 0:
                while True:
                    pass
            api.allreduce(10)

    job = sched.start_job(range(3), prog)
    wait_for(lambda: len(entered) == 3, what="the tiles to start")
    sched.interrupt_job(job, "interrupted (Ctrl-C)", ctrl_c=True)
    try:
        wait_for(lambda: 0 in handling and sched.computing_tile() is sched.tiles[0], what="tile 0's handler computing")
        sched.interrupt_job(job, "interrupted (Ctrl-C)" if second == "ctrl_c" else "killed", ctrl_c=second == "ctrl_c")
        report = job.future.result(10)
    finally:
        sched.interrupt_job(job, "the test is over")
    assert [r.status for r in report.results] == [INTERRUPTED] * 3, [r.error for r in report.results]


@pytest.mark.parametrize("bad", [None, 0, 2, 3])
def test_a_handlers_allgather_waits_for_the_others_before_it_writes_its_part(sched, bad):
    """Tile 1 computes; on a Ctrl-C every handler calls allgather, the last tile after a
    kernel request to tile 0. A part written while its tile waited for the others to
    leave the collective they were in was freed by their leaving: tile 0's reply was
    written over it (every tile failed to unpickle), and a tile's refusal (``bad``: an
    object no exchange can carry) was forgotten (the others read stale offsets)."""
    import threading as threads

    sched.services["echo"] = lambda tile, value: value
    entered = []

    def prog(api):
        entered.append(api.tileid)
        try:
            api.sync()
            if api.tileid == 1:
                while True:
                    pass
            api.sync()
        except KeyboardInterrupt:
            if api.tileid == 3:
                sched.call_tile(sched.tiles[3], 0, "echo", "Z" * 60)
            try:
                return ("got", api.allgather(threads.Lock() if api.tileid == bad else ("part-of", api.tileid)))
            except TypeError as exc:
                return ("raised", str(exc))

    report = _ctrl_c_while_computing(sched, prog, 4, entered, 1)
    assert [r.status for r in report.results] == [OK] * 4, [r.error for r in report.results]
    if bad is None:
        assert [r.value for r in report.results] == [("got", [("part-of", rank) for rank in range(4)])] * 4
    else:
        for r in report.results:
            kind, message = r.value
            assert kind == "raised"
            assert message.startswith("cannot send" if r.rank == bad else f"allgather() failed on tile {bad}: ")


def test_a_stop_is_raised_once_whichever_way_it_comes(sched):
    """A host's stop is handed out at the next exchange and by a queued call, whichever
    comes first: both did, and the second stopped the cleanup a program ran after
    catching the first."""
    entered, log = [], []

    def prog(api):
        tile = sched.tiles[api.tileid]
        entered.append(api.tileid)
        try:
            tile.wait(lambda: False, "the host")
        except TileInterrupt:
            api.sync()
            api.sync()
            log.append(api.tileid)

    for _ in range(3):
        entered.clear()
        log.clear()
        job = sched.start_job(range(2), prog)
        wait_for(lambda: len(entered) == 2, what="the tiles to wait")
        time.sleep(0.1)  # (the scheduler idle: the call is taken first)
        sched.interrupt_job(job, "killed")
        report = job.future.result(10)
        assert [r.status for r in report.results] == [OK, OK] and sorted(log) == [0, 1], report.results


def test_a_stop_right_after_a_ctrl_c_is_not_caught_as_it(sched):
    """The tiles have the Ctrl-C pending when the stop comes: they get the stop instead,
    at their next exchange point, not when the watchdog happens to find them computing."""
    entered, rounds = [], []

    def prog(api):
        entered.append(api.tileid)
        while True:
            try:
                api.sync()
            except KeyboardInterrupt:
                pass
            rounds.append(api.tileid)

    job = sched.start_job(range(4), prog)
    _started(job, entered, 4)

    def ctrl_c_then_stop():  # (between supersteps, as two calls in one batch would be)
        sched.interrupt_job(job, "interrupted (Ctrl-C)", ctrl_c=True)
        sched.interrupt_job(job, "killed")
        return len(rounds)

    before = sched.call_wait(ctrl_c_then_stop)
    report = job.future.result(10)
    assert [r.status for r in report.results] == [INTERRUPTED] * 4
    assert not any(isinstance(r.error, KeyboardInterrupt) for r in report.results)
    assert len(rounds) == before  # (no tile went round its loop again)


def test_a_ctrl_c_after_a_stop_does_not_make_it_one_the_program_may_catch(sched):
    """A tile computing (no exchange point) that swallows Ctrl-Cs and the first stops:
    the watchdog must go on raising the stop, whatever Ctrl-C comes after it."""
    entered, stops = [], []

    def prog(api):
        entered.append(api.tileid)
        while True:
            try:
                while True:
                    pass
            except KeyboardInterrupt:
                pass
            except TileInterrupt:
                stops.append(1)
                if len(stops) >= 3:
                    raise

    job = sched.start_job([0], prog)
    _started(job, entered, 1)
    sched.interrupt_job(job, "killed")
    sched.interrupt_job(job, "interrupted (Ctrl-C)", ctrl_c=True)
    try:
        report = job.future.result(5)
    finally:
        stops.extend([1, 1, 1])  # (lets it end whatever the outcome)
        sched.interrupt_job(job, "the test is over")
    assert report.results[0].status == INTERRUPTED and len(stops) == 6


def test_a_compute_budget_is_no_keyboard_interrupt(sched):
    def prog(api):
        try:
            while True:
                pass
        except KeyboardInterrupt:
            return "caught"

    report = run(sched, prog, tiles=[0], budget=0.1)
    assert report.results[0].status == ERROR


def test_a_tiles_ctrl_c_reaches_the_host_as_no_keyboard_interrupt(sched):
    """A host thread would take it for its own Ctrl-C."""
    def ctrl_c(tile, _):
        raise TileKeyboardInterrupt("interrupted (Ctrl-C)")

    sched.services["test.ctrl_c"] = ctrl_c
    error = sched.submit(0, "test.ctrl_c", None).exception(5)
    assert isinstance(error, TileInterrupt) and not isinstance(error, KeyboardInterrupt)
    assert str(error) == "interrupted (Ctrl-C)"


# -- jobs, tiles and the host -------------------------------------------------------------


def test_a_failed_request_nobody_awaits_is_reported_not_lost():
    from ipuos.scheduler._tile import Request

    scheduler = Scheduler(SRAM(2, 64 * 1024), tiles_per_chip=2, exchange_out=2048, exchange_in=4096)
    scheduler.services["test.boom"] = lambda tile: 1 / 0
    scheduler.start()
    try:
        def post():
            tile = scheduler.tiles[1]
            tile.queue(Request("test.boom", (), None))
            scheduler.wake(tile)

        scheduler.call_wait(post)
        deadline = time.monotonic() + 5
        while not scheduler.internal_errors and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(scheduler.internal_errors) == 1
        assert "tile 1: kernel service 'test.boom' failed" in scheduler.internal_errors[0]
        assert "ZeroDivisionError" in scheduler.internal_errors[0]
    finally:
        scheduler.stop()


def test_a_class_only_a_program_knows_is_refused_in_kernel_requests(sched):
    # user messages carry it by name (decoded on the receiving tile, see test_runtime);
    # a kernel request is decoded by the scheduler, which could not: refused when sent
    Thing = type("Thing", (), {"__module__": "defined_by_a_tile_program"})
    sched.services["test.echo"] = lambda tile, value: value

    def prog(api):
        if api.tileid == 0:
            try:
                sched.call_tile(api.tile, api.job.ids[1], "test.echo", Thing())
            except TypeError as exc:
                return str(exc)
        return sched.call_tile(api.tile, api.job.ids[0], "test.echo", "fine")

    got = values(run(sched, prog, tiles=[0, 1]))
    assert got[0].startswith("cannot send an object of type tuple through the exchange")
    assert "defined_by_a_tile_program.Thing" in got[0]
    assert got[1] == "fine"
    assert sched.internal_errors == []


def test_two_jobs_run_at_once_with_separate_groups(sched):
    def prog(api):
        total = api.allreduce(api.tileid)
        for _ in range(3):
            api.sync()
        return api.numtiles, total

    a = sched.start_job([0, 1, 2], prog)
    b = sched.start_job([3, 4, 5, 6, 7], prog)
    assert values(a.future.result(5)) == [(3, 3)] * 3
    assert values(b.future.result(5)) == [(5, 10)] * 5


def test_a_busy_tile_cannot_start_another_job(sched):
    release = threading.Event()

    def prog(api):
        while not release.is_set():
            api.sync()

    job = sched.start_job([0, 1], prog)
    other = sched.start_job([3], prog)
    try:
        with pytest.raises(TileBusyError, match=f"tile 1 already runs job {job.id}; wait for it or kill it first"):
            sched.start_job([1, 2], lambda api: None)
        with pytest.raises(TileBusyError, match="tiles 0-1 already run"):
            sched.start_job([0, 1, 2], lambda api: None)
        with pytest.raises(TileBusyError, match=f"tiles 1,3 already run jobs {job.id}, {other.id}; wait for them "
                                                "or kill them first"):
            sched.start_job([1, 2, 3], lambda api: None)
    finally:
        release.set()
    assert job.future.result(5).ok and other.future.result(5).ok


def test_a_job_whose_statistics_fail_still_reports_its_results():
    broken = Scheduler(SRAM(2, 64 * 1024), 2, exchange_out=2048, exchange_in=4096, cost_model=object())
    broken.start()
    try:
        assert values(broken.start_job([0, 1], lambda api: api.tileid).future.result(5)) == [0, 1]
        assert any("statistics failed" in error for error in broken.internal_errors)
    finally:
        broken.stop()


def test_idle_tiles_are_never_woken():
    fresh = Scheduler(SRAM(NTILES, 64 * 1024), NTILES, exchange_out=2048, exchange_in=4096)
    fresh.start()
    try:
        assert not any(t.glet for t in fresh.tiles)  # nothing has run yet
        job = fresh.start_job([0, 1], lambda api: [api.sync() for _ in range(10)])
        assert job.future.result(5).ok
        assert fresh.superstep >= 10
        assert [t.id for t in fresh.tiles if t.glet] == [0, 1]
    finally:
        fresh.stop()


def test_a_thousand_fresh_tiles_start_and_run_one_job():
    # a parking tile resumes the next runnable one itself (see Tile.start); a greenlet
    # first switched to from inside another tile would begin on that tile's stack, and
    # a thousand of them would nest a thousand deep
    ntiles = 1024
    fresh = Scheduler(SRAM(ntiles, 64 * 1024), ntiles, exchange_out=2048, exchange_in=4096)
    fresh.start()
    try:
        def prog(api):
            for _ in range(3):
                api.sync()
            return api.allreduce(api.tileid)

        assert values(fresh.start_job(range(ntiles), prog).future.result(30)) == [ntiles * (ntiles - 1) // 2] * ntiles
        assert fresh.internal_errors == []
    finally:
        fresh.stop()


def test_host_requests_run_on_the_owning_tiles_greenlet(sched):
    seen = {}

    def whoami(tile, tag):
        seen[tag] = (tile.id, greenlet.getcurrent() is tile.glet)
        return tag * 2

    sched.services["test.whoami"] = whoami
    futures = [sched.submit(t, "test.whoami", t) for t in range(NTILES)]
    assert [f.result(5) for f in futures] == [2 * t for t in range(NTILES)]
    assert seen == {t: (t, True) for t in range(NTILES)}


def test_a_request_submitted_to_all_tiles_is_served_by_each_in_one_superstep(sched):
    seen = {}

    def whoami(tile, tag):
        seen[tile.id] = (sched.superstep, greenlet.getcurrent() is tile.glet)
        return (tile.id, tag)

    sched.services["test.whoami"] = whoami
    futures = sched.submit_all([*range(NTILES), 99], "test.whoami", "hi")
    assert list(futures) == [*range(NTILES), 99]
    assert [futures[t].result(5) for t in range(NTILES)] == [(t, "hi") for t in range(NTILES)]
    with pytest.raises(IndexError, match="no tile 99"):  # refused alone: the others were served
        futures[99].result(5)
    assert len({step for step, _ in seen.values()}) == 1
    assert all(on_own_greenlet for _, on_own_greenlet in seen.values())


def test_submitting_to_a_stopped_scheduler_is_refused_at_once():
    stopped = Scheduler(SRAM(4, 64 * 1024), 4, exchange_out=2048, exchange_in=4096)
    stopped.start()
    stopped.stop()
    with pytest.raises(RuntimeError, match="has been shut down and runs nothing more: start a new one"):
        stopped.submit(0, "test.whoami", 1)
    with pytest.raises(RuntimeError, match="has been shut down"):
        stopped.submit_all(range(4), "test.whoami", 1)
    never_started = Scheduler(SRAM(4, 64 * 1024), 4, exchange_out=2048, exchange_in=4096)
    with pytest.raises(RuntimeError, match="not running: it has not been started"):
        never_started.submit(0, "test.whoami", 1)


def test_a_request_that_came_during_a_file_operation_is_served_at_the_next_sync(sched):
    # its wake is spent while the tile cannot serve (inside a filesystem operation); the
    # tile's next sync must serve it, not park with it pending: here, as in a backup's
    # freeze, the other tile waits for what the request does, not at the barrier
    served = threading.Event()
    sched.services["test.mark"] = lambda tile: (served.set(), sched.wake(sched.tiles[1]))

    def prog(api):
        tile = api.tile
        if api.tileid == 1:
            tile.wait(served.is_set, "waiting for the mark")
            api.sync()
            return "marked"
        tile.fs_depth += 1  # as inside a filesystem operation
        sched.submit(tile.id, "test.mark")  # (its arrival wakes the tile, which cannot serve it)
        start = sched.superstep
        tile.wait(lambda: sched.superstep > start, "a file operation")
        tile.fs_depth -= 1
        api.sync()
        return "served"

    assert values(run(sched, prog, tiles=[0, 1])) == ["served", "marked"]


def test_host_request_errors_come_back_as_exceptions(sched):
    with pytest.raises(LookupError, match="no kernel service 'no.such'"):
        sched.submit(3, "no.such").result(5)
    with pytest.raises(IndexError, match="no tile 99"):
        sched.submit(99, "test.whoami", 1).result(5)


def test_an_abort_that_reaches_a_request_still_stops_the_job(sched):
    """Tile 0 waits in sync() and serves a request that itself waits (on tile 2) when tile
    1 fails: the request, which has nothing to do with the job, completes; then tile 0's
    program stops all the same."""
    sched.services["test.noop"] = lambda tile: None
    serving = []

    def slow(tile):
        serving.append(tile.job is not None)
        for _ in range(200):
            sched.call_tile(tile, 2, "test.noop")
        return "done"

    sched.services["test.slow"] = slow

    def prog(api):
        if api.tileid == 0:
            api.sync()
            return "carried on"
        while not serving:  # superstep after superstep until tile 0 serves the request
            api.send(1, 0)
            api.recv(1)
        raise ZeroDivisionError("boom")

    job = sched.start_job([0, 1], prog)
    request = sched.submit(0, "test.slow")
    report = job.future.result(20)
    assert serving == [True]  # inside the job's sync()
    assert [r.status for r in report.results] == [ABORTED, ERROR]
    assert request.result(20) == "done"


def test_a_request_served_inside_recv_is_not_a_deadlock(sched):
    """Tile 0 waits in recv and meanwhile serves a request that waits on tile 2: its
    partner waits in recv too, but the request is under way, so no deadlock is reported
    (it was, and the unrelated request failed with the job's DeadlockError)."""
    sched.services["test.noop"] = lambda tile: None

    def slow(tile):
        for _ in range(30):
            sched.call_tile(tile, 2, "test.noop")
        return "done"

    sched.services["test.slow"] = slow

    def prog(api):
        other = 1 - api.tileid
        for i in range(300):
            api.send(other, i)
            assert api.recv(other) == i
        return "ok"

    job = sched.start_job([0, 1], prog)
    requests = [sched.submit(0, "test.slow") for _ in range(10)]
    report = job.future.result(30)
    assert [r.status for r in report.results] == [OK, OK], [str(r.error) for r in report.results]
    assert [r.result(30) for r in requests] == ["done"] * 10


def test_tile_to_tile_kernel_calls_ride_the_exchange(sched):
    sched.services["test.add"] = lambda tile, a, b: (tile.id, a + b)

    def prog(api):
        other = (api.physical_tile + 1) % NTILES
        before = api.job.sched.superstep
        result = api.job.sched.call_tile(api.tile, other, "test.add", api.tileid, 100)
        return result, api.job.sched.superstep - before

    for rank, ((served_by, total), steps) in enumerate(values(run(sched, prog, tiles=[0, 1]))):
        assert served_by == (rank + 1) % NTILES and total == rank + 100
        assert steps >= 2  # a request and a reply: at least two exchanges


def test_requests_are_served_while_the_owner_waits_in_a_job(sched):
    release = threading.Event()
    sched.services["test.ping"] = lambda tile: ("pong", tile.job is not None)

    def prog(api):
        while not release.is_set():
            api.sync()

    job = sched.start_job([4, 5], prog)
    try:
        assert sched.submit(4, "test.ping").result(5) == ("pong", True)
    finally:
        release.set()
    assert job.future.result(5).ok


def test_same_program_same_supersteps(sched):
    def prog(api):
        for i in range(api.tileid):
            api.send((api.tileid + 1) % api.numtiles, i)
        api.sync()
        got = []
        while api.poll((api.tileid - 1) % api.numtiles):
            got.append(api.recv((api.tileid - 1) % api.numtiles))
        return got, api.alltoall(len(got))

    first, second = run(sched, prog), run(sched, prog)
    assert values(first) == values(second)
    assert first.stats.supersteps == second.stats.supersteps


def test_many_kernel_calls_ride_one_exchange(sched):
    sched.services["test.square"] = lambda tile, x: x * x if x != 3 else 1 / 0

    def prog(api):
        scheduler = api.job.sched
        before = scheduler.superstep
        results = scheduler.call_tiles(api.tile, [(t, "test.square", (t,)) for t in range(1, NTILES)])
        return results, scheduler.superstep - before

    results, supersteps = values(run(sched, prog, tiles=[0]))[0]
    assert [value for ok, value in results if ok] == [t * t for t in range(1, NTILES) if t != 3]
    assert isinstance(results[2][1], ZeroDivisionError)
    assert supersteps <= 3  # requests out together, replies back together


def test_the_watchdog_never_interrupts_a_weakref_callback():
    """The garbage collector runs weakref callbacks from inside whatever allocates, a tile
    program included: an interrupt landing there is printed as 'ignored' and lost."""
    from types import SimpleNamespace

    from ipuos.scheduler._watchdog import TILE_GLOBALS_MARKER, _safe_to_interrupt

    def frame(filename, back=None, **globals_):
        code = compile("pass", filename, "exec")
        return SimpleNamespace(f_code=code, f_back=back, f_globals=globals_)

    program = frame("<program>", **{TILE_GLOBALS_MARKER: True})
    assert _safe_to_interrupt(program)
    for library in ("/usr/lib/python3/_weakrefset.py", "/usr/lib/python3/weakref.py"):
        assert not _safe_to_interrupt(frame(library, back=program, __name__="_weakrefset"))


def test_a_tile_at_the_nesting_cap_still_starts_its_part_of_the_job_it_waits_for(sched):
    """Tile 0 serves a request inside the wait of another, up to MAX_SERVICE_DEPTH deep
    (the shell serving many repl sessions does). A request at the cap that starts a job
    on tiles including tile 0 and waits for it needs tile 0 to start its own part: it
    waited for itself for ever, and its sessions with it."""
    from ipuos.scheduler._tile import MAX_SERVICE_DEPTH

    released = threading.Event()

    def hold(tile):
        tile.wait(released.is_set, "the test's release")
        return tile.service_depth

    def start_and_wait(tile):
        job = sched._start_job([0, 1], lambda api: api.sync() or api.tileid, "nested", None)
        return tile.service_depth, [r.value for r in sched.wait_job(tile, job).results]

    sched.services["test.hold"] = hold
    sched.services["test.start_and_wait"] = start_and_wait
    held = [sched.submit(0, "test.hold") for _ in range(MAX_SERVICE_DEPTH - 1)]
    deepest = sched.submit(0, "test.start_and_wait")
    try:
        assert deepest.result(10) == (MAX_SERVICE_DEPTH, [0, 1])
    finally:
        released.set()
        sched.call_wait(sched.wake, sched.tiles[0])
    assert sorted(future.result(10) for future in held) == list(range(1, MAX_SERVICE_DEPTH))


@pytest.mark.parametrize("then", ["sync", "compute", "return"])
def test_a_caught_compute_budget_still_ends_the_job_on_every_tile_saying_why(sched, then):
    # whether, and how, the job stops must not hang on what the tile that caught the
    # budget's exception does next: exchange at once, compute on (the watchdog stops it
    # again), or end without another exchange
    caught = []

    def prog(api):
        if api.tileid == 1:
            try:
                while True:
                    pass
            except ComputeBudgetExceeded as exc:
                caught.append(str(exc))
            if then == "compute":
                deadline = time.monotonic() + 0.5
                while time.monotonic() < deadline:
                    pass
            elif then == "return":
                return "ended"
        api.sync()
        return "done"

    report = run(sched, prog, tiles=[0, 1, 2, 3], budget=0.3)
    assert caught == ["computed for longer than the job's compute budget without reaching an exchange point"]
    said = "tile 1 computed for more than 0.3 s without reaching an exchange point"
    statuses = [r.status for r in report.results]
    # caught, the budget's exception is the job's stop for that tile: its program has a
    # second of grace to clean up (the sync, the compute), and ends with the budget's error
    assert statuses == [ABORTED, ERROR, ABORTED, ABORTED]
    assert type(report.results[1].error) is ComputeBudgetExceeded and str(report.results[1].error) == said
    assert {str(r.error) for r in report.results if r.rank != 1} <= {
        said, f"job {report.job_id} stopped: tile 1 failed with ComputeBudgetExceeded: {said}"}


def test_a_ctrl_c_the_watchdog_raises_in_a_computing_tile_says_what_it_is(sched):
    # a tile in pure compute gets it from the watchdog, which can inject only a class: a
    # handler (or a __del__'s "Exception ignored") showed an empty message
    seen = []

    def prog(api):
        try:
            while True:
                pass
        except KeyboardInterrupt as exc:
            seen.append(str(exc))

    job = sched.start_job([0], prog)
    time.sleep(0.2)
    sched.interrupt_job(job, "interrupted (Ctrl-C)", ctrl_c=True)
    job.future.result(10)
    assert seen == ["interrupted (Ctrl-C)"]


# -- the watchdog looks often only while that helps a Ctrl-C on (Watchdog.hurry) --------


def test_a_tile_computing_on_after_its_ctrl_c_lets_the_watchdog_calm(sched):
    """Tile 0 catches its Ctrl-C and computes on; tile 1, still to run, cannot take its
    own until tile 0 lets go of the thread. Looking every 0.1 ms cannot hasten that,
    and it held the process at the hurried switch interval (the computing tile 13-30%
    slower) for as long as tile 0 ran."""
    normal = sys.getswitchinterval()
    entered, caught = [], []

    def prog(api):
        entered.append(api.tileid)
        try:
            while True:
                pass
        except KeyboardInterrupt:
            caught.append(api.tileid)
            while True:
                pass

    job = sched.start_job(range(2), prog)
    wait_for(lambda: entered == [0] and sched.computing_tile() is sched.tiles[0], what="tile 0 computing")
    sched.interrupt_job(job, "interrupted (Ctrl-C)", ctrl_c=True)
    try:
        wait_for(lambda: caught == [0], what="tile 0 to catch it")
        wait_for(lambda: sys.getswitchinterval() == normal, what="the watchdog to calm")
    finally:
        sched.interrupt_job(job, "the test is over")
    report = job.future.result(10)
    assert [r.status for r in report.results] == [INTERRUPTED] * 2
    assert sys.getswitchinterval() == normal


def test_a_ctrl_c_waiting_behind_another_jobs_compute_lets_the_watchdog_calm_and_still_lands(sched):
    """Job B waits in sync() when its Ctrl-C comes; job A's tile computes, with no Ctrl-C
    of its own, and holds the thread that hands B its Ctrl-C. The watchdog calms while
    A computes, and hurries again when it lets go: B's handler still runs."""
    normal = sys.getswitchinterval()
    entered, handled = [], []

    def a(api):
        entered.append("a")
        while True:
            pass

    def b(api):
        entered.append("b")
        try:
            while True:
                api.sync()
        except KeyboardInterrupt:
            handled.append("b")

    job_b = sched.start_job([1], b)
    wait_for(lambda: "b" in entered, what="job B to run")
    job_a = sched.start_job([0], a)
    wait_for(lambda: sched.computing_tile() is sched.tiles[0], what="job A computing")
    sched.interrupt_job(job_b, "interrupted (Ctrl-C)", ctrl_c=True)
    try:
        wait_for(lambda: sys.getswitchinterval() == normal and not sched.watchdog.hurried,
                 what="the watchdog to calm")
        assert not handled
    finally:
        sched.interrupt_job(job_a, "the test is over")
    assert job_b.future.result(10).ok and handled == ["b"]
    job_a.future.result(10)


def test_a_hurry_asked_for_as_the_watchdog_calms_stands(sched):
    """The watchdog decides to calm, and a Ctrl-C asks it to hurry before it does: the
    calm, decided on what was due before, must not undo the hurry (each tile of the
    new Ctrl-C would wait for a 10 ms tick)."""
    dog = sched.watchdog
    before = dog._hurries
    dog.hurry()
    dog._calm(before)  # (what _run does with what it read before its look)
    assert dog.hurried
    dog._calm(dog._hurries)
    assert not dog.hurried


def test_a_hurry_after_the_scheduler_stopped_leaves_the_switch_interval_alone():
    """A host thread's Ctrl-C that raced the machine's stop reached the watchdog after
    its thread had ended: nothing was left to undo the hurried switch interval, which
    stayed the process's for good."""
    normal = sys.getswitchinterval()
    scheduler = Scheduler(SRAM(2, 64 * 1024), tiles_per_chip=2, exchange_out=2048, exchange_in=4096)
    scheduler.start()
    job = scheduler.start_job([0], lambda api: None)
    job.future.result(10)
    scheduler.stop()
    scheduler.watchdog.interrupt(job, TileKeyboardInterrupt)
    assert sys.getswitchinterval() == normal
    assert not scheduler.watchdog.hurried
