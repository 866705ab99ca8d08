"""ipuos: a simulated many-core chip (Graphcore-IPU-like) running a small Python OS.

The public Python API. Layers live in subpackages: ``ipuos.scheduler``,
``ipuos.blockdev``, ``ipuos.vfs`` and ``ipuos.shell``.

Every public name is imported on first use: every CLI command imports this package, most
only talk to a running daemon (the machine brings numpy, greenlet and littlefs), and
until the CLI is imported a Ctrl-C has nothing to end it quietly (see ``_entry``).
"""

import os as _os

# before numpy is first imported: one BLAS thread, not a pool spinning on the CPU
# (ipuos never calls BLAS; see _memtune)
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    _os.environ.setdefault(_name, "1")

from ._lazy import lazy_exports  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_PRESET",
    "EXIT_INTERRUPTED",
    "PRESETS",
    "JobStats",
    "Machine",
    "OutputGroup",
    "Preset",
    "Repl",
    "RunHandle",
    "RunResult",
    "TileBusyError",
    "TileRun",
    "TileSpecError",
    "format_groups",
    "format_tiles",
    "get_preset",
    "group_texts",
    "parse_tiles",
]


#: public names imported on first use (see ipuos._lazy), and the modules that define them
__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    **dict.fromkeys(["OutputGroup", "format_groups", "group_texts"], "._grouping"),
    **dict.fromkeys(["DEFAULT_PRESET", "PRESETS", "Preset", "get_preset"], "._presets"),
    **dict.fromkeys(["EXIT_INTERRUPTED", "RunResult", "TileRun"], "._runresult"),
    **dict.fromkeys(["TileSpecError", "format_tiles", "parse_tiles"], "._tilespec"),
    **dict.fromkeys(["JobStats", "TileBusyError"], ".scheduler"),
    **dict.fromkeys(["Machine", "Repl", "RunHandle"], "._machine"),
})
