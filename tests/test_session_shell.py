"""The Session shell (m2mwire/shell/session.py) over the in-memory channel pair: no sockets, so
backpressure, cancellation and closing are observed exactly (what is buffered where, who waits).

Sessions run through the public serve()/connect() with the in-memory transport registered under a
test-only scheme (the ``memory_scheme`` fixture); each server's in-memory buffer per direction is
set small, so a few messages fill it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from m2mwire.api import Server, Session, connect, serve
from m2mwire.errors import SessionClosed, SessionTimeout, TransportError
from m2mwire.reconnect import Reconnect
from m2mwire.session.core import SessionProtocol
from m2mwire.session.payload import Message
from m2mwire.session.states import Role
from m2mwire.transport.memory import MemoryChannel, MemoryListener

pytestmark = pytest.mark.timeout(20)  # a broken shell shows as a wait that never ends

_BUFFER = 4096  # bytes per direction in the in-memory connection
_PAYLOAD = "x" * 1000


@asynccontextmanager
async def running(
    scheme: str, handler: Callable[[Session], Awaitable[None]], **options: Any
) -> AsyncIterator[Server]:
    # No compression: a message then takes on the wire what its text takes, and the buffer
    # bounds below can be stated in messages.
    async with serve(handler, f"{scheme}://shell", algorithms=["none"], **options) as server:
        listener = server._impl
        assert isinstance(listener, MemoryListener)
        listener.buffer_bytes = _BUFFER
        yield server


async def settle(turns: int = 50) -> None:
    """Let every callback and task that can run, run (bounded: a fixed number of loop turns)."""
    for _ in range(turns):
        await asyncio.sleep(0)


def channel_of(session: Session) -> MemoryChannel:
    channel = session._channel
    assert isinstance(channel, MemoryChannel)
    return channel


async def sink(session: Session) -> None:
    """A handler that reads everything and answers nothing."""
    async for _ in session:
        pass


@asynccontextmanager
async def loop_turns() -> AsyncIterator[list[int]]:
    """Counts the event loop's turns while the block runs (the count in the list's one item)."""
    turns = [0]

    async def ticker() -> None:
        while True:
            await asyncio.sleep(0)
            turns[0] += 1

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)  # the ticker is running: turns from here on count
    turns[0] = 0
    try:
        yield turns
    finally:
        ticking.cancel()


async def test_messages_keep_their_order_both_ways(memory_scheme: str) -> None:
    async def echo(session: Session) -> None:
        async for message in session:
            await session.send(message.json() if message.kind == "json" else message.text or "")

    sent: list[Any] = [{"i": i} if i % 3 == 0 else f"m{i} {_PAYLOAD}" for i in range(200)]
    async with running(memory_scheme, echo) as server, connect(server.url) as client:
        writer = asyncio.create_task(_send_all(client, sent))
        got = [await asyncio.wait_for(client.recv(), 5) for _ in sent]
        await writer
    assert [m.json() if m.kind == "json" else m.text for m in got] == sent


async def _send_all(session: Session, items: list[Any]) -> None:
    for item in items:
        await session.send(item)


async def test_a_full_inbox_pauses_reading_and_the_peer_waits(memory_scheme: str) -> None:
    produced: list[int] = []

    async def producer(session: Session) -> None:
        for i in range(60):
            await session.send(f"{i} {_PAYLOAD}")
            produced.append(i)
        async for _ in session:  # until the client closes
            pass

    async with running(memory_scheme, producer) as server, connect(server.url, max_queue=4) as client:
        channel = channel_of(client)
        await settle()
        # The client's inbox is full: it stopped reading, its in-memory buffer filled, and the
        # server's send() waits: nothing is held beyond the two bounds.
        assert channel.reading_paused
        assert len(client._inbox) == 4
        assert channel.buffered_bytes <= _BUFFER + len(_PAYLOAD) + 8
        assert 4 <= len(produced) < 15
        got = [(await asyncio.wait_for(client.recv(), 5)).text for _ in range(60)]
        assert got == [f"{i} {_PAYLOAD}" for i in range(60)]
        assert produced == list(range(60))
        assert not channel.reading_paused


async def test_max_queue_bytes_bounds_the_inbox_in_bytes(memory_scheme: str) -> None:
    big = "y" * 2000

    async def producer(session: Session) -> None:
        for i in range(40):
            await session.send(f"{i:02d}{big}")
        async for _ in session:  # until the client closes
            pass

    options: dict[str, Any] = {"max_queue": 1000, "max_queue_bytes": 8192}
    async with running(memory_scheme, producer) as server, connect(server.url, **options) as client:
        await settle()
        assert channel_of(client).reading_paused
        # Paused once the inbox held 8 KiB: at most one message beyond it.
        assert 8192 <= client._inbox_bytes < 8192 + 2 * 2100
        assert len(client._inbox) < 8
        got = [(await asyncio.wait_for(client.recv(), 5)).text for _ in range(40)]
        assert got == [f"{i:02d}{big}" for i in range(40)]


def reader_after(start: asyncio.Event, received: list[str]) -> Callable[[Session], Awaitable[None]]:
    """A handler that reads nothing until ``start`` is set, then records every message's text
    until "after"."""

    async def handler(session: Session) -> None:
        await start.wait()
        async for message in session:
            received.append(message.text or "")
            if message.text == "after":
                return

    return handler


async def test_a_cancelled_send_still_delivers_its_message_whole_and_once(memory_scheme: str) -> None:
    start_reading = asyncio.Event()
    received: list[str] = []
    slow_reader = reader_after(start_reading, received)

    async with running(memory_scheme, slow_reader, max_queue=1) as server, connect(server.url) as client:
        sent: list[str] = []
        for i in range(100):  # until a send has to wait: the server reads nothing yet
            message = f"{i} {_PAYLOAD}"
            task = asyncio.create_task(client.send(message))
            sent.append(message)
            await settle(5)
            if not task.done():
                break
        assert not task.done(), "the in-memory buffers never filled"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        start_reading.set()
        await asyncio.wait_for(client.send("after"), 5)
        for _ in range(200):
            if received[-1:] == ["after"]:
                break
            await asyncio.sleep(0.01)
    assert received == [*sent, "after"]


async def test_a_send_after_a_cancelled_one_does_not_overtake_it(memory_scheme: str) -> None:
    """A send() cancelled (here by a timeout) leaves its message to a write task, waiting for
    room. A smaller message sent next, at once, fits in the room left and must not go first:
    send()'s synchronous path waits its turn while a write is in flight (stop 32's review found
    it overtaking)."""
    start_reading = asyncio.Event()
    received: list[str] = []
    slow_reader = reader_after(start_reading, received)

    async with running(memory_scheme, slow_reader, max_queue=1) as server, connect(server.url) as client:
        sent: list[str] = []
        for i in range(100):  # until a send has to wait: the server reads nothing yet
            message = f"{i} {_PAYLOAD}"
            sent.append(message)
            try:
                async with asyncio.timeout(0.05):
                    await client.send(message)
            except TimeoutError:
                break
        else:
            pytest.fail("the in-memory buffers never filled")
        start_reading.set()
        # In the same task, before the writer task runs: "after" fits in the room the waiting
        # message does not, so the channel would take it now.
        await client.send("after")
        for _ in range(200):
            if received[-1:] == ["after"]:
                break
            await asyncio.sleep(0.01)
    assert received == [*sent, "after"]


async def test_a_connect_cancelled_after_its_handshake_ends_the_session(
    memory_scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """connect() preloads tokenizers after the handshake (~0.2 s in a thread). A timeout around
    connect() that fired then left an established session nobody referred to: its writer task
    and pings kept it open at both ends for as long as the process lived (stop 32's review)."""
    ended = asyncio.Event()

    async def handler(session: Session) -> None:
        with contextlib.suppress(SessionClosed, TransportError):
            async for _ in session:
                pass
        ended.set()

    async def slow_warm_up(*_args: object) -> None:
        await asyncio.sleep(5)

    monkeypatch.setattr("m2mwire.shell.client.warm_tokenizers", slow_warm_up)
    original_close = MemoryChannel.close

    async def slow_close(self: MemoryChannel, *args: Any) -> None:
        await asyncio.sleep(3)  # a transport whose close exchange takes its time
        await original_close(self, *args)

    monkeypatch.setattr(MemoryChannel, "close", slow_close)
    async with running(memory_scheme, handler) as server:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await connect(server.url)
        # The timeout is the caller's: the close goes on in the background (stop 33; it waited
        # for the close exchange: 3.3 s here).
        assert time.monotonic() - start < 2.0
        await asyncio.wait_for(ended.wait(), 5)  # before stop 32: never
        for _ in range(100):  # the server's own transport close is slow too
            if not server.active_sessions:
                break
            await asyncio.sleep(0.1)
        assert server.active_sessions == 0


async def test_a_message_the_session_fails_to_process_ends_it_with_internal_error(
    memory_scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug while processing a message ended the session with a TransportError that named no
    cause, and with resume it only detached: the peer sent the same message again after each
    resume, and it failed again until max_elapsed (stop 32's review). It now ends the session
    for good, INTERNAL_ERROR, with the exception as the cause, and tells the peer so: the peer
    saw only a lost connection and, with resume, waited out resume_window (stop 33)."""
    server_side: asyncio.Future[Session] = asyncio.get_running_loop().create_future()

    async def echo(session: Session) -> None:
        server_side.set_result(session)
        async for message in session:
            await session.send(message.text or "")

    original = SessionProtocol.receive_text

    def failing(self: SessionProtocol, data: bytes | str, now: float) -> Message | None:
        if self.role is Role.CLIENT and "boom" in (data if isinstance(data, str) else data.decode()):
            raise RuntimeError("boom")
        return original(self, data, now)

    async with running(memory_scheme, echo, resume_window=30) as server:
        session = await connect(server.url, reconnect=Reconnect(initial_delay=0.01, max_elapsed=10))
        await session.send("fine")
        assert (await asyncio.wait_for(session.recv(), 5)).text == "fine"
        monkeypatch.setattr(SessionProtocol, "receive_text", failing)
        await session.send("boom")  # its echo is what fails, at the client
        with pytest.raises(SessionClosed) as caught:
            await asyncio.wait_for(session.recv(), 5)
        assert caught.value.code == "INTERNAL_ERROR"
        assert isinstance(caught.value.__cause__, RuntimeError) and "RuntimeError: boom" in str(caught.value)
        assert session.stats.reconnects == 0
        peer = await server_side
        await asyncio.wait_for(peer.wait_closed(), 5)  # the old code: detached for resume_window
        assert peer.close_event is not None and peer.close_event.by_peer
        assert peer.close_event.code == "INTERNAL_ERROR" and "boom" not in peer.close_event.reason
        lost = channel_of(session).lost
        assert lost is not None and lost.clean and lost.code == 1011


async def test_close_handshake_codes(memory_scheme: str) -> None:
    server_side: asyncio.Future[Session] = asyncio.get_running_loop().create_future()

    async def until_closed(session: Session) -> None:
        server_side.set_result(session)
        async for _ in session:
            pass

    async with running(memory_scheme, until_closed) as server:
        client = await connect(server.url)
        channel = channel_of(client)
        peer = await server_side
        await client.close("done")
        assert client.close_event is not None and client.close_event.code == "NORMAL"
        assert not client.close_event.by_peer
        await asyncio.wait_for(peer.wait_closed(), 5)
        assert peer.close_event is not None and peer.close_event.by_peer
        assert peer.close_event.reason == "done"
        # The session's CLOSE exchange ended with the transport's orderly close, code 1000.
        assert channel.lost is not None and channel.lost.clean and channel.lost.code == 1000


async def test_a_failing_handler_closes_with_internal_error(memory_scheme: str) -> None:
    async def broken(session: Session) -> None:
        await session.recv()
        raise RuntimeError("bug")

    async with running(memory_scheme, broken) as server, connect(server.url) as client:
        await client.send("trigger")
        with pytest.raises(SessionClosed) as caught:
            await asyncio.wait_for(client.recv(), 5)
        assert caught.value.code == "INTERNAL_ERROR"
        assert client.close_event is not None and client.close_event.by_peer
        # Both ends acknowledged the CLOSE exchange and closed the transport in order (whichever
        # close came first: the client's 1000 with the server's reason, or the server's 1011).
        await settle()
        lost = channel_of(client).lost
        assert (
            lost is not None
            and lost.clean
            and (lost.code, lost.reason)
            in (
                (1000, "INTERNAL_ERROR"),
                (1011, "INTERNAL_ERROR"),
            )
        )


async def test_an_aborted_connection_raises_transport_error(memory_scheme: str) -> None:
    server_side: asyncio.Future[Session] = asyncio.get_running_loop().create_future()

    async def hold(session: Session) -> None:
        server_side.set_result(session)
        await session.wait_closed()

    async with running(memory_scheme, hold) as server, connect(server.url) as client:
        peer = await server_side
        channel_of(peer).abort()
        with pytest.raises(TransportError):
            await asyncio.wait_for(client.recv(), 5)
        with pytest.raises(TransportError):
            await client.send("too late")
        assert client.close_event is not None and client.close_event.error is not None


async def test_a_peer_that_reads_nothing_is_dropped_after_write_timeout(memory_scheme: str) -> None:
    async def never_reads(session: Session) -> None:
        await session.wait_closed()

    loop = asyncio.get_running_loop()
    async with running(memory_scheme, never_reads, max_queue=1) as server:
        client = await connect(server.url, timers={"write_timeout": 0.2})
        started = loop.time()
        with pytest.raises(SessionTimeout, match="write_timeout"):
            for i in range(1000):
                await asyncio.wait_for(client.send(f"{i} {_PAYLOAD}"), 5)
        waited = loop.time() - started
        assert client.close_event is not None and client.close_event.code == "WRITE_TIMEOUT"
        assert 0.2 <= waited < 2.0
        # The connection was dropped, not closed in order: nothing more could be written.
        lost = channel_of(client).lost
        assert lost is not None and not lost.clean
        await client.close()


async def test_a_sending_loop_gives_the_event_loop_a_turn(memory_scheme: str) -> None:
    """A send() the channel takes at once never suspends: without a turn of the event loop now and
    then, a sending loop on a fast connection starves every other task (other sessions, timers)
    and, with reconnect=True, never reads the peer's ACKs, so it keeps up to resume_buffer_bytes of
    messages the peer has long acknowledged. send() gives the loop a turn per 1,024 messages."""
    async with running(memory_scheme, sink) as server:
        server._impl.buffer_bytes = 1 << 30  # room for everything: no send() ever waits
        async with connect(server.url, algorithms=["none"], reconnect=True) as client:
            async with loop_turns() as turns:
                for _ in range(8 * 1024):
                    await client.send("x" * 100)
                ticked = turns[0]
    assert 7 <= ticked <= 9  # one turn per 1,024 messages sent, not one per message


async def turns_while_reading(scheme: str, text: str, work: float) -> int:
    """The event loop's turns while a handler takes 32 queued messages of ``text`` (all in its
    inbox: recv() need not wait) and works ``work`` seconds on each, holding the loop."""
    ready = asyncio.Event()
    ticked: list[int] = []

    async def reader(session: Session) -> None:
        await ready.wait()
        async with loop_turns() as turns:
            for _ in range(32):
                await session.recv()
                time.sleep(work)
            ticked.append(turns[0])

    async with running(scheme, reader, max_queue=64, max_queue_bytes=64 << 20) as server:
        server._impl.buffer_bytes = 64 << 20
        async with connect(server.url, algorithms=["none"]) as client:
            for _ in range(32):
                await client.send(text)
            await settle()
            ready.set()
            async with asyncio.timeout(10):
                while not ticked:
                    await asyncio.sleep(0.01)
    return ticked[0]


async def test_a_reading_loop_gives_the_event_loop_a_turn_per_few_mib_decoded(memory_scheme: str) -> None:
    """recv() returns at once while the inbox has messages (and decodes held ones on the way):
    an application reading in a loop kept the event loop, and every other session, until the
    inbox was empty. 199-byte messages decoding to 16 MiB each made that seconds at a time
    (stop 32's attack run). recv() now gives the loop a turn once it took 4 MiB without
    waiting."""
    ticked = await turns_while_reading(memory_scheme, "x" * (1 << 20), 0.0)
    # One per 4 MiB taken (the old code: 0), and some per 10 ms on a slow machine; not one per message.
    assert 6 <= ticked < 32, ticked


async def test_a_reading_loop_that_works_on_each_message_gives_the_event_loop_a_turn_every_10_ms(
    memory_scheme: str,
) -> None:
    """A handler spending 1.4 ms on each 53-byte KV-cache frame (a loop over its layers) took
    250 of them per 4 MiB turn: every other session waited 0.36 s at a time (stop 33's second
    attack run). recv() also gives the loop a turn once it has returned messages without
    waiting for _TURN_SECONDS (10 ms)."""
    ticked = await turns_while_reading(memory_scheme, "small", 0.002)  # 64 ms of work in all
    assert ticked >= 3, ticked  # one per 10 ms (the old code: 0)


async def test_a_send_refused_until_the_next_loop_turn_needs_no_write_task(memory_scheme: str) -> None:
    """A channel refuses send_now() when its buffer is full, and often only until the event loop's
    next turn (the reader drains it; QUIC refuses once a turn's writes reach its flush threshold).
    send() then gives the loop that turn and writes directly: the slow path (channel.send() in a
    task of its own, with a write_timeout timer) only for a refusal that outlasts it."""
    async with running(memory_scheme, sink) as server, connect(server.url) as client:
        channel = channel_of(client)
        send_now, send = channel.send_now, channel.send
        refused = slow = 0

        def counted_send_now(message: Any, text: bool = False) -> bool:
            nonlocal refused
            taken = send_now(message, text)
            refused += not taken
            return taken

        async def counted_send(message: Any, text: bool = False) -> None:
            nonlocal slow
            slow += 1
            await send(message, text)

        channel.send_now = counted_send_now  # type: ignore[method-assign]
        channel.send = counted_send  # type: ignore[method-assign]
        async with asyncio.timeout(10):  # no wait_for per send: its task would give a turn each
            for i in range(200):  # the server's 4 KiB buffer holds ~3 of these: sends find it full
                await client.send(f"{i:03d} {_PAYLOAD}")
    assert refused >= 50, f"only {refused} refusals: the buffer did not fill"
    assert slow <= 2, f"{slow} of {refused} refused sends took the slow path"


async def test_writing_a_long_queue_gives_the_event_loop_a_turn(memory_scheme: str) -> None:
    """A resume's replay queues up to a whole retention buffer (~100,000 small messages, ~250 ms
    of writes): written without a turn of the event loop, it stalled every other session for
    that long, and went on writing into a connection already lost. The writer gives the loop a
    turn per 1,024 messages written at once, as send() does."""
    async with running(memory_scheme, sink) as server:
        server._impl.buffer_bytes = 1 << 30  # room for everything: every write goes at once
        async with connect(server.url, algorithms=["none"]) as client:
            protocol, now = client._protocol, asyncio.get_running_loop().time()
            for _ in range(8 * 1024):  # queued in the core, as a replay is
                protocol.send("x" * 100, now)
            async with loop_turns() as turns:
                await client._write_pending()
                ticked = turns[0]
            assert not protocol.has_output
    assert 7 <= ticked <= 9  # one turn per 1,024 messages written, not none


# -- messages a transport delivers after the pause (the rest of its read): held, then lost -------


@pytest.mark.parametrize("noticed_by", ["the channel", "a failed write"])
async def test_a_lost_channel_drops_held_messages_and_ends_the_session_at_once(
    memory_scheme: str, noticed_by: str
) -> None:
    """A WebSocket channel delivers the rest of a read after the session paused it; the session
    holds those messages undecoded (_held). For a while a loss without resume waited behind
    them until the application read them: a session that only sent, or waited in wait_closed(),
    then had sends "succeed" into nothing and never ended, as paused reading stops the ping
    timers (stop 31's code review). A loss, however noticed, now drops them (they were not
    taken: with resume the peer sends them again) and ends the session at once."""
    from m2mwire.schemas.messages import DataPayload, encode_data

    sessions: list[Session] = []
    release = asyncio.Event()
    got: list[str] = []

    async def slow(session: Session) -> None:
        sessions.append(session)
        await release.wait()
        with pytest.raises((SessionClosed, TransportError)):
            async for message in session:
                got.append(message.text or "")

    async with running(memory_scheme, slow, max_queue=2, resume_window=0) as server:
        async with connect(server.url) as client:
            for i in range(2):  # the inbox is full: reading pauses
                await client.send(f"m{i}")
            async with asyncio.timeout(5):
                while not sessions or len(sessions[0]._inbox) < 2:
                    await asyncio.sleep(0.01)
            session = sessions[0]
            assert session._paused
            sid = session.info.session_id
            for i in range(2, 5):  # what a transport's read delivers past the pause
                data = encode_data(DataPayload(algorithm="none", content=f"m{i}"), sid)
                session._feed(data if isinstance(data, bytes) else data.encode(), True)
            assert len(session._held) == 3
            loss = TransportError("connection reset", clean=False)
            if noticed_by == "the channel":
                session._channel_lost(session._channel, loss)
            else:
                session._on_transport_closed(loss)
            assert not session._held
            await asyncio.wait_for(session.wait_closed(), 2)
            with pytest.raises((SessionClosed, TransportError)):
                await session.send("after the loss")
            release.set()
            async with asyncio.timeout(5):
                while len(got) < 2:
                    await asyncio.sleep(0.01)
            assert got == ["m0", "m1"]  # what was taken before the loss is still read
