"""Issue 11 in the sans-I/O core: what a peer can make a session hold, parse, echo or log is bounded,
and a peer's CLOSE waits for the replies the application owes."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any

import pytest

from m2mwire.codecs import Encoding
from m2mwire.errors import LimitExceeded, SessionClosed, SessionTimeout
from m2mwire.session.config import CONTROL_MESSAGE_LIMIT, SessionConfig, Timers, transport_limit
from m2mwire.session.core import SessionProtocol
from m2mwire.session.events import Closed, closed_error
from m2mwire.session.outputs import CloseTransport, SendMessage
from m2mwire.session.payload import Message, queued_cost
from m2mwire.session.states import Role, State


def cfg(**kw: Any) -> SessionConfig:
    return replace(SessionConfig(encodings=(Encoding.CL100K,)), **kw)


def pump(src: SessionProtocol, dst: SessionProtocol, now: float = 0.0) -> list[Message]:
    received = []
    for out in src.data_to_send():
        if isinstance(out, SendMessage):
            if out.text:
                message = dst.receive_text(out.message, now)
            else:  # binary: zstd context messages (zstd is offered by default), TokenNative, AVP
                message = dst.receive_binary(b"".join(bytes(b) for b in out.message), now)
            if message is not None:
                received.append(message)
    return received


def pair(client: SessionConfig | None = None, server: SessionConfig | None = None) -> tuple[Any, Any]:
    c = SessionProtocol(Role.CLIENT, client or cfg())
    s = SessionProtocol(Role.SERVER, server or cfg())
    c.initiate(0.0)
    s.initiate(0.0)
    pump(c, s)
    pump(s, c)
    c.next_event(), s.next_event()
    return c, s


def closed(p: SessionProtocol) -> Closed:
    events = []
    while (e := p.next_event()) is not None:
        events.append(e)
    (event,) = [e for e in events if isinstance(e, Closed)]
    return event


def envelope(kind: str, sid: str | None, payload: Any) -> str:
    return json.dumps({"type": kind, "session_id": sid, "payload": payload, "timestamp": 1})


def data(sid: str | None, text: str) -> str:
    payload = {"algorithm": "none", "content": text, "original_size": len(text), "content_type": "text"}
    return envelope("DATA", sid, payload)


# -- control messages have their own bound, DATA the negotiated one --------------------------------


def test_transport_limit_lets_control_messages_through_a_small_max_payload() -> None:
    assert transport_limit(100) == CONTROL_MESSAGE_LIMIT
    assert transport_limit(16 * 2**20) == 16 * 2**20
    assert transport_limit(0) == 0  # unlimited stays unlimited


def test_data_over_the_negotiated_max_payload_is_refused_by_the_session() -> None:
    # The channel accepts up to CONTROL_MESSAGE_LIMIT, so the session checks DATA itself.
    c, s = pair(cfg(max_payload=1000), cfg(max_payload=1000))
    assert s.receive_text(data(s.session_id, "x" * 2000), 1.0) is None
    event = closed(s)
    assert event.code == "MESSAGE_TOO_BIG" and isinstance(event.error, LimitExceeded)
    assert isinstance(s.data_to_send()[-1], CloseTransport)


def test_binary_over_the_negotiated_max_payload_is_refused_by_the_session() -> None:
    _, s = pair(cfg(max_payload=1000), cfg(max_payload=1000))
    assert s.receive_binary(b"\x00" * 2000, 1.0) is None
    assert closed(s).code == "MESSAGE_TOO_BIG"


def test_a_control_message_over_its_bound_is_refused_before_parsing() -> None:
    _, s = pair()
    big_ping = envelope("PING", s.session_id, {"pad": "p" * (CONTROL_MESSAGE_LIMIT + 10)})
    assert s.receive_text(big_ping, 1.0) is None
    event = closed(s)
    assert event.code == "MESSAGE_TOO_BIG" and "control messages are limited" in event.reason
    # ... while DATA of the same size is fine
    _, s2 = pair()
    message = s2.receive_text(data(s2.session_id, "d" * (CONTROL_MESSAGE_LIMIT + 10)), 1.0)
    assert message is not None and message.original_bytes == CONTROL_MESSAGE_LIMIT + 10


def test_a_hello_with_too_many_names_is_rejected_briefly() -> None:
    s = SessionProtocol(Role.SERVER, cfg())
    s.initiate(0.0)
    caps = {"algorithms": [f"alg-{i}" for i in range(500)], "max_payload": 0}
    hello = envelope(
        "HELLO", None, {"version": "3.0", "agent_id": "a", "agent_type": "t", "compression": caps}
    )
    s.receive_text(hello, 0.1)
    (reject,) = [o.message for o in s.data_to_send() if isinstance(o, SendMessage)]
    assert isinstance(reject, bytes) and len(reject) < 600
    assert json.loads(reject)["payload"]["code"] == "MESSAGE_TOO_BIG"


def test_peer_text_is_never_echoed_in_bulk() -> None:
    s = SessionProtocol(Role.SERVER, cfg())
    s.initiate(0.0)
    caps = {"algorithms": ["x" * 20_000], "max_payload": 0}
    hello = envelope(
        "HELLO", None, {"version": "9" * 20_000, "agent_id": "a", "agent_type": "t", "compression": caps}
    )
    s.receive_text(hello, 0.1)
    (reject,) = [o.message for o in s.data_to_send() if isinstance(o, SendMessage)]
    assert isinstance(reject, bytes) and len(reject) < 1000, len(reject)
    c, s = pair()
    huge = envelope("CLOSE", c.session_id, {"reason": "R" * 50_000, "message": "M" * 50_000})
    s.receive_text(huge, 1.0)
    s.acknowledge_close()
    event = closed(s)
    assert len(event.code) < 300 and len(event.reason) < 300


def test_unknown_types_are_logged_at_a_bounded_rate(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="m2mwire.session")
    _, s = pair()
    for i in range(1000):
        s.receive_text(envelope("ODD" + "x" * 500, s.session_id, {}), 1.0 + i * 0.001)
    s.receive_text(envelope("ODD", s.session_id, {}), 20.0)  # later: logged again, with the count
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and all(len(m) < 500 for m in messages)
    assert "999 similar warnings suppressed" in messages[1]


# -- a peer's CLOSE lets the application finish -------------------------------------------------------


def test_after_the_peers_close_replies_go_out_before_the_acknowledgement() -> None:
    c, s = pair()
    c.send("question", 1.0)
    c.close(1.0)
    received = pump(c, s, 1.0)
    assert [m.text for m in received] == ["question"]
    assert s.state is State.CLOSE_RECEIVED and s.closed is None
    s.send("answer", 1.1)  # the reply the application owes
    s.acknowledge_close()
    replies = pump(s, c, 1.2)
    assert [m.text for m in replies] == ["answer"]
    assert c.state is State.CLOSED and closed(c).error is None
    assert s.state is State.CLOSED and closed(s).by_peer


def test_the_acknowledgement_is_sent_at_half_the_close_timeout_at_the_latest() -> None:
    timers = Timers(close_timeout=4.0)
    c, s = pair(cfg(timers=timers), cfg(timers=timers))
    c.close(10.0)
    pump(c, s, 10.0)
    assert s.next_deadline() == 12.0  # well before the client gives up at 14.0
    s.handle_timer(12.0)
    pump(s, c, 12.0)
    assert c.state is State.CLOSED and closed(c).error is None


def test_an_error_close_from_the_peer_is_not_a_clean_end() -> None:
    c, s = pair()
    s.close(1.0, "the handler failed", code="INTERNAL_ERROR")
    pump(s, c, 1.0)
    c.acknowledge_close()
    event = closed(c)
    assert event.code == "INTERNAL_ERROR" and isinstance(event.error, SessionClosed)
    pump(c, s, 1.1)  # the acknowledgement: the server closes the transport with 1011
    (close,) = [o for o in s.data_to_send() if isinstance(o, CloseTransport)]
    assert (close.code, close.reason) == (1011, "INTERNAL_ERROR")


# -- liveness and queue accounting -------------------------------------------------------------------


def test_a_stalled_write_ends_the_session_with_a_timeout() -> None:
    _, s = pair()
    s.write_stalled(30.0)
    event = closed(s)
    assert event.code == "WRITE_TIMEOUT" and isinstance(event.error, SessionTimeout)
    with pytest.raises(SessionTimeout):
        s.send("after", 2.0)  # what recv() raises, too
    assert type(closed_error(event)) is SessionTimeout


def test_closed_error_is_a_fresh_exception_without_traceback() -> None:
    _, s = pair()
    s.write_stalled(1.0)
    event = closed(s)
    first, second = closed_error(event), closed_error(event)
    assert first is not second and first is not event.error
    assert str(first) == str(event.error) and first.__traceback__ is None


def test_queued_cost_is_the_decoded_cost() -> None:
    parsed = Message(
        kind="json", algorithm="none", binary=False, wire_bytes=10, original_bytes=10, decoded_bytes=240
    )
    assert queued_cost(parsed) == 240
    # built without the decoder's figure: the larger of decoded and wire size
    small = Message(kind="text", algorithm="brotli", binary=False, wire_bytes=10, original_bytes=1000)
    avp = Message(kind="avp", algorithm="avp", binary=True, wire_bytes=500, original_bytes=100)
    assert queued_cost(small) == 1000 and queued_cost(avp) == 500


def test_received_messages_carry_their_decoded_cost_into_the_queue_bound() -> None:
    c, s = pair()
    c.send({"items": [{} for _ in range(1000)]}, 1.0)
    (message,) = pump(c, s, 1.0)
    assert queued_cost(message) == message.decoded_bytes > 4 * message.original_bytes
