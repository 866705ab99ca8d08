"""Standard library code run with other module globals.

How a program's copy of a standard module gets functions that use the program's own
state (its csv field size limit, its copyreg table) where the standard ones use the
whole process's: the same code, given a namespace in which those names are the
program's.
"""

from __future__ import annotations

import types

__all__ = ["with_globals"]


def with_globals(function: types.FunctionType, namespace: dict) -> types.FunctionType:
    """``function``'s code with ``namespace`` as its globals (its defaults, closure,
    names and doc as they are)."""
    copy = types.FunctionType(function.__code__, namespace, function.__name__, function.__defaults__,
                              function.__closure__)
    copy.__kwdefaults__, copy.__qualname__, copy.__doc__ = (function.__kwdefaults__, function.__qualname__,
                                                            function.__doc__)
    copy.__module__ = function.__module__
    return copy
