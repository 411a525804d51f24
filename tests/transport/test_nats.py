"""The NATS transport with a real nats-server (and a real 3-node cluster) on loopback."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import ssl
import string
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import m2mwire
from m2mwire.api import Session
from m2mwire.errors import ConfigError, SessionClosed, TransportError
from m2mwire.transport.nats import frames as f
from m2mwire.transport.nats.channel import NatsChannel
from m2mwire.transport.nats.local import LocalNatsServer, start_cluster
from m2mwire.transport.nats.service import open_nats_channel, serve_nats

WORKER = Path(__file__).with_name("nats_worker.py")
ROOT = Path(__file__).resolve().parents[2]


def service(server: LocalNatsServer) -> str:
    return f"{server.url}/test.{uuid.uuid4().hex}"


async def echo(session: Session) -> None:
    async for message in session:
        await session.send(message.text or "", algorithm="none")


@asynccontextmanager
async def worker_process(url: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """A worker in a process of its own (tests/transport/nats_worker.py), killed at the end."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), url, stdout=asyncio.subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.strip() == b"ready", line
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        await asyncio.wait_for(proc.wait(), 10)


async def test_a_message_three_times_max_payload_is_chunked(nats_server: LocalNatsServer) -> None:
    text = "".join(random.Random(7).choices(string.ascii_letters, k=3 * 1024 * 1024))
    async with m2mwire.serve(echo, service(nats_server)) as server:
        async with m2mwire.connect(server.url) as session:
            channel = session._channel
            assert isinstance(channel, NatsChannel)
            nc = channel._nc
            assert nc.max_payload == 1024 * 1024  # the server's limit, announced in its INFO
            before = nc.stats["out_msgs"]
            await session.send(text, algorithm="none")
            assert nc.stats["out_msgs"] - before >= 4  # 3 MiB cannot go in fewer 1 MiB messages
            reply = await asyncio.wait_for(session.recv(), 30)
            assert reply.text == text


async def test_a_session_over_tls_carries_large_messages_without_reconnecting(
    tls_nats: tuple[LocalNatsServer, ssl.SSLContext],
) -> None:
    """``tls=`` (an SSLContext, passed to nats-py) against a nats-server that requires TLS. A
    1.5 MB echo timed out half the time: large bodies were written past the TLS stream (fixed in
    compat.publish_now), and each one broke the connection."""
    server_nats, tls = tls_nats
    url = f"nats://127.0.0.1:{server_nats.port}/tls.{uuid.uuid4().hex}"  # (its url says tls://)
    async with m2mwire.serve(echo, url, tls=tls, max_payload=1 << 22) as server:
        async with m2mwire.connect(server.url, tls=tls, max_payload=1 << 22) as session:
            channel = session._channel
            assert isinstance(channel, NatsChannel)
            for size in (100, 70_000, 1_500_000):
                text = "z" * size
                await session.send(text, algorithm="none")
                assert (await asyncio.wait_for(session.recv(), 10)).text == text
            assert channel._nc.stats["reconnects"] == 0


@pytest.mark.parametrize(
    ("option", "match"),
    [
        ({"nats_window": "big"}, "nats_window= must be"),
        ({"nats_window": 2**70}, "nats_window= must be"),
        ({"nats_max_half_open": 0}, "nats_max_half_open= must be"),
    ],
)
async def test_bad_nats_numbers_are_config_errors_naming_the_option(
    nats_server: LocalNatsServer, option: dict[str, object], match: str
) -> None:
    """serve() took nats_window="big" or 2**70 (a CREDIT limit is uint64) and failed only when a
    client opened a session, and nats_max_half_open=0 raised a bare ValueError: each is now a
    ConfigError at serve(), naming the keyword."""
    with pytest.raises(ConfigError, match=match):
        async with m2mwire.serve(echo, f"{nats_server.url}/cfg.{uuid.uuid4().hex}", **option):  # type: ignore[arg-type]
            pass


@pytest.mark.parametrize(("limit", "size"), [(2 * 1024 * 1024, 3 * 1024 * 1024), (64 * 1024, 100 * 1024)])
async def test_oversized_message_refused_before_buffering(
    nats_server: LocalNatsServer, limit: int, size: int
) -> None:
    """The receiver reads the announced total in the first chunk and fails the channel at once,
    without holding any of it, when it is over the limit. A message in one NATS message (here
    100 KiB against a handshake's 64 KiB) was delivered whatever its size, and the session
    answered it, where a WebSocket endpoint closes 1009 before the session sees it."""
    seen: list[NatsChannel] = []
    done = asyncio.Event()

    async def handler(channel: NatsChannel) -> None:
        seen.append(channel)
        with pytest.raises(TransportError, match=f"over the limit of {limit} bytes") as info:
            await asyncio.wait_for(channel.recv(), 20)
        assert info.value.code == 1009
        assert channel._parts is None and not channel._held
        done.set()

    listener = await serve_nats(handler, service(nats_server), max_message_size=limit, options={})
    try:
        client = await open_nats_channel(listener.url, max_message_size=1 << 30, options={})
        await client.send(b"\0" * size)
        await asyncio.wait_for(done.wait(), 20)
        with pytest.raises(TransportError, match="peer dropped"):
            await asyncio.wait_for(client.recv(), 10)
    finally:
        listener.close()
        await listener.wait_closed()


async def test_a_slow_consumer_loses_nothing_and_the_sender_waits(nats_server: LocalNatsServer) -> None:
    """Core NATS drops messages for a slow consumer; the credit window makes the sender wait
    instead: 40 MB to a reader that sleeps first, then reads slowly, arrive complete and in order."""
    n, size = 600, 64 * 1024
    received: list[int] = []
    start_reading = asyncio.Event()
    finished = asyncio.Event()

    async def slow(session: Session) -> None:
        await start_reading.wait()
        async for message in session:
            text = message.text or ""
            assert len(text) == size
            received.append(int(text[:8]))
            if len(received) % 50 == 0:
                await asyncio.sleep(0.01)
            if len(received) == n:
                finished.set()

    async with m2mwire.serve(slow, service(nats_server), max_queue=4) as server:
        async with m2mwire.connect(server.url, nats_window=2 * 1024 * 1024) as session:
            sent = 0

            async def blast() -> None:
                nonlocal sent
                for i in range(n):
                    await session.send(f"{i:08d}".ljust(size, "x"), algorithm="none")
                    sent += 1

            task = asyncio.create_task(blast())
            await asyncio.sleep(1.0)
            # window (8 MiB: at least 4 NATS max_payloads) + inbox + one in reassembly, not 40 MB
            assert not task.done() and sent < 200, f"{sent} messages sent to a peer that reads nothing"
            start_reading.set()
            await asyncio.wait_for(task, 60)
            await asyncio.wait_for(finished.wait(), 60)
    assert received == list(range(n))


async def test_two_worker_processes_share_sessions_and_keep_them(nats_server: LocalNatsServer) -> None:
    url = service(nats_server)
    async with worker_process(url) as w1, worker_process(url) as w2:
        pids = {w1.pid, w2.pid}

        async def one(k: int) -> int:
            async with m2mwire.connect(url) as session:
                worker = session.info.peer_agent_id
                assert worker.startswith("worker-")
                pid = int(worker.removeprefix("worker-"))
                for i in range(5):
                    await session.send(f"{k}.{i}")
                    reply = (await asyncio.wait_for(session.recv(), 10)).text or ""
                    assert reply == f"{pid}:{k}.{i}"  # every message of a session, same worker
                return pid

        served = await asyncio.wait_for(asyncio.gather(*(one(k) for k in range(20))), 60)
    assert set(served) == pids  # the queue group spread the sessions over both workers
    assert all(served.count(pid) >= 2 for pid in pids)


async def test_a_killed_worker_ends_the_client_session_clearly(nats_server: LocalNatsServer) -> None:
    url = service(nats_server)
    async with worker_process(url) as worker:
        session = await m2mwire.connect(url, probe_interval=0.3)
        await session.send("before")
        assert (await asyncio.wait_for(session.recv(), 10)).text == f"{worker.pid}:before"
        worker.kill()
        await worker.wait()
        started = asyncio.get_running_loop().time()
        with pytest.raises(TransportError, match="peer of this NATS session is gone"):
            await asyncio.wait_for(session.recv(), 10)
        # three probes 0.3 s apart (the PINGs, at 60 s by default, would take minutes)
        assert asyncio.get_running_loop().time() - started < 3.0
        event = session.close_event
        assert event is not None and event.code == "TRANSPORT_CLOSED"
        await session.close()


async def test_no_worker_fails_at_once(nats_server: LocalNatsServer) -> None:
    with pytest.raises(TransportError, match="no worker serves"):
        await asyncio.wait_for(m2mwire.connect(service(nats_server)), 5)


@pytest.mark.parametrize("victim", ["client", "worker"])
async def test_cluster_node_loss_keeps_the_session(victim: str) -> None:
    """Client on node 0, worker on node 1 (3-node cluster); kill the node one of them is on while
    messages flow both ways: nats-py reconnects to another node, the channel resends what the
    dead node lost, and every message arrives once, in order."""
    nodes = await asyncio.to_thread(start_cluster, 3)
    try:
        a, b, c = nodes
        subject = f"test.{uuid.uuid4().hex}"
        fast = {"reconnect_time_wait": 0.1, "nats_options": {"dont_randomize": True}}

        def url(*hosts: LocalNatsServer) -> str:
            return "nats://" + ",".join(h.url.removeprefix("nats://") for h in hosts) + "/" + subject

        got: list[str] = []
        async with m2mwire.serve(echo, url(b, c), **fast) as server:
            await asyncio.sleep(0.3)  # the worker's interest reaches every node
            async with m2mwire.connect(url(a, c), **fast) as session:
                for i in range(20):
                    await session.send(f"m{i}")
                    got.append((await asyncio.wait_for(session.recv(), 10)).text or "")
                pending = [asyncio.create_task(session.send(f"m{i}")) for i in range(20, 40)]
                (a if victim == "client" else b).kill()
                await asyncio.wait_for(asyncio.gather(*pending), 20)
                for i in range(40, 80):
                    await asyncio.wait_for(session.send(f"m{i}"), 20)
                while len(got) < 80:
                    got.append((await asyncio.wait_for(session.recv(), 20)).text or "")
                assert session.state is m2mwire.api.State.ESTABLISHED
                channel = session._channel
                assert isinstance(channel, NatsChannel)
                bus = channel._bus if victim == "client" else server._impl._bus
                assert bus.nc.stats["reconnects"] == 1  # the victim's connection moved to another node
        assert got == [f"m{i}" for i in range(80)]
    finally:
        for node in nodes:
            node.stop()


async def test_session_closed_cleanly_over_nats(nats_server: LocalNatsServer) -> None:
    async with m2mwire.serve(echo, service(nats_server)) as server:
        session = await m2mwire.connect(server.url)
        await session.close()
        with pytest.raises(SessionClosed):
            await session.send("after close")


async def test_a_malformed_frame_fails_only_its_own_session(nats_server: LocalNatsServer) -> None:
    async with m2mwire.serve(echo, service(nats_server)) as server:
        async with m2mwire.connect(server.url) as good:
            bad = await open_nats_channel(server.url, max_message_size=1 << 20, options={})
            # a continuation chunk with no first chunk before it, as sequenced message 1
            await bad._nc.publish(bad._out, f.HEADER.pack(f.CONT, 1) + b"stray")
            with pytest.raises(TransportError, match="continuation without a first chunk"):
                await asyncio.wait_for(bad.recv(), 10)
            await good.send("unaffected")
            assert (await asyncio.wait_for(good.recv(), 10)).text == "unaffected"


async def test_send_now_writes_within_credit_and_pending_buffer_and_declines_otherwise(
    nats_server: LocalNatsServer,
) -> None:
    """The DirectSendChannel contract over a real nats-server: send_now publishes a whole message
    synchronously, or returns False having written nothing, when nats-py's pending buffer (2 MiB by
    default, flushed only when the loop runs) or the peer's credit would make send() wait."""
    received: list[bytes | str] = []
    paused = asyncio.Event()
    finished = asyncio.Event()
    server_channels: list[NatsChannel] = []

    async def handler(channel: NatsChannel) -> None:
        channel.pause_reading()  # hold everything: no credit is granted while paused
        channel.start_push(lambda data, _text: received.append(data), lambda _err: None)
        server_channels.append(channel)
        paused.set()
        await asyncio.wait_for(finished.wait(), 30)

    listener = await serve_nats(handler, service(nats_server), max_message_size=1 << 24, options={})
    try:
        client = await open_nats_channel(listener.url, max_message_size=1 << 24, options={})
        await asyncio.wait_for(paused.wait(), 10)
        nc = client._nc
        size = 200_000
        cost = f.HEADER.size + size + f.MESSAGE_COST
        fits = client._sender.limit // cost  # the server's window, in these messages
        assert 5 < fits < 100
        sent = 0

        def message(i: int) -> bytes:
            return bytes([i]) * size

        def declined_untouched() -> bool:
            before = (nc.stats["out_msgs"], client._sender.next_seq, len(client._sender.unacked))
            result = client.send_now(message(sent))
            assert not result
            return before == (nc.stats["out_msgs"], client._sender.next_seq, len(client._sender.unacked))

        # Without the loop running, nats-py's pending buffer fills first (credit is left).
        while sent < fits and client.send_now(message(sent)):
            sent += 1
        assert 1 <= sent < fits and client._sender.has_credit(cost)
        assert declined_untouched()
        # With the buffer flushed after each message, the peer's credit is the limit.
        await nc.flush()
        while sent < 2 * fits and client.send_now(message(sent)):
            sent += 1
            await nc.flush()
        assert sent == fits and not client._sender.has_credit(cost)
        assert declined_untouched()
        # The server reads: every message arrives once, in order, and credit comes back.
        server_channels[0].resume_reading()
        for _ in range(200):
            if client.send_now(message(sent)):
                sent += 1
                break
            await asyncio.sleep(0.02)
        assert sent == fits + 1
        for _ in range(200):
            if len(received) == sent:
                break
            await asyncio.sleep(0.02)
        assert received == [message(i) for i in range(sent)]
        assert client.send_now("text") and client.send_now([b"ab", memoryview(b"cd")])
        assert not client.send_now(b"x" * (client._chunk + 1))  # chunked messages are send()'s job
        await client.close()
        assert not client.send_now("after close")
    finally:
        finished.set()
        listener.close()
        await listener.wait_closed()


async def test_a_buffer_changed_after_sending_arrives_as_it_was_sent(nats_server: LocalNatsServer) -> None:
    """The channel queues and retains a message's bytes by reference until acknowledged (no copy
    for bytes and str); a buffer the caller may change later (bytearray, a writable view) is
    copied once, so what arrives, and what a resend would send, is what was sent."""
    received: list[bytes | str] = []
    started, finished = asyncio.Event(), asyncio.Event()

    async def handler(channel: NatsChannel) -> None:
        channel.start_push(lambda data, _text: received.append(data), lambda _err: None)
        started.set()
        await asyncio.wait_for(finished.wait(), 30)

    listener = await serve_nats(handler, service(nats_server), max_message_size=1 << 24, options={})
    try:
        client = await open_nats_channel(listener.url, max_message_size=1 << 24, options={})
        await asyncio.wait_for(started.wait(), 10)
        small = bytearray(b"a" * 1000)
        big = bytearray(b"b" * (client._chunk + 5000))  # chunked: send() rather than send_now()
        assert client.send_now(small)
        small[:] = b"z" * 1000
        view = memoryview(bytearray(b"c" * 10))
        assert client.send_now(view)
        view[:] = b"z" * 10
        task = asyncio.ensure_future(client.send(big))
        await asyncio.sleep(0)
        big[:] = b"z" * len(big)
        await task
        retained = [bytes(head) + bytes(body) for head, body in client._sender.payloads()]
        assert all(b"z" not in part[f.HEADER.size :] for part in retained[:2])
        for _ in range(300):
            if len(received) == 3:
                break
            await asyncio.sleep(0.02)
        assert received == [b"a" * 1000, b"c" * 10, b"b" * (client._chunk + 5000)]
        await client.close()
    finally:
        finished.set()
        listener.close()
        await listener.wait_closed()


def test_a_local_server_runs_with_the_gogc_asked_for() -> None:
    with LocalNatsServer(gogc=400) as server:
        assert server._proc is not None
        environ = Path(f"/proc/{server._proc.pid}/environ").read_bytes().split(b"\0")
        assert b"GOGC=400" in environ


async def test_closing_after_the_nats_server_died_raises_nothing_and_leaves_nothing_running() -> None:
    """nats-py's close() first writes what it still holds for the socket; on a connection whose
    server died that write raised (ConnectionResetError out of server.aclose()), and the
    close stopped before cancelling the subscriptions' tasks. Regression test for
    transport/nats/bus.release_bus, which now drops what cannot be delivered first."""
    timers = {"close_timeout": 0.3}
    with LocalNatsServer() as nats_server:
        url = service(nats_server)
        server = await m2mwire.serve(echo, url, timers=timers)
        session = await m2mwire.connect(url, timers=timers)
        await session.send("before")
        assert (await asyncio.wait_for(session.recv(), 10)).text == "before"
        nats_server.kill()
        await asyncio.sleep(0.3)  # nats-py notices, and holds what is published from now on
        await asyncio.wait_for(session.close(), 10)
        await asyncio.wait_for(server.aclose(), 10)  # raised ConnectionResetError before
    for _ in range(20):  # bounded: cancelled tasks finish within a few loop turns
        left = [t for t in asyncio.all_tasks() if not t.done() and "_wait_for_msgs" in repr(t.get_coro())]
        if not left:
            break
        await asyncio.sleep(0.05)
    assert not left, f"nats-py subscription tasks left running: {left}"


async def test_no_nats_server_fails_within_the_first_round_saying_so() -> None:
    """With nothing listening, connect() waited silently for nats-py's 60 reconnect attempts per
    server, 2 s apart (a CLI user saw nothing for minutes): the first connection now gets one
    round over the servers, connect_timeout each, then a TransportError naming them."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    url = f"nats://127.0.0.1:{port}/nobody.home"
    started = time.monotonic()
    with pytest.raises(TransportError, match=f"could not connect to NATS at nats://127.0.0.1:{port}"):
        async with asyncio.timeout(15):
            async with m2mwire.connect(url, connect_timeout=0.5):
                pass
    assert time.monotonic() - started < 5


async def test_a_worker_and_a_client_authenticate_with_nkeys(tmp_path: Path) -> None:
    """docs/PROTOCOL.md recommends NKey/JWT credentials, but the nats extra did not install nkeys:
    credentials= and nkeys_seed= failed with ModuleNotFoundError (a CLI review found it). A real
    nats-server that admits one user NKey: the worker and the client that hold its seed get a
    session; a client without it is refused by nats-server."""
    import nkeys

    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    (tmp_path / "user.nk").write_bytes(seed)
    auth = f'authorization {{ users = [ {{ nkey: "{public}" }} ] }}'
    with LocalNatsServer(config=(auth,)) as server:
        url = f"{server.url}/nk.{uuid.uuid4().hex}"
        key = {"nkeys_seed": str(tmp_path / "user.nk")}
        async with m2mwire.serve(echo, url, **key), m2mwire.connect(url, **key) as session:
            await session.send("signed in", algorithm="none")
            assert (await asyncio.wait_for(session.recv(), 10)).text == "signed in"
        with pytest.raises(TransportError, match="could not connect to NATS"):
            async with asyncio.timeout(15), m2mwire.connect(url, connect_timeout=1):
                pass


async def test_the_documented_permissions_are_enough_and_no_more_is_asked() -> None:
    """docs/PROTOCOL.md §5a's permissions table, on a real nats-server: a worker and a client
    holding only what it lists get a session (a chunked message included), and nats-server logs
    no violation. Every worker process subscribed a client inbox it never used, which a worker's
    permissions do not grant: nats-server logged a subscription violation for each."""
    subject = f"perm.{uuid.uuid4().hex}"
    auth = (
        "authorization { users = ["
        f' {{ user: worker, password: w, permissions: {{ publish: ["_INBOX.>"],'
        f' subscribe: ["{subject}", "_M2M.{subject}.>"] }} }},'
        f' {{ user: client, password: c, permissions: {{ publish: ["{subject}", "_M2M.{subject}.>"],'
        ' subscribe: ["_INBOX.>"] } }'
        " ] }"
    )
    with LocalNatsServer(config=(auth,)) as server:
        url = f"{server.url}/{subject}"
        async with m2mwire.serve(echo, url, user="worker", password="w"):
            async with m2mwire.connect(url, user="client", password="c") as session:
                for text in ("in", "z" * (1536 * 1024)):  # over nats-server's 1 MiB: chunked
                    await session.send(text, algorithm="none")
                    assert (await asyncio.wait_for(session.recv(), 10)).text == text
        await asyncio.sleep(0.2)  # nats-server writes its log as it goes
        log = server.log_text()
    assert "Violation" not in log, [line for line in log.splitlines() if "Violation" in line]
