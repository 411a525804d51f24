"""Resource bounds of the WebSocket transport against hostile peers, with a raw hand-written client.

The client speaks RFC 6455 over a real socket (asyncio streams, no websockets library), so it can
do what no well-behaved library does: flood PINGs without reading, send thousands of empty
continuation frames, or wait to see what a client sends before the server proves its identity.
Counts are scaled down from the attacks in issue 11; each test checks the bound itself.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from m2mwire.api import connect
from m2mwire.errors import TransportError
from m2mwire.transport.tls import generate_self_signed
from m2mwire.transport.websocket import WebSocketChannel, serve_websocket

pytestmark = pytest.mark.timeout(60)

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
MASK = b"\x00\x00\x00\x00"  # any 32-bit value is a valid masking key; zero keeps payloads as they are


def frame(opcode: int, payload: bytes = b"", *, fin: bool = True) -> bytes:
    """One masked client frame."""
    first = (0x80 if fin else 0) | opcode
    n = len(payload)
    if n < 126:
        header = struct.pack("!BB", first, 0x80 | n)
    elif n < 1 << 16:
        header = struct.pack("!BBH", first, 0x80 | 126, n)
    else:
        header = struct.pack("!BBQ", first, 0x80 | 127, n)
    return header + MASK + payload


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One unmasked server frame: (opcode, payload)."""
    b0, b1 = await reader.readexactly(2)
    n = b1 & 0x7F
    if n == 126:
        (n,) = struct.unpack("!H", await reader.readexactly(2))
    elif n == 127:
        (n,) = struct.unpack("!Q", await reader.readexactly(8))
    return b0 & 0x0F, await reader.readexactly(n)


async def upgrade(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    response = await reader.readuntil(b"\r\n\r\n")
    assert response.startswith(b"HTTP/1.1 101"), response


@asynccontextmanager
async def ws_server(
    handler: Callable[[WebSocketChannel], Awaitable[None]], max_message_size: int
) -> AsyncIterator[Any]:
    server = await serve_websocket(handler, "127.0.0.1", 0, max_message_size=max_message_size)
    try:
        yield server
    finally:
        server.close()
        await server.wait_closed()


async def close_code(reader: asyncio.StreamReader) -> int:
    """The code of the close frame the server sends next (failing if it sends a message instead)."""
    opcode, payload = await asyncio.wait_for(read_frame(reader), 10)
    assert opcode == OP_CLOSE, f"expected a close frame, got opcode {opcode}"
    code: int = struct.unpack("!H", payload[:2])[0]
    return code


def collecting_handler(received: list[bytes | str]) -> Callable[[WebSocketChannel], Awaitable[None]]:
    async def handler(channel: WebSocketChannel) -> None:
        try:
            while True:
                received.append(await channel.recv())
        except TransportError:
            pass

    return handler


# -- 11.8: fragment floods -------------------------------------------------------------------------


@pytest.mark.parametrize("empty", [True, False], ids=["empty-fragments", "two-byte-fragments"])
async def test_a_message_in_more_fragments_than_its_limit_allows_closes_1009(empty: bool) -> None:
    # 64 KiB limit: at most 1,024 frames per message. The flood sends 5,000 (the attack in
    # issue 11 sent 3 M empty ones; before the fix they were stored and the message delivered).
    received: list[bytes | str] = []
    async with ws_server(collecting_handler(received), 64 * 1024) as server:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await upgrade(reader, writer, port)
        piece = b"" if empty else b"ab"
        flood = [frame(OP_BINARY, b"x", fin=False)]
        flood += [frame(OP_CONT, piece, fin=False)] * 5_000
        flood.append(frame(OP_CONT, b"y"))
        writer.write(b"".join(flood))
        assert await close_code(reader) == 1009
        writer.close()
        await asyncio.sleep(0.05)
    assert received == []


@pytest.mark.parametrize("extra", [0, 1], ids=["at-the-bound", "one-over"])
async def test_the_fragment_bound_is_one_frame_per_64_bytes_of_the_limit(extra: int) -> None:
    limit = 128 * 1024  # 2,048 frames
    frames = limit // 64 + extra
    received: list[bytes | str] = []
    async with ws_server(collecting_handler(received), limit) as server:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await upgrade(reader, writer, port)
        parts = [frame(OP_TEXT, b"a", fin=False)]
        parts += [frame(OP_CONT, b"a", fin=False)] * (frames - 2)
        parts.append(frame(OP_CONT, b"a"))
        writer.write(b"".join(parts))
        if extra:
            assert await close_code(reader) == 1009
            await asyncio.sleep(0.05)
            assert received == []
        else:
            writer.write(frame(OP_CLOSE, struct.pack("!H", 1000)))
            assert await close_code(reader) == 1000
            await asyncio.sleep(0.05)
            assert received == ["a" * frames]
        writer.close()


async def test_autobahn_style_4_mib_in_65536_fragments_passes_at_a_4_mib_limit() -> None:
    # The standard suite's fragmentation cases (9.3.1 / 9.4.1): 4 MiB in 64-byte fragments.
    size, chunk = 4 * 1024 * 1024, 64
    payload = os.urandom(size)
    received: list[bytes | str] = []
    async with ws_server(collecting_handler(received), size) as server:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await upgrade(reader, writer, port)
        n = size // chunk
        parts = [
            frame(OP_BINARY if i == 0 else OP_CONT, payload[i * chunk : (i + 1) * chunk], fin=i == n - 1)
            for i in range(n)
        ]
        writer.write(b"".join(parts))
        writer.write(frame(OP_CLOSE, struct.pack("!H", 1000)))
        assert await close_code(reader) == 1000
        writer.close()
        await asyncio.sleep(0.05)
    assert len(received) == 1 and received[0] == payload


# -- 11.7: PING flood without reading -------------------------------------------------------------


async def test_a_ping_flood_from_a_peer_that_never_reads_stops_being_read() -> None:
    ping = frame(OP_PING, b"p" * 125)  # the largest control frame: 131 bytes in, 127 out
    count = 96_000  # ~12 MiB of PINGs: more than the kernel buffers of both ends can absorb
    flood = ping * count
    stall = asyncio.Event()

    async def never_reads(channel: WebSocketChannel) -> None:
        await stall.wait()

    async with ws_server(never_reads, 1024 * 1024) as server:
        try:
            await ping_flood(server, flood, count)
        finally:
            stall.set()  # the server waits for its handlers when it closes


async def ping_flood(server: Any, flood: bytes, count: int) -> None:
    """Flood PINGs without reading, check the server's write buffer, then read every PONG."""
    port = server.sockets[0].getsockname()[1]
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a peer that reads nothing
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    try:
        await ping_flood_on(server, flood, count, sock, reader, writer)
    finally:
        writer.transport.abort()  # a server cannot close a connection whose peer reads nothing


async def ping_flood_on(
    server: Any,
    flood: bytes,
    count: int,
    sock: socket.socket,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    loop = asyncio.get_running_loop()
    port = server.sockets[0].getsockname()[1]
    await upgrade(reader, writer, port)
    (conn,) = server.connections
    transport = conn.transport

    # Phase 1: push the flood without reading, until the server stops taking it (or all of it
    # is sent); watch the server's write buffer all along.
    peak = sent = 0
    idle_since = loop.time()
    while sent < len(flood) and loop.time() - idle_since < 1.0:
        try:
            n = sock.send(flood[sent : sent + 262_144])
        except BlockingIOError:
            n = 0
        if n:
            sent += n
            idle_since = loop.time()
        peak = max(peak, transport.get_write_buffer_size())
        await asyncio.sleep(0 if n else 0.01)
    for _ in range(20):  # let the server work through what it already read
        await asyncio.sleep(0.01)
        peak = max(peak, transport.get_write_buffer_size())
    # Bound: 32 KiB write limit + 64 KiB of queued replies + the replies to one 256 KiB read.
    assert peak < 1024 * 1024, f"server queued {peak} bytes of PONGs for a peer that reads nothing"
    assert not transport.is_reading(), "the server kept reading a peer that does not read"

    # Phase 2: the peer reads again; the server resumes, and every PING gets its PONG.
    pongs = 0

    async def read_pongs() -> None:
        nonlocal pongs
        while pongs < count:
            opcode, payload = await read_frame(reader)
            assert opcode == OP_PONG and payload == b"p" * 125
            pongs += 1

    reading = asyncio.create_task(read_pongs())
    writer.write(flood[sent:])
    await asyncio.wait_for(writer.drain(), 20)
    await asyncio.wait_for(reading, 20)
    assert pongs == count


# -- 11.19: a pinned certificate is checked before the HTTP upgrade --------------------------------


async def test_a_pinned_wss_client_sends_no_http_to_an_impostor() -> None:
    impostor = generate_self_signed()
    context = impostor.server_ssl_context()
    received = bytearray()
    done = asyncio.Event()

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):  # TLS records, decrypted by asyncio
                received.extend(chunk)
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            done.set()
            writer.close()

    server = await asyncio.start_server(record, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(TransportError, match="fingerprint mismatch"):
            await connect(f"wss://127.0.0.1:{port}/agents/42?token=secret", fingerprint="ab" * 32)
        await asyncio.wait_for(done.wait(), 5)
    finally:
        server.close()
        await server.wait_closed()
    assert bytes(received) == b"", f"the impostor received {bytes(received)[:80]!r}"
