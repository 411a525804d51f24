"""A planner agent: fans requests out to a worker, reads a streamed answer, sends a tensor.

python examples/planner.py ws://127.0.0.1:8766 s3cret
python examples/planner.py quic://127.0.0.1:4434 s3cret <server certificate sha256>
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np

import m2mwire

sys.path.insert(0, str(Path(__file__).resolve().parent))
from worker import IDENTITY  # the same model: latent mode is negotiated


async def main(url: str, token: str, fingerprint: str | None) -> None:
    options: dict[str, Any] = {"identity": IDENTITY, "token": token}
    if fingerprint:
        options["fingerprint"] = fingerprint
    try:
        await m2mwire.connect(url, **{**options, "token": "wrong"})
    except m2mwire.SessionRejected as exc:
        print(f"without the right token: {exc.code}")
    async with m2mwire.connect(url, **options) as session:
        # Many requests in flight on one session; each answer comes back to its own request.
        goals = ["restock Lyon", "reroute Hamburg", "audit Madrid"]
        plans = await asyncio.gather(
            *(session.request({"task": "plan", "goal": g}, timeout=10) for g in goals)
        )
        for goal, plan in zip(goals, plans, strict=True):
            print(f"plan for {goal}: {plan.json()['plan'][0]} ...")
        # A streamed answer: parts arrive as the worker produces them.
        words = []
        async for part in session.stream({"task": "chat", "pallets": 40, "city": "Lyon"}, timeout=10):
            words.append(part.json().get("delta", ""))
        print("streamed:", "".join(words).strip())
        # A hidden state with the caller's metadata in the AVP frame's extra map.
        hidden = np.random.default_rng(0).standard_normal(IDENTITY.hidden_dim).astype(np.float32)
        answer = await session.request(hidden, extra={"layer": "8"}, timeout=10)
        assert answer.avp is not None
        print(f"latent answer {answer.avp.tensor().shape}, extra {dict(sorted(answer.extra.items()))}")


if __name__ == "__main__":
    asyncio.run(
        main(
            sys.argv[1] if len(sys.argv) > 1 else "ws://127.0.0.1:8766",
            sys.argv[2] if len(sys.argv) > 2 else "s3cret",
            sys.argv[3] if len(sys.argv) > 3 else None,
        )
    )
