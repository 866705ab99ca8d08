"""``ipuos halt`` of a daemon that cannot answer: a tile inside one long call into C code
holds the interpreter, so none of the daemon's threads runs (nor its SIGTERM handler).
Halt must say so, naming the pid and the way out, and ``--force`` must end it."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time

import pytest
from click.testing import CliRunner
from daemon_harness import IPUOS, machine, runtime_dir, wait_for  # noqa: F401  (fixtures)

import ipuos._cli
from ipuos._cli import main
from ipuos._client import DaemonError
from ipuos._rundir import lock_holder
from ipuos._spawn import hello

#: backtracks for as long as the universe lasts, inside one call of the re module
STUCK_IN_C = "import re\nre.match(r'(a+)+$', 'a' * 40 + 'b')\n"


def invoke(booted, *args):
    return CliRunner(env={"IPUOS_MACHINE": booted.name}).invoke(main, list(args))


@pytest.fixture
def held_machine(machine, tmp_path):
    """``machine`` held by ``ipuos run`` of a program stuck in C; yields the machine and
    the waiting run client. Kills the daemon if the test has not."""
    program = tmp_path / "regex.py"
    program.write_text(STUCK_IN_C)
    client = subprocess.Popen([IPUOS, "run", str(program), "--tiles", "1"], env=machine.env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield machine, client
    finally:
        if lock_holder(machine.paths.lock) is not None:
            os.kill(machine.pid, signal.SIGKILL)
        client.kill()
        client.communicate(timeout=30)


def test_a_run_waiting_on_a_daemon_held_by_a_call_into_c_says_how_to_end_it(held_machine):
    """Its job holds the daemon (ps and kill time out), so the client must not point at
    them as it does when a tile computes in Python: it names the pid and halt --force."""
    booted, client = held_machine
    ready, _, _ = select.select([client.stderr], [], [], 30)
    assert ready, "the waiting client said nothing"
    line = client.stderr.readline()
    # the job did start (it is the one in C): a daemon that answers nothing cannot say so,
    # and the client must not claim it is still queued
    assert "has not started" not in line, line
    assert line.startswith(f"ipuos: machine {booted.name!r} does not answer at all (daemon pid {booted.pid}), "
                           "so it cannot say whether this job has started: a tile is most likely inside "
                           "one long call into C code"), line
    assert "perhaps this very job" in line
    assert f"`ipuos halt --force --name {booted.name}` ends it (Ctrl-C twice stops waiting)" in line
    assert "ipuos ps" not in line and "ipuos kill" not in line


def test_halt_of_a_daemon_held_by_a_call_into_c_names_its_pid_and_force_kills_it(held_machine, monkeypatch):
    booted, client = held_machine
    select.select([client.stderr], [], [], 30)  # (once the client says the daemon is held)
    with pytest.raises(DaemonError) as timed_out:  # what every command says, ps as well as hello
        hello(booted.paths, wait=1.0)
    assert timed_out.value.message == (
        f"machine {booted.name!r} did not answer 'hello' within 1 s: a tile is most likely inside one "
        "long call into C code (a regular expression that backtracks without end, say), which holds the "
        "whole daemon and cannot be interrupted; it answers again once that call returns, or "
        f"`ipuos halt --force --name {booted.name}` ends it")

    monkeypatch.setattr(ipuos._cli, "HALT_ANSWER_SECONDS", 2.0)
    monkeypatch.setattr(ipuos._cli, "SIGTERM_SECONDS", 1.0)
    result = invoke(booted, "halt")
    assert result.exit_code == 1, result.output
    assert result.output == (
        f"ipuos: machine {booted.name!r} (pid {booted.pid}): it did not answer 'halt' within 2 s, and "
        "SIGTERM did not stop it: a tile is most likely inside one long call into C code (a regular "
        "expression that backtracks without end, say), which holds the whole daemon and cannot be "
        f"interrupted. `ipuos halt --force --name {booted.name}` kills it (as `kill -9 {booted.pid}` "
        "does); its programs and files are dropped, as any halt drops them\n")
    assert lock_holder(booted.paths.lock) == booted.pid  # (SIGTERM cannot end it)

    refused = invoke(booted, "halt", "--if-saved")
    assert refused.exit_code == 1
    assert refused.output.startswith(f"ipuos: machine {booted.name!r} (pid {booted.pid}) did not answer "
                                     "'halt' within 2 s, so it cannot back up or say whether it is saved")

    result = invoke(booted, "halt", "--force")
    assert result.exit_code == 0, result.output
    assert result.output == (f"killed machine {booted.name!r} (pid {booted.pid}) with SIGKILL: SIGTERM "
                             "did not stop it\n")
    assert lock_holder(booted.paths.lock) is None
    _, err = client.communicate(timeout=30)
    assert client.returncode == 1 and f"machine {booted.name!r} closed the connection" in err


def test_halt_force_of_a_machine_that_answers_halts_it_cleanly(machine):
    result = invoke(machine, "halt", "--force")
    assert result.exit_code == 0, result.output
    assert result.output == f"halted machine {machine.name!r} (--force: stopped by signal)\n"
    assert lock_holder(machine.paths.lock) is None
    assert "SIGTERM: halting" in machine.paths.log.read_text()  # (the daemon's own clean halt)
    again = invoke(machine, "halt", "--force")
    assert again.exit_code == 3
    assert again.output.startswith(f"ipuos: no machine named {machine.name!r} is running")


@pytest.mark.parametrize("option", [["--if-saved"], ["--backup", "m.img"]])
def test_halt_force_refuses_to_promise_a_save(machine, option):
    result = invoke(machine, "halt", "--force", *option)
    assert result.exit_code == 2
    assert ("--force cannot be combined with --if-saved or --backup: a daemon that must be killed can "
            "neither back up nor say what is unsaved") in result.output
    assert lock_holder(machine.paths.lock) == machine.pid


def test_halt_of_a_machine_held_by_a_program_catching_every_interrupt_tells_its_run_client(machine, tmp_path):
    """The program computes on after catching each stop, so the machine stops with the job
    still running: its run client said only 'closed the connection' (exit 1), and the
    daemon's log had a traceback of the client's cancel hook failing on the stopped machine."""
    program = tmp_path / "catching.py"
    program.write_text("print('began', flush=True)\n"
                       "while True:\n    try:\n        while True:\n            try:\n"
                       "                x = sum(range(10000))\n            except:\n                pass\n"
                       "    except:\n        pass\n")
    client = subprocess.Popen([IPUOS, "run", str(program), "--tiles", "1"], env=machine.env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: json.loads(invoke(machine, "ps", "--json").output)["jobs"], what="the job to start")
        time.sleep(0.5)  # (into its loop)
        assert invoke(machine, "halt").exit_code == 0
        _, err = client.communicate(timeout=60)
    finally:
        client.kill()
    assert client.returncode == 130, err
    assert err == ("ipuos: the machine stopped before job 1 was done: tile 1 was still computing without "
                   "reaching an exchange point, its program catching every interrupt, and what the job's "
                   "tiles printed is lost\n")
    log = machine.paths.log.read_text()
    assert "Traceback" not in log and "ERROR" not in log, log


def test_kill_of_a_job_whose_part_in_the_shell_catches_its_stop_says_only_halting_ends_it(machine, tmp_path):
    """The shell runs tile 0's part of a job inside its own request, so tile 0 cannot
    leave a program there that catches every stop: ``kill`` blamed a long call into C
    (exit 0) while the job ran on until the machine halted."""
    program = tmp_path / "catching.py"
    program.write_text("if __tileid == 1:\n    raise ValueError('the failure')\n"
                       "while True:\n    try:\n        sync()\n    except:\n        pass\n")
    assert invoke(machine, "shell", "-c", f"put {program} /chip/catching.py").exit_code == 0
    shell = subprocess.Popen([IPUOS, "shell", "-c", "run /chip/catching.py --tiles 0-3"], env=machine.env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: json.loads(invoke(machine, "ps", "--json").output)["jobs"], what="the job to start")
        job = json.loads(invoke(machine, "ps", "--json").output)["jobs"][0]["job"]
        result = invoke(machine, "kill", str(job))
        assert result.exit_code == 1, result.output
        assert (f"asked job {job} to stop; its part on tile 0 has not stopped: it runs inside the shell's own "
                "request there, and its program catches the stop") in result.output
        assert "call into C" not in result.output
    finally:
        shell.kill()
        shell.wait(10)
