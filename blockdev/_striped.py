"""A block device striped over other tiles' SRAM, reached only through the exchange.

Block ``b`` lives on backing tile ``b % n`` at offset ``(b // n) * block_size`` of that
tile's stripe region. The owner tile never touches those bytes directly: every miss is a
remote copy that rides the next exchange, and the owner's greenlet waits inside the
littlefs callback until the superstep delivers it.

A superstep per block would make the disk unusably slow, so the device keeps a cache in
the owner's own SRAM (a named region, counted against its budget), in whole blocks or in
pages of a block (preset ``chipdisk_cache_page``; see below):

* **write-behind:** erases and progs land in the cache and go out together, in one
  exchange, when the cache needs room (the owner waits for that one), or at the exchange
  after littlefs syncs (nobody waits: littlefs commits a file with a sync or two, and a
  superstep spent waiting on each made the chip disk's small writes three times slower
  than the tile disk's). littlefs reads back every prog to verify it; that read is served
  from the cache, never from a remote tile.
* **read-ahead that fits littlefs:** a miss brings what will be read next in the same
  exchange (see :meth:`StripedDevice._fetch`): first pages for a skip-list walk, whole
  blocks ahead for data. Caching 4 KiB pages rather than 16 KiB blocks keeps the walk's
  few hot first pages beside the streaming data: reading a 64 MiB file moved 70 MB in
  1,500 exchanges, against 314 MB in 3,000 with whole blocks (1.6x faster), but the
  per-page bookkeeping made small files 15-35% slower, so whole blocks stay the default.
* **heads kept apart (``heads``):** littlefs reads a block's first read unit (``head``
  bytes, what each of its small reads fetches) far more often than the rest: a file's skip-list pointers
  sit at the start of its blocks, and it walks them from the file's last block at every
  block it reads; a directory's metadata log (``metadata_max`` 4 KiB) is all there too.
  A pool of heads of blocks the block slots do not hold keeps those walks and
  directories cached while whole blocks stream through the slots. Measured on the chip
  disk, 16 whole-block slots against 12 and 16 heads (the same SRAM): reading a 64 MiB
  file took 43 exchanges per MiB (the walk's ~12 hot blocks and the read-ahead evicted
  each other), now 14; creating 1,000 files in one directory took 1,743 exchanges,
  now 4, and looking them all up 2,171, now none. A commit into a block whose head
  the pool holds needs no fetch: the block takes a slot holding just the head. A block
  written and then evicted leaves its head in the pool (the next blocks littlefs
  writes point back to it; commits return to a directory); one only read does not.
* **hits without exchange or device call:** :meth:`fast_read`/:meth:`fast_prog` serve a
  cached page or head straight from the littlefs glue.

Until then written data exists only in the cache, exactly like a disk's write cache.
:meth:`StripedDevice.flush` writes everything back and waits (a backup's snapshot calls
it). A backing tile that has failed makes a transfer the owner waits for raise
``TileFailed`` (EIO). A write-back is all or nothing, every dirty page in one batch: if
one backing tile has failed, no tile is written, so the tiles always hold a state
littlefs wrote up to some point, never its metadata without the data it points to. A
failed write-back nobody waited for leaves its blocks dirty, and the next sync writes
them back and waits: if the tile still does not answer, that sync is EIO, as the host
reports a write-back error at the next fsync.
"""

from __future__ import annotations

from collections import OrderedDict

import greenlet

from ._memory import slicing_source
from ._protocol import BlockDevice

__all__ = ["StripedDevice"]

#: heads of the aligned group around a head miss fetched with it (a directory's pairs,
#: small files side by side, the walk's neighbours)
_HEAD_GROUP = 8
#: heads fetched beyond a data miss's read-ahead: the blocks the next walks step on
_HEADS_AHEAD = 8


class StripedDevice(BlockDevice):
    """Blocks striped round-robin over ``stripes`` (one SRAM region per backing tile).

    ``owner`` is the scheduler Tile whose greenlet alone may use the device; ``cache`` is
    a region of the owner's SRAM, divided into pages of ``page`` bytes (default: whole
    blocks); ``cluster`` is how many blocks one read-ahead brings. ``heads`` of the
    cache's slots hold the first ``head`` bytes of blocks instead (whole-block pages
    only; ``head`` should be the filesystem's read unit, which its small reads fill).
    """

    def __init__(self, scheduler, owner, stripes, block_size: int, cache, cluster: int | None = None,
                 page: int | None = None, heads: int = 0, head: int = 0):
        if not stripes:
            raise ValueError("a striped device needs at least one backing tile")
        per_stripe = min(region.size for region in stripes) // block_size
        if per_stripe < 1:
            raise ValueError(f"stripes of {min(r.size for r in stripes)} B hold no {block_size} B block")
        page = _page_size(block_size, page)
        pages_per_block = block_size // page
        slots = self.cache_slots(cache.size, block_size, page, heads, head)
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
        #: bytes per cache slot; a cached unit is one page of one block, its "page id"
        #: ``block * pages_per_block + page index``
        self.page = page
        self._ppb = pages_per_block
        # page index and offset within the page of a block offset, by shift and mask; one
        # page per block: every offset is in page 0 (a shift past any offset)
        self._shift = page.bit_length() - 1 if pages_per_block > 1 else 62
        self._mask = page - 1 if pages_per_block > 1 else (1 << 62) - 1
        self._nslots = slots
        #: cached page id -> slot
        self._slot_of: dict[int, int] = {}
        # Which pages stay (see _fetch for which come). With several pages per block,
        # littlefs' skip-list walks touch only first pages, a few of them on every block
        # read, so plain LRU keeps them while read-ahead streams through the rest. With
        # one page per block the walks and the data share units and plain LRU let
        # read-ahead push the hot ones out (179 exchanges to read a 60-block file through
        # a 16-block cache), so it is segmented (2Q): pages arrive on probation and are
        # evicted from there first, read-ahead nobody used before all; a page used a
        # second time is promoted to the protected segment.
        self._segmented = pages_per_block == 1
        self._probation: OrderedDict[int, None] = OrderedDict()  # all pages, when not segmented
        self._protected: OrderedDict[int, None] = OrderedDict()
        self._protected_max = max(1, slots * 3 // 4)
        #: pages evicted from probation lately: missing one again proves it hot (a
        #: skip-list walk's blocks can be pushed out before their second use)
        self._ghosts: OrderedDict[int, None] = OrderedDict()
        self._uses = [0] * slots
        self._free = list(range(slots - 1, -1, -1))
        self._page_in = [-1] * slots
        #: per slot: how many bytes from its start hold the page (fewer than a page only
        #: for a block written from its head, see _prog_block; the rest comes when used)
        self._valid = [page] * slots
        #: the head pool, after the slots: block -> entry, least recently used first. A
        #: block is in the slots or in the heads, never both: the slots hold the copy
        #: that may be written, so a block taking a slot leaves the heads.
        self._nheads = heads
        self.head = head if heads else 0
        self._heads_at = slots * page
        self._head_of: OrderedDict[int, int] = OrderedDict()
        self._free_heads = list(range(heads - 1, -1, -1))
        # read-ahead of heads takes at most half the pool: it must not evict itself
        self._head_group = max(1, min(_HEAD_GROUP, heads // 2))
        self._heads_ahead = min(_HEADS_AHEAD, heads // 2)
        #: per slot: the dirty byte range (lo, hi) within its page not yet written back
        self._dirty: list[tuple[int, int] | None] = [None] * slots
        #: per slot: written since it was claimed (its head outlives it in the pool)
        self._written = [False] * slots
        #: blocks one miss brings: at most half the cache, or with a head pool, where the
        #: walks and directories stay, all of it but two blocks
        room = slots - 2 * pages_per_block if heads else slots // 2
        self._cluster = max(1, min(cluster or 8, room // pages_per_block))
        #: first pages fetched together on a first-page miss (see _fetch)
        self._first_pages = min(4, self._cluster)
        #: exchanges this device has waited for or posted, and pages and heads it has
        #: fetched (for benchmarks and tests)
        self.transfers = 0
        self.pages_fetched = 0
        self.heads_fetched = 0
        #: a write-back is posted for the next exchange (see _sync)
        self._write_back_due = False
        #: a posted write-back failed: the next sync writes back and waits (see _sync)
        self._retry = False

    @staticmethod
    def cache_slots(cache_size: int, block_size: int, page: int | None = None, heads: int = 0,
                    head: int = 0) -> int:
        """How many pages a cache of ``cache_size`` bytes holds beside its heads; a
        ValueError saying why if that layout cannot work."""
        page = _page_size(block_size, page)
        if heads:
            _check_heads(heads, head, page, block_size)
        slots = (cache_size - heads * head) // page
        if slots < 2 * (block_size // page):
            raise ValueError(f"a cache of {cache_size} B holds fewer than two {block_size} B blocks"
                             + (f" beside {heads} heads of {head} B" if heads else ""))
        return slots

    # -- geometry of the stripes ---------------------------------------------------------

    def location(self, block: int) -> tuple[int, int]:
        """``(backing tile id, machine-wide SRAM offset)`` of ``block``."""
        stripe = block % self._width
        return self._stripe_tile[stripe], self._stripe_base[stripe] + (block // self._width) * self.block_size

    def _page_location(self, pid: int) -> tuple[int, int]:
        block, index = divmod(pid, self._ppb)
        tile, offset = self.location(block)
        return tile, offset + index * self.page

    # -- cache hits, served straight from the littlefs glue -------------------------------

    def fast_read(self, block: int, off: int, size: int) -> bytes | None:
        """``size`` bytes of a cached page or head, or None on a miss (then :meth:`read`)."""
        pid = block * self._ppb + (off >> self._shift)
        slot = self._slot_of.get(pid)
        if slot is None:
            if off + size <= self.head:
                entry = self._head_of.get(block)
                if entry is not None:
                    self._head_of.move_to_end(block)
                    start = self._base + self._heads_at + entry * self.head + off
                    return self._source[start : start + size]
            return None
        within = off & self._mask
        if within + size > self._valid[slot]:
            return None  # spans pages, or past what the slot holds: read() assembles it
        if self._segmented:
            self._touch(pid, slot)
        else:  # _touch, inlined for the hit every page read is
            self._probation.move_to_end(pid)
        start = self._base + slot * self.page + within
        return self._source[start : start + size]

    def fast_prog(self, block: int, off: int, data) -> bool:
        """Write into a cached page; False on a miss (then :meth:`prog`)."""
        pid = block * self._ppb + (off >> self._shift)
        slot = self._slot_of.get(pid)
        if slot is None:
            return False
        within = off & self._mask
        end = within + len(data)
        if end > self._valid[slot]:
            return False
        self._touch(pid, slot)
        start = slot * self.page + within
        self._view[start : start + len(data)] = data
        self._mark_dirty(slot, within, end)
        return True

    # -- the primitives ----------------------------------------------------------------

    def _pieces(self, block: int, off: int, size: int):
        """``(page id, page index, offset in page, length)`` of each page ``off..off+size`` touches."""
        page = self.page
        end = off + size
        while off < end:
            index = off >> self._shift
            within = off & self._mask
            n = min(page - within, end - off)
            yield block * self._ppb + index, index, within, n
            off += n

    def _read_block(self, block: int, off: int, size: int) -> bytes:
        if self._nheads and off + size <= self.head and block not in self._slot_of:
            entry = self._head_of.get(block)
            if entry is None:
                entry = self._fetch_heads(block)
            else:
                self._head_of.move_to_end(block)
            start = self._heads_at + entry * self.head + off
            return bytes(self._view[start : start + size])
        page = self.page
        out = []
        for pid, index, within, n in self._pieces(block, off, size):
            slot = self._slot_of.get(pid)
            if slot is None:
                slot = self._fetch(block, index)
            else:
                self._touch(pid, slot)
                if within + n > self._valid[slot]:
                    self._fetch_rest(pid, slot)
            start = slot * page + within
            out.append(bytes(self._view[start : start + n]))  # now: a later fetch may evict it
        return out[0] if len(out) == 1 else b"".join(out)

    def _prog_block(self, block: int, off: int, data: bytes) -> None:
        page = self.page
        data = memoryview(data)
        done = 0
        for pid, index, within, n in self._pieces(block, off, len(data)):
            slot = self._slot_of.get(pid)
            if slot is None:
                # a whole-page write needs nothing from the remote copy; anything less does,
                # unless it is within a head the pool holds (a directory's commit)
                if n == page:
                    slot = self._claim([pid])[0]
                elif within + n <= self.head and pid in self._head_of:
                    slot = self._promote(pid)
                else:
                    slot = self._fetch(block, index, ahead=False)
            else:
                self._touch(pid, slot)
                if within + n > self._valid[slot]:
                    self._fetch_rest(pid, slot)
            start = slot * page + within
            self._view[start : start + n] = data[done : done + n]
            self._mark_dirty(slot, within, within + n)
            done += n

    def _erase_block(self, block: int) -> None:
        page = self.page
        fill = self.cache.array
        # page by page: claiming a page may evict another of the same block (written
        # back first if dirty, so erased there too)
        for pid in range(block * self._ppb, (block + 1) * self._ppb):
            slot = self._slot_of.get(pid)
            if slot is None:
                slot = self._claim([pid])[0]
            else:
                self._touch(pid, slot)  # used: not the victim of the next page's claim
            fill[slot * page : (slot + 1) * page] = self.erase_value
            self._valid[slot] = page
            self._mark_dirty(slot, 0, page)

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
                    if self._page_in[slot] >= 0:
                        self._mark_dirty(slot, *span)

        self.transfers += 1
        tiles = self.scheduler.tiles
        self.scheduler.engine.post_dma(
            self.owner, [(tiles[tile], src, dst, n) for tile, src, dst, n in transfers], done)

    # -- the cache -----------------------------------------------------------------------

    def _mark_dirty(self, slot: int, lo: int, hi: int) -> None:
        self._written[slot] = True
        dirty = self._dirty[slot]
        self._dirty[slot] = (lo, hi) if dirty is None else (min(dirty[0], lo), max(dirty[1], hi))

    def _fetch(self, block: int, index: int, ahead: bool = True) -> int:
        """Bring page ``index`` of ``block`` into the cache with what will be read next,
        in one exchange; returns its slot.

        littlefs reads a file by walking its skip-list from the last block for every
        block it reads: a few 4-byte pointers at the start of blocks (first pages), then
        the data pages. A file's blocks are allocated close together. So:

        * a miss on a first page brings the first pages of the aligned group of blocks
          around it (the walk's next steps; a small file's data);
        * a miss on a later page is a data read: the rest of that block and the whole
          of the blocks after it (read-ahead);
        * with one page per block the two cannot be told apart: the aligned cluster of
          blocks around it; with a head pool, where the walk's reads go (see
          :meth:`_fetch_heads`), also the heads of the blocks after the cluster: the next
          walks step there, ahead of the data.
        """
        ppb = self._ppb
        pid = block * ppb + index
        wanted = [pid]
        if ahead:
            slot_of = self._slot_of
            if ppb == 1:
                start = block - block % self._cluster
                candidates = range(start, min(start + self._cluster, self.block_count))
            elif index == 0:
                start = block - block % self._first_pages
                candidates = range(start * ppb, min(start + self._first_pages, self.block_count) * ppb, ppb)
            else:
                candidates = range(pid + 1, min(block + self._cluster, self.block_count) * ppb)
            wanted.extend(p for p in candidates if p != pid and p not in slot_of)
        else:
            candidates = ()
        try:
            # what the read-ahead finds cached already stays (segmented: whole blocks),
            # the same read wants it
            slots = self._claim(wanted, keep=candidates)
        except BaseException:
            # an eviction's write-back failed: pages mapped so far hold nothing fetched
            for p in wanted:
                self._forget(p)
            raise
        transfers = self._copies(slots, wanted, [None] * len(wanted), outward=False)
        heads = []
        if ahead and self._nheads:  # (whole-block pages: candidates is the aligned cluster)
            after = candidates.stop
            heads = [b for b in range(after, min(after + self._heads_ahead, self.block_count))
                     if b not in self._slot_of and b not in self._head_of]
            transfers += self._claim_heads(heads)
        try:
            self._exchange(transfers, "chip disk read")
        except BaseException:
            for p in wanted:  # nothing half-fetched may be served later
                self._forget(p)
            self._forget_heads(heads)
            raise
        self.pages_fetched += len(wanted)
        self.heads_fetched += len(heads)
        return slots[0]

    def _fetch_heads(self, block: int) -> int:
        """Bring the head of ``block`` (a read within its head, of a block in no slot)
        into the head pool, with the heads of the aligned group around it; returns its
        entry. The group's other heads are read-ahead: the first to go."""
        start = block - block % self._head_group
        group = [b for b in range(start, min(start + self._head_group, self.block_count))
                 if b != block and b not in self._slot_of and b not in self._head_of]
        wanted = [block, *group]
        transfers = self._claim_heads(wanted)
        head_of = self._head_of
        for b in reversed(group):
            head_of.move_to_end(b, last=False)
        try:
            self._exchange(transfers, "chip disk read")
        except BaseException:
            self._forget_heads(wanted)
            raise
        self.heads_fetched += len(wanted)
        return head_of[block]

    def _promote(self, block: int) -> int:
        """Give ``block``, whose head the pool holds, a slot holding just that head (the
        rest is fetched if ever used: littlefs' metadata logs never reach it); returns
        the slot."""
        entry = self._head_of.pop(block)  # held back: the claim may keep an evicted head
        try:
            slot = self._claim([block])[0]
            src = self._heads_at + entry * self.head
            self._view[slot * self.page : slot * self.page + self.head] = self._view[src : src + self.head]
        finally:
            self._free_heads.append(entry)
        self._valid[slot] = self.head
        return slot

    def _fetch_rest(self, pid: int, slot: int) -> None:
        """Fetch what a promoted slot does not hold yet (never written: writes past it
        wait for this)."""
        valid = self._valid[slot]
        tile, offset = self._page_location(pid)
        start = self.cache.base + slot * self.page
        self._exchange([(tile, offset + valid, start + valid, self.page - valid)], "chip disk read")
        self._valid[slot] = self.page

    def _claim_heads(self, blocks: list[int], copies: bool = True) -> list:
        """Assign head entries to ``blocks`` (the most recent now; none cached), evicting
        the least recently used; return the remote copies that fill them."""
        head_of, free, size = self._head_of, self._free_heads, self.head
        base = self.cache.base + self._heads_at
        transfers = []
        for block in blocks:
            entry = free.pop() if free else head_of.popitem(last=False)[1]
            head_of[block] = entry
            if copies:
                tile, offset = self.location(block)
                transfers.append((tile, offset, base + entry * size, size))
        return transfers

    def _forget_heads(self, blocks) -> None:
        for block in blocks:
            entry = self._head_of.pop(block, None)
            if entry is not None:
                self._free_heads.append(entry)

    def _touch(self, pid: int, slot: int) -> None:
        """A cached page was used: the most recent (segmented: a second use promotes it)."""
        if not self._segmented:
            self._probation.move_to_end(pid)
            return
        if pid in self._protected:
            self._protected.move_to_end(pid)
            return
        uses = self._uses[slot] = self._uses[slot] + 1
        if uses < 2:
            self._probation.move_to_end(pid)
            return
        del self._probation[pid]
        self._protect(pid)

    def _claim(self, pids: list[int], keep=()) -> list[int]:
        """Assign cache slots to ``pids`` (not yet cached), evicting if needed, but not the
        pages in ``keep`` if another will do. The first page counts as used (it is what
        the caller wants); the rest are read-ahead."""
        slots = []
        segmented = self._segmented
        if self._head_of:
            self._forget_heads(pids)  # (whole-block pages: a page id is its block)
        for pid in pids:
            slot = self._free.pop() if self._free else self._evict(slots, keep)
            self._page_in[slot] = pid
            self._slot_of[pid] = slot
            self._dirty[slot] = None
            self._written[slot] = False
            self._valid[slot] = self.page
            if segmented and not slots and self._ghosts.pop(pid, 0) is None:
                self._uses[slot] = 2  # wanted again soon after it went: hot
                self._protect(pid)
            else:
                self._probation[pid] = None
                self._uses[slot] = 0 if slots else 1
            slots.append(slot)
        return slots

    def _protect(self, pid: int) -> None:
        protected = self._protected
        protected[pid] = None
        if len(protected) > self._protected_max:  # the oldest protected page goes back
            demoted, _ = protected.popitem(last=False)
            self._probation[demoted] = None

    def _evict(self, claiming: list[int], keep=()) -> int:
        """Free a slot (never one claimed by the same call, nor segmented, one of ``keep``
        while there is another): the least recently used page
        (the pages claimed by this call are the most recent), or segmented, the oldest
        read-ahead page nobody used, else the oldest on probation, else the oldest
        protected one. A dirty victim makes every dirty slot write back first: one
        exchange leaves the whole cache clean."""
        if self._segmented:
            pid, segment = self._segmented_victim(claiming, keep)
        else:
            segment = self._probation
            pid = next(iter(segment))
        slot = self._slot_of[pid]
        if self._dirty[slot] is not None:
            self._write_back()
        if self._written[slot] and self._nheads:
            # littlefs' next blocks point back at the ones just written, and commits
            # come back to a directory: keep the head (as written back, the tile's copy)
            self._claim_heads([pid], copies=False)
            start = self._heads_at + self._head_of[pid] * self.head
            self._view[start : start + self.head] = self._view[slot * self.page : slot * self.page + self.head]
        del segment[pid]
        del self._slot_of[pid]
        self._page_in[slot] = -1
        if self._segmented and segment is self._probation and self._uses[slot]:
            ghosts = self._ghosts
            ghosts[pid] = None
            if len(ghosts) > self._nslots:
                ghosts.popitem(last=False)
        return slot

    def _segmented_victim(self, claiming: list[int], keep) -> tuple[int, OrderedDict]:
        uses = self._uses
        for keeping in ((keep, ()) if keep else ((),)):
            for segment, unused_only in ((self._probation, True), (self._probation, False),
                                         (self._protected, False)):
                for pid in segment:
                    slot = self._slot_of[pid]
                    if slot not in claiming and pid not in keeping and not (unused_only and uses[slot]):
                        return pid, segment
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
        page_in, dirty = self._page_in, self._dirty
        flushed = [slot for slot, span in enumerate(dirty) if span is not None]
        return self._copies(flushed, [page_in[slot] for slot in flushed],
                            [dirty[slot] for slot in flushed], outward=True), flushed

    def _copies(self, slots, pids, spans, outward: bool) -> list:
        """The remote copies moving ``pids`` between their ``slots`` and the backing
        tiles (``(tile, src, dst, nbytes)``), ``spans[i]`` the byte range of each page
        (None: all of it)."""
        page = self.page
        base = self.cache.base
        copies = []
        for slot, pid, span in zip(slots, pids, spans):
            lo, hi = span if span is not None else (0, page)
            tile, offset = self._page_location(pid)
            cached = base + slot * page + lo
            copies.append((tile, cached, offset + lo, hi - lo) if outward
                          else (tile, offset + lo, cached, hi - lo))
        return copies

    def _forget(self, pid: int) -> None:
        slot = self._slot_of.pop(pid, None)
        if slot is not None:
            self._probation.pop(pid, None)
            self._protected.pop(pid, None)
            self._page_in[slot] = -1
            self._dirty[slot] = None
            self._free.append(slot)

    def drop_cache(self) -> int:
        """Forget every cached page (a failed device's cache, dropped at unmount), and
        say how many were dirty and could not be written back.

        On the owner, what is dirty is written back first, if the backing tiles answer:
        a synced block must not be lost (its write-back may still be due, or have failed
        and be waiting for the next sync). A write-back is all or nothing, so if it fails
        the tiles keep the last one that worked: a state littlefs synced, whole.
        (:meth:`restore` forgets the cache without writing.)
        """
        if greenlet.getcurrent() is self.owner.glet and any(d is not None for d in self._dirty):
            try:
                self._write_back()
            except Exception:  # noqa: BLE001 - a failed device: what it holds is what it holds
                pass
        dropped = sum(span is not None for span in self._dirty)
        self._forget_all()
        return dropped

    def _forget_all(self) -> None:
        """Forget every cached page, written back or not, and any write-back due."""
        self._write_back_due = self._retry = False  # (a posted hook then finds nothing dirty)
        self._slot_of.clear()
        self._probation.clear()
        self._protected.clear()
        self._ghosts.clear()
        self._head_of.clear()
        self._free_heads = list(range(self._nheads - 1, -1, -1))
        self._free = list(range(self._nslots - 1, -1, -1))
        self._page_in = [-1] * self._nslots
        self._valid = [self.page] * self._nslots
        self._written = [False] * self._nslots
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


def _check_heads(heads: int, head: int, page: int, block_size: int) -> None:
    if not isinstance(heads, int) or heads < 0:
        raise ValueError(f"heads must be a whole number, not {heads!r}")
    if page != block_size:
        raise ValueError("a head pool needs a cache of whole blocks (its pages hold first pages already)")
    if not isinstance(head, int) or head <= 0 or head >= block_size or block_size % head:
        raise ValueError(f"a head must be a part of the {block_size} B block dividing it, not {head!r}")


def _page_size(block_size: int, page: int | None) -> int:
    """The cache page: a power of two dividing the block, or the whole block (None)."""
    if page is None or page == block_size:
        return block_size
    if not isinstance(page, int) or page <= 0 or page & (page - 1) or block_size % page:
        raise ValueError(f"a cache page must be a power of two dividing the {block_size} B block, not {page!r}")
    return page
