"""The shell: tile 0's command interpreter, the multirepl, and the host terminal front-end.

The shell runs *on tile 0*: :class:`ShellServer` registers ``shell.*`` kernel services,
and each attached terminal is a session in tile 0's kernel data. A line is parsed and
run there, every file operation going through tile 0's VFS: ``/`` is tile 0's disk,
``/chip`` the chip disk, and ``/tiles/N/...`` tile N's files, reached over the exchange
(the one way to any tile's files). Programs, the multirepl and tile 0's Python run as
jobs, started through a :class:`ShellHost` the daemon provides (this layer may not
import the runtime above it).

The host side is only the terminal: :class:`Terminal` reads lines (prompt_toolkit, or a
pipe), sends them through a :class:`Transport`, prints the answers, and does what needs
the host (``put``/``get``, history). It never runs a host command.

This layer imports the standard library, prompt_toolkit (the terminal only),
``ipuos.vfs``, ``ipuos.blockdev``, ``ipuos.scheduler`` and the machine core. The terminal
needs the command table (usage, completion), so the command modules import the VFS and
block devices (numpy, littlefs: ~0.3 s) inside the commands, which run on tile 0, where
they are loaded already: ``ipuos shell`` starts without them.
"""

from ._blocks import block_complete
from ._parse import Command, ShellSyntaxError, Word, parse_line, quote
from ._protocols import JobInfo, Launched, RemoteError, ReplHandle, ShellHost, Transport
from ._server import EXIT_INTERRUPTED, EXIT_NOT_FOUND, SESSIONS_KEY, ShellServer
from ._session import Session, ShellInterrupt
from ._table import COMMANDS, CommandSpec

__all__ = [
    "ShellServer",
    "ShellHost",
    "Launched",
    "ReplHandle",
    "JobInfo",
    "Transport",
    "RemoteError",
    "Terminal",
    "history_path",
    "Session",
    "ShellInterrupt",
    "COMMANDS",
    "CommandSpec",
    "parse_line",
    "Command",
    "Word",
    "ShellSyntaxError",
    "quote",
    "block_complete",
    "SESSIONS_KEY",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
]


def __getattr__(name):
    # the terminal pulls in prompt_toolkit; the daemon, which only serves, never needs it
    if name in ("Terminal", "history_path"):
        from . import _terminal

        return getattr(_terminal, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
