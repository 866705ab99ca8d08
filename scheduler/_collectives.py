"""Completing a collective in the exchange phase, and handing each tile its share.

A collective completes when every live tile of the job has arrived at it. The engine then
checks that they all called the same one, lands the payloads in the receivers' incoming
buffers (one 2-D copy for broadcasts), and leaves a :class:`CollectiveResult` that each
tile decodes from its own SRAM when it resumes. Results that every tile receives
identically are decoded once and shared when they are immutable: a tile cannot tell the
difference, and a 1472-tile alltoall would otherwise decode 1472 x 1472 objects.
"""

from __future__ import annotations

import marshal
from typing import TYPE_CHECKING

import numpy as np

from ._errors import CollectiveMismatchError
from ._payload import IMMUTABLE_SCALARS, decode, is_immutable

_MARSHAL_TAG = ord("M")
marshal_loads = marshal.loads

if TYPE_CHECKING:
    from ._job import Job

SYNC = ("sync", None)

# collective kinds; the second element of a key is the root (None if rootless)
ALLTOALL = "alltoall"
ALLGATHER = "allgather"
BCAST = "bcast"
GATHER = "gather"
#: the last step of reduce(): rank 0, where the tree ends, hands the result to the root
#: (a collective, so that tiles naming different roots are a mismatch, not a hang)
REDUCE = "reduce"
#: the last step of allreduce(): rank 0 hands the result to every tile. A bcast from 0,
#: but a kind of its own: a user's bcast(x, 0) against it is a mismatch
ALLREDUCE = "allreduce"
#: the root sends each tile its item point to point; the collective only ends the
#: superstep in which they travel (and catches tiles that call something else)
SCATTER = "scatter"
#: the last step of scan() and exscan(): the values travelled point to point; the
#: collective only checks that every tile called the same one
SCAN = "scan"
EXSCAN = "exscan"

_ALL_RECEIVE = (ALLTOALL, ALLGATHER, BCAST, ALLREDUCE)
_NOTHING_TO_MOVE = ("sync", SCATTER, SCAN, EXSCAN)
_TO_ROOT = (GATHER, REDUCE)
_ONE_VALUE = (BCAST, REDUCE, ALLREDUCE)


class CollectiveResult:
    __slots__ = ("kind", "root", "data", "offsets", "lengths", "error", "_shared", "_mutable")

    def __init__(self, kind, root=None, data=None, offsets=(), lengths=(), error=None):
        self.kind = kind
        self.root = root
        #: the bytes that landed at the end of every receiver's incoming buffer
        self.data = data
        self.offsets = offsets
        self.lengths = lengths
        self.error = error
        self._shared = None
        self._mutable = False

    def value_for(self, tile) -> object:
        """What the collective returns on ``tile``."""
        shared = self._shared
        kind = self.kind
        if shared is not None:
            return shared[0] if kind in _ONE_VALUE else list(shared)
        if kind == "sync" or (kind in _TO_ROOT and tile.rank != self.root):
            return None
        view = memoryview(self.data)
        values = []
        append = values.append
        for off, n in zip(self.offsets, self.lengths):
            if view[off] == _MARSHAL_TAG:  # decode()'s fast path, inlined: once per tile
                append(marshal_loads(view[off + 1 : off + n]))
            else:
                append(decode(view[off : off + n], tile.program_globals))
        if kind not in _TO_ROOT and not self._mutable:
            kinds = set(map(type, values))  # in C: most results are all ints, bytes ...
            if kinds <= IMMUTABLE_SCALARS or all(is_immutable(v) for v in values):
                self._shared = values
                values = list(values)
            else:
                self._mutable = True
        return values[0] if kind in _ONE_VALUE else values


_SYNC_RESULT = CollectiveResult("sync")


def complete(job: "Job") -> None:
    """Finish the collective every live tile of ``job`` has arrived at, and wake them."""
    engine = job.sched.engine
    key = job.coll_kind
    kind, root = key[:2] if key is not None else SYNC  # (a reduction's key adds its op)
    if job.mismatch:
        error = CollectiveMismatchError(job.mismatch_report())
    elif kind != "sync" and job.nlive < job.nranks:
        finished = [r for r in range(job.nranks) if r not in job.live]
        error = job.missing_tiles(job.live, finished, f"{kind}()")
    elif job.refusal is not None:  # a tile could not take part: every tile's call fails
        error = job.refusal
    elif kind in _NOTHING_TO_MOVE or (kind == REDUCE and root == 0):
        error = None
        job.coll_result = _SYNC_RESULT
    else:
        job.coll_result = result = _move_payloads(job, engine, kind, root)
        error = result.error
    job.end_collective()
    if error is not None:
        # errors travel as signals, so the hot sync() path has a single check for them
        job.raise_in_tiles(error)
    else:
        job.sched._runnable.extend(job.live_resumes())


def _set_aside(job: "Job", offs, src_ids) -> list[tuple[int, bytes]]:
    """(index in ``offs``, part) of the parts that were set aside from their tiles'
    outgoing buffers (see ExchangeEngine.make_room)."""
    if not job.coll_set_aside:
        return []
    ranks = {tile_id: rank for rank, tile_id in enumerate(job.ids)}
    return [(index, job.coll_set_aside[ranks[tile_id]]) for index, (off, tile_id) in enumerate(zip(offs, src_ids))
            if off < 0]


def _move_payloads(job: "Job", engine, kind: str, root) -> CollectiveResult:
    # every tile of the job is live here (complete() refused otherwise): no per-tile
    # lists need building, the job's own are the sources and the receivers
    if kind == BCAST or kind == ALLREDUCE:
        offs, lens, src_ids = [job.coll_off[root]], [job.coll_len[root]], [job.ids[root]]
    elif kind == REDUCE:
        offs, lens, src_ids = [job.coll_off[0]], [job.coll_len[0]], [job.ids[0]]
    else:
        offs, lens, src_ids = job.coll_off, job.coll_len, job.ids
    lengths = np.asarray(lens, dtype=np.int64)
    padded = (lengths + 7) & ~7
    positions = np.cumsum(padded) - padded
    set_aside = _set_aside(job, offs, src_ids)
    if set_aside:
        offs = [job.tiles[0].xout.base if off < 0 else off for off in offs]
    data = engine.gather(offs, padded, positions)
    for index, part in set_aside:
        start = int(positions[index])
        data[start : start + len(part)] = np.frombuffer(part, dtype=np.uint8)
    total = len(data)
    if kind in _ALL_RECEIVE:
        receivers, receiver_ids = job.tiles, job.ids
    else:
        receivers, receiver_ids = [job.tiles[root]], [job.ids[root]]
    full = [t for t in receivers if t.in_used + total > t.xin.size]
    for t in full:  # received messages still take room until compacted away
        engine.compact(t)
    full = [t for t in full if t.in_used + total > t.xin.size]
    if full:
        ranks = [t.rank for t in full]
        return CollectiveResult(kind, error=ValueError(
            f"{kind}() result of {total} B does not fit in the incoming exchange buffer of "
            f"{job.describe(ranks)} ({receivers[0].xin.size} B, minus unreceived messages); "
            "send smaller objects or use more supersteps"
        ))
    if job.xin_offset is not None:
        column = job.xin_offset + receivers[0].xin.size - total
        engine.broadcast(data, receiver_ids, column)
    else:  # irregular layouts: one copy per receiver
        for t in receivers:
            start = t.xin.base + t.xin.size - total
            engine.flat[start : start + total] = data
    # (payload bytes both ways, as --stats reports them: not the 8-byte padding)
    engine.count_broadcast(src_ids, lengths, receiver_ids, int(lengths.sum()), job)
    return CollectiveResult(kind, root, data, positions.tolist(), lengths.tolist())
