"""One m2mwire channel on one bidirectional QUIC stream (:class:`QuicChannel`), and its counters.

The channel frames messages onto its stream (:mod:`m2mwire.transport.framing`), paces its writes
with the connection's :class:`~.flow.SendBudget`, and grants the peer receive credit as messages
are consumed (:class:`~.flow.ReceiveCredit`). It reaches its connection only through :class:`Link`
and aioquic only through :mod:`.compat`.

Messages are consumed either by ``recv()`` or, once ``start_push()`` was called, by a callback run
as the bytes arrive (no reader task, no loop hop): the session's path. ``pause_reading()`` stops
the callbacks and, since unread bytes hold credit back, the peer too once the window is used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol, cast

from m2mwire.errors import EncodeError, TransportError
from m2mwire.schemas.codes import CloseCode
from m2mwire.transport.base import Buffer, OnMessage, OutgoingMessage
from m2mwire.transport.framing import (
    HEADER_SIZE,
    KIND_BINARY,
    KIND_TEXT,
    MAX_FRAME_LENGTH,
    CloseFrame,
    Deframer,
    ErrorCode,
    FramingError,
    encode_close,
    encode_header,
)
from m2mwire.transport.quic import compat
from m2mwire.transport.quic.failure import RESET_HINTS, Failure
from m2mwire.transport.quic.flow import ReceiveCredit, SendBudget
from m2mwire.transport.quic.sendbuffer import LARGE_WRITE
from m2mwire.transport.quic.tuning import QuicTuning

if TYPE_CHECKING:
    from aioquic.quic.stream import QuicStream

__all__ = ["ChannelStats", "Link", "QuicChannel"]

OnLost = Callable[[TransportError], None]

# Messages up to this size are joined with their header into one write (one copy is cheaper
# than a second write); larger ones are written piecewise, never concatenated.
_JOIN_LIMIT: Final = 64 * 1024


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


class Link(Protocol):
    """What a channel uses of its QUIC connection (implemented by ``connection.Connection``)."""

    tuning: QuicTuning
    budget: SendBudget
    remote_address: str
    close_timeout: float
    failure: Failure | None
    send_buffered: int  # bytes of all channels handed to QUIC, not yet acknowledged
    unflushed: int  # bytes written since the last transmit

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def terminated(self) -> bool: ...

    def attach(self, channel: QuicChannel) -> None: ...

    def stream(self, stream_id: int) -> QuicStream | None: ...

    def open_stream(self, channel: QuicChannel, data: Buffer) -> tuple[int, QuicStream]: ...

    def wrote(self, channel: QuicChannel, n: int) -> None: ...

    def unread_changed(self, delta: int, flush: bool) -> None: ...

    def watch_acks(self, channel: QuicChannel) -> None: ...

    def unwatch_acks(self, channel: QuicChannel) -> None: ...

    def end_stream(self, stream_id: int) -> None: ...

    def reset_stream(self, stream_id: int, code: int) -> None: ...

    def stop_stream(self, stream_id: int, code: int) -> None: ...

    def transmit_soon(self) -> None: ...

    def channel_closed(self, channel: QuicChannel, was_open: bool) -> None: ...


class OwnedConnection(Protocol):
    """A connection a channel closes with itself (a ``QuicClientConnection``)."""

    async def close(self) -> None: ...

    def abort(self, code: int = ...) -> None: ...


def _byte_view(buffer: Buffer) -> memoryview:
    view = memoryview(buffer)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")  # raises TypeError for non-contiguous buffers
    return view


def _frame(message: OutgoingMessage, text: bool = False) -> tuple[int, list[Buffer]]:
    """One message as the buffers of its frame, and their total size."""
    if type(message) is bytes:  # the common case (the session's text and binary), without a view
        length = len(message)
        kind = KIND_TEXT if text else KIND_BINARY
        if length <= _JOIN_LIMIT:
            return HEADER_SIZE + length, [encode_header(kind, length) + message]
        return HEADER_SIZE + length, [encode_header(kind, length), message]
    if type(message) is not tuple:  # a tuple: a binary message as parts (the session's AVP frames)
        if isinstance(message, str):
            try:
                body = message.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise EncodeError(
                    f"text message is not encodable as UTF-8 ({exc.reason} at index {exc.start}); "
                    "text channels carry JSON, which must be valid Unicode"
                ) from None
            length = len(body)
            if length <= _JOIN_LIMIT:
                return HEADER_SIZE + length, [encode_header(KIND_TEXT, length) + body]
            return HEADER_SIZE + length, [encode_header(KIND_TEXT, length), body]
        if isinstance(message, bytes | bytearray | memoryview):
            message = (message,)
    length = 0
    for part in message:  # bounded by the parts
        # A view's size in bytes is nbytes; bytes and bytearray (the other Buffers) count bytes.
        length += part.nbytes if type(part) is memoryview else len(part)
    header = encode_header(KIND_TEXT if text else KIND_BINARY, length)
    if length <= _JOIN_LIMIT:
        # bytes.join copies any contiguous buffer whole, whatever its item format: no views needed.
        return HEADER_SIZE + length, [b"".join((header, *message))]
    # Written piecewise, never concatenated whole: each large part as a byte view, and the small
    # ones between them (the header, an AVP frame's head) joined, since every write costs aioquic
    # bookkeeping of its own (~2 us) and the stream's send buffer copies a write this small anyway.
    pieces: list[Buffer] = []
    small: list[Buffer] = [header]
    for part in message:  # bounded by the parts
        if (part.nbytes if type(part) is memoryview else len(part)) < LARGE_WRITE:
            small.append(part)
            continue
        if small:
            pieces.append(small[0] if len(small) == 1 else b"".join(small))
            small = []
        pieces.append(_byte_view(part))
    if small:
        pieces.append(small[0] if len(small) == 1 else b"".join(small))
    return HEADER_SIZE + length, pieces


class QuicChannel:
    """One m2mwire channel on one bidirectional QUIC stream.

    Implements ``Channel``, ``PushChannel`` and ``DirectSendChannel`` of
    :mod:`m2mwire.transport.base`. Not created directly: use
    :meth:`QuicClientConnection.open_channel`, :func:`open_quic_channel`, or receive one in a
    :func:`serve_quic` handler. The ``on_*`` and :meth:`fail` methods are the transport's own
    (called by the connection), not for applications.
    """

    def __init__(self, link: Link, stream_id: int | None, max_message_size: int) -> None:
        self._link = link
        self._budget = link.budget
        self._flush_threshold = link.tuning.flush_threshold
        self._stream_id = stream_id
        self._stream: QuicStream | None = link.stream(stream_id) if stream_id is not None else None
        self._deframer = Deframer(max_message_size)
        self._credit = ReceiveCredit(link.tuning.stream_window)
        # Received bytes stay raw in the deframer until they are consumed, so a limit set with
        # set_max_message_size() after reading message N applies to message N+1.
        self._held = 0  # unread bytes as last accounted (see _account)
        self._delivered = 0  # stream bytes received in order
        self._recv_waiter: asyncio.Future[None] | None = None
        self._recv_failure: Failure | None = None
        self._send_failure: Failure | None = None
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
        self._owned_connection: OwnedConnection | None = None
        # Push mode (start_push): the session's callbacks, and its backpressure gate.
        self._on_message: OnMessage | None = None
        self._on_lost: OnLost | None = None
        self._paused = False
        self._pumping = False  # _pump is running (a callback may pause or resume reading)
        self._loss_reported = False
        self.stats = ChannelStats()
        link.attach(self)

    # -- Channel protocol --------------------------------------------------------------------------

    @property
    def max_message_size(self) -> int:
        return self._deframer.max_message_size

    def set_max_message_size(self, size: int) -> None:
        # A frame's length field holds at most MAX_FRAME_LENGTH (4 GiB - 1): a larger limit (a
        # session allowing more) admits every frame, where the Deframer raised ValueError.
        self._deframer.max_message_size = min(size, MAX_FRAME_LENGTH)

    @property
    def remote_address(self) -> str:
        return self._link.remote_address

    @property
    def stream_id(self) -> int | None:
        """The QUIC stream id; None for a client channel that has not sent anything yet."""
        return self._stream_id

    @property
    def closed(self) -> bool:
        """True once the channel is closed or aborted locally (its input is discarded)."""
        return self._closed

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def send_buffered(self) -> int:
        """Bytes handed to QUIC and not yet acknowledged by the peer."""
        stream = self._stream
        if stream is None or self._send_failure is not None:
            return 0
        return compat.unacked(stream)

    @property
    def recv_queued(self) -> int:
        """Bytes received and not yet consumed (a message being received excluded, unless paused)."""
        return self._held

    async def send(self, message: OutgoingMessage, text: bool = False) -> None:
        """Send one message; waits while the stream's unacknowledged bytes are over the watermark.

        Cancellation-safe: a message is written whole or, when cancelled after part of it was
        written, the stream is reset (nothing could follow a partial frame)."""
        failure = self._send_failure
        if failure is not None:
            raise failure.error()
        n, parts = _frame(message, text)
        if self._send_users == 0 and self._fits(n):
            # Fast path: nobody queued before us and the watermarks leave room for the whole frame.
            for part in parts:
                self._write(part)
            self.stats.messages_sent += 1
            if self._link.unflushed >= self._flush_threshold:
                await asyncio.sleep(0)  # let the scheduled transmit run
            return
        self._send_users += 1
        try:
            async with self._send_lock:
                await self._write_frame(parts)
            self.stats.messages_sent += 1
        finally:
            self._send_users -= 1

    def send_now(self, message: OutgoingMessage, text: bool = False) -> bool:
        """Write the whole message now and return True, or write nothing and return False.

        False when ``send()`` would wait (a send() in progress, the watermarks, enough written this
        event-loop turn that the transmit should run first) or raise (closed, not encodable):
        the caller then uses ``send()``."""
        if (
            self._send_failure is not None
            or self._send_users
            or self._link.unflushed >= self._flush_threshold
        ):
            return False
        try:
            n, parts = _frame(message, text)
        except EncodeError:
            return False  # send() raises it
        if not self._fits(n):
            return False
        for part in parts:
            self._write(part)
        self.stats.messages_sent += 1
        return True

    async def recv(self) -> str | bytes:
        """The next message (text decoded to ``str``: for a channel used without a session, which
        takes messages with start_push, as bytes and a text flag); once none is left, raises
        TransportError saying how the channel ended."""
        if self._on_message is not None:
            raise RuntimeError("recv() after start_push(): messages go to the push callback")
        deframer = self._deframer
        while True:  # bounded: each pass returns, raises, or waits for an event that changes state
            if self._closed:
                raise cast(Failure, self._recv_failure).error()
            try:
                message = deframer.next_message()
            except FramingError as exc:
                self._framing_failed(exc)
                raise cast(Failure, self._recv_failure).error() from None
            if message is not None:
                if isinstance(message, CloseFrame):  # narrows without typing.cast's call per message
                    self._peer_close = message  # the FIN that must follow ends the channel
                    continue
                self.stats.messages_received += 1
                self._account()
                return message
            self._account()  # a message may be in progress now: its bytes free credit
            if deframer.finished and self._recv_failure is None:
                self._recv_failure = self._peer_closed()
            if self._recv_failure is not None:
                raise self._recv_failure.error()
            if self._link.terminated:
                self._on_connection_over()
                continue
            if self._recv_waiter is not None:
                raise RuntimeError("recv() is already being awaited on this channel by another task")
            self._recv_waiter = self._link.loop.create_future()
            try:
                await self._recv_waiter
            finally:
                self._recv_waiter = None

    async def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> None:
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
        failure = Failure(f"channel to {self.remote_address} was aborted locally (code {code})", code=code)
        self.fail(failure, failure, wire_code=code)
        if not self._closing:
            self._closing = True
            self._close_done.set()
        self._finish_close()
        owned, self._owned_connection = self._owned_connection, None
        if owned is not None:
            owned.abort(code)

    def own(self, connection: OwnedConnection) -> None:
        """Close (or abort) ``connection`` with this channel (see :func:`open_quic_channel`)."""
        self._owned_connection = connection

    # -- PushChannel protocol ----------------------------------------------------------------------

    def start_push(self, on_message: OnMessage, on_lost: OnLost) -> None:
        """From now on hand every message to ``on_message`` as it arrives (those already received
        first, in order), and the channel's end to ``on_lost``, once, after the messages before it
        (an error that breaks the channel while reading is paused is reported at once)."""
        self._on_message = on_message
        self._on_lost = on_lost
        self._loss_reported = False
        self._wake_reader()
        if self._paused:
            self._report_loss()
        else:
            self._pump()

    def pause_reading(self) -> None:
        """Stop handing messages over. Unread bytes then hold the peer's credit back, so what it
        can make us buffer stays within the stream window (plus what a message in progress
        already had credited)."""
        self._paused = True

    def resume_reading(self) -> None:
        self._paused = False
        self._pump()

    # -- sending -----------------------------------------------------------------------------------

    def _fits(self, n: int) -> bool:
        # Callers checked _send_failure: the stream's unacknowledged bytes count (see send_buffered).
        stream = self._stream
        unacked = 0 if stream is None else compat.unacked(stream)
        return self._budget.fits(n, unacked, self._link.send_buffered)

    def _write(self, data: Buffer) -> None:
        """Hand bytes to aioquic (which copies them into its send buffer) and schedule a flush."""
        stream = self._stream
        if stream is None:
            self._stream_id, stream = self._link.open_stream(self, data)
            self._stream = stream
        else:
            # The stream cannot be discarded here: that needs our FIN or reset, which set
            # _send_failure first.
            compat.write(stream, data)
        n = len(data)  # data is bytes or a 1-D byte memoryview
        stats = self.stats
        stats.bytes_sent += n
        buffered = compat.unacked(stream)
        if buffered > stats.send_buffered_peak:
            stats.send_buffered_peak = buffered
        self._link.wrote(self, n)

    async def _write_frame(self, parts: Sequence[Buffer]) -> None:
        written = 0
        link = self._link
        try:
            for part in parts:
                view = memoryview(part)
                offset = 0
                while offset < view.nbytes:  # bounded: each pass writes >= 1 byte or waits for ACKs
                    if self._send_failure is not None:
                        raise self._send_failure.error()
                    room = self._budget.room(self.send_buffered, link.send_buffered)
                    if room <= 0:
                        self.stats.send_waits += 1
                        await self._wait_writable()
                        continue
                    n = min(room, view.nbytes - offset)
                    self._write(view[offset : offset + n] if n < view.nbytes else part)
                    offset += n
                    written += n
                    if link.unflushed >= self._flush_threshold:
                        await asyncio.sleep(0)  # let the scheduled transmit run
        except BaseException:
            if written and self._send_failure is None:
                # A partial frame is on the stream; nothing can follow it, so the channel is over.
                failure = Failure(
                    f"channel to {self.remote_address} was reset: a send() was cancelled mid-message",
                    code=ErrorCode.CANCELLED,
                )
                self.fail(failure, failure, wire_code=ErrorCode.CANCELLED)
            raise

    async def _wait_writable(self) -> None:
        link = self._link
        self._send_waiter = link.loop.create_future()
        link.watch_acks(self)
        try:
            await self._send_waiter
        finally:
            self._send_waiter = None
            link.unwatch_acks(self)

    def on_acks(self) -> None:
        """The connection processed ACKs (called only while this channel waits for them)."""
        waiter = self._send_waiter
        if (
            waiter is not None
            and not waiter.done()
            and self._budget.writable(self.send_buffered, self._link.send_buffered)
        ):
            waiter.set_result(None)
        drain = self._drain_waiter
        if drain is not None and not drain.done() and self._drained():
            drain.set_result(None)

    # -- receiving ---------------------------------------------------------------------------------

    def on_data(self, data: bytes, end_stream: bool) -> None:
        """Stream bytes arrived, in order (``end_stream``: the peer's FIN)."""
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
        # No wake-up or delivery attempt per packet while a large message is still incomplete.
        if self._on_message is not None:
            if deframer.ready and not self._paused:
                self._pump()
                return
        elif deframer.ready:
            self._wake_reader()
        self._account()

    def _pump(self) -> None:
        """Push mode: hand every complete message to the callback, in order, until paused."""
        if self._pumping:
            return  # a callback resumed reading: the loop below goes on
        self._pumping = True
        deframer = self._deframer
        stats = self.stats
        try:
            while not self._paused and not self._closed:  # bounded by the bytes buffered
                on_message = self._on_message
                if on_message is None:
                    break
                try:
                    frame = deframer.next_frame()  # text as its UTF-8 bytes: the session validates
                except FramingError as exc:
                    self._framing_failed(exc)
                    break
                if frame is None:
                    if deframer.finished and self._recv_failure is None:
                        self._recv_failure = self._peer_closed()
                    break
                if isinstance(frame, CloseFrame):  # narrows without typing.cast's call per message
                    self._peer_close = frame  # the FIN that must follow ends the channel
                    continue
                stats.messages_received += 1
                on_message(*frame)
        finally:
            self._pumping = False
        self._account()
        self._report_loss()

    def _report_loss(self) -> None:
        """Push mode: tell the session, once, that the channel is over; an orderly end only after
        the messages before it (so not while paused), a broken channel at once."""
        failure = self._recv_failure
        if failure is None or self._loss_reported or self._on_message is None:
            return
        if self._paused and failure.clean and not self._closed:
            return
        self._loss_reported = True
        if self._paused and not self._closed:
            # Broken while paused: what is buffered will never be read (a resumable session gets
            # it again: it was never acknowledged).
            self._deframer.discard()
            self._account()
        # Called back on the next loop turn, never from inside the session's own call that ended
        # the channel (close, abort).
        self._link.loop.call_soon(self._call_on_lost, failure)

    def _call_on_lost(self, failure: Failure) -> None:
        if self._on_lost is not None:
            self._on_lost(failure.error())

    def _account(self) -> None:
        """Track unread bytes (per channel and connection) and grant credit for consumed ones.

        The bytes of a message being received count as consumed, so that messages larger than the
        window still flow; not while reading is paused, so that the peer then stops within it."""
        deframer = self._deframer
        held = deframer.buffered if self._paused else deframer.held
        delta = held - self._held
        if delta:
            self._held = held
            if delta > 0 and held > self.stats.recv_queued_peak:
                self.stats.recv_queued_peak = held
        moved = False
        stream = self._stream
        if stream is not None and not self._closed and not compat.receiver_finished(stream):
            limit = self._credit.grant(self._delivered, held)
            if limit is not None:
                compat.set_stream_credit(stream, limit)
                moved = True
        self._link.unread_changed(delta, moved)

    def _framing_failed(self, exc: FramingError) -> None:
        failure = Failure(f"channel from {self.remote_address} failed: {exc}", code=exc.code)
        self.fail(failure, failure, wire_code=exc.code)
        self._account()

    def _peer_closed(self) -> Failure:
        close = self._peer_close
        if close is None:
            return Failure(f"channel closed by the peer {self.remote_address} (stream finished)", clean=True)
        detail = f"code {close.code}" + (f": {close.reason}" if close.reason else "")
        return Failure(
            f"channel closed by the peer {self.remote_address} ({detail})",
            code=close.code,
            reason=close.reason,
            clean=True,
        )

    def _wake_reader(self) -> None:
        waiter = self._recv_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_reset(self, code: int) -> None:
        """The peer reset its sending side (RESET_STREAM)."""
        failure = Failure(
            f"channel reset by the peer {self.remote_address} (code {ErrorCode.describe(code)})"
            + RESET_HINTS.get(code, ""),
            code=code,
        )
        self.fail(failure, failure, wire_code=code)

    def on_stop_sending(self, code: int) -> None:
        """The peer no longer reads (STOP_SENDING); aioquic already reset our sending side."""
        self._sender_reset = True
        if self._send_failure is None:
            clean = code == ErrorCode.NO_ERROR
            what = (
                "closed the channel"
                if clean
                else f"stopped reading the channel (code {ErrorCode.describe(code)})"
                + RESET_HINTS.get(code, "")
            )
            self._send_failure = Failure(f"peer {self.remote_address} {what}", code=code, clean=clean)
        self._wake_writers()

    def fail(self, send: Failure | None, recv: Failure | None, *, wire_code: int | None = None) -> None:
        """End one or both directions; with ``wire_code`` also reset/stop the stream on the wire."""
        if send is not None and self._send_failure is None:
            self._send_failure = send
        if recv is not None and self._recv_failure is None:
            self._recv_failure = recv
        if wire_code is not None:
            self._reset_stream(wire_code)
        self._wake_writers()
        self._wake_reader()
        if recv is not None:
            # Not paused, every complete message was already handed over: the end follows them.
            self._report_loss()

    def _reset_stream(self, code: int) -> None:
        stream = self._stream
        link = self._link
        if stream is None or link.terminated:
            return
        sid = cast(int, self._stream_id)
        if not compat.sender_finished(stream):
            link.reset_stream(sid, code)
            self._sender_reset = True
        if not compat.receiver_finished(stream) and not self._receiver_stopped:
            link.stop_stream(sid, code)
            self._receiver_stopped = True
        link.transmit_soon()

    def _wake_writers(self) -> None:
        for waiter in (self._send_waiter, self._drain_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def _on_connection_over(self) -> None:
        failure = self._link.failure or Failure(f"QUIC connection to {self.remote_address} is closed")
        self.fail(failure, failure)

    # -- closing -----------------------------------------------------------------------------------

    async def _close(self, code: int, reason: str) -> None:
        link = self._link
        local = Failure(f"channel to {self.remote_address} is closed", code=code, reason=reason, clean=True)
        try:
            if self._send_failure is None and self._stream_id is not None:
                async with asyncio.timeout(link.close_timeout):
                    async with self._send_lock:
                        if self._send_failure is None:
                            self._write(encode_close(code, reason))
                            link.end_stream(self._stream_id)
                            self._send_failure = local
                            await self._wait_drained()
        except TimeoutError:
            failure = Failure(
                f"closing the channel to {self.remote_address} timed out after {link.close_timeout} s "
                "(the peer did not acknowledge the data); the stream was reset",
                code=ErrorCode.CANCELLED,
            )
            self.fail(failure, None, wire_code=ErrorCode.CANCELLED)
        finally:
            self.fail(local, local)
            stream = self._stream
            if (
                stream is not None
                and not compat.receiver_finished(stream)
                and not self._receiver_stopped
                and not link.terminated
            ):
                # We will not read any more: ask the peer to stop (it sees an orderly close).
                link.stop_stream(cast(int, self._stream_id), ErrorCode.NO_ERROR)
                self._receiver_stopped = True
                link.transmit_soon()
            self._finish_close()

    def _drained(self) -> bool:
        stream = self._stream
        return stream is None or compat.sender_finished(stream) or self._sender_reset or self._link.terminated

    async def _wait_drained(self) -> None:
        link = self._link
        while not self._drained():  # bounded by close_timeout
            self._drain_waiter = link.loop.create_future()
            link.watch_acks(self)
            try:
                await self._drain_waiter
            finally:
                self._drain_waiter = None
                link.unwatch_acks(self)

    def _finish_close(self) -> None:
        was_open, self._closed = not self._closed, True
        self._deframer.discard()
        self._account()
        self._link.channel_closed(self, was_open)
        self._report_loss()
