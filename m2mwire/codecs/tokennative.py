"""TokenNative: BPE token ids as LEB128 varints, ``#TK|<C|O|L>|<base64>`` or the binary form.

Text form:   ``#TK|`` + tokenizer id (``C`` cl100k_base, ``O`` o200k_base, ``L`` Llama 3) + ``|`` +
             padded standard base64 of the varint stream.
Binary form: one byte (0 cl100k, 1 o200k, 2 Llama 3) + the raw varint stream.

Special-token text in the content (``<|endoftext|>``, ...) is encoded as the special id, so it round-trips.
Stricter than the Rust reference (all deliberate, see docs/CODECS.md): an unknown tokenizer id, a
multi-character id such as ``CX``, or an unknown binary id byte is a :class:`DecodeError` (the reference
silently falls back to cl100k); ``L`` is the real Llama 3 vocabulary (the reference uses cl100k ids).
"""

from __future__ import annotations

from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits, check_size
from m2mwire.codecs.tokenizers import Encoding, get_tokenizer, max_token_bytes, resolve_encoding, token_table
from m2mwire.codecs.varint import (
    b64decode,
    b64encode,
    c_detokenize,
    pack_varints,
    unpack_varints,
    utf8,
    varint_error,
)
from m2mwire.errors import DecodeError

__all__ = [
    "TK_PREFIX",
    "compress_binary",
    "decode_tokennative",
    "decompress_binary",
    "encode_tokennative",
    "parse_tk_header",
    "tokenize",
]

TK_PREFIX = "#TK|"
_BY_WIRE_ID = {enc.wire_id: enc for enc in Encoding}
_BY_BINARY_ID = {enc.binary_id: enc for enc in Encoding}
# Decode at most this many tokens per tiktoken call when the output might exceed the limit, so an
# oversized message is refused after allocating about one chunk, not the whole result.
_DECODE_CHUNK = 65_536


def tokenize(content: str, encoding: str | Encoding = Encoding.CL100K) -> list[int]:
    """Token ids of ``content`` with special-token text encoded as special ids (``allowed_special="all"``).

    Raises :class:`EncodeError` for text that is not encodable as UTF-8 (lone surrogates), which
    tiktoken would otherwise silently replace.
    """
    if not content.isascii():
        utf8(content)
    return get_tokenizer(encoding).encode(content, allowed_special="all")


def encode_tokennative(
    content: str, encoding: str | Encoding = Encoding.CL100K, *, limits: Limits = DEFAULT_LIMITS
) -> str:
    """Encode ``content`` as ``#TK|<id>|<base64 varints>``."""
    enc = resolve_encoding(encoding)
    wire = TK_PREFIX + enc.wire_id + "|" + b64encode(pack_varints(tokenize(content, enc)))
    check_size("TokenNative wire message", len(wire), limits.max_message_bytes)
    return wire


def compress_binary(content: str, *, encoding: str | Encoding = Encoding.CL100K) -> bytes:
    """Encode ``content`` in the TokenNative binary form: tokenizer byte (0/1/2) + raw varints."""
    enc = resolve_encoding(encoding)
    return bytes((enc.binary_id,)) + pack_varints(tokenize(content, enc))


def parse_tk_header(wire: str) -> tuple[Encoding, int]:
    """Return the encoding named by a ``#TK|<id>|`` header and the offset where the base64 starts."""
    if not wire.startswith(TK_PREFIX):
        raise DecodeError(f"not a TokenNative message: expected the prefix {TK_PREFIX!r}")
    bar = wire.find("|", len(TK_PREFIX))
    if bar == -1:
        raise DecodeError(
            "TokenNative message has no '|' after the tokenizer id (expected '#TK|<C|O|L>|<base64>')"
        )
    wire_id = wire[len(TK_PREFIX) : bar]
    enc = _BY_WIRE_ID.get(wire_id)
    if enc is None:
        raise DecodeError(
            f"unknown TokenNative tokenizer id {wire_id!r} at offset {len(TK_PREFIX)}: expected exactly "
            "one of C (cl100k_base), O (o200k_base), L (llama3); unlike the Rust reference, m2mwire does "
            "not fall back to cl100k"
        )
    return enc, bar + 1


def decode_tokennative(wire: str, *, limits: Limits = DEFAULT_LIMITS) -> str:
    """Decode a ``#TK|<id>|<base64>`` message to the original text."""
    check_size("TokenNative wire message", len(wire), limits.max_message_bytes)
    enc, start = parse_tk_header(wire)
    fast = _c_decode(wire, start, enc, limits)  # wire -> token bytes in one C pass
    if fast is not None:
        return _utf8_text(fast)
    ids = unpack_varints(b64decode(wire[start:], what="TokenNative base64", offset=start))
    return _ids_to_text(ids, enc, limits)


def decompress_binary(data: bytes | bytearray | memoryview, *, limits: Limits = DEFAULT_LIMITS) -> str:
    """Decode the TokenNative binary form (tokenizer byte + raw varints)."""
    raw = bytes(data)
    check_size("TokenNative binary message", len(raw), limits.max_message_bytes)
    if not raw:
        raise DecodeError("empty TokenNative binary message: byte 0 must name the tokenizer (0, 1 or 2)")
    enc = _BY_BINARY_ID.get(raw[0])
    if enc is None:
        raise DecodeError(
            f"unknown TokenNative binary tokenizer byte {raw[0]} at offset 0: expected 0 (cl100k_base), "
            "1 (o200k_base) or 2 (llama3); unlike the Rust reference, m2mwire does not fall back to cl100k"
        )
    fast = _c_decode(raw, 1, enc, limits)
    if fast is not None:
        return _utf8_text(fast)
    return _ids_to_text(unpack_varints(raw[1:]), enc, limits)


def _c_decode(data: str | bytes, start: int, enc: Encoding, limits: Limits) -> bytes | None:
    """The C fast path (m2mwire/codecs/_varint.c); None when it is not built or the base64 is not
    strict (the Python path then raises the precise error)."""
    if c_detokenize is None:
        return None
    try:
        return c_detokenize(data, start, token_table(enc), limits.max_output_bytes)
    except ValueError as exc:
        kind, position, value = exc.args
        if kind == "unknown":
            raise DecodeError(
                f"token id {value} (token #{position}) is not in the {enc.value} vocabulary"
            ) from None
        if kind == "limit":
            check_size("decoded TokenNative content", position, value)
        raise varint_error(kind, position, value) from None


def _utf8_text(text_bytes: bytes) -> str:
    try:
        return text_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(
            f"TokenNative tokens decode to invalid UTF-8 at byte {exc.start} of the output ({exc.reason})"
        ) from None


def _ids_to_text(ids: list[int], enc: Encoding, limits: Limits) -> str:
    tokenizer = get_tokenizer(enc)
    limit = limits.max_output_bytes
    try:
        if len(ids) * max_token_bytes(enc) <= limit:
            text_bytes = tokenizer.decode_bytes(ids)
        else:  # could be over the limit: decode piecewise and stop as soon as it is
            parts: list[bytes] = []
            total = 0
            for i in range(0, len(ids), _DECODE_CHUNK):
                part = tokenizer.decode_bytes(ids[i : i + _DECODE_CHUNK])
                total += len(part)
                check_size("decoded TokenNative content", total, limit)
                parts.append(part)
            text_bytes = b"".join(parts)
    except KeyError:
        # tiktoken raises KeyError for an id that is neither a rank nor a special token.
        raise _unknown_token(ids, tokenizer.name, enc) from None
    check_size("decoded TokenNative content", len(text_bytes), limit)
    return _utf8_text(text_bytes)


def _unknown_token(ids: list[int], name: str, enc: Encoding) -> DecodeError:
    tokenizer = get_tokenizer(enc)
    for position, token in enumerate(ids):
        try:
            tokenizer.decode_single_token_bytes(token)
        except KeyError:
            return DecodeError(f"token id {token} (token #{position}) is not in the {name} vocabulary")
    return DecodeError(f"a token id is not in the {name} vocabulary")  # pragma: no cover - defensive
