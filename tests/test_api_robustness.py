"""Regressions for peers that stop reading, flood control messages, or leave the application behind.

Each test reproduces a failure found in review: before the fix it hung, grew without bound, lost a
message or misreported the session's end.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from websockets.asyncio.client import connect as ws_connect

from m2mwire.api import Session, connect, serve
from m2mwire.codecs import Encoding, clear_tokenizer_cache, register_tokenizer_file
from m2mwire.errors import ProtocolError, SessionTimeout
from m2mwire.session.config import SessionConfig
from m2mwire.session.core import SessionProtocol
from m2mwire.session.events import Closed
from m2mwire.session.states import Role
from tests.test_api import raw_hello

HELLO = raw_hello()


async def test_peer_that_stops_reading_cannot_wedge_the_server() -> None:
    errors: list[BaseException] = []

    async def talker(session: Session) -> None:
        try:
            while True:
                await session.send("y" * 60_000, algorithm="none")
        except Exception as exc:
            errors.append(exc)

    timers = {"ping_interval": 0.3, "pong_timeout": 0.3, "max_missed_pongs": 2, "close_timeout": 0.5}
    server = await serve(talker, "ws://127.0.0.1:0", timers=timers)
    ws = await ws_connect(server.url, compression=None, max_size=None)
    await ws.send(HELLO)
    await ws.recv()  # ACCEPT; from now on this client reads nothing
    await asyncio.sleep(4)
    assert server.active_sessions == 0, "the session should have timed out and let go"
    assert errors and isinstance(errors[0], SessionTimeout | Exception)
    started = time.monotonic()
    await asyncio.wait_for(server.aclose(), 10)
    assert time.monotonic() - started < 5
    ws.transport.abort()


async def test_ping_flood_from_a_peer_that_never_reads_stays_bounded() -> None:
    sessions: list[Session] = []
    done = asyncio.Event()

    async def keep(session: Session) -> None:
        sessions.append(session)
        await done.wait()

    async with serve(keep, "ws://127.0.0.1:0") as server:
        async with ws_connect(server.url, compression=None) as ws:
            await ws.send(HELLO)
            sid = json.loads(await ws.recv())["session_id"]
            ping = json.dumps({"type": "PING", "session_id": sid, "payload": {}, "timestamp": 1})
            for _ in range(30_000):  # the client never reads a PONG
                try:
                    async with asyncio.timeout(0.5):
                        await ws.send(ping)
                except TimeoutError:
                    break  # the server stopped reading us: that is the point
            await asyncio.sleep(0.3)
            backlog = sessions[0]._protocol.output_backlog
            # One queued PONG answers the PINGs after it. It was one PONG per PING of a read
            # (up to ~10,000 per 1 MiB read before reading paused): when our writes were paused
            # too, under load, this found more than 128 queued.
            assert backlog <= 2, f"{backlog} PONGs queued in memory"
            ws.transport.abort()
            done.set()


async def test_cancelled_send_does_not_lose_other_messages() -> None:
    got: list[str] = []

    async def collect(session: Session) -> None:
        async for message in session:
            got.append(message.text or "")

    async with serve(collect, "ws://127.0.0.1:0") as server:
        async with connect(server.url) as client:
            real_send = client._channel.send
            gate = asyncio.Semaphore(0)

            async def slow_send(message: Any) -> None:  # written, then held like drain() under load
                await real_send(message)
                await gate.acquire()

            client._channel.send = slow_send  # type: ignore[method-assign]
            a = asyncio.create_task(client.send("a", algorithm="none"))
            await asyncio.sleep(0.05)
            b = asyncio.create_task(client.send("b", algorithm="none"))
            c = asyncio.create_task(client.send("c", algorithm="none"))
            await asyncio.sleep(0.05)
            gate.release()  # "a" done; A now writes "b" and waits again
            await asyncio.sleep(0.05)
            a.cancel()
            for _ in range(10):
                gate.release()
            await asyncio.gather(a, return_exceptions=True)
            await asyncio.wait_for(asyncio.gather(b, c), 5)
            client._channel.send = real_send  # type: ignore[method-assign]
            await client.send("d", algorithm="none")
            await asyncio.sleep(0.3)
    assert got == ["a", "b", "c", "d"]


async def test_client_close_drops_the_socket_when_the_server_stops_reading() -> None:
    done = asyncio.Event()

    async def deaf(ws: Any) -> None:
        await ws.recv()
        accept = json.loads(HELLO)
        accept.update(type="ACCEPT", session_id="deaf")
        await ws.send(json.dumps(accept))
        await done.wait()  # never reads again, never answers the closing handshake

    from websockets.asyncio.server import serve as ws_serve

    async with ws_serve(deaf, "127.0.0.1", 0, compression=None) as raw:
        port = raw.sockets[0].getsockname()[1]
        session = await connect(f"ws://127.0.0.1:{port}", algorithms=["none"], timers={"close_timeout": 0.5})
        ws = session._channel._ws  # type: ignore[attr-defined]
        await asyncio.wait_for(session.close(), 10)
        await asyncio.sleep(0.1)
        assert ws.connection_lost_waiter.done(), "the TCP connection was left open"
        done.set()


def test_unavailable_tokenizer_in_received_data_closes_with_invalid_data(tmp_path: Any) -> None:
    register_tokenizer_file(Encoding.LLAMA3, tmp_path / "missing.tiktoken")
    clear_tokenizer_cache(Encoding.LLAMA3)
    try:
        cfg = SessionConfig(encodings=(Encoding.CL100K,))
        c, s = SessionProtocol(Role.CLIENT, cfg), SessionProtocol(Role.SERVER, cfg)
        c.initiate(0.0)
        s.initiate(0.0)
        for out in c.data_to_send():
            s.receive_text(out.message, 0.0)  # type: ignore[union-attr,arg-type]
        for out in s.data_to_send():
            c.receive_text(out.message, 0.0)  # type: ignore[union-attr,arg-type]
        s.receive_binary(b"\x02\x01", 1.0)  # TokenNative binary for llama3, which is not installed
        closed = [e for e in iter(s.next_event, None) if isinstance(e, Closed)]
        assert isinstance(closed[0].error, ProtocolError) and closed[0].error.code == "INVALID_DATA"
        close = json.loads(s.data_to_send()[0].message)  # type: ignore[union-attr,arg-type]
        assert close["type"] == "CLOSE" and close["payload"]["reason"] == "INVALID_DATA"
    finally:
        register_tokenizer_file(Encoding.LLAMA3, None)
        clear_tokenizer_cache(Encoding.LLAMA3)


@pytest.mark.parametrize("action", ["close", "idle"])
async def test_a_slow_application_is_neither_stuck_on_close_nor_declared_dead(action: str) -> None:
    async def chatty(session: Session) -> None:
        for i in range(20):
            await session.send(f"m{i}")
        async for _ in session:
            pass

    timers = {"close_timeout": 3, "ping_interval": 1, "pong_timeout": 0.5, "max_missed_pongs": 2}
    async with serve(chatty, "ws://127.0.0.1:0", timers=timers) as server:
        async with connect(server.url, max_queue=4, timers=timers) as client:
            await asyncio.sleep(0.3)
            assert client._paused, "the inbox should be full and reading paused"
            if action == "close":
                started = time.monotonic()
                await client.close()
                assert time.monotonic() - started < 1.5
                assert client.close_event is not None and client.close_event.error is None
            else:
                await asyncio.sleep(3)  # several PING intervals while we are not reading
                assert client.close_event is None, client.close_event
                assert [(await client.recv()).text for _ in range(20)] == [f"m{i}" for i in range(20)]
