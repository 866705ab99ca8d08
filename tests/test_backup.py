"""Backup and restore end to end: real daemons over their socket, the real CLI, real
littlefs on every tile, image files on host disk.

Trees are compared through a tile program (names, bytes and mtimes as the tile's own ``os``
sees them) and through the host's VFS client.
"""

from __future__ import annotations

import json
import re
import os
import random
import select
import signal
import socket
import stat
import subprocess
import threading
import time

import numpy as np
import pytest

import ipuos
from daemon_harness import IPUOS, Booted, boot_machine, machine, run_cli, runtime_dir, unique_name, wait_for  # noqa: F401
from ipuos._client import Client
from ipuos._rundir import machine_paths
from ipuos import _backup
from ipuos._backup_devices import machine_devices
from ipuos._image import FORMAT_VERSION, MAGIC, open_image
from ipuos._presets import PRESETS

KiB = 1024

#: makes a random tree on every tile it runs on (and on /chip from tile 0), seeded by tile
GROW = """
import os, random
rng = random.Random(__tileid * 7919 + int((__tiledata or "0").split()[0]))
def grow(root, depth, budget):
    for i in range(rng.randrange(1, 4)):
        if depth < 2 and rng.random() < 0.3:
            sub = f"{root}/d{i}-{rng.randrange(1000)}"
            os.makedirs(sub, exist_ok=True)
            grow(sub, depth + 1, budget // 2)
        else:
            with open(f"{root}/f{i}-{rng.randrange(1000)}.bin", "wb") as f:
                f.write(rng.randbytes(rng.randrange(0, budget)))
grow("", 0, 1200)
if __tileid == 0:
    os.makedirs("/chip/shared", exist_ok=True)
    grow("/chip/shared", 0, 6000)
"""

#: prints every file and directory of the tile (and /chip on tile 0) with size, digest, mtime
LIST = """
import os, hashlib
roots = ["/"] + (["/chip"] if __tileid == 0 else [])
for root in roots:
    for top, dirs, files in os.walk(root):
        if top == "/":
            dirs[:] = [d for d in dirs if d not in ("tiles", "chip")]  # other filesystems
        for name in sorted(dirs):
            path = os.path.join(top, name)
            print("d", path, os.stat(path).st_mtime_ns)
        for name in sorted(files):
            path = os.path.join(top, name)
            data = open(path, "rb").read()
            print("f", path, len(data), hashlib.sha256(data).hexdigest()[:16], os.stat(path).st_mtime_ns)
"""


def cli(booted, *args, timeout=120.0, check=True):
    result = run_cli(*args, env=booted.env(), timeout=timeout)
    if check:
        assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result


def listing(booted, tmp_path) -> str:
    program = tmp_path / "list.py"
    program.write_text(LIST)
    return cli(booted, "run", str(program), "--json").stdout


def per_tile(doc: str) -> dict[int, str]:
    return {t["tile"]: t["output"] for t in json.loads(doc)["tiles"]}


def grow(booted, tmp_path, tiles="all", seed=0) -> None:
    program = tmp_path / "grow.py"
    program.write_text(GROW)
    data = tmp_path / "seed"
    data.write_text("\n".join([str(seed)] * 64) + "\n")
    cli(booted, "run", str(program), "--tiles", tiles, "--data", str(data))


@pytest.fixture
def other(runtime_dir):
    booted = boot_machine()
    yield booted
    booted.halt()


def test_round_trip_through_backup_and_boot_restore(machine, other, tmp_path):
    grow(machine, tmp_path)
    before = per_tile(listing(machine, tmp_path))
    assert all(any(line.startswith("f ") for line in before[t].splitlines()) for t in range(16))
    assert "/chip/shared" in before[0]
    image = tmp_path / "m.img"
    out = cli(machine, "backup", str(image)).stdout
    assert "backed up 16 tile disks (0-15) and the chip disk" in out and str(image) in out
    # a fresh machine booted from the image
    name = unique_name("restored")
    boot = run_cli("boot", "--restore", str(image), "--name", name)
    assert boot.returncode == 0, boot.stderr
    assert f"booted machine {name!r} from {image}: tiny, 1 IPU" in boot.stdout  # (its preset: none was given)
    try:
        restored = Booted(name, machine_paths(name), 0)
        assert per_tile(listing(restored, tmp_path)) == before
    finally:
        run_cli("halt", "--name", name)
    # a running machine with other files, restored in place
    grow(other, tmp_path, seed=5)
    assert per_tile(listing(other, tmp_path)) != before
    out = cli(other, "restore", str(image)).stdout
    assert "restored 16 tile disks (0-15) and the chip disk" in out
    assert per_tile(listing(other, tmp_path)) == before


def test_round_trip_through_the_host_client(tmp_path):
    rng = random.Random(5)
    expected = {}
    with ipuos.Machine("tiny") as source:
        for tile in list(range(1, 16, 2)) + [0]:
            root = "/chip" if tile == 0 else ""
            for i in range(rng.randrange(2, 5)):
                directory = f"{root}/dir{i % 2}" + ("/deeper" if i == 3 else "")
                source.fs.makedirs(tile, directory, exist_ok=True)
                path = f"{directory}/file{i}"
                data = rng.randbytes(rng.randrange(0, 1200))
                source.fs.write_file(tile, path, data)
                mtime = 1_600_000_000_000_000_000 + rng.randrange(10**15)
                source.fs.utime(tile, path, mtime)
                expected[(tile, path)] = (data, mtime)
        _backup.backup(source, tmp_path / "h.img")
        want = {tile: walk(source, tile) for tile in range(16)}
    with ipuos.Machine("tiny") as target:
        target.fs.write_file(3, "/will-vanish", b"x")
        _backup.restore(target, tmp_path / "h.img")
        # tiles that never used storage come back blank (formatted on first use), the
        # others hold restored bytes, mounted on first use
        states = [target.storage.state(t) for t in target.scheduler.tiles]
        assert states == ["restored" if t % 2 or t == 0 else "blank" for t in range(16)]
        for tile in range(16):
            assert walk(target, tile) == want[tile], tile
        for (tile, path), (data, mtime) in expected.items():
            assert target.fs.read_file(tile, path) == data
            assert target.fs.stat(tile, path).st_mtime_ns == mtime
        assert not target.fs.exists(3, "/will-vanish")
        assert target.fs.listdir(2, "/") == []


def walk(machine, tile, top="/") -> list:
    out = []
    for entry in machine.fs.entries(tile, top):
        path = top.rstrip("/") + "/" + entry.name
        if path in ("/tiles",) or (path == "/chip" and top == "/"):
            continue
        data = None if entry.is_dir else machine.fs.read_file(tile, path)
        out.append((path, entry.is_dir, data, entry.mtime_ns))
        if entry.is_dir:
            out.extend(walk(machine, tile, path))
    if top == "/" and tile == 0:
        out.extend(walk(machine, 0, "/chip"))
    return out


def test_tiles_select_disks_and_the_chip_goes_with_tile_0(machine, tmp_path):
    grow(machine, tmp_path)
    before = per_tile(listing(machine, tmp_path))
    part = tmp_path / "part.img"
    out = cli(machine, "backup", str(part), "--tiles", "3-5").stdout
    assert "3 tile disks (3-5) of machine" in out and "chip" not in out
    info = json.loads(run_cli("image", "info", str(part), "--json").stdout)
    assert [d["name"] for d in info["devices"]] == ["tile/3/disk", "tile/4/disk", "tile/5/disk"]
    chip = tmp_path / "chip.img"
    cli(machine, "backup", str(chip), "--tiles", "0")
    info = json.loads(run_cli("image", "info", str(chip), "--json").stdout)
    assert [d["name"] for d in info["devices"]] == ["tile/0/disk", "chip"]
    grow(machine, tmp_path, seed=9)  # change every tile
    changed = per_tile(listing(machine, tmp_path))
    cli(machine, "restore", str(part), "--tiles", "4")  # a subset of the image
    now = per_tile(listing(machine, tmp_path))
    assert now[4] == before[4] and now[3] == changed[3] and now[5] == changed[5]
    cli(machine, "restore", str(part))  # all it holds
    now = per_tile(listing(machine, tmp_path))
    assert [now[t] for t in (3, 4, 5)] == [before[t] for t in (3, 4, 5)] and now[6] == changed[6]
    result = cli(machine, "restore", str(part), "--tiles", "5-6", check=False)
    assert result.returncode == 1
    assert "has no copy of 1 tile disk (6)" in result.stderr and "nothing was restored" in result.stderr


def test_halt_if_saved_knows_what_a_backup_covers(machine, tmp_path):
    assert cli(machine, "run", "--tiles", "0-15", _write(tmp_path, "import os\nos.listdir('/')\n")).returncode == 0
    # every tile formatted its disk, none holds a file: nothing to lose
    result = cli(machine, "backup", str(tmp_path / "empty.img"), "--tiles", "1")  # covers tile 1 only
    cli(machine, "run", "--tiles", "7", _write(tmp_path, "open('/keep', 'w').write('me')\n"))
    result = cli(machine, "halt", "--if-saved", check=False)
    assert result.returncode == 1
    assert "the disk of tile 7 holds files no backup or restore has covered" in result.stderr
    cli(machine, "backup", str(tmp_path / "m.img"))
    cli(machine, "run", "--tiles", "7", _write(tmp_path, "print(open('/keep').read())\n"))  # reading changes nothing
    result = cli(machine, "halt", "--if-saved")
    assert "halted machine" in result.stdout


def test_halt_if_saved_does_not_trust_an_image_deleted_or_replaced_since(machine, tmp_path):
    cli(machine, "run", "--tiles", "3", _write(tmp_path, "open('/keep', 'w').write('me')\n"))
    image = tmp_path / "m.img"
    cli(machine, "backup", str(image))
    image.unlink()
    result = cli(machine, "halt", "--if-saved", check=False)
    assert result.returncode == 1
    assert f"the disk of tile 3 was saved last in {image}, which has been deleted or replaced since" \
        in result.stderr, result.stderr
    cli(machine, "backup", str(image))
    other = boot_machine()  # another machine's backup to the same path replaces it
    try:
        cli(other, "backup", str(image))
    finally:
        other.halt()
    result = cli(machine, "halt", "--if-saved", check=False)
    assert result.returncode == 1 and f"was saved last in {image}, which has been deleted" in result.stderr
    cli(machine, "restore", str(image))  # (an empty machine's: tile 3 holds nothing now)
    cli(machine, "run", "--tiles", "3", _write(tmp_path, "open('/keep', 'w').write('me')\n"))
    cli(machine, "backup", str(image))
    cli(machine, "restore", str(image))  # (tile 3's disk is then as restored: not written since)
    image.unlink()
    result = cli(machine, "halt", "--if-saved", check=False)
    assert result.returncode == 1 and f"the disk of tile 3 was saved last in {image}, which has been deleted" \
        in result.stderr, result.stderr
    cli(machine, "backup", str(image))
    assert "halted machine" in cli(machine, "halt", "--if-saved").stdout


def test_no_chip_disk_write_back_lands_on_the_restored_bytes(tmp_path, monkeypatch):
    """A file on /chip closed in the superstep in which the restore's freeze reaches tile 0
    leaves the chip disk's write-behind cache to go out at that superstep's exchange, while
    tile 0 holds. The restore writes the stripes meanwhile, from the host: if its writes
    come first (here the scheduler reaches that exchange late, as when other tiles compute
    long or the host thread has the interpreter), the old filesystem's blocks must not land
    on the restored disk."""
    image = tmp_path / "m.img"
    with ipuos.Machine("tiny") as machine:
        fs, scheduler = machine.fs, machine.scheduler

        def write(path: str, data: bytes) -> int:
            handle = fs.call(0, "fs.open", path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            fs.call(0, "fs.write", handle, 0, data)
            return handle

        fs.call(0, "fs.close", write("/chip/kept", b"k" * 30000))
        _backup.backup(machine, image)
        fs.call(0, "fs.unlink", "/chip/kept")
        for i in range(3):
            fs.call(0, "fs.close", write(f"/chip/x{i}", os.urandom(3000)))
        late = write("/chip/late", os.urandom(60000))  # closed in the restore's superstep

        written = threading.Event()  # the restore has written every device
        deadline = time.monotonic() + 30

        def late_exchange() -> None:
            # at each exchange until tile 0 holds: once it does, this exchange's copies
            # wait for the restore's writes
            if scheduler.tiles[0].waiting == "frozen for a restore":
                written.wait(30)
            elif not written.is_set() and time.monotonic() < deadline:
                scheduler.before_copies(late_exchange)

        held, go = threading.Event(), threading.Event()

        def hold_scheduler() -> None:  # until the close and the freeze are both queued
            scheduler.before_copies(late_exchange)  # (before any the close posts)
            held.set()
            go.wait(30)

        scheduler.call(hold_scheduler)
        assert held.wait(30)
        fs.submit(0, "fs.close", late)
        submit_all = fs.submit_all

        def submit_all_then_go(*args):  # (the restore queues its freeze with it)
            futures = submit_all(*args)
            go.set()
            return futures

        monkeypatch.setattr(fs, "submit_all", submit_all_then_go)

        def progress(phase: str, done: int, total) -> None:
            if phase == "restoring" and done == total:
                written.set()

        _backup.restore(machine, image, progress=progress)
        (chip,) = [d for d in machine_devices(machine) if d.name == "chip"]
        with open_image(image) as img:
            assert np.array_equal(chip.read()[0], img.read_all()["chip"])
        # (a write-back landing after it showed the old files again: late, x0-x2, no kept)
        listed = machine.repl("0").run("import os\nprint(os.listdir('/chip'), len(open('/chip/kept').read()))\n")
        assert listed.outputs() == {0: "['kept'] 30000\n"}


def test_writes_held_in_an_open_file_are_unsaved_and_named(tmp_path):
    """littlefs commits a file's writes when it is flushed or closed; until then they are
    in no image. A backup says which files it could not take whole, and ``halt
    --if-saved`` does not call such a machine saved."""
    with ipuos.Machine("tiny") as machine:
        repl = machine.repl("3")
        assert repl.run("log = open('/log', 'w')\nlog.write('first')\nlog.flush()\n").ok
        chip = machine.repl("0")
        assert chip.run("out = open('/chip/out', 'wb')\nout.write(b'x')\nout.flush()\n").ok
        summary = _backup.backup(machine, tmp_path / "m.img")
        assert summary["uncommitted"] == []
        assert _backup.unsaved(machine) == []
        assert repl.run("log.write('second')\n").ok
        assert chip.run("out.write(b'y')\n").ok
        assert _backup.unsaved(machine) == ["chip", "tile/3/disk"]
        text = str(_backup.unsaved_state(machine))
        assert "tile 0 holds 1 file open with writes not yet on its disk (/chip/out)" in text
        assert "tile 3 holds 1 file open with writes not yet on its disk (/log)" in text
        summary = _backup.backup(machine, tmp_path / "m.img")
        assert summary["uncommitted"] == [{"tile": 0, "path": "/chip/out"}, {"tile": 3, "path": "/log"}]
        assert b"firstsecond" not in run_cli("image", "cat", str(tmp_path / "m.img"), "3", "/log").stdout.encode()
        assert _backup.unsaved(machine) == ["chip", "tile/3/disk"]  # still: the image lacks them
        assert repl.run("log.close()\n").ok and chip.run("out.close()\n").ok
        assert _backup.unsaved(machine) == ["chip", "tile/3/disk"]  # now on disk, not in the image
        summary = _backup.backup(machine, tmp_path / "m.img")
        assert summary["uncommitted"] == [] and _backup.unsaved(machine) == []
        assert run_cli("image", "cat", str(tmp_path / "m.img"), "3", "/log").stdout == "firstsecond"


def test_a_repl_that_outlives_a_restore_reaches_the_restored_files(tmp_path):
    """A restore drops its tiles' filesystems (their bytes are new): a repl session waiting
    between two blocks keeps its names, and its next block reaches the restored files,
    in its current directory if the restored files have it, else in a removed one."""
    with ipuos.Machine("tiny") as machine:
        for tile in (3, 4):
            machine.fs.makedirs(tile, "/d/e")
            machine.fs.write_file(tile, "/d/e/f", b"imaged")
        _backup.backup(machine, tmp_path / "m.img")
        stays = machine.repl("3-4")  # (a multirepl)
        assert stays.run("import os\nos.chdir('/d/e')\nname = 'kept'\n").ok
        goes = machine.repl("0")
        assert goes.run("import os\nos.makedirs('/chip/new')\nos.chdir('/chip/new')\n").ok
        for tile in (3, 4):
            machine.fs.write_file(tile, "/d/e/f", b"changed")
        _backup.restore(machine, tmp_path / "m.img")
        machine.fs.listdir(3, "/")  # tile 3 up again before the next block, tile 4 not
        after = stays.run("print(name, os.getcwd(), open('f').read(), os.listdir('/d'))\n")
        assert after.outputs() == {3: "kept /d/e imaged ['e']\n", 4: "kept /d/e imaged ['e']\n"}, after.tiles
        gone = goes.run("print(os.listdir('/chip'))\ntry:\n    os.getcwd()\nexcept FileNotFoundError:\n"
                        "    print('in a removed directory')\n")
        assert gone.outputs() == {0: "[]\nin a removed directory\n"}, gone.tiles


def test_a_file_removed_while_open_keeps_its_tile_from_a_restore(tmp_path):
    """A file removed while open is open still (a host's filesystem stays busy with it):
    a restore under it would leave its writes landing nowhere, silently."""
    with ipuos.Machine("tiny") as machine:
        _backup.backup(machine, tmp_path / "m.img")
        repl = machine.repl("3")
        assert repl.run("import os\na = open('/gone', 'w')\na.write('A' * 3000)\nos.remove('/gone')\n").ok
        with pytest.raises(_backup.TilesInUse) as refused:
            _backup.restore(machine, tmp_path / "m.img")
        assert "tile 3: 1 file is open on it (1 removed while open)" in str(refused.value)
        assert repl.run("b = open('/b', 'w')\n").ok
        with pytest.raises(_backup.TilesInUse) as refused:
            _backup.restore(machine, tmp_path / "m.img")
        assert "tile 3: 2 files are open on it (/b; 1 removed while open)" in str(refused.value)
        assert repl.run("a.close()\nb.close()\n").ok
        _backup.restore(machine, tmp_path / "m.img")
        assert machine.fs.listdir(3, "/") == []


def _wait_holding_log(machine, tiles: str) -> None:
    """Until the program on ``tiles`` holds /log open with 'a' flushed and 'b' not (it
    then makes /ready): the job is listed before its tiles have run a line of it (a
    backup then found no file). (Reading /log would commit 'b': a reader sees the file
    as written.)"""
    first, _, last = tiles.partition("-")
    ready = " ".join(f"/tiles/{tile}/ready" for tile in range(int(first), int(last or first) + 1))
    wait_for(lambda: run_cli("shell", "-c", f"ls {ready}", env=machine.env()).returncode == 0,
             what=f"the program on tiles {tiles} to hold /log")


@pytest.mark.parametrize("tiles, told, held", [
    ("5", "1 file was open with writes not yet committed, and the image holds it as last committed (tile 5: /log)",
     "tile 5 holds 1 file open with writes not yet on its disk (/log)"),
    # (tiles alike are told once, for their range: on mk2, 1,472 clauses made one 24 KB line)
    ("5-9", "5 files were open with writes not yet committed, and the image holds them as last committed "
            "(tiles 5-9: /log)",
     "tiles 5-9 hold 1 file each open with writes not yet on their disks (/log)"),
])
def test_a_backup_names_files_whose_writes_it_could_not_take(machine, tmp_path, tiles, told, held):
    program = _write(tmp_path, "log = open('/log', 'w')\nlog.write('a')\nlog.flush()\nlog.write('b')\n"
                               "open('/ready', 'w').close()\nwhile True:\n    sync()\n")
    spin = subprocess.Popen([IPUOS, "run", "--tiles", tiles, program], env=machine.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_holding_log(machine, tiles)
        result = cli(machine, "backup", str(tmp_path / "m.img"))
        assert "backed up" in result.stdout
        assert f"note: {told}" in result.stderr, result.stderr
        assert run_cli("image", "cat", str(tmp_path / "m.img"), "5", "/log").stdout == "a"
        refused = cli(machine, "halt", "--if-saved", check=False)
        assert refused.returncode == 1
        assert held in refused.stderr, refused.stderr
    finally:
        spin.send_signal(signal.SIGINT)
        spin.communicate(timeout=30)
    cli(machine, "backup", str(tmp_path / "m.img"))  # the program's end closed the file
    assert run_cli("image", "cat", str(tmp_path / "m.img"), "5", "/log").stdout == "ab"
    assert "halted machine" in cli(machine, "halt", "--if-saved").stdout


def test_halt_if_saved_advises_a_backup_only_for_what_a_backup_would_save(machine, tmp_path):
    """Writes still in an open file are in no image, so a backup cannot save them: the
    refusal names the file, its tile and the program holding it, and says to end that
    program (which commits the writes) before a backup; once they are on the disk, a
    backup is what saves them."""
    program = _write(tmp_path, "log = open('/log', 'w')\nlog.write('a')\nlog.flush()\nlog.write('b')\n"
                               "open('/ready', 'w').close()\nwhile True:\n    sync()\n")
    spin = subprocess.Popen([IPUOS, "run", "--tiles", "5", program], env=machine.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_holding_log(machine, "5")
        (job,) = [j["job"] for j in json.loads(cli(machine, "ps", "--json").stdout)["jobs"]]
        cli(machine, "backup", str(tmp_path / "m.img"))  # all but the open file's last write
        refused = cli(machine, "halt", "--if-saved", check=False)
        assert refused.returncode == 1
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert (f"ipuos: machine {machine.name!r} was not halted because tile 5 holds 1 file open with writes "
                "not yet on its disk (/log), which no backup holds; close it or end the program holding it "
                f"(job {job} on tile 5: `ipuos kill {job} --name {machine.name}`), then back the machine up; "
                "or halt without --if-saved to discard those writes") in refused.stderr, refused.stderr
        assert "back it up first" not in refused.stderr
    finally:
        spin.send_signal(signal.SIGINT)
        spin.communicate(timeout=30)
    refused = cli(machine, "halt", "--if-saved", check=False)  # the program's end wrote them to the disk
    assert refused.returncode == 1
    assert ("was not halted because the disk of tile 5 changed since the last backup or restore; back it up first "
            f"(`ipuos halt --backup IMG --name {machine.name}` backs it up and halts), or halt without "
            "--if-saved to discard its files") in refused.stderr, refused.stderr
    cli(machine, "backup", str(tmp_path / "m.img"))
    assert "halted machine" in cli(machine, "halt", "--if-saved").stdout


def test_a_disk_backed_up_blank_and_then_only_read_is_saved(machine, tmp_path):
    """A tile formats its disk the first time it uses it, reading included: that changes
    its bytes, not its files."""
    cli(machine, "backup", str(tmp_path / "blank.img"))  # tiles 4-6 blank: never used
    cli(machine, "run", "--tiles", "4-6", _write(tmp_path, "import os\nprint(os.listdir('/'))\n"))
    cli(machine, "run", "--tiles", "5", _write(tmp_path, "open('/new', 'w').write('x')\n"))
    result = cli(machine, "halt", "--if-saved", check=False)
    assert result.returncode == 1
    assert "the disk of tile 5 changed since the last backup" in result.stderr
    cli(machine, "run", "--tiles", "5", _write(tmp_path, "import os\nos.remove('/new')\n"))
    result = cli(machine, "halt", "--if-saved")
    assert "halted machine" in result.stdout


def test_halt_backup_that_fails_after_stopping_the_programs_says_so(machine, tmp_path, host_tmpfs):
    """The programs stop first, so that the image holds what halting leaves; a backup
    that then fails (here: no space left) keeps the machine up and names the jobs."""
    full = host_tmpfs("size=4k")
    spin = subprocess.Popen([IPUOS, "run", "--tiles", "9", _write(tmp_path, "while True:\n    sync()\n")],
                            env=machine.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: "9 " in cli(machine, "ps").stdout.split("JOB")[-1], what="the spinning job")
        (job,) = [j["job"] for j in json.loads(cli(machine, "ps", "--json").stdout)["jobs"]]
        grow(machine, tmp_path, tiles="0-3")  # (an image of even an empty machine is over 4 KiB)
        result = cli(machine, "halt", "--backup", str(full / "m.img"), check=False)
        assert result.returncode == 1, result
        assert "No space left on device" in result.stderr
        assert f"was not halted, but its programs were stopped for the backup (job {job})" in result.stderr
        assert spin.wait(10) == 130  # interrupted
        # what its client says stays true now that the machine did not halt
        assert f"stopped by `ipuos halt --backup` of machine {machine.name!r}" in spin.stdout.read()
        assert os.listdir(full) == []  # no half-written image
        assert cli(machine, "status").returncode == 0
    finally:
        spin.kill()
        spin.wait()


def test_halt_backup_says_what_it_waits_for_and_what_became_of_a_program_that_runs_on(machine, tmp_path):
    """A program inside one long call into C code takes the interrupt only when the call
    returns. halt --backup says what it waits for, as backup does; cancelled meanwhile,
    it does not claim the program was stopped."""
    stuck = _write(tmp_path, "import hashlib\nhashlib.pbkdf2_hmac('sha256', b'p', b's', 20_000_000)\n")
    run = subprocess.Popen([IPUOS, "run", "--tiles", "5", stuck], env=machine.env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: json.loads(cli(machine, "ps", "--json").stdout)["jobs"], what="the job")
        (job,) = [j["job"] for j in json.loads(cli(machine, "ps", "--json").stdout)["jobs"]]
        err = _ctrl_c_once_waiting(machine, "halt", "--backup", str(tmp_path / "m.img"))
        assert (f"was not halted; job {job} was interrupted for the backup but has not stopped yet "
                "(a tile inside one long call into C code stops only when the call returns") in err, err
        assert "were stopped" not in err and not (tmp_path / "m.img").exists()
        assert run.wait(120) == 130  # (interrupted once the call returned)
        assert cli(machine, "status").returncode == 0  # not halted
    finally:
        run.kill()
        run.wait()


def test_halt_backup_writes_the_image_then_halts(machine, tmp_path):
    grow(machine, tmp_path, tiles="0-3")
    before = per_tile(listing(machine, tmp_path))
    spin = subprocess.Popen([IPUOS, "run", "--tiles", "9", _write(tmp_path, "while True:\n    sync()\n")],
                            env=machine.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: "9 " in cli(machine, "ps").stdout.split("JOB")[-1], what="the spinning job")
        for bad in (tmp_path / "no" / "such" / "dir.img", f"{tmp_path / 'newdir'}/"):
            result = cli(machine, "halt", "--backup", str(bad), check=False)
            assert result.returncode == 1, result
            assert "was not halted" in result.stderr or "not an image file" in result.stderr
        # a wrong path costs nothing: the program still runs
        assert spin.poll() is None and "9 " in cli(machine, "ps").stdout.split("JOB")[-1]
        assert not (tmp_path / "newdir").exists()
    finally:
        spin.kill()
        spin.wait()
    assert cli(machine, "status").returncode == 0  # still running
    image = tmp_path / "final.img"
    result = cli(machine, "halt", "--backup", str(image))
    assert f"after backing it up to {image}" in result.stdout
    assert run_cli("status", env=machine.env()).returncode == 3
    name = unique_name("again")
    assert run_cli("boot", "--restore", str(image), "--name", name).returncode == 0
    try:
        again = Booted(name, machine_paths(name), 0)
        assert per_tile(listing(again, tmp_path)) == before
    finally:
        run_cli("halt", "--name", name)


def test_a_ram_disk_is_in_no_image_and_outlives_a_restore(machine, tmp_path):
    """A RAM disk (``mount --ram``) is scratch space in tile 0's SRAM, not one of the
    machine's devices: a backup says it left it out, ``halt --if-saved`` counts its files
    as unsaved, and a restore of tile 0 leaves it mounted with its files."""
    image = tmp_path / "m.img"
    result = cli(machine, "backup", str(image))  # before /ram exists
    assert "RAM disk" not in result.stdout + result.stderr
    cli(machine, "shell", "-c", "mkdir /ram; mount --ram 16K /ram; echo kept > /ram/f")
    result = cli(machine, "backup", str(tmp_path / "with-ram.img"))
    assert "note: not in the image: the RAM disk on /ram of tile 0 (no backup takes RAM disks)" in result.stderr
    result = cli(machine, "halt", "--if-saved", check=False)
    assert result.returncode == 1
    assert ("the RAM disk on /ram of tile 0 holds files, which no backup takes; copy them to a disk, then "
            "back the machine up; or halt without --if-saved to discard them") in result.stderr, result.stderr
    assert "changed since the last backup" not in result.stderr and "back it up first" not in result.stderr
    # no backup would save them: refused before an image is written (or a program stopped),
    # saying so, and naming only what the backup would not have saved
    cli(machine, "shell", "-c", "echo changed > /tiles/2/changed")
    refused = cli(machine, "halt", "--if-saved", "--backup", str(tmp_path / "never.img"), check=False)
    assert refused.returncode == 1
    assert ("was not halted, nor backed up, because the RAM disk on /ram of tile 0 holds files, which no "
            "backup takes") in refused.stderr, refused.stderr
    assert "changed since" not in refused.stderr and "tile 2" not in refused.stderr
    assert "backed up to" not in refused.stderr and not (tmp_path / "never.img").exists()
    # with a program running it can tell only once the program is stopped: it says so
    spin = subprocess.Popen([IPUOS, "run", "--tiles", "3", _write(tmp_path, "while True:\n    sync()\n")],
                            env=machine.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: json.loads(cli(machine, "ps", "--json").stdout)["jobs"], what="the spinning job")
        refused = cli(machine, "halt", "--if-saved", "--backup", str(tmp_path / "stopped.img"), check=False)
    finally:
        out, _ = spin.communicate(timeout=30)
    assert refused.returncode == 1
    assert ("the RAM disk on /ram of tile 0 holds files, which no backup takes; copy them to a disk, then back "
            "the machine up; or halt without --if-saved to discard them (its programs were stopped and it was "
            f"backed up to {tmp_path / 'stopped.img'} first)") in refused.stderr, refused.stderr
    assert "stopped by `ipuos halt --backup`" in out and (tmp_path / "stopped.img").exists()
    cli(machine, "restore", str(image))  # (its / has no /ram: the mount point needs none)
    assert cli(machine, "shell", "-c", "cat /ram/f; ls /").stdout == "kept\nchip/\nram/\ntiles/\n"
    cli(machine, "shell", "-c", "umount /ram")
    assert "/ram" not in cli(machine, "shell", "-c", "mount; ls /").stdout
    mounted = cli(machine, "shell", "-c", "mkdir /ram; mount --ram 16K /ram")  # its SRAM was freed
    assert "mounted a 16K RAM disk" in mounted.stdout
    result = cli(machine, "halt", "--backup", str(image))
    assert "halted machine" in result.stdout
    assert "note: not in the image: the RAM disk on /ram of tile 0" in result.stderr


def _ctrl_c_once_waiting(booted, *args: str, signum: int = signal.SIGINT, sigint_ignored: bool = False) -> str:
    """Run ``ipuos ARGS``; once it says it waits for a tile to reach an exchange point,
    Ctrl-C it (or send ``signum``). Returns its stderr; it must end interrupted (status
    130), or by the signal. ``sigint_ignored``: started with SIGINT ignored, as a
    script's background job is."""
    command = subprocess.Popen([IPUOS, *args], env=booted.env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None)
    # not a terminal: no progress bar, but one line says what it waits for
    ready, _, _ = select.select([command.stderr], [], [], 30)
    assert ready and command.poll() is None
    note = command.stderr.readline()
    assert note.startswith("ipuos: waiting for 1 tile to reach an exchange point"), note
    command.send_signal(signum)
    out, err = command.communicate(timeout=60)
    assert command.returncode == (130 if signum == signal.SIGINT else -signum), (out, err)
    return err


def _write(tmp_path, text: str) -> str:
    path = tmp_path / f"p{abs(hash(text))}.py"
    path.write_text(text)
    return str(path)


def test_a_read_only_destination_is_named_as_such(host_tmpfs):
    readonly = host_tmpfs("ro,size=1m")
    with pytest.raises(_backup.BackupError, match="is on a read-only filesystem"):
        _backup.check_destination(str(readonly / "m.img"))


def test_a_destination_that_cannot_even_be_looked_at_is_refused_by_the_client(machine, tmp_path):
    """A name too long or a loop of symbolic links failed inside the daemon, as an internal
    error; a file where the directory should be was called a missing directory."""
    long_name = tmp_path / ("x" * 256)
    os.symlink("loop2.img", tmp_path / "loop1.img")
    os.symlink("loop1.img", tmp_path / "loop2.img")
    (tmp_path / "snap.py").write_text("print('a program, not a directory')\n")
    for path, why in ((long_name, "File name too long"), (tmp_path / "loop1.img", "Too many levels of symbolic links"),
                      (tmp_path / "snap.py" / "x.img", f"{tmp_path / 'snap.py'} is not a directory")):
        for command, after in ((["backup", str(path)], ""),
                               (["halt", "--backup", str(path)], f"; machine {machine.name!r} was not halted")):
            result = cli(machine, *command, check=False)
            assert (result.returncode, result.stderr) == (1, f"ipuos: cannot write {path}: {why}{after}\n"), result
    assert cli(machine, "status").returncode == 0  # (halt --backup refused it before stopping anything)
    assert sorted(os.listdir(tmp_path)) == ["loop1.img", "loop2.img", "snap.py"]


def test_an_image_that_cannot_be_read_is_named_with_the_reason(machine, tmp_path):
    """Every path a restore or an image command cannot read was "no such file", and a
    relative one was named as given; a trailing slash had advice for writing a file."""
    long_name = tmp_path / ("x" * 256)
    os.symlink("loop2.img", tmp_path / "loop1.img")
    os.symlink("loop1.img", tmp_path / "loop2.img")
    for arg, message in ((str(long_name), f"image {long_name}: File name too long"),
                         (str(tmp_path / "loop1.img"), f"image {tmp_path / 'loop1.img'}: Too many levels of symbolic links"),
                         ("missing/x.img", f"image {tmp_path / 'missing' / 'x.img'}: no such file"),
                         ("m.img/", "m.img/: not an image file name (it ends with /, which names a directory)")):
        for command in (["restore", arg], ["image", "info", arg], ["image", "ls", arg]):
            done = subprocess.run([IPUOS, *command], capture_output=True, text=True, env=machine.env(),
                                  cwd=tmp_path, timeout=60)
            assert (done.returncode, done.stderr) == (1, f"ipuos: {message}\n"), done


def test_a_backup_to_a_file_named_with_a_slash_is_told_to_drop_the_slash(machine, tmp_path):
    # (it was told to name a file inside it: n.img/machine.img, which cannot be made)
    (tmp_path / "n.img").write_bytes(b"x")
    done = subprocess.run([IPUOS, "backup", "n.img/"], capture_output=True, text=True, env=machine.env(),
                          cwd=tmp_path, timeout=60)
    assert (done.returncode, done.stderr) == (
        1, "ipuos: n.img/: not an image file name (it ends with /); to replace that file, drop the /\n")
    done = subprocess.run([IPUOS, "backup", "d/"], capture_output=True, text=True, env=machine.env(),
                          cwd=tmp_path, timeout=60)
    assert "name the file, e.g. d/machine.img" in done.stderr and done.returncode == 1
    assert (tmp_path / "n.img").read_bytes() == b"x" and not (tmp_path / "d").exists()


def test_a_backup_replaces_an_image_or_an_empty_file_and_nothing_else(machine, tmp_path):
    program = tmp_path / "prog.py"
    program.write_text("print('precious')\n")
    result = cli(machine, "backup", str(program), check=False)
    assert result.returncode == 1
    assert f"cannot write {program}: it exists and is not an ipuos image" in result.stderr
    assert program.read_text() == "print('precious')\n"
    empty = tmp_path / "new.img"
    empty.touch()
    cli(machine, "backup", str(empty))
    cli(machine, "backup", str(empty))  # (now an image: replaced again)
    assert run_cli("image", "verify", str(empty)).returncode == 0
    newer = tmp_path / "newer.img"  # a newer ipuos's backup: this one cannot read it, so keeps it
    raw = bytearray(empty.read_bytes())
    raw[8:10] = (FORMAT_VERSION + 1).to_bytes(2, "little")
    newer.write_bytes(raw)
    result = cli(machine, "backup", str(newer), check=False)
    assert result.returncode == 1
    assert (f"cannot write {newer}: it exists and is an image of format version {FORMAT_VERSION + 1}, "
            "written by a newer ipuos") in result.stderr
    assert newer.read_bytes() == raw


def test_a_backup_does_not_replace_a_read_only_file(machine, tmp_path):
    """A kept image made read-only is guarded against a mistyped backup (the image is
    written beside it and renamed over it, which the file's mode alone does not stop)."""
    kept = tmp_path / "golden.img"
    cli(machine, "backup", str(kept))
    kept.chmod(0o444)
    before = kept.read_bytes()
    result = cli(machine, "backup", str(kept), check=False)
    assert result.returncode == 1
    assert f"cannot write {kept}: it exists and is read-only (mode 0444)" in result.stderr
    assert kept.read_bytes() == before


#: the root these tests run as, with no power to read or write others' files: as a user
_AS_A_USER = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
              "--bounding-set=-dac_override,-dac_read_search"]


def test_a_file_a_backup_cannot_read_is_not_replaced(runtime_dir, tmp_path):
    """It cannot be told from a document, so it is kept; an empty one is replaced, by an
    image its owner can read (the old mode was kept whole, and restored nothing)."""
    name = unique_name("unread")
    env = dict(os.environ)
    subprocess.run(_AS_A_USER + [IPUOS, "boot", "--preset", "tiny", "--name", name], check=True,
                   capture_output=True, env=env, timeout=60)
    try:
        notes = tmp_path / "notes.txt"
        notes.write_text("precious\n")
        notes.chmod(0o200)
        done = subprocess.run(_AS_A_USER + [IPUOS, "backup", "--name", name, str(notes)], capture_output=True,
                              text=True, env=env, timeout=60)
        assert done.returncode == 1, done
        assert (f"cannot write {notes}: it exists and cannot be read to tell whether it is an ipuos image "
                "(Permission denied)") in done.stderr
        notes.chmod(0o600)
        assert notes.read_text() == "precious\n"
        empty = tmp_path / "empty.img"
        empty.touch()
        empty.chmod(0o200)  # (write-only: 0 would be read-only, which is kept)
        done = subprocess.run(_AS_A_USER + [IPUOS, "backup", "--name", name, str(empty)], capture_output=True,
                              text=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr
        assert stat.S_IMODE(empty.stat().st_mode) == 0o600
        assert subprocess.run(_AS_A_USER + [IPUOS, "image", "verify", str(empty)], capture_output=True,
                              env=env, timeout=60).returncode == 0
    finally:
        Booted(name, machine_paths(name), 0).halt()


def test_cli_errors_and_exit_codes(machine, tmp_path):
    image = tmp_path / "m.img"
    cli(machine, "backup", str(image))
    result = cli(machine, "backup", str(image), "--tiles", "3-99", check=False)
    assert result.returncode == 2 and "no tile 99" in result.stderr
    result = cli(machine, "restore", str(image), "--tiles", "x", check=False)
    assert result.returncode == 2 and "bad tile specification" in result.stderr
    result = cli(machine, "restore", str(tmp_path / "missing.img"), check=False)
    assert result.returncode == 1 and "no such file" in result.stderr
    (tmp_path / "junk.img").write_bytes(b"junk" * 100)
    result = cli(machine, "restore", str(tmp_path / "junk.img"), check=False)
    assert result.returncode == 1 and "is not an ipuos image" in result.stderr
    result = cli(machine, "backup", str(tmp_path), check=False)
    assert result.returncode == 2 and "is a directory" in result.stderr
    for command in ("backup", "restore"):  # a trailing slash names a directory, as for cp
        result = cli(machine, command, f"{tmp_path / 'newdir'}/", check=False)
        assert result.returncode == 1 and "not an image file" in result.stderr
        assert not (tmp_path / "newdir").exists()
    for args in (["backup", ""], ["restore", ""], ["halt", "--backup", ""]):
        result = cli(machine, *args, check=False)
        assert result.returncode == 1 and "an empty image path names no file" in result.stderr, result
    # "-" is no file: an image cannot be streamed (a backup replaces its file once complete)
    for args in (["backup", "-"], ["restore", "-"], ["halt", "--backup", "-"], ["boot", "--restore", "-"]):
        done = subprocess.run([IPUOS, *args], capture_output=True, text=True, env=machine.env(),
                              cwd=tmp_path, timeout=60)
        assert done.returncode == 1 and "'-': an image is a file, not standard input or output" in done.stderr, done
        assert not (tmp_path / "-").exists()
    # paths mean what they mean where the command runs, not in the daemon
    done = subprocess.run([IPUOS, "backup", "/proc/self/cwd/here.img"], capture_output=True, text=True,
                          env=machine.env(), cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done
    assert f"to {tmp_path / 'here.img'}:" in done.stdout
    assert cli(machine, "image", "verify", str(tmp_path / "here.img")).returncode == 0
    # an image replaces a file, nothing else; through a link, the file it names
    os.mkfifo(tmp_path / "pipe")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "sock"))
    try:
        for name, kind in (("pipe", "a named pipe"), ("sock", "a socket")):
            result = cli(machine, "backup", str(tmp_path / name), check=False)
            assert result.returncode == 1, result
            assert f"it exists and is not a regular file ({kind})" in result.stderr
        assert stat.S_ISFIFO(os.lstat(tmp_path / "pipe").st_mode)
        assert stat.S_ISSOCK(os.lstat(tmp_path / "sock").st_mode)
    finally:
        listener.close()
    (tmp_path / "target.img").write_bytes(b"")
    os.symlink("target.img", tmp_path / "link.img")
    cli(machine, "backup", str(tmp_path / "link.img"))
    assert os.readlink(tmp_path / "link.img") == "target.img"
    assert cli(machine, "image", "verify", str(tmp_path / "target.img")).returncode == 0
    # a name that is not UTF-8 would reach the daemon changed, naming another file
    undecodable = os.fsdecode(os.fsencode(tmp_path) + b"/m\xff.img")
    (tmp_path / "m\\udcff.img").write_bytes(b"")  # what it would have become
    for args in (["backup", undecodable], ["restore", undecodable], ["halt", "--backup", undecodable]):
        result = cli(machine, *args, check=False)
        assert result.returncode == 1 and "is not UTF-8" in result.stderr, result
    assert sorted(os.listdir(tmp_path)).count("m\\udcff.img") == 1
    assert not any(name.startswith("m\udcff") for name in os.listdir(tmp_path))
    nobody = unique_name("nobody")
    result = run_cli("backup", str(image), "--name", nobody)
    assert result.returncode == 3 and f"no machine named {nobody!r} is running" in result.stderr
    result = run_cli("boot", "--restore", str(tmp_path / "junk.img"), "--name", nobody)
    assert result.returncode == 1 and "is not an ipuos image" in result.stderr and "no machine was started" in result.stderr
    from backup_craft import TINY_META, write_tiny_image

    for meta, message in (({"ipus": 99999}, "was taken on a machine of 99999 IPUs; this ipuos makes 1 to 64"),
                          ({"preset": "nope"}, "was taken on a 'nope' machine, which this ipuos does not know")):
        crafted = tmp_path / "crafted.img"
        write_tiny_image(crafted, {"tile/0/disk": None}, meta={**TINY_META, **meta})
        result = run_cli("boot", "--restore", str(crafted), "--name", nobody)
        assert result.returncode == 1 and result.stderr == f"ipuos: image {crafted} {message}; no machine was started\n"
        assert not machine_paths(nobody).socket.exists()
    summary = json.loads(cli(machine, "backup", str(image), "--json").stdout)
    assert summary["device_count"] == 17 and summary["digest_algorithm"] == "blake3"
    restored = json.loads(cli(machine, "restore", str(image), "--json").stdout)
    assert restored["device_count"] == 17
    assert summary["name"] == restored["name"] == machine.name  # (as in every machine's --json)
    assert summary["description"] == restored["description"] == "16 tile disks (0-15) and the chip disk"
    # a key the commands share means the same thing in each ("devices" is image info's list)
    info = json.loads(run_cli("image", "info", str(image), "--json").stdout)
    for other in (summary, restored):
        assert {key: type(info[key]) for key in set(info) & set(other)} == \
               {key: type(other[key]) for key in set(info) & set(other)}


def test_restore_onto_another_kind_of_machine_is_refused(machine, tmp_path):
    image = tmp_path / "tiny.img"
    cli(machine, "backup", str(image))
    name = unique_name("mk1")
    boot = run_cli("boot", "--preset", "mk1", "--restore", str(image), "--name", name, timeout=120)
    assert boot.returncode == 1
    assert "was taken on another kind of machine: preset 'tiny' (this machine: 'mk1')" in boot.stderr
    assert boot.stderr.rstrip().endswith("no machine was started"), boot.stderr
    assert run_cli("status", "--name", name).returncode == 3  # nothing left running


@pytest.mark.parametrize("signum, sigint_ignored", [(signal.SIGINT, False), (signal.SIGTERM, False),
                                                    (signal.SIGTERM, True)],
                         ids=["ctrl-c", "sigterm", "sigterm-in-a-background-job"])
def test_ctrl_c_cancels_a_backup_waiting_for_a_busy_tile(machine, tmp_path, signum, sigint_ignored):
    """(SIGTERM too, saying so, and the client then ends by it: it died silently; and
    with SIGINT ignored, as in a script's `ipuos backup ... &`, it did nothing at all.)"""
    image = tmp_path / "m.img"
    image.write_bytes(MAGIC + b"the old image")
    busy = subprocess.Popen([IPUOS, "run", "--tiles", "3", _write(tmp_path, """
x = 0
for i in range(80_000_000):  # seconds of pure compute: no exchange point to freeze at
    x ^= i
print(x)
""")], env=machine.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.0)  # tile 3 now computes without an exchange point: it cannot freeze
    # (tile 3 holds up the others: it is the one the note counts)
    err = _ctrl_c_once_waiting(machine, "backup", str(image), signum=signum, sigint_ignored=sigint_ignored)
    assert f"backup cancelled; {image} was not written" in err, err
    busy.communicate(timeout=60)
    assert image.read_bytes() == MAGIC + b"the old image"
    assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in tmp_path.iterdir())
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    cli(machine, "backup", str(image))  # the machine is fine
    assert run_cli("image", "verify", str(image)).returncode == 0


def test_an_image_of_a_bigger_machine_is_refused_as_such(tmp_path):
    # not as "a decompression bomb": the image is fine, the machine is the wrong size
    image = tmp_path / "three.img"
    with ipuos.Machine("tiny", ipus=3) as big:
        _backup.backup(big, image)
    with ipuos.Machine("tiny") as small:
        with pytest.raises(_backup.BackupError, match="taken on another kind of machine: ipus 3") as info:
            _backup.restore(small, image)
        assert "(no --preset or --ipus) starts a machine like it" in str(info.value)


@pytest.mark.parametrize("preset", [PRESETS["tiny"].replace(name="custom"),
                                    PRESETS["tiny"].replace(disk_size=8 * KiB)],
                         ids=["unknown-preset", "own-geometry"])
def test_an_image_no_boot_can_match_is_refused_without_suggesting_one(tmp_path, preset):
    """`ipuos boot --restore` starts the image's preset with its IPUs: for an image of a
    preset this ipuos lacks, or of a machine given its own geometry, it could not."""
    image = tmp_path / "odd.img"
    with ipuos.Machine(preset) as odd:
        _backup.backup(odd, image)
    with ipuos.Machine("tiny", ipus=2) as other:
        with pytest.raises(_backup.BackupError, match="taken on another kind of machine") as info:
            _backup.restore(other, image)
    message = str(info.value)
    assert "boot --restore" not in message, message
    assert message.endswith("Nothing was restored; this ipuos cannot start a machine like it "
                            "(`ipuos image extract` copies its files out without one)"), message


def test_an_empty_machine_image_is_small(tmp_path):
    with ipuos.Machine("mk2") as machine:
        summary = _backup.backup(machine, tmp_path / "empty.img")
        assert summary["file_size"] < 64 * KiB and summary["device_count"] == 1473
        machine.run("import os\nos.listdir('/')\n")  # every disk formatted, still empty
        summary = _backup.backup(machine, tmp_path / "formatted.img")
        assert summary["file_size"] < 1024 * KiB
        assert _backup.unsaved(machine) == []


def test_the_chip_disk_layout_is_the_striped_devices(tmp_path):
    """``_backup_devices`` reads the chip disk's stripes itself; it must agree with what
    the striped device reads, block for block, both ways."""
    from ipuos._backup_devices import Residency, machine_devices

    with ipuos.Machine("tiny") as machine:
        machine.fs.write_file(0, "/chip/data", random.Random(1).randbytes(30 * KiB))
        machine.fs.sync(0)
        device_view = machine.fs.snapshot(0, "/chip")["data"]
        chip = next(d for d in machine_devices(machine) if d.name == "chip")
        data, ranges = chip.read(Residency.of(machine.sram))
        assert bytes(data) == device_view
        inside = bytearray(len(data))
        for offset, length in ranges:
            inside[offset : offset + length] = data[offset : offset + length].tobytes()
        assert bytes(inside) == device_view  # nothing non-zero outside the ranges
        # written through the layout, read back by the device (after a remount)
        other = bytearray(device_view)
        other[: 16] = b"not a superblock"
        chip.write(bytes(other))
        assert machine.fs.snapshot(0, "/chip")["data"] == bytes(other)
        chip.write(device_view)
        machine.fs.remount(0, "/chip")
        assert machine.fs.read_file(0, "/chip/data") == random.Random(1).randbytes(30 * KiB)


def test_a_failed_tile_stops_a_backup_before_anything_is_written(tmp_path):
    with ipuos.Machine("tiny") as machine:
        machine.fs.write_file(5, "/f", b"x")
        machine.scheduler.fail_tile(5)
        with pytest.raises(_backup.BackupError) as excinfo:
            _backup.backup(machine, tmp_path / "x.img")
        assert "tile 5: tile 5 is not answering" in str(excinfo.value)
        assert "was not written" in str(excinfo.value)
        assert list(tmp_path.iterdir()) == []
        machine.scheduler.fail_tile(5, failed=False)
        _backup.backup(machine, tmp_path / "x.img", "5")  # every tile was released
        assert machine.fs.read_file(5, "/f") == b"x"


def test_progress_shows_on_a_terminal_and_nowhere_else(machine, tmp_path):
    """On a terminal (a real pty) a progress bar, gone when done; piped, not a byte."""
    import pexpect

    child = pexpect.spawn(IPUOS, ["backup", str(tmp_path / "tty.img")], env=machine.env(),
                          encoding="utf-8", timeout=60)
    child.expect(pexpect.EOF)
    child.close()
    shown = child.before
    assert child.exitstatus == 0, shown
    assert "backing up" in shown and "━" in shown  # the bar, with its phase
    assert shown.splitlines()[-1].split("\x1b[2K")[-1].startswith("backed up 16 tile disks")
    piped = cli(machine, "backup", str(tmp_path / "piped.img"))
    assert piped.stderr == "" and "backing up" not in piped.stdout
    assert piped.stdout.startswith("backed up 16 tile disks")


def test_times_a_full_disk_had_no_room_for_are_told_by_backup_and_halt_if_saved(machine, tmp_path):
    # a disk so full that the times of its files stay in memory: an image of it lacks
    # them; the backup says so, halt --if-saved refuses, and with room they are saved
    fill = _write(tmp_path, "import os\nfor i in range(12):\n    try:\n"
                            "        with open('/f%d' % i, 'wb') as f:\n            f.write(b'x' * 1500)\n"
                            "    except OSError:\n        os.remove('/f%d' % i)\n        break\n")
    assert cli(machine, "run", "--tiles", "3", fill).returncode == 0
    image = tmp_path / "full.img"
    result = cli(machine, "backup", str(image), "--tiles", "3")
    told = re.search(r"note: not in the image: the modification times of (\d+) files and directories on the disk of tile 3, "
                     r"which is too full to write them \(free some space on it, then back up again\)",
                     result.stderr)
    assert told, result.stderr
    refused = cli(machine, "halt", "--if-saved", check=False)
    assert refused.returncode == 1
    assert (f"the modification times of {told.group(1)} files and directories on the disk of tile 3 are not on it (it is too full "
            "to write them), and no backup holds them") in refused.stderr, refused.stderr
    assert "free some space on the full disk" in refused.stderr
    cli(machine, "run", "--tiles", "3", _write(tmp_path, "import os\nos.remove('/f0'); os.remove('/f1')\n"))
    result = cli(machine, "backup", str(image), "--tiles", "3")
    assert "modification times" not in result.stderr, result.stderr
    listing = json.loads(cli(machine, "image", "ls", str(image), "3", "--json").stdout)
    entries = listing if isinstance(listing, list) else listing.get("entries", listing)
    assert len(entries) >= 8 and all(e["mtime_ns"] for e in entries), listing


def test_times_full_disks_had_no_room_for_are_told_once_for_a_range_of_tiles(machine, tmp_path):
    """(On mk2, one note per tile made 1,472 lines, and halt's refusal one 200 KB line.)"""
    fill = _write(tmp_path, "import os\nfor i in range(12):\n    try:\n"
                            "        with open('/f%d' % i, 'wb') as f:\n            f.write(b'x' * 1500)\n"
                            "    except OSError:\n        os.remove('/f%d' % i)\n        break\n")
    assert cli(machine, "run", "--tiles", "2-4", fill).returncode == 0
    result = cli(machine, "backup", str(tmp_path / "full.img"), "--tiles", "2-4")
    notes = [line for line in result.stderr.splitlines() if "modification times" in line]
    assert len(notes) == 1, result.stderr
    assert re.fullmatch(r"ipuos: note: not in the image: the modification times of \d+( to \d+)? files and directories each on "
                        r"the disks of tiles 2-4, which are too full to write them \(free some space on them, "
                        r"then back up again\)", notes[0]), notes
    refused = cli(machine, "halt", "--if-saved", check=False)
    assert refused.returncode == 1
    assert re.search(r"the modification times of \d+( to \d+)? files and directories each on the disks of tiles 2-4 are "
                     r"not on "
                     r"them \(they are too full to write them\), and no backup holds them", refused.stderr), refused.stderr
    assert refused.stderr.count("modification times") == 1


def test_the_words_for_times_left_out_count_entries_per_tile():
    from ipuos._diskwords import disks_of, times_alike

    # (a directory's time is counted with the files': "30 files" was said of 29 and "/")
    assert times_alike({(2, "/"): 1, (3, "/"): 1}) == [([2, 3], "/", "1 file or directory each")]
    assert times_alike({(4, "/"): 7, (2, "/"): 3, (3, "/"): 7, (2, "/img"): 1}) == [
        ([2, 3, 4], "/", "3 to 7 files and directories each"), ([2], "/img", "1 file or directory")]
    assert (disks_of("/", [2, 3, 4]), disks_of("/img", [2])) == ("the disks of tiles 2-4", "/img of tile 2")


def test_a_backup_waiting_for_tiles_another_holds_says_so(tmp_path):
    # (a second backup of a machine waited, saying "a program is computing" while no
    # program ran: the first backup held the tiles)
    from ipuos._backup_freeze import Freeze, FreezeCancelled

    with ipuos.Machine("tiny") as machine:
        notes = []
        with Freeze(machine, range(4), "the first backup") as first:
            first.hold()
            with pytest.raises(FreezeCancelled):
                with Freeze(machine, range(2, 6), "the second") as second:
                    second.hold(waiting=lambda tiles, elsewhere: notes.append((tiles, elsewhere)), timeout=1.5)
        assert notes and all(note == ([2, 3], True) for note in notes), notes
        events = []
        _backup.backup(machine, tmp_path / "m.img", progress=lambda *event: events.append(event))
        assert not any(event[0] in ("waiting", "queued") for event in events)  # (all let go)


def test_the_client_names_what_a_backup_waits_for(capsys):
    from ipuos._cli_backup import _Progress

    for phase, expected in (("queued", "waiting for another backup, restore or check of this machine to let go "
                                       "of 3 tiles (Ctrl-C cancels)"),
                            ("waiting", "waiting for 3 tiles to reach an exchange point (a program is computing; "
                                        "Ctrl-C cancels)")):
        progress = _Progress(False, notes=True)  # (not a terminal: one line, once)
        progress.update(phase, 3, 3)
        progress.update(phase, 2, 3)
        assert capsys.readouterr().err == f"ipuos: {expected}\n"


class _CtrlCWhileRestoring(Client):
    """A client whose user presses Ctrl-C as the daemon starts writing the tiles (the
    restore is past the point where it could stop)."""

    pressed = 0

    def _event(self, header: dict) -> dict:
        event = super()._event(header)
        if event.get("phase") == "restoring" and not self.pressed:
            self.pressed += 1
            signal.raise_signal(signal.SIGINT)
        return event


@pytest.mark.parametrize("terminal", [False, True], ids=["no-terminal", "progress-bar"])
def test_a_ctrl_c_too_late_to_cancel_a_restore_says_it_went_on(machine, tmp_path, capsys, monkeypatch, terminal):
    """It said nothing, exit status 0; on a terminal, the progress bar it had closed was
    updated again, and the client died of a KeyError."""
    from ipuos import _cli_backup

    monkeypatch.setattr(_cli_backup, "_stderr_is_terminal", lambda: terminal)
    image = tmp_path / "m.img"
    cli(machine, "backup", str(image))
    with _CtrlCWhileRestoring(machine_paths(machine.name)) as client:
        summary = _cli_backup._progress_call(client, "restore", {"path": str(image), "tiles": None}, False,
                                             "the machine is still finishing its restore")
    assert client.pressed == 1 and summary["device_count"] == 17
    err = capsys.readouterr().err
    assert "ipuos: too late to cancel: the restore was past the point of no return, and it went on to the end\n" in err
    assert ("cancelling... (Ctrl-C again to stop waiting)" in err) is terminal
