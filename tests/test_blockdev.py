"""Block devices: the protocol, the SRAM and file devices, counters and fault plans."""

from __future__ import annotations

import errno
import os
import random

import numpy as np
import pytest

from ipuos.blockdev import (
    BlockDevice,
    DeviceUnresponsive,
    FaultPlan,
    FileDevice,
    Filesystem,
    MemoryDevice,
    PowerLost,
)


@pytest.fixture(params=["sram", "bytearray", "file"])
def device(request, sram, tmp_path):
    """The same 16 x 256 B geometry on each kind of device."""
    if request.param == "sram":
        dev = MemoryDevice.for_region(sram.memory(1).alloc("disk", 4096), 256)
    elif request.param == "bytearray":
        dev = MemoryDevice(bytearray(4096), 256)
    else:
        dev = FileDevice.create(tmp_path / "disk.img", 256, 16)
    yield dev
    dev.close()


# -- the protocol ----------------------------------------------------------------------


def test_geometry(device):
    assert (device.block_size, device.block_count, device.size) == (256, 16, 4096)
    assert device.erase_value == 0


def test_fresh_device_reads_erased(device):
    assert device.read(0, 0, 256) == bytes(256)
    assert device.read(15, 100, 5) == bytes(5)


def test_prog_read_erase(device):
    device.prog(3, 10, b"hello")
    device.prog(4, 0, bytes(range(256)))
    assert device.read(3, 8, 9) == b"\0\0hello\0\0"
    assert device.read(4, 0, 256) == bytes(range(256))
    data = device.read(4, 250, 6)
    assert type(data) is bytes and data == bytes(range(250, 256))
    device.erase(3)
    assert device.read(3, 0, 256) == bytes(256)
    assert device.read(4, 0, 4) == bytes(range(4))  # neighbours untouched
    device.sync()


def test_read_of_zero_bytes(device):
    assert device.read(2, 256, 0) == b""


@pytest.mark.parametrize(
    "call",
    [
        lambda d: d.read(16, 0, 1),
        lambda d: d.read(-1, 0, 1),
        lambda d: d.read(0, 250, 7),
        lambda d: d.read(0, -1, 1),
        lambda d: d.read(0, 0, -1),
        lambda d: d.prog(16, 0, b"x"),
        lambda d: d.prog(0, 255, b"xy"),
        lambda d: d.prog(0, -1, b"x"),
        lambda d: d.erase(16),
        lambda d: d.erase(-1),
    ],
)
def test_out_of_range_requests_are_refused(device, call):
    with pytest.raises(ValueError, match="outside the device"):
        call(device)
    assert device.snapshot() == bytes(4096)


def test_counters(device):
    device.prog(1, 0, b"abcd")
    device.prog(1, 4, b"ef")
    device.read(1, 0, 6)
    device.erase(1)
    device.erase(1)
    device.erase(2)
    device.sync()
    stats = device.stats()
    assert stats == {"reads": 1, "progs": 2, "erases": 3, "syncs": 1, "bytes_read": 6,
                     "bytes_progged": 6, "max_block_erases": 2}
    assert device.erase_counts[1] == 2 and device.erase_counts[2] == 1
    device.reset_stats()
    assert device.stats()["progs"] == 0 and max(device.erase_counts) == 0


def test_snapshot_and_restore_bypass_counters_and_faults(device):
    image = bytes(random.Random(1).randbytes(4096))
    device.attach_faults(FaultPlan(stop_after=0))
    device.restore(image)
    assert device.snapshot() == image
    assert device.stats()["reads"] == device.stats()["progs"] == 0
    with pytest.raises(ValueError):
        device.restore(image[:-1])


# -- MemoryDevice -------------------------------------------------------------------------


def test_memory_device_works_on_tile_sram_in_place(sram):
    region = sram.memory(0).alloc("disk", 2048)
    dev = MemoryDevice.for_region(region, 512)
    dev.prog(1, 3, b"\x01\x02")
    assert region.array[512 + 3] == 1 and region.array[512 + 4] == 2
    assert sram.tile_array(0)[region.offset + 515] == 1
    assert "tile 0 'disk'" in repr(dev)


def test_memory_device_accepts_buffers_of_any_format():
    words = np.zeros(256, dtype=np.uint32)  # 1024 bytes
    dev = MemoryDevice(words, 128)
    assert dev.block_count == 8
    dev.prog(0, 0, b"\xff\xff\xff\xff")
    assert words[0] == 0xFFFFFFFF


def test_memory_device_refuses_bad_buffers():
    with pytest.raises(TypeError, match="writable"):
        MemoryDevice(bytes(1024), 128)
    with pytest.raises(ValueError, match="whole number"):
        MemoryDevice(bytearray(1000), 128)
    with pytest.raises(ValueError, match="need a buffer of"):
        MemoryDevice(bytearray(1024), 128, 4)
    with pytest.raises(TypeError, match="contiguous"):
        MemoryDevice(np.zeros((16, 16), dtype=np.uint8)[:, ::2], 128)
    with pytest.raises(ValueError):
        MemoryDevice(bytearray(1024), 0)


def test_erase_value_is_configurable():
    dev = MemoryDevice.new(128, 4, erase_value=0xFF)
    assert dev.snapshot() == b"\xff" * 512
    dev.prog(0, 0, b"\0")
    dev.erase(0)
    assert dev.read(0, 0, 128) == b"\xff" * 128


def test_closed_memory_device_fails_operations():
    dev = MemoryDevice(bytearray(1024), 128)
    dev.close()
    with pytest.raises(ValueError):
        dev.read(0, 0, 1)


# -- FileDevice ------------------------------------------------------------------------------


def test_file_device_requires_the_exact_size(tmp_path):
    path = tmp_path / "img"
    path.write_bytes(bytes(1000))
    with pytest.raises(ValueError, match="1000 bytes"):
        FileDevice(path, 512, 2)
    with pytest.raises(ValueError, match="whole number"):
        FileDevice(path, 512)
    with pytest.raises(FileNotFoundError):
        FileDevice(tmp_path / "missing", 512, 2)
    path.write_bytes(bytes(1024))
    with FileDevice(path, 512) as dev:
        assert dev.block_count == 2


def test_file_device_create(tmp_path):
    path = tmp_path / "img"
    dev = FileDevice.create(path, 512, 8)
    assert os.path.getsize(path) == 4096
    dev.prog(7, 511, b"!")
    dev.sync()
    dev.close()
    assert dev.closed
    assert path.read_bytes()[-1:] == b"!"
    with pytest.raises(FileExistsError):
        FileDevice.create(path, 512, 8)
    FileDevice.create(path, 512, 4, exist_ok=True, erase_value=0xFF).close()
    assert path.read_bytes() == b"\xff" * 2048


def test_file_device_reports_a_truncated_image_as_eio(tmp_path):
    path = tmp_path / "img"
    dev = FileDevice.create(path, 512, 4)
    os.truncate(path, 1024)
    with pytest.raises(OSError) as excinfo:
        dev.read(3, 0, 512)
    assert excinfo.value.errno == errno.EIO
    dev.close()


def test_file_device_persists_a_filesystem(tmp_path):
    path = tmp_path / "img"
    with FileDevice.create(path, 512, 32) as dev:
        fs = Filesystem(dev)
        fs.format()
        fs.mount()
        with fs.open("/f", "w") as f:
            f.write(b"on the host disk")
        fs.unmount()
    with FileDevice(path, 512) as dev:
        fs = Filesystem(dev)
        fs.mount()
        with fs.open("/f") as f:
            assert f.read() == b"on the host disk"
        fs.unmount()


# -- subclassing the protocol --------------------------------------------------------------


class DictDevice(BlockDevice):
    """The smallest possible device: only the four primitives."""

    def __init__(self):
        super().__init__(128, 8)
        self.blocks = {}

    def _read_block(self, block, off, size):
        return bytes(self.blocks.get(block, bytes(128))[off : off + size])

    def _prog_block(self, block, off, data):
        buf = bytearray(self.blocks.get(block, bytes(128)))
        buf[off : off + len(data)] = data
        self.blocks[block] = bytes(buf)

    def _erase_block(self, block):
        self.blocks.pop(block, None)


def test_a_minimal_subclass_gets_checks_counters_and_faults():
    dev = DictDevice()
    dev.prog(2, 5, b"abc")
    assert dev.read(2, 4, 5) == b"\0abc\0"
    with pytest.raises(ValueError):
        dev.read(8, 0, 1)
    dev.attach_faults(FaultPlan(cut_power_after=0))
    with pytest.raises(PowerLost):
        dev.erase(2)
    assert dev.read.__self__ is dev and dev.progs == 1 and dev.erases == 1
    dev.detach_faults()
    assert dev.read(2, 5, 3) == b"abc"


def test_protocol_checks_geometry():
    with pytest.raises(ValueError):
        BlockDevice(0, 4)
    with pytest.raises(ValueError):
        BlockDevice(128, 0)


# -- fault plans ---------------------------------------------------------------------------------


def test_power_cut_after_k_writes():
    dev = MemoryDevice.new(128, 4)
    plan = dev.attach_faults(FaultPlan(cut_power_after=2))
    dev.prog(0, 0, b"a")
    dev.erase(1)
    assert dev.read(0, 0, 1) == b"a"  # reads do not count as writes
    with pytest.raises(PowerLost) as excinfo:
        dev.prog(0, 1, b"b")
    assert excinfo.value.errno == errno.EIO
    assert "write #2" in str(excinfo.value)
    assert plan.power_lost and plan.writes == 3
    assert dev.snapshot()[:2] == b"a\0"  # the interrupted write did not land
    for call in (lambda: dev.read(0, 0, 1), lambda: dev.erase(0), dev.sync):
        with pytest.raises(PowerLost):
            call()


def test_torn_write_lands_a_prefix():
    dev = MemoryDevice.new(128, 4)
    dev.attach_faults(FaultPlan(cut_power_after=0, torn=True, torn_fraction=0.25))
    with pytest.raises(PowerLost):
        dev.prog(1, 0, b"ABCDEFGH")
    assert dev.snapshot()[128:136] == b"AB\0\0\0\0\0\0"


def test_torn_erase_erases_a_prefix():
    dev = MemoryDevice.new(128, 4)
    dev.prog(0, 0, b"\x77" * 128)
    dev.attach_faults(FaultPlan(cut_power_after=0, torn=True))
    with pytest.raises(PowerLost):
        dev.erase(0)
    assert dev.snapshot()[:128] == bytes(64) + b"\x77" * 64


def test_device_stops_answering_after_n_operations():
    dev = MemoryDevice.new(128, 4)
    plan = dev.attach_faults(FaultPlan(stop_after=3))
    dev.read(0, 0, 1)
    dev.sync()
    dev.prog(0, 0, b"x")
    with pytest.raises(DeviceUnresponsive) as excinfo:
        dev.read(0, 0, 1)
    assert excinfo.value.errno == errno.EIO
    assert plan.stopped
    with pytest.raises(DeviceUnresponsive):
        dev.prog(1, 0, b"y")
    assert dev.snapshot()[128] == 0


def test_lying_device_acknowledges_but_does_not_store():
    dev = MemoryDevice.new(128, 4)
    dev.prog(2, 0, b"old")
    plan = dev.attach_faults(FaultPlan(lose_writes=True))
    dev.prog(2, 0, b"new")
    dev.erase(3)
    dev.prog(3, 0, b"z")
    dev.sync()
    assert dev.read(2, 0, 3) == b"new"  # the liar serves its cache
    assert dev.read(3, 0, 2) == b"z\0"
    assert dev.snapshot()[256:259] == b"old"  # the medium never saw it
    assert plan.writes == 3


def test_a_plan_belongs_to_one_device():
    plan = FaultPlan()
    MemoryDevice.new(128, 2).attach_faults(plan)
    with pytest.raises(ValueError, match="already attached"):
        MemoryDevice.new(128, 2).attach_faults(plan)


def test_fault_plan_arguments_are_checked():
    with pytest.raises(ValueError):
        FaultPlan(cut_power_after=-1)
    with pytest.raises(ValueError):
        FaultPlan(torn_fraction=1.5)
    assert "cut_power_after=3" in repr(FaultPlan(cut_power_after=3, torn=True))


# -- the erased value ----------------------------------------------------------------------------


@pytest.mark.parametrize("erase_value", [0x00, 0xFF])
@pytest.mark.parametrize("leftovers", ["erased", "garbage"])
def test_littlefs_round_trips_with_either_erased_value(erase_value, leftovers):
    """DESIGN's claim behind 0x00 SRAM: littlefs does not care what erased bytes hold,
    and formats over whatever was there before."""
    dev = MemoryDevice.new(256, 256, erase_value=erase_value)
    if leftovers == "garbage":
        dev.restore(random.Random(7).randbytes(dev.size))
    fs = Filesystem(dev)
    fs.format()
    fs.mount()
    payloads = {f"/d{n % 3}/f{n}": random.Random(n).randbytes(n * 97) for n in range(20)}
    for d in range(3):
        fs.mkdir(f"/d{d}")
    for round_ in range(3):  # rewrite, so blocks get erased and reused
        for path, data in payloads.items():
            with fs.open(path, "w") as f:
                f.write(data[round_:])
    fs.unmount()
    fs.mount()
    for path, data in payloads.items():
        with fs.open(path) as f:
            assert f.read() == data[2:]
    assert dev.erases > 0
    fs.unmount()
