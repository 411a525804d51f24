"""Session over WebSocket vs a raw websockets echo, in one run (server in its own process).

Prints round-trip p50/p99 for 100 B and 1 KB DATA (algorithm none), one-way throughput of 64 KiB
binary frames (AVP frames on a latent session vs raw binary messages), and messages per second for
1 KB chat payloads with TokenNative next to what tokenization alone allows.

Goals (issue 4): p50 within 1.2x of raw, throughput at least 0.8x of raw.

The machine is a shared VM whose speed drifts within seconds, so raw and session are measured
side by side: round trips alternate in batches of 50 on two open connections, and throughput
trials alternate raw/session in ABBA order, the ratio taken per pair (4 pairs of 1500 frames
a round; raw vs raw + avp.decode and raw vs raw with the session's 1 MiB reads are measured after
them, each in its own pairs).

    .venv/bin/python benchmarks/bench_session_ws.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.server import serve as ws_serve

BIG = 64 * 1024 * 1024
IDENTITY: dict[str, Any] = {
    "model_family": "bench",
    "model_id": "bench",
    "model_hash": "0" * 64,
    "hidden_dim": 16384,
    "num_layers": 1,
}


# -- servers (run in a child process) ---------------------------------------------------------------


async def _raw_server(port_q: Any, decode_avp: bool = False) -> None:
    """A websockets echo; ``decode_avp`` also runs m2mwire.avp.decode on every binary message: the
    AVP codec's cost on websockets' own receive path, with none of the session's. (The session
    reads through its ChunkReader, which copies less than websockets' reader, so it can beat this.)"""
    from m2mwire.avp import decode

    async def handler(ws: Any) -> None:
        count = 0
        async for msg in ws:
            if isinstance(msg, str) and msg.startswith("#done"):
                await ws.send(str(count))
                count = 0
            elif isinstance(msg, bytes):
                if decode_avp:
                    decode(msg)
                count += len(msg)
            else:
                await ws.send(msg)

    async with ws_serve(handler, "127.0.0.1", 0, compression=None, max_size=BIG, ping_interval=None) as srv:
        port_q.put(srv.sockets[0].getsockname()[1])
        await asyncio.Future()


async def _session_server(port_q: Any) -> None:
    from m2mwire.api import Session, serve
    from m2mwire.schemas.identity import ModelIdentity

    async def handler(session: Session) -> None:
        count = 0
        async for message in session:
            if message.kind == "avp":
                count += message.wire_bytes
            elif message.text == "#done":
                await session.send(str(count), algorithm="none")
                count = 0
            elif message.algorithm == "tokennative":
                count += 1
            else:
                await session.send(message.text or "", algorithm="none")

    from m2mwire.codecs import Encoding, get_tokenizer

    get_tokenizer(Encoding.CL100K)  # load before timing: a real server is warm
    ident = ModelIdentity(**IDENTITY)
    async with serve(handler, "ws://127.0.0.1:0", identity=ident, max_payload=BIG) as server:
        port_q.put(server.port)
        await asyncio.Future()


def _serve(kind: str, port_q: Any) -> None:
    if kind == "session":
        asyncio.run(_session_server(port_q))
    elif kind == "raw-bulk":
        # websockets with the session's read size (1 MiB once reads fill up; here from the start):
        # how much of the session's throughput is that transport setting rather than less work.
        from asyncio import selector_events

        selector_events._SelectorSocketTransport.max_size = 1024 * 1024  # type: ignore[attr-defined]
        asyncio.run(_raw_server(port_q))
    else:
        asyncio.run(_raw_server(port_q, decode_avp=kind == "raw+avp"))


# -- client side ---------------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def _rtt_pair(
    raw_port: int, ses_port: int, size: int, n: int, batch: int = 50
) -> tuple[list[float], list[float]]:
    """Round trips on a raw connection and on a session, alternating in batches of ``batch``, so
    machine noise (a shared VM) falls on both alike."""
    from m2mwire.api import connect

    payload = "x" * size
    raw_url = f"ws://127.0.0.1:{raw_port}"
    async with (
        ws_connect(raw_url, compression=None, max_size=BIG, ping_interval=None) as ws,
        connect(f"ws://127.0.0.1:{ses_port}", algorithms=["none"]) as session,
    ):
        raw: list[float] = []
        ses: list[float] = []
        for i in range(n // batch + 2):  # the first two batches warm up
            for _ in range(batch):
                t = time.perf_counter()
                await ws.send(payload)
                await ws.recv()
                if i >= 2:
                    raw.append(time.perf_counter() - t)
            for _ in range(batch):
                t = time.perf_counter()
                await session.send(payload, algorithm="none")
                await session.recv()
                if i >= 2:
                    ses.append(time.perf_counter() - t)
        return raw, ses


async def _tput_raw(ws: Any, frame: bytes, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        await ws.send(frame)
    await ws.send("#done")
    got = int(await ws.recv())
    elapsed = time.perf_counter() - t
    assert got == n * len(frame), (got, n * len(frame))
    return got / elapsed


async def _tput_session(session: Any, frame: bytes, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        await session.send(frame)
    await session.send("#done", algorithm="none")
    got = int((await session.recv()).text or "0")
    elapsed = time.perf_counter() - t
    assert got == n * len(frame), (got, n * len(frame))
    return got / elapsed


async def _abba(
    a: Callable[[], Awaitable[float]], b: Callable[[], Awaitable[float]], trials: int
) -> list[tuple[float, float]]:
    """``trials`` pairs of (a, b), alternating which runs first so neither always follows a pause."""
    pairs = []
    for i in range(trials):
        if i % 2:
            y = await b()
            x = await a()
        else:
            x = await a()
            y = await b()
        pairs.append((x, y))
    return pairs


async def _tput_pairs(
    raw_port: int,
    ses_port: int,
    rawavp_port: int,
    bulk_port: int,
    frame_raw: bytes,
    frame_avp: bytes,
    n: int,
    trials: int,
) -> tuple[list[tuple[float, float]], list[tuple[float, float]], list[tuple[float, float]]]:
    """One-way throughput in trials of ``n`` frames: (raw, session) pairs, then (raw, raw +
    avp.decode) and (raw, raw with 1 MiB reads) pairs. Each comparison alternates on its own: a
    third kind of trial in between perturbed the pair (the raw+avp server page-faults ~12 times
    per 64 KiB frame)."""
    from m2mwire.api import connect
    from m2mwire.schemas.identity import ModelIdentity

    async with (
        ws_connect(f"ws://127.0.0.1:{raw_port}", compression=None, max_size=BIG, ping_interval=None) as ws,
        ws_connect(
            f"ws://127.0.0.1:{rawavp_port}", compression=None, max_size=BIG, ping_interval=None
        ) as wsa,
        ws_connect(f"ws://127.0.0.1:{bulk_port}", compression=None, max_size=BIG, ping_interval=None) as wsb,
        connect(
            f"ws://127.0.0.1:{ses_port}",
            identity=ModelIdentity(**IDENTITY),
            max_payload=BIG,
            algorithms=["none"],
        ) as session,
    ):
        assert session.info.mode == "LATENT"
        await _tput_raw(ws, frame_raw, n // 4)  # warm-up
        await _tput_session(session, frame_avp, n // 4)
        raw_session = await _abba(
            lambda: _tput_raw(ws, frame_raw, n), lambda: _tput_session(session, frame_avp, n), trials
        )
        raw_rawavp = await _abba(
            lambda: _tput_raw(ws, frame_raw, n), lambda: _tput_raw(wsa, frame_avp, n), trials // 2
        )
        raw_bulk = await _abba(
            lambda: _tput_raw(ws, frame_raw, n), lambda: _tput_raw(wsb, frame_raw, n), trials // 2
        )
        return raw_session, raw_rawavp, raw_bulk


async def _chat_session(port: int, payloads: list[str], n: int) -> float:
    from m2mwire.api import connect

    async with connect(f"ws://127.0.0.1:{port}", algorithms=["tokennative", "none"]) as session:
        for payload in payloads:  # warm-up (tokenizer load, caches); the server counts these too
            await session.send(payload, algorithm="tokennative")
        await session.send("#done", algorithm="none")
        await session.recv()
        t = time.perf_counter()
        for i in range(n):
            await session.send(payloads[i % len(payloads)], algorithm="tokennative")
        await session.send("#done", algorithm="none")
        got = int((await session.recv()).text or "0")
        assert got == n
        return n / (time.perf_counter() - t)


def _tokenize_only(payloads: list[str], n: int) -> tuple[float, float]:
    """Messages/s of tiktoken encode alone and of encode+decode (the codec's floor on one core)."""
    from m2mwire.codecs import Encoding, get_tokenizer

    enc = get_tokenizer(Encoding.CL100K)
    t = time.perf_counter()
    ids = [enc.encode(payloads[i % len(payloads)], allowed_special="all") for i in range(n)]
    t_enc = time.perf_counter() - t
    t = time.perf_counter()
    for toks in ids:
        enc.decode_bytes(toks)
    t_dec = time.perf_counter() - t
    return n / t_enc, n / (t_enc + t_dec)


def _start(kind: str) -> tuple[mp.Process, int]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_serve, args=(kind, q), daemon=True)
    proc.start()
    return proc, int(q.get(timeout=60))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rtt", type=int, default=1000)
    args = parser.parse_args()

    from m2mwire import avp
    from m2mwire.samples import sample_payloads

    raw_proc, raw_port = _start("raw")
    ses_proc, ses_port = _start("session")
    rawavp_proc, rawavp_port = _start("raw+avp")
    bulk_proc, bulk_port = _start("raw-bulk")
    frame_raw = np.random.default_rng(1).bytes(64 * 1024)
    frame_avp = avp.encode(np.frombuffer(frame_raw[: 64 * 1024 - 256], dtype=np.float32).copy())
    chat = [p for _, p in sample_payloads() if p.startswith("{") and 700 <= len(p.encode()) <= 1400] or [
        json.dumps({"messages": [{"role": "user", "content": "x" * 1000}]})
    ]
    results: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)

    async def round_() -> None:
        for size in (100, 1024):
            raw, ses = await _rtt_pair(raw_port, ses_port, size, args.rtt)
            for q, name in ((0.5, "p50"), (0.99, "p99")):
                add(f"rtt{size}_raw_{name}", _pct(raw, q))
                add(f"rtt{size}_ses_{name}", _pct(ses, q))
        pairs, avp_pairs, bulk_pairs = await _tput_pairs(
            raw_port, ses_port, rawavp_port, bulk_port, frame_raw, frame_avp, 1500, 4
        )
        for r, s_ in pairs:
            add("tput_raw", r)
            add("tput_ses", s_)
            add("tput_ratio", s_ / r)
        for r, a in avp_pairs:
            add("tput_rawavp", a)
            add("tput_rawavp_ratio", a / r)
        for r, b in bulk_pairs:
            add("tput_bulk", b)
            add("tput_bulk_ratio", b / r)
        add("chat_ses", await _chat_session(ses_port, chat, 3000))

    try:
        for _ in range(args.rounds):
            asyncio.run(round_())
    finally:
        for proc in (raw_proc, ses_proc, rawavp_proc, bulk_proc):
            proc.kill()
    tok_enc, tok_encdec = _tokenize_only(chat, 3000)

    med = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"Session over WebSocket vs raw websockets ({args.rounds} rounds; RTT: raw and session in "
        "alternating batches of 50, percentiles per round, medians over rounds; throughput: median of "
        "paired alternating trials; servers in child processes)"
    )
    print(f"{'case':34} {'raw':>12} {'session':>12} {'ratio':>8}  goal")
    for size in (100, 1024):
        for q in ("p50", "p99"):
            r, s = med[f"rtt{size}_raw_{q}"] * 1e6, med[f"rtt{size}_ses_{q}"] * 1e6
            goal = "<= 1.2x" if q == "p50" else ""
            verdict = ("PASS" if s / r <= 1.2 else "MISS") if goal else ""
            print(f"{f'RTT {size} B {q} (us)':34} {r:12.0f} {s:12.0f} {s / r:7.2f}x  {goal} {verdict}")
    r, s, ratio = med["tput_raw"] / 1e6, med["tput_ses"] / 1e6, med["tput_ratio"]
    verdict = "PASS" if ratio >= 0.8 else "MISS"
    print(f"{'64 KiB binary one-way (MB/s)':34} {r:12.0f} {s:12.0f} {ratio:7.2f}x  >= 0.8x {verdict}")
    a, a_ratio = med["tput_rawavp"] / 1e6, med["tput_rawavp_ratio"]
    print(f"{'  raw websockets + avp.decode':34} {'':12} {a:12.0f} {a_ratio:7.2f}x  (websockets' reader)")
    b, b_ratio = med["tput_bulk"] / 1e6, med["tput_bulk_ratio"]
    print(
        f"{'  raw websockets, 1 MiB reads':34} {'':12} {b:12.0f} {b_ratio:7.2f}x  (the session's read size)"
    )
    c = med["chat_ses"]
    print(f"{'1 KB chat, TokenNative (msg/s)':34} {'':12} {c:12.0f}")
    print(
        f"{'  tiktoken encode alone (msg/s)':34} {tok_enc:12.0f} {'':12} {c / tok_enc:7.2f}x "
        "of the encode-only bound"
    )
    print(f"{'  tiktoken encode+decode (msg/s)':34} {tok_encdec:12.0f}")


if __name__ == "__main__":
    main()
