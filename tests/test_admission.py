"""Admission and auth: connect(token=), serve(on_hello=, max_sessions=, max_sessions_per_peer=).

Real servers on 127.0.0.1, WebSocket and QUIC.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import websockets
from websockets.asyncio.server import ServerConnection

import m2mwire
from m2mwire.api import Session, connect
from m2mwire.errors import ConfigError, Reject, SessionRejected
from tests.test_api import (
    client_opts,
    running,
    scheme,  # noqa: F401 (the ws/quic/nats fixture)
)


async def hold(session: Session) -> None:
    async for _ in session:
        pass


async def test_on_hello_sees_the_hello_and_admits(scheme: str) -> None:
    seen: list[m2mwire.Hello] = []

    async def check(hello: m2mwire.Hello) -> None:
        await asyncio.sleep(0.01)  # checks may be async
        seen.append(hello)
        if hello.token != "s3cret":
            raise Reject("SECURITY_POLICY", "bad token")

    async with running(hold, scheme, on_hello=check) as server:
        async with connect(server.url, token="s3cret", agent_id="worker-1", **client_opts(server)) as s:
            await s.send("hi")
        with pytest.raises(SessionRejected) as info:
            await connect(server.url, token="wrong", **client_opts(server))
        assert info.value.code == "SECURITY_POLICY"
        assert "bad token" in str(info.value)
        with pytest.raises(SessionRejected):
            await connect(server.url, **client_opts(server))  # no token at all
    assert seen[0].agent_id == "worker-1" and seen[0].token == "s3cret"
    if scheme == "nats":  # no IP address over NATS: the client connection's own identity
        assert seen[0].remote_address[0].startswith("nats-client-")
    else:
        assert seen[0].remote_address[0] == "127.0.0.1" and seen[0].remote_address[1] > 0
    assert "tokennative" in seen[0].algorithms
    assert seen[2].token is None


async def test_sync_check_and_a_failing_check(scheme: str) -> None:
    def check(hello: m2mwire.Hello) -> None:
        if hello.agent_type == "crashy":
            raise RuntimeError("bug in the check")

    async with running(hold, scheme, on_hello=check) as server:
        async with connect(server.url, **client_opts(server)) as s:
            await s.send("admitted")
        with pytest.raises(SessionRejected) as info:
            await connect(server.url, agent_type="crashy", **client_opts(server))
        # Never admitted on an error; the client learns nothing of the server's internals.
        assert info.value.code == "UNKNOWN" and "bug in the check" not in str(info.value)


async def test_max_sessions_and_per_peer_limits(scheme: str) -> None:
    async with running(hold, scheme, max_sessions=2) as server:
        first = await connect(server.url, **client_opts(server))
        second = await connect(server.url, **client_opts(server))
        with pytest.raises(SessionRejected) as info:
            await connect(server.url, **client_opts(server))
        assert info.value.code == "RATE_LIMITED"
        await first.close()
        for _ in range(200):  # the server frees the slot when its side of the session ends
            if server.active_sessions < 2:
                break
            await asyncio.sleep(0.01)
        third = await connect(server.url, **client_opts(server))
        await asyncio.gather(second.close(), third.close())

    async with running(hold, scheme, max_sessions_per_peer=1) as server:
        only = await connect(server.url, **client_opts(server))
        with pytest.raises(SessionRejected) as info:
            await connect(server.url, **client_opts(server))
        assert info.value.code == "RATE_LIMITED" and "per client address" in str(info.value)
        await only.close()


async def test_token_goes_in_the_websocket_upgrade_too() -> None:
    headers: list[Any] = []

    async def record(connection: ServerConnection) -> None:
        headers.append(connection.request.headers.get("Authorization") if connection.request else None)
        await connection.close()

    async with websockets.serve(record, "127.0.0.1", 0) as ws_server:
        port = ws_server.sockets[0].getsockname()[1]
        with pytest.raises(m2mwire.M2MError):
            await connect(f"ws://127.0.0.1:{port}", token="abc", timers={"hello_timeout": 2})
    assert headers == ["Bearer abc"]


def test_bad_options_are_refused_at_the_call() -> None:
    with pytest.raises(ConfigError, match="max_sessions"):
        m2mwire.serve(hold, "ws://127.0.0.1:0", max_sessions=0)
    with pytest.raises(ConfigError, match="token= is a connect"):
        m2mwire.serve(hold, "ws://127.0.0.1:0", token="x")
    with pytest.raises(ConfigError, match="on_hello= takes a function"):
        m2mwire.serve(hold, "ws://127.0.0.1:0", on_hello=5)
    with pytest.raises(ValueError, match="SECURITY_POLICY"):
        Reject("NOPE", "not a code peers know")
