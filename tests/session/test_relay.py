"""What a relay (the gateway) sees of the session it carries: session/relay.py, with real
HELLO/ACCEPT exchanges from the session core."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from m2mwire.schemas.messages import AckPayload, MessageType, decode_message, encode_message
from m2mwire.session.config import CONTROL_MESSAGE_LIMIT, SessionConfig
from m2mwire.session.core import SessionProtocol
from m2mwire.session.outputs import SendMessage
from m2mwire.session.relay import (
    CLOSE_MAX,
    Answer,
    Opening,
    before_hello,
    is_close,
    resumed_session,
    server_answer,
)
from m2mwire.session.states import Role


def _texts(protocol: SessionProtocol) -> list[bytes]:
    out = []
    for message in protocol.data_to_send():
        assert isinstance(message, SendMessage) and message.text and isinstance(message.message, bytes)
        out.append(message.message)
    return out


def _handshake(*, resume: bool) -> tuple[bytes, bytes]:
    """A client's HELLO and the server's ACCEPT, as the core writes them."""
    client = SessionProtocol(Role.CLIENT, SessionConfig(resume=resume, max_payload=123_456))
    server = SessionProtocol(Role.SERVER, SessionConfig(resume=resume))
    client.initiate(0.0)
    server.initiate(0.0)
    (hello,) = _texts(client)
    server.receive_text(hello, 0.0)
    (accept,) = _texts(server)
    return hello, accept


def test_before_the_hello_pings_are_answered_and_what_a_server_ignores_is_dropped() -> None:
    step, pong = before_hello(encode_message(MessageType.PING, session_id="s1"), True)
    assert step is Opening.ANSWER and pong is not None
    answer = decode_message(pong)
    assert answer.type is MessageType.PONG and answer.session_id == "s1"
    for silent in (
        encode_message(MessageType.PONG),
        encode_message(MessageType.ACK, AckPayload(received=0)),
        b'{"type":"SOMETHING_NEW"}',
    ):
        assert before_hello(silent, True) == (Opening.DROP, None)
    hello, _ = _handshake(resume=False)
    assert before_hello(hello, True) == (Opening.RELAY, None)
    # What the server will refuse goes to it, so that it answers as it would directly.
    for refused in (encode_message(MessageType.PING), b"not json", b"\xff\xfe"):
        assert before_hello(refused, False) == (Opening.RELAY, None)  # binary
    assert before_hello(b"not json", True) == (Opening.RELAY, None)
    assert before_hello(b"\xff\xfe", True) == (Opening.RELAY, None)  # invalid UTF-8
    oversized_ping = encode_message(MessageType.PING)[:-1] + b" " * CONTROL_MESSAGE_LIMIT + b"}"
    assert before_hello(oversized_ping, True) == (Opening.RELAY, None)


def test_the_session_a_hello_resumes() -> None:
    hello, _ = _handshake(resume=True)
    assert resumed_session(hello, True) is None  # a new session offers resume, resumes nothing
    body = json.loads(hello)
    body["payload"]["resume"].update(session_id="s-42", token="t", received=3)
    assert resumed_session(json.dumps(body).encode(), True) == "s-42"
    assert resumed_session(encode_message(MessageType.PING), True) is None


def test_the_servers_answer() -> None:
    for keepalive in (MessageType.PING, MessageType.PONG):
        assert server_answer(encode_message(keepalive), True) is None
    hello, accept = _handshake(resume=False)
    assert server_answer(accept, True) == Answer(123_456, None)
    _, accept = _handshake(resume=True)
    answer = server_answer(accept, True)
    assert answer is not None and answer.max_payload == 123_456
    assert answer.resumable == decode_message(accept).session_id is not None
    reject = encode_message(MessageType.REJECT, session_id="x")
    assert server_answer(reject, True) == Answer(None, None)
    assert server_answer(b"\x00binary", False) == Answer(None, None)


def test_a_close_is_seen_however_it_is_spelled_and_nothing_else_is() -> None:
    close = encode_message(MessageType.CLOSE, session_id="s1")
    assert is_close(close, True)
    assert is_close(close.replace(b'"CLOSE"', b'"CL\\u004fSE"'), True)
    assert is_close(close.replace(b'"type"', b'"typ\\u0065"'), True)
    assert not is_close(close, False)  # a binary frame is never a CLOSE
    data = json.dumps({"type": "DATA", "payload": {"content": '"CLOSE" \\u0043'}}).encode()
    assert not is_close(data, True)
    assert not is_close(close[:-1] + b" " * CLOSE_MAX + b"}", True)  # not parsed on the hot path


@given(st.sets(st.integers(0, 4), min_size=1))
def test_any_escaped_letters_of_close_are_seen(escaped: set[int]) -> None:
    spelled = "".join(f"\\u{ord(c):04x}" if i in escaped else c for i, c in enumerate("CLOSE"))
    message = encode_message(MessageType.CLOSE).replace(b'"CLOSE"', f'"{spelled}"'.encode())
    assert decode_message(message).type is MessageType.CLOSE
    assert is_close(message, True)
