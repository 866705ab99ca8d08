"""What a tile mounted besides its own disk, so views of "a tile's files" can leave it out.

``/tiles/N`` on tile 0 and ``/tiles/N`` in the host's FUSE mount both show tile N's *own
disk*. Tile 0's VFS also holds ``/chip`` and ``/tiles`` itself; followed from ``/tiles/0``
those would recurse forever (``/tiles/0/tiles/0/...``, an ``os.walk`` that never ends)
and show the chip disk twice. Each view learns a tile's mount points once, through the
``fs.mounts`` service, and refreshes them whenever it lists that tile's directories.
"""

from __future__ import annotations

__all__ = ["Submounts"]


class Submounts:
    """Per tile: the mount points other than ``/``, as learnt from ``fs.mounts``."""

    def __init__(self):
        self._known: dict[int, tuple[str, ...]] = {}

    def known(self, tile: int) -> tuple[str, ...] | None:
        """What was learnt for ``tile``, or None if nothing yet."""
        return self._known.get(tile)

    def learn(self, tile: int, mounts) -> tuple[str, ...]:
        """Record ``mounts`` (rows of ``fs.mounts``, mount point first) for ``tile``."""
        points = tuple(row[0] for row in mounts if row[0] != "/")
        self._known[tile] = points
        return points

    def hides(self, tile: int, path: str, base: str = "/") -> bool:
        """Is ``path`` (on ``tile``) on another filesystem than ``base``'s, which the view
        shows? ``base`` is the mount the view is showing (``/`` for the tile's own disk)."""
        for point in self._known.get(tile, ()):
            if point != base and (path == point or path.startswith(point + "/")):
                return True
        return False

    def forget(self, tile: int) -> None:
        """``tile``'s mount table has changed: learn it again before the next use."""
        self._known.pop(tile, None)
