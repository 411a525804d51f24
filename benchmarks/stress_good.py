"""Good sessions for ``stress_hostile.py``, in their own process (so the attacker's CPU does not show
up as their stalls): each sends a small JSON request, waits for its echo, and records the worst
round trip, until a line arrives on standard input. Then it prints one JSON result line.

    python benchmarks/stress_good.py URL [--sessions 2] [--fingerprint FP]

Prints ``{"ready": true}`` once every session is established. The result: per session, requests
sent, echoes received, the worst round trip (a request still unanswered at the end counts with its
age), and the error that ended the session early, if any.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from typing import Any

import m2mwire

REQUEST_TIMEOUT = 30.0  # a request unanswered this long ends the session's loop (recorded as lost)
DRAIN_TIMEOUT = 5.0  # after "stop", how long the request in flight may still take


class Good:
    def __init__(self, index: int) -> None:
        self.index = index
        self.sent = 0
        self.received = 0
        self.worst = 0.0
        self.error = ""
        self.pending_since: float | None = None

    def result(self) -> dict[str, Any]:
        worst = self.worst
        if self.pending_since is not None:
            worst = max(worst, time.monotonic() - self.pending_since)
        return {"sent": self.sent, "received": self.received, "worst_s": worst, "error": self.error}


async def run_one(good: Good, session: m2mwire.Session, stop: asyncio.Event, interval: float) -> None:
    pad = "x" * 64
    try:
        while not stop.is_set():
            started = good.pending_since = time.monotonic()
            seq = good.sent
            good.sent += 1
            await session.send({"seq": seq, "pad": pad})
            limit = REQUEST_TIMEOUT if not stop.is_set() else DRAIN_TIMEOUT
            reply = await asyncio.wait_for(session.recv(), limit)
            if reply.json().get("seq") != seq:
                good.error = f"echo out of order: got {reply.json().get('seq')}, expected {seq}"
                return
            good.received += 1
            good.pending_since = None
            good.worst = max(good.worst, time.monotonic() - started)
            await asyncio.sleep(interval)
    except Exception as exc:
        good.error = f"{type(exc).__name__}: {exc}"[:200]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--fingerprint")
    parser.add_argument("--interval", type=float, default=0.005)
    args = parser.parse_args()
    options: dict[str, Any] = {"algorithms": ["none"]}
    if args.fingerprint:
        options["fingerprint"] = args.fingerprint
    sessions = [
        await m2mwire.connect(args.url, agent_id=f"echo-good-{i}", **options) for i in range(args.sessions)
    ]
    goods = [Good(i) for i in range(args.sessions)]
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(run_one(g, s, stop, args.interval)) for g, s in zip(goods, sessions, strict=True)
    ]
    print(json.dumps({"ready": True}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    stop.set()
    await asyncio.wait(tasks, timeout=DRAIN_TIMEOUT + 1)
    print(json.dumps({"sessions": [g.result() for g in goods]}), flush=True)
    for s in sessions:
        with contextlib.suppress(Exception):  # the session may be gone already: best effort
            await asyncio.wait_for(s.close(), 2)


if __name__ == "__main__":
    asyncio.run(main())
