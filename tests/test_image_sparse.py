"""Images are sparse: an empty full-size machine (erased SRAM is 0x00) costs well under
1 MiB on disk, and restoring it does not touch the zero pages (ipuos._image)."""

from __future__ import annotations

import os

import numpy as np

from ipuos._image import DeviceSnapshot, open_image, write_image

KiB = 1024
MiB = 1024 * KiB
TILES = 1472  # mk2: 1472 tiles, 624 KiB each
DISK = 128 * KiB  # each tile's own disk
CHIP = (TILES - 1) * 64 * KiB  # the chip disk: 64 KiB from every tile but tile 0 (~92 MiB)
META = {"preset": "mk2", "ipus": 1, "tiles_per_chip": TILES, "sram_per_tile": 624 * KiB}


def _fresh_littlefs_like(rng, size: int) -> np.ndarray:
    """Shaped like a freshly formatted littlefs on erased-to-zero SRAM: its two
    superblock blocks hold a little metadata (differing per device), the rest is erased."""
    a = np.zeros(size, np.uint8)
    for block in (0, 1):
        at = block * 4096
        a[at : at + 96] = rng.integers(0, 256, 96, dtype=np.uint8)
        a[at + 3100 : at + 3150] = rng.integers(0, 256, 50, dtype=np.uint8)
    return a


def test_empty_machine_image_is_well_under_a_mebibyte(tmp_path):
    rng = np.random.default_rng(0)
    disks = [_fresh_littlefs_like(rng, DISK) for _ in range(TILES)]
    chip = _fresh_littlefs_like(rng, CHIP)

    def devices():
        for t in range(TILES):
            yield DeviceSnapshot(f"tile/{t}/disk", t, "/", 4096, DISK // 4096, disks[t])
        yield DeviceSnapshot("chip", None, "/chip", 4096, CHIP // 4096, chip)

    path = tmp_path / "empty.img"
    summary = write_image(path, META, devices())
    size = os.path.getsize(path)
    assert summary["device_bytes"] == TILES * DISK + CHIP  # ~276 MiB of SRAM disks
    assert size < 1 * MiB, size

    with open_image(path, verify=False) as img:
        assert len(img.devices) == TILES + 1
        data = img.read_all()
    for t in (0, 1, 777, TILES - 1):
        assert np.array_equal(data[f"tile/{t}/disk"], disks[t])
    assert np.array_equal(data["chip"], chip)
