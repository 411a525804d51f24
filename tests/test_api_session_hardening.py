"""Issue 11 (session layer): attacks and misuse that lost data, pinned memory or hung a shutdown.

Each test reproduces one finding over real loopback transports and failed before the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import logging
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from m2mwire.api import Server, Session, connect, serve
from m2mwire.errors import M2MError, SessionClosed, SessionTimeout

TRANSPORTS = ["ws", "quic"]


@pytest.fixture(params=TRANSPORTS)
def scheme(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def client_opts(server: Server) -> dict[str, Any]:
    return {"fingerprint": server.fingerprint} if server.fingerprint else {}


@asynccontextmanager
async def running(
    handler: Callable[[Session], Awaitable[None]], scheme: str, **options: Any
) -> AsyncIterator[Server]:
    async with serve(handler, f"{scheme}://127.0.0.1:0", **options) as server:
        yield server


def hello(**compression: Any) -> str:
    caps = {"algorithms": ["none"], "max_payload": 0, "streaming": False, "ml_routing": False}
    caps.update(compression)
    payload = {"version": "3.0", "agent_id": "raw", "agent_type": "raw", "compression": caps}
    return json.dumps({"type": "HELLO", "payload": payload, "timestamp": 1})


def data(sid: str, text: str) -> str:
    payload = {"algorithm": "none", "content": text, "original_size": len(text), "content_type": "text"}
    return json.dumps({"type": "DATA", "session_id": sid, "payload": payload, "timestamp": 1})


def close_msg(sid: str, reason: str = "NORMAL") -> str:
    payload = {"reason": reason, "message": "bye"}
    return json.dumps({"type": "CLOSE", "session_id": sid, "payload": payload, "timestamp": 1})


async def slow_echo(session: Session) -> None:
    async for message in session:
        await asyncio.sleep(0.02)  # the reply takes a moment to compute
        await session.send("re:" + (message.text or ""))


# -- 11.2: a CLOSE must not drop the replies the application still owes ----------------------------


async def test_replies_owed_at_a_peer_close_arrive_before_the_acknowledgement() -> None:
    async with running(slow_echo, "ws") as server:
        async with ws_connect(server.url, compression=None) as ws:
            await ws.send(hello())
            sid = json.loads(await ws.recv())["session_id"]
            for i in range(5):
                await ws.send(data(sid, f"m{i}"))
            await ws.send(close_msg(sid))
            seen: list[tuple[str, str]] = []
            async with asyncio.timeout(5):
                while not seen or seen[-1][0] != "CLOSE":
                    msg = json.loads(await ws.recv())
                    seen.append((msg["type"], msg["payload"].get("content", "")))
    assert seen == [("DATA", f"re:m{i}") for i in range(5)] + [("CLOSE", "")]


async def test_a_peer_close_with_a_long_non_ascii_reason_still_closes_in_order() -> None:
    """The server's close frame carries the peer's CLOSE reason, cut to 100 characters: 100
    three-byte characters are 300 bytes, over the 123 a close frame holds, and websockets refused
    to send it: the orderly close became a cut connection (no close frame). Now cut to 123 bytes
    at a character's end."""
    async with running(slow_echo, "ws") as server:
        async with ws_connect(server.url, compression=None) as ws:
            await ws.send(hello())
            sid = json.loads(await ws.recv())["session_id"]
            await ws.send(close_msg(sid, "€" * 60))
            with pytest.raises(ConnectionClosed) as info:
                async with asyncio.timeout(5):
                    while True:
                        await ws.recv()
    assert info.value.rcvd is not None, "the server cut the connection instead of closing it"
    assert (info.value.rcvd.code, info.value.rcvd.reason) == (1000, "€" * 41)


async def test_client_close_waits_for_the_servers_replies(scheme: str) -> None:
    async with running(slow_echo, scheme) as server:
        client = await connect(server.url, **client_opts(server))
        for i in range(5):
            await client.send(f"m{i}")
        await asyncio.wait_for(client.close(), 10)
        replies = [(await client.recv()).text for _ in range(5)]  # received before the end
        assert replies == [f"re:m{i}" for i in range(5)]
        event = client.close_event
        assert event is not None and event.error is None, event


# -- 11.3: a cancelled send() is still sent, whole and in order --------------------------------------


async def test_a_cancelled_send_is_still_sent_without_a_later_send(scheme: str) -> None:
    got: list[str] = []
    arrived = asyncio.Event()

    async def collect(session: Session) -> None:
        await asyncio.sleep(0.5)  # reads nothing at first: the client's sends must wait
        async for message in session:
            got.append((message.text or "")[:4])
            if len(got) == 4:
                arrived.set()

    async with running(collect, scheme, max_queue=1) as server:
        async with connect(server.url, **client_opts(server)) as client:
            big = "x" * 8_000_000
            tasks = [asyncio.create_task(client.send(f"{i:04d}" + big, algorithm="none")) for i in range(3)]
            tasks.append(asyncio.create_task(client.send("0003", algorithm="none")))
            async with asyncio.timeout(5):
                while not client._writing:  # a write waits for the transport, others queue
                    await asyncio.sleep(0.005)
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            assert any(isinstance(r, asyncio.CancelledError) for r in results), results
            # Nothing else is sent: the cancelled messages must still go out, whole, in order.
            await asyncio.wait_for(arrived.wait(), 10)
    assert got == ["0000", "0001", "0002", "0003"]


async def test_sends_cut_short_by_timeouts_all_arrive_in_order(scheme: str) -> None:
    got: list[str] = []
    release = asyncio.Event()

    async def collect(session: Session) -> None:
        # The reader starts only once every send was tried: a reader that merely reads slowly
        # raced a sender slowed down by load (QUIC encrypts 400 KB in ~6 ms on a busy machine),
        # and then no send had to wait and the test cut none.
        await release.wait()
        async for message in session:
            got.append((message.text or "")[:4])

    async with running(collect, scheme, max_queue=1) as server:
        async with connect(server.url, **client_opts(server)) as client:
            cut = 0
            # 16 MB: more than QUIC's stream window (8 MiB) plus its send watermark (4 MiB), so
            # with the reader paused some sends must wait, even where send_now() takes the rest.
            for i in range(40):
                try:
                    await asyncio.wait_for(client.send(f"{i:04d}" + "y" * 400_000, algorithm="none"), 0.001)
                except TimeoutError:
                    cut += 1
            release.set()
            await client.send("done", algorithm="none")
            assert cut > 0  # the test did cancel sends in flight
            async with asyncio.timeout(10):
                while len(got) < 41:
                    await asyncio.sleep(0.02)
    assert got == [f"{i:04d}" for i in range(40)] + ["done"]


# -- 11.5: the inbox is bounded in bytes -------------------------------------------------------------


async def test_inbox_is_bounded_in_bytes(scheme: str) -> None:
    sessions: list[Session] = []
    stop = asyncio.Event()

    async def stalled(session: Session) -> None:  # never reads
        sessions.append(session)
        await stop.wait()

    async with running(stalled, scheme, max_queue_bytes=4 * 2**20) as server:
        async with connect(server.url, **client_opts(server)) as client:
            payload = "z" * 2**20

            async def flood() -> None:
                for _ in range(40):
                    await client.send(payload, algorithm="none")

            sender = asyncio.create_task(flood())
            await asyncio.sleep(1.0)
            received = sessions[0].stats.messages_received
            sender.cancel()
            stop.set()
    # 4 MiB of 1 MiB messages, plus what one read of the transport held: not 40
    assert 4 <= received <= 7, received


# -- 11.6: a peer that never reads is dropped after write_timeout ------------------------------------


async def test_a_peer_that_never_reads_is_dropped_after_write_timeout() -> None:
    errors: list[BaseException] = []

    async def echo(session: Session) -> None:
        try:
            async for message in session:
                await session.send(message.text or "")
        except M2MError as exc:
            errors.append(exc)
            raise

    timers = {"write_timeout": 0.5}
    async with running(echo, "ws", timers=timers) as server:
        async with ws_connect(server.url, compression=None, max_size=None, max_queue=1) as ws:
            await ws.send(hello())
            sid = json.loads(await ws.recv())["session_id"]
            started = time.monotonic()
            ws.transport.pause_reading()  # from now on this client reads nothing
            big = "w" * 2**20
            with pytest.raises(ConnectionClosed):
                async with asyncio.timeout(10):
                    while server.active_sessions or not errors:
                        await ws.send(data(sid, big))
                        await asyncio.sleep(0.01)
                    await ws.send(data(sid, big))  # the connection is gone
                    await asyncio.sleep(0.5)
                    await ws.send(data(sid, big))
            assert time.monotonic() - started < 5
    assert errors and isinstance(errors[0], SessionTimeout) and "write_timeout" in str(errors[0])


# -- 11.11: closed sessions are freed without the cycle collector ------------------------------------


async def test_closed_sessions_are_freed_without_the_garbage_collector(scheme: str) -> None:
    refs: list[weakref.ref[Session]] = []

    async def handler(session: Session) -> None:
        refs.append(weakref.ref(session))
        async for message in session:
            await session.send(message.text or "")

    async with running(handler, scheme) as server:
        gc.collect()
        gc.disable()
        try:
            for _ in range(3):
                client = await connect(server.url, **client_opts(server))
                await client.send("x" * 100_000)
                await client.recv()
                refs.append(weakref.ref(client))
                await client.close()
                del client
            async with asyncio.timeout(5):
                while server.active_sessions:
                    await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)
            alive = [r for r in refs if r() is not None]
        finally:
            gc.enable()
    assert len(refs) == 6 and not alive, f"{len(alive)} of {len(refs)} sessions still alive"


# -- 11.12: control messages have their own fixed bound ----------------------------------------------


async def test_a_huge_hello_is_refused_unparsed_and_never_echoed() -> None:
    async with running(slow_echo, "ws") as server:
        async with connect(server.url) as good:
            async with ws_connect(server.url, compression=None, max_size=None) as ws:
                names = [f"alg{i:07d}" for i in range(200_000)]  # 2.6 MB of algorithm names
                started = time.monotonic()
                await ws.send(hello(algorithms=names))
                got = 0
                with pytest.raises(ConnectionClosed):
                    async with asyncio.timeout(5):
                        while True:
                            got += len(await ws.recv())
                assert got < 4096, f"the server echoed {got} bytes"
                assert time.monotonic() - started < 2
            await good.send("still fine")
            assert (await asyncio.wait_for(good.recv(), 5)).text == "re:still fine"


async def test_a_long_algorithm_list_gets_a_short_reject() -> None:
    async with running(slow_echo, "ws") as server:
        async with ws_connect(server.url, compression=None, max_size=None) as ws:
            await ws.send(hello(algorithms=[f"a{i:04d}" for i in range(3000)]))  # 30 KB, under 64 KiB
            reply = await asyncio.wait_for(ws.recv(), 5)
    msg = json.loads(reply)
    assert msg["type"] == "REJECT" and len(reply) < 1000, reply[:300]


async def test_a_small_max_payload_still_reads_the_servers_accept(scheme: str) -> None:
    async with running(slow_echo, scheme) as server:
        # issue 12.5: the server's ACCEPT (~600 bytes) is larger than this client's max_payload
        async with connect(server.url, max_payload=100, **client_opts(server)) as client:
            assert client.info.max_payload == 100


async def test_repeated_warnings_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="m2mwire.session")
    async with running(slow_echo, "ws") as server:
        async with ws_connect(server.url, compression=None) as ws:
            await ws.send(hello())
            sid = json.loads(await ws.recv())["session_id"]
            odd = json.dumps({"type": "ODD" + "x" * 1000, "session_id": sid, "payload": {}, "timestamp": 1})
            for _ in range(2000):
                await ws.send(odd)
            await ws.send(data(sid, "after"))
            assert json.loads(await asyncio.wait_for(ws.recv(), 5))["payload"]["content"] == "re:after"
    records = [r for r in caplog.records if "unknown type" in r.getMessage()]
    assert 1 <= len(records) <= 2, len(records)
    assert all(len(r.getMessage()) < 600 for r in records)


# -- 11.15: Server.aclose() completes within close_timeout --------------------------------------------


async def test_aclose_is_bounded_when_a_handler_ignores_its_session(scheme: str) -> None:
    async def ignore(session: Session) -> None:
        await asyncio.sleep(3600)

    server = await serve(ignore, f"{scheme}://127.0.0.1:0", timers={"close_timeout": 1.0})
    client = await connect(server.url, **client_opts(server))
    await client.send("hello")
    started = time.monotonic()
    await asyncio.wait_for(server.aclose(), 6)
    elapsed = time.monotonic() - started
    await client.close()
    assert elapsed < 2.5, elapsed


# -- 11.17: a handler that raises ends the session with an error ----------------------------------------


async def failing(session: Session) -> None:
    await session.recv()
    raise RuntimeError("bug in the handler")


async def test_a_handler_crash_is_not_a_clean_end(scheme: str) -> None:
    async with running(failing, scheme) as server:
        async with connect(server.url, **client_opts(server)) as client:
            await client.send("boom")
            with pytest.raises(SessionClosed) as info:
                async with asyncio.timeout(5):
                    async for _ in client:
                        pass
    assert info.value.code == "INTERNAL_ERROR"


async def test_a_handler_crash_closes_the_websocket_with_1011() -> None:
    async with running(failing, "ws") as server:
        async with ws_connect(server.url, compression=None) as ws:
            await ws.send(hello())
            sid = json.loads(await ws.recv())["session_id"]
            await ws.send(data(sid, "boom"))
            close = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert close["type"] == "CLOSE" and close["payload"]["reason"] == "INTERNAL_ERROR"
            await ws.send(json.dumps({"type": "CLOSE", "session_id": sid, "payload": {}, "timestamp": 1}))
            with pytest.raises(ConnectionClosed) as info:
                await asyncio.wait_for(ws.recv(), 5)
    assert info.value.rcvd is not None
    assert (info.value.rcvd.code, info.value.rcvd.reason) == (1011, "INTERNAL_ERROR")


async def test_a_vanished_peer_is_not_logged_as_a_handler_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="m2mwire")
    ended = asyncio.Event()

    async def reader(session: Session) -> None:
        try:
            await session.recv()
        finally:
            ended.set()

    timers = {"ping_interval": 0.2, "pong_timeout": 0.2, "max_missed_pongs": 2, "close_timeout": 0.3}
    async with running(reader, "ws", timers=timers) as server:
        async with ws_connect(server.url, compression=None) as ws:
            await ws.send(hello())
            await ws.recv()
            ws.transport.pause_reading()  # the peer is gone: it never answers a PING
            await asyncio.wait_for(ended.wait(), 5)
            await asyncio.sleep(0.1)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


# -- issue 14 (liveness): one connection loss, one exception ---------------------------------------------


async def test_send_and_recv_raise_the_same_error_after_a_connection_loss(scheme: str) -> None:
    async def drop(session: Session) -> None:
        await session.recv()
        session._channel.abort()
        await asyncio.sleep(0.5)

    async with running(drop, scheme) as server:
        client = await connect(server.url, **client_opts(server))
        await client.send("hi")
        with pytest.raises(M2MError) as from_recv:
            await asyncio.wait_for(client.recv(), 5)
        with pytest.raises(M2MError) as from_send:
            await client.send("after")
        await client.close()
    assert type(from_send.value) is type(from_recv.value)
    assert str(from_send.value) == str(from_recv.value)


async def test_a_session_never_closed_is_freed_after_a_connection_loss(scheme: str) -> None:
    async def drop(session: Session) -> None:
        await session.recv()
        session._channel.abort()

    async with running(drop, scheme) as server:
        gc.collect()
        gc.disable()
        try:
            client = await connect(server.url, **client_opts(server))
            await client.send("x" * 100_000)
            failed = False
            try:
                async with asyncio.timeout(5):  # not wait_for: its task keeps the error's frames
                    await client.recv()
            except M2MError:
                failed = True
            assert failed
            ref = weakref.ref(client)
            del client  # never closed by the application
            await asyncio.sleep(0.2)
            alive = ref() is not None
        finally:
            gc.enable()
    assert not alive


async def test_write_timeout_drops_a_non_reading_m2mwire_peer(scheme: str) -> None:
    errors: list[BaseException] = []
    ended = asyncio.Event()

    async def echo(session: Session) -> None:
        try:
            async for message in session:
                await session.send(message.text or "", algorithm="none")
        except M2MError as exc:
            errors.append(exc)
        finally:
            ended.set()

    async with running(echo, scheme, timers={"write_timeout": 0.5}) as server:
        # max_queue=1: the client stops reading after one reply (the application never reads).
        async with connect(server.url, max_queue=1, **client_opts(server)) as client:

            async def flood() -> None:
                for _ in range(200):
                    await client.send("f" * 2**20, algorithm="none")

            sender = asyncio.create_task(flood())
            started = time.monotonic()
            await asyncio.wait_for(ended.wait(), 10)
            elapsed = time.monotonic() - started
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
    assert errors and isinstance(errors[0], SessionTimeout), errors
    assert elapsed < 5, elapsed


# -- stop 31: compressed messages in one transport read are held, not decoded, once paused ---------


BOMB_SIZE, BOMBS, INBOX_BOUND = 1 << 20, 40, 1 << 20  # 40 MiB of text in a write of a few KB


@asynccontextmanager
async def zstd_client(
    port: int, size: int = BOMB_SIZE, count: int = BOMBS, source: str = "127.0.0.1"
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]]:
    """A raw WebSocket connection from ``source`` with an established zstd session (a sans-I/O
    client), and ``count`` zstd DATA messages of ``size`` bytes of one letter as WebSocket
    frames, to write at once."""
    from m2mwire.codecs import Algorithm
    from m2mwire.session.config import SessionConfig
    from m2mwire.session.core import SessionProtocol
    from m2mwire.session.outputs import SendMessage
    from m2mwire.session.states import Role, State
    from tests.transport.test_websocket_bounds import OP_BINARY, OP_TEXT, frame, read_frame, upgrade

    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        await upgrade(reader, writer, port)
        client = SessionProtocol(Role.CLIENT, SessionConfig(algorithms=(Algorithm.ZSTD,)))
        client.initiate(0.0)
        (hello_out,) = client.data_to_send()
        assert isinstance(hello_out, SendMessage)
        writer.write(frame(OP_TEXT, hello_out.message))
        _, accept = await asyncio.wait_for(read_frame(reader), 10)
        client.receive_text(accept, 0.0)
        assert client.state is State.ESTABLISHED
        frames = []
        for _ in range(count):
            client.send("a" * size, 0.0, algorithm=Algorithm.ZSTD)
            for out in client.data_to_send():
                assert isinstance(out, SendMessage)
                message = out.message if isinstance(out.message, bytes) else b"".join(out.message)
                frames.append(frame(OP_BINARY if out.binary else OP_TEXT, message))
        blob = b"".join(frames)
        assert len(blob) < 2_000 * count
        yield reader, writer, blob
    finally:
        writer.transport.abort()


async def test_compressed_messages_in_one_read_are_not_all_decoded_into_the_inbox() -> None:
    """A client wrote many zstd messages of 16 MiB of one letter (~250 bytes each on the wire) in
    one TCP write: pausing stopped the next read only, so every message of that read was decoded
    into the inbox, past max_queue and max_queue_bytes (74 KB sent held ~3 GB of a server; stop
    31's attack run). What arrives once reading is paused is now held as it came (wire bytes),
    and decoded as the application takes messages: none is lost."""
    sessions: list[Session] = []
    release = asyncio.Event()
    got: list[int] = []

    async def slow(session: Session) -> None:
        sessions.append(session)
        await release.wait()
        async for message in session:
            got.append(len(message.text or ""))

    async with serve(slow, "ws://127.0.0.1:0", max_queue_bytes=INBOX_BOUND) as server:
        async with zstd_client(server.port) as (_reader, writer, blob):
            writer.write(blob)
            await writer.drain()
            async with asyncio.timeout(10):
                while not sessions:
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)  # the server has read the write (it is far under one read)
            held = sessions[0]._inbox_bytes
            assert held <= INBOX_BOUND + BOMB_SIZE, f"{held / 2**20:.0f} MiB decoded into the inbox"
            release.set()
            async with asyncio.timeout(10):
                while len(got) < BOMBS:
                    await asyncio.sleep(0.01)
            assert got == [BOMB_SIZE] * BOMBS


@pytest.mark.parametrize("when", ["held when closing", "sent after our CLOSE"])
async def test_a_closing_session_drops_data_past_its_inbox_unread(when: str) -> None:
    """Closing, a session reads on for the peer's acknowledgement, and DATA that came meanwhile
    was decoded into the inbox with no bound: what was held when the application closed, or
    what the peer sent after our CLOSE (for up to close_timeout). DATA past the inbox's bound
    is now dropped without being decoded."""
    sessions: list[Session] = []
    closed = asyncio.Event()

    async def closes(session: Session) -> None:
        sessions.append(session)
        if when == "held when closing":
            await asyncio.sleep(0.5)  # the client's write arrives, is partly held
        await session.close()
        closed.set()

    async with serve(
        closes, "ws://127.0.0.1:0", max_queue_bytes=INBOX_BOUND, timers={"close_timeout": 1.0}
    ) as server:
        async with zstd_client(server.port) as (reader, writer, blob):
            if when == "sent after our CLOSE":
                from tests.transport.test_websocket_bounds import read_frame

                _, close = await asyncio.wait_for(read_frame(reader), 10)
                assert b'"CLOSE"' in close
            writer.write(blob)
            await writer.drain()
            await asyncio.wait_for(closed.wait(), 10)
            left = sessions[0]._inbox_bytes
            assert left <= INBOX_BOUND + BOMB_SIZE, f"{left / 2**20:.0f} MiB decoded while closing"


def _owe(server: Server, peer: str, seconds: float) -> None:
    """Leave ``peer``'s decode budget owing ``seconds`` of refill, as its earlier messages would."""
    from m2mwire.session.budget import BURST, FREE_BASE, REFILL

    now = asyncio.get_running_loop().time()
    server._budgets.for_peer(peer, now).charge(0, BURST + FREE_BASE + seconds * REFILL, now)


async def test_a_peer_that_owes_decode_time_has_its_messages_held_until_it_is_repaid() -> None:
    """Each message's output is bounded (max_payload), but not its output per byte received: a
    peer sending 199-byte messages that decode to 16 MiB each, as fast as the socket took them,
    kept a server's core busy for minutes after it left (stop 32's attack run). The time a
    peer's messages take beyond their allowance is paid from its address's bucket; while it
    owes, its next message waits undecoded (stop 33: before, each new session decoded its first
    message before anything was checked). Both sessions from the address wait (one bucket per
    address, not per session), and every message arrives."""
    arrived: list[float] = []
    loop = asyncio.get_running_loop()

    async def sink(session: Session) -> None:
        async for message in session:
            arrived.append(loop.time())
            assert len(message.text or "") == 1 << 20

    async with serve(sink, "ws://127.0.0.1:0") as server:
        async with (
            zstd_client(server.port, 1 << 20, 3) as (_r1, first, blob1),
            zstd_client(server.port, 1 << 20, 3) as (_r2, second, blob2),
        ):
            _owe(server, "127.0.0.1", 1.5)
            start = loop.time()
            first.write(blob1)
            second.write(blob2)
            await first.drain()
            await second.drain()
            async with asyncio.timeout(30):
                while len(arrived) < 6:
                    await asyncio.sleep(0.02)
            budget = server._budgets.for_peer("127.0.0.1", loop.time())
            assert budget.waiting == 0 and budget.network is not None and budget.network.waiting == 0
    took = arrived[0] - start
    assert took >= 1.2, f"the first message was decoded {took:.2f} s after a 1.5 s debt"


async def test_one_socket_reads_messages_are_processed_a_few_ms_per_loop_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A transport delivers a whole socket read at once: one 256 KiB read of ~4,300 small Brotli
    messages (~30 us each) held the event loop ~130 ms (stop 33's third attack run). Past
    _SLICE_SECONDS (5 ms) of processing, the rest wait for the loop's next turn."""
    from m2mwire.session.core import SessionProtocol
    from m2mwire.session.states import Role

    turns = [0]
    seen: list[int] = []
    original = SessionProtocol.receive_binary

    def slow(self: SessionProtocol, data: bytes, now: float) -> Any:
        if self.role is Role.SERVER:
            until = time.thread_time() + 0.001
            while time.thread_time() < until:  # 1 ms of work per message (bounded: 1 ms of CPU)
                pass
            seen.append(turns[0])
        return original(self, data, now)

    async def ticker() -> None:
        while True:
            await asyncio.sleep(0)
            turns[0] += 1

    async def sink(session: Session) -> None:
        async for _ in session:
            pass

    async with serve(sink, "ws://127.0.0.1:0") as server:
        async with zstd_client(server.port, 100, 40) as (_reader, writer, blob):
            monkeypatch.setattr(SessionProtocol, "receive_binary", slow)
            ticking = asyncio.create_task(ticker())
            writer.write(blob)  # 40 messages, one TCP write: most arrive in one read
            await writer.drain()
            async with asyncio.timeout(10):
                while len(seen) < 40:
                    await asyncio.sleep(0.005)
            ticking.cancel()
    runs = [len(list(group)) for _, group in itertools.groupby(seen)]
    assert max(runs) <= 8, runs  # ~5 per turn (the old code: 40, or as many as one read held)


async def test_a_peer_whose_network_owes_waits_and_is_not_closed() -> None:
    """A peer cycling through its network's addresses had a fresh bucket at each (a /48 is 65,536
    of them; stop 33's second attack run). Each address's charges also go to its network's
    bucket (IPv4 /24, IPv6 /48); while that owes, every address of it waits, and an honest
    neighbour (another address) is paused, never closed: its own address owes nothing."""
    from m2mwire.session.budget import BURST, FREE_BASE, NETWORK_SCALE, REFILL

    arrived: list[float] = []
    ended: list[str] = []
    loop = asyncio.get_running_loop()

    async def sink(session: Session) -> None:
        with contextlib.suppress(M2MError):
            async for _ in session:
                arrived.append(loop.time())
        ended.append(session.close_event.code if session.close_event else "?")

    async with serve(sink, "ws://127.0.0.1:0") as server:
        async with zstd_client(server.port, 1 << 20, 2) as (_reader, writer, blob):
            now = loop.time()
            rotating = server._budgets.for_peer("127.0.0.3", now, "127.0.0.0/24")
            network_owes = NETWORK_SCALE * (BURST + REFILL * 1.5)  # 1.5 s of the network's refill
            rotating.charge(0, FREE_BASE + network_owes, now)
            start = loop.time()
            writer.write(blob)
            await writer.drain()
            async with asyncio.timeout(30):
                while len(arrived) < 2 and not ended:
                    await asyncio.sleep(0.02)
            assert not ended  # paused, not closed
    assert arrived[0] - start >= 1.2


async def test_a_resuming_connection_charged_for_its_hello_does_not_resume_reading_after_the_hand_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fresh server session that takes a resuming HELLO hands its channel to the session it
    resumes. Charged for that HELLO (its address at the end of its burst), it kept its pause
    timer, and when that fired it resumed reading the channel it no longer owned, under the
    resumed session's pause: everything the client sent was held, without a bound (stop 33's
    review: 20,012 of 20,012 messages)."""
    from m2mwire.reconnect import Reconnect
    from m2mwire.session.core import SessionProtocol
    from m2mwire.session.states import Role, State
    from tests.chaosproxy import TcpChaosProxy

    sessions: list[Session] = []
    original = SessionProtocol.receive_text
    servers: list[Server] = []

    def costly_resume(self: SessionProtocol, data: bytes | str, now: float) -> Any:
        raw = data if isinstance(data, bytes) else data.encode()
        if self.role is Role.SERVER and self.state is State.INITIAL and b'"session_id"' in raw:
            _owe(servers[0], "127.0.0.1", 0.0)  # the address is at the end of its burst
            time.sleep(0.002)  # this HELLO's processing: charged
        return original(self, data, now)

    async def stalled(session: Session) -> None:
        sessions.append(session)
        await asyncio.sleep(60)  # never reads: the inbox fills, reading pauses

    async with serve(stalled, "ws://127.0.0.1:0", max_queue=8) as server:
        servers.append(server)
        proxy = await TcpChaosProxy(server.port).start()
        try:
            client = await connect(
                f"ws://127.0.0.1:{proxy.port}",
                reconnect=Reconnect(initial_delay=0.01, max_delay=0.1, max_elapsed=10.0),
                resume_buffer_bytes=64 << 20,
            )
            for _ in range(20):
                await client.send("x" * 1000)
            async with asyncio.timeout(10):
                while not sessions or not sessions[0]._paused:
                    await asyncio.sleep(0.01)
            monkeypatch.setattr(SessionProtocol, "receive_text", costly_resume)
            proxy.cut()
            async with asyncio.timeout(10):
                while client.stats.reconnects < 1:
                    await asyncio.sleep(0.01)
            monkeypatch.setattr(SessionProtocol, "receive_text", original)

            async def pump() -> None:
                for _ in range(5000):  # bounded; the client's retention buffer holds them all
                    await client.send("y" * 1000)

            sending = asyncio.create_task(pump())
            await asyncio.sleep(1.0)  # the fresh session's pause (~20 ms) is long over
            held = len(sessions[0]._held)
            sending.cancel()
            with contextlib.suppress(TimeoutError):  # its messages wait for a handler that never reads
                async with asyncio.timeout(0.5):
                    await client.close()
        finally:
            await proxy.close()
    assert held < 1000, f"{held} messages held"  # one socket read's worth at most


async def test_time_the_server_was_descheduled_is_charged_once_at_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wall clock counts the time the process was not running: an honest 1 KB stream on a
    machine short of CPU was charged 0.137 s/s for preemption, more than REFILL (stop 33's third
    attack run). A session is timed with the wall clock until its first charge, then with the
    thread's CPU clock. Here every wall-clock reading pair spans a 50 ms preemption."""
    import m2mwire.shell.session as shell_session

    readings = [0]

    def preempted() -> float:
        readings[0] += 1
        return time.perf_counter() + 0.05 * (readings[0] // 2)  # +50 ms per timed interval

    monkeypatch.setattr(shell_session, "perf_counter", preempted)
    got: list[str] = []

    async def sink(session: Session) -> None:
        async for message in session:
            got.append(message.text or "")

    loop = asyncio.get_running_loop()
    async with serve(sink, "ws://127.0.0.1:0") as server:
        async with connect(server.url, algorithms=["none"]) as client:
            for i in range(100):  # 5 s of "preemption" at the wall clock: past BURST and MAX_PAUSE
                await client.send(f"message {i}")
            async with asyncio.timeout(10):
                while len(got) < 100:
                    await asyncio.sleep(0.01)
            owed = server._budgets.for_peer("127.0.0.1", loop.time()).owed(loop.time())
    assert got == [f"message {i}" for i in range(100)] and owed == 0.0


async def test_a_bomb_that_fails_its_checksum_is_charged_all_the_same() -> None:
    """An M2M v1 binary frame of 12 MiB of JSON in Brotli (~70 bytes) whose CRC fails is refused
    once decompressed, and was charged nothing: session after session of them held a core at
    17 KB/s (stop 33's attack run, F3). The time it took is charged to the peer's address."""
    from m2mwire.codecs import m2mframe
    from tests.transport.test_websocket_bounds import OP_BINARY, frame

    strings = ",".join(['"' + "a" * (4 << 20) + '"'] * 3)  # 12 MiB, each string under max_string_bytes
    bomb = bytearray(m2mframe.encode_m2m_binary("[" + strings + "]"))
    start = len(m2mframe._PREFIX_BYTES)
    header_len = m2mframe._PACK_FIXED.unpack_from(bomb, start)[0]
    bomb[start + header_len + 4] ^= 0xFF  # the CRC-32 (after the u32 payload length)
    assert len(bomb) < 200
    ended: list[str] = []

    async def sink(session: Session) -> None:
        with contextlib.suppress(M2MError):
            async for _ in session:
                pass
        ended.append(session.close_event.code if session.close_event else "?")

    loop = asyncio.get_running_loop()
    async with serve(sink, "ws://127.0.0.1:0") as server:
        async with zstd_client(server.port, 1, 1) as (_reader, writer, _blob):
            _owe(server, "127.0.0.1", 0.0)  # an empty bucket: what the bomb costs is owed
            writer.write(frame(OP_BINARY, bytes(bomb)))
            await writer.drain()
            async with asyncio.timeout(10):
                while not ended:
                    await asyncio.sleep(0.005)
            owed = server._budgets.for_peer("127.0.0.1", loop.time()).owed(loop.time())
    assert ended == ["INVALID_DATA"]
    assert owed > 0.0  # the old code: no charge (the decode failed)


@pytest.mark.parametrize("binary_text", [True, False])
async def test_a_peer_offering_only_tokennative_does_not_get_long_echoes_tokenized(binary_text: bool) -> None:
    """A peer that offered only tokennative made an echoing server tokenize everything it sent
    back, on its event loop (3 messages of 199 bytes cost 29 s of CPU; stop 32's attack run).
    Automatic selection no longer tokenizes content past TOKENNATIVE_AUTO_MAX characters: it
    goes as plain text, which every peer reads."""

    async def echo(session: Session) -> None:
        async for message in session:
            await session.send(message.text or "")

    text = "the same words again, " * 5000  # 110 KB
    async with serve(echo, "ws://127.0.0.1:0", binary_text=binary_text) as server:
        async with connect(server.url, algorithms=["tokennative"], binary_text=binary_text) as client:
            assert client.info.algorithms == ("tokennative",)
            await client.send(text)
            reply = await asyncio.wait_for(client.recv(), 10)
    assert reply.text == text and reply.algorithm == "none"  # the old code: tokennative


async def test_a_session_whose_peer_owes_more_than_max_pause_is_closed_and_another_peer_is_not() -> None:
    """A pause lasts at most MAX_PAUSE (the peer's PINGs wait meanwhile). Capped there, it let
    each paused session decode one more message per pause however much was owed: session after
    session of 16 MiB messages kept ~0.4 core for 16 s after the peer left (stop 32's
    measurement). A session whose peer owes more than MAX_PAUSE of refill is closed
    MESSAGE_TOO_BIG, what it held dropped undecoded. The debt is its address's: with one bucket
    per server (stop 32), an honest peer sending messages that decode to far more than they cost
    (zstd resending a history) was closed too while another peer's debt lasted."""
    ended: dict[str, str] = {}
    taken: dict[str, int] = {}

    async def sink(session: Session) -> None:
        peer = session.remote_address.rpartition(":")[0]
        taken[peer] = 0
        with contextlib.suppress(M2MError):  # the raw peer never acknowledges: close_timeout
            async for _ in session:
                taken[peer] += 1
        ended[peer] = session.close_event.code if session.close_event else "?"

    async with serve(sink, "ws://127.0.0.1:0", timers={"close_timeout": 1.0}) as server:
        async with (
            zstd_client(server.port, 8 << 20, 4, source="127.0.0.2") as (_r1, hostile, bombs),
            zstd_client(server.port, 8 << 20, 4) as (_r2, honest, history),
        ):
            _owe(server, "127.0.0.2", 2 * 5.0)  # its earlier messages left it owing 10 s
            hostile.write(bombs)
            await hostile.drain()
            async with asyncio.timeout(10):
                while "127.0.0.2" not in ended:
                    await asyncio.sleep(0.02)
            honest.write(history)
            await honest.drain()
            async with asyncio.timeout(10):
                while taken.get("127.0.0.1", 0) < 4 and "127.0.0.1" not in ended:
                    await asyncio.sleep(0.02)
            honest_ended = ended.get("127.0.0.1")
    assert ended["127.0.0.2"] == "MESSAGE_TOO_BIG" and taken["127.0.0.2"] == 0
    assert honest_ended is None and taken["127.0.0.1"] == 4  # stop 32's code: closed as well


async def test_resending_a_json_snapshot_through_zstd_is_not_paced() -> None:
    """Session-context zstd exists for traffic that resends what it sent before: a 208 KB JSON
    snapshot sent again travels in ~50 bytes. The decode budget's first version charged the
    inbox cost (parsed JSON at up to 24x its text) against 1,024x the wire, per session: 150
    such snapshots took 29.7 s instead of 0.63 s (stop 32's review). It charges the time they
    take beyond their allowance now (stop 33), from a bucket that holds them."""
    value = {"rows": [{"id": i, "name": f"item {i}", "tags": ["a", "b"]} for i in range(4000)]}
    snapshot = json.dumps(value, separators=(",", ":"))
    got: list[int] = []

    async def sink(session: Session) -> None:
        async for message in session:
            assert message.kind == "json"
            got.append(len(message.text or ""))

    async with serve(sink, "ws://127.0.0.1:0", algorithms=["zstd"]) as server:
        async with connect(server.url, algorithms=["zstd"]) as client:
            loop = asyncio.get_running_loop()
            start = loop.time()
            for _ in range(150):
                await client.send(value)
            async with asyncio.timeout(30):
                while len(got) < 150:
                    await asyncio.sleep(0.01)
            took = loop.time() - start
    assert len(snapshot) > 180_000 and got == [len(snapshot)] * 150
    assert took < 5.0, f"150 snapshots took {took:.1f} s"
