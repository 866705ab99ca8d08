"""Ctrl-C, SIGTERM and SIGHUP ending an offline ``ipuos image`` command while littlefs
reads the image.

Those commands run littlefs on the main thread, where Python runs signal handlers: a
KeyboardInterrupt landing in a littlefs callback was swallowed by littlefs-python, and a
good image read as a corrupt filesystem (or the command went on, with wrong bytes); and
SIGTERM or SIGHUP ended ``extract`` with its staging directory left behind. Where a
signal lands is a matter of timing, so each test sends it at a sweep of delays, counted
from when the command has read the device's bytes out of the image, over the
time littlefs reads the device.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from daemon_harness import IPUOS
from ipuos._image import DeviceSnapshot, write_image
from ipuos.blockdev import Filesystem, MemoryDevice

KiB, MiB = 1024, 1024 * 1024
#: a machine with room for the chip disk below (the offline commands read any geometry)
META = {"preset": "mk2", "ipus": 1, "tiles_per_chip": 1472, "sram_per_tile": 624 * KiB,
        "disk_size": 128 * KiB, "disk_block_size": 4096, "chipdisk_share": 64 * KiB,
        "chipdisk_block_size": 512, "chip_tile": 0, "tiles": "0-1471"}
BIG = os.urandom(4 * MiB)  # (random: an image stores it as it is, uncompressed)
SMALL = {f"f{i:03}": BIG[i * 4 * KiB : (i + 1) * 4 * KiB] for i in range(100)}
#: seconds after the image was read: littlefs reads its device for ~0.2 s then
DELAYS = [0.0, 0.02, 0.04, 0.06, 0.09, 0.12]


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> str:
    """An image whose chip disk (of small blocks: littlefs calls back the more often)
    holds a 4 MiB file and a directory of 100 small ones."""
    device = MemoryDevice.new(512, 12 * 1024)
    with Filesystem(device) as fs:
        fs.format()
        fs.mount()
        with fs.open("/big", "wb") as f:
            f.write(BIG)
        fs.mkdir("/d")
        for name, data in SMALL.items():
            with fs.open(f"/d/{name}", "wb") as f:
                f.write(data)
    path = tmp_path_factory.mktemp("signals") / "m.img"
    write_image(path, META, [DeviceSnapshot("chip", None, "/chip", 512, device.block_count, bytes(device.buffer))],
                digest="blake3")
    return str(path)


def signal_each_reading(commands: list[list[str]], image: str, delays: list[float],
                        signum: int) -> list[subprocess.CompletedProcess]:
    """Run the commands side by side (the sweep takes seconds, not a minute); send each
    ``signum`` its delay after it has read ``image`` (see ``_IMAGE_READS``)."""
    # (output to files, not pipes: a command blocked writing one would never end)
    outputs = [(tempfile.TemporaryFile(), tempfile.TemporaryFile()) for _ in commands]
    processes = [subprocess.Popen(argv, stdout=out, stderr=err) for argv, (out, err) in zip(commands, outputs)]
    before = [0] * len(processes)  # bytes it had read the last time it had not opened the image
    opened = [False] * len(processes)
    read_at: list[float | None] = [None] * len(processes)
    waiting = set(range(len(processes)))  # not yet sent the signal (nor ended)
    deadline = time.monotonic() + 120
    while waiting:
        now = time.monotonic()
        assert now < deadline, "a command never read the image"
        for i in sorted(waiting):
            process = processes[i]
            if process.poll() is not None:
                waiting.discard(i)
            elif not opened[i]:
                bytes_read = _bytes_read(process.pid)
                opened[i] = _has_open(process.pid, image)
                if not opened[i]:
                    before[i] = bytes_read
            elif read_at[i] is None:
                if _bytes_read(process.pid) - before[i] >= _IMAGE_READS * os.path.getsize(image):
                    read_at[i] = now
            elif now >= read_at[i] + delays[i]:
                process.send_signal(signum)
                waiting.discard(i)
        time.sleep(0.001)
    done = []
    for argv, process, (out, err) in zip(commands, processes, outputs):
        process.wait(timeout=60)
        out.seek(0)
        err.seek(0)
        done.append(subprocess.CompletedProcess(argv, process.returncode, out.read(), err.read().decode()))
        out.close()
        err.close()
    return done


#: how many times a command reads (most of) the image before littlefs mounts its
#: device: once, for the device's bytes (checked as they are read; the image holds no
#: other device)
_IMAGE_READS = 0.9


def _has_open(pid: int, path: str) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == path for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:  # (it has ended, or closed a descriptor as it was read)
        return False


def _bytes_read(pid: int) -> int:
    """What process ``pid`` has read so far (0 once it has ended)."""
    try:
        with open(f"/proc/{pid}/io") as io:
            return int(next(line for line in io if line.startswith("rchar:")).split()[1])
    except OSError:
        return 0


def test_ctrl_c_during_cat_is_an_interrupt_never_a_corrupt_image(image):
    command = [IPUOS, "image", "cat", image, "chip", "/big"]
    interrupted = 0
    for delay, done in zip(DELAYS, signal_each_reading([command] * len(DELAYS), image, DELAYS, signal.SIGINT)):
        outcome = (delay, done.returncode, done.stderr)
        if done.returncode == 130:
            # (what it had written, if the Ctrl-C came as it wrote the file out)
            assert done.stderr == "\nipuos: interrupted\n" and BIG.startswith(done.stdout), outcome
            interrupted += 1
        else:  # the Ctrl-C came once the file was read (-2: as the interpreter exited)
            assert done.returncode in (0, -signal.SIGINT) and done.stderr == "", outcome
            assert done.stdout == BIG, outcome
    assert interrupted, "the sweep missed the reading: every Ctrl-C came after it ended"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_during_extract_leaves_nothing_behind(image, tmp_path, signum):
    """Ctrl-C ends it with status 130, SIGTERM and SIGHUP with 128 + the signal's number
    (as a shell shows a process the signal ended); DEST, new or an empty directory, is
    as it was, and no staging directory is left, in DEST's parent or in DEST."""
    status = 130 if signum == signal.SIGINT else 128 + signum
    delays = DELAYS[1:5]  # (even: a new DEST, odd: an empty directory)
    dests = [tmp_path / f"out{i}" for i in range(len(delays))]
    for existing in dests[1::2]:
        existing.mkdir()
    commands = [[IPUOS, "image", "extract", image, "chip", str(dest)] for dest in dests]
    ended = 0
    for i, done in enumerate(signal_each_reading(commands, image, delays, signum)):
        dest, before = dests[i], [] if i % 2 else None
        extracted = sorted(os.listdir(dest)) if dest.exists() else None
        outcome = (delays[i], before, done.returncode, done.stderr, extracted)
        if done.returncode == status:
            assert done.stderr == ("\nipuos: interrupted\n" if signum == signal.SIGINT else ""), outcome
            assert extracted == before, outcome
            ended += 1
        elif done.returncode == -signum:  # (the default action: before it mounted, or once it was done)
            assert extracted in (before, ["big", "d"]), outcome
        else:
            assert done.returncode == 0, outcome
            assert extracted == ["big", "d"] and sorted(os.listdir(dest / "d")) == sorted(SMALL), outcome
    assert {p.name for p in tmp_path.iterdir()} <= {d.name for d in dests}  # nothing staged beside them
    assert ended, "the sweep missed the extraction: no signal came while it ran"


#: runs ``ipuos image extract`` with a signal sent to itself right after the rename that
#: moves the extraction into place: a signal after it is done, the moment a sweep only
#: rarely hits
_SIGNAL_ONCE_MOVED = """
import os, signal, sys
rename, moved_to, signum = os.rename, sys.argv[1], int(sys.argv[2])
def renaming(src, dst):
    rename(src, dst)
    if os.path.basename(dst) == moved_to:
        os.kill(os.getpid(), signum)
os.rename = renaming
sys.argv = ["ipuos"] + sys.argv[3:]
from ipuos._entry import main
main()
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
@pytest.mark.parametrize("existing", [False, True], ids=["new", "empty"])
def test_a_signal_once_the_extraction_is_in_place_does_not_report_it_stopped(image, tmp_path, signum, existing):
    """Once the tree is moved into DEST the extraction is done: a signal then ends it
    with status 0 and its report, never a status that says nothing was extracted."""
    dest = tmp_path / "out"
    if existing:
        dest.mkdir()
    moved_to = "d" if existing else "out"  # (into an empty DEST, big and d move one by one)
    done = subprocess.run([sys.executable, "-c", _SIGNAL_ONCE_MOVED, moved_to, str(int(signum)),
                           "image", "extract", image, "chip", str(dest)], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, ""), done
    assert done.stdout.startswith("extracted 101 files and 1 directory"), done
    assert sorted(os.listdir(dest)) == ["big", "d"] and sorted(os.listdir(dest / "d")) == sorted(SMALL)
    assert (dest / "big").read_bytes() == BIG


def test_a_settled_block_drops_signals_only_until_it_ends():
    """(Settling once left SIGINT, SIGTERM and SIGHUP dropped for the rest of the
    process: a pytest run, which extracts in-process, then ignored Ctrl-C.)"""
    from ipuos._signals import settle, signals_held

    handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
    with signals_held():
        settle()
        os.kill(os.getpid(), signal.SIGINT)  # after the commit: dropped
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)] == handlers
    with pytest.raises(KeyboardInterrupt):
        with signals_held():  # a fresh block holds and acts again
            os.kill(os.getpid(), signal.SIGINT)


def test_what_an_extract_killed_outright_left_is_removed_by_the_next_but_a_live_ones_is_not(image, tmp_path):
    """SIGKILL leaves an extract's staging directory: inside an existing DEST it made the
    next extract refuse DEST as "not empty" (with nothing ls shows), beside a new one it
    stayed for ever. Nobody holds a dead extract's locked; a live extract holds its own."""
    import fcntl

    dest, new_dest = tmp_path / "out", tmp_path / "fresh"
    dest.mkdir()
    (dest / ".out.deadbeef.tmp" / "half").mkdir(parents=True)  # as a killed extract leaves it
    (tmp_path / ".fresh.deadbeef.tmp").mkdir()
    done = subprocess.run([IPUOS, "image", "extract", image, "chip", str(dest)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(dest)) == ["big", "d"]
    done = subprocess.run([IPUOS, "image", "extract", image, "chip", str(new_dest)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "out"]
    busy = tmp_path / "busy"
    live = busy / ".busy.livelive.tmp"
    live.mkdir(parents=True)
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # (as a live extract holds its staging directory)
        done = subprocess.run([IPUOS, "image", "extract", image, "chip", str(busy)], capture_output=True, text=True)
        assert done.returncode == 1 and "it is not empty" in done.stderr, done.stderr
        assert os.listdir(busy) == [live.name]
    finally:
        os.close(fd)
