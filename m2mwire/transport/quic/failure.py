"""Why a QUIC channel or connection is over, kept until each raise makes a fresh TransportError."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from m2mwire.errors import TransportError
from m2mwire.transport.framing import ErrorCode

__all__ = ["RESET_HINTS", "Failure"]


@dataclass(frozen=True)
class Failure:
    """Why a direction of a channel (or a connection) is over."""

    message: str
    code: int | None = None
    reason: str = ""
    clean: bool = False

    def error(self) -> TransportError:
        # A fresh exception per raise: re-raising one instance would grow its traceback each time.
        return TransportError(self.message, code=self.code, reason=self.reason, clean=self.clean)


# What the user should do about a stream error code the peer sent.
RESET_HINTS: Final[dict[int, str]] = {
    ErrorCode.MESSAGE_TOO_BIG: ": a message exceeded the peer's max_message_size (raise it there)",
    ErrorCode.FRAME_ERROR: ": the peer rejected malformed framing",
    ErrorCode.INVALID_UTF8: ": the peer received a text message that is not valid UTF-8",
    ErrorCode.INTERNAL_ERROR: ": the peer failed while handling the channel (see its logs)",
    ErrorCode.CANCELLED: ": the peer aborted the channel",
    ErrorCode.REFUSED: ": the peer refused the stream (shutting down, or a stream type m2mwire does not use)",
}
