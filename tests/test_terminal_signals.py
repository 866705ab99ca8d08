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
