"""Tab completion, answered on tile 0: command names, then paths on the chip; in python
and multirepl mode, Python names.

The terminal sends the line up to the cursor; the answer is where the word being
completed starts and the words that could replace it. Directories complete with a
trailing ``/`` (so the next Tab goes inside), files with a space. Characters the parser
treats specially are escaped with ``\\`` so a completed name reads back as itself.

Python names come from the repl's first tile, as Python's own completer finds them (the
names its blocks defined, builtins, keywords; after a dot, the attributes of what the
dotted name before it is), except that the dotted name is looked up without running
anything: no property or ``__getattr__`` of the user's runs because Tab was pressed.
"""

from __future__ import annotations

import builtins
import inspect
import keyword
import re
import shlex

from ._filecmds import natural_order
from ._session import MULTIREPL, PYTHON, SHELL
from ._table import COMMANDS

__all__ = ["complete", "host_word", "complete_host_path"]

#: commands whose paths are directories: files are not offered
_TAKE_DIRECTORIES = frozenset({"cd", "rmdir"})

# as the parser reads a line: a newline ends a command like ';', a CR is a space
_BREAKS = " \t\r\n;>"
_SPECIAL = set(" \t\r\n;>|&<'\"\\#*?[`$")


def _escape(text: str) -> str:
    # (a newline is quoted: a backslash before one joins two lines, as in sh)
    return "".join("'\n'" if c == "\n" else "\\" + c if c in _SPECIAL else c for c in text)


def _current_word(text: str) -> tuple[int, str, str]:
    """(start of the last word, the word unescaped, the text of its command before it)."""
    start = 0
    command_start = 0
    quote = None
    index = 0
    while index < len(text):
        char = text[index]
        if quote:
            if char == quote:
                quote = None
        elif char == "\\":
            index += 1
        elif char in "'\"":
            quote = char
        elif char in _BREAKS:
            start = index + 1
            if char in ";\n":
                command_start = index + 1
        index += 1
    raw = text[start:]
    word = []
    skip = False
    for char in raw:
        if skip:
            word.append(char)
            skip = False
        elif char == "\\":
            skip = True
        elif char not in "'\"":
            word.append(char)
    return start, "".join(word), text[command_start:start]


def complete(fs, session, text: str) -> tuple[int, list[str]]:
    """Completions for the end of ``text`` in ``session`` (``fs``: its SessionFs)."""
    if session.mode == PYTHON or session.mode == MULTIREPL:
        repl = session.python if session.mode == PYTHON else session.repl
        return complete_python(repl.namespace() if repl is not None else {}, text)
    if session.mode != SHELL:
        return len(text), []
    start, word, before = _current_word(text)
    if not before.strip():
        names = sorted(name for name in COMMANDS if name.startswith(word))
        return start, [name + " " for name in names]
    command = before.split()[0]
    spec = COMMANDS.get(command)
    after_redirect = before.rstrip().endswith(">")
    if spec is not None and not spec.paths and not after_redirect:
        return start, []
    directories_only = command in _TAKE_DIRECTORIES and not after_redirect
    directory, slash, base = word.rpartition("/")
    directory = directory + slash
    try:
        entries = fs.entries(directory or ".")
    except (OSError, ValueError):
        return start, []
    found = []
    for entry in sorted(entries, key=natural_order):  # (as ls lists them: /tiles/2 before /tiles/10)
        if not entry.name.startswith(base) or (directories_only and not entry.is_dir):
            continue
        if entry.name.startswith(".") and not base.startswith("."):
            continue
        found.append(_escape(directory + entry.name) + ("/" if entry.is_dir else " "))
    return start, found


#: the dotted name being typed at the end of a line of Python
_DOTTED_NAME = re.compile(r"(?:[A-Za-z_]\w*\.)*[A-Za-z_]?\w*$")


def complete_python(namespace: dict, text: str) -> tuple[int, list[str]]:
    """Completions of the (dotted) name at the end of ``text`` among ``namespace``'s
    names, builtins and keywords, or the attributes of the object before the last dot;
    names starting with ``_`` only if what was typed does."""
    match = _DOTTED_NAME.search(text)
    token = match.group() if match else ""
    if not token or token[:1].isdigit():
        return len(text), []
    tile_builtins = namespace.get("__builtins__", builtins)
    if not isinstance(tile_builtins, dict):
        tile_builtins = vars(tile_builtins)
    head, dot, prefix = token.rpartition(".")
    if dot:
        try:
            target = _look_up(namespace, tile_builtins, head.split("."))
        except (LookupError, AttributeError):
            return match.start(), []
        names = _attributes(target)
        lead = head + "."
    else:
        names = set(namespace) | set(tile_builtins) | set(keyword.kwlist)
        lead = ""
    hidden = not prefix.startswith("_")
    found = sorted(name for name in names
                   if name.startswith(prefix) and not (hidden and name.startswith("_")))
    return match.start(), [lead + name for name in found]


def _look_up(namespace: dict, tile_builtins: dict, names: list[str]):
    target = namespace[names[0]] if names[0] in namespace else tile_builtins[names[0]]
    for name in names[1:]:
        target = inspect.getattr_static(target, name)  # (runs no descriptor)
    return target


def _attributes(target) -> set[str]:
    names = set()
    for source in (target, type(target)):
        try:
            names.update(object.__dir__(source) if not isinstance(source, type) else dir(source))
        except Exception:  # noqa: BLE001 - a strange object: complete what can be found
            pass
    return names


def host_word(text: str) -> tuple[int, str] | None:
    """If the word being completed is a *host* path (``put``'s first operand, ``get``'s
    second, ``multirepl --data``'s), (its start, the word); else None. The terminal
    completes those itself."""
    start, word, before = _current_word(text)
    try:
        words = shlex.split(before)  # (quoted and escaped words as the shell reads them)
    except ValueError:
        return None
    if not words:
        return None
    name, args = words[0], words[1:]
    if name == "multirepl":
        if args and args[-1] == "--data":
            return start, word
        if word.startswith("--data="):
            return start + len("--data="), word[len("--data="):]
        return None
    if "--" in args:  # (the first ends the options: it is no operand)
        args.remove("--")
    if (name == "put" and not args) or (name == "get" and len(args) == 1):
        return start, word
    return None


def complete_host_path(word: str, listdir) -> list[str]:
    """Completions of a host path (``listdir(directory)`` lists (name, is_dir) pairs)."""
    directory, slash, base = word.rpartition("/")
    directory = directory + slash
    try:
        entries = listdir(directory or ".")
    except OSError:
        return []
    return [_escape(directory + name) + ("/" if is_dir else " ")
            for name, is_dir in sorted(entries)
            if name.startswith(base) and (base.startswith(".") or not name.startswith("."))]
