"""What the session core asks its shell to do (:meth:`SessionProtocol.data_to_send`): write a
message, or close the channel underneath, with WebSocket-style close codes."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from m2mwire.codecs.buffers import Buffer

__all__ = [
    "CLOSE_REASON_BYTES",
    "CloseTransport",
    "Output",
    "SendMessage",
]


# Made once per message, so a frozen msgspec Struct like Message (ten times faster to build than a
# frozen dataclass).
class SendMessage(msgspec.Struct, frozen=True):
    """One message for the channel: a text message as its UTF-8 bytes (one ``bytes``, written as
    a text frame without re-encoding), or a binary message as a tuple of buffers."""

    message: bytes | tuple[Buffer, ...]

    @property
    def text(self) -> bool:
        return type(self.message) is bytes

    @property
    def binary(self) -> bool:
        return type(self.message) is not bytes


@dataclass(frozen=True, slots=True)
class CloseTransport:
    """Close the channel underneath with ``code`` (a :class:`~m2mwire.schemas.codes.CloseCode`)."""

    code: int
    reason: str


Output = SendMessage | CloseTransport

# A close reason's UTF-8 bytes at most (RFC 6455 section 5.5: a control frame's body is 125
# bytes, 2 of them the code; QUIC and NATS channels carry as much), cut at a character's end.
CLOSE_REASON_BYTES = 123
