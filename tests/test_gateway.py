"""m2mwire.gateway(): WebSocket/QUIC sessions carried to a NATS service (real nats-server)."""

from __future__ import annotations

import asyncio
import random
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

import m2mwire
from m2mwire.api import Session
from m2mwire.codecs import Algorithm
from m2mwire.errors import SessionClosed
from m2mwire.schemas.messages import MessageType, decode_message, encode_message
from m2mwire.session.config import SessionConfig
from m2mwire.session.core import SessionProtocol
from m2mwire.session.outputs import SendMessage
from m2mwire.session.states import Role, State
from m2mwire.shell.resume_routes import ResumeRoutes
from m2mwire.transport.nats.local import LocalNatsServer
from tests.chaosproxy import TcpChaosProxy
from tests.test_resume import (
    FAST,
    IDENT,
    Exchanging,
    break_during,
    check_exactly_once_in_order,
    exchange,
    workload,
)

if TYPE_CHECKING:
    from m2mwire.shell.gateway import Gateway


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


# -- resuming through the gateway (docs/PROTOCOL.md §5a "Gateway") --------------------------------
# The client's connection to the gateway is cut by a proxy; the session is held by worker A, which
# then stops taking new sessions while worker B serves the same service, so a resuming session
# sent through the queue group would deterministically reach B, which can only refuse it.


@asynccontextmanager
async def through_a_gateway_to_a_draining_worker(
    handler: Callable[[Session], Awaitable[None]], nats_server: LocalNatsServer
) -> AsyncIterator[tuple[Session, TcpChaosProxy, Gateway]]:
    url = f"{nats_server.url}/test.{uuid.uuid4().hex}"
    async with m2mwire.serve(handler, url, agent_id="worker-a", identity=IDENT) as a:
        async with m2mwire.gateway("ws://127.0.0.1:0", url) as gw:
            proxy = await TcpChaosProxy(gw.port).start()
            try:
                async with m2mwire.connect(
                    f"ws://127.0.0.1:{proxy.port}", reconnect=FAST, identity=IDENT
                ) as session:
                    assert session.info.peer_agent_id == "worker-a"
                    a.close()  # A takes no new session, but its sessions go on
                    async with m2mwire.serve(handler, url, agent_id="worker-b", identity=IDENT):
                        yield session, proxy, gw
            finally:
                await proxy.close()


@pytest.mark.timeout(60)
async def test_a_websocket_client_resumes_on_its_worker_through_the_gateway(
    nats_server: LocalNatsServer,
) -> None:
    """Three cuts of the client's connection to the gateway at random points of an exchange both
    ways (text, JSON, AVP; up to 16 KiB): the session resumes each time on worker A, and every
    message arrives exactly once, in order, on both sides."""
    count = 600
    to_worker, to_client = workload(31, count, 16 * 1024), workload(32, count, 16 * 1024)
    handler = Exchanging(to_client, count)

    async with through_a_gateway_to_a_draining_worker(handler, nats_server) as (session, proxy, gw):
        sid = session.info.session_id
        assert sid is not None and gw.routes.find(sid) is not None  # learned from A's ACCEPT

        async def cut() -> None:
            proxy.cut()

        chaos = asyncio.create_task(break_during(session, count, random.Random(33), cut))
        client_got = await asyncio.wait_for(exchange(session, to_worker, count), 40)
        await asyncio.wait_for(chaos, 20)
        await asyncio.wait_for(handler.done.wait(), 20)
        check_exactly_once_in_order(to_client, client_got)
        check_exactly_once_in_order(to_worker, handler.got)
        assert proxy.cuts >= 3 and session.stats.reconnects >= 3
        assert session.info.session_id == sid and session.info.peer_agent_id == "worker-a"
        await session.close()
        # an orderly end: the gateway forgets the session's worker
        for _ in range(200):
            if not len(gw.routes):
                break
            await asyncio.sleep(0.01)
        assert gw.routes.find(sid) is None and not len(gw.routes)


async def test_a_resume_through_the_gateway_still_needs_the_token(nats_server: LocalNatsServer) -> None:
    """The gateway picks the worker by session id only; the worker that holds the session checks
    the token (a resume that reached another worker would be RESUME_UNKNOWN instead)."""
    async with through_a_gateway_to_a_draining_worker(echo, nats_server) as (session, proxy, _gw):
        await session.send("before", algorithm="none")
        assert (await asyncio.wait_for(session.recv(), 5)).text == "before"
        resume = session._protocol.resume
        assert resume is not None
        resume.token = resume.token[:-1] + ("B" if resume.token.endswith("A") else "A")
        proxy.cut()
        with pytest.raises(SessionClosed) as info:
            await asyncio.wait_for(session.recv(), 10)
        assert info.value.code == "RESUME_REFUSED"


# What a client may send before its resuming HELLO, and what a direct server answers to it.
BEFORE_HELLO = {
    "hello first": (None, None),
    "ping first": (encode_message(MessageType.PING).decode(), MessageType.PONG),
    "ack first": ('{"type":"ACK","payload":{"received":0}}', None),  # ignored before a session
    "unknown type first": ('{"type":"HINT","payload":{}}', None),  # ignored: a later version's
}


@pytest.mark.parametrize("before", list(BEFORE_HELLO))
@pytest.mark.parametrize("lost", ["cut", "close frame"])
async def test_a_resume_through_the_gateway_reaches_the_worker_as_it_would_a_direct_server(
    nats_server: LocalNatsServer, before: str, lost: str
) -> None:
    """Ways a resume that a direct server honours went through the queue group to worker B,
    which could only refuse it (RESUME_UNKNOWN):
    - a PING, an ACK or a message of unknown type before the resuming HELLO: a server answers
      the PING and ignores the others before a HELLO, but the gateway routed a connection by
      its first message;
    - a connection that ended with a close frame but no CLOSE: the worker keeps such a session
      for a resume, as a direct server does, but the gateway took the clean end for the
      session's and forgot its worker. It now forgets it once a CLOSE passed.
    The client is a sans-I/O session core over a raw WebSocket, so that the test says exactly
    which messages go out, in which order."""
    first, answered = BEFORE_HELLO[before]
    url = f"{nats_server.url}/test.{uuid.uuid4().hex}"
    client = SessionProtocol(Role.CLIENT, SessionConfig(identity=IDENT, resume=True))
    client.initiate(0.0)
    async with m2mwire.serve(echo, url, agent_id="worker-a", identity=IDENT) as a:
        async with m2mwire.gateway("ws://127.0.0.1:0", url) as gw:
            async with ws_connect(gw.url) as ws:
                (hello,) = client.data_to_send()
                assert isinstance(hello, SendMessage)
                await ws.send(hello.message.decode())
                client.receive_text(await asyncio.wait_for(ws.recv(), 10), 0.0)
                assert client.state is State.ESTABLISHED and client.resume is not None
                sid = client.session_id
                assert sid is not None and gw.routes.find(sid) is not None
                if lost == "cut":
                    ws.transport.abort()
                else:
                    await ws.close(1001)
            # worker A holds the session, detached; the gateway still knows where
            for _ in range(200):
                if gw.routes.lost(sid):
                    break
                await asyncio.sleep(0.01)
            assert gw.routes.lost(sid)
            a.close()  # A takes no new session, but resumes its own
            async with m2mwire.serve(echo, url, agent_id="worker-b", identity=IDENT):
                client.transport_closed(now=1.0)
                client.begin_resume(1.0)
                (resuming,) = client.data_to_send()
                assert isinstance(resuming, SendMessage)
                async with ws_connect(gw.url) as ws:
                    if first is not None:
                        await ws.send(first)
                    if answered is not None:
                        assert decode_message(await asyncio.wait_for(ws.recv(), 10)).type is answered
                    await ws.send(resuming.message.decode())
                    answer = decode_message(await asyncio.wait_for(ws.recv(), 10))
    assert answer.type is MessageType.ACCEPT, answer.payload
    assert answer.session_id == sid


async def test_the_workers_accept_is_found_behind_its_answers_to_pings(nats_server: LocalNatsServer) -> None:
    """A client that PINGs right after its HELLO, to a worker whose admission check takes a
    moment, gets the PONG before the ACCEPT. The gateway learnt a session's worker only from the
    worker's first answer, so it kept no route and a later resume went to the queue group."""
    url = f"{nats_server.url}/test.{uuid.uuid4().hex}"

    async def slow_admission(_hello: object) -> None:
        await asyncio.sleep(0.2)

    client = SessionProtocol(Role.CLIENT, SessionConfig(identity=IDENT, resume=True))
    client.initiate(0.0)
    (hello,) = client.data_to_send()
    assert isinstance(hello, SendMessage)
    async with m2mwire.serve(echo, url, identity=IDENT, on_hello=slow_admission):
        async with m2mwire.gateway("ws://127.0.0.1:0", url) as gw, ws_connect(gw.url) as ws:
            await ws.send(hello.message.decode())
            await ws.send(encode_message(MessageType.PING).decode())
            answers = [decode_message(await asyncio.wait_for(ws.recv(), 10)) for _ in range(2)]
            assert [a.type for a in answers] == [MessageType.PONG, MessageType.ACCEPT]
            sid = answers[1].session_id
            assert sid is not None and gw.routes.find(sid) is not None


@pytest.mark.parametrize("spelling", ["plain", "escaped"])
async def test_a_session_whose_close_passed_is_forgotten_whatever_followed(
    nats_server: LocalNatsServer, spelling: str
) -> None:
    """A session that a CLOSE passed in cannot be resumed (§9), so the gateway forgets its worker.
    It looked only at the last message each way, so a PING after the CLOSE kept the route (the
    worker's handler does not read, so the worker's last message is the PONG, not a CLOSE). A
    CLOSE whose type is spelled with a JSON escape (valid JSON: the worker takes it) was missed
    by the gateway's pre-filter, and its route kept as a lost session's (stop 33)."""
    url = f"{nats_server.url}/test.{uuid.uuid4().hex}"

    async def idle(_session: Session) -> None:
        await asyncio.sleep(30)  # cancelled when the server stops

    client = SessionProtocol(Role.CLIENT, SessionConfig(identity=IDENT, resume=True))
    client.initiate(0.0)
    (hello,) = client.data_to_send()
    assert isinstance(hello, SendMessage)
    async with m2mwire.serve(idle, url, identity=IDENT), m2mwire.gateway("ws://127.0.0.1:0", url) as gw:
        async with ws_connect(gw.url) as ws:
            await ws.send(hello.message.decode())
            sid = decode_message(await asyncio.wait_for(ws.recv(), 10)).session_id
            assert sid is not None and gw.routes.find(sid) is not None
            close = encode_message(MessageType.CLOSE, session_id=sid).decode()
            if spelling == "escaped":
                close = close.replace('"CLOSE"', '"CL\\u004fSE"')
                assert decode_message(close.encode()).type is MessageType.CLOSE
            await ws.send(close)
            await ws.send(encode_message(MessageType.PING, session_id=sid).decode())
            pong = decode_message(await asyncio.wait_for(ws.recv(), 10))
            assert pong.type is MessageType.PONG  # both relayed; no CLOSE came back
            ws.transport.abort()
        for _ in range(200):
            if gw.routes.find(sid) is None:
                break
            await asyncio.sleep(0.01)
        assert gw.routes.find(sid) is None and not gw.routes.lost(sid)


@pytest.mark.parametrize("pings", [0, 40])
async def test_a_connection_that_sends_no_hello_is_closed(nats_server: LocalNatsServer, pings: int) -> None:
    """The gateway waits for the HELLO before opening a NATS channel (it decides where the
    channel goes), so it bounds that wait itself: hello_timeout, then close 1008. PINGs meanwhile
    are answered, one PONG each, as a server answers them, and do not extend the wait."""
    url = f"{nats_server.url}/test.{uuid.uuid4().hex}"
    async with m2mwire.serve(echo, url):
        async with m2mwire.gateway("ws://127.0.0.1:0", url, hello_timeout=0.3) as gw:
            async with ws_connect(gw.url) as ws:
                for _ in range(pings):  # 40 x 20 ms: past hello_timeout
                    try:
                        await ws.send(encode_message(MessageType.PING).decode())
                        pong = decode_message(await asyncio.wait_for(ws.recv(), 5))
                    except ConnectionClosed:
                        break
                    assert pong.type is MessageType.PONG
                    await asyncio.sleep(0.02)
                else:
                    assert not pings, "PINGs kept the connection open past hello_timeout"
                with pytest.raises(ConnectionClosed) as info:
                    await asyncio.wait_for(ws.recv(), 5)
            assert info.value.rcvd is not None and info.value.rcvd.code == 1008


@pytest.mark.parametrize(
    ("first", "text", "reason", "code"),
    [
        (b"\x00\x01", False, "BINARY_BEFORE_ACCEPT", 1002),
        (b"not json", True, "MALFORMED_MESSAGE", 1002),
        # a PING the gateway would answer itself were it valid UTF-8: the worker refuses it
        (b'{"type":"PING","payload":{"x":"\xff"}}', True, "MALFORMED_MESSAGE", 1007),
    ],
)
async def test_a_violation_closes_through_the_gateway_as_a_direct_server_closes_it(
    nats_server: LocalNatsServer, first: bytes, text: bool, reason: str, code: int
) -> None:
    """A clean-room client got the worker's REJECT through the gateway, then a cut connection
    (1006), where a direct server closes 1002 with the code as reason: the worker's channel CLOSE
    carried 1002, which the gateway took for a failure and aborted on. A close frame from one side
    now closes the other side with its code and reason."""
    url = f"{nats_server.url}/test.{uuid.uuid4().hex}"
    async with m2mwire.serve(echo, url), m2mwire.gateway("ws://127.0.0.1:0", url) as gw:
        async with ws_connect(gw.url) as ws:
            await ws.send(first, text=text)
            reject = await asyncio.wait_for(ws.recv(), 10)
            assert '"REJECT"' in str(reject) and reason in str(reject)
            with pytest.raises(ConnectionClosed) as info:
                await asyncio.wait_for(ws.recv(), 10)
        assert info.value.rcvd is not None, "the connection was cut without a close frame"
        assert (info.value.rcvd.code, info.value.rcvd.reason) == (code, reason)


@pytest.mark.parametrize("text", [True, False])
async def test_a_first_message_over_a_control_messages_size_is_refused_unread_as_by_a_direct_server(
    nats_server: LocalNatsServer, text: bool
) -> None:
    """A direct server reads at most 64 KiB (CONTROL_MESSAGE_LIMIT) until its ACCEPT; the gateway
    took up to its max_payload (16 MiB) from a connection that had said nothing yet, and its
    client got the worker's REJECT where a direct server's closes 1009 unread. (After the ACCEPT
    the limit is what the session negotiated: test_a_gatewayed_session_reaches_the_worker
    carries 3 MiB.)"""
    url = f"{nats_server.url}/test.{uuid.uuid4().hex}"
    first = "x" * (100 * 1024)
    async with m2mwire.serve(echo, url), m2mwire.serve(echo, "ws://127.0.0.1:0") as direct:
        async with m2mwire.gateway("ws://127.0.0.1:0", url) as gw:
            for server_url in (f"ws://127.0.0.1:{direct.port}", gw.url):
                async with ws_connect(server_url, max_size=None) as ws:
                    await ws.send(first if text else first.encode())
                    with pytest.raises(ConnectionClosed) as info:
                        got = await asyncio.wait_for(ws.recv(), 10)
                        pytest.fail(f"{server_url} answered {str(got)[:80]!r} before closing")
                assert info.value.rcvd is not None and info.value.rcvd.code == 1009, server_url


async def test_a_client_that_stops_reading_has_its_relay_dropped_after_write_timeout(
    nats_server: LocalNatsServer,
) -> None:
    """A WebSocket client that sent large messages to an echo worker and never read held its relay,
    and the messages in it, for as long as its connection stayed open: the gateway waited on
    the client's socket without a bound (3 such clients: 605 MB of a gateway, still held at 70 s;
    stop 30's attack run). A relayed message the client has not taken within write_timeout now
    ends the relay."""
    url = f"{nats_server.url}/test.{uuid.uuid4().hex}"
    client = SessionProtocol(Role.CLIENT, SessionConfig(algorithms=(Algorithm.NONE,)))
    client.initiate(0.0)
    patient = {"timers": {"write_timeout": 60, "ping_interval": 60}}  # the gateway acts first
    async with m2mwire.serve(echo, url, **patient):
        async with m2mwire.gateway("ws://127.0.0.1:0", url, write_timeout=1.0) as gw:
            # A small receive buffer, fixed before connecting (no autotuning): the kernel cannot
            # absorb the echo, whatever the machine's tcp_rmem allows (a CI machine's did absorb
            # 32 MB with a default socket, so nothing waited and the relay was never dropped).
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", urlsplit(gw.url).port))
            async with ws_connect(gw.url, sock=sock, max_size=None, max_queue=1, close_timeout=1) as ws:
                (hello,) = client.data_to_send()
                assert isinstance(hello, SendMessage)
                await ws.send(hello.message.decode())
                client.receive_text(await asyncio.wait_for(ws.recv(), 10), 0.0)
                assert client.state is State.ESTABLISHED
                for _ in range(8):  # ~32 MB echoed back to a client that reads nothing more
                    client.send("z" * (4 << 20), 0.0)
                    for out in client.data_to_send():  # large text goes in binary form ('T')
                        assert isinstance(out, SendMessage)
                        message = out.message
                        await ws.send(message.decode() if isinstance(message, bytes) else b"".join(message))
                async with asyncio.timeout(20):
                    while gw._relays:  # the relay's task ends, and both its connections with it
                        await asyncio.sleep(0.05)


# -- the gateway's memory of routes is bounded ----------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_routes_of_lost_sessions_expire_after_the_window() -> None:
    clock = Clock()
    routes = ResumeRoutes(60.0, clock=clock)
    relay = object()
    routes.attach("s1", "_M2M.svc.a", relay)
    clock.now = 1000.0  # a live session's route never expires
    assert routes.find("s1") == "_M2M.svc.a"
    routes.detach("s1", relay, ended=False)  # its connection was lost
    clock.now = 1059.0
    assert routes.find("s1") == "_M2M.svc.a"
    clock.now = 1060.0
    assert routes.find("s1") is None and len(routes) == 0


def test_an_orderly_end_forgets_the_route_and_a_stale_relay_does_not_touch_the_new_one() -> None:
    routes = ResumeRoutes(60.0)
    old, new = object(), object()
    routes.attach("s1", "_M2M.svc.a", old)
    routes.attach("s1", "_M2M.svc.a", new)  # resumed on a new connection before the old one ended
    routes.detach("s1", old, ended=False)
    assert routes._live["s1"][1] is new and not routes._detached
    routes.detach("s1", new, ended=True)
    assert routes.find("s1") is None and len(routes) == 0


def test_routes_of_lost_sessions_are_bounded_in_number() -> None:
    routes = ResumeRoutes(60.0, limit=100)
    for i in range(1000):
        relay = object()
        routes.attach(f"s{i}", f"_M2M.svc.{i}", relay)
        routes.detach(f"s{i}", relay, ended=False)
    assert len(routes) == 100
    assert routes.find("s899") is None and routes.find("s900") == "_M2M.svc.900"  # the oldest went


def test_a_gateway_with_resume_window_0_remembers_no_lost_session() -> None:
    routes = ResumeRoutes(0.0)
    relay = object()
    routes.attach("s1", "_M2M.svc.a", relay)
    routes.detach("s1", relay, ended=False)
    assert routes.find("s1") is None


def test_gateway_options_are_checked() -> None:
    """Bad options raise ConfigError (an M2MError and a ValueError), naming what to give instead."""
    nats = "nats://127.0.0.1:4222/x"
    with pytest.raises(m2mwire.ConfigError, match="resume_window"):
        m2mwire.gateway("ws://127.0.0.1:0", nats, resume_window=-1)
    with pytest.raises(m2mwire.ConfigError, match=r"unknown gateway.*colour.*valid: .*cert_dir"):
        m2mwire.gateway("ws://127.0.0.1:0", nats, colour="blue")
    with pytest.raises(m2mwire.ConfigError, match="listens on ws://"):
        m2mwire.gateway(nats, nats)
    with pytest.raises(m2mwire.ConfigError, match="nats:// service"):
        m2mwire.gateway("ws://127.0.0.1:0", "ws://127.0.0.1:1")


def test_gateway_options_apply_to_the_listening_scheme_as_serves_do() -> None:
    """gateway() took certfile= on ws:// without a word (serve() refuses it) and nats_window="big"
    until the first relay: both are ConfigErrors at the call now (a CLI review found them)."""
    nats = "nats://127.0.0.1:4222/x"
    with pytest.raises(m2mwire.ConfigError, match="certfile= does not apply to a gateway listening on ws://"):
        m2mwire.gateway("ws://127.0.0.1:0", nats, certfile="cert.pem")
    with pytest.raises(m2mwire.ConfigError, match="nats_window= must be a number of bytes"):
        m2mwire.gateway("ws://127.0.0.1:0", nats, nats_window="big")
    m2mwire.gateway("ws://127.0.0.1:0", nats, certfile=None)  # None counts as left out
    m2mwire.gateway("wss://127.0.0.1:0", nats, cert_dir=False)
