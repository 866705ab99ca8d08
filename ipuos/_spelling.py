"""Which long option a mistyped one was meant to be, for "did you mean --tiles?".

Shared by the shell's option reader and by ``run`` (the shell's and ``ipuos run``),
which pass options they do not know to the program: there a slip must be caught by the
same rule, or ``--tile 0`` quietly runs the program on every tile.
"""

from __future__ import annotations

__all__ = ["meant_options", "program_option_slip"]


def meant_options(name: str, options) -> list[str]:
    """The long options (``--word``) of ``options`` that ``name``, which is none of them,
    is a slip for: ones it begins (``--til``: a word cut short, as getopt would read it)
    or ones a single edit away (a letter missing, extra, wrong, or two swapped:
    ``--tile``, ``--tilse``, ``--date``). Several, or none."""
    if not name.startswith("--") or len(name) <= 2:
        return []
    return [option for option in options
            if option.startswith("--") and option != name
            and (option.startswith(name) or _one_edit_apart(name, option))]


def _one_edit_apart(a: str, b: str) -> bool:
    """Whether one insertion, deletion, substitution or swap of neighbours turns ``a`` into ``b``."""
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    start = 0
    while start < min(len(a), len(b)) and a[start] == b[start]:
        start += 1
    a, b = a[start:], b[start:]  # (from the first difference)
    if len(a) == len(b):
        return a[1:] == b[1:] or (len(a) >= 2 and a[0] == b[1] and a[1] == b[0] and a[2:] == b[2:])
    shorter, longer = (a, b) if len(a) < len(b) else (b, a)
    return shorter == longer[1:]


def program_option_slip(name: str, options) -> str | None:
    """Why ``name``, an option ``run`` does not know and would hand to the program, is
    refused instead: it is a slip for one of run's own ``options`` (None: it is not).

    Stricter than :func:`meant_options`, since what it refuses is otherwise a program's
    own option: a single edit counts only if it keeps the first letter and adds none
    (``--budgte``, ``--jsn``), so that ``--files`` and ``--names`` stay the program's."""
    meant = [option for option in meant_options(name, options)
             if option.startswith(name) or (name[2:3] == option[2:3] and len(name) <= len(option))]
    if not meant:
        return None
    return (f"option {name} not recognized (did you mean {' or '.join(meant)}?); "
            "to pass it to the program, put it after --")
