"""The commands that start jobs: run, python and multirepl.

Programs and repl blocks are started through the :class:`~ipuos.shell.ShellHost` the
daemon gave the shell, and waited for on tile 0 (which keeps serving requests while it
waits); Ctrl-C interrupts the job, and the command prints what its tiles printed, grouped
by identical text with tile ranges like ``ipuos run``. ``python`` is a repl on tile 0
alone, kept for the whole session; ``multirepl`` one on any tiles, kept until it is left.
"""

from __future__ import annotations

import re

import traceback

from ipuos._plural import plural
from ipuos._source import source_problem, source_text
from ipuos._spelling import program_option_slip
from ipuos._tilespec import TileSpecError, format_tiles
from ipuos.scheduler import TileBusyError, budget_seconds, describe_syntax_error

from ._session import MULTIREPL, PYTHON, SHELL
from ._table import COMMANDS, Usage, check_known, command, options

#: distinct outputs shown before "N more distinct outputs"
MAX_GROUPS = 20

#: what leaves python or multirepl mode at once, without a job: exit, quit, exit(), quit()
#: (``exit(N)`` runs as a block, so the multirepl reports it as it does any block's exit())
_EXIT_LINE = re.compile(r"(?:exit|quit)(?:\(\s*\))?")


@command("run", "run FILE [--tiles SPEC] [--data PATH] [--budget SECONDS] [ARG...] [-- ARG...]",
         "run a Python file from the chip on tiles; output grouped (ARGs: __args)",
         notes="run's own options may also come before FILE (run --tiles 0-3 FILE).\n"
               "ARGs reach the program as __args, after FILE's name: options run does not know\n"
               "too, and after --, every argument. An option that looks like a slip for one of\n"
               "run's own (--tile, --dat, --budgte) is refused; to pass it to the program, put\n"
               "it after --.")
def _run(sh, args):
    settings = {"--tiles": "all", "--data": None, "--budget": None}
    argv = _run_arguments(args, settings)
    if argv is None:  # (--help before FILE: as `ipuos run --help`)
        sh.write(COMMANDS["run"].help_text())
        return 0
    path = argv[0]
    budget = None
    if settings["--budget"] is not None:
        try:
            budget = budget_seconds(float(settings["--budget"]))
        except ValueError:
            return sh.error(f"--budget: {settings['--budget']!r} is not a positive, finite number of seconds", 2)
    try:
        source = source_text(sh.fs.read_bytes(path))
    except (UnicodeDecodeError, SyntaxError) as exc:
        return sh.error(f"{path} {source_problem(exc)}")
    data = sh.fs.read_bytes(settings["--data"]) if settings["--data"] is not None else None
    try:
        launched = sh.host.launch(source, sh.fs.abspath(path), settings["--tiles"], data, argv,
                                  budget, sh.session.client_pid)
    except TileSpecError as exc:
        return sh.error(f"--tiles: {exc}", 2)
    except SyntaxError as exc:
        return sh.error(describe_syntax_error(path, exc))
    except (TileBusyError, ValueError) as exc:
        return sh.error(str(exc))
    sh.wait(launched)
    text, status, _ = launched.report(MAX_GROUPS)
    sh.write(text)
    return status


def _run_arguments(args: list[str], settings: dict) -> list[str] | None:
    """FILE and the program's arguments (its ``__args``), with run's own options put in
    ``settings``; None for ``--help``. Before FILE only run's options are taken (as
    ``ipuos run --tiles 0 FILE``); after it, options run does not know are the program's,
    except a slip for run's own, and after ``--`` every argument is."""
    argv: list[str] = []
    index = 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "--":
            argv.extend(args[index:])
            break
        name, eq, value = arg.partition("=")
        if name in settings:
            if not eq:
                if index >= len(args):
                    raise Usage(f"{name} needs a value")
                value = args[index]
                index += 1
            settings[name] = value
        elif argv:
            slip = program_option_slip(name, settings)
            if slip is not None:  # (--tile 0 would run the program on every tile)
                raise Usage(slip)
            argv.append(arg)
        elif arg == "--help":
            return None
        elif arg.startswith("-") and arg != "-":  # (a file named so: ./-x.py, or after --)
            check_known(name, settings)
        else:
            argv.append(arg)  # FILE
    if not argv:
        raise Usage("missing file operand")
    return argv


# -- interpreters ---------------------------------------------------------------------------------


@command("python", "python [-c CODE]",
         "Python on tile 0 with the tile's namespace, kept for the session (Ctrl-D leaves)",
         notes="It starts in the shell's current directory; the names it defines are kept\n"
               "until the shell exits (where os.chdir took it is not).",
         paths=False)
def _python(sh, args):
    opts, rest = options(args, "c:")
    if rest:
        raise Usage(f"unexpected argument {rest[0]!r} (python -c CODE runs one block)")
    session = sh.session
    if session.python is None:
        session.python = sh.host.open_repl("0", None, session.client_pid)
    # Python starts where the shell is, as a program the shell starts would (its names
    # are kept; where it went with os.chdir is not, as a new process's would not be)
    if "-c" in opts:  # (one block, in the shell: exit() ends the block, not the shell)
        return run_block(sh, session.python, opts["-c"], grouped=False, echo=False, cwd=session.cwd)[0]
    session.python_starts_in = session.cwd
    session.mode = PYTHON
    if session.width:  # a terminal: say where we are (scripts get only their output)
        sh.print("Python on tile 0: its files through open and import os; names are kept until the "
                 "shell exits. Ctrl-D or exit() goes back to the shell.")
    return 0


@command("multirepl", "multirepl [--tiles SPEC] [--data HOSTFILE]",
         "every block runs on every tile; output grouped (Ctrl-D leaves)", paths=False)
def _multirepl(sh, args):
    opts, rest = multirepl_options(args)
    if rest:
        raise Usage(f"unexpected argument {rest[0]!r}")
    data = sh.payload if "--data" in opts else None
    session = sh.session
    try:
        repl = sh.host.open_repl(opts.get("--tiles", "all"), data, session.client_pid)
    except TileSpecError as exc:
        return sh.error(f"--tiles: {exc}", 2)
    except ValueError as exc:
        return sh.error(str(exc))
    session.repl = repl
    session.mode = MULTIREPL
    if session.width:  # a terminal: say where we are (scripts get only their output)
        sh.print(f"multirepl on {plural(repl.ntiles, 'tile')} ({repl.tiles}): "
             "each block runs on every tile, names are kept between blocks, output is grouped. "
             "Ctrl-D or exit() leaves (exit() in a block, on any tile, too).")
    return 0


def enters_repl(command) -> bool:
    """multirepl, and python without -c: they take the lines that follow. (Their options
    are read as their handlers read them: ``-cCODE`` is ``-c CODE``, and a bad option is
    a usage error, which enters nothing: see :func:`meant_to_enter_repl`.)"""
    opts = _repl_options(command)
    return opts is not None and "-c" not in opts


def meant_to_enter_repl(command) -> bool:
    """Whether the lines after ``command`` are meant as a repl's input, should it start:
    as :func:`enters_repl`, and also when its options are bad (``python --bogus``, unless
    a word of it asks for ``-c``; ``multirepl --tiles 0-99``), since a script must then
    not run those lines as shell commands."""
    if command.name not in ("python", "multirepl"):
        return False
    opts = _repl_options(command)
    if opts is None:  # (-x, --bogus ...: getopt stopped there; -c, -xc, -cCODE ask for one block)
        return not any(re.match(r"-[^-]*c", word.text) for word in command.words[1:])
    return "-c" not in opts


def _repl_options(command) -> dict | None:
    """The options of python or multirepl as their handlers read them (None: not one of
    them, or a usage error, which the command reports itself: a bad option, or an
    argument, which neither takes: ``python foo.py`` is told so, not taken for a repl)."""
    if command.name not in ("python", "multirepl"):
        return None
    args = [word.text for word in command.words[1:]]
    try:
        opts, rest = options(args, "c:") if command.name == "python" else multirepl_options(args)
    except Usage:
        return None
    return None if rest else opts


def multirepl_options(args: list[str], sources: dict | None = None) -> tuple[dict, list[str]]:
    """multirepl's options: also read by the terminal, which sends ``--data``'s host file
    with the line, so that both read the same options from it (``sources``: see
    :func:`~ipuos.shell._table.options`)."""
    return options(args, "", ("tiles=", "data="), sources)


def run_block(sh, repl, source: str, *, grouped: bool, echo: bool = True,
              cwd: str | None = None) -> tuple[int, list[tuple[int, int]]]:
    """Run one block in a repl and print what the tiles printed; (its status, the (tile,
    status) of each tile on which it called ``exit()``). ``echo``: show a trailing
    expression's value; ``cwd``: start the block there."""
    live = None if grouped or sh.redirect is not None else _LiveOutput(sh)
    try:
        launched = repl.launch(source, echo=echo, cwd=cwd, sink=live)
        if cwd is not None and repl is sh.session.python:
            sh.session.python_starts_in = None  # (started there: the next block goes on from it)
    except SyntaxError as exc:
        sh.output.write("err", "".join(traceback.format_exception_only(type(exc), exc)))
        return 1, []
    except (TileBusyError, ValueError) as exc:
        return sh.error(str(exc)), []
    return _wait_and_show(sh, launched, grouped, live), launched.exits()


def _wait_and_show(sh, launched, grouped: bool, live: "_LiveOutput | None" = None) -> int:
    """Wait for a repl's job and show what its tiles printed: grouped, or each tile's
    output and error as they are (after what ``live`` showed as it was printed); its
    status."""
    sh.wait(launched)
    text, status, per_tile = launched.report(MAX_GROUPS)
    if grouped:
        sh.write(text)
    else:
        for _, output, error in per_tile:
            if live is not None and not live.ends_line and (output or error):
                sh.write("\n")  # (what follows the streamed output starts a line of its own)
            sh.write_output_and_error(output, error)
    return status


class _LiveOutput:
    """The sink that shows tile 0's output as its ``python`` block prints it, as Python
    does, rather than when the block ends. Only text printed on tile 0's greenlet: a
    ``__del__`` run by the cycle collector elsewhere leaves its text in the block's
    report. (With ``> file`` nothing streams: the file is tile 0's own, and writing it
    from inside whatever the program is doing could land inside a filesystem call.)"""

    def __init__(self, sh):
        self.sh = sh
        #: whether the text shown so far ends a line (nothing shown: it does)
        self.ends_line = True

    def __call__(self, text: str) -> bool:
        if self.sh.tile.elsewhere() is not None:
            return False
        self.sh.output.write("out", text)
        self.sh.output.flush()
        self.ends_line = text.endswith("\n")
        return True


def repl_line(sh, source: str, eof: bool) -> int:
    """A block typed in python or multirepl mode (``eof``: Ctrl-D, back to the shell).
    Leaving keeps the status of the last block (``ipuos repl -c`` exits with it), or
    takes the one a block's ``exit(N)`` gives."""
    session = sh.session
    if eof or _EXIT_LINE.fullmatch(source.strip()):  # (bare ``exit`` too, without a job)
        _leave_repl(sh)
        return session.status
    if not source.strip():
        return session.status
    if session.mode == PYTHON:
        status, exits = run_block(sh, session.python, source, grouped=False, cwd=session.python_starts_in)
    else:
        status, exits = run_block(sh, session.repl, source, grouped=True)
    if exits:  # exit(N), raise SystemExit ... anywhere in the block: leave, as Python does
        if session.mode == MULTIREPL:  # (on some tiles only, perhaps: say why every tile's session ends)
            sh.output.write("err", f"multirepl ended: exit() on {_tiles_by_status(exits)}\n")
        _leave_repl(sh)
        session.status = status & 0xFF
    return status


def end_sessions(sh) -> None:
    """The terminal's input has ended: the ``python`` names and a multirepl's are let go
    of, as Python's are at exit (``__del__`` methods run), and what that prints is shown,
    tile 0's as it is, a multirepl's grouped. Left to the session's close, which comes
    once the terminal has gone, nobody saw it."""
    session = sh.session
    ending_python, ending_repl = session.python, session.repl
    session.python = session.repl = None
    session.mode = SHELL
    for repl, grouped in ((ending_python, False), (ending_repl, True)):
        ending = repl.close() if repl is not None else None
        if ending is not None:
            _wait_and_show(sh, ending, grouped)


def _tiles_by_status(exits: list[tuple[int, int]]) -> str:
    """``tile 2 (status 3)``, ``tiles 0-1 (status 0) and tile 5 (status 3)``."""
    by_status: dict[int, list[int]] = {}
    for tile, status in exits:
        by_status.setdefault(status, []).append(tile)
    return " and ".join(f"{'tile' if len(tiles) == 1 else 'tiles'} {format_tiles(tiles)} (status {status})"
                        for status, tiles in sorted(by_status.items()))


def _leave_repl(sh) -> None:
    """Back to the shell; leaving the multirepl ends its session, and what the tiles
    print as they let go of their names (``__del__``) is shown as a block's output is."""
    session = sh.session
    repl = session.repl if session.mode == MULTIREPL else None
    session.mode = SHELL
    if repl is not None:
        session.repl = None
        ending = repl.close()
        if ending is not None:
            _wait_and_show(sh, ending, grouped=True)
