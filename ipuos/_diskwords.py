"""How reports name tile disks and what a backup lacks of them, tile ranges together.

Shared by the daemon's refusals (``halt --if-saved``) and the CLI's notes after a backup,
so that what 1,472 tiles have alike is one clause, not 1,472. Light on purpose: every
CLI command imports it.
"""

from __future__ import annotations

from ._plural import plural
from ._tilespec import describe_tiles, tiles_alike


_ENTRY, _ENTRIES = "file or directory", "files and directories"


def times_alike(unwritten: dict) -> list[tuple[list[int], str, str]]:
    """(tiles, mount, how many entries) of ``{(tile, mount): entries}`` whose mtimes a full
    disk had no room for, the tiles of each mount together: ``"17 to 20 files and
    directories each"`` (a directory's time changes with every entry made in it)."""
    told = []
    for tiles, mount in tiles_alike(sorted((tile, mount) for tile, mount in unwritten)):
        counts = [unwritten[tile, mount] for tile in tiles]
        low, high = min(counts), max(counts)
        if len(tiles) == 1:
            files = plural(low, _ENTRY, _ENTRIES)
        else:
            files = (f"{plural(low, _ENTRY, _ENTRIES)} each" if low == high
                     else f"{low} to {high} {_ENTRIES} each")
        told.append((tiles, mount, files))
    return told


def disks_of(mount: str, tiles: list[int]) -> str:
    """``the disk of tile 3``, ``the disks of tiles 0-15``, ``/img of tile 2``."""
    if mount == "/":
        return f"the disk{'s' if len(tiles) > 1 else ''} of {describe_tiles(tiles)}"
    return f"{mount} of {describe_tiles(tiles)}"
