"""Temp files and directories that tell whether their writer still lives.

A writer killed outright (SIGKILL, a daemon that died mid-backup) leaves its temp file
behind, where nothing would ever remove it, and a staging directory inside an extract's
destination would keep the next extract out ("not empty"). Each is made under a prefix
its final name gives, and held ``flock``'d while it is written: the next writer of that
name removes what nobody holds, and never a live writer's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import stat
import tempfile

__all__ = ["locked_temp", "remove_dead_temps"]


def locked_temp(directory: str, prefix: str, *, is_dir: bool = False) -> tuple[int, str]:
    """A new temp file (or directory) ``PREFIX*.tmp`` in ``directory``: (a descriptor of
    it, held locked until closed, and its path). Another writer may have taken it for a
    dead one's in the instant before it was locked: then it is gone, and another is made."""
    while True:
        if is_dir:
            tmp = tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=directory)
            try:
                fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
        else:
            fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # (another writer holds it only while it looks)
            if os.fstat(fd).st_ino == os.stat(tmp).st_ino:
                return fd, tmp
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp) if is_dir else os.unlink(tmp)
            raise
        os.close(fd)


def remove_dead_temps(directory: str, prefix: str) -> None:
    """Remove what earlier writers of the same name left when they were killed: each
    ``PREFIX*.tmp`` file or directory of this user that nobody holds locked."""
    pattern = re.compile(re.escape(prefix) + r"[A-Za-z0-9_]{8}\.tmp\Z")
    try:
        names = [name for name in os.listdir(directory) if pattern.match(name)]
    except OSError:
        return
    for name in names:
        leftover = os.path.join(directory, name)
        try:
            fd = os.open(leftover, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            is_dir = stat.S_ISDIR(info.st_mode)
            if not (is_dir or stat.S_ISREG(info.st_mode)) or info.st_uid != os.geteuid():
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.stat(leftover, follow_symlinks=False).st_ino == info.st_ino:
                # (while locked: its writer, if any, is dead)
                shutil.rmtree(leftover) if is_dir else os.unlink(leftover)
        except OSError:
            continue  # locked by a live writer, or gone
        finally:
            os.close(fd)
