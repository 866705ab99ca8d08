"""How long a client command takes, beside Python's own start-up.

Every ``ipuos`` command is a new process: the figure a user feels is the whole command,
from exec to exit. Measured against a running daemon of the default machine (mk2; its
own runtime dir and name, so nothing of the user's is touched) that has been used: a
program has touched every tile's disk first. Best of ``--repeat``, contenders taken in
turn:

* ``python -c pass`` - the floor: the interpreter starting in the same virtualenv;
* ``ipuos --version`` - the CLI imported, nothing asked of a daemon;
* ``ipuos status``, ``ipuos ps --json`` - a request and its answer;
* ``ipuos run --tiles 0`` - a one-line program on one tile;
* ``ipuos run`` of a BSP step - ``sync()`` then a print, on every tile (the whole chip);
* ``ipuos shell -c 'ls /'`` - a shell session on tile 0 and one command.

Run: ``./dev bench cli`` (``--quick``: the tiny preset and fewer runs, to prove it runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import best_interleaved, parser, report  # noqa: E402

IPUOS = str(Path(sys.executable).with_name("ipuos"))


def command(argv: list[str], env: dict) -> Callable[[], float]:
    def measure() -> float:
        started = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
        return time.perf_counter() - started

    return measure


def main() -> None:
    args = parser(__doc__.splitlines()[0], repeat=10).parse_args()
    repeat = 2 if args.quick else args.repeat
    with tempfile.TemporaryDirectory(prefix="ipuos-bench-cli-") as work:
        runtime = Path(work) / "run"
        runtime.mkdir(mode=0o700)
        program = Path(work) / "hello.py"
        program.write_text("print('hello')\n")
        step = Path(work) / "step.py"
        step.write_text("sync()\nprint('hello')\n")
        touch = Path(work) / "touch.py"
        touch.write_text("import os\nos.listdir('/')\n")
        env = dict(os.environ, IPUOS_RUNTIME_DIR=str(runtime), IPUOS_MACHINE="bench-cli")
        preset = "tiny" if args.quick else "mk2"
        subprocess.run([IPUOS, "boot", "--preset", preset], env=env, check=True, stdout=subprocess.DEVNULL)
        try:
            subprocess.run([IPUOS, "run", str(touch)], env=env, check=True, stdout=subprocess.DEVNULL)
            best = best_interleaved({
                "python -c pass": command([sys.executable, "-c", "pass"], env),
                "ipuos --version": command([IPUOS, "--version"], env),
                "ipuos status": command([IPUOS, "status"], env),
                "ipuos ps --json": command([IPUOS, "ps", "--json"], env),
                "ipuos run --tiles 0": command([IPUOS, "run", "--tiles", "0", str(program)], env),
                "ipuos run, sync() on every tile": command([IPUOS, "run", str(step)], env),
                "ipuos shell -c 'ls /'": command([IPUOS, "shell", "-c", "ls /"], env),
            }, repeat)
        finally:
            subprocess.run([IPUOS, "halt"], env=env, stdout=subprocess.DEVNULL)
    floor = best.pop("python -c pass")
    report("python -c pass", floor * 1e3, "ms")
    for name, seconds in best.items():
        report(name, seconds * 1e3, "ms", floor * 1e3, "python -c pass")


if __name__ == "__main__":
    main()
