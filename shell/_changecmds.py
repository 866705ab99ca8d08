"""The commands that change files: touch, mkdir, rmdir, rm, cp, mv.

Copies and moves between any two places go chunk by chunk through tile 0's VFS: tile
0's disk, the chip disk, or another tile's files under ``/tiles/N`` (each chunk a request
to tile N over the exchange). A move across filesystems is a copy, then a removal, as
``mv`` does on POSIX; nothing reaches another tile's files any other way. Whole trees
check for Ctrl-C between files and chunks.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import secrets

from ._parse import quote
from ._syscmds import is_ram_disk
from ._table import Usage, command, options

#: bytes per read when copying
CHUNK = 64 * 1024

_TILE_ROOT = re.compile(r"^/tiles(/\d+)?$")


def _name_of(path: str) -> str:
    return path.rstrip("/").rpartition("/")[2] or path


def _join(directory: str, name: str) -> str:
    return directory + name if directory.endswith("/") else directory + "/" + name


def _protected(sh, path: str) -> str | None:
    """Why ``path`` must not be removed or moved wholesale, or None."""
    if path.rstrip("/").rpartition("/")[2] in (".", ".."):
        return "refusing to remove '.' or '..'"  # (POSIX rm: the cwd would be left nowhere)
    full = sh.fs.abspath(path)
    if full == "/":
        return "refusing to remove the root directory"
    if _TILE_ROOT.match(full):
        return "a tile's files are not removed wholesale (remove what is inside it instead)"
    if sh.fs.ismount(full):
        if is_ram_disk(sh, full):
            return "is a mount point (umount it first)"
        # (the machine's own, such as /chip: umount cannot remove it)
        instead = (f"remove what is inside it instead: rm -r {quote(path.rstrip('/') + '/')}*"
                   if sh.name == "rm" else "move what is inside it instead")
        return f"the machine's own mount point, which stays ({instead})"
    from ipuos.vfs import is_within  # (see shell/__init__: what the terminal imports)

    # by tile 0's own name for it: /tiles/0 shows no mounts, so a walk of /tiles/0/DIR
    # would empty DIR around a mount point inside it, then fail on that
    in_tree = _in_tile_0s_tree(sh, full) or full
    below = [m.path for m in sh.fs.vfs.mount_points() if m.path != in_tree and is_within(m.path, in_tree)]
    if below:  # (rm -r would empty that filesystem, then fail on its mount point)
        return f"a filesystem is mounted at {below[0]} inside it (umount it first)"
    return None


@command("touch", "touch FILE...", "create empty files, or update their time")
def _touch(sh, args):
    _opts, paths = options(args, "")  # (none, but ``--`` ends them and -x is no file name)
    if not paths:
        raise Usage("missing file operand")
    for path in paths:
        try:
            if path.endswith("/") or sh.fs.exists(path):
                sh.fs.utime(path)  # (a name ending in / can only be a directory that exists)
            else:
                sh.fs.open_raw(path, os.O_WRONLY | os.O_CREAT).close()
        except OSError as exc:
            sh.oserror(exc)
    return sh.status


@command("mkdir", "mkdir [-p] DIR...", "make directories (-p: parents too, no error if it exists)")
def _mkdir(sh, args):
    opts, paths = options(args, "p")
    if not paths:
        raise Usage("missing operand")
    for path in paths:
        try:
            if "-p" in opts:
                sh.fs.makedirs(path)
            else:
                sh.fs.mkdir(path)
        except OSError as exc:
            sh.oserror(exc)
    return sh.status


@command("rmdir", "rmdir DIR...", "remove empty directories")
def _rmdir(sh, args):
    _opts, paths = options(args, "")
    if not paths:
        raise Usage("missing operand")
    for path in paths:
        try:
            sh.fs.rmdir(path)
        except OSError as exc:
            sh.oserror(exc)
    return sh.status


@command("rm", "rm [-r] [-f] PATH...", "remove files (-r: directories and what is in them)")
def _rm(sh, args):
    opts, paths = options(args, "rRf")
    recursive, force = "-r" in opts or "-R" in opts, "-f" in opts
    if not paths and not force:
        raise Usage("missing operand")
    for path in paths:
        try:
            entry = sh.fs.entry(path)
            if not entry.is_dir:
                sh.fs.remove(path)
                continue
            if not recursive:
                raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), path)
            why = _protected(sh, path)
            if why:
                sh.error(f"{path}: {why}")
                continue
            remove_tree(sh, path)
        except (FileNotFoundError, NotADirectoryError) as exc:  # (-f: nothing there, as GNU rm)
            if not force:
                sh.oserror(exc)
        except OSError as exc:
            sh.oserror(exc)
    return sh.status


def remove_tree(sh, path: str, *, interruptible: bool = True) -> None:
    """Remove ``path`` and everything below it (depth first). Not ``interruptible``: the
    clean-up after a Ctrl-C, which must not stop at the next check."""
    if interruptible:
        sh.check()
    for entry in sh.fs.entries(path):
        child = _join(path, entry.name)
        if entry.is_dir:
            remove_tree(sh, child, interruptible=interruptible)
        else:
            sh.fs.remove(child)
    sh.fs.rmdir(path)


@command("cp", "cp [-r] SRC... DEST", "copy files (-r: directories), across filesystems and tiles")
def _cp(sh, args):
    opts, paths = options(args, "rR")
    recursive = "-r" in opts or "-R" in opts
    for source, target in _transfers(sh, paths):
        try:
            entry = sh.fs.entry(source)
            if entry.is_dir and not recursive:
                sh.error(f"{source}: is a directory (use cp -r)")
                continue
            copy_tree(sh, source, target, report=sh.oserror)
        except OSError as exc:
            sh.oserror(exc)
    return sh.status


@command("mv", "mv [-f] SRC... DEST", "move or rename files (across filesystems: copy, then remove)")
def _mv(sh, args):
    _opts, paths = options(args, "f")  # (-f: mv never asks anyway)
    for source, target in _transfers(sh, paths):
        try:
            why = _protected(sh, source)
            if why:
                sh.error(f"{source}: {why}")
                continue
            try:
                _rename(sh, source, target)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                _move_across(sh, source, target)
        except OSError as exc:
            sh.oserror(exc)
    return sh.status


def _rename(sh, source: str, target: str) -> None:
    """rename(2), with a path on tile 0's own disk spelled through ``/tiles/0`` spelled as
    tile 0's tree has it: the VFS sees two mounts, and would refuse a rename between the
    two spellings as EXDEV (mv would copy, and need the room for a second copy)."""
    try:
        sh.fs.rename(_tile_0_spelling(sh, source), _tile_0_spelling(sh, target))
    except OSError as exc:
        exc.filename, exc.filename2 = source, target  # (as the user wrote them)
        raise


def _tile_0_spelling(sh, path: str) -> str:
    """``/tiles/0/a/b`` -> ``/a/b`` when that is the same file (see _in_tile_0s_tree);
    any other path as it is."""
    if ".." in path.split("/"):  # (.. is the kernel's to read: missing/.. is ENOENT)
        return path
    return _in_tile_0s_tree(sh, sh.fs.abspath(path)) or path


def _in_tile_0s_tree(sh, full: str) -> str | None:
    """Where tile 0's tree has the file that the absolute path ``full`` names through
    /tiles/0 (``/tiles/0/a/b`` -> ``/a/b``: tile 0's own disk by its other name); None for
    any other path, and for one at or below a mount point of tile 0's tree, which /tiles/0
    does not show (nothing is there under /tiles/0; the mounted files are elsewhere)."""
    if not full.startswith("/tiles/0/"):
        return None
    place = sh.fs.place(full)
    return place[1] if place[0] == "/" and sh.fs.place(place[1]) == place else None


def _move_across(sh, source: str, target: str) -> None:
    """A move between filesystems, as near rename(2) as a copy gets: the copy replaces the
    target only once complete (a file: see copy_file; a directory: copied whole under a
    temporary name beside it), so a failure (out of space, Ctrl-C) leaves the source whole
    and the target as it was."""
    is_dir = sh.fs.entry(source).is_dir
    _check_replaceable(sh, is_dir, target)
    if not is_dir:
        copy_tree(sh, source, target, keep_times=True)
        sh.fs.remove(source)
        return
    temporary = _temporary_beside(target)
    try:
        copy_tree(sh, source, temporary, keep_times=True)
        sh.fs.rename(temporary, target)
    except BaseException as exc:
        _discard(sh, temporary)
        if isinstance(exc, OSError) and isinstance(exc.filename, str) and exc.filename.startswith(temporary):
            exc.filename = target + exc.filename[len(temporary):]  # (the name the user gave)
        raise
    remove_tree(sh, source)


def _temporary_beside(target: str) -> str:
    """A name for a copy in progress, in ``target``'s directory (so that renaming it over
    ``target`` stays on one filesystem), short enough for any name limit."""
    parent = target.rstrip("/").rpartition("/")[0] or ("/" if target.startswith("/") else ".")
    return _join(parent, f".cp-{secrets.token_hex(4)}.part")


def _discard(sh, path: str) -> None:
    """Remove a copy cut short, as far as it goes."""
    try:
        if sh.fs.entry(path).is_dir:
            remove_tree(sh, path, interruptible=False)
        else:
            sh.fs.remove(path)
    except OSError:
        pass


def _transfers(sh, operands: list[str]) -> list[tuple[str, str]]:
    """(source, target) pairs of a cp/mv: into DEST if it is a directory, else to DEST."""
    from ipuos.vfs import is_within  # (see shell/__init__: what the terminal imports)

    if len(operands) < 2:
        raise Usage("missing destination operand" if operands else "missing file operand")
    *sources, dest = operands
    into = sh.fs.isdir(dest)
    if len(sources) > 1 and not into:
        raise Usage(f"target {dest!r} is not a directory")
    if dest.endswith("/") and not into and not sh.fs.isdir(sources[0]):
        # a directory was meant, and there is none (a directory source makes it, as GNU does)
        sh.oserror(_no_directory(sh.fs, dest))
        return []
    pairs = []
    for source in sources:
        try:  # (a missing source is said first: not "the same file" as its name in DEST)
            is_dir = sh.fs.entry(source).is_dir
        except OSError as exc:
            sh.oserror(exc)
            continue
        target = _join(dest, _name_of(source)) if into else dest.rstrip("/") or dest
        (src_fs, src_inner), (dst_fs, dst_inner) = sh.fs.place(source), sh.fs.place(target)
        if (src_fs, src_inner) == (dst_fs, dst_inner):
            sh.error(f"{source} and {target} are the same file")
            continue
        # into itself: inside it on its filesystem (by any spelling: /tiles/0/a is /a), or
        # below it in tile 0's tree, whose listing of a directory shows what is mounted there
        # (the same file by both names was refused above: within is below here)
        below = src_fs == dst_fs and is_within(dst_inner, src_inner)
        if below or is_within(sh.fs.abspath(target), sh.fs.abspath(source)):
            if is_dir:
                sh.error(f"{source}: cannot copy or move a directory into itself ({target})")
            else:  # (the target's path goes through the file)
                sh.oserror(OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), target))
            continue
        pairs.append((source, target))
    return pairs


def _check_replaceable(sh, is_dir: bool, target: str) -> None:
    """What rename(2) refuses, for a move between filesystems (a copy, then a removal):
    a directory only replaces an empty directory, a file only a file."""
    try:
        existing = sh.fs.entry(target)
    except FileNotFoundError:
        return
    if existing.is_dir and not is_dir:
        raise OSError(errno.EISDIR, os.strerror(errno.EISDIR), target)
    if is_dir and not existing.is_dir:
        raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), target)
    if is_dir and sh.fs.entries(target):
        raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), target)


def copy_tree(sh, source: str, target: str, *, keep_times: bool = False, report=None) -> None:
    """Copy a file, or a directory and everything below it, chunk by chunk (``keep_times``:
    with their modification times, as a move keeps them). ``report``: called with each
    OSError below ``source``, and the rest is copied (``cp -r``, as GNU cp); without it
    the first error ends the copy (a move, which must not remove what it did not copy)."""
    sh.check()
    entry = sh.fs.entry(source)
    if not entry.is_dir:
        copy_file(sh, source, target)
    else:
        try:
            sh.fs.mkdir(target)
        except FileExistsError:
            if not sh.fs.isdir(target):
                raise
        for child in sh.fs.entries(source):
            try:
                copy_tree(sh, _join(source, child.name), _join(target, child.name), keep_times=keep_times,
                          report=report)
            except OSError as exc:
                if report is None:
                    raise
                report(exc)
    if keep_times and entry.mtime_ns:
        sh.fs.utime(target, entry.mtime_ns)


def copy_file(sh, source: str, target: str) -> None:
    """Copy one file a chunk at a time, into a temporary name beside ``target`` that
    replaces it once complete: a copy cut short (out of space, Ctrl-C) leaves no partial
    file, and an old ``target`` as it was. An error names the file as the user wrote it,
    not as the tile that raised it sees it (tile 3's ``/x`` is the user's ``/tiles/3/x``)."""
    temporary = _temporary_beside(target)
    with sh.fs.open(source, "rb") as reader:
        writer = _named(target, sh.fs.open, temporary, "wb")
        try:
            while True:
                sh.check()
                data = _named(source, reader.read, CHUNK)
                if not data:
                    break
                _named(target, writer.write, data)
            _named(target, writer.close)
            _named(target, sh.fs.rename, temporary, target)
        except BaseException as exc:
            close_after_failure(writer)
            _discard(sh, temporary)
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC and _room_without(sh, target, source):
                raise OSError(errno.ENOSPC, f"{exc.strerror} (the copy is written beside the old file, which it "
                                            "replaces once complete: remove that first to make room)",
                              target) from None
            raise


def _room_without(sh, target: str, source: str) -> bool:
    """Whether ``source`` would fit where ``target`` is if the file there now were removed
    (a copy that ran out of space: see copy_file)."""
    try:
        old = sh.fs.entry(target)
        if old.is_dir:
            return False
        info = sh.fs.statvfs(target)
        block = info.f_bsize
        needed = -(-sh.fs.entry(source).size // block)
        return needed <= info.f_bavail + old.size // block  # (whole blocks: what removing it surely frees)
    except OSError:
        return False


def close_after_failure(file) -> None:
    """Close a file whose writing failed, keeping the first error the one reported:
    what closing says follows from it (a write that ran out of space takes the file's
    uncommitted writes with it, and closing says they are lost)."""
    try:
        file.close()
    except OSError:
        pass


def _named(path: str, operation, *args):
    try:
        return operation(*args)
    except OSError as exc:
        exc.filename, exc.filename2 = path, None
        raise


def resolve_target(fs, path: str, name: str) -> str:
    """``path``, or ``path/name`` if ``path`` is a directory (where ``put`` writes).
    ``path/`` that is not a directory is ENOTDIR, as cp has it."""
    if fs.isdir(path):
        return fs.abspath(_join(path, name))
    if path.endswith("/"):
        raise _no_directory(fs, path)
    return fs.abspath(path)


def _no_directory(fs, path: str) -> OSError:
    """The error for ``path/`` naming no directory, as GNU cp gives it: ENOENT if its
    parent is missing too, else ENOTDIR (a file there, or nothing, or a file as parent)."""
    parent = posixpath.dirname(fs.abspath(path.rstrip("/")) or "/")
    code = errno.ENOTDIR if fs.exists(parent) else errno.ENOENT
    return OSError(code, os.strerror(code), path)
