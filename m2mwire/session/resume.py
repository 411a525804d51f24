"""Resume bookkeeping of one session (sans-I/O, pure): sequence numbers, cumulative
acknowledgements and the retention buffer (docs/PROTOCOL.md "Resume").

Sequence numbers are implicit: every DATA message (a text DATA envelope, a TokenNative or M2M
binary frame, an AVP frame) counts 1 in its direction, starting at 1 after ACCEPT. Binary frames
have no envelope to carry a number, and a reliable ordered channel needs none: the receiver's
count *is* the number of the last message it got. An acknowledgement is that count (cumulative).

The sender keeps every DATA message it sent until the peer acknowledges it, bounded in bytes by
``buffer_bytes`` (the shell makes ``send()`` wait while the buffer is full). The receiver
acknowledges once an eighth (:data:`ACK_FRACTION`) of the *peer's* announced buffer, or
``ACK_EVERY`` messages, arrived since its last ACK: so a sender blocked on a full buffer always
gets an ACK once the peer has read what it sent (a full buffer holds at least ``buffer`` bytes,
more than the eighth), and ACKs cost at most one small message per ``ACK_EVERY`` DATA messages.

Why these thresholds. An ACK costs each end a message of its own (a write, a read, a turn of each
event loop), about what 10-20 small DATA messages cost, so small messages are acknowledged per
1024 (per 64 made ``reconnect=True`` ~10 % slower when nothing fails); 1024 also bounds how many
small messages are retained (and retransmitted on a resume) when bytes alone would not. For large
messages the byte threshold decides, and there the cost of an ACK is nothing beside the sender
stalling: a fast sender keeps its retention buffer full (the sockets between the two ends hold
more than 16 MiB), so with an ACK per half buffer it stopped at every ACK until the peer had read
half a buffer. An eighth lets it go on after a shorter wait: 64 KiB messages over WebSocket,
``reconnect=True`` vs without, 1.031-1.053x slower with half (7 runs) and 1.008-1.026x with an
eighth (6 runs), QUIC 1.01-1.03x either way (benchmarks/bench_resume.py, cost, fresh connections
per pair, A/A 1.00x). Any threshold up to the whole buffer keeps the guarantee above, so peers
that ACK at other points (older versions: half, or a quarter and 64 messages) interoperate.

Sizes are counted the same way on both ends: a text message by its UTF-8 bytes (what the channel
carries; identical to its characters for the usual ASCII envelope), a binary message by its bytes;
a zstd-context message counts
decompressed (a binary one: envelope line + content; the text form: its envelope with the content
in place of the ``#ZS|`` string). It is retained uncompressed (a
:class:`~m2mwire.session.zstdstate.ZstdMessage`, compressed again after a resume), so the bound
holds on what retention keeps in memory, and the receiver's count still reaches an eighth of the
sender's buffer when that buffer is full.
"""

from __future__ import annotations

import hmac
import itertools
import secrets

from m2mwire.codecs.buffers import Buffer
from m2mwire.errors import ProtocolError
from m2mwire.schemas.codes import SessionCode
from m2mwire.session.binarytext import BinaryTextMessage
from m2mwire.session.zstdstate import ZstdMessage

__all__ = [
    "ACK_EVERY",
    "ACK_FRACTION",
    "ACK_WAIT_PONGS",
    "REPLAY_MESSAGE_COST",
    "REPLAY_REFILL",
    "REPLAY_REFUND",
    "ResumeState",
    "message_size",
    "new_token",
]

#: PONGs in a row, received while our retention buffer was full, with no acknowledgement between
#: them, before the session ends INVALID_ACK (core._check_acknowledging). One would do for a peer
#: that follows §9; three leave room for an acknowledgement crossing a PING.
ACK_WAIT_PONGS = 3

ACK_EVERY = 1024  # DATA messages received before an ACK is due, whatever their size
ACK_FRACTION = 8  # ... or this fraction of the peer's retention buffer in bytes (module docstring)
_TOKEN_BYTES = 32  # 256 bits of secret: a session id alone never resumes a session
# A resume retransmits what the peer has not acknowledged, encoding each message again (a zstd
# context compresses it afresh): up to the whole retention buffer, ~360 ms of CPU for 16 MiB of
# zstd text. A peer that never acknowledges and resumes over and over (one ~1 KB HELLO each)
# made a server do that back to back, stalling its other sessions. So replays draw on a budget:
# - it holds a whole buffer at once and refills at one buffer per REPLAY_REFILL seconds;
# - a replay is charged per message it sends again (next_replayed): its size plus
#   REPLAY_MESSAGE_COST, so one that a lost connection cut short costs what it carried, not the
#   whole buffer (charging the whole buffer made a client on a connection breaking every few
#   hundred KB wait up to 5 s per resume);
# - REPLAY_REFUND times what the peer then acknowledges of a replay comes back: it took that
#   part, and a replay into a connection that breaks loses what was written after it (a whole
#   socket buffer and more), so a client on a flaky link acknowledges little of each replay
#   (the WebSocket chaos test: cuts every 50-400 KB; it runs in 7.5 s with 256, 15 s with 64,
#   23 s with 16, 48 s with 8, and past its 60 s limit with 1).
# 256 came back until stop 31: a client that acknowledged 1/256 of each replay (a count in its
# resuming HELLO, ~1 KB) got a full 16 MiB replay per ~0.8 s (two such sessions took a core).
# At 16, a replay at once needs 1/16 of it acknowledged, which the server no longer retains:
# the peer must have it send that much anew for every replay. Replays nobody takes cost one
# buffer per REPLAY_REFILL. A resume that would overdraw the budget waits
# (ResumeState.replay_wait) before its replay starts.
REPLAY_REFILL = 10.0
REPLAY_REFUND = 16  # budget given back per unit of a replay the peer then acknowledged
# Charged per message sent again, on top of its bytes: a replay's CPU goes per message as much
# as per byte (124,000 tiny zstd messages cost ~40 % more per byte than large ones: ~3.7 us each).
REPLAY_MESSAGE_COST = 128

# A text message's UTF-8 bytes, a binary message's buffers, a zstd message to compress again, or
# text in binary form to frame again.
RetainedMessage = bytes | tuple[Buffer, ...] | ZstdMessage | BinaryTextMessage


def new_token() -> str:
    return secrets.token_urlsafe(_TOKEN_BYTES)


def message_size(message: RetainedMessage) -> int:
    """Size of one message as both ends count it for acknowledgements (see the module docstring)."""
    if type(message) is bytes:  # text DATA first: the per-message case
        return len(message)
    if isinstance(message, ZstdMessage | BinaryTextMessage):
        return message.size
    if isinstance(message, bytes):
        return len(message)
    return sum(memoryview(part).nbytes for part in message)


class ResumeState:
    """Counters and retained messages of one session that negotiated ``resume``.

    Kept to a few attribute updates per message (it runs for every DATA message both ways): the
    retention list holds the messages themselves (the encoded bytes by reference, no copy and no
    per-message tuple), their sizes are taken again when an ACK releases them, and ``sent``
    follows from the acknowledged count and what is retained. The per-message steps for text DATA
    (:meth:`on_sent`, :meth:`on_received`) are plain attribute updates that the session core does
    inline: a method call each way cost reconnect=True ~2 % of its 1 KB throughput.
    """

    __slots__ = (
        "_acked_received",
        "_budget_at",
        "_head",
        "_released_bytes",
        "_replay_budget",
        "_replay_next",
        "_transmitted_bytes",
        "ack_at",
        "ack_bytes",
        "acked",
        "buffer_bytes",
        "received",
        "replayed_upto",
        "retained",
        "retained_bytes",
        "token",
        "transmitted",
        "unacked_bytes",
    )

    def __init__(self, buffer_bytes: int, peer_buffer: int, token: str) -> None:
        self.buffer_bytes = buffer_bytes
        # ACK once an eighth of the peer's buffer arrived unacknowledged (at least 1 byte: a
        # peer announcing 0 gets an ACK per ACK_EVERY messages or per message over 0 bytes).
        self.ack_bytes = max(1, peer_buffer // ACK_FRACTION)
        self.token = token
        self.received = 0  # DATA messages received: what our ACKs carry
        self.acked = 0  # the peer's latest cumulative acknowledgement
        # Messages acked+1 .. sent are retained[_head:]; the entries before _head were released
        # (None) and are dropped in bulk (see on_ack). A list, not a deque: a replay walks it by
        # position while sends append to it and ACKs release from its front.
        self.retained: list[RetainedMessage | None] = []
        self._head = 0
        self.retained_bytes = 0
        self._acked_received = 0  # ``received`` as our last ACK carried it
        self.ack_at = ACK_EVERY  # ``received`` at which an ACK is due whatever the bytes
        self.unacked_bytes = 0  # received since our last ACK
        self._replay_budget = float(buffer_bytes)  # bytes a replay may take now (see REPLAY_REFILL)
        self._budget_at: float | None = None  # when _replay_budget was last charged
        self.replayed_upto = 0  # the last message a replay sent again (charged to the budget)
        self._replay_next = 0  # the next message a replay in progress takes (0: none)
        # The last message that went to a connection, set when one is lost (on_detached): those
        # up to it that the peer did not get are sent again, the later ones for the first time.
        self.transmitted = 0
        # Bytes of messages 1 .. transmitted, and of those released: what a replay would send
        # again is the difference, known without walking the retained messages.
        self._transmitted_bytes = self._released_bytes = 0

    # -- sending ----------------------------------------------------------------------------------

    @property
    def progress(self) -> int:
        """Grows whenever DATA gets through either way (received, or acknowledged by the peer):
        a reconnecting client compares it across a connection to tell a connection that carried
        something from one that was lost before anything got through."""
        return self.received + self.acked

    @property
    def sent(self) -> int:
        """DATA messages sent: the sequence number of the last one."""
        return self.acked + len(self.retained) - self._head

    def pending(self) -> list[RetainedMessage]:
        """The retained messages, oldest first (a copy)."""
        return self.retained[self._head :]  # type: ignore[return-value]  # past _head: no None

    @property
    def full(self) -> bool:
        """The retention buffer is full: the next send() waits for an acknowledgement."""
        return self.retained_bytes >= self.buffer_bytes

    def on_sent(self, message: RetainedMessage, size: int) -> None:
        """One DATA message was queued: number it and keep it until acknowledged. ``size`` is
        :func:`message_size` of it (the caller often has it at hand).

        The session core does the same two steps inline for text DATA, its per-message path
        (``SessionProtocol.send``; tests/session/test_resume.py checks that both agree)."""
        self.retained.append(message)
        self.retained_bytes += size

    def on_ack(self, received: int) -> int:
        """The peer acknowledged ``received`` messages; returns how many this released."""
        released = received - self.acked
        if released <= 0:  # repeated or stale: releases nothing (docs/PROTOCOL.md §9)
            return 0
        retained, head = self.retained, self._head
        if released > len(retained) - head:
            raise ProtocolError(
                f"ACK for {received} DATA messages, but only {self.sent} were sent",
                code=SessionCode.INVALID_ACK,
            )
        # Of these, the first ``replayed`` were sent again by a replay: the peer took them, so
        # that replay was not wasted work and its budget is given back for them.
        replayed = min(received, self.replayed_upto) - self.acked
        freed = refund = 0
        end = head + released
        for i, message in enumerate(retained[head:end]):
            kind = type(message)
            # bytes (text DATA) and text in binary form first: the per-message cases
            size = (
                len(message)  # type: ignore[arg-type]
                if kind is bytes
                else message.size  # type: ignore[union-attr]
                if kind is BinaryTextMessage
                else message_size(message)  # type: ignore[arg-type]
            )
            freed += size
            if i < replayed:
                refund += size + REPLAY_MESSAGE_COST
        retained[head:end] = itertools.repeat(None, released)  # released: freed now
        if end > 1024 and 2 * end > len(retained):  # drop the released prefix: amortised O(1)
            del retained[:end]
            end = 0
        self._head = end
        self.acked = received
        self.retained_bytes -= freed
        self._released_bytes += freed
        self._replay_budget += REPLAY_REFUND * refund  # (capped at the buffer when read: _budget)
        return released

    def replay(self, peer_received: int, now: float) -> int:
        """On resume: release what the peer says it got, and start a replay of what it did not
        (:meth:`next_replayed`); returns how many messages that is."""
        if peer_received < self.acked:
            raise ProtocolError(
                f"the peer resumes at {peer_received} DATA messages received, but had already "
                f"acknowledged {self.acked}",
                code=SessionCode.INVALID_ACK,
            )
        self.on_ack(peer_received)
        self._replay_budget = self._budget(now)
        self._budget_at = now
        count = self.sent - self.acked
        self._replay_next = self.acked + 1 if count else 0
        return count

    @property
    def to_resend(self) -> int:
        """Of the retained messages, those that went to a connection before: a replay started
        now sends them again (the others go out for the first time)."""
        return max(0, self.transmitted - self.acked)

    @property
    def replaying(self) -> bool:
        """A replay is in progress: :meth:`next_replayed` has a message to send again."""
        return self._replay_next != 0

    def next_replayed(self) -> RetainedMessage | None:
        """The next message of the replay in progress (one sent again is charged to the replay
        budget); None once the replay has reached the last message sent (messages sent while
        detached or during the replay included: those go out for the first time)."""
        seq = self._replay_next
        if not seq:  # no replay in progress (none started, over, or stopped)
            return None
        if seq <= self.acked:  # the peer acknowledged past it (it lied, or it got it before)
            seq = self.acked + 1
        if seq > self.sent:
            self._replay_next = 0
            return None
        message = self.retained[self._head + seq - self.acked - 1]
        self._replay_next = seq + 1
        size = message_size(message)  # type: ignore[arg-type]  # past _head: no None
        if seq > self.transmitted:  # its first time on a connection: what send() would cost
            self.transmitted = seq
            self._transmitted_bytes += size
        else:
            self.replayed_upto = seq
            self._replay_budget -= size + REPLAY_MESSAGE_COST
        return message

    def stop_replay(self) -> None:
        """The session ended, or the connection carrying a replay is gone (the next resume
        starts another)."""
        self._replay_next = 0

    def on_detached(self, direct: bool) -> None:
        """The connection is lost. ``direct``: the session sent its DATA straight to it, so all
        sent went to it; else what went to it is what replays took (``transmitted``)."""
        self._replay_next = 0
        if direct:
            self.transmitted = self.sent
            self._transmitted_bytes = self._released_bytes + self.retained_bytes

    def replay_wait(self, peer_received: int, now: float, *, direct: bool = False) -> float:
        """Seconds a resume at ``peer_received`` should wait before its replay, so that replays
        stay within their budget (REPLAY_REFILL): 0 while the budget covers what the replay
        would send again (a replay is charged only that, so one that a lost connection cut short
        cost little). ``direct``: the session still sends straight to a connection (one the
        resume will replace), so everything sent went to it.

        ``peer_received`` acknowledges (the caller checked the peer's token): it is released
        here, once, so that a peer resuming again and again costs no walk of the retained
        messages each time; a count the resume itself will refuse releases nothing."""
        if self.acked < peer_received <= self.sent:
            self.on_ack(peer_received)  # gives back the budget of what it replayed, too
        if direct:
            resend, count = self.retained_bytes, self.sent - self.acked
        else:
            resend, count = self._transmitted_bytes - self._released_bytes, self.to_resend
        # A full buffer may hold one message more than buffer_bytes (send() waits only once it
        # is full), or many tiny ones (their REPLAY_MESSAGE_COST): its first replay still goes
        # at once, and the next one waits for what it overdrew.
        cost = min(max(resend, 0) + REPLAY_MESSAGE_COST * count, self.buffer_bytes)
        deficit = cost - self._budget(now)
        return max(0.0, deficit * REPLAY_REFILL / self.buffer_bytes) if self.buffer_bytes else 0.0

    def _budget(self, now: float) -> float:
        if self._budget_at is None:
            return float(self.buffer_bytes)
        refill = (now - self._budget_at) * self.buffer_bytes / REPLAY_REFILL
        return min(float(self.buffer_bytes), self._replay_budget + refill)

    # -- receiving --------------------------------------------------------------------------------

    def on_received(self, size: int) -> bool:
        """One DATA message arrived; returns True when an ACK is due.

        The session core does the same steps inline for text DATA, its per-message path
        (``SessionProtocol.receive_text``; tests/session/test_resume.py checks that both agree)."""
        self.received += 1
        self.unacked_bytes += size
        return self.unacked_bytes >= self.ack_bytes or self.received >= self.ack_at

    @property
    def ack_pending(self) -> bool:
        return self.received != self._acked_received

    def take_ack(self) -> int:
        """The count to put in an ACK (or a resume handshake) now; resets the ACK triggers."""
        self.unacked_bytes = 0
        self._acked_received = self.received
        self.ack_at = self.received + ACK_EVERY
        return self.received

    def token_matches(self, token: str | None) -> bool:
        """Constant-time check of a resuming peer's token."""
        return token is not None and hmac.compare_digest(token.encode(), self.token.encode())
