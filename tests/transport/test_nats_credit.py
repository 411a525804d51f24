"""A lost CREDIT must not stall a NATS channel (docs/PROTOCOL.md §5a "Flow control", "Exactly
once, in order, across NATS node loss"; issue 15).

Core NATS drops what it cannot deliver, CREDIT messages included. A sender that has used its
window waits for the receiver's next CREDIT; if that one is lost and nothing re-announces it, the
sender waits until the session's own timers end the session, although both ends are alive.

The receiver here holds everything (``pause_reading``) until the sender is blocked on credit, then
consumes it all while its CREDIT cannot reach the sender, and checks that the transfer completes
within a few seconds, in order and without duplicates. A real nats-server with a small
``max_payload`` keeps the window (4 x max_payload) small.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from m2mwire.errors import TransportError
from m2mwire.transport.nats import channel as nats_channel
from m2mwire.transport.nats import frames as f
from m2mwire.transport.nats.channel import NatsChannel
from m2mwire.transport.nats.local import LocalNatsServer
from m2mwire.transport.nats.service import open_nats_channel, serve_nats
from tests.chaosproxy import TcpChaosProxy
from tests.transport.conftest import SMALL_MAX_PAYLOAD

MAX_PAYLOAD = SMALL_MAX_PAYLOAD  # small_nats: window = 4 x max_payload = 256 KiB
SIZE = 16 * 1024
COUNT = 60  # about 4 windows: the sender blocks on credit
# No liveness probes: the channel must recover by itself, not because a probe happened to pass.
OPTIONS = {
    "nats_window": 4 * MAX_PAYLOAD,  # the least there is
    "probe_interval": 0,
    "reconnect_time_wait": 0.05,
    "max_reconnect_attempts": -1,
}


def message(i: int, size: int = SIZE) -> bytes:
    """Message ``i``: recognisable in order, ``size`` bytes."""
    return i.to_bytes(4, "big") * (size // 4)


@dataclass
class Receiving:
    """The worker's end: holds everything until ``channel.resume_reading()``."""

    received: list[bytes] = field(default_factory=list)
    channels: list[NatsChannel] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    async def handler(self, channel: NatsChannel) -> None:
        channel.pause_reading()  # no credit is granted for what is held
        channel.start_push(lambda data, _text: self.received.append(bytes(data)), lambda _err: None)
        self.channels.append(channel)
        self.started.set()
        await asyncio.wait_for(self.finished.wait(), 30)


@asynccontextmanager
async def blocked_sender(
    server: LocalNatsServer, via: TcpChaosProxy | None
) -> AsyncIterator[tuple[NatsChannel, NatsChannel, Receiving, asyncio.Task[None]]]:
    """A client channel (through ``via``, if given) sending COUNT messages to a worker that holds
    them, once the client has used its window and waits for credit, and the worker has taken
    in order everything the client sent: (client, worker channel, receiving, sending task)."""
    receiving = Receiving()
    subject = f"test.{uuid.uuid4().hex}"
    listener = await serve_nats(
        receiving.handler, f"{server.url}/{subject}", max_message_size=1 << 20, options=dict(OPTIONS)
    )
    port = via.port if via is not None else server.port
    client = await open_nats_channel(  # a NATS connection of its own (another name)
        f"nats://127.0.0.1:{port}/{subject}", max_message_size=1 << 20, options={**OPTIONS, "name": "c"}
    )
    sending: asyncio.Task[None] | None = None
    try:
        await asyncio.wait_for(receiving.started.wait(), 10)
        worker = receiving.channels[0]

        async def send_all() -> None:
            for i in range(COUNT):
                await client.send(message(i))

        sending = asyncio.create_task(send_all())
        for _ in range(500):
            blocked = client._credit_waiter is not None and not client._credit_waiter.done()
            if blocked and worker._receiver.last_in_order == client._sender.next_seq - 1:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the client never used up its window")
        assert not sending.done() and not worker._receiver.consumed
        yield client, worker, receiving, sending
    finally:
        if sending is not None:
            sending.cancel()
        receiving.finished.set()
        client.abort()
        await client._nc.close()  # nats-py retrying forever would outlive the test
        listener.close()
        await listener.wait_closed()


async def consume_and_flush(worker: NatsChannel, client: NatsChannel) -> int:
    """The worker consumes everything it holds; returns the credit limit it announced, which
    must be more than the client has (or the client would not be blocked)."""
    limit_before = client._sender.limit
    worker.resume_reading()
    for _ in range(5):
        await asyncio.sleep(0)  # the CREDIT publishes (publish_soon) run
    await worker._nc.flush(timeout=2)  # ... and reached nats-server
    assert worker._receiver.granted > limit_before
    return worker._receiver.granted


async def all_arrive(client: NatsChannel, receiving: Receiving, sending: asyncio.Task[None]) -> None:
    # Bounded well under any session timer: a lost CREDIT must be made good in about a second.
    await asyncio.wait_for(asyncio.shield(sending), 5)
    for _ in range(500):
        if len(receiving.received) >= COUNT:
            break
        await asyncio.sleep(0.01)
    assert receiving.received == [message(i) for i in range(COUNT)]  # once each, in order


@pytest.mark.timeout(30)
async def test_credit_lost_while_the_senders_nats_connection_was_down_is_announced_again(
    small_nats: LocalNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client (the sender) loses its NATS connection while blocked on credit; the worker
    consumes and sends CREDIT while nats-server has no subscription of the client, so that CREDIT
    is dropped; nats-py reconnects. The client's reconnect resends everything unacknowledged
    (the lost CREDIT acknowledged it too): the worker drops those as duplicates and must announce
    its credit again, which also releases what the client retained."""
    # The reconnect alone must recover it: no help from a blocked sender asking for credit.
    monkeypatch.setattr(nats_channel, "_ASK_CREDIT_AFTER", 60.0, raising=False)
    proxy = await TcpChaosProxy(small_nats.port).start()
    try:
        async with blocked_sender(small_nats, proxy) as (client, worker, receiving, sending):
            proxy.refusing = True
            proxy.cut()
            # Until nats-server itself has dropped the client's subscription: then a CREDIT to it
            # is certainly lost (a request there gets "no responders").
            for _ in range(200):
                try:
                    await worker._nc.request(client.in_subject, b"", timeout=0.5)
                except NoRespondersError:
                    break
                except NatsTimeoutError:
                    pass
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("nats-server kept the cut client's subscription")
            assert not client._nc.is_connected
            acked_by_lost_credit = worker._receiver.last_in_order
            await consume_and_flush(worker, client)
            proxy.refusing = False
            await all_arrive(client, receiving, sending)
            assert client._nc.stats["reconnects"] == 1
            # What the lost CREDIT acknowledged is no longer retained.
            assert client._sender.oldest_unacked > acked_by_lost_credit
    finally:
        await proxy.close()


class DropCredit:
    """Stands in for the client channel on its bus: drops the CREDITs routed to it (as a NATS
    route between cluster nodes that fails can, with neither client reconnecting)."""

    def __init__(self, channel: NatsChannel) -> None:
        self.channel = channel
        self.dropped = 0
        self.probes = 0

    def on_nats(self, data: bytes | bytearray) -> None:
        if data and data[0] == f.CREDIT:
            self.dropped += 1
            return
        if data and data[0] == f.PROBE:
            self.probes += 1
        self.channel.on_nats(data)

    def on_no_responders(self) -> None:
        self.channel.on_no_responders()

    def on_reconnected(self) -> None:
        self.channel.on_reconnected()

    def on_bus_closed(self, error: TransportError) -> None:
        self.channel.on_bus_closed(error)


@pytest.mark.timeout(30)
async def test_credit_lost_without_a_reconnect_is_asked_for_by_the_blocked_sender(
    small_nats: LocalNatsServer,
) -> None:
    """No connection is lost, so nobody resyncs: the sender, blocked on credit for long, asks for
    it, and the receiver announces it again."""
    async with blocked_sender(small_nats, None) as (client, worker, receiving, sending):
        bus = client._bus
        dropper = DropCredit(client)
        bus.routes[client.in_subject] = dropper
        await consume_and_flush(worker, client)
        # A PROBE after the CREDITs: NATS keeps one publisher's order, so once it has arrived,
        # every CREDIT the worker sent has been dropped.
        await worker._nc.publish(client.in_subject, f.HEADER.pack(f.PROBE, 0))
        for _ in range(200):
            if dropper.probes:
                break
            await asyncio.sleep(0.01)
        assert dropper.probes and dropper.dropped, "the worker's messages never reached the client"
        bus.routes[client.in_subject] = client
        await all_arrive(client, receiving, sending)
        assert client._nc.stats["reconnects"] == 0


@pytest.mark.timeout(30)
async def test_a_peer_asking_for_credit_over_and_over_gets_one_announcement_per_quarter_second(
    small_nats: LocalNatsServer,
) -> None:
    """The resource rule: 200 ASKs (and RESYNCs) at once make the worker announce its credit
    once, then at most once per 0.25 s (``_ANNOUNCE_EVERY``), not 200 times."""
    async with blocked_sender(small_nats, None) as (client, worker, _receiving, _sending):
        counter = DropCredit(client)
        client._bus.routes[client.in_subject] = counter
        loop = asyncio.get_running_loop()
        started = loop.time()
        for i in range(200):
            flags = f.RESYNC if i % 2 else f.ASK
            await client._nc.publish(worker.in_subject, f.pack_credit(0, 0, flags))
        await client._nc.flush(timeout=2)
        await asyncio.sleep(0.6)
        elapsed = loop.time() - started
        # one at once, one per quarter second after it, and maybe the blocked client's own ASK
        assert 1 <= counter.dropped <= 2 + elapsed / nats_channel._ANNOUNCE_EVERY, (counter.dropped, elapsed)
        assert worker.lost is None
