"""Brotli (``#M2M[v3.0]|DATA:``, also read as ``#BR|``) and the deprecated zlib v2.0 (``#M2M[v2.0]|DATA:``).

Both are padded standard base64 of a compressed stream of the UTF-8 content. Decompression is
incremental with a hard cap (``Limits.max_output_bytes``, which a session lowers to its negotiated
max_payload), so a kilobyte-sized bomb cannot allocate more than about the cap plus two output chunks
(2 MiB). zlib v2.0 is decoded for backwards compatibility only,
with a logged warning, and is never emitted.
"""

from __future__ import annotations

import logging
import zlib

import brotli

from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits, check_size
from m2mwire.codecs.varint import b64decode, b64encode, utf8
from m2mwire.errors import DecodeError, EncodeError, LimitExceeded

__all__ = [
    "BROTLI_ALT_PREFIX",
    "BROTLI_PREFIX",
    "DEFAULT_BROTLI_QUALITY",
    "ZLIB_PREFIX",
    "brotli_decompress",
    "decode_brotli",
    "decode_zlib",
    "encode_brotli",
]

logger = logging.getLogger("m2mwire.codecs")

BROTLI_PREFIX = "#M2M[v3.0]|DATA:"
BROTLI_ALT_PREFIX = "#BR|"  # the compression doc's spelling; accepted, never sent
ZLIB_PREFIX = "#M2M[v2.0]|DATA:"

# Quality 5 (lgwin 22), from the sweep in benchmarks/bench_codecs.py (docs/CODECS.md section 3): on the
# sample corpus it is 6% smaller than q4 and as small as q6, at ~23 MB/s; q11 (the reference's choice) is
# 13% smaller but ~75x slower (milliseconds per payload). The seed asks for 4-6.
DEFAULT_BROTLI_QUALITY = 5
_LGWIN = 22
# Output is pulled from the decompressors in slices of at most this size.
_OUTPUT_CHUNK = 1 << 20


def encode_brotli(
    content: str, *, quality: int = DEFAULT_BROTLI_QUALITY, limits: Limits = DEFAULT_LIMITS
) -> str:
    """Encode ``content`` as ``#M2M[v3.0]|DATA:<base64 brotli>``.

    ``quality=11`` reproduces the Rust reference's bytes exactly (it uses q11, lgwin 22).
    """
    if not 0 <= quality <= 11:
        raise EncodeError(f"brotli quality must be 0..11, not {quality}")
    data = utf8(content)
    wire = BROTLI_PREFIX + b64encode(brotli.compress(data, quality=quality, lgwin=_LGWIN))
    check_size("Brotli wire message", len(wire), limits.max_message_bytes)
    return wire


def brotli_decompress(data: bytes, limit: int) -> bytes:
    """Decompress a complete Brotli stream, refusing (LimitExceeded) to produce more than ``limit`` bytes."""
    decompressor = brotli.Decompressor()
    parts: list[bytes] = []
    total = 0
    try:
        # Each call stops once its output buffer reaches the chunk size; the binding grows that buffer
        # in doubling blocks, so one call may return up to about twice the chunk (never more), and
        # ``total`` passes ``limit`` by at most that much before the check below refuses it.
        out = decompressor.process(data, output_buffer_limit=min(limit + 1, _OUTPUT_CHUNK))
        while True:
            total += len(out)
            check_size("decompressed Brotli content", total, limit)
            parts.append(out)
            if decompressor.is_finished():
                break
            # All input is handed over in the first call, so a call that produced nothing without
            # finishing means the decoder is waiting for input that will never come. A call that
            # produced output may have stopped at the buffer limit with more output pending inside
            # the decoder (can_accept_more_data() is True then too: it only says whether *input* is
            # left over), so it is followed by another call with no input.
            if not out:
                raise DecodeError("truncated Brotli stream: the data ends before the end of the stream")
            out = decompressor.process(b"", output_buffer_limit=min(limit - total + 1, _OUTPUT_CHUNK))
    except brotli.error as exc:
        raise DecodeError(f"corrupt Brotli stream: {exc}") from None
    return b"".join(parts)


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"{what} content is not valid UTF-8 at byte {exc.start} ({exc.reason})") from None


def decode_brotli(wire: str, *, limits: Limits = DEFAULT_LIMITS) -> str:
    """Decode ``#M2M[v3.0]|DATA:<base64>`` (or ``#BR|<base64>``) to text."""
    check_size("Brotli wire message", len(wire), limits.max_message_bytes)
    if wire.startswith(BROTLI_PREFIX):
        start = len(BROTLI_PREFIX)
    elif wire.startswith(BROTLI_ALT_PREFIX):
        start = len(BROTLI_ALT_PREFIX)
    elif wire.startswith("#M2M[v3.0]|"):
        raise DecodeError("Brotli message must start with '#M2M[v3.0]|DATA:'")
    else:
        raise DecodeError(
            f"not a Brotli message: expected the prefix {BROTLI_PREFIX!r} or {BROTLI_ALT_PREFIX!r}"
        )
    data = b64decode(wire[start:], what="Brotli base64", offset=start)
    return _text(brotli_decompress(data, limits.max_output_bytes), "Brotli")


def _zlib_decompress(data: bytes, limit: int) -> bytes:
    decompressor = zlib.decompressobj(zlib.MAX_WBITS | 32)  # zlib or gzip header, auto-detected
    parts: list[bytes] = []
    total = 0
    pending = data
    try:
        while True:
            out = decompressor.decompress(pending, min(limit - total + 1, _OUTPUT_CHUNK))
            total += len(out)
            check_size("decompressed zlib content", total, limit)
            parts.append(out)
            pending = decompressor.unconsumed_tail
            if decompressor.eof:
                break
            if not pending and not out:
                raise DecodeError("truncated zlib stream: the data ends before the end of the stream")
    except zlib.error as exc:
        raise DecodeError(f"corrupt zlib stream: {exc}") from None
    if decompressor.unused_data:
        raise DecodeError(
            f"{len(decompressor.unused_data)} bytes of garbage after the end of the zlib stream"
        )
    return b"".join(parts)


def decode_zlib(wire: str, *, limits: Limits = DEFAULT_LIMITS) -> str:
    """Decode the deprecated ``#M2M[v2.0]|DATA:<base64 zlib>`` (logs a warning; never emitted).

    As the wire-format seed allows, a payload that is not zlib is tried as Brotli.
    """
    check_size("zlib wire message", len(wire), limits.max_message_bytes)
    if not wire.startswith(ZLIB_PREFIX):
        raise DecodeError(f"not a zlib v2.0 message: expected the prefix {ZLIB_PREFIX!r}")
    logger.warning(
        "decoding a deprecated M2M v2.0 (zlib) message; ask the sender to use Brotli (#M2M[v3.0]|DATA:)"
    )
    data = b64decode(wire[len(ZLIB_PREFIX) :], what="zlib base64", offset=len(ZLIB_PREFIX))
    try:
        raw = _zlib_decompress(data, limits.max_output_bytes)
    except LimitExceeded:
        raise
    except DecodeError as zlib_error:
        try:
            raw = brotli_decompress(data, limits.max_output_bytes)
        except DecodeError:
            raise DecodeError(f"{zlib_error} (and it is not a Brotli stream either)") from None
    return _text(raw, "zlib")
