"""The shell through a real daemon, non-interactively: ``ipuos shell -c`` and piped stdin.

Every command here runs on tile 0 of a real machine; files of other tiles are reached as
``/tiles/N/...``. Errors must be one ``cmd: path: reason`` line and a status, never a
Python traceback. (The interactive terminal is tested through a pty in test_shell_pty.)
"""

from __future__ import annotations

import os
import shlex
import signal
import stat
import subprocess
import threading
import time

import pytest
from daemon_harness import IPUOS, machine, run_cli, runtime_dir, shared_machine, wait_for  # noqa: F401


def shell(booted, text=None, *, stdin=None, cwd=None, env=None, timeout=60, user_code=False):
    """Run the shell; no traceback may appear unless ``user_code`` (a Python error in the
    user's own code is reported as Python reports it)."""
    args = [IPUOS, "shell"] + (["-c", text] if text is not None else [])
    done = subprocess.run(args, input=stdin, capture_output=True, text=True, cwd=cwd,
                          env=env or booted.env(), timeout=timeout)
    if not user_code:
        assert "Traceback" not in done.stderr + done.stdout, done.stderr
    return done


def test_a_program_printing_a_lone_surrogate_on_the_terminal_and_into_a_file(shared_machine):
    line = "print('before'); print(b'caf\\xe9'.decode('utf-8', 'surrogateescape')); print('after')"
    done = shell(shared_machine, f"echo \"{line}\" > /sur.py; run /sur.py --tiles 1; "
                                 "run /sur.py --tiles 1 > /sur.out; cat /sur.out")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("before\ncaf\\udce9\nafter\n") == 2


def test_a_nul_byte_in_a_path_is_refused_naming_the_path(shared_machine, tmp_path):
    # (put and get failed "inside the daemon", with a traceback in its log; cat named no path)
    host_file = tmp_path / "h.txt"
    host_file.write_text("x")
    done = shell(shared_machine, stdin=f"put {host_file} /chip/a\0b\nget /chip/a\0b {tmp_path}/got\n"
                                       "cat /chip/a\0b\necho carried on\n")
    assert done.stderr == "".join(f"{command}: '/chip/a\\x00b': a file name cannot hold a NUL byte\n"
                                  for command in ("put", "get", "cat")), done.stderr
    assert done.stdout == "carried on\n" and done.returncode == 0  # (the last command's)
    assert not (tmp_path / "got").exists()


def test_a_line_too_long_to_send_is_refused_and_the_shell_carries_on(shared_machine):
    # (the daemon drops a connection whose request header is over its limit: the shell
    # took that for a dead machine and quit)
    done = shell(shared_machine, stdin="echo " + "x" * 70_000 + "\necho next\n")
    assert "a line of 70,007 bytes is too long for the shell" in done.stderr
    assert "closed the connection" not in done.stderr
    assert (done.returncode, done.stdout) == (0, "next\n")


def test_lines_run_in_order_and_the_status_is_the_last_commands(shared_machine):
    done = shell(shared_machine, "mkdir /order; echo one > /order/a; ls /order; cat /order/a")
    assert (done.returncode, done.stdout, done.stderr) == (0, "a\none\n", "")
    done = shell(shared_machine, "ls /order/missing")
    assert done.returncode == 1
    assert done.stderr == "ls: /order/missing: No such file or directory\n"
    assert shell(shared_machine, "ls /order/missing; echo recovered").returncode == 0


@pytest.mark.parametrize("setup, line, message, status", [
    ("mkdir /e1", "cat /e1", "cat: /e1: Is a directory", 1),
    ("mkdir -p /e2/d; touch /e2/d/f", "rmdir /e2/d", "rmdir: /e2/d: Directory not empty", 1),
    ("mkdir /e3", "mkdir /e3", "mkdir: /e3: File exists", 1),
    ("touch /e4", "cd /e4", "cd: /e4: Not a directory", 1),
    ("mkdir /e5", "rm /e5", "rm: /e5: Is a directory", 1),
    ("", "mkdir /no/such/parent", "mkdir: /no/such/parent: No such file or directory", 1),
    ("", "cat /tiles/99/x", "cat: /tiles/99/x: No such file or directory", 1),
    ("", "rm -r /tiles/3", "rm: /tiles/3: a tile's files are not removed wholesale", 1),
    ("", "rm -r /", "rm: /: refusing to remove the root directory", 1),
    ("mkdir -p /tiles/5/e7/d", "cd /tiles/5/e7/d; rm -r ..", "rm: ..: refusing to remove '.' or '..'", 1),
    ("mkdir -p /tiles/5/e8", "cd /tiles/5/e8; rm -r .", "rm: .: refusing to remove '.' or '..'", 1),
    ("touch /e6", "mv /e6 /tiles/2", None, 0),
    ("", "head -n x /e6", "head: invalid number of lines: 'x'\nusage: head [-n N] FILE...", 2),
    ("", "head -n 1.5 /e6", "head: invalid number of lines: '1.5'\nusage: head [-n N] FILE...", 2),
    ("", "tree -L -2 /", "tree: invalid depth: '-2'\nusage: tree [-a] [-L DEPTH] [PATH]", 2),
    ("", "tree -L 0 /", "tree: invalid depth: '0'\nusage: tree [-a] [-L DEPTH] [PATH]", 2),
    ("", "mount --tile x", "mount: --tile: 'x' is not a tile number", 2),
    ("", "ls -z", "ls: option -z not recognized\nusage: ls [-l] [-a] [PATH...]", 2),
    ("", "ls | wc", "sh: syntax error near '|': pipes are not supported", 2),
    ("", "echo hi > /", "sh: /: Is a directory", 1),
    ("", "run /missing.py", "run: /missing.py: No such file or directory", 1),
    ("", "kill 4242", "kill: 4242: no such job", 1),
    ("", "kill \u00b2", "kill: \u00b2: not a job number", 1),
    ("", "kill -9 4242", "kill: option -9 not recognized\nusage: kill JOB...", 2),
    ("", "get /", "get: /: Is a directory", 1),
    ("", "clear the screen", "clear: usage: clear", 2),
    # python takes no FILE (run FILE runs one): said so, not that a -c text has no lines
    # for its input after it
    ("", "python foo.py", "python: unexpected argument 'foo.py' (python -c CODE runs one block)\n"
     "usage: python [-c CODE]", 2),
    ("", "multirepl foo", "multirepl: unexpected argument 'foo'\n"
     "usage: multirepl [--tiles SPEC] [--data HOSTFILE]", 2),
    ("", "history 5", "history: usage: history", 2),
    ("echo x > /e9", "get /e9 /dev/full", "get: /dev/full: No space left on device", 1),
    ("", "umount /chip", "umount: /chip: the machine's own mounts stay", 1),
    ("", "mount --ram 8K /nosuch", "mount: /nosuch: No such file or directory", 1),
    ("touch /chip/e10", "mount --ram 8K /chip/e10", "mount: /chip/e10: Not a directory", 1),
    ("", "mount --ram 8K /chip", "mount: /chip: already a mount point (chip disk)", 1),
    ("touch /chip/e11", "touch /chip/e11/", "touch: /chip/e11/: Not a directory", 1),
    ("", "put /x", "put: x: this command is carried out", None),
    ("mkdir -p /chip/e12/d", "cd /chip/e12/d; rmdir .", "rmdir: .: cannot remove '.': name the directory itself", 1),
    ("", "touch -x", "touch: option -x not recognized\nusage: touch FILE...", 2),
    # long options are spelled out, as run and the ipuos commands take them (the terminal
    # sent no data file for --dat, while tile 0 read it as --data: a repl with no data)
    ("", "multirepl --tiles 0-1 --dat /x", "multirepl: option --dat not recognized (did you mean --data?)\n"
     "usage: multirepl [--tiles SPEC] [--data HOSTFILE]", 2),
    ("", "free --til 0", "free: option --til not recognized (did you mean --tiles?)\n"
     "usage: free [--tiles SPEC]", 2),
])
def test_user_mistakes_are_one_line_and_a_status(shared_machine, setup, line, message, status):
    if setup:
        assert shell(shared_machine, setup).returncode == 0
    if line.startswith("put"):
        # the terminal does put; only a client that is not the terminal reaches tile 0 with it
        done = _exec_raw(shared_machine, line)
        assert "carried out by the terminal front-end" in done["output"][0][1]
        return
    done = shell(shared_machine, line)
    assert done.returncode == status, done.stderr
    if message is not None:
        assert done.stderr.startswith(message), done.stderr
        assert done.stderr.count("\n") == message.count("\n") + 1


def test_get_onto_a_full_host_disk_names_the_file_and_leaves_nothing(shared_machine, tmp_path, host_tmpfs):
    source = tmp_path / "big"
    source.write_bytes(os.urandom(64 * 1024))
    assert shell(shared_machine, f"put {source} /chip/gbig").returncode == 0
    small = host_tmpfs("size=16k")
    done = shell(shared_machine, f"get /chip/gbig {small}/copy")
    assert done.returncode == 1
    assert done.stderr == f"get: {small}/copy: No space left on device\n"
    assert os.listdir(small) == []  # no partial copy, no temporary file


def _exec_raw(booted, line):
    """Send a line straight to the daemon, as a client other than the terminal could."""
    from ipuos._shell_transport import DaemonTransport

    transport = DaemonTransport(booted.paths)
    try:
        out = []
        result = transport.execute(line, on_output=lambda stream, text: out.append([stream, text]))
        result["output"] = out
        return result
    finally:
        transport.close()


def test_ctrl_c_while_printing_a_finished_commands_output_keeps_its_result(shared_machine):
    """The command has finished on tile 0 (here: changed directory and entered python
    mode); a Ctrl-C while its output is still being written must not lose that."""
    from ipuos._shell_transport import DaemonTransport

    transport = DaemonTransport(shared_machine.paths)
    written = []

    def slow_terminal(stream, text):
        written.append((stream, text))
        if len(written) == 1:
            raise KeyboardInterrupt

    try:
        result = transport.execute("cd /tiles/2; echo one; ls /no-such; python", on_output=slow_terminal)
        assert (result["cwd"], result["mode"]) == ("/tiles/2", "python")
        assert written[-1] == ("err", "^C\n")
    finally:
        transport.close()


def test_a_double_dash_ends_the_options_of_every_command(shared_machine):
    done = shell(shared_machine, "mkdir /chip/dd; cd /chip/dd; touch -- -x; ls; cat -- -x; stat -- -x; "
                                 "mkdir -- -d; rmdir -- -d; cd -- /chip/dd; ls; rm -- -x")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("-x\n") and "Path: /chip/dd/-x" in done.stdout
    assert done.stdout.endswith("-x\n") and "--" not in done.stdout.split()


def test_a_double_dash_is_taken_by_the_commands_without_options_too(shared_machine):
    done = shell(shared_machine, "mkdir -p /chip/ddx/r; cd /chip/ddx; pwd --; ps --; df --; help -- ls; "
                                 "history --; mount --ram 8K /chip/ddx/r; umount -- /chip/ddx/r; exit -- 4")
    assert done.returncode == 4, done.stderr
    assert done.stderr == ""
    assert done.stdout.startswith("/chip/ddx\n") and "usage: ls" in done.stdout
    done = shell(shared_machine, "exit -- -1")
    assert done.returncode == 255, done.stderr


def test_a_quoted_tilde_in_a_host_path_is_a_tilde_as_in_sh(shared_machine, tmp_path):
    home, work = tmp_path / "home", tmp_path / "work"
    (home).mkdir()
    (work / "~").mkdir(parents=True)
    (home / "t").write_text("from home\n")
    (work / "~" / "t").write_text("from the ~ directory\n")
    env = shared_machine.env(HOME=str(home))
    done = shell(shared_machine, "put ~/t /chip/tilde-home; put '~/t' /chip/tilde-q1; put \\~/t /chip/tilde-q2; "
                                 "cat /chip/tilde-home /chip/tilde-q1 /chip/tilde-q2; get /chip/tilde-home '~/back'",
                 cwd=work, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "from home\nfrom the ~ directory\nfrom the ~ directory\n"
    assert (work / "~" / "back").read_text() == "from home\n" and not (home / "back").exists()


def test_stat_of_a_missing_path_then_a_file_starts_with_the_file_not_a_blank_line(shared_machine):
    done = shell(shared_machine, "echo x > /chip/stat-one; stat /chip/nope /chip/stat-one /chip/stat-one")
    assert done.returncode == 1
    assert done.stderr == "stat: /chip/nope: No such file or directory\n"
    assert done.stdout.startswith("  File: /chip/stat-one\n") and done.stdout.count("\n\n  File:") == 1


def test_a_double_dash_ends_the_options_of_put_get_and_kill(shared_machine, tmp_path):
    # (the terminal does put and get: it read "--" as the host file)
    (tmp_path / "-x.dat").write_bytes(b"dashed\n")
    done = shell(shared_machine, "put -- -x.dat /chip/; get -- /chip/-x.dat -y.dat; kill -- 4242", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (1, "kill: 4242: no such job\n")
    assert (tmp_path / "-y.dat").read_bytes() == b"dashed\n"
    # without it, a name starting with a dash is an option, refused as tile 0 refuses one
    for line, message in (("put -x.dat /chip/", "put: option -x not recognized\nusage: put HOSTFILE [PATH]\n"),
                          ("get -z /chip/-x.dat", "get: option -z not recognized\nusage: get PATH [HOSTFILE]\n")):
        done = shell(shared_machine, line, cwd=tmp_path)
        assert (done.returncode, done.stderr) == (2, message), line


def test_c_lines_split_at_newlines_only(shared_machine):
    # (a form feed or U+2028 inside quotes is part of the word, as it is when piped)
    done = shell(shared_machine, 'echo "a\u2028b" > /chip/ls1; echo "c\x0cd"; cat /chip/ls1')
    assert done.returncode == 0, done.stderr
    assert done.stdout == "c\x0cd\na\u2028b\n"
    done = shell(shared_machine, "false_command\n\n")  # (trailing blank lines keep the status)
    assert done.returncode == 127


@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_a_quote_spanning_lines_is_one_word_and_never_runs_as_commands(shared_machine, how):
    """Each line was parsed alone: the line inside the quotes ran (an `rm -r` in a note
    removed the files), between two "unterminated quote" errors."""
    def script(text):
        return shell(shared_machine, text) if how == "-c" else shell(shared_machine, stdin=text + "\n")

    directory = f"/chip/quoted-{how[-1]}"
    assert script(f"mkdir {directory}; echo precious > {directory}/f").returncode == 0
    done = script(f'echo "notes:\nrm -r {directory}\n" > {directory}/notes.txt\n'
                  f"echo 'two\nls /nothing-here'; cat {directory}/f")
    assert (done.returncode, done.stdout, done.stderr) == (0, "two\nls /nothing-here\nprecious\n", "")
    done = script(f"cat {directory}/notes.txt")
    assert (done.returncode, done.stdout) == (0, f"notes:\nrm -r {directory}\n\n")
    # a quote left open to the end of the text: a syntax error, and nothing of it runs
    done = script(f'echo before\necho "open\nrm -r {directory}\necho never > {directory}/g')
    assert (done.returncode, done.stdout, done.stderr) == (2, "before\n", 'sh: syntax error: unterminated " quote\n')
    # ...even after a syntax error earlier in the command: its quoted lines go with it
    done = script(f'echo $X "not a command:\nrm -r {directory}\n"\necho after')
    assert done.returncode == 0 and done.stdout == "after\n", done.stderr
    assert done.stderr.startswith("sh: syntax error near '$X'") and done.stderr.count("\n") == 1
    assert script(f"ls {directory}").stdout == "f\nnotes.txt\n"


@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_a_backslash_at_the_end_of_a_line_joins_it_to_the_next(shared_machine, how):
    def script(text):
        return shell(shared_machine, text) if how == "-c" else shell(shared_machine, stdin=text + "\n")

    done = script("echo a \\\nb\necho c\\\nd \\\n  e; echo \"f\\\ng\" 'h\\\ni'")
    assert (done.returncode, done.stdout, done.stderr) == (0, "a b\ncd e\nfg h\\\ni\n", "")
    # ending the text, as in sh: piped, it escapes the final newline; ending -c, itself
    done = script("echo end \\")
    expected = "end \\\n" if how == "-c" else "end\n"
    assert (done.returncode, done.stdout, done.stderr) == (0, expected, "")
    done = script('echo "open \\')  # (inside a quote: the quote is still open)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr


def test_a_quote_spanning_lines_is_joined_for_shell_lines_only(shared_machine):
    """A repl's lines are its input, quotes and all; after it, the shell's lines join."""
    done = shell(shared_machine, "echo 'shell\nline'; python\nprint('it''s')\nprint(\"x\")\nexit()\n"
                                 "echo \"back\nagain\"")
    assert (done.returncode, done.stdout, done.stderr) == (0, "shell\nline\nits\nx\nback\nagain\n", "")
    # a quote that opens the line starting python: the python line is inside it
    done = shell(shared_machine, "echo 'a\npython'\necho b")
    assert (done.returncode, done.stdout, done.stderr) == (0, "a\npython\nb\n", "")


def test_ctrl_c_stops_a_script_not_just_its_command(shared_machine, tmp_path):
    assert shell(shared_machine, "echo 'while True: sync()' > /chip/syncloop.py").returncode == 0
    for how in ("-c", "stdin"):
        args = [IPUOS, "shell"] + (["-c", "run /chip/syncloop.py --tiles 2\necho after"] if how == "-c" else [])
        script = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=shared_machine.env())
        if how == "stdin":
            script.stdin.write("run /chip/syncloop.py --tiles 2\necho after\n")
            script.stdin.flush()
        wait_for(lambda: "syncloop.py" in subprocess.run([IPUOS, "ps"], env=shared_machine.env(),
                                                         capture_output=True, text=True).stdout,
                 timeout=30, what="the looping program")
        script.send_signal(signal.SIGINT)
        out, err = script.communicate(timeout=30)
        assert script.returncode == 130, (how, out, err)
        assert "after" not in out, how


def test_a_second_ctrl_c_on_run_shows_what_the_tiles_printed(shared_machine, tmp_path):
    # as ipuos run: the job is stopped for good, and its output shown, not thrown away
    (tmp_path / "swallow.py").write_text("while True:\n    try:\n        while True:\n            sync()\n"
                                         "    except KeyboardInterrupt:\n        print('swallowed', __tileid)\n")
    assert shell(shared_machine, f"put {tmp_path}/swallow.py /chip/swallow.py").returncode == 0
    script = subprocess.Popen([IPUOS, "shell", "-c", "run /chip/swallow.py --tiles 1-2; echo SHOULD-NOT"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=shared_machine.env())
    wait_for(lambda: "swallow.py" in subprocess.run([IPUOS, "ps"], env=shared_machine.env(),
                                                    capture_output=True, text=True).stdout,
             timeout=30, what="the program")
    script.send_signal(signal.SIGINT)
    time.sleep(1.0)
    script.send_signal(signal.SIGINT)
    out, err = script.communicate(timeout=30)
    assert script.returncode == 130, (out, err)
    assert "SHOULD-NOT" not in out
    stopped = "interrupted for good (a second Ctrl-C, or the client went away)"  # (ipuos run's words)
    assert out == f"[1 tile: 1]\nswallowed 0\n{stopped}\n[1 tile: 2]\nswallowed 1\n{stopped}\n", (out, err)


def test_a_programs_own_exit_status_130_is_no_ctrl_c_the_script_goes_on(shared_machine, tmp_path):
    # only the user's Ctrl-C stops the rest of a script; a program may exit with 130 itself
    assert shell(shared_machine, "echo 'exit(130)' > /chip/e130.py").returncode == 0
    (tmp_path / "put.txt").write_text("x")
    for line in ("run /chip/e130.py --tiles 3", "python -c 'exit(130)'"):
        done = shell(shared_machine, stdin=f"{line}\necho piped-after\n")
        assert (done.returncode, done.stdout.endswith("piped-after\n")) == (0, True), (line, done.stderr)
        # (put runs in the terminal: the line's commands go one at a time)
        done = shell(shared_machine, f"put {tmp_path}/put.txt /chip/e130.txt; {line}; echo after-c")
        assert (done.returncode, done.stdout.endswith("after-c\n")) == (0, True), (line, done.stderr)
    done = shell(shared_machine, "run /chip/e130.py --tiles 3")
    assert done.returncode == 130
    # a block raising KeyboardInterrupt itself ends 130, as Python does (and run): it said 1
    done = shell(shared_machine, "python -c 'raise KeyboardInterrupt'", user_code=True)
    assert done.returncode == 130 and done.stderr.endswith("KeyboardInterrupt\n"), done.stderr


@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_a_halt_during_a_script_ends_it_with_status_1_as_at_an_interactive_prompt(machine, how):
    """The halt stops the running program as a Ctrl-C would, but it is no Ctrl-C: the
    shell said nothing and exited 130 (an interactive shell: 1, saying why)."""
    assert shell(machine, "echo 'while True: sync()' > /chip/haltloop.py").returncode == 0
    lines = "run /chip/haltloop.py --tiles 2\necho after"
    script = subprocess.Popen([IPUOS, "shell"] + (["-c", lines] if how == "-c" else []), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=machine.env())
    if how == "stdin":
        script.stdin.write(lines + "\n")
        script.stdin.flush()
    try:
        wait_for(lambda: "haltloop.py" in run_cli("ps", env=machine.env()).stdout, timeout=30,
                 what="the looping program")
        assert run_cli("halt", env=machine.env()).returncode == 0
        out, err = script.communicate(timeout=30)
    finally:
        if script.poll() is None:
            script.kill()
    assert script.returncode == 1, (out, err)
    assert err == f"ipuos: the shell session ended: machine {machine.name!r} is halting\n"
    assert out == f"[1 tile: 2]\nmachine {machine.name!r} is halting\n"


def test_a_halt_between_piped_lines_says_the_machine_halted_not_that_it_may_have_crashed(machine):
    """The next line's request meets a closed connection, which cannot tell a halt from a
    crash; the session's own connection can, and its word is the one given."""
    script = subprocess.Popen([IPUOS, "shell"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=machine.env())
    try:
        script.stdin.write("echo one\n")
        script.stdin.flush()
        assert script.stdout.readline() == "one\n"
        assert run_cli("halt", env=machine.env()).returncode == 0
        out, err = script.communicate("echo two\n", timeout=30)
    finally:
        if script.poll() is None:
            script.kill()
    assert (script.returncode, out) == (1, ""), (out, err)
    assert err == f"ipuos: the shell session ended: machine {machine.name!r} has halted\n"


def test_mv_between_tile_0s_tree_and_tiles_0_renames_in_place(machine):
    """Both name tile 0's own disk: a rename, with no room needed for a copy (it copied,
    and on a disk too full for two copies failed with ENOSPC)."""
    setup = shell(machine, "python -c \"open('/mv-big', 'wb').write(b'y' * 9000)\"; mkdir /mv-dir; touch /mv-dir/f")
    assert setup.returncode == 0, setup.stderr  # (tile 0's disk is 16K: no room for a second copy)
    before = shell(machine, "stat /mv-big").stdout.split("Modified:")[1].splitlines()[0]
    done = shell(machine, "mv /mv-big /tiles/0/mv-big2; mv /tiles/0/mv-big2 mv-big3; mv /mv-dir /tiles/0/mv-dir2; "
                 "ls / /mv-dir2")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "/:\nchip/\nmv-big3\nmv-dir2/\ntiles/\n\n/mv-dir2:\nf\n"
    assert shell(machine, "stat /mv-big3").stdout.split("Modified:")[1].splitlines()[0] == before
    # errors name the paths as given; a path under a mount of tile 0's tree, which
    # /tiles/0 does not show, is not respelled into it (and, its directory not being
    # there, the rename fails as Linux's: ENOENT, before any EXDEV and copying)
    done = shell(machine, "mv /nope /tiles/0/z")
    assert (done.returncode, done.stderr) == (1, "mv: /nope: No such file or directory\n")
    done = shell(machine, "mount --ram 8K /mv-dir2; mv /mv-big3 /tiles/0/mv-dir2/x")
    assert (done.returncode, done.stderr) == (1, "mv: /mv-big3 -> /tiles/0/mv-dir2/x: No such file or directory\n")
    assert shell(machine, "ls /mv-dir2").stdout == ""


def test_a_tree_with_a_mount_inside_is_refused_by_its_tiles_0_name_too(machine):
    """/tiles/0 shows tile 0's disk without what is mounted on it: rm -r /tiles/0/DIR
    emptied DIR around the mount point, then failed on it. (A fresh machine: the shared
    one's tile 0 disk is too full by now for the directories.)"""
    setup = shell(machine, "mkdir -p /t0m/r; mount --ram 8K /t0m/r; echo data > /t0m/r/f; echo top > /t0m/t")
    assert (setup.returncode, setup.stderr) == (0, "")
    # mv of /tiles/0/DIR renames /DIR in place, which the VFS refuses; a spelling with ..
    # is left to the kernel, not renamed in place: a copy to tile 3, then the same removal
    done = shell(machine, "rm -r /tiles/0/t0m; rm -r /tiles/0/t0m/; mv /tiles/0/t0m /tiles/3/t0m; "
                 "mv /tiles/0/t0m/../t0m /tiles/3/t0m; cat /t0m/r/f /t0m/t; ls /tiles/3")
    assert (done.returncode, done.stdout) == (0, "data\ntop\n")
    assert done.stderr.splitlines() == [
        f"{command}: {path}: a filesystem is mounted at /t0m/r inside it (umount it first)"
        for command, path in (("rm", "/tiles/0/t0m"), ("rm", "/tiles/0/t0m/"), ("mv", "/tiles/0/t0m"),
                              ("mv", "/tiles/0/t0m/../t0m"))]


def _mounted_there(name: str) -> str:
    return f"a filesystem is mounted there (tile 0's {name}, which /tiles/0 does not show)"


@pytest.mark.parametrize("line, message", [
    ("mkdir /tiles/0/chip", f"mkdir: /tiles/0/chip: {_mounted_there('/chip')}"),
    ("mkdir /tiles/0/tiles/", f"mkdir: /tiles/0/tiles/: {_mounted_there('/tiles')}"),
    ("touch /tiles/0/chip", f"touch: /tiles/0/chip: {_mounted_there('/chip')}"),
    ("echo x > /tiles/0/hidr", f"sh: /tiles/0/hidr: {_mounted_there('/hidr')}"),
    ("cp /chip/hid.txt /tiles/0/tiles", f"cp: /tiles/0/tiles: {_mounted_there('/tiles')}"),
    ("mv /chip/hid.txt /tiles/0/hidr", f"mv: /tiles/0/hidr: {_mounted_there('/hidr')}"),
    ("rmdir /tiles/0/chip", f"rmdir: /tiles/0/chip: {_mounted_there('/chip')}"),
    # looking such a name up, or a path below it, still finds nothing there
    ("stat /tiles/0/hidr", "stat: /tiles/0/hidr: No such file or directory"),
    ("cat /tiles/0/chip/hid.txt", "cat: /tiles/0/chip/hid.txt: No such file or directory"),
    ("mkdir /tiles/0/hidr/d", "mkdir: /tiles/0/hidr/d: No such file or directory"),
])
def test_a_name_tile_0_has_mounted_on_is_busy_under_tiles_0(shared_machine, line, message):
    """/tiles/0 leaves out tile 0's mount points (/chip, /tiles, RAM disks): making such a
    name there said "No such file or directory", which left the user guessing; the FUSE
    mount says EBUSY (something is mounted there), and so does the shell now."""
    setup = shell(shared_machine, "echo data > /chip/hid.txt; mkdir /hidr; mount --ram 8K /hidr")
    assert (setup.returncode, setup.stderr) == (0, ""), setup.stderr
    try:
        done = shell(shared_machine, line)
        assert (done.returncode, done.stderr) == (1, message + "\n"), line
        listing = shell(shared_machine, "ls /tiles/0").stdout.split()
        assert {"chip/", "tiles/", "hidr/", "hidr"}.isdisjoint(listing), listing
        assert shell(shared_machine, "cat /chip/hid.txt").stdout == "data\n"  # (nothing was moved)
    finally:
        assert shell(shared_machine, "umount /hidr; rmdir /hidr; rm /chip/hid.txt").returncode == 0


def test_ctrl_c_while_waiting_for_a_busy_tile_0_exits_130(shared_machine, tmp_path):
    spin = tmp_path / "spin.py"
    spin.write_text("while True:\n    pass\n")  # holds tile 0, and with it the machine
    job = subprocess.Popen([IPUOS, "run", str(spin), "--tiles", "0"], env=shared_machine.env(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: "spin.py" in subprocess.run([IPUOS, "ps"], env=shared_machine.env(),
                                                     capture_output=True, text=True).stdout,
                 what="the spinning program")
        errors = tmp_path / "stderr"
        with open(errors, "w") as sink:
            waiting = subprocess.Popen([IPUOS, "shell", "-c", "echo never"], env=shared_machine.env(),
                                       stdout=subprocess.PIPE, stderr=sink, text=True)
        wait_for(lambda: "waiting for tile 0" in errors.read_text(), timeout=20, what="the shell to wait")
        waiting.send_signal(signal.SIGINT)
        out, _ = waiting.communicate(timeout=20)
        err = errors.read_text()
        assert waiting.returncode == 130, (out, err)
        assert "stopped waiting for tile 0" in err and "Aborted" not in err and out == ""
        # (it cannot tell a tile holding the machine from a long superstep: it names both)
        assert "a superstep lasts as long as all its tiles' compute together" in err
        assert "a program computing without reaching an exchange point holds every tile" in err
    finally:
        job.send_signal(signal.SIGINT)  # (ipuos run interrupts its job)
        job.wait(30)


def test_history_lists_a_pasted_block_as_one_entry_indented(shared_machine, tmp_path):
    history = tmp_path / "ipuos" / "history"
    history.parent.mkdir(mode=0o700)
    history.write_text("\n# 1\n+echo p1\n+echo p2\n\n# 2\n+ls\n")  # prompt_toolkit's file format
    history.chmod(0o600)
    done = shell(shared_machine, "history", env=shared_machine.env(XDG_DATA_HOME=str(tmp_path)))
    assert (done.returncode, done.stdout) == (0, "1  echo p1\n   echo p2\n2  ls\n")


def test_piped_lines_share_one_session(shared_machine):
    done = shell(shared_machine, stdin="cd /tiles/2\npwd\necho from-a-pipe > piped\ncat /tiles/2/piped\n")
    assert done.returncode == 0
    assert done.stdout == "/tiles/2\nfrom-a-pipe\n"


def test_unknown_commands_never_reach_the_host(shared_machine, tmp_path):
    marker = tmp_path / "ran-on-the-host"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("frobnicate", "sh", "python3"):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\ntouch {marker}\n")
        script.chmod(0o755)
    env = shared_machine.env(PATH=f"{bin_dir}:{os.environ['PATH']}")
    done = shell(shared_machine, "frobnicate --now; sh -c 'touch x'; python3", env=env)
    assert done.returncode == 127
    assert done.stderr.splitlines() == [
        "frobnicate: command not found (help lists the commands)",
        "sh: command not found (help lists the commands)",
        "python3: command not found (help lists the commands)",
    ]
    assert not marker.exists()


def test_put_and_get_copy_bytes_exactly(shared_machine, tmp_path):
    data = os.urandom(100_000) + bytes(range(256)) * 3
    (tmp_path / "blob.bin").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    (tmp_path / "back").mkdir()
    done = shell(shared_machine, "mkdir /chip/in; put blob.bin /chip/in; put empty /tiles/7/empty; "
                 "get /chip/in/blob.bin back; get /tiles/7/empty back/empty2; ls -l /chip/in; rm -r /chip/in",
                 cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "back" / "blob.bin").read_bytes() == data
    assert (tmp_path / "back" / "empty2").read_bytes() == b""
    assert f" {len(data)} " in done.stdout
    done = shell(shared_machine, "put no-such-file /chip; get /chip/nothing here; "
                 "put blob.bin /tiles/6/big; get /tiles/6/nothing here", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.splitlines() == ["put: no-such-file: No such file or directory",
                                        "get: /chip/nothing: No such file or directory",
                                        "put: /tiles/6/big: No space left on device",  # (a 16 KiB disk)
                                        "get: /tiles/6/nothing: No such file or directory"]
    # a put that fails leaves the old file, or none, and nothing half-written
    done = shell(shared_machine, "echo old > /tiles/6/kept; put blob.bin /tiles/6/kept; cat /tiles/6/kept; "
                 "ls -a /tiles/6", cwd=tmp_path)
    assert done.stderr == "put: /tiles/6/kept: No space left on device\n"
    assert done.stdout.splitlines() == ["old", ".", "..", "kept"]
    assert not (tmp_path / "here").exists()


@pytest.mark.parametrize("name, failure", [("ctrl-c", KeyboardInterrupt),
                                           ("eio", lambda: OSError(5, "Input/output error"))])
def test_a_put_given_up_between_chunks_leaves_no_partial_file(shared_machine, name, failure):
    """Ctrl-C while the terminal reads the next chunk of the host file, or that read
    failing: the chunks written so far go at once, not when the session ends."""
    from ipuos._shell_transport import DaemonTransport

    def chunks():
        yield b"first chunk\n"
        yield b"second chunk\n"
        raise failure()  # (the first chunk is on the chip by now: the put reads one ahead)

    assert shell(shared_machine, f"mkdir /chip/{name}").returncode == 0
    transport = DaemonTransport(shared_machine.paths)
    try:
        with pytest.raises((KeyboardInterrupt, OSError)):
            transport.put(f"/chip/{name}/f", chunks(), "f")
        done = shell(shared_machine, f"ls -a /chip/{name}")  # while the session lives on
        assert done.stdout == ".\n..\n", done.stderr
    finally:
        transport.close()


def test_a_ctrl_c_as_a_chunks_answer_arrives_still_stops_the_put(shared_machine, monkeypatch):
    """Too late to cancel that chunk, not too late for the put: no more chunks go, and the
    partial file goes. (The Ctrl-C was lost, and the put went on to the end.)"""
    import threading

    from ipuos._client import Client
    from ipuos._shell_transport import DaemonTransport

    real_poll = Client._poll
    answers = []

    def poll(client):
        frame = real_poll(client)
        if (frame is not None and frame.header.get("type") == "result" and not answers
                and threading.current_thread() is threading.main_thread()):
            answers.append(frame)
            signal.raise_signal(signal.SIGINT)  # as the first chunk's answer comes in
        return frame

    assert shell(shared_machine, "mkdir /chip/late").returncode == 0
    transport = DaemonTransport(shared_machine.paths)
    try:
        monkeypatch.setattr(Client, "_poll", poll)
        with pytest.raises(KeyboardInterrupt):
            transport.put("/chip/late/f", [b"first chunk\n", b"second chunk\n"], "f")
        monkeypatch.undo()
        assert answers  # (the Ctrl-C came)
        done = shell(shared_machine, "ls -a /chip/late")
        assert done.stdout == ".\n..\n", done.stderr
    finally:
        transport.close()


def test_cp_onto_a_full_disk_says_no_space(shared_machine, tmp_path):
    # the copy's earlier chunks are lost with the one that found the disk full, and
    # closing the copy says so: the error cp reports is still the first one
    (tmp_path / "blob.bin").write_bytes(os.urandom(100_000))
    done = shell(shared_machine, "put blob.bin /chip/blob; cp /chip/blob /tiles/5/copy", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr == "cp: /tiles/5/copy: No space left on device\n"  # (a 16 KiB disk)
    # and no partial copy is left behind
    gone = shell(shared_machine, "rm /chip/blob; ls /tiles/5/copy")
    assert gone.stderr == "ls: /tiles/5/copy: No such file or directory\n"
    # over a file there already: the old one stays, and cp says why room ran out
    (tmp_path / "nine.bin").write_bytes(os.urandom(9_000))  # two do not fit a 16 KiB disk
    done = shell(shared_machine, "put nine.bin /tiles/5/nine; put nine.bin /chip/nine; cp /chip/nine /tiles/5/nine",
                 cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr == ("cp: /tiles/5/nine: No space left on device (the copy is written beside the old "
                           "file, which it replaces once complete: remove that first to make room)\n")
    assert shell(shared_machine, "rm /tiles/5/nine; cp /chip/nine /tiles/5/nine; rm /chip/nine /tiles/5/nine").returncode == 0


def test_cp_r_reports_what_fails_and_goes_on_with_the_rest(shared_machine, tmp_path):
    """As GNU cp: one file that fails does not leave the rest of the tree uncopied."""
    (tmp_path / "big.bin").write_bytes(os.urandom(20_000))  # more than tile 10's 16 KiB disk
    done = shell(shared_machine, "mkdir /chip/mix; echo a > /chip/mix/a_small; put big.bin /chip/mix/b_big; "
                                 "echo c > /chip/mix/c_small; cp -r /chip/mix /tiles/10/", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (1, "cp: /tiles/10/mix/b_big: No space left on device\n")
    assert shell(shared_machine, "ls /tiles/10/mix").stdout == "a_small\nc_small\n"
    shell(shared_machine, "rm -r /chip/mix /tiles/10/mix")


def test_put_and_get_expand_a_host_pattern_to_one_file_and_refuse_one_on_the_chip(shared_machine, tmp_path):
    (tmp_path / "only-one.txt").write_text("one\n")
    (tmp_path / "a.log").write_text("a")
    (tmp_path / "b.log").write_text("b")
    done = shell(shared_machine, "mkdir /pp; put only-*.txt /pp; cat /pp/only-one.txt", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "one\n")
    for line, error in (("put *.log /pp", "put: *.log: matches 2 files; put takes one"),
                        ("put *.none /pp", "put: *.none: matches no file"),
                        # a host directory that is there: it was "No such file or directory"
                        (f"get /pp/only-one.txt {tmp_path}/got*.txt",
                         f"get: {tmp_path}/got*.txt: matches no file; to write a new file, name it "
                         "without * ? [ ] (or quote them)"),
                        ("get /pp/only-one.txt *.log", "get: *.log: matches 2 files; get takes one"),
                        ("put a.log /p*", "put: /p*: name the file on the chip without * ? [ ] "
                                          "(they are not expanded here; `ls` shows the names)"),
                        ("get /pp/only-* here", "get: /pp/only-*: name the file on the chip without * ? [ ] "
                                               "(they are not expanded here; `ls` shows the names)")):
        done = shell(shared_machine, line, cwd=tmp_path)
        assert done.returncode in (1, 2) and done.stderr == error + "\n", line
    assert shell(shared_machine, "ls /pp; rm -r /pp").stdout == "only-one.txt\n"  # no file named /p*
    assert not (tmp_path / "here").exists()
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a.log", "b.log", "only-one.txt"]


def test_get_gives_host_files_the_usual_mode_and_names_them_in_errors(shared_machine, tmp_path):
    (tmp_path / "kept").write_bytes(b"old")
    (tmp_path / "kept").chmod(0o640)
    done = shell(shared_machine, "echo hi > /tiles/3/g; get /tiles/3/g fresh; get /tiles/3/g kept; "
                 "get /tiles/3/g no-such-dir/x", cwd=tmp_path)
    assert done.returncode == 1
    assert stat.S_IMODE((tmp_path / "fresh").stat().st_mode) == 0o666 & ~current_umask()
    assert stat.S_IMODE((tmp_path / "kept").stat().st_mode) == 0o640
    assert (tmp_path / "kept").read_bytes() == b"hi\n"
    assert done.stderr.splitlines() == ["get: no-such-dir/x: No such file or directory"]
    assert sorted(os.listdir(tmp_path)) == ["fresh", "kept"]  # no temporary left behind


def test_get_writes_through_a_symlink_and_into_a_fifo_never_replacing_them(shared_machine, tmp_path):
    (tmp_path / "target").write_bytes(b"old")
    (tmp_path / "link").symlink_to("target")
    os.mkfifo(tmp_path / "fifo")
    received = []
    reader = threading.Thread(target=lambda: received.append((tmp_path / "fifo").read_bytes()))
    reader.start()
    done = shell(shared_machine, "echo new > /tiles/4/g; get /tiles/4/g link; get /tiles/4/g fifo; "
                 "get /tiles/4/g ''", cwd=tmp_path)
    reader.join(10)
    assert done.returncode == 2
    assert done.stderr == "get: the host file name is empty\n"
    assert (tmp_path / "link").is_symlink() and (tmp_path / "target").read_bytes() == b"new\n"
    assert stat.S_ISFIFO((tmp_path / "fifo").lstat().st_mode) and received == [b"new\n"]
    assert sorted(os.listdir(tmp_path)) == ["fifo", "link", "target"]


def test_a_line_that_is_not_utf8_is_skipped_with_a_message(shared_machine):
    done = subprocess.run([IPUOS, "shell"], input=b"echo \xff\nmkdir /utf8-after/\nls /utf8-after\n",
                          capture_output=True, env=shared_machine.env(), timeout=60)
    assert done.returncode == 0  # the lines after it ran
    assert done.stderr.decode() == "ipuos: a line that is not UTF-8 text was skipped: echo \\udcff\n"
    assert done.stdout == b""
    assert shell(shared_machine, "rmdir /utf8-after").returncode == 0


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_cp_across_tiles_and_into_the_chip_disk(shared_machine, tmp_path):
    lines = "".join(f"line {i} of a file on tile 3\n" for i in range(150))  # several exchange chunks
    (tmp_path / "text").write_text(lines)
    done = shell(shared_machine, "mkdir -p /tiles/3/src/sub; put text /tiles/3/src/a.txt; "
                 "echo small > /tiles/3/src/sub/b.txt; "
                 "cp /tiles/3/src/a.txt /tiles/9/copied.txt; cp -r /tiles/3/src /chip/tree; "
                 "cp /chip/tree/sub/b.txt /b.txt; "
                 "get /tiles/9/copied.txt one; get /chip/tree/a.txt two; cat /chip/tree/sub/b.txt /b.txt",
                 cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "one").read_text() == lines and (tmp_path / "two").read_text() == lines
    assert done.stdout == "small\nsmall\n"
    done = shell(shared_machine, "cp /tiles/3/src /chip/nope; cp /b.txt /tiles/0/b.txt; cp -r /chip/tree /chip/tree/sub")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "cp: /tiles/3/src: is a directory (use cp -r)",
        "cp: /b.txt and /tiles/0/b.txt are the same file",
        "cp: /chip/tree: cannot copy or move a directory into itself (/chip/tree/sub/tree)",
    ]
    # a missing source is said to be missing (it was "the same file" as its name in DEST)
    done = shell(shared_machine, "cd /chip; cp nosuch .; mv nosuch .; cp nosuch nosuch; cp *.none .; "
                 "mv missing missing/x; mv nosuch /tiles/0/../chip")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"{cmd}: {path}: No such file or directory" for cmd, path in (
        ("cp", "nosuch"), ("mv", "nosuch"), ("cp", "nosuch"), ("cp", "*.none"), ("mv", "missing"), ("mv", "nosuch"))]
    # tile 0's own files are the same seen through /tiles/0; its /chip there is a plain name
    done = shell(shared_machine, "mkdir -p /self/in; echo z > /self/z; cp -r /self /tiles/0/self/in; "
                 "mv /self /tiles/0/self/in/deeper; cp /self/z /chip/nodir/; cp /self/z /chip/no/dir/; "
                 "cp /self/z /self/z/; cp /self/z /self/z/x; mv /self/z /self/z/x; cp /self/z /self/z/x/; "
                 "cp /tiles/0/chip/y /chip/y; ls /self /self/in")
    # (as GNU cp: a directory named with / that is not there, "Not a directory" unless its
    # parent is missing too; a file is no directory to copy into, not "into itself")
    assert done.stderr.splitlines() == [
        "cp: /self: cannot copy or move a directory into itself (/tiles/0/self/in/self)",
        "mv: /self: cannot copy or move a directory into itself (/tiles/0/self/in/deeper)",
        "cp: /chip/nodir/: Not a directory",
        "cp: /chip/no/dir/: No such file or directory",
        "cp: /self/z/: Not a directory",
        "cp: /self/z/x: Not a directory",
        "mv: /self/z/x: Not a directory",
        "cp: /self/z/x/: Not a directory",
        "cp: /tiles/0/chip/y: No such file or directory",
    ]
    assert done.stdout == "/self:\nin/\nz\n\n/self/in:\n"  # nothing was copied into itself
    assert shell(shared_machine, "rm -r /self").returncode == 0  # (tile 0's disk is small)


def test_mv_between_filesystems_copies_then_removes(shared_machine):
    done = shell(shared_machine, "mkdir -p /tiles/4/m/d; echo moved > /tiles/4/m/d/f; "
                 "mv /tiles/4/m /chip/m; cat /chip/m/d/f; ls /tiles/4/m")
    assert done.returncode == 1
    assert done.stdout == "moved\n"
    assert done.stderr == "ls: /tiles/4/m: No such file or directory\n"
    done = shell(shared_machine, "mv /chip/m/d/f /chip/m/g; ls /chip/m")
    assert done.stdout == "d/\ng\n"


def test_a_copy_or_move_that_fails_leaves_the_target_as_it_was(shared_machine, tmp_path):
    """The copy goes to a temporary name beside the target and replaces it only once
    complete: out of space, the source is whole and the target as it was (absent, or the
    old file), with no partial copy left anywhere."""
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(30_000))  # more than a tiny tile disk (16 KiB) holds
    done = shell(shared_machine, f"put {big} /chip/mvf.bin; echo old > /tiles/6/mvf-kept; "
                 "mv /chip/mvf.bin /tiles/5/mvf.bin; mv /chip/mvf.bin /tiles/6/mvf-kept; "
                 "mkdir -p /chip/mvf/sub; cp /chip/mvf.bin /chip/mvf/sub/b; echo small > /chip/mvf/a; "
                 "mv /chip/mvf /tiles/7/mvf; cp /chip/mvf.bin /tiles/5/cpf.bin; cp /chip/mvf.bin /tiles/6/mvf-kept")
    assert done.returncode == 1
    assert done.stderr.splitlines() == ["mv: /tiles/5/mvf.bin: No space left on device",
                                        "mv: /tiles/6/mvf-kept: No space left on device",
                                        "mv: /tiles/7/mvf/sub/b: No space left on device",
                                        "cp: /tiles/5/cpf.bin: No space left on device",
                                        "cp: /tiles/6/mvf-kept: No space left on device"]
    done = shell(shared_machine, "ls -a /tiles/5 /tiles/6 /tiles/7")
    left = [name for name in done.stdout.split() if name.startswith((".cp-", "mvf", "cpf"))]
    assert left == ["mvf-kept"], done.stdout
    done = shell(shared_machine, f"cat /tiles/6/mvf-kept; get /chip/mvf.bin {tmp_path / 'back'}; "
                 "ls /chip/mvf /chip/mvf/sub; rm -r /chip/mvf /chip/mvf.bin /tiles/6/mvf-kept")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "old\n/chip/mvf:\na\nsub/\n\n/chip/mvf/sub:\nb\n"
    assert (tmp_path / "back").read_bytes() == big.read_bytes()


def test_du_of_the_root_counts_tile_0s_disk_once(shared_machine):
    done = shell(shared_machine, "mkdir -p /du-once; du /; rmdir /du-once")
    names = [line.split("\t")[1] for line in done.stdout.splitlines()]
    assert "/du-once" in names and "/tiles/1" in names
    assert not any(name == "/tiles/0" or name.startswith("/tiles/0/") for name in names)
    assert "/tiles/0" in [line.split("\t")[1] for line in shell(shared_machine, "du /tiles").stdout.splitlines()]


def test_tail_from_a_line(shared_machine):
    done = shell(shared_machine, "echo 1 > /tl; echo 2 >> /tl; echo 3 >> /tl; tail -n +2 /tl; tail -n +1 /tl; "
                 "tail -n +9 /tl; tail -n 1 /tl; rm /tl")
    assert (done.returncode, done.stdout) == (0, "2\n3\n" "1\n2\n3\n" "" "3\n")


@pytest.mark.parametrize("command", ["head", "tail"])
def test_headers_of_several_files_have_a_blank_line_between_them_only(shared_machine, command):
    """As GNU's: a file that cannot be read gets its error and no header, so the first
    header shown has no blank line before it (it had one after a missing first file)."""
    done = shell(shared_machine, f"echo a > /hh1; echo b > /hh2; {command} -n 1 /hh-none /hh1 /hh-none /hh2")
    shell(shared_machine, "rm /hh1 /hh2")
    assert done.returncode == 1
    assert done.stdout == "==> /hh1 <==\na\n\n==> /hh2 <==\nb\n"
    assert done.stderr == f"{command}: /hh-none: No such file or directory\n" * 2


def test_globs_redirection_head_and_tail(shared_machine):
    numbers = "; ".join(f"echo {i} >> /g/n.txt" for i in range(1, 21))
    done = shell(shared_machine, f"mkdir /g; {numbers}; touch /g/a.log /g/b.log /g/.hidden.log; "
                 "ls /g/*.log; head -n 3 /g/n.txt; tail -2 /g/n.txt; rm /g/*.log; ls -a /g")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("/g/a.log\n/g/b.log\n" "1\n2\n3\n" "19\n20\n" "./\n../\n.hidden.log\nn.txt\n"
                           ).replace("./\n../\n", ".\n..\n")
    assert shell(shared_machine, "ls /g/*.none").stderr == "ls: /g/*.none: No such file or directory\n"


def test_long_output_streams_whole(shared_machine, tmp_path):
    text = "".join(f"{i:06d} some text to make a long line of output\n" for i in range(2000))
    (tmp_path / "long").write_text(text)  # ~94 KB: streams in several pieces
    done = shell(shared_machine, "put long /chip/long; cat /chip/long; rm /chip/long", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == text


def test_tree_stat_du(shared_machine):
    shell(shared_machine, "mkdir -p /tiles/6/t/a/b; echo 12345 > /tiles/6/t/a/f; touch /tiles/6/t/a/b/g")
    done = shell(shared_machine, "tree /tiles/6/t; du -s /tiles/6/t; stat /tiles/6/t/a/f")
    assert done.returncode == 0
    assert "/tiles/6/t\n└── a/\n    ├── b/\n    │   └── g\n    └── f\n\n2 directories, 2 files\n" in done.stdout
    assert "6\t/tiles/6/t\n" in done.stdout
    assert "  Type: regular file\n  Size: 6\n" in done.stdout
    assert "served by tile 6" in done.stdout
    done = shell(shared_machine, "stat /")
    assert " Mount: / (littlefs: MemoryDevice tile 0 'disk' " in done.stdout, done.stdout  # (as mount shows it)


def test_run_groups_output_and_passes_arguments_and_data(shared_machine, tmp_path):
    (tmp_path / "prog.py").write_text(
        "words = __tiledata.split()\n"
        "print(__args[1:], allreduce(len(words)), __tileid % 2)\n")
    (tmp_path / "data.txt").write_text("a b\nc\nd e f\ng\n")
    (tmp_path / "exit3.py").write_text("exit(3)\n")
    (tmp_path / "bad.py").write_text("x = = 1\n")
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbfprint('bom')\n")
    done = shell(shared_machine, "mkdir /chip/p; put prog.py /chip/p; put data.txt /chip/p; "
                 "put exit3.py /chip/p; put bad.py /chip/p; put bom.py /chip/p; cd /chip/p; "
                 "run prog.py --tiles 0-3 --data data.txt one --two", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("[2 tiles: 0,2]\n['one', '--two'] 7 0\n"
                           "[2 tiles: 1,3]\n['one', '--two'] 7 1\n")
    assert shell(shared_machine, "run /chip/p/exit3.py --tiles 0-1").returncode == 3
    assert shell(shared_machine, "run /chip/p/bom.py --tiles 0").stdout == "[1 tile: 0]\nbom\n"
    done = shell(shared_machine, "run /chip/p/bad.py; run /chip/p/prog.py --tiles 0-99")
    assert done.stderr.splitlines() == [
        "run: /chip/p/bad.py: syntax error at line 1, column 5: invalid syntax",
        "run: --tiles: bad tile specification '0-99': no tile 99 on this machine (it has tiles 0-15)",
    ]


def test_a_message_tile_0_sends_arrives_after_the_exchange_in_a_program_the_shell_runs(shared_machine):
    """The shell, on tile 0, starts the job mid-superstep: every tile of it must still
    begin in the same superstep (tile 0 began at once, and its message reached tile 1
    in tile 1's first superstep)."""
    program = ("_ = send(1, 'm') if __tileid == 0 else print(poll(0))\n"
               "sync()\n"
               "_ = None if __tileid == 0 else print(poll(0), recv(0))\n")
    done = shell(shared_machine, f"echo \"{program}\" > /bsp.py; run /bsp.py --tiles 0-1")
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout == "[1 tile: 1]\nFalse\nTrue m\n"


def test_run_refuses_a_slip_for_its_own_options_unless_after_double_dash(shared_machine):
    """``--tile 0`` used to reach the program as an argument, and it ran on every tile."""
    assert shell(shared_machine, "echo 'print(__args)' > /runargs.py").returncode == 0
    usage = "usage: run FILE [--tiles SPEC] [--data PATH] [--budget SECONDS] [ARG...] [-- ARG...]\n"
    for line, name, meant in (("run /runargs.py --tile 0", "--tile", "--tiles"),
                              ("run /runargs.py --tiles 0 --dat /runargs.py", "--dat", "--data"),
                              ("run /runargs.py a --tilse=0", "--tilse", "--tiles"),
                              ("run /runargs.py --budgte 3", "--budgte", "--budget")):
        done = shell(shared_machine, line)
        assert (done.returncode, done.stdout) == (2, ""), line
        assert done.stderr == (f"run: option {name} not recognized (did you mean {meant}?); to pass it to "
                               "the program, put it after --\n" + usage), line
    done = shell(shared_machine, "run /runargs.py --tiles 0 a -- --tile 0; run /runargs.py --tiles 1 --time 3")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == ("[1 tile: 0]\n['/runargs.py', 'a', '--tile', '0']\n"
                           "[1 tile: 1]\n['/runargs.py', '--time', '3']\n")
    assert "is refused; to pass it to the program, put\nit after --.\n" in shell(shared_machine, "help run").stdout


def test_run_takes_its_options_before_file_as_ipuos_run_does(shared_machine):
    """They used to be taken for FILE: `run --tiles 0 F` said `run: --tiles: No such file
    or directory`, status 1, and `run --help` the same of --help."""
    assert shell(shared_machine, "echo 'print(__args)' > /runfirst.py").returncode == 0
    done = shell(shared_machine, "run --tiles 0 /runfirst.py a --x; run --tiles=1 --budget 5 -- /runfirst.py --tiles 3")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == ("[1 tile: 0]\n['/runfirst.py', 'a', '--x']\n"
                           "[1 tile: 1]\n['/runfirst.py', '--tiles', '3']\n")
    done = shell(shared_machine, "run --help")
    assert (done.returncode, done.stdout, done.stderr) == (0, shell(shared_machine, "help run").stdout, "")
    assert "run's own options may also come before FILE" in done.stdout
    usage = "usage: run FILE [--tiles SPEC] [--data PATH] [--budget SECONDS] [ARG...] [-- ARG...]\n"
    for line, error in (("run --tile 0 /runfirst.py", "option --tile not recognized (did you mean --tiles?)"),
                        ("run -v /runfirst.py", "option -v not recognized"),
                        ("run --tiles 0", "missing file operand")):
        done = shell(shared_machine, line)
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"run: {error}\n{usage}"), line


def test_python_on_tile_0_keeps_its_names(shared_machine):
    done = shell(shared_machine, "python -c 'x = 6'; python -c 'print(x * 7, __tileid, __numtiles)'; "
                 "python -c 'import os; print(os.listdir(\"/\") == sorted(os.listdir(\"/\")))'")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "42 0 1"
    done = shell(shared_machine, "python -c 'len([1, 2])'; python -c 'print(len([1]))'")
    assert (done.returncode, done.stdout) == (0, "1\n")  # as python -c: no value echoed
    # a traceback goes to the error stream, as Python's, and as a SyntaxError does (it
    # went with the output, where `> file` on the host caught it among the data)
    done = shell(shared_machine, "python -c '1/0'", user_code=True)
    assert (done.returncode, done.stdout) == (1, "")
    assert "ZeroDivisionError: division by zero" in done.stderr
    done = shell(shared_machine, "python -c 'x = = 1'")
    assert done.returncode == 1 and "SyntaxError" in done.stderr


def test_python_c_into_a_file_leaves_its_traceback_on_the_terminal(shared_machine):
    """As any command's errors: they went into the file with the output, and nothing
    showed on the terminal."""
    done = shell(shared_machine, "python -c 'print(5); 1/0' > /chip/pyerr", user_code=True)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("Traceback (most recent call last):\n"), done.stderr
    assert done.stderr.endswith("ZeroDivisionError: division by zero\n"), done.stderr
    done = shell(shared_machine, "cat /chip/pyerr; rm /chip/pyerr")
    assert (done.returncode, done.stdout) == (0, "5\n")
    # the traceback starts a line of its own
    done = shell(shared_machine, "python -c 'print(5, end=\"\"); 1/0'", user_code=True)
    assert (done.returncode, done.stdout) == (1, "5\n")
    assert done.stderr.startswith("Traceback (most recent call last):\n"), done.stderr


def test_a_repl_is_the_last_command_of_its_line_and_not_redirected(shared_machine, tmp_path):
    (tmp_path / "words").write_text("a b\n")
    message = "must be the last command on its line (the lines that follow are its input)"
    for line, error in (("python; echo never > /repl-ran", f"python: {message}"),
                        ("multirepl --tiles 0-1; echo never > /repl-ran", f"multirepl: {message}"),
                        ("multirepl --tiles 0-1 --data words; echo never > /repl-ran", f"multirepl: {message}"),
                        ("echo old > /repl-out; multirepl --tiles 0-1 > /repl-out",
                         "multirepl: a repl's output cannot be redirected")):
        done = shell(shared_machine, line, cwd=tmp_path)
        assert (done.returncode, done.stderr) == (2, error + "\n"), line
    assert shell(shared_machine, "ls /repl-ran").returncode == 1  # nothing of those lines ran
    assert shell(shared_machine, "ls /repl-out").returncode == 1  # (not even the echo before it)


def test_a_c_text_that_ends_by_starting_a_repl_is_refused(shared_machine, tmp_path):
    """Its input would be the lines after it in the text: none. It used to start and end
    at once, silently, with status 0, leaving stdin unread."""
    (tmp_path / "words").write_text("a b\n")
    hints = {"python": "python -c CODE runs one block", "multirepl": "ipuos repl reads blocks from a pipe"}
    for text, name in (("python", "python"), ("echo never > /repl-c-ran; python", "python"),
                       ("multirepl --tiles 0-1", "multirepl"), ("multirepl --tiles 0-1 --data words", "multirepl"),
                       ("echo first\nmultirepl --tiles 0-1", "multirepl")):
        done = shell(shared_machine, text, stdin="print(7)\n", cwd=tmp_path)
        message = f"{name}: its input is the lines after it in the -c text, and there are none ({hints[name]})\n"
        assert (done.returncode, done.stderr) == (2, message), text
        assert done.stdout == ("first\n" if "first" in text else ""), text
    assert shell(shared_machine, "ls /repl-c-ran").returncode == 1  # nothing of that line ran
    # with lines after it, they are its input, as before
    done = shell(shared_machine, "python\nprint(6 * 7)")
    assert (done.returncode, done.stdout) == (0, "42\n")
    done = shell(shared_machine, "multirepl --tiles 0-1\nprint(allreduce(__tileid + 1))")
    assert (done.returncode, done.stdout) == (0, "[2 tiles: 0-1]\n3\n")


@pytest.mark.parametrize("start, error", [
    ("multirepl --tiles 0-99", "multirepl: --tiles: bad tile specification '0-99': no tile 99 on this "
                               "machine (it has tiles 0-15)\n"),
    ("multirepl --data /no/such/host/file", "multirepl: /no/such/host/file: No such file or directory\n"),
    ("python --bogus", "python: option --bogus not recognized\nusage: python [-c CODE]\n"),
    # not last on its line: refused, and its lines ran as shell commands (an `rm -r` did)
    ("python; echo hi", "python: must be the last command on its line (the lines that follow are its input)\n"),
    ("multirepl --tiles 0; echo hi",
     "multirepl: must be the last command on its line (the lines that follow are its input)\n"),
])
@pytest.mark.parametrize("how", ["-c", "pipe"])
def test_a_repl_that_fails_to_start_in_a_script_ends_it_there(shared_machine, start, error, how):
    """The lines after it are Python for the repl: they used to run as shell commands
    (a line of Python could be `rm -r ...`), and the script ended with status 0."""
    lines = f"{start}\nprint('hello')\necho THIS-RAN-AS-SHELL\n"
    done = shell(shared_machine, lines) if how == "-c" else shell(shared_machine, stdin=lines)
    name = start.split()[0].rstrip(";")
    assert (done.returncode, done.stdout) == (1 if "--data" in start else 2, "")
    assert done.stderr == error + (f"{name}: did not start, so the script stops here (the lines after "
                                   "it are its input, not shell commands)\n")
    # the last line of a script: nothing more to say
    done = shell(shared_machine, stdin=f"echo first\n{start}\n")
    assert (done.returncode, done.stdout, done.stderr) == (1 if "--data" in start else 2, "first\n", error)
    # other failed commands do not stop a script, nor does python -c with a bad option
    done = shell(shared_machine, "python -c 1 --bogus\necho ran")
    assert (done.returncode, done.stdout) == (0, "ran\n")


def test_python_starts_in_the_shells_current_directory(shared_machine):
    """As a program the shell starts would: where python's os.chdir went is its own, and
    the shell stays; the next python starts where the shell is again (names are kept)."""
    done = shell(shared_machine, "mkdir -p /chip/pywd/sub; cd /chip/pywd; python -c 'import os; print(os.getcwd())'; "
                 "cd sub; python -c 'print(os.getcwd()); os.chdir(\"/\"); print(os.getcwd())'; pwd; "
                 "python -c 'print(os.getcwd(), open(\"here\", \"w\").write(\"x\"))'; ls /chip/pywd/sub")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "/chip/pywd\n/chip/pywd/sub\n/\n/chip/pywd/sub\n/chip/pywd/sub 1\nhere\n"
    # typed blocks: the first starts where the shell is, the next where the last left off
    done = shell(shared_machine, stdin="cd /chip/pywd\npython\nimport os\nos.getcwd()\nos.chdir('sub')\n"
                 "os.getcwd()\n")
    assert (done.returncode, done.stdout) == (0, "'/chip/pywd'\n'/chip/pywd/sub'\n"), done.stderr
    # a first block that never ran (a syntax error) leaves the next to start there
    done = shell(shared_machine, stdin="cd /chip/pywd\npython\nx = = 1\nimport os\nos.getcwd()\n")
    assert done.stdout == "'/chip/pywd'\n", done.stderr
    # a shell directory gone since: python starts in it, removed, as a process would (not
    # where its last block left off, or in /)
    done = shell(shared_machine, "cd /chip/pywd/sub; rm -r /chip/pywd; python -c 'import os; os.chdir(\"/chip\")'; "
                 "python -c 'print(1); open(\"here\", \"w\")'", user_code=True)
    assert (done.returncode, done.stdout) == (1, "1\n") and done.stderr.startswith("Traceback"), done.stderr
    assert "FileNotFoundError: [Errno 2] No such file or directory: 'here'" in done.stderr, done.stderr
    assert "here" not in shell(shared_machine, "ls /chip").stdout.split()


def test_python_mode_from_a_pipe(shared_machine):
    done = shell(shared_machine, stdin="python\nfor i in range(3):\n    print(i * i)\n\ntotal = 5\n"
                 "total + 1\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("0\n1\n4\n6\n")


def test_ps_names_jobs_and_kill_stops_them(shared_machine):
    with open(os.devnull, "w") as sink:
        runner = subprocess.Popen([IPUOS, "run", "-", "--tiles", "10-12"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=sink, text=True, env=shared_machine.env())
    runner.stdin.write("while True:\n    sync()\n")
    runner.stdin.close()
    try:
        def listed():
            out = shell(shared_machine, "ps").stdout
            return out if "10-12" in out else None

        listing = wait_for(listed, timeout=30, what="the job in ps")
        line = next(line for line in listing.splitlines() if "10-12" in line)
        job = line.split()[0]
        assert shell(shared_machine, f"kill {job}").returncode == 0
        assert runner.wait(30) == 130
        assert "killed with `kill" in runner.stdout.read()
    finally:
        if runner.poll() is None:
            runner.kill()


def test_df_free_and_mounts(shared_machine):
    done = shell(shared_machine, "df; free; free --tiles 0-1; mount")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["Filesystem", "Size", "Used", "Avail", "Use%", "Mounted", "on"]
    assert [line.split()[-1] for line in lines[1:4]] == ["/", "/chip", "/tiles"]
    assert lines[3].split()[:4] == ["16", "tile", "disks", "256K"]
    assert "SRAM of 16 tiles: 1.0M total" in done.stdout
    assert any(line.split()[:3] == ["disk", "16", "256K"] for line in lines)
    assert any(line.split()[:3] == ["1", "44K", "20K"] for line in lines)  # tile 1, tile by tile
    assert "chip disk on /chip type littlefs (rw)" in done.stdout
    done = shell(shared_machine, "mkdir /ram; mount --ram 8K /ram; echo in-sram > /ram/f; cat /ram/f; "
                 "df; umount /ram; ls /ram/f; rmdir /ram")
    assert done.stdout.startswith("mounted a 8.0K RAM disk (tile 0's SRAM) on /ram\nin-sram\n")
    assert any(line.split()[-1] == "/ram" for line in done.stdout.splitlines())
    assert done.stderr == "ls: /ram/f: No such file or directory\n"  # the directory is back
    assert done.returncode == 0


def test_df_counts_what_a_restore_put_on_disks_not_used_since(machine, tmp_path):
    # a restore leaves each disk to be mounted at its next use: df counted those as empty
    program = tmp_path / "fill.py"
    program.write_text("open('/f', 'w').write('x' * 3000)\n")
    assert run_cli("run", "--tiles", "0-15", str(program), env=machine.env()).returncode == 0

    def tile_disks() -> str:
        done = shell(machine, "df")
        assert done.returncode == 0, done.stderr
        return next(line for line in done.stdout.splitlines() if line.endswith("/tiles"))

    filled = tile_disks()
    image = tmp_path / "m.img"
    for command in ("backup", "restore"):
        assert run_cli(command, str(image), env=machine.env()).returncode == 0
    assert tile_disks() == filled
    assert filled.split()[4] != "0%", filled


def test_a_second_ram_disk_on_the_same_directory_is_refused(shared_machine):
    done = shell(shared_machine, "mkdir /twice; mount --ram 8K /twice; mount --ram 8K /twice")
    assert (done.returncode, done.stderr) == (1, "mount: /twice: already a mount point (a RAM disk; umount it first)\n")
    assert shell(shared_machine, "umount /twice; rmdir /twice").returncode == 0


def test_a_ram_disk_is_not_unmounted_under_a_shell_standing_in_it(shared_machine):
    done = shell(shared_machine, "mkdir -p /busy; mount --ram 8K /busy; echo kept > /busy/f; "
                 "cd /busy; umount /busy; cat f; cd /; umount /busy; ls /busy")
    assert done.stderr == ("umount: /busy: target is busy (a shell's working directory is in it; "
                           "cd out first)\n")
    assert done.stdout.endswith("kept\n") and done.returncode == 0
    other = subprocess.Popen([IPUOS, "shell"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=shared_machine.env())
    try:  # another terminal's cwd holds the mount as well
        assert shell(shared_machine, "mount --ram 8K /busy").returncode == 0
        other.stdin.write("cd /busy\necho ready\n")
        other.stdin.flush()
        assert other.stdout.readline() == "ready\n"
        done = shell(shared_machine, "umount /busy")
        assert "target is busy" in done.stderr and done.returncode == 1
    finally:
        other.communicate("cd /\n", timeout=60)
    assert shell(shared_machine, "umount /busy; rmdir /busy").returncode == 0  # (tile 0's disk is small)


def test_cd_dotdot_climbs_out_of_a_directory_removed_under_the_shell(shared_machine):
    # cd .. is the current path less its last name, as in sh and bash: it used to ask for
    # /chip/cd1/gone/.., which the VFS reads as the kernel does, ENOENT once gone is gone.
    # A name the target gives must still be there, and so must where .. leads.
    done = shell(shared_machine, "mkdir -p /chip/cd1/gone/deep; cd /chip/cd1/gone; "
                 "rmdir /chip/cd1/gone/deep /chip/cd1/gone; cd ..; pwd; "
                 "cd /chip/cd1/gone/deep/../..; pwd; cd gone/..; cd ../nope/..; "
                 "mkdir /chip/cd1/also; cd /chip/cd1/also; rmdir /chip/cd1/also /chip/cd1; "
                 "cd ..; pwd; cd ../..; pwd")
    assert done.stdout == "/chip/cd1\n/chip/cd1\n/chip/cd1/also\n/chip\n", done.stderr
    assert done.stderr == ("cd: /chip/cd1/gone/deep/../..: No such file or directory\n"
                           "cd: gone/..: No such file or directory\n"
                           "cd: ../nope/..: No such file or directory\n"
                           "cd: ..: No such file or directory\n")
    assert done.returncode == 0


def test_a_ram_disk_is_not_unmounted_under_a_program_standing_in_it(shared_machine):
    # only shells' working directories counted: the program's relative writes went on
    # to tile 0's own disk, under the directory the RAM disk had covered
    assert shell(shared_machine, "mkdir /held; mount --ram 4K /held").returncode == 0
    program = ("import os\nos.chdir('/held')\nopen('/held-in', 'w').close()\n"
               "while not os.path.exists('/held-go'):\n    sync()\nopen('relative', 'w').close()\n")
    with open(os.devnull, "w") as sink:
        runner = subprocess.Popen([IPUOS, "run", "-", "--tiles", "0"], stdin=subprocess.PIPE,
                                  stdout=sink, stderr=sink, text=True, env=shared_machine.env())
    runner.stdin.write(program)
    runner.stdin.close()
    try:
        wait_for(lambda: shell(shared_machine, "ls /held-in").returncode == 0, timeout=30,
                 what="the program to stand in /held")
        done = shell(shared_machine, "umount /held; touch /held-go")
        assert done.stderr == ("umount: /held: target is busy (a running program's working directory "
                               "is in it; let it end, or kill its job)\n")
        assert runner.wait(30) == 0
    finally:
        if runner.poll() is None:
            runner.kill()
    done = shell(shared_machine, "ls /held; umount /held; ls /held; rm -r /held /held-in /held-go")
    assert (done.returncode, done.stdout, done.stderr) == (0, "relative\n", "")


def test_a_ram_disk_is_not_unmounted_under_a_repl_standing_in_it(shared_machine):
    done = shell(shared_machine, "mkdir /held2; mount --ram 4K /held2; "
                 "python -c \"import os; os.chdir('/held2')\"; umount /held2; "
                 "python -c \"os.chdir('/')\"; umount /held2; mount --ram 4K /held2; "
                 "python -c \"os.chdir('/held2')\"")
    assert done.stderr == ("umount: /held2: target is busy (a repl's working directory is in it; "
                           "os.chdir out of it there, or leave the repl)\n")
    # the shell's repl ended with its session: its directory holds nothing any more
    assert shell(shared_machine, "umount /held2; rmdir /held2").returncode == 0


def test_tiles_0_shows_tile_0s_own_disk_after_mount_and_umount(shared_machine):
    # /tiles/0 had kept the mount points it saw when /tiles/0 was last listed
    done = shell(shared_machine, "mkdir /under; echo disk > /under/d; ls /tiles/0 > /chip/under.ls; "
                 "mount --ram 4K /under; echo ram > /under/r; cat /tiles/0/under/r; "
                 "echo via-tiles > /tiles/0/under/w; ls /under")
    assert done.stdout.endswith("RAM disk (tile 0's SRAM) on /under\nr\n"), done.stdout
    assert done.stderr == ("cat: /tiles/0/under/r: No such file or directory\n"
                           "sh: /tiles/0/under/w: No such file or directory\n")
    done = shell(shared_machine, "ls /tiles/0 > /chip/under.ls; umount /under; cat /tiles/0/under/d; "
                 "rm -r /under /chip/under.ls")
    assert (done.returncode, done.stdout, done.stderr) == (0, "disk\n", "")


def test_help_lists_every_command(shared_machine):
    done = shell(shared_machine, "help; help cp; help nope")
    assert done.returncode == 1
    for name in ("ls", "cp", "multirepl", "put", "get", "history"):
        assert f"  {name} " in done.stdout
    assert "usage: cp [-r] SRC... DEST" in done.stdout
    assert done.stderr == "help: nope: no such command (help lists them)\n"


def test_exit_sets_the_status(shared_machine):
    assert shell(shared_machine, "echo a; exit 4; echo never").returncode == 4
    assert shell(shared_machine, "exit -1").returncode == 255
    for bad in ("--5", "\u00b2", "x"):
        done = shell(shared_machine, f"exit {bad}")
        assert (done.returncode, done.stderr) == (2, "exit: usage: exit [STATUS]\n")
    done = shell(shared_machine, stdin="echo a\nexit\necho never\n")
    assert (done.returncode, done.stdout) == (0, "a\n")


def test_shell_starts_the_default_machine_when_none_runs(runtime_dir, tmp_path):
    from daemon_harness import Booted, unique_name
    from ipuos._rundir import lock_holder, machine_paths

    name = unique_name("sh")
    env = dict(os.environ, IPUOS_MACHINE=name)
    done = subprocess.run([IPUOS, "shell", "--preset", "tiny", "-c", "ls /tiles/15"],
                          capture_output=True, text=True, env=env, timeout=120)
    paths = machine_paths(name)
    try:
        assert done.returncode == 0, done.stderr
        assert f"started machine {name!r}" in done.stderr
    finally:
        Booted(name, paths, lock_holder(paths.lock) or 0).halt()


def test_tiles_list_in_numeric_order(shared_machine):
    done = shell(shared_machine, "ls /tiles")
    assert done.stdout == "".join(f"{tile}/\n" for tile in range(16))


# -- as coreutils and bash have it -------------------------------------------------------------


@pytest.mark.parametrize("setup, line, stdout, stderr, status", [
    # a trailing slash says "a directory": never the file of that name
    ("echo keep > /chip/ts1", "cat /chip/ts1/; rm /chip/ts1/; mv /chip/ts1/ /tiles/2/ts1; cat /chip/ts1", "keep\n",
     "cat: /chip/ts1/: Not a directory\nrm: /chip/ts1/: Not a directory\nmv: /chip/ts1/: Not a directory\n", 0),
    ("", "echo hi > /chip/ts2/; touch /chip/ts3/; ls /chip/ts2 /chip/ts3", "",
     "sh: /chip/ts2/: Is a directory\ntouch: /chip/ts3/: No such file or directory\n"
     "ls: /chip/ts2: No such file or directory\nls: /chip/ts3: No such file or directory\n", 1),
    # a directory source with DEST/ that does not exist makes DEST
    ("mkdir -p /chip/ts4/in", "cp -r /chip/ts4 /chip/ts4c/; mv /chip/ts4 /chip/ts4m/; ls /chip/ts4c /chip/ts4m",
     "/chip/ts4c:\nin/\n\n/chip/ts4m:\nin/\n", "", 0),
    # globs: a pattern ending in / is directories only; [^..] is a negation
    ("mkdir -p /chip/gl/d1 /chip/gl/d2; echo keep > /chip/gl/f", "echo /chip/gl/*/; rm -r /chip/gl/*/; ls /chip/gl",
     "/chip/gl/d1/ /chip/gl/d2/\nf\n", "", 0),
    ("mkdir /chip/ng; touch /chip/ng/a /chip/ng/b /chip/ng/c", "cd /chip/ng; echo [^a]*; echo [!a]*", "b c\nb c\n", "", 0),
    # a redirect target that is a pattern: its one match, or itself; more is ambiguous
    ("echo old > /chip/rd.txt", "echo new > /chip/rd*; cat /chip/rd.txt", "new\n", "", 0),
    ("touch /chip/am1 /chip/am2", "echo x > /chip/am*", "", "sh: /chip/am*: ambiguous redirect\n", 1),
    # mv between filesystems refuses what rename refuses, and keeps the time
    ("mkdir -p /chip/mvs /tiles/3/mvd/mvs; echo new > /chip/mvs/x; echo old > /tiles/3/mvd/mvs/x",
     "mv /chip/mvs /tiles/3/mvd; cat /tiles/3/mvd/mvs/x; ls /chip/mvs", "old\nx\n",
     "mv: /tiles/3/mvd/mvs: Directory not empty\n", 0),
    ("", "cat /chip/cio; echo abc > /chip/cio; cat /chip/cio >> /chip/cio; cat /chip/cio", "abc\n",
     "cat: /chip/cio: No such file or directory\ncat: /chip/cio: input file is output file\n", 0),
    # /tiles/0 holds tile 0's own disk: copying it elsewhere is not "into itself" ...
    ("mkdir /t0src; echo a > /t0src/f", "cp -r /tiles/0/t0src /tiles/3/t0copy; cat /tiles/3/t0copy/f", "a\n", "", 0),
    # ... but copying a directory into itself is, by either spelling
    ("mkdir /t0in", "cp -r /tiles/0/t0in /t0in/x", "",
     "cp: /tiles/0/t0in: cannot copy or move a directory into itself (/t0in/x)\n", 1),
    # rm -r refuses a tree with a filesystem mounted inside it before removing anything
    ("mkdir -p /mmx/r; mount --ram 16K /mmx/r; echo data > /mmx/r/f; echo top > /mmx/t",
     "rm -r /mmx; cat /mmx/r/f /mmx/t; umount /mmx/r", "data\ntop\n",
     "rm: /mmx: a filesystem is mounted at /mmx/r inside it (umount it first)\n", 0),
    # the chip disk cannot be unmounted: what to do instead (it said "umount it first");
    # a RAM disk can
    ("echo kept > /chip/rmc", "rm -r /chip; cd /; rm -rf chip/; mv /chip /chipmoved; cat /chip/rmc", "kept\n",
     "rm: /chip: the machine's own mount point, which stays (remove what is inside it instead: rm -r /chip/*)\n"
     "rm: chip/: the machine's own mount point, which stays (remove what is inside it instead: rm -r chip/*)\n"
     "mv: /chip: the machine's own mount point, which stays (move what is inside it instead)\n", 0),
    ("mkdir /rmr; mount --ram 16K /rmr", "rm -r /rmr; umount /rmr; rmdir /rmr", "",
     "rm: /rmr: is a mount point (umount it first)\n", 0),
    # du lists in the order ls does: n2 before n10
    ("mkdir -p /chip/dun/n10 /chip/dun/n2 /chip/dun/n1", "du /chip/dun",
     "0\t/chip/dun/n1\n0\t/chip/dun/n2\n0\t/chip/dun/n10\n0\t/chip/dun\n", "", 0),
    # mv takes -f (it never asks) and -- before a name that starts with a dash
    ("touch /chip/mvf1 /chip/-mvf", "mv -f /chip/mvf1 /chip/mvf2; mv -- /chip/-mvf /chip/mvf3; ls /chip/mvf2 /chip/mvf3",
     "/chip/mvf2\n/chip/mvf3\n", "", 0),
    # a final . or .. names a directory that must be there: mkdir makes none, rmdir of
    # missing/.. is no rmdir of the parent; mkdir -p makes what comes before it
    ("mkdir /chip/dt1", "mkdir /chip/dt0/. /chip/dt1/.; mkdir -p /chip/dt2/.. /chip/dt3/.; rmdir /chip/dt1/no/..; "
     "ls /chip/dt0 /chip/dt1 /chip/dt2 /chip/dt3", "/chip/dt1:\n\n/chip/dt2:\n\n/chip/dt3:\n",
     "mkdir: /chip/dt0/.: No such file or directory\nmkdir: /chip/dt1/.: File exists\n"
     "rmdir: /chip/dt1/no/..: No such file or directory\nls: /chip/dt0: No such file or directory\n", 1),
    # in double quotes \ escapes $ ` " and \ (and is itself before anything else)
    ("", r'echo "\$" "a\`b" "\$HOME" "a\"b" "a\\b" "a\b"', '$ a`b $HOME a"b a\\b a\\b\n', "", 0),
    # only \n ends a line; head -n -N is all but the last N, tail -n -N the last N
    ("echo a > /chip/hl; echo b >> /chip/hl; echo c >> /chip/hl", "head -n -2 /chip/hl; tail -n -1 /chip/hl; head -n -0 /chip/hl",
     "a\nc\na\nb\nc\n", "", 0),
    # ls sorts its operands (files, then directories), as it sorts what it lists
    ("mkdir -p /chip/lso/z1 /chip/lso/y1; touch /chip/lso/b1 /chip/lso/a2 /chip/lso/a1", "cd /chip/lso; ls b1 a2 z1 a1 y1",
     "a1\na2\nb1\n\ny1:\n\nz1:\n", "", 0),
    # rm -f says nothing of a name that cannot be there (a file's "subdirectory")
    ("touch /chip/rmf", "rm -f /chip/rmf/ /chip/rmf/x; ls /chip/rmf", "/chip/rmf\n", "", 0),
    # echo takes -n again and again, and -nn
    ("", "echo -n -n x; echo -nn y; echo; echo -n- z", "xy\n-n- z\n", "", 0),
    # tree hides names starting with . unless -a, as ls does (and tree)
    ("mkdir -p /chip/th/d; touch /chip/th/.h /chip/th/d/.x /chip/th/v", "tree /chip/th; tree -a /chip/th",
     "/chip/th\n├── d/\n└── v\n\n1 directory, 1 file\n"
     "/chip/th\n├── .h\n├── d/\n│   └── .x\n└── v\n\n1 directory, 3 files\n", "", 0),
    # cd - says where it went back to; before any cd there is nowhere; cd "" goes nowhere
    ("", "cd -", "", "cd: OLDPWD not set\n", 1),
    ("", "cd /chip; cd /; cd -; cd ''; pwd", "/chip\n/chip\n", "", 0),
])
def test_commands_do_what_coreutils_and_bash_do(shared_machine, setup, line, stdout, stderr, status):
    if setup:
        assert shell(shared_machine, setup).returncode == 0
    done = shell(shared_machine, line)
    assert (done.stdout, done.stderr, done.returncode) == (stdout, stderr, status)


def test_file_contents_pass_through_cat_head_tail_and_put_byte_for_byte(shared_machine, tmp_path):
    data = b"ab\xff\xfe\x80cd\nprogress 10%\rprogress 100%\nlast\n\x00z"
    (tmp_path / "bin.dat").write_bytes(data)
    done = shell(shared_machine, "put bin.dat /chip/bin; cat /chip/bin > /chip/bin2; head -n 9 /chip/bin > /chip/bin3; "
                 "tail -n 9 /chip/bin > /chip/bin4; tail -n 2 /chip/bin > /chip/bin5; "
                 "get /chip/bin2 b2; get /chip/bin3 b3; get /chip/bin4 b4; get /chip/bin5 b5; "
                 "put bin.dat /chip/bin/; put bin.dat /chip/nodir/; put bin.dat /chip/no/dir/", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr == ("put: /chip/bin/: Not a directory\nput: /chip/nodir/: Not a directory\n"
                           "put: /chip/no/dir/: No such file or directory\n")
    for name in ("b2", "b3", "b4"):
        assert (tmp_path / name).read_bytes() == data, name
    assert (tmp_path / "b5").read_bytes() == b"last\n\x00z"  # (the \r is inside a line)
    done = shell(shared_machine, f"get /chip/bin {tmp_path}/nothere/")
    assert (done.returncode, done.stderr) == (1, f"get: {tmp_path}/nothere/: Not a directory\n")
    assert not (tmp_path / "nothere").exists()


def test_a_move_between_filesystems_keeps_modification_times(shared_machine):
    done = shell(shared_machine, "mkdir -p /chip/mt/d; echo x > /chip/mt/d/f; stat /chip/mt/d/f; "
                 "mv /chip/mt /tiles/2/mt; stat /tiles/2/mt/d/f")
    assert done.returncode == 0, done.stderr
    times = [line for line in done.stdout.splitlines() if "modified" in line.lower()]
    assert len(times) == 2 and times[0].split(":", 1)[1] == times[1].split(":", 1)[1], done.stdout


def test_times_are_shown_in_the_zone_of_the_users_tz_not_the_daemons(runtime_dir, monkeypatch, tmp_path):
    """The shell runs inside the daemon and showed times in the daemon's zone, while
    ``image ls`` and the mount show them in the user's: 9 hours apart under TZ=Asia/Tokyo
    once the daemon had been started from another environment."""
    import datetime
    import zoneinfo

    from daemon_harness import boot_machine

    monkeypatch.setenv("TZ", "America/New_York")  # (the daemon's, inherited at boot)
    booted = boot_machine()
    try:
        program = tmp_path / "stamp.py"
        program.write_text("import os\nopen('/tz.txt', 'w').write('x')\nos.utime('/tz.txt', (1690000000, 1690000000))\n")
        assert run_cli("run", str(program), "--tiles", "0", env=booted.env()).returncode == 0
        with open("/etc/localtime", "rb") as f:
            host_zone = zoneinfo.ZoneInfo.from_file(f)
        host = datetime.datetime.fromtimestamp(1690000000, host_zone).strftime("%Y-%m-%d %H:%M")
        for tz, shown in (("UTC", "2023-07-22 04:26"), ("Asia/Tokyo", "2023-07-22 13:26"),
                          (":Asia/Tokyo", "2023-07-22 13:26"), ("JST-9", "2023-07-22 13:26"),
                          ("CET-1CEST,M3.5.0,M10.5.0/3", "2023-07-22 06:26"),  # (a POSIX rule: summer time too)
                          (None, host)):
            env = booted.env()
            env.pop("TZ")
            if tz is not None:
                env["TZ"] = tz
            done = shell(booted, "ls -l /tz.txt; stat /tz.txt", env=env)
            assert done.returncode == 0, done.stderr
            assert f" {shown} /tz.txt\n" in done.stdout and f"Modified: {shown}:40\n" in done.stdout, (tz, done.stdout)
    finally:
        booted.halt()


def test_times_are_shown_in_whole_seconds_toward_the_past_as_ls_and_stat_show_them(shared_machine):
    """``ns / 1e9`` rounded a time a nanosecond before a minute up into that minute, and
    one a nanosecond before the epoch up to 1970."""
    stamp = ("import os\n"
             "for name, ns in (('late', 1690000019_999999999), ('before', -1)):\n"
             "    open('/' + name, 'w').close()\n"
             "    os.utime('/' + name, ns=(ns, ns))\n")
    assert shell(shared_machine, f"python -c {shlex.quote(stamp)}").returncode == 0
    env = dict(shared_machine.env(), TZ="UTC")
    done = shell(shared_machine, "ls -l /late /before; stat /late /before", env=env)
    assert done.returncode == 0, done.stderr
    assert " 2023-07-22 04:26 /late\n" in done.stdout and "Modified: 2023-07-22 04:26:59\n" in done.stdout
    assert " 1969-12-31 23:59 /before\n" in done.stdout and "Modified: 1969-12-31 23:59:59\n" in done.stdout


@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_python_names_are_let_go_of_when_the_input_ends_and_what_that_prints_is_shown(machine, how):
    """As Python's at exit: the __del__ of an object a python session kept printed into a
    session nobody read any more."""
    lines = ("python\nclass A:\n    def __del__(self):\n        print('deleted')\n\na = A()\n"
             "print('made')\nexit()\necho after\nexit 3")
    done = shell(machine, lines) if how == "-c" else shell(machine, stdin=lines + "\n")
    assert (done.returncode, done.stdout, done.stderr) == (3, "made\nafter\ndeleted\n", "")


def test_a_python_blocks_output_cut_short_into_a_file_is_said_on_the_error_stream_not_in_the_file(shared_machine):
    """(the note went into the file, as if the program had printed it)"""
    done = shell(shared_machine, "python -c \"for i in range(20000): print(i)\" > /chip/cut.txt; cat /chip/cut.txt")
    assert done.returncode == 0, done.stderr
    kept = "".join(f"{i}\n" for i in range(20000))[:65536]
    assert done.stdout == kept
    assert done.stderr == ("[output truncated (a block's output is kept up to 64 KiB): "
                           f"{len(''.join(f'{i}' + chr(10) for i in range(20000))) - 65536} more characters]\n")
