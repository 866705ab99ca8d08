"""``ipuos image info|ls|cat|verify|extract``: images read offline, with no machine.

Images are built from real littlefs filesystems (``backup_craft``); hostile ones have
names littlefs would never create, written into its metadata with valid CRCs.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time

import pytest
from click.testing import CliRunner

from daemon_harness import IPUOS
from backup_craft import TINY_META, littlefs_device, point_directories_at_root, rename_entry, write_tiny_image
from ipuos._image import DeviceSnapshot, write_image
from ipuos._cli import main

MTIME = 1_700_000_000_123_456_789


def ipuos(*args: str):
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result


def tree(root) -> dict:
    """Everything under ``root``: relative path -> (kind, bytes or None, mtime_ns, mode)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            data = open(full, "rb").read() if stat.S_ISREG(st.st_mode) else None
            out[os.path.relpath(full, root)] = (stat.S_IFMT(st.st_mode), data, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    path = tmp_path_factory.mktemp("img") / "good.img"
    files = {"/hello.txt": b"hello from tile 2\n", "/d/e/deep.bin": bytes(range(256)) * 20,
             "/d/empty": b""}
    disk = littlefs_device(files, dirs=["/d", "/d/e", "/d/void"],
                           mtimes={"/hello.txt": MTIME, "/d/e/deep.bin": MTIME + 1, "/d": MTIME + 2})
    chip = littlefs_device({"/shared": b"on the chip disk"}, blocks=480)
    write_tiny_image(path, {"tile/2/disk": bytes(disk), "tile/3/disk": None, "chip": bytes(chip)})
    return path


def test_info_and_verify(good):
    result = ipuos("image", "info", str(good))
    assert result.exit_code == 0
    assert "tiny, 1 IPU, 16 tiles" in result.output and "3 (2 formatted, 1 blank)" in result.output
    info = json.loads(ipuos("image", "info", str(good), "--json").output)
    assert info["device_count"] == 3 and info["meta"]["preset"] == "tiny"
    assert info["verified"] is False  # info checks the structure, not every byte
    result = ipuos("image", "verify", str(good))
    assert result.exit_code == 0 and "is intact: 3 devices" in result.output
    verified = json.loads(ipuos("image", "verify", str(good), "--json").output)
    assert verified["ok"] is True and verified["device_count"] == 3  # (as the text says)


def test_ls_devices_and_directories(good):
    result = ipuos("image", "ls", str(good))
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert [line.split()[:2] for line in lines] == [["tile/2/disk", "formatted"], ["tile/3/disk", "blank"],
                                                    ["chip", "formatted"]]
    listing = json.loads(ipuos("image", "ls", str(good), "2", "--json").output)
    assert [(e["name"], e["is_dir"]) for e in listing] == [("d", True), ("hello.txt", False)]
    assert listing[1]["size"] == 18 and listing[1]["mtime_ns"] == MTIME
    deep = json.loads(ipuos("image", "ls", str(good), "tile/2/disk", "/d", "--json").output)
    assert [e["name"] for e in deep] == ["e", "empty", "void"]
    text = ipuos("image", "ls", str(good), "2", "/d/e").output
    shown = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime((MTIME + 1) / 1e9))
    assert text == f"- {5120:>9}  {shown}  deep.bin\n"


def test_a_device_is_named_also_as_on_the_machine(good):
    """The shell and a mount call them /chip and /tiles/N: so may the image commands."""
    for spec in ("/chip", "chip/", "/chip/"):
        assert ipuos("image", "cat", str(good), spec, "/shared").stdout_bytes == b"on the chip disk"
    for spec in ("/tiles/2", "tiles/2", "/tiles/2/"):
        assert "hello.txt" in ipuos("image", "ls", str(good), spec).output
    for spec in ("/tiles/02", "tile/3", "/tiles/9", "/chips"):
        result = ipuos("image", "ls", str(good), spec)
        assert result.exit_code == 1
        assert (f"has no device {spec!r}; it holds the disks of tiles 2-3 and the chip disk (name one N or "
                "tile/N/disk (or /tiles/N) for tile N's disk, chip (or /chip) for the chip disk)") in result.output


def test_cat_writes_the_bytes(good):
    result = ipuos("image", "cat", str(good), "2", "/d/e/deep.bin")
    assert result.exit_code == 0 and result.stdout_bytes == bytes(range(256)) * 20
    assert ipuos("image", "cat", str(good), "chip", "/shared").stdout_bytes == b"on the chip disk"


def test_cat_onto_a_nearly_full_disk_fails_and_says_why(tmp_path, host_tmpfs):
    """The disk takes only part of the write: the rest must follow, or the command fail
    (it used to stop there, with status 0 and the file cut short)."""
    data = bytes(range(256)) * 235  # 60,160 bytes: more than Python buffers, for 8 KiB of disk
    image = tmp_path / "big.img"
    write_tiny_image(image, {"chip": bytes(littlefs_device({"/big": data}, blocks=480))})
    small = host_tmpfs("size=8k")
    with open(small / "out", "wb") as out:
        result = subprocess.run([IPUOS, "image", "cat", str(image), "chip", "/big"], stdout=out,
                                stderr=subprocess.PIPE, text=True, timeout=60)
    assert (result.returncode, result.stderr) == (1, "ipuos: write error: No space left on device\n")
    with open(tmp_path / "out", "wb") as out:  # where there is room, every byte
        subprocess.run([IPUOS, "image", "cat", str(image), "chip", "/big"], stdout=out, check=True, timeout=60)
    assert (tmp_path / "out").read_bytes() == data


def test_paths_as_tile_0s_tree_shows_them_work_too(good):
    """The shell and the mount show the chip disk under /chip and tile 2's under
    /tiles/2: a path copied from there names the same file in the image."""
    assert ipuos("image", "cat", str(good), "chip", "/chip/shared").stdout_bytes == b"on the chip disk"
    assert ipuos("image", "cat", str(good), "2", "/tiles/2/hello.txt").stdout_bytes == b"hello from tile 2\n"
    deep = json.loads(ipuos("image", "ls", str(good), "2", "/tiles/2/d", "--json").output)
    assert [e["name"] for e in deep] == ["e", "empty", "void"]
    assert [e["name"] for e in json.loads(ipuos("image", "ls", str(good), "chip", "/chip", "--json").output)] == ["shared"]
    result = ipuos("image", "cat", str(good), "2", "/tiles/3/hello.txt")  # another tile's prefix: no
    assert result.exit_code == 1 and "/tiles/3/hello.txt: No such file or directory" in result.output


def test_extract_takes_the_paths_ls_and_cat_take(good, tmp_path):
    """--path copied from the shell or the mount (/tiles/2/..., /chip) names the same
    directory of the device, as it does for ls and cat."""
    for device, path, expected in (("2", "/tiles/2/d", ["e", "empty", "void"]), ("chip", "/chip", ["shared"])):
        dest = tmp_path / f"out-{device}"
        result = ipuos("image", "extract", str(good), device, str(dest), "--path", path)
        assert result.exit_code == 0, result.output
        assert sorted(os.listdir(dest)) == expected
    result = ipuos("image", "extract", str(good), "2", str(tmp_path / "x"), "--path", "/tiles/3/d")
    assert (result.exit_code, result.output) == (1, "ipuos: /tiles/3/d: No such file or directory\n")


def test_extract_writes_the_tree_with_mtimes(good, tmp_path):
    dest = tmp_path / "out"
    result = ipuos("image", "extract", str(good), "2", str(dest))
    assert result.exit_code == 0, result.output
    assert "extracted 3 files and 3 directories" in result.output
    got = tree(dest)
    assert got["hello.txt"] == (stat.S_IFREG, b"hello from tile 2\n", MTIME)
    assert got["d/e/deep.bin"][1:] == (bytes(range(256)) * 20, MTIME + 1)
    assert got["d"][2] == MTIME + 2  # set after its contents were written
    assert got["d/empty"][1] == b"" and got["d/void"][0] == stat.S_IFDIR
    assert sorted(got) == ["d", "d/e", "d/e/deep.bin", "d/empty", "d/void", "hello.txt"]
    # a subtree, into an existing empty directory: filled, not replaced (someone's cwd,
    # a mount point), and its mode kept
    sub = tmp_path / "sub"
    sub.mkdir(mode=0o700)
    before = os.stat(sub)
    assert ipuos("image", "extract", str(good), "2", str(sub), "--path", "/d").exit_code == 0
    assert sorted(tree(sub)) == ["e", "e/deep.bin", "empty", "void"]
    after = os.stat(sub)
    assert (after.st_ino, stat.S_IMODE(after.st_mode)) == (before.st_ino, 0o700)


def test_a_blank_device_is_an_empty_filesystem_as_the_machine_shows_it(good, tmp_path):
    """A tile that never used its storage has a blank device in the image; the machine
    would format it on first use: offline it lists, extracts and cats as empty."""
    result = ipuos("image", "ls", str(good), "3")
    assert (result.exit_code, result.output) == (0, "")
    result = ipuos("image", "extract", str(good), "3", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert os.listdir(tmp_path / "out") == []
    result = ipuos("image", "cat", str(good), "3", "/anything")
    assert result.exit_code == 1 and "/anything: No such file or directory" in result.output


def test_extract_into_a_mount_point_fills_it(good, host_tmpfs):
    point = host_tmpfs("size=1m")
    result = ipuos("image", "extract", str(good), "2", str(point))
    assert result.exit_code == 0, result.output
    assert sorted(tree(point)) == ["d", "d/e", "d/e/deep.bin", "d/empty", "d/void", "hello.txt"]


def test_an_image_with_a_long_name_in_a_multibyte_script(tmp_path):
    image = tmp_path / ("\u00e9" * 120 + ".img")  # 244 bytes: the temporary name must fit too
    write_tiny_image(image, {"tile/2/disk": None})
    assert ipuos("image", "verify", str(image)).exit_code == 0
    assert os.listdir(tmp_path) == [image.name]


def test_extract_to_a_long_name_in_a_multibyte_script(good, tmp_path):
    dest = tmp_path / ("\u65e5" * 82)  # 246 bytes: a legal name, whose staging name must fit too
    result = ipuos("image", "extract", str(good), "2", str(dest))
    assert result.exit_code == 0, result.output
    assert "hello.txt" in os.listdir(dest)


@pytest.mark.parametrize("args, message", [
    (["ls", "{img}", "9"], "has no device '9'"),
    (["ls", "{img}", "2", "/nope"], "/nope: No such file or directory"),
    (["cat", "{img}", "2", "/d"], "/d is a directory"),
    (["cat", "{img}", "2", "/missing"], "/missing: No such file or directory"),
    (["extract", "{img}", "2", "{tmp}/x", "--path", "/hello.txt"], "is a file"),
    (["extract", "{img}", "2", "{tmp}/no/such/dir"], "does not exist"),
    (["info", "{tmp}/nothing.img"], "no such file"),
    (["info", "-"], "'-': an image is read from a file, not from standard input"),
    (["cat", "-", "2", "/hello.txt"], "'-': an image is read from a file, not from standard input"),
    (["ls", "{img}", "2", ""], "an empty path names nothing in the device"),
    (["cat", "{img}", "2", ""], "an empty path names nothing in the device"),
])
def test_clear_errors(good, tmp_path, args, message):
    args = [a.format(img=good, tmp=tmp_path) for a in args]
    result = ipuos("image", *args)
    assert result.exit_code == 1
    assert message in result.output, result.output
    assert not (tmp_path / "x").exists()


def test_extract_onto_a_host_disk_that_refuses_names_the_destination(good, host_tmpfs):
    readonly = host_tmpfs("ro,size=1m")
    result = ipuos("image", "extract", str(good), "2", str(readonly / "out"))
    assert result.exit_code == 1
    assert result.output == f"ipuos: cannot extract to {readonly / 'out'}: Read-only file system\n"
    full = host_tmpfs("size=16k")
    (full / "filler").write_bytes(bytes(12 * 1024))
    result = ipuos("image", "extract", str(good), "2", str(full / "out"))
    assert result.exit_code == 1
    assert result.output == (f"ipuos: cannot extract to {full / 'out'}: No space left on device; "
                             "nothing extracted\n")
    assert sorted(os.listdir(full)) == ["filler"]  # no staging directory left behind
    (full / "empty").mkdir()  # an existing destination: staged inside it, and left as it was
    os.utime(full / "empty", ns=(1_000_000_000, 2_000_000_000))
    result = ipuos("image", "extract", str(good), "2", str(full / "empty"))
    assert result.exit_code == 1 and "No space left on device; nothing extracted" in result.output
    assert os.listdir(full / "empty") == [] and (full / "empty").stat().st_mtime_ns == 2_000_000_000


def test_an_image_of_the_largest_machines_opens(tmp_path):
    # a 32-chip mk2 machine holds 8.6 GiB of devices: more than a fixed 8 GiB cap allowed
    from ipuos._image import DeviceSnapshot, write_image

    ntiles = 1472 * 32
    meta = {"preset": "mk2", "ipus": 32, "tiles_per_chip": 1472, "sram_per_tile": 624 * 1024,
            "disk_size": 128 * 1024, "disk_block_size": 4096, "chipdisk_share": 64 * 1024,
            "chipdisk_block_size": 16 * 1024, "chip_tile": 0, "tiles": f"0-{ntiles - 1}"}
    devices = [DeviceSnapshot(f"tile/{i}/disk", i, "/", 4096, 32, None) for i in range(ntiles)]
    devices.append(DeviceSnapshot("chip", None, "/chip", 16 * 1024, (ntiles - 1) * 4, None))
    path = tmp_path / "mk2x32.img"
    write_image(path, meta, devices, digest="blake3")
    result = ipuos("image", "info", str(path))
    assert result.exit_code == 0, result.output
    assert "mk2, 32 IPUs, 47104 tiles" in result.output and "holding 8.6 GiB" in result.output
    assert ipuos("image", "verify", str(path)).exit_code == 0


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result = ipuos("image", "info", str(fifo))  # (it used to block in open(2) for ever)
    assert result.exit_code == 1 and "not a regular file" in result.output, result.output


def test_an_empty_file_and_a_proc_file_are_told_apart(tmp_path):
    (tmp_path / "empty.img").write_bytes(b"")
    result = ipuos("image", "info", str(tmp_path / "empty.img"))
    assert result.exit_code == 1 and "is empty (0 bytes): not an ipuos image" in result.output, result.output
    result = ipuos("image", "info", "/proc/self/status")  # (size 0, yet it holds bytes)
    assert result.exit_code == 1 and "says it is 0 bytes long yet holds bytes" in result.output, result.output


def test_a_directory_cycle_is_refused_not_followed(tmp_path):
    disk = littlefs_device({"/top.txt": b"hello"}, dirs=["/a"])
    point_directories_at_root(disk, 512)
    image = tmp_path / "cyclic.img"
    write_tiny_image(image, {"tile/2/disk": bytes(disk)})
    assert ipuos("image", "ls", str(image), "2", "/a").exit_code == 0  # one level is fine
    result = ipuos("image", "extract", str(image), "2", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert "one of them leads back to an ancestor; the image is damaged" in result.output
    assert not (tmp_path / "out").exists()
    assert sorted(os.listdir(tmp_path)) == ["cyclic.img"]


def test_extract_refuses_a_non_empty_destination(good, tmp_path):
    dest = tmp_path / "full"
    dest.mkdir()
    (dest / "mine").write_text("keep me")
    result = ipuos("image", "extract", str(good), "2", str(dest))
    assert result.exit_code == 1 and "is not empty" in result.output
    assert tree(dest) == {"mine": (stat.S_IFREG, b"keep me", (dest / "mine").stat().st_mtime_ns)}


def test_extract_says_why_a_destination_cannot_be_made(good, tmp_path):
    (tmp_path / "snap.py").write_text("print('a program, not a directory')\n")
    for dest, why in ((tmp_path / "snap.py" / "out", f"{tmp_path / 'snap.py'} is not a directory"),
                      (tmp_path / ("x" * 256), "File name too long")):
        result = ipuos("image", "extract", str(good), "2", str(dest))
        assert (result.exit_code, result.output) == (1, f"ipuos: cannot extract to {dest}: {why}\n")
    assert os.listdir(tmp_path) == ["snap.py"]
    empty = tmp_path / "empty"  # an empty DEST was taken as the current directory
    empty.mkdir()
    done = subprocess.run([IPUOS, "image", "extract", str(good), "2", ""], capture_output=True, text=True,
                          cwd=empty, timeout=60)
    assert (done.returncode, done.stderr) == (1, "ipuos: an empty destination names no directory; give a new or empty one\n")
    assert os.listdir(empty) == []


def test_damaged_images_are_refused(good, tmp_path):
    raw = bytearray(good.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    bad = tmp_path / "bad.img"
    bad.write_bytes(raw)
    result = ipuos("image", "verify", str(bad))
    assert result.exit_code == 1 and f"image {bad}" in result.output and "damaged" in result.output
    (tmp_path / "text.img").write_text("not an image at all")
    result = ipuos("image", "info", str(tmp_path / "text.img"))
    assert result.exit_code == 1 and "is not an ipuos image" in result.output
    (tmp_path / "short.img").write_bytes(good.read_bytes()[:300])
    result = ipuos("image", "ls", str(tmp_path / "short.img"))
    assert result.exit_code == 1 and "truncated" in result.output


def test_what_is_intact_in_a_damaged_image_can_still_be_read(good, tmp_path):
    """A flipped bit in the chip disk's part: tile 2's files still list, cat and extract
    (before, every device was refused); the chip disk's are refused, and so is a verify."""
    from ipuos._image import open_image

    with open_image(good, verify=False) as img:
        chunk = img.device("chip").chunks[0]
    raw = bytearray(good.read_bytes())
    raw[chunk.file_offset + chunk.stored_length // 2] ^= 0x10
    bad = tmp_path / "bad.img"
    bad.write_bytes(raw)
    assert ipuos("image", "cat", str(bad), "2", "/hello.txt").output == "hello from tile 2\n"
    assert "hello.txt" in ipuos("image", "ls", str(bad), "2").output
    extracted = ipuos("image", "extract", str(bad), "2", str(tmp_path / "out"))
    assert extracted.exit_code == 0 and (tmp_path / "out" / "hello.txt").read_bytes() == b"hello from tile 2\n"
    for args in (["cat", str(bad), "chip", "/shared"], ["verify", str(bad)]):
        refused = ipuos("image", *args)
        assert refused.exit_code == 1 and "device 'chip'" in refused.output and "damaged" in refused.output


# -- hostile images --------------------------------------------------------------------------


def hostile_image(tmp_path, placeholder_is_dir: bool, name: bytes) -> str:
    """An image whose tile 2 disk holds an entry named ``name`` (same length as the
    placeholder it replaces), besides an ordinary file."""
    placeholder = b"P" * len(name)
    path = "/" + placeholder.decode()
    disk = littlefs_device({"/innocent": b"ok", **({} if placeholder_is_dir else {path: b"payload"})},
                           dirs=[path] if placeholder_is_dir else [])
    rename_entry(disk, 512, placeholder, name)
    image = tmp_path / f"hostile-{abs(hash(name))}.img"
    write_tiny_image(image, {"tile/2/disk": bytes(disk)})
    return str(image)


@pytest.mark.parametrize("is_dir, name, why", [
    (True, b"..", "a directory entry is named '..'"),
    (True, b".", "a directory entry is named '.'"),
    (False, b"../../../../../tmp/pwned", "it contains '/'"),
    (False, b"/etc/cron.d/x", "it contains '/'"),
    (False, b"a/../../b", "it contains '/'"),
    (False, b"\x1b[2Jclear", "control character"),
    (False, b"bell\x07", "control character"),
])
def test_extract_refuses_hostile_names_and_leaves_the_parent_alone(tmp_path, is_dir, name, why):
    image = hostile_image(tmp_path, is_dir, name)
    parent = tmp_path / "parent"
    parent.mkdir()
    before = tree(parent), os.stat(parent).st_mtime_ns
    result = ipuos("image", "extract", image, "2", str(parent / "out"))
    assert result.exit_code == 1
    assert "refusing" in result.output and why in result.output, result.output
    if why == "control character":  # (a name littlefs keeps: the rest can still come out)
        assert "nothing extracted (--path extracts a directory that holds no such name" in result.output
    assert (tree(parent), os.stat(parent).st_mtime_ns) == before  # nothing created, nothing left
    assert not (tmp_path / "pwned").exists()


def test_an_extract_refused_for_several_names_counts_them(tmp_path):
    disk = littlefs_device({"/ok": b"fine", "/AAA": b"a", "/BBB": b"b", "/CCC": b"c"})
    for placeholder, name in ((b"AAA", b"a\x01b"), (b"BBB", b"c\td"), (b"CCC", b"e\x7ff")):
        rename_entry(disk, 512, placeholder, name)
    image = tmp_path / "odd.img"
    write_tiny_image(image, {"tile/2/disk": bytes(disk)})
    result = ipuos("image", "extract", str(image), "2", str(tmp_path / "out"))
    assert result.exit_code == 1
    assert "it contains a control character (and 2 more names like it); nothing extracted" in result.output
    assert not (tmp_path / "out").exists()
    assert ipuos("image", "cat", str(image), "2", "/ok").output == "fine"


def test_hostile_names_are_refused_by_ls_too(tmp_path):
    image = hostile_image(tmp_path, False, b"../x")
    result = ipuos("image", "ls", image, "2")
    assert result.exit_code == 1 and "refusing the name '../x'" in result.output


def test_ls_spells_out_what_a_name_would_do_to_a_terminal(tmp_path):
    image = hostile_image(tmp_path, False, b"two\nlines\x1b[2J")
    result = ipuos("image", "ls", image, "2")
    assert result.exit_code == 0, result.output
    assert result.output.endswith("  two\\nlines\\x1b[2J\n"), result.output  # one line, no escape


def test_ls_tells_a_backslash_in_a_name_from_an_escape(tmp_path):
    image = hostile_image(tmp_path, False, b"a\\nb")  # a backslash, then n: not a newline
    result = ipuos("image", "ls", image, "2")
    assert result.exit_code == 0, result.output
    assert "  a\\\\nb\n" in result.output, result.output


def test_verify_json_reports_a_damaged_image_as_not_ok(good, tmp_path):
    raw = bytearray(good.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    bad = tmp_path / "bad.img"
    bad.write_bytes(raw)
    result = CliRunner().invoke(main, ["image", "verify", str(bad), "--json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert doc["ok"] is False and doc["path"] == str(bad) and "damaged" in doc["error"]
    doc = json.loads(ipuos("image", "verify", str(good), "--json").output)
    assert doc["ok"] is True and "error" not in doc


def test_an_unreadable_image_is_an_error_not_a_usage_mistake(good, tmp_path):
    unreadable = tmp_path / "locked.img"
    unreadable.write_bytes(good.read_bytes())
    unreadable.chmod(0)
    # root reads anything: without the capabilities that let it, root is refused too
    done = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", IPUOS,
                           "image", "info", str(unreadable)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done
    assert f"image {unreadable}: cannot open it: Permission denied" in done.stderr
    assert "Usage:" not in done.stderr


def test_extract_through_a_link_to_an_empty_directory_fills_that_directory(good, tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    result = ipuos("image", "extract", str(good), "2", str(tmp_path / "link"))
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(tmp_path / "real")) == ["d", "hello.txt"]
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    result = ipuos("image", "extract", str(good), "2", str(tmp_path / "dangling"))
    assert result.exit_code == 1
    assert "it is a symbolic link to " + str(tmp_path / "nowhere") in result.output
    assert not (tmp_path / "nowhere").exists()


def test_a_device_number_is_ascii_digits(good):
    result = ipuos("image", "ls", str(good), "\u00b2")  # a superscript two is no tile number
    assert result.exit_code == 1 and "has no device '\u00b2'" in result.output


@pytest.mark.parametrize("number", ["02", "0002", "+2", " 2"])
def test_a_device_number_is_written_as_tile_paths_write_it(good, number):
    # tile/02/disk and /tiles/02 name nothing: nor does 02 (one tile, one name)
    result = ipuos("image", "ls", str(good), number)
    assert result.exit_code == 1 and f"has no device {number!r}" in result.output


def test_a_name_littlefs_allows_but_the_host_finds_odd_still_extracts(tmp_path):
    image = hostile_image(tmp_path, False, b"..x")  # legal: not a traversal
    result = ipuos("image", "extract", image, "2", str(tmp_path / "out"))
    assert result.exit_code == 0, result.output
    assert tree(tmp_path / "out")["..x"][1] == b"payload"


@pytest.mark.parametrize("taken", ["yesterday", 1e30, -1e18, True])
def test_info_shows_a_nonsense_time_as_unknown(good, tmp_path, taken):
    """The manifest's meta is untrusted: a time that is not one is said so, not a traceback."""
    image = tmp_path / "odd.img"
    disk = littlefs_device({"/f": b"x"})
    write_tiny_image(image, {"tile/2/disk": bytes(disk)},
                     meta={**TINY_META, "taken": taken, "machine": "m\x1b]0;title\x07"})
    result = ipuos("image", "info", str(image))
    assert result.exit_code == 0, result.output
    assert f"taken     unknown (the image says {taken!r}" in result.output
    # a name from the image cannot drive the terminal: its control characters are spelled out
    assert "\x1b" not in result.output and "machine   m\\x1b]0;title\\x07: tiny" in result.output


def test_a_device_littlefs_cannot_have_is_refused_clearly(tmp_path):
    image = tmp_path / "tiny-blocks.img"
    write_image(image, dict(TINY_META), [DeviceSnapshot("tile/2/disk", 2, "/", 64, 16, bytes(range(64)) * 16)],
                digest="blake3")
    assert ipuos("image", "verify", str(image)).exit_code == 0  # (the image itself is intact)
    for args in (("ls", str(image), "2"), ("cat", str(image), "2", "/f"),
                 ("extract", str(image), "2", str(tmp_path / "out"))):
        result = ipuos("image", *args)
        assert result.exit_code == 1
        assert result.output == (f"ipuos: device 'tile/2/disk' of image {image} holds no filesystem that "
                                 "mounts (littlefs needs blocks of at least 128 bytes, not 64)\n")
    assert not (tmp_path / "out").exists()


def test_a_tree_deeper_than_the_hosts_path_max_is_walked_not_called_damaged(tmp_path):
    name = "d" * 200
    dirs = ["/" + "/".join([name] * depth) for depth in range(1, 23)]  # 22 levels: 4,422 bytes
    chip = littlefs_device({dirs[-1] + "/leaf": b"deep"}, dirs=dirs, blocks=480)
    image = tmp_path / "deep.img"
    write_tiny_image(image, {"chip": bytes(chip)})
    result = ipuos("image", "extract", str(image), "chip", str(tmp_path / "all"))
    assert result.exit_code == 1 and "over PATH_MAX" in result.output and "damaged" not in result.output
    assert not (tmp_path / "all").exists()
    # below the top three levels, the relative paths fit on the host: that part extracts
    result = ipuos("image", "extract", str(image), "chip", str(tmp_path / "part"), "--path", dirs[2])
    assert result.exit_code == 0, result.output
    leaf = tmp_path / "part" / os.path.join(*[name] * 19) / "leaf"
    assert open(leaf, "rb").read() == b"deep"


def test_paths_in_a_device_are_resolved_as_on_a_tile(good, tmp_path):
    """``..`` climbs by name and stops at ``/``, as a tile's VFS (and Linux) resolve it."""
    root = ipuos("image", "ls", str(good), "2", "/").output
    for spelling in ("/..", "/d/..", "//d/../..", "d/e/../.."):
        result = ipuos("image", "ls", str(good), "2", spelling)
        assert (result.exit_code, result.output) == (0, root), spelling
    assert ipuos("image", "cat", str(good), "2", "/d/../hello.txt").output == "hello from tile 2\n"
    result = ipuos("image", "cat", str(good), "2", "/hello.txt/")
    assert result.exit_code == 1 and "Not a directory" in result.output, result.output
    result = ipuos("image", "extract", str(good), "2", str(tmp_path / "e"), "--path", "/d/e/..")
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(tmp_path / "e")) == ["e", "empty", "void"]


@pytest.mark.parametrize("image_mode, file_mode, dir_mode", [(0o600, 0o600, 0o700), (0o640, 0o640, 0o750),
                                                             (0o644, 0o644, 0o755)])
def test_extract_is_as_private_as_the_image(good, tmp_path, image_mode, file_mode, dir_mode):
    image = tmp_path / "copy.img"
    image.write_bytes(good.read_bytes())
    image.chmod(image_mode)
    saved = os.umask(0o022)
    try:
        result = ipuos("image", "extract", str(image), "2", str(tmp_path / "out"))
    finally:
        os.umask(saved)
    assert result.exit_code == 0, result.output
    modes = {path: stat.S_IMODE(os.lstat(tmp_path / "out" / path).st_mode) for path in tree(tmp_path / "out")}
    assert modes == {"hello.txt": file_mode, "d": dir_mode, "d/e": dir_mode, "d/e/deep.bin": file_mode,
                     "d/empty": file_mode, "d/void": dir_mode}
    assert stat.S_IMODE(os.stat(tmp_path / "out").st_mode) == dir_mode


def test_a_time_of_0_is_a_time_and_no_time_is_none(tmp_path):
    """1970-01-01 (mtime 0, a reproducible build's) is kept by extract and shown by ls;
    a file littlefs holds no time for shows none, and extract leaves it the time of now."""
    path = tmp_path / "epoch.img"
    disk = littlefs_device({"/epoch": b"0", "/timeless": b"?"}, mtimes={"/epoch": 0})
    write_tiny_image(path, {"tile/2/disk": bytes(disk)})
    listing = json.loads(ipuos("image", "ls", str(path), "2", "--json").output)
    assert [(e["name"], e["mtime_ns"]) for e in listing] == [("epoch", 0), ("timeless", None)]
    lines = ipuos("image", "ls", str(path), "2").output.splitlines()
    assert [line.split()[2] for line in lines] == [time.strftime("%Y-%m-%d", time.localtime(0)), "-"]
    dest = tmp_path / "out"
    before = time.time()
    assert ipuos("image", "extract", str(path), "2", str(dest)).exit_code == 0
    assert os.stat(dest / "epoch").st_mtime_ns == 0
    assert os.stat(dest / "timeless").st_mtime >= before - 1
