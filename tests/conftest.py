"""Shared fixtures. Kept small: helpers for one area live in that area's test modules."""

from __future__ import annotations

import contextlib
import os
import subprocess

import pytest

from ipuos._sram import SRAM


@pytest.fixture
def sram():
    """A two-tile machine's SRAM, 256 KiB per tile (tile-local disks are carved from it)."""
    memory = SRAM(tiles=2, bytes_per_tile=256 * 1024)
    yield memory
    memory.close()


@pytest.fixture
def host_tmpfs(tmp_path):
    """``mount(options)``: a fresh tmpfs mounted under ``tmp_path`` with ``options`` (a
    read-only or a tiny filesystem: host disks that refuse writes). Needs root, as CI is."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted = []

    def mount(options: str):
        point = tmp_path / f"tmpfs{len(mounted)}"
        point.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(point)], check=True)
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["umount", str(point)], check=True)
