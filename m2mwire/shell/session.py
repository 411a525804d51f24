"""``Session``: the asyncio shell around the sans-I/O session core (``SessionProtocol``).

The shell only moves messages between a transport channel and the protocol, runs the timers the
protocol asks for, and hands received messages to the application through a bounded queue (when
the application stops reading, we stop reading the channel, and the transport's flow control
pushes back on the peer). A server drives the sessions it hosts through :class:`ServerSide`, the
interface of :mod:`m2mwire.shell.hosting`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import random
import sys
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from time import perf_counter, thread_time
from typing import TYPE_CHECKING, Any

from m2mwire import tracing
from m2mwire.admission import Admission, Hello, split_address
from m2mwire.codecs import Algorithm, resolve_algorithm
from m2mwire.codecs.buffers import is_ndarray
from m2mwire.correlation import Correlator
from m2mwire.errors import (
    EncodeError,
    M2MError,
    ResumeImpossible,
    SessionClosed,
    SessionTimeout,
    TransportError,
)
from m2mwire.reconnect import Reconnect
from m2mwire.schemas.codes import CloseCode, SessionCode
from m2mwire.session.budget import FREE_BASE, FREE_PER_BYTE, MAX_PAUSE, REFILL, DecodeBudget
from m2mwire.session.core import SessionProtocol
from m2mwire.session.events import (
    Closed,
    Detached,
    Established,
    HelloReceived,
    Resumed,
    ResumeRequested,
    SessionInfo,
    Stats,
    closed_error,
)
from m2mwire.session.outputs import CloseTransport, SendMessage
from m2mwire.session.payload import (
    Message,
    SentInfo,
    avp_extra,
    avp_metadata,
    queued_cost,
)
from m2mwire.session.states import State
from m2mwire.shell.sessionlog import log, log_closed, log_opened
from m2mwire.transport.base import Buffer, Channel, RoutedChannel

if TYPE_CHECKING:
    import numpy as np  # numpy, protobuf: imported when a tensor or frame is sent, not for text

    from m2mwire.codecs.avp import AVPMessage, AVPMetadata

__all__ = ["HandedOver", "ServerSide", "Session"]

_CLOSED = State.CLOSED  # Enum member reads cost ~0.12 us on Python 3.11; _feed runs per message
_CLOSE_RECEIVED = State.CLOSE_RECEIVED
_ALGORITHMS: dict[str, Algorithm] = {a.value: a for a in Algorithm}
_MAX_OUTPUT_BACKLOG = 64  # queued control messages (PONGs, ...) before we stop reading the peer
# send()s written at once after which send() gives the event loop a turn: one loop turn (~10 us)
# per 1,024 messages costs under 0.5 % of the cheapest send, and the peer's ACKs then arrive within
# about ACK_EVERY messages of their due time.
_YIELD_EVERY = 1024
# recv() gives the event loop a turn once it took this much (inbox cost) without waiting (see recv).
_TAKEN_PER_TURN = 4 * 1024 * 1024
# ... and once it has returned messages without waiting for this long: what the application does
# with each is its own, but a handler spending 1.4 ms on each 53-byte KV-cache frame (a loop over
# 4,096 layers) held the loop for 0.36 s per 4 MiB (stop 33's attack run).
_TURN_SECONDS = 0.01
# Received messages are processed as the transport delivers them, a whole socket read at a time;
# past this much processing time the rest wait for the event loop's next turn (held, reading
# paused): one 256 KiB read of ~4,300 small Brotli messages held the loop ~130 ms (stop 33's
# third attack run).
_SLICE_SECONDS = 0.005


class HandedOver(M2MError):
    """Server: this connection's resuming HELLO moved it to the session it resumes."""


def _no_encoder(_content: object, _metadata: object) -> Sequence[Buffer]:
    raise AssertionError("Session._avp_encode is bound with the session's AVP metadata")


def _ignore(*_args: object) -> None:
    """Callbacks of a channel the session left: it is aborted, what it still says is moot."""


@dataclasses.dataclass(frozen=True, slots=True)
class _LastResume:
    """A client's last successful resume: the backoff it was at, when it resumed,
    ResumeState.progress just after, and the deadline its reconnect loop had (max_elapsed after
    the loss that began a run of connections through which nothing got), or None when
    something got through since the resume before (the next loss then starts afresh)."""

    delays: Iterator[float]
    resumed_at: float
    progress: int
    give_up_at: float | None


class Session:
    """One established session: send and receive DATA, then close.

    Obtain one from :func:`connect` (client) or as the argument of a :func:`serve` handler.
    One receive path: the channel pushes each message (``start_push``) through the protocol into
    the inbox; a full inbox pauses the channel's reading. One send path: ``channel.send_now()``,
    and only when the channel has no room, ``channel.send()`` in a task of its own (watched by
    write_timeout). ``send()`` writes its own message in the caller's task (under a write lock, so
    output stays in protocol order); what receiving or a timer makes the protocol say (PONG, CLOSE
    acknowledgements) is written by a writer task. Receiving never waits for a write, so a
    full-duplex exchange cannot deadlock on control messages.
    """

    def __init__(self, channel: Channel, protocol: SessionProtocol) -> None:
        self._channel = channel
        self._protocol = protocol
        self._loop = asyncio.get_running_loop()
        self._max_queue = max(1, protocol.config.max_queue)
        self._max_queue_bytes = max(1, protocol.config.max_queue_bytes)
        self._inbox: deque[Message] = deque()
        self._inbox_bytes = 0  # queued_cost() of the messages in the inbox
        # recv() callers waiting for the inbox, one future each (an asyncio.Event costs several
        # Python calls more per message); woken by _wake_receivers().
        self._receivers: list[asyncio.Future[None]] = []
        self._established: asyncio.Future[SessionInfo] = self._loop.create_future()
        self._closed = asyncio.Event()
        self._transport_closed = False
        self._tasks: list[asyncio.Task[None]] = []
        self._write_lock = asyncio.Lock()
        self._writing = False  # _write_lock is held (a plain flag: Lock.locked() is a Python call)
        self._writer_wakeup = asyncio.Event()
        self._timer_handle: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._avp_metadata: AVPMetadata | None = None
        self._avp_encode: Callable[[np.ndarray[Any, Any], AVPMetadata], Sequence[Buffer]] = _no_encoder
        self._paused = False  # we stopped reading on purpose (see _update_reading)
        # What the channel delivered after we paused it (the rest of the transport read it was
        # in), as it came: decoded only once reading resumes. Decoding them there and then put
        # whatever they decompress to in the inbox: one read of 246-byte zstd messages of 16 MiB
        # each held ~3 GB of a server (stop 31's attack run). Held, they cost their wire bytes:
        # at most one transport read. A loss of the channel drops them (see _on_transport_closed).
        self._held: deque[tuple[bytes, bool]] = deque()
        # The time the peer makes us spend processing its messages beyond the free allowance
        # (session/budget.py; a server's sessions from one address share one): reading stops
        # while _throttle waits for refill.
        self._budget = DecodeBudget(self._loop.time())
        self._throttle: asyncio.TimerHandle | None = None
        self._waiting_on: tuple[DecodeBudget, ...] = ()  # the buckets _throttle counts on
        self._slice = 0.0  # processing time since the last _SLICE_SECONDS turn (see _process)
        # What times each received message: the wall clock (40 ns a reading), until the session
        # is first charged; from then on the thread's CPU clock (220 ns), which does not count
        # the time the process was descheduled: with the wall clock alone, an honest 1 KB stream
        # on a machine short of CPU was charged 0.137 s/s for preemption (stop 33's third
        # attack run). One charge at wall time at most, then only what decoding really took.
        self._clock: Callable[[], float] = perf_counter
        # What recv() took (inbox cost) since it last waited: it gives the loop a turn past
        # _TAKEN_PER_TURN, or once _TURN_SECONDS passed (_turn_ends).
        self._taken_run = 0
        self._turn_ends = 0.0
        self._unyielded = 0  # send()s written at once since send() last gave the loop a turn
        self._closing = False
        self._correlator = Correlator()  # our requests waiting for answers
        self._admission: Admission | None = None  # server: decides HelloReceived events
        self._admitted_host: str | None = None  # the host whose admission slot we hold
        self._opened_at: float | None = None  # loop time of the handshake's end
        self._span: Any = None  # the session's OpenTelemetry span (m2mwire.tracing), if enabled
        self._trace_parent: tuple[str | None, str | None] = (None, None)  # client: its HELLO's context
        # A channel write that had to wait, running in a task of its own (see _start_write), and the
        # write_timeout timer watching it.
        self._inflight: asyncio.Task[None] | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        # Resume (docs/PROTOCOL.md "Resume"): a client reconnects with _reconnect, opening channels
        # with _reopen; a server's fresh connection asks _resumer to move it to the session it
        # resumes. send() waits in _space_waiters while the retention buffer is full.
        self._reconnect: Reconnect | None = None
        self._reopen: Callable[[str | None], Awaitable[Channel]] | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._resumer: Callable[[ResumeRequested], None] | None = None
        self._handed_over = False
        self._handed_to: Session | None = None
        self._space_waiters: list[asyncio.Future[None]] = []
        self._attached = asyncio.Event()  # set while the session has a live connection
        self._attached.set()
        self._outcome: asyncio.Future[str] | None = None  # client: how a resume attempt ended
        # Client: the last reconnect loop that resumed (see _reconnect_loop). A connection lost
        # again within max_delay of its resume goes on with that backoff, and with its deadline
        # too if nothing got through it; one that lived longer starts afresh.
        self._last_resume: _LastResume | None = None
        # Done when the session stops using its current channel: a server's fresh connection
        # handed over to this session waits for it (its transport closes when it returns).
        self._channel_done: asyncio.Future[None] = self._loop.create_future()

    # -- public API ------------------------------------------------------------------------------

    @property
    def info(self) -> SessionInfo:
        """Session id, negotiated algorithms, encoding, mode (raises before the handshake ends)."""
        if self._protocol.info is None:
            raise SessionClosed("the session is not established", code=self._protocol.state.value)
        return self._protocol.info

    @property
    def stats(self) -> Stats:
        return self._protocol.stats

    @property
    def state(self) -> State:
        return self._protocol.state

    @property
    def close_event(self) -> Closed | None:
        """How the session ended, once it has."""
        return self._protocol.closed

    @property
    def remote_address(self) -> str:
        return self._channel.remote_address

    async def send(
        self,
        content: str
        | dict[str, Any]
        | list[Any]
        | np.ndarray[Any, Any]
        | AVPMessage
        | bytes
        | bytearray
        | memoryview,
        *,
        algorithm: str | Algorithm | None = None,
        binary: bool = False,
        extra: Mapping[str, str] | None = None,
    ) -> SentInfo:
        """Send one DATA message and wait until the transport has taken it (backpressure).

        ``content`` is text (``str``), JSON (``dict``/``list``), a numpy tensor (sent as an AVP
        hidden-state frame), an :class:`AVPMessage`, or an encoded AVP frame (``bytes``). Text and
        JSON use automatic algorithm selection among the negotiated ones unless ``algorithm`` names
        one; ``binary=True`` sends text as a TokenNative binary frame. ``extra`` (numpy tensors only)
        puts string metadata in the AVP frame's ``extra`` map. Errors (closed session, wrong mode,
        over the negotiated max_payload, ...) are raised before anything is sent.

        Cancellation: the message is committed before send() first waits. If the call is cancelled
        (or times out) after that, the message is still sent, whole and in order; only the wait
        for the transport is abandoned. So a ``CancelledError`` from send() never means "not
        sent": it means "not confirmed". Messages sent after it follow it. If the peer reads
        nothing for ``timers.write_timeout`` seconds, the session ends with ``SessionTimeout``.
        """
        return await self._send(content, algorithm, binary, extra)

    async def request(
        self,
        content: str | dict[str, Any] | list[Any] | np.ndarray[Any, Any],
        *,
        timeout: float | None = None,
        algorithm: str | Algorithm | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> Message:
        """Send ``content`` as a request and return the peer's answer (its ``reply()``).

        Many requests may be in flight on one session; each answer goes to its own request and
        never shows up in :meth:`recv`. After ``timeout`` seconds :class:`SessionTimeout` (also a
        ``TimeoutError``) is raised and a late answer is dropped. A peer that answers in parts
        (``more=True``) is read with :meth:`stream` instead: here the first part is returned.
        """
        request_id = self._correlator.new_id()
        if tracing.ENABLED:
            with tracing.request_span(request_id) as headers:
                return await self._request(request_id, content, timeout, algorithm, extra, headers)
        return await self._request(request_id, content, timeout, algorithm, extra, None)

    async def _request(
        self,
        request_id: str,
        content: object,
        timeout: float | None,
        algorithm: str | Algorithm | None,
        extra: Mapping[str, str] | None,
        trace: Mapping[str, str] | None,
    ) -> Message:
        future = self._correlator.expect_one(request_id)
        try:
            await self._send(content, algorithm, False, extra, request_id=request_id, trace=trace)
            if timeout is None:
                return await future
            try:
                async with asyncio.timeout(timeout):
                    return await future
            except TimeoutError:
                if future.done() and not future.cancelled():
                    return future.result()  # answered at the very deadline
                raise SessionTimeout(
                    f"no answer to request {request_id} within {timeout:g} s (timeout=)"
                ) from None
        finally:
            self._correlator.forget(request_id)

    async def stream(
        self,
        content: str | dict[str, Any] | list[Any] | np.ndarray[Any, Any],
        *,
        timeout: float | None = None,
        algorithm: str | Algorithm | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Message]:
        """Send ``content`` as a request and yield the peer's answers as they arrive.

        The peer answers with ``reply(message, part, more=True)`` for each part and ends with
        ``reply(message, last)`` (``more=False``); the loop yields every part, the last one
        included, then ends. ``timeout`` bounds the wait for each part (:class:`SessionTimeout`).
        Leaving the loop early is fine: later parts are dropped.
        """
        correlator = self._correlator
        request_id = correlator.new_id()
        stream = correlator.expect_stream(request_id)
        try:
            # The request span covers the send: a generator cannot keep a span current across
            # its yields without leaking it into the consumer's context.
            if tracing.ENABLED:
                with tracing.request_span(request_id) as headers:
                    await self._send(content, algorithm, False, extra, request_id=request_id, trace=headers)
            else:
                await self._send(content, algorithm, False, extra, request_id=request_id)
            while True:
                part = correlator.take(stream)
                if part is not None:
                    if self._paused:
                        self._update_reading()
                    yield part
                    if not part.more:
                        return
                    continue
                if stream.error is not None:
                    raise stream.error
                stream.waiter = self._loop.create_future()
                try:
                    async with asyncio.timeout(timeout):
                        await stream.waiter
                except TimeoutError:
                    raise SessionTimeout(
                        f"no part of stream {request_id} within {timeout:g} s (timeout=)"
                    ) from None
        finally:
            correlator.forget(request_id, stream)
            if self._paused:
                self._update_reading()

    async def reply(
        self,
        message: Message,
        content: str | dict[str, Any] | list[Any] | np.ndarray[Any, Any],
        *,
        more: bool = False,
        algorithm: str | Algorithm | None = None,
        extra: Mapping[str, str] | None = None,
    ) -> SentInfo:
        """Answer a received request (``message.request_id`` is set); ``more=True`` sends one part
        of a stream, and the answer without it ends the stream."""
        request_id = message.request_id
        if request_id is None:
            raise EncodeError(
                "reply() answers a request, and this message is not one (its request_id is None); "
                "use send() for a message that answers nothing"
            )
        if tracing.ENABLED and message.traceparent is not None:
            with tracing.reply_span(request_id, message.traceparent, message.tracestate):
                return await self._send(content, algorithm, False, extra, reply_to=request_id, more=more)
        return await self._send(content, algorithm, False, extra, reply_to=request_id, more=more)

    async def _send(
        self,
        content: object,
        algorithm: str | Algorithm | None,
        binary: bool,
        extra: Mapping[str, str] | None,
        *,
        request_id: str | None = None,
        reply_to: str | None = None,
        more: bool = False,
        trace: Mapping[str, str] | None = None,
    ) -> SentInfo:
        closed = self._protocol.closed
        if closed is not None:  # the same error recv() raises for the same loss (or close)
            raise closed_error(closed)
        resume = self._protocol.resume
        if resume is not None and resume.retained_bytes >= resume.buffer_bytes:  # .full, inline
            await self._wait_space()
        now = self._loop.time()
        if type(content) is str or isinstance(content, str | dict | list):
            if extra is not None:
                raise EncodeError(
                    "extra= is AVP frame metadata: it goes with numpy tensors, not text or JSON"
                )
            if algorithm is None:
                alg = None
            elif isinstance(algorithm, str):  # a StrEnum: names and members hit the dict alike
                alg = _ALGORITHMS.get(algorithm) or resolve_algorithm(algorithm)
            else:
                alg = resolve_algorithm(algorithm)  # raises EncodeError for the wrong type
            if request_id is None and reply_to is None:
                sent = self._protocol.send(content, now, algorithm=alg, binary=binary)
            else:
                sent = self._protocol.send(
                    content,
                    now,
                    algorithm=alg,
                    binary=binary,
                    request_id=request_id,
                    reply_to=reply_to,
                    more=more,
                    trace=trace,
                )
        else:
            if extra or request_id is not None or reply_to is not None:
                extra = avp_extra(
                    extra, tensor=is_ndarray(content), request_id=request_id, reply_to=reply_to, more=more
                )
            sent = self._protocol.send_frame(self._avp_parts(content, extra), now)
        protocol = self._protocol
        if not self._writing and self._inflight is None and not self._transport_closed:
            # Nothing queued before us, nobody writing and no write left in flight by a cancelled
            # send(): write synchronously if the channel can (else we could overtake that one).
            out = protocol.sole_output()
            if isinstance(out, SendMessage) and self._channel.send_now(out.message, out.text):
                protocol.next_output()
                if self._paused:
                    self._update_reading()
                self._unyielded += 1
                if self._unyielded >= _YIELD_EVERY:
                    # A send() the transport takes at once never suspends, so a sending loop would
                    # keep the event loop to itself for as long as the socket has room: give it a
                    # turn, to read the peer's ACKs (reconnect=True keeps what they release),
                    # PINGs and other sessions. The message is sent: a cancel here changes nothing.
                    self._unyielded = 0
                    await asyncio.sleep(0)
                return sent
            if isinstance(out, SendMessage):
                # Refused, most often only until the event loop's next turn: QUIC refuses once a
                # turn's writes reach its flush threshold (the transmit should run first), every
                # ~4 messages of 64 KiB, and a socket's buffer drains in a turn. The slow path
                # below costs a task, a timer and turns of its own, so give the loop that one
                # turn here and try once more (64 KiB AVP over QUIC: client CPU 133 -> 116 us
                # per message, 1.42x -> 1.52x raw aioquic; benchmarks/bench_quic_channel.py).
                # The message stays queued meanwhile: a cancel here leaves it to the writer
                # task, as below.
                try:
                    await asyncio.sleep(0)
                except asyncio.CancelledError:
                    self._writer_wakeup.set()
                    raise
                if (
                    not self._writing
                    and self._inflight is None
                    and not self._transport_closed
                    and protocol.sole_output() is out
                    and self._channel.send_now(out.message, out.text)
                ):
                    protocol.next_output()
                    if self._paused:
                        self._update_reading()
                    return sent
        try:
            await self._write_pending()
        except asyncio.CancelledError:
            # Our message is queued (or being written by its own task): have the writer task put
            # it out, since this call no longer does.
            self._writer_wakeup.set()
            raise
        if self._transport_closed and self._protocol.closed is not None:
            raise closed_error(self._protocol.closed)
        return sent

    async def _wait_space(self) -> None:
        """Wait until the peer acknowledged enough for the retention buffer to take more (or the
        session ended: send() then raises as usual)."""
        resume = self._protocol.resume
        while resume is not None and resume.full and not self._closed.is_set():
            waiter = self._loop.create_future()
            self._space_waiters.append(waiter)
            await waiter

    async def _deliver_retained(self) -> None:
        """Before an orderly close on a resumable session: wait until the peer acknowledged every
        DATA message we sent, across resumes, so a connection lost during the close handshake
        loses nothing. A client waits for its connection to come back even with nothing to
        deliver: the CLOSE must reach the server, whose session would otherwise wait out its
        resume_window and end RESUME_EXPIRED. Bounded: a detached session ends after
        resume_window (server) or max_elapsed (client); connected, each round trip gets
        close_timeout."""
        protocol = self._protocol
        resume = protocol.resume
        timeout = protocol.config.timers.close_timeout
        while resume is not None and not self._closed.is_set():
            if resume.acked >= resume.sent and not (protocol.detached and self._reconnect is not None):
                return
            if protocol.detached:
                closed = asyncio.ensure_future(self._closed.wait())
                attached = asyncio.ensure_future(self._attached.wait())
                try:
                    await asyncio.wait((closed, attached), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    closed.cancel()
                    attached.cancel()
                continue
            acked = resume.acked
            protocol.request_ack(self._loop.time())
            self._after_protocol_step()
            self._writer_wakeup.set()
            waiter = self._loop.create_future()
            self._space_waiters.append(waiter)
            try:
                async with asyncio.timeout(timeout):
                    await waiter
            except TimeoutError:
                if resume.acked == acked and not protocol.detached:
                    return  # the peer acknowledges nothing: close anyway (close_timeout)

    def _wake_senders(self) -> None:
        waiters, self._space_waiters = self._space_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def recv(self) -> Message:
        """The next message, in order. Raises SessionClosed once the session is over and drained."""
        inbox = self._inbox
        loop = self._loop
        if self._taken_run >= _TAKEN_PER_TURN or loop.time() >= self._turn_ends:
            # Messages taken from the inbox, and those decoded from _held on the way (see
            # _update_reading), come without a wait: an application reading in a loop kept the
            # event loop, and every other session, for as long as there were any (a peer's
            # 199-byte messages that decode to 16 MiB each: seconds; stop 32's attack run).
            # Before taking one, so that a cancel here loses nothing.
            self._taken_run = 0
            await asyncio.sleep(0)
            self._turn_ends = loop.time() + _TURN_SECONDS
        while not inbox:
            self._taken_run = 0
            await self._inbox_waiter()
            self._turn_ends = loop.time() + _TURN_SECONDS
        message = inbox.popleft()
        cost = message.decoded_bytes or queued_cost(message)  # the call only when 0
        self._inbox_bytes -= cost
        self._taken_run += cost
        if self._paused and len(inbox) <= self._max_queue // 2:
            # Above half max_queue the inbox alone keeps reading paused (see _update_reading).
            self._update_reading()
        return message

    def _inbox_waiter(self) -> asyncio.Future[None]:
        """A future completed when a message arrives or the session ends; raises SessionClosed
        once the session is over (the caller found the inbox empty)."""
        if self._protocol.state is _CLOSE_RECEIVED:
            # The application took every message sent before the peer's CLOSE and asks for more:
            # it is done, acknowledge (after any replies it sent meanwhile).
            self._acknowledge_close()
        if self._closed.is_set():
            closed = self._protocol.closed
            assert closed is not None  # _closed is set only by _mark_closed
            raise closed_error(closed)
        receivers = self._receivers
        if len(receivers) >= 8:  # drop those of cancelled recv() calls
            receivers[:] = [f for f in receivers if not f.done()]
        waiter = self._loop.create_future()
        receivers.append(waiter)
        return waiter

    def _wake_receivers(self) -> None:
        receivers = self._receivers
        for waiter in receivers:
            if not waiter.done():
                waiter.set_result(None)
        receivers.clear()

    def __aiter__(self) -> Session:
        return self

    async def __anext__(self) -> Message:
        """``async for`` ends at an orderly close and raises when the session failed."""
        try:
            return await self.recv()
        except SessionClosed:
            closed = self._protocol.closed
            if closed is not None and closed.error is not None:
                raise
            raise StopAsyncIteration from None

    async def close(self, reason: str = "") -> None:
        """Close the session: CLOSE, wait for the acknowledgement (close_timeout), close the channel.

        If the peer closed first, this acknowledges its CLOSE after whatever was sent before.
        Messages received before the end stay readable with recv() afterwards.

        A session waiting to be resumed first waits for its connection to come back (at most the
        server's resume_window, the client's max_elapsed), so retained messages are delivered.
        """
        await self._close(reason)

    async def _close(self, reason: str, code: str = SessionCode.NORMAL, *, wait_resume: bool = True) -> None:
        if self._handed_over:  # the channel belongs to the resumed session: nothing of ours to close
            return
        if wait_resume and self._protocol.resume is not None:
            await self._deliver_retained()
        timeout = self._protocol.config.timers.close_timeout
        self._closing = True
        was_open = self._protocol.state is not State.CLOSED
        if was_open:
            self._protocol.close(self._loop.time(), reason, code=code)
            self._after_protocol_step()
        if self._inbox_full():
            self._protocol.discard_data()  # see _full
        # Read on: the acknowledgement must be readable even if the inbox is full. What was held
        # is decoded now, up to the inbox's bound; DATA past it is dropped unread (_full).
        self._update_reading()
        if was_open:
            try:
                async with asyncio.timeout(timeout):
                    await self._write_pending()
            except TimeoutError:  # the peer reads nothing: our CLOSE cannot even be written
                self._abort_channel()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout + 1.0):
                await self._closed.wait()
        await self._shutdown()

    async def wait_closed(self) -> Closed | None:
        await self._closed.wait()
        return self._protocol.closed

    # -- shell machinery -------------------------------------------------------------------------

    async def _start(self) -> SessionInfo:
        """Run the handshake; returns the negotiated info or raises (REJECT, timeout, transport)."""
        if tracing.ENABLED:
            # The caller's trace context, now: the session span must join it even when the
            # handshake ends in another task's context (NATS delivers in its subscription task).
            hello_trace = tracing.carrier()
            self._trace_parent = (hello_trace.get("traceparent"), hello_trace.get("tracestate"))
            self._protocol.initiate(self._loop.time(), hello_trace)
        else:
            self._protocol.initiate(self._loop.time())
        self._tasks = [asyncio.create_task(self._writer(), name="m2mwire-writer")]
        self._start_reading(self._channel)
        self._after_protocol_step()
        try:
            await self._write_pending()
            return await self._established
        except BaseException:
            await self._shutdown()
            raise

    def _start_reading(self, channel: Channel) -> None:
        """Feed what ``channel`` receives to the protocol; its loss counts only while it is ours."""
        channel.start_push(self._feed, functools.partial(self._channel_lost, channel))
        # Explicitly, either way: a channel taken over from another session (a resume) may have
        # been paused or resumed by it.
        if self._paused:
            channel.pause_reading()
        else:
            channel.resume_reading()

    def _channel_lost(self, channel: Channel, exc: TransportError) -> None:
        if channel is self._channel and not self._handed_over:
            self._on_transport_closed(exc)

    def _drop_channel(self) -> None:
        """Abort the current channel and stop listening to it (resume: the session outlives it)."""
        self._channel.start_push(_ignore, _ignore)
        self._abort_channel()
        if not self._channel_done.done():
            self._channel_done.set_result(None)

    def _use_channel(self, channel: Channel) -> None:
        self._channel = channel
        self._held.clear()  # the old channel's (see _on_transport_closed)
        if not any(t.get_name() == "m2mwire-writer" and not t.done() for t in self._tasks):
            # The writer ends with its channel (see _writer): a resumed session needs a new one.
            self._tasks = [t for t in self._tasks if not t.done()]
            self._tasks.append(asyncio.create_task(self._writer(), name="m2mwire-writer"))
        if self._channel_done.done():
            self._channel_done = self._loop.create_future()
        self._transport_closed = False
        if self._protocol.info is not None:  # a resumed session: what it negotiated, as before
            channel.set_max_message_size(self._protocol.channel_limit)

    def _take_over(self, channel: Channel, peer_received: int) -> None:
        """Server: continue this session on a resuming client's ``channel``."""
        protocol = self._protocol
        if not protocol.detached:
            # The client saw the old connection die before we did: drop it now.
            protocol.transport_closed(TransportError("replaced by a resumed connection"), self._loop.time())
            self._after_protocol_step()
        self._use_channel(channel)
        protocol.attach(peer_received, self._loop.time())
        self._start_reading(channel)
        self._after_protocol_step()
        self._writer_wakeup.set()

    def _hand_over(self, to: Session) -> Channel:
        """Server, fresh connection: give the channel away to the session it resumes."""
        self._handed_over = True
        self._handed_to = to
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()  # writer, admission: the resumed session's own tasks take over
        if self._timer_handle is not None:
            self._timer_handle.cancel()
            self._timer_handle = self._timer_at = None
        if self._throttle is not None:
            # Charged for the resuming HELLO, it would resume reading the channel it gave away
            # when it fired, under the resumed session's pause: held messages without a bound
            # (stop 33's review).
            self._throttle.cancel()
            self._throttle = None
            self._stop_waiting()
        if not self._established.done():
            self._established.set_exception(HandedOver("moved to the resumed session"))
        return self._channel

    async def _reconnect_loop(self) -> None:
        """Client: open new connections (backoff with jitter) until the session resumes, the
        server refuses, or max_elapsed passes (RECONNECT_GAVE_UP)."""
        policy, reopen, protocol = self._reconnect, self._reopen, self._protocol
        assert policy is not None and reopen is not None
        loop = self._loop
        give_up_at = loop.time() + policy.max_elapsed
        wait = 0.0
        stalled = False  # lost again right after resuming, and nothing got through since
        last = self._last_resume
        if last is not None and loop.time() - last.resumed_at < policy.max_delay:
            # Lost again right after resuming (a server that accepts resumes and then fails
            # them, a path that drops every new connection): the first attempt waits the next
            # backoff step, as a failed attempt would, instead of reconnecting at once (the
            # loop went hot: ~5,000 resumes in 8 s against one such failure).
            delays = last.delays
            wait = next(delays)
            if (
                last.give_up_at is not None
                and protocol.resume is not None
                and protocol.resume.progress == last.progress
            ):
                # ... and if no DATA got through since the resume before that one, nor through
                # this connection as far as we know yet, these resumes were no recovery:
                # max_elapsed still counts from the loss that began them. Else a server that
                # accepted every resume and then cut kept a client retrying for good. (What a
                # connection carried is often acknowledged only by the next resume's ACCEPT: a
                # connection is judged then, see below, so a session that moves data between
                # losses, however frequent, starts afresh each time.)
                give_up_at = last.give_up_at
                stalled = True
        else:
            delays = policy.delays()
        attempts = 0
        # Where the server holding this session is (transports whose URL names a pool, not one
        # server: see RoutedChannel); every channel since the first reached that same server.
        old = self._channel
        route = old.resume_route if isinstance(old, RoutedChannel) else None
        if wait:
            if stalled and loop.time() + wait >= give_up_at:
                # The step would end past max_elapsed: give up now. Attempting at once instead
                # let a server that cut every resume have one per cut, as fast as it cut, in the
                # last max_delay seconds (stop 32's attack: 175 resumes in ~5 s).
                protocol.give_up(
                    f"could not resume within {policy.max_elapsed:g} s: each resume was lost again "
                    "right after it (reconnect max_elapsed=)"
                )
                self._after_protocol_step()
                return
            if loop.time() + wait < give_up_at:  # else (max_delay > max_elapsed) one attempt now
                await asyncio.sleep(wait)
        while protocol.detached:
            attempts += 1
            try:
                async with asyncio.timeout(max(0.0, give_up_at - loop.time())):
                    channel = await reopen(route)
            except ResumeImpossible as exc:
                # The server that held the session is gone: no later attempt can resume it.
                protocol.give_up(str(exc), SessionCode.RESUME_UNKNOWN)
                self._after_protocol_step()
                return
            except (OSError, M2MError, TimeoutError) as exc:
                log.info("session %s: reconnect attempt %d failed: %s", protocol.session_id, attempts, exc)
            else:
                self._outcome = loop.create_future()
                self._use_channel(channel)
                protocol.begin_resume(loop.time())
                self._start_reading(channel)
                self._after_protocol_step()
                self._writer_wakeup.set()
                outcome = await self._outcome
                if outcome != "detached":
                    if outcome == "resumed":
                        assert protocol.resume is not None  # a session that resumed has it
                        progress = protocol.resume.progress  # the ACCEPT's count included
                        moved = last is not None and progress > last.progress
                        self._last_resume = _LastResume(
                            delays, loop.time(), progress, None if moved else give_up_at
                        )
                    return  # resumed, or the server refused (the session is closed)
            wait = next(delays)
            if loop.time() + wait >= give_up_at:
                break
            await asyncio.sleep(wait)
        if protocol.detached:
            protocol.give_up(
                f"could not resume within {policy.max_elapsed:g} s after {attempts} attempt(s) "
                "(reconnect max_elapsed=)"
            )
            self._after_protocol_step()

    def _avp_parts(self, content: object, extra: Mapping[str, str] | None = None) -> Sequence[Buffer]:
        if extra is not None and not is_ndarray(content):
            raise EncodeError(
                "extra= is set when the frame is built: pass the numpy tensor, not an encoded frame"
            )
        if type(content) is bytes or isinstance(content, bytearray | memoryview):
            return (content,)
        if is_ndarray(content):
            metadata = self._avp_metadata
            if metadata is None:
                metadata = self._build_avp_metadata()
            if extra:
                # A metadata of its own: the session's cached one stays on encode_parts' fast path.
                metadata = dataclasses.replace(metadata, extra=extra)
            return self._avp_encode(content, metadata)
        avp_module = sys.modules.get("m2mwire.codecs.avp")  # an AVPMessage exists only once it is loaded
        if avp_module is not None and isinstance(content, avp_module.AVPMessage):
            return (content.raw,)
        raise EncodeError(
            f"send() takes str, dict, list, a numpy array, an AVPMessage or AVP frame bytes, "
            f"not {type(content).__name__}"
        )

    def _build_avp_metadata(self) -> AVPMetadata:
        """The session's AVP metadata (session/payload.py), kept from its first tensor; also
        binds the encoder, so that numpy and protobuf load only for sessions that send tensors,
        and later tensors skip the import statement."""
        from m2mwire.codecs.avp import encode_parts

        metadata = self._avp_metadata = avp_metadata(self.info, self._protocol.config)
        self._avp_encode = encode_parts
        return metadata

    def _after_protocol_step(self) -> None:
        """Collect events and re-arm the timer after the protocol was fed something."""
        protocol = self._protocol
        while (event := protocol.next_event()) is not None:
            if isinstance(event, Established):
                # Raise the channel's limit from the handshake's (control messages only) to the
                # negotiated one now, before the peer's first DATA is read.
                self._channel.set_max_message_size(self._protocol.channel_limit)
                self._opened_at = self._loop.time()
                log_opened(event.info, self._channel.remote_address)
                if tracing.ENABLED:
                    trace_parent = self._protocol.peer_trace or self._trace_parent
                    self._span = tracing.start_session(
                        event.info, self._channel.remote_address, *trace_parent
                    )
                if not self._established.done():
                    self._established.set_result(event.info)
            elif isinstance(event, HelloReceived):
                self._tasks.append(asyncio.create_task(self._admit(event), name="m2mwire-admission"))
            elif isinstance(event, Detached):
                self._on_detached()
            elif isinstance(event, Resumed):
                self._attached.set()
                self._settle("resumed")
                self._writer_wakeup.set()
                log.info(
                    "session %s resumed on %s; %d message(s) retransmitted",
                    self._protocol.session_id,
                    self._channel.remote_address,
                    event.retransmitted,
                )
            elif isinstance(event, ResumeRequested):
                self._loop.call_soon(self._resume_requested, event)
            else:
                self._mark_closed(event)
                self._settle("closed")
        if self._space_waiters and not (self._protocol.resume is not None and self._protocol.resume.full):
            self._wake_senders()  # also wakes _deliver_retained after each ACK
        if (
            protocol.state is _CLOSE_RECEIVED
            and not self._inbox
            and any(not waiter.done() for waiter in self._receivers)
        ):
            self._acknowledge_close()  # the application waits in recv(): it has taken everything
            return
        self._arm_timer()

    def _settle(self, outcome: str) -> None:
        if self._outcome is not None and not self._outcome.done():
            self._outcome.set_result(outcome)

    def _on_detached(self) -> None:
        self._attached.clear()
        self._drop_channel()
        self._settle("detached")
        if self._reconnect is not None and (self._reconnecting is None or self._reconnecting.done()):
            self._reconnecting = asyncio.create_task(self._reconnect_loop(), name="m2mwire-reconnect")
            self._tasks.append(self._reconnecting)

    def _resume_requested(self, event: ResumeRequested) -> None:
        """Server, fresh connection (run soon after, not inside the protocol step that asked)."""
        if self._protocol.state is not State.INITIAL or self._resumer is None:
            return
        self._resumer(event)
        if self._handed_over:
            # The resumed session has the connection now. A step here would arm this one's hello
            # timer again, and the timer would keep it all (protocol, connection objects, ~35 KiB)
            # alive for hello_timeout: memory a client resuming over and over could pile up.
            return
        self._after_protocol_step()
        self._writer_wakeup.set()

    async def _admit(self, event: HelloReceived) -> None:
        """Server: run the admission rules on a HELLO and give the core the verdict."""
        assert self._admission is not None  # the core reports HelloReceived only when asked to
        address = split_address(self._channel.remote_address)
        verdict = await self._admission.decide(Hello.from_capabilities(event.hello, address))
        protocol = self._protocol
        if verdict is None:
            if protocol.state is not State.INITIAL:  # ended meanwhile (hello_timeout, peer gone)
                self._admission.release(address[0])
                return
            self._admitted_host = address[0]
            protocol.admit(self._loop.time())
        else:
            protocol.refuse(verdict.code, verdict.message)
        self._after_protocol_step()
        self._writer_wakeup.set()

    def _acknowledge_close(self) -> None:
        self._protocol.acknowledge_close()
        self._after_protocol_step()
        self._writer_wakeup.set()

    def _arm_timer(self) -> None:
        deadline = self._protocol.next_deadline()
        if deadline is None:
            if self._timer_handle is not None:
                self._timer_handle.cancel()
                self._timer_handle = self._timer_at = None
            return
        # Deadlines mostly move later (traffic postpones pings); only reschedule when one moves
        # earlier, otherwise let the armed callback fire and re-arm itself.
        if self._timer_at is not None and self._timer_at <= deadline:
            return
        if self._timer_handle is not None:
            self._timer_handle.cancel()
        self._timer_at = deadline
        self._timer_handle = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer_handle = self._timer_at = None
        if self._paused:
            self._protocol.reading_suspended(self._loop.time())
        self._protocol.handle_timer(self._loop.time())
        self._after_protocol_step()
        self._writer_wakeup.set()

    def _mark_closed(self, event: Closed) -> None:
        if not self._established.done():
            self._established.set_exception(closed_error(event, handshake=True))
            self._established.exception()  # mark retrieved: a server may never await it
        self._closed.set()
        self._wake_receivers()
        self._wake_senders()
        self._correlator.fail_all(closed_error(event))
        if self._opened_at is not None and self._protocol.info is not None:
            log_closed(self._protocol.info, event, self.stats, self._loop.time() - self._opened_at)
        if self._span is not None:
            tracing.end_session(self._span, event.code, event.reason, event.error is not None)
            self._span = None
        self._update_reading()
        if self._writing and not self._transport_closed:
            # A write is blocked (the peer stopped reading): give it close_timeout to finish,
            # then cut the connection so nothing waits forever.
            self._loop.call_later(self._protocol.config.timers.close_timeout, self._abort_channel)

    async def _write_pending(self) -> None:
        """Write everything the protocol has queued, in order (waits under backpressure)."""
        async with self._write_lock:
            self._writing = True
            try:
                inflight = self._inflight
                if inflight is not None:  # left by a cancelled caller: it goes out first
                    with contextlib.suppress(TransportError):  # _write_finished handled it
                        await asyncio.shield(inflight)
                # One output at a time: a cancelled write loses nothing queued behind it.
                written = 0
                while (out := self._protocol.next_output()) is not None:
                    if isinstance(out, CloseTransport):
                        await self._close_channel(out.code, out.reason)
                    elif not self._transport_closed:
                        channel = self._channel
                        try:
                            if (task := self._start_write(out)) is not None:
                                await asyncio.shield(task)
                                written = 0
                            else:
                                written += 1
                        except TransportError as exc:
                            if channel is self._channel:
                                self._on_transport_closed(exc)
                    if self._paused:
                        self._update_reading()
                    if written >= _YIELD_EVERY:
                        # Written at once, one after another (a resume's replay: up to a whole
                        # retention buffer, ~100,000 small messages, ~250 ms): give the loop a
                        # turn, as send() does, for other sessions, and to learn of a lost
                        # connection before writing the rest into it. What is not taken yet
                        # stays queued in the protocol: a cancel here loses nothing.
                        written = 0
                        await asyncio.sleep(0)
            finally:
                self._writing = False

    def _start_write(self, out: SendMessage) -> asyncio.Task[None] | None:
        """Write ``out``'s message such that cancelling the caller never cuts it in half; returns None
        when it is written, or the task that finishes it (await it through shield()).

        ``send_now`` writes it at once when the channel has room (no task, no loop turn). When it
        has none (the peer reads slowly), ``send()`` waits for room in a task of its own: a
        cancelled caller then leaves it running (the next write waits for it), and the
        write_timeout timer drops a peer that lets it wait too long.
        """
        channel = self._channel
        message, text = out.message, out.text
        if channel.send_now(message, text):
            return None
        task = self._loop.create_task(channel.send(message, text))
        self._inflight = task
        self._write_timer = self._loop.call_later(
            self._protocol.config.timers.write_timeout, self._on_write_timeout, task
        )
        task.add_done_callback(functools.partial(self._write_finished, channel=channel))
        return task

    def _write_finished(self, task: asyncio.Task[None], channel: Channel | None = None) -> None:
        if self._inflight is task:
            self._inflight = None
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None
        # Also when no caller waits for it any more; with resume, an old channel's loss is moot.
        if (
            not task.cancelled()
            and isinstance(exc := task.exception(), TransportError)
            and (channel is None or channel is self._channel)
        ):
            self._on_transport_closed(exc)

    def _on_write_timeout(self, task: asyncio.Task[None]) -> None:
        if self._inflight is not task or task.done():
            return
        self._write_timer = None
        self._protocol.write_stalled(self._protocol.config.timers.write_timeout)
        self._after_protocol_step()
        self._abort_channel()  # frees what the transport holds; the waiting write fails with it

    async def _writer(self) -> None:
        # Ends with the channel, so that a session the application never closes is not kept alive
        # by its own task (a cycle through the task's frame).
        while not self._transport_closed:
            await self._writer_wakeup.wait()
            self._writer_wakeup.clear()
            await self._write_pending()

    def _feed(self, data: bytes, text: bool) -> None:
        """One received message (a text one as its UTF-8 bytes, which the protocol validates):
        through the protocol, into the inbox; pause reading when full. Held undecoded while
        reading is paused (see _held)."""
        if self._paused or self._held:
            self._held.append((data, text))
            return
        self._process(data, text)

    def _drain_held(self) -> None:
        """Decode what was held, in order, until the session pauses again."""
        held = self._held
        while held and not self._paused:
            self._process(*held.popleft())

    def _process(self, data: bytes, text: bool) -> None:
        proto = self._protocol
        if proto.state is _CLOSED:
            return
        now = self._loop.time()
        budget = self._budget
        if (
            budget.repaid_at > now or ((network := budget.network) is not None and network.repaid_at > now)
        ) and not self._closing:
            # The peer owes decode time (this session or another from its address or network):
            # its message waits undecoded, first in line, until the debt is repaid
            # (session/budget.py).
            self._held.appendleft((data, text))
            if budget.owed(now) > MAX_PAUSE:
                self._decode_overloaded()
            else:
                self._pause_for(budget.waits(now))
            return
        try:
            clock = self._clock
            start = clock()
            try:
                message = proto.receive_text(data, now) if text else proto.receive_binary(data, now)
            finally:
                # Whatever it took, failures included (a bomb whose checksum fails once it is
                # decompressed is refused, and cost the time all the same): one comparison for
                # the usual message, which takes far less than its allowance.
                spent = clock() - start
                if spent > FREE_BASE + FREE_PER_BYTE * len(data):  # DecodeBudget.charge's test
                    self._charge(len(data), spent, now)
                self._slice += spent
                if self._slice > _SLICE_SECONDS:
                    self._end_slice()
            if message is not None:  # DATA, and nothing else happened: no event, output or timer
                if proto.ack_queued:  # an ACK (resume) is the one output DATA may cause
                    proto.ack_queued = False
                    self._writer_wakeup.set()
                cost = message.decoded_bytes or queued_cost(message)
                correlator = self._correlator
                if message.reply_to is not None:  # an answer to one of our requests
                    correlator.route(message)
                    if self._inbox_full():
                        self._full()
                    return
                inbox = self._inbox
                inbox.append(message)
                self._inbox_bytes += cost
                if self._receivers:
                    self._wake_receivers()
                # _inbox_full() inline: replies waiting for their requests share the bound.
                if (
                    self._paused
                    or len(inbox) + correlator.buffered >= self._max_queue
                    or self._inbox_bytes + correlator.buffered_bytes >= self._max_queue_bytes
                ):
                    self._full()
                return
            self._after_protocol_step()
            backlog = proto.output_backlog
            if backlog:
                self._writer_wakeup.set()  # PONG, CLOSE acknowledgement, REJECT, ...
            if self._paused or backlog > _MAX_OUTPUT_BACKLOG or self._inbox_full():
                self._update_reading()  # only then can it change anything
        except Exception as exc:  # a bug must not leave the application waiting forever
            log.exception("session failed to process a message")
            # Ended for good, the peer told (CLOSE INTERNAL_ERROR, then the transport's close):
            # the writer sends both, and the session's close_timeout bounds a write that blocks.
            self._protocol.internal_error(exc)
            self._after_protocol_step()
            self._writer_wakeup.set()

    def _inbox_full(self) -> bool:
        """The inbox and the replies waiting for their requests are at their bound (max_queue
        messages or max_queue_bytes)."""
        return (
            len(self._inbox) + self._correlator.buffered >= self._max_queue
            or self._inbox_bytes + self._correlator.buffered_bytes >= self._max_queue_bytes
        )

    def _full(self) -> None:
        """The inbox (or the replies waiting for their requests) reached its bound: pause reading;
        closing, read on (for the peer's acknowledgement) but have further DATA dropped unread."""
        if self._closing:
            self._protocol.discard_data()
        self._update_reading()

    def _charge(self, wire: int, spent: float, now: float) -> None:
        """A message of ``wire`` bytes took ``spent`` seconds to process, more than its free
        allowance: charge the peer's bucket, and stop reading while it refills."""
        self._clock = thread_time
        budget = self._budget
        owed = budget.charge(wire, spent, now)  # what the peer's address owes
        if self._protocol.state is _CLOSED or self._closing:
            # The message ended it (a violation), or it is closing (it reads on for the
            # acknowledgement, and drops DATA): charged all the same, and nobody waits.
            return
        if owed > MAX_PAUSE:
            self._decode_overloaded()
        elif (wait := budget.waits(now)) > 0.0:
            self._pause_for(wait)

    def _pause_for(self, pause: float) -> None:
        """Stop reading for ``pause`` seconds (at most MAX_PAUSE: a network's debt may be longer,
        and its messages are checked again then)."""
        pause = min(pause, MAX_PAUSE)
        if self._throttle is None:
            # Jittered (+0-25 %): sessions paused by one empty bucket would otherwise all resume
            # in the same loop turn, each decoding a message at once (40 peers' 16 MiB messages:
            # a 1.7 s stall every MAX_PAUSE in stop 32's measurement).
            pause *= 1.0 + 0.25 * random.random()
            self._throttle = self._loop.call_later(pause, self._end_throttle)
            self._waiting_on = self._budget.buckets()
            for bucket in self._waiting_on:
                bucket.waiting += 1
        self._update_reading()

    def _decode_overloaded(self) -> None:
        """The peer's address owes more than MAX_PAUSE of refill: close this session
        (session/budget.py). What it holds, and DATA that still arrives, is dropped undecoded."""
        if self._closing or self._closed.is_set():
            return
        self._closing = True
        self._held.clear()
        self._protocol.close(
            self._loop.time(),
            "messages that take far longer to decode than their size warrants arrive from this "
            f"address faster than they can be decoded here ({REFILL:g} s per second past that, all "
            "its sessions together)",
            code=SessionCode.MESSAGE_TOO_BIG,
        )
        self._protocol.discard_data()
        self._after_protocol_step()
        self._update_reading()  # closing reads on, for the acknowledgement
        self._writer_wakeup.set()

    def _end_slice(self) -> None:
        """Enough processing for this turn: what else arrives waits for the loop's next one."""
        self._slice = 0.0
        if self._throttle is None:
            self._throttle = self._loop.call_later(0.0, self._end_throttle)
            self._update_reading()

    def _end_throttle(self) -> None:
        self._throttle = None
        self._stop_waiting()
        if self._handed_over:
            return  # the channel is the resumed session's now

    def _stop_waiting(self) -> None:
        for bucket in self._waiting_on:
            bucket.waiting -= 1
        self._waiting_on = ()
        self._update_reading()

    def _update_reading(self) -> None:
        """Stop reading while the application lags (inbox full, in messages or in bytes) or the peer
        makes us queue output faster than it reads (e.g. a PING flood); resume at half those marks."""
        if self._closing or self._closed.is_set():
            pause = False
        elif self._paused:
            pause = (
                len(self._inbox) + self._correlator.buffered > self._max_queue // 2
                or self._inbox_bytes + self._correlator.buffered_bytes > self._max_queue_bytes // 2
                or self._protocol.output_backlog > _MAX_OUTPUT_BACKLOG // 2
                or self._throttle is not None
            )
        else:
            pause = (
                self._inbox_full()
                or self._protocol.output_backlog > _MAX_OUTPUT_BACKLOG
                or self._throttle is not None
            )
        if pause == self._paused:
            return
        self._paused = pause
        if not pause and self._held:
            self._drain_held()  # may pause again: then reading stays paused
        if not self._transport_closed and pause == self._paused:
            if pause:
                self._channel.pause_reading()
            else:
                self._channel.resume_reading()

    def _on_transport_closed(self, exc: TransportError) -> None:
        """The channel is gone: it said so, or a write failed."""
        # Held messages were received but not taken (not decoded, counted or acknowledged): they
        # go with the connection, as bytes still unread in its socket would. With resume the
        # peer's retention sends them again. Without it they are lost, as anything in flight is
        # when a connection breaks. (Keeping the loss behind them until the application read
        # them left a session that only sent, or waited in wait_closed(), with sends that
        # "succeeded" into nothing and no timer to end it: reading was paused, which stops the
        # ping timers; stop 31's code review.)
        self._held.clear()
        self._transport_closed = True
        self._protocol.transport_closed(None if exc.clean else exc, self._loop.time())
        self._after_protocol_step()
        self._writer_wakeup.set()  # to end
        self._release_references()

    async def _close_channel(self, code: int, reason: str) -> None:
        if self._transport_closed:
            return
        self._transport_closed = True
        self._writer_wakeup.set()  # to end
        try:
            async with asyncio.timeout(self._protocol.config.timers.close_timeout):
                await self._channel.close(code, reason)
        except Exception:  # a peer that does not complete the closing handshake
            self._channel.abort()

    def _abort_channel(self) -> None:
        """Drop the connection now (no closing handshake); idempotent."""
        if self._transport_closed:
            return
        self._transport_closed = True
        self._writer_wakeup.set()  # to end
        self._channel.abort()

    async def _shutdown(self) -> None:
        if self._handed_over:  # the channel now belongs to the resumed session
            current = asyncio.current_task()
            for task in self._tasks:
                if task is not current:
                    task.cancel()
            return
        # Put out what the protocol queued last (REJECT, CLOSE), briefly.
        if not self._transport_closed:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(2.0):
                    await self._write_pending()
        if self._protocol.state is not State.CLOSED:
            self._protocol.transport_closed()
            self._after_protocol_step()
        await self._close_channel(CloseCode.NORMAL, "")
        if not self._channel_done.done():
            self._channel_done.set_result(None)
        if self._timer_handle is not None:
            self._timer_handle.cancel()
            self._timer_handle = self._timer_at = None
        current = asyncio.current_task()
        others = [t for t in self._tasks if t is not current and not t.done()]
        for task in others:
            task.cancel()
        if others:
            await asyncio.wait(others, timeout=5.0)
        self._release_references()

    def _release_references(self) -> None:
        """Break the reference cycles of a finished session, so that it and every buffer it holds
        are freed as soon as the application drops it, without waiting for the cycle collector:
        a task's exception holds frames that hold this session, and a push channel's callbacks are
        bound methods of it. Messages still in the inbox stay readable."""
        self._tasks = [t for t in self._tasks if not t.done()]
        if self._throttle is not None:
            self._throttle.cancel()
            self._throttle = None
            self._stop_waiting()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        self._channel.start_push(_ignore_message, _ignore_loss)


def _ignore_message(_message: bytes, _text: bool) -> None:
    """What a finished session's channel delivers to (nothing can arrive: it is closed)."""


def _ignore_loss(_error: TransportError) -> None:
    """See _ignore_message."""


class ServerSide:
    """A server's handle on one session it hosts (m2mwire.shell.hosting.HostedSession).

    Lives next to :class:`Session` because it drives the session's private machinery (handshake,
    hand-over on resume, shutdown); the server sees only this small interface.
    """

    __slots__ = ("_session",)

    def __init__(
        self,
        channel: Channel,
        protocol: SessionProtocol,
        admission: Admission,
        resumer: Callable[[ServerSide, ResumeRequested], None],
        budget: DecodeBudget | None = None,
    ) -> None:
        session = Session(channel, protocol)
        session._admission = admission
        session._resumer = functools.partial(resumer, self)
        if budget is not None:  # its peer address's, shared by its sessions (session/budget.py)
            session._budget = budget
        self._session = session

    @property
    def session(self) -> Session:
        return self._session

    @property
    def session_id(self) -> str | None:
        return self._session._protocol.session_id

    @property
    def resumable(self) -> bool:
        return self._session._protocol.resume is not None

    @property
    def closed(self) -> Closed | None:
        return self._session._protocol.closed

    @property
    def stats(self) -> Stats:
        return self._session._protocol.stats

    @property
    def span(self) -> Any:
        return self._session._span

    async def handshake(self) -> SessionInfo:
        return await self._session._start()

    async def wait_channel_released(self) -> None:
        session = self._session
        target = session._handed_to
        assert target is not None  # set with HandedOver
        # The transport closes the connection when the server's handler returns: keep it open
        # while the resumed session uses it (it may move on to yet another connection).
        while target._channel is session._channel and not target._channel_done.done():
            await asyncio.shield(target._channel_done)

    async def close(self, reason: str, code: str = SessionCode.NORMAL, *, wait_resume: bool = True) -> None:
        await self._session._close(reason, code, wait_resume=wait_resume)

    async def shutdown(self) -> None:
        session = self._session
        await session._shutdown()
        if session._admitted_host is not None and session._admission is not None:
            session._admission.release(session._admitted_host)
            session._admitted_host = None
        # The resumer is bound to this handle, which holds the session: a cycle that would keep
        # the session (and its buffers) until the garbage collector runs. A session that has
        # ended resumes nothing.
        session._resumer = None

    @property
    def accepts_resume(self) -> bool:
        return self._session._protocol.accepts_resume

    @property
    def awaiting_resume(self) -> bool:
        session = self._session
        return session._protocol.state is State.INITIAL and not session._handed_over

    def replay_wait(self, peer_received: int) -> float:
        session = self._session
        return session._protocol.replay_wait(peer_received, session._loop.time())

    def refuse_resume(self, code: str, message: str) -> None:
        session = self._session
        session._protocol.refuse_resume(code, message)
        session._after_protocol_step()  # (again, when called from _resume_requested: harmless)
        session._writer_wakeup.set()

    def resume_token_matches(self, token: str) -> bool:
        return self._session._protocol.resume_token_matches(token)

    def take_over(self, fresh: Session, peer_received: int) -> None:
        channel = fresh._hand_over(self._session)
        self._session._take_over(channel, peer_received)
