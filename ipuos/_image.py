"""Backup images: a versioned, self-describing, fully verified snapshot of SRAM devices.

An image holds the bytes of a machine's SRAM block devices (each tile's own disk, the chip
disk striped over tiles: to the image they are all just named devices) plus the machine's
geometry. This module is pure and offline: it knows nothing of tiles, littlefs or the
daemon, only bytes, files and zstd. It never prints; long operations take a ``progress``
callback ``progress(done_bytes, total_bytes)`` counting device (uncompressed) bytes;
``total_bytes`` is ``None`` when unknown (``devices`` given as a generator).

API
---

Writing::

    write_image(path, meta, devices, *, level=1, chunk_size=256 KiB, digest="sha256",
                threads=None, progress=None, stable=False) -> dict
                # Image.info()'s keys but the device list, plus "digests": {name: hex}

``meta`` is a JSON-able dict with at least the geometry: ``preset`` (str), ``ipus``,
``tiles_per_chip``, ``sram_per_tile`` (positive ints); other keys are kept as they are.
``devices`` is an iterable of :class:`DeviceSnapshot` ``(name, tile, mount, block_size,
block_count, data, nonzero=None)``; ``nonzero`` optionally lists the byte ranges outside
which the device is known to be zero, so the rest is not even read. It is consumed one device at a time and a device's bytes are let go
of once they are written, so a generator (or a ``data`` that is a zero-argument callable)
keeps about one device in memory. ``data`` is a C-contiguous buffer (bytes, bytearray,
memoryview, numpy array), an iterable of buffers (concatenated), a callable returning
either, or None for a blank device (all 0x00: nothing is read or stored). Mutable buffers
are copied chunk by chunk before they are hashed, so what is hashed is what is stored even
if the source changes meanwhile (such a snapshot is not point-in-time, but the image is
always self-consistent); ``stable=True`` promises they do not change (their owners are
frozen) and skips that copy. ``level`` is the zstd level (``None``: store chunks
uncompressed); a slot whose probes do not compress is stored raw without trying the rest.
``digest`` is "sha256", "blake2b" or "blake3" (the fastest by far; backups use it). The file is written atomically: a temp file
(mode 0600) in the destination directory, fsync, rename over ``path``, fsync of the
directory; on any error (or KeyboardInterrupt) the temp file is removed and an existing
image at ``path`` is untouched. A process killed outright (SIGKILL, power loss) can leave
a ``.<name>.*.tmp`` file behind, never a partial file under ``path`` (and the header is
written last, so a temp file is not even openable as an image until it is complete); the
next write of that image removes it. A writer holds its temp file ``flock``'d until the
rename, so that writer removes only the ones nobody holds (their writers are dead), never
another live writer's. ``threads``
(default: the CPUs available, at most 8) hash and compress in parallel; the output does not
depend on it. Bad arguments raise
``ValueError``; I/O errors raise ``OSError``.

Reading::

    open_image(path, *, max_decompressed=<the largest machine>, verify=True, threads=None,
               progress=None) -> Image

Opening always checks the structure: magic, format version, header checksum, file size
(truncation), manifest checksum, manifest schema, geometry sanity (every tile device fits
its tile's SRAM, all devices fit the machine's SRAM and ``max_decompressed``) and the chunk
table (chunks tile the data region exactly, every declared size within the chunk size).
With ``verify=True`` (the default) it then checks every chunk's checksum, decompresses each
within its declared size, and checks every device's digest and the image digest before
returning.

``Image`` has ``.path``, ``.version``, ``.meta``, ``.devices`` (the manifest:
:class:`DeviceEntry` list), ``.device(name)``, ``.verified``, ``.image_digest`` and:

- ``read_all(progress=None, checked=None) -> dict[name, numpy uint8 array]``: **the
  restore path** (``checked(entry, bytes)`` sees each device as its digest checks out). One
  pass that checks everything ``verify`` checks and returns only if the whole image is
  good: nothing at all comes out of a damaged image, so a restore built on it is never
  partial. Open with ``verify=False`` first to read the image once rather than twice. The
  arrays are views of one lazily zeroed anonymous mapping: all-zero chunks cost no RAM.
- ``verify(progress=None)``: the full check; raises :class:`ImageError`.
- ``read_device(name) -> numpy uint8 array``: one device, checked as it is read (its
  chunks and digest), whatever the rest of the image holds: what is intact can be read
  out of a damaged image.
- ``iter_devices(progress=None)``: ``(DeviceEntry, array)`` one device at a time after a
  whole-image verify (streaming restore in bounded memory; reads the image twice).
- ``info() -> dict``: a JSON-able summary for ``ipuos image info``.
- ``close()``; an Image is a context manager. It keeps its file open, so an image renamed
  over the path after opening does not change under it; in-place changes are caught by
  the per-read checks.

Every problem with an image (damage, truncation, bomb, unknown version, unreadable file)
raises :class:`ImageError` (a ``ValueError``); its message names the image and says what is
wrong and where, e.g. ``image /b/x.img: chunk 17 of device 'chip' (device bytes
4456448..4718592, file offset 919040) fails its checksum; the image is damaged``.

For a restore, pass the target machine's SRAM size as ``max_decompressed``.

Format, version 1 (integers little-endian)
------------------------------------------

::

    offset  size  header (192 bytes)
    0       8     magic b"\\x89IPUIMG\\n"
    8       2     format version (1)
    10      2     header size (192)
    12      4     flags (0; a set bit is a feature this reader does not know: refused)
    16      16    digest algorithm H, ASCII, NUL padded: "sha256", "blake2b" or "blake3"
                  (all 256-bit)
    32      8     file size
    40      8     data offset (= 192)
    48      8     data length
    56      8     manifest offset (= data offset + data length)
    64      8     manifest stored length
    72      8     manifest uncompressed length (at most 64 MiB)
    80      32    manifest checksum: H(manifest stored bytes)
    112     32    image digest (below)
    144     16    reserved, zero
    160     32    header checksum: H(bytes 0..160)
    192     ...   data region: the stored chunks back to back, in manifest order
    ...     ...   manifest: one zstd frame (with content size) of ASCII JSON

The manifest::

    {"format": "ipuos-image", "version": 1, "digest": "sha256", "chunk_size": 262144,
     "sector_size": 4096, "compression": "zstd", "meta": {...geometry...},
     "devices": [{"name": "tile/5/disk", "tile": 5, "mount": "/", "block_size": 4096,
                  "block_count": 32, "length": 131072, "digest": "<hex>",
                  "chunks": [[offset, file_offset, stored_length, length, "<hex>"], ...]},
                 ...]}

A device is cut into *slots* of ``chunk_size`` bytes (the last may be shorter). A slot that
is all 0x00 (SRAM's erased state) is not stored. Any other slot is one chunk: its
``offset`` in the device, ``file_offset`` of its stored bytes, ``stored_length``, its
uncompressed ``length`` (the slot's) and the checksum H(stored bytes). A chunk is one zstd
frame declaring its content size if ``stored_length < length``, else its raw bytes.

Digests are hash trees, so that zeros cost no hashing and nothing is hashed twice:

- slot digest = H(for each maximal run of 4 KiB sectors of the slot that are not all
  zero: u64 offset in slot || u64 length || H(run bytes)); an all-zero slot has H(b"").
- device digest = H(b"ipuos-image device v1\\0" || u64 chunk_size || u64 sector_size ||
  u64 length || slot digests in order): a function of the device's uncompressed bytes
  and the chunk size only (:func:`device_digest` computes it for a live device).
- image digest = H(b"ipuos-image root v1\\0" || manifest checksum || every chunk's
  checksum in file order). The chunk table must cover the data region exactly and the
  header fixes the file size, so this commits to every byte after the header, as the
  header checksum commits to the header.

Limits against decompression bombs, checked before anything is inflated: the manifest's
declared size is at most 64 MiB; a chunk's length is the size of its slot (so at most the
chunk size, itself at most 16 MiB) and must equal the content size its zstd frame declares
(frames without one are refused); the devices' total must fit the declared geometry and
``max_decompressed``. Decompression writes into a buffer of exactly the declared size
(zstd fails rather than overrun it) with the decoder's window limited to the chunk size.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import errno
import hashlib
import json
import mmap
import os
import queue
import re
import stat
import struct
import threading
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
import zstandard

from ._affinity import unpin_thread
from ._plural import plural
from ._presets import largest_machine_bytes
from ._safepath import name_prefix
from ._tempfiles import locked_temp, remove_dead_temps

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_DIGEST",
    "DEFAULT_LEVEL",
    "DEFAULT_MAX_DECOMPRESSED",
    "FORMAT_VERSION",
    "MAGIC",
    "Chunk",
    "DeviceEntry",
    "DeviceSnapshot",
    "Image",
    "ImageError",
    "device_digest",
    "open_image",
    "write_image",
]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

MAGIC = b"\x89IPUIMG\n"
FORMAT_VERSION = 1
HEADER_SIZE = 192
_HEAD = struct.Struct("<8sHHI16sQQQQQQ32s32s16s")  # the header but its checksum
assert _HEAD.size == HEADER_SIZE - 32

DIGEST_SIZE = 32
#: sha256 beats blake2b wherever the CPU has SHA extensions (most x86-64 and arm64 now):
#: measured 1.4-1.6 GB/s vs 1.05 GB/s here; blake2b remains selectable
DEFAULT_DIGEST = "sha256"
DEFAULT_CHUNK_SIZE = 256 * KiB
MIN_CHUNK_SIZE = 4 * KiB
MAX_CHUNK_SIZE = 16 * MiB
SECTOR_SIZE = 4 * KiB  # granularity of zero runs inside a slot (format constant in v1)
DEFAULT_LEVEL = 1
MANIFEST_LEVEL = 1  # measured: as small as 9 on hex digests (they are the entropy), 6x faster
#: any machine ipuos can build (64 mk2 chips: 57.5 GiB); a restore passes its own SRAM
DEFAULT_MAX_DECOMPRESSED = largest_machine_bytes()
MAX_MANIFEST_SIZE = 64 * MiB
MAX_NAME_BYTES = 255
MAX_MOUNT_BYTES = 4096
_BATCH_BYTES = 4 * MiB  # work handed to a worker thread at a time
_BATCH_ITEMS = 512  # and at most this many chunks (one preadv/writev each)
_LIGHT = 8  # a batch with under 1/8 of its bytes to hash is done inline, not on a worker
_PROGRESS_STEP = 8 * MiB

_DEVICE_DOMAIN = b"ipuos-image device v1\0"
_ROOT_DOMAIN = b"ipuos-image root v1\0"
_RUN = struct.Struct("<QQ")


def _sha256(data) -> bytes:
    return hashlib.sha256(data).digest()


def _blake2b(data) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_SIZE).digest()


_HASHES: dict[str, Callable[[Any], bytes]] = {"sha256": _sha256, "blake2b": _blake2b}

try:  # blake3: 5.5 GB/s per core here (AVX-512) against sha256's 1.5: backups choose it
    from blake3 import blake3 as _Blake3
except ImportError:  # pragma: no cover - blake3 is a dependency; still readable without it
    _Blake3 = None
else:
    def _blake3(data) -> bytes:
        return _Blake3(data).digest()

    _HASHES["blake3"] = _blake3

#: every digest algorithm format version 1 names, installed or not
_KNOWN_DIGESTS = ("sha256", "blake2b", "blake3")


class ImageError(ValueError):
    """An image is damaged, truncated, hostile, of an unknown version, or unreadable."""


# --------------------------------------------------------------------------- data types


@dataclasses.dataclass(frozen=True)
class DeviceSnapshot:
    """One device to write: its identity, geometry and bytes (see the module docstring)."""

    name: str
    tile: int | None
    mount: str | None
    block_size: int
    block_count: int
    data: Any
    #: sorted, disjoint ``(offset, length)`` byte ranges outside which the device is known
    #: to be all zero (None: anywhere): slots outside them are neither read nor scanned
    nonzero: Any = None

    @property
    def length(self) -> int:
        return self.block_size * self.block_count


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One stored chunk of a device, as the manifest lists it."""

    offset: int  # in the device
    file_offset: int
    stored_length: int
    length: int  # uncompressed
    checksum: bytes  # H(stored bytes)

    @property
    def compressed(self) -> bool:
        return self.stored_length < self.length


@dataclasses.dataclass(frozen=True)
class DeviceEntry:
    """One device of an image's manifest."""

    name: str
    tile: int | None
    mount: str | None
    block_size: int
    block_count: int
    length: int
    digest: str  # hex
    chunks: tuple[Chunk, ...]

    @property
    def stored_length(self) -> int:
        return sum(c.stored_length for c in self.chunks)

    def summary(self) -> dict:
        return {
            "name": self.name,
            "tile": self.tile,
            "mount": self.mount,
            "block_size": self.block_size,
            "block_count": self.block_count,
            "length": self.length,
            "stored": self.stored_length,
            "chunks": len(self.chunks),
            "digest": self.digest,
        }


# --------------------------------------------------------------------------- digests


def _sector_flags(data) -> np.ndarray:
    """Per SECTOR_SIZE sector of ``data`` (the last may be short): is it not all zero?

    A sector whose first 8 bytes are not all zero is settled by them alone; only the rest
    are scanned whole. Full disks of file data are then ~1 ms per 184 MiB instead of ~20.
    """
    a = np.frombuffer(data, np.uint8)
    n = len(a)
    full = n // SECTOR_SIZE
    sectors = a[: full * SECTOR_SIZE].reshape(full, SECTOR_SIZE)
    flags = sectors[:, :8].any(axis=1)
    if n == full * SECTOR_SIZE and flags.all():
        return flags  # the common case of full disks: settled by the first words
    unsure = np.flatnonzero(~flags)
    if len(unsure) == full:
        flags = sectors.any(axis=1)
    elif len(unsure):
        for i in unsure.tolist():
            flags[i] = sectors[i].any()
    if n % SECTOR_SIZE:
        flags = np.append(flags, a[full * SECTOR_SIZE :].any())
    return flags


def _runs(data, flags: np.ndarray | None = None) -> list[tuple[int, int]]:
    """Maximal runs ``(offset, length)`` of SECTOR_SIZE sectors of ``data`` not all zero
    (``flags``: its :func:`_sector_flags`, if already known)."""
    n = len(data)
    if flags is None:
        flags = _sector_flags(data)
    if flags.all():
        return [(0, n)] if n else []
    if not flags.any():
        return []
    edges = np.diff(np.concatenate(([0], flags.view(np.int8), [0])))
    starts = np.flatnonzero(edges == 1) * SECTOR_SIZE
    ends = np.minimum(np.flatnonzero(edges == -1) * SECTOR_SIZE, n)
    return [(int(s), int(e - s)) for s, e in zip(starts, ends)]


def _slot_digest(H, data, runs, whole: bytes | None = None) -> bytes:
    """The slot digest of ``data`` given its ``runs``; ``whole`` is H(data) if known."""
    n = len(data)
    parts = []
    for off, length in runs:
        if off == 0 and length == n and whole is not None:
            h = whole
        else:
            h = H(data[off : off + length])
        parts.append(_RUN.pack(off, length) + h)
    return H(b"".join(parts))


def _zero_slot(algo: str) -> bytes:
    return _HASHES[algo](b"")


def _device_root(algo: str, chunk_size: int, length: int, slot_digests: list[bytes]) -> bytes:
    return _HASHES[algo](
        _DEVICE_DOMAIN + struct.pack("<QQQ", chunk_size, SECTOR_SIZE, length) + b"".join(slot_digests)
    )


def device_digest(data, *, chunk_size: int = DEFAULT_CHUNK_SIZE, digest: str = DEFAULT_DIGEST) -> str:
    """The manifest digest (hex) of a device holding ``data``: compares a live device with
    an image's :attr:`DeviceEntry.digest` without reading the image's chunks."""
    _check_algo(digest)
    _check_chunk_size(chunk_size)
    mv = _as_bytes_view(data, "data")
    H = _HASHES[digest]
    slots = []
    for off in range(0, len(mv), chunk_size):
        piece = mv[off : off + chunk_size]
        slots.append(_slot_digest(H, piece, _runs(piece)))
    return _device_root(digest, chunk_size, len(mv), slots).hex()


# --------------------------------------------------------------------------- checks


def _as_bytes_view(data, what: str) -> memoryview:
    try:
        mv = memoryview(data)
    except TypeError:
        raise ValueError(f"{what}: not a buffer ({type(data).__name__})") from None
    if not mv.c_contiguous:
        raise ValueError(f"{what}: buffer is not C-contiguous")
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def _check_algo(name: str) -> None:
    if name not in _HASHES:
        if name in _KNOWN_DIGESTS:
            raise ValueError(f"digest algorithm {name!r} needs the {name} package, which is not installed")
        raise ValueError(f"unknown digest algorithm {name!r}; choose one of {', '.join(sorted(_HASHES))}")


def _chunk_size_ok(cs) -> bool:
    return _is_int(cs) and MIN_CHUNK_SIZE <= cs <= MAX_CHUNK_SIZE and not cs & (cs - 1)


def _check_chunk_size(cs) -> None:
    if not _chunk_size_ok(cs):
        raise ValueError(
            f"chunk_size must be a power of two from {MIN_CHUNK_SIZE} to {MAX_CHUNK_SIZE}, not {cs!r}"
        )


def _default_threads() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _name_problem(name) -> str | None:
    if not isinstance(name, str) or not name:
        return "must be a non-empty string"
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if len(raw) > MAX_NAME_BYTES:
        return f"is {len(raw)} bytes long (at most {MAX_NAME_BYTES})"
    if _CONTROL.search(name):
        return "contains control characters"
    return None


_CONTROL = re.compile("[\x00-\x1f\x7f]")


def _mount_problem(mount) -> str | None:
    if mount is None:
        return None
    if not isinstance(mount, str):
        return "must be a string or None"
    try:
        raw = mount.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    if len(raw) > MAX_MOUNT_BYTES or "\0" in mount:
        return "is too long or contains NUL"
    return None


class _Geometry:
    """The machine's shape, from ``meta``, and the checks its devices must pass."""

    def __init__(self, meta, fail: Callable[[str], Exception]):
        if not isinstance(meta, dict):
            raise fail("meta must be a dict with the machine geometry")
        if not isinstance(meta.get("preset"), str) or not meta["preset"]:
            raise fail("meta['preset'] must be the preset's name (a non-empty string)")
        for key in ("ipus", "tiles_per_chip", "sram_per_tile"):
            v = meta.get(key)
            if not _is_int(v) or v < 1:
                raise fail(f"meta[{key!r}] must be a positive integer, not {v!r}")
        self.ipus = meta["ipus"]
        self.tiles_per_chip = meta["tiles_per_chip"]
        self.sram_per_tile = meta["sram_per_tile"]
        self.tiles = self.ipus * self.tiles_per_chip
        self.total_sram = self.tiles * self.sram_per_tile
        self._fail = fail
        self._per_tile: dict[int, int] = {}
        self.total = 0

    def add(self, name: str, tile, length: int) -> None:
        fail = self._fail
        if tile is not None:
            if not _is_int(tile) or not 0 <= tile < self.tiles:
                raise fail(
                    f"device {name!r} belongs to tile {tile!r}, but the machine has tiles "
                    f"0..{self.tiles - 1} ({self.ipus} x {self.tiles_per_chip})"
                )
            used = self._per_tile.get(tile, 0) + length
            if used > self.sram_per_tile:
                raise fail(
                    f"the devices of tile {tile} hold {used} bytes, more than a tile's "
                    f"SRAM ({self.sram_per_tile} bytes)"
                )
            self._per_tile[tile] = used
        self.total += length
        if self.total > self.total_sram:
            raise fail(
                f"the devices hold {self.total} bytes (device {name!r} included), more than "
                f"the machine's SRAM ({self.total_sram} bytes)"
            )


# --------------------------------------------------------------------------- plumbing


class _Workers:
    """An ordered pipeline on a thread pool: ``submit`` jobs, take results in order."""

    def __init__(self, threads: int):
        self.threads = threads
        self._pool = (
            concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="ipuos-image",
                                                  initializer=unpin_thread)
            if threads > 1
            else None
        )
        self._pending: collections.deque = collections.deque()

    def submit(self, fn, *args, inline: bool = False) -> None:
        """Queue ``fn(*args)``; ``inline`` runs it here and now (work too light to be
        worth a thread hand-off: small Python steps on two threads fight over the GIL)."""
        if self._pool is None or inline:
            self._pending.append(_Done(fn(*args)))
        else:
            self._pending.append(self._pool.submit(fn, *args))

    def full(self) -> bool:
        return len(self._pending) >= 2 * self.threads

    def __bool__(self) -> bool:
        return bool(self._pending)

    def next_result(self):
        return self._pending.popleft().result()

    def close(self) -> None:
        if self._pool is not None:
            for f in self._pending:
                f.cancel()
            self._pool.shutdown(wait=True)
        self._pending.clear()


class _Done:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


def _write_all(fd: int, bufs: list) -> None:
    while bufs:
        n = os.writev(fd, bufs[:_BATCH_ITEMS])
        while n:
            head = bufs[0]
            if n >= len(head):
                n -= len(head)
                bufs.pop(0)
            else:
                bufs[0] = memoryview(head)[n:]
                n = 0
        # loop again on a short write (or the rest beyond IOV_MAX)


class _FileWriter:
    """Writes the chunks, in order, on a thread of its own.

    Copying into the page cache (``writev``) is a third of a backup's work and releases
    the GIL: done here, it overlaps both the hashing on the worker threads and the
    per-slot bookkeeping on the caller's thread instead of following them. The buffers
    handed over must stay valid until :meth:`finish` returns.
    """

    def __init__(self, fd: int, start: int):
        self._fd = fd
        self._writeback = _Writeback(fd, start)
        self._queue: queue.Queue = queue.Queue(maxsize=8)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ipuos-image-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        unpin_thread()  # bulk writes: any CPU
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is not None:
                continue  # failed already: drain until told to stop
            bufs, pos = item
            try:
                _write_all(self._fd, bufs)
                self._writeback.written(pos)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                self._error = exc

    def put(self, bufs: list, pos: int) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put((bufs, pos))

    def finish(self) -> None:
        """Wait until everything is written; raise what writing raised."""
        self.close()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


class _Writeback:
    """Start writing the image to disk while it is still being written.

    The final ``fsync`` otherwise waits for every byte at once: measured here, 184 MiB
    take 0.036 s into the page cache and then 0.07 s more to reach the disk; asking the
    kernel to start writeback every few MiB (``sync_file_range(SYNC_FILE_RANGE_WRITE)``,
    which does not wait) overlaps the two and the fsync finds little left to do. A
    platform without the call just fsyncs at the end.
    """

    STEP = 8 * MiB
    _call = None

    def __init__(self, fd: int, start: int):
        self._fd = fd
        self._synced = start
        if _Writeback._call is None:
            _Writeback._call = _find_sync_file_range() or False

    def written(self, pos: int) -> None:
        call = self._call
        if call and pos - self._synced >= self.STEP:
            call(self._fd, self._synced, pos - self._synced, 2)  # SYNC_FILE_RANGE_WRITE
            self._synced = pos


def _find_sync_file_range():
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


def _lazy_zeros(n: int) -> np.ndarray:
    """``n`` zero bytes whose untouched pages cost no RAM (no huge pages)."""
    if n < 1 * MiB:
        return np.zeros(n, np.uint8)
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0))
    advice = getattr(mmap, "MADV_NOHUGEPAGE", None)
    if advice is not None:
        try:
            m.madvise(advice)
        except OSError:
            pass
    return np.frombuffer(m, np.uint8)


# --------------------------------------------------------------------------- writing


#: bytes of the probe that decides whether a full slot is worth compressing, taken as
#: this many pieces spread evenly over the slot
_PROBE_BYTES = 4 * KiB
_PROBE_PIECES = 8
#: the probe must shrink below this fraction for its slot to be compressed
_PROBE_RATIO = 0.8


class _Encoder:
    """Worker-side work of the writer: snapshot, digest, compress, checksum.

    Incompressible slots (random or already-compressed file data) are common on full
    disks, and zstd spends ~0.6 ns a byte finding out what a 4 KiB probe (eight 512-byte
    pieces spread over the slot, compressed as one) tells for a fraction of that: a slot
    is compressed if a fifth of it is zero sectors (they squeeze to nothing) or its probe
    shrinks by a fifth; one that would shrink by less is stored raw: a little bigger,
    much faster, never wrong.
    """

    def __init__(self, level: int | None, algo: str):
        self._level = level
        self._H = _HASHES[algo]
        self._local = threading.local()

    @staticmethod
    def _worth_compressing(cctx, raw, runs) -> bool:
        n = len(raw)
        zeros = n - sum(length for _, length in runs)
        if zeros >= n * (1 - _PROBE_RATIO) or n < 4 * _PROBE_BYTES:
            return True  # the zeros alone pay for it (or the slot is too small to probe)
        step, piece = n // _PROBE_PIECES, _PROBE_BYTES // _PROBE_PIECES
        probe = b"".join(raw[i * step : i * step + piece] for i in range(_PROBE_PIECES))
        return len(cctx.compress(probe)) < len(probe) * _PROBE_RATIO

    def encode(self, items: list) -> tuple[list, list]:
        H = self._H
        cctx = None
        if self._level is not None:
            cctx = getattr(self._local, "cctx", None)
            if cctx is None:
                cctx = self._local.cctx = zstandard.ZstdCompressor(
                    level=self._level, write_content_size=True, write_checksum=False
                )
        out = []
        for item in items:
            view, copy, flags = item[4], item[5], item[6]
            if copy:  # the source may change: digest exactly what is stored
                raw = bytes(view)
                runs = _runs(raw)
            else:
                raw = view
                runs = _runs(raw, flags)
            comp = None
            if cctx is not None and self._worth_compressing(cctx, raw, runs):
                comp = cctx.compress(raw)
            if comp is not None and len(comp) < len(raw):
                out.append((comp, H(comp), _slot_digest(H, raw, runs)))
            else:
                check = H(raw)
                out.append((raw, check, _slot_digest(H, raw, runs, whole=check)))
        return items, out


class _Ranges:
    """Sorted disjoint byte ranges, asked in increasing order whether a span meets them."""

    __slots__ = ("_ranges", "_i")

    def __init__(self, ranges):
        self._ranges = [(int(o), int(n)) for o, n in ranges if n > 0]
        self._i = 0

    def meets(self, start: int, length: int) -> bool:
        ranges, i = self._ranges, self._i
        while i < len(ranges) and ranges[i][0] + ranges[i][1] <= start:
            i += 1
        self._i = i
        return i < len(ranges) and ranges[i][0] < start + length


def _iter_pieces(data, length: int, chunk_size: int, name: str,
                 stable: bool = False) -> Iterator[tuple[memoryview, bool]]:
    """``data`` as ``(view, needs_copy)`` pieces of ``chunk_size`` bytes."""
    if data is None:  # a blank device: nothing to read, nothing stored
        return
    if callable(data) and not isinstance(data, (bytes, bytearray, memoryview, np.ndarray)):
        data = data()
    try:
        mv = memoryview(data)
    except TypeError:
        mv = None
    if mv is not None:
        mv = _as_bytes_view(mv, f"device {name!r}")
        if len(mv) != length:
            raise ValueError(
                f"device {name!r}: data has {plural(len(mv), 'byte')}, but block_size x block_count "
                f"is {length}"
            )
        # immutable bytes cannot change under us: no snapshot copy needed
        copy = not stable and not (mv.readonly and isinstance(mv.obj, bytes))
        for off in range(0, length, chunk_size):
            yield mv[off : off + chunk_size], copy
        return
    try:
        parts = iter(data)
    except TypeError:
        raise ValueError(
            f"device {name!r}: data must be a buffer, an iterable of buffers, or a callable "
            f"returning one ({type(data).__name__} is none of these)"
        ) from None
    buf = bytearray()
    seen = 0
    for part in parts:
        pv = _as_bytes_view(part, f"device {name!r}")
        seen += len(pv)
        if seen > length:
            raise ValueError(f"device {name!r}: data has more than block_size x block_count = {length} bytes")
        buf += pv
        while len(buf) >= chunk_size:
            yield memoryview(bytes(buf[:chunk_size])), False
            del buf[:chunk_size]
    if seen != length:
        raise ValueError(f"device {name!r}: data has {plural(seen, 'byte')}, but block_size x block_count "
                         f"is {length}")
    if buf:
        yield memoryview(bytes(buf)), False


def write_image(
    path,
    meta: Mapping,
    devices: Iterable[DeviceSnapshot],
    *,
    level: int | None = DEFAULT_LEVEL,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    digest: str = DEFAULT_DIGEST,
    threads: int | None = None,
    progress: Callable[[int, int | None], None] | None = None,
    stable: bool = False,
) -> dict:
    """Write an image of ``devices`` to ``path`` atomically and return a summary.

    ``stable``: the caller guarantees no device's bytes change until this returns (their
    owners are frozen), so they are hashed and written where they are, without the
    per-chunk snapshot copy.
    """
    path = os.fspath(path)
    if isinstance(meta, Mapping):
        meta = dict(meta)
    geometry = _Geometry(meta, ValueError)
    try:
        json.dumps(meta, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ValueError(f"meta must be JSON-able: {e}") from None
    _check_algo(digest)
    _check_chunk_size(chunk_size)
    if level is not None and (not _is_int(level) or not -(1 << 17) <= level <= 22):
        raise ValueError(f"level must be a zstd level (-131072..22) or None, not {level!r}")
    threads = _default_threads() if threads is None else max(1, int(threads))
    total = None
    if isinstance(devices, (list, tuple)):
        total = sum(d.length for d in devices if isinstance(d, DeviceSnapshot))

    directory = os.path.dirname(os.path.abspath(path))
    prefix = f".{name_prefix(os.path.basename(path), 200)}."
    fd, tmp = locked_temp(directory, prefix)
    try:
        try:
            remove_dead_temps(directory, prefix)
            _write_all(fd, [bytes(HEADER_SIZE)])
            entries, checks, data_length = _write_devices(
                fd, devices, geometry, level, chunk_size, digest, threads, progress, total, stable
            )
            manifest = {
                "format": "ipuos-image",
                "version": FORMAT_VERSION,
                "digest": digest,
                "chunk_size": chunk_size,
                "sector_size": SECTOR_SIZE,
                "compression": "zstd",
                "meta": meta,
                "devices": entries,
            }
            text = json.dumps(manifest, separators=(",", ":"), allow_nan=False).encode("ascii")
            if len(text) > MAX_MANIFEST_SIZE:
                raise ValueError(
                    f"the manifest would be {len(text)} bytes, over the {MAX_MANIFEST_SIZE}-byte "
                    f"limit readers accept; use a larger chunk_size"
                )
            mstored = zstandard.ZstdCompressor(
                level=MANIFEST_LEVEL, write_content_size=True, write_checksum=False
            ).compress(text)
            _write_all(fd, [mstored])
            H = _HASHES[digest]
            mcheck = H(mstored)
            root = H(_ROOT_DOMAIN + mcheck + b"".join(checks))
            manifest_offset = HEADER_SIZE + data_length
            file_size = manifest_offset + len(mstored)
            head = _HEAD.pack(
                MAGIC, FORMAT_VERSION, HEADER_SIZE, 0, digest.encode("ascii"), file_size,
                HEADER_SIZE, data_length, manifest_offset, len(mstored), len(text),
                mcheck, root, bytes(16),
            )
            head += H(head)
            if os.pwrite(fd, head, 0) != HEADER_SIZE:
                raise OSError(f"short write of the header of {tmp}")
            try:  # replacing a file: its mode stays what its owner chose (as cp keeps it),
                # but for its owner's read and write: an image they cannot read restores nothing
                os.fchmod(fd, stat.S_IMODE(os.stat(path).st_mode) | stat.S_IRUSR | stat.S_IWUSR)
            except FileNotFoundError:
                pass  # a new image: private (mkstemp's 0600), it holds the machine's files
            os.fsync(fd)
            os.replace(tmp, path)  # (still locked: no other writer takes it for a dead one's)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)
    _fsync_dir(directory)
    return {
        "path": path,
        "format_version": FORMAT_VERSION,
        "digest_algorithm": digest,
        "chunk_size": chunk_size,
        "file_size": file_size,
        "image_digest": root.hex(),
        "meta": meta,
        "device_count": len(entries),
        "device_bytes": geometry.total,
        "stored_bytes": data_length,
        "manifest_bytes": len(mstored),
        "digests": {e["name"]: e["digest"] for e in entries},
    }


def _fsync_dir(directory: str) -> None:
    """Make the rename durable. Filesystems that cannot fsync a directory say so with
    EINVAL/ENOTSUP; the image is complete either way, so only real I/O errors raise."""
    dfd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(dfd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(dfd)


def _write_devices(fd, devices, geometry, level, chunk_size, algo, threads, progress, total, stable):
    encoder = _Encoder(level, algo)
    workers = _Workers(threads)
    zero_slot = _zero_slot(algo)
    entries: list[dict] = []
    slots_of: list[list] = []  # per device: slot digests, filled in as results arrive
    checks: list[bytes] = []
    names: set[str] = set()
    pos = HEADER_SIZE
    writer = _FileWriter(fd, HEADER_SIZE)
    done = reported = 0
    batch: list = []
    batch_bytes = batch_work = 0

    def report(force=False):
        nonlocal reported
        if progress is not None and (force or done - reported >= _PROGRESS_STEP):
            reported = done
            progress(done, total)

    def drain_one():
        nonlocal pos
        items, results = workers.next_result()
        bufs = []
        for (di, si, off, plen, _, _, _), (stored, check, slot) in zip(items, results):
            n = len(stored)
            entries[di]["chunks"].append([off, pos, n, plen, check.hex()])
            slots_of[di][si] = slot
            checks.append(check)
            pos += n
            bufs.append(stored)
        writer.put(bufs, pos)

    def flush_batch():
        nonlocal batch, batch_bytes, batch_work
        if batch:
            workers.submit(encoder.encode, batch, inline=batch_work * _LIGHT < batch_bytes)
            batch, batch_bytes, batch_work = [], 0, 0
        while workers.full():
            drain_one()

    try:
        for dev in devices:
            if not isinstance(dev, DeviceSnapshot):
                raise ValueError(f"devices must be DeviceSnapshot objects, not {type(dev).__name__}")
            problem = _name_problem(dev.name)
            if problem:
                raise ValueError(f"device name {dev.name!r} {problem}")
            if dev.name in names:
                raise ValueError(f"two devices are named {dev.name!r}")
            names.add(dev.name)
            problem = _mount_problem(dev.mount)
            if problem:
                raise ValueError(f"device {dev.name!r}: mount point {problem}")
            if not _is_int(dev.block_size) or dev.block_size < 1:
                raise ValueError(f"device {dev.name!r}: block_size must be a positive integer, not {dev.block_size!r}")
            if not _is_int(dev.block_count) or dev.block_count < 0:
                raise ValueError(f"device {dev.name!r}: block_count must be an integer >= 0, not {dev.block_count!r}")
            length = dev.length
            geometry.add(dev.name, dev.tile, length)
            di = len(entries)
            entries.append({
                "name": dev.name, "tile": dev.tile, "mount": dev.mount,
                "block_size": dev.block_size, "block_count": dev.block_count,
                "length": length, "digest": None, "chunks": [],
            })
            slots = [zero_slot] * -(-length // chunk_size)
            slots_of.append(slots)
            if dev.data is None:
                done += length
            ranges = _Ranges(dev.nonzero) if dev.nonzero is not None else None
            for si, (piece, copy) in enumerate(_iter_pieces(dev.data, length, chunk_size, dev.name, stable)):
                done += len(piece)
                if ranges is not None and not ranges.meets(si * chunk_size, len(piece)):
                    continue  # known to be zero: nothing to scan
                flags = _sector_flags(piece)  # of the live view: an estimate of the work
                work = int(np.count_nonzero(flags)) * SECTOR_SIZE
                if work:
                    batch.append((di, si, si * chunk_size, len(piece), piece, copy, flags))
                    batch_bytes += len(piece)
                    batch_work += work
                    if batch_bytes >= _BATCH_BYTES or len(batch) >= _BATCH_ITEMS:
                        flush_batch()
                report()
        flush_batch()
        while workers:
            drain_one()
        writer.finish()
    finally:
        workers.close()
        writer.close()
    for entry, slots in zip(entries, slots_of):
        entry["digest"] = _device_root(algo, chunk_size, entry["length"], slots).hex()
    done = geometry.total
    report(force=True)
    return entries, checks, pos - HEADER_SIZE


# --------------------------------------------------------------------------- reading


def open_image(
    path,
    *,
    max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
    verify: bool = True,
    threads: int | None = None,
    progress: Callable[[int, int | None], None] | None = None,
) -> "Image":
    """Open an image, check its structure and (``verify=True``) every byte of it."""
    path = os.fspath(path)
    try:
        # non-blocking: opening a FIFO would otherwise wait for a writer, forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ImageError(f"image {path}: cannot open it: {e.strerror or e}") from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ImageError(f"image {path}: not a regular file")
    os.set_blocking(fd, True)
    image = Image(path, fd, max_decompressed=max_decompressed, threads=threads)  # owns fd
    if verify:
        try:
            image.verify(progress=progress)
        except BaseException:
            image.close()
            raise
    return image


class Image:
    """An opened image whose header and manifest have been checked (see the module doc)."""

    def __init__(self, path: str, fd: int, *, max_decompressed: int = DEFAULT_MAX_DECOMPRESSED,
                 threads: int | None = None):
        """Takes ownership of ``fd`` (closed on failure); use :func:`open_image`."""
        self._fd = fd
        self.path = path
        self._threads = _default_threads() if threads is None else max(1, int(threads))
        self.max_decompressed = max_decompressed
        self.verified = False
        self._local = threading.local()
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    # -- plumbing

    def _error(self, what: str) -> ImageError:
        return ImageError(f"image {self.path}: {what}")

    def _fileno(self) -> int:
        if self._fd is None:
            raise self._error("the image is closed")
        return self._fd

    @property
    def mode(self) -> int:
        """The image file's mode (``st_mode``): its contents are as private as it is."""
        return os.fstat(self._fileno()).st_mode

    def _short(self, offset: int) -> ImageError:
        return self._error(
            f"is truncated: reading at offset {offset} hit the end of the file (it changed "
            f"after it was opened)"
        )

    def _pread(self, offset: int, size: int) -> bytes:
        fd = self._fileno()
        parts = []
        try:
            while size:
                got = os.pread(fd, size, offset)
                if not got:
                    raise self._short(offset)
                parts.append(got)
                size -= len(got)
                offset += len(got)
        except OSError as e:
            raise self._error(f"cannot read it: {e.strerror or e}") from e
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _preadv(self, views: list, offset: int) -> None:
        """Fill ``views`` (writable memoryviews) from the file at ``offset``, in order."""
        fd = self._fileno()
        views = [v for v in views if len(v)]
        try:
            while views:
                n = os.preadv(fd, views[:_BATCH_ITEMS], offset)
                if not n:
                    raise self._short(offset)
                offset += n
                while n:
                    if n >= len(views[0]):
                        n -= len(views.pop(0))
                    else:
                        views[0] = views[0][n:]
                        n = 0
        except OSError as e:
            raise self._error(f"cannot read it: {e.strerror or e}") from e

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "Image":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"<Image {self.path} v{self.version}, {len(self.devices)} devices>"

    # -- structure

    def _load(self) -> None:
        try:
            st = os.fstat(self._fd)
        except OSError as e:
            raise self._error(f"cannot stat it: {e.strerror or e}") from e
        if not stat.S_ISREG(st.st_mode):
            raise self._error("is not a regular file")
        size = st.st_size
        if size == 0:
            # (a /proc or /sys file has a size of 0 and still holds bytes)
            raise self._error("is empty (0 bytes): not an ipuos image" if not os.pread(self._fileno(), 1, 0)
                              else "says it is 0 bytes long yet holds bytes (a /proc or /sys file?): "
                                   "not an ipuos image")
        head = self._pread(0, min(size, HEADER_SIZE))
        if head[: len(MAGIC)] != MAGIC:
            if len(head) < len(MAGIC) and MAGIC.startswith(head):
                raise self._error(f"is truncated: it has only {plural(size, 'byte')}, not even its magic")
            raise self._error(
                f"is not an ipuos image (it starts with {head[:len(MAGIC)]!r}, not the "
                f"magic {MAGIC!r})"
            )
        if len(head) < 10:
            raise self._error(f"is truncated: it has only {plural(size, 'byte')}")
        version = struct.unpack_from("<H", head, 8)[0]
        if version != FORMAT_VERSION:
            raise self._error(
                f"has format version {version}, which this ipuos cannot read (it reads "
                f"format version {FORMAT_VERSION}); it was written by another version of "
                f"ipuos, or its header is damaged"
            )
        if len(head) < HEADER_SIZE:
            raise self._error(f"is truncated: it has {size} bytes, less than its {HEADER_SIZE}-byte header")
        (_, _, header_size, flags, algo_raw, file_size, data_offset, data_length,
         manifest_offset, manifest_length, manifest_size, manifest_check, root,
         reserved) = _HEAD.unpack_from(head)
        algo = algo_raw.rstrip(b"\0").decode("ascii", "replace")
        if algo in _KNOWN_DIGESTS and algo not in _HASHES:
            raise self._error(f"uses {algo} digests, and the {algo} package is not installed here")
        if algo not in _HASHES:
            raise self._error(f"its header names an unknown digest algorithm {algo!r}; the header is damaged")
        H = _HASHES[algo]
        if H(head[: HEADER_SIZE - DIGEST_SIZE]) != head[HEADER_SIZE - DIGEST_SIZE :]:
            raise self._error("its header fails its checksum; the image is damaged")
        if header_size != HEADER_SIZE or reserved != bytes(16):
            raise self._error("its header has an impossible layout; the image is damaged")
        if flags:
            raise self._error(
                f"uses format features this ipuos does not know (flags {flags:#x}); it was "
                f"written by a newer ipuos"
            )
        if size < file_size:
            raise self._error(
                f"is truncated: it has {size} bytes, but its header says {file_size}; the "
                f"image is incomplete"
            )
        if size > file_size:
            raise self._error(
                f"has {plural(size - file_size, 'byte')} beyond its end ({file_size} bytes declared); "
                f"the image is damaged"
            )
        if (
            data_offset != HEADER_SIZE
            or manifest_offset != data_offset + data_length
            or manifest_offset + manifest_length != file_size
            or manifest_length < 1
        ):
            raise self._error("its header's offsets are inconsistent; the image is damaged")
        if manifest_size > MAX_MANIFEST_SIZE:
            raise self._error(
                f"its manifest claims {manifest_size} bytes uncompressed, over the limit of "
                f"{MAX_MANIFEST_SIZE}; refused (damaged, or a decompression bomb)"
            )
        self.version = version
        self.digest_algorithm = algo
        self._H = H
        self.file_size = file_size
        self.data_length = data_length
        self.manifest_length = manifest_length
        self._manifest_check = manifest_check
        self._root = root
        self.image_digest = root.hex()

        stored = self._pread(manifest_offset, manifest_length)
        if H(stored) != manifest_check:
            raise self._error("its manifest fails its checksum; the image is damaged")
        text = _inflate_exact(
            zstandard.ZstdDecompressor(max_window_size=max(1 * MiB, _pow2_ceil(manifest_size))),
            stored, manifest_size, lambda what: self._error(f"its manifest {what}"),
        )
        try:
            manifest = json.loads(text.decode("ascii"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise self._error(f"its manifest is not valid JSON ({e}); the image is damaged") from None
        self._parse_manifest(manifest)

    def _parse_manifest(self, m) -> None:
        def fail(what: str) -> ImageError:
            return self._error(f"manifest: {what}; the image is damaged or was not written by ipuos")

        if not isinstance(m, dict):
            raise fail("not a JSON object")
        if m.get("format") != "ipuos-image" or m.get("version") != self.version:
            raise fail(f"format {m.get('format')!r} version {m.get('version')!r} does not match the header")
        if (
            m.get("digest") != self.digest_algorithm
            or m.get("compression") != "zstd"
            or m.get("sector_size") != SECTOR_SIZE
        ):
            raise fail("digest algorithm, compression or sector size does not match format version 1")
        cs = m.get("chunk_size")
        if not _chunk_size_ok(cs):
            raise fail(f"impossible chunk size {cs!r}")
        self.chunk_size = cs
        meta = m.get("meta")
        geometry = _Geometry(meta, lambda what: self._error(f"geometry: {what}; refused"))
        devices = m.get("devices")
        if not isinstance(devices, list):
            raise fail("'devices' is not a list")
        pos = HEADER_SIZE
        entries: list[DeviceEntry] = []
        names: set[str] = set()
        keys = {"name", "tile", "mount", "block_size", "block_count", "length", "digest", "chunks"}
        for i, d in enumerate(devices):
            if not isinstance(d, dict) or set(d) != keys:
                raise fail(f"device {i} is not a device entry")
            name = d["name"]
            problem = _name_problem(name)
            if problem:
                raise fail(f"device {i}: name {name!r} {problem}")
            if name in names:
                raise fail(f"two devices are named {name!r}")
            names.add(name)
            problem = _mount_problem(d["mount"])
            if problem:
                raise fail(f"device {name!r}: mount point {problem}")
            bs, bc, length = d["block_size"], d["block_count"], d["length"]
            if not (_is_int(bs) and _is_int(bc) and _is_int(length)) or bs < 1 or bc < 0 or length != bs * bc:
                raise fail(
                    f"device {name!r}: impossible size (block_size {bs!r} x block_count {bc!r} "
                    f"!= length {length!r})"
                )
            if d["tile"] is not None and not _is_int(d["tile"]):
                raise fail(f"device {name!r}: tile {d['tile']!r} is not an integer")
            geometry.add(name, d["tile"], length)
            if geometry.total > self.max_decompressed:
                raise self._error(
                    f"its devices would decompress to more than {self.max_decompressed} bytes "
                    f"(the max_decompressed cap): {geometry.total} bytes up to device {name!r}; "
                    f"refused (a decompression bomb, or pass a larger cap)"
                )
            if _unhex(d["digest"]) is None:
                raise fail(f"device {name!r}: digest is not {DIGEST_SIZE} hex bytes")
            raw_chunks = d["chunks"]
            if not isinstance(raw_chunks, list) or len(raw_chunks) > -(-length // cs):
                raise fail(f"device {name!r}: impossible chunk list")
            chunks = []
            prev = -1
            for ci, c in enumerate(raw_chunks):
                where = f"device {name!r} chunk {ci}"
                if not isinstance(c, list) or len(c) != 5 or not all(_is_int(x) for x in c[:4]):
                    raise fail(f"{where} is not a chunk entry")
                off, foff, slen, clen, check = c
                if off <= prev or off % cs or not 0 <= off < length:
                    raise fail(f"{where} has an impossible device offset {off}")
                if clen != min(cs, length - off):
                    raise fail(
                        f"{where} claims {clen} uncompressed bytes, but the slot at offset {off} "
                        f"of a {length}-byte device with {cs}-byte chunks has {min(cs, length - off)}; "
                        f"refused (a decompression bomb?)"
                    )
                if not 1 <= slen <= clen:
                    raise fail(f"{where} has an impossible stored length {slen}")
                if foff != pos:
                    raise fail(f"{where} is at file offset {foff}, not {pos} (chunks are back to back)")
                checksum = _unhex(check)
                if checksum is None:
                    raise fail(f"{where}: checksum is not {DIGEST_SIZE} hex bytes")
                chunks.append(Chunk(off, foff, slen, clen, checksum))
                pos += slen
                prev = off
            entries.append(DeviceEntry(name, d["tile"], d["mount"], bs, bc, length, d["digest"], tuple(chunks)))
        if pos != HEADER_SIZE + self.data_length:
            raise fail(f"the chunks cover {pos - HEADER_SIZE} bytes, but the data region has {self.data_length}")
        self.meta = meta
        self.devices = entries
        self._by_name = {e.name: e for e in entries}
        self.device_bytes = geometry.total

    # -- checking and reading

    def device(self, name: str) -> DeviceEntry:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"image {self.path} has no device {name!r}") from None

    def _decompressor(self):
        d = getattr(self._local, "dctx", None)
        if d is None:
            d = self._local.dctx = zstandard.ZstdDecompressor(max_window_size=self.chunk_size)
        return d

    def _check_batch(self, items: list, stored_views: list, dests, scratch) -> tuple[list, list, Any]:
        """Worker: read the stored bytes of ``items`` (one preadv: back to back in the
        file) and check each chunk; with ``dests``, leave its bytes there. Reading here
        rather than on the caller's thread lets two batches fill memory at once: page
        faults and copies out of the page cache are most of a restore's time."""
        self._preadv(list(stored_views), items[0][2].file_offset)
        H = self._H
        out = []
        for (entry, ci, ch), stored in zip(items, stored_views):
            check = H(stored)
            if check != ch.checksum:
                raise self._error(f"{_where(entry, ci, ch)} fails its checksum; the image is damaged")
            if ch.compressed:
                raw = _inflate_exact(
                    self._decompressor(), stored, ch.length,
                    lambda what: self._error(f"{_where(entry, ci, ch)} {what}"),
                )
                runs = _runs(raw)
                slot = _slot_digest(H, raw, runs)
                if dests is not None:
                    dest = dests[entry.name]
                    src = np.frombuffer(raw, np.uint8)
                    for off, length in runs:  # the rest is zero already
                        dest[ch.offset + off : ch.offset + off + length] = src[off : off + length]
            else:  # stored raw: already in place (read straight into dests)
                slot = _slot_digest(H, stored, _runs(stored), whole=check)
            out.append((slot, check))
        return items, out, scratch

    def _scan(self, entries: list[DeviceEntry], dests, progress, checked=None) -> list[bytes]:
        """Check every chunk and device digest of ``entries`` (consecutive, in file order);
        with ``dests`` (name -> zeroed array) fill them in. Returns the chunk checksums."""
        cs = self.chunk_size
        algo = self.digest_algorithm
        zero_slot = _zero_slot(algo)
        total = sum(e.length for e in entries)
        done = reported = 0
        checks: list[bytes] = []
        slots: dict[str, list] = {}
        remaining: dict[str, int] = {}

        def finish(entry: DeviceEntry):
            got = _device_root(algo, cs, entry.length, slots.pop(entry.name))
            if got.hex() != entry.digest:
                raise self._error(
                    f"device {entry.name!r}: its bytes do not match the manifest's digest; "
                    f"the image is damaged"
                )
            if checked is not None:
                checked(entry, dests[entry.name])

        def report(force=False):
            nonlocal reported
            if progress is not None and (force or done - reported >= _PROGRESS_STEP):
                reported = done
                progress(done, total)

        def handle(result):
            nonlocal done
            items, out, scratch = result
            spare.append(scratch)
            for (entry, ci, ch), (slot, check) in zip(items, out):
                slots[entry.name][ch.offset // cs] = slot
                checks.append(check)
                done += ch.length
                remaining[entry.name] -= 1
                if not remaining[entry.name]:
                    finish(entry)
                    done += entry.length - sum(c.length for c in entry.chunks)  # its zeros
            report()

        spare: list = []  # scratch buffers to reuse: fresh memory costs a page fault per page

        def submit(items):
            # one preadv per batch: raw chunks land in their destination, the rest in scratch
            need = sum(ch.stored_length for _, _, ch in items if dests is None or ch.compressed)
            scratch = spare.pop() if spare else None
            if scratch is None or len(scratch) < need:
                scratch = np.empty(max(need, _BATCH_BYTES), np.uint8)
            sv = memoryview(scratch)
            views = []
            at = 0
            for entry, _, ch in items:
                if dests is not None and not ch.compressed:
                    views.append(memoryview(dests[entry.name])[ch.offset : ch.offset + ch.length])
                else:
                    views.append(sv[at : at + ch.stored_length])
                    at += ch.stored_length
            # mostly-zero slots squeeze to almost nothing: little to hash, done inline
            light = sum(ch.stored_length for _, _, ch in items) * _LIGHT < sum(ch.length for _, _, ch in items)
            workers.submit(self._check_batch, items, views, dests, scratch, inline=light)
            while workers.full():
                handle(workers.next_result())

        workers = _Workers(self._threads)
        try:
            items: list = []
            batch_bytes = 0
            for entry in entries:
                slots[entry.name] = [zero_slot] * -(-entry.length // cs)
                remaining[entry.name] = len(entry.chunks)
                if not entry.chunks:  # nothing of it is stored: all zeros
                    finish(entry)
                    done += entry.length
                    continue
                for ci, ch in enumerate(entry.chunks):
                    items.append((entry, ci, ch))
                    batch_bytes += ch.length
                    if batch_bytes >= _BATCH_BYTES or len(items) >= _BATCH_ITEMS:
                        submit(items)
                        items, batch_bytes = [], 0
            if items:
                submit(items)
            while workers:
                handle(workers.next_result())
        finally:
            workers.close()
        report(force=True)
        return checks

    def _check_root(self, checks: list[bytes]) -> None:
        if self._H(_ROOT_DOMAIN + self._manifest_check + b"".join(checks)) != self._root:
            raise self._error("the image digest does not match its contents; the image is damaged")

    def _check_cap(self, n: int) -> None:
        if n > self.max_decompressed:
            raise self._error(f"reading {n} bytes would exceed the max_decompressed cap of {self.max_decompressed}")

    def verify(self, progress: Callable[[int, int | None], None] | None = None) -> None:
        """Check every chunk, every device digest and the image digest (ImageError if not)."""
        self._check_root(self._scan(self.devices, None, progress))
        self.verified = True

    def read_all(self, progress: Callable[[int, int | None], None] | None = None,
                 checked: Callable[[DeviceEntry, np.ndarray], None] | None = None) -> dict[str, np.ndarray]:
        """Every device's bytes, returned only once the *whole* image has checked out.

        ``checked(entry, bytes)`` is called as each device's digest checks out, while
        later chunks are still being read and hashed (a restore mounts it in scratch
        memory then); an exception from it stops the read."""
        self._check_cap(self.device_bytes)
        space = _lazy_zeros(self.device_bytes)
        out = {}
        at = 0
        for e in self.devices:
            out[e.name] = space[at : at + e.length]
            at += e.length
        self._check_root(self._scan(self.devices, out, progress, checked))
        self.verified = True
        return out

    def read_device(self, name: str, progress: Callable[[int, int | None], None] | None = None) -> np.ndarray:
        """One device's bytes, checked: its chunks and its digest (the manifest was checked
        as the image opened). Damage elsewhere in the image does not stop it: what is
        intact can be read from a damaged image (a restore reads it whole, and only if
        the whole is good)."""
        entry = self.device(name)
        self._check_cap(entry.length)
        dest = _lazy_zeros(entry.length)
        self._scan([entry], {entry.name: dest}, progress)
        return dest

    def iter_devices(self, progress: Callable[[int, int | None], None] | None = None
                     ) -> Iterator[tuple[DeviceEntry, np.ndarray]]:
        """``(entry, bytes)`` one device at a time, after a whole-image verify."""
        if not self.verified:
            self.verify()
        done = 0
        for entry in self.devices:
            data = self.read_device(entry.name)
            done += entry.length
            if progress is not None:
                progress(done, self.device_bytes)
            yield entry, data

    def info(self) -> dict:
        """A JSON-able summary (for ``ipuos image info``)."""
        return {
            "path": self.path,
            "format_version": self.version,
            "digest_algorithm": self.digest_algorithm,
            "chunk_size": self.chunk_size,
            "file_size": self.file_size,
            "image_digest": self.image_digest,
            "verified": self.verified,
            "meta": self.meta,
            "device_count": len(self.devices),
            "device_bytes": self.device_bytes,
            "stored_bytes": self.data_length,
            "manifest_bytes": self.manifest_length,
            "devices": [e.summary() for e in self.devices],
        }


def _where(entry: DeviceEntry, ci: int, ch: Chunk) -> str:
    return (
        f"chunk {ci} of device {entry.name!r} (device bytes {ch.offset}..{ch.offset + ch.length}, "
        f"file offset {ch.file_offset})"
    )


def _unhex(s) -> bytes | None:
    if not isinstance(s, str) or len(s) != 2 * DIGEST_SIZE:
        return None
    try:
        return bytes.fromhex(s)
    except ValueError:
        return None


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _inflate_exact(dctx, stored, length: int, error: Callable[[str], ImageError]) -> bytes:
    """Decompress one zstd frame that must hold exactly ``length`` bytes, never more."""
    try:
        declared = zstandard.frame_content_size(stored)
    except zstandard.ZstdError as e:
        raise error(f"is not a valid zstd frame ({e}); the image is damaged") from None
    if declared != length:
        if declared < 0:
            raise error(
                "does not declare its uncompressed size in its zstd frame; refused (not "
                "written by ipuos, or a decompression bomb)"
            )
        raise error(
            f"declares {declared} uncompressed bytes in its zstd frame, but the manifest says "
            f"{length}; refused (damaged, or a decompression bomb)"
        )
    try:
        raw = dctx.decompress(stored, max_output_size=length)
    except zstandard.ZstdError as e:
        raise error(f"cannot be decompressed ({e}); the image is damaged") from None
    if len(raw) != length:
        raise error(f"decompressed to {plural(len(raw), 'byte')} instead of {length}; the image is damaged")
    return raw
