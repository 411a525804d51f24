"""Per-session zstd state (sans-I/O): the two contexts of one session and its wire forms.

One :class:`ZstdSessionState` per established session that negotiated ``zstd``: a compressor for
what we send and a decompressor for what we receive, both with the agreed window and dictionary.
zstd's memory is taken on the first message of each direction, so a session that never uses zstd
costs nothing. :meth:`ZstdSessionState.reset` forgets both histories at once: resuming a session
(docs/PROTOCOL.md, "Context compression") calls it, then compresses retransmitted messages again.

Resume retains a zstd message as a :class:`ZstdMessage` (what went into the context, never its
compressed bytes: those are only valid in the context they were made in) and :meth:`wire` turns it
into its wire form in the context of the moment, the first time and after a reset alike.
"""

from __future__ import annotations

from typing import Literal

from m2mwire.codecs.varint import b64decode, b64encode
from m2mwire.codecs.zstdcontext import (
    ZSTD_HISTORY_KIND,
    ZSTD_KIND,
    ZSTD_PREFIX,
    ContextCompressor,
    ContextDecompressor,
    ZstdDictionary,
    payload_bound,
)
from m2mwire.codecs.zstdhistory import MAX_HEADER, HistoryContext
from m2mwire.errors import DecodeError
from m2mwire.schemas.messages import DataPayload, decode_data_bytes, encode_data, encode_data_bytes

__all__ = [
    "MAX_ENVELOPE",
    "ContentType",
    "ZstdMessage",
    "ZstdSessionState",
    "inner_message",
    "text_form_bound",
]

_PREFIX_LEN = len(ZSTD_PREFIX)
#: The longest envelope line a binary zstd message may carry, its line feed included. Ours are
#: ~100 bytes, ~700 with a request's W3C trace context (tracestate: at most 512 characters).
#: Without a bound, a ~600-byte message decompressing to a 16 MiB envelope of spaces cost ~35 ms
#: to copy, hash and parse, and was charged nothing by the decode budget, which counts content
#: (stop 33's attack run: one core held for 35 s by 724 KB). With it, an envelope costs at most
#: ~16 us to parse, whatever the message's size.
MAX_ENVELOPE = 16 * 1024


def text_form_bound(size: int) -> int:
    """Largest ``#ZS|`` wire string for content of ``size`` UTF-8 bytes (with shared history, the
    payload has a header of up to MAX_HEADER bytes: counted always, the bound stays one rule)."""
    return _PREFIX_LEN + (MAX_HEADER + payload_bound(size) + 2) // 3 * 4


ContentType = Literal["text", "json"]


def inner_message(text: str, content_type: ContentType, session_id: str) -> bytes:
    """What a binary zstd message compresses: the DATA envelope with an empty ``content`` (no
    ``original_size``: it is the content's size; no ``timestamp``), a line feed, then the content's
    UTF-8 bytes.

    Compressing the envelope too makes it cost a few bytes in context. The content is left
    unescaped: JSON escaping inside an envelope would break matches with earlier messages (and a
    dictionary) on every quote.
    """
    return _envelope(content_type, session_id) + text.encode("utf-8")


def _envelope(content_type: ContentType, session_id: str) -> bytes:
    payload = DataPayload(algorithm="zstd", content="", content_type=content_type)
    return encode_data_bytes(payload, session_id) + b"\n"


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"zstd content is not valid UTF-8 at byte {exc.start} ({exc.reason})") from None


class ZstdMessage:
    """One zstd message as resume retains it: what goes through the context, never the compressed
    bytes (they decode only in the context they were made in; after a resume both contexts restart,
    docs/PROTOCOL.md "Resume").

    Binary form: ``inner`` is the envelope line + content (see :func:`inner_message`) and
    ``payload`` is None. Text form: ``inner`` is the content and ``payload`` its DATA payload,
    whose ``content`` is replaced by the ``#ZS|`` string each time it is encoded. ``size`` is what
    resume counts for it on both ends: the message decompressed (see :meth:`ZstdSessionState.wire`).
    """

    __slots__ = ("inner", "payload", "size")

    def __init__(self, inner: bytes, payload: DataPayload | None = None) -> None:
        self.inner = inner
        self.payload = payload
        self.size = len(inner) if payload is None else -1  # text form: set by the first wire()


class ZstdSessionState:
    """Both directions' zstd contexts of one session."""

    __slots__ = (
        "_compress",
        "_contexts",
        "_decompress",
        "_envelopes",
        "_kind_byte",
        "_known",
        "_session_id",
        "history",
        "kind",
        "peer_binary",
        "received_size",
    )

    def __init__(
        self,
        session_id: str,
        window: int,
        *,
        level: int,
        dictionary: ZstdDictionary | None,
        peer_binary: bool,
        history: bool = False,
    ) -> None:
        # Shared history (negotiated, docs/CODECS.md section 8) changes the payload (a header in
        # front of the CRC-32) and the binary kind byte; otherwise one context per direction.
        self._contexts: HistoryContext | tuple[ContextCompressor, ContextDecompressor]
        if history:
            shared = HistoryContext(window, level=level, dictionary=dictionary)
            self._contexts = shared
            self._compress, self._decompress = shared.compress, shared.decompress
        else:
            sender = ContextCompressor(window, level=level, dictionary=dictionary)
            receiver = ContextDecompressor(window, dictionary=dictionary)
            self._contexts = (sender, receiver)
            self._compress, self._decompress = sender.compress, receiver.decompress
        self.history = history
        self.kind = ZSTD_HISTORY_KIND if history else ZSTD_KIND  # the first byte of binary messages
        self._kind_byte = bytes((self.kind,))
        self.peer_binary = peer_binary  # the peer reads the binary form (else send "#ZS|" text)
        self._session_id = session_id
        # Without a timestamp the envelope of a session is one of two byte strings: made once,
        # and an incoming one equal to ours is known without parsing it.
        text, json = _envelope("text", session_id), _envelope("json", session_id)
        self._envelopes: dict[str, bytes] = {"text": text, "json": json}
        self._known: dict[bytes, tuple[str, ContentType]] = {
            text: (session_id, "text"),
            json: (session_id, "json"),
        }
        self.received_size = 0  # decompressed bytes of the last binary message (resume counts them)

    def envelope(self, content_type: ContentType, correlation: DataPayload | None = None) -> bytes:
        """The envelope line of a binary message (see inner_message); ``correlation`` carries a
        request's or an answer's fields (its ``content`` is ignored)."""
        if correlation is None:
            return self._envelopes[content_type]
        correlation.content, correlation.content_type = "", content_type
        return encode_data_bytes(correlation, self._session_id) + b"\n"

    def encode_binary(self, envelope: bytes, text: str) -> bytes:
        """A binary message: the kind byte + the payload of ``envelope`` (see :meth:`envelope`) + ``text``."""
        return self._compress(envelope + text.encode("utf-8"), self._kind_byte)

    def wire(self, message: ZstdMessage) -> bytes | tuple[bytes]:
        """``message`` compressed in the context as it is now: a binary message (as the one
        buffer of a SendMessage) or a text DATA envelope carrying ``#ZS|`` (its UTF-8 bytes).

        The first call fixes ``message.size`` for the text form: the envelope's bytes with
        the ``#ZS|`` string replaced by the content's bytes, which is also what the receiver can
        count (the length of what it got, minus the wire content, plus the decoded content).
        """
        payload = message.payload
        if payload is None:  # the kind byte (0x5A, or 0x48 with shared history) + payload
            return (self._compress(message.inner, self._kind_byte),)
        wire = payload.content = self.encode_text(message.inner)
        envelope = encode_data(payload, self._session_id)
        if message.size < 0:
            message.size = len(envelope) - len(wire) + len(message.inner)
        return envelope

    def encode_text(self, content: bytes) -> str:
        """A ``#ZS|`` wire string carrying ``content`` (the DATA content only)."""
        return ZSTD_PREFIX + b64encode(self._compress(content))

    def decode_binary(
        self, frame: bytes | memoryview, limit: int
    ) -> tuple[str | None, DataPayload | None, ContentType, str]:
        """(session id, payload, content type, content) of a binary message (first byte ``kind``); the
        payload is None for a plain envelope of this session, which is recognised without parsing.
        At most ``limit`` bytes are decompressed. Raises DecodeError, LimitExceeded or ProtocolError."""
        raw = self._decompress(frame, limit, 1)
        self.received_size = len(raw)
        # Compact JSON never holds a raw line feed: the envelope ends at the first.
        split = raw.find(b"\n", 0, MAX_ENVELOPE) + 1
        if not split:
            if len(raw) >= MAX_ENVELOPE:
                raise DecodeError(
                    f"zstd binary message's envelope is longer than {MAX_ENVELOPE} bytes "
                    "(docs/CODECS.md section 8)"
                )
            raise DecodeError("zstd binary message holds no line feed between the envelope and the content")
        known = self._known.get(raw[:split])
        session_id: str | None
        payload: DataPayload | None = None
        if known is not None:
            session_id, content_type = known
        else:  # requests and answers, or another implementation's spelling: parse it
            envelope = decode_data_bytes(raw[: split - 1])
            session_id, payload = envelope.session_id, envelope.payload
            content_type = "json" if payload.content_type == "json" else "text"
        return session_id, payload, content_type, _text(raw[split:])

    def decode_text(self, wire: str, limit: int) -> str:
        """The content inside a ``#ZS|`` wire string, at most ``limit`` bytes."""
        payload = b64decode(wire[_PREFIX_LEN:], what="zstd base64", offset=_PREFIX_LEN)
        return _text(self._decompress(payload, limit))

    def reset(self) -> None:
        """Forget both histories: the next message each way starts a new zstd frame."""
        if isinstance(self._contexts, HistoryContext):
            self._contexts.reset()
        else:
            for context in self._contexts:
                context.reset()

    def memory_size(self) -> int:
        """Bytes zstd reserved for this session's contexts (0 until they are used), plus the
        shared history retained."""
        if isinstance(self._contexts, HistoryContext):
            return self._contexts.memory_size()
        return sum(context.memory_size() for context in self._contexts)
