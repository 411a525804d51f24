"""Session-context zstd against per-message codecs and permessage-deflate, in one run (issue 16).

Workloads (m2mwire/workloads.py, generated deterministically): a multi-turn chat resending its
history, a tool-using agent loop resending its tools, ~300 streamed chunks, JSON status events,
and per-message traffic with no repetition (the worst case for a context).

1. Bytes on the wire, both directions, envelopes and WebSocket frame headers included (2-14 bytes,
   plus the 4-byte mask client -> server), as % of the content's UTF-8 bytes. Every m2mwire column
   is what SessionProtocol really queues (sans-I/O pairs, both ends in this process):
   none, brotli (per message), tokennative (text #TK| and binary frames), zstd (session context
   with shared history, the default), zstd-pd (one context per direction: history=False).
   permessage-deflate: the `none` messages run through websockets' own PerMessageDeflate with
   context takeover, at zlib's 32 KiB window (15 bits, memLevel 8) and at websockets' server
   defaults (12 bits, memLevel 5).
2. zstd level sweep (wire % and compression speed).
3. Codec speed on the agent loop: MB/s of original bytes, fresh contexts per trial, median of 7.
4. Memory per session at 1,000 sessions (each in its own process: RSS after vs before, zstd vs
   brotli, both ends of every session in the process).
5. RTT of 1 KB messages, server in its own process, `none` vs `zstd` on two open sessions,
   alternating in batches of 50 (WebSocket and QUIC); then the CPU of the same echo in the codec
   and session layers alone (a sans-I/O pair in this process, hot caches): what zstd adds per
   round trip, the part of the RTT this project's Python controls.

    .venv/bin/python benchmarks/bench_context.py [--quick] [--rtt-only ws|quic]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import random
import statistics
import subprocess
import sys
import time
from typing import Any

from _cpus import pin_client_and_servers, unpin
from websockets.extensions.permessage_deflate import PerMessageDeflate
from websockets.frames import Frame, Opcode

from m2mwire.codecs import Algorithm
from m2mwire.codecs.jsonutil import dumps_compact
from m2mwire.codecs.zstdcontext import ContextCompressor, ContextDecompressor
from m2mwire.codecs.zstdhistory import HistoryContext
from m2mwire.session.config import SessionConfig, ZstdOptions
from m2mwire.session.core import SessionProtocol
from m2mwire.session.outputs import CloseTransport, SendMessage
from m2mwire.session.states import Role
from m2mwire.session.zstdstate import inner_message
from m2mwire.workloads import WORKLOADS, Step, workload

A = Algorithm
METHODS = ["none", "brotli", "tk-text", "tk-bin", "zstd", "zstd-pd", "pmd-15", "pmd-12"]


def ws_header(size: int, masked: bool) -> int:
    """RFC 6455 frame header bytes for a payload of ``size`` bytes."""
    return 2 + (2 if 126 <= size < 65536 else 8 if size >= 65536 else 0) + (4 if masked else 0)


def _size(message: Any) -> int:
    if isinstance(message, bytes):  # a text message: its UTF-8
        return len(message)
    return sum(memoryview(b).nbytes for b in message)


def _pair(
    algorithms: tuple[Algorithm, ...], level: int = 3, history: bool = True
) -> tuple[SessionProtocol, SessionProtocol]:
    config = SessionConfig(algorithms=algorithms, zstd=ZstdOptions(level=level, history=history))
    client, server = SessionProtocol(Role.CLIENT, config), SessionProtocol(Role.SERVER, config)
    client.initiate(0.0)
    server.initiate(0.0)
    for src, dst in ((client, server), (server, client)):
        for out in src.data_to_send():
            assert isinstance(out, SendMessage) and out.text
            dst.receive_text(out.message, 0.0)
    return client, server


def run_session(
    steps: list[Step], method: str, level: int = 3, keep: list[tuple[bool, Any]] | None = None
) -> tuple[int, int]:
    """(content bytes, wire bytes incl. WebSocket headers) of ``steps`` through a real session pair.

    Every message is also delivered and checked, so a method that loses content cannot look good.
    """
    algorithm = {"none": A.NONE, "brotli": A.BROTLI, "tk-text": A.TOKENNATIVE, "tk-bin": A.TOKENNATIVE}.get(
        method, A.ZSTD
    )
    client, server = _pair((algorithm,), level, history=method != "zstd-pd")
    original = wire = 0
    for sender, content in steps:
        src, dst = (client, server) if sender == "client" else (server, client)
        sent = src.send(content, 1.0, algorithm=algorithm, binary=method == "tk-bin")
        original += sent.original_bytes
        for out in src.data_to_send():
            assert not isinstance(out, CloseTransport)
            size = _size(out.message)
            wire += size + ws_header(size, masked=sender == "client")
            if keep is not None:
                keep.append((sender == "client", out.message))
            got = (
                dst.receive_text(out.message, 1.0)
                if out.text
                else dst.receive_binary(b"".join(bytes(b) for b in out.message), 1.0)
            )
            assert got is not None, dst.closed
            expected = content if isinstance(content, str) else dumps_compact(content)
            assert (got.text if got.kind != "json" else dumps_compact(got.value)) == expected
    return original, wire


def permessage_deflate(messages: list[tuple[bool, Any]], bits: int, mem_level: int) -> int:
    """Wire bytes of the "none" session's messages through websockets' PerMessageDeflate, context
    takeover on."""

    def ext() -> PerMessageDeflate:
        return PerMessageDeflate(False, False, bits, bits, {"memLevel": mem_level})

    # One compressor per direction (each end's local side) and the matching decompressor.
    senders = {True: ext(), False: ext()}
    receivers = {True: ext(), False: ext()}
    total = 0
    for from_client, message in messages:
        # Text of 1 KiB and more travels in binary form (envelope line + content, in parts);
        # the extension compresses a binary message's bytes as it does a text one's.
        data = message if isinstance(message, bytes | str) else b"".join(bytes(part) for part in message)
        opcode = Opcode.TEXT if data is message else Opcode.BINARY
        frame = senders[from_client].encode(Frame(opcode, data))
        total += len(frame.data) + ws_header(len(frame.data), masked=from_client)
        assert receivers[from_client].decode(frame).data == data
    return total


def wire_table(names: list[str]) -> dict[str, dict[str, float]]:
    print("== 1. Bytes on the wire, both directions, envelopes + WebSocket headers, % of content bytes")
    print(f"{'workload':14} {'msgs':>5} {'content B':>10} " + " ".join(f"{m:>8}" for m in METHODS))
    results: dict[str, dict[str, float]] = {}
    for name in names:
        steps = workload(name)
        row: dict[str, float] = {}
        none_messages: list[tuple[bool, Any]] = []
        original = 0
        for method in METHODS[:6]:
            original, wire = run_session(steps, method, keep=none_messages if method == "none" else None)
            row[method] = wire / original
        row["pmd-15"] = permessage_deflate(none_messages, 15, 8) / original
        row["pmd-12"] = permessage_deflate(none_messages, 12, 5) / original
        results[name] = row
        cells = " ".join(f"{row[m]:8.1%}" for m in METHODS)
        print(f"{name:14} {len(steps):5} {original:10} {cells}")
    print()
    return results


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def goals(results: dict[str, dict[str, float]], speed: tuple[float, float], rtt: dict[str, float]) -> None:
    print("== Goals (issue 16)")
    for name in ("agent_loop", "long_agent_loop", "multi_turn"):
        if name in results:
            z = results[name]["zstd"]
            print(f"  {name}: zstd {z:.1%} of the original bytes (goal <= 8 %): {_met(z <= 0.08)}")
    if "no_repetition" in results:
        ratio = results["no_repetition"]["zstd"] / results["no_repetition"]["brotli"]
        print(f"  no_repetition: zstd / brotli = {ratio:.3f} (goal <= 1.05): {_met(ratio <= 1.05)}")
    c, d = speed
    print(
        f"  agent loop compression {c:.0f} MB/s (goal >= 200): {_met(c >= 200)}, "
        f"decompression {d:.0f} MB/s (goal >= 500): {_met(d >= 500)}"
    )
    for transport, ratio in rtt.items():
        print(f"  1 KB RTT over {transport}: zstd / none = {ratio:.3f} (goal <= 1.1): {_met(ratio <= 1.1)}")
    print()


def where_bytes_go(names: tuple[str, ...] = ("multi_turn", "agent_loop")) -> None:
    """zstd's wire bytes split into compressed data, per-message framing (kind byte + CRC-32) and
    WebSocket headers; then the same messages through ONE context for both directions (each side's
    history would include what it received): the bound cross-direction history could reach; and
    what shared history (codecs/zstdhistory.py, the default) puts on the wire, all included."""
    print("== 1b. Where per-direction zstd's bytes go (% of content bytes): data + framing + WS headers")
    for name in names:
        messages = _inner_messages(name)
        content = sum(len(c if isinstance(c, str) else dumps_compact(c).encode()) for _, c in workload(name))
        per_direction = {"client": ContextCompressor(), "server": ContextCompressor()}
        joint = ContextCompressor()
        ends = {"client": HistoryContext(), "server": HistoryContext()}
        data = shared = headers = history = 0
        for sender, inner in messages:
            payload = per_direction[sender].compress(inner)
            data += len(payload) - 4  # the CRC-32 is framing
            shared += len(joint.compress(inner)) - 4
            headers += ws_header(1 + len(payload), masked=sender == "client")
            own = ends[sender].compress(inner)
            ends["server" if sender == "client" else "client"].decompress(own, 1 << 24)
            history += 1 + len(own) + ws_header(1 + len(own), masked=sender == "client")
        framing = 5 * len(messages)
        total = data + framing + headers
        print(
            f"  {name:14} {data / content:6.2%} + {framing / content:5.2%} + {headers / content:5.2%} "
            f"= {total / content:6.2%}   one context for both directions: "
            f"{(shared + framing + headers) / content:6.2%}   shared history: {history / content:6.2%}"
        )
    print()


def level_sweep() -> None:
    print("== 2. zstd level: wire % (as table 1) and compression MB/s of the context codec")
    for name in ("agent_loop", "multi_turn", "no_repetition"):
        steps = workload(name)
        cells = []
        for level in (1, 2, 3, 4, 6):
            original, wire = run_session(steps, "zstd", level=level)
            compress_speed, _ = codec_speed(name, level=level, trials=3)
            cells.append(f"L{level} {wire / original:6.2%} {compress_speed:5.0f} MB/s")
        print(f"  {name:14} " + "  ".join(cells))
    print()


def _inner_messages(name: str) -> list[tuple[str, bytes]]:
    sid = "8f3c2a4e-1b2d-4c5e-9f70-123456789abc"
    return [
        (
            sender,
            inner_message(
                c if isinstance(c, str) else dumps_compact(c), "text" if isinstance(c, str) else "json", sid
            ),
        )
        for sender, c in workload(name)
    ]


def codec_speed(name: str, *, level: int = 3, trials: int = 7, shared: bool = True) -> tuple[float, float]:
    """MB/s of original bytes through both directions' contexts (fresh contexts every trial);
    ``shared``: with shared history (each message is compressed, then decompressed by the peer,
    in order, since a history depends on what was received), else one context per direction."""
    messages = _inner_messages(name)
    original = sum(len(m) for _, m in messages)
    comp: list[float] = []
    decomp: list[float] = []
    for _ in range(trials):
        if shared:
            ends = {"client": HistoryContext(level=level), "server": HistoryContext(level=level)}
            peer = {"client": ends["server"], "server": ends["client"]}
            c = d = 0.0
            for s, m in messages:
                t = time.perf_counter()
                p = ends[s].compress(m)
                t2 = time.perf_counter()
                peer[s].decompress(p, 1 << 24)
                c, d = c + t2 - t, d + time.perf_counter() - t2
            comp.append(c)
            decomp.append(d)
            continue
        compressors = {"client": ContextCompressor(level=level), "server": ContextCompressor(level=level)}
        t = time.perf_counter()
        payloads = [(s, compressors[s].compress(m)) for s, m in messages]
        comp.append(time.perf_counter() - t)
        decompressors = {"client": ContextDecompressor(), "server": ContextDecompressor()}
        t = time.perf_counter()
        for s, p in payloads:
            decompressors[s].decompress(p, 1 << 24)
        decomp.append(time.perf_counter() - t)
    return original / statistics.median(comp) / 1e6, original / statistics.median(decomp) / 1e6


def speed_section() -> tuple[float, float]:
    print("== 3. Codec speed, MB/s of original bytes (envelope + content), median of 7, fresh contexts;")
    print("   per message in us; shared history (the default) / per-direction contexts")
    result = (0.0, 0.0)
    for name in WORKLOADS:
        n = len(workload(name))
        size = sum(len(m) for _, m in _inner_messages(name)) / n
        c, d = codec_speed(name)
        pc, pd = codec_speed(name, shared=False)
        print(
            f"  {name:15} compress {c:5.0f} / {pc:5.0f} MB/s ({size / c:6.1f} / {size / pc:5.1f} us)   "
            f"decompress {d:5.0f} / {pd:5.0f} MB/s ({size / d:5.1f} / {size / pd:4.1f} us)"
        )
        if name == "agent_loop":
            result = (c, d)
    print()
    return result


# -- 4. memory -----------------------------------------------------------------------------------------


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def memory_child(algorithm: str, sessions: int, name: str) -> None:
    steps = workload(name)
    pairs = [_pair((A(algorithm),)) for _ in range(sessions)]
    before = _rss()
    for client, server in pairs:
        for sender, content in steps:
            src, dst = (client, server) if sender == "client" else (server, client)
            src.send(content, 1.0, algorithm=A(algorithm))
            for out in src.data_to_send():
                assert isinstance(out, SendMessage)
                if out.text:
                    dst.receive_text(out.message, 1.0)
                else:
                    dst.receive_binary(out.message[0], 1.0)  # type: ignore[arg-type]
    after = _rss()
    reserved = sum(p.codec_memory for c, s in pairs for p in (c, s))
    print(f"{after - before} {reserved}")


def memory_section(sessions: int) -> None:
    print(f"== 4. Memory at {sessions:,} sessions (both ends in one process: {2 * sessions:,} endpoints)")
    for name in ("agent_loop", "streaming"):
        got = {}
        for algorithm in ("brotli", "zstd"):
            out = subprocess.run(
                [sys.executable, __file__, "--memory-child", algorithm, str(sessions), name],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            got[algorithm] = (int(out[0]), int(out[1]))
        delta = got["zstd"][0] - got["brotli"][0]
        per = delta / (2 * sessions)
        reserved = got["zstd"][1] / (2 * sessions)
        zstd_mib, brotli_mib = got["zstd"][0] / 2**20, got["brotli"][0] / 2**20
        print(
            f"  {name:11} RSS growth zstd {zstd_mib:7.1f} MiB, brotli {brotli_mib:6.1f} MiB: zstd costs "
            f"{per / 1024:6.0f} KiB per endpoint (reserved by zstd: {reserved / 1024:6.0f} KiB)"
        )
    print("  reserved = what zstd allocated (memory_size()); pages become resident as the history fills")
    print()


# -- 5. RTT -------------------------------------------------------------------------------------------------


async def _echo_server(scheme: str, port_q: Any) -> None:
    from m2mwire.api import Session, serve

    async def handler(session: Session) -> None:
        async for message in session:
            await session.send(message.text or "", algorithm=message.algorithm)

    async with serve(handler, f"{scheme}://127.0.0.1:0", algorithms=["zstd", "none"]) as server:
        port_q.put((server.port, server.fingerprint))
        await asyncio.Future()


def _serve(scheme: str, port_q: Any) -> None:
    asyncio.run(_echo_server(scheme, port_q))


def rtt_messages(kind: str, count: int) -> list[str]:
    """``count`` messages of 1 KB: ``agent`` = the same JSON shape with a few new words each time
    (what agents exchange), ``novel`` = new text every time (zstd's worst case: all literals)."""
    from m2mwire.workloads import _sentence, _text

    rng = random.Random(7)
    if kind == "novel":
        return [_text(rng, 1100, 1100)[:1024] for _ in range(count)]
    out = []
    for i in range(count):
        body = {"task": "t-8812", "step": i, "status": "working", "note": _sentence(rng), "history": "x"}
        text = dumps_compact(body)
        out.append(
            text.replace('"x"', '"' + "the same context as before, " * ((1024 - len(text)) // 28) + '"')
        )
    return out


async def _rtt(
    scheme: str, port: int, fingerprint: str | None, rounds: int, kind: str, history: bool, batch: int = 50
) -> float:
    """p50 zstd / none; ``history``: whether the client offers shared history (the server does)."""
    from m2mwire.api import connect

    messages = rtt_messages(kind, (rounds + 2) * batch)  # none repeats: "novel" stays novel
    opts: dict[str, Any] = {"fingerprint": fingerprint} if fingerprint else {}
    url = f"{scheme}://127.0.0.1:{port}"
    async with (
        connect(url, algorithms=["none"], **opts) as plain,
        connect(url, algorithms=["zstd"], zstd={"history": history}, **opts) as ctx,
    ):
        times: dict[str, list[float]] = {"none": [], "zstd": []}
        for i in range(rounds + 2):  # two warm-up rounds
            for alg, session in (
                (("none", plain), ("zstd", ctx)) if i % 2 else (("zstd", ctx), ("none", plain))
            ):
                for j in range(batch):
                    t = time.perf_counter()
                    await session.send(messages[(i * batch + j) % len(messages)], algorithm=alg)
                    reply = await session.recv()
                    if i >= 2:
                        times[alg].append(time.perf_counter() - t)
                    assert reply.algorithm == alg
    p50 = {k: statistics.median(v) for k, v in times.items()}
    mode = "zstd" if history else "zstd-pd"
    print(
        f"  {scheme:5} {kind:6} p50 none {p50['none'] * 1e6:6.0f} us   "
        f"{mode:7} {p50['zstd'] * 1e6:6.0f} us   ratio {p50['zstd'] / p50['none']:.3f}"
    )
    return p50["zstd"] / p50["none"]


def rtt_section(rounds: int, schemes: tuple[str, ...] = ("ws", "quic")) -> dict[str, float]:
    print(
        "== 5. Round trip of 1 KB text messages (server in its own process), p50, agent-like and novel "
        "text;\n"
        "   zstd = shared history (the default), zstd-pd = one context per direction (history=False)"
    )
    out: dict[str, float] = {}
    ctx = mp.get_context("spawn")
    for scheme in schemes:
        q = ctx.Queue()
        proc = ctx.Process(target=_serve, args=(scheme, q), daemon=True)
        proc.start()
        try:
            port, fingerprint = q.get(timeout=60)
            print(f"  {scheme}: {pin_client_and_servers([proc.pid]) if proc.pid else 'not pinned'}")
            for history in (True, False):
                for kind in ("agent", "novel"):
                    ratio = asyncio.run(_rtt(scheme, port, fingerprint, rounds, kind, history))
                    out[f"{scheme} {'zstd' if history else 'zstd-pd'} ({kind})"] = ratio
        finally:
            proc.terminate()
            proc.join(10)
            unpin()
    print()
    return out


def echo_cpu(algorithm: str, history: bool, kind: str, count: int = 2000, trials: int = 5) -> float:
    """CPU microseconds (process time, best of ``trials``) per echoed round trip of ``kind``
    1 KB messages through a sans-I/O client/server pair: both ends' send and receive, codec
    included, no transport."""
    alg = A.ZSTD if algorithm == "zstd" else A.NONE
    client, server = _pair((alg,), history=history)
    messages = rtt_messages(kind, count)

    def deliver(src: SessionProtocol, dst: SessionProtocol) -> Any:
        got = None
        for out in src.data_to_send():
            assert isinstance(out, SendMessage)
            got = dst.receive_text(out.message, 1.0) if out.text else dst.receive_binary(out.message[0], 1.0)
        return got

    def run(batch: list[str]) -> None:
        for message in batch:
            client.send(message, 1.0, algorithm=alg)
            got = deliver(client, server)
            server.send(got.text, 1.0, algorithm=alg)
            assert deliver(server, client).text == message

    run(messages[:200])  # contexts made, caches and branch predictors warm
    best = float("inf")
    for _ in range(trials):
        start = time.process_time()
        run(messages)
        best = min(best, (time.process_time() - start) / count * 1e6)
    return best


def echo_cpu_section() -> None:
    print("   CPU per echoed round trip, codec + session layers only (sans-I/O pair, hot, best of 5)")
    for kind in ("agent", "novel"):
        none = echo_cpu("none", False, kind)
        shared, per_direction = echo_cpu("zstd", True, kind), echo_cpu("zstd", False, kind)
        print(
            f"  {kind:6} none {none:5.1f} us   zstd {shared:5.1f} us (+{shared - none:4.1f})   "
            f"zstd-pd {per_direction:5.1f} us (+{per_direction - none:4.1f})"
        )
    print()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer sessions and round trips")
    parser.add_argument(
        "--rtt-only", choices=("ws", "quic"), help="only section 5 (round trips), over this transport"
    )
    parser.add_argument("--memory-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        algorithm, sessions, name = args.memory_child
        memory_child(algorithm, int(sessions), name)
        return
    if args.rtt_only:
        rtt_section(4 if args.quick else 20, (args.rtt_only,))
        return
    results = wire_table(list(WORKLOADS))
    where_bytes_go()
    level_sweep()
    speed = speed_section()
    memory_section(100 if args.quick else 1000)
    rtt = rtt_section(4 if args.quick else 20)
    echo_cpu_section()
    goals(results, speed, rtt)


if __name__ == "__main__":
    main()
