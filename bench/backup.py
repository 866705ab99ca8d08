"""Backup and restore of a full machine beside ``cp`` of the same bytes; empty-image size.

A 1-IPU mk2 machine (1472 tiles) has every tile disk filled with random files (the worst
case for compression: every slot is incompressible), then is backed up and restored
through ``ipuos._backup`` (the code the daemon runs, without the socket). The baseline is
``cp`` of a host file holding as many random bytes as the tile disks, to a fresh
destination, measured in the same run, interleaved, best of ``--repeat`` (cp: of three
back-to-back copies in each round); ``cp+sync`` is
``cp`` then ``sync`` of the copy, the durability the image write gives (it fsyncs).

MB/s figures count the tile disks' bytes; the chip disk (formatted, nearly empty, 92 MiB)
is in every image too and costs what reading its stripes costs.

Run: ``./dev bench backup`` (``--quick``: the tiny preset, to prove it runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import parser, report  # noqa: E402

import ipuos  # noqa: E402
from ipuos import _backup  # noqa: E402
from ipuos._collector import Collector  # noqa: E402
from ipuos._memtune import reexec_tuned  # noqa: E402

FILL = """
import os, random
free = os.statvfs('/').f_bfree
bs = os.statvfs('/').f_bsize
with open('/big', 'wb') as f:
    f.write(random.randbytes(max(0, free - 3) * bs - 256))
n = 0
try:
    while True:
        with open(f'/small{n}', 'wb') as f:
            f.write(random.randbytes(bs // 2))
        n += 1
except OSError:
    pass
"""


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def fresh(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def main() -> None:
    reexec_tuned()  # copy memory as the daemon does (see ipuos._memtune)
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--dir", default=None, help="where images and copies go (default: a temp dir)")
    args = p.parse_args()
    preset = "tiny" if args.quick else "mk2"
    repeat = 1 if args.quick else args.repeat
    work = Path(tempfile.mkdtemp(prefix="ipuos-bench-backup-", dir=args.dir))
    image, copy_src, copy_dst = work / "machine.img", work / "src.bin", work / "dst.bin"
    try:
        with ipuos.Machine(preset) as machine:
            report("empty machine, image size", _empty_image_kib(machine, work / "empty.img"), "KiB",
                   target="< 1024 KiB")
            machine.run("import os\nos.listdir('/')\n")  # every disk formatted, none holds a file
            report("formatted, empty machine, image size", _empty_image_kib(machine, work / "empty.img"),
                   "KiB", target="< 1024 KiB")
            started = time.perf_counter()
            machine.run(FILL, timeout=600)
            print(f"(filled {machine.ntiles} tile disks in {time.perf_counter() - started:.1f} s)", flush=True)
            # as the daemon does after a request in which a job ended: collect, and freeze
            # the survivors (the machine), so that a full collection during a backup walks
            # only what is newer (see ipuos._collector): else one took ~140 ms of a backup
            Collector(machine.scheduler).collect()
            nbytes = machine.ntiles * machine.preset.disk_size
            copy_src.write_bytes(os.urandom(nbytes))
            subprocess.run(["sync"], check=True)

            def cp():
                subprocess.run(["cp", str(copy_src), str(copy_dst)], check=True)

            def cp_sync():
                cp()
                subprocess.run(["sync", str(copy_dst)], check=True)

            best = {"cp": float("inf"), "cp+sync": float("inf"), "backup": float("inf"),
                    "restore": float("inf"), "fresh": float("inf")}
            size = 0
            for _ in range(max(1, repeat)):
                for _ in range(3):  # back to back: cp's first copy in a while can take 4x its best
                    fresh(copy_dst)
                    best["cp"] = min(best["cp"], timed(cp))
                fresh(copy_dst)
                best["cp+sync"] = min(best["cp+sync"], timed(cp_sync))
                fresh(copy_dst)
                fresh(image)
                best["backup"] = min(best["backup"], timed(lambda: _backup.backup(machine, image)))
                size = image.stat().st_size
                best["restore"] = min(best["restore"], timed(lambda: _backup.restore(machine, image)))
                with ipuos.Machine(preset) as blank:  # what `ipuos boot --restore` does
                    best["fresh"] = min(best["fresh"], timed(lambda: _backup.restore(blank, image)))
            mb = nbytes / 1e6
            cp_rate = mb / best["cp"]
            report("cp", cp_rate, "MB/s")
            report("cp+sync", mb / best["cp+sync"], "MB/s", cp_rate, "cp")
            report("backup (full disks)", mb / best["backup"], "MB/s", cp_rate, "cp", target=">= 0.50x cp")
            report("restore (full disks)", mb / best["restore"], "MB/s", cp_rate, "cp", target=">= 0.50x cp")
            report("restore into a fresh machine", mb / best["fresh"], "MB/s", cp_rate, "cp")
            print(f"(image of {nbytes / 2**20:.0f} MiB of tile disks: {size / 2**20:.1f} MiB; "
                  f"backup {best['backup'] * 1e3:.0f} ms, restore {best['restore'] * 1e3:.0f} ms "
                  f"(fresh machine {best['fresh'] * 1e3:.0f} ms), "
                  f"cp {best['cp'] * 1e3:.0f} ms, cp+sync {best['cp+sync'] * 1e3:.0f} ms)")
            files = machine.fs.listdir(machine.ntiles - 1, "/")
            assert "big" in files, files  # the restored machine still has its files
    finally:
        for path in work.iterdir():
            path.unlink()
        work.rmdir()


def _empty_image_kib(machine, path: Path) -> float:
    _backup.backup(machine, path)
    size = path.stat().st_size
    path.unlink()
    return size / 1024


if __name__ == "__main__":
    main()
