"""``bench/fuse.py --quick`` still runs (CI): the mount, the VFS API and bare FUSE side by side."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ipuos._mount import mount_entries

BENCH = Path(__file__).resolve().parent.parent / "bench" / "fuse.py"


def test_fuse_benchmark_quick_run():
    before = {entry.mountpoint for entry in mount_entries()}
    done = subprocess.run([sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for line in ("mount/api", "mount/bare", "creates/s"):
        assert line in done.stdout
    assert {entry.mountpoint for entry in mount_entries()} == before  # it unmounted everything
