"""Reconnect and resume over NATS with a real nats-server (issues 14 and 15, docs/PROTOCOL.md §5a
"Resuming" and §9).

The client reaches nats-server through a TCP proxy that cuts its NATS connection and refuses new
ones for longer than the session's liveness allows, so the session is detached (not just carried
over a nats-py reconnect by the channel's own resend) and must resume. A resume must reach the
worker that holds the session: each test has a second worker of the same service, and the holder
has stopped taking new sessions (``close()``, as while it is being replaced), so a resuming OPEN
sent to the service's queue group would deterministically reach the wrong worker.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

import m2mwire
from m2mwire.api import Server, Session
from m2mwire.errors import SessionClosed, TransportError
from m2mwire.reconnect import Reconnect
from m2mwire.transport.nats.channel import NatsChannel
from m2mwire.transport.nats.local import LocalNatsServer
from m2mwire.transport.nats.service import open_nats_channel, serve_nats
from tests.chaosproxy import TcpChaosProxy
from tests.test_resume import (
    IDENT,
    Exchanging,
    break_during,
    check_exactly_once_in_order,
    exchange,
    workload,
)
from tests.transport.test_nats import worker_process

# Liveness in fractions of a second, so a refused NATS connection detaches the session (PINGs:
# 0.2 + 2 * 0.2 s; probes: 3 * 0.2 s) and each test takes seconds.
TIMERS = {"ping_interval": 0.2, "pong_timeout": 0.2, "max_missed_pongs": 2}
WORKER = {"timers": TIMERS, "probe_interval": 0.2, "identity": IDENT}
CLIENT = {**WORKER, "reconnect_time_wait": 0.05, "max_reconnect_attempts": -1, "open_timeout": 2.0}
FAST = Reconnect(initial_delay=0.01, max_delay=0.1, max_elapsed=20.0)
OUTAGE = 1.0  # seconds the client's NATS connection stays refused: well past the 0.6 s above


async def echo(session: Session) -> None:
    async for message in session:
        await session.send(message.text or "")


@asynccontextmanager
async def on_a_draining_worker(
    nats_server: LocalNatsServer,
    handler: Callable[[Session], Awaitable[None]],
    client_options: dict[str, Any] | None = None,
    **worker_options: Any,
) -> AsyncIterator[tuple[Session, TcpChaosProxy, Server]]:
    """A client session (through the proxy) held by worker A, which then stops taking new
    sessions, while worker B serves the same service; yields (session, proxy, A)."""
    subject = f"test.{uuid.uuid4().hex}"
    options = {**WORKER, **worker_options}
    async with m2mwire.serve(handler, f"{nats_server.url}/{subject}", agent_id="worker-a", **options) as a:
        proxy = await TcpChaosProxy(nats_server.port).start()
        session: Session | None = None
        try:
            session = await m2mwire.connect(
                f"nats://127.0.0.1:{proxy.port}/{subject}", reconnect=FAST, **(client_options or CLIENT)
            )
            assert session.info.peer_agent_id == "worker-a"
            a.close()  # A takes no new session, but its sessions go on
            async with m2mwire.serve(handler, f"{nats_server.url}/{subject}", agent_id="worker-b", **options):
                yield session, proxy, a
        finally:
            if session is not None:
                await session.close()
                await released(session)
            await proxy.close()


async def released(session: Session) -> None:
    """Until the client's NATS connection is closed: its last session released it, in a task of
    its own; cut by the proxy first, it would retry forever (max_reconnect_attempts=-1)."""
    channel = session._channel
    assert isinstance(channel, NatsChannel)
    for _ in range(500):
        if channel._nc.is_closed:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the client's NATS connection is still open 5 s after its session closed")


async def outage(proxy: TcpChaosProxy, seconds: float) -> None:
    """Cut the client's NATS connection and refuse new ones for ``seconds``."""
    proxy.refusing = True
    proxy.cut()
    await asyncio.sleep(seconds)
    proxy.refusing = False


@pytest.mark.timeout(60)
async def test_a_session_resumes_on_its_worker_while_messages_flow(nats_server: LocalNatsServer) -> None:
    """Three outages of the client's NATS connection at random points of an exchange both ways:
    the session resumes each time on worker A (not B, which the queue group would pick), with its
    id unchanged, and every message arrives exactly once, in order, on both sides."""
    count = 600
    to_worker, to_client = workload(21, count, 16 * 1024), workload(22, count, 16 * 1024)
    handler = Exchanging(to_client, count)

    async with on_a_draining_worker(nats_server, handler) as (session, proxy, _a):
        sid = session.info.session_id

        async def one_outage() -> None:
            await outage(proxy, OUTAGE)

        chaos = asyncio.create_task(break_during(session, count, random.Random(23), one_outage))
        client_got = await asyncio.wait_for(exchange(session, to_worker, count), 40)
        await asyncio.wait_for(chaos, 20)
        await asyncio.wait_for(handler.done.wait(), 20)
        check_exactly_once_in_order(to_client, client_got)
        check_exactly_once_in_order(to_worker, handler.got)
        assert session.stats.reconnects >= 3  # one per outage (more if a loaded machine missed PONGs)
        assert session.info.session_id == sid and session.info.peer_agent_id == "worker-a"
        channel = session._channel
        assert isinstance(channel, NatsChannel) and channel.resume_route is not None
        assert channel.resume_route.startswith("_M2M.test.")  # the worker's own subject


async def test_a_nats_connection_closed_for_good_resumes_on_a_new_one(nats_server: LocalNatsServer) -> None:
    """nats-py gives up reconnecting (max_reconnect_attempts=1) and closes the process's NATS
    connection: the session opens a new connection once nats-server is reachable, and resumes."""
    client = {**CLIENT, "max_reconnect_attempts": 1}
    async with on_a_draining_worker(nats_server, echo, client) as (session, proxy, _a):
        await session.send("before")
        assert (await asyncio.wait_for(session.recv(), 5)).text == "before"
        old = session._channel
        assert isinstance(old, NatsChannel)
        await outage(proxy, OUTAGE)
        await session.send("after")  # retained while detached, sent on the resumed session
        assert (await asyncio.wait_for(session.recv(), 10)).text == "after"
        new = session._channel
        assert isinstance(new, NatsChannel) and new._bus is not old._bus and old._bus.nc.is_closed
        assert session.stats.reconnects == 1 and session.info.peer_agent_id == "worker-a"


async def test_a_killed_worker_ends_a_reconnecting_session_at_once(nats_server: LocalNatsServer) -> None:
    """The worker process holding the session is killed while another worker serves the service:
    the client does not resume elsewhere nor retry until max_elapsed (20 s) but ends, within a few
    seconds, with SessionClosed RESUME_UNKNOWN saying that the worker is gone."""
    url = f"{nats_server.url}/test.{uuid.uuid4().hex}"
    loop = asyncio.get_running_loop()
    async with worker_process(url) as worker:
        session = await m2mwire.connect(url, reconnect=FAST, timers=TIMERS, probe_interval=0.2)
        assert session.info.peer_agent_id == f"worker-{worker.pid}"  # the only worker so far
        async with m2mwire.serve(echo, url, **WORKER):
            await session.send("before")
            assert (await asyncio.wait_for(session.recv(), 10)).text == f"{worker.pid}:before"
            worker.kill()
            await worker.wait()
            started = loop.time()
            with pytest.raises(SessionClosed) as info:
                await asyncio.wait_for(session.recv(), 15)
            # detection (~0.6 s), then three "no responders" answers 1 s apart
            assert loop.time() - started < 6.0
            assert info.value.code == "RESUME_UNKNOWN"
            assert "worker" in info.value.reason and "is gone" in info.value.reason
            assert session.stats.reconnects == 0


async def test_a_wrong_token_over_nats_is_refused_by_the_worker(nats_server: LocalNatsServer) -> None:
    async with on_a_draining_worker(nats_server, echo) as (session, proxy, _a):
        resume = session._protocol.resume
        assert resume is not None
        # knowing the session id (and the worker's subject) is not enough
        resume.token = resume.token[:-1] + ("B" if resume.token.endswith("A") else "A")
        await outage(proxy, OUTAGE)
        with pytest.raises(SessionClosed) as info:
            await asyncio.wait_for(session.recv(), 10)
        assert info.value.code == "RESUME_REFUSED"


async def test_the_workers_resume_window_applies_over_nats(nats_server: LocalNatsServer) -> None:
    handler_error: list[SessionClosed] = []

    async def waiting(session: Session) -> None:
        try:
            await session.recv()
        except SessionClosed as exc:
            handler_error.append(exc)

    async with on_a_draining_worker(nats_server, waiting, resume_window=0.3) as (session, proxy, _a):
        # the worker notices within ~0.6 s, then waits 0.3 s: the client is away for longer
        await outage(proxy, 2.5)
        with pytest.raises(SessionClosed) as info:
            await asyncio.wait_for(session.recv(), 10)
        assert info.value.code == "RESUME_EXPIRED"
        assert [e.code for e in handler_error] == ["RESUME_EXPIRED"]


# -- a dropped channel lets go at once ------------------------------------------------------------
# A session that detaches aborts its channel and resumes on a new one, after the old channel's
# write in progress has ended: a send that waits in the old channel must end at abort(), or the
# resumed session writes nothing (its HELLO included) until write_timeout (found by the NATS case
# of benchmarks/bench_resume.py).

SMALL_PENDING = {"nats_options": {"pending_size": 4096}}  # nats-py's buffer: a 100 kB message fills it


@asynccontextmanager
async def idle_service(nats_server: LocalNatsServer) -> AsyncIterator[str]:
    """A NATS service whose worker channels only wait (at most 10 s); yields its URL."""
    finished = asyncio.Event()

    async def idle(channel: NatsChannel) -> None:
        await asyncio.wait_for(finished.wait(), 10)

    url = f"{nats_server.url}/test.{uuid.uuid4().hex}"
    listener = await serve_nats(idle, url, max_message_size=1 << 20, options={})
    try:
        yield url
    finally:
        finished.set()
        listener.close()
        await listener.wait_closed()


async def test_a_send_waiting_for_the_nats_connection_ends_at_abort(nats_server: LocalNatsServer) -> None:
    async with idle_service(nats_server) as url:
        proxy = await TcpChaosProxy(nats_server.port).start()
        try:
            options = {**SMALL_PENDING, "reconnect_time_wait": 0.05, "max_reconnect_attempts": -1}
            channel = await open_nats_channel(
                f"nats://127.0.0.1:{proxy.port}/{url.rsplit('/', 1)[1]}",
                max_message_size=1 << 20,
                options=options,
            )
            await outage_started(proxy, channel)
            sending = asyncio.create_task(channel.send(b"x" * 100_000))  # waits for the connection
            await asyncio.sleep(0.2)
            assert not sending.done()
            channel.abort()
            with pytest.raises(TransportError, match="aborted"):
                await asyncio.wait_for(sending, 1.0)  # not once the connection is back (never, here)
        finally:
            await proxy.close()


async def outage_started(proxy: TcpChaosProxy, channel: NatsChannel) -> None:
    proxy.refusing = True
    proxy.cut()
    for _ in range(100):
        if not channel._nc.is_connected:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("nats-py did not notice the cut within 1 s")


async def test_a_send_in_a_forced_flush_does_not_outlive_the_connection(nats_server: LocalNatsServer) -> None:
    """nats-py's publish waits for a flush when its pending buffer is full; if the connection
    closes before the flusher takes that flush, nats-py never completes it: the bus bounds the
    wait (flush_timeout), so the channel's send ends, and the channel fails with the connection."""

    async with idle_service(nats_server) as url:
        channel = await open_nats_channel(url, max_message_size=1 << 20, options=SMALL_PENDING)
        sending = asyncio.create_task(channel.send(b"x" * 100_000))
        await asyncio.sleep(0)  # the publish is queued behind a forced flush
        await channel._nc.close()
        # the flush timeout is 2 s; forever before (wait_for cannot tell: nats-py swallows the
        # cancellation of a publish waiting for a flush)
        done, _ = await asyncio.wait({sending}, timeout=4.0)
        assert sending in done, "the send still waits for a flush of a closed connection"
        sending.result()
        assert channel.lost is not None and "NATS connection closed" in str(channel.lost)
