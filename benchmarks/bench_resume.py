"""What resume costs when nothing fails, and what a cut costs (issue 14).

1. Cost: RTT p50 (100 B echo) and one-way throughput of 1 KB and 64 KiB text, ``reconnect=True``
   against no reconnect, same run, server in its own process (as users run it), interleaved
   rounds, medians. Goal: <= 5 % slower.
2. Chaos: a TCP proxy (WebSocket) cuts connections mid-frame, or a UDP proxy (QUIC) blackholes
   the path, while text, JSON and AVP messages of random sizes flow both ways; checks exactly-once
   in-order delivery and reports the time from losing a connection to resuming (p50/p99) and the
   messages retransmitted per cut. ``--full``: 10,000 messages each way of up to 1 MiB.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_resume.py [--full] [--rounds 5] [--only cost|chaos]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import m2mwire  # noqa: E402
from m2mwire.api import Session  # noqa: E402
from tests.chaosproxy import TcpChaosProxy, UdpChaosProxy  # noqa: E402
from tests.test_resume import IDENT, check_exactly_once_in_order, workload  # noqa: E402

SERVER = """
import asyncio, sys
import m2mwire

async def handler(session):
    async for m in session:
        t = m.text or ""
        if t.startswith("rtt"):
            await session.send(t)
        elif t == "done":
            await session.send(f"got {session.stats.messages_received}")

async def main():
    async with m2mwire.serve(handler, sys.argv[1] + "://127.0.0.1:0", algorithms=["none"]) as s:
        print(s.port, s.fingerprint or "", flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


async def cost_round(url: str, fp: str, reconnect: bool) -> dict[str, float]:
    opts: dict[str, Any] = {"algorithms": ["none"], "reconnect": reconnect or None}
    if fp:
        opts["fingerprint"] = fp
    out: dict[str, float] = {}
    async with m2mwire.connect(url, **opts) as s:
        rtts = []
        msg = "rtt" + "x" * 97
        for _ in range(300):
            t = time.perf_counter()
            await s.send(msg)
            await s.recv()
            rtts.append(time.perf_counter() - t)
        out["rtt_us"] = statistics.median(rtts) * 1e6
        for label, size, count in (("1KB_msg_s", 1000, 20000), ("64KiB_MB_s", 65536, 1500)):
            payload = "y" * size
            t = time.perf_counter()
            for _ in range(count):
                await s.send(payload)
            await s.send("done")
            await s.recv()
            dt = time.perf_counter() - t
            out[label] = count / dt if size == 1000 else count * size / dt / 1e6
    return out


async def cost(rounds: int) -> None:
    print("== cost of reconnect=True when nothing fails (server in its own process) ==")
    for scheme in ("ws", "quic"):
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, scheme], stdout=subprocess.PIPE, text=True, cwd=ROOT
        )
        try:
            assert proc.stdout is not None
            port, _, fp = proc.stdout.readline().strip().partition(" ")
            url = f"{scheme}://127.0.0.1:{port}"
            results: dict[bool, list[dict[str, float]]] = {False: [], True: []}
            for _ in range(rounds):
                for rec in (False, True):  # interleaved: drift hits both alike
                    results[rec].append(await cost_round(url, fp, rec))
            print(f"{scheme:5} {'metric':12} {'off':>10} {'on':>10} {'on/off':>7}")
            for key in ("rtt_us", "1KB_msg_s", "64KiB_MB_s"):
                off = statistics.median(r[key] for r in results[False])
                on = statistics.median(r[key] for r in results[True])
                print(f"{scheme:5} {key:12} {off:10.1f} {on:10.1f} {on / off:7.3f}")
        finally:
            proc.terminate()
            proc.wait()


async def chaos(scheme: str, count: int, max_size: int) -> None:
    to_server = workload(11, count, max_size)
    to_client = workload(12, count, max_size)
    server_got: list[m2mwire.Message] = []
    done = asyncio.Event()
    server_sessions: list[Session] = []

    async def handler(session: Session) -> None:
        server_sessions.append(session)

        async def rx() -> None:
            for _ in range(count):
                server_got.append(await session.recv())

        async def tx() -> None:
            for item in to_client:
                await session.send(item)

        await asyncio.gather(rx(), tx())
        done.set()
        await session.wait_closed()

    timers = {"ping_interval": 0.2, "pong_timeout": 0.2, "max_missed_pongs": 2} if scheme == "quic" else None
    sopts: dict[str, Any] = {"identity": IDENT, "max_payload": 2 * max_size + 4096}
    if timers:
        sopts["timers"] = timers
    async with m2mwire.serve(handler, f"{scheme}://127.0.0.1:0", **sopts) as server:
        proxy: TcpChaosProxy | UdpChaosProxy
        if scheme == "ws":
            proxy = await TcpChaosProxy(server.port, cut_after=(200_000, 4_000_000), seed=3).start()
        else:
            proxy = await UdpChaosProxy(server.port).start()
        lost_at: list[float] = []
        resume_times: list[float] = []
        copts: dict[str, Any] = dict(sopts)
        if server.fingerprint:
            copts["fingerprint"] = server.fingerprint
            copts["open_timeout"] = 0.3
        reconnect = m2mwire.Reconnect(initial_delay=0.01, max_delay=0.2, max_elapsed=30)
        t0 = time.perf_counter()
        async with m2mwire.connect(f"{scheme}://127.0.0.1:{proxy.port}", reconnect=reconnect, **copts) as s:
            original_detached = s._on_detached
            original_settle = s._settle

            def on_detached() -> None:
                lost_at.append(time.perf_counter())
                original_detached()

            def settle(outcome: str) -> None:
                if outcome == "resumed" and lost_at:
                    resume_times.append(time.perf_counter() - lost_at[-1])
                original_settle(outcome)

            s._on_detached = on_detached  # type: ignore[method-assign]
            s._settle = settle  # type: ignore[method-assign]
            got: list[m2mwire.Message] = []

            async def rx() -> None:
                for _ in range(count):
                    got.append(await s.recv())

            async def tx() -> None:
                for item in to_server:
                    await s.send(item)

            async def blackholes() -> None:
                assert isinstance(proxy, UdpChaosProxy)
                step = max(1, count // 8)
                for mark in range(step, count, step):
                    while s.stats.messages_received < mark:
                        await asyncio.sleep(0.005)
                    proxy.blackhole(0.8)
                    await asyncio.sleep(0.9)

            bh = asyncio.create_task(blackholes()) if scheme == "quic" else None
            await asyncio.gather(rx(), tx())
            if bh is not None:
                bh.cancel()
            await asyncio.wait_for(done.wait(), 60)
            elapsed = time.perf_counter() - t0
            check_exactly_once_in_order(to_client, got)
            check_exactly_once_in_order(to_server, server_got)
            cuts = s.stats.reconnects
            retx = s.stats.retransmitted + server_sessions[0].stats.retransmitted
            mb = (
                sum(len(m.text or "") if m.avp is None else len(m.avp.payload) for m in got + server_got)
                / 1e6
            )
            rt = sorted(resume_times)
            p50 = statistics.median(rt) * 1e3 if rt else float("nan")
            p99 = rt[min(len(rt) - 1, int(0.99 * len(rt)))] * 1e3 if rt else float("nan")
            print(
                f"{scheme:5} {count} msgs each way (<= {max_size // 1024} KiB, {mb:.0f} MB): "
                "exactly once, in order; "
                f"{cuts} resumes, time to resume p50 {p50:.0f} ms p99 {p99:.0f} ms, "
                f"{retx / max(cuts, 1):.0f} messages retransmitted per cut (both directions), {elapsed:.1f} s"
            )
        await proxy.close()


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--full", action="store_true", help="10,000 messages each way of up to 1 MiB")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", choices=("cost", "chaos"))
    args = parser.parse_args()
    if args.only != "chaos":
        await cost(args.rounds)
    if args.only != "cost":
        print("== chaos: cuts (ws) and blackholes (quic) while messages flow both ways ==")
        count, max_size = (10_000, 1024 * 1024) if args.full else (2000, 64 * 1024)
        for scheme in ("ws", "quic"):
            await chaos(scheme, count, max_size)


if __name__ == "__main__":
    asyncio.run(main())
