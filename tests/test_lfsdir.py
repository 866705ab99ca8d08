"""Reading a directory's mtimes from its metadata logs in one pass (``blockdev._lfsdir``).

The reader is only an accelerator: whatever it finds must be what littlefs itself answers
entry by entry, and when the logs do not show exactly what littlefs lists it must say so
(None), so that the filesystem asks littlefs instead. These tests hold it to both, on
real littlefs images: directories spread over many metadata pairs, every kind of change,
and images cut at every write by a power loss.
"""

from __future__ import annotations

import random

import pytest

from ipuos.blockdev import MTIME_ATTRIBUTE, FaultPlan, Filesystem, MemoryDevice, PowerLost
from ipuos.blockdev._lfsdir import directory_attribute

BLOCK = 512  # small blocks: a directory of a few dozen entries spans several pairs


def new_filesystem(blocks: int = 512) -> Filesystem:
    fs = Filesystem(MemoryDevice.new(BLOCK, blocks))
    fs.format()
    fs.mount()
    return fs


def from_the_logs(fs: Filesystem, path: str, listing=None):
    cfg = fs.config
    listing = fs.scandir(path) if listing is None else listing
    return directory_attribute(fs.device.read, cfg["block_count"], cfg["block_size"],
                               cfg["metadata_max"] or cfg["block_size"], path, listing, MTIME_ATTRIBUTE)


def from_littlefs(fs: Filesystem, path: str) -> list:
    base = path.rstrip("/") + "/"
    return [fs.get_attribute(base + info.name, MTIME_ATTRIBUTE) for info in fs.scandir(path)]


def pairs_of(fs: Filesystem, path: str) -> int:
    """Metadata pairs the directory spans, one at the root or just below it (the reader
    reads both revisions of each pair it passes)."""
    revisions = set()

    def read(block, off, size):
        if (off, size) == (0, 4):
            revisions.add(block)
        return fs.device.read(block, off, size)

    cfg = fs.config
    directory_attribute(read, cfg["block_count"], BLOCK, BLOCK, "/", fs.scandir("/"), MTIME_ATTRIBUTE)
    root = len(revisions)
    revisions.clear()
    assert directory_attribute(read, cfg["block_count"], BLOCK, BLOCK, path, fs.scandir(path),
                               MTIME_ATTRIBUTE) is not None
    return (len(revisions) - (root if path != "/" else 0)) // 2


def assert_logs_agree(fs: Filesystem, directories) -> None:
    for path in directories:
        found = from_the_logs(fs, path)
        assert found is not None, f"the reader gave up on {path}"
        assert found == from_littlefs(fs, path), path
        assert [m for _, m in fs.scandir_mtimes(path)] == [fs.get_mtime(f"{path.rstrip('/')}/{i.name}")
                                                          for i in fs.scandir(path)]


def test_every_change_to_a_directory_reads_back_as_littlefs_answers_it():
    """Creates, rewrites (inline and in blocks), attribute changes and removals, renames
    within and across directories, nested directories: after each batch, the logs give
    each entry's mtime as littlefs' own lookup does."""
    rng = random.Random(48)
    fs = new_filesystem()
    directories = ["/", "/a", "/a/b", "/c"]
    for path in directories[1:]:
        fs.mkdir(path)
    names: dict[str, set] = {path: set() for path in directories}
    stamp = 0
    for batch in range(40):
        for _ in range(12):
            where = rng.choice(directories)
            base = where.rstrip("/") + "/"
            choice = rng.random()
            existing = sorted(names[where])
            if choice < 0.45 or not existing:
                name = f"f{rng.randrange(10**6):06d}"
                with fs.open(base + name, "wb") as f:
                    f.write(bytes(rng.choice((0, 5, 40, 700, 1500))))
                names[where].add(name)
                stamp += 1
                fs.set_mtime(base + name, stamp * 1_000_000_007)
            elif choice < 0.6:
                name = rng.choice(existing)
                with fs.open(base + name, "r+b") as f:
                    f.truncate(rng.choice((0, 3, 900)))
            elif choice < 0.7:
                stamp += 1
                fs.set_mtime(base + rng.choice(existing), -stamp)
            elif choice < 0.75:
                fs.remove_attribute(base + rng.choice(existing), MTIME_ATTRIBUTE)
            elif choice < 0.85:
                name = rng.choice(existing)
                fs.remove(base + name)
                names[where].discard(name)
            else:
                name = rng.choice(existing)
                to = rng.choice(directories)
                new = f"r{rng.randrange(10**6):06d}"
                fs.rename(base + name, to.rstrip("/") + "/" + new)
                names[where].discard(name)
                names[to].add(new)
        assert_logs_agree(fs, directories)
    assert max(pairs_of(fs, path) for path in ("/", "/a", "/c")) >= 5
    fs.unmount()
    fs.mount()
    assert_logs_agree(fs, directories)


def test_a_root_file_named_like_the_superblock_is_an_entry_and_the_superblock_is_not():
    fs = new_filesystem(64)
    with fs.open("/littlefs", "wb") as f:
        f.write(b"not the superblock")
    fs.set_mtime("/littlefs", 123)
    assert [info.name for info in fs.scandir("/")] == ["littlefs"]
    assert fs.scandir_mtimes("/")[0][1] == 123
    assert_logs_agree(fs, ["/"])


@pytest.mark.parametrize("change", ["a name", "a type", "a size", "an entry missing", "an entry more"])
def test_a_listing_the_logs_do_not_show_exactly_is_refused(change):
    fs = new_filesystem(64)
    fs.mkdir("/d")
    for name in ("x", "y"):
        with fs.open(f"/d/{name}", "wb") as f:
            f.write(b"12345")
        fs.set_mtime(f"/d/{name}", 7)
    listing = fs.scandir("/d")
    assert from_the_logs(fs, "/d", listing) == [from_littlefs(fs, "/d")[0]] * 2
    first = listing[0]
    altered = {
        "a name": [first._replace(name="z"), *listing[1:]],
        "a type": [first._replace(is_dir=True, size=0), *listing[1:]],
        "a size": [first._replace(size=6), *listing[1:]],
        "an entry missing": listing[1:],
        "an entry more": [*listing, first._replace(name="z")],
    }[change]
    assert from_the_logs(fs, "/d", altered) is None


def test_a_directory_the_reader_cannot_find_is_refused_not_guessed():
    fs = new_filesystem(64)
    fs.mkdir("/d")
    assert from_the_logs(fs, "/nowhere", []) is None
    with fs.open("/file", "wb") as f:
        f.write(b"x")
    assert from_the_logs(fs, "/file", []) is None  # a file is no directory


def power_cut_workload(fs: Filesystem) -> None:
    for i in range(14):
        path = f"/d/file{i:02d}"
        with fs.open(path, "wb") as f:
            f.write(b"x" * (i * 60))
        fs.set_mtime(path, 1000 + i)
    fs.rename("/d/file03", "/e/moved")  # across directories: a move littlefs finishes later
    fs.remove("/d/file05")
    fs.set_mtime("/d/file06", 99)


@pytest.mark.parametrize("torn", [False, True], ids=["cut", "torn"])
def test_after_a_power_cut_at_any_write_the_listing_mtimes_are_littlefs_own(torn):
    """A commit cut short has no valid CRC: the reader must ignore it as littlefs does. A
    cut between the two halves of a cross-directory rename leaves a move pending, which
    littlefs hides from listings; the reader, which does not follow global state, must
    refuse that directory rather than list the moved entry twice."""
    setup = new_filesystem(128)
    setup.mkdir("/d")
    setup.mkdir("/e")
    setup.unmount()
    start = setup.device.snapshot()
    probe = Filesystem(MemoryDevice(bytearray(start), BLOCK))
    probe.mount()
    plan = probe.device.attach_faults(FaultPlan())
    power_cut_workload(probe)
    writes = plan.writes
    read_by_logs = refused = 0
    for cut in range(writes):
        device = MemoryDevice(bytearray(start), BLOCK)
        fs = Filesystem(device)
        fs.mount()
        device.attach_faults(FaultPlan(cut_power_after=cut, torn=torn))
        with pytest.raises(OSError):
            power_cut_workload(fs)
        survivor = Filesystem(MemoryDevice(bytearray(device.snapshot()), BLOCK))
        survivor.mount()
        for path in ("/d", "/e"):
            listed = survivor.scandir_mtimes(path)
            assert [m for _, m in listed] == [survivor.get_mtime(f"{path}/{info.name}") for info, _ in listed]
            if from_the_logs(survivor, path) is None:
                refused += 1
            else:
                read_by_logs += 1
    assert writes > 50
    assert read_by_logs > 1.8 * writes  # nearly every image reads straight from the logs
    assert refused > 0  # and the pending move was met, and refused


def test_a_log_longer_than_the_window_is_read_to_its_end():
    """littlefs reads a metadata log to its block's end, whatever metadata_max: an image
    written with a bigger one (as the chip disk's were before it had one) has logs past
    the window, whose later commits changed only times, so every name and size still
    matched and the older mtime came back."""
    device = MemoryDevice.new(16384, 64)
    writer = Filesystem(device, metadata_max=16384)
    writer.format()
    writer.mount()
    for n in range(3):
        with writer.open(f"/f{n}", "w") as f:
            f.write(b"x")
    for k in range(1, 400):
        writer.set_mtime("/f0", k)
    writer.unmount()
    fs = Filesystem(device)  # the default: a 4 KiB window in 16 KiB blocks
    fs.mount()
    assert fs.config["metadata_max"] == 4096
    assert from_the_logs(fs, "/") == from_littlefs(fs, "/")
    assert fs.scandir_mtimes("/")[0] == (fs.stat("/f0"), 399)
