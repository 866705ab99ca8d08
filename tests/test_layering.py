"""Imports point down the layers only: shell -> vfs -> blockdev -> scheduler -> core.

Read from the source with ``ast``, so a violation anywhere (even inside a function) fails.
And the CLI, which every ``ipuos`` command imports, leaves the machine's modules alone.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: modules of the ipuos package that form the machine core, below every layer
CORE = {"ipuos._affinity", "ipuos._presets", "ipuos._sram", "ipuos._tilespec", "ipuos._costmodel", "ipuos._grouping",
        "ipuos._tiledata", "ipuos._lazy", "ipuos._plural", "ipuos._terminate", "ipuos._spelling",
        "ipuos._signals", "ipuos._readlimit", "ipuos._shown", "ipuos._source", "ipuos._truncation"}
LAYERS = ["core", "ipuos.scheduler", "ipuos.blockdev", "ipuos.vfs", "ipuos.shell", "top"]
FOLDERS = {"scheduler": "ipuos.scheduler", "blockdev": "ipuos.blockdev", "vfs": "ipuos.vfs",
           "shell": "ipuos.shell", "ipuos": "ipuos"}


def layer_of(module: str) -> str:
    if module in CORE:
        return "core"
    for layer in LAYERS[1:-1]:
        if module == layer or module.startswith(layer + "."):
            return layer
    return "top"


def project_modules(root: Path):
    for folder, package in FOLDERS.items():
        for path in sorted((root / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            yield name, path


def imports_of(module: str, path: Path):
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            if node.module is None or (node.level and target in FOLDERS.values()):
                yield from (f"{target}.{alias.name}" for alias in node.names)
            else:
                yield target


def violations(root: Path = ROOT):
    found = []
    for module, path in project_modules(root):
        own = LAYERS.index(layer_of(module))
        for target in imports_of(module, path):
            if not (target == "ipuos" or target.startswith("ipuos.")):
                continue
            if target in FOLDERS.values() and target != "ipuos":
                target_layer = target  # importing a layer's package means its public API
            else:
                target_layer = layer_of(target)
            if LAYERS.index(target_layer) > own:
                found.append(f"{module} ({layer_of(module)}) imports {target} ({target_layer})")
    return found


def test_every_import_points_down():
    assert violations() == []


def test_the_checker_catches_an_upward_import(tmp_path):
    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "_bad.py").write_text(
        "from ._ok import x\n\ndef f():\n    from ipuos.vfs import something\n"
    )
    (tmp_path / "blockdev").mkdir()
    (tmp_path / "blockdev" / "_worse.py").write_text("from .. import shell\n")
    assert violations(tmp_path) == [
        "ipuos.scheduler._bad (ipuos.scheduler) imports ipuos.vfs (ipuos.vfs)",
        "ipuos.blockdev._worse (ipuos.blockdev) imports ipuos.shell (ipuos.shell)",
    ]


@pytest.mark.parametrize("module, layer", [
    ("ipuos._sram", "core"), ("ipuos.scheduler._api", "ipuos.scheduler"),
    ("ipuos._machine", "top"), ("ipuos.shell", "ipuos.shell"),
])
def test_layer_of(module, layer):
    assert layer_of(module) == layer


#: what only a machine, an image or a terminal needs: ~0.6 s of imports together
MACHINE_MODULES = ["numpy", "greenlet", "littlefs", "zstandard", "blake3", "mfusepy", "prompt_toolkit",
                   "rich", "ipuos._machine", "ipuos._daemon", "ipuos._image", "ipuos._mount",
                   "ipuos.scheduler._scheduler", "ipuos.blockdev", "ipuos.vfs", "ipuos.shell",
                   # (jobs, payloads and the watchdog: ~30 ms of logging, pickle, ctypes ...)
                   "ipuos.scheduler._job", "ipuos.scheduler._payload", "ipuos.scheduler._watchdog"]


def imported_by(code: str) -> list[str]:
    """Which of MACHINE_MODULES a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {MACHINE_MODULES!r} if m in sys.modules]))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_cli_starts_without_the_machine():
    assert imported_by("import ipuos._cli") == []


def test_the_shell_terminal_starts_without_the_machine():
    # (it needs the command table, for usage and completion, but no command's workings)
    code = ("from ipuos._shell_transport import DaemonTransport\nfrom ipuos.shell import COMMANDS, Terminal\n"
            "assert {'ls', 'cp', 'mount', 'put', 'get', 'multirepl'} <= set(COMMANDS)")
    assert set(imported_by(code)) == {"ipuos.shell", "prompt_toolkit"}


def test_the_machine_is_imported_where_it_is_first_used():
    assert imported_by("import ipuos, ipuos.scheduler") == []
    code = """
import ipuos, ipuos.scheduler
assert {"Machine", "Repl", "RunHandle", "RunResult"} <= set(dir(ipuos))
assert {"Scheduler", "Tile", "TileAPI", "Job", "encode", "budget_seconds"} <= set(dir(ipuos.scheduler))
assert {"Machine", "Repl", "RunHandle"} <= set(ipuos.__all__)
assert {"Scheduler", "Tile", "TileAPI"} <= set(ipuos.scheduler.__all__)
for package, name in ((ipuos, "Nothing"), (ipuos.scheduler, "Nothing")):
    try:
        getattr(package, name)
    except AttributeError as exc:
        assert str(exc) == f"module {package.__name__!r} has no attribute 'Nothing'", exc
    else:
        raise AssertionError("no AttributeError")
from ipuos import Machine
from ipuos.scheduler import Job, Scheduler
assert Machine.__module__ == "ipuos._machine" and Scheduler.__module__ == "ipuos.scheduler._scheduler"
assert Job.__module__ == "ipuos.scheduler._job"
assert ipuos.Machine is Machine
for package in (ipuos, ipuos.scheduler):  # (star imports: every public name resolves)
    assert all(getattr(package, name) is not None for name in package.__all__)
"""
    assert {"numpy", "greenlet", "ipuos._machine", "ipuos.scheduler._scheduler"} <= set(imported_by(code))
