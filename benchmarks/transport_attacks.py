"""Transport-level attacks of issue 11 (items 7, 8, 13) against a server in its own process.

For each attack the server (``m2mwire.serve`` with an echo handler, as users run it) is started in a
subprocess; this process attacks it over 127.0.0.1 and reports the server's RSS growth and peak
(from /proc), its CPU time, the worst lateness of a 10 ms timer in the server's event loop (the
stall every other session would see), and attack-specific counts. Run it against another checkout
by pointing PYTHONPATH there, e.g. to compare with the code before the fix:

    PYTHONPATH=. python benchmarks/transport_attacks.py            # all attacks
    PYTHONPATH=. python benchmarks/transport_attacks.py ws-ping quic-initial
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import time
from typing import Any

MASK = b"\x00\x00\x00\x00"


# -- the server process ----------------------------------------------------------------------------


async def _serve(scheme: str) -> None:
    import m2mwire

    async def echo(session: Any) -> None:
        async for message in session:
            await session.send(message.text or "")

    stall = 0.0

    async def ticker() -> None:
        nonlocal stall
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(0.01)
            stall = max(stall, loop.time() - start - 0.01)

    async with m2mwire.serve(echo, f"{scheme}://127.0.0.1:0") as server:
        tick = asyncio.create_task(ticker())
        print(json.dumps({"port": server.port, "fingerprint": server.fingerprint}), flush=True)
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            impl = server._impl.server  # the transport's own server (m2mwire.transport.entries)
            stats: dict[str, Any] = {"stall_ms": round(stall * 1000, 1)}
            if scheme == "quic":
                stats["quic_connections"] = impl.connections
                stats["half_open"] = getattr(impl, "half_open", None)
            print(json.dumps(stats), flush=True)
            if line.strip() == "reset":  # measure from here on
                stall = 0.0
            if line.strip() == "quit":
                break
        tick.cancel()


class Server:
    def __init__(self, scheme: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", scheme],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        info = json.loads(self.proc.stdout.readline())
        self.port: int = info["port"]
        self.fingerprint: str | None = info["fingerprint"]
        time.sleep(0.3)
        self.base = self.memory()

    def memory(self) -> dict[str, float]:
        fields: dict[str, float] = {}
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    fields[key] = int(value.split()[0]) / 1024
        with open(f"/proc/{self.proc.pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        fields["cpu_s"] = (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
        return fields

    def stats(self, command: str = "stats") -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        result: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return result

    def report(self, name: str, **extra: Any) -> None:
        now = self.memory()
        stats = self.stats()
        print(
            f"{name}: RSS +{now['VmRSS'] - self.base['VmRSS']:.0f} MB "
            f"(peak +{now['VmHWM'] - self.base['VmRSS']:.0f} MB), "
            f"server CPU {now['cpu_s'] - self.base['cpu_s']:.1f} s, worst loop stall {stats['stall_ms']} ms"
            + "".join(f", {k} {v}" for k, v in {**extra, **stats}.items() if k != "stall_ms"),
            flush=True,
        )

    def stop(self) -> None:
        with contextlib.suppress(BrokenPipeError, ValueError):
            self.stats("quit")
        self.proc.wait(10)


# -- WebSocket attacks ------------------------------------------------------------------------------


def frame(opcode: int, payload: bytes = b"", *, fin: bool = True) -> bytes:
    n = len(payload)
    first = (0x80 if fin else 0) | opcode
    if n < 126:
        header = struct.pack("!BB", first, 0x80 | n)
    elif n < 1 << 16:
        header = struct.pack("!BBH", first, 0x80 | 126, n)
    else:
        header = struct.pack("!BBQ", first, 0x80 | 127, n)
    return header + MASK + payload


def ws_connect(port: int, rcvbuf: int | None = None) -> socket.socket:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    response = b""
    while b"\r\n\r\n" not in response:
        response += sock.recv(4096)
    assert response.startswith(b"HTTP/1.1 101"), response
    return sock


def send_for(sock: socket.socket, data: bytes, seconds: float) -> int:
    """Send as much of ``data`` as the server takes within ``seconds``; the bytes sent."""
    sock.settimeout(0.2)
    sent, deadline = 0, time.monotonic() + seconds
    view = memoryview(data)
    while sent < len(data) and time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            sent += sock.send(view[sent : sent + (1 << 20)])
    return sent


def close_code(sock: socket.socket) -> str:
    """Read until the server's close frame; its code (or how the connection ended)."""
    sock.settimeout(30)
    buf = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return "EOF without close frame"
            buf += chunk
            while len(buf) >= 2:
                n = buf[1] & 0x7F
                start = 2 + {126: 2, 127: 8}.get(n, 0)
                if n == 126:
                    n = struct.unpack("!H", buf[2:4])[0]
                elif n == 127:
                    n = struct.unpack("!Q", buf[2:10])[0]
                if len(buf) < start + n:
                    break
                if buf[0] & 0x0F == 0x8:
                    return str(struct.unpack("!H", buf[start : start + 2])[0])
                buf = buf[start + n :]
    except TimeoutError:
        return "no close within 30 s"


def attack_ws_ping() -> None:
    """1 M PINGs of 125 bytes (131 MB) from a client that reads nothing, for at most 20 s."""
    server = Server("ws")
    try:
        sock = ws_connect(server.port, rcvbuf=4096)
        pings = frame(0x9, b"p" * 125) * 100_000
        sent = 0
        start = time.monotonic()
        for _ in range(10):
            sent += send_for(sock, pings, max(0.0, 20 - (time.monotonic() - start)))
            if sent % len(pings):
                break  # the server stopped taking them
        time.sleep(1.0)
        server.report("ws-ping", pings_taken=sent // 131)
        sock.close()
    finally:
        server.stop()


def attack_ws_fragments(name: str, piece: bytes, count: int) -> None:
    """One binary message in ``count`` continuation frames carrying ``piece`` each (limit 16 MiB)."""
    server = Server("ws")
    try:
        sock = ws_connect(server.port)
        flood = frame(0x2, b"x", fin=False) + frame(0x0, piece, fin=False) * count + frame(0x0, b"y")
        sent = send_for(sock, flood, 60)
        code = close_code(sock)
        server.report(name, frames_taken=f"{sent * count // len(flood)} of {count}", close_code=code)
        sock.close()
    finally:
        server.stop()


# -- QUIC attack ------------------------------------------------------------------------------------


def fake_initial() -> bytes:
    header = bytes([0xC3]) + (1).to_bytes(4, "big") + bytes([8]) + os.urandom(8) + bytes([8]) + os.urandom(8)
    header += b"\x00"  # no token
    body = 1230 - len(header) - 2
    return header + (0x4000 | body).to_bytes(2, "big") + os.urandom(body)


def attack_quic_initial() -> None:
    """10,000 forged 1,230-byte Initials in ~0.5 s; then a good client opens a session and echoes
    (connect + HELLO/ACCEPT + one round trip, in ms, against the same measured before the flood)."""
    server = Server("quic")
    try:
        # A first session also loads what sessions load lazily (both processes): measure after it.
        quiet = asyncio.run(_quic_round_trip(server))
        server.stats("reset")
        server.base = server.memory()
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        packets = [fake_initial() for _ in range(10_000)]
        start = time.monotonic()
        for i, packet in enumerate(packets):
            sock.sendto(packet, ("127.0.0.1", server.port))
            if i % 250 == 249:
                time.sleep(0.01)
        elapsed = time.monotonic() - start
        time.sleep(1.0)
        peak = server.stats()
        rtt = asyncio.run(_quic_round_trip(server))
        server.report(
            "quic-initial",
            sent_in_s=round(elapsed, 2),
            connections_after_1s=peak["quic_connections"],
            good_session_ms=f"{rtt} (quiet: {quiet})",
        )
        sock.close()
    finally:
        server.stop()


async def _quic_round_trip(server: Server) -> float:
    import m2mwire

    start = time.monotonic()
    async with m2mwire.connect(f"quic://127.0.0.1:{server.port}", fingerprint=server.fingerprint) as session:
        await session.send("hello")
        await session.recv()
    return round((time.monotonic() - start) * 1000, 1)


ATTACKS = {
    "ws-ping": attack_ws_ping,
    "ws-frag-empty": lambda: attack_ws_fragments("ws-frag-empty", b"", 3_000_000),
    "ws-frag-2byte": lambda: attack_ws_fragments("ws-frag-2byte", b"ab", 1_500_000),
    "quic-initial": attack_quic_initial,
}

if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        asyncio.run(_serve(sys.argv[2]))
    else:
        for name in sys.argv[1:] or list(ATTACKS):
            ATTACKS[name]()
