"""The ``top`` map on its own: layout, aggregation for big machines, colour-free glyphs."""

from __future__ import annotations

from rich.console import Console

from ipuos._top import SRAM_VIEW, STATE_VIEW, cell_size, render_frame, render_map, sram_glyphs


def snapshot(ntiles: int, states: str | None = None, used: list[int] | None = None) -> dict:
    return {
        "ntiles": ntiles,
        "tiles_per_chip": 1472,
        "sram_per_tile": 1000,
        "state_codes": {"i": "idle", "r": "running", "w": "waiting", "d": "dead"},
        "states": states or "i" * ntiles,
        "jobs_of_tiles": [None] * ntiles,
        "sram_used": used or [100] * ntiles,
        "waiting": {},
        "jobs": [],
    }


STATUS = {"name": "m", "preset": "mk2", "ipus": 32, "ntiles": 47104, "uptime_seconds": 5.0, "supersteps": 9,
          "bytes_exchanged": 2048, "simulated_exchange_seconds": 1.5e-6}


def render(frame, width=100) -> list[str]:
    console = Console(width=width, color_system=None, file=None, record=True, force_terminal=False)
    with console.capture() as capture:
        console.print(frame)
    return capture.get().splitlines()


def test_one_cell_per_tile_when_it_fits():
    text, per_cell = render_map(snapshot(1472), STATE_VIEW, width=80, max_rows=64)
    rows = text.plain.splitlines()
    assert per_cell == 1
    assert len(rows) == 20  # 1472 tiles over 75 columns
    assert rows[0].startswith("   0 ") and rows[1].startswith("  75 ")
    assert sum(row[5:].count(".") for row in rows) == 1472


def test_47104_tiles_aggregate_to_fit_and_show_the_busiest():
    states = ["i"] * 47104
    states[47000] = "d"
    states[5] = "r"
    text, per_cell = render_map(snapshot(47104, "".join(states)), STATE_VIEW, width=120, max_rows=40)
    rows = text.plain.splitlines()
    # a row per chip (32 of them), 107 columns after "IPU 31 47104 ": 14 tiles a cell
    assert per_cell == cell_size(1472, 107, 1) == 14
    assert len(rows) == 32
    assert rows[0].startswith("IPU 0      0 R") and rows[31].startswith("IPU 31 45632 ")
    cells = [row[13:] for row in rows]
    assert all(len(chip) == -(-1472 // 14) for chip in cells)
    assert cells[0][0] == "R" and cells[31][(47000 - 45632) // 14] == "X"
    assert "".join(cells).count(".") == 32 * 106 - 2


def test_every_chip_starts_a_row_of_its_own_when_the_rows_allow():
    states = "i" * 15 + "r" + "w" + "i" * 15  # the last tile of chip 0, the first of chip 1
    text, per_cell = render_map(snapshot(32, states) | {"tiles_per_chip": 16}, STATE_VIEW,
                                width=17, max_rows=8)
    assert per_cell == 1
    assert text.plain.splitlines() == ["IPU 0  0 ........",
                                       "       8 .......R",
                                       "IPU 1 16 w.......",
                                       "      24 ........"]
    # fewer rows than chips: the map runs on across them
    text, per_cell = render_map(snapshot(32, states) | {"tiles_per_chip": 4}, STATE_VIEW,
                                width=19, max_rows=2)
    assert text.plain.splitlines() == [" 0 " + "." * 15 + "R", "16 w" + "." * 15]


def test_a_narrow_terminal_still_shows_every_tile():
    states = "i" * 7 + "r" + "i" * 40
    text, per_cell = render_map(snapshot(48, states), STATE_VIEW, width=10, max_rows=None)
    rows = text.plain.splitlines()
    assert per_cell == 1 and all(len(row) <= 10 for row in rows)
    assert "".join(row[3:] for row in rows) == "." * 7 + "R" + "." * 40


def test_sram_view_shows_the_fullest_tile_of_a_cell():
    used = [0] * 64
    used[9] = 1000
    text, per_cell = render_map(snapshot(64, used=used), SRAM_VIEW, width=12, max_rows=2)
    assert per_cell == 4
    assert text.plain.splitlines()[0] == " 0 ▁▁█▁▁▁▁▁▁"
    # an output that cannot encode the blocks (an ASCII locale) gets an ASCII ramp
    assert sram_glyphs("ascii") == ".:-=+*#@" and sram_glyphs("utf-8") == "▁▂▃▄▅▆▇█"
    text, _ = render_map(snapshot(64, used=used), SRAM_VIEW, width=12, max_rows=2, glyphs=sram_glyphs("ascii"))
    assert text.plain.splitlines()[0] == " 0 ..@......"


def test_the_frame_says_when_cells_hold_many_tiles_and_counts_all_tiles():
    states = "r" * 1000 + "w" * 100 + "i" * 46004
    lines = render(render_frame(STATUS, snapshot(47104, states), STATE_VIEW, 100, 30))
    assert lines[0] == "ipuos top  machine 'm'  mk2 x32  47104 tiles  up 5.0 s"
    assert lines[1] == "superstep 9  exchanged 2.0 KiB  exchange time 1.500 us (simulated)"
    assert lines[2].split()[:9] == [".", "idle", "46004", "R", "running", "1000", "w", "waiting", "100"]
    assert lines[3].startswith("1 cell = 17 tiles (shows its busiest tile)")
    assert len([line for line in lines if line[:6].strip().isdigit()]) <= 30


def test_a_stale_snapshot_is_called_out():
    ps = snapshot(16) | {"stale_reason": "this is the machine as it was 3.0 s ago: busy"}
    lines = render(render_frame(STATUS | {"ntiles": 16}, ps, STATE_VIEW, 80, 10))
    assert "this is the machine as it was 3.0 s ago: busy" in lines
