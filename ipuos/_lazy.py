"""Public names a package imports on first use, not when it is imported itself.

Every CLI command imports ``ipuos``, and most only talk to a running daemon: importing
the machine (numpy, greenlet, littlefs) as well made each of them take ~0.7 s to start.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable  # (not typing: ~10 ms of every command's start-up)


def lazy_exports(package: str, namespace: dict, names: dict[str, str]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package`` (PEP 562), given ``names``: public name
    -> the module, relative to ``package``, that defines it. A name is imported when first
    asked for, then kept in ``namespace`` (the package's globals)."""

    def __getattr__(name: str):
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value  # (asked once)
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
