"""The exchange engine: moves bytes between tiles' SRAM once per superstep.

During the compute phase tiles only *post* transfers (their payload is already in their
own outgoing exchange buffer, or in any region for remote memory access). The exchange
phase then moves everything posted in that superstep with a few numpy operations:

* many small segments are copied with one fancy-indexed copy of 64-bit words (a Python
  copy per message costs ~0.4 s for a 1472-tile alltoall; this costs milliseconds);
* a few large segments (block-device traffic) are copied one slice each, because their
  index arrays would be bigger than the data itself;
* one payload landing on many tiles (bcast, alltoall) is a single 2-D broadcast copy;
  a large one runs on a second thread while the tiles compute (numpy releases the GIL
  while copying), and :meth:`ExchangeEngine.settle` waits for it before anything reads or
  writes SRAM through the exchange again. Tiles decode a broadcast from the exchange's
  staging copy, which is byte-identical to what lands in their SRAM.

Offsets and lengths are multiples of 8 so that words can be copied.
"""

from __future__ import annotations

import collections
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ipuos._affinity import unpin_thread
from ipuos._plural import plural

from ._errors import TileFailed

#: below this mean segment size, segments are copied with one fancy-indexed copy
_FANCY_BELOW = 512
#: broadcasts bigger than this are split over the copy threads
_THREADED_ABOVE = 4 << 20
#: the GIL switch interval while a broadcast lands in the background (see _Landing)
_LANDING_SWITCH_INTERVAL = 1e-4


# what a point-to-point payload is
KIND_USER = 0  # a tile program's send()
KIND_REQUEST = 1  # a kernel request to another tile
KIND_REPLY = 2  # the reply to one


def pad8(n: int) -> int:
    return (n + 7) & ~7


class Message:
    """A payload that landed in a tile's incoming buffer and has not been consumed yet."""

    __slots__ = ("off", "length", "src_rank")

    def __init__(self, off: int, length: int, src_rank: int):
        self.off = off  # inside the receiving tile's incoming exchange buffer
        self.length = length
        self.src_rank = src_rank


class LostMessage(Message):
    """A collective's own message (a reduction's part, a scatter's item) that could not
    land: the receiver's incoming buffer was full. It takes no room, and receiving it
    raises ``error``: a reduction then fails on every tile (see ``TileAPI._recv_part``)
    instead of waiting for the part, or going on without it; a scatter on the tile
    whose item it was (the others have theirs; nothing is left to put them out of step)."""

    __slots__ = ("error",)

    def __init__(self, error: Exception):
        super().__init__(-1, 0, -1)
        self.error = error


class ExchangeEngine:
    def __init__(self, sram, ntiles: int, tiles_per_chip: int, cost_model):
        self.sram = sram
        self.words = sram.words
        self.flat = sram.flat
        self.view = sram.view
        self.ntiles = ntiles
        self.tiles_per_chip = tiles_per_chip
        self.cost = cost_model
        # posted this superstep: point-to-point payloads in the senders' out buffers
        self._p2p: list[tuple] = []  # (src_tile, dst_tile, abs_off, length, kind, meta)
        # posted remote-memory transfers: (tile, remote_tile, src_abs, dst_abs, nbytes, done)
        self._dma: list[tuple] = []
        self._senders: list = []
        #: tiles whose replies do not fit beside their held parts (see make_room)
        self._short_of_room: set = set()
        # statistics
        self.bytes_out = np.zeros(ntiles, dtype=np.int64)
        self.bytes_in = np.zeros(ntiles, dtype=np.int64)
        self.sim_cycles = 0.0
        self.supersteps_with_traffic = 0
        # this superstep's traffic: bytes per tile out, in, and across chips (IPU-Links,
        # either way); a collective's by the job it belongs to, as (busiest tile, busiest
        # link user), computed whole (see count_broadcast)
        self._step_out: dict[int, int] = {}
        self._step_in: dict[int, int] = {}
        self._step_link: dict[int, int] = {}
        self._step_collective: dict[object, tuple[int, int]] = {}
        self._pool: ThreadPoolExecutor | None = None
        #: ids of the tiles that do not answer (the scheduler's ``fail_tile``)
        self.failed_tiles: set[int] = set()
        self._landing = None  # a broadcast still being copied on the second core
        self._pool_lock = threading.Lock()

    # -- posting (compute phase, on tile greenlets) --------------------------------------

    def write_out(self, tile, payload: bytes) -> int:
        """Copy ``payload`` into ``tile``'s outgoing buffer; returns its absolute offset.

        ValueError on the tile if the payload does not fit in what is left of the buffer
        this superstep: a payload never overruns into other regions.
        """
        n = len(payload)
        need = (n + 7) & ~7  # pad8, inlined: once per tile per collective
        used = tile.out_used
        if used + need > tile.xout.size:
            # (no tile id: every tile sending too much says the same, and its output
            # groups as one; the report names the tiles)
            if need > tile.xout.size:  # (no superstep would take it whole)
                advice = "it can never go in one piece: send it in smaller parts"
            else:
                advice = "send less per superstep or sync() between sends"
            raise ValueError(
                f"exchange payload of {n} B does not fit in the outgoing buffer "
                f"({tile.xout.size - used} B of {tile.xout.size} B left this superstep); {advice}"
            )
        if used == 0:
            self._senders.append(tile)
        off = tile.xout.base + used
        self.view[off : off + n] = payload
        tile.out_used = used + need
        return off

    def post(self, src_tile, dst_tile, abs_off: int, length: int, kind: int, meta) -> None:
        self._p2p.append((src_tile, dst_tile, abs_off, length, kind, meta))

    def post_dma(self, tile, transfers, done) -> None:
        """Copy SRAM ranges at the next exchange: ``transfers`` are ``(remote_tile, src_abs,
        dst_abs, nbytes)`` between any two offsets of the flat SRAM.

        ``remote_tile`` is the tile on the far side. If any of them has failed, none of
        the batch is copied; then ``done(error)`` is called in the exchange phase with None
        or a TileFailed naming one. One entry per batch, not per transfer: a chip-disk miss moves a
        cluster of blocks, and the per-transfer bookkeeping was most of what it cost.
        """
        self._dma.append((tile, transfers, done))

    def has_posted(self) -> bool:
        return bool(self._p2p or self._dma)

    # -- the exchange phase (scheduler thread) -----------------------------------------

    def deliver_p2p(self, land) -> None:
        """Copy every posted message into its receiver's incoming arena.

        Then ``land(dst_tile, arrivals)`` is called per receiver, in posting order, with
        tuples ``(kind, meta, src_tile, abs_off, length, message)``: ``abs_off`` is where
        the payload's bytes are now, ``message`` the arena slot (None if it did not land).
        """
        posted, self._p2p = self._p2p, []
        if not posted:
            return
        by_dst: dict = {}
        for item in posted:
            dst = item[1]
            if item[4] == KIND_USER and item[5][0] is not dst.job:
                # the receiver has finished (or runs another job now): nobody will recv it,
                # and it must take no room in what is now someone else's buffer
                item[5][0].stats.dropped_messages += 1
                continue
            by_dst.setdefault(dst, []).append(item)
        src_offs, dst_offs, lens = [], [], []
        deliveries = []
        for dst, items in by_dst.items():
            incoming = sum(pad8(it[3]) for it in items)
            if dst.in_used + incoming > dst.xin.size:
                self.compact(dst)
            # kernel traffic is handled as it lands, so when room is short it is read
            # where its sender wrote it; only user messages must fit (they wait for recv)
            kernel_in_place = dst.in_used + incoming > dst.xin.size
            arrivals = []
            if kernel_in_place:
                user = [it for it in items if it[4] == KIND_USER]
                if dst.in_used + sum(pad8(it[3]) for it in user) > dst.xin.size:
                    landing, lost = _make_room(dst, user, incoming)
                    arrivals.extend((KIND_USER, it[5], it[0], 0, 0, marker) for it, marker in lost)
                    landing = set(map(id, landing))
                    items = [it for it in items if it[4] != KIND_USER or id(it) in landing]
            cursor = dst.in_used
            base = dst.xin.base
            for src, _, abs_off, length, kind, meta in items:
                padded = pad8(length)
                self._count(src.id, dst.id, padded)
                if kernel_in_place and kind != KIND_USER:
                    arrivals.append((kind, meta, src, abs_off, length, None))
                    continue
                src_offs.append(abs_off)
                dst_offs.append(base + cursor)
                lens.append(padded)
                arrivals.append((kind, meta, src, base + cursor, length, Message(cursor, length, -1)))
                cursor += padded
            dst.in_used = cursor
            deliveries.append((dst, arrivals))
        self.copy_segments(src_offs, dst_offs, lens)
        for dst, arrivals in deliveries:
            land(dst, arrivals)

    def deliver_dma(self) -> None:
        """Carry out every posted remote-memory transfer.

        One pass per transfer that copies and counts at once: a chip-disk read-ahead is
        dozens of page copies, and separate passes (collect, copy, count) cost more
        than the copies."""
        posted, self._dma = self._dma, []
        if not posted:
            return
        view = self.view
        per_tile = self.sram.bytes_per_tile
        count = self._count
        done = []
        for _tile, transfers, callback in posted:
            if self.failed_tiles:
                # a batch is all or nothing: a chip-disk write-back that reached some tiles
                # and not others would leave littlefs' metadata there without its data
                dead = next((remote for remote, *_ in transfers if not remote.alive), None)
                if dead is not None:
                    done.append((callback, TileFailed(5, f"tile {dead.id} is not answering (it has failed)")))
                    continue
            for remote, src, dst, nbytes in transfers:
                view[dst : dst + nbytes] = view[src : src + nbytes]
                count(src // per_tile, dst // per_tile, nbytes)
            done.append((callback, None))
        for callback, error in done:
            callback(error)

    def copy_segments(self, src_offs, dst_offs, lens) -> None:
        """Copy segments ``src -> dst`` of the flat SRAM, vectorised (see module doc).
        Offsets and lengths are multiples of 8."""
        count = len(lens)
        if count == 0:
            return
        if count == 1 or sum(lens) >= _FANCY_BELOW * count:
            flat = self.flat
            for s, d, n in zip(src_offs, dst_offs, lens):
                flat[d : d + n] = flat[s : s + n]
            return
        src = np.asarray(src_offs, dtype=np.int64) >> 3
        dst = np.asarray(dst_offs, dtype=np.int64) >> 3
        words = np.asarray(lens, dtype=np.int64) >> 3
        total = int(words.sum())
        starts = np.cumsum(words) - words
        within = np.arange(total, dtype=np.int64) - np.repeat(starts, words)
        self.words[np.repeat(dst, words) + within] = self.words[np.repeat(src, words) + within]

    def gather(self, offs, padded: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Concatenate SRAM segments at ``offs`` (lengths ``padded``, multiples of 8) into
        one new array, segment i starting at ``positions[i]``."""
        total = int(padded.sum())
        out = np.empty(total, dtype=np.uint8)
        count = len(padded)
        if count > 1 and total < _FANCY_BELOW * count:
            words = padded >> 3
            src = np.asarray(offs, dtype=np.int64) >> 3
            within = np.arange(total >> 3, dtype=np.int64) - np.repeat(positions >> 3, words)
            out.view(np.uint64)[:] = self.words[np.repeat(src, words) + within]
        else:
            flat = self.flat
            for off, start, n in zip(offs, positions.tolist(), padded.tolist()):
                out[start : start + n] = flat[off : off + n]
        return out

    def broadcast(self, data: np.ndarray, tile_ids, offset_in_tile: int) -> None:
        """Write ``data`` at the same offset in the SRAM of every tile in ``tile_ids``."""
        n = len(data)
        if n == 0 or not len(tile_ids):
            return
        if n % 8 == 0 and offset_in_tile % 8 == 0:  # whole words copy faster
            grid = self.words.reshape(self.ntiles, self.sram.bytes_per_tile // 8)
            data = data.view(np.uint64)
            cols = slice(offset_in_tile // 8, offset_in_tile // 8 + len(data))
        else:
            grid = self.flat.reshape(self.ntiles, self.sram.bytes_per_tile)
            cols = slice(offset_in_tile, offset_in_tile + n)
        lo, hi = tile_ids[0], tile_ids[-1]
        if hi - lo + 1 != len(tile_ids):
            grid[np.asarray(tile_ids), cols] = data
        elif n * len(tile_ids) < _THREADED_ABOVE:
            grid[lo : hi + 1, cols] = data
        else:
            # numpy releases the GIL while copying: the second core lands the bytes while
            # the tiles compute, and settle() finishes the job from the other end before
            # SRAM is touched again
            self.settle()
            landing = _Landing(grid, lo, hi + 1, cols, data)
            landing.future = self._copy_pool().submit(landing.copy_from_front)
            self._landing = landing
            switch_often.enter()

    def settle(self) -> None:
        """Make sure every byte of earlier exchanges has landed in SRAM."""
        landing = self._landing
        if landing is not None:
            self._landing = None
            try:
                landing.copy_from_back()  # help rather than wait: both cores copy
                landing.future.result()
            finally:
                switch_often.leave()

    def _copy_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="ipuos-exchange-copy",
                                                initializer=unpin_thread)
            return self._pool

    # -- statistics ----------------------------------------------------------------------

    def _count(self, src: int, dst: int, nbytes: int) -> None:
        self._step_out[src] = self._step_out.get(src, 0) + nbytes
        self._step_in[dst] = self._step_in.get(dst, 0) + nbytes
        if src // self.tiles_per_chip != dst // self.tiles_per_chip:
            link = self._step_link  # (the sender's link and the receiver's both carry it)
            link[src] = link.get(src, 0) + nbytes
            link[dst] = link.get(dst, 0) + nbytes

    def count_broadcast(self, src_ids, src_lens, dst_ids, nbytes_each: int, owner) -> None:
        """Account a collective of job ``owner``: each source sends its bytes, every
        receiver gets ``nbytes_each`` (the sources' total). What crosses chips is what a
        receiver gets from sources on other chips, and what a source sends to each other
        chip that has receivers."""
        src_lens = np.asarray(src_lens, dtype=np.int64)
        np.add.at(self.bytes_out, src_ids, src_lens)
        self.bytes_in[dst_ids] += nbytes_each
        busiest = max(nbytes_each, int(src_lens.max(initial=0)))
        link = 0
        if owner.nchips > 1:
            src_chips = np.asarray(src_ids, dtype=np.int64) // self.tiles_per_chip
            dst_chips = np.unique(np.asarray(dst_ids, dtype=np.int64) // self.tiles_per_chip)
            nchips = int(max(src_chips.max(), dst_chips.max())) + 1
            from_chip = np.bincount(src_chips, weights=src_lens, minlength=nchips)
            link = int(nbytes_each - from_chip[dst_chips].min())  # into the worst-placed receiver
            # out of the busiest source of each chip, once per other chip with receivers
            biggest = np.zeros(nchips, dtype=np.int64)
            np.maximum.at(biggest, src_chips, src_lens)
            other_chips = len(dst_chips) - np.isin(np.arange(nchips), dst_chips)
            link = max(link, int((biggest * other_chips).max()))
        before = self._step_collective.get(owner)
        if before is not None:
            busiest, link = max(busiest, before[0]), max(link, before[1])
        self._step_collective[owner] = (busiest, link)

    def end_superstep(self, chips_active: int, jobs, tiles) -> None:
        """Fold this superstep's traffic into the totals and the simulated clocks: the
        machine's (its sync spans the chips any job uses), and each of ``jobs``', which
        pays for its own sync and the traffic of its own tiles only (``tiles``: the
        scheduler's, by id, each knowing the job it runs)."""
        cost = self.cost
        for job in jobs:
            job.sim_cycles += cost.sync(job.nchips)
        cycles = cost.sync(chips_active)
        if not (self._step_out or self._step_in or self._step_collective):
            self.sim_cycles += cycles
            return
        self.supersteps_with_traffic += 1
        busiest = link = 0
        by_job: dict = {}
        for owner, (owner_busiest, owner_link) in self._step_collective.items():
            busiest, link = max(busiest, owner_busiest), max(link, owner_link)
            by_job[owner] = [owner_busiest, owner_link]
        for counts, total, slot in ((self._step_out, self.bytes_out, 0), (self._step_in, self.bytes_in, 0),
                                    (self._step_link, None, 1)):
            for tile, n in counts.items():
                if total is not None:
                    total[tile] += n
                if slot:
                    link = max(link, n)
                else:
                    busiest = max(busiest, n)
                job = tiles[tile].job
                if job is not None:
                    figures = by_job.setdefault(job, [0, 0])
                    figures[slot] = max(figures[slot], n)
        for job, (job_busiest, job_link) in by_job.items():
            job.sim_cycles += cost.exchange(job_busiest, job_link)
        self.sim_cycles += cycles + cost.exchange(busiest, link)
        self._step_out.clear()
        self._step_in.clear()
        self._step_link.clear()
        self._step_collective.clear()

    def make_room(self, tile) -> None:
        """``tile`` has a reply that does not fit in its outgoing buffer this superstep:
        if its part of a collective still in progress takes the room, set the part aside
        (keep it with its job until the collective completes) when the buffer is reset."""
        self._short_of_room.add(tile)

    def give_back_part(self, tile, job) -> None:
        """``tile`` has left the collective in progress by an exception: its part is no
        longer held, and its room is free at once if nothing was written after it."""
        if tile.out_held is not job.coll_token:
            return
        tile.out_held = None
        off, size = job.coll_off[tile.rank], pad8(job.coll_len[tile.rank])
        if off >= 0 and tile.out_used == off + size - tile.xout.base:
            tile.out_used = off - tile.xout.base

    def reset_out_buffers(self) -> None:
        """Free the outgoing buffers for the next superstep, all but each waiting tile's
        part of a collective still in progress: it is read when the last tile arrives,
        and meanwhile the tile may serve requests whose replies go out after it. Such a
        part moves to the front of the buffer (what was before it has been delivered);
        a tile short of room for a reply (see make_room) has its part set aside."""
        short = self._short_of_room
        if short:
            self._short_of_room = set()
        kept = []
        for tile in self._senders:
            job = tile.job
            if job is not None and job.arrived and tile.out_held is job.coll_token:
                if tile in short:
                    self._set_aside(tile, job)
                    tile.out_used = 0
                    continue
                tile.out_used = self._to_front(tile, job)
                kept.append(tile)
            else:
                tile.out_used = 0
        self._senders = kept

    def _to_front(self, tile, job) -> int:
        """Move ``tile``'s held part to the start of its outgoing buffer; its padded size."""
        rank = tile.rank
        off, size, base = job.coll_off[rank], job.coll_len[rank], tile.xout.base
        if off != base:
            self.view[base : base + size] = self.view[off : off + size]
            job.coll_off[rank] = base
        return pad8(size)

    def _set_aside(self, tile, job) -> None:
        rank = tile.rank
        off = job.coll_off[rank]
        job.coll_set_aside[rank] = bytes(self.view[off : off + job.coll_len[rank]])
        job.coll_off[rank] = -1  # (see _collectives._move_payloads)
        tile.out_held = None

    def compact(self, tile) -> None:
        """Make the room received messages took in ``tile``'s incoming buffer free again:
        what is still unreceived moves to the front."""
        live = [m for m in tile.in_msgs if m.off >= 0]
        live.sort(key=lambda m: m.off)
        cursor = 0
        base = tile.xin.base
        flat = self.flat
        for msg in live:
            if msg.off != cursor:
                n = pad8(msg.length)
                flat[base + cursor : base + cursor + n] = flat[base + msg.off : base + msg.off + n].copy()
                msg.off = cursor
            cursor += pad8(msg.length)
        tile.in_msgs = live
        tile.in_used = cursor

    def close(self) -> None:
        self.settle()
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def _make_room(dst, user: list, incoming: int) -> tuple[list, list]:
    """Of the user messages ``user`` arriving at ``dst``, whose incoming buffer cannot take
    them all: (those that land, [(message, LostMessage)] for collectives' parts that do not).

    A collective's own messages go first: its tiles receive them within the collective,
    and one lost would leave the tiles out of step. If even they do not fit, each becomes
    a LostMessage, and the collective fails on every tile. Program messages that do not
    fit are dropped (see _drop_overflow)."""
    parts = [it for it in user if type(it[5][2]) is tuple]  # (program messages are filed under ranks)
    program = [it for it in user if type(it[5][2]) is not tuple]
    room = dst.xin.size - dst.in_used
    lost = []
    parts_size = sum(pad8(it[3]) for it in parts)
    if parts_size <= room:
        room -= parts_size
    else:
        why = (f"incoming exchange buffer full ({dst.in_used} B of unreceived "
               f"messages + {incoming} B arriving > {dst.xin.size} B): a collective's part from "
               f"{dst.job.describe(sorted({it[5][1] for it in parts}))} could not land; recv() pending "
               "messages before a collective")
        lost = [(it, LostMessage(ValueError(why))) for it in parts]  # (each raised once: its own)
        parts = []
    if sum(pad8(it[3]) for it in program) > room:
        _drop_overflow(dst, program, incoming)
        program = []
    return parts + program, lost


def _drop_overflow(dst, user: list, incoming: int) -> None:
    """Drop the program messages ``user`` arriving at ``dst``, whose incoming buffer cannot
    take them, and fail the receiver and every sender still running at its next exchange
    point, each saying what was lost: a program that caught the error and carried on
    unaware would run with a hole in its stream of messages. (The job counts them as
    dropped.)"""
    job = dst.job
    by_sender: dict = {}  # (by rank: a sender that has finished has left its job's ranks)
    for it in user:
        it[5][0].stats.dropped_messages += 1
        by_sender.setdefault(it[5][1], []).append(it)
    lost = f"{plural(len(user), 'message')} ({sum(it[3] for it in user)} B)"
    room = f"{dst.in_used} B of unreceived messages + {incoming} B arriving > {dst.xin.size} B"
    receiver = job.describe([dst.rank])
    if dst.in_used:
        advice, senders_advice = "recv() pending messages before more are sent", "it must recv() pending messages before more are sent"
    else:  # (nothing was waiting: the one exchange brought more than the buffer holds)
        advice = senders_advice = "send it fewer bytes per superstep (sync() between sends)"
    if dst.signal is None:
        senders = job.describe(sorted(by_sender))
        dst.signal = ValueError(
            f"{receiver}: incoming exchange buffer full ({room}): {lost} from {senders} dropped and lost; "
            f"{advice} (senders still running are told too)")
    for rank, items in by_sender.items():
        src = items[0][0]
        if src is dst or src.signal is not None or job.live.get(rank) is not src:
            continue  # (one that has finished is told of by the receiver's error alone)
        src.signal = ValueError(
            f"send() to {receiver}: {plural(len(items), 'message')} ({sum(it[3] for it in items)} B) "
            f"sent before this exchange point dropped and lost: its incoming exchange buffer was full "
            f"({room}); {senders_advice}")
        src.sched.wake(src)


class _Landing:
    """A broadcast being copied into many tiles' rows, in chunks taken from both ends.

    The copy thread starts from the first rows while the tiles compute; whoever next
    needs SRAM settled takes chunks from the last rows instead of waiting idle. Popping
    from either end of a deque is atomic, so no chunk is copied twice.

    numpy releases the GIL while it copies a chunk, but the copy thread needs the GIL
    back to start the next one, and the tiles' greenlets hold it for CPython's switch
    interval (5 ms) at a time: the thread copied a few chunks per superstep and the rest
    waited for settle(). While a landing is in flight the interval is 0.1 ms, so the
    thread keeps copying alongside the tiles (1472-tile alltoall: 48 -> 57-68/s here);
    the cost is a GIL hand-off per chunk.
    """

    CHUNKS = 16

    def __init__(self, grid, first: int, stop: int, cols, data):
        self._grid = grid
        self._cols = cols
        self._data = data
        step = max(1, -(-(stop - first) // self.CHUNKS))
        self._chunks = collections.deque((lo, min(lo + step, stop)) for lo in range(first, stop, step))
        self.future = None

    def copy_from_front(self) -> None:
        chunks = self._chunks
        while True:
            try:
                lo, hi = chunks.popleft()
            except IndexError:
                return
            self._grid[lo:hi, self._cols] = self._data

    def copy_from_back(self) -> None:
        chunks = self._chunks
        while True:
            try:
                lo, hi = chunks.pop()
            except IndexError:
                return
            self._grid[lo:hi, self._cols] = self._data


class _SwitchInterval:
    """CPython's GIL switch interval, shortened while any landing is in flight.

    The interval is process-wide and several machines may share a process, so landings
    are counted: the first shortens it, the last puts the saved value back.
    """

    def __init__(self, interval: float):
        self._interval = interval
        self._lock = threading.Lock()
        self._inflight = 0
        self._saved = 0.0

    def enter(self) -> None:
        with self._lock:
            if self._inflight == 0:
                self._saved = sys.getswitchinterval()
                sys.setswitchinterval(self._interval)
            self._inflight += 1

    def leave(self) -> None:
        with self._lock:
            self._inflight -= 1
            if self._inflight == 0:
                sys.setswitchinterval(self._saved)


switch_often = _SwitchInterval(_LANDING_SWITCH_INTERVAL)
