"""When a block typed line by line is ready to run: the interactive interpreter's rule.

``for``/``def``/``if`` blocks continue until an empty line; an open bracket or string
continues until it closes. The terminal decides this locally (it only compiles, nothing
runs), so that a multi-line block reaches the tiles as one job.
"""

from __future__ import annotations

import codeop
import warnings

__all__ = ["block_complete"]


def block_complete(source: str) -> bool:
    """True if ``source`` is a whole block, or so broken that more lines cannot help (the
    tiles then report the SyntaxError)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return codeop.compile_command(source, "<input>", "single") is not None
        except (SyntaxError, OverflowError, ValueError):
            return True
