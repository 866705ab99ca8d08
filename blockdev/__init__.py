"""Block devices and littlefs: the storage layer of ipuos.

A :class:`BlockDevice` is blocks of bytes with read/prog/erase/sync (the protocol littlefs
needs). :class:`MemoryDevice` keeps them in a byte buffer (a tile's SRAM region),
:class:`FileDevice` in a host image file, :class:`StripedDevice` round-robin in other
tiles' SRAM, reached through the exchange. Any device can carry a :class:`FaultPlan` that
cuts its power, tears a write, stops answering, or lies about writes, so the layers above
can be tested against the failures real storage has.

:class:`Filesystem` runs littlefs on a device: explicit format/mount/unmount, POSIX-like
calls, every error an ``OSError`` with a proper errno. ``ipuos.blockdev.testing`` holds the
power-loss sweep used to check a device and filesystem together.

This layer imports only the standard library, numpy, littlefs, the scheduler (for the
striped device's exchange traffic) and the machine core.
"""

from ._faults import DeviceUnresponsive, FaultPlan, PowerLost
from ._file import FileDevice
from ._littlefs import (
    MTIME_ATTRIBUTE,
    MTIME_MAX_NS,
    MTIME_MIN_NS,
    CorruptFilesystemError,
    File,
    FileInfo,
    Filesystem,
    FilesystemBusyError,
    FsInfo,
    WritesLostError,
    check_mounts,
    checked_seek,
    read_unit,
    translate_error,
    wrong_mode_error,
)
from ._memory import MemoryDevice
from ._protocol import BlockDevice
from ._striped import StripedDevice

__all__ = [
    "BlockDevice",
    "MemoryDevice",
    "FileDevice",
    "StripedDevice",
    "FaultPlan",
    "PowerLost",
    "DeviceUnresponsive",
    "Filesystem",
    "File",
    "FileInfo",
    "FsInfo",
    "FilesystemBusyError",
    "CorruptFilesystemError",
    "WritesLostError",
    "MTIME_ATTRIBUTE",
    "MTIME_MIN_NS",
    "MTIME_MAX_NS",
    "translate_error",
    "check_mounts",
    "checked_seek",
    "read_unit",
    "wrong_mode_error",
]
