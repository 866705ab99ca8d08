"""The ``ipuos`` command line (click)."""

from __future__ import annotations

import json
import sys

import click

from ._machine import Machine, RunResult
from ._presets import DEFAULT_PRESET, PRESETS
from ._tilespec import TileSpecError, parse_tiles


def _fail(message: str, status: int = 1) -> None:
    click.echo(f"ipuos: {message}", err=True)
    sys.exit(status)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ipuos")
def main() -> None:
    """A simulated many-core chip running a small Python operating system."""


preset_option = click.option(
    "--preset",
    type=click.Choice(sorted(PRESETS)),
    default=DEFAULT_PRESET,
    show_default=True,
    help="chip model: tiles per chip and SRAM per tile",
)
ipus_option = click.option(
    "--ipus", type=click.IntRange(1, 64), default=1, show_default=True, help="number of chips"
)


@main.command()
@click.argument("file", type=click.File("rb"))
@click.option("--tiles", "tile_spec", default="all", show_default=True, help="tiles to run on, e.g. 0-99,200")
@click.option("--data", "data_file", type=click.File("rb"), help="host file split over the tiles as __tiledata")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), help="seconds a tile may compute per superstep")
@click.option("--json", "as_json", is_flag=True, help="print per-tile results as JSON")
@click.option("--stats", "show_stats", is_flag=True, help="print supersteps, bytes and simulated exchange time")
@preset_option
@ipus_option
def run(file, tile_spec, data_file, budget, as_json, show_stats, preset, ipus) -> None:
    """Run a Python FILE on tiles and print their output, grouped."""
    source = file.read()
    data = data_file.read() if data_file is not None else None
    with Machine(preset, ipus) as machine:
        try:
            parse_tiles(tile_spec, machine.ntiles)
        except TileSpecError as exc:
            raise click.BadParameter(str(exc), param_hint="--tiles") from None
        try:
            handle = machine.launch(source, tile_spec, data, filename=file.name, budget=budget)
        except SyntaxError as exc:
            _fail(f"{file.name}: syntax error at line {exc.lineno}: {exc.msg}")
        except (UnicodeDecodeError, ValueError) as exc:
            _fail(str(exc))
        try:
            result = handle.wait()
        except KeyboardInterrupt:
            handle.interrupt("interrupted (Ctrl-C)")
            result = handle.wait()
    _print_result(result, as_json, show_stats)
    sys.exit(result.exit_status)


def _print_result(result: RunResult, as_json: bool, show_stats: bool) -> None:
    if as_json:
        click.echo(json.dumps({
            "job": result.job_id,
            "exit_status": result.exit_status,
            "tiles": [t.__dict__ for t in result.tiles],
            "stats": result.stats.__dict__,
        }, indent=1))
        return
    click.echo(result.format(), nl=False)
    if show_stats:
        s = result.stats
        click.echo(
            f"-- {len(result.tiles)} tiles, {s.supersteps} supersteps, {s.wall_seconds:.3f} s wall, "
            f"{s.sim_seconds * 1e6:.1f} us simulated exchange",
            err=True,
        )
