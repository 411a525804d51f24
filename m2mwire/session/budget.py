"""How much a session decodes for the bytes its peer sends (sans-I/O, pure; docs/PROTOCOL.md
"Resource bounds").

Every codec's output is bounded per message (the negotiated ``max_payload``), but not per byte
received: a 199-byte Brotli wire decodes to 16 MiB, ~40 ms of CPU, and a peer sending them as
fast as the socket took them kept a server's core busy for minutes after it left, and every other
session of that server waiting (stop 32's attack run). So each received message may decode to
:data:`FREE_RATIO` times its own wire size at no charge; what it decodes to beyond that is paid
from a bucket of :data:`BURST` bytes refilled at :data:`REFILL` bytes per second. A server's
sessions share one bucket (a peer opening many sessions gets no more than one; a client's
sessions have one each). Once the bucket is empty the session that drew on it stops reading
until it has refilled: the peer's messages wait in its own flow control, nothing is dropped, and
highly compressible data is slowed to REFILL per second of excess instead of failing. A session
that would have to wait more than :data:`MAX_PAUSE` is closed instead (see there).

Why these numbers. Decoding costs ~1-2.5 ns per byte produced (zstd, Brotli), and making the
str and checking it about as much again, so FREE_RATIO bounds the CPU a received byte can cost
at ~0.1-0.3 us, a few times what a plain message costs per byte. Honest session-context zstd
averages ~20x on agent traffic, but a message that resends a long history or a JSON snapshot
reaches thousands (a 190 KB snapshot in ~50 bytes): that comes from the bucket, whose BURST holds
~700 such snapshots at once. REFILL bounds what a whole server decodes past the free ratio: a
peer that sent 3 s of 16 MiB Brotli messages and left kept a server at 0.32 of a core at
128 MiB/s (measured), ~0.08 at 32 MiB/s, a core and more before the budget. What a server's
sessions can make it decode is then ``FREE_RATIO`` x their bytes + ``BURST`` + ``REFILL`` per
second. The charge is the decoded content's bytes (``Message.original_bytes``): parsing JSON
costs in proportion to its text, and the inbox bounds what the parsed value holds.

What it does not do: a paused session does not read, so a peer that sent such messages and left
is noticed only once what it sent before leaving (in our socket buffer) has been decoded, at the
bucket's pace, or once its session is closed for owing more than MAX_PAUSE of refill.
"""

from __future__ import annotations

from typing import Final

from m2mwire.codecs.limits import MiB

__all__ = ["BURST", "FREE_RATIO", "MAX_PAUSE", "REFILL", "DecodeBudget"]

FREE_RATIO: Final = 64
BURST: Final = 128 * MiB
REFILL: Final = 32 * MiB
#: The longest a session pauses: while it does not read, its peer's PINGs wait, and a peer
#: declares it gone max_missed_pongs x pong_timeout (10 s by default) after a PING. A session
#: whose message leaves the bucket owing more than MAX_PAUSE of refill is closed instead
#: (MESSAGE_TOO_BIG), and what it held is dropped undecoded: the server receives such messages
#: faster than it decodes them. Capping the pause instead let each paused session decode one
#: more message per pause (stop 32: 91 sessions of 4 messages each kept ~0.4 core for 16 s).
MAX_PAUSE: Final = 5.0


class DecodeBudget:
    """The bucket of one session's decode excess (see the module's docstring)."""

    __slots__ = ("_at", "_credit")

    def __init__(self, now: float) -> None:
        self._credit = float(BURST)
        self._at = now

    def charge(self, wire: int, decoded: int, now: float) -> float:
        """A message of ``wire`` bytes decoded to ``decoded``: the seconds to stop reading for
        (0.0: go on; more than MAX_PAUSE: the shell closes the session instead). Cheap for the
        usual message, whose excess is none."""
        excess = decoded - FREE_RATIO * wire
        if excess <= 0:
            return 0.0
        credit = min(float(BURST), self._credit + REFILL * (now - self._at)) - excess
        self._credit, self._at = credit, now
        return -credit / REFILL if credit < 0 else 0.0
