"""Every benchmark in ``bench/`` still runs in its ``--quick`` mode (CI proves they run;
the figures are for the notes, not for tests). The FUSE and shell benchmarks have tests
of their own that also check their figures are printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.parametrize("script, figures", [
    ("superstep.py", ["bare greenlet loop", "asyncio.Barrier", "ipuos scheduler",
                      "sync() loop in a function", "sync() loop at module level"]),
    ("interrupt.py", ["launching and ending `pass`", "every tile catching it", "no tile catching it",
                       "cleaning up for"]),
    ("alltoall.py", ["empty superstep", "numpy copy of the same bytes", "Python floor", "ceiling", "alltoall"]),
    ("fs.py", ["4Ki write", "256Ki read", "create", "remote 64 KiB file", "lean/stock"]),
    ("fs_raw.py", ["4Ki write", "256Ki read"]),
    ("backup.py", ["empty machine, image size", "cp+sync", "backup (full disks)", "restore (full disks)"]),
    ("cli.py", ["python -c pass", "ipuos --version", "ipuos status", "ipuos run --tiles 0", "ipuos shell"]),
])
def test_the_benchmark_runs(script, figures):
    done = subprocess.run([sys.executable, str(BENCH / script), "--quick"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for figure in figures:
        assert figure in done.stdout, done.stdout
