"""Power-loss testing for a block device and the littlefs on it.

:func:`power_loss_sweep` runs a workload once to learn how many writes (progs and erases)
it makes and which filesystem states it commits, then replays it from the same starting
image once per write index ``k`` with the power cut at write ``k``. After every cut it
copies the surviving bytes to a fresh device and checks that:

* the copy mounts;
* the whole tree is the state after the last call that completed, or the state the
  interrupted call was producing: never anything in between (littlefs' guarantee);
* the filesystem still takes writes, and they survive a remount.

A workload is a function ``workload(fs, model)``. It makes filesystem calls and keeps
``model`` (a dict: path -> bytes, or :data:`DIRECTORY`) equal to what is durable, calling
``model.commit()`` right after each call that makes a change durable (``close``, ``sync``,
``rename``, ``mkdir``, ``remove``, opening with create), and before the next call. The
first, uninterrupted run checks the model against the real tree at every commit, so a
wrong model is reported as such rather than as a power-loss violation.

The harness can fail: with ``lose_writes=True`` the device acknowledges writes it never
stores, and the sweep must report violations.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections import Counter
from typing import Callable

from ipuos._plural import plural

from ._faults import FaultPlan
from ._littlefs import Filesystem

__all__ = ["DIRECTORY", "Model", "SweepReport", "Violation", "power_loss_sweep", "read_tree"]


class _Directory:
    def __repr__(self) -> str:
        return "DIRECTORY"


#: the value a model gives a directory
DIRECTORY = _Directory()


class Model(dict):
    """What a workload says is durable: path -> bytes, or :data:`DIRECTORY`."""

    def __init__(self, initial=(), on_commit: Callable[["Model"], None] | None = None):
        super().__init__(initial)
        self._on_commit = on_commit
        self.commits = 0

    def commit(self) -> None:
        """The call just made is durable: the model as it is now is the state on disk."""
        self.commits += 1
        if self._on_commit is not None:
            self._on_commit(self)


@dataclasses.dataclass
class Violation:
    cut: int  # index of the interrupted write
    message: str


@dataclasses.dataclass
class SweepReport:
    workload: str
    writes: int  # progs + erases in the uninterrupted run
    cuts: int = 0
    torn: bool = False
    violations: list[Violation] = dataclasses.field(default_factory=list)
    #: how the survivors looked: "before" (last completed call) or "after" (interrupted one)
    outcomes: Counter = dataclasses.field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.violations

    def __str__(self) -> str:
        kind = "torn " if self.torn else ""
        head = (f"{self.workload}: {plural(self.cuts, kind + 'power cut')} over {plural(self.writes, 'write')}, "
                f"outcomes {dict(self.outcomes)}, {plural(len(self.violations), 'violation')}")
        shown = [f"  cut at write {v.cut}: {v.message}" for v in self.violations[:10]]
        if len(self.violations) > 10:
            shown.append(f"  ... and {len(self.violations) - 10} more")
        return "\n".join([head, *shown])


def read_tree(fs: Filesystem, top: str = "/") -> dict:
    """Every directory and file under ``top``: path -> bytes or :data:`DIRECTORY`."""
    tree = {}
    pending = [top]
    while pending:
        directory = pending.pop()
        for entry in fs.scandir(directory):
            path = directory.rstrip("/") + "/" + entry.name
            if entry.is_dir:
                tree[path] = DIRECTORY
                pending.append(path)
            else:
                with fs.open(path, "r") as f:
                    tree[path] = f.read()
    return tree


_PROBE = "/.power-loss-probe"


def power_loss_sweep(
    make_device: Callable[[], object],
    workload: Callable[[Filesystem, Model], None],
    *,
    setup: Callable[[Filesystem, Model], None] | None = None,
    torn: bool = False,
    lose_writes: bool = False,
    cuts=None,
    filesystem_options: dict | None = None,
    max_violations: int | None = 20,
) -> SweepReport:
    """Cut the power at every write of ``workload`` (or at the indices in ``cuts``).

    ``make_device()`` must return a fresh device of the same geometry each time.
    ``setup(fs, model)`` builds the starting tree (not interrupted). ``torn``: the
    interrupted write lands half-done. ``lose_writes``: a lying device, to show that the
    sweep notices. Stops early after ``max_violations`` violations.
    """
    options = filesystem_options or {}
    name = getattr(workload, "__name__", repr(workload))

    # the starting image
    device = make_device()
    fs = Filesystem(device, **options)
    fs.format()
    fs.mount()
    start_model = Model()
    if setup is not None:
        setup(fs, start_model)
    fs.unmount()
    base_image = device.snapshot()

    # the uninterrupted run: number of writes, and the committed states
    states = _reference_run(device, base_image, workload, start_model, options, name)
    plan = device.faults
    report = SweepReport(workload=name, writes=plan.writes, torn=torn)
    device.detach_faults()

    for cut in range(report.writes) if cuts is None else cuts:
        report.cuts += 1
        problem, outcome = _one_cut(make_device, device, base_image, workload, states, cut,
                                    torn, lose_writes, options)
        if problem is not None:
            report.violations.append(Violation(cut, problem))
            if max_violations is not None and len(report.violations) >= max_violations:
                break
        else:
            report.outcomes[outcome] += 1
    return report


def _reference_run(device, base_image, workload, start_model, options, name) -> list[dict]:
    device.restore(base_image)
    device.attach_faults(FaultPlan())  # counts the writes
    fs = Filesystem(device, **options)
    fs.mount()
    initial = read_tree(fs)
    if initial != dict(start_model):
        raise AssertionError(f"{name}: setup's model {dict(start_model)!r} "
                             f"differs from the tree {initial!r}")
    states = [initial]

    def check_and_record(model: Model) -> None:
        # reading the tree makes no writes, so the counts stay those of the workload
        actual = read_tree(fs)
        if actual != dict(model):
            raise AssertionError(
                f"{name}: after commit {model.commits} the model says {_brief(model)} but "
                f"the filesystem holds {_brief(actual)}: the workload's model is wrong"
            )
        states.append(dict(model))

    workload(fs, Model(start_model, on_commit=check_and_record))
    fs.unmount()
    return states


def _one_cut(make_device, device, base_image, workload, states, cut, torn, lose_writes,
             options) -> tuple[str | None, str]:
    device.restore(base_image)
    plan = device.attach_faults(FaultPlan(cut_power_after=cut, torn=torn, lose_writes=lose_writes))
    fs = Filesystem(device, **options)
    model = Model(states[0])
    try:
        fs.mount()
        workload(fs, model)
    except OSError:
        if not plan.power_lost:
            raise
    finally:
        device.detach_faults()
    if not plan.power_lost:
        return f"the workload finished without reaching write {cut} (not deterministic?)", ""
    if fs.mounted:
        fs.unmount()  # frees littlefs' memory; the device is off, nothing is written

    survivor = make_device()
    survivor.restore(device.snapshot())
    check = Filesystem(survivor, **options)
    try:
        check.mount()
    except OSError as exc:
        return f"does not mount after the cut: {exc}", ""
    try:
        tree = read_tree(check)
    except OSError as exc:
        return f"tree unreadable after the cut: {exc}", ""
    done = model.commits
    if tree == states[done]:
        outcome = "before"
    elif done + 1 < len(states) and tree == states[done + 1]:
        outcome = "after"
    else:
        expected = _brief(states[done])
        if done + 1 < len(states):
            expected += f" or {_brief(states[done + 1])}"
        return (f"after {done} completed commits the tree is {_brief(tree)}, "
                f"expected {expected}"), ""
    try:
        payload = bytes(range(251)) * 2
        with check.open(_PROBE, "w") as f:
            f.write(payload)
        check.unmount()
        check.mount()
        with check.open(_PROBE, "r") as f:
            if f.read() != payload:
                return "a write after the cut did not read back after remount", ""
        check.unmount()
    except OSError as exc:
        return f"not writable after the cut: {exc}", ""
    return None, outcome


def _brief(tree: dict) -> str:
    """A short description of a tree for messages: sizes, not contents."""
    parts = []
    for path in sorted(tree):
        value = tree[path]
        if value is DIRECTORY:
            parts.append(f"{path}/")
        else:
            parts.append(f"{path}[{len(value)} B, crc {zlib.crc32(value):08x}]")
    return "{" + ", ".join(parts) + "}"
