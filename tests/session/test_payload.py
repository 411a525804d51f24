"""session.payload: DATA content to wire forms and back, without a session (pure functions)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m2mwire import avp
from m2mwire.codecs import Algorithm, Encoding
from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits
from m2mwire.codecs.select import NONE_BELOW
from m2mwire.codecs.wire import encode_with
from m2mwire.errors import DecodeError, EncodeError, LimitExceeded, M2MError
from m2mwire.schemas.codes import SessionCode, Violation
from m2mwire.schemas.messages import DataPayload, decode_data
from m2mwire.session import payload
from m2mwire.session.payload import (
    AVP_MORE_KEY,
    AVP_REPLY_TO_KEY,
    AVP_REQUEST_ID_KEY,
    EXTRA_ENTRY_COST,
    Message,
    avp_extra,
    check_avp_frame,
    check_payload_size,
    correlate,
    decode_binary,
    decode_text_data,
    encode_binary,
    encode_text,
    zstd_binary_tokens,
    zstd_message,
)
from m2mwire.session.zstdstate import ZstdMessage, ZstdSessionState
from tests.session.test_core import IDENT, cfg, drain, pair, pump

SID = "00000000-0000-4000-8000-000000000000"
ALL = (Algorithm.NONE, Algorithm.BROTLI, Algorithm.TOKENNATIVE, Algorithm.M2M)
BIG = 1 << 20


def text_message(
    text: str, algorithm: Algorithm | None = Algorithm.NONE, **kw: Any
) -> tuple[str, str, str, int]:
    args: dict[str, Any] = {
        "algorithms": ALL,
        "encoding": Encoding.CL100K,
        "optimize": "bytes",
        "session_id": SID,
        "limits": DEFAULT_LIMITS,
        "payload_limit": BIG,
    }
    args.update(kw)
    content_type = kw.pop("content_type", "text")
    args.pop("content_type", None)
    return encode_text(text, content_type, len(text.encode()), algorithm, **args)


def received(envelope: str, limits: Limits = DEFAULT_LIMITS, zstd: ZstdSessionState | None = None) -> Message:
    data = decode_data(envelope)
    assert data is not None and data.session_id == SID
    return decode_text_data(data.payload, limits, zstd)


def binary(data: bytes, *, mode: str = "JSON", payload_limit: int = BIG, **kw: Any) -> Message | Violation:
    return decode_binary(
        data,
        mode=mode,
        limits=kw.get("limits", DEFAULT_LIMITS),
        payload_limit=payload_limit,
        zstd=kw.get("zstd"),
        session_id=kw.get("session_id", SID),
    )


def zmessage(
    state: ZstdSessionState, text: str, *, explicit: bool = False, limit: int = BIG
) -> ZstdMessage | None:
    return zstd_message(
        state,
        text,
        "text",
        len(text.encode()),
        session_id=SID,
        payload_limit=limit,
        correlation=None,
        explicit=explicit,
    )


def zstd_pair(peer_binary: bool = True) -> tuple[ZstdSessionState, ZstdSessionState]:
    def one() -> ZstdSessionState:
        return ZstdSessionState(SID, 1 << 20, level=3, dictionary=None, peer_binary=peer_binary)

    return one(), one()


# -- text DATA ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "algorithm", [Algorithm.NONE, Algorithm.BROTLI, Algorithm.TOKENNATIVE, Algorithm.M2M]
)
def test_text_round_trip_by_algorithm(algorithm: Algorithm) -> None:
    text = '{"greeting":"' + "héllo wörld, " * 20 + '"}'  # JSON: what an M2M v1 frame carries
    envelope, name, wire, wire_len = text_message(text, algorithm)
    assert name == algorithm.value and wire_len == len(wire.encode())
    message = received(envelope)
    assert message.text == text and message.kind == "text" and message.algorithm == algorithm.value
    assert message.original_bytes == len(text.encode()) and message.wire_bytes == wire_len
    assert message.decoded_bytes == sys.getsizeof(message.text) and not message.binary


def test_selection_picks_a_negotiated_algorithm() -> None:
    _, name, _, _ = text_message("x" * 2000, None, algorithms=(Algorithm.BROTLI, Algorithm.NONE))
    assert name == "brotli"


def test_json_content_is_parsed_and_costed() -> None:
    envelope, *_ = text_message('{"a":[1,2,3]}', content_type="json")
    message = received(envelope)
    assert message.kind == "json" and message.value == {"a": [1, 2, 3]}
    assert message.decoded_bytes > sys.getsizeof('{"a":[1,2,3]}')  # the parsed value counts too


def test_request_fields_travel_in_the_envelope() -> None:
    trace = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    envelope, *_ = text_message("q", correlation=("r1", None, False, trace))
    message = received(envelope)
    assert (message.request_id, message.reply_to, message.traceparent) == ("r1", None, trace["traceparent"])
    envelope, *_ = text_message("a", correlation=(None, "r1", True, None))
    message = received(envelope)
    assert (message.request_id, message.reply_to, message.more) == (None, "r1", True)


def test_correlate_sets_only_what_is_given() -> None:
    payload = correlate(DataPayload(algorithm="none", content="x"), None, None, True, None)
    assert payload == DataPayload(algorithm="none", content="x")  # more only with reply_to


def test_an_algorithm_not_negotiated_is_refused() -> None:
    with pytest.raises(EncodeError, match="brotli was not negotiated"):
        text_message("x", Algorithm.BROTLI, algorithms=(Algorithm.NONE,))


def test_the_envelope_is_held_to_max_payload_in_utf8_bytes() -> None:
    text = "é" * 100  # 100 characters, 200 bytes
    envelope, *_ = text_message(text, payload_limit=1000)
    limit = len(envelope.decode()) + 10  # over the envelope's characters, under its bytes
    assert len(envelope) > limit
    with pytest.raises(LimitExceeded, match="DATA message is") as info:
        text_message(text, payload_limit=limit)
    assert info.value.limit == limit and info.value.actual == len(envelope)


def test_decoded_text_is_held_to_max_output_bytes() -> None:
    wire = encode_with("a" * 10_000, Algorithm.BROTLI, Encoding.CL100K)
    limits = Limits(max_output_bytes=1000)
    with pytest.raises(LimitExceeded):
        decode_text_data(DataPayload(algorithm="brotli", content=wire), limits, None)


def test_undecodable_content_raises() -> None:
    with pytest.raises(M2MError):
        decode_text_data(DataPayload(algorithm="brotli", content="#BR|not base64!"), DEFAULT_LIMITS, None)


def test_zstd_text_form_round_trip() -> None:
    ours, theirs = zstd_pair(peer_binary=False)
    text = "the same words again " * 40
    zmsg = zmessage(ours, text)
    assert zmsg is not None and zmsg.payload is not None and zmsg.inner == text.encode()  # not compressed yet
    envelope = ours.wire(zmsg)
    assert isinstance(envelope, bytes) and zmsg.payload.content.startswith("#ZS|")
    message = received(envelope, zstd=theirs)
    assert message.text == text and message.algorithm == "zstd"


def test_zstd_text_form_is_not_chosen_for_short_content_unless_asked() -> None:
    ours, _ = zstd_pair(peer_binary=False)
    short = "x" * (NONE_BELOW - 1)
    assert zmessage(ours, short) is None
    explicit = zmessage(ours, short, explicit=True)
    assert explicit is not None and explicit.payload is not None  # the text form


def test_zstd_too_close_to_max_payload() -> None:
    ours, _ = zstd_pair(peer_binary=False)
    text = "x" * 500
    assert zmessage(ours, text, limit=520) is None  # another algorithm then
    with pytest.raises(LimitExceeded, match="zstd's worst case"):
        zmessage(ours, text, explicit=True, limit=520)


# -- binary frames --------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", [Algorithm.TOKENNATIVE, Algorithm.M2M])
def test_binary_text_round_trip(algorithm: Algorithm) -> None:
    text = '{"binary":"' + "text, " * 10 + '"}'
    kind, frame = encode_binary(
        text, algorithm, algorithms=ALL, encoding=Encoding.O200K, limits=DEFAULT_LIMITS, payload_limit=BIG
    )
    assert kind is algorithm
    message = binary(frame)
    assert isinstance(message, Message)
    assert (message.text, message.algorithm, message.binary) == (text, algorithm.value, True)
    assert message.wire_bytes == len(frame) and message.original_bytes == len(text)


def test_binary_frame_not_negotiated_or_too_big() -> None:
    kw: dict[str, Any] = {"encoding": Encoding.CL100K, "limits": DEFAULT_LIMITS}
    with pytest.raises(EncodeError, match="tokennative was not negotiated"):
        encode_binary("x", None, algorithms=(Algorithm.NONE,), payload_limit=BIG, **kw)
    with pytest.raises(LimitExceeded, match="tokennative binary frame is"):
        encode_binary("word " * 200, None, algorithms=ALL, payload_limit=10, **kw)


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"", SessionCode.MALFORMED_MESSAGE),
        (b"\x7fhello", SessionCode.MALFORMED_MESSAGE),
        (b"Zzstd without zstd", SessionCode.MALFORMED_MESSAGE),
    ],
)
def test_binary_frames_that_break_a_rule(data: bytes, code: SessionCode) -> None:
    violation = binary(data)
    assert isinstance(violation, Violation) and violation.code is code


@pytest.mark.parametrize("data", [b"AX\x01\x00" + bytes(8), b"A"])
def test_an_a_without_avps_magic_is_told_as_such(data: bytes) -> None:
    """'A' followed by anything but 'V' said "starts with byte 0x41: expected ... 'A' (AVP)", as if
    0x41 were refused (a clean-room client's report): it names both bytes and AVP's magic now."""
    violation = binary(data, mode="LATENT")
    assert isinstance(violation, Violation) and violation.code is SessionCode.MALFORMED_MESSAGE
    assert "'AV' (AVP, 41 56)" in violation.message and "'A' (AVP)" not in violation.message
    if len(data) > 1:
        assert "starts with bytes 0x41 0x58" in violation.message


def test_avp_frame_needs_latent_mode() -> None:
    frame = avp.encode(np.zeros(4, dtype=np.float32))
    violation = binary(frame, mode="JSON")
    assert isinstance(violation, Violation) and violation.code is SessionCode.MODE_VIOLATION
    message = binary(frame, mode="LATENT")
    assert isinstance(message, Message) and message.kind == "avp" and message.avp is not None
    assert message.decoded_bytes == len(frame) and message.request_id is None


def test_avp_frame_carries_request_fields_in_its_extra_map() -> None:
    extra = {AVP_REQUEST_ID_KEY: "r", AVP_REPLY_TO_KEY: "q", AVP_MORE_KEY: "1", "app": "v"}
    frame = avp.encode(np.zeros(4, dtype=np.float32), extra=extra)
    message = binary(frame, mode="LATENT")
    assert isinstance(message, Message)
    assert (message.request_id, message.reply_to, message.more, message.extra) == (
        "r",
        "q",
        True,
        {"app": "v"},
    )


def test_compressed_avp_payload_is_held_to_max_payload() -> None:
    frame = avp.encode(np.zeros(4096, dtype=np.float32), compress=True)
    assert len(frame) < 1000
    with pytest.raises(LimitExceeded):
        binary(frame, mode="LATENT", payload_limit=1000)


def test_zstd_binary_round_trip_and_session_check() -> None:
    ours, theirs = zstd_pair()
    text = "context " * 30
    zmsg = zmessage(ours, text)
    assert zmsg is not None and zmsg.payload is None  # the binary form: envelope line + content
    out = ours.wire(zmsg)
    assert not isinstance(out, bytes)
    (frame,) = out
    message = binary(frame, zstd=theirs)
    assert isinstance(message, Message) and (message.text, message.algorithm) == (text, "zstd")
    assert zstd_binary_tokens(frame) > 0
    ours, theirs = zstd_pair()
    zmsg = zmessage(ours, text)
    assert zmsg is not None
    out = ours.wire(zmsg)
    assert not isinstance(out, bytes)
    (frame,) = out
    violation = binary(frame, zstd=theirs, session_id="another")
    assert isinstance(violation, Violation) and violation.code is SessionCode.UNKNOWN_SESSION


def test_undecodable_binary_raises() -> None:
    with pytest.raises(DecodeError):
        binary(b"AV" + bytes(20), mode="LATENT")


# -- sending AVP frames ---------------------------------------------------------------------------


def test_check_payload_size_bounds() -> None:
    check_payload_size(10, 10, "x")
    with pytest.raises(LimitExceeded, match="x is 11 bytes, over the negotiated max_payload of 10") as info:
        check_payload_size(11, 10, "x")
    assert (info.value.limit, info.value.actual) == (10, 11)


@pytest.mark.parametrize(
    ("parts", "error", "match"),
    [
        ((), EncodeError, "encoded AVP frame"),
        ((b"AV",), EncodeError, "encoded AVP frame"),  # under the 12-byte header
        ((b"AX" + bytes(20),), EncodeError, "encoded AVP frame"),
        ((b"AV" + bytes(2000),), LimitExceeded, "AVP frame is 2002 bytes"),
    ],
)
def test_check_avp_frame_refuses(parts: tuple[bytes, ...], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        check_avp_frame(parts, 1000)


def test_check_avp_frame_bounds_the_decompressed_payload() -> None:
    frame = avp.encode(np.zeros(4096, dtype=np.float32), compress=True)
    with pytest.raises(LimitExceeded, match="decompressed AVP payload"):
        check_avp_frame((frame,), 1000)
    assert check_avp_frame((frame,), 1 << 20) == len(frame)


@pytest.mark.parametrize("cut", [1, 2, 3, 4, 11])
def test_a_header_split_across_buffers_is_read_whole(cut: int) -> None:
    """Regression: the flags byte was read from the first buffer alone (IndexError under 4 bytes,
    a frame refused as 'not AVP' under 2)."""
    frame = avp.encode(np.arange(8, dtype=np.float32))
    parts = (frame[:cut], memoryview(frame)[cut:])
    assert check_avp_frame(parts, 1 << 20) == len(frame)
    c, s = pair(cfg(identity=IDENT), cfg(identity=IDENT))
    drain(s)
    assert c.send_frame(parts, 1.0).wire_bytes == len(frame)
    got: list[Message] = []
    pump(c, s, 1.0, got)
    (message,) = got
    assert message.avp is not None and bytes(message.avp.raw) == frame


@st.composite
def frame_parts(draw: st.DrawFn) -> list[bytes | bytearray | memoryview]:
    """A frame cut into buffers of every kind a sender may pass: bytes, bytearray, byte views,
    and views of other item formats (a float32 tensor's memory)."""
    frame = draw(st.binary(max_size=40))
    cuts = sorted(draw(st.lists(st.integers(0, len(frame)), max_size=4)))
    parts: list[bytes | bytearray | memoryview] = []
    for start, end in zip([0, *cuts], [*cuts, len(frame)], strict=True):
        piece = frame[start:end]
        kind = draw(st.sampled_from(["bytes", "bytearray", "view", "float32"]))
        if kind == "bytearray":
            parts.append(bytearray(piece))
        elif kind == "view":
            parts.append(memoryview(piece))
        elif kind == "float32" and len(piece) % 4 == 0:
            parts.append(memoryview(np.frombuffer(piece, dtype=np.float32)))
        else:
            parts.append(piece)
    return parts


@settings(max_examples=400, deadline=None)
@given(parts=frame_parts())
def test_the_frame_measure_fast_path_agrees_with_the_general_one(
    parts: list[bytes | bytearray | memoryview],
) -> None:
    """check_avp_frame's fast path (a bytes first part holding the whole header: the session's
    encode_parts output) gives the general path's size and header."""
    size, head = payload._frame_size_and_head(parts)
    general_size, general_head = payload._frame_size_and_head_general(parts)
    assert size == general_size
    assert bytes(head[: avp.HEADER_SIZE]) == bytes(general_head[: avp.HEADER_SIZE])


def test_the_frame_measure_fast_path_is_taken() -> None:
    """The property above is not vacuous: encode_parts' output takes the fast path."""
    parts = avp.encode_parts(np.arange(8, dtype=np.float32))
    assert type(parts[0]) is bytes and len(parts[0]) >= avp.HEADER_SIZE
    size, head = payload._frame_size_and_head(parts)
    assert head is parts[0]  # the general path builds a bytearray instead
    assert size == len(b"".join(parts))


def test_avp_extra_adds_the_correlation_ids_and_guards_the_reserved_keys() -> None:
    assert avp_extra({"layer": "7"}, tensor=False) == {"layer": "7"}  # a plain frame: as given
    assert avp_extra({"layer": "7"}, tensor=True, reply_to="r1", more=True) == {
        "layer": "7",
        AVP_REPLY_TO_KEY: "r1",
        AVP_MORE_KEY: "1",
    }
    assert avp_extra(None, tensor=True, request_id="q1") == {AVP_REQUEST_ID_KEY: "q1"}
    with pytest.raises(EncodeError, match="reserved for m2mwire"):
        avp_extra({AVP_REQUEST_ID_KEY: "forged"}, tensor=True)
    with pytest.raises(EncodeError, match="numpy tensor"):
        avp_extra(None, tensor=False, request_id="q1")  # an encoded frame cannot take the ids


def test_a_received_avp_extra_map_is_charged_per_entry_and_bounded_in_size() -> None:
    """An AVP frame's extra map was charged at its wire size while waiting in the session's queue:
    a 16 MiB map of a million 1-3 character keys held ~20x that once parsed, and took ~1 s of
    CPU to parse (stop 30's attack run). Entries are now charged EXTRA_ENTRY_COST each, and the
    metadata is refused above Limits.max_metadata_bytes (64 KiB) before it is parsed."""
    extra = {f"k{i}": "v" for i in range(2000)}
    frame = avp.encode(np.zeros(4, dtype=np.float32), extra=extra)
    message = binary(frame, mode="LATENT")
    assert isinstance(message, Message)
    assert message.decoded_bytes == len(frame) + EXTRA_ENTRY_COST * 2000
    huge = avp.encode(np.zeros(4, dtype=np.float32), extra={f"k{i}": "v" for i in range(20_000)})
    with pytest.raises(LimitExceeded, match="AVP metadata"):
        binary(huge, mode="LATENT")


def test_a_received_avp_frame_is_held_to_the_sessions_own_metadata_limit() -> None:
    """The receive path decoded AVP frames with the default Limits, so a session's
    ``limits=Limits(max_metadata_bytes=...)`` changed nothing: raised, a frame under it was still
    refused; lowered, a frame over it was still parsed. A template learnt from a stream (the
    fast path, shared by every session of the process) must not bypass a lower limit either."""
    extra = {f"k{i}": "v" for i in range(20_000)}  # ~160 KB of metadata
    big = avp.encode(np.zeros(4, dtype=np.float32), extra=extra)
    raised = Limits(max_metadata_bytes=1 << 20)
    assert isinstance(binary(big, mode="LATENT", limits=raised), Message)
    stream = avp.encode(np.zeros(4, dtype=np.float32), extra={"k": "v" * 2000})
    for _ in range(3):  # learnt as a template under the default limit
        assert isinstance(binary(stream, mode="LATENT"), Message)
    lowered = Limits(max_metadata_bytes=1024)
    with pytest.raises(LimitExceeded, match="AVP metadata"):
        binary(stream, mode="LATENT", limits=lowered)


def test_request_ids_are_charged_with_their_message() -> None:
    """A 10 MB request_id on a 1 KiB text message was charged as the 1 KiB: 64 such messages held
    ~650 MB of a server against max_queue_bytes (32 MiB). The ids now count in decoded_bytes."""
    plain = DataPayload(algorithm="none", content="x" * 1024, content_type="text")
    asked = DataPayload(algorithm="none", content="x" * 1024, content_type="text", request_id="r" * 1_000_000)
    base = decode_text_data(plain, DEFAULT_LIMITS, None).decoded_bytes
    message = decode_text_data(asked, DEFAULT_LIMITS, None)
    assert message.request_id == "r" * 1_000_000
    assert message.decoded_bytes >= base + 1_000_000


def test_a_frame_whose_metadata_a_receiver_would_refuse_is_not_sent() -> None:
    parts = avp.encode_parts(np.zeros(4, dtype=np.float32), extra={f"k{i}": "v" for i in range(20_000)})
    with pytest.raises(LimitExceeded, match="put less in extra="):
        check_avp_frame(parts, BIG)
    assert check_avp_frame(avp.encode_parts(np.zeros(4, dtype=np.float32), extra={"k": "v"}), BIG) > 0
