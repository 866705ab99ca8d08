"""The commands that take a terminal over (the shell's prompt, ``top``) under the signals
a terminal's user and their system send: they put the terminal back before they stop or
go (echo, line editing, the main screen, the cursor, no bracketed paste), and die of
SIGTERM or SIGHUP as any program does. Through a real pty, reading its modes (termios)
after the process has gone."""

from __future__ import annotations

import io
import os
import signal
import termios
import time

import pexpect
import pytest
from daemon_harness import IPUOS, machine, run_cli, runtime_dir, shared_machine, wait_for  # noqa: F401
from test_shell_pty import Terminal, new_prompt, plain

ALT_SCREEN_ON, ALT_SCREEN_OFF = "\x1b[?1049h", "\x1b[?1049l"
CURSOR_HIDDEN, CURSOR_SHOWN = "\x1b[?25l", "\x1b[?25h"
PASTE_ON, PASTE_OFF = "\x1b[?2004h", "\x1b[?2004l"


def tty_modes(child: pexpect.spawn) -> dict:
    """The pty's echo and canonical (line editing) modes, read on its master side."""
    flags = termios.tcgetattr(child.child_fd)[3]
    return {"echo": bool(flags & termios.ECHO), "icanon": bool(flags & termios.ICANON)}


COOKED = {"echo": True, "icanon": True}
RAW = {"echo": False, "icanon": False}


def recorded(child: pexpect.spawn) -> io.StringIO:
    """Everything ``child`` writes to the terminal from now on, escape sequences and all."""
    seen = io.StringIO()
    child.logfile_read = seen
    return seen


def died_of(child: pexpect.spawn, signum: int) -> str:
    """Wait for ``child`` to end; check that it put the terminal back and died of ``signum``.
    Returns what it wrote last, plain."""
    child.expect(pexpect.EOF)
    modes = tty_modes(child)
    last = plain(child.before)
    child.close()
    assert (child.exitstatus, child.signalstatus) == (None, signum), last
    assert modes == COOKED, last
    assert "Traceback" not in last
    return last


def only_after(written: str, on: str, off: str) -> bool:
    """``off`` was written after the last ``on``: the mode is off again."""
    return written.rfind(off) > written.rfind(on) >= 0


# -- the shell -----------------------------------------------------------------------------


@pytest.mark.parametrize("where, signum", [("the prompt", signal.SIGTERM), ("the prompt", signal.SIGHUP),
                                           ("python mode", signal.SIGTERM), ("a command", signal.SIGTERM)])
def test_a_shell_ended_by_a_signal_puts_the_terminal_back_first(machine, tmp_path, where, signum):
    term = Terminal(machine, tmp_path)
    written = recorded(term.child)
    try:
        term.prompt()
        if where == "python mode":
            term.child.sendline("python")
            term.expect_prompt(">>>")
        if where == "a command":
            term.run("echo 'while True: pass' > /spin.py")
            term.child.sendline("run /spin.py --tiles 1")
            wait_for(lambda: "spin.py" in run_cli("ps", env=machine.env()).stdout, timeout=30,
                     what="the program to run")
        else:
            assert tty_modes(term.child) == RAW  # (the prompt edits the line itself)
        term.child.kill(signum)
        died_of(term.child, signum)
        assert only_after(written.getvalue(), PASTE_ON, PASTE_OFF)
    finally:
        term.close()


def test_a_shell_whose_daemon_was_killed_says_it_did_not_halt(machine, tmp_path):
    term = Terminal(machine, tmp_path)
    try:
        term.prompt()
        os.kill(machine.pid, signal.SIGKILL)
        term.child.expect(pexpect.EOF)
        out = plain(term.child.before)
        term.child.close()
        assert term.child.exitstatus == 1
        assert (f"ipuos: the shell session ended: machine {machine.name!r} stopped without halting: its "
                f"daemon crashed or was killed (its log is {machine.paths.log})") in out, out
    finally:
        term.close()


# -- top -----------------------------------------------------------------------------------


def top_on_a_pty(booted) -> pexpect.spawn:
    return pexpect.spawn(IPUOS, ["top", "--interval", "0.2"], env=booted.env(TERM="xterm"),
                         encoding="utf-8", timeout=30, dimensions=(40, 120))


def gave_the_screen_back(written: str) -> bool:
    """The main screen is back, and the cursor shown."""
    return only_after(written, ALT_SCREEN_ON, ALT_SCREEN_OFF) and only_after(written, CURSOR_HIDDEN, CURSOR_SHOWN)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_top_ended_by_a_signal_puts_the_terminal_back_first(shared_machine, signum):
    top = top_on_a_pty(shared_machine)
    written = recorded(top)
    try:
        top.expect("ipuos top")
        assert tty_modes(top) == RAW  # (keys arrive as pressed)
        top.kill(signum)
        died_of(top, signum)
        assert gave_the_screen_back(written.getvalue())
    finally:
        top.terminate(force=True)


def test_top_stopped_by_ctrl_z_gives_the_terminal_back_and_takes_it_again_on_fg(shared_machine, tmp_path):
    """Under a job-control shell, as a user runs it (a stop signal to a process group
    with no such parent is discarded)."""
    env = shared_machine.env(HOME=str(tmp_path), TERM="xterm", PS1="host$ ")
    bash = pexpect.spawn("bash", ["--norc", "--noprofile", "-i"], env=env, encoding="utf-8", timeout=30,
                         dimensions=(40, 120))
    written = recorded(bash)
    try:
        bash.expect_exact("host$ ")
        bash.sendline(f"{IPUOS} top --interval 0.2")
        bash.expect("view: state")
        bash.sendcontrol("z")
        bash.expect("Stopped")
        assert gave_the_screen_back(written.getvalue())  # before bash said so
        bash.expect_exact("host$ ")
        bash.sendline("fg")
        bash.expect_exact(ALT_SCREEN_ON)
        bash.expect("view: state")  # redrawn
        assert tty_modes(bash) == RAW
        bash.send("s")  # (no Enter: a key works as pressed)
        bash.expect("view: sram", timeout=10)
        bash.send("q")
        bash.expect_exact("host$ ")
        assert gave_the_screen_back(written.getvalue())
        bash.sendline("echo status $?")
        bash.expect("status 0")
    finally:
        bash.terminate(force=True)


def test_top_continued_after_sigstop_takes_the_terminal_again(shared_machine):
    """While it was stopped, its shell may have put the terminal back in its own modes
    (here: line editing and echo, as a shell without job control leaves them)."""
    top = top_on_a_pty(shared_machine)
    try:
        top.expect("view: state")
        top.kill(signal.SIGSTOP)
        attributes = termios.tcgetattr(top.child_fd)
        attributes[3] |= termios.ECHO | termios.ICANON
        termios.tcsetattr(top.child_fd, termios.TCSANOW, attributes)
        time.sleep(0.5)
        top.kill(signal.SIGCONT)
        wait_for(lambda: tty_modes(top) == RAW, timeout=10, what="top to take the terminal again")
        top.send("s")
        top.expect("view: sram", timeout=10)
        top.send("q")
        top.expect(pexpect.EOF)
        top.close()
        assert top.exitstatus == 0
    finally:
        top.terminate(force=True)
