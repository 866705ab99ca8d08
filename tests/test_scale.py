"""Scale: a 1-IPU machine is cheap when idle; a 32-IPU machine (47,104 tiles) works.

Each check runs in a fresh interpreter so that the figures are the machine's own, not
whatever the test process accumulated before.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.scale


def measure(script: str, timeout: float = 600) -> dict:
    code = textwrap.dedent(script) + textwrap.dedent("""
        import json, resource
        with open("/proc/self/statm") as statm:
            rss = int(statm.read().split()[1]) * resource.getpagesize()
        report["rss_mb"] = rss / 2**20
        report["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(report))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_one_ipu_idles_under_300_mb():
    report = measure("""
        import ipuos
        machine = ipuos.Machine()
        result = machine.run("x = __tileid")  # every tile has run once
        report = {"ok": result.ok, "tiles": machine.ntiles}
    """)
    assert report["ok"] and report["tiles"] == 1472
    assert report["rss_mb"] < 300, report


def test_32_ipus_run_a_program_on_every_tile():
    report = measure("""
        import ipuos
        machine = ipuos.Machine(ipus=32)
        result = machine.run("total = allreduce(__tileid)\\nif __tileid == 0: print(total)")
        report = {"ok": result.ok, "tiles": len(result.tiles), "out": result.tiles[0].output}
        machine.close()
    """)
    assert report["tiles"] == 47_104 and report["ok"]
    assert report["out"] == f"{47_103 * 47_104 // 2}\n"
    assert report["peak_rss_mb"] < 8 * 1024, report  # well inside a 24 GiB host
