"""The multirepl through a real daemon: ``ipuos repl`` and ``multirepl`` in the shell.

Every block goes to every selected tile as one job; namespaces persist between blocks;
output and exceptions are grouped by identical text, most frequent first, capped with an
"N more distinct outputs" line. The scale tests run on a full mk2 chip (1472 tiles).
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import threading
import time

import pytest
from daemon_harness import IPUOS, boot_machine, runtime_dir, shared_machine  # noqa: F401


def repl(booted, code=None, *args, stdin=None, timeout=120):
    command = [IPUOS, "repl", *args] + (["-c", code] if code is not None else [])
    return subprocess.run(command, input=stdin, capture_output=True, text=True, env=booted.env(),
                          timeout=timeout)


def groups(text: str) -> list[tuple[str, str]]:
    """[(header, body), ...] of grouped output."""
    parts = re.split(r"^(\[\d+ tiles?: [^\]]*\])\n", text, flags=re.M)
    return [(parts[i], parts[i + 1]) for i in range(1, len(parts), 2)]


def test_state_persists_and_output_is_grouped(shared_machine):
    done = repl(shared_machine, "x = __tileid * __tileid\nprint(x % 3)\nprint(x % 3 == 1, __numtiles)",
                "--tiles", "0-8")
    assert done.returncode == 0, done.stderr
    assert groups(done.stdout) == [
        ("[6 tiles: 1-2,4-5,7-8]", "1\n"), ("[3 tiles: 0-6:3]", "0\n"),
        ("[6 tiles: 1-2,4-5,7-8]", "True 9\n"), ("[3 tiles: 0-6:3]", "False 9\n"),
    ]


def test_exceptions_are_grouped_like_output(shared_machine):
    done = repl(shared_machine, "print(12 // (__tileid % 4))", "--tiles", "0-7")
    assert done.returncode == 1
    found = dict(groups(done.stdout))
    assert found["[2 tiles: 0,4]"].startswith("Traceback (most recent call last):\n")
    assert found["[2 tiles: 0,4]"].endswith("ZeroDivisionError: integer division or modulo by zero\n")
    assert found["[2 tiles: 1,5]"] == "12\n" and found["[2 tiles: 3,7]"] == "4\n"


def test_blocks_from_a_pipe_with_collectives(shared_machine):
    code = ("def gathered():\n    return allgather(__tileid * 2)\n\n"
            "for step in range(2):\n    sync()\n\n"
            "g = gathered()\n"
            "if __tileid == 0:\n    print(g)\n")
    done = repl(shared_machine, None, "--tiles", "0-3", stdin=code)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[1 tile: 0]\n[0, 2, 4, 6]\n"


def test_syntax_errors_and_bad_tiles(shared_machine):
    done = repl(shared_machine, "x = = 1", "--tiles", "0-1")
    assert done.returncode == 1
    assert "SyntaxError: invalid syntax" in done.stderr and "Traceback" not in done.stderr
    done = repl(shared_machine, "pass", "--tiles", "0-99")
    assert done.returncode == 2
    assert done.stderr.startswith("multirepl: --tiles: bad tile specification '0-99'")


def test_the_same_text_everywhere_is_shown_once(shared_machine):
    done = repl(shared_machine, "print('same everywhere')\nprint('')\npass")
    assert done.returncode == 0
    assert done.stdout == "[16 tiles: 0-15]\nsame everywhere\n[16 tiles: 0-15]\n\n"


def test_multirepl_inside_the_shell_reads_a_host_data_file(shared_machine, tmp_path):
    (tmp_path / "numbers").write_text("1\n2\n3\n4\n")
    script = ("cd /tiles/1\n"
              "multirepl --tiles 0-3 --data numbers\n"
              "value = int(__tiledata)\n"
              "print(allreduce(value, 'max'))\n"
              "exit()\n"
              "pwd\n")
    done = subprocess.run([IPUOS, "shell"], input=script, capture_output=True, text=True,
                          cwd=tmp_path, env=shared_machine.env(), timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "[4 tiles: 0-3]\n4\n/tiles/1\n"


_DID_NOT_START = ("multirepl: did not start, so the script stops here (the lines after it are its "
                  "input, not shell commands)\n")


def _shell_script(booted, script: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([IPUOS, "shell"], input=script, capture_output=True, text=True, cwd=cwd,
                          env=booted.env(), timeout=60)


def test_a_data_file_more_than_the_tiles_can_hold_is_refused_unread(shared_machine, tmp_path):
    """The terminal reads no more of the host file than the tiles' SRAM could hold (and
    a byte more): it used to read it whole, and an endless one (/dev/zero, a FIFO) until
    the host's memory ran out, or a huge one failed with a MemoryError traceback."""
    with open(tmp_path / "huge", "wb") as file:
        file.truncate(1 << 40)  # (sparse: a terabyte that takes no room)
    done = _shell_script(shared_machine, "multirepl --tiles 1 --data huge\nprint('ran')\n", tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == ("multirepl: huge: 1099511627776 bytes is more than tile 1 can hold (65536 bytes "
                           "of SRAM, some of it in use); give less data, or more tiles (--tiles)\n"
                           + _DID_NOT_START)
    # a FIFO whose writer would go on and on (16 MiB here, not for ever: the terminal
    # used to read it all): it is read as far as the bound only, then closed
    fifo = tmp_path / "endless"
    os.mkfifo(fifo)
    chunk = b"line\n" * 1024
    written, cut_short = [], []

    def write_on_and_on():
        try:
            with open(fifo, "wb") as pipe:
                for _ in range((16 << 20) // len(chunk)):
                    pipe.write(chunk)
                    written.append(len(chunk))
        except BrokenPipeError:  # the terminal has read all it wants, and closed its end
            cut_short.append(True)

    writer = threading.Thread(target=write_on_and_on, daemon=True)
    writer.start()
    done = _shell_script(shared_machine, "multirepl --tiles 1-2 --data endless\nprint('ran')\n", tmp_path)
    writer.join(30)
    assert cut_short and sum(written) < 1 << 20
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == ("multirepl: endless: gives more than tiles 1-2 can hold (131072 bytes: 65536 bytes "
                           "of SRAM each, some of it in use); give less data, or more tiles (--tiles)\n"
                           + _DID_NOT_START)


def test_data_that_does_not_fit_in_the_tiles_sram_does_not_start_the_multirepl(shared_machine, tmp_path):
    """Each tile keeps its share of the data in SRAM for the session: a share that does
    not fit used to start the session anyway, and then fail every block, on every tile,
    with a MemoryError, never running the user's code."""
    (tmp_path / "lines").write_text("line 0000\n" * 11000)  # 110000 bytes: 55000 a tile
    done = _shell_script(shared_machine, "multirepl --tiles 1-2 --data lines\nx = 1\nprint(x)\n", tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert re.fullmatch(r"multirepl: the data \(110000 bytes\) does not fit in the SRAM of 2 tiles \(1-2\): "
                        r"tile 1's share is 55000 bytes, and it has room for \d+ \(the largest free block of each "
                        r"tile adds up to \d+ bytes\); give less data, or spread it over more tiles\n" + re.escape(_DID_NOT_START),
                        done.stderr)
    # ipuos repl says so too, and does not start either
    done = repl(shared_machine, "print('ran')", "--tiles", "1-2", "--data", str(tmp_path / "lines"))
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("multirepl: the data (110000 bytes) does not fit in the SRAM of 2 tiles")
    # spread over enough tiles, it fits
    script = "multirepl --tiles 1-15 --data lines\ntotal = allreduce(len(__tiledata))\nif __tileid == 0:\n    print(total)\n"
    done = _shell_script(shared_machine, script, tmp_path)
    assert (done.returncode, done.stderr, done.stdout) == (0, "", "[1 tile: 1]\n110000\n")


def test_the_data_file_may_be_a_pattern_that_matches_one_file(shared_machine, tmp_path):
    """As put's host file: expanded on the host, and it must match one file."""
    (tmp_path / "words1.txt").write_text("a\nb\n")
    for option in ("--data words*.txt", "--data=w?rds1.txt"):
        done = _shell_script(shared_machine, f"multirepl --tiles 1-2 {option}\nprint(repr(__tiledata))\n",
                             tmp_path)
        assert (done.returncode, done.stderr) == (0, ""), option
        assert done.stdout == "[1 tile: 1]\n'a\\n'\n[1 tile: 2]\n'b\\n'\n", option
    (tmp_path / "words2.txt").write_text("c\n")
    done = _shell_script(shared_machine, "multirepl --tiles 1-2 --data words*.txt\nprint('ran')\n", tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "multirepl: words*.txt: matches 2 files; --data takes one\n" + _DID_NOT_START
    done = _shell_script(shared_machine, "multirepl --tiles 1-2 --data none*.txt\nprint('ran')\n", tmp_path)
    assert (done.returncode, done.stderr) == (1, "multirepl: none*.txt: matches no file\n" + _DID_NOT_START)
    # quoted, the characters are the file's name
    done = _shell_script(shared_machine, "multirepl --tiles 1-2 --data 'words*.txt'\nprint('ran')\n", tmp_path)
    assert (done.returncode, done.stderr) == (1, "multirepl: words*.txt: No such file or directory\n"
                                                 + _DID_NOT_START)


_GOODBYE = ("class Goodbye:\n    def __del__(self):\n        print('bye from', __physical_tile)\n"
            "        with open('/goodbye.txt', 'w') as file:\n"
            "            file.write(f'written by tile {__physical_tile}')\n\n"
            "goodbye = Goodbye()\n")


def test_leaving_shows_what_the_tiles_print_as_they_let_go(shared_machine):
    """As at the end of a program (or of Python's own REPL), each object's __del__ runs,
    on its tile: its output is that tile's."""
    done = repl(shared_machine, _GOODBYE, "--tiles", "2-3")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "[1 tile: 2]\nbye from 2\n[1 tile: 3]\nbye from 3\n"
    done = subprocess.run([IPUOS, "shell", "-c", "cat /tiles/2/goodbye.txt; echo; cat /tiles/3/goodbye.txt; "
                           "rm /tiles/2/goodbye.txt /tiles/3/goodbye.txt"],
                          capture_output=True, text=True, env=shared_machine.env(), timeout=60)
    assert done.stdout == "written by tile 2\nwritten by tile 3"


def test_a_killed_terminals_session_lets_go_on_its_tiles(shared_machine):
    terminal = subprocess.Popen([IPUOS, "repl", "--tiles", "4-5"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=shared_machine.env())
    try:
        terminal.stdin.write(_GOODBYE + "print('ready')\n")
        terminal.stdin.flush()
        assert terminal.stdout.readline() == "[2 tiles: 4-5]\n"
        assert terminal.stdout.readline() == "ready\n"
    finally:
        terminal.kill()
        terminal.communicate()
    deadline = time.monotonic() + 30
    while True:  # (the daemon ends the session once it sees the connection go)
        done = subprocess.run([IPUOS, "shell", "-c", "cat /tiles/4/goodbye.txt; echo; cat /tiles/5/goodbye.txt"],
                              capture_output=True, text=True, env=shared_machine.env(), timeout=60)
        if done.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert done.stdout == "written by tile 4\nwritten by tile 5"
    subprocess.run([IPUOS, "shell", "-c", "rm /tiles/4/goodbye.txt /tiles/5/goodbye.txt"], env=shared_machine.env(),
                   timeout=60, check=True)


@pytest.mark.scale
def test_a_full_chip_groups_and_counts_words(runtime_dir, tmp_path):
    booted = boot_machine("mk2")
    try:
        rng = random.Random(1472)
        words = ["".join(rng.choice("abcde") for _ in range(rng.randint(1, 6))) for _ in range(20_000)]
        lines = [" ".join(words[i : i + 7]) for i in range(0, len(words), 7)]
        data = tmp_path / "words.txt"
        data.write_text("\n".join(lines) + "\n")
        expected = sum(word.startswith("ab") for word in words)
        code = ("mine = [w for w in __tiledata.split() if w.startswith('ab')]\n"
                "total = allreduce(len(mine))\n"
                "print(total)\n"
                "print(__tileid % 7)\n"
                "print(total == allreduce(len(mine)), len(__tiledata) > 0)\n"
                "print('tile', __tileid)\n"
                "1 / (__tileid % 2)\n")
        done = repl(booted, code, "--data", str(data), timeout=300)
        assert done.returncode == 1, done.stderr  # the last block raised on half the tiles
        blocks = done.stdout.split("[1472 tiles: 0-1471]\n")
        assert blocks[1].startswith(f"{expected}\n"), done.stdout[:300]  # the allreduce block
        found = groups(done.stdout)
        modulo = [(header, body) for header, body in found if re.fullmatch(r"[0-6]\n", body)]
        # 1472 = 7 * 210 + 2: residues 0 and 1 have one tile more, and come first
        assert modulo == [("[211 tiles: 0-1470:7]", "0\n"), ("[211 tiles: 1-1471:7]", "1\n")] + [
            (f"[210 tiles: {r}-{1463 + r}:7]", f"{r}\n") for r in range(2, 7)]
        assert ("[1472 tiles: 0-1471]", "True True\n") in found  # state persisted
        assert "... 1452 more distinct outputs from 1452 tiles\n" in done.stdout
        errors = [(header, body) for header, body in found if "ZeroDivisionError" in body]
        assert [header for header, _ in errors] == ["[736 tiles: 0-1470:2]"]
    finally:
        booted.halt()


@pytest.mark.scale
def test_a_32_chip_machine_is_usable(runtime_dir):
    from daemon_harness import Booted, unique_name
    from ipuos._rundir import machine_paths
    from ipuos._spawn import boot

    paths = machine_paths(unique_name("big"))
    info = boot(paths, "mk2", 32)
    booted = Booted(paths.name, paths, info["pid"])
    try:
        code = "x = __tileid\nprint(__tileid % 7)\nprint(allreduce(x) == 47103 * 47104 // 2)\n"
        done = repl(booted, code, timeout=600)
        assert (done.returncode, done.stderr) == (0, "")
        found = groups(done.stdout)
        assert found[0] == ("[6730 tiles: 0-47103:7]", "0\n") and len(found) == 8
        assert found[-1] == ("[47104 tiles: 0-47103]", "True\n")
    finally:
        booted.halt()


def test_data_beyond_what_one_request_carries_is_refused_after_reading_that_much(runtime_dir, tmp_path):
    """A chip's tiles hold ~900 MiB, more than one request to the machine carries
    (64 MiB): the terminal read a file up to the tiles' room, hundreds of MiB in memory,
    only for the request to be refused."""
    from ipuos._protocol import REQUEST_LIMITS

    with open(tmp_path / "huge", "wb") as file:
        file.truncate(1 << 40)
    booted = boot_machine("mk2")
    try:
        done = _shell_script(booted, "multirepl --data huge\nprint('ran')\n", tmp_path)
    finally:
        booted.halt()
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (f"multirepl: huge: 1099511627776 bytes is more than one request to the machine "
                           f"carries ({REQUEST_LIMITS.max_payload} bytes); give less data\n" + _DID_NOT_START)
