"""QUIC transport: one m2mwire :class:`~m2mwire.transport.base.Channel` per bidirectional QUIC stream.

A client connection (:func:`connect_quic`) carries any number of channels, each on its own
client-initiated bidirectional stream; the server (:func:`serve_quic`) runs ``handler(channel)``
as a task per stream. Messages are delimited on the stream by :mod:`m2mwire.transport.framing`.
The wire contract (ALPN, framing, FIN/reset semantics, error codes) is in docs/QUIC.md.

Built on aioquic, with three things aioquic does not do itself:

* **Send backpressure.** aioquic buffers ``send_stream_data`` without limit. ``send()`` writes into
  the stream only while the stream's unacknowledged bytes stay under a high watermark (and the
  connection's total under its own cap), waiting for ACKs to bring them under the low watermark.
* **Receive backpressure.** aioquic raises its flow-control windows as soon as data *arrives*,
  so a reader that stops reading never slows the sender and memory grows without bound. Here
  credit (MAX_STREAM_DATA / MAX_DATA) is granted as the application *consumes* messages, so
  unread data per stream and per connection is bounded by the windows.
* **Liveness.** Keepalive PINGs while idle, and every channel fails with a clear error when no
  packet arrived for ``idle_timeout`` seconds.
* **Admission.** The server validates client addresses with a Retry before it creates any
  connection state, holds at most ``QuicTuning.max_half_open`` unfinished handshakes (each for at
  most ``handshake_timeout``), and closes a connection that has had no channel open for
  ``idle_timeout``. A client waits for the server's stream credit before it opens a channel
  beyond the server's limit, since aioquic would otherwise break the whole connection.

and, for speed, its own UDP transport (:class:`_UdpTransport`): aioquic's cost is per packet, and
asyncio hands over one datagram per event-loop turn, after which aioquic builds its reply packets;
reading every queued datagram first and flushing once halves the CPU per byte in bulk transfers.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import logging
import os
import socket
import ssl
import struct
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Final, cast

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer as _AioquicServer
from aioquic.quic import events
from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE, QuicConfiguration
from aioquic.quic.connection import (
    CONNECTION_LIMIT_FRAME_CAPACITY,
    MAX_STREAM_DATA_FRAME_CAPACITY,
    Limit,
    NetworkAddress,
    QuicConnection,
    stream_is_client_initiated,
    stream_is_unidirectional,
)
from aioquic.quic.packet import QuicErrorCode, QuicFrameType, QuicPacketType
from aioquic.quic.packet_builder import QuicPacketBuilder
from aioquic.quic.recovery import QuicPacketSpace
from aioquic.quic.stream import QuicStream
from cryptography.hazmat.primitives import serialization

from m2mwire.errors import EncodeError, TransportError
from m2mwire.transport import aioquic_compat
from m2mwire.transport.base import Buffer, Message, OutgoingMessage
from m2mwire.transport.framing import (
    KIND_BINARY,
    KIND_TEXT,
    CloseFrame,
    Deframer,
    ErrorCode,
    FramingError,
    encode_close,
    encode_header,
)
from m2mwire.transport.tls import (
    certificate_fingerprint,
    check_fingerprint,
    check_trust_options,
    generate_self_signed,
    warn_insecure,
)

__all__ = [
    "ALPN",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "ChannelStats",
    "ErrorCode",
    "QuicChannel",
    "QuicClientConnection",
    "QuicServer",
    "QuicTuning",
    "connect_quic",
    "open_quic_channel",
    "serve_quic",
]

logger = logging.getLogger("m2mwire.transport")

ALPN: Final = "m2mwire/1"
DEFAULT_MAX_MESSAGE_SIZE: Final = 16 * 1024 * 1024
MiB: Final = 1024 * 1024
# Messages up to this size are joined with their header into one write (one copy is cheaper
# than a second send_stream_data call); larger ones are written piecewise, never concatenated.
_JOIN_LIMIT: Final = 64 * 1024
_MAX_DATAGRAM: Final = 16384
_pack_header = struct.Struct(">BI").pack  # the framing header (kind, length); length checked by the caller


@dataclass(frozen=True)
class QuicTuning:
    """Performance knobs; the defaults come from loopback measurements documented in docs/QUIC.md.

    ``max_datagram_size=None`` picks 16384 bytes when the peer (client side) or the bound address
    (server side) is loopback, where the MTU is 64 KiB, and the QUIC minimum of 1200 bytes otherwise:
    aioquic has no path-MTU discovery, so anything larger can black-hole on a real path. Set it
    explicitly (e.g. 1452 for a plain Ethernet path) when you know the path.
    """

    max_datagram_size: int | None = None
    loopback_datagram_size: int = 16384
    # Receive credit: unread bytes a peer may have in flight or queued, per stream / per connection.
    stream_window: int = 8 * MiB
    connection_window: int = 32 * MiB
    # Send watermarks on bytes handed to QUIC but not yet acknowledged by the peer.
    stream_send_high: int = 4 * MiB
    stream_send_low: int = 2 * MiB
    connection_send_high: int = 16 * MiB
    connection_send_low: int = 8 * MiB
    socket_buffer: int = 4 * MiB
    congestion_control: str = "reno"
    # How long a receiver may hold back an ACK (aioquic: 1 ms). Fewer ACK packets save CPU on both
    # sides, since aioquic's cost is per packet; must stay below the advertised max_ack_delay (25 ms).
    ack_delay: float = 0.001
    # A sender that never has to wait would queue up to the watermark before the event loop gets
    # to transmit anything; yielding once this much is queued but not yet flushed keeps the
    # network and the receiver busy while the sender produces.
    flush_threshold: int = 256 * 1024
    # Concurrent peer-opened channels a server accepts on one connection (QUIC MAX_STREAMS).
    max_channels_per_connection: int = 256
    # Server: connections whose handshake has not completed, at most (each holds ~80 KB of
    # aioquic state); Initials that would start another are dropped, and the client retries.
    max_half_open: int = 256
    # Server: a handshake not completed in this time is abandoned (its state freed).
    handshake_timeout: float = 10.0

    def __post_init__(self) -> None:
        if not 0 < self.stream_send_low <= self.stream_send_high:
            raise ValueError("need 0 < stream_send_low <= stream_send_high")
        if not 0 < self.connection_send_low <= self.connection_send_high:
            raise ValueError("need 0 < connection_send_low <= connection_send_high")
        if self.stream_window < 4096 or self.connection_window < self.stream_window:
            raise ValueError("need stream_window >= 4096 and connection_window >= stream_window")
        if self.max_half_open < 1 or self.handshake_timeout <= 0:
            raise ValueError("need max_half_open >= 1 and handshake_timeout > 0")
        if not 0 < self.ack_delay < 0.025:
            raise ValueError("ack_delay must be above 0 and below the advertised max_ack_delay of 25 ms")
        for name in ("max_datagram_size", "loopback_datagram_size"):
            size = getattr(self, name)
            # aioquic writes STREAM frame lengths as 2-byte varints, so a packet carries < 16 KiB.
            if size is not None and not SMALLEST_MAX_DATAGRAM_SIZE <= size <= _MAX_DATAGRAM:
                raise ValueError(
                    f"{name} must be between {SMALLEST_MAX_DATAGRAM_SIZE} and {_MAX_DATAGRAM} bytes"
                )

    def datagram_size_for(self, loopback: bool) -> int:
        if self.max_datagram_size is not None:
            return self.max_datagram_size
        return self.loopback_datagram_size if loopback else SMALLEST_MAX_DATAGRAM_SIZE


@dataclass
class ChannelStats:
    """Counters of one channel (or, on a connection, of all its channels' aioquic buffers)."""

    messages_sent: int = 0
    messages_received: int = 0
    bytes_sent: int = 0  # framed bytes handed to QUIC
    bytes_received: int = 0  # stream bytes received
    send_waits: int = 0  # how often send() waited for the peer/network (watermark reached)
    send_buffered_peak: int = 0  # max bytes handed to QUIC and not yet acknowledged
    recv_queued_peak: int = 0  # max bytes received and not yet read (excluding a message in progress)


@dataclass(frozen=True)
class _Failure:
    """Why a direction of a channel is over; turned into a fresh TransportError at each raise."""

    message: str
    code: int | None = None
    reason: str = ""
    clean: bool = False

    def error(self) -> TransportError:
        return TransportError(self.message, code=self.code, reason=self.reason, clean=self.clean)


class _FlowControlledConnection(QuicConnection):
    """aioquic's QuicConnection with receive windows granted on consumption, not on arrival.

    aioquic doubles MAX_STREAM_DATA / MAX_DATA whenever the peer used half of them, whether or not
    anyone reads. Here the two methods that write those frames only announce what the channels
    set (see ``QuicChannel._grant_credit`` and ``_Protocol._grant_connection_credit``).
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


def _format_address(addr: Any) -> str:
    host, port = str(addr[0]), int(addr[1])
    host = host.removeprefix("::ffff:") if host.startswith("::ffff:") and "." in host else host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def _tune_socket(sock: socket.socket, size: int) -> None:
    for option in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, size)
        except OSError as exc:  # pragma: no cover - platform dependent
            logger.debug("could not set UDP socket buffer option %s: %s", option, exc)
    # Linux reports twice the usable size and caps the request at net.core.{r,w}mem_max.
    logger.debug(
        "UDP socket buffers: requested %d bytes, kernel granted SO_RCVBUF=%d SO_SNDBUF=%d",
        size,
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
    )


class _UdpTransport(asyncio.DatagramTransport):
    """A UDP transport that reads every queued datagram per readiness event, then flushes once.

    asyncio's datagram transport reads one datagram per event-loop turn, and aioquic builds
    packets (ACKs, window updates, more data) after each one; aioquic's cost is per packet, so
    during bulk transfers that doubles the work. Here the connections that received datagrams in
    a batch flush once at its end. Works on any event loop with add_reader/add_writer.
    """

    max_batch = 64
    max_queued = 4096  # datagrams waiting for a full socket buffer; beyond, QUIC sees a loss

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: asyncio.DatagramProtocol
    ) -> None:
        super().__init__(extra={"socket": sock, "sockname": sock.getsockname()})
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._queue: collections.deque[tuple[bytes, Any]] = collections.deque()
        self._closing = False
        self.batch: set[_Protocol] | None = None  # connections to flush at the end of this read
        protocol.connection_made(self)
        loop.add_reader(self._fd, self._read_ready)

    def _read_ready(self) -> None:
        batch: set[_Protocol] = set()
        self.batch = batch
        try:
            for _ in range(self.max_batch):  # bounded, so one busy socket cannot starve the loop
                try:
                    data, addr = self._sock.recvfrom(65536)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    self._protocol.error_received(exc)
                    break
                self._protocol.datagram_received(data, addr)
                if self._closing:
                    break
        finally:
            self.batch = None
        for proto in batch:
            proto._after_datagrams()

    def sendto(self, data: bytes | bytearray | memoryview, addr: Any = None) -> None:
        if self._closing:
            return
        if not self._queue:
            try:
                self._sock.sendto(data, addr)
                return
            except (BlockingIOError, InterruptedError):
                self._loop.add_writer(self._fd, self._write_ready)
            except OSError as exc:
                self._protocol.error_received(exc)
                return
        if len(self._queue) < self.max_queued:
            self._queue.append((bytes(data), addr))

    def _write_ready(self) -> None:
        while self._queue:  # bounded by the queue
            data, addr = self._queue[0]
            try:
                self._sock.sendto(data, addr)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._protocol.error_received(exc)
            self._queue.popleft()
        self._loop.remove_writer(self._fd)

    def get_write_buffer_size(self) -> int:
        return sum(len(d) for d, _ in self._queue)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        self._queue.clear()
        self._loop.call_soon(self._connection_lost)

    def abort(self) -> None:
        self.close()

    def _connection_lost(self) -> None:
        try:
            self._protocol.connection_lost(None)
        finally:
            self._sock.close()


async def _udp_endpoint(
    protocol: asyncio.DatagramProtocol,
    host: str,
    port: int,
    tuning: QuicTuning,
    *,
    family: int = 0,
    reuse_port: bool = False,
) -> _UdpTransport:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, family=family, type=socket.SOCK_DGRAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        _tune_socket(sock, tuning.socket_buffer)
        if reuse_port:  # several worker processes on one port: the kernel spreads the clients
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.setblocking(False)
        sock.bind(addr)
        return _UdpTransport(loop, sock, protocol)
    except BaseException:
        sock.close()
        raise


class QuicChannel:
    """One m2mwire channel on one bidirectional QUIC stream. Implements the ``Channel`` protocol.

    Not created directly: use :meth:`QuicClientConnection.open_channel`, :func:`open_quic_channel`,
    or receive one in a :func:`serve_quic` handler.
    """

    def __init__(self, protocol: _Protocol, stream_id: int | None, max_message_size: int) -> None:
        self._protocol = protocol
        self._quic = protocol._quic
        self._tuning = protocol._tuning
        self._stream_id = stream_id
        self._stream: QuicStream | None = None
        self._deframer = Deframer(max_message_size)
        # Received bytes stay raw in the deframer until recv() decodes them, so a limit set with
        # set_max_message_size() after reading message N applies to message N+1.
        self._held = 0  # deframer.held as last accounted: received, unread, not a message in progress
        self._delivered = 0  # stream bytes received in order
        self._recv_waiter: asyncio.Future[None] | None = None
        self._recv_failure: _Failure | None = None
        self._send_failure: _Failure | None = None
        self._send_users = 0  # send() calls in progress; 0 allows the lock-free fast path
        self._send_lock = asyncio.Lock()
        self._send_waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._sender_reset = False  # our sending side was reset (by us, or by the peer's STOP_SENDING)
        self._receiver_stopped = False  # we sent STOP_SENDING (its first code is the one that counts)
        self._peer_close: CloseFrame | None = None
        self._closing = False
        self._close_done = asyncio.Event()
        self._closed = False
        self._owned_connection: QuicClientConnection | None = None
        self.stats = ChannelStats()
        if stream_id is not None:
            self._stream = self._quic._streams.get(stream_id)
        protocol._all_channels.add(self)

    # -- Channel protocol --------------------------------------------------------------------------

    @property
    def max_message_size(self) -> int:
        return self._deframer.max_message_size

    def set_max_message_size(self, size: int) -> None:
        self._deframer.max_message_size = size

    @property
    def remote_address(self) -> str:
        return self._protocol.remote_address

    @property
    def stream_id(self) -> int | None:
        """The QUIC stream id; None for a client channel that has not sent anything yet."""
        return self._stream_id

    @property
    def send_buffered(self) -> int:
        """Bytes handed to QUIC and not yet acknowledged by the peer."""
        stream = self._stream
        if stream is None or self._send_failure is not None:
            return 0
        return len(stream.sender._buffer)

    @property
    def recv_queued(self) -> int:
        """Bytes received and not yet returned by recv() (a message being received excluded)."""
        return self._held

    async def send(self, message: OutgoingMessage) -> None:
        """Send one message; waits while the stream's unacknowledged bytes are over the watermark."""
        failure = self._send_failure
        if failure is not None:
            raise failure.error()
        data: Buffer | None = None
        parts: list[Buffer]
        if type(message) is bytes and len(message) <= _JOIN_LIMIT:
            data = _pack_header(KIND_BINARY, len(message)) + message
        elif isinstance(message, str):
            try:
                body = message.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise EncodeError(
                    f"text message is not encodable as UTF-8 ({exc.reason} at index {exc.start}); "
                    "text channels carry JSON, which must be valid Unicode"
                ) from None
            if len(body) <= _JOIN_LIMIT:
                data = _pack_header(KIND_TEXT, len(body)) + body
            else:
                parts = [encode_header(KIND_TEXT, len(body)), body]
        else:
            views = (
                [_byte_view(message)]
                if isinstance(message, bytes | bytearray | memoryview)
                else [_byte_view(p) for p in message]
            )
            length = sum(v.nbytes for v in views)
            header = encode_header(KIND_BINARY, length)
            if length <= _JOIN_LIMIT:
                data = b"".join([header, *views])
            else:
                parts = [header, *views]
        if data is not None:
            # Fast path: nobody queued before us and the watermarks leave room for the whole frame.
            n = len(data)
            stream = self._stream
            tuning = self._tuning
            proto = self._protocol
            if (
                self._send_users == 0
                and (stream is None or len(stream.sender._buffer) + n <= tuning.stream_send_high)
                and proto._send_buffered + n <= tuning.connection_send_high
            ):
                self._write(data)
                self.stats.messages_sent += 1
                if proto._unflushed >= tuning.flush_threshold:
                    await asyncio.sleep(0)  # let the scheduled transmit run
                return
            parts = [data]
        self._send_users += 1
        try:
            async with self._send_lock:
                await self._write_frame(parts)
            self.stats.messages_sent += 1
        finally:
            self._send_users -= 1

    async def recv(self) -> Message:
        """The next message; once none is left, raises TransportError saying how the channel ended."""
        deframer = self._deframer
        while True:  # bounded: each pass returns, raises, or waits for an event that changes state
            if self._closed:
                raise cast(_Failure, self._recv_failure).error()
            try:
                message = deframer.next_message()
            except FramingError as exc:
                failure = _Failure(f"channel from {self.remote_address} failed: {exc}", code=exc.code)
                self._fail(failure, failure, wire_code=exc.code)
                self._account()
                raise failure.error() from None
            if message is not None:
                if type(message) is CloseFrame:
                    self._peer_close = message  # the FIN that must follow ends the channel
                    continue
                self.stats.messages_received += 1
                self._account()
                return cast(Message, message)
            self._account()  # a message may be in progress now: its bytes free credit
            if deframer.finished and self._recv_failure is None:
                self._recv_failure = self._peer_closed()
            if self._recv_failure is not None:
                raise self._recv_failure.error()
            if self._protocol._terminated:
                self._on_connection_over()
                continue
            if self._recv_waiter is not None:
                raise RuntimeError("recv() is already being awaited on this channel by another task")
            self._recv_waiter = self._protocol._loop.create_future()
            try:
                await self._recv_waiter
            finally:
                self._recv_waiter = None

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Orderly close: send a close frame (code, reason) and FIN after all queued data.

        Waits until the peer acknowledged everything (at most ``close_timeout`` seconds; then the
        stream is reset). Messages not yet read are discarded and later ``recv()`` calls raise
        ``TransportError(clean=True)``. Idempotent. A channel from :func:`open_quic_channel` also
        closes its connection.
        """
        if self._closing:
            await self._close_done.wait()
            return
        self._closing = True
        try:
            await self._close(code, reason)
        finally:
            owned, self._owned_connection = self._owned_connection, None
            if owned is not None:
                await owned.close()
            self._close_done.set()

    def abort(self, code: int = ErrorCode.CANCELLED) -> None:
        """Abrupt close: reset the stream in both directions with QUIC application error ``code``.

        Unsent data is discarded; the peer's recv()/send() raise ``TransportError(code=code)``.
        """
        failure = _Failure(f"channel to {self.remote_address} was aborted locally (code {code})", code=code)
        self._fail(failure, failure, wire_code=code)
        if not self._closing:
            self._closing = True
            self._close_done.set()
        self._finish_close()
        owned, self._owned_connection = self._owned_connection, None
        if owned is not None:
            owned._abort(code)

    # -- sending -----------------------------------------------------------------------------------

    def _room(self) -> int:
        tuning = self._tuning
        return min(
            tuning.stream_send_high - self.send_buffered,
            tuning.connection_send_high - self._protocol._send_buffered,
        )

    def _write(self, data: Buffer) -> None:
        """Hand bytes to aioquic (which copies them into its send buffer) and schedule a flush."""
        proto = self._protocol
        stream = self._stream
        n = len(data)  # data is bytes or a 1-D byte memoryview
        proto._unflushed += n
        if stream is None:
            self._stream_id = stream_id = proto._register_local_channel(self)
            self._quic.send_stream_data(stream_id, cast(bytes, data))
            stream = self._stream = self._quic._streams[stream_id]
        else:
            # What send_stream_data does once the stream exists, without its per-call lookups.
            # The stream cannot be discarded here: that needs our FIN or reset, which set
            # _send_failure first.
            stream.sender.write(cast(bytes, data))
        self.stats.bytes_sent += n
        proto._send_buffered += n
        proto._send_active.add(self)
        buffered = len(stream.sender._buffer)
        if buffered > self.stats.send_buffered_peak:
            self.stats.send_buffered_peak = buffered
        if proto._send_buffered > proto.stats.send_buffered_peak:
            proto.stats.send_buffered_peak = proto._send_buffered
        proto._transmit_soon()

    async def _write_frame(self, parts: Sequence[Buffer]) -> None:
        written = 0
        try:
            for part in parts:
                view = memoryview(part)
                offset = 0
                while offset < view.nbytes:  # bounded: each pass writes >= 1 byte or waits for ACKs
                    if self._send_failure is not None:
                        raise self._send_failure.error()
                    room = self._room()
                    if room <= 0:
                        self.stats.send_waits += 1
                        await self._wait_writable()
                        continue
                    n = min(room, view.nbytes - offset)
                    self._write(view[offset : offset + n] if n < view.nbytes else part)
                    offset += n
                    written += n
                    if self._protocol._unflushed >= self._tuning.flush_threshold:
                        await asyncio.sleep(0)  # let the scheduled transmit run
        except BaseException:
            if written and self._send_failure is None:
                # A partial frame is on the stream; nothing can follow it, so the channel is over.
                failure = _Failure(
                    f"channel to {self.remote_address} was reset: a send() was cancelled mid-message",
                    code=ErrorCode.CANCELLED,
                )
                self._fail(failure, failure, wire_code=ErrorCode.CANCELLED)
            raise

    def _writable(self) -> bool:
        tuning = self._tuning
        return (
            self.send_buffered <= tuning.stream_send_low
            and self._protocol._send_buffered <= tuning.connection_send_low
        )

    async def _wait_writable(self) -> None:
        proto = self._protocol
        self._send_waiter = proto._loop.create_future()
        proto._waiting.add(self)
        try:
            await self._send_waiter
        finally:
            self._send_waiter = None
            proto._waiting.discard(self)

    def _on_acks(self) -> None:
        """Called by the protocol after ACKs were processed (only while this channel waits)."""
        if self._send_waiter is not None and not self._send_waiter.done() and self._writable():
            self._send_waiter.set_result(None)
        drain = self._drain_waiter
        if drain is not None and not drain.done() and self._drained():
            drain.set_result(None)

    # -- receiving ---------------------------------------------------------------------------------

    def _on_data(self, data: bytes, end_stream: bool) -> None:
        n = len(data)
        self._delivered += n
        self.stats.bytes_received += n
        if self._closed:
            return  # late data for a closed channel: dropped, and counted as consumed
        deframer = self._deframer
        if data:
            deframer.feed(data)
        if end_stream:
            deframer.feed_eof()
        self._account()
        if deframer.ready:  # no wake-up per packet while a large message is still incomplete
            self._wake_reader()

    def _account(self) -> None:
        """Track unread bytes (per channel and connection) and grant credit for consumed ones."""
        held = self._deframer.held
        proto = self._protocol
        delta = held - self._held
        if delta:
            self._held = held
            proto._recv_queued += delta
            if delta > 0:
                if held > self.stats.recv_queued_peak:
                    self.stats.recv_queued_peak = held
                if proto._recv_queued > proto.stats.recv_queued_peak:
                    proto.stats.recv_queued_peak = proto._recv_queued
        if self._grant_credit() | proto._grant_connection_credit():
            proto._transmit_soon()

    def _grant_credit(self) -> bool:
        """Raise the stream's receive window to (bytes consumed + stream_window) in quarter steps.

        Bytes of a message being received count as consumed, so messages larger than the window
        still flow; bytes not yet read hold credit back.
        """
        stream = self._stream
        if stream is None or self._closed or stream.receiver.is_finished:
            return False
        window = self._tuning.stream_window
        target = self._delivered - self._held + window
        if target - stream.max_stream_data_local >= window >> 2:
            stream.max_stream_data_local = target
            return True
        return False

    def _peer_closed(self) -> _Failure:
        close = self._peer_close
        if close is None:
            return _Failure(f"channel closed by the peer {self.remote_address} (stream finished)", clean=True)
        detail = f"code {close.code}" + (f": {close.reason}" if close.reason else "")
        return _Failure(
            f"channel closed by the peer {self.remote_address} ({detail})",
            code=close.code,
            reason=close.reason,
            clean=True,
        )

    def _wake_reader(self) -> None:
        waiter = self._recv_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _on_reset(self, code: int) -> None:
        failure = _Failure(
            f"channel reset by the peer {self.remote_address} (code {ErrorCode.describe(code)})"
            + _RESET_HINTS.get(code, ""),
            code=code,
        )
        self._fail(failure, failure, wire_code=code)

    def _on_stop_sending(self, code: int) -> None:
        # aioquic already reset our sending side; the peer no longer reads.
        self._sender_reset = True
        if self._send_failure is None:
            clean = code == ErrorCode.NO_ERROR
            what = (
                "closed the channel"
                if clean
                else f"stopped reading the channel (code {ErrorCode.describe(code)})"
                + _RESET_HINTS.get(code, "")
            )
            self._send_failure = _Failure(f"peer {self.remote_address} {what}", code=code, clean=clean)
        self._wake_writers()

    def _fail(self, send: _Failure | None, recv: _Failure | None, *, wire_code: int | None = None) -> None:
        """End one or both directions; with ``wire_code`` also reset/stop the stream on the wire."""
        if send is not None and self._send_failure is None:
            self._send_failure = send
        if recv is not None and self._recv_failure is None:
            self._recv_failure = recv
        if wire_code is not None:
            self._reset_stream(wire_code)
        self._wake_writers()
        self._wake_reader()

    def _reset_stream(self, code: int) -> None:
        stream = self._stream
        if stream is None or self._protocol._terminated:
            return
        sid = cast(int, self._stream_id)
        if not stream.sender.is_finished:
            self._quic.reset_stream(sid, code)
            self._sender_reset = True
        if not stream.receiver.is_finished and not self._receiver_stopped:
            self._quic.stop_stream(sid, code)
            self._receiver_stopped = True
        self._protocol._transmit_soon()

    def _wake_writers(self) -> None:
        for waiter in (self._send_waiter, self._drain_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _on_connection_over(self) -> None:
        failure = self._protocol._failure or _Failure(f"QUIC connection to {self.remote_address} is closed")
        self._fail(failure, failure)

    def _discard_input(self) -> None:
        self._deframer.discard()
        self._account()

    # -- closing -----------------------------------------------------------------------------------

    async def _close(self, code: int, reason: str) -> None:
        proto = self._protocol
        local = _Failure(f"channel to {self.remote_address} is closed", code=code, reason=reason, clean=True)
        try:
            if self._send_failure is None and self._stream_id is not None:
                async with asyncio.timeout(proto._close_timeout):
                    async with self._send_lock:
                        if self._send_failure is None:
                            self._write(encode_close(code, reason))
                            self._quic.send_stream_data(self._stream_id, b"", end_stream=True)
                            self._send_failure = local
                            await self._wait_drained()
        except TimeoutError:
            failure = _Failure(
                f"closing the channel to {self.remote_address} timed out after {proto._close_timeout} s "
                "(the peer did not acknowledge the data); the stream was reset",
                code=ErrorCode.CANCELLED,
            )
            self._fail(failure, None, wire_code=ErrorCode.CANCELLED)
        finally:
            self._fail(local, local)
            stream = self._stream
            if (
                stream is not None
                and not stream.receiver.is_finished
                and not self._receiver_stopped
                and not proto._terminated
            ):
                # We will not read any more: ask the peer to stop (it sees an orderly close).
                self._quic.stop_stream(cast(int, self._stream_id), ErrorCode.NO_ERROR)
                self._receiver_stopped = True
                proto._transmit_soon()
            self._finish_close()

    def _drained(self) -> bool:
        stream = self._stream
        return stream is None or stream.sender.is_finished or self._sender_reset or self._protocol._terminated

    async def _wait_drained(self) -> None:
        while not self._drained():  # bounded by close_timeout
            self._drain_waiter = self._protocol._loop.create_future()
            self._protocol._waiting.add(self)
            try:
                await self._drain_waiter
            finally:
                self._drain_waiter = None
                self._protocol._waiting.discard(self)

    def _finish_close(self) -> None:
        proto = self._protocol
        was_open, self._closed = not self._closed, True
        if self._stream_id is not None:
            proto._zombies.add(self._stream_id)
        self._discard_input()
        proto._send_active.discard(self)
        if proto._grant_connection_credit():
            proto._transmit_soon()
        if was_open:
            proto._channel_closed(self)


_RESET_HINTS: Final[dict[int, str]] = {
    ErrorCode.MESSAGE_TOO_BIG: ": a message exceeded the peer's max_message_size (raise it there)",
    ErrorCode.FRAME_ERROR: ": the peer rejected malformed framing",
    ErrorCode.INVALID_UTF8: ": the peer received a text message that is not valid UTF-8",
    ErrorCode.INTERNAL_ERROR: ": the peer failed while handling the channel (see its logs)",
    ErrorCode.CANCELLED: ": the peer aborted the channel",
    ErrorCode.REFUSED: ": the peer refused the stream (shutting down, or a stream type m2mwire does not use)",
}


def _byte_view(buffer: Buffer) -> memoryview:
    view = memoryview(buffer)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")  # raises TypeError for non-contiguous buffers
    return view


class _Protocol(QuicConnectionProtocol):
    """One QUIC connection: routes stream events to channels, paces writers, keeps the peer alive."""

    def __init__(
        self,
        quic: QuicConnection,
        *,
        tuning: QuicTuning,
        max_message_size: int,
        idle_timeout: float,
        close_timeout: float,
        on_channel: Callable[[QuicChannel], None] | None = None,
        pinned_fingerprint: str | None = None,
    ) -> None:
        if type(quic) is QuicConnection:
            # aioquic's server builds plain QuicConnection objects; give them our flow control.
            quic.__class__ = _FlowControlledConnection
        super().__init__(quic)
        self._tuning = tuning
        self._max_message_size = max_message_size
        self._idle_timeout = idle_timeout
        self._close_timeout = close_timeout
        self._on_channel = on_channel
        self._pinned_fingerprint = pinned_fingerprint
        self._channels: dict[int, QuicChannel] = {}
        # Every channel, including client channels that have no stream yet, to fail them all at the end.
        self._all_channels: weakref.WeakSet[QuicChannel] = weakref.WeakSet()
        self._ignored: set[int] = set()  # peer streams we refused
        self._zombies: set[int] = set()  # stream ids of closed channels, until aioquic discards them
        self._waiting: set[QuicChannel] = set()
        self._send_active: set[QuicChannel] = set()
        self._send_buffered = 0
        self._unflushed = 0  # bytes written since the last transmit
        self._recv_queued = 0
        self._terminated = False
        self._failure: _Failure | None = None
        self._peer_fingerprint: str | None = None
        self._last_rx = self._loop.time()
        self._keepalive: asyncio.TimerHandle | None = None
        self._on_terminated: Callable[[_Protocol], None] | None = None
        self._on_handshake_done: Callable[[_Protocol], None] | None = None
        self._handshake_done = False
        # Server: since when the connection has had no open channel (None while one is open, and
        # before the handshake, which handshake_timeout bounds instead).
        self._no_channel_since: float | None = None
        self._handshake_timer: asyncio.TimerHandle | None = None
        if not quic.configuration.is_client:
            self._handshake_timer = self._loop.call_later(
                tuning.handshake_timeout, self._on_handshake_timeout
            )
        # Client: open_channel() calls waiting for the server's stream credit.
        self._stream_waiters: list[asyncio.Future[None]] = []
        self.remote_address = "?"
        self.stats = ChannelStats()
        # Only clients open streams, and only bidirectional ones (announced in the transport parameters).
        peer_bidi = 0 if quic.configuration.is_client else tuning.max_channels_per_connection
        quic._local_max_streams_bidi.value = quic._local_max_streams_bidi.sent = peer_bidi
        quic._local_max_streams_uni.value = quic._local_max_streams_uni.sent = 0
        quic._ack_delay = tuning.ack_delay

    # -- asyncio hooks -----------------------------------------------------------------------------

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
        self._unflushed = 0
        super().transmit()

    def datagram_received(self, data: bytes | str, addr: NetworkAddress) -> None:
        if self.remote_address == "?":
            self.remote_address = _format_address(addr)
            self._schedule_keepalive()
        self._last_rx = self._loop.time()
        self._quic.receive_datagram(cast(bytes, data), addr, now=self._last_rx)
        self._process_events()
        batch = getattr(self._transport, "batch", None)
        if batch is not None:
            batch.add(self)  # flushed once when the transport has read everything queued
        else:
            self._after_datagrams()

    def _after_datagrams(self) -> None:
        self._grant_connection_credit()
        self._after_acks()
        if self._stream_waiters:
            self._wake_stream_waiters()  # a MAX_STREAMS frame may have arrived
        self.transmit()

    def connection_lost(self, exc: Exception | None) -> None:
        # Only client protocols own their UDP socket.
        self._terminate(_Failure(f"QUIC connection to {self.remote_address} lost: UDP socket closed ({exc})"))

    def error_received(self, exc: Exception) -> None:
        logger.debug("UDP error on the connection to %s: %s", self.remote_address, exc)

    # -- events ------------------------------------------------------------------------------------

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived):
            channel = self._channels.get(event.stream_id)
            if channel is None:
                channel = self._accept_stream(event.stream_id)
                if channel is None:
                    return
            channel._on_data(event.data, event.end_stream)
        elif isinstance(event, events.StreamReset):
            channel = self._channels.get(event.stream_id)
            if channel is not None:
                channel._on_reset(event.error_code)
        elif isinstance(event, events.StopSendingReceived):
            channel = self._channels.get(event.stream_id)
            if channel is not None:
                channel._on_stop_sending(event.error_code)
        elif isinstance(event, events.HandshakeCompleted):
            self._on_handshake(event)
        elif isinstance(event, events.ConnectionTerminated):
            self._terminate(self._describe_termination(event))

    def _on_handshake(self, event: events.HandshakeCompleted) -> None:
        self._handshake_done = True
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if not self._quic.configuration.is_client:
            self._no_channel_since = self._loop.time()
        if self._on_handshake_done is not None:
            self._on_handshake_done(self)
        peer_cert = getattr(self._quic.tls, "_peer_certificate", None)
        if peer_cert is not None:
            self._peer_fingerprint = certificate_fingerprint(peer_cert)
        if self._pinned_fingerprint is None:
            return
        try:
            check_fingerprint(self._peer_fingerprint or "(no certificate)", self._pinned_fingerprint)
        except TransportError as exc:
            self._failure = _Failure(f"QUIC connection to {self.remote_address}: {exc}")
            # bad_certificate TLS alert as a QUIC CRYPTO_ERROR (RFC 9001 section 4.8)
            self._quic.close(
                error_code=QuicErrorCode.CRYPTO_ERROR + 42,
                frame_type=QuicFrameType.CRYPTO,
                reason_phrase="certificate fingerprint mismatch",
            )

    def _accept_stream(self, stream_id: int) -> QuicChannel | None:
        if stream_id in self._ignored:
            return None
        peer_bidi = stream_is_client_initiated(stream_id) != self._quic.configuration.is_client and not (
            stream_is_unidirectional(stream_id)
        )
        if not peer_bidi or self._on_channel is None:
            # Only clients open channels, only on bidirectional streams.
            self._ignored.add(stream_id)
            if not stream_is_unidirectional(stream_id):
                self._quic.reset_stream(stream_id, ErrorCode.REFUSED)
            self._quic.stop_stream(stream_id, ErrorCode.REFUSED)
            logger.debug("refused stream %d from %s", stream_id, self.remote_address)
            return None
        channel = QuicChannel(self, stream_id, self._max_message_size)
        self._channels[stream_id] = channel
        self._no_channel_since = None
        self._on_channel(channel)
        return channel

    def _channel_closed(self, channel: QuicChannel) -> None:
        if channel._stream_id is None:
            self._wake_stream_waiters()  # it held a slot of the peer's stream credit
        if self._quic.configuration.is_client or self._no_channel_since is not None:
            return
        if not any(not ch._closed for ch in self._channels.values()):  # bounded by MAX_STREAMS
            self._no_channel_since = self._loop.time()

    # -- stream credit (client) ----------------------------------------------------------------------

    def _streams_available(self) -> int:
        """Channels that may still be opened within the peer's MAX_STREAMS.

        A channel takes its stream id at its first write, so channels opened but not yet written
        to hold a slot too; ``_all_channels`` is weak, so a channel dropped unclosed frees its slot.
        """
        quic = self._quic
        opened = quic.get_next_available_stream_id() // 4
        pending = sum(1 for ch in self._all_channels if ch._stream_id is None and not ch._closed)
        return aioquic_compat.bidi_streams_allowed(quic) - opened - pending

    async def _reserve_stream(self, timeout: float) -> None:
        """Return once a new channel fits in the peer's stream credit; TransportError after ``timeout``."""
        if self._streams_available() > 0 and not self._stream_waiters:
            return
        waiter = self._loop.create_future()
        self._stream_waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                while True:  # bounded by the timeout; each pass waits for credit or a closed channel
                    await waiter
                    if self._terminated:
                        raise (
                            self._failure or _Failure(f"QUIC connection to {self.remote_address} is closed")
                        ).error()
                    if self._streams_available() > 0:
                        return
                    waiter = self._loop.create_future()
                    self._stream_waiters.insert(0, waiter)  # keep its turn
        except TimeoutError:
            allowed = aioquic_compat.bidi_streams_allowed(self._quic)
            raise TransportError(
                f"no channel could be opened on the QUIC connection to {self.remote_address} within "
                f"{timeout:g} s: all {allowed - self._quic.get_next_available_stream_id() // 4} "
                "remaining streams the server allows (its MAX_STREAMS limit, 256 concurrent by "
                "default) are in use. Close a session on this connection first, or open another "
                "connection with open_quic_connection()"
            ) from None
        finally:
            if waiter in self._stream_waiters:
                self._stream_waiters.remove(waiter)
            self._wake_stream_waiters()

    def _wake_stream_waiters(self) -> None:
        # Wake as many waiters, in order, as there are free slots (all of them once terminated).
        free = len(self._stream_waiters) if self._terminated else self._streams_available()
        for waiter in self._stream_waiters[: max(free, 0)]:
            if not waiter.done():
                waiter.set_result(None)

    def _register_local_channel(self, channel: QuicChannel) -> int:
        # Stream ids are taken at the first write, so channels opened but never used cost nothing
        # on the wire and never leave a half-open stream at the peer.
        stream_id = self._quic.get_next_available_stream_id()
        self._channels[stream_id] = channel
        return stream_id

    # -- flow control --------------------------------------------------------------------------------

    def _grant_connection_credit(self) -> bool:
        limit = self._quic._local_max_data
        window = self._tuning.connection_window
        target = limit.used - self._recv_queued + window
        if target - limit.value >= window // 4:
            limit.value = target
            return True
        return False

    def _after_acks(self) -> None:
        if self._send_active:
            total = 0
            for channel in list(self._send_active):  # bounded by the number of channels
                n = channel.send_buffered
                if n == 0:
                    self._send_active.discard(channel)
                total += n
            self._send_buffered = total
        else:
            self._send_buffered = 0
        for channel in list(self._waiting):
            channel._on_acks()
        self._prune()

    def _prune(self) -> None:
        # Forget closed channels and refused streams once aioquic discarded the stream state:
        # no event can follow for them then.
        if self._zombies:
            streams = self._quic._streams
            for sid in [s for s in self._zombies if s not in streams]:
                self._zombies.discard(sid)
                self._channels.pop(sid, None)
        if self._ignored:
            self._ignored = {s for s in self._ignored if s in self._quic._streams}

    # -- liveness and termination --------------------------------------------------------------------

    def _effective_idle_timeout(self) -> float:
        # RFC 9000 section 10.1: the smaller of the two advertised values.
        remote: float | None = self._quic._remote_max_idle_timeout
        return min(self._idle_timeout, remote) if remote else self._idle_timeout

    def _schedule_keepalive(self) -> None:
        # Wake at the earlier of: a quarter of the idle timeout (to PING an idle peer), or the
        # moment the peer would count as gone.
        idle_timeout = self._effective_idle_timeout()
        interval = max(idle_timeout / 4, 0.05)
        at = min(self._loop.time() + interval, self._last_rx + idle_timeout)
        self._keepalive = self._loop.call_at(at, self._on_keepalive)

    def _on_handshake_timeout(self) -> None:
        self._handshake_timer = None
        if self._terminated or self._handshake_done:
            return
        timeout = self._tuning.handshake_timeout
        self._failure = _Failure(
            f"QUIC handshake with {self.remote_address} not completed within {timeout:g} s"
        )
        # A transport close (frame type given). aioquic forgets the connection after its closing
        # period (three PTOs, about a second) and then reports ConnectionTerminated, which ends
        # this protocol: until then it still counts as half-open, so max_half_open bounds the
        # state held, closing connections included.
        self._quic.close(
            error_code=QuicErrorCode.CONNECTION_REFUSED,
            frame_type=QuicFrameType.PADDING,
            reason_phrase="handshake timeout",
        )
        self.transmit()

    def _on_keepalive(self) -> None:
        self._keepalive = None
        if self._terminated:
            return
        idle_timeout = self._effective_idle_timeout()
        now = self._loop.time()
        since = self._no_channel_since
        if since is not None and now - since >= idle_timeout:
            # Server: a connection that carries no channel costs state and keepalives for
            # nothing; a client keeps it only as long as it would keep an idle one.
            reason = f"no channel open for {idle_timeout:g} s"
            self._failure = _Failure(
                f"QUIC connection to {self.remote_address} closed: {reason}",
                code=ErrorCode.NO_ERROR,
                reason=reason,
                clean=True,
            )
            self.close(error_code=ErrorCode.NO_ERROR, reason_phrase=reason)
            self._terminate(self._failure)
            return
        idle = now - self._last_rx
        if idle >= idle_timeout:
            # Silent close, as for QUIC's own idle timeout: the peer is presumed gone. aioquic's
            # idle timer then discards the connection state.
            self._terminate(
                _Failure(
                    f"QUIC peer {self.remote_address} is unreachable: no packet for {idle:.1f} s "
                    f"(idle timeout {idle_timeout:g} s)"
                )
            )
            return
        if idle >= idle_timeout / 4:
            self._quic.send_ping(0)
            self.transmit()
        self._schedule_keepalive()

    def _describe_termination(self, event: events.ConnectionTerminated) -> _Failure:
        if self._failure is not None:
            return self._failure
        code, reason = event.error_code, event.reason_phrase
        peer = self.remote_address
        if event.frame_type is None:  # application close
            clean = code in (ErrorCode.NO_ERROR, ErrorCode.GOING_AWAY)
            what = "closed by the peer" if clean else "aborted by the peer"
            return _Failure(
                f"QUIC connection to {peer} {what} (code {ErrorCode.describe(code)}"
                + (f": {reason})" if reason else ")"),
                code=code,
                reason=reason,
                clean=clean,
            )
        if reason == "Idle timeout":
            return _Failure(
                f"QUIC peer {peer} is unreachable: no packet within the idle timeout "
                f"({self._idle_timeout:g} s or the peer's, whichever is smaller)",
                code=code,
            )
        hint = ""
        if QuicErrorCode.CRYPTO_ERROR <= code < QuicErrorCode.CRYPTO_ERROR + 256:
            hint = (
                " (TLS failure: to trust a self-signed server pass fingerprint=<sha256 it logs> or "
                f"cafile=; both ends must speak ALPN {ALPN!r})"
            )
        return _Failure(
            f"QUIC connection to {peer} failed: transport error {code:#x}"
            + (f" ({reason})" if reason else "")
            + hint,
            code=code,
            reason=reason,
        )

    def _terminate(self, failure: _Failure) -> None:
        """The connection is over: every channel fails (after delivering what it already has)."""
        if self._terminated:
            return
        self._terminated = True
        if self._failure is None:
            self._failure = failure
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        for stream_waiter in self._stream_waiters:
            if not stream_waiter.done():
                stream_waiter.set_result(None)
        for channel in list(self._all_channels):
            channel._fail(failure, failure)
        self._waiting.clear()
        self._closed.set()
        waiter = self._connected_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionError(failure.message))
            waiter.exception()  # nobody may be waiting any more (connect timed out): do not log it
        if self._on_terminated is not None:
            self._on_terminated(self)

    async def close_connection(self, code: int, reason: str, *, graceful: bool) -> None:
        """Close all channels (gracefully: FIN and wait for ACKs, bounded) then the connection."""
        if graceful and not self._terminated:
            channels = [ch for ch in self._channels.values() if not ch._closing]
            if channels:
                await asyncio.gather(*(ch.close() for ch in channels), return_exceptions=True)
        if not self._terminated:
            clean = code in (ErrorCode.NO_ERROR, ErrorCode.GOING_AWAY)
            self._failure = _Failure(
                f"QUIC connection to {self.remote_address} was closed locally"
                + (f" ({reason})" if reason else ""),
                code=code,
                reason=reason,
                clean=clean,
            )
            self.close(error_code=code, reason_phrase=reason)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._close_timeout):
                    await self._closed.wait()
            self._terminate(self._failure)


class QuicClientConnection:
    """A client QUIC connection that carries any number of channels."""

    def __init__(
        self, protocol: _Protocol, transport: asyncio.DatagramTransport, *, open_timeout: float = 10.0
    ) -> None:
        self._protocol = protocol
        self._transport = transport
        self._closing = False
        self.open_timeout = open_timeout  # default wait of open_channel() for stream credit

    @property
    def remote_address(self) -> str:
        return self._protocol.remote_address

    @property
    def server_fingerprint(self) -> str | None:
        """SHA-256 fingerprint of the certificate the server presented."""
        return self._protocol._peer_fingerprint

    @property
    def closed(self) -> bool:
        return self._protocol._terminated

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
        proto = self._protocol
        if proto._terminated or self._closing:
            failure = proto._failure or _Failure(f"QUIC connection to {self.remote_address} is closed")
            raise failure.error()
        await proto._reserve_stream(self.open_timeout if timeout is None else timeout)
        if self._closing:
            raise _Failure(f"QUIC connection to {self.remote_address} is closed").error()
        return QuicChannel(
            proto, None, proto._max_message_size if max_message_size is None else max_message_size
        )

    async def close(self) -> None:
        """Close every channel in order (bounded by close_timeout), then the connection. Idempotent."""
        if self._closing:
            await self.wait_closed()
            return
        self._closing = True
        try:
            await self._protocol.close_connection(ErrorCode.NO_ERROR, "", graceful=True)
        finally:
            self._transport.close()

    async def wait_closed(self) -> None:
        await self._protocol.wait_closed()

    def _abort(self, code: int) -> None:
        if not self._closing:
            self._closing = True
            self._protocol._failure = _Failure(
                f"QUIC connection to {self.remote_address} was aborted locally (code {code})", code=code
            )
            self._protocol.close(error_code=code, reason_phrase="aborted")
            self._protocol._terminate(self._protocol._failure)
            self._transport.close()

    async def __aenter__(self) -> QuicClientConnection:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


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
                header = aioquic_compat.parse_header(raw, self._m2m_cid_length)
            except ValueError:
                return  # aioquic drops it too
            if (
                header.packet_type == QuicPacketType.INITIAL
                and header.token  # without one, aioquic answers with a stateless Retry
                and not aioquic_compat.has_connection(self, header.destination_cid)
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
        self._connections: set[_Protocol] = set()
        self._half_open: set[_Protocol] = set()  # handshake not completed yet
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

    def _protocol_created(self, protocol: _Protocol) -> None:
        self._connections.add(protocol)
        self._half_open.add(protocol)
        protocol._on_terminated = self._forget
        protocol._on_handshake_done = self._half_open.discard

    def _forget(self, protocol: _Protocol) -> None:
        self._connections.discard(protocol)
        self._half_open.discard(protocol)

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
        for proto in list(self._connections):
            proto._failure = _Failure(
                f"QUIC server {self.host}:{self.port} is shutting down",
                code=ErrorCode.GOING_AWAY,
                reason="server shutting down",
                clean=True,
            )
            proto.close(error_code=ErrorCode.GOING_AWAY, reason_phrase="server shutting down")
            proto._terminate(proto._failure)
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

    def create_protocol(quic: QuicConnection, stream_handler: object = None) -> _Protocol:
        proto = _Protocol(
            quic,
            tuning=tuning,
            max_message_size=max_message_size,
            idle_timeout=idle_timeout,
            close_timeout=close_timeout,
            on_channel=server._spawn,
        )
        server._protocol_created(proto)
        return proto

    server.max_half_open = tuning.max_half_open
    aioquic_server = _Listener(configuration=config, create_protocol=create_protocol, admit=server._admit)
    transport = await _udp_endpoint(aioquic_server, host, port, tuning, reuse_port=reuse_port)
    bound = transport.get_extra_info("sockname")
    server._server = aioquic_server
    server._transport = transport
    server.host, server.port = str(bound[0]), int(bound[1])
    # The configuration is read when each connection is created, which needs a datagram, hence
    # the next event-loop turn: setting it here, without awaiting first, is in time.
    config.max_datagram_size = tuning.datagram_size_for(_is_loopback(server.host))
    if generated:
        logger.info(
            "QUIC server on %s uses a generated self-signed certificate; SHA-256 fingerprint %s "
            "(clients: connect with fingerprint=%s)",
            _format_address(bound),
            fingerprint,
            fingerprint,
        )
    else:
        logger.info(
            "QUIC server on %s, certificate SHA-256 fingerprint %s", _format_address(bound), fingerprint
        )
    return server


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
    tuning = tuning or QuicTuning()
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
    if insecure:
        warn_insecure(target)
    for family, addr in addresses:
        config = QuicConfiguration(
            is_client=True,
            alpn_protocols=[ALPN],
            idle_timeout=idle_timeout,
            max_data=tuning.connection_window,
            max_stream_data=tuning.stream_window,
            max_datagram_size=tuning.datagram_size_for(_is_loopback(str(addr[0]))),
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
            open_timeout=connect_timeout,
        )
        if connection is not None:
            return connection
    tried = ", ".join(_format_address(addr) for _, addr in addresses)
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
    open_timeout: float,
) -> QuicClientConnection | None:
    """One connection attempt: the connection, None on timeout, TransportError on any failure."""
    protocol = _Protocol(
        _FlowControlledConnection(configuration=config),
        tuning=tuning,
        max_message_size=max_message_size,
        idle_timeout=idle_timeout,
        close_timeout=close_timeout,
        pinned_fingerprint=fingerprint,
    )
    transport = await _udp_endpoint(
        protocol, "::" if family == socket.AF_INET6 else "0.0.0.0", 0, tuning, family=family
    )
    protocol.remote_address = _format_address(addr)
    try:
        protocol.connect(addr)
        async with asyncio.timeout(timeout):
            await protocol.wait_connected()
        protocol._schedule_keepalive()
    except TimeoutError:
        transport.close()
        return None
    except ConnectionError:
        transport.close()
        raise (protocol._failure or _Failure(f"QUIC handshake with {target} failed")).error() from None
    except BaseException:
        transport.close()
        raise
    if protocol._failure is not None:  # fingerprint mismatch, detected right after the handshake
        failure = protocol._failure
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await protocol.wait_closed()
        transport.close()
        raise failure.error()
    return QuicClientConnection(protocol, transport, open_timeout=open_timeout)


async def open_quic_channel(host: str, port: int, **options: Any) -> QuicChannel:
    """Connect and open one channel that owns the connection (closing it closes the connection)."""
    connection = await connect_quic(host, port, **options)
    try:
        channel = await connection.open_channel()
    except BaseException:
        await connection.close()
        raise
    channel._owned_connection = connection
    return channel
