"""The ``pathlib`` module a tile program imports: ``Path`` over the tile's own files.

``Path`` (also ``PosixPath``) is the host's ``PurePosixPath`` (all path arithmetic:
``/``, ``parent``, ``suffix``, ``with_name``, ``relative_to`` ...) plus the file methods,
each through the tile's ``open`` and ``os``, never the host's: ``open``, ``read_text``,
``write_bytes``, ``stat``, ``exists``, ``is_dir``, ``iterdir``, ``glob``, ``rglob``,
``walk``, ``mkdir``, ``touch``, ``unlink``, ``rmdir``, ``rename``, ``replace``,
``resolve``, ``samefile`` .... The class is made per program run, bound to that tile.

Tile files have no owners, permission bits or links: ``chmod``, ``owner``,
``symlink_to`` and the like raise NotImplementedError saying so; there is no home
directory, so ``Path.home()`` is a RuntimeError and ``expanduser`` changes nothing.
``PurePath``, ``PurePosixPath`` and ``PureWindowsPath`` are the host's (they touch no
files).
"""

from __future__ import annotations

import pathlib
import posixpath
import types

from ._tileglob import Searcher

__all__ = ["make_pathlib_module"]

#: what tile files do not have, and so Path cannot do
_UNSUPPORTED = {
    "chmod": "permission bits", "lchmod": "permission bits", "owner": "owners",
    "group": "groups", "readlink": "symbolic links", "symlink_to": "symbolic links",
    "hardlink_to": "hard links", "link_to": "hard links",
}


def _unsupported(name: str, lacks: str):
    def method(self, *args, **kwargs):
        raise NotImplementedError(f"Path.{name}() is unsupported on a tile: its files have no {lacks}")
    method.__name__ = method.__qualname__ = name
    return method


def make_pathlib_module(os, open) -> types.ModuleType:
    """A ``pathlib`` module over a tile's ``os`` module and ``open``."""
    module = types.ModuleType("pathlib", "Object-oriented paths to the tile's own files.")
    searcher = Searcher(os)

    class Path(pathlib.PurePosixPath):
        """A path on this tile, with methods that use its files."""

        __slots__ = ()

        # -- where -------------------------------------------------------------------------

        @classmethod
        def cwd(cls):
            return cls(os.getcwd())

        @classmethod
        def home(cls):
            raise RuntimeError("Could not determine home directory: tiles have none")

        def absolute(self):
            return self if self.is_absolute() else type(self)(os.getcwd(), self)

        def resolve(self, strict: bool = False):
            if strict:
                os.stat(self)  # (FileNotFoundError if it is not there)
            return type(self)(os.path.realpath(self))

        def expanduser(self):
            return self

        def samefile(self, other_path) -> bool:
            return os.path.samefile(self, other_path)

        # -- what is there -----------------------------------------------------------------

        def stat(self, *, follow_symlinks: bool = True):
            return os.stat(self)

        def lstat(self):
            return os.stat(self)

        def exists(self, *, follow_symlinks: bool = True) -> bool:
            return os.path.exists(self)

        def is_dir(self) -> bool:
            return os.path.isdir(self)

        def is_file(self) -> bool:
            return os.path.isfile(self)

        def is_mount(self) -> bool:
            return os.path.ismount(self)

        def _never(self) -> bool:  # (no links, devices, pipes or sockets on a tile)
            return False

        is_symlink = is_junction = is_block_device = is_char_device = is_fifo = is_socket = _never

        def iterdir(self):
            for name in os.listdir(self):
                yield self / name

        def glob(self, pattern):
            """The paths under this one matching ``pattern`` (``**``: any directories,
            itself included); names starting with ``.`` match too, as on the host."""
            pattern = _relative_pattern(pattern)
            dirs = posixpath.basename(pattern) == "**"  # ("**" last matches directories)
            found = searcher.search(pattern + "/" if dirs else pattern, os.fspath(self), False, True, True)
            for path in found:
                yield self / path.rstrip("/") if path else self

        def rglob(self, pattern):
            """:meth:`glob` of ``pattern`` in this directory and every one below it."""
            return self.glob("**/" + _relative_pattern(pattern))

        def walk(self, top_down: bool = True, on_error=None, follow_symlinks: bool = False):
            for where, dirnames, filenames in os.walk(self, topdown=top_down, onerror=on_error):
                yield type(self)(where), dirnames, filenames

        # -- contents ----------------------------------------------------------------------

        def open(self, mode: str = "r", buffering: int = -1, encoding=None, errors=None, newline=None):
            return open(self, mode, buffering, encoding, errors, newline)

        def read_bytes(self) -> bytes:
            with self.open("rb") as f:
                return f.read()

        def read_text(self, encoding=None, errors=None) -> str:
            with self.open("r", encoding=encoding, errors=errors) as f:
                return f.read()

        def write_bytes(self, data) -> int:
            view = memoryview(data)  # (TypeError for anything not bytes-like, before opening)
            with self.open("wb") as f:
                return f.write(view)

        def write_text(self, data, encoding=None, errors=None, newline=None) -> int:
            if not isinstance(data, str):
                raise TypeError(f"data must be str, not {type(data).__name__}")
            with self.open("w", encoding=encoding, errors=errors, newline=newline) as f:
                return f.write(data)

        # -- changes -----------------------------------------------------------------------

        def touch(self, mode: int = 0o666, exist_ok: bool = True) -> None:
            if exist_ok:
                try:
                    os.utime(self)
                    return
                except FileNotFoundError:
                    pass
            with self.open("ab" if exist_ok else "xb"):
                pass

        def mkdir(self, mode: int = 0o777, parents: bool = False, exist_ok: bool = False) -> None:
            try:
                os.mkdir(self, mode)
            except FileNotFoundError:
                if not parents or self.parent == self:
                    raise
                self.parent.mkdir(parents=True, exist_ok=True)
                self.mkdir(mode, parents=False, exist_ok=exist_ok)
            except OSError:
                if not exist_ok or not self.is_dir():
                    raise

        def rmdir(self) -> None:
            os.rmdir(self)

        def unlink(self, missing_ok: bool = False) -> None:
            try:
                os.unlink(self)
            except FileNotFoundError:
                if not missing_ok:
                    raise

        def rename(self, target):
            os.rename(self, target)
            return type(self)(target)

        def replace(self, target):
            os.replace(self, target)
            return type(self)(target)

    for name, lacks in _UNSUPPORTED.items():
        setattr(Path, name, _unsupported(name, lacks))
    Path.__module__ = "pathlib"
    Path.__name__ = Path.__qualname__ = "PosixPath"  # (what the host's Path() makes, repr included)
    module.__dict__.update(
        Path=Path, PosixPath=Path, PurePath=pathlib.PurePath, PurePosixPath=pathlib.PurePosixPath,
        PureWindowsPath=pathlib.PureWindowsPath,
        __all__=["PurePath", "PurePosixPath", "PureWindowsPath", "Path", "PosixPath"],
    )
    return module


def _relative_pattern(pattern) -> str:
    pattern = pattern if isinstance(pattern, str) else str(pattern)
    if not pattern:
        raise ValueError(f"Unacceptable pattern: {pattern!r}")
    if pattern.startswith("/"):
        raise NotImplementedError("Non-relative patterns are unsupported")
    return pattern
