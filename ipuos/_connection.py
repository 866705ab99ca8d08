"""One client connection to the daemon: read frames, dispatch requests, enforce limits.

Each connection has one reader thread (this class's :meth:`serve`) and one thread per
request in flight, so a long ``run`` does not stop the same client from cancelling it.
Everything a client can make the daemon hold is bounded:

- a frame must arrive whole within ``frame_seconds`` of its first byte;
- a connection with no request in flight is closed ``idle_seconds`` after its last request
  or reply;
- at most ``max_in_flight`` requests per connection; handler threads are counted
  daemon-wide by the daemon's semaphore, and a call past its deadline gets a ``timeout``
  error at once (its handler may still be blocked inside the machine, e.g. behind a tile
  computing without a budget, and keeps its slot until it returns);
- a reply must be taken by the client within ``send_seconds``, or the connection is dropped.

A protocol error gets an error reply; if the stream is no longer in step (bad magic, an
oversized length) the connection is closed after the reply. Either way the daemon goes on.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
import traceback
from dataclasses import dataclass

from ._affinity import pin_thread
from ._commands import COMMANDS, Call, CommandError, Reply, busy_why
from ._host import MachineHost
from ._protocol import (
    BAD_REQUEST,
    BUSY,
    INTERNAL,
    REQUEST_LIMITS,
    TIMEOUT,
    UNKNOWN_COMMAND,
    FrameReader,
    FrameBudget,
    ProtocolError,
    error_frame,
    event_frame,
    parse_request,
    result_frame,
)

#: how often the reader wakes to check deadlines and shutdown
TICK_SECONDS = 0.25


class HandlerSlots:
    """How many handler threads the daemon runs at once: ``ordinary`` for any request,
    and ``reserved`` more for the urgent commands (``kill``, ``status``, ``ps``, ``halt``).

    A handler blocked inside a held machine (a tile computing without an exchange point)
    keeps its slot until the machine answers, even after its client has gone: requests
    enough (a few clients' worth) took every slot, and then ``kill``, the way to free
    the machine, was refused as busy too."""

    def __init__(self, ordinary: int, reserved: int = 0):
        self._ordinary = threading.BoundedSemaphore(ordinary)
        self._reserved = threading.BoundedSemaphore(reserved) if reserved else None

    def take(self, urgent: bool = False) -> threading.BoundedSemaphore | None:
        """A slot (release it when the handler ends), or None if none is free."""
        if self._ordinary.acquire(blocking=False):
            return self._ordinary
        if urgent and self._reserved is not None and self._reserved.acquire(blocking=False):
            return self._reserved
        return None


@dataclass(frozen=True)
class ConnectionPolicy:
    """How long and how much one client may hold the daemon."""

    frame_seconds: float = 30.0
    idle_seconds: float = 60.0
    send_seconds: float = 30.0
    max_in_flight: int = 8

#: requests with a payload this big have their garbage collected once answered (see
#: Collector.large_request_done)
LARGE_PAYLOAD = 1 << 20
#: how long a look at the machine may take before a timed-out request blames a tile
#: computing without reaching an exchange point (a tile merely computing does not hold it)
HELD_SECONDS = 0.25

log = logging.getLogger("ipuos.daemon")


class Connection:
    def __init__(self, sock: socket.socket, host: MachineHost, peer_pid: int | None,
                 handler_slots: HandlerSlots, stopping: threading.Event,
                 policy: ConnectionPolicy = ConnectionPolicy(), frame_budget: FrameBudget | None = None):
        self.policy = policy
        self.sock = sock
        self.host = host
        self.peer_pid = peer_pid
        self.handler_slots = handler_slots
        self.stopping = stopping
        self.frame_budget = frame_budget
        self._send_lock = threading.Lock()
        #: request id -> (call, deadline or None); guarded by _send_lock
        self._in_flight: dict[int, tuple[Call, float | None]] = {}
        self._broken = False
        #: the stream broke: read what the client still sends before closing (see linger_close)
        self._lingering = False
        self.last_activity = time.monotonic()
        #: a frame has begun arriving and not ended (see idle_for)
        self._mid_frame = False
        #: whether the client has sent any frame yet
        self.has_sent = False
        sock.settimeout(policy.send_seconds)

    # -- the reader ------------------------------------------------------------------------

    def serve(self) -> None:
        pin_thread()  # this client's requests hand off to the scheduler: see ipuos._affinity
        reader = FrameReader(self.sock, REQUEST_LIMITS, self.frame_budget)
        try:
            while not self._broken:
                if self.stopping.is_set() and not self._in_flight:
                    break
                try:
                    frame = reader.poll(self._tick())
                except ProtocolError as exc:
                    self._send(error_frame(exc.request_id, exc.code, exc.message, **exc.details))
                    log.info("client pid %s: %s", self.peer_pid, exc.message)
                    if exc.fatal:
                        self._lingering = True
                        break
                    continue
                except EOFError:
                    self._answer_after_end_of_input()
                    break
                except (ConnectionError, OSError):
                    break
                now = time.monotonic()
                self._mid_frame = reader.partial
                self._expire_calls(now)
                if frame is not None:
                    self.last_activity = now
                    self.has_sent = True
                    try:
                        self._dispatch(frame)
                    except Exception as exc:  # a bug; this client and the daemon go on
                        log.error("dispatching a request failed:\n%s", traceback.format_exc())
                        self._send(error_frame(None, INTERNAL, f"the daemon could not take a request: "
                                               f"{type(exc).__name__}: {exc} (details in {self.host.paths.log})"))
                    continue
                policy = self.policy
                if reader.partial and now - reader.started > policy.frame_seconds:
                    self._send(error_frame(None, TIMEOUT, f"a frame did not arrive whole within "
                                           f"{policy.frame_seconds:g} s; closing the connection"))
                    break
                if not reader.partial and not self._in_flight and now - self.last_activity > policy.idle_seconds:
                    self._send(error_frame(None, TIMEOUT, f"closing a connection idle for {policy.idle_seconds:g} s"))
                    break
        finally:
            reader.close()  # (a frame cut short gives its room back)
            self.close()

    def _answer_after_end_of_input(self) -> None:
        """The client will send nothing more, but it may still be reading: one that
        half-closes (``shutdown(SHUT_WR)``, as ``nc -N`` does) waits for its replies. So the
        calls in flight finish and are answered (or time out); a hang-up (the client closed
        its end: POLLHUP) cancels them, as any disconnect does."""
        while not self._broken:
            with self._send_lock:
                if not self._in_flight:
                    return
            if _hung_up(self.sock, self._tick()):
                return
            self._expire_calls(time.monotonic())

    def _tick(self) -> float:
        with self._send_lock:
            deadlines = [d for _, d in self._in_flight.values() if d is not None]
        if not deadlines:
            return TICK_SECONDS
        return max(0.0, min(TICK_SECONDS, min(deadlines) - time.monotonic()))

    def _dispatch(self, frame) -> None:
        try:
            request = parse_request(frame)
        except ProtocolError as exc:
            self._send(error_frame(exc.request_id, exc.code, exc.message))
            return
        if request.id in self._in_flight:
            # (sent without the id: the client waits on that id for the call's own end)
            self._send(error_frame(None, BAD_REQUEST, f"request id {request.id} is already in flight; "
                                   "give each request an id of its own"))
            return
        if request.cmd == "cancel":
            self._cancel_request(request)
            return
        command = COMMANDS.get(request.cmd)
        if command is None:
            names = ", ".join(sorted(COMMANDS) + ["cancel"])
            self._send(error_frame(request.id, UNKNOWN_COMMAND,
                                   f"unknown command {request.cmd!r}; this daemon knows {names}"))
            return
        try:
            args = command.check_args(request.args)
        except CommandError as exc:
            self._send(error_frame(request.id, exc.code, exc.message))
            return
        if len(self._in_flight) >= self.policy.max_in_flight:
            self._send(error_frame(request.id, BUSY, f"at most {self.policy.max_in_flight} requests may be in flight "
                                   "on one connection; wait for a reply"))
            return
        if self.stopping.is_set():
            self._send(error_frame(request.id, BUSY, f"machine {self.host.name!r} is halting", halting=True))
            return
        seconds = command.deadline_seconds(request.timeout)
        deadline = None if seconds is None else time.monotonic() + seconds
        slot = self.handler_slots.take(command.urgent)
        if slot is None:
            self._send(error_frame(request.id, BUSY, "the daemon is serving too many requests; try again"))
            return
        call = Call(request, args, self.host, self.peer_pid, lambda event: self._emit(call, event))
        with self._send_lock:
            self._in_flight[request.id] = (call, deadline)
        thread = threading.Thread(target=self._run_call, args=(call, command, slot), daemon=True,
                                  name=f"ipuos-{command.name}-{request.id}")
        try:
            thread.start()
        except RuntimeError:  # out of threads
            slot.release()
            self._finish(call, error_frame(request.id, BUSY, "the daemon cannot start another thread"))

    def _cancel_request(self, request) -> None:
        target = request.args.get("id")
        with self._send_lock:
            entry = self._in_flight.get(target) if isinstance(target, int) else None
        if entry is not None:
            entry[0].cancel()
        self._send(result_frame(request.id, {"cancelled": entry is not None}))

    def _expire_calls(self, now: float) -> None:
        with self._send_lock:
            calls = list(self._in_flight.items())
        for request_id, (call, deadline) in calls:
            if deadline is not None and now >= deadline:
                seconds = COMMANDS[call.request.cmd].deadline_seconds(call.request.timeout)
                # (the machine answers a look within a moment unless a computing tile holds it)
                held = self.host.look("stats", HELD_SECONDS)[1] is not None
                why = (busy_why(self.host) if held else
                       "the machine is not held by a computing tile: the request needed longer than its timeout")
                self._finish(call, error_frame(
                    request_id, TIMEOUT,
                    f"machine {self.host.name!r} did not answer {call.request.cmd!r} within {seconds:g} s; {why}",
                ))
                call.cancel(abandon=True)  # (the client has its answer, and waits no more)

    # -- handlers --------------------------------------------------------------------------

    def _run_call(self, call: Call, command, slot: threading.BoundedSemaphore) -> None:
        request_id = call.request.id
        try:
            value = command.handler(call)
            if isinstance(value, Reply):
                frame = result_frame(request_id, value.result, value.payload)
            else:
                frame = result_frame(request_id, value)
        except CommandError as exc:
            frame = error_frame(request_id, exc.code, exc.message, **exc.details)
        except Exception as exc:
            log.error("command %r failed:\n%s", command.name, traceback.format_exc())
            frame = error_frame(request_id, INTERNAL, f"{command.name} failed inside the daemon: "
                                f"{type(exc).__name__}: {exc} (details in {self.host.paths.log})")
        finally:
            slot.release()
        self._finish(call, frame)
        try:  # (the client has its reply: nothing depends on this, a failure is only logged)
            if len(call.request.payload) >= LARGE_PAYLOAD:
                self.host.collector.large_request_done()
            self.host.collector.collect_if_due()
        except Exception:
            log.exception("collecting garbage after the reply to %r failed", command.name)

    def _current(self, call: Call) -> bool:
        """``call`` has not ended. (Its id alone does not say so: once a call has timed
        out, the client may use its id again while the old handler still runs.) Caller
        holds ``_send_lock``."""
        entry = self._in_flight.get(call.request.id)
        return entry is not None and entry[0] is call

    def _emit(self, call: Call, event: dict) -> None:
        with self._send_lock:
            if self._current(call):
                self._send_locked(event_frame(call.request.id, event))

    def _finish(self, call: Call, frame: bytes) -> None:
        """Send a call's last frame, unless it already ended (timed out) meanwhile."""
        with self._send_lock:
            if self._current(call):
                del self._in_flight[call.request.id]
                # the client has been waiting on this: its silence so far was not idleness
                self.last_activity = time.monotonic()
                self._send_locked(frame)

    # -- sending and closing ---------------------------------------------------------------

    def _send(self, frame: bytes) -> None:
        with self._send_lock:
            self._send_locked(frame)

    def _send_locked(self, frame: bytes) -> None:
        if self._broken:
            return
        try:
            self.sock.sendall(frame)
        except OSError as exc:  # gone, or not reading its replies
            log.info("client pid %s: dropped (%s)", self.peer_pid, exc)
            self._broken = True
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Give up whatever the client still waits for (it is gone: nobody waits for it
        any more) and close."""
        with self._send_lock:
            self._broken = True
            calls = [call for call, _ in self._in_flight.values()]
            self._in_flight.clear()
        for call in calls:
            call.cancel(abandon=True)
        if self._lingering:
            linger_close(self.sock, seconds=1.0)
        else:
            try:
                self.sock.close()
            except OSError:
                pass

    def idle_for(self, now: float) -> float | None:
        """Seconds since the client last sent a request or was answered, if it has none
        in flight and is not sending one; else None. Read without the send lock, which a
        sender stuck on a client that does not read holds for up to ``send_seconds``
        (a moment's stale answer only picks another connection to close)."""
        if self._in_flight or self._mid_frame or self._broken:
            return None
        return now - self.last_activity

    def evict(self, why: str) -> None:
        """From another thread: tell the client why, if that can be done at once, and
        make the reader stop now (the daemon needs its place for another client)."""
        if self._send_lock.acquire(blocking=False):
            try:
                if not self._broken:
                    self.sock.send(error_frame(None, BUSY, why), socket.MSG_DONTWAIT)
            except OSError:
                pass  # (its buffer is full, or it has gone: closing is what matters)
            finally:
                self._send_lock.release()
        self.abort()

    def abort(self) -> None:
        """From another thread at shutdown: make the reader stop now."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _hung_up(sock: socket.socket, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for the peer to close its end of ``sock`` entirely."""
    poller = select.poll()
    poller.register(sock, select.POLLHUP | select.POLLERR)
    return bool(poller.poll(timeout * 1000))


def linger_close(sock: socket.socket, seconds: float, max_bytes: int = 1024 * 1024) -> None:
    """Close after an error reply without destroying it.

    Closing a Unix socket that still has unread input resets the connection, and the
    client loses the reply it has not read yet. So: end our side, then read and drop
    what the client still sends, for a bounded time and amount, then close.
    """
    try:
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + seconds
        dropped = 0
        while dropped < max_bytes:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            sock.settimeout(remaining)
            chunk = sock.recv(65536)
            if not chunk:
                break
            dropped += len(chunk)
    except OSError:
        pass
    finally:
        sock.close()
