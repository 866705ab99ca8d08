"""Frames and requests on a socketpair: layout, limits, versions, malformed input."""

from __future__ import annotations

import json
import socket
import struct

import pytest

from ipuos._protocol import (
    BAD_FRAME,
    BAD_JSON,
    BAD_REQUEST,
    BAD_VERSION,
    INLINE_RESULT_LIMIT,
    MAGIC,
    PREFIX,
    REQUEST_LIMITS,
    TOO_LARGE,
    VERSION,
    Frame,
    FrameReader,
    Limits,
    ProtocolError,
    encode_frame,
    parse_request,
    reply_result,
    request_frame,
    result_frame,
)


@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield a, b
    a.close()
    b.close()


def read_all(reader: FrameReader, count: int = 1):
    frames = []
    for _ in range(200):
        frame = reader.poll(0.05)
        if frame is not None:
            frames.append(frame)
            if len(frames) == count:
                return frames
    raise AssertionError(f"got {len(frames)} of {count} frames")


def test_frame_layout_is_the_documented_one():
    frame = encode_frame({"id": 1}, b"\x00\x01")
    header = b'{"id":1}'
    assert frame == MAGIC + bytes([VERSION, 0]) + struct.pack("!II", len(header), 2) + header + b"\x00\x01"
    assert PREFIX.size == 12


def test_frames_survive_arbitrary_fragmentation(pair):
    a, b = pair
    wire = request_frame(1, "run", {"tiles": "0-3"}, b"print(1)\n" * 1000) + request_frame(2, "ps")
    reader = FrameReader(b, REQUEST_LIMITS)
    frames = []
    for i in range(0, len(wire), 7):  # tiny pieces, each polled separately
        a.sendall(wire[i : i + 7])
        frame = reader.poll(0.5)
        if frame is not None:
            frames.append(frame)
    frames += read_all(reader, 2 - len(frames)) if len(frames) < 2 else []
    first, second = (parse_request(f) for f in frames)
    assert (first.id, first.cmd, first.args, first.payload) == (1, "run", {"tiles": "0-3"}, b"print(1)\n" * 1000)
    assert (second.id, second.cmd) == (2, "ps")
    assert not reader.partial


def test_bad_magic_is_fatal(pair):
    a, b = pair
    a.sendall(b"GET / HTTP/1.1\r\n\r\n")
    with pytest.raises(ProtocolError) as err:
        FrameReader(b, REQUEST_LIMITS).poll(1)
    assert err.value.code == BAD_FRAME and err.value.fatal


@pytest.mark.parametrize("header_len, payload_len", [(64 * 1024 + 1, 0), (10, 64 * 1024 * 1024 + 1), (2**32 - 1, 2**32 - 1)])
def test_oversized_lengths_are_refused_before_reading_the_body(pair, header_len, payload_len):
    a, b = pair
    a.sendall(PREFIX.pack(MAGIC, VERSION, 0, header_len, payload_len))  # and nothing else
    with pytest.raises(ProtocolError) as err:
        FrameReader(b, REQUEST_LIMITS).poll(1)
    assert err.value.code == TOO_LARGE and err.value.fatal
    assert "limit" in err.value.message


def test_unknown_version_consumes_the_frame_and_the_next_one_parses(pair):
    a, b = pair
    a.sendall(encode_frame({"whatever": True}, b"xyz", version=9) + request_frame(5, "status"))
    reader = FrameReader(b, REQUEST_LIMITS)
    with pytest.raises(ProtocolError) as err:
        read_all(reader)
    assert err.value.code == BAD_VERSION and not err.value.fatal
    assert err.value.details["supported"] == [2]
    assert parse_request(read_all(reader)[0]).id == 5


def test_undefined_flags_are_refused(pair):
    a, b = pair
    a.sendall(encode_frame({"id": 1, "cmd": "ps"}, flags=0x80))
    with pytest.raises(ProtocolError) as err:
        FrameReader(b, REQUEST_LIMITS).poll(1)
    assert err.value.code == BAD_FRAME


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe", b"[1, 2]", b'"text"'])
def test_bad_json_headers_are_not_fatal(pair, raw):
    a, b = pair
    a.sendall(PREFIX.pack(MAGIC, VERSION, 0, len(raw), 0) + raw + request_frame(2, "ps"))
    reader = FrameReader(b, REQUEST_LIMITS)
    with pytest.raises(ProtocolError) as err:
        read_all(reader)
    assert err.value.code == BAD_JSON and not err.value.fatal
    assert parse_request(read_all(reader)[0]).cmd == "ps"


def test_end_of_stream_inside_a_frame(pair):
    a, b = pair
    a.sendall(request_frame(1, "ps")[:-3])
    a.shutdown(socket.SHUT_WR)
    reader = FrameReader(b, REQUEST_LIMITS)
    with pytest.raises(ConnectionError):
        for _ in range(20):
            reader.poll(0.1)


def test_clean_end_of_stream(pair):
    a, b = pair
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(EOFError):
        FrameReader(b, REQUEST_LIMITS).poll(1)


@pytest.mark.parametrize("header, message", [
    ({"cmd": "ps"}, "integer 'id'"),
    ({"id": True, "cmd": "ps"}, "integer 'id'"),
    ({"id": -1, "cmd": "ps"}, "integer 'id'"),
    ({"id": 2**60, "cmd": "ps"}, "integer 'id'"),
    ({"id": "7", "cmd": "ps"}, "integer 'id'"),
    ({"id": 1}, "command name"),
    ({"id": 1, "cmd": 5}, "command name"),
    ({"id": 1, "cmd": "x" * 65}, "command name"),
    ({"id": 1, "cmd": "ps", "args": [1]}, "'args' must be a JSON object"),
    ({"id": 1, "cmd": "ps", "timeout": -1}, "'timeout'"),
    ({"id": 1, "cmd": "ps", "timeout": "soon"}, "'timeout'"),
])
def test_request_shapes_are_checked(header, message):
    with pytest.raises(ProtocolError) as err:
        parse_request(Frame(1, header))
    assert err.value.code == BAD_REQUEST and message in err.value.message
    assert not err.value.fatal


def test_big_results_travel_in_the_payload():
    big = {"tiles": ["x" * 100] * (INLINE_RESULT_LIMIT // 50)}
    wire = result_frame(3, big)
    _, _, _, header_len, payload_len = PREFIX.unpack(wire[:12])
    header = json.loads(wire[12 : 12 + header_len])
    assert header == {"id": 3, "type": "result", "result_in_payload": True}
    frame = Frame(1, header, wire[12 + header_len :])
    assert reply_result(frame) == big and payload_len > INLINE_RESULT_LIMIT
    assert reply_result(Frame(1, {"id": 1, "type": "result", "result": [1]})) == [1]


def test_limits_apply_per_side(pair):
    a, b = pair
    a.sendall(encode_frame({"id": 1}, b"x" * 200))
    with pytest.raises(ProtocolError):
        FrameReader(b, Limits(max_header=1024, max_payload=100)).poll(1)
