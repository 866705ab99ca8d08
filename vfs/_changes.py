"""Change notices: a tile's filesystems tell whoever watches them what changed.

The host's FUSE mount keeps what it has learnt about tile files (their attributes, which
names a directory holds) so that it need not ask the owner tile again for every lookup.
That is only right if it hears of *every* change, whoever makes it: a tile program, the
shell, another host client, the mount itself. So the filesystems report their changes
here, and a mount subscribes.

* :class:`ChangeFeed`: one per machine (``Storage.changes``). ``watch(fn)`` subscribes;
  ``fn(tile, kind, path, path2)`` is then called for every change, with ``path`` (and
  ``path2`` for a rename) absolute in the tile's VFS (``/a/b`` on its own disk,
  ``/chip/a`` on the chip disk).
* :class:`ChangeSource`: what a watched littlefs backend holds (``backend.changes``): the
  feed, the owner tile and where the backend is mounted. Backends nobody may watch have
  ``changes = None``.

When they are sent, and what that promises:

* A notice is sent by the owner tile, on its own greenlet, **after** the change is made and
  before the owner serves any other request (the ownership rule: a tile serves requests
  only between its own filesystem operations). Whoever asks the tile after the notice
  therefore sees the change, and an answer the tile gave before it is older than it.
* Only changes others can see are reported, at the moment they can see them: a file's
  writes when they are committed (flush, fsync, close), not each ``write``; a created
  file when ``open`` creates it (littlefs commits the name at once).
* Watchers run on the scheduler thread: they must be quick and must never block (no
  locks held by threads that wait for tiles, no I/O). Copy the notice and return.

Kinds: ``CHANGED`` (contents, size or mtime of ``path``), ``ADDED_FILE`` (``path`` was
created), ``ADDED_DIR`` (a new, empty directory), ``REMOVED`` (``path`` is gone),
``MOVED`` (``path`` renamed to ``path2``, replacing what was there), ``RESET`` (anything at
and below ``path`` may have changed: a mount or an unmount there, a restore, a remount
after a device error). ``ADDED_*``, ``REMOVED`` and ``MOVED`` change the parent
directories' mtimes too.

With no watcher, a notice costs the backend one attribute check and a call that returns.
"""

from __future__ import annotations

import threading

__all__ = ["ChangeFeed", "ChangeSource", "CHANGED", "ADDED_FILE", "ADDED_DIR", "REMOVED", "MOVED",
           "RESET"]

CHANGED = "changed"
ADDED_FILE = "added-file"
ADDED_DIR = "added-dir"
REMOVED = "removed"
MOVED = "moved"
RESET = "reset"


class ChangeFeed:
    """Where one machine's filesystems report their changes (see module doc)."""

    def __init__(self):
        #: the subscribers, replaced (never changed in place) so a notice being sent on the
        #: scheduler thread always goes to a consistent set
        self.watchers: tuple = ()
        self._lock = threading.Lock()
        #: per tile: how many times its mount table has changed (see :meth:`mounts_version`)
        self._mount_changes: dict[int, int] = {}

    def watch(self, watcher) -> None:
        """Call ``watcher(tile, kind, path, path2)`` for every change from now on."""
        with self._lock:
            self.watchers = self.watchers + (watcher,)

    def unwatch(self, watcher) -> None:
        """Stop calling ``watcher`` (a notice being sent right now may still reach it)."""
        with self._lock:
            self.watchers = tuple(w for w in self.watchers if w != watcher)  # (bound methods are new each time)

    def source(self, tile: int, mount_point: str) -> "ChangeSource":
        """What a backend owned by ``tile`` and mounted at ``mount_point`` reports through."""
        return ChangeSource(self, tile, mount_point)

    def reset(self, tile: int, mount_point: str = "/") -> None:
        """Everything on ``tile`` at and below ``mount_point`` may have changed, because
        ``tile``'s mount table has: a mount or an unmount there, or the tile's VFS being
        dropped for a restore (a filesystem that changes under its mount point reports
        ``RESET`` through its :class:`ChangeSource` instead)."""
        self._mount_changes[tile] = self._mount_changes.get(tile, 0) + 1
        self.emit(tile, RESET, mount_point)

    def mounts_version(self, tile: int) -> int:
        """A number that changes whenever ``tile``'s mount table does: what a view that
        keeps the tile's mount points compares (see ``_submounts``). A counter rather than
        a watcher, so that every other notice costs nothing more."""
        return self._mount_changes.get(tile, 0)

    def emit(self, tile: int, kind: str, path: str, path2: str | None = None) -> None:
        for watcher in self.watchers:
            watcher(tile, kind, path, path2)


class ChangeSource:
    """A watched backend's end of the feed: paths inside the backend become VFS paths."""

    __slots__ = ("feed", "tile", "base")

    def __init__(self, feed: ChangeFeed, tile: int, mount_point: str):
        self.feed = feed
        self.tile = tile
        self.base = "" if mount_point == "/" else mount_point.rstrip("/")

    def emit(self, kind: str, path: str, path2: str | None = None) -> None:
        """Report a change of ``path`` (inside the backend; a trailing slash is ignored)."""
        watchers = self.feed.watchers
        if not watchers:
            return
        path = self.base + (path.rstrip("/") if path != "/" else "") or "/"
        if path2 is not None:
            path2 = self.base + (path2.rstrip("/") if path2 != "/" else "") or "/"
        for watcher in watchers:
            watcher(self.tile, kind, path, path2)
