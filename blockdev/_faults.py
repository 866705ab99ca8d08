"""Scripted device faults: power cuts, torn writes, devices that stop answering, liars.

A :class:`FaultPlan` attached to any :class:`~ipuos.blockdev.BlockDevice` sees every
operation before the medium does and decides what happens. It exists to prove that the
filesystem layer survives what real storage does, the way littlefs' own emulated block
device does for its test suite:

* **power cut** after ``k`` writes (progs and erases counted together): write ``k`` is not
  applied, or with ``torn=True`` only a prefix of it is; from then on every operation
  raises :class:`PowerLost`. The device's bytes are then what survived the cut.
* **stop answering** after ``n`` operations of any kind: every later one raises
  :class:`DeviceUnresponsive` (how a striped device sees a backing tile that died).
* **lose writes**: progs and erases are acknowledged and visible to later reads, but kept
  in a volatile overlay that never reaches the medium, like a disk whose write cache lies
  about ``sync``. A correct power-loss checker must catch this device; that is its use.
"""

from __future__ import annotations

import errno

__all__ = ["FaultPlan", "PowerLost", "DeviceUnresponsive"]


class PowerLost(OSError):
    """The device lost power: the interrupted write and every later operation fail (EIO)."""

    def __init__(self, message: str = "power lost"):
        super().__init__(errno.EIO, message)


class DeviceUnresponsive(OSError):
    """The device stopped answering (EIO): a dead backing tile, a pulled cable."""

    def __init__(self, message: str = "device stopped answering"):
        super().__init__(errno.EIO, message)


class FaultPlan:
    """What goes wrong on one device, and when. Attach with ``device.attach_faults(plan)``.

    ``cut_power_after``: writes (progs + erases) that complete before power is cut; the
    next write is the interrupted one. ``torn``: the interrupted write applies its first
    ``torn_fraction`` of bytes (an erase resets that fraction of the block).
    ``stop_after``: operations of any kind that are answered before the device goes quiet.
    ``lose_writes``: acknowledge writes without applying them to the medium.

    Counters: ``writes`` and ``operations`` seen so far (the failing one included);
    ``power_lost`` and ``stopped`` say whether the plan has fired.
    """

    def __init__(self, *, cut_power_after: int | None = None, torn: bool = False,
                 torn_fraction: float = 0.5, stop_after: int | None = None,
                 lose_writes: bool = False):
        if cut_power_after is not None and cut_power_after < 0:
            raise ValueError("cut_power_after cannot be negative")
        if stop_after is not None and stop_after < 0:
            raise ValueError("stop_after cannot be negative")
        if not 0.0 <= torn_fraction <= 1.0:
            raise ValueError("torn_fraction must be between 0 and 1")
        self.cut_power_after = cut_power_after
        self.torn = torn
        self.torn_fraction = torn_fraction
        self.stop_after = stop_after
        self.lose_writes = lose_writes
        self.writes = 0
        self.operations = 0
        self.power_lost = False
        self.stopped = False
        #: what was interrupted, for messages: e.g. "prog of 16 bytes at block 3 offset 32"
        self.cut_during: str | None = None
        self._device = None
        self._overlay: dict[int, bytearray] = {}  # block -> contents, when losing writes

    def __repr__(self) -> str:
        fields = []
        if self.cut_power_after is not None:
            fields.append(f"cut_power_after={self.cut_power_after}")
            if self.torn:
                fields.append(f"torn={self.torn_fraction}")
        if self.stop_after is not None:
            fields.append(f"stop_after={self.stop_after}")
        if self.lose_writes:
            fields.append("lose_writes")
        return f"FaultPlan({', '.join(fields)})"

    def _bind(self, device) -> None:
        if self._device is not None and self._device is not device:
            raise ValueError(f"{self!r} is already attached to {self._device!r}")
        self._device = device

    # -- the hooks BlockDevice calls ---------------------------------------------------

    def read(self, device, block: int, off: int, size: int) -> bytes:
        self._answer("read")
        cached = self._overlay.get(block)
        if cached is not None:
            return bytes(cached[off : off + size])
        return device._read_block(block, off, size)

    def prog(self, device, block: int, off: int, data: bytes) -> None:
        self._answer("prog")
        what = f"prog of {len(data)} bytes at block {block} offset {off}"
        if self._cut_now(what):
            if self.torn and not self.lose_writes:
                device._prog_block(block, off, bytes(data[: int(len(data) * self.torn_fraction)]))
            raise PowerLost(f"power cut during write #{self.writes - 1} ({what})")
        if self.lose_writes:
            self._cached_block(device, block)[off : off + len(data)] = data
        else:
            device._prog_block(block, off, data)

    def erase(self, device, block: int) -> None:
        self._answer("erase")
        what = f"erase of block {block}"
        if self._cut_now(what):
            if self.torn and not self.lose_writes:
                count = int(device.block_size * self.torn_fraction)
                device._prog_block(block, 0, bytes([device.erase_value]) * count)
            raise PowerLost(f"power cut during write #{self.writes - 1} ({what})")
        if self.lose_writes:
            self._overlay[block] = bytearray([device.erase_value]) * device.block_size
        else:
            device._erase_block(block)

    def sync(self, device) -> None:
        self._answer("sync")
        if not self.lose_writes:  # a lying device acknowledges sync and does nothing
            device._sync()

    # -- internals -----------------------------------------------------------------------

    def _answer(self, op: str) -> None:
        """Fail the operation if the device is dead or powered off; count it otherwise."""
        if self.power_lost:
            raise PowerLost(f"{op} after the power was cut (during {self.cut_during})")
        if self.stopped or (self.stop_after is not None and self.operations >= self.stop_after):
            self.stopped = True
            raise DeviceUnresponsive(
                f"{op}: device stopped answering after {self.stop_after} operations"
            )
        self.operations += 1

    def _cut_now(self, what: str) -> bool:
        index = self.writes
        self.writes += 1
        if self.cut_power_after is not None and index >= self.cut_power_after:
            self.power_lost = True
            self.cut_during = what
            self._overlay.clear()  # a volatile cache dies with the power
            return True
        return False

    def _cached_block(self, device, block: int) -> bytearray:
        cached = self._overlay.get(block)
        if cached is None:
            cached = self._overlay[block] = bytearray(device._read_block(block, 0, device.block_size))
        return cached
