"""The UTF-8 size of text, and the UTF-8 check of received text: the one helper of each that every
layer uses (codecs, session, transports).

Sizes are checked against byte limits (max_payload, frame lengths) before anything is encoded, so
they must count what the wire carries: ``surrogatepass`` counts a lone surrogate as the three bytes
an encoder that lets it through would write, instead of raising while we only measure.
"""

from __future__ import annotations

from m2mwire.errors import DecodeError

__all__ = ["check_utf8", "cut_utf8", "utf8_len"]


def utf8_len(text: str) -> int:
    """Bytes of ``text`` in UTF-8. ASCII text (the common case: JSON envelopes, wire strings) is
    measured without encoding, since one character is one byte there."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def cut_utf8(data: bytes, limit: int) -> bytes:
    """The longest prefix of UTF-8 ``data`` in at most ``limit`` bytes that ends on a whole
    character: a cut character would make a strict decoder refuse the whole (websockets refuses
    to send such a close reason). Close reasons and header strings are cut with it."""
    return data if len(data) <= limit else data[:limit].decode("utf-8", "ignore").encode("utf-8")


def check_utf8(data: bytes | bytearray | memoryview) -> None:
    """Raise DecodeError unless ``data`` is valid UTF-8 (strict: no surrogates, no overlong
    forms). ASCII, the common case, is recognised by one scan, without decoding."""
    if type(data) is not bytes:
        data = bytes(data)
    if data.isascii():
        return
    try:
        str(data, "utf-8")  # CPython has no validate-only call; the str is dropped
    except UnicodeDecodeError as exc:
        raise DecodeError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
