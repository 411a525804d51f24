"""The last DATA message(s) a NATS channel sends, lost inside NATS, must still arrive
(docs/PROTOCOL.md §5a "A lost tail is asked for"; issue 15: "Nothing is lost, nothing is
duplicated, order is kept").

Core NATS delivers at most once: a route between cluster nodes that fails, or nats-server itself,
can drop a message with neither end reconnecting. A gap is seen by the receiver only when a later
message arrives, so when the lost ones are the last a channel sends, only the sender can notice:
it holds them unacknowledged. A stand-in on the worker's route (as in test_nats_credit.py) drops
the client's last sequenced messages once each, deterministically, with a real nats-server.
"""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from m2mwire.transport.nats import channel as nats_channel
from m2mwire.transport.nats import frames as f
from m2mwire.transport.nats.channel import NatsChannel
from m2mwire.transport.nats.local import LocalNatsServer
from m2mwire.transport.nats.service import open_nats_channel, serve_nats
from tests.transport.test_nats_credit import OPTIONS, DropCredit, Receiving, blocked_sender
from tests.transport.test_nats_credit import message as credit_message

COUNT = 20
SIZE = 1000  # one NATS message each: message i is sequence number i + 1


def message(i: int) -> bytes:
    return credit_message(i, SIZE)


class DropData(DropCredit):
    """Stands in for a channel on its bus: drops the first copy of each sequenced message whose
    number is in ``drop`` (as a failing NATS route would), counts every sequenced message."""

    def __init__(self, channel: NatsChannel, drop: set[int]) -> None:
        super().__init__(channel)
        self.drop = set(drop)
        self.data = 0

    def on_nats(self, data: bytes | bytearray) -> None:
        if data and data[0] in f.SEQUENCED:
            self.data += 1
            seq = f.HEADER.unpack_from(data)[1]
            if seq in self.drop:
                self.drop.discard(seq)
                self.dropped += 1
                return
        self.channel.on_nats(data)


@asynccontextmanager
async def pair(server: LocalNatsServer) -> AsyncIterator[tuple[NatsChannel, NatsChannel, Receiving]]:
    """A client channel and the worker's channel (reading), over separate NATS connections."""
    receiving = Receiving()
    subject = f"test.{uuid.uuid4().hex}"
    listener = await serve_nats(
        receiving.handler, f"{server.url}/{subject}", max_message_size=1 << 20, options=dict(OPTIONS)
    )
    client = await open_nats_channel(
        f"{server.url}/{subject}", max_message_size=1 << 20, options={**OPTIONS, "name": "c"}
    )
    try:
        await asyncio.wait_for(receiving.started.wait(), 10)
        worker = receiving.channels[0]
        worker.resume_reading()
        yield client, worker, receiving
    finally:
        receiving.finished.set()
        client.abort()
        await client._nc.close()
        listener.close()
        await listener.wait_closed()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("lost", [{COUNT}, {COUNT - 2, COUNT - 1, COUNT}], ids=["last", "last-three"])
async def test_the_last_messages_lost_in_nats_arrive_once_in_order(
    small_nats: LocalNatsServer, lost: set[int]
) -> None:
    """Nothing is sent after the lost ones and nobody reconnects: the sender, holding them
    unacknowledged with no acknowledgement progress, asks the receiver, which asks for them."""
    async with pair(small_nats) as (client, worker, receiving):
        dropper = DropData(worker, lost)
        worker._bus.routes[worker.in_subject] = dropper
        loop = asyncio.get_running_loop()
        started = loop.time()
        for i in range(COUNT):
            await client.send(message(i))
        for _ in range(500):  # 5 s: the rule asks after 1 s without progress
            if len(receiving.received) >= COUNT:
                break
            await asyncio.sleep(0.01)
        elapsed = loop.time() - started
        assert dropper.dropped == len(lost)
        assert receiving.received == [message(i) for i in range(COUNT)], elapsed  # once each, in order
        assert elapsed < 4, elapsed
        # Only what was missing went again (the receiver's RESYNC carries its acknowledgement).
        assert dropper.data == COUNT + len(lost), dropper.data
        assert client._nc.stats["reconnects"] == worker._nc.stats["reconnects"] == 0
        # ... and the sender learns that everything arrived: it retains nothing for long.
        for _ in range(300):
            if not client._sender.unacked:
                break
            await asyncio.sleep(0.01)
        assert not client._sender.unacked


@pytest.mark.timeout(30)
async def test_a_paused_receiver_does_not_make_the_sender_resend(small_nats: LocalNatsServer) -> None:
    """A receiver that holds everything (its session does not read) has taken every message in
    order: asking it for its acknowledgement must not make anything go again, however long the
    sender waits for credit."""
    async with blocked_sender(small_nats, None) as (client, worker, _receiving, sending):
        counter = DropData(worker, set())
        worker._bus.routes[worker.in_subject] = counter
        credits = DropCredit(client)  # counts (and drops) what the worker sends the client
        client._bus.routes[client.in_subject] = credits
        await asyncio.sleep(3 * nats_channel._ASK_CREDIT_AFTER + 0.5)
        assert counter.data == 0, counter.data  # nothing resent
        assert not sending.done()
        # The worker answers each ask with one CREDIT, rate-limited.
        assert 1 <= credits.dropped <= 8, credits.dropped
        assert worker.lost is None and client.lost is None


@pytest.mark.timeout(30)
async def test_a_peer_asking_for_resends_over_and_over_gets_one_per_quarter_second(
    small_nats: LocalNatsServer,
) -> None:
    """The resource rule: RESYNCs 10 ms apart (26 bytes each) make the client send its
    unacknowledged messages again at most once per 0.25 s (``_RESEND_EVERY``), not once each."""
    async with pair(small_nats) as (client, worker, receiving):
        counter = DropData(worker, set())
        worker._bus.routes[worker.in_subject] = counter
        for i in range(COUNT):  # under a quarter of the window: nothing is acknowledged yet
            await client.send(message(i))
        for _ in range(300):
            if len(receiving.received) >= COUNT:
                break
            await asyncio.sleep(0.01)
        assert len(client._sender.unacked) == COUNT
        loop = asyncio.get_running_loop()
        started = loop.time()
        for _ in range(60):
            await worker._nc.publish(client.in_subject, f.pack_credit(0, 0, f.RESYNC))
            await asyncio.sleep(0.01)
        await worker._nc.flush(timeout=2)
        await asyncio.sleep(0.1)
        elapsed = loop.time() - started
        resent = counter.data - COUNT
        assert COUNT <= resent <= COUNT * (2 + elapsed / nats_channel._RESEND_EVERY), (resent, elapsed)
        assert receiving.received == [message(i) for i in range(COUNT)]  # the duplicates dropped


def test_a_tail_question_reads_as_an_ask_to_a_peer_that_predates_it() -> None:
    """The 18 bytes an older peer parses say ASK (so it acknowledges); the tail follows them."""
    question = f.pack_credit(7, 4096, tail=9)
    assert len(question) == 26
    assert f.unpack_credit(question[:18]) == f.unpack_credit(question) == (7, 4096, f.ASK | f.TAIL)
    assert f.unpack_tail(question) == 9
    with pytest.raises(struct.error):  # a TAIL flag without the tail is malformed
        f.unpack_tail(f.pack_credit(7, 4096, f.TAIL))


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "frame",
    [f.pack_credit(0, 0, f.TAIL), bytes((f.CREDIT, 0, 0)), bytes((f.BINARY, 0))],
    ids=["tail-missing", "short-credit", "short-header"],
)
async def test_a_truncated_frame_fails_only_its_own_channel(
    small_nats: LocalNatsServer, frame: bytes
) -> None:
    """A frame too short for what its kind and flags say (struct.error, not a ValueError) is a
    protocol error of that channel: ABORT 1002 to it, and the worker's other channels go on."""
    receiving = Receiving()
    subject = f"test.{uuid.uuid4().hex}"
    listener = await serve_nats(
        receiving.handler, f"{small_nats.url}/{subject}", max_message_size=1 << 20, options=dict(OPTIONS)
    )
    clients: list[NatsChannel] = []
    try:
        for name in ("good", "bad"):
            clients.append(
                await open_nats_channel(
                    f"{small_nats.url}/{subject}", max_message_size=1 << 20, options={**OPTIONS, "name": name}
                )
            )
            for _ in range(500):
                if len(receiving.channels) == len(clients):
                    break
                await asyncio.sleep(0.01)
        good, bad = clients
        good_worker, bad_worker = receiving.channels
        good_worker.resume_reading()
        await bad._nc.publish(bad._out, frame)
        for _ in range(500):
            if bad.lost is not None:
                break
            await asyncio.sleep(0.01)
        assert bad_worker.lost is not None and bad_worker.lost.code == 1002, bad_worker.lost
        assert bad.lost is not None and bad.lost.code == 1002, bad.lost  # told by the worker's ABORT
        await good.send(message(1))
        for _ in range(500):
            if receiving.received:
                break
            await asyncio.sleep(0.01)
        assert receiving.received == [message(1)] and good_worker.lost is None
    finally:
        receiving.finished.set()
        for client in clients:
            client.abort()
            await client._nc.close()
        listener.close()
        await listener.wait_closed()
