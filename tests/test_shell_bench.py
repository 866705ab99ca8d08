"""``bench/shell.py --quick`` still runs (CI): the shell and the multirepl through a real
daemon, beside their baselines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "shell.py"


def test_the_shell_benchmark_runs():
    done = subprocess.run([sys.executable, str(BENCH), "--quick", "--repeat", "2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for figure in ("bare daemon round trip", "ls / in the shell", "empty superstep on the same tiles",
                   "print(__tileid % 7)", "in-process (Machine.repl)"):
        assert figure in done.stdout, done.stdout
