"""A littlefs directory's custom attributes, read from its metadata logs in one pass.

Why this exists: littlefs finds a name by fetching its directory's metadata pairs one
after another from the first, and ``lfs_dir_read`` reports no custom attributes, so
reading every entry's mtime (an attribute) walks the directory once per entry. That is
quadratic, and on the chip disk a walk longer than the cache misses on every pair: a
directory of 1,472 small files spans about 75 pairs, and listing it with mtimes took
14,182 exchanges. Reading each pair's log once here takes a few dozen.

The reader follows littlefs' on-disk format (disk version 2.1): a pair's newer block by
revision, its log replayed commit by commit, a commit counted only when its CRC checks,
entries created and deleted by splices, the chain followed through hard tails. It is an
accelerator, never the authority: :func:`directory_attribute` returns None unless the
entries it found are exactly those ``lfs_dir_read`` reported (names, types and sizes, in
order), and the caller then asks littlefs for each entry. A pending move (which littlefs
hides from listings through its global state) or anything this reader does not expect
shows up as such a difference.
"""

from __future__ import annotations

import zlib
from typing import Callable, Sequence

__all__ = ["directory_attribute"]

_MASK = 0xFFFFFFFF
_ROOT = (0, 1)

# tag types (the 11-bit type field; littlefs' LFS_TYPE_*)
_REG, _DIR = 0x001, 0x002
_DIRSTRUCT, _INLINESTRUCT, _CTZSTRUCT = 0x200, 0x201, 0x202
_CREATE, _DELETE = 0x401, 0x4FF
_NAME, _STRUCT, _USERATTR, _SPLICE, _CRC, _TAIL = 0x000, 0x200, 0x300, 0x400, 0x500, 0x600
_NO_ID = 0x3FF
_DELETED_SIZE = 0x3FF

Read = Callable[[int, int, int], bytes]


class _Unexpected(Exception):
    """The logs do not read as this reader expects (the caller asks littlefs instead)."""


class _Entry:
    __slots__ = ("type", "name", "size", "pair", "attrs")

    def __init__(self):
        self.type = -1  # no name tag yet
        self.name = b""
        self.size = 0
        self.pair: tuple[int, int] | None = None
        self.attrs: dict[int, bytes] = {}


def directory_attribute(read: Read, block_count: int, block_size: int, window: int, path: str,
                        listing: Sequence, kind: int) -> list[bytes | None] | None:
    """Attribute ``kind`` of each entry in ``listing`` (what ``lfs_dir_read`` reported for
    the directory ``path``, each with ``name``, ``is_dir`` and ``size``), or None when the
    logs do not show exactly those entries.

    ``read(block, offset, size)`` reads the device. ``window`` is how much of a block the
    logs use (littlefs' metadata_max, or the block size): it is read first, and the rest
    of the block only for a log that goes on past it (one written with a bigger
    metadata_max: littlefs reads a log to the block's end).
    """
    geometry = (read, block_count, block_size, window)
    try:
        entries = _chain(geometry, _directory_pair(geometry, path))
    except _Unexpected:
        return None
    named = [entry for entry in entries if entry.type in (_REG, _DIR)]
    if len(named) != len(listing):
        return None
    for entry, info in zip(named, listing):
        if (entry.name != info.name.encode("utf-8") or (entry.type == _DIR) != info.is_dir
                or (not info.is_dir and entry.size != info.size)):
            return None
    return [entry.attrs.get(kind) for entry in named]


def _directory_pair(geometry, path: str) -> tuple[int, int]:
    pair = _ROOT
    for name in filter(None, path.split("/")):
        wanted = name.encode("utf-8")
        for entry in _chain(geometry, pair):
            if entry.name == wanted and entry.type == _DIR and entry.pair is not None:
                pair = entry.pair
                break
        else:
            raise _Unexpected(f"no directory {name!r}")
    return pair


def _chain(geometry, pair: tuple[int, int]) -> list[_Entry]:
    """The entries of the directory whose first pair is ``pair``, in littlefs' order."""
    block_count = geometry[1]
    entries: list[_Entry] = []
    seen = set()
    while True:
        if pair in seen or not (0 <= pair[0] < block_count and 0 <= pair[1] < block_count):
            raise _Unexpected(f"bad or looping tail {pair}")
        seen.add(pair)
        found, tail, split = _fetch(geometry, pair)
        entries += found
        if not split:
            return entries
        pair = tail


def _fetch(geometry, pair: tuple[int, int]):
    """``(entries, tail, split)`` of a metadata pair: its newer block's log, or the other
    block's when the newer holds no valid commit (as littlefs' fetch decides)."""
    read, _, block_size, window = geometry
    revisions = [int.from_bytes(read(block, 0, 4), "little") for block in pair]
    newer = 1 if 0 < (revisions[1] - revisions[0]) & _MASK < 0x80000000 else 0
    for block in (pair[newer], pair[1 - newer]):
        state = _replay(read(block, 0, window), whole=window >= block_size)
        if state is _RAN_OUT:  # a log longer than the window: littlefs reads on
            state = _replay(read(block, 0, block_size), whole=True)
        if state is not None:
            return state
    raise _Unexpected(f"no valid commit in pair {pair}")


#: what :func:`_replay` says of a log that goes on past the bytes it was given
_RAN_OUT = object()


def _replay(log: bytes, whole: bool):
    """The state after the last commit of ``log`` whose CRC checks, None if none does.
    ``whole``: ``log`` is the whole block, whose end ends the log, as in littlefs; else
    ``_RAN_OUT`` if the log may go on past ``log``'s end (a tag reaches it)."""
    entries: list[_Entry] = []
    tail, split = None, False
    committed = False
    pending: list[tuple[int, int, int, bytes]] = []
    start = 0  # where the CRC of the commit being read begins (the revision, at first)
    off = 4
    ptag = _MASK
    end = len(log)
    while True:
        if off + 4 > end:
            if whole:
                break
            return _RAN_OUT
        tag = int.from_bytes(log[off : off + 4], "big") ^ ptag
        if tag & 0x80000000:
            break  # not programmed yet: the log ends
        size = tag & 0x3FF
        dsize = 4 + (0 if size == _DELETED_SIZE else size)
        if off + dsize > end:
            if whole:
                break
            return _RAN_OUT
        ptag = tag
        type3 = (tag >> 20) & 0x7FF
        if type3 & 0x780 == _CRC:  # a commit's CRC (not the erase CRC, 0x5ff)
            if zlib.crc32(log[start : off + 4]) ^ _MASK != int.from_bytes(log[off + 4 : off + 8], "little"):
                break
            ptag ^= (type3 & 1) << 31  # the next commit's valid bit
            for item in pending:
                tail, split = _apply(entries, item, tail, split)
            pending.clear()
            committed = True
            off += dsize
            start = off
            continue
        pending.append((type3, (tag >> 10) & 0x3FF, size, log[off + 4 : off + dsize]))
        off += dsize
    if not committed:
        return None
    if split and tail is None:
        raise _Unexpected("a split pair without a tail")
    return entries, tail, split


def _apply(entries: list[_Entry], item, tail, split):
    type3, tag_id, size, data = item
    family = type3 & 0x700
    if family == _SPLICE:
        if type3 == _CREATE and tag_id <= len(entries):
            entries.insert(tag_id, _Entry())
        elif type3 == _DELETE and tag_id < len(entries):
            del entries[tag_id]
        else:
            raise _Unexpected(f"splice {type3:#x} of id {tag_id} among {len(entries)}")
    elif family == _TAIL:
        if len(data) != 8:
            raise _Unexpected("a tail that is not a pair")
        tail = (int.from_bytes(data[:4], "little"), int.from_bytes(data[4:], "little"))
        split = bool(type3 & 1)
    elif family in (_NAME, _STRUCT, _USERATTR):
        if tag_id == _NO_ID:
            raise _Unexpected(f"tag {type3:#x} of no entry")
        while len(entries) <= tag_id:
            entries.append(_Entry())
        entry = entries[tag_id]
        if family == _NAME:
            entry.type, entry.name = type3, data
        elif family == _USERATTR:
            if size == _DELETED_SIZE:
                entry.attrs.pop(type3 & 0xFF, None)
            else:
                entry.attrs[type3 & 0xFF] = data
        elif type3 == _INLINESTRUCT:
            entry.size, entry.pair = (0 if size == _DELETED_SIZE else size), None
        elif type3 == _CTZSTRUCT and len(data) == 8:
            entry.size, entry.pair = int.from_bytes(data[4:], "little"), None
        elif type3 == _DIRSTRUCT and len(data) == 8:
            entry.size = 0
            entry.pair = (int.from_bytes(data[:4], "little"), int.from_bytes(data[4:], "little"))
        else:
            raise _Unexpected(f"struct {type3:#x} of {size} bytes")
    # globals (a pending move) and erase CRCs change no entry
    return tail, split
