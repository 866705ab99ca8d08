"""ipuos: a simulated many-core chip (Graphcore-IPU-like) running a small Python OS.

The public Python API. Layers live in subpackages: ``ipuos.scheduler``,
``ipuos.blockdev``, ``ipuos.vfs`` and ``ipuos.shell``.
"""

from ._grouping import OutputGroup, format_groups, group_texts
from ._machine import EXIT_INTERRUPTED, Machine, RunHandle, RunResult, TileRun
from ._presets import DEFAULT_PRESET, PRESETS, Preset, get_preset
from ._tilespec import TileSpecError, format_tiles, parse_tiles

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_PRESET",
    "EXIT_INTERRUPTED",
    "PRESETS",
    "Machine",
    "OutputGroup",
    "Preset",
    "RunHandle",
    "RunResult",
    "TileRun",
    "TileSpecError",
    "format_groups",
    "format_tiles",
    "get_preset",
    "group_texts",
    "parse_tiles",
]
