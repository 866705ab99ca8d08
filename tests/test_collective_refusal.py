"""A tile that cannot take part in a collective (its object cannot be sent, a scatter's
sequence is wrong) makes every tile's call of that collective raise, as a result too big
for the incoming buffer does: a program that catches the error on every tile carries on
in step, rather than the other tiles taking the root's next call for this one."""

from __future__ import annotations

import textwrap

import pytest

from ipuos import Machine
from ipuos.scheduler import ERROR


@pytest.fixture(scope="module")
def machine():
    with Machine("tiny") as m:
        yield m


def outputs(machine, source, tiles="0-2"):
    result = machine.run(textwrap.dedent(source), tiles=tiles, timeout=20)
    assert result.ok, result.format()
    return [tile.output.splitlines() for tile in result.tiles]


def test_a_bcast_the_root_cannot_send_raises_on_every_tile_and_the_next_is_in_step(machine):
    got = outputs(machine, """
        def bcast_or_error(obj):
            try:
                return bcast(obj)
            except TypeError as exc:
                return f"TypeError: {exc}"
        print(bcast_or_error(memoryview(b"x") if __tileid == 0 else None))
        print(bcast_or_error("second" if __tileid == 0 else None))
        print(bcast_or_error("third" if __tileid == 0 else None))
    """)
    root_error = got[0][0]  # the root's own error, as raised
    assert root_error.startswith("TypeError: cannot send an object of type memoryview through the exchange")
    assert got[0][1:] == ["second", "third"]
    cannot = root_error.removeprefix("TypeError: ")
    for lines in got[1:]:
        assert lines == [f"TypeError: bcast(root=0) failed on tile 0: {cannot}", "second", "third"]


def test_a_bcast_too_big_for_the_roots_outgoing_buffer_raises_on_every_tile(machine):
    got = outputs(machine, """
        try:
            bcast(b"x" * 100_000 if __tileid == 1 else None, root=1)
        except ValueError as exc:
            print("ValueError:", exc)
        print(bcast(__tileid, root=1))
    """)
    assert [lines[1] for lines in got] == ["1", "1", "1"]
    assert got[1][0].startswith("ValueError: exchange payload of 100006 B does not fit in the outgoing buffer")
    for lines in (got[0], got[2]):
        assert lines[0].startswith("ValueError: bcast(root=1) failed on tile 1: exchange payload of 100006 B does")


def test_a_scatter_of_the_wrong_length_raises_on_every_tile_and_the_next_is_in_step(machine):
    got = outputs(machine, """
        try:
            print(scatter([1, 2] if __tileid == 0 else None))
        except ValueError as exc:
            print("ValueError:", exc)
        print(scatter([10, 11, 12] if __tileid == 0 else None))
    """)
    wrong = "scatter(): root's sequence has 2 items; the job has 3 tiles (one each)"
    assert got[0] == [f"ValueError: {wrong}", "10"]
    assert got[1] == [f"ValueError: scatter(root=0) failed on tile 0: {wrong}", "11"]
    assert got[2] == [f"ValueError: scatter(root=0) failed on tile 0: {wrong}", "12"]


def test_an_uncaught_refusal_fails_every_tile_with_it(machine):
    result = machine.run("scatter(7 if __tileid == 0 else None)", tiles="0-3", timeout=20)
    assert [tile.status for tile in result.tiles] == ["error"] * 4, result.format()
    assert result.tiles[0].error.rstrip().endswith(
        "TypeError: scatter(): root passes a sequence of one object per tile, not int")
    for tile in result.tiles[1:]:
        assert tile.error.rstrip().endswith("TypeError: scatter(root=0) failed on tile 0: scatter(): root "
                                            "passes a sequence of one object per tile, not int")
    assert result.exit_status == 1


def test_a_programs_own_error_reaches_the_root_as_raised_and_the_others_as_an_exchange_error(machine):
    # its class is not made again for each tile: that would run the program's code (this
    # __init__ even needs two arguments) on the scheduler's thread
    got = outputs(machine, """
        class Refused(Exception):
            def __init__(self, what, why):
                super().__init__(f"{what}: {why}")
        class Touchy:
            def __reduce__(self):
                raise Refused("Touchy", "not today")
        try:
            bcast(Touchy() if __tileid == 2 else None, root=2)
        except Exception as exc:
            print(type(exc).__name__, exc)
        print(bcast("next", root=2))
    """)
    assert got[2] == ["Refused Touchy: not today", "next"]
    for lines in got[:2]:
        assert lines == ["ExchangeError bcast(root=2) failed on tile 2: Refused: Touchy: not today", "next"]


def test_a_reduction_result_rank_0_cannot_send_raises_on_every_tile(machine):
    def target(api):
        try:
            api.allreduce(1, lambda a, b: memoryview(b"x"))
        except TypeError as exc:
            first = str(exc)
        return first, api.allreduce(1)

    job = machine.scheduler.start_job([0, 1, 2], target)  # (one level of the tree: rank 0 combines)
    report = job.future.result(20)
    assert report.ok, [(r.status, r.traceback) for r in report.results]
    values = [r.value for r in report.results]
    assert [total for _, total in values] == [3, 3, 3]
    assert values[0][0].startswith("cannot send an object of type memoryview")
    assert all(first.startswith("allreduce() failed on tile 0: cannot send") for first, _ in values[1:])


def test_a_refusal_in_a_collective_the_others_do_not_call_is_a_mismatch(machine):
    def target(api):
        if api.tileid == 0:
            return api.bcast(memoryview(b"x"))
        return api.sync()

    report = machine.scheduler.start_job([0, 1], target).future.result(20)
    assert [r.status for r in report.results] == [ERROR, ERROR]
    assert isinstance(report.results[0].error, TypeError)  # the root's own
    assert not isinstance(report.results[1].error, TypeError)
    assert "collective mismatch" in str(report.results[1].error)


@pytest.mark.parametrize("name", ["allgather", "alltoall"])
@pytest.mark.parametrize("unsendable, error", [
    ("memoryview(b'x')", "TypeError"),
    ("'x' * 100_000", "ValueError"),  # marshalled, but too big for the outgoing buffer
])
def test_an_allgather_one_tile_cannot_send_raises_on_every_tile_and_the_next_is_in_step(
        machine, name, unsendable, error):
    got = outputs(machine, f"""
        try:
            {name}({unsendable} if __tileid == 1 else __tileid)
        except Exception as exc:
            print(type(exc).__name__ + ":", exc)
        print({name}(__tileid * 10))
    """)
    own = got[1][0]  # tile 1's own error, as raised
    kind = f"{error}: "
    assert own.startswith(kind), got
    assert [lines[1] for lines in got] == ["[0, 10, 20]"] * 3
    for lines in (got[0], got[2]):
        assert lines[0] == f"{kind}{name}() failed on tile 1: {own.removeprefix(kind)}", got


REDUCTIONS = {  # a call on every tile, and what tile i gets when each passes i
    "reduce": ("reduce({value}, {op})", lambda i, n: sum(range(n)) if i == 0 else None),
    "allreduce": ("allreduce({value}, {op})", lambda i, n: sum(range(n))),
    "scan": ("scan({value}, {op})", lambda i, n: sum(range(i + 1))),
    "exscan": ("exscan({value}, {op})", lambda i, n: sum(range(i)) if i else None),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
@pytest.mark.parametrize("value, op, own", [
    # tile 5's value cannot be sent: tile 5 raises its own error
    ("memoryview(b'x') if __tileid == 5 else __tileid", "'sum'", 5),
    # the program's op raises where tile 5's value is combined, on whichever tile that is
    ("'five' if __tileid == 5 else __tileid", "lambda a, b: a + b", None),
])
def test_a_reduction_whose_part_fails_on_one_tile_raises_on_every_tile_and_the_next_is_in_step(
        machine, name, value, op, own):
    call, expected = REDUCTIONS[name]
    n = 16  # several levels of the tree: its leaders wait for the failed part
    got = outputs(machine, f"""
        try:
            {call.format(value=value, op=op)}
        except Exception as exc:
            print(type(exc).__name__ + ":", exc)
        print({call.format(value="__tileid", op="'sum'")})
    """, tiles=f"0-{n - 1}")
    assert [lines[1] for lines in got] == [str(expected(i, n)) for i in range(n)], got
    errors = [lines[0] for lines in got]
    # the tiles whose part failed raise their own error, as raised (in a scan, every
    # tile that combines tile 5's value) ...
    own_errors = {i: e for i, e in enumerate(errors) if " failed on tile " not in e}
    if own is not None:
        assert list(own_errors) == [own], errors
        assert own_errors[own].startswith("TypeError: cannot send an object of type memoryview")
    else:  # (int + str, str + int)
        assert own_errors, errors
        assert all(e.startswith("TypeError: ") for e in own_errors.values()), errors
    # ... and the others, of its type, say where one was
    label = "reduce(root=0)" if name == "reduce" else f"{name}()"
    for i, error in enumerate(errors):
        if i not in own_errors:
            assert any(error == f"TypeError: {label} failed on tile {rank}: {raised.removeprefix('TypeError: ')}"
                       for rank, raised in own_errors.items()), errors


def test_reductions_never_compare_the_values_they_combine(machine):
    got = outputs(machine, """
        class Total:
            def __init__(self, n):
                self.n = n
            def __add__(self, other):
                return Total(self.n + other.n)
            def __eq__(self, other):
                raise AssertionError("compared")
        print(allreduce(Total(__tileid)).n, scan(Total(1)).n, exscan(Total(1), lambda a, b: a + b) is None)
    """, tiles="0-15")
    assert got == [[f"120 {i + 1} {i == 0}"] for i in range(16)]


WRONG_CALLS = {  # a collective taking a root or an op; ARG: the root or op; and a wrong ARG
    "bcast-root-negative": ("bcast(v, root=ARG)", "0", "-1", "ValueError"),
    "bcast-root-bool": ("bcast(v, root=ARG)", "0", "True", "TypeError"),
    "gather-root-out-of-range": ("gather(v, root=ARG)", "2", "4", "ValueError"),
    "scatter-root-not-int": ("scatter([v * 10 + i for i in range(4)], root=ARG)", "3", "'3'", "TypeError"),
    "reduce-root": ("reduce(v, 'sum', root=ARG)", "1", "-2", "ValueError"),
    "reduce-op": ("reduce(v, ARG, root=1)", "'max'", "'MAX'", "ValueError"),
    "allreduce-op-name": ("allreduce(v, ARG)", "'sum'", "'SUM'", "ValueError"),
    "allreduce-op-not-callable": ("allreduce(v, ARG)", "'prod'", "5", "ValueError"),
    "scan-op": ("scan(v, ARG)", "'sum'", "None", "ValueError"),
    "exscan-op": ("exscan(v, ARG)", "'min'", "'avg'", "ValueError"),
}


def wrong_call_outputs(machine, call, good, bad, wrong_on):
    """Three calls on tiles 0-3, the first with the wrong root or op on ``wrong_on``."""
    return outputs(machine, f"""
        for step in range(3):
            v = 100 * step + __tileid
            ARG = {bad} if __tileid in {wrong_on!r} and step == 0 else {good}
            try:
                print(step, {call})
            except Exception as exc:
                print(step, type(exc).__name__ + ":", exc)
    """, tiles="0-3")


@pytest.mark.parametrize("name", list(WRONG_CALLS))
def test_a_wrong_root_or_op_on_one_tile_raises_on_every_tile_and_the_next_is_in_step(machine, name):
    """It was that tile's own error before it joined the collective: the others waited
    on, took its next call for this one (combining values of different calls), and
    then found it "already finished"."""
    call, good, bad, error = WRONG_CALLS[name]
    got = wrong_call_outputs(machine, call, good, bad, wrong_on=(1,))
    in_step = wrong_call_outputs(machine, call, good, good, wrong_on=())
    assert [lines[1:] for lines in got] == [lines[1:] for lines in in_step]
    own = got[1][0]
    assert own.startswith(f"0 {error}: ") and " failed on tile " not in own, got
    why = own.removeprefix(f"0 {error}: ")
    assert ("root" if "root" in name else "unknown reduction") in why
    for lines in (got[0], got[2], got[3]):
        assert lines[0].startswith(f"0 {error}: {call.split('(')[0]}(") and lines[0].endswith(
            f" failed on tile 1: {why}"), got


@pytest.mark.parametrize("name", ["bcast-root-negative", "reduce-op", "scan-op"])
def test_the_same_wrong_root_or_op_on_every_tile_is_each_tiles_own_error(machine, name):
    call, good, bad, error = WRONG_CALLS[name]
    got = wrong_call_outputs(machine, call, good, bad, wrong_on=(0, 1, 2, 3))
    in_step = wrong_call_outputs(machine, call, good, good, wrong_on=())
    assert [lines[1:] for lines in got] == [lines[1:] for lines in in_step]
    assert len({lines[0] for lines in got}) == 1, got
    assert got[0][0].startswith(f"0 {error}: ") and " failed on tile " not in got[0][0], got


def test_a_wrong_root_in_a_collective_the_others_do_not_call_is_a_mismatch(machine):
    def target(api):
        return api.bcast(1, root=-1) if api.tileid == 0 else api.gather(1, root=0)

    report = machine.scheduler.start_job([0, 1], target).future.result(20)
    assert [r.status for r in report.results] == [ERROR, ERROR]
    assert isinstance(report.results[0].error, ValueError)  # its own
    assert "collective mismatch" in str(report.results[1].error)


def test_a_reduction_part_that_cannot_land_fails_every_tiles_call_and_the_next_is_in_step(machine):
    # tile 0's incoming buffer (8 KiB) is nearly full of messages it has not received:
    # the parts its children send up in allreduce cannot land there. Every tile's call
    # raises (none goes on with a part missing, none is told of a send it never made),
    # and once tile 0 has received its messages the next allreduce is right everywhere
    got = outputs(machine, """
        def add(a, b):
            return (a[0] + b[0], a[1])
        pad = b"p" * 1000
        if __tileid in (1, 2):
            send(0, b"x" * 3500)
        sync()
        try:
            print("round 1:", allreduce((1, pad), add)[0])
        except ValueError as exc:
            print("round 1 failed:", exc)
        if __tileid == 0:
            recv(1); recv(2)
        print("round 2:", allreduce((100, pad), add)[0])
        print("scan:", scan(__tileid + 1))
    """, tiles="0-3")
    for rank, lines in enumerate(got):
        assert len(lines) == 3, lines
        assert lines[0].startswith("round 1 failed: " + ("allreduce() failed on tile 0: " if rank else "")
                                   + "incoming exchange buffer full ("), lines
        assert lines[0].endswith("a collective's part from tiles 1-2 could not land; recv() pending messages "
                                 "before a collective"), lines
        assert lines[1:] == ["round 2: 400", f"scan: {(rank + 1) * (rank + 2) // 2}"]


@pytest.mark.parametrize("call", ["allreduce(Unloadable(), lambda a, b: a)", "scan(Unloadable(), lambda a, b: a)",
                                  "exscan(Unloadable(), lambda a, b: a)", "reduce(Unloadable(), lambda a, b: a, 2)"])
def test_a_reduction_part_that_cannot_be_loaded_fails_every_tiles_call_and_the_next_is_in_step(machine, call):
    got = outputs(machine, f"""
        class Unloadable:
            def __init__(self):
                self.v = 1
            def __setstate__(self, state):
                raise KeyError("cannot load here")
        try:
            {call}
            print("no error")
        except Exception as exc:
            print("caught", type(exc).__name__)
        print(allreduce(1))
    """, tiles="0-3")
    assert got == [["caught KeyError", "4"]] * 4


@pytest.mark.parametrize("called", ["sync()", "bcast(b)", "allreduce(b)", "recv(0)", "alltoall(b)[0]"])
@pytest.mark.parametrize("reduction", ["allreduce(__tileid, op)", "reduce(__tileid, op)", "scan(__tileid, op)"])
def test_an_op_that_exchanges_raises_on_every_tile_and_the_next_is_in_step(machine, reduction, called):
    """The op runs while the other tiles wait in the reduction: a collective it called
    met theirs as a mismatch, and every later collective of the program was out of step
    for good (its tiles waited in different ones), though each tile caught the error."""
    got = outputs(machine, f"""
        def op(a, b):
            return a + {called}
        try:
            {reduction}
            print("no error")
        except RuntimeError as exc:
            print(exc)
        print("next", allreduce(1), allgather(__tileid))
    """, tiles="0-3")
    name = called.split("(")[0] + "()"
    for lines in got:
        assert f"{name} called inside a reduction's op" in lines[0], got
        assert lines[1] == "next 4 [0, 1, 2, 3]", got


def test_ops_of_one_name_that_are_different_functions_are_a_mismatch(machine):
    """A function op was known by its name alone: two lambdas (a sum on some tiles, a
    product on others) combined into 90, neither 21 nor 720, and closures of one factory
    with other values gave a result too."""
    for source in ("op = (lambda a, b: a + b) if __tileid % 2 else (lambda a, b: a * b)\n"
                   "print(allreduce(__tileid + 1, op))\n",
                   "def make(k):\n    def op(a, b):\n        return a + b + k\n    return op\n"
                   "print(allreduce(0, make(__tileid % 2)))\n",
                   "def make(k):\n    return lambda a, b, k=k: a + b + k\n"
                   "print(scan(0, make(__tileid == 3)))\n",
                   # (these took tile 0's value, or each tree node its own: 304, or 4)
                   "from functools import partial\ndef f(k, a, b):\n    return a + b + k\n"
                   "print(allreduce(1, partial(f, 100 if __tileid == 3 else 0)))\n",
                   "class Op:\n    def __init__(self, k):\n        self.k = k\n"
                   "    def __call__(self, a, b):\n        return a + b + self.k\n"
                   "    def plus(self, a, b):\n        return a + b + self.k\n"
                   "print(reduce(1, Op(__tileid == 0), 2))\n",
                   "class Op:\n    def __init__(self, k):\n        self.k = k\n"
                   "    def plus(self, a, b):\n        return a + b + self.k\n"
                   "print(allreduce(1, Op(__tileid == 0).plus))\n"):
        result = machine.run(source, tiles="0-5", timeout=20)
        for tile in result.tiles:
            assert "CollectiveMismatchError" in tile.error, tile.error
            assert "ops of one name that are different functions" in tile.error, tile.error


def test_one_op_made_on_every_tile_is_one_op(machine):
    """The same function made on each tile (a closure of the same values, NaN among them,
    and one imported from each tile's own disk, compiled there) is no mismatch."""
    for tile in range(4):
        machine.fs.makedirs(tile, "/lib", exist_ok=True)
        machine.fs.write_file(tile, "/lib/tileops.py", b"def join(a, b):\n    return a + b\n")
    got = outputs(machine, """
        import tileops
        def make(k, nan):
            def op(a, b):
                return a + b + k + (0 if nan == nan else 0)
            return op
        print(allreduce(1, make(10, float("nan"))), allreduce([__tileid], tileops.join))
        def modulo(m):
            return lambda a, b: (a + b) % m
        def plus(k):
            return lambda a, b: a + b + k
        # a huge int (no repr of one: it raised), and values equal as Python compares them
        print(allreduce(1, modulo(2**20000)), allreduce(1, plus(-0.0 if __tileid else 0.0)),
              allreduce(1, plus(True if __tileid else 1)))
        from functools import partial
        class Op:
            def __init__(self, k):
                self.k = k
            def __call__(self, a, b):
                return a + b + self.k
        print(allreduce(1, partial(lambda k, a, b: a + b + k, 2)), allreduce(1, Op(2)), allreduce(1, Op(2).__call__))
        # an op that keeps state (the tree runs it on its leaders only), and a method of an
        # object with an attribute per tile that the method never reads: one op each
        class Counting:
            calls = 0
            def __call__(self, a, b):
                self.calls += 1
                return a + b
        class Session:
            def __init__(self):
                self.rank = __tileid
            def combine(self, a, b):
                return a + b
        counting = Counting()
        print(allreduce(1, counting), allreduce(1, counting), scan(1, counting), allreduce(1, Session().combine))
    """, tiles="0-3")
    assert [lines[:3] for lines in got] == [["34 [0, 1, 2, 3]", "4 4.0 7", "10 10 10"]] * 4
    assert [lines[3].split()[:2] + lines[3].split()[3:] for lines in got] == [["4", "4", "4"]] * 4
    assert [int(lines[3].split()[2]) for lines in got] == [1, 2, 3, 4]
