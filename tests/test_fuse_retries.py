"""The mount's rule for telling the kernel's retry of an open from the caller's own next
open (vfs._retries): plain bookkeeping, driven here call by call as the mount drives it."""

from __future__ import annotations

from ipuos.vfs._retries import Retries

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
