"""A tile program's text from the bytes of its file, read as Python reads a source file."""

from __future__ import annotations

import codecs
from importlib.util import decode_source

__all__ = ["source_text", "source_problem"]


def source_text(source) -> str:
    """A program's text: str, or bytes (any bytes-like object) read as Python reads a
    file: in the encoding its coding declaration names (PEP 263), else UTF-8; a byte-order
    mark, as editors may save, is dropped, as Python reads past it. TypeError otherwise;
    for bytes that are no such text, what :func:`source_problem` describes."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        try:
            source = decode_source(data)  # (UnicodeDecodeError; SyntaxError: a declaration it cannot read)
        except SyntaxError:
            # (no declaration, and the first lines are not UTF-8: say where, as UTF-8 text)
            data.decode("utf-8")
            raise
    elif not isinstance(source, str):
        raise TypeError(f"a program's source is str or bytes, not {type(source).__name__}")
    return source[1:] if source.startswith("\ufeff") else source


def source_problem(exc: Exception) -> str:
    """Why :func:`source_text` refused a program's bytes (its exception), to follow its name."""
    if isinstance(exc, UnicodeDecodeError):
        if codecs.lookup(exc.encoding).name == "utf-8":
            return f"is not UTF-8 text (byte {exc.start})"
        return f"is not {exc.encoding} text, as its coding declaration says (byte {exc.start})"
    return f"has a coding declaration Python cannot read ({getattr(exc, 'msg', exc)})"
