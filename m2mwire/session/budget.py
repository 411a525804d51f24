"""How much decoding a peer can make us do for the bytes it sends (sans-I/O, pure;
docs/PROTOCOL.md "Resource bounds").

Every codec's output is bounded per message (the negotiated ``max_payload``), but not per byte
received: a 199-byte Brotli wire decodes to 16 MiB, ~40 ms of CPU, and a peer sending them as
fast as the socket took them kept a server's core busy for minutes after it left, and every other
session of that server waiting (stop 32's attack run). Decoded sizes did not tell the whole cost
either (stop 33's attack run): a zstd message's 16 MiB envelope, a Brotli bomb whose checksum
fails after it was decompressed, a 65,000-dimension AVP shape, a tokenizer built on first use.

So the measure is time: the shell times each received message's processing (decoding, checks,
parsing: what the session core does with it, failures included): with the wall clock, and once
the session has been charged, with the thread's CPU clock (the wall clock also counts the time
the process was descheduled). Each message may take :data:`FREE_BASE` plus
:data:`FREE_PER_BYTE` per wire byte at no charge, a few times what plain traffic costs (~5 us
for a small message, ~1 ns per byte of a large one); what it takes beyond that is paid from a
bucket of :data:`BURST` seconds refilled at :data:`REFILL` seconds per second.

One bucket per peer: a server keeps one per client address (:class:`DecodeBudgets`; IPv6 by /64),
shared by all sessions from there, so a peer opening many sessions gets no more than one, and a
peer's debt is never another peer's; a client's session has its own. Each address's bucket also
charges its network's (IPv4 /24, IPv6 /48), which holds and refills :data:`NETWORK_SCALE` times
more: a peer cycling through the addresses of its network gets no more than that. While a peer's
address or network owes, its sessions' next messages wait undecoded and they stop reading until
the debt is repaid: the peer's messages wait in its own flow control, nothing is dropped. A
session whose address would owe more than :data:`MAX_PAUSE` is closed instead (see there); one
whose network owes waits (its address may be an honest neighbour). What one address can make a
server compute beyond the free allowance is then ``BURST`` + ``REFILL`` per second, one network
NETWORK_SCALE times that, whatever they send and over however many sessions.

What it does not do: addresses are the unit, so peers behind one address (a NAT, a gateway) share
a bucket, and a peer with addresses in many networks gets a bucket in each. A paused session
does not read, so a peer that sent such messages and left is noticed only once what it sent
before leaving has been decoded at the bucket's pace, or its session is closed for owing more
than MAX_PAUSE.
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
    "NETWORK_SCALE",
    "PAUSE_PER_WAITER",
    "REFILL",
    "DecodeBudget",
    "DecodeBudgets",
    "peer_key",
]

#: Seconds of processing any received message may take at no charge, plus FREE_PER_BYTE per wire
#: byte: a plain message takes ~5 us plus ~1 ns per byte (stop 33's measurement, 2-vCPU VM), so
#: the allowance is ~3x that for small messages and ~30x for large ones, and honest traffic is
#: charged only for what decodes to far more than it cost (a zstd message resending a history).
#: At 50 us, 54-byte Brotli messages taking 35 us each, never charged, held a core (stop 33's
#: second attack run).
FREE_BASE: Final = 15e-6
FREE_PER_BYTE: Final = 32e-9
#: Seconds of processing beyond the allowance one peer may take at once, then REFILL per second:
#: a tenth of a core. A 16 MiB Brotli bomb takes ~40 ms: 50 at once, then 2.5 per second; a zstd
#: message resending a 208 KB JSON snapshot in ~50 bytes ~3 ms: ~600 at once, then ~30 per second.
BURST: Final = 2.0
REFILL: Final = 0.1
#: A network's bucket (IPv4 /24, IPv6 /48) holds and refills this many times an address's.
NETWORK_SCALE: Final = 4
#: A session that waits for its bucket waits at least this long per session waiting for it: a
#: debt of a few ms woke every waiting session each few ms, and 200 paused sessions of one
#: address kept a core busy checking (stop 33's third attack run). So a bucket's waiters wake
#: at most ~1 / PAUSE_PER_WAITER times a second in all.
PAUSE_PER_WAITER: Final = 0.01
#: The longest a session pauses: while it does not read, its peer's PINGs wait, and a peer
#: declares it gone max_missed_pongs x pong_timeout (10 s by default) after a PING. A session
#: whose peer owes more than MAX_PAUSE of refill is closed instead (MESSAGE_TOO_BIG), and what it
#: held is dropped undecoded: its peer sends such messages faster than they are decoded. Capping
#: the pause instead let each paused session decode one more message per pause (stop 32: 91
#: sessions of 4 messages each kept ~0.4 core for 16 s).
MAX_PAUSE: Final = 5.0
#: The most peers (and networks) a server keeps a bucket for; the least recently seen goes first
#: (a peer forgotten with a debt starts afresh: one more BURST, for one of MAX_PEERS addresses).
MAX_PEERS: Final = 65_536


class DecodeBudget:
    """One peer's bucket (see the module's docstring), and its network's (``network``, None for
    a client's session and a network's own bucket)."""

    __slots__ = ("_at", "_burst", "_credit", "_refill", "network", "repaid_at", "waiting")

    def __init__(self, now: float, network: DecodeBudget | None = None, scale: int = 1) -> None:
        self._burst = self._credit = BURST * scale
        self._refill = REFILL * scale
        self._at = now
        self.network = network
        #: When the debt is repaid (a time in the past when there is none): the shell's check
        #: before each message, an attribute rather than a call.
        self.repaid_at = now
        #: Sessions paused on this bucket now (the shell counts them; see PAUSE_PER_WAITER).
        self.waiting = 0

    def charge(self, wire: int, spent: float, now: float) -> float:
        """A message of ``wire`` bytes took ``spent`` seconds to process: the seconds the peer's
        address owes now (0.0: none; more than MAX_PAUSE: the shell closes the session instead).
        Its network is charged too (see :meth:`owed`)."""
        excess = spent - FREE_BASE - FREE_PER_BYTE * wire
        if excess <= 0.0:
            return 0.0
        if self.network is not None:
            self.network.charge(wire, spent, now)
        return self._take(excess, now)

    def _take(self, excess: float, now: float) -> float:
        credit = min(self._burst, self._credit + self._refill * (now - self._at)) - excess
        self._credit, self._at = credit, now
        if credit < 0.0:
            owed = -credit / self._refill
            self.repaid_at = now + owed
            return owed
        return 0.0

    def owed(self, now: float) -> float:
        """The seconds until the peer's address's debt is repaid (0.0: none): a message of a peer
        that owes is not decoded before then."""
        return self.repaid_at - now if self.repaid_at > now else 0.0

    def waits(self, now: float) -> float:
        """The seconds until neither the address nor its network owes: how long the peer's next
        message waits (0.0: it does not), at least PAUSE_PER_WAITER per session already waiting."""
        network = self.network
        until = self.repaid_at if network is None or network.repaid_at < self.repaid_at else network.repaid_at
        if until <= now:
            return 0.0
        waiting = self.waiting if network is None or network.waiting < self.waiting else network.waiting
        return max(until - now, PAUSE_PER_WAITER * waiting)

    def buckets(self) -> tuple[DecodeBudget, ...]:
        """This bucket, and its network's if any: where a paused session is counted."""
        return (self,) if self.network is None else (self, self.network)


def peer_key(address: str) -> tuple[str, str | None]:
    """The buckets a peer at ``address`` (a channel's remote_address, ``host:port`` or
    ``[v6]:port``) draws on: its host's (IPv6: its /64, one subscriber's usual allocation) and its
    network's (IPv4 /24, IPv6 /48; None for an address that is not an IP address)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return address, None
    host = host.strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host, None
    if ip.version == 6 and ip.ipv4_mapped is not None:  # a dual-stack socket's IPv4 client
        ip = ip.ipv4_mapped
        host = str(ip)
    if ip.version == 6:
        return str(ipaddress.IPv6Network((ip, 64), strict=False)), str(
            ipaddress.IPv6Network((ip, 48), strict=False)
        )
    return host, str(ipaddress.IPv4Network((ip, 24), strict=False))


class DecodeBudgets:
    """A server's buckets, one per peer address and one per network (at most MAX_PEERS each)."""

    __slots__ = ("_buckets", "_networks")

    def __init__(self) -> None:
        self._buckets: OrderedDict[str, DecodeBudget] = OrderedDict()
        self._networks: OrderedDict[str, DecodeBudget] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def for_peer(self, address: str, now: float, network: str | None = None) -> DecodeBudget:
        """The bucket of the peer at ``address`` (a key of peer_key's), new (full) for a peer not
        seen or forgotten, charging ``network``'s too when given."""
        budget = _lookup(self._buckets, address)
        if budget is None:
            parent = None
            if network is not None:
                parent = _lookup(self._networks, network)
                if parent is None:
                    parent = _remember(self._networks, network, DecodeBudget(now, scale=NETWORK_SCALE))
            budget = _remember(self._buckets, address, DecodeBudget(now, parent))
        return budget


def _lookup(buckets: OrderedDict[str, DecodeBudget], key: str) -> DecodeBudget | None:
    budget = buckets.get(key)
    if budget is not None:
        buckets.move_to_end(key)
    return budget


def _remember(buckets: OrderedDict[str, DecodeBudget], key: str, budget: DecodeBudget) -> DecodeBudget:
    if len(buckets) >= MAX_PEERS:
        buckets.popitem(last=False)  # the least recently seen: it starts afresh if it comes back
    buckets[key] = budget
    return budget
