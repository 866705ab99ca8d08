"""The command table: one small handler per command, with its usage and a line of help.

A handler is ``fn(sh, args) -> status``: ``sh`` is the command's
:class:`~ipuos.shell._session.Context`, ``args`` the words after the command name (globs
already expanded). Handlers report user mistakes with ``sh.error`` (or let an
``OSError`` from the files escape: the dispatcher prints it as ``cmd: path: reason``) and
raise :class:`Usage` for bad options. Nothing a user types can produce a Python
traceback; an unexpected exception is reported as an internal error in one line.

Commands marked ``terminal`` are carried out by the terminal front-end (they touch the
host: its files, its history, its screen); they are in the table so that ``help`` and
completion know them, and so that tile 0 can say why it cannot run them itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ipuos._spelling import meant_options

__all__ = ["CommandSpec", "COMMANDS", "command", "Usage", "options", "check_known", "human_size"]


class Usage(Exception):
    """Bad options or operands: the message, then the usage line, status 2."""


@dataclass(frozen=True)
class CommandSpec:
    name: str
    usage: str
    summary: str
    handler: Callable | None
    #: carried out by the terminal front-end, not on tile 0
    terminal: bool = False
    #: which operands complete as chip paths (False: none, e.g. ``kill``)
    paths: bool = True
    #: more than the summary's line, for ``help COMMAND``
    notes: str = ""

    def help_text(self) -> str:
        """What ``help COMMAND`` prints: usage, summary and notes."""
        return f"usage: {self.usage}\n{self.summary}\n" + (f"{self.notes}\n" if self.notes else "")


#: every command, by name
COMMANDS: dict[str, CommandSpec] = {}


def command(name: str, usage: str, summary: str, *, terminal: bool = False, paths: bool = True,
            notes: str = ""):
    """Register the decorated handler as command ``name``."""

    def register(fn):
        if name in COMMANDS:
            raise ValueError(f"shell command {name!r} is registered twice")
        COMMANDS[name] = CommandSpec(name, usage, summary, fn, terminal, paths, notes)
        return fn

    return register


def options(args: list[str], letters: str, long: tuple[str, ...] = (),
            sources: dict | None = None) -> tuple[dict, list[str]]:
    """Options as GNU getopt reads them (options may follow operands; ``--`` ends them;
    ``-`` is an operand; ``-n5`` and ``-ln 5`` are ``-n 5``; ``--tiles=X`` or ``--tiles X``),
    except that long options are spelled out in full, as ``run`` and the ``ipuos``
    commands take them: getopt would read ``--dat`` as ``--data``, which the terminal,
    deciding from a line what to send with it, cannot be expected to follow.

    ``letters`` as getopt's (``"ln:"``), ``long`` as its long options (``("tiles=",)``).
    Returns ({"-l": "", "-n": "5", "--tiles": "0-3"}, operands); Usage on a bad option.
    ``sources``, if given, gets where each value was read: ``{"--tiles": (i, start)}``,
    ``args[i][start:]`` (for the terminal, which must find the word a value came from).
    """
    takes_value = {"-" + letter: letters[index + 1 : index + 2] == ":"
                   for index, letter in enumerate(letters) if letter != ":"}
    takes_value.update({"--" + name.rstrip("="): name.endswith("=") for name in long})
    found: dict[str, str] = {}
    operands: list[str] = []
    index = 0

    def value_of(name: str, given: str | None) -> str:
        nonlocal index
        if not takes_value[name]:
            if given is not None:  # (only a long option can be given one: --name=value)
                raise Usage(f"option {name} must not have an argument")
            return ""
        if given is None:
            if index == len(args):
                raise Usage(f"option {name} requires argument")
            given = args[index]
            index += 1
        if sources is not None:  # (the value is the end of the word it was read from)
            sources[name] = (index - 1, len(args[index - 1]) - len(given))
        return given

    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "--":
            operands.extend(args[index:])
            break
        if arg.startswith("--"):
            name, eq, given = arg.partition("=")
            check_known(name, takes_value)
            found[name] = value_of(name, given if eq else None)
        elif arg.startswith("-") and arg != "-":
            for position in range(1, len(arg)):
                name = "-" + arg[position]
                check_known(name, takes_value)
                if takes_value[name]:  # the rest of the word, else the next one, is its value
                    found[name] = value_of(name, arg[position + 1 :] or None)
                    break
                found[name] = ""
        else:
            operands.append(arg)
    return found, operands


def check_known(name: str, known) -> None:
    """Usage (with a "did you mean" for a slip) unless option ``name`` is one of ``known``."""
    if name in known:
        return
    meant = meant_options(name, known)
    hint = f" (did you mean {meant[0]}?)" if len(meant) == 1 else ""
    raise Usage(f"option {name} not recognized{hint}")


def human_size(n: float) -> str:
    """``1536`` -> ``1.5K`` (powers of 1024, like ``df -h``)."""
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1024 or unit == "T":
            if unit == "":
                return f"{int(n)}"
            return f"{n:.1f}{unit}" if abs(n) < 10 else f"{n:.0f}{unit}"
        n /= 1024
    return f"{n:.0f}T"


def parse_size(text: str) -> int:
    """``64K``, ``1M``, ``4096`` -> bytes; ValueError otherwise."""
    units = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "")
    value = int(number) * units[unit]
    if value <= 0:
        raise ValueError("a size must be positive")
    return value
