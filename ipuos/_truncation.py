"""The note that ends a tile's output cut short, and reading it back.

Kept apart from the runtime that writes it: the shell, a layer above the machine core,
takes the note off output going into a file (it is no part of what the program printed).
"""

from __future__ import annotations

import re

from ._plural import plural

__all__ = ["truncation_note", "split_truncation"]


def truncation_note(dropped: int, why: str = "") -> str:
    """The line that ends a tile's output cut short: how many characters are not shown."""
    return f"[output truncated{why}: {plural(dropped, 'more character')}]\n"


#: the last line of a tile's output that ends with :func:`truncation_note`
_TRUNCATION_NOTE = re.compile(r"\[output truncated[^:\]\n]*: (\d+) more characters?\]\n")


def split_truncation(text: str) -> tuple[str, int]:
    """``text`` without the truncation note it ends with, and the characters that note
    counts (0 if none): text cut again counts those too, in one note. (Only the last
    line is looked at: outputs are large.)"""
    if not text.endswith("]\n"):
        return text, 0
    start = text.rfind("\n", 0, len(text) - 1) + 1
    note = _TRUNCATION_NOTE.fullmatch(text, start)
    if note is None:
        return text, 0
    body = text[:start]
    return (body[:-1] if body.endswith("\n") else body), int(note[1])
