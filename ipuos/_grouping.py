"""Grouping per-tile texts: IPUpy's multirepl output, ordered by count, with tile ranges.

A 1472-tile program that prints its tile id produces 1472 lines nobody reads; one that
prints the same thing everywhere should show it once. So identical texts are shown once
with how many tiles produced them and which, the most frequent first. Past a cap on the
groups shown, those of failed tiles are the last to be left out: the one tile whose
traceback says what went wrong is rarely among the most frequent texts.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ._plural import plural
from ._tilespec import format_tiles


@dataclass(frozen=True)
class OutputGroup:
    text: str
    tiles: tuple[int, ...]
    #: its tiles failed (an error, an abort, an interrupt, a non-zero exit)
    failed: bool = False
    #: what the header adds about the tiles when their text cannot say it (``exit code 3``)
    note: str = ""

    @property
    def count(self) -> int:
        """How many tiles printed this text."""
        return len(self.tiles)

    @property
    def tile_ranges(self) -> str:
        """The tiles as a spec, e.g. ``0-4:2,9``."""
        return format_tiles(self.tiles)

    def header(self) -> str:
        """The group's first line: ``[3 tiles: 0-4:2]`` (with a note: ``[1 tile: 5, exit
        code 3]``). Tiles that make no regular
        pattern can make thousands of ranges: past :data:`HEADER_RANGES_MAX` characters
        the list is cut at a comma and says how many ranges it leaves out (the whole list
        is ``tile_ranges``, and in ``--json``)."""
        ranges = self.tile_ranges
        if len(ranges) > HEADER_RANGES_MAX:
            kept = ranges[:HEADER_RANGES_MAX].rpartition(",")[0]
            left = ranges.count(",") - kept.count(",")
            ranges = f"{kept},... (+{plural(left, 'more range')})"
        note = f", {self.note}" if self.note else ""
        return f"[{plural(self.count, 'tile')}: {ranges}{note}]"


#: characters of tile ranges a group header shows (two lines of a wide terminal)
HEADER_RANGES_MAX = 200


def group_texts(texts: dict[int, str] | list[str], failed: Collection[int] = (),
                notes: dict[int, str] | None = None) -> list[OutputGroup]:
    """Group ``{tile: text}`` (or a list indexed by tile) by identical text; the tiles in
    ``failed`` make groups of their own, marked ``failed``, and so do tiles with different
    ``notes`` (``{tile: note}`` for the header, see :attr:`OutputGroup.note`).

    Most frequent first; ties keep the order of their lowest tile.
    """
    items = texts.items() if isinstance(texts, dict) else enumerate(texts)
    notes = notes or {}
    by_text: dict[tuple[str, bool, str], list[int]] = {}
    for tile, text in items:
        by_text.setdefault((text, tile in failed, notes.get(tile, "")), []).append(tile)
    groups = [OutputGroup(text, tuple(sorted(tiles)), tiles_failed, note)
              for (text, tiles_failed, note), tiles in by_text.items()]
    groups.sort(key=lambda g: (-g.count, g.tiles[0]))
    return groups


def format_groups(
    groups: list[OutputGroup], max_groups: int | None = 20, skip_empty: bool = True
) -> str:
    """Render groups as text, at most ``max_groups`` of them (None: all) and an ``N more
    distinct outputs`` line for the rest. Failed groups are kept before any other, so
    that a run which failed shows why; the groups shown keep their order."""
    if max_groups is not None and (type(max_groups) is not int or max_groups < 0):
        raise ValueError(f"max_groups is a count of groups (0 or more) or None, not {max_groups!r}")
    shown = [g for g in groups if g.text or g.note or not skip_empty]
    hidden: list[OutputGroup] = []
    if max_groups is not None and len(shown) > max_groups:
        failed_first = sorted(range(len(shown)), key=lambda i: not shown[i].failed)  # (stable)
        kept = set(failed_first[:max_groups])
        hidden = [g for i, g in enumerate(shown) if i not in kept]
        shown = [g for i, g in enumerate(shown) if i in kept]
    lines: list[str] = []
    for group in shown:
        lines.append(group.header())
        if group.text:  # (a group shown for its note alone has no text line)
            # the newline ending the text ends its last line here; blank lines it printed
            # after that stay
            lines.append(group.text[:-1] if group.text.endswith("\n") else group.text)
    if hidden:
        tiles = sum(g.count for g in hidden)
        failed = sum(g.count for g in hidden if g.failed)
        lines.append(f"... {plural(len(hidden), 'more distinct output')} from {plural(tiles, 'tile')}"
                     + (f" ({failed} failed)" if failed else ""))
    return "\n".join(lines) + ("\n" if lines else "")
