"""Shared fixtures. Kept small: helpers for one area live in that area's test modules."""

from __future__ import annotations

import pytest

from ipuos._sram import SRAM


@pytest.fixture
def sram():
    """A two-tile machine's SRAM, 256 KiB per tile (tile-local disks are carved from it)."""
    memory = SRAM(tiles=2, bytes_per_tile=256 * 1024)
    yield memory
    memory.close()
