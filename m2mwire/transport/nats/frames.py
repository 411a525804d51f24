"""The NATS transport's own header: one per NATS message (see docs/PROTOCOL.md, "NATS mapping").

Every NATS message of a session starts with ``kind`` (1 byte) and ``seq`` (8 bytes, big-endian):

- sequenced kinds (``seq`` counts them from 1 per direction, so loss and duplicates are seen):
  ``TEXT``/``BINARY`` a whole message; ``TEXT_FIRST``/``BINARY_FIRST`` the first chunk of a message
  larger than a NATS message, followed by its total size (8 bytes); ``CONT`` a further chunk;
  ``CLOSE`` the channel's end, followed by a close code (2 bytes) and a UTF-8 reason.
- unsequenced kinds (``seq`` is 0 unless said): ``CREDIT`` (``seq`` = the last sequenced message
  received in order, then the credit limit, 8 bytes, and a flags byte: ``RESYNC`` asks the peer
  to send again everything after ``seq``, ``RESYNC`` or ``ASK`` to announce its credit again,
  ``TAIL`` says the CREDIT is followed by the sender's last sequence number, 8 bytes, which a
  receiver that has not taken it asks for with a RESYNC);
  ``PROBE`` (a liveness check, ignored by the receiver);
  ``ABORT`` (the peer dropped the channel, followed like CLOSE by code and reason).
"""

from __future__ import annotations

import struct

from m2mwire.codecs.utf8 import cut_utf8

__all__ = [
    "ABORT",
    "ASK",
    "BINARY",
    "BINARY_FIRST",
    "CLOSE",
    "CONT",
    "CREDIT",
    "HEADER",
    "MAX_WINDOW",
    "MESSAGE_COST",
    "MIN_WINDOW",
    "PROBE",
    "REASON_MAX",
    "RESYNC",
    "SEQUENCED",
    "TAIL",
    "TEXT",
    "TEXT_FIRST",
    "chunk_size",
    "pack_close",
    "pack_credit",
    "unpack_close",
    "unpack_credit",
    "unpack_tail",
    "window_error",
]

TEXT, BINARY, TEXT_FIRST, BINARY_FIRST, CONT, CLOSE = 1, 2, 3, 4, 5, 6
CREDIT, PROBE, ABORT = 16, 17, 18
SEQUENCED = frozenset((TEXT, BINARY, TEXT_FIRST, BINARY_FIRST, CONT, CLOSE))
RESYNC = 1  # CREDIT flag: send again everything unacknowledged (and announce your credit)
ASK = 2  # CREDIT flag: announce your credit again (a sender waiting for it long)
# CREDIT flag: our last sequence number follows the CREDIT (8 bytes); if you lack it, RESYNC.
# Sent with ASK, so a peer that predates it (and ignores the extra bytes) still acknowledges.
TAIL = 4

HEADER = struct.Struct("!BQ")
TOTAL = struct.Struct("!Q")
_CREDIT = struct.Struct("!BQQB")
_CLOSE = struct.Struct("!BQH")
# What a NATS message costs against the credit window besides its payload: a flood of tiny
# messages is bounded too (nats-server's own protocol line is about this long).
MESSAGE_COST = 64
#: The smallest credit window an OPEN or OPEN_OK may announce. A sender keeps each NATS message's
#: cost within a quarter of its peer's window (chunk_size), so that credit raised after a quarter
#: is consumed always admits the next chunk; a window of a few hundred bytes left no room for any
#: chunk, and a channel that could never send its HELLO (a clean-room client's window of 300).
MIN_WINDOW = 4096
#: CREDIT limits are uint64: a window past this could not be announced.
MAX_WINDOW = 2**64 - 1


def pack_credit(ack: int, limit: int, flags: int = 0, tail: int | None = None) -> bytes:
    """A CREDIT; with ``tail`` (our last sequence number) flagged TAIL and ASK."""
    if tail is None:
        return _CREDIT.pack(CREDIT, ack, limit, flags)
    return _CREDIT.pack(CREDIT, ack, limit, flags | TAIL | ASK) + TOTAL.pack(tail)


def unpack_credit(data: bytes | bytearray) -> tuple[int, int, int]:
    """(ack, limit, flags) of a CREDIT message; struct.error when it is too short."""
    _, ack, limit, flags = _CREDIT.unpack_from(data)
    return ack, limit, flags


def unpack_tail(data: bytes | bytearray) -> int:
    """The sender's last sequence number in a CREDIT flagged TAIL; struct.error when absent."""
    return int(TOTAL.unpack_from(data, _CREDIT.size)[0])


#: Bytes of a CLOSE or ABORT reason: ours are cut to this, a peer's are read up to it (a peer's
#: longer one, up to max_payload, would otherwise travel on in our errors whole: stop 28).
REASON_MAX = 512


def pack_close(kind: int, seq: int, code: int, reason: str) -> bytes:
    return _CLOSE.pack(kind, seq, code) + cut_utf8(reason.encode("utf-8", "replace"), REASON_MAX)


def unpack_close(data: bytes | bytearray) -> tuple[int, str]:
    _, _, code = _CLOSE.unpack_from(data)
    size = len(data) - _CLOSE.size
    reason = bytes(data[_CLOSE.size : _CLOSE.size + REASON_MAX]).decode(errors="replace")
    return code, reason if size <= REASON_MAX else f"{reason}... ({size} bytes)"


def window_error(window: object) -> str | None:
    """Why ``window`` (from an OPEN or OPEN_OK) is not a usable credit window; None when it is."""
    if type(window) is not int or not MIN_WINDOW <= window <= MAX_WINDOW:
        return f"window must be an integer from {MIN_WINDOW} to 2**64 - 1, not {window!r}"[:120]
    return None


def chunk_size(max_payload: int, peer_window: int) -> int:
    """Bytes of a message per FIRST/CONT chunk: the FIRST frame (header + total + chunk) fits in
    nats-server's ``max_payload``, and a chunk's cost (frame + MESSAGE_COST) is at most a quarter
    of the peer's window (>= 943 bytes at MIN_WINDOW). At least 1, for a server whose max_payload
    leaves no room at all (nothing larger than a chunk could be sent there anyway)."""
    first_head = HEADER.size + TOTAL.size
    return max(1, min(max_payload - first_head, peer_window // 4 - first_head - MESSAGE_COST))
