"""Booting and halting daemons: detaching, one per name, stale sockets, races, halt flags."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time

import pytest
from daemon_harness import (  # noqa: F401  (fixtures)
    boot_machine,
    empty_runtime_dir,
    machine,
    raw_socket,
    read_frame,
    request,
    run_cli,
    runtime_dir,
    unique_name,
    wait_for,
)

from ipuos._client import Client, DaemonError, MachineNotRunning
from ipuos._daemon import MAX_CLIENTS
from ipuos._rundir import lock_holder, machine_paths
from ipuos._spawn import ensure_running, wait_halted


def test_boot_detaches_and_halt_cleans_up(runtime_dir):
    name = unique_name("life")
    done = run_cli("boot", "--preset", "tiny", "--name", name)
    assert done.returncode == 0, done.stderr
    paths = machine_paths(name)
    try:
        pid = lock_holder(paths.lock)
        assert f"booted machine {name!r}: tiny, 1 IPU, 16 tiles (pid {pid}" in done.stdout
        assert os.getsid(pid) == pid  # its own session: no terminal's Ctrl-C reaches it
        assert os.readlink(f"/proc/{pid}/cwd") == "/"
        assert os.readlink(f"/proc/{pid}/fd/1") == os.readlink(f"/proc/{pid}/fd/2") == str(paths.log)
        assert "booted" in paths.log.read_text()
    finally:
        halted = run_cli("halt", "--name", name)
    assert halted.returncode == 0 and halted.stdout == f"halted machine {name!r}\n"
    assert not paths.socket.exists() and not paths.lock.exists()
    assert "halted" in paths.log.read_text()


def test_a_second_boot_of_the_same_name_is_refused(machine):
    done = run_cli("boot", "--preset", "tiny", "--name", machine.name)
    assert done.returncode == 1
    assert done.stderr == (f"ipuos: machine {machine.name!r} is already running (pid {machine.pid}); "
                           f"`ipuos halt --name {machine.name}` stops it, or boot another with --name\n")
    assert machine.call("hello")["pid"] == machine.pid


def test_two_boots_of_one_name_at_once_one_wins_and_the_other_says_so(runtime_dir):
    """The losing boot's daemon exits; its client must not take the winner's answer on
    the socket for its own."""
    import subprocess

    from daemon_harness import IPUOS

    name = unique_name("race")
    try:
        for _ in range(3):
            boots = [subprocess.Popen([IPUOS, "boot", "--preset", "tiny", "--name", name],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                     for _ in range(2)]
            done = [(boot.wait(60), *boot.communicate()) for boot in boots]
            assert sorted(status for status, _, _ in done) == [0, 1], done
            winner = lock_holder(machine_paths(name).lock)
            (_, out, _), = [d for d in done if d[0] == 0]
            (_, _, err), = [d for d in done if d[0] == 1]
            assert f"(pid {winner};" in out
            assert f"is already running (pid {winner})" in err
            assert run_cli("halt", "--name", name).returncode == 0
    finally:
        run_cli("halt", "--name", name)


def test_a_lock_taken_a_moment_ago_names_its_holder(tmp_path):
    # the holder writes its pid just after taking the lock: a competitor in between must
    # still name it (the two-boots race above lost the pid that way, once in a while)
    import fcntl

    from ipuos._rundir import MachineLocked, acquire_lock

    path = tmp_path / "m.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        writer = threading.Timer(0.05, lambda: os.pwrite(fd, b"4242\n", 0))
        writer.start()
        with pytest.raises(MachineLocked) as info:
            acquire_lock(path, "m")
        writer.join()
        assert info.value.pid == 4242 and "(pid 4242)" in str(info.value)
        assert lock_holder(path) == 4242
    finally:
        os.close(fd)


def test_a_look_at_the_lock_while_a_daemon_starts_does_not_stop_it(tmp_path):
    # lock_holder() takes the lock shared for an instant to see whether it is free; a
    # daemon starting at that instant must wait it out, not exit "already running"
    import fcntl

    from ipuos._rundir import acquire_lock, release_lock

    path = tmp_path / "m.lock"
    looker = os.open(path, os.O_RDONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(looker, fcntl.LOCK_SH)
        letting_go = threading.Timer(0.1, fcntl.flock, (looker, fcntl.LOCK_UN))
        letting_go.start()
        fd = acquire_lock(path, "m")
        letting_go.join()
        assert lock_holder(path) == os.getpid()
        release_lock(fd, path)
    finally:
        os.close(looker)


def test_a_deleted_socket_is_put_back_by_its_daemon(machine):
    machine.paths.socket.unlink()
    wait_for(machine.paths.socket.exists, what="the daemon to put its socket back")
    assert machine.call("status")["pid"] == machine.pid
    assert oct(machine.paths.socket.stat().st_mode & 0o777) == oct(0o600)


def test_a_client_waits_for_a_deleted_socket_to_be_put_back(machine):
    os.kill(machine.pid, signal.SIGSTOP)  # (so the client looks before it is back)
    try:
        machine.paths.socket.unlink()
    finally:
        threading.Timer(0.3, os.kill, (machine.pid, signal.SIGCONT)).start()
    assert machine.call("status")["pid"] == machine.pid


def test_a_deleted_runtime_dir_is_put_back_and_no_second_machine_starts(monkeypatch, tmp_path):
    # a temp cleaner or `rm -r` takes the runtime dir from under a running machine: it
    # must stay reachable, and booting its name must not start a second one beside it
    import shutil

    from ipuos._rundir import RUNTIME_DIR_ENV

    rundir = tmp_path / "run"
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(rundir))
    booted = boot_machine()
    try:
        shutil.rmtree(rundir)
        wait_for(booted.paths.socket.exists, what="the daemon to put back its runtime files")
        assert oct(rundir.stat().st_mode & 0o777) == oct(0o700)
        assert lock_holder(booted.paths.lock) == booted.pid
        assert booted.call("status")["pid"] == booted.pid
        again = run_cli("boot", "--preset", "tiny", "--name", booted.name)
        assert again.returncode == 1 and f"(pid {booted.pid})" in again.stderr, again
        assert lock_holder(booted.paths.lock) == booted.pid
    finally:
        booted.halt()
        _kill_if_alive(booted.pid)  # (one left unreachable must not outlive the test)
    assert not booted.paths.lock.exists() and not booted.paths.socket.exists()


def test_a_runtime_dir_replaced_by_a_file_leaves_the_daemon_serving(monkeypatch, tmp_path):
    # (every look at its socket and lock raised NotADirectoryError, and the daemon died
    # without its shutdown: no jobs interrupted, no mounts removed)
    from ipuos._rundir import RUNTIME_DIR_ENV

    rundir = tmp_path / "run"
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(rundir))
    booted = boot_machine()
    try:
        rundir.rename(tmp_path / "moved")
        rundir.write_text("not a directory")
        time.sleep(1.0)  # (four looks)
        assert _alive(booted.pid)
        rundir.unlink()
        # the daemon makes its runtime directory again and puts its files back in it (a
        # test that moved the old one back raced it: the name was a directory again)
        wait_for(lambda: booted.paths.socket.exists() and booted.paths.lock.exists(),
                 what="the daemon to put its files back")
        assert booted.call("status")["pid"] == booted.pid
    finally:
        booted.halt()
        _kill_if_alive(booted.pid)
    assert not booted.paths.lock.exists() and not booted.paths.socket.exists()


def test_a_daemon_whose_name_was_taken_while_its_files_were_gone_halts_and_leaves_the_others(machine):
    import fcntl

    paths = machine.paths
    os.kill(machine.pid, signal.SIGSTOP)  # (so it cannot put its files back first)
    try:
        paths.lock.unlink()
        paths.socket.unlink()
        other = os.open(paths.lock, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(other, fcntl.LOCK_EX)
        os.pwrite(other, b"4242\n", 0)
    finally:
        os.kill(machine.pid, signal.SIGCONT)
    try:
        wait_for(lambda: not _alive(machine.pid), timeout=20, what="the unreachable daemon to halt")
        assert paths.lock.read_bytes() == b"4242\n"  # the new holder's lock is left alone
        assert not paths.socket.exists()
    finally:
        os.close(other)
        paths.lock.unlink()
        _kill_if_alive(machine.pid)


def _kill_if_alive(pid: int) -> None:
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            return stat_file.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_two_halts_at_once_both_report_the_machine_halted(runtime_dir):
    import subprocess

    from daemon_harness import IPUOS

    name = unique_name("halts")
    for _ in range(4):
        assert run_cli("boot", "--preset", "tiny", "--name", name).returncode == 0
        halts = [subprocess.Popen([IPUOS, "halt", "--name", name], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        done = [(halt.wait(60), *halt.communicate()) for halt in halts]
        for status, out, err in done:
            # 0 and "halted", or 3: it had gone before this one asked (not running)
            assert (status == 0 and out.startswith(f"halted machine {name!r}")) or status == 3, done
        assert lock_holder(machine_paths(name).lock) is None


def test_a_second_daemon_started_by_hand_exits_without_touching_the_first(machine, runtime_dir):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "ipuos._daemon", "--name", machine.name, "--preset", "tiny",
                           "--rundir", str(runtime_dir)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 3
    assert "is already running" in done.stderr
    assert machine.call("hello")["pid"] == machine.pid


def test_kill_9_then_boot_removes_the_stale_socket(runtime_dir):
    booted = boot_machine()
    os.kill(booted.pid, signal.SIGKILL)
    wait_for(lambda: lock_holder(booted.paths.lock) is None, what="the daemon to die")
    assert booted.paths.socket.exists()  # left behind
    status = run_cli("status", "--name", booted.name)
    assert status.returncode == 3
    assert f"no machine named {booted.name!r} is running" in status.stderr
    assert "died without cleaning up" in status.stderr
    again = run_cli("boot", "--preset", "tiny", "--name", booted.name)
    try:
        assert again.returncode == 0, again.stderr
        assert "removed the stale socket" in booted.paths.log.read_text()
        assert run_cli("status", "--name", booted.name).returncode == 0
    finally:
        run_cli("halt", "--name", booted.name)


def test_a_file_where_the_socket_goes_is_named_as_in_the_way(runtime_dir):
    """The client called it a dead daemon's leftover, which booting removes; booting
    then refused it (it removes sockets only)."""
    from ipuos._rundir import machine_paths

    paths = machine_paths("squatted", runtime_dir)
    paths.socket.write_text("not a socket")
    status = run_cli("status", "--name", "squatted")
    assert status.returncode == 3
    assert (f"no machine named 'squatted' is running; start one with `ipuos boot --name squatted` once "
            f"{paths.socket} is out of the way (it is no socket: remove it)") in status.stderr, status.stderr
    assert "died without cleaning up" not in status.stderr
    assert paths.socket.read_text() == "not a socket"


def test_a_symbolic_link_where_the_socket_goes_reaches_no_machine(machine, runtime_dir):
    """It led to another machine's socket: `halt --name A` halted machine B."""
    from ipuos._rundir import machine_paths

    paths = machine_paths("linked", runtime_dir)
    paths.socket.symlink_to(machine.paths.socket)
    for command in ("status", "halt"):
        done = run_cli(command, "--name", "linked")
        assert done.returncode == 1
        assert f"{paths.socket} is a symbolic link, not the socket of machine 'linked'" in done.stderr, done.stderr
    assert machine.call("hello")["name"] == machine.name  # (not halted)
    paths.socket.unlink()


def test_a_socket_that_is_not_stale_is_never_removed(machine, runtime_dir):
    """Something answering on the socket while the lock is free: boot refuses, touches nothing."""
    import socket

    impostor = socket.socket(socket.AF_UNIX)
    other = machine_paths(unique_name("imp"))
    impostor.bind(str(other.socket))
    impostor.listen(1)
    try:
        done = run_cli("boot", "--preset", "tiny", "--name", other.name)
        assert done.returncode == 1
        assert "something already answers on" in done.stderr
        assert other.socket.exists()
    finally:
        impostor.close()
        other.socket.unlink()


@contextlib.contextmanager
def _listener_with_a_full_queue(paths):
    """A socket at ``paths.socket`` that listens and accepts nothing, its queue full: a
    connect to it fails with EAGAIN, not ECONNREFUSED."""
    import socket

    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(paths.socket))
    listener.listen(0)
    queued = []
    try:
        while True:
            client = socket.socket(socket.AF_UNIX)
            client.setblocking(False)
            queued.append(client)
            try:
                client.connect(str(paths.socket))
            except BlockingIOError:
                break
        yield
    finally:
        for client in queued:
            client.close()
        listener.close()
        paths.socket.unlink()


def test_a_listener_with_a_full_queue_is_not_stale(runtime_dir):
    other = machine_paths(unique_name("full"))
    with _listener_with_a_full_queue(other):
        done = run_cli("boot", "--preset", "tiny", "--name", other.name)
        assert done.returncode == 1
        assert "something already answers on" in done.stderr, done.stderr
        assert other.socket.exists()


def test_a_client_waits_for_a_full_queue_and_says_so(runtime_dir):
    other = machine_paths(unique_name("full"))
    with _listener_with_a_full_queue(other):
        started = time.monotonic()
        with pytest.raises(DaemonError) as info:
            Client(other, connect_timeout=0.5)
        assert time.monotonic() - started >= 0.5  # it waited for room, as a blocking connect would
        assert f"machine {other.name!r} accepts no connection" in info.value.message
        assert "overloaded or stuck" in info.value.message


def test_racing_starts_share_one_daemon(runtime_dir):
    paths = machine_paths(unique_name("race"))
    infos, errors = [], []

    def start():
        try:
            infos.append(ensure_running(paths, "tiny", 1))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert errors == []
        assert len({info["pid"] for info, _ in infos}) == 1
        assert sum(booted for _, booted in infos) >= 1
    finally:
        with Client(paths) as client:
            client.call("halt")
        wait_halted(paths)


@pytest.mark.parametrize("kind, what", [("log", "directory"), ("log", "link"), ("log", "fifo"),
                                        ("lock", "directory"), ("lock", "link"), ("lock", "fifo")])
def test_a_stray_log_or_lock_is_named_with_what_to_do(runtime_dir, tmp_path, kind, what):
    # (a directory named NAME.log gave a Python traceback, NAME.lock a bare IsADirectoryError)
    name = unique_name("stray")
    stray = runtime_dir / f"{name}.{kind}"
    if what == "directory":
        stray.mkdir()
    elif what == "fifo":  # (opening it waited for a reader: boot hung)
        os.mkfifo(stray, 0o600)
    else:
        stray.symlink_to(tmp_path / "elsewhere")
    done = run_cli("boot", "--preset", "tiny", "--name", name, timeout=30)
    reason = {"directory": "Is a directory", "fifo": "it is not a regular file"}.get(what, "it is a symbolic link")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"cannot open the machine's {kind} {stray}: {reason}; remove or rename it and boot " \
           "again" in done.stderr, done.stderr
    assert lock_holder(machine_paths(name).lock) is None  # nothing was left running
    assert not (tmp_path / "elsewhere").exists()


def test_status_of_a_machine_that_never_ran(empty_runtime_dir):
    done = run_cli("status", "--name", "never-booted")
    assert done.returncode == 3
    assert done.stderr == ("ipuos: no machine named 'never-booted' is running; "
                           "start one with `ipuos boot --name never-booted`\n")


def test_halt_interrupts_running_jobs_and_their_clients_get_results(runtime_dir):
    booted = boot_machine()
    source = b"print('before halt')\nwhile True:\n    sync()\n"
    sock = raw_socket(booted.paths)
    sock.sendall(request(1, "run", {"filename": "spin.py", "source_len": len(source), "tiles": "0-1"}, source))
    job = read_frame(sock).header["event"]["job"]
    done = run_cli("halt", "--name", booted.name)
    assert done.returncode == 0
    assert done.stdout == f"halted machine {booted.name!r} (interrupted job {job})\n"
    doc = read_frame(sock).header["result"]
    assert doc["exit_status"] == 130
    assert doc["tiles"][0]["output"] == "before halt\n"
    assert "is halting" in doc["tiles"][0]["error"]
    sock.close()
    assert lock_holder(booted.paths.lock) is None


def test_sigterm_halts_cleanly(runtime_dir):
    booted = boot_machine()
    os.kill(booted.pid, signal.SIGTERM)
    assert wait_halted(booted.paths, timeout=15)
    assert not booted.paths.socket.exists()
    assert "SIGTERM: halting" in booted.paths.log.read_text()


def test_halt_if_saved_refuses_to_drop_unsaved_files(machine, tmp_path):
    program = tmp_path / "write.py"
    program.write_text("open('/unsaved', 'w').write('x')\n")
    assert run_cli("run", str(program), "--tiles", "4", "--name", machine.name).returncode == 0
    done = run_cli("halt", "--if-saved", "--name", machine.name)
    assert done.returncode == 1
    assert f"machine {machine.name!r} was not halted because the disk of tile 4 holds files no backup or restore " \
            "has covered" in done.stderr
    assert "halt without --if-saved" in done.stderr
    assert machine.call("hello")["pid"] == machine.pid


def test_halt_backup_and_boot_restore_fail_cleanly(machine, runtime_dir, tmp_path):
    halt = run_cli("halt", "--backup", str(tmp_path / "no" / "x.img"), "--name", machine.name)
    assert halt.returncode == 1
    assert "does not exist" in halt.stderr and "was not halted" in halt.stderr
    assert machine.call("hello")["pid"] == machine.pid
    name = unique_name("restore")
    boot = run_cli("boot", "--preset", "tiny", "--restore", str(tmp_path / "x.img"), "--name", name)
    assert boot.returncode == 1
    assert "cannot open it: No such file or directory; no machine was started" in boot.stderr
    assert lock_holder(machine_paths(name).lock) is None


def test_halt_of_a_machine_that_is_not_running(runtime_dir):
    done = run_cli("halt", "--name", "not-there")
    assert done.returncode == 3
    assert "no machine named 'not-there' is running" in done.stderr


@contextlib.contextmanager
def every_client_slot_taken():
    """A booted machine holding as many idle clients as it serves (halted at the end)."""
    booted = boot_machine()
    held = []
    try:
        for _ in range(MAX_CLIENTS):
            sock = raw_socket(booted.paths)
            held.append(sock)
            sock.sendall(request(1, "hello"))
            assert read_frame(sock).header["type"] == "result"
        yield booted
    finally:
        for sock in held:
            sock.close()
        booted.halt()


def a_newcomer_is_served(booted) -> None:
    """Once the clients holding every place have been idle a second, `ipuos status`
    gets through, and soon."""
    time.sleep(1.2)
    started = time.monotonic()
    done = run_cli("status", "--json", "--name", booted.name)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 10


def test_clients_that_never_send_give_their_places_to_new_ones(runtime_dir):
    """Connections that sent nothing held every client place for the idle timeout (a
    minute), and then again: one idle for a second now gives its place to a newcomer."""
    booted = boot_machine()
    silent = []
    try:
        for _ in range(MAX_CLIENTS):
            silent.append(raw_socket(booted.paths))
        a_newcomer_is_served(booted)
        told = []
        for sock in silent:  # one of them was told why, and closed
            sock.setblocking(False)
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                continue
            told.append(data)
        assert any(b"the daemon serves 128 clients at most, and another has come" in data for data in told), told
    finally:
        for sock in silent:
            sock.close()
        booted.halt()


def test_a_client_that_never_reads_its_replies_does_not_hold_newcomers_up(runtime_dir):
    """Looking for an idle client to make room took each client's send lock, which a
    reply stuck on a client that does not read holds for up to 30 s: a newcomer waited
    25.8 s."""
    booted = boot_machine()
    held = []
    try:
        flooder = raw_socket(booted.paths)
        flooder.setblocking(False)
        held.append(flooder)
        hello = request(1, "hello")
        try:
            for _ in range(200_000):  # (until its replies fill both socket buffers)
                flooder.send(hello)
        except BlockingIOError:
            pass
        for _ in range(MAX_CLIENTS - 1):
            held.append(raw_socket(booted.paths))
        a_newcomer_is_served(booted)
    finally:
        for sock in held:
            sock.close()
        booted.halt()


def test_halt_gets_through_when_every_client_slot_is_taken(runtime_dir):
    with every_client_slot_taken() as booted:
        refused_for = run_cli("status", "--name", booted.name)
        assert refused_for.returncode != 0 and "already serves" in refused_for.stderr
        done = run_cli("halt", "--name", booted.name)
        assert done.returncode == 0, done.stderr
        assert f"halted machine {booted.name!r}" in done.stdout
        assert "every client slot or request handler was taken" in done.stdout  # why by signal
        assert wait_halted(booted.paths, timeout=15)
        assert "SIGTERM: halting" in booted.paths.log.read_text()


def test_halt_if_saved_of_a_full_daemon_says_try_again(runtime_dir):
    with every_client_slot_taken() as booted:
        done = run_cli("halt", "--if-saved", "--name", booted.name)
        assert done.returncode != 0
        assert "already serves" in done.stderr
        assert lock_holder(booted.paths.lock) == booted.pid  # still running: it could not ask


def test_the_client_reports_a_daemon_that_goes_away(runtime_dir):
    booted = boot_machine()
    with Client(booted.paths) as client:
        os.kill(booted.pid, signal.SIGKILL)
        with pytest.raises(DaemonError, match="closed the connection"):
            for _ in range(100):
                client.call("hello")
    wait_for(lambda: lock_holder(booted.paths.lock) is None, what="the daemon to die")
    with pytest.raises(MachineNotRunning):
        Client(booted.paths)
    run_cli("boot", "--preset", "tiny", "--name", booted.name)
    run_cli("halt", "--name", booted.name)


def test_json_of_status_and_hello_agree(machine):
    done = run_cli("status", "--json", "--name", machine.name)
    assert done.returncode == 0
    status = json.loads(done.stdout)
    assert status["pid"] == machine.pid == machine.call("hello")["pid"]
    assert status["socket"] == str(machine.paths.socket)


def test_the_daemon_starts_with_non_temporal_broadcast_copies(machine):
    # see ipuos._memtune: glibc reads the tunable only at process start
    with open(f"/proc/{machine.pid}/environ", "rb") as environ:
        variables = environ.read().split(b"\0")
    tunables = [v for v in variables if v.startswith(b"GLIBC_TUNABLES=")]
    assert tunables and b"x86_non_temporal_threshold=0x10000" in tunables[0]
    assert b"OPENBLAS_NUM_THREADS=1" in variables  # no spinning BLAS workers
    with open(f"/proc/{machine.pid}/status") as status:  # daemon threads only: none from BLAS
        threads = int(next(line for line in status if line.startswith("Threads:")).split()[1])
    assert threads < 40, threads


def test_ctrl_c_while_boot_waits_says_the_machine_still_boots(runtime_dir):
    """The daemon runs on its own once spawned: a Ctrl-C stops the waiting, not the boot,
    and the command must not just say 'interrupted' while a machine comes up."""
    import subprocess

    from daemon_harness import IPUOS

    from ipuos._rundir import starting

    name = unique_name("intboot")
    paths = machine_paths(name)
    booting = subprocess.Popen([IPUOS, "boot", "--preset", "tiny", "--ipus", "32", "--name", name],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "IPUOS_RUNTIME_DIR": str(runtime_dir)})
    try:
        wait_for(lambda: starting(paths) or lock_holder(paths.lock) is not None, what="the daemon to start")
        booting.send_signal(signal.SIGINT)
        out, err = booting.communicate(timeout=60)
        if booting.returncode == 0:
            pytest.skip("the machine booted before the Ctrl-C came")  # (a fast host: nothing to see)
        assert booting.returncode == 130, (out, err)
        assert err == (f"ipuos: stopped waiting; machine {name!r} is still booting "
                       f"(`ipuos halt --name {name}` stops it)\n"), err
        wait_for(lambda: run_cli("status", "--name", name).returncode == 0, what="the machine to answer")
    finally:
        run_cli("halt", "--name", name)
