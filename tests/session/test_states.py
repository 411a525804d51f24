"""The (role, state) table of expected messages, walked: every message type in every reachable
state gets what docs/PROTOCOL.md §3 says (accepted, ignored, or the violation's code)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from m2mwire.codecs import Encoding, compress_binary
from m2mwire.errors import ProtocolError
from m2mwire.schemas.codes import SessionCode
from m2mwire.schemas.messages import (
    AckPayload,
    ClosePayload,
    DataPayload,
    MessageType,
    Rejection,
    encode_data,
    encode_message,
)
from m2mwire.session.config import SessionConfig
from m2mwire.session.core import SessionProtocol
from m2mwire.session.events import Closed
from m2mwire.session.outputs import CloseTransport, SendMessage
from m2mwire.session.states import BINARY, SILENT_BEFORE_HELLO, Inbound, Role, State, expected

SID = "00000000-0000-4000-8000-000000000000"
KINDS: list[Inbound] = [*MessageType, BINARY]
# The codes of a message arriving when it may not (§3 "Rules"); other codes are the handlers' own.
ORDER_CODES = {
    SessionCode.UNEXPECTED_MESSAGE,
    SessionCode.DATA_BEFORE_HELLO,
    SessionCode.DATA_BEFORE_ACCEPT,
    SessionCode.BINARY_BEFORE_ACCEPT,
}


def cfg(**kw: Any) -> SessionConfig:
    return replace(SessionConfig(encodings=(Encoding.CL100K,)), **kw)


def deliver(src: SessionProtocol, dst: SessionProtocol) -> None:
    for out in src.data_to_send():
        if isinstance(out, SendMessage):
            assert out.text  # the handshake and control messages are text
            dst.receive_text(out.message, 1.0)


def client_hello() -> str:
    c = SessionProtocol(Role.CLIENT, cfg())
    c.initiate(0.0)
    (out,) = c.data_to_send()
    assert isinstance(out, SendMessage) and out.text
    return out.message


def server_accept() -> str:
    s = SessionProtocol(Role.SERVER, cfg())
    s.initiate(0.0)
    s.receive_text(client_hello(), 0.0)
    (out,) = s.data_to_send()
    assert isinstance(out, SendMessage) and out.text
    return out.message


def established(client_cfg: SessionConfig | None = None) -> tuple[SessionProtocol, SessionProtocol]:
    c, s = SessionProtocol(Role.CLIENT, client_cfg or cfg()), SessionProtocol(Role.SERVER, cfg())
    c.initiate(0.0)
    s.initiate(0.0)
    deliver(c, s)
    deliver(s, c)
    assert c.state is s.state is State.ESTABLISHED
    return c, s


def closing(role: Role) -> SessionProtocol:
    c, s = established()
    p = c if role is Role.CLIENT else s
    p.close(1.0)
    return p


def close_received(role: Role) -> SessionProtocol:
    c, s = established()
    p, peer = (c, s) if role is Role.CLIENT else (s, c)
    peer.close(1.0)
    deliver(peer, p)
    assert p.state is State.CLOSE_RECEIVED
    return p


def closed(role: Role) -> SessionProtocol:
    p = close_received(role)
    p.acknowledge_close()
    return p


def new_server(admission: bool = False) -> SessionProtocol:
    s = SessionProtocol(Role.SERVER, cfg(), admission=admission)
    s.initiate(0.0)
    return s


def verdict_pending() -> SessionProtocol:
    s = new_server(admission=True)
    s.receive_text(client_hello(), 0.0)
    return s


def hello_sent() -> SessionProtocol:
    c = SessionProtocol(Role.CLIENT, cfg())
    c.initiate(0.0)
    return c


def resuming(then_close: bool = False) -> SessionProtocol:
    c, _ = established(cfg(resume=True))
    assert c.resume is not None
    c.transport_closed(now=1.0)
    c.begin_resume(1.0)
    if then_close:
        c.close(1.0)
    return c


# Every reachable (role, state) and the two handshakes inside a state: (name, build, role, state,
# a HELLO awaiting the admission verdict, a resuming HELLO awaiting its answer).
SITUATIONS: list[tuple[str, Callable[[], SessionProtocol], Role, State, bool, bool]] = [
    ("server INITIAL", new_server, Role.SERVER, State.INITIAL, False, False),
    ("server INITIAL, verdict pending", verdict_pending, Role.SERVER, State.INITIAL, True, False),
    ("client INITIAL", lambda: SessionProtocol(Role.CLIENT, cfg()), Role.CLIENT, State.INITIAL, False, False),
    ("client HELLO_SENT", hello_sent, Role.CLIENT, State.HELLO_SENT, False, False),
    ("server ESTABLISHED", lambda: established()[1], Role.SERVER, State.ESTABLISHED, False, False),
    ("client ESTABLISHED", lambda: established()[0], Role.CLIENT, State.ESTABLISHED, False, False),
    ("client ESTABLISHED, resuming", resuming, Role.CLIENT, State.ESTABLISHED, False, True),
    ("client CLOSING, resuming", lambda: resuming(True), Role.CLIENT, State.CLOSING, False, True),
    ("server CLOSING", lambda: closing(Role.SERVER), Role.SERVER, State.CLOSING, False, False),
    ("client CLOSING", lambda: closing(Role.CLIENT), Role.CLIENT, State.CLOSING, False, False),
    (
        "server CLOSE_RECEIVED",
        lambda: close_received(Role.SERVER),
        Role.SERVER,
        State.CLOSE_RECEIVED,
        False,
        False,
    ),
    (
        "client CLOSE_RECEIVED",
        lambda: close_received(Role.CLIENT),
        Role.CLIENT,
        State.CLOSE_RECEIVED,
        False,
        False,
    ),
    ("server CLOSED", lambda: closed(Role.SERVER), Role.SERVER, State.CLOSED, False, False),
    ("client CLOSED", lambda: closed(Role.CLIENT), Role.CLIENT, State.CLOSED, False, False),
]


def documented(role: Role, state: State, pending: bool, resuming: bool, kind: Inbound) -> str:
    """docs/PROTOCOL.md §3, written out: "accepted", "ignored" or the violation's code."""
    if state is State.CLOSED:
        return "ignored"
    if kind in (MessageType.PING, MessageType.PONG, MessageType.CLOSE):
        return "accepted"  # PING is answered in every state; CLOSE is acknowledged
    live = state in (State.ESTABLISHED, State.CLOSING)  # DATA after our CLOSE is still delivered
    if kind is MessageType.ACK:
        return "accepted" if live else "ignored"
    if kind is MessageType.DATA or kind == BINARY:
        if live:
            return "accepted"
        if state is State.CLOSE_RECEIVED:  # DATA was answered DATA_BEFORE_HELLO/ACCEPT here
            return SessionCode.UNEXPECTED_MESSAGE
        if kind == BINARY:
            return SessionCode.BINARY_BEFORE_ACCEPT
        return SessionCode.DATA_BEFORE_HELLO if role is Role.SERVER else SessionCode.DATA_BEFORE_ACCEPT
    if kind is MessageType.HELLO:
        ok = role is Role.SERVER and state is State.INITIAL and not pending
    else:  # ACCEPT, REJECT: the answers to a client's HELLO, a resuming one included
        ok = role is Role.CLIENT and (state is State.HELLO_SENT or resuming)
    return "accepted" if ok else SessionCode.UNEXPECTED_MESSAGE


def wire(kind: Inbound, session_id: str) -> str | bytes:
    if kind == BINARY:
        return compress_binary("hi")
    if kind is MessageType.HELLO:
        return client_hello()
    if kind is MessageType.ACCEPT:
        return server_accept()
    if kind is MessageType.REJECT:
        return encode_message(MessageType.REJECT, Rejection(code="RATE_LIMITED", message="full"))
    if kind is MessageType.DATA:
        return encode_data(DataPayload(algorithm="none", content="hi"), session_id)
    payloads = {MessageType.ACK: AckPayload(received=0), MessageType.CLOSE: ClosePayload(reason="NORMAL")}
    return encode_message(MessageType(kind), payloads.get(MessageType(kind)), session_id=session_id)


CASES = [(*situation, kind) for situation in SITUATIONS for kind in KINDS]


@pytest.mark.parametrize(
    ("name", "build", "role", "state", "pending", "resuming", "kind"),
    CASES,
    ids=[f"{case[0]}: {case[-1]}" for case in CASES],
)
def test_every_message_in_every_state(
    name: str,
    build: Callable[[], SessionProtocol],
    role: Role,
    state: State,
    pending: bool,
    resuming: bool,
    kind: Inbound,
    caplog: pytest.LogCaptureFixture,
) -> None:
    p = build()
    assert (p.role, p.state) == (role, state), name
    p.data_to_send()
    while p.next_event() is not None:
        pass
    want = documented(role, state, pending, resuming, kind)
    assert (kind in expected(role, state, verdict_pending=pending, resuming=resuming)) == (want == "accepted")

    data = wire(kind, p.session_id or SID)
    with caplog.at_level(logging.WARNING, logger="m2mwire.session"):
        if kind == BINARY:
            p.receive_binary(data, 2.0)
        else:
            p.receive_text(data, 2.0)
    outputs = p.data_to_send()
    events = []
    while (event := p.next_event()) is not None:
        events.append(event)
    ends = [e for e in events if isinstance(e, Closed)]
    codes = {getattr(e.error, "code", None) for e in ends}

    if want == "ignored":
        assert (outputs, events, p.state) == ([], [], state)
        if state is not State.CLOSED:
            assert "ignoring ACK" in caplog.text
    elif want == "accepted":
        assert not codes & ORDER_CODES, codes
    else:
        (end,) = ends
        assert isinstance(end.error, ProtocolError) and end.error.code == want and p.state is State.CLOSED
        texts = [json.loads(o.message) for o in outputs if isinstance(o, SendMessage) and o.text]
        if role is Role.SERVER and state is State.INITIAL:
            (answer,) = texts  # no session yet: a REJECT naming the code
            assert answer["type"] == "REJECT" and answer["payload"]["code"] == "UNKNOWN"
            assert answer["payload"]["message"].startswith(f"{want}: ")
        elif state is not State.INITIAL:
            (answer,) = texts
            assert answer["type"] == "CLOSE" and answer["payload"]["reason"] == want
        else:
            assert texts == []  # a client that has not said HELLO has no one to tell
        assert [o for o in outputs if isinstance(o, CloseTransport)] == [CloseTransport(1002, want)]


@pytest.mark.parametrize("kind", [*MessageType, None], ids=lambda k: k.value if k else "unknown type")
def test_what_a_server_takes_silently_before_a_hello(kind: MessageType | None) -> None:
    """SILENT_BEFORE_HELLO (which a gateway routing by the HELLO looks past) is exactly what a
    fresh server's core answers with nothing and survives."""
    s = new_server()
    unknown = json.dumps({"type": "NOT_A_TYPE", "session_id": SID, "payload": {}})
    s.receive_text(unknown if kind is None else wire(kind, SID), 1.0)
    silent = not s.data_to_send() and s.state is State.INITIAL and s.closed is None
    assert silent == (kind in SILENT_BEFORE_HELLO), (kind, s.state)
