"""The daemon's defences, against real daemons over their real sockets.

Modes of the runtime dir and socket, other users, hostile and malformed frames, many
clients at once, clients that vanish mid-request or fall silent.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import threading
import time

import pytest
from daemon_harness import (  # noqa: F401  (fixtures)
    boot_machine,
    closed_by_peer,
    machine,
    raw_socket,
    read_frame,
    request,
    run_cli,
    runtime_dir,
    shared_machine,
    unique_name,
    wait_for,
)

from ipuos._client import Client, DaemonError
from ipuos._protocol import MAGIC, PREFIX, VERSION, encode_frame
from ipuos._rundir import RuntimeDirError, machine_paths, private_dir


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def still_serves(booted) -> None:
    assert booted.call("hello")["name"] == booted.name


# -- files and modes --------------------------------------------------------------------------


def test_runtime_files_are_private(shared_machine, runtime_dir):
    paths = shared_machine.paths
    assert mode(runtime_dir) == 0o700
    assert stat.S_ISSOCK(os.lstat(paths.socket).st_mode) and mode(paths.socket) == 0o600
    assert mode(paths.lock) == 0o600 and mode(paths.log) == 0o600
    for path in (runtime_dir, paths.socket, paths.lock, paths.log):
        assert os.lstat(path).st_uid == os.geteuid()


def test_a_missing_runtime_dir_is_created_private(tmp_path):
    created = private_dir(tmp_path / "run")
    assert mode(created) == 0o700


@pytest.mark.parametrize("problem", ["mode", "owner", "symlink", "file"])
def test_an_unsafe_runtime_dir_is_refused(tmp_path, problem):
    path = tmp_path / "run"
    if problem == "symlink":
        (tmp_path / "real").mkdir(mode=0o700)
        path.symlink_to(tmp_path / "real")
    elif problem == "file":
        path.write_text("")
    else:
        path.mkdir(mode=0o700)
        if problem == "mode":
            path.chmod(0o755)
        else:
            os.chown(path, 65534, 65534)
    with pytest.raises(RuntimeDirError) as err:
        private_dir(path)
    expected = {"mode": "chmod 700", "owner": "belongs to uid 65534", "symlink": "symbolic link",
                "file": "not a directory"}[problem]
    assert expected in str(err.value)


def test_the_cli_refuses_an_unsafe_runtime_dir(tmp_path):
    from daemon_harness import run_cli

    path = tmp_path / "run"
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    done = run_cli("status", env=dict(os.environ, IPUOS_RUNTIME_DIR=str(path)))
    assert done.returncode == 1
    assert f"refusing to use the runtime directory {path}: its mode is 0777" in done.stderr
    assert f"chmod 700 {path}" in done.stderr


@pytest.mark.parametrize("command", [["status"], ["machines"], ["boot", "--preset", "tiny"]])
def test_a_runtime_dir_that_cannot_be_looked_up_is_one_line_of_error(tmp_path, command):
    from daemon_harness import run_cli

    (tmp_path / "file").touch()
    for path, why in ((tmp_path / "file" / "run", "Not a directory"), (tmp_path / ("x" * 300), "File name too long")):
        done = run_cli(*command, env=dict(os.environ, IPUOS_RUNTIME_DIR=str(path)))
        assert done.returncode == 1, done
        assert done.stderr == (f"ipuos: cannot use the runtime directory {path}: {why}; "
                               "set IPUOS_RUNTIME_DIR to a directory you own\n"), done.stderr


def test_a_relative_runtime_dir_means_the_same_directory_to_the_daemon(tmp_path):
    """The daemon runs in /: it must be given the directory the client meant."""
    from daemon_harness import IPUOS

    env = dict(os.environ, IPUOS_RUNTIME_DIR="run", IPUOS_MACHINE="rel")
    boot = subprocess.run([IPUOS, "boot", "--preset", "tiny"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    try:
        assert boot.returncode == 0, boot.stderr
        assert (tmp_path / "run" / "rel.sock").exists()
    finally:
        halt = subprocess.run([IPUOS, "halt"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60)
    assert halt.returncode == 0 and "halted machine 'rel'" in halt.stdout, halt.stderr


def test_bad_machine_names_are_refused(runtime_dir):
    for name in ("../etc", "a/b", "", ".hidden", "x" * 65, "sp ace"):
        with pytest.raises(ValueError, match="bad machine name"):
            machine_paths(name)


# -- other users --------------------------------------------------------------------------------

# A stdlib-only client (nobody cannot read the venv): connect and print what the daemon
# says. The daemon refuses at accept, before reading anything, so it sends no request.
NOBODY_CLIENT = r"""
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print(json.dumps({"connect_error": exc.__class__.__name__})); sys.exit(0)
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk: break
    data += chunk
hl = struct.unpack("!I", data[4:8])[0] if len(data) >= 12 else 0
print(json.dumps({"reply": json.loads(data[12:12 + hl]) if hl else None, "closed": True}))
"""


def as_nobody(socket_path) -> dict:
    done = subprocess.run(["/usr/bin/python3", "-c", NOBODY_CLIENT, str(socket_path)], user="nobody",
                          group="nogroup", capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to nobody needs root")


@needs_root
def test_another_user_cannot_reach_the_socket(shared_machine):
    assert as_nobody(shared_machine.paths.socket) == {"connect_error": "PermissionError"}
    still_serves(shared_machine)


@needs_root
def test_peer_credentials_are_checked_even_if_the_files_are_opened_up(runtime_dir):
    """Loosen the dir and socket on purpose: SO_PEERCRED must still refuse another uid."""
    booted = boot_machine()
    try:
        runtime_dir.chmod(0o711)
        booted.paths.socket.chmod(0o666)
        result = as_nobody(booted.paths.socket)
        assert result["closed"]
        assert result["reply"]["type"] == "error"
        assert result["reply"]["error"]["code"] == "permission_denied"
        assert "belongs to another user" in result["reply"]["error"]["message"]
        runtime_dir.chmod(0o700)
        still_serves(booted)
        assert "refused a connection from uid 65534" in booted.paths.log.read_text()
    finally:
        runtime_dir.chmod(0o700)
        booted.halt()


# -- malformed and hostile frames ---------------------------------------------------------------


def error_of(frame) -> tuple[str, str]:
    assert frame is not None, "the daemon closed the connection without replying"
    assert frame.header["type"] == "error", frame.header
    return frame.header["error"]["code"], frame.header["error"]["message"]


@pytest.mark.parametrize("wire, code", [
    (PREFIX.pack(MAGIC, VERSION, 0, 10 * 1024 * 1024, 0), "too_large"),
    (PREFIX.pack(MAGIC, VERSION, 0, 20, 512 * 1024 * 1024), "too_large"),
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "bad_frame"),
    (encode_frame({"id": 1, "cmd": "ps"}, flags=1), "bad_frame"),
])
def test_frames_that_break_the_stream_get_an_error_and_a_close(shared_machine, wire, code):
    sock = raw_socket(shared_machine.paths)
    sock.sendall(wire)
    assert error_of(read_frame(sock))[0] == code
    assert closed_by_peer(sock)
    sock.close()
    still_serves(shared_machine)


@pytest.mark.parametrize("wire, code, message", [
    (PREFIX.pack(MAGIC, VERSION, 0, 5, 0) + b"{nope", "bad_json", "not valid UTF-8 JSON"),
    (PREFIX.pack(MAGIC, VERSION, 0, 3, 0) + b"[1]", "bad_json", "must be a JSON object"),
    (PREFIX.pack(MAGIC, VERSION, 0, 60000, 0) + b"[" * 60000, "bad_json", "not valid UTF-8 JSON"),
    (encode_frame({"id": 1, "cmd": "ps"}, version=7), "bad_version", "version 7 is not supported"),
    (encode_frame({"id": "one", "cmd": "ps"}), "bad_request", "integer 'id'"),
    (encode_frame({"id": 1, "cmd": ["ps"]}), "bad_request", "command name"),
    (request(1, "format_disk"), "unknown_command", "unknown command 'format_disk'"),
    (request(1, "status", {"verbose": True}), "bad_request", "has no argument 'verbose'"),
    (request(1, "kill", {"job": "3"}), "bad_request", "'job' of command 'kill' must be an integer"),
    (request(1, "kill", {"job": True}), "bad_request", "must be an integer"),
    (request(1, "kill", {}), "bad_request", "needs the argument 'job'"),
    (request(1, "run", {"filename": "p.py", "source_len": 99}, b"print(1)"), "bad_request", "does not fit"),
    (request(1, "run", {"filename": "p.py", "source_len": 2}, b"\xff\xfe"), "bad_program", "not UTF-8"),
    (request(1, "run", {"filename": "p.py", "source_len": 4, "budget": -1}, b"pass"), "bad_request", "positive"),
    (request(1, "run", {"filename": "p.py", "source_len": 4, "args": "a b"}, b"pass"), "bad_request", "must be a list"),
    (request(1, "run", {"filename": "p.py", "source_len": 4, "args": [1]}, b"pass"), "bad_request", "must be strings"),
    (request(1, "halt", {"if_saved": "yes"}), "bad_request", "must be true or false"),
    (encode_frame({"id": 1, "cmd": "status", "timeout": 10**400}), "bad_request", "'timeout' must be a positive"),
    (encode_frame({"id": 1, "cmd": "status", "timeout": 1e300}), "bad_request", "at most"),
    (request(1, "run", {"filename": "p.py", "source_len": 4, "budget": 10**400}, b"pass"), "bad_request",
     "'budget' of command 'run' must be a finite number, and this one is infinite or too big"),
    (request(1, "run", {"filename": "p.py", "source_len": 4, "budget": "1"}, b"pass"), "bad_request",
     "must be a finite number, not str"),
    # (a NUL byte was called "not absolute", or failed inside the daemon with a traceback)
    (request(1, "backup", {"path": "/tmp/a\0b"}), "bad_request", "'/tmp/a\\x00b' holds a NUL byte"),
    (request(1, "restore", {"path": "/tmp/a\0b"}), "bad_request", "'/tmp/a\\x00b' holds a NUL byte"),
    (request(1, "mount", {"mountpoint": "/tmp/a\0b"}), "bad_mountpoint", "'/tmp/a\\x00b' holds a NUL byte"),
    (request(1, "run", {"filename": "p\0.py", "source_len": 4}, b"pass"), "bad_request",
     "file name 'p\\x00.py' holds a NUL byte"),
])
def test_malformed_requests_get_an_error_and_the_connection_goes_on(shared_machine, wire, code, message):
    sock = raw_socket(shared_machine.paths)
    sock.sendall(wire)
    got_code, got_message = error_of(read_frame(sock))
    assert (got_code, message in got_message) == (code, True), got_message
    sock.sendall(request(2, "hello"))
    reply = read_frame(sock)
    assert reply.header["id"] == 2 and reply.header["result"]["name"] == shared_machine.name
    sock.close()


def test_a_bad_version_reply_names_the_supported_versions(shared_machine):
    sock = raw_socket(shared_machine.paths)
    sock.sendall(encode_frame({"id": 1, "cmd": "hello"}, version=1))
    frame = read_frame(sock)
    assert frame.version == 2 and frame.header["error"]["supported"] == [2]
    sock.close()


def test_garbage_from_many_connections_does_not_stop_the_daemon(shared_machine):
    for junk in (os.urandom(5000), b"\x00" * 12, MAGIC + b"\x01\x00" + b"\xff" * 8, b"iP"):
        sock = raw_socket(shared_machine.paths)
        try:
            sock.sendall(junk)
        except OSError:
            pass
        sock.close()
    still_serves(shared_machine)


def test_big_frames_in_flight_are_bounded_across_clients(shared_machine):
    """Each connection could hold a 64 MiB frame half-sent: eight clients made the daemon
    hold half a gigabyte, 128 would have made it hold eight."""
    from ipuos._daemon import FRAME_BUDGET
    from ipuos._protocol import REQUEST_LIMITS, json_bytes

    biggest = REQUEST_LIMITS.max_payload
    header = json_bytes({"id": 1, "cmd": "hello", "args": {}})
    start = PREFIX.pack(MAGIC, VERSION, 0, len(header), biggest) + header + bytes(1 << 20)
    held = []
    try:
        for _ in range(FRAME_BUDGET // (biggest + len(header))):
            sock = raw_socket(shared_machine.paths)
            sock.sendall(start)  # (and never the rest)
            held.append(sock)
        still_serves(shared_machine)
        refused = raw_socket(shared_machine.paths)
        refused.sendall(start)
        code, message = error_of(read_frame(refused))
        assert (code, message) == ("busy", "the daemon is receiving 256 MiB of requests from other clients "
                                           "already; try again shortly")
        refused.close()
        held.pop().close()  # its room is given back: a big frame fits again
        sock = raw_socket(shared_machine.paths)
        sock.sendall(start)
        with pytest.raises(AssertionError, match="no frame within"):  # (taken in: it waits for the rest)
            read_frame(sock, timeout=0.5)
        held.append(sock)
    finally:
        for sock in held:
            sock.close()
    still_serves(shared_machine)


def test_requests_refused_for_their_timeout_hold_no_slot(runtime_dir):
    """Each such request used to keep a daemon-wide handler slot for ever: after 256 of
    them the daemon refused everyone, halt included."""
    from ipuos._daemon import MAX_HANDLERS

    booted = boot_machine()
    try:
        sock = raw_socket(booted.paths)
        for _ in range(MAX_HANDLERS + 4):
            sock.sendall(encode_frame({"id": 1, "cmd": "run", "timeout": 10**400,
                                       "args": {"filename": "p.py", "source_len": 4}}, b"pass"))
            assert error_of(read_frame(sock))[0] == "bad_request"
        sock.close()
        still_serves(booted)
    finally:
        booted.halt()


def test_kill_status_and_ps_get_through_when_every_handler_is_taken(runtime_dir):
    """Requests blocked inside a machine held by a computing tile keep their handler
    slots, even once their clients have gone: a few clients' worth took every slot, and
    then kill, the way to free the machine, was refused as busy too."""
    from ipuos._daemon import MAX_HANDLERS

    booted = boot_machine()
    try:
        computing = start_run(booted.paths, "0", b"while True:\n    x = 1\n")  # (no exchange point)
        (job,) = [j["job"] for j in booted.call("ps")["jobs"]]
        source = b"print(1)"
        clients = []

        def taken_all() -> bool:
            sock = raw_socket(booted.paths)
            clients.append(sock)
            for i in range(8):
                sock.sendall(request(i + 1, "run", {"filename": "p.py", "source_len": len(source), "tiles": "5"},
                                     source))
            try:  # (a refusal comes at once; a request that took a slot waits in the machine)
                frame = read_frame(sock, timeout=0.3)
            except AssertionError:
                return False
            return error_of(frame) == ("busy", "the daemon is serving too many requests; try again")

        wait_for(taken_all, timeout=60, interval=0, what="every ordinary handler to be taken")
        assert len(clients) >= MAX_HANDLERS // 8
        for sock in clients:
            sock.close()  # (gone: their handlers still wait inside the machine)
        assert booted.call("status")["name"] == booted.name
        assert any(j["job"] == job for j in booted.call("ps")["jobs"])
        booted.call("kill", {"job": job})
        while (frame := read_frame(computing)).header["type"] == "event":
            pass
        assert frame.header["result"]["exit_status"] == 130
        computing.close()
    finally:
        booted.halt()


def test_a_request_id_in_flight_is_refused_without_that_id_even_for_cancel(machine):
    sock = start_run(machine.paths, "0")
    for second in (request(1, "hello"), request(1, "cancel", {"id": 1})):
        sock.sendall(second)
        frame = read_frame(sock)
        assert frame.header["id"] is None and "request id 1 is already in flight" in error_of(frame)[1]
    assert busy_tiles(machine) == "r"  # the run goes on, and is still the client's to cancel
    sock.sendall(request(2, "cancel", {"id": 1}))
    frames = {}
    while len(frames) < 2:
        frame = read_frame(sock)
        frames[frame.header["id"]] = frame.header
    assert frames[2]["result"] == {"cancelled": True} and frames[1]["result"]["exit_status"] == 130
    sock.close()


# -- timeouts -----------------------------------------------------------------------------------


def test_silent_and_slow_clients_are_disconnected(runtime_dir):
    booted = boot_machine(daemon_options=("--idle-seconds", "0.5", "--frame-seconds", "0.5"))
    try:
        silent = raw_socket(booted.paths)
        slow = raw_socket(booted.paths)
        slow.sendall(request(1, "hello")[:9])  # and never the rest
        started = time.monotonic()
        assert "idle" in error_of(read_frame(silent))[1]
        assert "did not arrive whole" in error_of(read_frame(slow))[1]
        assert closed_by_peer(silent) and closed_by_peer(slow)
        assert time.monotonic() - started < 5
        still_serves(booted)
    finally:
        booted.halt()


def test_a_client_may_ask_for_a_shorter_timeout(shared_machine):
    with shared_machine.client() as client:
        assert client.call("status", timeout=5)["name"] == shared_machine.name


def test_a_client_refuses_to_send_arguments_over_the_header_limit(shared_machine):
    """The daemon drops a connection whose header is over its limit; the client says so
    before sending, and its connection goes on."""
    with shared_machine.client() as client:
        with pytest.raises(DaemonError) as info:
            client.request("status", {"padding": "x" * 70_000})
        assert info.value.code == "too_large" and "at most 65,536" in str(info.value)
        assert client.call("status")["name"] == shared_machine.name


def test_the_idle_limit_counts_from_the_last_reply_not_the_last_request(runtime_dir):
    """A call that outlasts the idle limit must not leave its client idle at once: the
    shell's next command after a long one failed with "closed the connection"."""
    booted = boot_machine(daemon_options=("--idle-seconds", "0.5"))
    try:
        sock = start_run(booted.paths, "0")
        time.sleep(1.0)  # twice the idle limit, with the run in flight
        booted.call("kill", {"job": booted.call("ps")["jobs"][0]["job"]})
        assert read_frame(sock).header["result"]["exit_status"] == 130
        time.sleep(0.3)  # less than the idle limit since that reply
        sock.sendall(request(2, "hello"))
        reply = read_frame(sock)
        assert reply is not None and reply.header["id"] == 2 and reply.header["type"] == "result", reply
        assert "idle" in error_of(read_frame(sock))[1]  # and idle it is, later
        sock.close()
    finally:
        booted.halt()


def test_a_call_past_its_timeout_on_a_machine_not_held_says_so(machine):
    # (it blamed a tile computing without reaching an exchange point: this one syncs)
    sock = raw_socket(machine.paths)
    source = b"while True:\n    sync()\n"  # (ended by the close below)
    sock.sendall(encode_frame({"id": 1, "cmd": "run", "timeout": 0.5,
                               "args": {"filename": "s.py", "source_len": len(source), "tiles": "0-1"}},
                              source))
    while (frame := read_frame(sock)).header["type"] == "event":
        pass
    code, message = error_of(frame)
    assert (code, message) == ("timeout", f"machine {machine.name!r} did not answer 'run' within 0.5 s; the "
                               "machine is not held by a computing tile: the request needed longer than its timeout")
    sock.close()


def test_a_timed_out_call_never_answers_a_request_that_reuses_its_id(machine):
    spinner = start_run(machine.paths, "0", b"while True: pass\n")  # the machine stops answering
    sock = raw_socket(machine.paths)
    sock.sendall(encode_frame({"id": 5, "cmd": "status", "args": {}, "timeout": 0.2}))
    code, message = error_of(read_frame(sock))
    assert code == "timeout" and re.search(r"tile 0 \(job \d+\) is computing without reaching an exchange "
                                           "point", message), message
    source = b"print('the new request')\n"
    sock.sendall(request(5, "run", {"filename": "new.py", "source_len": len(source), "tiles": "1"}, source))
    # the old status handler answers within LOOK_SECONDS (from the last snapshot): not here
    with pytest.raises(AssertionError, match="no frame within"):
        read_frame(sock, timeout=2.0)
    spinner.sendall(request(2, "cancel", {"id": 1}))
    frames = []
    while not frames or frames[-1]["type"] != "result":
        frames.append(read_frame(sock).header)
    assert [f["id"] for f in frames] == [5, 5] and frames[0]["event"]["event"] == "started"
    assert frames[1]["result"]["tiles"][0]["output"] == "the new request\n"
    spinner.close()
    sock.close()


def test_a_call_timed_out_in_a_long_superstep_says_that_its_tiles_compute_one_after_another(machine):
    """Six tiles compute ~0.2 s each between syncs, so the machine answers only every
    ~1.2 s, between supersteps: a timed-out request blamed the tile computing at that
    moment alone, as if it held the machine."""
    source = b"while True:\n    if __tileid >= 2:\n        x = sum(range(15 * 10 ** 6))\n    sync()\n"
    spinner = start_run(machine.paths, "0-7", source)
    sock = raw_socket(machine.paths)
    message = None
    for request_id in range(1, 11):  # (one answered between supersteps is asked again)
        sock.sendall(encode_frame({"id": request_id, "cmd": "status", "args": {}, "timeout": 0.2}))
        frame = read_frame(sock)
        # (nor is one that timed out just before a superstep ended, which the machine then
        # answered at once: "not held by a computing tile", nor one that timed out as the
        # scheduler passed from one tile to the next: "a tile may be computing")
        if frame.header["type"] == "error" and not any(
                between in error_of(frame)[1] for between in ("not held", "a tile may be computing")):
            message = error_of(frame)[1]
            break
    assert message is not None, "every request was answered in time"
    assert re.search(r"did not answer 'status' within 0.2 s; tile \d+ \(job \d+\) is computing, in superstep "
                     r"\d+, which has computed for \d+\.\d s so far, tile after tile: [2-7] of its 8 tiles "
                     r"before this one\. A superstep lasts as long as all its tiles' compute together", message), message
    spinner.close()
    sock.close()


def test_a_client_that_half_closes_still_gets_its_replies(machine):
    """A client may end its input (shutdown(SHUT_WR), as ``nc -N`` does) and then read:
    that is not a disconnect. Closing its end entirely is, and interrupts its job."""
    source = b"print(sum(range(10)))\nfor _ in range(50):\n    sync()\n"
    sock = raw_socket(machine.paths)
    sock.sendall(request(1, "hello"))
    sock.sendall(request(2, "run", {"filename": "p.py", "source_len": len(source), "tiles": "3"}, source))
    sock.shutdown(socket.SHUT_WR)
    frames = {}
    while True:
        frame = read_frame(sock)
        if frame is None:
            break
        frames.setdefault(frame.header["id"], []).append(frame.header)
    assert frames[1][0]["result"]["name"] == machine.name
    assert frames[2][-1]["result"]["tiles"][0]["output"] == "45\n"
    sock.close()
    spinner = start_run(machine.paths, "4")
    spinner.shutdown(socket.SHUT_WR)
    time.sleep(0.3)
    assert busy_tiles(machine) == "r"  # still running for a client that may read
    spinner.close()
    wait_for(lambda: busy_tiles(machine) == "", what="the job of the client that closed to be interrupted")


def test_the_collection_after_a_job_waits_for_the_reply_and_cannot_break_the_connection(runtime_dir):
    """The garbage a job leaves is collected once the reply to the request during which
    it ended is on its way, on the handler's thread (the client need not wait for it); a
    collection that fails is logged and the connection serves on. (What the collection
    does: tests/test_collector.py.)"""
    from ipuos import Machine
    from ipuos._collector import Collector
    from ipuos._commands import COMMANDS, Arg, command
    from ipuos._connection import Connection, HandlerSlots
    from ipuos._host import MachineHost

    replied, ran = threading.Event(), []

    class Observed(Collector):
        def collect(self, thorough=False):
            ran.append(replied.wait(10))
            if len(ran) == 2:
                raise RuntimeError("a collection that fails")

    @command("test.after", Arg("job", bool))
    def _after(call):
        if call.args["job"]:
            call.host.remove_job(12345)  # (as a run's handler does when its job has ended)
        return {"ok": True}

    ours, theirs = socket.socketpair()
    try:
        with Machine("tiny") as machine:
            host = MachineHost(machine, machine_paths(unique_name()))
            host.collector = Observed(machine.scheduler)
            connection = Connection(ours, host, None, HandlerSlots(4), threading.Event())
            threading.Thread(target=connection.serve, daemon=True).start()
            due = 0
            for request_id, job in ((1, True), (2, True), (3, False), (4, True)):
                theirs.sendall(request(request_id, "test.after", {"job": job}))
                header = read_frame(theirs).header
                assert header["type"] == "result" and header["result"] == {"ok": True}, header
                replied.set()  # (a collection before the reply would have waited in vain)
                due += job
                wait_for(lambda: len(ran) == due, what="the collection after the reply")
                replied.clear()
            time.sleep(0.2)
            assert ran == [True, True, True]  # none after the request during which no job ended
            connection.close()
    finally:
        COMMANDS.pop("test.after", None)
        ours.close()
        theirs.close()


# -- many clients, vanishing clients ----------------------------------------------------------


def test_a_hundred_concurrent_clients(machine):
    errors, results = [], {}
    barrier = threading.Barrier(100)

    def client_thread(i):
        try:
            with Client(machine.paths) as client:
                barrier.wait(timeout=30)
                status = client.call("status")
                ps = client.call("ps")
                ran = None
                if i < 16:  # one tiny program per tile, all at once
                    source = b"print('on', __physical_tile)"
                    ran = client.call("run", {"filename": f"p{i}.py", "source_len": len(source),
                                              "tiles": str(i)}, source, wait=60)
                results[i] = (status["ntiles"], len(ps["states"]), ran)
        except Exception as exc:  # noqa: BLE001 - collected and reported below
            errors.append(f"client {i}: {exc!r}")

    threads = [threading.Thread(target=client_thread, args=(i,)) for i in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert errors == []
    assert len(results) == 100
    assert all(r[:2] == (16, 16) for r in results.values())
    for i in range(16):
        doc = results[i][2]
        assert doc["exit_status"] == 0 and doc["tiles"][0]["output"] == f"on {i}\n", doc
    still_serves(machine)


SPIN = b"while True:\n    sync()\n"


def start_run(paths, tiles: str, source: bytes = SPIN) -> socket.socket:
    sock = raw_socket(paths)
    sock.sendall(request(1, "run", {"filename": "spin.py", "source_len": len(source), "tiles": tiles}, source))
    started = read_frame(sock)
    assert started.header["type"] == "event" and started.header["event"]["event"] == "started"
    return sock


def busy_tiles(booted) -> str:
    return "".join(c for c in booted.call("ps")["states"] if c != "i")


def test_a_client_that_disconnects_mid_run_interrupts_its_job(machine):
    sock = start_run(machine.paths, "0-3")
    assert len(busy_tiles(machine)) == 4
    sock.close()
    wait_for(lambda: busy_tiles(machine) == "", what="the job to be interrupted")
    assert machine.call("ps")["jobs"] == []


def test_a_client_that_disconnects_mid_frame(machine):
    sock = raw_socket(machine.paths)
    sock.sendall(request(1, "run", {"filename": "p.py", "source_len": 5000}, b"x" * 5000)[:3000])
    sock.close()
    still_serves(machine)
    assert busy_tiles(machine) == ""


def test_cancel_interrupts_a_run_and_still_returns_its_output(machine):
    source = b"print('hello from', __tileid)\nwhile True:\n    sync()\n"
    sock = start_run(machine.paths, "4-5", source)
    sock.sendall(request(2, "cancel", {"id": 1}))
    frames = {}
    while len(frames) < 2:
        frame = read_frame(sock)
        frames[frame.header["id"]] = frame
    assert frames[2].header["result"] == {"cancelled": True}
    doc = frames[1].header["result"]
    assert doc["exit_status"] == 130
    assert [t["output"] for t in doc["tiles"]] == ["hello from 0\n", "hello from 1\n"]
    assert all(t["status"] == "interrupted" for t in doc["tiles"])
    sock.close()


def test_kill_interrupts_a_job_and_refuses_unknown_ones(machine):
    sock = start_run(machine.paths, "0")
    job = machine.call("ps")["jobs"][0]["job"]
    assert machine.call("kill", {"job": job}) == {"job": job, "interrupted": True, "ended": True,
                                                  "stopped": True, "exit_status": 130}
    doc = read_frame(sock).header["result"]
    assert doc["tiles"][0]["error"] == f"killed with `ipuos kill {job}`\n"
    sock.close()
    with pytest.raises(DaemonError, match="no job 999 is running"):
        machine.call("kill", {"job": 999})


def test_a_busy_machine_answers_with_its_last_snapshot(machine):
    """A tile in pure compute holds the scheduler: ps must not hang, and must say so."""
    sock = start_run(machine.paths, "0-1", b"while True: pass\n")
    ps = machine.call("ps")
    assert "computing without reaching an exchange point" in ps["stale_reason"]
    # (it said "tile states are as they were 24.6 s ago" of a job that was 3 s old)
    assert re.match(r"the tiles' SRAM use and waits are as the last look at them found them, \d+\.\d s ago; "
                    r"which tiles run which jobs is as it is now: ", ps["stale_reason"])
    assert ps["states"][:3] == "rri" and ps["jobs"][0]["tiles"] == "0-1"
    # (it said the SRAM use and waits were old, which status does not show, and not that
    # its superstep count was)
    assert re.match(r"the supersteps and exchange figures are as the last look at them found them, "
                    r"\d+\.\d s ago: .*computing", machine.call("status")["stale_reason"])
    sock.sendall(request(2, "cancel", {"id": 1}))
    sock.close()
    wait_for(lambda: "stale_reason" not in machine.call("ps"), what="the machine to answer again")


def test_a_last_snapshot_does_not_show_jobs_that_have_finished_since(machine):
    spinner = start_run(machine.paths, "2-3")
    first = machine.call("ps")  # the snapshot the next ps falls back on: job on 2-3
    assert first["states"][:4] == "iirr" and "stale_reason" not in first
    machine.call("kill", {"job": first["jobs"][0]["job"]})
    read_frame(spinner)  # its result: the job is over
    spinner.close()
    sock = start_run(machine.paths, "5", b"while True: pass\n")
    ps = machine.call("ps")
    assert "stale_reason" in ps
    assert ps["states"][:6] == "iiiiir", ps["states"]
    assert [job["tiles"] for job in ps["jobs"]] == ["5"]
    listed = json.loads(run_cli("ps", "--json", env=machine.env()).stdout)
    assert listed["stale_seconds"] > 0 and "exchange point" in listed["stale_reason"]
    sock.sendall(request(2, "cancel", {"id": 1}))
    sock.close()
    wait_for(lambda: "stale_reason" not in machine.call("ps"), what="the machine to answer again")


def test_too_many_requests_in_flight_on_one_connection(machine):
    sock = raw_socket(machine.paths)
    for i in range(8):
        source = b"while True:\n    sync()\n"
        sock.sendall(request(i + 1, "run", {"filename": "s.py", "source_len": len(source), "tiles": str(i)}, source))
    for _ in range(8):
        assert read_frame(sock).header["type"] == "event"
    sock.sendall(request(99, "hello"))
    code, message = error_of(read_frame(sock))
    assert code == "busy" and "at most 8 requests" in message
    sock.close()
    wait_for(lambda: busy_tiles(machine) == "", what="the jobs to be interrupted")


def _call():
    from types import SimpleNamespace

    from ipuos._commands import Call

    return Call(SimpleNamespace(cmd="run"), {}, None, None, lambda event: None)


def test_a_call_is_abandoned_by_a_second_cancel_or_its_client_gone():
    ran = []
    call = _call()
    call.on_cancel(lambda: ran.append("cancel"))
    call.on_abandon(lambda: ran.append("abandon"))
    call.cancel()
    assert ran == ["cancel"]
    call.cancel()
    call.cancel()
    assert ran == ["cancel", "abandon"]  # (once)
    gone = _call()
    gone.on_cancel(lambda: ran.append("gone: cancel"))
    gone.on_abandon(lambda: ran.append("gone: abandon"))
    gone.cancel(abandon=True)  # (no Ctrl-C before: its connection closed)
    assert ran[2:] == ["gone: cancel", "gone: abandon"]


def test_a_hook_for_a_call_abandoned_already_runs_at_once():
    """A fast double Ctrl-C may come before the handler registers its hooks."""
    ran = []
    call = _call()
    call.cancel()
    call.cancel()
    call.on_cancel(lambda: ran.append("cancel"))
    call.on_abandon(lambda: ran.append("abandon"))
    assert ran == ["cancel", "abandon"]
