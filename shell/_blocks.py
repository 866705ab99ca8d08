"""When a block typed line by line is ready to run: the interactive interpreter's rule.

``for``/``def``/``if`` blocks continue until an empty line; an open bracket or string
continues until it closes. The terminal decides this locally (it only compiles, nothing
runs), so that a multi-line block reaches the tiles as one job.
"""

from __future__ import annotations

import codeop
import re
import warnings

__all__ = ["block_complete", "inside_compound_statement"]

#: a line that opens a compound statement whose body follows on the next lines
_HEADER = re.compile(r"(?:async\s+)?(?:def|class|if|for|while|with|try|match)\b.*:\s*")


def block_complete(source: str) -> bool:
    """True if ``source`` is a whole block, or so broken that more lines cannot help (the
    tiles then report the SyntaxError)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return codeop.compile_command(source, "<input>", "single") is not None
        except (SyntaxError, OverflowError, ValueError):
            return True


def inside_compound_statement(lines: list[str]) -> bool:
    """True when the last of ``lines`` cannot have ended the block: the block opened with
    a compound statement's header and the line is more of its indented body, and such a
    block ends only at an empty line (or is an error). Checking each line of a block
    read from a pipe recompiled all of it: 2,000 lines took a minute. (Typed lines are
    checked each: an indentation error shows at once, as in Python's REPL.)"""
    header = 0
    while header < len(lines) - 1 and lines[header].startswith("@"):  # (decorators first)
        header += 1
    return (len(lines) > header + 1 and bool(lines[-1].strip()) and lines[-1][:1] in (" ", "\t")
            and _HEADER.fullmatch(lines[header]) is not None)
