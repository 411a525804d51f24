"""A worker agent behind admission: answers requests, streams chat chunks, transforms tensors.

python examples/worker.py ws://127.0.0.1:8766 s3cret      # or quic://127.0.0.1:4434 s3cret

Clients must present the token (``connect(url, token=...)``); at most 8 sessions per client host.
Requests with {"task": "plan"} get one answer; {"task": "chat"} gets a stream of chunks; a hidden
state (latent mode) gets the next "layer" back, with the caller's ``extra`` metadata echoed.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import sys
from collections.abc import Awaitable, Callable

import numpy as np

import m2mwire
from m2mwire.schemas.identity import ModelIdentity

IDENTITY = ModelIdentity(
    model_family="llama",
    model_id="meta-llama/Llama-3.2-1B",
    model_hash="5f0c1e2d3b4a59687766554433221100ffeeddccbbaa99887766554433221100",
    hidden_dim=2048,
    num_layers=16,
)


def make_check(token: str) -> Callable[[m2mwire.Hello], Awaitable[None]]:
    async def check(hello: m2mwire.Hello) -> None:
        # compare_digest: the time taken does not tell an attacker how much of the token matched
        if hello.token is None or not hmac.compare_digest(hello.token, token):
            raise m2mwire.Reject("SECURITY_POLICY", "a valid token is required (connect(url, token=...))")

    return check


async def answer(session: m2mwire.Session, message: m2mwire.Message) -> None:
    if message.kind == "avp" and message.avp is not None:
        layer = np.tanh(message.avp.tensor().astype(np.float32))
        await session.reply(message, layer, extra={**message.extra, "worker": "tanh"})
        return
    request = message.json()
    if request.get("task") == "chat":
        words = f"Shipping {request['pallets']} pallets to {request['city']} is possible by Friday.".split()
        for word in words:  # one chunk per word, as a chat-completion stream would
            await session.reply(message, {"delta": word + " "}, more=True)
        await session.reply(message, {"finish_reason": "stop"})
    else:
        await session.reply(message, {"plan": [f"step {i} of {request.get('goal', '?')}" for i in range(3)]})


async def agent(session: m2mwire.Session) -> None:
    tasks: set[asyncio.Task[None]] = set()
    async for message in session:
        if message.request_id is None:
            continue  # this worker only answers requests
        task = asyncio.create_task(answer(session, message))  # answer concurrently, in any order
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def main(url: str, token: str) -> None:
    async with m2mwire.serve(
        agent, url, identity=IDENTITY, on_hello=make_check(token), max_sessions_per_peer=8
    ) as server:
        print(
            f"listening on {server.url}",
            f"(certificate sha256 {server.fingerprint})" if server.fingerprint else "",
            flush=True,
        )
        await asyncio.Future()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    url = sys.argv[1] if len(sys.argv) > 1 else "ws://127.0.0.1:8766"
    asyncio.run(main(url, sys.argv[2] if len(sys.argv) > 2 else "s3cret"))
