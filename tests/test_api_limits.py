"""The negotiated max_payload bounds the decoded content, on both sides of a real session.

Issue 12.4: with max_payload 4096 the receiver accepted a 40-byte Brotli wire that decodes to 15,000
bytes, while the sender refused the same content. Now both bound the decoded content: the sender
refuses before sending, the receiver closes with MESSAGE_TOO_BIG (WebSocket 1009) and delivers
nothing. Issues 11.16 and 11.18 over the same real session: a HELLO nested 1,000 levels deep is
answered with a REJECT, and send() refuses JSON the peer would refuse, before sending.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from m2mwire.api import Session, connect, serve
from m2mwire.codecs.compressed import encode_brotli
from m2mwire.errors import EncodeError, LimitExceeded, TransportError

LIMIT = 4096


def _hello(algorithms: list[str], **extra: Any) -> str:
    payload: dict[str, Any] = {
        "version": "3.0",
        "agent_id": "raw",
        "agent_type": "raw",
        "compression": {"algorithms": algorithms, "max_payload": 0},
        **extra,
    }
    return json.dumps({"type": "HELLO", "payload": payload, "timestamp": 1})


async def test_receiver_refuses_content_decoding_past_max_payload() -> None:
    received: list[Any] = []

    async def handler(session: Session) -> None:
        try:
            while True:
                received.append(await session.recv())
        except Exception:
            return

    wire = encode_brotli("a" * 15_000)
    assert len(wire) < 64  # a few dozen bytes on the wire, 15,000 once decoded
    async with serve(handler, "ws://127.0.0.1:0", max_payload=LIMIT) as server:
        async with ws_connect(server.url, compression=None) as ws:
            await ws.send(_hello(["brotli", "none"]))
            accept = json.loads(await ws.recv())
            assert accept["type"] == "ACCEPT"
            data = {"algorithm": "brotli", "content": wire}
            await ws.send(
                json.dumps(
                    {"type": "DATA", "session_id": accept["session_id"], "payload": data, "timestamp": 1}
                )
            )
            close = json.loads(await asyncio.wait_for(ws.recv(), 5))
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
            assert ws.close_code == 1009
    assert close["type"] == "CLOSE" and close["payload"]["reason"] == "MESSAGE_TOO_BIG"
    assert "max_payload" in close["payload"]["message"] and str(LIMIT) in close["payload"]["message"]
    assert received == []


async def test_sender_refuses_the_same_content_and_the_limit_itself_travels_both_ways() -> None:
    async def echo(session: Session) -> None:
        try:
            while True:
                message = await session.recv()
                assert message.text is not None
                await session.send(message.text, algorithm="brotli")
        except Exception:
            return

    async with serve(echo, "ws://127.0.0.1:0", max_payload=LIMIT) as server:
        async with connect(server.url) as session:
            assert session.info.max_payload == LIMIT
            with pytest.raises(LimitExceeded, match="max_payload"):
                await session.send("a" * 15_000, algorithm="brotli")
            await session.send("a" * LIMIT, algorithm="brotli")  # exactly the limit, decoded
            reply = await asyncio.wait_for(session.recv(), 5)
            assert reply.text == "a" * LIMIT


async def test_deeply_nested_hello_is_rejected_with_a_reason() -> None:
    async def handler(session: Session) -> None:
        return

    depth = 1_000
    text = _hello(["none"]).replace(
        '"timestamp": 1}', '"x": ' + "[" * depth + "1" + "]" * depth + ', "timestamp": 1}'
    )
    async with serve(handler, "ws://127.0.0.1:0") as server:
        async with ws_connect(server.url, compression=None) as ws:
            await ws.send(text)
            reject = json.loads(await asyncio.wait_for(ws.recv(), 5))
            with pytest.raises(ConnectionClosed):
                await asyncio.wait_for(ws.recv(), 5)
    assert reject["type"] == "REJECT"
    assert "nested" in reject["payload"]["message"]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        pytest.param(json.loads("[" * 40 + "]" * 40), "max_json_depth=32", id="nested-40"),
        pytest.param(list(range(10_001)), "max_array_elements=10000", id="array-10001"),
    ],
)
async def test_send_checks_the_limits_the_receiver_enforces(content: Any, match: str) -> None:
    got: list[Any] = []

    async def handler(session: Session) -> None:
        try:
            while True:
                got.append((await session.recv()).json())
        except Exception:
            return

    async with serve(handler, "ws://127.0.0.1:0") as server:
        async with connect(server.url) as session:
            with pytest.raises(LimitExceeded, match=match):
                await session.send(content)
            await session.send({"still": "open"})  # nothing was sent: the session goes on
            await asyncio.sleep(0.2)
    assert got == [{"still": "open"}]


async def test_send_of_a_circular_value_is_an_encode_error() -> None:
    async def handler(session: Session) -> None:
        try:
            while True:
                await session.recv()
        except Exception:
            return

    circular: dict[str, Any] = {}
    circular["self"] = circular
    async with serve(handler, "ws://127.0.0.1:0") as server:
        async with connect(server.url) as session:
            with pytest.raises(EncodeError, match=r"circular|nested"):
                await session.send(circular)


async def _echo(session: Session) -> None:
    async for message in session:
        await session.send(message.text or "")


@pytest.mark.parametrize("scheme", ["ws", "quic"])
async def test_a_server_announcing_no_max_payload_keeps_its_own_limit(scheme: str) -> None:
    """serve(max_payload=0) negotiated the client's max_payload, whatever it was: a client
    announcing 1 GiB had a 256 MiB message buffered and delivered (stop 30's attack run). The
    server now negotiates its own limit, Limits.max_message_bytes (16 MiB), and says so in ACCEPT."""
    async with serve(_echo, f"{scheme}://127.0.0.1:0", max_payload=0) as server:
        opts = {"fingerprint": server.fingerprint} if server.fingerprint else {}
        async with connect(server.url, max_payload=1 << 30, algorithms=["none"], **opts) as session:
            assert session.info.max_payload == 16 * 1024 * 1024
            with pytest.raises(LimitExceeded):
                await session.send("x" * (16 * 1024 * 1024 + 1))


async def test_a_client_announcing_no_max_payload_keeps_its_own_limit() -> None:
    """connect(max_payload=0) took the server's max_payload as its limit, whatever it was: a
    server offering 1 GiB could send it that much. The client keeps Limits.max_message_bytes."""
    big = "y" * (17 * 1024 * 1024)

    async def sends_big(session: Session) -> None:
        with contextlib.suppress(Exception):  # the client refuses it and closes
            await session.send(big)
            await session.recv()

    async with serve(sends_big, "ws://127.0.0.1:0", max_payload=1 << 30) as server:
        async with connect(server.url, max_payload=0, algorithms=["none"]) as session:
            assert session.info.max_payload == 1 << 30  # what the server announced ...
            with pytest.raises(TransportError) as info:  # ... but the client reads at most its own
                await asyncio.wait_for(session.recv(), 20)
            assert info.value.code == 1009  # refused by its channel, before buffering


async def test_a_quic_session_allowing_more_than_a_frame_holds_is_established() -> None:
    """A QUIC channel's limit cannot exceed its frame length field (4 GiB - 1): a session that
    negotiated more (max_payload=5 GiB on both ends) made the channel raise ValueError when the
    session set its limit, and the server logged a traceback and reset the stream."""
    five_gib = 5 << 30
    async with serve(_echo, "quic://127.0.0.1:0", max_payload=five_gib) as server:
        async with connect(
            server.url, fingerprint=server.fingerprint, max_payload=five_gib, algorithms=["none"]
        ) as session:
            assert session.info.max_payload == five_gib
            await session.send("within every limit")
            assert (await asyncio.wait_for(session.recv(), 10)).text == "within every limit"
