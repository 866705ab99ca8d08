"""The ``ipuos`` command's entry point: the CLI, with a Ctrl-C during its imports.

A command spends its first ~0.2 s importing the CLI (click, the client, ...): a Ctrl-C
then raised KeyboardInterrupt in the middle of an import, and Python printed a
traceback. Here it ends the command as a Ctrl-C anywhere else does. This module, and the
``ipuos`` package it is part of, import next to nothing themselves (the package's names
are imported on first use), so only the interpreter's own start-up is left unguarded.
"""

import sys

#: the status of a command ended by Ctrl-C: 128 + SIGINT, as a shell shows it (the
#: CLI's EXIT_INTERRUPTED, from ipuos._runresult, which is not imported yet here)
EXIT_INTERRUPTED = 130


def main() -> None:
    try:
        from ._cli import main as cli
    except KeyboardInterrupt:
        interrupted()
    cli()


def interrupted():
    """End the command as interrupted: one line on stderr (after the ``^C`` a terminal
    echoes), status 130."""
    sys.stderr.write("\nipuos: interrupted\n")
    sys.exit(EXIT_INTERRUPTED)
