"""ipuos: a simulated many-core chip (Graphcore-IPU-like) running a small Python OS.

The public Python API. Layers live in subpackages: ``ipuos.scheduler``,
``ipuos.blockdev``, ``ipuos.vfs`` and ``ipuos.shell``.

The machine (and with it numpy, greenlet, littlefs) is imported on first use of
``Machine``, ``Repl`` or ``RunHandle``: every CLI command imports this package, and most
only talk to a running daemon.
"""

import os as _os

# before numpy is first imported: one BLAS thread, not a pool spinning on the CPU
# (ipuos never calls BLAS; see _memtune)
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    _os.environ.setdefault(_name, "1")

from ._grouping import OutputGroup, format_groups, group_texts  # noqa: E402
from ._lazy import lazy_exports  # noqa: E402
from ._presets import DEFAULT_PRESET, PRESETS, Preset, get_preset  # noqa: E402
from ._runresult import EXIT_INTERRUPTED, RunResult, TileRun  # noqa: E402
from ._tilespec import TileSpecError, format_tiles, parse_tiles  # noqa: E402
from .scheduler import JobStats, TileBusyError  # noqa: E402

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


#: public names imported on first use (see ipuos._lazy)
__getattr__, __dir__ = lazy_exports(__name__, globals(),
                                    {"Machine": "._machine", "Repl": "._machine", "RunHandle": "._machine"})
