"""Hostile peers against an m2mwire server, with good sessions alongside (issue 11's attacks).

For each attack: a fresh server process (``stress_server.py``, ``m2mwire.serve`` with an echo handler
and a few hostile-friendly ones) on 127.0.0.1 port 0, two good sessions in another process sending
small requests and timing their echoes, the attack itself (raw sockets, aioquic, or m2mwire's public
API), and the server's RSS sampled every 20 ms plus its kernel peak (VmHWM). One table row per attack.

    PYTHONPATH=<m2mwire to test> .venv/bin/python benchmarks/stress_hostile.py \
        [--only NAME[,NAME]] [--scale 1.0] [--json OUT] [--list]

A measuring script, not a test: it always exits 0. Column meanings: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import socket
import ssl
import struct
import sys
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stress_rawws as raw
from stress_harness import MB, Harness, Row
from stress_server import IDENTITY

import m2mwire

KiB = 1024
SHORT_TIMERS = {"ping_interval": 3.0, "pong_timeout": 3.0, "max_missed_pongs": 2, "close_timeout": 2.0}
# Timer names a hardened server may add (write/idle deadlines for peers that stop reading); the server
# script drops the ones the m2mwire under test does not know.
NEW_TIMERS = {"write_timeout": 5.0}


@dataclass
class Attack:
    name: str
    item: str  # issue 11's item number(s)
    transport: str  # "ws", "quic" or "-" (no server process)
    run: Callable[[Harness, float], Awaitable[None]]
    server_args: list[str] = field(default_factory=list)
    good: int = 2
    doc: str = ""


ATTACKS: list[Attack] = []


def attack(
    name: str, item: str, transport: str = "ws", server_args: list[str] | None = None, good: int = 2
) -> Callable[[Callable[[Harness, float], Awaitable[None]]], Callable[[Harness, float], Awaitable[None]]]:
    def register(
        func: Callable[[Harness, float], Awaitable[None]],
    ) -> Callable[[Harness, float], Awaitable[None]]:
        doc = (func.__doc__ or "").strip().splitlines()[0] if func.__doc__ else ""
        ATTACKS.append(Attack(name, item, transport, func, server_args or [], good, doc))
        return func

    return register


_RANDOM: dict[int, str] = {}


def random_text(size: int) -> str:
    """``size`` characters of base64 of random bytes: text that no codec shrinks much, so an echo
    of it is as large as what was sent."""
    if size not in _RANDOM:
        _RANDOM[size] = base64.b64encode(os.urandom(size * 3 // 4 + 3)).decode()[:size]
    return _RANDOM[size]


def short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:120]


async def read_all(
    ws: raw.RawWebSocket, timeout: float, *, ack_close: bool = False
) -> tuple[list[tuple[int, bytes]], str]:
    """Every message until the connection ends or ``timeout``; and how it ended. ``ack_close``
    answers the server's CLOSE, as a well-behaved peer does, so the server need not time out."""
    messages: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return messages, f"still open at {timeout:.0f} s"
        try:
            messages.append(await asyncio.wait_for(ws.recv_message(), left))
            if ack_close and any(e.get("type") == "CLOSE" for e in envelopes(messages[-1:])):
                await ws.send_text(raw.close(ws.session_id))
        except TimeoutError:
            return messages, f"still open at {timeout:.0f} s"
        except raw.ConnectionClosedError as exc:
            return messages, f"ws close {exc.code} {exc.reason[:60]!r}"


def envelopes(messages: list[tuple[int, bytes]]) -> list[dict[str, Any]]:
    out = []
    for opcode, body in messages:
        if opcode == raw.OP_TEXT:
            with contextlib.suppress(ValueError):
                out.append(json.loads(body))
    return out


def close_of(messages: list[tuple[int, bytes]]) -> str:
    for env in envelopes(messages):
        if env.get("type") == "CLOSE":
            p = env.get("payload") or {}
            return f"CLOSE {p.get('reason', '')} {str(p.get('message', ''))[:70]!r}"
    return "no CLOSE"


async def flood(ws: raw.RawWebSocket, chunk: bytes, count: int, limit_s: float, stall_s: float) -> int:
    """Write ``chunk`` up to ``count`` times; stop when a write waits ``stall_s`` (the server stopped
    reading) or after ``limit_s``. Returns how many chunks were written."""
    deadline = time.monotonic() + limit_s
    for i in range(count):
        if time.monotonic() > deadline:
            return i
        ws.write(chunk)
        try:
            await ws.drain(stall_s)
        except TimeoutError:
            return i  # the last one sits in our buffer, not taken by the server
        except ConnectionError:
            return i
    return count


# ---------------------------------------------------------------------------------------------------
# Data loss (items 1-2)


@attack("brotli-2mib", "1")
async def a_brotli(h: Harness, scale: float) -> None:
    """Brotli messages of 2 MiB+ between two m2mwire peers: echoed intact?"""
    from m2mwire.samples import sample_payloads

    corpus = "".join(text for _, text in sample_payloads())
    cases = [("2MiB 'a'", "a" * (2 * MB)), ("3MiB corpus", (corpus * (3 * MB // len(corpus) + 1))[: 3 * MB])]
    results = []
    for label, text in cases:
        try:
            async with m2mwire.connect(h.url, agent_id="echo-brotli", algorithms=["brotli", "none"]) as s:
                await s.send(text, algorithm="brotli")
                reply = await asyncio.wait_for(s.recv(), 20)
                results.append(f"{label} {'ok' if reply.text == text else 'CORRUPT'}")
        except Exception as exc:
            results.append(f"{label} LOST ({str(exc)[:75]})")
    h.row.outcome = "; ".join(results)


@attack("close-after-data", "2")
async def a_close_after_data(h: Harness, scale: float) -> None:
    """5 DATA then CLOSE: how many echoes arrive before the session ends?"""
    ws = await raw.RawWebSocket.open(h.url)
    await ws.handshake("echo-close")
    for i in range(5):
        await ws.send_text(raw.data(ws.session_id, json.dumps({"i": i})))
    await ws.send_text(raw.close(ws.session_id))
    messages, end = await read_all(ws, 10)
    replies = sum(1 for e in envelopes(messages) if e.get("type") == "DATA")
    order = [e.get("type") for e in envelopes(messages)]
    saw_close_last = bool(order) and order[-1] == "CLOSE"
    h.row.outcome = f"{replies}/5 replies delivered; CLOSE last: {saw_close_last}; {end}"
    ws.abort()


# ---------------------------------------------------------------------------------------------------
# Memory (items 4-13)

_BOMBS: dict[tuple[int, bool], bytes] = {}


def avp_bomb(session_id: str, expanded: int, *, good_crc: bool = True) -> bytes:
    """An AVP hidden-state frame whose zstd payload expands to ``expanded`` zero bytes (built in
    1 MiB pieces, so the attacker never holds the expanded payload)."""
    import zstandard

    from m2mwire.schemas import avp_pb2

    key = (expanded, good_crc)
    if key not in _BOMBS:
        zeros = bytes(MB)
        cobj = zstandard.ZstdCompressor(level=19).compressobj(size=expanded)
        parts, crc = [], 0
        for _ in range(expanded // MB):
            parts.append(cobj.compress(zeros))
            crc = zlib.crc32(zeros, crc)
        parts.append(cobj.flush())
        body = b"".join(parts)
        hidden = int(IDENTITY["hidden_dim"])
        meta = avp_pb2.Metadata(
            session_id=session_id,
            source_agent_id="attacker",
            model_id=str(IDENTITY["model_id"]),
            hidden_dim=hidden,
            num_layers=int(IDENTITY["num_layers"]),
            payload_type=avp_pb2.HIDDEN_STATE,
            dtype=avp_pb2.FLOAT32,
            tensor_shape=[expanded // (4 * hidden), hidden],
            mode=avp_pb2.LATENT,
            compression="zstd",
            payload_checksum=crc if good_crc else crc ^ 1,
        ).SerializeToString()
        header = struct.pack("<2sBBII", b"AV", 1, 0x01, len(meta) + len(body), len(meta))
        _BOMBS[key] = header + meta + body
    return _BOMBS[key]


async def latent_session(h: Harness, agent_id: str) -> raw.RawWebSocket:
    ws = await raw.RawWebSocket.open(h.url)
    answer = await ws.handshake(agent_id, identity=IDENTITY)
    mode = (answer.get("payload") or {}).get("avp", {}).get("mode")
    if mode != "LATENT":
        raise RuntimeError(f"no latent session: {str(answer)[:200]}")
    return ws


def bomb_size(scale: float) -> int:
    return max(MB, min(1 << 30, int((1 << 30) * scale)) // MB * MB)


@attack("avp-zstd-bomb", "4", server_args=["--identity"])
async def a_avp_bomb(h: Harness, scale: float) -> None:
    """One small AVP frame whose zstd payload expands to 1 GiB (correct CRC), to an echo handler."""
    size = bomb_size(scale)
    ws = await latent_session(h, "echo-bomb")
    frame = avp_bomb(ws.session_id, size)
    await ws.send_binary(frame)
    messages, end = await read_all(ws, 6)
    echoed = sum(1 for op, _ in messages if op == raw.OP_BINARY)
    h.row.outcome = (
        f"{len(frame):,} B frame -> {size // MB} MiB: echoed {echoed}; {close_of(messages)}; {end}"
    )
    ws.abort()


@attack("avp-bomb-badcrc", "4", server_args=["--identity"])
async def a_avp_bomb_badcrc(h: Harness, scale: float) -> None:
    """The same bomb with a wrong CRC: is it decompressed before the check fails?"""
    size = bomb_size(scale)
    ws = await latent_session(h, "echo-badcrc")
    frame = avp_bomb(ws.session_id, size, good_crc=False)
    await ws.send_binary(frame)
    messages, end = await read_all(ws, 6)
    h.row.outcome = f"{size // MB} MiB, bad CRC: {close_of(messages)}; {end}"
    ws.abort()


@attack("avp-bomb-queued", "4", server_args=["--identity"])
async def a_avp_bomb_queued(h: Harness, scale: float) -> None:
    """Four bombs of 512 MiB queued for a handler that never reads."""
    count = max(1, round(4 * scale))
    size = 512 * MB
    ws = await latent_session(h, "sink-bombs")
    frame = avp_bomb(ws.session_id, size)
    sent = 0
    for _ in range(count):
        try:
            if not await ws.send_binary(frame, timeout=5):
                break
            sent += 1
        except TimeoutError:
            break
    messages, end = await read_all(ws, 5)
    h.row.outcome = (
        f"{sent}/{count} x {len(frame):,} B ({size // MB} MiB each) sent; {close_of(messages)}; {end}"
    )
    ws.abort()


@attack("inbox-bytes", "5")
async def a_inbox_bytes(h: Harness, scale: float) -> None:
    """64 x 8 MiB text messages to a handler that never reads: what does the inbox hold?"""
    count = max(1, round(64 * scale))
    ws = await raw.RawWebSocket.open(h.url)
    await ws.handshake("sink-inbox")
    body = raw.data(ws.session_id, random_text(8 * MB), content_type="text").encode()
    chunk = raw.frame(raw.OP_TEXT, body)
    written = await flood(ws, chunk, count, limit_s=15, stall_s=2)
    await asyncio.sleep(1)
    h.row.outcome = f"{written}/{count} x 8 MiB written before the server pushed back ({written * 8} MiB)"
    ws.abort()


@attack("never-reads", "6", server_args=["--timers", json.dumps({**SHORT_TIMERS, **NEW_TIMERS})])
async def a_never_reads(h: Harness, scale: float) -> None:
    """80 x 8 MiB to an echo handler (more than the 64-message inbox) from a peer that never reads,
    timers set to drop a silent peer in ~11 s: is it dropped, and when?"""
    count = max(1, round(80 * scale))
    ws = await raw.RawWebSocket.open(h.url, rcvbuf=64 * KiB)
    await ws.handshake("echo-noread")
    ws.stop_reading()
    body = raw.data(ws.session_id, random_text(8 * MB), content_type="text").encode()
    chunk = raw.frame(raw.OP_TEXT, body)
    written = await flood(ws, chunk, count, limit_s=15, stall_s=2)
    waited = 25.0
    assert h.server is not None
    await h.server.wait_event(
        lambda e: e["event"] == "end" and e["peer"] == "echo-noread", waited - h.elapsed()
    )
    h.row.dropped = h.dropped_after("echo-noread", h.elapsed())
    h.row.outcome = f"{written} x 8 MiB written, never read a byte"
    ws.abort()


@attack("ws-ping-flood", "7")
async def a_ping_flood(h: Harness, scale: float) -> None:
    """1.5 M PINGs (125-byte payloads) from a peer that never reads the PONGs, then 5 s idle."""
    count = max(10_000, int(1_500_000 * scale))
    batch = 10_000
    ws = await raw.RawWebSocket.open(h.url, rcvbuf=64 * KiB)
    await ws.handshake("echo-pinger")
    ws.stop_reading()
    chunk = raw.frame(raw.OP_PING, b"p" * 125) * batch
    started = time.monotonic()
    written = await flood(ws, chunk, count // batch, limit_s=15, stall_s=2) * batch
    took = time.monotonic() - started
    pushed_back = written < count and took < 15
    await asyncio.sleep(5)  # still connected, still not reading: is it dropped?
    h.row.outcome = (
        f"{written:,}/{count:,} PINGs written in {took:.1f} s; server stopped reading: {pushed_back}"
    )
    h.row.dropped = h.dropped_after("echo-pinger", h.elapsed())
    ws.abort()


async def read_echo(ws: raw.RawWebSocket, timeout: float) -> tuple[list[tuple[int, bytes]], str]:
    """Messages until the first DATA echo, the end of the connection, or ``timeout``."""
    messages: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            messages.append(await asyncio.wait_for(ws.recv_message(), left))
        except TimeoutError:
            break
        except raw.ConnectionClosedError as exc:
            return messages, f"ws close {exc.code} {exc.reason[:60]!r}"
        if any(e.get("type") == "DATA" for e in envelopes(messages[-1:])):
            return messages, "echoed"
    return messages, f"no echo within {timeout:.0f} s"


async def fragmented(
    h: Harness, agent: str, pad: int, split: Callable[[bytes], list[bytes]], label: str
) -> None:
    """Send one DATA message (content padded with ``pad`` characters) as a text message cut by
    ``split`` into fragments (a first frame, then continuation frames), then wait for the echo."""
    ws = await raw.RawWebSocket.open(h.url)
    await ws.handshake(agent)
    pieces = split(raw.data(ws.session_id, json.dumps({"pad": "z" * pad}), content_type="json").encode())
    blob = b"".join(
        [
            raw.frame(raw.OP_TEXT, pieces[0], fin=False),
            *(raw.frame(raw.OP_CONT, p, fin=False) for p in pieces[1:-1]),
            raw.frame(raw.OP_CONT, pieces[-1], fin=True),
        ]
    )
    del pieces
    started = time.monotonic()
    step = 4 * MB
    for i in range(0, len(blob), step):
        ws.write(blob[i : i + step])
        try:
            await ws.drain(20)
        except (TimeoutError, ConnectionError) as exc:
            h.row.outcome = f"{label}: write stopped ({short(exc)})"
            ws.abort()
            return
    sent_in = time.monotonic() - started
    messages, end = await read_echo(ws, 20)
    h.row.outcome = (
        f"{label} ({len(blob) / MB:.1f} MB on the wire, written in {sent_in:.1f} s): {end} "
        f"{time.monotonic() - started:.1f} s after the first byte; {close_of(messages)}"
    )
    ws.abort()


@attack("empty-fragments", "8")
async def a_empty_fragments(h: Harness, scale: float) -> None:
    """One small DATA message split by 3 M empty continuation frames."""
    count = max(1000, int(3_000_000 * scale))
    label = f"{count:,} empty fragments"
    await fragmented(h, "echo-frag-empty", 16, lambda b: [b[:10], *([b""] * count), b[10:]], label)


@attack("tiny-fragments", "8")
async def a_tiny_fragments(h: Harness, scale: float) -> None:
    """A 3 MB DATA message in 1.5 M two-byte fragments."""
    count = max(1000, int(1_500_000 * scale))
    label = f"{count:,} two-byte fragments"
    split = lambda b: [b[i : i + 2] for i in range(0, len(b), 2)]  # noqa: E731
    await fragmented(h, "echo-frag-tiny", 2 * count, split, label)


def empty_objects_json(limit_bytes: int) -> tuple[str, int]:
    """Valid JSON of many ``{}``: arrays of 10,000 (the seed's array limit), as many as fit."""
    inner = "[" + ",".join(["{}"] * 10_000) + "]"
    k = max(1, (limit_bytes - 200) // (len(inner) + 1))
    return "[" + ",".join([inner] * k) + "]", k * 10_000


@attack("json-empty-objects", "9")
async def a_json_objects(h: Harness, scale: float) -> None:
    """4 valid 16 MiB messages of 5.5 M empty objects each, to a handler that never reads."""
    count = max(1, round(4 * scale))
    ws = await raw.RawWebSocket.open(h.url)
    await ws.handshake("sink-json")
    content, objects = empty_objects_json(16 * MB - 400)
    chunk = raw.frame(raw.OP_TEXT, raw.data(ws.session_id, content).encode())
    written = await flood(ws, chunk, count, limit_s=15, stall_s=4)
    messages, end = await read_all(ws, 3)
    h.row.outcome = (
        f"{written}/{count} x {len(chunk) / MB:.1f} MB ({objects / 1e6:.1f} M objects each) written; "
        f"{close_of(messages)}; {end}"
    )
    ws.abort()


def t1_bomb(limit_bytes: int) -> str:
    """A ``#T1|`` wire of abbreviated keys (one object: 39 bytes -> 113 expanded) whose DATA envelope
    (where every quote is escaped) is about ``limit_bytes``."""
    obj = '{"f":0,"P":0,"x":0,"T":0,"rf":0,"fc":0}'
    inner = "[" + ",".join([obj] * 10_000) + "]"
    k = max(1, (limit_bytes - 400) // (len(json.dumps(inner)) - 1))
    return "#T1|[" + ",".join([inner] * k) + "]"


@attack("t1-expansion", "10")
async def a_t1(h: Harness, scale: float) -> None:
    """A T1 message just under the 16 MiB limit whose keys expand ~2.9x, far over it."""
    size = max(MB, min(16 * MB, int(16 * MB * scale)))
    ws = await raw.RawWebSocket.open(h.url)
    await ws.handshake("echo-t1")
    wire = t1_bomb(size)
    await ws.send_text(raw.data(ws.session_id, wire, algorithm="token"))
    messages, end = await read_all(ws, 10)
    echoed = any(e.get("type") == "DATA" for e in envelopes(messages))
    h.row.outcome = (
        f"{len(wire) / MB:.1f} MB T1 (expands ~2.9x): {'echoed' if echoed else 'not echoed'}; "
        f"{close_of(messages)}; {end}"
    )
    ws.abort()


@attack("closed-sessions", "11")
async def a_closed_sessions(h: Harness, scale: float) -> None:
    """3 rounds of a non-reading peer (8 MiB messages to echo) that then vanishes; RSS with 0 of them."""
    rounds = max(1, round(3 * scale))
    assert h.server is not None
    for r in range(rounds):
        ws = await raw.RawWebSocket.open(h.url, rcvbuf=64 * KiB)
        await ws.handshake(f"echo-round{r}")
        ws.stop_reading()
        chunk = raw.frame(
            raw.OP_TEXT, raw.data(ws.session_id, random_text(8 * MB), content_type="text").encode()
        )
        await flood(ws, chunk, 40, limit_s=8, stall_s=1)
        ws.abort()
        await h.server.wait_event(lambda e, r=r: e["event"] == "end" and e["peer"] == f"echo-round{r}", 5)
    await h.stop_good()  # the good sessions' own state must not count in what follows
    await asyncio.sleep(1)
    stats = await h.server.command("stats", "stats")
    before_gc = h.rss_now_mb()
    collected = await h.server.command("gc", "stats")
    after_gc = h.rss_now_mb()
    active = stats.get("active") if stats else "?"
    h.row.rss_end_mb = before_gc
    h.row.outcome = (
        f"{rounds} rounds; then {active} live sessions, RSS +{before_gc or 0:.0f} MB; "
        f"after gc.collect() +{after_gc or 0:.0f} MB ({'ok' if collected else 'no answer'})"
    )
    h.row.dropped = "peer aborted itself"


@attack("huge-hello", "12")
async def a_huge_hello(h: Harness, scale: float) -> None:
    """A HELLO listing 1 M unknown algorithm names (~12 MB): stall, and the size of the answer."""
    count = max(1000, min(1_300_000, int(1_000_000 * scale)))
    ws = await raw.RawWebSocket.open(h.url)
    names = [f"zz{i:07d}" for i in range(count)]
    text = raw.hello(
        "echo-hugehello",
        compression={"algorithms": names, "max_payload": 0, "encodings": ["Cl100kBase"]},
    )
    started = time.monotonic()
    await ws.send_text(text)
    messages, end = await read_all(ws, 15)
    took = time.monotonic() - started
    answer = envelopes(messages)
    kind = answer[0].get("type") if answer else "nothing"
    size = sum(len(m) for _, m in messages)
    h.row.outcome = f"HELLO {len(text) / MB:.1f} MB: answered {kind} of {size:,} B after {took:.1f} s; {end}"
    ws.abort()


@attack("unknown-types", "12")
async def a_unknown_types(h: Harness, scale: float) -> None:
    """200 k messages of an unknown type: log growth (see the log column), session still echoing?"""
    count = max(1000, int(200_000 * scale))
    batch = 10_000
    ws = await raw.RawWebSocket.open(h.url)
    await ws.handshake("echo-unknown")
    one = json.dumps({"type": "STRESS", "session_id": ws.session_id, "payload": {}, "timestamp": 0}).encode()
    chunk = raw.frame(raw.OP_TEXT, one) * batch
    written = await flood(ws, chunk, count // batch, limit_s=15, stall_s=5) * batch
    await ws.send_text(raw.data(ws.session_id, json.dumps({"still": "here"})))
    messages, end = await read_echo(ws, 15)
    echoed = any(e.get("type") == "DATA" for e in envelopes(messages))
    h.row.outcome = (
        f"{written:,} unknown-type messages; then a DATA: {end if echoed else 'NOT echoed, ' + end}"
    )
    ws.abort()


def fake_initial() -> bytes:
    """A 1,230-byte QUIC v1 Initial with random connection ids and no valid protection."""
    dcid, scid = os.urandom(8), os.urandom(8)
    head = bytes([0xC3]) + struct.pack("!I", 1) + bytes([8]) + dcid + bytes([8]) + scid + b"\x00"
    rest = 1230 - len(head) - 2
    return head + struct.pack("!H", 0x4000 | rest) + os.urandom(rest)


@attack("quic-initial-flood", "13", transport="quic")
async def a_quic_flood(h: Harness, scale: float) -> None:
    """10,000 fake Initial packets (random DCIDs, no valid crypto) as fast as UDP goes."""
    count = max(100, int(10_000 * scale))
    assert h.server is not None
    port = int(h.url.rsplit(":", 1)[1])
    packets = [fake_initial() for _ in range(count)]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setblocking(False)
    started = time.monotonic()
    sent = 0
    for i, packet in enumerate(packets):
        try:
            sock.sendto(packet, ("127.0.0.1", port))
            sent += 1
        except BlockingIOError:
            await asyncio.sleep(0.001)
        if i % 200 == 0:
            await asyncio.sleep(0)  # the kernel drops what the server cannot take, as on a real link
    took = time.monotonic() - started
    sock.close()
    await asyncio.sleep(5)
    await h.stop_good()
    after = await h.server.command("count aioquic.quic.connection:QuicConnection", "count", 60)
    held = after["n"] if after else "?"
    h.row.outcome = f"{sent:,} packets in {took:.1f} s; QuicConnection objects 5 s later: {held}"


@attack("quic-no-stream", "13", transport="quic", server_args=["--idle-timeout", "5"])
async def a_quic_no_stream(h: Harness, scale: float) -> None:
    """A QUIC connection that completes its handshake, PINGs, and never opens a stream (idle 5 s)."""
    from aioquic.asyncio.client import connect
    from aioquic.quic.configuration import QuicConfiguration

    port = int(h.url.rsplit(":", 1)[1])
    config = QuicConfiguration(is_client=True, alpn_protocols=["m2mwire/1"], idle_timeout=60.0)
    config.verify_mode = ssl.CERT_NONE
    waited = 20.0
    outcome = f"alive at {waited:.0f} s"
    async with connect("127.0.0.1", port, configuration=config, wait_connected=True) as protocol:
        started = time.monotonic()
        while time.monotonic() - started < waited:
            try:
                await asyncio.wait_for(protocol.ping(), 3)
            except Exception:
                outcome = f"closed by the server after {time.monotonic() - started:.1f} s"
                break
            await asyncio.sleep(1)
    h.row.dropped = outcome
    h.row.outcome = "handshake done, PING every 1 s, no stream"


@attack("quic-257-sessions", "14", transport="quic")
async def a_quic_257(h: Harness, scale: float) -> None:
    """257 sessions on one shared QUIC connection: the 257th, and do the first 256 still echo?"""
    assert h.server is not None
    conn = await m2mwire.open_quic_connection(h.url, fingerprint=h.server.fingerprint)
    sessions: list[m2mwire.Session] = []
    last = "not tried"
    try:
        for i in range(257):
            try:
                opening = m2mwire.connect(h.url, connection=conn, agent_id=f"echo-q{i}", algorithms=["none"])
                sessions.append(await asyncio.wait_for(opening, 10))
                last = "opened"
            except Exception as exc:
                last = short(exc)[:60]
                break

        async def echo(s: m2mwire.Session, i: int) -> bool:
            try:
                await s.send({"i": i})
                return bool((await asyncio.wait_for(s.recv(), 10)).json() == {"i": i})
            except Exception:
                return False

        ok = await asyncio.gather(*(echo(s, i) for i, s in enumerate(sessions[:256])))
        tried = min(256, len(sessions))
        h.row.outcome = f"{len(sessions)} opened; 257th: {last}; then {sum(ok)}/{tried} echo"
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), 5)


async def aclose_time(h: Harness) -> None:
    assert h.server is not None
    options = {"fingerprint": h.server.fingerprint} if h.server.fingerprint else {}
    async with m2mwire.connect(h.url, agent_id="ignore-1", **options) as session:
        await asyncio.sleep(0.5)
        await h.stop_good()  # aclose() ends them too; their figures are taken before
        closing = asyncio.create_task(h.server.command("aclose 20", "aclosed", 25))
        # Keep reading, as a live client does, so the CLOSE handshake can complete.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(session.recv(), 22)
        result = await closing
    if result is None:
        h.row.outcome = "Server.aclose(): no answer"
    elif result["timed_out"]:
        h.row.outcome = f"Server.aclose() still running after {result['seconds']:.0f} s (gave up)"
    else:
        h.row.outcome = f"Server.aclose() took {result['seconds']:.2f} s"
    h.row.dropped = "-"


@attack("aclose-ws", "15")
async def a_aclose_ws(h: Harness, scale: float) -> None:
    """Server.aclose() with one session whose handler ignores it (WebSocket)."""
    await aclose_time(h)


@attack("aclose-quic", "15", transport="quic")
async def a_aclose_quic(h: Harness, scale: float) -> None:
    """Server.aclose() with one session whose handler ignores it (QUIC)."""
    await aclose_time(h)


# ---------------------------------------------------------------------------------------------------
# Robustness (items 16-19)


@attack("deep-hello", "16")
async def a_deep_hello(h: Harness, scale: float) -> None:
    """A HELLO nested 1,000 levels deep; and send() of a circular dict."""
    assert h.server is not None
    ws = await raw.RawWebSocket.open(h.url)
    nested = '{"a":' * 1000 + "1" + "}" * 1000
    text = raw.hello("echo-deep").replace('"extensions": {}', '"extensions": ' + nested)
    await ws.send_text(text)
    messages, end = await read_all(ws, 5)
    answer = envelopes(messages)
    kind = answer[0].get("type") if answer else "no answer"
    log = h.server.log_tail(h.log_base)
    circular: dict[str, Any] = {}
    circular["self"] = circular
    try:
        async with m2mwire.connect(h.url, agent_id="echo-circular") as s:
            await s.send(circular)
            sent = "returned"
    except Exception as exc:
        sent = f"raised {type(exc).__name__} (M2MError: {isinstance(exc, m2mwire.M2MError)})"
    h.row.outcome = (
        f"HELLO x1000: {kind}; {end}; RecursionError in log: {'RecursionError' in log}; send(circular) {sent}"
    )
    ws.abort()


@attack("handler-raises", "17")
async def a_handler_raises(h: Harness, scale: float) -> None:
    """The handler raises on the first message: what close does the client see?"""
    ws = await raw.RawWebSocket.open(h.url)
    await ws.handshake("raise-1")
    started = time.monotonic()
    await ws.send_text(raw.data(ws.session_id, json.dumps({"boom": 1})))
    messages, end = await read_all(ws, 10, ack_close=True)
    h.row.outcome = f"{close_of(messages)}; {end} after {time.monotonic() - started:.1f} s"
    ws.abort()


@attack("peer-vanishes", "17")
async def a_peer_vanishes(h: Harness, scale: float) -> None:
    """Peers that vanish (TCP reset) while idle, and while the server is writing an echo to them:
    does the server log a handler ERROR?"""
    assert h.server is not None
    big = random_text(4 * MB)
    for i in range(4):
        ws = await raw.RawWebSocket.open(h.url, rcvbuf=64 * KiB)
        await ws.handshake(f"echo-vanish{i}")
        if i % 2 == 0:  # idle: the handler waits in recv()
            await ws.send_text(raw.data(ws.session_id, json.dumps({"i": i})))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(ws.recv_message(), 5)
        else:  # the handler is blocked writing echoes nobody reads
            ws.stop_reading()
            for _ in range(3):
                await ws.send_text(raw.data(ws.session_id, big, content_type="text"))
            await asyncio.sleep(0.5)
        ws.writer.transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )
        ws.abort()
    await asyncio.sleep(1.5)
    log = h.server.log_tail(h.log_base)
    errors = sum(1 for line in log.splitlines() if line.startswith("ERROR"))
    h.row.outcome = f"4 peers reset: {errors} ERROR lines, Traceback in log: {'Traceback' in log}"


@attack("peer-vanishes-quic", "17", transport="quic")
async def a_peer_vanishes_quic(h: Harness, scale: float) -> None:
    """QUIC peers whose connection goes away under an open session (idle, and mid-echo): ERROR logged?"""
    assert h.server is not None
    big = random_text(4 * MB)
    for i in range(4):
        conn = await m2mwire.open_quic_connection(h.url, fingerprint=h.server.fingerprint)
        session = await m2mwire.connect(
            h.url, connection=conn, agent_id=f"echo-qvanish{i}", algorithms=["none"]
        )
        if i % 2 == 0:
            await session.send({"i": i})
            with contextlib.suppress(Exception):
                await asyncio.wait_for(session.recv(), 5)
        else:
            for _ in range(3):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(session.send(big), 5)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), 5)  # the connection goes; the session never said CLOSE
    await asyncio.sleep(1.5)
    log = h.server.log_tail(h.log_base)
    errors = sum(1 for line in log.splitlines() if line.startswith("ERROR"))
    h.row.outcome = (
        f"4 connections closed under their session: {errors} ERROR lines, Traceback: {'Traceback' in log}"
    )


@attack("sender-limits", "18")
async def a_sender_limits(h: Harness, scale: float) -> None:
    """send() of JSON nested 40 deep / an array of 10,001: refused locally, or lost at the peer?"""
    nested: Any = 1
    for _ in range(40):
        nested = {"a": nested}
    results = []
    for label, content in (("nested 40", nested), ("array 10,001", list(range(10_001)))):
        try:
            async with m2mwire.connect(h.url, agent_id="echo-limits") as s:
                try:
                    await s.send(content)
                except Exception as exc:
                    results.append(f"{label}: refused ({type(exc).__name__})")
                    continue
                try:
                    await s.send({"next": 1})
                    reply = await asyncio.wait_for(s.recv(), 5)
                    results.append(f"{label}: sent, echo {'ok' if reply.json() == content else 'differs'}")
                except Exception as exc:
                    results.append(f"{label}: sent, then {type(exc).__name__}")
        except Exception as exc:
            results.append(f"{label}: {short(exc)[:50]}")
    h.row.outcome = "; ".join(results)


@attack("wss-pin-impostor", "19", transport="-", good=0)
async def a_wss_pin(h: Harness, scale: float) -> None:
    """wss:// with a pinned fingerprint against an impostor TLS server: what does the impostor read?"""
    from m2mwire.transport import tls

    impostor = tls.generate_self_signed()
    pinned = tls.generate_self_signed().fingerprint  # the real server's, which the impostor lacks
    certfile, keyfile = impostor.write_temp_files()
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certfile, keyfile)
    received = bytearray()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while chunk := await asyncio.wait_for(reader.read(65536), 3):
                received.extend(chunk)
        writer.close()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        async with m2mwire.connect(f"wss://127.0.0.1:{port}/agents/42?token=SECRET", fingerprint=pinned):
            client = "connected (!)"
    except Exception as exc:
        client = f"refused: {type(exc).__name__}"
    await asyncio.sleep(0.5)
    server.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(server.wait_closed(), 3)
    for path in (certfile, keyfile):
        with contextlib.suppress(OSError):
            os.unlink(path)
    leaked = "token=SECRET" in received.decode("latin-1")
    h.row.outcome = f"client {client}; impostor received {len(received)} B (token leaked: {leaked})"


# ---------------------------------------------------------------------------------------------------
# Running and reporting

ATTACK_LIMIT_S = 60.0  # a bound on any one attack, whatever the code under test does


async def run_attack(a: Attack, scale: float, keep_logs: Path | None) -> Row:
    row = Row(a.name, a.item, a.transport)
    h = Harness(row)
    started = time.monotonic()
    try:
        if a.transport != "-":
            await h.setup(a.transport, a.server_args, a.good)
        else:
            h.attack_started = time.monotonic()
        await asyncio.wait_for(a.run(h, scale), ATTACK_LIMIT_S)
    except TimeoutError:
        row.error = f"attack still running after {ATTACK_LIMIT_S:.0f} s (cut off)"
    except Exception as exc:
        row.error = short(exc)
    finally:
        try:
            await asyncio.wait_for(h.finish(), 30)
        except Exception as exc:
            row.error = (row.error + "; " if row.error else "") + f"finish: {short(exc)}"
        await h.close(keep_logs)
    row.seconds = time.monotonic() - started
    return row


def fmt(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[Row]) -> str:
    head = ["attack", "#", "tr", "peakMB", "endMB", "stall_ms", "good lost", "log_kB", "dropped", "s"]
    head.append("outcome")
    lines = []
    for r in rows:
        lost = "-" if r.good_lost is None else f"{r.good_lost}/{r.good_sent}"
        if r.good_error:
            lost += " !"
        outcome = r.outcome + (f" [ERROR: {r.error}]" if r.error else "")
        lines.append(
            [
                r.name,
                r.item,
                r.transport,
                fmt(r.rss_peak_mb),
                fmt(r.rss_end_mb),
                fmt(r.stall_ms),
                lost,
                fmt(r.log_kb),
                r.dropped,
                fmt(r.seconds),
                outcome,
            ]
        )
    widths = [max(len(head[i]), *(len(line[i]) for line in lines)) for i in range(len(head) - 1)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=False)) + "  " + head[-1]]
    for line in lines:
        out.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=False)) + "  " + line[-1])
    notes = [f"  {r.name}: good-session errors: {r.good_error}" for r in rows if r.good_error]
    return "\n".join(out + (["", "good sessions that ended early:", *notes] if notes else []))


async def main_async(args: argparse.Namespace) -> list[Row]:
    chosen = ATTACKS
    if args.only:
        names = {n.strip() for n in args.only.split(",") if n.strip()}
        unknown = names - {a.name for a in ATTACKS}
        if unknown:
            print(f"unknown attack(s): {', '.join(sorted(unknown))}; see --list", file=sys.stderr)
        chosen = [a for a in ATTACKS if a.name in names]
    rows = []
    for a in chosen:
        print(f"-- {a.name} (item {a.item}): {a.doc}", file=sys.stderr, flush=True)
        row = await run_attack(a, args.scale, Path(args.keep_logs) if args.keep_logs else None)
        lost = f"{row.good_lost}/{row.good_sent}" if row.good_lost is not None else "-"
        print(
            f"   peak +{fmt(row.rss_peak_mb)} MB, stall {fmt(row.stall_ms)} ms, lost {lost}, "
            f"dropped {row.dropped}, {row.seconds:.0f} s: {row.outcome} {row.error}",
            file=sys.stderr,
            flush=True,
        )
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", help="comma-separated attack names (see --list)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply attack sizes/counts (default 1)")
    parser.add_argument("--json", metavar="OUT", help="also write the rows as JSON to OUT")
    parser.add_argument("--keep-logs", metavar="DIR", help="keep each attack's server log as DIR/NAME.log")
    parser.add_argument("--list", action="store_true", help="list the attacks and exit")
    args = parser.parse_args()
    if args.list:
        for a in ATTACKS:
            print(f"{a.name:20} item {a.item:3} {a.transport:5} {a.doc}")
        return 0
    started = time.monotonic()
    rows = asyncio.run(main_async(args))
    print(table(rows))
    print(
        f"\n{len(rows)} attacks in {time.monotonic() - started:.0f} s, scale {args.scale:g}, m2mwire from "
        f"{Path(m2mwire.__file__).resolve().parent}"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"scale": args.scale, "rows": [asdict(r) for r in rows]}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
