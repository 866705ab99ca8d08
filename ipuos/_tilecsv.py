"""A program's csv: a field size limit of its own, applied as its readers parse.

The standard module's ``field_size_limit`` is the whole process's (the C reader reads a
global as it parses each row): one program's ``field_size_limit(n)`` was every tile's,
later programs' and the host's. The runtime gives each program a copy of ``csv``
(``_runtime._tile_csv``) with these names in place of the standard ones: the limit lives
in the program's context, as decimal's precision does, and each reader puts it in force
only while it parses a row.
"""

from __future__ import annotations

import contextvars
import csv
import types

from ._rebind import with_globals

__all__ = ["TILE_CSV_NAMES"]


#: a program's own csv field size limit, in its context as decimal's precision is (None:
#: it has set none, and the host's applies)
_CSV_FIELD_LIMIT: contextvars.ContextVar[int | None] = contextvars.ContextVar("csv_field_limit", default=None)

#: the standard csv's limit: the whole process's, which its readers read as they parse
_host_field_limit = csv.field_size_limit
_host_csv_reader = csv.reader


def _csv_field_size_limit(*new_limit, **as_keyword):
    own = _CSV_FIELD_LIMIT.get()
    old = _host_field_limit() if own is None else own
    if new_limit or as_keyword:  # (the standard function checks it; the host's is put back at once)
        _CSV_FIELD_LIMIT.set(_host_field_limit(_host_field_limit(*new_limit, **as_keyword)))
    return old


class _CsvLines:
    """The lines a program's csv reader parses, fetched with the host's limit in force:
    fetching runs the program's code (its generator, its file in another tile's SRAM),
    which may pause the tile at an exchange point, and the other tiles' readers and
    the host must not meet this program's limit meanwhile."""

    __slots__ = ("_lines", "host_limit")

    def __init__(self, lines):
        self._lines = iter(lines)
        #: the host's limit while the reader has put the program's in its place, or None
        self.host_limit = None

    def __iter__(self):
        return self

    def __next__(self):
        host_limit = self.host_limit
        if host_limit is None:
            return next(self._lines)
        own = _host_field_limit(host_limit)
        try:
            return next(self._lines)
        finally:
            _host_field_limit(own)


class _CsvReader:
    """A program's csv reader: the standard one, with the program's field size limit in
    force while it parses a row and the host's back before anything else runs. Nothing
    else can meanwhile: greenlets switch only at exchange points, which the reader
    itself never reaches, and its lines are fetched with the host's limit."""

    __slots__ = ("_rows", "_lines")

    def __init__(self, csvfile, *args, **kwargs):
        self._lines = _CsvLines(csvfile)
        self._rows = _host_csv_reader(self._lines, *args, **kwargs)

    def __iter__(self):
        return self

    def __next__(self):
        own = _CSV_FIELD_LIMIT.get()
        if own is None:
            return next(self._rows)
        lines = self._lines
        lines.host_limit = _host_field_limit(own)
        try:
            return next(self._rows)
        finally:
            _host_field_limit(lines.host_limit)
            lines.host_limit = None

    @property
    def dialect(self):
        return self._rows.dialect

    @property
    def line_num(self) -> int:
        return self._rows.line_num


# (shown as the standard reader is: <_csv.reader object at ...>)
_CsvReader.__module__, _CsvReader.__name__, _CsvReader.__qualname__ = "_csv", "reader", "reader"


def _csv_reader(csvfile, dialect="excel", **fmtparams):
    return _CsvReader(csvfile, dialect, **fmtparams)


def _standing_in_for(function, standard):
    """``function`` under the name and doc of the ``standard`` one it replaces."""
    function.__name__ = function.__qualname__ = standard.__name__
    function.__module__, function.__doc__ = "csv", standard.__doc__
    return function


def _with_module_names(cls: type, namespace: dict, name: str) -> type:
    """A subclass of ``cls`` whose methods that use the module's ``name`` find it in
    ``namespace``: the same code with other globals."""
    methods = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}
    for key, function in vars(cls).items():
        if isinstance(function, types.FunctionType) and name in function.__code__.co_names:
            methods[key] = with_globals(function, namespace)
    return type(cls.__name__, (cls,), methods)


def _tile_csv_names() -> dict:
    """What a program's csv has in place of the standard module's (see _tile_csv)."""
    names = {"reader": _standing_in_for(_csv_reader, csv.reader),
             "field_size_limit": _standing_in_for(_csv_field_size_limit, csv.field_size_limit)}
    namespace = {**vars(csv), **names}
    names.update(DictReader=_with_module_names(csv.DictReader, namespace, "reader"),
                 Sniffer=_with_module_names(csv.Sniffer, namespace, "reader"))
    namespace.update(names)
    return names


#: the names a program's copy of csv has in place of the standard module's
TILE_CSV_NAMES = _tile_csv_names()
