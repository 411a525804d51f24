"""The QUIC client: :func:`connect_quic` and :class:`QuicClientConnection`, which opens channels,
and :func:`open_quic_channel` (one channel that owns its connection)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from aioquic.quic.configuration import QuicConfiguration

from m2mwire.errors import TransportError
from m2mwire.transport.framing import ErrorCode
from m2mwire.transport.quic.channel import ChannelStats, QuicChannel
from m2mwire.transport.quic.compat import FlowControlledConnection
from m2mwire.transport.quic.connection import Connection
from m2mwire.transport.quic.failure import Failure
from m2mwire.transport.quic.tuning import ALPN, DEFAULT_MAX_MESSAGE_SIZE, QuicTuning
from m2mwire.transport.quic.udp import format_address, is_loopback, udp_endpoint
from m2mwire.transport.tls import check_trust_options, warn_insecure

__all__ = ["QuicClientConnection", "connect_quic", "open_quic_channel"]


# One connection attempt to the same server with the same options: what redial() repeats.
Dial = Callable[[], Awaitable[tuple[Connection, asyncio.DatagramTransport]]]


class QuicClientConnection:
    """A client QUIC connection that carries any number of channels."""

    def __init__(
        self,
        connection: Connection,
        transport: asyncio.DatagramTransport,
        *,
        open_timeout: float = 10.0,
        dial: Dial | None = None,
    ) -> None:
        self._protocol = connection
        self._transport = transport
        self._closing = False
        self.open_timeout = open_timeout  # default wait of open_channel() for stream credit
        self._dial = dial
        self._redialing: asyncio.Task[None] | None = None

    @property
    def remote_address(self) -> str:
        return self._protocol.remote_address

    @property
    def server_fingerprint(self) -> str | None:
        """SHA-256 fingerprint of the certificate the server presented."""
        return self._protocol.peer_fingerprint

    @property
    def closed(self) -> bool:
        return self._protocol.terminated

    @property
    def stats(self) -> ChannelStats:
        """Connection-wide peaks (send_buffered_peak, recv_queued_peak)."""
        return self._protocol.stats

    async def open_channel(
        self, *, max_message_size: int | None = None, timeout: float | None = None
    ) -> QuicChannel:
        """A new channel on its own stream. The server sees it when the first message arrives.

        The server allows a number of concurrent channels per connection (256 by default, its
        QUIC MAX_STREAMS); beyond it this waits until a channel closes, at most ``timeout``
        seconds (default: the connection's ``open_timeout``, its ``connect_timeout``), then raises
        TransportError. The other channels are never disturbed.
        """
        connection = self._protocol
        if connection.terminated or self._closing:
            failure = connection.failure or Failure(f"QUIC connection to {self.remote_address} is closed")
            raise failure.error()
        await connection.reserve_stream(self.open_timeout if timeout is None else timeout)
        if self._closing:
            raise Failure(f"QUIC connection to {self.remote_address} is closed").error()
        return QuicChannel(
            connection, None, connection.max_message_size if max_message_size is None else max_message_size
        )

    async def redial(self) -> None:
        """Replace a lost connection by a new one to the same server, with the same options.

        For ``connect(url, connection=conn, reconnect=True)``: when the shared connection dies,
        every session on it resumes through ``redial()`` then ``open_channel()``, so they share
        the one new connection as they shared the old one. Concurrent callers wait for the same
        attempt (a cancelled caller does not cancel it for the others); a connection that is
        still alive is kept (its channels may have ended for other reasons). Raises
        TransportError when the attempt fails (the caller retries) or after :meth:`close`.
        """
        if self._closing:
            raise Failure(f"QUIC connection to {self.remote_address} was closed").error()
        if not self._protocol.terminated:
            return
        if self._dial is None:
            raise Failure(f"QUIC connection to {self.remote_address} is closed").error()
        task = self._redialing
        if task is None:
            task = self._redialing = asyncio.ensure_future(self._replace(self._dial))
            task.add_done_callback(self._redial_done)
        await asyncio.shield(task)

    async def _replace(self, dial: Dial) -> None:
        protocol, transport = await dial()
        # close() cancels this task, so the connection is still ours to keep here.
        self._transport.close()  # the lost connection's socket
        self._protocol, self._transport = protocol, transport

    def _redial_done(self, task: asyncio.Task[None]) -> None:
        self._redialing = None
        if not task.cancelled():
            task.exception()  # each waiter got it raised; this marks it retrieved when none waited

    async def close(self) -> None:
        """Close every channel in order (bounded by close_timeout), then the connection. Idempotent."""
        if self._closing:
            await self.wait_closed()
            return
        self._closing = True
        if self._redialing is not None:
            self._redialing.cancel()  # _handshake closes the half-open connection's socket
        try:
            await self._protocol.close_connection(ErrorCode.NO_ERROR, "", graceful=True)
        finally:
            self._transport.close()

    async def wait_closed(self) -> None:
        await self._protocol.wait_closed()

    def abort(self, code: int = ErrorCode.CANCELLED) -> None:
        """Drop the connection at once (CONNECTION_CLOSE with ``code``, no waiting). Idempotent."""
        if not self._closing:
            self._closing = True
            if self._redialing is not None:
                self._redialing.cancel()
            failure = Failure(
                f"QUIC connection to {self.remote_address} was aborted locally (code {code})", code=code
            )
            self._protocol.shut(failure, code, "aborted")
            self._transport.close()

    async def __aenter__(self) -> QuicClientConnection:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


async def connect_quic(
    host: str,
    port: int,
    *,
    cafile: str | os.PathLike[str] | None = None,
    cadata: str | bytes | None = None,
    fingerprint: str | None = None,
    insecure: bool = False,
    server_name: str | None = None,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    idle_timeout: float = 20.0,
    connect_timeout: float = 10.0,
    close_timeout: float = 10.0,
    tuning: QuicTuning | None = None,
) -> QuicClientConnection:
    """Connect to an m2mwire QUIC server; the result opens channels with ``open_channel()``.

    Verification: ``cafile``/``cadata`` (PEM) or, by default, the system trust store, with the
    certificate checked against ``server_name`` (default ``host``); or ``fingerprint=`` pins the
    server certificate's SHA-256; ``insecure=True`` skips verification (logged as a WARNING).
    """
    check_trust_options(cafile=cafile, cadata=cadata, fingerprint=fingerprint, insecure=insecure)
    if insecure:
        warn_insecure(f"quic://{host}:{port}")
    dial = functools.partial(
        _dial,
        host,
        port,
        cafile=cafile,
        cadata=cadata,
        fingerprint=fingerprint,
        insecure=insecure,
        server_name=server_name,
        max_message_size=max_message_size,
        idle_timeout=idle_timeout,
        connect_timeout=connect_timeout,
        close_timeout=close_timeout,
        tuning=tuning or QuicTuning(),
    )
    connection, transport = await dial()
    return QuicClientConnection(connection, transport, open_timeout=connect_timeout, dial=dial)


async def _dial(
    host: str,
    port: int,
    *,
    cafile: str | os.PathLike[str] | None,
    cadata: str | bytes | None,
    fingerprint: str | None,
    insecure: bool,
    server_name: str | None,
    max_message_size: int,
    idle_timeout: float,
    connect_timeout: float,
    close_timeout: float,
    tuning: QuicTuning,
) -> tuple[Connection, asyncio.DatagramTransport]:
    """One connection to ``host:port`` (each of its addresses in turn), handshake done."""
    loop = asyncio.get_running_loop()
    target = f"quic://{host}:{port}"
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise TransportError(f"cannot resolve {target}: {exc}") from exc
    # UDP cannot tell a dead address from a slow one, so the addresses of a name (e.g. ::1 and
    # 127.0.0.1 for localhost) are tried in turn, sharing the timeout.
    addresses = list(dict.fromkeys((info[0], info[4]) for info in infos))
    per_attempt = connect_timeout / len(addresses)
    for family, addr in addresses:
        config = QuicConfiguration(
            is_client=True,
            alpn_protocols=[ALPN],
            idle_timeout=idle_timeout,
            max_data=tuning.connection_window,
            max_stream_data=tuning.stream_window,
            max_datagram_size=tuning.datagram_size_for(is_loopback(str(addr[0]))),
            congestion_control_algorithm=tuning.congestion_control,
            server_name=server_name or host,
        )
        if fingerprint is not None or insecure:
            config.verify_mode = ssl.CERT_NONE
        elif cafile is not None or cadata is not None:
            config.load_verify_locations(
                cafile=os.fspath(cafile) if cafile is not None else None,
                cadata=cadata.encode("ascii") if isinstance(cadata, str) else cadata,
            )
        else:
            paths = ssl.get_default_verify_paths()
            cafile_sys = paths.cafile if paths.cafile and os.path.exists(paths.cafile) else None
            capath_sys = paths.capath if paths.capath and os.path.isdir(paths.capath) else None
            if cafile_sys or capath_sys:
                config.load_verify_locations(cafile=cafile_sys, capath=capath_sys)
            # else: aioquic falls back to certifi's bundle
        connection = await _handshake(
            config,
            family,
            addr,
            timeout=per_attempt,
            tuning=tuning,
            max_message_size=max_message_size,
            idle_timeout=idle_timeout,
            close_timeout=close_timeout,
            fingerprint=fingerprint,
            target=target,
        )
        if connection is not None:
            return connection
    tried = ", ".join(format_address(addr) for _, addr in addresses)
    raise TransportError(
        f"QUIC handshake with {target} ({tried}) timed out after {connect_timeout:g} s: is an m2mwire "
        "QUIC server listening on that UDP port, and does a firewall let UDP through?"
    )


async def _handshake(
    config: QuicConfiguration,
    family: int,
    addr: Any,
    *,
    timeout: float,
    tuning: QuicTuning,
    max_message_size: int,
    idle_timeout: float,
    close_timeout: float,
    fingerprint: str | None,
    target: str,
) -> tuple[Connection, asyncio.DatagramTransport] | None:
    """One connection attempt: the connection, None on timeout, TransportError on any failure."""
    connection = Connection(
        FlowControlledConnection(configuration=config),
        tuning=tuning,
        max_message_size=max_message_size,
        idle_timeout=idle_timeout,
        close_timeout=close_timeout,
        pinned_fingerprint=fingerprint,
    )
    transport = await udp_endpoint(
        connection,
        "::" if family == socket.AF_INET6 else "0.0.0.0",
        0,
        socket_buffer=tuning.socket_buffer,
        family=family,
    )
    connection.remote_address = format_address(addr)
    try:
        connection.connect(addr)
        async with asyncio.timeout(timeout):
            await connection.wait_connected()
        connection.start_keepalive()
    except TimeoutError:
        transport.close()
        return None
    except ConnectionError:
        transport.close()
        raise (connection.failure or Failure(f"QUIC handshake with {target} failed")).error() from None
    except BaseException:
        transport.close()
        raise
    if connection.failure is not None:  # fingerprint mismatch, detected right after the handshake
        failure = connection.failure
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await connection.wait_closed()
        transport.close()
        raise failure.error()
    return connection, transport


async def open_quic_channel(host: str, port: int, **options: Any) -> QuicChannel:
    """Connect and open one channel that owns the connection (closing it closes the connection)."""
    connection = await connect_quic(host, port, **options)
    try:
        channel = await connection.open_channel()
    except BaseException:
        await connection.close()
        raise
    channel.own(connection)
    return channel
