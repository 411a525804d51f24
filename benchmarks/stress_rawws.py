"""A raw WebSocket client for hostile peers: it writes exactly the frames it is told to and reads only
when asked, so it can flood, fragment or never read (which websockets' own client does not allow).

Frames are masked with the all-zero key (legal: RFC 6455 asks for an unpredictable key, but servers
must accept any key), so a payload goes out without a masking copy. Also builds the session
messages (HELLO, DATA, CLOSE) by hand from docs/PROTOCOL.md, independent of m2mwire's encoder.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
import time
from typing import Any
from urllib.parse import urlsplit

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
ZERO_MASK = b"\0\0\0\0"
ALGORITHMS = ["tokennative", "token", "brotli", "dictionary", "none"]


def frame_header(opcode: int, length: int, *, fin: bool = True) -> bytes:
    """The header of one client frame (masked with the zero key) carrying ``length`` bytes."""
    first = (0x80 if fin else 0) | opcode
    if length < 126:
        return struct.pack("!BB", first, 0x80 | length) + ZERO_MASK
    if length < 1 << 16:
        return struct.pack("!BBH", first, 0x80 | 126, length) + ZERO_MASK
    return struct.pack("!BBQ", first, 0x80 | 127, length) + ZERO_MASK


def frame(opcode: int, payload: bytes = b"", *, fin: bool = True) -> bytes:
    return frame_header(opcode, len(payload), fin=fin) + payload


def hello(agent_id: str, *, identity: dict[str, Any] | None = None, **overrides: Any) -> str:
    """A HELLO envelope as PROTOCOL.md §1 writes it; ``overrides`` replace payload fields."""
    payload: dict[str, Any] = {
        "version": "3.0",
        "agent_id": agent_id,
        "agent_type": "stress",
        "compression": {
            "algorithms": ALGORITHMS,
            "max_payload": 16 * 1024 * 1024,
            "streaming": False,
            "ml_routing": False,
            "encodings": ["Cl100kBase"],
            "preferred_encoding": "Cl100kBase",
        },
        "security": {
            "threat_detection": False,
            "model_version": None,
            "blocking_mode": False,
            "block_threshold": 0.8,
        },
        "extensions": {},
    }
    if identity is not None:
        payload["avp"] = {"identity": identity}
    payload.update(overrides)
    return json.dumps({"type": "HELLO", "payload": payload, "timestamp": int(time.time() * 1000)})


def data(session_id: str, content: str, *, algorithm: str = "none", content_type: str = "json") -> str:
    payload = {"algorithm": algorithm, "content": content, "content_type": content_type}
    envelope = {"type": "DATA", "session_id": session_id, "payload": payload, "timestamp": 0}
    return json.dumps(envelope, separators=(",", ":"))


def close(session_id: str) -> str:
    payload = {"reason": "NORMAL", "message": "stress"}
    return json.dumps({"type": "CLOSE", "session_id": session_id, "payload": payload, "timestamp": 0})


class ConnectionClosedError(Exception):
    """The server closed the connection (``code`` from its close frame, or None at EOF)."""

    def __init__(self, code: int | None, reason: str) -> None:
        super().__init__(f"closed: {code} {reason}")
        self.code = code
        self.reason = reason


class RawWebSocket:
    """One client connection: ``await RawWebSocket.open(url)``, then write/read frames by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.session_id = ""
        self.close_code: int | None = None
        self.write_error = ""  # set when a write failed because the server closed or reset

    @classmethod
    async def open(cls, url: str, *, rcvbuf: int | None = None, timeout: float = 10.0) -> RawWebSocket:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # a small receive window: the server's writes back up at once
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (host, port)), timeout)
        # asyncio's StreamReader reads ahead in the background until 2 x limit is buffered: keep that
        # small (the default 64 KiB), and stop_reading() for a peer that must not read at all.
        reader, writer = await asyncio.open_connection(sock=sock)
        key = base64.b64encode(os.urandom(16)).decode()
        path = parts.path or "/"
        writer.write(
            (
                f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"no WebSocket upgrade: {head[:200]!r}")
        return cls(reader, writer)

    async def handshake(self, agent_id: str, *, timeout: float = 10.0, **hello_args: Any) -> dict[str, Any]:
        """Send HELLO, return the server's answer (ACCEPT or REJECT) as a dict."""
        await self.send_text(hello(agent_id, **hello_args))
        answer = json.loads(await asyncio.wait_for(self.recv_text(), timeout))
        if answer.get("type") == "ACCEPT":
            self.session_id = answer["session_id"]
        return dict(answer)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writer.write(data)

    async def drain(self, timeout: float | None = None) -> None:
        await asyncio.wait_for(self.writer.drain(), timeout)

    async def send_text(self, text: str, timeout: float | None = 30.0) -> bool:
        return await self.send_frame(OP_TEXT, text.encode(), timeout)

    async def send_binary(self, body: bytes, timeout: float | None = 30.0) -> bool:
        return await self.send_frame(OP_BINARY, body, timeout)

    async def send_frame(self, opcode: int, body: bytes, timeout: float | None) -> bool:
        """Write one frame and wait until it is taken (``timeout`` raises TimeoutError); False when
        the server has closed the connection (``write_error`` says how): a hardened server may cut
        an attacker off mid-write, and reading then shows why."""
        try:
            self.writer.write(frame_header(opcode, len(body)))
            self.writer.write(body)
            await self.drain(timeout)
        except ConnectionError as exc:
            self.write_error = f"{type(exc).__name__}: {exc}"
            return False
        return True

    async def recv_frame(self) -> tuple[int, bool, bytes]:
        """(opcode, fin, payload) of the next frame; EOF raises ConnectionClosedError(None)."""
        try:
            b1, b2 = await self.reader.readexactly(2)
            length = b2 & 0x7F
            if length == 126:
                (length,) = struct.unpack("!H", await self.reader.readexactly(2))
            elif length == 127:
                (length,) = struct.unpack("!Q", await self.reader.readexactly(8))
            payload = await self.reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise ConnectionClosedError(self.close_code, f"EOF ({type(exc).__name__})") from None
        return b1 & 0x0F, bool(b1 & 0x80), payload

    async def recv_message(self) -> tuple[int, bytes]:
        """The next data message (fragments joined); PINGs are ignored, CLOSE raises."""
        parts: list[bytes] = []
        first = -1
        while True:
            opcode, fin, payload = await self.recv_frame()
            if opcode == OP_CLOSE:
                self.close_code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                raise ConnectionClosedError(self.close_code, payload[2:].decode("utf-8", "replace"))
            if opcode in (OP_PING, OP_PONG):
                continue
            if opcode != OP_CONT:
                first = opcode
            parts.append(payload)
            if fin:
                return first, b"".join(parts)

    async def recv_text(self) -> str:
        _, body = await self.recv_message()
        return body.decode()

    def stop_reading(self) -> None:
        """Read nothing more from the socket: the kernel's receive window fills, then the server's."""
        transport = self.writer.transport
        assert isinstance(transport, asyncio.Transport)  # a socket's: it reads as well as writes
        transport.pause_reading()

    def abort(self) -> None:
        transport = self.writer.transport
        transport.abort()
