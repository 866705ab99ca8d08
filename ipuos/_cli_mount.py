"""CLI commands for host mounts: ``ipuos mount`` and ``ipuos umount``.

``ipuos mount MNT`` asks the daemon to mount (it serves the mount, so the command returns
at once); ``--foreground`` keeps the command attached until Ctrl-C or SIGTERM, which
unmount. ``ipuos mount`` alone lists the machine's mounts.

``ipuos umount MNT`` reads the host's mount table to learn which machine serves ``MNT``
(its source is ``ipuos:NAME``), so it needs no ``--name``. If the runtime dir knows no such
machine serving it, the mount is removed here, without any daemon, only if it is dead
(nobody answers it); one that answers is another runtime dir's, and is left to it (or
detached with ``--lazy``).

Every ``ipuos`` command imports this module, so ``_mount`` (and with it the VFS and
FUSE) is imported by these two commands only.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import signal

import click

from ._cli import (_Errors, _fail, _paths, attach_machine, ipus_option, json_option, main, name_option, preset_option,
                   not_utf8_path)
from ._client import Client, DaemonError, MachineNotRunning, interrupt_call
from ._plural import plural
from ._presets import largest_machine_tiles
from ._rundir import machine_paths
from ._runresult import EXIT_INTERRUPTED
from ._tilespec import parse_tiles

#: seconds a background mount or an unmount may take in the daemon
MOUNT_SECONDS = 30.0


def _not_empty(ctx, param, value):
    """Refuse an empty path: the OS would take it for the current directory (as a script's
    ``ipuos mount "$DIR"`` gives it when DIR is unset)."""
    if value == "":
        raise click.BadParameter("the path is empty", ctx=ctx, param=param)
    return value


@main.command()
# (not click.Path: it stats the path, which waits forever on a mount whose server is stopped)
@click.argument("mountpoint", required=False, callback=_not_empty)
@click.option("--read-only", is_flag=True, help="refuse every change (EROFS)")
@click.option("--tiles", "tile_spec", default="all", show_default=True,
              help="tiles to show under /tiles, e.g. 0-15")
@click.option("--foreground", is_flag=True,
              help="stay attached; Ctrl-C or SIGTERM unmounts (lazily if a file is still open)")
@preset_option(None)
@ipus_option(None)
@name_option
@json_option
def mount(mountpoint, read_only, tile_spec, foreground, preset, ipus, name, as_json) -> None:
    """Mount the machine's files at MOUNTPOINT: /tiles/<id>/... and /chip/...

    Served by the machine's daemon until `ipuos umount MOUNTPOINT` or `ipuos halt`;
    mounting starts the machine if none runs. Without MOUNTPOINT, list the running
    machine's mounts.
    """
    from ._mount import MountError, already_mounted, canonical_mountpoint, mount_at, refuse_over_runtime_dir

    paths = _paths(name)
    if mountpoint is None:
        _list_mounts(paths, as_json)
        return
    where = canonical_mountpoint(mountpoint)
    # checked before a machine is started for it
    problem = not_utf8_path(where, "mount point", "rename the directory")
    if problem:
        raise click.BadParameter(problem, param_hint="MOUNTPOINT")
    try:
        refuse_over_runtime_dir(where, paths.dir)
    except MountError as exc:
        raise click.BadParameter(exc.message, param_hint="MOUNTPOINT") from None
    entry = mount_at(where)
    # (the mount table first: stat of a mount point asks its server, and a dead one
    # fails it, a stopped one never answers)
    if entry is None and not os.path.isdir(where):
        raise click.BadParameter(f"{mountpoint!r} is not a directory; create it first",
                                 param_hint="MOUNTPOINT")
    if entry is not None:
        _fail(already_mounted(where, entry))
    attach_machine(name, preset, ipus, tile_spec)
    args = {"mountpoint": where, "read_only": read_only,
            "tiles": tile_spec, "foreground": foreground}
    with _Errors(), Client(paths) as client:
        try:
            if foreground:
                reply = _mount_foreground(client, args, name)
            else:
                reply = client.call("mount", args, timeout=MOUNT_SECONDS)
        except DaemonError as exc:
            if exc.code == "bad_tiles":
                raise click.BadParameter(exc.message, param_hint="--tiles") from None
            raise
    if as_json:
        click.echo(json.dumps({"name": paths.name, **_mount_json(reply)}, indent=1))
    elif foreground:
        click.echo(f"unmounted {reply['mountpoint']} ({reply.get('reason') or 'unmounted'})")
    else:
        mode = "read-only" if reply["readonly"] else "read-write"
        click.echo(f"mounted machine {name!r} at {reply['mountpoint']} ({mode}, tiles {reply['tiles']}); "
                   f"`ipuos umount {shlex.quote(reply['mountpoint'])}` unmounts it")


def _mount_foreground(client: Client, args: dict, name: str) -> dict:
    """Stay attached until the mount ends; SIGTERM is a Ctrl-C (both unmount)."""

    def event(event: dict) -> None:
        if event.get("event") == "mounted":
            mode = "read-only" if event.get("readonly") else "read-write"
            click.echo(f"mounted machine {name!r} at {event.get('mountpoint')} ({mode}, tiles "
                       f"{event.get('tiles')}); Ctrl-C unmounts", err=True)
        elif event.get("event") == "detached":
            click.echo(f"unmounted lazily: {plural(event.get('open_files') or 0, 'file')} still open "
                       "there, served until closed (Ctrl-C again stops waiting)", err=True)

    def terminate(signum, frame) -> None:
        # a Ctrl-C for the call: it cancels and waits for the unmount (through the call's
        # own count, not its SIGINT handler, which a job started with & does not have:
        # SIGINT stays ignored there, and SIGTERM gave up waiting at once)
        interrupt_call()

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        return client.call("mount", args, wait=None, interruptible=True, on_event=event)
    except KeyboardInterrupt:
        _fail("stopped waiting; the machine unmounts when it sees this command is gone",
              EXIT_INTERRUPTED)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _mount_json(item: dict) -> dict:
    """A mount as the daemon describes it, in the vocabulary of ``--json``: ``tiles`` is
    a list of ids (the daemon gives ranges, as its messages show them)."""
    return {**item, "tiles": parse_tiles(item["tiles"], largest_machine_tiles())}


def _list_mounts(paths, as_json: bool) -> None:
    with _Errors(), Client(paths) as client:
        mounts = client.call("mounts")["mounts"]
    if as_json:
        click.echo(json.dumps({"name": paths.name, "mounts": [_mount_json(item) for item in mounts]}, indent=1))
        return
    if not mounts:
        click.echo(f"machine {paths.name!r} has no mounts; `ipuos mount DIR` adds one")
        return
    for item in mounts:
        since = datetime.datetime.fromtimestamp(item["since"]).strftime("%H:%M:%S")
        mode = "ro" if item["readonly"] else "rw"
        how = f"  foreground (pid {item['client_pid']})" if item["foreground"] else ""
        if item.get("detached"):
            how += "  detached (unmounted lazily; served until its files are closed)"
        click.echo(f"{item['mountpoint']}  {mode}  tiles {item['tiles']}  since {since}  "
                   f"{plural(item['open_files'], 'open file')}{how}")


@main.command()
# (not click.Path: it stats the path, which waits forever on a mount whose daemon is stopped)
@click.argument("mountpoint", callback=_not_empty)
@click.option("--lazy", is_flag=True,
              help="detach now even if files are open there; they are served until closed")
def umount(mountpoint, lazy) -> None:
    """Unmount MOUNTPOINT, an ipuos mount, even one whose machine has died."""
    from ._mount import canonical_mountpoint, ipuos_mount_holding, mount_answers, mount_at, remove_mount, unmount_path

    path = canonical_mountpoint(mountpoint)
    entry = mount_at(path)
    if entry is None:
        holder = ipuos_mount_holding(path)
        if holder is not None:
            _fail(f"{path} is not mounted: it is inside {holder.mountpoint}, a mount of machine "
                  f"{holder.machine!r} (`ipuos umount {holder.mountpoint}` unmounts that)")
        _fail(f"{path} is not mounted")
    machine = entry.machine
    if machine is None:
        _fail(f"{path} is not an ipuos mount (it is {entry.fstype} from {entry.source!r}); "
              "use umount(8) or fusermount3 -u")
    with _Errors():
        paths = machine_paths(machine)
    try:
        with Client(paths) as client:
            client.call("umount", {"mountpoint": path, "lazy": lazy}, timeout=MOUNT_SECONDS)
    except MachineNotRunning:
        dead, unknown = "its machine is not running", f"no machine {machine!r} runs with it"
    except DaemonError as exc:
        if exc.code != "not_mounted":
            _fail(exc.message)
        dead = f"machine {machine!r} no longer serves it"
        unknown = f"its own machine {machine!r} is another one"
    else:
        click.echo(f"unmounted {path}" + (" (lazily: open files are served until closed)" if lazy else ""))
        return
    answers = mount_answers(path)
    if answers is False:
        # nobody serves it: every use fails with ENOTCONN until it is removed
        if not remove_mount(path):
            _fail(f"{path} is a dead mount ({dead}) and could not be removed; try `umount -l {shlex.quote(path)}`")
        click.echo(f"removed the dead mount at {path} ({dead})")
        return
    # a live mount, served by a machine of another runtime dir: not this command's to end
    if not lazy:
        _fail(_served_elsewhere(path, machine, paths.dir, unknown, answers))
    gone, said = unmount_path(path, lazy=True)
    if not gone:
        _fail(f"could not detach {path}: {said or 'fusermount3 failed'}")
    click.echo(f"detached {path} lazily (machine {machine!r}, which the runtime dir {paths.dir} does not "
               "know, serves the files still open there until they are closed)")


def _served_elsewhere(path: str, machine: str, runtime_dir, unknown: str, answers: bool | None) -> str:
    """Why ``ipuos umount`` leaves the mount at ``path`` alone: a machine that this runtime
    dir does not know serves it (``answers`` None: it did not answer in time)."""
    from ._mount import PROBE_SECONDS, mount_server

    elsewhere = f"a running machine, {machine!r}, that the runtime dir {runtime_dir} does not know ({unknown})"
    if answers:
        message = f"{path} is served by {elsewhere}; "
    else:
        message = (f"{path} did not answer within {PROBE_SECONDS:g} s, but it is not dead: {elsewhere} "
                   "serves it, and may be stopped or busy; ")
    server = mount_server(path)
    if server is not None and server.runtime_dir is not None:
        message += (f"its daemon, pid {server.pid}, uses the runtime dir {server.runtime_dir}: "
                    f"`IPUOS_RUNTIME_DIR={shlex.quote(server.runtime_dir)} ipuos umount {shlex.quote(path)}` "
                    "unmounts it")
    else:
        served = f"pid {server.pid} serves it: " if server is not None else ""
        message += f"{served}unmount it with its machine's runtime dir (set IPUOS_RUNTIME_DIR)"
    return message + f", or `ipuos umount --lazy {shlex.quote(path)}` detaches it from here"
