"""AVP (Agent Vector Protocol) frames, byte-compatible with the reference SDK ``avp`` 0.6.2.

A frame is a 12-byte header, protobuf metadata, then the tensor payload::

    41 56 | 01 | flags | payload_length u32 LE | metadata_length u32 LE | metadata | payload

``payload_length`` counts the metadata plus the payload as sent (compressed when flag bit 0 is set).
The encoder emits exactly what the SDK emits (same header, same flags, metadata fields in field order
with defaults omitted, CRC-32 of the uncompressed payload always in field 15, ``"zstd"`` in field 11
and one zstd frame carrying its content size when compressed). The decoder accepts everything the SDK
emits and is stricter than the SDK about malformed frames; docs/AVP.md lists every difference.

Zero copy: :func:`encode_parts` hands out ``[header + metadata, payload buffer...]`` without copying
the tensor; :func:`decode` returns the payload as a ``memoryview`` into the input (when it is not
compressed) and :meth:`AVPMessage.tensor` is an ``np.frombuffer`` view of it.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Final, NamedTuple, TypeAlias, Unpack

import numpy as np
import numpy.typing as npt

from m2mwire.codecs.avpframe import (
    DATA_TYPES,
    ITEMSIZE,
    MAX_TENSOR_DIMS,
    MODES,
    PAYLOAD_TYPES,
    STORAGE_DTYPES,
    AVPMetadata,
    CommunicationMode,
    DataType,
    MetadataFields,
    MetadataPB,
    PayloadLike,
    PayloadType,
    array_dtype,
    array_view,
    bfloat16_to_float32,
    build_frame,
    byte_view,
    check_shape,
    decompress_payload,
    float32_to_bfloat16,
    frame_head,
    requested_dtype,
    resolve_metadata,
    shape_bytes,
    zstd_level,
)
from m2mwire.codecs.avpheader import (
    CONTENT_TYPE,
    DEFAULT_MAX_OUTPUT_BYTES,
    DEFAULT_ZSTD_LEVEL,
    FLAG_COMPRESSED,
    FLAG_HAS_MAP,
    FLAG_KV_CACHE,
    FLAG_RESERVED_MASK,
    HEADER_SIZE,
    MAGIC,
    MAX_PAYLOAD_LENGTH,
    VERSION,
    AVPHeader,
    frame_length,
    input_view,
    parse_header,
    parse_header_view,
    payload_size,
)
from m2mwire.codecs.buffers import Buffer
from m2mwire.codecs.checksum import ZLIB_CRC_BELOW, crc32, deflate_crc32
from m2mwire.codecs.kvcache import KVCache, parse_kv_payload
from m2mwire.codecs.limits import DEFAULT_LIMITS, Limits, check_size
from m2mwire.errors import ChecksumMismatch, DecodeError, EncodeError

__all__ = [
    "CONTENT_TYPE",
    "DEFAULT_MAX_OUTPUT_BYTES",
    "DEFAULT_ZSTD_LEVEL",
    "FLAG_COMPRESSED",
    "FLAG_HAS_MAP",
    "FLAG_KV_CACHE",
    "FLAG_RESERVED_MASK",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_PAYLOAD_LENGTH",
    "VERSION",
    "AVPHeader",
    "AVPMessage",
    "AVPMetadata",
    "BufferLike",
    "CommunicationMode",
    "DataType",
    "MetadataFields",
    "PayloadType",
    "bfloat16_to_float32",
    "crc32",
    "decode",
    "encode",
    "encode_hidden_state",
    "encode_hidden_state_parts",
    "encode_parts",
    "float32_to_bfloat16",
    "frame_length",
    "parse_header",
    "payload_size",
]

BufferLike: TypeAlias = Buffer  # the name this module has always exported
_U32: Final = struct.Struct("<I")
_U32_U8: Final = struct.Struct("<IB")  # a 5-byte checksum varint, read at once

_new_metadata = object.__new__
_set = object.__setattr__
_tuple_new = tuple.__new__
_NO_EXTRA: Final[Mapping[str, str]] = MappingProxyType({})


class AVPMessage:
    """A decoded frame: ``header``, ``metadata`` (built on first access) and ``payload``.

    ``payload`` is a ``memoryview``: a zero-copy slice of the input when the frame was not
    compressed, otherwise a view of the decompressed bytes. ``raw`` is the whole frame (a view of
    the input, trailing bytes excluded), to forward unchanged. ``payload_type``, ``dtype`` and
    ``tensor_shape`` are available without building the whole :class:`AVPMetadata`.
    """

    __slots__ = (
        "_checksum",
        "_metadata",
        "_pb",
        "dtype",
        "header",
        "payload",
        "payload_type",
        "raw",
        "tensor_shape",
    )

    def __init__(
        self,
        raw: memoryview,
        header: AVPHeader,
        payload: memoryview,
        pb: MetadataPB,
        payload_type: PayloadType,
        dtype: DataType,
        tensor_shape: tuple[int, ...],
        checksum: int | None,
    ) -> None:
        self.raw = raw  # the whole frame, as received (a view; forward it unchanged)
        self.header = header
        self.payload = payload
        self.payload_type = payload_type
        self.dtype = dtype
        self.tensor_shape = tensor_shape
        # Fields 1-14 are read from pb, field 15 from here: a cached pb serves every frame of a
        # stream, with only the checksum differing (see _decode_known).
        self._pb = pb
        self._checksum = checksum
        self._metadata: AVPMetadata | None = None

    @property
    def metadata(self) -> AVPMetadata:
        md = self._metadata
        if md is None:
            pb = self._pb
            # Every value is already validated and of its declared type: skip __init__'s checks.
            md = _new_metadata(AVPMetadata)
            _set(md, "session_id", pb.session_id)
            _set(md, "source_agent_id", pb.source_agent_id)
            _set(md, "target_agent_id", pb.target_agent_id)
            _set(md, "model_id", pb.model_id)
            _set(md, "hidden_dim", pb.hidden_dim)
            _set(md, "num_layers", pb.num_layers)
            _set(md, "payload_type", self.payload_type)
            _set(md, "dtype", self.dtype)
            _set(md, "tensor_shape", self.tensor_shape)
            _set(md, "mode", MODES[pb.mode])
            _set(md, "compression", pb.compression if pb.HasField("compression") else None)
            _set(md, "avp_map_id", pb.avp_map_id)
            extra = pb.extra
            _set(md, "extra", MappingProxyType(dict(extra)) if extra else _NO_EXTRA)
            _set(md, "payload_checksum", self._checksum)
            _set(md, "_wire", None)
            _set(md, "_head", None)
            self._metadata = md
        return md

    @property
    def has_extra(self) -> bool:
        """Whether the metadata's ``extra`` map has entries (read without building :attr:`metadata`)."""
        return bool(self._pb.extra)

    @property
    def extra_count(self) -> int:
        """How many entries the metadata's ``extra`` map has (read without building :attr:`metadata`)."""
        return len(self._pb.extra)

    @property
    def frame_length(self) -> int:
        return self.header.frame_length

    def tensor(self) -> npt.NDArray[Any]:
        """The hidden-state payload as a numpy view (no copy), shaped by ``tensor_shape`` if present.

        bfloat16 comes back as raw ``uint16`` words (see :meth:`to_float32`). The array is read-only
        when the input was ``bytes``.
        """
        if self.payload_type is not PayloadType.HIDDEN_STATE:
            raise ValueError("this frame carries a KV cache: use kv_cache()")
        dt = STORAGE_DTYPES[self.dtype]
        payload = self.payload
        if len(payload) % dt.itemsize:
            raise DecodeError(
                f"AVP payload of {len(payload)} bytes is not a whole number of {self.dtype.name} "
                f"elements ({dt.itemsize} bytes each)"
            )
        arr = np.frombuffer(payload, dtype=dt)
        if self.tensor_shape:
            return arr.reshape(self.tensor_shape)
        return arr

    @property
    def array(self) -> npt.NDArray[Any]:
        """Same as :meth:`tensor`."""
        return self.tensor()

    def to_float32(self) -> npt.NDArray[np.float32]:
        """The hidden state converted to float32 (a new array; bfloat16 words are widened exactly)."""
        arr = self.tensor()
        if self.dtype is DataType.BFLOAT16:
            return bfloat16_to_float32(arr)
        return arr.astype(np.float32)

    def kv_cache(self) -> KVCache:
        """The KV-cache payload as per-layer (K, V) views; validates the 17-byte KV header."""
        if self.payload_type is not PayloadType.KV_CACHE:
            raise ValueError("this frame carries a hidden state: use tensor()")
        return parse_kv_payload(self.payload, expected_dtype=self.dtype)

    def __repr__(self) -> str:
        return (
            f"AVPMessage({self.payload_type.name}, {self.dtype.name}, shape={self.tensor_shape}, "
            f"payload={len(self.payload)} bytes, compressed={self.header.compressed}, "
            f"model_id={self._pb.model_id!r})"
        )


_FAST_DTYPES: Final[dict[np.dtype[Any], DataType]] = {
    np.dtype("<f4"): DataType.FLOAT32,
    np.dtype("<f2"): DataType.FLOAT16,
    np.dtype("i1"): DataType.INT8,
}


def _prepare(
    payload: PayloadLike, md: AVPMetadata, requested: DataType | None
) -> tuple[list[memoryview], int, DataType, tuple[int, ...]]:
    if isinstance(payload, np.ndarray) and md.payload_type is PayloadType.HIDDEN_STATE:
        fast = _FAST_DTYPES.get(payload.dtype)
        if fast is not None and (requested is None or requested is fast):
            with contextlib.suppress(TypeError):  # TypeError: not C-contiguous
                view = payload.data.cast("B")  # contiguous little-endian: no copy
                return [view], len(view), fast, md.tensor_shape or payload.shape
        dtype = array_dtype(payload, requested)
        view = array_view(payload)
        return [view], len(view), dtype, md.tensor_shape or payload.shape
    if isinstance(payload, str):
        raise TypeError("AVP payloads are bytes-like or numpy arrays, not str")
    view = byte_view(payload)
    return [view], len(view), md.dtype, md.tensor_shape


# Enum members read through the class cost ~50 ns each; the hot paths read these globals.
_HIDDEN_STATE: Final = PayloadType.HIDDEN_STATE
_FLOAT32: Final = DataType.FLOAT32


def _fast_parts(payload: Any, md: AVPMetadata) -> list[bytes | memoryview] | None:
    """The hot path in a few lines: a contiguous little-endian float32/float16/int8 array and a
    HIDDEN_STATE metadata object, no keyword overrides, no compression. None when it does not apply."""
    if type(payload) is not np.ndarray or md.payload_type is not _HIDDEN_STATE:
        return None
    dtype = _FAST_DTYPES.get(payload.dtype)
    if dtype is None or (md.dtype is not dtype and md.dtype is not _FLOAT32):
        return None
    try:
        view = payload.data.cast("B")
    except TypeError:  # not C-contiguous
        return None
    n = len(view)
    shape = md.tensor_shape
    if shape:
        check_shape(shape, dtype, n, EncodeError)
    else:
        shape = payload.shape
    crc = crc32(view) if n < ZLIB_CRC_BELOW else deflate_crc32(view)
    head = frame_head(md, dtype, shape, n, crc)
    return [head, view] if n else [head]


def encode_parts(
    payload: PayloadLike,
    metadata: AVPMetadata | None = None,
    *,
    compress: bool | int = False,
    **fields: Unpack[MetadataFields],
) -> list[bytes | memoryview]:
    """Encode a frame as buffers to write in order: ``[header + metadata, payload...]``, no tensor copy.

    ``payload`` is bytes-like or a numpy array (float32, float16, int8, bfloat16 as an ml_dtypes
    array or as uint16 words with ``dtype="bfloat16"``). For an array, dtype comes from the array
    and ``tensor_shape`` defaults to its shape. ``compress`` is False, True (zstd level 3) or a
    zstd level. Keyword fields override those of ``metadata``.

    The payload buffer is referenced, not copied: do not modify it until the parts are written.
    """
    if metadata is not None and not fields and not compress:
        parts = _fast_parts(payload, metadata)
        if parts is not None:
            return parts
    return _general_parts(payload, metadata, compress, fields)


def _general_parts(
    payload: PayloadLike, metadata: AVPMetadata | None, compress: bool | int, fields: MetadataFields
) -> list[bytes | memoryview]:
    """The general encoder (every input :func:`encode_parts` takes); :func:`_fast_parts` must give
    the same bytes wherever it applies (tests/codecs/test_avp_differential.py)."""
    md = resolve_metadata(metadata, fields)
    chunks, total, dtype, shape = _prepare(payload, md, requested_dtype(fields, md))
    return build_frame(chunks, total, md, dtype, shape, zstd_level(compress))


def encode(
    payload: PayloadLike,
    metadata: AVPMetadata | None = None,
    *,
    compress: bool | int = False,
    **fields: Unpack[MetadataFields],
) -> bytes:
    """Encode a frame as one ``bytes`` object (the tensor is copied once); see :func:`encode_parts`."""
    if metadata is not None and not fields and not compress:
        parts = _fast_parts(payload, metadata)
        if parts is not None:
            return b"".join(parts)
    return b"".join(encode_parts(payload, metadata, compress=compress, **fields))


def encode_hidden_state_parts(
    array: np.ndarray[Any, Any],
    metadata: AVPMetadata | None = None,
    *,
    compress: bool | int = False,
    **fields: Unpack[MetadataFields],
) -> list[bytes | memoryview]:
    """:func:`encode_parts` for a hidden-state array; ``hidden_dim`` defaults to ``array.shape[-1]``."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"encode_hidden_state takes a numpy array, not {type(array).__name__}")
    if metadata is not None and metadata.hidden_dim and not fields and not compress:
        parts = _fast_parts(array, metadata)
        if parts is not None:
            return parts
    md = resolve_metadata(metadata, fields)
    if md.payload_type is not PayloadType.HIDDEN_STATE:
        raise EncodeError("encode_hidden_state() writes HIDDEN_STATE frames; use encode_kv_cache() for KV")
    if not md.hidden_dim and array.ndim:
        md = replace(md, hidden_dim=int(array.shape[-1]))
    chunks, total, dtype, shape = _prepare(array, md, requested_dtype(fields, md))
    return build_frame(chunks, total, md, dtype, shape, zstd_level(compress))


def encode_hidden_state(
    array: np.ndarray[Any, Any],
    metadata: AVPMetadata | None = None,
    *,
    compress: bool | int = False,
    **fields: Unpack[MetadataFields],
) -> bytes:
    """Encode a hidden-state array as one frame; see :func:`encode_hidden_state_parts`."""
    return b"".join(encode_hidden_state_parts(array, metadata, compress=compress, **fields))


# --------------------------------------------------------------------------------------------------
# Decoding


def decode(
    data: BufferLike,
    *,
    limits: Limits | None = None,
    max_output_bytes: int | None = None,
    allow_trailing: bool = False,
) -> AVPMessage:
    """Decode and validate one frame.

    ``data`` must hold exactly one frame; with ``allow_trailing=True`` bytes after it are ignored
    (use :func:`frame_length` to find them). The CRC-32 is verified whenever field 15 is present.
    A compressed payload may decompress to at most ``max_output_bytes`` (default 1 GiB), checked
    against the zstd header before anything is allocated; ``limits.max_metadata_bytes`` caps the
    metadata section before it is parsed. Malformed input raises :class:`DecodeError`
    (:class:`ChecksumMismatch` for a bad CRC); a limit raises :class:`LimitExceeded`.
    """
    mv = memoryview(data) if type(data) is bytes else input_view(data)
    used = limits or DEFAULT_LIMITS
    max_metadata = min(used.max_metadata_bytes, used.max_message_bytes)
    known = _decode_known(mv, max_metadata) if not allow_trailing else None
    if type(known) is AVPMessage:
        return known
    msg = _decode_full(mv, max_metadata, max_output_bytes, allow_trailing)
    if type(known) is bytes and not msg.header.flags & FLAG_COMPRESSED:
        _learn(known, mv, msg)
    return msg


def _decode_full(
    mv: memoryview, max_metadata: int, max_output_bytes: int | None, allow_trailing: bool
) -> AVPMessage:
    """The general path of :func:`decode`: every rule checked, the metadata parsed."""
    header = parse_header_view(mv)
    end = HEADER_SIZE + header.payload_length
    size = len(mv)
    if size < end:
        raise DecodeError(f"AVP message truncated: {size} bytes, the header announces {end}")
    if size > end and not allow_trailing:
        raise DecodeError(
            f"AVP message has {size - end} bytes after its end ({end} bytes); "
            "pass allow_trailing=True or split with frame_length()"
        )
    meta_end = HEADER_SIZE + header.metadata_length
    if header.metadata_length > max_metadata:
        check_size("AVP metadata", header.metadata_length, max_metadata)
    pb = MetadataPB()
    try:
        pb.ParseFromString(mv[HEADER_SIZE:meta_end])
    except Exception as exc:  # google.protobuf.message.DecodeError (upb may raise others on junk)
        raise DecodeError(f"AVP metadata is not a valid protobuf Metadata message: {exc}") from exc
    pt = pb.payload_type
    dt = pb.dtype
    if not 0 <= pt <= 1:
        raise DecodeError(f"unknown AVP payload_type {pt}")
    if not 0 <= dt <= 3:
        raise DecodeError(f"unknown AVP dtype {dt}")
    if not 0 <= pb.mode <= 1:
        raise DecodeError(f"unknown AVP mode {pb.mode}")
    flags = header.flags
    if bool(flags & FLAG_KV_CACHE) != (pt == 1):
        raise DecodeError(
            f"AVP KV-cache flag is {'set' if flags & FLAG_KV_CACHE else 'clear'} but payload_type is "
            f"{PAYLOAD_TYPES[pt].name}"
        )
    map_id = pb.avp_map_id
    if bool(flags & FLAG_HAS_MAP) != bool(map_id):
        raise DecodeError(
            f"AVP has-map flag is {'set' if flags & FLAG_HAS_MAP else 'clear'} but avp_map_id is {map_id!r}"
        )
    dims = pb.tensor_shape
    ndims = len(dims)
    if ndims > MAX_TENSOR_DIMS:  # before anything walks it: a 64 KiB shape is 65,000 dimensions
        raise DecodeError(
            f"AVP tensor_shape has {ndims} dimensions, more than {MAX_TENSOR_DIMS} (MAX_TENSOR_DIMS)"
        )
    body = mv[meta_end:end]
    if flags & FLAG_COMPRESSED:
        if pb.HasField("compression") and pb.compression != "zstd":
            raise DecodeError(f"unsupported AVP compression {pb.compression!r} (only zstd is defined)")
        cap = DEFAULT_MAX_OUTPUT_BYTES if max_output_bytes is None else max_output_bytes
        expected = None
        if pt == 0 and ndims:  # a hidden state's size is its shape times its itemsize
            expected = shape_bytes(tuple(dims), ITEMSIZE[dt], cap)
            if expected > cap:
                check_size("AVP tensor_shape", expected, cap)
        payload = decompress_payload(body, cap, expected)
    else:
        if pb.compression:
            raise DecodeError(
                f"AVP metadata says compression={pb.compression!r} but the compressed flag is clear"
            )
        payload = body
    expected = pb.payload_checksum
    checksum = None
    if expected or pb.HasField("payload_checksum"):  # a non-zero value is present: skip the call
        actual = crc32(payload) if len(payload) < ZLIB_CRC_BELOW else deflate_crc32(payload)
        if actual != expected:
            raise _checksum_mismatch(expected, actual)
        checksum = expected
    if ndims == 0:
        shape: tuple[int, ...] = ()
    elif ndims == 1:  # the usual hidden state: checked without the general helper's calls
        shape = (dims[0],)
        if pt == 0 and shape[0] * ITEMSIZE[dt] != len(payload):
            check_shape(shape, DATA_TYPES[dt], len(payload), DecodeError)
    else:
        shape = tuple(dims[:])
        if pt == 0:
            check_shape(shape, DATA_TYPES[dt], len(payload), DecodeError)
    return AVPMessage(
        mv if size == end else mv[:end],
        header,
        payload,
        pb,
        PAYLOAD_TYPES[pt],
        DATA_TYPES[dt],
        shape,
        checksum,
    )


def _checksum_mismatch(expected: int, actual: int) -> ChecksumMismatch:
    return ChecksumMismatch(
        f"AVP payload checksum mismatch: metadata says 0x{expected:08x}, payload has 0x{actual:08x}"
    )


# A stream of frames (one sender's hidden states) repeats the same header and metadata, except the
# CRC in payload_checksum: field 15, the highest number, so serializers (ours, the SDK's) write it
# last. Once a header + metadata prefix has been decoded twice and the prefix parses on its own,
# it is kept as a template: later frames with that exact prefix skip protobuf parsing and
# validation, and only the trailing checksum is read and verified. This is exact, not a guess: a
# prefix that parses on its own ends on a field boundary, so prefix + field 15 parses as the
# prefix's fields followed by field 15. Anything else (compressed, trailing bytes, metadata over the
# caller's limit, another layout) takes the full path.


class _Template(NamedTuple):
    header: AVPHeader
    pb: MetadataPB  # the prefix parsed: fields 1-14 of every frame that shares it (never mutated)
    payload_type: PayloadType
    dtype: DataType
    tensor_shape: tuple[int, ...]
    frame_length: int


# A key whose prefix does not parse on its own (frame_length -1 never matches a frame).
_NOT_A_PREFIX: Final = _Template(
    AVPHeader(VERSION, 0, 0, 0), MetadataPB(), PayloadType.HIDDEN_STATE, DataType.FLOAT32, (), -1
)
_TEMPLATES: dict[bytes, _Template] = {}
_SEEN: dict[bytes, None] = {}  # keys decoded once; apart, so that churn there evicts no template
_SLOTS: Final = 256  # per dict; a full one is cleared (memory stays bounded whatever peers send)
_CHECKSUM_TAG: Final = 15 << 3  # field 15, wire type 0 (varint)


def _decode_known(mv: memoryview, max_metadata: int) -> AVPMessage | bytes | None:
    """A frame decoded from its template; else the template key to learn (bytes), or None when
    the metadata does not end with payload_checksum or is over ``max_metadata`` bytes (the full
    path refuses it: templates are shared by every caller, whatever limit each one has)."""
    size = len(mv)
    if size < HEADER_SIZE:
        return None
    metadata_length = _U32.unpack_from(mv, 8)[0]
    meta_end = HEADER_SIZE + metadata_length
    if meta_end > size or meta_end < HEADER_SIZE + 2 or metadata_length > max_metadata:
        return None
    # The checksum varint, read backwards: a last byte < 0x80, at most 4 continuation bytes
    # (>= 0x80) before it, and the tag before those.
    i = meta_end - 6
    if i >= HEADER_SIZE and mv[i] == _CHECKSUM_TAG:
        # The usual 5-byte varint (15 of 16 CRCs) as one integer: four bytes with the
        # continuation bit, a last one under 0x10 (a uint32's top 4 bits); else the loop below.
        low, top = _U32_U8.unpack_from(mv, i + 1)
        if low & 0x8080_8080 == 0x8080_8080 and top < 0x10:
            value = (
                (low & 0x7F)
                | (low >> 1 & 0x3F80)
                | (low >> 2 & 0x1F_C000)
                | (low >> 3 & 0xFE0_0000)
                | top << 28
            )
        else:
            i = -1
    else:
        i = -1
    if i < 0:
        i = meta_end - 1
        value = mv[i]
        if value >= 0x80:
            return None
        i -= 1
        low = max(meta_end - 5, HEADER_SIZE)
        while i >= low and (b := mv[i]) >= 0x80:
            value = (value << 7) | (b & 0x7F)
            i -= 1
        if i < HEADER_SIZE or mv[i] != _CHECKSUM_TAG or value > 0xFFFF_FFFF:
            return None
    key = mv[:i].tobytes()
    t = _TEMPLATES.get(key)
    if t is None:
        return key
    header, pb, payload_type, dtype, tensor_shape, length = t  # one unpack, not six attribute reads
    if length != size:
        return key
    payload = mv[meta_end:]
    actual = crc32(payload) if len(payload) < ZLIB_CRC_BELOW else deflate_crc32(payload)
    if actual != value:
        raise _checksum_mismatch(value, actual)
    return AVPMessage(mv, header, payload, pb, payload_type, dtype, tensor_shape, value)


def _learn(key: bytes, mv: memoryview, msg: AVPMessage) -> None:
    """After a full decode of a frame whose template key is ``key``: note it the first time, make
    the template the second (a stream whose metadata changes every frame never pays for one)."""
    if key in _TEMPLATES:
        return  # _NOT_A_PREFIX
    if key not in _SEEN:
        if len(_SEEN) >= _SLOTS:
            _SEEN.clear()
        _SEEN[key] = None
        return
    _SEEN.pop(key, None)
    pb = MetadataPB()
    try:
        pb.ParseFromString(mv[HEADER_SIZE : len(key)])
    except Exception:  # the last 0x78 byte was inside another field: no field boundary there
        template = _NOT_A_PREFIX
    else:
        template = _Template(msg.header, pb, msg.payload_type, msg.dtype, msg.tensor_shape, len(mv))
    if len(_TEMPLATES) >= _SLOTS:
        _TEMPLATES.clear()
    _TEMPLATES[key] = template
