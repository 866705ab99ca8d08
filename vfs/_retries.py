"""The kernel's retries of opens that found their file gone, told apart so that the names
they look up can be answered "no such file" (see :class:`Retries`).

An open reaches the FUSE mount by the node of the name the kernel looked up. If the file
has gone meanwhile (a tile removed it, or another process unlinked it through the mount),
the open fails with ESTALE, and the kernel walks the path again, looking up every name on
it (even those it keeps), and retries once. Told the truth, that retry could find a new
file there and open it after it had gone too: a second ESTALE, or ENOENT, reaches the
caller, even one that asked for O_CREAT. Told "no such file", an O_CREAT open creates the
file (the kernel sends a create: O_CREAT never reaches an open, the kernel keeps it back),
and any other fails with ENOENT, as an open racing a removal may on a local disk.

Which lookups are a retry's is guessed from timing and who asks. A caller known to be in
an O_CREAT open (see :mod:`._syscalls`) needs no guess: any lookup of its of a name just
unlinked through the mount is told the name is gone, retry or not, and the create that
follows opens whatever file is there by then, so the race cannot fail it.
"""

from __future__ import annotations

import time

from ._paths import is_within

__all__ = ["Retries"]

#: seconds within which the kernel's retry of an open answered ESTALE comes
RETRY_SECONDS = 0.5
#: first tries of opens remembered at most (each is dropped once its retry is overdue)
_FIRST_TRIES_MAX = 1 << 12
#: lookups of its name a retry makes at most: the kernel checks the name it keeps, and,
#: told it is gone, looks it up afresh; after that, the thread's own next open asks
_RETRY_LOOKUPS = 2


class Retries:
    """Which lookups belong to the kernel's retry of an open that found its file gone.

    A retry is told by its caller (the kernel's thread id) and name, and by coming within
    RETRY_SECONDS. It looks the name up at most twice (a name the kernel keeps, checked
    and told gone, is looked up afresh): a thread whose open without O_CREAT failed so is
    told the name is gone for those two lookups, until RETRY_SECONDS, or until it opens
    or creates it. (Told so for all of RETRY_SECONDS, a program that opens the file
    again at once, as a reader of a file another replaces does, failed for that long.)

    An open finds its file gone in two ways:

    * the mount sees it (the tile has no such file, or libfuse asks by a name it hid):
      :meth:`first_try` notes it;
    * libfuse answers it with ESTALE itself, unseen, when an unlink through the mount has
      made it forget the node's name first (libfuse holds an open back while an unlink
      of its file is under way). The retry's walk gives it away: it looks up ``tiles``
      (or ``chip``), a name the kernel keeps and would not look up otherwise
      (:meth:`root_lookup`), soon after another thread unlinked the name it then looks
      up (:meth:`unlinked`). A walk that looks everything up again, or a plain stat of
      ``/tiles`` or ``/chip`` (libfuse asks the mount the same question for both), looks
      the same: one that then looks up a name another thread has just unlinked is told
      it is gone, unless the name was made again through the mount before that walk
      began (:meth:`created`): ``rm f; echo new > f`` and then ``ls -l`` in another
      process must find the new ``f``. (A walk that began before the file was made
      again may be a retry's, of an open that raced the unlink: told the file is gone,
      an O_CREAT open creates it, where the truth could fail it with ESTALE again.)

    A caller known to be in an O_CREAT open (see :mod:`._syscalls`) needs none of that:
    within RETRY_SECONDS of an unlink of the name through the mount, every lookup of its
    of that name is told it is gone, retry or not. Its own call then sends a create,
    which opens whatever file is there by then and gives the name a node again; no later
    call is left holding a name told gone, which the hazard below needs.

    Telling a name is gone while libfuse still has a node of it is not harmless: the
    kernel, keeping that name for one file, takes the name told gone for another, and
    sends ``mv x x`` (a rename of the name onto itself) to libfuse, whose path locks then
    wait on it forever, with the calling process unkillable. So a retry is over as soon
    as its caller does anything else (:meth:`acted`, :meth:`_moved_on`), and a
    directory made or a name renamed to since it was unlinked (through the mount, or by
    a tile) is never told gone (:meth:`named`).

    ``entry_timeout``: how long the kernel keeps a name it has looked up. Plain dict work,
    called from libfuse's threads at once (and :meth:`forgot` from the scheduler thread).
    """

    def __init__(self, entry_timeout: float):
        self.entry_timeout = entry_timeout
        #: (caller, tile, path) -> [when its open found the file gone, lookups told so]
        self._first: dict[tuple, list] = {}
        #: (tile, path) -> when the mount unlinked it, and for whom
        self._unlinked: dict[tuple[int, str], tuple[float, int | None]] = {}
        #: (tile, path) -> when the mount made a file there again since it unlinked it
        self._recreated: dict[tuple[int, str], float] = {}
        #: caller -> when it looked up a name in the mount's root that the kernel keeps
        self._walks: dict[int, float] = {}
        #: when anything above was last noted: all of it is dropped once that is old
        self._latest = 0.0
        #: "tiles" or "chip" -> when the kernel last looked it up (absent: it keeps none)
        self._root_kept: dict[str, float] = {}

    @property
    def active(self) -> bool:
        """Might a lookup be a retry's? (Asked first: most of the time none is.)"""
        return time.monotonic() - self._latest < RETRY_SECONDS

    def _note(self) -> float:
        """The time now, noted; what was noted before is dropped if too old to matter."""
        now = time.monotonic()
        if now - self._latest >= RETRY_SECONDS:
            self._first.clear()
            self._unlinked.clear()
            self._recreated.clear()
            self._walks.clear()
        self._latest = now
        return now

    def first_try(self, caller: int, tile: int, path: str) -> bool:
        """An open found no file: is it the kernel's first try, not its retry? Notes the
        first try. (A retry's lookups are told the file is gone, so it opens nothing; one
        that opens anyway is to get ENOENT: ESTALE again would reach the caller.)"""
        now = self._note()
        key = (caller, tile, path)
        first = self._first
        earlier = first.pop(key, None)
        if earlier is not None and now - earlier[0] < RETRY_SECONDS:
            return False
        # tries whose retry is overdue will have none (list(): one C call, which another
        # libfuse thread cannot interleave with)
        for old, (at, _) in list(first.items()):
            if now - at >= RETRY_SECONDS:
                first.pop(old, None)
        if len(first) >= _FIRST_TRIES_MAX:
            first.clear()
        first[key] = [now, 0]
        return True

    def lookup(self, caller: int, tile: int, path: str, creating=lambda: None) -> bool:
        """Is this lookup of ``path`` by ``caller`` one of a retry's? (Then it is to be
        told the file is gone.) ``creating()``: is the caller in an open with O_CREAT
        (None: not known)? Asked only of a lookup of a name unlinked through the mount
        within RETRY_SECONDS."""
        key = (caller, tile, path)
        entry = self._first.get(key)
        if entry is None and self._first:
            self._moved_on(caller, tile, path)
        unlinked = self._unlinked.get((tile, path))
        if unlinked is not None and time.monotonic() - unlinked[0] < RETRY_SECONDS and creating():
            # (however many lookups: the kernel may find the name made again by another
            # process's lookup before it sends its own, and look it up once more)
            self._walks.pop(caller, None)  # (its walk, if any, is accounted for)
            return True
        if entry is None:
            first_at = self._unseen_first_try(caller, tile, path)
            if first_at is None:
                return False
            entry = self._first[key] = [first_at, 0]
        entry[1] += 1
        if time.monotonic() - entry[0] >= RETRY_SECONDS or entry[1] > _RETRY_LOOKUPS:
            self._first.pop(key, None)
            return False
        self._walks.pop(caller, None)  # its walk is accounted for
        return True

    def _moved_on(self, caller: int, tile: int, path: str) -> None:
        """``caller`` looks up ``path``: a retry walks to its name through its parents
        only, so a retry of ``caller``'s elsewhere is over (else a later call of its, a
        ``mv`` of the name onto itself say, would be told the name is gone: see
        :meth:`named`)."""
        inside = path.rstrip("/") + "/"
        self._end_retries(caller, lambda key: key[1] == tile and key[2].startswith(inside))

    def _unseen_first_try(self, caller: int, tile: int, path: str) -> float | None:
        """When libfuse failed an open of ``path`` by ``caller`` itself, if its retry's
        walk says so: it began after another thread unlinked ``path`` through the mount,
        and before anyone made a file there again through the mount."""
        unlinked = self._unlinked.get((tile, path))
        walked_at = self._walks.get(caller)
        if unlinked is None or walked_at is None or walked_at < unlinked[0] or unlinked[1] == caller:
            return None
        if self._recreated.get((tile, path), walked_at + 1) <= walked_at:
            return None  # (the walk began with the new file there: no retry's)
        return unlinked[0]

    def done(self, caller: int, tile: int, path: str) -> None:
        """``caller`` has opened or made ``path``: its retry, if any, is over."""
        self._first.pop((caller, tile, path), None)

    def named(self, tile: int, path: str) -> None:
        """A directory is at ``path`` now, or something was renamed to it (through the
        mount, or by a tile): no longer a file just unlinked. Through the mount,
        libfuse has a node of that name now, and a walk's lookup of it must not be told it
        is gone (see the class doc); a directory, or a name inside the path of an O_CREAT
        open, must not be either. (Not for every name libfuse gets a node for: a file
        created, or a lookup answered, is what opens with O_CREAT racing unlinks do at
        every turn, and telling their retries the truth fails them with ESTALE again;
        there, a name is told gone to a retry only while it lasts.)"""
        self._unlinked.pop((tile, path), None)

    def acted(self, caller: int) -> None:
        """``caller`` makes, removes or renames a name: whatever open of its failed
        before, its retry is over (the kernel retries at once, looking up and opening
        only), and lookups of ``caller`` are told the truth again."""
        self._end_retries(caller)
        self._walks.pop(caller, None)

    def _end_retries(self, caller: int, keep=lambda key: False) -> None:
        """Forget ``caller``'s first tries, but those ``keep(key)`` holds."""
        first = self._first
        for key in [key for key in list(first) if key[0] == caller and not keep(key)]:
            first.pop(key, None)

    def unlinked(self, tile: int, path: str, caller: int | None) -> None:
        """The mount has unlinked ``path`` for ``caller``: libfuse forgets the name of its
        node."""
        if len(self._unlinked) >= _FIRST_TRIES_MAX:  # (an unlink loop over many names)
            self._unlinked.clear()
            self._recreated.clear()
        self._unlinked[(tile, path)] = (self._note(), caller)
        self._recreated.pop((tile, path), None)

    def created(self, tile: int, path: str) -> None:
        """A file is at ``path`` again: the mount made it, or a tile made it or renamed
        something to it (see :meth:`_unseen_first_try`). (Also from the scheduler
        thread: plain dict work, as the rest.)"""
        if (tile, path) in self._unlinked:
            self._recreated.setdefault((tile, path), time.monotonic())

    def reset(self, tile: int, path: str) -> None:
        """Anything under ``path`` on ``tile`` may be new (a restore): a name unlinked
        there is taken as made again now, as by :meth:`created` (else a walk after the
        restore, ``find`` say, was taken for a retry's, and a restored file listed by
        ``ls`` failed to open for the rest of RETRY_SECONDS)."""
        if not self._unlinked:
            return  # (a restore resets every tile: most often nothing was unlinked)
        now = time.monotonic()
        for key in [key for key in list(self._unlinked) if key[0] == tile and is_within(key[1], path)]:
            self._recreated.setdefault(key, now)

    def root_lookup(self, name: str, caller) -> None:
        """The kernel looks up ``name`` (``tiles`` or ``chip``) in the mount's root;
        ``caller()`` tells by whom. If the kernel keeps that name, this is a walk that looks
        up every name again: a retry's."""
        now = time.monotonic()
        kept_at = self._root_kept.get(name)
        self._root_kept[name] = now
        if not self._unlinked or kept_at is None or now - kept_at >= self.entry_timeout or not self.active:
            return
        who = caller()
        if who is not None:
            self._walks[who] = now

    def forgot(self, name: str) -> None:
        """The kernel has been told to forget ``name`` in the mount's root (a lookup of it
        now is a fresh one, not a retry's)."""
        self._root_kept.pop(name, None)
