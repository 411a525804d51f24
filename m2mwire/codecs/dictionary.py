"""Dictionary: ``#M2M|<base64>`` (also read as ``#DI|``), the seed's 8-pattern table, lossless for all text.

Emitted format (ours), over the UTF-8 bytes of the content:

* byte 0 is the format marker ``0xF9``;
* the seed's patterns are replaced by their code byte, greedily, longest pattern first;
* a literal byte ``0x80``-``0x87`` (a UTF-8 continuation byte) is escaped as ``0xF8`` + the byte;
* the result is padded standard base64.

``0xF8``-``0xFF`` never occur in UTF-8, so neither the escape nor the marker ever needs escaping, and a
decoder can always tell an escape from content.

Accepted besides: the Rust reference's dialect (v0.2/0.3), recognised by the missing marker: its
0x80-0xB4 table, any other high byte read as Latin-1, and a payload that is not base64 returned as is
(that is how the reference sends inputs under 50 bytes).
"""

from __future__ import annotations

import re
from typing import Final

from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits, check_size
from m2mwire.codecs.varint import b64decode, b64encode, utf8
from m2mwire.errors import DecodeError

__all__ = [
    "DICTIONARY_ALT_PREFIX",
    "DICTIONARY_PREFIX",
    "FORMAT_MARKER",
    "REFERENCE_PATTERNS",
    "SEED_PATTERNS",
    "decode_dictionary",
    "encode_dictionary",
]

DICTIONARY_PREFIX = "#M2M|"
DICTIONARY_ALT_PREFIX = "#DI|"  # the compression doc's spelling; accepted, never sent
FORMAT_MARKER = 0xF9
_ESCAPE = 0xF8

# Seed table (compression seed section 5.6.2).
SEED_PATTERNS: dict[int, bytes] = {
    0x80: b'{"role":"user","content":"',
    0x81: b'{"role":"assistant","content":"',
    0x82: b'{"role":"system","content":"',
    0x83: b'"}',
    0x84: b'"},',
    0x85: b'"}]',
    0x86: b'{"messages":[',
    0x87: b'{"model":"',
}

# The Rust reference's table (m2m-reference.md section 1.5); decode only.
REFERENCE_PATTERNS: dict[int, bytes] = {
    0x80: b'{"role":"user","content":',
    0x81: b'{"role":"assistant","content":',
    0x82: b'{"role":"system","content":',
    0x83: b'"}',
    0x84: b"},",
    0x85: b'"}]',
    0x86: b'{"messages":[',
    0x87: b'{"model":',
    0x88: b',"messages":[',
    0x89: b',"max_tokens":',
    0x8A: b',"temperature":',
    0x8B: b',"stream":true',
    0x8C: b',"stream":false',
    0x90: b'"gpt-4',
    0x91: b'"gpt-4o',
    0x92: b'"gpt-4o-mini',
    0x93: b'"gpt-3.5-turbo',
    0x94: b'"claude-3',
    0x95: b'"llama',
    0xA0: b'{"choices":[{',
    0xA1: b'"finish_reason":"stop"',
    0xA2: b'"finish_reason":"length"',
    0xA3: b',"usage":{',
    0xA4: b'"prompt_tokens":',
    0xA5: b',"completion_tokens":',
    0xA6: b',"total_tokens":',
    0xA7: b'"index":0,',
    0xA8: b'"message":{',
    0xA9: b'"delta":{',
    0xB0: b'"tool_calls":[{',
    0xB1: b'"type":"function",',
    0xB2: b'"function":{',
    0xB3: b'"name":',
    0xB4: b',"arguments":',
}

_CODES = bytes(SEED_PATTERNS)  # b"\x80...\x87"
_ENCODE_MAP: dict[bytes, bytes] = {pattern: bytes((code,)) for code, pattern in SEED_PATTERNS.items()}
_ENCODE_MAP.update({bytes((code,)): bytes((_ESCAPE, code)) for code in _CODES})
# Regex alternation is tried in order, so sorting longest first gives greedy longest-first matching.
_ENCODE_RE = re.compile(
    b"|".join(re.escape(p) for p in sorted(SEED_PATTERNS.values(), key=len, reverse=True)) + b"|[\x80-\x87]"
)
_DECODE_MAP: dict[bytes, bytes] = {bytes((code,)): pattern for code, pattern in SEED_PATTERNS.items()}
_DECODE_MAP.update({bytes((_ESCAPE, code)): bytes((code,)) for code in _CODES})
_DECODE_RE = re.compile(b"\xf8[\x80-\x87]|[\x80-\x87]")  # escape pair first, so its byte is not a code

# Output bytes per input byte beyond one, to bound the decoded size before expanding: each code
# byte adds its pattern's length less what the base rule already counted for it.
_SEED_EXTRA: Final = tuple((bytes((code,)), len(p) - 1) for code, p in SEED_PATTERNS.items())
# The reference dialect reads other high bytes as Latin-1: U+0080..U+00FF take two UTF-8 bytes.
_REFERENCE_EXTRA: Final = tuple((bytes((code,)), len(p) - 2) for code, p in REFERENCE_PATTERNS.items())
_HIGH_BYTES: Final = bytes(range(0x80, 0x100))
_REFERENCE_TRANSLATION = {code: pattern.decode("ascii") for code, pattern in REFERENCE_PATTERNS.items()}
_MAX_EXPANSION = max(len(p) for p in REFERENCE_PATTERNS.values())


def encode_dictionary(content: str, *, limits: Limits = DEFAULT_LIMITS) -> str:
    """Encode ``content`` as ``#M2M|<base64>`` in m2mwire's lossless dialect (module docstring)."""
    body = _ENCODE_RE.sub(lambda m: _ENCODE_MAP[m.group()], utf8(content))
    wire = DICTIONARY_PREFIX + b64encode(bytes((FORMAT_MARKER,)) + body)
    check_size("Dictionary wire message", len(wire), limits.max_message_bytes)
    return wire


def _decoded_size(body: bytes, extra: tuple[tuple[bytes, int], ...], high_bytes_double: bool) -> int:
    """The size ``body`` expands to: one byte each, two for bytes >= 0x80 when ``high_bytes_double``,
    plus ``extra`` per occurrence of each code. bytes.count/translate are C loops (no numpy needed)."""
    size = len(body)
    if high_bytes_double:
        size += len(body) - len(body.translate(None, _HIGH_BYTES))
    return size + sum(n * body.count(code) for code, n in extra)


def decode_dictionary(wire: str, *, limits: Limits = DEFAULT_LIMITS) -> str:
    """Decode ``#M2M|<payload>`` or ``#DI|<payload>`` in either dialect (module docstring)."""
    check_size("Dictionary wire message", len(wire), limits.max_message_bytes)
    if wire.startswith(DICTIONARY_PREFIX):
        start = len(DICTIONARY_PREFIX)
    elif wire.startswith(DICTIONARY_ALT_PREFIX):
        start = len(DICTIONARY_ALT_PREFIX)
    else:
        raise DecodeError(
            f"not a Dictionary message: expected {DICTIONARY_PREFIX!r} or {DICTIONARY_ALT_PREFIX!r}"
        )
    payload = wire[start:]
    limit = limits.max_output_bytes
    try:
        data = b64decode(payload, what="Dictionary base64", offset=start)
    except DecodeError:
        # Reference dialect: a payload that is not base64 is the raw content (inputs under 50 bytes).
        check_size("decoded Dictionary content", len(payload), limit)
        return payload
    if data[:1] == bytes((FORMAT_MARKER,)):
        return _decode_seed(data[1:], limit)
    return _decode_reference(data, limit)


def _decode_seed(body: bytes, limit: int) -> str:
    if len(body) * len(SEED_PATTERNS[0x81]) > limit:  # cheap bound first; exact count only when needed
        size = _decoded_size(body, _SEED_EXTRA, False)
        if size > limit:  # the bound counted each escaped byte as a pattern: correct it
            size -= sum(body.count(bytes((_ESCAPE, c))) * len(SEED_PATTERNS[c]) for c in _CODES)
        check_size("decoded Dictionary content", size, limit)
    expanded = _DECODE_RE.sub(lambda m: _DECODE_MAP[m.group()], body)
    check_size("decoded Dictionary content", len(expanded), limit)
    try:
        return expanded.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(
            f"Dictionary content is not valid UTF-8 at byte {exc.start} of the expanded output "
            f"({exc.reason}); bytes 0xF8-0xFF other than an escape (0xF8 + 0x80..0x87) are invalid"
        ) from None


def _decode_reference(data: bytes, limit: int) -> str:
    # The reference emits only ASCII and its codes; other high bytes it reads as Latin-1.
    if len(data) * _MAX_EXPANSION > limit:
        check_size("decoded Dictionary content", _decoded_size(data, _REFERENCE_EXTRA, True), limit)
    text = data.decode("latin-1").translate(_REFERENCE_TRANSLATION)
    if len(text) * 2 > limit:  # Latin-1 characters may take two UTF-8 bytes
        check_size("decoded Dictionary content", len(text.encode("utf-8")), limit)
    return text
