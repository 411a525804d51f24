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
from websockets.asyncio.client import connect as ws_connect
from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve

from m2mwire.api import Session, connect, serve
from m2mwire.codecs import Algorithm, Encoding, decode_wire

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


async def test_reference_peer_negotiating_only_m2m_interoperates(m2m_vectors: dict[str, Any]) -> None:
    """Issue 12.6: the reference's ACCEPT offering only m2m; its frames (text and binary) are read and
    what the client sends is the reference's own frame, byte for byte."""
    vectors = m2m_vectors["m2m_frames"]
    accept = reference_accept(m2m_vectors, algorithms=["m2m"])

    async def send_reference_frames(ws: ServerConnection) -> None:
        for vector in vectors:
            payload = {"algorithm": "m2m", "content": vector["wire_string"]}
            data = {"type": "DATA", "session_id": accept["session_id"], "payload": payload, "timestamp": 1}
            await ws.send(json.dumps(data, separators=(",", ":")))
        await ws.send(bytes.fromhex(vectors[0]["binary_hex"]))

    async with reference_peer(accept, send_reference_frames) as peer:
        async with connect(peer.url) as client:  # default options: m2m is among them
            assert client.info.algorithms == (Algorithm.M2M,)
            got = [await asyncio.wait_for(client.recv(), TIMEOUT) for _ in range(len(vectors) + 1)]
            assert [m.text for m in got] == [v["input"] for v in vectors] + [vectors[0]["input"]]
            assert {m.algorithm for m in got} == {"m2m"} and got[-1].binary
            for vector in vectors:
                await client.send(vector["input"])
        await asyncio.wait_for(peer.done.wait(), TIMEOUT)
    assert peer.received == [v["wire_string"] for v in vectors]


async def test_server_answers_a_reference_client_offering_only_m2m(m2m_vectors: dict[str, Any]) -> None:
    vectors = m2m_vectors["m2m_frames"]

    async def echo(session: Session) -> None:
        async for message in session:
            await session.send(message.text or "")

    hello = json.loads(m2m_vectors["msg_hello_raw"])
    hello["payload"]["compression"]["algorithms"] = ["m2m"]
    async with serve(echo, "ws://127.0.0.1:0") as server:
        async with ws_connect(server.url, compression=None) as ws:
            await ws.send(json.dumps(hello))
            accept = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
            assert accept["type"] == "ACCEPT"
            assert accept["payload"]["compression"]["algorithms"] == ["m2m"]
            for vector in vectors:
                data = {"algorithm": "m2m", "content": vector["wire_string"]}
                envelope = {"type": "DATA", "session_id": accept["session_id"], "payload": data}
                await ws.send(json.dumps({**envelope, "timestamp": 1}))
                reply = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
                assert reply["payload"]["algorithm"] == "m2m"
                assert reply["payload"]["content"] == vector["wire_string"]
