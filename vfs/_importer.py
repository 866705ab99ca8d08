"""Importing Python modules that live on the tile's own filesystem.

``import helpers`` on a tile looks for a package ``helpers/__init__.py``, else ``helpers.py``
(the host's order), in each directory of :data:`MODULE_PATH`, in order: the program's current directory at the
time of the import, then ``/lib``. The standard modules a tile may use always win (a file
``json.py`` cannot shadow ``json``), as the runtime asks this finder last.

A module is loaded once per program run and executed in a tile namespace (the runtime
supplies it: ``print``, the exchange primitives and ``open`` reach it through the tile's
builtins), so its code is tile code like the program's. Its file name is its VFS path,
so tracebacks point at it.
"""

from __future__ import annotations

import linecache
import types
from importlib.util import decode_source
from typing import Callable

from ipuos.scheduler import TILE_SOURCE_LINES

__all__ = ["MODULE_PATH", "TileImporter"]

#: where ``import`` looks on a tile; "" is the current directory
MODULE_PATH = ("", "/lib")

_MISSING = (FileNotFoundError, NotADirectoryError, IsADirectoryError)


def _names_a_file(part: str) -> bool:
    """Whether ``part`` of a dotted module name can be a module's file name, as the
    host's finder takes it: not empty (``a..b``, ``.``), no path of its own (``sub/x``
    would load ``/lib/sub/x.py``), no NUL."""
    return bool(part) and "/" not in part and "\0" not in part


class TileImporter:
    """``__find_module__`` for the runtime: ``finder(name, fromlist)`` returns what
    ``__import__`` would, or None if no file provides the top-level module.

    ``vfs()`` gives the tile's Vfs; ``new_globals(name, filename, code)`` a fresh namespace
    for a module's code.
    """

    def __init__(self, vfs: Callable, new_globals: Callable[[str, str, types.CodeType], dict]):
        self._vfs = vfs
        self._new_globals = new_globals
        #: modules loaded by this program run, by dotted name
        self.modules: dict[str, types.ModuleType] = {}

    def __call__(self, name: str, fromlist=()):
        parts = name.split(".")
        top = self._load(parts[0], None) if _names_a_file(parts[0]) else None
        if top is None:
            return None
        module = top
        for depth in range(1, len(parts)):
            fullname = ".".join(parts[: depth + 1])
            if not hasattr(module, "__path__"):
                raise ModuleNotFoundError(f"no module named {fullname!r} on this tile; "
                                          f"{module.__name__!r} is not a package", name=fullname)
            module = self._load(fullname, module) if _names_a_file(parts[depth]) else None
            if module is None:
                raise ModuleNotFoundError(f"no module named {fullname!r} on this tile", name=fullname)
        if fromlist and hasattr(module, "__path__"):
            items = list(fromlist)
            if "*" in items:  # what the package's __all__ names, submodules included
                items.remove("*")
                items.extend(item for item in getattr(module, "__all__", ()) if isinstance(item, str))
            for item in items:
                if not hasattr(module, item) and _names_a_file(item) and "." not in item:
                    self._load(f"{module.__name__}.{item}", module)  # a submodule, if any
        return module if fromlist else top

    def search_path(self) -> list[str]:
        """The directories searched, in order, as they are right now."""
        try:
            cwd = self._vfs().getcwd()
        except FileNotFoundError:  # removed: skipped, as the host's import skips it
            return [directory for directory in MODULE_PATH if directory]
        return [directory or cwd for directory in MODULE_PATH]

    def _load(self, fullname: str, parent):
        module = self.modules.get(fullname)
        if module is not None:
            return module
        leaf = fullname.rpartition(".")[2]
        directories = parent.__path__ if parent is not None else self.search_path()
        vfs = self._vfs()
        for directory in directories:
            base = directory.rstrip("/") + "/" + leaf
            for filename, is_package in ((base + "/__init__.py", True), (base + ".py", False)):
                try:
                    with vfs.open(filename, "rb") as file:
                        source = file.read()
                except _MISSING:
                    continue
                module = self._execute(fullname, filename, source, base if is_package else None)
                if parent is not None:
                    setattr(parent, leaf, module)
                return module
        return None

    def _execute(self, fullname: str, filename: str, source: bytes, package_dir):
        # the bytes go to compile(), as CPython's importer does: a BOM or a coding line
        # (PEP 263) decides the encoding, not an assumed UTF-8
        code = compile(source, filename, "exec", dont_inherit=True)
        text = decode_source(source)
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        module = types.ModuleType(fullname)
        module.__dict__.update(self._new_globals(fullname, filename, code))
        module.__dict__[TILE_SOURCE_LINES] = {filename: text.splitlines()}  # (this tile's copy)
        module.__file__ = filename
        if package_dir is not None:
            module.__path__ = [package_dir]
            module.__package__ = fullname
        else:
            module.__package__ = fullname.rpartition(".")[0]
        self.modules[fullname] = module  # before running it: circular imports find it
        try:
            exec(code, module.__dict__)
        except BaseException:
            del self.modules[fullname]
            raise
        return module
