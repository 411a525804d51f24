"""QUIC benchmark: m2mwire's QUIC session and channel vs a tuned raw aioquic stream, on loopback.

    .venv/bin/python benchmarks/bench_quic_channel.py [--quick] [--rounds N] [--only NAME[,NAME]]
                                                      [--tuning key=value ...]

Issue 13's goals (printed at the end): ``--only "quic session,tuned" --rounds 5`` runs just the
QUIC session and the raw baseline it is compared with.

The server runs in a separate (spawned) process, the client here. For each suite it measures
round-trip latency (100-byte messages, echoed), one-way throughput (1 KB, 64 KiB and 1 MiB binary
messages, or ASCII text with ``--text``; median of 3 interleaved rounds), and the sender's peak
RSS while a fast sender outpaces a receiver that reads one 1 MiB message every 50 ms.

Suites: m2mwire's QUIC *session* (the public API: ``m2mwire.serve`` / ``m2mwire.connect`` over one
shared ``open_quic_connection``), a tuned raw aioquic stream (the baseline), m2mwire's QUIC
*channel* (the transport layer alone) and m2mwire's WebSocket session. Session suites negotiate
latent mode (a shared ModelIdentity) and algorithm "none": text goes out as-is and binary messages
as AVP hidden-state frames (an int8 tensor over the bytes, built zero-copy by the session).

The harness is transport-agnostic: a *suite* is a server entry point (run in the child process)
plus a client *channel factory*; anything with ``send(str | bytes)``, ``recv()`` and ``close()``
fits. Every server understands the same control messages, sent as the first message of each
channel:

    "echo"                      echo every message back
    "sink:<count>"              read <count> messages, then send "done:<bytes>"
    "slow:<count>:<delay_ms>"   like sink, sleeping <delay_ms> before each read
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import multiprocessing
import os
import socket
import ssl
import statistics
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from importlib.metadata import version
from pathlib import Path
from typing import Any, Protocol

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cpus import pin_client_and_servers, unpin
from _loop import use_loop_from_env
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import serve as aioquic_serve
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from m2mwire.api import Session, connect, open_quic_connection, serve
from m2mwire.errors import TransportError
from m2mwire.schemas.identity import ModelIdentity
from m2mwire.transport.quic import (
    QuicChannel,
    QuicClientConnection,
    QuicTuning,
    connect_quic,
    serve_quic,
)
from m2mwire.transport.tls import generate_self_signed

LOOP = use_loop_from_env()  # M2M_BENCH_LOOP=uvloop: also in the spawned servers (they import us)

MiB = 1024 * 1024
MAX_MESSAGE = 64 * MiB


class BenchChannel(Protocol):
    async def send(self, message: Any) -> None: ...
    async def recv(self) -> str | bytes | memoryview: ...
    async def close(self) -> None: ...


# A factory returns a fresh channel to the server; `aclose` releases what the factory holds.
class ChannelFactory(Protocol):
    async def __call__(self) -> BenchChannel: ...
    async def aclose(self) -> None: ...


def _text(message: str | bytes | memoryview) -> str:
    return message if isinstance(message, str) else bytes(message).decode()


async def serve_commands(channel: BenchChannel) -> None:
    """The server side of every suite: interpret the first message, then act on the channel."""
    command = _text(await channel.recv()).split(":")
    if command[0] == "echo":
        while True:
            try:
                message = await channel.recv()
            except Exception:
                return
            await channel.send(message)
    count = int(command[1])
    delay = int(command[2]) / 1000 if command[0] == "slow" else 0.0
    total = 0
    cpu0 = 0.0
    for i in range(count):
        if delay:
            await asyncio.sleep(delay)
        message = await channel.recv()
        if i == 0:
            cpu0 = time.process_time()
        total += len(message)
    # CPU seconds the server process spent from the first message to the last
    await channel.send(f"done:{total}:{time.process_time() - cpu0:.6f}")
    with contextlib.suppress(Exception):
        async with asyncio.timeout(10):
            await channel.recv()  # wait for the client's close


# -- suite 1: m2mwire QUIC channel ---------------------------------------------------------------


def m2mwire_server(port_queue: Any, tuning: dict[str, Any]) -> None:
    async def main() -> None:
        server = await serve_quic(
            serve_commands, "127.0.0.1", 0, max_message_size=MAX_MESSAGE, tuning=QuicTuning(**tuning)
        )
        port_queue.put((server.port, server.fingerprint))
        await asyncio.Future()

    asyncio.run(main())


# m2mwire's QUIC server closes a connection that carried no channel for its idle timeout (20 s).
# A factory's connection sits unused while the other suites run their share of a round, which can
# take longer than that (a loaded machine; uvloop, whose UDP path is slower here): reused then, it
# failed with "closed by the peer ... no channel open for 20 s". So a factory reuses its connection
# only within REUSE_FOR seconds of its last channel's start (its idle time is shorter still, so the
# server cannot be closing it), and otherwise opens a fresh one before the measurement starts.
REUSE_FOR = 10.0


class SharedConnection:
    """The QUIC connection a factory's channels share, reopened when it may have gone idle."""

    def __init__(self, open_connection: Callable[[], Awaitable[QuicClientConnection]]) -> None:
        self._open = open_connection
        self._conn: QuicClientConnection | None = None
        self._used = 0.0

    async def get(self) -> QuicClientConnection:
        now = time.monotonic()
        conn = self._conn
        if conn is None or conn.closed or now - self._used >= REUSE_FOR:
            self._conn = None
            if conn is not None:
                await conn.close()  # its channels are closed: the bench runs one at a time
            conn = self._conn = await self._open()
        self._used = now
        return conn

    async def aclose(self) -> None:
        if self._conn is not None:
            await self._conn.close()


class M2MWireFactory:
    def __init__(self, port: int, fingerprint: str, tuning: dict[str, Any]) -> None:
        self._conn = SharedConnection(
            functools.partial(
                connect_quic,
                "127.0.0.1",
                port,
                fingerprint=fingerprint,
                max_message_size=MAX_MESSAGE,
                tuning=QuicTuning(**tuning),
            )
        )

    async def __call__(self) -> BenchChannel:
        channel: QuicChannel = await (await self._conn.get()).open_channel()
        return channel

    async def aclose(self) -> None:
        await self._conn.aclose()


# -- suite 2: raw aioquic, one stream per channel, 4-byte length prefix, same tuning ---------------
# What a hand-rolled aioquic client reaches: coalesced transmits (_transmit_soon), 16 KiB
# datagrams, 32 MiB / 16 MiB flow-control windows, 4 MiB socket buffers. aioquic has no send
# backpressure, so like the reference baseline the sender keeps at most 4 MiB unacknowledged using
# application-level acks ("A" + cumulative bytes, sent by the receiver every >= 1 MiB).

RAW_ALPN = "bench-raw"
RAW_WINDOW = 4 * MiB


def _raw_config(is_client: bool) -> QuicConfiguration:
    return QuicConfiguration(
        is_client=is_client,
        alpn_protocols=[RAW_ALPN],
        max_datagram_size=16384,
        max_data=32 * MiB,
        max_stream_data=16 * MiB,
        idle_timeout=60.0,
    )


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * MiB)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * MiB)


class RawStream:
    """A length-prefixed message channel on one raw aioquic stream (server or client side)."""

    def __init__(self, proto: RawProtocol, stream_id: int, *, acks: bool) -> None:
        self.proto = proto
        self.stream_id = stream_id
        self.buffer = bytearray()
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.acks = acks  # False: unbounded sender (the "no window" memory case)
        self.sent = 0
        self.acked = 0
        self.received_since_ack = 0
        self.received_total = 0
        self.ack_event = asyncio.Event()

    async def send(self, message: str | bytes) -> None:
        data = message.encode() if isinstance(message, str) else message
        while self.acks and self.sent - self.acked > RAW_WINDOW:
            self.ack_event.clear()
            await self.ack_event.wait()
        self._write(
            struct.pack(">I", len(data)) + data if len(data) <= 65536 else struct.pack(">I", len(data))
        )
        if len(data) > 65536:
            self._write(data)
        self.sent += len(data)
        if not self.acks:
            await asyncio.sleep(0)

    def _write(self, data: bytes) -> None:
        self.proto._quic.send_stream_data(self.stream_id, data)
        self.proto._transmit_soon()

    async def recv(self) -> bytes:
        return await self.queue.get()

    async def close(self) -> None:
        self.proto._quic.send_stream_data(self.stream_id, b"", end_stream=True)
        self.proto._transmit_soon()

    def feed(self, data: bytes) -> None:
        self.buffer += data
        pos = 0
        while len(self.buffer) - pos >= 4:  # bounded by the buffer
            (n,) = struct.unpack_from(">I", self.buffer, pos)
            if len(self.buffer) - pos - 4 < n:
                break
            message = bytes(self.buffer[pos + 4 : pos + 4 + n])
            pos += 4 + n
            if message[:1] == b"A" and len(message) == 9:
                self.acked = struct.unpack(">Q", message[1:])[0]
                self.ack_event.set()
                continue
            self.received_total += n
            self.received_since_ack += n
            self.queue.put_nowait(message)
        del self.buffer[:pos]

    def ack_if_due(self) -> None:
        if self.received_since_ack >= MiB:
            self.received_since_ack = 0
            self._write(struct.pack(">I", 9) + b"A" + struct.pack(">Q", self.received_total))


class RawProtocol(QuicConnectionProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.streams: dict[int, RawStream] = {}
        self.is_server = not self._quic.configuration.is_client

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived):
            stream = self.streams.get(event.stream_id)
            if stream is None:
                if not self.is_server:
                    return
                stream = self.streams[event.stream_id] = RawStream(self, event.stream_id, acks=True)
                asyncio.get_running_loop().create_task(self._serve(stream))
            stream.feed(event.data)

    async def _serve(self, stream: RawStream) -> None:
        class Acking:
            async def recv(self) -> bytes:
                message = await stream.recv()
                stream.ack_if_due()
                return message

            async def send(self, message: Any) -> None:
                await stream.send(message)

            async def close(self) -> None:
                await stream.close()

        await serve_commands(Acking())


def raw_server(port_queue: Any, tuning: dict[str, Any]) -> None:
    async def main() -> None:
        cert = generate_self_signed()
        config = _raw_config(is_client=False)
        config.certificate, config.private_key = cert.certificate, cert.private_key
        server = await aioquic_serve("127.0.0.1", 0, configuration=config, create_protocol=RawProtocol)
        assert server._transport is not None
        sock = server._transport.get_extra_info("socket")
        _tune(sock)
        port_queue.put((sock.getsockname()[1], cert.fingerprint))
        await asyncio.Future()

    asyncio.run(main())


class RawFactory:
    def __init__(self, port: int, fingerprint: str, tuning: dict[str, Any], *, acks: bool = True) -> None:
        self._port = port
        self._acks = acks
        self._proto: RawProtocol | None = None
        self._transport: asyncio.DatagramTransport | None = None
        self._used = 0.0

    async def __call__(self) -> BenchChannel:
        # The raw connection has aioquic's silent 60 s idle timeout and no keepalive: the same
        # rule as SharedConnection's keeps a long round from finding it gone.
        now = time.monotonic()
        if self._proto is not None and now - self._used >= REUSE_FOR:
            await self.aclose()
        self._used = now
        if self._proto is None:
            loop = asyncio.get_running_loop()
            config = _raw_config(is_client=True)
            config.verify_mode = ssl.CERT_NONE  # benchmark only; the m2mwire suite pins the fingerprint
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            _tune(sock)
            sock.bind(("127.0.0.1", 0))
            transport, proto = await loop.create_datagram_endpoint(
                lambda: RawProtocol(QuicConnection(configuration=config)), sock=sock
            )
            proto.connect(("127.0.0.1", self._port))
            await proto.wait_connected()
            self._proto, self._transport = proto, transport
        stream_id = self._proto._quic.get_next_available_stream_id()
        stream = RawStream(self._proto, stream_id, acks=self._acks)
        self._proto.streams[stream_id] = stream
        return stream

    async def aclose(self) -> None:
        proto, transport = self._proto, self._transport
        self._proto = self._transport = None
        if proto is not None:
            proto.close()
            async with asyncio.timeout(5):
                await proto.wait_closed()
        if transport is not None:
            transport.close()


# -- m2mwire sessions (the public API) over QUIC and over WebSocket ----------------------------------
# Both ends offer the same model identity, so latent mode is negotiated and binary messages travel
# as AVP hidden-state frames; text uses algorithm "none" (sent as-is). The names are imported from
# m2mwire.api: they are m2mwire.serve / connect / open_quic_connection / Session, but mypy --strict
# does not see the package's lazy re-exports.

IDENT = ModelIdentity(model_family="bench", model_id="bench", model_hash="0" * 64, hidden_dim=1, num_layers=1)


class SessionAdapter:
    """A session as a bench channel: str -> text DATA, bytes -> an AVP frame of an int8 tensor."""

    def __init__(self, session: Session) -> None:
        if session.info.mode != "LATENT":  # checked once per session, not per message
            raise RuntimeError(f"expected latent mode, got {session.info.mode} ({session.info.mode_reason})")
        self.session = session

    async def send(self, message: str | bytes | memoryview) -> None:
        if isinstance(message, str):
            await self.session.send(message, algorithm="none")
        else:
            await self.session.send(np.frombuffer(message, dtype=np.int8))

    async def recv(self) -> str | memoryview:
        message = await self.session.recv()
        if message.kind == "avp":
            assert message.avp is not None
            return message.avp.payload  # a memoryview of the original bytes
        assert message.text is not None
        return message.text

    async def close(self) -> None:
        await self.session.close()


def _session_server(port_queue: Any, scheme: str) -> None:
    async def handler(session: Session) -> None:
        # The memory test abandons its session mid-transfer: the peer vanishing is expected there.
        with contextlib.suppress(TransportError):
            await serve_commands(SessionAdapter(session))

    async def main() -> None:
        server = await serve(handler, f"{scheme}://127.0.0.1:0", identity=IDENT, max_payload=MAX_MESSAGE)
        port_queue.put((server.port, server.fingerprint or ""))
        await asyncio.Future()

    asyncio.run(main())


def quic_session_server(port_queue: Any, tuning: dict[str, Any]) -> None:
    _session_server(port_queue, "quic")


def ws_session_server(port_queue: Any, tuning: dict[str, Any]) -> None:
    _session_server(port_queue, "ws")


class SessionFactory:
    """One session per channel; QUIC sessions share one connection (``connection=``)."""

    def __init__(self, port: int, fingerprint: str, tuning: dict[str, Any], *, scheme: str) -> None:
        self._url = f"{scheme}://127.0.0.1:{port}"
        self._conn = SharedConnection(  # QUIC only: WebSocket sessions open their own connections
            functools.partial(
                open_quic_connection, self._url, fingerprint=fingerprint, max_payload=MAX_MESSAGE
            )
        )

    async def __call__(self) -> BenchChannel:
        options: dict[str, Any] = {}
        if self._url.startswith("quic:"):
            options["connection"] = await self._conn.get()
        session = await connect(
            self._url, identity=IDENT, max_payload=MAX_MESSAGE, algorithms=["none"], **options
        )
        return SessionAdapter(session)

    async def aclose(self) -> None:
        await self._conn.aclose()


# -- measurements ------------------------------------------------------------------------------------


async def bench_rtt(factory: ChannelFactory, n: int = 1000, warmup: int = 100) -> tuple[float, float]:
    """p50 and p99 round trip in microseconds for a 100-byte text message."""
    samples = sorted(await bench_rtt_samples(factory, n, warmup))
    return samples[len(samples) // 2], samples[max(int(len(samples) * 0.99) - 1, 0)]


async def bench_rtt_samples(factory: ChannelFactory, n: int, warmup: int = 50) -> list[float]:
    """Round trips (us) of a 100-byte text message echoed by the server."""
    channel = await factory()
    await channel.send("echo")
    message = '{"type":"DATA","session_id":"s-0001","payload":"' + "x" * 50 + '"}'
    assert len(message) == 100
    samples = []
    for i in range(warmup + n):
        t0 = time.perf_counter()
        await channel.send(message)
        await channel.recv()
        if i >= warmup:
            samples.append((time.perf_counter() - t0) * 1e6)
    await channel.close()
    return samples


async def bench_throughput(factory: ChannelFactory, size: int, count: int) -> tuple[float, float, float]:
    """One-way MB/s (10^6 bytes/s) for `count` binary messages of `size` bytes, and CPU us/msg.

    Returns (MB/s, client CPU us per message, server CPU us per message). CPU time is the figure to
    compare on a shared machine: wall-clock throughput moves with other tenants' load.
    """
    # --text: ASCII text (a session sends it as text DATA, algorithm none), else random bytes
    # (a session sends them as an AVP frame).
    payload: str | bytes = "x" * size if TEXT_MESSAGES else os.urandom(size)
    channel = await factory()
    await channel.send(f"sink:{count}")
    cpu0, t0 = time.process_time(), time.perf_counter()
    for _ in range(count):
        await channel.send(payload)
    reply = _text(await channel.recv()).split(":")
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    await channel.close()
    assert reply[:2] == ["done", str(size * count)], reply
    return size * count / elapsed / 1e6, cpu / count * 1e6, float(reply[2]) / (count - 1) * 1e6


def _rss_kib(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


async def bench_memory(
    factory: ChannelFactory, *, size: int = MiB, count: int = 256, seconds: float = 2.0
) -> tuple[float, float, int]:
    """Sender's peak RSS growth (MiB) while the receiver reads one message per 50 ms.

    Sends up to `count` messages or for `seconds`, whichever ends first. Returns (peak RSS growth
    in MiB, sender's achieved MB/s into the channel, messages sent).
    """
    payload = os.urandom(size)
    channel = await factory()
    await channel.send(f"slow:{count}:50")
    await asyncio.sleep(0.2)
    try:  # reset the peak RSS counter (Linux >= 4.0); VmHWM then tracks only this test
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    base = _rss_kib("VmRSS")
    sent = 0
    t0 = time.perf_counter()
    while sent < count and time.perf_counter() - t0 < seconds:
        await asyncio.wait_for(channel.send(payload), timeout=seconds)
        sent += 1
    elapsed = time.perf_counter() - t0
    peak = _rss_kib("VmHWM")
    # Abandon the channel (the server is still reading slowly) rather than wait for it to drain.
    abort = getattr(channel, "abort", None)
    if abort is not None:
        abort()
    return (peak - base) / 1024, sent * size / elapsed / 1e6, sent


@dataclass
class Suite:
    name: str
    server: Callable[[Any, dict[str, Any]], None]
    factory: Callable[[int, str, dict[str, Any]], ChannelFactory]
    tuning: dict[str, Any] = field(default_factory=dict)
    memory_only: bool = False
    counts: dict[int, int] = field(default_factory=dict)  # per-size message counts overriding SIZES


RAW_BASELINE = "raw aioquic stream (tuned)"
QUIC_SESSION = "m2mwire QUIC session"

# Sessions cost ~100-200 us of CPU per small message (a 2-core machine then runs ~5k msgs/s): fewer
# 1 KB messages keep the full run around 1.5 minutes; the rate is steady long before 5000.
SESSION_COUNTS = {1000: 5000}

# Each round runs the suites in this order; ours first, then the baseline it is compared with.
SUITES = [
    Suite(
        QUIC_SESSION,
        quic_session_server,
        functools.partial(SessionFactory, scheme="quic"),
        counts=SESSION_COUNTS,
    ),
    Suite(RAW_BASELINE, raw_server, RawFactory),
    Suite("m2mwire QUIC channel", m2mwire_server, M2MWireFactory),
    Suite(
        "m2mwire WebSocket session",
        ws_session_server,
        functools.partial(SessionFactory, scheme="ws"),
        counts=SESSION_COUNTS,
    ),
    Suite(
        "raw aioquic, no send window",
        raw_server,
        functools.partial(RawFactory, acks=False),
        memory_only=True,
    ),
]

SIZES = [(1000, 20000), (64 * 1024, 1600), (MiB, 200)]
TEXT_MESSAGES = False  # --text
ROUNDS = 3
# Issue 13: the QUIC session's throughput vs the tuned raw aioquic stream's: >= 1.0x for 1,000-byte
# messages; 64 KiB and 1 MiB no worse than before it (~1.6-1.8x on the reference machine).
GOAL_RATIOS = {1000: 1.0, 64 * 1024: 1.6, MiB: 1.6}
GOAL_MIB_RATE = 150.0  # MB/s for 1 MiB messages on a 2-core machine like the one the issue names


@dataclass
class Results:
    rtt_us: list[float] = field(default_factory=list)
    # size -> list of (MB/s, client CPU us/msg, server CPU us/msg), one per round
    throughput: dict[int, list[tuple[float, float, float]]] = field(default_factory=dict)
    memory: tuple[float, float, int] | None = None


async def run_rounds(
    suites: list[Suite], servers: dict[str, tuple[int, str]], quick: bool, rounds: int = ROUNDS
) -> dict[str, Results]:
    """Interleave the suites round-robin so that drift in machine load hits them all alike."""
    results = {s.name: Results() for s in suites}
    factories = {s.name: s.factory(*servers[s.name], s.tuning) for s in suites}
    try:
        for s in suites:  # warm-up: connection, code paths, allocator
            if not s.memory_only:
                for size, count in SIZES:
                    count = s.counts.get(size, count)
                    await bench_throughput(factories[s.name], size, max(count // 20, 5))
        for _ in range(1 if quick else rounds):
            for s in suites:
                if s.memory_only:
                    continue
                r = results[s.name]
                channel_rtt = await bench_rtt_samples(factories[s.name], n=200 if quick else 400)
                r.rtt_us.extend(channel_rtt)
                for size, count in SIZES:
                    count = s.counts.get(size, count)
                    n = max(count // 5, 10) if quick else count
                    r.throughput.setdefault(size, []).append(
                        await bench_throughput(factories[s.name], size, n)
                    )
    finally:
        for f in factories.values():
            await f.aclose()
    return results


def memory_in_child(suite: Suite, server: tuple[int, str], quick: bool) -> tuple[float, float, int]:
    """bench_memory in a fresh spawned client process, so that its peak RSS is this test's alone."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=_memory_child, args=(queue, suite, server, quick), daemon=True)
    process.start()
    try:
        result: tuple[float, float, int] = queue.get(timeout=60)
        return result
    finally:
        process.join(10)
        if process.is_alive():
            process.terminate()


def _memory_child(queue: Any, suite: Suite, server: tuple[int, str], quick: bool) -> None:
    async def main() -> tuple[float, float, int]:
        factory = suite.factory(*server, suite.tuning)
        try:
            return await bench_memory(factory, count=64 if quick else 256)
        finally:
            await factory.aclose()

    queue.put(asyncio.run(main()))


def start_server(suite: Suite) -> tuple[multiprocessing.process.BaseProcess, int, str]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=suite.server, args=(queue, suite.tuning), daemon=True)
    process.start()
    port, fingerprint = queue.get(timeout=30)
    return process, port, fingerprint


def report(suites: list[Suite], results: dict[str, Results]) -> None:
    width = max(len(s.name) for s in suites)
    print(f"event loop: {LOOP}")
    print(f"{'':{width}}  RTT p50 us  RTT p99 us  " + "  ".join(f"{_label(s):>30}" for s, _ in SIZES))
    medians: dict[str, dict[int, float]] = {}
    cpu_medians: dict[str, dict[int, tuple[float, float]]] = {}
    for s in suites:
        r = results[s.name]
        if s.memory_only:
            continue
        rtt = sorted(r.rtt_us)
        cells = []
        medians[s.name] = {}
        cpu_medians[s.name] = {}
        for size, _ in SIZES:
            runs = r.throughput[size]
            rates = sorted(x[0] for x in runs)
            medians[s.name][size] = statistics.median(rates)
            cpu = statistics.median(x[1] for x in runs), statistics.median(x[2] for x in runs)
            cpu_medians[s.name][size] = cpu
            spread = f"[{rates[0]:5.1f}-{rates[-1]:5.1f}]"
            cells.append(f"{medians[s.name][size]:6.1f} {spread} {cpu[0]:5.0f}+{cpu[1]:<5.0f}")
        p50, p99 = rtt[len(rtt) // 2], rtt[max(int(len(rtt) * 0.99) - 1, 0)]
        print(f"{s.name:{width}}  {p50:10.0f}  {p99:10.0f}  " + "  ".join(f"{c:>30}" for c in cells))
    print(
        "  throughput cells: median MB/s (10^6 B/s) over the rounds [min-max], then median CPU us per\n"
        "  message, client+server (CPU time is the steadier figure on a shared machine)"
    )
    raw = medians.get(RAW_BASELINE)
    if raw is not None:
        for name, ours in medians.items():
            if name.startswith("m2mwire"):
                ratios = ", ".join(f"{_label(s)} {ours[s] / raw[s]:.2f}x" for s, _ in SIZES)
                print(f"ratio {name} / {RAW_BASELINE}: {ratios}")
    session = medians.get(QUIC_SESSION)
    if session is not None:
        print(f"goals for {QUIC_SESSION}:")
        if raw is not None:
            for size, _ in SIZES:
                ratio = session[size] / raw[size]
                goal = GOAL_RATIOS[size]
                ours, theirs = cpu_medians[QUIC_SESSION][size], cpu_medians[RAW_BASELINE][size]
                print(
                    f"  {_label(size):>7}: {ratio:.2f}x raw throughput (goal >= {goal}x: "
                    f"{'PASS' if ratio >= goal else 'MISS'}); CPU us/msg client+server "
                    f"{ours[0]:.1f}+{ours[1]:.1f} vs raw {theirs[0]:.1f}+{theirs[1]:.1f} "
                    f"({(ours[0] + ours[1]) / (theirs[0] + theirs[1]):.2f}x)"
                )
        if MiB in session:
            rate = session[MiB]
            verdict = "PASS" if rate >= GOAL_MIB_RATE * 0.9 else "MISS"
            print(
                f"  ~{GOAL_MIB_RATE:.0f} MB/s at 1 MiB (PASS from {GOAL_MIB_RATE * 0.9:.0f}): "
                f"{rate:.1f} MB/s {verdict}"
            )
    print()
    print("fast sender vs slow receiver (1 MiB messages, receiver reads one per 50 ms, 2 s;")
    print("the sender runs in a fresh process; a session's receiver also queues up to 64 messages")
    print("(max_queue) above its transport, so a session sender gets further ahead):")
    for s in suites:
        memory = results[s.name].memory
        assert memory is not None
        growth, rate, sent = memory
        line = f"sender peak RSS growth {growth:6.1f} MiB, sent {sent:3d} msgs ({rate:6.1f} MB/s)"
        print(f"  {s.name:{width}}  {line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages, one round")
    parser.add_argument(
        "--only", help="run only the suites whose name contains one of these (comma-separated)"
    )
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="interleaved rounds (median taken)")
    parser.add_argument(
        "--tuning",
        nargs="*",
        default=[],
        help="QuicTuning overrides for the QUIC channel suite, e.g. stream_window=4194304",
    )
    parser.add_argument(
        "--no-pin", action="store_true", help="leave the client and servers unpinned (benchmarks/_cpus.py)"
    )
    parser.add_argument(
        "--text", action="store_true", help="one-way messages as text, not binary (sessions: text DATA)"
    )
    args = parser.parse_args()
    global TEXT_MESSAGES
    TEXT_MESSAGES = args.text
    overrides: dict[str, Any] = {}
    for item in args.tuning:
        key, value = item.split("=", 1)
        overrides[key] = int(value) if value.isdigit() else float(value) if value[:1].isdigit() else value
    suites = [replace(s, tuning=overrides) if s.server is m2mwire_server else s for s in SUITES]
    if args.only:
        wanted = [w.strip().lower() for w in args.only.split(",") if w.strip()]
        suites = [s for s in suites if any(w in s.name.lower() for w in wanted)]

    print(f"QUIC benchmark: 127.0.0.1, server in a spawned process, {os.cpu_count()} CPUs")
    load = os.getloadavg()[0]
    print(f"Python {sys.version.split()[0]}, aioquic {version('aioquic')}, load average {load:.2f}")
    print("one-way messages: " + ("ASCII text" if TEXT_MESSAGES else "binary (sessions: AVP frames)"))
    if overrides:
        print(f"tuning overrides: {overrides}")
    started = time.perf_counter()
    processes = []
    servers: dict[str, tuple[int, str]] = {}
    try:
        for s in suites:
            process, port, fingerprint = start_server(s)
            processes.append(process)
            servers[s.name] = (port, fingerprint)
        print(pin_client_and_servers(p.pid for p in processes if p.pid) if not args.no_pin else "not pinned")
        rounds = run_rounds(suites, servers, args.quick, args.rounds)
        results = asyncio.run(asyncio.wait_for(rounds, 60 + 60 * args.rounds))
        for s in suites:
            results[s.name].memory = memory_in_child(s, servers[s.name], args.quick)
    finally:
        for process in processes:
            process.terminate()
            process.join(5)
        unpin()
    print()
    report(suites, results)
    print(f"\ntotal {time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.2f}")


def _label(size: int) -> str:
    return (
        f"{size // MiB} MiB"
        if size >= MiB
        else f"{size // 1024} KiB"
        if size >= 1024 and size % 1024 == 0
        else f"{size} B"
    )


if __name__ == "__main__":
    main()
