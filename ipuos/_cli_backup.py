"""CLI commands for backups (added to the ``ipuos`` group on import by ``_cli``).

``ipuos backup IMG`` and ``ipuos restore IMG`` ask the running machine's daemon, which
reads and writes the image itself; ``boot --restore`` and ``halt --backup`` go through
``_cli``'s boot and halt with the helpers here. ``ipuos image ...`` needs no machine: it
reads the image file (see ``_backup_offline``).

Long work shows a progress bar on stderr when it is a terminal (rich), nothing otherwise.
Ctrl-C cancels a backup or restore cleanly (no partial image, machine untouched) and
exits 130; a second Ctrl-C stops waiting. SIGTERM and SIGHUP cancel as it does, then end
the client by the signal. Exit statuses as everywhere: 0 ok, 1 an error
(a damaged image, a refusal), 2 a usage error, 3 no such machine. An ``image`` command
ended by SIGTERM or SIGHUP while it reads a filesystem cleans up as for Ctrl-C (an
extraction leaves nothing behind) and exits with 128 + the signal's number; once an
extraction is moved into place it is done, and a signal then does not report it stopped.

Every ``ipuos`` command imports this module, so the image modules (numpy, zstandard,
littlefs) are imported by the commands that read an image file, where they are used.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import NoReturn

import click

from ._cli import (StdoutError, _Errors, _fail, _paths, _stderr_is_terminal, directory_name_problem, image_path,
                   json_option, main, name_option)
from ._client import Client, DaemonError, interrupt_call
from ._diskwords import disks_of, times_alike
from ._plural import plural
from ._presets import MAX_IPUS, PRESETS, ipus_in_range
from ._rundir import hint
from ._runresult import EXIT_INTERRUPTED
from ._shown import shown
from ._terminate import die_of, on_termination
from ._tilespec import describe_tiles, tiles_alike
from ._views import human_bytes


# -- progress --------------------------------------------------------------------------------


class _Progress:
    """A rich progress bar on stderr for a terminal. Otherwise silent, but for one line
    when the command has to wait for busy tiles (a script would just seem to hang)."""

    _TITLES = {"waiting": "waiting for tiles", "writing": "backing up", "reading": "reading image",
               "checking": "checking filesystems", "restoring": "restoring", "verifying": "verifying"}

    def __init__(self, enabled: bool, notes: bool = False):
        self.enabled = enabled
        self._notes = notes and not enabled
        self._bar = None
        self._task = None
        self._phase = None
        #: Ctrl-Cs (or SIGTERM, SIGHUP) that asked to cancel the call
        self.cancels = 0

    def __enter__(self) -> "_Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
            self._task = self._phase = None  # (the bar's tasks went with it)

    @staticmethod
    def _waiting(phase: str, tiles: int) -> str:
        if phase == "queued":
            return (f"waiting for another backup, restore or check of this machine to let go of "
                    f"{plural(tiles, 'tile')}")
        return f"waiting for {plural(tiles, 'tile')} to reach an exchange point"

    def update(self, phase: str, done: int, total) -> None:
        waiting = phase in ("waiting", "queued")
        if self._notes and waiting:
            self._notes = False
            why = "a program is computing; Ctrl-C cancels" if phase == "waiting" else "Ctrl-C cancels"
            click.echo(f"ipuos: {self._waiting(phase, done or total)} ({why})", err=True)
        if not self.enabled:
            return
        if self._bar is None:
            from rich.console import Console
            from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                       TimeRemainingColumn, TransferSpeedColumn)

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TransferSpeedColumn(), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=True)
            self._bar.start()
        if waiting:
            text = self._waiting(phase, done or total)
            if self._task is None:
                self._task = self._bar.add_task(text, total=None)
            self._bar.update(self._task, description=text)
            return
        if phase != self._phase or self._task is None:
            if self._task is not None:
                self._bar.remove_task(self._task)
            self._task = self._bar.add_task(self._TITLES.get(phase, phase), total=total)
            self._phase = phase
        self._bar.update(self._task, completed=done, total=total)

    def event(self, event: dict) -> None:
        if event.get("event") == "progress":
            self.update(str(event.get("phase")), int(event.get("done") or 0), event.get("total"))

    def interrupted(self, count: int) -> None:
        self.cancels = count
        if count == 1 and self.enabled:
            self.close()
            self.enabled = False  # (what the call does next is told in words, not a bar)
            click.echo("cancelling... (Ctrl-C again to stop waiting)", err=True)


def _call_with_progress(paths, cmd: str, args: dict, quiet: bool) -> dict:
    """Run a long daemon command with a progress bar; Ctrl-C cancels it."""
    with _Errors(), Client(paths) as client:
        return _progress_call(client, cmd, args, quiet,
                              f"the machine is still finishing its {cmd} (see {hint('ps', paths.name)})")


def _progress_call(client: Client, cmd: str, args: dict, quiet: bool, after_ctrl_c: str) -> dict:
    """``client.call`` with a progress bar, or notes when not on a terminal (unless
    ``quiet``); Ctrl-C cancels, a second stops waiting (``after_ctrl_c`` says what then).
    SIGTERM and SIGHUP cancel as Ctrl-C does, saying so, then end the process by the
    signal (left to their default action, the client died silently mid-way)."""
    terminal = _stderr_is_terminal()
    terminated: list[int] = []

    def cancel(signum: int) -> None:
        terminated.append(signum)
        interrupt_call()  # (counted by the call as a Ctrl-C: see Client.call)

    def end(message: str) -> NoReturn:
        if not terminated:
            _fail(message, EXIT_INTERRUPTED)
        click.echo(f"ipuos: {message}", err=True)
        die_of(terminated[0])

    with _Progress(not quiet and terminal, notes=not quiet) as progress, on_termination(cancel):
        try:
            result = client.call(cmd, args, wait=None, interruptible=True, on_event=progress.event,
                                 on_interrupt=progress.interrupted)
            if progress.cancels:  # (the daemon was past the point where it could stop)
                click.echo(f"ipuos: too late to cancel: the {cmd} was past the point of no return, "
                           "and it went on to the end", err=True)
            return result
        except DaemonError as exc:
            progress.close()
            if exc.code == "bad_tiles":
                raise click.BadParameter(exc.message, param_hint="--tiles") from None
            if exc.code == "cancelled":
                end(exc.message)
            raise
        except KeyboardInterrupt:
            progress.close()
            end(f"stopped waiting; {after_ctrl_c}")


# -- backup and restore -----------------------------------------------------------------------


@main.command()
@click.argument("image", type=click.Path(dir_okay=False, readable=False))
@click.option("--tiles", "tile_spec", default="all", show_default=True,
              help="tiles whose disks to back up, e.g. 0-15; tile 0 brings the chip disk")
@name_option
@json_option
def backup(image, tile_spec, name, as_json) -> None:
    """Back up the machine's tile disks and chip disk to IMAGE, atomically.

    The tiles are paused at an exchange point while their disks are copied, so the image
    is consistent; IMAGE is replaced only once the new image is complete.
    """
    paths = _paths(name)
    args = {"path": image_path(image, writing=True), "tiles": tile_spec}
    summary = _call_with_progress(paths, "backup", args, as_json)
    if as_json:
        click.echo(json.dumps({"name": paths.name, **summary}, indent=1))
        return
    click.echo(f"backed up {summary['description']} of machine {name!r} to {summary['path']}: "
               f"{human_bytes(summary['device_bytes'])} of disks in a {human_bytes(summary['file_size'])} image "
               f"({summary['seconds']:.2f} s)")
    echo_backup_notes(summary)


def echo_backup_notes(summary: dict) -> None:
    """What a backup's image lacks, on stderr: writes not yet committed, RAM disks."""
    uncommitted = summary.get("uncommitted") or []
    if uncommitted:
        files = "; ".join(f"{describe_tiles(tiles)}: {path}"
                          for tiles, path in tiles_alike((item["tile"], item["path"]) for item in uncommitted))
        click.echo(f"ipuos: note: {plural(len(uncommitted), 'file was', 'files were')} open "
                   f"with writes not yet committed, and the image holds {'them' if len(uncommitted) > 1 else 'it'} "
                   f"as last committed ({files}); a tile program commits a file's writes when it flushes or "
                   "closes it, a host process writing through the mount when it calls fsync or closes it", err=True)
    left_out = summary.get("left_out") or []
    if left_out:
        kinds = sorted({item["kind"] for item in left_out})
        mounts = " and ".join(f"the {item['kind']} on {item['path']} of tile {item['tile']}" for item in left_out)
        click.echo(f"ipuos: note: not in the image: {mounts} (no backup takes "
                   f"{' or '.join(kind + 's' for kind in kinds)})", err=True)
    times = {(item["tile"], item["path"]): item["files"] for item in summary.get("times_left_out") or []}
    for tiles, mount, files in times_alike(times):
        one = len(tiles) == 1
        click.echo(f"ipuos: note: not in the image: the modification times of {files} on {disks_of(mount, tiles)}, "
                   f"which {'is' if one else 'are'} too full to write them (free some space on "
                   f"{'it' if one else 'them'}, then back up again)", err=True)


@main.command()
@click.argument("image", type=click.Path(dir_okay=False, readable=False))
@click.option("--tiles", "tile_spec", default=None,
              help="restore only these tiles' disks from IMAGE (default: all it holds); "
                   "with tile 0 the chip disk is restored too")
@name_option
@json_option
def restore(image, tile_spec, name, as_json) -> None:
    """Restore the machine's disks from IMAGE.

    The whole image is verified and every filesystem mounted in scratch memory first;
    tiles running a program or holding open files are refused. Nothing changes unless
    everything can.
    """
    paths = _paths(name)
    path = image_path(image, writing=False)
    problem = _unreadable_problem(path)
    if problem:
        _fail(problem)
    args = {"path": path, "tiles": tile_spec}
    summary = _call_with_progress(paths, "restore", args, as_json)
    if as_json:
        click.echo(json.dumps({"name": paths.name, **summary}, indent=1))
        return
    click.echo(f"restored {summary['description']} of machine {name!r} from {summary['path']} "
               f"({summary['seconds']:.2f} s)")


# -- boot --restore and halt --backup (called by _cli) ----------------------------------------


def boot_geometry(ctx: click.Context, image: str, preset: str, ipus: int) -> tuple[str, int]:
    """The preset and IPUs to boot for ``--restore IMAGE``: the image's, unless given."""
    from ._image import ImageError, open_image

    try:
        with open_image(image, verify=False) as img:
            meta = img.meta
    except ImageError as exc:
        _fail(f"{exc}; no machine was started")
    if ctx.get_parameter_source("preset") is click.core.ParameterSource.DEFAULT:
        preset = meta.get("preset", preset)
        if preset not in PRESETS:
            _fail(f"image {image} was taken on a {preset!r} machine, which this ipuos does not know; "
                  "no machine was started")
    if ctx.get_parameter_source("ipus") is click.core.ParameterSource.DEFAULT:
        ipus = meta.get("ipus", ipus)
        if not ipus_in_range(ipus):
            _fail(f"image {image} was taken on a machine of {ipus} IPUs; this ipuos makes 1 to "
                  f"{MAX_IPUS}; no machine was started")
    return preset, ipus


def halt_with_backup(client: Client, args: dict) -> dict:
    """``halt --backup``: the halt call, with backup's progress and notes (a cancelled one
    says, as the daemon's message, that the machine was not halted)."""
    return _progress_call(client, "halt", args, False, "the machine may still halt once its backup is written")


# -- offline: ipuos image ... -----------------------------------------------------------------


@main.group()
def image() -> None:
    """Look into backup images without a machine: info, ls, cat, verify, extract."""


class _ImageErrors:
    """ImageError and OfflineError become one line on stderr and exit status 1."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if isinstance(exc, StdoutError):
            return False  # (reported for every command alike, by _cli's _whole_output)
        if isinstance(exc, (OSError, *_image_errors())):
            _fail(_error_line(exc))
        return False


def _image_errors() -> tuple[type, ...]:
    from ._backup_offline import OfflineError
    from ._image import ImageError

    return ImageError, OfflineError


def _error_line(exc: Exception) -> str:
    if isinstance(exc, _image_errors()):
        return str(exc)
    return f"{exc.filename or ''}{': ' if exc.filename else ''}{exc.strerror or exc}"


def _unreadable_problem(path: str) -> str | None:
    """Why there is no image to read at ``path`` (absolute), or None: said at once (before
    a daemon is asked, or the image opened). A file not there is "no such file"; a name
    too long, say, is not."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return f"image {path}: no such file"
    except OSError as exc:
        return f"image {path}: {exc.strerror or exc}"
    return None


def _open(path: str, verify: bool = False):
    from ._image import ImageError, open_image

    if path == "-":
        raise ImageError("'-': an image is read from a file, not from standard input; give the "
                         "image's file name")
    problem = directory_name_problem(path, writing=False)
    path = os.path.abspath(path)  # (reported as backup and restore report theirs)
    problem = problem or _unreadable_problem(path)
    if problem:
        raise ImageError(problem)
    if not verify:
        return open_image(path, verify=False)
    with _Progress(_stderr_is_terminal()) as progress:
        return open_image(path, verify=True,
                          progress=lambda done, total: progress.update("verifying", done, total))


def _when(ns) -> str:
    """A file's mtime (ns) as listings show it; "-" if it has none."""
    return _local_time(ns / 1e9) if ns is not None else "-"


def _local_time(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


@image.command("info")
@click.argument("path", metavar="IMAGE", type=click.Path(dir_okay=False, readable=False))
@json_option
def image_info(path, as_json) -> None:
    """The image's machine, devices and sizes (its structure is checked, not every byte)."""
    with _ImageErrors(), _open(path) as img:
        info = img.info()
    if as_json:
        click.echo(json.dumps(info, indent=1))
        return
    meta = info["meta"]
    taken = meta.get("taken")
    formatted = [d for d in info["devices"] if d["chunks"]]
    click.echo(f"image {info['path']}: ipuos image format {info['format_version']}, "
               f"{info['digest_algorithm']} digests")
    click.echo(f"  machine   {shown(str(meta.get('machine', '?')))}: {shown(meta['preset'])}, "
               f"{plural(meta['ipus'], 'IPU')}, {meta['tiles_per_chip'] * meta['ipus']} tiles")
    if taken is not None:
        click.echo(f"  taken     {_taken_at(taken)}")
    click.echo(f"  devices   {info['device_count']} ({len(formatted)} formatted, "
               f"{info['device_count'] - len(formatted)} blank) holding {human_bytes(info['device_bytes'])}")
    click.echo(f"  file      {info['file_size']} bytes ({human_bytes(info['stored_bytes'])} of chunks)")
    click.echo(f"  digest    {info['image_digest']}")


@image.command("verify")
@click.argument("path", metavar="IMAGE", type=click.Path(dir_okay=False, readable=False))
@json_option
def image_verify(path, as_json) -> None:
    """Check every byte of the image: chunks, device digests, the image digest."""
    from ._image import ImageError

    started = time.perf_counter()
    try:
        with _open(path, verify=True) as img:
            info = img.info()
    except (ImageError, OSError) as exc:
        message = _error_line(exc)
        if as_json:  # (scripts read the verdict from stdout either way)
            click.echo(json.dumps({"path": os.path.abspath(path), "ok": False, "error": message},
                                  indent=1))
        _fail(message)
    seconds = time.perf_counter() - started
    if as_json:
        click.echo(json.dumps({"path": info["path"], "ok": True, "image_digest": info["image_digest"],
                               "device_count": info["device_count"], "device_bytes": info["device_bytes"],
                               "seconds": seconds}, indent=1))
        return
    click.echo(f"image {info['path']} is intact: {plural(info['device_count'], 'device')}, "
               f"{human_bytes(info['device_bytes'])} checked ({seconds:.2f} s)")


@image.command("ls")
@click.argument("path", metavar="IMAGE", type=click.Path(dir_okay=False, readable=False))
@click.argument("device", required=False)
@click.argument("inner", metavar="[PATH]", required=False, default="/")
@json_option
def image_ls(path, device, inner, as_json) -> None:
    """List the image's devices, or a directory of DEVICE: N or tile/N/disk (or /tiles/N)
    for tile N's disk, chip (or /chip) for the chip disk."""
    from ._backup_offline import device_entry, list_dir, mounted, on_device

    with _ImageErrors(), _open(path) as img:
        if device is None:
            rows = [e.summary() for e in img.devices]
            if as_json:
                click.echo(json.dumps(rows, indent=1))
                return
            for row in rows:
                state = "formatted" if row["chunks"] else "blank"
                click.echo(f"{row['name']:<16} {state:<9} {row['length']:>10}  {row['mount'] or ''}")
            return
        entry = device_entry(img, device)
        with mounted(img, entry) as fs:
            nodes = list_dir(fs, on_device(fs, entry, inner))
    if as_json:
        click.echo(json.dumps([{"name": n.path, "is_dir": n.is_dir, "size": n.size,
                                "mtime_ns": n.mtime_ns} for n in nodes], indent=1))
        return
    for node in nodes:
        name = shown(node.path) + ("/" if node.is_dir else "")
        click.echo(f"{'d' if node.is_dir else '-'} {node.size:>9}  {_when(node.mtime_ns)}  {name}")


def _taken_at(taken) -> str:
    """The local time an image says it was taken (untrusted: any JSON value, in seconds)."""
    try:
        if isinstance(taken, bool) or not isinstance(taken, (int, float)):
            raise TypeError
        return _local_time(taken)
    except (TypeError, ValueError, OverflowError, OSError):
        return f"unknown (the image says {shown(repr(taken)[:60])})"


@image.command("cat")
@click.argument("path", metavar="IMAGE", type=click.Path(dir_okay=False, readable=False))
@click.argument("device")
@click.argument("inner", metavar="PATH")
def image_cat(path, device, inner) -> None:
    """Write the file PATH of DEVICE to stdout (DEVICE: N or tile/N/disk for tile N's
    disk, chip for the chip disk; as in `ipuos image ls`)."""
    from ._backup_offline import device_entry, mounted, on_device, read_file

    with _ImageErrors(), _open(path) as img:
        entry = device_entry(img, device)
        with mounted(img, entry) as fs:
            data = read_file(fs, on_device(fs, entry, inner))
    sys.stdout.buffer.write(data)  # (whole, or main reports why not)


@image.command("extract")
@click.argument("path", metavar="IMAGE", type=click.Path(dir_okay=False, readable=False))
@click.argument("device")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--path", "inner", default="/", show_default=True, help="the directory of DEVICE to extract")
@json_option
def image_extract(path, device, dest, inner, as_json) -> None:
    """Copy DEVICE's files (or those under --path) into DEST, a new or empty directory
    (DEVICE: N or tile/N/disk for tile N's disk, chip for the chip disk).

    Every name is checked before anything is written (no '..', absolute paths, NUL,
    control characters or over-long names); on any refusal, or an interruption before
    it is done, DEST is as it was.
    """
    from ._backup_offline import device_entry, extract, mounted, on_device
    from ._signals import settle

    with _ImageErrors(), _open(path) as img:
        entry = device_entry(img, device)
        with mounted(img, entry) as fs:
            result = extract(fs, on_device(fs, entry, inner), dest, like=img.mode, before_commit=settle)
            # (reported while signals are still held: once settled, a signal is dropped)
            if as_json:
                click.echo(json.dumps(result, indent=1))
            else:
                click.echo(f"extracted {plural(result['files'], 'file')} and "
                           f"{plural(result['directories'], 'directory', 'directories')} "
                           f"({plural(result['bytes'], 'byte')}) to {result['dest']}")

