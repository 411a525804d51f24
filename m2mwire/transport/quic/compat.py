"""Every use of aioquic internals by the QUIC transport, in one place, for one aioquic minor version.

aioquic has no public API for what the transport's resource bounds and speed need:

* receive credit granted as the application *consumes* (aioquic grants it as data *arrives*):
  :class:`FlowControlledConnection` replaces the two methods that write MAX_STREAM_DATA / MAX_DATA,
  and :func:`adopt` gives the connections aioquic's server builds that class;
* send backpressure (aioquic buffers without limit): :func:`unacked` reads a stream's
  unacknowledged bytes, :func:`write` appends to a stream without ``send_stream_data``'s lookups
  and gives its sender a :class:`~m2mwire.transport.quic.sendbuffer.SendBuffer` (no whole-buffer
  copies);
* stream and connection limits set before the handshake (:func:`configure`), the peer's MAX_STREAMS
  (:func:`bidi_streams_allowed`), the streams aioquic still holds (:func:`has_stream`), the
  negotiated idle timeout and the peer's certificate;
* the server's admission check, which must parse a header and look a connection up before aioquic
  creates state for it (:func:`parse_header`, :func:`has_connection`);
* the asyncio protocol's own state (:class:`ProtocolBase`: its loop, transport, timers and
  connection waiters), which a subclass may only reach through these names.

Each was checked against :data:`VERIFIED_MINOR`; importing this module with another aioquic raises
ImportError at once, so an upgrade fails loudly instead of silently losing a bound. To support a
new aioquic: read each function below against its source, then move the pin here and in
pyproject.toml together.
"""

from __future__ import annotations

import asyncio
from typing import cast

import aioquic
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer
from aioquic.buffer import Buffer  # type: ignore[attr-defined]  # re-exported from aioquic._buffer
from aioquic.quic.connection import (
    CONNECTION_LIMIT_FRAME_CAPACITY,
    MAX_STREAM_DATA_FRAME_CAPACITY,
    Limit,
    QuicConnection,
)
from aioquic.quic.packet import QuicFrameType, QuicHeader, pull_quic_header
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.quic.recovery import QuicPacketSpace
from aioquic.quic.stream import QuicStream
from cryptography.x509 import Certificate

from m2mwire.transport.pinned import Pinned
from m2mwire.transport.quic.sendbuffer import LARGE_WRITE, SendBuffer

__all__ = [
    "VERIFIED_MINOR",
    "FlowControlledConnection",
    "ProtocolBase",
    "adopt",
    "bidi_streams_allowed",
    "configure",
    "connection_received",
    "get_stream",
    "has_connection",
    "has_stream",
    "parse_header",
    "peer_certificate",
    "receiver_finished",
    "remote_idle_timeout",
    "sender_finished",
    "set_connection_credit",
    "set_stream_credit",
    "unacked",
    "write",
]

VERIFIED_MINOR = (1, 7)
PIN = Pinned(
    "aioquic", VERIFIED_MINOR, "QUIC", alternative=", or use the WebSocket transport (ws:// or wss:// URLs)"
)
check_version = PIN.check_version


check_version(aioquic.__version__)


class FlowControlledConnection(QuicConnection):
    """aioquic's QuicConnection with receive windows granted on consumption, not on arrival.

    aioquic doubles MAX_STREAM_DATA / MAX_DATA whenever the peer used half of them, whether or not
    anyone reads. Here the two methods that write those frames only announce the limits the
    transport set with :func:`set_stream_credit` and :func:`set_connection_credit`.
    """

    _inert_limit = Limit(frame_type=QuicFrameType.MAX_DATA, name="max_data", value=0)

    def _write_stream_limits(
        self, builder: QuicPacketBuilder, space: QuicPacketSpace, stream: QuicStream
    ) -> None:
        if stream.max_stream_data_local_sent != stream.max_stream_data_local:
            buf = builder.start_frame(
                QuicFrameType.MAX_STREAM_DATA,
                capacity=MAX_STREAM_DATA_FRAME_CAPACITY,
                handler=self._on_max_stream_data_delivery,
                handler_args=(stream,),
            )
            buf.push_uint_var(cast(int, stream.stream_id))  # None only for crypto streams
            buf.push_uint_var(stream.max_stream_data_local)
            stream.max_stream_data_local_sent = stream.max_stream_data_local

    def _write_connection_limits(self, builder: QuicPacketBuilder, space: QuicPacketSpace) -> None:
        # Let aioquic handle MAX_STREAMS (its policy differs between versions) with MAX_DATA hidden
        # behind a limit that never changes, then announce our own MAX_DATA.
        real = self._local_max_data
        self._local_max_data = self._inert_limit
        try:
            super()._write_connection_limits(builder, space)
        finally:
            self._local_max_data = real
        if real.value != real.sent:
            buf = builder.start_frame(
                QuicFrameType.MAX_DATA,
                capacity=CONNECTION_LIMIT_FRAME_CAPACITY,
                handler=self._on_connection_limit_delivery,
                handler_args=(real,),
            )
            buf.push_uint_var(real.value)
            real.sent = real.value


def adopt(quic: QuicConnection) -> None:
    """Give a connection built by aioquic's server our flow control (it builds plain ones).

    Safe because FlowControlledConnection adds no state, only overrides two methods, and the
    connection has not written a packet yet."""
    if type(quic) is QuicConnection:
        quic.__class__ = FlowControlledConnection


def configure(quic: QuicConnection, *, peer_bidi_streams: int, ack_delay: float) -> None:
    """Before the handshake: the streams the peer may open (bidirectional; none unidirectional),
    announced in the transport parameters, and how long we may hold back an ACK."""
    quic._local_max_streams_bidi.value = quic._local_max_streams_bidi.sent = peer_bidi_streams
    quic._local_max_streams_uni.value = quic._local_max_streams_uni.sent = 0
    quic._ack_delay = ack_delay


# -- streams -----------------------------------------------------------------------------------------


def get_stream(quic: QuicConnection, stream_id: int) -> QuicStream | None:
    stream: QuicStream | None = quic._streams.get(stream_id)
    return stream


def has_stream(quic: QuicConnection, stream_id: int) -> bool:
    """Whether aioquic still holds the stream's state (events may still come for it)."""
    return stream_id in quic._streams


def unacked(stream: QuicStream) -> int:
    """Bytes written to the stream and not yet acknowledged by the peer."""
    buffer: bytearray | SendBuffer = stream.sender._buffer
    return buffer.size if type(buffer) is SendBuffer else len(buffer)  # size: no Python __len__


def write(stream: QuicStream, data: bytes | bytearray | memoryview) -> None:
    """What ``send_stream_data`` does once the stream exists, without its per-call lookups.

    The first write of LARGE_WRITE bytes or more gives the stream's sender a :class:`SendBuffer`
    in place of its bytearray (QuicStreamSender uses ``+=``, ``len``, ``[a:b]`` and ``del [:n]``
    on it in 1.7; transport/quic/sendbuffer.py says why). aioquic types ``data`` as bytes; both
    buffers take bytes and 1-D byte views, which the channel writes: no typing.cast."""
    sender = stream.sender
    if (
        type(sender._buffer) is bytearray
        and (len(data) if type(data) is not memoryview else data.nbytes) >= LARGE_WRITE
    ):  # the bytearray aioquic made, taken over with what it holds
        sender._buffer = SendBuffer(bytes(sender._buffer))  # type: ignore[assignment]
    sender.write(data)  # type: ignore[arg-type]


def sender_finished(stream: QuicStream) -> bool:
    """Our side of the stream is over: FIN or reset sent and acknowledged."""
    return bool(stream.sender.is_finished)


def receiver_finished(stream: QuicStream) -> bool:
    """The peer's side of the stream is over: all data up to its FIN received, or reset."""
    return bool(stream.receiver.is_finished)


def set_stream_credit(stream: QuicStream, limit: int) -> None:
    """Announce MAX_STREAM_DATA ``limit`` with the next packet (see FlowControlledConnection)."""
    stream.max_stream_data_local = limit


# -- connection --------------------------------------------------------------------------------------


def connection_received(quic: QuicConnection) -> int:
    """Stream bytes the peer has sent on the connection (what counts against MAX_DATA)."""
    used: int = quic._local_max_data.used
    return used


def set_connection_credit(quic: QuicConnection, limit: int) -> None:
    """Announce MAX_DATA ``limit`` with the next packet (see FlowControlledConnection)."""
    quic._local_max_data.value = limit


def bidi_streams_allowed(quic: QuicConnection) -> int:
    """How many bidirectional streams the peer allows us to have opened in total (MAX_STREAMS).

    aioquic lets a caller write to a stream beyond it and queues it as blocked, but still sends
    RESET_STREAM, STOP_SENDING and MAX_STREAM_DATA for it, which the peer answers by closing the
    whole connection with STREAM_LIMIT_ERROR; callers must stay within this count.
    """
    allowed: int = quic._remote_max_streams_bidi
    return allowed


def remote_idle_timeout(quic: QuicConnection) -> float | None:
    """The idle timeout the peer advertised (None or 0: none)."""
    remote: float | None = quic._remote_max_idle_timeout
    return remote


def peer_certificate(quic: QuicConnection) -> Certificate | None:
    """The certificate the peer presented in the handshake, if any."""
    cert: Certificate | None = getattr(quic.tls, "_peer_certificate", None)
    return cert


# -- server ------------------------------------------------------------------------------------------


def has_connection(server: QuicServer, connection_id: bytes) -> bool:
    """Whether ``server`` routes ``connection_id`` to an existing connection."""
    return connection_id in server._protocols


def parse_header(data: bytes, host_cid_length: int) -> QuicHeader:
    """The QUIC header at the start of ``data`` (ValueError if malformed), as aioquic's server parses it."""
    return pull_quic_header(Buffer(data=data), host_cid_length=host_cid_length)


# -- asyncio protocol ----------------------------------------------------------------------------------


class ProtocolBase(QuicConnectionProtocol):
    """aioquic's asyncio protocol, its state reachable through public names only."""

    @property
    def quic(self) -> QuicConnection:
        return self._quic

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def datagram_transport(self) -> asyncio.DatagramTransport | None:
        return self._transport

    def transmit_soon(self) -> None:
        """Flush once at the end of this event-loop turn (coalesces the writes of a turn)."""
        self._transmit_soon()

    def transmit(self) -> None:
        # After the UDP socket closed (server shut down, client closed or aborted), timers and
        # scheduled flushes may still fire; asyncio would fail on the closed socket.
        transport = self._transport
        if transport is None or transport.is_closing():
            self._transmit_task = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            return
        super().transmit()

    def process_events(self) -> None:
        """Hand the events aioquic has queued to ``quic_event_received``."""
        self._process_events()

    def fail_connect(self, message: str) -> None:
        """Fail a pending ``wait_connected()`` (if nobody waits any more, the error is not logged)."""
        waiter = self._connected_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionError(message))
            waiter.exception()

    def mark_closed(self) -> None:
        """Release ``wait_closed()``."""
        self._closed.set()
