"""An edge gateway: accept WebSocket/QUIC sessions and carry each one to a NATS service.

The gateway relays whole messages between the client's channel and a NATS channel to one worker
of the service; it does not run a session itself, so HELLO/ACCEPT, codecs, PINGs and CLOSE go end
to end and the client cannot tell a gatewayed session from a direct one (``session.info`` names
the worker). Each direction is bounded: a message taken from one side is handed to the other
before the next is taken, and the sides' own flow control (TCP, QUIC, NATS credit) does the rest.

Resuming through the gateway: a NATS client resumes a session on the worker that holds it (the
channel's resume route, docs/PROTOCOL.md §5a "Resuming"), but a WebSocket/QUIC client only knows
the gateway's URL. So the gateway reads two messages of each relay, the client's HELLO (its first
message but for PINGs, which the gateway answers itself as a server would, and what a server
ignores before a HELLO) and the worker's ACCEPT (its first answer but for PONGs), and remembers
which worker accepted each resumable session (:class:`~m2mwire.shell.resume_routes.ResumeRoutes`);
a new connection whose HELLO resumes a session it remembers is opened to that worker. The token is
still checked by the worker, end to end. What the gateway must see of the session, and how it
answers before the HELLO, are protocol rules: they live in :mod:`m2mwire.session.relay`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections import deque
from collections.abc import Callable
from typing import Any

from m2mwire.errors import ConfigError, ResumeImpossible, TransportError
from m2mwire.lifecycle import Listening
from m2mwire.options import parse_url, valid_options
from m2mwire.schemas.codes import CloseCode
from m2mwire.session.config import (
    CONTROL_MESSAGE_LIMIT,
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_RESUME_WINDOW,
    Timers,
    transport_limit,
)
from m2mwire.session.relay import Opening, before_hello, is_close, resumed_session, server_answer
from m2mwire.shell.resume_routes import ResumeRoutes
from m2mwire.transport.base import (
    Channel,
    Message,
    RoutedChannel,
    TransportConfig,
    relayable_close_code,
)
from m2mwire.transport.nats.options import NATS_OPTIONS

__all__ = ["Gateway", "gateway"]

log = logging.getLogger("m2mwire.gateway")

_TRANSPORT_OPTIONS = frozenset({"certfile", "keyfile", "cert_dir", "ssl", "idle_timeout"})  # listening side
_LISTEN_OPTIONS = _TRANSPORT_OPTIONS | {
    "max_payload",
    "open_timeout",
    "hello_timeout",
    "write_timeout",
    "resume_window",
}


class Gateway(Listening):
    """A running gateway; use as ``async with m2mwire.gateway(listen_url, nats_url) as gw``."""

    def __init__(self, listen_url: str, nats_url: str, options: dict[str, Any]) -> None:
        unknown = set(options) - _LISTEN_OPTIONS - NATS_OPTIONS
        if unknown:
            valid = ", ".join(sorted(_LISTEN_OPTIONS | NATS_OPTIONS))
            raise ConfigError(f"unknown gateway() option(s): {', '.join(sorted(unknown))}; valid: {valid}")
        super().__init__(parse_url(listen_url))
        if self._endpoint.scheme == "nats":
            raise ConfigError(f"a gateway listens on ws://, wss:// or quic://, not {listen_url!r}")
        if parse_url(nats_url).scheme != "nats":
            raise ConfigError(f"a gateway carries sessions to a nats:// service, not {nats_url!r}")
        # The listening side's options must apply to its scheme, as serve() requires (certfile= on
        # ws:// was taken without a word); None counts as left out, as there.
        scheme = self._endpoint.scheme
        takes = set(valid_options("serve", scheme))
        for name in sorted(_TRANSPORT_OPTIONS & options.keys()):
            if options[name] is not None and name not in takes:
                raise ConfigError(f"{name}= does not apply to a gateway listening on {scheme}://")
        self.nats_url = nats_url
        self._options = options
        self._nats_options = {k: v for k, v in options.items() if k in NATS_OPTIONS}
        from m2mwire.transport.nats.service import check_nats_window

        check_nats_window(self._nats_options)  # at the call, not at every relay
        # The largest message relayed; a session negotiating more than this cannot pass.
        self._max = _number(options, "max_payload", DEFAULT_MAX_PAYLOAD, 1, int)
        self._open_timeout = _number(options, "open_timeout", 10.0, 0.0, float)
        # The gateway opens the NATS channel once it has the client's HELLO (it decides where the
        # channel goes), so it bounds the wait for it itself, as a server does.
        self._hello_timeout = _number(options, "hello_timeout", Timers().hello_timeout, 0.0, float)
        # A side that takes nothing the gateway relays to it for this long (a client or worker
        # that stopped reading) ends the relay, as a session's write_timeout ends a session:
        # a client that sent 8 MiB messages and never read held the relay, and what it had sent,
        # for as long as its connection stayed open (stop 30's attack run).
        self._write_timeout = _number(options, "write_timeout", Timers().write_timeout, 0.0, float)
        window = _number(options, "resume_window", DEFAULT_RESUME_WINDOW, 0.0, float, allow_min=True)
        self.routes = ResumeRoutes(window)
        self._relays: set[asyncio.Task[None]] = set()

    async def start(self) -> Gateway:
        options = {k: v for k, v in self._options.items() if k in _TRANSPORT_OPTIONS}
        # As a direct server: only control messages until the worker's ACCEPT (watch_answer).
        await self._listen(self._relay, TransportConfig(CONTROL_MESSAGE_LIMIT, options))
        return self

    async def _relay(self, edge: Channel) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        accepted: list[str] = []  # the session id, once the worker's ACCEPT granted resume
        inner: Channel | None = None
        ended = False
        try:
            outward = _Pipe(edge, write_timeout=self._write_timeout)
            try:
                hello = await asyncio.wait_for(outward.opening(edge), self._hello_timeout)
            except TimeoutError:
                await _close_quietly(
                    edge, CloseCode.POLICY_VIOLATION, f"no HELLO within {self._hello_timeout:g} s"
                )
                return
            except TransportError:
                return  # gone while its PINGs were answered
            if hello is None:
                return  # gone before saying anything but PINGs
            resumes = resumed_session(*hello)
            route = self.routes.find(resumes) if resumes is not None else None
            inner = await self._open(edge, route)
            if inner is None:
                return
            bound = inner  # for the closure: the channel whose route the worker's ACCEPT confirms

            def watch_answer(message: Message, text: bool) -> bool:
                """The worker's first answer but for PONGs (to PINGs the client sent after its
                HELLO, which a worker may answer before its ACCEPT while admission runs)."""
                answer = server_answer(message, text)
                if answer is None:
                    return False  # a keepalive: look at the next one
                if answer.max_payload is not None:
                    # The session is established: the client may now send what it negotiated
                    # (at most what the gateway relays), as a direct server allows from its
                    # ACCEPT. Raised here, before the ACCEPT is queued for the client.
                    limit = min(answer.max_payload, self._max) if answer.max_payload > 0 else self._max
                    edge.set_max_message_size(transport_limit(limit))
                route = bound.resume_route if isinstance(bound, RoutedChannel) else None
                if answer.resumable is not None and route is not None:
                    accepted.append(answer.resumable)
                    self.routes.attach(answer.resumable, route, task)
                return True

            answers = _Pipe(inner, watch_answer, write_timeout=self._write_timeout)
            await _pipe_both(outward, answers, edge, inner)
            # The session is over once a CLOSE passed either way (it cannot be resumed then:
            # PROTOCOL.md §9): its route is forgotten. Any other end, a close frame included,
            # leaves the session detached on the worker, as on a direct server: the route stays.
            ended = outward.closed or answers.closed
        finally:
            edge.abort()  # idempotent: a no-op on a channel that closed in order
            if inner is not None:
                inner.abort()
            for session_id in accepted:
                self.routes.detach(session_id, task, ended=ended)
            self._relays.discard(task)

    async def _open(self, edge: Channel, route: str | None) -> Channel | None:
        """The NATS channel for a relay: to the worker at ``route`` (a session it holds is being
        resumed), else through the queue group; None when no worker can be had (edge closed)."""
        from m2mwire.transport.nats.service import open_nats_channel

        try:
            try:
                return await open_nats_channel(
                    self.nats_url,
                    max_message_size=self._max,
                    options=self._nats_options,
                    open_timeout=self._open_timeout,
                    resume_route=route,
                )
            except ResumeImpossible as exc:
                # That worker is gone, and the session with it: through the queue group, a worker
                # answers the resuming HELLO with REJECT RESUME_UNKNOWN, end to end.
                log.info("gateway: %s", exc)
                return await open_nats_channel(
                    self.nats_url,
                    max_message_size=self._max,
                    options=self._nats_options,
                    open_timeout=self._open_timeout,
                )
        except TransportError as exc:
            log.warning("gateway: no NATS session for %s: %s", edge.remote_address, exc)
            await _close_quietly(edge, CloseCode.TRY_AGAIN_LATER, "no worker available; try again later")
            return None

    async def aclose(self) -> None:
        """Stop accepting, and cut the relays still running (their sessions end as on a lost
        connection; the workers notice through their liveness checks)."""
        for task in list(self._relays):
            task.cancel()
        if self._relays:
            await asyncio.wait(list(self._relays), timeout=5)
        self.close()
        await self.wait_closed()


def _number(
    options: dict[str, Any], name: str, default: float, low: float, kind: type, *, allow_min: bool = False
) -> Any:
    """``options[name]`` as ``kind``, above ``low`` (or equal with ``allow_min``); ConfigError
    naming the keyword otherwise (a str or NaN once went through float() into the arithmetic)."""
    value = options.get(name, default)
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if kind is int:
        ok = ok and isinstance(value, int)
    if not ok or not (value >= low if allow_min else value > low):
        bound = f">= {low:g}" if allow_min else f"> {low:g}"
        raise ConfigError(f"gateway {name}= takes a number {bound}, not {value!r}")
    return kind(value)


async def _close_quietly(channel: Channel, code: int, reason: str) -> None:
    with contextlib.suppress(TransportError, TimeoutError):
        async with asyncio.timeout(5):
            await channel.close(code, reason)


async def _pipe_both(one: _Pipe, two: _Pipe, a: Channel, b: Channel) -> None:
    """Relay ``one`` (from ``a``) to ``b`` and ``two`` (from ``b``) to ``a`` until either side
    ends, then end the other the same way (orderly or not)."""
    tasks = (asyncio.create_task(one.run(b)), asyncio.create_task(two.run(a)))
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
        for channel in (a, b):
            channel.abort()  # idempotent: a no-op on a side that closed in order


_RELAY_QUEUE = 16  # messages taken from a push channel before it is paused


class _Pipe:
    """One direction of a relay: the messages of ``src`` in order, as (message, text), relayed as
    they came (a text message's UTF-8 is the endpoint's to check). Channels deliver from their
    socket callback; pausing them at a small queue keeps what the gateway holds per direction
    bounded. ``watch`` sees each message before it is queued until it returns True. A message
    the destination has not taken within ``write_timeout`` ends the relay (both sides aborted)."""

    def __init__(
        self,
        src: Channel,
        watch: Callable[[Message, bool], bool] | None = None,
        *,
        write_timeout: float,
    ) -> None:
        self._src = src
        self._watch = watch
        self._write_timeout = write_timeout
        self._queue: deque[tuple[Message, bool]] = deque()
        self.closed = False  # a CLOSE was relayed: the session is over
        self._ended: list[TransportError] = []
        self._wake = asyncio.Event()
        self._paused = False
        src.start_push(self._on_message, self._on_lost)  # last: it may deliver at once

    def _on_message(self, message: Message, text: bool) -> None:
        if self._watch is not None and self._watch(message, text):
            self._watch = None
        self._queue.append((message, text))
        if len(self._queue) >= _RELAY_QUEUE and not self._paused:
            self._paused = True
            self._src.pause_reading()
        self._wake.set()

    def _on_lost(self, exc: TransportError) -> None:
        self._ended.append(exc)
        self._wake.set()

    async def opening(self, back: Channel) -> tuple[Message, bool] | None:
        """The first message to relay before a HELLO (left in the queue), or None when ``src``
        ended before one. The gateway routes by the HELLO, so until then it does what a server
        would (session/relay.py before_hello): PINGs are answered on ``back`` and dropped, what a
        server ignores is dropped; the worker, reached after, never sees them."""
        queue = self._queue
        while True:
            while queue:
                step, pong = before_hello(*queue[0])
                if step is Opening.RELAY:
                    return queue[0]
                self._take()
                if pong is not None:
                    await back.send(pong, True)
            if self._ended:
                return None
            self._wake.clear()
            await self._wake.wait()

    def _take(self) -> tuple[Message, bool]:
        item = self._queue.popleft()
        if self._paused and len(self._queue) <= _RELAY_QUEUE // 2:
            self._paused = False
            self._src.resume_reading()
        return item

    async def run(self, dst: Channel) -> None:
        """Hand every message to ``dst``; end ``dst`` the way ``src`` ended."""
        queue = self._queue
        while True:
            while queue:
                message, text = self._take()
                try:
                    async with asyncio.timeout(self._write_timeout):
                        await dst.send(message, text)
                except TransportError:
                    self._src.abort()
                    return
                except TimeoutError:
                    log.info(
                        "gateway: %s took no message for %g s (write_timeout): relay dropped",
                        dst.remote_address,
                        self._write_timeout,
                    )
                    self._src.abort()
                    dst.abort()
                    return
                if not self.closed and is_close(message, text):
                    self.closed = True
            if self._ended:
                end = self._ended[0]
                # A close frame stays a close frame for the far peer, with its code and reason (a
                # REJECT's 1002 as much as an orderly 1000: a client cannot tell the gateway from a
                # direct server); a lost connection is lost there too.
                if end.clean or relayable_close_code(end.code):
                    await _close_quietly(dst, end.code or CloseCode.NORMAL, end.reason or "")
                else:
                    dst.abort()
                return
            self._wake.clear()
            if not queue and not self._ended:
                await self._wake.wait()


def gateway(listen_url: str, nats_url: str, **options: Any) -> Gateway:
    """Carry WebSocket/QUIC sessions to a NATS service: ``async with m2mwire.gateway(
    "ws://0.0.0.0:8765", "nats://nats1:4222,nats2:4222/agents.planner") as gw: ...``.

    Options: certfile/keyfile or ssl (wss://, quic://; without them a self-signed certificate is
    generated, kept as serve()'s ``cert_dir=`` says, and ``gw.fingerprint`` set), idle_timeout
    (QUIC), max_payload (the largest message relayed, default 16 MiB), open_timeout (for a worker
    to answer), hello_timeout (for a new connection's first message, default 30 s),
    write_timeout (a side that takes no relayed message for this long ends the relay, 30 s),
    resume_window (how long the gateway remembers which worker holds a session whose connection
    was lost, so a client resuming it through this gateway reaches that worker: set it to the
    workers' resume_window; default 60 s; 0: resumes go to the queue group), and the NATS options
    of :func:`m2mwire.connect` (servers, user, password, credentials, tls, ...).
    """
    return Gateway(listen_url, nats_url, options)
