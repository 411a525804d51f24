"""Live interop with a peer that speaks like the Rust reference 0.4 (m2m-reference.md §2).

The peer is a minimal hand-written server over real websockets: it answers HELLO with the reference's
own ACCEPT (its full capabilities, from the vectors file), records every DATA content it receives,
and answers CLOSE with the reference's empty ``{}``. What the client puts on the wire is checked here,
byte for byte where the reference's output is known.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve

from m2mwire.api import Session, connect, serve
from m2mwire.codecs import Encoding, decode_wire

TIMEOUT = 10.0


@dataclass
class ReferencePeer:
    url: str
    received: list[str] = field(default_factory=list)  # DATA contents, as sent
    done: asyncio.Event = field(default_factory=asyncio.Event)


@asynccontextmanager
async def reference_peer(
    accept: dict[str, Any], after_accept: Callable[[ServerConnection], Any] | None = None
) -> AsyncIterator[ReferencePeer]:
    """A one-session server answering HELLO with ``accept`` (a reference ACCEPT envelope)."""
    peer = ReferencePeer(url="")

    async def session(ws: ServerConnection) -> None:
        try:
            hello = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
            assert hello["type"] == "HELLO"
            await ws.send(json.dumps(accept, separators=(",", ":")))
            if after_accept is not None:
                await after_accept(ws)
            for _ in range(100):  # bounded: the tests send a handful of messages
                msg = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
                if msg["type"] == "DATA":
                    peer.received.append(msg["payload"]["content"])
                elif msg["type"] == "CLOSE":
                    close = {"type": "CLOSE", "session_id": accept["session_id"], "payload": {}}
                    await ws.send(json.dumps({**close, "timestamp": 1}))
                    break
        finally:
            peer.done.set()

    async with ws_serve(session, "127.0.0.1", 0, compression=None) as server:
        peer.url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        yield peer


def reference_accept(vectors: dict[str, Any], **compression: Any) -> dict[str, Any]:
    accept: dict[str, Any] = json.loads(vectors["msg_accept_raw"])
    accept["payload"]["compression"].update(compression)
    return accept


TEXT = "Tokenizers differ: naïve café, 12345 tokens — and a long enough sentence to be compressed."


@pytest.mark.parametrize(
    "encodings",
    [
        ["Cl100kBase"],  # issue 12.3: the documented fallback, as the single negotiated encoding
        ["Cl100kBase", "O200kBase"],  # the reference's own full capabilities
    ],
)
async def test_client_offering_only_llama3_sends_the_encoding_accept_names(
    m2m_vectors: dict[str, Any], encodings: list[str]
) -> None:
    accept = reference_accept(
        m2m_vectors, algorithms=["tokennative"], encodings=encodings, preferred_encoding="Cl100kBase"
    )
    async with reference_peer(accept) as peer:
        async with connect(peer.url, algorithms=["tokennative"], encodings=["llama3"]) as client:
            assert client.info.encoding is Encoding.CL100K
            await client.send(TEXT, algorithm="tokennative")
        await asyncio.wait_for(peer.done.wait(), TIMEOUT)
    (wire,) = peer.received
    # A reference peer reads L as cl100k ids (m2m-reference.md §1.2); a peer without Llama 3 cannot
    # read L at all. What went out must be cl100k, announced as such.
    assert wire.startswith("#TK|C|")
    assert decode_wire(wire).content == TEXT


async def test_client_follows_a_server_that_lacks_its_encoding() -> None:
    seen: list[tuple[Encoding, str | None]] = []

    async def handler(session: Session) -> None:
        message = await session.recv()
        seen.append((session.info.encoding, message.text))

    async with serve(handler, "ws://127.0.0.1:0", encodings=["cl100k_base"]) as server:
        async with connect(server.url, algorithms=["tokennative"], encodings=["llama3"]) as client:
            assert client.info.encoding is Encoding.CL100K
            await client.send(TEXT, algorithm="tokennative")
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.05)
    assert seen == [(Encoding.CL100K, TEXT)]
