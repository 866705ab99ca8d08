"""The other tiles' "aborted: ... failed with E: message" line describes the failing
tile's exception before its program is torn down: the exception's ``__str__`` may use the
program's globals."""

from __future__ import annotations

import textwrap

import pytest

from ipuos import Machine
from ipuos._runjson import run_result_to_json


@pytest.fixture(scope="module")
def machine():
    with Machine("tiny") as m:
        yield m


def test_an_exception_whose_str_uses_a_global_is_described_in_the_abort(machine):
    result = machine.run(textwrap.dedent("""
        PREFIX = "pre"
        class E(Exception):
            def __str__(self):
                return PREFIX + "-msg"
        if __tileid == 1:
            raise E("x")
        print(allreduce(1))
    """), tiles="0-1", timeout=20)
    assert [tile.status for tile in result.tiles] == ["aborted", "error"]
    assert result.tiles[0].error.endswith("tile 1 failed with E: pre-msg\n"), result.tiles[0].error
    assert result.tiles[1].error.rstrip().endswith("E: pre-msg")
    assert run_result_to_json(result)["tiles"][0]["error"] == result.tiles[0].error


def test_an_exception_with_a_program_object_as_argument_is_described_in_the_abort(machine):
    result = machine.run(textwrap.dedent("""
        UNITS = "kg"
        class Weight:
            def __str__(self):
                return f"12 {UNITS}"
        if __tileid == 0:
            raise ValueError(Weight())
        sync()
    """), tiles="0-2", timeout=20)
    assert [tile.status for tile in result.tiles] == ["error", "aborted", "aborted"]
    assert result.tiles[1].error.endswith("tile 0 failed with ValueError: 12 kg\n"), result.tiles[1].error
