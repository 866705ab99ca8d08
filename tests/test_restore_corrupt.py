"""A restore refuses every bad image, busy tile and foreign geometry with a clear message,
and touches no tile first: the whole SRAM of the target machine hashes the same before and
after, and its files are still there."""

from __future__ import annotations

import hashlib
import random

import pytest
import zstandard

import ipuos
from backup_craft import forge, image_parts, littlefs_device, write_tiny_image
from ipuos import _backup
from ipuos._backup import BackupError

KiB = 1024


def populate(machine, seed: int) -> None:
    rng = random.Random(seed)
    for tile in (0, 2, 5, 9, 15):
        machine.fs.makedirs(tile, "/dir/sub", exist_ok=True)
        machine.fs.write_file(tile, f"/dir/sub/f{seed}", rng.randbytes(rng.randrange(1, 3000)))
        machine.fs.write_file(tile, "/text", (f"tile {tile} seed {seed}\n" * 40).encode())
    machine.fs.write_file(0, "/chip/big", rng.randbytes(20 * KiB))


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "good.img"
    with ipuos.Machine("tiny") as source:
        populate(source, 1)
        _backup.backup(source, path)
    return path


@pytest.fixture(scope="module")
def target():
    """A machine with other files, which every refused restore must leave exactly so."""
    with ipuos.Machine("tiny") as machine:
        populate(machine, 2)
        yield machine


def sram_digest(machine) -> str:
    return hashlib.sha256(machine.sram.flat).hexdigest()


def refused(machine, path, *fragments, **kwargs) -> str:
    before = sram_digest(machine)
    states = [machine.storage.state(t) for t in machine.scheduler.tiles]
    with pytest.raises(BackupError) as excinfo:
        _backup.restore(machine, path, **kwargs)
    message = str(excinfo.value)
    for fragment in fragments:
        assert fragment in message, message
    assert sram_digest(machine) == before, "a refused restore changed SRAM"
    assert [machine.storage.state(t) for t in machine.scheduler.tiles] == states
    assert machine.fs.read_file(5, "/text") == b"tile 5 seed 2\n" * 40
    return message


def test_the_good_image_restores(good, tmp_path):
    with ipuos.Machine("tiny") as machine:
        populate(machine, 3)
        _backup.restore(machine, good)
        assert machine.fs.read_file(9, "/text") == b"tile 9 seed 1\n" * 40
        assert machine.fs.listdir(9, "/dir/sub") == ["f1"]


def test_header_bit_flips(good, target, tmp_path):
    raw = good.read_bytes()
    for offset in (0, 8, 9, 12, 20, 33, 41, 50, 60, 70, 90, 120, 150, 170, 191):
        bad = bytearray(raw)
        bad[offset] ^= 0x04
        path = tmp_path / f"h{offset}.img"
        path.write_bytes(bad)
        message = refused(target, path, f"image {path}", "nothing was restored")
        assert any(w in message for w in ("damaged", "not an ipuos image", "format version",
                                          "digest algorithm", "truncated", "beyond its end")), message


def test_manifest_bit_flips(good, target, tmp_path):
    raw = good.read_bytes()
    fields, _, _ = image_parts(raw)
    moff, mlen = fields[8], fields[9]
    rng = random.Random(7)
    for i in range(12):
        bad = bytearray(raw)
        at = moff + rng.randrange(mlen)
        bad[at] ^= 1 << rng.randrange(8)
        path = tmp_path / f"m{i}.img"
        path.write_bytes(bad)
        refused(target, path, "its manifest fails its checksum", "nothing was restored")


def test_random_flips_in_the_data(good, target, tmp_path):
    raw = good.read_bytes()
    fields, _, _ = image_parts(raw)
    data_start, data_end = 192, fields[8]
    rng = random.Random(11)
    for i in range(12):
        bad = bytearray(raw)
        bad[rng.randrange(data_start, data_end)] ^= 1 << rng.randrange(8)
        path = tmp_path / f"d{i}.img"
        path.write_bytes(bad)
        refused(target, path, "fails its checksum; the image is damaged", "nothing was restored")


def test_truncation_at_every_chunk_boundary(good, target, tmp_path):
    raw = good.read_bytes()
    fields, manifest, _ = image_parts(raw)
    cuts = sorted({c[1] for d in manifest["devices"] for c in d["chunks"]} | {fields[8], 100, 192, 5})
    assert len(cuts) > 8
    for cut in cuts:
        path = tmp_path / f"t{cut}.img"
        path.write_bytes(raw[:cut])
        refused(target, path, "truncated", "nothing was restored")


def test_wrong_magic_and_unknown_version(good, target, tmp_path):
    raw = good.read_bytes()
    path = tmp_path / "magic.img"
    path.write_bytes(b"\x89IPUIMX\n" + raw[8:])
    refused(target, path, "is not an ipuos image")
    _, manifest, stored = image_parts(raw)
    path = tmp_path / "v2.img"
    path.write_bytes(forge(manifest, stored, version=2))
    refused(target, path, "has format version 2, which this ipuos cannot read")


def test_decompression_bombs(good, target, tmp_path):
    _, manifest, stored = image_parts(good.read_bytes())
    # a chunk whose zstd frame inflates to 64 MiB of zeros in a slot of a few KiB
    d = next(i for i, dev in enumerate(manifest["devices"]) if dev["chunks"])
    bomb = zstandard.ZstdCompressor(level=19).compress(bytes(64 * 2**20))
    assert len(bomb) < 4 * KiB
    stored[d][0] = bomb
    path = tmp_path / "bomb.img"
    path.write_bytes(forge(manifest, stored))
    refused(target, path, "decompression bomb", "nothing was restored")
    # devices that claim more bytes than the machine has SRAM
    _, manifest, stored = image_parts(good.read_bytes())
    manifest["meta"]["ipus"] = 4096
    manifest["devices"][0]["block_count"] *= 2**16
    manifest["devices"][0]["length"] *= 2**16
    path = tmp_path / "huge.img"
    path.write_bytes(forge(manifest, stored))
    refused(target, path, "nothing was restored")


def test_valid_checksums_over_something_that_is_no_filesystem(target, tmp_path):
    path = tmp_path / "garbage.img"
    write_tiny_image(path, {"tile/5/disk": random.Random(3).randbytes(16 * KiB)})
    refused(target, path, "device 'tile/5/disk' holds no filesystem that mounts")


def test_the_chip_tile_disks_must_agree(target, tmp_path):
    path = tmp_path / "halfchip.img"
    chip = littlefs_device({"/x": b"chip"}, blocks=480)
    write_tiny_image(path, {"tile/0/disk": None, "chip": bytes(chip)})
    refused(target, path, "tile 0's disk is blank but the chip disk is not")


def test_foreign_geometry_is_refused(good, tmp_path):
    for overrides, what in (({"disk_size": 8 * KiB}, "disk_size 16384 (this machine: 8192)"),
                            ({"chipdisk_block_size": 1024}, "chipdisk_block_size 512")):
        with ipuos.Machine("tiny", **overrides) as machine:
            machine.fs.write_file(5, "/text", b"tile 5 seed 2\n" * 40)
            refused(machine, good, "was taken on another kind of machine", what,
                    "`ipuos boot --restore")
    with ipuos.Machine("tiny", ipus=2) as machine:
        machine.fs.write_file(5, "/text", b"tile 5 seed 2\n" * 40)
        refused(machine, good, "ipus 1 (this machine: 2)")


def test_a_subset_the_image_does_not_hold(good, target, tmp_path):
    part = tmp_path / "part.img"
    with ipuos.Machine("tiny") as source:
        populate(source, 4)
        _backup.backup(source, part, "5-6")
    refused(target, part, "has no copy of 1 tile disk (7)", "it holds 2 tile disks (5-6)", tiles="5-7")


def test_busy_tiles_are_refused_and_nothing_changes(good):
    with ipuos.Machine("tiny") as machine:
        populate(machine, 2)
        handle = machine.fs.open_handle(9, "/text", "rb")
        message = refused(machine, good, "cannot restore while tiles are in use", "tile 9: 1 file is open")
        assert "nothing was restored" in message
        machine.fs.close_handle(9, handle)
        running = machine.launch("""
import os
while not os.path.exists('/stop'):
    sync()
""", tiles="15")
        refused(machine, good, "tile 15: it runs job")
        machine.fs.write_file(15, "/stop", b"")
        running.wait(30)
        # a program computing with no exchange point in sight is refused at once: the
        # restore waited for it to reach one (as long as it computed) only to refuse it then
        running = machine.launch("x = 0\nfor i in range(10_000_000):\n    x ^= i\nsync()\n", tiles="14")
        notes = []
        refused(machine, good, "tile 14: it runs job", progress=lambda what, *_: notes.append(what))
        assert "waiting" not in notes
        running.interrupt()
        running.wait(30)
        running = machine.launch("while True:\n    sync()\n", tiles="12-15")
        message = refused(machine, good, f"tiles 12-15: it runs job {running.job.id} (wait")
        assert message.count("it runs job") == 1  # one reason for the four tiles
        running.interrupt()
        running.wait(30)
        _backup.restore(machine, good)  # now it can
        assert machine.fs.read_file(15, "/text") == b"tile 15 seed 1\n" * 40
