"""Turning objects into exchange bytes and back.

Plain scalars (numbers, strings, bytes, None) go through marshal, which is the fastest
for them and cannot run code while loading; everything else through pickle. marshal would
take containers too, but it writes any object with the buffer protocol (a bytearray, an
array.array, a memoryview) as bytes, so a list holding one would arrive changed; finding
out costs more than pickling the list (which pickle does as fast as marshal, measured on
lists of 2,000 ints and dicts of 500 entries). One tag byte says which was used.

Classes and functions a tile program defines itself (in its ``__main__`` or in a module
on its files), and those of the tile's own versions of host modules (its ``pathlib``),
cannot be found by pickle's usual lookup, which searches the host's modules. They travel
by name instead, and the receiving tile looks the name up in its own program, as MPI
ranks each running the same program do: an instance of the program's ``Point`` arrives
as an instance of the receiver's ``Point``.

The other globals a tile's data names (``datetime.date``, ``builtins.complex``) are found
as the receiving tile's program sees them: the runtime says how (:class:`ProgramGlobals`).
Found the host's way, ``builtins.open`` in a payload was the host's open. The sending
program's own copyreg registrations apply to what it sends.
"""

from __future__ import annotations

import io
import marshal
import pickle
import re
import sys
import types

_MARSHAL = 0x4D  # "M"
#: for callers that inline encode()'s fast path (the collectives)
marshal_dumps = marshal.dumps
#: what marshal writes and reads back as exactly itself (see the module doc)
MARSHAL_TYPES = frozenset({int, float, complex, str, bytes, bool, type(None)})
_PICKLE = 0x50  # "P"

#: " at 0x7f..." in an object's default repr
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")

IMMUTABLE_SCALARS = frozenset({int, float, complex, str, bytes, bool, type(None), range})


class ProgramGlobals:
    """What the globals in a tile program's data are, on its tile: the tile runtime
    gives each tile one while a program runs (``Tile.program_globals``).

    ``by_name(module, qualname)`` finds a class or function of the program's own that
    arrived by name (see the module doc); ``find_class(module, name)`` any other global
    a pickle names, as the tile's program sees it (its builtins, its modules), or raises
    pickle.UnpicklingError; ``dispatch_table`` is copyreg's table the program's pickling
    uses (None: the host's)."""

    __slots__ = ()

    dispatch_table: dict | None = None

    def by_name(self, module: str, qualname: str) -> object:
        raise NotImplementedError

    def find_class(self, module: str, name: str) -> object:
        raise NotImplementedError


def encode(obj, *, by_name: bool = False, program: ProgramGlobals | None = None) -> bytes:
    """Serialise ``obj`` for the exchange; TypeError naming the type if it cannot be.

    ``by_name``: a program's own classes and functions travel by name (see the module
    doc). Only for what a tile program sends to tile programs, which decode it on their
    own tile; a kernel request or reply is decoded by the scheduler, which has no program
    to look names up in, so there such objects are refused here, when they are sent.
    ``program``: the sending tile's (with ``by_name``), whose copyreg registrations apply."""
    if type(obj) in MARSHAL_TYPES:
        return b"M" + marshal.dumps(obj)
    try:
        if not by_name:
            return b"P" + pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        out = io.BytesIO()
        out.write(b"P")
        pickler = TilePickler(out, protocol=pickle.HIGHEST_PROTOCOL, program=program)
        table = None if program is None else program.dispatch_table
        if table is not None:
            pickler.dispatch_table = table
        pickler.dump(obj)
        return out.getvalue()
    except RecursionError as exc:  # (nested deeper than pickle can go: as pickle says)
        raise RecursionError(_cannot_send(obj, exc)) from None
    except (pickle.PicklingError, TypeError, AttributeError) as exc:  # pickle's own refusals
        raise TypeError(_cannot_send(obj, exc)) from None
    # anything else was raised by the object's own code (a __reduce__ or __getstate__):
    # it reaches the program as raised


def _cannot_send(obj, exc: BaseException) -> str:
    # (an object's address differs on every tile: without it, the same failure on many
    # tiles groups as one in a report)
    return f"cannot send an object of type {type(obj).__name__} through the exchange: {_ADDRESS.sub('', str(exc))}"


_BY_NAME = "tile-global"


def decode(buf, program: ProgramGlobals | None = None) -> object:
    """Inverse of :func:`encode`; ``buf`` is any bytes-like object (a view of SRAM).
    ``program`` finds the globals the payload names, on the receiving tile (see
    :class:`ProgramGlobals`); without one (the kernel's own messages) they are the
    host's, and what travelled by name is an error saying so."""
    tag = buf[0]
    if tag == _MARSHAL:
        return marshal.loads(buf[1:])
    if tag == _PICKLE:
        return TileUnpickler(io.BytesIO(buf[1:]), program).load()
    raise ValueError(f"corrupt exchange payload (tag byte {tag:#x})")


class TilePickler(pickle.Pickler):
    """A pickler that writes a tile program's own classes and functions by name (see the
    module doc); TileUnpickler finds them in the loading tile's program. ``program``: the
    writing tile's, where a name must lead back to the object, as pickle checks a global's
    (a class bound under another name was written, and failed only where it arrived)."""

    def __init__(self, file, protocol=None, *, program: ProgramGlobals | None = None, **options):
        super().__init__(file, protocol, **options)
        self._program = program

    def persistent_id(self, obj):
        if isinstance(obj, (type, types.FunctionType, types.MethodType)):
            if type(obj) is not type and (getattr(obj, "__module__", None) or "").startswith("ipuos."):
                # open, print, os's functions, the primitives: bound to this tile's files,
                # output and exchange (pickle would only say what they hold is unpicklable)
                raise TypeError(f"{obj.__name__}() is part of this tile's runtime, which stays on its tile")
            if type(obj) is not types.MethodType and _program_defined(obj):
                name = getattr(obj, "__qualname__", "")
                if "<" not in name:  # a lambda or a local one has no name to find: pickle says so
                    self._check_found(obj, obj.__module__, name)
                    return (_BY_NAME, obj.__module__, name)
        return None

    def _check_found(self, obj, module: str, name: str) -> None:
        if self._program is None:
            return
        try:
            found = self._program.by_name(module, name)
        except pickle.UnpicklingError:
            raise pickle.PicklingError(f"Can't pickle {obj!r}: attribute lookup {name} on {module} failed") from None
        if found is not obj:
            raise pickle.PicklingError(f"Can't pickle {obj!r}: it's not the same object as {module}.{name}")


class TileUnpickler(pickle.Unpickler):
    """An unpickler that finds globals as ``program`` sees them (see
    :class:`ProgramGlobals`), or the host's way without one."""

    def __init__(self, file, program: ProgramGlobals | None, **options):
        super().__init__(file, **options)
        self._program = program

    def find_class(self, module: str, name: str):
        program = self._program
        if program is None:
            return super().find_class(module, name)
        return program.find_class(module, name)

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 3 and pid[0] == _BY_NAME):
            raise pickle.UnpicklingError(f"corrupt exchange payload (reference {pid!r})")
        _, module, name = pid
        if self._program is None:
            raise pickle.UnpicklingError(
                f"{module}.{name} is defined by a tile program: only a tile can receive it")
        return self._program.by_name(module, name)


def _program_defined(obj) -> bool:
    """Whether ``obj`` (a class or function) is the tile's own, which pickle cannot find:
    defined by the program (its ``__main__``, a module on its files) or by the tile's own
    version of a host module (its ``pathlib.Path``, made for each program). (A host
    module's type that pickle finds its own way, as ``type(None)``, is not.)"""
    module = getattr(obj, "__module__", None) or ""
    found = _host_lookup(obj)
    if found is _MISSING:
        return module == "__main__" or module not in sys.modules
    return found is not obj  # (the host's module has its own class by that name)


_MISSING = object()


def _host_lookup(obj):
    """What pickle's own lookup (module, then attributes) finds on the host by ``obj``'s
    name: ``_MISSING`` if nothing (pickle may still have a way of its own, as for
    ``type(None)``), else what it finds, which for the tile's own version of a class
    is another object."""
    target = sys.modules.get(getattr(obj, "__module__", None) or "")
    if target is None:
        return _MISSING
    for part in getattr(obj, "__qualname__", "").split("."):
        target = getattr(target, part, _MISSING)
        if target is _MISSING:
            return _MISSING
    return target


def is_immutable(obj) -> bool:
    """True if ``obj`` can be shared between tiles without one tile's change showing in another.

    Decoded results that every tile receives identically (a broadcast, an alltoall) are
    decoded once and shared when this holds; otherwise each tile decodes its own copy.
    """
    kind = type(obj)
    if kind in IMMUTABLE_SCALARS:
        return True
    if kind is not tuple and kind is not frozenset:
        return False
    # walked with a stack, not recursion: a value nested deeper than the recursion limit
    # decodes fine and must not fail here
    pending = [obj]
    while pending:
        for item in pending.pop():
            kind = type(item)
            if kind is tuple or kind is frozenset:
                pending.append(item)
            elif kind not in IMMUTABLE_SCALARS:
                return False
    return True
