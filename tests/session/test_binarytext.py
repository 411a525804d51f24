"""Text DATA in binary form (kind 'T', session/binarytext.py): negotiation, the wire, and a
differential test against the JSON text form it replaces."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from m2mwire.codecs import Algorithm
from m2mwire.codecs.select import is_prefix_like
from m2mwire.errors import EncodeError
from m2mwire.schemas.messages import DataPayload, encode_data_bytes
from m2mwire.session.binarytext import BINARY_TEXT_KIND, BINARY_TEXT_MIN
from m2mwire.session.core import SessionProtocol
from m2mwire.session.outputs import SendMessage
from m2mwire.session.payload import Message
from m2mwire.session.states import Role
from tests.session.test_core import cfg, drain, pair, pump
from tests.session.test_zstd_session import violation

A = Algorithm
BIG = "x" * BINARY_TEXT_MIN


def one_out(p: SessionProtocol) -> SendMessage:
    (out,) = p.data_to_send()
    assert isinstance(out, SendMessage)
    return out


def test_negotiated_when_both_offer_it_and_on_the_wire() -> None:
    c, s = pair()
    assert c.info is not None and s.info is not None
    assert c.info.binary_text and s.info.binary_text
    for offers in ((True, False), (False, True)):
        c, s = pair(cfg(binary_text=offers[0]), cfg(binary_text=offers[1]))
        assert c.info is not None and s.info is not None
        assert not c.info.binary_text and not s.info.binary_text
        c.send(BIG, 1.0, algorithm=A.NONE)
        assert one_out(c).text  # JSON text, as with a peer that never heard of the form


def test_hello_and_accept_carry_the_flag() -> None:
    c = SessionProtocol(Role.CLIENT, cfg())
    s = SessionProtocol(Role.SERVER, cfg())
    c.initiate(0.0)
    s.initiate(0.0)
    hello = json.loads(one_out(c).message)  # type: ignore[arg-type]
    assert hello["payload"]["binary_text"] is True
    s.receive_text(json.dumps(hello), 0.0)
    accept = json.loads(one_out(s).message)  # type: ignore[arg-type]
    assert accept["payload"]["binary_text"] is True
    del hello["payload"]["binary_text"]  # a peer that does not know it
    s2 = SessionProtocol(Role.SERVER, cfg())
    s2.initiate(0.0)
    s2.receive_text(json.dumps(hello), 0.0)
    assert "binary_text" not in json.loads(one_out(s2).message)["payload"]  # type: ignore[arg-type]


def test_large_text_goes_as_kind_t_with_its_envelope_line_and_raw_content() -> None:
    c, s = pair()
    text = 'a "quoted" \\ line\nand more ' + "é" * BINARY_TEXT_MIN
    sent = c.send(text, 1.0, algorithm=A.NONE)
    out = one_out(c)
    assert not out.text and sent.binary and sent.algorithm == "none"
    (frame,) = out.message
    assert isinstance(frame, bytes) and frame[0] == BINARY_TEXT_KIND
    line, _, content = frame[1:].partition(b"\n")
    assert json.loads(line) == {
        "type": "DATA",
        "session_id": c.info.session_id,  # type: ignore[union-attr]
        "payload": {"algorithm": "none", "content": "", "content_type": "text"},
    }
    assert content == text.encode()  # no escaping: the quote, backslash and line feed as they are
    assert sent.wire_bytes == len(frame)
    got = s.receive_binary(frame, 1.0)
    assert got is not None and got.text == text and got.binary and got.algorithm == "none"
    assert got.original_bytes == len(text.encode()) and got.wire_bytes == len(frame)


def test_small_text_and_other_algorithms_keep_their_forms() -> None:
    c, s = pair()
    c.send("x" * (BINARY_TEXT_MIN - 1), 1.0, algorithm=A.NONE)
    assert one_out(c).text
    c.send(BIG, 1.0, algorithm=A.BROTLI)
    assert json.loads(one_out(c).message)["payload"]["algorithm"] == "brotli"  # type: ignore[arg-type]
    # automatic selection: binary form only where it would have chosen none
    c2, _ = pair(cfg(algorithms=(A.NONE,)), cfg(algorithms=(A.NONE,)))
    assert c2.send(BIG, 1.0).binary


# Texts around the threshold with everything JSON must escape, and contents for JSON messages.
_texts = st.text(min_size=0, max_size=40).map(lambda t: t * (BINARY_TEXT_MIN // max(len(t), 1) + 1))
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    content=st.one_of(_texts, st.text(max_size=50), _json.map(lambda v: {"v": v, "pad": "p" * 1100})),
    correlation=st.sampled_from(["plain", "request", "reply", "stream", "traced"]),
)
def test_binary_form_delivers_exactly_what_the_json_text_form_delivers(
    content: Any, correlation: str
) -> None:
    """The fast path (binary form) against the general one (JSON text): the same Message fields
    at every size, plain DATA and requests, answers and stream parts with their fields.

    One difference is by design: uncompressed JSON text that starts like an M2M prefix
    (``#M2M...``) is refused, since a receiver decodes such content, while the binary form
    carries the text as it is (nothing in it is read as a prefix)."""
    got: dict[bool, Message] = {}
    for binary_text in (True, False):
        c, s = pair(cfg(binary_text=binary_text), cfg(binary_text=binary_text))
        kw: dict[str, Any] = {
            "plain": {},
            "request": {"request_id": "r-1"},
            "reply": {"reply_to": "r-1"},
            "stream": {"reply_to": "r-2", "more": True},
            "traced": {
                "request_id": "r-3",
                "trace": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
            },
        }[correlation]
        text = (
            content
            if isinstance(content, str)
            else json.dumps(content, separators=(",", ":"), ensure_ascii=False)
        )
        if is_prefix_like(text) and not (binary_text and len(text.encode()) >= BINARY_TEXT_MIN):
            with pytest.raises(EncodeError, match="looks like an M2M prefix"):
                c.send(content, 1.0, algorithm=A.NONE, **kw)
            if binary_text:
                return  # small: the JSON text form for both, refused by both
            assert got[True].text == text  # the binary form carried it as it is
            return
        c.send(content, 1.0, algorithm=A.NONE, **kw)
        out = one_out(c)
        assert out.text is (not binary_text or len(text.encode()) < BINARY_TEXT_MIN)
        received: list[Message] = []
        pump_one(out, s, received)
        (got[binary_text],) = received
    fast, general = got[True], got[False]
    for field in ("kind", "algorithm", "text", "value", "original_bytes", "request_id", "reply_to", "more"):
        assert getattr(fast, field) == getattr(general, field), field
    assert fast.traceparent == general.traceparent and fast.tracestate == general.tracestate


def pump_one(out: SendMessage, dst: SessionProtocol, received: list[Message]) -> None:
    m = dst.receive_text(out.message, 1.0) if out.text else dst.receive_binary(out.message[0], 1.0)  # type: ignore[arg-type]
    assert m is not None, drain(dst)
    received.append(m)


def _frame(session_id: str, payload: DataPayload, content: bytes) -> bytes:
    return bytes((BINARY_TEXT_KIND,)) + encode_data_bytes(payload, session_id) + b"\n" + content


@pytest.mark.parametrize(
    ("build", "code", "words"),
    [
        (
            lambda sid: _frame(sid, DataPayload(algorithm="none", content=""), b"\xff\xfe"),
            "INVALID_DATA",
            "UTF-8",
        ),
        (lambda sid: _frame(sid, DataPayload(algorithm="none", content="x"), b"y"), "INVALID_DATA", "empty"),
        (
            lambda sid: _frame(sid, DataPayload(algorithm="brotli", content=""), b"y"),
            "INVALID_DATA",
            "'none'",
        ),
        (lambda sid: bytes((BINARY_TEXT_KIND,)) + b'{"type":"DATA"}' * 10, "INVALID_DATA", "line feed"),
        (
            lambda sid: _frame("s-other", DataPayload(algorithm="none", content=""), b"y"),
            "UNKNOWN_SESSION",
            "s-other",
        ),
        (lambda sid: bytes((BINARY_TEXT_KIND,)) + b'{"type":"PING"}\ny', "INVALID_DATA", "DATA"),
    ],
)
def test_a_broken_binary_text_message_ends_the_session_with_a_clear_error(
    build: Any, code: str, words: str
) -> None:
    c, s = pair()
    drain(s)
    assert s.receive_binary(build(c.info.session_id), 1.0) is None  # type: ignore[union-attr]
    err = violation(s)
    assert err.code == code and words in str(err), str(err)


def test_kind_t_without_the_form_negotiated_is_a_violation() -> None:
    c, s = pair(cfg(binary_text=False), cfg(binary_text=False))
    drain(s)
    frame = _frame(c.info.session_id, DataPayload(algorithm="none", content=""), b"hello")  # type: ignore[union-attr]
    assert s.receive_binary(frame, 1.0) is None
    assert violation(s).code == "MALFORMED_MESSAGE"


def test_resume_counts_a_binary_text_message_alike_on_both_ends() -> None:
    c, s = pair(cfg(resume=True, resume_buffer_bytes=8 * BINARY_TEXT_MIN), cfg())
    assert c.resume is not None and s.resume is not None
    received: list[Message] = []
    for i in range(20):
        c.send(f"{i}:" + BIG, 1.0, algorithm=A.NONE)
        pump(c, s, 1.0, received)
        pump(s, c, 1.0)
    assert [m.text for m in received] == [f"{i}:" + BIG for i in range(20)]
    assert all(m.binary for m in received)
    # the ACKs released what the server counted: nothing is retained beyond the last eighth
    assert c.resume.sent == 20 and c.resume.retained_bytes < BINARY_TEXT_MIN * 2
