"""Damaged, truncated and hostile images are refused, with a clear message, before any
data comes out (ipuos._image).

Hostile images are forged with correct checksums (``_forge``), so the checks that refuse
them are the format's limits, not the checksums.
"""

from __future__ import annotations

import io
import json
import random
import struct
import tracemalloc

import numpy as np
import pytest
import zstandard

from ipuos import _image as I
from ipuos._image import DeviceSnapshot, ImageError, open_image, write_image

KiB = 1024
MiB = 1024 * KiB
META = {"preset": "tiny", "ipus": 1, "tiles_per_chip": 16, "sram_per_tile": 1 * MiB}


def _devices():
    rng = np.random.default_rng(11)
    text = np.frombuffer((b"def f(x):\n    return x + 1\n" * 20000)[: 192 * KiB], np.uint8)
    sparse = np.zeros(512 * KiB, np.uint8)
    sparse[70 * KiB : 71 * KiB] = 3
    sparse[300 * KiB : 302 * KiB] = rng.integers(0, 256, 2 * KiB, dtype=np.uint8)
    return [
        DeviceSnapshot("tile/0/disk", 0, "/", 4096, 16, rng.integers(0, 256, 64 * KiB, dtype=np.uint8)),
        DeviceSnapshot("tile/1/disk", 1, "/", 4096, 48, text),
        DeviceSnapshot("tile/2/disk", 2, "/", 4096, 8, bytes(32 * KiB)),
        DeviceSnapshot("chip", None, "/chip", 4096, 128, sparse),
    ]


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "good.img"
    write_image(path, META, _devices(), chunk_size=16 * KiB)
    return path.read_bytes()


def _layout(raw: bytes):
    f = I._HEAD.unpack_from(raw)
    moff, mlen = f[8], f[9]
    manifest = json.loads(zstandard.ZstdDecompressor().decompress(raw[moff : moff + mlen]))
    return f, manifest


def _chunks(raw: bytes):
    """[(device name, chunk index, file offset, stored length)] in file order."""
    _, m = _layout(raw)
    return [(d["name"], ci, c[1], c[2]) for d in m["devices"] for ci, c in enumerate(d["chunks"])]


def _stored(raw: bytes):
    """Every device's stored chunk bytes, as lists."""
    _, m = _layout(raw)
    return [[raw[c[1] : c[1] + c[2]] for c in d["chunks"]] for d in m["devices"]]


def _forge(manifest, stored, *, version=1, flags=0, manifest_text=None, manifest_size=None,
           root=None, digest="sha256") -> bytes:
    """An image with valid checksums from a manifest and per-device stored chunks; the
    manifest's file offsets, stored lengths and checksums are recomputed."""
    H = I._HASHES[digest]
    manifest = json.loads(json.dumps(manifest))
    pos = I.HEADER_SIZE
    data = []
    checks = []
    for d, chunks in zip(manifest["devices"], stored):
        assert len(d["chunks"]) == len(chunks)
        for c, blob in zip(d["chunks"], chunks):
            c[1], c[2], c[4] = pos, len(blob), H(blob).hex()
            pos += len(blob)
            data.append(blob)
            checks.append(H(blob))
    text = manifest_text if manifest_text is not None else json.dumps(manifest).encode()
    mstored = zstandard.ZstdCompressor().compress(text)
    mcheck = H(mstored)
    if root is None:
        root = H(I._ROOT_DOMAIN + mcheck + b"".join(checks))
    dlen = pos - I.HEADER_SIZE
    head = I._HEAD.pack(
        I.MAGIC, version, I.HEADER_SIZE, flags, digest.encode(), pos + len(mstored), I.HEADER_SIZE,
        dlen, pos, len(mstored), len(text) if manifest_size is None else manifest_size, mcheck, root,
        bytes(16),
    )
    return head + H(head) + b"".join(data) + mstored


def _refused(tmp_path, raw: bytes, *, read_all=False, name="bad.img", **kw) -> str:
    path = tmp_path / name
    path.write_bytes(raw)
    with pytest.raises(ImageError) as e:
        if read_all:
            with open_image(path, verify=False, **kw) as img:
                img.read_all()
        else:
            open_image(path, **kw)
    message = str(e.value)
    assert message.startswith(f"image {path}"), message
    return message


def test_forge_roundtrips(tmp_path, good):
    """The forger itself makes good images from good parts."""
    _, m = _layout(good)
    path = tmp_path / "forged.img"
    path.write_bytes(_forge(m, _stored(good)))
    with open_image(path) as img:
        assert bytes(img.read_device("chip")) == bytes(_devices()[3].data)


# --------------------------------------------------------------------------- damage


def test_every_header_bit_flip_is_refused(tmp_path, good):
    expected = ("header fails its checksum", "not an ipuos image", "format version",
                "unknown digest algorithm")
    for byte in range(I.HEADER_SIZE):
        for bit in range(8):
            raw = bytearray(good)
            raw[byte] ^= 1 << bit
            message = _refused(tmp_path, bytes(raw))
            assert any(x in message for x in expected), (byte, bit, message)


def test_manifest_bit_flips_are_refused(tmp_path, good):
    f, _ = _layout(good)
    moff, mlen = f[8], f[9]
    rng = random.Random(0)
    # every bit of the frame's head and tail, and a sample of the rest
    flips = [(b, i) for b in [*range(moff, moff + 32), *range(moff + mlen - 32, moff + mlen)] for i in range(8)]
    flips += [(rng.randrange(moff, moff + mlen), rng.randrange(8)) for _ in range(1500)]
    for byte, bit in flips:
        raw = bytearray(good)
        raw[byte] ^= 1 << bit
        assert "manifest fails its checksum" in _refused(tmp_path, bytes(raw))


@pytest.mark.parametrize("seed", range(200))
def test_random_bit_flips_in_chunks_are_refused_naming_the_chunk(tmp_path, good, seed):
    rng = random.Random(seed)
    chunks = _chunks(good)
    name, ci, off, n = rng.choice(chunks)
    at = off + rng.randrange(n)
    raw = bytearray(good)
    for _ in range(rng.choice([1, 1, 1, 2, 8])):  # mostly single bits, some bursts
        raw[at] ^= 1 << rng.randrange(8)
    if raw == good:
        raw[at] ^= 1
    where = f"chunk {ci} of device {name!r}"
    message = _refused(tmp_path, bytes(raw))
    assert where in message and "fails its checksum; the image is damaged" in message, message
    message = _refused(tmp_path, bytes(raw), read_all=True)
    assert where in message, message


def test_damage_in_one_device_leaves_the_others_readable_but_not_the_whole(tmp_path, good):
    """What is intact can be read out of a damaged image (``ipuos image cat``, ``ls``,
    ``extract``); the damaged device, a verify and a restore's read of the whole refuse."""
    name, ci, off, n = _chunks(good)[-1]  # the last chunk of the last device
    assert name == "chip"
    raw = bytearray(good)
    raw[off + n // 2] ^= 0x10
    path = tmp_path / "bad.img"
    path.write_bytes(bytes(raw))
    with open_image(path, verify=False) as img:
        assert bytes(img.read_device("tile/0/disk")) == bytes(_devices()[0].data)
        with pytest.raises(ImageError, match="fails its checksum"):
            img.read_device("chip")
        with pytest.raises(ImageError, match="fails its checksum"):
            img.verify()
        with pytest.raises(ImageError, match="fails its checksum"):
            img.read_all()


def test_truncation_anywhere_is_refused(tmp_path, good):
    f, _ = _layout(good)
    cuts = {0 + 1, 5, 8, 9, 10, 100, I.HEADER_SIZE - 1, I.HEADER_SIZE, len(good) - 1}
    for _, _, off, n in _chunks(good):
        cuts |= {off, off + 1, off + n // 2, off + n - 1, off + n}
    moff, mlen = f[8], f[9]
    cuts |= {moff, moff + mlen // 2}
    for cut in sorted(cuts):
        assert 0 < cut < len(good)
        message = _refused(tmp_path, good[:cut])
        assert "truncated" in message, (cut, message)


def test_bytes_appended_are_refused(tmp_path, good):
    assert "has 1 byte beyond its end" in _refused(tmp_path, good + b"\0")
    assert "has 2 bytes beyond its end" in _refused(tmp_path, good + b"\0\0")
    assert "it has only 1 byte, not even its magic" in _refused(tmp_path, good[:1])


@pytest.mark.parametrize(
    "raw",
    [b"\x89PNG\r\n\x1a\n" + bytes(300), b"PK\x03\x04" + bytes(300), b"hello", b"\x00" * 4096,
     b"IPUIMG\n" + bytes(500)],
)
def test_wrong_magic_is_refused(tmp_path, raw):
    assert "not an ipuos image" in _refused(tmp_path, raw)


def test_partial_magic_is_truncation(tmp_path, good):
    assert "truncated" in _refused(tmp_path, good[:4])


def test_unknown_version_is_refused_naming_both_versions(tmp_path, good):
    _, m = _layout(good)
    message = _refused(tmp_path, _forge(m, _stored(good), version=2))
    assert "format version 2" in message and "reads format version 1" in message


def test_unknown_feature_flags_are_refused(tmp_path, good):
    _, m = _layout(good)
    assert "features" in _refused(tmp_path, _forge(m, _stored(good), flags=4))


def test_device_digest_mismatch_is_refused(tmp_path, good):
    _, m = _layout(good)
    m["devices"][1]["digest"] = "00" * 32
    message = _refused(tmp_path, _forge(m, _stored(good)))
    assert "device 'tile/1/disk': its bytes do not match the manifest's digest" in message


def test_image_digest_mismatch_is_refused(tmp_path, good):
    _, m = _layout(good)
    assert "image digest does not match" in _refused(tmp_path, _forge(m, _stored(good), root=bytes(32)))


def test_chunk_swapped_between_devices_is_refused(tmp_path, good):
    """Valid chunks in the wrong place: every checksum matches, the digests do not."""
    _, m = _layout(good)
    stored = _stored(good)
    stored[0][0], stored[0][1] = stored[0][1], stored[0][0]
    assert "do not match the manifest's digest" in _refused(tmp_path, _forge(m, stored))


def test_gap_in_the_chunk_table_is_refused(tmp_path, good):
    raw = bytearray(_forge(*_layout_and_stored(good)))
    # move one chunk's file offset: forge a manifest by hand with a gap
    _, m = _layout(bytes(raw))
    m["devices"][0]["chunks"][1][1] += 1
    text = json.dumps(m).encode()
    f = list(I._HEAD.unpack_from(raw))
    mstored = zstandard.ZstdCompressor().compress(text)
    body = bytes(raw[I.HEADER_SIZE : f[8]])
    f[5], f[9], f[10] = f[8] + len(mstored), len(mstored), len(text)
    f[11] = I._sha256(mstored)
    checks = [bytes.fromhex(c[4]) for d in m["devices"] for c in d["chunks"]]
    f[12] = I._sha256(I._ROOT_DOMAIN + f[11] + b"".join(checks))
    head = I._HEAD.pack(*f)
    message = _refused(tmp_path, head + I._sha256(head) + body + mstored)
    assert "back to back" in message


def _layout_and_stored(raw):
    return _layout(raw)[1], _stored(raw)


# --------------------------------------------------------------------------- bombs


def _bomb_frame(size: int, *, content_size: bool) -> bytes:
    """A small zstd frame that inflates to ``size`` bytes of 0x61."""
    cctx = zstandard.ZstdCompressor(level=1, write_content_size=content_size)
    out = io.BytesIO()
    with cctx.stream_writer(out, closefd=False, size=size if content_size else -1) as w:
        block = b"a" * MiB
        for _ in range(size // MiB):
            w.write(block)
    return out.getvalue()


def _with_chunk(good, blob):
    """The good image with the first chunk of the text device replaced by ``blob``."""
    _, m = _layout(good)
    stored = _stored(good)
    stored[1][0] = blob
    return _forge(m, stored)


def _bounded(fn, limit=8 * MiB):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] < limit
    finally:
        tracemalloc.stop()


def test_bomb_frame_without_content_size_is_refused_before_inflating(tmp_path, good):
    bomb = _bomb_frame(256 * MiB, content_size=False)
    assert len(bomb) < 16 * KiB  # under the slot size, or it would be refused for that
    messages = []
    assert _bounded(lambda: messages.append(_refused(tmp_path, _with_chunk(good, bomb))))
    assert "does not declare its uncompressed size" in messages[0]
    assert "chunk 0 of device 'tile/1/disk'" in messages[0]


def test_bomb_frame_declaring_more_than_the_manifest_is_refused(tmp_path, good):
    bomb = _bomb_frame(256 * MiB, content_size=True)
    messages = []
    assert _bounded(lambda: messages.append(_refused(tmp_path, _with_chunk(good, bomb), read_all=True)))
    assert "declares 268435456 uncompressed bytes" in messages[0] and "16384" in messages[0]


def test_bomb_frame_lying_about_its_size_is_bounded(tmp_path, good):
    """A frame that declares 16 KiB (the slot) but holds 256 MiB."""
    bomb = bytearray(_bomb_frame(256 * MiB, content_size=True))
    params = zstandard.get_frame_parameters(bytes(bomb))
    assert params.content_size == 256 * MiB
    fhd = bomb[4]
    assert fhd >> 6 == 2 and not fhd & 0x20  # a 4-byte content size after a window byte
    bomb[6:10] = struct.pack("<I", 16 * KiB)
    assert zstandard.frame_content_size(bytes(bomb)) == 16 * KiB
    messages = []
    assert _bounded(lambda: messages.append(_refused(tmp_path, _with_chunk(good, bytes(bomb)), read_all=True)))
    assert "cannot be decompressed" in messages[0]


def test_chunk_claiming_more_than_its_slot_is_refused(tmp_path, good):
    _, m = _layout(good)
    m["devices"][1]["chunks"][0][3] = 1024 * MiB
    message = _refused(tmp_path, _forge(m, _stored(good)))
    assert "claims 1073741824 uncompressed bytes" in message


def test_manifest_claiming_huge_devices_is_refused_by_the_cap(tmp_path, good):
    _, m = _layout(good)
    m["meta"]["sram_per_tile"] = 1 << 40
    m["devices"][2]["block_count"] = (1 << 40) // 4096
    m["devices"][2]["length"] = 1 << 40
    message = _refused(tmp_path, _forge(m, _stored(good)))
    assert "max_decompressed" in message and "tile/2/disk" in message


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m["devices"][2].update(block_count=257, length=257 * 4096), "more than a tile's SRAM"),
        (lambda m: m["devices"][2].update(tile=16), "belongs to tile 16"),
        (lambda m: m["devices"][3].update(block_count=4097, length=4097 * 4096), "more than the machine's SRAM"),
        (lambda m: m["meta"].update(ipus=0), "ipus"),
        (lambda m: m["meta"].pop("preset"), "preset"),
    ],
)
def test_manifest_beyond_its_geometry_is_refused(tmp_path, good, change, message):
    _, m = _layout(good)
    change(m)
    got = _refused(tmp_path, _forge(m, _stored(good)))
    assert "geometry" in got and message in got


def test_manifest_declaring_a_huge_size_is_refused_before_inflating(tmp_path, good):
    _, m = _layout(good)
    got = _refused(tmp_path, _forge(m, _stored(good), manifest_size=1 << 40))
    assert "manifest claims 1099511627776 bytes" in got


def test_manifest_frame_lying_about_its_size_is_refused(tmp_path, good):
    _, m = _layout(good)
    got = _refused(tmp_path, _forge(m, _stored(good), manifest_size=100))
    assert "manifest declares" in got


@pytest.mark.parametrize(
    "text",
    [b"not json", b"[]", b'{"format": "ipuos-image"}', json.dumps({"a": 1}).encode()],
)
def test_nonsense_manifests_are_refused(tmp_path, good, text):
    _, m = _layout(good)
    got = _refused(tmp_path, _forge(m, _stored(good), manifest_text=text))
    assert "manifest" in got
