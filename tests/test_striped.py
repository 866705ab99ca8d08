"""The striped device: blocks in other tiles' SRAM, reached through the exchange.

Every filesystem call here runs on the owner tile's greenlet (a kernel service), as it
does in a machine: the device pauses that greenlet inside littlefs callbacks while the
superstep delivers its blocks.
"""

from __future__ import annotations

import errno

import pytest

from fs_mixin import FilesystemTests, pattern
from ipuos._sram import SRAM
from ipuos.blockdev import Filesystem, StripedDevice
from ipuos.scheduler import Scheduler

NTILES = 16
BLOCK = 512


class OnTile:
    """Runs every method of ``target`` as a kernel request on tile 0 (and wraps results)."""

    def __init__(self, sched, target):
        object.__setattr__(self, "_sched", sched)
        object.__setattr__(self, "_target", target)

    def _call(self, fn, *args, **kwargs):
        return self._sched.submit(0, "test.call", fn, args, kwargs).result(30)

    def __getattr__(self, name):
        value = getattr(self._target, name)
        if not callable(value):
            return value

        def method(*args, **kwargs):
            result = self._call(value, *args, **kwargs)
            return OnTile(self._sched, result) if hasattr(result, "write") else result

        return method

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._call(self._target.__exit__, *exc)

    def __iter__(self):
        return iter(self._call(list, self._target))


@pytest.fixture(scope="module")
def sched():
    scheduler = Scheduler(SRAM(NTILES, 64 * 1024), NTILES, exchange_out=2048, exchange_in=4096)
    scheduler.services["test.call"] = lambda tile, fn, args, kwargs: fn(*args, **kwargs)
    scheduler.start()
    yield scheduler
    scheduler.stop()


_devices = iter(range(10**6))
_regions: list = []


@pytest.fixture(autouse=True)
def release_regions(sched):
    yield
    release(sched)


def release(sched):
    """Free the SRAM of every device made so far (unmount their filesystems first)."""
    while _regions:
        region = _regions.pop()
        sched.sram.memory(region.tile).free(region.name)


#: a page of a paged device: four per block, as the chip disk's 4 KiB pages of 16 KiB blocks
PAGE = BLOCK // 4
#: a head: a quarter of a block, as the chip disk's 4 KiB heads of 16 KiB blocks
HEAD = BLOCK // 4


def make_device(sched, share=8 * 1024, cache_blocks=8, page=None, heads=0, block=BLOCK, head=HEAD):
    n = next(_devices)
    stripes = [sched.sram.memory(t).alloc(f"stripe{n}", share) for t in range(1, NTILES)]
    cache = sched.sram.memory(0).alloc(f"cache{n}", cache_blocks * block + heads * head)
    _regions.extend(stripes + [cache])
    return StripedDevice(sched, sched.tiles[0], stripes, block, cache, page=page, heads=heads,
                         head=head if heads else 0)


def new_filesystem(sched, device, **options):
    # littlefs reads a page or a head at a time, as it does on the chip disk
    unit = device.head or device.page
    if unit < device.block_size:
        options = {"read_size": unit, "cache_size": unit, **options}
    fs = Filesystem(device, **options)
    proxy = OnTile(sched, fs)
    proxy.format()
    proxy.mount()
    return proxy


class TestStripedFilesystem(FilesystemTests):
    @pytest.fixture(autouse=True)
    def _sched(self, sched):
        self.sched = sched

    def make_filesystem(self, tmp_path):
        return new_filesystem(self.sched, make_device(self.sched, share=4 * 1024))


class TestPagedStripedFilesystem(TestStripedFilesystem):
    """The cache in pages smaller than a block (the chip disk's layout)."""

    def make_filesystem(self, tmp_path):
        return new_filesystem(self.sched, make_device(self.sched, share=4 * 1024, page=PAGE))


class TestHeadedStripedFilesystem(TestStripedFilesystem):
    """Whole blocks and a pool of heads (the chip disk's layout)."""

    def make_filesystem(self, tmp_path):
        return new_filesystem(self.sched, make_device(self.sched, share=4 * 1024, cache_blocks=6, heads=8))


def test_geometry_and_placement(sched):
    device = make_device(sched)
    assert device.block_count == 15 * (8 * 1024 // BLOCK)
    assert device.location(0)[0] == 1 and device.location(14)[0] == 15 and device.location(15)[0] == 1
    assert device.location(15)[1] == device.location(0)[1] + BLOCK


def test_written_blocks_land_in_the_backing_tiles_sram(sched):
    device = make_device(sched)
    fs = new_filesystem(sched, device)
    data = pattern(20 * BLOCK, 3)
    with fs.open("/big", "w") as f:
        f.write(data)
    fs.unmount()
    image = device.snapshot()  # read straight from tiles 1-15
    assert data[:BLOCK] in image
    touched = {device.location(b)[0] for b in range(device.block_count)
               if any(image[b * BLOCK : (b + 1) * BLOCK])}
    assert len(touched) >= 10  # spread over the backing tiles
    fs.mount()
    with fs.open("/big") as f:
        assert f.read() == data


def test_a_sync_does_not_wait_and_its_write_back_lands_at_the_next_exchange(sched):
    device = make_device(sched)
    block = bytes([0x5A]) * BLOCK
    tile, offset = device.location(3)

    def write_and_sync():
        device.erase(3)
        device.prog(3, 0, block)
        before = sched.superstep
        device.sync()
        return sched.superstep - before

    assert on_owner(sched, write_and_sync) == 0  # the owner went on without waiting
    # the reply reached this thread after that exchange: the block is on its tile
    assert bytes(sched.sram.view[offset : offset + BLOCK]) == block
    before = device.transfers
    on_owner(sched, device.sync)  # nothing dirty: nothing posted
    assert device.transfers == before


def test_a_failed_write_back_nobody_waited_for_is_retried_by_the_next_sync(sched):
    device = make_device(sched)
    block = bytes([0xC3]) * BLOCK
    tile, offset = device.location(4)
    sched.fail_tile(tile)
    try:
        on_owner(sched, put_block, device, 4, block)
        assert on_owner(sched, device.read, 4, 0, 16) == block[:16]  # still in the cache
        with pytest.raises(OSError) as info:  # the next sync waits, and the tile still fails
            on_owner(sched, device.sync)
        assert info.value.errno == errno.EIO and f"tile {tile}" in str(info.value)
    finally:
        sched.fail_tile(tile, failed=False)
    on_owner(sched, device.sync)  # the tile answers again: the block is written now
    assert bytes(sched.sram.view[offset : offset + BLOCK]) == block


def test_a_write_back_is_all_or_nothing_across_its_tiles(sched):
    """Blocks on live tiles are not written while one of the batch's tiles is down: the
    tiles must never hold littlefs' metadata without the data it points to."""
    device = make_device(sched)
    blocks = {b: bytes([0x40 + b]) * BLOCK for b in range(4)}  # four blocks, four tiles
    failing = device.location(2)[0]
    sched.fail_tile(failing)
    try:
        def write_all():
            for b, data in blocks.items():
                device.erase(b)
                device.prog(b, 0, data)
            device.flush()

        with pytest.raises(OSError) as info:
            on_owner(sched, write_all)
        assert f"tile {failing}" in str(info.value)
        for b in blocks:  # not one of them reached its tile
            tile, offset = device.location(b)
            assert bytes(sched.sram.view[offset : offset + BLOCK]) != blocks[b]
        assert on_owner(sched, device.drop_cache) == 4  # dirty, dropped, and says so
    finally:
        sched.fail_tile(failing, failed=False)
    assert on_owner(sched, device.drop_cache) == 0


def test_a_synced_write_whose_write_back_failed_survives_a_remount(sched):
    device = make_device(sched)
    fs = new_filesystem(sched, device)
    with fs.open("/a", "w") as f:
        f.write(b"old")
    failing = device.location(0)[0]
    for tile in range(1, NTILES):  # every backing tile, whichever blocks the commit uses
        sched.fail_tile(tile)
    try:
        with fs.open("/a", "w") as f:
            f.write(b"new")  # returns: its write-back is posted, and fails
    finally:
        for tile in range(1, NTILES):
            sched.fail_tile(tile, failed=False)
    assert failing  # (the tiles answer again)
    assert fs.listdir("/") == ["a"]
    fs.unmount()
    fs.mount()
    with fs.open("/a") as f:
        assert f.read() == b"new"


def test_dropping_the_cache_on_the_owner_keeps_what_was_synced(sched):
    # a failed device's cache is dropped at unmount: a synced block must survive even
    # though the write-back after its sync has not run yet
    device = make_device(sched)
    synced = bytes([1]) * BLOCK

    def work():
        put_block(device, 6, synced)
        device.drop_cache()
        return device.read(6, 0, BLOCK)

    assert on_owner(sched, work) == synced


def test_a_restore_is_not_overwritten_by_blocks_cached_before_it(sched):
    device = make_device(sched)
    image = bytes([0xAB]) * device.size

    def work():
        put_block(device, 3, bytes([0xCD]) * BLOCK)  # its write-back is due at the next exchange...
        device.restore(image)  # ...but the restore comes first
        return device.read(3, 0, 16)

    assert on_owner(sched, work) == image[:16]
    tile, offset = device.location(3)
    assert bytes(sched.sram.view[offset : offset + BLOCK]) == image[:BLOCK]  # after that exchange


def test_sequential_reads_are_batched_by_read_ahead(sched):
    device = make_device(sched, share=8 * 1024, cache_blocks=16)
    fs = new_filesystem(sched, device)
    data = pattern(60 * BLOCK, 5)
    with fs.open("/seq", "w") as f:
        f.write(data)
    fs.unmount()
    fs.mount()  # a cold cache
    sched.call_wait(device.drop_cache)
    before = device.transfers
    with fs.open("/seq") as f:
        assert f.read() == data
    exchanges = device.transfers - before
    assert exchanges < 60 / 3, f"{exchanges} exchanges to read 60 blocks"


def test_a_paged_sequential_read_fetches_each_page_about_once(sched):
    """littlefs walks a file's skip-list from its last block for every block it reads:
    first-page misses bring first pages only, and data misses read ahead whole blocks,
    so the walk's pages stay cached while the data streams through."""
    device = make_device(sched, share=8 * 1024, cache_blocks=16, page=PAGE)
    fs = new_filesystem(sched, device)
    data = pattern(100 * BLOCK, 6)
    with fs.open("/seq", "w") as f:
        f.write(data)
    fs.unmount()
    fs.mount()
    sched.call_wait(device.drop_cache)
    before, fetched_before = device.transfers, device.pages_fetched
    with fs.open("/seq") as f:
        assert f.read() == data
    exchanges = device.transfers - before
    moved = device.pages_fetched - fetched_before
    assert exchanges < 100 / 2, f"{exchanges} exchanges to read 100 blocks"
    assert moved * PAGE < 1.5 * len(data), f"{moved} pages fetched to read {len(data) // PAGE}"


def exchanges_to_read(sched, device, fs, path: str, data: bytes) -> int:
    """Exchanges reading ``path`` back from a cold cache takes (checking its bytes)."""
    fs.unmount()
    fs.mount()
    sched.call_wait(device.drop_cache)
    before = device.transfers
    with fs.open(path) as f:
        assert f.read() == data
    return device.transfers - before


def test_a_head_pool_keeps_the_skip_list_walk_beside_the_streaming_data(sched):
    """Reading a long file, littlefs walks the skip-list in its blocks' heads from the
    file's end at every block: with the heads apart, the walk stays cached while whole
    blocks stream through the slots, and the same SRAM reads the file in far fewer
    exchanges."""
    data = pattern(400 * BLOCK, 7)
    counts = {}
    for name, blocks, heads in (("whole blocks", 16, 0), ("with heads", 12, 16)):  # the same SRAM
        device = make_device(sched, share=16 * 1024, cache_blocks=blocks, heads=heads)
        fs = new_filesystem(sched, device)
        with fs.open("/long", "w") as f:
            f.write(data)
        counts[name] = exchanges_to_read(sched, device, fs, "/long", data)
        if heads:
            assert device.heads_fetched > 0
    # (deterministic counts: 262 and 104 when written)
    assert counts["with heads"] * 2 < counts["whole blocks"], counts
    assert counts["with heads"] < 400 / 3, counts


def test_a_head_pool_keeps_a_big_directory(sched):
    """Every lookup and create scans its directory's metadata logs, which a metadata_max
    of a head keeps in blocks' heads (the chip disk: 4 KiB logs and heads in 16 KiB
    blocks; here 512 B in 2 KiB): a directory that fits the heads is looked up without
    any exchange, while in whole blocks the same SRAM does not hold it."""
    block, head = 2048, 512
    counts = {}
    for name, blocks, heads in (("whole blocks", 16, 0), ("with heads", 12, 16)):  # the same SRAM
        device = make_device(sched, share=16 * 1024, cache_blocks=blocks, heads=heads, block=block, head=head)
        fs = new_filesystem(sched, device, read_size=head, cache_size=head, metadata_max=head)
        fs.mkdir("/d")
        for i in range(40):
            with fs.open(f"/d/warm{i:03d}", "w") as f:
                f.write(b"x")
        before = device.transfers
        for i in range(60):
            with fs.open(f"/d/file{i:03d}", "w") as f:
                f.write(b"y" * 10)
        created = device.transfers
        for i in range(60):
            assert fs.stat(f"/d/file{i:03d}").size == 10
        counts[name] = (created - before, device.transfers - created)
        assert len(fs.listdir("/d")) == 100
        fs.unmount()
        release(sched)  # (tile 0 holds one of these caches at a time)
    # (deterministic counts: (179, 88) and (123, 0) when written)
    assert counts["with heads"][1] == 0 < counts["whole blocks"][1], counts
    assert counts["with heads"][0] < counts["whole blocks"][0], counts


def test_a_head_is_never_served_after_its_block_is_written(sched):
    """A block taking a slot leaves the heads: what a later read gets is what was
    written last, whether it is still cached or long evicted."""
    device = make_device(sched, cache_blocks=2, heads=4)
    old, new = pattern(BLOCK, 1), pattern(BLOCK, 2)

    def work():
        put_block(device, 7, old)
        device.drop_cache()
        first = device.read(7, 0, 16)  # a head read: block 7's head is in the pool now
        put_block(device, 7, new)  # in a slot now, not in the heads
        stale = 7 in device._head_of
        cached = device.read(7, 0, 16)
        # data reads fill the slots (40 twice: it takes block 7's place among the blocks
        # used again), so block 7 is written back and evicted
        for b in (40, 40, 41, 42):
            device.read(b, HEAD, 16)
        was_evicted = 7 not in device._slot_of
        evicted = device.read(7, 0, 16)
        return first, stale, cached, was_evicted, evicted, 7 in device._head_of

    first, stale, cached, was_evicted, evicted, in_heads = on_owner(sched, work)
    assert first == old[:16] and not stale and cached == new[:16]
    assert was_evicted and evicted == new[:16] and in_heads  # (fetched again, as a head)


def test_a_write_within_a_pooled_head_fetches_nothing_and_the_rest_comes_when_used(sched):
    """A directory's commit lands in a block whose head the pool holds: the block takes a
    slot holding just that head, and the rest of it is fetched only if used."""
    device = make_device(sched, cache_blocks=2, heads=4)
    data = {7: pattern(BLOCK, 5), 9: pattern(BLOCK, 6)}

    def work():
        for block, content in data.items():
            put_block(device, block, content)
        device.drop_cache()
        device.cache.array[:] = 0xEE  # (what slots held before means nothing now)
        device.read(7, 0, 16)  # its head is in the pool now
        before = device.transfers
        device.prog(7, 64, b"N" * 16)  # within the head
        fetched_for_commit = device.transfers - before
        # past the head: not served from the slot (the glue's fast path) but fetched
        unserved = device.fast_read(7, HEAD, 16), device.fast_prog(7, HEAD, b"x")
        tail = device.read(7, HEAD, 32)
        device.prog(7, HEAD + 40, b"T" * 8)
        device.read(9, 0, 16)
        device.prog(9, 0, b"A" * 8)  # 9 too is a head in a slot ...
        device.prog(9, HEAD + 8, b"B" * 8)  # ... written past its head: the rest first
        device.sync()
        device.drop_cache()
        return fetched_for_commit, unserved, tail, device.read(7, 0, BLOCK), device.read(9, 0, BLOCK)

    fetched_for_commit, unserved, tail, seven, nine = on_owner(sched, work)
    assert fetched_for_commit == 0 and unserved == (None, False) and tail == data[7][HEAD : HEAD + 32]
    expected = bytearray(data[7])
    expected[64:80], expected[HEAD + 40 : HEAD + 48] = b"N" * 16, b"T" * 8
    assert seven == expected
    expected = bytearray(data[9])
    expected[0:8], expected[HEAD + 8 : HEAD + 16] = b"A" * 8, b"B" * 8
    assert nine == expected


def test_a_written_block_leaves_its_head_in_the_pool(sched):
    """littlefs' next blocks point back at the ones just written, and commits come back to
    a directory: a written block's head outlives its slot (a block only read does not
    push the pool's heads out)."""
    device = make_device(sched, cache_blocks=2, heads=4)
    written, read_only = pattern(BLOCK, 8), pattern(BLOCK, 9)

    def work():
        put_block(device, 30, read_only)
        device.drop_cache()
        device.read(30, HEAD, 16)  # in a slot, never written
        put_block(device, 7, written)
        put_block(device, 20, pattern(BLOCK, 10))
        put_block(device, 21, pattern(BLOCK, 11))  # the slots' claims evict 30, then 7
        device.flush()  # (written back now, not at the next exchange)
        evicted = 7 not in device._slot_of and 30 not in device._slot_of
        before = device.transfers
        heads = device.read(7, 0, HEAD), device.read(30, 0, HEAD)
        return evicted, device.transfers - before, heads

    evicted, exchanges, heads = on_owner(sched, work)
    assert evicted and heads == (written[:HEAD], read_only[:HEAD])
    assert exchanges == 1  # block 30's head only


def test_a_commit_into_a_pooled_head_survives_its_claim_keeping_another_head(sched):
    """The slot a pooled head moves into may be freed by evicting a written block, whose
    head then takes a place in the (full) pool: never the moving head's own."""
    device = make_device(sched, cache_blocks=2, heads=4)
    nine = pattern(BLOCK, 12)

    def work():
        put_block(device, 9, nine)
        device.drop_cache()
        for b in (9, 12, 14):  # heads (and their group's) fill the pool
            device.read(b, 0, 16)
        full = 9 in device._head_of and len(device._head_of) == 4
        put_block(device, 20, pattern(BLOCK, 13))
        put_block(device, 21, pattern(BLOCK, 14))  # both slots hold written blocks
        device.prog(9, 64, b"N" * 16)  # 9 takes a slot: 20 leaves, its head kept
        cached = device.read(9, 0, HEAD)
        device.sync()
        device.drop_cache()
        return full, cached, device.read(9, 0, BLOCK)

    full, cached, got = on_owner(sched, work)
    expected = bytearray(nine)
    expected[64:80] = b"N" * 16
    assert full and cached == expected[:HEAD] and got == expected


def test_fetching_the_rest_of_a_promoted_block_from_a_failed_tile_is_eio_and_keeps_the_commit(sched):
    device = make_device(sched, cache_blocks=2, heads=4)
    data = pattern(BLOCK, 15)
    on_owner(sched, put_block, device, 9, data)
    sched.call_wait(device.drop_cache)

    def commit():
        device.read(9, 0, 16)
        device.prog(9, 32, b"C" * 16)  # promoted: a slot holding the head
        device.flush()

    on_owner(sched, commit)
    failing = device.location(9)[0]
    sched.fail_tile(failing)
    try:
        with pytest.raises(OSError) as info:
            on_owner(sched, device.read, 9, HEAD, 16)  # past the head: the rest is needed
        assert info.value.errno == errno.EIO and f"tile {failing}" in str(info.value)
    finally:
        sched.fail_tile(failing, failed=False)
    expected = bytearray(data)
    expected[32:48] = b"C" * 16
    assert on_owner(sched, device.read, 9, 0, BLOCK) == expected  # (the rest, fetched now)
    sched.call_wait(device.drop_cache)
    assert on_owner(sched, device.read, 9, 0, BLOCK) == expected  # (as the tile holds it)


def test_a_head_fetch_from_a_failed_tile_is_eio_and_caches_nothing(sched):
    device = make_device(sched, cache_blocks=2, heads=4)
    data = pattern(BLOCK, 3)
    on_owner(sched, put_block, device, 9, data)
    sched.call_wait(device.drop_cache)
    failing = device.location(9)[0]
    sched.fail_tile(failing)
    try:
        with pytest.raises(OSError) as info:
            on_owner(sched, device.read, 9, 0, 16)
        assert info.value.errno == errno.EIO and f"tile {failing}" in str(info.value)
    finally:
        sched.fail_tile(failing, failed=False)
    assert not device._head_of
    assert on_owner(sched, device.read, 9, 0, HEAD) == data[:HEAD]


def test_a_head_pool_must_fit_beside_two_blocks_of_whole_pages(sched):
    with pytest.raises(ValueError, match="fewer than two 512 B blocks beside 9 heads of 128 B"):
        StripedDevice.cache_slots(2 * BLOCK + 8 * HEAD, BLOCK, heads=9, head=HEAD)
    assert StripedDevice.cache_slots(2 * BLOCK + 8 * HEAD, BLOCK, heads=8, head=HEAD) == 2
    with pytest.raises(ValueError, match="cache of whole blocks"):
        StripedDevice.cache_slots(8 * BLOCK, BLOCK, page=PAGE, heads=2, head=HEAD)
    for head in (BLOCK, 0, 100, 2 * BLOCK, "128"):
        with pytest.raises(ValueError, match="a head must be a part of the 512 B block dividing it"):
            StripedDevice.cache_slots(8 * BLOCK, BLOCK, heads=2, head=head)
    for heads in (-1, 1.5):
        with pytest.raises(ValueError, match="heads must be a whole number"):
            StripedDevice.cache_slots(8 * BLOCK, BLOCK, heads=heads, head=HEAD)


def test_an_erase_evicting_a_page_of_its_own_block_erases_every_page(sched):
    """Claiming a block's uncached pages may evict a cached page of that same block."""
    device = make_device(sched, cache_blocks=2, page=PAGE)
    old = pattern(BLOCK, 2)

    def work():
        put_block(device, 7, old)
        device.drop_cache()
        device.read(7, 0, 16)  # page 0 of block 7 cached, the others not
        for b in (20, 21):  # fill the cache so the erase must evict
            device.read(b, PAGE, 16)
        device.erase(7)
        device.prog(7, PAGE, bytes([9]) * PAGE)
        device.sync()
        device.drop_cache()
        return device.read(7, 0, BLOCK)

    got = on_owner(sched, work)
    assert got == bytes(PAGE) + bytes([9]) * PAGE + bytes(2 * PAGE)


def test_an_erase_keeps_its_own_cached_pages(sched):
    """Erasing counts as using the block's cached pages: claiming its other pages must
    not evict (write back, then fetch again) the one it has just erased."""
    device = make_device(sched, cache_blocks=2, page=PAGE)

    def work():
        device.read(7, 0, 16)  # page 0 of block 7, the least recently used from here
        for b in (20, 21):  # clean pages fill the rest of the cache
            device.read(b, PAGE, 16)
        before = device.transfers
        device.erase(7)
        device.prog(7, 0, b"x" * 16)  # what littlefs writes next: a small prog at the start
        return device.transfers - before

    assert on_owner(sched, work) == 0


def test_reads_and_progs_spanning_pages(sched):
    device = make_device(sched, cache_blocks=2, page=PAGE)
    data = pattern(BLOCK, 4)

    def work():
        device.erase(3)
        device.prog(3, 0, data[: PAGE + 8])  # a page and a bit, then the rest
        device.prog(3, PAGE + 8, data[PAGE + 8 :])
        device.sync()
        device.drop_cache()
        return device.read(3, PAGE - 5, 2 * PAGE + 10), device.read(3, 0, BLOCK)

    middle, whole = on_owner(sched, work)
    assert middle == data[PAGE - 5 : 3 * PAGE + 5]
    assert whole == data


def test_a_page_must_divide_the_block(sched):
    for page in (3 * BLOCK // 4, 100, 0, BLOCK * 2):
        with pytest.raises(ValueError, match="power of two dividing"):
            make_device(sched, page=page)
    with pytest.raises(ValueError, match="fewer than two"):
        make_device(sched, cache_blocks=1, page=PAGE)


def test_prog_readback_is_served_from_the_cache(sched):
    device = make_device(sched)
    fs = new_filesystem(sched, device)
    before = device.transfers
    with fs.open("/f", "w") as f:
        f.write(pattern(3 * BLOCK))
    # writing three blocks and committing: a few write-backs, no read per prog
    assert device.transfers - before <= 4


def test_a_failed_backing_tile_gives_eio_and_earlier_data_survives(sched):
    device = make_device(sched)
    fs = new_filesystem(sched, device)
    keep = pattern(4 * BLOCK, 9)
    with fs.open("/keep", "w") as f:
        f.write(keep)
    sched.fail_tile(5)
    try:
        with pytest.raises(OSError) as info:
            with fs.open("/more", "w") as f:
                f.write(pattern(40 * BLOCK, 1))  # spreads over every backing tile
        assert info.value.errno == errno.EIO
        assert "tile 5" in str(info.value)
    finally:
        sched.fail_tile(5, failed=False)
    fs.unmount()  # (it drops what the failed device's cache held)
    fs.mount()
    with fs.open("/keep") as f:
        assert f.read() == keep


def test_a_write_back_failing_during_a_fetch_leaves_nothing_unfetched_in_the_cache(sched):
    """A miss that must first evict a dirty block, whose write-back fails: the block
    wanted must not stay mapped to a slot it was never fetched into."""
    device = make_device(sched, cache_blocks=4)
    wanted = bytes([0xAA]) * BLOCK

    def setup():
        put_block(device, 10, wanted)
        device.drop_cache()
        for b in (0, 1, 2):  # three dirty slots and one free one
            device.erase(b)
            device.prog(b, 0, bytes([b + 1]) * BLOCK)

    on_owner(sched, setup)
    failing = device.location(0)[0]
    sched.fail_tile(failing)
    try:
        with pytest.raises(OSError) as info:
            on_owner(sched, device.read, 10, 0, 16)
        assert info.value.errno == errno.EIO
    finally:
        sched.fail_tile(failing, failed=False)
    assert on_owner(sched, device.read, 10, 0, 16) == wanted[:16]


def on_owner(sched, fn, *args):
    """``fn(*args)`` on tile 0, the owner, whose greenlet may wait for the exchange."""
    return sched.submit(0, "test.call", fn, args, {}).result(10)


def put_block(device, block: int, data: bytes) -> None:
    """Erase ``block``, program ``data`` into it and sync (on the owner)."""
    device.erase(block)
    device.prog(block, 0, data)
    device.sync()


def test_cache_lives_in_the_owners_sram_budget(sched):
    before = sched.sram.memory(0).used
    device = make_device(sched, cache_blocks=4)
    assert sched.sram.memory(0).used == before + 4 * BLOCK
    assert device.cache.tile == 0


def test_a_big_directory_is_listed_with_its_mtimes_in_one_pass(sched):
    """littlefs looks each name up from its directory's first metadata pair: asking it
    for every entry's mtime walks a directory longer than the cache once per entry, each
    walk missing on every pair. The listing reads the pairs once instead."""
    block, head = 2048, 512
    device = make_device(sched, share=32 * 1024, cache_blocks=12, heads=16, block=block, head=head)
    fs = new_filesystem(sched, device, read_size=head, cache_size=head, metadata_max=head)
    fs.mkdir("/d")
    for i in range(300):
        with fs.open(f"/d/tile{i:04d}", "w") as f:
            f.write(b"result")
        fs.set_mtime(f"/d/tile{i:04d}", i * 1_000_000_000)

    def exchanges(listing):
        fs.unmount()
        fs.mount()
        sched.call_wait(device.drop_cache)
        before = device.transfers
        mtimes = listing()
        assert mtimes == [i * 1_000_000_000 for i in range(300)]
        return device.transfers - before

    one_pass = exchanges(lambda: [mtime for _, mtime in fs.scandir_mtimes("/d")])
    per_entry = exchanges(lambda: [fs.get_mtime(f"/d/{name}") for name in fs.listdir("/d")])
    # (deterministic counts: 38 and 3,166 when written)
    assert one_pass * 50 < per_entry, (one_pass, per_entry)
    assert one_pass < 60, one_pass
