"""QUIC channels over real aioquic connections on 127.0.0.1 (m2mwire.transport.quic)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from m2mwire.errors import ConfigError, EncodeError, TransportError
from m2mwire.transport.base import Channel
from m2mwire.transport.framing import ErrorCode, encode_header
from m2mwire.transport.quic import (
    ALPN,
    QuicChannel,
    QuicClientConnection,
    QuicServer,
    QuicTuning,
    compat,
    connect_quic,
    open_quic_channel,
    serve_quic,
)
from tests.transport.quicpeers import echo

pytestmark = pytest.mark.timeout(60)

MiB = 1024 * 1024
Handler = Callable[[QuicChannel], Awaitable[None]]


@asynccontextmanager
async def server_and_client(
    handler: Handler, *, client: dict[str, Any] | None = None, **server_options: Any
) -> AsyncIterator[tuple[QuicServer, QuicClientConnection]]:
    server = await serve_quic(handler, "127.0.0.1", 0, **server_options)
    try:
        conn = await connect_quic("127.0.0.1", server.port, fingerprint=server.fingerprint, **(client or {}))
        try:
            yield server, conn
        finally:
            await conn.close()
    finally:
        server.close()
        await server.wait_closed()


async def recv_error(channel: QuicChannel, timeout: float = 10.0) -> TransportError:
    """Read until the channel fails; return the TransportError."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                await channel.recv()
            except TransportError as exc:
                return exc


# -- basics ----------------------------------------------------------------------------------------


async def test_echo_text_and_binary_messages() -> None:
    async with server_and_client(echo) as (server, conn):
        assert server.port > 0
        ch = await conn.open_channel()
        assert isinstance(ch, Channel)
        assert ch.stream_id is None  # no stream until the first message
        cases: list[Any] = ["", "hello", '{"t": "DATA", "x": "é€😀"}', "x" * 200_000, b"", b"\x00\xff" * 3]
        for message in cases:
            await ch.send(message)
            reply = await ch.recv()
            assert reply == message and type(reply) is type(message)
        await ch.send(bytearray(b"abc"))
        assert await ch.recv() == b"abc"
        await ch.send(memoryview(b"xabcx")[1:4])
        assert await ch.recv() == b"abc"
        await ch.send([b"head", memoryview(bytearray(b"-mid-")), b"tail"])
        assert await ch.recv() == b"head-mid-tail"
        big_parts = [os.urandom(100_000), os.urandom(300_000)]
        await ch.send(big_parts)
        assert await ch.recv() == b"".join(big_parts)
        assert ch.remote_address == f"127.0.0.1:{server.port}"
        assert ch.stream_id == 0
        with pytest.raises(EncodeError, match="UTF-8"):
            await ch.send("\ud800")
        await ch.send("still usable")
        assert await ch.recv() == "still usable"
        assert ch.stats.messages_sent == ch.stats.messages_received == len(cases) + 5


async def test_orderly_close_delivers_everything_then_code_and_reason() -> None:
    got: list[Any] = []
    finished: asyncio.Future[TransportError] = asyncio.get_running_loop().create_future()

    async def handler(channel: QuicChannel) -> None:
        while True:
            try:
                got.append(await channel.recv())
            except TransportError as exc:
                finished.set_result(exc)
                return

    async with server_and_client(handler) as (_, conn):
        ch = await conn.open_channel()
        for i in range(300):
            await ch.send(f"m{i}")
        await ch.send(os.urandom(2 * MiB))
        await ch.close(4000, "bye now")
        err = await asyncio.wait_for(finished, 10)
        assert got[:300] == [f"m{i}" for i in range(300)] and len(got) == 301
        assert err.clean and err.code == 4000 and err.reason == "bye now"
        with pytest.raises(TransportError) as info:
            await ch.send("after close")
        assert info.value.clean
        with pytest.raises(TransportError):
            await ch.recv()
        await ch.close()  # idempotent


async def test_handler_return_closes_the_channel_in_order() -> None:
    async def one_reply(channel: QuicChannel) -> None:
        await channel.send("first")
        await channel.send(await channel.recv())

    async with server_and_client(one_reply) as (_, conn):
        ch = await conn.open_channel()
        await ch.send("x" * 100_000)
        assert await ch.recv() == "first"
        assert await ch.recv() == "x" * 100_000
        err = await recv_error(ch)
        assert err.clean and err.code == 1000
        with pytest.raises(TransportError) as info:  # the server also stopped reading
            for _ in range(100):
                await ch.send("more")
                await asyncio.sleep(0.01)
        assert info.value.clean


async def test_ordering_under_concurrent_sends() -> None:
    tuning = QuicTuning(stream_send_high=64 * 1024, stream_send_low=32 * 1024)
    async with server_and_client(echo, tuning=tuning, client={"tuning": tuning}) as (_, conn):
        ch = await conn.open_channel()
        big = os.urandom(200_000)

        async def sender(task_id: int) -> None:
            for i in range(40):
                await ch.send(f"{task_id}:{i}")
                if i % 10 == 0:  # large messages force the locked, waiting path
                    await ch.send(big)

        received: list[Any] = []

        async def reader() -> None:
            for _ in range(10 * 44):
                received.append(await ch.recv())

        await asyncio.wait_for(asyncio.gather(reader(), *(sender(t) for t in range(10))), 30)
        texts = [m for m in received if isinstance(m, str)]
        assert all(m == big for m in received if isinstance(m, bytes))
        assert len(texts) == 400
        for t in range(10):
            assert [m for m in texts if m.startswith(f"{t}:")] == [f"{t}:{i}" for i in range(40)]
        assert ch.stats.send_waits > 0


async def test_many_channels_on_one_connection() -> None:
    async with server_and_client(echo) as (server, conn):

        async def session(i: int) -> None:
            ch = await conn.open_channel()
            for j in range(5):
                await ch.send(f"{i}-{j}")
                assert await ch.recv() == f"{i}-{j}"
            await ch.send(bytes([i]) * 5000)
            assert await ch.recv() == bytes([i]) * 5000
            await ch.close()

        await asyncio.wait_for(asyncio.gather(*(session(i) for i in range(60))), 30)
        assert server.connections == 1
        # Channel state is released once the streams finish.
        await asyncio.sleep(0.2)
        ch = await conn.open_channel()
        await ch.send("again")
        assert await ch.recv() == "again"
        assert len(conn._protocol._channels) < 10


async def test_many_separate_connections() -> None:
    server = await serve_quic(echo, "127.0.0.1", 0)
    try:

        async def client(i: int) -> None:
            ch = await open_quic_channel("127.0.0.1", server.port, fingerprint=server.fingerprint)
            await ch.send(f"hello {i}")
            assert await ch.recv() == f"hello {i}"
            await ch.close()
            assert ch._owned_connection is None

        await asyncio.wait_for(asyncio.gather(*(client(i) for i in range(50))), 40)
        await asyncio.sleep(0.5)
        assert server.connections == 0
    finally:
        server.close()
        await server.wait_closed()


async def test_open_quic_channel_owns_its_connection() -> None:
    server = await serve_quic(echo, "127.0.0.1", 0)
    try:
        ch = await open_quic_channel("127.0.0.1", server.port, fingerprint=server.fingerprint)
        conn = ch._owned_connection
        assert conn is not None
        await ch.send("x")
        assert await ch.recv() == "x"
        await ch.close()
        assert conn.closed
        ch2 = await open_quic_channel("127.0.0.1", server.port, fingerprint=server.fingerprint)
        conn2 = ch2._owned_connection
        assert conn2 is not None
        ch2.abort()
        assert conn2.closed
    finally:
        server.close()
        await server.wait_closed()


async def test_64_mib_binary_message() -> None:
    async def digest(channel: QuicChannel) -> None:
        message = await channel.recv()
        assert isinstance(message, bytes)
        await channel.send(f"{len(message)}:{hashlib.sha256(message).hexdigest()}")
        await channel.recv()

    payload = os.urandom(64 * MiB)
    limit = 64 * MiB + 16
    async with server_and_client(digest, max_message_size=limit, client={"max_message_size": limit}) as (
        server,
        conn,
    ):
        ch = await conn.open_channel()
        await ch.send(payload)
        assert (
            await asyncio.wait_for(ch.recv(), 40) == f"{len(payload)}:{hashlib.sha256(payload).hexdigest()}"
        )
        # The sender never buffered more than its watermark in aioquic.
        assert ch.stats.send_buffered_peak <= QuicTuning().stream_send_high
        assert conn.stats.send_buffered_peak <= QuicTuning().connection_send_high


# -- backpressure ------------------------------------------------------------------------------------


async def test_backpressure_bounds_memory_with_a_stalled_reader() -> None:
    tuning = QuicTuning(
        stream_send_high=256 * 1024,
        stream_send_low=128 * 1024,
        connection_send_high=384 * 1024,
        connection_send_low=192 * 1024,
        stream_window=512 * 1024,
        connection_window=1024 * 1024,
    )
    release = asyncio.Event()
    server_channels: list[QuicChannel] = []
    received: dict[int, int] = {}

    async def stalled(channel: QuicChannel) -> None:
        server_channels.append(channel)
        key = len(server_channels)
        first = await channel.recv()
        await release.wait()
        received[key] = len(first)
        while True:
            try:
                received[key] += len(await channel.recv())
            except TransportError:
                return

    message = b"\xab" * (128 * 1024)
    client = {"tuning": tuning, "close_timeout": 2.0}
    async with server_and_client(stalled, tuning=tuning, client=client) as (_, conn):
        channels = [await conn.open_channel() for _ in range(2)]
        sent = [0, 0]

        async def flood(i: int) -> None:
            for _ in range(200):  # 25 MiB per channel if nothing pushed back
                await channels[i].send(message)
                sent[i] += 1

        tasks = [asyncio.create_task(flood(i)) for i in range(2)]
        await asyncio.sleep(1.5)
        # Both senders are blocked: memory is bounded by the watermarks and the receive windows.
        assert not any(t.done() for t in tasks)
        for ch in channels:
            assert ch.send_buffered <= tuning.stream_send_high
            assert ch.stats.send_buffered_peak <= tuning.stream_send_high
            assert ch.stats.send_waits > 0
            assert ch._stream is not None and compat.unacked(ch._stream) <= tuning.stream_send_high
        assert conn.stats.send_buffered_peak <= tuning.connection_send_high
        # In flight + queued at the receiver is bounded by the flow-control windows (+ one message).
        assert sum(sent) * len(message) <= 2 * tuning.stream_window + 2 * tuning.stream_send_high + 2 * len(
            message
        )
        frame = len(message) + 5
        for sch in server_channels:
            # Unread bytes hold back credit: the window bounds what the stalled reader buffers.
            assert sch.stats.recv_queued_peak <= tuning.stream_window + frame
            assert sch.stats.bytes_received <= frame + tuning.stream_window  # one message read + window
        server_proto = server_channels[0]._link
        assert server_proto.stats.recv_queued_peak <= tuning.connection_window + len(message)
        # Reading resumes: everything arrives and the senders finish.
        release.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
        async with asyncio.timeout(10):
            while sum(received.values()) < 400 * len(message):
                await asyncio.sleep(0.05)
        assert sorted(received.values()) == [200 * len(message)] * 2


async def test_send_blocked_by_a_stalled_reader_fails_when_the_connection_closes() -> None:
    tuning = QuicTuning(stream_send_high=64 * 1024, stream_send_low=32 * 1024, stream_window=64 * 1024)

    async def stalled(channel: QuicChannel) -> None:
        await asyncio.sleep(30)

    async with server_and_client(stalled, tuning=tuning, client={"tuning": tuning}, close_timeout=0.5) as (
        server,
        conn,
    ):
        ch = await conn.open_channel()

        async def flood() -> None:
            while True:
                await ch.send(b"x" * 16384)

        task = asyncio.create_task(flood())
        await asyncio.sleep(0.5)
        assert not task.done()
        server.close()
        with pytest.raises(TransportError) as info:
            await asyncio.wait_for(task, 5)
        assert info.value.code == ErrorCode.GOING_AWAY and info.value.clean


# -- failures ----------------------------------------------------------------------------------------


async def test_peer_vanishing_is_detected_within_the_idle_timeout() -> None:
    failures: asyncio.Queue[tuple[TransportError, float]] = asyncio.Queue()

    async def handler(channel: QuicChannel) -> None:
        await channel.send(await channel.recv())
        err = await recv_error(channel, timeout=10)
        failures.put_nowait((err, time.monotonic()))
        with pytest.raises(TransportError):
            await channel.send("anyone there?")

    server = await serve_quic(handler, "127.0.0.1", 0, idle_timeout=1.0)
    try:
        conn = await connect_quic("127.0.0.1", server.port, fingerprint=server.fingerprint, idle_timeout=30)
        ch = await conn.open_channel()
        await ch.send("hi")
        assert await ch.recv() == "hi"
        conn._transport.abort()  # the client vanishes: no CONNECTION_CLOSE is sent
        vanished = time.monotonic()
        client_err = await recv_error(ch, timeout=2)
        assert "UDP socket closed" in str(client_err)
        err, at = await asyncio.wait_for(failures.get(), 10)
        assert at - vanished < 2.5
        assert not err.clean and "unreachable" in str(err) and "idle" in str(err)
        await conn.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_client_detects_a_vanished_server_on_recv_and_send() -> None:
    server = await serve_quic(echo, "127.0.0.1", 0)
    conn = await connect_quic("127.0.0.1", server.port, fingerprint=server.fingerprint, idle_timeout=1.0)
    try:
        reader = await conn.open_channel()
        writer = await conn.open_channel()
        await reader.send("r")
        assert await reader.recv() == "r"
        await writer.send("w")
        assert await writer.recv() == "w"
        assert server._transport is not None
        server._transport.abort()  # the server vanishes without a word
        started = time.monotonic()
        err = await recv_error(reader, timeout=5)
        assert time.monotonic() - started < 2.5
        assert not err.clean and "unreachable" in str(err)
        with pytest.raises(TransportError, match="unreachable"):
            for _ in range(1000):
                await writer.send(b"z" * 1000)
                await asyncio.sleep(0.01)
        with pytest.raises(TransportError):
            await conn.open_channel()
    finally:
        await conn.close()
        server.close()
        await server.wait_closed()


async def test_redial_replaces_a_lost_connection_once_for_all_callers() -> None:
    async with server_and_client(echo) as (server, conn):
        first = conn._protocol
        await conn.redial()  # alive: kept
        assert conn._protocol is first
        before = await conn.open_channel()
        conn._transport.abort()  # the connection is lost (not closed by its owner)
        await recv_error(before, timeout=2)
        with pytest.raises(TransportError):
            await conn.open_channel()
        await asyncio.gather(*(conn.redial() for _ in range(3)))  # three sessions resuming at once
        assert conn._protocol is not first and not conn.closed
        assert server.connections == 2  # one new connection (beside the old, not yet idle), not three
        channel = await conn.open_channel()
        await channel.send("again")
        assert await channel.recv() == "again"
    with pytest.raises(TransportError, match="closed"):
        await conn.redial()  # closed by its owner: not brought back


def _echo_until_error(errors: asyncio.Queue[TransportError]) -> Callable[[QuicChannel], Awaitable[None]]:
    """A channel handler that echoes until the channel fails, then reports the error."""

    async def handler(channel: QuicChannel) -> None:
        try:
            while True:
                await channel.send(await channel.recv())
        except TransportError as exc:
            errors.put_nowait(exc)

    return handler


async def test_stream_reset_ends_only_that_channel() -> None:
    errors: asyncio.Queue[TransportError] = asyncio.Queue()
    handler = _echo_until_error(errors)

    async with server_and_client(handler) as (_, conn):
        a, b = await conn.open_channel(), await conn.open_channel()
        for ch in (a, b):
            await ch.send("x")
            assert await ch.recv() == "x"
        a.abort(4321)
        err = await asyncio.wait_for(errors.get(), 5)
        assert err.code == 4321 and not err.clean and "reset by the peer" in str(err)
        with pytest.raises(TransportError) as info:
            await a.send("y")
        assert info.value.code == 4321
        for i in range(20):
            await b.send(f"b{i}")
            assert await b.recv() == f"b{i}"


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"\x09\x00\x00\x00\x01x", ErrorCode.FRAME_ERROR),
        (encode_header(1, 2) + b"\xc3\x28", ErrorCode.INVALID_UTF8),
        (encode_header(3, 1) + b"\x03", ErrorCode.FRAME_ERROR),
    ],
)
async def test_malformed_frame_ends_only_that_channel(raw: bytes, code: int) -> None:
    errors: asyncio.Queue[TransportError] = asyncio.Queue()
    handler = _echo_until_error(errors)

    async with server_and_client(handler) as (_, conn):
        bad, good = await conn.open_channel(), await conn.open_channel()
        await bad.send("fine so far")
        assert await bad.recv() == "fine so far"
        # Write malformed bytes straight onto the stream, below the framing layer.
        quic = conn._protocol.quic
        assert bad.stream_id is not None
        quic.send_stream_data(bad.stream_id, raw)
        conn._protocol.transmit()
        server_err = await asyncio.wait_for(errors.get(), 5)
        assert server_err.code == code and not server_err.clean
        client_err = await recv_error(bad)
        assert client_err.code == code and not client_err.clean
        for i in range(10):
            await good.send(f"g{i}")
            assert await good.recv() == f"g{i}"


async def test_max_message_size_is_enforced_per_channel() -> None:
    limit = 256 * 1024
    errors: asyncio.Queue[TransportError] = asyncio.Queue()

    async def handler(channel: QuicChannel) -> None:
        assert channel.max_message_size == limit
        command = await channel.recv()
        if command == "raise":
            channel.set_max_message_size(2 * limit)
        try:
            while True:
                message = await channel.recv()
                await channel.send(len(message).to_bytes(8, "big"))
        except TransportError as exc:
            errors.put_nowait(exc)

    async with server_and_client(handler, max_message_size=limit) as (_, conn):
        ok, over, raised = [await conn.open_channel() for _ in range(3)]
        await ok.send("keep")
        await ok.send(b"a" * limit)  # exactly the limit is fine
        assert await ok.recv() == limit.to_bytes(8, "big")

        await over.send("keep")
        await over.send(b"b" * (limit + 1))
        err = await asyncio.wait_for(errors.get(), 5)
        assert err.code == ErrorCode.MESSAGE_TOO_BIG and "exceeds max_message_size" in str(err)
        client_err = await recv_error(over)
        assert client_err.code == ErrorCode.MESSAGE_TOO_BIG
        assert "max_message_size" in str(client_err)
        with pytest.raises(TransportError, match="max_message_size"):
            await over.send("more")

        await raised.send("raise")
        await raised.send(b"c" * (limit + 1000))
        assert await raised.recv() == (limit + 1000).to_bytes(8, "big")
        await ok.send("x" * limit)  # the sibling still works
        assert await ok.recv() == limit.to_bytes(8, "big")


async def test_handler_exception_is_contained_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def fragile(channel: QuicChannel) -> None:
        while True:
            message = await channel.recv()
            if message == "boom":
                raise RuntimeError("handler bug")
            await channel.send(message)

    with caplog.at_level(logging.ERROR, logger="m2mwire.transport"):
        async with server_and_client(fragile) as (_, conn):
            a, b = await conn.open_channel(), await conn.open_channel()
            await b.send("b")
            assert await b.recv() == "b"
            await a.send("boom")
            err = await recv_error(a)
            assert err.code == ErrorCode.INTERNAL_ERROR and not err.clean
            await b.send("still here")
            assert await b.recv() == "still here"
    assert any("handler bug" in (r.exc_text or "") or r.exc_info for r in caplog.records)


async def test_connection_close_ends_all_channels_cleanly() -> None:
    errors: asyncio.Queue[TransportError] = asyncio.Queue()

    async def handler(channel: QuicChannel) -> None:
        await channel.send(await channel.recv())
        errors.put_nowait(await recv_error(channel))

    # Client closes the connection: every server channel sees an orderly end.
    async with server_and_client(handler) as (_, conn):
        channels = [await conn.open_channel() for _ in range(3)]
        for ch in channels:
            await ch.send("x")
            assert await ch.recv() == "x"
        await conn.close()
        for _ in channels:
            err = await asyncio.wait_for(errors.get(), 5)
            assert err.clean
        assert conn.closed

    # Server shuts down: every client channel sees an orderly end with GOING_AWAY.
    server = await serve_quic(echo, "127.0.0.1", 0)
    conn = await connect_quic("127.0.0.1", server.port, fingerprint=server.fingerprint)
    try:
        channels = [await conn.open_channel() for _ in range(3)]
        for ch in channels:
            await ch.send("x")
            assert await ch.recv() == "x"
        server.close()
        await server.wait_closed()
        for ch in channels:
            err = await recv_error(ch)
            assert err.clean and err.code == ErrorCode.GOING_AWAY
        with pytest.raises(TransportError):
            await conn.open_channel()
    finally:
        await conn.close()


async def test_unused_channel_costs_nothing_and_refused_streams_do_not_hurt() -> None:
    async with server_and_client(echo) as (_, conn):
        unused = await conn.open_channel()
        await unused.close()
        ch = await conn.open_channel()
        await ch.send("a")
        assert await ch.recv() == "a"
        assert ch.stream_id == 0
        # A unidirectional stream is not an m2mwire channel: refused, the connection carries on.
        quic = conn._protocol.quic
        uni = quic.get_next_available_stream_id(is_unidirectional=True)
        quic.send_stream_data(uni, b"\x01\x00\x00\x00\x01x")
        conn._protocol.transmit()
        await asyncio.sleep(0.1)
        await ch.send("b")
        assert await ch.recv() == "b"


async def test_connect_failures_are_clear() -> None:
    with pytest.raises(TransportError, match="timed out"):
        await connect_quic("127.0.0.1", _free_udp_port(), fingerprint="0" * 64, connect_timeout=0.5)
    with pytest.raises(TransportError, match="cannot resolve"):
        await connect_quic("no-such-host.invalid", 4433, insecure=True)


def _free_udp_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_tuning_defaults_and_validation() -> None:
    tuning = QuicTuning()
    assert tuning.datagram_size_for(loopback=True) == 16384
    assert tuning.datagram_size_for(loopback=False) == 1200
    assert QuicTuning(max_datagram_size=1452).datagram_size_for(loopback=True) == 1452
    assert ALPN == "m2mwire/1"
    with pytest.raises(ConfigError, match=r"QuicTuning \(tuning=\): need 0 < stream_send_low"):
        QuicTuning(stream_send_low=2, stream_send_high=1)
    with pytest.raises(ValueError):
        QuicTuning(max_datagram_size=1000)
    with pytest.raises(ValueError, match="16384"):
        QuicTuning(loopback_datagram_size=20000)
    with pytest.raises(ValueError):
        QuicTuning(stream_window=8 * MiB, connection_window=MiB)


async def test_a_peer_without_our_alpn_is_refused() -> None:
    from aioquic.asyncio.client import connect as aioquic_connect
    from aioquic.quic.configuration import QuicConfiguration

    server = await serve_quic(echo, "127.0.0.1", 0)
    try:
        config = QuicConfiguration(is_client=True, alpn_protocols=["h3"], verify_mode=ssl.CERT_NONE)
        with pytest.raises(ConnectionError):
            async with asyncio.timeout(10):
                async with aioquic_connect("127.0.0.1", server.port, configuration=config):
                    pass
        # The same client with our ALPN gets in.
        config = QuicConfiguration(is_client=True, alpn_protocols=[ALPN], verify_mode=ssl.CERT_NONE)
        async with aioquic_connect("127.0.0.1", server.port, configuration=config) as client:
            await client.ping()
    finally:
        server.close()
        await server.wait_closed()


async def test_concurrent_close_calls_all_wait_for_the_close() -> None:
    async with server_and_client(echo) as (_, conn):
        ch = await conn.open_channel()
        await ch.send(os.urandom(3 * MiB))
        drained_when_done: list[bool] = []
        closers = [asyncio.create_task(ch.close()) for _ in range(3)]
        for task in closers:
            task.add_done_callback(lambda _: drained_when_done.append(ch._drained()))
        done, _ = await asyncio.wait(closers, timeout=10)
        assert len(done) == 3
        # None returned before the 3 MiB and the FIN were acknowledged.
        assert drained_when_done == [True, True, True]
        assert ch._stream is not None and ch._stream.sender.is_finished
