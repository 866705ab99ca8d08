"""Reading a host file that may be endless, no further than a limit.

A user may name ``/dev/zero``, a FIFO or a growing log where a program's data is wanted:
``file.read()`` would then take memory until the host runs out. What goes to the machine
is capped anyway (one request carries at most so much), so reading stops one byte past
the cap: enough to tell the caller there is more than it can send, and say so.
"""

from __future__ import annotations

__all__ = ["read_at_most"]

#: bytes asked of the file per read: reading ``limit + 1`` at once would take that much
#: memory up front, however little the file holds
_CHUNK = 1 << 20


def read_at_most(file, limit: int) -> bytes:
    """The bytes of ``file`` (binary), stopping after ``limit + 1`` of them: a result
    longer than ``limit`` means the file holds more than ``limit`` bytes."""
    chunks, size = [], 0
    while size <= limit:
        chunk = file.read(min(_CHUNK, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
