"""The machine commands: help, df, free, mount, umount, ps, kill, and the entries of the
commands the terminal front-end carries out itself.

Whatever concerns another tile is asked of that tile through the exchange (``df`` and
``free`` send every tile a ``shell.*`` kernel request, batched with ``call_tiles`` so
that one superstep carries hundreds of them); jobs are listed and interrupted through
the :class:`~ipuos.shell.ShellHost` the daemon gave the shell.
"""

from __future__ import annotations

import re

from ipuos._plural import plural
from ipuos._shown import shown
from ipuos._tilespec import TileSpecError, format_tiles, parse_tiles

from ._table import COMMANDS, Usage, command, human_size, options, parse_size

#: bytes a reply of ``shell.meminfo``/``shell.df`` may take in tile 0's incoming buffer
#: (a tile with a few regions: ~120 B; replies that overflow the buffer fail the asker)
REPLY_ROOM = 256
#: SRAM regions made by ``mount --ram``, by mount point
RAMDISK_PREFIX = "ramdisk:"


def is_ram_disk(sh, full: str) -> bool:
    """Whether a ``mount --ram`` disk is mounted at absolute path ``full``: the only
    mounts ``umount`` removes (the machine's own, such as /chip, stay)."""
    return RAMDISK_PREFIX + full in sh.tile.memory


# -- help ----------------------------------------------------------------------------------------

_HELP_NOTES = """\
Paths: / is tile 0's own disk, /chip the chip disk (striped over the other tiles' SRAM),
/tiles/N/... the files of tile N (each request travels over the exchange to tile N).
Lines: ';' separates commands, > and >> send output to a file on the chip, quotes and
\\ work as in sh, * ? [..] match file names. Host commands are never run: the shell only
knows the commands above. put/get copy files between the host and the chip.
"""


@command("help", "help [COMMAND]", "list commands, or explain one", paths=False)
def _help(sh, args):
    _opts, args = options(args, "")  # (none; -- ends them, as for every command)
    if len(args) > 1:
        raise Usage("one command at a time")
    if args:
        spec = COMMANDS.get(args[0])
        if spec is None:
            return sh.error(f"{args[0]}: no such command (help lists them)")
        sh.write(spec.help_text())
        return 0
    width = max(len(name) for name in COMMANDS)
    for name in sorted(COMMANDS):
        sh.print(f"  {name.ljust(width)}  {COMMANDS[name].summary}")
    sh.write("\n" + _HELP_NOTES)
    return 0


# -- space and memory -------------------------------------------------------------------------


def ask_tiles(sh, tiles: list[int], service: str, *args) -> list[tuple[bool, object]]:
    """``service(*args)`` on every tile in ``tiles``, in batches riding the exchange: as
    many requests per batch as tile 0's incoming buffer has room for half of their
    replies (Ctrl-C is noticed between batches)."""
    results: list = []
    call_tiles = sh.server.scheduler.call_tiles
    size = max(1, sh.tile.xin.size // 2 // REPLY_ROOM)
    for start in range(0, len(tiles), size):
        sh.check()
        batch = tiles[start : start + size]
        results.extend(call_tiles(sh.tile, [(tile, service, args) for tile in batch]))
    return results


@command("df", "df", "size and use of every filesystem (all tiles' disks under /tiles)", paths=False)
def _df(sh, args):
    _opts, args = options(args, "")
    if args:
        raise Usage("df takes no arguments")
    rows = [("Filesystem", "Size", "Used", "Avail", "Use%", "Mounted on")]
    for mount in sh.fs.vfs.mount_points():
        if mount.kind == "tiles":
            ntiles = sh.server.scheduler.ntiles
            size = used = 0
            failed = []
            for tile, (ok, value) in enumerate(ask_tiles(sh, list(range(ntiles)), "shell.df")):
                if not ok:
                    failed.append(tile)
                    continue
                size += value[0]
                used += value[1]
            source = f"{ntiles} tile disks"
            if failed:
                sh.error(f"{format_tiles(failed)}: did not answer; not counted")
        else:
            try:
                info = sh.fs.statvfs(mount.path)
            except OSError as exc:
                sh.oserror(exc)
                continue
            size = info.f_blocks * info.f_frsize
            used = size - info.f_bfree * info.f_frsize
            source = _source_name(mount.path, mount.kind, mount.source)
        percent = f"{100 * used / size:.0f}%" if size else "-"
        rows.append((source, human_size(size), human_size(used), human_size(size - used), percent,
                     mount.path))
    sh.write(_table(rows, right=(1, 2, 3, 4)))
    return sh.status


@command("free", "free [--tiles SPEC]", "SRAM use by region across tiles (--tiles: tile by tile)",
         paths=False)
def _free(sh, args):
    opts, rest = options(args, "", ("tiles=",))
    if rest:
        raise Usage(f"unexpected argument {rest[0]!r}")
    ntiles = sh.server.scheduler.ntiles
    try:
        tiles = parse_tiles(opts.get("--tiles", "all"), ntiles)
    except TileSpecError as exc:
        return sh.error(str(exc), 2)
    reports = []
    for tile, (ok, value) in zip(tiles, ask_tiles(sh, tiles, "shell.meminfo")):
        if ok:
            reports.append((tile, value))
        else:
            sh.error(f"tile {tile}: {value}")
    total = sum(size for _, (size, _, _) in reports)
    used = sum(used for _, (_, used, _) in reports)
    percent = f" ({100 * used / total:.0f}%)" if total else ""
    sh.print(f"SRAM of {plural(len(reports), 'tile')}: {human_size(total)} total, "
             f"{human_size(used)} used{percent}, {human_size(total - used)} free")
    regions: dict[str, list[int]] = {}
    for _, (_, _, held) in reports:
        for name, size in held:
            regions.setdefault(re.sub(r"^job\d+\.", "job*.", name), []).append(size)
    rows = [("region", "tiles", "total", "per tile")]
    for name, sizes in sorted(regions.items(), key=lambda item: -sum(item[1])):
        each = human_size(sizes[0]) if len(set(sizes)) == 1 else "varies"
        rows.append((name, str(len(sizes)), human_size(sum(sizes)), each))
    sh.write(_table(rows, right=(1, 2, 3)))
    if "--tiles" in opts:
        sh.print()
        rows = [("tile", "used", "free", "regions")]
        for tile, (size, used_bytes, held) in reports:
            names = ", ".join(f"{name} {human_size(size_)}" for name, size_ in held)
            rows.append((str(tile), human_size(used_bytes), human_size(size - used_bytes), names))
        sh.write(_table(rows, right=(0, 1, 2)))
    return sh.status


def _table(rows: list[tuple], right: tuple[int, ...] = ()) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


# -- mounts -------------------------------------------------------------------------------------


@command("mount", "mount [--tile N] | mount --ram SIZE DIR",
         "list mounts (of tile 0, or tile N); --ram: a new RAM disk in tile 0's SRAM")
def _mount(sh, args):
    opts, rest = options(args, "", ("tile=", "ram="))
    if "--ram" in opts:
        if len(rest) != 1 or "--tile" in opts:
            raise Usage("mount --ram SIZE DIR")
        return _mount_ram(sh, opts["--ram"], rest[0])
    if rest:
        raise Usage("mount lists mounts; mount --ram SIZE DIR makes a RAM disk")
    if "--tile" in opts:
        text = opts["--tile"]
        if not (text.isascii() and text.isdigit()):
            return sh.error(f"--tile: {text!r} is not a tile number", 2)
        tile = int(text)
        try:
            parse_tiles([tile], sh.server.scheduler.ntiles)
        except TileSpecError as exc:
            return sh.error(f"--tile: {exc}", 2)
        mounts = sh.server.scheduler.call_tile(sh.tile, tile, "fs.mounts")
    else:
        mounts = [tuple(info) for info in sh.fs.vfs.mount_points()]
    for path, kind, source, readonly, open_files in mounts:
        note = f", {open_files} open" if open_files else ""
        sh.print(f"{_source_name(path, kind, source)} on {path} type {kind} "
                 f"({'ro' if readonly else 'rw'}{note}): {source.strip('<>')}")
    return 0


def _source_name(path: str, kind: str, source: str) -> str:
    """A short name for what is mounted (the device's repr is in ``mount``'s listing)."""
    if kind == "tiles":
        return "tile files"
    if "ramdisk" in source:
        return "RAM disk"
    if "Striped" in source:
        return "chip disk"
    if path == "/":
        return "tile disk"
    return source.strip("<>").split()[0] if source else kind


def _mount_ram(sh, size_text: str, path: str) -> int:
    from ipuos.blockdev import MemoryDevice  # (see shell/__init__: what the terminal imports)
    from ipuos.vfs import mount_device

    try:
        size = parse_size(size_text)
    except ValueError:
        return sh.error(f"invalid size {size_text!r} (e.g. 32K, 1M)", 2)
    block = 512 if size < 64 * 1024 else 4096
    size = -(-size // block) * block
    if size < 4 * block:
        return sh.error(f"a RAM disk needs at least {4 * block} bytes", 2)
    full = sh.fs.abspath(path)
    if full == "/" or full.startswith("/tiles/") or full == "/tiles":
        return sh.error(f"{path}: mount RAM disks on tile 0's own directories")
    try:  # as mount(8): the mount point is a directory that exists (a typo makes none)
        if not sh.fs.entry(path).is_dir:
            return sh.error(f"{path}: Not a directory")
    except OSError as exc:
        return sh.oserror(exc)
    memory = sh.tile.memory
    name = RAMDISK_PREFIX + full
    if sh.fs.ismount(full):
        mounted = next((tuple(info) for info in sh.fs.vfs.mount_points() if info[0] == full), None)
        what = ("a RAM disk; umount it first" if is_ram_disk(sh, full)
                else _source_name(*mounted[:3]) if mounted else "something is mounted there")
        return sh.error(f"{path}: already a mount point ({what})")
    try:
        region = memory.alloc(name, size)
    except (MemoryError, ValueError) as exc:
        return sh.error(str(exc))
    try:
        mount_device(sh.fs.vfs, full, MemoryDevice.for_region(region, block), format=True)
    except BaseException:
        memory.free(name)
        raise
    sh.print(f"mounted a {human_size(size)} RAM disk (tile 0's SRAM) on {full}")
    return 0


@command("umount", "umount DIR", "unmount a RAM disk made with mount --ram")
def _umount(sh, args):
    _opts, args = options(args, "")
    if len(args) != 1:
        raise Usage("umount DIR")
    full = sh.fs.abspath(args[0])
    if not is_ram_disk(sh, full):
        if sh.fs.ismount(full):
            return sh.error(f"{args[0]}: the machine's own mounts stay (only RAM disks made "
                            "with mount --ram can be unmounted)")
        return sh.error(f"{args[0]}: not a mount point")
    try:  # (busy while a file is open on it, or a shell's or program's cwd is in it)
        sh.fs.vfs.umount(full)
    except OSError as exc:
        exc.filename = args[0]
        raise
    sh.tile.memory.free(RAMDISK_PREFIX + full)
    return 0


# -- jobs -----------------------------------------------------------------------------------------


@command("ps", "ps", "tile states and running jobs", paths=False)
def _ps(sh, args):
    _opts, args = options(args, "")
    if args:
        raise Usage("ps takes no arguments")
    states: dict[str, int] = {}
    for tile in sh.server.scheduler.tiles:
        # tile 0 is busy serving this very command: that is the shell, not a program
        state = "in the shell" if tile is sh.tile and tile.job is None else tile.state
        states[state] = states.get(state, 0) + 1
    ntiles = sh.server.scheduler.ntiles
    summary = ", ".join(f"{states[s]} {s}" for s in ("idle", "in the shell", "running", "waiting", "dead")
                        if states.get(s))
    sh.print(f"{ntiles} tiles: {summary}")
    jobs = sh.host.jobs()
    if not jobs:
        sh.print("no jobs")
        return 0
    rows = [("JOB", "TILES", "ELAPSED", "CLIENT", "NAME")]
    for job in jobs:
        elapsed = f"{job.elapsed:.1f}s" if job.elapsed is not None else "-"
        rows.append((str(job.id), job.tiles, elapsed, str(job.client_pid or "-"), shown(job.name)))
    sh.write(_table(rows, right=(0, 2, 3)))
    return 0


@command("kill", "kill JOB...", "interrupt jobs (ps lists them)", paths=False)
def _kill(sh, args):
    _opts, jobs = options(args, "")  # (none: kill -9 is no signal here; -- ends them)
    if not jobs:
        raise Usage("missing job number")
    for arg in jobs:
        if not (arg.isascii() and arg.isdigit()):  # ('²' is a digit to str.isdigit)
            sh.error(f"{arg}: not a job number")
            continue
        if not sh.host.kill(int(arg), f"killed with `kill {arg}` from the shell"):
            sh.error(f"{arg}: no such job")
    return sh.status


# -- done by the terminal -------------------------------------------------------------------------

_TERMINAL_ONLY = {
    "put": ("put HOSTFILE [PATH]", "copy a host file to the chip (byte for byte)"),
    "get": ("get PATH [HOSTFILE]", "copy a file from the chip to the host (byte for byte)"),
    "history": ("history", "the lines typed so far (in $XDG_DATA_HOME/ipuos/history, or ~/.local/share/...)"),
    "clear": ("clear", "clear the screen"),
    "exit": ("exit [STATUS]", "leave the shell (so does Ctrl-D)"),
}


def _terminal_only(sh, args):
    return sh.error("this command is carried out by the terminal front-end (`ipuos shell`), "
                    "which has the host's files and screen; tile 0 has neither")


for _name, (_usage, _summary) in _TERMINAL_ONLY.items():
    command(_name, _usage, _summary, terminal=True, paths=_name in ("put", "get"))(_terminal_only)

