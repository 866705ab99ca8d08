"""The block-device protocol every ipuos storage device speaks.

A block device is ``block_count`` blocks of ``block_size`` bytes with four operations:
``read``, ``prog`` (write into an erased region), ``erase`` (reset a whole block to the
erased value) and ``sync`` (make earlier progs durable). That is exactly what littlefs asks
of its storage, so a device can be handed to :class:`~ipuos.blockdev.Filesystem` as is.

:class:`BlockDevice` implements the public operations once (bounds checks, counters, fault
injection) and leaves four small primitives to subclasses: ``_read_block``,
``_prog_block``, ``_erase_block`` and ``_sync``. The primitives see only checked arguments.
A primitive may pause the calling greenlet (a device whose blocks live on another tile
waits for the exchange), so nothing here holds a lock or assumes a call returns without
other code running in between.

Device faults are ``OSError`` with ``errno.EIO``; bad arguments (a block out of range) are
``ValueError``, because they are bugs in the caller, not conditions of the medium.
"""

from __future__ import annotations

import errno
import weakref

__all__ = ["BlockDevice"]


def _counter(index: int, name: str, doc: str) -> property:
    """A device counter: the device's own count plus what the glue's fast paths counted.

    Reading never writes (any thread may read while the owner counts); setting it (e.g.
    ``reset_stats``) offsets the device's own count so the sum is the value set.
    """
    attr = "_" + name

    def get(self) -> int:
        value = getattr(self, attr)
        for _, take in self._tallies:
            value += take()[index]
        return value

    def set(self, value: int) -> None:
        for _, take in self._tallies:
            value -= take()[index]
        setattr(self, attr, value)

    return property(get, set, doc=doc)

#: the counters in the order a fast path's ``take()`` reports them
_TALLIED = ("reads", "bytes_read", "progs", "bytes_progged", "erases", "syncs")


class BlockDevice:
    """Base class of block devices: geometry, checked operations, counters, fault hooks.

    Counters count *requests*, including ones a fault plan then fails: ``reads``,
    ``progs``, ``erases``, ``syncs``, ``bytes_read``, ``bytes_progged``;
    ``erase_counts[block]`` is the per-block wear. They are exact at every moment they are
    read. The littlefs glue's fast paths (healthy devices only) count in their own
    closures rather than in the device, and the device adds those counts up when a
    counter is read (see :meth:`_add_tally`): a counter update per callback was a tenth of
    the glue's cost on the tile disk.
    """

    reads = _counter(0, "reads", "read requests")
    bytes_read = _counter(1, "bytes_read", "bytes asked for by reads")
    progs = _counter(2, "progs", "prog requests")
    bytes_progged = _counter(3, "bytes_progged", "bytes handed to progs")
    erases = _counter(4, "erases", "erase requests")
    syncs = _counter(5, "syncs", "sync requests")

    #: the value every byte of a block holds after ``erase``. 0x00 suits SRAM, which is
    #: zero at boot, so a fresh device needs no fill (littlefs does not depend on it).
    erase_value: int = 0x00

    def __init__(self, block_size: int, block_count: int):
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block size must be a positive integer, not {block_size!r}")
        if not isinstance(block_count, int) or block_count <= 0:
            raise ValueError(f"block count must be a positive integer, not {block_count!r}")
        self.block_size = block_size
        self.block_count = block_count
        self._faults = None
        #: (weak reference to a glue object, its fast path's ``take()``), which returns
        #: what it has counted so far: (reads, bytes_read, progs, bytes_progged, erases,
        #: syncs). Replaced, never changed in place: a counter may be read meanwhile.
        self._tallies: tuple = ()
        #: who to tell when a fault plan is attached or detached (weak references to
        #: objects with a ``faults_changed()`` method: the littlefs glue, which routes a
        #: device with a fault plan through the generic, checked path)
        self._fault_watchers: list = []
        self.reset_stats()

    # -- geometry --------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Capacity in bytes."""
        return self.block_size * self.block_count

    # -- the protocol ----------------------------------------------------------------

    def read(self, block: int, off: int, size: int) -> bytes:
        """Return exactly ``size`` bytes from ``block`` starting at ``off``."""
        if not (0 <= block < self.block_count and 0 <= off and 0 <= size
                and off + size <= self.block_size):
            raise self._out_of_range("read", block, off, size)
        self._reads += 1
        self._bytes_read += size
        if self._faults is not None:
            return self._faults.read(self, block, off, size)
        return self._read_block(block, off, size)

    def prog(self, block: int, off: int, data: bytes) -> None:
        """Write ``data`` into ``block`` at ``off`` (the region should be erased)."""
        size = len(data)
        if not (0 <= block < self.block_count and 0 <= off and off + size <= self.block_size):
            raise self._out_of_range("prog", block, off, size)
        self._progs += 1
        self._bytes_progged += size
        if self._faults is not None:
            self._faults.prog(self, block, off, data)
        else:
            self._prog_block(block, off, data)

    def erase(self, block: int) -> None:
        """Reset every byte of ``block`` to :attr:`erase_value`."""
        if not 0 <= block < self.block_count:
            raise self._out_of_range("erase", block, 0, self.block_size)
        self._erases += 1
        self.erase_counts[block] += 1
        if self._faults is not None:
            self._faults.erase(self, block)
        else:
            self._erase_block(block)

    def sync(self) -> None:
        """Make every completed prog and erase durable."""
        self._syncs += 1
        if self._faults is not None:
            self._faults.sync(self)
        else:
            self._sync()

    # -- fault injection -------------------------------------------------------------

    @property
    def faults(self):
        """The attached :class:`~ipuos.blockdev.FaultPlan`, or None for a healthy device."""
        return self._faults

    @faults.setter
    def faults(self, plan) -> None:
        self._faults = plan
        watchers = self._fault_watchers
        for ref in list(watchers):
            watcher = ref()
            if watcher is None:
                watchers.remove(ref)
            else:
                watcher.faults_changed()

    def _watch_faults(self, watcher) -> None:
        """Call ``watcher.faults_changed()`` whenever :attr:`faults` changes (weakly held)."""
        watchers = self._fault_watchers
        watchers[:] = [ref for ref in watchers if ref() is not None]  # (stays short)
        watchers.append(weakref.ref(watcher))

    def attach_faults(self, plan):
        """Route every operation through ``plan`` (a :class:`~ipuos.blockdev.FaultPlan`).

        Returns the plan, so ``plan = dev.attach_faults(FaultPlan(...))`` reads well.
        """
        plan._bind(self)
        self.faults = plan
        return plan

    def detach_faults(self) -> None:
        """Make the device healthy again (bytes a power cut left behind stay as they are)."""
        self.faults = None

    # -- whole-device access ---------------------------------------------------------

    def snapshot(self) -> bytes:
        """Every byte of the medium, as it would survive a power cut.

        Bypasses counters and faults: this is the view from outside the device (a backup,
        or a test looking at what is really stored), not a request to it.
        """
        bs = self.block_size
        return b"".join(self._read_block(b, 0, bs) for b in range(self.block_count))

    def restore(self, image: bytes) -> None:
        """Overwrite the whole medium with ``image`` (exactly :attr:`size` bytes)."""
        image = memoryview(image).cast("B")
        if len(image) != self.size:
            raise ValueError(
                f"image is {len(image)} bytes but the device holds {self.size} "
                f"({self.block_count} blocks of {self.block_size})"
            )
        bs = self.block_size
        for b in range(self.block_count):
            self._prog_block(b, 0, image[b * bs : (b + 1) * bs].tobytes())

    # -- counters ----------------------------------------------------------------------

    def stats(self) -> dict:
        """Operation counters, for benchmarks and ``top``-like displays."""
        return {
            "reads": self.reads,
            "progs": self.progs,
            "erases": self.erases,
            "syncs": self.syncs,
            "bytes_read": self.bytes_read,
            "bytes_progged": self.bytes_progged,
            "max_block_erases": max(self.erase_counts),
        }

    def reset_stats(self) -> None:
        self._reads = self._progs = self._erases = self._syncs = 0
        self._bytes_read = self._bytes_progged = 0
        if self._tallies:
            for name in _TALLIED:
                setattr(self, name, 0)  # offsets what the fast paths counted so far
        self.erase_counts = [0] * self.block_count

    def _add_tally(self, take, owner) -> None:
        """Count what ``take()`` reports (see ``_tallies``) as this device's requests for
        as long as ``owner`` (the glue object whose fast path counts) lives; when it
        goes, its counts become the device's own."""
        # The counts of glues that have gone are folded into the device's own here,
        # rather than by a callback when they go: a callback held by the device would
        # tie the two into a reference cycle (see the littlefs glue).
        live = []
        for entry in self._tallies:
            if entry[0]() is not None:
                live.append(entry)
            else:
                for name, count in zip(_TALLIED, entry[1]()):
                    setattr(self, "_" + name, getattr(self, "_" + name) + count)
        live.append((weakref.ref(owner), take))
        self._tallies = tuple(live)

    # -- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Release host resources (file descriptors, views). The base device has none."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.block_count} x {self.block_size} B>"

    # -- primitives for subclasses -------------------------------------------------------

    def _read_block(self, block: int, off: int, size: int) -> bytes:
        raise NotImplementedError

    def _prog_block(self, block: int, off: int, data: bytes) -> None:
        raise NotImplementedError

    def _erase_block(self, block: int) -> None:
        raise NotImplementedError

    def _sync(self) -> None:
        pass

    # -- helpers -------------------------------------------------------------------------

    def _out_of_range(self, op: str, block: int, off: int, size: int) -> ValueError:
        return ValueError(
            f"{self!r}: {op} of {size} bytes at block {block} offset {off} is outside the "
            f"device ({self.block_count} blocks of {self.block_size} bytes)"
        )


def device_error(message: str) -> OSError:
    """The exception a device raises when the medium fails: ``OSError(EIO)``."""
    return OSError(errno.EIO, message)
