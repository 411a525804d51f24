"""QUIC flow control as m2mwire does it, without I/O: receive credit and send watermarks.

aioquic raises its receive windows as data *arrives* and buffers whatever it is asked to send, so
neither a reader that stops reading nor a network that cannot keep up ever slows a sender. The
transport replaces both policies with these two objects (the channel and the connection feed them
numbers; :mod:`.compat` writes the results into aioquic):

* :class:`ReceiveCredit`: the limit (MAX_STREAM_DATA or MAX_DATA) moves to ``consumed + window`` as
  the application consumes, in steps of a quarter window, so unread data per stream and per
  connection stays within the window, while a reader that keeps up never waits on credit.
* :class:`SendBudget`: ``send()`` writes while the stream's and the connection's unacknowledged
  bytes stay under their high watermarks, and a waiting sender resumes only once both are under the
  low ones (hysteresis, so it is not woken for every ACK).
"""

from __future__ import annotations

__all__ = ["ReceiveCredit", "SendBudget"]


class ReceiveCredit:
    """The receive limit of one stream or one connection, granted on consumption."""

    __slots__ = ("limit", "window")

    def __init__(self, window: int) -> None:
        self.window = window
        self.limit = window  # the initial limit, announced in the handshake's transport parameters

    def grant(self, received: int, unread: int) -> int | None:
        """The new limit to announce after the peer sent ``received`` bytes in total, of which
        ``unread`` wait for the application; None while it would move by less than a quarter
        window (a MAX_* frame per packet would double the packets). Never lowers the limit."""
        target = received - unread + self.window
        if target - self.limit >= self.window >> 2:
            self.limit = target
            return target
        return None


class SendBudget:
    """Watermarks on bytes handed to QUIC and not yet acknowledged, per stream and per connection."""

    __slots__ = ("connection_high", "connection_low", "stream_high", "stream_low")

    def __init__(self, stream_high: int, stream_low: int, connection_high: int, connection_low: int) -> None:
        if not 0 < stream_low <= stream_high or not 0 < connection_low <= connection_high:
            raise ValueError("need 0 < low <= high watermarks")
        self.stream_high = stream_high
        self.stream_low = stream_low
        self.connection_high = connection_high
        self.connection_low = connection_low

    def fits(self, n: int, stream_unacked: int, connection_unacked: int) -> bool:
        """Whether ``n`` more bytes may be written at once, staying under both high watermarks."""
        return stream_unacked + n <= self.stream_high and connection_unacked + n <= self.connection_high

    def room(self, stream_unacked: int, connection_unacked: int) -> int:
        """Bytes that may be written now (<= 0: wait until :meth:`writable`)."""
        return min(self.stream_high - stream_unacked, self.connection_high - connection_unacked)

    def writable(self, stream_unacked: int, connection_unacked: int) -> bool:
        """Whether a waiting sender may go on: both under their low watermarks."""
        return stream_unacked <= self.stream_low and connection_unacked <= self.connection_low
