"""What a tile mounted besides its own disk, so views of "a tile's files" can leave it out.

``/tiles/N`` on tile 0 and ``/tiles/N`` in the host's FUSE mount both show tile N's *own
disk*. Tile 0's VFS also holds ``/chip`` and ``/tiles`` itself; followed from ``/tiles/0``
those would recurse forever (``/tiles/0/tiles/0/...``, an ``os.walk`` that never ends)
and show the chip disk twice. Each view learns a tile's mount points through the
``fs.mounts`` service and keeps them until the tile's mount table changes: a view given
the machine's change feed sees that in :meth:`ChangeFeed.mounts_version
<ipuos.vfs._changes.ChangeFeed.mounts_version>`; one without calls :meth:`Submounts.forget`.
"""

from __future__ import annotations

import errno

__all__ = ["Submounts"]


class Submounts:
    """Per tile: the mount points other than ``/``, as learnt from ``fs.mounts``.

    ``changes``: the machine's ``ChangeFeed``; what was learnt of a tile then counts as
    unknown once the tile's mount table has changed. Without it, only :meth:`forget`
    drops what was learnt."""

    def __init__(self, changes=None):
        #: tile -> (the mount table's version when asked, its mount points)
        self._known: dict[int, tuple[int, tuple[str, ...]]] = {}
        self._changes = changes

    def _version(self, tile: int) -> int:
        return 0 if self._changes is None else self._changes.mounts_version(tile)

    def known(self, tile: int) -> tuple[str, ...] | None:
        """What was learnt for ``tile``, or None if nothing yet or its mounts changed since."""
        learnt = self._known.get(tile)
        if learnt is None or learnt[0] != self._version(tile):
            return None
        return learnt[1]

    def learn(self, tile: int, mounts) -> tuple[str, ...]:
        """Record ``mounts`` (rows of ``fs.mounts``, mount point first) for ``tile``."""
        return self._record(tile, self._version(tile), mounts)

    def refresh(self, tile: int, ask) -> tuple[str, ...]:
        """``tile``'s mount points: as learnt, or ``ask(tile)`` (rows of ``fs.mounts``)
        if nothing current is known."""
        points = self.known(tile)
        if points is None:
            version = self._version(tile)  # before asking: a change meanwhile asks again
            points = self._record(tile, version, ask(tile))
        return points

    def _record(self, tile: int, version: int, mounts) -> tuple[str, ...]:
        points = tuple(row[0] for row in mounts if row[0] != "/")
        self._known[tile] = (version, points)
        return points

    def hides(self, tile: int, path: str, base: str = "/") -> bool:
        """Is ``path`` (on ``tile``) on another filesystem than ``base``'s, which the view
        shows? ``base`` is the mount the view is showing (``/`` for the tile's own disk)."""
        learnt = self._known.get(tile)
        for point in learnt[1] if learnt is not None else ():
            if point != base and (path == point or path.startswith(point + "/")):
                return True
        return False

    def hidden_errno(self, tile: int, path: str, base: str = "/", *, changing: bool = False) -> int | None:
        """How a view answers for ``path`` (on ``tile``): None if it shows it. A hidden
        path is ENOENT (the view does not show it, nor anything below it), except that
        creating, removing or renaming the name of a mount point itself (``changing``) is
        EBUSY: the name is taken by something mounted there, as rmdir(2) and rename(2)
        of a mount point answer; ENOENT would say the name is free, and the user could
        not tell why making it fails."""
        if not self.hides(tile, path, base):
            return None
        return errno.EBUSY if changing and self.is_mount_point(tile, path) else errno.ENOENT

    def is_mount_point(self, tile: int, path: str) -> bool:
        """Is ``path`` (a trailing slash or not) one of the mount points learnt for ``tile``?"""
        learnt = self._known.get(tile)
        return learnt is not None and (path.rstrip("/") or "/") in learnt[1]

    def forget(self, tile: int) -> None:
        """``tile``'s mount table has changed: learn it again before the next use."""
        self._known.pop(tile, None)
