"""Power-loss sweeps: cut the power at every write of a workload and check what survives.

Each workload makes at least 500 writes (progs + erases), so each sweep is 500+ cuts, on a
small device (256-byte blocks) to keep the whole file to seconds. See
``ipuos.blockdev.testing`` for what is checked after each cut.
"""

from __future__ import annotations

import pytest

from ipuos.blockdev import MemoryDevice
from ipuos.blockdev.testing import DIRECTORY, power_loss_sweep

MIN_CUTS = 500


def payload(seed: int, size: int) -> bytes:
    return bytes((seed * 131 + i * 7 + (i >> 5)) & 0xFF for i in range(size))


def small_device() -> MemoryDevice:
    return MemoryDevice.new(256, 48)


# -- workloads -------------------------------------------------------------------------
# Each keeps ``model`` equal to what is durable and commits right after every call that
# makes a change durable (see ipuos.blockdev.testing).


def two_files(fs, model):
    for path in ("/a", "/b"):
        with fs.open(path, "w") as f:
            f.write(b"initial " + path.encode())
        model[path] = b"initial " + path.encode()


def overwrite(fs, model):
    """Replace whole files: inline-sized, one block, several blocks."""
    for i in range(105):
        path = "/a" if i % 2 else "/b"
        data = payload(i, [12, 200, 700, 60, 1100][i % 5])
        with fs.open(path, "w") as f:
            f.write(data)
        model[path] = data
        model.commit()


def empty_log(fs, model):
    with fs.open("/log", "w"):
        pass
    model["/log"] = b""


def append_and_sync(fs, model):
    """Append records, syncing after most: a sync is the durable point."""
    content = b""
    f = fs.open("/log", "a")
    for i in range(230):
        record = payload(i, 8 + (i * 13) % 40)
        f.write(record)
        content += record
        if i % 4:
            f.sync()
            model["/log"] = content
            model.commit()
    f.close()
    model["/log"] = content
    model.commit()


def rename_replace(fs, model):
    """The atomic-update idiom: write a temporary file, then rename it over the target."""
    for i in range(62):
        data = payload(i, [90, 400, 800][i % 3])
        tmp = f"/a.tmp{i % 2}"
        f = fs.open(tmp, "w")
        model[tmp] = b""  # opening with create commits an empty file
        model.commit()
        f.write(data)
        f.close()
        model[tmp] = data
        model.commit()
        fs.rename(tmp, "/a")
        model["/a"] = model.pop(tmp)
        model.commit()


def directory_churn(fs, model):
    """Make directories with a file inside, then empty and remove the previous one."""
    for i in range(46):
        directory = f"/d{i}"
        fs.mkdir(directory)
        model[directory] = DIRECTORY
        model.commit()
        if i % 3 == 0:
            fs.mkdir(directory + "/sub")
            model[directory + "/sub"] = DIRECTORY
            model.commit()
        data = payload(i, 50 + 40 * (i % 4))
        f = fs.open(directory + "/file", "w")
        model[directory + "/file"] = b""
        model.commit()
        f.write(data)
        f.close()
        model[directory + "/file"] = data
        model.commit()
        if i:
            previous = f"/d{i - 1}"
            fs.remove(previous + "/file")
            del model[previous + "/file"]
            model.commit()
            if previous + "/sub" in model:
                fs.rmdir(previous + "/sub")
                del model[previous + "/sub"]
                model.commit()
            fs.rmdir(previous)
            del model[previous]
            model.commit()


def one_big_file(fs, model):
    with fs.open("/t", "w") as f:
        f.write(payload(1, 1500))
    model["/t"] = payload(1, 1500)


def truncate(fs, model):
    """Shrink and grow a file by truncation, sometimes writing into it as well."""
    content = model["/t"]
    sizes = [1200, 300, 900, 0, 650, 1400, 20, 800]
    for i in range(80):
        size = sizes[i % len(sizes)]
        with fs.open("/t", "r+") as f:
            f.truncate(size)
            if i % 3 == 0:
                f.seek(size // 2)
                f.write(payload(i, 64))
        content = content[:size] + bytes(max(0, size - len(content)))
        if i % 3 == 0:
            at = size // 2
            end = max(len(content), at + 64)
            content = (content + bytes(end - len(content)))
            content = content[:at] + payload(i, 64) + content[at + 64 :]
        model["/t"] = content
        model.commit()


WORKLOADS = {
    "overwrite": (overwrite, two_files),
    "append+sync": (append_and_sync, empty_log),
    "rename-replace": (rename_replace, None),
    "mkdir/rmdir": (directory_churn, None),
    "truncate": (truncate, one_big_file),
}


@pytest.mark.parametrize("torn", [False, True], ids=["clean-cut", "torn-write"])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_power_loss_sweep(name, torn):
    workload, setup = WORKLOADS[name]
    report = power_loss_sweep(small_device, workload, setup=setup, torn=torn)
    assert report.writes >= MIN_CUTS, f"{name} makes only {report.writes} writes"
    assert report.cuts == report.writes
    assert report.ok, str(report)


def test_sweep_with_wear_levelling_relocations():
    """block_cycles makes littlefs move metadata around: more code paths under the cut."""
    report = power_loss_sweep(small_device, overwrite, setup=two_files,
                              filesystem_options={"block_cycles": 4})
    assert report.writes >= MIN_CUTS
    assert report.ok, str(report)


@pytest.mark.parametrize("name", ["append+sync", "mkdir/rmdir", "rename-replace"])
def test_sweep_with_cache_lines_longer_than_reads_and_a_short_metadata_log(name):
    """The chip disk's shape, scaled down: cache lines of a whole block, reads of a
    quarter of one, a metadata log of a quarter block (see blockdev._littlefs._config)."""
    workload, setup = WORKLOADS[name]
    report = power_loss_sweep(lambda: MemoryDevice.new(1024, 24), workload, setup=setup, torn=True,
                              filesystem_options={"cache_size": 1024, "read_size": 256, "metadata_max": 256})
    assert report.writes >= 300, f"{name} makes only {report.writes} writes"
    assert report.ok, str(report)


def test_sweep_with_flash_like_erased_value():
    report = power_loss_sweep(lambda: MemoryDevice.new(256, 48, erase_value=0xFF),
                              rename_replace, torn=True)
    assert report.writes >= MIN_CUTS
    assert report.ok, str(report)


@pytest.mark.parametrize("name", ["overwrite", "rename-replace"])
def test_the_sweep_catches_a_device_that_loses_writes(name):
    """A harness that cannot fail proves nothing: a lying device must be caught."""
    workload, setup = WORKLOADS[name]
    report = power_loss_sweep(small_device, workload, setup=setup, lose_writes=True,
                              max_violations=5)
    assert not report.ok
    assert len(report.violations) == 5
    assert "expected" in report.violations[0].message


def test_the_sweep_reports_a_wrong_model():
    def forgetful(fs, model):
        with fs.open("/x", "w") as f:
            f.write(b"data")
        model.commit()  # but the model was never told about /x

    with pytest.raises(AssertionError, match="model is wrong"):
        power_loss_sweep(small_device, forgetful)
