"""An edge gateway: accept WebSocket/QUIC sessions and carry each one to a NATS service.

The gateway relays whole messages between the client's channel and a NATS channel to one worker
of the service; it does not run a session itself, so HELLO/ACCEPT, codecs, PINGs and CLOSE go end
to end and the client cannot tell a gatewayed session from a direct one (``session.info`` names
the worker). Each direction is bounded: a message taken from one side is handed to the other
before the next is taken, and the sides' own flow control (TCP, QUIC, NATS credit) does the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any

from m2mwire.codecs.limits import MiB
from m2mwire.errors import TransportError
from m2mwire.lifecycle import Listening
from m2mwire.options import parse_url
from m2mwire.transport import registry
from m2mwire.transport.base import Channel, Listener, Message, TransportConfig
from m2mwire.transport.nats.options import NATS_OPTIONS

__all__ = ["Gateway", "gateway"]

log = logging.getLogger("m2mwire.gateway")

_TRANSPORT_OPTIONS = frozenset({"certfile", "keyfile", "cert_dir", "ssl", "idle_timeout"})  # listening side
_LISTEN_OPTIONS = _TRANSPORT_OPTIONS | {"max_payload", "open_timeout"}


class Gateway(Listening):
    """A running gateway; use as ``async with m2mwire.gateway(listen_url, nats_url) as gw``."""

    def __init__(self, listen_url: str, nats_url: str, options: dict[str, Any]) -> None:
        unknown = set(options) - _LISTEN_OPTIONS - NATS_OPTIONS
        if unknown:
            raise TypeError(f"unknown gateway option(s): {', '.join(sorted(unknown))}")
        self._endpoint = parse_url(listen_url)
        if self._endpoint.scheme == "nats":
            raise ValueError(f"a gateway listens on ws://, wss:// or quic://, not {listen_url!r}")
        if parse_url(nats_url).scheme != "nats":
            raise ValueError(f"a gateway carries sessions to a nats:// service, not {nats_url!r}")
        self.nats_url = nats_url
        self._options = options
        self._nats_options = {k: v for k, v in options.items() if k in NATS_OPTIONS}
        # The largest message relayed; a session negotiating more than this cannot pass.
        self._max = int(options.get("max_payload", 16 * MiB))
        self._impl: Listener | None = None  # the transport's, once started
        self._relays: set[asyncio.Task[None]] = set()
        self.port = self._endpoint.port
        self.fingerprint: str | None = None

    @property
    def url(self) -> str:
        return self._impl.url if self._impl is not None else self._endpoint.url

    async def start(self) -> Gateway:
        options = {k: v for k, v in self._options.items() if k in _TRANSPORT_OPTIONS}
        listener = registry.listen(self._relay, self._endpoint, TransportConfig(self._max, options))
        await listener.start()
        self._impl = listener
        self.port = listener.port
        self.fingerprint = listener.fingerprint
        return self

    async def _relay(self, edge: Channel) -> None:
        from m2mwire.transport.nats.service import open_nats_channel

        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        try:
            try:
                inner: Channel = await open_nats_channel(
                    self.nats_url,
                    max_message_size=self._max,
                    options=self._nats_options,
                    open_timeout=float(self._options.get("open_timeout", 10.0)),
                )
            except TransportError as exc:
                log.warning("gateway: no NATS session for %s: %s", edge.remote_address, exc)
                await edge.close(1013, "no worker available; try again later")
                return
            await _pipe_both(edge, inner)
        finally:
            self._relays.discard(task)

    def close(self) -> None:
        if self._impl is not None:
            self._impl.close()

    async def wait_closed(self) -> None:
        if self._impl is not None:
            await self._impl.wait_closed()

    async def aclose(self) -> None:
        """Stop accepting, and cut the relays still running (their sessions end as on a lost
        connection; the workers notice through their liveness checks)."""
        for task in list(self._relays):
            task.cancel()
        if self._relays:
            await asyncio.wait(list(self._relays), timeout=5)
        self.close()
        await self.wait_closed()


async def _pipe_both(a: Channel, b: Channel) -> None:
    """Relay until either side ends, then end the other the same way (orderly or not)."""
    one = asyncio.create_task(_pipe(a, b))
    two = asyncio.create_task(_pipe(b, a))
    try:
        await asyncio.wait((one, two), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (one, two):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(one, two, return_exceptions=True)
        for channel in (a, b):
            channel.abort()  # idempotent: a no-op on a side that closed in order


_RELAY_QUEUE = 16  # messages taken from a push channel before it is paused


async def _pipe(src: Channel, dst: Channel) -> None:
    """Hand every message of ``src`` to ``dst`` in order; end ``dst`` the way ``src`` ended."""
    # (message, text): relayed as they came; a text message's UTF-8 is the endpoint's to check.
    queue: deque[tuple[Message, bool]] = deque()
    ended: list[TransportError] = []
    wake = asyncio.Event()
    paused = False

    # Channels deliver from their socket callback; pausing them at a small queue keeps what the
    # gateway holds per direction bounded.
    def on_message(message: Message, text: bool) -> None:
        nonlocal paused
        queue.append((message, text))
        if len(queue) >= _RELAY_QUEUE and not paused:
            paused = True
            src.pause_reading()
        wake.set()

    def on_lost(exc: TransportError) -> None:
        ended.append(exc)
        wake.set()

    src.start_push(on_message, on_lost)
    while True:
        while queue:
            message, text = queue.popleft()
            if paused and len(queue) <= _RELAY_QUEUE // 2:
                paused = False
                src.resume_reading()
            try:
                await dst.send(message, text)
            except TransportError:
                src.abort()
                return
        if ended:
            end = ended[0]
            # An orderly close stays orderly for the far peer, a lost connection is lost there too.
            if end.clean:
                with contextlib.suppress(TransportError, TimeoutError):
                    async with asyncio.timeout(5):
                        await dst.close(end.code or 1000, end.reason or "")
            else:
                dst.abort()
            return
        wake.clear()
        if not queue and not ended:
            await wake.wait()


def gateway(listen_url: str, nats_url: str, **options: Any) -> Gateway:
    """Carry WebSocket/QUIC sessions to a NATS service: ``async with m2mwire.gateway(
    "ws://0.0.0.0:8765", "nats://nats1:4222,nats2:4222/agents.planner") as gw: ...``.

    Options: certfile/keyfile or ssl (wss://, quic://; without them a self-signed certificate is
    generated, kept as serve()'s ``cert_dir=`` says, and ``gw.fingerprint`` set), idle_timeout
    (QUIC), max_payload (the largest message relayed, default 16 MiB), open_timeout (for a worker
    to answer), and the NATS options of :func:`m2mwire.connect` (servers, user, password,
    credentials, tls, ...).
    """
    return Gateway(listen_url, nats_url, options)
