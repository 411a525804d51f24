"""What a session tells its operator: lifecycle log lines, Session.stats, Server.stats, preloading."""

from __future__ import annotations

import asyncio
import logging

import pytest

import m2mwire
from m2mwire.api import Session, connect
from m2mwire.codecs import Encoding
from m2mwire.codecs.tokenizers import clear_tokenizer_cache, is_loaded
from tests.test_api import (
    client_opts,
    echo,
    running,
    scheme,  # noqa: F401 (the ws/quic/nats fixture)
)


async def test_one_info_line_per_session_opened_and_closed(
    scheme: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="m2mwire")
    async with running(echo, scheme, algorithms=["brotli", "none"]) as server:
        async with connect(server.url, agent_id="client-7", **client_opts(server)) as session:
            sid = session.info.session_id
            for i in range(20):
                await session.send({"i": i, "text": "hello " * 50})
                await session.recv()
        for _ in range(100):
            if server.active_sessions == 0:
                break
            await asyncio.sleep(0.01)
    mine = [r for r in caplog.records if sid in r.getMessage() and r.levelno >= logging.INFO]
    opened = [r.getMessage() for r in mine if " opened " in r.getMessage()]
    closed = [r.getMessage() for r in mine if " closed: " in r.getMessage()]
    assert len(opened) == 2 and len(closed) == 2, [r.getMessage() for r in mine]  # client and server
    assert any("client-7" in line and "brotli" in line and "mode JSON" in line for line in opened)
    assert all("sent 20 messages" in line or "received 20" in line for line in closed)
    assert all("saving" in line for line in closed)
    # Nothing per message above DEBUG.
    assert len(mine) == 4


async def test_session_stats_tokens_saving_and_ping_rtt(scheme: str) -> None:
    async with running(echo, scheme, timers={"ping_interval": 0.05}) as server:
        async with connect(
            server.url, token_stats=True, timers={"ping_interval": 0.05}, **client_opts(server)
        ) as session:
            await session.send({"text": "the same words again " * 40})
            await session.recv()
            for _ in range(100):
                if session.stats.ping_rtt is not None:
                    break
                await asyncio.sleep(0.02)
            stats = session.stats
            assert stats.ping_rtt is not None and 0 < stats.ping_rtt < 1.0
            assert stats.original_tokens_received > 0 and stats.wire_tokens_received > 0
            assert 0 < stats.saving < 1  # repetitive JSON compresses both ways


async def test_server_stats_aggregate_live_and_ended_sessions(scheme: str) -> None:
    def check(hello: m2mwire.Hello) -> None:
        if hello.agent_type == "refused":
            raise m2mwire.Reject("SECURITY_POLICY", "not you")

    async with running(echo, scheme, on_hello=check) as server:
        async with connect(server.url, **client_opts(server)) as first:
            await first.send("one")
            await first.recv()
        for _ in range(100):
            if server.active_sessions == 0:
                break
            await asyncio.sleep(0.01)
        async with connect(server.url, **client_opts(server)) as second:
            await second.send("two")
            await second.recv()
            stats = server.stats
            assert stats.sessions_opened == 2 and stats.sessions_active == 1
            assert stats.totals.messages_received == 2 and stats.totals.messages_sent == 2
        with pytest.raises(m2mwire.SessionRejected):
            await connect(server.url, agent_type="refused", **client_opts(server))
    assert server.stats.sessions_refused == 1


async def test_sessions_preload_the_negotiated_tokenizer(scheme: str) -> None:
    """The first send must not pay the ~0.2 s tokenizer build on the event loop."""

    async def hold(session: Session) -> None:
        async for _ in session:
            pass

    clear_tokenizer_cache(Encoding.O200K)
    async with running(hold, scheme, encodings=["o200k_base"]) as server:
        async with connect(server.url, encodings=["o200k_base"], **client_opts(server)) as session:
            assert session.info.encoding is Encoding.O200K
            assert is_loaded(Encoding.O200K)  # before any message was sent
