"""The nats-py compat module: it refuses versions and builds it was not verified against, and its
shortcuts (DirectParser, publish_now) do what nats-py's general paths do."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import random
import ssl
import tracemalloc
import uuid
from importlib.metadata import version

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.transport import TcpTransport
from nats.protocol import parser as nats_parser

from m2mwire.errors import UnsupportedDependency
from m2mwire.transport.nats import compat
from m2mwire.transport.nats.local import LocalNatsServer


def test_installed_nats_py_passes() -> None:
    compat.check_version(version("nats-py"))
    compat.check_attributes(compat.required_attributes())


@pytest.mark.parametrize("found", ["2.15.0", "2.17.1", "3.0"])
def test_other_minor_versions_are_refused_with_the_supported_range(found: str) -> None:
    with pytest.raises(UnsupportedDependency, match=r"pip install 'nats-py>=2\.16,<2\.17'"):
        compat.check_version(found)


def test_a_client_without_its_pending_buffer_is_refused() -> None:
    client = Client()
    del client._pending  # a nats-py build that keeps its outgoing buffer elsewhere
    required = [
        (what, client if isinstance(obj, Client) else obj, names)
        for what, obj, names in compat.required_attributes()
    ]
    with pytest.raises(UnsupportedDependency) as info:
        compat.check_attributes(required)
    # only the one missing is named, with the versions to install
    assert "lacks a nats.aio.client.Client._pending, which" in str(info.value)
    assert "nats-py 2.16.x" in str(info.value)


# -- DirectParser: the same output as nats-py's parser, with fewer copies ----------------------------

DIRECT_SID, GENERAL_SID = 1, 2


class Recorder:
    """Stands in for the nats-py client a parser feeds: it records what the parser hands on."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []
        self.stats = {"in_msgs": 0, "in_bytes": 0}
        self._subs = {DIRECT_SID: object(), GENERAL_SID: object()}

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, hdr: bytes | None
    ) -> None:
        assert type(data) is bytes  # what nats-py's Msg expects
        self.events.append(("msg", sid, subject, reply, data, hdr))

    async def _process_err(self, text: str) -> None:
        self.events.append(("err", text))

    async def _process_ping(self) -> None:
        self.events.append(("ping",))

    async def _process_pong(self) -> None:
        self.events.append(("pong",))

    async def _process_info(self, info: dict[str, object]) -> None:
        self.events.append(("info", info))


def protocol_parts() -> list[bytes]:
    """Every kind of line nats-server sends, with payloads small, empty and larger than a read."""
    rng = random.Random(3)
    parts = [b'INFO {"server_id":"x","max_payload":1048576}\r\n', b"PING\r\n", b"+OK\r\n"]
    for i, size in enumerate((0, 5, 100, 70_000, 3, 200_000, 65_535, 65_536, 1 << 20, 17)):
        payload = rng.randbytes(size)
        sid = DIRECT_SID if i % 3 else GENERAL_SID
        reply = b" _INBOX.r" if i == 4 else b""
        parts.append(b"MSG s.%d %d%s %d\r\n%s\r\n" % (i, sid, reply, size, payload))
        if i == 5:  # a status answer (headers) on the routed subscription, and an unknown sid
            hdr = b"NATS/1.0 503\r\n\r\n"
            parts.append(b"HMSG s.x %d %d %d\r\n%s\r\n" % (DIRECT_SID, len(hdr), len(hdr), hdr))
            parts.append(b"MSG s.y 9 4\r\nlost\r\n")
        if i == 7:
            parts += [b"PONG\r\n", b"-ERR 'Permissions Violation for Publish'\r\n"]
    # runs of small routed messages (DirectParser's fast path), and lines of another shape that
    # nats-py's pattern accepts too (other whitespace, two spaces): the general path's
    for i in range(20):
        reply = b" _INBOX.%d" % i if i % 4 == 1 else b""
        parts.append(b"MSG r.%d %d%s %d\r\n%s\r\n" % (i, DIRECT_SID, reply, i, rng.randbytes(i)))
    parts += [b"MSG\tw.1 1 3\r\nabc\r\n", b"MSG w.2  1  2\r\nde\r\n", b"MSG w.3 1 _I\t4\r\nfghi\r\n"]
    parts.append(b"MSG w.4 %d 1\r\nz\r\n" % GENERAL_SID)
    return parts


def protocol_stream() -> bytes:
    return b"".join(protocol_parts())


async def parse_in_pieces(parser: nats_parser.Parser, stream: bytes, seed: int) -> None:
    rng = random.Random(seed)
    at = 0
    while at < len(stream):
        step = rng.choice((1, 7, 100, 4096, 32_768, 300_000))
        await parser.parse(stream[at : at + step])
        at += step


@pytest.mark.parametrize("seed", range(6))
async def test_direct_parser_hands_on_what_nats_py_parser_does_wherever_reads_are_cut(seed: int) -> None:
    stream = protocol_stream()
    general = Recorder()
    await parse_in_pieces(nats_parser.Parser(general), stream, seed)
    direct = Recorder()
    parser = compat.DirectParser(direct)  # type: ignore[arg-type]
    routed: list[tuple[object, ...]] = []
    parser.direct[DIRECT_SID] = lambda subject, data: routed.append(("msg", DIRECT_SID, subject, bytes(data)))
    await parse_in_pieces(parser, stream, seed)

    def is_routed(event: tuple[object, ...]) -> bool:
        return event[:2] == ("msg", DIRECT_SID) and event[5] is None

    # nats-py's own events (control lines, other subscriptions, headers) are the same, in order
    assert direct.events == [e for e in general.events if not is_routed(e)]
    # and the routed subscription's messages the same, in order (the reply is not needed there)
    assert routed == [e[:3] + e[4:5] for e in general.events if is_routed(e)]
    assert len(routed) == 6 + 20 + 3 and direct.stats["in_msgs"] == len(routed)
    assert parser.state == nats_parser.AWAITING_CONTROL_LINE and not parser.buf


@pytest.mark.parametrize("seed", range(6))
async def test_reads_routed_as_they_arrive_hand_on_what_nats_py_parser_does(seed: int) -> None:
    """Differential for DirectParser._feed: the stream is fed to a StreamReader in random pieces,
    as the transport's protocol feeds it, with a read loop as nats-py's reading it; sometimes the
    loop waits (routed messages are then handed on from the feed, before the loop wakes), sometimes
    reads pile up in the reader (the general path). Same events, same order as nats-py's parser."""
    stream = protocol_stream()
    general = Recorder()
    await parse_in_pieces(nats_parser.Parser(general), stream, seed)

    direct = Recorder()
    reader = asyncio.StreamReader(limit=compat.READ_SIZE)
    transport = TcpTransport()  # type: ignore[no-untyped-call]
    transport._io_reader = reader
    direct._transport = transport  # type: ignore[attr-defined]
    parser = compat.DirectParser(direct)  # type: ignore[arg-type]
    routed: list[tuple[object, ...]] = []
    parser.direct[DIRECT_SID] = lambda subject, data: routed.append(("msg", DIRECT_SID, subject, bytes(data)))
    from_feed = [0]  # runs of routed messages handed on while the read loop waited
    route_run = parser._route_run

    def counting_route_run(buf: bytearray) -> bool:
        waiting = reader._waiter is not None  # type: ignore[attr-defined]
        took = route_run(buf)
        from_feed[0] += took and waiting
        return took

    parser._route_run = counting_route_run  # type: ignore[method-assign]

    async def read_loop() -> None:  # nats-py's Client._read_loop, less its error handling
        while not reader.at_eof():
            await parser.parse(await reader.read(compat.READ_SIZE))

    loop_task = asyncio.create_task(read_loop())
    rng = random.Random(seed)
    ends = list(itertools.accumulate(map(len, protocol_parts())))  # where each line's message ends
    at = 0
    while at < len(stream):
        if rng.random() < 0.5:  # a read that ends where a message ends, as most do
            step = ends[min(bisect.bisect_right(ends, at) + rng.randint(0, 2), len(ends) - 1)] - at
        else:
            step = rng.choice((1, 7, 30, 100, 4096, 32_768, 300_000))
        reader.feed_data(stream[at : at + step])  # the hook (after the first parse) or the class's
        at += step
        if rng.random() < 0.6:
            await asyncio.sleep(0)  # the read loop runs, and waits again
    for _ in range(5):
        await asyncio.sleep(0)
    reader.feed_eof()
    await asyncio.wait_for(loop_task, 5)

    def is_routed(event: tuple[object, ...]) -> bool:
        return event[:2] == ("msg", DIRECT_SID) and event[5] is None

    assert direct.events == [e for e in general.events if not is_routed(e)]
    assert routed == [e[:3] + e[4:5] for e in general.events if is_routed(e)]
    assert direct.stats["in_msgs"] == len(routed) == 6 + 20 + 3
    assert from_feed[0] > 0  # the path under test was taken
    assert parser.state == nats_parser.AWAITING_CONTROL_LINE and not parser.buf


async def test_direct_parser_copies_a_big_payload_once() -> None:
    """nats-py collects a payload in its read buffer, then copies it out twice (a bytearray slice,
    then bytes): 3x the payload at its peak. The DirectParser reads it into one buffer, handed on."""
    size = 1 << 20
    payload = random.Random(1).randbytes(size)
    stream = b"MSG s.1 1 %d\r\n%s\r\n" % (size, payload)
    reads = [stream[i : i + 32_768] for i in range(0, len(stream), 32_768)]
    got: list[bytes | bytearray] = []
    parser = compat.DirectParser(Recorder())  # type: ignore[arg-type]
    parser.direct[DIRECT_SID] = lambda _subject, data: got.append(data)
    tracemalloc.start()
    try:
        for read in reads:
            await parser.parse(read)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == [payload] and type(got[0]) is bytearray
    assert peak < 1.2 * size, peak


# -- with a real nats-server --------------------------------------------------------------------------


async def direct_client(server: LocalNatsServer) -> Client:
    nc = Client()
    compat.install_parser(nc)
    await nc.connect(server.url)
    return nc


async def collecting(server: LocalNatsServer, subject: str) -> tuple[Client, asyncio.Queue[bytes]]:
    """A plain nats-py client subscribed to ``subject``, and the queue of payloads it receives."""
    listener = await nats.connect(server.url)
    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def collect(msg: Msg) -> None:
        got.put_nowait(msg.data)

    await listener.subscribe(subject, cb=collect)
    await listener.flush()
    return listener, got


async def test_publish_now_sends_what_publish_does_and_writes_only_a_bursts_first_command_at_once(
    nats_server: LocalNatsServer,
) -> None:
    """Differential: publish_now (header and body queued apart, the first command of a burst
    written straight to the socket) against nats-py's publish (the general path), interleaved."""
    subject = f"t.{uuid.uuid4().hex}"
    listener, got = await collecting(nats_server, subject)
    nc = await direct_client(nats_server)
    try:
        expected: list[bytes] = []
        for burst in range(3):
            for i in range(4):
                head, body = b"h%d.%d:" % (burst, i), memoryview(bytes([i]) * (1000 * i))
                assert compat.publish_now(nc, subject, head, body)
                expected.append(head + bytes(body))
                # the first of the burst went to the socket; the rest wait for the flusher, in order
                assert len(nc._pending) == (3 * i if i else 0)
            await nc.publish(subject, b"general %d" % burst)
            expected.append(b"general %d" % burst)
            await asyncio.sleep(0)  # the flusher writes the burst's rest
        assert compat.publish_now(nc, subject, b"head only")
        expected.append(b"head only")
        received = [await asyncio.wait_for(got.get(), 10) for _ in expected]
        assert received == expected
        assert nc.stats["out_msgs"] == len(expected)
    finally:
        await nc.close()
        await listener.close()


async def test_publish_now_goes_straight_out_again_only_after_a_read_or_the_flusher(
    nats_server: LocalNatsServer,
) -> None:
    """A command written straight to the socket is not followed by another with nothing read in
    between, even turns later: it waits for the flusher (which batches a burst's rest). A read
    lets the next command go at once: a request after its answer does not wait a turn. Nothing
    is scheduled to mark a turn's end (on the old code a callback per command cost a loop turn,
    and a command in a later turn went straight out)."""
    subject, other = f"t.{uuid.uuid4().hex}", f"t.{uuid.uuid4().hex}"
    listener, elsewhere = await collecting(nats_server, other)  # another client's subject
    nc = await direct_client(nats_server)
    arrived: asyncio.Queue[bytes] = asyncio.Queue()

    async def never(_msg: Msg) -> None:
        raise AssertionError("a routed subscription's message took the callback")

    sub = await nc.subscribe(subject, cb=never)
    compat.route_directly(nc, sub, lambda _subject, data: arrived.put_nowait(bytes(data)))
    await nc.flush()  # (its PONG is a read)
    loop = asyncio.get_running_loop()
    try:
        ready = len(loop._ready)  # type: ignore[attr-defined]
        assert compat.publish_now(nc, subject, b"a") and not nc._pending  # straight out
        assert len(loop._ready) == ready  # type: ignore[attr-defined]  # nothing scheduled
        assert await asyncio.wait_for(arrived.get(), 10) == b"a"  # it comes back: a read
        assert compat.publish_now(nc, other, b"b") and not nc._pending  # straight out again
        for _ in range(3):
            await asyncio.sleep(0)  # later turns; nothing comes to nc (b goes elsewhere)
        assert compat.publish_now(nc, other, b"c") and nc._pending  # for the flusher
        await asyncio.sleep(0)  # the flusher writes c; queueing it cleared the mark
        assert not nc._pending
        assert compat.publish_now(nc, other, b"d") and not nc._pending  # straight out
        assert [await asyncio.wait_for(elsewhere.get(), 10) for _ in range(3)] == [b"b", b"c", b"d"]
    finally:
        await nc.close()
        await listener.close()


async def test_large_bodies_over_tls_keep_the_connection(
    tls_nats: tuple[LocalNatsServer, ssl.SSLContext],
) -> None:
    """publish_now wrote bodies of 16 KiB or more with os.writev on the socket: over TLS, that is
    plaintext inside the TLS stream. nats-server dropped the connection at each one, and the
    message got through only once a reconnect's resend took the flusher's path (the session
    test saw a 1.5 MB echo time out half the time). Over TLS they now go through the TLS
    transport, straight out as before, and the connection stays up."""
    server, tls = tls_nats
    subject = f"t.{uuid.uuid4().hex}"
    listener = await nats.connect(server.url, tls=tls)
    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def collect(msg: Msg) -> None:
        got.put_nowait(msg.data)

    await listener.subscribe(subject, cb=collect)
    await listener.flush()
    nc = Client()
    compat.install_parser(nc)
    await nc.connect(server.url, tls=tls, max_reconnect_attempts=0)
    try:
        expected = [bytes([i]) * size for i, size in enumerate((100, 20_000, 70_000, 500_000))]
        for body in expected:
            assert not nc._pending
            assert compat.publish_now(nc, subject, b"h:", body)
            assert not nc._pending  # straight out, through the TLS transport
            await nc.flush()  # a read in between: the next one goes straight out too
        received = [await asyncio.wait_for(got.get(), 10) for _ in expected]
        assert received == [b"h:" + body for body in expected]
        assert nc.is_connected and nc.stats["reconnects"] == 0
    finally:
        await nc.close()
        await listener.close()


async def test_a_route_that_fails_leaves_the_read_loop_running(nats_server: LocalNatsServer) -> None:
    subject = f"t.{uuid.uuid4().hex}"
    nc = await direct_client(nats_server)
    routed: list[bytes] = []

    def route(_subject: bytes, data: bytes | bytearray) -> None:
        if data == b"boom":
            raise RuntimeError("a bug in the route")
        routed.append(bytes(data))

    async def never(_msg: Msg) -> None:
        raise AssertionError("a routed subscription's message took the callback")

    sub = await nc.subscribe(subject, cb=never)
    compat.route_directly(nc, sub, route)
    await nc.flush()
    try:
        for data in (b"a", b"boom", b"b", b"x" * 300_000):
            await nc.publish(subject, data)
        for _ in range(200):
            if len(routed) == 3:
                break
            await asyncio.sleep(0.01)
        assert routed == [b"a", b"b", b"x" * 300_000]
        assert nc.is_connected
    finally:
        await nc.close()


async def test_a_big_payload_goes_from_the_socket_straight_into_its_own_buffer(
    nats_server: LocalNatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The StreamReader copies each read twice (into its buffer, out for read()); while a big
    payload is incomplete, the reads skip it and go straight into the payload's buffer. Payloads
    arrive whole and in order, among small messages, whatever the reads' cuts."""
    fed = [0]
    general_feed = asyncio.StreamReader.feed_data

    def counting_feed(self: asyncio.StreamReader, data: bytes) -> None:
        fed[0] += len(data)
        general_feed(self, data)

    monkeypatch.setattr(asyncio.StreamReader, "feed_data", counting_feed)
    subject = f"t.{uuid.uuid4().hex}"
    nc = await direct_client(nats_server)
    sender = await nats.connect(nats_server.url)
    routed: list[bytes] = []
    done = asyncio.Event()

    def route(_subject: bytes, data: bytes | bytearray) -> None:
        routed.append(bytes(data))
        if data == b"end":
            done.set()

    async def never(_msg: Msg) -> None:
        raise AssertionError("a routed subscription's message took the callback")

    sub = await nc.subscribe(subject, cb=never)
    compat.route_directly(nc, sub, route)
    await nc.flush()
    rng = random.Random(5)
    expected = []
    for i in range(12):
        expected.append(rng.randbytes((1 << 20) - 100 if i % 3 == 0 else rng.choice((10, 70_000, 300_000))))
    expected.append(b"end")
    try:
        fed[0] = 0
        for data in expected:
            await sender.publish(subject, data)
        await asyncio.wait_for(done.wait(), 20)
        assert routed == expected
        total = sum(map(len, expected))
        # nats-py's reads of the big payloads bypass the StreamReader's buffer: on the old code
        # every byte went through it
        assert fed[0] < total / 2, (fed[0], total)
        assert nc.is_connected
    finally:
        await nc.close()
        await sender.close()


async def test_publish_now_writes_a_big_body_beside_its_header_and_in_order(
    nats_server: LocalNatsServer,
) -> None:
    """Differential, for bodies written with os.writev (the rest, where the socket took only part,
    through the transport): the same messages as nats-py's publish, in order; and the body is not
    joined to its header (on the old code: a copy of the body, allocated per message)."""
    subject = f"t.{uuid.uuid4().hex}"
    listener, got = await collecting(nats_server, subject)
    nc = await direct_client(nats_server)
    rng = random.Random(9)
    try:
        await nc.flush()
        body = rng.randbytes(128 * 1024)
        tracemalloc.start()
        try:
            assert compat.publish_now(nc, subject, b"h", body)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < len(body) / 2, peak
        expected = [b"h" + body]
        for i in range(10):
            head = b"h%d:" % i
            body = rng.randbytes(rng.choice((compat.WRITEV_BODY, 200_000, (1 << 20) - 100)))
            assert compat.publish_now(nc, subject, head, memoryview(body))
            await nc.publish(subject, b"general %d" % i)  # queued behind it, while it may wait
            expected += [head + body, b"general %d" % i]
            if i % 2:
                await asyncio.sleep(0)
        received = [await asyncio.wait_for(got.get(), 10) for _ in expected]
        assert received == expected
    finally:
        await nc.close()
        await listener.close()
