"""A block device striped over other tiles' SRAM, reached only through the exchange.

Block ``b`` lives on backing tile ``b % n`` at offset ``(b // n) * block_size`` of that
tile's stripe region. The owner tile never touches those bytes directly: every miss is a
remote copy that rides the next exchange, and the owner's greenlet waits inside the
littlefs callback until the superstep delivers it.

A superstep per block would make the disk unusably slow, so the device keeps a cache in
the owner's own SRAM (a named region, counted against its budget):

* **write-behind:** erases and progs land in the cache and go out together, in one
  exchange, when the cache needs room (the owner waits for that one), or at the exchange
  after littlefs syncs (nobody waits: littlefs commits a file with a sync or two, and a
  superstep spent waiting on each made the chip disk's small writes three times slower
  than the tile disk's). littlefs reads back every prog to verify it; that read is served
  from the cache, never from a remote tile.
* **clustered reads:** a miss fetches the whole aligned cluster of blocks around it in
  one exchange (littlefs allocates a file's blocks close together).
* **hits without exchange or device call:** :meth:`fast_read`/:meth:`fast_prog` serve a
  cached block straight from the littlefs glue.

Until then written data exists only in the cache, exactly like a disk's write cache.
:meth:`StripedDevice.flush` writes everything back and waits (a backup's snapshot calls
it). A backing tile that has failed makes a transfer the owner waits for raise
``TileFailed`` (EIO). A failed write-back nobody waited for leaves its blocks dirty, and
the next sync writes them back and waits: if the tile still does not answer, that sync
is EIO, as the host reports a write-back error at the next fsync.
"""

from __future__ import annotations

from collections import OrderedDict

import greenlet

from ._memory import slicing_source
from ._protocol import BlockDevice

__all__ = ["StripedDevice"]


class StripedDevice(BlockDevice):
    """Blocks striped round-robin over ``stripes`` (one SRAM region per backing tile).

    ``owner`` is the scheduler Tile whose greenlet alone may use the device; ``cache`` is
    a region of the owner's SRAM holding whole blocks.
    """

    def __init__(self, scheduler, owner, stripes, block_size: int, cache, cluster: int | None = None):
        if not stripes:
            raise ValueError("a striped device needs at least one backing tile")
        per_stripe = min(region.size for region in stripes) // block_size
        if per_stripe < 1:
            raise ValueError(f"stripes of {min(r.size for r in stripes)} B hold no {block_size} B block")
        slots = cache.size // block_size
        if slots < 2:
            raise ValueError(f"a cache of {cache.size} B holds fewer than two {block_size} B blocks")
        super().__init__(block_size, per_stripe * len(stripes))
        self.scheduler = scheduler
        self.owner = owner
        self.stripes = list(stripes)
        self.cache = cache
        self._width = len(stripes)
        self._stripe_base = [region.base for region in stripes]
        self._stripe_tile = [region.tile for region in stripes]
        self._view = cache.view
        self._source, self._base = slicing_source(cache.view)
        self._nslots = slots
        #: cached block -> slot
        self._slot_of: dict[int, int] = {}
        # Two segments, oldest first (2Q): blocks arrive on probation and are evicted from
        # there first; a block used a second time is promoted to the protected segment.
        # littlefs walks a file's skip-list from its head for every block it reads, so a
        # few blocks (and the metadata pairs) are hot, while data blocks are read once:
        # plain LRU let read-ahead push the hot ones out (179 exchanges to read a 60-block
        # file through a 16-block cache), inserting read-ahead cold made it useless.
        self._probation: OrderedDict[int, None] = OrderedDict()
        self._protected: OrderedDict[int, None] = OrderedDict()
        self._protected_max = max(1, slots * 3 // 4)
        #: blocks evicted from probation lately: missing one again proves it hot (a
        #: skip-list walk's blocks can be pushed out before their second use)
        self._ghosts: OrderedDict[int, None] = OrderedDict()
        self._uses = [0] * slots
        self._free = list(range(slots - 1, -1, -1))
        self._block_in = [-1] * slots
        #: per slot: the dirty byte range (lo, hi) not yet written back, or None
        self._dirty: list[tuple[int, int] | None] = [None] * slots
        #: blocks fetched together on a miss (read-ahead goes on probation, see above)
        self._cluster = max(1, min(cluster or slots // 2, slots // 2))
        #: exchanges this device has waited for or posted (for benchmarks and tests)
        self.transfers = 0
        #: a write-back is posted for the next exchange (see _sync)
        self._write_back_due = False
        #: a posted write-back failed: the next sync writes back and waits (see _sync)
        self._retry = False

    # -- geometry of the stripes ---------------------------------------------------------

    def location(self, block: int) -> tuple[int, int]:
        """``(backing tile id, machine-wide SRAM offset)`` of ``block``."""
        stripe = block % self._width
        return self._stripe_tile[stripe], self._stripe_base[stripe] + (block // self._width) * self.block_size

    # -- cache hits, served straight from the littlefs glue -------------------------------

    def fast_read(self, block: int, off: int, size: int) -> bytes | None:
        """``size`` bytes of a cached block, or None on a miss (then :meth:`read`)."""
        slot = self._slot_of.get(block)
        if slot is None:
            return None
        self._touch(block, slot)
        start = self._base + slot * self.block_size + off
        return self._source[start : start + size]

    def fast_prog(self, block: int, off: int, data) -> bool:
        """Write into a cached block; False on a miss (then :meth:`prog`)."""
        slot = self._slot_of.get(block)
        if slot is None:
            return False
        self._touch(block, slot)
        start = slot * self.block_size + off
        self._view[start : start + len(data)] = data
        self._mark_dirty(slot, off, off + len(data))
        return True

    # -- the primitives ----------------------------------------------------------------

    def _read_block(self, block: int, off: int, size: int) -> bytes:
        slot = self._slot_of.get(block)
        if slot is None:
            slot = self._fetch(block)
        else:
            self._touch(block, slot)
        start = slot * self.block_size + off
        return bytes(self._view[start : start + size])

    def _prog_block(self, block: int, off: int, data: bytes) -> None:
        bs = self.block_size
        slot = self._slot_of.get(block)
        if slot is None:
            # a whole-block write needs nothing from the remote copy; anything less does
            slot = self._claim([block])[0] if off == 0 and len(data) == bs else self._fetch(block, ahead=False)
        else:
            self._touch(block, slot)
        start = slot * bs + off
        self._view[start : start + len(data)] = data
        self._mark_dirty(slot, off, off + len(data))

    def _erase_block(self, block: int) -> None:
        bs = self.block_size
        slot = self._slot_of.get(block)
        if slot is None:
            slot = self._claim([block])[0]
        self.cache.array[slot * bs : (slot + 1) * bs] = self.erase_value
        self._mark_dirty(slot, 0, bs)

    def _sync(self) -> None:
        if self._retry:
            # an earlier write-back nobody waited for failed: this one waits, so a backing
            # tile still not answering is this sync's EIO
            self._write_back()
            return
        if not self._write_back_due:
            self._write_back_due = True
            self.scheduler.before_copies(self._post_write_back)

    def flush(self) -> None:
        """Write every cached change to the backing tiles now (on the owner's greenlet)."""
        self._write_back()

    def _post_write_back(self) -> None:
        """The write-back after a sync: posted at the exchange itself (the owner is parked,
        and the copies run before it next runs), without anyone waiting for it."""
        self._write_back_due = False
        transfers, flushed = self._dirty_transfers()
        if not transfers:
            return
        dirty = self._dirty
        ranges = [dirty[slot] for slot in flushed]
        for slot in flushed:
            dirty[slot] = None

        def done(error) -> None:
            if error is not None:
                self._retry = True  # dirty again, and the next sync waits for them
                for slot, span in zip(flushed, ranges):
                    if self._block_in[slot] >= 0:
                        self._mark_dirty(slot, *span)

        self.transfers += 1
        tiles = self.scheduler.tiles
        self.scheduler.engine.post_dma(
            self.owner, [(tiles[tile], src, dst, n) for tile, src, dst, n in transfers], done)

    # -- the cache -----------------------------------------------------------------------

    def _mark_dirty(self, slot: int, lo: int, hi: int) -> None:
        dirty = self._dirty[slot]
        self._dirty[slot] = (lo, hi) if dirty is None else (min(dirty[0], lo), max(dirty[1], hi))

    def _fetch(self, block: int, ahead: bool = True) -> int:
        """Bring ``block`` and the uncached rest of its aligned cluster into the cache.

        littlefs reads a file by walking its skip-list, so the order of block reads is
        tree-like, not sequential; but a file's blocks are allocated close together. A
        miss therefore fetches the whole aligned cluster around the block, in one exchange.
        """
        wanted = [block]
        if ahead:
            start = block - block % self._cluster
            stop = min(start + self._cluster, self.block_count)
            wanted.extend(b for b in range(start, stop) if b != block and b not in self._slot_of)
        try:
            slots = self._claim(wanted)
        except BaseException:
            # an eviction's write-back failed: blocks mapped so far hold nothing fetched
            for b in wanted:
                self._forget(b)
            raise
        bs = self.block_size
        base = self.cache.base
        transfers = []
        for b, slot in zip(wanted, slots):
            tile, offset = self.location(b)
            transfers.append((tile, offset, base + slot * bs, bs))
        try:
            self._exchange(transfers, "chip disk read")
        except BaseException:
            for b in wanted:  # nothing half-fetched may be served later
                self._forget(b)
            raise
        return slots[0]

    def _touch(self, block: int, slot: int) -> None:
        """A cached block was used: a second use promotes it out of probation."""
        if block in self._protected:
            self._protected.move_to_end(block)
            return
        uses = self._uses[slot] = self._uses[slot] + 1
        if uses < 2:
            self._probation.move_to_end(block)
            return
        del self._probation[block]
        self._protect(block)

    def _claim(self, blocks: list[int], used: bool = True) -> list[int]:
        """Assign cache slots to ``blocks`` (not yet cached), evicting if needed. The first
        block counts as used (it is what the caller wants); the rest are read-ahead."""
        slots = []
        for block in blocks:
            slot = self._free.pop() if self._free else self._evict(slots)
            self._block_in[slot] = block
            self._slot_of[block] = slot
            self._dirty[slot] = None
            if not slots and used and self._ghosts.pop(block, 0) is None:
                self._uses[slot] = 2  # wanted again soon after it went: hot
                self._protect(block)
            else:
                self._probation[block] = None
                self._uses[slot] = 0 if slots else int(used)
            slots.append(slot)
        return slots

    def _protect(self, block: int) -> None:
        protected = self._protected
        protected[block] = None
        if len(protected) > self._protected_max:  # the oldest protected block goes back
            demoted, _ = protected.popitem(last=False)
            self._probation[demoted] = None

    def _evict(self, claiming: list[int]) -> int:
        """Free a slot (never one claimed by the same call): the oldest read-ahead block
        nobody used, else the oldest on probation, else the oldest protected one. A
        dirty victim makes every dirty slot write back first: one exchange leaves the
        whole cache clean."""
        uses = self._uses
        for segment, unused_only in ((self._probation, True), (self._probation, False),
                                     (self._protected, False)):
            for block in segment:
                slot = self._slot_of[block]
                if slot in claiming or (unused_only and uses[slot]):
                    continue
                if self._dirty[slot] is not None:
                    self._write_back()
                del segment[block]
                del self._slot_of[block]
                self._block_in[slot] = -1
                if segment is self._probation and uses[slot]:
                    ghosts = self._ghosts
                    ghosts[block] = None
                    if len(ghosts) > self._nslots:
                        ghosts.popitem(last=False)
                return slot
        raise RuntimeError("striped device cache has no slot to reuse")  # len(claiming) < slots

    def _write_back(self) -> None:
        transfers, flushed = self._dirty_transfers()
        if not transfers:
            return
        self._exchange(transfers, "chip disk write")
        for slot in flushed:
            self._dirty[slot] = None
        self._retry = False  # (whatever failed before is written now)

    def _dirty_transfers(self) -> tuple[list, list]:
        """(remote copies writing every dirty range back, the slots they come from)."""
        bs = self.block_size
        base = self.cache.base
        transfers, flushed = [], []
        for slot, dirty in enumerate(self._dirty):
            if dirty is not None:
                tile, offset = self.location(self._block_in[slot])
                lo, hi = dirty
                transfers.append((tile, base + slot * bs + lo, offset + lo, hi - lo))
                flushed.append(slot)
        return transfers, flushed

    def _forget(self, block: int) -> None:
        slot = self._slot_of.pop(block, None)
        if slot is not None:
            self._probation.pop(block, None)
            self._protected.pop(block, None)
            self._block_in[slot] = -1
            self._dirty[slot] = None
            self._free.append(slot)

    def drop_cache(self) -> None:
        """Forget every cached block (a failed device's cache, dropped at unmount).

        On the owner, what is dirty is written back first, as far as the backing tiles
        answer: a synced block must not be lost (its write-back may still be due, or
        have failed and be waiting for the next sync), and littlefs never depends on an
        unsynced one being lost. (:meth:`restore` forgets the cache without writing.)
        """
        if greenlet.getcurrent() is self.owner.glet and any(d is not None for d in self._dirty):
            try:
                self._write_back()
            except Exception:  # noqa: BLE001 - a failed device: what it holds is what it holds
                pass
        self._forget_all()

    def _forget_all(self) -> None:
        """Forget every cached block, written back or not, and any write-back due."""
        self._write_back_due = self._retry = False  # (a posted hook then finds nothing dirty)
        self._slot_of.clear()
        self._probation.clear()
        self._protected.clear()
        self._ghosts.clear()
        self._free = list(range(self._nslots - 1, -1, -1))
        self._block_in = [-1] * self._nslots
        self._dirty = [None] * self._nslots

    def _exchange(self, transfers, what: str) -> None:
        self.transfers += 1
        self.scheduler.remote_copy(self.owner, transfers, what)

    # -- whole-device access -------------------------------------------------------------

    def snapshot(self) -> bytes:
        """The device's bytes in block order, read straight from the backing tiles' SRAM.

        The view from outside (backup, tests): call :meth:`flush` on the owner first, and
        only while no filesystem operation is in flight, for a consistent snapshot.
        """
        view = self.scheduler.sram.view
        bs = self.block_size
        out = bytearray(self.size)
        for block in range(self.block_count):
            _, offset = self.location(block)
            out[block * bs : (block + 1) * bs] = view[offset : offset + bs]
        return bytes(out)

    def restore(self, image: bytes) -> None:
        """Overwrite every block on the backing tiles (outside view, like snapshot)."""
        image = memoryview(image).cast("B")
        if len(image) != self.size:
            raise ValueError(f"image is {len(image)} bytes but the device holds {self.size}")
        self._forget_all()  # first: nothing cached may be written over the new bytes
        view = self.scheduler.sram.view
        bs = self.block_size
        for block in range(self.block_count):
            _, offset = self.location(block)
            view[offset : offset + bs] = image[block * bs : (block + 1) * bs]
