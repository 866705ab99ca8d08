"""Whether the thread behind a FUSE request is in an open that creates a missing file.

The kernel keeps O_CREAT back from FUSE: it sends a create only when its lookup finds no
file, and the open of a file it found carries no O_CREAT. When the file goes between that
lookup and the open (another process unlinks it), the open is answered ESTALE and the
kernel looks the name up again and retries, once. Should a third process have made the
file again meanwhile, the truth ("it is there") lets the retry meet the next unlink as
well, and the caller gets ESTALE, where a local disk never fails an O_CREAT open so. Told
the name is gone instead, the kernel sends a create, which opens the file if it is there:
exactly what O_CREAT asks. That answer is only right for a caller known to be making such
an open, which this module tells (see ``._retries``).

``/proc/TID/syscall`` names the call a thread is blocked in, with its arguments, and a
thread waiting on a FUSE request is blocked in its call. Reading it needs the right to
trace the thread: the same user, unless the kernel's Yama module forbids it (its default
on Ubuntu, ptrace_scope 1, allows only one's own descendants, which a user's processes
are not of the machine's daemon; root, or CAP_SYS_PTRACE, may always). When it cannot be
read, nothing is known, and the mount goes by timing alone. It is not asked at all where
its answer could mislead: in a pid namespace whose ``/proc`` is another's, or on kernels
before 5.7, where reading it waits on a lock an ``exec`` holds while it opens its program
(through the mount, that exec would wait on this read).
"""

from __future__ import annotations

import os
import platform

__all__ = ["creating_open"]

#: system call number -> which of its arguments (from 0) holds the open flags (None:
#: ``creat``, whose flags are O_CREAT | O_WRONLY | O_TRUNC). ``openat2`` keeps its flags
#: in the caller's memory and is left out: a caller in it is taken for one not creating.
_OPEN_CALLS = {
    "x86_64": {2: 1, 85: None, 257: 2},  # open, creat, openat
    "aarch64": {56: 2},  # openat (there is no open or creat)
}.get(platform.machine(), {})


def _release() -> tuple[int, ...]:
    numbers = []
    for part in platform.release().split("-")[0].split(".")[:2]:
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)


def _proc_is_ours() -> bool:
    """Does ``/proc`` show this process's pid namespace (so that ids name its threads)?"""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False


#: whether the flags may be read here at all (see the module doc)
_READABLE = bool(_OPEN_CALLS) and _release() >= (5, 7) and _proc_is_ours()
#: a task whose stack and code both lie below 4 GiB runs 32-bit code, whose calls are
#: numbered otherwise (its 85 is readlink): not known
_LOW = 1 << 32


def creating_open(tid: int) -> bool | None:
    """Is thread ``tid`` blocked in an open(2) with O_CREAT and without O_EXCL? None when
    that cannot be told (no such thread, no right to look, an unknown architecture)."""
    if not _READABLE or tid <= 0:
        return None
    try:
        fd = os.open(f"/proc/{tid}/syscall", os.O_RDONLY)  # (EACCES: another user's)
    except OSError:
        return None
    try:
        fields = os.read(fd, 256).split()
    except OSError:  # (EPERM or EACCES: no right to trace it, checked as it is read)
        return None
    finally:
        os.close(fd)
    # "NR arg1 ... arg6 sp pc" while blocked in a call; "-1 sp pc" or "running" otherwise
    if len(fields) < 9 or not fields[0].isdigit():
        return False
    if int(fields[7], 16) < _LOW and int(fields[8], 16) < _LOW:
        return None
    call = int(fields[0])
    if call not in _OPEN_CALLS:
        return False
    where = _OPEN_CALLS[call]
    if where is None:
        return True
    flags = int(fields[1 + where], 16)  # (fields[0] is the call's number)
    # (O_PATH opens nothing: the kernel drops O_CREAT from it)
    return bool(flags & os.O_CREAT) and not flags & (os.O_EXCL | os.O_PATH)
