"""The AVP frame header: constants, the 12-byte header, and what can be read from headers alone.

    41 56 | 01 | flags | payload_length u32 LE | metadata_length u32 LE | metadata | payload

Apart from the codec (:mod:`m2mwire.codecs.avp`) because a session checks frame sizes on every
AVP message it sends, and must not import numpy and protobuf for that: this module imports neither
(zstandard only to read a compressed frame's announced size).
"""

from __future__ import annotations

import struct
from typing import Any, Final, NamedTuple

from m2mwire.codecs.buffers import Buffer
from m2mwire.errors import DecodeError

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_ZSTD_LEVEL",
    "FLAG_COMPRESSED",
    "FLAG_HAS_MAP",
    "FLAG_KV_CACHE",
    "FLAG_RESERVED_MASK",
    "HEADER_SIZE",
    "HEADER_STRUCT",
    "MAGIC",
    "MAX_PAYLOAD_LENGTH",
    "VERSION",
    "AVPHeader",
    "content_size",
    "frame_length",
    "input_view",
    "parse_header",
    "parse_header_view",
    "payload_size",
]

MAGIC: Final = b"AV"
VERSION: Final = 1
HEADER_SIZE: Final = 12
FLAG_COMPRESSED: Final = 0x01
FLAG_HAS_MAP: Final = 0x02
FLAG_KV_CACHE: Final = 0x04
FLAG_RESERVED_MASK: Final = 0xF8
CONTENT_TYPE: Final = "application/avp+binary"
MAX_PAYLOAD_LENGTH: Final = 0xFFFF_FFFF
#: Default cap on a decompressed payload. KV caches are large (64 MiB for a 32-layer, 512-token fp16
#: cache; ~390 MB for a 7B model), so the generic ``Limits.max_output_bytes`` (16 MiB) does not fit.
DEFAULT_MAX_OUTPUT_BYTES: Final = 1 << 30
#: zstd level used for ``compress=True`` (the SDK's CompressionLevel.BALANCED).
DEFAULT_ZSTD_LEVEL: Final = 3

HEADER_STRUCT: Final = struct.Struct("<2sBBII")
_tuple_new = tuple.__new__


class AVPHeader(NamedTuple):
    """The fixed 12-byte header (magic and version are validated, so not kept)."""

    version: int
    flags: int
    payload_length: int
    metadata_length: int

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_COMPRESSED)

    @property
    def has_map(self) -> bool:
        return bool(self.flags & FLAG_HAS_MAP)

    @property
    def is_kv_cache(self) -> bool:
        return bool(self.flags & FLAG_KV_CACHE)

    @property
    def frame_length(self) -> int:
        """Bytes in the whole frame: 12 + payload_length."""
        return HEADER_SIZE + self.payload_length


def input_view(data: Any) -> memoryview:
    """A flat byte view of a frame given as any contiguous buffer (``str`` is refused)."""
    if type(data) is bytes or type(data) is bytearray:
        return memoryview(data)
    if isinstance(data, str):
        raise TypeError("AVP frames are bytes-like, not str")
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if not mv.c_contiguous:
        raise DecodeError("AVP input buffer is not contiguous")
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def parse_header(data: Buffer) -> AVPHeader:
    """Validate and parse the 12-byte header (the first 12 bytes of ``data``)."""
    return parse_header_view(input_view(data))


def parse_header_view(mv: memoryview) -> AVPHeader:
    """:func:`parse_header` for a view from :func:`input_view` (the decoder's path)."""
    if len(mv) < HEADER_SIZE:
        raise DecodeError(f"AVP message too short: {len(mv)} bytes, the header alone is {HEADER_SIZE}")
    fields = HEADER_STRUCT.unpack_from(mv)
    magic, version, flags, payload_length, metadata_length = fields
    if magic != MAGIC:
        raise DecodeError(f"not an AVP frame: magic bytes are {magic.hex()}, expected 4156 ('AV')")
    if version != VERSION:
        raise DecodeError(f"unsupported AVP version {version}; this decoder reads version {VERSION}")
    if flags & FLAG_RESERVED_MASK:
        raise DecodeError(f"AVP flags 0x{flags:02x} set reserved bits 3-7")
    if metadata_length > payload_length:
        raise DecodeError(
            f"AVP metadata_length {metadata_length} is larger than payload_length {payload_length}"
        )
    return _tuple_new(AVPHeader, fields[1:])


def frame_length(data: Buffer) -> int:
    """Total bytes of the frame that starts ``data`` (12 + payload_length), from its first 12 bytes.

    For stream framing: read 12 bytes, call this, read the rest. The header is validated.
    """
    return parse_header(data).frame_length


def payload_size(data: Buffer) -> int:
    """The size of a frame's payload once decompressed, read from the headers only.

    For an uncompressed frame it is the payload as sent; for a compressed one it is the size the zstd
    frame announces (which :func:`decode` holds it to). A session checks this against its negotiated
    max_payload on both sides, so sender and receiver bound the same quantity.
    """
    mv = input_view(data)
    header = parse_header_view(mv)
    meta_end = HEADER_SIZE + header.metadata_length
    end = HEADER_SIZE + header.payload_length
    if not header.flags & FLAG_COMPRESSED:
        return end - meta_end
    return content_size(mv[meta_end:end])


def content_size(data: Buffer) -> int:
    """The decompressed size a zstd frame announces in its header (read without decompressing)."""
    import zstandard  # local: only compressed frames need it (text-only sessions never load it)

    try:
        size: int = zstandard.frame_content_size(data)
    except zstandard.ZstdError as exc:
        raise DecodeError(f"AVP payload is flagged compressed but is not a zstd frame: {exc}") from exc
    if size < 0:
        raise DecodeError(
            "AVP zstd frame has no content size in its header (the SDK cannot decode such frames either); "
            "compress with ZstdCompressor.compress() or a pledged size"
        )
    return size
