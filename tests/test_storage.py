"""Storage at boot and over a machine's life: disks, lazy bring-up, /chip, snapshots.

Real machines (tiny preset), real littlefs, the real scheduler: storage work happens on
the owner tile, reached through its kernel services.
"""

from __future__ import annotations

import errno
import threading

import greenlet
import pytest

import ipuos
from ipuos.blockdev import BlockDevice, CorruptFilesystemError, FaultPlan, Filesystem, MemoryDevice
from ipuos.vfs import CHIP_CACHE_REGION, CHIP_DISK_REGION, DISK_REGION, Storage, Vfs, mount_device

KiB = 1024


def on_tile(machine, tile: int, function):
    """Run ``function(tile_object)`` on the tile's own greenlet; return its result."""
    machine.scheduler.services["test.call"] = lambda tile_obj, fn: fn(tile_obj)
    return machine.fs.submit(tile, "test.call", function).result(10)


def test_every_tile_gets_a_disk_region():
    with ipuos.Machine("tiny") as machine:
        for tile in range(machine.ntiles):
            regions = {r["name"]: r["size"] for r in machine.sram_usage(tile)["regions"]}
            assert regions[DISK_REGION] == machine.preset.disk_size


def test_storage_comes_up_on_first_use_on_the_owner():
    with ipuos.Machine("tiny") as machine:
        tiles = machine.scheduler.tiles
        # but the chip tile's, at boot: mounting /chip takes the exchange (not in a program)
        assert [t.id for t in tiles if "vfs" in t.kernel_data] == [0]
        machine.run("print(1)", tiles="0-15")  # a program that touches no file
        assert [t.id for t in tiles if "vfs" in t.kernel_data] == [0]
        assert machine.fs.listdir(3, "/") == []
        assert [t.id for t in tiles if "vfs" in t.kernel_data] == [0, 3]
        seen = on_tile(machine, 3, lambda tile: greenlet.getcurrent() is tile.glet)
        assert seen is True


def test_eager_storage_brings_every_tile_up_at_boot():
    with ipuos.Machine("tiny", storage="eager") as machine:
        assert all("vfs" in t.kernel_data for t in machine.scheduler.tiles)
        assert machine.fs.statvfs(9).f_blocks == machine.preset.disk_size // machine.preset.disk_block_size
    with pytest.raises(ValueError, match="storage must be one of"):
        ipuos.Machine("tiny", storage="sometimes")


def test_storage_is_only_brought_up_by_the_owner():
    with ipuos.Machine("tiny") as machine:
        with pytest.raises(RuntimeError, match="its own greenlet"):
            machine.storage.vfs(machine.scheduler.tiles[2])


def test_the_tile_disk_formats_once_and_keeps_its_files():
    with ipuos.Machine("tiny") as machine:
        machine.run("open('/kept', 'w').write('first program')", tiles="5")
        machine.run("open('/second', 'w').write('second program')", tiles="5")
        assert sorted(machine.fs.listdir(5, "/")) == ["kept", "second"]


def test_a_tile_without_a_disk_has_an_empty_read_only_root():
    with ipuos.Machine("tiny", disk_size=0) as machine:
        assert machine.fs.listdir(4, "/") == []
        result = machine.run("open('/x', 'w')", tiles="4")
        assert "OSError: [Errno 30]" in result.tiles[0].error
        assert DISK_REGION not in {r["name"] for r in machine.sram_usage(4)["regions"]}


# -- tile 0: /chip and /tiles --------------------------------------------------------------


def chip_in_tile0_sram(size=32 * KiB, block=512):
    def build(tile):
        return MemoryDevice.for_region(tile.memory.alloc("chiptest", size), block)

    return build


def test_tile_0_mounts_the_chip_disk_and_the_tiles():
    with ipuos.Machine("tiny", disk_size=16 * KiB, chip_device=chip_in_tile0_sram()) as machine:
        mounts = {m[0]: m for m in machine.fs.mounts(0)}
        assert sorted(mounts) == ["/", "/chip", "/tiles"]
        assert mounts["/chip"][1] == "littlefs" and "tile 0 'chiptest'" in mounts["/chip"][2]
        assert mounts["/tiles"][1] == "tiles"
        assert [m[0] for m in machine.fs.mounts(1)] == ["/"]  # only tile 0 has them
        machine.fs.write_file(0, "/chip/shared", b"on the chip disk")
        assert machine.fs.listdir(0, "/chip") == ["shared"]
        assert machine.fs.listdir(0, "/") == ["chip", "tiles"]
        assert machine.fs.statvfs(0, "/chip").f_blocks == 64
        assert machine.fs.statvfs(0, "/").f_blocks == 32
        result = machine.run("print(open('/chip/shared').read())", tiles="0")
        assert result.tiles[0].output == "on the chip disk\n"
        with pytest.raises(OSError) as excinfo:
            machine.fs.rename(0, "/chip/shared", "/shared")
        assert excinfo.value.errno == errno.EXDEV


def test_the_default_chip_disk_is_striped_over_the_other_tiles():
    with ipuos.Machine("tiny") as machine:
        share = machine.preset.chipdisk_share
        for tile in range(1, machine.ntiles):
            regions = {r["name"]: r["size"] for r in machine.sram_usage(tile)["regions"]}
            assert regions[CHIP_DISK_REGION] == share
        assert CHIP_CACHE_REGION in {r["name"] for r in machine.sram_usage(0)["regions"]}
        assert "StripedDevice" in {m[0]: m[2] for m in machine.fs.mounts(0)}["/chip"]
        data = bytes(range(256)) * 40
        machine.fs.write_file(0, "/chip/spread", data)
        assert machine.fs.read_file(0, "/chip/spread") == data
        assert machine.fs.statvfs(0, "/chip").f_blocks == 15 * share // machine.preset.chipdisk_block_size
        result = machine.run("print(len(open('/chip/spread', 'rb').read()))", tiles="0")
        assert result.tiles[0].output == f"{len(data)}\n"
    with ipuos.Machine("tiny", chipdisk_share=0) as machine:
        assert [m[0] for m in machine.fs.mounts(0)] == ["/", "/tiles"]


def test_a_chip_disk_that_fails_leaves_tile_0_working():
    def broken(tile):
        raise OSError(errno.EIO, "no chip disk today")

    with ipuos.Machine("tiny", chip_device=broken) as machine:
        assert machine.fs.listdir(0, "/") == ["tiles"]
        assert any("chip disk could not be mounted" in e and "no chip disk today" in e
                   for e in machine.scheduler.internal_errors)


# -- snapshots and restores ----------------------------------------------------------------


def test_snapshot_and_restore_round_trip():
    with ipuos.Machine("tiny") as machine:
        machine.run("open('/a', 'w').write('version 1')", tiles="3")
        image = machine.fs.snapshot(3)
        assert image["block_size"] == 512 and image["block_count"] == 32
        assert len(image["data"]) == machine.preset.disk_size
        machine.run("import os\nopen('/a', 'w').write('version 2')\nos.mkdir('/new')", tiles="3")
        machine.fs.restore(3, "/", image["data"])
        assert machine.fs.listdir(3, "/") == ["a"]
        assert machine.fs.read_file(3, "/a") == b"version 1"
        # the same image restores onto another tile, too
        machine.fs.restore(9, "/", image["data"])
        assert machine.fs.read_file(9, "/a") == b"version 1"
        assert machine.fs.stat(9, "/a").st_mtime_ns == machine.fs.stat(3, "/a").st_mtime_ns > 0


def test_a_chip_disk_snapshot_holds_a_close_served_in_the_same_superstep():
    # the chip disk writes back after a sync at the next exchange: a snapshot served right
    # after the close must flush first, or it shows the file as it was
    with ipuos.Machine("tiny") as machine:
        machine.fs.write_file(0, "/chip/a", b"old")
        handle = machine.fs.submit(0, "fs.open", "/chip/a", "wb").result(10)
        pending = [machine.fs.submit(0, "fs.write", handle, None, b"new content"),
                   machine.fs.submit(0, "fs.close", handle),
                   machine.fs.submit(0, "fs.snapshot", "/chip")]
        snapshot = [future.result(10) for future in pending][-1]
        device = MemoryDevice(bytearray(snapshot["data"]), snapshot["block_size"])
        offline = Filesystem(device)
        offline.mount()
        with offline.open("/a") as f:
            assert f.read() == b"new content"
        offline.unmount()


def test_restore_refuses_while_files_are_open_and_garbage_does_not_mount():
    with ipuos.Machine("tiny") as machine:
        machine.fs.write_file(2, "/f", b"data")
        image = machine.fs.snapshot(2)["data"]
        handle = machine.fs.open_handle(2, "/f", "rb")
        with pytest.raises(OSError) as excinfo:
            machine.fs.restore(2, "/", image)
        assert excinfo.value.errno == errno.EBUSY
        machine.fs.close_handle(2, handle)
        with pytest.raises(ValueError, match="cannot restore"):
            machine.fs.restore(2, "/", image[:-512])
        assert machine.fs.read_file(2, "/f") == b"data"  # refused before anything changed
        with pytest.raises(CorruptFilesystemError):
            machine.fs.restore(2, "/", bytes(len(image)))
        with pytest.raises(OSError) as excinfo:
            machine.fs.listdir(2, "/")  # nothing mounted now, and nothing formatted
        assert excinfo.value.errno == errno.EINVAL
        machine.fs.restore(2, "/", image)
        assert machine.fs.read_file(2, "/f") == b"data"
        with pytest.raises(OSError) as excinfo:
            machine.fs.snapshot(0, "/tiles")
        assert excinfo.value.errno == errno.EINVAL


def test_mount_existing_mounts_restored_bytes_instead_of_formatting():
    with ipuos.Machine("tiny") as source:
        source.fs.write_file(1, "/saved", b"from another machine")
        image = source.fs.snapshot(1)["data"]
    with ipuos.Machine("tiny") as machine:
        region = machine.scheduler.tiles[6].memory.get(DISK_REGION)
        region.view[:] = image  # raw bytes written before the tile ever used storage
        machine.storage.mount_existing([6])
        assert machine.fs.read_file(6, "/saved") == b"from another machine"


def test_restored_bytes_that_do_not_mount_can_be_restored_over():
    with ipuos.Machine("tiny") as machine:
        machine.fs.write_file(2, "/good", b"good")
        image = machine.fs.snapshot(2)["data"]
        region = machine.scheduler.tiles[6].memory.get(DISK_REGION)
        region.view[:] = b"\x5a" * len(region.view)  # not a filesystem
        machine.storage.mount_existing([6])
        with pytest.raises(OSError) as excinfo:
            machine.fs.listdir(6, "/")
        assert excinfo.value.errno == errno.EINVAL and "not mounted" in str(excinfo.value)
        assert any("tile 6: its disk holds no filesystem" in e for e in machine.scheduler.internal_errors)
        machine.fs.restore(6, "/", image)
        assert machine.fs.read_file(6, "/good") == b"good"


def test_snapshots_taken_while_a_program_writes_are_consistent():
    with ipuos.Machine("tiny") as machine:
        handle = machine.launch("""
import os
n = 0
while not os.path.exists("/stop"):
    with open(f"/f{n % 4}", "w") as f:
        f.write(str(n) * 50)
    n += 1
    sync()
print(n > 0)
""", tiles="5")
        images = [machine.fs.snapshot(5)["data"] for _ in range(5)]
        machine.fs.write_file(5, "/stop", b"")
        assert handle.wait(30).tiles[0].output == "True\n"
        for image in images:  # each one mounts and reads back whole files
            scratch = Vfs()
            device = MemoryDevice.new(512, 32)
            device.restore(image)
            mount_device(scratch, "/", device)
            for name in scratch.listdir("/"):
                text = scratch.open("/" + name).read()
                assert text == text[: len(text) // 50] * 50


def test_device_failure_mid_operation_is_eio_and_data_survives_a_remount():
    with ipuos.Machine("tiny", disk_size=16 * KiB, chip_device=chip_in_tile0_sram()) as machine:
        machine.fs.write_file(0, "/chip/kept", b"written before the fault")
        machine.fs.sync(0)

        def break_device(tile):
            return machine.storage.vfs(tile).backend("/chip").device.attach_faults(FaultPlan(stop_after=2))

        plan = on_tile(machine, 0, break_device)
        with pytest.raises(OSError) as excinfo:
            machine.fs.write_file(0, "/chip/lost", bytes(4 * KiB))
        assert excinfo.value.errno == errno.EIO
        assert plan.stopped
        result = machine.run("print(open('/chip/kept').read())", tiles="0")
        assert "OSError: [Errno 5]" in result.tiles[0].error  # unusable until remounted
        on_tile(machine, 0, lambda tile: machine.storage.vfs(tile).backend("/chip").device.detach_faults())
        machine.fs.remount(0, "/chip")
        assert machine.fs.read_file(0, "/chip/kept") == b"written before the fault"
        assert machine.fs.listdir(0, "/") == ["chip", "tiles"]  # the tile's own disk was untouched


@pytest.mark.parametrize("victim", range(1, 16))
def test_a_chip_disk_tile_failing_mid_overwrite_leaves_the_old_file_or_the_new(victim):
    """Whichever backing tile fails while a file is overwritten and then recovered (the
    chip disk remounted while it is down, as a device error asks): the file is wholly old
    or wholly new once the tile is back, never a mix, and losing the new one is reported."""
    old = bytes((31 + i * 7 + (i >> 8)) & 0xFF for i in range(3000))
    new = bytes((62 + i * 7 + (i >> 8)) & 0xFF for i in range(3000))
    with ipuos.Machine("tiny") as machine:
        fs = machine.fs
        fs.write_file(0, "/chip/keep", b"kept" * 100)
        fs.write_file(0, "/chip/f", old)
        fs.sync(0)
        fs.remount(0, "/chip")  # a cold cache: everything on the tiles
        machine.scheduler.fail_tile(victim)
        errors = []
        for step in (lambda: fs.write_file(0, "/chip/f", new), lambda: fs.read_file(0, "/chip/f"),
                     lambda: fs.remount(0, "/chip")):
            try:
                step()
            except OSError as exc:
                assert exc.errno == errno.EIO
                errors.append(str(exc))
        machine.scheduler.fail_tile(victim, failed=False)
        fs.remount(0, "/chip")
        got = fs.read_file(0, "/chip/f")
        assert got in (old, new), f"neither old nor new: {len(got)} bytes"
        if got == old:
            assert any("dropped" in e or "not answering" in e for e in errors), errors
        assert fs.read_file(0, "/chip/keep") == b"kept" * 100


def test_storage_object_on_a_bare_scheduler():
    from ipuos._sram import SRAM
    from ipuos.scheduler import Scheduler

    sched = Scheduler(SRAM(4, 64 * KiB), 4, exchange_out=4 * KiB, exchange_in=8 * KiB)
    storage = Storage(sched, disk_size=16 * KiB, disk_block_size=512)
    sched.start()
    try:
        storage.bring_up([1, 2])
        assert [("vfs" in t.kernel_data) for t in sched.tiles] == [False, True, True, False]
        assert storage.client.listdir(1, "/") == []
    finally:
        sched.stop()


# -- a device that pauses its caller inside littlefs (as the striped chip disk does) ---------


class MirroredDevice(BlockDevice):
    """Blocks kept in another tile's SRAM and moved by the exchange: a striped device in
    miniature. Every operation pauses the calling greenlet until the next exchange, and
    checks that it runs on its owner inside the ownership bracket."""

    def __init__(self, tile, remote, staging, block_size):
        super().__init__(block_size, remote.size // block_size)
        self.tile, self.remote, self.staging = tile, remote, staging
        self.violations = []

    def _check(self):
        tile = self.tile
        if tile.fs_depth <= 0 or greenlet.getcurrent() is not tile.glet:
            self.violations.append((tile.fs_depth, greenlet.getcurrent() is tile.glet))

    def _move(self, src, dst, nbytes):
        self.tile.sched.remote_copy(self.tile, [(self.remote.tile, src, dst, nbytes)], "mirror")

    def _read_block(self, block, off, size):
        self._check()
        self._move(self.remote.base + block * self.block_size + off, self.staging.base, size)
        return self.staging.view[:size].tobytes()

    def _prog_block(self, block, off, data):
        self._check()
        self.staging.view[: len(data)] = data
        self._move(self.staging.base, self.remote.base + block * self.block_size + off, len(data))

    def _erase_block(self, block):
        self._check()
        self.staging.view[: self.block_size] = bytes(self.block_size)
        self._move(self.staging.base, self.remote.base + block * self.block_size, self.block_size)


def test_a_device_that_pauses_inside_littlefs_keeps_ownership():
    devices = []

    def mirrored(tile):
        remote = tile.sched.tiles[1].memory.alloc("mirror", 24 * KiB)
        staging = tile.memory.alloc("staging", 512)
        devices.append(MirroredDevice(tile, remote, staging, 512))
        return devices[0]

    with ipuos.Machine("tiny", disk_size=16 * KiB, chip_device=mirrored) as machine:
        handle = machine.launch("""
import os
for n in range(12):
    with open(f"/chip/f{n}", "w") as f:
        f.write(str(n) * 40)
    os.listdir("/chip")
print(sum(len(open(f"/chip/f{n}").read()) for n in range(12)))
""", tiles="0")
        errors = []

        def hammer():
            try:
                for _ in range(30):
                    machine.fs.listdir(0, "/chip")
                    machine.fs.statvfs(0, "/")
                    for name in machine.fs.listdir(0, "/chip"):
                        machine.fs.read_file(0, "/chip/" + name)
            except Exception as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=hammer) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        result = handle.wait(60)
        assert result.tiles[0].output == f"{sum(len(str(n) * 40) for n in range(12))}\n", result.tiles[0].error
        assert errors == [] and machine.scheduler.internal_errors == []
        image = machine.fs.snapshot(0, "/chip")  # snapshot pauses too, between operations
        assert len(image["data"]) == 24 * KiB
        assert devices[0].violations == []
        assert machine.scheduler.engine.supersteps_with_traffic > 100
