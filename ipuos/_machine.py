"""The machine: chips of tiles with SRAM, the scheduler that runs them, and programs.

``Machine`` is the Python API of ipuos. It owns the SRAM, starts the scheduler thread,
and launches programs as jobs. Everything it does to tiles goes through the scheduler
(queued to its thread), so a Machine may be used from any thread.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
import warnings
import weakref
from typing import Callable

from ._costmodel import CostModel
from ._plural import plural
from ._presets import DEFAULT_PRESET, MAX_IPUS, Preset, get_preset, ipus_in_range
from ._runresult import EXIT_INTERRUPTED, RunResult, TileRun
from ._runtime import (
    DEFAULT_OUTPUT_LIMIT,
    ReplBlock,
    ReplEnd,
    ReplState,
    TileProgram,
    compile_block,
    module_namespace,
    preview_namespace,
    user_traceback,
)
from ._source import source_text
from ._sram import SRAM
from ._tiledata import decode_shares, split_lines
from ._tilespec import describe_tiles, format_tiles, parse_tiles
from .scheduler import ABORTED, ERROR, OK, Job, Scheduler, TileFailed, not_started
from .vfs import HostFsClient, Storage, working_directories

class RunHandle:
    """A program started with :meth:`Machine.launch`: wait for it or interrupt it."""

    def __init__(self, machine: "Machine", job: Job, program: TileProgram):
        self.machine = machine
        self.job = job
        self.program = program

    @property
    def done(self) -> bool:
        """True once every tile of the job has finished (:meth:`wait` returns at once)."""
        return self.job.future.done()

    def interrupt(self, reason: str = "interrupted by the user", ctrl_c: bool = False) -> None:
        """Stop the job on every tile, even one computing without reaching an exchange
        point; :meth:`wait` then returns its result, ``reason`` in each tile's error.
        ``ctrl_c``: as Ctrl-C does, with a KeyboardInterrupt in the program, which it may
        catch (and then run on); else with one it cannot catch by accident."""
        self.machine.scheduler.interrupt_job(self.job, reason, ctrl_c=ctrl_c)

    def wait(self, timeout: float | None = None) -> RunResult:
        """Wait for every tile to finish. TimeoutError leaves the program running."""
        try:
            report = self.job.future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(
                f"job {self.job.id} still runs after {timeout} s; interrupt() it or wait longer"
            ) from None
        program = self.program
        tiles = []
        for result in report.results:
            rank = result.rank
            output = program.outputs.get(rank, "")
            if result.status == OK:  # (a repl block's own exception leaves its tile ok: ReplBlock)
                error, code = program.reports.get(rank, ""), int(result.value or 0)
            elif result.status == ERROR:
                exc = program.errors.get(rank)
                error = program.reports.get(rank) or (user_traceback(exc) if exc is not None else result.traceback)
                # (Python, uncaught KeyboardInterrupt, ends as Ctrl-C ends it: a shell sees 130)
                code = EXIT_INTERRUPTED if isinstance(result.error, KeyboardInterrupt) else 1
            elif result.status == ABORTED:
                error, code = f"aborted: {result.error}\n", 1
            else:
                error, code = f"{result.error}\n", EXIT_INTERRUPTED
            tiles.append(TileRun(result.tile, rank, result.status, output, error, code))
        return RunResult(report.job_id, report.name, tiles, report.stats)


class Repl:
    """A repl session on a fixed set of tiles (see :meth:`Machine.repl`).

    Each :meth:`launch` runs one block of source as a job on every tile, in the namespace
    that tile kept from the blocks before (``__tileid``, ``__numtiles``, ``__tiledata``,
    the exchange primitives and ``open`` are there from the start, and ``import os``
    gives the tile's own, as in a program; the primitives are rebound to each block's
    job). A tile's exception is its error (``TileRun.error``, the tile's status ok, exit
    code 1), shown after its output and grouped with it like any other text; a bare
    expression's value is printed, as in Python's REPL. A block's ``exit(N)`` ends that
    block with exit code N; the session goes on until :meth:`close`: whoever drives it
    decides (the shell's multirepl leaves on it).
    """

    def __init__(self, machine: "Machine", tile_ids: list[int], shares, output_limit: int):
        self.machine = machine
        self.tile_ids = tile_ids
        self.state = ReplState(shares, machine._program_setup, output_limit)
        self._blocks = itertools.count(1)
        #: the session's latest job (a block, or its end)
        self._latest: RunHandle | None = None
        #: the end whose result close() returned (closing again has nothing to end)
        self._closed_end: RunHandle | None = None
        self._watch_abandonment()

    def _watch_abandonment(self) -> None:
        # dropped without close(), it still gives back its SRAM and current directories
        self._finalizer = weakref.finalize(self, _abandoned, self.machine.scheduler, self.tile_ids, self.state)
        self._finalizer.atexit = False

    def launch(self, source: str, *, budget: float | None = None, echo: bool = True,
               start_timeout: float | None = None, cwd: str | None = None,
               sink: Callable[[str], bool] | None = None) -> RunHandle:
        """Start one block; SyntaxError before anything runs, TileBusyError if a tile is
        busy with another job, TimeoutError as :meth:`Machine.launch`. ``echo``: show
        the value of each expression statement, as at Python's prompt (``python -c``
        does not). ``cwd``: the block starts there on every tile (the shell's ``python``
        starts where the shell is), not where the last block left off. ``sink(text)``:
        called with output as tiles print it (on whatever thread prints), which it
        takes unless it returns False; the result then holds only what it did not take."""
        if not self._finalizer.alive:  # (ended before: this block starts the session afresh)
            self._watch_abandonment()
        start_timeout = _seconds(start_timeout, "start_timeout")
        filename = f"<in {next(self._blocks)}>"
        source = source_text(source)
        body = compile_block(source, filename, echo=echo)
        block = ReplBlock(self.state, body, filename, source.splitlines(), cwd, sink)
        first = source.strip().splitlines()[0] if source.strip() else ""
        job = self.machine.scheduler.start_job(self.tile_ids, block, name=f"repl: {first[:40]}",
                                               budget=budget, timeout=start_timeout)
        self._latest = RunHandle(self.machine, job, block)
        return self._latest

    def run(self, source: str, *, timeout: float | None = None, budget: float | None = None) -> RunResult:
        """Run one block on every tile of the session and wait for its result (within
        ``timeout`` seconds of the call, as :meth:`Machine.run`: past it, the block is
        interrupted, or never starts, and TimeoutError is raised); names it defines stay
        for the next block."""
        return _run_within(lambda start_timeout: self.launch(source, budget=budget, start_timeout=start_timeout),
                           _seconds(timeout, "timeout"))

    def namespace(self, rank: int = 0) -> dict:
        """The names the blocks have defined on the session's ``rank``-th tile (before
        the first block, the names every tile starts with). For reading between blocks
        (name completion): the tile owns it while a block runs."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < len(self.tile_ids):
            raise IndexError(f"no rank {rank!r} in this session: its ranks are 0-{len(self.tile_ids) - 1}")
        entry = self.state.tiles.get(rank)
        return entry[0] if entry is not None else preview_namespace()

    def end(self) -> RunHandle | None:
        """Start ending the session, as a job on its tiles: each lets go of what the
        blocks defined there as a program does when it ends (``__del__`` methods run on
        their tile, and what they print is the job's output; files left open are
        closed), and frees the SRAM holding its data. Later blocks start afresh.
        Returns the job's handle; None if no tile has anything to end, or if a tile is
        busy (a block still being stopped): the end then starts as soon as it is free."""
        self._finalizer.detach()  # (what the session holds is let go of by this end)
        try:
            return self.machine.scheduler.call_wait(self._start_end)
        except RuntimeError:  # the machine has stopped: its SRAM went with it
            self.state.tiles = {}
            return None

    def _start_end(self) -> RunHandle | None:
        """(on the scheduler thread, where no job can take the tiles meanwhile)"""
        scheduler = self.machine.scheduler
        busy = _busy_job(scheduler, self.tile_ids)
        if busy is not None:  # (a block may still be making namespaces: ask again after it)
            busy.future.add_done_callback(lambda _: scheduler.running and self._start_end())
            return None
        state = self.state
        if not state.tiles:
            state.clear()
            return None
        ending = ReplEnd(state)
        try:
            job = scheduler.start_job(self.tile_ids, ending, name="repl: end of session")
        except TileFailed:  # (such a tile cannot let go itself)
            state.clear()
            return None
        # a tile whose part an interrupt stops before it starts keeps its namespace: end
        # it then with one job more (not stopped: only the interrupted job was)
        job.future.add_done_callback(lambda _: state.tiles and scheduler.running and self._start_end())
        self._latest = RunHandle(self.machine, job, ending)
        return self._latest

    def close(self) -> RunResult | None:
        """End the session (see :meth:`end`) and wait for it; its result holds what the
        tiles printed as they let go (None: there was nothing to end, as when a close()
        before returned that end). A block still running is interrupted first. On the
        machine's own thread (the shell on tile 0), it only starts the end."""
        if self.machine.scheduler.on_own_thread():
            self.end()
            return None
        latest = self._latest
        if latest is not None and isinstance(latest.program, ReplEnd):
            if latest is self._closed_end:
                return None
            handle = latest  # ended or ending (end()): its result
        else:
            if latest is not None and not latest.done:
                _stop(latest, "interrupted: the repl session ends")
                try:
                    latest.wait(_STOP_WAIT_SECONDS)
                except (TimeoutError, RuntimeError):
                    pass  # (then the end follows it when it is over)
            handle = self.end()
            if handle is None:
                return None
        result = _run_within(lambda _start_timeout: handle, None)  # (Ctrl-C meanwhile stops it)
        self._closed_end = handle
        return result

    def __enter__(self) -> "Repl":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()  # (the tiles' data stays in SRAM until then)


def _busy_job(scheduler: Scheduler, tile_ids: list[int]) -> Job | None:
    """A job running on one of the tiles, or None (on the scheduler thread)."""
    return next((job for job in (scheduler.tiles[i].job for i in tile_ids) if job is not None), None)


def _abandoned(scheduler: Scheduler, tile_ids: list[int], state: ReplState) -> None:
    """A :class:`Repl` was garbage-collected without ``close()`` (any thread): its SRAM
    and its current directories, which keep their mounts busy, are given back once its
    tiles are free (a block it launched may not even have started: it is looked at then,
    on the scheduler thread)."""
    try:
        scheduler.call(_release_when_free, scheduler, tile_ids, state)
    except RuntimeError:
        pass  # the machine has stopped: its SRAM went with it


def _release_when_free(scheduler: Scheduler, tile_ids: list[int], state: ReplState) -> None:
    busy = _busy_job(scheduler, tile_ids)
    if busy is not None:  # (a block of the session may still run: after it, then)
        busy.future.add_done_callback(
            lambda _: scheduler.running and _release_when_free(scheduler, tile_ids, state))
        return
    if not state.holding:
        return
    warnings.warn(f"a repl session on {plural(len(tile_ids), 'tile')} was dropped without close(); "
                  "its SRAM was freed, and its names let go of off their tiles", ResourceWarning)
    # Its tiles are not asked to end it, which would make them busy with a job nobody
    # started (close() does that). Nor are its names dropped here, where a __del__ would
    # hold the scheduler thread, and every tile, for as long as it runs: a thread of
    # their own lets go of them, as the thread that dropped the Repl would have.
    names = state.clear()
    threading.Thread(target=names.clear, name="ipuos-repl-let-go", daemon=True).start()


def _seconds(value, what: str) -> float | None:
    """A wait's ``value`` in seconds (None: no limit, as is infinity or any wait longer
    than the platform's locks can time: threading raised OverflowError for one):
    TypeError if not a number, ValueError if not above 0 (a wait of none would fail on
    an idle machine too)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} is seconds (a number, or None: no limit), not {value!r}")
    if not value > 0:
        raise ValueError(f"{what} must be more than 0 seconds (or None: no limit), not {value!r}")
    return float(value) if value < threading.TIMEOUT_MAX else None


def _check_output_limit(limit) -> None:
    if limit is not None and (type(limit) is not int or limit < 0):
        raise ValueError("output_limit is the characters of output kept per tile (0 or more, "
                         f"or None: no limit), not {limit!r}")


#: how long a run() that timed out waits for the program it interrupted to stop
_STOP_WAIT_SECONDS = 5.0
#: how long a run() given up by Ctrl-C lets the program clean up after its
#: KeyboardInterrupt before it stops it whatever it catches
_CTRL_C_CLEANUP_SECONDS = 1.0


def _run_within(launch: Callable[[float | None], RunHandle], timeout: float | None) -> RunResult:
    """``launch(start_timeout)`` and wait for the program, start and run within
    ``timeout``; if the wait ends first (``timeout``, Ctrl-C), interrupt the program:
    nobody else holds its handle to do it (``launch`` keeps one running)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    handle = launch(timeout)
    try:
        return handle.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        _stop(handle, f"interrupted: it ran longer than the {timeout} s run() waits")
        try:  # (so that its tiles take the next program at once)
            handle.wait(_STOP_WAIT_SECONDS)
        except (TimeoutError, RuntimeError):
            pass
        raise TimeoutError(f"job {handle.job.id} ran longer than {timeout} s, and was "
                           "interrupted (launch() keeps a program running)") from None
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            # the program gets the Ctrl-C, for its cleanup, briefly: whatever it catches, it
            # is then stopped for good, as nobody holds its handle to do it later
            _stop(handle, "interrupted: the caller stopped waiting", ctrl_c=True)
            try:
                handle.wait(_CTRL_C_CLEANUP_SECONDS)
            except BaseException:  # (it runs on; or another Ctrl-C: stop it all the more)
                pass
        _stop(handle, "interrupted: the caller stopped waiting")
        raise


def _stop(handle: RunHandle, reason: str, ctrl_c: bool = False) -> None:
    try:
        handle.interrupt(reason, ctrl_c=ctrl_c)
    except RuntimeError:
        pass  # the machine has stopped, and the program with it


def _shares(data, ntiles: int) -> list[str] | None:
    if data is None:
        return None
    if isinstance(data, str):
        raw = data.encode("utf-8")
    elif isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
    else:  # (bytes(123) would be 123 zero bytes)
        raise TypeError(f"data is text or bytes to split over the tiles, not {type(data).__name__}")
    return decode_shares(split_lines(raw, ntiles), "the data")


def _shut_down(scheduler: Scheduler, storage: Storage) -> None:
    """Stop the machine's tiles, then free what its filesystems hold outside SRAM."""
    if scheduler.stop():
        storage.release()


def _stop_abandoned(scheduler: Scheduler, storage: Storage) -> None:
    """Stop a Machine that was garbage-collected without ``close()``. The collector may
    call this on any thread, the machine's own included, which cannot wait for
    themselves to end: from those, a thread of its own stops it."""
    if scheduler.on_own_thread():
        threading.Thread(target=_shut_down, args=(scheduler, storage), name="ipuos-stop", daemon=True).start()
    else:
        _shut_down(scheduler, storage)


#: when tile filesystems are formatted and mounted (see ``ipuos.vfs.Storage``)
STORAGE_BOOT = ("lazy", "eager")

#: why umount refuses a mount a program's (a repl's) current directory is in
_PROGRAM_BUSY = "a running program's working directory is in it; let it end, or kill its job"
_REPL_BUSY = "a repl's working directory is in it; os.chdir out of it there, or leave the repl"


class Machine:
    """A simulated multi-chip machine running the ipuos tile kernel.

    ``Machine(preset="tiny")`` boots a 16-tile machine; ``Machine(ipus=4)`` four mk2
    chips. Keyword overrides change the preset (e.g. ``exchange_in=64 * 1024``).

    Every tile has an SRAM disk (preset ``disk_size``) with a littlefs filesystem at
    ``/``, brought up on the tile the first time anything uses it (``storage="lazy"``) or
    all at boot (``storage="eager"``). Tile 0 mounts the chip disk at ``/chip``: striped
    over ``chipdisk_share`` bytes of every other tile's SRAM, or the block device
    ``chip_device(tile)`` returns (called on tile 0) if given.
    ``machine.fs`` is the file API of every tile for the host (``machine.fs.listdir(3,
    "/")``).
    """

    def __init__(
        self,
        preset: str | Preset = DEFAULT_PRESET,
        ipus: int = 1,
        *,
        cost_model: CostModel | None = None,
        chip_device=None,
        storage: str = "lazy",
        **overrides,
    ):
        if cost_model is not None and not isinstance(cost_model, CostModel):
            raise TypeError(f"cost_model is a CostModel, not {type(cost_model).__name__}")
        if chip_device is not None and not callable(chip_device):
            raise TypeError(f"chip_device makes the chip disk's device: a callable, not {chip_device!r}")
        if not ipus_in_range(ipus):
            raise ValueError(f"ipus must be a whole number of chips from 1 to {MAX_IPUS}, not {ipus!r}")
        if storage not in STORAGE_BOOT:
            raise ValueError(f"storage must be one of {', '.join(STORAGE_BOOT)}, not {storage!r}")
        preset = get_preset(preset)
        if overrides:
            preset = preset.replace(**overrides)
        self.preset = preset
        self.ipus = ipus
        self.ntiles = preset.tiles_per_chip * ipus
        started = time.perf_counter()
        self.sram = SRAM(self.ntiles, preset.sram_per_tile)
        self.scheduler = Scheduler(
            self.sram, preset.tiles_per_chip, preset.exchange_out, preset.exchange_in, cost_model
        )
        self.storage = Storage(
            self.scheduler,
            disk_size=preset.disk_size,
            disk_block_size=preset.disk_block_size,
            chipdisk_share=preset.chipdisk_share,
            chipdisk_block_size=preset.chipdisk_block_size,
            chipdisk_cache=preset.chipdisk_cache,
            chipdisk_cache_page=preset.chipdisk_cache_page,
            chipdisk_cache_heads=preset.chipdisk_cache_heads,
            chip_device=chip_device,
        )
        #: every tile's files, from the host (any thread)
        self.fs: HostFsClient = self.storage.client
        self.scheduler.start()
        self._closed = False
        # a machine dropped without close() must not keep its threads and SRAM for ever
        self._finalizer = weakref.finalize(self, _stop_abandoned, self.scheduler, self.storage)
        try:
            # eager: every tile now. Otherwise tiles bring their storage up on first use,
            # except the chip tile: its /chip is striped over the other tiles, so bringing
            # it up takes the exchange, and inside a program that would end the program's
            # superstep at its first import or file operation
            self.storage.bring_up(None if storage == "eager" else [self.storage.chip_tile])
        except BaseException:
            self.close()
            raise
        self.boot_seconds = time.perf_counter() - started

    # -- programs ------------------------------------------------------------------------

    def launch(
        self,
        source: str | bytes,
        tiles=None,
        data: bytes | str | None = None,
        *,
        filename: str = "<program>",
        budget: float | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        argv: list[str] | None = None,
        start_timeout: float | None = None,
    ) -> RunHandle:
        """Start ``source`` on ``tiles`` (a spec like ``"0-99,200"``, ids, or None for all).

        ``data`` is split on line boundaries into each tile's ``__tiledata``. ``budget``
        caps the seconds a tile may compute in one superstep. ``output_limit``: the
        characters of output kept per tile (64 KiB by default; None keeps all), the rest
        counted on a last ``[output truncated: N more characters]`` line. ``argv`` is the program's
        ``__args`` (default ``[filename]``). Raises SyntaxError before anything runs,
        TileSpecError for bad tile specs, TileBusyError if a tile is busy, TimeoutError
        if the machine has not taken the program after ``start_timeout`` seconds (it
        takes programs between supersteps; then, as on Ctrl-C, it never starts), and
        ValueError if a tile has no room in its SRAM for its share of ``data`` (one
        error saying so, not each tile's MemoryError).
        """
        start_timeout = _seconds(start_timeout, "start_timeout")
        deadline = None if start_timeout is None else time.monotonic() + start_timeout
        tile_ids = parse_tiles(tiles, self.ntiles)
        shares = _shares(data, len(tile_ids))
        _check_output_limit(output_limit)
        if argv is not None and not (isinstance(argv, (list, tuple)) and all(isinstance(a, str) for a in argv)):
            raise TypeError(f"argv is a list of str (the program's __args), not {argv!r}")
        program = TileProgram(source, filename, shares, output_limit, setup=self._program_setup,
                              argv=argv)
        # (on the scheduler thread, which a computing tile holds: within the timeout)
        try:
            self.scheduler.call_wait(self._check_room, tile_ids, program.text_size, shares, timeout=start_timeout)
        except concurrent.futures.TimeoutError:
            raise not_started(filename, start_timeout) from None
        if deadline is not None:
            start_timeout = max(0.0, deadline - time.monotonic())
        job = self.scheduler.start_job(tile_ids, program, name=filename, budget=budget,
                                       timeout=start_timeout)
        return RunHandle(self, job, program)

    def run(self, source: str | bytes, tiles=None, data=None, *, timeout: float | None = None, **kwargs) -> RunResult:
        """Run ``source`` on ``tiles`` and wait for it (see :meth:`launch`): ``timeout``
        counts from the call, start included. If the wait ends first (``timeout``,
        Ctrl-C), the program is interrupted or never starts: nobody else holds its
        handle to stop it (use :meth:`launch` to keep a program running). Past
        ``timeout``, it raises TimeoutError (``job 8 ran longer than 0.5 s, and was
        interrupted``) rather than return what the tiles printed so far."""
        timeout = _seconds(timeout, "timeout")
        return _run_within(lambda start_timeout: self.launch(source, tiles, data, start_timeout=start_timeout,
                                                             **kwargs), timeout)

    def repl(self, tiles=None, data: bytes | str | None = None, *,
             output_limit: int = DEFAULT_OUTPUT_LIMIT) -> "Repl":
        """Interactive interpreters on ``tiles`` whose state persists between blocks (the
        multirepl); ``data`` is split into ``__tiledata`` as for :meth:`launch`, and each
        tile keeps its share in SRAM while the session lasts: ValueError if a tile has no
        room for it."""
        self.scheduler.check_running()  # (now, not at its first block)
        tile_ids = parse_tiles(tiles, self.ntiles)
        _check_output_limit(output_limit)
        shares = _shares(data, len(tile_ids))
        if shares is not None:
            self.scheduler.call_wait(self._check_room, tile_ids, 0, shares)
        return Repl(self, tile_ids, shares, output_limit)

    def _check_room(self, tile_ids: list[int], program_size: int, shares: list[str] | None) -> None:
        """ValueError if a tile has no room in its SRAM now (on the scheduler thread) for
        what a program's start puts there: its text (``program_size`` bytes), then its
        share of the data. A tile without it would fail with a MemoryError once the
        others had begun, and they would run up to their first exchange point (leaving
        files behind, say) before the job stopped; a repl keeps the share for the whole
        session, taken by its first block, which could then never run the user's code."""
        memories = [self.sram.memory(tile) for tile in tile_ids]
        short = [tile for tile, memory in zip(tile_ids, memories) if not memory.fits(program_size)]
        if short:
            room = max(memories[tile_ids.index(tile)].largest_free() for tile in short)
            raise ValueError(
                f"the program ({program_size} bytes) does not fit in the free SRAM of "
                f"{describe_tiles(short)}, which {'has' if len(short) == 1 else 'have'} "
                f"room for {room} bytes at most: a tile keeps its program's text in SRAM while it runs; "
                "run it on other tiles, or make room on these (`ipuos ps` shows their SRAM use)")
        if shares is None:
            return
        sizes = [len(share.encode("utf-8")) for share in shares]
        room = [memory.largest_free_after(program_size) for memory in memories]
        for tile, share, size, free in zip(tile_ids, shares, sizes, room):
            if size > free:
                whole = f"the data ({sum(sizes)} bytes) does not fit in the SRAM of " \
                        f"{plural(len(tile_ids), 'tile')} ({format_tiles(tile_ids)}): "
                lines = share.split("\n")  # (as the data is cut: at "\n" alone)
                longest = max([len(line.encode("utf-8")) + 1 for line in lines[:-1]] + [len(lines[-1].encode("utf-8"))])
                if longest > max(room):
                    # more tiles would not help: a line is never split between tiles
                    raise ValueError(
                        f"{whole}tile {tile}'s share holds a line of {longest} bytes, and no tile has "
                        f"room for more than {max(room)}; a line is never split between tiles: break it up")
                raise ValueError(
                    f"{whole}tile {tile}'s share is {size} bytes, and it has room for {free} (the "
                    f"largest free block of each tile adds up to {sum(room)} bytes); give less data, "
                    f"or spread it over more tiles")

    def _program_setup(self, api, ctx) -> None:
        """Give a program its tile's files: ``open``, ``os``, imports from the tile's
        files, and the files it leaves open closed when it ends."""
        session = self.storage.session(
            api.tile, lambda name, filename, code: module_namespace(ctx, name, filename, code),
            warn=ctx.warn,
        )
        ctx.extras["__names__"] = {"open": session.open}
        ctx.extras["__resume__"] = session.resume  # (a repl's later blocks)
        ctx.extras["__start_in__"] = session.start_in  # (a repl's block that starts where its caller is)
        ctx.extras["__suspend__"] = session.suspend
        ctx.extras["__modules__"] = dict.fromkeys(session.MODULES, session.provide)
        ctx.extras["__find_module__"] = session.find_module
        ctx.cleanups.append(session.close)
        # its current directory keeps mounts on its tile busy while it lasts
        cwds = working_directories(api.tile)
        cwds.add(session, lambda: _REPL_BUSY if session.suspended else _PROGRAM_BUSY)
        ctx.cleanups.append(lambda: cwds.discard(session))
        ctx.extras["__closed__"] = lambda: (session.end(), cwds.discard(session))

    # -- state ---------------------------------------------------------------------------

    def _between_supersteps(self, fn: Callable, timeout: float | None, what: str):
        """``fn()`` on the scheduler thread, between supersteps: a tile computing without
        an exchange point holds it up; TimeoutError past ``timeout`` seconds (None: wait)."""
        timeout = _seconds(timeout, "timeout")
        try:
            return self.scheduler.call_wait(fn, timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"no {what} within {timeout:g} s: the machine answers between supersteps, "
                               "and a tile is computing without reaching an exchange point") from None

    def stats(self, *, timeout: float | None = None) -> dict:
        """Machine-wide counters: ``supersteps``, ``supersteps_with_traffic``,
        ``bytes_exchanged``, ``simulated_exchange_seconds`` (from the cost model), and the
        machine's geometry: ``preset``, ``ipus``, ``ntiles``. The keys are those of
        ``ipuos status --json``, where a count of tiles is ``ntiles`` and ``tiles`` a list.
        ``timeout``: seconds to wait for the machine to be between supersteps."""
        stats = self._between_supersteps(self.scheduler.stats, timeout, "statistics")
        stats.update(preset=self.preset.name, ipus=self.ipus, ntiles=self.ntiles)
        return stats

    def sram_usage(self, tile: int, *, timeout: float | None = None) -> dict:
        """Named regions and free bytes of one tile's SRAM (``timeout``: see :meth:`stats`)."""
        parse_tiles([tile], self.ntiles)
        return self._between_supersteps(lambda: self.sram.memory(tile).usage(), timeout, "SRAM usage")

    def tile_states(self, *, timeout: float | None = None) -> list[dict]:
        """State, job and SRAM use of every tile (a consistent snapshot between supersteps;
        ``timeout``: see :meth:`stats`)."""

        def snapshot():
            return [
                {
                    "tile": t.id,
                    "state": t.state,
                    "job": t.job.id if t.job else None,
                    "sram_used": t.memory.used,
                    "waiting": t.waiting,
                }
                for t in self.scheduler.tiles
            ]

        return self._between_supersteps(snapshot, timeout, "tile states")

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Stop every tile (running programs are interrupted) and release the SRAM."""
        if self._closed:
            return
        self._closed = True
        self._finalizer.detach()
        _shut_down(self.scheduler, self.storage)

    def __enter__(self) -> "Machine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Machine {self.preset.name} x{self.ipus}: {self.ntiles} tiles>"
