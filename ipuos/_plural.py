"""Counts and lists worded for messages: "1 file", "2 files"; "a, b and 3 more"."""

from __future__ import annotations

__all__ = ["first_few", "plural"]


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``count`` and ``noun``, the plural unless ``count`` is 1: ``nouns`` when adding
    "s" is wrong, or a verb must agree too (``plural(n, "file is", "files are")``)."""
    return f"{count} {noun if count == 1 else nouns if nouns is not None else noun + 's'}"


def first_few(names: list[str], shown: int) -> str:
    """The first ``shown`` of ``names``, comma-separated, and how many more there are:
    a message names some of a long list without running on ("" for none)."""
    rest = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {rest} more" if rest > 0 else "")
