"""Misbehaving WebSocket peers: each gets a clear REJECT/CLOSE or close code; other sessions carry on."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from m2mwire.api import Server, Session, connect, serve
from m2mwire.errors import SessionTimeout


async def echo(session: Session) -> None:
    async for message in session:
        await session.send(message.text or "")


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    async with serve(echo, "ws://127.0.0.1:0", max_payload=64 * 1024, timers={"hello_timeout": 1.0}) as srv:
        yield srv


def hello(**caps: Any) -> str:
    payload = {
        "version": "3.0",
        "agent_id": "raw",
        "agent_type": "raw",
        "compression": {"algorithms": ["none"], "max_payload": 0, "streaming": False, "ml_routing": False},
        "security": {"threat_detection": False, "blocking_mode": False, "block_threshold": 0.8},
    }
    payload.update(caps)
    return json.dumps({"type": "HELLO", "payload": payload, "timestamp": 1})


async def closed_code(ws: Any) -> int | None:
    with pytest.raises(ConnectionClosed) as info:
        for _ in range(10):
            await asyncio.wait_for(ws.recv(), 5)
    rcvd = info.value.rcvd
    return rcvd.code if rcvd is not None else None


async def test_permessage_deflate_is_off(server: Server) -> None:
    async with ws_connect(server.url) as ws:  # offers deflate; the server must decline it
        assert ws.protocol.extensions == []


async def test_garbage_text_gets_reject_and_close(server: Server) -> None:
    async with ws_connect(server.url, compression=None) as ws:
        await ws.send("this is not json")
        reply = json.loads(await ws.recv())
        assert reply["type"] == "REJECT" and "MALFORMED_MESSAGE" in reply["payload"]["message"]
        assert await closed_code(ws) == 1002


async def test_data_before_hello_rejected(server: Server) -> None:
    async with ws_connect(server.url, compression=None) as ws:
        await ws.send(
            json.dumps(
                {
                    "type": "DATA",
                    "session_id": "x",
                    "payload": {"algorithm": "none", "content": "hi"},
                    "timestamp": 1,
                }
            )
        )
        reply = json.loads(await ws.recv())
        assert reply["type"] == "REJECT" and "DATA_BEFORE_HELLO" in reply["payload"]["message"]
        assert await closed_code(ws) == 1002


async def test_invalid_utf8_text_frame_closes_1007(server: Server) -> None:
    async with ws_connect(server.url, compression=None) as ws:
        # A text frame whose bytes are not UTF-8: websockets' protocol layer answers 1007.
        await ws.send(b"\xff\xfe{}", text=True)
        assert await closed_code(ws) == 1007


async def test_oversized_frame_closes_1009(server: Server) -> None:
    async with ws_connect(server.url, compression=None, max_size=None) as ws:
        await ws.send(hello())
        json.loads(await ws.recv())
        await ws.send(b"\x00" + b"\x01" * 70_000)
        assert await closed_code(ws) == 1009


async def test_binary_garbage_after_accept_closes_with_reason(server: Server) -> None:
    async with ws_connect(server.url, compression=None) as ws:
        await ws.send(hello())
        accept = json.loads(await ws.recv())
        assert accept["type"] == "ACCEPT"
        await ws.send(b"\x09garbage")
        close = json.loads(await ws.recv())
        assert close["type"] == "CLOSE" and close["payload"]["reason"] == "MALFORMED_MESSAGE"
        assert await closed_code(ws) == 1002


async def test_silent_client_hits_hello_timeout(server: Server) -> None:
    async with ws_connect(server.url, compression=None) as ws:
        started = asyncio.get_running_loop().time()
        await closed_code(ws)
        assert asyncio.get_running_loop().time() - started < 4


async def test_vanishing_peer_does_not_disturb_other_sessions(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with connect(server.url) as good:
        # A raw TCP client that starts a WebSocket handshake and then disappears.
        host, port = "127.0.0.1", server.port
        sock = socket.create_connection((host, port))
        sock.sendall(
            b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        sock.close()
        # A client that completes HELLO and then drops the TCP connection without CLOSE.
        ws = await ws_connect(server.url, compression=None)
        await ws.send(hello())
        await ws.recv()
        ws.transport.abort()
        for i in range(5):
            await good.send(f"still here {i}")
            assert (await good.recv()).text == f"still here {i}"
        assert server.active_sessions >= 1


async def test_pong_timeout_against_a_peer_that_never_answers() -> None:
    # A raw server that accepts the session but never answers PING.
    async def mute(ws: Any) -> None:
        msg = json.loads(await ws.recv())
        accept = json.loads(hello())
        accept["type"] = "ACCEPT"
        accept["session_id"] = "mute-session"
        assert msg["type"] == "HELLO"
        await ws.send(json.dumps(accept))
        async for _ in ws:
            pass

    from websockets.asyncio.server import serve as ws_serve

    async with ws_serve(mute, "127.0.0.1", 0, compression=None) as raw:
        port = raw.sockets[0].getsockname()[1]
        timers = {"ping_interval": 0.2, "pong_timeout": 0.2, "max_missed_pongs": 3, "close_timeout": 0.2}
        session = await connect(f"ws://127.0.0.1:{port}", algorithms=["none"], timers=timers)
        started = asyncio.get_running_loop().time()
        with pytest.raises(SessionTimeout, match="PING"):
            await asyncio.wait_for(session.recv(), 5)
        elapsed = asyncio.get_running_loop().time() - started
        assert 0.7 <= elapsed < 3
        await session.close()


async def test_close_timeout_against_a_peer_that_never_acknowledges() -> None:
    async def deaf(ws: Any) -> None:
        await ws.recv()
        accept = json.loads(hello())
        accept["type"] = "ACCEPT"
        accept["session_id"] = "deaf"
        await ws.send(json.dumps(accept))
        async for _ in ws:
            pass

    from websockets.asyncio.server import serve as ws_serve

    async with ws_serve(deaf, "127.0.0.1", 0, compression=None) as raw:
        port = raw.sockets[0].getsockname()[1]
        session = await connect(f"ws://127.0.0.1:{port}", algorithms=["none"], timers={"close_timeout": 0.3})
        started = asyncio.get_running_loop().time()
        await session.close("bye")
        assert asyncio.get_running_loop().time() - started < 2
        event = session.close_event
        assert event is not None and isinstance(event.error, SessionTimeout)


async def test_hello_timeout_on_client_against_silent_server() -> None:
    async def silent(ws: Any) -> None:
        async for _ in ws:
            pass

    from websockets.asyncio.server import serve as ws_serve

    async with ws_serve(silent, "127.0.0.1", 0, compression=None) as raw:
        port = raw.sockets[0].getsockname()[1]
        with pytest.raises(SessionTimeout, match="ACCEPT"):
            await connect(f"ws://127.0.0.1:{port}", timers={"hello_timeout": 0.3})


async def test_wss_with_pinned_fingerprint_and_mismatch() -> None:
    from m2mwire.errors import TransportError

    async with serve(echo, "wss://127.0.0.1:0") as srv:
        assert srv.fingerprint is not None and len(srv.fingerprint) == 64
        async with connect(srv.url, fingerprint=srv.fingerprint) as session:
            await session.send("over tls")
            assert (await session.recv()).text == "over tls"
        with pytest.raises(TransportError, match="fingerprint mismatch"):
            await connect(srv.url, fingerprint="00" * 32)


async def test_wss_verifies_against_cafile_and_refuses_unknown_certificates(tmp_path: Any) -> None:
    from m2mwire.errors import TransportError
    from m2mwire.transport.tls import generate_self_signed

    cert = generate_self_signed()
    certfile, keyfile = tmp_path / "cert.pem", tmp_path / "key.pem"
    certfile.write_bytes(cert.cert_pem)
    keyfile.write_bytes(cert.key_pem)
    async with serve(echo, "wss://127.0.0.1:0", certfile=str(certfile), keyfile=str(keyfile)) as srv:
        async with connect(srv.url, cafile=str(certfile)) as session:
            await session.send("verified")
            assert (await session.recv()).text == "verified"
        with pytest.raises(TransportError):  # default: system store, which does not know this cert
            await connect(srv.url)


async def test_send_now_writes_whole_messages_and_declines_what_would_wait() -> None:
    from websockets.asyncio.server import serve as ws_serve

    from m2mwire.transport.websocket import connect_websocket

    received: list[str | bytes] = []
    reading = asyncio.Event()
    reading.set()

    async def peer(ws: Any) -> None:
        while True:
            if not reading.is_set():  # the peer stops reading its socket: our buffers fill up
                ws.transport.pause_reading()
                await reading.wait()
                ws.transport.resume_reading()
            received.append(await ws.recv())

    async def until(count: int) -> None:
        for _ in range(500):
            if len(received) >= count:
                return
            await asyncio.sleep(0.01)

    mib = 1024 * 1024
    async with ws_serve(peer, "127.0.0.1", 0, compression=None, max_size=2 * mib) as raw:
        port = raw.sockets[0].getsockname()[1]
        channel = await connect_websocket(f"ws://127.0.0.1:{port}", max_message_size=mib)
        try:
            assert channel.send_now("text") is True
            assert channel.send_now([b"ab", memoryview(b"cd")]) is True  # small parts: one frame
            assert channel.send_now([b"x" * mib, b"y"]) is False  # fragments are send()'s job
            await until(2)
            assert received == ["text", b"abcd"]

            # Writes are taken until flow control pauses the transport; then send_now declines,
            # writing nothing, and send() waits until the peer reads again: backpressure.
            reading.clear()
            await channel.send("last before the pause")
            await until(3)
            accepted = 0
            while channel.send_now(b"z" * mib):
                accepted += 1
                assert accepted < 200, "the transport never paused writing"
            late = asyncio.ensure_future(channel.send(b"late"))
            await asyncio.sleep(0.2)
            assert not late.done()
            reading.set()
            await asyncio.wait_for(late, 10)
            await until(4 + accepted)
            assert received[3:] == [b"z" * mib] * accepted + [b"late"]  # nothing lost, nothing extra
        finally:
            reading.set()
            await channel.close()
        assert channel.send_now("after close") is False


async def test_output_queued_after_an_abort_is_dropped_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """Resume aborts a connection from inside the message callback; what is queued after that in
    the same loop turn (websockets' own answers to the rest of the read, our batched frames) must
    not be written to the dead transport, where asyncio logs "socket.send() raised exception."
    from the fifth write on: a WARNING on every reconnect of a busy session."""
    from websockets.asyncio.server import serve as ws_serve

    from m2mwire.transport.websocket import connect_websocket

    async def peer(ws: Any) -> None:
        await ws.wait_closed()

    async with ws_serve(peer, "127.0.0.1", 0, compression=None) as raw:
        port = raw.sockets[0].getsockname()[1]
        channel = await connect_websocket(f"ws://127.0.0.1:{port}", max_message_size=1024)
        connection = channel._ws
        connection.transport.abort()
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            for _ in range(8):
                connection.protocol.send_ping(b"")  # as websockets queues a PONG or a close
                connection.send_data()
                connection.protocol.send_binary(b"frame")  # as a batched message of ours
                connection._m2m_flush()
            await asyncio.sleep(0.05)
        assert "socket.send() raised exception" not in caplog.text


async def test_send_now_writes_a_burst_in_few_system_calls_and_a_lone_message_at_once() -> None:
    """Messages written without the loop turning go out together (one write per 64 KiB, and the
    rest when the turn ends), where each used to cost a send() system call of its own; the first
    message of a turn is still written at once, so a request waits for nothing."""
    from websockets.asyncio.server import serve as ws_serve

    from m2mwire.transport.websocket import connect_websocket

    received: list[str | bytes] = []

    async def peer(ws: Any) -> None:
        async for message in ws:
            received.append(message)

    async with ws_serve(peer, "127.0.0.1", 0, compression=None) as raw:
        port = raw.sockets[0].getsockname()[1]
        channel = await connect_websocket(f"ws://127.0.0.1:{port}", max_message_size=1 << 20)
        try:
            transport = channel._ws.transport
            writes = 0
            real_write = transport.write

            def counting_write(data: Any) -> None:  # the real write, counted (writelines uses it)
                nonlocal writes
                writes += 1
                real_write(data)

            transport.write = counting_write
            await asyncio.sleep(0)
            burst = [f"{i:04d}".ljust(1000, "m") for i in range(200)]  # ~200 KB, one loop turn
            for text in burst:
                assert channel.send_now(text)
            assert 3 <= writes <= 5  # the first at once, then one per 64 KiB waiting
            await asyncio.sleep(0)  # the turn ends: what is left goes out
            assert writes <= 6
            for _ in range(500):
                if len(received) == len(burst):
                    break
                await asyncio.sleep(0.01)
            assert received == burst

            await asyncio.sleep(0)
            before = writes
            assert channel.send_now("a lone request")
            assert writes == before + 1  # written before send_now returned
        finally:
            await channel.close()


async def test_back_to_back_frames_of_every_size_arrive_intact_through_the_chunk_reader() -> None:
    """A receiver that starts late gets many frames per socket read, split anywhere: what the
    chunk reader slices and joins must still be every message, whole and in order. Its reads
    fill asyncio's 256 KiB buffer, so the connection switches to 1 MiB reads on the way."""
    import hashlib

    from m2mwire.transport.chunkreader import ChunkReader
    from m2mwire.transport.websocket import (
        _BULK_READ,
        WebSocketChannel,
        connect_websocket,
        serve_websocket,
    )

    server_transports: list[Any] = []

    sizes = [0, 1, 125, 126, 127, 65535, 65536, 65537, 200_000, 3, 70_000] * 6
    messages: list[bytes | str] = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    messages += ["text é " * (i * 97 % 5000) for i in range(20)]
    done: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()

    async def handler(channel: WebSocketChannel) -> None:
        assert isinstance(channel._ws.protocol.reader, ChunkReader)
        assert channel._ws.transport.max_size == 256 * 1024  # asyncio's own, until a read fills it
        server_transports.append(channel._ws.transport)
        await asyncio.sleep(0.3)  # let the frames pile up in the socket
        got = []
        for _ in range(len(messages)):
            m = await asyncio.wait_for(channel.recv(), 10)
            got.append(hashlib.sha256(m.encode() if isinstance(m, str) else m).hexdigest())
        done.set_result(got)
        await channel.close()

    server = await serve_websocket(handler, "127.0.0.1", 0, max_message_size=1 << 20)
    async with server:
        port = server.sockets[0].getsockname()[1]
        channel = await connect_websocket(f"ws://127.0.0.1:{port}", max_message_size=1 << 20)
        assert isinstance(channel._ws.protocol.reader, ChunkReader)
        for m in messages:
            await channel.send(m)
        got = await asyncio.wait_for(done, 20)
        assert channel._ws.transport.max_size == 256 * 1024  # it only sent: reads stay small
        await channel.close()
    expected = [hashlib.sha256(m.encode() if isinstance(m, str) else m).hexdigest() for m in messages]
    assert got == expected
    assert [t.max_size for t in server_transports] == [_BULK_READ]


async def test_a_flood_of_small_messages_keeps_the_default_read_size() -> None:
    """Full reads alone do not switch to 1 MiB reads: without a large message, a read's worth of
    small ones (what the loop handles in one go, and the inbox may overshoot by) stays 256 KiB."""
    import sys

    from m2mwire.transport.websocket import WebSocketChannel, connect_websocket, serve_websocket

    messages = [bytes([i % 251]) * 1000 for i in range(2000)]
    done: asyncio.Future[tuple[int, int, int]] = asyncio.get_running_loop().create_future()

    async def handler(channel: WebSocketChannel) -> None:
        await asyncio.sleep(0.3)  # let the frames pile up in the socket
        count = 0
        for m in messages:
            count += await asyncio.wait_for(channel.recv(), 10) == m
        reader = channel._ws.protocol.reader
        done.set_result((count, reader._bulk_chunk, channel._ws.transport.max_size))
        await channel.close()

    server = await serve_websocket(handler, "127.0.0.1", 0, max_message_size=1 << 20)
    async with server:
        port = server.sockets[0].getsockname()[1]
        channel = await connect_websocket(f"ws://127.0.0.1:{port}", max_message_size=1 << 20)
        for m in messages:
            await channel.send(m)
        count, bulk_chunk, max_size = await asyncio.wait_for(done, 20)
        await channel.close()
    assert count == len(messages)
    assert bulk_chunk == sys.maxsize  # a read did come back full ...
    assert max_size == 256 * 1024  # ... and the read size stayed asyncio's


async def test_text_goes_out_and_comes_in_as_utf8_bytes_with_the_text_flag() -> None:
    """The session's text is bytes both ways: send_now/send with text=True write the bytes as a
    text frame as they are, and a text frame is pushed as its bytes with text=True (websockets'
    asyncio layer, which would decode it, is not on the path)."""
    from websockets.asyncio.server import serve as ws_serve

    from m2mwire.errors import TransportError
    from m2mwire.transport.websocket import connect_websocket

    seen: list[str | bytes] = []

    async def peer(ws: Any) -> None:
        async for message in ws:
            seen.append(message)
            await ws.send(message)

    got: list[tuple[bytes, bool]] = []
    lost: list[TransportError] = []
    async with ws_serve(peer, "127.0.0.1", 0, compression=None) as raw:
        port = raw.sockets[0].getsockname()[1]
        channel = await connect_websocket(f"ws://127.0.0.1:{port}", max_message_size=1 << 20)
        try:
            channel.start_push(lambda data, text: got.append((data, text)), lost.append)
            assert channel.send_now("café".encode(), True)
            await channel.send(memoryview("ü ☕".encode()), True)
            await channel.send(b"\x00binary")
            for _ in range(500):
                if len(got) == 3:
                    break
                await asyncio.sleep(0.01)
            assert seen == ["café", "ü ☕", b"\x00binary"]  # text frames, then a binary one
            assert got == [("café".encode(), True), ("ü ☕".encode(), True), (b"\x00binary", False)]
            assert all(type(data) is bytes for data, _ in got)
        finally:
            await channel.close()


async def test_an_answer_goes_out_at_once_and_schedules_no_end_of_turn_callback() -> None:
    """Request and answer: the first write after input arrived is written before send_now returns
    and schedules nothing (the end-of-turn callback cost a call_soon and a loop iteration per
    message on each side); a write held back in the same turn still goes out when the turn ends."""
    from websockets.asyncio.server import serve as ws_serve

    from m2mwire.transport.websocket import connect_websocket

    async def peer(ws: Any) -> None:
        async for message in ws:
            await ws.send(message)

    got: list[bytes] = []
    async with ws_serve(peer, "127.0.0.1", 0, compression=None) as raw:
        port = raw.sockets[0].getsockname()[1]
        channel = await connect_websocket(f"ws://127.0.0.1:{port}", max_message_size=1 << 20)
        try:
            channel.start_push(lambda data, _text: got.append(data), lambda _err: None)
            loop = asyncio.get_running_loop()
            transport = channel._ws.transport
            writes = end_turns = 0
            real_write, real_call_soon = transport.write, loop.call_soon

            def counting_write(data: Any) -> None:
                nonlocal writes
                writes += 1
                real_write(data)

            def counting_call_soon(callback: Any, *args: Any, **kwargs: Any) -> Any:
                nonlocal end_turns
                end_turns += getattr(callback, "__name__", "") == "_m2m_end_turn"
                return real_call_soon(callback, *args, **kwargs)

            async def answered(count: int) -> None:
                for _ in range(500):
                    if len(got) >= count:
                        return
                    await asyncio.sleep(0.01)
                raise AssertionError("no echo")

            transport.write = counting_write
            loop.call_soon = counting_call_soon  # type: ignore[method-assign]
            try:
                assert channel.send_now("request 0")
                await answered(1)
                for i in range(1, 6):  # each request follows the previous answer's arrival
                    before = writes
                    assert channel.send_now(f"request {i}")
                    assert writes == before + 1  # at once
                    await answered(i + 1)
                assert end_turns == 0
                before = writes
                assert channel.send_now("first") and channel.send_now("second")  # no input between
                assert writes == before + 1 and end_turns == 1  # the second waits for the turn's end
                await asyncio.sleep(0)
                assert writes == before + 2
                await answered(8)
            finally:
                del loop.call_soon
        finally:
            await channel.close()
    assert got[-2:] == [b"first", b"second"]
