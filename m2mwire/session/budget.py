"""How much decoding a peer can make us do for the bytes it sends (sans-I/O, pure;
docs/PROTOCOL.md "Resource bounds").

Every codec's output is bounded per message (the negotiated ``max_payload``), but not per byte
received: a 199-byte Brotli wire decodes to 16 MiB, ~40 ms of CPU, and a peer sending them as
fast as the socket took them kept a server's core busy for minutes after it left, and every other
session of that server waiting (stop 32's attack run). Decoded sizes did not tell the whole cost
either (stop 33's attack run): a zstd message's 16 MiB envelope, a Brotli bomb whose checksum
fails after it was decompressed, a 65,000-dimension AVP shape, a tokenizer built on first use.

So the measure is time: the shell times each received message's processing (decoding, checks,
parsing: what the session core does with it, failures included). Each message may take
:data:`FREE_BASE` plus :data:`FREE_PER_BYTE` per wire byte at no charge, several times what plain
traffic costs (~5 us for a small message, ~1 ns per byte of a large one); what it takes beyond that
is paid from a bucket of :data:`BURST` seconds refilled at :data:`REFILL` seconds per second.

One bucket per peer: a server keeps one per client address (:class:`DecodeBudgets`; IPv6 by /64),
shared by all sessions from there, so a peer opening many sessions gets no more than one, and a
peer's debt is never another peer's; a client's session has its own. A peer whose bucket is in
debt has its next message held undecoded, and the session stops reading until the debt is repaid:
the peer's messages wait in its own flow control, nothing is dropped, and what it sends is decoded
at REFILL of a core. A session whose peer would owe more than :data:`MAX_PAUSE` is closed instead
(see there). What one address can make a server compute beyond the free allowance is then
``BURST`` + ``REFILL`` per second, whatever it sends and over however many sessions.

What it does not do: addresses are the unit, so peers behind one address (a NAT, a gateway) share
a bucket, and a peer with many addresses gets one per address (per /64 for IPv6). A paused session
does not read, so a peer that sent such messages and left is noticed only once what it sent before
leaving has been decoded at the bucket's pace, or its session is closed for owing more than
MAX_PAUSE.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from typing import Final

__all__ = [
    "BURST",
    "FREE_BASE",
    "FREE_PER_BYTE",
    "MAX_PAUSE",
    "MAX_PEERS",
    "REFILL",
    "DecodeBudget",
    "DecodeBudgets",
    "peer_key",
]

#: Seconds of processing any received message may take at no charge, plus FREE_PER_BYTE per wire
#: byte: a plain message takes ~5 us plus ~1 ns per byte (stop 33's measurement, 2-vCPU VM), so
#: the allowance is ~10x that for small messages and ~30x for large ones, and honest traffic is
#: charged only for what decodes to far more than it cost (a zstd message resending a history).
FREE_BASE: Final = 50e-6
FREE_PER_BYTE: Final = 32e-9
#: Seconds of processing beyond the allowance one peer may take at once, then REFILL per second:
#: a tenth of a core. A 16 MiB Brotli bomb takes ~40 ms: 25 at once, then 2.5 per second.
BURST: Final = 1.0
REFILL: Final = 0.1
#: The longest a session pauses: while it does not read, its peer's PINGs wait, and a peer
#: declares it gone max_missed_pongs x pong_timeout (10 s by default) after a PING. A session
#: whose peer owes more than MAX_PAUSE of refill is closed instead (MESSAGE_TOO_BIG), and what it
#: held is dropped undecoded: its peer sends such messages faster than they are decoded. Capping
#: the pause instead let each paused session decode one more message per pause (stop 32: 91
#: sessions of 4 messages each kept ~0.4 core for 16 s).
MAX_PAUSE: Final = 5.0
#: The most peers a server keeps a bucket for; the least recently charged goes first (a peer
#: forgotten with a debt starts afresh: one more BURST, for one of MAX_PEERS addresses).
MAX_PEERS: Final = 65_536


class DecodeBudget:
    """One peer's bucket (see the module's docstring)."""

    __slots__ = ("_at", "_credit", "repaid_at")

    def __init__(self, now: float) -> None:
        self._credit = BURST
        self._at = now
        #: When the debt is repaid (a time in the past when there is none): the shell's check
        #: before each message, an attribute rather than a call.
        self.repaid_at = now

    def charge(self, wire: int, spent: float, now: float) -> float:
        """A message of ``wire`` bytes took ``spent`` seconds to process: the seconds its session
        is to stop reading for (0.0: go on; more than MAX_PAUSE: the shell closes the session
        instead)."""
        excess = spent - FREE_BASE - FREE_PER_BYTE * wire
        if excess <= 0.0:
            return 0.0
        credit = min(BURST, self._credit + REFILL * (now - self._at)) - excess
        self._credit, self._at = credit, now
        if credit < 0.0:
            owed = -credit / REFILL
            self.repaid_at = now + owed
            return owed
        return 0.0

    def owed(self, now: float) -> float:
        """The seconds until the peer's debt is repaid (0.0: none): a message of a peer that owes
        is not decoded before then."""
        return self.repaid_at - now if self.repaid_at > now else 0.0


def peer_key(address: str) -> str:
    """The bucket a peer at ``address`` (a channel's remote_address, ``host:port`` or
    ``[v6]:port``) draws on: its host, IPv6 by its /64 (one subscriber's usual allocation)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return address
    host = host.strip("[]")
    if ":" in host:
        try:
            return str(ipaddress.IPv6Network((host, 64), strict=False))
        except ValueError:
            return host
    return host


class DecodeBudgets:
    """A server's buckets, one per peer key (at most MAX_PEERS)."""

    __slots__ = ("_buckets",)

    def __init__(self) -> None:
        self._buckets: OrderedDict[str, DecodeBudget] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def for_peer(self, key: str, now: float) -> DecodeBudget:
        """The bucket of peer ``key``, new (full) for a peer not seen or forgotten."""
        buckets = self._buckets
        budget = buckets.get(key)
        if budget is None:
            if len(buckets) >= MAX_PEERS:
                buckets.popitem(last=False)
            budget = buckets[key] = DecodeBudget(now)
        else:
            buckets.move_to_end(key)
        return budget
