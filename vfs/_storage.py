"""Storage at boot: every tile's SRAM disk, its VFS, tile 0's extra mounts, the services.

:class:`Storage` is what ``Machine`` builds next to the scheduler. At boot it only does
what must happen before tiles run: it carves a ``disk`` region (``disk_size`` bytes) out
of every tile's SRAM, so SRAM accounting shows it from the start, and registers the
``fs.*`` kernel services. Each tile's filesystem then comes up **on the tile itself, on
first use** (the first program that opens a file there, or the first request for it):
a ``MemoryDevice`` over the region, a littlefs ``Filesystem``, formatted (SRAM is zero
at boot, so there is nothing to mount yet) and mounted at ``/``. Tile 0 also mounts the
chip disk at ``/chip`` (when a device for it is given) and ``/tiles``; the machine brings
tile 0 up at boot (see ``Machine``), because mounting ``/chip`` takes the exchange.

Why on first use: bringing a filesystem up costs 40-140 us and ~30 KiB of host memory per
tile (littlefs caches, the SRAM pages formatting writes, the tile's greenlet waking); on
a 32-chip machine that is ~6.5 s and ~1.4 GB for 47,104 filesystems most programs never
touch, against < 0.1 s and ~45 MB on one chip. The result is the same as formatting
everything at boot, and :meth:`Storage.bring_up` (``Machine(storage="eager")``) does
exactly that: every tile, through its own ``fs.boot`` service, in one superstep.

Whether a disk is formatted or mounted is decided by what the machine knows, never by
sniffing its bytes: a fresh disk is formatted; a disk whose bytes were restored
(:meth:`Storage.mount_existing`, or the ``fs.restore`` service) is mounted, and if it
does not mount, that is an error, not a silent format.
"""

from __future__ import annotations

import traceback
from typing import Callable, Iterable

import greenlet

from ipuos.blockdev import Filesystem, MemoryDevice

from ._backend import EmptyBackend
from ._changes import ChangeFeed
from ._chipdisk import reserve_striped_chip_disk
from ._client import HostFsClient, TileFsClient
from ._local import LittlefsBackend
from ._services import register_services
from ._session import TileSession
from ._tilesfs import TilesBackend
from ._vfs import VFS_KEY, Vfs

__all__ = ["Storage", "mount_device", "DISK_REGION", "CHIP_DISK_MOUNT", "TILES_MOUNT"]

#: the SRAM region holding a tile's own disk
DISK_REGION = "disk"
#: ``kernel_data`` key: the mounts a restore carries over to the tile's next VFS
_CARRIED_KEY = "vfs.carried"
CHIP_DISK_MOUNT = "/chip"
TILES_MOUNT = "/tiles"


def mount_device(vfs: Vfs, path: str, device, *, format: bool = False, readonly: bool = False,
                 **filesystem_options) -> LittlefsBackend:
    """Put littlefs on ``device`` and mount it at ``path`` of ``vfs``.

    ``format``: make a new, empty filesystem first (otherwise the device must hold one).
    Must run on the VFS owner's greenlet: formatting and mounting are littlefs calls.
    Unmounting the path later unmounts littlefs too.
    """
    backend = LittlefsBackend(Filesystem(device, **filesystem_options), vfs.owner, owns=True)
    backend.start(format=format)
    try:
        vfs.mount(path, backend, readonly=readonly, owns=True)
    except BaseException:
        backend.detach()
        raise
    return backend


class Storage:
    """Every tile's disk and VFS (see module doc). Create before the scheduler starts.

    The chip disk: by default a striped device over ``chipdisk_share`` bytes of every
    other tile's SRAM (see ``_chipdisk``; a share of 0 means no ``/chip``). A
    ``chip_device(tile)`` callable replaces it with any block device: it is called on the
    chip tile's greenlet (tile 0) when that tile's storage comes up, so a device that
    reaches other tiles through the exchange may already use it.
    """

    def __init__(self, scheduler, *, disk_size: int, disk_block_size: int,
                 chipdisk_share: int = 0, chipdisk_block_size: int = 0, chipdisk_cache: int = 0,
                 chipdisk_cache_page: int = 0, chipdisk_cache_heads: int = 0,
                 chip_device: Callable | None = None, chip_tile: int = 0):
        self.scheduler = scheduler
        self.disk_size = disk_size
        self.disk_block_size = disk_block_size
        self.chip_tile = chip_tile
        self._existing: set[int] = set()
        if disk_size:
            for tile in scheduler.tiles:
                tile.memory.alloc(DISK_REGION, disk_size)
        if chip_device is None:
            chip_device = reserve_striped_chip_disk(scheduler, chipdisk_share, chipdisk_block_size,
                                                    chipdisk_cache, chip_tile, chipdisk_cache_page,
                                                    chipdisk_cache_heads)
        #: ``chip_device(tile)``: the block device of ``/chip`` (None: no chip disk)
        self.chip_device = chip_device
        register_services(scheduler.services, self.vfs)
        #: the file API for host threads (the daemon, FUSE, backup)
        self.client = HostFsClient(scheduler)
        #: every change to a tile's filesystems is reported here (see ``_changes``)
        self.changes = ChangeFeed()

    # -- per tile -------------------------------------------------------------------------------

    def vfs(self, tile) -> Vfs:
        """``tile``'s VFS, brought up on first use. Only on ``tile``'s own greenlet."""
        vfs = tile.kernel_data.get(VFS_KEY)
        if vfs is None:
            vfs = self._bring_up(tile)
        return vfs

    def session(self, tile, new_globals: Callable[[str, str], dict] | None = None,
                warn: Callable[[str], None] | None = None) -> TileSession:
        """A program's view of ``tile``'s files (cheap: nothing is brought up yet).
        ``new_globals(name, filename)`` makes namespaces for modules imported from files;
        ``warn(message)`` writes a warning on the program's output."""
        return TileSession(tile, self.vfs, new_globals, warn)

    def mount_existing(self, tiles: Iterable[int]) -> None:
        """The disks of ``tiles`` already hold filesystems (their SRAM was restored before
        the tiles first used storage): mount them instead of formatting."""
        self._existing.update(tiles)

    def bring_up(self, tiles: Iterable[int] | None = None, timeout: float | None = 60.0) -> None:
        """Bring every tile's storage up now, each on its own greenlet, all in one
        superstep; raises the first failure."""
        ids = range(len(self.scheduler.tiles)) if tiles is None else tiles
        futures = self.client.submit_all("fs.boot", ids)
        for future in futures.values():
            future.result(timeout)

    def release(self) -> None:
        """After the machine has stopped (its tiles run no more): free every tile's
        littlefs memory, writing nothing (the SRAM goes with the machine). A tile that
        stopped inside a filesystem call keeps its filesystem as it is."""
        for tile in self.scheduler.tiles:
            vfs = tile.kernel_data.get(VFS_KEY)
            if vfs is None or tile.fs_depth:
                continue
            for info in vfs.mount_points():
                backend = vfs.backend(info.path)
                if isinstance(backend, LittlefsBackend):
                    backend.fs.release()

    # -- what backup and restore need ------------------------------------------------------------

    def state(self, tile) -> str:
        """``"up"`` (brought up), ``"restored"`` (its disk holds restored bytes, mounted on
        first use) or ``"blank"`` (never used: the disk is all zeros, formatted on first
        use). Only the tile itself changes it: ask on its greenlet or the scheduler thread."""
        if VFS_KEY in tile.kernel_data:
            return "up"
        return "restored" if tile.id in self._existing else "blank"

    def boot_mounts(self, tile) -> list[str]:
        """The mount points the tile's storage makes when it comes up: ``/`` (its disk)
        and, on the chip tile, ``/chip`` and ``/tiles``. Any other was made later (a RAM
        disk) and is on none of the machine's devices."""
        return ["/", CHIP_DISK_MOUNT, TILES_MOUNT] if tile.id == self.chip_tile else ["/"]

    def forget(self, tile, *, restored: bool) -> None:
        """On ``tile``'s own greenlet, with no file open: drop its mounts without writing a
        byte to their devices (a restore has just replaced those bytes), so the next use
        brings its storage up again as at boot: mounting the new bytes (``restored``) or
        formatting a blank disk. Mounts made after boot (RAM disks) are on no restored
        device: they stay as they are, mounted again in the new VFS. (A repl session
        waiting between blocks takes the new VFS at its next: ``TileSession.resume``.)"""
        vfs = tile.kernel_data.pop(VFS_KEY, None)
        if vfs is not None:
            made_here = self.boot_mounts(tile)
            carried = []
            for mount in reversed(vfs.mounts()):  # the deepest first
                if mount.path not in made_here:
                    carried.append(mount)  # a RAM disk: not restored, so nothing changed it
                elif isinstance(mount.backend, LittlefsBackend):
                    mount.backend.abandon()
            if carried:
                tile.kernel_data[_CARRIED_KEY] = carried[::-1]
        self.changes.reset(tile.id)  # its files are whatever the new bytes hold
        if restored:
            self._existing.add(tile.id)
        else:
            self._existing.discard(tile.id)

    # -- bringing one tile up --------------------------------------------------------------------

    def _bring_up(self, tile) -> Vfs:
        if greenlet.getcurrent() is not tile.glet:
            raise RuntimeError(
                f"tile {tile.id}'s storage can only be used on its own greenlet "
                "(send it a kernel request instead)"
            )
        vfs = Vfs(tile)
        fresh = tile.id not in self._existing
        self._existing.discard(tile.id)
        region = tile.memory.get(DISK_REGION)
        if region is not None:
            device = MemoryDevice.for_region(region, self.disk_block_size)
            root = LittlefsBackend(Filesystem(device), tile)
            try:
                root.start(format=fresh)
            except OSError:
                # restored bytes that do not mount: the tile keeps a VFS, so that a good
                # image can still be restored over them; until then "/" is not mounted
                tile.sched.report_internal_error(
                    f"tile {tile.id}: its disk holds no filesystem that mounts; restore one",
                    traceback.format_exc(),
                )
            vfs.mount("/", root)
        else:
            vfs.mount("/", EmptyBackend(), readonly=True)
        vfs.watch(self.changes)  # before anyone can see it (nothing to report until then)
        tile.kernel_data[VFS_KEY] = vfs
        if tile.id == self.chip_tile:
            self._mount_chip_tile_extras(tile, vfs, fresh)
        for mount in tile.kernel_data.pop(_CARRIED_KEY, ()):  # outermost first
            vfs.mount(mount.path, mount.backend, readonly=mount.readonly, owns=mount.owns, covering=True)
        return vfs

    def _mount_chip_tile_extras(self, tile, vfs: Vfs, fresh: bool) -> None:
        if self.chip_device is not None:
            try:
                mount_device(vfs, CHIP_DISK_MOUNT, self.chip_device(tile), format=fresh)
            except Exception:
                # the tile keeps its own disk; the report says why /chip is missing
                tile.sched.report_internal_error(
                    f"tile {tile.id}: the chip disk could not be mounted at {CHIP_DISK_MOUNT}",
                    traceback.format_exc(),
                )
        client = TileFsClient(tile, pending=vfs.pending)
        vfs.mount(TILES_MOUNT, TilesBackend(client, len(self.scheduler.tiles), self.changes))
