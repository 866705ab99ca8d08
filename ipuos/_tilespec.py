"""Tile specifications like ``0-99,200,300-310`` and their inverse for reports."""

from __future__ import annotations

import operator
from collections.abc import Hashable, Iterable


class TileSpecError(ValueError):
    """A tile specification that does not parse or names tiles the machine lacks."""


def parse_tiles(spec: str | Iterable[int] | None, ntiles: int) -> list[int]:
    """Parse ``spec`` into a sorted list of distinct tile ids below ``ntiles``.

    ``None``, ``"all"`` and ``"*"`` mean every tile. Ranges are inclusive. Integers and
    iterables of integers are accepted too, so the Python API and the CLI share one check.
    """
    if spec is None:
        return list(range(ntiles))
    one = _tile_id(spec)
    if one is not None:
        tiles = [one]
    elif isinstance(spec, str):
        tiles = _parse_text(spec, ntiles)
    elif isinstance(spec, (bytes, bytearray, memoryview)):  # (iterating gives byte values)
        raise TileSpecError(f"tiles are a spec like '0-15' (a str), not {type(spec).__name__}")
    elif isinstance(spec, range) and spec and not (  # (not len(): it may overflow)
            0 <= min(spec[0], spec[-1]) and max(spec[0], spec[-1]) < ntiles):
        # (checked by its ends, not listed first: it may be huge)
        low, high = min(spec[0], spec[-1]), max(spec[0], spec[-1])
        raise TileSpecError(f"no tile {low if low < 0 else high} on this machine: it has tiles 0-{ntiles - 1}")
    else:
        try:
            tiles = list(spec)
        except TypeError:  # (True, 2.0: not a tile id, nor a set of them)
            raise TileSpecError(f"tiles are a spec like '0-15', a tile id or ids, not {spec!r}") from None
        for i, tile in enumerate(tiles):
            tiles[i] = _tile_id(tile)
            if tiles[i] is None:
                raise TileSpecError(f"tile ids must be integers, not {tile!r}")
    bad = [t for t in tiles if not 0 <= t < ntiles]
    if bad:
        raise TileSpecError(
            f"no tile {bad[0]} on this machine: it has tiles 0-{ntiles - 1}"
        )
    if not tiles:
        raise TileSpecError("the tile specification selects no tiles")
    return sorted(set(tiles))


def _tile_id(value) -> int | None:
    """``value`` as a tile id, or None if it is not an integer. Any integer will do
    (numpy's, from an array of ids; an IntEnum), as for a list index; a bool will not:
    it is a slip far more often than a tile number."""
    if type(value) is int:
        return value
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:  # (not an integer; an array of them is iterated instead)
        return None


#: digits a number in a tile spec may be written with, leading zeros too (beyond any
#: machine; int() refuses 4300 digits and more, zeros or not)
_DIGITS_MAX = 18


def tile_of_name(name: str) -> int | None:
    """The tile a tile's *name* spells (``/tiles/7``, the image device ``7`` for
    ``tile/7/disk``), or None: a canonical decimal number, so that each tile has one name
    ("07", "+7", " 7" and "٧" name none). Whether the machine has that tile is the
    caller's to check. (Numbers in a tile *spec*, ``--tiles 007``, may have leading zeros.)"""
    if name.isascii() and name.isdigit() and (name == "0" or name[0] != "0") and len(name) <= _DIGITS_MAX:
        return int(name)
    return None


def _parse_text(spec: str, ntiles: int) -> list[int]:
    text = spec.strip()
    if text in ("all", "*"):
        return list(range(ntiles))
    if not text:
        raise TileSpecError("empty tile specification; use e.g. 0-15,20 or all")
    tiles: list[int] = []
    for part in text.split(","):
        tiles.extend(_parse_part(spec, part.strip(), ntiles))
    return tiles


def _parse_part(spec: str, part: str, ntiles: int) -> range:
    span, colon, step_text = part.partition(":")
    lo, dash, hi = span.partition("-")
    numbers = [lo, hi] if dash else [lo]
    if colon:
        numbers.append(step_text)
    if not all(n.strip().isascii() and n.strip().isdigit() for n in numbers) or (colon and not dash):
        raise TileSpecError(
            f"bad tile specification {spec!r}: {part!r} is not a tile id or a range "
            "like 0-15 (or 0-14:2 for every second tile)"
        )
    if any(len(n.strip()) > _DIGITS_MAX for n in numbers):
        raise TileSpecError(
            f"bad tile specification {spec[:40]!r}{'...' if len(spec) > 40 else ''}: a number in it "
            f"has far too many digits (this machine has tiles 0-{ntiles - 1})"
        )
    first = int(lo)
    last = int(hi) if dash else first
    step = int(step_text) if colon else 1
    if step < 1:
        raise TileSpecError(f"bad tile specification {spec!r}: the step in {part!r} must be at least 1")
    if last < first:
        raise TileSpecError(f"bad tile specification {spec!r}: range {part!r} runs backwards")
    if last >= ntiles:
        raise TileSpecError(
            f"bad tile specification {spec!r}: no tile {last} on this machine "
            f"(it has tiles 0-{ntiles - 1})"
        )
    return range(first, last + 1, step)


def format_tiles(tiles: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 9, 11]`` -> ``"0-2,5-11:2"``; the inverse of :func:`parse_tiles`.

    Runs of consecutive ids become ``a-b``; runs of three or more with a constant larger
    step become ``a-b:step``, so tiles 0,3,6,...,1470 read ``0-1470:3``.
    """
    ordered = sorted(set(tiles))
    parts: list[str] = []
    i, n = 0, len(ordered)
    while i < n:
        j = i
        if i + 1 < n:
            step = ordered[i + 1] - ordered[i]
            while j + 1 < n and ordered[j + 1] - ordered[j] == step:
                j += 1
            if step > 1 and j - i < 2:
                j = i  # two ids with a gap are clearer as a list
        first, last = ordered[i], ordered[j]
        if i == j:
            parts.append(str(first))
        elif ordered[i + 1] - first == 1:
            parts.append(f"{first}-{last}")
        else:
            parts.append(f"{first}-{last}:{ordered[i + 1] - first}")
        i = j + 1
    return ",".join(parts)


def describe_tiles(tiles: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"tiles 0-2,5"`` (``"tile 3"`` for one, ``"no tile"`` for none)."""
    ordered = sorted(set(tiles))
    return f"tile{'s' if len(ordered) != 1 else ''} {format_tiles(ordered)}" if ordered else "no tile"


def tiles_alike(pairs: Iterable[tuple[int, Hashable]]) -> list[tuple[list[int], Hashable]]:
    """``(tile, what)`` pairs grouped by ``what``, each with its tiles, in the order each
    ``what`` first comes: what 1,472 tiles have alike is told once, for their range."""
    groups: dict = {}
    for tile, what in pairs:
        groups.setdefault(what, []).append(tile)
    return [(tiles, what) for what, tiles in groups.items()]
