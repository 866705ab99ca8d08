"""What the client reads from the daemon's replies, declared once per command and event.

The client checks every result and event against its shape as it reads it
(:func:`result_problem`, :func:`event_problem`), so a reply that lacks a field a command
reads, or holds one of the wrong type, is one clear error (``machine NAME sent a bad
reply: ...``) rather than a KeyError or TypeError in whichever command reads it.

A shape is declared as a JSON type (``str``, ``int``, ``bool``, ``NUMBER``), an object (a
dict of field names to shapes, where a name ending in ``?`` may be left out), or
:class:`OrNull`, :class:`ListOf`, :class:`MapOf` (an object of any keys), :class:`Row` (a
list of so many items) of shapes. Fields a shape does not name pass unchecked: a shape
holds what clients read, not all the daemon sends.
"""

from __future__ import annotations

import json
from itertools import repeat

NUMBER = (int, float)

#: a problem: where (the path's parts, outermost first: "jobs", "[0]", "client_pid") and what
Problem = tuple[tuple[str, ...], str]


class Shape:
    #: the types a value of this shape may have, when that is all there is to check (a call
    #: per field or item doubled the check of a 47,104-tile run's result); else None
    types: tuple | None = None

    def problem(self, value) -> Problem | None:
        raise NotImplementedError


def shape_of(declared) -> Shape:
    """The shape a declaration means (see the module doc)."""
    if isinstance(declared, Shape):
        return declared
    if isinstance(declared, dict):
        return _Object(declared)
    return _Type(declared)


class _Type(Shape):
    def __init__(self, types):
        self.types = types if isinstance(types, tuple) else (types,)
        self.name = _NAMES[types]

    def problem(self, value) -> Problem | None:
        # (a bool passes for an int, as in Python: a program's exit(True) is status 1)
        return None if isinstance(value, self.types) else ((), _mismatch(value, self.name))


class OrNull(Shape):
    def __init__(self, declared):
        self.shape = shape_of(declared)
        if self.shape.types is not None:
            self.types = (*self.shape.types, type(None))

    def problem(self, value) -> Problem | None:
        return None if value is None else self.shape.problem(value)


class ListOf(Shape):
    def __init__(self, declared):
        self.item = shape_of(declared)

    def problem(self, value) -> Problem | None:
        if not isinstance(value, list):
            return (), _mismatch(value, "a list")
        if self.item.types is not None and all(map(isinstance, value, repeat(self.item.types))):
            return None
        for i, item in enumerate(value):
            problem = self.item.problem(item)
            if problem:
                return _within(f"[{i}]", problem)
        return None


class MapOf(Shape):
    def __init__(self, declared):
        self.value = shape_of(declared)

    def problem(self, value) -> Problem | None:
        if not isinstance(value, dict):
            return (), _mismatch(value, "an object")
        # (the keys are the daemon's text: shown as JSON shows them, so one line stays one)
        for key, item in value.items():
            problem = self.value.problem(item)
            if problem:
                return _within(f"[{json.dumps(key)}]", problem)
        return None


class Row(Shape):
    def __init__(self, *declared):
        self.items = [shape_of(item) for item in declared]

    def problem(self, value) -> Problem | None:
        if not isinstance(value, list) or len(value) != len(self.items):
            return (), _mismatch(value, f"a list of {len(self.items)}")
        for i, (shape, item) in enumerate(zip(self.items, value)):
            problem = shape.problem(item)
            if problem:
                return _within(f"[{i}]", problem)
        return None


class _Object(Shape):
    def __init__(self, declared: dict):
        self.fields = [(key.removesuffix("?"), key.endswith("?"), shape_of(field))
                       for key, field in declared.items()]

    def problem(self, value) -> Problem | None:
        if not isinstance(value, dict):
            return (), _mismatch(value, "an object")
        for name, optional, shape in self.fields:
            if name not in value:
                if optional:
                    continue
                return (name,), "missing"
            field = value[name]
            if shape.types is not None and isinstance(field, shape.types):
                continue
            problem = shape.problem(field)
            if problem:
                return _within(name, problem)
        return None


def _within(part: str, problem: Problem) -> Problem:
    return (part, *problem[0]), problem[1]


def _mismatch(value, wanted: str) -> str:
    return f"is {_kind(value)}, not {wanted}"


_NAMES = {str: "text", int: "an integer", NUMBER: "a number", bool: "true or false", dict: "an object"}


def _kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return "an object"


IDENTITY = {"name": str, "pid": int, "preset": str, "ipus": int, "ntiles": int}
STALENESS = {"stale_seconds?": NUMBER, "stale_reason?": str}
BACKUP = {"path": str, "description": str, "device_bytes": int, "file_size": int, "seconds": NUMBER,
          "uncommitted?": ListOf({"tile": int, "path": str}),
          "left_out?": ListOf({"tile": int, "path": str, "kind": str}),
          "times_left_out?": ListOf({"tile": int, "path": str, "files": int})}
MOUNT = {"mountpoint": str, "readonly": bool, "tiles": str, "foreground": bool, "client_pid": OrNull(int),
         "since": NUMBER, "open_files": int, "detached?": bool}
SHELL_STATE = {"status": int, "mode": str, "prompt": str}
OUTPUT = ListOf(Row(str, str))  # [stream, text] pieces

#: the result of each command, by command name
RESULTS: dict[str, Shape] = {name: shape_of(declared) for name, declared in {
    "hello": IDENTITY,
    "status": {
        **IDENTITY, **STALENESS,
        "tiles_per_chip": int, "sram_per_tile": int, "uptime_seconds": NUMBER, "boot_seconds": NUMBER,
        "njobs": int, "supersteps": int, "supersteps_with_traffic": int, "bytes_exchanged": int,
        "simulated_exchange_seconds": NUMBER, "socket": str, "log": str, "protocol": int, "ipuos": str,
    },
    "ps": {
        **STALENESS,
        "ntiles": int, "tiles_per_chip": int, "sram_per_tile": int, "state_codes": MapOf(str), "states": str,
        "jobs_of_tiles": ListOf(OrNull(int)), "sram_used": ListOf(int), "waiting": MapOf(str),
        "jobs": ListOf({"job": int, "name": str, "tiles": str, "ntiles": int,
                        "elapsed_seconds": OrNull(NUMBER), "client_pid": OrNull(int)}),
    },
    "run": {
        "job": int, "program?": str,
        "tiles": ListOf({"tile": int, "rank": int, "status": str, "output": str, "error": str,
                         "exit_code": int}),
        "stats": {"supersteps?": int, "wall_seconds?": NUMBER, "sim_seconds?": NUMBER,
                  "bytes_exchanged?": int, "dropped_messages?": int,
                  "bytes_sent?": ListOf(int), "bytes_received?": ListOf(int)},
    },
    "kill": {"ended?": bool, "stopped?": bool, "exit_status?": int},
    "halt": {"pid": int, "interrupted_jobs": ListOf(int), "backup?": OrNull(BACKUP)},
    "backup": BACKUP,
    "restore": {"path": str, "description": str, "seconds": NUMBER},
    "mount": {**MOUNT, "reason?": OrNull(str)},
    "mounts": {"mounts": ListOf(MOUNT)},
    "shell.exec": {**SHELL_STATE, "output?": OrNull(OUTPUT)},
    "shell.complete": {"start": int, "words": ListOf(str)},
    "shell.put": {"path": OrNull(str)},
}.items()}

#: the events clients read, by the event's name (None: the shell's output, which has none)
EVENTS: dict[str | None, Shape] = {name: shape_of(declared) for name, declared in {
    "started": {"job?": int, "tiles?": str},
    "progress": {"phase?": str, "done?": OrNull(int), "total?": OrNull(int)},
    "mounted": {"mountpoint?": str, "readonly?": bool, "tiles?": str},
    "detached": {"open_files?": OrNull(int)},
    "attached": {"session": int, "status?": int, "mode?": str, "prompt?": str, "ntiles": int,
                 "sram_per_tile": int},
    None: {"output?": OrNull(OUTPUT)},
}.items()}


ANY_OBJECT = shape_of({})


def result_problem(cmd: str, result: dict) -> str | None:
    """What makes ``result`` unfit as the result of ``cmd``, or None if nothing does."""
    return _described(f"its {cmd!r} result", RESULTS.get(cmd, ANY_OBJECT).problem(result))


def event_problem(event: dict) -> str | None:
    """What makes ``event`` unfit as the event it names, or None if nothing does."""
    name = event.get("event")
    if name is not None and not isinstance(name, str):
        return None  # (no reader knows it)
    return _described(f"its {name!r} event" if name is not None else "one of its events",
                      EVENTS.get(name, ANY_OBJECT).problem(event))


def _described(reply: str, problem: Problem | None) -> str | None:
    if problem is None:
        return None
    parts, what = problem
    path = "".join(part if part.startswith("[") or i == 0 else f".{part}" for i, part in enumerate(parts))
    if what == "missing":
        return f"{reply} lacks {path}"
    return f"{path} in {reply} {what}" if path else f"{reply} {what}"
