"""Session-context zstd end to end over WebSocket and QUIC on 127.0.0.1."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from m2mwire.api import Session, connect
from m2mwire.codecs import Algorithm
from m2mwire.errors import LimitExceeded, M2MError, SessionClosed
from m2mwire.session.payload import Message
from m2mwire.workloads import workload
from tests.test_api import client_opts, echo, running, scheme

__all__ = ["scheme"]  # the fixture, parametrised over both transports

ALGS = ["zstd", "brotli", "tokennative", "none"]


async def test_agent_loop_both_directions(scheme: str) -> None:
    steps = workload("agent_loop")
    requests = [content for sender, content in steps if sender == "client"]

    async with running(echo, scheme, algorithms=ALGS) as server:
        async with connect(server.url, algorithms=ALGS, **client_opts(server)) as session:
            assert Algorithm.ZSTD in session.info.algorithms and session.info.zstd_window == 1 << 20
            replies: list[Message] = []
            for request in requests:
                sent = await session.send(request)
                assert sent.algorithm == "zstd" and sent.binary
                replies.append(await session.recv())
            stats = session.stats
    assert [r.value for r in replies] == requests
    assert {r.algorithm for r in replies} == {"zstd"} and all(r.binary for r in replies)
    # Both directions carry the same messages: each well under 10 % of the original bytes.
    assert stats.wire_bytes_sent < 0.1 * stats.original_bytes_sent
    assert stats.wire_bytes_received < 0.1 * stats.original_bytes_received


async def test_text_form_for_a_text_only_client(scheme: str) -> None:
    steps = [content for _, content in workload("multi_turn")[:6]]
    async with running(echo, scheme, algorithms=ALGS) as server:
        async with connect(
            server.url, algorithms=ALGS, zstd={"binary": False, "window": 1 << 16}, **client_opts(server)
        ) as session:
            assert session.info.zstd_window == 1 << 16
            for content in steps:
                await session.send(content, algorithm="zstd")
                reply = await session.recv()
                assert reply.value == content and reply.algorithm == "zstd" and not reply.binary


async def _session_ends_with(session: Session, code: str) -> str:
    with pytest.raises(M2MError) as caught:
        async with asyncio.timeout(10):
            await session.recv()
    err = caught.value
    assert isinstance(err, SessionClosed) and err.code == code, err
    return str(err)


async def _raw_send(session: Session, frame: bytes) -> None:
    # The real transport, bytes our own sender would never produce (a broken or hostile peer).
    await session._channel.send((frame,))


@pytest.mark.parametrize("damage", ["flip", "drop", "bomb"])
async def test_bad_frames_end_the_session_with_a_clear_error(scheme: str, damage: str) -> None:
    ended: list[M2MError] = []

    async def handler(session: Session) -> None:
        try:
            async for message in session:
                await session.send(message.value)
        except M2MError as exc:
            ended.append(exc)
            raise

    steps = [content for sender, content in workload("multi_turn") if sender == "client"]
    async with running(handler, scheme, algorithms=ALGS, max_payload=1 << 20) as server:
        async with connect(server.url, algorithms=ALGS, **client_opts(server)) as session:
            await session.send(steps[0])
            assert (await session.recv()).value == steps[0]
            state = session._protocol._zstd
            assert state is not None
            if damage == "flip":
                frame = bytearray(state.encode_binary(state.envelope("text"), str(steps[1])))
                frame[len(frame) // 2] ^= 0x10
            elif damage == "drop":
                state.encode_binary(
                    state.envelope("text"), "a message the server never gets"
                )  # lost: history diverges
                frame = bytearray(state.encode_binary(state.envelope("text"), "next"))
            else:  # 64 MiB through the real context: a few KB frame
                frame = bytearray(state.encode_binary(state.envelope("text"), "\0" * (64 << 20)))
                assert len(frame) < 64 * 1024
            await _raw_send(session, bytes(frame))
            # Past max_payload is MESSAGE_TOO_BIG (1009), as for every codec; the rest INVALID_DATA.
            code = "MESSAGE_TOO_BIG" if damage == "bomb" else "INVALID_DATA"
            reason = await _session_ends_with(session, code)
            assert "zstd" in reason
            if damage == "bomb":
                assert "over the limit of 1048576" in reason
    await asyncio.sleep(0)
    assert ended and "zstd" in str(ended[0])
    if damage == "bomb":
        assert isinstance(ended[0], LimitExceeded)
    else:
        assert getattr(ended[0], "code", None) == "INVALID_DATA"


async def test_server_keeps_serving_other_sessions_after_a_bad_one(scheme: str) -> None:
    async with running(echo, scheme, algorithms=ALGS) as server:
        opts: dict[str, Any] = {"algorithms": ALGS, **client_opts(server)}
        async with connect(server.url, **opts) as good, connect(server.url, **opts) as bad:
            state = bad._protocol._zstd
            assert state is not None
            await _raw_send(bad, state.encode_binary(state.envelope("text"), "\x00" * 100)[:-3])
            await _session_ends_with(bad, "INVALID_DATA")
            await good.send({"still": "here"})
            assert (await good.recv()).value == {"still": "here"}


async def test_requests_and_streams_travel_in_the_context(scheme: str) -> None:
    async def answerer(session: Session) -> None:
        async for message in session:
            if message.value == {"stream": True}:
                for part in range(3):
                    await session.reply(message, {"part": part}, more=part < 2)
            else:
                await session.reply(message, {"answer": message.value})

    async with running(answerer, scheme, algorithms=ALGS) as server:
        async with connect(server.url, algorithms=ALGS, **client_opts(server)) as session:
            steps = [content for sender, content in workload("agent_loop") if sender == "client"][:3]
            for request in steps:
                answer = await session.request(request, timeout=10)
                assert answer.value == {"answer": request} and answer.algorithm == "zstd" and answer.binary
            parts = [part.value async for part in session.stream({"stream": True}, timeout=10)]
            assert parts == [{"part": 0}, {"part": 1}, {"part": 2}]
            assert session.stats.by_algorithm == {"zstd/binary": 4}


async def test_shared_history_over_a_real_connection(scheme: str) -> None:
    """The multi-turn chat both ways: the server answers each request with the next assistant
    reply, which the client's next request quotes; with shared history (the default) it costs
    well under the per-direction contexts, on both ends' counters."""
    steps = workload("multi_turn")
    replies = iter([content for sender, content in steps if sender == "server"])

    async def chat(session: Session) -> None:
        async for _ in session:
            await session.send(next(replies))

    async def run(history: bool) -> tuple[int, int]:
        async with running(chat, scheme, algorithms=ALGS) as server:
            opts = {"algorithms": ALGS, "zstd": {"history": history}, **client_opts(server)}
            async with connect(server.url, **opts) as session:
                assert session.info.zstd_history is history
                for sender, content in steps:
                    if sender == "client":
                        await session.send(content)
                    else:
                        reply = await session.recv()
                        assert reply.value == content and reply.algorithm == "zstd" and reply.binary
                stats = session.stats
        return (
            stats.original_bytes_sent + stats.original_bytes_received,
            stats.wire_bytes_sent + stats.wire_bytes_received,
        )

    original, shared = await run(True)
    replies = iter([content for sender, content in steps if sender == "server"])
    _, per_direction = await run(False)
    assert shared < 0.8 * per_direction and shared < 0.08 * original
