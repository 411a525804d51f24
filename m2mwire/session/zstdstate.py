"""Per-session zstd state (sans-I/O): the two contexts of one session and its wire forms.

One :class:`ZstdSessionState` per established session that negotiated ``zstd``: a compressor for
what we send and a decompressor for what we receive, both with the agreed window and dictionary.
zstd's memory is taken on the first message of each direction, so a session that never uses zstd
costs nothing. :meth:`ZstdSessionState.reset` forgets both histories at once: resuming a session
(docs/PROTOCOL.md, "Context compression") calls it, then compresses retransmitted messages again.
"""

from __future__ import annotations

from m2mwire.codecs.varint import b64decode, b64encode
from m2mwire.codecs.zstdcontext import (
    ZSTD_KIND_BYTE,
    ZSTD_PREFIX,
    ContextCompressor,
    ContextDecompressor,
    ZstdDictionary,
    payload_bound,
)

__all__ = ["ZstdSessionState", "text_form_bound"]

_PREFIX_LEN = len(ZSTD_PREFIX)


def text_form_bound(size: int) -> int:
    """Largest ``#ZS|`` wire string for content of ``size`` UTF-8 bytes."""
    return _PREFIX_LEN + (payload_bound(size) + 2) // 3 * 4


class ZstdSessionState:
    """Both directions' zstd contexts of one session."""

    __slots__ = ("_receiver", "_sender", "peer_binary")

    def __init__(
        self, window: int, *, level: int, dictionary: ZstdDictionary | None, peer_binary: bool
    ) -> None:
        self._sender = ContextCompressor(window, level=level, dictionary=dictionary)
        self._receiver = ContextDecompressor(window, dictionary=dictionary)
        self.peer_binary = peer_binary  # the peer reads the binary form (else send "#ZS|" text)

    def encode_binary(self, message: bytes) -> bytes:
        """A binary message: ``0x5A`` + the payload of ``message`` (a whole DATA envelope)."""
        return ZSTD_KIND_BYTE + self._sender.compress(message)

    def encode_text(self, content: bytes) -> str:
        """A ``#ZS|`` wire string carrying ``content`` (the DATA content only)."""
        return ZSTD_PREFIX + b64encode(self._sender.compress(content))

    def decode_binary(self, frame: bytes | memoryview, limit: int) -> bytes:
        """The DATA envelope inside a binary message (first byte 0x5A), at most ``limit`` bytes."""
        return self._receiver.decompress(memoryview(frame)[1:], limit)

    def decode_text(self, wire: str, limit: int) -> bytes:
        """The content inside a ``#ZS|`` wire string, at most ``limit`` bytes."""
        payload = b64decode(wire[_PREFIX_LEN:], what="zstd base64", offset=_PREFIX_LEN)
        return self._receiver.decompress(payload, limit)

    def reset(self) -> None:
        """Forget both histories: the next message each way starts a new zstd frame."""
        self._sender.reset()
        self._receiver.reset()

    def memory_size(self) -> int:
        """Bytes zstd reserved for this session's contexts (0 until they are used)."""
        return self._sender.memory_size() + self._receiver.memory_size()
