"""The mount table: which backend serves which part of a tile's tree.

Mount points are canonical absolute paths; a path belongs to the mount with the longest
mount point that is the path itself or one of its parent directories ("longest prefix",
compared by whole names: ``/chipper`` is not under ``/chip``). Mount points need no
directory underneath them: they appear in their parent's listing all the same, and
cannot be removed or renamed while mounted (EBUSY), as on POSIX.
"""

from __future__ import annotations

import errno
import itertools

from ._backend import fs_error
from ._paths import is_within, parent_and_name

__all__ = ["Mount", "MountTable"]

_device_ids = itertools.count(1)


class Mount:
    """One entry of the table. ``device`` tells mounts apart in ``st_dev``."""

    __slots__ = ("path", "backend", "readonly", "owns", "device")

    def __init__(self, path: str, backend, readonly: bool, owns: bool):
        self.path = path
        self.backend = backend
        self.readonly = readonly
        #: unmounting also detaches the backend (it was made for this mount)
        self.owns = owns
        self.device = next(_device_ids)

    def __repr__(self) -> str:
        ro = " ro" if self.readonly else ""
        return f"<Mount {self.path} {self.backend.kind}{ro}>"


class MountTable:
    def __init__(self):
        self._mounts: dict[str, Mount] = {}
        self._longest_first: list[Mount] = []
        #: bumped on every change, so resolution caches know to start over
        self.generation = 0

    def __iter__(self):
        return iter(sorted(self._mounts.values(), key=lambda m: m.path))

    def __len__(self) -> int:
        return len(self._mounts)

    def get(self, path: str) -> Mount | None:
        """The mount whose mount point is exactly ``path``."""
        return self._mounts.get(path)

    def add(self, path: str, backend, *, readonly: bool = False, owns: bool = False) -> Mount:
        if path in self._mounts:
            raise fs_error(errno.EBUSY, path, "something is already mounted here")
        mount = Mount(path, backend, readonly, owns)
        self._mounts[path] = mount
        self._changed()
        return mount

    def remove(self, path: str) -> Mount:
        """Take the mount at ``path`` out of the table (the caller checked it may go)."""
        mount = self._mounts.pop(path, None)
        if mount is None:
            raise fs_error(errno.EINVAL, path, "not a mount point")
        self._changed()
        return mount

    def resolve(self, path: str) -> tuple[Mount, str]:
        """(mount, path inside it) for a canonical path."""
        for mount in self._longest_first:
            top = mount.path
            if top == "/":
                return mount, path
            if path == top:
                return mount, "/"
            if path.startswith(top) and path[len(top)] == "/":
                return mount, path[len(top):]
        raise fs_error(errno.ENOENT, path, "no filesystem is mounted here")

    def children(self, directory: str) -> list[str]:
        """Names of the mount points directly inside ``directory``."""
        names = []
        for top in self._mounts:
            if top != "/":
                parent, name = parent_and_name(top)
                if parent == directory:
                    names.append(name)
        return names

    def mounted_below(self, path: str) -> bool:
        """True if a mount point is ``path`` or lies under it."""
        return any(top != "/" and is_within(top, path) for top in self._mounts)

    def _changed(self) -> None:
        self._longest_first = sorted(self._mounts.values(), key=lambda m: len(m.path), reverse=True)
        self.generation += 1
