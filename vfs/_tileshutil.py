"""The ``shutil`` module a tile program imports: copying and removing the tile's files.

Built on the tile's ``open`` and ``os`` (never the host's): ``copyfileobj``,
``copyfile``, ``copy``, ``copy2``, ``copystat``, ``copytree``, ``ignore_patterns``,
``rmtree``, ``move`` and ``disk_usage``, with the host's behaviour and errors (``Error``
carrying the list of failures of a tree copy, ``SameFileError``). ``move`` renames
where it can and copies then removes across filesystems (the VFS refuses such a
rename with EXDEV). Tile files have no permission bits, owners, links or extended
attributes, so ``copymode``, ``chown`` and the like are absent; so are archives and
``which`` (tiles run no host programs).
"""

from __future__ import annotations

import collections
import errno
import fnmatch
import posixpath
import shutil as host_shutil
import types

__all__ = ["make_shutil_module"]

#: the read size of copyfileobj: 64 KiB, as the host's on Linux
COPY_BUFSIZE = 64 * 1024

_DiskUsage = collections.namedtuple("usage", "total used free")


class Error(OSError):
    """A copy or move failed (``copytree``: ``args[0]`` lists every (src, dst, why))."""


class SameFileError(Error):
    """Source and destination are the same file."""


def copyfileobj(fsrc, fdst, length: int = 0) -> None:
    """Copy the rest of file object ``fsrc`` to ``fdst``, ``length`` bytes at a time."""
    size = length if length and length > 0 else COPY_BUFSIZE
    read, write = fsrc.read, fdst.write
    while chunk := read(size):
        write(chunk)


def ignore_patterns(*patterns):
    """For ``copytree(ignore=...)``: leave out names matching any of the glob ``patterns``."""
    def ignored(path, names):
        return {name for pattern in patterns for name in fnmatch.filter(names, pattern)}
    return ignored


def make_shutil_module(os, open, place) -> types.ModuleType:
    """A ``shutil`` module over a tile's ``os`` module and ``open``; ``place(path)`` says
    where a path leads (``Vfs.place``: a tile's own disk has two names)."""
    module = types.ModuleType("shutil", "High-level file operations on the tile's own files.")

    def _same(src, dst) -> bool:
        try:
            return os.path.samefile(src, dst)
        except OSError:
            return False

    def _within(src, dst) -> bool:
        """Whether ``dst`` is ``src`` or below it, by whatever names (/tiles/0/d is /d)."""
        (src_fs, src_inner), (dst_fs, dst_inner) = place(src), place(dst)
        return src_fs == dst_fs and (dst_inner.rstrip("/") + "/").startswith(src_inner.rstrip("/") + "/")

    def copyfile(src, dst, *, follow_symlinks=True):
        """Copy the bytes of file ``src`` to file ``dst`` (made or replaced); returns ``dst``."""
        if _same(src, dst):
            raise SameFileError(f"{os.fspath(src)!r} and {os.fspath(dst)!r} are the same file")
        with open(src, "rb") as fsrc:
            try:
                with open(dst, "wb") as fdst:
                    copyfileobj(fsrc, fdst)
            except IsADirectoryError as exc:
                # as the host's (bpo-43219): "missing/" is a directory that is not there
                if not os.path.exists(dst):
                    raise FileNotFoundError(f"Directory does not exist: {dst}") from exc
                raise
        return dst

    def copystat(src, dst, *, follow_symlinks=True) -> None:
        """Give ``dst`` the access and modification times of ``src`` (all a tile file
        has of its own besides its bytes)."""
        st = os.stat(src)
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))

    def _into(src, dst):
        if os.path.isdir(dst):
            return posixpath.join(dst, posixpath.basename(os.fspath(src)))
        return dst

    def copy(src, dst, *, follow_symlinks=True):
        """Copy file ``src`` to ``dst`` (a file, or a directory to copy it into); returns
        where it went."""
        dst = _into(src, dst)
        copyfile(src, dst)
        return dst

    def copy2(src, dst, *, follow_symlinks=True):
        """:func:`copy`, keeping the times too."""
        dst = _into(src, dst)
        copyfile(src, dst)
        copystat(src, dst)
        return dst

    def copytree(src, dst, symlinks=False, ignore=None, copy_function=copy2,
                 ignore_dangling_symlinks=False, dirs_exist_ok=False):
        """Copy the tree at ``src`` to ``dst`` (which must not exist, unless
        ``dirs_exist_ok``); every failure is collected and raised as one ``Error``."""
        with os.scandir(src) as entries:
            entries = list(entries)
        ignored = ignore(os.fspath(src), [e.name for e in entries]) if ignore is not None else ()
        os.makedirs(dst, exist_ok=dirs_exist_ok)
        errors = []
        for entry in entries:
            if entry.name in ignored:
                continue
            source, target = posixpath.join(src, entry.name), posixpath.join(dst, entry.name)
            try:
                if entry.is_dir():
                    copytree(source, target, symlinks, ignore, copy_function,
                             ignore_dangling_symlinks, dirs_exist_ok)
                else:
                    copy_function(source, target)
            except Error as exc:
                errors.extend(exc.args[0])
            except OSError as exc:
                errors.append((source, target, str(exc)))
        try:
            copystat(src, dst)
        except OSError as exc:
            errors.append((src, dst, str(exc)))
        if errors:
            raise Error(errors)
        return dst

    def rmtree(path, ignore_errors=False, onerror=None, *, onexc=None, dir_fd=None) -> None:
        """Remove the tree at ``path``. A failure calls ``onexc(function, path, exception)``
        (or ``onerror`` with an exc_info tuple) if given, is skipped with
        ``ignore_errors``, else raised."""
        if dir_fd is not None:
            raise NotImplementedError("tiles have no file descriptors: rmtree takes a path")

        def failed(function, where, exc) -> None:
            if ignore_errors:
                return
            if onexc is not None:
                onexc(function, where, exc)
            elif onerror is not None:
                onerror(function, where, (type(exc), exc, exc.__traceback__))
            else:
                raise exc

        def remove(where) -> None:
            try:
                with os.scandir(where) as found:
                    entries = list(found)
            except OSError as exc:
                failed(os.scandir, where, exc)
                entries = []
            for entry in entries:
                inner = posixpath.join(where, entry.name)
                if entry.is_dir():
                    remove(inner)
                else:
                    try:
                        os.unlink(inner)
                    except OSError as exc:
                        failed(os.unlink, inner, exc)
            try:
                os.rmdir(where)
            except OSError as exc:
                failed(os.rmdir, where, exc)

        top = os.fspath(path)
        try:
            os.lstat(top)  # (one failure for a missing tree, as the host's: not scandir's and rmdir's)
        except OSError as exc:
            failed(os.lstat, top, exc)
            return
        remove(top)

    rmtree.avoids_symlink_attacks = True  # (a tile has no symbolic links to follow)

    def move(src, dst, copy_function=copy2):
        """Move file or tree ``src`` to ``dst`` (or into it, if it is a directory); across
        filesystems, copy and then remove. Returns where it went."""
        src, target = os.fspath(src), os.fspath(dst)
        if os.path.isdir(target):
            if _same(src, target):
                os.rename(src, target)  # (the same entry: a rename, e.g. of case)
                return target
            target = posixpath.join(target, posixpath.basename(src.rstrip("/")))
            if os.path.exists(target):
                raise Error(f"Destination path '{target}' already exists")
        try:
            os.rename(src, target)
        except OSError as exc:
            is_dir = os.path.isdir(src)
            # (the host's says so whatever rename's errno: EINVAL here, EXDEV across mounts)
            if is_dir and _within(src, target):
                raise Error(f"Cannot move a directory '{src}' into itself '{target}'.") from None
            if exc.errno != errno.EXDEV:
                raise
            if is_dir:
                copytree(src, target, copy_function=copy_function)
                rmtree(src)
            else:
                copy_function(src, target)
                os.unlink(src)
        return target

    def disk_usage(path):
        """``usage(total, used, free)`` in bytes of the filesystem holding ``path``."""
        st = os.statvfs(path)
        return _DiskUsage(st.f_blocks * st.f_frsize, (st.f_blocks - st.f_bfree) * st.f_frsize,
                          st.f_bavail * st.f_frsize)

    module.__dict__.update(
        Error=Error, SameFileError=SameFileError, COPY_BUFSIZE=COPY_BUFSIZE,
        copyfileobj=copyfileobj, ignore_patterns=ignore_patterns, copyfile=copyfile,
        copystat=copystat, copy=copy, copy2=copy2, copytree=copytree, rmtree=rmtree, move=move,
        disk_usage=disk_usage, __getattr__=_module_getattr,
    )
    return module


#: what the host's ``shutil`` has that a tile's lacks, and why
_LACKS = {
    "copymode": "its files have no permission bits",
    "chown": "its files have no owners",
    "which": "tiles run no host programs",
}


def _module_getattr(name: str):
    """The tile ``shutil``'s ``__getattr__``: a name it lacks says why, as ``os``'s do."""
    if name in _LACKS:
        why = _LACKS[name]
    elif "archive" in name and hasattr(host_shutil, name):
        why = "archives are left out: a tile has only its own files"
    elif hasattr(host_shutil, name) and not name.startswith("_"):
        why = "a tile's shutil has only what applies to its files (see help(shutil))"
    else:
        raise AttributeError(f"module 'shutil' has no attribute {name!r}")
    raise AttributeError(f"module 'shutil' has no attribute {name!r} on a tile: {why}")
