"""``connect()``: open a channel to a server and run a client session over it."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Unpack

from m2mwire.options import ConnectOptions, Endpoint, parse_url, split_options
from m2mwire.reconnect import parse_reconnect
from m2mwire.session.config import CONTROL_MESSAGE_LIMIT, SessionConfig
from m2mwire.session.core import SessionProtocol
from m2mwire.session.states import Role
from m2mwire.shell.session import Session
from m2mwire.shell.warmup import warm_tokenizers
from m2mwire.transport import registry
from m2mwire.transport.base import Channel, TransportConfig

if TYPE_CHECKING:
    from m2mwire.transport.quic import QuicClientConnection

__all__ = ["connect", "open_quic_connection"]

# Sessions that a cancelled connect() is closing, referenced until closed (the event loop keeps
# only weak references to tasks).
_abandoned: set[asyncio.Task[None]] = set()


async def _open_channel(
    endpoint: Endpoint, config: SessionConfig, options: dict[str, Any], resume_route: str | None = None
) -> Channel:
    # Only control messages (ACCEPT, REJECT) until the session is established; the Session then
    # raises the limit to the negotiated max_payload.
    transport = TransportConfig(CONTROL_MESSAGE_LIMIT, options, token=config.token, resume_route=resume_route)
    return await registry.open_channel(endpoint, transport)


async def open_quic_connection(url: str, **options: Any) -> QuicClientConnection:
    """Open one QUIC connection to share between sessions: ``connect(url, connection=conn)``.

    Options: cafile, cadata, fingerprint, insecure, server_name, idle_timeout, max_payload (the
    default incoming message limit of its channels). Close it with ``await conn.close()``.
    """
    from m2mwire.transport.entries import quic  # aioquic: only for QUIC users

    return await quic.open_quic_connection(url, **options)


class connect:
    """Open a client session: ``async with m2mwire.connect("ws://host:port") as session: ...``.

    Also awaitable: ``session = await m2mwire.connect(url)`` (then ``await session.close()``).
    Options: algorithms, encodings, preferred_encoding, identity, max_payload, timers (a Timers or a
    dict), optimize, token_stats, agent_id, agent_type, limits, max_queue, max_queue_bytes; transport
    options: ssl (an SSLContext for wss://), cafile/cadata/fingerprint/insecure (TLS verification for
    wss:// and quic://), server_name, open_timeout, idle_timeout (QUIC), connection (a QUIC
    connection from :func:`open_quic_connection`, to run several sessions over one connection;
    with ``reconnect=``, when that connection is lost its sessions resume over one new connection
    to the same server, which ``conn`` then holds).

    ``reconnect=True`` (or a dict, or :class:`m2mwire.Reconnect`): once established, the session
    outlives its connections: on a loss (or unanswered PINGs) it reconnects with exponential
    backoff and jitter and resumes, retransmitting what the server did not get; ``send()`` and
    ``recv()`` neither fail nor lose nor duplicate meanwhile (``send()`` waits once
    ``resume_buffer_bytes`` of unacknowledged messages are retained). When resuming is impossible
    the session ends with ``SessionClosed`` whose ``code`` says why: ``RESUME_EXPIRED``,
    ``RESUME_UNKNOWN`` (e.g. the server restarted; over NATS also at once when the worker that
    held the session is gone), ``RESUME_REFUSED`` or ``RECONNECT_GAVE_UP``. Over NATS the session
    resumes on the worker that holds it, not on any worker of the service.
    """

    def __init__(self, url: str, **options: Unpack[ConnectOptions]) -> None:
        self._endpoint = parse_url(url)
        given: dict[str, Any] = dict(options)
        reconnect = parse_reconnect(given.pop("reconnect", None))
        self._config, self._topts = split_options(given, "connect", self._endpoint)
        self._reconnect = reconnect
        if reconnect is not None:
            self._config = dataclasses.replace(self._config, resume=True)
        self._session: Session | None = None

    def _new_channel(self, resume_route: str | None = None) -> Awaitable[Channel]:
        return _open_channel(self._endpoint, self._config, self._topts, resume_route)

    async def _resume_channel(self, resume_route: str | None = None) -> Channel:
        """A channel to resume on (``resume_route``: the previous channel's, see RoutedChannel).
        A shared QUIC ``connection=`` that was lost is first replaced by a new one to the same
        server (one for all the sessions that shared it: see ``QuicClientConnection.redial``);
        otherwise it would refuse every attempt until ``max_elapsed``."""
        shared: QuicClientConnection | None = self._topts.get("connection")
        if shared is not None:
            await shared.redial()
        return await self._new_channel(resume_route)

    async def _open(self) -> Session:
        channel = await self._new_channel()
        session = Session(channel, SessionProtocol(Role.CLIENT, self._config))
        if self._reconnect is not None:
            # Only after the first handshake: a first connect() that fails raises as before.
            session._reconnect = self._reconnect
            session._reopen = self._resume_channel
        await session._start()
        try:
            await warm_tokenizers(session.info, self._config)
        except BaseException:
            # Nobody will get this session (e.g. a timeout around connect() cancelled it here):
            # end it, or its writer task and pings would keep it open at both ends, unreferenced.
            session._protocol.close(session._loop.time(), "connect() did not complete")
            session._after_protocol_step()
            # In a task of its own: the caller's timeout or cancel must not wait for the close
            # exchange (up to close_timeout, and more for a peer that reads slowly).
            task = asyncio.create_task(session._shutdown(), name="m2mwire-abandoned-connect")
            _abandoned.add(task)
            task.add_done_callback(_abandoned.discard)
            raise
        self._session = session
        return session

    def __await__(self) -> Generator[Any, None, Session]:
        return self._open().__await__()

    async def __aenter__(self) -> Session:
        return await self._open()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()
