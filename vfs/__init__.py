"""The tile VFS: mounts, a POSIX-like file API with errno, and the kernel file services.

Each tile has one :class:`Vfs` (in ``tile.kernel_data``): its own SRAM disk at ``/``,
further mounts such as the chip disk at ``/chip`` and, on tile 0, every tile's files at
``/tiles/N``. Tile programs reach it through their ``open`` and ``os``
(:class:`TileSession`); everyone else asks the owner tile through the ``fs.*`` kernel
services, with :class:`HostFsClient` from host threads or :class:`TileFsClient` from
another tile. :class:`Storage` sets all of it up at boot. :class:`ChipFilesystem` serves
the files to the host as a FUSE mount (mfusepy, imported only when mounting).

This layer imports only the standard library, greenlet, ``ipuos.blockdev`` (littlefs), the
machine core, and mfusepy (lazily, when mounting).
"""

from ._backend import Backend, EmptyBackend
from ._chipdisk import CHIP_CACHE_REGION, CHIP_DISK_REGION, reserve_striped_chip_disk
from ._client import FsClient, HostFsClient, RemoteFile, TileFsClient
from ._entries import DirEntry, Entry
from ._files import TextFile, VfsFile
from ._fuse import FUSE_SUBTYPE, ChipFilesystem, FuseUnavailable, fuse_options, load_mfusepy, serve_fuse
from ._importer import MODULE_PATH
from ._local import LittlefsBackend, LocalFile
from ._services import MAX_HANDLES, SERVICE_NAMES
from ._session import TileSession
from ._storage import CHIP_DISK_MOUNT, DISK_REGION, TILES_MOUNT, Storage, mount_device
from ._tilesfs import TilesBackend
from ._paths import is_within
from ._cwds import working_directories
from ._vfs import HostOwner, MountInfo, Vfs, existing_vfs

__all__ = [
    "Vfs",
    "is_within",
    "working_directories",
    "existing_vfs",
    "HostOwner",
    "MountInfo",
    "Entry",
    "DirEntry",
    "VfsFile",
    "LocalFile",
    "RemoteFile",
    "TextFile",
    "Backend",
    "EmptyBackend",
    "LittlefsBackend",
    "TilesBackend",
    "mount_device",
    "reserve_striped_chip_disk",
    "Storage",
    "TileSession",
    "FsClient",
    "HostFsClient",
    "TileFsClient",
    "SERVICE_NAMES",
    "MAX_HANDLES",
    "MODULE_PATH",
    "DISK_REGION",
    "CHIP_DISK_REGION",
    "CHIP_CACHE_REGION",
    "CHIP_DISK_MOUNT",
    "TILES_MOUNT",
    "ChipFilesystem",
    "FuseUnavailable",
    "FUSE_SUBTYPE",
    "fuse_options",
    "load_mfusepy",
    "serve_fuse",
]
