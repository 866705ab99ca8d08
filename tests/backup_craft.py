"""Helpers for the backup tests: littlefs images built offline, hostile ones included.

littlefs refuses to create entries named ``..`` or holding ``/``, but an image is just a
file and can hold anything. :func:`rename_entry` rewrites a name inside littlefs'
metadata blocks and fixes each commit's CRC, so littlefs (and ipuos) read the result as
a valid filesystem. Metadata blocks (littlefs v2): a 4-byte revision count, then commits
of tags, each tag big-endian and XORed with the previous one, every commit closed by a
CRC tag whose 4-byte CRC covers the commit from its start (the first commit includes the
revision count); littlefs' CRC is CRC-32 without the final inversion.
"""

from __future__ import annotations

import struct
import zlib

from ipuos._image import DeviceSnapshot, write_image
from ipuos.blockdev import Filesystem, MemoryDevice

KiB = 1024
#: the tiny preset's geometry, as an image made on a tiny machine records it
TINY_META = {"preset": "tiny", "ipus": 1, "tiles_per_chip": 16, "sram_per_tile": 64 * KiB,
             "disk_size": 16 * KiB, "disk_block_size": 512, "chipdisk_share": 16 * KiB,
             "chipdisk_block_size": 512, "chip_tile": 0, "tiles": "0-15"}


def _crc(data, seed: int = 0xFFFFFFFF) -> int:
    return zlib.crc32(data, seed ^ 0xFFFFFFFF) ^ 0xFFFFFFFF


def _commits(block: bytes) -> list[tuple[int, int]]:
    """(start, where its CRC is stored) of each valid commit of a metadata block."""
    found = []
    off, start, ptag = 4, 0, 0xFFFFFFFF
    crc = _crc(block[:4])
    while off + 4 <= len(block):
        tag = (struct.unpack_from(">I", block, off)[0] ^ ptag) & 0xFFFFFFFF
        if tag & 0x80000000:
            break
        size = tag & 0x3FF
        end = off + 4 + (0 if size == 0x3FF else size)
        crc = _crc(block[off : off + 4], crc)
        kind = (tag >> 20) & 0x7FF
        if kind & 0x700 == 0x500 and kind != 0x5FF:  # a commit's CRC (not a forward CRC)
            if struct.unpack_from("<I", block, off + 4)[0] != crc:
                break
            found.append((start, off + 4))
            ptag = tag ^ ((kind & 1) << 31)
            off = start = end
            crc = 0xFFFFFFFF
            continue
        crc = _crc(block[off + 4 : end], crc)
        ptag = tag
        off = end
    return found


def rename_entry(device: bytearray, block_size: int, old: bytes, new: bytes) -> None:
    """Replace the name ``old`` by ``new`` (same length) wherever littlefs stores it."""
    assert len(old) == len(new)
    patched = 0
    for b in range(len(device) // block_size):
        block = bytearray(device[b * block_size : (b + 1) * block_size])
        spans = _commits(bytes(block))
        at = block.find(old)
        hit = False
        while at >= 0:
            if any(start <= at < crc_at for start, crc_at in spans):
                block[at : at + len(old)] = new
                hit = True
            at = block.find(old, at + 1)
        if hit:
            for start, crc_at in spans:
                if start == 0:
                    struct.pack_into("<I", block, crc_at, _crc(block[4:crc_at], _crc(block[:4])))
                else:
                    struct.pack_into("<I", block, crc_at, _crc(block[start:crc_at]))
            device[b * block_size : (b + 1) * block_size] = block
            patched += 1
    assert patched, f"{old!r} is in no metadata block"


def point_directories_at_root(device: bytearray, block_size: int) -> None:
    """Make every directory entry's metadata pair the root's (blocks 0, 1): a cycle,
    which littlefs itself never writes, with every checksum made right again."""
    patched = 0
    for b in range(len(device) // block_size):
        block = bytearray(device[b * block_size : (b + 1) * block_size])
        spans = _commits(bytes(block))
        if not spans:
            continue
        off, ptag, hit = 4, 0xFFFFFFFF, False
        while off + 4 <= spans[-1][1]:
            tag = (struct.unpack_from(">I", block, off)[0] ^ ptag) & 0xFFFFFFFF
            size = tag & 0x3FF
            kind = (tag >> 20) & 0x7FF
            if kind == 0x200 and size == 8:  # a directory's struct: its metadata pair
                struct.pack_into("<II", block, off + 4, 0, 1)
                hit = True
            ptag = tag ^ ((kind & 1) << 31) if kind & 0x700 == 0x500 and kind != 0x5FF else tag
            off += 4 + (0 if size == 0x3FF else size)
        if hit:
            for start, crc_at in spans:
                seed = _crc(block[:4]) if start == 0 else 0xFFFFFFFF
                struct.pack_into("<I", block, crc_at, _crc(block[max(start, 4):crc_at], seed))
            device[b * block_size : (b + 1) * block_size] = block
            patched += 1
    assert patched, "no directory entry to point anywhere"


def littlefs_device(files: dict[str, bytes], dirs=(), block_size: int = 512, blocks: int = 32,
                    mtimes: dict[str, int] | None = None) -> bytearray:
    """The bytes of a littlefs device holding ``dirs`` and ``files`` (path -> bytes)."""
    device = MemoryDevice.new(block_size, blocks)
    fs = Filesystem(device)
    fs.format()
    fs.mount()
    for path in dirs:
        fs.mkdir(path)
    for path, data in files.items():
        with fs.open(path, "wb") as f:
            f.write(data)
    for path, ns in (mtimes or {}).items():
        fs.set_mtime(path, ns)
    fs.unmount()
    return bytearray(device.buffer)


def write_tiny_image(path, devices: dict[str, bytes | None], meta: dict | None = None) -> dict:
    """An image of a tiny machine: ``devices`` maps "tile/N/disk" or "chip" to bytes
    (None: blank)."""
    snapshots = []
    for name, data in devices.items():
        if name == "chip":
            snapshots.append(DeviceSnapshot("chip", None, "/chip", 512, 15 * 32, data))
        else:
            tile = int(name.split("/")[1])
            snapshots.append(DeviceSnapshot(name, tile, "/", 512, 32, data))
    return write_image(path, dict(meta or TINY_META), snapshots, digest="blake3")


def image_parts(raw: bytes):
    """(header fields, manifest dict, stored chunk bytes per device) of an image."""
    import json

    import zstandard

    from ipuos import _image

    fields = _image._HEAD.unpack_from(raw)
    moff, mlen = fields[8], fields[9]
    manifest = json.loads(zstandard.ZstdDecompressor().decompress(raw[moff : moff + mlen]))
    stored = [[raw[c[1] : c[1] + c[2]] for c in d["chunks"]] for d in manifest["devices"]]
    return fields, manifest, stored


def forge(manifest: dict, stored: list[list[bytes]], *, version: int = 1) -> bytes:
    """An image with every checksum right, from a manifest and each device's stored
    chunks (file offsets, stored lengths and chunk checksums are recomputed)."""
    import json

    import zstandard

    from ipuos import _image

    algo = manifest["digest"]
    H = _image._HASHES[algo]
    manifest = json.loads(json.dumps(manifest))
    pos = _image.HEADER_SIZE
    body, checks = [], []
    for device, chunks in zip(manifest["devices"], stored):
        for entry, blob in zip(device["chunks"], chunks):
            entry[1], entry[2], entry[4] = pos, len(blob), H(blob).hex()
            pos += len(blob)
            body.append(blob)
            checks.append(H(blob))
    text = json.dumps(manifest).encode()
    mstored = zstandard.ZstdCompressor().compress(text)
    mcheck = H(mstored)
    root = H(_image._ROOT_DOMAIN + mcheck + b"".join(checks))
    head = _image._HEAD.pack(_image.MAGIC, version, _image.HEADER_SIZE, 0, algo.encode(),
                             pos + len(mstored), _image.HEADER_SIZE, pos - _image.HEADER_SIZE, pos,
                             len(mstored), len(text), mcheck, root, bytes(16))
    return head + H(head) + b"".join(body) + mstored
