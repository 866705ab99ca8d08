"""Backup images: round trips, the API, and what the writer refuses (ipuos._image)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ipuos._image import (
    DeviceSnapshot,
    ImageError,
    device_digest,
    open_image,
    write_image,
)

KiB = 1024
META = {"preset": "tiny", "ipus": 1, "tiles_per_chip": 16, "sram_per_tile": 64 * KiB, "note": "x"}


def _devices(seed: int = 0):
    rng = np.random.default_rng(seed)
    mixed = np.zeros(40 * KiB, np.uint8)
    mixed[5000:9000] = rng.integers(0, 256, 4000, dtype=np.uint8)  # random island
    mixed[20 * KiB : 28 * KiB] = np.frombuffer(b"hello littlefs " * 546 + b"12", np.uint8)  # text
    mixed[-1] = 7  # the last byte of the last (short) slot
    return [
        DeviceSnapshot("tile/0/disk", 0, "/", 512, 32, rng.integers(0, 256, 16 * KiB, dtype=np.uint8)),
        DeviceSnapshot("tile/1/disk", 1, "/", 512, 32, bytes(16 * KiB)),  # all zeros
        DeviceSnapshot("tile/2/disk", 2, "/", 512, 80, mixed),
        DeviceSnapshot("tile/3/disk", 3, None, 128, 3, bytearray(b"\x01" * 384)),  # odd size
        DeviceSnapshot("tile/3/scratch", 3, "/tmp", 512, 0, b""),  # empty
        DeviceSnapshot("chip", None, "/chip", 512, 300, (b"chip text data, " * 9600)),
    ]


def _bytes(d) -> bytes:
    return bytes(memoryview(d.data).cast("B")) if not isinstance(d.data, bytes) else d.data


@pytest.mark.parametrize("chunk_size", [4 * KiB, 16 * KiB, 256 * KiB])
@pytest.mark.parametrize("digest", ["sha256", "blake2b"])
def test_round_trip(tmp_path, chunk_size, digest):
    devs = _devices()
    path = tmp_path / "m.img"
    summary = write_image(path, META, devs, chunk_size=chunk_size, digest=digest)
    assert summary["device_count"] == len(devs)
    assert summary["file_size"] == os.path.getsize(path)

    with open_image(path) as img:
        assert img.verified
        assert img.meta == META
        assert [e.name for e in img.devices] == [d.name for d in devs]
        for d, e in zip(devs, img.devices):
            assert (e.tile, e.mount, e.block_size, e.block_count, e.length) == (
                d.tile, d.mount, d.block_size, d.block_count, d.length
            )
            assert e.digest == device_digest(d.data, chunk_size=chunk_size, digest=digest)
            assert bytes(img.read_device(d.name)) == _bytes(d)
        assert img.image_digest == summary["image_digest"]

    with open_image(path, verify=False) as img:
        assert not img.verified
        everything = img.read_all()
        assert img.verified
    for d in devs:
        assert bytes(everything[d.name]) == _bytes(d), d.name


def test_zero_slots_are_not_stored(tmp_path):
    data = np.zeros(1024 * KiB, np.uint8)
    data[300 * KiB] = 1  # one byte in the second 256 KiB slot
    meta = dict(META, sram_per_tile=2048 * KiB)
    write_image(tmp_path / "z.img", meta, [DeviceSnapshot("tile/0/disk", 0, "/", 4096, 256, data)])
    with open_image(tmp_path / "z.img") as img:
        (entry,) = img.devices
        assert [c.offset for c in entry.chunks] == [256 * KiB]
        assert entry.chunks[0].compressed
        assert img.info()["stored_bytes"] < 200
        assert bytes(img.read_device("tile/0/disk")) == data.tobytes()


def test_incompressible_chunks_are_stored_raw(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, 64 * KiB, dtype=np.uint8)
    write_image(tmp_path / "r.img", META, [DeviceSnapshot("tile/0/disk", 0, "/", 512, 128, data)])
    with open_image(tmp_path / "r.img") as img:
        (chunk,) = img.devices[0].chunks
        assert not chunk.compressed and chunk.stored_length == chunk.length
        assert bytes(img.read_device("tile/0/disk")) == data.tobytes()


def test_level_none_stores_everything_raw(tmp_path):
    devs = _devices()
    write_image(tmp_path / "raw.img", META, devs, level=None)
    with open_image(tmp_path / "raw.img") as img:
        assert all(not c.compressed for e in img.devices for c in e.chunks)
        for d in devs:
            assert bytes(img.read_device(d.name)) == _bytes(d)


def test_streaming_inputs(tmp_path):
    """A generator of devices; data as a callable, as an iterable of odd-sized parts."""
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, 48 * KiB, dtype=np.uint8)
    b = bytes(rng.integers(0, 4, 20 * KiB, dtype=np.uint8))
    calls = []

    def lazy():
        calls.append(1)
        return a

    def gen():
        yield DeviceSnapshot("tile/0/disk", 0, "/", 512, 96, lazy)
        yield DeviceSnapshot("tile/1/disk", 1, "/", 512, 40, (b[i : i + 3001] for i in range(0, len(b), 3001)))

    seen = []
    summary = write_image(tmp_path / "s.img", META, gen(), chunk_size=16 * KiB,
                          progress=lambda done, total: seen.append((done, total)))
    assert calls == [1]
    assert seen and seen[-1] == (len(a) + len(b), None)
    assert summary["device_bytes"] == len(a) + len(b)
    with open_image(tmp_path / "s.img") as img:
        assert bytes(img.read_device("tile/0/disk")) == a.tobytes()
        assert bytes(img.read_device("tile/1/disk")) == b


def test_progress_and_iter_devices(tmp_path):
    devs = _devices()
    total = sum(d.length for d in devs)
    seen = []
    write_image(tmp_path / "p.img", META, devs, progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (total, total)
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))

    verified = []
    with open_image(tmp_path / "p.img", progress=lambda d, t: verified.append((d, t))) as img:
        assert verified[-1] == (total, total)
        got = {e.name: bytes(data) for e, data in img.iter_devices()}
    assert got == {d.name: _bytes(d) for d in devs}


def test_info_is_json(tmp_path):
    devs = _devices()
    write_image(tmp_path / "i.img", META, devs)
    with open_image(tmp_path / "i.img") as img:
        info = img.info()
    json.dumps(info)
    assert info["format_version"] == 1 and info["verified"]
    assert info["meta"] == META
    assert info["device_count"] == len(devs)
    assert info["device_bytes"] == sum(d.length for d in devs)
    assert {d["name"] for d in info["devices"]} == {d.name for d in devs}


def test_same_input_same_image(tmp_path):
    devs = _devices()
    a = write_image(tmp_path / "a.img", META, devs, threads=1)
    b = write_image(tmp_path / "b.img", META, devs, threads=4)
    assert (tmp_path / "a.img").read_bytes() == (tmp_path / "b.img").read_bytes()
    assert a["image_digest"] == b["image_digest"]


@pytest.mark.parametrize("threads", [1, 2])
def test_source_changing_during_the_write_still_gives_a_consistent_image(tmp_path, threads):
    """What is hashed is what is stored, even if the source changes meanwhile."""
    rng = np.random.default_rng(5)
    data = bytearray(rng.integers(1, 256, 24 * 1024 * KiB, dtype=np.uint8).tobytes())

    def scribble(done, total):
        for _ in range(64):
            at = int(rng.integers(0, len(data) - 4 * KiB))
            data[at : at + 4 * KiB] = bytes(4 * KiB) if rng.integers(2) else rng.bytes(4 * KiB)

    meta = dict(META, sram_per_tile=32 * 1024 * KiB)
    write_image(tmp_path / "m.img", meta, [DeviceSnapshot("tile/0/disk", 0, "/", 4096, 6144, data)],
                threads=threads, progress=scribble)
    with open_image(tmp_path / "m.img") as img:  # verifies every chunk and the digests
        assert len(img.read_device("tile/0/disk")) == len(data)


@pytest.mark.parametrize(
    "meta, devices, message",
    [
        ({"ipus": 1, "tiles_per_chip": 16, "sram_per_tile": 65536}, [], "preset"),
        (dict(META, ipus=0), [], "ipus"),
        (dict(META, sram_per_tile=True), [], "sram_per_tile"),
        (dict(META, x=object()), [], "JSON"),
        (META, [DeviceSnapshot("a", 0, "/", 512, 2, b"x")], "data has 1 byte, but"),
        (META, [DeviceSnapshot("a", 16, "/", 512, 1, bytes(512))], "tile 16"),
        (META, [DeviceSnapshot("a", 0, "/", 512, 129, bytes(512 * 129))], "more than a tile's SRAM"),
        (META, [DeviceSnapshot("a", 0, "/", 512, 1, bytes(512))] * 2, "two devices"),
        (META, [DeviceSnapshot("", 0, "/", 512, 1, bytes(512))], "non-empty"),
        (META, [DeviceSnapshot("a\nb", 0, "/", 512, 1, bytes(512))], "control"),
        (META, [DeviceSnapshot("a", 0, "/", 0, 1, b"")], "block_size"),
        (META, [DeviceSnapshot("a", 0, "/", 512, 1, 42)], "buffer"),
        (META, [DeviceSnapshot("chip", None, "/", 512, 2049, bytes(512 * 2049))], "machine's SRAM"),
    ],
)
def test_writer_refuses_bad_input_and_leaves_nothing(tmp_path, meta, devices, message):
    (tmp_path / "out.img").write_bytes(b"old")
    with pytest.raises(ValueError, match=message):
        write_image(tmp_path / "out.img", meta, devices)
    assert (tmp_path / "out.img").read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.img"]


def test_writer_refuses_bad_options(tmp_path):
    with pytest.raises(ValueError, match="chunk_size"):
        write_image(tmp_path / "x.img", META, [], chunk_size=3000)
    with pytest.raises(ValueError, match="digest"):
        write_image(tmp_path / "x.img", META, [], digest="md5")
    with pytest.raises(ValueError, match="level"):
        write_image(tmp_path / "x.img", META, [], level=99)
    assert os.listdir(tmp_path) == []


def test_empty_image(tmp_path):
    write_image(tmp_path / "e.img", META, [])
    with open_image(tmp_path / "e.img") as img:
        assert img.devices == [] and img.read_all() == {}


def test_missing_and_unreadable_files_are_image_errors(tmp_path):
    with pytest.raises(ImageError, match="cannot open"):
        open_image(tmp_path / "nope.img")
    with pytest.raises(ImageError, match="not a regular file"):
        open_image(tmp_path)
    (tmp_path / "empty.img").write_bytes(b"")
    with pytest.raises(ImageError, match="empty"):
        open_image(tmp_path / "empty.img")


def test_cap_applies_to_reads(tmp_path):
    devs = _devices()
    write_image(tmp_path / "c.img", META, devs)
    total = sum(d.length for d in devs)
    with pytest.raises(ImageError, match="max_decompressed"):
        open_image(tmp_path / "c.img", max_decompressed=total - 1)
    with open_image(tmp_path / "c.img", max_decompressed=total) as img:
        assert len(img.read_all()) == len(devs)


def test_image_is_not_world_readable(tmp_path):
    write_image(tmp_path / "m.img", META, _devices())
    assert os.stat(tmp_path / "m.img").st_mode & 0o077 == 0
