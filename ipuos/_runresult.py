"""What a program did on its tiles: :class:`RunResult` and :class:`TileRun`.

Kept apart from the machine so that clients (the CLI, which rebuilds results from the
daemon's JSON) can use them without importing the machine itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._grouping import OutputGroup, format_groups, group_texts
from .scheduler import ABORTED, ERROR, INTERRUPTED, OK, JobStats

#: exit status of a tile that was interrupted (as a shell reports SIGINT)
EXIT_INTERRUPTED = 130
#: why a program was stopped whatever it catches: its client gave up on it (`ipuos run`
#: or the shell's `run`, alike)
STOPPED_FOR_GOOD = "interrupted for good (a second Ctrl-C, or the client went away)"


@dataclass
class TileRun:
    """How one tile's part of a program went."""

    tile: int  # machine-wide tile id
    rank: int  # __tileid in the job
    status: str  # "ok", "error", "aborted" or "interrupted"
    output: str
    error: str  # the traceback or reason; "" if none (a repl block's exception: status ok, code 1)
    exit_code: int

    @property
    def ok(self) -> bool:
        """True if the tile ran to the end without an error and exited with code 0."""
        return self.status == OK and self.exit_code == 0

    @property
    def text(self) -> str:
        """Output and error together: what a user sees for this tile."""
        if not self.error:
            return self.output
        sep = "" if not self.output or self.output.endswith("\n") else "\n"
        return self.output + sep + self.error


def process_status(code: int) -> int:
    """A program's exit code as a process exit status: its low 8 bits, as the OS keeps
    them (``exit(-1)`` is 255), except that a non-zero code never becomes 0 (success)."""
    return code & 0xFF or (1 if code else 0)


@dataclass
class RunResult:
    job_id: int
    name: str
    tiles: list[TileRun]
    stats: JobStats = field(default_factory=JobStats)

    @property
    def ok(self) -> bool:
        """True if every tile ran to the end without an error and exited with code 0."""
        return all(t.ok for t in self.tiles)

    @property
    def exit_status(self) -> int:
        """0 if every tile succeeded; on errors 1 (130 if every error was a
        KeyboardInterrupt, as Python's); 130 if interrupted; else the largest exit code, as
        a process exit status: its low 8 bits, but never 0 for a code that is not
        (``exit(256)`` gives 1, not success)."""
        errors = [t.exit_code for t in self.tiles if t.status == ERROR]
        if errors:
            return min(errors)
        statuses = {t.status for t in self.tiles}
        if ABORTED in statuses:
            return 1
        if INTERRUPTED in statuses:
            return EXIT_INTERRUPTED
        return max((process_status(t.exit_code) for t in self.tiles), default=0)

    def outputs(self) -> dict[int, str]:
        """Captured output by machine-wide tile id."""
        return {t.tile: t.output for t in self.tiles}

    def by_rank(self, rank: int) -> TileRun:
        return self.tiles[rank]

    def grouped(self, exit_codes: bool = True) -> list[OutputGroup]:
        """Identical tile texts grouped, most frequent first, with tile ranges (the
        failed tiles' apart from the others', marked ``failed``). A tile that exited with
        a non-zero code and no error (``exit(3)``) has its code in its group's header:
        nothing else would show that it failed, or why the run's status is not 0
        (``exit_codes=False``: the caller says so itself, as a repl that ``exit()``
        ends does)."""
        notes = {t.tile: f"exit code {t.exit_code}" for t in self.tiles
                 if exit_codes and t.status == OK and t.exit_code and not t.error}
        return group_texts({t.tile: t.text for t in self.tiles}, {t.tile for t in self.tiles if not t.ok}, notes)

    def format(self, max_groups: int | None = 20, exit_codes: bool = True) -> str:
        """The grouped output as ``ipuos run`` prints it (at most ``max_groups`` groups,
        failed tiles' first to be kept; None: all; ``exit_codes``: see :meth:`grouped`)."""
        return format_groups(self.grouped(exit_codes), max_groups)
