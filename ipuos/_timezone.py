"""The time zone a client's local times are in, for what the daemon formats for it.

The shell runs on tile 0 inside the daemon, and its ``ls -l`` and ``stat`` wrote times in
the daemon's zone, while ``ipuos image ls`` and the mount (the user's own ``ls``) use the
user's: the same file showed 9 hours apart under ``TZ=Asia/Tokyo`` once the daemon had been
started elsewhere (cron, a script, CI). The client sends its ``TZ``, and the daemon reads
it as the C library does: unset, the host's ``/etc/localtime``; empty, UTC; a leading
``:`` dropped; a path, that file; else a zone name, or a POSIX rule (``JST-9``,
``CET-1CEST,M3.5.0,M10.5.0/3``), summer time and all: zoneinfo follows such a rule as
the footer of a zone file, so the rule is given one, a zone file with nothing else.
"""

from __future__ import annotations

import datetime
import io
import struct
import zoneinfo

__all__ = ["client_zone"]

_LOCALTIME = "/etc/localtime"


def client_zone(tz: str | None) -> datetime.tzinfo:
    """The zone a process with ``TZ`` = ``tz`` (None: unset) shows local times in."""
    if tz is None:
        return _from_file(_LOCALTIME) or datetime.timezone.utc
    tz = tz[1:] if tz.startswith(":") else tz
    if not tz:
        return datetime.timezone.utc
    if tz.startswith("/"):
        return _from_file(tz) or datetime.timezone.utc
    try:
        return zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
        pass
    return _posix_rule(tz) or datetime.timezone.utc  # (UTC: what the C library takes a TZ it cannot read for)


def _posix_rule(rule: str) -> datetime.tzinfo | None:
    """The zone of a POSIX TZ rule, or None if it is none: a version 2 zone file with no
    transitions and one UTC type, whose footer (the rule for all times after the last
    transition: here, all times) is ``rule``."""
    def block() -> bytes:  # (the version 1 and version 2 data: one type, "UTC", no transitions)
        return b"TZif2" + bytes(15) + struct.pack(">6l", 0, 0, 0, 0, 1, 4) + struct.pack(">lbB", 0, 0, 0) + b"UTC\0"
    try:
        data = block() + block() + b"\n" + rule.encode("ascii") + b"\n"
        return zoneinfo.ZoneInfo.from_file(io.BytesIO(data), key=rule)
    except (ValueError, UnicodeEncodeError):
        return None


def _from_file(path: str) -> datetime.tzinfo | None:
    try:
        with open(path, "rb") as f:
            return zoneinfo.ZoneInfo.from_file(f, key=path)
    except (OSError, ValueError):
        return None
