"""Session-context zstd in the sans-I/O session: negotiation, both wire forms, limits, resets."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import zstandard

from m2mwire.codecs import Algorithm
from m2mwire.codecs.zstdcontext import (
    DEFAULT_WINDOW,
    MAX_WINDOW,
    ZSTD_HISTORY_KIND,
    ZSTD_KIND,
    ZstdDictionary,
)
from m2mwire.errors import LimitExceeded, ProtocolError
from m2mwire.session.config import ZstdOptions, make_config
from m2mwire.session.core import SessionProtocol
from m2mwire.session.events import Closed
from m2mwire.session.outputs import SendMessage
from m2mwire.session.payload import Message
from m2mwire.session.states import Role, State
from m2mwire.session.zstdstate import MAX_ENVELOPE
from m2mwire.workloads import workload
from tests.session.test_core import cfg, drain, pair, pump

A = Algorithm
ZSTD_ALGS = (A.ZSTD, A.BROTLI, A.TOKENNATIVE, A.NONE)


def exchange(c: SessionProtocol, s: SessionProtocol, steps: list[tuple[str, Any]]) -> list[Message]:
    got: list[Message] = []
    for sender, content in steps:
        src, dst = (c, s) if sender == "client" else (s, c)
        src.send(content, 1.0)
        pump(src, dst, 1.0, got)
    return got


def test_zstd_negotiated_by_default_with_the_default_window() -> None:
    c, s = pair()
    assert A.ZSTD in c.info.algorithms and c.info.algorithms == s.info.algorithms  # type: ignore[union-attr]
    assert c.info.zstd_window == s.info.zstd_window == DEFAULT_WINDOW  # type: ignore[union-attr]


def test_window_is_the_smaller_offer_and_on_the_wire() -> None:
    c = SessionProtocol(Role.CLIENT, cfg(zstd=ZstdOptions(window=MAX_WINDOW)))
    s = SessionProtocol(Role.SERVER, cfg(zstd=ZstdOptions(window=64 * 1024)))
    c.initiate(0.0)
    s.initiate(0.0)
    hello = json.loads(c.data_to_send()[0].message)  # type: ignore[union-attr,arg-type]
    assert hello["payload"]["compression"]["zstd"] == {
        "window": MAX_WINDOW,
        "binary": True,
        "dictionaries": [],
        "history": True,
    }
    s.receive_text(json.dumps(hello), 0.0)
    accept = json.loads(s.data_to_send()[0].message)  # type: ignore[union-attr,arg-type]
    assert accept["payload"]["compression"]["zstd"]["window"] == 64 * 1024
    c.receive_text(json.dumps(accept), 0.0)
    assert c.info is not None and s.info is not None
    assert c.info.zstd_window == s.info.zstd_window == 64 * 1024


def test_peer_without_zstd_ignores_it() -> None:
    # A HELLO from a peer that does not know zstd (no algorithm, no compression.zstd object).
    c, s = pair(cfg(algorithms=(A.BROTLI, A.NONE)), cfg())
    assert c.info is not None and A.ZSTD not in c.info.algorithms and c.info.zstd_window == 0
    c.send("x" * 300, 1.0)
    got: list[Message] = []
    pump(c, s, 1.0, got)
    assert got[0].algorithm == "brotli"


@pytest.mark.parametrize("name", ["multi_turn", "agent_loop", "streaming"])
def test_workload_round_trips_in_binary_form(name: str) -> None:
    c, s = pair(cfg(algorithms=ZSTD_ALGS), cfg(algorithms=ZSTD_ALGS))
    steps = workload(name)
    got = exchange(c, s, steps)
    assert [m.value if m.kind == "json" else m.text for m in got] == [content for _, content in steps]
    assert {m.algorithm for m in got} == {"zstd"} and all(m.binary for m in got)
    original = sum(m.original_bytes for m in got)
    wire = sum(m.wire_bytes for m in got)
    assert wire < 0.2 * original  # the context sees the resent history


def test_text_form_when_the_peer_asks_for_it() -> None:
    text_only = cfg(algorithms=ZSTD_ALGS, zstd=ZstdOptions(binary=False))
    c, s = pair(text_only, cfg(algorithms=ZSTD_ALGS))
    steps = workload("agent_loop")[:6]
    sent_forms = []
    got: list[Message] = []
    for sender, content in steps:
        src, dst = (c, s) if sender == "client" else (s, c)
        src.send(content, 1.0, algorithm=A.ZSTD)
        outs = src.data_to_send()
        sent_forms.append((sender, outs[0].binary))  # type: ignore[union-attr]
        for out in outs:
            assert isinstance(out, SendMessage)
            m = dst.receive_text(out.message, 1.0) if out.text else dst.receive_binary(out.message[0], 1.0)  # type: ignore[arg-type]
            assert m is not None
            got.append(m)
    # The server sends text (the client asked for it); the client may send binary.
    assert all(binary for sender, binary in sent_forms if sender == "client")
    assert not any(binary for sender, binary in sent_forms if sender == "server")
    assert [m.value for m in got] == [content for _, content in steps]
    assert all(m.algorithm == "zstd" for m in got)


def test_text_form_prefix_on_the_wire() -> None:
    c, s = pair(cfg(algorithms=ZSTD_ALGS, zstd=ZstdOptions(binary=False)), cfg(algorithms=ZSTD_ALGS))
    s.send("hello " * 50, 1.0, algorithm=A.ZSTD)
    (out,) = s.data_to_send()
    envelope = json.loads(out.message)  # type: ignore[union-attr,arg-type]
    assert envelope["payload"]["algorithm"] == "zstd" and envelope["payload"]["content"].startswith("#ZS|")


def test_optimize_tokens_never_picks_zstd() -> None:
    c, s = pair(cfg(algorithms=ZSTD_ALGS, optimize="tokens"), cfg(algorithms=ZSTD_ALGS))
    sent = c.send({"messages": [{"role": "user", "content": "hi " * 100}]}, 1.0)
    assert sent.algorithm != "zstd"


def test_without_zstd_negotiated_explicit_zstd_is_refused() -> None:
    c, _ = pair(cfg(algorithms=(A.BROTLI,)), cfg())
    with pytest.raises(Exception, match="not negotiated"):
        c.send("x", 1.0, algorithm=A.ZSTD)


def violation(p: SessionProtocol) -> ProtocolError:
    closed = [e for e in drain(p) if e.__class__.__name__ == "Closed"]
    assert p.state is State.CLOSED and closed
    err = closed[-1].error
    assert isinstance(err, ProtocolError)
    return err


@pytest.mark.parametrize("history", [False, True])
def test_frame_asking_for_more_than_the_agreed_window_is_refused(history: bool) -> None:
    limit = 256 * 1024
    zstd = ZstdOptions(history=history)
    c, s = pair(
        cfg(algorithms=ZSTD_ALGS, max_payload=limit, zstd=zstd),
        cfg(algorithms=ZSTD_ALGS, max_payload=limit, zstd=zstd),
    )
    # A one-shot frame of 64 MiB of zeros declares a 64 MiB window (decoder memory): refused up front.
    zeros = zstandard.ZstdCompressor(level=19).compress(b"\0" * (64 << 20))
    assert len(zeros) < 8192
    head = bytes([ZSTD_HISTORY_KIND, 0]) if history else bytes([ZSTD_KIND])  # header 0: count 0, continue
    assert s.receive_binary(head + b"\0\0\0\0" + zeros, 2.0) is None
    err = violation(s)
    assert err.code == "INVALID_DATA" and "memory" in str(err)


def test_bomb_inside_a_valid_stream_is_refused() -> None:
    # A bomb in the real context of the session (what a hostile peer running our code could send).
    limit = 128 * 1024
    c, s = pair(cfg(algorithms=ZSTD_ALGS, max_payload=limit), cfg(algorithms=ZSTD_ALGS, max_payload=limit))
    assert c._zstd is not None
    frame = c._zstd.encode_binary(
        c._zstd.envelope("text"), "A" * (32 << 20)
    )  # 32 MiB through the client's context
    assert len(frame) < 16 * 1024
    assert s.receive_binary(frame, 1.0) is None
    closed = [e for e in drain(s) if isinstance(e, Closed)]
    assert s.state is State.CLOSED and closed[-1].code == "MESSAGE_TOO_BIG"
    assert isinstance(closed[-1].error, LimitExceeded) and "over the limit of 131072" in closed[-1].reason
    assert "zstd" in closed[-1].reason


def test_corrupted_frame_ends_the_session_with_a_clear_error() -> None:
    c, s = pair(cfg(algorithms=ZSTD_ALGS), cfg(algorithms=ZSTD_ALGS))
    steps = workload("multi_turn")
    c.send(steps[0][1], 1.0)
    pump(c, s, 1.0, [])
    c.send(steps[2][1], 1.0)
    (out,) = c.data_to_send()
    frame = bytearray(out.message[0])  # type: ignore[union-attr,index]
    frame[len(frame) // 2] ^= 0x01  # one flipped bit in the middle of the zstd bytes
    assert s.receive_binary(bytes(frame), 2.0) is None
    err = violation(s)
    assert err.code == "INVALID_DATA" and "zstd" in str(err)


def test_missing_message_is_detected() -> None:
    c, s = pair(cfg(algorithms=ZSTD_ALGS), cfg(algorithms=ZSTD_ALGS))
    steps = workload("multi_turn")
    c.send(steps[0][1], 1.0)
    c.data_to_send()  # lost: never delivered
    c.send(steps[2][1], 1.0)
    pump(c, s, 1.0, [])
    err = violation(s)
    assert err.code == "INVALID_DATA" and "zstd" in str(err)


def test_reordered_messages_are_detected() -> None:
    c, s = pair(cfg(algorithms=ZSTD_ALGS), cfg(algorithms=ZSTD_ALGS))
    steps = workload("multi_turn")
    c.send(steps[0][1], 1.0)
    c.send(steps[2][1], 1.0)
    first, second = c.data_to_send()
    assert s.receive_binary(second.message[0], 1.0) is None  # type: ignore[union-attr,index,arg-type]
    assert violation(s).code == "INVALID_DATA"


@pytest.mark.parametrize("history", [False, True])
def test_reset_on_both_ends_resynchronises_and_starts_a_new_frame(history: bool) -> None:
    zstd = ZstdOptions(history=history)
    c, s = pair(cfg(algorithms=ZSTD_ALGS, zstd=zstd), cfg(algorithms=ZSTD_ALGS, zstd=zstd))
    steps = workload("agent_loop")
    got = exchange(c, s, steps[:4])
    c.reset_codec_state()
    s.reset_codec_state()
    c.send(steps[4][1], 1.0)
    (out,) = c.data_to_send()
    start = 6 if history else 5  # kind byte, (header: count 0 since the reset,) CRC-32
    assert out.message[0][start : start + 4] == b"\x28\xb5\x2f\xfd"  # type: ignore[union-attr,index]
    got.append(s.receive_binary(out.message[0], 1.0))  # type: ignore[union-attr,index,arg-type,arg-type]
    assert got[-1] is not None and got[-1].value == steps[4][1]


def test_reset_on_one_end_only_fails_clearly() -> None:
    c, s = pair(cfg(algorithms=ZSTD_ALGS), cfg(algorithms=ZSTD_ALGS))
    steps = workload("agent_loop")
    exchange(c, s, steps[:2])
    c.reset_codec_state()
    c.send(steps[2][1], 1.0)
    pump(c, s, 1.0, [])
    assert violation(s).code == "INVALID_DATA"


def test_shared_dictionary_negotiated_and_used() -> None:
    events = [content for _, content in workload("json_events")]
    samples = [json.dumps(event, separators=(",", ":")).encode() for event in events[1:]]  # not the one sent
    trained = ZstdDictionary(zstandard.train_dictionary(16 * 1024, samples).as_bytes())
    other = ZstdDictionary(b"another dictionary " * 100)
    c, s = pair(
        cfg(algorithms=ZSTD_ALGS, zstd=ZstdOptions(dictionaries=(other, trained))),
        cfg(algorithms=ZSTD_ALGS, zstd=ZstdOptions(dictionaries=(trained,))),
    )
    assert c.info is not None and s.info is not None
    assert c.info.zstd_dictionary == s.info.zstd_dictionary == trained.id
    first = workload("json_events")[0][1]
    with_dict = s.send(first, 1.0)
    got: list[Message] = []
    pump(s, c, 1.0, got)
    assert got[0].value == first
    plain_c, plain_s = pair(cfg(algorithms=ZSTD_ALGS), cfg(algorithms=ZSTD_ALGS))
    without = plain_s.send(first, 1.0)
    assert with_dict.wire_bytes < 0.7 * without.wire_bytes  # the first message profits


def test_accept_naming_an_unknown_dictionary_is_refused() -> None:
    c = SessionProtocol(Role.CLIENT, cfg(algorithms=ZSTD_ALGS))
    c.initiate(0.0)
    c.data_to_send()
    accept = {
        "type": "ACCEPT",
        "session_id": "s1",
        "payload": {
            "version": "3.0",
            "agent_id": "x",
            "agent_type": "y",
            "compression": {"algorithms": ["zstd"], "zstd": {"window": 65536, "dictionaries": ["ab" * 32]}},
        },
        "timestamp": 0,
    }
    c.receive_text(json.dumps(accept), 0.0)
    assert c.state is State.CLOSED


def test_content_near_max_payload_falls_back_or_raises_before_touching_the_context() -> None:
    limit = 4096
    c, s = pair(cfg(algorithms=ZSTD_ALGS, max_payload=limit), cfg(algorithms=ZSTD_ALGS, max_payload=limit))
    content = "".join(chr(0x41 + (i * 7919) % 26) for i in range(limit - 10))
    with pytest.raises(LimitExceeded, match="algorithm='brotli'"):
        c.send(content, 1.0, algorithm=A.ZSTD)
    assert c.data_to_send() == []
    sent = c.send(content, 1.0)  # automatic: another algorithm
    assert sent.algorithm != "zstd"
    c.send("and the context is still in step " * 10, 1.0)
    got: list[Message] = []
    pump(c, s, 1.0, got)
    assert [m.algorithm for m in got][-1] == "zstd" and got[
        -1
    ].text == "and the context is still in step " * 10


def test_make_config_takes_a_dict_and_validates() -> None:
    config = make_config({"zstd": {"window": 2 * DEFAULT_WINDOW, "level": 1}})
    assert config.zstd == ZstdOptions(window=2 * DEFAULT_WINDOW, level=1)
    with pytest.raises(Exception, match="power of two"):
        make_config({"zstd": {"window": 3000}})
    with pytest.raises(Exception, match="power of two"):
        make_config({"zstd": {"window": 2 * MAX_WINDOW}})
    assert replace(config.zstd, dictionaries=(b"raw dictionary content",)).dictionaries[0].id


def test_hello_naming_zstd_without_parameters_gets_the_defaults() -> None:
    s = SessionProtocol(Role.SERVER, cfg(algorithms=ZSTD_ALGS, zstd=ZstdOptions(window=MAX_WINDOW)))
    s.initiate(0.0)
    hello = {
        "type": "HELLO",
        "payload": {
            "version": "3.0",
            "agent_id": "other",
            "agent_type": "third-implementation",
            "compression": {"algorithms": ["zstd", "none"], "max_payload": 0},
        },
        "timestamp": 0,
    }
    s.receive_text(json.dumps(hello), 0.0)
    assert s.info is not None and s.info.zstd_window == DEFAULT_WINDOW and s.info.zstd_dictionary == ""
    accept = json.loads(s.data_to_send()[0].message)  # type: ignore[union-attr,arg-type]
    assert accept["payload"]["compression"]["zstd"] == {
        "window": DEFAULT_WINDOW,
        "binary": True,
        "dictionaries": [],
        "history": False,  # the HELLO did not offer shared history: today's per-direction contexts
    }


def test_automatic_text_form_leaves_tiny_messages_to_the_usual_rules() -> None:
    c, s = pair(cfg(algorithms=ZSTD_ALGS, zstd=ZstdOptions(binary=False)), cfg(algorithms=ZSTD_ALGS))
    assert s.send("ok", 1.0).algorithm == "none"  # base64 of a payload would be longer than "ok"
    assert s.send("a longer message " * 10, 1.0).algorithm == "zstd"
    got: list[Message] = []
    pump(s, c, 1.0, got)
    assert [m.text for m in got] == ["ok", "a longer message " * 10]


def test_zstd_frames_without_zstd_negotiated_are_violations() -> None:
    c, s = pair(cfg(algorithms=(A.BROTLI, A.NONE)), cfg())
    drain(s)
    assert s.receive_binary(b"Z\0\0\0\0\x28\xb5\x2f\xfd", 1.0) is None
    assert violation(s).code == "MALFORMED_MESSAGE"
    c2, s2 = pair(cfg(algorithms=(A.BROTLI, A.NONE)), cfg())
    c2.send("#ZS|AAAAAA==", 1.0, algorithm=A.BROTLI)
    out = c2.data_to_send()[0].message
    assert isinstance(out, bytes)
    forged = json.loads(out)
    forged["payload"]["content"] = "#ZS|AAAAAA=="
    drain(s2)
    assert s2.receive_text(json.dumps(forged), 1.0) is None
    assert violation(s2).code == "INVALID_DATA"


def _forge(c: SessionProtocol, inner: bytes) -> bytes:
    """A binary zstd message with ``inner`` as its decompressed bytes, in c's real context."""
    assert c._zstd is not None
    return c._zstd._compress(inner, c._zstd._kind_byte)


def test_another_implementations_envelope_spelling_is_read() -> None:
    c, s = pair(cfg(algorithms=ZSTD_ALGS), cfg(algorithms=ZSTD_ALGS))
    sid = s.session_id
    envelope = {
        "session_id": sid,
        "type": "DATA",
        "payload": {"content_type": "json", "algorithm": "zstd", "content": ""},
        "timestamp": 1,
    }
    message = s.receive_binary(_forge(c, json.dumps(envelope).encode() + b'\n{"a": [1, 2]}'), 1.0)
    assert message is not None and message.kind == "json" and message.value == {"a": [1, 2]}


def test_wrong_session_and_bad_utf8_inside_the_context_are_violations() -> None:
    c, s = pair(cfg(algorithms=ZSTD_ALGS), cfg(algorithms=ZSTD_ALGS))
    other = b'{"type":"DATA","session_id":"someone-else","payload":{"algorithm":"zstd","content":""}}\nhi'
    assert s.receive_binary(_forge(c, other), 1.0) is None
    assert violation(s).code == "UNKNOWN_SESSION"
    c, s = pair(cfg(algorithms=ZSTD_ALGS), cfg(algorithms=ZSTD_ALGS))
    assert c._zstd is not None
    bad = c._zstd._envelopes["text"] + b"\xff\xfe"
    assert s.receive_binary(_forge(c, bad), 1.0) is None
    err = violation(s)
    assert err.code == "INVALID_DATA" and "UTF-8" in str(err)
    c, s = pair(cfg(algorithms=ZSTD_ALGS), cfg(algorithms=ZSTD_ALGS))
    assert s.receive_binary(_forge(c, b'{"type":"PING"}\n'), 1.0) is None
    assert violation(s).code == "INVALID_DATA"


@pytest.mark.parametrize("binary", [True, False])
def test_request_fields_travel_in_both_forms(binary: bool) -> None:
    c, s = pair(cfg(algorithms=ZSTD_ALGS, zstd=ZstdOptions(binary=binary)), cfg(algorithms=ZSTD_ALGS))
    trace = {"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"}
    s.send({"q": "x" * 200}, 1.0, request_id="1f", trace=trace)
    got: list[Message] = []
    pump(s, c, 1.0, got)
    c.send({"a": 1}, 1.0, reply_to="1f", more=True)
    c.send("plain", 1.0)
    pump(c, s, 1.0, got)
    request, answer, plain = got
    assert request.algorithm == "zstd" and request.binary is binary
    assert request.request_id == "1f" and request.traceparent == trace["traceparent"]
    assert answer.reply_to == "1f" and answer.more and answer.value == {"a": 1}
    assert plain.request_id is None and plain.reply_to is None and plain.text == "plain"


def test_token_stats_count_binary_zstd_as_its_text_form() -> None:
    c, s = pair(cfg(algorithms=ZSTD_ALGS, token_stats=True), cfg(algorithms=ZSTD_ALGS, token_stats=True))
    sent = c.send({"messages": [{"role": "user", "content": "count me " * 30}]}, 1.0)
    pump(c, s, 1.0, [])
    assert sent.binary and sent.original_tokens and sent.wire_tokens
    assert s.stats.original_tokens_received == sent.original_tokens
    assert s.stats.wire_tokens_received == sent.wire_tokens


@pytest.mark.parametrize("binary", [True, False])
def test_edge_contents_round_trip_in_both_forms(binary: bool) -> None:
    c, s = pair(cfg(algorithms=ZSTD_ALGS, zstd=ZstdOptions(binary=binary)), cfg(algorithms=ZSTD_ALGS))
    contents: list[Any] = [
        "",
        "日本語のテキスト 👋🏽 " * 20,
        "#TK|C|sk0L/Q4A",
        "line\nfeeds\n",
        {"k": "é" * 300},
        [],
    ]
    got: list[Message] = []
    for content in contents:
        s.send(content, 1.0, algorithm=A.ZSTD)
        pump(s, c, 1.0, got)
    assert [m.value if m.kind == "json" else m.text for m in got] == contents
    assert all(m.algorithm == "zstd" and m.binary is binary for m in got)


# -- shared history (docs/CODECS.md section 8, "Shared history") -----------------------------------


def _multi_turn_wire(c: SessionProtocol, s: SessionProtocol) -> tuple[int, int, set[int]]:
    """(content bytes, wire bytes, first bytes of the binary frames) of the multi-turn chat."""
    steps = workload("multi_turn")
    kinds: set[int] = set()
    original = wire = 0
    for sender, content in steps:
        src, dst = (c, s) if sender == "client" else (s, c)
        original += src.send(content, 1.0).original_bytes
        for out in src.data_to_send():
            assert isinstance(out, SendMessage) and not out.text
            frame = bytes(out.message[0])
            kinds.add(frame[0])
            wire += len(frame)
            got = dst.receive_binary(frame, 1.0)
            assert got is not None and got.value == content
    return original, wire, kinds


def test_shared_history_is_negotiated_by_default_and_pays() -> None:
    c, s = pair(cfg(algorithms=ZSTD_ALGS), cfg(algorithms=ZSTD_ALGS))
    assert c.info is not None and s.info is not None and c.info.zstd_history and s.info.zstd_history
    original, shared, kinds = _multi_turn_wire(c, s)
    assert kinds == {ZSTD_HISTORY_KIND}
    off = ZstdOptions(history=False)
    c, s = pair(cfg(algorithms=ZSTD_ALGS, zstd=off), cfg(algorithms=ZSTD_ALGS))
    assert c.info is not None and not c.info.zstd_history
    _, per_direction, kinds = _multi_turn_wire(c, s)
    assert kinds == {ZSTD_KIND}
    assert shared < 0.8 * per_direction and shared < 0.08 * original  # the issue's 8 % goal


def _without_history(message: str) -> str:
    """The HELLO or ACCEPT an older peer sends: compression.zstd has no "history" field."""
    envelope = json.loads(message)
    del envelope["payload"]["compression"]["zstd"]["history"]
    return json.dumps(envelope)


@pytest.mark.parametrize("old", ["client", "server"])
def test_an_older_peer_gets_todays_per_direction_contexts(old: str) -> None:
    # The older server is ours with history off (the per-direction code is today's), its ACCEPT
    # stripped of the field; the older client, ours with the field stripped from its HELLO.
    server_zstd = ZstdOptions(history=old != "server")
    c = SessionProtocol(Role.CLIENT, cfg(algorithms=ZSTD_ALGS))
    s = SessionProtocol(Role.SERVER, cfg(algorithms=ZSTD_ALGS, zstd=server_zstd))
    c.initiate(0.0)
    s.initiate(0.0)
    hello = c.data_to_send()[0].message
    assert isinstance(hello, bytes)
    s.receive_text(_without_history(hello) if old == "client" else hello, 0.0)
    accept = s.data_to_send()[0].message
    assert isinstance(accept, bytes)
    if old == "server":
        accept = _without_history(accept)
    elif old == "client":
        assert json.loads(accept)["payload"]["compression"]["zstd"]["history"] is False
    c.receive_text(accept, 0.0)
    assert c.info is not None and s.info is not None
    assert not c.info.zstd_history and not s.info.zstd_history
    _, _, kinds = _multi_turn_wire(c, s)
    assert kinds == {ZSTD_KIND}  # 0x5A, header-less payloads: what an older peer reads


@pytest.mark.parametrize("history", [True, False])
def test_an_envelope_line_past_max_envelope_is_refused_before_it_is_parsed(history: bool) -> None:
    """A ~600-byte message whose envelope decompressed to 16 MiB of spaces cost ~35 ms to copy,
    hash and parse, and the decode budget (which counts content) charged nothing: 724 KB held a
    server's core for 35 s (stop 33's attack run). Envelopes are bounded (MAX_ENVELOPE)."""
    zopts = ZstdOptions(history=history)
    c, s = pair(cfg(algorithms=ZSTD_ALGS, zstd=zopts), cfg(algorithms=ZSTD_ALGS, zstd=zopts))
    assert c._zstd is not None
    envelope = c._zstd.envelope("text")
    at_limit = envelope[:-2] + b" " * (MAX_ENVELOPE - len(envelope)) + b"}\n"
    assert len(at_limit) == MAX_ENVELOPE
    message = s.receive_binary(c._zstd.encode_binary(at_limit, "x"), 1.0)  # the longest allowed
    assert message is not None and message.text == "x"
    padded = envelope[:-2] + b" " * (1 << 20) + b"}\n"
    frame = c._zstd.encode_binary(padded, "x")
    assert len(frame) < 1024
    assert s.receive_binary(frame, 1.0) is None
    err = violation(s)
    assert err.code == "INVALID_DATA" and f"longer than {MAX_ENVELOPE} bytes" in str(err)
