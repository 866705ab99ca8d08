"""CLI commands for the shell (added to the ``ipuos`` group on import by ``_cli``).

``ipuos shell`` attaches a terminal to the shell on tile 0 (starting the machine if none
runs, like ``ipuos run``); ``ipuos repl`` is the same terminal started in the multirepl.
The terminal reaches its session through ``_shell_transport``. Every ``ipuos`` command
imports this module, so the shell package and prompt_toolkit are imported by these two
commands only.
"""

from __future__ import annotations

import shutil
import sys

import click

from ._cli import (
    EXIT_INTERRUPTED,
    _Errors,
    _fail,
    _geometry,
    attach_machine,
    ipus_option,
    main,
    name_option,
    preset_option,
)


# -- the commands --------------------------------------------------------------------------------


def _attach_terminal(name: str, preset, ipus, command_text: str | None, first_line: str | None) -> int:
    from ._shell_transport import DaemonTransport
    from ._protocol import REQUEST_LIMITS
    from .shell import Terminal, history_path

    paths, info = attach_machine(name, preset, ipus)
    interactive = command_text is None and sys.stdin.isatty() and sys.stdout.isatty()
    width = shutil.get_terminal_size().columns if interactive else 0
    with _Errors():
        try:
            transport = DaemonTransport(paths, width)
        except KeyboardInterrupt:  # given up waiting for a busy tile 0
            _fail(f"stopped waiting for tile 0 of machine {name!r}; no shell was opened", EXIT_INTERRUPTED)
    try:
        terminal = Terminal(transport, transport.state, history_file=history_path(),
                            exit_on_leave=first_line is not None, max_payload=REQUEST_LIMITS.max_payload)
        if first_line is not None:
            terminal.feed(first_line)
            if terminal.mode == "shell":  # the repl did not start; the error is printed
                return terminal.status or 1
        if command_text is not None:
            # lines end at newlines only, as the shell splits piped input (splitlines
            # would also break at a form feed or U+2028 inside quotes); run_script joins
            # the lines of a quote that spans them again
            lines = command_text.split("\n")
            while lines and not lines[-1]:
                lines.pop()
            return terminal.finish(terminal.run_script(lines, command_text=True))
        if interactive:
            if first_line is None:
                click.echo(f"ipuos shell on machine {name!r} ({_geometry(info)}): `help` lists "
                           "commands, Ctrl-D leaves.")
            return terminal.finish(terminal.interact())
        return terminal.finish(terminal.run_script(sys.stdin))
    finally:
        transport.close()


@main.command()
@click.option("-c", "command_text", metavar="LINES", help="run these shell lines and exit with the last status")
@preset_option(None)
@ipus_option(None)
@name_option
def shell(command_text, preset, ipus, name) -> None:
    """The shell on tile 0: files of every tile, programs, the multirepl.

    Starts the machine if it is not running. Reads commands from the terminal, from -c,
    or from a pipe; the exit status is the last command's.
    """
    sys.exit(_attach_terminal(name, preset, ipus, command_text, None))


@main.command()
@click.option("--tiles", "tile_spec", default="all", show_default=True, help="tiles to run every block on")
@click.option("--data", "data_file", type=click.Path(exists=True, dir_okay=False),
              help="host file split over the tiles as __tiledata")
@click.option("-c", "command_text", metavar="CODE", help="run these lines as blocks and exit")
@preset_option(None)
@ipus_option(None)
@name_option
def repl(tile_spec, data_file, command_text, preset, ipus, name) -> None:
    """The multirepl: every block of Python runs on every selected tile.

    Names persist between blocks; output (and exceptions) are grouped by identical text,
    most frequent first, with tile ranges.
    """
    from .shell import quote

    line = f"multirepl --tiles {quote(tile_spec)}"
    if data_file is not None:
        line += f" --data {quote(data_file)}"
    sys.exit(_attach_terminal(name, preset, ipus, command_text, line))
