"""A backup killed at any moment leaves the old image or the complete new one.

"A backup" is the daemon's: it freezes the tiles and writes the image file itself, so the
process to kill is the daemon (SIGKILL, at random points of a backup of a full mk2
machine). Killing the client instead cancels the call: the daemon removes its temporary
file and goes on serving.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time

import pytest

import ipuos
from daemon_harness import IPUOS, Booted, run_cli, runtime_dir, unique_name, wait_for  # noqa: F401
from ipuos import _backup
from ipuos._image import ImageError, open_image
from ipuos._rundir import lock_holder, machine_paths

#: fills every tile's disk with compressible text (zstd makes the backup take a while)
FILL = """
words = ["tile", "sync", "exchange", "superstep", "littlefs", "greenlet", str(__tileid)]
line = " ".join(words[(__tileid + i) % len(words)] for i in range(12)) + "\\n"
with open("/text", "w") as f:
    f.write(line * 1200)
"""


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """(a full mk2 image to boot from, a small older image, device digests of the full one)."""
    directory = tmp_path_factory.mktemp("atomic")
    full, old = directory / "full.img", directory / "old.img"
    with ipuos.Machine("mk2") as machine:
        machine.run(FILL, timeout=300)
        _backup.backup(machine, old, "0-9")
        _backup.backup(machine, full)
    with open_image(full) as img:
        devices = {e.name: e.digest for e in img.devices}
    return full, old, devices


def boot_from(image) -> Booted:
    name = unique_name("atomic")
    result = run_cli("boot", "--restore", str(image), "--name", name, timeout=180)
    assert result.returncode == 0, result.stderr
    paths = machine_paths(name)
    return Booted(name, paths, lock_holder(paths.lock))


def outcome(dest, old_digest: str, devices: dict) -> str:
    """"old" or "new"; fails unless ``dest`` is exactly one of them, complete."""
    with open_image(dest) as img:  # verifies every byte
        if img.image_digest == old_digest:
            return "old"
        assert {e.name: e.digest for e in img.devices} == devices
        return "new"


def leftovers(directory, name: str, devices: dict) -> None:
    """Only the writer's temporary files may be left, and never a partial image that opens."""
    for entry in os.listdir(directory):
        if entry in (name, "full.img", "old.img"):
            continue
        assert entry.startswith(f".{name}.") and entry.endswith(".tmp"), entry
        try:
            with open_image(os.path.join(directory, entry)) as img:
                assert {e.name: e.digest for e in img.devices} == devices
        except ImageError as exc:
            assert "not an ipuos image" in str(exc) or "truncated" in str(exc), exc
        os.unlink(os.path.join(directory, entry))


def test_kill_9_of_the_daemon_at_random_points(images, tmp_path):
    full, old, devices = images
    dest = tmp_path / "machine.img"
    with open_image(old) as img:
        old_digest = img.image_digest
    # how long an undisturbed backup takes, end to end
    booted = boot_from(full)
    try:
        started = time.monotonic()
        assert run_cli("backup", str(tmp_path / "timing.img"), "--name", booted.name).returncode == 0
        elapsed = time.monotonic() - started
    finally:
        booted.halt()
    os.unlink(tmp_path / "timing.img")
    rng = random.Random(4321)
    seen = []
    for run in range(6):
        shutil.copyfile(old, dest)
        booted = boot_from(full)
        client = subprocess.Popen([IPUOS, "backup", str(dest), "--name", booted.name],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, elapsed * 1.1))
        os.kill(booted.pid, signal.SIGKILL)
        client.wait(60)
        wait_for(lambda: lock_holder(booted.paths.lock) is None, what="the killed daemon to go")
        seen.append(outcome(dest, old_digest, devices))
        leftovers(tmp_path, "machine.img", devices)
        # the next boot cleans what the dead daemon left (its stale socket)
    print("outcomes:", seen, "elapsed", round(elapsed, 2))
    assert set(seen) <= {"old", "new"}


def test_killing_the_client_cancels_and_leaves_the_old_image(images, tmp_path):
    full, old, devices = images
    dest = tmp_path / "machine.img"
    with open_image(old) as img:
        old_digest = img.image_digest
    booted = boot_from(full)
    try:
        for delay in (0.35, 0.5, 0.7):
            shutil.copyfile(old, dest)
            client = subprocess.Popen([IPUOS, "backup", str(dest), "--name", booted.name],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(delay)
            client.send_signal(signal.SIGKILL)
            client.wait(60)
            # the daemon notices the disconnect, cancels, and removes its temporary file
            wait_for(lambda: all(not n.endswith(".tmp") for n in os.listdir(tmp_path)),
                     what="the cancelled backup's temporary file to go")
            assert outcome(dest, old_digest, devices) in ("old", "new")
        assert run_cli("backup", str(dest), "--name", booted.name).returncode == 0  # still serving
        assert outcome(dest, old_digest, devices) == "new"
    finally:
        booted.halt()
