"""A count and its noun in agreement, for messages: "1 file", "2 files", "0 files"."""

from __future__ import annotations

__all__ = ["plural"]


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``count`` and ``noun``, the plural unless ``count`` is 1: ``nouns`` when adding
    "s" is wrong, or a verb must agree too (``plural(n, "file is", "files are")``)."""
    return f"{count} {noun if count == 1 else nouns if nouns is not None else noun + 's'}"
