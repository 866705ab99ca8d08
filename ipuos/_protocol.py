"""The wire protocol between ipuos clients and a machine daemon.

Every message, in both directions, is one frame::

    offset  size  field
    0       2     magic b"iP"
    2       1     protocol version (1)
    3       1     flags (must be 0 in version 1)
    4       4     header length H, big-endian
    8       4     payload length P, big-endian
    12      H     header: a JSON object, UTF-8
    12+H    P     payload: raw bytes (program text, data files; later disk images)

The 12-byte prefix keeps this layout in every version, so a daemon can skip a frame of a
version it does not speak and answer it with an error naming the versions it does. The
version is checked on every frame, not once per connection.

Requests carry ``{"id": int, "cmd": str, "args": {...}, "timeout": seconds?}``. Replies
carry the request's id and a ``type``: any number of ``"event"`` frames (progress, a job
that started), then exactly one ``"result"`` or ``"error"``. Errors are
``{"code": ..., "message": ...}``; the message is meant for the user as is. A result too
big for a header travels as JSON in the payload (``"result_in_payload": true``). Results,
events and errors are JSON objects: a client takes anything else for a bad reply, as it
does one lacking a field it reads or holding one of the wrong type (``ipuos._replies``).

A request ``{"cmd": "cancel", "args": {"id": N}}`` cancels request N on the same
connection (Ctrl-C in the client interrupts the job the request started).

The header and payload sizes are capped before anything is read (a daemon accepts far
less than a client does), so a length field cannot make either side allocate gigabytes.
"""

from __future__ import annotations

import json
import math
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

MAGIC = b"iP"
#: 2: status and hello count tiles and jobs as ntiles/njobs (see the --json vocabulary)
VERSION = 2
SUPPORTED_VERSIONS = (2,)
PREFIX = struct.Struct("!2sBBII")

#: request ids are JSON numbers: keep them exact in every JSON implementation
MAX_REQUEST_ID = 2**53 - 1
MAX_COMMAND_NAME = 64
#: the longest a request may ask to wait: a year (past that, a deadline is no deadline)
MAX_TIMEOUT_SECONDS = 365 * 24 * 3600
#: results larger than this encoded move from the header to the payload
INLINE_RESULT_LIMIT = 256 * 1024

# error codes (the message says the rest)
BAD_FRAME = "bad_frame"
TOO_LARGE = "too_large"
BAD_VERSION = "bad_version"
BAD_JSON = "bad_json"
BAD_REQUEST = "bad_request"
UNKNOWN_COMMAND = "unknown_command"
BUSY = "busy"  # (with "halting": true when the machine is halting, not just full)
TIMEOUT = "timeout"
PERMISSION_DENIED = "permission_denied"
NOT_AVAILABLE = "not_available"
INTERNAL = "internal"

# Before there is a socket, a daemon that cannot start says why to the client booting it
# as its exit status and one stderr line beginning with ERROR_PREFIX.
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_ALREADY_RUNNING = 3
ERROR_PREFIX = "ipuos daemon: error: "


@dataclass(frozen=True)
class Limits:
    """The most one side accepts in one frame."""

    max_header: int
    max_payload: int


#: what a daemon accepts from a client: small headers, programs and data files
REQUEST_LIMITS = Limits(max_header=64 * 1024, max_payload=64 * 1024 * 1024)
#: what a client accepts from its daemon: run results of every tile, snapshots of 47,104 tiles
REPLY_LIMITS = Limits(max_header=16 * 1024 * 1024, max_payload=1024 * 1024 * 1024)


class ProtocolError(Exception):
    """A frame or request that breaks the protocol.

    ``fatal`` means the byte stream can no longer be trusted (bad magic, oversize): reply,
    then close the connection. Otherwise the frame was consumed whole and the connection
    can go on.
    """

    def __init__(self, code: str, message: str, *, fatal: bool = False, request_id=None, **details):
        super().__init__(message)
        self.code = code
        self.message = message
        self.fatal = fatal
        self.request_id = request_id
        self.details = details


@dataclass
class Frame:
    version: int
    header: dict
    payload: bytes = b""


@dataclass
class Request:
    id: int
    cmd: str
    args: dict = field(default_factory=dict)
    timeout: float | None = None
    payload: bytes = b""


# -- encoding ---------------------------------------------------------------------------------


def json_bytes(document) -> bytes:
    """``document`` as compact UTF-8 JSON. A str holding lone surrogates (a tile printed
    text decoded with ``surrogateescape``, say) cannot be UTF-8: those are spelled as
    ``\\udcXX`` text, so that everything else still arrives instead of nothing."""
    text = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(_visible_surrogates(document), separators=(",", ":"),
                          ensure_ascii=False).encode("utf-8")


def _visible_surrogates(value):
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_visible_surrogates(k): _visible_surrogates(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_visible_surrogates(v) for v in value]
    return value


def encode_frame(header: dict, payload: bytes = b"", version: int = VERSION, flags: int = 0) -> bytes:
    raw = json_bytes(header)
    return PREFIX.pack(MAGIC, version, flags, len(raw), len(payload)) + raw + bytes(payload)


def request_frame(request_id: int, cmd: str, args: dict | None = None, payload: bytes = b"",
                  timeout: float | None = None) -> bytes:
    header = {"id": request_id, "cmd": cmd, "args": args or {}}
    if timeout is not None:
        header["timeout"] = timeout
    return encode_frame(header, payload)


def event_frame(request_id: int, event: dict) -> bytes:
    return encode_frame({"id": request_id, "type": "event", "event": event})


def result_frame(request_id: int, result, payload: bytes = b"") -> bytes:
    header = {"id": request_id, "type": "result", "result": result}
    if not payload:
        encoded = json_bytes(result)
        if len(encoded) > INLINE_RESULT_LIMIT:
            return encode_frame({"id": request_id, "type": "result", "result_in_payload": True}, encoded)
    return encode_frame(header, payload)


def error_frame(request_id, code: str, message: str, **details) -> bytes:
    error = {"code": code, "message": message}
    error.update(details)
    return encode_frame({"id": request_id, "type": "error", "error": error})


def reply_result(frame: Frame):
    """The result of a ``"result"`` frame, wherever it travelled."""
    if frame.header.get("result_in_payload"):
        try:
            return json.loads(frame.payload)
        except (ValueError, RecursionError) as exc:
            raise ProtocolError(BAD_JSON, f"its result is not JSON: {exc}") from None
    return frame.header.get("result")


# -- decoding ---------------------------------------------------------------------------------


def parse_request(frame: Frame) -> Request:
    """Check a request header's shape; ProtocolError (not fatal) says what is wrong."""
    header = frame.header
    request_id = header.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, int) or not 0 <= request_id <= MAX_REQUEST_ID:
        raise ProtocolError(BAD_REQUEST, f"a request needs an integer 'id' from 0 to {MAX_REQUEST_ID}")
    cmd = header.get("cmd")
    if not isinstance(cmd, str) or not 0 < len(cmd) <= MAX_COMMAND_NAME:
        raise ProtocolError(BAD_REQUEST, "a request needs a command name 'cmd' (a short string)",
                            request_id=request_id)
    args = header.get("args", {})
    if not isinstance(args, dict):
        raise ProtocolError(BAD_REQUEST, "'args' must be a JSON object", request_id=request_id)
    timeout = header.get("timeout")
    if timeout is not None:
        timeout = finite_number(timeout)
        if timeout is None or not 0 < timeout <= MAX_TIMEOUT_SECONDS:
            raise ProtocolError(BAD_REQUEST, "'timeout' must be a positive number of seconds, "
                                f"at most {MAX_TIMEOUT_SECONDS:g}", request_id=request_id)
    return Request(request_id, cmd, args, timeout, frame.payload)


def finite_number(value) -> float | None:
    """A JSON number as a finite float; None if it is not one (a bool, a string, NaN, an
    infinity, or an integer too big for a float: JSON integers have no bound)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _parse_prefix(prefix: bytes, limits: Limits) -> tuple[int, int, int]:
    magic, version, flags, header_len, payload_len = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise ProtocolError(BAD_FRAME, "this is not an ipuos protocol frame (bad magic bytes)", fatal=True)
    if header_len > limits.max_header:
        raise ProtocolError(TOO_LARGE, f"a frame header of {header_len} bytes is over the "
                            f"{limits.max_header}-byte limit", fatal=True)
    if payload_len > limits.max_payload:
        raise ProtocolError(TOO_LARGE, f"a frame payload of {payload_len} bytes is over the "
                            f"{limits.max_payload}-byte limit", fatal=True)
    if version in SUPPORTED_VERSIONS and flags:
        raise ProtocolError(BAD_FRAME, f"frame flags {flags:#x} are not defined in protocol version {version}",
                            fatal=True)
    return version, header_len, payload_len


def _decode_header(raw: bytes) -> dict:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # ([[[... nested deep)
        raise ProtocolError(BAD_JSON, f"the frame header is not valid UTF-8 JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError(BAD_JSON, "the frame header must be a JSON object")
    return header


class FrameBudget:
    """Bytes of big frames being received at once, across every connection of a daemon.

    One frame may be up to the payload limit (64 MiB), and each connection may be
    receiving one: clients that announce a big frame, send most of it and stop held
    8 x 63 MiB of the daemon's memory (128 connections could hold 8 GiB). A frame of
    ``big`` bytes or more takes its size from the budget while it arrives; one that does
    not fit is refused (``busy``: the client tries again once others are done)."""

    def __init__(self, total: int, big: int = 1 << 20):
        self.total = total
        self.big = big
        self._left = total
        self._lock = threading.Lock()

    def take(self, size: int) -> bool:
        if size < self.big:
            return True
        with self._lock:
            if size > self._left:
                return False
            self._left -= size
            return True

    def give_back(self, size: int) -> None:
        if size >= self.big:
            with self._lock:
                self._left += size


class FrameReader:
    """Reassembles frames from a socket, never blocking longer than asked.

    Partial frames stay buffered between calls, so a caller can wake up regularly (to
    check a Ctrl-C flag, a shutdown, a deadline) without losing bytes. ``started`` is
    when the frame in progress began, for per-frame timeouts. ``budget``: a FrameBudget
    each frame's size is taken from while it arrives (call :meth:`close` at the end).
    """

    CHUNK = 256 * 1024

    def __init__(self, sock: socket.socket, limits: Limits, budget: FrameBudget | None = None):
        self.sock = sock
        self.limits = limits
        self._buffer = bytearray()
        self._sizes: tuple[int, int, int] | None = None
        self.started: float | None = None
        self.eof = False
        self._budget = budget
        #: bytes of the frame in progress taken from the budget
        self._taken = 0

    def close(self) -> None:
        """Give back what the frame in progress took from the budget."""
        if self._taken and self._budget is not None:
            self._budget.give_back(self._taken)
        self._taken = 0

    @property
    def partial(self) -> bool:
        return bool(self._buffer)

    def poll(self, timeout: float) -> Frame | None:
        """A complete frame, or None if none completed within ``timeout`` seconds.

        Raises EOFError at a clean end of stream, ConnectionError if the stream ends
        inside a frame, ProtocolError for a bad frame.
        """
        frame = self._take()
        if frame is not None:
            return frame
        if self.eof:
            raise EOFError
        if not _readable(self.sock, timeout):
            return None
        try:
            chunk = self.sock.recv(self.CHUNK)
        except (BlockingIOError, InterruptedError, socket.timeout):
            return None
        if not chunk:
            self.eof = True
            if self._buffer:
                raise ConnectionError("the peer closed the connection in the middle of a frame")
            raise EOFError
        if not self._buffer:
            self.started = time.monotonic()
        self._buffer += chunk
        return self._take()

    def _take(self) -> Frame | None:
        buffer = self._buffer
        if self._sizes is None:
            if len(buffer) < PREFIX.size:
                return None
            sizes = _parse_prefix(bytes(buffer[: PREFIX.size]), self.limits)
            if self._budget is not None:
                size = sizes[1] + sizes[2]
                if not self._budget.take(size):
                    raise ProtocolError(BUSY, f"the daemon is receiving {self._budget.total >> 20} MiB of "
                                        "requests from other clients already; try again shortly", fatal=True)
                self._taken = size
            self._sizes = sizes
        version, header_len, payload_len = self._sizes
        end = PREFIX.size + header_len + payload_len
        if len(buffer) < end:
            return None
        with memoryview(buffer) as view:  # one copy out, not a slice and then a copy
            raw_header = bytes(view[PREFIX.size : PREFIX.size + header_len])
            payload = bytes(view[PREFIX.size + header_len : end])
        del buffer[:end]
        self._sizes = None
        self.close()  # (received: what it took is the request's now, answered soon)
        self.started = time.monotonic() if buffer else None
        if version not in SUPPORTED_VERSIONS:
            raise ProtocolError(
                BAD_VERSION,
                f"protocol version {version} is not supported; this ipuos speaks "
                f"version {', '.join(map(str, SUPPORTED_VERSIONS))}: use client and daemon "
                "from the same ipuos release",
                supported=list(SUPPORTED_VERSIONS),
            )
        return Frame(version, _decode_header(raw_header), payload)


def _readable(sock: socket.socket, timeout: float) -> bool:
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLHUP | select.POLLERR)
    try:
        return bool(poller.poll(max(0.0, timeout) * 1000))
    except InterruptedError:
        return False
