"""m2mwire.gateway(): WebSocket/QUIC sessions carried to a NATS service (real nats-server)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

import m2mwire
from m2mwire.api import Session
from m2mwire.errors import SessionClosed
from m2mwire.transport.nats.local import LocalNatsServer


async def echo(session: Session) -> None:
    async for message in session:
        await session.send(message.text or "", algorithm="none")


@pytest.mark.parametrize("edge", ["ws", "quic"])
async def test_a_gatewayed_session_reaches_the_worker(nats_server: LocalNatsServer, edge: str) -> None:
    url = f"{nats_server.url}/test.{uuid.uuid4().hex}"
    ended: asyncio.Future[object] = asyncio.get_running_loop().create_future()

    async def handler(session: Session) -> None:
        await echo(session)
        ended.set_result(session.close_event)

    async with m2mwire.serve(handler, url, agent_id="the-worker"):
        async with m2mwire.gateway(f"{edge}://127.0.0.1:0", url) as gw:
            opts = {"fingerprint": gw.fingerprint} if gw.fingerprint else {}
            async with m2mwire.connect(gw.url, **opts) as session:
                assert session.info.peer_agent_id == "the-worker"  # negotiated end to end
                big = "y" * (3 * 1024 * 1024)  # over NATS max_payload: chunked behind the gateway
                for text in ("hello", big, "after"):
                    await session.send(text, algorithm="none")
                    assert (await asyncio.wait_for(session.recv(), 20)).text == text
            event = await asyncio.wait_for(ended, 10)
    # the client's orderly CLOSE reached the worker as an orderly close
    assert getattr(event, "by_peer", None) is True and getattr(event, "error", 1) is None


async def test_gateway_without_a_worker_refuses_the_session(nats_server: LocalNatsServer) -> None:
    url = f"{nats_server.url}/test.{uuid.uuid4().hex}"
    async with m2mwire.gateway("ws://127.0.0.1:0", url) as gw:
        with pytest.raises((SessionClosed, m2mwire.TransportError)):
            await asyncio.wait_for(m2mwire.connect(gw.url), 10)
