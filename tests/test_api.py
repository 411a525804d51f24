"""Sessions end to end over real transports: WebSocket (websockets), QUIC (aioquic) and NATS (a real
nats-server), on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

import m2mwire
from m2mwire import avp
from m2mwire.api import Server, Session, connect, serve
from m2mwire.codecs import Algorithm, Encoding
from m2mwire.errors import LimitExceeded, ModeError, SessionClosed, SessionRejected, SessionTimeout
from m2mwire.schemas.identity import ModelIdentity
from m2mwire.session.config import Timers

IDENT = ModelIdentity(
    model_family="llama", model_id="tiny", model_hash="ab" * 32, hidden_dim=16, num_layers=2
)

TRANSPORTS = ["ws", "quic", "nats"]
_NATS_BASE = ""  # the test nats-server's URL, set by the scheme fixture


@pytest.fixture(params=TRANSPORTS)
def scheme(request: pytest.FixtureRequest) -> str:
    global _NATS_BASE
    if request.param == "nats":
        _NATS_BASE = request.getfixturevalue("nats_server").url
    return str(request.param)


def listen_url(scheme: str) -> str:
    """Where a test server listens: a free port, or over NATS a service subject of its own."""
    if scheme == "nats":
        return f"{_NATS_BASE}/test.{uuid.uuid4().hex}"
    return f"{scheme}://127.0.0.1:0"


def client_opts(server: Server) -> dict[str, Any]:
    return {"fingerprint": server.fingerprint} if server.fingerprint else {}


async def echo(session: Session) -> None:
    async for message in session:
        if message.kind == "avp":
            assert message.avp is not None
            await session.send(bytes(message.avp.raw))
        elif message.kind == "json":
            await session.send(message.value)
        else:
            # the same form back; text in binary form (algorithm none) is sent as text again
            await session.send(message.text or "", binary=message.binary and message.algorithm != "none")


@asynccontextmanager
async def running(
    handler: Callable[[Session], Awaitable[None]], scheme: str, **options: Any
) -> AsyncIterator[Server]:
    async with serve(handler, listen_url(scheme), **options) as server:
        yield server


async def test_handshake_and_info(scheme: str) -> None:
    seen: list[m2mwire.SessionInfo] = []

    async def handler(session: Session) -> None:
        seen.append(session.info)
        await session.recv()

    async with running(handler, scheme, algorithms=["brotli", "tokennative", "none"]) as server:
        async with connect(
            server.url,
            algorithms=["tokennative", "brotli", "token"],
            encodings=["o200k_base", "cl100k_base"],
            preferred_encoding="o200k_base",
            **client_opts(server),
        ) as session:
            await session.send("hi")
            info = session.info
            assert info.algorithms == (Algorithm.TOKENNATIVE, Algorithm.BROTLI)
            assert info.encoding is Encoding.O200K
            assert info.mode == "JSON"
        await asyncio.sleep(0)
    assert seen and seen[0].session_id == info.session_id
    assert seen[0].algorithms == info.algorithms and seen[0].encoding is info.encoding


async def test_every_kind_of_data_round_trips(scheme: str) -> None:
    async with running(echo, scheme, identity=IDENT, max_payload=64 * 1024 * 1024) as server:
        async with connect(server.url, identity=IDENT, token_stats=True, **client_opts(server)) as session:
            assert session.info.mode == "LATENT"
            request = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hello, wörld 👋"}]}
            for alg in (None, "tokennative", "token", "brotli", "dictionary", "none"):
                sent = await session.send(request, algorithm=alg)
                reply = await session.recv()
                assert reply.kind == "json"
                assert reply.value["messages"] == request["messages"]
                if alg:
                    assert sent.algorithm == alg
            await session.send("plain text ✓", binary=True)
            reply = await session.recv()
            assert (reply.text, reply.binary, reply.algorithm) == ("plain text ✓", True, "tokennative")
            hidden = np.linspace(-1, 1, 16, dtype=np.float32)
            await session.send(hidden)
            reply = await session.recv()
            assert reply.kind == "avp" and reply.avp is not None
            np.testing.assert_array_equal(reply.avp.tensor(), hidden)
            assert reply.avp.metadata.session_id == session.info.session_id
            kv = avp.encode_kv_cache(
                [(np.full((2, 3, 4), i, np.float16), np.full((2, 3, 4), -i, np.float16)) for i in range(2)]
            )
            await session.send(kv)
            back = (await session.recv()).avp
            assert back is not None and back.kv_cache().num_layers == 2
            st = session.stats
            assert st.messages_sent == 9 and st.wire_tokens_sent > 0 and st.original_tokens_sent > 0


async def test_avp_in_json_mode_fails_clearly(scheme: str) -> None:
    async with running(echo, scheme) as server:
        async with connect(server.url, identity=IDENT, **client_opts(server)) as session:
            assert session.info.mode == "JSON"
            with pytest.raises(ModeError, match="JSON mode"):
                await session.send(np.zeros(4, dtype=np.float32))
            await session.send("still fine")
            assert (await session.recv()).text == "still fine"


async def test_reject_no_common_algorithm(scheme: str) -> None:
    async with running(echo, scheme, algorithms=["brotli"]) as server:
        with pytest.raises(SessionRejected) as info:
            await connect(server.url, algorithms=["dictionary"], **client_opts(server))
        assert info.value.code == "NO_COMMON_ALGORITHM"


async def test_ordering_under_concurrent_sends(scheme: str) -> None:
    async with running(echo, scheme) as server:
        async with connect(server.url, **client_opts(server)) as session:

            async def producer(k: int) -> None:
                for i in range(15):
                    await session.send({"k": k, "i": i}, algorithm="none")

            receiver = asyncio.create_task(_collect(session, 8 * 15))
            await asyncio.gather(*(producer(k) for k in range(8)))
            got = await asyncio.wait_for(receiver, 30)
    per_producer: dict[int, list[int]] = {}
    for item in got:
        per_producer.setdefault(item["k"], []).append(item["i"])
    assert per_producer == {k: list(range(15)) for k in range(8)}


async def _collect(session: Session, n: int) -> list[Any]:
    return [(await session.recv()).value for _ in range(n)]


async def test_many_concurrent_sessions_lose_nothing(scheme: str) -> None:
    n = 200 if scheme == "ws" else 50

    async with running(echo, scheme) as server:

        async def one(k: int) -> list[str]:
            async with connect(server.url, **client_opts(server)) as session:
                out = []
                for i in range(3):
                    await session.send(f"{k}:{i}")
                    out.append((await session.recv()).text or "")
                return out

        results = await asyncio.wait_for(asyncio.gather(*(one(k) for k in range(n))), 120)
    assert results == [[f"{k}:{i}" for i in range(3)] for k in range(n)]


async def test_client_close_is_seen_by_server(scheme: str) -> None:
    closed: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def handler(session: Session) -> None:
        async for _ in session:
            pass
        closed.set_result(session.close_event)

    async with running(handler, scheme) as server:
        async with connect(server.url, **client_opts(server)) as session:
            await session.send("bye")
        event = await asyncio.wait_for(closed, 10)
    assert event is not None and event.by_peer and event.error is None
    with pytest.raises(SessionClosed):
        await session.send("after close")


async def test_server_handler_return_closes_session(scheme: str) -> None:
    async def handler(session: Session) -> None:
        await session.send("only one")

    async with running(handler, scheme) as server:
        async with connect(server.url, **client_opts(server)) as session:
            assert (await session.recv()).text == "only one"
            with pytest.raises(SessionClosed):
                await asyncio.wait_for(session.recv(), 10)
            assert session.close_event is not None and session.close_event.by_peer


async def test_cancelled_and_concurrent_recv_lose_nothing(scheme: str) -> None:
    """recv() calls that time out leave nothing behind, and two waiting receivers get one message
    each, in order."""
    async with running(echo, scheme) as server:
        async with connect(server.url, **client_opts(server)) as session:
            for _ in range(50):  # each one registers a waiter and is cancelled
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(session.recv(), 0.001)
            assert len(session._receivers) <= 8  # cancelled waiters are dropped, not hoarded
            first = asyncio.ensure_future(session.recv())
            second = asyncio.ensure_future(session.recv())
            await asyncio.sleep(0)  # both are waiting now
            await session.send("one")
            await session.send("two")
            got = await asyncio.wait_for(asyncio.gather(first, second), 10)
            assert sorted(m.text or "" for m in got) == ["one", "two"]
            await session.send("three")
            assert (await asyncio.wait_for(session.recv(), 10)).text == "three"


async def test_oversized_send_refused_locally(scheme: str) -> None:
    async with running(echo, scheme, max_payload=4096) as server:
        async with connect(server.url, **client_opts(server)) as session:
            assert session.info.max_payload == 4096
            with pytest.raises(LimitExceeded):
                await session.send("z" * 10_000, algorithm="none")
            await session.send("small")
            assert (await session.recv()).text == "small"


async def test_short_session_timeout_closes(scheme: str) -> None:
    timers = {"session_timeout": 0.3, "close_timeout": 0.5}
    async with running(echo, scheme) as server:
        session = await connect(server.url, timers=timers, **client_opts(server))
        with pytest.raises(SessionTimeout):
            await asyncio.wait_for(session.recv(), 5)
        await session.close()


async def test_backpressure_bounds_a_fast_sender(scheme: str) -> None:
    release = asyncio.Event()

    async def slow(session: Session) -> None:
        await release.wait()
        async for _ in session:
            pass

    chunk = "x" * 60_000
    async with running(slow, scheme, max_queue=2) as server:
        async with connect(server.url, **client_opts(server)) as session:
            sent = 0

            async def blast() -> None:
                nonlocal sent
                for _ in range(2000):  # 120 MB if nothing pushed back
                    await session.send(chunk, algorithm="none")
                    sent += 1

            task = asyncio.create_task(blast())
            await asyncio.sleep(1.5)
            assert not task.done(), "send() never waited although the peer reads nothing"
            assert sent < 800, f"{sent} messages accepted without the peer reading: no backpressure"
            release.set()
            await asyncio.wait_for(task, 60)
            assert sent == 2000


def test_top_level_names() -> None:
    assert m2mwire.connect is connect and m2mwire.serve is serve
    assert m2mwire.Timers is Timers
    with pytest.raises(AttributeError):
        _ = m2mwire.no_such_name  # type: ignore[attr-defined]


async def test_fifty_sessions_share_one_quic_connection() -> None:
    async with running(echo, "quic") as server:
        conn = await m2mwire.open_quic_connection(server.url, fingerprint=server.fingerprint)
        try:

            async def one(k: int) -> list[str]:
                async with connect(server.url, connection=conn) as session:
                    out = []
                    for i in range(3):
                        await session.send(f"{k}:{i}")
                        out.append((await session.recv()).text or "")
                    return out

            results = await asyncio.wait_for(asyncio.gather(*(one(k) for k in range(50))), 120)
            assert results == [[f"{k}:{i}" for i in range(3)] for k in range(50)]
            # the connection outlives its sessions and still takes new ones
            async with connect(server.url, connection=conn) as session:
                await session.send("again")
                assert (await session.recv()).text == "again"
        finally:
            await conn.close()


async def test_one_process_serves_websocket_and_quic() -> None:
    async with running(echo, "ws") as ws_server, running(echo, "quic") as quic_server:
        for server in (ws_server, quic_server):
            async with connect(server.url, **client_opts(server)) as session:
                await session.send({"via": server.url})
                assert (await session.recv()).value == {"via": server.url}


async def test_kv_cache_of_64_mib(scheme: str) -> None:
    big = 80 * 1024 * 1024
    layers = [
        (np.full((8, 512, 128), i, np.float16), np.full((8, 512, 128), -i, np.float16)) for i in range(32)
    ]
    async with running(echo, scheme, identity=IDENT, max_payload=big) as server:
        async with connect(server.url, identity=IDENT, max_payload=big, **client_opts(server)) as session:
            frame = avp.encode_kv_cache_parts(layers, session_id=session.info.session_id)
            sent = await session.send(b"".join(bytes(memoryview(p)) for p in frame))
            assert sent.wire_bytes > 64 * 1024 * 1024
            reply = await asyncio.wait_for(session.recv(), 60)
            assert reply.avp is not None
            kv = reply.avp.kv_cache()
            assert (kv.num_layers, kv.num_kv_heads, kv.seq_len, kv.head_dim) == (32, 8, 512, 128)
            k31, v31 = kv.layers[31]
            assert float(k31[0, 0, 0]) == 31.0 and float(v31[7, 511, 127]) == -31.0


async def _raw_channel(server: Server, scheme: str) -> Any:
    if scheme == "ws":
        from m2mwire.transport.websocket import connect_websocket

        return await connect_websocket(server.url, max_message_size=1 << 20)
    if scheme == "nats":
        from m2mwire.transport.nats.service import open_nats_channel

        return await open_nats_channel(server.url, max_message_size=1 << 20, options={})
    from m2mwire.transport.quic import open_quic_channel

    return await open_quic_channel("127.0.0.1", server.port, fingerprint=server.fingerprint)


@pytest.mark.parametrize(
    ("first", "code"),
    [
        ("garbage{", "MALFORMED_MESSAGE"),
        (
            '{"type":"DATA","session_id":"x","payload":{"algorithm":"none","content":"hi"},"timestamp":1}',
            "DATA_BEFORE_HELLO",
        ),
        ('{"type":"HELLO","payload":{"version":"3.0"},"timestamp":1}', "MALFORMED_MESSAGE"),
    ],
)
async def test_bad_first_message_gets_reject_then_close(scheme: str, first: str, code: str) -> None:
    from m2mwire.errors import TransportError

    async with running(echo, scheme) as server:
        async with connect(server.url, **client_opts(server)) as good:
            channel = await _raw_channel(server, scheme)
            await channel.send(first)
            reply = json.loads(await asyncio.wait_for(channel.recv(), 10))
            assert reply["type"] == "REJECT" and reply["payload"]["message"].startswith(code)
            with pytest.raises(TransportError):
                await asyncio.wait_for(channel.recv(), 10)
            # the other session on the same server is untouched
            await good.send("unaffected")
            assert (await good.recv()).text == "unaffected"


def raw_hello(version: str = "3.0", agent_id: str = "raw") -> str:
    """A minimal HELLO as a hand-written peer would send it."""
    return json.dumps(
        {
            "type": "HELLO",
            "payload": {
                "version": version,
                "agent_id": agent_id,
                "agent_type": agent_id,
                "compression": {
                    "algorithms": ["none"],
                    "max_payload": 0,
                    "streaming": False,
                    "ml_routing": False,
                },
                "security": {"threat_detection": False, "blocking_mode": False, "block_threshold": 0.8},
            },
            "timestamp": 1,
        }
    )


@pytest.mark.parametrize(
    "bad",
    [
        # in the content: the DATA fast path's decode meets it
        b'{"type":"DATA","session_id":"%s","payload":{"algorithm":"none","content":"ok \xff"},"timestamp":1}',
        # in a field nobody reads (msgspec skips unknown fields without looking at their bytes)
        b'{"type":"DATA","session_id":"%s","payload":{"algorithm":"none","content":"ok","x":"\xc3("},"timestamp":1}',
        b'{"type":"PING","session_id":"%s","payload":{"note":"\xed\xa0\x80"},"timestamp":1}',
    ],
)
async def test_a_text_message_that_is_not_utf8_is_refused_on_every_transport(scheme: str, bad: bytes) -> None:
    """Text reaches the session as its UTF-8 bytes, not validated by the transport: the session
    checks them (once) and refuses invalid UTF-8 anywhere in the message with MALFORMED_MESSAGE
    and close code 1007, as websockets itself did before."""
    from m2mwire.errors import TransportError

    async with running(echo, scheme) as server:
        async with connect(server.url, **client_opts(server)) as good:
            channel = await _raw_channel(server, scheme)
            await channel.send(raw_hello())
            accept = json.loads(await asyncio.wait_for(channel.recv(), 10))
            assert accept["type"] == "ACCEPT"
            await channel.send(bad % accept["session_id"].encode(), True)  # bytes sent as a text message
            close = json.loads(await asyncio.wait_for(channel.recv(), 10))
            assert close["type"] == "CLOSE" and close["payload"]["reason"] == "MALFORMED_MESSAGE"
            assert "not valid UTF-8" in close["payload"]["message"]
            with pytest.raises(TransportError) as info:
                await asyncio.wait_for(channel.recv(), 10)
            assert info.value.code == 1007
            await good.send("unaffected")
            assert (await good.recv()).text == "unaffected"


async def test_version_mismatch_over_the_wire(scheme: str) -> None:
    async with running(echo, scheme) as server:
        channel = await _raw_channel(server, scheme)
        await channel.send(raw_hello(version="2.0", agent_id="old"))
        reply = json.loads(await asyncio.wait_for(channel.recv(), 10))
        assert reply["payload"]["code"] == "VERSION_MISMATCH"
        await channel.close()


async def test_server_shutdown_closes_sessions_in_order(scheme: str) -> None:
    started = asyncio.Event()

    async def handler(session: Session) -> None:
        started.set()
        async for _ in session:
            pass

    server = await serve(handler, listen_url(scheme))
    session = await connect(server.url, **client_opts(server))
    await asyncio.wait_for(started.wait(), 10)
    await asyncio.wait_for(server.aclose(), 15)
    with pytest.raises(SessionClosed):
        await asyncio.wait_for(session.recv(), 10)
    event = session.close_event
    assert event is not None and event.by_peer and event.error is None
    assert event.reason == "server shutting down"
    await session.close()


async def test_large_text_travels_in_binary_form_on_every_transport(scheme: str) -> None:
    """Text DATA of BINARY_TEXT_MIN bytes or more goes as one binary message without JSON escaping
    (session/binarytext.py), both ways and over each transport; smaller text stays a JSON text
    message."""
    from m2mwire.session.binarytext import BINARY_TEXT_MIN

    async def handler(session: Session) -> None:
        async for message in session:
            await session.send(message.text or "", algorithm="none")

    texts = ['{"quote": "\\"", "line": "a\\nb"}\n' + "é ✓ " * BINARY_TEXT_MIN, 'small "text"\n']
    async with running(handler, scheme) as server:
        async with connect(server.url, algorithms=["none"], **client_opts(server)) as session:
            assert session.info.binary_text
            for text in texts:
                sent = await session.send(text, algorithm="none")
                got = await asyncio.wait_for(session.recv(), 10)
                big = len(text.encode()) >= BINARY_TEXT_MIN
                assert got.text == text and got.algorithm == "none"
                assert sent.binary is big and got.binary is big
