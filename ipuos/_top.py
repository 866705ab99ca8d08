"""``ipuos top``: a live map of every tile, coloured by state or by SRAM use.

One character per tile, row after row with the first tile id of each row in the margin,
like the memory view of Graphcore's PopVision. When the machine has more tiles than the
screen has cells (a 32-chip machine has 47,104), each cell stands for a block of
consecutive tiles and shows its busiest tile (state view) or its fullest tile (SRAM
view), and the header says how many tiles a cell holds. Letters as well as colours carry
the state, so the map still reads on a terminal without colour or in a file (``--once``).
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import sys
import termios
import time
import tty
from typing import Callable

from rich.console import Console, Group
from rich.live import Live
from rich.text import Text

from ._plural import plural
from ._shown import shown
from ._terminate import TERMINATING_SIGNALS, Terminated, on_termination
from ._views import human_bytes, human_duration, simulated_time, state_counts

STATE_VIEW = "state"
SRAM_VIEW = "sram"

#: glyph and colour of each tile state
STATE_STYLES = {
    "idle": (".", "grey50"),
    "running": ("R", "bold green"),
    "waiting": ("w", "yellow"),
    "dead": ("X", "bold red"),
}
#: an aggregated cell shows the first of these states any of its tiles is in
BUSIEST_FIRST = ("dead", "running", "waiting", "idle")
SRAM_GLYPHS = "▁▂▃▄▅▆▇█"
#: the same ramp for an output that cannot encode block characters (an ASCII locale)
ASCII_SRAM_GLYPHS = ".:-=+*#@"
#: rows the map may use when the output is not a terminal
FILE_ROWS = 64
#: lines around the map: header, legend, jobs, footer
CHROME_LINES = 10


def cell_size(ntiles: int, columns: int, max_rows: int | None) -> int:
    """How many tiles one cell stands for so the map fits in ``max_rows`` rows."""
    if max_rows is None or ntiles <= columns * max(1, max_rows):
        return 1
    return math.ceil(ntiles / (columns * max(1, max_rows)))


def chip_cell_size(ipus: int, tiles_per_chip: int, columns: int, max_rows: int | None) -> int | None:
    """Tiles per cell when every chip starts a row of its own, or None if the chips
    cannot each have a row."""
    if max_rows is None:
        return 1
    rows_per_chip = max_rows // ipus
    if rows_per_chip < 1:
        return None
    return cell_size(tiles_per_chip, columns, rows_per_chip)


def _sram_style(fraction: float) -> str:
    if fraction < 0.5:
        return "green"
    if fraction < 0.75:
        return "yellow"
    if fraction < 0.9:
        return "dark_orange"
    return "bold red"


def sram_glyphs(encoding: str | None) -> str:
    """The SRAM ramp an output in ``encoding`` can show."""
    try:
        SRAM_GLYPHS.encode(encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        return ASCII_SRAM_GLYPHS
    return SRAM_GLYPHS


def _cells(ps: dict, view: str, per_cell: int, start: int, stop: int,
           glyphs: str = SRAM_GLYPHS) -> list[tuple[str, str]]:
    """(glyph, style) for every cell of tiles ``start``..``stop - 1``."""
    states = ps["states"]
    names = ps["state_codes"]
    cells = []
    if view == STATE_VIEW:
        codes = {state: code for code, state in names.items()}
        order = [codes[s] for s in BUSIEST_FIRST if s in codes]
        for first in range(start, stop, per_cell):
            block = states[first : min(first + per_cell, stop)]
            code = block if per_cell == 1 else next((c for c in order if c in block), block[0])
            cells.append(STATE_STYLES.get(names.get(code, ""), ("?", "magenta")))
    else:
        total = ps["sram_per_tile"]
        used = ps["sram_used"]
        for first in range(start, stop, per_cell):
            fraction = max(used[first : min(first + per_cell, stop)]) / total
            glyph = glyphs[min(len(glyphs) - 1, int(fraction * len(glyphs)))]
            cells.append((glyph, _sram_style(fraction)))
    return cells


def render_map(ps: dict, view: str, width: int, max_rows: int | None,
               glyphs: str = SRAM_GLYPHS) -> tuple[Text, int]:
    """The tile map as rich Text, and the number of tiles per cell.

    On a machine of several chips each chip starts a row, labelled ``IPU n``, when the
    rows allow it (a chip is one physical die: where it ends matters to a user placing a
    job); otherwise the map runs on across chips as on one."""
    ntiles = ps["ntiles"]
    per_chip = ps.get("tiles_per_chip") or ntiles
    ipus = max(1, ntiles // per_chip)
    tile_width = len(str(max(0, ntiles - 1)))
    chip_width = len(f"IPU {ipus - 1} ") if ipus > 1 else 0
    columns = max(1, width - chip_width - tile_width - 1)  # (more would be cropped: tiles unseen)
    per_cell = chip_cell_size(ipus, per_chip, columns, max_rows) if ipus > 1 else None
    if per_cell is None:  # one chip, or too few rows for a row per chip
        chip_width, ipus, per_chip = 0, 1, ntiles
        columns = max(1, width - tile_width - 1)
        per_cell = cell_size(ntiles, columns, max_rows)
    text = Text(no_wrap=True, overflow="crop")
    for chip in range(ipus):
        start = chip * per_chip
        cells = _cells(ps, view, per_cell, start, min(start + per_chip, ntiles), glyphs)
        for row_start in range(0, len(cells), columns):
            if text:
                text.append("\n")
            if chip_width:
                text.append((f"IPU {chip}" if not row_start else "").ljust(chip_width), style="bold")
            text.append(f"{start + row_start * per_cell:>{tile_width}} ", style="dim")
            run_glyphs, run_style = [], None
            for glyph, style in cells[row_start : row_start + columns]:
                if style != run_style and run_glyphs:
                    text.append("".join(run_glyphs), style=run_style)
                    run_glyphs = []
                run_style = style
                run_glyphs.append(glyph)
            if run_glyphs:
                text.append("".join(run_glyphs), style=run_style)
    return text, per_cell


def render_frame(status: dict, ps: dict, view: str, width: int, max_rows: int | None,
                 message: str | None = None, keys_help: bool = False, glyphs: str = SRAM_GLYPHS) -> Group:
    """One screenful: header, legend, the map, jobs."""
    header = Text.assemble(
        ("ipuos top", "bold"),
        f"  machine {status['name']!r}  {status['preset']} x{status['ipus']}  "
        f"{status['ntiles']} tiles  up {human_duration(status['uptime_seconds'])}\n",
        f"superstep {status['supersteps']}  exchanged {human_bytes(status['bytes_exchanged'])}  "
        f"exchange time {simulated_time(status['simulated_exchange_seconds'])} ",
        ("(simulated)", "italic"),
    )
    tile_map, per_cell = render_map(ps, view, width, max_rows, glyphs)
    legend = Text()
    if view == STATE_VIEW:
        for state, count in state_counts(ps).items():
            glyph, style = STATE_STYLES.get(state, ("?", "magenta"))
            legend.append(glyph, style=style)
            legend.append(f" {state} {count}   ")
        scope = "busiest"
    else:
        legend.append(f"SRAM used of {human_bytes(ps['sram_per_tile'])} per tile: ")
        for i, glyph in enumerate(glyphs):
            legend.append(glyph, style=_sram_style(i / len(glyphs)))
        legend.append(" 0-100%   ")
        scope = "fullest"
    legend.append(f"view: {view}")
    if per_cell > 1:
        legend.append(f"\n1 cell = {per_cell} tiles (shows its {scope} tile)")
    parts = [header, legend, tile_map]
    jobs = ps["jobs"]
    if jobs:
        lines = [f"job {j['job']}  tiles {j['tiles'] or '-'}  {shown(j['name']) or '-'}"
                 + (f"  {human_duration(j['elapsed_seconds'])}" if j["elapsed_seconds"] is not None else "")
                 for j in jobs[:5]]
        if len(jobs) > 5:
            lines.append(f"... and {plural(len(jobs) - 5, 'more job')}")
        parts.append(Text("\n".join(lines)))
    else:
        parts.append(Text("no jobs running", style="dim"))
    message = message or ps.get("stale_reason") or status.get("stale_reason")
    if message:
        parts.append(Text(message, style="bold red"))
    if keys_help:
        parts.append(Text("q quit   s switch between state and SRAM view", style="dim"))
    return Group(*parts)


def print_once(console: Console, status: dict, ps: dict, view: str, max_rows: int | None) -> None:
    console.print(render_frame(status, ps, view, console.width, max_rows, glyphs=sram_glyphs(console.encoding)),
                  soft_wrap=False)


def run_live(console: Console, fetch: Callable[[], tuple[dict, dict]], view: str, interval: float) -> None:
    """Redraw every ``interval`` seconds until ``q`` or Ctrl-C.

    ``fetch`` returns (status, ps) or raises; a machine that does not answer in time
    (a tile computing without an exchange point holds the scheduler) shows a message
    and the last map instead of freezing the screen. SIGTERM and SIGHUP raise
    Terminated once the terminal is put back.
    """
    from ._client import DaemonError  # the one error worth showing and retrying

    last: tuple[dict, dict] | None = None
    message = None
    with _Screen(console) as screen:
        while True:
            try:
                last = fetch()
                message = None
            except DaemonError as exc:
                if exc.code not in ("timeout", "busy"):
                    raise
                message = exc.message
            if last is not None:
                rows = max(1, console.height - CHROME_LINES)
                screen.show(render_frame(*last, view, console.width, rows, message, keys_help=True,
                                         glyphs=sram_glyphs(console.encoding)))
            key = screen.read_key(interval)
            if key in ("q", "Q"):
                return
            if key in ("s", "S"):
                view = SRAM_VIEW if view == STATE_VIEW else STATE_VIEW


class _Screen:
    """top's hold on the terminal: the alternate screen with the cursor hidden (rich's
    Live) and, when keys come from a terminal, cbreak mode (each key arrives as pressed;
    Ctrl-C and Ctrl-Z still send their signals). Kept right across job control, as
    curses keeps it: Ctrl-Z gives the terminal back before top stops, and ``fg`` takes
    it again and redraws. SIGTERM and SIGHUP give it back, then raise Terminated.

    A signal handler runs between any two bytecodes of the main thread: one that comes
    while a frame is being written waits until the frame is done, so the terminal never
    gets half a frame written over its own modes or after them.
    """

    def __init__(self, console: Console):
        self.live = Live(console=console, screen=True, auto_refresh=False)
        self.fd = sys.stdin.fileno() if sys.stdin.isatty() else None
        #: the terminal's modes as top found them, to put back
        self._saved = termios.tcgetattr(self.fd) if self.fd is not None else None
        self._busy = False
        self._pending: list[int] = []
        self._signals = contextlib.ExitStack()

    def __enter__(self) -> "_Screen":
        self._signals.enter_context(on_termination(self._signal))
        for signum in (signal.SIGTSTP, signal.SIGCONT):
            self._signals.callback(signal.signal, signum, signal.signal(signum, self._signal))
        try:
            self._take()
        except BaseException:
            self._signals.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self._busy = True  # (from here a signal only waits: the handlers are going)
        try:
            self._give_back()
        finally:
            self._signals.close()
        ending = [signum for signum in self._pending if signum in TERMINATING_SIGNALS]
        if ending and exc_info[0] is None:
            raise Terminated(ending[0])

    def show(self, frame) -> None:
        self._busy = True
        try:
            self.live.update(frame, refresh=True)
        finally:
            self._busy = False
        self._handle_pending()

    def read_key(self, timeout: float) -> str | None:
        """A key pressed within ``timeout`` s, or None."""
        if self.fd is None:
            time.sleep(timeout)
            return None
        ready, _, _ = select.select([self.fd], [], [], timeout)
        return os.read(self.fd, 1).decode("ascii", "replace") if ready else None

    def _signal(self, signum: int, _frame=None) -> None:
        self._pending.append(signum)
        if not self._busy:
            self._handle_pending()

    def _handle_pending(self) -> None:
        while self._pending:
            signum = self._pending.pop(0)
            if signum in TERMINATING_SIGNALS:
                raise Terminated(signum)  # (__exit__ gives the terminal back)
            self._busy = True
            try:
                if signum == signal.SIGTSTP:
                    self._stop()
                else:  # SIGCONT, after a stop top did not make (SIGSTOP): the shell may have reset the modes
                    self._retake()
            finally:
                self._busy = False

    def _stop(self) -> None:
        """Ctrl-Z: give the terminal back, stop as Ctrl-Z would have, and take it again."""
        self._give_back()
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        try:
            os.kill(os.getpid(), signal.SIGTSTP)  # (returns once continued)
        finally:
            signal.signal(signal.SIGTSTP, self._signal)
        self._take()

    def _take(self) -> None:
        if self.fd is not None:
            tty.setcbreak(self.fd)
        self.live.start(refresh=True)

    def _retake(self) -> None:
        if self.fd is not None:
            tty.setcbreak(self.fd)
        self.live.console.show_cursor(False)
        self.live.refresh()

    def _give_back(self) -> None:
        self.live.stop()  # (the main screen again, and the cursor)
        if self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
