"""One program run's files: its ``open``, its ``os``, its imports, and cleanup at exit.

The runtime makes a :class:`TileSession` for every tile of every program it starts and
puts ``open`` (and the ``os`` provider and module finder) into the program's namespace.
Nothing here touches storage until the program does: a program that never opens a file
never brings its tile's filesystem up (so a one-line program on 47,104 tiles costs no
littlefs at all), and ``os`` is only built when imported.

When the program ends, :meth:`TileSession.close` closes every file it left open (and any
it dropped without closing), so their writes are committed; failures come back as text
for the program's output. A file it dropped earlier is closed by the tile's next file
operation (see ``_files``), and a failure then goes to its output at once. Each program
starts in ``/``, and the current directory is the program's own: a repl session's tile
keeps the one its blocks left (:meth:`TileSession.resume`) whatever other programs and
repls did on that tile between them.

Once the program has ended (or a repl's block, until the next), the session refuses
(OSError EBADF): its ``open``, its ``os`` (and glob, shutil, pathlib) and its imports
from files are then called only by the ``__del__`` of an object that outlived it in a
reference cycle, run wherever Python's cycle collector next runs. It refuses anywhere
but on the tile's own greenlet too (EPERM), which alone touches the tile's filesystems.
"""

from __future__ import annotations

import errno
import functools
import types
import weakref
from typing import Callable

from ipuos.scheduler import ended_call, foreign_call

from ._importer import TileImporter
from ._tileglob import make_glob_module
from ._tileos import make_os_module
from ._tilepathlib import make_pathlib_module
from ._tileshutil import make_shutil_module
from ._vfs import VFS_KEY

__all__ = ["TileSession"]

_weakref = weakref.ref


class TileSession:
    """What one program on one tile sees of the tile's files (see module doc)."""

    __slots__ = ("_vfs_of", "_tile", "_vfs", "_files", "_prune_at", "_modules", "_importer",
                 "_new_globals", "_cwd", "_cwd_removed", "_removals", "_suspended", "_warn",
                 "_untold", "_ending", "_closed")

    #: the standard modules a program gets its own copy of, bound to its tile's files:
    #: name -> how to make it for a session
    _MAKERS: dict[str, Callable] = {
        "os": lambda session: make_os_module(_CheckedVfs(session)),
        "glob": lambda session: make_glob_module(session.module("os")),
        "shutil": lambda session: make_shutil_module(session.module("os"), session.open,
                                                     _CheckedVfs(session).place),
        "pathlib": lambda session: make_pathlib_module(session.module("os"), session.open),
    }
    MODULES = tuple(_MAKERS)

    def __init__(self, tile, vfs_of: Callable,
                 new_globals: Callable[[str, str, types.CodeType], dict] | None = None,
                 warn: Callable[[str], None] | None = None):
        self._tile = tile
        self._vfs_of = vfs_of
        #: ``new_globals(name, filename, code)``: a namespace for a module imported from the tile
        self._new_globals = new_globals
        #: ``warn(message)`` writes a warning on the program's output now (None: kept for close)
        self._warn = warn
        #: warnings with no output to go to yet (a repl between blocks): told later
        self._untold: list[str] = []
        self._ending = False
        self._vfs = tile.kernel_data.get(VFS_KEY)
        self._cwd = "/"
        self._cwd_removed = False
        #: the VFS's count of removals when the session's last block ended
        self._removals = 0
        self._suspended = False
        self._closed = False
        if self._vfs is not None:
            self._vfs.reset_cwd()
        #: weak references to every binary file this program opened (pruned now and then)
        self._files: list = []
        self._prune_at = 64
        #: the program's own os, glob, shutil and pathlib, made when first imported
        self._modules: dict[str, types.ModuleType] = {}
        self._importer: TileImporter | None = None

    @property
    def cwd(self) -> str:
        """The program's current directory (a repl's, between its blocks, too)."""
        vfs = self._vfs
        return vfs.cwd if vfs is not None and not self._suspended else self._cwd

    @property
    def suspended(self) -> bool:
        """A repl's block has ended and its next has not started."""
        return self._suspended

    @property
    def vfs(self):
        vfs = self._vfs
        if vfs is None:
            vfs = self._vfs = self._vfs_of(self._tile)
            vfs.reset_cwd(self._cwd, self._cwd_removed)  # (another program may have brought it up, and moved)
            vfs.recheck_cwd()  # (a repl's, after a restore: the new files may lack it)
        return vfs

    def open(self, file, mode: str = "r", buffering: int = -1, encoding: str | None = None,
             errors: str | None = None, newline: str | None = None, closefd: bool = True,
             opener=None):
        """The program's ``open``: the host's semantics, on the tile's own files."""
        self.check("open()")
        result = self.vfs.open(file, mode, buffering, encoding, errors, newline, closefd, opener)
        raw = result if "b" in mode else result.buffer
        raw.report_failed_close = self._dropped_file_failed
        files = self._files
        # weakly: a file the program drops must reach its finalizer (see ``_files``)
        files.append(_weakref(raw))
        if len(files) >= self._prune_at:
            files[:] = [ref for ref in files if (f := ref()) is not None and not f.closed]
            self._prune_at = max(64, 2 * len(files))
        return result

    def _dropped_file_failed(self, file, exc: Exception) -> None:
        """A file the program dropped without closing it failed to close when the VFS
        closed it (see ``Vfs.close_pending``): said on the program's output, once."""
        if self._ending:
            self._untold.append(f"closing {file.name!r} at exit failed: {exc}")
            return
        message = f"closing {file.name!r} (dropped without close()) failed: {exc}"
        if self._suspended or self._warn is None:
            self._untold.append(message)  # (no output of the repl's is read now)
        else:
            self._warn(message)

    def start_in(self, path: str) -> None:
        """Make the canonical ``path`` the program's current directory, as a process
        started there has it: if it is no directory now (removed since its caller stood
        there), the program is in a removed directory, as on the host (``getcwd`` and
        relative paths fail with ENOENT), never somewhere else."""
        vfs = self.vfs
        try:
            vfs.chdir(path)
        except OSError:
            vfs.reset_cwd(path, removed=True)

    def check(self, what: str) -> None:
        """Refuse ``what`` (``"open()"``, ``"listdir()"``) once the program has ended, or
        a repl's block (until its next), and anywhere but on the tile's own greenlet
        (see module doc)."""
        if self._closed or self._suspended or self._tile.elsewhere() is not None:
            self._refuse(what)

    def _refuse(self, what: str) -> None:
        tile = f"tile {self._tile.id}"
        where = None if self._closed else self._tile.elsewhere()
        if where is None:
            raise OSError(errno.EBADF, ended_call(what, tile))
        raise OSError(errno.EPERM, foreign_call(what, tile, where))

    # -- modules ---------------------------------------------------------------------------

    def module(self, name: str) -> types.ModuleType:
        """The program's ``name`` (one of :attr:`MODULES`), made on first use."""
        self.check(f"import {name}")
        module = self._modules.get(name)
        if module is None:
            module = self._modules[name] = self._MAKERS[name](self)
        return module

    def provide(self, name: str, fromlist=()):
        """The runtime's module provider for :attr:`MODULES` (``import os``, ``import
        os.path``, ``from os import path``, ``from os.path import join``, ``import glob``
        ...)."""
        top = name.partition(".")[0]
        module = self.module(top)
        if name == top:
            return module
        if name == "os.path":
            return module.path if fromlist else module
        raise ModuleNotFoundError(f"no module named {name!r} on this tile", name=name)

    def find_module(self, name: str, fromlist=()):
        """The runtime's finder for modules stored on the tile (see ``_importer``):
        the module ``__import__`` returns, or None if no file provides it."""
        self.check(f"import {name}")
        if self._importer is None:
            if self._new_globals is None:
                return None
            self._importer = TileImporter(lambda: self.vfs, self._new_globals)
        return self._importer(name, fromlist)

    # -- the end of the program ----------------------------------------------------------------

    def suspend(self) -> None:
        """The session's block has ended (a repl's): close the files it dropped (CPython
        would have; on another tile's disk, they may hold writes: see ``_files``), and keep
        its current directory, which the tile's next program or repl will move."""
        if self._vfs is not None:
            self._vfs.close_pending()  # (failures: on the block's output, see _dropped_file_failed)
            self._cwd, self._cwd_removed = self._vfs.cwd, self._vfs.cwd_removed
            self._removals = self._vfs.removals
        self._suspended = True

    def resume(self) -> None:
        """The session's next block starts: its current directory is back (as a string:
        had it been renamed away meanwhile, it is taken as removed, as it is if it was,
        or if the files a restore brought meanwhile lack it)."""
        self._suspended = False
        if self._untold and self._warn is not None:
            untold, self._untold = self._untold, []
            for message in untold:
                self._warn(message)
        vfs = self._vfs
        if vfs is not None and vfs is not self._tile.kernel_data.get(VFS_KEY):
            # a restore dropped the tile's VFS and every filesystem in it meanwhile
            # (``Storage.forget``): the block reaches the restored ones, through the VFS
            # the tile has now or brings up on first use, where :attr:`vfs` looks again
            # whether the current directory is there
            self._vfs = vfs = None
        if vfs is not None:
            vfs.reset_cwd(self._cwd, self._cwd_removed)
            if vfs.removals != self._removals:  # (else nothing can have taken it away)
                vfs.recheck_cwd()

    def end(self) -> None:
        """The program has ended: refuse from now on (see module doc)."""
        self._closed = True

    def close(self) -> list[str]:
        """End the session, then close what the program left open (a ``__del__`` that
        runs meanwhile opens nothing more); returns one message per failure."""
        self.end()
        problems = []
        for ref in self._files:
            file = ref()
            if file is not None and not file.closed:
                try:
                    file.close()
                except Exception as exc:
                    problems.append(f"closing {file.name!r} at exit failed: {exc}")
        self._files.clear()
        self._ending = True
        if self._vfs is not None:
            self._vfs.close_pending()  # (failures: see _dropped_file_failed)
        problems.extend(self._untold)
        self._untold.clear()
        return problems


class _CheckedVfs:
    """The tile's Vfs as the program's ``os`` (and the glob, shutil and pathlib made over
    it) reaches it: every call is checked by the session first (see
    :meth:`TileSession.check`)."""

    def __init__(self, session: TileSession):
        self._session = session

    def __getattr__(self, name: str):
        """Called once per name: the wrapper made then is kept in the instance's dict
        (``os.path.relpath`` looks up ``abspath`` at every call)."""
        session = self._session
        value = getattr(session.vfs, name)
        if not callable(value):
            return value
        what = f"{name}()"

        def checked(*args, **kwargs):
            session.check(what)
            return getattr(session.vfs, name)(*args, **kwargs)

        checked = self.__dict__[name] = functools.update_wrapper(checked, value)
        return checked
