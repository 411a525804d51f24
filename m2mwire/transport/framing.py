"""Sans-I/O message framing for one QUIC stream (one m2mwire channel).

A QUIC stream is a byte stream, so m2mwire delimits messages on it with a 5-byte header::

    +--------+--------+--------+--------+--------+=================+
    |  kind  |        length (uint32, big-endian)  |  body (length)  |
    +--------+--------+--------+--------+--------+=================+

``kind`` is ``0x01`` (text: the body is UTF-8, carrying a JSON envelope), ``0x02`` (binary: opaque
bytes) or ``0x03`` (close: a 2-byte big-endian close code and an optional UTF-8 reason, at most 125
bytes in all, sent once right before the stream's FIN). Any other kind byte is a framing error.
docs/QUIC.md is the normative description; this module is the reference implementation.

Nothing here does I/O, so it is exercised byte by byte in the tests. :class:`Deframer` never copies
quadratically: incoming chunks are kept as they arrive and a body is joined once, when complete,
and the size limit is checked from the header, before any body byte is buffered.
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from m2mwire.codecs.utf8 import cut_utf8
from m2mwire.errors import DecodeError

__all__ = [
    "CLOSE_REASON_MAX_BYTES",
    "HEADER_SIZE",
    "KIND_BINARY",
    "KIND_CLOSE",
    "KIND_TEXT",
    "MAX_FRAME_LENGTH",
    "CloseFrame",
    "Deframer",
    "ErrorCode",
    "FramingError",
    "encode_binary",
    "encode_close",
    "encode_header",
    "encode_text",
]

KIND_TEXT = 0x01
KIND_BINARY = 0x02
KIND_CLOSE = 0x03

HEADER_SIZE = 5
MAX_FRAME_LENGTH = 0xFFFF_FFFF  # the length field is 32 bits
# Same budget as a WebSocket close frame: 2-byte code + up to 123 bytes of UTF-8 reason.
CLOSE_BODY_MAX_BYTES = 125
CLOSE_REASON_MAX_BYTES = CLOSE_BODY_MAX_BYTES - 2

_HEADER = struct.Struct(">BI")
_DATA_KINDS = (KIND_TEXT, KIND_BINARY)
_CODE = struct.Struct(">H")


class ErrorCode(enum.IntEnum):
    """QUIC application error codes used by m2mwire (RESET_STREAM, STOP_SENDING, CONNECTION_CLOSE).

    Channel close codes given to ``close()``/``abort()`` by the session layer (1000-4999, the
    WebSocket close-code space) travel unchanged in the same fields; the two ranges do not overlap.
    """

    NO_ERROR = 0x0  # orderly: connection closed normally, or STOP_SENDING after a local close()
    INTERNAL_ERROR = 0x1  # the implementation (e.g. a server handler) failed unexpectedly
    MESSAGE_TOO_BIG = 0x2  # a frame's length exceeds the receiver's max_message_size
    FRAME_ERROR = 0x3  # malformed framing: unknown kind, bad close frame, data after close, truncated
    INVALID_UTF8 = 0x4  # a text frame's body (or a close reason) is not valid UTF-8
    CANCELLED = 0x5  # the local side aborted the channel (e.g. a send was cancelled mid-message)
    REFUSED = 0x6  # stream not accepted: wrong direction/initiator, or the server is shutting down
    GOING_AWAY = 0x7  # CONNECTION_CLOSE: the server is shutting down (orderly)

    @classmethod
    def describe(cls, code: int | None) -> str:
        """``"2 (MESSAGE_TOO_BIG)"`` for known codes, the bare number otherwise."""
        if code is None:
            return "none"
        try:
            return f"{code} ({cls(code).name})"
        except ValueError:
            return str(code)


class FramingError(DecodeError):
    """The byte stream of a channel violates the framing; ``code`` is the :class:`ErrorCode` to send."""

    def __init__(self, message: str, *, code: ErrorCode) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class CloseFrame:
    """The peer's close code and reason, received right before its FIN."""

    code: int
    reason: str


def encode_header(kind: int, length: int) -> bytes:
    """The 5-byte header of a frame."""
    if kind not in (KIND_TEXT, KIND_BINARY, KIND_CLOSE):
        raise ValueError(f"unknown frame kind {kind:#04x}")
    if not 0 <= length <= MAX_FRAME_LENGTH:
        raise ValueError(
            f"a message of {length} bytes does not fit the 32-bit length field "
            f"(at most {MAX_FRAME_LENGTH} bytes); split it"
        )
    return _HEADER.pack(kind, length)


def encode_text(text: str) -> bytes:
    """A complete text frame (header and UTF-8 body). Raises UnicodeEncodeError on lone surrogates."""
    body = text.encode("utf-8")
    return encode_header(KIND_TEXT, len(body)) + body


def encode_binary(parts: Sequence[bytes | bytearray | memoryview]) -> list[bytes | bytearray | memoryview]:
    """Header plus the given buffers, unjoined, so large payloads are never concatenated here."""
    length = sum(memoryview(p).nbytes for p in parts)
    return [encode_header(KIND_BINARY, length), *parts]


def encode_close(code: int, reason: str = "") -> bytes:
    """A complete close frame. The reason is cut (at a character boundary) to 123 UTF-8 bytes."""
    if not 0 <= code <= 0xFFFF:
        raise ValueError(f"close code {code} does not fit in 16 bits")
    raw = cut_utf8(reason.encode("utf-8", "replace"), CLOSE_REASON_MAX_BYTES)
    return encode_header(KIND_CLOSE, 2 + len(raw)) + _CODE.pack(code) + raw


class Deframer:
    """Incremental decoder: :meth:`feed` bytes as they arrive, then call :meth:`next_frame` (or
    :meth:`next_message`).

    ``next_frame()`` returns ``(body, text)`` for a message (a text body as its UTF-8 bytes, not
    validated: the session does that as it parses), a :class:`CloseFrame`, or ``None`` when more
    bytes are needed (or the stream ended cleanly; see :attr:`finished`). ``next_message()`` is the
    same with text decoded to ``str`` (a text body that is not UTF-8 is then a violation). Both
    raise :class:`FramingError` on a violation; the deframer then stays failed and raises the same
    error again. Messages completed before the violation are returned first, in order.
    """

    __slots__ = (
        "_chunks",
        "_closed",
        "_eof",
        "_error",
        "_kind",
        "_length",
        "_max_message_size",
        "_pos",
        "buffered",
    )

    def __init__(self, max_message_size: int) -> None:
        self._max_message_size = _check_limit(max_message_size)
        self._chunks: deque[bytes] = deque()
        self._pos = 0  # read offset into _chunks[0]
        # Bytes received but not yet returned as part of a message (a plain attribute: read per message).
        self.buffered = 0
        self._kind = 0  # 0 = waiting for a header
        self._length = 0
        self._eof = False
        self._closed = False  # a close frame was decoded; only EOF may follow
        self._error: FramingError | None = None

    @property
    def max_message_size(self) -> int:
        return self._max_message_size

    @max_message_size.setter
    def max_message_size(self, size: int) -> None:
        # Applies to frames whose header has not been decoded yet.
        self._max_message_size = _check_limit(size)

    @property
    def finished(self) -> bool:
        """True once EOF was fed and every complete message was returned, with nothing left over."""
        return self._eof and self._error is None and self.buffered == 0 and self._kind == 0

    @property
    def close_received(self) -> bool:
        return self._closed

    @property
    def held(self) -> int:
        """Buffered bytes that are not part of the message now being received.

        While a frame's body is incomplete (its header was decoded and accepted), the bytes of that
        body are not counted: a receiver may treat them as consumed, so that messages larger than
        its flow-control window still flow. What remains are bytes not yet decoded at all.
        """
        if self._kind == 0:
            return self.buffered
        return max(0, self.buffered - self._length)

    @property
    def ready(self) -> bool:
        """True when :meth:`next_message` may return a message or raise (not just return None)."""
        if self._error is not None or self._eof:
            return True
        return self.buffered >= (HEADER_SIZE if self._kind == 0 else self._length)

    def discard(self) -> None:
        """Drop everything buffered and everything fed later (the channel is over)."""
        self._chunks.clear()
        self._pos = 0
        self.buffered = 0
        self._kind = 0
        if self._error is None:
            self._error = FramingError("input discarded", code=ErrorCode.CANCELLED)

    def feed(self, data: bytes) -> None:
        if self._eof:
            raise RuntimeError("feed() after feed_eof()")
        if data and self._error is None:
            self._chunks.append(data)
            self.buffered += len(data)

    def feed_eof(self) -> None:
        self._eof = True

    def next_message(self) -> str | bytes | CloseFrame | None:
        """The next message with text decoded to ``str``: for a channel used without a session."""
        frame = self.next_frame()
        if not isinstance(frame, tuple):
            return frame
        body, text = frame
        if not text:
            return body
        try:
            return str(body, "utf-8")
        except UnicodeDecodeError as exc:
            self._error = FramingError(
                f"text frame is not valid UTF-8 ({exc.reason} at byte {exc.start})",
                code=ErrorCode.INVALID_UTF8,
            )
            self._chunks.clear()
            self.buffered = 0
            raise self._error from None

    def next_frame(self) -> tuple[bytes, bool] | CloseFrame | None:
        if self._error is not None:
            raise self._error
        if self._kind == 0 and self.buffered >= HEADER_SIZE and not self._closed:
            # Fast path: a whole text or binary frame inside the first chunk (the common case for
            # small messages), taken with one slice.
            chunk = self._chunks[0]
            pos = self._pos
            if len(chunk) - pos >= HEADER_SIZE:
                kind, length = _HEADER.unpack_from(chunk, pos)
                start = pos + HEADER_SIZE
                end = start + length
                if end <= len(chunk) and length <= self._max_message_size and kind in _DATA_KINDS:
                    self._advance(end, HEADER_SIZE + length)
                    return chunk[start:end], kind == KIND_TEXT
        try:
            return self._next()
        except FramingError as exc:
            self._error = exc
            self._chunks.clear()
            self.buffered = 0
            raise

    # -- internals -------------------------------------------------------------------------------

    def _next(self) -> tuple[bytes, bool] | CloseFrame | None:
        if self._kind == 0:
            if self.buffered < HEADER_SIZE:
                if self._eof and self.buffered:
                    raise FramingError(
                        f"stream ended inside a frame header ({self.buffered} of {HEADER_SIZE} bytes)",
                        code=ErrorCode.FRAME_ERROR,
                    )
                return None
            kind, length = self._read_header()
            if self._closed:
                raise FramingError(
                    "frame received after the close frame (only the stream's end may follow it)",
                    code=ErrorCode.FRAME_ERROR,
                )
            if kind == KIND_CLOSE:
                if not 2 <= length <= CLOSE_BODY_MAX_BYTES:
                    raise FramingError(
                        f"close frame body of {length} bytes (must be 2 to {CLOSE_BODY_MAX_BYTES})",
                        code=ErrorCode.FRAME_ERROR,
                    )
            elif kind not in (KIND_TEXT, KIND_BINARY):
                raise FramingError(
                    f"unknown frame kind {kind:#04x} (expected 0x01 text, 0x02 binary or 0x03 close)",
                    code=ErrorCode.FRAME_ERROR,
                )
            elif length > self._max_message_size:
                raise FramingError(
                    f"incoming message of {length} bytes exceeds max_message_size "
                    f"({self._max_message_size} bytes); raise the limit on the receiving side "
                    "or send smaller messages",
                    code=ErrorCode.MESSAGE_TOO_BIG,
                )
            self._kind = kind
            self._length = length
        if self.buffered < self._length:
            if self._eof:
                raise FramingError(
                    f"stream ended inside a frame ({self.buffered} of {self._length} body bytes)",
                    code=ErrorCode.FRAME_ERROR,
                )
            return None
        kind, self._kind = self._kind, 0
        body = self._read_body(self._length)
        if kind != KIND_CLOSE:
            return (body if isinstance(body, bytes) else bytes(body)), kind == KIND_TEXT
        raw = bytes(body)
        try:
            reason = raw[2:].decode("utf-8")
        except UnicodeDecodeError:
            raise FramingError("close frame reason is not valid UTF-8", code=ErrorCode.INVALID_UTF8) from None
        self._closed = True
        return CloseFrame(code=_CODE.unpack_from(raw)[0], reason=reason)

    def _read_header(self) -> tuple[int, int]:
        chunk = self._chunks[0]
        if len(chunk) - self._pos >= HEADER_SIZE:
            kind, length = _HEADER.unpack_from(chunk, self._pos)
            self._consume(HEADER_SIZE)
        else:
            kind, length = _HEADER.unpack(bytes(self._read_body(HEADER_SIZE)))
        return int(kind), int(length)

    def _advance(self, end: int, n: int) -> None:
        # Move the read position to `end` within _chunks[0], n bytes further.
        self.buffered -= n
        if end == len(self._chunks[0]):
            self._chunks.popleft()
            self._pos = 0
        else:
            self._pos = end

    def _consume(self, n: int) -> None:
        # Advance within _chunks[0]; the caller guarantees it holds n unread bytes.
        self._pos += n
        self.buffered -= n
        if self._pos == len(self._chunks[0]):
            self._chunks.popleft()
            self._pos = 0

    def _read_body(self, n: int) -> bytes | memoryview:
        """Take exactly n buffered bytes: zero-copy when one whole chunk, one copy otherwise."""
        if n == 0:
            return b""
        chunk = self._chunks[0]
        pos = self._pos
        if len(chunk) - pos >= n:
            if pos == 0 and len(chunk) == n:
                self._chunks.popleft()
                self.buffered -= n
                return chunk
            view = memoryview(chunk)[pos : pos + n]
            self._consume(n)
            return view
        parts: list[bytes | memoryview] = []
        need = n
        while need:  # bounded: each pass consumes a chunk or finishes
            chunk = self._chunks[0]
            take = min(len(chunk) - self._pos, need)
            parts.append(memoryview(chunk)[self._pos : self._pos + take] if take < len(chunk) else chunk)
            self._consume(take)
            need -= take
        return b"".join(parts)


def _check_limit(size: int) -> int:
    if not 0 <= size <= MAX_FRAME_LENGTH:
        raise ValueError(f"max_message_size must be between 0 and {MAX_FRAME_LENGTH} bytes, got {size}")
    return size
