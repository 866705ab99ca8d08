"""The ``glob`` module a tile program imports: the host's API over the tile's own files.

Built on the tile's ``os`` module (never the host's), so it sees exactly what the program
sees: its current directory, its mounts, ``/tiles/N`` on tile 0. It behaves as the
host's: ``*``, ``?`` and ``[...]`` within a name, ``**`` across directories with
``recursive=True``, names starting with ``.`` only when the pattern's name does (or
``include_hidden=True``), a trailing ``/`` for directories only, ``root_dir``. There
are no file descriptors on a tile, so ``dir_fd`` is refused.
"""

from __future__ import annotations

import fnmatch
import posixpath
import re
import types

__all__ = ["make_glob_module", "Searcher"]

_MAGIC = re.compile(r"[*?[]")
_MAGIC_BYTES = re.compile(rb"[*?[]")


def has_magic(s) -> bool:
    """Whether ``s`` holds a wildcard (``*``, ``?`` or ``[``)."""
    return (_MAGIC_BYTES if isinstance(s, bytes) else _MAGIC).search(s) is not None


def escape(pathname):
    """``pathname`` with every wildcard character matching only itself."""
    if isinstance(pathname, bytes):
        return _MAGIC_BYTES.sub(rb"[\g<0>]", pathname)
    return _MAGIC.sub(r"[\g<0>]", pathname)


class Searcher:
    """Pattern matching over a tile's ``os`` module: what ``glob`` and ``pathlib`` share.

    Paths come back as the pattern spells them, relative to ``root`` when one is given;
    the directory itself, which ``**`` also matches, comes back as ``""``.
    """

    def __init__(self, os):
        self.os = os

    def search(self, pattern: str, root, dironly: bool, recursive: bool, hidden: bool):
        head, name = posixpath.split(pattern)
        if not has_magic(pattern):
            os = self.os
            if (os.path.lexists(self._at(root, pattern)) if name else os.path.isdir(self._at(root, head))):
                yield pattern
            return
        if not head:
            yield from self._in_directory(root, "", name, dironly, recursive, hidden)
            return
        parents = self.search(head, root, True, recursive, hidden) if has_magic(head) else (head,)
        for parent in parents:
            for found in self._in_directory(root, parent, name, dironly, recursive, hidden):
                yield posixpath.join(parent, found)

    @staticmethod
    def _at(root, path: str) -> str:
        """Where ``path`` (as the pattern spells it) is: under ``root`` if given."""
        if root is None:
            return path or "."
        return posixpath.join(root, path) if path else root

    def _in_directory(self, root, parent: str, name: str, dironly: bool, recursive: bool, hidden: bool):
        """The names in ``parent`` matching the one-component pattern ``name``."""
        where = self._at(root, parent)
        if recursive and name == "**":
            yield ""  # the directory itself
            yield from self._below(where, dironly, hidden)
        elif has_magic(name):
            names = self._names(where, dironly)
            if not (hidden or name.startswith(".")):
                names = [n for n in names if not n.startswith(".")]
            yield from fnmatch.filter(names, name)
        elif self.os.path.lexists(posixpath.join(where, name)) if name else self.os.path.isdir(where):
            yield name

    def _below(self, where: str, dironly: bool, hidden: bool):
        """Every path under ``where``, relative to it (depth first)."""
        for name in self._names(where, dironly):
            if hidden or not name.startswith("."):
                yield name
                for deeper in self._below(posixpath.join(where, name), dironly, hidden):
                    yield posixpath.join(name, deeper)

    def _names(self, where: str, dironly: bool) -> list[str]:
        try:
            with self.os.scandir(where) as entries:
                return [e.name for e in entries if not dironly or e.is_dir()]
        except OSError:  # (not a directory, gone, unreadable: nothing matches there)
            return []


def make_glob_module(os) -> types.ModuleType:
    """A ``glob`` module over ``os`` (a tile's, from ``make_os_module``)."""
    module = types.ModuleType("glob", "Filename globbing on the tile's own files.")
    searcher = Searcher(os)

    def iglob(pathname, *, root_dir=None, dir_fd=None, recursive=False, include_hidden=False):
        """An iterator of the paths matching ``pathname``, in no particular order."""
        if dir_fd is not None:
            raise NotImplementedError("tiles have no file descriptors: pass root_dir instead of dir_fd")
        pathname = os.fspath(pathname)
        root = os.fspath(root_dir) if root_dir is not None else None
        if isinstance(pathname, bytes) or isinstance(root, bytes):
            raise TypeError("tile paths are str, not bytes")
        found = searcher.search(pathname, root, False, recursive, include_hidden)
        return (path for path in found if path)  # ("**" also matches the start itself)

    def glob(pathname, *, root_dir=None, dir_fd=None, recursive=False, include_hidden=False) -> list:
        """The paths matching ``pathname`` (see the module doc)."""
        return list(iglob(pathname, root_dir=root_dir, dir_fd=dir_fd, recursive=recursive,
                          include_hidden=include_hidden))

    module.__dict__.update(glob=glob, iglob=iglob, escape=escape, has_magic=has_magic,
                           __all__=["glob", "iglob", "escape"])
    return module
