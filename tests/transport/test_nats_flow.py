"""The NATS channel's window protocol without I/O (m2mwire/transport/nats/flow.py, frames.py)."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st

from m2mwire.transport.nats import frames as f
from m2mwire.transport.nats.flow import DUPLICATE, GAP, JOIN_BELOW, OVER_CREDIT, TAKE, Receiver, Sender
from m2mwire.transport.nats.options import nats_connect_kwargs, parse_nats_url


def test_receiver_takes_only_the_next_sequence_number() -> None:
    r = Receiver(1000)
    assert r.check(1, 10) == TAKE and r.check(2, 10) == TAKE
    assert r.check(2, 10) == DUPLICATE  # a resend of something we have
    assert r.check(4, 10) == GAP  # 3 was lost; 4 is dropped and everything after 2 asked again
    assert r.last_in_order == 2
    assert r.check(3, 10) == TAKE and r.check(4, 10) == TAKE
    assert r.received == 40  # dropped messages are not counted


def test_receiver_refuses_a_message_past_the_credit_it_announced() -> None:
    r = Receiver(1000)
    assert r.check(1, 600) == TAKE
    assert r.check(2, 401) == OVER_CREDIT  # 1001 > the 1000 granted
    assert r.last_in_order == 1 and r.received == 600
    assert r.check(2, 400) == TAKE  # exactly the limit is within it
    assert r.consume(1000) == 2000  # consumed: the limit moves on, and so may the sender
    assert r.check(3, 1000) == TAKE and r.check(4, 1) == OVER_CREDIT


def test_a_sender_within_its_credit_never_goes_over_at_the_receiver() -> None:
    receiver = Receiver(1000)
    sender = Sender(receiver.granted, receiver.window)
    for cost in (300, 300, 400, 50, 950, 1, 999):
        while not sender.has_credit(cost):
            limit = receiver.consume(receiver.received - receiver.consumed)
            assert limit is not None
            sender.on_credit(receiver.last_in_order, limit)
        assert receiver.check(sender.take(cost), cost) == TAKE


def test_credit_moves_by_quarters_of_the_window() -> None:
    r = Receiver(1000)
    assert r.consume(100) is None and r.consume(100) is None
    assert r.consume(50) == 1250  # a quarter consumed: consumed + window
    assert r.consume(249) is None and r.consume(1) == 1500


def test_sender_waits_for_credit_and_releases_what_was_acknowledged() -> None:
    s = Sender(300, 300)
    for cost in (100, 100, 100):
        assert s.has_credit(cost)
        s.take(cost)
        s.retain(b"x" * cost)
    assert not s.has_credit(1) and s.retained_bytes == 300
    assert s.on_credit(2, 500)  # seq 1 and 2 acknowledged, 200 more allowed
    assert s.oldest_unacked == 3 and s.payloads() == [(b"x" * 100, b"")] and s.retained_bytes == 100
    assert s.has_credit(200) and not s.has_credit(201)
    assert not s.on_credit(2, 400)  # an older, lower limit never shrinks the window


@pytest.mark.parametrize("size", [10, 157, 1000])
def test_what_a_sender_retains_costs_about_what_it_is_charged(size: int) -> None:
    """The agreed window bounds retention in credit cost (payload + MESSAGE_COST per message),
    and the memory held should be near that. Stop 31's attack run measured ~24 MiB of RSS per
    channel against an 8 MiB window with 157-byte messages: each message kept a tuple, a
    sequence number, a memoryview and a (seq, sent) pair beside its payload, 3.2x its cost at
    157 bytes and 7.2x at 10 (tracemalloc, as here)."""
    sender = Sender(1 << 40, 1 << 40)
    messages = [("a" * size + str(i))[-size:] for i in range(5000)]
    charged = 0
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for message in messages:  # as NatsChannel.send_now takes and retains a text message
            body = memoryview(message.encode())
            cost = f.HEADER.size + body.nbytes + f.MESSAGE_COST
            head = f.HEADER.pack(f.TEXT, sender.take(cost))
            sender.retain(head, body)
            charged += cost
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held <= 1.5 * charged, (held, charged)
    assert sender.payloads()[-1] == (f.HEADER.pack(f.TEXT, 5000) + messages[-1].encode(), b"")
    assert sender.on_credit(4999, 0) and sender.oldest_unacked == 5000 and len(sender.unacked) == 1


def test_a_large_payload_is_retained_by_reference() -> None:
    sender = Sender(1 << 40, 1 << 40)
    body = memoryview(bytes(JOIN_BELOW))
    head = f.HEADER.pack(f.BINARY, sender.take(len(body) + 10 + f.MESSAGE_COST))
    sender.retain(head, body)
    assert sender.payloads() == [(head, body)] and sender.payloads()[0][1] is body
    assert sender.retained_bytes == len(head) + len(body)


@pytest.mark.parametrize("limit", [10_000, 2**64 - 1])
def test_a_sender_keeps_at_most_the_agreed_window_unacknowledged_whatever_credit_it_gets(limit: int) -> None:
    """Stop 28's attack run: a peer that announced a window of 2**64 - 1 (or granted that much
    credit) and never acknowledged made a worker send, and keep for a resend, all it was asked
    for (800 MiB for a 1 KB request). The agreed window bounds what is unacknowledged."""
    s = Sender(limit, 1000)
    sent = 0
    while s.has_credit(100) and sent < 100_000:  # bounded: the old code sent the whole 100 KB
        s.take(100)
        s.retain(b"x" * 90)
        sent += 100
    assert sent == 1000 and s.retained_bytes == 900
    s.on_credit(0, 2**64 - 1)  # all the credit there is, and no acknowledgement
    assert not s.has_credit(100)
    assert s.on_credit(4, 0)  # four acknowledged: room for four more, though the limit is old
    assert s.has_credit(400) and not s.has_credit(401)


def test_a_narrowed_receiver_acknowledges_often_enough_for_the_agreed_window() -> None:
    """The client announces its own window in OPEN before it knows the worker's; when the
    worker's is smaller, both use the smaller. The client's initial grant stays (a grant is never
    taken back), but its CREDITs, with their acknowledgements, come every quarter of the agreed
    window consumed: a sender held back by that window is never left waiting for one."""
    receiver = Receiver(8000)  # the client's own window, announced in OPEN
    receiver.narrow(1000)  # the worker's, from OPEN_OK
    sender = Sender(8000, 1000)  # the worker: the client's grant, the agreed window
    credits = 0
    for cost in (300, 300, 400, 50, 950, 1, 999, 250, 250, 250, 250, 600):
        while not sender.has_credit(cost):
            limit = receiver.consume(receiver.received - receiver.consumed)
            assert limit is not None  # consumed since the last CREDIT: one is due
            credits += 1
            sender.on_credit(receiver.last_in_order, limit)
        assert receiver.check(sender.take(cost), cost) == TAKE
    assert credits >= 4 and receiver.granted == 8000  # the grant never went below the first one


def test_a_receiver_narrowed_after_consuming_announces_at_once() -> None:
    """A worker may send before its OPEN_OK reaches the client, whose receiver then consumes with
    its own, larger window (no CREDIT yet). Narrowing says a CREDIT is due: without it the
    worker, held back by the agreed window, waited for its 1 s question (seen in a test)."""
    receiver = Receiver(8000)
    assert receiver.consume(1500) is None  # less than a quarter of 8000
    assert receiver.narrow(1000) == 8000  # more than a quarter of 1000: acknowledge now
    assert receiver.narrow(1000) is None  # and only once
    assert Receiver(8000).narrow(1000) is None  # nothing consumed: nothing to say


def test_a_peers_close_reason_is_read_up_to_reason_max() -> None:
    """A hostile worker's ABORT with a 1 MB reason reached the client's TransportError whole
    (stop 28); a reason is read up to REASON_MAX bytes, ours are cut to it when packed."""
    code, reason = f.unpack_close(f.HEADER.pack(f.ABORT, 0) + (1002).to_bytes(2, "big") + b"x" * 1_000_000)
    assert code == 1002 and reason == "x" * f.REASON_MAX + "... (1000000 bytes)"
    assert f.unpack_close(f.pack_close(f.CLOSE, 1, 1000, "y" * 600))[1] == "y" * f.REASON_MAX


def test_frames_round_trip() -> None:
    assert f.unpack_credit(f.pack_credit(7, 1 << 40, f.RESYNC)) == (7, 1 << 40, f.RESYNC)
    data = f.pack_close(f.CLOSE, 9, 1000, "bye ✓")
    assert data[0] == f.CLOSE and f.HEADER.unpack_from(data) == (f.CLOSE, 9)
    assert f.unpack_close(data) == (1000, "bye ✓")


@given(max_payload=st.integers(100, 64 << 20), window=st.integers(f.MIN_WINDOW, 1 << 40))
def test_a_chunk_fits_nats_max_payload_and_costs_at_most_a_quarter_of_the_peer_window(
    max_payload: int, window: int
) -> None:
    """Credit is raised once a quarter of the window is consumed, so a chunk costing more could
    wait for credit that never comes. The old sizing had a 256-byte floor: with a peer's window of
    1,000 its chunks cost 337 (a clean-room client saw them), and with 300 no message could go."""
    chunk = f.chunk_size(max_payload, window)
    first = f.HEADER.size + f.TOTAL.size + chunk
    assert chunk >= 1 and first <= max_payload and first + f.MESSAGE_COST <= window // 4


def test_only_windows_a_chunk_fits_in_are_accepted() -> None:
    assert f.window_error(f.MIN_WINDOW) is None and f.window_error(8 << 20) is None
    assert f.window_error(2**64 - 1) is None
    for bad in (0, -5, 100, 300, f.MIN_WINDOW - 1, 2**64, 2**70, "big", "8388608", 8.0e6, True, None):
        assert f.window_error(bad) is not None, bad


def test_nats_urls() -> None:
    target = parse_nats_url("nats://u:p@h1:4222,h2:4223/agents.planner", {"servers": ["nats://h3:4222"]})
    assert target.subject == "agents.planner"
    assert target.servers == ("nats://u:p@h1:4222", "nats://u:p@h2:4223", "nats://h3:4222")
    for bad in ("nats://h:4222", "nats://h:4222/agents.*", "nats://h:4222/a..b"):
        with pytest.raises(ValueError):
            parse_nats_url(bad)
    assert nats_connect_kwargs({"nats_token": "t", "credentials": "x.creds", "nats_options": {"a": 1}}) == {
        "token": "t",
        "user_credentials": "x.creds",
        "a": 1,
    }
