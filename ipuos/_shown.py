"""Untrusted text (a program's name, a name read from an image) as a line of a table or
listing may show it."""

from __future__ import annotations


def shown(text: str) -> str:
    """``text`` with the characters that are not printable (escape sequences that would
    drive a terminal, newlines that would fake another row) spelled out, like ``\\x1b``;
    a backslash doubled, so that ``a\\nb`` and ``a<newline>b`` cannot look alike."""
    if text.isprintable() and "\\" not in text:
        return text
    return "".join(c if c.isprintable() and c != "\\" else c.encode("unicode_escape").decode("ascii")
                   for c in text)
