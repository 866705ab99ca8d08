"""Every current directory on a tile, so that no filesystem is unmounted from under one.

umount(8) refuses a busy target, and so does :meth:`Vfs.umount <ipuos.vfs.Vfs.umount>`:
a program, a repl between two blocks or a shell standing in a directory of the mount
would go on with relative paths that silently reach whatever the mount had covered. So
each of them registers here, in its tile's ``kernel_data``, for as long as it lasts: an
object whose ``cwd`` is its current directory (canonical, read when asked), with what
to tell a user who wants the mount gone.
"""

from __future__ import annotations

from typing import Callable

from ._paths import is_within

__all__ = ["WorkingDirectories", "working_directories", "busy_reason"]

#: where a tile keeps its :class:`WorkingDirectories`
_KEY = "vfs.cwds"


class WorkingDirectories:
    """Who has a current directory on one tile. Only that tile's greenlet or the
    scheduler thread touches it."""

    __slots__ = ("_holders",)

    def __init__(self):
        #: id(holder) -> (holder, why it makes a mount busy: a str, or a callable making one)
        self._holders: dict[int, tuple[object, str | Callable[[], str]]] = {}

    def add(self, holder, reason: str | Callable[[], str]) -> None:
        """``holder.cwd`` makes any mount it is in busy, ``reason`` says why, until
        :meth:`discard`."""
        self._holders[id(holder)] = (holder, reason)

    def discard(self, holder) -> None:
        self._holders.pop(id(holder), None)

    def busy(self, path: str) -> str | None:
        """Why the mount at canonical ``path`` is busy, or None if no current directory
        is in it."""
        for holder, reason in self._holders.values():
            if is_within(holder.cwd, path):
                return reason() if callable(reason) else reason
        return None


def working_directories(tile) -> WorkingDirectories:
    """``tile``'s current directories (made on first use)."""
    return tile.kernel_state(_KEY, WorkingDirectories)


def busy_reason(owner, path: str) -> str | None:
    """Why the mount at canonical ``path`` of ``owner``'s VFS is busy with a current
    directory, or None (an owner that is no tile has none registered)."""
    data = getattr(owner, "kernel_data", None)
    cwds = data.get(_KEY) if data is not None else None
    return cwds.busy(path) if cwds is not None else None
