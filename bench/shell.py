"""The shell and the multirepl through a real daemon, beside same-run baselines.

* multirepl: a block ``print(__tileid % 7)`` on 1472 tiles, from the client's send to its
  grouped answer (target < 100 ms), beside one empty superstep on the same tiles (from
  the difference of two sync loops run in the repl), a block that prints nothing, and
  a block run in-process with ``Machine.repl`` (no daemon, no tile 0 in between);
* shell: ``ls /`` typed into the shell (target < 20 ms), beside a bare daemon round trip
  (a ``kill`` of no job: a handler thread and nothing else), ``status`` (which also asks
  the scheduler thread, and reads the package version) and a shell line that does
  nothing (``echo``: the daemon, tile 0 and back).

Every figure is the median of ``--repeat`` runs (best-of hides the scheduler's hiccups
that a user does see); ``--quick`` uses the tiny preset to prove the benchmark runs.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

from _common import parser, report

from ipuos._shell_transport import DaemonTransport
from ipuos._client import Client, DaemonError
from ipuos._rundir import RUNTIME_DIR_ENV, machine_paths
from ipuos._spawn import boot, wait_halted


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(max(1, repeat)):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--ipus", type=int, default=1, help="chips of the machine (32: 47,104 tiles)")
    p.set_defaults(repeat=15)
    args = p.parse_args()
    preset, tiles = ("tiny", 16) if args.quick else ("mk2", 1472 * args.ipus)
    rundir = tempfile.mkdtemp(prefix="ipb", dir="/tmp")  # a private dir: never a user's machine
    os.environ[RUNTIME_DIR_ENV] = rundir
    paths = machine_paths(f"bench-shell-{os.getpid()}")
    boot(paths, preset, 1 if args.quick else args.ipus)
    try:
        transport = DaemonTransport(paths)
        out: list[str] = []

        def execute(line: str) -> dict:
            out.clear()
            result = transport.execute(line, on_output=lambda stream, text: out.append(text))
            assert result["status"] == 0, (line, "".join(out))
            return result

        # -- the shell -------------------------------------------------------------------------
        execute("mkdir -p /bench; touch /bench/a /bench/b /bench/c")
        with Client(paths) as client:
            def bare():
                try:
                    client.call("kill", {"job": 0})  # a handler thread, nothing else
                except DaemonError:
                    pass

            handler = median_time(bare, args.repeat * 4)
            status = median_time(lambda: client.call("status"), args.repeat * 4)
        noop = median_time(lambda: execute("echo"), args.repeat * 4)
        ls = median_time(lambda: execute("ls /"), args.repeat * 4)
        print(f"shell on machine {preset} ({tiles} tiles), median of {args.repeat * 4}")
        report("bare daemon round trip (kill of no job)", handler * 1e3, "ms")
        report("daemon round trip (status)", status * 1e3, "ms", handler * 1e3, "bare")
        report("shell line that does nothing (echo)", noop * 1e3, "ms", handler * 1e3, "bare")
        report("ls / in the shell", ls * 1e3, "ms", handler * 1e3, "bare", target="< 20 ms")

        # -- the multirepl ---------------------------------------------------------------------
        execute(f"multirepl --tiles 0-{tiles - 1}")
        execute("pass")  # every tile's namespace exists from here on
        block = median_time(lambda: execute("print(__tileid % 7)"), args.repeat)
        assert out[0].startswith(f"[{-(-tiles // 7)} tiles: 0-"), out
        silent = median_time(lambda: execute("pass"), args.repeat)
        short, long = 20, 220
        loop_short = median_time(lambda: execute(f"for _ in range({short}): sync()"), max(3, args.repeat // 3))
        loop_long = median_time(lambda: execute(f"for _ in range({long}): sync()"), max(3, args.repeat // 3))
        superstep = (loop_long - loop_short) / (long - short)
        execute("exit()")
        transport.close()
        print(f"multirepl on {tiles} tiles, median of {args.repeat}")
        report("empty superstep on the same tiles", superstep * 1e3, "ms")
        report("block that prints nothing", silent * 1e3, "ms", superstep * 1e3, "superstep")
        report("print(__tileid % 7)", block * 1e3, "ms", superstep * 1e3, "superstep", target="< 100 ms")
        report("print(__tileid % 7)", block * 1e3, "ms", silent * 1e3, "silent block")
    finally:
        with Client(paths) as client:
            client.call("halt")
        wait_halted(paths)
        shutil.rmtree(rundir, ignore_errors=True)

    # the same block without the daemon or tile 0: what the job itself costs
    import ipuos

    with ipuos.Machine(preset, 1 if args.quick else args.ipus) as machine:
        repl = machine.repl(f"0-{tiles - 1}")
        repl.run("pass")
        inproc = median_time(lambda: repl.run("print(__tileid % 7)").format(), args.repeat)
    report("print(__tileid % 7) in-process (Machine.repl)", inproc * 1e3, "ms", block * 1e3, "through the shell")


if __name__ == "__main__":
    main()
