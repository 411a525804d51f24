"""The UTF-8 size of text: the one helper every layer uses (codecs, session, transports).

Sizes are checked against byte limits (max_payload, frame lengths) before anything is encoded, so
they must count what the wire carries: ``surrogatepass`` counts a lone surrogate as the three bytes
an encoder that lets it through would write, instead of raising while we only measure.
"""

from __future__ import annotations

__all__ = ["utf8_len"]


def utf8_len(text: str) -> int:
    """Bytes of ``text`` in UTF-8. ASCII text (the common case: JSON envelopes, wire strings) is
    measured without encoding, since one character is one byte there."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
