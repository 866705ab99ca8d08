"""The ``os`` module a tile program imports: the host's API over the tile's own VFS.

``import os``, ``import os.path`` and ``from os import path`` give a module whose file
functions act on the tile's files (never the host's): listdir, scandir, stat, access, mkdir,
makedirs, remove/unlink, rmdir, removedirs, rename/replace/renames, getcwd/chdir, walk,
statvfs, truncate, utime, sync, plus the constants (sep, curdir, SEEK_*...). ``os.path`` is the host's
``posixpath`` for pure path arithmetic, with everything that would look at a disk
(exists, isdir, getsize, abspath, realpath, relpath, expanduser ...) rebound to the tile.

What a tile does not have is absent rather than faked: file descriptors (``os.open``),
processes, users, permission bits, links; naming one is an AttributeError that says
why. ``os.environ`` is an empty dict of the program's own.
"""

from __future__ import annotations

import os
import posixpath
import types

from ._entries import DirEntry
from ._files import no_file_descriptors

__all__ = ["make_os_module"]

_PURE_PATH_NAMES = (
    "join", "basename", "dirname", "split", "splitext", "normpath", "normcase", "isabs",
    "commonpath", "commonprefix", "splitdrive", "sep", "curdir", "pardir", "extsep",
    "altsep", "pathsep", "supports_unicode_filenames",
)

#: the host's constants that mean the same on a tile
_HOST_CONSTANTS = ("SEEK_SET", "SEEK_CUR", "SEEK_END", "F_OK", "R_OK", "W_OK", "X_OK")

_VFS_FUNCTION_NAMES = (
    "listdir", "scandir", "stat", "lstat", "mkdir", "makedirs", "remove", "unlink", "rmdir",
    "rename", "replace", "getcwd", "chdir", "walk", "statvfs", "truncate", "utime", "sync",
)


#: what the host's ``os`` has that a tile's lacks, by what the tile does not have: a
#: program reaching for one learns why (and ``hasattr`` stays False, as feature tests
#: such as shutil's expect)
_LACKS = {
    "permission bits": ("chmod", "lchmod", "fchmod", "chflags", "lchflags", "umask"),
    "owners": ("chown", "lchown", "fchown"),
    "users": ("getuid", "geteuid", "getgid", "getegid", "getlogin"),
    "symbolic links": ("symlink", "readlink"),
    "hard links": ("link",),
    "file descriptors": ("open", "close", "read", "write", "lseek", "fstat", "dup", "dup2", "pipe",
                         "fdopen", "ftruncate", "fsync", "fdatasync", "closerange"),
    "processes": ("system", "popen", "fork", "kill", "getpid", "getppid", "spawnv", "execv", "execvp",
                  "waitpid", "_exit", "abort"),
}
_LACKING = {name: lacks for lacks, names in _LACKS.items() for name in names}


def _module_getattr(name: str):
    """The tile ``os``'s ``__getattr__`` (PEP 562), called only for a name it lacks."""
    if name in _LACKING:
        why = f"tiles have no {_LACKING[name]}"
    elif hasattr(os, name):
        why = "a tile's os has only the functions of its files (see help(os))"
    else:
        raise AttributeError(f"module 'os' has no attribute {name!r}")
    raise AttributeError(f"module 'os' has no attribute {name!r} on a tile: {why}")


#: what the host's ``os.path`` has that a tile's lacks, and why
_PATH_LACKS = {
    "samestat": "a tile's stat results have no inode numbers to compare (os.path.samefile compares where paths lead)",
    "sameopenfile": "tiles have no file descriptors",
}


def _path_module_getattr(name: str):
    """The tile ``os.path``'s ``__getattr__``: a name it lacks says why, as ``os``'s do."""
    if name in _PATH_LACKS:
        why = _PATH_LACKS[name]
    elif hasattr(posixpath, name) and not name.startswith("_"):
        why = "a tile's os.path has only what applies to its files (see help(os.path))"
    else:
        raise AttributeError(f"module 'os.path' has no attribute {name!r}")
    raise AttributeError(f"module 'os.path' has no attribute {name!r} on a tile: {why}")


class _Environ(dict):
    """``os.environ`` of a program: str to str, as the host's refuses anything else
    (a dict subclass, so that ``dict(os.environ)`` and printing it work as expected)."""

    def __setitem__(self, key, value) -> None:
        super().__setitem__(_str(key), _str(value))

    def update(self, *args, **kwargs) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def setdefault(self, key, value=None):
        if key not in self:
            self[key] = value
        return self[key]

    def __ior__(self, other):
        self.update(other)
        return self

    def copy(self) -> dict:
        return dict(self)


def _str(value) -> str:
    if not isinstance(value, str):
        raise TypeError(f"str expected, not {type(value).__name__}")
    return value


def make_os_module(vfs) -> types.ModuleType:
    """A fresh ``os`` module bound to ``vfs`` (one per program run: ``environ`` and the
    current directory are the program's own)."""
    module = types.ModuleType("os", "The tile's operating-system interface: its own files.")
    for name in _VFS_FUNCTION_NAMES:
        setattr(module, name, getattr(vfs, name))

    def removedirs(name) -> None:
        """``os.removedirs``: remove ``name``, then each parent *it names* that became
        empty (as the host's: ``removedirs("a/b")`` stops at ``a``, never climbing into
        the current directory and its parents)."""
        vfs.rmdir(name)
        head, tail = posixpath.split(os.fspath(name))
        if not tail:
            head, tail = posixpath.split(head)
        while head and tail:
            try:
                vfs.rmdir(head)
            except OSError:
                break
            head, tail = posixpath.split(head)

    def access(path, mode, *, dir_fd=None, effective_ids=False, follow_symlinks=True) -> bool:
        """``os.access``: whether ``path`` exists (``F_OK``) and allows ``mode`` (``R_OK``,
        ``W_OK``, ``X_OK``) by its permission bits; writing also needs a writable mount."""
        if dir_fd is not None:
            raise no_file_descriptors("access")
        if type(mode) is not int:
            raise TypeError(f"mode must be an int, not {type(mode).__name__}")
        try:
            bits = vfs.stat(path).st_mode
            if mode & os.W_OK and vfs.statvfs(path).f_flag & os.ST_RDONLY:
                return False
        except OSError:
            return False
        return all(bits & wanted for asked, wanted in ((os.R_OK, 0o400), (os.W_OK, 0o200), (os.X_OK, 0o100))
                   if mode & asked)

    def renames(old, new) -> None:
        """``os.renames``: make ``new``'s missing parents, rename, then remove ``old``'s
        parents that became empty."""
        head = posixpath.dirname(os.fspath(new))
        if head and not vfs.exists(head):
            vfs.makedirs(head)
        vfs.rename(old, new)
        head = posixpath.dirname(os.fspath(old))
        if head:
            try:
                removedirs(head)
            except OSError:
                pass

    environ = _Environ()

    def getenv(key: str, default=None):
        return environ.get(key, default)

    module.__dict__.update(
        removedirs=removedirs,
        renames=renames,
        access=access,
        environ=environ,
        getenv=getenv,
        fspath=os.fspath,
        fsencode=os.fsencode,
        fsdecode=os.fsdecode,
        strerror=os.strerror,
        error=OSError,
        stat_result=os.stat_result,
        statvfs_result=os.statvfs_result,
        DirEntry=DirEntry,
        PathLike=os.PathLike,
        __getattr__=_module_getattr,
        name="posix",
        sep="/",
        altsep=None,
        extsep=".",
        pathsep=":",
        curdir=".",
        pardir="..",
        linesep="\n",
        defpath="/lib",
        **{name: getattr(os, name) for name in _HOST_CONSTANTS},
    )
    module.path = _make_path_module(vfs)
    return module


def _make_path_module(vfs) -> types.ModuleType:
    module = types.ModuleType("os.path", "Path names on the tile (posixpath over the tile's VFS).")
    for name in _PURE_PATH_NAMES:
        setattr(module, name, getattr(posixpath, name))
    if hasattr(posixpath, "splitroot"):
        module.splitroot = posixpath.splitroot

    def relpath(path, start=None) -> str:
        if not path:
            raise ValueError("no path specified")
        return posixpath.relpath(vfs.abspath(path), vfs.abspath(start if start is not None else "."))

    def realpath(path, *, strict: bool = False) -> str:
        if strict:
            vfs.stat(path)  # (FileNotFoundError, as on the host)
        return vfs.abspath(path)  # no symbolic links on a tile

    def unchanged(path):
        return path  # no home directories or environment variables to expand

    def islink(path) -> bool:
        return False

    def samefile(first, second) -> bool:
        vfs.stat(first)
        vfs.stat(second)
        return vfs.place(first) == vfs.place(second)

    module.__dict__.update(
        exists=vfs.exists,
        lexists=vfs.exists,
        isdir=vfs.isdir,
        isfile=vfs.isfile,
        islink=islink,
        ismount=vfs.ismount,
        getsize=vfs.getsize,
        getmtime=vfs.getmtime,
        getatime=vfs.getmtime,
        getctime=vfs.getmtime,
        abspath=vfs.abspath,
        realpath=realpath,
        relpath=relpath,
        samefile=samefile,
        expanduser=unchanged,
        expandvars=unchanged,
        defpath="/lib",
        devnull="/dev/null",
        __getattr__=_path_module_getattr,
    )
    return module
