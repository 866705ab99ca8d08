"""Thread placement (ipuos._affinity): the threads that trade requests with the scheduler
share one CPU; threads doing bulk C work may use them all; IPUOS_PIN_THREADS=0 turns it off.

Read back from the kernel (/proc/self/task/*/status), on a real machine's threads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

import ipuos

CPUS = sorted(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="pinning is off with a single CPU")


def allowed_cpus(native_id: int) -> set[int]:
    with open(f"/proc/self/task/{native_id}/status") as f:
        line = next(line for line in f if line.startswith("Cpus_allowed_list:"))
    cpus = set()
    for part in line.split()[1].split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def thread_named(prefix: str) -> threading.Thread:
    return next(t for t in threading.enumerate() if t.name.startswith(prefix))


@needs_two_cpus
def test_the_scheduler_is_pinned_and_exchange_copies_are_not():
    machine = ipuos.Machine("mk2")
    try:
        # an alltoall this big lands on a second thread (the copy pool)
        assert machine.run("alltoall(b'x' * 64)").ok
        scheduler = allowed_cpus(thread_named("ipuos-scheduler").native_id)
        assert len(scheduler) == 1 and scheduler <= set(CPUS)
        assert allowed_cpus(thread_named("ipuos-exchange-copy").native_id) == set(CPUS)
        # the thread that made the machine keeps what it had
        assert allowed_cpus(threading.get_native_id()) == set(CPUS)
    finally:
        machine.close()


@needs_two_cpus
def test_machines_in_one_process_share_the_home_cpu():
    first, second = ipuos.Machine("tiny"), ipuos.Machine("tiny")
    try:
        pinned = [allowed_cpus(t.native_id) for t in threading.enumerate()
                  if t.name.startswith("ipuos-scheduler")]
        assert len(pinned) >= 2 and all(cpus == pinned[0] for cpus in pinned)
    finally:
        first.close()
        second.close()


def test_turned_off_by_the_environment():
    script = (
        "import json, threading, ipuos\n"
        "m = ipuos.Machine('tiny')\n"
        "t = next(t for t in threading.enumerate() if t.name.startswith('ipuos-scheduler'))\n"
        "print(json.dumps(open(f'/proc/self/task/{t.native_id}/status').read()"
        ".split('Cpus_allowed_list:')[1].split()[0]))\n"
        "m.close()\n"
    )
    env = dict(os.environ, IPUOS_PIN_THREADS="0")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    expected = f"{CPUS[0]}-{CPUS[-1]}" if len(CPUS) > 1 else str(CPUS[0])
    assert listed == expected
