"""What a program reaches through the standard modules a tile offers: never the host's
files, processes or modules (one attribute away, or loaded by pickle), and never state
the other tiles, later programs and the host share."""

from __future__ import annotations

import builtins
import importlib
import io
import os
import socket
import subprocess
import sys
import textwrap
import time
import types

import pytest

from ipuos import Machine
from ipuos._runtime import HOST_MODULES, TILE_MODULES


@pytest.fixture(scope="module")
def machine():
    with Machine("tiny") as m:
        yield m


def run(machine, source, **kwargs):
    return machine.run(textwrap.dedent(source), timeout=30, **kwargs)


def _hosts_reach() -> tuple[dict[int, str], dict[str, list[str]]]:
    """What of the host every module a tile may import holds, directly or through the
    modules it refers to: ``({id(object): what it is}, {module: [its attributes]})``.
    The program runs in this process, so an id it finds is the host's own object."""
    host_side = (HOST_MODULES - {"builtins"}) | {"io", "_io", "posix", "nt"}  # (a builtin is the tile's too)
    reach = {id(module): f"the host's module {name}" for name, module in
             (("os", os), ("sys", sys), ("subprocess", subprocess), ("socket", socket), ("builtins", builtins),
              ("io", io))}
    reach.update({id(builtins.open): "the host's open", id(io.open): "the host's io.open",
                  id(vars(builtins)): "the host's __builtins__"})
    names: dict[str, list[str]] = {}
    pending = [importlib.import_module(name) for name in sorted(TILE_MODULES)]
    seen = set()
    while pending:
        module = pending.pop()
        if module.__name__ in seen:
            continue
        seen.add(module.__name__)
        for name, value in vars(module).items():
            if isinstance(value, types.ModuleType):
                reach[id(value)] = f"the host's module {value.__name__}"
                if value.__name__.partition(".")[0] in TILE_MODULES:
                    pending.append(value)
            elif name in ("__builtins__", "__loader__", "__spec__") or (
                    callable(value) and (getattr(value, "__module__", None) or "").partition(".")[0] in host_side):
                if name != "__builtins__" and value is not None and not isinstance(value, type):
                    reach[id(value)] = f"the host's {name}"
            else:
                continue
            names.setdefault(module.__name__, []).append(name)
    return reach, names


def test_no_module_a_tile_imports_holds_the_hosts_modules_files_or_builtins(machine):
    """A module's copy held the host's ``__builtins__`` (``json.__builtins__['open']``
    opened host files), the modules it imported (``contextlib.os``, ``typing.sys``,
    ``enum.bltns``) and its loader (which loads any built-in module: ``posix``). Every
    module a program may import is walked, and the modules it reaches from them."""
    reach, names = _hosts_reach()
    assert {"the host's module os", "the host's module sys"} <= set(reach.values())
    result = run(machine, f"""
        REACH = {reach!r}
        NAMES = {names!r}
        found, pending, seen = [], [__import__(name, fromlist=['_']) for name in NAMES], set()
        while pending:
            module = pending.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            for name in set(dir(module)) | set(NAMES.get(module.__name__, ())):
                value = getattr(module, name, None)
                if id(value) in REACH:
                    found.append(f"{{module.__name__}}.{{name}} is {{REACH[id(value)]}}")
                elif name in ('__loader__', '__spec__') and value is not None:
                    found.append(f"{{module.__name__}}.{{name}} is a loader")
                elif name == '__builtins__' and value not in (None, __builtins__):
                    found.append(f"{{module.__name__}}.__builtins__ are not the tile's")
                elif type(value) is type(module):
                    pending.append(value)
        print(len(seen) >= {len(TILE_MODULES)}, sorted(found))
        import contextlib, json, typing, html
        try:
            contextlib.os
        except AttributeError as exc:
            print(exc)
        print(json.decoder.JSONDecodeError.__name__, html.entities.name2codepoint['amp'],
              typing.collections is __import__('collections'))
    """, tiles="0")
    assert result.ok, result.format()
    assert result.tiles[0].output == (
        "True []\n"
        "module 'contextlib' has no attribute 'os' on a tile: on the host it is module 'os', and tiles have "
        "no access to the host\n"
        "JSONDecodeError 38 True\n")


def test_a_pickle_loaded_on_a_tile_names_the_tiles_builtins_never_the_hosts_modules(machine):
    """The tile's pickle found globals the host's way: ``builtins.open`` was the host's
    open, ``os.system`` the host's."""
    result = run(machine, r"""
        import pickle

        def load(data):
            try:
                return pickle.loads(data)
            except pickle.UnpicklingError as exc:
                return f"UnpicklingError: {exc}"

        print(load(b"cbuiltins\nopen\n.") is open, load(b"cbuiltins\neval\n(S'open'\ntR.") is open)
        for data in (b"cos\nsystem\n(S'true'\ntR.", b"csubprocess\ncall\n.", b"c_io\nopen\n.",
                     b"\x80\x04\x8c\ncontextlib\x8c\tos.system\x93.", b"c_pickle\nloads\n.",
                     b"cjson\ndumps.__globals__\n."):
            print(load(data))
        import operator
        print(load(b"c_operator\nadd\n.") is operator.add, load(pickle.dumps([{1}, b"x", 2j], protocol=2)))
        print(load(b"cipuos.scheduler\nDeadlockError\n.").__name__, load(b"cipuos.scheduler\nScheduler\n."))
    """, tiles="0")
    assert result.ok, result.format()
    assert result.tiles[0].output == (
        "True True\n"
        "UnpicklingError: cannot load os.system on a tile: it is the host's, and tiles have no access to the host\n"
        "UnpicklingError: cannot load subprocess.call on a tile: it is the host's, and tiles have no access to "
        "the host\n"
        "UnpicklingError: cannot load _io.open on this tile (LookupError: on a tile, io.open is not _io.open)\n"
        "UnpicklingError: cannot load contextlib.os.system on this tile (AttributeError: module 'contextlib' has "
        "no attribute 'os' on a tile: on the host it is module 'os', and tiles have no access to the host)\n"
        "UnpicklingError: cannot load _pickle.loads on this tile (LookupError: on a tile, pickle.loads is not "
        "_pickle.loads)\n"
        "UnpicklingError: cannot load json.dumps.__globals__ on a tile: it is the host's, and tiles have no access "
        "to the host\n"
        "True [{1}, b'x', 2j]\n"
        "DeadlockError UnpicklingError: cannot load ipuos.scheduler.Scheduler on this tile (LookupError: Scheduler "
        "is not an exception)\n")


def test_what_arrives_through_the_exchange_runs_in_the_receivers_program(machine):
    """An object that reduces to ``eval(...)`` or ``globals()`` was rebuilt by code in
    the exchange's namespace, the host's: ``open`` there was the host's open."""
    result = run(machine, """
        class Evaluated:
            def __init__(self, call):
                self.call = call
            def __reduce__(self):
                return self.call

        names = bcast(Evaluated((globals, ())), 0)
        opened = bcast(Evaluated((eval, ("open",))), 0)
        print(names is globals(), opened is open)
    """, tiles="0-1")
    assert result.ok, result.format()
    assert [t.output for t in result.tiles] == ["True True\n"] * 2


def test_a_programs_decimal_default_context_is_its_own(machine):
    """decimal's DefaultContext is the whole process's template of new contexts: one
    program's ``DefaultContext.prec = 3`` was the precision of the other tiles and of
    every later program."""
    import decimal

    setting = run(machine, """
        import decimal
        if __tileid == 0:
            decimal.DefaultContext.prec = 3  # (before the program's first use: it applies, as on the host)
            decimal.BasicContext.prec = 2
        sync()
        print(decimal.Decimal(1) / decimal.Decimal(7), decimal.getcontext().prec)
        decimal.DefaultContext.prec = 5  # (after: its context is its own, as on the host)
        decimal.setcontext(decimal.BasicContext)
        decimal.getcontext().prec += 1  # (a copy of the template is set, which stays as it is)
        print(decimal.Decimal(1) / decimal.Decimal(7), decimal.BasicContext.prec)
    """, tiles="0-1")
    assert setting.ok, setting.format()
    assert [t.output for t in setting.tiles] == ["0.143 3\n0.143 2\n",
                                                 "0.1428571428571428571428571429 28\n0.1428571429 9\n"]
    later = run(machine, """
        import decimal
        print(decimal.Decimal(1) / decimal.Decimal(7), decimal.DefaultContext.prec, decimal.BasicContext.prec)
    """, tiles="0-1")
    assert [t.output for t in later.tiles] == ["0.1428571428571428571428571429 28 9\n"] * 2
    assert (decimal.DefaultContext.prec, decimal.BasicContext.prec) == (28, 9)  # nor the host's


def test_a_programs_reprlib_settings_are_its_own(machine):
    """``reprlib.aRepr`` configures ``reprlib.repr`` for the whole process: one
    program's ``aRepr.maxlist = 2`` shortened every later program's reprs."""
    import reprlib

    setting = run(machine, """
        import reprlib
        if __tileid == 0:
            reprlib.aRepr.maxlist = 2
        sync()
        print(reprlib.repr(list(range(10))))
    """, tiles="0-1")
    assert [t.output for t in setting.tiles] == ["[0, 1, ...]\n", "[0, 1, 2, 3, 4, 5, ...]\n"]
    later = run(machine, "import reprlib\nprint(reprlib.repr(list(range(10))))", tiles="0")
    assert later.tiles[0].output == "[0, 1, 2, 3, 4, 5, ...]\n"
    assert reprlib.aRepr.maxlist == 6


def test_a_programs_copyreg_registrations_apply_to_its_own_pickling_and_end_with_it(machine):
    """``copyreg.pickle`` wrote into the whole process's dispatch table: a reducer one
    program registered rewrote every later job's exchange data (and the kernel's
    replies), and each run left one entry per tile behind."""
    import copyreg

    host_table = dict(copyreg.dispatch_table)
    hijacking = run(machine, """
        import copyreg, pickle
        copyreg.pickle(complex, lambda c: (str, ("HIJACKED",)))
        print(allgather([1 + 2j])[0], pickle.loads(pickle.dumps(3j)))
        try:
            copyreg.add_extension('__main__', 'f', 240)
        except NotImplementedError as exc:
            print(exc)
    """, tiles="0-1")
    assert hijacking.ok, hijacking.format()
    assert [t.output for t in hijacking.tiles] == [
        "['HIJACKED'] HIJACKED\n"
        "copyreg's extension codes are the whole machine's (pickle reads one registry on every tile and the "
        "host), so a program on a tile cannot add or remove them; its objects pickle without them\n"] * 2
    later = run(machine, "print(allgather([1 + 2j])[0])", tiles="0-1")
    assert [t.output for t in later.tiles] == ["[(1+2j)]\n"] * 2
    honest = """
        import copyreg
        class Point:
            def __init__(self, x, y):
                self.x, self.y = x, y
        def reduce_point(p):
            return (Point, (p.x * 10, p.y))
        copyreg.pickle(Point, reduce_point)
        p = bcast(Point(1, 2), 0)
        print(p.x, p.y, len(copyreg.dispatch_table))
    """
    runs = [run(machine, honest, tiles="0-1") for _ in range(2)]
    entries = len(host_table) + 1
    assert [t.output for result in runs for t in result.tiles] == [f"10 2 {entries}\n"] * 4
    assert copyreg.dispatch_table == host_table


def test_redirect_stdout_captures_the_tiles_print_and_leaves_the_hosts_stdout_alone(machine):
    """``contextlib.redirect_stdout`` set the host's ``sys.stdout`` (the daemon's, for
    as long as the block lasted) while the tile's print went on to its output."""
    hosts_stdout = sys.stdout
    handle = machine.launch(textwrap.dedent("""
        import contextlib, io, os
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer) as target:
            print("captured", __tileid)
            open("/inside", "w").close()
            while not os.path.exists("/go"):  # (the host looks at its stdout meanwhile)
                sync()
            print("after the exchanges")
        print("buffer holds:", repr(buffer.getvalue()), target is buffer)
        with open("/log.txt", "w") as log, contextlib.redirect_stdout(log):
            print("into a tile file", flush=True)
            print(open("/log.txt").read(), end="", file=buffer)
        with contextlib.redirect_stdout(None):
            print("nowhere")
        print(buffer.getvalue().splitlines()[-1])
    """), tiles="0-1")
    deadline = time.monotonic() + 20
    while not (machine.fs.exists(0, "/inside") and machine.fs.exists(1, "/inside")):
        assert time.monotonic() < deadline and not handle.done, handle.wait(30).format()
        time.sleep(0.01)
    stdout_inside = sys.stdout
    for tile in (0, 1):
        machine.fs.write_file(tile, "/go", b"")
    result = handle.wait(30)
    assert result.ok, result.format()
    assert stdout_inside is hosts_stdout and sys.stdout is hosts_stdout
    assert [t.output for t in result.tiles] == [
        f"buffer holds: 'captured {rank}\\nafter the exchanges\\n' True\ninto a tile file\n" for rank in range(2)]


def test_redirect_stderr_takes_the_tiles_error_reports_and_chdir_its_directory(machine):
    """What Python reports on stderr (an exception a ``__del__`` raised) goes where the
    program redirects its stderr; ``contextlib.chdir`` changed the host's directory."""
    hosts_cwd = os.getcwd()
    result = run(machine, """
        import contextlib, io, os
        class Noisy:
            def __del__(self):
                raise ValueError("in __del__")
        errors = io.StringIO()
        with contextlib.redirect_stderr(errors):
            Noisy()
            print("printed")
        print("stderr holds:", errors.getvalue().splitlines()[-1])
        os.mkdir("/work")
        with contextlib.chdir("/work"):
            print(os.getcwd())
        print(os.getcwd())
    """, tiles="0")
    assert result.ok, result.format()
    assert result.tiles[0].output == "printed\nstderr holds: ValueError: in __del__\n/work\n/\n"
    assert os.getcwd() == hosts_cwd
