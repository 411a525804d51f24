"""The QUIC server: :func:`serve_quic` and :class:`QuicServer`, with address validation and a cap
on unfinished handshakes (:class:`_Listener`)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, cast

from aioquic.asyncio.server import QuicServer as _AioquicServer
from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE, QuicConfiguration
from aioquic.quic.connection import NetworkAddress, QuicConnection
from aioquic.quic.packet import QuicPacketType
from cryptography.hazmat.primitives import serialization

from m2mwire.errors import TransportError
from m2mwire.transport.framing import ErrorCode
from m2mwire.transport.quic import compat
from m2mwire.transport.quic.channel import QuicChannel
from m2mwire.transport.quic.connection import Connection
from m2mwire.transport.quic.failure import Failure
from m2mwire.transport.quic.tuning import ALPN, DEFAULT_MAX_MESSAGE_SIZE, QuicTuning
from m2mwire.transport.quic.udp import format_address, is_loopback, udp_endpoint
from m2mwire.transport.tls import certificate_fingerprint, generate_self_signed

__all__ = ["QuicServer", "serve_quic"]

logger = logging.getLogger("m2mwire.transport")


class _Listener(_AioquicServer):
    """aioquic's server with address validation (Retry) and a cap on unfinished handshakes.

    With ``retry=True`` an Initial without a token gets a stateless Retry (smaller than the Initial,
    so no amplification) and no connection state; only a client that echoes the token from its
    own address gets one. Even then at most ``admit()`` allows unfinished handshakes exist: an
    Initial that would start another is dropped (the client's Initial timer retries it).
    """

    def __init__(self, *, admit: Callable[[], bool], **kwargs: Any) -> None:
        super().__init__(retry=True, **kwargs)
        self._m2m_admit = admit
        self._m2m_cid_length = kwargs["configuration"].connection_id_length

    def datagram_received(self, data: bytes | str, addr: NetworkAddress) -> None:
        raw = cast(bytes, data)
        # Only long-header datagrams (handshake packets) are looked at; 1-RTT traffic goes straight on.
        if raw and raw[0] & 0x80 and len(raw) >= SMALLEST_MAX_DATAGRAM_SIZE:
            try:
                header = compat.parse_header(raw, self._m2m_cid_length)
            except ValueError:
                return  # aioquic drops it too
            if (
                header.packet_type == QuicPacketType.INITIAL
                and header.token  # without one, aioquic answers with a stateless Retry
                and not compat.has_connection(self, header.destination_cid)
                and not self._m2m_admit()
            ):
                return
        super().datagram_received(data, addr)


class QuicServer:
    """A running QUIC server (see :func:`serve_quic`)."""

    def __init__(
        self,
        handler: Callable[[QuicChannel], Awaitable[None]],
        *,
        fingerprint: str,
        close_timeout: float,
    ) -> None:
        self._handler = handler
        self.fingerprint = fingerprint
        self._close_timeout = close_timeout
        self._server: _AioquicServer | None = None
        self._transport: asyncio.DatagramTransport | None = None
        self._connections: set[Connection] = set()
        self._half_open: set[Connection] = set()  # handshake not completed yet
        self.max_half_open = QuicTuning.max_half_open
        self.refused_initials = 0  # Initials dropped because max_half_open handshakes were running
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._close_called = asyncio.Event()
        self._closed = asyncio.Event()
        self.host = ""
        self.port = 0

    @property
    def connections(self) -> int:
        return len(self._connections)

    @property
    def half_open(self) -> int:
        """Connections whose handshake has not completed."""
        return len(self._half_open)

    def _admit(self) -> bool:
        if len(self._half_open) < self.max_half_open:
            return True
        self.refused_initials += 1
        return False

    def _connection_created(self, connection: Connection) -> None:
        self._connections.add(connection)
        self._half_open.add(connection)
        connection.on_terminated = self._forget
        connection.on_handshake_done = self._half_open.discard

    def _forget(self, connection: Connection) -> None:
        self._connections.discard(connection)
        self._half_open.discard(connection)

    def _spawn(self, channel: QuicChannel) -> None:
        if self._closing:
            channel.abort(ErrorCode.REFUSED)
            return
        task = asyncio.get_running_loop().create_task(self._run_handler(channel))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_handler(self, channel: QuicChannel) -> None:
        try:
            await self._handler(channel)
        except asyncio.CancelledError:
            channel.abort(ErrorCode.CANCELLED)
            raise
        except TransportError as exc:
            # Usually the peer went away; not a server bug.
            logger.info("QUIC handler for channel %s ended: %s", channel.remote_address, exc)
            if exc.clean:
                await channel.close()
            else:
                channel.abort(ErrorCode.CANCELLED)
        except Exception:
            logger.exception(
                "QUIC handler for channel %s (stream %s) raised; the channel was reset with INTERNAL_ERROR",
                channel.remote_address,
                channel.stream_id,
            )
            channel.abort(ErrorCode.INTERNAL_ERROR)
        else:
            await channel.close()

    def close(self) -> None:
        """Stop accepting, close every connection (GOING_AWAY) and the socket. Idempotent."""
        if self._closing:
            return
        self._closing = True
        self._close_called.set()
        reason = "server shutting down"
        for connection in list(self._connections):
            failure = Failure(
                f"QUIC server {self.host}:{self.port} is shutting down",
                code=ErrorCode.GOING_AWAY,
                reason=reason,
                clean=True,
            )
            connection.shut(failure, ErrorCode.GOING_AWAY, reason)
        if self._server is not None:
            self._server.close()

    async def wait_closed(self) -> None:
        """Wait until close() was called and the handlers finished (cancelled after close_timeout)."""
        await self._close_called.wait()
        tasks = set(self._tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self._close_timeout)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=self._close_timeout)
        self._closed.set()

    async def __aenter__(self) -> QuicServer:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
        await self.wait_closed()


async def serve_quic(
    handler: Callable[[QuicChannel], Awaitable[None]],
    host: str,
    port: int,
    *,
    certfile: str | os.PathLike[str] | None = None,
    keyfile: str | os.PathLike[str] | None = None,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    idle_timeout: float = 20.0,
    close_timeout: float = 10.0,
    tuning: QuicTuning | None = None,
    reuse_port: bool = False,
) -> QuicServer:
    """Listen for m2mwire QUIC connections on UDP ``host:port`` (0 picks a free port).

    ``handler(channel)`` runs as its own task for every stream a client opens; when it returns the
    channel is closed in order, when it raises the exception is logged and the channel reset with
    INTERNAL_ERROR; other channels are unaffected. Without ``certfile`` a self-signed ECDSA P-256
    certificate for localhost/127.0.0.1/::1 is generated in memory and its SHA-256 fingerprint
    logged, for clients to pin.
    """
    tuning = tuning or QuicTuning()
    config = QuicConfiguration(
        is_client=False,
        alpn_protocols=[ALPN],
        idle_timeout=idle_timeout,
        max_data=tuning.connection_window,
        max_stream_data=tuning.stream_window,
        congestion_control_algorithm=tuning.congestion_control,
    )
    generated = certfile is None
    if certfile is not None:
        config.load_cert_chain(certfile, keyfile)
    elif keyfile is not None:
        raise ValueError("keyfile= given without certfile=")
    else:
        cert = generate_self_signed()
        config.certificate = cert.certificate
        config.private_key = cert.private_key
    fingerprint = certificate_fingerprint(config.certificate.public_bytes(serialization.Encoding.DER))
    server = QuicServer(handler, fingerprint=fingerprint, close_timeout=close_timeout)

    def create_protocol(quic: QuicConnection, stream_handler: object = None) -> Connection:
        connection = Connection(
            quic,
            tuning=tuning,
            max_message_size=max_message_size,
            idle_timeout=idle_timeout,
            close_timeout=close_timeout,
            on_channel=server._spawn,
        )
        server._connection_created(connection)
        return connection

    server.max_half_open = tuning.max_half_open
    listener = _Listener(configuration=config, create_protocol=create_protocol, admit=server._admit)
    transport = await udp_endpoint(
        listener, host, port, socket_buffer=tuning.socket_buffer, reuse_port=reuse_port
    )
    bound = transport.get_extra_info("sockname")
    server._server = listener
    server._transport = transport
    server.host, server.port = str(bound[0]), int(bound[1])
    # The configuration is read when each connection is created, which needs a datagram, hence
    # the next event-loop turn: setting it here, without awaiting first, is in time.
    config.max_datagram_size = tuning.datagram_size_for(is_loopback(server.host))
    if generated:
        logger.info(
            "QUIC server on %s uses a generated self-signed certificate; SHA-256 fingerprint %s "
            "(clients: connect with fingerprint=%s)",
            format_address(bound),
            fingerprint,
            fingerprint,
        )
    else:
        logger.info(
            "QUIC server on %s, certificate SHA-256 fingerprint %s", format_address(bound), fingerprint
        )
    return server
