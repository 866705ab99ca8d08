"""Tab completion, answered on tile 0: command names, then paths on the chip.

The terminal sends the line up to the cursor; the answer is where the word being
completed starts and the words that could replace it. Directories complete with a
trailing ``/`` (so the next Tab goes inside), files with a space. Characters the parser
treats specially are escaped with ``\\`` so a completed name reads back as itself.
"""

from __future__ import annotations

from ._session import SHELL
from ._table import COMMANDS

__all__ = ["complete", "host_word", "complete_host_path"]

_BREAKS = " \t;>"
_SPECIAL = set(" \t;>|&<'\"\\#*?[`$")


def _escape(text: str) -> str:
    return "".join("\\" + c if c in _SPECIAL else c for c in text)


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
            if char == ";":
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
    if session.mode != SHELL:
        return len(text), []
    start, word, before = _current_word(text)
    if not before.strip():
        names = sorted(name for name in COMMANDS if name.startswith(word))
        return start, [name + " " for name in names]
    spec = COMMANDS.get(before.split()[0])
    after_redirect = before.rstrip().endswith(">")
    if spec is not None and not spec.paths and not after_redirect:
        return start, []
    directory, slash, base = word.rpartition("/")
    directory = directory + slash
    try:
        entries = fs.entries(directory or ".")
    except (OSError, ValueError):
        return start, []
    found = []
    for entry in sorted(entries, key=lambda e: e.name):
        if not entry.name.startswith(base):
            continue
        if entry.name.startswith(".") and not base.startswith("."):
            continue
        found.append(_escape(directory + entry.name) + ("/" if entry.is_dir else " "))
    return start, found


def host_word(text: str) -> tuple[int, str] | None:
    """If the word being completed is a *host* path (``put``'s first operand, ``get``'s
    second), (its start, the word); else None. The terminal completes those itself."""
    start, word, before = _current_word(text)
    words = before.split()
    if words and ((words[0] == "put" and len(words) == 1) or (words[0] == "get" and len(words) == 2)):
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
