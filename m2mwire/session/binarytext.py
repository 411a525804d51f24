"""Text DATA in binary form (kind ``T``): a large text message without JSON escaping.

A text DATA message carries its content as a JSON string, which both ends must escape and
unescape byte by byte: for a 64 KiB message, msgspec takes ~11.5 us to encode the envelope and
~11.7 us to decode it, where the content's UTF-8 encoding and decoding alone take ~0.6 and ~2.9 us
(benchmarks/bench_session_ws.py: over WebSocket that envelope was the whole difference between a
session and raw websockets at 64 KiB). Sessions that negotiated ``binary_text`` (docs/PROTOCOL.md
§4) therefore send text from :data:`BINARY_TEXT_MIN` bytes on as one binary message::

    'T'  |  DATA envelope, compact JSON, with "content": "" and no timestamp  |  '\\n'  |  content (UTF-8)

The same layout as what a zstd-context binary message compresses (zstdstate.inner_message),
uncompressed. Compact JSON never holds a raw line feed, so the first one ends the envelope; the
content is everything after it, validated as UTF-8 once (``str(view, "utf-8")``, no copy first).
The envelope carries what a text DATA envelope does (``algorithm`` is ``"none"``, ``content_type``,
a request's or an answer's fields), except the content itself.

Measured through a sans-I/O pair (send, then receive, CPU per message, best of 5), JSON text vs
binary form: 100 B 3.45 / 3.01 us, 1 KiB 4.04 / 3.27, 4 KiB 5.07 / 3.51, 16 KiB 9.35 / 4.13,
64 KiB 26.5 / 6.9. The binary form costs less at every size (a plain envelope is a cached line
both ways: no timestamp, nothing parsed); the threshold keeps messages under 1 KiB, where it saves
~0.5 us, readable as JSON text frames on the wire.
"""

from __future__ import annotations

from typing import Final, Literal

from m2mwire.errors import DecodeError
from m2mwire.schemas.messages import DataPayload, decode_data_bytes, encode_data_bytes

__all__ = ["BINARY_TEXT_KIND", "BINARY_TEXT_MIN", "BinaryText", "BinaryTextMessage"]

#: First byte of a text DATA message in binary form; "T" collides with no other binary kind
#: (TokenNative 0x00-0x02, M2M "#", AVP "A", zstd "Z" and "H").
BINARY_TEXT_KIND: Final = 0x54
#: Content of this many UTF-8 bytes or more goes in binary form on sessions that negotiated it.
BINARY_TEXT_MIN: Final = 1024
_KIND: Final = bytes((BINARY_TEXT_KIND,))
#: The line feed is searched for in this many leading bytes first: an envelope is far shorter
#: (a W3C tracestate, its longest field, is at most 512 characters).
_HEAD_SEARCH: Final = 4096

ContentType = Literal["text", "json"]


class BinaryTextMessage:
    """One text DATA message in binary form: its ``frame`` (what goes on the wire, ``size`` bytes)
    and what resume retains of it until acknowledged. Resume keeps the envelope line and the
    caller's ``text`` (a str: immutable, held by reference), not the frame, and builds the frame
    again on a resume (the same bytes). So retention allocates nothing: the frame is freed once
    written, as without resume, and the memory it used is reused hot by the next one (retaining
    the frames made reconnect=True 14-18 % slower for 64 KiB messages over WebSocket, with the
    same instructions: fresh memory for every frame). What it holds is the sender's own text: a
    str of n characters takes n to 4n bytes (CPython stores 1, 2 or 4 bytes per character), so
    retention of such messages is bounded by ``resume_buffer_bytes`` counted in frame bytes, up to
    4x that in memory for text whose widest character is outside the BMP."""

    __slots__ = ("frame", "head", "size", "text")

    def __init__(self, head: bytes, text: str) -> None:
        self.head = head
        self.text = text
        self.frame: bytes | None = b"\n".join((head, text.encode("utf-8")))
        self.size = len(self.frame)

    def take_frame(self) -> bytes:
        """The frame to send (made again after a resume), released here: only head and text stay."""
        frame = self.frame
        self.frame = None
        return frame if frame is not None else b"\n".join((self.head, self.text.encode("utf-8")))


def _plain(content_type: ContentType) -> DataPayload:
    return DataPayload(algorithm="none", content="", content_type=content_type)


class BinaryText:
    """The binary text form for one session: the envelope lines of its plain DATA, made once."""

    __slots__ = ("_known", "_lines", "session_id")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self._lines: dict[ContentType, bytes] = {
            kind: _KIND + encode_data_bytes(_plain(kind), session_id) for kind in ("text", "json")
        }
        # A received plain envelope of this session is recognised without parsing it.
        self._known: dict[bytes, ContentType] = {line[1:]: kind for kind, line in self._lines.items()}

    def encode(
        self, text: str, content_type: ContentType, correlation: DataPayload | None = None
    ) -> BinaryTextMessage:
        """The message for ``text``; ``correlation`` holds a request's or an answer's fields."""
        if correlation is None:
            head = self._lines[content_type]
        else:
            correlation.algorithm, correlation.content = "none", ""
            correlation.content_type = content_type
            head = _KIND + encode_data_bytes(correlation, self.session_id)
        return BinaryTextMessage(head, text)

    def decode(self, view: bytes | memoryview) -> tuple[str | None, DataPayload | None, ContentType, str]:
        """(session id, payload, content type, content) of a message whose first byte is the kind.
        The payload is None for a plain envelope of this session. Raises DecodeError, or
        ProtocolError for an envelope that is not a DATA message."""
        head = view[:_HEAD_SEARCH] if type(view) is bytes else bytes(view[:_HEAD_SEARCH])
        split = head.find(b"\n")
        if split < 0:
            if len(view) <= _HEAD_SEARCH:
                raise DecodeError("binary text message holds no line feed after its envelope")
            split = bytes(view).find(b"\n")  # an unusually long envelope (bounded by the message)
            if split < 0:
                raise DecodeError("binary text message holds no line feed after its envelope")
            head = bytes(view[:split])
        line = head[1:split]
        content_type = self._known.get(line)
        session_id: str | None = self.session_id
        payload: DataPayload | None = None
        if content_type is None:  # requests and answers, or another implementation's spelling
            envelope = decode_data_bytes(line)
            session_id, payload = envelope.session_id, envelope.payload
            if payload.algorithm != "none" or payload.content:
                raise DecodeError(
                    "a binary text message's envelope must say algorithm 'none' with an empty content "
                    f"(got algorithm {payload.algorithm[:20]!r} and {len(payload.content)} characters)"
                )
            content_type = "json" if payload.content_type == "json" else "text"
        body = memoryview(view)[split + 1 :]
        try:
            text = str(body, "utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(
                f"binary text content is not valid UTF-8 at byte {exc.start} ({exc.reason})"
            ) from None
        return session_id, payload, content_type, text
