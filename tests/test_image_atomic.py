"""Images are written atomically: killed or failing writers never leave a partial file
under the final name, and an existing image is either intact or fully replaced."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ipuos._image import DeviceSnapshot, ImageError, open_image, write_image

CHILD = Path(__file__).with_name("_image_writer_child.py")
MIB = 48  # the child's image: 48 MiB of devices, ~0.3-1 s to write
KiB = 1024


def _start(path, seed):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(CHILD.parent.parent), os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(path), str(seed), str(MIB)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )
    assert child.stdout.readline().strip() == "ready"
    return child


def _write_fully(path, seed):
    child = _start(path, seed)
    t0 = time.monotonic()
    out, _ = child.communicate("go\n", timeout=120)
    elapsed = time.monotonic() - t0
    assert child.returncode == 0
    word, digest = out.split()
    assert word == "done"
    return digest, elapsed


def _leftovers(directory: Path, name: str):
    return sorted(p.name for p in directory.iterdir() if p.name != name)


def test_sigkill_at_random_points_leaves_old_or_new_image(tmp_path):
    path = tmp_path / "machine.img"
    old_digest, _ = _write_fully(path, seed=1)
    # the new image's digest and how long it takes, from an undisturbed run elsewhere
    new_digest, elapsed = _write_fully(tmp_path / "reference.img", seed=2)
    os.unlink(tmp_path / "reference.img")
    assert old_digest != new_digest

    rng = random.Random(1234)
    outcomes = []
    for run in range(10):
        child = _start(path, seed=2)
        delay = rng.uniform(0, elapsed * 1.1)
        child.stdin.write("go\n")
        child.stdin.flush()
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        # whatever the moment, the final name holds a complete, verifiable image
        with open_image(path) as img:
            assert img.image_digest in (old_digest, new_digest), run
            outcomes.append("new" if img.image_digest == new_digest else "old")
        # only temp files may be left behind: unopenable until complete (the header is
        # written last), complete if killed between the fsync and the rename
        for name in _leftovers(tmp_path, "machine.img"):
            assert name.startswith(".machine.img.") and name.endswith(".tmp"), name
            try:
                with open_image(tmp_path / name) as img:
                    assert img.image_digest == new_digest
            except ImageError as e:
                assert "not an ipuos image" in str(e) or "truncated" in str(e), e
            os.unlink(tmp_path / name)
        if outcomes[-1] == "new":  # put the old one back for the next round
            _write_fully(path, seed=1)
    assert "old" in outcomes  # the kills did land mid-write


def _started_writer(path, seed):
    """A writer child part-way through writing ``path``, and its temp file."""
    before = set(_leftovers(path.parent, path.name))
    child = _start(path, seed)
    child.stdin.write("go\n")
    child.stdin.flush()
    deadline = time.monotonic() + 60
    while not (new := set(_leftovers(path.parent, path.name)) - before) or \
            os.path.getsize(path.parent / min(new)) < 1 << 20:
        assert child.poll() is None and time.monotonic() < deadline, "the writer never got going"
        time.sleep(0.005)
    (temp,) = new
    return child, temp


def test_the_next_write_removes_a_killed_writers_temp_file_but_not_a_live_ones(tmp_path):
    """A writer killed outright leaves its temp file (up to a whole image): the next write
    of that image removes it. Another writer's, still writing (here stopped: SIGSTOP),
    holds its temp file locked and is left alone, and completes."""
    path = tmp_path / "machine.img"
    killed, dead_temp = _started_writer(path, seed=1)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert (tmp_path / dead_temp).exists()

    live, live_temp = _started_writer(path, seed=2)
    live.send_signal(signal.SIGSTOP)
    try:
        (tmp_path / "other.img.x").write_bytes(b"not ours")  # (nor is anything else touched)
        write_image(path, META, _devices(2))
        assert _leftovers(tmp_path, path.name) == sorted([live_temp, "other.img.x"])
    finally:
        live.send_signal(signal.SIGCONT)
    out, _ = live.communicate(timeout=120)
    assert live.returncode == 0 and out.startswith("done")
    assert _leftovers(tmp_path, path.name) == ["other.img.x"]
    with open_image(path) as img:
        assert img.image_digest == out.split()[1]


def _devices(n=4):
    rng = np.random.default_rng(0)
    return [DeviceSnapshot(f"tile/{t}/disk", t, "/", 4096, 64, rng.integers(0, 256, 256 * KiB, dtype=np.uint8))
            for t in range(n)]


META = {"preset": "test", "ipus": 1, "tiles_per_chip": 16, "sram_per_tile": 256 * KiB}


def _old_image(tmp_path):
    path = tmp_path / "m.img"
    digest = write_image(path, META, _devices(2))["image_digest"]
    return path, digest


def _assert_untouched(tmp_path, path, digest):
    assert os.listdir(tmp_path) == [path.name]
    with open_image(path) as img:
        assert img.image_digest == digest


def test_error_in_the_data_leaves_the_old_image(tmp_path):
    path, digest = _old_image(tmp_path)

    def gen():
        yield from _devices(2)
        raise RuntimeError("the tile went away")

    with pytest.raises(RuntimeError, match="went away"):
        write_image(path, META, gen())
    _assert_untouched(tmp_path, path, digest)


@pytest.mark.parametrize("threads", [1, 2])
def test_interrupt_during_the_write_leaves_the_old_image(tmp_path, threads):
    path, digest = _old_image(tmp_path)

    def progress(done, total):
        if done > 300 * KiB:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_image(path, META, _devices(4), threads=threads, progress=progress)
    _assert_untouched(tmp_path, path, digest)


def test_bad_device_part_way_leaves_the_old_image(tmp_path):
    path, digest = _old_image(tmp_path)
    devs = _devices(3) + [DeviceSnapshot("tile/9/disk", 9, "/", 4096, 64, b"short")]
    with pytest.raises(ValueError, match="5 bytes"):
        write_image(path, META, devs)
    _assert_untouched(tmp_path, path, digest)


def test_full_replacement(tmp_path):
    path, old = _old_image(tmp_path)
    new = write_image(path, META, _devices(3))["image_digest"]
    assert new != old
    _assert_untouched(tmp_path, path, new)


def test_a_new_image_is_private_and_a_replaced_one_keeps_its_mode(tmp_path):
    path = tmp_path / "m.img"
    write_image(path, META, _devices(1))
    assert path.stat().st_mode & 0o7777 == 0o600  # what it holds is the machine's files
    path.chmod(0o640)  # its owner chose to share it: a new backup over it stays shared
    write_image(path, META, _devices(2))
    assert path.stat().st_mode & 0o7777 == 0o640


def test_destination_is_a_directory(tmp_path):
    (tmp_path / "d.img").mkdir()
    with pytest.raises(OSError):
        write_image(tmp_path / "d.img", META, _devices(1))
    assert os.listdir(tmp_path) == ["d.img"]
