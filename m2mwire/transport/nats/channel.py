"""One session's channel over NATS: two subjects, chunking, credit, in-order exactly-once delivery.

The channel implements the push interface the session uses (``start_push``, ``pause_reading``,
``resume_reading``): the bus hands each NATS message to :meth:`NatsChannel.on_nats` from its one
subscription callback, and whole messages go straight to the session. While the session pauses
reading, in-order NATS messages are held here and no credit is granted for them, so the peer's
sender stops within one window: memory per channel is bounded by the window plus one message
being reassembled (itself bounded by the session's max_payload, checked before buffering).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import struct
from collections import deque
from collections.abc import Callable

from nats.errors import ConnectionClosedError, OutboundBufferLimitError
from nats.errors import Error as NatsError

from m2mwire.errors import TransportError
from m2mwire.schemas.codes import CloseCode
from m2mwire.transport.base import Message, OnMessage, OutgoingMessage
from m2mwire.transport.nats import compat
from m2mwire.transport.nats import frames as f
from m2mwire.transport.nats.bus import Bus, release_bus
from m2mwire.transport.nats.flow import GAP, OVER_CREDIT, Receiver, Sender
from m2mwire.transport.nats.options import valid_subject

__all__ = ["NatsChannel"]

log = logging.getLogger("m2mwire.nats")

OnLost = Callable[[TransportError], None]

_PULL_MAX = 16  # messages buffered for recv() (before start_push) before we stop taking more
_RESYNC_EVERY = 0.25  # seconds between two resend requests for the same gap
# NATS drops what it cannot deliver, a CREDIT too (see _announce_credit and _wait_credit):
_ANNOUNCE_EVERY = 0.25  # seconds between two credit re-announcements a peer asked for
_RESEND_EVERY = 0.25  # seconds between two resends of our unacknowledged messages a peer asked for
# ... doubling up to this while the peer's acknowledgement does not move between them: a peer
# that asked for resends 10 times a second and acknowledged nothing had a worker publish its
# whole window 4 times a second for as long as it liked (stop 31's attack run: 6 such channels,
# 24 KB sent in 20 s, took 13.5 s of a worker's CPU).
_RESEND_MAX_EVERY = 8.0
_ASK_CREDIT_AFTER = 1.0  # seconds a send waits for credit before asking the peer for it (again)
# NATS drops a DATA message too, and when it was the last one sent no later one shows the gap:
_ASK_ACK_AFTER = 1.0  # seconds without acknowledgement progress before the sender asks (see _check_acked)
_MISSED_PROBES = 3  # "no responders" answers in a row that mean the peer is gone
_CLOSE_COST = 600  # a CLOSE frame's cost against credit (its reason is cut at 512 bytes)
_HEAD = f.HEADER.size
_SEQUENCED = f.SEQUENCED
_unpack_head = f.HEADER.unpack_from
_FIRST_HEAD = _HEAD + f.TOTAL.size


class _Paced:
    """Run ``action`` when asked, at most once per ``every`` seconds. What a peer can make us send
    is bounded this way: a request that comes sooner is deferred, never dropped (it may be the one
    that matters), and the requests made meanwhile share that one run."""

    def __init__(self, loop: asyncio.AbstractEventLoop, every: float, action: Callable[[], None]) -> None:
        self._loop, self.every, self._action = loop, every, action
        self._last = -math.inf
        self._handle: asyncio.TimerHandle | None = None  # one deferred run, at most

    def request(self) -> None:
        if self._handle is not None:
            return  # one is due already
        wait = self._last + self.every - self._loop.time()
        if wait > 0:
            self._handle = self._loop.call_later(wait, self._run)
        else:
            self._run()

    def _run(self) -> None:
        self._handle = None
        self._last = self._loop.time()
        self._action()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class NatsChannel:
    """A :class:`~m2mwire.transport.base.PushChannel` and
    :class:`~m2mwire.transport.base.DirectSendChannel` over one NATS connection shared by many."""

    def __init__(
        self,
        bus: Bus,
        in_subject: str,
        *,
        max_message_size: int,
        window: int,
        remote_address: str,
        probe_interval: float,
    ) -> None:
        self._bus = bus
        self._nc = bus.nc
        self._loop = asyncio.get_running_loop()
        self.in_subject = in_subject
        self._out = ""  # the peer's subject, known once OPEN/OPEN_OK was exchanged
        self._max = max_message_size
        self._remote = remote_address
        self._receiver = Receiver(window)
        self._sender = Sender(0)
        self._chunk = 0
        # whole messages (and whether each is text) for recv(), before start_push
        self._early: deque[tuple[Message, bool]] = deque()
        self._held: deque[bytes | bytearray] = deque()  # in-order NATS messages not processed yet (paused)
        self._paused = False
        self._pull_full = False
        self._draining = False
        self._on_message: OnMessage | None = None
        self._on_lost: OnLost | None = None
        self.lost: TransportError | None = None
        self._waiter: asyncio.Future[None] | None = None  # recv() waiting
        self._credit_waiter: asyncio.Future[None] | None = None  # a send waiting for credit
        self._send_lock = asyncio.Lock()
        self._resend = False  # everything unacknowledged must go out again (reconnect, gap)
        self._resync_at = -math.inf
        self._announcer = _Paced(self._loop, _ANNOUNCE_EVERY, self._send_credit)  # our credit, again
        self._ack_handle: asyncio.TimerHandle | None = None  # armed while messages are unacknowledged
        self._ack_mark = 0  # the oldest unacknowledged sequence number at the last check
        self._peer_resend = _Paced(self._loop, _RESEND_EVERY, self._resend_asked)  # the peer asked (RESYNC)
        # Our sender's acknowledged cost when the peer last had a resend, and what that resend sent.
        self._asked_at_ack = self._asked_resent = 0
        self._parts: bytearray | None = None  # a message being reassembled
        self._parts_total = 0
        self._parts_text = False
        self._probe_interval = probe_interval
        self._probe_handle: asyncio.TimerHandle | None = None
        self._missed_probes = 0
        # A probe was sent this liveness tick and not answered yet: only that answer counts, one
        # per tick. Anyone who may publish to our subject (the peer, or a client where clients
        # share _INBOX.>) can send a headers-only "Status: 503" message; counted as they came,
        # three ended a session at once as "gone for 3 probes 5 s apart". nats-server answers a
        # probe within a round trip, far inside the tick.
        self._probe_waiting = False
        self._heard = False  # anything heard from the peer since the last liveness tick
        self.owns_bus = False  # a client channel holds its own reference to the shared connection
        self.resume_route: str | None = None  # client: the worker's own subject (RoutedChannel)
        self._resender: asyncio.Task[None] | None = None  # resending after a reconnect or a gap
        self._opening: Callable[[NatsChannel], None] | None = None  # see watch_opening
        bus.routes[in_subject] = self

    def watch_opening(self, done: Callable[[NatsChannel], None]) -> None:
        """Call ``done(self)`` once: when the session on this channel is established (the
        session raises the channel's limit from the handshake's then: set_max_message_size), or
        when the channel ends first. Until then the channel is half-open: the worker holds it
        for a NATS message that cost the peer nothing to send (NatsListener bounds how many).
        Not the peer's first message: a PONG (or any message a server answers with nothing)
        before the HELLO took the channel out of the bound, and a flood of OPENs each followed
        by one held ~19 KiB per OPEN until hello_timeout (stop 30's attack run)."""
        self._opening = done

    def _opened(self) -> None:
        done, self._opening = self._opening, None
        if done is not None:
            done(self)

    def connect_peer(self, out_subject: str, peer_window: int) -> None:
        """The peer's subject and initial credit (from OPEN or OPEN_OK). The subject is checked
        here, once for every publish to it (compat.publish_now skips nats-py's own check)."""
        if not valid_subject(out_subject):
            raise ValueError(f"not a concrete NATS subject to publish to: {out_subject[:80]!r}")
        self._out = out_subject
        # The agreed window, the smaller of both ends' (docs/PROTOCOL.md section 5a): what we
        # keep unacknowledged for a resend is bounded by our own window, not by what a peer says.
        window = min(peer_window, self._receiver.window)
        self._sender.limit = peer_window
        self._sender.window = window
        self._chunk = f.chunk_size(self._nc.max_payload, window)
        if self._receiver.narrow(window) is not None:
            self._send_credit()
        if self._probe_interval > 0:
            self._probe_handle = self._loop.call_later(self._probe_interval, self._probe)

    # -- Channel ----------------------------------------------------------------------------------

    @property
    def max_message_size(self) -> int:
        return self._max

    def set_max_message_size(self, size: int) -> None:
        self._max = size
        if self._opening is not None:
            self._opened()  # the session is established (see watch_opening)

    @property
    def remote_address(self) -> str:
        return self._remote

    def send_now(self, message: OutgoingMessage, text: bool = False) -> bool:
        """Publish ``message`` now as one NATS message, or return False having written nothing.

        True only where :meth:`send` would not wait: the peer is known, no send or resend is in
        progress (so order is kept), the message fits one NATS message, the peer's credit covers
        it and nats-py's pending buffer takes it without a forced flush (``compat.publish_now``).
        Anything else (a chunked message, no credit, reconnecting, closed) is :meth:`send`'s job.
        """
        if self.lost is not None or not self._out or self._resend or self._send_lock.locked():
            return False
        view, whole, _ = _body(message, text)
        cost = _HEAD + view.nbytes + f.MESSAGE_COST
        sender = self._sender
        if view.nbytes > self._chunk or not sender.has_credit(cost):
            return False
        seq = sender.next_seq
        head = f.HEADER.pack(whole, seq)
        if not compat.publish_now(self._nc, self._out, head, view):
            return False
        taken = sender.take(cost)
        assert taken == seq
        self._retain(head, view)
        return True

    async def send(self, message: OutgoingMessage, text: bool = False) -> None:
        if self.lost is not None:
            raise self.lost
        view, whole, first = _body(message, text)
        total = view.nbytes
        chunk = self._chunk
        async with self._send_lock:
            if total <= chunk:
                await self._send_sequenced(whole, view)
                return
            # Each chunk waits for its own credit: a message larger than the window still
            # flows, at the pace the receiver grants.
            await self._send_sequenced(first, view[:chunk], f.TOTAL.pack(total))
            for start in range(chunk, total, chunk):
                await self._send_sequenced(f.CONT, view[start : start + chunk])

    async def recv(self) -> str | bytes:
        """The next message, text decoded to ``str``: for a channel used without a session (the
        session takes messages with start_push, as bytes and a text flag)."""
        while not self._early:
            if self.lost is not None:
                raise self.lost
            self._waiter = self._loop.create_future()
            await self._waiter
        message, text = self._early.popleft()
        if self._pull_full and len(self._early) <= _PULL_MAX // 2:
            self._pull_full = False
            self._drain_held()
        return message.decode() if text else message

    async def close(self, code: int = CloseCode.NORMAL, reason: str = "") -> None:
        if self.lost is not None:
            self._unroute()
            return
        try:
            if self._out:
                async with self._send_lock:
                    seq = await self._wait_credit(_CLOSE_COST)
                    payload = f.pack_close(f.CLOSE, seq, code, reason)
                    self._retain(payload)
                    await self._publish(payload, b"")
        finally:
            self._fail(
                TransportError(
                    f"NATS channel closed ({code} {reason})".strip(), code=code, reason=reason, clean=True
                )
            )

    def abort(self, code: int = CloseCode.ABNORMAL, reason: str = "aborted") -> None:
        """Drop the channel at once, telling the peer ``code`` and ``reason`` (ABORT)."""
        if self.lost is not None:
            return
        if self._out:
            self._bus.publish_soon(self._out, f.pack_close(f.ABORT, 0, code, reason))
        self._fail(
            TransportError(f"NATS channel aborted ({code} {reason})", code=code, reason=reason, clean=False)
        )

    # -- PushChannel ------------------------------------------------------------------------------

    def start_push(self, on_message: OnMessage, on_lost: OnLost) -> None:
        while self._early:
            on_message(*self._early.popleft())
        self._on_message = on_message
        self._pull_full = False
        if self.lost is not None:
            on_lost(self.lost)
            return
        self._on_lost = on_lost
        self._drain_held()

    def pause_reading(self) -> None:
        self._paused = True

    def resume_reading(self) -> None:
        self._paused = False
        self._drain_held()

    # -- from the bus -----------------------------------------------------------------------------

    def on_nats(self, data: bytes | bytearray) -> None:
        """One NATS message of this channel; a bytearray is handed over (the caller keeps none)."""
        if self.lost is not None or not data:
            return
        self._heard = True
        self._missed_probes = 0
        kind = data[0]
        try:
            if kind in _SEQUENCED:  # first: nearly every message is one
                verdict = self._receiver.check(_unpack_head(data)[1], len(data) + f.MESSAGE_COST)
            elif kind == f.CREDIT:
                ack, limit, flags = f.unpack_credit(data)
                grew = self._sender.on_credit(ack, limit)
                if flags & f.RESYNC:
                    self._resend_for_peer()
                if flags & f.TAIL and f.unpack_tail(data) > self._receiver.last_in_order:
                    # The peer's last messages never arrived, and nothing after them will show
                    # the gap: ask for everything after our last (the RESYNC says our credit too).
                    self._ask_resend()
                elif flags & (f.RESYNC | f.ASK):
                    self._announce_credit()
                if grew:
                    self._wake_sender()
                return
            elif kind == f.PROBE:
                return
            elif kind == f.ABORT:
                code, reason = f.unpack_close(data)
                self._fail(
                    TransportError(
                        f"the peer dropped the NATS channel ({code} {reason})",
                        code=code,
                        reason=reason,
                        clean=False,
                    )
                )
                return
            else:
                raise ValueError(f"unknown frame kind {kind}")
        except (ValueError, IndexError, struct.error) as exc:
            self._protocol_error(_malformed(kind, data, exc))
            return
        if verdict:
            if verdict == GAP:  # something before it was lost: ask for everything after our last
                self._ask_resend()
            elif verdict == OVER_CREDIT:
                # Held messages are bounded by the window only if this is enforced: a peer that
                # ignored our credit would otherwise fill memory while the session is paused.
                self._protocol_error(
                    f"the peer sent past the credit it was given ({self._receiver.granted} bytes): "
                    "it does not follow the NATS channel's flow control",
                    code=CloseCode.POLICY_VIOLATION,
                )
            return
        if self._paused or self._pull_full or self._held:
            self._held.append(data)
        else:
            self._process(data)

    def on_no_responders(self) -> None:
        if not self._probe_waiting:  # not the answer to a probe of ours
            log.debug("NATS channel %s: a 'no responders' status no probe asked for", self.in_subject)
            return
        self._probe_waiting = False
        self._missed_probes += 1
        if self._missed_probes >= _MISSED_PROBES:
            self._fail(
                TransportError(
                    f"the peer of this NATS session is gone: nothing has listened on its subject for "
                    f"{_MISSED_PROBES} liveness probes {self._probe_interval:g} s apart (its process "
                    "ended or lost its NATS connection)",
                    code=CloseCode.ABNORMAL,
                    reason="peer gone",
                )
            )

    def on_reconnected(self) -> None:
        # Messages in flight through a NATS node that died are lost: ask the peer for everything
        # after the last one we took, and send again everything it has not acknowledged.
        self._resync_at = -math.inf
        self._ask_resend()
        self._request_resend()

    def on_bus_closed(self, error: TransportError) -> None:
        self._fail(error)

    # -- receiving --------------------------------------------------------------------------------

    def _drain_held(self) -> None:
        if self._draining:
            return  # resume_reading() from inside a delivery: the outer loop goes on
        self._draining = True
        try:
            held = self._held
            while held and not self._paused and not self._pull_full and self.lost is None:
                self._process(held.popleft())
        finally:
            self._draining = False

    def _over_limit(self, size: int) -> bool:
        """Whether an incoming message of ``size`` bytes is over the limit; if so the channel
        ends with ABORT 1009 (as a WebSocket endpoint closes 1009 before the session sees it)."""
        if not self._max or size <= self._max:
            return False
        self._protocol_error(
            f"incoming message of {size} bytes is over the limit of {self._max} bytes (max_payload)",
            code=CloseCode.TOO_BIG,
        )
        return True

    def _process(self, data: bytes | bytearray) -> None:
        kind = data[0]
        size = len(data)
        try:
            if kind == f.TEXT or kind == f.BINARY:
                if self._parts is not None:
                    # It would overtake the message being reassembled, which the sender began first.
                    raise ValueError("a whole message arrived inside a chunked one")
                if self._over_limit(size - _HEAD):
                    return  # (in memory already, within the credit: refused as a chunked one is)
                self._deliver(memoryview(data)[_HEAD:], kind == f.TEXT)
            elif kind == f.TEXT_FIRST or kind == f.BINARY_FIRST:
                total = f.TOTAL.unpack_from(data, _HEAD)[0]
                if self._parts is not None:
                    raise ValueError("a new message started before the previous one ended")
                if self._over_limit(total):
                    # Checked before buffering anything: the peer cannot make us hold more than
                    # the limit it was told.
                    return
                if isinstance(data, bytearray):
                    # Handed over to us (see compat.DirectParser): the message is assembled in
                    # place, after the header (deleting a bytearray's head copies nothing).
                    del data[:_FIRST_HEAD]
                    parts = data
                else:
                    parts = bytearray(memoryview(data)[_FIRST_HEAD:])
                self._parts, self._parts_total, self._parts_text = parts, total, kind == f.TEXT_FIRST
                self._check_parts()
            elif kind == f.CONT:
                if self._parts is None:
                    raise ValueError("a continuation without a first chunk")
                self._parts += memoryview(data)[_HEAD:]
                self._check_parts()
            else:  # CLOSE: the peer's last word, after everything it sent before
                code, reason = f.unpack_close(data)
                detail = f"{code} {reason}".strip()
                self._fail(
                    TransportError(
                        f"NATS channel closed by the peer ({detail})",
                        code=code,
                        reason=reason,
                        clean=code in (CloseCode.NORMAL, CloseCode.GOING_AWAY),
                    )
                )
                return
        except (ValueError, IndexError, struct.error) as exc:
            self._protocol_error(_malformed(kind, data, exc))
            return
        limit = self._receiver.consume(size + f.MESSAGE_COST)
        if limit is not None and self._out and self.lost is None:
            self._bus.publish_soon(self._out, f.pack_credit(self._receiver.last_in_order, limit))

    def _check_parts(self) -> None:
        parts = self._parts
        assert parts is not None
        if len(parts) < self._parts_total:
            return
        if len(parts) > self._parts_total:
            raise ValueError("chunks add up to more than the announced size")
        self._parts = None
        self._deliver(parts, self._parts_text)

    def _deliver(self, body: memoryview | bytearray, text: bool) -> None:
        # One copy, straight from the NATS payload or the reassembled chunks; a text message stays
        # bytes too: the session validates its UTF-8 as it parses it.
        message = bytes(body)
        if self._on_message is not None:
            self._on_message(message, text)
            return
        self._early.append((message, text))
        if len(self._early) >= _PULL_MAX:
            self._pull_full = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _ask_resend(self) -> None:
        now = self._loop.time()
        if not self._out or now - self._resync_at < _RESYNC_EVERY:
            return
        self._resync_at = now
        receiver = self._receiver
        self._bus.publish_soon(self._out, f.pack_credit(receiver.last_in_order, receiver.granted, f.RESYNC))

    def _announce_credit(self) -> None:
        """Announce our credit (and acknowledgement) again: the peer reconnected or saw a gap
        (RESYNC), so a CREDIT we sent may have been lost with its data, or its send has waited for
        credit long (ASK). Without this, a lost CREDIT leaves a sender that used its window waiting
        for good while both ends are alive. Credit is cumulative (a limit on the total sent, and
        the last sequence number taken), so announcing it twice changes nothing.

        What a peer can make us send with these flags is bounded: one CREDIT per _ANNOUNCE_EVERY;
        one asked for sooner is deferred, never dropped (dropping it could drop the one that
        matters), and many asked for meanwhile share it (it says the credit current then)."""
        if self.lost is None:
            self._announcer.request()

    def _send_credit(self) -> None:
        if self.lost is not None or not self._out:
            return
        receiver = self._receiver
        self._bus.publish_soon(self._out, f.pack_credit(receiver.last_in_order, receiver.granted))

    def _protocol_error(self, text: str, code: int = CloseCode.PROTOCOL_ERROR) -> None:
        log.warning("NATS session channel from %s: %s", self._remote, text)
        if self._out:
            self._bus.publish_soon(self._out, f.pack_close(f.ABORT, 0, code, text[:120]))
        self._fail(TransportError(text, code=code, reason=text[:120]))

    # -- sending ----------------------------------------------------------------------------------

    async def _send_sequenced(self, kind: int, body: memoryview, prefix: bytes = b"") -> None:
        size = _HEAD + len(prefix) + body.nbytes
        seq = await self._wait_credit(size + f.MESSAGE_COST)
        head = f.HEADER.pack(kind, seq) + prefix
        self._retain(head, body)
        await self._publish(head, body)

    async def _wait_credit(self, cost: int) -> int:
        """Wait until the peer's credit covers ``cost``; returns the message's sequence number.
        Called under the send lock; a pending resend goes out first, so order is kept."""
        sender = self._sender
        while True:
            if self.lost is not None:
                raise self.lost
            if self._resend:
                await self._resend_unacked()
                continue
            if sender.has_credit(cost):
                return sender.take(cost)
            waiter = self._credit_waiter = self._loop.create_future()
            while not waiter.done():
                await asyncio.wait((waiter,), timeout=_ASK_CREDIT_AFTER)
                if not waiter.done() and self.lost is None and self._out:
                    # The CREDIT that would let us go on may have been lost (by NATS, with no
                    # reconnect to tell: a route between cluster nodes that failed): ask the peer
                    # to announce its credit again (it does, at most every _ANNOUNCE_EVERY). Our
                    # own acknowledgement and credit go with the question, as in every CREDIT;
                    # our last sequence number too: credit withheld because our last messages
                    # were lost (so never consumed) is made good by their resend.
                    self._ask_ack()

    async def _publish(self, head: bytes, body: bytes | memoryview) -> None:
        if compat.publish_now(self._nc, self._out, head, body):
            return  # queued without waiting; else publish() waits for room, or fails
        try:
            await self._nc.publish(self._out, b"".join((head, body)))
        except OutboundBufferLimitError:
            # Reconnecting and nats-py's buffer is full: the message is retained, and goes out
            # again with everything unacknowledged once the connection is back.
            self._resend = True
            await self._until_reconnected()
            if self.lost is not None:
                raise self.lost from None
        except (ConnectionClosedError, NatsError) as exc:
            err = TransportError(f"NATS connection unusable: {exc or type(exc).__name__}")
            self._fail(err)
            raise err from exc

    async def _until_reconnected(self) -> None:
        """Wait until the shared connection is back, or this channel has failed: abort() must
        end a waiting send now (the session resumes on another channel), not once this connection
        is back, if it ever is. Called under the send lock, so the credit waiter slot is free."""
        failed = self._credit_waiter = self._loop.create_future()  # _fail() resolves it
        back = self._loop.create_task(self._bus.reconnected.wait())
        try:
            await asyncio.wait((failed, back), return_when=asyncio.FIRST_COMPLETED)
        finally:
            back.cancel()

    def _resend_for_peer(self) -> None:
        """The peer asked (RESYNC) for everything we have not had acknowledged. Each ask costs it
        an 18-byte CREDIT and could cost us a window, so we resend at most once per
        _RESEND_EVERY: one asked for sooner is deferred, never dropped (it may be the one that
        matters), and the asks meanwhile share it (each resend sends everything unacknowledged)."""
        if self.lost is None:
            self._peer_resend.request()

    def _resend_asked(self) -> None:
        """A resend the peer asked for is due. Its pacing doubles (up to _RESEND_MAX_EVERY)
        unless the peer acknowledged at least half of what the previous one sent, and starts
        again at _RESEND_EVERY when it has: an honest peer that lost a message takes the resend
        and acknowledges it. (Any progress at all was enough at first: a peer acknowledging one
        more message per RESYNC kept a worker resending its window every 0.25 s.)"""
        sender = self._sender
        acked = sender.acked
        paced = self._peer_resend
        took = acked - self._asked_at_ack
        paced.every = (
            _RESEND_EVERY if 2 * took >= self._asked_resent else min(paced.every * 2, _RESEND_MAX_EVERY)
        )
        self._asked_at_ack = acked
        self._asked_resent = max(1, sender.sent - acked)  # what this resend sends (its cost)
        self._request_resend()

    def _request_resend(self) -> None:
        self._resend = True
        if self._send_lock.locked():
            self._wake_sender()  # the sender resends before its next message
            return
        if self._resender is not None and not self._resender.done():
            return  # it resends everything unacknowledged once it has the lock
        self._resender = task = self._loop.create_task(self._resend_task())
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)

    async def _resend_task(self) -> None:
        async with self._send_lock:
            if self._resend and self.lost is None:
                # A failure here failed the channel; its session learns it through on_lost.
                with contextlib.suppress(TransportError):
                    await self._resend_unacked()

    async def _resend_unacked(self) -> None:
        self._resend = False
        for head, body in self._sender.payloads():
            await self._publish(head, body)
            if self.lost is not None:
                return

    def _retain(self, head: bytes, body: bytes | memoryview = b"") -> None:
        """Keep the sequenced message just taken until acknowledged, watched by _check_acked."""
        self._sender.retain(head, body)
        if self._ack_handle is None:
            self._ack_mark = self._sender.oldest_unacked
            self._ack_handle = self._loop.call_later(_ASK_ACK_AFTER, self._check_acked)

    def _check_acked(self) -> None:
        """Ask the peer about our unacknowledged messages when no acknowledgement came for
        _ASK_ACK_AFTER: NATS may have dropped the last ones we sent (a route between cluster
        nodes that failed, with no reconnect to tell), and a receiver sees a gap only when a later
        message arrives, so without this they would never arrive while the session lives on.

        The question is a CREDIT flagged ASK and TAIL, carrying our last sequence number. NATS
        keeps one publisher's order on a subject, so the peer reads it after every message sent
        before it that was not lost: if it lacks the last one it answers RESYNC (we then send
        again what its acknowledgement does not cover, only what is missing); else it announces
        its credit, whose acknowledgement releases what we retain and stops these checks. A
        receiver that merely holds our messages unread (paused, no credit left) has taken them in
        order: it acknowledges, so nothing is sent again. At most one 26-byte question per
        _ASK_ACK_AFTER per channel, none while a send is under way (one waiting for credit asks
        by itself) or every message is acknowledged."""
        self._ack_handle = None
        if self.lost is not None or not self._sender.unacked:
            return  # armed again by the next message retained
        oldest = self._sender.oldest_unacked
        if oldest == self._ack_mark and not self._send_lock.locked() and not self._resend:
            self._ask_ack()
        self._ack_mark = oldest
        self._ack_handle = self._loop.call_later(_ASK_ACK_AFTER, self._check_acked)

    def _ask_ack(self) -> None:
        """A CREDIT flagged ASK and TAIL (see _check_acked): our acknowledgement and credit, our
        last sequence number, and the question. Every sequenced message up to that number has
        been handed to nats-py before this is (the callers hold no message half-published)."""
        receiver = self._receiver
        tail = self._sender.next_seq - 1
        self._bus.publish_soon(self._out, f.pack_credit(receiver.last_in_order, receiver.granted, tail=tail))

    def _wake_sender(self) -> None:
        waiter = self._credit_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- liveness and the end ---------------------------------------------------------------------

    def _probe(self) -> None:
        """Ask NATS whether anyone still listens on the peer's subject: nats-server answers a
        message whose reply subject is ours with a 503 status when nothing does."""
        self._probe_handle = None
        if self.lost is not None:
            return
        self._probe_waiting = False  # the last tick's probe reached the peer, or is too late
        # A flag, not a timestamp per message: the clock read cost every message a call.
        if not self._heard:
            task = self._loop.create_task(self._send_probe())
            _tasks.add(task)
            task.add_done_callback(_tasks.discard)
        self._heard = False
        self._probe_handle = self._loop.call_later(self._probe_interval, self._probe)

    async def _send_probe(self) -> None:
        try:
            self._probe_waiting = True  # before the publish: nats-server may answer at once
            await self._nc.publish(self._out, f.HEADER.pack(f.PROBE, 0), reply=self.in_subject)
        except (NatsError, OSError) as exc:
            self._probe_waiting = False  # no answer will come
            log.debug("NATS liveness probe not sent: %s", exc)

    def _fail(self, error: TransportError) -> None:
        if self.lost is not None:
            return
        self.lost = error
        self._unroute()
        if self.owns_bus:
            self.owns_bus = False
            task = self._loop.create_task(release_bus(self._bus))
            _tasks.add(task)
            task.add_done_callback(_tasks.discard)
        self._held.clear()
        self._parts = None
        resender = self._resender
        if resender is not None and resender is not asyncio.current_task():
            # It may wait in nats-py for a flush that a connection closed meanwhile never does;
            # a send() of the session waiting for the lock it holds must fail now, not then.
            resender.cancel()
        self._wake_sender()
        if self._on_lost is not None:
            on_lost, self._on_lost = self._on_lost, None
            on_lost(error)
        elif self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _unroute(self) -> None:
        self._opened()
        self._announcer.cancel()
        self._peer_resend.cancel()
        if self._ack_handle is not None:
            self._ack_handle.cancel()
            self._ack_handle = None
        if self._probe_handle is not None:
            self._probe_handle.cancel()
            self._probe_handle = None
        if self._bus.routes.get(self.in_subject) is self:
            del self._bus.routes[self.in_subject]


def _body(message: OutgoingMessage, text: bool) -> tuple[memoryview, int, int]:
    """The bytes of ``message`` and its frame kinds (whole message, first chunk)."""
    if isinstance(message, str):
        body: bytes | bytearray | memoryview = message.encode()
        text = True
    elif isinstance(message, bytes | bytearray | memoryview):
        body = message
    else:
        body = message[0] if len(message) == 1 else b"".join(message)
    view = memoryview(body).cast("B")
    # The view is queued and retained by reference until acknowledged (see compat.publish_now):
    # a buffer the caller may change later is copied once here.
    if not view.readonly:
        view = memoryview(view.tobytes())
    if text:
        return view, f.TEXT, f.TEXT_FIRST
    return view, f.BINARY, f.BINARY_FIRST


_tasks: set[asyncio.Task[None]] = set()


def _malformed(kind: int, data: bytes | bytearray, exc: Exception) -> str:
    """Why a frame is refused, in the protocol's terms (struct's own wording names Python calls)."""
    if isinstance(exc, struct.error):
        return f"malformed NATS frame from the peer: kind {kind} with {len(data)} bytes is too short"
    return f"malformed NATS frame from the peer: {exc}"
