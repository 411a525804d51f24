"""Credit-based flow control and in-order, exactly-once delivery for one NATS channel (sans-I/O).

Core NATS delivers at most once and drops messages for a slow consumer, so each direction of a
channel runs a small window protocol on top of it, as HTTP/2 and QUIC do per stream:

- The receiver announces a credit limit: the total cost (payload + MESSAGE_COST per NATS message)
  the sender may have sent. It moves the limit forward as the application consumes, never beyond
  ``consumed + window``, and a sequenced message that would take the total received past the
  limit announced is a violation (the channel fails), so what a peer makes us buffer is bounded
  by the window whatever it sends.
- Sequenced messages are numbered; the receiver takes only the next expected one. A duplicate is
  dropped; a gap (a message lost, e.g. on a NATS node that died) makes it ask for a resend of
  everything after the last one it took.
- The sender keeps every message until the receiver's CREDIT acknowledges it (the ``ack`` in the
  CREDIT message), so a resend is always possible. That retention is bounded by the channel's
  *agreed window*, the smaller of the two ends' windows (each announced in OPEN/OPEN_OK): the
  sender never has more than that unacknowledged, whatever credit the peer grants. A peer that
  announced a window of 2**64 - 1, or granted credit without acknowledging, made a worker keep
  everything it sent (stop 28's attack run: 800 MiB for a 1 KB request). An honest receiver
  acknowledges at least what it consumed, and grants at most ``consumed + window``, so the bound
  never holds an honest sender back.
- The receiver announces its credit (and acknowledgement) each time a quarter of the agreed
  window was consumed, so a sender at that bound hears an acknowledgement before it stalls.
"""

from __future__ import annotations

from collections import deque

__all__ = ["DUPLICATE", "GAP", "JOIN_BELOW", "OVER_CREDIT", "TAKE", "Receiver", "Sender"]

#: Payloads up to this many bytes are retained as one bytes object (head and body joined: one
#: copy of at most this much); larger ones keep their body by reference, where the ~250 bytes of
#: a pair and a view are small beside the payload.
JOIN_BELOW = 4096

# Receiver.check's verdicts on a sequenced message.
TAKE = 0  # the next one expected, within credit: process it
DUPLICATE = -1  # seen already: drop it
GAP = 1  # something before it was lost: drop it, ask for a resend
OVER_CREDIT = 2  # the peer sent past the credit it was given: a violation


class Sender:
    """One direction's sending side: credit, sequence numbers, retention until acknowledged."""

    def __init__(self, initial_limit: int, window: int = 0) -> None:
        self.limit = initial_limit  # total cost we may have sent
        self.window = window  # the agreed window: at most this much cost unacknowledged
        self.sent = 0  # total cost sent so far
        self.acked = 0  # total cost of the messages acknowledged
        self.next_seq = 1
        # What a resend needs, oldest first: the NATS payload of each sequenced message taken and
        # not yet acknowledged, numbered from next_seq - len(unacked) (every message taken is
        # retained before anything else runs, so the numbers are consecutive). A small payload
        # is one bytes object (head and body joined); a large one a (head, body) pair, the body
        # retained by reference. A per-message tuple, sequence number and memoryview cost ~400
        # bytes more than the payload, 7x what a 10-byte message is charged (MESSAGE_COST):
        # joined, a message holds its payload + ~90 bytes, near what it is charged.
        self.unacked: deque[bytes | tuple[bytes, bytes | memoryview]] = deque()
        self.retained_bytes = 0
        # self.sent once each unacknowledged message was taken, from sequence number _sent_seq on.
        self._sent_at: deque[int] = deque()
        self._sent_seq = 1

    def has_credit(self, cost: int) -> bool:
        sent = self.sent + cost
        return sent <= self.limit and sent - self.acked <= self.window

    def take(self, cost: int) -> int:
        """Account for one sequenced message of ``cost``; returns its sequence number. The caller
        retains its payload (:meth:`retain`) before anything else acts on this sender."""
        self.sent += cost
        seq = self.next_seq
        self.next_seq += 1
        self._sent_at.append(self.sent)
        return seq

    def retain(self, head: bytes, body: bytes | memoryview = b"") -> None:
        """Keep the payload (``head + body``) of the message just taken, for a resend."""
        size = len(head) + len(body)
        # memoryview: len() counts items; the channel's views are cast to bytes ("B").
        self.unacked.append(head + body if size <= JOIN_BELOW else (head, body))
        self.retained_bytes += size

    @property
    def oldest_unacked(self) -> int:
        """The sequence number of the oldest message retained (next_seq when none is)."""
        return self.next_seq - len(self.unacked)

    def payloads(self) -> list[tuple[bytes, bytes | memoryview]]:
        """(head, body) of every message retained, oldest first: what a resend publishes."""
        return [(entry, b"") if isinstance(entry, bytes) else entry for entry in self.unacked]

    def on_credit(self, ack: int, limit: int) -> bool:
        """Apply a CREDIT; True when the limit grew or messages were acknowledged (a waiting
        sender may go on)."""
        unacked = self.unacked
        for _ in range(min(len(unacked), ack - self.oldest_unacked + 1)):
            entry = unacked.popleft()
            self.retained_bytes -= len(entry) if isinstance(entry, bytes) else len(entry[0]) + len(entry[1])
        sent_at = self._sent_at
        acked = self.acked
        for _ in range(min(len(sent_at), ack - self._sent_seq + 1)):
            acked = sent_at.popleft()
            self._sent_seq += 1
        if acked > self.acked:
            self.acked = acked
            if limit <= self.limit:
                return True  # room made by the acknowledgement alone
        if limit > self.limit:
            self.limit = limit
            return True
        return False


class Receiver:
    """One direction's receiving side: the next expected sequence number and the credit limit."""

    def __init__(self, window: int) -> None:
        self.window = window  # our own; the agreed one once the peer's is known (narrow)
        self.expected = 1
        self.consumed = 0
        self.received = 0  # total cost of the sequenced messages taken
        self.granted = window  # the limit last announced (the initial one is in OPEN/OPEN_OK)
        self._announced_at = 0  # what was consumed when the limit was last announced

    def narrow(self, window: int) -> int | None:
        """Use the agreed ``window`` (<= ours) from now on. The initial credit, announced with our
        own window, is not taken back: a grant is never lowered. Returns a limit to announce
        when a quarter of the agreed window was consumed already (a worker may send before its
        OPEN_OK reaches the client: those messages must be acknowledged without waiting for
        more, which the sender may be holding back)."""
        self.window = min(self.window, window)
        return self.consume(0)

    def check(self, seq: int, cost: int) -> int:
        """The verdict on a sequenced message of ``cost``: TAKE, DUPLICATE, GAP or OVER_CREDIT.

        A sender that keeps to its credit never gets OVER_CREDIT: it counts each message's cost
        as we do (a CLOSE it counts at more than its size), and the limit it knows is one we
        announced, none above ``granted``."""
        if seq == self.expected:
            received = self.received + cost
            if received > self.granted:
                return OVER_CREDIT
            self.received = received
            self.expected += 1
            return TAKE
        return DUPLICATE if seq < self.expected else GAP

    @property
    def last_in_order(self) -> int:
        return self.expected - 1

    def consume(self, cost: int) -> int | None:
        """The application took ``cost``; returns a new limit to announce when worth a message.

        A quarter of the window consumed is the threshold: the sender never stalls for a full
        round trip while the receiver keeps up, and small messages do not each cost a CREDIT
        message. It counts what was consumed, not how far the limit moved: after a narrowed
        window the initial grant can stay ahead of ``consumed + window`` for a while, and the
        acknowledgement must still reach a sender held back by the agreed window.
        """
        consumed = self.consumed = self.consumed + cost
        if consumed - self._announced_at >= self.window // 4:
            self._announced_at = consumed
            self.granted = max(self.granted, consumed + self.window)
            return self.granted
        return None
