"""A seeded random-operation exerciser: the mount against a model directory on tmpfs.

Every operation (whole-file writes, writes and reads at random offsets, truncates through
the path and through an open file, appends, renames, unlinks, mkdir/rmdir, stat, listings)
runs on both trees and must give the same result or the same errno. The trees are compared
every few operations, at the end, after a remount, and as a tile program sees them.

Seeds are fixed so failures reproduce; ``IPUOS_FUSE_SEEDS=7,8`` runs others.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile

import pytest
from fuse_harness import fuse_session, host_tree, mounted_machine, runtime_dir, tile_tree  # noqa: F401

SEEDS = [int(s) for s in os.environ.get("IPUOS_FUSE_SEEDS", "1,2,3").split(",")]
OPERATIONS = 300
NAMES = ["a", "b", "c", "d", "sub", "sub/e", "sub/f"]


@pytest.fixture(scope="module")
def mm(runtime_dir, fuse_session):
    yield from mounted_machine("mk2")  # 128 KiB tile disks, a 92 MiB chip disk


@pytest.fixture
def model_dir():
    """The model: a directory on tmpfs (/dev/shm), where the kernel's own semantics hold."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    path = tempfile.mkdtemp(prefix="ipuos-model.", dir=base)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def outcome(operation, root: str):
    try:
        return "ok", operation(root)
    except OSError as exc:
        return "error", exc.errno


class Exerciser:
    def __init__(self, seed: int, model: str, mounted: str, max_size: int):
        self.rng = random.Random(seed)
        self.seed = seed
        self.model = model
        self.mounted = mounted
        self.max_size = max_size
        self.log: list[str] = []

    def data(self) -> bytes:
        size = self.rng.choice([0, 1, self.rng.randrange(1, 64), self.rng.randrange(1, self.max_size)])
        return self.rng.randbytes(size)

    def both(self, what: str, operation) -> None:
        self.log.append(what)
        expected = outcome(operation, self.model)
        got = outcome(operation, self.mounted)
        assert got == expected, self.report(f"{what}: the mount gave {got!r}, the model {expected!r}")

    def report(self, message: str) -> str:
        recent = "\n  ".join(self.log[-12:])
        return f"seed {self.seed}, operation {len(self.log)}: {message}\nlast operations:\n  {recent}"

    def compare_trees(self, when: str) -> None:
        assert host_tree(self.mounted) == host_tree(self.model), self.report(f"trees differ {when}")

    def step(self) -> None:
        rng = self.rng
        name = rng.choice(NAMES)
        kind = rng.choice(["write", "write", "pwrite", "pwrite", "read", "read", "truncate",
                           "ftruncate", "append", "rename", "rename", "unlink", "mkdir", "rmdir",
                           "stat", "listdir"])
        if kind == "write":
            data = self.data()

            def op(root):
                with open(os.path.join(root, name), "wb") as handle:
                    return handle.write(data)
            self.both(f"write {name} {len(data)} B", op)
        elif kind == "pwrite":
            data, offset = self.data(), rng.randrange(0, self.max_size + 1000)

            def op(root):
                fd = os.open(os.path.join(root, name), os.O_RDWR)
                try:
                    return os.pwrite(fd, data, offset)
                finally:
                    os.close(fd)
            self.both(f"pwrite {name} {len(data)} B at {offset}", op)
        elif kind == "read":
            offset, size = rng.randrange(0, self.max_size + 100), rng.randrange(0, self.max_size + 100)

            def op(root):
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    return os.pread(fd, size, offset)
                finally:
                    os.close(fd)
            self.both(f"pread {name} {size} B at {offset}", op)
        elif kind == "truncate":
            length = rng.randrange(0, self.max_size + 2000)
            self.both(f"truncate {name} to {length}", lambda root: os.truncate(os.path.join(root, name), length))
        elif kind == "ftruncate":
            length, data = rng.randrange(0, self.max_size), self.data()
            offset = rng.randrange(0, self.max_size)

            def op(root):
                fd = os.open(os.path.join(root, name), os.O_RDWR)
                try:
                    os.pwrite(fd, data, offset)
                    os.ftruncate(fd, length)
                    return os.fstat(fd).st_size
                finally:
                    os.close(fd)
            self.both(f"pwrite {len(data)} B at {offset} then ftruncate {name} to {length}", op)
        elif kind == "append":
            data = self.data()

            def op(root):
                with open(os.path.join(root, name), "ab") as handle:
                    return handle.write(data)
            self.both(f"append {len(data)} B to {name}", op)
        elif kind == "rename":
            target = rng.choice(NAMES)
            self.both(f"rename {name} -> {target}",
                      lambda root: os.rename(os.path.join(root, name), os.path.join(root, target)))
        elif kind == "unlink":
            self.both(f"unlink {name}", lambda root: os.unlink(os.path.join(root, name)))
        elif kind == "mkdir":
            self.both("mkdir sub", lambda root: os.mkdir(os.path.join(root, "sub")))
        elif kind == "rmdir":
            self.both("rmdir sub", lambda root: os.rmdir(os.path.join(root, "sub")))
        elif kind == "stat":
            def op(root):
                info = os.stat(os.path.join(root, name))
                return os.path.isdir(os.path.join(root, name)), info.st_size if os.path.isfile(
                    os.path.join(root, name)) else None
            self.both(f"stat {name}", op)
        else:
            self.both("listdir", lambda root: (sorted(os.listdir(root)),
                                               sorted(os.listdir(os.path.join(root, "sub")))
                                               if os.path.isdir(os.path.join(root, "sub")) else None))

    def run(self, count: int) -> None:
        for index in range(count):
            self.step()
            if index % 25 == 24:
                self.compare_trees(f"after {index + 1} operations")
        self.compare_trees("at the end")


def _empty(path) -> None:
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if os.path.isdir(full):
            shutil.rmtree(full)
        else:
            os.unlink(full)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_operations_on_a_tile_disk(mm, model_dir, seed):
    tile = 20 + seed  # a fresh tile disk per seed
    target = str(mm.tile(tile))
    exerciser = Exerciser(seed, model_dir, target, max_size=5000)  # a tile disk is 128 KiB
    exerciser.run(OPERATIONS)
    model = host_tree(model_dir)
    assert tile_tree(mm.booted, tile) == model, exerciser.report("a tile program sees something else")
    mm.remount()
    exerciser.compare_trees("after a remount")
    exerciser.run(50)  # and it goes on working
    assert tile_tree(mm.booted, tile) == host_tree(model_dir)


def test_random_operations_on_the_chip_disk(mm, model_dir):
    seed = SEEDS[0] + 100
    os.mkdir(mm.chip / "exercise")
    try:
        exerciser = Exerciser(seed, model_dir, str(mm.chip / "exercise"), max_size=200_000)
        exerciser.run(OPERATIONS // 2)
        assert tile_tree(mm.booted, 0, "/chip/exercise") == host_tree(model_dir)
        mm.remount()
        exerciser.compare_trees("after a remount")
    finally:
        _empty(mm.chip / "exercise")
        os.rmdir(mm.chip / "exercise")
