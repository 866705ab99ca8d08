"""What a program sees on a tile: its namespace, imports, print, __tiledata."""

from __future__ import annotations

import csv
import textwrap
import time

import pytest

from ipuos import Machine
from ipuos._tiledata import split_lines


@pytest.fixture(scope="module")
def machine():
    with Machine("tiny") as m:
        yield m


def run(machine, source, **kwargs):
    return machine.run(textwrap.dedent(source), timeout=20, **kwargs)


def test_namespace_has_ids_and_primitives(machine):
    result = run(machine, """
        print(__tileid, __numtiles, __physical_tile)
        print(sorted(n for n in ('sync', 'barrier', 'send', 'recv', 'sendrecv', 'alltoall', 'bcast', 'gather',
                                 'scatter', 'allgather', 'reduce', 'allreduce', 'scan', 'exscan')
                     if callable(globals()[n])))
        print(scatter([f"item {i}" for i in range(__numtiles)] if __tileid == 1 else None, 1))
    """, tiles="4-6")
    assert result.ok, result.format()
    lines = [t.output.splitlines() for t in result.tiles]
    assert [line[0] for line in lines] == ["0 3 4", "1 3 5", "2 3 6"]
    assert all(len(eval(line[1])) == 14 for line in lines)
    assert [line[2] for line in lines] == ["item 0", "item 1", "item 2"]


@pytest.mark.parametrize("module", ["math", "random", "json", "re", "collections", "itertools",
                                    "functools", "struct", "heapq", "bisect", "statistics",
                                    "errno", "stat", "csv", "types", "fnmatch", "weakref",
                                    "copyreg", "ipaddress", "html", "html.parser"])
def test_pure_compute_modules_import(machine, module):
    result = run(machine, f"import {module}\nprint({module}.__name__)", tiles="0")
    assert result.ok and result.tiles[0].output == f"{module}\n"


@pytest.mark.parametrize("module", ["sys", "subprocess", "socket", "tempfile", "ctypes",
                                    "builtins", "importlib", "threading", "time", "signal"])
def test_host_modules_fail_with_a_clear_import_error(machine, module):
    result = run(machine, f"import {module}", tiles="0")
    tile = result.tiles[0]
    assert tile.status == "error"
    assert f"ImportError: module '{module}' is not available on a tile" in tile.error
    assert "no access to the host" in tile.error


def test_io_is_the_in_memory_streams_and_the_tiles_open(machine):
    result = run(machine, """
        import csv, io
        from io import BytesIO, StringIO
        buffer = StringIO()
        csv.writer(buffer).writerow([__physical_tile, "a,b"])
        print(buffer.getvalue().strip(), BytesIO(b"xy").read(), io.SEEK_END)
        with io.open("/io.txt", "w") as f:      # the tile's file, not the host's
            f.write("on the tile")
        print(io.TextIOWrapper(open("/io.txt", "rb"), encoding="utf-8").read())
        print(hasattr(io, "FileIO"), hasattr(io, "open_code"))
    """, tiles="4")
    assert result.ok, result.format()
    assert result.tiles[0].output == '4,"a,b" b\'xy\' 2\non the tile\nFalse False\n'
    assert machine.fs.read_file(4, "/io.txt") == b"on the tile"


def test_from_import_of_a_host_module_fails_too(machine):
    result = run(machine, "from sys import path", tiles="0")
    assert "not available on a tile" in result.tiles[0].error


def test_unknown_modules_say_what_works(machine):
    result = run(machine, "import numpy", tiles="0")
    assert "no module named 'numpy' on this tile" in result.tiles[0].error


def test_a_standard_module_tiles_lack_is_named_as_one_with_those_they_have(machine):
    # (it said "no module named 'tomllib'", beside "pure-compute standard modules work")
    result = run(machine, "import tomllib", tiles="0")
    error = result.tiles[0].error
    assert "module 'tomllib' of the standard library is not on tiles; the standard modules they have: " \
           "abc, array," in error, error
    for module in ("io", "json", "math", "os", "random", "re", "shutil"):
        assert f" {module}," in error or error.endswith(f" {module}"), module
    assert "__future__" not in error


def test_host_open_and_input_are_refused(machine):
    # open() reaches the tile's own files (see test_tileos.py), never the host's
    result = run(machine, """
        for f in (lambda: open('/etc/passwd'), lambda: input(), lambda: input("name? ")):
            try:
                f()
            except (OSError, EOFError) as e:
                print(type(e).__name__)
    """, tiles="0")
    # (the prompt is written, as the host's input() writes it before it meets the end)
    assert result.tiles[0].output == "FileNotFoundError\nEOFError\nname? EOFError\n"


def test_the_hosts_module_loader_is_not_a_builtin_name(machine):
    """builtins.__loader__ is the host's importer of built-in modules: its
    load_module('posix') was the host's os, past every import check."""
    result = run(machine, """
        try:
            __loader__.load_module("posix")
        except NameError as exc:
            print(exc)
    """, tiles="0")
    assert result.tiles[0].output == "name '__loader__' is not defined\n", result.format()


def test_each_tile_has_its_own_random_generator(machine):
    result = run(machine, """
        import random
        random.seed(42)
        sync()                # other tiles draw in between
        print(random.random())
    """)
    assert result.ok
    assert len({t.output for t in result.tiles}) == 1  # same seed: same number on every tile


def test_builtins_are_the_tiles_own(machine):
    # one tile's change to a builtin shows neither on another tile nor in a later job
    changed = run(machine, """
        __builtins__['len'] = lambda x: 42
        print(len([1, 2, 3]))
    """, tiles="0")
    assert changed.tiles[0].output == "42\n"
    later = run(machine, "print(len([1, 2, 3]))", tiles="0-1")
    assert [t.output for t in later.tiles] == ["3\n", "3\n"]


def test_code_run_with_exec_or_dunder_import_is_still_the_tiles(machine):
    result = run(machine, """
        exec("print('from exec', __tileid)", {'__tileid': __tileid})
        exec("import random; random.seed(7); print(random.random())", {})
        with open('/note', 'w') as f:
            f.write('on the tile')
        print(eval("open('/note').read()", {}))
        random = __import__('random')
        random.seed(7)
        sync()                # another tile reseeding must not change this tile's draw
        print(random.random())
        try:
            __import__('subprocess')
        except ImportError as e:
            print('refused:', 'no access to the host' in str(e))
    """, tiles="0-1")
    assert result.ok, result.format()
    for rank, tile in enumerate(result.tiles):
        lines = tile.output.splitlines()
        assert lines[0] == f"from exec {rank}"
        assert lines[1] == lines[3]  # exec'd code and __import__ get the tile's own generator
        assert lines[2] == "on the tile"
        assert lines[4] == "refused: True"


def test_pprint_writes_to_the_tiles_output(machine):
    result = run(machine, """
        import pprint
        from pprint import pp, PrettyPrinter
        pprint.pprint({'tile': __tileid, 'x': list(range(3))})
        pp([__tileid])
        PrettyPrinter(width=20).pprint('abc')
        print(pprint.pformat((1, 2)), pprint.isreadable([1]))
    """, tiles="0-1")
    assert result.ok, result.format()
    assert [t.output for t in result.tiles] == [
        f"{{'tile': {rank}, 'x': [0, 1, 2]}}\n[{rank}]\n'abc'\n(1, 2) True\n" for rank in range(2)]


def test_calendar_prints_on_the_tile_and_its_first_weekday_is_the_programs(machine):
    import calendar

    result = run(machine, """
        import calendar
        calendar.setfirstweekday(calendar.SUNDAY)
        calendar.prmonth(2024, 2)
        calendar.TextCalendar().prweek([(1, 3)], 2)
        calendar.format(['a', 'b'], 3, 1)
        print(calendar.firstweekday(), calendar.isleap(2024))
    """, tiles="0")
    assert result.ok, result.format()
    expected = (calendar.TextCalendar(calendar.SUNDAY).formatmonth(2024, 2)
                + calendar.TextCalendar().formatweek([(1, 3)], 2)
                + calendar.formatstring(["a", "b"], 3, 1) + "\n6 True\n")
    assert result.tiles[0].output == expected
    after = run(machine, "import calendar\nprint(calendar.firstweekday())", tiles="0-1")
    assert [t.output for t in after.tiles] == ["0\n", "0\n"]  # not the earlier program's Sunday
    assert calendar.firstweekday() == 0  # nor the host's


def test_a_standard_module_a_program_changes_is_changed_for_it_alone(machine):
    import collections.abc
    import functools

    changing = run(machine, """
        import functools, collections, collections.abc
        functools.reduce = lambda *args: 42
        collections.deque = None
        collections.abc.Mapping = None
        from functools import reduce
        print(reduce(max, [1, 2]), collections.deque, collections.abc.Mapping)
    """, tiles="0")
    assert changing.tiles[0].output == "42 None None\n"
    after = run(machine, """
        import functools, collections
        from collections.abc import Mapping
        print(functools.reduce(lambda a, b: a + b, [1, 2, 3]), collections.deque([1]), Mapping.__name__,
              allreduce(1), reduce(2, 'prod'))
    """, tiles="0-3")
    assert after.ok, after.format()
    assert [t.output for t in after.tiles] == ["6 deque([1]) Mapping 4 16\n"] + ["6 deque([1]) Mapping 4 None\n"] * 3
    assert functools.reduce(max, [1, 2]) == 2 and collections.abc.Mapping.__name__ == "Mapping"


def test_a_programs_context_variables_are_its_own(machine):
    """decimal's precision lives in a context variable of the tile's greenlet, which
    outlives the program: the next program on the tile must not inherit it."""
    setting = run(machine, "import decimal\ndecimal.getcontext().prec = 5\nprint(decimal.Decimal(2).sqrt())",
                  tiles="0")
    assert setting.tiles[0].output == "1.4142\n"
    after = run(machine, "import decimal\nprint(decimal.Decimal(2).sqrt())", tiles="0-1")
    assert [t.output for t in after.tiles] == ["1.414213562373095048801688724\n"] * 2


def test_a_programs_csv_field_size_limit_is_its_own(machine):
    """The standard csv keeps one limit for the whole process, read as each row is
    parsed: one program's setting reached the other tiles, later programs and the host."""
    try:
        result = run(machine, """
            import csv

            made_before = csv.reader(['y' * 20])
            if __tileid == 0:
                csv.field_size_limit(16)

            def lines():  # (the other tiles parse their rows while this one waits at sync)
                for width in (10, 20, 10):
                    sync()
                    yield 'x' * width

            rows = csv.reader(lines())
            for _ in range(3):
                try:
                    print(len(next(rows)[0]), end=' ')
                except csv.Error as exc:
                    print(exc, end='; ')
            for rows in (csv.DictReader(['name', 'y' * 20]), made_before):
                try:
                    print(len(next(rows)), end=' ')
                except csv.Error:
                    print(type(rows).__name__, 'too', end='; ')
            print(csv.field_size_limit(), rows.line_num)
        """, tiles="0-2")
        assert result.ok, result.format()
        assert [t.output for t in result.tiles] == [
            "10 field larger than field limit (16); 10 DictReader too; reader too; 16 1\n"] + ["10 20 10 1 1 131072 1\n"] * 2
        assert csv.field_size_limit() == 131072  # the host's
        later = run(machine, "import csv\nprint(csv.field_size_limit(), next(csv.reader(['x' * 20])) == ['x' * 20])",
                    tiles="0")
        assert later.tiles[0].output == "131072 True\n"
    finally:  # (the host's, were it not the program's own)
        csv.field_size_limit(131072)


def test_a_global_objects_del_runs_as_the_program_ends_on_its_tile(machine):
    result = run(machine, """
        import math

        class Log:
            def __del__(self):
                print('closing', math.pi > 3)
                with open('/del.txt', 'w') as file:
                    file.write('written by __del__')

        log = Log()
        print('program ends')
    """, tiles="3")
    assert result.ok, result.format()
    assert result.tiles[0].output == "program ends\nclosing True\n"
    assert machine.fs.read_file(3, "/del.txt") == b"written by __del__"
    machine.fs.remove(3, "/del.txt")


def test_an_exception_in_del_is_told_on_the_programs_output(machine):
    result = run(machine, """
        class Broken:
            def __del__(self):
                raise ValueError('cannot let go')

        item = Broken()
        del item
        print('goes on')
    """, tiles="0")
    assert result.ok, result.format()
    output = result.tiles[0].output
    assert output.startswith("Exception ignored in: <function Broken.__del__ at ")
    assert output.endswith("ValueError: cannot let go\ngoes on\n") and "raise ValueError" in output


_ENDLESS_DEL = """
class Endless:
    def __del__(self):
        while True:
            pass

class Polite:
    def __del__(self):
        print('bye', __tileid)

polite = Polite()
endless = Endless()
print('end', __tileid)
"""


def test_a_del_that_never_ends_is_stopped_by_the_budget_and_the_program_fails(machine):
    """As the same overrun in the program's body does (exit status 1); the rest is still
    let go of."""
    result = machine.launch(_ENDLESS_DEL, tiles="0", budget=0.3).wait(10)
    (tile,) = result.tiles
    assert tile.output.startswith("end 0\nException ignored in: <function Endless.__del__ at ")
    assert "ComputeBudgetExceeded" in tile.output and tile.output.endswith("bye 0\n")
    assert tile.status == "error" and result.exit_status == 1
    assert "in __del__" in tile.error and "_runtime.py" not in tile.error
    assert tile.error.endswith("ComputeBudgetExceeded: tile 0 computed for more than 0.3 s without "
                               "reaching an exchange point\n")
    assert run(machine, "print('alive')", tiles="0").tiles[0].output == "alive\n"


def test_an_interrupt_that_lands_in_a_del_as_the_program_ends_interrupts_the_job(machine):
    handle = machine.launch(_ENDLESS_DEL, tiles="0-1")
    time.sleep(0.3)  # (the program's body is long over: its tiles let go of its objects)
    handle.interrupt("stopped by the test")
    result = handle.wait(10)
    # (tile 1's turn comes after the interrupt: it is not started only to be stopped)
    assert result.tiles[0].output.startswith("end 0\nException ignored in: <function Endless.__del__")
    assert "TileInterrupt" in result.tiles[0].output and result.tiles[0].output.endswith("\nbye 0\n")
    for tile in result.tiles:
        assert (tile.status, tile.error, tile.exit_code) == ("interrupted", "stopped by the test\n", 130)
    assert result.exit_status == 130


def test_objects_of_the_programs_own_classes_travel_between_tiles(machine):
    # as between MPI ranks: the receiver gets an instance of its own copy of the class
    result = run(machine, """
        import enum
        from dataclasses import dataclass
        with open('/shapes.py', 'w') as f:
            f.write('class Square:\\n    def __init__(self, side):\\n        self.side = side\\n')
        import shapes

        class Color(enum.Enum):
            RED = 1

        @dataclass
        class Point:
            x: int
            y: int

        def double(v):
            return 2 * v

        right = (__tileid + 1) % __numtiles
        send(right, Point(__tileid, 1))
        send(right, shapes.Square(__tileid))
        sync()
        p, sq = recv((__tileid - 1) % __numtiles), recv((__tileid - 1) % __numtiles)
        print(type(p) is Point, p, type(sq) is shapes.Square, sq.side)
        got = bcast([Color.RED, double] if __tileid == 0 else None, 0)
        print(got[0] is Color.RED, got[1] is double, got[1](21))
        print(allreduce(Point(__tileid, 1), lambda a, b: Point(a.x + b.x, a.y + b.y)))
    """, tiles="0-2")
    assert result.ok, result.format()
    for rank, tile in enumerate(result.tiles):
        left = (rank - 1) % 3
        assert tile.output.splitlines() == [f"True Point(x={left}, y=1) True {left}", "True True 42",
                                            "Point(x=3, y=3)"]


def test_buffer_objects_arrive_as_the_type_they_were_sent_as(machine):
    """marshal writes anything with the buffer protocol as bytes: a bytearray or an
    array, alone or inside a container, must still arrive as itself."""
    result = run(machine, """
        import array
        sent = [bytearray(b"ab"), array.array("i", [1, 2]), {"k": bytearray(b"v")}, (b"b", bytearray(b"c"))]
        send((__tileid + 1) % __numtiles, sent[0])
        sync()
        got = [recv((__tileid - 1) % __numtiles), bcast(sent[1], 0)] + allgather(sent[2])[:1] + [alltoall(sent[3])[0]]
        print(got == sent, [type(v).__name__ for v in got], type(got[2]["k"]).__name__, type(got[3][1]).__name__)
    """, tiles="0-2")
    assert result.ok, result.format()
    assert {t.output for t in result.tiles} == {"True ['bytearray', 'array', 'dict', 'tuple'] bytearray bytearray\n"}


def test_a_class_the_receiver_lacks_is_a_clear_error(machine):
    result = run(machine, """
        class Secret:
            pass
        if __tileid == 0:
            send(1, Secret())
            try:
                send(1, lambda: 1)
            except TypeError as e:
                print(e)
        else:
            del Secret
            recv(0)
    """, tiles="0-1")
    assert result.tiles[0].output.startswith("cannot send an object of type function")
    assert "cannot load an object of __main__.Secret: this tile's program does not define it" in result.tiles[1].error


def test_a_pickle_file_of_a_class_the_loading_program_lacks_says_so_without_speaking_of_the_exchange(machine):
    assert run(machine, """
        import pickle
        class Rec:
            pass
        with open('/rec.pkl', 'wb') as f:
            pickle.dump([Rec()], f)
    """, tiles="3").ok
    result = run(machine, """
        import pickle
        with open('/rec.pkl', 'rb') as f:
            pickle.load(f)
    """, tiles="3")
    error = result.tiles[0].error
    assert error.endswith("_pickle.UnpicklingError: cannot load an object of __main__.Rec: this tile's program "
                          "does not define it (KeyError: 'Rec'); "
                          "classes and functions are pickled by name, so the program that loads one must define "
                          "it too (every tile runs its own copy of the program)\n"), error
    assert "received" not in error


def test_what_cannot_be_sent_fails_with_the_error_that_says_why(machine):
    result = run(machine, """
        import os
        class Touchy:
            def __getstate__(self):
                raise KeyError("custom")
        deep = []
        for _ in range(5000):
            deep = [deep]
        for what in (Touchy(), deep, os.listdir, open, print, allreduce, sync, [1, os.remove]):
            try:
                bcast(what, 0)
            except Exception as exc:
                print(type(exc).__name__, exc)
    """, tiles="0")
    assert result.ok, result.format()
    lines = result.tiles[0].output.splitlines()
    assert lines[0] == "KeyError 'custom'"  # the program's own error, as pickle lets it through
    assert lines[1].startswith("RecursionError cannot send an object of type list through the exchange")
    for line, name in zip(lines[2:7], ("listdir", "open", "print", "allreduce", "sync")):
        assert line.startswith("TypeError cannot send an object of type"), line
        assert f"{name}() is part of this tile's runtime" in line, line
        assert "mmap" not in line and "local object" not in line, line
    assert lines[7].startswith("TypeError") and "remove() is part of this tile's runtime" in lines[7]


def test_print_is_captured_per_tile_with_sep_and_end(machine):
    result = run(machine, "print('a', __tileid, sep='-', end='|')\nprint()", tiles="2-3")
    assert [t.output for t in result.tiles] == ["a-0|\n", "a-1|\n"]


def test_every_tile_sending_too_much_reports_as_one_group(machine):
    result = run(machine, "send((__tileid + 1) % __numtiles, b'x' * 5000)", tiles="0-5")
    assert result.format().count("does not fit in the outgoing buffer") == 1
    assert result.format().startswith("[6 tiles: 0-5]\n")
    result = run(machine, "send((__tileid + 1) % __numtiles, lambda: 1)", tiles="0-2")  # (its address)
    assert result.format().count("cannot send an object of type function") == 1
    assert result.format().startswith("[3 tiles: 0-2]\n")


def test_print_flush_flushes_the_file_it_writes_to(machine):
    result = run(machine, """
        class Stream:
            def __init__(self):
                self.flushes = 0
            def write(self, text):
                return len(text)
            def flush(self):
                self.flushes += 1
        s = Stream()
        print("a", file=s)
        print("b", file=s, flush=True)
        with open("/flushed.txt", "w") as f:
            print("kept", file=f, flush=True)
            print(open("/flushed.txt").read() == "kept\\n", s.flushes)
        print("to the tile", flush=True)
    """, tiles="0")
    assert result.ok, result.format()
    assert result.tiles[0].output == "True 1\nto the tile\n"


def test_a_program_run_from_a_file_knows_its_name(machine):
    result = run(machine, "print(__file__)", tiles="0-1", filename="/chip/prog.py")
    assert result.ok, result.format()
    assert [t.output for t in result.tiles] == ["/chip/prog.py\n"] * 2
    result = run(machine, "print('__file__' in globals())", tiles="0")  # (a string, like -c)
    assert result.tiles[0].output == "False\n"


def test_print_refuses_a_separator_that_is_not_a_string_as_python_does(machine):
    result = run(machine, """
        for kw in (dict(sep=1), dict(end=b"x"), dict(sep=None, end=None)):
            try:
                print("a", "b", **kw)
            except TypeError as exc:
                print(exc)
    """, tiles="0")
    assert result.tiles[0].output == ("sep must be None or a string, not int\n"
                                      "end must be None or a string, not bytes\na b\n")


def test_output_is_bounded_with_an_explicit_marker(machine):
    result = run(machine, "for i in range(100): print('x' * 99)", tiles="0", output_limit=1000)
    output = result.tiles[0].output
    assert output.startswith("x" * 99 + "\n")
    assert output.endswith("[output truncated: 9000 more characters]\n")
    assert len(output) < 1100
    one_more = run(machine, "print('x' * 9)", tiles="0", output_limit=9).tiles[0].output
    assert one_more == "x" * 9 + "\n[output truncated: 1 more character]\n"  # (the newline)


def test_error_reports_are_bounded_and_others_carry_only_the_start_of_the_message(machine):
    """An exception's message had no bound, and the tiles a failure stops each carried a
    copy of it in their own report: one tile's 10 MB message took ~15 GB on an mk2 chip."""
    from ipuos._runtime import DEFAULT_OUTPUT_LIMIT

    result = run(machine, """
        if __tileid == 1:
            raise ValueError("x" * 10**7)
        sync()
    """, tiles="0-3")
    failed, stopped = result.tiles[1].error, [result.tiles[rank].error for rank in (0, 2, 3)]
    assert failed.startswith("Traceback (most recent call last):\n") and "ValueError: xxx" in failed
    assert "\n[error report truncated: " in failed and failed.endswith("x" * 100 + "\n")
    assert len(failed) < DEFAULT_OUTPUT_LIMIT + 100
    for error in stopped:
        assert "failed with ValueError: " + "x" * 1000 + "... [9,999,000 more characters]" in error, error[-200:]
        assert len(error) < 2000
    everyone = run(machine, "raise ValueError(str(__tileid) * 10**6)", tiles="0-3")
    assert all(len(tile.error) < DEFAULT_OUTPUT_LIMIT + 100 for tile in everyone.tiles)
    # a collective one tile could not take part in: the error every other tile's call raises
    refused = run(machine, """
        def op(a, b):
            raise ValueError("y" * 10**6)
        try:
            allreduce(1, op)
        except ValueError as exc:
            print(len(str(exc)))
        class_named = type("N" * 200_000, (Exception,), {})
        if __tileid == 1:
            raise class_named("z")
        sync()
    """, tiles="0-3")
    lengths = [int(tile.output) for tile in refused.tiles]
    assert lengths[0] == 10**6 and all(n < 1100 for n in lengths[1:]), lengths  # (tile 0's op raised: its own, whole)
    assert all(len(refused.tiles[rank].error) < 2000 for rank in (0, 2, 3)), [len(t.error) for t in refused.tiles]


def test_a_program_given_as_bytes_is_read_as_python_reads_a_source_file(machine):
    """A coding declaration names the encoding (PEP 263); else UTF-8, a BOM dropped."""
    declared = machine.run(b'# -*- coding: latin-1 -*-\nprint("caf\xc3\xa9")\n', tiles="0")
    assert declared.tiles[0].output == "caf\u00c3\u00a9\n"  # (latin-1, as it says: what python prints)
    assert machine.run("\ufeffprint('bom')".encode("utf-8"), tiles="0").tiles[0].output == "bom\n"
    with pytest.raises(UnicodeDecodeError):
        machine.run(b'print("caf\xe9")\n', tiles="0")
    with pytest.raises(SyntaxError, match="unknown encoding"):
        machine.run(b"# coding: nonsense\n", tiles="0")


def test_exit_codes(machine):
    result = run(machine, "exit(__tileid)", tiles="0-2")
    assert [t.exit_code for t in result.tiles] == [0, 1, 2]
    assert [t.status for t in result.tiles] == ["ok"] * 3
    assert result.exit_status == 2


def test_exit_status_is_a_process_status_and_never_hides_a_failure(machine):
    # a negative or over-large code is what the OS would keep of it, but never 0
    for source, status in (("exit(-1 if __tileid == 1 else 0)", 255), ("exit(256 if __tileid else 0)", 1),
                           ("exit(1000 if __tileid else 0)", 232), ("exit(3 if __tileid else 0)", 3)):
        result = run(machine, source, tiles="0-2")
        assert result.exit_status == status, source
        assert not result.ok


def test_an_exception_whose_str_fails_still_fails_the_job(machine):
    # the report of the failure must not itself fail: the job used to hang here
    result = run(machine, """
        class Broken(Exception):
            def __str__(self):
                raise ValueError("no text")
        if __tileid == 1:
            raise Broken()
        sync()
    """, tiles="0-3")
    assert [t.status for t in result.tiles] == ["aborted", "error", "aborted", "aborted"]
    assert "Broken: <exception str() failed>" in result.tiles[1].error
    assert "tile 1 failed with Broken: <exception str() failed>" in result.tiles[0].error
    assert machine.scheduler.internal_errors == []
    assert run(machine, "print(1)", tiles="1").ok  # the machine carries on


def test_a_programs_own_greenlet_exit_is_an_error_not_the_tiles_end(machine):
    # the machine ends a tile's greenlet with GreenletExit at shutdown; a program can
    # reach the class too, and raising it used to end the tile and hang the job
    result = run(machine, """
        exit_class = [c for c in BaseException.__subclasses__() if c.__name__ == "GreenletExit"][0]
        f = open("/left-open", "w")
        f.write("closed for it")
        if __tileid == 1:
            raise exit_class("mine")
        sync()
    """, tiles="0-3")
    assert [t.status for t in result.tiles] == ["aborted", "error", "aborted", "aborted"]
    assert result.tiles[1].error.startswith("Traceback") and "GreenletExit: mine" in result.tiles[1].error
    assert "_runtime.py" not in result.tiles[1].error  # (the program's frames only)
    assert machine.scheduler.internal_errors == []
    again = run(machine, "print(open('/left-open').read())", tiles="1")
    assert again.ok and again.tiles[0].output == "closed for it\n"


def test_kernel_traffic_never_fails_a_tile_whose_buffer_holds_unreceived_messages(machine):
    # tile 5 holds a full incoming buffer of its own messages (legal: 2 x 4 KiB of 8 KiB);
    # another job's file request to its disk must not fail it, nor take that room
    waiting = machine.launch(textwrap.dedent("""
        import os
        send(0, b"a" * 4090); sync(); send(0, b"b" * 4090); sync()
        while not os.path.exists("/flag"):
            sync()
        print(len(recv(0)), len(recv(0)))
    """), tiles="5")
    assert run(machine, "open('/tiles/5/flag', 'w').write('hi')", tiles="0").ok
    result = waiting.wait(30)
    assert result.ok, result.format()
    assert result.tiles[0].output == "4090 4090\n"
    machine.fs.remove(5, "/flag")


def test_a_collective_result_takes_the_room_received_messages_left(machine):
    result = run(machine, """
        if __tileid == 0:
            send(1, b"a" * 4090); sync(); send(1, "B"); sync()
        else:
            sync(); sync()
            print(len(recv(0)))        # the 4 KiB message is received: only "B" is pending
        print("bcast", len(bcast(b"z" * 4090 if __tileid == 0 else None, 0)))
        print(recv(0) if __tileid == 1 else "")
    """, tiles="0-1")
    assert result.ok, result.format()
    assert result.tiles[1].output == "4090\nbcast 4090\nB\n"


def test_an_overflowing_receiver_is_named_by_rank_and_its_lost_messages_counted(machine):
    result = run(machine, """
        for _ in range(3):
            if __tileid == 0:
                send(1, b"x" * 3000)
            sync()
    """, tiles="0,5,9")
    assert result.tiles[1].status == "error"
    assert "tile 1 (machine tile 5): incoming exchange buffer full" in result.tiles[1].error
    assert result.stats.dropped_messages >= 1


def test_host_types_pickle_finds_its_own_way_travel(machine):
    result = run(machine, """
        import typing
        send(__tileid, [type(None), type(Ellipsis), type(NotImplemented), typing.Optional[int]])
        print(recv(__tileid))
        print(allgather(type(None)))
    """, tiles="0-1")
    assert result.ok, result.format()
    assert result.outputs()[1] == (
        "[<class 'NoneType'>, <class 'ellipsis'>, <class 'NotImplementedType'>, typing.Optional[int]]\n"
        "[<class 'NoneType'>, <class 'NoneType'>]\n")


def test_exit_leaves_the_host_stdin_open(machine):
    """The site module's exit() closes sys.stdin before raising: a tile's must not (a
    child process, so that stdin is a real pipe, not pytest's stand-in)."""
    import subprocess
    import sys

    script = ("import sys, ipuos\n"
              "m = ipuos.Machine('tiny')\n"
              "r = m.run('quit(4) if __tileid else exit()', tiles='0-1')\n"
              "print([t.exit_code for t in r.tiles], sys.stdin.closed, sys.stdin.readline().strip())\n"
              "m.close()\n")
    done = subprocess.run([sys.executable, "-c", script], input="still here\n", text=True,
                          capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[0, 4] False still here\n"


def test_future_imports_work(machine):
    result = run(machine, """
        from __future__ import annotations
        def f(x: UndefinedName) -> int:
            return x
        print(f(3), f.__annotations__["x"])
    """, tiles="0")
    assert result.ok, result.format()
    assert result.tiles[0].output == "3 UndefinedName\n"


def test_traceback_shows_only_program_frames(machine):
    result = run(machine, """
        def f(x):
            return 1 / x
        f(0)
    """, tiles="0", filename="prog.py")
    error = result.tiles[0].error
    assert 'File "prog.py", line 3, in f' in error and "return 1 / x" in error
    assert "ZeroDivisionError: division by zero" in error
    assert "ipuos" not in error and "scheduler" not in error
    # the carets under the failing expression, where Python puts them
    assert "\n    return 1 / x\n           ~~^~~\n" in error, error


def test_tracebacks_show_chained_exceptions_as_python_does(machine):
    result = run(machine, """
        def load():
            try:
                {}["key"]
            except KeyError as e:
                raise RuntimeError("config broken") from e
        def handle():
            try:
                1 / 0
            except ZeroDivisionError:
                raise ValueError("while handling")
        def quiet():
            try:
                1 / 0
            except ZeroDivisionError:
                raise ValueError("nothing before me") from None
        for f in (load, handle, quiet):
            try:
                f()
            except Exception as exc:
                failure = exc
                print(f.__name__, "ok")
        if __tileid == 0:
            load()
        elif __tileid == 1:
            handle()
        elif __tileid == 2:
            quiet()
        else:
            raise ExceptionGroup("several", [KeyError("k"), TypeError("t")])
    """, tiles="0-3", filename="prog.py")
    load, handle, quiet, group = (t.error for t in result.tiles)
    assert load.index("KeyError: 'key'") < load.index(
        "The above exception was the direct cause of the following exception:") < load.index(
        "RuntimeError: config broken")
    assert 'File "prog.py", line 4, in load' in load and '{}["key"]' in load
    assert handle.index("ZeroDivisionError: division by zero") < handle.index(
        "During handling of the above exception, another exception occurred:") < handle.index(
        "ValueError: while handling")
    assert "ZeroDivisionError" not in quiet and "ValueError: nothing before me" in quiet
    assert "ExceptionGroup: several (2 sub-exceptions)" in group
    assert "KeyError: 'k'" in group and "TypeError: t" in group
    assert all("ipuos" not in error and "scheduler" not in error for error in (load, handle, quiet, group))


def test_syntax_errors_are_reported_before_anything_runs(machine):
    with pytest.raises(SyntaxError):
        machine.launch("x = (", tiles="0")


def test_program_text_and_data_take_sram_regions_that_are_released(machine):
    before = machine.sram_usage(0)["used"]
    result = run(machine, """
        regions = {r.name: r.size for r in globals()['__ipuos_tile_program__'].api.tile.memory.regions}
        print(sorted(n.split('.')[1] for n in regions if n.startswith('job')))
    """, tiles="0", data="some data\n")
    assert result.tiles[0].output == "['program', 'tiledata']\n"
    assert machine.sram_usage(0)["used"] == before


def test_program_over_the_sram_budget_is_refused_before_it_starts(machine):
    # (a tile keeps the text in its SRAM: it was a MemoryError on each tile, after the
    # others had begun)
    with pytest.raises(ValueError, match=r"^the program \(100006 bytes\) does not fit in the free SRAM of tile 0, "
                                         r"which has room for \d+ bytes at most"):
        run(machine, "x = 1\n" + "#" * 100_000, tiles="0")


def test_tiledata_is_split_on_line_boundaries(machine):
    words = [f"word{i:03d}" for i in range(200)]
    data = "\n".join(" ".join(words[i : i + 5]) for i in range(0, 200, 5)) + "\n"
    result = run(machine, "print(repr(__tiledata))", data=data)
    shares = [eval(t.output) for t in result.tiles]
    assert "".join(shares) == data
    assert all(s == "" or s.endswith("\n") for s in shares)  # never mid-line, so never mid-word
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= len(data.splitlines()[0]) + 1  # as even as lines allow


@pytest.mark.parametrize("n", [1, 3, 16, 40])
def test_split_lines_covers_everything_once(n):
    data = b"".join(b"line %d\n" % i for i in range(25)) + b"no newline at end"
    shares = split_lines(data, n)
    assert len(shares) == n and b"".join(shares) == data
    last = max(i for i, s in enumerate(shares) if s)  # the share holding the final line
    assert all(s.endswith(b"\n") for i, s in enumerate(shares) if s and i != last)


@pytest.mark.parametrize("data, n", [(b"abc", 4), (b"a\nb\nc\n", 16), (b"x\n" * 7 + b"tail", 5),
                                     (bytes(range(32, 127)) * 3 + b"\n", 2)])
def test_each_line_goes_to_the_tile_its_start_falls_in(data, n):
    """The documented rule: tile i gets the lines starting in [i*size/n, (i+1)*size/n)."""
    shares = split_lines(data, n)
    start = 0
    for tile, share in enumerate(shares):
        for line in share.splitlines(keepends=True):
            assert tile == start * n // len(data), (line, start, tile)
            start += len(line)
    assert start == len(data)


def test_non_utf8_data_is_refused_clearly(machine):
    with pytest.raises(ValueError, match="not UTF-8 text"):
        machine.launch("pass", tiles="0-1", data=b"\xff\xfe\n\x00")


def test_the_tiles_names_are_found_inside_classes(machine):
    """Python mangles a name that starts with two underscores inside a class
    (``__tileid`` -> ``_Worker__tileid``): the tile's names are found all the same, in a
    program, a multirepl block and a module imported from the tile's disk."""
    result = run(machine, """
        class Worker:
            me = (__tileid, __numtiles, __physical_tile, __tiledata.strip(), __args)
            def run(self):
                return f"tile {__tileid} of {__numtiles}"
        class _Private:
            def who(self):
                return __tileid
        print(Worker.me, Worker().run(), _Private().who())
    """, tiles="3-4", data="a\nb\n")
    assert result.ok, result.format()
    assert [t.output for t in result.tiles] == [
        "(0, 2, 3, 'a', ['<program>']) tile 0 of 2 0\n", "(1, 2, 4, 'b', ['<program>']) tile 1 of 2 1\n"]
    repl = machine.repl("5-6")
    block = repl.run("class R:\n    def rank(self):\n        return __tileid\nprint(R().rank())\n")
    assert [t.output for t in block.tiles] == ["0\n", "1\n"]
    machine.fs.makedirs(5, "/lib", exist_ok=True)
    machine.fs.write_file(5, "/lib/ranked.py", b"class K:\n    def rank(self):\n        return __tileid\n")
    result = run(machine, "import ranked\nprint(ranked.K().rank())\n", tiles="5")
    assert result.ok and result.tiles[0].output == "0\n", result.format()


def test_misused_builtins_are_named_as_the_program_calls_them(machine):
    """A wrong call names what the program called (``print``, ``sync``), as Python's own
    messages do, not the runtime's classes and closures behind them."""
    result = run(machine, """
        import os
        for call in (lambda: print("x", bogus=1), lambda: sync(1), lambda: alltoall(),
                     lambda: reduce(sendobj=1, op="sum", root=0), lambda: send(),
                     lambda: os.environ.__setitem__("N", 1), lambda: os.environ.update(M=2)):
            try:
                call()
            except TypeError as exc:
                print(exc)
        os.environ["K"] = "v"
        print(os.environ["K"], os.getenv("K"), dict(os.environ))
    """, tiles="0")
    assert result.ok, result.format()
    assert result.tiles[0].output.splitlines() == [
        "print() got an unexpected keyword argument 'bogus'",
        "sync() takes 0 positional arguments but 1 was given",
        "alltoall() missing 1 required positional argument: 'obj'",
        "reduce() got an unexpected keyword argument 'sendobj'",
        "send() missing 2 required positional arguments: 'dst' and 'obj'",
        "str expected, not int",
        "str expected, not int",
        "v v {'K': 'v'}",
    ]


def test_a_master_collects_from_any_worker_and_a_ring_shifts_with_sendrecv(machine):
    result = run(machine, """
        if __tileid == 0:
            done = sorted(recv() for _ in range(__numtiles - 1))  # whichever finishes first
            print(done)
        else:
            send(0, (__tileid, __tileid ** 2))
        print(sendrecv(__tileid, (__tileid + 1) % __numtiles, (__tileid - 1) % __numtiles))
    """, tiles="0-3")
    assert result.ok, result.format()
    assert result.tiles[0].output == "[(1, 1), (2, 4), (3, 9)]\n3\n"
    assert [t.output for t in result.tiles[1:]] == ["0\n", "1\n", "2\n"]


def test_pickle_knows_the_programs_own_classes_and_functions(machine):
    """The host's pickle looks for them in the host's __main__ and fails; the tile's
    writes them by name, found again in the loading tile's program, as send() does."""
    result = run(machine, """
        import pickle
        class Point:
            def __init__(self, x):
                self.x = x
        def double(v):
            return 2 * v
        back = pickle.loads(pickle.dumps({"p": Point(3), "f": double}))
        print(type(back["p"]) is Point, back["p"].x, back["f"](4))
        with open(f"/pickled{__tileid}", "wb") as f:
            pickle.dump(Point(7), f, protocol=4)
        try:
            pickle.dumps(open)
        except TypeError as exc:
            print(exc)
    """, tiles="3-4")
    assert result.ok, result.format()
    assert [t.output for t in result.tiles] == [
        "True 3 8\nopen() is part of this tile's runtime, which stays on its tile\n"] * 2
    later = run(machine, """
        import pickle
        class Point:
            pass
        p = pickle.load(open(f"/pickled{__tileid}", "rb"))
        print(type(p).__name__, p.x, isinstance(p, Point))
    """, tiles="3")
    assert later.tiles[0].output == "Point 7 True\n"


def test_a_program_catches_the_exchanges_errors_by_name(machine):
    # (as the README promises: "though the program catch ComputeBudgetExceeded")
    result = machine.run(textwrap.dedent("""
        try:
            if __tileid == 0:
                recv(1)
            else:
                recv(0)
        except DeadlockError as exc:
            print("deadlock caught:", isinstance(exc, ExchangeError) and isinstance(exc, RuntimeError))
        try:
            allgather(1) if __tileid else bcast(1, 0)
        except CollectiveMismatchError:
            print("mismatch caught")
        names = (JobAborted, TileInterrupt, TileFailed)
        try:
            while True:
                pass
        except ComputeBudgetExceeded as exc:
            print("budget caught:", isinstance(exc, TileInterrupt), [n.__name__ for n in names])
    """), tiles="0-1", budget=0.3, timeout=60)
    # (the budget ends the job on every tile all the same: see test_scheduler)
    assert result.tiles[0].output == ("deadlock caught: True\nmismatch caught\n"
                                      "budget caught: True ['JobAborted', 'TileInterrupt', 'TileFailed']\n"), \
        result.format()


def test_a_traceback_shows_the_frames_of_code_the_program_ran_with_exec(machine):
    result = run(machine, """
        def f():
            exec("x = 1\\ny = 1/0", {})
        f()
    """, tiles="0")
    assert result.tiles[0].error.endswith(
        '  File "<program>", line 3, in f\n'
        '    exec("x = 1\\ny = 1/0", {})\n'
        '  File "<string>", line 2, in <module>\n'
        'ZeroDivisionError: division by zero\n'), result.tiles[0].error
    assert "ipuos" not in result.tiles[0].error  # (the runtime's own frames stay out)
