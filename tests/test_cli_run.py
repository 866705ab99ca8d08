"""``ipuos run`` on a machine daemon: through click's CliRunner, and as a real process for Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import select
import signal
import subprocess
import time

import pytest
from click.testing import CliRunner
from daemon_harness import (  # noqa: F401  (fixtures)
    IPUOS,
    Booted,
    machine,
    run_cli,
    runtime_dir,
    shared_machine,
    unique_name,
    wait_for,
)

from ipuos._cli import main
from ipuos._rundir import lock_holder, machine_paths


@pytest.fixture
def runner(shared_machine):
    """A CliRunner whose commands use the module's machine unless told otherwise."""
    runner = CliRunner(env={"IPUOS_MACHINE": shared_machine.name})
    return runner


@pytest.fixture
def program(tmp_path):
    def write(text, name="prog.py"):
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write


def test_run_prints_grouped_output(runner, program):
    result = runner.invoke(main, ["run", program("print('hi', __tileid % 2)"), "--tiles", "0-5", "--preset", "tiny"])
    assert result.exit_code == 0, result.output
    assert result.output == "[3 tiles: 0-4:2]\nhi 0\n[3 tiles: 1-5:2]\nhi 1\n"


def test_run_with_data_file(runner, program, tmp_path):
    data = tmp_path / "words.txt"
    data.write_text("a b c\nd e\nf\n" * 10)
    result = runner.invoke(main, ["run", program("print(allreduce(len(__tiledata.split())))"),
                                  "--data", str(data), "--tiles", "0-3"])
    assert result.exit_code == 0
    assert result.output == "[4 tiles: 0-3]\n60\n"


def test_run_passes_arguments_to_the_program(runner, program):
    path = program("print(__args)")
    result = runner.invoke(main, ["run", path, "--tiles", "0-1", "one", "two words", "--", "--three"])
    assert result.exit_code == 0, result.output
    assert result.output == f"[2 tiles: 0-1]\n{[path, 'one', 'two words', '--three']}\n"
    # a program read from stdin is "<stdin>", as for `python -`; stdin cannot be the data too
    result = runner.invoke(main, ["run", "-", "--tiles", "0", "x"], input="print(__file__, __args)\n")
    assert result.output == "[1 tile: 0]\n<stdin> ['<stdin>', 'x']\n", result.output
    result = runner.invoke(main, ["run", "-", "--tiles", "0", "--data", "-"], input="print(1)\n")
    assert result.exit_code == 2 and "cannot both be read from standard input" in result.output
    # options ipuos does not know are the program's, as the shell's run and python have it
    result = runner.invoke(main, ["run", path, "x", "-v", "--tiles", "0", "--level=3"])
    assert result.exit_code == 0, result.output
    assert result.output == f"[1 tile: 0]\n{[path, 'x', '-v', '--level=3']}\n"


def test_a_word_with_h_after_a_dash_is_a_file_or_the_programs_not_a_call_for_help(runner, program, tmp_path,
                                                                                   monkeypatch):
    """click read ``-h.py`` as short options bundled, -h among them: ``run -h.py`` printed
    the help and exited 0 without running anything (``run -x.py`` runs the file)."""
    monkeypatch.chdir(tmp_path)
    program("print(__args)", name="-h.py")
    result = runner.invoke(main, ["run", "-h.py", "--tiles", "0", "-vh", "-path"])
    assert result.exit_code == 0, result.output
    assert result.output == "[1 tile: 0]\n['-h.py', '-vh', '-path']\n"
    program("print(__args)", name="-h=1.py")
    result = runner.invoke(main, ["run", "-h=1.py", "--tiles", "0", "-h=verbose"])
    assert result.output == "[1 tile: 0]\n['-h=1.py', '-h=verbose']\n", result.output
    result = runner.invoke(main, ["run", "-hx.py", "--tiles", "0"])  # (no such file)
    assert result.exit_code == 2 and "'-hx.py': No such file or directory" in result.output, result.output
    for asking in (["-h"], ["--help"], ["-h.py", "-h"]):  # -h by itself still asks for help
        result = runner.invoke(main, ["run", *asking])
        assert result.exit_code == 0 and result.output.startswith("Usage: "), result.output
        assert "run [OPTIONS] FILE" in result.output.split("\n", 1)[0]


def test_a_program_is_read_in_the_encoding_its_coding_declaration_names(runner, tmp_path):
    """As Python reads a source file (PEP 263): a latin-1 file that says so was refused
    as "not UTF-8 text"."""
    latin = tmp_path / "latin.py"
    for text in (b'# -*- coding: latin-1 -*-\nprint("caf\xe9")\n',
                 b'# -*- coding: latin-1 -*-\rprint("caf\xe9")\r'):  # (old Mac line endings: Python reads them)
        latin.write_bytes(text)
        result = runner.invoke(main, ["run", str(latin), "--tiles", "0"])
        assert (result.exit_code, result.output) == (0, "[1 tile: 0]\ncaf\u00e9\n"), result.output
    for text, problem in ((b"# coding: nonsense\nprint(1)\n",
                           "has a coding declaration Python cannot read (unknown encoding: nonsense)"),
                          (b'print("caf\xe9")\n', "is not UTF-8 text (byte 10)"),
                          (b'# coding: utf-8\nprint(1)\nprint("caf\xe9")\n', "is not UTF-8 text (byte 35)"),
                          (b'# coding: cp1252\nprint("\x81")\n',  # (the codec's name, not "charmap")
                           "is not cp1252 text, as its coding declaration says (byte 24)"),
                          (b'\xef\xbb\xbf# coding: latin-1\nprint(1)\n',
                           "starts with a UTF-8 byte-order mark but declares another encoding")):
        bad = tmp_path / "bad.py"
        bad.write_bytes(text)
        result = runner.invoke(main, ["run", str(bad), "--tiles", "0"])
        assert result.exit_code == 1 and f"{bad} {problem}" in result.output, result.output


@pytest.mark.parametrize("slip, meant", [("--tile", "--tiles"), ("--tile=0", "--tiles"), ("--dat", "--data"),
                                         ("--budgte", "--budget"), ("--jsn", "--json")])
def test_a_slip_for_one_of_runs_options_is_refused_unless_after_double_dash(runner, program, slip, meant):
    """It used to reach the program as an argument: ``--tile 0`` ran it on every tile."""
    path = program("print(__args)")
    result = runner.invoke(main, ["run", path, slip, "0"])
    assert result.exit_code == 2, result.output
    name = slip.partition("=")[0]
    assert (f"Error: option {name} not recognized (did you mean {meant}?); to pass it to the program, "
            "put it after --\n") in result.output
    assert "tile: 0" not in result.output and "tiles:" not in result.output  # (nothing ran)
    result = runner.invoke(main, ["run", path, "--tiles", "0", "--", slip, "0"])
    assert result.exit_code == 0, result.output
    assert result.output == f"[1 tile: 0]\n{[path, slip, '0']}\n"


def test_an_option_near_none_of_runs_is_the_programs(runner, program):
    path = program("print(__args)")
    result = runner.invoke(main, ["run", path, "--tiles", "0", "--time", "3", "--data-dir", "d", "--name-of", "x",
                                  "--files", "--names"])
    assert result.exit_code == 0, result.output
    args = [path, "--time", "3", "--data-dir", "d", "--name-of", "x", "--files", "--names"]
    assert result.output == f"[1 tile: 0]\n{args}\n"
    # an option's value is its, whatever it looks like
    result = runner.invoke(main, ["run", path, "--tiles", "0", "--budget", "5", "--level"])
    assert result.output == f"[1 tile: 0]\n{[path, '--level']}\n", result.output


def test_a_data_file_that_is_not_utf8_names_the_byte_in_the_file(runner, program, tmp_path):
    data = tmp_path / "latin.txt"
    data.write_bytes(b"line\n" * 100 + b"caf\xe9\n")  # byte 503, in the last tile's share
    result = runner.invoke(main, ["run", program("pass"), "--data", str(data), "--tiles", "0-3"])
    assert result.exit_code != 0
    assert "is not UTF-8 text (byte 503: invalid continuation byte)" in result.output


@pytest.mark.parametrize("case", ["data too big", "program too big", "argument not UTF-8"])
def test_a_request_the_daemon_cannot_take_is_refused_before_a_machine_starts(runtime_dir, program, tmp_path, case):
    name = unique_name("nostart")
    args = ["run", program("pass"), "--tiles", "0", "--preset", "tiny"]
    big = tmp_path / "big"
    with open(big, "wb") as f:
        f.truncate(65 * 2**20)
    if case == "data too big":
        args += ["--data", str(big)]
        expected = ("FILE (4 B) and --data (more than 64.0 MiB) together exceed the 64.0 MiB one run "
                    "request carries; split the data over several runs, or copy it to the chip disk")
    elif case == "program too big":
        args[1] = str(big)
        expected = ("FILE (more than 64.0 MiB) exceeds the 64.0 MiB one run request carries, and every tile holds "
                    "the whole program in its SRAM (624 KiB at most); keep data out of the program: give "
                    "it with --data, or read it from a file")
    else:
        args += ["ok", b"caf\xe9".decode("utf-8", "surrogateescape")]
        expected = "argument 2 (b'caf\\xe9') is not UTF-8 text"
    result = CliRunner(env={"IPUOS_MACHINE": name}).invoke(main, args)
    assert result.exit_code == 2, result.output
    assert expected in result.output
    assert lock_holder(machine_paths(name).lock) is None  # nothing was started for it


@pytest.mark.parametrize("endless", ["FILE", "--data"])
def test_an_endless_file_is_read_no_further_than_a_request_carries(runtime_dir, program, endless):
    """/dev/zero as the program or its data: refused once one request's worth is read,
    not read until the host's memory runs out (here: the 2 GiB the client may take)."""
    name = unique_name("endless")
    args = ([IPUOS, "run", "/dev/zero"] if endless == "FILE"
            else [IPUOS, "run", program("pass"), "--data", "/dev/zero"])

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    result = subprocess.run([*args, "--tiles", "0", "--preset", "tiny"], capture_output=True, text=True,
                            timeout=120, preexec_fn=cap_memory, env={**os.environ, "IPUOS_MACHINE": name})
    assert result.returncode == 2, result.stderr
    assert f"{endless} (more than " in result.stderr
    assert lock_holder(machine_paths(name).lock) is None  # nothing was started for it


def test_a_program_bigger_than_a_tile_is_refused_before_it_is_sent(runner, program):
    """The daemon would compile it (answering nothing meanwhile: a client then says it
    may be stuck in C) only for every tile to fail to hold it."""
    result = runner.invoke(main, ["run", program("x = 1\n" * 20000), "--tiles", "0"])
    assert result.exit_code == 2, result.output
    assert ("FILE (117.2 KiB) does not fit in a tile: every tile holds the whole program in its SRAM, "
            "64.0 KiB on machine ") in result.output


def test_data_that_does_not_fit_the_tiles_is_one_error_not_one_per_tile(runner, program, tmp_path):
    data = tmp_path / "big.txt"
    data.write_text("word word word\n" * 20000)  # 300 KB over 4 tiles of 64 KiB
    result = runner.invoke(main, ["run", program("pass"), "--tiles", "0-3", "--data", str(data)])
    assert result.exit_code != 0
    assert result.output.count("does not fit in the SRAM of 4 tiles (0-3): tile 0's share is 75000 bytes") == 1
    assert "MemoryError" not in result.output and "[1 tile:" not in result.output


@pytest.mark.parametrize("end, longest", [("\n", 70001), ("\r", 70007)])  # (data is cut at "\n" alone)
def test_a_data_line_no_tile_can_hold_says_so_rather_than_to_use_more_tiles(runner, program, tmp_path, end, longest):
    data = tmp_path / "long.txt"
    data.write_bytes(f"short{end}{'x' * 70000}{end}".encode())  # a line bigger than a tiny tile's SRAM
    result = runner.invoke(main, ["run", program("pass"), "--tiles", "0-15", "--data", str(data)])
    assert result.exit_code == 1, result.output
    assert re.search(rf"tile \d+'s share holds a line of {longest} bytes, and no tile has room for more than \d+; "
                     r"a line is never split between tiles: break it up", result.output), result.output
    assert "more tiles" not in result.output


def test_run_exit_status_reflects_errors(runner, program):
    result = runner.invoke(main, ["run", program("1/0"), "--tiles", "0"])
    assert result.exit_code == 1
    assert "ZeroDivisionError" in result.output


def test_a_program_raising_keyboard_interrupt_exits_130_as_python_does(runner, program):
    path = program("if __tileid == 1: raise KeyboardInterrupt\nprint('done')")
    result = runner.invoke(main, ["run", path, "--tiles", "0-3"])
    assert result.exit_code == 130
    assert result.output.endswith("\nKeyboardInterrupt\n")
    doc = json.loads(runner.invoke(main, ["run", path, "--tiles", "0-3", "--json"]).output)
    assert doc["exit_status"] == 130
    assert (doc["tiles"][1]["status"], doc["tiles"][1]["exit_code"]) == ("error", 130)
    # another tile's error of its own is the run's failure
    path = program("if __tileid == 1: raise KeyboardInterrupt\nif __tileid == 2: 1/0")
    assert runner.invoke(main, ["run", path, "--tiles", "0-3"]).exit_code == 1


def test_run_exit_status_is_the_programs(runner, program):
    result = runner.invoke(main, ["run", program("exit(3)"), "--tiles", "0-1"])
    assert result.exit_code == 3


@pytest.mark.parametrize("spec, message", [
    ("0-99", "no tile 99 on this machine"),
    ("0-1000000000000", "no tile 1000000000000 on this machine (it has tiles 0-15)"),
    ("x", "'x' is not a tile id"),
    ("", "empty tile specification"),
    ("0" * 4301, "far too many digits"),
])
def test_bad_tile_specs_are_usage_errors(runner, program, spec, message):
    result = runner.invoke(main, ["run", program("pass"), "--tiles", spec])
    assert result.exit_code == 2
    assert message in result.output


def test_missing_program_file(runner, tmp_path):
    result = runner.invoke(main, ["run", str(tmp_path / "nope.py")])
    assert result.exit_code == 2
    assert "No such file or directory" in result.output


def test_syntax_error_is_one_clear_line(runner, program):
    result = runner.invoke(main, ["run", program("def f(:\n"), "--tiles", "0"])
    assert result.exit_code == 1
    assert "syntax error at line 1, column 7: invalid syntax" in result.output
    assert "Traceback" not in result.output


def test_json_reports_a_program_that_never_started(runner, program, tmp_path):
    """A script reading --json's stdout gets a document for a syntax error or undecodable
    source too, with why; the message also goes to stderr."""
    latin1 = tmp_path / "latin1.py"
    latin1.write_bytes(b"print('caf\xe9')\n")
    for path, why in [(program("x = (\n"), "syntax error at line 1"), (str(latin1), "UTF-8")]:
        result = runner.invoke(main, ["run", path, "--tiles", "0", "--json"])
        assert result.exit_code == 1
        doc = json.loads(result.stdout)
        assert (doc["job"], doc["program"], doc["exit_status"], doc["tiles"]) == (None, path, 1, [])
        assert why in doc["error"] and why in result.stderr


def test_a_byte_order_mark_is_read_past_and_a_nul_byte_is_a_clear_error(runner, tmp_path):
    bom, nul = tmp_path / "bom.py", tmp_path / "nul.py"
    bom.write_bytes(b"\xef\xbb\xbfprint('bom')\n")  # as some editors save UTF-8
    nul.write_bytes(b"print(1)\x00\n")
    result = runner.invoke(main, ["run", str(bom), "--tiles", "0"])
    assert (result.exit_code, result.output) == (0, "[1 tile: 0]\nbom\n")
    result = runner.invoke(main, ["run", str(nul), "--tiles", "0"])
    assert result.exit_code == 1
    assert "nul.py: syntax error: source code string cannot contain null bytes" in result.output
    assert "None" not in result.output


def test_output_keeps_terminal_escapes_when_piped(runner, program):
    """The tiles' output is passed on as printed: click strips ANSI codes from output
    that is not a terminal unless told not to."""
    result = runner.invoke(main, ["run", program("print('\\x1b[1mbold\\x1b[0m\\a')"), "--tiles", "0"])
    assert (result.exit_code, result.output) == (0, "[1 tile: 0]\n\x1b[1mbold\x1b[0m\a\n")


def test_json_output(runner, program):
    path = program("print(__tileid)")
    result = runner.invoke(main, ["run", path, "--tiles", "2-3", "--json"])
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert [(t["tile"], t["output"], t["status"]) for t in doc["tiles"]] == [(2, "0\n", "ok"), (3, "1\n", "ok")]
    assert doc["stats"]["supersteps"] >= 1 and doc["exit_status"] == 0
    # "name" is the machine in every document: the program is "program"
    assert doc["program"] == path and "name" not in doc


def test_a_tile_printing_a_lone_surrogate_costs_nobody_their_output(runner, program):
    # text decoded with surrogateescape is not UTF-8: it used to lose every tile's result
    source = "print('tile', __tileid)\nif __tileid == 2:\n    print(b'caf\\xe9'.decode('utf-8', 'surrogateescape'))\n"
    result = runner.invoke(main, ["run", program(source), "--tiles", "0-3"])
    assert result.exit_code == 0, result.output
    assert "tile 0\n" in result.output and "tile 3\n" in result.output
    assert "tile 2\ncaf\\udce9\n" in result.output


def test_stats_go_to_stderr_and_label_simulated_time(runner, program):
    result = runner.invoke(main, ["run", program("sync()"), "--tiles", "0-1", "--stats"])
    assert result.exit_code == 0
    assert result.stdout == ""
    assert result.stderr.startswith("-- 2 tiles, ") and "us simulated exchange" in result.stderr
    one = runner.invoke(main, ["run", program("sync()"), "--tiles", "5", "--stats"])
    assert one.stderr.startswith("-- 1 tile, ")
    assert ", 1 superstep, " in runner.invoke(main, ["run", program("pass"), "--tiles", "5", "--stats"]).stderr
    result = runner.invoke(main, ["run", program("alltoall(b'x' * 100)"), "--tiles", "0-3", "--stats"])
    assert result.exit_code == 0
    assert "bytes exchanged; per tile sent " in result.stderr
    assert "received " in result.stderr


def test_stats_count_the_messages_sent_that_no_tile_received(runner, program):
    # tile 1 has finished before its messages arrive: they are dropped
    result = runner.invoke(main, ["run", program("if __tileid == 0:\n    sync(); send(1, 'a'); send(1, 'b')\n"),
                                  "--tiles", "0-1", "--stats"])
    assert result.exit_code == 0
    assert "\n-- 2 messages were sent but never received (dropped)\n" in result.stderr
    result = runner.invoke(main, ["run", program("sync()"), "--tiles", "0-1", "--stats"])
    assert "never received" not in result.stderr


def test_budget_option(runner, program):
    result = runner.invoke(main, ["run", program("while True: pass"), "--tiles", "0", "--budget", "0.1"])
    assert result.exit_code == 1
    assert "computed for more than 0.1 s" in result.output


@pytest.mark.parametrize("budget", ["nan", "inf", "0", "-2", "soon"])
def test_a_bad_budget_is_a_usage_error(runner, program, budget):
    result = runner.invoke(main, ["run", program("pass"), "--tiles", "0", "--budget", budget])
    assert result.exit_code == 2
    assert "--budget" in result.output
    assert "Traceback" not in result.output


def test_busy_tiles_are_reported_with_what_to_do(shared_machine, runner, program):
    import socket as _socket  # a second client holds tile 7 with a spinning job

    from daemon_harness import raw_socket, read_frame, request

    source = b"while True:\n    sync()\n"
    sock = raw_socket(shared_machine.paths)
    sock.sendall(request(1, "run", {"filename": "spin.py", "source_len": len(source), "tiles": "7"}, source))
    assert read_frame(sock).header["event"]["event"] == "started"
    try:
        result = runner.invoke(main, ["run", program("pass"), "--tiles", "6-8"])
        assert result.exit_code == 1
        assert "tile 7 already runs job" in result.output
        # the commands it suggests name this machine, or they would look at the default one
        name = shared_machine.name
        assert f"(`ipuos ps --name {name}` lists jobs, `ipuos kill JOB --name {name}` stops one)" \
            in result.output
        result = runner.invoke(main, ["run", program("pass"), "--tiles", "7", "--json"])
        doc = json.loads(result.stdout)
        assert (result.exit_code, doc["job"], doc["tiles"], doc["stats"]) == (1, None, [], None)
        assert "tile 7 already runs job" in doc["error"]
    finally:
        sock.shutdown(_socket.SHUT_RDWR)
        sock.close()
    wait_for(lambda: shared_machine.call("ps")["states"][7] == "i", what="tile 7 to be idle")


def test_a_run_waiting_behind_a_computing_tile_says_why(shared_machine, program):
    # (the machine takes new work between supersteps: a job on free tiles waited without
    # a word for as long as another job's tile computed)
    from daemon_harness import raw_socket, read_frame, request

    source = b"while True:\n    pass\n"
    sock = raw_socket(shared_machine.paths)
    sock.sendall(request(1, "run", {"filename": "spin.py", "source_len": len(source), "tiles": "9"}, source))
    job = read_frame(sock).header["event"]["job"]
    client = subprocess.Popen([IPUOS, "run", program("print('ran')"), "--tiles", "10"],
                              env=shared_machine.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        ready, _, _ = select.select([client.stderr], [], [], 30)  # (after START_PATIENCE_SECONDS)
        assert ready, "the waiting client said nothing"
        line = client.stderr.readline()
        name = shared_machine.name
        assert line.startswith(f"ipuos: machine {name!r} has not started the job yet: a tile is "
                               "computing without reaching an exchange point"), line
        assert f"(`ipuos ps --name {name}` shows jobs, `ipuos kill JOB --name {name}` stops one)" in line
        shared_machine.call("kill", {"job": job})
        out, err = client.communicate(timeout=60)
    finally:
        sock.close()
        if client.poll() is None:
            client.kill()
    assert (client.returncode, out, err) == (0, "[1 tile: 10]\nran\n", "")


def test_a_preset_the_running_machine_lacks_is_refused(runner, program, shared_machine):
    result = runner.invoke(main, ["run", program("pass"), "--preset", "mk2"])
    assert result.exit_code == 1
    assert result.output == (f"ipuos: machine {shared_machine.name!r} is running as tiny, 1 IPU, 16 tiles, "
                             f"not --preset mk2; drop the option to use it, `ipuos halt --name "
                             f"{shared_machine.name}` it first, or pick another --name\n")


def test_run_starts_the_machine_when_none_runs(runtime_dir, program):
    name = unique_name("auto")
    result = CliRunner().invoke(main, ["run", program("print(__numtiles)"), "--preset", "tiny", "--tiles", "0",
                                       "--name", name])
    paths = machine_paths(name)
    try:
        assert result.exit_code == 0, result.output
        assert result.stdout == "[1 tile: 0]\n1\n"
        assert result.stderr == (f"ipuos: started machine {name!r} (tiny, 1 IPU, 16 tiles); "
                                 f"`ipuos halt --name {name}` stops it\n")
        assert lock_holder(paths.lock)
    finally:
        Booted(name, paths, 0).halt()


# -- Ctrl-C in a real client process ----------------------------------------------------------


@contextlib.contextmanager
def _client_running(machine, path, tiles: str, started, output=subprocess.PIPE, preexec_fn=None):
    """``ipuos run PATH --tiles TILES`` as a client process, once ``started(states)`` holds
    for ``ipuos ps``'s tile states; killed if it still runs when the block ends."""
    client = subprocess.Popen([IPUOS, "run", path, "--tiles", tiles], env=machine.env(),
                              stdout=output, stderr=output, text=True, preexec_fn=preexec_fn)
    try:
        wait_for(lambda: started(machine.call("ps")["states"]), what="the job to start")
        yield client
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


def test_ctrl_c_interrupts_the_job_and_prints_what_the_tiles_printed(machine, program):
    path = program("print('started', __tileid)\nwhile True:\n    sync()\n")
    with _client_running(machine, path, "0-3", lambda states: states[:5].count("i") == 1) as client:
        client.send_signal(signal.SIGINT)
        out, err = client.communicate(timeout=30)
    assert client.returncode == 130, err
    for tile in range(4):
        assert f"started {tile}\ninterrupted (Ctrl-C)\n" in out
    assert machine.call("ps")["states"] == "i" * 16


def test_a_run_started_with_sigint_ignored_keeps_it_ignored(machine, program):
    """As ``sh`` starts a job with ``&``: a Ctrl-C on the script must not stop it (the
    client's own handler took SIGINT over, and the job was interrupted)."""
    path = program("for i in range(30):\n    x = sum(range(10 ** 6))\n    sync()\nprint('finished', i)\n")
    ignore = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    with _client_running(machine, path, "0", lambda states: states[0] != "i", preexec_fn=ignore) as client:
        client.send_signal(signal.SIGINT)
        out, err = client.communicate(timeout=60)
    assert client.returncode == 0, err
    assert out == "[1 tile: 0]\nfinished 29\n"


def test_ctrl_c_as_a_long_c_call_ends_gets_the_result(machine, program):
    # (the daemon's cancel hook named the job's handle, deleted once the job had ended: a
    # Ctrl-C landing then lost the whole reply to a NameError)
    path = program("print('begun')\nx = sum(range(15 * 10**7))\nprint('done')\n")  # ~2 s
    for _ in range(3):
        client = subprocess.Popen([IPUOS, "run", path, "--tiles", "0"], env=machine.env(),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(1.0)  # (ps cannot tell: it answers from its last snapshot meanwhile)
            client.send_signal(signal.SIGINT)  # (taken when the C call returns)
            out, err = client.communicate(timeout=60)
        finally:
            if client.poll() is None:
                client.kill()
        assert "daemon could not take a request" not in err
        assert (client.returncode, out) in ((0, "[1 tile: 0]\nbegun\ndone\n"), (130, out)), err
        assert out.startswith("[1 tile: 0]\nbegun\n"), (out, err)
    assert machine.call("ps")["states"] == "i" * 16


def test_ctrl_c_on_a_terminal_stops_pure_compute(machine, program):
    """The user's view: a status line, Ctrl-C on the tty, output, status 130."""
    import pexpect

    path = program("print('spinning on', __tileid)\nwhile True: pass\n")
    child = pexpect.spawn(IPUOS, ["run", path, "--tiles", "0-1"], env=machine.env(), encoding="utf-8", timeout=30)
    try:
        child.expect("Ctrl-C interrupts it")
        child.sendintr()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 130, child.before
    # tile 1's turn had not come (tile 0 held the thread), but on the chip it had begun
    # too: it prints, and is stopped where it computes
    assert "spinning on 0" in child.before and "spinning on 1" in child.before
    assert child.before.count("interrupted (Ctrl-C)") == 2, child.before


def test_a_second_ctrl_c_stops_waiting(machine, program):
    """A job that takes its time to stop must not hold the user's terminal."""
    path = program("while True:\n    sync()\n")
    with _client_running(machine, path, "0", lambda states: states[0] != "i") as client:
        os.kill(client.pid, signal.SIGINT)
        os.kill(client.pid, signal.SIGINT)
        _, err = client.communicate(timeout=30)
    assert client.returncode == 130
    # either the interrupt finished first, or the client gave up waiting and said so
    assert err == "" or "stopped waiting for job" in err


def test_ctrl_c_is_a_keyboard_interrupt_the_program_can_clean_up_after(machine, program):
    path = program("try:\n    print('started', __tileid)\n    while True:\n        sync()\n"
                   "except KeyboardInterrupt:\n    print('cleaning up', __tileid)\n    raise\n")
    with _client_running(machine, path, "0-1", lambda states: states[:2] != "ii") as client:
        client.send_signal(signal.SIGINT)
        out, err = client.communicate(timeout=30)
    assert client.returncode == 130, err
    for tile in range(2):
        assert f"started {tile}\ncleaning up {tile}\ninterrupted (Ctrl-C)\n" in out


def test_a_second_ctrl_c_stops_a_program_that_swallowed_the_first(machine, program):
    path = program("while True:\n    try:\n        while True:\n            sync()\n"
                   "    except KeyboardInterrupt:\n        pass\n")
    with _client_running(machine, path, "0", lambda states: states[0] != "i") as client:
        client.send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert client.poll() is None and machine.call("ps")["states"][0] != "i"  # it runs on, as in Python
        client.send_signal(signal.SIGINT)  # stops it for good, and the client shows that
        out, err = client.communicate(timeout=30)
    assert client.returncode == 130, err
    assert out == "[1 tile: 0]\ninterrupted for good (a second Ctrl-C, or the client went away)\n", (out, err)
    wait_for(lambda: machine.call("ps")["states"] == "i" * 16, what="the job to stop")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_stops_the_job_prints_what_the_tiles_printed_and_dies_of_it(machine, program, signum):
    """`timeout 60 ipuos run ...`, a CI runner's kill, a closed terminal: the client died
    at once, its tiles' output unseen; a job swallowing KeyboardInterrupt is stopped too."""
    path = program("print('started', __tileid)\nwhile True:\n    try:\n        sync()\n"
                   "    except KeyboardInterrupt:\n        pass\n")
    with _client_running(machine, path, "0-1", lambda states: states[:2] != "ii") as client:
        client.send_signal(signum)
        out, err = client.communicate(timeout=30)
    assert client.returncode == -signum, (out, err)
    for tile in range(2):
        assert f"started {tile}\ninterrupted for good" in out, out
    wait_for(lambda: machine.call("ps")["states"] == "i" * 16, what="the job to stop")


def test_a_client_gone_without_ctrl_c_stops_a_program_that_swallows_it(machine, program):
    """Its terminal closed, say: nobody waits for the job, which must not hold its tiles."""
    path = program("while True:\n    try:\n        sync()\n    except KeyboardInterrupt:\n        pass\n")
    with _client_running(machine, path, "0-1", lambda states: states[:2] != "ii", output=subprocess.DEVNULL):
        pass  # (killed as the block ends)
    wait_for(lambda: machine.call("ps")["states"] == "i" * 16, what="the job to stop")


def test_run_on_a_named_machine_from_the_environment(machine, program):
    done = run_cli("run", program("print(__numtiles)"), "--tiles", "3-4", env=machine.env())
    assert done.returncode == 0 and done.stdout == "[2 tiles: 3-4]\n2\n"


def test_a_runs_reply_keeps_to_its_size_whatever_the_tiles_printed(monkeypatch):
    """Each tile's output is capped in characters; thousands of tiles of 4-byte characters
    made a reply over the protocol's frame limit, and the client got no output at all."""
    from ipuos import Machine, _commands

    monkeypatch.setattr(_commands, "REPLY_OUTPUT_MAX", 4000)
    with Machine("tiny") as machine:
        result = machine.run("print('\U0001F600' * 1000)", tiles="0-15")
        small = machine.run("print('ok')", tiles="0-15")
    fitted = _commands.fit_for_reply(result)
    assert sum(len(t.output) for t in fitted.tiles) < 4000 + 16 * 80
    assert all(t.output.startswith("\U0001F600" * 250)
               and t.output.endswith("[output truncated for the reply: 751 more characters]\n")
               for t in fitted.tiles)
    assert _commands.fit_for_reply(small) is small  # (within the size: as it was)
    # a cut that ends a line starts the note there, with no empty line between
    assert _commands._cut("ab\ncd", 3) == "ab\n[output truncated for the reply: 2 more characters]\n"


def test_a_runs_reply_cuts_only_the_long_outputs_and_counts_what_each_tile_lost(monkeypatch):
    """Every tile was cut to an even share of the reply, half of it kept for an error
    even when there was none (on 1,024 tiles, outputs of 70,000 to 32 KiB), and a count
    that took the tile's own truncation note for output."""
    from ipuos import Machine, _commands

    monkeypatch.setattr(_commands, "REPLY_OUTPUT_MAX", 10_000)
    with Machine("tiny") as machine:
        result = machine.run("print('x' * (7000 if __tileid < 2 else 100))", tiles="0-15",
                             output_limit=5000)
    fitted = _commands.fit_for_reply(result)
    # 14 short outputs keep all they have (101 each); the two long ones share the rest
    assert [t.output for t in fitted.tiles[2:]] == ["x" * 100 + "\n"] * 14
    keep = (10_000 - 14 * 101) // 2
    assert [t.output for t in fitted.tiles[:2]] == [
        "x" * keep + f"\n[output truncated for the reply: {7001 - keep} more characters]\n"] * 2
