"""A tile program's text from the bytes of its file, read as Python reads a source file."""

from __future__ import annotations

import codecs
import tokenize

__all__ = ["source_text", "source_problem"]


def source_text(source) -> str:
    """A program's text: str, or bytes (any bytes-like object) read as Python reads a
    file: in the encoding its coding declaration names (PEP 263), else UTF-8, with any
    line ending; a byte-order mark, as editors may save, is dropped, as Python reads past
    it. TypeError otherwise; for bytes that are no such text, UnicodeDecodeError (named
    for the declared encoding) or SyntaxError, which :func:`source_problem` words."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        # (lines as Python's tokenizer ends them: a file with CR endings is one line to
        # a readline that looks for LF, and its declaration went unseen)
        lines = iter(data.splitlines(keepends=True))
        try:
            encoding, _ = tokenize.detect_encoding(lambda: next(lines, b""))
        except SyntaxError as exc:
            if data.startswith(codecs.BOM_UTF8):
                raise SyntaxError("starts with a UTF-8 byte-order mark but declares another encoding") from None
            data.decode("utf-8")  # (no declaration read, and not UTF-8 text: where, as a decode error)
            raise SyntaxError(f"has a coding declaration Python cannot read ({exc.msg})") from None
        try:
            text = data.decode(encoding)  # ("utf-8-sig" for a BOM: dropped)
        except UnicodeDecodeError as exc:
            raise UnicodeDecodeError(encoding, exc.object, exc.start, exc.end, exc.reason) from None
        source = text.replace("\r\n", "\n").replace("\r", "\n")
    elif not isinstance(source, str):
        raise TypeError(f"a program's source is str or bytes, not {type(source).__name__}")
    return source[1:] if source.startswith("\ufeff") else source


def source_problem(exc: Exception) -> str:
    """Why :func:`source_text` refused a program's bytes (its exception), to follow its name."""
    if isinstance(exc, UnicodeDecodeError):
        if codecs.lookup(exc.encoding).name in ("utf-8", "utf-8-sig"):
            return f"is not UTF-8 text (byte {exc.start})"
        return f"is not {exc.encoding} text, as its coding declaration says (byte {exc.start})"
    return getattr(exc, "msg", None) or str(exc)
