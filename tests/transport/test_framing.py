"""The sans-I/O framer/deframer of QUIC channels (m2mwire.transport.framing)."""

from __future__ import annotations

import itertools
import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m2mwire.errors import DecodeError
from m2mwire.transport.framing import (
    CLOSE_REASON_MAX_BYTES,
    HEADER_SIZE,
    KIND_BINARY,
    KIND_CLOSE,
    KIND_TEXT,
    MAX_FRAME_LENGTH,
    CloseFrame,
    Deframer,
    ErrorCode,
    FramingError,
    encode_binary,
    encode_close,
    encode_header,
    encode_text,
)

Msg = str | bytes | CloseFrame


def frame(message: str | bytes) -> bytes:
    if isinstance(message, str):
        return encode_text(message)
    return b"".join(bytes(p) for p in encode_binary([message]))


def drain(deframer: Deframer) -> list[Msg]:
    out: list[Msg] = []
    for _ in range(10_000):  # bounded
        message = deframer.next_message()
        if message is None:
            return out
        out.append(message)
    raise AssertionError("deframer did not stop")


def test_header_layout_is_kind_then_big_endian_length() -> None:
    assert encode_header(KIND_TEXT, 5) == b"\x01\x00\x00\x00\x05"
    assert encode_text("héllo") == b"\x01\x00\x00\x00\x06" + "héllo".encode()
    assert frame(b"\x00\xff") == b"\x02\x00\x00\x00\x02\x00\xff"
    assert encode_close(1000, "bye") == b"\x03\x00\x00\x00\x05\x03\xe8bye"
    assert HEADER_SIZE == 5


def test_round_trip_of_each_kind_including_empty_messages() -> None:
    d = Deframer(1024)
    d.feed(
        frame("") + frame(b"") + frame('{"a": "ü€😀"}') + frame(b"\x00" * 100) + encode_close(4000, "done")
    )
    d.feed_eof()
    assert drain(d) == ["", b"", '{"a": "ü€😀"}', b"\x00" * 100, CloseFrame(4000, "done")]
    assert d.finished
    assert d.close_received


def test_binary_parts_are_not_joined_and_memoryviews_are_accepted() -> None:
    parts = encode_binary([b"ab", bytearray(b"cd"), memoryview(b"xefx")[1:3]])
    assert parts[0] == encode_header(KIND_BINARY, 6)
    assert len(parts) == 4
    d = Deframer(100)
    d.feed(b"".join(bytes(p) for p in parts))
    assert drain(d) == [b"abcdef"]


def test_types_returned() -> None:
    d = Deframer(100)
    d.feed(frame("t") + frame(b"b"))
    text, binary = drain(d)
    assert type(text) is str
    assert type(binary) is bytes


@settings(max_examples=150, deadline=None)
@given(
    messages=st.lists(st.one_of(st.text(max_size=300), st.binary(max_size=3000)), max_size=12),
    cuts=st.lists(st.integers(min_value=0, max_value=40_000), max_size=30),
    close=st.booleans(),
)
def test_any_split_of_the_byte_stream_gives_the_same_messages(
    messages: list[str | bytes], cuts: list[int], close: bool
) -> None:
    stream = b"".join(frame(m) for m in messages) + (encode_close(1001, "going") if close else b"")
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    d = Deframer(4096)
    got: list[Msg] = []
    for a, b in itertools.pairwise(points):
        d.feed(stream[a:b])
        got.extend(drain(d))
    d.feed_eof()
    got.extend(drain(d))
    assert got == [*messages, *([CloseFrame(1001, "going")] if close else [])]
    assert d.finished
    assert d.buffered == 0


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=1, max_size=200), cut=st.integers(min_value=1))
def test_truncated_stream_at_eof_is_a_frame_error(data: bytes, cut: int) -> None:
    stream = frame(data)
    cut = cut % (len(stream) - 1) + 1  # strictly inside the frame
    d = Deframer(1000)
    d.feed(stream[:cut])
    assert drain(d) == []
    d.feed_eof()
    with pytest.raises(FramingError) as info:
        d.next_message()
    assert info.value.code == ErrorCode.FRAME_ERROR
    assert "stream ended inside a frame" in str(info.value)
    assert not d.finished


def test_clean_eof_between_frames() -> None:
    d = Deframer(10)
    d.feed(frame("a"))
    d.feed_eof()
    assert drain(d) == ["a"]
    assert d.finished


def test_oversized_length_fails_from_the_header_before_the_body_arrives() -> None:
    d = Deframer(1000)
    d.feed(frame(b"ok"))
    d.feed(encode_header(KIND_BINARY, 1001))  # only the header: nothing of the body is buffered
    assert d.next_message() == b"ok"
    with pytest.raises(FramingError) as info:
        d.next_message()
    assert info.value.code == ErrorCode.MESSAGE_TOO_BIG
    assert "1001 bytes exceeds max_message_size (1000 bytes)" in str(info.value)
    assert isinstance(info.value, DecodeError)
    # The deframer stays failed and does not buffer what follows.
    d.feed(b"\x00" * 5000)
    assert d.buffered == 0
    with pytest.raises(FramingError):
        d.next_message()


def test_message_of_exactly_the_limit_is_accepted_and_the_limit_can_change() -> None:
    d = Deframer(1000)
    d.feed(frame(b"x" * 1000))
    assert drain(d) == [b"x" * 1000]
    d.max_message_size = 2000
    d.feed(frame("y" * 1500))
    assert drain(d) == ["y" * 1500]
    d.max_message_size = 10
    d.feed(frame("z" * 11))
    with pytest.raises(FramingError):
        d.next_message()
    with pytest.raises(ValueError):
        Deframer(-1)
    with pytest.raises(ValueError):
        Deframer(MAX_FRAME_LENGTH + 1)


@pytest.mark.parametrize("kind", [0x00, 0x04, 0x7F, 0xFF])
def test_unknown_kind_byte_is_a_frame_error(kind: int) -> None:
    d = Deframer(100)
    d.feed(frame("before") + struct.pack(">BI", kind, 1) + b"x")
    assert d.next_message() == "before"
    with pytest.raises(FramingError) as info:
        d.next_message()
    assert info.value.code == ErrorCode.FRAME_ERROR
    assert f"{kind:#04x}" in str(info.value)


@pytest.mark.parametrize("body", [b"\xff", b"\xc3", b"abc\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"])
def test_invalid_utf8_text_fails_after_earlier_messages(body: bytes) -> None:
    for prefix in (b"", b"pad" * 1000):  # fast path (one chunk) and the general path
        d = Deframer(10_000)
        d.feed(frame(b"ok") + encode_header(KIND_TEXT, len(prefix + body)) + prefix + body)
        assert d.next_message() == b"ok"
        with pytest.raises(FramingError) as info:
            d.next_message()
        assert info.value.code == ErrorCode.INVALID_UTF8


def test_invalid_utf8_split_across_chunks() -> None:
    payload = "é".encode() * 10
    bad = payload[:-1] + b"\xff"
    d = Deframer(100)
    stream = encode_header(KIND_TEXT, len(bad)) + bad
    for i in range(len(stream)):
        d.feed(stream[i : i + 1])
        if i < len(stream) - 1:
            assert d.next_message() is None
    with pytest.raises(FramingError) as info:
        d.next_message()
    assert info.value.code == ErrorCode.INVALID_UTF8


def test_close_frame_rules() -> None:
    d = Deframer(100)
    d.feed(encode_close(1000) + frame("late"))
    assert d.next_message() == CloseFrame(1000, "")
    with pytest.raises(FramingError, match="after the close frame"):
        d.next_message()

    for body in (b"\x03", b"\x03" * 126):
        d = Deframer(100)
        d.feed(encode_header(KIND_CLOSE, len(body)) + body)
        with pytest.raises(FramingError, match="close frame body"):
            d.next_message()

    d = Deframer(100)
    d.feed(encode_header(KIND_CLOSE, 3) + b"\x03\xe8\xff")
    with pytest.raises(FramingError) as info:
        d.next_message()
    assert info.value.code == ErrorCode.INVALID_UTF8


def test_close_reason_is_cut_at_a_character_boundary() -> None:
    reason = "é" * 100  # 200 bytes of UTF-8
    encoded = encode_close(4001, reason)
    assert len(encoded) <= HEADER_SIZE + 2 + CLOSE_REASON_MAX_BYTES
    d = Deframer(0)  # close frames are not subject to max_message_size
    d.feed(encoded)
    message = d.next_message()
    assert isinstance(message, CloseFrame)
    assert message.code == 4001
    assert reason.startswith(message.reason)
    assert len(message.reason.encode()) == 122
    with pytest.raises(ValueError):
        encode_close(70000)


def test_encoder_rejects_what_the_header_cannot_carry() -> None:
    with pytest.raises(ValueError, match="32-bit length"):
        encode_header(KIND_BINARY, MAX_FRAME_LENGTH + 1)
    with pytest.raises(ValueError):
        encode_header(0x09, 1)
    with pytest.raises(UnicodeEncodeError):
        encode_text("\ud800")


def test_large_message_in_small_chunks_is_linear() -> None:
    # 32 MiB in 1 KiB chunks: a quadratic buffer would take minutes here.
    size = 32 * 1024 * 1024
    body = bytes(range(256)) * (size // 256)
    stream = encode_header(KIND_BINARY, size) + body
    d = Deframer(size)
    view = memoryview(stream)
    started = time.perf_counter()
    for i in range(0, len(stream), 1024):
        d.feed(bytes(view[i : i + 1024]))
        if i + 1024 < len(stream):
            assert d.next_message() is None
    message = d.next_message()
    assert time.perf_counter() - started < 20
    assert message == body
    assert d.buffered == 0


def test_feed_after_eof_is_a_programming_error() -> None:
    d = Deframer(10)
    d.feed_eof()
    with pytest.raises(RuntimeError):
        d.feed(b"x")


def test_error_code_description() -> None:
    assert ErrorCode.describe(2) == "2 (MESSAGE_TOO_BIG)"
    assert ErrorCode.describe(4000) == "4000"
    assert ErrorCode.describe(None) == "none"


def test_ready_and_held_track_what_a_reader_can_do() -> None:
    d = Deframer(1000)
    assert not d.ready and d.held == 0
    d.feed(encode_header(KIND_BINARY, 100)[:3])
    assert not d.ready and d.held == 3
    d.feed(encode_header(KIND_BINARY, 100)[3:] + b"x" * 40)
    assert d.ready and d.held == 45  # nothing decoded yet: everything is held
    assert d.next_message() is None  # decodes the header; the body is in progress
    assert not d.ready and d.held == 0  # bytes of the message in progress are not held
    d.feed(b"x" * 60 + frame("next")[:2])
    assert d.ready and d.held == 2  # bytes beyond the message in progress are held
    assert d.next_message() == b"x" * 100
    assert d.held == 2 and not d.ready
    d.feed_eof()
    assert d.ready
    with pytest.raises(FramingError):
        d.next_message()
    assert d.ready


def test_discard_drops_input_for_good() -> None:
    d = Deframer(100)
    d.feed(frame("a") + frame("b")[:3])
    d.discard()
    assert d.buffered == 0 and d.held == 0
    d.feed(frame("c"))
    assert d.buffered == 0
    with pytest.raises(FramingError):
        d.next_message()
