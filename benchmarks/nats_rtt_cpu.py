"""Round trip over NATS, and the CPU each of the three processes spends on it.

One session's 100-byte echo (``bench_nats.py``'s), 3,000 round trips after 300 of warm-up, with
the client on one CPU and the worker and nats-server on the other (``bench_nats.py --placement
pinned``). Prints the RTT p50 and the CPU per round trip of the client (this process), the worker
and nats-server (``/proc/PID/stat``, user + system). Run it from two checkouts in alternation to
compare a change to the NATS data path (stop 28: docs/NATS.md):

    PYTHONPATH=. .venv/bin/python benchmarks/nats_rtt_cpu.py [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import bench_nats
from _cpus import pin_client_and_servers, unpin

from m2mwire.transport.nats.local import LocalNatsServer


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(url: str, worker: int, server: int, count: int) -> str:
    from m2mwire.api import connect

    async with connect(url, max_payload=bench_nats.BIG, timers={"session_timeout": 3600}) as session:
        await bench_nats._rtt(session, 300)
        client0, worker0, server0 = time.process_time(), _cpu_seconds(worker), _cpu_seconds(server)
        samples = await bench_nats._rtt(session, count)
        client = (time.process_time() - client0) / count * 1e6
        worker_cpu = (_cpu_seconds(worker) - worker0) / count * 1e6
        server_cpu = (_cpu_seconds(server) - server0) / count * 1e6
    return (
        f"RTT p50 {statistics.median(samples) * 1e6:6.1f} us   CPU per round trip: client {client:5.1f} us, "
        f"worker {worker_cpu:5.1f} us, nats-server {server_cpu:5.1f} us (+-3 us: 10 ms clock ticks)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--count", type=int, default=3000, help="round trips per run")
    args = parser.parse_args()
    with LocalNatsServer(gogc=400) as nats_server:
        proc, url = bench_nats._start_server(f"{nats_server.url}/bench.rtt")
        try:
            assert proc.pid
            print(pin_client_and_servers([proc.pid, nats_server.pid]))
            for _ in range(args.runs):
                print(asyncio.run(_measure(url, proc.pid, nats_server.pid, args.count)))
        finally:
            proc.terminate()
            unpin([nats_server.pid])


if __name__ == "__main__":
    main()
