"""The asyncio shell around the sans-I/O session core: ``connect()``, ``serve()`` and ``Session``.

The shell only moves messages between a transport channel and :class:`SessionProtocol`, runs the
timers the protocol asks for, and hands received messages to the application through a bounded
queue (when the application stops reading, we stop reading the channel, and the transport's flow
control pushes back on the peer).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import ssl as ssl_module
import sys
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Unpack, cast

from m2mwire import tracing
from m2mwire.admission import Admission, Hello, split_address
from m2mwire.codecs import Algorithm, resolve_algorithm
from m2mwire.codecs.buffers import is_ndarray
from m2mwire.correlation import Correlator
from m2mwire.errors import (
    EncodeError,
    M2MError,
    SessionClosed,
    SessionRejected,
    SessionTimeout,
    TransportError,
)
from m2mwire.lifecycle import Listening
from m2mwire.options import (
    ConnectOptions,
    Endpoint,
    ServeOptions,
    load_server_certificate,
    parse_url,
    split_options,
)
from m2mwire.reconnect import Reconnect, parse_reconnect
from m2mwire.session.config import CONTROL_MESSAGE_LIMIT, SessionConfig, transport_limit
from m2mwire.session.core import (
    AVP_MORE_KEY,
    AVP_REPLY_TO_KEY,
    AVP_REQUEST_ID_KEY,
    AVP_RESERVED_PREFIX,
    Closed,
    CloseTransport,
    Detached,
    Established,
    HelloReceived,
    Message,
    Resumed,
    ResumeRequested,
    Role,
    SendMessage,
    SentInfo,
    SessionInfo,
    SessionProtocol,
    State,
    Stats,
    closed_error,
    queued_cost,
)
from m2mwire.transport.base import Buffer, Channel, DirectSendChannel, PushChannel

if TYPE_CHECKING:
    import numpy as np  # numpy, protobuf: imported when a tensor or frame is sent, not for text

    from m2mwire.codecs.avp import AVPMessage, AVPMetadata
    from m2mwire.transport.quic import QuicClientConnection

__all__ = ["Server", "ServerStats", "Session", "connect", "open_quic_connection", "serve"]

log = logging.getLogger("m2mwire.session")

_CLOSED = State.CLOSED  # Enum member reads cost ~0.12 us on Python 3.11; _feed runs per message
_CLOSE_RECEIVED = State.CLOSE_RECEIVED
_ALGORITHMS: dict[str, Algorithm] = {a.value: a for a in Algorithm}
_MAX_OUTPUT_BACKLOG = 64  # queued control messages (PONGs, ...) before we stop reading the peer
_QUIC_CLIENT_OPTIONS = ("cafile", "cadata", "fingerprint", "insecure", "server_name", "idle_timeout")
_ENDED_IDS_KEPT = 10_000  # ids of ended resumable sessions a server remembers (RESUME_EXPIRED vs _UNKNOWN)


class _HandedOver(M2MError):
    """Server: this connection's resuming HELLO moved it to the session it resumes."""


def _ignore(_arg: object) -> None:
    """Callbacks of a channel the session left: it is aborted, what it still says is moot."""


class Session:
    """One established session: send and receive DATA, then close.

    Obtain one from :func:`connect` (client) or as the argument of a :func:`serve` handler.
    Received messages go channel -> protocol -> inbox, pushed by the channel where it can (WebSocket)
    or pulled by a reader task (QUIC). ``send()`` writes its own message in the caller's task (under
    a write lock, so output stays in protocol order); what receiving or a timer makes the protocol
    say (PONG, CLOSE acknowledgements) is written by a writer task. Receiving never waits for a
    write, so a full-duplex exchange cannot deadlock on control messages.
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
        self._resume_reading = asyncio.Event()  # set while we read (pull-mode reader waits on it)
        self._resume_reading.set()
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
        self._push = False  # messages arrive through _feed callbacks rather than a reader task
        self._send_now = channel.send_now if isinstance(channel, DirectSendChannel) else None
        self._paused = False  # we stopped reading on purpose (see _update_reading)
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
        self._reopen: Callable[[], Awaitable[Channel]] | None = None
        self._reconnecting: asyncio.Task[None] | None = None
        self._resumer: Callable[[Session, ResumeRequested], None] | None = None
        self._handed_over = False
        self._handed_to: Session | None = None
        self._space_waiters: list[asyncio.Future[None]] = []
        self._attached = asyncio.Event()  # set while the session has a live connection
        self._attached.set()
        self._outcome: asyncio.Future[str] | None = None  # client: how a resume attempt ended
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
        if resume is not None and resume.full:
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
            if extra and any(key.startswith(AVP_RESERVED_PREFIX) for key in extra):
                raise EncodeError(
                    f"extra= keys starting with {AVP_RESERVED_PREFIX!r} are reserved for m2mwire's "
                    "request correlation; rename them (a received message's .extra leaves them out)"
                )
            if request_id is not None or reply_to is not None:
                if not is_ndarray(content):
                    raise EncodeError(
                        "requests and replies carry AVP content as a numpy tensor (its correlation "
                        "ids go in the frame's extra map), not as an already-encoded frame"
                    )
                extra = dict(extra or {})
                if request_id is not None:
                    extra[AVP_REQUEST_ID_KEY] = request_id
                if reply_to is not None:
                    extra[AVP_REPLY_TO_KEY] = reply_to
                    extra[AVP_MORE_KEY] = "1" if more else "0"
            sent = self._protocol.send_frame(self._avp_parts(content, extra), now)
        protocol = self._protocol
        if self._send_now is not None and not self._writing and not self._transport_closed:
            # Nothing queued before us and nobody writing: write synchronously if the channel can.
            out = protocol.sole_output()
            if isinstance(out, SendMessage) and self._send_now(out.message):
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
        loses nothing. Bounded: a detached session ends after resume_window (server) or
        max_elapsed (client); connected, each round trip gets close_timeout."""
        protocol = self._protocol
        resume = protocol.resume
        timeout = protocol.config.timers.close_timeout
        while resume is not None and resume.acked < resume.sent and not self._closed.is_set():
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
        while not inbox:
            await self._inbox_waiter()
        message = inbox.popleft()
        self._inbox_bytes -= queued_cost(message)
        if self._paused:
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

    async def _close(self, reason: str, code: str = "NORMAL", *, wait_resume: bool = True) -> None:
        if wait_resume and self._protocol.resume is not None:
            await self._deliver_retained()
        timeout = self._protocol.config.timers.close_timeout
        self._closing = True
        self._update_reading()  # the acknowledgement must be readable even if the inbox is full
        if self._protocol.state is not State.CLOSED:
            self._protocol.close(self._loop.time(), reason, code=code)
            self._after_protocol_step()
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
        self._push = isinstance(self._channel, PushChannel)
        self._start_reading(self._channel)
        self._after_protocol_step()
        await self._write_pending()
        try:
            return await self._established
        except BaseException:
            await self._shutdown()
            raise

    def _start_reading(self, channel: Channel) -> None:
        """Feed what ``channel`` receives to the protocol; its loss counts only while it is ours."""
        if self._push:
            cast(PushChannel, channel).start_push(self._feed, functools.partial(self._channel_lost, channel))
            if self._paused:
                cast(PushChannel, channel).pause_reading()
        else:
            self._tasks.append(asyncio.create_task(self._reader(channel), name="m2mwire-reader"))

    def _channel_lost(self, channel: Channel, exc: TransportError) -> None:
        if channel is self._channel and not self._handed_over:
            self._on_transport_closed(exc)

    def _drop_channel(self) -> None:
        """Abort the current channel and stop listening to it (resume: the session outlives it)."""
        channel = self._channel
        if self._push:
            cast(PushChannel, channel).start_push(_ignore, _ignore)
        self._abort_channel()
        if not self._channel_done.done():
            self._channel_done.set_result(None)

    def _use_channel(self, channel: Channel) -> None:
        self._channel = channel
        if not any(t.get_name() == "m2mwire-writer" and not t.done() for t in self._tasks):
            # The writer ends with its channel (see _writer): a resumed session needs a new one.
            self._tasks = [t for t in self._tasks if not t.done()]
            self._tasks.append(asyncio.create_task(self._writer(), name="m2mwire-writer"))
        if self._channel_done.done():
            self._channel_done = self._loop.create_future()
        self._transport_closed = False
        self._send_now = channel.send_now if isinstance(channel, DirectSendChannel) else None
        info = self._protocol.info
        if info is not None and info.max_payload:
            channel.set_max_message_size(transport_limit(info.max_payload))

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
                task.cancel()  # the reader waits in recv(): cancelling there consumes nothing
        if self._timer_handle is not None:
            self._timer_handle.cancel()
            self._timer_handle = self._timer_at = None
        if not self._established.done():
            self._established.set_exception(_HandedOver("moved to the resumed session"))
        return self._channel

    async def _reconnect_loop(self) -> None:
        """Client: open new connections (backoff with jitter) until the session resumes, the
        server refuses, or max_elapsed passes (RECONNECT_GAVE_UP)."""
        policy, reopen, protocol = self._reconnect, self._reopen, self._protocol
        assert policy is not None and reopen is not None
        loop = self._loop
        give_up_at = loop.time() + policy.max_elapsed
        delays = policy.delays()
        attempts = 0
        while protocol.detached:
            attempts += 1
            try:
                async with asyncio.timeout(max(0.0, give_up_at - loop.time())):
                    channel = await reopen()
            except (OSError, M2MError, TimeoutError) as exc:
                log.info("session %s: reconnect attempt %d failed: %s", protocol.session_id, attempts, exc)
            else:
                self._outcome = loop.create_future()
                self._use_channel(channel)
                protocol.begin_resume(loop.time())
                self._start_reading(channel)
                self._after_protocol_step()
                self._writer_wakeup.set()
                if await self._outcome != "detached":
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
            from m2mwire import avp  # local: keeps numpy/protobuf work off the import path of text users

            if self._avp_metadata is None:
                # Built once per session: identical metadata keeps encode_parts on its fast path.
                info = self.info
                identity = self._protocol.config.identity
                self._avp_metadata = avp.AVPMetadata(
                    session_id=info.session_id,
                    source_agent_id=self._protocol.config.agent_id,
                    target_agent_id=info.peer_agent_id,
                    model_id=identity.model_id if identity is not None else "",
                    hidden_dim=identity.hidden_dim if identity is not None else 0,
                    num_layers=identity.num_layers if identity is not None else 0,
                    mode=avp.CommunicationMode.LATENT,
                    avp_map_id=info.avp_map_id,
                )
            if extra:
                # A metadata of its own: the session's cached one stays on encode_parts' fast path.
                return avp.encode_parts(content, dataclasses.replace(self._avp_metadata, extra=extra))
            return avp.encode_parts(content, self._avp_metadata)
        avp_module = sys.modules.get("m2mwire.codecs.avp")  # an AVPMessage exists only once it is loaded
        if avp_module is not None and isinstance(content, avp_module.AVPMessage):
            return (content.raw,)
        raise EncodeError(
            f"send() takes str, dict, list, a numpy array, an AVPMessage or AVP frame bytes, "
            f"not {type(content).__name__}"
        )

    def _after_protocol_step(self) -> None:
        """Collect events and re-arm the timer after the protocol was fed something."""
        protocol = self._protocol
        while (event := protocol.next_event()) is not None:
            if isinstance(event, Established):
                # Raise the channel's limit from the handshake's (control messages only) to the
                # negotiated one now, before the peer's first DATA is read.
                self._channel.set_max_message_size(transport_limit(event.info.max_payload))
                self._opened_at = self._loop.time()
                _log_opened(event.info, self._channel.remote_address)
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
        self._resumer(self, event)
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
            _log_closed(self._protocol.info, event, self.stats, self._loop.time() - self._opened_at)
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
                while (out := self._protocol.next_output()) is not None:
                    if isinstance(out, CloseTransport):
                        await self._close_channel(out.code, out.reason)
                    elif not self._transport_closed:
                        channel = self._channel
                        try:
                            if (task := self._start_write(out.message)) is not None:
                                await asyncio.shield(task)
                        except TransportError as exc:
                            if channel is self._channel:
                                self._on_transport_closed(exc)
                    if self._paused:
                        self._update_reading()
            finally:
                self._writing = False

    def _start_write(self, message: str | Sequence[Buffer]) -> asyncio.Task[None] | None:
        """Start channel.send(message) such that cancelling the caller never cuts a message in half;
        returns None when it is done, or the task that finishes it (await it through shield()).

        The send runs in the caller's task up to its first wait, so a write that need not wait
        costs nothing extra (no task, no loop turn). One that must wait (the peer reads slowly)
        goes on in a task of its own: a cancelled caller then leaves it running (the next write
        waits for it), and the write_timeout timer drops a peer that lets it wait too long.
        """
        channel = self._channel
        coro = channel.send(message)
        try:
            waiting_on = coro.send(None)
        except StopIteration:
            return None
        task = self._loop.create_task(_resume(coro, waiting_on))
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

    def _feed(self, data: str | bytes) -> None:
        """One received message: through the protocol, into the inbox; pause reading when full."""
        proto = self._protocol
        if proto.state is _CLOSED:
            return
        try:
            if isinstance(data, str):
                message = proto.receive_text(data, self._loop.time())
            else:
                message = proto.receive_binary(data, self._loop.time())
            if message is not None:  # DATA, and nothing else happened: no event, output or timer
                if proto.resume is not None and proto.has_output:
                    self._writer_wakeup.set()  # an ACK (resume) is the one output DATA may cause
                if message.reply_to is not None:  # an answer to one of our requests
                    self._correlator.route(message)
                    correlator = self._correlator
                    if (
                        correlator.buffered >= self._max_queue
                        or correlator.buffered_bytes >= self._max_queue_bytes
                    ):
                        self._update_reading()
                    return
                inbox = self._inbox
                inbox.append(message)
                self._inbox_bytes += queued_cost(message)
                if self._receivers:
                    self._wake_receivers()
                if (
                    self._paused
                    or len(inbox) >= self._max_queue
                    or self._inbox_bytes >= self._max_queue_bytes
                ):
                    self._update_reading()
                return
            self._after_protocol_step()
            backlog = proto.output_backlog
            if backlog:
                self._writer_wakeup.set()  # PONG, CLOSE acknowledgement, REJECT, ...
            if (
                self._paused
                or len(self._inbox) >= self._max_queue
                or self._inbox_bytes >= self._max_queue_bytes
                or backlog > _MAX_OUTPUT_BACKLOG
            ):
                self._update_reading()  # only then can it change anything
        except Exception:  # a bug must not leave the application waiting forever
            log.exception("session failed to process a message")
            self._abort_channel()
            self._on_transport_closed(TransportError("internal error while processing a message"))

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
            )
        else:
            pause = (
                len(self._inbox) + self._correlator.buffered >= self._max_queue
                or self._inbox_bytes + self._correlator.buffered_bytes >= self._max_queue_bytes
                or self._protocol.output_backlog > _MAX_OUTPUT_BACKLOG
            )
        if pause == self._paused:
            return
        self._paused = pause
        if pause:
            self._resume_reading.clear()
        else:
            self._resume_reading.set()
        if self._push and not self._transport_closed:
            channel = cast(PushChannel, self._channel)  # _push is set only for PushChannels
            if pause:
                channel.pause_reading()
            else:
                channel.resume_reading()

    async def _reader(self, channel: Channel) -> None:
        """Pull-mode channels (e.g. QUIC): read, feed, and stop reading while the inbox is full."""
        while self._protocol.state is not State.CLOSED and channel is self._channel and not self._handed_over:
            await self._resume_reading.wait()
            try:
                data = await channel.recv()
            except TransportError as exc:
                self._channel_lost(channel, exc)
                return
            if channel is not self._channel or self._handed_over:
                return  # the session moved on: this channel is aborted, what it says is moot
            self._feed(data)

    def _on_transport_closed(self, exc: TransportError) -> None:
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
        await self._close_channel(1000, "")
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
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None
        if self._push:
            cast(PushChannel, self._channel).start_push(_ignore_message, _ignore_loss)


def _log_opened(info: SessionInfo, remote: str) -> None:
    if log.isEnabledFor(logging.INFO):
        log.info(
            "session %s opened (%s, peer %s %s at %s): algorithms %s, encoding %s, mode %s",
            info.session_id,
            info.role.value,
            info.peer_agent_type[:64],
            info.peer_agent_id[:64],
            remote,
            ",".join(a.value for a in info.algorithms),
            info.encoding.value,
            info.mode,
        )


def _log_closed(info: SessionInfo, event: Closed, stats: Stats, duration: float) -> None:
    if log.isEnabledFor(logging.INFO):
        log.info(
            "session %s closed: %s%s%s after %.1f s; sent %d messages (%d -> %d bytes), "
            "received %d (%d -> %d bytes), saving %.0f%%",
            info.session_id,
            event.code,
            " by peer" if event.by_peer else "",
            f" ({event.reason[:200]})" if event.reason else "",
            duration,
            stats.messages_sent,
            stats.original_bytes_sent,
            stats.wire_bytes_sent,
            stats.messages_received,
            stats.wire_bytes_received,
            stats.original_bytes_received,
            100 * stats.saving,
        )


async def _warm_tokenizers(info: SessionInfo, config: SessionConfig) -> None:
    """Build the tokenizers this session will use before the application's first send: a build
    takes ~0.2 s, which would otherwise stall the event loop (and every session on it) at the
    first TokenNative message. It runs in a worker thread, once per process and encoding."""
    from m2mwire.codecs import Encoding
    from m2mwire.codecs.tokenizers import is_loaded, preload

    wanted = []
    if Algorithm.TOKENNATIVE in info.algorithms:
        wanted.append(info.encoding)
    if config.token_stats:
        wanted.append(Encoding.CL100K)
    missing = [e for e in wanted if not is_loaded(e)]
    if missing:
        try:
            await asyncio.to_thread(preload, missing)
        except M2MError as exc:  # e.g. TokenizerUnavailable: the first send reports it properly
            log.debug("could not preload tokenizers %s: %s", missing, exc)


def _ignore_message(_message: str | bytes) -> None:
    """What a finished session's channel delivers to (nothing can arrive: it is closed)."""


def _ignore_loss(_error: TransportError) -> None:
    """See _ignore_message."""


class _Resume:
    """Awaitable that drives a coroutine which already suspended once, on ``waiting_on``.

    What a Task does for a coroutine, from its second step on: it lets _start_write run a send
    in the caller's task until it must wait, and only then move it into a task of its own.
    """

    def __init__(self, coro: Coroutine[Any, Any, None], waiting_on: Any) -> None:
        self._coro = coro
        self._waiting_on = waiting_on

    def __await__(self) -> Generator[Any, Any, None]:
        coro, pending = self._coro, self._waiting_on
        while True:
            try:
                try:
                    yield pending  # the future the coroutine waits on (or None: one loop turn)
                except BaseException as exc:  # e.g. the task was cancelled at shutdown
                    pending = coro.throw(exc)
                else:
                    pending = coro.send(None)
            except StopIteration:
                return


async def _resume(coro: Coroutine[Any, Any, None], waiting_on: Any) -> None:
    await _Resume(coro, waiting_on)


# ---------------------------------------------------------------------------------------------
# URLs and options


async def _open_channel(ep: Endpoint, config: SessionConfig, topts: dict[str, Any]) -> Channel:
    # Only control messages (ACCEPT, REJECT) until the session is established; the Session then
    # raises the limit to the negotiated max_payload.
    max_size = CONTROL_MESSAGE_LIMIT
    if ep.scheme == "nats":
        from m2mwire.transport.nats.service import open_nats_channel

        return await open_nats_channel(
            ep.url, max_message_size=max_size, options=topts, open_timeout=topts.get("open_timeout", 10.0)
        )
    if ep.scheme in ("ws", "wss"):
        from m2mwire.transport.websocket import connect_websocket

        ssl_ctx = topts.get("ssl")
        if ep.scheme == "wss" and ssl_ctx is None:
            ssl_ctx = _client_ssl(topts)
        kwargs: dict[str, Any] = {"max_message_size": max_size, "ssl": ssl_ctx}
        if ep.scheme == "wss" and topts.get("fingerprint"):
            kwargs["fingerprint"] = topts["fingerprint"]
        if "open_timeout" in topts:
            kwargs["open_timeout"] = topts["open_timeout"]
        if config.token is not None:
            # Also on the upgrade, so an HTTP proxy or gateway in front can authenticate it.
            kwargs["additional_headers"] = {"Authorization": f"Bearer {config.token}"}
        return await connect_websocket(ep.url, **kwargs)
    from m2mwire.transport.quic import QuicClientConnection, open_quic_channel

    shared = topts.get("connection")
    if shared is not None:
        if not isinstance(shared, QuicClientConnection):
            raise TypeError("connection= takes a connection from m2mwire.open_quic_connection()")
        # open_timeout also bounds the wait for a free stream when the connection has none left.
        return await shared.open_channel(max_message_size=max_size, timeout=topts.get("open_timeout"))
    qopts = {k: v for k, v in topts.items() if k in _QUIC_CLIENT_OPTIONS}
    if "open_timeout" in topts:
        qopts["connect_timeout"] = topts["open_timeout"]
    return await open_quic_channel(ep.host, ep.port, max_message_size=max_size, **qopts)


async def open_quic_connection(url: str, **options: Any) -> QuicClientConnection:
    """Open one QUIC connection to share between sessions: ``connect(url, connection=conn)``.

    Options: cafile, cadata, fingerprint, insecure, server_name, idle_timeout, max_payload (the
    default incoming message limit of its channels). Close it with ``await conn.close()``.
    """
    from m2mwire.codecs.limits import MiB
    from m2mwire.transport.quic import connect_quic

    ep = parse_url(url)
    if ep.scheme != "quic":
        raise ValueError(f"open_quic_connection() needs a quic:// URL, not {url!r}")
    unknown = set(options) - {*_QUIC_CLIENT_OPTIONS, "max_payload"}
    if unknown:
        raise TypeError(f"unknown option(s) for open_quic_connection(): {', '.join(sorted(unknown))}")
    max_size = options.pop("max_payload", 16 * MiB)
    return await connect_quic(ep.host, ep.port, max_message_size=max_size, **options)


def _client_ssl(topts: dict[str, Any]) -> ssl_module.SSLContext:
    from m2mwire.transport.tls import client_ssl_context

    return client_ssl_context(
        cafile=topts.get("cafile"),
        cadata=topts.get("cadata"),
        fingerprint=topts.get("fingerprint"),
        insecure=bool(topts.get("insecure", False)),
        target="wss:// server",
    )


class connect:
    """Open a client session: ``async with m2mwire.connect("ws://host:port") as session: ...``.

    Also awaitable: ``session = await m2mwire.connect(url)`` (then ``await session.close()``).
    Options: algorithms, encodings, preferred_encoding, identity, max_payload, timers (a Timers or a
    dict), optimize, token_stats, agent_id, agent_type, limits, max_queue, max_queue_bytes; transport
    options: ssl (an SSLContext for wss://), cafile/cadata/fingerprint/insecure (TLS verification for
    wss:// and quic://), server_name, open_timeout, idle_timeout (QUIC), connection (a QUIC
    connection from :func:`open_quic_connection`, to run several sessions over one connection).

    ``reconnect=True`` (or a dict, or :class:`m2mwire.Reconnect`): once established, the session
    outlives its connections: on a loss (or unanswered PINGs) it reconnects with exponential
    backoff and jitter and resumes, retransmitting what the server did not get; ``send()`` and
    ``recv()`` neither fail nor lose nor duplicate meanwhile (``send()`` waits once
    ``resume_buffer_bytes`` of unacknowledged messages are retained). When resuming is impossible
    the session ends with ``SessionClosed`` whose ``code`` says why: ``RESUME_EXPIRED``,
    ``RESUME_UNKNOWN`` (e.g. the server restarted), ``RESUME_REFUSED`` or ``RECONNECT_GAVE_UP``.
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

    def _new_channel(self) -> Awaitable[Channel]:
        return _open_channel(self._endpoint, self._config, self._topts)

    async def _open(self) -> Session:
        channel = await self._new_channel()
        session = Session(channel, SessionProtocol(Role.CLIENT, self._config))
        if self._reconnect is not None:
            # Only after the first handshake: a first connect() that fails raises as before.
            session._reconnect = self._reconnect
            session._reopen = self._new_channel
        await session._start()
        await _warm_tokenizers(session.info, self._config)
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


Handler = Callable[[Session], Awaitable[None]]

_SUMMED_STATS = (
    "messages_sent",
    "messages_received",
    "original_bytes_sent",
    "wire_bytes_sent",
    "original_bytes_received",
    "wire_bytes_received",
    "original_tokens_sent",
    "wire_tokens_sent",
    "original_tokens_received",
    "wire_tokens_received",
)


@dataclass(slots=True)
class ServerStats:
    """A server's sessions, live and ended: counts and the sums of their :class:`Stats`."""

    sessions_active: int = 0
    sessions_opened: int = 0  # established since the server started
    sessions_refused: int = 0  # HELLOs answered with REJECT (negotiation or admission)
    totals: Stats = dataclasses.field(default_factory=Stats)  # every session's Stats, summed

    @property
    def saving(self) -> float:
        return self.totals.saving


def _add_stats(into: Stats, other: Stats) -> None:
    for name in _SUMMED_STATS:
        setattr(into, name, getattr(into, name) + getattr(other, name))
    for key, count in other.by_algorithm.items():
        into.by_algorithm[key] = into.by_algorithm.get(key, 0) + count


class Server(Listening):
    """A running m2mwire server (WebSocket or QUIC). Use as ``async with serve(...) as server``."""

    def __init__(self, handler: Handler, url: str, options: dict[str, Any]) -> None:
        self._handler = handler
        self._endpoint = parse_url(url)
        options = dict(options)
        if "token" in options:
            raise TypeError(
                "token= is a connect() option (the client's credential); serve() checks it with on_hello="
            )
        self._admission = Admission(
            options.pop("on_hello", None),
            max_sessions=options.pop("max_sessions", None),
            max_sessions_per_peer=options.pop("max_sessions_per_peer", None),
        )
        self._config, self._topts = split_options(options, "serve", self._endpoint)
        self._active: set[str] = set()
        self._sessions: set[Session] = set()
        self._resumable: dict[str, Session] = {}  # established sessions that negotiated resume
        self._ended_ids: OrderedDict[str, str] = OrderedDict()  # recently ended: id -> how
        self._ended = Stats()  # sums over sessions that have ended
        self._opened = self._refused = 0
        self._handler_tasks: set[asyncio.Task[Any]] = set()
        self._impl: Any = None
        self.port = self._endpoint.port
        self.fingerprint: str | None = None

    @property
    def url(self) -> str:
        if self._endpoint.scheme == "nats":
            return self._endpoint.url
        host = self._endpoint.host
        if ":" in host:
            host = f"[{host}]"
        return f"{self._endpoint.scheme}://{host}:{self.port}"

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

    @property
    def stats(self) -> ServerStats:
        """Counts and byte/message sums over this server's sessions (a snapshot)."""
        totals = Stats()
        _add_stats(totals, self._ended)
        for session in self._sessions:
            _add_stats(totals, session.stats)
        return ServerStats(len(self._sessions), self._opened, self._refused, totals)

    def _new_session_id(self) -> str:
        # Unique among this server's live sessions (uuid4 collisions are only theoretical).
        while True:
            sid = str(uuid.uuid4())
            if sid not in self._active:
                self._active.add(sid)
                return sid

    async def _run_session(self, channel: Channel) -> None:
        admission = self._admission
        session = Session(
            channel,
            SessionProtocol(
                Role.SERVER,
                self._config,
                session_id_factory=self._new_session_id,
                admission=admission.active,
            ),
        )
        session._admission = admission
        session._resumer = self._resume
        self._sessions.add(session)
        task = asyncio.current_task()
        if task is not None:
            self._handler_tasks.add(task)  # aclose() cancels a handler that ignores the shutdown
        try:
            try:
                info = await session._start()
            except _HandedOver:
                # The transport closes the connection when this returns: keep it open while
                # the resumed session uses it.
                target = session._handed_to
                assert target is not None
                while target._channel is channel and not target._channel_done.done():
                    await asyncio.shield(target._channel_done)
                return
            except M2MError as exc:
                if isinstance(exc, SessionRejected):
                    self._refused += 1
                log.info("session from %s not established: %s", channel.remote_address, exc)
                return
            self._opened += 1
            if session._protocol.resume is not None:
                self._resumable[info.session_id] = session
            await _warm_tokenizers(info, self._config)
            try:
                with tracing.use(session._span):  # the handler's own spans join the session's trace
                    await self._handler(session)
            except M2MError as exc:
                if session.close_event is None:
                    raise  # not the session's end: the handler's own failure
                # The session ended under the handler (peer gone, timeout, ...): not a server bug.
                log.info("session %s ended in handler: %s", info.session_id, exc)
            await session.close()
        except Exception as exc:
            log.exception("session handler failed for session %s", session._protocol.session_id or "-")
            # Tell the peer the session failed (not a clean end): CLOSE INTERNAL_ERROR, then 1011.
            await session._close(f"the server's handler failed ({type(exc).__name__})", "INTERNAL_ERROR")
        finally:
            self._forget_resumable(session)
            if task is not None:
                self._handler_tasks.discard(task)
            self._sessions.discard(session)
            _add_stats(self._ended, session.stats)
            if session._protocol.session_id is not None:
                self._active.discard(session._protocol.session_id)
            await session._shutdown()
            if session._admitted_host is not None:
                admission.release(session._admitted_host)
                session._admitted_host = None

    def _forget_resumable(self, session: Session) -> None:
        sid = session._protocol.session_id
        if sid is None or self._resumable.get(sid) is not session:
            return
        del self._resumable[sid]
        closed = session._protocol.closed
        self._ended_ids[sid] = closed.code if closed is not None else "NORMAL"
        while len(self._ended_ids) > _ENDED_IDS_KEPT:
            self._ended_ids.popitem(last=False)

    def _resume(self, fresh: Session, request: ResumeRequested) -> None:
        """A fresh connection's HELLO resumes ``request.session_id``: move the connection to that
        session, or answer REJECT with why not. The token is compared in constant time; an
        unknown id and a wrong token are told apart only by someone holding the right token."""
        target = self._resumable.get(request.session_id)
        if target is None or target._protocol.state is State.CLOSED:
            ended = self._ended_ids.get(request.session_id)
            if ended == "RESUME_EXPIRED":
                fresh._protocol.refuse_resume(
                    "RESUME_EXPIRED",
                    f"the session waited {self._config.resume_window:g} s (resume_window) and ended",
                )
            elif ended is not None:
                fresh._protocol.refuse_resume("RESUME_UNKNOWN", f"the session has ended ({ended})")
            else:
                fresh._protocol.refuse_resume(
                    "RESUME_UNKNOWN", "this server does not know the session (it may have restarted)"
                )
            return
        if not target._protocol.resume_token_matches(request.token):
            fresh._protocol.refuse_resume("RESUME_REFUSED", "wrong resume token for this session")
            return
        channel = fresh._hand_over(target)
        target._take_over(channel, request.received)

    async def start(self) -> Server:
        ep = self._endpoint
        if ep.scheme == "nats":
            from m2mwire.transport.nats.service import serve_nats

            self._impl = await serve_nats(
                self._run_session, ep.url, max_message_size=CONTROL_MESSAGE_LIMIT, options=self._topts
            )
            return self
        if ep.scheme in ("ws", "wss"):
            from m2mwire.transport.websocket import serve_websocket

            ssl_ctx = self._topts.get("ssl")
            if ep.scheme == "wss" and ssl_ctx is None:
                ssl_ctx, self.fingerprint = _server_ssl(self._topts)
            # Until a session is established only control messages arrive (see transport_limit).
            reuse = {"reuse_port": True} if self._topts.get("reuse_port") else {}
            self._impl = await serve_websocket(
                self._run_session,
                ep.host,
                ep.port,
                max_message_size=CONTROL_MESSAGE_LIMIT,
                ssl=ssl_ctx,
                **reuse,
            )
            self.port = self._impl.sockets[0].getsockname()[1]
        else:
            from m2mwire.transport.quic import serve_quic

            qopts = {
                k: v
                for k, v in self._topts.items()
                if k in ("certfile", "keyfile", "idle_timeout", "reuse_port")
            }
            if "cert_dir" in self._topts and "certfile" not in qopts:
                from m2mwire.transport.tls import persistent_self_signed

                qopts["certfile"], qopts["keyfile"], _ = persistent_self_signed(self._topts["cert_dir"])
            self._impl = await serve_quic(
                self._run_session, ep.host, ep.port, max_message_size=CONTROL_MESSAGE_LIMIT, **qopts
            )
            self.port = self._impl.port
            self.fingerprint = self._impl.fingerprint
        return self

    def close(self) -> None:
        if self._impl is not None:
            self._impl.close()

    async def wait_closed(self) -> None:
        if self._impl is not None:
            await self._impl.wait_closed()

    async def aclose(self) -> None:
        """Close every live session (CLOSE handshake), then stop the listener and wait for it.

        Takes at most about ``close_timeout``: sessions close concurrently (each within
        close_timeout), then a handler still running on its closed session is cancelled.
        Sessions go first: a QUIC server's close ends its connections at once, which would cut
        the CLOSE exchange short.
        """
        timeout = self._config.timers.close_timeout
        closing = [s._close("server shutting down", wait_resume=False) for s in list(self._sessions)]
        if closing:
            # Session.close() bounds itself; this only guards the sum of its steps.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout + 0.5):
                    await asyncio.gather(*closing, return_exceptions=True)
        # Handlers get a moment to notice their session ended; one that ignores it is cancelled,
        # otherwise the listener's wait_closed() would wait for it forever.
        handlers = [t for t in self._handler_tasks if not t.done()]
        if handlers:
            _, pending = await asyncio.wait(handlers, timeout=0.1)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=1.0)
        self.close()
        await self.wait_closed()


def _server_ssl(topts: dict[str, Any]) -> tuple[ssl_module.SSLContext, str | None]:
    from m2mwire.transport import tls

    certfile, keyfile = topts.get("certfile"), topts.get("keyfile")
    if certfile is not None:
        return load_server_certificate(certfile, keyfile), None
    if topts.get("cert_dir") is not None:
        certfile, keyfile, fingerprint = tls.persistent_self_signed(topts["cert_dir"])
        return tls.server_ssl_context(certfile, keyfile), fingerprint
    cert = tls.generate_self_signed()
    certfile, keyfile = cert.write_temp_files()
    log.warning(
        "wss:// server uses a generated self-signed certificate, SHA-256 fingerprint %s", cert.fingerprint
    )
    return tls.server_ssl_context(certfile, keyfile), cert.fingerprint


def serve(handler: Handler, url: str, **options: Unpack[ServeOptions]) -> Server:
    """Serve sessions: ``async with m2mwire.serve(handler, "ws://127.0.0.1:0") as server: ...``.

    ``handler(session)`` runs once per established session; when it returns, the session is closed.
    Same session options as :func:`connect`; transport options: ssl (wss://), certfile/keyfile (TLS
    for wss:// and quic://; without them a self-signed certificate is generated and its
    fingerprint logged and exposed as ``server.fingerprint``), cert_dir (wss:// and quic://: keep
    that generated certificate in this directory, so its fingerprint survives restarts),
    idle_timeout (QUIC, default 20 s).

    Resume (docs/PROTOCOL.md "Resume"): a client that connected with ``reconnect=`` and lost its
    connection may come back within ``resume_window`` seconds (default 60; 0 turns resume off);
    meanwhile the handler's ``recv()`` waits and its ``send()`` retains up to
    ``resume_buffer_bytes`` (default 16 MiB), then waits. After the window ``recv()`` raises
    ``SessionClosed(code="RESUME_EXPIRED")``.
    """
    return Server(handler, url, dict(options))
