"""M2M v1 frames (``#M2M|1|``), the Rust reference 0.4's default algorithm ``m2m``.

A frame carries the original JSON text byte for byte, behind a header a router can read without
decompressing (model, message roles, a cost estimate). docs/CODECS.md section "M2M v1 frames" is the
normative description; in short, after the ASCII prefix ``#M2M|1|`` (all integers little-endian):

=========  ======  ==================================================================================
offset     size    field
=========  ======  ==================================================================================
0          2       header_len = 20 + length of the variable header
2          1       schema: 0x01 request, 0x02 response
3          1       security: 0x00 (HMAC 0x01 / AEAD 0x02 exist in the reference library; refused here)
4          2       schema flags (request or response bits)
6          1       reserved, 0
7          1       common flags: bit 0 = payload is Brotli-compressed
8          12      reserved, 0
20         var     variable header: request routing header or response header
then       4       payload_len
then       4       CRC-32 (zlib.crc32) of the original UTF-8 JSON
then       n       payload: Brotli (quality 5, lgwin 22) when the JSON is >= 100 bytes, else the JSON
=========  ======  ==================================================================================

Text form (what DATA messages carry): ``#M2M|1|`` + padded standard base64 of everything after the
prefix. Binary form (a WebSocket binary message / QUIC binary frame): ``#M2M|1|`` + the raw bytes.

The encoder reproduces the reference's bytes exactly (tests/codecs/test_m2mframe.py checks all five
reference vectors). The decoder needs only ``header_len`` to find the payload, so it does not parse the
variable header (which is informational; the reference's own decoder skips exactly that many bytes).
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import brotli

from m2mwire.codecs.compressed import brotli_decompress
from m2mwire.codecs.jsonutil import loads_limited
from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits, check_size
from m2mwire.codecs.utf8 import cut_utf8
from m2mwire.codecs.varint import b64decode, b64encode, pack_varints, utf8
from m2mwire.errors import ChecksumMismatch, DecodeError, EncodeError

__all__ = [
    "M2M_PREFIX",
    "decode_m2m",
    "decode_m2m_binary",
    "encode_m2m",
    "encode_m2m_binary",
]

M2M_PREFIX = "#M2M|1|"
_PREFIX_BYTES = M2M_PREFIX.encode("ascii")
_FIXED = 20  # fixed header bytes
_RESERVED = bytes(12)
# The reference compresses the payload from this many UTF-8 bytes of JSON on, with Brotli q5 lgwin 22
# (its CompressorWriter's 4096-byte buffer does not change the stream: the vectors match one-shot
# compression byte for byte).
_COMPRESS_FROM = 100
_QUALITY = 5
_LGWIN = 22
_COMPRESSED = 0x01  # common flags bit 0
_SCHEMA_REQUEST = 0x01
_SCHEMA_RESPONSE = 0x02
_U8_MAX = 0xFF
_U16_MAX = 0xFFFF
_U32_MASK = 0xFFFFFFFF
_U64_MAX = 0xFFFFFFFFFFFFFFFF

# Request flag bits: a top-level key whose mere presence sets the bit (any value, null included).
_PRESENCE_BITS = (
    (("tools", "functions"), 1),
    (("tool_choice", "function_call"), 2),
    (("response_format",), 5),
    (("max_tokens", "max_completion_tokens"), 6),
    (("reasoning_effort",), 7),
    (("service_tier",), 8),
    (("seed",), 9),
    (("logprobs",), 10),
    (("user",), 11),
    (("temperature",), 12),
    (("top_p",), 13),
    (("stop",), 14),
)
_HAS_MAX_TOKENS = 1 << 6
_ROLES = {"system": 0, "developer": 0, "user": 1, "assistant": 2, "tool": 3}
_FINISH_REASONS = {"stop": 0, "length": 1, "tool_calls": 2, "content_filter": 3}
_FINISH_UNKNOWN = 0xFF
# Response flag bits.
_R_TOOL_CALLS, _R_REFUSAL, _R_FILTERED, _R_USAGE = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_R_TRUNCATED, _R_CACHED, _R_REASONING, _R_COST = 1 << 4, 1 << 5, 1 << 6, 1 << 7

# Price per 1K tokens in US cents (input, output), by lower-cased model prefix, first match wins.
_PRICES: tuple[tuple[tuple[str, ...], float, float], ...] = (
    (("gpt-4o-mini",), 0.015, 0.06),
    (("gpt-4o",), 0.25, 1.00),
    (("gpt-4-turbo",), 1.00, 3.00),
    (("gpt-4",), 3.00, 6.00),
    (("gpt-3.5-turbo",), 0.05, 0.15),
    (("o1-preview",), 1.50, 6.00),
    (("o1-mini",), 0.30, 1.20),
    (("o3-mini",), 0.11, 0.44),
    (("o3",), 2.00, 8.00),
    (("claude-3-opus",), 1.50, 7.50),
    (("claude-3.5-sonnet", "claude-3-5-sonnet", "claude-3-sonnet"), 0.30, 1.50),
    (("claude-3.5-haiku", "claude-3-5-haiku"), 0.08, 0.40),
    (("claude-3-haiku",), 0.025, 0.125),
    (("gemini-1.5-pro",), 0.125, 0.50),
    (("gemini-1.5-flash",), 0.0075, 0.03),
    (("gemini-2.0-flash",), 0.01, 0.04),
)
_DEFAULT_PRICE = (0.10, 0.30)
_DEFAULT_COMPLETION = 500  # completion tokens assumed by a request without max_tokens
_PACK_F32 = struct.Struct("<f")
_PACK_TAIL = struct.Struct("<II")  # payload_len, CRC-32
_PACK_FIXED = struct.Struct("<HBBHBB12s")


# -- encoding ------------------------------------------------------------------------------------


def encode_m2m(content: str, *, limits: Limits = DEFAULT_LIMITS) -> str:
    """Encode JSON text as an M2M v1 frame in text form: ``#M2M|1|<base64>``.

    Raises :class:`EncodeError` when ``content`` is not JSON (an M2M frame carries JSON only) and
    :class:`LimitExceeded` for JSON over ``limits`` or a wire over ``limits.max_message_bytes``.
    """
    wire = M2M_PREFIX + b64encode(memoryview(_frame(content, limits))[len(_PREFIX_BYTES) :])
    check_size("M2M v1 wire message", len(wire), limits.max_message_bytes)
    return wire


def encode_m2m_binary(content: str, *, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Encode JSON text as an M2M v1 frame in binary form: ``#M2M|1|`` + raw frame bytes."""
    frame = _frame(content, limits)
    check_size("M2M v1 binary frame", len(frame), limits.max_message_bytes)
    return frame


def _frame(content: str, limits: Limits) -> bytes:
    data = utf8(content)
    try:
        obj = loads_limited(data, limits=limits, what="M2M v1 content")
    except DecodeError as exc:
        raise EncodeError(f"an M2M v1 frame carries JSON only: {exc}") from None
    top: dict[str, Any] = obj if isinstance(obj, dict) else {}
    # The reference's classification: a request has both messages and model; else a response has
    # choices or a chatcmpl- id; anything else (any JSON value) travels as a request.
    if "messages" in top and "model" in top:
        schema, flags, header = _SCHEMA_REQUEST, *_request_header(top)
    elif "choices" in top or (isinstance(top.get("id"), str) and top["id"].startswith("chatcmpl-")):
        schema, flags, header = _SCHEMA_RESPONSE, *_response_header(top)
    else:
        schema, flags, header = _SCHEMA_REQUEST, *_request_header(top)
    header_len = _FIXED + len(header)
    if header_len > _U16_MAX:
        raise EncodeError(
            f"this JSON needs an M2M v1 header of {header_len} bytes, over the format's 65535 "
            "(too many messages); send it with another algorithm, e.g. brotli"
        )
    compressed = len(data) >= _COMPRESS_FROM
    payload = brotli.compress(data, quality=_QUALITY, lgwin=_LGWIN) if compressed else data
    if len(payload) > _U32_MASK:  # pragma: no cover - far beyond any message limit
        raise EncodeError("M2M v1 payloads are limited to 4 GiB")
    fixed = _PACK_FIXED.pack(header_len, schema, 0, flags, 0, _COMPRESSED if compressed else 0, _RESERVED)
    tail = _PACK_TAIL.pack(len(payload), zlib.crc32(data))
    return b"".join((_PREFIX_BYTES, fixed, header, tail, payload))


def _u64(value: Any) -> int | None:
    """serde_json's ``as_u64``: a non-negative integer that fits in 64 bits (not a bool, not a float)."""
    if type(value) is int and 0 <= value <= _U64_MAX:
        return value
    return None


def _short_string(text: str) -> bytes:
    """A u8 length + UTF-8 bytes. The reference writes ``len as u8`` followed by *all* the bytes, which
    corrupts the header beyond 255 bytes; we keep the longest prefix of whole characters that fits, so
    every decoder can parse the header (the full text is in the payload anyway)."""
    raw = cut_utf8(utf8(text), _U8_MAX)
    return bytes((len(raw),)) + raw


def _request_header(top: dict[str, Any]) -> tuple[int, bytes]:
    flags = 0
    for keys, bit in _PRESENCE_BITS:
        if any(k in top for k in keys):
            flags |= 1 << bit
    if top.get("stream") is True:
        flags |= 1 << 4
    messages = top.get("messages")
    messages = messages if isinstance(messages, list) else []
    roles: list[int] = []
    content_hint = 0
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if isinstance(role, str):
            if role in ("system", "developer"):
                flags |= 1 << 0
            if role in _ROLES:
                roles.append(_ROLES[role])  # other roles are skipped, not encoded
        content = message.get("content")
        if isinstance(content, str):
            content_hint += len(utf8(content))
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "image_url":
                    flags |= 1 << 3
                text = part.get("text")
                if isinstance(text, str):
                    content_hint += len(utf8(text))
    content_hint &= _U32_MASK  # the reference sums in a u32
    max_tokens: int | None = None
    if flags & _HAS_MAX_TOKENS:
        # max_tokens wins whenever the key exists (even as null); then truncated to u32 as the reference
        value = _u64(top["max_tokens"] if "max_tokens" in top else top.get("max_completion_tokens"))
        max_tokens = None if value is None else value & _U32_MASK
    model = top.get("model")
    model = model if isinstance(model, str) else ""
    packed = bytearray((2 * len(roles) + 7) // 8)
    for i, role_bits in enumerate(roles):
        packed[i // 4] |= role_bits << (2 * (i % 4))  # 2 bits per role, first role in the low bits
    cost = _cost(model, content_hint // 4, _DEFAULT_COMPLETION if max_tokens is None else max_tokens)
    parts = [
        _short_string(model),
        pack_varints([len(messages) & _U32_MASK]),
        bytes(packed),
        pack_varints([content_hint]),
    ]
    if max_tokens is not None:
        parts.append(pack_varints([max_tokens]))
    parts.append(_PACK_F32.pack(cost))
    return flags, b"".join(parts)


def _response_header(top: dict[str, Any]) -> tuple[int, bytes]:
    flags = 0
    finish = _FINISH_UNKNOWN
    choices = top.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        first = choices[0]
        message = first.get("message")
        if isinstance(message, dict):
            if "tool_calls" in message:
                flags |= _R_TOOL_CALLS
            if isinstance(message.get("refusal"), str):
                flags |= _R_REFUSAL
        reason = first.get("finish_reason")
        if isinstance(reason, str):
            finish = _FINISH_REASONS.get(reason, _FINISH_UNKNOWN)
            if reason == "content_filter":
                flags |= _R_FILTERED
            elif reason == "length":
                flags |= _R_TRUNCATED
    has_usage = "usage" in top  # present, whatever its value (the reference tests presence)
    usage = top.get("usage")
    usage_obj: dict[str, Any] = usage if isinstance(usage, dict) else {}
    cached = _detail(usage_obj, "prompt_tokens_details", "cached_tokens")
    reasoning = _detail(usage_obj, "completion_tokens_details", "reasoning_tokens")
    if has_usage:
        flags |= _R_USAGE | _R_COST
        if cached:
            flags |= _R_CACHED
        if reasoning:
            flags |= _R_REASONING
    prompt = (_u64(usage_obj.get("prompt_tokens")) or 0) & _U32_MASK
    completion = (_u64(usage_obj.get("completion_tokens")) or 0) & _U32_MASK
    ident = top.get("id")
    model = top.get("model")
    model = model if isinstance(model, str) else ""
    parts = [
        _short_string(ident if isinstance(ident, str) else ""),
        _short_string(model),
        bytes((finish,)),
        pack_varints([prompt, completion]),
    ]
    if flags & _R_CACHED:
        parts.append(pack_varints([cached & _U32_MASK]))
    if flags & _R_REASONING:
        parts.append(pack_varints([reasoning & _U32_MASK]))
    if has_usage:
        parts.append(_PACK_F32.pack(_cost(model, prompt, completion)))
    return flags, b"".join(parts)


def _detail(usage: dict[str, Any], details: str, key: str) -> int:
    obj = usage.get(details)
    return (_u64(obj.get(key)) or 0) if isinstance(obj, dict) else 0


def _f32(x: float) -> float:
    """Round to IEEE single precision. One +, * or / of two f32 values computed in double and rounded
    once to f32 equals the f32 operation (double has more than 2 * 24 + 2 bits), so chaining this
    reproduces the reference's f32 arithmetic exactly."""
    value: float = _PACK_F32.unpack(_PACK_F32.pack(x))[0]
    return value


def _cost(model: str, prompt_tokens: int, completion_tokens: int) -> float:
    """The reference's cost estimate in USD: ((in/1000) * p_in + (out/1000) * p_out) / 100, in f32."""
    lowered = model.lower()
    price_in, price_out = _DEFAULT_PRICE
    for prefixes, p_in, p_out in _PRICES:
        if lowered.startswith(prefixes):
            price_in, price_out = p_in, p_out
            break
    cost_in = _f32(_f32(_f32(prompt_tokens) / 1000.0) * _f32(price_in))
    cost_out = _f32(_f32(_f32(completion_tokens) / 1000.0) * _f32(price_out))
    return _f32(_f32(cost_in + cost_out) / 100.0)


# -- decoding ------------------------------------------------------------------------------------


def decode_m2m(wire: str, *, limits: Limits = DEFAULT_LIMITS) -> str:
    """Decode an M2M v1 frame in text form (``#M2M|1|<base64>``) to the JSON text it carries."""
    check_size("M2M v1 wire message", len(wire), limits.max_message_bytes)
    if not wire.startswith(M2M_PREFIX):
        raise DecodeError(f"not an M2M v1 frame: expected the prefix {M2M_PREFIX!r}")
    start = len(M2M_PREFIX)
    return _decode_body(b64decode(wire[start:], what="M2M v1 base64", offset=start), limits)


def decode_m2m_binary(data: bytes | bytearray | memoryview, *, limits: Limits = DEFAULT_LIMITS) -> str:
    """Decode an M2M v1 frame in binary form (``#M2M|1|`` + raw bytes) to the JSON text it carries."""
    view = memoryview(data)
    check_size("M2M v1 binary frame", len(view), limits.max_message_bytes)
    if view[: len(_PREFIX_BYTES)] != _PREFIX_BYTES:
        raise DecodeError(f"not an M2M v1 binary frame: expected the prefix {M2M_PREFIX!r}")
    return _decode_body(view[len(_PREFIX_BYTES) :], limits)


def _decode_body(body: bytes | memoryview, limits: Limits) -> str:
    """Decode the bytes after the prefix. Offsets in errors count from the end of the prefix."""
    size = len(body)
    if size < _FIXED:
        raise DecodeError(f"M2M v1 frame is {size} bytes after the prefix, shorter than its 20-byte header")
    header_len, _schema, security, _flags, _reserved, common, _ = _PACK_FIXED.unpack_from(body)
    if security != 0:
        mode = {1: "HMAC", 2: "AEAD"}.get(security, f"unknown ({security})")
        raise DecodeError(
            f"M2M v1 frame uses security mode {mode} (byte 3): m2mwire reads unsecured frames only; "
            "ask the peer to send frames without HMAC/AEAD"
        )
    if header_len < _FIXED:
        raise DecodeError(f"M2M v1 header_len is {header_len} (bytes 0-1), below the 20-byte fixed header")
    if header_len + 8 > size:
        raise DecodeError(
            f"M2M v1 frame is truncated: header_len {header_len} + 8 bytes of payload length and CRC "
            f"exceed the {size} bytes after the prefix"
        )
    payload_len, crc = _PACK_TAIL.unpack_from(body, header_len)
    start = header_len + 8
    if start + payload_len != size:
        problem = "is truncated" if start + payload_len > size else "has trailing bytes"
        raise DecodeError(
            f"M2M v1 frame {problem}: payload_len {payload_len} at offset {header_len} announces "
            f"{start + payload_len} bytes after the prefix, there are {size}"
        )
    payload = body[start:]
    if common & _COMPRESSED:
        raw = brotli_decompress(bytes(payload), limits.max_output_bytes)
    else:
        check_size("M2M v1 content", payload_len, limits.max_output_bytes)
        raw = bytes(payload)
    if zlib.crc32(raw) != crc:
        raise ChecksumMismatch(
            f"M2M v1 frame CRC-32 mismatch: the header says {crc:08x}, the content has {zlib.crc32(raw):08x}"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"M2M v1 content is not valid UTF-8 at byte {exc.start} ({exc.reason})") from None
