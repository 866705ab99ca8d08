"""``ipuos run`` through click's CliRunner."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ipuos._cli import main


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def program(tmp_path):
    def write(text, name="prog.py"):
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write


def test_run_prints_grouped_output(runner, program):
    result = runner.invoke(main, ["run", program("print('hi', __tileid % 2)"), "--tiles", "0-5", "--preset", "tiny"])
    assert result.exit_code == 0, result.output
    assert result.output == "[3 tiles: 0-4:2]\nhi 0\n[3 tiles: 1-5:2]\nhi 1\n"


def test_run_with_data_file(runner, program, tmp_path):
    data = tmp_path / "words.txt"
    data.write_text("a b c\nd e\nf\n" * 10)
    result = runner.invoke(main, ["run", program("print(allreduce(len(__tiledata.split())))"),
                                  "--data", str(data), "--preset", "tiny", "--tiles", "0-3"])
    assert result.exit_code == 0
    assert result.output == "[4 tiles: 0-3]\n60\n"


def test_run_exit_status_reflects_errors(runner, program):
    result = runner.invoke(main, ["run", program("1/0"), "--tiles", "0", "--preset", "tiny"])
    assert result.exit_code == 1
    assert "ZeroDivisionError" in result.output


def test_run_exit_status_is_the_programs(runner, program):
    result = runner.invoke(main, ["run", program("exit(3)"), "--tiles", "0-1", "--preset", "tiny"])
    assert result.exit_code == 3


@pytest.mark.parametrize("spec, message", [
    ("0-99", "no tile 99 on this machine"),
    ("x", "'x' is not a tile id"),
    ("", "empty tile specification"),
])
def test_bad_tile_specs_are_usage_errors(runner, program, spec, message):
    result = runner.invoke(main, ["run", program("pass"), "--tiles", spec, "--preset", "tiny"])
    assert result.exit_code == 2
    assert message in result.output


def test_missing_program_file(runner, tmp_path):
    result = runner.invoke(main, ["run", str(tmp_path / "nope.py"), "--preset", "tiny"])
    assert result.exit_code == 2
    assert "No such file or directory" in result.output


def test_syntax_error_is_one_clear_line(runner, program):
    result = runner.invoke(main, ["run", program("def f(:\n"), "--preset", "tiny"])
    assert result.exit_code == 1
    assert "syntax error at line 1" in result.output
    assert "Traceback" not in result.output


def test_json_output(runner, program):
    result = runner.invoke(main, ["run", program("print(__tileid)"), "--tiles", "2-3", "--preset", "tiny", "--json"])
    assert result.exit_code == 0
    doc = json.loads(result.output)
    assert [(t["tile"], t["output"], t["status"]) for t in doc["tiles"]] == [(2, "0\n", "ok"), (3, "1\n", "ok")]
    assert doc["stats"]["supersteps"] >= 1


def test_budget_option(runner, program):
    result = runner.invoke(main, ["run", program("while True: pass"), "--tiles", "0",
                                  "--preset", "tiny", "--budget", "0.1"])
    assert result.exit_code == 1
    assert "computed for more than 0.1 s" in result.output
