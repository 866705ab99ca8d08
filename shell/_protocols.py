"""What the shell needs from the layers above it, as small protocols.

The shell sits below the runtime and the daemon (see ``tests/test_layering.py``): it may
not import them. What it needs from there it receives as objects at run time:

* :class:`ShellHost`, given to :class:`~ipuos.shell.ShellServer` by the daemon: starting
  programs and repl sessions as jobs, listing and interrupting jobs. Its methods are
  called on tile 0's greenlet (the scheduler thread), so they may start jobs directly.
* :class:`Transport`, given to the terminal front-end by the CLI: how a line reaches the
  shell on tile 0 and its answer comes back (the daemon's socket, in practice).
"""

from __future__ import annotations

from typing import Callable, Protocol

__all__ = ["ShellHost", "Launched", "ReplHandle", "JobInfo", "Transport",
           "RemoteError"]


class RemoteError(Exception):
    """What a :class:`Transport` raises when the machine refuses or fails a request; the
    message is for the user as it is."""


class Launched(Protocol):
    """A job the shell started (a program, or one repl block)."""

    #: the scheduler's Job: the shell waits for it on tile 0 and interrupts it on Ctrl-C
    job: object

    def report(self, max_groups: int | None) -> tuple[str, int, list[tuple[int, str, str]]]:
        """After the job ended: (grouped text, exit status, [(tile, output, error), ...]);
        a tile's error is its traceback or why it stopped ("" if none)."""

    def exits(self) -> list[tuple[int, int]]:
        """After a repl block ended: (tile, exit status) of each tile on which it called
        ``exit()`` (none: it did not)."""


class ReplHandle(Protocol):
    """Interpreters on a fixed set of tiles whose namespaces persist between blocks."""

    #: the tiles, as a spec ("0-1471")
    tiles: str
    ntiles: int

    def launch(self, source: str, *, echo: bool = True, cwd: str | None = None,
               sink: Callable[[str], bool] | None = None) -> Launched:
        """Start one block on every tile (SyntaxError before anything runs); ``echo``:
        print a trailing expression's value, as Python's interactive prompt does;
        ``cwd``: start it in that directory, not where the last block left off;
        ``sink(text)``: takes output as it is printed (False: not now; it is then in the
        report, which holds only what the sink did not take)."""

    def namespace(self) -> dict:
        """The first tile's names, between blocks (for completion; read only)."""

    def close(self) -> Launched | None:
        """End the session: each tile lets go of its namespace as a program's end does
        (``__del__`` methods run there). Returns the job doing it, whose report is what
        the tiles printed meanwhile (None: there was nothing to end, or it starts once
        a block still being stopped is over)."""


class JobInfo(Protocol):
    id: int
    name: str
    tiles: str
    ntiles: int
    elapsed: float | None
    client_pid: int | None


class ShellHost(Protocol):
    """The machine as the shell on tile 0 uses it (implemented by the daemon)."""

    def launch(self, source: str, filename: str, tiles: str, data: bytes | None,
               argv: list[str], budget: float | None, client_pid: int | None) -> Launched:
        """Start a program. Raises TileSpecError, SyntaxError, TileBusyError or ValueError
        with a message for the user."""

    def open_repl(self, tiles: str, data: bytes | None, client_pid: int | None) -> ReplHandle:
        """A repl session on ``tiles`` (``data`` split into ``__tiledata``)."""

    def jobs(self) -> list[JobInfo]:
        """Every job running on the machine."""

    def kill(self, job_id: int, reason: str) -> bool:
        """Interrupt a job; False if there is no such job."""

    def halting(self) -> str | None:
        """Why the machine is ending (it halts, and every session with it), or None."""


class Transport(Protocol):
    """How the terminal front-end reaches its session on tile 0."""

    def execute(self, line: str, *, payload: bytes = b"", eof: bool = False,
                on_output: Callable[[str, str], None], width: int = 0, echoes_ctrl_c: bool = False) -> dict:
        """Run ``line`` in the session; output arrives through ``on_output(stream, text)``
        (stream "out" or "err") as it is produced; ``width`` is the terminal's (0: not a
        terminal); ``echoes_ctrl_c``: it shows a Ctrl-C as ``^C`` itself, which the shell
        need not repeat. Returns ``{"status", "cwd", "mode", "prompt"}``, ``"ctrl_c"``:
        whether the user pressed Ctrl-C meanwhile (a status of 130 may be a program's own
        exit), and ``"ended"``: why, if the session ends with the machine (it halts). Ctrl-C while it runs interrupts the command (KeyboardInterrupt only
        if the user insists)."""

    def complete(self, text: str) -> tuple[int, list[str]]:
        """Completions of the end of ``text``: (where the completed word starts, words)."""

    def put(self, path: str, chunks, name: str, *, on_interrupt: Callable[[], None] | None = None) -> str:
        """Write the byte chunks to ``path`` on the chip (``name``: the host file's name,
        used when ``path`` is a directory); returns the path written. RemoteError. A put
        that does not finish (an error, Ctrl-C, a chunk the host file fails to give)
        leaves the old file, or none, and no partial copy. Ctrl-C while a chunk is on its
        way calls ``on_interrupt()`` and waits for tile 0's answer: KeyboardInterrupt if
        the put was stopped in time, the path if its file was in place already (a second
        Ctrl-C stops waiting: KeyboardInterrupt whose message says so)."""

    def get(self, path: str):
        """The bytes of ``path`` on the chip, as an iterator of chunks. RemoteError."""

    def close(self) -> None:
        """Detach: the session on tile 0 ends."""
