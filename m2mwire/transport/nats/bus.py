"""One shared NATS connection per process (per event loop and option set), and message routing.

Every session of a process uses the same nats-py connection; each process subscribes once to a
wildcard under a random prefix of its own and routes incoming messages to channels by subject,
straight from nats-py's read loop (``compat.route_directly``: no task or queue per session, nor the
subscription's own queue and task); only status answers (no responders) take nats-py's callback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from m2mwire.errors import TransportError
from m2mwire.transport.nats import compat
from m2mwire.transport.nats.options import NatsTarget, nats_connect_kwargs

__all__ = ["Bus", "Routed", "acquire_bus"]

log = logging.getLogger("m2mwire.nats")

# Status line nats-server sends to a reply subject nobody listens on (no_responders).
_NO_RESPONDERS = "503"
_CONNECT_TIMEOUT = 2.0  # nats-py's own default connect_timeout, seconds per server and attempt
_FLUSH_TIMEOUT = 2.0  # seconds a publish waits for nats-py to flush its full pending buffer


class Routed(Protocol):
    """What the bus routes messages to (a channel)."""

    def on_nats(self, data: bytes | bytearray) -> None: ...

    def on_no_responders(self) -> None: ...

    def on_reconnected(self) -> None: ...

    def on_bus_closed(self, error: TransportError) -> None: ...


class Bus:
    """A nats-py connection shared by the sessions of one process, with its subject routes."""

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.key = key
        self.nc: Client = Client()
        compat.install_parser(self.nc)
        self.routes: dict[str, Routed] = {}
        self.users = 0
        self.prefixes: dict[str, Subscription] = {}
        self.reconnected = asyncio.Event()  # set while connected
        self.client_prefix = ""  # where this process's client subjects live (client_subjects())
        self._client_lock = asyncio.Lock()
        self._started = False  # connected once: a failed first attempt has lost nothing
        self.label = f"nats-client-{secrets.token_hex(6)}"  # per-process peer label for admission

    async def start(self, target: NatsTarget, options: dict[str, Any]) -> None:
        kwargs = nats_connect_kwargs(options)
        kwargs.setdefault("name", f"m2mwire {self.label}")
        # A publish that finds nats-py's pending buffer full waits for a flush; without a timeout
        # it waits forever when the connection closes before the flusher gets to it (nats-py
        # leaves that flush pending), and a channel's send with it. After the timeout the publish
        # returns (the bytes stay buffered, as on a reconnect; credit bounds them).
        kwargs.setdefault("flush_timeout", _FLUSH_TIMEOUT)
        # nats-py retries a first connection as it retries a lost one (60 times per server, 2 s
        # apart: two minutes of silence when no server runs). The first connection gets one
        # round over the servers instead, connect_timeout each, and then fails saying why;
        # reconnecting a connection that was up keeps nats-py's policy.
        servers = list(target.servers)
        first_round = float(kwargs.get("connect_timeout", _CONNECT_TIMEOUT)) * len(servers) + 1.0
        try:
            async with asyncio.timeout(first_round):
                await self.nc.connect(
                    servers=servers,
                    error_cb=self._on_error,
                    disconnected_cb=self._on_disconnected,
                    reconnected_cb=self._on_reconnected,
                    closed_cb=self._on_closed,
                    **kwargs,
                )
        except (TimeoutError, OSError, NatsError) as exc:
            cause = self.nc.last_error if isinstance(exc, TimeoutError) and self.nc.last_error else exc
            with contextlib.suppress(NatsError, OSError, TimeoutError):
                await self.nc.close()  # stops nats-py's own tasks of the attempt
            raise TransportError(
                f"could not connect to NATS at {', '.join(servers)} within {first_round:g} s (one try "
                f"per server): {cause or type(cause).__name__}; is nats-server running there?"
            ) from exc
        self.reconnected.set()
        self._started = True

    async def client_subjects(self) -> str:
        """The prefix of this process's client channel subjects, subscribed on the first channel
        opened: a worker that opens none needs no permission to subscribe under an inbox prefix
        (nats-server logged a subscription violation for every worker holding docs/PROTOCOL.md's
        worker permissions)."""
        async with self._client_lock:  # one prefix, one subscription, however many open at once
            if not self.client_prefix:
                prefix = self.nc.new_inbox()
                await self.subscribe_prefix(prefix)
                self.client_prefix = prefix
        return self.client_prefix

    async def subscribe_prefix(self, prefix: str) -> None:
        """Route messages on ``prefix.*`` to channels (one subscription per prefix)."""
        if prefix in self.prefixes:
            return
        # pending limits off: the credit windows bound what waits here, and nats-py would drop
        # messages (slow consumer) at its own limits instead of letting us push back.
        sub = await self.nc.subscribe(
            f"{prefix}.*", cb=self._dispatch, pending_msgs_limit=0, pending_bytes_limit=0
        )
        # Nobody knows a subject under the prefix yet (a channel's subject is told to its peer
        # only after this returns), so every message of a channel takes the direct route.
        compat.route_directly(self.nc, sub, self._route)
        self.prefixes[prefix] = sub

    def _route(self, subject: bytes, data: bytes | bytearray) -> None:
        target = self.routes.get(subject.decode())
        if target is not None:  # else a session that has ended (see _dispatch)
            target.on_nats(data)

    async def _dispatch(self, msg: Msg) -> None:
        """nats-py's callback: the status answers (with headers), and nothing else."""
        target = self.routes.get(msg.subject)
        if target is None:
            return  # a session that has ended; its peer learns it from CLOSE/ABORT or liveness
        headers = msg.headers
        if headers is not None and not msg.data and headers.get("Status") == _NO_RESPONDERS:
            target.on_no_responders()
        else:
            target.on_nats(msg.data)

    async def subscribe_service(
        self, subject: str, queue: str, cb: Callable[[Msg], Awaitable[None]], *, backlog: int, max_size: int
    ) -> Subscription:
        """Subscribe ``cb`` to OPEN requests; at most ``backlog`` of them (``max_size`` bytes
        each) wait for it, and nats-py drops what arrives beyond (its requester times out and may
        retry). Unbounded, a burst of OPENs waited whole, in memory, and was served long after
        its requesters had given up."""
        return await self.nc.subscribe(
            subject, queue=queue, cb=cb, pending_msgs_limit=backlog, pending_bytes_limit=backlog * max_size
        )

    def publish_soon(self, subject: str, payload: bytes) -> None:
        """Best-effort publish from synchronous code (CREDIT, PROBE, ABORT)."""
        task = asyncio.ensure_future(self._publish_quietly(subject, payload))
        _background.add(task)
        task.add_done_callback(_background.discard)

    async def _publish_quietly(self, subject: str, payload: bytes) -> None:
        try:
            await self.nc.publish(subject, payload)
        except (NatsError, OSError) as exc:
            log.debug("NATS publish to %s failed: %s", subject, exc)

    async def _on_error(self, exc: Exception) -> None:
        log.debug("NATS connection error: %s", exc)

    async def _on_disconnected(self) -> None:
        self.reconnected.clear()
        if self._started:
            log.info("NATS connection lost; nats-py reconnects")

    async def _on_reconnected(self) -> None:
        self.reconnected.set()
        log.info("NATS reconnected to %s", self.nc.connected_url.netloc if self.nc.connected_url else "?")
        for target in list(self.routes.values()):
            target.on_reconnected()

    async def _on_closed(self) -> None:
        err = TransportError("the NATS connection closed (nats-py gave up reconnecting, or it was closed)")
        self.reconnected.set()  # wake senders waiting for a reconnection: they fail now
        for target in list(self.routes.values()):
            target.on_bus_closed(err)
        self.routes.clear()


_background: set[asyncio.Future[None]] = set()
_buses: dict[tuple[Any, ...], Bus] = {}
_locks: dict[tuple[Any, ...], asyncio.Lock] = {}


def _bus_key(target: NatsTarget, options: dict[str, Any]) -> tuple[Any, ...]:
    kwargs = nats_connect_kwargs(options)
    return (
        id(asyncio.get_running_loop()),
        target.servers,
        tuple(sorted((k, repr(v)) for k, v in kwargs.items())),
    )


async def acquire_bus(target: NatsTarget, options: dict[str, Any]) -> Bus:
    """The process's connection for these servers and options (opened on first use)."""
    key = _bus_key(target, options)
    lock = _locks.setdefault(key, asyncio.Lock())
    async with lock:
        bus = _buses.get(key)
        if bus is None or bus.nc.is_closed:
            bus = Bus(key)
            await bus.start(target, options)
            _buses[key] = bus
        bus.users += 1
        return bus


async def release_bus(bus: Bus) -> None:
    """One user less; the last one closes the connection."""
    bus.users -= 1
    if bus.users > 0:
        return
    if _buses.get(bus.key) is bus:
        del _buses[bus.key]
        _locks.pop(bus.key, None)
    nc = bus.nc
    flushed = False
    try:
        if nc.is_connected:
            await nc.flush(timeout=2)  # what the last sessions wrote (CLOSE) reaches the server
            flushed = True
    except (TimeoutError, NatsError, OSError) as exc:
        log.debug("flushing the NATS connection before closing it: %s", exc)
    if not flushed:
        # Not connected (the server gone, nats-py reconnecting) or stuck: nothing pending can
        # be delivered, and close() would stop at writing it (compat.discard_pending).
        dropped = compat.discard_pending(nc)
        if dropped:
            log.debug("closing the NATS connection: %d bytes it could not send are dropped", dropped)
    try:
        await nc.close()
    except (NatsError, OSError) as exc:  # the connection died between the check and the close
        log.debug("closing the NATS connection: %s", exc)
