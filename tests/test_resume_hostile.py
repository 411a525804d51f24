"""Resume against hostile or racing clients (stop 24's attack run; docs/PROTOCOL.md §9 "Bounds"):
a resume of a session that is closing, and resumes over and over with nothing acknowledged."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

import websockets

import m2mwire
from m2mwire.api import Session
from m2mwire.reconnect import Reconnect

FAST = Reconnect(initial_delay=0.01, max_delay=0.1, max_elapsed=20.0)


def hello(resume: dict[str, Any]) -> str:
    """A HELLO offering resume, as a client writes it (docs/PROTOCOL.md §9), by hand."""
    payload: dict[str, Any] = {
        "version": "3.0",
        "agent_id": str(uuid.uuid4()),
        "agent_type": "test",
        "compression": {"algorithms": ["none"], "max_payload": 1 << 20, "encodings": ["Cl100kBase"]},
        "resume": resume,
    }
    return json.dumps({"type": "HELLO", "payload": payload, "timestamp": int(time.time() * 1000)})


def resuming_hello(session_id: str, token: str, received: int) -> str:
    return hello({"buffer": 1 << 20, "session_id": session_id, "token": token, "received": received})


async def bounded(condition: Any, seconds: float, what: str) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.01)
    assert condition(), what


async def test_a_session_that_is_closing_cannot_be_resumed() -> None:
    """A resuming HELLO (right token) that arrived while the session was closing was handed the
    session anyway: attach() then failed in a callback, and the fresh connection stayed open with
    no answer and no timer (20 of them raised a server's descriptors from 7 to 47). It gets REJECT
    RESUME_UNKNOWN now."""
    release = asyncio.Event()

    async def busy(session: Session) -> None:  # never reads: the CLOSE waits for close_timeout
        await asyncio.wait_for(release.wait(), 30)

    async with m2mwire.serve(busy, "ws://127.0.0.1:0") as server:
        client = await m2mwire.connect(server.url, reconnect=FAST)
        resume = client._protocol.resume
        assert resume is not None
        sid, token = client.info.session_id, resume.token
        closing = asyncio.create_task(client.close())
        await asyncio.sleep(0.2)  # the server has the CLOSE; its handler has not read it
        async with websockets.connect(server.url, open_timeout=5) as raw:
            await raw.send(resuming_hello(sid, token, 0))
            answer = json.loads(await asyncio.wait_for(raw.recv(), 5))
        assert answer["type"] == "REJECT" and answer["payload"]["code"] == "RESUME_UNKNOWN"
        assert "closing" in answer["payload"]["message"]
        release.set()
        await asyncio.wait_for(closing, 10)


async def test_a_replay_right_after_a_replay_waits_for_the_budget_and_loses_nothing() -> None:
    """Each resume encodes again everything unacknowledged; a client that never acknowledged and
    resumed in a loop made the server do that back to back (100% of a core, other sessions' round
    trips 0.5 -> 93 ms). The second full replay in a row now waits (at most hello_timeout / 2),
    and still sends every message once, in order."""
    count, size = 200, 5_000  # ~1 MB: the server's whole retention buffer of 1 MiB
    sent = asyncio.Event()

    async def flood(session: Session) -> None:
        for i in range(count):
            await session.send(f"{i:05d}".ljust(size, "x"))
        sent.set()
        await asyncio.sleep(30)

    async def replayed(raw: Any) -> list[int]:
        """The DATA messages a resumed connection gets (after its ACCEPT): their numbers."""
        got: list[int] = []
        while len(got) < count:
            message = json.loads(await asyncio.wait_for(raw.recv(), 10))
            if message["type"] == "DATA":
                got.append(int(message["payload"]["content"][:5]))
        return got

    options: dict[str, Any] = {"resume_buffer_bytes": 1 << 20, "timers": {"hello_timeout": 2.0}}
    async with m2mwire.serve(flood, "ws://127.0.0.1:0", **options) as server:
        # A raw client that reads everything and acknowledges nothing.
        async with websockets.connect(server.url, max_size=None) as first:
            await first.send(hello({"buffer": 1 << 20}))
            accept = json.loads(await asyncio.wait_for(first.recv(), 5))
            assert accept["type"] == "ACCEPT"
            sid, token = accept["session_id"], accept["payload"]["resume"]["token"]
            await asyncio.wait_for(sent.wait(), 10)
        for attempt in range(2):
            async with websockets.connect(server.url, max_size=None) as raw:
                await raw.send(resuming_hello(sid, token, 0))
                if attempt:
                    waiting = server._waiting_resumes
                    await bounded(lambda: sid in waiting, 5, "the second replay waits for its budget")  # noqa: B023
                answer = json.loads(await asyncio.wait_for(raw.recv(), 5))
                assert answer["type"] == "ACCEPT", answer
                assert await replayed(raw) == list(range(count))
