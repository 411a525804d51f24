"""The QUIC channel's push interface and synchronous write, as the session uses them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

import m2mwire
from m2mwire.errors import TransportError
from m2mwire.transport.base import DirectSendChannel, Message, PushChannel
from m2mwire.transport.framing import HEADER_SIZE, KIND_BINARY, encode_header
from m2mwire.transport.quic import QuicChannel, QuicClientConnection, QuicTuning, connect_quic, serve_quic
from m2mwire.transport.quic.channel import _frame

pytestmark = pytest.mark.timeout(60)

KiB = 1024


class Pushed:
    """A server handler that takes its channel's messages by push, and waits until told to end."""

    def __init__(self, *, pause_after: int | None = None) -> None:
        self.pause_after = pause_after
        self.channel: QuicChannel | None = None
        self.messages: list[Message] = []
        self.texts: list[bool] = []  # each message's text flag
        self.lost: list[TransportError] = []
        self.ready = asyncio.Event()
        self.done = asyncio.Event()

    async def __call__(self, channel: QuicChannel) -> None:
        self.channel = channel

        def on_message(message: Message, text: bool) -> None:
            self.messages.append(message)
            self.texts.append(text)
            if self.pause_after and len(self.messages) >= self.pause_after:
                channel.pause_reading()

        if self.pause_after == 0:
            channel.pause_reading()  # before any message is handed over
        channel.start_push(on_message, self.lost.append)
        self.ready.set()
        await self.done.wait()


@asynccontextmanager
async def connected(
    handler: Callable[[QuicChannel], Awaitable[None]], tuning: QuicTuning | None = None
) -> AsyncIterator[QuicClientConnection]:
    server = await serve_quic(handler, "127.0.0.1", 0, tuning=tuning)
    try:
        conn = await connect_quic("127.0.0.1", server.port, fingerprint=server.fingerprint, tuning=tuning)
        try:
            yield conn
        finally:
            conn.abort()
    finally:
        server.close()
        await server.wait_closed()


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # bounded by the timeout
            await asyncio.sleep(0.01)


async def test_paused_reading_stops_consuming_so_the_window_bounds_memory() -> None:
    tuning = QuicTuning(
        stream_window=256 * KiB,
        connection_window=1024 * KiB,
        stream_send_high=256 * KiB,
        stream_send_low=128 * KiB,
    )
    handler = Pushed(pause_after=1)
    message = b"\x5a" * (64 * KiB)
    async with connected(handler, tuning) as conn:
        ch = await conn.open_channel()
        assert isinstance(ch, PushChannel) and isinstance(ch, DirectSendChannel)

        async def flood() -> None:
            for i in range(64):  # 4 MiB, 16 windows
                await ch.send(bytes([i]) + message)

        sender = asyncio.create_task(flood())
        await until(lambda: handler.channel is not None and ch.stats.send_waits > 0)
        await asyncio.sleep(0.3)
        server_ch = handler.channel
        assert server_ch is not None
        # Paused after the first message: nothing more delivered, nothing more credited.
        assert len(handler.messages) == 1 and not sender.done()
        frame = len(message) + 1 + 5
        assert server_ch.stats.bytes_received <= frame + tuning.stream_window
        assert server_ch.recv_queued <= tuning.stream_window
        assert ch.send_buffered <= tuning.stream_send_high
        # Resumed: every message arrives, in order, and the sender finishes.
        handler.pause_after = None
        server_ch.resume_reading()
        await asyncio.wait_for(sender, 10)
        await until(lambda: len(handler.messages) == 64)
        assert [m[0] for m in handler.messages] == list(range(64))  # type: ignore[index]
        assert not handler.lost
        handler.done.set()


async def test_an_orderly_end_follows_the_messages_but_a_reset_is_reported_at_once() -> None:
    handler = Pushed(pause_after=0)
    async with connected(handler) as conn:
        ch = await conn.open_channel()
        for text in ("a", "b", "c"):
            await ch.send(text)
        await asyncio.wait_for(ch.close(1000, "bye"), 5)
        await until(lambda: handler.channel is not None and handler.channel.stats.bytes_received > 0)
        await asyncio.sleep(0.1)
        server_ch = handler.channel
        assert server_ch is not None
        assert handler.messages == [] and handler.lost == []  # paused: the end waits behind the data
        handler.pause_after = None
        server_ch.resume_reading()
        await until(lambda: bool(handler.lost))
        # text arrives as its UTF-8 bytes and the text flag, as the session takes it
        assert handler.messages == [b"a", b"b", b"c"] and handler.texts == [True] * 3
        assert len(handler.lost) == 1 and handler.lost[0].clean and handler.lost[0].code == 1000
        handler.done.set()

    broken = Pushed(pause_after=0)
    async with connected(broken) as conn:
        ch = await conn.open_channel()
        await ch.send("never read")
        await until(lambda: broken.channel is not None and broken.channel.stats.bytes_received > 0)
        ch.abort()
        await until(lambda: bool(broken.lost))  # while still paused
        assert broken.messages == [] and not broken.lost[0].clean
        broken.done.set()


async def test_send_now_writes_whole_messages_or_nothing() -> None:
    tuning = QuicTuning(stream_send_high=100_000, stream_send_low=50_000, flush_threshold=60_000)
    handler = Pushed(pause_after=0)
    message = b"\x01" * 10_000
    async with connected(handler, tuning) as conn:
        ch = await conn.open_channel()
        written = 0
        while ch.send_now(message):  # bounded: the flush threshold stops it
            written += 1
        # 6 frames of 10,005 bytes reach the 60,000-byte flush threshold: the 7th waits for the
        # transmit, which runs when this task yields.
        assert written == 6 and ch.stats.bytes_sent == 6 * 10_005
        await asyncio.sleep(0)
        while ch.send_now(message):  # bounded: the high watermark stops it
            written += 1
        # At most 100,000 unacknowledged bytes: 9 whole frames, and nothing of a 10th.
        assert written == 9 and ch.stats.bytes_sent == 9 * 10_005
        await ch.send(message)  # waits for ACKs, then writes
        handler.channel.resume_reading()  # type: ignore[union-attr]
        await until(lambda: len(handler.messages) == 10)
        assert all(m == message for m in handler.messages)
        await ch.close()
        assert not ch.send_now(message)
        handler.done.set()


async def _echo(session: Any) -> None:
    async for message in session:
        await session.send(message.text)


async def test_a_quic_session_reads_by_push_without_a_reader_task() -> None:
    sessions: list[Any] = []

    async def handler(session: Any) -> None:
        sessions.append(session)
        await _echo(session)

    async with m2mwire.serve(handler, "quic://127.0.0.1:0") as server:
        async with m2mwire.connect(server.url, fingerprint=server.fingerprint) as session:
            for i in range(20):
                await session.send(f"hello {i}")
                assert (await session.recv()).text == f"hello {i}"
            for s in (session, sessions[0]):
                # the channel pushes into the session: no task reads it
                assert isinstance(s._channel, QuicChannel) and s._channel._on_message is not None
                assert not [t for t in s._tasks if "reader" in t.get_name()]


async def test_buffers_of_any_item_format_are_sent_as_their_bytes() -> None:
    handler = Pushed()
    small = np.arange(10, dtype=np.float32)  # joined with the header into one write
    large = np.arange(40_000, dtype=np.float64)  # 320,000 bytes: written piecewise, never joined
    async with connected(handler) as conn:
        ch = await conn.open_channel()
        assert ch.send_now([b"ab", memoryview(small)])
        await ch.send([memoryview(large), b"z"])
        await until(lambda: len(handler.messages) == 2)
        assert handler.messages == [b"ab" + small.tobytes(), large.tobytes() + b"z"]
        assert handler.texts == [False, False]
        handler.done.set()


def test_the_small_parts_of_a_large_message_are_joined_into_one_write() -> None:
    """Each write costs aioquic bookkeeping of its own (a range, a buffer append, ~2 us): a large
    AVP frame (its head, then the tensor) goes out as two writes, the header joined with the head,
    and the tensor as a view of the caller's memory (never copied into a joined frame)."""
    head, tensor, tail = b"H" * 100, np.arange(20_000, dtype=np.float32), b"T" * 10
    size, pieces = _frame((head, memoryview(tensor), tail))
    assert size == HEADER_SIZE + 100 + 80_000 + 10
    assert len(pieces) == 3  # header + head, the tensor, the tail
    assert isinstance(pieces[1], memoryview) and pieces[1].obj is tensor
    expected = encode_header(KIND_BINARY, 80_110) + head + tensor.tobytes() + tail
    assert b"".join(bytes(p) for p in pieces) == expected
    assert len(_frame((head, memoryview(tensor)))[1]) == 2
