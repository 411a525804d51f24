"""Opening a session channel to a NATS service, and serving one as a queue-group member.

The transport handshake (before the session's HELLO) is one NATS request on the service subject:
OPEN (JSON: the client's subject and window) answered by one worker of the queue group with
OPEN_OK (JSON: the worker's subject, window and agent label). nats-server's "no responders"
answer tells a client at once that no worker serves the subject.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from m2mwire.codecs.limits import MiB
from m2mwire.errors import TransportError
from m2mwire.transport.nats.bus import Bus, acquire_bus, release_bus
from m2mwire.transport.nats.channel import NatsChannel
from m2mwire.transport.nats.options import parse_nats_url

__all__ = ["NatsListener", "open_nats_channel", "serve_nats"]

log = logging.getLogger("m2mwire.nats")

OPEN_VERSION = 1
DEFAULT_WINDOW = 8 * MiB
DEFAULT_PROBE_INTERVAL = 5.0
DEFAULT_QUEUE = "m2mwire"
_MAX_OPEN = 4096  # an OPEN request is a few hundred bytes; anything larger is refused unread


def _window(bus: Bus, options: dict[str, Any]) -> int:
    # At least four NATS messages, so a full-size chunk always fits in a quarter of the window.
    return max(int(options.get("nats_window", DEFAULT_WINDOW)), 4 * bus.nc.max_payload)


def _probe_interval(options: dict[str, Any]) -> float:
    return float(options.get("probe_interval", DEFAULT_PROBE_INTERVAL) or 0.0)


async def open_nats_channel(
    url: str, *, max_message_size: int, options: dict[str, Any], open_timeout: float = 10.0
) -> NatsChannel:
    """Ask the service named by ``url`` for a session channel; one worker answers."""
    target = parse_nats_url(url, options)
    bus = await acquire_bus(target, options)
    channel: NatsChannel | None = None
    try:
        window = _window(bus, options)
        channel = NatsChannel(
            bus,
            f"{bus.client_prefix}.{secrets.token_hex(16)}",  # 128 random bits: unguessable
            max_message_size=max_message_size,
            window=window,
            remote_address=f"nats:{target.subject}",
            probe_interval=_probe_interval(options),
        )
        request = {"v": OPEN_VERSION, "subject": channel.in_subject, "window": window, "peer": bus.label}
        try:
            reply = await bus.nc.request(target.subject, json.dumps(request).encode(), timeout=open_timeout)
        except NoRespondersError:
            raise TransportError(
                f"no worker serves {target.subject!r} on NATS {', '.join(target.servers)} "
                "(nothing is subscribed to that subject: start one with m2mwire.serve(handler, url))"
            ) from None
        except (TimeoutError, NatsTimeoutError):
            raise TransportError(
                f"no worker of {target.subject!r} answered within {open_timeout:g} s (open_timeout=)"
            ) from None
        except NatsError as exc:
            raise TransportError(f"could not open a NATS session on {target.subject!r}: {exc}") from exc
        try:
            answer = json.loads(reply.data)
            subject, peer_window = str(answer["subject"]), int(answer["window"])
        except (ValueError, KeyError, TypeError) as exc:
            raise TransportError(f"malformed OPEN_OK from the worker of {target.subject!r}: {exc}") from exc
        if answer.get("v") != OPEN_VERSION or peer_window <= 0 or not subject:
            raise TransportError(f"the worker of {target.subject!r} answered OPEN with {answer!r}")
        channel.connect_peer(subject, peer_window)
        channel.owns_bus = True
        return channel
    except BaseException:
        if channel is not None:
            channel._unroute()
        await release_bus(bus)
        raise


class NatsListener:
    """A queue-group member of one NATS service: each OPEN becomes a channel and a handler task."""

    def __init__(
        self,
        handler: Callable[[NatsChannel], Awaitable[None]],
        url: str,
        *,
        max_message_size: int,
        options: dict[str, Any],
    ) -> None:
        self._handler = handler
        self.url = url
        self._target = parse_nats_url(url, options)
        self._options = options
        self._max = max_message_size
        self._bus: Bus | None = None
        self._sub: Subscription | None = None
        self._prefix = ""
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = asyncio.Event()

    @property
    def subject(self) -> str:
        return self._target.subject

    async def start(self) -> None:
        self._bus = bus = await acquire_bus(self._target, self._options)
        try:
            # Session subjects of this worker: a random process prefix under the service, so a
            # deployment can give workers "subscribe _M2M.<service>.>" and clients "publish" to it.
            self._prefix = f"_M2M.{self._target.subject}.{secrets.token_hex(8)}"
            await bus.subscribe_prefix(self._prefix)
            queue = str(self._options.get("queue", DEFAULT_QUEUE))
            self._sub = await bus.subscribe_service(self._target.subject, queue, self._on_open)
            await bus.nc.flush(timeout=5)  # the subscriptions are in place when start() returns
        except BaseException:
            await release_bus(bus)
            self._bus = None
            raise

    async def _on_open(self, msg: Msg) -> None:
        bus = self._bus
        if bus is None or self._closed.is_set() or not msg.reply:
            return
        try:
            if len(msg.data) > _MAX_OPEN:
                raise ValueError("too large")
            request = json.loads(msg.data)
            subject, window = str(request["subject"]), int(request["window"])
            if (
                request.get("v") != OPEN_VERSION
                or window <= 0
                or not subject
                or "*" in subject
                or ">" in subject
            ):
                raise ValueError(f"unsupported OPEN {request!r}"[:200])
        except (ValueError, KeyError, TypeError) as exc:
            log.info("malformed OPEN on %s: %s", self._target.subject, exc)
            return
        own_window = _window(bus, self._options)
        peer = str(request.get("peer", "nats-client"))[:64]
        channel = NatsChannel(
            bus,
            f"{self._prefix}.{secrets.token_hex(16)}",
            max_message_size=self._max,
            window=own_window,
            remote_address=f"{peer}:0",
            probe_interval=_probe_interval(self._options),
        )
        channel.connect_peer(subject, window)
        answer = {"v": OPEN_VERSION, "subject": channel.in_subject, "window": own_window}
        try:
            await msg.respond(json.dumps(answer).encode())
        except NatsError as exc:
            log.info("could not answer OPEN on %s: %s", self._target.subject, exc)
            channel._unroute()
            return
        task = asyncio.create_task(self._run(channel), name="m2mwire-nats-session")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, channel: NatsChannel) -> None:
        try:
            await self._handler(channel)
        finally:
            channel.abort()  # a no-op after an orderly close

    def close(self) -> None:
        """Stop taking new sessions (sessions already running go on until wait_closed())."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self._sub is not None:
            sub, self._sub = self._sub, None
            task = asyncio.ensure_future(_unsubscribe(sub))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def wait_closed(self) -> None:
        self.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)
        for task in list(self._tasks):
            task.cancel()
        if self._bus is not None:
            bus, self._bus = self._bus, None
            await release_bus(bus)


async def _unsubscribe(sub: Subscription) -> None:
    try:
        await sub.unsubscribe()
    except NatsError as exc:
        log.debug("unsubscribing the service: %s", exc)


async def serve_nats(
    handler: Callable[[NatsChannel], Awaitable[None]],
    url: str,
    *,
    max_message_size: int,
    options: dict[str, Any],
) -> NatsListener:
    """Join the service of ``url`` as one worker of its queue group; ``handler(channel)`` per session."""
    listener = NatsListener(handler, url, max_message_size=max_message_size, options=options)
    await listener.start()
    return listener
