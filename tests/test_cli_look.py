"""The read-only commands on a real daemon: ``ps``, ``status``, ``top`` and their ``--json``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time

import pytest
from click.testing import CliRunner
from daemon_harness import (  # noqa: F401  (fixtures)
    IPUOS,
    boot_machine,
    closed_by_peer,
    empty_runtime_dir,
    machine,
    raw_socket,
    read_frame,
    request,
    runtime_dir,
    shared_machine,
    unique_name,
    wait_for,
)

from ipuos._cli import main
from ipuos._protocol import encode_frame
from ipuos._rundir import acquire_lock, lock_holder, machine_paths
from ipuos._top import SRAM_GLYPHS

SPIN = b"print('spin', __tileid)\nwhile True:\n    sync()\n"


def _start(machine, filename: str, source: bytes, tiles: str):
    """(socket, job id) of a program started over a raw socket (the socket holds it)."""
    sock = raw_socket(machine.paths)
    sock.sendall(request(1, "run", {"filename": filename, "source_len": len(source), "tiles": tiles}, source))
    return sock, read_frame(sock).header["event"]["job"]


@pytest.fixture
def busy(machine):
    """``machine`` with a job spinning in sync() on tiles 0-3 (interrupted at teardown)."""
    sock, job = _start(machine, "spin.py", SPIN, "0-3")
    yield machine, job
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def invoke(booted, *args):
    return CliRunner(env={"IPUOS_MACHINE": booted.name}).invoke(main, list(args))


def test_ps_groups_tiles_and_lists_jobs(busy):
    booted, job = busy
    result = invoke(booted, "ps")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    busy_state = lines[2].split()[1]  # between supersteps a spinning tile is running or waiting
    assert busy_state in ("running", "waiting")
    assert lines[0] == f"machine {booted.name!r}: 16 tiles (12 idle, 4 {busy_state})"
    assert lines[1].split() == ["TILES", "STATE", "JOB", "SRAM", "USED", "WAITING", "FOR"]
    assert lines[2].split()[:3] == ["0-3", busy_state, str(job)]
    assert lines[3].split()[:3] == ["4-15", "idle", "-"] and "KiB of 64.0 KiB" in lines[3]
    assert lines[5].split() == ["JOB", "TILES", "NAME", "ELAPSED", "CLIENT", "PID"]
    assert lines[6].split()[:3] == [str(job), "0-3", "spin.py"]


def test_a_program_name_with_control_characters_shows_spelled_out_in_ps_and_the_shell(machine):
    # a newline in a job's name made a fake row; an escape sequence drove the terminal
    name = "nl\nFAKE 0-15 x\x1b[31m.py"
    sock = raw_socket(machine.paths)
    try:
        sock.sendall(request(1, "run", {"filename": name, "source_len": len(SPIN), "tiles": "0-1"}, SPIN))
        job = read_frame(sock).header["event"]["job"]
        spelled = "nl\\nFAKE 0-15 x\\x1b[31m.py"
        lines = invoke(machine, "ps").output.splitlines()
        assert lines[-1].split()[:3] == [str(job), "0-1", "nl\\nFAKE"] and spelled in lines[-1], lines
        assert json.loads(invoke(machine, "ps", "--json").output)["jobs"][0]["program"] == name
        from daemon_harness import run_cli
        shell_ps = run_cli("shell", "-c", "ps", env=machine.env()).stdout.splitlines()
        assert shell_ps[-1].split()[0] == str(job) and shell_ps[-1].endswith(spelled), shell_ps
    finally:
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()


def test_ps_json_has_every_tile(busy):
    booted, job = busy
    result = invoke(booted, "ps", "--json")
    doc = json.loads(result.output)
    assert doc["name"] == booted.name
    assert len(doc["tiles"]) == 16
    first = doc["tiles"][0]
    assert set(first) == {"tile", "ipu", "state", "job", "sram_used", "sram_total", "waiting"}
    assert (first["tile"], first["job"], first["sram_total"]) == (0, job, 65536)
    assert first["state"] in ("running", "waiting") and 0 < first["sram_used"] <= 65536
    assert [t["state"] for t in doc["tiles"][4:]] == ["idle"] * 12
    assert [j["job"] for j in doc["jobs"]] == [job]
    assert (doc["ntiles"], doc["njobs"]) == (16, 1)
    (entry,) = doc["jobs"]
    assert (entry["tiles"], entry["ntiles"], entry["program"]) == ([0, 1, 2, 3], 4, "spin.py")
    assert "name" not in entry


def test_ps_json_shows_a_job_that_holds_no_tile_in_the_snapshot():
    """The daemon lists the jobs it hosts beside a snapshot of the tiles' states: a job
    starting (or ending) meanwhile holds none of them there. It was a traceback."""
    from ipuos._views import ps_json

    ps = {"ntiles": 2, "tiles_per_chip": 2, "sram_per_tile": 1024, "state_codes": {"i": "idle"},
          "states": "ii", "jobs_of_tiles": [None, None], "sram_used": [0, 0], "waiting": {},
          "jobs": [{"job": 7, "name": "starting.py", "tiles": "", "ntiles": 0, "elapsed_seconds": 0.1,
                    "client_pid": 42}]}
    (job,) = ps_json("m", ps)["jobs"]
    assert (job["job"], job["tiles"], job["ntiles"], job["program"]) == (7, [], 0, "starting.py")


def test_ps_lists_chosen_tiles_one_by_one(busy):
    booted, job = busy
    result = invoke(booted, "ps", "--tiles", "3-4")
    rows = result.output.splitlines()[2:4]
    assert rows[0].split()[0::2][:2] == ["3", str(job)] and rows[0].split()[1] in ("running", "waiting")
    assert rows[1].split()[:3] == ["4", "idle", "-"]
    assert json.loads(invoke(booted, "ps", "--tiles", "15", "--json").output)["tiles"][0]["tile"] == 15
    bad = invoke(booted, "ps", "--tiles", "99")
    assert bad.exit_code == 2 and "no tile 99" in bad.output


def test_status_labels_simulated_time(machine):
    ring = b"send((__tileid + 1) % __numtiles, b'x' * 1000)\nrecv((__tileid - 1) % __numtiles)\n"
    machine.call("run", {"filename": "ring.py", "source_len": len(ring), "tiles": "0-15"}, ring)
    result = invoke(machine, "status")
    assert result.exit_code == 0
    fields = dict(line.split(None, 1) for line in result.output.splitlines() if line.strip())
    assert fields["machine"].startswith(f"{machine.name} (pid {machine.pid})")
    assert fields["preset"] == "tiny: 1 IPU x 16 tiles = 16 tiles, 64.0 KiB SRAM per tile"
    assert "SIMULATED (modelled chip time, not host wall time)" in result.output
    doc = json.loads(invoke(machine, "status", "--json").output)
    assert doc["bytes_exchanged"] > 16 * 1000 and doc["simulated_exchange_seconds"] > 0
    assert doc["supersteps"] >= 1 and doc["ntiles"] == 16 and doc["njobs"] == 0 and doc["preset"] == "tiny"
    assert set(doc) >= {"uptime_seconds", "pid", "socket", "log", "protocol"}


def test_top_once_draws_every_tile_with_correct_counts(busy):
    booted, job = busy
    result = invoke(booted, "top", "--once")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"ipuos top  machine {booted.name!r}  tiny x1  16 tiles")
    assert "exchange time" in lines[1] and lines[1].endswith("(simulated)")
    legend = lines[2].split()
    assert legend[:3] == [".", "idle", "12"] and legend[9:12] == ["X", "dead", "0"]
    assert int(legend[5]) + int(legend[8]) == 4  # running + waiting
    assert lines[3][:3] == " 0 " and set(lines[3][3:7]) <= {"R", "w"} and lines[3][7:] == "." * 12
    assert lines[4].startswith(f"job {job}  tiles 0-3  spin.py")


def test_top_once_by_sram(machine):
    result = invoke(machine, "top", "--once", "--by", "sram")
    lines = result.output.splitlines()
    assert "SRAM used of 64.0 KiB per tile" in lines[2]
    used = machine.call("ps")["sram_used"]
    levels = [SRAM_GLYPHS[int(u / 65536 * 8)] for u in used]
    assert lines[3] == " 0 " + "".join(levels)


def test_top_json(busy):
    booted, _ = busy
    doc = json.loads(invoke(booted, "top", "--json").output)
    assert doc["status"]["name"] == booted.name
    assert sum(t["state"] == "idle" for t in doc["tiles"]) == 12


def test_top_refuses_an_interval_that_is_no_number_of_seconds(machine):
    # (click's FloatRange let NaN through: on a terminal, top then crashed waiting NaN seconds)
    for interval in ("nan", "-nan", "inf"):
        result = invoke(machine, "top", "--once", "--interval", interval)
        assert result.exit_code == 2, (interval, result.output)
        assert "Invalid value for '--interval'" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command", [["ps"], ["status"], ["top", "--once"], ["kill", "1"], ["ps", "--json"]])
def test_read_commands_do_not_start_a_machine(empty_runtime_dir, command):
    result = CliRunner().invoke(main, [*command, "--name", "nothing-here"])
    assert result.exit_code == 3
    assert result.output == ("ipuos: no machine named 'nothing-here' is running; "
                             "start one with `ipuos boot --name nothing-here`\n")


def test_a_machine_not_running_names_those_that_are(machine):
    """Booted by another name (or in a shell with another IPUOS_MACHINE): said which."""
    result = CliRunner().invoke(main, ["status", "--name", "nothing-here"])
    assert result.exit_code == 3
    said, _, running = result.output.partition("; running: ")
    assert said == "ipuos: no machine named 'nothing-here' is running; start one with `ipuos boot --name nothing-here`"
    assert machine.name in running and running.endswith(" (name one with --name or IPUOS_MACHINE)\n")


def test_kill_from_the_cli(busy):
    booted, job = busy
    result = invoke(booted, "kill", str(job))
    assert result.exit_code == 0 and result.output == f"interrupted job {job}\n"
    wait_for(lambda: booted.call("ps")["jobs"] == [], what="the job to end")
    again = invoke(booted, "kill", str(job))
    assert again.exit_code == 1 and f"no job {job} is running" in again.output


def _catching_every_interrupt(work: bytes) -> bytes:
    """A program doing ``work`` (a line) for ever, catching every interrupt (at two depths:
    an interrupt landing between the inner try and its loop's jump, which one level leaves
    open, stopped the program in one CI run)."""
    return (b"while True:\n    try:\n        while True:\n            try:\n                " + work + b"\n"
            b"            except:\n                pass\n    except:\n        pass\n")


def test_kill_stops_a_program_that_catches_every_interrupt_at_its_exchange_points(machine):
    # with sync() in the loop, the tile is left at its next exchange point after catching
    sock, job = _start(machine, "catching.py", _catching_every_interrupt(b"x = sum(range(1000)); sync()"), "4-5")
    try:
        result = invoke(machine, "kill", str(job))
        assert result.exit_code == 0 and result.output == f"interrupted job {job}\n", result.output
        assert machine.call("ps")["jobs"] == []
        while (header := read_frame(sock).header)["type"] != "result":
            pass
        assert "left it at its next exchange point" in json.dumps(header)
    finally:
        sock.close()


def test_kill_says_when_a_tile_is_stuck_in_a_call_into_c(machine):
    # seconds inside one C call (that lets other threads run), where no interrupt can land
    stuck = b"import hashlib\nhashlib.pbkdf2_hmac('sha256', b'p', b's', 20_000_000)\nprint('returned')\n"
    sock, job = _start(machine, "stuck.py", stuck, "5")
    try:
        time.sleep(0.3)  # into the regex
        result = invoke(machine, "kill", str(job))
        assert result.exit_code == 0, result.output
        assert result.output.startswith(f"asked job {job} to stop; it has not stopped yet")
        assert f"`ipuos ps --name {machine.name}` shows whether it still runs" in result.output
        wait_for(lambda: machine.call("ps")["jobs"] == [], timeout=60, what="the call to return")
    finally:
        sock.close()


def test_kill_says_when_a_program_catches_every_interrupt(machine):
    # nothing stops a tile that computes on after catching each interrupt: kill must say
    # so, and what is left (not blame a call into C)
    sock, job = _start(machine, "catching.py", _catching_every_interrupt(b"x = sum(range(1000))"), "5")
    try:
        result = invoke(machine, "kill", str(job))
        assert result.exit_code == 1, result.output
        assert result.output.startswith(f"ipuos: asked job {job} to stop; it has not stopped: the program "
                                        "on tile 5 catches the interrupt (a bare `except:`"), result.output
        assert f"halting the machine (`ipuos halt --name {machine.name}`)" in result.output
    finally:
        sock.close()
        machine.halt()


def test_a_bad_name_is_a_usage_error_that_says_where_it_came_from(runtime_dir):
    result = CliRunner().invoke(main, ["status", "--name", "../up"])
    assert result.exit_code == 2
    assert "Invalid value for '--name': bad machine name '../up'" in result.output
    assert "IPUOS_MACHINE" not in result.output
    result = CliRunner(env={"IPUOS_MACHINE": "../env"}).invoke(main, ["status"])
    assert result.exit_code == 2
    assert "bad machine name '../env': use up to 64 letters" in result.output
    assert "starting with a letter or digit (from $IPUOS_MACHINE)" in result.output


def test_machines_lists_running_machines(machine):
    result = CliRunner().invoke(main, ["machines"])
    assert result.exit_code == 0
    assert f"{machine.name}  tiny, 1 IPU, 16 tiles  pid {machine.pid}" in result.output.splitlines()
    listed = json.loads(CliRunner().invoke(main, ["machines", "--json"]).output)
    assert [m["answering"] for m in listed if m["name"] == machine.name] == [True]


def test_json_documents_spell_the_same_thing_the_same_way(machine):
    """A script reading several commands' --json meets one vocabulary: the machine is
    ``name``, a count of tiles or jobs is ``ntiles``/``njobs``, and ``tiles``/``jobs`` are
    always lists (never a count in one document and a list in the next)."""
    ps = json.loads(invoke(machine, "ps", "--json").output)
    status = json.loads(invoke(machine, "status", "--json").output)
    top = json.loads(invoke(machine, "top", "--json").output)
    (listed,) = [m for m in json.loads(invoke(machine, "machines", "--json").output)
                 if m["name"] == machine.name]
    assert ps["name"] == status["name"] == top["name"] == top["status"]["name"] == machine.name
    assert status["ntiles"] == listed["ntiles"] == len(ps["tiles"]) == 16
    assert status["njobs"] == len(ps["jobs"]) == 0
    for doc in (ps, status, top, top["status"], listed):
        assert not isinstance(doc.get("tiles", []), int) and not isinstance(doc.get("jobs", []), int)
        assert "machine" not in doc


def test_ps_of_a_machine_of_two_chips_says_which_chip_each_tile_is_on(runtime_dir):
    booted = boot_machine(ipus=2)
    try:
        sock = raw_socket(booted.paths)
        sock.sendall(request(1, "run", {"filename": "spin.py", "source_len": len(SPIN), "tiles": "14-17"},
                             SPIN))
        read_frame(sock)  # started
        result = invoke(booted, "ps")
        assert result.exit_code == 0, result.output
        lines = result.output.splitlines()
        assert lines[0].startswith(f"machine {booted.name!r}: 32 tiles on 2 IPUs (")
        assert lines[1].split() == ["IPU", "TILES", "STATE", "JOB", "SRAM", "USED", "WAITING", "FOR"]
        # a group never spans two chips: the job's tiles are on both
        assert [line.split()[:3] for line in lines[2:6]] == [
            ["0", "0-13", "idle"], ["0", "14-15", "running"], ["1", "16-17", "running"], ["1", "18-31", "idle"]]
        one_by_one = invoke(booted, "ps", "--tiles", "15-16").output.splitlines()
        assert [line.split()[:3] for line in one_by_one[2:4]] == [["0", "15", "running"], ["1", "16", "running"]]
        tiles = json.loads(invoke(booted, "ps", "--json").output)["tiles"]
        assert [t["ipu"] for t in tiles] == [0] * 16 + [1] * 16
        sock.close()
    finally:
        booted.halt()


def test_ps_of_one_chip_has_no_ipu_column(busy):
    booted, _job = busy
    lines = invoke(booted, "ps").output.splitlines()
    assert lines[0].startswith(f"machine {booted.name!r}: 16 tiles (")
    assert lines[1].startswith("TILES ")
    assert {t["ipu"] for t in json.loads(invoke(booted, "ps", "--json").output)["tiles"]} == {0}


def test_machines_lists_a_machine_that_does_not_answer(machine):
    """A running daemon that cannot answer (stopped here; busy or hung alike) is still
    listed, saying so, not left out while ``boot`` says it is running."""
    os.kill(machine.pid, signal.SIGSTOP)
    try:
        listed = json.loads(CliRunner().invoke(main, ["machines", "--json"]).output)
    finally:
        os.kill(machine.pid, signal.SIGCONT)
    mine = next(m for m in listed if m["name"] == machine.name)
    assert mine["answering"] is False and mine["pid"] == machine.pid
    assert f"its daemon (pid {machine.pid}) is stopped" in mine["problem"]


def test_a_machine_of_another_release_says_so_and_halt_stops_it(machine, monkeypatch):
    """After an upgrade, the running daemon speaks the old protocol: every command says
    to halt it and start again, and halt must then be able to (it cannot ask)."""
    import functools

    import ipuos._protocol

    # this client speaks a protocol the running daemon does not, both ways: a request
    # the daemon could read (only the replies foreign) would be carried out, and a
    # `halt --if-saved` then halted the machine as the client reported it refused
    other = ipuos._protocol.VERSION + 1
    monkeypatch.setattr(ipuos._protocol, "SUPPORTED_VERSIONS", (other,))
    monkeypatch.setattr(ipuos._protocol, "encode_frame",
                        functools.partial(ipuos._protocol.encode_frame, version=other))
    result = invoke(machine, "status")
    assert result.exit_code != 0
    assert "use client and daemon from the same ipuos release" in result.output
    # (the machine's own name in the command to type)
    assert f"`ipuos halt --name {machine.name}`, then start the machine again" in result.output
    refused = invoke(machine, "halt", "--if-saved")
    time.sleep(0.5)  # (a halt it had carried out would have ended it by now)
    assert refused.exit_code != 0 and lock_holder(machine.paths.lock) == machine.pid
    result = invoke(machine, "halt")
    assert result.exit_code == 0, result.output
    assert f"halted machine {machine.name!r} (it runs another ipuos release: stopped by signal)" in result.output
    assert lock_holder(machine.paths.lock) is None


def test_a_machine_whose_socket_was_replaced_says_so_and_halt_stops_it(machine):
    # (a deleted one is put back by the daemon: see test_daemon_lifecycle; a file put in
    # its place is not the daemon's to remove)
    os.kill(machine.pid, signal.SIGSTOP)
    try:
        machine.paths.socket.unlink()
        stray = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # that nobody listens on
        stray.bind(str(machine.paths.socket))
        stray.close()
    finally:
        os.kill(machine.pid, signal.SIGCONT)
    # a serving daemon's lock says so: no command waits for the socket to come back
    for command in (["status"], ["shell", "-c", "ls /"], ["ps"]):
        started = time.monotonic()
        result = CliRunner().invoke(main, [*command, "--name", machine.name])
        assert time.monotonic() - started < 5, command
        assert result.exit_code == 3, (command, result.output)
        assert (f"machine {machine.name!r} runs (pid {machine.pid}), but its socket "
                f"{machine.paths.socket} was deleted or replaced: nothing can reach it; `ipuos halt --name") \
            in result.output
    refused = CliRunner().invoke(main, ["halt", "--name", machine.name, "--if-saved"])
    assert refused.exit_code != 0 and "cannot back up or say whether it is saved" in refused.output
    result = CliRunner().invoke(main, ["halt", "--name", machine.name])
    assert result.exit_code == 0, result.output
    assert "stopped by signal" in result.output
    assert lock_holder(machine.paths.lock) is None


def test_a_stopped_daemon_is_named_as_stopped_and_halt_stops_it_at_once(machine):
    # (not blamed on a call into C; and a halt's SIGTERM must not wait for a SIGCONT to
    # halt the machine whenever someone lets it go on)
    os.kill(machine.pid, signal.SIGSTOP)
    try:
        listed = CliRunner().invoke(main, ["machines"])
        refused = CliRunner().invoke(main, ["halt", "--if-saved", "--name", machine.name])
    except BaseException:
        os.kill(machine.pid, signal.SIGCONT)
        raise
    assert (f"its daemon (pid {machine.pid}) is stopped (by SIGSTOP, Ctrl-Z or a debugger): "
            f"`kill -CONT {machine.pid}` lets it go on") in listed.output, listed.output
    assert refused.exit_code == 1 and f"(pid {machine.pid}) is stopped" in refused.output, refused.output
    assert lock_holder(machine.paths.lock) == machine.pid
    started = time.monotonic()
    halted = CliRunner().invoke(main, ["halt", "--name", machine.name])
    assert halted.exit_code == 0 and "stopped by signal" in halted.output, halted.output
    assert time.monotonic() - started < 10 and lock_holder(machine.paths.lock) is None


def test_a_command_waiting_on_a_stopped_daemon_says_so_within_seconds(machine):
    """ps, status and kill waited their whole timeout (30-40 s) on a daemon stopped by
    a signal before saying it was stopped."""
    os.kill(machine.pid, signal.SIGSTOP)
    try:
        for command in (["ps"], ["status", "--json"], ["kill", "3"]):
            started = time.monotonic()
            result = CliRunner().invoke(main, [*command, "--name", machine.name])
            assert time.monotonic() - started < 8, command
            assert result.exit_code != 0, (command, result.output)
            assert (f"machine {machine.name!r} cannot answer {command[0]!r}: its daemon (pid {machine.pid}) "
                    f"is stopped (by SIGSTOP, Ctrl-Z or a debugger): `kill -CONT {machine.pid}` lets it go on"
                    ) in result.output, (command, result.output)
    finally:
        os.kill(machine.pid, signal.SIGCONT)
    assert invoke(machine, "ps").exit_code == 0


def test_ctrl_c_while_waiting_for_the_daemon_is_status_130(machine):
    """A daemon that does not answer (stopped here) keeps a command waiting; Ctrl-C then
    ends it as an interruption (130), not as click's 'Aborted!' error (1)."""
    import subprocess

    os.kill(machine.pid, signal.SIGSTOP)
    try:
        for command in (["ps"], ["status", "--json"], ["kill", "3"]):
            client = subprocess.Popen([IPUOS, *command, "--name", machine.name], env=machine.env(),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            time.sleep(1.0)
            client.send_signal(signal.SIGINT)
            out, err = client.communicate(timeout=30)
            assert client.returncode == 130, (command, err)
            assert err.strip() == "ipuos: interrupted", err
            assert "Aborted" not in err and out == ""
    finally:
        os.kill(machine.pid, signal.SIGCONT)
    assert invoke(machine, "ps").exit_code == 0


@contextlib.contextmanager
def _machine_answering(replies: dict[str, bytes], hold_lock: bool = False):
    """A stand-in for a machine's daemon: on each connection it answers the first request,
    a command of ``replies``, with that command's frames (for request id 1, the first of
    every client), then waits for the client to go. With ``hold_lock`` it holds the
    machine's lock as a daemon does. Yields the machine's name."""
    paths = machine_paths(unique_name("odd"))
    lock = acquire_lock(paths.lock, paths.name) if hold_lock else None
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(paths.socket))
    listener.listen(8)
    listener.settimeout(0.1)
    stop = threading.Event()
    served = []

    def answer(connection):
        with connection:
            request_frame = read_frame(connection)
            connection.sendall(replies[request_frame.header["cmd"]])
            closed_by_peer(connection)

    def serve():
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            served.append(threading.Thread(target=answer, args=(connection,), daemon=True))
            served[-1].start()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        yield paths.name
    finally:
        stop.set()
        for thread in [server, *served]:
            thread.join(10)
        listener.close()
        paths.socket.unlink()
        if lock is not None:
            paths.lock.unlink()
            os.close(lock)


@pytest.mark.parametrize("command, reply, what", [
    (["status"], encode_frame({"id": 1, "type": "result", "result_in_payload": True}, b"xxxxx"),
     "its result is not JSON: Expecting value"),
    (["status"], encode_frame({"id": 1, "type": "result", "result": [1, 2]}), "its result is not a JSON object"),
    (["status"], encode_frame({"id": 1, "type": "error", "error": "boom"}), "its error is not a JSON object"),
    (["backup", "{tmp}/m.img"], encode_frame({"id": 1, "type": "event", "event": [1]}),
     "its event is not a JSON object"),
])
def test_a_malformed_reply_is_one_clear_error(runtime_dir, tmp_path, command, reply, what):
    with _machine_answering({command[0]: reply}) as name:
        args = [arg.format(tmp=tmp_path) for arg in command]
        result = CliRunner().invoke(main, [*args, "--name", name])
    assert isinstance(result.exception, SystemExit) and result.exit_code == 1  # (not a TypeError ...)
    assert result.output.startswith(f"ipuos: machine {name!r} sent a bad reply: {what}")
    assert result.output.count("\n") == 1


def _result(result: dict) -> bytes:
    return encode_frame({"id": 1, "type": "result", "result": result})


def _event(event: dict) -> bytes:
    return encode_frame({"id": 1, "type": "event", "event": event})


@pytest.fixture(scope="module")
def real_results(shared_machine, tmp_path_factory):
    """What a real daemon answers the commands below, to answer them with again, spoiled."""
    image = tmp_path_factory.mktemp("backup") / "m.img"
    program = b"print('hello from', __tileid)\n"
    asks = [("hello", {}, b""), ("status", {}, b""), ("ps", {}, b""),
            ("run", {"filename": "p.py", "source_len": len(program), "tiles": "0-1"}, program),
            ("backup", {"path": str(image)}, b"")]
    sock = raw_socket(shared_machine.paths)
    results = {}
    with sock:
        for request_id, (cmd, args, payload) in enumerate(asks, 1):
            sock.sendall(request(request_id, cmd, args, payload))
            while (frame := read_frame(sock)).header["type"] == "event":
                pass
            results[cmd] = frame.header["result"]
    # (a halt and a mount would end or change the shared machine: these are as the daemon answers)
    results["halt"] = {"name": "m", "pid": 4242, "interrupted_jobs": [], "backup": None}
    results["mounts"] = {"mounts": [{"mountpoint": "/mnt/m", "detached": False, "readonly": False,
                                     "tiles": "0-15", "foreground": False, "client_pid": 4343,
                                     "since": 1700000000.0, "open_files": 0, "requests": 3}]}
    results["shell.attach"] = {"event": "attached", "session": 1, "status": 0, "cwd": "/", "mode": "shell",
                               "prompt": "$ ", "ntiles": 16, "sram_per_tile": 65536}
    results["shell.exec"] = {"status": 0, "cwd": "/", "mode": "shell", "prompt": "$ ",
                             "output": [["out", "/\n"]]}
    return results


def _spoil(results: dict, cmd: str, how) -> dict:
    spoiled = json.loads(json.dumps(results[cmd]))
    how(spoiled)
    return spoiled


def _job_without_client_pid(ps: dict) -> None:
    ps["jobs"] = [{"job": 7, "name": "p.py", "tiles": "0", "ntiles": 1, "elapsed_seconds": 1.5}]


# (command line, the command whose result is spoiled, how, what the error says)
SPOILED = {
    "status-missing": (["status"], "status", lambda r: r.pop("uptime_seconds"),
                       "its 'status' result lacks uptime_seconds"),
    "status-mistyped": (["status"], "status", lambda r: r.update(sram_per_tile="64K"),
                        "sram_per_tile in its 'status' result is text, not an integer"),
    "ps-missing": (["ps"], "ps", lambda r: r.pop("states"), "its 'ps' result lacks states"),
    "ps-mistyped": (["ps"], "ps", lambda r: r["sram_used"].__setitem__(3, "a lot"),
                    "sram_used[3] in its 'ps' result is text, not an integer"),
    "ps-json": (["ps", "--json"], "ps", _job_without_client_pid, "its 'ps' result lacks jobs[0].client_pid"),
    "run-missing": (["run", "{tmp}/p.py"], "run", lambda r: r["tiles"][1].pop("output"),
                    "its 'run' result lacks tiles[1].output"),
    "run-mistyped": (["run", "--stats", "{tmp}/p.py"], "run", lambda r: r["stats"].update(wall_seconds="soon"),
                     "stats.wall_seconds in its 'run' result is text, not a number"),
    "halt": (["halt"], "halt", lambda r: r.pop("interrupted_jobs"), "its 'halt' result lacks interrupted_jobs"),
    "backup": (["backup", "{tmp}/m.img"], "backup", lambda r: r.pop("file_size"),
               "its 'backup' result lacks file_size"),
    "mounts": (["mount"], "mounts", lambda r: r["mounts"][0].pop("since"),
               "its 'mounts' result lacks mounts[0].since"),
    "shell": (["shell", "-c", "pwd"], "shell.exec", lambda r: r.pop("prompt"),
              "its 'shell.exec' result lacks prompt"),
}


def _answers(results: dict, spoiled_cmd: str | None = None, spoiled: dict | None = None) -> dict[str, bytes]:
    answers = {cmd: _result(result) for cmd, result in results.items()}
    answers["shell.attach"] = _event(results["shell.attach"])  # (and no result: the session stays open)
    if spoiled_cmd is not None:
        answers[spoiled_cmd] = _result(spoiled)
    return answers


@pytest.mark.parametrize("command, cmd, how, what", SPOILED.values(), ids=SPOILED)
def test_a_reply_lacking_a_field_or_with_one_of_the_wrong_type_is_one_clear_error(
        runtime_dir, real_results, tmp_path, command, cmd, how, what):
    (tmp_path / "p.py").write_text("print('hello from', __tileid)\n")
    args = [arg.format(tmp=tmp_path) for arg in command]
    with _machine_answering(_answers(real_results)) as name:  # as they came, the command works
        result = CliRunner().invoke(main, [*args, "--name", name])
    assert result.exit_code == 0, result.output
    with _machine_answering(_answers(real_results, cmd, _spoil(real_results, cmd, how))) as name:
        result = CliRunner().invoke(main, [*args, "--name", name])
    assert isinstance(result.exception, SystemExit), result.exception  # (not a KeyError ...)
    assert result.exit_code == 1
    assert result.output == f"ipuos: machine {name!r} sent a bad reply: {what}\n"


def test_an_event_with_a_field_of_the_wrong_type_is_one_clear_error(runtime_dir, real_results, tmp_path):
    progress = _event({"event": "progress", "phase": "writing", "done": "half", "total": 100})
    with _machine_answering({"backup": progress + _result(real_results["backup"])}) as name:
        result = CliRunner().invoke(main, ["backup", str(tmp_path / "m.img"), "--name", name])
    assert isinstance(result.exception, SystemExit) and result.exit_code == 1, result.output
    assert result.output == (f"ipuos: machine {name!r} sent a bad reply: done in its 'progress' event is text, "
                             "not an integer\n")


def test_machines_says_which_machine_sent_a_bad_hello(runtime_dir, real_results):
    hello = _spoil(real_results, "hello", lambda r: r.pop("preset"))
    with _machine_answering({"hello": _result(hello)}, hold_lock=True) as name:
        result = CliRunner().invoke(main, ["machines"])
    assert result.exit_code == 0, result.output
    assert (f"{name}  not answering: machine {name!r} sent a bad reply: its 'hello' result lacks preset  "
            f"pid {os.getpid()}") in result.output.splitlines()


def test_uptime_and_job_times_ignore_steps_of_the_wall_clock(monkeypatch):
    """Durations came from the wall clock: a step back of an hour (NTP, a user setting
    the date) showed `uptime -3596.6 s` and negative elapsed times in ps."""
    from daemon_harness import unique_name

    from ipuos import Machine
    from ipuos._host import MachineHost

    with Machine("tiny") as machine:
        host = MachineHost(machine, machine_paths(unique_name()))
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() - 3600)
        assert 0 <= host.uptime < 60
        monkeypatch.setattr(time, "time", lambda: real() + 86400)
        assert 0 <= host.uptime < 60
