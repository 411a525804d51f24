"""How much a session decodes for the bytes its peer sends (sans-I/O, pure; docs/PROTOCOL.md
"Resource bounds").

Every codec's output is bounded per message (the negotiated ``max_payload``), but not per byte
received: a 199-byte Brotli wire decodes to 16 MiB, ~40 ms of CPU, and a peer sending them as
fast as the socket took them kept a server's core busy for minutes after it left, and every other
session of that server waiting (stop 32's attack run). So each received message may decode to
:data:`FREE_RATIO` times its own wire size at no charge (what honest traffic stays within:
session-context zstd on agent traffic decodes to ~20x, Brotli to ~4x); what it decodes to beyond
that is paid from a bucket of :data:`BURST` bytes, refilled at :data:`REFILL` bytes per second.
Once the bucket is empty the shell stops reading until it has refilled: the peer's messages wait
in its own flow control, nothing is dropped, and a session of highly compressible data is slowed
to REFILL per second of excess instead of failing. What one session can make its side decode is
then ``FREE_RATIO`` x its bytes + ``BURST`` + ``REFILL`` per second (its cost as the inbox counts
it: for JSON, the parsed objects' estimated size).
"""

from __future__ import annotations

from typing import Final

from m2mwire.codecs.limits import MiB

__all__ = ["BURST", "FREE_RATIO", "MAX_PAUSE", "REFILL", "DecodeBudget"]

FREE_RATIO: Final = 1024
BURST: Final = 64 * MiB
REFILL: Final = 16 * MiB
#: The longest one pause lasts, whatever is owed (a JSON message's cost counts its parsed objects,
#: up to ~24 x its text): while we do not read, the peer's PINGs wait, and a peer declares us gone
#: after ping_interval + max_missed_pongs x pong_timeout (20 s by default). What is still owed
#: then pauses reading again at the next message that decodes past FREE_RATIO.
MAX_PAUSE: Final = 5.0


class DecodeBudget:
    """The bucket of one session's decode excess (see the module's docstring)."""

    __slots__ = ("_at", "_credit")

    def __init__(self, now: float) -> None:
        self._credit = float(BURST)
        self._at = now

    def charge(self, wire: int, decoded: int, now: float) -> float:
        """A message of ``wire`` bytes decoded to ``decoded``: the seconds to stop reading for
        (0.0: go on). Cheap for the usual message, whose excess is none."""
        excess = decoded - FREE_RATIO * wire
        if excess <= 0:
            return 0.0
        credit = min(float(BURST), self._credit + REFILL * (now - self._at)) - excess
        self._credit, self._at = credit, now
        return min(-credit / REFILL, MAX_PAUSE) if credit < 0 else 0.0
