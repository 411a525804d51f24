"""One QUIC connection (:class:`Connection`): routes stream events to channels, paces writers,
grants connection credit, keeps the peer alive, and ends every channel when it ends.

It is the :class:`~.channel.Link` its channels use; the server and the client drive it through
its public methods. aioquic's internals are reached only through :mod:`.compat`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Callable
from typing import cast

from aioquic.quic import events
from aioquic.quic.connection import (
    NetworkAddress,
    QuicConnection,
    stream_is_client_initiated,
    stream_is_unidirectional,
)
from aioquic.quic.packet import QuicErrorCode, QuicFrameType
from aioquic.quic.stream import QuicStream

from m2mwire.errors import TransportError
from m2mwire.transport.base import Buffer
from m2mwire.transport.framing import ErrorCode
from m2mwire.transport.quic import compat
from m2mwire.transport.quic.channel import ChannelStats, QuicChannel
from m2mwire.transport.quic.failure import Failure
from m2mwire.transport.quic.flow import ReceiveCredit, SendBudget
from m2mwire.transport.quic.tuning import ALPN, QuicTuning
from m2mwire.transport.quic.udp import format_address
from m2mwire.transport.tls import certificate_fingerprint, check_fingerprint

__all__ = ["Connection"]

logger = logging.getLogger("m2mwire.transport")


class Connection(compat.ProtocolBase):
    """One QUIC connection and the channels on its streams."""

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
        compat.adopt(quic)  # aioquic's server builds plain QuicConnection objects
        super().__init__(quic)
        self.tuning = tuning
        self.budget = SendBudget(
            tuning.stream_send_high,
            tuning.stream_send_low,
            tuning.connection_send_high,
            tuning.connection_send_low,
        )
        self._credit = ReceiveCredit(tuning.connection_window)
        self.max_message_size = max_message_size  # of the channels the peer opens
        self._idle_timeout = idle_timeout
        self.close_timeout = close_timeout
        self._on_channel = on_channel
        self._pinned_fingerprint = pinned_fingerprint
        self._channels: dict[int, QuicChannel] = {}
        # Every channel, including client channels that have no stream yet, to fail them all at the end.
        self._all_channels: weakref.WeakSet[QuicChannel] = weakref.WeakSet()
        self._ignored: set[int] = set()  # peer streams we refused
        self._zombies: set[int] = set()  # stream ids of closed channels, until aioquic discards them
        self._waiting: set[QuicChannel] = set()  # channels waiting for ACKs
        self._send_active: set[QuicChannel] = set()  # channels with unacknowledged bytes
        self.send_buffered = 0  # unacknowledged bytes of all channels, as of the last ACKs
        self.unflushed = 0  # bytes written since the last transmit
        self._recv_queued = 0  # unread bytes of all channels
        self._terminated = False
        self.failure: Failure | None = None  # why the connection ended (set first, when known)
        self.peer_fingerprint: str | None = None
        self._last_rx = self.loop.time()
        self._keepalive: asyncio.TimerHandle | None = None
        self.on_terminated: Callable[[Connection], None] | None = None
        self.on_handshake_done: Callable[[Connection], None] | None = None
        self._handshake_done = False
        # Server: since when the connection has had no open channel (None while one is open, and
        # before the handshake, which handshake_timeout bounds instead).
        self._no_channel_since: float | None = None
        self._handshake_timer: asyncio.TimerHandle | None = None
        if not quic.configuration.is_client:
            self._handshake_timer = self.loop.call_later(tuning.handshake_timeout, self._on_handshake_timeout)
        # Client: open_channel() calls waiting for the server's stream credit.
        self._stream_waiters: list[asyncio.Future[None]] = []
        self.remote_address = "?"
        self.stats = ChannelStats()
        # Only clients open streams, and only bidirectional ones (announced in the transport parameters).
        compat.configure(
            quic,
            peer_bidi_streams=0 if quic.configuration.is_client else tuning.max_channels_per_connection,
            ack_delay=tuning.ack_delay,
        )

    @property
    def terminated(self) -> bool:
        return self._terminated

    # -- asyncio hooks -----------------------------------------------------------------------------

    def transmit(self) -> None:
        self.unflushed = 0
        super().transmit()

    def datagram_received(self, data: bytes | str, addr: NetworkAddress) -> None:
        if self.remote_address == "?":
            self.remote_address = format_address(addr)
            self.start_keepalive()
        self._last_rx = self.loop.time()
        self.quic.receive_datagram(cast(bytes, data), addr, now=self._last_rx)
        self.process_events()
        batch = getattr(self.datagram_transport, "batch", None)
        if batch is not None:
            batch.add(self)  # flushed once when the transport has read everything queued
        else:
            self.after_datagrams()

    def after_datagrams(self) -> None:
        self._grant_connection_credit()  # announced by the transmit below
        self._after_acks()
        if self._stream_waiters:
            self._wake_stream_waiters()  # a MAX_STREAMS frame may have arrived
        self.transmit()

    def connection_lost(self, exc: Exception | None) -> None:
        # Only client protocols own their UDP socket.
        self.terminate(Failure(f"QUIC connection to {self.remote_address} lost: UDP socket closed ({exc})"))

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
            channel.on_data(event.data, event.end_stream)
        elif isinstance(event, events.StreamReset):
            channel = self._channels.get(event.stream_id)
            if channel is not None:
                channel.on_reset(event.error_code)
        elif isinstance(event, events.StopSendingReceived):
            channel = self._channels.get(event.stream_id)
            if channel is not None:
                channel.on_stop_sending(event.error_code)
        elif isinstance(event, events.HandshakeCompleted):
            self._on_handshake(event)
        elif isinstance(event, events.ConnectionTerminated):
            self.terminate(self._describe_termination(event))

    def _on_handshake(self, event: events.HandshakeCompleted) -> None:
        self._handshake_done = True
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        quic = self.quic
        if not quic.configuration.is_client:
            self._no_channel_since = self.loop.time()
        if self.on_handshake_done is not None:
            self.on_handshake_done(self)
        peer_cert = compat.peer_certificate(quic)
        if peer_cert is not None:
            self.peer_fingerprint = certificate_fingerprint(peer_cert)
        if self._pinned_fingerprint is None:
            return
        try:
            check_fingerprint(self.peer_fingerprint or "(no certificate)", self._pinned_fingerprint)
        except TransportError as exc:
            self.failure = Failure(f"QUIC connection to {self.remote_address}: {exc}")
            # bad_certificate TLS alert as a QUIC CRYPTO_ERROR (RFC 9001 section 4.8)
            quic.close(
                error_code=QuicErrorCode.CRYPTO_ERROR + 42,
                frame_type=QuicFrameType.CRYPTO,
                reason_phrase="certificate fingerprint mismatch",
            )

    def _accept_stream(self, stream_id: int) -> QuicChannel | None:
        if stream_id in self._ignored:
            return None
        quic = self.quic
        peer_bidi = stream_is_client_initiated(stream_id) != quic.configuration.is_client and not (
            stream_is_unidirectional(stream_id)
        )
        if not peer_bidi or self._on_channel is None:
            # Only clients open channels, only on bidirectional streams.
            self._ignored.add(stream_id)
            if not stream_is_unidirectional(stream_id):
                quic.reset_stream(stream_id, ErrorCode.REFUSED)
            quic.stop_stream(stream_id, ErrorCode.REFUSED)
            logger.debug("refused stream %d from %s", stream_id, self.remote_address)
            return None
        channel = QuicChannel(self, stream_id, self.max_message_size)
        self._channels[stream_id] = channel
        self._no_channel_since = None
        self._on_channel(channel)
        return channel

    # -- the Link its channels use ---------------------------------------------------------------------

    def attach(self, channel: QuicChannel) -> None:
        self._all_channels.add(channel)

    def stream(self, stream_id: int) -> QuicStream | None:
        return compat.get_stream(self.quic, stream_id)

    def open_stream(self, channel: QuicChannel, data: Buffer) -> tuple[int, QuicStream]:
        """A client channel's first write: its stream id is taken now, so channels opened but never
        used cost nothing on the wire and never leave a half-open stream at the peer."""
        quic = self.quic
        stream_id = quic.get_next_available_stream_id()
        self._channels[stream_id] = channel
        quic.send_stream_data(stream_id, b"")  # creates the stream; the data goes through compat
        stream = cast(QuicStream, compat.get_stream(quic, stream_id))
        compat.write(stream, data)
        return stream_id, stream

    def wrote(self, channel: QuicChannel, n: int) -> None:
        if not self.unflushed:
            # The turn's first write schedules the flush; transmit() zeroes unflushed, and a
            # scheduled flush is never cancelled, so later writes of the turn need not ask again.
            self.transmit_soon()
        self.unflushed += n
        self.send_buffered += n
        if self.send_buffered > self.stats.send_buffered_peak:
            self.stats.send_buffered_peak = self.send_buffered
        self._send_active.add(channel)

    def unread_changed(self, delta: int, flush: bool) -> None:
        if delta:
            self._recv_queued += delta
            if delta > 0 and self._recv_queued > self.stats.recv_queued_peak:
                self.stats.recv_queued_peak = self._recv_queued
        if self._grant_connection_credit() or flush:
            self.transmit_soon()

    def watch_acks(self, channel: QuicChannel) -> None:
        self._waiting.add(channel)

    def unwatch_acks(self, channel: QuicChannel) -> None:
        self._waiting.discard(channel)

    def end_stream(self, stream_id: int) -> None:
        self.quic.send_stream_data(stream_id, b"", end_stream=True)

    def reset_stream(self, stream_id: int, code: int) -> None:
        self.quic.reset_stream(stream_id, code)

    def stop_stream(self, stream_id: int, code: int) -> None:
        self.quic.stop_stream(stream_id, code)

    def channel_closed(self, channel: QuicChannel, was_open: bool) -> None:
        stream_id = channel.stream_id
        if stream_id is not None:
            self._zombies.add(stream_id)
        self._send_active.discard(channel)
        if self._grant_connection_credit():
            self.transmit_soon()
        if not was_open:
            return
        if stream_id is None:
            self._wake_stream_waiters()  # it held a slot of the peer's stream credit
        if self.quic.configuration.is_client or self._no_channel_since is not None:
            return
        if not any(not ch.closed for ch in self._channels.values()):  # bounded by MAX_STREAMS
            self._no_channel_since = self.loop.time()

    # -- stream credit (client) ----------------------------------------------------------------------

    def _streams_available(self) -> int:
        """Channels that may still be opened within the peer's MAX_STREAMS.

        A channel takes its stream id at its first write, so channels opened but not yet written
        to hold a slot too; ``_all_channels`` is weak, so a channel dropped unclosed frees its slot.
        """
        quic = self.quic
        opened = quic.get_next_available_stream_id() // 4
        pending = sum(1 for ch in self._all_channels if ch.stream_id is None and not ch.closed)
        return compat.bidi_streams_allowed(quic) - opened - pending

    async def reserve_stream(self, timeout: float) -> None:
        """Return once a new channel fits in the peer's stream credit; TransportError after ``timeout``."""
        if self._streams_available() > 0 and not self._stream_waiters:
            return
        waiter = self.loop.create_future()
        self._stream_waiters.append(waiter)
        reserved = False
        try:
            async with asyncio.timeout(timeout):
                while True:  # bounded by the timeout; each pass waits for credit or a closed channel
                    await waiter
                    if self._terminated:
                        raise (
                            self.failure or Failure(f"QUIC connection to {self.remote_address} is closed")
                        ).error()
                    if self._streams_available() > 0:
                        reserved = True
                        return
                    # Woken, but the slot went to another opener: wait again, first in line. The
                    # woken future goes, or the list would never be empty again (no fast path).
                    self._stream_waiters.remove(waiter)
                    waiter = self.loop.create_future()
                    self._stream_waiters.insert(0, waiter)
        except TimeoutError:
            quic = self.quic
            remaining = compat.bidi_streams_allowed(quic) - quic.get_next_available_stream_id() // 4
            raise TransportError(
                f"no channel could be opened on the QUIC connection to {self.remote_address} within "
                f"{timeout:g} s: all {remaining} remaining streams the server allows (its MAX_STREAMS "
                "limit, 256 concurrent by default) are in use. Close a session on this connection "
                "first, or open another connection with open_quic_connection()"
            ) from None
        finally:
            if waiter in self._stream_waiters:
                self._stream_waiters.remove(waiter)
            if not reserved:
                # Our turn passes on. Not after a reservation: the caller's channel, which takes
                # the slot, does not exist yet, so the next waiter would be offered the same slot.
                self._wake_stream_waiters()

    def _wake_stream_waiters(self) -> None:
        # Wake as many waiters, in order, as there are free slots (all of them once terminated).
        free = len(self._stream_waiters) if self._terminated else self._streams_available()
        for waiter in self._stream_waiters[: max(free, 0)]:
            if not waiter.done():
                waiter.set_result(None)

    # -- flow control --------------------------------------------------------------------------------

    def _grant_connection_credit(self) -> bool:
        limit = self._credit.grant(compat.connection_received(self.quic), self._recv_queued)
        if limit is None:
            return False
        compat.set_connection_credit(self.quic, limit)
        return True

    def _after_acks(self) -> None:
        if self._send_active:
            total = 0
            for channel in list(self._send_active):  # bounded by the number of channels
                n = channel.send_buffered
                if n == 0:
                    self._send_active.discard(channel)
                total += n
            self.send_buffered = total
        else:
            self.send_buffered = 0
        for channel in list(self._waiting):
            channel.on_acks()
        self._prune()

    def _prune(self) -> None:
        # Forget closed channels and refused streams once aioquic discarded the stream state:
        # no event can follow for them then.
        quic = self.quic
        if self._zombies:
            for sid in [s for s in self._zombies if not compat.has_stream(quic, s)]:
                self._zombies.discard(sid)
                self._channels.pop(sid, None)
        if self._ignored:
            self._ignored = {s for s in self._ignored if compat.has_stream(quic, s)}

    # -- liveness and termination --------------------------------------------------------------------

    def _effective_idle_timeout(self) -> float:
        # RFC 9000 section 10.1: the smaller of the two advertised values.
        remote = compat.remote_idle_timeout(self.quic)
        return min(self._idle_timeout, remote) if remote else self._idle_timeout

    def start_keepalive(self) -> None:
        # Wake at the earlier of: a quarter of the idle timeout (to PING an idle peer), or the
        # moment the peer would count as gone.
        idle_timeout = self._effective_idle_timeout()
        interval = max(idle_timeout / 4, 0.05)
        at = min(self.loop.time() + interval, self._last_rx + idle_timeout)
        self._keepalive = self.loop.call_at(at, self._on_keepalive)

    def _on_handshake_timeout(self) -> None:
        self._handshake_timer = None
        if self._terminated or self._handshake_done:
            return
        timeout = self.tuning.handshake_timeout
        self.failure = Failure(
            f"QUIC handshake with {self.remote_address} not completed within {timeout:g} s"
        )
        # A transport close (frame type given). aioquic forgets the connection after its closing
        # period (three PTOs, about a second) and then reports ConnectionTerminated, which ends
        # this protocol: until then it still counts as half-open, so max_half_open bounds the
        # state held, closing connections included.
        self.quic.close(
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
        now = self.loop.time()
        since = self._no_channel_since
        if since is not None and now - since >= idle_timeout:
            # Server: a connection that carries no channel costs state and keepalives for
            # nothing; a client keeps it only as long as it would keep an idle one.
            reason = f"no channel open for {idle_timeout:g} s"
            self.shut(
                Failure(
                    f"QUIC connection to {self.remote_address} closed: {reason}",
                    code=ErrorCode.NO_ERROR,
                    reason=reason,
                    clean=True,
                ),
                ErrorCode.NO_ERROR,
                reason,
            )
            return
        idle = now - self._last_rx
        if idle >= idle_timeout:
            # Silent close, as for QUIC's own idle timeout: the peer is presumed gone. aioquic's
            # idle timer then discards the connection state.
            self.terminate(
                Failure(
                    f"QUIC peer {self.remote_address} is unreachable: no packet for {idle:.1f} s "
                    f"(idle timeout {idle_timeout:g} s)"
                )
            )
            return
        if idle >= idle_timeout / 4:
            self.quic.send_ping(0)
            self.transmit()
        self.start_keepalive()

    def _describe_termination(self, event: events.ConnectionTerminated) -> Failure:
        if self.failure is not None:
            return self.failure
        code, reason = event.error_code, event.reason_phrase
        peer = self.remote_address
        if event.frame_type is None:  # application close
            clean = code in (ErrorCode.NO_ERROR, ErrorCode.GOING_AWAY)
            what = "closed by the peer" if clean else "aborted by the peer"
            return Failure(
                f"QUIC connection to {peer} {what} (code {ErrorCode.describe(code)}"
                + (f": {reason})" if reason else ")"),
                code=code,
                reason=reason,
                clean=clean,
            )
        if reason == "Idle timeout":
            return Failure(
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
        return Failure(
            f"QUIC connection to {peer} failed: transport error {code:#x}"
            + (f" ({reason})" if reason else "")
            + hint,
            code=code,
            reason=reason,
        )

    def shut(self, failure: Failure, code: int, reason: str) -> None:
        """Send CONNECTION_CLOSE (``code``, ``reason``) now, without waiting, and end with ``failure``."""
        self.failure = failure
        self.close(error_code=code, reason_phrase=reason)
        self.terminate(failure)

    def terminate(self, failure: Failure) -> None:
        """The connection is over: every channel fails (after delivering what it already has)."""
        if self._terminated:
            return
        self._terminated = True
        if self.failure is None:
            self.failure = failure
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
            channel.fail(failure, failure)
        self._waiting.clear()
        self.mark_closed()
        self.fail_connect(failure.message)  # nobody may be waiting any more (connect timed out)
        if self.on_terminated is not None:
            self.on_terminated(self)

    async def close_connection(self, code: int, reason: str, *, graceful: bool) -> None:
        """Close all channels (gracefully: FIN and wait for ACKs, bounded) then the connection."""
        if graceful and not self._terminated:
            channels = [ch for ch in self._channels.values() if not ch.closing]
            if channels:
                await asyncio.gather(*(ch.close() for ch in channels), return_exceptions=True)
        if not self._terminated:
            clean = code in (ErrorCode.NO_ERROR, ErrorCode.GOING_AWAY)
            self.failure = Failure(
                f"QUIC connection to {self.remote_address} was closed locally"
                + (f" ({reason})" if reason else ""),
                code=code,
                reason=reason,
                clean=clean,
            )
            self.close(error_code=code, reason_phrase=reason)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.close_timeout):
                    await self.wait_closed()
            self.terminate(self.failure)
