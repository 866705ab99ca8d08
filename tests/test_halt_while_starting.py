"""``ipuos halt`` (and the commands that look) while a machine is starting: ``ipuos run
... &`` spawns a daemon, which takes its lock only once Python has started it, and binds
its socket only once its machine has booted. A halt in that window must stop the machine
once it is up, not say none runs and leave it running (see ``_rundir.starting``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from daemon_harness import IPUOS, run_cli, runtime_dir, unique_name, wait_for  # noqa: F401  (fixtures)

from ipuos._rundir import hold_boot_marker, lock_holder, machine_paths, starting


def spawn_daemon(paths, marker_fd: int) -> subprocess.Popen:
    """The daemon as ``_spawn`` starts it, handed the boot marker the test holds."""
    return subprocess.Popen([sys.executable, "-m", "ipuos._daemon", "--name", paths.name, "--preset", "tiny",
                             "--rundir", str(paths.dir), "--boot-marker-fd", str(marker_fd)],
                            pass_fds=(marker_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def _halt_while_spawned(paths, *options) -> tuple[int, str, str, int]:
    """``ipuos halt OPTIONS`` started while the boot marker is held and no daemon exists
    yet, then the daemon spawned: (halt's status, output, errors; the daemon's status)."""
    marker = hold_boot_marker(paths.boot_marker)
    daemon = None
    halt = subprocess.Popen([IPUOS, "halt", *options, "--name", paths.name], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        assert halt.poll() is None, halt.communicate()  # waiting for the machine, not "not running"
        daemon = spawn_daemon(paths, marker)
        os.close(marker)
        marker = None
        out, err = halt.communicate(timeout=60)
        return halt.returncode, out, err, daemon.wait(timeout=30)
    finally:
        if marker is not None:
            os.close(marker)
        halt.kill()
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_halt_while_a_machine_is_being_spawned_waits_and_halts_it(runtime_dir):
    """The spawner holds the boot marker before its daemon exists: halt must wait for the
    daemon, not report that no machine runs, and stop it as it comes (asked once it is
    up, or by signal while it boots)."""
    paths = machine_paths(unique_name("starting"))
    status, out, err, daemon_status = _halt_while_spawned(paths)
    assert status == 0, err
    assert out.startswith(f"halted machine {paths.name!r}")
    assert err == f"ipuos: machine {paths.name!r} is starting; halting it once it has a daemon pid\n"
    assert daemon_status in (0, -signal.SIGTERM)
    assert lock_holder(paths.lock) is None and not starting(paths)


def test_run_in_the_background_then_halt_leaves_no_machine(runtime_dir, tmp_path):
    """The script ``ipuos run prog.py & ipuos halt``: the machine run started is halted."""
    program = tmp_path / "prog.py"
    program.write_text("print(1)\n")
    paths = machine_paths(unique_name("bg"))
    run = subprocess.Popen([IPUOS, "run", str(program), "--preset", "tiny", "--tiles", "0", "--name", paths.name],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: starting(paths) or lock_holder(paths.lock), timeout=30, what="the spawn")
        halted = run_cli("halt", "--name", paths.name)
        assert halted.returncode == 0, halted.stderr
        assert halted.stdout.startswith(f"halted machine {paths.name!r}")  # (asked, or by signal as it boots)
        run.communicate(timeout=60)
        assert lock_holder(paths.lock) is None and not starting(paths)
        assert run_cli("machines").stdout.count(paths.name) == 0
    finally:
        if run.poll() is None:
            run.kill()
        run_cli("halt", "--force", "--name", paths.name)


def test_halt_does_not_wait_for_a_daemon_booting_with_its_lock(runtime_dir):
    """A boot restoring a big image holds its lock for long before it serves: halt stops
    it by signal at once. (The test keeps holding the boot marker, so the daemon seems to
    boot for as long as the test likes.)"""
    paths = machine_paths(unique_name("booting"))
    marker = hold_boot_marker(paths.boot_marker)
    daemon = spawn_daemon(paths, marker)
    try:
        wait_for(lambda: lock_holder(paths.lock) == daemon.pid, timeout=30, what="the daemon's lock")
        halted = run_cli("halt", "--name", paths.name, timeout=30)
        assert halted.returncode == 0, halted.stderr
        assert halted.stdout == f"halted machine {paths.name!r} (it was starting: stopped by signal)\n"
        assert daemon.wait(timeout=30) in (0, -signal.SIGTERM)
        assert lock_holder(paths.lock) is None
    finally:
        os.close(marker)
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def test_halt_force_while_a_machine_is_being_spawned_kills_it(runtime_dir):
    paths = machine_paths(unique_name("forced"))
    status, out, err, daemon_status = _halt_while_spawned(paths, "--force")
    assert status == 0, err
    assert daemon_status != 0 or out.startswith(f"halted machine {paths.name!r}")
    assert lock_holder(paths.lock) is None


def test_status_and_machines_wait_for_a_machine_that_is_starting(runtime_dir):
    """``status`` right after ``ipuos boot &`` answers once the machine is up; ``machines``
    lists one that is starting."""
    paths = machine_paths(unique_name("look"))
    marker = hold_boot_marker(paths.boot_marker)
    daemon = None
    try:
        listed = run_cli("machines")
        assert f"{paths.name}  not answering: machine {paths.name!r} is starting (its daemon has not " \
               "taken its lock yet) and does not answer yet" in listed.stdout
        first = subprocess.Popen([IPUOS, "status", "--name", paths.name], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        daemon = spawn_daemon(paths, marker)
        os.close(marker)
        marker = None

        def answered(returncode: int, out: str, err: str) -> str | None:
            """status's output once the machine is up (None if it said the machine is
            starting: it waits a few seconds for one, and a loaded host may take longer)"""
            if returncode != 0 and f"machine {paths.name!r} is starting" in err:
                return None
            assert returncode == 0, err
            return out

        out = answered(first.wait(timeout=60), *first.communicate())
        if out is None:
            out = wait_for(lambda: answered(*_status(paths)), timeout=60, what="status to answer")
        assert f"machine        {paths.name} (pid {daemon.pid})" in out
    finally:
        if marker is not None:
            os.close(marker)
        run_cli("halt", "--name", paths.name)
        if daemon is not None:
            daemon.wait(timeout=30)


def _status(paths):
    done = run_cli("status", "--name", paths.name)
    return done.returncode, done.stdout, done.stderr


def test_a_daemon_that_fails_to_start_lets_go_of_the_boot_marker(runtime_dir, tmp_path):
    paths = machine_paths(unique_name("failed"))
    boot = run_cli("boot", "--preset", "tiny", "--restore", str(tmp_path / "none.img"), "--name", paths.name)
    assert boot.returncode == 1
    assert not starting(paths) and lock_holder(paths.lock) is None
    assert run_cli("halt", "--name", paths.name).returncode == 3
