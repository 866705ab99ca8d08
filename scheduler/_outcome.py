"""How a job's tiles ended, and what the job measured: what a finished run reports.

Kept apart from :mod:`._job` so that a client (the CLI reading a daemon's reply into a
RunResult) has them without the scheduler's machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# how a tile's part of a job ended
OK = "ok"
ERROR = "error"  # the program raised (its own exception, a deadlock, a mismatch ...)
ABORTED = "aborted"  # stopped because another tile of the job failed
INTERRUPTED = "interrupted"  # Ctrl-C, kill, or a compute budget


@dataclass
class JobStats:
    supersteps: int = 0
    wall_seconds: float = 0.0
    sim_seconds: float = 0.0
    bytes_exchanged: int = 0
    #: program messages sent that no tile received: to a tile that had finished, into a
    #: full buffer, or left unreceived as their receiver ended
    dropped_messages: int = 0
    #: per tile of the job, in rank order: bytes it sent and received through the exchange
    bytes_sent: list = field(default_factory=list)
    bytes_received: list = field(default_factory=list)
