"""The ``ipuos`` command's entry point: the CLI, with a Ctrl-C during its imports.

A command spends its first ~0.2 s importing the CLI (click, the client, ...): a Ctrl-C
then raised KeyboardInterrupt in the middle of an import, and Python printed a
traceback; so did one while the CLI set up or put back its standard output around a
command. Here it ends the command as a Ctrl-C anywhere else does. This module, and the
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

        cli()  # (which ends a Ctrl-C in a command itself; not one in its set-up around that)
    except BaseException as exc:
        if _from_ctrl_c(exc):
            interrupted()
        raise


def _from_ctrl_c(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a KeyboardInterrupt or was caused by one: Python wraps one that
    lands in a class's ``__set_name__`` (a dataclass being made) in a RuntimeError."""
    while exc is not None:
        if isinstance(exc, KeyboardInterrupt):
            return True
        exc = exc.__cause__
    return False


def interrupted():
    """End the command as interrupted: one line on stderr (after the ``^C`` a terminal
    echoes), status 130."""
    sys.stderr.write("\nipuos: interrupted\n")
    sys.exit(EXIT_INTERRUPTED)
