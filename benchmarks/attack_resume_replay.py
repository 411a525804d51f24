"""Repeated resumes with nothing acknowledged, against a server in its own process (stop 24).

A raw WebSocket client opens a session with resume (offering zstd, unless --plain), sends tiny DATA
messages until the echo server's retention buffer (16 MiB) is full, and never acknowledges
anything. Then, for --seconds, it opens a connection, sends a resuming HELLO with received=0
(~1 KB), waits for the ACCEPT and drops the connection; again and again. Each resume makes the
server encode its retained messages again. A second, well-behaved session (the canary) measures
echo round trips meanwhile. Printed: resumes, server CPU (share of a core, per resume), canary
round trips before and during.

Measured (20 s, 2-vCPU VM; the echo answers in the algorithm it got, so the retained echoes are
plain text): before the replay budget (session/resume.py, REPLAY_REFILL), 209 resumes, the server
at 100 % of a core (96 ms per resume), canary p50 0.1 -> 89.9 ms; with it, 3 resumes, 3 % of a
core, canary p50 0.1 -> 0.1 ms (p99 0.4 ms). Stop 25 (replays made as the connection takes them
and charged what they sent; the writer gives the loop a turn per 1,024 messages, so it learns of
the lost connection after at most that many): 165 resumes, 4 % of a core (5 ms per resume, the
handshake included), canary p50 0.1 ms, p99 0.2 -> 1.9 ms. Run it from outside the checkout
with PYTHONPATH pointing at the code to measure (the server process imports m2mwire from its
working directory first).

--churn: nothing is retained (no DATA at all), and four clients resume the one session over and
over, aborting each connection after its ACCEPT. Stop 26: each fresh connection's hello timer was
armed again after it handed its connection over, and kept it (~35 KiB) alive for hello_timeout
(30 s): 12,878 resumes in 15 s took the server from 33 to 395 MiB RSS, and the canary's worst
round trip from 0.4 to 1,059 ms (garbage-collector passes over the heap). After the fix, in the
same conditions: 18,414 resumes, 33 -> 35 MiB, worst round trip 10.9 ms (p99 2.0 ms either way;
the server is at 100 % of a core doing WebSocket handshakes, ~1 ms each).

    PYTHONPATH=. .venv/bin/python benchmarks/attack_resume_replay.py [--seconds 20] [--plain] [--churn]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import websockets

SERVER = """
import asyncio, sys
import m2mwire

async def echo(session):
    async for message in session:
        await session.send(message.text or "", algorithm=message.algorithm)

async def main():
    async with m2mwire.serve(echo, "ws://127.0.0.1:0", algorithms=["zstd", "none"]) as server:
        print(server.port, flush=True)
        await asyncio.Future()

asyncio.run(main())
"""


def hello(algorithms: list[str], resume: dict[str, Any]) -> str:
    compression: dict[str, Any] = {
        "algorithms": algorithms,
        "max_payload": 1 << 24,
        "encodings": ["Cl100kBase"],
    }
    if "zstd" in algorithms:
        compression["zstd"] = {"window": 1 << 20, "binary": True, "dictionaries": [], "history": False}
    payload = {
        "version": "3.0",
        "agent_id": str(uuid.uuid4()),
        "agent_type": "attacker",
        "compression": compression,
        "resume": resume,
    }
    return json.dumps({"type": "HELLO", "payload": payload, "timestamp": int(time.time() * 1000)})


def data(sid: str, content: str) -> str:
    payload = {"algorithm": "none", "content": content, "content_type": "text"}
    return json.dumps({"type": "DATA", "session_id": sid, "payload": payload, "timestamp": 0})


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kib / 1024


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def canary(url: str, seconds: float) -> list[float]:
    """Echo round trips of a plain session, one per 5 ms, for ``seconds``."""
    async with websockets.connect(url) as ws:
        await ws.send(hello(["none"], {"buffer": 1 << 20}))
        sid = json.loads(await ws.recv())["session_id"]
        rtts: list[float] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            start = time.monotonic()
            await ws.send(data(sid, f"canary {len(rtts)}"))
            while json.loads(await ws.recv()).get("type") != "DATA":
                pass
            rtts.append(time.monotonic() - start)
            await asyncio.sleep(0.005)
        return rtts


def summary(rtts: list[float]) -> str:
    ordered = sorted(rtts)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (
        f"{len(ordered)} round trips, p50 {statistics.median(ordered) * 1e3:.1f} ms, "
        f"p99 {p99 * 1e3:.1f} ms, max {ordered[-1] * 1e3:.1f} ms"
    )


async def attack(port: int, pid: int, seconds: float, algorithms: list[str], churn: bool) -> None:
    url = f"ws://127.0.0.1:{port}"
    ws = await websockets.connect(url, max_size=None)
    await ws.send(hello(algorithms, {"buffer": 1 << 24}))
    accept = json.loads(await ws.recv())
    sid, token = accept["session_id"], accept["payload"]["resume"]["token"]
    echoes = 0

    async def read_echoes() -> None:  # until the server's retention is full: it waits for ACKs
        nonlocal echoes
        while True:
            try:
                await asyncio.wait_for(ws.recv(), 3)
                echoes += 1
            except TimeoutError:
                return

    reader = asyncio.create_task(read_echoes())
    count = 0 if churn else int(16.2 * 2**20 // 166)
    for i in range(count):
        await ws.send(data(sid, f"{i:08d}xxxxxxxx"))
    await reader
    print(f"setup: {count} DATA sent, {echoes} echoes read, none acknowledged")
    ws.transport.abort()
    await asyncio.sleep(0.5)
    print("canary alone:     ", summary(await canary(url, 3)))
    rss0 = rss_mib(pid)

    stop = time.monotonic() + seconds
    resumes = 0

    superseded = 0

    async def resume_loop() -> None:
        nonlocal resumes, superseded
        while time.monotonic() < stop:
            async with websockets.connect(url, max_size=None) as raw:
                resume = {"buffer": 1 << 24, "session_id": sid, "token": token, "received": 0}
                await raw.send(hello(algorithms, resume))
                try:
                    answer = json.loads(await asyncio.wait_for(raw.recv(), 60))
                except websockets.ConnectionClosed:  # --churn: a parallel resume took over first
                    superseded += 1
                    continue
                assert answer["type"] == "ACCEPT", answer
                raw.transport.abort()
            resumes += 1

    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    loops = [asyncio.create_task(resume_loop()) for _ in range(4 if churn else 1)]
    rtts = await canary(url, seconds)
    await asyncio.gather(*loops)
    cpu, elapsed = cpu_seconds(pid) - cpu0, time.monotonic() - t0
    print("canary, attacked: ", summary(rtts))
    print(f"server RSS: {rss0:.0f} MiB before, {rss_mib(pid):.0f} MiB after")
    print(
        f"attack: {resumes} resumes ({superseded} more superseded) in {elapsed:.1f} s; "
        f"server CPU {cpu:.1f} s "
        f"({100 * cpu / elapsed:.0f} % of a core, {cpu / max(1, resumes) * 1e3:.0f} ms per resume)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--plain", action="store_true", help="algorithm none instead of zstd")
    parser.add_argument("--churn", action="store_true", help="resume over and over with nothing retained")
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        algorithms = ["none"] if args.plain else ["zstd", "none"]
        asyncio.run(attack(port, server.pid, args.seconds, algorithms, args.churn))
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
