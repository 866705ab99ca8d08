"""The tile runtime: what a Python program sees when it runs on a tile.

Each tile runs the program in its own namespace holding ``__tileid``, ``__numtiles``,
``__tiledata``, the exchange primitives, a ``print`` captured per tile (bounded, with an
explicit truncation marker), and ``open`` bound to the tile's own files, as ``import os``
is (the storage layer adds them through ``TileProgram.setup``; see ``ipuos.vfs``). ``import`` is
guarded: pure-compute standard modules work, and so do modules stored on the tile's files;
modules that reach the host (sys, subprocess, socket ...) fail with an ImportError that
says why, and the standard modules a program gets hold none of them (nor the host's
builtins), nor does a pickle loaded on the tile name them. Each tile has its own
builtins too, so ``exec``'d code prints, opens and imports as the tile, and its own
``random``, ``pprint`` (the standard ``pprint`` writes to the host's stdout), ``csv``
field size limit, ``decimal.DefaultContext``, ``reprlib.aRepr`` and copyreg dispatch
table (otherwise the whole process's).
This is a guard rail that keeps honest programs honest, not a security boundary:
CPython cannot be sandboxed from inside itself.
"""

from __future__ import annotations

import _compat_pickle
import ast
import builtins
import calendar
import contextlib
import contextvars
import copyreg
import csv
import decimal
import importlib
import io
import itertools
import linecache
import pickle
import pprint
import random
import re
import reprlib
import sys
import traceback
import types
from dataclasses import dataclass, field
from typing import Callable

import greenlet

from ipuos.scheduler import (TILE_GLOBALS_MARKER, TILE_SOURCE_LINES, CollectiveMismatchError, ComputeBudgetExceeded,
                             DeadlockError, ExchangeError, JobAborted, ProgramGlobals, TileAPI, TileFailed,
                             TileInterrupt, TilePickler, TileUnpickler, ctrl_c_dropped,
                             ctrl_cs_dropped_are_told, ended_call)

from ._plural import plural
from ._truncation import truncation_note
from ._rebind import with_globals
from ._runresult import EXIT_INTERRUPTED
from ._source import source_text
from ._tilecsv import TILE_CSV_NAMES

#: standard modules that only compute: importable on a tile
TILE_MODULES = frozenset(
    """
    __future__ abc array base64 binascii bisect calendar cmath collections colorsys
    contextlib copy copyreg csv
    dataclasses datetime decimal difflib enum errno fnmatch fractions functools graphlib
    hashlib heapq hmac html ipaddress itertools json keyword math numbers operator pickle
    pprint random re reprlib secrets stat statistics string struct textwrap types typing
    unicodedata weakref zlib
    """.split()
)

#: modules whose import gets the "no host access" explanation rather than "not available"
HOST_MODULES = frozenset(
    """
    os sys subprocess socket shutil pathlib builtins importlib ctypes signal threading
    multiprocessing asyncio tempfile glob fcntl select selectors mmap resource pty tty
    termios posix pwd grp inspect gc linecache traceback codecs urllib http ftplib smtplib
    ssl sqlite3 shelve dbm webbrowser time sched
    """.split()
)

DEFAULT_OUTPUT_LIMIT = 64 * 1024


class OutputBuffer:
    """A tile's captured ``print`` output, capped at ``limit`` characters.

    ``sink``: where output goes as it is printed (the shell's ``python`` shows a block's
    output while it runs), counted against the cap all the same; it returns False for
    text it cannot pass on now, which is then kept here, as all text is without one."""

    __slots__ = ("limit", "sink", "_parts", "_size", "_dropped")

    def __init__(self, limit: int | None = DEFAULT_OUTPUT_LIMIT, sink: Callable[[str], bool] | None = None):
        self.limit = limit if limit is not None else float("inf")  # (None: no limit)
        self.sink = sink
        self._parts: list[str] = []
        self._size = 0
        self._dropped = 0

    def write(self, text: str) -> int:
        room = self.limit - self._size
        kept = text if len(text) <= room else text[:max(room, 0)]
        if kept:
            self._size += len(kept)
            if self.sink is None or not self.sink(kept):
                self._parts.append(kept)
        self._dropped += len(text) - len(kept)
        return len(text)

    def flush(self) -> None:
        pass

    def getvalue(self) -> str:
        text = "".join(self._parts)
        if self._dropped:
            if text and not text.endswith("\n"):
                text += "\n"
            text += truncation_note(self._dropped)
        return text

    def take(self) -> str:
        """Return everything so far and start afresh (the multirepl, line by line)."""
        text = self.getvalue()
        self._parts.clear()
        self._size = 0
        self._dropped = 0
        return text


class TileContext:
    """Per-tile runtime state, reachable from the program's globals (and so from imports)."""

    __slots__ = ("_api", "_tile", "_job", "output", "stdout", "stderr", "modules", "extras", "cleanups",
                 "builtins", "context", "stops_ignored", "dispatch_table", "ended")

    def __init__(self, api: TileAPI, output: OutputBuffer):
        self.api = api
        #: the tile's output (what the run reports); ``stdout`` is where ``print`` writes
        #: and ``stderr`` where Python's reports of errors it ignores go: the output,
        #: unless the program redirects them (its contextlib.redirect_stdout)
        self.output = self.stdout = self.stderr = output
        #: this tile's own builtins: a program that changes one (``__builtins__['len'] =
        #: ...``) changes it for itself alone, and code it runs with ``exec(src, {})``
        #: still prints, opens and imports as the tile
        self.builtins = dict(TILE_BUILTINS)
        self.builtins["print"] = self.print
        self.builtins["input"] = self.input
        self.builtins["__import__"] = self.import_module
        self.builtins["help"] = self.help
        #: modules this tile has its own copy of (random: per-tile generator state)
        self.modules: dict[str, types.ModuleType] = {}
        #: what layers above add: ``__names__`` (names in every namespace, e.g. open),
        #: ``__modules__`` (top-level name -> provider(name, fromlist), e.g. os),
        #: ``__find_module__`` (finder(name, fromlist) -> module or None, asked last) and
        #: ``__resume__``/``__suspend__`` (called as a repl's later block starts / any ends)
        #: and ``__closed__`` (the repl has ended without its tiles, whose cleanups did not run)
        self.extras: dict[str, object] = {}
        #: called when the program ends, on the tile (files left open are closed); each
        #: returns messages for the program's output, or None
        self.cleanups: list[Callable[[], list[str] | None]] = []
        #: the context variables the program sees (decimal's precision is one): the tile's
        #: greenlet outlives its programs, and the next must not inherit this one's
        self.context = contextvars.Context()
        #: while the program ends (see :func:`_end_on_tile`): the stops (an interrupt, a
        #: compute budget, another tile's failure) that its ``__del__`` methods could not
        #: raise; None otherwise
        self.stops_ignored: list[BaseException] | None = None
        #: copyreg's table of the program's own, once it imports copyreg (see
        #: _tile_copyreg); until then the host's, which it cannot change, applies
        self.dispatch_table: dict | None = None
        #: the program (or repl session) has ended (see :attr:`running`)
        self.ended = False

    def enter(self, tile) -> contextvars.Context:
        """Make this context the tile's (on its greenlet); returns the one to restore."""
        outer, tile.glet.gr_context = tile.glet.gr_context, self.context
        return outer

    def import_module(self, name, globals=None, locals=None, fromlist=(), level=0):
        """``__import__`` on this tile (whatever the importing code's globals are)."""
        return _tile_import(self, name, globals, locals, fromlist, level)

    def use_output(self, output: OutputBuffer) -> None:
        """Make ``output`` the tile's output (each block of a repl has its own); where
        the program has redirected ``stdout`` or ``stderr`` elsewhere, they stay there."""
        previous, self.output = self.output, output
        if self.stdout is previous:
            self.stdout = output
        if self.stderr is previous:
            self.stderr = output

    def warn(self, message: str) -> None:
        """Tell the program's output of a problem the runtime or a layer above met for it
        (a file it left that failed to close)."""
        self.output.write(f"warning: {message}\n")

    @property
    def api(self) -> TileAPI:
        """The primitives of the job the program (a repl's block) runs in."""
        return self._api

    @api.setter
    def api(self, api: TileAPI) -> None:
        # (kept beside it for :attr:`running`, which every print tests)
        self._api, self._tile, self._job = api, api.tile, api.job

    @property
    def running(self) -> bool:
        """The program (a repl session's block) runs on its tile, and what it prints is
        read. Not once it has ended, nor between a repl's blocks: then only the
        ``__del__`` of an object that outlived it in a reference cycle, run wherever
        Python's cycle collector next runs (another job, a host thread), can still call
        its print, which refuses, as its files and primitives do."""
        return not self.ended and self._tile.job is self._job

    def write(self, text: str) -> int:
        """The tile's standard output as a stream (``print(file=...)``, ``pprint``)."""
        if self.ended or self._tile.job is not self._job:  # (not running: written out)
            self._refuse("print()")
        return self.stdout.write(text)

    def _refuse(self, what: str) -> None:
        raise RuntimeError(ended_call(what, f"tile {self.api.physical_tile}"))

    def flush(self) -> None:
        pass

    def input(self, prompt="") -> str:
        """As the host's ``input`` at the end of its input: the prompt is written (to
        the tile's output), then EOFError."""
        if prompt:
            self.print(prompt, end="")
        _no_input()

    def help(self, *args) -> None:
        """An object's documentation, printed as the tile prints (Python's own help pages
        it through the host's terminal, and looks names up among the host's modules)."""
        if len(args) > 1:
            raise TypeError(f"help() takes at most 1 argument ({len(args)} given)")
        if not args or isinstance(args[0], str):
            self.print("On a tile, help(object) shows an object's documentation: help(len), help(os.path); "
                       "the interactive help utility and help('name') are not available (nor is a pager).")
            return
        import pydoc  # (here: it imports much, and few programs ask for help)

        self.print(pydoc.render_doc(args[0], renderer=pydoc.plaintext), end="")

    def print(self, *args, sep=" ", end="\n", file=None, flush=False) -> None:
        if self.ended or self._tile.job is not self._job:  # (not running: written out)
            self._refuse("print()")
        sep = " " if sep is None else sep
        end = "\n" if end is None else end
        for name, value in (("sep", sep), ("end", end)):
            if not isinstance(value, str):  # (in print's own words)
                raise TypeError(f"{name} must be None or a string, not {type(value).__name__}")
        stream = self.stdout if file is None else file
        stream.write(sep.join(map(str, args)) + end)
        if flush:
            stream.flush()

    print.__qualname__ = "print"  # (a wrong call's TypeError says print(), as Python's)


def _tile_random(ctx: TileContext) -> types.ModuleType:
    """A private ``random`` module: tiles must not share one generator's state."""
    module = types.ModuleType("random", random.__doc__)
    generator = random.Random()
    for name in dir(random):
        if name.startswith("_"):
            continue
        value = getattr(random, name)
        bound = getattr(value, "__self__", None)
        if isinstance(bound, random.Random):
            value = getattr(generator, name)
        setattr(module, name, value)
    return module


#: ``calendar``'s public names beyond ``__all__`` (not ``main``: it reads the host's argv)
_CALENDAR_EXTRAS = ("formatstring", "error", "mdays", "EPOCH", "different_locale", "January", "February")


def _tile_calendar(ctx: TileContext) -> types.ModuleType:
    """A ``calendar`` of the program's own: its first weekday (the standard module's is
    the whole process's: every tile's and the host's), and printing functions and
    classes that write to the tile's output (the standard ones print to the host's)."""
    module = types.ModuleType("calendar", calendar.__doc__)
    for name in (*calendar.__all__, *_CALENDAR_EXTRAS):
        if hasattr(calendar, name):
            setattr(module, name, getattr(calendar, name))

    class PrintsOnTheTile:
        def prweek(self, *args, **kwargs):
            ctx.write(self.formatweek(*args, **kwargs))

        def prmonth(self, *args, **kwargs):
            ctx.write(self.formatmonth(*args, **kwargs))

        def pryear(self, *args, **kwargs):
            ctx.write(self.formatyear(*args, **kwargs))

    class TextCalendar(PrintsOnTheTile, calendar.TextCalendar):
        __doc__ = calendar.TextCalendar.__doc__

    class LocaleTextCalendar(PrintsOnTheTile, calendar.LocaleTextCalendar):
        __doc__ = calendar.LocaleTextCalendar.__doc__

    shared = TextCalendar()  # what the module's functions use, as the standard module's ``c``
    for name in dir(calendar):
        function = getattr(calendar, name)
        if getattr(function, "__self__", None) is calendar.c:
            setattr(module, name, getattr(shared, function.__name__))

    def setfirstweekday(firstweekday):
        if not calendar.MONDAY <= firstweekday <= calendar.SUNDAY:
            raise calendar.IllegalWeekdayError(firstweekday)
        shared.firstweekday = firstweekday

    def format(cols, colwidth=calendar._colwidth, spacing=calendar._spacing):
        ctx.write(calendar.formatstring(cols, colwidth, spacing) + "\n")

    module.__dict__.update(TextCalendar=TextCalendar, LocaleTextCalendar=LocaleTextCalendar,
                           setfirstweekday=setfirstweekday, format=format)
    return module


def _tile_csv(ctx: TileContext) -> types.ModuleType:
    """The program's copy of ``csv`` (see :func:`_programs_copy`) with a field size limit
    of its own: the standard module's is the whole process's, and one program's
    ``field_size_limit(n)`` was every tile's, later programs' and the host's. Its
    readers (``DictReader``'s and ``Sniffer``'s too) apply it as they parse each row."""
    module = _programs_copy(ctx, csv)
    vars(module).update(TILE_CSV_NAMES)
    return module


def _tile_pprint(ctx: TileContext) -> types.ModuleType:
    """A ``pprint`` whose output, by default, is the tile's (the standard one writes to
    the host's ``sys.stdout``: the daemon's log)."""
    module = types.ModuleType("pprint", pprint.__doc__)
    for name in pprint.__all__:
        setattr(module, name, getattr(pprint, name))

    class PrettyPrinter(pprint.PrettyPrinter):
        def __init__(self, indent=1, width=80, depth=None, stream=None, **options):
            super().__init__(indent, width, depth, ctx if stream is None else stream, **options)

    def pprint_(object, stream=None, *args, **options):
        pprint.pprint(object, ctx if stream is None else stream, *args, **options)

    def pp(object, *args, sort_dicts=False, **options):
        pprint_(object, *args, sort_dicts=sort_dicts, **options)

    PrettyPrinter.__name__ = PrettyPrinter.__qualname__ = "PrettyPrinter"
    pprint_.__name__ = pprint_.__qualname__ = "pprint"
    module.PrettyPrinter, module.pprint, module.pp = PrettyPrinter, pprint_, pp
    return module


#: what a tile's ``io`` offers: in-memory streams and the classes and constants that go
#: with them. Not FileIO or open_code (host files), nor the host's open
_TILE_IO_NAMES = (
    "StringIO", "BytesIO", "TextIOWrapper", "IOBase", "RawIOBase", "BufferedIOBase", "TextIOBase",
    "UnsupportedOperation", "BlockingIOError", "SEEK_SET", "SEEK_CUR", "SEEK_END",
    "DEFAULT_BUFFER_SIZE", "IncrementalNewlineDecoder", "text_encoding",
)


def _tile_io(ctx: TileContext) -> types.ModuleType:
    """``io`` on a tile: ``io.StringIO``, ``io.BytesIO`` and the rest of its in-memory
    part, and ``io.open``, which is the tile's ``open`` (its files, never the host's)."""
    module = types.ModuleType("io", io.__doc__)
    for name in _TILE_IO_NAMES:
        if hasattr(io, name):  # (text_encoding is 3.10+)
            setattr(module, name, getattr(io, name))

    def open(*args, **kwargs):
        return ctx.builtins["open"](*args, **kwargs)

    open.__doc__ = "The tile's open (its own files)."
    module.open = open
    return module


def _tile_pickle(ctx: TileContext) -> types.ModuleType:
    """``pickle`` that knows the program's own classes and functions: the host's looks
    for them in the host's ``__main__`` and fails. They are written by name and found
    again in the loading tile's program, as the exchange sends them (so a file pickled by
    one run loads in another run of the same program, on any tile)."""
    module = types.ModuleType("pickle", pickle.__doc__)
    for name in ("PickleError", "PicklingError", "UnpicklingError", "PickleBuffer", "HIGHEST_PROTOCOL",
                 "DEFAULT_PROTOCOL"):
        setattr(module, name, getattr(pickle, name))

    class Pickler(TilePickler):
        def __init__(self, file, protocol=None, **options):
            super().__init__(file, protocol, program=ctx.api.tile.program_globals, **options)
            if ctx.dispatch_table is not None and getattr(self, "dispatch_table", None) is None:
                self.dispatch_table = ctx.dispatch_table  # (a subclass's own table wins, as in pickle)

    class Unpickler(TileUnpickler):
        def __init__(self, file, **options):
            super().__init__(file, ctx.api.tile.program_globals, **options)

    def dump(obj, file, protocol=None, **options) -> None:
        Pickler(file, protocol, **options).dump(obj)

    def dumps(obj, protocol=None, **options) -> bytes:
        out = io.BytesIO()
        dump(obj, out, protocol, **options)
        return out.getvalue()

    def load(file, **options):
        return Unpickler(file, **options).load()

    def loads(data, /, **options):
        return load(io.BytesIO(data), **options)

    Pickler.__qualname__, Unpickler.__qualname__ = "Pickler", "Unpickler"
    module.__dict__.update(Pickler=Pickler, Unpickler=Unpickler, dump=dump, dumps=dumps, load=load,
                           loads=loads)
    return module


def _tile_contextlib(ctx: TileContext) -> types.ModuleType:
    """The program's copy of ``contextlib`` (see :func:`_programs_copy`) whose
    ``redirect_stdout``/``redirect_stderr`` redirect the tile's ``print`` (and error
    reports) and whose ``chdir`` changes the tile's current directory. The standard ones
    change the host's ``sys.stdout`` (the daemon's, which every tile and its threads
    share, for as long as the block lasts, exchanges included, while the tile's print
    went on to its output) and the host's current directory.

    They are classes of the program's own, made when it first names one: made with
    the copy, they would make every import of contextlib several times dearer."""
    module = _programs_copy(ctx, contextlib)
    names = vars(module)
    own = [name for name in ("redirect_stdout", "redirect_stderr", "chdir") if names.pop(name, None) is not None]
    copys_getattr = names.get("__getattr__")

    def __getattr__(name: str):
        if name in own:
            names.update(_contextlib_on_the_tile(ctx))
            return names[name]
        if copys_getattr is None:
            raise AttributeError(f"module 'contextlib' has no attribute {name!r}")
        return copys_getattr(name)

    names["__getattr__"] = __getattr__
    return module


def _contextlib_on_the_tile(ctx: TileContext) -> dict[str, type]:
    """The classes of :func:`_tile_contextlib`, by name."""

    class _RedirectStream:
        _stream = ""

        def __init__(self, new_target):
            self._new_target = new_target
            self._old_targets = []  # (a stack: the same object may be entered again)

        def __enter__(self):
            old = getattr(ctx, self._stream)
            # (the tile's output as None: a repl's next block has another, see use_output)
            self._old_targets.append(None if old is ctx.output else old)
            setattr(ctx, self._stream, _NO_OUTPUT if self._new_target is None else self._new_target)
            return self._new_target

        def __exit__(self, exctype, excinst, exctb):
            old = self._old_targets.pop()
            setattr(ctx, self._stream, ctx.output if old is None else old)

    class redirect_stdout(_RedirectStream):
        __doc__ = contextlib.redirect_stdout.__doc__
        _stream = "stdout"

    class redirect_stderr(_RedirectStream):
        __doc__ = contextlib.redirect_stderr.__doc__
        _stream = "stderr"

    class chdir:
        __doc__ = getattr(contextlib, "chdir", None).__doc__  # (Python 3.11+: the copy has none before)

        def __init__(self, path):
            self.path = path
            self._old_cwd = []

        def __enter__(self):
            os = ctx.import_module("os")  # (the tile's)
            self._old_cwd.append(os.getcwd())
            os.chdir(self.path)

        def __exit__(self, *excinfo):
            ctx.import_module("os").chdir(self._old_cwd.pop())

    return {"redirect_stdout": redirect_stdout, "redirect_stderr": redirect_stderr, "chdir": chdir}


class _NoOutput:
    """Where ``redirect_stdout(None)`` sends the tile's print: nowhere (as Python's
    print, with no ``sys.stdout``)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


_NO_OUTPUT = _NoOutput()


def _tile_copyreg(ctx: TileContext) -> types.ModuleType:
    """The program's copy of ``copyreg`` (see :func:`_programs_copy`) with a dispatch
    table of its own: ``copyreg.pickle(cls, reducer)`` applies to the program's pickling
    and what it sends, and ends with it. The standard table is the whole process's: a
    program's reducers applied to every later job's exchange data and to the kernel's
    replies, and stayed there. Extension codes are the whole process's too (pickle reads
    the standard registry), so a program cannot add or remove them. (``copy.copy`` and
    ``copy.deepcopy`` still use the standard table, not the program's registrations.)"""
    module = _programs_copy(ctx, copyreg)
    table = ctx.dispatch_table = dict(copyreg.dispatch_table)
    namespace = {**vars(copyreg), "dispatch_table": table}
    module.__dict__.update(dispatch_table=table, pickle=with_globals(copyreg.pickle, namespace),
                           add_extension=_no_extension_codes, remove_extension=_no_extension_codes)
    return module


def _no_extension_codes(*args, **kwargs):
    raise NotImplementedError(
        "copyreg's extension codes are the whole machine's (pickle reads one registry on every tile and "
        "the host), so a program on a tile cannot add or remove them; its objects pickle without them")


def _tile_decimal(ctx: TileContext) -> types.ModuleType:
    """The program's copy of ``decimal`` with a ``DefaultContext`` (and BasicContext,
    ExtendedContext) of its own: the standard ones are the whole process's, and one
    program's ``DefaultContext.prec = 3`` was every later program's precision, on
    every tile. Arithmetic is the standard module's, as fast.

    As on the host, the program's context starts as its DefaultContext: until the
    program first asks for its context, its DefaultContext is the one in force (a
    change to it applies, as it would to a thread not yet started), then a copy."""
    module = _programs_copy(ctx, decimal)
    default, basic, extended = (decimal.DefaultContext.copy(), decimal.BasicContext.copy(),
                                decimal.ExtendedContext.copy())
    default.clear_flags()

    def getcontext():
        context = decimal.getcontext()
        if context is default:  # (asked for first: the program's own from now on, as on the host)
            context = default.copy()
            default.clear_flags()
            decimal.setcontext(context)
        return context

    def setcontext(context, /):
        # (as the standard one: a template set is copied, so that it stays a template)
        decimal.setcontext(context.copy() if context is default or context is basic or context is extended
                           else context)

    getcontext.__doc__, setcontext.__doc__ = decimal.getcontext.__doc__, decimal.setcontext.__doc__
    module.__dict__.update(DefaultContext=default, BasicContext=basic, ExtendedContext=extended,
                           getcontext=getcontext, setcontext=setcontext)
    decimal.setcontext(default)  # (in the program's context variables: see TileContext.context)
    return module


def _tile_reprlib(ctx: TileContext) -> types.ModuleType:
    """The program's copy of ``reprlib`` with an ``aRepr`` of its own, which
    ``reprlib.repr`` uses: the standard one is the whole process's, and one program's
    ``aRepr.maxlist = 2`` shortened every later program's reprs (and the host's)."""
    module = _programs_copy(ctx, reprlib)
    module.aRepr = reprlib.Repr()
    module.repr = module.aRepr.repr
    return module


_PER_TILE_MODULES: dict[str, Callable[[TileContext], types.ModuleType]] = {
    "pickle": _tile_pickle,
    "random": _tile_random,
    "pprint": _tile_pprint,
    "io": _tile_io,
    "calendar": _tile_calendar,
    "csv": _tile_csv,
    "contextlib": _tile_contextlib,
    "copyreg": _tile_copyreg,
    "decimal": _tile_decimal,
    "reprlib": _tile_reprlib,
}


def _programs_copy(ctx: TileContext, module: types.ModuleType) -> types.ModuleType:
    """The program's own copy of a standard module: a name it rebinds there
    (``functools.reduce = ...``, ``collections.deque = None``) is its own. Rebound in the
    module every tile and the machine share, it would reach the other tiles, later
    programs and the machine's own code. The module's functions still see their own
    module's names, as before the rebinding.

    What the module holds of the host is not in the copy (see :class:`_CopyPlan`): its
    ``__builtins__`` are the tile's, and the modules it refers to (``typing.sys``,
    ``json.decoder``) are the tile's own versions, or absent where tiles have none."""
    copy = ctx.modules.get(module.__name__)
    if copy is None:
        plan = _copy_plan(module)
        copy = ctx.modules[module.__name__] = types.ModuleType(module.__name__)
        names = vars(copy)
        names.update(plan.names)
        if plan.has_builtins:
            names["__builtins__"] = ctx.builtins
        for name, builtin in plan.builtins:
            if builtin in ctx.builtins:
                names[name] = ctx.builtins[builtin]
        if plan.on_demand:
            names["__getattr__"] = _names_on_demand(ctx, copy, plan.on_demand, plan.names.get("__getattr__"))
    return copy


#: the modules whose functions a module copy never holds, beyond HOST_MODULES: the host's
#: files and processes under other names (``io.open``, ``posix.system``)
_HOST_FUNCTION_MODULES = HOST_MODULES | {"io", "_io", "posix", "nt"}


class _CopyPlan:
    """How to make a program's copy of one standard module, worked out once for every
    tile and program that imports it (a copy is one dict update then).

    ``names``: what the copy starts with, not the module's loader (``__loader__`` and
    ``__spec__`` are None: a loader reads any host file and loads any built-in module)
    nor ``__builtins__`` (``has_builtins``: the copy has the tile's). ``builtins``: (name,
    builtin's name) for the host's builtins the module holds, the tile's in the copy.
    ``on_demand``: what the copy gives only when asked, by name: the modules the module
    refers to (the tile's own versions: copying them all at once would make every import
    many times dearer) and the host's functions (never)."""

    __slots__ = ("module", "size", "names", "has_builtins", "builtins", "on_demand")

    def __init__(self, module: types.ModuleType):
        self.module = module
        self.size = len(vars(module))  # (a module that gains names later, e.g. a submodule, is planned anew)
        self.names: dict = {}
        self.builtins: list[tuple[str, str]] = []
        self.on_demand: dict = {}
        self.has_builtins = "__builtins__" in vars(module)
        for name, value in vars(module).items():
            if name in ("__builtins__", "__loader__", "__spec__"):
                continue
            if isinstance(value, types.ModuleType):
                self.on_demand[name] = value
            elif _is_host_function(value):
                if getattr(builtins, value.__name__, None) is value:
                    self.builtins.append((name, value.__name__))
                else:
                    self.on_demand[name] = value
            else:
                self.names[name] = value


def _is_host_function(value) -> bool:
    return (isinstance(value, (types.FunctionType, types.BuiltinFunctionType))
            and (getattr(value, "__module__", None) or "").partition(".")[0] in _HOST_FUNCTION_MODULES)


_COPY_PLANS: dict[str, _CopyPlan] = {}


def _copy_plan(module: types.ModuleType) -> _CopyPlan:
    plan = _COPY_PLANS.get(module.__name__)
    if plan is None or plan.module is not module or plan.size != len(vars(module)):
        plan = _COPY_PLANS[module.__name__] = _CopyPlan(module)
    return plan


def _names_on_demand(ctx: TileContext, copy: types.ModuleType, on_demand: dict, module_getattr):
    """The ``__getattr__`` (PEP 562) of a program's module copy, which Python calls only
    for a name the copy lacks: one of ``on_demand`` (see :class:`_CopyPlan`), else the
    module's own ``__getattr__``, if it has one."""

    def __getattr__(name: str):
        value = on_demand.get(name, _MISSING)
        if value is _MISSING:
            if module_getattr is not None:
                return module_getattr(name)
            raise AttributeError(f"module {copy.__name__!r} has no attribute {name!r}")
        own = _tiles_module(ctx, value) if isinstance(value, types.ModuleType) else None
        if own is None:
            what = f"module {value.__name__!r}" if isinstance(value, types.ModuleType) else (
                f"{value.__module__}.{value.__name__}")
            raise AttributeError(f"module {copy.__name__!r} has no attribute {name!r} on a tile: on the host it is "
                                 f"{what}, and tiles have no access to the host")
        setattr(copy, name, own)
        return own

    return __getattr__


def _tiles_module(ctx: TileContext, module: types.ModuleType) -> types.ModuleType | None:
    """What the program's ``import`` of a standard ``module`` gives (its copy, or the
    tile's own version), or None if a tile cannot import it."""
    name = module.__name__
    if name in _PER_TILE_MODULES:
        return _per_tile_module(ctx, name)
    if name.partition(".")[0] in TILE_MODULES:
        return _programs_copy(ctx, module)
    return None


def _per_tile_module(ctx: TileContext, name: str) -> types.ModuleType:
    module = ctx.modules.get(name)
    if module is None:
        module = ctx.modules[name] = _PER_TILE_MODULES[name](ctx)
    return module


def _import_copies(ctx: TileContext, name: str, fromlist, module: types.ModuleType) -> types.ModuleType:
    """What ``import name`` / ``from name import fromlist`` gives the program, made of
    its copies (:func:`_programs_copy`), ``module`` being what the import system gave.
    The submodules the statement names are copies too, reached from their parents'
    (only those: copying every submodule ``re`` has made its import 10x dearer)."""
    copy = _programs_copy(ctx, module)
    if fromlist:
        for item in fromlist:
            submodule = sys.modules.get(f"{module.__name__}.{item}")
            if submodule is not None and vars(module).get(item) is submodule:
                setattr(copy, item, _programs_copy(ctx, submodule))
        return copy
    parent, path = copy, module.__name__
    for part in name.split(".")[1:]:
        path += "." + part
        child = _programs_copy(ctx, sys.modules[path])
        setattr(parent, part, child)
        parent = child
    return copy


def _tile_import(ctx: TileContext, name, globals=None, locals=None, fromlist=(), level=0):
    if type(name) is not str or not name:
        _check_module_name(name, level)
    if level:
        raise ImportError("relative imports are not supported on tiles")
    top = name.partition(".")[0]
    provider = ctx.extras.get("__modules__", {}).get(top)
    if provider is not None:
        return provider(name, fromlist)
    if top in _PER_TILE_MODULES and name == top:
        return _per_tile_module(ctx, top)
    if top in TILE_MODULES:
        return _import_copies(ctx, name, fromlist, importlib.__import__(name, globals, locals, fromlist, level))
    finder = ctx.extras.get("__find_module__")
    if finder is not None:
        module = finder(name, fromlist)
        if module is not None:
            return module
    if top in HOST_MODULES:
        raise ImportError(
            f"module {top!r} is not available on a tile: tiles have no access to the host "
            "(their own files arrive through the tile's open() and os)",
            name=name,
        )
    if top in sys.stdlib_module_names:
        have = sorted(m for m in TILE_MODULES | set(_PER_TILE_MODULES) | set(ctx.extras.get("__modules__", {}))
                      if not m.startswith("_"))
        raise ModuleNotFoundError(
            f"module {top!r} of the standard library is not on tiles; the standard modules they "
            f"have: {', '.join(have)}",
            name=name,
        )
    raise ModuleNotFoundError(
        f"no module named {name!r} on this tile (pure-compute standard modules such as math, "
        "random, json, re, collections, itertools work; so do modules stored on the tile "
        "as NAME.py or NAME/__init__.py in its current directory or /lib)",
        name=name,
    )


def _check_module_name(name, level) -> None:
    """Refuse what the host's ``__import__`` refuses before looking for a module."""
    if not isinstance(name, str):
        raise TypeError("module name must be a string")
    if not name and not level:
        raise ValueError("Empty module name")


def _no_input(*args, **kwargs):
    raise EOFError("tiles have no terminal input: pass data with --data (it arrives as __tiledata)")


def _host_open(*args, **kwargs):
    raise PermissionError("tiles have no access to the host's files; this tile has no filesystem")


def _tile_exit(code=None):
    """``exit``/``quit`` on a tile: end the program with ``code``. (The site module's
    versions close the host process's ``sys.stdin`` first.)"""
    raise SystemExit(code)


def _tile_dir(*args):
    """``dir``: without an argument, the caller's names but the runtime's own (the
    markers a program's globals carry, TILE_GLOBALS_MARKER and TILE_SOURCE_LINES)."""
    if args:
        return dir(*args)
    return sorted(name for name in sys._getframe(1).f_locals
                  if name not in (TILE_GLOBALS_MARKER, TILE_SOURCE_LINES))


def _make_builtins() -> dict:
    table = dict(builtins.__dict__)
    table["dir"] = _tile_dir
    del table["__import__"]  # each TileContext binds its own (see TileContext.import_module)
    table["input"] = _no_input
    table["open"] = _host_open
    table["exit"] = table["quit"] = _tile_exit
    # the host's importer of built-in modules (load_module('posix') is the host's os)
    for name in ("help", "breakpoint", "copyright", "credits", "license", "__loader__", "__spec__"):
        table.pop(name, None)
    table.update((error.__name__, error) for error in TILE_ERRORS)
    return table


#: what the exchange and the scheduler raise in tile programs, by name there, as the
#: host's own exceptions are (a program catches ``ComputeBudgetExceeded`` to save its work)
TILE_ERRORS = (ExchangeError, DeadlockError, CollectiveMismatchError, JobAborted, TileInterrupt,
               ComputeBudgetExceeded, TileFailed)


TILE_BUILTINS = _make_builtins()


#: what a script's module namespace starts with (its docstring, if any, replaces __doc__
#: as it runs; without these, __doc__ found the builtins module's and __spec__ was a NameError)
_SCRIPT_NAMES = {"__name__": "__main__", "__doc__": None, "__package__": None, "__spec__": None}


def make_namespace(api: TileAPI, ctx: TileContext, tiledata: str = "") -> dict:
    """A fresh module namespace for one tile's program."""
    names = ctx.extras.get("__names__", {})
    ctx.builtins.update(names)
    namespace = {
        **_SCRIPT_NAMES,
        "__builtins__": ctx.builtins,
        TILE_GLOBALS_MARKER: ctx,
        "print": ctx.print,
        "__tiledata": tiledata,
    }
    bind_primitives(namespace, ctx, api)
    namespace.update(names)
    return namespace


def module_namespace(ctx: TileContext, name: str, filename: str, code) -> dict:
    """The namespace of a module a tile imports from its own files (``code``, compiled):
    tile code like the program, under its own name. ``print``, ``open`` and the primitives
    come from the tile's builtins, not its globals: they are always the running job's (a
    multirepl block's, not the one that imported the module), and ``from module import *``
    copies only the module's own names, as on the host."""
    namespace = {"__name__": name, "__file__": filename, "__builtins__": ctx.builtins, TILE_GLOBALS_MARKER: ctx}
    mangled = mangled_tile_names(code)
    if mangled:
        bind_mangled(mangled, namespace, ctx.builtins)
    return namespace


#: the TileAPI methods tile code calls by name to synchronise and exchange
PRIMITIVES = ("sync", "barrier", "send", "recv", "sendrecv", "poll", "alltoall", "allgather", "bcast",
              "gather", "scatter", "reduce", "allreduce", "scan", "exscan")


def bind_primitives(namespace: dict, ctx: TileContext, api: TileAPI) -> None:
    """Point the job-dependent names at ``api`` (a repl reuses namespaces): in the
    program's namespace, and in the tile's builtins, where its modules find them."""
    primitives = {name: getattr(api, name) for name in PRIMITIVES}
    primitives.update(__tileid=api.tileid, __numtiles=api.numtiles, __physical_tile=api.physical_tile)
    namespace.update(primitives)
    ctx.builtins.update(primitives)


#: the tile's names that start with two underscores (see mangled_tile_names)
_DUNDER_TILE_NAMES = ("__tileid", "__numtiles", "__physical_tile", "__tiledata", "__args")


def mangled_tile_names(*codes) -> dict[str, str]:
    """``{mangled: name}`` for the tile's names as ``codes`` (and the code nested in them)
    look them up inside a class. Python rewrites a name that starts with two underscores
    in a class body or method (``__tileid`` in ``class Worker`` is ``_Worker__tileid``);
    binding those spellings too lets a program's classes use the tile's names as its
    functions do. Computed once per compiled program, applied per tile by bind_mangled."""
    found = {}
    pending = [code for code in codes if code is not None]
    while pending:
        code = pending.pop()
        for name in code.co_names:
            if name[:1] == "_" and name[1:2] != "_":
                for tile_name in _DUNDER_TILE_NAMES:
                    if name.endswith(tile_name) and len(name) > len(tile_name) + 1:
                        found[name] = tile_name
        pending.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
    return found


def bind_mangled(mangled: dict[str, str], namespace: dict, builtins: dict) -> None:
    """Bind each mangled spelling in ``namespace`` to what its name is there (or in the
    tile's ``builtins``, where a module finds the ids)."""
    for alias, name in mangled.items():
        value = namespace.get(name, builtins.get(name, _MISSING))
        if value is not _MISSING:
            namespace[alias] = value


_MISSING = object()


def preview_namespace(tiledata: str = "") -> dict:
    """The names a tile's namespace starts with, before any block has run there (name
    completion needs them before the tile has made the real one): the ids are 0, the
    primitives TileAPI's own functions, so attributes complete as they will."""
    namespace = {**_SCRIPT_NAMES, "__builtins__": TILE_BUILTINS, "print": print,
                 "__tiledata": tiledata, "__tileid": 0, "__numtiles": 1, "__physical_tile": 0}
    namespace.update((name, getattr(TileAPI, name)) for name in PRIMITIVES)
    return namespace


#: the types of arguments whose str() and repr() are the interpreter's own code
_PLAIN_ARGUMENTS = (str, int, float, bool, bytes, type(None))


def report_runs_program_code(exc: BaseException) -> bool:
    """Whether formatting ``exc`` may call the program's own code: an exception class of
    its own (whose ``__str__`` may never end), or arguments other than plain values, in
    it or in an exception chained to it. Such a report is made on the tile, where the
    watchdog can stop that code; made by the host, it would hang the host's thread."""
    pending, seen = [exc], set()
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        if type(error).__module__ not in ("builtins", "ipuos.scheduler") or any(
                type(arg) not in _PLAIN_ARGUMENTS for arg in error.args):
            return True
        pending += (error.__cause__, error.__context__, *getattr(error, "exceptions", ()))
    return False


def user_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` as Python prints it (chained causes and contexts,
    exception groups), but with only tile-program frames (runtime frames are noise),
    each line from the source that frame's code came from (see TILE_SOURCE_LINES)."""
    report = traceback.TracebackException(type(exc), exc, exc.__traceback__, lookup_lines=False)
    pending, seen = [(report, exc)], set()
    while pending:  # (the report mirrors the exceptions' graph: walk both together)
        part, error = pending.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        part.stack = _program_frames(error.__traceback__)
        for linked, linked_error in ((part.__cause__, error.__cause__), (part.__context__, error.__context__)):
            if linked is not None and linked_error is not None:
                pending.append((linked, linked_error))
        pending.extend(zip(getattr(part, "exceptions", None) or (), getattr(error, "exceptions", ())))
    # exchange errors read as DeadlockError: ..., not ipuos.scheduler.DeadlockError
    return _bounded(_SCHEDULER_PREFIX.sub(r"\1", "".join(report.format())))


def _bounded(text: str, limit: int = DEFAULT_OUTPUT_LIMIT) -> str:
    """A tile's error report held to ``limit`` characters, as its output is: its start
    (where it was raised) and its end (what was raised), with a marker between. A
    program's exception message has no bound of its own, and every tile may raise one."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[error report truncated: {plural(len(text) - 2 * half, 'more character')}]\n{text[-half:]}"


#: the module of the exchange's errors where an exception's type starts a line (or a line
#: of an exception group's tree)
_SCHEDULER_PREFIX = re.compile(r"^([ |+]*)ipuos\.scheduler\.", re.MULTILINE)


def _program_frames(tb) -> traceback.StackSummary:
    frames = traceback.StackSummary()
    for (frame, _), summary in zip(traceback.walk_tb(tb), traceback.extract_tb(tb)):
        if TILE_GLOBALS_MARKER not in frame.f_globals and not _runs_as_a_tile(frame):
            continue
        lines = (frame.f_globals.get(TILE_SOURCE_LINES) or {}).get(summary.filename)
        if lines is not None and 0 < summary.lineno <= len(lines):
            # (with its newline, as linecache gives lines: traceback places carets by it)
            summary = traceback.FrameSummary(
                summary.filename, summary.lineno, summary.name, line=lines[summary.lineno - 1] + "\n",
                end_lineno=summary.end_lineno, colno=summary.colno, end_colno=summary.end_colno)
        frames.append(summary)
    return frames


def _runs_as_a_tile(frame) -> bool:
    """Whether ``frame`` is tile code whose globals are not a tile module's: code the
    program ran with ``exec(text, {})``, which gets the tile's builtins (its print)."""
    return isinstance(getattr(frame.f_builtins.get("print"), "__self__", None), TileContext)


def compile_program(source: str, filename: str):
    """Compile once for every tile; SyntaxError is reported before anything starts.
    (``source`` as :func:`source_text` gives it.)"""
    code = compile(source, filename, "exec", dont_inherit=True)
    # register the text so tracebacks can show the offending lines
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return code


@dataclass
class TileProgram:
    """The job target that runs one compiled program on every tile of a job.

    ``shares`` are the tiles' ``__tiledata`` (by rank); outputs and exit codes land in
    ``outputs`` and ``exit_codes`` by rank. Program text and data are written into
    named SRAM regions of each tile, so they count against its budget.
    """

    source: str
    filename: str
    shares: list[str] | None = None
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    #: called with (api, ctx) to let storage layers add open/os etc. to the namespace
    setup: Callable[[TileAPI, TileContext], None] | None = None
    outputs: dict[int, str] = field(default_factory=dict)
    #: the program's arguments, ``__args`` on every tile (like ``sys.argv``: the file
    #: name first); None gives ``[filename]``
    argv: list[str] | None = None
    #: the exception each failed tile raised (formatted later: the scheduler may still
    #: complete its message, e.g. for an exception injected by the watchdog)
    errors: dict[int, BaseException] = field(default_factory=dict)
    #: the tracebacks formatted on their tiles instead (see :func:`report_runs_program_code`)
    reports: dict[int, str] = field(default_factory=dict)
    exit_codes: dict[int, int] = field(default_factory=dict)

    def __post_init__(self):
        self.source = source_text(self.source)  # (TypeError for what is not a program's text)
        self.code = compile_program(self.source, self.filename)
        self.mangled = mangled_tile_names(self.code)
        self._text = self.source.encode("utf-8")
        self._lines = self.source.splitlines()

    @property
    def text_size(self) -> int:
        """The bytes of SRAM the program's text takes on each tile while it runs."""
        return len(self._text)

    def __call__(self, api: TileAPI) -> int:
        tile = api.tile
        rank = api.tileid
        output = OutputBuffer(self.output_limit)
        ctx = TileContext(api, output)
        share = self.shares[rank] if self.shares else ""
        memory = tile.memory
        region_names = []
        namespace, first_own = None, 0
        failing = False
        outer_context = ctx.enter(tile)
        _route_unraisable()

        def left() -> None:  # its tile left it, never to run it again (Scheduler.leave_program)
            try:
                # its globals let go of (what only they hold is freed), its files closed
                _end_on_tile(ctx, namespace, first_own, failing=True)
            finally:
                self.outputs[rank] = output.take()  # (the buffer stays with the left frames)
                for name in region_names:
                    memory.free(name)

        tile.leave_hook = left
        try:
            text = memory.alloc(f"job{api.job.id}.program", len(self._text))
            region_names.append(text.name)
            text.view[:] = self._text
            if share:
                encoded = share.encode("utf-8")
                data = memory.alloc(f"job{api.job.id}.tiledata", len(encoded))
                region_names.append(data.name)
                data.view[:] = encoded
            if self.setup is not None:
                self.setup(api, ctx)
            namespace = make_namespace(api, ctx, share)
            namespace[TILE_SOURCE_LINES] = {self.filename: self._lines}
            namespace["__args"] = list(self.argv) if self.argv is not None else [self.filename]
            # a file's name, or "<stdin>" as for `python -`; not "<program>" (as -c)
            if not self.filename.startswith("<") or self.filename == "<stdin>":
                namespace["__file__"] = self.filename
            if self.mangled:
                bind_mangled(self.mangled, namespace, ctx.builtins)
            tile.program_globals = _ProgramGlobals(namespace, ctx)
            first_own = len(namespace)
            try:
                run_module_code(self.code, namespace)
            except SystemExit as exc:
                code = exc.code
                self.exit_codes[rank] = code if isinstance(code, int) else (0 if code is None else 1)
                if code is not None and not isinstance(code, int):
                    self.reports[rank] = f"{code}\n"  # (the error stream, as Python prints it)
            else:
                self.exit_codes[rank] = 0
            return self.exit_codes[rank]
        except _machine_ending(api):
            ctx.cleanups.clear()  # the machine is going away: touch nothing more
            namespace = None  # (nor run any more of the program)
            failing = True
            raise
        except BaseException as exc:
            failing = True
            if report_runs_program_code(exc):
                self.reports[rank] = user_traceback(exc)
                # (for the others' abort: its __str__ may use the globals torn down below)
                api.job.describe_failure(rank, exc)
            else:
                self.errors[rank] = exc
            raise
        finally:
            tile.program_code_over()  # (what its teardown exchanges is not the program's)
            try:
                _end_on_tile(ctx, namespace, first_own, failing)
            except BaseException as exc:  # stopped as it ended: the program's failure
                self.errors[rank] = exc
                raise
            finally:
                tile.glet.gr_context = outer_context
                self.outputs[rank] = output.getvalue()
                for name in region_names:
                    memory.free(name)


def run_module_code(code: types.CodeType, namespace: dict) -> None:
    """Run a program's (or a block's) module-level code in ``namespace``, as ``exec``
    does, but as a call of a function made of it: Python runs a call made from Python
    code in the same C frame, while ``exec`` starts a new one, and every greenlet switch
    of the tile copies its C stack out and back in (see Job.target). Module code, not
    optimised, runs with the globals as its locals either way."""
    types.FunctionType(code, namespace)()


def _machine_ending(api: TileAPI):
    """What to let through as the machine ending the tile (at shutdown its greenlet is
    thrown GreenletExit), for an ``except`` clause, which evaluates it when an exception
    arrives. While the machine runs, nothing: a program can raise a GreenletExit of its
    own (``BaseException.__subclasses__()`` reaches it), an error like any other."""
    return () if api.tile.sched.running else greenlet.GreenletExit


class _ProgramGlobals(ProgramGlobals):
    """The globals in a program's data, on its tile (see ProgramGlobals): what arrives
    from the exchange, or loads with the tile's pickle, names them as the program has
    them (its builtins, its copies of modules, its own os), never the host's. Found
    the host's way, ``builtins.open`` was the host's open and ``os.system`` the host's."""

    __slots__ = ("namespace", "ctx")

    def __init__(self, namespace: dict, ctx: TileContext):
        self.namespace = namespace
        self.ctx = ctx

    @property
    def dispatch_table(self) -> dict | None:
        return self.ctx.dispatch_table

    def by_name(self, module: str, qualname: str):
        """A class or function another tile sent by name: the same name in this tile's
        program, or in the module of its files it came from."""
        namespace = self.namespace
        try:
            if module == namespace.get("__name__"):
                scope = namespace
            else:
                scope = vars(self.ctx.import_module(module, namespace, None, ("__name__",)))
            return _lookup(scope, qualname)
        except Exception as exc:  # (what else pickle's own lookup can raise is a wrong name)
            # (the same lookup serves the exchange and pickle.load of a file: say neither)
            raise pickle.UnpicklingError(
                f"cannot load an object of {module}.{qualname}: this tile's program does not define it "
                f"({type(exc).__name__}: {exc}); classes and functions are pickled by name, so the "
                "program that loads one must define it too (every tile runs its own copy of the program)"
            ) from None

    def find_class(self, module: str, name: str):
        """A global a pickle names, as the program has it; UnpicklingError for the
        host's (HOST_MODULES, unless the tile has its own version, as of os) and for
        what a tile cannot import (``_io.open``; its in-memory streams load)."""
        if (module, name) in _compat_pickle.NAME_MAPPING:  # (Python 2's names, as pickle maps them)
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        else:
            module = _compat_pickle.IMPORT_MAPPING.get(module, module)
        ctx = self.ctx
        top = module.partition(".")[0]
        try:
            if "__" in name.partition(".")[2]:
                # (``dumps.__globals__``: a host function's attributes lead to the host's
                # modules and builtins, whatever module copy it was reached through)
                _check_attribute_path(name)
            if module == "builtins":
                return self._builtin(name) if name in _NAMESPACE_BUILTINS else _lookup(ctx.builtins, name)
            if top in HOST_MODULES:
                if top not in ctx.extras.get("__modules__", ()):
                    raise _HostGlobal
                try:  # the tile's own version (its os)
                    return _lookup(ctx.import_module(module, None, None, ("__name__",)), name)
                except Exception:
                    raise _HostGlobal from None
            if (module, name) in _PICKLES_OWN_HELPERS:
                return getattr(sys.modules[module], name)
            if module == "ipuos.scheduler":  # (the runtime's errors, which a program catches and may send)
                return _runtime_error(name)
            if top in _C_PARTS:
                return _c_part(ctx, module, name)
            copy = ctx.modules.get(module)  # (imported before: no import machinery)
            if copy is None:
                copy = ctx.import_module(module, None, None, ("__name__",))
            return _lookup(copy, name)
        except _HostGlobal:
            raise pickle.UnpicklingError(f"cannot load {module}.{name} on a tile: it is the host's, and tiles have "
                                         "no access to the host") from None
        except ImportError:
            raise pickle.UnpicklingError(f"cannot load {module}.{name} on a tile: there is no module {module!r} "
                                         "there") from None
        except Exception as exc:  # (a name this tile does not have)
            raise pickle.UnpicklingError(
                f"cannot load {module}.{name} on this tile ({type(exc).__name__}: {exc})") from None

    def _builtin(self, name: str):
        """One of :data:`_NAMESPACE_BUILTINS`, acting on the program's namespace: pickle
        calls what it loads from the exchange's code, whose namespace is the host's (an
        object that reduces to ``eval("__import__('os')")`` had the host's os)."""
        namespace, builtin = self.namespace, self.ctx.builtins[name]
        if name in ("eval", "exec"):
            def in_program(source, globals=None, locals=None, /):
                return builtin(source, namespace if globals is None else globals, locals)

            in_program.__name__ = in_program.__qualname__ = name
            return in_program
        if name == "vars":
            return lambda *objects: builtin(*objects) if objects else namespace
        return lambda: namespace  # (globals, locals: at a program's top level, the same)


#: the builtins that act on their caller's namespace when given none
_NAMESPACE_BUILTINS = frozenset({"eval", "exec", "globals", "locals", "vars"})


class _HostGlobal(Exception):
    """A pickle names one of the host's globals (see _ProgramGlobals.find_class)."""


def _check_attribute_path(qualname: str) -> None:
    """Refuse a dotted name that goes through a dunder attribute after its first part:
    pickle names nested classes and methods that way, never those."""
    for part in qualname.split(".")[1:]:
        if part.startswith("__") and part.endswith("__"):
            raise _HostGlobal


def _lookup(scope: dict | types.ModuleType, qualname: str):
    """``qualname`` (dotted: a nested class, a method) in ``scope``, a namespace or a
    module (whose ``__getattr__`` counts: a module copy's names on demand)."""
    first, *rest = qualname.split(".")
    target = scope[first] if isinstance(scope, dict) else getattr(scope, first)
    for part in rest:
        target = getattr(target, part)
    return target


#: globals pickle's own output names that a tile cannot import (bytes, in protocols 0-2)
_PICKLES_OWN_HELPERS = frozenset({("_codecs", "encode")})

#: the C parts of modules a tile imports (``_operator`` for ``operator``), by the name a
#: pickle gives them: ``operator.add`` is ``_operator.add`` in a pickle; also ``io``'s
#: (its in-memory streams) and ``os.path``'s (``posixpath.join`` in a pickle), whose
#: modules are the tile's own
_C_PARTS = {"_" + name: name for name in TILE_MODULES} | {"_io": "io", "posixpath": "os.path"}


def _c_part(ctx: TileContext, module: str, name: str):
    """``module.name`` of the C part of a tile's module: only what the module itself
    offers the program (``_operator.add``, never ``_pickle.loads``, which loads the
    host's way, nor ``_decimal.DefaultContext``, which is the host's)."""
    value = getattr(sys.modules[module], name)
    if getattr(ctx.import_module(_C_PARTS[module], None, None, ("__name__",)), name, None) is not value:
        raise LookupError(f"on a tile, {_C_PARTS[module]}.{name} is not {module}.{name}")
    return value


def _runtime_error(name: str) -> type:
    error = getattr(sys.modules["ipuos.scheduler"], name)
    if not (isinstance(error, type) and issubclass(error, BaseException)):
        raise LookupError(f"{name} is not an exception")
    return error


def _end_on_tile(ctx: TileContext, namespace: dict | None, first_own: int, failing: bool = False) -> None:
    """What ends a program, or a repl session, on its tile (its greenlet, its context):
    its globals torn down (None: nothing of it is to run any more), then its cleanups
    (the files it left open closed), whatever the teardown raises; then it has ended
    (TileContext.ended).

    A stop (Ctrl-C, ``kill``, a compute budget, another tile's failure) that lands in a
    ``__del__`` there is "ignored" as Python ignores any exception a ``__del__`` raises:
    told on the output, and the rest is still let go of. The job was stopped all the
    same, so the first such stop is raised once all is let go of: the tile's result
    says so (exit status 130, or 1 for a budget), not that the program succeeded. (A
    program already ending with an exception of its own, ``failing``, reports that one
    instead.)"""
    ctx.stops_ignored = []
    try:
        with ctrl_cs_dropped_are_told():
            if namespace is not None:
                _tear_down(namespace, first_own)
    finally:
        try:
            with ctrl_cs_dropped_are_told():
                _run_cleanups(ctx)
        finally:
            stops, ctx.stops_ignored = ctx.stops_ignored, None
    if stops and not failing:
        raise stops[0]


def _tear_down(namespace: dict, first_own: int) -> None:
    """Drop an ended program's globals on its tile, as Python does as it exits: objects
    only they hold are freed now, their ``__del__`` running as part of the program
    (output and files its own, under the watchdog). The program's own names (those
    after the first ``first_own``, which the runtime put there) go first, latest first,
    while what they may use (a module imported before) is still there. The markers
    stay: a traceback's frames find the program's source lines through them.

    An object in a reference cycle is not freed here: only Python's cycle collector
    frees it, later and wherever that next runs (another job, the scheduler's loop, a
    host thread). By then the program has ended, and what its ``__del__`` may call of
    the program refuses (its print: TileContext.running; its files: the session; its
    primitives), so it touches nothing of the tile. Collecting here would catch few
    such cycles, dearly: a young collection (``gc.collect(0)``) at each tile's end made
    a 1472-tile launch of ``pass`` take 115-160 ms more (on ~200 ms) and caught none of
    the cycles of a program with two ``sync()`` calls (older by its end); a full one
    walks the whole machine (~70 ms on mk2), per tile."""
    for name in reversed(list(namespace)[first_own:]):
        namespace.pop(name, None)
    kept = {key: namespace[key] for key in (TILE_GLOBALS_MARKER, TILE_SOURCE_LINES) if key in namespace}
    namespace.clear()
    namespace.update(kept)


class _UnraisableRouter:
    """``sys.unraisablehook`` while programs run: an exception a program's ``__del__`` (or
    other code Python calls on its own) could not raise is told on that program's
    output, as Python tells it on the program's stderr; the host's hook would write it
    to the daemon's log. Another's goes to the host's hook (``host_hook``), as does one
    of a program that no longer runs, whose output nobody reads any more (the
    ``__del__`` of an object that outlived it in a reference cycle: see
    TileContext.running)."""

    #: (it tells dropped Ctrl-Cs first: the scheduler's own hook need not be put over it)
    tells_dropped_ctrl_cs = True

    def __init__(self, host_hook):
        self.host_hook = host_hook

    def __call__(self, unraisable) -> None:
        if ctrl_c_dropped(unraisable):
            return  # (not lost: it is raised again, so nothing is told)
        ctx = getattr(unraisable.object, "__globals__", {}).get(TILE_GLOBALS_MARKER)
        tb = unraisable.exc_traceback
        while ctx is None and tb is not None:
            ctx, tb = tb.tb_frame.f_globals.get(TILE_GLOBALS_MARKER), tb.tb_next
        if not isinstance(ctx, TileContext) or not ctx.running:
            self.host_hook(unraisable)
            return
        error = unraisable.exc_value or unraisable.exc_type()
        ctx.api.job.name_stop(error, ctx.api.tileid)
        if ctx.stops_ignored is not None and isinstance(error, (TileInterrupt, JobAborted)):
            ctx.stops_ignored.append(error)
        where = f"{unraisable.err_msg or 'Exception ignored in'}: {unraisable.object!r}\n"
        report = where + user_traceback(error)
        try:
            ctx.stderr.write(report)
        except Exception:  # (where the program redirected its stderr refuses: its output, not the daemon's log)
            ctx.output.write(report)


def _route_unraisable() -> None:
    """Install :class:`_UnraisableRouter` over whatever hook is there: a test runner or
    the application embedding the machine may have set its own since the last program."""
    if not isinstance(sys.unraisablehook, _UnraisableRouter):
        sys.unraisablehook = _UnraisableRouter(sys.unraisablehook)


def _run_cleanups(ctx: TileContext) -> None:
    """Run the program's cleanups (latest first), its last act: their complaints go to
    its output, and then it has ended (see TileContext.ended)."""
    try:
        while ctx.cleanups:
            cleanup = ctx.cleanups.pop()
            try:
                messages = cleanup()
            except Exception as exc:
                messages = [f"cleanup failed: {exc!r}"]
            for message in messages or ():
                ctx.warn(message)
    finally:
        ctx.ended = True


# -- interactive interpreters: the multirepl and the shell's python ----------------------------


#: the name the interactive blocks call to show a value (in the tile's builtins)
ECHO = "__ipuos_echo__"


def compile_block(source: str, filename: str, *, echo: bool = True):
    """Compile one interactive block; with ``echo``, the value of each expression statement
    is shown, as at Python's prompt (``python -c`` shows none).

    Python's REPL compiles each statement in ``single`` mode, where an expression statement
    at the top level (in loops and ifs too, not in function or class bodies) is shown
    through ``sys.displayhook``: that prints on the *host*'s stdout (the daemon's log). So
    here such statements call the tile's own ``__ipuos_echo__`` instead (see
    :func:`echo_value`). SyntaxError is raised before anything runs. (``source`` as
    :func:`source_text` gives it.)"""
    tree = ast.parse(source, filename, "exec")
    if echo:
        tree = ast.fix_missing_locations(_ShowExpressions().visit(tree))
    code = compile(tree, filename, "exec", dont_inherit=True)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return code


class _ShowExpressions(ast.NodeTransformer):
    """``expr`` -> ``__ipuos_echo__(expr)`` for the statements ``single`` mode shows."""

    def visit_Expr(self, node: ast.Expr) -> ast.Expr:
        call = ast.Call(ast.Name(ECHO, ast.Load()), [node.value], [])
        return ast.copy_location(ast.Expr(ast.copy_location(call, node.value)), node)

    def _keep(self, node):
        return node  # (a body that runs later, when called: nothing in it is shown)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _keep


def echo_value(ctx: "TileContext"):
    """The tile's ``__ipuos_echo__``: like ``sys.displayhook``, show ``repr(value)`` on the
    tile's output (of the block running now) and keep it as ``_`` in the tile's builtins,
    where a ``_`` the program assigns hides it."""

    def echo(value) -> None:
        if value is not None:
            ctx.builtins["_"] = None  # (as displayhook: not itself while repr runs)
            ctx.stdout.write(repr(value) + "\n")
            ctx.builtins["_"] = value

    return echo


class ReplState:
    """The interpreters of one repl session: a namespace and context per tile, kept
    between blocks, so names defined by one block are there for the next.

    Each entry belongs to its tile and is only touched on that tile's greenlet, while
    the tile runs a block of this repl, or the end of the session (:class:`ReplEnd`),
    which lets go of everything the tile defined there, as a program's end does.
    ``shares`` are the tiles' ``__tiledata`` by rank.
    """

    def __init__(self, shares: list[str] | None, setup, output_limit: int = DEFAULT_OUTPUT_LIMIT):
        self.shares = shares
        self.setup = setup
        self.output_limit = output_limit
        #: rank -> (namespace, TileContext, first_own): first_own as for _tear_down
        self.tiles: dict[int, tuple[dict, TileContext, int]] = {}
        #: the SRAM region each tile keeps its ``__tiledata`` in, as a program's does
        self.region_name = f"repl{next(_REPL_IDS)}.tiledata"
        self._regions: dict[int, object] = {}  # rank -> the TileMemory holding its region

    def reserve(self, rank: int, memory, share: str) -> None:
        """Put a tile's share of the data in its SRAM (MemoryError if it does not fit)."""
        encoded = share.encode("utf-8")
        region = memory.alloc(self.region_name, len(encoded))
        region.view[:] = encoded
        self._regions[rank] = memory

    @property
    def holding(self) -> bool:
        """Some tile still keeps a namespace or data of the session."""
        return bool(self.tiles or self._regions)

    def release(self, rank: int) -> None:
        """Free the SRAM region of the tile of ``rank``, if it has one."""
        memory = self._regions.pop(rank, None)
        if memory is not None:
            memory.free(self.region_name)

    def clear(self) -> list:
        """Forget every tile's namespace and free its data (on the scheduler thread):
        only for when the tiles cannot end the session themselves (see ReplEnd).
        Returns the tiles' (namespace, context, first_own) entries, for the caller to
        choose where they are let go of."""
        tiles, self.tiles = self.tiles, {}
        for _namespace, ctx, _first_own in tiles.values():
            ctx.ended = True  # (its names are let go of off its tile: see TileContext.ended)
            closed = ctx.extras.get("__closed__")  # (the layers above let go of it too)
            if closed is not None:
                closed()
        for rank in list(self._regions):
            self.release(rank)
        return list(tiles.values())


_REPL_IDS = itertools.count(1)


class ReplBlock:
    """The job target that runs one interactive block on every tile of a repl.

    Unlike :class:`TileProgram`, an exception is not a failure that aborts the job: in a
    repl one tile's ``ZeroDivisionError`` must not stop the others' block. The tile ends
    its block "ok" with exit code 1, its traceback in ``reports`` (its ``TileRun.error``,
    shown after its output and grouped with it, like any other text). Interrupts
    (Ctrl-C, ``kill``, budgets) still stop every tile. ``outputs``/``errors``/``reports``/
    ``exit_codes`` have the shape ``RunHandle`` reads.
    """

    def __init__(self, state: ReplState, body, filename: str = "<in>", lines: list[str] | None = None,
                 cwd: str | None = None, sink: Callable[[str], bool] | None = None):
        self.state = state
        #: where the tiles' output goes as they print it (see OutputBuffer), if anywhere
        self.sink = sink
        self.body = body
        self.filename = filename
        self.lines = lines or []
        #: where the block starts (its tile's path), if not where the last one left off
        self.cwd = cwd
        self.mangled = mangled_tile_names(body)
        self.outputs: dict[int, str] = {}
        self.errors: dict[int, BaseException] = {}
        self.reports: dict[int, str] = {}  # rank -> the traceback of the block's own exception
        self.exit_codes: dict[int, int] = {}
        #: ranks whose block raised SystemExit (``exit()``): the repl is left, as Python's
        self.exited: set[int] = set()

    def __call__(self, api: TileAPI) -> int:
        state = self.state
        rank = api.tileid
        output = OutputBuffer(state.output_limit, self.sink)
        entry = state.tiles.get(rank)
        if entry is None:
            share = state.shares[rank] if state.shares else ""
            if share:
                try:
                    state.reserve(rank, api.tile.memory, share)
                except MemoryError as exc:
                    self.outputs[rank] = f"MemoryError: {exc}\n"
                    self.exit_codes[rank] = 1
                    return 1
            ctx = TileContext(api, output)
            ctx.builtins[ECHO] = echo_value(ctx)
            if state.setup is not None:
                state.setup(api, ctx)
            namespace = make_namespace(api, ctx, share)
            namespace[TILE_SOURCE_LINES] = {}  # (the runtime's: not one of the session's own names)
            state.tiles[rank] = (namespace, ctx, len(namespace))
        else:
            namespace, ctx, _ = entry
            _resume_session(namespace, ctx, api, output)
        api.tile.program_globals = _ProgramGlobals(namespace, ctx)
        namespace.setdefault(TILE_SOURCE_LINES, {})[self.filename] = self.lines
        if self.cwd is not None and "__start_in__" in ctx.extras:
            ctx.extras["__start_in__"](self.cwd)
        if self.mangled:
            bind_mangled(self.mangled, namespace, ctx.builtins)
        code = 0
        outer_context = ctx.enter(api.tile)
        _route_unraisable()

        def left() -> None:  # its tile left it, never to run it again (Scheduler.leave_program)
            suspend = ctx.extras.get("__suspend__")
            try:
                if suspend is not None:
                    suspend()
            finally:
                self.outputs[rank] = output.getvalue()

        api.tile.leave_hook = left
        try:
            run_module_code(self.body, namespace)
        except SystemExit as exc:
            self.exited.add(rank)
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                self.reports[rank] = f"{exc.code}\n"  # (the error stream, as Python prints it)
        except _machine_ending(api):
            raise
        except TileInterrupt as exc:  # the machine or the user stops the block (Ctrl-C, kill, a budget)
            self.errors[rank] = exc  # (reported like a program's: its frames only)
            raise
        except BaseException as exc:  # the program's own, KeyboardInterrupt included
            # (kept apart from what it printed, as a program's is: a shell sends it to the
            # error stream when the output goes to a file)
            self.reports[rank] = user_traceback(exc)
            api.job.ended_raising(rank, exc)  # the others' collectives say so
            code = EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else 1  # (as Python's)
        finally:
            api.tile.program_code_over()  # (what suspending exchanges is not the block's)
            api.tile.glet.gr_context = outer_context
            suspend = ctx.extras.get("__suspend__")
            if suspend is not None:
                suspend()  # (before the output is taken: it may tell of a file that failed to close)
            self.outputs[rank] = output.getvalue()
        self.exit_codes[rank] = code
        return code


def _resume_session(namespace: dict, ctx: TileContext, api: TileAPI, output: OutputBuffer) -> None:
    """Give a repl session's tile back its namespace for a job of the session (a block,
    or its end): that job's primitives and output, its files where the last block left
    them."""
    ctx.api = api
    ctx.use_output(output)
    bind_primitives(namespace, ctx, api)
    # a block may have wiped its globals (globals().clear(), del __builtins__): exec
    # would fill in the host's builtins, and the tile would print to the daemon's log
    # and import host modules from then on
    namespace["__builtins__"] = ctx.builtins
    namespace[TILE_GLOBALS_MARKER] = ctx
    namespace.setdefault("__name__", "__main__")
    resume = ctx.extras.get("__resume__")
    if resume is not None:
        resume()


class ReplEnd:
    """The job target that ends a repl session on its tiles: each tears its namespace
    down and runs its cleanups as a program's end does (:func:`_end_on_tile`), so
    ``__del__`` methods run on their tile, in the session's context, and what they
    print is this job's output. The shape of the result is :class:`ReplBlock`'s."""

    def __init__(self, state: ReplState):
        self.state = state
        self.outputs: dict[int, str] = {}
        self.errors: dict[int, BaseException] = {}
        self.reports: dict[int, str] = {}
        self.exit_codes: dict[int, int] = {}

    def __call__(self, api: TileAPI) -> int:
        state = self.state
        rank = api.tileid
        entry = state.tiles.pop(rank, None)
        if entry is None:  # (no block ever ran here)
            state.release(rank)
            self.exit_codes[rank] = 0
            return 0
        namespace, ctx, first_own = entry
        output = OutputBuffer(state.output_limit)
        outer_context = api.tile.glet.gr_context
        resumed = False

        def left() -> None:  # its tile left it, never to run it again (Scheduler.leave_program)
            try:
                _run_cleanups(ctx)
            finally:
                self.outputs[rank] = output.getvalue()
                state.release(rank)

        api.tile.leave_hook = left
        try:
            # (resuming may reach another tile, where an interrupt can land: the files,
            # registrations and SRAM of the session are let go of all the same, below)
            _resume_session(namespace, ctx, api, output)
            ctx.enter(api.tile)
            _route_unraisable()
            resumed = True
            # (an interrupt, which lands in tile code only, stops a __del__: it is
            # "ignored" there, told on the output, and the rest are still let go)
            _end_on_tile(ctx, namespace, first_own)
        finally:
            if not resumed:
                _run_cleanups(ctx)  # (else the end ran them)
            api.tile.glet.gr_context = outer_context
            self.outputs[rank] = output.getvalue()
            state.release(rank)
        self.exit_codes[rank] = 0
        return 0
