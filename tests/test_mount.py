"""The life of a mount: ``ipuos mount``/``umount``, foreground mounts, halt, dead daemons.

Every test boots its own machine daemon and mounts it through the real CLI; fixtures
unmount whatever is left (even dead mounts) and halt the daemon.
"""

from __future__ import annotations

import errno
import json
import os
import select
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from daemon_harness import IPUOS, boot_machine, machine, run_cli, runtime_dir, wait_for  # noqa: F401  (fixtures)
from fuse_harness import fuse_session, mount, mountpoint, new_mountpoint, cleanup_mountpoint  # noqa: F401

from ipuos._client import DaemonError
from ipuos._mount import mount_at, mount_entries, remove_mount
from ipuos._rundir import RUNTIME_DIR_ENV


def mounted(path: str) -> bool:
    return mount_at(path) is not None


def children(pid: int, command: str) -> list[int]:
    """Pids of ``pid``'s children running ``command``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_bytes().rpartition(b")")[2].split()
            argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if int(fields[1]) == pid and os.path.basename(argv0) == command.encode():
            found.append(int(entry.name))
    return found


def cli(machine, *args, timeout=60):
    return run_cli(*args, env=machine.env(), timeout=timeout)


def test_mount_list_and_umount(machine, mountpoint):
    done = cli(machine, "mount", mountpoint)
    assert done.returncode == 0, done.stderr
    assert f"mounted machine {machine.name!r} at {mountpoint} (read-write, tiles 0-15)" in done.stdout
    entry = mount_at(mountpoint)
    assert (entry.fstype, entry.source, entry.machine) == ("fuse.ipuos", f"ipuos:{machine.name}", machine.name)
    assert sorted(os.listdir(mountpoint)) == ["chip", "tiles"]
    assert len(children(machine.pid, "fusermount3")) == 1  # libfuse's auto_unmount watchdog

    listed = cli(machine, "mount")
    assert listed.returncode == 0 and mountpoint in listed.stdout and "tiles 0-15" in listed.stdout
    listed = json.loads(cli(machine, "mount", "--json").stdout)
    assert listed["name"] == machine.name
    (item,) = listed["mounts"]
    assert item["mountpoint"] == mountpoint and item["readonly"] is False and item["foreground"] is False
    assert item["client_pid"] is None  # (the `ipuos mount` that asked has ended: no pid of it)
    assert item["tiles"] == list(range(16))
    assert json.loads(cli(machine, "status", "--json").stdout)["mounts"] == [mountpoint]
    inside = cli(machine, "umount", f"{mountpoint}/chip")
    assert inside.returncode == 1 and inside.stderr == (
        f"ipuos: {mountpoint}/chip is not mounted: it is inside {mountpoint}, a mount of machine "
        f"{machine.name!r} (`ipuos umount {mountpoint}` unmounts that)\n"), inside.stderr

    done = cli(machine, "umount", mountpoint)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"unmounted {mountpoint}"
    assert not mounted(mountpoint)
    # the watchdog of a mount that ended must not linger: at the daemon's exit it would
    # unmount whatever ipuos mount sits at that path by then
    wait_for(lambda: not children(machine.pid, "fusermount3"), what="the watchdog to go")
    assert "no mounts" in cli(machine, "mount").stdout
    # and again: a mount point can be reused
    assert cli(machine, "mount", mountpoint).returncode == 0
    assert cli(machine, "umount", mountpoint).returncode == 0


def test_the_umount_command_mount_prints_can_be_pasted(machine, fuse_session):
    path = os.path.join(new_mountpoint(), "a b\n$c")  # (a shell would split, or expand, it)
    os.mkdir(path)
    try:
        done = cli(machine, "mount", path)
        assert done.returncode == 0, done.stderr
        command = done.stdout.split("`")[1]
        env = machine.env(PATH=os.path.dirname(IPUOS) + os.pathsep + os.environ.get("PATH", ""))
        umounted = subprocess.run(["/bin/sh", "-c", command], env=env, capture_output=True, text=True, timeout=60)
        assert umounted.returncode == 0, umounted.stderr
        assert not mounted(path)
    finally:
        cleanup_mountpoint(path)


def test_a_missing_mount_point_starts_no_machine(runtime_dir, tmp_path):
    env = dict(os.environ, IPUOS_MACHINE="never-started")
    done = run_cli("mount", str(tmp_path / "missing"), env=env)
    assert done.returncode == 2 and "is not a directory" in done.stderr
    assert "never-started" not in run_cli("machines", env=env).stdout


def test_mount_refusals(machine, mountpoint, tmp_path):
    missing = cli(machine, "mount", str(tmp_path / "missing"))
    assert missing.returncode == 2 and "is not a directory; create it first" in missing.stderr
    a_file = tmp_path / "file"
    a_file.write_text("x")
    not_dir = cli(machine, "mount", str(a_file))
    assert not_dir.returncode != 0
    bad_tiles = cli(machine, "mount", mountpoint, "--tiles", "7-99")
    assert bad_tiles.returncode == 2 and "no tile 99" in bad_tiles.stderr
    huge = cli(machine, "mount", mountpoint, "--tiles", "0-1000000000000")  # (checked in the CLI)
    assert huge.returncode == 2 and "no tile 1000000000000 on this machine (it has tiles 0-15)" in huge.stderr
    assert cli(machine, "mount", mountpoint).returncode == 0
    twice = cli(machine, "mount", mountpoint)
    assert twice.returncode == 1 and "already" in twice.stderr
    inside = cli(machine, "mount", os.path.join(mountpoint, "tiles", "1"))
    assert inside.returncode == 1
    not_mounted = cli(machine, "umount", str(tmp_path))
    assert not_mounted.returncode == 1 and "is not mounted" in not_mounted.stderr
    foreign = cli(machine, "umount", "/proc")
    assert foreign.returncode == 1 and "not an ipuos mount" in foreign.stderr
    assert os.path.isdir("/proc/self")  # left alone


def test_an_empty_mount_point_is_refused(machine, mountpoint, monkeypatch):
    # what `ipuos mount "$DIR"` gives with DIR unset: not the current directory
    monkeypatch.chdir(mountpoint)
    for command in ("mount", "umount"):
        done = cli(machine, command, "")
        assert done.returncode == 2, done.stderr
        assert "Invalid value for" in done.stderr and "MOUNTPOINT" in done.stderr and "the path is empty" in done.stderr
        assert not mounted(mountpoint)


def test_a_mount_over_the_runtime_directory_is_refused(fuse_session, monkeypatch):
    # it would hide the machine's socket: no command could reach it, not even to unmount
    outer = Path(new_mountpoint("outer"))
    runtime = outer / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(runtime))
    booted = boot_machine()
    try:
        for path in (outer, runtime):
            done = cli(booted, "mount", str(path))
            assert done.returncode == 2, done.stderr
            assert f"the runtime directory {runtime}" in done.stderr and "mount somewhere else" in done.stderr
            with pytest.raises(DaemonError) as refused:  # the daemon refuses it too
                mount(booted, str(path))
            assert refused.value.code == "bad_mountpoint"
            assert not mounted(str(path))
        assert cli(booted, "status").returncode == 0
    finally:
        for path in (runtime, outer):  # (before the halt, which needs the socket)
            if mounted(str(path)):
                remove_mount(str(path))
        booted.halt()
        cleanup_mountpoint(str(outer))


def test_a_mount_point_whose_name_is_not_utf8_is_refused(machine, mountpoint):
    # the daemon takes paths as text: the name would reach it changed, as the name of
    # another directory (its undecodable byte spelled out), which would be mounted instead
    named = os.fsencode(mountpoint) + b"/bad\xffname"
    os.mkdir(named)
    os.mkdir(os.fsencode(mountpoint) + b"/bad\\udcffname")
    try:
        done = cli(machine, "mount", named)
        assert done.returncode == 2, done.stderr
        assert "bad\\xffname: this mount point is not UTF-8 text" in done.stderr
        assert not [entry for entry in mount_entries() if entry.mountpoint.startswith(mountpoint)]
        done = cli(machine, "umount", named)
        assert done.returncode == 1 and "is not mounted" in done.stderr
    finally:
        for entry in mount_entries():
            if entry.mountpoint.startswith(mountpoint + "/"):
                remove_mount(entry.mountpoint)


def test_a_mount_over_the_parent_of_a_mount_is_refused(machine, fuse_session):
    # it would hide that mount: nothing could reach it, nor unmount it by its path
    outer = new_mountpoint("outer")
    inner = os.path.join(outer, "inner")
    os.mkdir(inner)
    try:
        assert cli(machine, "mount", inner).returncode == 0
        done = cli(machine, "mount", outer)
        assert done.returncode == 1, done.stderr
        assert f"{outer} holds {inner}, a mount of machine {machine.name!r}" in done.stderr
        assert not mounted(outer)
        assert cli(machine, "umount", inner).returncode == 0
    finally:
        for path in (outer, inner):
            if mounted(path):
                remove_mount(path)
        cleanup_mountpoint(outer)


def test_a_mount_point_given_as_a_symlink_is_its_target(machine, mountpoint, tmp_path):
    # fusermount3 follows the link: the checks and the unmount must look where it mounts
    link = tmp_path / "link"
    link.symlink_to(mountpoint)
    done = cli(machine, "mount", str(link))
    assert done.returncode == 0, done.stderr
    assert f"at {mountpoint} " in done.stdout and mounted(mountpoint)
    stacked = cli(machine, "mount", str(link))
    assert stacked.returncode == 1 and "already" in stacked.stderr
    done = cli(machine, "umount", str(link))
    assert done.returncode == 0, done.stderr
    assert not mounted(mountpoint)
    wait_for(lambda: not children(machine.pid, "fusermount3"), what="the watchdog to go")


def test_refused_mount_requests_start_no_machine(runtime_dir, tmp_path):
    env = dict(os.environ, IPUOS_MACHINE="never-started")
    (tmp_path / "here").mkdir()
    done = run_cli("mount", str(tmp_path / "here"), "--tiles", "abc", env=env)
    assert done.returncode == 2 and "'abc' is not a tile id" in done.stderr
    assert done.stderr.count("started machine") == 0
    # a range the machine it would start lacks: tiny has 16 tiles, two of them 32
    done = run_cli("mount", str(tmp_path / "here"), "--preset", "tiny", "--tiles", "16", env=env)
    assert done.returncode == 2 and "no tile 16 on this machine" in done.stderr, done.stderr
    assert "never-started" not in run_cli("machines", env=env).stdout
    done = run_cli("run", __file__, "--preset", "tiny", "--ipus", "2", "--tiles", "0-32", env=env)
    assert done.returncode == 2 and "no tile 32" in done.stderr and "started machine" not in done.stderr
    done = run_cli("run", __file__, "--preset", "tiny", "--tiles", "x1", env=env)
    assert done.returncode == 2 and "'x1' is not a tile id" in done.stderr
    assert "never-started" not in run_cli("machines", env=env).stdout


def test_an_over_long_name_is_enametoolong_after_a_listing_too(machine, mountpoint):
    mount(machine, mountpoint)
    directory = Path(mountpoint, "tiles", "9")
    long_name = directory / ("q" * 300)
    for listed_first in (False, True):
        if listed_first:
            os.listdir(directory)  # the mount now knows the directory's names
        with pytest.raises(OSError) as info:
            os.stat(long_name)
        assert info.value.errno == errno.ENAMETOOLONG


def test_tiles_option_limits_what_is_shown(machine, mountpoint):
    assert cli(machine, "mount", mountpoint, "--tiles", "2-3,9").returncode == 0
    assert sorted(os.listdir(os.path.join(mountpoint, "tiles"))) == ["2", "3", "9"]
    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(mountpoint, "tiles", "4"))
    Path(mountpoint, "tiles", "9", "f").write_text("nine")
    assert Path(mountpoint, "tiles", "9", "f").read_text() == "nine"
    assert os.path.isdir(os.path.join(mountpoint, "chip"))


def test_mount_json_describes_the_mount_as_its_listing_does(machine, mountpoint):
    done = cli(machine, "mount", mountpoint, "--tiles", "2-3,9", "--read-only", "--json")
    assert done.returncode == 0, done.stderr
    mounted_json = json.loads(done.stdout)
    (listed,) = json.loads(cli(machine, "mount", "--json").stdout)["mounts"]
    assert mounted_json["name"] == machine.name
    assert mounted_json["tiles"] == listed["tiles"] == [2, 3, 9]  # (a list, as every --json's tiles)
    assert mounted_json["mountpoint"] == listed["mountpoint"] == mountpoint and mounted_json["readonly"] is True


def test_read_only_mount_refuses_every_change(machine, mountpoint):
    mount(machine, mountpoint)
    root = Path(mountpoint)
    (root / "tiles" / "1" / "kept").write_bytes(b"kept")
    os.mkdir(root / "tiles" / "1" / "dir")
    assert cli(machine, "umount", mountpoint).returncode == 0
    done = cli(machine, "mount", mountpoint, "--read-only")
    assert done.returncode == 0 and "read-only" in done.stdout
    t1 = root / "tiles" / "1"
    assert (t1 / "kept").read_bytes() == b"kept"
    refused = {
        "open for writing": lambda: os.open(t1 / "kept", os.O_WRONLY),
        "create": lambda: os.open(t1 / "new", os.O_WRONLY | os.O_CREAT),
        "mkdir": lambda: os.mkdir(t1 / "d2"),
        "unlink": lambda: os.unlink(t1 / "kept"),
        "rmdir": lambda: os.rmdir(t1 / "dir"),
        "rename": lambda: os.rename(t1 / "kept", t1 / "moved"),
        "truncate": lambda: os.truncate(t1 / "kept", 0),
        "utime": lambda: os.utime(t1 / "kept", ns=(1, 1)),
        "chip write": lambda: open(root / "chip" / "x", "wb"),
    }
    for what, call in refused.items():
        with pytest.raises(OSError) as caught:
            call()
        assert caught.value.errno == errno.EROFS, what
    assert os.statvfs(t1).f_flag & os.ST_RDONLY
    assert sorted(os.listdir(t1)) == ["dir", "kept"]


def test_umount_of_a_busy_mount_refuses_unless_lazy(machine, mountpoint):
    mount(machine, mountpoint)
    path = Path(mountpoint, "tiles", "2", "held")
    path.write_bytes(b"held open")
    with open(path, "rb") as held:
        busy = cli(machine, "umount", mountpoint)
        assert busy.returncode == 1 and "busy" in busy.stderr
        assert mounted(mountpoint)
        lazy = cli(machine, "umount", "--lazy", mountpoint)
        assert lazy.returncode == 0, lazy.stderr
        assert not mounted(mountpoint)  # detached at once...
        assert held.read() == b"held open"  # ...and still served until let go
        assert "detached (unmounted lazily" in cli(machine, "mount").stdout
        again = cli(machine, "mount", mountpoint)  # the name is free meanwhile
        assert again.returncode == 0, again.stderr
        assert cli(machine, "umount", mountpoint).returncode == 0
    wait_for(lambda: not children(machine.pid, "fusermount3"), what="the loop to end")
    assert "no mounts" in cli(machine, "mount").stdout
    # the file the host held is closed on its tile too: nothing is left open there (a
    # restore, which refuses tiles with open files, goes through)
    listing = subprocess.run([IPUOS, "shell", "-c", "mount --tile 2"], env=machine.env(),
                             capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0 and "open" not in listing.stdout, listing.stdout
    image = Path(mountpoint).parent / "after-lazy.img"
    assert cli(machine, "backup", str(image)).returncode == 0
    restored = cli(machine, "restore", str(image))
    assert restored.returncode == 0, restored.stderr


def _foreground(machine, path: str, *args, preexec_fn=None) -> subprocess.Popen:
    process = subprocess.Popen([IPUOS, "mount", "--foreground", path, *args], env=machine.env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=preexec_fn)
    try:
        wait_for(lambda: mounted(path) or process.poll() is not None, what="the foreground mount")
    except AssertionError:
        process.kill()
        raise
    assert process.poll() is None, process.communicate()
    return process


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (as `cmd &` in a script starts cmd)


@pytest.mark.parametrize("signum, preexec_fn", [(signal.SIGTERM, None), (signal.SIGINT, None),
                                                (signal.SIGTERM, _ignore_sigint)],
                         ids=["SIGTERM", "SIGINT", "SIGTERM-with-SIGINT-ignored"])
def test_foreground_mount_ends_with_its_command(machine, mountpoint, signum, preexec_fn):
    # (started with SIGINT ignored, SIGTERM found no Ctrl-C handler to hand over to: the
    # command gave up waiting at once, status 130, before the unmount)
    process = _foreground(machine, mountpoint, preexec_fn=preexec_fn)
    (item,) = json.loads(cli(machine, "mount", "--json").stdout)["mounts"]
    assert item["foreground"] is True and item["client_pid"] == process.pid
    Path(mountpoint, "tiles", "3", "f").write_text("while mounted")
    process.send_signal(signum)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "Ctrl-C unmounts" in err
    assert f"unmounted {mountpoint} (the foreground command ended)" in out
    assert not mounted(mountpoint)
    assert machine.call("mounts")["mounts"] == []


def test_a_foreground_mount_with_a_file_open_says_why_it_waits(machine, mountpoint):
    process = _foreground(machine, mountpoint)
    path = Path(mountpoint, "tiles", "3", "held")
    path.write_text("held")
    with open(path) as held:
        process.send_signal(signal.SIGINT)
        said = ""
        while "unmounted lazily" not in said and select.select([process.stderr], [], [], 10)[0]:
            said += process.stderr.readline()  # ("mounted ..." comes first)
        assert "unmounted lazily: 1 file still open there, served until closed" in said, said
        assert not mounted(mountpoint) and process.poll() is None
        assert held.read() == "held"  # still served
    out, err = process.communicate(timeout=30)  # the file closed: the loop ends
    assert process.returncode == 0, err


def test_foreground_mount_ends_when_unmounted_elsewhere(machine, mountpoint):
    process = _foreground(machine, mountpoint, "--tiles", "0-3")
    assert cli(machine, "umount", mountpoint).returncode == 0
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "unmounted with `ipuos umount`" in out


def test_foreground_mount_ends_when_its_command_dies(machine, mountpoint):
    process = _foreground(machine, mountpoint)
    process.kill()  # SIGKILL: no chance to say anything; its connection drops
    process.communicate(timeout=30)
    wait_for(lambda: not mounted(mountpoint), what="the daemon to unmount")


def test_a_backup_into_the_machines_own_mount_is_refused_at_once(machine, mountpoint):
    """The tiles are frozen while they are backed up, so none could serve the image's
    writes: the backup waited out the request timeout, every tile stopped meanwhile."""
    assert cli(machine, "mount", mountpoint).returncode == 0
    image = os.path.join(mountpoint, "tiles", "3", "self.img")
    # a link to a file in it (the image replaces the file a link names) is the same place
    link = os.path.join(os.path.dirname(mountpoint), f"link-{os.path.basename(mountpoint)}.img")
    os.symlink(image, link)
    try:
        for target in (image, link):
            for args in (["backup", target], ["halt", "--backup", target]):
                done = cli(machine, *args, timeout=20)
                assert done.returncode == 1, done
                assert f"it is on the mount {mountpoint} of machine {machine.name!r} itself," in done.stderr
                assert "choose a path on a host disk" in done.stderr
    finally:
        os.unlink(link)
    assert "not halted" in done.stderr
    assert os.listdir(os.path.join(mountpoint, "tiles", "3")) == []  # nothing half-written
    assert cli(machine, "status").returncode == 0  # still up and answering


def test_a_restore_refused_for_a_file_held_open_through_the_mount_names_the_mount(
        machine, mountpoint, tmp_path):
    """A file a host process holds open through the mount keeps its tile from being
    restored: the refusal names the mount and how to find the holder, not just a count."""
    assert cli(machine, "mount", mountpoint).returncode == 0
    marker = os.path.join(mountpoint, "chip", "marker")
    Path(marker).write_text("x\n")
    image = tmp_path / "f.img"
    assert cli(machine, "backup", str(image)).returncode == 0
    with open(marker, "a"):
        done = cli(machine, "restore", str(image), timeout=30)
    assert done.returncode == 1, done
    assert done.stderr.startswith("ipuos: cannot restore while tiles are in use: tile 0: 1 file is open on it "
                                  "(/chip/marker); nothing was restored"), done.stderr
    assert (f"Files are held open through the host mount {mountpoint} (1 file open through it): close them "
            f"(`fuser -vm {mountpoint}` or `lsof {mountpoint}` names the processes holding them), then "
            "restore again") in done.stderr
    # one unlinked while held open is still open (on the tile, as on the host)
    with open(os.path.join(mountpoint, "chip", "gone"), "w") as gone:
        os.unlink(gone.name)
        done = cli(machine, "restore", str(image), timeout=30)
        assert done.returncode == 1, done
        assert done.stderr.startswith("ipuos: cannot restore while tiles are in use: tile 0: 1 file is open "
                                      "on it (1 removed while open)"), done.stderr
        assert f"host mount {mountpoint} (1 file open through it)" in done.stderr
    wait_for(lambda: cli(machine, "restore", str(image), timeout=30).returncode == 0, what="the restore, closed")
    # a mount of other tiles shows /chip too: it may be what holds the chip tile's files
    assert cli(machine, "umount", mountpoint).returncode == 0
    assert cli(machine, "mount", mountpoint, "--tiles", "5").returncode == 0
    with open(marker, "a"):
        done = cli(machine, "restore", str(image), "--tiles", "0", timeout=30)
    assert done.returncode == 1, done
    assert f"Files are held open through the host mount {mountpoint} (1 file open through it)" in done.stderr


def test_halt_unmounts_everything(machine, mountpoint):
    second = new_mountpoint()
    try:
        mount(machine, mountpoint)
        process = _foreground(machine, second)
        held = open(Path(mountpoint, "tiles", "1", "open-at-halt"), "wb")  # busy: lazily unmounted
        try:
            done = cli(machine, "halt")
            assert done.returncode == 0, done.stderr
            assert not mounted(mountpoint) and not mounted(second)
            out, _ = process.communicate(timeout=30)
            assert process.returncode == 0 and "halted" in out
            with pytest.raises(OSError) as caught:  # fails, never hangs
                held.write(b"x")
                held.flush()
            assert caught.value.errno in (errno.EIO, errno.ENOTCONN, errno.ECONNABORTED)
        finally:
            try:
                held.close()
            except OSError:
                pass
    finally:
        cleanup_mountpoint(second)


def test_a_mount_whose_directory_was_moved_is_unmounted_where_it_is_now(machine, mountpoint):
    """Renaming a directory above a mount point moves the mount. The daemon knew it by its
    old path: `umount` at the new one said another machine's runtime dir served it, and
    halt left it there dead."""
    before, after = Path(mountpoint, "before"), Path(mountpoint, "after")
    (before / "m").mkdir(parents=True)
    try:
        assert cli(machine, "mount", str(before / "m")).returncode == 0
        before.rename(after)
        assert mounted(str(after / "m"))
        (item,) = json.loads(cli(machine, "mount", "--json").stdout)["mounts"]
        assert item["mountpoint"] == str(after / "m")
        done = cli(machine, "umount", str(after / "m"))
        assert done.returncode == 0 and done.stdout.strip() == f"unmounted {after / 'm'}", done.stderr
        assert not mounted(str(after / "m"))

        assert cli(machine, "mount", str(after / "m")).returncode == 0
        after.rename(before)
        assert cli(machine, "halt").returncode == 0
        assert not mounted(str(before / "m")) and not mounted(str(after / "m"))
    finally:
        for path in (before / "m", after / "m"):
            if mounted(str(path)):
                remove_mount(str(path))


def test_halt_detaches_a_busy_foreground_mount_and_its_command_says_so(machine, mountpoint):
    """halt does not wait for the processes using a foreground mount (a shell's cwd can
    stay there for hours): the mount is detached and its command told why it ended."""
    process = _foreground(machine, mountpoint)
    held = open(Path(mountpoint, "tiles", "1", "open-at-halt"), "wb")
    try:
        done = cli(machine, "halt")
        assert done.returncode == 0, done.stderr
        assert done.stderr == (f"ipuos: detached the mount at {mountpoint}, where 1 file was open: using it "
                               "now fails\n"), done.stderr
        out, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
        assert f"unmounted {mountpoint} (machine {machine.name!r} halted; it was in use, so it was detached)" in out
        assert "closed the connection" not in err
        assert not mounted(mountpoint)
    finally:
        try:
            held.close()
        except OSError:
            pass


def test_a_killed_daemon_leaves_no_dead_mount(machine, mountpoint):
    mount(machine, mountpoint)
    os.kill(machine.pid, signal.SIGKILL)
    # libfuse's watchdog (fusermount3 -o auto_unmount) unmounts when its daemon is gone
    wait_for(lambda: not mounted(mountpoint), timeout=15, what="the watchdog to unmount")
    assert os.listdir(mountpoint) == []


def test_umount_removes_a_dead_mount(machine, mountpoint):
    mount(machine, mountpoint)
    (watchdog,) = children(machine.pid, "fusermount3")
    os.kill(watchdog, signal.SIGKILL)  # no watchdog: killing the daemon now leaves a dead mount
    os.kill(machine.pid, signal.SIGKILL)
    wait_for(lambda: _dead(mountpoint), what="the mount to die")
    assert mounted(mountpoint)
    done = run_cli("umount", mountpoint)  # no --name: the mount table says whose it was
    assert done.returncode == 0, done.stderr
    assert "removed the dead mount" in done.stdout
    assert not mounted(mountpoint) and os.listdir(mountpoint) == []


def test_booting_the_machine_again_removes_its_dead_mount(machine, mountpoint):
    # (it stayed, the new machine's `ipuos mount` listed nothing, and only `ipuos umount` of
    # that very path removed it)
    mount(machine, mountpoint)
    (watchdog,) = children(machine.pid, "fusermount3")
    os.kill(watchdog, signal.SIGKILL)  # as a kill of the whole process group would
    os.kill(machine.pid, signal.SIGKILL)
    wait_for(lambda: _dead(mountpoint), what="the mount to die")
    booted = run_cli("boot", "--preset", "tiny", "--name", machine.name, env=machine.env(), timeout=120)
    assert booted.returncode == 0, booted.stderr
    assert not mounted(mountpoint) and os.listdir(mountpoint) == []
    log = machine.paths.log.read_text()
    assert f"removed the dead mount at {mountpoint} left by a daemon that died" in log


def test_umount_with_another_runtime_dir_leaves_a_live_mount_alone(machine, mountpoint):
    """A runtime dir that does not know the machine serving a mount must not take the
    mount for a dead one: it still answers, and its machine runs."""
    import tempfile

    mount(machine, mountpoint)
    other = tempfile.mkdtemp(prefix="ipo", dir="/tmp")
    elsewhere = machine.env(**{RUNTIME_DIR_ENV: other})
    try:
        path = Path(mountpoint, "tiles", "2", "held")
        path.write_bytes(b"held open")
        with open(path, "rb") as held:
            refused = run_cli("umount", mountpoint, env=elsewhere)
            assert refused.returncode == 1, refused.stdout
            assert "removed" not in refused.stdout and mounted(mountpoint)
            message = refused.stderr
            assert (f"is served by a running machine, {machine.name!r}, that the runtime dir {other} "
                    "does not know") in message, message
            assert f"its daemon, pid {machine.pid}, uses the runtime dir {machine.paths.dir}" in message
            assert f"`IPUOS_RUNTIME_DIR={machine.paths.dir} ipuos umount {mountpoint}`" in message
            assert f"`ipuos umount --lazy {mountpoint}`" in message
            assert held.read() == b"held open"  # still served
        idle = run_cli("umount", mountpoint, env=elsewhere)  # nothing open: still not its to end
        assert idle.returncode == 1 and mounted(mountpoint), idle.stderr
        lazy = run_cli("umount", "--lazy", mountpoint, env=elsewhere)
        assert lazy.returncode == 0, lazy.stderr
        assert f"detached {mountpoint} lazily" in lazy.stdout and not mounted(mountpoint)
        wait_for(lambda: machine.call("mounts")["mounts"] == [], what="the machine to see its mount end")
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_umount_with_another_runtime_dir_leaves_a_stopped_daemons_mount_alone(machine, mountpoint):
    """A mount whose daemon is stopped does not answer, but is not dead either: `ipuos
    umount` says so in a few seconds, neither waiting for it nor removing it."""
    import tempfile

    mount(machine, mountpoint)
    other = tempfile.mkdtemp(prefix="ipo", dir="/tmp")
    os.kill(machine.pid, signal.SIGSTOP)
    try:
        refused = run_cli("umount", mountpoint, env=machine.env(**{RUNTIME_DIR_ENV: other}), timeout=60)
    finally:
        os.kill(machine.pid, signal.SIGCONT)
        shutil.rmtree(other, ignore_errors=True)
    assert refused.returncode == 1 and mounted(mountpoint), refused.stdout
    assert f"{mountpoint} did not answer within 5 s, but it is not dead" in refused.stderr, refused.stderr
    assert f"`IPUOS_RUNTIME_DIR={machine.paths.dir} ipuos umount {mountpoint}`" in refused.stderr
    assert cli(machine, "umount", mountpoint).returncode == 0  # (its own runtime dir)


def test_mount_over_a_stopped_daemons_mount_says_it_is_mounted_at_once(machine, mountpoint):
    """`ipuos mount` where a mount is already, one whose server never answers, refuses
    from the mount table without waiting for the mount."""
    mount(machine, mountpoint)
    os.kill(machine.pid, signal.SIGSTOP)
    try:
        again = cli(machine, "mount", mountpoint, "--name", "another", timeout=20)
    finally:
        os.kill(machine.pid, signal.SIGCONT)
    assert again.returncode == 1, again
    assert f"{mountpoint} is already a mount point (machine {machine.name!r}); unmount it first" in again.stderr


def _dead(path: str) -> bool:
    try:
        os.statvfs(path)
    except OSError as exc:
        return exc.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


def test_mount_starts_the_machine_like_run(runtime_dir, fuse_session):
    from daemon_harness import unique_name

    from ipuos._rundir import machine_paths
    from ipuos._spawn import wait_halted

    name = unique_name("mnt")
    path = new_mountpoint()
    try:
        done = run_cli("mount", path, "--name", name)
        assert done.returncode == 0, done.stderr
        assert f"started machine {name!r}" in done.stderr
        assert mounted(path)
    finally:
        run_cli("halt", "--name", name)
        wait_halted(machine_paths(name), timeout=15)
        cleanup_mountpoint(path)
