"""What every command does when its output cannot be written: a full disk says so in one
line with status 1, a reader that has gone (``| head``) ends it quietly. Real processes:
the output must reach a real file descriptor."""

from __future__ import annotations

import os
import subprocess

import pytest
from backup_craft import littlefs_device, write_tiny_image
from daemon_harness import IPUOS, runtime_dir, shared_machine  # noqa: F401  (fixtures)

#: a program whose output (about 900 KiB) no pipe or small disk takes in one write
LOUD = "for i in range(800):\n    print(__tileid, i, 'x' * 60)\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A small program, a loud one and an image, by the names the commands below use."""
    root = tmp_path_factory.mktemp("out")
    (root / "one.py").write_text("print(1)\n")
    (root / "loud.py").write_text(LOUD)
    write_tiny_image(root / "m.img", {"chip": bytes(littlefs_device({"/f": b"on the chip\n"}, blocks=480))})
    return root


def ipuos(machine, files, command: str, stdout, **options) -> subprocess.CompletedProcess:
    args = [arg.format(files=files) for arg in command.split()]
    return subprocess.run([IPUOS, *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                          env=machine.env(), timeout=60, **options)


@pytest.mark.parametrize("command", [
    "status", "ps --json", "machines", "run {files}/one.py --tiles 0", "image info {files}/m.img",
    "image cat {files}/m.img chip /f",
])
def test_output_to_a_full_disk_is_one_line_and_status_1(shared_machine, files, command):
    with open("/dev/full", "w") as full:
        result = ipuos(shared_machine, files, command, full)
    assert (result.returncode, result.stderr) == (1, "ipuos: write error: No space left on device\n")


@pytest.mark.parametrize("command", ["status", "ps --json", "image ls {files}/m.img", "image cat {files}/m.img chip /f"])
def test_output_to_a_closed_descriptor_is_one_line_and_status_1(shared_machine, files, command):
    """``ipuos image cat IMG chip /f >&-``: a traceback, or, from the others, status 0
    with the output lost without a word."""
    result = ipuos(shared_machine, files, command, None, pass_fds=(), preexec_fn=lambda: os.close(1))
    assert (result.returncode, result.stderr) == (1, "ipuos: write error: Bad file descriptor\n")


def test_output_a_nearly_full_disk_takes_only_part_of_is_an_error(shared_machine, files, host_tmpfs):
    """The disk takes part of a large write: Python's stdout returned, dropping the rest,
    and the command exited 0 with its output cut short."""
    small = host_tmpfs("size=64k")
    with open(small / "out", "w") as out:
        result = ipuos(shared_machine, files, "run {files}/loud.py --tiles 0-15", out)
    assert (result.returncode, result.stderr) == (1, "ipuos: write error: No space left on device\n")


def test_a_reader_that_goes_away_ends_the_command_quietly(shared_machine, files):
    """``ipuos run loud.py | head -1``: no traceback, no message; status 1, not 0 (its
    output was cut short)."""
    reading, writing = os.pipe()
    with os.fdopen(reading) as pipe:
        command = subprocess.Popen([IPUOS, "run", str(files / "loud.py"), "--tiles", "0-15"], stdout=writing,
                                   stderr=subprocess.PIPE, text=True, env=shared_machine.env())
        os.close(writing)
        assert pipe.readline() == "[1 tile: 0]\n"
    _, errors = command.communicate(timeout=60)
    assert (command.returncode, errors) == (1, "")
