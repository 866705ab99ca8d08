"""Tile SRAM: lazily backed memory and the per-tile region allocator."""

from __future__ import annotations

import resource

import numpy as np
import pytest

from ipuos._sram import SRAM


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def test_untouched_sram_costs_no_host_memory():
    before = rss_bytes()
    sram = SRAM(tiles=1472, bytes_per_tile=624 * 1024)  # a whole mk2 chip: ~900 MiB
    try:
        assert rss_bytes() - before < 16 << 20
        sram.tile_array(7)[0] = 1  # touching one byte of one tile costs one page, not 2 MiB
        assert rss_bytes() - before < 16 << 20
    finally:
        sram.close()


def test_sram_starts_erased_as_zero():
    sram = SRAM(tiles=4, bytes_per_tile=8192)
    try:
        assert not sram.tile_array(3).any()
    finally:
        sram.close()


def test_regions_are_disjoint_aligned_views_of_the_tile():
    sram = SRAM(tiles=2, bytes_per_tile=4096)
    try:
        mem = sram.memory(1)
        a = mem.alloc("a", 13)
        b = mem.alloc("b", 100)
        assert a.offset % 8 == 0 and b.offset % 8 == 0
        assert a.offset + 13 <= b.offset
        a.view[:] = b"x" * 13
        b.array[:] = 7
        tile = sram.tile_array(1)
        assert bytes(tile[a.offset : a.offset + 13]) == b"x" * 13
        assert (tile[b.offset : b.offset + 100] == 7).all()
        assert not sram.tile_array(0).any()  # the other tile is untouched
        assert a.base == 4096 + a.offset
    finally:
        sram.close()


def test_over_budget_is_a_memory_error_naming_tile_request_and_regions():
    sram = SRAM(tiles=3, bytes_per_tile=4096)
    try:
        mem = sram.memory(2)
        mem.alloc("exchange.in", 3000)
        with pytest.raises(MemoryError) as info:
            mem.alloc("program", 2000)
        message = str(info.value)
        assert "tile 2" in message and "'program'" in message and "2000 B" in message
        assert "exchange.in 3000 B" in message
        assert "program" not in mem  # nothing half-allocated
    finally:
        sram.close()


def test_free_zeroes_and_makes_room_again():
    sram = SRAM(tiles=1, bytes_per_tile=4096)
    try:
        mem = sram.memory(0)
        first = mem.alloc("first", 4000)
        first.array[:] = 0xAB
        mem.free("first")
        assert not sram.tile_array(0).any()
        assert mem.alloc("second", 4096).size == 4096
        with pytest.raises(KeyError, match="no SRAM region named 'first'"):
            mem.free("first")
    finally:
        sram.close()


def test_allocation_is_first_fit_and_regions_stay_in_address_order():
    sram = SRAM(tiles=1, bytes_per_tile=4096)
    try:
        mem = sram.memory(0)
        for name, size in (("a", 100), ("b", 1000), ("c", 50), ("d", 8)):
            mem.alloc(name, size)
        mem.free("b")
        mem.free("d")
        # the lowest gap that fits: a small region goes where "b" was, a big one after "c"
        assert mem.alloc("big", 2000).offset == 104 + 1000 + 56
        assert mem.alloc("small", 10).offset == 104
        # an empty region sits at the lowest offset, beside the region already there
        empty = mem.alloc("empty", 0)
        assert empty.offset == 0
        assert [(r.name, r.offset) for r in mem.regions] == [
            ("a", 0), ("empty", 0), ("small", 104), ("c", 1104), ("big", 1160)]
        # freeing the empty one frees that one, not its neighbour at the same offset
        mem.free("empty")
        assert [r.name for r in mem.regions] == ["a", "small", "c", "big"]
        mem.free("a")
        assert [r.name for r in mem.regions] == ["small", "c", "big"]
        assert mem.alloc("a2", 104).offset == 0
        assert mem.largest_free() == 1104 - (104 + 16)  # between "small" and "c"
    finally:
        sram.close()


def test_what_fits_is_told_before_anything_is_allocated():
    """A program's start checks its text and data fit on every tile before any starts:
    by placing them as alloc does (first fit), without allocating."""
    sram = SRAM(tiles=1, bytes_per_tile=4096)
    try:
        mem = sram.memory(0)
        mem.alloc("low", 1000)
        mem.alloc("high", 1000)
        mem.free("low")  # gaps: 1000 B at 0, then 2096 B after "high" (at 1000)
        assert mem.fits(2096) and not mem.fits(2097)
        assert mem.largest_free_after() == mem.largest_free() == 2096
        assert mem.largest_free_after(900) == 2096  # (first fit: into the low gap)
        assert mem.largest_free_after(1100) == 1000  # (only the high gap takes it, as 1104 B: 992 B left)
        assert mem.largest_free_after(1100, 1000) == 992  # the second one takes the low gap
        assert mem.largest_free_after(1100, 1001) is None
        assert [r.name for r in mem.regions] == ["high"]  # nothing was allocated
        region = mem.alloc("a", 1100)  # and alloc places as told
        assert region.offset == 2000
    finally:
        sram.close()


def test_a_region_is_read_only():
    sram = SRAM(tiles=1, bytes_per_tile=4096)
    try:
        region = sram.memory(0).alloc("r", 64)
        for name, value in (("offset", 128), ("size", 4096), ("base", 0)):
            with pytest.raises(AttributeError, match="read-only"):
                setattr(region, name, value)
        with pytest.raises(AttributeError, match="read-only"):
            del region.offset
        assert (region.offset, region.size) == (0, 64)
    finally:
        sram.close()


def test_usage_report_lists_every_region():
    sram = SRAM(tiles=1, bytes_per_tile=8192)
    try:
        mem = sram.memory(0)
        mem.alloc("x", 100)
        mem.alloc("y", 1000)
        usage = mem.usage()
        assert [r["name"] for r in usage["regions"]] == ["x", "y"]
        assert usage["used"] == 104 + 1000 and usage["free"] == 8192 - 1104
    finally:
        sram.close()


def test_duplicate_region_name_and_bad_tile_are_refused():
    sram = SRAM(tiles=2, bytes_per_tile=4096)
    try:
        sram.memory(0).alloc("r", 8)
        with pytest.raises(ValueError, match="already has an SRAM region named 'r'"):
            sram.memory(0).alloc("r", 8)
        with pytest.raises(IndexError, match="no tile 5"):
            sram.memory(5)
    finally:
        sram.close()


def test_word_view_aliases_the_bytes():
    sram = SRAM(tiles=1, bytes_per_tile=64)
    try:
        sram.words[1] = np.uint64(0x0102030405060708)
        assert bytes(sram.flat[8:16]) == bytes([8, 7, 6, 5, 4, 3, 2, 1])
    finally:
        sram.close()
