"""An agent that answers: chat requests get a chat completion, hidden states get a transformed one.

python examples/server.py ws://127.0.0.1:8765        # or quic://127.0.0.1:4433
"""

from __future__ import annotations

import asyncio
import logging
import sys

import numpy as np

import m2mwire
from m2mwire.schemas.identity import ModelIdentity

# The model this agent runs. Agents with a compatible identity negotiate latent (AVP) mode.
IDENTITY = ModelIdentity(
    model_family="llama",
    model_id="meta-llama/Llama-3.2-1B",
    model_hash="5f0c1e2d3b4a59687766554433221100ffeeddccbbaa99887766554433221100",
    hidden_dim=2048,
    num_layers=16,
    num_kv_heads=8,
    head_dim=64,
)


async def agent(session: m2mwire.Session) -> None:
    info = session.info
    print(f"session {info.session_id}: {[a.value for a in info.algorithms]}, {info.encoding}, {info.mode}")
    async for message in session:
        if message.kind == "avp" and message.avp is not None:
            hidden = message.avp.tensor().astype(np.float32)
            await session.send(np.tanh(hidden))  # one more "layer", back in latent form
        elif message.kind == "json" and isinstance(message.value, dict) and "messages" in message.value:
            question = message.json()["messages"][-1].get("content", "")
            await session.send(
                {
                    "id": "chatcmpl-example",
                    "object": "chat.completion",
                    "model": message.value.get("model", "example"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": f"You asked: {question}"},
                            "finish_reason": "stop",
                        }
                    ],
                }
            )
        else:
            await session.send(f"received {message.original_bytes} bytes via {message.algorithm}")


async def main(url: str) -> None:
    async with m2mwire.serve(agent, url, identity=IDENTITY) as server:
        print(
            f"listening on {server.url}",
            f"(certificate sha256 {server.fingerprint})" if server.fingerprint else "",
        )
        await asyncio.Future()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "ws://127.0.0.1:8765"))
