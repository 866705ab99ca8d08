"""Sequential file write/read through littlefs: ipuos' Filesystem vs the bare binding.

Three ways to run the same littlefs configuration over the same kind of RAM disk:

* ``ipuos``  - blockdev.Filesystem on a MemoryDevice over a bytearray (checked device,
  fault-safe glue, errno translation, busy guard);
* ``sram``   - the same over a region of real tile SRAM (an mmap-backed memoryview), as a
  tile's own disk is;
* ``lean``   - littlefs.lfs functions with a minimal callback object over a bytearray
  (the fastest Python can drive littlefs; no checks at all);
* ``stock``  - littlefs.lfs functions with littlefs-python's own UserContext.

Reports MB/s per file size (best round; the contenders take rounds in turn) and the
ratios ipuos/lean (target >= 0.9) and ipuos/stock (target >= 3).
Run: ``.venv/bin/python bench/fs_raw.py [--quick]``.
"""

from __future__ import annotations

import argparse
import time

from littlefs import UserContext, lfs

from _common import best_rounds
from ipuos._sram import SRAM
from ipuos.blockdev import Filesystem, MemoryDevice

KiB = 1024
BLOCK_SIZE = 4 * KiB
BLOCK_COUNT = 128  # 512 KiB disk, the size DESIGN's figures were measured on


class LeanContext:
    """The least Python can do per littlefs callback."""

    def __init__(self, size: int, block_size: int):
        self.buf = bytearray(size)
        self.bs = block_size
        self.erased = bytes(block_size)

    def read(self, cfg, block, off, size):
        start = block * self.bs + off
        return self.buf[start : start + size]

    def prog(self, cfg, block, off, data):
        start = block * self.bs + off
        self.buf[start : start + len(data)] = data
        return 0

    def erase(self, cfg, block):
        start = block * self.bs
        self.buf[start : start + self.bs] = self.erased
        return 0

    def sync(self, cfg):
        return 0


class BareLittlefs:
    """Drive littlefs.lfs directly with a given callback object."""

    def __init__(self, context, config: dict):
        self.cfg = lfs.LFSConfig(context=context, **config)
        self.fs = lfs.LFSFilesystem()
        lfs.format(self.fs, self.cfg)
        lfs.mount(self.fs, self.cfg)

    def write(self, path, data):
        fh = lfs.file_open(self.fs, path, lfs.LFSFileFlag.wronly | lfs.LFSFileFlag.creat
                           | lfs.LFSFileFlag.trunc)
        lfs.file_write(self.fs, fh, data)
        lfs.file_close(self.fs, fh)

    def read(self, path, size):
        fh = lfs.file_open(self.fs, path, lfs.LFSFileFlag.rdonly)
        data = lfs.file_read(self.fs, fh, size)
        lfs.file_close(self.fs, fh)
        return data

    def remove(self, path):
        lfs.remove(self.fs, path)


class Ours:
    def __init__(self, device=None, **options):
        device = device or MemoryDevice.new(BLOCK_SIZE, BLOCK_COUNT)
        self.fs = Filesystem(device, **options)
        self.fs.format()
        self.fs.mount()

    def write(self, path, data):
        with self.fs.open(path, "w") as f:
            f.write(data)

    def read(self, path, size):
        with self.fs.open(path, "r") as f:
            return f.read(size)

    def remove(self, path):
        self.fs.remove(path)


def throughput_round(target, size: int, disk: int) -> tuple[float, float]:
    """(write MB/s, read MB/s) of one round on a ``disk``-byte filesystem: write as many
    distinct files of ``size`` bytes as fit in a third of the disk (littlefs is
    copy-on-write and needs room), read them all back, then remove them."""
    data = bytes(range(256)) * (size // 256)
    files = max(1, min(64, disk // (3 * size)))
    names = [f"/f{i}" for i in range(files)]
    t0 = time.perf_counter()
    for name in names:
        target.write(name, data)
    t1 = time.perf_counter()
    for name in names:
        if len(target.read(name, size)) != size:
            raise AssertionError(f"short read from {name}")
    t2 = time.perf_counter()
    for name in names:
        target.remove(name)
    return files * size / (t1 - t0) / 1e6, files * size / (t2 - t1) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run that checks it works")
    args = parser.parse_args()
    seconds = 0.05 if args.quick else 1.0

    ours = Ours()
    config = ours.fs.config  # the same littlefs configuration for every contender
    disk = BLOCK_SIZE * BLOCK_COUNT
    sram = SRAM(tiles=1, bytes_per_tile=disk)
    region = sram.memory(0).alloc("disk", disk)
    contenders = {
        "ipuos": ours,
        "sram": Ours(MemoryDevice.for_region(region, BLOCK_SIZE)),
        "lean": BareLittlefs(LeanContext(disk, BLOCK_SIZE), config),
        "stock": BareLittlefs(UserContext(disk), config),
    }
    print(f"littlefs on a {disk // KiB} KiB RAM disk, {BLOCK_SIZE} B blocks, config {config}")
    print(f"{'file':>8} {'':6} " + " ".join(f"{name:>9}" for name in contenders)
          + "   ipuos/lean  ipuos/stock")
    for size in (4 * KiB, 64 * KiB, 256 * KiB):
        results = best_rounds(
            contenders, lambda name: throughput_round(contenders[name], size, disk), seconds)
        for column, label in ((0, "write"), (1, "read")):
            mine = results["ipuos"][column]
            cells = " ".join(f"{results[name][column]:9.0f}" for name in contenders)
            print(f"{size // KiB:>6}Ki {label:6} {cells}   "
                  f"{mine / results['lean'][column]:10.2f}  {mine / results['stock'][column]:11.2f}")
    print("(MB/s, best round of each, the contenders taking turns)")


if __name__ == "__main__":
    main()
