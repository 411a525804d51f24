"""Session over WebSocket vs a raw websockets echo, in one run (server in its own process).

Prints the goals of issue 13 first: round-trip p50 for 100 B text (algorithm none; <= 1.15x raw),
one-way 1 KB text in messages/s and one-way 64 KiB text in MB/s (>= 0.9x raw each), with the
server's CPU time per message on both sides. Then the extras: p99 and 1 KB round trips, one-way
throughput of 64 KiB binary frames (AVP frames on a latent session vs raw binary messages), and
messages per second for 1 KB chat payloads with TokenNative next to what tokenization alone allows.

The one-way text messages are ASCII JSON (quotes and all, as agents send), the same string on
both sides; the session sends it with ``algorithm="none"``, so the difference is the session's
envelope, accounting and transport path.

The machine is a shared VM whose speed drifts within seconds, so raw and session are measured
side by side: round trips alternate in batches of 50 on two open connections, and throughput
trials alternate raw/session in ABBA order, the ratio taken per pair (4 pairs of 1500 frames
a round; raw vs raw + avp.decode and raw vs raw with the session's 1 MiB reads are measured after
them, each in its own pairs). Each one-way text pair runs on two fresh connections (see
``_text_pairs``).

    .venv/bin/python benchmarks/bench_session_ws.py [--rounds 3] [--goals-only]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
from _cpus import pin_client_and_servers, unpin
from _loop import use_loop_from_env
from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.server import serve as ws_serve

LOOP = use_loop_from_env()  # M2M_BENCH_LOOP=uvloop: also in the spawned servers (they import us)

BIG = 64 * 1024 * 1024
T = TypeVar("T")
ONE_WAY = '{"~'  # one-way text messages start with this: counted by the servers, not echoed
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
                await ws.send(f"{count} {time.process_time()}")
                count = 0
            elif isinstance(msg, str) and msg.startswith(ONE_WAY):
                count += len(msg)
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
            text = message.text
            if message.kind == "avp":
                count += message.wire_bytes
            elif text is not None and text.startswith(ONE_WAY):
                count += len(text)
            elif text == "#done":
                await session.send(f"{count} {time.process_time()}", algorithm="none")
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
    got = int((await ws.recv()).split()[0])
    elapsed = time.perf_counter() - t
    assert got == n * len(frame), (got, n * len(frame))
    return got / elapsed


async def _tput_session(session: Any, frame: bytes, n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        await session.send(frame)
    await session.send("#done", algorithm="none")
    got = int(((await session.recv()).text or "0").split()[0])
    elapsed = time.perf_counter() - t
    assert got == n * len(frame), (got, n * len(frame))
    return got / elapsed


def _one_way_payload(size: int) -> str:
    """ASCII JSON text of exactly ``size`` bytes, starting with ONE_WAY."""
    head, tail = ONE_WAY + '":"', '"}'
    words = "the planner asks worker 17 to summarise chunk 4 of the report; "
    filler = (words * (size // len(words) + 1))[: size - len(head) - len(tail)]
    return head + filler + tail


async def _one_way_text(
    send: Callable[[str], Awaitable[None]], recv: Callable[[], Awaitable[str]], payload: str, n: int
) -> tuple[float, float]:
    """``n`` one-way text messages: (messages/s, server CPU seconds per message). The server's
    CPU clock is read by the "#done" before and after the timed run (the first is not timed)."""
    await send("#done")
    cpu0 = float((await recv()).split()[1])
    t = time.perf_counter()
    for _ in range(n):
        await send(payload)
    await send("#done")
    got, cpu1 = (await recv()).split()
    elapsed = time.perf_counter() - t
    assert int(got) == n * len(payload), (got, n * len(payload))
    return n / elapsed, (float(cpu1) - cpu0) / n


async def _text_pairs(
    raw_port: int, ses_port: int, size: int, n: int, trials: int
) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    """One-way text of ``size`` bytes, raw vs session in ABBA pairs of ``n`` messages each, each
    pair on two fresh connections: how fast the kernel moves one TCP connection's bytes on this VM
    differs from connection to connection (a 64 KiB message's system time 5-30 us, whatever sends
    it), so a pair of connections kept for all trials made one side look faster for the round."""
    from m2mwire.api import connect

    payload = _one_way_payload(size)
    raw_url, ses_url = f"ws://127.0.0.1:{raw_port}", f"ws://127.0.0.1:{ses_port}"
    pairs = []
    for i in range(trials):
        async with (
            ws_connect(raw_url, compression=None, max_size=BIG, ping_interval=None) as ws,
            connect(ses_url, max_payload=BIG, algorithms=["none"]) as session,
        ):

            async def raw_recv() -> str:
                return str(await ws.recv())

            async def ses_send(text: str) -> None:
                await session.send(text, algorithm="none")

            async def ses_recv() -> str:
                return (await session.recv()).text or ""

            await _one_way_text(ws.send, raw_recv, payload, n)  # warm-up
            await _one_way_text(ses_send, ses_recv, payload, n)
            if i % 2:  # ABBA: neither side always runs first
                ses_result = await _one_way_text(ses_send, ses_recv, payload, n)
                raw_result = await _one_way_text(ws.send, raw_recv, payload, n)
            else:
                raw_result = await _one_way_text(ws.send, raw_recv, payload, n)
                ses_result = await _one_way_text(ses_send, ses_recv, payload, n)
            pairs.append((raw_result, ses_result))
    return pairs


async def _abba(
    a: Callable[[], Awaitable[T]], b: Callable[[], Awaitable[T]], trials: int
) -> list[tuple[T, T]]:
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
        got = int(((await session.recv()).text or "0").split()[0])
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
    parser.add_argument("--goals-only", action="store_true", help="only issue 13's three goal rows")
    parser.add_argument(
        "--no-pin", action="store_true", help="leave the client and servers unpinned (benchmarks/_cpus.py)"
    )
    args = parser.parse_args()

    from m2mwire import avp
    from m2mwire.samples import sample_payloads

    procs: list[mp.Process] = []

    def start(kind: str) -> int:
        proc, port = _start(kind)
        procs.append(proc)
        return port

    raw_port, ses_port = start("raw"), start("session")
    if not args.goals_only:
        rawavp_port, bulk_port = start("raw+avp"), start("raw-bulk")
    frame_raw = np.random.default_rng(1).bytes(64 * 1024)
    frame_avp = avp.encode(np.frombuffer(frame_raw[: 64 * 1024 - 256], dtype=np.float32).copy())
    chat = [p for _, p in sample_payloads() if p.startswith("{") and 700 <= len(p.encode()) <= 1400] or [
        json.dumps({"messages": [{"role": "user", "content": "x" * 1000}]})
    ]
    results: dict[str, list[float]] = {}
    pinned = "not pinned" if args.no_pin else pin_client_and_servers(p.pid for p in procs if p.pid)

    def add(key: str, value: float) -> None:
        results.setdefault(key, []).append(value)

    async def round_() -> None:
        for size in (100,) if args.goals_only else (100, 1024):
            raw, ses = await _rtt_pair(raw_port, ses_port, size, args.rtt)
            for q, name in ((0.5, "p50"), (0.99, "p99")):
                add(f"rtt{size}_raw_{name}", _pct(raw, q))
                add(f"rtt{size}_ses_{name}", _pct(ses, q))
        for size, n in ((1000, 20000), (64 * 1024, 3000)):
            for (r, r_cpu), (s_, s_cpu) in await _text_pairs(raw_port, ses_port, size, n, 4):
                add(f"text{size}_raw", r)
                add(f"text{size}_ses", s_)
                add(f"text{size}_ratio", s_ / r)
                add(f"text{size}_raw_cpu", r_cpu)
                add(f"text{size}_ses_cpu", s_cpu)
        if args.goals_only:
            return
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
        for proc in procs:
            proc.kill()
        unpin()

    med = {k: statistics.median(v) for k, v in results.items()}
    print(
        f"Session over WebSocket vs raw websockets (event loop: {LOOP}; {args.rounds} rounds; RTT: "
        "raw and session in alternating batches of 50, percentiles per round, medians over rounds; "
        "throughput: median of "
        "paired alternating trials (ratio per pair); servers in child processes; cpu = server process "
        f"CPU per message; {pinned})"
    )
    print(f"{'case':34} {'raw':>12} {'session':>12} {'ratio':>8}  goal")

    def row(name: str, r: float, s: float, ratio: float, goal: str, ok: bool | None, extra: str = "") -> None:
        verdict = "" if ok is None else ("PASS" if ok else "MISS")
        print(f"{name:34} {r:12.1f} {s:12.1f} {ratio:7.2f}x  {goal} {verdict}{extra}")

    r, s = med["rtt100_raw_p50"] * 1e6, med["rtt100_ses_p50"] * 1e6
    row("RTT 100 B text p50 (us)", r, s, s / r, "<= 1.15x", s / r <= 1.15)
    for size, name, scale, unit in (
        (1000, "1 KB", 1.0, "msg/s"),
        (64 * 1024, "64 KiB", 64 * 1024 / 1e6, "MB/s"),
    ):
        ratio = med[f"text{size}_ratio"]
        cpu_r, cpu_s = med[f"text{size}_raw_cpu"] * 1e6, med[f"text{size}_ses_cpu"] * 1e6
        row(
            f"one-way {name} text ({unit})",
            med[f"text{size}_raw"] * scale,
            med[f"text{size}_ses"] * scale,
            ratio,
            ">= 0.9x",
            ratio >= 0.9,
            f"   cpu/msg {cpu_r:.1f} vs {cpu_s:.1f} us",
        )
    if args.goals_only:
        return
    print("extras:")
    r, s = med["rtt100_raw_p99"] * 1e6, med["rtt100_ses_p99"] * 1e6
    row("RTT 100 B text p99 (us)", r, s, s / r, "", None)
    for q in ("p50", "p99"):
        r, s = med[f"rtt1024_raw_{q}"] * 1e6, med[f"rtt1024_ses_{q}"] * 1e6
        row(f"RTT 1024 B text {q} (us)", r, s, s / r, "", None)
    r, s, ratio = med["tput_raw"] / 1e6, med["tput_ses"] / 1e6, med["tput_ratio"]
    row("64 KiB binary AVP one-way (MB/s)", r, s, ratio, ">= 0.9x", ratio >= 0.9)
    a, a_ratio = med["tput_rawavp"] / 1e6, med["tput_rawavp_ratio"]
    print(f"{'  raw websockets + avp.decode':34} {'':12} {a:12.0f} {a_ratio:7.2f}x  (websockets' reader)")
    b, b_ratio = med["tput_bulk"] / 1e6, med["tput_bulk_ratio"]
    print(
        f"{'  raw websockets, 1 MiB reads':34} {'':12} {b:12.0f} {b_ratio:7.2f}x  (the session's read size)"
    )
    tok_enc, tok_encdec = _tokenize_only(chat, 3000)
    c = med["chat_ses"]
    print(f"{'1 KB chat, TokenNative (msg/s)':34} {'':12} {c:12.0f}")
    print(
        f"{'  tiktoken encode alone (msg/s)':34} {tok_enc:12.0f} {'':12} {c / tok_enc:7.2f}x "
        "of the encode-only bound"
    )
    print(f"{'  tiktoken encode+decode (msg/s)':34} {tok_encdec:12.0f}")


if __name__ == "__main__":
    main()
