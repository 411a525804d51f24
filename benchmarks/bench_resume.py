"""What resume costs when nothing fails, and what a cut costs (issue 14).

1. Cost: RTT p50 (100 B echo) and one-way throughput of 1 KB and 64 KiB text, ``reconnect=True``
   against no reconnect, two sessions open side by side to a server in its own process (as users
   run it; the client and the server on a CPU each, benchmarks/_cpus.py); trials alternate in
   ABBA pairs, the ratio taken per pair, median of the ratios; with the CPU time per message of
   this process and of the server process (the steady figure on a shared machine). Goal: <= 5 %
   slower.
2. Chaos: a TCP proxy (WebSocket) cuts connections mid-frame, or a UDP proxy (QUIC) blackholes
   the path, or a TCP proxy between the client and nats-server (NATS) cuts the client's NATS
   connection mid-frame (nats-py reconnects, the channel resends) and, at 7 points, refuses it for
   0.8 s so that the session is detached and resumes on its worker (nats-server runs in its own
   process too), while text, JSON and AVP messages of random sizes flow both ways; checks exactly-once
   in-order delivery and reports the time from losing a connection to resuming (p50/p99), the
   messages retransmitted per cut, and the peak RSS of the client process (with the proxy) and of
   the server process (its own, as users run it; Linux /proc). Both sides check what arrives
   against the workload as it arrives, holding nothing, so the memory is the sessions' own.
   ``--full``: 10,000 messages each way of up to 1 MiB (``--count N`` for fewer).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_resume.py [--full] [--count N] [--rounds 8]
        [--only cost|chaos] [--scheme ws|quic|nats] [--metric rtt_us|1KB_msg_s|64KiB_MB_s] [--aa]
        [--no-pin]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import m2mwire  # noqa: E402
from benchmarks._cpus import pin_client_and_servers, unpin  # noqa: E402
from m2mwire.transport.nats.local import LocalNatsServer  # noqa: E402
from tests.chaosproxy import TcpChaosProxy, UdpChaosProxy  # noqa: E402
from tests.test_resume import IDENT, same, workload_items  # noqa: E402

SERVER = """
import asyncio, sys, time
import m2mwire

async def handler(session):
    count = 0
    async for m in session:
        t = m.text or ""
        if t.startswith("rtt"):
            await session.send(t)
        elif t == "#cpu":  # messages counted since the last #cpu, and this process's CPU clock
            await session.send(f"{count} {time.process_time()}")
            count = 0
        else:
            count += 1

async def main():
    url = sys.argv[1] + "://127.0.0.1:0"
    # cert_dir=False: a throwaway server, nothing to keep in the state directory
    async with m2mwire.serve(handler, url, algorithms=["none"], cert_dir=False) as s:
        print(s.port, s.fingerprint or "", flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""

# Messages per trial: each trial is long against the machine's drift but short enough for many
# pairs; the 64 KiB trial carries 16x the default resume_buffer_bytes, so the retention buffer
# fills, and the ACKs that release it are part of what is measured.
RTT_N, KB1_N, KB64_N = 3000, 40000, 4000
METRICS = ("rtt_us", "1KB_msg_s", "64KiB_MB_s")  # RTT p50 in us, msg/s, MB/s


async def _server_cpu(s: Any) -> tuple[int, float]:
    """(messages the server counted since the last call, its process CPU clock in s)."""
    await s.send("#cpu")
    count, cpu = str((await s.recv()).text).split()
    return int(count), float(cpu)


async def cost_trial(s: Any, key: str) -> tuple[float, float, float]:
    """One trial on an open session: (rate, client CPU s/msg, server CPU s/msg). RTT: p50 of
    100 B echoes (a message each way); throughput: one-way messages, the last one answered."""
    _, scpu0 = await _server_cpu(s)
    ccpu0, t = time.process_time(), time.perf_counter()
    if key == "rtt_us":
        n, msg, rtts = RTT_N, "rtt" + "x" * 97, []
        for _ in range(n):
            t1 = time.perf_counter()
            await s.send(msg)
            await s.recv()
            rtts.append(time.perf_counter() - t1)
        rate = statistics.median(rtts) * 1e6
    else:
        size, n = (1000, KB1_N) if key == "1KB_msg_s" else (65536, KB64_N)
        payload = "y" * size
        for _ in range(n):
            await s.send(payload)
    ccpu1, dt = time.process_time(), time.perf_counter() - t
    got, scpu1 = await _server_cpu(s)  # also waits until the server has read every message
    dt = time.perf_counter() - t
    if key != "rtt_us":
        assert got == n, f"server counted {got} of {n} messages"
        rate = n / dt if key == "1KB_msg_s" else n * 65536 / dt / 1e6
    return rate, (ccpu1 - ccpu0) / n, (scpu1 - scpu0) / n


async def cost(
    rounds: int, schemes: tuple[str, ...], metrics: tuple[str, ...], aa: bool, pin: bool = True
) -> None:
    """Pairs of sessions open side by side, one with reconnect=True, on fresh connections for each
    pair: trials alternate off/on in ABBA order, the ratio taken per pair (the machine's speed
    drifts within seconds), median of ratios.
    CPU time per message, of this process and of the server's, is the steady figure on a shared
    machine: the server reports its process_time at each trial's start and end. ``aa``: both
    sessions without reconnect (an A/A run: what the method itself reads as a difference)."""
    print(
        f"== cost of reconnect=True when nothing fails: {rounds} ABBA pairs per metric (fresh "
        "connections each), server in its own process; on/off = median of per-pair ratios;\n"
        "   cpu = us per message (RTT: per round trip) =="
    )
    for scheme in schemes:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, scheme], stdout=subprocess.PIPE, text=True, cwd=ROOT
        )
        try:
            assert proc.stdout is not None
            port, _, fp = proc.stdout.readline().strip().partition(" ")
            print(f"   {pin_client_and_servers([proc.pid]) if pin else 'not pinned (--no-pin)'}")
            url = f"{scheme}://127.0.0.1:{port}"
            base: dict[str, Any] = {"algorithms": ["none"]}
            if fp:
                base["fingerprint"] = fp
            print(
                f"{scheme:5} {'metric':11} {'off':>9} {'on':>9} {'on/off':>7}  "
                f"{'cli cpu off/on':>15} {'ratio':>6}  {'srv cpu off/on':>15} {'ratio':>6}"
            )
            for key in metrics:
                pairs: list[tuple[tuple[float, ...], tuple[float, ...]]] = []
                for i in range(rounds):
                    # Two fresh connections per pair: how fast the kernel moves one TCP
                    # connection's bytes on this VM differs from connection to connection (a
                    # 64 KiB message's system time 5-30 us, whatever the session does), and a
                    # pair of connections kept for the whole run read that as a difference.
                    async with (
                        m2mwire.connect(url, **base) as off,
                        m2mwire.connect(url, reconnect=None if aa else True, **base) as on,
                    ):
                        for s in (off, on):  # warm-up: fills the retention buffer once
                            await cost_trial(s, key)
                        order = (off, on) if i % 2 == 0 else (on, off)
                        got = {id(s): await cost_trial(s, key) for s in order}
                        pairs.append((got[id(off)], got[id(on)]))
                med = [[statistics.median(p[side][j] for p in pairs) for j in range(3)] for side in (0, 1)]
                ratio = [statistics.median(p[1][j] / p[0][j] for p in pairs) for j in range(3)]
                # RTT is a time (higher is worse); the others rates: report "on is x slower" alike
                slower = ratio[0] if key == "rtt_us" else 1 / ratio[0]
                print(
                    f"{scheme:5} {key:11} {med[0][0]:9.1f} {med[1][0]:9.1f} {slower:7.3f}  "
                    f"{med[0][1] * 1e6:7.1f}/{med[1][1] * 1e6:<7.1f} {ratio[1]:6.3f}  "
                    f"{med[0][2] * 1e6:7.1f}/{med[1][2] * 1e6:<7.1f} {ratio[2]:6.3f}",
                    flush=True,
                )
        finally:
            proc.terminate()
            proc.wait()
            unpin()


# The chaos run's server, in its own process as users run it: it checks what it receives against
# the workload as it arrives (nothing sent or received is kept, so its memory is the session's own)
# and reports its peak RSS.
CHAOS_SERVER = """
import asyncio, json, sys
import m2mwire
from benchmarks.bench_resume import CLIENT_SEED, SERVER_SEED, QUIC_TIMERS, rss_mib
from tests.test_resume import IDENT, same, workload_items

scheme, count, max_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
algorithms = sys.argv[4].split(",") if sys.argv[4] else None
url = sys.argv[5] if len(sys.argv) > 5 else f"{scheme}://127.0.0.1:0"  # nats: the service's URL

async def main():
    finished = asyncio.Event()
    report = {}

    async def handler(session):
        wrong = []

        async def rx():
            for i, expected in enumerate(workload_items(CLIENT_SEED, count, max_size)):
                if not same(expected, await session.recv()) and not wrong:
                    wrong.append(i)

        async def tx():
            for item in workload_items(SERVER_SEED, count, max_size):
                await session.send(item)

        await asyncio.gather(rx(), tx())
        report.update(
            first_wrong=wrong[0] if wrong else None,
            received=session.stats.messages_received,
            retransmitted=session.stats.retransmitted,
        )
        finished.set()
        await session.wait_closed()

    options = {"identity": IDENT, "max_payload": 2 * max_size + 4096}
    if algorithms:
        options["algorithms"] = algorithms
    if scheme == "nats":
        options |= {"timers": QUIC_TIMERS, "probe_interval": 0.2}
    else:
        options["cert_dir"] = False
    if scheme == "quic":
        options["timers"] = QUIC_TIMERS
    async with m2mwire.serve(handler, url, **options) as server:
        start = {"port": server.port, "fingerprint": server.fingerprint, "rss_mib": rss_mib("VmRSS")}
        print(json.dumps(start), flush=True)
        await finished.wait()
        report["peak_rss_mib"] = rss_mib("VmHWM")
        print(json.dumps(report), flush=True)
        await asyncio.Event().wait()  # until the client is done and terminates us

asyncio.run(main())
"""
CLIENT_SEED, SERVER_SEED = 11, 12  # the workloads the client and the server send
QUIC_TIMERS = {"ping_interval": 0.2, "pong_timeout": 0.2, "max_missed_pongs": 2}  # NATS's too
NATS_SERVICE = "bench.resume"


def rss_mib(field: str) -> float:
    """This process's resident memory in MiB (Linux): ``VmRSS`` now, ``VmHWM`` its peak."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak_rss() -> None:
    """Start VmHWM again from the current RSS (Linux >= 4.0), so each transport's peak is its own."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def content_size(item: Any) -> int:
    return int(item.nbytes) if hasattr(item, "nbytes") else len(str(item))


async def chaos(
    scheme: str, count: int, max_size: int, cut_after: tuple[int, int], algorithms: str = ""
) -> None:
    if scheme != "nats":
        await chaos_run(scheme, count, max_size, cut_after, algorithms)
        return
    with LocalNatsServer() as nats:  # in a process of its own; the worker connects to it directly
        await chaos_run(scheme, count, max_size, cut_after, algorithms, nats)


async def chaos_run(
    scheme: str,
    count: int,
    max_size: int,
    cut_after: tuple[int, int],
    algorithms: str,
    nats: LocalNatsServer | None = None,
) -> None:
    service = [f"{nats.url}/{NATS_SERVICE}"] if nats is not None else []
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHAOS_SERVER, scheme, str(count), str(max_size), algorithms, *service,
        stdout=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        started = json.loads(await asyncio.wait_for(proc.stdout.readline(), 60))
        reset_peak_rss()
        client_base = rss_mib("VmRSS")
        proxy: TcpChaosProxy | UdpChaosProxy
        if scheme == "quic":
            proxy = await UdpChaosProxy(started["port"]).start()
        else:  # ws: to the server; nats: the client's connection to nats-server
            target = nats.port if nats is not None else started["port"]
            proxy = await TcpChaosProxy(target, cut_after=cut_after, seed=3).start()
        lost_at: list[float] = []
        resume_times: list[float] = []
        copts: dict[str, Any] = {"identity": IDENT, "max_payload": 2 * max_size + 4096}
        if algorithms:
            copts["algorithms"] = algorithms.split(",")
        url = f"{scheme}://127.0.0.1:{proxy.port}"
        if scheme == "quic":
            copts |= {"timers": QUIC_TIMERS, "fingerprint": started["fingerprint"], "open_timeout": 0.3}
        if scheme == "nats":  # nats-py retries the refused connection quickly, and never gives up
            copts |= {"timers": QUIC_TIMERS, "probe_interval": 0.2, "reconnect_time_wait": 0.05}
            copts |= {"max_reconnect_attempts": -1, "open_timeout": 2.0}
            url += f"/{NATS_SERVICE}"
        reconnect = m2mwire.Reconnect(initial_delay=0.01, max_delay=0.2, max_elapsed=30)
        t0 = time.perf_counter()
        async with m2mwire.connect(url, reconnect=reconnect, **copts) as s:
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
            wrong: list[int] = []
            moved = [0]  # bytes of content, both directions

            async def rx() -> None:
                for i, expected in enumerate(workload_items(SERVER_SEED, count, max_size)):
                    if not same(expected, await s.recv()) and not wrong:
                        wrong.append(i)
                    moved[0] += content_size(expected)

            async def tx() -> None:
                for item in workload_items(CLIENT_SEED, count, max_size):
                    await s.send(item)
                    moved[0] += content_size(item)

            async def blackholes() -> None:
                step = max(1, count // 8)
                for mark in range(step, count, step):
                    while s.stats.messages_received < mark:
                        await asyncio.sleep(0.005)
                    if isinstance(proxy, UdpChaosProxy):
                        proxy.blackhole(0.8)
                        await asyncio.sleep(0.9)
                    else:  # NATS: refused for longer than liveness allows (0.6 s): a resume
                        proxy.refusing = True
                        proxy.cut()
                        await asyncio.sleep(0.8)
                        proxy.refusing = False
                        await asyncio.sleep(0.1)

            bh = asyncio.create_task(blackholes()) if scheme != "ws" else None
            await asyncio.gather(rx(), tx())
            if bh is not None:
                bh.cancel()
            server = json.loads(await asyncio.wait_for(proc.stdout.readline(), 120))
            elapsed = time.perf_counter() - t0
            client_peak = rss_mib("VmHWM")
            assert not wrong, f"client: message {wrong[0]} lost, duplicated or out of order"
            assert server["first_wrong"] is None, f"server: message {server['first_wrong']} wrong"
            assert s.stats.messages_received == count == server["received"], (
                f"duplicates: client got {s.stats.messages_received}, server {server['received']} of {count}"
            )
            cuts = s.stats.reconnects
            retx = s.stats.retransmitted + server["retransmitted"]
            wire = s.stats.wire_bytes_sent + s.stats.wire_bytes_received  # the text compresses
            rt = sorted(resume_times)
            p50 = statistics.median(rt) * 1e3 if rt else float("nan")
            p99 = rt[min(len(rt) - 1, int(0.99 * len(rt)))] * 1e3 if rt else float("nan")
            print(
                f"{scheme:5} {count} msgs each way (1 B .. {max_size // 1024} KiB, {moved[0] / 1e6:.0f} MB, "
                f"{wire / 1e6:.0f} MB on the wire): "
                "exactly once, in order; "
                f"{cuts} resumes, time to resume p50 {p50:.0f} ms p99 {p99:.0f} ms, "
                f"{retx / max(cuts, 1):.1f} messages retransmitted per cut (both directions), {elapsed:.1f} s"
            )
            print(
                f"{scheme:5} peak RSS: client {client_peak:.0f} MiB (at start {client_base:.0f}; with the "
                f"proxy), server {server['peak_rss_mib']:.0f} MiB (at start {started['rss_mib']:.0f})",
                flush=True,
            )
        await proxy.close()
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--full", action="store_true", help="10,000 messages each way of up to 1 MiB")
    parser.add_argument("--count", type=int, help="messages each way (default: 2,000; --full 10,000)")
    parser.add_argument("--rounds", type=int, default=8, help="cost: ABBA pairs per metric")
    parser.add_argument("--only", choices=("cost", "chaos"))
    parser.add_argument(
        "--scheme", choices=("ws", "quic", "nats"), help="this transport only (cost: ws and quic only)"
    )
    parser.add_argument("--metric", choices=METRICS, help="cost: this metric only")
    parser.add_argument("--aa", action="store_true", help="cost: both sessions without reconnect (A/A)")
    parser.add_argument(
        "--no-pin", action="store_true", help="cost: client and server unpinned (benchmarks/_cpus.py)"
    )
    parser.add_argument(
        "--algorithms", default="", help="chaos: e.g. none (the workload's text compresses well by default)"
    )
    args = parser.parse_args()
    if args.only != "chaos" and args.scheme != "nats":  # the cost run: WebSocket and QUIC
        schemes = (args.scheme,) if args.scheme else ("ws", "quic")
        await cost(args.rounds, schemes, (args.metric,) if args.metric else METRICS, args.aa, not args.no_pin)
    if args.only != "cost":
        print("== chaos: cuts (ws), blackholes (quic), cuts and outages (nats), messages both ways ==")
        count, max_size = (10_000, 1024 * 1024) if args.full else (2000, 64 * 1024)
        # WebSocket cuts: after 200 KB .. 4 MB, or 3 .. 60 of the largest messages with --full
        # (a connection must carry a whole message for the run to progress).
        cut_after = (3 * max_size, 60 * max_size) if args.full else (200_000, 4_000_000)
        for scheme in (args.scheme,) if args.scheme else ("ws", "quic", "nats"):
            await chaos(scheme, args.count or count, max_size, cut_after, args.algorithms)


if __name__ == "__main__":
    asyncio.run(main())
