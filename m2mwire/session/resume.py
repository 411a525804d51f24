"""Resume bookkeeping of one session (sans-I/O, pure): sequence numbers, cumulative
acknowledgements and the retention buffer (docs/PROTOCOL.md "Resume").

Sequence numbers are implicit: every DATA message (a text DATA envelope, a TokenNative or M2M
binary frame, an AVP frame) counts 1 in its direction, starting at 1 after ACCEPT. Binary frames
have no envelope to carry a number, and a reliable ordered channel needs none: the receiver's
count *is* the number of the last message it got. An acknowledgement is that count (cumulative).

The sender keeps every DATA message it sent until the peer acknowledges it, bounded in bytes by
``buffer_bytes`` (the shell makes ``send()`` wait while the buffer is full). The receiver
acknowledges once a quarter of the *peer's* announced buffer, or ``ACK_EVERY`` messages, arrived
since its last ACK: so a sender blocked on a full buffer always gets an ACK once the peer has read
what it sent (a full buffer holds at least ``buffer`` bytes, more than the quarter), and ACKs cost
at most one small message per ``ACK_EVERY`` DATA messages.

Sizes are counted the same way on both ends: a text message by its UTF-8 bytes (what the channel
carries; identical to its characters for the usual ASCII envelope), a binary message by its bytes;
a zstd-context message counts
decompressed (a binary one: envelope line + content; the text form: its envelope with the content
in place of the ``#ZS|`` string). It is retained uncompressed (a
:class:`~m2mwire.session.zstdstate.ZstdMessage`, compressed again after a resume), so the bound
holds on what retention keeps in memory, and the receiver's count still reaches a quarter of the
sender's buffer when that buffer is full.
"""

from __future__ import annotations

import hmac
import secrets
from collections import deque
from collections.abc import Iterator

from m2mwire.codecs.buffers import Buffer
from m2mwire.codecs.limits import MiB
from m2mwire.errors import ProtocolError
from m2mwire.schemas.codes import SessionCode
from m2mwire.session.zstdstate import ZstdMessage

__all__ = ["ACK_EVERY", "DEFAULT_RESUME_BUFFER", "ResumeState", "message_size", "new_token"]

DEFAULT_RESUME_BUFFER = 16 * MiB
ACK_EVERY = 64  # DATA messages received before an ACK is due, whatever their size
_TOKEN_BYTES = 32  # 256 bits of secret: a session id alone never resumes a session

# A text message's UTF-8 bytes, a binary message's buffers, or a zstd message to compress again.
RetainedMessage = bytes | tuple[Buffer, ...] | ZstdMessage


def new_token() -> str:
    return secrets.token_urlsafe(_TOKEN_BYTES)


def message_size(message: RetainedMessage) -> int:
    """Size of one message as both ends count it for acknowledgements (see the module docstring)."""
    if isinstance(message, ZstdMessage):
        return message.size
    if isinstance(message, bytes):
        return len(message)
    return sum(memoryview(part).nbytes for part in message)


class ResumeState:
    """Counters and retained messages of one session that negotiated ``resume``."""

    __slots__ = (
        "_retained",
        "_unacked_bytes",
        "_unacked_count",
        "ack_bytes",
        "acked",
        "buffer_bytes",
        "received",
        "retained_bytes",
        "sent",
        "token",
    )

    def __init__(self, buffer_bytes: int, peer_buffer: int, token: str) -> None:
        self.buffer_bytes = buffer_bytes
        # ACK once a quarter of the peer's buffer arrived unacknowledged (at least 1 byte: a peer
        # announcing 0 gets an ACK per ACK_EVERY messages or per message over 0 bytes).
        self.ack_bytes = max(1, peer_buffer // 4)
        self.token = token
        self.sent = 0  # DATA messages sent: the sequence number of the last one
        self.received = 0  # DATA messages received: what our ACKs carry
        self.acked = 0  # the peer's latest cumulative acknowledgement
        self._retained: deque[tuple[RetainedMessage, int]] = deque()  # seq acked+1 .. sent
        self.retained_bytes = 0
        self._unacked_count = 0  # received since our last ACK
        self._unacked_bytes = 0

    # -- sending ----------------------------------------------------------------------------------

    @property
    def full(self) -> bool:
        """The retention buffer holds ``buffer_bytes`` or more: the next send() must wait."""
        return self.retained_bytes >= self.buffer_bytes

    def on_sent(self, message: RetainedMessage, size: int) -> None:
        """One DATA message was queued: number it and keep it until acknowledged."""
        self.sent += 1
        self._retained.append((message, size))
        self.retained_bytes += size

    def on_ack(self, received: int) -> int:
        """The peer acknowledged ``received`` messages; returns how many this released."""
        if received > self.sent:
            raise ProtocolError(
                f"ACK for {received} DATA messages, but only {self.sent} were sent",
                code=SessionCode.INVALID_ACK,
            )
        released = 0
        retained = self._retained
        while self.acked < received:
            _, size = retained.popleft()
            self.retained_bytes -= size
            self.acked += 1
            released += 1
        return released

    def replay(self, peer_received: int) -> Iterator[RetainedMessage]:
        """On resume: release what the peer says it got, then yield what it did not, in order."""
        if peer_received < self.acked:
            raise ProtocolError(
                f"the peer resumes at {peer_received} DATA messages received, but had already "
                f"acknowledged {self.acked}",
                code=SessionCode.INVALID_ACK,
            )
        self.on_ack(peer_received)
        return (message for message, _ in list(self._retained))

    # -- receiving --------------------------------------------------------------------------------

    def on_received(self, size: int) -> bool:
        """One DATA message arrived; returns True when an ACK is due."""
        self.received += 1
        self._unacked_count += 1
        self._unacked_bytes += size
        return self._unacked_count >= ACK_EVERY or self._unacked_bytes >= self.ack_bytes

    @property
    def ack_pending(self) -> bool:
        return self._unacked_count > 0

    def take_ack(self) -> int:
        """The count to put in an ACK (or a resume handshake) now; resets the ACK triggers."""
        self._unacked_count = self._unacked_bytes = 0
        return self.received

    def token_matches(self, token: str | None) -> bool:
        """Constant-time check of a resuming peer's token."""
        return token is not None and hmac.compare_digest(token.encode(), self.token.encode())
