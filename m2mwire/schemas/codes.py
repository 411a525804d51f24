"""The session's codes: a REJECT's ``code``, a CLOSE's ``reason`` and what a session ends with.

Each member *is* its wire string (``StrEnum``: ``SessionCode.NORMAL == "NORMAL"``, and msgspec and
``str()`` write the value), so code that compares or logs a code, and peers reading ours, see the
same strings as before these enums existed. A code received from a peer stays a plain ``str``: a
peer may send one we do not know, and it is reported as it came.

docs/PROTOCOL.md §3 "Codes" lists every member with when it is sent; tests/schemas/test_codes.py
keeps the enums and that table equal.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum
from typing import NamedTuple

__all__ = ["CloseCode", "RejectCode", "SessionCode", "Violation"]


class RejectCode(StrEnum):
    """The seed's REJECT codes: the reference's ``RejectionCode`` enum (the first five; a Rust peer
    fails to parse any other code in a REJECT) and the M2M docs' ``SERVER_BUSY``, which we read but
    never send (a full server answers ``RATE_LIMITED``, as the reference does)."""

    VERSION_MISMATCH = "VERSION_MISMATCH"
    NO_COMMON_ALGORITHM = "NO_COMMON_ALGORITHM"
    SECURITY_POLICY = "SECURITY_POLICY"
    RATE_LIMITED = "RATE_LIMITED"
    UNKNOWN = "UNKNOWN"
    SERVER_BUSY = "SERVER_BUSY"


class SessionCode(StrEnum):
    """Our codes: why a session closed (a CLOSE's ``reason``, ``Closed.code``, an error's ``code``),
    and the REJECT codes of our extensions (resume, oversized HELLO lists)."""

    # An orderly end, and a server whose handler raised (transport close 1011 after the CLOSE).
    NORMAL = "NORMAL"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    # Timers (§3).
    HELLO_TIMEOUT = "HELLO_TIMEOUT"
    PONG_TIMEOUT = "PONG_TIMEOUT"
    SESSION_TIMEOUT = "SESSION_TIMEOUT"
    WRITE_TIMEOUT = "WRITE_TIMEOUT"
    TRANSPORT_CLOSED = "TRANSPORT_CLOSED"
    # Violations by the peer (§3), each closing the session.
    MALFORMED_MESSAGE = "MALFORMED_MESSAGE"
    DATA_BEFORE_HELLO = "DATA_BEFORE_HELLO"
    DATA_BEFORE_ACCEPT = "DATA_BEFORE_ACCEPT"
    BINARY_BEFORE_ACCEPT = "BINARY_BEFORE_ACCEPT"
    UNKNOWN_SESSION = "UNKNOWN_SESSION"
    INVALID_DATA = "INVALID_DATA"
    MODE_VIOLATION = "MODE_VIOLATION"
    UNEXPECTED_MESSAGE = "UNEXPECTED_MESSAGE"
    MESSAGE_TOO_BIG = "MESSAGE_TOO_BIG"
    INVALID_ACK = "INVALID_ACK"
    # Resume (§9).
    RESUME_UNKNOWN = "RESUME_UNKNOWN"
    RESUME_EXPIRED = "RESUME_EXPIRED"
    RESUME_REFUSED = "RESUME_REFUSED"
    RECONNECT_GAVE_UP = "RECONNECT_GAVE_UP"
    # Local only: a SessionProtocol method called in a state where it cannot act (never sent).
    INVALID_STATE = "INVALID_STATE"


class CloseCode(IntEnum):
    """The channel close codes m2mwire uses, WebSocket's (RFC 6455 section 7.4.1), on every
    transport: a QUIC or NATS channel's CLOSE and ABORT carry the same numbers. Members are ints
    (``CloseCode.NORMAL == 1000``), so a peer's code outside this list is reported as it came."""

    NORMAL = 1000
    GOING_AWAY = 1001
    PROTOCOL_ERROR = 1002
    ABNORMAL = 1006  # never sent in a close frame: how a lost or aborted connection is reported
    INVALID_DATA = 1007  # a text message that is not UTF-8
    POLICY_VIOLATION = 1008
    TOO_BIG = 1009
    INTERNAL_ERROR = 1011
    TRY_AGAIN_LATER = 1013


class Violation(NamedTuple):
    """A protocol rule the peer broke: the session closes with ``code``, telling the peer
    ``message`` (docs/PROTOCOL.md §3)."""

    code: SessionCode
    message: str
