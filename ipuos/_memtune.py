"""The environment a machine's process should start with.

A broadcast (bcast, alltoall) writes the same bytes into many tiles' SRAM: ~150 MB for a
64-byte alltoall on 1472 tiles, copied one ~100 KiB row per tile. glibc's memcpy switches
to non-temporal stores (which skip reading each destination line into the cache first)
only above a threshold derived from the last-level cache size, and a VM that reports a
huge shared L3 (480 MiB on these machines) never reaches it. Lowering the threshold to
64 KiB doubled the broadcast copy rate here (63 -> 122 copies/s) and took the 1472-tile
alltoall from 45 to 66/s on a loaded machine. Smaller copies (littlefs blocks, messages)
are unaffected. glibc reads the setting once, at process start, so it goes into the
environment of the daemon we spawn (and of benchmarks, which re-run themselves with it).

numpy also starts OpenBLAS worker threads at import, which spin on the CPU between
calls. ipuos never calls BLAS (numpy only copies and indexes SRAM, and tile programs
cannot import numpy), so the pool is one thread: on a two-core host the spinning worker
took ~8% of the instructions of a 256-tile alltoall (callgrind). ``ipuos/__init__`` sets
the same for machines run in-process, before numpy is first imported.
"""

from __future__ import annotations

import os
import sys

NON_TEMPORAL_TUNABLE = "glibc.cpu.x86_non_temporal_threshold=0x10000"
#: environment variables numpy's BLAS reads at import: one thread, nothing spinning
SINGLE_THREADED_BLAS = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def tuned_environ(base: dict | None = None) -> dict:
    """``base`` (default: this process's environment) plus the glibc tunable."""
    env = dict(os.environ if base is None else base)
    for name, value in SINGLE_THREADED_BLAS.items():
        env.setdefault(name, value)
    current = env.get("GLIBC_TUNABLES", "")
    if "x86_non_temporal_threshold" not in current:
        env["GLIBC_TUNABLES"] = f"{current}:{NON_TEMPORAL_TUNABLE}" if current else NON_TEMPORAL_TUNABLE
    return env


def reexec_tuned() -> None:
    """Restart this script with the tuned environment unless it already has it."""
    if "x86_non_temporal_threshold" not in os.environ.get("GLIBC_TUNABLES", ""):
        os.execve(sys.executable, [sys.executable, *sys.argv], tuned_environ())
