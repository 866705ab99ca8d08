"""The mount's rule for telling the kernel's retry of an open from the caller's own next
open (vfs._retries): plain bookkeeping, driven here call by call as the mount drives it."""

from __future__ import annotations

from ipuos.vfs import _retries
from ipuos.vfs._retries import RETRY_SECONDS, Retries

CALLER, OTHER, TILE = 4242, 4343, 0


def test_a_retry_is_told_the_name_is_gone_for_its_two_lookups_only():
    retries = Retries(entry_timeout=30.0)
    assert retries.first_try(CALLER, TILE, "/cfg")  # the open found no file: ESTALE
    assert not retries.first_try(CALLER, TILE, "/cfg")  # (its retry's open, if any: ENOENT)
    assert retries.first_try(CALLER, TILE, "/cfg")  # (a third: a new first try)
    # the kernel checks the name it keeps, then looks it up afresh: both told it is gone
    assert retries.lookup(CALLER, TILE, "/cfg") and retries.lookup(CALLER, TILE, "/cfg")
    # the caller opens the file again (a reader of a file another process replaces):
    # told the truth at once, not for the rest of RETRY_SECONDS
    assert not retries.lookup(CALLER, TILE, "/cfg")
    assert not retries.lookup(CALLER, TILE, "/cfg")


def test_only_the_caller_whose_open_failed_is_told_the_name_is_gone():
    retries = Retries(entry_timeout=30.0)
    assert retries.first_try(CALLER, TILE, "/cfg")
    assert not retries.lookup(OTHER, TILE, "/cfg")
    assert retries.lookup(CALLER, TILE, "/cfg")
    retries.done(CALLER, TILE, "/cfg")  # it opened the file after all
    assert not retries.lookup(CALLER, TILE, "/cfg")


def _a_walk_after_an_unlink_and_a_recreation(retries: Retries) -> None:
    """Another thread unlinks ``/cfg`` and a third makes it again; then CALLER's walk
    looks up ``tiles``, which the kernel keeps: a retry's walk, or a fresh process's."""
    retries.root_lookup("tiles", lambda: CALLER)  # (the kernel keeps it from now)
    retries.unlinked(TILE, "/cfg", OTHER)
    retries.created(TILE, "/cfg")
    retries.root_lookup("tiles", lambda: CALLER)


def test_a_walk_that_began_with_the_file_made_again_is_told_the_truth():
    """``rm f; echo new > f`` and then ``ls -l f`` in another process finds the file."""
    retries = Retries(entry_timeout=30.0)
    _a_walk_after_an_unlink_and_a_recreation(retries)
    assert not retries.lookup(CALLER, TILE, "/cfg", creating=lambda: False)
    assert not retries.lookup(CALLER, TILE, "/cfg")  # (not known: as not creating)


def test_an_open_that_creates_is_told_a_name_just_unlinked_is_gone():
    """An O_CREAT open that looks up a name unlinked through the mount: told the truth
    (made again by another process), its open could meet the next unlink and fail with
    ESTALE; told the name is gone, the kernel sends a create, which opens what is there.
    So with a walk or without one, and even for the caller that unlinked it."""
    retries = Retries(entry_timeout=30.0)
    _a_walk_after_an_unlink_and_a_recreation(retries)
    assert not retries.lookup(OTHER, TILE, "/cfg", creating=lambda: False)
    for _ in range(4):  # (as many lookups as the kernel makes: see Retries.lookup)
        assert retries.lookup(CALLER, TILE, "/cfg", creating=lambda: True)
    assert retries.lookup(OTHER, TILE, "/cfg", creating=lambda: True)
    assert not retries.lookup(CALLER, TILE, "/elsewhere", creating=lambda: True)  # (not unlinked)


def test_an_open_that_creates_is_told_the_truth_of_a_directory_made_there():
    retries = Retries(entry_timeout=30.0)
    retries.unlinked(TILE, "/d", OTHER)
    retries.named(TILE, "/d")  # a tile made a directory there
    assert not retries.lookup(CALLER, TILE, "/d", creating=lambda: True)


def test_an_open_that_creates_is_told_the_truth_once_the_unlink_is_old(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(_retries.time, "monotonic", lambda: now[0])
    retries = Retries(entry_timeout=30.0)
    retries.unlinked(TILE, "/old", OTHER)
    now[0] += RETRY_SECONDS / 2
    retries.unlinked(TILE, "/new", OTHER)  # (unlinks go on: the mount stays active)
    now[0] += RETRY_SECONDS * 0.6
    assert retries.lookup(CALLER, TILE, "/new", creating=lambda: True)
    assert not retries.lookup(CALLER, TILE, "/old", creating=lambda: True)


def test_a_walk_after_a_restore_is_told_the_truth_of_the_names_it_brought_back():
    """``rm -rf tree`` through the mount, a restore (a reset of the tile's files), then
    ``find`` and ``cat tree/a.txt``: a walk that began after the reset is a fresh
    process's, not a retry's. Names elsewhere on the tile, or on another tile, keep
    their unlink."""
    retries = Retries(entry_timeout=30.0)
    retries.root_lookup("tiles", lambda: CALLER)  # (the kernel keeps it from now)
    for tile, path in ((TILE, "/tree/a.txt"), (TILE, "/other"), (TILE + 1, "/tree/a.txt")):
        retries.unlinked(tile, path, OTHER)
    retries.reset(TILE, "/tree")
    retries.root_lookup("tiles", lambda: CALLER)
    assert not retries.lookup(CALLER, TILE, "/tree/a.txt")
    assert retries.lookup(CALLER, TILE, "/other")
    retries.root_lookup("tiles", lambda: CALLER)  # (a walk is spent on the name it finds gone)
    assert retries.lookup(CALLER, TILE + 1, "/tree/a.txt")


def test_a_walk_that_began_before_a_restore_may_still_be_a_retrys():
    retries = Retries(entry_timeout=30.0)
    retries.root_lookup("tiles", lambda: CALLER)
    retries.unlinked(TILE, "/tree/a.txt", OTHER)
    retries.root_lookup("tiles", lambda: CALLER)  # (the walk begins)
    retries.reset(TILE, "/")
    assert retries.lookup(CALLER, TILE, "/tree/a.txt")
