"""A Ctrl-C while an ``ipuos`` command starts (imports its CLI) ends it quietly, status 130.

It used to land in the middle of an import, and Python printed a traceback through the
``ipuos`` script. The sweep sends Ctrl-C at fractions of the time a command takes under
the current load. Before the entry point runs nothing of ipuos can catch it: Python's
start-up, and the script's import of the entry point (a few ms: see ``ipuos._entry``),
may still print one.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import subprocess
import sysconfig
import time
from pathlib import Path

import pytest
from daemon_harness import IPUOS

#: what importing the entry point runs: a Ctrl-C there is before anything can catch it
ENTRY_POINT_IMPORTS = (sysconfig.get_paths()["stdlib"] + os.sep, "<frozen ",
                       *(str(Path(__file__).resolve().parent.parent / "ipuos" / name)
                         for name in ("__init__.py", "_lazy.py", "_entry.py")))


def before_the_entry_point(stderr: str) -> bool:
    """Whether a traceback in ``stderr`` (if any) is from before the entry point ran:
    from Python's start-up, or from the script's import of the entry point (an editable
    install's finder takes part: it finds the ``ipuos`` package)."""
    paths = re.findall(r'File "([^"]+)"', stderr)
    if IPUOS not in paths:
        return True
    return all(path == IPUOS or path.startswith(ENTRY_POINT_IMPORTS) or Path(path).name.startswith("__editable__")
               for path in paths)


def run(env: dict, interrupt_after: float | None = None) -> subprocess.CompletedProcess:
    """``ipuos machines``, sent Ctrl-C ``interrupt_after`` seconds after it starts."""
    process = subprocess.Popen([IPUOS, "machines"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    if interrupt_after is not None:
        time.sleep(interrupt_after)
        process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_ctrl_c_as_a_command_starts_ends_it_quietly(tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    env = dict(os.environ, IPUOS_RUNTIME_DIR=str(runtime))
    started = time.perf_counter()
    assert run(env).stdout == "no machines are running; `ipuos boot` starts one\n"
    took = time.perf_counter() - started  # (most of it: imports)
    interrupted = 0
    for fraction in (0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85):
        done = run(env, fraction * took)
        outcome = (fraction, done.returncode, done.stdout, done.stderr)
        assert before_the_entry_point(done.stderr), outcome  # (no traceback through the command)
        if done.returncode == 130:
            assert done.stderr == "\nipuos: interrupted\n", outcome
            interrupted += 1
        elif done.returncode == 0:  # (Python may have said that its start-up was interrupted)
            assert done.stdout.startswith("no machines are running"), outcome
        else:  # in Python's start-up, before the script (or as the interpreter exited)
            assert done.returncode in (1, -signal.SIGINT), outcome
    assert interrupted, "no Ctrl-C came while the command started"


def test_a_ctrl_c_that_python_wraps_during_an_import_still_ends_the_command_quietly(monkeypatch, capsys):
    """A Ctrl-C landing in a dataclass's ``__set_name__`` reaches the entry point as a
    RuntimeError caused by it: a traceback, one CI run in many."""
    import types

    from ipuos import _entry

    class Wrapping(types.ModuleType):
        def __getattr__(self, name):
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as exc:
                raise RuntimeError("Error calling __set_name__ on 'Field' instance") from exc

    monkeypatch.setitem(sys.modules, "ipuos._cli", Wrapping("ipuos._cli"))
    with pytest.raises(SystemExit) as info:
        _entry.main()
    assert info.value.code == 130
    assert capsys.readouterr().err == "\nipuos: interrupted\n"


def test_a_ctrl_c_while_the_cli_sets_up_its_output_ends_the_command_quietly(monkeypatch, capsys):
    """Around a command the CLI puts a layer of its own under standard output: a Ctrl-C
    there, outside any command, went up through the script as a traceback."""
    import contextlib

    from ipuos import _cli, _entry

    @contextlib.contextmanager
    def interrupted_setup():
        raise KeyboardInterrupt
        yield  # (a generator: never reached)

    monkeypatch.setattr(_cli, "_whole_output", interrupted_setup)
    monkeypatch.setattr(sys, "argv", ["ipuos", "machines"])
    try:
        with pytest.raises(SystemExit) as info:
            _entry.main()
    except KeyboardInterrupt:
        pytest.fail("the Ctrl-C went up through the entry point (a traceback)")
    assert info.value.code == 130
    assert capsys.readouterr().err == "\nipuos: interrupted\n"
