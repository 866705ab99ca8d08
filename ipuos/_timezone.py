"""The time zone a client's local times are in, for what the daemon formats for it.

The shell runs on tile 0 inside the daemon, and its ``ls -l`` and ``stat`` wrote times in
the daemon's zone, while ``ipuos image ls`` and the mount (the user's own ``ls``) use the
user's: the same file showed 9 hours apart under ``TZ=Asia/Tokyo`` once the daemon had been
started elsewhere (cron, a script, CI). The client sends its ``TZ``, and the daemon reads
it as the C library does: unset, the host's ``/etc/localtime``; empty, UTC; a leading
``:`` dropped; a path, that file; else a zone name, or a POSIX rule, of which only the
standard offset is kept (``JST-9``; a rule's summer time is not followed).
"""

from __future__ import annotations

import datetime
import re
import zoneinfo

__all__ = ["client_zone"]

_LOCALTIME = "/etc/localtime"
#: a POSIX TZ rule's standard part: a name (3+ letters, or <...>) and hours[:minutes] west of UTC
_POSIX_STD = re.compile(r"(?:[A-Za-z]{3,}|<[^>]+>)([+-]?)(\d{1,2})(?::(\d{1,2}))?")


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
    rule = _POSIX_STD.match(tz)
    if rule is None:
        return datetime.timezone.utc  # (what the C library takes a TZ it cannot read for)
    sign, hours, minutes = rule.groups()
    west = datetime.timedelta(hours=int(hours), minutes=int(minutes or 0))
    return datetime.timezone(west if sign == "-" else -west)


def _from_file(path: str) -> datetime.tzinfo | None:
    try:
        with open(path, "rb") as f:
            return zoneinfo.ZoneInfo.from_file(f, key=path)
    except (OSError, ValueError):
        return None
