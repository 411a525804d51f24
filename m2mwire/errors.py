"""The one exception hierarchy of m2mwire.

Every error the library raises on purpose derives from :class:`M2MError`, so callers can catch
one class. Messages say what was wrong, where, and (when there is something to do) what to do.

Every layer raises these, so this module is the bottom one: it imports nothing from m2mwire
(tests/test_layers.py asserts both).

    M2MError
    +-- DecodeError            malformed wire input (bad prefix, base64, varint, JSON, frame, ...)
    |   +-- ChecksumMismatch   a CRC or integrity check failed
    +-- EncodeError            content that the chosen algorithm cannot encode
    +-- ConfigError            an option or URL that is malformed or does not apply (also a ValueError)
    +-- LimitExceeded          a size/depth/count limit was hit (input or decompressed output)
    +-- TokenizerUnavailable   a tokenizer's data file is missing or corrupt
    +-- ProtocolError          a session peer broke the protocol (carries a code)
    +-- SessionRejected        the peer answered HELLO with REJECT (carries the REJECT code)
    +-- SessionClosed          the session is closed (carries code and reason)
    +-- SessionTimeout         a session timer expired (handshake, PONG, CLOSE, idle)
    +-- ModeError              e.g. an AVP frame sent on a session negotiated to JSON mode
    +-- TransportError         the underlying WebSocket/QUIC connection failed
    |   +-- ResumeImpossible   the server that held a session is gone: reconnecting cannot resume it
    |   +-- ListenError        a server cannot listen on its URL (address in use, ...; also an OSError)
    +-- Reject                 raised by a server's on_hello check to refuse a client
    +-- UnsupportedDependency  an installed library (websockets, ...) is a version m2mwire was not
                               verified against (also an ImportError)
"""

from __future__ import annotations

__all__ = [
    "ChecksumMismatch",
    "ConfigError",
    "DecodeError",
    "EncodeError",
    "LimitExceeded",
    "ListenError",
    "M2MError",
    "ModeError",
    "ProtocolError",
    "Reject",
    "ResumeImpossible",
    "SessionClosed",
    "SessionRejected",
    "SessionTimeout",
    "TokenizerUnavailable",
    "TransportError",
    "UnsupportedDependency",
]


class M2MError(Exception):
    """Base class of every error raised by m2mwire."""


class DecodeError(M2MError):
    """Wire input could not be decoded. Nothing partially decoded is ever returned."""


class ChecksumMismatch(DecodeError):
    """An integrity check (e.g. the AVP payload CRC-32) did not match."""


class EncodeError(M2MError):
    """The content cannot be encoded with the requested algorithm or options."""


class ConfigError(M2MError, ValueError):
    """An option or URL given to connect(), serve() (or the console) is malformed or does not apply.

    Raised at the call, before any connection is made; the message names the option and, for one
    that does not apply, lists those that do. Also a ValueError, as Python code expects of a bad
    argument.
    """


class LimitExceeded(M2MError):
    """A configured limit (message size, JSON depth, string length, array length, output size) was hit."""

    def __init__(self, message: str, *, limit: int | None = None, actual: int | None = None) -> None:
        super().__init__(message)
        self.limit = limit
        self.actual = actual


class TokenizerUnavailable(M2MError):
    """A tokenizer's rank file is missing or does not match its pinned SHA-256."""


class ProtocolError(M2MError):
    """The peer sent something the session protocol does not allow.

    ``code`` is a stable machine-readable string (e.g. ``"DATA_BEFORE_ACCEPT"``, ``"MALFORMED_MESSAGE"``).
    """

    def __init__(self, message: str, *, code: str = "PROTOCOL_ERROR") -> None:
        super().__init__(message)
        self.code = code


class SessionRejected(M2MError):
    """The server answered HELLO with REJECT."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class SessionClosed(M2MError):
    """The session is closed; ``code`` and ``reason`` say why."""

    def __init__(self, message: str, *, code: str = "CLOSED", reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason


class SessionTimeout(M2MError, TimeoutError):
    """A session timer expired (HELLO not answered, PONGs missed, CLOSE not acknowledged, idle)."""


class ModeError(M2MError):
    """The operation does not fit the negotiated communication mode."""


class TransportError(M2MError):
    """The WebSocket or QUIC channel failed or was closed underneath the session.

    ``code`` is the transport's close code when there is one (a WebSocket close code, or a QUIC
    application error code); ``clean`` is True when the peer closed the channel in an orderly way.
    """

    def __init__(
        self, message: str, *, code: int | None = None, reason: str = "", clean: bool = False
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.clean = clean


class ResumeImpossible(TransportError):
    """A transport established, while reconnecting, that the server holding the session is gone
    for good (e.g. the NATS worker process that held it ended: nothing listens on its subject any
    more), so no connection can resume the session. The reconnecting client stops at once and the
    session ends with ``SessionClosed(code="RESUME_UNKNOWN")`` carrying this message, rather than
    retrying until ``max_elapsed``."""


class ListenError(TransportError, OSError):
    """``serve()`` or ``gateway()`` could not listen on its URL: the address is in use, is not one
    of this machine's, or the port needs privileges. Also an OSError (with its ``errno``), as Python
    code expects of a failed bind."""

    def __init__(self, message: str, *, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


# The REJECT codes a peer understands: the reference implementation's RejectionCode enum (a Rust
# peer fails to parse any other), kept in step with m2mwire.schemas.messages.RejectCode.
_REJECT_CODES = ("VERSION_MISMATCH", "NO_COMMON_ALGORITHM", "SECURITY_POLICY", "RATE_LIMITED", "UNKNOWN")


class Reject(M2MError):
    """Raise in a server's ``on_hello`` check to refuse the client: it gets REJECT ``code``.

    ``code`` is one of ``SECURITY_POLICY`` (bad or missing credentials), ``RATE_LIMITED``,
    ``VERSION_MISMATCH``, ``NO_COMMON_ALGORITHM`` or ``UNKNOWN``; ``message`` is sent to the client.
    """

    def __init__(self, code: str, message: str = "") -> None:
        if code not in _REJECT_CODES:
            raise ValueError(f"Reject code must be one of {', '.join(_REJECT_CODES)}, not {code!r}")
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


class UnsupportedDependency(M2MError, ImportError):
    """An installed library is a version whose internals m2mwire was not verified against.

    Raised when a transport module is imported, before any connection is made; the message names
    the versions that are supported and the pip requirement that installs one. Also an ImportError,
    since it is what importing the transport raises.
    """
