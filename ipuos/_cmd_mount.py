"""Daemon command handlers for host mounts: ``mount``, ``umount``, ``mounts``.

The mounts themselves live in :class:`ipuos._mount.MountManager` (``host.mounts``); these
handlers only check arguments and translate its errors. A foreground mount is one long
call: it emits ``mounted``, then waits until the client cancels (Ctrl-C, SIGTERM, or its
connection drops), which unmounts, or until the mount ends some other way (``ipuos
umount``, ``halt``, which detaches a busy mount rather than wait for its users), and
returns why it ended.
"""

from __future__ import annotations

from ._commands import Arg, Call, CommandError, command
from ._mount import MountError

#: how long a mount or unmount may take (a foreground mount takes as long as it lives)
MOUNT_TIMEOUT = 30.0


def _fail(exc: MountError):
    raise CommandError(exc.code, exc.message) from None


@command(
    "mount",
    Arg("mountpoint", str),
    Arg("read_only", bool, False),
    Arg("tiles", str, "all"),
    Arg("foreground", bool, False),
    timeout=None,
)
def _mount(call: Call):
    """Mount the machine's files at an absolute path on the host (see ``ipuos._mount``)."""
    args = call.args
    manager = call.host.mounts
    try:
        active = manager.mount(args["mountpoint"], readonly=args["read_only"], tiles=args["tiles"],
                               foreground=args["foreground"],
                               # (the command that asked for a mount in the background has ended)
                               client_pid=call.peer_pid if args["foreground"] else None)
    except MountError as exc:
        _fail(exc)
    info = active.describe()
    if not args["foreground"]:
        return info
    call.emit({"event": "mounted", **info})

    def stop() -> None:
        try:
            state = manager.unmount(active.mountpoint, lazy=True, reason="the foreground command ended")
        except MountError:
            return  # already gone
        if not state["loop_ended"]:  # files still open: say why the command goes on
            call.emit({"event": "detached", "open_files": active.operations.open_files()})

    call.on_cancel(stop)
    active.released.wait()
    return {**info, "reason": active.reason}


@command("umount", Arg("mountpoint", str), Arg("lazy", bool, False), timeout=MOUNT_TIMEOUT)
def _umount(call: Call):
    """Unmount one of the machine's mounts (``busy`` if in use, unless ``lazy``)."""
    try:
        return call.host.mounts.unmount(call.args["mountpoint"], lazy=call.args["lazy"],
                                        reason="unmounted with `ipuos umount`")
    except MountError as exc:
        _fail(exc)


@command("mounts")
def _mounts(call: Call):
    """The machine's host mounts."""
    return {"mounts": [active.describe() for active in call.host.mounts.mounts()]}
