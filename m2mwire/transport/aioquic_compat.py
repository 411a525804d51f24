"""The aioquic internals that the QUIC transport's resource bounds rely on, in one place.

aioquic has no public API for two things those bounds need: the number of bidirectional streams
the peer lets us open (its MAX_STREAMS), and whether a datagram belongs to a connection the
server already has (before aioquic creates one for it). Both are read here and nowhere else,
for the aioquic minor version they were checked against; importing this module with another
version raises ImportError, so an upgrade fails loudly instead of silently losing a bound.
(Older private accesses still live in quic.py; issue 13 moves them here too.)
"""

from __future__ import annotations

import aioquic
from aioquic.asyncio.server import QuicServer
from aioquic.buffer import Buffer  # type: ignore[attr-defined]  # re-exported from aioquic._buffer
from aioquic.quic.connection import QuicConnection
from aioquic.quic.packet import QuicHeader, pull_quic_header

__all__ = ["VERIFIED_MINOR", "bidi_streams_allowed", "has_connection", "parse_header"]

VERIFIED_MINOR = (1, 7)

_version = tuple(int(part) for part in aioquic.__version__.split(".")[:2])
if _version != VERIFIED_MINOR:
    raise ImportError(
        f"m2mwire's QUIC transport was verified against aioquic {VERIFIED_MINOR[0]}.{VERIFIED_MINOR[1]}.x, "
        f"found {aioquic.__version__}: install aioquic>=1.7,<1.8"
    )


def bidi_streams_allowed(quic: QuicConnection) -> int:
    """How many bidirectional streams the peer allows us to have opened in total (MAX_STREAMS).

    aioquic lets a caller write to a stream beyond it and queues it as blocked, but still sends
    RESET_STREAM, STOP_SENDING and MAX_STREAM_DATA for it, which the peer answers by closing the
    whole connection with STREAM_LIMIT_ERROR; callers must stay within this count.
    """
    allowed: int = quic._remote_max_streams_bidi
    return allowed


def has_connection(server: QuicServer, connection_id: bytes) -> bool:
    """Whether ``server`` routes ``connection_id`` to an existing connection."""
    return connection_id in server._protocols


def parse_header(data: bytes, host_cid_length: int) -> QuicHeader:
    """The QUIC header at the start of ``data`` (ValueError if malformed), as aioquic's server parses it."""
    return pull_quic_header(Buffer(data=data), host_cid_length=host_cid_length)
