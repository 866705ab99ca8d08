"""Turning objects into exchange bytes and back.

marshal is tried first: it is about twice as fast as pickle for the plain data tile
programs exchange (numbers, strings, bytes, lists, dicts) and cannot run code while
loading. pickle is the fallback for everything else a program might send. One tag byte
says which was used.
"""

from __future__ import annotations

import marshal
import pickle

_MARSHAL = 0x4D  # "M"
#: for callers that inline encode()'s fast path (the collectives)
marshal_dumps = marshal.dumps
_PICKLE = 0x50  # "P"

IMMUTABLE_SCALARS = frozenset({int, float, complex, str, bytes, bool, type(None), range})


def encode(obj) -> bytes:
    """Serialise ``obj`` for the exchange; TypeError naming the type if it cannot be."""
    try:
        return b"M" + marshal.dumps(obj)
    except ValueError:
        pass
    try:
        return b"P" + pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(
            f"cannot send an object of type {type(obj).__name__} through the exchange: {exc}"
        ) from None


def decode(buf) -> object:
    """Inverse of :func:`encode`; ``buf`` is any bytes-like object (a view of SRAM)."""
    tag = buf[0]
    if tag == _MARSHAL:
        return marshal.loads(buf[1:])
    if tag == _PICKLE:
        return pickle.loads(buf[1:])
    raise ValueError(f"corrupt exchange payload (tag byte {tag:#x})")


def is_immutable(obj) -> bool:
    """True if ``obj`` can be shared between tiles without one tile's change showing in another.

    Decoded results that every tile receives identically (a broadcast, an alltoall) are
    decoded once and shared when this holds; otherwise each tile decodes its own copy.
    """
    kind = type(obj)
    if kind in IMMUTABLE_SCALARS:
        return True
    if kind is tuple or kind is frozenset:
        return all(is_immutable(item) for item in obj)
    return False
