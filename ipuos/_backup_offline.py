"""Reading an image's filesystems with no machine: list, read, and extract to host disk.

A device of an image is read (and checked: chunks and digest, after a whole-image verify)
into memory, and littlefs is mounted over that copy, exactly as a tile would mount it.
Nothing here writes to the image or needs a daemon.

Names inside an image are untrusted, even when the image was written by ipuos: an image
is a file anyone can craft. Before :func:`extract` creates anything, it walks the whole
tree and checks every name: each littlefs name must be one path component (no ``/``, not
``.`` or ``..``, no NUL or control character, at most 255 bytes, valid UTF-8), and the
path it forms must pass ``_safepath.check_name``. Only then is the tree written, into a
private temporary directory beside the destination, through ``_safepath.open_beneath``
(no symlink is ever followed), and renamed into place at the end; on any failure the
temporary directory is removed, so the destination's parent is as it was.

littlefs itself hands out ``.`` and ``..`` for every directory, and the project's
``Filesystem.scandir`` drops them; a hostile image can hold *more* entries with those
names, so directories are read here with the raw littlefs call and any name beyond the
two littlefs makes is refused, not silently skipped.

Here littlefs runs on the main thread, where Python runs signal handlers: while a device
is mounted, SIGINT, SIGTERM and SIGHUP are held and acted on between littlefs calls (see
``_signals``), so each loop below passes a checkpoint and a large file is read in parts.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import shutil
import stat
from dataclasses import dataclass
from typing import Iterator

from littlefs import lfs

from ._backup_devices import CHIP, tile_disk_name
from ._image import DeviceEntry, Image
from ._plural import plural
from ._safepath import NAME_MAX, UnsafePathError, check_name, directory_problem, name_prefix, open_beneath
from ._signals import checkpoint, signals_held
from ._tempfiles import locked_temp, remove_dead_temps
from ._tilespec import format_tiles, tile_of_name
from .blockdev import Filesystem, MemoryDevice

__all__ = ["OfflineError", "Node", "device_entry", "mounted", "on_device", "list_dir", "read_file", "walk",
           "extract"]


class OfflineError(Exception):
    """Something the user asked of an image cannot be done; the message says why."""


@dataclass(frozen=True)
class Node:
    """One entry of a device's tree."""

    path: str  # relative to the walked directory, "/"-separated
    is_dir: bool
    size: int
    mtime_ns: int | None  # None if littlefs holds none (0 is 1970-01-01, a time like any)


#: how DEVICE is named, for messages
DEVICE_NAMES = "N or tile/N/disk (or /tiles/N) for tile N's disk, chip (or /chip) for the chip disk"


def device_entry(image: Image, spec: str) -> DeviceEntry:
    """The device ``spec`` names: ``tile/5/disk``, just ``5`` (tile 5's disk), or ``chip``;
    also as the shell and a mount name them on the machine, ``/tiles/5`` and ``/chip``."""
    name = _device_name(spec)
    try:
        return image.device(name)
    except KeyError:
        tiles = [e.tile for e in image.devices if e.tile is not None and e.name == tile_disk_name(e.tile)]
        held = ([f"the disk{'s' if len(tiles) > 1 else ''} of tile{'s' if len(tiles) > 1 else ''} "
                 f"{format_tiles(tiles)}"] if tiles else [])
        held += [f"the device {e.name}" for e in image.devices
                 if e.name != CHIP and (e.tile is None or e.name != tile_disk_name(e.tile))][:3]
        if any(e.name == CHIP for e in image.devices):
            held.append("the chip disk")
        raise OfflineError(f"image {image.path} has no device {spec!r}; it holds "
                           f"{' and '.join(held) or 'none'} (name one {DEVICE_NAMES})") from None


def _device_name(spec: str) -> str:
    """The image's name for the device ``spec`` names (see device_entry)."""
    tile = tile_of_name(spec)
    if tile is not None:
        return tile_disk_name(tile)
    path = spec.strip("/")
    if path == CHIP:
        return CHIP
    if path.startswith("tiles/") and (tile := tile_of_name(path[len("tiles/"):])) is not None:
        return tile_disk_name(tile)
    return spec


@contextlib.contextmanager
def mounted(image: Image, entry: DeviceEntry) -> Iterator[Filesystem]:
    """littlefs of ``entry``, mounted over a checked copy of its bytes; signals are held
    while it is (see the module doc). A blank device (its tile never used its storage) is
    an empty filesystem, as the machine shows it: it formats one on first use."""
    data = image.read_device(entry.name)  # (checked: its chunks and its digest)
    with signals_held():
        try:
            fs = Filesystem(MemoryDevice(data, entry.block_size))
            if not entry.chunks:
                fs.format()
            fs.mount()
        except (OSError, ValueError) as exc:  # (ValueError: a geometry littlefs cannot have)
            raise OfflineError(f"device {entry.name!r} of image {image.path} holds no filesystem "
                               f"that mounts ({exc})") from None
        try:
            yield fs
        finally:
            fs.unmount()


def _component_problem(name) -> str | None:
    """Why a name littlefs returned cannot be one path component, or None."""
    if not isinstance(name, str):
        return "it is not text"
    if name in (".", ".."):
        return f"a directory entry is named {name!r}"
    if "/" in name:
        return "it contains '/'"
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        return "it is not valid UTF-8"
    if b"\0" in raw:
        return "it contains a NUL byte"
    if len(raw) > NAME_MAX:
        return f"it is {len(raw)} bytes long, over NAME_MAX ({NAME_MAX})"
    return None


def _raw_listing(handle, path: str) -> list:
    """Every entry littlefs stores in directory ``path``, ``.`` and ``..`` included."""
    directory = lfs.dir_open(handle, path, "utf-8")
    entries = []
    try:
        while True:
            info = lfs.dir_read(handle, directory, "utf-8")
            if info is None:
                return entries
            entries.append(info)
    finally:
        lfs.dir_close(handle, directory)


def _entries(fs: Filesystem, path: str) -> list[tuple[str, bool, int]]:
    """(name, is_dir, size) of directory ``path``, refusing names no directory can hold."""
    try:
        # the raw call through the Filesystem's own gate (mounted, exclusive, errno)
        infos = fs._run("scandir", path, None, _raw_listing, path)
    except UnicodeDecodeError:
        raise OfflineError(f"a name in {path!r} is not valid UTF-8; refused") from None
    except OSError as exc:
        raise OfflineError(f"cannot list {path!r}: {exc.strerror or exc}") from None
    out = []
    dots = {".": 0, "..": 0}
    for info in infos:
        name = info.name
        if name in dots and dots[name] == 0:
            dots[name] = 1  # the one littlefs makes for every directory
            continue
        problem = _component_problem(name)
        if problem:
            raise OfflineError(f"refusing the name {name!r} in {path!r}: {problem}")
        out.append((name, info.type == 2, info.size if info.type != 2 else 0))  # 2: LFS_TYPE_DIR
    return out


def _mtime(fs: Filesystem, path: str) -> int | None:
    try:
        return fs.get_mtime(path)
    except OSError:
        return None


def _join(directory: str, name: str) -> str:
    return directory.rstrip("/") + "/" + name


def _inner(path: str) -> str:
    """A path in a device, canonical as a tile's VFS makes it: absolute, ``.`` and ``..``
    resolved by name (a tile has no symbolic links), never above ``/`` (``/..`` is ``/``,
    which littlefs itself would refuse). A trailing slash stays: it asks for a directory."""
    if not path:
        raise OfflineError("an empty path names nothing in the device; give one such as /")
    canonical = posixpath.normpath("/" + path.lstrip("/"))
    return canonical + "/" if path.endswith("/") and canonical != "/" else canonical


def on_device(fs: Filesystem, entry: DeviceEntry, path: str) -> str:
    """``path`` as the device holds it. The shell and the mount show the chip disk under
    ``/chip`` and tile N's disk under ``/tiles/N``; a path copied from there, which the
    device does not hold as given, is taken without that prefix."""
    prefix = entry.mount if entry.tile is None else f"/tiles/{entry.tile}"
    inner = _inner(path)
    if not prefix or prefix == "/" or not (inner == prefix or inner.startswith(prefix + "/")):
        return path
    try:
        fs.stat(inner)
        return path  # (the device has a directory of that name itself)
    except OSError:
        return inner[len(prefix):] or "/"


def list_dir(fs: Filesystem, path: str = "/") -> list[Node]:
    """The entries of ``path`` (a directory; a file lists itself), sorted by name."""
    path = _inner(path)
    try:
        info = fs.stat(path)
    except OSError as exc:
        raise OfflineError(f"{path}: {exc.strerror or exc}") from None
    if not info.is_dir:
        return [Node(info.name, False, info.size, _mtime(fs, path))]
    nodes = []
    for name, is_dir, size in _entries(fs, path):
        checkpoint()
        nodes.append(Node(name, is_dir, size, _mtime(fs, _join(path, name))))
    return sorted(nodes, key=lambda n: n.path)


def read_file(fs: Filesystem, path: str) -> bytes:
    path = _inner(path)
    try:
        if fs.stat(path).is_dir:
            raise OfflineError(f"{path} is a directory (`ipuos image ls` lists it)")
        parts = []
        with fs.open(path, "rb") as file:
            while True:
                checkpoint()
                part = file.read(READ_PART)
                if not part:
                    return b"".join(parts)
                parts.append(part)
    except OSError as exc:
        raise OfflineError(f"{path}: {exc.strerror or exc}") from None


#: bytes of a file read in one littlefs call: a signal waits for at most one such read
READ_PART = 1 << 20


def walk(fs: Filesystem, top: str = "/") -> list[Node]:
    """Every entry under ``top``, parents before children.

    A damaged (or crafted) image can make a directory entry point back at one of its
    ancestors: the walk would never end. No real tree has more entries than its device
    has room for, nor is deeper than it has metadata pairs (two blocks per directory),
    so either proves the damage. Paths are not limited to the host's PATH_MAX here (a
    tile can make deeper trees; extraction checks what the host can take), only to
    ``MAX_WALK_PATH``, which keeps a crafted image from filling memory with paths.
    """
    most = fs.device.block_count * fs.device.block_size // _SMALLEST_ENTRY
    deepest = fs.device.block_count // 2
    nodes: list[Node] = []
    stack = [("", top, 0)]
    while stack:
        rel, path, depth = stack.pop()
        for name, is_dir, size in sorted(_entries(fs, path)):
            checkpoint()
            child_rel = f"{rel}/{name}" if rel else name
            child = _join(path, name)
            if depth >= deepest or len(nodes) >= most:
                raise OfflineError(
                    f"{top}: the directories never end (at {child[:80]!r}...): one of them "
                    "leads back to an ancestor; the image is damaged")
            if len(child) > MAX_WALK_PATH:
                raise OfflineError(
                    f"{top}: a path under it is over {MAX_WALK_PATH // 1024} KiB long (at "
                    f"{child[:80]!r}...), more than ipuos walks; list or extract a deeper "
                    "directory (if no tile made such a tree, the image is damaged)")
            nodes.append(Node(child_rel, is_dir, size, _mtime(fs, child)))
            if is_dir:
                stack.append((child_rel, child, depth + 1))
    return nodes


#: the longest path (characters) :func:`walk` follows
MAX_WALK_PATH = 64 * 1024


#: bytes of metadata the smallest littlefs entry takes (a tag, a name, a struct)
_SMALLEST_ENTRY = 12


def extract(fs: Filesystem, top: str, dest, *, like: int = 0o644, before_commit=checkpoint) -> dict:
    """Write the tree under ``top`` to the host directory ``dest`` (created, or an empty
    directory that is kept as it is: a mount point, someone's cwd, its mode), files with
    their mtimes. All or nothing.

    Files get the read and write permissions of ``like`` (the image file's mode: a
    private image extracts private), directories those plus search where reading is
    allowed; the umask applies as to any new file.

    ``before_commit()`` runs once the tree is staged, just before it moves into place:
    the last point a held signal stops it (the CLI passes ``_signals.settle``: one that
    comes after it must not make a finished extraction look stopped).
    """
    file_mode = like & 0o666
    dir_mode = file_mode | (file_mode & 0o444) >> 2
    if not os.fspath(dest):  # (abspath would make it the current directory)
        raise OfflineError("an empty destination names no directory; give a new or empty one")
    dest = os.path.abspath(os.fspath(dest))
    if os.path.islink(dest):  # a link to a directory is that directory (as for tar -C, cp)
        target = os.path.realpath(dest)
        if not os.path.isdir(target):
            missing = not os.path.lexists(target)
            raise OfflineError(f"cannot extract to {dest}: it is a symbolic link to {target}, which "
                               f"{'does not exist' if missing else 'is not a directory'}")
        dest = target
    top = _inner(top)
    try:
        if not fs.stat(top).is_dir:
            raise OfflineError(f"{top} is a file; extract takes a directory (`ipuos image cat` reads a file)")
    except OSError as exc:
        raise OfflineError(f"{top}: {exc.strerror or exc}") from None
    nodes = walk(fs, top)
    refused = []
    for node in nodes:  # the whole tree is checked before anything is created
        try:
            check_name(node.path)
        except UnsafePathError as exc:
            refused.append(str(exc))
    if refused:
        more = f" (and {plural(len(refused) - 1, 'more name')} like it)" if len(refused) > 1 else ""
        raise OfflineError(f"{refused[0]}{more}; nothing extracted (--path extracts a directory that "
                           "holds no such name; `ipuos image cat` reads a file whatever its name)")
    parent = os.path.dirname(dest)
    prefix = f".{name_prefix(os.path.basename(dest), 100)}."
    # (an extract killed outright left its staging directory: inside DEST it would make
    # DEST "not empty"; nobody holds it locked, as a live extract does its own)
    remove_dead_temps(parent, prefix)
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(dest).st_mode):
            remove_dead_temps(dest, prefix)
    existing = _check_destination(dest, parent)
    # staging inside an existing DEST changes its times: a refusal puts them back
    times = os.stat(dest) if existing else None
    try:  # staged beside a new destination, inside an existing one: moved in by renames
        lock, staging = locked_temp(dest if existing else parent, prefix, is_dir=True)
    except OSError as exc:  # (the name of the staging directory would only puzzle)
        raise OfflineError(f"cannot extract to {dest}: {exc.strerror or exc}") from None
    committed = False
    try:
        files = _write_tree(fs, top, staging, nodes, file_mode, dir_mode)
        before_commit()
        if existing:
            _move_into(staging, dest)
        else:
            try:
                os.rename(staging, dest)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise OfflineError(f"{dest} was created meanwhile and is not empty; nothing extracted") from None
                raise
            os.chmod(dest, dir_mode & ~_umask())
        committed = True
    except OSError as exc:  # a full or failing host disk, say: the user knows DEST, not staging
        raise OfflineError(f"cannot extract to {dest}: {exc.strerror or exc}; nothing extracted") from None
    finally:
        os.close(lock)
        if not committed:
            shutil.rmtree(staging, ignore_errors=True)
            if times is not None:
                with contextlib.suppress(OSError):
                    os.utime(dest, ns=(times.st_atime_ns, times.st_mtime_ns))
    return {"dest": dest, "files": files, "directories": sum(n.is_dir for n in nodes),
            "bytes": sum(n.size for n in nodes if not n.is_dir)}


def _check_destination(dest: str, parent: str) -> bool:
    """Whether ``dest`` exists (as an empty directory); OfflineError if it cannot be one."""
    problem = directory_problem(parent)
    if problem:
        raise OfflineError(f"cannot extract to {dest}: {problem}")
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        return False
    except OSError as exc:  # a name too long, say
        raise OfflineError(f"cannot extract to {dest}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise OfflineError(f"cannot extract to {dest}: it exists and is not a directory")
    if os.listdir(dest):
        raise OfflineError(f"cannot extract to {dest}: it is not empty")
    return True


def _move_into(staging: str, dest: str) -> None:
    """Move what ``staging`` (inside ``dest``) holds up into ``dest``, and remove it; if a
    move fails, what was moved goes back first (all or nothing)."""
    names = os.listdir(staging)
    if set(os.listdir(dest)) != {os.path.basename(staging)}:
        raise OfflineError(f"{dest} was written to meanwhile and is not empty; nothing extracted")
    moved = []
    try:
        for name in names:
            os.rename(os.path.join(staging, name), os.path.join(dest, name))
            moved.append(name)
    except BaseException:
        for name in reversed(moved):
            os.rename(os.path.join(dest, name), os.path.join(staging, name))
        raise
    os.rmdir(staging)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_tree(fs: Filesystem, top: str, root: str, nodes: list[Node], file_mode: int, dir_mode: int) -> int:
    files = 0
    dirs = []
    for node in nodes:
        checkpoint()
        if node.is_dir:
            os.close(_open_dir_beneath(root, node.path, create=dir_mode))
            dirs.append(node)
            continue
        data = read_file(fs, _join(top, node.path))
        fd = open_beneath(root, node.path, mode=file_mode, dir_mode=dir_mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if node.mtime_ns is not None:
                os.utime(fd, ns=(node.mtime_ns, node.mtime_ns))
        finally:
            os.close(fd)
        files += 1
    for node in reversed(dirs):  # children first: writing into a directory changes its mtime
        if node.mtime_ns is not None:
            fd = _open_dir_beneath(root, node.path)
            try:
                os.utime(fd, ns=(node.mtime_ns, node.mtime_ns))
            finally:
                os.close(fd)
    return files


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _open_dir_beneath(root: str, path: str, create: int | None = None) -> int:
    """An fd of directory ``path`` under ``root``, walked without following symlinks;
    missing directories are made with mode ``create`` if given."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in check_name(path):
            if create is not None:
                try:
                    os.mkdir(part, create, dir_fd=fd)
                except FileExistsError:
                    pass
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd
