"""The sans-I/O session core: every state transition, violation and timer, without sockets or sleeps."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from m2mwire import avp
from m2mwire.codecs import Algorithm, Encoding, decode_wire, decompress
from m2mwire.codecs.limits import Limits
from m2mwire.errors import (
    EncodeError,
    LimitExceeded,
    M2MError,
    ModeError,
    ProtocolError,
    SessionClosed,
    SessionRejected,
    SessionTimeout,
)
from m2mwire.schemas.identity import ModelIdentity
from m2mwire.session.config import SessionConfig, Timers
from m2mwire.session.core import SessionProtocol
from m2mwire.session.events import Closed, Established, HelloReceived
from m2mwire.session.outputs import CloseTransport, SendMessage
from m2mwire.session.payload import Message
from m2mwire.session.states import Role, State

IDENT = ModelIdentity(model_family="llama", model_id="tiny", model_hash="ab" * 32, hidden_dim=8, num_layers=2)


def cfg(**kw: Any) -> SessionConfig:
    base = SessionConfig(encodings=(Encoding.CL100K, Encoding.O200K))
    return replace(base, **kw)


def drain(p: SessionProtocol) -> list[Any]:
    out: list[Any] = []
    while (e := p.next_event()) is not None:
        out.append(e)
    return out


def pump(
    src: SessionProtocol, dst: SessionProtocol, now: float = 0.0, received: list[Message] | None = None
) -> list[CloseTransport]:
    """Deliver everything src wants to send to dst; returns src's CloseTransport outputs. DATA
    messages that dst's receive_* returned go into ``received``."""
    closes = []
    for out in src.data_to_send():
        if isinstance(out, CloseTransport):
            closes.append(out)
            continue
        if out.text:
            message = dst.receive_text(out.message, now)
        else:
            message = dst.receive_binary(b"".join(bytes(memoryview(b)) for b in out.message), now)
        if message is not None and received is not None:
            received.append(message)
    return closes


def texts(p: SessionProtocol) -> list[dict[str, Any]]:
    return [json.loads(o.message) for o in p.data_to_send() if isinstance(o, SendMessage) and not o.binary]


def pair(
    client_cfg: SessionConfig | None = None, server_cfg: SessionConfig | None = None
) -> tuple[SessionProtocol, SessionProtocol]:
    c = SessionProtocol(Role.CLIENT, client_cfg or cfg())
    s = SessionProtocol(Role.SERVER, server_cfg or cfg())
    c.initiate(0.0)
    s.initiate(0.0)
    pump(c, s)
    pump(s, c)
    return c, s


def test_handshake_establishes_both_ends() -> None:
    c, s = pair()
    assert c.state is s.state is State.ESTABLISHED
    (ce,) = drain(c)
    (se,) = drain(s)
    assert isinstance(ce, Established) and isinstance(se, Established)
    assert ce.info.session_id == se.info.session_id
    assert len(ce.info.session_id) == 36  # UUID text
    assert ce.info.algorithms == se.info.algorithms
    assert ce.info.encoding is se.info.encoding is Encoding.CL100K
    assert ce.info.mode == "JSON" and ce.info.mode_reason == "no_identity"


def test_hello_on_the_wire() -> None:
    c = SessionProtocol(Role.CLIENT, cfg(algorithms=(Algorithm.BROTLI, Algorithm.TOKENNATIVE)))
    c.initiate(0.0)
    assert c.state is State.HELLO_SENT
    (hello,) = texts(c)
    assert hello["type"] == "HELLO" and "session_id" not in hello
    assert hello["payload"]["compression"]["algorithms"] == ["brotli", "tokennative"]
    assert hello["payload"]["compression"]["encodings"] == ["Cl100kBase", "O200kBase"]
    assert hello["payload"]["version"] == "3.0"


def test_latent_mode_with_matching_identities() -> None:
    c, s = pair(cfg(identity=IDENT), cfg(identity=IDENT))
    assert c.info is not None and s.info is not None
    assert c.info.mode == s.info.mode == "LATENT"
    assert c.info.mode_reason == "hash_match"


def test_data_round_trip_in_order_with_every_algorithm() -> None:
    c, s = pair()
    drain(c), drain(s)
    contents: list[Any] = ["hello", {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}]}]
    contents += ["x" * 2000, "short", ["a", 1, None]]
    algs = [None, Algorithm.TOKEN, Algorithm.BROTLI, Algorithm.TOKENNATIVE, Algorithm.NONE]
    for content, alg in zip(contents, algs, strict=True):
        c.send(content, 1.0, algorithm=alg)
    received: list[Message] = []
    pump(c, s, 1.0, received)
    assert drain(s) == []  # DATA comes back from receive_*, never as an event
    assert [m.kind for m in received] == ["text", "json", "text", "text", "json"]
    assert [received[i].text for i in (0, 2, 3)] == [contents[0], contents[2], contents[3]]
    assert received[4].value == ["a", 1, None]
    assert received[1].kind == "json" and received[1].algorithm == "token"
    assert received[1].value["messages"] == [{"role": "user", "content": "Hi"}]
    assert [m.algorithm for m in received[2:]] == ["brotli", "tokennative", "none"]
    assert c.stats.messages_sent == 5 and s.stats.messages_received == 5
    # names are plain str, not Algorithm members (they print and serialise as themselves)
    assert {type(m.algorithm) for m in received} == {str}
    assert {type(k) for k in c.stats.by_algorithm} == {str}
    assert s.stats.wire_bytes_received == sum(m.wire_bytes for m in received)


def test_tokennative_binary_frames() -> None:
    c, s = pair()
    sent = c.send("binary hello", 1.0, binary=True)
    assert sent.binary and sent.algorithm == "tokennative"
    (out,) = c.data_to_send()
    assert isinstance(out, SendMessage) and out.binary
    frame = b"".join(bytes(b) for b in out.message)
    assert frame[0] == 0  # cl100k
    drain(s)
    msg = s.receive_binary(frame, 1.0)
    assert msg is not None and drain(s) == []
    assert (msg.kind, msg.text, msg.binary) == ("text", "binary hello", True)


def test_m2m_only_session_sends_and_reads_m2m_v1_frames(m2m_vectors: dict[str, Any]) -> None:
    # A peer that negotiates only m2m (the reference 0.4's default) gets #M2M|1| frames, text and binary.
    c, s = pair(cfg(algorithms=(Algorithm.M2M,)))
    assert c.info is not None and c.info.algorithms == (Algorithm.M2M,)
    drain(c), drain(s)
    vector = m2m_vectors["m2m_frames"][0]
    sent = c.send(vector["input"], 1.0)
    (data,) = texts(c)
    assert sent.algorithm == data["payload"]["algorithm"] == "m2m"
    assert data["payload"]["content"] == vector["wire_string"]  # the reference's own bytes
    frame = bytes.fromhex(vector["binary_hex"])
    sent = c.send(vector["input"], 1.0, algorithm=Algorithm.M2M, binary=True)
    assert (sent.algorithm, sent.binary, sent.wire_bytes) == ("m2m", True, len(frame))
    (out,) = c.data_to_send()
    assert isinstance(out, SendMessage) and b"".join(bytes(b) for b in out.message) == frame
    envelope = data_message(s.session_id, True, algorithm="m2m", content=vector["wire_string"])
    msg = s.receive_text(envelope, 1.0)
    assert msg is not None and (msg.text, msg.algorithm, msg.binary) == (vector["input"], "m2m", False)
    msg = s.receive_binary(frame, 1.0)
    assert msg is not None and (msg.text, msg.algorithm, msg.binary) == (vector["input"], "m2m", True)
    assert msg.json() == json.loads(vector["input"])
    with pytest.raises(EncodeError, match="m2m needs JSON content"):
        c.send("not JSON", 1.0)
    with pytest.raises(EncodeError, match="binary=True sends tokennative binary frames"):
        c.send("x", 1.0, binary=True)


def test_avp_frame_in_latent_mode() -> None:
    c, s = pair(cfg(identity=IDENT), cfg(identity=IDENT))
    drain(s)
    tensor = np.arange(8, dtype=np.float32)
    parts = avp.encode_parts(tensor, model_id="tiny", session_id=c.info.session_id if c.info else "")
    c.send_frame(parts, 1.0)
    received: list[Message] = []
    pump(c, s, 1.0, received)
    (msg,) = received
    assert msg.kind == "avp" and msg.avp is not None
    np.testing.assert_array_equal(msg.avp.tensor(), tensor)


@pytest.mark.parametrize(
    "form",
    [
        lambda f: (f,),
        lambda f: [bytearray(f)],
        lambda f: (memoryview(f),),
        lambda f: (f[:20], memoryview(f)[20:]),  # header+metadata and a payload view, as encode_parts gives
    ],
)
def test_send_frame_takes_any_buffer_form(form: Any) -> None:
    c, s = pair(cfg(identity=IDENT), cfg(identity=IDENT))
    drain(s)
    tensor = np.arange(8, dtype=np.float32)
    frame = avp.encode(tensor)
    sent = c.send_frame(form(frame), 1.0)
    assert sent.wire_bytes == len(frame) and c.stats.wire_bytes_sent == len(frame)
    received: list[Message] = []
    pump(c, s, 1.0, received)
    (msg,) = received
    assert msg.avp is not None and bytes(msg.avp.raw) == frame and msg.wire_bytes == len(frame)


@pytest.mark.parametrize(
    ("parts", "error"),
    [
        ((), EncodeError),
        ((b"",), EncodeError),
        ((b"AV",), EncodeError),  # under the 12-byte header
        ((b"AX" + bytes(20),), EncodeError),
        ((memoryview(b"XV" + bytes(20)),), EncodeError),
        ((b"AV" + bytes(2000),), LimitExceeded),  # over the negotiated max_payload of 1000
    ],
)
def test_send_frame_rejects_and_queues_nothing(parts: Any, error: type[Exception]) -> None:
    c, _ = pair(cfg(identity=IDENT, max_payload=1000), cfg(identity=IDENT))
    with pytest.raises(error):
        c.send_frame(parts, 1.0)
    assert c.data_to_send() == [] and c.stats.messages_sent == 0


def test_avp_frame_refused_in_json_mode_with_clear_error() -> None:
    c, _ = pair()
    parts = avp.encode_parts(np.zeros(4, dtype=np.float32))
    with pytest.raises(ModeError, match="JSON mode"):
        c.send_frame(parts, 1.0)
    assert c.data_to_send() == []


def test_avp_frame_received_in_json_mode_is_a_violation() -> None:
    c, s = pair()
    frame = avp.encode(np.zeros(4, dtype=np.float32))
    s.receive_binary(frame, 1.0)
    (closed,) = [e for e in drain(s) if isinstance(e, Closed)]
    assert isinstance(closed.error, ProtocolError) and closed.error.code == "MODE_VIOLATION"


def test_send_before_established_raises() -> None:
    c = SessionProtocol(Role.CLIENT, cfg())
    with pytest.raises(SessionClosed):
        c.send("x", 0.0)
    c.initiate(0.0)
    with pytest.raises(SessionClosed):
        c.send("x", 0.0)


def test_send_unnegotiated_algorithm_raises_and_queues_nothing() -> None:
    c, _ = pair(cfg(algorithms=(Algorithm.BROTLI, Algorithm.NONE)))
    with pytest.raises(EncodeError, match="not negotiated"):
        c.send("x", 1.0, algorithm=Algorithm.TOKENNATIVE)
    with pytest.raises(EncodeError, match="tokennative was not negotiated"):
        c.send("x", 1.0, binary=True)
    assert c.data_to_send() == []


def test_send_over_max_payload_raises_and_queues_nothing() -> None:
    c, _ = pair(cfg(max_payload=1000), cfg(max_payload=500))
    assert c.info is not None and c.info.max_payload == 500
    with pytest.raises(LimitExceeded):
        c.send("y" * 600, 1.0, algorithm=Algorithm.NONE)
    assert c.data_to_send() == []
    c.send("y" * 100, 1.0)
    assert len(c.data_to_send()) == 1


def test_send_rejects_non_json_content_types() -> None:
    c, _ = pair()
    with pytest.raises(EncodeError):
        c.send(42, 1.0)  # type: ignore[arg-type]


# -- rejections ---------------------------------------------------------------------------------


def _raw_hello(**payload: Any) -> str:
    base = {
        "version": "3.0",
        "agent_id": "a",
        "agent_type": "t",
        "compression": {
            "algorithms": ["tokennative"],
            "max_payload": 0,
            "streaming": False,
            "ml_routing": False,
        },
        "security": {"threat_detection": False, "blocking_mode": False, "block_threshold": 0.8},
    }
    base.update(payload)
    return json.dumps({"type": "HELLO", "payload": base, "timestamp": 1})


def test_version_mismatch_rejected() -> None:
    s = SessionProtocol(Role.SERVER, cfg())
    s.initiate(0.0)
    s.receive_text(_raw_hello(version="2.0"), 0.0)
    outs = s.data_to_send()
    reject = json.loads(outs[0].message)  # type: ignore[union-attr]
    assert reject["type"] == "REJECT" and reject["payload"]["code"] == "VERSION_MISMATCH"
    assert "session_id" not in reject
    assert isinstance(outs[1], CloseTransport)
    assert s.state is State.CLOSED


def test_no_common_algorithm_rejected_and_client_sees_it() -> None:
    c = SessionProtocol(Role.CLIENT, cfg(algorithms=(Algorithm.DICTIONARY,)))
    s = SessionProtocol(Role.SERVER, cfg(algorithms=(Algorithm.BROTLI,)))
    c.initiate(0.0)
    s.initiate(0.0)
    pump(c, s)
    pump(s, c)
    (closed,) = drain(c)
    assert isinstance(closed, Closed) and isinstance(closed.error, SessionRejected)
    assert closed.error.code == "NO_COMMON_ALGORITHM"
    assert c.state is State.CLOSED
    assert isinstance(c.data_to_send()[-1], CloseTransport)


def test_docs_flat_hello_with_version_1_is_accepted() -> None:
    s = SessionProtocol(Role.SERVER, cfg())
    s.initiate(0.0)
    s.receive_text(
        json.dumps(
            {
                "type": "HELLO",
                "payload": {
                    "version": "1.0",
                    "algorithms": ["TOKEN_NATIVE", "BROTLI"],
                    "encodings": ["O200K_BASE"],
                    "preferred_encoding": "O200K_BASE",
                    "max_payload_size": 2048,
                },
                "timestamp": 1,
            }
        ),
        0.0,
    )
    assert s.state is State.ESTABLISHED
    assert s.info is not None
    assert s.info.algorithms == (Algorithm.TOKENNATIVE, Algorithm.BROTLI)
    assert s.info.encoding is Encoding.O200K and s.info.max_payload == 2048


# -- violations -----------------------------------------------------------------------------------


def _violation(p: SessionProtocol) -> ProtocolError:
    closed = [e for e in drain(p) if isinstance(e, Closed)]
    assert closed, "expected the session to close"
    assert isinstance(closed[-1].error, ProtocolError)
    assert p.state is State.CLOSED
    assert isinstance(p.data_to_send()[-1], CloseTransport)
    return closed[-1].error


def test_data_before_hello() -> None:
    s = SessionProtocol(Role.SERVER, cfg())
    s.initiate(0.0)
    s.receive_text(
        '{"type":"DATA","session_id":"x","payload":{"algorithm":"none","content":"hi"},"timestamp":1}', 0.0
    )
    outs = s.data_to_send()
    assert json.loads(outs[0].message)["type"] == "REJECT"  # type: ignore[union-attr]
    closed = [e for e in drain(s) if isinstance(e, Closed)]
    assert isinstance(closed[0].error, ProtocolError) and closed[0].error.code == "DATA_BEFORE_HELLO"


def test_data_before_accept() -> None:
    c = SessionProtocol(Role.CLIENT, cfg())
    c.initiate(0.0)
    c.data_to_send()
    c.receive_text(
        '{"type":"DATA","session_id":"x","payload":{"algorithm":"none","content":"hi"},"timestamp":1}', 0.0
    )
    assert _violation(c).code == "DATA_BEFORE_ACCEPT"


def test_data_on_wrong_session_id_closes_with_reason() -> None:
    c, s = pair()
    drain(s)
    s.receive_text(
        '{"type":"DATA","session_id":"nope","payload":{"algorithm":"none","content":"hi"},"timestamp":1}', 1.0
    )
    outs = s.data_to_send()
    close = json.loads(outs[0].message)  # type: ignore[union-attr]
    assert close["type"] == "CLOSE" and close["payload"]["reason"] == "UNKNOWN_SESSION"
    assert isinstance(outs[1], CloseTransport)
    assert s.state is State.CLOSED


def test_binary_before_accept() -> None:
    s = SessionProtocol(Role.SERVER, cfg())
    s.initiate(0.0)
    s.receive_binary(b"\x00\x01", 0.0)
    closed = [e for e in drain(s) if isinstance(e, Closed)]
    assert isinstance(closed[0].error, ProtocolError) and closed[0].error.code == "BINARY_BEFORE_ACCEPT"


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (b"", "MALFORMED_MESSAGE"),
        (b"\x07abc", "MALFORMED_MESSAGE"),
        (b"Yzz", "MALFORMED_MESSAGE"),
        (b"Hzz", "INVALID_DATA"),  # 'H': a zstd frame with shared history (the default): undecodable
        (b"Zzz", "MALFORMED_MESSAGE"),  # 'Z' (zstd without shared history) was not negotiated
        (b"A", "MALFORMED_MESSAGE"),  # an 'A' alone or not followed by 'V' is not an AVP frame
        (b"AX\x01\x00", "MALFORMED_MESSAGE"),
        (b"\x00\xff\xff\xff\xff\xff\xff", "INVALID_DATA"),
        (b"AVgarbage-frame", "INVALID_DATA"),
        (memoryview(b"AVgarbage-frame"), "INVALID_DATA"),
        (bytearray(b"AV"), "INVALID_DATA"),
        (b"#M2M|1|\x00", "INVALID_DATA"),
        (b"#TK|C|", "INVALID_DATA"),
    ],
)
def test_bad_binary_frames(frame: bytes, code: str) -> None:
    c, s = pair(cfg(identity=IDENT), cfg(identity=IDENT))
    drain(s)
    assert s.receive_binary(frame, 1.0) is None
    assert _violation(s).code == code


def data_message(sid: str | None, compact: bool, **payload: Any) -> str:
    """A DATA envelope; ``compact`` is how we and the reference write it (the core's one-pass
    path), otherwise spaced like json.dumps (the general path)."""
    env = {"type": "DATA", "session_id": sid, "payload": payload, "timestamp": 1}
    return json.dumps(env, separators=(",", ":") if compact else None)


@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize(
    "content", ["#TK|C|not-base64!", "#TK|X|sk0L/Q4A", "#T1|{broken", "#M2M[v3.0]|DATA:AAAA", "#ZZ|what"]
)
def test_undecodable_data_closes_session(content: str, compact: bool) -> None:
    c, s = pair()
    drain(s)
    s.receive_text(data_message(s.session_id, compact, algorithm="x", content=content), 1.0)
    assert _violation(s).code == "INVALID_DATA"


@pytest.mark.parametrize("compact", [True, False])
def test_invalid_json_content_type_is_a_violation(compact: bool) -> None:
    c, s = pair()
    drain(s)
    s.receive_text(
        data_message(s.session_id, compact, algorithm="none", content="{nope", content_type="json"), 1.0
    )
    assert _violation(s).code == "INVALID_DATA"


@pytest.mark.parametrize("compact", [True, False])
def test_plain_content_over_max_output_bytes_is_message_too_big(compact: bool) -> None:
    c, s = pair(server_cfg=cfg(limits=Limits(max_output_bytes=64)))
    drain(s)
    s.receive_text(data_message(s.session_id, compact, algorithm="none", content="y" * 65), 1.0)
    (closed,) = [e for e in drain(s) if isinstance(e, Closed)]
    assert closed.code == "MESSAGE_TOO_BIG" and isinstance(closed.error, LimitExceeded)
    assert CloseTransport(1009, "MESSAGE_TOO_BIG") in s.data_to_send()


def _receive_outcome(wire: str, compact: bool) -> Message | str:
    """What a fresh server session makes of one DATA: the message, or the violation code."""
    c, s = pair()
    drain(s)
    deadline = s.next_deadline()
    assert deadline is not None
    message = s.receive_text(data_message(s.session_id, compact, algorithm="none", content=wire), 1.0)
    if message is not None:
        # the contract the shell's fast path relies on: nothing else happened
        assert drain(s) == [] and s.data_to_send() == []
        assert (s.next_deadline() or 0.0) >= deadline
        return message
    (event,) = drain(s)
    assert isinstance(event, Closed) and isinstance(event.error, ProtocolError)
    return event.error.code


@settings(max_examples=100, deadline=None)
@given(wire=st.text(st.characters(blacklist_categories=("Cs",))) | st.from_regex(r"\A#(TK\|C\||M2M|T1\|).*"))
def test_both_parsing_paths_and_decode_wire_agree(wire: str) -> None:
    # The one-pass DATA path (compact envelope) must deliver exactly what the general path does,
    # and that is what decode_wire makes of the wire string.
    fast, general = _receive_outcome(wire, True), _receive_outcome(wire, False)
    assert fast == general
    try:
        decoded = decode_wire(wire)
    except M2MError:
        assert fast == "INVALID_DATA"
        return
    assert isinstance(fast, Message)
    assert (fast.text, fast.algorithm) == (decoded.content, decoded.algorithm)
    assert (fast.wire_bytes, fast.original_bytes) == (len(wire.encode()), len(decoded.content.encode()))


def test_malformed_text_is_a_violation() -> None:
    c, s = pair()
    drain(s)
    s.receive_text("garbage{", 1.0)
    assert _violation(s).code == "MALFORMED_MESSAGE"


def test_text_travels_as_utf8_bytes_both_ways() -> None:
    """A DATA message goes out as the envelope's UTF-8 bytes (written as a text frame as they are)
    and the receiver takes the bytes it got: no str in between on either side."""
    c, s = pair()
    drain(s)
    c.send("café ☕", 0.5, algorithm=Algorithm.NONE)
    (out,) = c.data_to_send()
    assert isinstance(out, SendMessage) and out.text and type(out.message) is bytes
    assert "café ☕".encode() in out.message
    message = s.receive_text(out.message, 1.0)
    assert message is not None and message.text == "café ☕"
    assert message.wire_bytes == message.original_bytes == len("café ☕".encode())


@pytest.mark.parametrize(
    "data",
    [
        b'{"type":"DATA","session_id":"%s","payload":{"algorithm":"none","content":"\xe2\x82"},"timestamp":1}',
        b'{"type":"DATA","session_id":"%s","payload":{"algorithm":"none","content":"ok"},"junk":"\xff"}',
        b'{"type":"PING","session_id":"%s","payload":{"x":"\xc0\x80"},"timestamp":1}',
    ],
)
def test_text_that_is_not_utf8_closes_malformed_with_1007(data: bytes) -> None:
    c, s = pair()
    drain(s)
    assert s.receive_text(data % s.session_id.encode(), 1.0) is None
    outs = s.data_to_send()
    closed = [e for e in drain(s) if isinstance(e, Closed)]
    assert s.state is State.CLOSED and closed[-1].code == "MALFORMED_MESSAGE"
    close = json.loads(outs[0].message)  # type: ignore[union-attr]
    assert (
        close["payload"]["reason"] == "MALFORMED_MESSAGE" and "not valid UTF-8" in close["payload"]["message"]
    )
    assert outs[-1] == CloseTransport(1007, "MALFORMED_MESSAGE")


def test_oversized_text_is_refused() -> None:
    s = SessionProtocol(Role.SERVER, cfg(limits=Limits(max_message_bytes=100)))
    s.initiate(0.0)
    s.receive_text(_raw_hello() + " " * 200, 0.0)
    assert s.state is State.CLOSED
    assert isinstance(s.data_to_send()[-1], CloseTransport)


def test_second_hello_and_stray_accept_are_violations() -> None:
    c, s = pair()
    drain(s)
    s.receive_text(_raw_hello(), 1.0)
    assert _violation(s).code == "UNEXPECTED_MESSAGE"
    c2, s2 = pair()
    drain(c2)
    c2.receive_text(
        json.dumps({"type": "REJECT", "payload": {"code": "UNKNOWN", "message": ""}, "timestamp": 1}), 1.0
    )
    assert _violation(c2).code == "UNEXPECTED_MESSAGE"


def test_unknown_message_type_is_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    c, s = pair()
    drain(s)
    with caplog.at_level(logging.WARNING, logger="m2mwire.session"):
        s.receive_text('{"type":"STATUS","session_id":"x","payload":{},"timestamp":1}', 1.0)
    assert s.state is State.ESTABLISHED
    assert s.data_to_send() == [] and drain(s) == []
    assert "unknown type" in caplog.text


def test_an_ack_flood_logs_one_warning_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    # A peer may send ACK at will; without resume each was logged, so a flood grew the log.
    c, s = pair()
    drain(s)
    ack = json.dumps({"type": "ACK", "payload": {"received": 1}, "timestamp": 1})
    with caplog.at_level(logging.WARNING, logger="m2mwire.session"):
        for i in range(1000):
            s.receive_text(ack, 1.0 + i / 1000)
        s.receive_text(ack, 100.0)  # the next interval: one more line, counting the rest
    lines = [r.getMessage() for r in caplog.records if "ignoring ACK" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "999 similar warnings suppressed" in lines[1]
    assert s.state is State.ESTABLISHED


def test_ping_answered_with_pong_in_order() -> None:
    c, s = pair()
    s.receive_text(
        json.dumps({"type": "PING", "session_id": s.session_id, "payload": {}, "timestamp": 5}), 1.0
    )
    (pong,) = texts(s)
    assert pong["type"] == "PONG" and pong["session_id"] == s.session_id and pong["payload"] == {}


def test_pings_while_our_pong_is_still_queued_are_answered_by_it() -> None:
    """A peer flooding PINGs without reading made us queue a PONG per PING of a read (up to
    ~10,000 in one 1 MiB read) before the shell could stop reading; a PONG answers every PING
    before it, so one still queued answers the rest."""
    c, s = pair()
    ping = json.dumps({"type": "PING", "session_id": s.session_id, "payload": {}, "timestamp": 5})
    for _ in range(1000):
        s.receive_text(ping, 1.0)
    assert s.output_backlog == 1
    s.send("between", 1.5, algorithm=Algorithm.NONE)
    s.receive_text(ping, 2.0)  # our PONG is no longer the last output: this one gets its own
    assert [m["type"] for m in texts(s)] == ["PONG", "DATA", "PONG"]
    s.receive_text(ping, 3.0)  # taken and written: the next PING gets a PONG again
    assert [m["type"] for m in texts(s)] == ["PONG"]


# -- close ----------------------------------------------------------------------------------------


def test_orderly_close_from_client() -> None:
    c, s = pair()
    drain(c), drain(s)
    c.close(1.0, "done")
    assert c.state is State.CLOSING
    pump(c, s, 1.0)
    # The server may still send its replies until the application is done with the session.
    assert s.state is State.CLOSE_RECEIVED and drain(s) == []
    s.send("reply", 1.1)
    s.acknowledge_close()
    (sc,) = drain(s)
    assert isinstance(sc, Closed) and sc.by_peer and sc.error is None and sc.reason == "done"
    assert s.state is State.CLOSED
    pump(s, c, 1.0)  # the acknowledgement
    (cc,) = drain(c)
    assert isinstance(cc, Closed) and not cc.by_peer and cc.error is None
    assert c.state is State.CLOSED


def test_data_in_flight_during_close_is_delivered() -> None:
    c, s = pair()
    drain(c), drain(s)
    s.send("late", 1.0)
    c.close(1.0)
    received: list[Message] = []
    pump(s, c, 1.0, received)
    assert [m.text for m in received] == ["late"]


def test_close_before_established_ends_without_wire_close() -> None:
    c = SessionProtocol(Role.CLIENT, cfg())
    c.initiate(0.0)
    c.data_to_send()
    c.close(0.5)
    assert c.state is State.CLOSED
    outs = c.data_to_send()
    assert len(outs) == 1 and isinstance(outs[0], CloseTransport)


def test_transport_loss_closes_with_error() -> None:
    c, s = pair()
    drain(c)
    c.transport_closed()
    (closed,) = drain(c)
    assert closed.code == "TRANSPORT_CLOSED" and isinstance(closed.error, SessionClosed)
    with pytest.raises(SessionClosed):
        c.send("x", 1.0)


# -- timers -----------------------------------------------------------------------------------------

T = Timers(
    hello_timeout=3,
    ping_interval=10,
    pong_timeout=2,
    max_missed_pongs=3,
    close_timeout=1,
    session_timeout=100,
)


def test_hello_timeout_client_and_server() -> None:
    for role in (Role.CLIENT, Role.SERVER):
        p = SessionProtocol(role, cfg(timers=T))
        p.initiate(0.0)
        assert p.next_deadline() == 3.0
        p.handle_timer(2.9)
        assert p.state is not State.CLOSED
        p.handle_timer(3.0)
        assert p.state is State.CLOSED
        closed = [e for e in drain(p) if isinstance(e, Closed)][0]
        assert isinstance(closed.error, SessionTimeout) and closed.code == "HELLO_TIMEOUT"


def test_ping_when_idle_and_pong_resets() -> None:
    c, s = pair(cfg(timers=T), cfg(timers=T))
    c.data_to_send()
    assert c.next_deadline() == 10.0
    c.handle_timer(10.0)
    (ping,) = texts(c)
    assert ping["type"] == "PING"
    assert c.next_deadline() == 12.0
    c.receive_text(
        json.dumps({"type": "PONG", "session_id": c.session_id, "payload": {}, "timestamp": 1}), 11.0
    )
    assert c.next_deadline() == 21.0  # next ping after another idle interval
    # traffic postpones pings
    c.receive_text(
        json.dumps({"type": "PING", "session_id": c.session_id, "payload": {}, "timestamp": 1}), 20.0
    )
    assert c.next_deadline() == 30.0


def test_three_missed_pongs_close_the_session() -> None:
    c, _ = pair(cfg(timers=T))
    c.data_to_send()
    c.handle_timer(10.0)  # PING 1
    c.handle_timer(12.0)  # missed 1 -> PING 2
    c.handle_timer(14.0)  # missed 2 -> PING 3
    assert c.state is State.ESTABLISHED
    assert [m["type"] for m in texts(c)] == ["PING", "PING", "PING"]
    c.handle_timer(16.0)  # missed 3 -> close
    assert c.state is State.CLOSED
    closed = [e for e in drain(c) if isinstance(e, Closed)][0]
    assert closed.code == "PONG_TIMEOUT" and isinstance(closed.error, SessionTimeout)


def test_close_timeout() -> None:
    c, _ = pair(cfg(timers=T))
    c.close(5.0)
    assert c.next_deadline() == 6.0
    c.handle_timer(6.0)
    assert c.state is State.CLOSED
    closed = [e for e in drain(c) if isinstance(e, Closed)][0]
    assert isinstance(closed.error, SessionTimeout)


def test_session_timeout_when_no_data() -> None:
    timers = replace(T, ping_interval=1000)
    c, s = pair(cfg(timers=timers), cfg(timers=timers))
    drain(c)
    c.send("keepalive", 50.0)
    c.data_to_send()
    assert c.next_deadline() == 150.0
    c.handle_timer(150.0)
    assert c.state is State.CLOSING
    (close,) = texts(c)
    assert close["type"] == "CLOSE" and close["payload"]["reason"] == "SESSION_TIMEOUT"
    ack = {"reason": "NORMAL", "message": "acknowledged"}
    c.receive_text(
        json.dumps({"type": "CLOSE", "session_id": c.session_id, "payload": ack, "timestamp": 1}), 150.5
    )
    closed = [e for e in drain(c) if isinstance(e, Closed)][0]
    assert isinstance(closed.error, SessionTimeout)
    # the session ended for its own reason, not the acknowledgement's NORMAL (a clean-room QUIC
    # client saw the connection close 1000 "NORMAL" and the server log "closed: NORMAL")
    assert closed.code == "SESSION_TIMEOUT" and "session_timeout" in closed.reason
    (end,) = [o for o in c.data_to_send() if isinstance(o, CloseTransport)]
    assert (end.code, end.reason) == (1000, "SESSION_TIMEOUT")


def test_message_object_json_helper() -> None:
    msg = Message(kind="text", algorithm="none", binary=False, wire_bytes=2, original_bytes=2, text="[1]")
    assert msg.json() == [1]


def test_decompress_of_emitted_wire_matches() -> None:
    c, _ = pair()
    c.send("some text to check", 1.0, algorithm=Algorithm.BROTLI)
    (out,) = texts(c)
    assert decompress(out["payload"]["content"]) == "some text to check"
    assert out["payload"]["original_size"] == len("some text to check")


# -- admission and correlation fields ---------------------------------------------------------


def test_admission_waits_for_a_verdict_then_accepts() -> None:
    client = SessionProtocol(Role.CLIENT, cfg(token="t0k"))
    server = SessionProtocol(Role.SERVER, cfg(), admission=True)
    client.initiate(0.0)
    server.initiate(0.0)
    pump(client, server)
    (event,) = drain(server)
    assert isinstance(event, HelloReceived) and event.hello.token == "t0k"
    assert server.state is State.INITIAL and not server.has_output  # nothing said before the verdict
    server.admit(0.5)
    pump(server, client)
    assert server.state is State.ESTABLISHED and client.state is State.ESTABLISHED


def test_admission_refusal_and_verdicts_after_a_timeout() -> None:
    client = SessionProtocol(Role.CLIENT, cfg())
    server = SessionProtocol(Role.SERVER, cfg(timers=Timers(hello_timeout=1.0)), admission=True)
    client.initiate(0.0)
    server.initiate(0.0)
    pump(client, server)
    drain(server)
    server.refuse("SECURITY_POLICY", "no token")
    pump(server, client)
    (closed,) = drain(client)
    assert isinstance(closed, Closed) and closed.code == "SECURITY_POLICY"
    assert isinstance(closed.error, SessionRejected)

    # A verdict that comes after hello_timeout ended the handshake does nothing.
    late = SessionProtocol(Role.SERVER, cfg(timers=Timers(hello_timeout=1.0)), admission=True)
    late.initiate(0.0)
    other = SessionProtocol(Role.CLIENT, cfg())
    other.initiate(0.0)
    pump(other, late)
    late.handle_timer(1.5)
    assert late.state is State.CLOSED
    late.admit(2.0)
    assert late.state is State.CLOSED and late.info is None


def test_second_hello_while_awaiting_a_verdict_is_a_violation() -> None:
    client = SessionProtocol(Role.CLIENT, cfg())
    server = SessionProtocol(Role.SERVER, cfg(), admission=True)
    client.initiate(0.0)
    hello = client.data_to_send()[0]
    assert isinstance(hello, SendMessage) and hello.text
    server.initiate(0.0)
    server.receive_text(hello.message, 0.0)
    server.receive_text(hello.message, 0.0)
    assert server.state is State.CLOSED
    assert server.closed is not None and server.closed.code == "UNEXPECTED_MESSAGE"


def test_correlation_fields_round_trip_through_the_core() -> None:
    client, server = pair()
    received: list[Message] = []
    client.send({"q": 1}, 1.0, request_id="7")
    pump(client, server, 1.0, received)
    assert received[-1].request_id == "7" and received[-1].reply_to is None
    server.send("part", 1.0, reply_to="7", more=True)
    server.send("last", 1.0, reply_to="7")
    answers: list[Message] = []
    pump(server, client, 1.0, answers)
    assert [(m.text, m.reply_to, m.more) for m in answers] == [("part", "7", True), ("last", "7", False)]
    with pytest.raises(EncodeError, match="binary=False"):
        client.send("x", 1.0, binary=True, request_id="8")


@pytest.mark.parametrize("size", [60_000, 200_000])  # under and over CONTROL_MESSAGE_LIMIT (64 KiB)
def test_a_message_nested_too_deeply_is_malformed_at_any_size(size: int) -> None:
    """Stop 28's attack run (a hostile NATS worker): a message over 64 KiB nested ~100,000 levels
    deep raised RecursionError out of receive_text (the size check reads its type first, and
    msgspec skips nested values recursively): the session failed as an internal error, with a
    traceback in the log. A small one was already refused as MALFORMED_MESSAGE; now both are."""
    c, s = pair()
    drain(c), drain(s)
    depth = size // 2
    message = b'{"type":"DATA","session_id":"' + s.session_id.encode() + b'","payload":' + b"[" * depth
    assert s.receive_text(message + b"]" * depth + b"}", 1.0) is None
    closing = texts(s)
    assert [m["type"] for m in closing] == ["CLOSE"]
    assert closing[0]["payload"]["reason"] == "MALFORMED_MESSAGE"
    assert "nested too deeply" in closing[0]["payload"]["message"]


@pytest.mark.parametrize("algorithm", [Algorithm.NONE, Algorithm.TOKENNATIVE])
def test_a_closing_session_told_to_discard_data_drops_it_undecoded(algorithm: Algorithm) -> None:
    """discard_data() (the shell's, once a closing session's inbox is full) drops DATA, text or
    binary, without decoding it; the peer's CLOSE acknowledgement still ends the close. It has
    no effect before our CLOSE."""
    c, s = pair(cfg(algorithms=(algorithm,)), cfg(algorithms=(algorithm,)))
    drain(c), drain(s)
    s.discard_data()  # established: nothing changes
    received: list[Message] = []
    c.send("before", 0.0, algorithm=algorithm)
    pump(c, s, received=received)
    s.close(0.0)
    s.discard_data()
    c.send("after", 0.0, algorithm=algorithm)  # before c sees the CLOSE: DATA in flight
    c.send("after", 0.0, algorithm=algorithm)
    pump(c, s, received=received)
    assert [m.text for m in received] == ["before"]
    pump(s, c)  # our CLOSE; c acknowledges
    c.acknowledge_close()
    pump(c, s)
    assert s.state is State.CLOSED and s.closed is not None and s.closed.code == "NORMAL"


def test_internal_error_tells_the_peer_and_closes_the_transport_with_1011() -> None:
    """A message the shell failed to process ends the session and tells the peer why (stop 33:
    the peer saw only a lost connection), without the cause's text, which is ours."""
    c, s = pair()
    pump(c, s)
    pump(s, c)
    drain(c), drain(s)
    c.internal_error(RuntimeError("secret detail"))
    (closed,) = drain(c)
    assert isinstance(closed, Closed) and closed.code == "INTERNAL_ERROR" and not closed.by_peer
    assert isinstance(closed.error, SessionClosed) and isinstance(closed.error.__cause__, RuntimeError)
    out = c.data_to_send()
    first = out[0]
    assert isinstance(first, SendMessage) and first.text and isinstance(first.message, bytes)
    close = json.loads(first.message)
    assert close["type"] == "CLOSE" and close["payload"]["reason"] == "INTERNAL_ERROR"
    assert "secret" not in close["payload"]["message"]
    assert out[-1] == CloseTransport(1011, "INTERNAL_ERROR")
    assert s.receive_text(first.message, 0.0) is None
    s.transport_closed()  # the 1011 that follows
    (peer,) = [e for e in drain(s) if isinstance(e, Closed)]
    assert peer.by_peer and peer.code == "INTERNAL_ERROR"


def test_internal_error_while_closing_sends_no_second_close() -> None:
    c, s = pair()
    drain(c), drain(s)
    c.close(1.0, "bye")
    (close,) = texts(c)
    assert close["type"] == "CLOSE"
    c.internal_error(RuntimeError("late"))
    out = c.data_to_send()
    assert out == [CloseTransport(1011, "INTERNAL_ERROR")]  # the old code: a second CLOSE first
