"""Requests and streams on a session (Session.request/stream/reply), over WebSocket and QUIC."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import numpy as np
import pytest
import websockets

from m2mwire.api import Session, connect
from m2mwire.errors import EncodeError, SessionClosed, SessionTimeout
from m2mwire.schemas.identity import ModelIdentity
from tests.test_api import (
    client_opts,
    running,
    scheme,  # noqa: F401 (the ws/quic/nats fixture)
)

IDENT = ModelIdentity(
    model_family="llama", model_id="tiny", model_hash="ab" * 32, hidden_dim=16, num_layers=2
)


async def answering(session: Session) -> None:
    """Answers requests out of order (random delays) and echoes plain messages with a tag."""
    tasks: set[asyncio.Task[None]] = set()

    async def answer(message: Any) -> None:
        value = message.json()
        await asyncio.sleep(random.random() * 0.02)
        if value.get("parts"):
            for i in range(value["parts"]):
                await session.reply(message, {"part": i, "of": value["n"]}, more=True)
            await session.reply(message, {"done": value["n"]})
        else:
            await session.reply(message, {"answer": value["n"] * 2})

    async for message in session:
        if message.request_id is not None:
            task = asyncio.create_task(answer(message))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        else:
            await session.send({"plain": message.json()})


async def test_concurrent_requests_get_their_own_answers(scheme: str) -> None:
    random.seed(7)
    async with running(answering, scheme) as server:
        async with connect(server.url, **client_opts(server)) as session:
            replies = await asyncio.gather(*(session.request({"n": n}, timeout=10) for n in range(50)))
            assert [r.json() for r in replies] == [{"answer": 2 * n} for n in range(50)]
            assert all(r.reply_to is not None and r.request_id is None for r in replies)
            # Plain messages still flow through recv(), and answers never show up there.
            await session.send({"x": 1})
            plain = await asyncio.wait_for(session.recv(), 5)
            assert plain.json() == {"plain": {"x": 1}}


async def test_stream_yields_every_part_then_ends(scheme: str) -> None:
    async with running(answering, scheme) as server:
        async with connect(server.url, **client_opts(server)) as session:
            first, second = await asyncio.gather(
                _collect(session, {"n": 1, "parts": 30}), _collect(session, {"n": 2, "parts": 5})
            )
            assert first == [{"part": i, "of": 1} for i in range(30)] + [{"done": 1}]
            assert second == [{"part": i, "of": 2} for i in range(5)] + [{"done": 2}]


async def _collect(session: Session, content: dict[str, Any]) -> list[Any]:
    parts = []
    async for part in session.stream(content, timeout=10):
        parts.append(part.json())
    return parts


async def test_request_timeout_drops_the_late_answer(scheme: str) -> None:
    release = asyncio.Event()

    async def slow(session: Session) -> None:
        async for message in session:
            if message.request_id is not None:
                await release.wait()
                await session.reply(message, "late")
                await session.send("after")

    async with running(slow, scheme) as server:
        async with connect(server.url, **client_opts(server)) as session:
            with pytest.raises(SessionTimeout) as info:
                await session.request("slow?", timeout=0.2)
            assert isinstance(info.value, TimeoutError)
            release.set()
            # The late answer is dropped: the next message recv() sees is the plain one after it.
            message = await asyncio.wait_for(session.recv(), 5)
            assert message.text == "after"


async def test_pending_request_fails_when_the_session_ends(scheme: str) -> None:
    async def closer(session: Session) -> None:
        await session.recv()
        await session.close("bye")

    async with running(closer, scheme) as server:
        async with connect(server.url, **client_opts(server)) as session:
            with pytest.raises(SessionClosed):
                await asyncio.wait_for(session.request("never answered"), 10)


async def test_reply_to_a_plain_message_is_refused(scheme: str) -> None:
    errors: list[Exception] = []

    async def handler(session: Session) -> None:
        message = await session.recv()
        try:
            await session.reply(message, "no")
        except EncodeError as exc:
            errors.append(exc)
        await session.send("done")

    async with running(handler, scheme) as server:
        async with connect(server.url, **client_opts(server)) as session:
            await session.send("plain")
            assert (await asyncio.wait_for(session.recv(), 5)).text == "done"
    assert errors and "request_id is None" in str(errors[0])


async def test_tensor_requests_carry_extra_and_correlation(scheme: str) -> None:
    seen: list[dict[str, str]] = []

    async def latent(session: Session) -> None:
        async for message in session:
            assert message.avp is not None and message.request_id is not None
            seen.append(dict(message.avp.metadata.extra))
            tensor = message.avp.tensor()
            await session.reply(message, tensor * 2, extra={"scaled": "2"})

    async with running(latent, scheme, identity=IDENT) as server:
        async with connect(server.url, identity=IDENT, **client_opts(server)) as session:
            hidden = np.arange(16, dtype=np.float32)
            answer = await session.request(hidden, extra={"layer": "7"}, timeout=10)
            assert answer.avp is not None
            np.testing.assert_array_equal(answer.avp.tensor(), hidden * 2)
            assert answer.avp.metadata.extra["scaled"] == "2"
            # A plain send with extra= puts it in the frame too, and is no request.
            await session.send(hidden, extra={"request_id": "mine"})
    assert seen[0]["layer"] == "7"


async def test_user_extra_request_id_is_user_data(scheme: str) -> None:
    got: list[Any] = []

    async def latent(session: Session) -> None:
        message = await session.recv()
        got.append(message)

    async with running(latent, scheme, identity=IDENT) as server:
        async with connect(server.url, identity=IDENT, **client_opts(server)) as session:
            await session.send(np.zeros(16, dtype=np.float32), extra={"request_id": "mine"})
            for _ in range(100):
                if got:
                    break
                await asyncio.sleep(0.02)
    assert got and got[0].request_id is None
    assert got[0].avp.metadata.extra["request_id"] == "mine"


async def test_correlation_fields_on_the_wire_and_ignored_by_plain_peers() -> None:
    """The fields are documented JSON in the DATA payload; a peer that knows none of them (here
    raw websockets speaking the protocol by hand) still reads the content."""
    async with running(answering, "ws") as server:
        async with websockets.connect(server.url) as ws:
            hello = {
                "type": "HELLO",
                "payload": {
                    "version": "3.0",
                    "agent_id": "raw",
                    "agent_type": "raw",
                    "compression": {"algorithms": ["none"], "max_payload": 0},
                },
                "timestamp": 1,
            }
            await ws.send(json.dumps(hello))
            accept = json.loads(await ws.recv())
            sid = accept["session_id"]
            data = {
                "type": "DATA",
                "session_id": sid,
                "payload": {
                    "algorithm": "none",
                    "content": '{"n":21}',
                    "content_type": "json",
                    "request_id": "r1",
                },
                "timestamp": 2,
            }
            await ws.send(json.dumps(data))
            answer = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert answer["type"] == "DATA"
            assert answer["payload"]["reply_to"] == "r1"
            assert answer["payload"]["more"] is False
            assert json.loads(answer["payload"]["content"]) == {"answer": 42}


async def test_reserved_extra_keys_are_refused_and_hidden(scheme: str) -> None:
    got: list[Any] = []

    async def latent(session: Session) -> None:
        async for message in session:
            got.append(message)
            await session.reply(message, np.ones(16, dtype=np.float32))

    async with running(latent, scheme, identity=IDENT) as server:
        async with connect(server.url, identity=IDENT, **client_opts(server)) as session:
            with pytest.raises(EncodeError, match="reserved"):
                await session.send(np.zeros(16, dtype=np.float32), extra={"m2mwire.request_id": "x"})
            answer = await session.request(np.zeros(16, dtype=np.float32), extra={"k": "v"}, timeout=10)
    assert got[0].extra == {"k": "v"}  # the correlation keys stay out of the application's view
    assert "m2mwire.request_id" in got[0].avp.metadata.extra
    assert answer.extra == {}


async def test_unread_stream_parts_count_toward_max_queue_bytes(scheme: str) -> None:
    part = "x" * (256 * 1024)

    async def streamer(session: Session) -> None:
        async for message in session:
            for _ in range(40):
                # algorithm none: the wire is as large as the content, so what the transport
                # read before the pause took effect is bounded by its read size
                await session.reply(message, part, more=True, algorithm="none")
            await session.reply(message, "end")

    async with running(streamer, scheme) as server:
        async with connect(server.url, max_queue_bytes=1024 * 1024, **client_opts(server)) as session:
            parts = session.stream("go", timeout=10)
            first = await anext(parts)
            assert first.text == part
            await asyncio.sleep(0.5)  # the consumer lags: reading must pause on bytes, not on count
            held = session._correlator.buffered_bytes
            assert held <= 3 * 1024 * 1024, held  # 1 MiB bound + what the transport had read
            rest = [p.text async for p in parts]
    assert len(rest) == 40 and rest[-1] == "end"


async def test_stream_parts_and_plain_messages_share_one_bound(scheme: str) -> None:
    """Replies waiting for their requester and the inbox share max_queue / max_queue_bytes
    (PROTOCOL.md "Resource bounds"), but reading paused when either alone reached it: a peer
    interleaving stream parts and plain messages got about twice the bound decoded and held
    (stop 32's review)."""
    part = "x" * (256 * 1024)

    async def interleaving(session: Session) -> None:
        async for message in session:
            if message.request_id is None:
                continue
            for _ in range(12):
                await session.reply(message, part, more=True, algorithm="none")
                await session.send(part, algorithm="none")
            await session.reply(message, "end")

    async with running(interleaving, scheme) as server:
        async with connect(server.url, max_queue_bytes=1024 * 1024, **client_opts(server)) as session:
            parts = session.stream("go", timeout=10)
            assert (await anext(parts)).text == part
            await asyncio.sleep(0.5)  # the application reads nothing meanwhile
            held = session._inbox_bytes + session._correlator.buffered_bytes
            assert held <= 1536 * 1024, held  # the bound and one message; the old code ~2 MiB

            async def the_rest() -> list[str | None]:
                return [p.text async for p in parts]

            async def plain() -> list[str | None]:
                return [(await session.recv()).text for _ in range(12)]

            # Both at once: one channel carries both, in order, so either can wait for the other.
            rest, messages = await asyncio.gather(the_rest(), plain())
    assert len(rest) == 12 and rest[-1] == "end" and messages == [part] * 12
