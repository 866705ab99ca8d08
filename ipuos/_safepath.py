"""Safe extraction paths: map a name from inside a filesystem image to a host path.

Names inside an image (a littlefs tree restored from a backup, say) are untrusted input.
Before anything is written to the host, every name is validated here, by rules this module
states itself, never by trusting a library's extraction filter:

- it is a relative path of ``/``-separated components: no leading ``/`` (absolute), no
  empty component (``a//b``, a trailing ``/``), no ``.`` or ``..`` component;
- no NUL byte, and no other control character (0x01-0x1f, 0x7f): they are legal on Linux
  but turn names into terminal escape sequences and ambiguous listings;
- it encodes (UTF-8 / the filesystem encoding, strictly) and no component is longer than
  ``NAME_MAX`` (255) bytes, nor is the resulting host path longer than ``PATH_MAX``;
- it does not go through, nor end at, a symlink already present in the destination, and
  what it resolves to lies inside the destination.

API::

    check_name(path) -> tuple[str, ...]          # the components; UnsafePathError if unsafe
    safe_path(dest, path) -> str                 # the host path under dest
    open_beneath(dest, path, flags=..., mode=0o644, make_parents=True) -> int   # an fd

``safe_path`` checks the destination as it is now; if something else can change the
destination tree meanwhile, use :func:`open_beneath`, which walks the path one directory fd
at a time with ``O_NOFOLLOW`` so a symlink swapped in later is refused, not followed.

All refusals raise :class:`UnsafePathError` (a ``ValueError``) naming the path, the
destination and the reason.

:func:`directory_problem` says why a host directory cannot take a new entry, for the
messages of the commands that write one there (an extraction, a backup image).
"""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["NAME_MAX", "PATH_MAX", "UnsafePathError", "check_name", "directory_problem", "name_prefix", "open_beneath",
           "safe_path"]

NAME_MAX = 255
PATH_MAX = 4096  # including the terminating NUL, as Linux counts it


class UnsafePathError(ValueError):
    """A name from an image would be unsafe to create on the host."""


def directory_problem(directory: str) -> str | None:
    """Why ``directory`` cannot take a new entry, as the end of a sentence (``cannot write
    X: ...``), or None: it does not exist, it is not a directory, or it cannot be looked
    at (a name too long, a loop of symbolic links, no permission to search its parent)."""
    try:
        mode = os.stat(directory).st_mode
    except FileNotFoundError:
        return f"the directory {directory} does not exist"
    except OSError as exc:
        return exc.strerror or str(exc)
    return None if stat.S_ISDIR(mode) else f"{directory} is not a directory"


def name_prefix(name: str, limit: int) -> str:
    """The first ``limit`` bytes of a file name, for a temporary name made from it: cut by
    characters, a name in a multi-byte script could pass NAME_MAX."""
    return os.fsdecode(os.fsencode(name)[:limit])


def _refuse(path, reason: str, dest=None) -> UnsafePathError:
    where = f" under {os.fsdecode(dest)}" if dest is not None else ""
    return UnsafePathError(f"refusing to extract {path!r}{where}: {reason}")


def _encode(path) -> bytes:
    if isinstance(path, bytes):
        return path
    if isinstance(path, str):
        try:
            return os.fsencode(path)
        except UnicodeEncodeError:
            raise _refuse(path, "it cannot be encoded as a file name") from None
    raise _refuse(path, f"a name must be str or bytes, not {type(path).__name__}")


def check_name(path) -> tuple[str, ...]:
    """The components of ``path`` (a name inside an image), or UnsafePathError."""
    raw = _encode(path)
    if not raw:
        raise _refuse(path, "the name is empty")
    if b"\0" in raw:
        raise _refuse(path, "it contains a NUL byte")
    if any(b < 0x20 or b == 0x7F for b in raw):
        raise _refuse(path, "it contains a control character")
    if raw.startswith(b"/"):
        raise _refuse(path, "it is an absolute path")
    if len(raw) >= PATH_MAX:
        raise _refuse(path, f"it is {len(raw)} bytes long, over PATH_MAX ({PATH_MAX})")
    parts = raw.split(b"/")
    for part in parts:
        if not part:
            raise _refuse(path, "it has an empty component ('//' or a trailing '/')")
        if part == b"..":
            raise _refuse(path, "it has a '..' component")
        if part == b".":
            raise _refuse(path, "it has a '.' component")
        if len(part) > NAME_MAX:
            raise _refuse(path, f"a component is {len(part)} bytes long, over NAME_MAX ({NAME_MAX})")
    return tuple(os.fsdecode(p) for p in parts)


def _destination(dest) -> str:
    real = os.path.realpath(os.fsdecode(dest))
    try:
        st = os.stat(real)
    except OSError as e:
        raise UnsafePathError(f"extraction destination {os.fsdecode(dest)}: {e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"extraction destination {os.fsdecode(dest)} is not a directory")
    return real


def safe_path(dest, path) -> str:
    """The host path where ``path`` (a name inside an image) goes under directory ``dest``.

    Raises UnsafePathError if the name is unsafe (see the module docstring), if it goes
    through or ends at a symlink present in ``dest``, or if it would resolve outside it.
    """
    parts = check_name(path)
    root = _destination(dest)
    full = os.path.join(root, *parts)
    if len(os.fsencode(full)) >= PATH_MAX:
        raise _refuse(path, f"the host path would be over PATH_MAX ({PATH_MAX}) bytes", dest)
    cur = root
    for i, part in enumerate(parts):
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            break  # nothing further exists yet: nothing to follow
        except OSError as e:
            raise _refuse(path, f"cannot examine {cur}: {e.strerror}", dest) from None
        if stat.S_ISLNK(st.st_mode):
            raise _refuse(path, f"it goes through the symlink {cur}, which extraction never follows", dest)
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            raise _refuse(path, f"{cur} exists and is not a directory", dest)
    # defence in depth: whatever the checks above missed, the result must stay inside
    resolved = os.path.realpath(full)
    if os.path.commonpath([root, resolved]) != root or resolved == root:
        raise _refuse(path, "it resolves outside the destination", dest)
    return full


def open_beneath(dest, path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode: int = 0o644,
                 *, make_parents: bool = True, dir_mode: int = 0o755) -> int:
    """Open ``path`` under ``dest`` without following any symlink; returns an fd.

    Intermediate directories are opened one at a time with ``O_NOFOLLOW | O_DIRECTORY``
    (created with ``dir_mode`` if missing and ``make_parents``), and the last component
    with ``flags | O_NOFOLLOW``, so no symlink in the destination, present or swapped in
    meanwhile, is ever followed.
    """
    parts = check_name(path)
    root = _destination(dest)
    if len(os.fsencode(os.path.join(root, *parts))) >= PATH_MAX:
        raise _refuse(path, f"the host path would be over PATH_MAX ({PATH_MAX}) bytes", dest)
    dir_flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    cur = os.open(root, dir_flags)
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, dir_flags, dir_fd=cur)
            except FileNotFoundError:
                if not make_parents:
                    raise
                try:
                    os.mkdir(part, dir_mode, dir_fd=cur)
                except FileExistsError:
                    pass
                nxt = os.open(part, dir_flags, dir_fd=cur)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refuse(path, f"{part!r} on its way is a symlink or not a directory", dest) from None
                raise
            os.close(cur)
            cur = nxt
        try:
            return os.open(parts[-1], flags | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode, dir_fd=cur)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EEXIST):
                try:
                    is_link = stat.S_ISLNK(os.stat(parts[-1], dir_fd=cur, follow_symlinks=False).st_mode)
                except OSError:
                    is_link = False
                if is_link:
                    raise _refuse(path, "it names a symlink, which extraction never follows", dest) from None
            raise
    finally:
        os.close(cur)
