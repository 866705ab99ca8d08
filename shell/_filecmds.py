"""The commands that look at files: ls, cd, pwd, cat, head, tail, echo, stat, tree, du.

They work on tile 0's VFS, so the same command reaches every file of the machine: ``/``
is tile 0's own SRAM disk, ``/chip`` the chip disk striped over the other tiles' SRAM,
and ``/tiles/N/...`` is tile N's files, each request carried to tile N over the exchange
and served by tile N itself. Long listings and reads check for Ctrl-C between steps.
"""

from __future__ import annotations

import codecs
import datetime
import errno
import os
import re
import unicodedata

from ipuos._plural import plural

from ._table import Usage, command, human_size, options

#: bytes per read when printing files
CHUNK = 64 * 1024


def _join(directory: str, name: str) -> str:
    return directory + name if directory.endswith("/") else directory + "/" + name


def natural_order(entry) -> list:
    """Sort key: digits compare as numbers, so /tiles lists 0, 1, 2 ... 10, not 0, 1, 10."""
    return natural_key(entry.name)


def natural_key(name: str) -> list:
    """:func:`natural_order` of a name."""
    # (the split puts runs of digits at odd places: "²" is isdigit() yet no int, nor \d)
    return [int(part) if index % 2 else part for index, part in enumerate(re.split(r"(\d+)", name))]


def _mtime(mtime_ns: int, zone) -> str:
    if not mtime_ns:
        return "                -"
    return _local_time(mtime_ns, "%Y-%m-%d %H:%M", zone)


def _local_time(ns: int, form: str, zone) -> str:
    """``ns`` since the epoch as ``form`` in ``zone`` (a tzinfo; None: this process's own),
    in whole seconds toward the past, as ``ls`` and ``stat`` show times: ``ns / 1e9``
    rounded 16:44:59.9999999 up to 16:45:00, and -1 ns to 1970."""
    return datetime.datetime.fromtimestamp(ns // 1_000_000_000, zone).strftime(form)


def _columns(names: list[str], width: int) -> str:
    """Names in columns filling ``width`` (one per line when width is 0: not a terminal)."""
    if not names:
        return ""
    if width <= 0:
        return "".join(name + "\n" for name in names)
    widths = dict(zip(names, map(_display_width, names)))
    column = max(widths.values()) + 2
    per_row = max(1, width // column)
    rows = -(-len(names) // per_row)
    lines = []
    for row in range(rows):
        cells = names[row::rows]
        lines.append("".join(cell + " " * (column - widths[cell]) for cell in cells).rstrip())
    return "\n".join(lines) + "\n"


def _display_width(text: str) -> int:
    """The columns ``text`` takes on a terminal: two for a wide (East Asian) character,
    none for a combining mark or a format character (a zero-width joiner)."""
    return sum(0 if unicodedata.category(char) in ("Mn", "Me", "Cf")
               else 2 if unicodedata.east_asian_width(char) in "WF" else 1
               for char in text)


# -- looking ------------------------------------------------------------------------------------


@command("ls", "ls [-l] [-a] [PATH...]", "list files (directories end in /; -l: type, size, time)")
def _ls(sh, args):
    opts, paths = options(args, "la")
    long_format, show_all = "-l" in opts, "-a" in opts
    paths = paths or ["."]
    files, dirs = [], []
    for path in paths:
        try:
            entry = sh.fs.entry(path)
        except OSError as exc:
            sh.oserror(exc)
            continue
        (dirs if entry.is_dir else files).append((path, entry))
    files.sort(key=lambda item: natural_key(item[0]))  # (operands too, as GNU ls sorts them)
    dirs.sort(key=lambda item: natural_key(item[0]))
    if files:
        sh.write(_listing(sh, [entry._replace(name=path) for path, entry in files], long_format))
    for index, (path, _) in enumerate(dirs):
        sh.check()
        try:
            entries = sh.fs.entries(path)
        except OSError as exc:
            sh.oserror(exc)
            continue
        if not show_all:
            entries = [e for e in entries if not e.name.startswith(".")]
        entries.sort(key=natural_order)
        if show_all:
            here = sh.fs.entry(path)
            entries[:0] = [here._replace(name="."), here._replace(name="..", size=0, mtime_ns=0)]
        if len(paths) > 1:
            sh.write(("\n" if files or index else "") + f"{path}:\n")
        sh.write(_listing(sh, entries, long_format))
    return sh.status


def _listing(sh, entries, long_format: bool) -> str:
    if long_format:
        return "".join(
            f"{'d' if e.is_dir else '-'} {e.size:>9} {_mtime(e.mtime_ns, sh.session.zone)} {sh.shown(e.name)}"
            f"{'/' if e.is_dir and e.name not in ('.', '..') else ''}\n"
            for e in entries
        )
    names = [sh.shown(e.name) + ("/" if e.is_dir and e.name not in (".", "..") else "") for e in entries]
    return _columns(names, sh.session.width)


@command("cd", "cd [DIR]", "change the current directory (default /; cd - goes back)")
def _cd(sh, args):
    _opts, args = options(args, "")  # ("-" is no option: it goes back)
    if len(args) > 1:
        raise Usage("too many arguments")
    target = args[0] if args else "/"
    session = sh.session
    if target == "":  # (as bash: nothing to go to, nowhere gone)
        return 0
    back = target == "-"
    if back:
        if session.previous_cwd is None:
            return sh.error("OLDPWD not set")
        target = session.previous_cwd
    session.previous_cwd, session.cwd = session.cwd, _logical_directory(sh, target)
    if back:  # (as bash: where it went back to)
        sh.print(session.cwd)
    return 0


def _logical_directory(sh, target: str) -> str:
    """Where ``cd target`` goes, resolved as bash's default ``cd -L`` does: from the
    current directory's path, ``..`` taking its last name off. So ``cd ..`` leaves a
    directory that has been removed meanwhile. A name the target gives itself must be a
    directory before ``..`` takes it off (``cd missing/..`` fails, as in bash), and where
    it all leads must be a directory."""
    sh.fs.abspath(target)  # (an empty path or a NUL is refused as anywhere else)
    names = [] if target.startswith("/") else [name for name in sh.session.cwd.split("/") if name]
    given = 0  # the last names, the target's own (the others are the current directory's)
    try:
        for name in target.split("/"):
            if name == "..":
                if given:
                    _require_directory(sh, "/" + "/".join(names))
                    given -= 1
                if names:
                    names.pop()
            elif name and name != ".":
                names.append(name)
                given += 1
        full = "/" + "/".join(names)
        _require_directory(sh, full)
    except OSError as exc:
        exc.filename = target
        raise
    return full


def _require_directory(sh, path: str) -> None:
    if not sh.fs.entry(path).is_dir:
        raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)


@command("pwd", "pwd", "print the current directory", paths=False)
def _pwd(sh, args):
    _opts, args = options(args, "")
    if args:
        raise Usage("pwd takes no arguments")
    sh.print(sh.session.cwd)
    return 0


@command("cat", "cat FILE...", "print files")
def _cat(sh, args):
    _opts, args = options(args, "")
    if not args:
        raise Usage("missing file operand")
    for path in args:
        try:
            with sh.fs.open(path, "rb") as file:
                if sh.redirect_place is not None and sh.fs.place(path) == sh.redirect_place:
                    sh.error(f"{path}: input file is output file")  # (it would grow for ever)
                    continue
                decoder = codecs.getincrementaldecoder("utf-8")("replace")
                while True:
                    sh.check()
                    data = file.read(CHUNK)
                    sh.write_bytes(data, decoder)
                    if not data:
                        break
        except OSError as exc:
            sh.oserror(exc)
    return sh.status


def _line_count(args: list[str]) -> tuple[int, bool, bool, list[str]]:
    """(N, whether it was +N, whether -N, files) of ``head``/``tail`` arguments (the
    option ``-N`` is ``-n N``; ``-n -N`` is a negative count, ``-n -0`` included)."""
    args = [f"-n{arg[1:]}" if re.fullmatch(r"-[0-9]+", arg) and (i == 0 or args[i - 1] != "-n") else arg
            for i, arg in enumerate(args)]
    opts, paths = options(args, "n:")
    text = opts.get("-n", "10")
    if not re.fullmatch(r"[-+]?[0-9]+", text):
        raise Usage(f"invalid number of lines: {text!r}")
    count = int(text)  # (negative: head prints all but the last -N lines, tail the last -N)
    if not paths:
        raise Usage("missing file operand")
    return count, text.startswith("+"), text.startswith("-"), paths


@command("head", "head [-n N] FILE...", "print the first N lines (default 10; -n -N: all but the last N)")
def _head(sh, args):
    count, _, negative, paths = _line_count(args)

    def first_lines(file) -> bytes:
        lines = []
        if negative:  # all but the last -count lines
            pieces = file.read().split(b"\n")
            lines = [piece + b"\n" for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
            lines = lines[: max(0, len(lines) + count)]
        for _ in range(max(0, count)):
            line = file.readline()
            if not line:
                break
            lines.append(line)
        return b"".join(lines)

    return _print_each(sh, paths, first_lines)


@command("tail", "tail [-n N] FILE...", "print the last N lines (default 10; -n +N: from line N)")
def _tail(sh, args):
    count, from_start, _, paths = _line_count(args)
    return _print_each(sh, paths, lambda file: _from_line(sh, file, count) if from_start
                       else _last_lines(sh, file, abs(count)))


def _print_each(sh, paths: list[str], part) -> int:
    """head's and tail's loop: ``part(file)`` of each file, under a ``==> path <==``
    header when there are several, a blank line between two; a file that cannot be
    read has none (its error instead), so the first header shown has no line before it."""
    headed = False
    for path in paths:
        try:
            with sh.fs.open(path, "rb") as file:
                data = part(file)
        except OSError as exc:
            sh.oserror(exc)
            continue
        if len(paths) > 1:
            sh.write(("\n" if headed else "") + f"==> {path} <==\n")
            headed = True
        sh.write_bytes(data)
    return sh.status


def _from_line(sh, file, first: int) -> bytes:
    """Everything from line ``first`` (1-based; 0 is 1, as in tail) to the end."""
    for _ in range(max(0, first - 1)):
        sh.check()
        if not file.readline():
            return b""
    return file.read()


def _last_lines(sh, file, count: int) -> bytes:
    """The last ``count`` lines, reading backwards a chunk at a time (a file on the chip
    disk can be far bigger than what we want of it)."""
    if count == 0:
        return b""
    end = file.seek(0, os.SEEK_END)
    data = b""
    position = end
    while position > 0:
        sh.check()
        step = min(CHUNK, position)
        position -= step
        file.seek(position)
        data = file.read(step) + data
        # one more newline than lines wanted, unless the text ends without one
        wanted = count + 1 if data.endswith(b"\n") else count
        if data.count(b"\n") >= wanted:
            break
    lines = data.split(b"\n")  # (only \n ends a line: not \r, as splitlines has it)
    if lines[-1] == b"":
        lines.pop()
    return b"\n".join(lines[-count:]) + (b"\n" if data.endswith(b"\n") else b"")


@command("echo", "echo [-n] [WORD...]", "print words (> FILE writes them to a file)", paths=False)
def _echo(sh, args):
    newline = "\n"
    while args and re.fullmatch(r"-n+", args[0]):  # (-n -n, -nn: as bash's echo)
        newline, args = "", args[1:]
    sh.write(" ".join(args) + newline)
    return 0


@command("stat", "stat PATH...", "show a file's type, size, time and filesystem")
def _stat(sh, args):
    from ipuos.vfs import is_within  # (see shell/__init__: what the terminal imports)

    _opts, args = options(args, "")
    if not args:
        raise Usage("missing operand")
    mounts = sh.fs.vfs.mount_points()
    shown = 0  # (a blank line between two files' blocks, not before the first shown)
    for path in args:
        try:
            entry = sh.fs.entry(path)
        except OSError as exc:
            sh.oserror(exc)
            continue
        full = sh.fs.abspath(path)
        mount = max((m for m in mounts if is_within(full, m.path)), key=lambda m: len(m.path))
        where = f"{mount.path} ({mount.kind}: {mount.source.strip('<>')})"  # (as mount shows it)
        match = re.match(r"^/tiles/(\d+)", full)
        if match and mount.path == "/tiles":
            where += f", served by tile {match.group(1)}"
        modified = (_local_time(entry.mtime_ns, "%Y-%m-%d %H:%M:%S", sh.session.zone)
                    if entry.mtime_ns else "never recorded")
        sh.write(("\n" if shown else "")
                 + f"  File: {path}\n"
                 + f"  Path: {full}\n"
                 + f"  Type: {'directory' if entry.is_dir else 'regular file'}\n"
                 + f"  Size: {entry.size}\n"
                 + f"Modified: {modified}\n"
                 + f" Mount: {where}\n")
        shown += 1
    return sh.status


@command("tree", "tree [-a] [-L DEPTH] [PATH]", "show a directory tree (-a: names starting with . too)")
def _tree(sh, args):
    opts, paths = options(args, "aL:")
    if "-L" in opts and not re.fullmatch(r"0*[1-9][0-9]*", opts["-L"]):  # (as tree: a level is at least 1)
        raise Usage(f"invalid depth: {opts['-L']!r}")
    depth = int(opts["-L"]) if "-L" in opts else None
    if len(paths) > 1:
        raise Usage("one directory at a time")
    top = paths[0] if paths else "."
    if not sh.fs.entry(top).is_dir:
        sh.print(top)
        return 0
    counts = [0, 0]
    sh.print(top)
    _tree_below(sh, top, "", depth, counts, "-a" in opts)
    dirs, files = counts
    sh.print(f"\n{plural(dirs, 'directory', 'directories')}, {plural(files, 'file')}")
    return sh.status


def _tree_below(sh, path: str, prefix: str, depth: int | None, counts: list[int], show_all: bool) -> None:
    if depth is not None and depth <= 0:
        return
    sh.check()
    try:
        entries = sorted(sh.fs.entries(path), key=natural_order)
    except OSError as exc:
        sh.oserror(exc)
        return
    if not show_all:  # (as ls, and tree itself: hidden unless asked for)
        entries = [entry for entry in entries if not entry.name.startswith(".")]
    for index, entry in enumerate(entries):
        last = index == len(entries) - 1
        sh.print(f"{prefix}{'└── ' if last else '├── '}{sh.shown(entry.name)}{'/' if entry.is_dir else ''}")
        if entry.is_dir:
            counts[0] += 1
            _tree_below(sh, _join(path, entry.name), prefix + ("    " if last else "│   "),
                        None if depth is None else depth - 1, counts, show_all)
        else:
            counts[1] += 1


@command("du", "du [-s] [PATH...]", "bytes used by files under each directory")
def _du(sh, args):
    opts, paths = options(args, "s")
    for path in paths or ["."]:
        try:
            entry = sh.fs.entry(path)
        except OSError as exc:
            sh.oserror(exc)
            continue
        if entry.is_dir:
            # from the root, /tiles/0 is tile 0's own disk a second time: count it once
            skip = ("/tiles/0",) if sh.fs.abspath(path) == "/" else ()
            _du_below(sh, path, "-s" not in opts, top=True, skip=skip)
        else:
            sh.print(f"{human_size(entry.size)}\t{path}")
    return sh.status


def _du_below(sh, path: str, every: bool, top: bool = False, skip: tuple = ()) -> int:
    sh.check()
    total = 0
    try:
        entries = sh.fs.entries(path)
    except OSError as exc:
        sh.oserror(exc)
        return 0
    for entry in sorted(entries, key=natural_order):  # (as ls and tree: /tiles/2 before /tiles/10)
        if entry.is_dir:
            child = _join(path, entry.name)
            if not skip or sh.fs.abspath(child) not in skip:
                total += _du_below(sh, child, every, skip=skip)
        else:
            total += entry.size
    if every or top:
        sh.print(f"{human_size(total)}\t{path}")
    return total
