"""A worker process for the NATS tests: serves URL (argv[1]), answers each text with "<pid>:<text>"
and prints "ready" once its subscriptions are in place."""

from __future__ import annotations

import asyncio
import os
import sys

import m2mwire
from m2mwire.api import Session


async def main(url: str) -> None:
    async def handler(session: Session) -> None:
        async for message in session:
            await session.send(f"{os.getpid()}:{message.text}", algorithm="none")

    async with m2mwire.serve(handler, url, agent_id=f"worker-{os.getpid()}"):
        print("ready", flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
