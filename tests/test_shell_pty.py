"""The interactive shell through a real pseudo-terminal (pexpect): what a user at a
terminal sees and types, against a real daemon.

prompt_toolkit draws the screen with escape sequences (a trailing space of the prompt is
a cursor move, for one), and redraws the prompt with the accepted line when Enter is
pressed. So a *new* prompt is recognised by what only a new prompt starts with: the
switch into bracketed-paste mode (ESC[?2004h), then the prompt text; what commands
print is compared with escape sequences stripped.
"""

from __future__ import annotations

import contextlib
import re
import signal
import stat
import subprocess
import time

import pexpect
import pytest
from daemon_harness import IPUOS, machine, run_cli, runtime_dir, shared_machine, wait_for  # noqa: F401

_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]|\r")
_NEW_PROMPT = "\x1b\\[\\?2004h[^\n]*?"


def new_prompt(text: str) -> str:
    """A regex for a freshly drawn prompt ``text``."""
    return _NEW_PROMPT + re.escape(text)


def plain(text: str) -> str:
    return _ESCAPES.sub("", text)


def drawn(text: str) -> str:
    """A regex for ``text`` as a terminal draws it: escape sequences may come between
    any two of its characters."""
    return "(?:\x1b\\[[0-9;?]*[A-Za-z])*".join(map(re.escape, text))


class Terminal:
    """``ipuos shell`` (or ``ipuos repl``) on a pty, with a private home for its history."""

    def __init__(self, booted, home, *args: str, command: str = "shell", columns: int = 120):
        env = booted.env(HOME=str(home), TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1")
        env.pop("XDG_DATA_HOME", None)
        self.child = pexpect.spawn(IPUOS, [command, *args], env=env, encoding="utf-8", timeout=30,
                                   dimensions=(40, columns))

    def prompt(self, cwd: str = "/") -> str:
        """Wait for the shell's prompt; returns what was printed before it, plain."""
        self.child.expect(new_prompt(f"ipuos:{cwd}$"))
        return plain(self.child.before)

    def run(self, line: str, cwd: str = "/") -> str:
        """Type a line, wait for the next prompt; returns the output (the echo removed)."""
        self.child.sendline(line)
        out = self.prompt(cwd)
        return out.split("\n", 1)[1] if "\n" in out else ""  # the first line: the redrawn input

    def expect(self, text: str) -> str:
        """Wait until ``text`` has been drawn; returns what came before, plain. The screen
        may be drawn in pieces (typed characters first, then what Tab completed, when
        they arrive apart on a busy machine), with escape sequences between them."""
        self.child.expect(drawn(text))
        return plain(self.child.before)

    def expect_prompt(self, text: str) -> str:
        """Wait for a new prompt ``text`` (``>>>``, ``...``); returns what came before."""
        self.child.expect(new_prompt(text))
        return plain(self.child.before)

    def finish(self) -> int:
        self.child.expect(pexpect.EOF)
        self.child.close()
        return self.child.exitstatus

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


@pytest.fixture
def terminal(shared_machine, tmp_path):
    opened = []

    def open_terminal(*args, command="shell", columns=120):
        term = Terminal(shared_machine, tmp_path, *args, command=command, columns=columns)
        opened.append(term)
        return term

    yield open_terminal
    for term in opened:
        term.close()


def test_prompt_commands_errors_and_ctrl_d(terminal):
    term = terminal()
    term.prompt()
    assert term.run("mkdir /pty1; echo hello > /pty1/f; cat /pty1/f") == "hello\n"
    assert term.run("ls /pty1/nope") == "ls: /pty1/nope: No such file or directory\n"
    assert term.run("cd /pty1", cwd="/pty1") == ""
    assert term.run("pwd", cwd="/pty1") == "/pty1\n"
    assert term.run("frobnicate", cwd="/pty1") == "frobnicate: command not found (help lists the commands)\n"
    term.child.sendeof()
    assert term.finish() == 127  # the status of the last command


def test_output_without_a_final_newline_keeps_its_line_from_the_prompt(terminal):
    # the line editor draws from the first column: after "abc" with no newline, the
    # prompt and what was typed went over it, and it vanished once the line was taken
    term = terminal()
    term.prompt()
    term.child.sendline("echo -n abc")
    term.child.expect_exact("\x1b[?2004labc")  # (the output: once the editor let go of the line)
    after = term.prompt()
    assert after.startswith("\n"), repr(after)  # (the line ended before the prompt)
    assert term.run("echo -n; echo next") == "next\n"  # (nothing printed: no empty line)


def test_pasted_lines_run_in_turn_and_those_after_python_are_its_input(terminal):
    # (a paste is one entry: it was refused whole, "python: must be the last command on
    # its line", though python was the last of its line)
    term = terminal()
    term.prompt()
    term.child.send("\x1b[200~echo first\npython\nx = 40\nprint(x + 2)\x1b[201~\r")
    out = term.expect_prompt(">>>")
    assert "first\n" in out and "42\n" in out, repr(out)
    term.child.sendeof()  # (leaves python)
    term.prompt()
    assert term.run("echo back") == "back\n"


def test_a_usage_error_is_two_lines_on_a_terminal(terminal):
    """The usage line is a line of its own, as with -c or a pipe (on a terminal, control
    characters of a message show as ?, and the line break between the two did too)."""
    term = terminal()
    term.prompt()
    assert term.run("ls -x") == "ls: option -x not recognized\nusage: ls [-l] [-a] [PATH...]\n"
    assert term.run("multirepl --ti") == ("multirepl: option --ti not recognized (did you mean --tiles?)\n"
                                          "usage: multirepl [--tiles SPEC] [--data HOSTFILE]\n")


def test_exit_with_a_status(terminal):
    term = terminal()
    term.prompt()
    term.child.sendline("exit 3")
    assert term.finish() == 3


def test_tab_completes_commands_and_paths(terminal):
    term = terminal()
    term.prompt()
    term.run("mkdir -p /complete-me/inner; echo tab-content > /complete-me/inner/only-file")
    term.child.send("mkd\t")  # -> "mkdir "
    term.expect("mkdir")
    term.child.sendline("/made-by-tab")
    term.prompt()
    assert "made-by-tab/" in term.run("ls /")
    term.child.send("cd /complete-m\t")  # -> "cd /complete-me/"
    term.expect("complete-me/")
    term.child.send("in\t")  # -> "cd /complete-me/inner/"
    term.expect("inner/")
    term.child.sendline("")
    term.prompt("/complete-me/inner")
    term.child.send("cat only\t")  # a file completes (with a space after it)
    term.expect("only-file")
    term.child.sendline("")
    assert term.prompt("/complete-me/inner").split("\n", 1)[1] == "tab-content\n"


def test_keys_typed_right_after_tab_are_taken_after_the_completion(terminal):
    """Tab completed in the background, after every key already typed: an Enter in the
    same burst ran ``cat /typed-ahead/n`` while the screen showed the completed line,
    and letters went onto the uncompleted word (``ls /typed-ahwdir``)."""
    term = terminal()
    term.prompt()
    term.run("mkdir -p /typed-ahead/wdir; echo ahead > /typed-ahead/nums.txt; echo in > /typed-ahead/wdir/inside")
    term.child.send("cat /typed-ahead/n\t\r")  # one write: the keys arrive together
    assert term.prompt().split("\n", 1)[1] == "ahead\n"
    term.child.send("ls /typed-ah\twdir\r")
    assert term.prompt().split("\n", 1)[1] == "inside\n"
    history = term.run("history")
    assert "cat /typed-ahead/nums.txt \n" in history and "ls /typed-ahead/wdir\n" in history, history
    # several completions: the part they share at once, then a menu Tab moves through
    term.run("mkdir /typed-ahead/wdir/sub1 /typed-ahead/wdir/sub2")
    term.child.send("cd /typed-ahead/wdir/s\t\t\r")
    term.prompt("/typed-ahead/wdir/sub1")


@pytest.mark.parametrize("key", ["tab", "enter"])
def test_a_history_search_ends_with_the_line_found_as_in_readline(terminal, key):
    """As readline's: Tab ends the search, leaving the line found to edit, then Enter runs
    it; Enter runs it at once. (Tab did nothing there, so the Enter only ended the search;
    in python mode it indented the search text. Enter alone only ended the search.)"""
    term = terminal()
    term.prompt()
    term.run("echo searched-for")
    term.run("echo something-else")
    term.child.send("\x12searched")  # Ctrl-R
    term.expect("reverse-i-search")
    if key == "tab":
        term.child.send("\t")
        term.expect("ipuos:/$ echo searched-for")
    term.child.send("\r")
    assert term.prompt().split("\n", 1)[1] == "searched-for\n"


def test_a_history_file_that_stops_taking_lines_is_said_once_and_the_shell_goes_on(tmp_path):
    """(prompt_toolkit let the OSError out of every line: a traceback, and the line ran
    only after one more Enter)"""
    from ipuos.shell._terminal import KeptHistory

    folder = tmp_path / "ipuos"
    folder.mkdir()
    said = []
    history = KeptHistory(str(folder / "history"), said.append)
    history.append_string("echo kept")
    (folder / "history").unlink()
    folder.rmdir()  # (a full disk fails the same way, with ENOSPC)
    history.append_string("echo one")
    history.append_string("echo two")
    assert said == [f"ipuos: history is not kept from here on: {folder / 'history'}: No such file or directory\n"]
    assert list(history.get_strings()) == ["echo kept", "echo one", "echo two"]  # (this session's, still)


def private_history(home, name: str = "history") -> str:
    """The text of a history file in ``home``, which only its user may read."""
    path = home / ".local" / "share" / "ipuos" / name
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    return path.read_text()


def test_history_persists_across_sessions(terminal, tmp_path):
    term = terminal()
    term.prompt()
    term.run("echo remembered-line")
    term.child.sendeof()
    term.finish()
    assert "remembered-line" in private_history(tmp_path)

    term = terminal()
    term.prompt()
    assert "echo remembered-line" in term.run("history")
    term.child.send("\x1b[A\x1b[A")  # up twice: past "history" to the line of the last session
    term.child.sendline("")
    assert "remembered-line" in term.prompt()


def test_a_relative_xdg_data_home_is_ignored(shared_machine, tmp_path):
    """As the XDG spec says; it used to put the history under the current directory."""
    env = shared_machine.env(HOME=str(tmp_path), TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1", XDG_DATA_HOME="relative/dir")
    (tmp_path / "cwd").mkdir()
    child = pexpect.spawn(IPUOS, ["shell"], env=env, cwd=str(tmp_path / "cwd"), encoding="utf-8", timeout=30,
                          dimensions=(40, 120))
    try:
        child.expect(new_prompt("ipuos:/$"))
        child.sendline("echo relative-xdg")
        child.expect(new_prompt("ipuos:/$"))
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert not (tmp_path / "cwd" / "relative").exists()
    assert "echo relative-xdg" in private_history(tmp_path)


def spinning(term: Terminal, booted, name: str, typed: str) -> None:
    """Start ``run /<name> ...`` of an endless loop by typing ``typed`` (which runs it),
    and wait until it runs."""
    term.run(f"echo 'while True: pass' > /{name}")
    term.child.send(typed)
    wait_for(lambda: name in run_cli("ps", env=booted.env()).stdout, timeout=30, what="the program to run")


def test_ctrl_c_stops_run_of_an_infinite_loop(terminal, shared_machine):
    term = terminal()
    term.prompt()
    spinning(term, shared_machine, "spin.py", "run /spin.py --tiles 1-3\r")
    time.sleep(0.3)
    term.child.sendintr()
    out = term.prompt()
    assert "^C\n[3 tiles: 1-3]\ninterrupted (Ctrl-C)\n" in out  # the report on a line of its own
    assert term.run("echo still-working") == "still-working\n"
    assert "spin.py" not in run_cli("ps", env=shared_machine.env()).stdout


def test_ctrl_c_drops_the_lines_typed_ahead_of_the_command_it_stops(terminal, shared_machine):
    """Lines of a paste without bracketed paste are each an entry of their own; those read
    before the command started ran after Ctrl-C had stopped it (the terminal drops only
    what comes later)."""
    term = terminal()
    term.prompt()
    spinning(term, shared_machine, "spin-ahead.py",
             "run /spin-ahead.py --tiles 1\recho SHOULD-NOT-RUN\rmkdir /should-not-exist\r")
    term.child.sendintr()
    assert "interrupted (Ctrl-C)" in term.prompt()
    term.child.send("\recho kept\r")  # (an entry that runs nothing, and one after it: both kept)
    term.prompt()
    assert term.prompt().split("\n", 1)[1] == "kept\n"
    assert term.run("echo after") == "after\n"
    assert term.run("ls /should-not-exist") == "ls: /should-not-exist: No such file or directory\n"
    assert "SHOULD-NOT-RUN" not in term.run("history")


def test_keys_typed_after_ctrl_c_while_the_program_cleans_up_are_kept(terminal, shared_machine, tmp_path):
    """What is typed after the ^C is no typeahead of the command stopped: a terminal keeps
    it, and so does the shell (it was dropped with the rest, by a flush of the terminal)."""
    term = terminal()
    term.prompt()
    program = tmp_path / "slow-cleanup.py"
    program.write_text("try:\n    while True:\n        sync()\nexcept KeyboardInterrupt:\n"
                       "    n = 0\n    for i in range(10_000_000):\n        n += i\n    print('cleanup done')\n")
    term.run(f"put {program} /slow-cleanup.py")
    term.run("echo what-the-file-holds > /typed-after.txt")
    term.child.send("run /slow-cleanup.py --tiles 1\r")
    wait_for(lambda: "slow-cleanup.py" in run_cli("ps", env=shared_machine.env()).stdout, timeout=30,
             what="the program to run")
    time.sleep(1.0)  # (into its try: a Ctrl-C as a program starts stops it there)
    term.child.sendintr()
    time.sleep(0.2)
    term.child.send("cat /typed-after.txt\r")  # (the terminal echoes the line: the file's text is the proof)
    out = term.expect("what-the-file-holds")
    assert "cleanup done" in out, out  # (typed while the program cleaned up: run after it)


def test_a_second_ctrl_c_on_run_starts_the_report_on_a_line_of_its_own(terminal, shared_machine, tmp_path):
    (tmp_path / "swallow.py").write_text("while True:\n    try:\n        while True:\n            sync()\n"
                                         "    except KeyboardInterrupt:\n        print('swallowed')\n")
    term = terminal()
    term.prompt()
    term.run(f"put {tmp_path}/swallow.py /swallow2.py")
    term.child.sendline("run /swallow2.py --tiles 1")
    wait_for(lambda: "swallow2.py" in run_cli("ps", env=shared_machine.env()).stdout, timeout=30,
             what="the program to run")
    term.child.sendintr()
    time.sleep(1.0)
    term.child.sendintr()
    out = term.prompt()
    # (the second ^C and the report were on one line)
    assert "^C\n^C\n[1 tile: 1]\nswallowed\ninterrupted for good" in out, repr(out)


@contextlib.contextmanager
def tile_0_held(booted, tmp_path):
    """A program computes on tile 0 without an exchange point until the block ends: it
    holds tile 0, and with it the machine, so what a terminal asks of tile 0 waits."""
    spin = tmp_path / "spin.py"
    spin.write_text("while True:\n    pass\n")
    job = subprocess.Popen([IPUOS, "run", str(spin), "--tiles", "0"], env=booted.env(),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: "spin.py" in run_cli("ps", env=booted.env()).stdout, timeout=30,
                 what="the spinning program")
        yield
    finally:
        job.send_signal(signal.SIGINT)  # (ipuos run interrupts its job)
        job.wait(30)


def test_ctrl_c_stops_a_put_whose_chunk_is_on_its_way_and_says_so_truly(terminal, shared_machine, tmp_path):
    """The chunk waits for a busy tile 0 when Ctrl-C comes: the put waits for tile 0's
    answer, which is that it stopped before putting the file in place. (The terminal
    used to say "interrupted" at once, and tile 0 then put the file in place.)"""
    (tmp_path / "data.bin").write_bytes(b"x" * 1000)
    term = terminal()
    term.prompt()
    with tile_0_held(shared_machine, tmp_path):
        term.child.sendline(f"put {tmp_path}/data.bin /put-stopped")
        time.sleep(1)  # (the chunk is on its way, and waits for tile 0)
        term.child.sendintr()
        time.sleep(0.5)
    out = term.prompt()
    assert out.split("\n", 1)[1] == "^C\nput: interrupted\n", out  # (^C: the echo)
    listing = term.run("ls -a /")
    assert "put-stopped" not in listing and ".ipuos-put" not in listing, listing


def test_ctrl_c_on_a_command_shows_one_c(terminal, shared_machine, tmp_path):
    """The terminal echoes the ^C: tile 0 does not print another (it still does where
    nothing echoes, as in a pipe). Here the command waits for a busy tile 0."""
    term = terminal()
    term.prompt()
    with tile_0_held(shared_machine, tmp_path):
        term.child.sendline("ls /")
        time.sleep(1)
        term.child.sendintr()
        time.sleep(0.5)
    out = term.prompt()
    assert out.split("\n", 1)[1] == "^C\n", out


def test_ctrl_z_at_the_prompt_suspends_the_shell_and_fg_resumes_it(shared_machine, tmp_path):
    """Under a job-control shell, as a user runs it (a stop signal to a process group
    with no such parent is discarded)."""
    env = shared_machine.env(HOME=str(tmp_path), TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1", PS1="host$ ")
    bash = pexpect.spawn("bash", ["--norc", "--noprofile", "-i"], env=env, encoding="utf-8", timeout=30,
                         dimensions=(40, 120))
    try:
        bash.expect_exact("host$ ")
        bash.sendline(f"{IPUOS} shell")
        bash.expect(new_prompt("ipuos:/$"))
        bash.send("echo resumed")
        bash.sendcontrol("z")
        bash.expect("Stopped")  # bash's job report: the shell is suspended, not given a ^Z
        bash.expect_exact("host$ ")
        bash.sendline("fg")
        bash.sendline("")
        bash.expect("resumed")
        bash.expect(new_prompt("ipuos:/$"))
        bash.sendeof()  # leave the shell
        bash.expect_exact("host$ ")
    finally:
        bash.terminate(force=True)


def test_ctrl_c_at_the_prompt_clears_the_line(terminal):
    term = terminal()
    term.prompt()
    term.child.send("echo never-run")
    term.child.sendintr()
    term.prompt()
    assert term.run("echo after") == "after\n"


def test_a_long_line_the_terminal_wraps_is_drawn_without_the_continuation_prompt(terminal):
    """``> `` says a line goes on after Enter in a quote; the terminal wrapping a long line
    drew it at the start of every wrapped row."""
    term = terminal(columns=40)
    term.prompt()
    words = " ".join(["word"] * 14)  # (79 characters after the prompt: two wraps at 40)
    term.child.send(f"echo {words}")
    screen = ""
    while True:  # (what is drawn until the terminal has been quiet for a second)
        try:
            screen += term.child.read_nonblocking(100_000, timeout=1.0)
        except pexpect.TIMEOUT:
            break
    assert plain(screen).count("w") >= 14 and ">" not in plain(screen), plain(screen)
    assert term.run("").endswith("\n" + words + "\n")


def test_enter_in_an_open_quote_goes_on_to_a_continuation_line_as_in_sh(terminal):
    """The line ran at once, a syntax error, and what was typed next inside the quote
    ran as commands of its own."""
    term = terminal()
    term.prompt()
    assert term.run("mkdir /pty-quote; echo kept > /pty-quote/f") == ""
    term.child.sendline('echo "notes:')
    term.expect("\n>")  # (the "> " line: its space is drawn as a cursor move)
    term.child.sendline("rm -r /pty-quote")
    term.expect("rm -r /pty-quote")
    term.child.sendline('" > /pty-quote/notes \\')
    term.expect("/pty-quote/notes")
    term.expect("\n>")
    term.child.sendline("; echo joined")
    out = term.prompt()
    assert out.endswith("joined\n") and "rror" not in out, out
    assert term.run("cat /pty-quote/notes /pty-quote/f") == "notes:\nrm -r /pty-quote\n\nkept\n"
    # Ctrl-C at the continuation line drops the whole command, quoted lines and all
    term.child.sendline("echo 'never")
    term.expect("\n>")
    term.child.sendline("rm -r /pty-quote")
    term.expect("rm -r /pty-quote")
    term.child.sendintr()
    term.prompt()
    assert term.run("cat /pty-quote/f") == "kept\n"


def in_python_mode(terminal) -> Terminal:
    """A new shell, switched into python mode (tile 0's interpreter)."""
    term = terminal()
    term.prompt()
    term.child.sendline("python")
    term.expect_prompt(">>>")
    return term


def test_python_mode_runs_blocks_on_tile_0(terminal):
    term = in_python_mode(terminal)
    term.child.sendline("for i in range(3):")
    term.expect_prompt("...")
    term.child.sendline("    print('row', i)")
    term.expect_prompt("...")
    term.child.sendline("")
    out = term.expect_prompt(">>>")
    assert "row 0\nrow 1\nrow 2\n" in out
    term.child.sendline("kept = __tileid + 100")
    term.expect_prompt(">>>")
    term.child.sendline("kept")
    assert "100\n" in term.expect_prompt(">>>")
    term.child.sendeof()  # back to the shell, not out of it
    term.prompt()
    assert term.run("python -c 'print(kept)'") == "100\n"  # the namespace lives on


def test_python_shows_a_blocks_output_as_it_is_printed(terminal, shared_machine, tmp_path):
    """As Python's REPL does: the block prints, then waits for a file that only appears
    once the test has seen that output, so only output shown while the block runs gets
    it done. Text left without a newline still ends its line before a traceback."""
    flag = f"/go-{tmp_path.name}"
    term = in_python_mode(terminal)
    term.child.sendline(f"import os; print('waiting'); exec('while not os.path.exists(\"/tiles/1{flag}\"): pass'); print('done')")
    term.expect("\nwaiting\r\n")
    program = tmp_path / "flag.py"
    program.write_text(f"open({flag!r}, 'w').close()\n")
    made = run_cli("run", str(program), "--tiles", "1", env=shared_machine.env())
    assert made.returncode == 0, made.stderr
    assert term.expect_prompt(">>>").endswith("done\n")
    term.child.sendline("print('x', end=''); 1/0")
    assert "\nx\nTraceback (most recent call last):" in term.expect_prompt(">>>")
    program.write_text(f"import os\nos.remove({flag!r})\n")
    assert run_cli("run", str(program), "--tiles", "1", env=shared_machine.env()).returncode == 0


def test_ctrl_d_at_a_continuation_prompt_ends_the_block_as_python_does(terminal):
    """Python's REPL runs a block whose end is Ctrl-D, and stays; only Ctrl-D at an empty
    >>> leaves. (It used to throw the block away and leave python mode.)"""
    term = in_python_mode(terminal)
    term.child.sendline("for i in range(2):")
    term.expect_prompt("...")
    term.child.sendline("    print('ran', i)")
    term.expect_prompt("...")
    term.child.sendeof()
    assert "ran 0\nran 1\n" in term.expect_prompt(">>>")
    term.child.sendline("1 + 1")
    assert "2\n" in term.expect_prompt(">>>")
    term.child.sendeof()
    term.prompt()


def test_tab_in_python_mode_indents_at_the_start_and_completes_names_after(terminal):
    term = in_python_mode(terminal)
    term.child.sendline("import math; counter_of_things = 41")
    term.expect_prompt(">>>")
    term.child.send("counter_of_t\t")  # a name the blocks defined
    term.expect("counter_of_things")
    term.child.sendline(" + 1")
    assert "42\n" in term.expect_prompt(">>>")
    term.child.send("print(math.sqr\t")  # an attribute of what the dotted name is
    term.expect("math.sqrt")
    term.child.sendline("(16))")
    assert "4.0\n" in term.expect_prompt(">>>")
    term.child.sendline("for i in range(2):")
    term.expect_prompt("...")
    term.child.send("\tprint('indented', i)\r")  # at the start of a line Tab indents
    term.expect_prompt("...")
    term.child.sendline("")
    assert "indented 0\nindented 1\n" in term.expect_prompt(">>>")
    term.child.sendeof()
    term.prompt()


def test_python_lines_have_a_history_of_their_own(terminal, tmp_path):
    term = in_python_mode(terminal)
    term.child.sendline("python_only_line = 7")
    term.expect_prompt(">>>")
    term.child.sendeof()
    term.prompt()
    assert "python_only_line" not in term.run("history")  # the shell's lines only
    term.child.send("\x1b[A")  # Up in the shell: its own last line
    term.expect("history")
    term.child.send("\x15")  # (clear the line)
    term.child.sendline("python")
    term.expect_prompt(">>>")
    term.child.send("\x1b[A")  # Up in python mode: the last Python line
    term.expect("python_only_line = 7")
    term.child.sendline("")
    term.expect_prompt(">>>")
    term.child.sendeof()
    term.prompt()
    assert "python_only_line = 7" in private_history(tmp_path, "python-history")
    assert "python_only_line" not in private_history(tmp_path)


def test_multirepl_in_the_shell(terminal):
    term = terminal()
    term.prompt()
    term.child.sendline("multirepl --tiles 0-5")
    term.expect_prompt("[0-5]>>>")
    term.child.send("x = __tilei\t")  # the tile's names complete before the first block
    term.expect("__tileid")
    term.child.sendline(" % 2")
    term.expect_prompt("[0-5]>>>")
    term.child.sendline("print('parity', x)")
    out = term.expect_prompt("[0-5]>>>")
    assert "[3 tiles: 0-4:2]\nparity 0\n[3 tiles: 1-5:2]\nparity 1\n" in out
    term.child.sendline("parity_name = 1")
    term.expect_prompt("[0-5]>>>")
    term.child.send("print(parity_na\t")  # names of the session's first tile
    term.expect("parity_name")
    term.child.sendline(" + x)")
    assert "[3 tiles: 0-4:2]\n1\n[3 tiles: 1-5:2]\n2\n" in term.expect_prompt("[0-5]>>>")
    term.child.sendline("exit()")
    term.prompt()


def test_ipuos_repl_from_the_host(terminal, tmp_path):
    data = tmp_path / "lines.txt"
    data.write_text("".join(f"{i}\n" for i in range(8)))
    term = terminal("--tiles", "0-7", "--data", str(data), command="repl")
    term.expect_prompt("[0-7]>>>")
    term.child.sendline("print(allreduce(int(__tiledata)))")
    assert "[8 tiles: 0-7]\n28\n" in term.expect_prompt("[0-7]>>>")
    term.child.sendeof()
    assert term.finish() == 0


def test_the_shells_python_reaches_the_files_a_restore_brought(machine, tmp_path):
    """A restore from elsewhere drops the tile's filesystems under the shell's python
    session, which keeps its names and reaches the restored files at its next block
    (it used to fail every file call, "filesystem is not mounted", until the shell ended)."""
    image = str(tmp_path / "m.img")
    assert run_cli("shell", "-c", "echo root0 > /r0", env=machine.env()).returncode == 0
    assert run_cli("backup", image, env=machine.env()).returncode == 0
    term = Terminal(machine, tmp_path)
    try:
        term.prompt()
        assert term.run("python -c 'kept = open(\"/r0\").read()'") == ""
        assert run_cli("shell", "-c", "echo changed > /r0", env=machine.env()).returncode == 0
        restored = run_cli("restore", image, env=machine.env())
        assert restored.returncode == 0, restored.stderr
        assert term.run("python -c 'print(kept + open(\"/r0\").read())'") == "root0\nroot0\n\n"
    finally:
        term.close()


def test_the_shell_ends_at_once_when_its_machine_halts(machine, tmp_path):
    """Sitting at the prompt, nothing typed: the shell says why and exits (as ssh does
    when its connection closes), instead of waiting for a line to fail."""
    term = Terminal(machine, tmp_path)
    try:
        term.prompt()
        # (python has run: at its end the shell lets go of its names, unless the session
        # is gone, as here; it asked, and said the session had ended twice)
        term.child.sendline("python")
        term.expect_prompt(">>>")
        term.child.sendline("exit()")
        term.prompt()
        _halt_and_see_the_shell_end(term, machine)
    finally:
        term.close()


def _halt_and_see_the_shell_end(term: Terminal, machine, state: str = "has halted") -> str:
    """Halt the machine; the shell says so (that it is in ``state``) and exits 1 by
    itself. Returns what it printed."""
    halted = run_cli("halt", env=machine.env())
    assert halted.returncode == 0, halted.stderr
    term.child.expect(pexpect.EOF)
    out = plain(term.child.before)
    assert f"ipuos: the shell session ended: machine {machine.name!r} {state}\n" in out
    # (said once, last: python having run, the shell asked to let go of its names after,
    # and a second message followed)
    assert out.endswith(f"ipuos: the shell session ended: machine {machine.name!r} {state}\n"), out
    assert out.count("the shell session ended") == 1, out
    assert "Traceback" not in out
    term.child.close()
    assert term.child.exitstatus == 1
    return out


def test_a_halt_while_a_command_runs_ends_the_shell_after_it(machine, tmp_path):
    term = Terminal(machine, tmp_path)
    try:
        term.prompt()
        term.run("echo 'while True: pass' > /spin.py")
        term.child.sendline("run /spin.py --tiles 1-3")
        wait_for(lambda: "spin.py" in run_cli("ps", env=machine.env()).stdout, timeout=30,
                 what="the program to run")
        # (said by tile 0 with the command's answer: the machine has not halted yet)
        out = _halt_and_see_the_shell_end(term, machine, "is halting")
        assert "[3 tiles: 1-3]" in out  # the program's report first: halt interrupted it
    finally:
        term.close()


def test_ctrl_c_during_a_big_output_drops_what_was_not_shown_yet(terminal, shared_machine):
    """As a terminal's INTR flushes the output it holds: a big `cat` printed on to its end,
    seconds after the Ctrl-C."""
    term = terminal()
    term.prompt()
    term.run("python -c \"open('/chip/lines.txt', 'w').write(''.join('line %06d\\n' % i for i in range(18000)))\"")
    term.child.sendline("cat " + " ".join(["/chip/lines.txt"] * 60))  # ~12 MB, 1,080,000 lines
    term.child.expect("line 000100")
    time.sleep(2)  # a slow terminal: tile 0 prints on, and the output piles up behind it
    term.child.sendintr()
    shown = term.prompt()
    assert shown.count("line ") < 500_000, shown.count("line ")  # (dropped: most of it)
    assert term.run("echo after") == "after\n"


def test_ctrl_d_in_an_open_quote_ends_the_line_which_is_refused_as_in_sh(terminal):
    """(the key did nothing: only Ctrl-C got out)"""
    term = terminal()
    term.prompt()
    term.child.sendline('echo "abc')
    term.child.expect_exact("\r\n\x1b[0m>")  # the "> " line
    term.child.sendcontrol("d")
    assert "sh: syntax error: unterminated \" quote" in term.prompt()
    assert term.run("echo after") == "after\n"
    # where something is typed, Ctrl-D deletes the character under the cursor, as readline's does
    term.child.send('echo "ab\rc')
    term.child.send("\x1b[D\x04")  # (left, Ctrl-D: the "c" goes)
    term.child.send('"\r')
    assert term.prompt().endswith('ab\n\n'), "the line was not run as edited"


def test_what_a_python_block_prints_after_ctrl_c_is_shown(terminal):
    """The Ctrl-C drops only what was printed before it (test above): a handler's
    cleanup, printed after, is shown (dropping everything after the Ctrl-C lost it)."""
    term = terminal()
    term.prompt()
    term.child.sendline("python")
    term.expect_prompt(">>>")
    for line in ("try:", "    print('started')", "    while True:", "        x = 1",
                 "except KeyboardInterrupt:", "    print('cleaning up')",
                 "    for i in range(3 * 10**6):", "        x = i", ""):
        term.child.sendline(line)
    term.child.expect("started")
    time.sleep(0.5)
    term.child.sendintr()
    out = term.expect_prompt(">>>")
    assert "cleaning up" in out, out
