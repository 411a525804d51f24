"""docs/PROTOCOL.md's statements about closing, REJECT, close codes and ``avp``, checked on the core.

Another implementation is written from that document; when the code changes, these fail until the
document says the same.
"""

from __future__ import annotations

import json
from typing import Any

from m2mwire.session.config import SessionConfig, make_config
from m2mwire.session.core import SessionProtocol
from m2mwire.session.outputs import CloseTransport, SendMessage
from m2mwire.session.states import Role, State
from tests.session.test_core import IDENT


def sent(p: SessionProtocol) -> tuple[list[dict[str, Any]], list[CloseTransport]]:
    texts, closes = [], []
    for out in p.data_to_send():
        if isinstance(out, CloseTransport):
            closes.append(out)
        elif isinstance(out, SendMessage) and out.text:
            texts.append(json.loads(out.message))
    return texts, closes


def handshake(client: SessionConfig, server: SessionConfig) -> tuple[SessionProtocol, SessionProtocol]:
    c, s = SessionProtocol(Role.CLIENT, client), SessionProtocol(Role.SERVER, server)
    c.initiate(0.0)
    s.initiate(0.0)
    (hello,) = [o.message for o in c.data_to_send() if isinstance(o, SendMessage)]
    assert isinstance(hello, bytes)
    s.receive_text(hello, 0.0)
    for out in s.data_to_send():
        assert isinstance(out, SendMessage) and out.text
        c.receive_text(out.message, 0.0)
    return c, s


def test_orderly_close_payloads_and_who_closes_the_websocket() -> None:
    c, s = handshake(make_config({}), make_config({}))
    c.close(1.0)
    (close,), no_close = sent(c)
    assert close["payload"] == {"reason": "NORMAL", "message": ""} and no_close == []  # waits for the ack
    s.receive_text(json.dumps(close), 1.0)
    # The acknowledgement waits until the application is done with what came before the CLOSE.
    assert s.state is State.CLOSE_RECEIVED and sent(s) == ([], [])
    s.acknowledge_close()
    (ack,), (server_close,) = sent(s)
    assert ack["payload"] == {"reason": "NORMAL", "message": "acknowledged"}
    assert (server_close.code, server_close.reason) == (1000, "NORMAL")  # the acknowledger closes
    c.receive_text(json.dumps(ack), 1.0)
    assert sent(c) == ([], [CloseTransport(1000, "NORMAL")])  # and so does the initiator
    assert c.state is s.state is State.CLOSED


def test_reference_close_payload_reads_as_normal() -> None:
    c, s = handshake(make_config({}), make_config({}))
    s.receive_text(json.dumps({"type": "CLOSE", "session_id": s.session_id, "payload": {}}), 1.0)
    s.acknowledge_close()
    assert s.closed is not None and s.closed.code == "NORMAL"


def test_binary_before_hello_is_a_reject_unknown_and_1002() -> None:
    s = SessionProtocol(Role.SERVER, make_config({}))
    s.initiate(0.0)
    s.receive_binary(b"\x00\x01", 0.0)
    (reject,), (close,) = sent(s)
    assert reject["type"] == "REJECT" and "session_id" not in reject
    assert reject["payload"]["code"] == "UNKNOWN"
    assert reject["payload"]["message"].startswith("BINARY_BEFORE_ACCEPT: ")
    assert (close.code, close.reason) == (1002, "BINARY_BEFORE_ACCEPT")


def test_negotiation_reject_closes_with_1000() -> None:
    s = SessionProtocol(Role.SERVER, make_config({"algorithms": ["brotli"]}))
    c = SessionProtocol(Role.CLIENT, make_config({"algorithms": ["none"]}))
    c.initiate(0.0)
    s.initiate(0.0)
    (hello,) = [o.message for o in c.data_to_send() if isinstance(o, SendMessage)]
    assert isinstance(hello, bytes)
    s.receive_text(hello, 0.0)
    (reject,), (close,) = sent(s)
    assert reject["payload"]["code"] == "NO_COMMON_ALGORITHM"
    assert (close.code, close.reason) == (1000, "NO_COMMON_ALGORITHM")


def test_avp_frame_on_a_json_session_is_mode_violation() -> None:
    c, s = handshake(make_config({}), make_config({}))
    s.receive_binary(b"AV\x01\x00", 1.0)
    (close,), (transport,) = sent(s)
    assert close["type"] == "CLOSE" and close["payload"]["reason"] == "MODE_VIOLATION"
    assert (transport.code, transport.reason) == (1002, "MODE_VIOLATION")


def test_avp_objects_and_preferred_encoding_in_hello_and_accept() -> None:
    client = SessionProtocol(Role.CLIENT, make_config({"identity": IDENT, "encodings": ["o200k_base"]}))
    client.initiate(0.0)
    (hello,), _ = sent(client)
    every_member = {**IDENT.to_dict(), "tokenizer_hash": ""}  # sent even when empty
    assert hello["payload"]["avp"] == {"identity": every_member}
    assert hello["payload"]["compression"]["preferred_encoding"] == "O200kBase"
    bare = SessionProtocol(Role.CLIENT, make_config({}))
    bare.initiate(0.0)
    (bare_hello,), _ = sent(bare)
    assert bare_hello["payload"]["avp"] == {}

    server = SessionProtocol(Role.SERVER, make_config({"identity": IDENT}))
    server.initiate(0.0)
    server.receive_text(json.dumps(hello), 0.0)
    (accept,), _ = sent(server)
    assert accept["payload"]["avp"] == {"identity": every_member, "mode": "LATENT", "reason": "hash_match"}
    compression = accept["payload"]["compression"]
    assert compression["encodings"] == ["O200kBase"] and compression["preferred_encoding"] == "O200kBase"

    plain = SessionProtocol(Role.SERVER, make_config({}))
    plain.initiate(0.0)
    plain.receive_text(json.dumps(bare_hello), 0.0)
    (plain_accept,), _ = sent(plain)
    assert plain_accept["payload"]["avp"] == {"mode": "JSON", "reason": "no_identity"}
