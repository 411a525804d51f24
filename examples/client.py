"""An agent that sends chat payloads with several algorithms and a hidden state in latent mode.

python examples/client.py ws://127.0.0.1:8765
python examples/client.py quic://127.0.0.1:4433 <server certificate sha256>
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np

import m2mwire

sys.path.insert(0, str(Path(__file__).resolve().parent))
from server import IDENTITY  # same model as the server agent: latent mode is negotiated

REQUEST = {
    "model": "gpt-4o",
    "messages": [
        {"role": "system", "content": "You are a terse assistant for a logistics agent."},
        {"role": "user", "content": "Which warehouse can ship 40 pallets to Lyon by Friday?"},
    ],
    "temperature": 0.2,
}


async def main(url: str, fingerprint: str | None) -> None:
    options: dict[str, Any] = {"identity": IDENTITY, "token_stats": True}
    if fingerprint:
        options["fingerprint"] = fingerprint
    async with m2mwire.connect(url, **options) as session:
        info = session.info
        algorithms = [a.value for a in info.algorithms]
        print(f"negotiated {algorithms} / {info.encoding} / {info.mode} ({info.mode_reason})")
        for algorithm in (None, "tokennative", "token", "brotli"):
            sent = await session.send(REQUEST, algorithm=algorithm)
            reply = await session.recv()
            answer = reply.json()["choices"][0]["message"]  # json(): untyped access; .value is typed
            print(
                f"{sent.algorithm:12} {sent.original_bytes:5} -> {sent.wire_bytes:5} bytes, "
                f"{sent.original_tokens} -> {sent.wire_tokens} tokens; reply: {answer}"
            )
        if info.mode == "LATENT":
            hidden = np.random.default_rng(0).standard_normal(IDENTITY.hidden_dim).astype(np.float32)
            sent = await session.send(hidden)
            reply = await session.recv()
            assert reply.avp is not None
            print(f"hidden state: {sent.wire_bytes} bytes as AVP; reply tensor {reply.avp.tensor().shape}")
        print(session.stats)


if __name__ == "__main__":
    asyncio.run(
        main(
            sys.argv[1] if len(sys.argv) > 1 else "ws://127.0.0.1:8765",
            sys.argv[2] if len(sys.argv) > 2 else None,
        )
    )
