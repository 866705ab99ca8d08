"""VFS path syntax: absolute, normalised, never above ``/``.

Every path a tile hands the VFS becomes one canonical absolute string before anything
looks at the mount table: relative paths are taken from the current directory, ``.`` and
repeated slashes vanish, ``..`` climbs lexically and stops at ``/`` (as on Linux, where
``/..`` is ``/``). A trailing slash (or a final ``.`` or ``..``) is remembered separately:
littlefs then insists on a directory, which is how ``stat("file/")`` and
``remove("file/.")`` become ENOTDIR as POSIX wants.

Lexical ``..`` is exact here because the VFS has no symbolic links.
"""

from __future__ import annotations

import errno
import os

__all__ = ["normalize", "checked", "parent_and_name", "is_within"]

#: bytes of the longest path, as Linux counts them (with the terminating NUL)
PATH_MAX = 4096


def checked(path) -> str:
    """``path`` as a ``str``: PathLike objects are unwrapped, bytes and NUL refused.

    An empty path is ENOENT, as for the host's ``os.stat("")``. A name that is not UTF-8
    text is EINVAL, as the mount answers for one (littlefs stores names as UTF-8).
    """
    if type(path) is not str:
        if isinstance(path, int) and not isinstance(path, bool):
            raise TypeError("tile paths are str: a tile has no file descriptors to open by number")
        try:
            path = os.fspath(path)
        except TypeError:
            raise TypeError(f"expected str or os.PathLike object, not {type(path).__name__} "
                            "(tile paths are str)") from None
        if not isinstance(path, str):
            raise TypeError(f"tile paths are str, not {type(path).__name__}")
    if not path:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
    if "\0" in path:
        raise ValueError("embedded null byte in path")
    if not path.isascii():
        try:
            size = len(path.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate: bytes a host decoder escaped
            raise OSError(errno.EINVAL, "file names on a tile are UTF-8 text, and this one is not "
                          "(it holds an unpaired surrogate)", path) from None
    else:
        size = len(path)
    if size >= PATH_MAX:
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), path)
    return path


def normalize(path: str, cwd: str = "/") -> tuple[str, bool]:
    """(canonical absolute path, had a trailing slash) for a checked ``path``.

    ``cwd`` must itself be canonical. The result has no trailing slash except ``/``.
    """
    if path[0] != "/":
        path = cwd + "/" + path if cwd != "/" else "/" + path
    # a final "." or ".." names a directory as a trailing slash does: "file/." is
    # ENOTDIR, not the file (whose removal or truncation it would otherwise be)
    trailing = (path[-1] == "/" and len(path) > 1) or path.endswith(("/.", "/.."))
    if "/." not in path and "//" not in path:
        # the common case: already canonical but for a trailing slash
        return (path.rstrip("/") or "/"), trailing
    parts: list[str] = []
    for name in path.split("/"):
        if not name or name == ".":
            continue
        if name == "..":
            if parts:
                parts.pop()
        else:
            parts.append(name)
    return "/" + "/".join(parts), trailing


def parent_and_name(path: str) -> tuple[str, str]:
    """Split a canonical path into its directory and last name (``/`` has name "")."""
    head, _, name = path.rpartition("/")
    return head or "/", name


def is_within(path: str, top: str) -> bool:
    """True if canonical ``path`` is ``top`` or below it."""
    return top == "/" or path == top or path.startswith(top + "/")
